// kernels/cuda/ops_cuda.cu — the CUDA backend of the op table (kernels/ops.h): three tables.
//
// Contract (ops.h has the full text; kernels/cpu/ops_cpu.c is the reference this matches):
//   - "cuda" (fp32): every activation and weight pointer is fp32 device memory. "cuda-bf16" and
//     "cuda-fp16": they are __nv_bfloat16 / __half (working weights made by cast_params, round to
//     nearest even; fp16 overflows to inf). Parameter gradients, norm statistics, losses and
//     optimizer state are fp32 in all three. The launchers are templated on the activation type
//     (`act_t`); 16-bit loads convert to fp32, all arithmetic is fp32 (statistics, softmax, loss,
//     elementwise), stores round once to the 16-bit type. 16-bit matmuls: cuBLAS with 16-bit A/B
//     and fp32 compute; dW into fp32 (beta 1); bias grads are fp32 column sums; the forward with
//     a bias uses cuBLASLt's BIAS epilogue when it loads. Nothing clamps or saturates: an fp16
//     overflow is inf and, like a NaN, flows on into the fp32 gradients (loss scaling needs it).
//   - Row-major, N = B*T rows; linear weights are (OC, IC) (nn.Linear); qkv rows are
//     [H q heads | KV k heads | KV v heads] of hd each, query head h uses kv head h / (H/KV).
//   - Backward ACCUMULATES (+=) into every gradient; a NULL gradient pointer is skipped.
//     rope_bwd rotates dqkv back in place; xent_fwd_bwd overwrites logits with its gradient.
//   - Attention state, fp32 table: the probabilities (B, H, T, T), zero above the diagonal (as
//     the CPU). 16-bit tables: see the two 16-bit attention sections (batched: P in the 16-bit
//     type; flash and cudnn: log-sum-exp and a copy of the output).
//   - Deterministic: no floating-point atomics (except the cudnn attention variant's backward,
//     see its section, and flash3's opt-in fused backward, see fl3_bwd_launch). Column sums (dweight,
//     dbias) go through fixed row chunks and a second pass that adds the chunks in order;
//     embedding backward gives each distinct token to one block that adds its rows in row order
//     (bit-identical to the CPU); sumsq reduces in double over a fixed grid.
//   - Everything is queued on one stream (created by ct_cuda_init); to_host synchronizes.
//     Errors are sticky (see ops_cuda.h): the first failing call is kept for ct_cuda_check.
//
// Layout of this file: runtime state and error handling, device helpers, kernels by op, the
// launchers (the table's functions), the table and the C entry points.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "ct_build_config.h"
#include "kernels/cuda/flash_hopper.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/ops.h"
#if CT_HAVE_CUDNN
#include "kernels/cuda/attention_cudnn.h"
#endif

