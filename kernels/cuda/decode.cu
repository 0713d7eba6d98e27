// kernels/cuda/decode.cu — the batched-inference ops of the CUDA tables (kernels/ops.h, "batched
// inference" and "devices"); the CPU references are in kernels/cpu/decode.c.
//
// Contract: activations and caches in the table's working type (float, bf16 or half); slot and
// pos are int32 device arrays (N); a KV cache layer is (S, KV, max_T, hd). Every op is queued on
// the current device's stream (ct_cuda_stream) and never synchronizes, allocates or frees while
// a graph is being captured: attention_decode's split buffer grows only outside capture (the
// first, uncaptured step of a shape sizes it). All arithmetic is fp32; stores round once.
//
// attention_decode is split over keys ("flash-decoding"): a warp takes DEC_CHUNK keys of one
// (row, query head) with an online softmax and writes (max, sum, hd accumulators); a second
// kernel merges a row's splits in split order. The grid covers max_T keys whatever the rows'
// lengths, so a captured graph stays valid as lengths grow; warps past a row's length exit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"

namespace {

typedef __nv_bfloat16 bf16;
typedef __half f16;

template <typename T> __device__ __forceinline__ float ldf(const T *p) { return (float)*p; }
template <> __device__ __forceinline__ float ldf<bf16>(const bf16 *p) { return __bfloat162float(*p); }
template <> __device__ __forceinline__ float ldf<f16>(const f16 *p) { return __half2float(*p); }
template <typename T> __device__ __forceinline__ void stf(T *p, float v) { *p = (T)v; }
template <> __device__ __forceinline__ void stf<bf16>(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ void stf<f16>(f16 *p, float v) { *p = __float2half_rn(v); }

cudaStream_t stream() { return (cudaStream_t)ct_cuda_stream(); }

bool ck(cudaError_t e, const char *op, const char *call, int line) {
  if (e == cudaSuccess) return true;
  ct_cuda_report(op, call, cudaGetErrorString(e), __FILE__, line);
  return false;
}
#define CKD(op, call) ck((call), op, #call, __LINE__)
#define CKD_LAUNCH(op, kernel) ck(cudaGetLastError(), op, "launch " #kernel, __LINE__)

unsigned blocks_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  if (b > 65535u * 4) b = 65535u * 4;
  return (unsigned)(b ? b : 1);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------------------------------------
// kernels

template <typename T>
__global__ void embed_pos_kernel(T *out, const int32_t *tok, const int32_t *pos, const T *wte,
                                 const T *wpe, long N, int C) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N * C;
       i += (long)gridDim.x * blockDim.x) {
    const long n = i / C;
    const int c = (int)(i % C);
    float v = ldf(wte + (long)tok[n] * C + c);
    if (wpe) v += ldf(wpe + (long)pos[n] * C + c);
    stf(out + i, v);
  }
}

// The same angle and cos/sin as ops_cuda.cu's rope_kernel at position pos[n].
template <typename T>
__global__ void rope_pos_kernel(T *qkv, const int32_t *pos, long N, int H, int KV, int hd,
                                float theta) {
  const int half = hd / 2, nh = H + KV;
  const long W3 = (long)(H + 2 * KV) * hd, total = N * nh * half;
  for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < total;
       idx += (long)gridDim.x * blockDim.x) {
    const int i = (int)(idx % half);
    const long rest = idx / half;
    const int h = (int)(rest % nh);
    const long n = rest / nh;
    float e = (float)(2 * i) / (float)hd;
    float inv = 1.0f / (float)pow((double)theta, (double)e);
    float ang = (float)pos[n] * inv;
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float c = (float)cd, s = (float)sd;
    T *x = qkv + n * W3 + (long)h * hd;
    const float x1 = ldf(x + i), x2 = ldf(x + i + half);
    stf(x + i, x1 * c - x2 * s);
    stf(x + i + half, x2 * c + x1 * s);
  }
}

