/* kernels/cuda/ops_cuda.h — the CUDA backend of the op table (kernels/ops.h), C ABI.
 *
 * Lifecycle (one process per GPU, one host thread issuing ops):
 *   ct_cuda_init(device)  once, before any op: selects the device, creates the backend's stream
 *                         and cuBLAS handle. Calling it again with the same device is a no-op.
 *   ct_ops_cuda()         the op table; every op is queued on the backend's one stream.
 *   ct_cuda_check()       once per step: synchronizes and reports the first error any op hit.
 *   ct_cuda_shutdown()    frees the backend's scratch, handle and stream (not user buffers).
 *
 * Errors: ops return void, so the first failing CUDA / cuBLAS call is recorded in a sticky
 * per-process error state (op name, call, CUDA's message, source line). It is never cleared:
 * after a CUDA error the context is usually unusable anyway. `alloc` is the exception: it
 * returns NULL on failure (out of memory) without poisoning the state.
 *
 * Pointers: in this version every activation and weight (`void *` in ops.h) is fp32 device
 * memory, like the CPU backend, so model code runs unchanged on either table. `to_host`
 * synchronizes; `to_device` returns after the copy is done (the host buffer may be reused).
 *
 * Environment: CT_CUDA_TF32=1 lets cuBLAS use TF32 tensor cores for fp32 matmuls (faster,
 * ~1e-3 relative error); default off, for exactness against the CPU reference.
 * CT_CUDA_SYNC=1 synchronizes after every op, so an asynchronous fault names its op (debug).
 * CT_CUDA_ATTN=perhead selects the first attention variant (a per-head loop of batched gemms;
 * the default batches all heads in one call). CT_CUDA_ATTN_SCRATCH_MB (default 256) caps the
 * scratch attention backward uses for dP: heads are processed in chunks that fit.
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

/* Waits for all queued work. Returns 0 if no op has failed so far, else -1 with the first
 * error's message ("cuda op <op>: <call> failed: <reason> (<file>:<line>)"). */
int ct_cuda_check(char *err, size_t cap);

/* The backend's stream (a cudaStream_t), for code that must order its own work with the ops
 * (e.g. NCCL collectives). NULL before ct_cuda_init. */
void *ct_cuda_stream(void);

/* Releases the backend's own resources; buffers from `alloc` stay the caller's to free. */
void ct_cuda_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif
