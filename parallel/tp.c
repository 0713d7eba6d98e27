/* parallel/tp.c — tensor parallelism: the model's tp callbacks and checkpoint cut/paste (tp.h). */
#include "parallel/tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct ct_tp {
  ct_model *m;
  ct_comm *c;
  const ct_ops *o;
  int T, k, max_n;
  ct_dtype wdt;        /* working dtype for activation all-reduces */
  float *stats;        /* (3, max_n) backend memory: max, sum exp, target logit */
  float *lse;          /* (max_n) backend memory */
  int32_t *tgt;        /* (max_n) backend memory: target column on this rank, or -1 */
  float *h_max, *h_gmax, *h_sum, *h_lse; /* host: (max_n), (max_n), (2 max_n), (max_n) */
  int32_t *h_tgt;      /* (max_n) host */
};

static ct_status tp_all_reduce(void *ctx, void *buf, size_t n, bool f32) {
  ct_tp *t = ctx;
  ct_status st = ct_comm_all_reduce(t->c, buf, n, f32 ? CT_F32 : t->wdt, CT_SUM);
  if (st != CT_OK) return ct_add_context(st, "tensor parallel all-reduce (tp rank %d of %d): ", t->k, t->T);
  return CT_OK;
}

/* Full-vocabulary softmax cross-entropy from per-rank column pieces (see tp.h). */
static ct_status tp_xent(void *ctx, float *host_losses, void *logits, const int32_t *targets, int N,
                         float grad_scale) {
  ct_tp *t = ctx;
  const ct_ops *o = t->o;
  const ct_model_cfg *cfg = ct_model_config(t->m);
  const int Vp = ct_model_padded_vocab(cfg) / t->T, v0 = t->k * Vp;
  int V = cfg->vocab_size - v0; /* real (unpadded) columns on this rank */
  V = V < 0 ? 0 : V > Vp ? Vp : V;
  if (N > t->max_n) return ct_set_error(CT_ERR_USAGE, "tp xent: %d rows > %d", N, t->max_n);
  for (int n = 0; n < N; n++)
    t->h_tgt[n] = targets[n] >= v0 && targets[n] < v0 + V ? targets[n] - v0 : -1;
  o->to_device(t->tgt, t->h_tgt, sizeof(int32_t) * (size_t)N);
  o->xent_stats(t->stats, logits, t->tgt, N, V, Vp);
  CT_TRY(ct_comm_sync(t->c)); /* bounded wait before the host reads */
  o->to_host(t->h_max, t->stats, sizeof(float) * (size_t)N);
  o->to_host(t->h_sum, t->stats + N, sizeof(float) * (size_t)N);
  ct_status st = ct_comm_all_reduce(t->c, t->stats, (size_t)N, CT_F32, CT_MAX);
  if (st == CT_OK) st = ct_comm_sync(t->c);
  if (st != CT_OK) return ct_add_context(st, "vocab-parallel cross-entropy (max): ");
  o->to_host(t->h_gmax, t->stats, sizeof(float) * (size_t)N);
  for (int n = 0; n < N; n++) /* this rank's sum of exp relative to the global max */
    t->h_sum[n] = t->h_max[n] == -INFINITY ? 0.0f : t->h_sum[n] * expf(t->h_max[n] - t->h_gmax[n]);
  o->to_device(t->stats + N, t->h_sum, sizeof(float) * (size_t)N);
  st = ct_comm_all_reduce(t->c, t->stats + N, 2 * (size_t)N, CT_F32, CT_SUM);
  if (st == CT_OK) st = ct_comm_sync(t->c);
  if (st != CT_OK) return ct_add_context(st, "vocab-parallel cross-entropy (sums): ");
  o->to_host(t->h_sum, t->stats + N, sizeof(float) * 2 * (size_t)N);
  for (int n = 0; n < N; n++) {
    if (targets[n] < 0) {
      host_losses[n] = 0.0f;
      t->h_lse[n] = INFINITY; /* zero gradient row */
      continue;
    }
    const double lse = (double)t->h_gmax[n] + log((double)t->h_sum[n]);
    host_losses[n] = (float)(lse - (double)t->h_sum[N + n]);
    t->h_lse[n] = (float)lse;
  }
  if (grad_scale != 0.0f) {
    o->to_device(t->lse, t->h_lse, sizeof(float) * (size_t)N);
    o->xent_grad(logits, t->lse, t->tgt, N, V, Vp, grad_scale);
  }
  return CT_OK;
}

