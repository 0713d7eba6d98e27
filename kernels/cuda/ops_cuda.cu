// kernels/cuda/ops_cuda.cu — the first CUDA backend of the op table (kernels/ops.h).
//
// Contract (ops.h has the full text; kernels/cpu/ops_cpu.c is the reference this matches):
//   - In this version every activation and weight pointer is fp32 device memory (`act_t` below);
//     parameter gradients, norm statistics, losses, optimizer state and the attention state are
//     fp32 as ops.h says. Kernels are templated on the activation type so bf16 can be added by
//     instantiating them (and choosing cuBLAS data types) rather than rewriting them.
//   - Row-major, N = B*T rows; linear weights are (OC, IC) (nn.Linear); qkv rows are
//     [H q heads | KV k heads | KV v heads] of hd each, query head h uses kv head h / (H/KV).
//   - Backward ACCUMULATES (+=) into every gradient; a NULL gradient pointer is skipped.
//     rope_bwd rotates dqkv back in place; xent_fwd_bwd overwrites logits with its gradient.
//   - Attention state = the probabilities (B, H, T, T), zero above the diagonal (as the CPU).
//   - Deterministic: no floating-point atomics. Column sums (dweight, dbias) go through fixed
//     row chunks and a second pass that adds the chunks in order; embedding backward gives each
//     distinct token to one block that adds its rows in row order (bit-identical to the CPU);
//     sumsq reduces in double over a fixed grid.
//   - Everything is queued on one stream (created by ct_cuda_init); to_host synchronizes.
//     Errors are sticky (see ops_cuda.h): the first failing call is kept for ct_cuda_check.
//
// Layout of this file: runtime state and error handling, device helpers, kernels by op, the
// launchers (the table's functions), the table and the C entry points.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"

namespace {

typedef float act_t; // working dtype of activations and weights in this version

// ---------------------------------------------------------------------------------------------
// runtime state and error handling

struct cuda_state {
  int ready, device, num_sms, sync_debug;
  int attn_perhead;        // CT_CUDA_ATTN=perhead: the first (per-head loop) attention variant
  size_t attn_scratch_cap; // attention backward's dP chunk, bytes (CT_CUDA_ATTN_SCRATCH_MB)
  cudaStream_t stream;
  cublasHandle_t blas;
  cublasComputeType_t compute; // CUBLAS_COMPUTE_32F, or _FAST_TF32 with CT_CUDA_TF32=1
  void *scratch;               // grown on demand; used within one op at a time
  size_t scratch_bytes;
  double *host_result;         // pinned: sumsq's result lands here
  int failed;
  char err[640];
  const char *op; // op being run, for messages
};
cuda_state g;

void record_error(const char *call, const char *why, const char *file, int line) {
  if (g.failed) return;
  g.failed = 1;
  snprintf(g.err, sizeof g.err, "cuda op %s: %s failed: %s (%s:%d)", g.op ? g.op : "(none)", call,
           why, file, line);
}

bool check_cuda(cudaError_t e, const char *call, const char *file, int line) {
  if (e == cudaSuccess) return true;
  record_error(call, cudaGetErrorString(e), file, line);
  return false;
}

bool check_blas(cublasStatus_t s, const char *call, const char *file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  record_error(call, cublasGetStatusString(s), file, line);
  return false;
}

#define CK(call) check_cuda((call), #call, __FILE__, __LINE__)
#define CKB(call) check_blas((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows up here, a fault in the kernel later.
#define CK_LAUNCH(kernel) check_cuda(cudaGetLastError(), "launch " #kernel, __FILE__, __LINE__)

// Names the running op in error messages; with CT_CUDA_SYNC=1 synchronizes at the op's end so
// an asynchronous fault is charged to the op that caused it.
struct op_scope {
  bool ok;
  explicit op_scope(const char *name) {
    g.op = name;
    ok = g.ready != 0;
    if (!ok)
      record_error("ct_cuda_init", "the CUDA backend is not initialized", __FILE__, __LINE__);
  }
  ~op_scope() {
    if (ok && g.sync_debug) CK(cudaStreamSynchronize(g.stream));
  }
};
#define OP(name)                                                                                  \
  op_scope op_scope_(name);                                                                       \
  if (!op_scope_.ok) return

// Scratch device memory for one op (column-sum partials, attention dP, sumsq partials). Grows
// by reallocation; the old buffer is freed only after queued work that may read it is done.
void *scratch(size_t bytes) {
  if (bytes <= g.scratch_bytes) return g.scratch;
  if (g.scratch) {
    CK(cudaStreamSynchronize(g.stream));
    CK(cudaFree(g.scratch));
    g.scratch = NULL;
    g.scratch_bytes = 0;
  }
  size_t want = (bytes + bytes / 4 + (1u << 20) - 1) / (1u << 20) * (1u << 20);
  void *p = NULL;
  if (!CK(cudaMalloc(&p, want))) return NULL;
  g.scratch = p;
  g.scratch_bytes = want;
  return p;
}

// Blocks for a grid-stride loop over n items: enough to fill the device, no more.
unsigned grid_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  size_t cap = (size_t)(g.num_sms > 0 ? g.num_sms : 80) * 32;
  if (b > cap) b = cap;
  return (unsigned)(b ? b : 1);
}

// ---------------------------------------------------------------------------------------------
// device helpers

template <typename T> __device__ __forceinline__ float ld(const T *p) { return (float)*p; }
template <typename T> __device__ __forceinline__ void st(T *p, float v) { *p = (T)v; }

template <typename T> cudaDataType_t blas_type();
template <> cudaDataType_t blas_type<float>() { return CUDA_R_32F; }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Start of row r of a (possibly grouped) row layout; see rmsnorm in ops.h.
__device__ __forceinline__ long rms_row(long r, int C, int rpg, long gs) {
  return (r / rpg) * gs + (r % rpg) * (long)C;
}

// ---------------------------------------------------------------------------------------------
// kernels: elementwise and small ones

template <typename T>
__global__ void embed_fwd_kernel(T *out, const int32_t *tok, const T *wte, const T *wpe, long N,
                                 int T_, int C) {
  long total = N * C;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x) {
    long n = i / C;
    int c = (int)(i - n * C);
    float v = ld(wte + (long)tok[n] * C + c);
    if (wpe) v = v + ld(wpe + (n % T_) * C + c);
    st(out + i, v);
  }
}

// One block per row n; only the block of a token's first occurrence works: it adds the rows of
// every occurrence, in row order, into dwte[token] (which it alone writes). Scanning tok is
// O(N) per block, O(N^2) in all: ~N^2/4e9 s, negligible next to a step at the N this runs at.
#define EMB_THREADS 128
template <typename T>
__global__ void embed_bwd_wte_kernel(float *dwte, const T *dout, const int32_t *tok, int N, int C) {
  __shared__ int list[EMB_THREADS];
  __shared__ int warp_cnt[EMB_THREADS / 32];
  const int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int t = tok[n];
  for (int base = 0; base < n; base += EMB_THREADS) { // an earlier occurrence owns the token
    int m = base + tid;
    if (__syncthreads_or(m < n && tok[m] == t)) return;
  }
  float *g = dwte + (long)t * C;
  for (int base = n; base < N; base += EMB_THREADS) {
    int m = base + tid;
    bool hit = m < N && tok[m] == t;
    unsigned ball = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_cnt[w] = __popc(ball);
    __syncthreads();
    int off = 0, total = 0;
    for (int i = 0; i < EMB_THREADS / 32; i++) {
      if (i < w) off += warp_cnt[i];
      total += warp_cnt[i];
    }
    if (hit) list[off + __popc(ball & ((1u << lane) - 1u))] = m; // compacted, in row order
    __syncthreads();
    if (total) {
      for (int c = tid; c < C; c += EMB_THREADS) {
        float acc = g[c];
        for (int j = 0; j < total; j++) acc += ld(dout + (long)list[j] * C + c);
        g[c] = acc;
      }
    }
    __syncthreads(); // list and warp_cnt are rewritten next round
  }
}

template <typename T>
__global__ void embed_bwd_wpe_kernel(float *dwpe, const T *dout, int B, int T_, int C) {
  long total = (long)T_ * C;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += ld(dout + (long)b * total + i); // row (b*T + t)
    dwpe[i] = acc;
  }
}

template <typename T>
__global__ void bias_broadcast_kernel(T *out, const T *bias, long N, int OC) {
  long total = N * OC;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x)
    out[i] = bias[i % OC];
}

// HF rotate_half RoPE; dir = -1 applies the inverse rotation (the backward). The cos/sin are
// computed like the CPU table: inv_freq and the angle rounded to fp32, cos/sin in double.
template <typename T>
__global__ void rope_kernel(T *qkv, long N, int T_, int H, int KV, int hd, int pos0, float theta,
                            float dir) {
  const int half = hd / 2, nh = H + KV;
  const long W3 = (long)(H + 2 * KV) * hd, total = N * nh * half;
  for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < total;
       idx += (long)gridDim.x * blockDim.x) {
    int i = (int)(idx % half);
    long rest = idx / half;
    int h = (int)(rest % nh);
    long n = rest / nh;
    int t = (int)(n % T_);
    float e = (float)(2 * i) / (float)hd;
    float inv = 1.0f / (float)pow((double)theta, (double)e);
    float ang = (float)(pos0 + t) * inv;
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    float c = (float)cd, s = dir * (float)sd;
    T *x = qkv + n * W3 + (long)h * hd;
    float x1 = ld(x + i), x2 = ld(x + i + half);
    st(x + i, x1 * c - x2 * s);
    st(x + i + half, x2 * c + x1 * s);
  }
}

#define GELU_K 0.7978845608028654f // sqrt(2/pi)

template <typename T> __global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float x = ld(inp + i);
    float u = GELU_K * (x + 0.044715f * x * x * x);
    st(out + i, 0.5f * x * (1.0f + tanhf(u)));
  }
}

template <typename T>
__global__ void gelu_bwd_kernel(T *dinp, const T *dout, const T *inp, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float x = ld(inp + i);
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float gr = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    st(dinp + i, ld(dinp + i) + gr * ld(dout + i));
  }
}

template <typename T> __global__ void swiglu_fwd_kernel(T *out, const T *inp, long N, int F) {
  long total = N * F;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x) {
    long n = i / F;
    int f = (int)(i - n * F);
    const T *row = inp + n * 2 * F;
    float gt = ld(row + f), up = ld(row + F + f);
    st(out + i, gt / (1.0f + expf(-gt)) * up);
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dinp, const T *dout, const T *inp, long N, int F) {
  long total = N * F;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x) {
    long n = i / F;
    int f = (int)(i - n * F);
    const T *row = inp + n * 2 * F;
    T *drow = dinp + n * 2 * F;
    float gt = ld(row + f), up = ld(row + F + f), dy = ld(dout + i);
    float sig = 1.0f / (1.0f + expf(-gt));
    st(drow + f, ld(drow + f) + dy * up * sig * (1.0f + gt * (1.0f - sig)));
    st(drow + F + f, ld(drow + F + f) + dy * gt * sig);
  }
}

template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    st(out + i, ld(a + i) + ld(b + i));
}

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                             float b1, float b2, float a1, float a2, float eps, float decay,
                             float step_size, float inv_bc2_sqrt, float grad_scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gr = grad[i] * grad_scale;
    float mi = b1 * m[i] + a1 * gr;
    float vi = b2 * v[i] + a2 * gr * gr;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) * inv_bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
}

__global__ void scale_kernel(float *x, float s, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= s;
}

// sumsq: a fixed grid accumulates in double, one partial per block; one block adds them.
#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256
__global__ void sumsq_partial_kernel(double *part, const float *x, size_t n) {
  __shared__ double sh[SUMSQ_THREADS / 32];
  double s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    double v = (double)x[i];
    s += v * v;
  }
  s = warp_sum_d(s);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < SUMSQ_THREADS / 32 ? sh[threadIdx.x] : 0.0;
    s = warp_sum_d(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
  }
}
__global__ void sumsq_final_kernel(double *out, const double *part, int nparts) {
  __shared__ double sh[32];
  double s = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
  s = warp_sum_d(s);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
    s = warp_sum_d(s);
    if (threadIdx.x == 0) out[0] = s;
  }
}

// ---------------------------------------------------------------------------------------------
// kernels: column sums (dweight, dbias), deterministic in two passes
//
// Pass 1: block (32 columns) x (8 row lanes) sums rows [chunk * rpc, (chunk+1) * rpc) of its
// columns into part[chunk][c] (NOUT = 2: a second set after the first). Pass 2: per column, the
// chunks are added in order into the output (+=). The chunking depends only on (N, C).

template <int NOUT, class F>
__global__ void colsum_partial_kernel(float *part, long N, int C, long rpc, F f) {
  __shared__ float sh[NOUT][8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const long r0 = (long)blockIdx.y * rpc, r1 = r0 + rpc < N ? r0 + rpc : N;
  float a0 = 0.0f, a1 = 0.0f;
  if (c < C) {
    for (long r = r0 + threadIdx.y; r < r1; r += 8) {
      float2 v = f(r, c);
      a0 += v.x;
      if (NOUT > 1) a1 += v.y;
    }
  }
  sh[0][threadIdx.y][threadIdx.x] = a0;
  if (NOUT > 1) sh[NOUT - 1][threadIdx.y][threadIdx.x] = a1;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s0 = 0.0f, s1 = 0.0f;
    for (int y = 0; y < 8; y++) {
      s0 += sh[0][y][threadIdx.x];
      if (NOUT > 1) s1 += sh[NOUT - 1][y][threadIdx.x];
    }
    part[(long)blockIdx.y * C + c] = s0;
    if (NOUT > 1) part[(long)(gridDim.y + blockIdx.y) * C + c] = s1;
  }
}

__global__ void colsum_final_kernel(float *out0, float *out1, const float *part, int nchunks,
                                    int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  if (out0) {
    float s = 0.0f;
    for (int k = 0; k < nchunks; k++) s += part[(long)k * C + c];
    out0[c] += s;
  }
  if (out1) {
    float s = 0.0f;
    for (int k = 0; k < nchunks; k++) s += part[(long)(nchunks + k) * C + c];
    out1[c] += s;
  }
}

template <typename T> struct colsum_plain { // dbias: sum of dout rows
  const T *dout;
  int C;
  __device__ float2 operator()(long r, int c) const {
    return make_float2(ld(dout + r * C + c), 0.0f);
  }
};
template <typename T> struct colsum_layernorm { // (dw, db) of layernorm
  const T *dout, *inp;
  const float *mean, *rstd;
  int C;
  __device__ float2 operator()(long r, int c) const {
    float dy = ld(dout + r * C + c);
    float nrm = (ld(inp + r * C + c) - mean[r]) * rstd[r];
    return make_float2(dy * nrm, dy);
  }
};
template <typename T> struct colsum_rmsnorm { // dw of rmsnorm, rows possibly grouped
  const T *dout, *inp;
  const float *rstd;
  int C, rpg;
  long gs;
  __device__ float2 operator()(long r, int c) const {
    long off = rms_row(r, C, rpg, gs) + c;
    return make_float2(ld(dout + off) * (ld(inp + off) * rstd[r]), 0.0f);
  }
};

// out0[c] (+ out1[c]) += column sums of f over N rows. Returns false on error (recorded).
template <int NOUT, class F> bool colsum(float *out0, float *out1, long N, int C, F f) {
  if (N <= 0 || C <= 0 || (!out0 && !out1)) return true;
  const long ncb = (C + 31) / 32;
  long want = 2048 / ncb; // about 2048 blocks in pass 1, at most 2048 chunks per column
  if (want < 1) want = 1;
  long nchunks = (N + 63) / 64;
  if (nchunks > want) nchunks = want;
  long rpc = (N + nchunks - 1) / nchunks;
  nchunks = (N + rpc - 1) / rpc;
  float *part = (float *)scratch(sizeof(float) * (size_t)nchunks * C * NOUT);
  if (!part) return false;
  const dim3 grid((unsigned)ncb, (unsigned)nchunks);
  colsum_partial_kernel<NOUT, F><<<grid, dim3(32, 8), 0, g.stream>>>(part, N, C, rpc, f);
  if (!CK_LAUNCH(colsum_partial_kernel)) return false;
  colsum_final_kernel<<<(unsigned)((C + 255) / 256), 256, 0, g.stream>>>(
      out0, NOUT > 1 ? out1 : NULL, part, (int)nchunks, C);
  return CK_LAUNCH(colsum_final_kernel);
}

// ---------------------------------------------------------------------------------------------
// kernels: normalization, one warp per row (statistics in fp32, two-pass mean/variance)

#define NORM_WARPS 4

template <typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                     const T *b, int N, int C, float eps) {
  const int row = blockIdx.x * NORM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const T *x = inp + (long)row * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += ld(x + c);
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float d = ld(x + c) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / C + eps);
  T *o = out + (long)row * C;
  for (int c = lane; c < C; c += 32) {
    float y = (ld(x + c) - m) * r * ld(w + c);
    if (b) y += ld(b + c);
    st(o + c, y);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

template <typename T>
__global__ void layernorm_bwd_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                     const float *mean, const float *rstd, int N, int C) {
  const int row = blockIdx.x * NORM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const T *x = inp + (long)row * C, *dy = dout + (long)row * C;
  const float m = mean[row], r = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float gr = ld(dy + c) * ld(w + c);
    sg += gr;
    sgx += gr * ((ld(x + c) - m) * r);
  }
  const float mg = warp_sum(sg) / C, mgx = warp_sum(sgx) / C;
  T *dx = dinp + (long)row * C;
  for (int c = lane; c < C; c += 32) {
    float nrm = (ld(x + c) - m) * r;
    st(dx + c, ld(dx + c) + (ld(dy + c) * ld(w + c) - mg - nrm * mgx) * r);
  }
}

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C,
                                   int rpg, long gs, float eps) {
  const int row = blockIdx.x * NORM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const long off = rms_row(row, C, rpg, gs);
  const T *x = inp + off;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float v = ld(x + c);
    ss += v * v;
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / C + eps);
  T *o = out + off;
  for (int c = lane; c < C; c += 32) st(o + c, ld(x + c) * r * ld(w + c));
  if (lane == 0 && rstd) rstd[row] = r;
}

template <typename T>
__global__ void rmsnorm_bwd_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                   const float *rstd, int N, int C, int rpg, long gs) {
  const int row = blockIdx.x * NORM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const long off = rms_row(row, C, rpg, gs);
  const T *x = inp + off, *dy = dout + off;
  const float r = rstd[row];
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += ld(dy + c) * ld(w + c) * ld(x + c);
  const float k = warp_sum(s) * r * r * r / C;
  T *dx = dinp + off;
  for (int c = lane; c < C; c += 32)
    st(dx + c, ld(dx + c) + r * ld(w + c) * ld(dy + c) - ld(x + c) * k);
}

// ---------------------------------------------------------------------------------------------
// kernels: attention softmax (one warp per row of a (T, T) score matrix)

// Rows r of P (rows = B*H*T, row length T, t = r % T): scores (already scaled) -> causal
// softmax in place; entries above the diagonal are set to 0.
__global__ void softmax_causal_kernel(float *P, long rows, int T) {
  const long row = blockIdx.x * (long)NORM_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int t = (int)(row % T);
  float *p = P + row * T;
  float mx = -INFINITY;
  for (int s = lane; s <= t; s += 32) mx = fmaxf(mx, p[s]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int s = lane; s <= t; s += 32) {
    float e = expf(p[s] - mx);
    p[s] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int s = lane; s < T; s += 32) p[s] = s <= t ? p[s] * inv : 0.0f;
}

// dP holds (B, nh, T, T) for query heads h0 .. h0+nh-1; row r = (b*nh + hl)*T + t. In place:
// dS = P * (dP - sum_s P dP) * scale, with P the state row ((b*H + h0 + hl)*T + t).
__global__ void softmax_causal_bwd_kernel(float *dP, const float *P, int B, int T, int H, int h0,
                                          int nh, float scale) {
  const long row = blockIdx.x * (long)NORM_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (long)B * nh * T) return;
  const long b = row / ((long)nh * T), rem = row % ((long)nh * T);
  const int hl = (int)(rem / T), t = (int)(rem % T);
  const float *p = P + ((b * H + h0 + hl) * T + t) * (long)T;
  float *d = dP + row * T;
  float sd = 0.0f;
  for (int s = lane; s <= t; s += 32) sd += p[s] * d[s];
  sd = warp_sum(sd);
  for (int s = lane; s < T; s += 32) d[s] = s <= t ? p[s] * (d[s] - sd) * scale : 0.0f;
}

// Block-wide sum or max for any blockDim multiple of 32; every thread gets the result. `red`
// is __shared__ float[32]; the trailing barrier lets the caller reuse it at once.
__device__ float block_reduce(float v, bool is_max, float *red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = is_max ? warp_max(v) : warp_sum(v);
  if (lane == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    float r = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.0f);
    r = is_max ? warp_max(r) : warp_sum(r);
    if (lane == 0) red[0] = r;
  }
  __syncthreads();
  v = red[0];
  __syncthreads();
  return v;
}

// Inference over a KV cache: one block per (new query i, head h); query i (position pos0 + i)
// attends to cache rows 0 .. pos0+i of its kv head. Scores go to p (scratch, pos0+n per block).
// Warps take keys in turn and split hd across lanes (coalesced rows of K and V); for P V each
// warp sums its keys into its own row of `part`, and the rows are added at the end.
// Dynamic shared memory: q (hd, padded to a multiple of 4 plus 4: ptxas may read a vector past
// the end of a short tail) then part (warps x hd) — see cached_smem().
#define CACHED_THREADS 256
__host__ __device__ inline int cached_qpad(int hd) { return (hd + 7) / 4 * 4; }
inline size_t cached_smem(int hd) {
  return sizeof(float) * ((size_t)cached_qpad(hd) + (size_t)(CACHED_THREADS / 32) * hd);
}
template <typename T>
__global__ void attention_cached_kernel(T *out, const T *qkv, const T *kc, const T *vc, float *pbuf,
                                        int n, int pos0, int H, int KV, int hd, int max_T,
                                        float scale) {
  extern __shared__ float4 smem4[]; // float4: 16-byte alignment for the compiler's vector reads
  float *qs = (float *)smem4, *part = qs + cached_qpad(hd);
  __shared__ float red[32];
  const int i = blockIdx.x / H, h = blockIdx.x % H, kv = h / (H / KV), len = pos0 + i + 1;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const long W = (long)(H + 2 * KV) * hd;
  const T *q = qkv + i * W + (long)h * hd;
  const T *k = kc + (long)kv * max_T * hd, *v = vc + (long)kv * max_T * hd;
  float *p = pbuf + (long)blockIdx.x * (pos0 + n);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = ld(q + d);
  __syncthreads();
  float mx = -INFINITY;
  for (int j = w; j < len; j += nw) {
    const T *kj = k + (long)j * hd;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s += qs[d] * ld(kj + d);
    s = warp_sum(s) * scale;
    if (lane == 0) p[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_reduce(mx, true, red); // its barriers also publish p
  float sum = 0.0f;
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    float e = expf(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / block_reduce(sum, false, red);
  float *mine = part + (long)w * hd; // lane l only ever touches d = l mod 32: no barrier needed
  for (int d = lane; d < hd; d += 32) mine[d] = 0.0f;
  for (int j = w; j < len; j += nw) {
    const float pj = p[j];
    const T *vj = v + (long)j * hd;
    for (int d = lane; d < hd; d += 32) mine[d] += pj * ld(vj + d);
  }
  __syncthreads();
  T *o = out + (long)i * H * hd + (long)h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int ww = 0; ww < nw; ww++) acc += part[(long)ww * hd + d];
    st(o + d, acc * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// kernels: fused softmax + cross-entropy, one block per row, online max/sum

#define XENT_THREADS 512

__device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  float M = fmaxf(m, m2);
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

template <typename T>
__global__ void xent_kernel(float *losses, T *logits, const int32_t *targets, int V, int Vp,
                            float grad_scale) {
  __shared__ float shm[XENT_THREADS / 32], shs[XENT_THREADS / 32];
  const long n = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  T *x = logits + n * Vp;
  const int tgt = targets[n];
  if (tgt < 0 || tgt >= V) { // ignored (a target >= V breaks the contract: loss NaN)
    if (tid == 0) losses[n] = tgt < 0 ? 0.0f : NAN;
    if (grad_scale != 0.0f)
      for (int i = tid; i < Vp; i += blockDim.x) st(x + i, 0.0f);
    return;
  }
  const float xt = ld(x + tgt);
  float m = -INFINITY, s = 0.0f;
  for (int i = tid; i < V; i += blockDim.x) {
    float v = ld(x + i);
    if (v > m) {
      s = s * expf(m - v) + 1.0f; // expf(-inf) = 0 on the first element
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_merge(m, s, m2, s2);
  }
  if (lane == 0) {
    shm[w] = m;
    shs[w] = s;
  }
  __syncthreads(); // also orders the read of x[tgt] before any write below
  m = shm[0];
  s = shs[0];
  for (int i = 1; i < XENT_THREADS / 32; i++) ms_merge(m, s, shm[i], shs[i]);
  if (tid == 0) losses[n] = logf(s) - (xt - m);
  if (grad_scale == 0.0f) return;
  const float k = grad_scale / s;
  for (int i = tid; i < Vp; i += blockDim.x) {
    float v = 0.0f;
    if (i < V) {
      v = __fmul_rn(expf(ld(x + i) - m), k);
      if (i == tgt) v -= grad_scale;
    }
    st(x + i, v);
  }
}

// ---------------------------------------------------------------------------------------------
// matmul through cuBLAS (column-major): a row-major (R, C) matrix is a column-major (C, R) one.

// C = alpha op(A) op(B) + beta C, batched with strides when batch > 1.
template <typename T>
bool gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
          const T *A, int lda, long long sA, const T *B, int ldb, long long sB, float beta, T *C,
          int ldc, long long sC, int batch) {
  const cudaDataType_t dt = blas_type<T>();
  if (batch == 1)
    return CKB(cublasGemmEx(g.blas, ta, tb, m, n, k, &alpha, A, dt, lda, B, dt, ldb, &beta, C, dt,
                            ldc, g.compute, CUBLAS_GEMM_DEFAULT));
  return CKB(cublasGemmStridedBatchedEx(g.blas, ta, tb, m, n, k, &alpha, A, dt, lda, sA, B, dt,
                                        ldb, sB, &beta, C, dt, ldc, sC, batch, g.compute,
                                        CUBLAS_GEMM_DEFAULT));
}

// Pointer arrays for cublasGemmBatchedEx. Entry i of a batch of (outer, inner) pairs,
// b = i / nper, r = i % nper, points at base + b*sb + (r / div)*s1 + (r % div)*s2 elements:
// `div` maps query heads to their kv head (r / grp) without a host loop.
struct ptr_desc {
  const char *base;
  long sb, s1, s2;
  int div;
};
__global__ void build_ptrs_kernel(const void **a, const void **b, const void **c, int count,
                                  int nper, ptr_desc da, ptr_desc db, ptr_desc dc, int esize) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const long o = i / nper, r = i % nper;
  a[i] = da.base + (o * da.sb + (r / da.div) * da.s1 + (r % da.div) * da.s2) * esize;
  b[i] = db.base + (o * db.sb + (r / db.div) * db.s1 + (r % db.div) * db.s2) * esize;
  c[i] = dc.base + (o * dc.sb + (r / dc.div) * dc.s1 + (r % dc.div) * dc.s2) * esize;
}
ptr_desc pd(const void *base, long sb, long s1, int div = 1, long s2 = 0) {
  ptr_desc d = {(const char *)base, sb, s1, s2, div};
  return d;
}

// C_i = alpha op(A_i) op(B_i) + beta C_i for `count` (A, B, C) triples described by the
// descriptors; `ptrs` is device room for 3*count pointers. The C_i must be distinct.
template <typename T>
bool gemm_batched(void **ptrs, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  float alpha, ptr_desc A, int lda, ptr_desc B, int ldb, float beta, ptr_desc C,
                  int ldc, int count, int nper) {
  const void **pa = (const void **)ptrs, **pb = pa + count, **pc = pb + count;
  build_ptrs_kernel<<<(count + 127) / 128, 128, 0, g.stream>>>(pa, pb, pc, count, nper, A, B, C,
                                                               (int)sizeof(T));
  if (!CK_LAUNCH(build_ptrs_kernel)) return false;
  const cudaDataType_t dt = blas_type<T>();
  return CKB(cublasGemmBatchedEx(g.blas, ta, tb, m, n, k, &alpha, pa, dt, lda, pb, dt, ldb, &beta,
                                 (void *const *)pc, dt, ldc, count, g.compute,
                                 CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------------------
// launchers: the table's functions

void *cu_alloc(size_t bytes) {
  if (!g.ready) return NULL;
  size_t n = bytes ? (bytes + 255) / 256 * 256 : 256;
  void *p = NULL;
  if (cudaMalloc(&p, n) != cudaSuccess) {
    cudaGetLastError(); // out of memory is not sticky: the caller sees NULL and reports it
    return NULL;
  }
  g.op = "alloc";
  if (!CK(cudaMemsetAsync(p, 0, n, g.stream)) || !CK(cudaStreamSynchronize(g.stream))) {
    cudaFree(p);
    return NULL;
  }
  return p;
}

void cu_free(void *p) {
  if (!p) return;
  OP("free");
  CK(cudaFree(p));
}

void cu_zero(void *p, size_t bytes) {
  OP("zero");
  if (p && bytes) CK(cudaMemsetAsync(p, 0, bytes, g.stream));
}

// Synchronous: the host buffer may be reused (or be pinned and change) once this returns.
void cu_to_device(void *dst, const void *src, size_t bytes) {
  OP("to_device");
  if (!bytes) return;
  if (CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream)))
    CK(cudaStreamSynchronize(g.stream));
}

void cu_to_host(void *dst, const void *src, size_t bytes) {
  OP("to_host");
  if (!bytes) return;
  if (CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g.stream)))
    CK(cudaStreamSynchronize(g.stream));
}

void cu_copy2d(void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t row_bytes,
               size_t rows) {
  OP("copy2d");
  if (!rows || !row_bytes) return;
  if (rows == 1) { // cudaMemcpy2D insists on pitch >= width even for one row
    CK(cudaMemcpyAsync(dst, src, row_bytes, cudaMemcpyDeviceToDevice, g.stream));
    return;
  }
  CK(cudaMemcpy2DAsync(dst, dst_stride, src, src_stride, row_bytes, rows, cudaMemcpyDeviceToDevice,
                       g.stream));
}

void cu_embed_fwd(void *out, const int32_t *tok, const void *wte, const void *wpe, int B, int T,
                  int C) {
  OP("embed_fwd");
  long N = (long)B * T;
  if (N <= 0 || C <= 0) return;
  embed_fwd_kernel<act_t><<<grid_for((size_t)N * C, 256), 256, 0, g.stream>>>(
      (act_t *)out, tok, (const act_t *)wte, (const act_t *)wpe, N, T, C);
  CK_LAUNCH(embed_fwd_kernel);
}

void cu_embed_bwd(float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B, int T,
                  int C) {
  OP("embed_bwd");
  long N = (long)B * T;
  if (N <= 0 || C <= 0) return;
  if (dwte) {
    embed_bwd_wte_kernel<act_t><<<(unsigned)N, EMB_THREADS, 0, g.stream>>>(
        dwte, (const act_t *)dout, tok, (int)N, C);
    CK_LAUNCH(embed_bwd_wte_kernel);
  }
  if (dwpe) {
    embed_bwd_wpe_kernel<act_t><<<grid_for((size_t)T * C, 256), 256, 0, g.stream>>>(
        dwpe, (const act_t *)dout, B, T, C);
    CK_LAUNCH(embed_bwd_wpe_kernel);
  }
}

void cu_layernorm_fwd(void *out, float *mean, float *rstd, const void *inp, const void *w,
                      const void *b, int N, int C, float eps) {
  OP("layernorm_fwd");
  if (N <= 0 || C <= 0) return;
  layernorm_fwd_kernel<act_t><<<(N + NORM_WARPS - 1) / NORM_WARPS, NORM_WARPS * 32, 0, g.stream>>>(
      (act_t *)out, mean, rstd, (const act_t *)inp, (const act_t *)w, (const act_t *)b, N, C, eps);
  CK_LAUNCH(layernorm_fwd_kernel);
}

void cu_layernorm_bwd(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                      const void *w, const float *mean, const float *rstd, int N, int C) {
  OP("layernorm_bwd");
  if (N <= 0 || C <= 0) return;
  if (dinp) {
    layernorm_bwd_kernel<act_t>
        <<<(N + NORM_WARPS - 1) / NORM_WARPS, NORM_WARPS * 32, 0, g.stream>>>(
            (act_t *)dinp, (const act_t *)dout, (const act_t *)inp, (const act_t *)w, mean, rstd,
            N, C);
    if (!CK_LAUNCH(layernorm_bwd_kernel)) return;
  }
  if (dw || db) {
    colsum_layernorm<act_t> f = {(const act_t *)dout, (const act_t *)inp, mean, rstd, C};
    colsum<2>(dw, db, N, C, f);
  }
}

void cu_rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *w, int N, int C, int rpg,
                    long gs, float eps) {
  OP("rmsnorm_fwd");
  if (N <= 0 || C <= 0) return;
  if (rpg <= 0) rpg = N;
  rmsnorm_fwd_kernel<act_t><<<(N + NORM_WARPS - 1) / NORM_WARPS, NORM_WARPS * 32, 0, g.stream>>>(
      (act_t *)out, rstd, (const act_t *)inp, (const act_t *)w, N, C, rpg, gs, eps);
  CK_LAUNCH(rmsnorm_fwd_kernel);
}

void cu_rmsnorm_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                    const float *rstd, int N, int C, int rpg, long gs) {
  OP("rmsnorm_bwd");
  if (N <= 0 || C <= 0) return;
  if (rpg <= 0) rpg = N;
  if (dinp) {
    rmsnorm_bwd_kernel<act_t><<<(N + NORM_WARPS - 1) / NORM_WARPS, NORM_WARPS * 32, 0, g.stream>>>(
        (act_t *)dinp, (const act_t *)dout, (const act_t *)inp, (const act_t *)w, rstd, N, C, rpg,
        gs);
    if (!CK_LAUNCH(rmsnorm_bwd_kernel)) return;
  }
  if (dw) {
    colsum_rmsnorm<act_t> f = {(const act_t *)dout, (const act_t *)inp, rstd, C, rpg, gs};
    colsum<1>(dw, NULL, N, C, f);
  }
}

