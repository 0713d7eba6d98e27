/* parallel/ddp.c — bucketed gradient averaging (see ddp.h). */
#include "parallel/ddp.h"

#include <stdlib.h>

#include "common/util.h"

size_t ct_ddp_bucket_floats(double bucket_mb) {
  if (!(bucket_mb > 0)) bucket_mb = CT_DDP_BUCKET_MB_DEFAULT;
  double n = bucket_mb * 1024.0 * 1024.0 / sizeof(float);
  return n < 1 ? 1 : (size_t)n;
}

ct_status ct_ddp_reduce_grads(ct_comm *c, float *grads, size_t numel, size_t bucket_floats) {
  if (bucket_floats == 0) bucket_floats = ct_ddp_bucket_floats(0);
  size_t nb = (numel + bucket_floats - 1) / bucket_floats;
  for (size_t b = 0, off = 0; off < numel; b++, off += bucket_floats) {
    size_t n = numel - off < bucket_floats ? numel - off : bucket_floats;
    ct_status st = ct_comm_all_reduce(c, grads ? grads + off : NULL, n, CT_F32, CT_AVG);
    if (st != CT_OK)
      return ct_add_context(st, "ddp gradient bucket %zu of %zu (elements %zu..%zu of %zu): ",
                            b + 1, nb, off, off + n, numel);
  }
  return CT_OK;
}

/* ---- overlapped DDP ---- */

struct ct_ddp {
  ct_model *m;
  ct_comm *c;
  size_t bucket;
  bool armed;
  size_t lo, hi; /* pending range of finished, not yet reduced gradients */
  int buckets;   /* issued in this backward */
};

static ct_status flush(ct_ddp *d) {
  if (d->lo == d->hi) return CT_OK;
  ct_status st = ct_ddp_reduce_grads(d->c, ct_model_grads(d->m) + d->lo, d->hi - d->lo, d->bucket);
  if (st != CT_OK)
    return ct_add_context(st, "overlapped ddp (elements %zu..%zu): ", d->lo, d->hi);
  d->hi = d->lo;
  d->buckets++;
  return CT_OK;
}

static ct_status post_backward(void *ctx, int u) {
  ct_ddp *d = ctx;
  if (!d->armed) return CT_OK;
  size_t off, n;
  ct_model_unit(d->m, u, &off, &n);
  if (off + n != d->lo) { /* not adjacent (never, with the model's order): reduce what is pending */
    CT_TRY(flush(d));
    d->hi = off + n;
  }
  d->lo = off;
  if (d->hi - d->lo >= d->bucket || u == 0) CT_TRY(flush(d));
  return CT_OK;
}

ct_status ct_ddp_create(ct_model *model, ct_comm *c, size_t bucket_floats, ct_ddp **out) {
  ct_ddp *d = ct_calloc(1, sizeof *d, "ddp");
  if (!d) return CT_ERR_NOMEM;
  d->m = model;
  d->c = c;
  d->bucket = bucket_floats ? bucket_floats : ct_ddp_bucket_floats(0);
  ct_model_hooks h = {.ctx = d, .post_backward = post_backward};
  ct_model_set_hooks(model, &h);
  *out = d;
  return CT_OK;
}

void ct_ddp_destroy(ct_ddp *d) {
  if (!d) return;
  ct_model_set_hooks(d->m, NULL);
  free(d);
}

ct_status ct_ddp_arm(ct_ddp *d, bool reduce) {
  d->armed = reduce;
  d->lo = d->hi = ct_model_numel(d->m);
  d->buckets = 0;
  return reduce ? ct_comm_set_overlap(d->c, true) : CT_OK;
}

ct_status ct_ddp_finish(ct_ddp *d) {
  ct_status st = flush(d); /* a backward that stopped early leaves a pending range */
  d->armed = false;
  ct_status off = ct_comm_set_overlap(d->c, false); /* joins the side stream */
  if (st == CT_OK) st = off;
  if (st == CT_OK) st = ct_comm_sync(d->c); /* bounded wait: a dead peer is an error */
  return st;
}

int ct_ddp_buckets(const ct_ddp *d) { return d->buckets; }