ct_status ct_tp_create(ct_model *m, ct_comm *tp, int max_tokens, ct_tp **out) {
  const ct_ops *o = ct_model_ops(m);
  if (ct_comm_size(tp) != ct_model_tp_size(m) || ct_comm_rank(tp) != ct_model_config(m)->tp_rank)
    return ct_set_error(CT_ERR_USAGE, "tp: group of %d (rank %d) for a model of tp degree %d (rank %d)",
                        ct_comm_size(tp), ct_comm_rank(tp), ct_model_tp_size(m),
                        ct_model_config(m)->tp_rank);
  if (!o->xent_stats || !o->xent_grad)
    return ct_set_error(CT_ERR_USAGE, "tp: the %s op table has no vocab-parallel cross-entropy", o->name);
  ct_tp *t = ct_calloc(1, sizeof *t, "tp");
  if (!t) return CT_ERR_NOMEM;
  t->m = m;
  t->c = tp;
  t->o = o;
  t->T = ct_comm_size(tp);
  t->k = ct_comm_rank(tp);
  t->max_n = max_tokens;
  t->wdt = o->act_bytes == 4 ? CT_F32 : !strcmp(o->dtype, "fp16") ? CT_F16 : CT_BF16;
  const size_t n = (size_t)max_tokens;
  t->stats = o->alloc(3 * n * sizeof(float));
  t->lse = o->alloc(n * sizeof(float));
  t->tgt = o->alloc(n * sizeof(int32_t));
  t->h_max = malloc(n * sizeof(float));
  t->h_gmax = malloc(n * sizeof(float));
  t->h_sum = malloc(2 * n * sizeof(float));
  t->h_lse = malloc(n * sizeof(float));
  t->h_tgt = malloc(n * sizeof(int32_t));
  if (!t->stats || !t->lse || !t->tgt || !t->h_max || !t->h_gmax || !t->h_sum || !t->h_lse ||
      !t->h_tgt) {
    ct_tp_destroy(t);
    return ct_set_error(CT_ERR_NOMEM, "tp: out of memory for the cross-entropy buffers");
  }
  ct_model_tp cb = {.ctx = t, .all_reduce = tp_all_reduce, .xent = tp_xent};
  ct_model_set_tp(m, &cb);
  *out = t;
  return CT_OK;
}

void ct_tp_destroy(ct_tp *t) {
  if (!t) return;
  ct_model_set_tp(t->m, NULL);
  if (t->stats) t->o->free(t->stats);
  if (t->lse) t->o->free(t->lse);
  if (t->tgt) t->o->free(t->tgt);
  free(t->h_max);
  free(t->h_gmax);
  free(t->h_sum);
  free(t->h_lse);
  free(t->h_tgt);
  free(t);
}

double ct_tp_norm_weight(const ct_param *p, int T) {
  if (T <= 1) return 1.0;
  return p->tp_split == CT_TP_REPLICATED || p->tp_split == CT_TP_PARTIAL ? 1.0 / T : 1.0;
}

ct_status ct_tp_grad_norm(ct_tp *t, double *norm) {
  const float *g = ct_model_grads(t->m);
  double sq = 0;
  for (int i = 0; i < ct_model_n_params(t->m); i++) {
    const ct_param *p = ct_model_param(t->m, i);
    sq += t->o->sumsq(g + p->offset, p->numel) * ct_tp_norm_weight(p, t->T);
  }
  float v[2] = {(float)sq, (float)(sq - (double)(float)sq)}; /* (hi, lo): keeps the digits */
  t->o->to_device(t->stats, v, sizeof v);
  ct_status st = ct_comm_all_reduce(t->c, t->stats, 2, CT_F32, CT_SUM);
  if (st == CT_OK) st = ct_comm_sync(t->c);
  if (st != CT_OK) return ct_add_context(st, "tensor parallel gradient norm: ");
  t->o->to_host(v, t->stats, sizeof v);
  *norm = sqrt((double)v[0] + (double)v[1]);
  return CT_OK;
}