namespace {

typedef __nv_bfloat16 bf16;
typedef __half f16;

// Attention variants (CT_CUDA_ATTN / ct_cuda_set_variant). fp32 table: batched or perhead;
// bf16 and fp16 tables: batched, flash, flash2 (default), flash2b, cudnn (cuDNN's fused SDPA,
// builds with the cudnn-frontend headers) or auto (per shape, the faster of flash2 and cudnn as
// timed on the shape's first forward; flash2 without cuDNN); all but batched for head dims 64 and
// 128 on compute capability 8.0+, batched otherwise.
enum {
  ATTN_DEFAULT = -1,
  ATTN_BATCHED = 0,
  ATTN_PERHEAD = 1,
  ATTN_FLASH = 2,  // the first flash kernels
  ATTN_FLASH2 = 3, // flash2 kernels (see their section), 4-warp blocks: the 16-bit default
  ATTN_FLASH2B = 4, // the same kernels in 8-warp, 128-row blocks (slower on the H200)
  ATTN_CUDNN = 5,   // cuDNN fused attention (attention_cudnn.cpp)
  ATTN_AUTO = 6,    // flash2, cudnn or flash3 per shape, by measurement (attn_auto_pick)
  ATTN_FLASH3 = 7   // Hopper wgmma forward and backward (flash_hopper.cu); sm_90 only, flash2
                    // elsewhere. Opt-in: passes the GPU checks, slower than cuDNN (see that file).
};
// What ATTN_DEFAULT means for the 16-bit tables: flash2. flash was promoted over batched after it
// beat it on the same inputs (H200, bf16, tests/gpu/test_ops_cuda --perf: GPT-2 B16 T1024 H12
// hd64 forward 185 vs 785 us, backward 610 vs 1148 us); flash2 then beat flash in one run on every
// perf shape (H200, bf16, mean of 2 runs, us: GPT-2 forward 184.7 -> 122.1, backward 606.5 ->
// 495.4; B4 T2048 H16 KV8 hd128 forward 468.1 -> 303.3, backward 1370.8 -> 1007.5; fp16 alike)
// with the same worst errors as flash on every correctness case. The fp16 table runs the same
// kernels with the f16 form of mma.sync.
#define HALF_ATTN_DEFAULT ATTN_FLASH2

// ---------------------------------------------------------------------------------------------
// runtime state and error handling

struct cuda_state {
  int ready, device, num_sms, sync_debug;
  int cc;                  // compute capability, major * 10 + minor (flash needs 80+)
  int attn_variant;        // ATTN_*: CT_CUDA_ATTN or ct_cuda_set_variant("attention", ...)
  int matmul_lt;           // 16-bit matmul_fwd with a bias through cuBLASLt's BIAS epilogue
  int lt_tune;             // a cuBLASLt plan's candidates timed on its first use ("lt"), or the
                           // heuristic's first answer taken untimed ("lt-first")
  // kernel registry switches (kernels/registry.c; 1 = the optimized variant, the default)
  int gelu_epilogue, norm_bwd_fused, add_norm_fused, xent_smem, embed_sorted;
  size_t attn_scratch_cap; // attention backward's dP chunk, bytes (CT_CUDA_ATTN_SCRATCH_MB)
  cudaStream_t stream;
  cublasHandle_t blas;
  cublasComputeType_t compute; // CUBLAS_COMPUTE_32F, or _FAST_TF32 with CT_CUDA_TF32=1
  void *scratch;               // grown on demand; used within one op at a time
  size_t scratch_bytes;
  double *host_result;         // pinned: sumsq's result lands here
  int failed;
  int capturing; // a graph is being recorded: no host synchronization, no profiling events
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
//
// CT_CUDA_PROFILE=1: every op (and each matmul shape) is timed with a pair of CUDA events; the
// totals are printed to stderr at shutdown, largest first. Events measure stream time, so an op
// the host is late to launch also counts the wait: compare the total with the step time.
struct prof_rec {
  char key[64];
  cudaEvent_t a, b;
};
struct prof_stat {
  double ms;
  long calls;
};
struct profiler {
  bool on;
  int depth;
  std::vector<prof_rec> pending;
  std::vector<cudaEvent_t> pool;
  std::map<std::string, prof_stat> stats;
  char detail[48]; // set by an op before it returns (matmul shapes)
  cudaEvent_t take() {
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e;
    cudaEventCreate(&e);
    return e;
  }
  void flush() {
    if (pending.empty()) return;
    cudaEventSynchronize(pending.back().b);
    for (prof_rec &r : pending) {
      float ms = 0;
      cudaEventElapsedTime(&ms, r.a, r.b);
      prof_stat &s = stats[r.key];
      s.ms += ms;
      s.calls++;
      pool.push_back(r.a);
      pool.push_back(r.b);
    }
    pending.clear();
  }
  void report() {
    flush();
    if (stats.empty()) return;
    std::vector<std::pair<double, std::string>> order;
    double total = 0;
    for (auto &kv : stats) {
      order.push_back({kv.second.ms, kv.first});
      total += kv.second.ms;
    }
    std::sort(order.rbegin(), order.rend());
    fprintf(stderr, "cuda op profile (stream time, all calls): total %.1f ms\n", total);
    fprintf(stderr, "  %-44s %8s %10s %6s %10s\n", "op", "calls", "total ms", "%", "avg us");
    for (auto &o : order) {
      const prof_stat &s = stats[o.second];
      fprintf(stderr, "  %-44s %8ld %10.2f %6.2f %10.1f\n", o.second.c_str(), s.calls, s.ms,
              100.0 * s.ms / total, 1e3 * s.ms / s.calls);
    }
    stats.clear();
  }
};
profiler prof;

// CT_STEP_MARKS=1: ops->mark(name) queues an event; at shutdown the mean stream time from each
// mark to the next is printed per (mark, next mark) pair, counted from the 4th "step" mark (the
// first steps include autotuning and lazy loading). Cheap enough to leave the step's speed alone.
struct marker {
  bool on;
  int steps;
  std::vector<std::pair<std::string, cudaEvent_t>> pending; // [0]: the last mark already counted
  std::map<std::string, prof_stat> spans;
  std::vector<std::string> order; // pairs in first-seen order
  void flush() {
    if (pending.size() < 2) return;
    cudaEventSynchronize(pending.back().second);
    for (size_t i = 1; i < pending.size(); i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, pending[i - 1].second, pending[i].second);
      std::string key = pending[i - 1].first + " -> " + pending[i].first;
      if (!spans.count(key)) order.push_back(key);
      prof_stat &s = spans[key];
      s.ms += ms;
      s.calls++;
      cudaEventDestroy(pending[i - 1].second);
    }
    pending.erase(pending.begin(), pending.end() - 1);
  }
  void report() {
    flush();
    if (spans.empty()) return;
    fprintf(stderr, "step marks (stream time, mean over steps 4..):\n");
    for (const std::string &k : order) {
      const prof_stat &s = spans[k];
      fprintf(stderr, "  %-36s %9.3f ms  (%ld)\n", k.c_str(), s.ms / s.calls, s.calls);
    }
  }
};
marker marks;

struct op_scope {
  bool ok, timed, counted;
  const char *name;
  cudaEvent_t a;
  explicit op_scope(const char *name_) : timed(false), counted(false), name(name_) {
    g.op = name;
    ok = g.ready != 0;
    if (!ok)
      record_error("ct_cuda_init", "the CUDA backend is not initialized", __FILE__, __LINE__);
    counted = ok && prof.on && !g.capturing;
    if (counted && prof.depth++ == 0) {
      timed = true;
      prof.detail[0] = 0;
      a = prof.take();
      cudaEventRecord(a, g.stream);
    }
  }
  ~op_scope() {
    if (ok && g.sync_debug && !g.capturing) CK(cudaStreamSynchronize(g.stream));
    if (counted) prof.depth--;
    if (timed) {
      prof_rec r;
      snprintf(r.key, sizeof r.key, "%s%s%s", name, prof.detail[0] ? " " : "", prof.detail);
      r.a = a;
      r.b = prof.take();
      cudaEventRecord(r.b, g.stream);
      prof.pending.push_back(r);
      if (prof.pending.size() >= 4096) prof.flush();
    }
  }
};
#define PROF_DETAIL(...)                                                                          \
  do {                                                                                            \
    if (prof.on) snprintf(prof.detail, sizeof prof.detail, __VA_ARGS__);                          \
  } while (0)
#define OP(name)                                                                                  \
  op_scope op_scope_(name);                                                                       \
  if (!op_scope_.ok) return

// Scratch device memory for one op (column-sum partials, attention dP, sumsq partials). Grows
// by reallocation; the old buffer is freed only after queued work that may read it is done.
void *scratch(size_t bytes) {
  if (bytes <= g.scratch_bytes) return g.scratch;
  if (g.capturing) { // growing would synchronize: the capture fails (the caller runs uncaptured)
    record_error("scratch", "scratch memory would grow while a CUDA graph is being recorded",
                 __FILE__, __LINE__);
    return NULL;
  }
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

template <> __device__ __forceinline__ float ld<bf16>(const bf16 *p) { return __bfloat162float(*p); }
template <> __device__ __forceinline__ void st<bf16>(bf16 *p, float v) {
  *p = __float2bfloat16_rn(v);
}
// fp16: round to nearest even; beyond the largest finite value (65504) it rounds to +-inf, as
// IEEE says (no saturation), so an overflow is visible downstream (loss scaling relies on it).
template <> __device__ __forceinline__ float ld<f16>(const f16 *p) { return __half2float(*p); }
template <> __device__ __forceinline__ void st<f16>(f16 *p, float v) { *p = __float2half_rn(v); }

template <typename T> cudaDataType_t blas_type();
template <> cudaDataType_t blas_type<float>() { return CUDA_R_32F; }
template <> cudaDataType_t blas_type<bf16>() { return CUDA_R_16BF; }
template <> cudaDataType_t blas_type<f16>() { return CUDA_R_16F; }
// fp32 products use g.compute (fp32 or TF32); bf16 and fp16 products always accumulate in fp32.
template <typename T> cublasComputeType_t compute_type() { return g.compute; }
template <> cublasComputeType_t compute_type<bf16>() { return CUBLAS_COMPUTE_32F; }
template <> cublasComputeType_t compute_type<f16>() { return CUBLAS_COMPUTE_32F; }
template <typename T> constexpr bool is16() {
  return std::is_same<T, bf16>::value || std::is_same<T, f16>::value;
}

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

using ct16::pack2; // kernels/cuda/pack16.cuh
// Two 16-bit values at p (4-byte aligned) as floats.
__device__ __forceinline__ float2 unpack2(const bf16 *p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
__device__ __forceinline__ float2 unpack2(const f16 *p) {
  return __half22float2(*reinterpret_cast<const __half2 *>(p));
}

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
// Embedding backward by sorted segments: the rows are sorted by token (stable: rows of a token
// stay in row order), segment s = the rows of one token. Block (s, column tile) sums its segment's
// rows in a fixed order (warp w takes rows w, w + 8, ...; the 8 warp sums are added in warp order)
// and adds the total to dwte[token]: deterministic, and a frequent token (a space in byte-level
// text) is spread over its column tiles and 8 warps instead of one block walking all its rows.
#define ES_WARPS 8
#define ES_COLS 64
__global__ void iota_kernel(int32_t *v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}
__global__ void seg_head_kernel(int32_t *head, const uint32_t *keys, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    head[i] = i == 0 || keys[i] != keys[i - 1];
}
// seg_idx: inclusive sum of the heads (segment of row i = seg_idx[i] - 1)
__global__ void seg_start_kernel(int32_t *start, const int32_t *head, const int32_t *seg_idx, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (head[i]) start[seg_idx[i] - 1] = i;
    if (i == n - 1) start[seg_idx[i]] = n;
  }
}
template <typename T>
__global__ void __launch_bounds__(ES_WARPS * 32)
    embed_bwd_seg_kernel(float *dwte, const T *dout, const uint32_t *keys, const int32_t *rows,
                         const int32_t *start, const int32_t *seg_idx, int N, int C) {
  __shared__ float sh[ES_WARPS][ES_COLS];
  const int s = blockIdx.x;
  if (s >= seg_idx[N - 1]) return; // fewer segments than the grid's upper bound
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c0 = blockIdx.y * ES_COLS + lane * 2;
  const int r0 = start[s], r1 = start[s + 1];
  float a0 = 0.0f, a1 = 0.0f;
  for (int i = r0 + warp; i < r1; i += ES_WARPS) {
    const T *d = dout + (long)rows[i] * C;
    if (c0 < C) a0 += ld(d + c0);
    if (c0 + 1 < C) a1 += ld(d + c0 + 1);
  }
  sh[warp][lane * 2] = a0;
  sh[warp][lane * 2 + 1] = a1;
  __syncthreads();
  if (warp == 0) {
    const uint32_t t = keys[r0];
    for (int k = 0; k < 2; k++) {
      const int c = c0 + k;
      if (c >= C) break;
      float acc = 0.0f;
      for (int w = 0; w < ES_WARPS; w++) acc += sh[w][lane * 2 + k];
      dwte[(long)t * C + c] += acc;
    }
  }
}

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

// Rows of an fp32 table (ops.h: flagged_rows, take_rows, scatter_add_rows), for DDP's sparse
// embedding gradient. flagged_rows is ONE block: each thread counts the flags of its own
// contiguous slice, a block scan gives each slice its first output slot, and each slice writes its
// indices in order, so rows come out ascending, as on the CPU. One pass over n ints (a 50k
// vocabulary: 200 KB), a few microseconds: more blocks would not pay at that size.
#define FR_THREADS 1024
__global__ void __launch_bounds__(FR_THREADS)
    flagged_rows_kernel(int32_t *rows, const int32_t *flags, int n) {
  typedef cub::BlockScan<int, FR_THREADS> Scan;
  __shared__ typename Scan::TempStorage tmp;
  const long per = (n + FR_THREADS - 1) / FR_THREADS, lo0 = threadIdx.x * per;
  const int lo = (int)min((long)n, lo0), hi = (int)min((long)n, lo0 + per);
  int k = 0;
  for (int i = lo; i < hi; i++) k += flags[i] != 0;
  int at;
  Scan(tmp).ExclusiveSum(k, at);
  for (int i = lo; i < hi; i++)
    if (flags[i]) rows[at++] = i;
}

// Element i of the packed (n, C) rows; rows are distinct, so no two threads touch one element.
__global__ void take_rows_kernel(float *dst, float *src, const int32_t *rows, int n, int C) {
  const long total = (long)n * C;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x) {
    const long r = i / C;
    float *s = src + (long)rows[r] * C + (i - r * C);
    dst[i] = *s;
    *s = 0.0f;
  }
}

__global__ void scatter_add_rows_kernel(float *dst, const float *src, const int32_t *rows, int n,
                                        int C) {
  const long total = (long)n * C;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
       i += (long)gridDim.x * blockDim.x) {
    const long r = i / C;
    dst[(long)rows[r] * C + (i - r * C)] += src[i];
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

__device__ __forceinline__ float gelu_f(float x) {
  float u = GELU_K * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
  float u = GELU_K * (x + 0.044715f * x * x * x);
  float th = tanhf(u);
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

template <typename T> __global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    st(out + i, gelu_f(ld(inp + i)));
}

template <typename T>
__global__ void gelu_bwd_kernel(T *dinp, const T *dout, const T *inp, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    st(dinp + i, ld(dinp + i) + gelu_grad(ld(inp + i)) * ld(dout + i));
}

// 16-byte vector forms of the elementwise kernels (same arithmetic per element): nv vectors of
// 16 / sizeof(T) elements; the launcher uses them when n divides and every pointer is aligned.
#define VEC_LOOP(nv)                                                                              \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (nv);                        \
       i += (size_t)gridDim.x * blockDim.x)
template <typename T> __global__ void gelu_fwd_vec_kernel(T *out, const T *inp, size_t nv) {
  constexpr int V = 16 / sizeof(T);
  VEC_LOOP(nv) {
    int4 xr = reinterpret_cast<const int4 *>(inp)[i], yr;
    const T *x = reinterpret_cast<const T *>(&xr);
    T *y = reinterpret_cast<T *>(&yr);
#pragma unroll
    for (int j = 0; j < V; j++) st(y + j, gelu_f(ld(x + j)));
    reinterpret_cast<int4 *>(out)[i] = yr;
  }
}
template <typename T>
__global__ void gelu_bwd_vec_kernel(T *dinp, const T *dout, const T *inp, size_t nv) {
  constexpr int V = 16 / sizeof(T);
  VEC_LOOP(nv) {
    int4 xr = reinterpret_cast<const int4 *>(inp)[i], dr = reinterpret_cast<const int4 *>(dout)[i];
    int4 ar = reinterpret_cast<int4 *>(dinp)[i];
    const T *x = reinterpret_cast<const T *>(&xr), *d = reinterpret_cast<const T *>(&dr);
    T *a = reinterpret_cast<T *>(&ar);
#pragma unroll
    for (int j = 0; j < V; j++) st(a + j, ld(a + j) + gelu_grad(ld(x + j)) * ld(d + j));
    reinterpret_cast<int4 *>(dinp)[i] = ar;
  }
}
template <typename T> __global__ void add_vec_kernel(T *out, const T *a, const T *b, size_t nv) {
  constexpr int V = 16 / sizeof(T);
  VEC_LOOP(nv) {
    int4 ar = reinterpret_cast<const int4 *>(a)[i], br = reinterpret_cast<const int4 *>(b)[i], yr;
    const T *x = reinterpret_cast<const T *>(&ar), *z = reinterpret_cast<const T *>(&br);
    T *y = reinterpret_cast<T *>(&yr);
#pragma unroll
    for (int j = 0; j < V; j++) st(y + j, ld(x + j) + ld(z + j));
    reinterpret_cast<int4 *>(out)[i] = yr;
  }
}

// fp32 <-> bf16 / fp16 (round to nearest even; fp16 overflows to inf); 8 elements per step
// when aligned.
template <typename E> __global__ void cast_f32_16_kernel(E *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    st(dst + i, src[i]);
}
template <typename E> __global__ void cast_f32_16_vec_kernel(E *dst, const float *src, size_t nv) {
  VEC_LOOP(nv) {
    float4 a = reinterpret_cast<const float4 *>(src)[2 * i];
    float4 b = reinterpret_cast<const float4 *>(src)[2 * i + 1];
    reinterpret_cast<int4 *>(dst)[i] =
        make_int4((int)pack2<E>(a.x, a.y), (int)pack2<E>(a.z, a.w), (int)pack2<E>(b.x, b.y),
                  (int)pack2<E>(b.z, b.w));
  }
}
template <typename E> __global__ void cast_16_f32_kernel(float *dst, const E *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = ld(src + i);
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

// One block per segment (a slice of at most a few hundred thousand floats), the adamw_kernel
// arithmetic with the segment's decay factor.
__global__ void adamw_multi_kernel(float *param, const float *grad, float *m, float *v,
                                   size_t mv_base, const ct_adamw_seg *segs, float lr, float b1,
                                   float b2, float a1, float a2, float eps, float step_size,
                                   float inv_bc2_sqrt, float grad_scale) {
  const ct_adamw_seg sg = segs[blockIdx.x];
  const float decay = 1.0f - lr * sg.wd;
  float *p = param + sg.off, *mm = m + (sg.off - mv_base), *vv = v + (sg.off - mv_base);
  const float *g = grad + sg.off;
  for (uint32_t i = threadIdx.x; i < sg.n; i += blockDim.x) {
    float gr = g[i] * grad_scale;
    float mi = b1 * mm[i] + a1 * gr;
    float vi = b2 * vv[i] + a2 * gr * gr;
    mm[i] = mi;
    vv[i] = vi;
    float denom = sqrtf(vi) * inv_bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * mi / denom;
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

// Fused norm backward for widths up to NB_MAX_C (GPT-2 768, Qwen3-0.6B 1024, head dims): one pass
// over dout and inp computes dinp (+=) and, per chunk of rows, the partial dweight (and dbias)
// column sums, which colsum_final_kernel then adds in chunk order (deterministic; the chunking
// depends only on N). A block of NB_WARPS warps takes a contiguous chunk of rows, a warp one row
// at a time; lane l owns the 8-column groups l, l + 32, ... (16-byte loads), so its partial sums
// stay in registers (NG groups). RMS = true: RMSNorm (no mean, no bias), rows possibly grouped.
#define NB_WARPS 8
#define NB_MAX_C 1536

template <typename T> __device__ __forceinline__ void load8(float *f, const T *p) {
  if constexpr (sizeof(T) == 2) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float2 t = unpack2(reinterpret_cast<const T *>(&w[i]));
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  } else {
    float4 a = *reinterpret_cast<const float4 *>(p), b = *reinterpret_cast<const float4 *>(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
}
template <typename T> __device__ __forceinline__ void store8(T *p, const float *f) {
  if constexpr (sizeof(T) == 2) {
    uint4 u;
    u.x = pack2<T>(f[0], f[1]);
    u.y = pack2<T>(f[2], f[3]);
    u.z = pack2<T>(f[4], f[5]);
    u.w = pack2<T>(f[6], f[7]);
    *reinterpret_cast<uint4 *>(p) = u;
  } else {
    *reinterpret_cast<float4 *>(p) = make_float4(f[0], f[1], f[2], f[3]);
    *reinterpret_cast<float4 *>(p + 4) = make_float4(f[4], f[5], f[6], f[7]);
  }
}

template <typename T, int NG, bool RMS>
__global__ void __launch_bounds__(NB_WARPS * 32)
    norm_bwd_fused_kernel(T *dinp, float *part, const T *dout, const T *inp, const T *w,
                          const float *mean, const float *rstd, int N, int C, long rpc, int rpg,
                          long gs) {
  extern __shared__ float nb_sh[]; // (NB_WARPS, C) partials of one kind at a time
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long r0 = (long)blockIdx.x * rpc, r1 = r0 + rpc < N ? r0 + rpc : N;
  float wv[NG][8], adw[NG][8], adb[NG][8];
#pragma unroll
  for (int j = 0; j < NG; j++) {
    const int c = (lane + 32 * j) * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) adw[j][i] = adb[j][i] = wv[j][i] = 0.0f;
    if (c < C) load8(wv[j], w + c);
  }
  for (long r = r0 + warp; r < r1; r += NB_WARPS) {
    const long off = RMS ? rms_row(r, C, rpg, gs) : r * (long)C;
    const float m = RMS ? 0.0f : mean[r], rs = rstd[r];
    float dy[NG][8], nrm[NG][8];
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int j = 0; j < NG; j++) {
      const int c = (lane + 32 * j) * 8;
      if (c < C) {
        load8(dy[j], dout + off + c);
        load8(nrm[j], inp + off + c);
#pragma unroll
        for (int i = 0; i < 8; i++) {
          nrm[j][i] = (nrm[j][i] - m) * rs;
          const float gr = dy[j][i] * wv[j][i];
          sg += gr;
          sgx += gr * nrm[j][i];
          adw[j][i] += dy[j][i] * nrm[j][i];
          adb[j][i] += dy[j][i];
        }
      }
    }
    if (!dinp) continue;
    const float mg = RMS ? 0.0f : warp_sum(sg) / C, mgx = warp_sum(sgx) / C;
#pragma unroll
    for (int j = 0; j < NG; j++) {
      const int c = (lane + 32 * j) * 8;
      if (c < C) {
        float dx[8];
        load8(dx, dinp + off + c);
#pragma unroll
        for (int i = 0; i < 8; i++) dx[i] += (dy[j][i] * wv[j][i] - mg - nrm[j][i] * mgx) * rs;
        store8(dinp + off + c, dx);
      }
    }
  }
  // partial column sums of this chunk, warps added in order: dw, then db (layernorm)
  for (int kind = 0; kind < (RMS ? 1 : 2); kind++) {
#pragma unroll
    for (int j = 0; j < NG; j++) {
      const int c = (lane + 32 * j) * 8;
      if (c < C)
#pragma unroll
        for (int i = 0; i < 8; i++) nb_sh[warp * C + c + i] = kind ? adb[j][i] : adw[j][i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += NB_WARPS * 32) {
      float s = 0.0f;
      for (int k = 0; k < NB_WARPS; k++) s += nb_sh[k * C + c];
      part[((long)kind * gridDim.x + blockIdx.x) * C + c] = s;
    }
    __syncthreads();
  }
}

// res = a + b, out = norm(res): one warp per row, lane l holds the 8-column groups l, l + 32, ...
// in registers (NG of them), so res is written once and never read back.
template <typename T, int NG, bool RMS>
__global__ void __launch_bounds__(NB_WARPS * 32)
    add_norm_fwd_kernel(T *res, T *out, float *mean, float *rstd, const T *a, const T *b,
                        const T *w, const T *bias, int N, int C, float eps) {
  const long row = (long)blockIdx.x * NB_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const long off = row * C;
  float x[NG][8];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NG; j++) {
    const int c = (lane + 32 * j) * 8;
    if (c < C) {
      float y[8];
      load8(x[j], a + off + c);
      load8(y, b + off + c);
#pragma unroll
      for (int i = 0; i < 8; i++) x[j][i] += y[i];
      store8(res + off + c, x[j]);
      // normalize what was stored (rounded to T), as the unfused add-then-norm does
      load8(x[j], res + off + c);
#pragma unroll
      for (int i = 0; i < 8; i++) s += RMS ? x[j][i] * x[j][i] : x[j][i];
    }
  }
  s = warp_sum(s);
  float m = 0.0f, r;
  if (RMS) {
    r = 1.0f / sqrtf(s / C + eps);
  } else {
    m = s / C;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < NG; j++)
      if ((lane + 32 * j) * 8 < C)
#pragma unroll
        for (int i = 0; i < 8; i++) v += (x[j][i] - m) * (x[j][i] - m);
    r = 1.0f / sqrtf(warp_sum(v) / C + eps);
  }
#pragma unroll
  for (int j = 0; j < NG; j++) {
    const int c = (lane + 32 * j) * 8;
    if (c < C) {
      float wv[8], o[8], bv[8];
      load8(wv, w + c);
      if (!RMS && bias) load8(bv, bias + c);
#pragma unroll
      for (int i = 0; i < 8; i++) {
        o[i] = (x[j][i] - m) * r * wv[i];
        if (!RMS && bias) o[i] += bv[i];
      }
      store8(out + off + c, o);
    }
  }
  if (lane == 0) {
    if (!RMS && mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
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

// Non-finite logits (an fp16 overflow upstream) are not hidden: a NaN keeps s NaN through the
// merges (a part with m = -inf has s = 0, or NaN if it saw one), a +inf makes the loss and the
// row's gradient non-finite; a -inf logit adds exp(-inf) = 0 like any very negative one.
__device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2) {
  if (m2 == -INFINITY) {
    s += s2; // 0, or NaN
    return;
  }
  if (m == -INFINITY) {
    m = m2;
    s = s2 + s; // s2, or NaN
    return;
  }
  float M = fmaxf(m, m2);
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

// The row fits in shared memory (Vp * sizeof(T) <= XS_MAX_BYTES, e.g. GPT-2's 50304 bf16 =
// 98 KiB): one 16-byte-vectorized read of the logits row into shared memory, the maximum and the
// sum of exponentials from there, then the gradient written once. Same results as xent_kernel up
// to the order of the sum (and exp2 in place of exp).
#define XS_THREADS 1024
#define XS_MAX_BYTES (110 * 1024)
template <typename T>
__global__ void __launch_bounds__(XS_THREADS, 2)
    xent_smem_kernel(float *losses, T *logits, const int32_t *targets, int V, int Vp,
                     float grad_scale) {
  extern __shared__ __align__(16) unsigned char xs_raw[];
  T *row = reinterpret_cast<T *>(xs_raw);
  __shared__ float red[XS_THREADS / 32];
  const long n = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  T *x = logits + n * Vp;
  const int tgt = targets[n];
  if (tgt < 0 || tgt >= V) {
    if (tid == 0) losses[n] = tgt < 0 ? 0.0f : NAN;
    if (grad_scale != 0.0f)
      for (int i = tid; i < Vp; i += blockDim.x) st(x + i, 0.0f);
    return;
  }
  const int per = 16 / (int)sizeof(T), nv = Vp / per; // Vp % per == 0 (checked by the launcher)
  float m = -INFINITY;
  for (int k = tid; k < nv; k += XS_THREADS) {
    uint4 u = reinterpret_cast<const uint4 *>(x)[k];
    reinterpret_cast<uint4 *>(row)[k] = u;
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int i = 0; i < per; i++)
      if (k * per + i < V) m = fmaxf(m, ld(e + i)); // fmaxf drops NaN: caught by the sum below
  }
  m = warp_max(m);
  if (lane == 0) red[w] = m;
  __syncthreads();
  m = red[0];
  for (int i = 1; i < XS_THREADS / 32; i++) m = fmaxf(m, red[i]);
  __syncthreads();
  const float L2E = 1.4426950408889634f;
  const float mb = m * L2E;
  float s = 0.0f;
  for (int i = tid; i < V; i += XS_THREADS) s += exp2f(fmaf(ld(row + i), L2E, -mb));
  s = warp_sum(s);
  if (lane == 0) red[w] = s;
  __syncthreads();
  s = 0.0f;
  for (int i = 0; i < XS_THREADS / 32; i++) s += red[i];
  const float xt = ld(row + tgt);
  if (tid == 0) losses[n] = logf(s) - (xt - m);
  if (grad_scale == 0.0f) return;
  const float k = grad_scale / s;
  for (int kv = tid; kv < nv; kv += XS_THREADS) {
    float f[16 / sizeof(T)];
    const T *e = row + kv * per;
#pragma unroll
    for (int i = 0; i < per; i++) {
      const int c = kv * per + i;
      float v = 0.0f;
      if (c < V) {
        v = __fmul_rn(exp2f(fmaf(ld(e + i), L2E, -mb)), k);
        if (c == tgt) v -= grad_scale;
      }
      f[i] = v;
    }
    if constexpr (sizeof(T) == 2) store8(x + kv * per, f);
    else reinterpret_cast<float4 *>(x)[kv] = make_float4(f[0], f[1], f[2], f[3]);
  }
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
    } else if (v != -INFINITY) { // -inf - -inf would be NaN; a NaN v lands here and sticks
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
  // |gradient| <= grad_scale: p * grad_scale in [0, grad_scale], minus grad_scale at the target.
  // The trainer passes loss_scale / (B*T), 2^16 / 1024 = 64 at the initial fp16 scale: far below
  // fp16's 65504, and p * 64 keeps probabilities down to ~1e-6 (fp16 subnormals 6e-8) nonzero.
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

// C = alpha op(A) op(B) + beta C, batched with strides when batch > 1. A and B are T, C is TC
// (16-bit A/B with an fp32 C: parameter gradients, attention scores); fp32 accumulation for both.
template <typename T, typename TC = T>
bool gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
          const T *A, int lda, long long sA, const T *B, int ldb, long long sB, float beta, TC *C,
          int ldc, long long sC, int batch) {
  const cudaDataType_t dt = blas_type<T>(), ct = blas_type<TC>();
  const cublasComputeType_t cp = compute_type<T>();
  if (batch == 1)
    return CKB(cublasGemmEx(g.blas, ta, tb, m, n, k, &alpha, A, dt, lda, B, dt, ldb, &beta, C, ct,
                            ldc, cp, CUBLAS_GEMM_DEFAULT));
  return CKB(cublasGemmStridedBatchedEx(g.blas, ta, tb, m, n, k, &alpha, A, dt, lda, sA, B, dt,
                                        ldb, sB, &beta, C, ct, ldc, sC, batch, cp,
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
                                  int nper, ptr_desc da, ptr_desc db, ptr_desc dc, int esize,
                                  int esize_c) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const long o = i / nper, r = i % nper;
  a[i] = da.base + (o * da.sb + (r / da.div) * da.s1 + (r % da.div) * da.s2) * esize;
  b[i] = db.base + (o * db.sb + (r / db.div) * db.s1 + (r % db.div) * db.s2) * esize;
  c[i] = dc.base + (o * dc.sb + (r / dc.div) * dc.s1 + (r % dc.div) * dc.s2) * esize_c;
}
ptr_desc pd(const void *base, long sb, long s1, int div = 1, long s2 = 0) {
  ptr_desc d = {(const char *)base, sb, s1, s2, div};
  return d;
}

// C_i = alpha op(A_i) op(B_i) + beta C_i for `count` (A, B, C) triples described by the
// descriptors; `ptrs` is device room for 3*count pointers. The C_i must be distinct. A and B
// are T, C is TC (as gemm).
template <typename T, typename TC = T>
bool gemm_batched(void **ptrs, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  float alpha, ptr_desc A, int lda, ptr_desc B, int ldb, float beta, ptr_desc C,
                  int ldc, int count, int nper) {
  const void **pa = (const void **)ptrs, **pb = pa + count, **pc = pb + count;
  build_ptrs_kernel<<<(count + 127) / 128, 128, 0, g.stream>>>(pa, pb, pc, count, nper, A, B, C,
                                                               (int)sizeof(T), (int)sizeof(TC));
  if (!CK_LAUNCH(build_ptrs_kernel)) return false;
  const cudaDataType_t dt = blas_type<T>(), ct = blas_type<TC>();
  return CKB(cublasGemmBatchedEx(g.blas, ta, tb, m, n, k, &alpha, pa, dt, lda, pb, dt, ldb, &beta,
                                 (void *const *)pc, ct, ldc, count, compute_type<T>(),
                                 CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt, loaded at run time (the build links cuBLAS only): the bf16 / fp16 matmul_fwd with a
// bias goes through its BIAS epilogue, one pass, instead of a bias broadcast and a beta = 1 gemm
// (A, B, C, D and the bias in the table's 16-bit type, compute and scale type fp32; the bias is
// added in fp32 before the one rounding, and an fp16 overflow is inf as on the plain path).
// Anything missing (library, symbol, heuristic) falls back to that plain path.

#define LT_PLANS 64
#define LT_WORKSPACE (32u << 20)
#define LT_CANDIDATES 8
// What a plan computes (column-major, as cuBLASLt sees the row-major buffers):
//   LT_BIAS, LT_GELU: D (OC, N) = op_T(w) inp + bias; LT_GELU also writes the pre-activation to
//                     the aux buffer (OC, N) and gelu (tanh form) of it to D
//   LT_DGELU:         D (IC, N) = (w dout) * gelu'(aux), aux (IC, N) the saved pre-activation
enum lt_kind { LT_BIAS = 0, LT_GELU = 1, LT_DGELU = 2 };
struct lt_plan {
  int kind, N, IC, OC, align; // the key, with dt
  cudaDataType_t dt;    // CUDA_R_16BF or CUDA_R_16F
  int ok;               // a heuristic answered: use it
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo; // the one used: the heuristic's first until tuned
  int ncand, tuned;
  cublasLtMatmulAlgo_t cand[LT_CANDIDATES]; // the heuristic's top answers, timed on first use
};
struct lt_api {
  int tried, ok;
  void *lib;
  cublasLtHandle_t h;
  void *ws;
  int nplans;
  lt_plan plans[LT_PLANS];
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};
lt_api lt;

bool lt_load() {
  if (lt.tried) return lt.ok;
  lt.tried = 1;
  char name[64];
  snprintf(name, sizeof name, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
  lt.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lt.lib) lt.lib = dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
  if (!lt.lib) return false;
#define LT_SYM(field, sym)                                                                        \
  if (!(*(void **)&lt.field = dlsym(lt.lib, #sym))) return false
  LT_SYM(create, cublasLtCreate);
  LT_SYM(destroy, cublasLtDestroy);
  LT_SYM(desc_create, cublasLtMatmulDescCreate);
  LT_SYM(desc_destroy, cublasLtMatmulDescDestroy);
  LT_SYM(desc_set, cublasLtMatmulDescSetAttribute);
  LT_SYM(layout_create, cublasLtMatrixLayoutCreate);
  LT_SYM(layout_destroy, cublasLtMatrixLayoutDestroy);
  LT_SYM(pref_create, cublasLtMatmulPreferenceCreate);
  LT_SYM(pref_destroy, cublasLtMatmulPreferenceDestroy);
  LT_SYM(pref_set, cublasLtMatmulPreferenceSetAttribute);
  LT_SYM(heuristic, cublasLtMatmulAlgoGetHeuristic);
  LT_SYM(matmul, cublasLtMatmul);
#undef LT_SYM
  if (lt.create(&lt.h) != CUBLAS_STATUS_SUCCESS) {
    lt.h = NULL;
    return false;
  }
  if (cudaMalloc(&lt.ws, LT_WORKSPACE) != cudaSuccess) {
    cudaGetLastError();
    lt.ws = NULL;
    return false;
  }
  lt.ok = 1;
  return true;
}

void lt_release() {
  for (int i = 0; i < lt.nplans; i++) {
    lt_plan *p = &lt.plans[i];
    if (p->a) lt.layout_destroy(p->a);
    if (p->b) lt.layout_destroy(p->b);
    if (p->c) lt.layout_destroy(p->c);
    if (p->desc) lt.desc_destroy(p->desc);
  }
  if (lt.h) lt.destroy(lt.h);
  if (lt.ws) cudaFree(lt.ws);
  if (lt.lib) dlclose(lt.lib);
  memset(&lt, 0, sizeof lt);
}

int align_of(const void *p) {
  int a = 256;
  while (a > 1 && ((uintptr_t)p % (uintptr_t)a)) a >>= 1;
  return a;
}

// The plan for out(N,OC) = inp(N,IC) w(OC,IC)^T + bias: column-major D (OC, N) = op_T(w) (OC, IC)
// times inp (IC, N), the bias (OC) added to every column. NULL or !ok: use the plain path.
lt_plan *lt_get_plan(int kind, int N, int IC, int OC, int align, cudaDataType_t dt) {
  for (int i = 0; i < lt.nplans; i++) {
    lt_plan *p = &lt.plans[i];
    if (p->kind == kind && p->N == N && p->IC == IC && p->OC == OC && p->align == align &&
        p->dt == dt)
      return p;
  }
  if (lt.nplans == LT_PLANS) return NULL;
  lt_plan *p = &lt.plans[lt.nplans++];
  memset(p, 0, sizeof *p);
  p->kind = kind, p->N = N, p->IC = IC, p->OC = OC, p->align = align, p->dt = dt;
  const cublasOperation_t opA = kind == LT_DGELU ? CUBLAS_OP_N : CUBLAS_OP_T, opN = CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = kind == LT_BIAS   ? CUBLASLT_EPILOGUE_BIAS
                                 : kind == LT_GELU ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                   : CUBLASLT_EPILOGUE_DGELU;
  const cudaDataType_t bias_type = dt;
  const int64_t aux_ld = kind == LT_DGELU ? IC : OC;
  if (lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
    p->desc = NULL;
    return p;
  }
  if (lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA) ||
      lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN) ||
      lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
      (kind != LT_DGELU &&
       lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type)) ||
      (kind != LT_BIAS &&
       lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld)))
    return p;
  // CT_CUDA_GEMM_SMS=N (measuring): GEMMs aim at N multiprocessors, leaving the rest to the
  // collectives that overlap backward (bench/ddp_probe.sh ENVS)
  static const int gemm_sms = getenv("CT_CUDA_GEMM_SMS") ? atoi(getenv("CT_CUDA_GEMM_SMS")) : 0;
  if (gemm_sms > 0 &&
      lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &gemm_sms, sizeof gemm_sms))
    return p;
  if (kind == LT_DGELU) { // D (IC, N) = w (IC, OC; ld IC) dout (OC, N)
    if (lt.layout_create(&p->a, dt, IC, OC, IC) || lt.layout_create(&p->b, dt, OC, N, OC) ||
        lt.layout_create(&p->c, dt, IC, N, IC))
      return p;
  } else if (lt.layout_create(&p->a, dt, IC, OC, IC) || lt.layout_create(&p->b, dt, IC, N, IC) ||
             lt.layout_create(&p->c, dt, OC, N, OC)) {
    return p;
  }
  cublasLtMatmulPreference_t pref = NULL;
  if (lt.pref_create(&pref) != CUBLAS_STATUS_SUCCESS) return p;
  const size_t ws = LT_WORKSPACE;
  const uint32_t al = (uint32_t)align;
  int nres = 0;
  cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
  memset(res, 0, sizeof res);
  if (!lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) &&
      !lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al) &&
      !lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al) &&
      !lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al) &&
      !lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al) &&
      lt.heuristic(lt.h, p->desc, p->a, p->b, p->c, p->c, pref, LT_CANDIDATES, res, &nres) ==
          CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < nres; i++)
      if (res[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->ncand++] = res[i].algo;
    if (p->ncand) {
      p->algo = p->cand[0];
      p->ok = 1;
    }
  }
  lt.pref_destroy(pref);
  return p;
}

// Runs plan p: D = epilogue(op(A) B). The heuristic's order is a guess that can be far off (GPT-2's
// qkv projection at N=65536: 1.4 ms with its first answer in training against 0.36 ms for
// another), so the first call of a plan outside graph recording times each candidate (one
// warm-up, then the best of 3, CUDA events; the output is overwritten by every run, beta = 0)
// and keeps the fastest. Returns false only on a recorded error.
bool lt_exec(lt_plan *p, const void *A, const void *B, void *D) {
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t *algo) {
    return lt.matmul(lt.h, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c, algo, lt.ws,
                     LT_WORKSPACE, g.stream);
  };
  if (!p->tuned && g.lt_tune && !g.capturing && p->ncand > 1) {
    p->tuned = 1;
    cudaEvent_t e0, e1;
    if (CK(cudaEventCreate(&e0)) && CK(cudaEventCreate(&e1))) {
      float best = INFINITY;
      for (int i = 0; i < p->ncand; i++) {
        if (run(&p->cand[i]) != CUBLAS_STATUS_SUCCESS) continue; // this algo cannot run it
        float t_min = INFINITY;
        for (int k = 0; k < 3; k++) {
          float ms = 0;
          cudaEventRecord(e0, g.stream);
          run(&p->cand[i]);
          cudaEventRecord(e1, g.stream);
          cudaEventSynchronize(e1);
          cudaEventElapsedTime(&ms, e0, e1);
          if (ms < t_min) t_min = ms;
        }
        if (t_min < best) {
          best = t_min;
          p->algo = p->cand[i];
        }
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
  }
  return CKB(run(&p->algo));
}

// Returns false when the plain path must do it (nothing queued); true when queued or failed
// (the failure recorded).
template <typename E>
bool lt_matmul_bias(E *out, const E *inp, const E *w, const E *bias, int N, int IC, int OC) {
  if (IC % 8 || OC % 8 || !aligned16(bias) || !lt_load()) return false;
  int al = align_of(out);
  if (align_of(inp) < al) al = align_of(inp);
  if (align_of(w) < al) al = align_of(w);
  if (al < 16) return false;
  lt_plan *p = lt_get_plan(LT_BIAS, N, IC, OC, al, blas_type<E>());
  if (!p || !p->ok) return false;
  const void *bp = bias;
  if (!CKB(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp))) return true;
  lt_exec(p, w, inp, out);
  return true;
}

// act = gelu(pre), pre = inp w^T + bias, in one GEMM (GELU_AUX_BIAS epilogue). false: nothing
// queued (no cuBLASLt, no plan, or misaligned operands).
template <typename E>
bool lt_matmul_gelu(E *act, E *pre, const E *inp, const E *w, const E *bias, int N, int IC,
                    int OC) {
  if (IC % 8 || OC % 8 || !bias || !aligned16(bias) || !lt_load()) return false;
  int al = align_of(act);
  if (align_of(pre) < al) al = align_of(pre);
  if (align_of(inp) < al) al = align_of(inp);
  if (align_of(w) < al) al = align_of(w);
  if (al < 16) return false;
  lt_plan *p = lt_get_plan(LT_GELU, N, IC, OC, al, blas_type<E>());
  if (!p || !p->ok) return false;
  const void *bp = bias, *ap = pre;
  if (!CKB(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp)) ||
      !CKB(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof ap)))
    return true;
  lt_exec(p, w, inp, act);
  return true;
}

