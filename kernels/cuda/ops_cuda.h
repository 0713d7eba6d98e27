/* kernels/cuda/ops_cuda.h — the CUDA backend of the op table (kernels/ops.h), C ABI.
 *
 * Lifecycle (one process per GPU, one host thread issuing ops):
 *   ct_cuda_init(device)  once, before any op: selects the device, creates the backend's stream
 *                         and cuBLAS handle. Calling it again with the same device is a no-op.
 *   ct_ops_cuda()         the fp32 op table; every op is queued on the backend's one stream.
 *   ct_ops_cuda_bf16()    the bf16 mixed-precision table: same stream, handle and scratch.
 *   ct_ops_cuda_fp16()    the fp16 mixed-precision table (the same ops on __half), likewise.
 *   ct_cuda_check()       once per step: synchronizes and reports the first error any op hit.
 *   ct_cuda_shutdown()    frees the backend's scratch, handle and stream (not user buffers).
 *
 * Errors: ops return void, so the first failing CUDA / cuBLAS call is recorded in a sticky
 * per-process error state (op name, call, CUDA's message, source line). It is never cleared:
 * after a CUDA error the context is usually unusable anyway. `alloc` is the exception: it
 * returns NULL on failure (out of memory) without poisoning the state.
 *
 * Pointers: in the fp32 table ("cuda") every activation and weight (`void *` in ops.h) is fp32
 * device memory, like the CPU backend. In the bf16 table ("cuda-bf16") they are __nv_bfloat16
 * device memory (working weights made by cast_params from the fp32 master, round to nearest
 * even); parameter gradients, norm statistics, losses and optimizer state stay fp32. bf16 math:
 * matmuls and attention products accumulate in fp32 (cuBLAS, compute 32F); norms, softmax,
 * cross-entropy and the elementwise ops compute in fp32 from bf16 loads and round once on store.
 * bf16 attention state: the batched variant keeps P as bf16 (B,H,T,T) (half of B*H*T*T floats);
 * the flash variants keep the log-sum-exp (B,H,T) and a bf16 copy of the output (N, H*hd); so
 * does cudnn (its log-sum-exp in natural-log units, flash's in log2 units).
 * The fp16 table ("cuda-fp16", dtype "fp16") is the bf16 table with __half in place of
 * __nv_bfloat16 everywhere (cuBLAS / cuBLASLt CUDA_R_16F with fp32 compute, flash attention through
 * the f16 form of mma.sync, the same state layouts), for GPUs before compute capability 8.0 and
 * for users who ask. cast_params rounds to nearest even with IEEE overflow: |x| >= 65520 becomes
 * +-inf, as does any fp16 result of an op that overflows. Nothing is clamped or saturated, so an
 * inf / NaN in any fp16 intermediate reaches the fp32 parameter gradients, where the trainer's
 * dynamic loss scaling finds it and skips the step. With the loss scaled into grad_scale, xent's
 * gradient is bounded by grad_scale (64 for a 2^16 scale over 1024 tokens).
 * `to_host` synchronizes; `to_device` returns after the copy is done (the host buffer may be
 * reused). `to_host_f32` converts on the device in chunks and synchronizes.
 *
 * Environment: CT_CUDA_TF32=1 lets cuBLAS use TF32 tensor cores for fp32 matmuls (faster,
 * ~1e-3 relative error); default off, for exactness against the CPU reference.
 * CT_CUDA_SYNC=1 synchronizes after every op, so an asynchronous fault names its op (debug).
 * CT_CUDA_ATTN selects the attention variant: fp32 table "batched" (default, all heads in one
 * batched gemm call) or "perhead" (a per-head loop, the first variant); bf16 and fp16 tables
 * "flash2" (default: our FlashAttention-2-style kernels, head dims 64 and 128 on compute
 * capability 8.0+; other head dims and older GPUs use batched; ldmatrix operands, loop-invariant
 * fragments in registers, one barrier per tile, causal tile skipping, 4-warp blocks), "flash2b"
 * (the same kernels in 8-warp, 128-row blocks), "flash" (the first flash kernels; same state as
 * flash2, so either backward reads either's forward state) or "batched" (16-bit batched gemms,
 * P materialized); in builds with cuDNN attention (CT_HAVE_CUDNN) also "cudnn" (cuDNN's fused
 * SDPA through the cudnn-frontend, kernels/cuda/attention_cudnn.cpp; the same state sizes, its
 * own lse units, so forward and backward must run the same variant) and "auto" (per shape,
 * flash2 or cudnn, whichever forward + backward was faster when timed on the shape's first
 * forward; flash2 in builds without cuDNN; CT_CUDA_ATTN_LOG=1 prints each decision). cudnn's
 * backward accumulates dQ with atomics (not bit-reproducible); CT_CUDA_CUDNN_DETERMINISTIC=1
 * asks cuDNN for its deterministic algorithm, which on Hopper with cuDNN < 9.25 needs a
 * (B, H, T, T) 16-bit workspace.
 * CT_CUDA_ATTN_SCRATCH_MB (default 256) caps the scratch the batched
 * variants use for scores / dP: heads are processed in chunks that fit. CT_CUDA_LT=0 turns off
 * cuBLASLt (loaded at run time) for the bf16 / fp16 matmul_fwd with a bias (its BIAS epilogue;
 * default on).
 */