/* ---- cut / paste: rank k's slice of a parameter as row segments of the full tensor ---- */

typedef struct seg { int lrow, frow, rows; } seg;

/* Row segments of local parameter p in full parameter f; *fcol0 = first full column. */
static int segments(const ct_model *full, const ct_param *p, const ct_param *f, int k, seg *s,
                    int *fcol0) {
  const ct_model_cfg *c = ct_model_config(full);
  const int rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1;
  *fcol0 = 0;
  switch (p->tp_split) {
    case CT_TP_ROWS:
      s[0] = (seg){0, k * rows, rows};
      return 1;
    case CT_TP_COLS:
      *fcol0 = k * cols;
      s[0] = (seg){0, 0, rows};
      return 1;
    case CT_TP_QKV: {
      const int H = c->n_head, KV = c->n_kv_head ? c->n_kv_head : c->n_head;
      const int hd = c->head_dim ? c->head_dim : c->d_model / c->n_head;
      const int T = f->shape[0] / rows, Hl = H / T * hd, KVl = KV / T * hd;
      s[0] = (seg){0, k * Hl, Hl};
      s[1] = (seg){Hl, H * hd + k * KVl, KVl};
      s[2] = (seg){Hl + KVl, (H + KV) * hd + k * KVl, KVl};
      return 3;
    }
    case CT_TP_GATE_UP: {
      const int Fl = rows / 2, F = f->shape[0] / 2;
      s[0] = (seg){0, k * Fl, Fl};
      s[1] = (seg){Fl, F + k * Fl, Fl};
      return 2;
    }
    default:
      s[0] = (seg){0, 0, rows};
      return 1;
  }
}

int ct_tp_segments(const ct_model *full, const ct_param *p, const ct_param *f, int k,
                   int seg_out[3][3], int *fcol0) {
  seg s[3];
  int n = segments(full, p, f, k, s, fcol0);
  for (int j = 0; j < n; j++) {
    seg_out[j][0] = s[j].lrow;
    seg_out[j][1] = s[j].frow;
    seg_out[j][2] = s[j].rows;
  }
  return n;
}

static void move(const ct_model *full, float *full_buf, const ct_model *local, float *local_buf,
                 int k, bool to_local) {
  for (int i = 0; i < ct_model_n_params(local); i++) {
    const ct_param *p = ct_model_param(local, i), *f = ct_model_param(full, i);
    seg s[3];
    int fcol0, ns = segments(full, p, f, k, s, &fcol0);
    const size_t lc = (size_t)(p->ndim == 2 ? p->shape[1] : 1);
    const size_t fc = (size_t)(f->ndim == 2 ? f->shape[1] : 1);
    for (int j = 0; j < ns; j++)
      for (int r = 0; r < s[j].rows; r++) {
        float *L = local_buf + p->offset + (size_t)(s[j].lrow + r) * lc;
        float *F = full_buf + f->offset + (size_t)(s[j].frow + r) * fc + (size_t)fcol0;
        if (to_local) memcpy(L, F, lc * sizeof(float));
        else memcpy(F, L, lc * sizeof(float));
      }
  }
}

void ct_tp_cut(const ct_model *full, const float *full_buf, const ct_model *local, float *local_buf,
               int k) {
  move(full, (float *)full_buf, local, local_buf, k, true);
}

void ct_tp_paste(const ct_model *full, float *full_buf, const ct_model *local,
                 const float *local_buf, int k) {
  move(full, full_buf, local, (float *)local_buf, k, false);
}