// dpre (N, IC) = (dout (N, OC) w (OC, IC)) * gelu'(pre), overwritten (DGELU epilogue).
template <typename E>
bool lt_matmul_dgelu(E *dpre, const E *dout, const E *w, const E *pre, int N, int IC, int OC) {
  if (IC % 8 || OC % 8 || !lt_load()) return false;
  int al = align_of(dpre);
  if (align_of(pre) < al) al = align_of(pre);
  if (align_of(dout) < al) al = align_of(dout);
  if (align_of(w) < al) al = align_of(w);
  if (al < 16) return false;
  lt_plan *p = lt_get_plan(LT_DGELU, N, IC, OC, al, blas_type<E>());
  if (!p || !p->ok) return false;
  const void *ap = pre;
  if (!CKB(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof ap)))
    return true;
  lt_exec(p, w, dout, dpre);
  return true;
}

// ---------------------------------------------------------------------------------------------
// launchers: the table's functions

// Largest device memory in use (cudaMemGetInfo: total - free, context included) seen so far.
static size_t mem_peak_bytes;
static void mem_sample() {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > mem_peak_bytes) mem_peak_bytes = tot - fr;
  else cudaGetLastError();
}
size_t cu_mem_peak(void) {
  if (g.ready) mem_sample();
  return mem_peak_bytes;
}

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
  mem_sample();
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

template <typename act_t>
void cu_embed_fwd(void *out, const int32_t *tok, const void *wte, const void *wpe, int B, int T,
                  int C) {
  OP("embed_fwd");
  long N = (long)B * T;
  if (N <= 0 || C <= 0) return;
  embed_fwd_kernel<act_t><<<grid_for((size_t)N * C, 256), 256, 0, g.stream>>>(
      (act_t *)out, tok, (const act_t *)wte, (const act_t *)wpe, N, T, C);
  CK_LAUNCH(embed_fwd_kernel);
}

// dwte by sorted segments (embed_bwd_seg_kernel). false: nothing queued (scratch or sort
// failure is recorded and also returns true).
template <typename act_t>
bool embed_bwd_sorted(float *dwte, const act_t *dout, const int32_t *tok, int N, int C) {
  size_t sort_bytes = 0, scan_bytes = 0;
  if (cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                      (const int32_t *)NULL, (int32_t *)NULL, N) != cudaSuccess ||
      cub::DeviceScan::InclusiveSum(NULL, scan_bytes, (const int32_t *)NULL, (int32_t *)NULL, N) !=
          cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const size_t a = ((size_t)N + 1 + 63) / 64 * 64 * sizeof(int32_t);
  const size_t tmp = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
  char *base = (char *)scratch(6 * a + tmp + 256);
  if (!base) return true;
  uint32_t *keys = (uint32_t *)base;
  int32_t *vin = (int32_t *)(base + a), *rows = (int32_t *)(base + 2 * a);
  int32_t *head = (int32_t *)(base + 3 * a), *seg_idx = (int32_t *)(base + 4 * a);
  int32_t *start = (int32_t *)(base + 5 * a);
  void *temp = base + 6 * a;
  const unsigned grid = grid_for((size_t)N, 256);
  iota_kernel<<<grid, 256, 0, g.stream>>>(vin, N);
  if (!CK_LAUNCH(iota_kernel)) return true;
  size_t tb = tmp;
  if (!CK(cub::DeviceRadixSort::SortPairs(temp, tb, (const uint32_t *)tok, keys, vin, rows, N, 0,
                                          32, g.stream)))
    return true;
  seg_head_kernel<<<grid, 256, 0, g.stream>>>(head, keys, N);
  if (!CK_LAUNCH(seg_head_kernel)) return true;
  tb = tmp;
  if (!CK(cub::DeviceScan::InclusiveSum(temp, tb, head, seg_idx, N, g.stream))) return true;
  seg_start_kernel<<<grid, 256, 0, g.stream>>>(start, head, seg_idx, N);
  if (!CK_LAUNCH(seg_start_kernel)) return true;
  const dim3 sgrid((unsigned)N, (unsigned)((C + ES_COLS - 1) / ES_COLS));
  embed_bwd_seg_kernel<act_t><<<sgrid, ES_WARPS * 32, 0, g.stream>>>(dwte, dout, keys, rows, start,
                                                                      seg_idx, N, C);
  CK_LAUNCH(embed_bwd_seg_kernel);
  return true;
}

template <typename act_t>
void cu_embed_bwd(float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B, int T,
                  int C) {
  OP("embed_bwd");
  long N = (long)B * T;
  if (N <= 0 || C <= 0) return;
  if (dwte && !(g.embed_sorted && embed_bwd_sorted<act_t>(dwte, (const act_t *)dout, tok, (int)N, C))) {
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

void cu_flagged_rows(int32_t *rows, const int32_t *flags, int n) {
  OP("flagged_rows");
  if (n <= 0) return;
  flagged_rows_kernel<<<1, FR_THREADS, 0, g.stream>>>(rows, flags, n);
  CK_LAUNCH(flagged_rows_kernel);
}

void cu_take_rows(float *dst, float *src, const int32_t *rows, int n, int C) {
  OP("take_rows");
  if (n <= 0 || C <= 0) return;
  take_rows_kernel<<<grid_for((size_t)n * C, 256), 256, 0, g.stream>>>(dst, src, rows, n, C);
  CK_LAUNCH(take_rows_kernel);
}

void cu_scatter_add_rows(float *dst, const float *src, const int32_t *rows, int n, int C) {
  OP("scatter_add_rows");
  if (n <= 0 || C <= 0) return;
  scatter_add_rows_kernel<<<grid_for((size_t)n * C, 256), 256, 0, g.stream>>>(dst, src, rows, n, C);
  CK_LAUNCH(scatter_add_rows_kernel);
}

// The fused norm backward (see norm_bwd_fused_kernel) when the width allows it and the rows are
// 16-byte aligned; false: nothing queued, use the two-kernel path.
template <typename act_t, bool RMS>
bool norm_bwd_fused(act_t *dinp, float *dw, float *db, const act_t *dout, const act_t *inp,
                    const act_t *w, const float *mean, const float *rstd, int N, int C, int rpg,
                    long gs) {
  if (C % 8 || C > NB_MAX_C || !dw || (!RMS && !db) || (gs * (long)sizeof(act_t)) % 16 ||
      !aligned16(dout) || !aligned16(inp) || !aligned16(w) || (dinp && !aligned16(dinp)))
    return false;
  long nchunks = (N + 63) / 64;
  if (nchunks > 1024) nchunks = 1024;
  const long rpc = (N + nchunks - 1) / nchunks;
  nchunks = (N + rpc - 1) / rpc;
  float *part = (float *)scratch(sizeof(float) * (size_t)nchunks * C * (RMS ? 1 : 2));
  if (!part) return true;
  const size_t sh = sizeof(float) * NB_WARPS * (size_t)C;
  const int ng = (C / 8 + 31) / 32;
#define NB_CASE(NG)                                                                                \
  case NG: {                                                                                       \
    auto k = norm_bwd_fused_kernel<act_t, NG, RMS>;                                                \
    if (sh > 48 * 1024 && !CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                                   (int)sh)))                                      \
      return true;                                                                                 \
    k<<<(unsigned)nchunks, NB_WARPS * 32, sh, g.stream>>>(dinp, part, dout, inp, w, mean, rstd, N, \
                                                           C, rpc, rpg, gs);                       \
    break;                                                                                         \
  }
  switch (ng) {
    NB_CASE(1)
    NB_CASE(2)
    NB_CASE(3)
    NB_CASE(4)
    NB_CASE(5)
    NB_CASE(6)
    default: return false;
  }
#undef NB_CASE
  if (!CK_LAUNCH(norm_bwd_fused_kernel)) return true;
  colsum_final_kernel<<<(unsigned)((C + 255) / 256), 256, 0, g.stream>>>(dw, RMS ? NULL : db, part,
                                                                         (int)nchunks, C);
  CK_LAUNCH(colsum_final_kernel);
  return true;
}

template <typename act_t>
void cu_layernorm_fwd(void *out, float *mean, float *rstd, const void *inp, const void *w,
                      const void *b, int N, int C, float eps) {
  OP("layernorm_fwd");
  if (N <= 0 || C <= 0) return;
  layernorm_fwd_kernel<act_t><<<(N + NORM_WARPS - 1) / NORM_WARPS, NORM_WARPS * 32, 0, g.stream>>>(
      (act_t *)out, mean, rstd, (const act_t *)inp, (const act_t *)w, (const act_t *)b, N, C, eps);
  CK_LAUNCH(layernorm_fwd_kernel);
}

template <typename act_t>
void cu_layernorm_bwd(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                      const void *w, const float *mean, const float *rstd, int N, int C) {
  OP("layernorm_bwd");
  if (N <= 0 || C <= 0) return;
  if (g.norm_bwd_fused && norm_bwd_fused<act_t, false>((act_t *)dinp, dw, db, (const act_t *)dout, (const act_t *)inp,
                                   (const act_t *)w, mean, rstd, N, C, N, (long)N * C))
    return;
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

template <typename act_t>
void cu_rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *w, int N, int C, int rpg,
                    long gs, float eps) {
  OP("rmsnorm_fwd");
  if (N <= 0 || C <= 0) return;
  if (rpg <= 0) rpg = N;
  rmsnorm_fwd_kernel<act_t><<<(N + NORM_WARPS - 1) / NORM_WARPS, NORM_WARPS * 32, 0, g.stream>>>(
      (act_t *)out, rstd, (const act_t *)inp, (const act_t *)w, N, C, rpg, gs, eps);
  CK_LAUNCH(rmsnorm_fwd_kernel);
}