template <typename T>
__global__ void kv_append_kernel(T *kc, T *vc, const T *qkv, const int32_t *slot,
                                 const int32_t *pos, long N, int H, int KV, int hd, int max_T) {
  const long W3 = (long)(H + 2 * KV) * hd, per = (long)KV * hd, total = N * per;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x) {
    const long n = i / per;
    const int h = (int)(i % per / hd), d = (int)(i % hd);
    const long s = slot ? slot[n] : n;
    const long dst = ((s * KV + h) * max_T + pos[n]) * hd + d;
    kc[dst] = qkv[n * W3 + (long)(H + h) * hd + d];
    vc[dst] = qkv[n * W3 + (long)(H + KV + h) * hd + d];
  }
}

#define DEC_CHUNK 16     // keys per warp (one split)
#define DEC_WARPS 4      // warps (splits) per block
#define DEC_MAXD 8       // head dim up to 32 * DEC_MAXD = 256

// grid (ceil(splits / DEC_WARPS), H, N). Split sp of row n, head h: keys sp*DEC_CHUNK ..
// min(len, +DEC_CHUNK) - 1 of kv head h / (H/KV). part: (N, H, splits, hd + 2) = acc, max, sum.
template <typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attention_decode_split_kernel(float *part, const T *qkv, const T *kc, const T *vc,
                                  const int32_t *slot, const int32_t *pos, int H, int KV, int hd,
                                  int max_T, int splits, float scale) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int sp = blockIdx.x * DEC_WARPS + w, h = blockIdx.y, n = blockIdx.z;
  const int len = pos[n] + 1, k0 = sp * DEC_CHUNK;
  if (sp >= splits || k0 >= len) return;
  const int k1 = min(len, k0 + DEC_CHUNK), kv = h / (H / KV);
  const long s = slot ? slot[n] : n;
  const T *q = qkv + (long)n * (H + 2 * KV) * hd + (long)h * hd;
  const T *K = kc + ((s * KV + kv) * max_T) * (long)hd, *V = vc + ((s * KV + kv) * max_T) * (long)hd;
  float qr[DEC_MAXD], acc[DEC_MAXD];
#pragma unroll
  for (int i = 0; i < DEC_MAXD; i++) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? ldf(q + d) : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
#pragma unroll 2
  for (int j = k0; j < k1; j++) {
    const T *kj = K + (long)j * hd, *vj = V + (long)j * hd;
    float dot = 0.0f, vv[DEC_MAXD];
#pragma unroll
    for (int i = 0; i < DEC_MAXD; i++) {
      const int d = lane + 32 * i;
      if (d < hd) {
        dot += qr[i] * ldf(kj + d);
        vv[i] = ldf(vj + d);
      } else {
        vv[i] = 0.0f;
      }
    }
    const float sc = warp_sum(dot) * scale;
    const float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < DEC_MAXD; i++) acc[i] = acc[i] * corr + p * vv[i];
    m = mn;
  }
  float *o = part + (((long)n * H + h) * splits + sp) * (hd + 2);
#pragma unroll
  for (int i = 0; i < DEC_MAXD; i++) {
    const int d = lane + 32 * i;
    if (d < hd) o[d] = acc[i];
  }
  if (lane == 0) {
    o[hd] = m;
    o[hd + 1] = l;
  }
}

// grid (H, N), hd threads (a multiple of 32 up to 1024): merges a row's valid splits in order.
template <typename T>
__global__ void attention_decode_merge_kernel(T *out, const float *part, const int32_t *pos,
                                              int H, int hd, int splits) {
  const int h = blockIdx.x, n = blockIdx.y, d = threadIdx.x;
  if (d >= hd) return;
  const int len = pos[n] + 1, used = min(splits, (len + DEC_CHUNK - 1) / DEC_CHUNK);
  const float *p = part + ((long)n * H + h) * splits * (hd + 2);
  float M = -INFINITY;
  for (int s = 0; s < used; s++) M = fmaxf(M, p[(long)s * (hd + 2) + hd]);
  float L = 0.0f, a = 0.0f;
  for (int s = 0; s < used; s++) {
    const float *ps = p + (long)s * (hd + 2);
    const float f = expf(ps[hd] - M);
    L += ps[hd + 1] * f;
    a += ps[d] * f;
  }
  stf(out + (long)n * H * hd + (long)h * hd + d, a / L);
}

