/* kernels/cuda/flash_hopper.h — the Hopper (sm_90a, wgmma) attention ("flash3"), forward and
 * backward, built only when the build targets compute capability 9.0 (CT_HAVE_FLASH3). */
#ifndef CT_FLASH_HOPPER_H
#define CT_FLASH_HOPPER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Causal attention forward of qkv rows (B, T, (H + 2 KV) hd) into out (B, T, H hd), writing
 * flash2's state: lse (B, H, T) in log2 units and ocopy (a copy of out). fp16 = 0: bf16 data.
 * Queued on `stream` (a cudaStream_t). 0 when queued, -1 for a head dim other than 64 and 128,
 * -2 for a CUDA error (cudaGetLastError has it). Needs a compute capability 9.0 device. */
int ct_fl3_fwd(int fp16, void *out, float *lse, void *ocopy, const void *qkv, int B, int T, int H,
               int KV, int hd, void *stream);

/* Forward form 2 (the default at every shape: ops_cuda.cu's fl3_fwd2; see
 * flash_hopper.cu's STATUS at fl3_fwd2_kernel): the same causal attention forward and the same
 * outputs (out, lse, ocopy) as ct_fl3_fwd, with a producer warp loading Q, K and V by TMA into a
 * 2-stage mbarrier ring and 128-key tiles whose QK^T overlaps the previous tile's softmax. Returns as ct_fl3_fwd, and -1
 * too where the driver has no tensor-map encoder (the caller then uses ct_fl3_fwd). */
int ct_fl3_fwd2(int fp16, void *out, float *lse, void *ocopy, const void *qkv, int B, int T, int H,
                int KV, int hd, void *stream);

/* The dK / dV half of the backward: adds dK and dV into the key and
 * value columns of dqkv rows (B, T, (H + 2 KV) hd) from dout (B, T, H hd), qkv, the forward's lse
 * (B, H, T) and D = rowsum(dout * out) (B, H, T). Returns as ct_fl3_fwd. */
int ct_fl3_bwd_dkdv(int fp16, void *dqkv, const void *dout, const void *qkv, const float *lse,
                    const float *D, int B, int T, int H, int KV, int hd, void *stream);

/* The dQ half: adds dQ into the query columns of dqkv, from the same inputs. */
int ct_fl3_bwd_dq(int fp16, void *dqkv, const void *dout, const void *qkv, const float *lse,
                  const float *D, int B, int T, int H, int KV, int hd, void *stream);

/* Floats of the fp32 workspace ct_fl3_bwd takes: B * H * hd * (T rounded up to 64). */
size_t ct_fl3_bwd_ws_floats(int B, int T, int H, int hd);

/* The whole backward in one pass over the key blocks (5 GEMMs a tile instead of the two halves'
 * 7): adds dK, dV and dQ into dqkv from the same inputs as the halves. ws (caller-owned,
 * ct_fl3_bwd_ws_floats floats, 16-byte aligned) is zeroed here on `stream`, collects dQ with fp32
 * atomics, and a second kernel adds it, scaled, into the query columns: dQ's bits may differ
 * from run to run. Returns as ct_fl3_fwd. */
int ct_fl3_bwd(int fp16, void *dqkv, float *ws, const void *dout, const void *qkv,
               const float *lse, const float *D, int B, int T, int H, int KV, int hd, void *stream);

/* Backward form 2 (the default; CT_FLASH3_BWD=1 asks for form 1, see ops_cuda.cu's fl3_bwd2):
 * the whole backward in one pass over 128-key blocks with a producer warp that loads Q / dO by
 * TMA into a 2-stage ring, dQ added as fp32 bulk reductions into ws (ct_fl3_bwd_ws_floats floats,
 * zeroed here on `stream`) and then, scaled, into dqkv: dQ's bits may differ from run to run.
 * Same inputs and accumulation as ct_fl3_bwd. Returns as ct_fl3_fwd, and -1 too where the driver
 * has no tensor-map encoder (the caller then uses another form). opt: the kernel variant, a
 * bitmask (CT_FLASH3_BWD2_OPT; ops_cuda.cu's default 6: 1 double-buffered dQ staging, 2 split
 * S^T / dP^T waits, 4 at hd 64 each consumer warpgroup's own dQ over its keys, clearing 1; other
 * bits ignored), see fl3_bwd2_kernel's STATUS. */
int ct_fl3_bwd2(int fp16, void *dqkv, float *ws, const void *dout, const void *qkv,
                const float *lse, const float *D, int B, int T, int H, int KV, int hd, int opt,
                void *stream);

#ifdef __cplusplus
}
#endif

#endif
