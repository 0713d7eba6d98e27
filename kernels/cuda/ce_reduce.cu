// kernels/cuda/ce_reduce.cu — the one multiprocessor step of the copy-engine all-reduce
// (parallel/comm_ce.c): this rank's chunk of a bucket plus the chunks its peers copied into its
// receive area, each scaled (1/size for an average: ncclAvg's pre-multiplied sum), summed in fp32
// in rank order, rounded once, written over this rank's chunk (= overwrite, not +=).
// Memory-bound and short (a 25 MiB fp32 bucket on 2 ranks: 12.5 MiB chunks, ~40 MB of traffic,
// ~15 us on an H200), so the grid is kept small: it runs beside backward's kernels.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/ce_reduce.h"

namespace {

struct srcs {
  const void *p[CT_CE_MAX_SRC];
};

__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Scalar grid-stride loop: any alignment.
template <typename T>
__global__ void ce_reduce_scalar(T *dst, srcs s, int nsrc, size_t n, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float acc = ld((const T *)s.p[0], i) * scale;
    for (int k = 1; k < nsrc; k++) acc += ld((const T *)s.p[k], i) * scale;
    st(dst, i, acc);
  }
}

// 16-byte vectors (4 f32 or 8 bf16) when every pointer is 16-byte aligned; the same arithmetic
// per element as the scalar loop, so the results are the same bits.
template <typename T>
__global__ void ce_reduce_vec(T *dst, srcs s, int nsrc, size_t nv, float scale) {
  constexpr int E = 16 / sizeof(T);
  for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < nv;
       v += (size_t)gridDim.x * blockDim.x) {
    float acc[E];
    uint4 x = ((const uint4 *)s.p[0])[v];
    const T *e = (const T *)&x;
#pragma unroll
    for (int j = 0; j < E; j++) acc[j] = ld(e, j) * scale;
    for (int k = 1; k < nsrc; k++) {
      x = ((const uint4 *)s.p[k])[v];
#pragma unroll
      for (int j = 0; j < E; j++) acc[j] += ld(e, j) * scale;
    }
    uint4 o;
    T *oe = (T *)&o;
#pragma unroll
    for (int j = 0; j < E; j++) st(oe, j, acc[j]);
    ((uint4 *)dst)[v] = o;
  }
}

template <typename T>
cudaError_t launch(void *dst, const void *const *src, int nsrc, size_t n, float scale,
                   cudaStream_t stream) {
  constexpr int E = 16 / sizeof(T), threads = 512;
  constexpr size_t max_blocks = 264; // two per H200 multiprocessor: a short, modest footprint
  srcs s;
  bool aligned = ((uintptr_t)dst & 15) == 0;
  for (int k = 0; k < nsrc; k++) {
    s.p[k] = src[k];
    aligned = aligned && ((uintptr_t)src[k] & 15) == 0;
  }
  size_t nv = aligned ? n / E : 0, done = nv * E;
  if (nv) {
    size_t blocks = (nv + threads - 1) / threads;
    ce_reduce_vec<T><<<(unsigned)(blocks < max_blocks ? blocks : max_blocks), threads, 0, stream>>>(
        (T *)dst, s, nsrc, nv, scale);
  }
  if (done < n) { // the tail (or everything, unaligned)
    for (int k = 0; k < nsrc; k++) s.p[k] = (const T *)src[k] + done;
    size_t rest = n - done, blocks = (rest + threads - 1) / threads;
    ce_reduce_scalar<T><<<(unsigned)(blocks < max_blocks ? blocks : max_blocks), threads, 0, stream>>>(
        (T *)dst + done, s, nsrc, rest, scale);
  }
  return cudaGetLastError();
}

} // namespace

extern "C" int ct_cuda_ce_reduce(int bf16, void *dst, const void *const *src, int nsrc, size_t n,
                                 float scale, void *stream) {
  if (nsrc < 1 || nsrc > CT_CE_MAX_SRC) return (int)cudaErrorInvalidValue;
  if (n == 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  return (int)(bf16 ? launch<__nv_bfloat16>(dst, src, nsrc, n, scale, s)
                    : launch<float>(dst, src, nsrc, n, scale, s));
}