// out(N,OC) = inp(N,IC) w(OC,IC)^T (+ bias). Column-major, out is (OC,N) = w^T(OC,IC) inp(IC,N):
// gemm(T, N, m=OC, n=N, k=IC, A=w lda=IC, B=inp ldb=IC, C=out ldc=OC). With a bias, out is
// first filled with it and the gemm adds (beta = 1), as the CPU does.
void cu_matmul_fwd(void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                   int OC) {
  OP("matmul_fwd");
  if (N <= 0 || OC <= 0) return;
  float beta = 0.0f;
  if (bias) {
    bias_broadcast_kernel<act_t><<<grid_for((size_t)N * OC, 256), 256, 0, g.stream>>>(
        (act_t *)out, (const act_t *)bias, N, OC);
    if (!CK_LAUNCH(bias_broadcast_kernel)) return;
    beta = 1.0f;
  }
  gemm<act_t>(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, (const act_t *)w, IC, 0,
              (const act_t *)inp, IC, 0, beta, (act_t *)out, OC, 0, 1);
}

// dinp(N,IC) += dout(N,OC) w(OC,IC):  gemm(N, N, m=IC, n=N, k=OC, A=w lda=IC, B=dout ldb=OC)
// dw(OC,IC) += dout^T inp:            gemm(N, T, m=IC, n=OC, k=N, A=inp lda=IC, B=dout ldb=OC)
void cu_matmul_bwd(void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                   const void *w, int N, int IC, int OC) {
  OP("matmul_bwd");
  if (N <= 0) return;
  const act_t *dO = (const act_t *)dout;
  if (dinp && !gemm<act_t>(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, (const act_t *)w, IC, 0, dO,
                           OC, 0, 1.0f, (act_t *)dinp, IC, 0, 1))
    return;
  // dw is fp32 like every parameter gradient; with act_t = float the gemm types agree.
  if (dw && !gemm<act_t>(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, (const act_t *)inp, IC, 0, dO,
                         OC, 0, 1.0f, (act_t *)dw, IC, 0, 1))
    return;
  if (dbias) {
    colsum_plain<act_t> f = {dO, OC};
    colsum<1>(dbias, NULL, N, OC, f);
  }
}

