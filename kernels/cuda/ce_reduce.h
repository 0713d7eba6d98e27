/* kernels/cuda/ce_reduce.h — the add of the copy-engine all-reduce (parallel/comm_ce.c). */
#ifndef CT_CE_REDUCE_H
#define CT_CE_REDUCE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT_CE_MAX_SRC 8 /* ranks of one node */

/* dst[i] = sum over k = 0..nsrc-1, in that order, of scale * src[k][i], accumulated in fp32 and
 * rounded once to the element type (bf16 != 0: bf16, round to nearest even; else f32), i < n.
 * dst may be one of the sources (each element is read before it is written). 1 <= nsrc <=
 * CT_CE_MAX_SRC. Queued on `stream` (a cudaStream_t); returns 0 or the launch's cudaError_t. */
int ct_cuda_ce_reduce(int bf16, void *dst, const void *const *src, int nsrc, size_t n, float scale,
                      void *stream);

#ifdef __cplusplus
}
#endif

#endif