template <typename act_t>
void cu_rmsnorm_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                    const float *rstd, int N, int C, int rpg, long gs) {
  OP("rmsnorm_bwd");
  if (N <= 0 || C <= 0) return;
  if (rpg <= 0) rpg = N;
  if (g.norm_bwd_fused && norm_bwd_fused<act_t, true>((act_t *)dinp, dw, NULL, (const act_t *)dout, (const act_t *)inp,
                                  (const act_t *)w, NULL, rstd, N, C, rpg, gs))
    return;
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
template <typename act_t>
void cu_matmul_fwd(void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                   int OC) {
  OP("matmul_fwd");
  if (N <= 0 || OC <= 0) return;
  PROF_DETAIL("%dx%dx%d%s", N, IC, OC, bias ? "+b" : "");
  if constexpr (is16<act_t>()) {
    if (bias && g.matmul_lt &&
        lt_matmul_bias<act_t>((act_t *)out, (const act_t *)inp, (const act_t *)w,
                              (const act_t *)bias, N, IC, OC))
      return;
  }
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
template <typename act_t>
void cu_matmul_bwd(void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                   const void *w, int N, int IC, int OC) {
  OP("matmul_bwd");
  if (N <= 0) return;
  PROF_DETAIL("%dx%dx%d%s%s", N, IC, OC, dinp ? " dx" : "", dbias ? " db" : "");
  const act_t *dO = (const act_t *)dout;
  if (dinp && !gemm<act_t>(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, (const act_t *)w, IC, 0, dO,
                           OC, 0, 1.0f, (act_t *)dinp, IC, 0, 1))
    return;
  // dw is fp32 like every parameter gradient (16-bit A/B, fp32 C for the bf16 / fp16 tables):
  // an inf or NaN in dout or inp reaches it as it is (nothing is clamped).
  if (dw && !gemm<act_t, float>(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, (const act_t *)inp, IC,
                                0, dO, OC, 0, 1.0f, dw, IC, 0, 1))
    return;
  if (dbias) {
    colsum_plain<act_t> f = {dO, OC};
    colsum<1>(dbias, NULL, N, OC, f);
  }
}

template <typename act_t>
void rope_launch(void *qkv, int B, int T, int H, int KV, int hd, int pos0, float theta, float dir) {
  long N = (long)B * T;
  size_t total = (size_t)N * (H + KV) * (hd / 2);
  if (!total) return;
  rope_kernel<act_t><<<grid_for(total, 256), 256, 0, g.stream>>>((act_t *)qkv, N, T, H, KV, hd,
                                                                 pos0, theta, dir);
  CK_LAUNCH(rope_kernel);
}
template <typename act_t>
void cu_rope_fwd(void *qkv, int B, int T, int H, int KV, int hd, int pos0, float theta) {
  OP("rope_fwd");
  rope_launch<act_t>(qkv, B, T, H, KV, hd, pos0, theta, 1.0f);
}
template <typename act_t>
void cu_rope_bwd(void *dqkv, int B, int T, int H, int KV, int hd, int pos0, float theta) {
  OP("rope_bwd");
  rope_launch<act_t>(dqkv, B, T, H, KV, hd, pos0, theta, -1.0f);
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
  const float *qkv = (const float *)qkv_;
  float *o = (float *)out;
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  for (int h = 0; h < H; h++) {
    const float *q = qkv + (long)h * hd, *k = qkv + HD + (long)(h / grp) * hd;
    if (!gemm<float>(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, k, (int)W3, T * W3, q, (int)W3,
                     T * W3, 0.0f, state + h * TT, T, H * TT, B))
      return;
  }
  long rows = (long)B * H * T;
  softmax_causal_kernel<<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32, 0,
                          g.stream>>>(state, rows, T);
  if (!CK_LAUNCH(softmax_causal_kernel)) return;
  for (int h = 0; h < H; h++) {
    const float *v = qkv + HD + (long)(KV + h / grp) * hd;
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
  const float *qkv = (const float *)qkv_, *dO = (const float *)dout_;
  float *dqkv = (float *)dqkv_;
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  float *dP = (float *)scratch(sizeof(float) * (size_t)B * TT);
  if (!dP) return;
  for (int h = 0; h < H; h++) {
    const int kv = h / grp;
    const float *q = qkv + (long)h * hd, *k = qkv + HD + (long)kv * hd;
    const float *v = qkv + HD + (long)(KV + kv) * hd, *dOh = dO + (long)h * hd;
    float *dq = dqkv + (long)h * hd, *dk = dqkv + HD + (long)kv * hd;
    float *dv = dqkv + HD + (long)(KV + kv) * hd;
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
  const float *q = (const float *)qkv, *k = q + HD, *v = q + HD + (long)KV * hd;
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
  const float *q = (const float *)qkv, *k = q + HD, *v = q + HD + (long)KV * hd;
  const float *dO = (const float *)dout;
  float *dq = (float *)dqkv, *dk = dq + HD, *dv = dq + HD + (long)KV * hd;
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
  if (g.attn_variant == ATTN_PERHEAD) attention_fwd_perhead(out, state, qkv, B, T, H, KV, hd);
  else attention_fwd_batched(out, state, qkv, B, T, H, KV, hd);
}

void cu_attention_bwd(void *dqkv, const void *dout, const void *qkv, const float *state, int B,
                      int T, int H, int KV, int hd) {
  OP("attention_bwd");
  if (B <= 0 || T <= 0 || H <= 0) return;
  if (g.attn_variant == ATTN_PERHEAD) attention_bwd_perhead(dqkv, dout, qkv, state, B, T, H, KV, hd);
  else attention_bwd_batched(dqkv, dout, qkv, state, B, T, H, KV, hd);
}

template <typename act_t>
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

template <typename act_t>
void cu_gelu_fwd(void *out, const void *inp, size_t n) {
  OP("gelu_fwd");
  if (!n) return;
  constexpr size_t V = 16 / sizeof(act_t);
  if (n % V == 0 && aligned16(out) && aligned16(inp)) {
    gelu_fwd_vec_kernel<act_t><<<grid_for(n / V, 256), 256, 0, g.stream>>>(
        (act_t *)out, (const act_t *)inp, n / V);
    CK_LAUNCH(gelu_fwd_vec_kernel);
    return;
  }
  gelu_fwd_kernel<act_t><<<grid_for(n, 256), 256, 0, g.stream>>>((act_t *)out, (const act_t *)inp,
                                                                  n);
  CK_LAUNCH(gelu_fwd_kernel);
}

template <typename act_t>
void cu_gelu_bwd(void *dinp, const void *dout, const void *inp, size_t n) {
  OP("gelu_bwd");
  if (!n || !dinp) return;
  constexpr size_t V = 16 / sizeof(act_t);
  if (n % V == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp)) {
    gelu_bwd_vec_kernel<act_t><<<grid_for(n / V, 256), 256, 0, g.stream>>>(
        (act_t *)dinp, (const act_t *)dout, (const act_t *)inp, n / V);
    CK_LAUNCH(gelu_bwd_vec_kernel);
    return;
  }
  gelu_bwd_kernel<act_t><<<grid_for(n, 256), 256, 0, g.stream>>>(
      (act_t *)dinp, (const act_t *)dout, (const act_t *)inp, n);
  CK_LAUNCH(gelu_bwd_kernel);
}

template <typename act_t>
void cu_matmul_gelu_fwd(void *act, void *pre, const void *inp, const void *w, const void *bias,
                        int N, int IC, int OC) {
  OP("matmul_gelu_fwd");
  if (N <= 0 || OC <= 0) return;
  PROF_DETAIL("%dx%dx%d", N, IC, OC);
  if constexpr (is16<act_t>()) {
    if (g.matmul_lt && g.gelu_epilogue && lt_matmul_gelu<act_t>((act_t *)act, (act_t *)pre, (const act_t *)inp,
                                             (const act_t *)w, (const act_t *)bias, N, IC, OC))
      return;
  }
  cu_matmul_fwd<act_t>(pre, inp, w, bias, N, IC, OC);
  cu_gelu_fwd<act_t>(act, pre, (size_t)N * OC);
}

template <typename T> __global__ void dgelu_inplace_kernel(T *d, const T *pre, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    st(d + i, gelu_grad(ld(pre + i)) * ld(d + i));
}

template <typename act_t>
void cu_matmul_dgelu_bwd(void *dpre, const void *dout, const void *w, const void *pre, int N,
                         int IC, int OC) {
  OP("matmul_dgelu_bwd");
  if (N <= 0 || IC <= 0) return;
  PROF_DETAIL("%dx%dx%d", N, IC, OC);
  if constexpr (is16<act_t>()) {
    if (g.matmul_lt && g.gelu_epilogue && lt_matmul_dgelu<act_t>((act_t *)dpre, (const act_t *)dout, (const act_t *)w,
                                              (const act_t *)pre, N, IC, OC))
      return;
  }
  if (!gemm<act_t>(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, (const act_t *)w, IC, 0,
                   (const act_t *)dout, OC, 0, 0.0f, (act_t *)dpre, IC, 0, 1))
    return;
  const size_t n = (size_t)N * IC;
  dgelu_inplace_kernel<act_t><<<grid_for(n, 256), 256, 0, g.stream>>>((act_t *)dpre,
                                                                       (const act_t *)pre, n);
  CK_LAUNCH(dgelu_inplace_kernel);
}

template <typename act_t>
void cu_swiglu_fwd(void *out, const void *inp, int N, int F) {
  OP("swiglu_fwd");
  if (N <= 0 || F <= 0) return;
  swiglu_fwd_kernel<act_t><<<grid_for((size_t)N * F, 256), 256, 0, g.stream>>>(
      (act_t *)out, (const act_t *)inp, N, F);
  CK_LAUNCH(swiglu_fwd_kernel);
}

template <typename act_t>
void cu_swiglu_bwd(void *dinp, const void *dout, const void *inp, int N, int F) {
  OP("swiglu_bwd");
  if (N <= 0 || F <= 0 || !dinp) return;
  swiglu_bwd_kernel<act_t><<<grid_for((size_t)N * F, 256), 256, 0, g.stream>>>(
      (act_t *)dinp, (const act_t *)dout, (const act_t *)inp, N, F);
  CK_LAUNCH(swiglu_bwd_kernel);
}

template <typename act_t>
void cu_add_fwd(void *out, const void *a, const void *b, size_t n) {
  OP("add_fwd");
  if (!n) return;
  constexpr size_t V = 16 / sizeof(act_t);
  if (n % V == 0 && aligned16(out) && aligned16(a) && aligned16(b)) {
    add_vec_kernel<act_t><<<grid_for(n / V, 256), 256, 0, g.stream>>>(
        (act_t *)out, (const act_t *)a, (const act_t *)b, n / V);
    CK_LAUNCH(add_vec_kernel);
    return;
  }
  add_kernel<act_t><<<grid_for(n, 256), 256, 0, g.stream>>>((act_t *)out, (const act_t *)a,
                                                             (const act_t *)b, n);
  CK_LAUNCH(add_kernel);
}

template <typename act_t>
void cu_add_norm_fwd(void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                     const void *w, const void *bias, int N, int C, float eps, int rms) {
  OP("add_norm_fwd");
  if (N <= 0 || C <= 0) return;
  const bool vec = g.add_norm_fused && C % 8 == 0 && C <= NB_MAX_C && aligned16(res) && aligned16(out) &&
                   aligned16(a) && aligned16(b) && aligned16(w) && (!bias || aligned16(bias));
  const unsigned grid = (unsigned)((N + NB_WARPS - 1) / NB_WARPS);
  const int ng = (C / 8 + 31) / 32;
  bool done = false;
#define AN_CASE(NG)                                                                                \
  case NG:                                                                                         \
    if (rms)                                                                                       \
      add_norm_fwd_kernel<act_t, NG, true><<<grid, NB_WARPS * 32, 0, g.stream>>>(                  \
          (act_t *)res, (act_t *)out, mean, rstd, (const act_t *)a, (const act_t *)b,              \
          (const act_t *)w, NULL, N, C, eps);                                                      \
    else                                                                                           \
      add_norm_fwd_kernel<act_t, NG, false><<<grid, NB_WARPS * 32, 0, g.stream>>>(                 \
          (act_t *)res, (act_t *)out, mean, rstd, (const act_t *)a, (const act_t *)b,              \
          (const act_t *)w, (const act_t *)bias, N, C, eps);                                       \
    done = true;                                                                                   \
    break;
  if (vec) {
    switch (ng) {
      AN_CASE(1)
      AN_CASE(2)
      AN_CASE(3)
      AN_CASE(4)
      AN_CASE(5)
      AN_CASE(6)
      default: break;
    }
  }
#undef AN_CASE
  if (done) {
    CK_LAUNCH(add_norm_fwd_kernel);
    return;
  }
  cu_add_fwd<act_t>(res, a, b, (size_t)N * C);
  if (rms) cu_rmsnorm_fwd<act_t>(out, rstd, res, w, N, C, N, 0, eps);
  else cu_layernorm_fwd<act_t>(out, mean, rstd, res, w, bias, N, C, eps);
}


template <typename act_t>
void cu_xent_fwd_bwd(float *losses, void *logits, const int32_t *targets, int N, int V, int Vp,
                     float grad_scale) {
  OP("xent_fwd_bwd");
  if (N <= 0) return;
  const size_t row_bytes = (size_t)Vp * sizeof(act_t);
  if (g.xent_smem && row_bytes <= XS_MAX_BYTES && row_bytes % 16 == 0 && aligned16(logits)) {
    if (row_bytes > 48 * 1024 &&
        !CK(cudaFuncSetAttribute(xent_smem_kernel<act_t>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)row_bytes)))
      return;
    xent_smem_kernel<act_t><<<(unsigned)N, XS_THREADS, row_bytes, g.stream>>>(
        losses, (act_t *)logits, targets, V, Vp, grad_scale);
    CK_LAUNCH(xent_smem_kernel);
    return;
  }
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

void cu_adamw_multi(float *param, const float *grad, float *m, float *v, size_t mv_base,
                    const ct_adamw_seg *segs, int nseg, float lr, float b1, float b2, float eps,
                    float grad_scale, int step) {
  OP("adamw_multi");
  if (nseg <= 0) return;
  double bc1 = 1.0 - pow((double)b1, step), bc2 = 1.0 - pow((double)b2, step);
  const float step_size = (float)(lr / bc1), inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
  adamw_multi_kernel<<<(unsigned)nseg, 512, 0, g.stream>>>(param, grad, m, v, mv_base, segs, lr,
                                                           b1, b2, 1.0f - b1, 1.0f - b2, eps,
                                                           step_size, inv_bc2_sqrt, grad_scale);
  CK_LAUNCH(adamw_multi_kernel);
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
// 16-bit attention (bf16 and fp16 tables, element type E), batched-GEMM variant. state = P as E
// (B, H, T, T), zero above the diagonal, packed two to a float. Scores S = scale K Q^T come out
// of an E gemm in fp32 (scratch, in chunks of kv groups under CT_CUDA_ATTN_SCRATCH_MB), the
// causal softmax runs in fp32 and stores P in E; O = P V is an E gemm with fp32 accumulation.
// Backward: dV += P^T dO and dP = dO V^T (fp32, scratch); dS = P (dP - rowsum(P dP)) scale in
// fp32, stored E for dQ += dS K and dK += dS^T Q. fp16: P is in [0, 1]; dS may overflow to inf
// under a large loss scale, which then reaches the gradients (the trainer skips that step).

// S rows r = (b*nh + hl)*T + t (fp32, rewritten as scratch) -> P rows ((b*H + h0 + hl)*T + t).
template <typename E>
__global__ void softmax_causal_16_kernel(E *P, float *S, int B, int T, int H, int h0, int nh) {
  const long row = blockIdx.x * (long)NORM_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (long)B * nh * T) return;
  const long b = row / ((long)nh * T), rem = row % ((long)nh * T);
  const int hl = (int)(rem / T), t = (int)(rem % T);
  float *s = S + row * T;
  E *p = P + ((b * H + h0 + hl) * T + t) * (long)T;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, s[j]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += 32) {
    float e = expf(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < T; j += 32) st(p + j, j <= t ? s[j] * inv : 0.0f);
}

// dP rows r = (b*nh + hl)*T + t (fp32) -> dS (E, same rows), P from the state.
template <typename E>
__global__ void softmax_causal_bwd_16_kernel(E *dS, const float *dP, const E *P, int B, int T,
                                             int H, int h0, int nh, float scale) {
  const long row = blockIdx.x * (long)NORM_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (long)B * nh * T) return;
  const long b = row / ((long)nh * T), rem = row % ((long)nh * T);
  const int hl = (int)(rem / T), t = (int)(rem % T);
  const E *p = P + ((b * H + h0 + hl) * T + t) * (long)T;
  const float *d = dP + row * T;
  E *o = dS + row * T;
  float sd = 0.0f;
  for (int j = lane; j <= t; j += 32) sd += ld(p + j) * d[j];
  sd = warp_sum(sd);
  for (int j = lane; j < T; j += 32)
    st(o + j, j <= t ? ld(p + j) * (d[j] - sd) * scale : 0.0f);
}

size_t attn_16_batched_state_floats(int B, int T, int H) { return ((size_t)B * H * T * T + 1) / 2; }

// kv groups per chunk so that `per_kv` bytes each stay under the scratch cap (at least one).
int attn_chunk(size_t per_kv, int KV) {
  const size_t fit = g.attn_scratch_cap / (per_kv ? per_kv : 1);
  return fit < 1 ? 1 : fit > (size_t)KV ? KV : (int)fit;
}

template <typename E>
void attention_fwd_16_batched(void *out, float *state, const void *qkv, int B, int T, int H, int KV,
                              int hd) {
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  const size_t per_kv = sizeof(float) * (size_t)B * grp * TT;
  const int nkc = attn_chunk(per_kv, KV);
  const size_t s_bytes = per_kv * nkc, ptr_count = (size_t)B * nkc * grp;
  char *sc = (char *)scratch(s_bytes + sizeof(void *) * 3 * ptr_count + 256);
  if (!sc) return;
  float *S = (float *)sc;
  void **ptrs = (void **)(sc + (s_bytes + 255) / 256 * 256);
  const E *q = (const E *)qkv, *k = q + HD, *v = q + HD + (long)KV * hd;
  E *P = (E *)state, *o = (E *)out;
  for (int kv0 = 0; kv0 < KV; kv0 += nkc) {
    const int nk = KV - kv0 < nkc ? KV - kv0 : nkc, nh = nk * grp, h0 = kv0 * grp;
    // S(b,hl) = scale K(b, kv0 + hl/grp) Q(b, h0+hl)^T, fp32
    if (!gemm_batched<E, float>(ptrs, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale,
                                pd(k + (long)kv0 * hd, T * W3, hd, grp), (int)W3,
                                pd(q + (long)h0 * hd, T * W3, hd), (int)W3, 0.0f,
                                pd(S, nh * TT, TT), T, B * nh, nh))
      return;
    const long rows = (long)B * nh * T;
    softmax_causal_16_kernel<E>
        <<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32, 0, g.stream>>>(
            P, S, B, T, H, h0, nh);
    if (!CK_LAUNCH(softmax_causal_16_kernel)) return;
    // O(b,h) = P(b,h) V(b,kv)
    if (!gemm_batched<E, E>(ptrs, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f,
                            pd(v + (long)kv0 * hd, T * W3, hd, grp), (int)W3,
                            pd(P + (long)h0 * TT, H * TT, TT), T, 0.0f,
                            pd(o + (long)h0 * hd, T * HD, hd), (int)HD, B * nh, nh))
      return;
  }
}

template <typename E>
void attention_bwd_16_batched(void *dqkv, const void *dout, const void *qkv, const float *state,
                              int B, int T, int H, int KV, int hd) {
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, TT = (long)T * T;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  const size_t per_kv = (sizeof(float) + sizeof(E)) * (size_t)B * grp * TT;
  const int nkc = attn_chunk(per_kv, KV);
  const size_t dp_bytes = sizeof(float) * (size_t)B * grp * TT * nkc;
  const size_t ds_bytes = sizeof(E) * (size_t)B * grp * TT * nkc;
  const size_t ptr_count = (size_t)B * nkc * grp;
  char *sc = (char *)scratch(dp_bytes + ds_bytes + sizeof(void *) * 3 * ptr_count + 512);
  if (!sc) return;
  float *dP = (float *)sc;
  E *dS = (E *)(sc + (dp_bytes + 255) / 256 * 256);
  void **ptrs = (void **)(sc + (dp_bytes + 255) / 256 * 256 + (ds_bytes + 255) / 256 * 256);
  const E *q = (const E *)qkv, *k = q + HD, *v = q + HD + (long)KV * hd;
  const E *dO = (const E *)dout, *P = (const E *)state;
  E *dq = (E *)dqkv, *dk = dq + HD, *dv = dq + HD + (long)KV * hd;
  for (int kv0 = 0; kv0 < KV; kv0 += nkc) {
    const int nk = KV - kv0 < nkc ? KV - kv0 : nkc, nh = nk * grp, h0 = kv0 * grp;
    // dV(b,kv) += P(b,h)^T dO(b,h) for h = kv*grp + j, one j at a time (outputs coincide)
    for (int j = 0; j < grp; j++)
      if (!gemm_batched<E, E>(ptrs, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f,
                              pd(dO + (long)(h0 + j) * hd, T * HD, (long)grp * hd), (int)HD,
                              pd(P + (long)(h0 + j) * TT, H * TT, (long)grp * TT), T, 1.0f,
                              pd(dv + (long)kv0 * hd, T * W3, hd), (int)W3, B * nk, nk))
        return;
    // dP(b,hl) = dO(b,h) V(b,kv)^T, fp32
    if (!gemm_batched<E, float>(ptrs, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f,
                                pd(v + (long)kv0 * hd, T * W3, hd, grp), (int)W3,
                                pd(dO + (long)h0 * hd, T * HD, hd), (int)HD, 0.0f,
                                pd(dP, nh * TT, TT), T, B * nh, nh))
      return;
    const long rows = (long)B * nh * T;
    softmax_causal_bwd_16_kernel<E>
        <<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32, 0, g.stream>>>(
            dS, dP, P, B, T, H, h0, nh, scale);
    if (!CK_LAUNCH(softmax_causal_bwd_16_kernel)) return;
    // dQ(b,h) += dS(b,hl) K(b,kv)
    if (!gemm_batched<E, E>(ptrs, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f,
                            pd(k + (long)kv0 * hd, T * W3, hd, grp), (int)W3, pd(dS, nh * TT, TT),
                            T, 1.0f, pd(dq + (long)h0 * hd, T * W3, hd), (int)W3, B * nh, nh))
      return;
    // dK(b,kv) += dS(b,hl)^T Q(b,h), one j at a time
    for (int j = 0; j < grp; j++)
      if (!gemm_batched<E, E>(ptrs, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f,
                              pd(q + (long)(h0 + j) * hd, T * W3, (long)grp * hd), (int)W3,
                              pd(dS + (long)j * TT, nh * TT, (long)grp * TT), T, 1.0f,
                              pd(dk + (long)kv0 * hd, T * W3, hd), (int)W3, B * nk, nk))
        return;
  }
}

// ---------------------------------------------------------------------------------------------
// 16-bit attention, flash variant (FlashAttention-2 style, mma.sync m16n8k16 with bf16 or fp16
// inputs -> fp32, element type E), head dims 64 and 128. Blocks of 4 warps; a warp owns 16 rows
// of a 64-row tile; K/V (or Q/dO) tiles of 64 rows stream through shared memory with cp.async,
// two stages. Softmax statistics in fp32 (exp2 domain). state = [lse (B,H,T) in log2 units,
// padded to 8 floats][O copy (N, H*hd), E]: backward needs D = rowsum(dO * O) and the signature
// passes no O. P (in [0, 1]) and dS go through E as mma inputs; in fp16 an overflowing dS becomes
// inf (round to nearest, no saturation) and reaches dQ/dK, as in the batched variant.
// Backward, deterministic (no atomics): one kernel owns dK/dV of a 64-key tile and loops over the
// group's query heads and the query tiles at or after it; another owns dQ of a 64-query tile.
// Grids put the longest blocks (most tiles under the causal mask) first.
// mma.sync m16n8k16 and cp.async need sm_80: on older architectures (a build for sm_75, where
// fp16 is the 16-bit type) the helpers compile to a trap and the host never picks flash there.

#define FL_THREADS 128
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define FL_SM80 0
#else
#define FL_SM80 1
#endif

template <typename E> __device__ __forceinline__ uint32_t lds32(const E *p) {
  return *reinterpret_cast<const uint32_t *>(p);
}
// c += a b, a 16x16 (row), b 16x8 (col), E in, fp32 accumulate.
template <typename E>
__device__ __forceinline__ void mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                      uint32_t b1);
template <>
__device__ __forceinline__ void mma16<bf16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
#if FL_SM80
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}
template <>
__device__ __forceinline__ void mma16<f16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                           uint32_t b1) {
#if FL_SM80
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}
// Four 8x8 16-bit matrices, transposed, from shared memory (row addresses from lanes 8i..8i+7).
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
#if FL_SM80
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred) {
#if FL_SM80
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(pred ? 16 : 0));
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_commit() {
#if FL_SM80
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_wait() {
#if FL_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// A fragment (16x16 at rows r0.., cols k0..) of a row-major shared tile with leading dim LD.
template <int LD, typename E>
__device__ __forceinline__ void lds_a(uint32_t (&a)[4], const E *s, int r0, int k0, int g,
                                      int tg) {
  const E *p = s + (r0 + g) * LD + k0 + tg * 2;
  a[0] = lds32(p);
  a[1] = lds32(p + 8 * LD);
  a[2] = lds32(p + 8);
  a[3] = lds32(p + 8 * LD + 8);
}
// ldmatrix.trans address for the B fragments (k = rows k0.., n = cols n0..n0+15) of a row-major
// [k][n] shared tile: r[0], r[1] are b0, b1 of n-tile n0, r[2], r[3] those of n0 + 8.
template <int LD, typename E>
__device__ __forceinline__ const E *ldsm_t_addr(const E *s, int k0, int n0, int lane) {
  return s + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 + (lane >> 4) * 8;
}

// Rows row0 .. row0+63 of a head slice (row t at base + t*stride, hd = HD contiguous) into a
// [64][HD+8] shared tile; rows >= T are zero-filled.
template <int HD, typename E>
__device__ __forceinline__ void fl_load_tile(E *s, const E *base, long stride, int row0, int T) {
  constexpr int CPR = HD / 8, LD = HD + 8;
  for (int i = threadIdx.x; i < 64 * CPR; i += FL_THREADS) {
    const int r = i / CPR, c = (i % CPR) * 8;
    const bool ok = row0 + r < T;
    cp_async16(s + r * LD + c, ok ? base + (long)(row0 + r) * stride + c : base, ok);
  }
}

// P (16 rows x 16*NT2 keys) from C fragments (n-tiles of 8) to A fragments (k-chunks of 16).
template <int NT, typename E>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    a[nt / 2][(nt & 1) * 2 + 0] = pack2<E>(c[nt][0], c[nt][1]);
    a[nt / 2][(nt & 1) * 2 + 1] = pack2<E>(c[nt][2], c[nt][3]);
  }
}

// Shared memory in 16-bit elements (bf16 and fp16 alike).
template <int HD> constexpr size_t fl_fwd_smem() { return 2 * 5 * 64 * (HD + 8); }
template <int HD> constexpr size_t fl_bwd_smem() {
  return 2 * 6 * 64 * (HD + 8) + sizeof(float) * 4 * 64;
}

template <int HD, typename E>
__global__ void __launch_bounds__(FL_THREADS)
    flash_fwd_kernel(E *out, float *lse, E *ocopy, const E *qkv, int T, int H, int KV, float sl2) {
  constexpr int LD = HD + 8, KC = HD / 16, DT = HD / 8;
  extern __shared__ int4 fl_smem[];
  E *Qs = reinterpret_cast<E *>(fl_smem), *Ks = Qs + 64 * LD, *Vs = Ks + 2 * 64 * LD;
  const int nqb = (T + 63) / 64, qb = nqb - 1 - (int)blockIdx.x;
  const int b = (int)blockIdx.y / H, h = (int)blockIdx.y % H, kv = h / (H / KV);
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *qsrc = qkv + (long)b * T * W3 + (long)h * HD;
  const E *ksrc = qkv + (long)b * T * W3 + (long)(H + kv) * HD;
  const E *vsrc = qkv + (long)b * T * W3 + (long)(H + KV + kv) * HD;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int q0 = qb * 64, r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  fl_load_tile<HD>(Qs, qsrc, W3, q0, T);
  fl_load_tile<HD>(Ks, ksrc, W3, 0, T);
  fl_load_tile<HD>(Vs, vsrc, W3, 0, T);
  cp_commit();
  uint32_t qa[KC][4];
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int nkv = qb + 1;
  for (int j = 0; j < nkv; j++) {
    const int stg = j & 1;
    if (j + 1 < nkv) {
      fl_load_tile<HD>(Ks + (stg ^ 1) * 64 * LD, ksrc, W3, (j + 1) * 64, T);
      fl_load_tile<HD>(Vs + (stg ^ 1) * 64 * LD, vsrc, W3, (j + 1) * 64, T);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kc = 0; kc < KC; kc++) lds_a<LD>(qa[kc], Qs, warp * 16, kc * 16, g, tg);
    }
    const E *K = Ks + stg * 64 * LD, *V = Vs + stg * 64 * LD;
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const E *p = K + (nt * 8 + g) * LD + kc * 16 + tg * 2;
        mma16<E>(s[nt], qa[kc], lds32(p), lds32(p + 8));
      }
    }
    if (j == qb) { // the diagonal tile: keys after the query are masked
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const int key = j * 64 + nt * 8 + tg * 2;
        if (key > r0) s[nt][0] = -INFINITY;
        if (key + 1 > r0) s[nt][1] = -INFINITY;
        if (key > r1) s[nt][2] = -INFINITY;
        if (key + 1 > r1) s[nt][3] = -INFINITY;
      }
    }
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]) * sl2);
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]) * sl2);
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float a0 = exp2f(m0 - mx0), a1 = exp2f(m1 - mx1); // 0 on the first tile
    m0 = mx0;
    m1 = mx1;
    l0 *= a0;
    l1 *= a1;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      o[i][0] *= a0;
      o[i][1] *= a0;
      o[i][2] *= a1;
      o[i][3] *= a1;
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      s[nt][0] = exp2f(s[nt][0] * sl2 - m0);
      s[nt][1] = exp2f(s[nt][1] * sl2 - m0);
      s[nt][2] = exp2f(s[nt][2] * sl2 - m1);
      s[nt][3] = exp2f(s[nt][3] * sl2 - m1);
      l0 += s[nt][0] + s[nt][1];
      l1 += s[nt][2] + s[nt][3];
    }
    uint32_t pa[4][4];
    c_to_a<8, E>(pa, s);
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
#pragma unroll
      for (int dp = 0; dp < HD / 16; dp++) {
        uint32_t bv[4];
        ldsm_x4_t(bv, ldsm_t_addr<LD>(V, kc * 16, dp * 16, lane));
        mma16<E>(o[2 * dp], pa[kc], bv[0], bv[1]);
        mma16<E>(o[2 * dp + 1], pa[kc], bv[2], bv[3]);
      }
    }
    __syncthreads(); // the stage just read is the next prefetch's target
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
  if (r0 < T) {
    const long off = ((long)b * T + r0) * HDt + (long)h * HD;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      const uint32_t v = pack2<E>(o[i][0] * inv0, o[i][1] * inv0);
      *reinterpret_cast<uint32_t *>(out + off + i * 8 + tg * 2) = v;
      *reinterpret_cast<uint32_t *>(ocopy + off + i * 8 + tg * 2) = v;
    }
    if (tg == 0) lse[((long)b * H + h) * T + r0] = m0 + log2f(l0);
  }
  if (r1 < T) {
    const long off = ((long)b * T + r1) * HDt + (long)h * HD;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      const uint32_t v = pack2<E>(o[i][2] * inv1, o[i][3] * inv1);
      *reinterpret_cast<uint32_t *>(out + off + i * 8 + tg * 2) = v;
      *reinterpret_cast<uint32_t *>(ocopy + off + i * 8 + tg * 2) = v;
    }
    if (tg == 0) lse[((long)b * H + h) * T + r1] = m1 + log2f(l1);
  }
}

// D[(b*H + h)*T + t] = sum_d dO * O over the head's hd values; one warp per (b*T + t, h).
template <typename E>
__global__ void flash_bwd_pre_kernel(float *D, const E *dout, const E *ocopy, int B, int T, int H,
                                     int hd) {
  const long row = blockIdx.x * (long)NORM_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (long)B * T * H) return;
  const long bt = row / H;
  const int h = (int)(row % H);
  const long off = bt * H * hd + (long)h * hd;
  float s = 0.0f;
  for (int i = lane * 2; i < hd; i += 64) {
    float2 x = unpack2(dout + off + i), y = unpack2(ocopy + off + i);
    s += x.x * y.x + x.y * y.y;
  }
  s = warp_sum(s);
  if (lane == 0) D[((bt / T) * H + h) * T + bt % T] = s;
}

// dst (two E at p) += (x, y) * k, rounded once
template <typename E> __device__ __forceinline__ void add2(E *p, float x, float y, float k) {
  const float2 v = unpack2(p);
  *reinterpret_cast<uint32_t *>(p) = pack2<E>(v.x + x * k, v.y + y * k);
}