void rope_launch(void *qkv, int B, int T, int H, int KV, int hd, int pos0, float theta, float dir) {
  long N = (long)B * T;
  size_t total = (size_t)N * (H + KV) * (hd / 2);
  if (!total) return;
  rope_kernel<act_t><<<grid_for(total, 256), 256, 0, g.stream>>>((act_t *)qkv, N, T, H, KV, hd,
                                                                 pos0, theta, dir);
  CK_LAUNCH(rope_kernel);
}
void cu_rope_fwd(void *qkv, int B, int T, int H, int KV, int hd, int pos0, float theta) {
  OP("rope_fwd");
  rope_launch(qkv, B, T, H, KV, hd, pos0, theta, 1.0f);
}
void cu_rope_bwd(void *dqkv, int B, int T, int H, int KV, int hd, int pos0, float theta) {
  OP("rope_bwd");
  rope_launch(dqkv, B, T, H, KV, hd, pos0, theta, -1.0f);
}

size_t cu_attention_state_floats(int B, int T, int H, int /*KV*/, int /*hd*/) {
  return (size_t)B * H * T * T;
}

// Per query head h (one strided-batched gemm over the batch each):
//   S_b = scale * Q_bh K_bkv^T  into state (B,H,T,T)  -> gemm(T, N, m=T, n=T, k=hd, A=K, B=Q)
//   P = causal softmax(S) in place (one kernel over all B*H*T rows)
//   O_bh = P_bh V_bkv                                -> gemm(N, N, m=hd, n=T, k=T, A=V, B=P)
// The full T x T product is computed and the upper half masked: 2x the causal flops, the price
// of a plain version (the flash variant replaces it).
void attention_fwd_perhead(void *out, float *state, const void *qkv_, int B, int T, int H,
                           int KV, int hd) {
  const act_t *qkv = (const act_t *)qkv_;
  act_t *o = (act_t *)out;
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  for (int h = 0; h < H; h++) {
    const act_t *q = qkv + (long)h * hd, *k = qkv + HD + (long)(h / grp) * hd;
    if (!gemm<float>(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, k, (int)W3, T * W3, q, (int)W3,
                     T * W3, 0.0f, state + h * TT, T, H * TT, B))
      return;
  }
  long rows = (long)B * H * T;
  softmax_causal_kernel<<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32, 0,
                          g.stream>>>(state, rows, T);
  if (!CK_LAUNCH(softmax_causal_kernel)) return;
  for (int h = 0; h < H; h++) {
    const act_t *v = qkv + HD + (long)(KV + h / grp) * hd;
    if (!gemm<float>(CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, v, (int)W3, T * W3, state + h * TT,
                     T, H * TT, 0.0f, o + (long)h * hd, (int)HD, T * HD, B))
      return;
  }
}

// Per query head h, with dP/dS in scratch (B, T, T):
//   dV += P^T dO   -> gemm(N, T, m=hd, n=T, k=T, A=dO, B=P)       (beta 1, into dqkv's v)
//   dP  = dO V^T   -> gemm(T, N, m=T, n=T, k=hd, A=V, B=dO)
//   dS  = P (dP - rowsum(P dP)) * scale (kernel, in place)
//   dQ += dS K     -> gemm(N, N, m=hd, n=T, k=T, A=K, B=dS)       (beta 1)
//   dK += dS^T Q   -> gemm(N, T, m=hd, n=T, k=T, A=Q, B=dS)       (beta 1)
// Query heads of a group add into the same dK/dV one after another on the stream: no races.
void attention_bwd_perhead(void *dqkv_, const void *dout_, const void *qkv_, const float *state,
                           int B, int T, int H, int KV, int hd) {
  const act_t *qkv = (const act_t *)qkv_, *dO = (const act_t *)dout_;
  act_t *dqkv = (act_t *)dqkv_;
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  float *dP = (float *)scratch(sizeof(float) * (size_t)B * TT);
  if (!dP) return;
  for (int h = 0; h < H; h++) {
    const int kv = h / grp;
    const act_t *q = qkv + (long)h * hd, *k = qkv + HD + (long)kv * hd;
    const act_t *v = qkv + HD + (long)(KV + kv) * hd, *dOh = dO + (long)h * hd;
    act_t *dq = dqkv + (long)h * hd, *dk = dqkv + HD + (long)kv * hd;
    act_t *dv = dqkv + HD + (long)(KV + kv) * hd;
    const float *P = state + h * TT;
    if (!gemm<float>(CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, dOh, (int)HD, T * HD, P, T, H * TT,
                     1.0f, dv, (int)W3, T * W3, B))
      return;
    if (!gemm<float>(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, v, (int)W3, T * W3, dOh, (int)HD,
                     T * HD, 0.0f, dP, T, TT, B))
      return;
    long rows = (long)B * T;
    softmax_causal_bwd_kernel<<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32,
                                0, g.stream>>>(dP, state, B, T, H, h, 1, scale);
    if (!CK_LAUNCH(softmax_causal_bwd_kernel)) return;
    if (!gemm<float>(CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, k, (int)W3, T * W3, dP, T, TT, 1.0f,
                     dq, (int)W3, T * W3, B))
      return;
    if (!gemm<float>(CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, q, (int)W3, T * W3, dP, T, TT, 1.0f,
                     dk, (int)W3, T * W3, B))
      return;
  }
}

// The batched variant: the same products, each one cublasGemmBatchedEx over every (b, h) pair
// at once (pointer arrays built on the device), so small T fills the GPU instead of issuing
// B-sized batches H times. Products whose outputs coincide within a batch (dK and dV: the query
// heads of a group add into one kv head) are issued once per group member j instead.
void attention_fwd_batched(void *out, float *state, const void *qkv, int B, int T, int H, int KV,
                           int hd) {
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV, count = B * H;
  const float scale = 1.0f / sqrtf((float)hd);
  const act_t *q = (const act_t *)qkv, *k = q + HD, *v = q + HD + (long)KV * hd;
  void **ptrs = (void **)scratch(sizeof(void *) * 3 * (size_t)count);
  if (!ptrs) return;
  // S(b,h) = scale K(b, h/grp) Q(b,h)^T   (column-major (T_s, T_t) = row-major (T_t, T_s))
  if (!gemm_batched<float>(ptrs, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, pd(k, T * W3, hd, grp),
                           (int)W3, pd(q, T * W3, hd), (int)W3, 0.0f, pd(state, H * TT, TT), T,
                           count, H))
    return;
  const long rows = (long)B * H * T;
  softmax_causal_kernel<<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32, 0,
                          g.stream>>>(state, rows, T);
  if (!CK_LAUNCH(softmax_causal_kernel)) return;
  // O(b,h) = P(b,h) V(b, h/grp)
  gemm_batched<float>(ptrs, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, pd(v, T * W3, hd, grp),
                      (int)W3, pd(state, H * TT, TT), T, 0.0f, pd(out, T * HD, hd), (int)HD, count,
                      H);
}

