// kernels/cuda/pack16.cuh — two floats as one 32-bit word of two 16-bit values (round to nearest
// even, `lo` in the low half), for bf16 and fp16; shared by ops_cuda.cu and decode.cu.
#ifndef CT_KERNELS_CUDA_PACK16_CUH
#define CT_KERNELS_CUDA_PACK16_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace ct16 {
template <typename E> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
} // namespace ct16

#endif