template <int HD, typename E>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dq_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse,
                        const float *D, int T, int H, int KV, float sl2, float scale) {
  constexpr int LD = HD + 8, KC = HD / 16, DT = HD / 8;
  extern __shared__ int4 fl_smem[];
  E *Qs = reinterpret_cast<E *>(fl_smem), *dOs = Qs + 64 * LD, *Ks = dOs + 64 * LD,
       *Vs = Ks + 2 * 64 * LD;
  const int nqb = (T + 63) / 64, qb = nqb - 1 - (int)blockIdx.x;
  const int b = (int)blockIdx.y / H, h = (int)blockIdx.y % H, kv = h / (H / KV);
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *qsrc = qkv + (long)b * T * W3 + (long)h * HD;
  const E *dosrc = dout + (long)b * T * HDt + (long)h * HD;
  const E *ksrc = qkv + (long)b * T * W3 + (long)(H + kv) * HD;
  const E *vsrc = qkv + (long)b * T * W3 + (long)(H + KV + kv) * HD;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int q0 = qb * 64, r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  fl_load_tile<HD>(Qs, qsrc, W3, q0, T);
  fl_load_tile<HD>(dOs, dosrc, HDt, q0, T);
  fl_load_tile<HD>(Ks, ksrc, W3, 0, T);
  fl_load_tile<HD>(Vs, vsrc, W3, 0, T);
  cp_commit();
  const long srow = ((long)b * H + h) * T;
  const float L0 = r0 < T ? lse[srow + r0] : 0.0f, L1 = r1 < T ? lse[srow + r1] : 0.0f;
  const float D0 = r0 < T ? D[srow + r0] : 0.0f, D1 = r1 < T ? D[srow + r1] : 0.0f;
  float dq[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  const int nkv = qb + 1;
  for (int j = 0; j < nkv; j++) {
    const int stg = j & 1;
    if (j + 1 < nkv) {
      fl_load_tile<HD>(Ks + (stg ^ 1) * 64 * LD, ksrc, W3, (j + 1) * 64, T);
      fl_load_tile<HD>(Vs + (stg ^ 1) * 64 * LD, vsrc, W3, (j + 1) * 64, T);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const E *K = Ks + stg * 64 * LD, *V = Vs + stg * 64 * LD;
    float s[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] =
          0.0f;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
      uint32_t a[4], e[4];
      lds_a<LD>(a, Qs, warp * 16, kc * 16, g, tg);
      lds_a<LD>(e, dOs, warp * 16, kc * 16, g, tg);
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const E *pk = K + (nt * 8 + g) * LD + kc * 16 + tg * 2;
        const E *pv = V + (nt * 8 + g) * LD + kc * 16 + tg * 2;
        mma16<E>(s[nt], a, lds32(pk), lds32(pk + 8));
        mma16<E>(dp[nt], e, lds32(pv), lds32(pv + 8));
      }
    }
    const bool diag = j == qb;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      const int key = j * 64 + nt * 8 + tg * 2;
      float p;
      p = (diag && key > r0) ? 0.0f : exp2f(s[nt][0] * sl2 - L0);
      s[nt][0] = p * (dp[nt][0] - D0);
      p = (diag && key + 1 > r0) ? 0.0f : exp2f(s[nt][1] * sl2 - L0);
      s[nt][1] = p * (dp[nt][1] - D0);
      p = (diag && key > r1) ? 0.0f : exp2f(s[nt][2] * sl2 - L1);
      s[nt][2] = p * (dp[nt][2] - D1);
      p = (diag && key + 1 > r1) ? 0.0f : exp2f(s[nt][3] * sl2 - L1);
      s[nt][3] = p * (dp[nt][3] - D1);
    }
    uint32_t da[4][4];
    c_to_a<8, E>(da, s);
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
#pragma unroll
      for (int dd = 0; dd < HD / 16; dd++) {
        uint32_t bk[4];
        ldsm_x4_t(bk, ldsm_t_addr<LD>(K, kc * 16, dd * 16, lane));
        mma16<E>(dq[2 * dd], da[kc], bk[0], bk[1]);
        mma16<E>(dq[2 * dd + 1], da[kc], bk[2], bk[3]);
      }
    }
    __syncthreads();
  }
  if (r0 < T) {
    E *d = dqkv + ((long)b * T + r0) * W3 + (long)h * HD;
#pragma unroll
    for (int i = 0; i < DT; i++) add2<E>(d + i * 8 + tg * 2, dq[i][0], dq[i][1], scale);
  }
  if (r1 < T) {
    E *d = dqkv + ((long)b * T + r1) * W3 + (long)h * HD;
#pragma unroll
    for (int i = 0; i < DT; i++) add2<E>(d + i * 8 + tg * 2, dq[i][2], dq[i][3], scale);
  }
}

template <int HD, typename E>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dkdv_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse,
                          const float *D, int T, int H, int KV, float sl2, float scale) {
  constexpr int LD = HD + 8, KC = HD / 16, DT = HD / 8;
  extern __shared__ int4 fl_smem[];
  E *Ks = reinterpret_cast<E *>(fl_smem), *Vs = Ks + 64 * LD, *Qs = Vs + 64 * LD,
       *dOs = Qs + 2 * 64 * LD;
  float *Ls = reinterpret_cast<float *>(dOs + 2 * 64 * LD), *Ds = Ls + 2 * 64;
  const int nqb = (T + 63) / 64, kb = (int)blockIdx.x;
  const int b = (int)blockIdx.y / KV, kv = (int)blockIdx.y % KV, grp = H / KV;
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *base = qkv + (long)b * T * W3;
  const E *dbase = dout + (long)b * T * HDt;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int k0 = kb * 64 + warp * 16 + g, k1 = k0 + 8;
  const int nq = nqb - kb, total = grp * nq; // (head, query tile) steps
  // step it: head h = kv*grp + it / nq, query tile i = kb + it % nq
  auto issue = [&](int it, int stg) {
    const int h = kv * grp + it / nq, i = kb + it % nq;
    fl_load_tile<HD>(Qs + stg * 64 * LD, base + (long)h * HD, W3, i * 64, T);
    fl_load_tile<HD>(dOs + stg * 64 * LD, dbase + (long)h * HD, HDt, i * 64, T);
    if (threadIdx.x < 64) {
      const int t = i * 64 + threadIdx.x;
      const long sr = ((long)b * H + h) * T;
      Ls[stg * 64 + threadIdx.x] = t < T ? lse[sr + t] : INFINITY; // padding rows: P = 0
      Ds[stg * 64 + threadIdx.x] = t < T ? D[sr + t] : 0.0f;
    }
  };
  fl_load_tile<HD>(Ks, base + (long)(H + kv) * HD, W3, kb * 64, T);
  fl_load_tile<HD>(Vs, base + (long)(H + KV + kv) * HD, W3, kb * 64, T);
  issue(0, 0);
  cp_commit();
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++)
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  for (int it = 0; it < total; it++) {
    const int stg = it & 1;
    if (it + 1 < total) {
      issue(it + 1, stg ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const int i = kb + it % nq;
    const bool diag = i == kb;
    const E *Q = Qs + stg * 64 * LD, *dO = dOs + stg * 64 * LD;
    const float *L = Ls + stg * 64, *Dd = Ds + stg * 64;
#pragma unroll
    for (int half = 0; half < 2; half++) { // 32 queries at a time (register pressure)
      const int qo = half * 32;
      float st[4][4], dpt[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; nt++)
        st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = dpt[nt][0] = dpt[nt][1] = dpt[nt][2] =
            dpt[nt][3] = 0.0f;
      // S^T = K Q^T and dP^T = V dO^T (16 keys x 32 queries per warp)
#pragma unroll
      for (int kc = 0; kc < KC; kc++) {
        uint32_t a[4], e[4];
        lds_a<LD>(a, Ks, warp * 16, kc * 16, g, tg);
        lds_a<LD>(e, Vs, warp * 16, kc * 16, g, tg);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
          const E *pq = Q + (qo + nt * 8 + g) * LD + kc * 16 + tg * 2;
          const E *pd_ = dO + (qo + nt * 8 + g) * LD + kc * 16 + tg * 2;
          mma16<E>(st[nt], a, lds32(pq), lds32(pq + 8));
          mma16<E>(dpt[nt], e, lds32(pd_), lds32(pd_ + 8));
        }
      }
      // P^T, dS^T
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        const int ql = qo + nt * 8 + tg * 2, q = i * 64 + ql;
        st[nt][0] = (diag && q < k0) ? 0.0f : exp2f(st[nt][0] * sl2 - L[ql]);
        st[nt][1] = (diag && q + 1 < k0) ? 0.0f : exp2f(st[nt][1] * sl2 - L[ql + 1]);
        st[nt][2] = (diag && q < k1) ? 0.0f : exp2f(st[nt][2] * sl2 - L[ql]);
        st[nt][3] = (diag && q + 1 < k1) ? 0.0f : exp2f(st[nt][3] * sl2 - L[ql + 1]);
        dpt[nt][0] = st[nt][0] * (dpt[nt][0] - Dd[ql]);
        dpt[nt][1] = st[nt][1] * (dpt[nt][1] - Dd[ql + 1]);
        dpt[nt][2] = st[nt][2] * (dpt[nt][2] - Dd[ql]);
        dpt[nt][3] = st[nt][3] * (dpt[nt][3] - Dd[ql + 1]);
      }
      uint32_t pa[2][4], sa[2][4];
      c_to_a<4, E>(pa, st);
      c_to_a<4, E>(sa, dpt);
      // dV += P^T dO, dK += dS^T Q (k = the 32 queries)
#pragma unroll
      for (int kc = 0; kc < 2; kc++) {
#pragma unroll
        for (int dd = 0; dd < HD / 16; dd++) {
          uint32_t bo[4], bq[4];
          ldsm_x4_t(bo, ldsm_t_addr<LD>(dO, qo + kc * 16, dd * 16, lane));
          ldsm_x4_t(bq, ldsm_t_addr<LD>(Q, qo + kc * 16, dd * 16, lane));
          mma16<E>(dv[2 * dd], pa[kc], bo[0], bo[1]);
          mma16<E>(dv[2 * dd + 1], pa[kc], bo[2], bo[3]);
          mma16<E>(dk[2 * dd], sa[kc], bq[0], bq[1]);
          mma16<E>(dk[2 * dd + 1], sa[kc], bq[2], bq[3]);
        }
      }
    }
    __syncthreads();
  }
  const long koff = (long)(H + kv) * HD, voff = (long)(H + KV + kv) * HD;
  if (k0 < T) {
    E *d = dqkv + ((long)b * T + k0) * W3;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      add2<E>(d + koff + i * 8 + tg * 2, dk[i][0], dk[i][1], scale);
      add2<E>(d + voff + i * 8 + tg * 2, dv[i][0], dv[i][1], 1.0f);
    }
  }
  if (k1 < T) {
    E *d = dqkv + ((long)b * T + k1) * W3;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      add2<E>(d + koff + i * 8 + tg * 2, dk[i][2], dk[i][3], scale);
      add2<E>(d + voff + i * 8 + tg * 2, dv[i][2], dv[i][3], 1.0f);
    }
  }
}


// flash2 device primitives: the only shared/global accesses and warp-level operations of the
// flash2 kernels besides mma16, ldsm_x4_t and cp_async16 above (a host emulator of these lets
// the kernels be checked for fragment layouts, barriers and bounds without a GPU).
// Four 8x8 16-bit matrices from shared memory, not transposed (row addresses from lanes 8i..8i+7).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
#if FL_SM80
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}
// 2^x, approximate (2 ulp), denormal results flushed to zero; 2^-inf = 0.
__device__ __forceinline__ float fl2_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void fl2_sync() { __syncthreads(); }
template <typename E> __device__ __forceinline__ E *fl2_smem() {
  extern __shared__ int4 fl2_dsmem[];
  return reinterpret_cast<E *>(fl2_dsmem);
}
__device__ __forceinline__ float2 fl2_sld2(const float *p) {
  return *reinterpret_cast<const float2 *>(p);
}
__device__ __forceinline__ void fl2_sstf(float *p, float v) { *p = v; }
__device__ __forceinline__ float fl2_ldg(const float *p) { return __ldg(p); }
__device__ __forceinline__ void fl2_st32(void *p, uint32_t v) {
  *reinterpret_cast<uint32_t *>(p) = v;
}
__device__ __forceinline__ void fl2_stf(float *p, float v) { *p = v; }
template <typename E> __device__ __forceinline__ void fl2_add2(E *p, float x, float y, float k) {
  add2<E>(p, x, y, k);
}

// ---------------------------------------------------------------------------------------------
// 16-bit attention, flash2 variant: the flash kernels reworked for fewer instructions per
// mma.sync and more reuse per shared-memory byte. Same math, state layout and determinism as
// flash (lse in log2 units + a 16-bit O copy; dK/dV and dQ in separate kernels, no atomics), so
// either variant's backward reads either's state. Differences:
//   - every mma operand comes from ldmatrix (x4, plain or .trans), none from scalar shared loads;
//     the fixed operand of a loop (Q in the forward, Q/dO in dQ, K/V in dK/dV) is loaded into
//     registers once where registers allow (template flags QREG / KVREG);
//   - blocks of NW warps; in the forward a warp may own MT m-tiles (16 query rows each), so each
//     K/V fragment feeds MT mma.sync; 128-row blocks halve the L2 traffic per flop of 64-row ones;
//   - one __syncthreads per tile: wait for tile j, barrier, then prefetch tile j+1 into the stage
//     that tile j-1 used (cp.async, two stages);
//   - a warp skips the tiles (and, in dK/dV, the 32-query halves) that the causal mask hides
//     from all of its rows, and masks only the tiles that cross its diagonal;
//   - exp2 through ex2.approx.ftz with the scale folded into one FFMA;
//   - grid (B*H or B*KV, tiles) with the tile index slowest, so every head's longest blocks are
//     dispatched first (forward and dQ: the last query tiles; dK/dV: the first key tiles).
// Every shared and global access of these kernels goes through the fl2_* / ldsm / cp_async
// helpers above, so the kernels can be run through an emulator of those helpers.
// ==== flash2 begin ====

template <int HD, int NW, int MT> constexpr size_t fl2_fwd_smem() {
  return 2 * (size_t)(NW * 16 * MT + 4 * 64) * (HD + 8);
}
template <int HD, int NW> constexpr size_t fl2_dq_smem() {
  return 2 * (size_t)(2 * NW * 16 + 4 * 64) * (HD + 8);
}
template <int HD, int NW> constexpr size_t fl2_dkdv_smem() {
  return 2 * (size_t)(2 * NW * 16 + 4 * 64) * (HD + 8) + sizeof(float) * 4 * 64;
}

// Rows row0 .. row0+R-1 of a head slice (row t at base + t*stride, HD contiguous) into an
// [R][HD+8] shared tile by NT threads; rows >= T are zero-filled.
template <int HD, int R, int NT, typename E>
__device__ __forceinline__ void fl2_load(E *s, const E *base, long stride, int row0, int T) {
  constexpr int CPR = HD / 8, LD = HD + 8;
  static_assert((R * CPR) % NT == 0, "tile rows must split evenly over the threads");
#pragma unroll
  for (int k = 0; k < R * CPR / NT; k++) {
    const int i = (int)threadIdx.x + k * NT, r = i / CPR, c = (i % CPR) * 8;
    const bool ok = row0 + r < T;
    cp_async16(s + r * LD + c, ok ? base + (long)(row0 + r) * stride + c : base, ok);
  }
}
// A fragment (rows r0..r0+15, cols k0..k0+15) of a row-major [m][k] shared tile.
template <int LD, typename E>
__device__ __forceinline__ void fl2_lda(uint32_t (&a)[4], const E *s, int r0, int k0, int lane) {
  ldsm_x4(a, s + (r0 + (lane & 15)) * LD + k0 + (lane >> 4) * 8);
}
// B fragments of n-tiles n0 and n0+8 (k0..k0+15) of a row-major [n][k] shared tile (B = tile^T):
// b[0], b[1] belong to n0, b[2], b[3] to n0 + 8.
template <int LD, typename E>
__device__ __forceinline__ void fl2_ldb(uint32_t (&b)[4], const E *s, int n0, int k0, int lane) {
  ldsm_x4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + k0 + ((lane >> 3) & 1) * 8);
}
// The same from a row-major [k][n] shared tile (B = tile), through ldmatrix .trans.
template <int LD, typename E>
__device__ __forceinline__ void fl2_ldbt(uint32_t (&b)[4], const E *s, int k0, int n0, int lane) {
  ldsm_x4_t(b, s + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 + (lane >> 4) * 8);
}
// The A fragment of k-chunk kc (16 keys) from the C fragments of n-tiles 2kc and 2kc+1.
template <typename E>
__device__ __forceinline__ void fl2_c2a(uint32_t (&a)[4], const float (&c0)[4],
                                        const float (&c1)[4]) {
  a[0] = pack2<E>(c0[0], c0[1]);
  a[1] = pack2<E>(c0[2], c0[3]);
  a[2] = pack2<E>(c1[0], c1[1]);
  a[3] = pack2<E>(c1[2], c1[3]);
}

// Forward: block = NW warps x MT m-tiles = BM query rows of one (b, h); 64-key tiles.
template <int HD, int NW, int MT, bool QREG, int MINB, typename E>
__global__ void __launch_bounds__(NW * 32, MINB)
    fl2_fwd_kernel(E *out, float *lse, E *ocopy, const E *qkv, int T, int H, int KV, float sl2) {
  constexpr int NT = NW * 32, BM = NW * 16 * MT, LD = HD + 8, KC = HD / 16, DT = HD / 8;
  E *Qs = fl2_smem<E>(), *Ks = Qs + BM * LD, *Vs = Ks + 2 * 64 * LD;
  const int nqb = (T + BM - 1) / BM, qb = nqb - 1 - (int)blockIdx.y;
  const int b = (int)blockIdx.x / H, h = (int)blockIdx.x % H, kv = h / (H / KV);
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *base = qkv + (long)b * T * W3;
  const E *qsrc = base + (long)h * HD, *ksrc = base + (long)(H + kv) * HD,
          *vsrc = base + (long)(H + KV + kv) * HD;
  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2,
            tg = lane & 3;
  const int q0 = qb * BM, wr = warp * 16 * MT, w0 = q0 + wr, wlast = w0 + 16 * MT - 1;
  const bool wact = w0 < T;
  const int nkv = ((q0 + BM < T ? q0 + BM : T) + 63) / 64;
  fl2_load<HD, BM, NT>(Qs, qsrc, W3, q0, T);
  fl2_load<HD, 64, NT>(Ks, ksrc, W3, 0, T);
  fl2_load<HD, 64, NT>(Vs, vsrc, W3, 0, T);
  cp_commit();
  uint32_t qa[MT][QREG ? KC : 1][4];
  float o[MT][DT][4], mr[MT][2], lr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int i = 0; i < DT; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    mr[mt][0] = mr[mt][1] = -INFINITY;
    lr[mt][0] = lr[mt][1] = 0.0f;
  }
  for (int j = 0; j < nkv; j++) {
    cp_wait<0>();
    fl2_sync(); // tile j landed for every thread; every warp is done with tile j-1's stage
    if (j + 1 < nkv) {
      const int st = (j + 1) & 1;
      fl2_load<HD, 64, NT>(Ks + st * 64 * LD, ksrc, W3, (j + 1) * 64, T);
      fl2_load<HD, 64, NT>(Vs + st * 64 * LD, vsrc, W3, (j + 1) * 64, T);
      cp_commit();
    }
    if constexpr (QREG) {
      if (j == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int kc = 0; kc < KC; kc++) fl2_lda<LD>(qa[mt][kc], Qs, wr + mt * 16, kc * 16, lane);
      }
    }
    const int key0 = j * 64;
    if (!wact || key0 > wlast) continue; // every key of the tile is after every row of the warp
    const E *K = Ks + (j & 1) * 64 * LD, *V = Vs + (j & 1) * 64 * LD;
    float s[MT][8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < 8; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        if constexpr (QREG) {
          a[mt][0] = qa[mt][kc][0];
          a[mt][1] = qa[mt][kc][1];
          a[mt][2] = qa[mt][kc][2];
          a[mt][3] = qa[mt][kc][3];
        } else {
          fl2_lda<LD>(a[mt], Qs, wr + mt * 16, kc * 16, lane);
        }
      }
