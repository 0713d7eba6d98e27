/* kernels/cuda/attention_cudnn.h — cuDNN fused attention (SDPA) for the 16-bit CUDA tables, C ABI.
 *
 * Built only when meson finds the cudnn-frontend headers (CT_HAVE_CUDNN in ct_build_config.h);
 * kernels/cuda/ops_cuda.cu calls it for the attention variants "cudnn" and "auto".
 *
 * Layouts (ctrain's, see kernels/ops.h), all row-major, N = B*T rows:
 *   qkv  (N, (H + 2*KV)*hd) 16-bit: [H q heads | KV k heads | KV v heads]; query head h uses kv
 *        head h / (H/KV). cuDNN reads q, k and v in place through strides, so GQA needs no copy.
 *   out  (N, H*hd) 16-bit.
 *   stats (B, H, T) fp32: cuDNN's softmax statistics, the natural-log log-sum-exp of each score
 *        row (max + log sum exp). The flash kernels keep log2 units instead, so a forward state of
 *        one cannot feed the other's backward; ops_cuda.cu runs both halves of a step with the
 *        same backend.
 *   dqkv_tmp (N, (H + 2*KV)*hd) 16-bit, OVERWRITTEN with dq, dk and dv (cuDNN has no accumulate;
 *        the caller adds it into the real gradient).
 * Causal (top-left diagonal), scale 1/sqrt(hd), fp32 softmax and accumulation, any T.
 *
 * Graphs are built once per (device, direction, B, T, H, KV, hd, dtype) and kept until
 * ct_cudnn_attn_shutdown; building takes milliseconds to seconds, executing does not rebuild.
 * ct_cudnn_attn_plan builds (and may allocate through cuDNN): call it outside CUDA-graph
 * capture. Execution only launches work on the given stream, so it may be captured.
 * Every call returns 0, or -1 with a message in err.
 */
#ifndef CT_ATTENTION_CUDNN_H
#define CT_ATTENTION_CUDNN_H

#include <stddef.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_cudnn_attn_shape {
  int device;            /* CUDA device the graph runs on */
  int B, T, H, KV, hd;   /* hd: 64 or 128 are what ctrain tests; cuDNN takes multiples of 8 */
  int fp16;              /* 1: __half, 0: __nv_bfloat16 */
} ct_cudnn_attn_shape;

/* Version of the cuDNN library loaded at run time (cudnnGetVersion, e.g. 91400) and of the
 * cudnn-frontend headers the build used (e.g. 13200). */
size_t ct_cudnn_attn_runtime_version(void);
int ct_cudnn_attn_frontend_version(void);

/* Finds the forward (bwd = 0) or backward (bwd = 1) graph of shape s, building it when `build`
 * is set, and returns the workspace its execution needs. -1 when cuDNN cannot run the shape, or
 * the graph is missing and build = 0 (the message says why). Execution calls on a shape that has
 * no graph build it; pass build = 0 where building is not allowed (CUDA-graph capture). */
int ct_cudnn_attn_plan(const ct_cudnn_attn_shape *s, int bwd, int build, size_t *workspace_bytes,
                       char *err, size_t errcap);

/* out = attention(qkv); stats written (see above). ws: ct_cudnn_attn_plan(s, 0)'s bytes. */
int ct_cudnn_attn_fwd(cudaStream_t stream, const ct_cudnn_attn_shape *s, void *out, float *stats,
                      const void *qkv, void *ws, char *err, size_t errcap);

/* dqkv_tmp = gradient w.r.t. qkv (overwritten) from dout, qkv, the forward's output o and its
 * stats. ws: ct_cudnn_attn_plan(s, 1)'s bytes. */
int ct_cudnn_attn_bwd(cudaStream_t stream, const ct_cudnn_attn_shape *s, void *dqkv_tmp,
                      const void *dout, const void *qkv, const void *o, const float *stats,
                      void *ws, char *err, size_t errcap);

/* 1 when the backward graph of s runs cuDNN's deterministic algorithm (no atomics), 0 when that
 * was not available and the default one is used, -1 when s has no backward graph yet. */
int ct_cudnn_attn_bwd_deterministic(const ct_cudnn_attn_shape *s);

/* Drops the cached graphs and the cuDNN handle of `device` (every device when device < 0). */
void ct_cudnn_attn_release(int device);

#ifdef __cplusplus
}
#endif

#endif