// One block per row: the largest of the first V entries, lowest index on ties.
#define ARGMAX_THREADS 1024
template <typename T>
__global__ void argmax_rows_kernel(int32_t *out, const T *logits, int V, int Vp) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const T *r = logits + (long)blockIdx.x * Vp;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = ldf(r + i);
    if (v > bv) { bv = v; bi = i; } // i grows: a thread keeps its first maximum
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) { sv[w] = bv; si[w] = bi; }
  __syncthreads();
  if (w == 0) {
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

// ---------------------------------------------------------------------------------------------
// launchers

template <typename T>
void cu_embed_pos_fwd(void *out, const int32_t *tok, const int32_t *pos, const void *wte,
                      const void *wpe, int N, int C) {
  if (N <= 0 || C <= 0) return;
  embed_pos_kernel<T><<<blocks_for((size_t)N * C, 256), 256, 0, stream()>>>(
      (T *)out, tok, pos, (const T *)wte, (const T *)wpe, N, C);
  CKD_LAUNCH("embed_pos_fwd", embed_pos_kernel);
}

template <typename T>
void cu_rope_pos_fwd(void *qkv, const int32_t *pos, int N, int H, int KV, int hd, float theta) {
  const size_t total = (size_t)N * (H + KV) * (hd / 2);
  if (!total) return;
  rope_pos_kernel<T><<<blocks_for(total, 256), 256, 0, stream()>>>((T *)qkv, pos, N, H, KV, hd,
                                                                   theta);
  CKD_LAUNCH("rope_pos_fwd", rope_pos_kernel);
}

template <typename T>
void cu_kv_append(void *kc, void *vc, const void *qkv, const int32_t *slot, const int32_t *pos,
                  int N, int H, int KV, int hd, int max_T) {
  const size_t total = (size_t)N * KV * hd;
  if (!total) return;
  kv_append_kernel<T><<<blocks_for(total, 256), 256, 0, stream()>>>(
      (T *)kc, (T *)vc, (const T *)qkv, slot, pos, N, H, KV, hd, max_T);
  CKD_LAUNCH("kv_append", kv_append_kernel);
}

// The split buffer of each device, grown outside graph capture only. A replaced buffer is
// never freed: graphs captured earlier (smaller batches) still write to it. Growth at least
// doubles, so what is kept stays under twice the largest buffer.
struct split_buf {
  float *p;
  size_t bytes;
};
split_buf bufs[16];

float *split_scratch(size_t bytes) {
  int dev = 0;
  if (!CKD("attention_decode", cudaGetDevice(&dev)) || dev < 0 || dev >= 16) return NULL;
  split_buf *b = &bufs[dev];
  if (bytes <= b->bytes) return b->p;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream(), &cs);
  if (cs != cudaStreamCaptureStatusNone) {
    ct_cuda_report("attention_decode", "split buffer", "would grow during graph capture (run one"
                   " uncaptured step of this shape first)", __FILE__, __LINE__);
    return NULL;
  }
  if (bytes < 2 * b->bytes) bytes = 2 * b->bytes;
  float *p = NULL;
  if (!CKD("attention_decode", cudaMalloc((void **)&p, bytes))) return NULL;
  b->p = p;
  b->bytes = bytes;
  return p;
}