#pragma unroll
      for (int np = 0; np < 4; np++) {
        uint32_t bk[4];
        fl2_ldb<LD>(bk, K, np * 16, kc * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          mma16<E>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma16<E>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
    if (key0 + 63 > w0) { // the tile crosses the warp's diagonal: keys after the query are masked
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        const int r0 = w0 + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
          const int key = key0 + nt * 8 + tg * 2;
          if (key > r0) s[mt][nt][0] = -INFINITY;
          if (key + 1 > r0) s[mt][nt][1] = -INFINITY;
          if (key > r1) s[mt][nt][2] = -INFINITY;
          if (key + 1 > r1) s[mt][nt][3] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        mx0 = fmaxf(mx0, fmaxf(s[mt][nt][0], s[mt][nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[mt][nt][2], s[mt][nt][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // every row has key 0 in the first tile, so the running max is finite from then on
      const float n0 = fmaxf(mr[mt][0], mx0 * sl2), n1 = fmaxf(mr[mt][1], mx1 * sl2);
      const float a0 = fl2_ex2(mr[mt][0] - n0), a1 = fl2_ex2(mr[mt][1] - n1); // 0 at first
      mr[mt][0] = n0;
      mr[mt][1] = n1;
      float l0 = lr[mt][0] * a0, l1 = lr[mt][1] * a1;
#pragma unroll
      for (int i = 0; i < DT; i++) {
        o[mt][i][0] *= a0;
        o[mt][i][1] *= a0;
        o[mt][i][2] *= a1;
        o[mt][i][3] *= a1;
      }
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        s[mt][nt][0] = fl2_ex2(fmaf(s[mt][nt][0], sl2, -n0));
        s[mt][nt][1] = fl2_ex2(fmaf(s[mt][nt][1], sl2, -n0));
        s[mt][nt][2] = fl2_ex2(fmaf(s[mt][nt][2], sl2, -n1));
        s[mt][nt][3] = fl2_ex2(fmaf(s[mt][nt][3], sl2, -n1));
        l0 += s[mt][nt][0] + s[mt][nt][1];
        l1 += s[mt][nt][2] + s[mt][nt][3];
      }
      lr[mt][0] = l0;
      lr[mt][1] = l1;
    }
#pragma unroll
    for (int kc = 0; kc < 4; kc++) { // O += P V, 16 keys at a time
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) fl2_c2a<E>(pa[mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
#pragma unroll
      for (int dp = 0; dp < HD / 16; dp++) {
        uint32_t bv[4];
        fl2_ldbt<LD>(bv, V, kc * 16, dp * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          mma16<E>(o[mt][2 * dp], pa[mt], bv[0], bv[1]);
          mma16<E>(o[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    float l0 = lr[mt][0], l1 = lr[mt][1];
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int r0 = w0 + mt * 16 + g, r1 = r0 + 8;
    if (r0 < T) {
      const float inv = 1.0f / l0;
      const long off = ((long)b * T + r0) * HDt + (long)h * HD;
#pragma unroll
      for (int i = 0; i < DT; i++) {
        const uint32_t v = pack2<E>(o[mt][i][0] * inv, o[mt][i][1] * inv);
        fl2_st32(out + off + i * 8 + tg * 2, v);
        fl2_st32(ocopy + off + i * 8 + tg * 2, v);
      }
      if (tg == 0) fl2_stf(lse + ((long)b * H + h) * T + r0, mr[mt][0] + log2f(l0));
    }
    if (r1 < T) {
      const float inv = 1.0f / l1;
      const long off = ((long)b * T + r1) * HDt + (long)h * HD;
#pragma unroll
      for (int i = 0; i < DT; i++) {
        const uint32_t v = pack2<E>(o[mt][i][2] * inv, o[mt][i][3] * inv);
        fl2_st32(out + off + i * 8 + tg * 2, v);
        fl2_st32(ocopy + off + i * 8 + tg * 2, v);
      }
      if (tg == 0) fl2_stf(lse + ((long)b * H + h) * T + r1, mr[mt][1] + log2f(l1));
    }
  }
}

// dQ: block = NW warps x 16 query rows of one (b, h); 64-key tiles. dQ = scale * dS K with
// dS = P * (dP - D), P = exp2(S*sl2 - lse), dP = dO V^T.
template <int HD, int NW, bool QREG, int MINB, typename E>
__global__ void __launch_bounds__(NW * 32, MINB)
    fl2_dq_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D, int T,
                  int H, int KV, float sl2, float scale) {
  constexpr int NT = NW * 32, BM = NW * 16, LD = HD + 8, KC = HD / 16, DT = HD / 8;
  E *Qs = fl2_smem<E>(), *dOs = Qs + BM * LD, *Ks = dOs + BM * LD, *Vs = Ks + 2 * 64 * LD;
  const int nqb = (T + BM - 1) / BM, qb = nqb - 1 - (int)blockIdx.y;
  const int b = (int)blockIdx.x / H, h = (int)blockIdx.x % H, kv = h / (H / KV);
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *base = qkv + (long)b * T * W3;
  const E *qsrc = base + (long)h * HD, *ksrc = base + (long)(H + kv) * HD,
          *vsrc = base + (long)(H + KV + kv) * HD;
  const E *dosrc = dout + (long)b * T * HDt + (long)h * HD;
  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2,
            tg = lane & 3;
  const int q0 = qb * BM, w0 = q0 + warp * 16, r0 = w0 + g, r1 = r0 + 8;
  const bool wact = w0 < T;
  const int nkv = ((q0 + BM < T ? q0 + BM : T) + 63) / 64;
  fl2_load<HD, BM, NT>(Qs, qsrc, W3, q0, T);
  fl2_load<HD, BM, NT>(dOs, dosrc, HDt, q0, T);
  fl2_load<HD, 64, NT>(Ks, ksrc, W3, 0, T);
  fl2_load<HD, 64, NT>(Vs, vsrc, W3, 0, T);
  cp_commit();
  const long srow = ((long)b * H + h) * T;
  const float L0 = r0 < T ? fl2_ldg(lse + srow + r0) : 0.0f;
  const float L1 = r1 < T ? fl2_ldg(lse + srow + r1) : 0.0f;
  const float D0 = r0 < T ? fl2_ldg(D + srow + r0) : 0.0f;
  const float D1 = r1 < T ? fl2_ldg(D + srow + r1) : 0.0f;
  uint32_t qa[QREG ? KC : 1][4], ea[QREG ? KC : 1][4];
  float dq[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  for (int j = 0; j < nkv; j++) {
    cp_wait<0>();
    fl2_sync();
    if (j + 1 < nkv) {
      const int st = (j + 1) & 1;
      fl2_load<HD, 64, NT>(Ks + st * 64 * LD, ksrc, W3, (j + 1) * 64, T);
      fl2_load<HD, 64, NT>(Vs + st * 64 * LD, vsrc, W3, (j + 1) * 64, T);
      cp_commit();
    }
    if constexpr (QREG) {
      if (j == 0) {
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
          fl2_lda<LD>(qa[kc], Qs, warp * 16, kc * 16, lane);
          fl2_lda<LD>(ea[kc], dOs, warp * 16, kc * 16, lane);
        }
      }
    }
    const int key0 = j * 64;
    if (!wact || key0 > w0 + 15) continue;
    const E *K = Ks + (j & 1) * 64 * LD, *V = Vs + (j & 1) * 64 * LD;
    float s[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] =
          0.0f;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
      uint32_t a[4], e[4];
      if constexpr (QREG) {
#pragma unroll
        for (int x = 0; x < 4; x++) {
          a[x] = qa[kc][x];
          e[x] = ea[kc][x];
        }
      } else {
        fl2_lda<LD>(a, Qs, warp * 16, kc * 16, lane);
        fl2_lda<LD>(e, dOs, warp * 16, kc * 16, lane);
      }
#pragma unroll
      for (int np = 0; np < 4; np++) {
        uint32_t bk[4], bv[4];
        fl2_ldb<LD>(bk, K, np * 16, kc * 16, lane);
        fl2_ldb<LD>(bv, V, np * 16, kc * 16, lane);
        mma16<E>(s[2 * np], a, bk[0], bk[1]);
        mma16<E>(s[2 * np + 1], a, bk[2], bk[3]);
        mma16<E>(dp[2 * np], e, bv[0], bv[1]);
        mma16<E>(dp[2 * np + 1], e, bv[2], bv[3]);
      }
    }
    const bool diag = key0 + 63 > w0;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      const int key = key0 + nt * 8 + tg * 2;
      float p0 = fl2_ex2(fmaf(s[nt][0], sl2, -L0)), p1 = fl2_ex2(fmaf(s[nt][1], sl2, -L0));
      float p2 = fl2_ex2(fmaf(s[nt][2], sl2, -L1)), p3 = fl2_ex2(fmaf(s[nt][3], sl2, -L1));
      if (diag) {
        if (key > r0) p0 = 0.0f;
        if (key + 1 > r0) p1 = 0.0f;
        if (key > r1) p2 = 0.0f;
        if (key + 1 > r1) p3 = 0.0f;
      }
      s[nt][0] = p0 * (dp[nt][0] - D0);
      s[nt][1] = p1 * (dp[nt][1] - D0);
      s[nt][2] = p2 * (dp[nt][2] - D1);
      s[nt][3] = p3 * (dp[nt][3] - D1);
    }
#pragma unroll
    for (int kc = 0; kc < 4; kc++) { // dQ += dS K, 16 keys at a time
      uint32_t da[4];
      fl2_c2a<E>(da, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int dd = 0; dd < HD / 16; dd++) {
        uint32_t bk[4];
        fl2_ldbt<LD>(bk, K, kc * 16, dd * 16, lane);
        mma16<E>(dq[2 * dd], da, bk[0], bk[1]);
        mma16<E>(dq[2 * dd + 1], da, bk[2], bk[3]);
      }
    }
  }
  if (r0 < T) {
    E *d = dqkv + ((long)b * T + r0) * W3 + (long)h * HD;
#pragma unroll
    for (int i = 0; i < DT; i++) fl2_add2<E>(d + i * 8 + tg * 2, dq[i][0], dq[i][1], scale);
  }
  if (r1 < T) {
    E *d = dqkv + ((long)b * T + r1) * W3 + (long)h * HD;
#pragma unroll
    for (int i = 0; i < DT; i++) fl2_add2<E>(d + i * 8 + tg * 2, dq[i][2], dq[i][3], scale);
  }
}

// dK, dV: block = NW warps x 16 keys of one (b, kv head); loops over the group's query heads and
// the 64-query tiles that can see its keys, 32 queries at a time. S^T = K Q^T, dP^T = V dO^T,
// dV += P^T dO, dK += scale * dS^T Q.
template <int HD, int NW, bool KVREG, int MINB, typename E>
__global__ void __launch_bounds__(NW * 32, MINB)
    fl2_dkdv_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D,
                    int T, int H, int KV, float sl2, float scale) {
  constexpr int NT = NW * 32, BN = NW * 16, LD = HD + 8, KC = HD / 16, DT = HD / 8;
  E *Ks = fl2_smem<E>(), *Vs = Ks + BN * LD, *Qs = Vs + BN * LD, *dOs = Qs + 2 * 64 * LD;
  float *Ls = reinterpret_cast<float *>(dOs + 2 * 64 * LD), *Ds = Ls + 2 * 64;
  const int kb = (int)blockIdx.y, b = (int)blockIdx.x / KV, kv = (int)blockIdx.x % KV;
  const int grp = H / KV;
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *base = qkv + (long)b * T * W3;
  const E *dbase = dout + (long)b * T * HDt;
  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2,
            tg = lane & 3;
  const int kb0 = kb * BN, w0 = kb0 + warp * 16, k0 = w0 + g, k1 = k0 + 8;
  const bool wact = w0 < T;
  const int i0 = kb0 / 64, nq = (T + 63) / 64 - i0, total = grp * nq; // (head, query tile) steps
  // step it: head h = kv*grp + it / nq, query tile i = i0 + it % nq
  auto issue = [&](int it, int stg) {
    const int h = kv * grp + it / nq, i = i0 + it % nq;
    fl2_load<HD, 64, NT>(Qs + stg * 64 * LD, base + (long)h * HD, W3, i * 64, T);
    fl2_load<HD, 64, NT>(dOs + stg * 64 * LD, dbase + (long)h * HD, HDt, i * 64, T);
    if (threadIdx.x < 64) {
      const int t = i * 64 + (int)threadIdx.x;
      const long sr = ((long)b * H + h) * T;
      // padding queries: lse = +inf makes P = 0
      fl2_sstf(Ls + stg * 64 + threadIdx.x, t < T ? fl2_ldg(lse + sr + t) : INFINITY);
      fl2_sstf(Ds + stg * 64 + threadIdx.x, t < T ? fl2_ldg(D + sr + t) : 0.0f);
    }
  };
  fl2_load<HD, BN, NT>(Ks, base + (long)(H + kv) * HD, W3, kb0, T);
  fl2_load<HD, BN, NT>(Vs, base + (long)(H + KV + kv) * HD, W3, kb0, T);
  issue(0, 0);
  cp_commit();
  uint32_t ka[KVREG ? KC : 1][4], va[KVREG ? KC : 1][4];
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++)
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  for (int it = 0; it < total; it++) {
    const int stg = it & 1;
    cp_wait<0>();
    fl2_sync();
    if (it + 1 < total) {
      issue(it + 1, stg ^ 1);
      cp_commit();
    }
    if constexpr (KVREG) {
      if (it == 0) {
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
          fl2_lda<LD>(ka[kc], Ks, warp * 16, kc * 16, lane);
          fl2_lda<LD>(va[kc], Vs, warp * 16, kc * 16, lane);
        }
      }
    }
    const int qbase = (i0 + it % nq) * 64;
    if (!wact || qbase + 63 < w0) continue; // every query of the tile is before every key
    const E *Q = Qs + stg * 64 * LD, *dO = dOs + stg * 64 * LD;
    const float *L = Ls + stg * 64, *Dd = Ds + stg * 64;
#pragma unroll
    for (int half = 0; half < 2; half++) { // 32 queries at a time (register pressure)
      const int qo = half * 32;
      if (qbase + qo + 31 < w0) continue;
      const bool diag = qbase + qo < w0 + 15;
      float st[4][4], dpt[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; nt++)
        st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = dpt[nt][0] = dpt[nt][1] = dpt[nt][2] =
            dpt[nt][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < KC; kc++) {
        uint32_t a[4], e[4];
        if constexpr (KVREG) {
#pragma unroll
          for (int x = 0; x < 4; x++) {
            a[x] = ka[kc][x];
            e[x] = va[kc][x];
          }
        } else {
          fl2_lda<LD>(a, Ks, warp * 16, kc * 16, lane);
          fl2_lda<LD>(e, Vs, warp * 16, kc * 16, lane);
        }
#pragma unroll
        for (int np = 0; np < 2; np++) {
          uint32_t bq[4], bo[4];
          fl2_ldb<LD>(bq, Q, qo + np * 16, kc * 16, lane);
          fl2_ldb<LD>(bo, dO, qo + np * 16, kc * 16, lane);
          mma16<E>(st[2 * np], a, bq[0], bq[1]);
          mma16<E>(st[2 * np + 1], a, bq[2], bq[3]);
          mma16<E>(dpt[2 * np], e, bo[0], bo[1]);
          mma16<E>(dpt[2 * np + 1], e, bo[2], bo[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; nt++) { // P^T, dS^T (rows: keys k0 / k1, columns: queries q, q+1)
        const int ql = qo + nt * 8 + tg * 2, q = qbase + ql;
        const float2 Lq = fl2_sld2(L + ql), Dq = fl2_sld2(Dd + ql);
        float p0 = fl2_ex2(fmaf(st[nt][0], sl2, -Lq.x)), p1 = fl2_ex2(fmaf(st[nt][1], sl2, -Lq.y));
        float p2 = fl2_ex2(fmaf(st[nt][2], sl2, -Lq.x)), p3 = fl2_ex2(fmaf(st[nt][3], sl2, -Lq.y));
        if (diag) {
          if (q < k0) p0 = 0.0f;
          if (q + 1 < k0) p1 = 0.0f;
          if (q < k1) p2 = 0.0f;
          if (q + 1 < k1) p3 = 0.0f;
        }
        st[nt][0] = p0;
        st[nt][1] = p1;
        st[nt][2] = p2;
        st[nt][3] = p3;
        dpt[nt][0] = p0 * (dpt[nt][0] - Dq.x);
        dpt[nt][1] = p1 * (dpt[nt][1] - Dq.y);
        dpt[nt][2] = p2 * (dpt[nt][2] - Dq.x);
        dpt[nt][3] = p3 * (dpt[nt][3] - Dq.y);
      }
#pragma unroll
      for (int kc = 0; kc < 2; kc++) { // dV += P^T dO, dK += dS^T Q (k = 16 of the queries)
        uint32_t pa[4], sa[4];
        fl2_c2a<E>(pa, st[2 * kc], st[2 * kc + 1]);
        fl2_c2a<E>(sa, dpt[2 * kc], dpt[2 * kc + 1]);
#pragma unroll
        for (int dd = 0; dd < HD / 16; dd++) {
          uint32_t bo[4], bq[4];
          fl2_ldbt<LD>(bo, dO, qo + kc * 16, dd * 16, lane);
          fl2_ldbt<LD>(bq, Q, qo + kc * 16, dd * 16, lane);
          mma16<E>(dv[2 * dd], pa, bo[0], bo[1]);
          mma16<E>(dv[2 * dd + 1], pa, bo[2], bo[3]);
          mma16<E>(dk[2 * dd], sa, bq[0], bq[1]);
          mma16<E>(dk[2 * dd + 1], sa, bq[2], bq[3]);
        }
      }
    }
  }
  const long koff = (long)(H + kv) * HD, voff = (long)(H + KV + kv) * HD;
  if (k0 < T) {
    E *d = dqkv + ((long)b * T + k0) * W3;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      fl2_add2<E>(d + koff + i * 8 + tg * 2, dk[i][0], dk[i][1], scale);
      fl2_add2<E>(d + voff + i * 8 + tg * 2, dv[i][0], dv[i][1], 1.0f);
    }
  }
  if (k1 < T) {
    E *d = dqkv + ((long)b * T + k1) * W3;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      fl2_add2<E>(d + koff + i * 8 + tg * 2, dk[i][2], dk[i][3], scale);
      fl2_add2<E>(d + voff + i * 8 + tg * 2, dv[i][2], dv[i][3], 1.0f);
    }
  }
}

// Grids: x = (b, head) pairs, y = tiles (longest first; see the kernels).
inline dim3 fl2_grid(int B, int heads, int T, int rows) {
  return dim3((unsigned)(B * heads), (unsigned)((T + rows - 1) / rows));
}
// ==== flash2 end ====

// Head dims 64 and 128, on devices with mma.sync m16n8k16 / cp.async (compute capability 8.0+;
// before ct_cuda_init, g.cc = 0, sizes follow the newer devices as they did before cc was kept).
bool flash_ok(int hd) { return (hd == 64 || hd == 128) && (g.cc == 0 || g.cc >= 80); }
size_t flash_lse_floats(int B, int T, int H) { return ((size_t)B * H * T + 7) / 8 * 8; }
size_t flash_state_floats(int B, int T, int H, int hd) {
  return flash_lse_floats(B, T, H) + ((size_t)B * T * H * hd + 1) / 2;
}
int attn_16_variant() {
  return g.attn_variant == ATTN_DEFAULT ? HALF_ATTN_DEFAULT : g.attn_variant;
}
// flash and flash2 keep the same state (lse + O copy), so either backward reads either's state.
// cudnn keeps the same sizes (its own lse units, see the cuDNN section), so state_floats does not
// depend on which of them runs.
bool attn_16_flash(int hd) {
  const int v = attn_16_variant();
  return (v == ATTN_FLASH || v == ATTN_FLASH2 || v == ATTN_FLASH2B || v == ATTN_CUDNN ||
          v == ATTN_AUTO || v == ATTN_FLASH3) &&
         flash_ok(hd);
}

// Raises a kernel's dynamic shared memory limit once per device (*done: a bit per device).
template <typename K> bool fl_smem_attr(K kernel, size_t bytes, int *done) {
  if ((*done >> g.device) & 1) return true;
  if (!CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes)))
    return false;
  *done |= 1 << g.device;
  return true;
}

bool fl_aligned(const void *a, const void *b, const void *c) {
  if (aligned16(a) && aligned16(b) && aligned16(c)) return true;
  record_error("flash attention", "qkv, out/dout and state must be 16-byte aligned", __FILE__,
               __LINE__);
  return false;
}

// The flash backwards' first step: D = rowsum(dout * out) per (b, h, t) in the scratch buffer,
// out being the copy the forward kept after the lse in state. NULL on failure (recorded).
template <typename E>
float *flash_bwd_D(const E *dout, const float *state, int B, int T, int H, int hd) {
  const E *oc = (const E *)(state + flash_lse_floats(B, T, H));
  float *D = (float *)scratch(sizeof(float) * (size_t)B * H * T);
  if (!D) return NULL;
  const long rows = (long)B * T * H;
  flash_bwd_pre_kernel<E><<<(unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * 32, 0,
                         g.stream>>>(D, dout, oc, B, T, H, hd);
  return CK_LAUNCH(flash_bwd_pre_kernel) ? D : NULL;
}

template <int HD, typename E>
void flash_fwd_launch(E *out, float *state, const E *qkv, int B, int T, int H, int KV) {
  static int attr;
  const size_t smem = fl_fwd_smem<HD>();
  if (!fl_smem_attr(flash_fwd_kernel<HD, E>, smem, &attr)) return;
  float *lse = state;
  E *oc = (E *)(state + flash_lse_floats(B, T, H));
  const dim3 grid((unsigned)((T + 63) / 64), (unsigned)(B * H));
  const float sl2 = 1.4426950408889634f / sqrtf((float)HD);
  flash_fwd_kernel<HD, E><<<grid, FL_THREADS, smem, g.stream>>>(out, lse, oc, qkv, T, H, KV, sl2);
  CK_LAUNCH(flash_fwd_kernel);
}

template <int HD, typename E>
void flash_bwd_launch(E *dqkv, const E *dout, const E *qkv, const float *state, int B, int T,
                      int H, int KV) {
  static int attr_dq, attr_dkdv;
  const size_t smem = fl_bwd_smem<HD>();
  if (!fl_smem_attr(flash_bwd_dq_kernel<HD, E>, smem, &attr_dq)) return;
  if (!fl_smem_attr(flash_bwd_dkdv_kernel<HD, E>, smem, &attr_dkdv)) return;
  const float *lse = state;
  float *D = flash_bwd_D<E>(dout, state, B, T, H, HD);
  if (!D) return;
  const float scale = 1.0f / sqrtf((float)HD), sl2 = 1.4426950408889634f * scale;
  const unsigned nqb = (unsigned)((T + 63) / 64);
  flash_bwd_dkdv_kernel<HD, E><<<dim3(nqb, (unsigned)(B * KV)), FL_THREADS, smem, g.stream>>>(
      dqkv, dout, qkv, lse, D, T, H, KV, sl2, scale);
  if (!CK_LAUNCH(flash_bwd_dkdv_kernel)) return;
  flash_bwd_dq_kernel<HD, E><<<dim3(nqb, (unsigned)(B * H)), FL_THREADS, smem, g.stream>>>(
      dqkv, dout, qkv, lse, D, T, H, KV, sl2, scale);
  CK_LAUNCH(flash_bwd_dq_kernel);
}

// flash2 launchers: NW warps per block, MT m-tiles per warp (forward), QREG / KVREG: the loop's
// fixed operand kept in registers.
template <int HD, int NW, int MT, bool QREG, int MINB, typename E>
void fl2_fwd_launch(E *out, float *state, const E *qkv, int B, int T, int H, int KV) {
  static int attr;
  constexpr size_t smem = fl2_fwd_smem<HD, NW, MT>();
  if (!fl_smem_attr(fl2_fwd_kernel<HD, NW, MT, QREG, MINB, E>, smem, &attr)) return;
  float *lse = state;
  E *oc = (E *)(state + flash_lse_floats(B, T, H));
  const float sl2 = 1.4426950408889634f / sqrtf((float)HD);
  fl2_fwd_kernel<HD, NW, MT, QREG, MINB, E><<<fl2_grid(B, H, T, NW * 16 * MT), NW * 32, smem, g.stream>>>(
      out, lse, oc, qkv, T, H, KV, sl2);
  CK_LAUNCH(fl2_fwd_kernel);
}

template <int HD, int NWQ, bool QREG, int MBQ, int NWK, bool KVREG, int MBK, typename E>
void fl2_bwd_launch(E *dqkv, const E *dout, const E *qkv, const float *state, int B, int T, int H,
                    int KV) {
  static int attr_dq, attr_dkdv;
  constexpr size_t sq = fl2_dq_smem<HD, NWQ>(), sk = fl2_dkdv_smem<HD, NWK>();
  if (!fl_smem_attr(fl2_dq_kernel<HD, NWQ, QREG, MBQ, E>, sq, &attr_dq)) return;
  if (!fl_smem_attr(fl2_dkdv_kernel<HD, NWK, KVREG, MBK, E>, sk, &attr_dkdv)) return;
  const float *lse = state;
  float *D = flash_bwd_D<E>(dout, state, B, T, H, HD);
  if (!D) return;
  const float scale = 1.0f / sqrtf((float)HD), sl2 = 1.4426950408889634f * scale;
  fl2_dkdv_kernel<HD, NWK, KVREG, MBK, E><<<fl2_grid(B, KV, T, NWK * 16), NWK * 32, sk, g.stream>>>(
      dqkv, dout, qkv, lse, D, T, H, KV, sl2, scale);
  if (!CK_LAUNCH(fl2_dkdv_kernel)) return;
  fl2_dq_kernel<HD, NWQ, QREG, MBQ, E><<<fl2_grid(B, H, T, NWQ * 16), NWQ * 32, sq, g.stream>>>(
      dqkv, dout, qkv, lse, D, T, H, KV, sl2, scale);
  CK_LAUNCH(fl2_dq_kernel);
}

#if CT_HAVE_FLASH3
// flash3's backward form 1, read at every call (a test can switch it): the two deterministic
// kernels unless CT_FLASH3_DQ_ATOMIC=1 asks for the fused one (dQ by atomics). Measured on an
// H200 (bench/results/attention_flash3_fused_dq_2026-11-30_H200_f1ba0a9.txt): the fused kernel is
// 15-20% slower at head dim 128 (the fp32 atomics) and within 5% either way at 64, so it is opt-in;
// attention.deterministic (CT_CUDA_CUDNN_DETERMINISTIC=1) keeps the two kernels even then.
bool fl3_dq_atomic() {
  const char *v = getenv("CT_FLASH3_DQ_ATOMIC");
  if (!(v && v[0] && strcmp(v, "0") != 0)) return false;
  const char *d = getenv("CT_CUDA_CUDNN_DETERMINISTIC");
  return !(d && d[0] && strcmp(d, "0") != 0);
}

// flash3's backward is form 2 (flash_hopper.cu's fl3_bwd2_kernel: producer warp, TMA, dQ by
// bulk fp32 reductions) unless CT_FLASH3_BWD=1 asks for form 1 (the two deterministic kernels, or
// the fused one with CT_FLASH3_DQ_ATOMIC=1). Form 2 passed test_ops_cuda on an H200 and ran
// 11-28% faster than form 1 over B*T = 16k, T 1k-8k, hd 64 and 128
// (bench/results/attention_2026-11-30_NVIDIA_H200_0f6490c.txt). Its dQ bits can vary from run to
// run, so attention.deterministic (CT_CUDA_CUDNN_DETERMINISTIC=1) keeps form 1's two kernels.
// Read at every call, so a test can compare the forms in one process.
bool fl3_bwd2() {
  const char *v = getenv("CT_FLASH3_BWD");
  if (v && !strcmp(v, "1")) return false;
  const char *a = getenv("CT_FLASH3_DQ_ATOMIC");
  if (a && a[0] && strcmp(a, "0") != 0) return false;
  const char *d = getenv("CT_CUDA_CUDNN_DETERMINISTIC");
  return !(d && d[0] && strcmp(d, "0") != 0);
}

// backward form 2's kernel variant, CT_FLASH3_BWD2_OPT (a bitmask: 1 double-buffered dQ staging,
// 2 split S^T / dP^T wgmma waits, 4 at hd 64 each warpgroup's own dQ over its keys, clearing 1;
// see fl3_bwd2_kernel's STATUS in flash_hopper.cu); read at every call. OPT 0-3 all passed
// test_ops_cuda on an H200; forward + backward times against 0
// (bench/results/attention_2026-11-30_NVIDIA_H200_b795bbc.txt): 2 is 1.0-2.4% faster at hd 64 and
// 0-0.6% at 128, 1 within +-1% (the bulk add was not what a step waited on), 3 like 2. 4 and 6
// passed too (session 10, 1570 checks) and at hd 64 6 takes 0.90-0.96x 2's time, 4 1.03-1.05x
// (bench/results/attention_2026-11-30_NVIDIA_H200_834512f.txt). So 6 is the default: at hd 128,
// where bit 4 is ignored, that is 2.
int fl3_bwd2_opt() {
  const char *v = getenv("CT_FLASH3_BWD2_OPT");
  return v ? atoi(v) : 6;
}

// flash3's forward form: 2 (flash_hopper.cu's fl3_fwd2_kernel: a producer warp loading Q, K and
// V by TMA into an mbarrier ring, 128-key tiles whose QK^T overlaps the previous tile's softmax)
// at every shape; CT_FLASH3_FWD=1 / =2 force one. Until 2cc4359 form 2 ran only at hd 128 and from
// T = 4096 at hd 64: at hd 64, T 1024-2048, it took 1.07-1.17x form 1's time. With the tiles of
// one head near each other in the grid (flash_hopper.cu's tile_of) it takes the same time as
// form 1 at hd 64, T 1024 (156 against 154 us), 0.84-0.91x from T 2048 and 0.62-0.79x at hd 128
// (bench/results/call22_cc145e4.txt, B*T = 16k, causal, bf16).
// Same outputs as form 1, so either backward follows it. Read at every call, so a test can
// compare the forms in one process.
bool fl3_fwd2() {
  const char *v = getenv("CT_FLASH3_FWD");
  return !(v && !strcmp(v, "1"));
}

// flash3's forward: form 2 where fl3_fwd2 picks it and the driver has a tensor-map encoder
// (ct_fl3_fwd2 returns -1 otherwise), else form 1. 0 when queued, as ct_fl3_fwd.
int fl3_fwd_launch(int fp16, void *out, float *lse, void *ocopy, const void *qkv, int B, int T,
                   int H, int KV, int hd) {
  if (fl3_fwd2()) {
    const int r = ct_fl3_fwd2(fp16, out, lse, ocopy, qkv, B, T, H, KV, hd, g.stream);
    if (r != -1) return r;
  }
  return ct_fl3_fwd(fp16, out, lse, ocopy, qkv, B, T, H, KV, hd, g.stream);
}

// flash3's backward: D = rowsum(dO * O) here, then the Hopper kernels (flash_hopper.cu), reading
// the forward's lse and D: with fl3_dq_atomic(), one fused dK / dV / dQ kernel whose fp32 dQ
// workspace (B * H * hd * T floats, T rounded up to 64) follows D in the scratch buffer; by
// default the dK / dV kernel and then the dQ kernel (deterministic).
template <int HD, typename E>
void fl3_bwd_launch(E *dqkv, const E *dout, const E *qkv, const float *state, int B, int T, int H,
                    int KV) {
  const float *lse = state;
  const int half16 = std::is_same<E, f16>::value;
  if (fl3_bwd2() || fl3_dq_atomic()) {
    // grow scratch to D + workspace first: flash_bwd_D then gets the same buffer, D at its start
    const size_t d_bytes = (sizeof(float) * (size_t)B * H * T + 255) / 256 * 256;
    if (!scratch(d_bytes + sizeof(float) * ct_fl3_bwd_ws_floats(B, T, H, HD))) return;
    float *D = flash_bwd_D<E>(dout, state, B, T, H, HD);
    if (!D) return;
    float *ws = (float *)((char *)D + d_bytes);
    if (fl3_bwd2()) {
      const int r = ct_fl3_bwd2(half16, dqkv, ws, dout, qkv, lse, D, B, T, H, KV, HD,
                                  fl3_bwd2_opt(), g.stream);
      if (r == 0) return;
      if (r != -1) { // -1: no tensor-map encoder in this driver; the fused form below instead
        CK_LAUNCH(fl3_bwd2_kernel);
        return;
      }
    }
    if (ct_fl3_bwd(half16, dqkv, ws, dout, qkv, lse, D, B, T, H, KV, HD, g.stream) != 0)
      CK_LAUNCH(fl3_bwd_kernel);
    return;
  }
  float *D = flash_bwd_D<E>(dout, state, B, T, H, HD);
  if (!D) return;
  if (ct_fl3_bwd_dkdv(half16, dqkv, dout, qkv, lse, D, B, T, H, KV, HD, g.stream) != 0) {
    CK_LAUNCH(fl3_dkdv_kernel);
    return;
  }
  if (ct_fl3_bwd_dq(half16, dqkv, dout, qkv, lse, D, B, T, H, KV, HD, g.stream) != 0)
    CK_LAUNCH(fl3_dq_kernel);
}
#endif

// The flash2 configurations (tests/gpu/test_ops_cuda --perf times both). Registers per thread
// (ptxas, sm_90), resident warps per SM, and H200 bf16 times (us, B16 T1024 H12 hd64 / B4 T2048
// H16 KV8 hd128; flash: 184.7 / 468.1 forward, 606.5 / 1370.8 backward):
//   flash2, 4-warp blocks: hd64 forward 2 m-tiles per warp (128 rows) 248 regs, 8 warps, 122.1;
//     hd128 forward 64 rows 240, 8 warps, 303.3; hd64 dQ and dK/dV 64 rows capped at 168 regs
//     (12 warps; Q/dO, K/V fragments reloaded from shared memory), backward 495.4; hd128 dQ 248,
//     dK/dV 255 (8 warps), backward 1007.5.
//   flash2b, 8-warp blocks of 128 rows: hd64 forward 128 regs (16 warps) 138.9, hd128 229 (8)
//     306.5; hd64 dQ 194 and dK/dV 203 with the fragments in registers (8 warps) 586.8, hd128
//     dQ 238, dK/dV 250 (8 warps) 1028.0.
// MINB 0 leaves ptxas's register choice alone (an explicit 1 gave the hd64 8-warp forward 150
// registers and one block per SM instead of 128 and two).
template <typename E>
void fl2_fwd(int v, int hd, E *out, float *state, const E *qkv, int B, int T, int H, int KV) {
  if (v == ATTN_FLASH2) {
    if (hd == 64) fl2_fwd_launch<64, 4, 2, true, 1, E>(out, state, qkv, B, T, H, KV);
    else fl2_fwd_launch<128, 4, 1, true, 1, E>(out, state, qkv, B, T, H, KV);
  } else {
    if (hd == 64) fl2_fwd_launch<64, 8, 1, true, 0, E>(out, state, qkv, B, T, H, KV);
    else fl2_fwd_launch<128, 8, 1, true, 1, E>(out, state, qkv, B, T, H, KV);
  }
}
template <typename E>
void fl2_bwd(int v, int hd, E *dqkv, const E *dout, const E *qkv, const float *state, int B, int T,
             int H, int KV) {
  if (v == ATTN_FLASH2) {
    if (hd == 64) fl2_bwd_launch<64, 4, false, 3, 4, false, 3, E>(dqkv, dout, qkv, state, B, T, H, KV);
    else fl2_bwd_launch<128, 4, false, 1, 4, false, 1, E>(dqkv, dout, qkv, state, B, T, H, KV);
  } else {
    if (hd == 64) fl2_bwd_launch<64, 8, true, 1, 8, true, 1, E>(dqkv, dout, qkv, state, B, T, H, KV);
    else fl2_bwd_launch<128, 8, false, 1, 8, false, 1, E>(dqkv, dout, qkv, state, B, T, H, KV);
  }
}

// ---------------------------------------------------------------------------------------------
// 16-bit attention through cuDNN (variant "cudnn") and the measured choice between it and flash2
// (variant "auto").
//
// cuDNN's fused SDPA (attention_cudnn.cpp builds one graph per shape, once) in the flash state
// layout: [stats (B,H,T) fp32, padded to 8 floats][O copy (N, H*hd), E]. cuDNN's stats are the
// natural-log log-sum-exp, flash's are in log2 units, so a step's forward and backward must run
// the same backend: "cudnn" always does; "auto" decides a shape at its first forward and the
// backward reads that decision. Costs beyond cuDNN's kernels: the forward copies O into the state
// (N*H*hd elements), the backward lets cuDNN overwrite dq/dk/dv in scratch and adds them into dqkv
// (ops.h: backward accumulates; cuDNN has no accumulate), 3 passes over N*W elements.
// The auto decision times, outside graph capture, one warm-up then the best of 3 forwards and 3
// backwards of each backend on the call's own qkv (CUDA events, like lt_exec's candidates), and
// keeps the lower forward + backward total. CT_CUDA_ATTN_LOG=1 prints each decision to stderr.
// Determinism: cuDNN's default backward accumulates dQ with atomics, the one exception to this
// file's no-atomics rule (bits may differ run to run; CT_CUDA_CUDNN_DETERMINISTIC=1 asks cuDNN for
// its deterministic algorithm at the cost of a (B,H,T,T) workspace, see attention_cudnn.cpp).
// "auto" may pick cudnn; implementation = "flash" keeps every kernel deterministic.
struct attn_auto_rec {
  int variant;                         // ATTN_FLASH2, ATTN_CUDNN or ATTN_FLASH3
  float flash_ms, cudnn_ms, flash3_ms; // forward + backward, best of 3 each (0: not timed)
};
std::map<std::vector<int>, attn_auto_rec> attn_auto;

template <typename E> std::vector<int> attn_key(int B, int T, int H, int KV, int hd) {
  return {g.device, (int)std::is_same<E, f16>::value, B, T, H, KV, hd};
}

#if CT_HAVE_CUDNN
template <typename E> ct_cudnn_attn_shape cudnn_shape(int B, int T, int H, int KV, int hd) {
  ct_cudnn_attn_shape s;
  s.device = g.device;
  s.B = B, s.T = T, s.H = H, s.KV = KV, s.hd = hd;
  s.fp16 = std::is_same<E, f16>::value;
  return s;
}

// The graph's workspace; false (with the reason in why) when cuDNN cannot run the shape.
bool cudnn_plan(const ct_cudnn_attn_shape &s, int bwd, size_t *ws, char *why, size_t cap) {
  return ct_cudnn_attn_plan(&s, bwd, !g.capturing, ws, why, cap) == 0;
}

template <typename E>
void cudnn_fwd(E *out, float *state, const E *qkv, int B, int T, int H, int KV, int hd) {
  const ct_cudnn_attn_shape s = cudnn_shape<E>(B, T, H, KV, hd);
  char why[512];
  size_t ws = 0;
  if (!cudnn_plan(s, 0, &ws, why, sizeof why)) {
    record_error("cuDNN attention", why, __FILE__, __LINE__);
    return;
  }
  void *w = ws ? scratch(ws) : NULL;
  if (ws && !w) return;
  if (ct_cudnn_attn_fwd(g.stream, &s, out, state, qkv, w, why, sizeof why) != 0) {
    record_error("ct_cudnn_attn_fwd", why, __FILE__, __LINE__);
    return;
  }
  E *oc = (E *)(state + flash_lse_floats(B, T, H));
  CK(cudaMemcpyAsync(oc, out, sizeof(E) * (size_t)B * T * H * hd, cudaMemcpyDeviceToDevice,
                     g.stream));
}

// dqkv += the gradient, or with set, dqkv = the gradient (cuDNN writes it in place: no scratch
// copy of dqkv and no add pass).
template <typename E>
void cudnn_bwd(E *dqkv, const E *dout, const E *qkv, const float *state, int B, int T, int H,
               int KV, int hd, bool set = false) {
  const ct_cudnn_attn_shape s = cudnn_shape<E>(B, T, H, KV, hd);
  char why[512];
  size_t ws = 0;
  if (!cudnn_plan(s, 1, &ws, why, sizeof why)) {
    record_error("cuDNN attention", why, __FILE__, __LINE__);
    return;
  }
  const size_t n = (size_t)B * T * (H + 2 * KV) * hd, ws_al = (ws + 255) / 256 * 256;
  char *base = (char *)scratch(ws_al + (set ? 0 : n * sizeof(E)));
  if (!base) return;
  E *tmp = set ? dqkv : (E *)(base + ws_al);
  const E *oc = (const E *)(state + flash_lse_floats(B, T, H));
  if (ct_cudnn_attn_bwd(g.stream, &s, tmp, dout, qkv, oc, state, ws ? base : NULL, why,
                        sizeof why) != 0) {
    record_error("ct_cudnn_attn_bwd", why, __FILE__, __LINE__);
    return;
  }
  if (set) return;
  constexpr size_t V = 16 / sizeof(E); // dqkv += tmp
  if (n % V == 0 && aligned16(dqkv)) {
    add_vec_kernel<E><<<grid_for(n / V, 256), 256, 0, g.stream>>>(dqkv, dqkv, tmp, n / V);
    CK_LAUNCH(add_vec_kernel);
  } else {
    add_kernel<E><<<grid_for(n, 256), 256, 0, g.stream>>>(dqkv, dqkv, tmp, n);
    CK_LAUNCH(add_kernel);
  }
}

#endif

// Best of 3 timed runs of fn after one warm-up, in ms (CUDA events on g.stream).
template <typename F> float time_best3(F fn) {
  fn();
  cudaEvent_t e0, e1;
  if (!CK(cudaEventCreate(&e0))) return INFINITY;
  if (!CK(cudaEventCreate(&e1))) {
    cudaEventDestroy(e0);
    return INFINITY;
  }
  float best = INFINITY;
  for (int k = 0; k < 3; k++) {
    float ms = 0;
    cudaEventRecord(e0, g.stream);
    fn();
    cudaEventRecord(e1, g.stream);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms < best) best = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

// The backend "auto" runs for this shape's forward: the recorded decision, else (outside graph
// capture) a new measured one: forward + backward of flash2, of cudnn where the build has cuDNN
// attention and it can run the shape, and of flash3 on an sm_90 GPU in builds with the Hopper
// kernels; the fastest is kept. flash2 where nothing else is available or a graph is being
// recorded (the decision then waits for an uncaptured forward).
template <typename E>
int attn_auto_pick(E *out, float *state, const E *qkv, int B, int T, int H, int KV, int hd) {
  const std::vector<int> key = attn_key<E>(B, T, H, KV, hd);
  auto it = attn_auto.find(key);
  if (it != attn_auto.end()) return it->second.variant;
  bool has3 = false, hasc = false;
#if CT_HAVE_FLASH3
  has3 = g.cc == 90;
#endif
#if CT_HAVE_CUDNN
  char why[512] = "not in this build";
  const ct_cudnn_attn_shape s = cudnn_shape<E>(B, T, H, KV, hd);
  size_t wf = 0, wb = 0;
  hasc = cudnn_plan(s, 0, &wf, why, sizeof why) && cudnn_plan(s, 1, &wb, why, sizeof why);
#endif
  if ((!has3 && !hasc) || g.capturing) return ATTN_FLASH2;
  attn_auto_rec r = {ATTN_FLASH2, 0, 0, 0};
  E *dq = NULL;
  const size_t n = (size_t)B * T * (H + 2 * KV) * hd;
  if (cudaMalloc(&dq, n * sizeof(E)) != cudaSuccess) { // out of memory: not an op error
    cudaGetLastError();
    return ATTN_FLASH2;
  }
  if (CK(cudaMemsetAsync(dq, 0, n * sizeof(E), g.stream))) {
    // dout = out: any values time the same; dq collects the (discarded) gradients
    r.flash_ms = time_best3([&] { fl2_fwd<E>(ATTN_FLASH2, hd, out, state, qkv, B, T, H, KV); }) +
                 time_best3([&] { fl2_bwd<E>(ATTN_FLASH2, hd, dq, out, qkv, state, B, T, H, KV); });
    float best = r.flash_ms;
#if CT_HAVE_CUDNN
    if (hasc) {
      r.cudnn_ms = time_best3([&] { cudnn_fwd<E>(out, state, qkv, B, T, H, KV, hd); }) +
                   time_best3([&] { cudnn_bwd<E>(dq, out, qkv, state, B, T, H, KV, hd, true); });
      if (r.cudnn_ms < best) best = r.cudnn_ms, r.variant = ATTN_CUDNN;
    }
#endif
#if CT_HAVE_FLASH3
    if (has3) {
      const bool f16t = std::is_same<E, f16>::value;
      float *lse = state;
      E *oc = (E *)(state + flash_lse_floats(B, T, H));
      r.flash3_ms =
          time_best3([&] { fl3_fwd_launch(f16t, out, lse, oc, qkv, B, T, H, KV, hd); }) +
          time_best3([&] {
            if (hd == 64) fl3_bwd_launch<64, E>(dq, out, qkv, state, B, T, H, KV);
            else fl3_bwd_launch<128, E>(dq, out, qkv, state, B, T, H, KV);
          });
      if (r.flash3_ms < best) best = r.flash3_ms, r.variant = ATTN_FLASH3;
    }
#endif
    (void)best;
  }
  CK(cudaStreamSynchronize(g.stream));
  CK(cudaFree(dq));
  if (getenv("CT_CUDA_ATTN_LOG") && atoi(getenv("CT_CUDA_ATTN_LOG")) > 0)
    fprintf(stderr, "attention auto B%d T%d H%d KV%d hd%d %s (forward + backward): flash2 %.3f ms,"
            " cudnn %s%.3f ms, flash3 %.3f ms -> %s\n", B, T, H, KV, hd,
            std::is_same<E, f16>::value ? "fp16" : "bf16", r.flash_ms, hasc ? "" : "(unavailable) ",
            r.cudnn_ms, r.flash3_ms,
            r.variant == ATTN_CUDNN ? "cudnn" : r.variant == ATTN_FLASH3 ? "flash3" : "flash2");
  attn_auto[key] = r;
  return r.variant;
}

// The backend the backward of this shape runs: the forward's.
template <typename E> int attn_bwd_pick(int B, int T, int H, int KV, int hd) {
  const int v = attn_16_variant();
  if (v != ATTN_AUTO) return v;
  auto it = attn_auto.find(attn_key<E>(B, T, H, KV, hd));
  return it != attn_auto.end() ? it->second.variant : ATTN_FLASH2;
}

size_t cu_attention_state_floats_16(int B, int T, int H, int /*KV*/, int hd) {
  return attn_16_flash(hd) ? flash_state_floats(B, T, H, hd)
                           : attn_16_batched_state_floats(B, T, H);
}

template <typename E>
void cu_attention_fwd_16(void *out, float *state, const void *qkv, int B, int T, int H, int KV,
                         int hd) {
  OP("attention_fwd");
  if (B <= 0 || T <= 0 || H <= 0) return;
  if (!attn_16_flash(hd)) {
    attention_fwd_16_batched<E>(out, state, qkv, B, T, H, KV, hd);
    return;
  }
  if (!fl_aligned(out, state, qkv)) return;
  int v = attn_16_variant();
  if (v == ATTN_AUTO) v = attn_auto_pick<E>((E *)out, state, (const E *)qkv, B, T, H, KV, hd);
#if CT_HAVE_CUDNN
  if (v == ATTN_CUDNN) {
    cudnn_fwd<E>((E *)out, state, (const E *)qkv, B, T, H, KV, hd);
    return;
  }
#endif
  if (v == ATTN_CUDNN) v = ATTN_FLASH2; // unreachable: set_variant refuses cudnn without cuDNN
#if CT_HAVE_FLASH3
  if (v == ATTN_FLASH3 && g.cc == 90) {
    float *lse = state;
    E *oc = (E *)(state + flash_lse_floats(B, T, H));
    if (fl3_fwd_launch(std::is_same<E, f16>::value, out, lse, oc, qkv, B, T, H, KV, hd) != 0) {
      if (fl3_fwd2()) CK_LAUNCH(fl3_fwd2_kernel);
      else CK_LAUNCH(fl3_fwd_kernel);
    }
    return;
  }
#endif
  if (v == ATTN_FLASH3) v = ATTN_FLASH2; // not a Hopper GPU (or not built): flash2
  if (v != ATTN_FLASH) fl2_fwd<E>(v, hd, (E *)out, state, (const E *)qkv, B, T, H, KV);
  else if (hd == 64) flash_fwd_launch<64, E>((E *)out, state, (const E *)qkv, B, T, H, KV);
  else flash_fwd_launch<128, E>((E *)out, state, (const E *)qkv, B, T, H, KV);
}

// set: dqkv = the gradient (attention_bwd_set); cuDNN writes it directly, every other variant
// accumulates into dqkv zeroed first.
template <typename E>
void attention_bwd_16(void *dqkv, const void *dout, const void *qkv, const float *state, int B,
                      int T, int H, int KV, int hd, bool set) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  auto zero_first = [&] {
    return !set || CK(cudaMemsetAsync(dqkv, 0, sizeof(E) * (size_t)B * T * (H + 2 * KV) * hd,
                                      g.stream));
  };
  if (!attn_16_flash(hd)) {
    if (zero_first()) attention_bwd_16_batched<E>(dqkv, dout, qkv, state, B, T, H, KV, hd);
    return;
  }
  if (!fl_aligned(dqkv, dout, qkv) || !fl_aligned(state, state, state)) return;
  int v = attn_bwd_pick<E>(B, T, H, KV, hd);
#if CT_HAVE_CUDNN
  if (v == ATTN_CUDNN) {
    cudnn_bwd<E>((E *)dqkv, (const E *)dout, (const E *)qkv, state, B, T, H, KV, hd, set);
    return;
  }
#endif
  if (!zero_first()) return;
#if CT_HAVE_FLASH3
  if (v == ATTN_FLASH3 && g.cc == 90) {
    if (hd == 64) fl3_bwd_launch<64, E>((E *)dqkv, (const E *)dout, (const E *)qkv, state, B, T, H, KV);
    else fl3_bwd_launch<128, E>((E *)dqkv, (const E *)dout, (const E *)qkv, state, B, T, H, KV);
    return;
  }
#endif
  if (v == ATTN_CUDNN || v == ATTN_FLASH3) v = ATTN_FLASH2; // flash3 keeps flash2's state
  if (v != ATTN_FLASH)
    fl2_bwd<E>(v, hd, (E *)dqkv, (const E *)dout, (const E *)qkv, state, B, T, H, KV);
  else if (hd == 64)
    flash_bwd_launch<64, E>((E *)dqkv, (const E *)dout, (const E *)qkv, state, B, T, H, KV);
  else
    flash_bwd_launch<128, E>((E *)dqkv, (const E *)dout, (const E *)qkv, state, B, T, H, KV);
}

template <typename E>
void cu_attention_bwd_16(void *dqkv, const void *dout, const void *qkv, const float *state, int B,
                         int T, int H, int KV, int hd) {
  OP("attention_bwd");
  attention_bwd_16<E>(dqkv, dout, qkv, state, B, T, H, KV, hd, false);
}

template <typename E>
void cu_attention_bwd_set_16(void *dqkv, const void *dout, const void *qkv, const float *state,
                             int B, int T, int H, int KV, int hd) {
  OP("attention_bwd");
  attention_bwd_16<E>(dqkv, dout, qkv, state, B, T, H, KV, hd, true);
}

// ---------------------------------------------------------------------------------------------
// working copies and logits to the host

void cu_cast_params_f32(void *dst, const float *src, size_t n) {
  OP("cast_params");
  if (n && dst != (const void *)src)
    CK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, g.stream));
}

template <typename E> void cu_cast_params_16(void *dst, const float *src, size_t n) {
  OP("cast_params");
  if (!n) return;
  if (n % 8 == 0 && aligned16(dst) && aligned16(src)) {
    cast_f32_16_vec_kernel<E><<<grid_for(n / 8, 256), 256, 0, g.stream>>>((E *)dst, src, n / 8);
    CK_LAUNCH(cast_f32_16_vec_kernel);
    return;
  }
  cast_f32_16_kernel<E><<<grid_for(n, 256), 256, 0, g.stream>>>((E *)dst, src, n);
  CK_LAUNCH(cast_f32_16_kernel);
}

void cu_f32_to_bf16(void *dst, const float *src, size_t n) {
  OP("f32_to_bf16");
  cu_cast_params_16<bf16>(dst, src, n);
}

void cu_bf16_to_f32(float *dst, const void *src, size_t n) {
  OP("bf16_to_f32");
  if (!n) return;
  cast_16_f32_kernel<bf16><<<grid_for(n, 256), 256, 0, g.stream>>>(dst, (const bf16 *)src, n);
  CK_LAUNCH(cast_16_f32_kernel);
}

void cu_to_host_f32_f32(float *dst, const void *src, size_t n) {
  OP("to_host_f32");
  if (!n) return;
  if (CK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, g.stream)))
    CK(cudaStreamSynchronize(g.stream));
}