#ifndef CT_OPS_CUDA_H
#define CT_OPS_CUDA_H

#include <stddef.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Selects `device` (an index among the visible devices) and creates the stream and cuBLAS
 * handle. Returns 0, or -1 with a message in err (e.g. no CUDA device, bad index). */
int ct_cuda_init(int device, char *err, size_t errcap);

/* The CUDA op table. Valid after ct_cuda_init; ops called before it record an error. */
const ct_ops *ct_ops_cuda(void);

/* The bf16 table (see Pointers above). Valid after ct_cuda_init. */
const ct_ops *ct_ops_cuda_bf16(void);

/* The fp16 table (see Pointers above): dtype "fp16", act_bytes 2. Valid after ct_cuda_init. */
const ct_ops *ct_ops_cuda_fp16(void);

/* Switches a variant at run time, as the environment does at init (tests and benchmarks compare
 * variants in one process; kernels/registry.c maps the config's names onto these): op
 * "attention" with "default", "batched", "perhead", "flash", "flash2", "flash2b", "auto",
 * "cudnn" (builds with cuDNN attention only); "matmul" with
 * "lt" (default) or "gemmex"; "mlp" epilogue|separate, "norm_bwd" fused|twopass, "add_norm"
 * fused|separate, "xent" smem|rowloop, "embed_bwd" sorted|blocks (the first is the default;
 * "default" also names it). attention_state_floats follows the attention variant, so switch it
 * only while no attention state is live. Returns 0, or -1 if unknown. */
int ct_cuda_set_variant(const char *op, const char *variant);

/* Waits for all queued work. Returns 0 if no op has failed so far, else -1 with the first
 * error's message ("cuda op <op>: <call> failed: <reason> (<file>:<line>)"). */
int ct_cuda_check(char *err, size_t cap);

/* The backend's stream (a cudaStream_t), for code that must order its own work with the ops
 * (e.g. NCCL collectives). NULL before ct_cuda_init. */
void *ct_cuda_stream(void);

/* Releases the backend's own resources; buffers from `alloc` stay the caller's to free. */
void ct_cuda_shutdown(void);

/* Several devices in one process (inference across GPUs): makes `device` current for every
 * later op, with its own stream, cuBLAS / cuBLASLt handles and scratch (created on first use,
 * as ct_cuda_init does). Needs ct_cuda_init first. Returns 0, or -1 with the error recorded. */
int ct_cuda_use_device(int device);
/* The devices the backend presents (its tables' device_count): the visible GPUs, or with
 * CT_CUDA_VIRTUAL_DEVICES=N (for tests) N devices, device i on GPU i % (visible GPUs), each with
 * its own state as above, so the multi-device inference path runs on one GPU (the GPUs
 * themselves are still what ct_cuda_device_count, device_query.cu, counts).
 * ct_cuda_physical_device maps a device to its GPU (the identity without the variable). */
int ct_cuda_backend_devices(void);
int ct_cuda_physical_device(int device);
/* Frees the state of every device but the current one (ct_cuda_shutdown calls it). */
void ct_cuda_release_other_devices(void);
/* Records an error in the sticky state (for ops defined outside ops_cuda.cu). */
void ct_cuda_report(const char *op, const char *call, const char *why, const char *file, int line);
/* decode.cu's split-K residual products: s fp32 partials (s, N, OC) of inp (N, IC) w (OC, IC)^T
 * over the s slices of IC / s; 0 on success */