// Works on chunks of kv groups so that dP (B, heads of the chunk, T, T) stays under a cap
// (256 MiB; CT_CUDA_ATTN_SCRATCH_MB) unless one group alone is larger.
void attention_bwd_batched(void *dqkv, const void *dout, const void *qkv, const float *state,
                           int B, int T, int H, int KV, int hd) {
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  const size_t per_kv = sizeof(float) * (size_t)B * grp * TT;
  const size_t fit = g.attn_scratch_cap / per_kv; // kv groups per chunk
  const int nkc = fit < 1 ? 1 : fit > (size_t)KV ? KV : (int)fit;
  const size_t dp_bytes = per_kv * nkc, ptr_count = (size_t)B * nkc * grp;
  char *sc = (char *)scratch(dp_bytes + sizeof(void *) * 3 * ptr_count + 256);
  if (!sc) return;
  float *dP = (float *)sc;
  void **ptrs = (void **)(sc + (dp_bytes + 255) / 256 * 256);
  const act_t *q = (const act_t *)qkv, *k = q + HD, *v = q + HD + (long)KV * hd;
  const act_t *dO = (const act_t *)dout;
  act_t *dq = (act_t *)dqkv, *dk = dq + HD, *dv = dq + HD + (long)KV * hd;
  for (int kv0 = 0; kv0 < KV; kv0 += nkc) {
    const int nk = KV - kv0 < nkc ? KV - kv0 : nkc, nh = nk * grp, h0 = kv0 * grp;
    // dV(b,kv) += P(b,h)^T dO(b,h) for h = kv*grp + j, one j at a time (outputs coincide)
    for (int j = 0; j < grp; j++)
      if (!gemm_batched<float>(ptrs, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f,
                               pd(dO + (long)(h0 + j) * hd, T * HD, (long)grp * hd), (int)HD,
                               pd(state + (long)(h0 + j) * TT, H * TT, (long)grp * TT), T, 1.0f,
                               pd(dv + (long)kv0 * hd, T * W3, hd), (int)W3, B * nk, nk))
        return;
    // dP(b,hl) = dO(b,h) V(b,kv)^T into scratch (B, nh, T, T)
    if (!gemm_batched<float>(ptrs, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f,
                             pd(v + (long)kv0 * hd, T * W3, hd, grp), (int)W3,
                             pd(dO + (long)h0 * hd, T * HD, hd), (int)HD, 0.0f,
                             pd(dP, nh * TT, TT), T, B * nh, nh))
      return;
    const long rows = (long)B * nh * T;
    softmax_causal_bwd_kernel<<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32,
                                0, g.stream>>>(dP, state, B, T, H, h0, nh, scale);
    if (!CK_LAUNCH(softmax_causal_bwd_kernel)) return;
    // dQ(b,h) += dS(b,hl) K(b,kv)
    if (!gemm_batched<float>(ptrs, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f,
                             pd(k + (long)kv0 * hd, T * W3, hd, grp), (int)W3,
                             pd(dP, nh * TT, TT), T, 1.0f, pd(dq + (long)h0 * hd, T * W3, hd),
                             (int)W3, B * nh, nh))
      return;
    // dK(b,kv) += dS(b,hl)^T Q(b,h), one j at a time
    for (int j = 0; j < grp; j++)
      if (!gemm_batched<float>(ptrs, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f,
                               pd(q + (long)(h0 + j) * hd, T * W3, (long)grp * hd), (int)W3,
                               pd(dP + (long)j * TT, nh * TT, (long)grp * TT), T, 1.0f,
                               pd(dk + (long)kv0 * hd, T * W3, hd), (int)W3, B * nk, nk))
        return;
  }
}

void cu_attention_fwd(void *out, float *state, const void *qkv, int B, int T, int H, int KV,
                      int hd) {
  OP("attention_fwd");
  if (B <= 0 || T <= 0 || H <= 0) return;
  if (g.attn_perhead) attention_fwd_perhead(out, state, qkv, B, T, H, KV, hd);
  else attention_fwd_batched(out, state, qkv, B, T, H, KV, hd);
}

void cu_attention_bwd(void *dqkv, const void *dout, const void *qkv, const float *state, int B,
                      int T, int H, int KV, int hd) {
  OP("attention_bwd");
  if (B <= 0 || T <= 0 || H <= 0) return;
  if (g.attn_perhead) attention_bwd_perhead(dqkv, dout, qkv, state, B, T, H, KV, hd);
  else attention_bwd_batched(dqkv, dout, qkv, state, B, T, H, KV, hd);
}

void cu_attention_cached(void *out, const void *qkv, const void *kc, const void *vc, int n,
                         int pos0, int H, int KV, int hd, int max_T) {
  OP("attention_cached");
  if (n <= 0 || H <= 0) return;
  float *p = (float *)scratch(sizeof(float) * (size_t)n * H * (pos0 + n));
  if (!p) return;
  attention_cached_kernel<act_t><<<(unsigned)(n * H), CACHED_THREADS, cached_smem(hd),
                                   g.stream>>>((act_t *)out, (const act_t *)qkv, (const act_t *)kc,
                                               (const act_t *)vc, p, n, pos0, H, KV, hd, max_T,
                                               1.0f / sqrtf((float)hd));
  CK_LAUNCH(attention_cached_kernel);
}

void cu_gelu_fwd(void *out, const void *inp, size_t n) {
  OP("gelu_fwd");
  if (!n) return;
  gelu_fwd_kernel<act_t><<<grid_for(n, 256), 256, 0, g.stream>>>((act_t *)out, (const act_t *)inp,
                                                                  n);
  CK_LAUNCH(gelu_fwd_kernel);
}

void cu_gelu_bwd(void *dinp, const void *dout, const void *inp, size_t n) {
  OP("gelu_bwd");
  if (!n || !dinp) return;
  gelu_bwd_kernel<act_t><<<grid_for(n, 256), 256, 0, g.stream>>>(
      (act_t *)dinp, (const act_t *)dout, (const act_t *)inp, n);
  CK_LAUNCH(gelu_bwd_kernel);
}

void cu_swiglu_fwd(void *out, const void *inp, int N, int F) {
  OP("swiglu_fwd");
  if (N <= 0 || F <= 0) return;
  swiglu_fwd_kernel<act_t><<<grid_for((size_t)N * F, 256), 256, 0, g.stream>>>(
      (act_t *)out, (const act_t *)inp, N, F);
  CK_LAUNCH(swiglu_fwd_kernel);
}

void cu_swiglu_bwd(void *dinp, const void *dout, const void *inp, int N, int F) {
  OP("swiglu_bwd");
  if (N <= 0 || F <= 0 || !dinp) return;
  swiglu_bwd_kernel<act_t><<<grid_for((size_t)N * F, 256), 256, 0, g.stream>>>(
      (act_t *)dinp, (const act_t *)dout, (const act_t *)inp, N, F);
  CK_LAUNCH(swiglu_bwd_kernel);
}

void cu_add_fwd(void *out, const void *a, const void *b, size_t n) {
  OP("add_fwd");
  if (!n) return;
  add_kernel<act_t><<<grid_for(n, 256), 256, 0, g.stream>>>((act_t *)out, (const act_t *)a,
                                                             (const act_t *)b, n);
  CK_LAUNCH(add_kernel);
}

void cu_xent_fwd_bwd(float *losses, void *logits, const int32_t *targets, int N, int V, int Vp,
                     float grad_scale) {
  OP("xent_fwd_bwd");
  if (N <= 0) return;
  xent_kernel<act_t><<<(unsigned)N, XENT_THREADS, 0, g.stream>>>(losses, (act_t *)logits, targets,
                                                                 V, Vp, grad_scale);
  CK_LAUNCH(xent_kernel);
}