// Converted on the device into fp32 scratch, in chunks of 16M elements, then copied.
template <typename E> void cu_to_host_f32_16(float *dst, const void *src, size_t n) {
  OP("to_host_f32");
  if (!n) return;
  const size_t chunk = (size_t)1 << 24;
  float *tmp = (float *)scratch(sizeof(float) * (n < chunk ? n : chunk));
  if (!tmp) return;
  for (size_t off = 0; off < n; off += chunk) {
    const size_t m = n - off < chunk ? n - off : chunk;
    cast_16_f32_kernel<E><<<grid_for(m, 256), 256, 0, g.stream>>>(tmp, (const E *)src + off, m);
    if (!CK_LAUNCH(cast_16_f32_kernel)) return;
    if (!CK(cudaMemcpyAsync(dst + off, tmp, m * sizeof(float), cudaMemcpyDeviceToHost, g.stream)))
      return;
    if (!CK(cudaStreamSynchronize(g.stream))) return; // tmp is reused by the next chunk
  }
}

// ---------------------------------------------------------------------------------------------
// graph capture (ops.h: graph_begin .. graph_end, graph_launch). Recording is thread-local, so
// only this thread's launches on g.stream are recorded; an op that would synchronize while
// recording (to_host, scratch growth) fails the capture, which graph_end reports as NULL.

