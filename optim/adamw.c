#include <math.h>

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
  opt->m = opt->v = NULL;
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
