/* parallel/ddp.c — bucketed gradient averaging (see ddp.h). */
#include "parallel/ddp.h"

#include <stdint.h>
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
  void *wire;    /* reduce_dtype bf16: the gradients rounded to bf16 (numel x 2 bytes), or NULL */
  bool armed;
  size_t lo, hi; /* pending range of finished, not yet reduced gradients */
  int buckets;   /* issued in this backward */
  bool lean;     /* buckets before the last go to the lean communicator */
};

/* All-reduces grads[lo, hi): in place in fp32, or rounded into the bf16 wire buffer (widened back
 * in ct_ddp_finish, after the join). */
static ct_status reduce_range(ct_ddp *d, size_t lo, size_t n) {
  float *g = ct_model_grads(d->m) + lo;
  if (!d->wire) return ct_ddp_reduce_grads(d->c, g, n, d->bucket);
  const ct_ops *o = ct_model_ops(d->m);
  uint16_t *w = (uint16_t *)d->wire + lo;
  o->f32_to_bf16(w, g, n);
  const size_t per = d->bucket * 2; /* a bucket holds as many bytes as in fp32 */
  for (size_t off = 0; off < n; off += per) {
    const size_t k = n - off < per ? n - off : per;
    ct_status st = ct_comm_all_reduce(d->c, w + off, k, CT_BF16, CT_AVG);
    if (st != CT_OK)
      return ct_add_context(st, "ddp gradient bucket in bf16 (elements %zu..%zu): ", lo + off,
                            lo + off + k);
  }
  return CT_OK;
}

/* `last`: nothing is left to compute that the bucket could overlap (unit 0's, or the range a
 * backward that stopped early left): the full communicator takes it. */
static ct_status flush(ct_ddp *d, bool last) {
  if (d->lo == d->hi) return CT_OK;
  if (d->lean) CT_TRY(ct_comm_use_lean(d->c, !last));
  ct_status st = reduce_range(d, d->lo, d->hi - d->lo);
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
    CT_TRY(flush(d, false));
    d->hi = off + n;
  }
  d->lo = off;
  if (d->hi - d->lo >= d->bucket || u == 0) CT_TRY(flush(d, u == 0));
  return CT_OK;
}

ct_status ct_ddp_create(ct_model *model, ct_comm *c, size_t bucket_floats, ct_dtype reduce_dtype,
                        int overlap_ctas, ct_ddp **out) {
  if (reduce_dtype != CT_F32 && reduce_dtype != CT_BF16)
    return ct_set_error(CT_ERR_USAGE, "ddp: gradients are reduced in fp32 or bf16, not %s",
                        ct_dtype_name(reduce_dtype));
  ct_ddp *d = ct_calloc(1, sizeof *d, "ddp");
  if (!d) return CT_ERR_NOMEM;
  d->m = model;
  d->c = c;
  d->bucket = bucket_floats ? bucket_floats : ct_ddp_bucket_floats(0);
  if (reduce_dtype == CT_BF16) {
    const size_t bytes = ct_model_numel(model) * sizeof(uint16_t);
    d->wire = ct_model_ops(model)->alloc(bytes);
    if (!d->wire) {
      free(d);
      return ct_set_error(CT_ERR_NOMEM, "ddp: no memory for the bf16 gradient buffer (%.1f MiB)",
                          (double)bytes / 1048576.0);
    }
  }
  if (overlap_ctas > 0) {
    ct_status st = ct_comm_make_lean(c, overlap_ctas);
    if (st != CT_OK) {
      ct_ddp_destroy(d);
      return ct_add_context(st, "ddp (parallel.overlap_ctas = %d): ", overlap_ctas);
    }
    d->lean = true;
  }
  ct_model_hooks h = {.ctx = d, .post_backward = post_backward};
  ct_model_set_hooks(model, &h);
  *out = d;
  return CT_OK;
}

void ct_ddp_destroy(ct_ddp *d) {
  if (!d) return;
  ct_model_set_hooks(d->m, NULL);
  if (d->wire) ct_model_ops(d->m)->free(d->wire);
  free(d);
}

ct_status ct_ddp_arm(ct_ddp *d, bool reduce) {
  d->armed = reduce;
  d->lo = d->hi = ct_model_numel(d->m);
  d->buckets = 0;
  return reduce ? ct_comm_set_overlap(d->c, true) : CT_OK;
}

ct_status ct_ddp_finish(ct_ddp *d) {
  ct_status st = flush(d, true); /* a backward that stopped early leaves a pending range */
  d->armed = false;
  ct_status off = ct_comm_set_overlap(d->c, false); /* joins the side stream */
  if (st == CT_OK) st = off;
  if (st == CT_OK && d->wire && d->buckets) /* queued after the join: sees every result */
    ct_model_ops(d->m)->bf16_to_f32(ct_model_grads(d->m), d->wire, ct_model_numel(d->m));
  if (st == CT_OK) st = ct_comm_sync(d->c); /* bounded wait: a dead peer is an error */
  return st;
}

int ct_ddp_buckets(const ct_ddp *d) { return d->buckets; }