template <typename T>
void cu_attention_decode(void *out, const void *qkv, const void *kc, const void *vc,
                         const int32_t *slot, const int32_t *pos, int N, int H, int KV, int hd,
                         int max_T) {
  if (N <= 0 || H <= 0) return;
  if (hd > 32 * DEC_MAXD || H % KV) {
    ct_cuda_report("attention_decode", "shape check", "head_dim must be at most"
                   " 256 and n_head a multiple of n_kv_head", __FILE__, __LINE__);
    return;
  }
  const int splits = (max_T + DEC_CHUNK - 1) / DEC_CHUNK;
  float *part = split_scratch(sizeof(float) * (size_t)N * H * splits * (hd + 2));
  if (!part) return;
  dim3 grid((splits + DEC_WARPS - 1) / DEC_WARPS, H, N);
  attention_decode_split_kernel<T><<<grid, DEC_WARPS * 32, 0, stream()>>>(
      part, (const T *)qkv, (const T *)kc, (const T *)vc, slot, pos, H, KV, hd, max_T, splits,
      1.0f / sqrtf((float)hd));
  if (!CKD_LAUNCH("attention_decode", attention_decode_split_kernel)) return;
  attention_decode_merge_kernel<T><<<dim3(H, N), hd, 0, stream()>>>((T *)out, part, pos, H, hd,
                                                                     splits);
  CKD_LAUNCH("attention_decode", attention_decode_merge_kernel);
}

template <typename T> void cu_argmax_rows(int32_t *out, const void *logits, int N, int V, int Vp) {
  if (N <= 0) return;
  argmax_rows_kernel<T><<<N, ARGMAX_THREADS, 0, stream()>>>(out, (const T *)logits, V, Vp);
  CKD_LAUNCH("argmax_rows", argmax_rows_kernel);
}

// ---------------------------------------------------------------------------------------------
// devices and graphs

int cu_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int cu_set_device(int dev) { return ct_cuda_use_device(dev); }

int cu_device_memory(int dev, size_t *free_bytes, size_t *total_bytes) {
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  size_t f = 0, t = 0;
  cudaError_t e = cudaMemGetInfo(&f, &t);
  cudaSetDevice(cur);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return 0;
}

// Peer access is enabled once per ordered pair where the hardware allows it; otherwise the
// runtime stages the copy through the host.
unsigned char peer_tried[16][16];

void cu_copy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes) {
  if (!bytes) return;
  if (dst_dev == src_dev) {
    CKD("copy_peer", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
    CKD("copy_peer", cudaStreamSynchronize(stream()));
    return;
  }
  if (src_dev >= 0 && src_dev < 16 && dst_dev >= 0 && dst_dev < 16 &&
      !peer_tried[src_dev][dst_dev]) {
    peer_tried[src_dev][dst_dev] = 1;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, src_dev, dst_dev) == cudaSuccess && can) {
      int cur = 0;
      cudaGetDevice(&cur);
      cudaSetDevice(src_dev);
      cudaError_t e = cudaDeviceEnablePeerAccess(dst_dev, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
        CKD("copy_peer", e);
      cudaGetLastError();
      cudaSetDevice(cur);
    }
  }
  // queued on the current stream (the source device's, by the caller's contract) after its work
  if (CKD("copy_peer", cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, stream())))
    CKD("copy_peer", cudaStreamSynchronize(stream()));
}

void *cu_host_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

void cu_host_free(void *p) {
  if (p) cudaFreeHost(p);
}

void cu_to_host_async(void *dst, const void *src, size_t bytes) {
  if (bytes) CKD("to_host_async", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
}

void cu_sync() { CKD("sync", cudaStreamSynchronize(stream())); }

template <typename T> void fill(ct_ops *t) {
  t->embed_pos_fwd = cu_embed_pos_fwd<T>;
  t->rope_pos_fwd = cu_rope_pos_fwd<T>;
  t->kv_append = cu_kv_append<T>;
  t->attention_decode = cu_attention_decode<T>;
  t->argmax_rows = cu_argmax_rows<T>;
}

} // namespace

extern "C" void ct_cuda_decode_table(ct_ops *t) {
  if (t->act_bytes == 4) fill<float>(t);
  else if (!strcmp(t->dtype, "fp16")) fill<f16>(t);
  else fill<bf16>(t);
  t->device_count = cu_device_count;
  t->set_device = cu_set_device;
  t->device_memory = cu_device_memory;
  t->copy_peer = cu_copy_peer;
  t->host_alloc = cu_host_alloc;
  t->host_free = cu_host_free;
  t->to_host_async = cu_to_host_async;
  t->sync = cu_sync;
}