int ct_cuda_splitk_gemm(float *P, const void *inp, const void *w, int N, int IC, int OC, int s,
                        int fp16);
/* Fills the batched-inference and device entries of a table (kernels/cuda/decode.cu);
 * the table's act_bytes and dtype must be set. */
void ct_cuda_decode_table(ct_ops *t);
/* Builds with -DCT_DECODE_TIMELINE: prints the decode step's kernel timeline (decode.cu); nothing
 * otherwise. ct_cuda_shutdown calls it. */
void ct_cuda_decode_timeline(void);
/* CT_CUDA_PROFILE timing of a kernel launched outside an op scope (kernels/cuda/decode.cu):
 * begin returns an event handle or NULL (not profiling, inside an op, or capturing a graph);
 * end files the time since it under key (at most 63 characters). */
void *ct_cuda_prof_begin(void);
void ct_cuda_prof_end(void *begin, const char *key);
/* How many decode_layers kernels were launched or recorded into graphs (tests). */
long ct_cuda_decode_layers_launches(void);
/* How many attention_decode_rope kernels were launched or recorded into graphs (tests). */
long ct_cuda_attention_decode_rope_launches(void);
/* How many l2_hint prefetches were handed to a decode kernel (tests). */
long ct_cuda_l2_hints_used(void);
/* How many staged decode GEMVs (CT_DECODE_STAGE=1) were launched or recorded into graphs (tests). */
long ct_cuda_gemv_staged_launches(void);
/* How many tensor-core decode GEMVs (gemv_mma_kernel) were launched or recorded into graphs (tests). */
long ct_cuda_gemv_mma_launches(void);
/* How many split-K residual products (CT_DECODE_SPLITK) were launched or recorded (tests). */
long ct_cuda_splitk_launches(void);
/* How many decode products of 9-64 rows (gemm_rows_kernel) were launched or recorded (tests). */
long ct_cuda_gemm_rows_launches(void);
/* How many attention_decode_oproj kernels were launched or recorded into graphs (tests). */
long ct_cuda_attention_oproj_launches(void);
/* How many attention_decode_qkv kernels were launched or recorded into graphs (tests). */
long ct_cuda_attention_qkv_launches(void);
/* Of them, in the tail form (CT_DECODE_QKV_ATT=2: qkv_att_tail_kernel). */
long ct_cuda_attention_qkv_tail_launches(void);
/* How many head GEMVs with the argmax in their tail (norm_matmul_argmax) were launched or
 * recorded into graphs (tests). */
long ct_cuda_head_argmax_launches(void);
/* How many one-row GEMVs ran in their one-task form (a row in one round, a task a warp; gemv_kernel
 * with MULTI false) (tests). */
long ct_cuda_gemv_one_launches(void);
/* How many attention_decode_rope kernels ran as thread block clusters (CT_DECODE_CLUSTER=1; tests). */
long ct_cuda_attention_cluster_launches(void);
/* How many attention_decode_rope kernels were launched with their blocks alone on their
 * multiprocessors (CT_DECODE_ATT_ALONE), and apart from the next two GEMVs (CT_DECODE_ATT_APART;
 * att_pad in decode.cu), and how many GEMV launches were padded to stay apart (tests). */
long ct_cuda_attention_alone_launches(void);
long ct_cuda_attention_apart_launches(void);
long ct_cuda_apart_gemv_launches(void);
/* attention launches whose split rows went to block 0 by st.async (CT_DECODE_ATT_PUSH) */
long ct_cuda_attention_push_launches(void);
/* cluster attention launches whose merge's second barrier was relaxed (CT_DECODE_ATT_RELAX) */
long ct_cuda_attention_relax_launches(void);
/* cluster attention launches with the heads split (two warps a split: CT_DECODE_ATT_HS) */
long ct_cuda_attention_hs_launches(void);
/* How many attention_decode_blk kernels (attention_decode for 9+ rows, a block per row and kv head)
 * were launched or recorded into graphs (tests). */
long ct_cuda_attention_blk_launches(void);

#ifdef __cplusplus
}
#endif

#endif