// Same arithmetic as the CPU (torch.optim.AdamW, foreach=False); bias corrections in double.
void cu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float b1,
              float b2, float eps, float wd, float grad_scale, int step) {
  OP("adamw");
  if (!n) return;
  double bc1 = 1.0 - pow((double)b1, step), bc2 = 1.0 - pow((double)b2, step);
  const float step_size = (float)(lr / bc1), inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
  const float decay = 1.0f - lr * wd, a1 = 1.0f - b1, a2 = 1.0f - b2;
  adamw_kernel<<<grid_for(n, 256), 256, 0, g.stream>>>(param, grad, m, v, n, b1, b2, a1, a2, eps,
                                                       decay, step_size, inv_bc2_sqrt, grad_scale);
  CK_LAUNCH(adamw_kernel);
}

// Synchronizes (the result comes back to the host); NaN if the op failed.
double cu_sumsq(const float *x, size_t n) {
  op_scope scope("sumsq");
  if (!scope.ok) return NAN;
  if (!n) return 0.0;
  double *part = (double *)scratch(sizeof(double) * (SUMSQ_BLOCKS + 1));
  if (!part) return NAN;
  sumsq_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, g.stream>>>(part, x, n);
  if (!CK_LAUNCH(sumsq_partial_kernel)) return NAN;
  sumsq_final_kernel<<<1, 1024, 0, g.stream>>>(part + SUMSQ_BLOCKS, part, SUMSQ_BLOCKS);
  if (!CK_LAUNCH(sumsq_final_kernel)) return NAN;
  if (!CK(cudaMemcpyAsync(g.host_result, part + SUMSQ_BLOCKS, sizeof(double),
                          cudaMemcpyDeviceToHost, g.stream)))
    return NAN;
  if (!CK(cudaStreamSynchronize(g.stream))) return NAN;
  return *g.host_result;
}

void cu_scale(float *x, float s, size_t n) {
  OP("scale");
  if (!n) return;
  scale_kernel<<<grid_for(n, 256), 256, 0, g.stream>>>(x, s, n);
  CK_LAUNCH(scale_kernel);
}

// ---------------------------------------------------------------------------------------------
// the table

ct_ops make_table() {
  ct_ops t;
  memset(&t, 0, sizeof t);
  t.name = "cuda";
  t.alloc = cu_alloc;
  t.free = cu_free;
  t.zero = cu_zero;
  t.to_device = cu_to_device;
  t.to_host = cu_to_host;
  t.copy2d = cu_copy2d;
  t.embed_fwd = cu_embed_fwd;
  t.embed_bwd = cu_embed_bwd;
  t.layernorm_fwd = cu_layernorm_fwd;
  t.layernorm_bwd = cu_layernorm_bwd;
  t.rmsnorm_fwd = cu_rmsnorm_fwd;
  t.rmsnorm_bwd = cu_rmsnorm_bwd;
  t.matmul_fwd = cu_matmul_fwd;
  t.matmul_bwd = cu_matmul_bwd;
  t.rope_fwd = cu_rope_fwd;
  t.rope_bwd = cu_rope_bwd;
  t.attention_state_floats = cu_attention_state_floats;
  t.attention_fwd = cu_attention_fwd;
  t.attention_bwd = cu_attention_bwd;
  t.attention_cached = cu_attention_cached;
  t.gelu_fwd = cu_gelu_fwd;
  t.gelu_bwd = cu_gelu_bwd;
  t.swiglu_fwd = cu_swiglu_fwd;
  t.swiglu_bwd = cu_swiglu_bwd;
  t.add_fwd = cu_add_fwd;
  t.xent_fwd_bwd = cu_xent_fwd_bwd;
  t.adamw = cu_adamw;
  t.sumsq = cu_sumsq;
  t.scale = cu_scale;
  return t;
}
const ct_ops cuda_ops = make_table();

void release() {
  if (g.scratch) cudaFree(g.scratch);
  if (g.host_result) cudaFreeHost(g.host_result);
  if (g.blas) cublasDestroy(g.blas);
  if (g.stream) cudaStreamDestroy(g.stream);
  g.scratch = NULL;
  g.scratch_bytes = 0;
  g.host_result = NULL;
  g.blas = NULL;
  g.stream = NULL;
  g.ready = 0;
}

bool env_on(const char *name) {
  const char *v = getenv(name);
  return v && v[0] && strcmp(v, "0") != 0;
}

} // namespace

// ---------------------------------------------------------------------------------------------
// C entry points

extern "C" const ct_ops *ct_ops_cuda(void) { return &cuda_ops; }

extern "C" int ct_cuda_init(int device, char *err, size_t errcap) {
#define INIT_FAIL(...)                                                                            \
  do {                                                                                            \
    if (err && errcap) snprintf(err, errcap, __VA_ARGS__);                                        \
    cudaGetLastError();                                                                           \
    release();                                                                                    \
    return -1;                                                                                    \
  } while (0)
  if (g.ready) {
    if (device == g.device) return 0;
    if (err && errcap)
      snprintf(err, errcap, "the CUDA backend is already initialized on device %d (asked for %d)",
               g.device, device);
    return -1;
  }
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    INIT_FAIL("no usable CUDA device: cudaGetDeviceCount: %s", cudaGetErrorString(e));
  if (n <= 0) INIT_FAIL("no CUDA device visible");
  if (device < 0 || device >= n)
    INIT_FAIL("CUDA device %d does not exist (%d visible; check CUDA_VISIBLE_DEVICES)", device, n);
  if ((e = cudaSetDevice(device)) != cudaSuccess)
    INIT_FAIL("cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
  e = cudaDeviceGetAttribute(&g.num_sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess)
    INIT_FAIL("cudaDeviceGetAttribute(MultiProcessorCount): %s", cudaGetErrorString(e));
  if ((e = cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking)) != cudaSuccess)
    INIT_FAIL("cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
  if ((e = cudaMallocHost((void **)&g.host_result, sizeof(double))) != cudaSuccess)
    INIT_FAIL("cudaMallocHost: %s", cudaGetErrorString(e));
  cublasStatus_t s = cublasCreate(&g.blas);
  if (s != CUBLAS_STATUS_SUCCESS) INIT_FAIL("cublasCreate: %s", cublasGetStatusString(s));
  if ((s = cublasSetStream(g.blas, g.stream)) != CUBLAS_STATUS_SUCCESS)
    INIT_FAIL("cublasSetStream: %s", cublasGetStatusString(s));
  const bool tf32 = env_on("CT_CUDA_TF32");
  g.compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if ((s = cublasSetMathMode(g.blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH)) !=
      CUBLAS_STATUS_SUCCESS)
    INIT_FAIL("cublasSetMathMode: %s", cublasGetStatusString(s));
  g.sync_debug = env_on("CT_CUDA_SYNC");
  const char *attn = getenv("CT_CUDA_ATTN");
  g.attn_perhead = attn && !strcmp(attn, "perhead");
  const char *cap = getenv("CT_CUDA_ATTN_SCRATCH_MB");
  g.attn_scratch_cap = (size_t)(cap && atol(cap) > 0 ? atol(cap) : 256) << 20;
  g.device = device;
  g.ready = 1;
  return 0;
#undef INIT_FAIL
}

extern "C" int ct_cuda_check(char *err, size_t cap) {
  if (g.ready) {
    const char *prev = g.op;
    g.op = "ct_cuda_check";
    CK(cudaStreamSynchronize(g.stream));
    CK(cudaGetLastError());
    g.op = prev;
  }
  if (!g.failed) return 0;
  if (err && cap) snprintf(err, cap, "%s", g.err);
  return -1;
}

extern "C" void *ct_cuda_stream(void) { return g.ready ? (void *)g.stream : NULL; }

extern "C" void ct_cuda_shutdown(void) {
  if (!g.ready) return;
  cudaStreamSynchronize(g.stream);
  release();
}
