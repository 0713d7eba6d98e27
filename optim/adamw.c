#include <math.h>
#include <stdlib.h>

#include "optim/optim.h"

ct_status ct_adamw_create(ct_adamw *opt, const ct_model *model, const ct_train_cfg *t) {
  return ct_adamw_create_shard(opt, model, t, 0, ct_model_numel(model));
}

ct_status ct_adamw_create_shard(ct_adamw *opt, const ct_model *model, const ct_train_cfg *t,
                                size_t lo, size_t hi) {
  const ct_ops *ops = ct_model_ops(model);
  opt->numel = ct_model_numel(model);
  opt->lo = lo;
  opt->hi = hi;
  opt->m = ops->alloc((hi - lo) * sizeof(float));
  opt->v = ops->alloc((hi - lo) * sizeof(float));
  opt->step = 0;
  opt->lr = t->lr;
  opt->beta1 = t->beta1;
  opt->beta2 = t->beta2;
  opt->eps = t->eps;
  opt->weight_decay = t->weight_decay;
  if (!opt->m || !opt->v) {
    ct_adamw_destroy(opt, ops);
    return ct_set_error(CT_ERR_NOMEM, "out of memory for AdamW state (%zu floats x 2) on %s",
                        hi - lo, ops->name);
  }
  return CT_OK;
}

void ct_adamw_destroy(ct_adamw *opt, const ct_ops *ops) {
  if (opt->m) ops->free(opt->m);
  if (opt->v) ops->free(opt->v);
  if (opt->segs) ops->free(opt->segs);
  opt->m = opt->v = NULL;
  opt->segs = NULL;
  opt->nseg = 0;
}

/* The optimizer's slice as adamw_multi segments: each parameter's part of [lo, hi), cut into
 * pieces of at most SEG floats so one launch spreads over the whole GPU. */
#define SEG (1u << 16)
static bool build_segments(ct_adamw *opt, ct_model *model) {
  const ct_ops *ops = ct_model_ops(model);
  int n = 0;
  for (int pass = 0; pass < 2; pass++) {
    ct_adamw_seg *host = NULL;
    if (pass == 1 && !(host = malloc(sizeof *host * (size_t)n))) return false;
    int k = 0;
    for (int i = 0; i < ct_model_n_params(model); i++) {
      const ct_param *p = ct_model_param(model, i);
      const size_t a = p->offset > opt->lo ? p->offset : opt->lo;
      const size_t b = p->offset + p->numel < opt->hi ? p->offset + p->numel : opt->hi;
      for (size_t s = a; s < b; s += SEG, k++)
        if (host)
          host[k] = (ct_adamw_seg){s, (uint32_t)(b - s < SEG ? b - s : SEG),
                                   p->decay ? (float)opt->weight_decay : 0.0f};
    }
    if (!host) { n = k; continue; }
    opt->segs = ops->alloc(sizeof *host * (size_t)(n ? n : 1));
    if (opt->segs) ops->to_device(opt->segs, host, sizeof *host * (size_t)n);
    free(host);
  }
  opt->nseg = n;
  return opt->segs != NULL;
}

double ct_grad_norm(ct_model *model) {
  /* the gaps between aligned parameters are zero, so one pass over the buffer is exact */
  return sqrt(ct_model_ops(model)->sumsq(ct_model_grads(model), ct_model_numel(model)));
}

float ct_clip_scale(double norm, double clip) {
  if (clip <= 0) return 1.0f;
  double s = clip / (norm + 1e-6);
  return s < 1.0 ? (float)s : 1.0f;
}

void ct_adamw_step(ct_adamw *opt, ct_model *model, double lr, float grad_scale) {
  const ct_ops *ops = ct_model_ops(model);
  float *w = ct_model_params(model), *g = ct_model_grads(model);
  opt->step++;
  if (ops->adamw_multi && (opt->segs || build_segments(opt, model))) {
    ops->adamw_multi(w, g, opt->m, opt->v, opt->lo, opt->segs, opt->nseg, (float)lr,
                     (float)opt->beta1, (float)opt->beta2, (float)opt->eps, grad_scale, opt->step);
    return;
  }
  for (int i = 0; i < ct_model_n_params(model); i++) {
    const ct_param *p = ct_model_param(model, i);
    const size_t a = p->offset > opt->lo ? p->offset : opt->lo;
    const size_t b = p->offset + p->numel < opt->hi ? p->offset + p->numel : opt->hi;
    if (a >= b) continue; /* outside this optimizer's slice */
    ops->adamw(w + a, g + a, opt->m + (a - opt->lo), opt->v + (a - opt->lo), b - a, (float)lr,
               (float)opt->beta1, (float)opt->beta2, (float)opt->eps,
               p->decay ? (float)opt->weight_decay : 0.0f, grad_scale, opt->step);
  }
}
