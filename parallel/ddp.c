/* parallel/ddp.c — bucketed gradient averaging (see ddp.h). */
#include "parallel/ddp.h"

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