void cu_mark(const char *name) {
  if (!marks.on || g.capturing || !g.ready) return;
  if (!strcmp(name, "step") && ++marks.steps < 4) return;
  if (marks.steps < 4) return;
  cudaEvent_t e;
  if (cudaEventCreate(&e) != cudaSuccess) return;
  cudaEventRecord(e, g.stream);
  marks.pending.push_back({name, e});
  if (marks.pending.size() >= 512) marks.flush();
}

void cu_gemm_sm_target(int n) {
  if (g.blas && cublasSetSmCountTarget(g.blas, n > 0 ? n : 0) != CUBLAS_STATUS_SUCCESS)
    ct_cuda_report("gemm_sm_target", "cublasSetSmCountTarget", "failed", __FILE__, __LINE__);
}

void cu_graph_begin() {
  OP("graph_begin");
  if (CK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal))) g.capturing = 1;
}

void *cu_graph_end() {
  op_scope op_scope_("graph_end");
  if (!op_scope_.ok) return NULL;
  if (!g.capturing) return NULL;
  g.capturing = 0;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  if (!CK(cudaStreamEndCapture(g.stream, &graph))) return NULL;
  const bool ok = CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  return ok ? (void *)exec : NULL;
}

void cu_graph_launch(void *graph) {
  OP("graph_launch");
  CK(cudaGraphLaunch((cudaGraphExec_t)graph, g.stream));
}

void cu_graph_destroy(void *graph) {
  if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

// ---------------------------------------------------------------------------------------------
// vocab-parallel cross-entropy pieces (parallel/tp.c; ops.h has the contract): one block per row,
// the same online max/sum merge as xent_kernel.

template <typename T>
__global__ void xent_stats_kernel(float *stats, const T *logits, const int32_t *tgt, int N, int V,
                                  int Vp) {
  __shared__ float shm[XENT_THREADS / 32], shs[XENT_THREADS / 32];
  const long n = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const T *x = logits + n * Vp;
  float m = -INFINITY, s = 0.0f;
  for (int i = tid; i < V; i += blockDim.x) {
    float v = ld(x + i);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else if (v != -INFINITY) {
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
  __syncthreads();
  if (tid == 0) {
    m = shm[0];
    s = shs[0];
    for (int i = 1; i < XENT_THREADS / 32; i++) ms_merge(m, s, shm[i], shs[i]);
    stats[n] = m;
    stats[N + n] = s;
    stats[2L * N + n] = tgt[n] >= 0 ? ld(x + tgt[n]) : 0.0f;
  }
}

template <typename T>
__global__ void xent_grad_kernel(T *logits, const float *lse, const int32_t *tgt, int V, int Vp,
                                 float grad_scale) {
  const long n = blockIdx.x;
  T *x = logits + n * Vp;
  const float l = lse[n];
  const int t = tgt[n];
  for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
    float v = 0.0f;
    if (i < V && l != INFINITY) {
      v = __fmul_rn(expf(ld(x + i) - l), grad_scale);
      if (i == t) v -= grad_scale;
    }
    st(x + i, v);
  }
}

template <typename act_t>
void cu_xent_stats(float *stats, const void *logits, const int32_t *tgt, int N, int V, int Vp) {
  OP("xent_stats");
  if (N <= 0) return;
  xent_stats_kernel<act_t><<<(unsigned)N, XENT_THREADS, 0, g.stream>>>(
      stats, (const act_t *)logits, tgt, N, V, Vp);
  CK_LAUNCH(xent_stats_kernel);
}

template <typename act_t>
void cu_xent_grad(void *logits, const float *lse, const int32_t *tgt, int N, int V, int Vp,
                  float grad_scale) {
  OP("xent_grad");
  if (N <= 0) return;
  xent_grad_kernel<act_t><<<(unsigned)N, 256, 0, g.stream>>>((act_t *)logits, lse, tgt, V, Vp,
                                                             grad_scale);
  CK_LAUNCH(xent_grad_kernel);
}

// ---------------------------------------------------------------------------------------------
// the table

template <typename A> ct_ops make_table() {
  const bool b16 = is16<A>(), h16 = std::is_same<A, f16>::value;
  ct_ops t;
  memset(&t, 0, sizeof t);
  t.name = h16 ? "cuda-fp16" : b16 ? "cuda-bf16" : "cuda";
  t.dtype = h16 ? "fp16" : b16 ? "bf16" : "fp32";
  t.act_bytes = (int)sizeof(A);
  t.alloc = cu_alloc;
  t.free = cu_free;
  t.zero = cu_zero;
  t.to_device = cu_to_device;
  t.to_host = cu_to_host;
  t.cast_params = cu_cast_params_f32;
  t.to_host_f32 = cu_to_host_f32_f32;
  t.f32_to_bf16 = cu_f32_to_bf16;
  t.bf16_to_f32 = cu_bf16_to_f32;
  t.copy2d = cu_copy2d;
  t.embed_fwd = cu_embed_fwd<A>;
  t.embed_bwd = cu_embed_bwd<A>;
  t.flagged_rows = cu_flagged_rows;
  t.take_rows = cu_take_rows;
  t.scatter_add_rows = cu_scatter_add_rows;
  t.layernorm_fwd = cu_layernorm_fwd<A>;
  t.layernorm_bwd = cu_layernorm_bwd<A>;
  t.rmsnorm_fwd = cu_rmsnorm_fwd<A>;
  t.rmsnorm_bwd = cu_rmsnorm_bwd<A>;
  t.add_norm_fwd = cu_add_norm_fwd<A>;
  t.matmul_fwd = cu_matmul_fwd<A>;
  t.matmul_bwd = cu_matmul_bwd<A>;
  t.rope_fwd = cu_rope_fwd<A>;
  t.rope_bwd = cu_rope_bwd<A>;
  t.attention_state_floats = cu_attention_state_floats;
  t.attention_fwd = cu_attention_fwd;
  t.attention_bwd = cu_attention_bwd;
  if constexpr (is16<A>()) { // only the 16-bit types instantiate these
    t.cast_params = cu_cast_params_16<A>;
    t.to_host_f32 = cu_to_host_f32_16<A>;
    t.attention_state_floats = cu_attention_state_floats_16;
    t.attention_fwd = cu_attention_fwd_16<A>;
    t.attention_bwd = cu_attention_bwd_16<A>;
    t.attention_bwd_set = cu_attention_bwd_set_16<A>;
  }
  t.attention_cached = cu_attention_cached<A>;
  t.gelu_fwd = cu_gelu_fwd<A>;
  t.gelu_bwd = cu_gelu_bwd<A>;
  t.matmul_gelu_fwd = cu_matmul_gelu_fwd<A>;
  t.matmul_dgelu_bwd = cu_matmul_dgelu_bwd<A>;
  t.swiglu_fwd = cu_swiglu_fwd<A>;
  t.swiglu_bwd = cu_swiglu_bwd<A>;
  t.add_fwd = cu_add_fwd<A>;
  t.xent_fwd_bwd = cu_xent_fwd_bwd<A>;
  t.adamw = cu_adamw;
  t.adamw_multi = cu_adamw_multi;
  t.sumsq = cu_sumsq;
  t.scale = cu_scale;
  t.mark = cu_mark;
  t.gemm_sm_target = cu_gemm_sm_target;
  t.graph_begin = cu_graph_begin;
  t.graph_end = cu_graph_end;
  t.graph_launch = cu_graph_launch;
  t.graph_destroy = cu_graph_destroy;
  t.xent_stats = cu_xent_stats<A>;
  t.xent_grad = cu_xent_grad<A>;
  t.mem_peak = cu_mem_peak;
  ct_cuda_decode_table(&t); // batched-inference ops and devices: kernels/cuda/decode.cu
  return t;
}
const ct_ops cuda_ops = make_table<float>();
const ct_ops cuda_bf16_ops = make_table<bf16>();
const ct_ops cuda_fp16_ops = make_table<f16>();

int set_variant(const char *op, const char *v) {
  if (!op || !v) return -1;
  if (!strcmp(op, "attention")) {
    if (!strcmp(v, "default")) g.attn_variant = ATTN_DEFAULT;
    else if (!strcmp(v, "batched")) g.attn_variant = ATTN_BATCHED;
    else if (!strcmp(v, "perhead")) g.attn_variant = ATTN_PERHEAD;
    else if (!strcmp(v, "flash")) g.attn_variant = ATTN_FLASH;
    else if (!strcmp(v, "flash2")) g.attn_variant = ATTN_FLASH2;
    else if (!strcmp(v, "flash2b")) g.attn_variant = ATTN_FLASH2B;
    else if (!strcmp(v, "auto")) g.attn_variant = ATTN_AUTO;
#if CT_HAVE_CUDNN
    else if (!strcmp(v, "cudnn")) g.attn_variant = ATTN_CUDNN;
#endif
#if CT_HAVE_FLASH3
    else if (!strcmp(v, "flash3")) g.attn_variant = ATTN_FLASH3;
#endif
    else return -1;
    return 0;
  }
  if (!strcmp(op, "matmul")) {
    if (!strcmp(v, "lt") || !strcmp(v, "default")) g.matmul_lt = g.lt_tune = 1;
    else if (!strcmp(v, "lt-first")) g.matmul_lt = 1, g.lt_tune = 0;
    else if (!strcmp(v, "gemmex")) g.matmul_lt = 0;
    else return -1;
    return 0;
  }
  // two-way switches: {op, optimized name, reference name, flag}
  struct sw {
    const char *op, *on, *off;
    int *flag;
  } const sws[] = {{"mlp", "epilogue", "separate", &g.gelu_epilogue},
                   {"norm_bwd", "fused", "twopass", &g.norm_bwd_fused},
                   {"add_norm", "fused", "separate", &g.add_norm_fused},
                   {"xent", "smem", "rowloop", &g.xent_smem},
                   {"embed_bwd", "sorted", "blocks", &g.embed_sorted}};
  for (const sw &w : sws) {
    if (strcmp(op, w.op)) continue;
    if (!strcmp(v, w.on) || !strcmp(v, "default")) *w.flag = 1;
    else if (!strcmp(v, w.off)) *w.flag = 0;
    else return -1;
    return 0;
  }
  return -1;
}

void release() {
  lt_release();
#if CT_HAVE_CUDNN
  ct_cudnn_attn_release(g.device);
#endif
  for (auto it = attn_auto.begin(); it != attn_auto.end();)
    it = (*it).first[0] == g.device ? attn_auto.erase(it) : std::next(it);
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

// decode.cu's split-K residual products (CT_DECODE_SPLITK): P[j] (N, OC, fp32) = inp[:, jK ..
// jK + K) w[:, jK .. jK + K)^T for j < s, K = IC / s, one strided batched GEMM, so a product of a
// few dozen rows runs s times the thread blocks. Returns 0 on success.
template <typename T>
bool splitk_gemm(float *P, const void *inp, const void *w, int N, int IC, int OC, int s) {
  const int K = IC / s;
  return gemm<T, float>(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, K, 1.0f, (const T *)w, IC, K,
                        (const T *)inp, IC, K, 0.0f, P, OC, (long long)N * OC, s);
}
extern "C" int ct_cuda_splitk_gemm(float *P, const void *inp, const void *w, int N, int IC, int OC,
                                   int s, int fp16) {
  const char *prev = g.op;
  g.op = "matmul_add_fwd split-K";
  const bool ok = fp16 ? splitk_gemm<f16>(P, inp, w, N, IC, OC, s)
                       : splitk_gemm<bf16>(P, inp, w, N, IC, OC, s);
  g.op = prev;
  return ok ? 0 : -1;
}

extern "C" const ct_ops *ct_ops_cuda(void) { return &cuda_ops; }

extern "C" const ct_ops *ct_ops_cuda_bf16(void) { return &cuda_bf16_ops; }

extern "C" const ct_ops *ct_ops_cuda_fp16(void) { return &cuda_fp16_ops; }

extern "C" int ct_cuda_set_variant(const char *op, const char *variant) {
  return set_variant(op, variant);
}

// CT_CUDA_VIRTUAL_DEVICES=N (N >= 1, for tests): the backend presents N devices, device i
// running on visible GPU i % (the visible count), each with its own stream, handles and
// scratch as a real device has; so inference across devices (--device_map) runs its
// multi-device path on one GPU. Unset or 0: the devices are the visible GPUs.
extern "C" int ct_cuda_device_count(void); // the visible GPUs (device_query.cu)
static int physical_count() {
  static int n = -1;
  if (n < 0) n = ct_cuda_device_count();
  return n;
}
static int virtual_count() {
  static int n = -1;
  if (n < 0) {
    const char *v = getenv("CT_CUDA_VIRTUAL_DEVICES");
    n = v && atoi(v) > 0 ? atoi(v) : 0;
    if (n > 16) n = 16;
  }
  return n;
}
extern "C" int ct_cuda_backend_devices(void) {
  const int n = physical_count();
  return n > 0 && virtual_count() > 0 ? virtual_count() : n;
}
extern "C" int ct_cuda_physical_device(int device) {
  const int n = physical_count();
  return virtual_count() > 0 && n > 0 && device >= 0 ? device % n : device;
}

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
  n = ct_cuda_backend_devices();
  if (device < 0 || device >= n)
    INIT_FAIL("CUDA device %d does not exist (%d visible; check CUDA_VISIBLE_DEVICES)", device, n);
  const int phys = ct_cuda_physical_device(device);
  if ((e = cudaSetDevice(phys)) != cudaSuccess)
    INIT_FAIL("cudaSetDevice(%d): %s", phys, cudaGetErrorString(e));
  e = cudaDeviceGetAttribute(&g.num_sms, cudaDevAttrMultiProcessorCount, phys);
  if (e != cudaSuccess)
    INIT_FAIL("cudaDeviceGetAttribute(MultiProcessorCount): %s", cudaGetErrorString(e));
  int ccmaj = 0, ccmin = 0;
  e = cudaDeviceGetAttribute(&ccmaj, cudaDevAttrComputeCapabilityMajor, phys);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&ccmin, cudaDevAttrComputeCapabilityMinor, phys);
  if (e != cudaSuccess)
    INIT_FAIL("cudaDeviceGetAttribute(ComputeCapability): %s", cudaGetErrorString(e));
  g.cc = ccmaj * 10 + ccmin;
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
  prof.on = env_on("CT_CUDA_PROFILE");
  marks.on = env_on("CT_STEP_MARKS");
  const char *attn = getenv("CT_CUDA_ATTN");
  g.attn_variant = ATTN_DEFAULT;
  if (attn && attn[0] && set_variant("attention", attn) != 0)
    INIT_FAIL("CT_CUDA_ATTN=%s: unknown attention variant (batched, perhead, flash, flash2, flash2b, auto%s)",
              attn, CT_HAVE_CUDNN ? ", cudnn" : "");
  const char *lt_env = getenv("CT_CUDA_LT"); // unset or 1: lt; "first": lt-first; else gemmex
  g.lt_tune = !(lt_env && !strcmp(lt_env, "first"));
  g.matmul_lt = !lt_env || env_on("CT_CUDA_LT") || !g.lt_tune;
  g.gelu_epilogue = g.norm_bwd_fused = g.add_norm_fused = g.xent_smem = g.embed_sorted = 1;
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

// Timing of a kernel launched outside an OP scope (kernels/cuda/decode.cu), into the same
// profile: begin returns an event recorded on the stream (NULL when not profiling, inside an op
// or while a graph is being recorded); end records the second and files them under key.
extern "C" void *ct_cuda_prof_begin(void) {
  if (!prof.on || g.capturing || prof.depth) return NULL;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(g.stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
    return NULL;
  cudaEvent_t a = prof.take();
  cudaEventRecord(a, g.stream);
  return (void *)a;
}
extern "C" void ct_cuda_prof_end(void *a, const char *key) {
  if (!a) return;
  prof_rec r;
  snprintf(r.key, sizeof r.key, "%s", key);
  r.a = (cudaEvent_t)a;
  r.b = prof.take();
  cudaEventRecord(r.b, g.stream);
  prof.pending.push_back(r);
  if (prof.pending.size() >= 4096) prof.flush();
}

extern "C" void *ct_cuda_stream(void) { return g.ready ? (void *)g.stream : NULL; }

extern "C" void ct_cuda_shutdown(void) {
  if (!g.ready) return;
  ct_cuda_release_other_devices();
  cudaStreamSynchronize(g.stream);
  if (prof.on) prof.report();
  if (marks.on) marks.report();
  ct_cuda_decode_timeline();
  release();
}

// ---------------------------------------------------------------------------------------------
// several devices in one process (inference across GPUs: trainer/model.c's ct_infer). Each
// device keeps its own state (stream, cuBLAS and cuBLASLt handles, scratch); `g` and `lt` always
// hold the current device's and ct_cuda_use_device swaps them, so every op above runs unchanged
// on whichever device is current. The sticky error is the process's: it follows the swap.

namespace {
const int MAX_DEVICES = 16;
cuda_state dev_g[MAX_DEVICES];
lt_api dev_lt[MAX_DEVICES];
} // namespace

extern "C" int ct_cuda_use_device(int device) {
  if (!g.ready) return -1;
  if (device == g.device) return 0;
  g.op = "set_device";
  if (device < 0 || device >= MAX_DEVICES) {
    record_error("ct_cuda_use_device", "device index out of range", __FILE__, __LINE__);
    return -1;
  }
  const int prev = g.device, failed = g.failed;
  char err[sizeof g.err];
  memcpy(err, g.err, sizeof err);
  dev_g[prev] = g;
  dev_lt[prev] = lt;
  if (dev_g[device].ready) {
    g = dev_g[device];
    lt = dev_lt[device];
    dev_g[device].ready = 0; // the live copy is g now
    if (cudaSetDevice(ct_cuda_physical_device(device)) != cudaSuccess) cudaGetLastError();
  } else {
    g = cuda_state();
    lt = lt_api();
    char why[512];
    if (ct_cuda_init(device, why, sizeof why) != 0) {
      g = dev_g[prev];
      lt = dev_lt[prev];
      dev_g[prev].ready = 0;
      cudaSetDevice(ct_cuda_physical_device(prev));
      record_error("ct_cuda_use_device", why, __FILE__, __LINE__);
      return -1;
    }
  }
  if (failed && !g.failed) {
    g.failed = 1;
    memcpy(g.err, err, sizeof err);
  }
  return 0;
}

// Shutdown of every device but the current one (ct_cuda_shutdown releases that one).
extern "C" void ct_cuda_release_other_devices(void) {
  const cuda_state cur = g;
  const lt_api cur_lt = lt;
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!dev_g[d].ready || d == cur.device) continue;
    g = dev_g[d];
    lt = dev_lt[d];
    cudaSetDevice(ct_cuda_physical_device(d));
    cudaStreamSynchronize(g.stream);
    release();
    dev_g[d] = cuda_state();
  }
  g = cur;
  lt = cur_lt;
  cudaSetDevice(ct_cuda_physical_device(g.device));
}

// Records an error from another file's op (decode.cu) in the sticky state.
extern "C" void ct_cuda_report(const char *op, const char *call, const char *why, const char *file,
                               int line) {
  g.op = op;
  record_error(call, why, file, line);
}
