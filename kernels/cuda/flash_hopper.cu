// kernels/cuda/flash_hopper.cu — causal attention on Hopper (sm_90a) with warpgroup matrix
// multiply-accumulate (wgmma): attention variant "flash3" (kernels/registry.c), forward and
// backward. The forward writes flash2's state (log2-unit log-sum-exp per row, then a copy of the
// output; ops_cuda.cu flash_state_floats), so either backward can follow either forward.
// The forward in two forms (ops_cuda.cu's fl3_fwd2 picks):
//   form 1 (ct_fl3_fwd; CT_FLASH3_FWD=1): fl3_fwd_kernel, described below.
//   form 2 (ct_fl3_fwd2; the default at every shape since 2cc4359; see its STATUS at the end of this
//     file): FA3's forward, a producer warp loading Q, K, V by TMA into an mbarrier ring,
//     128-key tiles, S_{j+1} = Q K^T on the tensor cores while softmax_j runs.
//
// The backward is here too, after ops_cuda.cu's D = rowsum(dO * O) kernel, in two forms
// (ops_cuda.cu's fl3_bwd2 picks):
//   form 2 (ct_fl3_bwd2, the default): FA3's layout, a producer warp loading Q / dO by TMA into an
//     mbarrier ring, 64-query tiles, 5 GEMMs a tile, dQ by one bulk fp32 reduction per warpgroup
//     and tile (its bits may differ from run to run); see its STATUS at the end of this file.
//   form 1 (CT_FLASH3_BWD=1, or attention.deterministic), in two variants:
//     two kernels (ct_fl3_bwd_dkdv, ct_fl3_bwd_dq): fl3_dkdv_kernel<DQ = false>, then fl3_dq_kernel,
//       which recomputes S and dP per query block (7 GEMMs a tile); deterministic.
//     fused (ct_fl3_bwd, with CT_FLASH3_DQ_ATOMIC=1: slower at head dim 128 on an H200):
//       fl3_dkdv_kernel<DQ = true> gives dK, dV and each tile's dQ from the dS it already holds
//       (5 GEMMs a tile), dQ summed with fp32 atomics into a workspace that fl3_dq_out_kernel
//       scales into dqkv.
//
// STATUS: written without a GPU at hand (2026-11-30, session 3); on its first GPU run (H200,
// session 5) it passed tests/gpu/test_ops_cuda's checks against the CPU reference (forward and
// backward, bf16 and fp16, GQA 1-8, hd 64/128, T off the tiles) like every other variant.
// Forward 225-373 TFLOP/s (flash2 186-311, cuDNN 258-563), forward + backward 119-215 (flash2
// 127-188, cuDNN 179-425): bench/results/attention_2026-11-30_NVIDIA_H200_fb38dc6.txt. Chosen
// with `kernels.cuda.train.attention = "flash3"` or CT_CUDA_ATTN=flash3, and timed by auto
// beside flash2 and cudnn (it wins where cuDNN is missing, on most hd 128 shapes). Those were
// form 1's two kernels (7 GEMMs a tile); with form 2 (session 8) forward + backward is 130-276
// TFLOP/s, 63-75% of PyTorch's best (its cuDNN backend) on the same shapes in the same run. With
// the block order of tile_of (session 9, found with ncu) forms 2 reach 149-378 TFLOP/s, 76-97% of
// PyTorch's best in two runs (bench/results/attention_2026-11-30_NVIDIA_H200_{2cc4359,cc145e4}.txt:
// hd 128 81-87%, 97% at T 1024 in one run; hd 64 85-96% at T 1024, 80% at T 8192, 76-79% at
// T 2048-4096).
// Only backward form 2 and forward form 2 use TMA and a producer warp. tools/sim_flash3.py replays this file's
// indexing (swizzled stores, stmatrix, descriptors, k-step offsets, fragment bookkeeping, the dQ
// atomics' addresses) on the host against the PTX ISA's documented layouts and matches plain
// attention to 1e-15, both backwards included: keep the two in step.
//
// Block: two consumer warpgroups (256 threads), 64 query rows each (BM = 128), one (b, h); K and V
// in 64-key tiles, double-buffered with cp.async (no producer warpgroup, no TMA yet). Per tile:
//   S = Q K^T      wgmma m64n64k16, A = Q and B = K both from shared memory (K-major)
//   softmax        online, in registers (each thread: 2 rows x 16 columns of the 64)
//   O += P V       wgmma m64n{HD}k16, A = P from registers (the S accumulators rounded to 16 bits,
//                  whose layout is the A operand's), B = V from shared memory (MN-major:
//                  transposed)
// Shared tiles are stored as column blocks of 64 elements (128 bytes a row) in the 128-byte swizzle
// that the wgmma descriptors name: 16-byte chunk c of row r sits at chunk c ^ (r % 8); every block
// starts on a 1024-byte boundary.
#include <cuda.h> // CUtensorMap and its enums only: the encoder comes through the runtime (no -lcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/cuda/flash_hopper.h"

namespace {

typedef __nv_bfloat16 bf16;
typedef __half f16;

constexpr int NWG = 2;         // consumer warpgroups per block
constexpr int BM = 64 * NWG;   // query rows per block
constexpr int BN = 64;         // keys per tile
constexpr int NT = 128 * NWG;  // threads per block

// shared memory: Q (BM x HD), then 2 stages of K (BN x HD) and V (BN x HD), + 1024 for alignment
// f(std::integral_constant<int, hd>()) for the head dims the kernels have (64, 128), else -1: the
// host entry points' one dispatch from a run-time head dim to the templates.
template <typename F> int by_hd(int hd, F f) {
  if (hd == 64) return f(std::integral_constant<int, 64>());
  if (hd == 128) return f(std::integral_constant<int, 128>());
  return -1;
}

// Block order. The grid is one-dimensional and the tiles (query or key blocks) of one (batch,
// head) are consecutive in it, so the blocks resident at the same time share that head's K and V
// (forward) or Q, dO and dQ's fp32 workspace (backward) in L2, as FlashAttention-2's grid does.
// Heads fastest, as the kernels had it before, put 132 different heads side by side: ncu on
// fl3_bwd2_kernel (B4 T4096 H16 KV8 hd128) read 5.0 GB from DRAM for a 2.2 ms kernel with 24% L2
// hits, DRAM 67% busy and the tensor pipe 32%; the consumers' biggest stall was waiting on the
// producer's loads. The forward kernels take a group size gh: within a group of gh heads the
// heads are fastest (gh = 1: one head's tiles after the other; gh >= heads: heads fastest), so
// the blocks that run together stream gh heads' K and V instead of all reading one head's tile 0
// at once (see fwd_group). Block L: group L / (gh * ntiles), then head (L % span) % n and tile
// (L % span) / n, n being the group's head count (the last group may have fewer; the grid holds
// gridDim.x / ntiles heads). tools/sim_flash3.py replays it and checks that it is one to one.
struct tile_id {
  int t, bh;
};
__device__ __forceinline__ tile_id tile_of(int ntiles, int gh = 1) {
  const unsigned L = blockIdx.x, nheads = gridDim.x / (unsigned)ntiles,
                 span = (unsigned)gh * (unsigned)ntiles, grp = L / span, r = L % span,
                 n = min((unsigned)gh, nheads - grp * (unsigned)gh);
  return {(int)(r / n), (int)(grp * (unsigned)gh + r % n)};
}
inline dim3 tile_grid(int ntiles, int heads) { return dim3((unsigned)ntiles * (unsigned)heads); }

template <int HD> constexpr size_t smem_bytes() {
  return (size_t)2 * (BM * HD + 4 * BN * HD) + 1024;
}

// ---- wgmma wrappers (generated by tools/gen_wgmma.py: 32 or 64 accumulator operands) ----
__device__ __forceinline__ void wgmma_ss_n64_bf16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n32_bf16(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_rs_n64_bf16(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_rs_n128_bf16(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n32_ta_bf16(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n64_ta_bf16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n128_bf16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n64_f16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n32_f16(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_rs_n64_f16(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_rs_n128_f16(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n32_ta_f16(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n64_ta_f16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_n128_f16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

// ---- end of the generated wrappers ----

template <typename E> struct mma;
template <> struct mma<bf16> {
  static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n64_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void qk(float (&d)[16], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n32_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void qk(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n128_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void pv(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                            int acc) {
    wgmma_rs_n64_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                            int acc) {
    wgmma_rs_n128_bf16(d, a, b, acc);
  }
  // A MN-major from shared memory (K^T read from K's rows), B K-major
  static __device__ __forceinline__ void ta(float (&d)[16], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n32_ta_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void ta(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n64_ta_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
  }
};
template <> struct mma<f16> {
  static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n64_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void qk(float (&d)[16], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n32_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void qk(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n128_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void pv(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                            int acc) {
    wgmma_rs_n64_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                            int acc) {
    wgmma_rs_n128_f16(d, a, b, acc);
  }
  // A MN-major from shared memory (K^T read from K's rows), B K-major
  static __device__ __forceinline__ void ta(float (&d)[16], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n32_ta_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void ta(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n64_ta_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    return __half22float2(*reinterpret_cast<__half2 *>(&u));
  }
};

// dst[c, c + 1] += (a[r], a[r + 1]) * sc for one thread's row of an m64 x HD accumulator
// (c = i * 8 + tg * 2, r = i * 4 + half * 2, i < HD / 8), R rows at once: every old value is
// loaded before the first store, so the 2 * R * HD / 8 read-modify-writes cost one round trip
// instead of one each (ncu: fl3_bwd2_kernel's dK / dV epilogue, a load waiting on the store
// before it, drew 12% of its stall samples)
template <int HD, int R, typename E>
__device__ __forceinline__ void add_rows(E *const (&dst)[R], const float *const (&a)[R],
                                         const float (&sc)[R], int half, int tg) {
  constexpr int N = HD / 8;
  uint32_t old[R][N];
#pragma unroll
  for (int j = 0; j < R; j++)
#pragma unroll
    for (int i = 0; i < N; i++) old[j][i] = *reinterpret_cast<const uint32_t *>(dst[j] + i * 8 + tg * 2);
#pragma unroll
  for (int j = 0; j < R; j++)
#pragma unroll
    for (int i = 0; i < N; i++) {
      const float2 o = mma<E>::unpack(old[j][i]);
      const int r = i * 4 + half * 2;
      *reinterpret_cast<uint32_t *>(dst[j] + i * 8 + tg * 2) =
          mma<E>::pack(o.x + a[j][r] * sc[j], o.y + a[j][r + 1] * sc[j]);
    }
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// all but the most recent wgmma group of this warpgroup done (forward form 2's overlap)
__device__ __forceinline__ void wg_wait1() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
// Pins accumulator registers at this point of the program: wgmma writes them asynchronously, so
// no read may move above the wait and no write below the issue.
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
// generic-proxy writes (cp.async) to shared memory, made visible to wgmma's async proxy
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait0() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Four 8x8 16-bit matrices from registers into shared memory, each stored transposed: register j
// of lane l holds (row l / 4, columns 2 (l % 4) + {0, 1}) of matrix j, whose column c becomes the
// 16-byte row that lane 8 j + c addresses (the inverse of ldmatrix .trans).
__device__ __forceinline__ void stsm_x4_trans(void *p, const uint32_t (&r)[4]) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// p[0..3] += v (fp32 reduction in L2, no return value; p 16-byte aligned, global memory)
__device__ __forceinline__ void red_add_v4(float *p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

// Matrix descriptor of a 128-byte-swizzled tile: start address, leading and stride byte offsets
// (both in 16-byte units), swizzle mode 1 (128 bytes) in bits 62-63.
__device__ __forceinline__ uint64_t desc(const void *p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFFu) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFFu) << 16 |
         (uint64_t)((sbo >> 4) & 0x3FFFu) << 32 | (uint64_t)1 << 62;
}

// Rows row0 .. row0 + R - 1 of a head slice (row t at base + t * stride, HD contiguous) into the
// swizzled column blocks of a tile: block cb (64 columns) at s + cb * R * 128 bytes. Rows >= T
// are zero-filled.
template <int HD, int R, typename E>
__device__ __forceinline__ void load_tile(char *s, const E *base, long stride, int row0, int T) {
  constexpr int CPR = HD / 8; // 16-byte chunks per row
  static_assert((R * CPR) % NT == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int k = 0; k < R * CPR / NT; k++) {
    const int i = (int)threadIdx.x + k * NT, r = i / CPR, c = i % CPR, cb = c >> 3, ch = c & 7;
    const bool ok = row0 + r < T;
    char *dst = s + (size_t)cb * R * 128 + r * 128 + ((ch ^ (r & 7)) << 4);
    const void *src = ok ? (const void *)(base + (long)(row0 + r) * stride + c * 8) : (const void *)base;
    cp_async16(dst, src, ok);
  }
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The forward's end for one thread of a consumer warpgroup (both forms): its partial row sums
// l0, l1 summed over the quad of lanes that share rows r0, r1, then for each row < T: out and
// ocopy = O / l (16 bits), lse = m + log2(l) (log2 units; m is already in them).
template <int HD, typename E>
__device__ __forceinline__ void fwd_store(const float (&o)[HD / 2], float m0, float m1, float l0,
                                          float l1, E *out, float *lse, E *ocopy, int b, int h,
                                          int H, int T, int r0, int r1, int tg) {
  constexpr int OD = HD / 2;
  const long HDt = (long)H * HD;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // o[i*4 + {0,1,2,3}] = (r0, d), (r0, d+1), (r1, d), (r1, d+1), d = i*8 + tg*2
  if (r0 < T) {
    const float inv = 1.0f / l0;
    const long off = ((long)b * T + r0) * HDt + (long)h * HD;
#pragma unroll
    for (int i = 0; i < OD / 4; i++) {
      const uint32_t v = mma<E>::pack(o[i * 4] * inv, o[i * 4 + 1] * inv);
      *reinterpret_cast<uint32_t *>(out + off + i * 8 + tg * 2) = v;
      *reinterpret_cast<uint32_t *>(ocopy + off + i * 8 + tg * 2) = v;
    }
    if (tg == 0) lse[((long)b * H + h) * T + r0] = m0 + log2f(l0);
  }
  if (r1 < T) {
    const float inv = 1.0f / l1;
    const long off = ((long)b * T + r1) * HDt + (long)h * HD;
#pragma unroll
    for (int i = 0; i < OD / 4; i++) {
      const uint32_t v = mma<E>::pack(o[i * 4 + 2] * inv, o[i * 4 + 3] * inv);
      *reinterpret_cast<uint32_t *>(out + off + i * 8 + tg * 2) = v;
      *reinterpret_cast<uint32_t *>(ocopy + off + i * 8 + tg * 2) = v;
    }
    if (tg == 0) lse[((long)b * H + h) * T + r1] = m1 + log2f(l1);
  }
}

// hd 64: two blocks a multiprocessor (at most 128 registers a thread). 2cc4359's tile_of took it
// to 130 registers and one block, and its forward to 1.33-1.45x the time (204 against 150 us at
// B16 T1024 H16).
template <int HD, typename E>
__global__ void __launch_bounds__(NT, HD == 64 ? 2 : 1)
    fl3_fwd_kernel(E *out, float *lse, E *ocopy, const E *qkv, int T, int H, int KV, float sl2,
                   int gh) {
  constexpr int OD = HD / 2;                      // O accumulators per thread (m64 x HD)
  constexpr int QB = BM * 128, KB = BN * 128;     // bytes of one 64-column block of Q, K or V
  extern __shared__ char smem_raw[];
  char *sm = (char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  char *Qs = sm, *Ks = Qs + (HD / 64) * QB, *Vs = Ks + 2 * (HD / 64) * KB;
  const int nqb = (T + BM - 1) / BM;
  const tile_id ti = tile_of(nqb, gh);
  const int qb = nqb - 1 - ti.t, b = ti.bh / H, h = ti.bh % H, kv = h / (H / KV);
  const long W3 = (long)(H + 2 * KV) * HD;
  const E *base = qkv + (long)b * T * W3;
  const E *qsrc = base + (long)h * HD, *ksrc = base + (long)(H + kv) * HD,
          *vsrc = base + (long)(H + KV + kv) * HD;
  const int wg = (int)threadIdx.x >> 7, warp = ((int)threadIdx.x >> 5) & 3,
            lane = (int)threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int q0 = qb * BM, w0 = q0 + wg * 64;        // this warpgroup's first row
  const int r0 = w0 + warp * 16 + g, r1 = r0 + 8;    // this thread's two rows
  const int nkv = ((q0 + BM < T ? q0 + BM : T) + BN - 1) / BN;
  load_tile<HD, BM>(Qs, qsrc, W3, q0, T);
  load_tile<HD, BN>(Ks, ksrc, W3, 0, T);
  load_tile<HD, BN>(Vs, vsrc, W3, 0, T);
  cp_commit();
  float o[OD], s[32];
#pragma unroll
  for (int i = 0; i < OD; i++) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  for (int j = 0; j < nkv; j++) {
    cp_wait0();
    fence_async_smem();
    __syncthreads(); // tile j landed for everyone; everyone is done with tile j - 1's stage
    if (j + 1 < nkv) {
      const int st = (j + 1) & 1;
      load_tile<HD, BN>(Ks + st * (HD / 64) * KB, ksrc, W3, (j + 1) * BN, T);
      load_tile<HD, BN>(Vs + st * (HD / 64) * KB, vsrc, W3, (j + 1) * BN, T);
      cp_commit();
    }
    const int key0 = j * BN;
    if (w0 >= T || key0 > w0 + 63) continue; // warpgroup-uniform: all keys after all rows
    const char *K = Ks + (j & 1) * (HD / 64) * KB, *V = Vs + (j & 1) * (HD / 64) * KB;
    // S = Q K^T over HD / 16 k-steps; a k-step is 32 bytes into a 128-byte swizzled row
    fence_regs(s);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
      const int cb = ks >> 2, kin = (ks & 3) * 32;
      const uint64_t da = desc(Qs + cb * QB + wg * 64 * 128 + kin, 16, 1024);
      const uint64_t db = desc(K + cb * KB + kin, 16, 1024);
      mma<E>::qk(s, da, db, ks > 0);
    }
    wg_commit();
    wg_wait0();
    fence_regs(s);
    // s[nt*4 + {0,1,2,3}] = (r0, c), (r0, c+1), (r1, c), (r1, c+1), c = key0 + nt*8 + tg*2
    if (key0 + BN - 1 > w0) {
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const int key = key0 + nt * 8 + tg * 2;
        if (key > r0) s[nt * 4 + 0] = -INFINITY;
        if (key + 1 > r0) s[nt * 4 + 1] = -INFINITY;
        if (key > r1) s[nt * 4 + 2] = -INFINITY;
        if (key + 1 > r1) s[nt * 4 + 3] = -INFINITY;
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      mx0 = fmaxf(mx0, fmaxf(s[nt * 4], s[nt * 4 + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt * 4 + 2], s[nt * 4 + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // rows past T (zero queries) and rows whose keys in this tile are all masked keep a finite
    // max: key 0 is in every row's first tile
    const float n0 = fmaxf(m0, mx0 * sl2), n1 = fmaxf(m1, mx1 * sl2);
    const float a0 = ex2(m0 - n0), a1 = ex2(m1 - n1);
    m0 = n0;
    m1 = n1;
    l0 *= a0;
    l1 *= a1;
#pragma unroll
    for (int i = 0; i < OD / 4; i++) {
      o[i * 4 + 0] *= a0;
      o[i * 4 + 1] *= a0;
      o[i * 4 + 2] *= a1;
      o[i * 4 + 3] *= a1;
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      s[nt * 4 + 0] = ex2(fmaf(s[nt * 4 + 0], sl2, -n0));
      s[nt * 4 + 1] = ex2(fmaf(s[nt * 4 + 1], sl2, -n0));
      s[nt * 4 + 2] = ex2(fmaf(s[nt * 4 + 2], sl2, -n1));
      s[nt * 4 + 3] = ex2(fmaf(s[nt * 4 + 3], sl2, -n1));
      l0 += s[nt * 4 + 0] + s[nt * 4 + 1];
      l1 += s[nt * 4 + 2] + s[nt * 4 + 3];
    }
    // O += P V: 4 k-steps of 16 keys; P's A fragment of k-step kc comes from the accumulators of
    // n-blocks 2kc and 2kc+1; V's k-step is 16 rows = 2048 bytes into each 64-column block, the
    // blocks (d 0-63, 64-127) LBO = one block apart
    uint32_t p[4][4];
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
      const float *c0 = s + 8 * kc, *c1 = s + 8 * kc + 4;
      p[kc][0] = mma<E>::pack(c0[0], c0[1]);
      p[kc][1] = mma<E>::pack(c0[2], c0[3]);
      p[kc][2] = mma<E>::pack(c1[0], c1[1]);
      p[kc][3] = mma<E>::pack(c1[2], c1[3]);
    }
    fence_regs(o);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < 4; kc++) mma<E>::pv(o, p[kc], desc(V + kc * 2048, KB, 1024), 1);
    wg_commit();
    wg_wait0();
    fence_regs(o);
  }
  fwd_store<HD, E>(o, m0, m1, l0, l1, out, lse, ocopy, b, h, H, T, r0, r1, tg);
}

// Raises a kernel's dynamic shared memory limit once per device (*done: a bit per device).
template <typename K> bool smem_once(K kernel, size_t bytes, int *done) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if ((*done >> dev) & 1) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
      cudaSuccess)
    return false;
  *done |= 1 << dev;
  return true;
}

// The forward kernels' head-group size (tile_of), at most the grid's heads: CT_FLASH3_FWD_GROUP=N
// forces N (read at every call, so bench runs can compare), else the measured choice below.
int fwd_group(int form, int hd, int T, int heads) {
  const char *v = getenv("CT_FLASH3_FWD_GROUP");
  if (v && atoi(v) > 0) return std::min(atoi(v), heads);
  // H200, forward form 2 (bench/results/call21_ceeb4d7.txt, B*T = 16k, H 16): 8 heads a group
  // took 0.93-0.99x the time of 1 head (hd 64 at every T, hd 128 to T 2048) and 0.88-1.00x the
  // time of heads fastest; at hd 128 from T 4096, 1 was 3-5% faster than 8 (530 against 549 us,
  // 918 against 965). Form 1: 8 at every shape (0.95-1.00x heads fastest).
  return std::min(form == 2 && hd == 128 && T >= 4096 ? 1 : 8, heads);
}

template <int HD, typename E>
int launch(E *out, float *lse, E *ocopy, const E *qkv, int B, int T, int H, int KV,
           cudaStream_t st) {
  constexpr size_t smem = smem_bytes<HD>();
  static int attr;
  if (!smem_once(fl3_fwd_kernel<HD, E>, smem, &attr)) return -2;
  const float sl2 = 1.4426950408889634f / sqrtf((float)HD);
  const dim3 grid = tile_grid((T + BM - 1) / BM, B * H);
  fl3_fwd_kernel<HD, E><<<grid, NT, smem, st>>>(out, lse, ocopy, qkv, T, H, KV, sl2,
                                                 fwd_group(1, HD, T, B * H));
  return cudaGetLastError() == cudaSuccess ? 0 : -2;
}

template <typename E>
int fwd(void *out, float *lse, void *ocopy, const void *qkv, int B, int T, int H, int KV, int hd,
        void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return by_hd(hd, [&](auto h) {
    return launch<h(), E>((E *)out, lse, (E *)ocopy, (const E *)qkv, B, T, H, KV, st);
  });
}

} // namespace

extern "C" int ct_fl3_fwd(int fp16, void *out, float *lse, void *ocopy, const void *qkv, int B,
                          int T, int H, int KV, int hd, void *stream) {
  return fp16 ? fwd<f16>(out, lse, ocopy, qkv, B, T, H, KV, hd, stream)
              : fwd<bf16>(out, lse, ocopy, qkv, B, T, H, KV, hd, stream);
}

namespace {

// ---- backward: dK and dV (and, fused, dQ) ----
// Block: two warpgroups, 64 keys each (BK = 128 keys of one (b, kv head)); loops over the query
// heads of the kv group and the BQ-query tiles that can see its keys (Q, dO, log-sum-exp and
// D = rowsum(dO * O) double-buffered). Per tile, with rows = keys:
//   S^T = K Q^T, dP^T = V dO^T     wgmma m64n{BQ}k16, A = K / V, B = Q / dO (shared, K-major)
//   P^T = exp2(S^T sl2 - lse), dS^T = P^T (dP^T - D)        in registers (causal: q >= key)
//   dV += P^T dO, dK += dS^T Q     wgmma m64n{HD}k16, A = P^T / dS^T from registers, B = dO / Q
//                                  (shared, MN-major)
// dK is scaled by 1/sqrt(HD) at the end; both are added into dqkv (backward accumulates). BQ = 64
// for head dim 64 and 32 for 128 (registers: dK and dV take HD accumulators per thread).
//
// DQ = true (ct_fl3_bwd, the default backward): the tile's dQ from the dS already in registers,
// 5 GEMMs a tile where this kernel without DQ plus fl3_dq_kernel take 7:
//   dS^T -> shared memory   stmatrix .trans: BQ rows (queries) of the block's 128 keys, two
//                           64-key column blocks (block wg: warpgroup wg's keys), 128-byte swizzle
//   dQ^T = K^T dS^T         wgmma m64n32k16, A = K^T (K's rows read MN-major), B = dS (K-major),
//                           over the block's 128 keys (64 when warpgroup 1's keys see none of the
//                           tile). The HD x BQ tile is split between the warpgroups: hd 128, 64 of
//                           the HD rows each; hd 64, 32 of the BQ queries each.
//   ws += dQ^T              red.global.add.v4.f32 into ws (B, H, HD, Tp) fp32, query-contiguous,
//                           Tp = T rounded up to 64 (lane pairs swap halves so that each lane
//                           adds 4 consecutive queries of one row)
// fl3_dq_out_kernel then adds ws / sqrt(HD) into dqkv's query columns. The atomics land in an
// order that varies from run to run, so dQ's bits can too. Without DQ, dQ is fl3_dq_kernel's
// (below), which reads the same lse and D.
constexpr int BK = 64 * NWG;

template <int HD> __host__ __device__ constexpr int bq_of() { return HD == 64 ? 64 : 32; }
template <int HD, bool DQ> constexpr size_t bwd_smem_bytes() {
  return (size_t)2 * (2 * BK * HD + 2 * 2 * bq_of<HD>() * HD) +
         (DQ ? (size_t)2 * bq_of<HD>() * 128 : 0) + 2 * 2 * bq_of<HD>() * 4 + 1024;
}
// rows of the fp32 dQ workspace per (b, h, d): T rounded up to 64, a whole number of BQ tiles
__host__ __device__ constexpr long ws_rows(int T) { return (T + 63) / 64 * 64L; }

template <int HD, typename E, bool DQ>
__global__ void __launch_bounds__(NT, 1)
    fl3_dkdv_kernel(E *dqkv, float *ws, const E *dout, const E *qkv, const float *lse,
                    const float *D, int T, int H, int KV, float sl2, float scale) {
  constexpr int BQ = bq_of<HD>(), SN = BQ / 2, OD = HD / 2;
  constexpr int KBy = BK * 128, QBy = BQ * 128; // bytes of a 64-column block of K/V, of Q/dO
  extern __shared__ char smem_raw[];
  char *sm = (char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  char *Ks = sm, *Vs = Ks + (HD / 64) * KBy, *Qs = Vs + (HD / 64) * KBy;
  char *dOs = Qs + 2 * (HD / 64) * QBy, *dSs = dOs + 2 * (HD / 64) * QBy; // dSs: DQ only
  float *Ls = reinterpret_cast<float *>(dSs + (DQ ? 2 * QBy : 0)), *Ds = Ls + 2 * BQ;
  const tile_id ti = tile_of((T + BK - 1) / BK); // key block 0, which sees every query, first
  const int kb = ti.t, b = ti.bh / KV, kv = ti.bh % KV, grp = H / KV;
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *base = qkv + (long)b * T * W3;
  const E *dbase = dout + (long)b * T * HDt;
  const int wg = (int)threadIdx.x >> 7, warp = ((int)threadIdx.x >> 5) & 3,
            lane = (int)threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int kb0 = kb * BK, w0 = kb0 + wg * 64;       // this warpgroup's first key
  const int k0 = w0 + warp * 16 + g, k1 = k0 + 8;     // this thread's two keys
  const int i0 = kb0 / BQ, nq = (T + BQ - 1) / BQ - i0, total = grp * nq;
  auto issue = [&](int it, int stg) { // step it: head kv * grp + it / nq, query tile i0 + it % nq
    const int h = kv * grp + it / nq, i = i0 + it % nq;
    load_tile<HD, BQ>(Qs + stg * (HD / 64) * QBy, base + (long)h * HD, W3, i * BQ, T);
    load_tile<HD, BQ>(dOs + stg * (HD / 64) * QBy, dbase + (long)h * HD, HDt, i * BQ, T);
    if (threadIdx.x < BQ) {
      const int t = i * BQ + (int)threadIdx.x;
      const long sr = ((long)b * H + h) * T;
      // padding queries: lse = +inf makes P = 0
      Ls[stg * BQ + threadIdx.x] = t < T ? lse[sr + t] : INFINITY;
      Ds[stg * BQ + threadIdx.x] = t < T ? D[sr + t] : 0.0f;
    }
  };
  load_tile<HD, BK>(Ks, base + (long)(H + kv) * HD, W3, kb0, T);
  load_tile<HD, BK>(Vs, base + (long)(H + KV + kv) * HD, W3, kb0, T);
  issue(0, 0);
  cp_commit();
  float dk[OD], dv[OD], st[SN], dpt[SN], dq[16];
#pragma unroll
  for (int i = 0; i < OD; i++) dk[i] = dv[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; i++) dq[i] = 0.0f;
  // DQ: this warpgroup's part of the tile's dQ^T, rows mt * 64 .. of HD, queries n0 .. n0 + 31
  const int mt = HD == 128 ? wg : 0, n0 = HD == 128 ? 0 : wg * 32;
  for (int it = 0; it < total; it++) {
    const int stg = it & 1;
    cp_wait0();
    fence_async_smem();
    __syncthreads(); // step it's tiles (and lse / D) landed; everyone is done with step it - 1
    if (it + 1 < total) {
      issue(it + 1, stg ^ 1);
      cp_commit();
    }
    const int qbase = (i0 + it % nq) * BQ;
    // warpgroup-uniform: some query of the tile is at or after one of this warpgroup's keys
    // (always true for warpgroup 0: the tiles start at the one that holds key kb0)
    const bool on = w0 < T && qbase + BQ - 1 >= w0;
    if (!DQ && !on) continue;
    const char *Q = Qs + stg * (HD / 64) * QBy, *dO = dOs + stg * (HD / 64) * QBy;
    const float *L = Ls + stg * BQ, *Dd = Ds + stg * BQ;
    if (on) {
      fence_regs(st);
      fence_regs(dpt);
      wg_fence();
#pragma unroll
      for (int ks = 0; ks < HD / 16; ks++) {
        const int cb = ks >> 2, kin = (ks & 3) * 32;
        const uint64_t dbq = desc(Q + cb * QBy + kin, 16, 1024);
        const uint64_t dd = desc(dO + cb * QBy + kin, 16, 1024);
        mma<E>::qk(st, desc(Ks + cb * KBy + wg * 64 * 128 + kin, 16, 1024), dbq, ks > 0);
        mma<E>::qk(dpt, desc(Vs + cb * KBy + wg * 64 * 128 + kin, 16, 1024), dd, ks > 0);
      }
      wg_commit();
      wg_wait0();
      fence_regs(st);
      fence_regs(dpt);
      // st[nt*4 + {0,1,2,3}] = (k0, q), (k0, q+1), (k1, q), (k1, q+1), q = qbase + nt*8 + tg*2
      const bool diag = qbase < w0 + 63;
#pragma unroll
      for (int nt = 0; nt < BQ / 8; nt++) {
        const int ql = nt * 8 + tg * 2, q = qbase + ql;
        const float l0 = L[ql], l1 = L[ql + 1], d0 = Dd[ql], d1 = Dd[ql + 1];
        float p0 = ex2(fmaf(st[nt * 4 + 0], sl2, -l0)), p1 = ex2(fmaf(st[nt * 4 + 1], sl2, -l1));
        float p2 = ex2(fmaf(st[nt * 4 + 2], sl2, -l0)), p3 = ex2(fmaf(st[nt * 4 + 3], sl2, -l1));
        if (diag) {
          if (q < k0) p0 = 0.0f;
          if (q + 1 < k0) p1 = 0.0f;
          if (q < k1) p2 = 0.0f;
          if (q + 1 < k1) p3 = 0.0f;
        }
        st[nt * 4 + 0] = p0;
        st[nt * 4 + 1] = p1;
        st[nt * 4 + 2] = p2;
        st[nt * 4 + 3] = p3;
        dpt[nt * 4 + 0] = p0 * (dpt[nt * 4 + 0] - d0);
        dpt[nt * 4 + 1] = p1 * (dpt[nt * 4 + 1] - d1);
        dpt[nt * 4 + 2] = p2 * (dpt[nt * 4 + 2] - d0);
        dpt[nt * 4 + 3] = p3 * (dpt[nt * 4 + 3] - d1);
      }
      uint32_t pa[BQ / 16][4], sa[BQ / 16][4];
#pragma unroll
      for (int kc = 0; kc < BQ / 16; kc++) {
        const float *c0 = st + 8 * kc, *c1 = st + 8 * kc + 4;
        pa[kc][0] = mma<E>::pack(c0[0], c0[1]);
        pa[kc][1] = mma<E>::pack(c0[2], c0[3]);
        pa[kc][2] = mma<E>::pack(c1[0], c1[1]);
        pa[kc][3] = mma<E>::pack(c1[2], c1[3]);
        const float *e0 = dpt + 8 * kc, *e1 = dpt + 8 * kc + 4;
        sa[kc][0] = mma<E>::pack(e0[0], e0[1]);
        sa[kc][1] = mma<E>::pack(e0[2], e0[3]);
        sa[kc][2] = mma<E>::pack(e1[0], e1[1]);
        sa[kc][3] = mma<E>::pack(e1[2], e1[3]);
      }
      if (DQ) {
        // sa[kc][j] is 8x8 block j of dS^T (keys warp*16 + 8 (j % 2) + 0..7, queries kc*16 +
        // 8 (j / 2) + 0..7); stored transposed, its query row r is the 16 bytes that lane 8 j + r
        // addresses: 8 keys in column block wg, chunk (key % 64) / 8 swizzled with the row
        const int kl = warp * 16 + (lane & 8); // this lane's 8 keys of the warpgroup's 64
#pragma unroll
        for (int kc = 0; kc < BQ / 16; kc++) {
          const int q = kc * 16 + (lane >> 4) * 8 + (lane & 7);
          stsm_x4_trans(dSs + wg * QBy + q * 128 + (((kl >> 3) ^ (q & 7)) << 4), sa[kc]);
        }
        fence_async_smem(); // for the dQ wgmma (async proxy), after the barrier below
      }
      fence_regs(dv);
      fence_regs(dk);
      wg_fence();
#pragma unroll
      for (int kc = 0; kc < BQ / 16; kc++) { // 16 queries: 16 rows of 128 bytes into each block
        mma<E>::pv(dv, pa[kc], desc(dO + kc * 2048, QBy, 1024), 1);
        mma<E>::pv(dk, sa[kc], desc(Q + kc * 2048, QBy, 1024), 1);
      }
      wg_commit();
    }
    if (DQ) {
      __syncthreads(); // both warpgroups' dS^T are in shared memory (no warpgroup skipped here)
      const bool on1 = kb0 + 64 < T && qbase + BQ - 1 >= kb0 + 64; // warpgroup 1's `on`
      // 16 keys a k-step: 16 rows of K (2048 bytes), 32 bytes into dS's 128-byte rows; the two
      // key counts as straight-line code (ptxas adds a wgmma fence inside a branchy sequence)
      auto dq_mma = [&](auto nks) {
        fence_regs(dq);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < decltype(nks)::value; ks++) {
          const int cb = ks >> 2, kin = (ks & 3) * 32;
          mma<E>::ta(dq, desc(Ks + mt * KBy + ks * 2048, KBy, 1024),
                     desc(dSs + cb * QBy + n0 * 128 + kin, 16, 1024), ks > 0);
        }
        wg_commit();
      };
      if (on1) dq_mma(std::integral_constant<int, BK / 16>());
      else dq_mma(std::integral_constant<int, 4>());
    }
    wg_wait0();
    fence_regs(dv);
    fence_regs(dk);
    if (DQ) {
      fence_regs(dq);
      // dq[nt*4 + {0,1,2,3}] = (d, q), (d, q+1), (d+8, q), (d+8, q+1), d = mt*64 + warp*16 + g,
      // q = n0 + nt*8 + tg*2. Lanes tg and tg^1 swap: even tg adds (d, q .. q+3), odd tg
      // (d+8, q-2 .. q+1).
      const int h = kv * grp + it / nq, odd = tg & 1;
      float *dst = ws + ((long)(b * H + h) * HD + mt * 64 + warp * 16 + g + odd * 8) * ws_rows(T) +
                   qbase + n0 + (tg >> 1) * 4;
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        const float *c = dq + nt * 4;
        const float x0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1);
        const float x1 = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
        if (odd) red_add_v4(dst + nt * 8, x0, x1, c[2], c[3]);
        else red_add_v4(dst + nt * 8, c[0], c[1], x0, x1);
      }
    }
  }
  // dk[i*4 + {0,1,2,3}] = (k0, d), (k0, d+1), (k1, d), (k1, d+1), d = i*8 + tg*2
  const long koff = (long)(H + kv) * HD, voff = (long)(H + KV + kv) * HD;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int key = half ? k1 : k0;
    if (key >= T) continue;
    E *d = dqkv + ((long)b * T + key) * W3;
    add_rows<HD, 2, E>({d + koff, d + voff}, {dk, dv}, {scale, 1.0f}, half, tg);
  }
}

// dqkv's query columns += ws * scale, ws (B, H, HD, Tp) being the fused kernel's fp32 dQ^T: 64
// queries of one (b, h) a block, transposed through shared memory (coalesced on both sides).
template <int HD, typename E>
__global__ void __launch_bounds__(256)
    fl3_dq_out_kernel(E *dqkv, const float *ws, int T, int H, int KV, float scale) {
  __shared__ float tile[HD][65];
  const int b = (int)blockIdx.x / H, h = (int)blockIdx.x % H, t0 = (int)blockIdx.y * 64;
  const long Tp = ws_rows(T), W3 = (long)(H + 2 * KV) * HD;
  const float *src = ws + (long)blockIdx.x * HD * Tp + t0;
  for (int i = (int)threadIdx.x; i < HD * 16; i += 256) {
    const int d = i >> 4, c = (i & 15) * 4;
    const float4 v = *reinterpret_cast<const float4 *>(src + d * Tp + c);
    tile[d][c] = v.x;
    tile[d][c + 1] = v.y;
    tile[d][c + 2] = v.z;
    tile[d][c + 3] = v.w;
  }
  __syncthreads();
  for (int i = (int)threadIdx.x; i < 64 * (HD / 2); i += 256) {
    const int tt = i / (HD / 2), d = i % (HD / 2) * 2, t = t0 + tt;
    if (t >= T) break; // i only grows
    uint32_t *p = reinterpret_cast<uint32_t *>(dqkv + ((long)b * T + t) * W3 + (long)h * HD + d);
    const float2 o = mma<E>::unpack(*p);
    *p = mma<E>::pack(o.x + tile[d][tt] * scale, o.y + tile[d + 1][tt] * scale);
  }
}

template <int HD, typename E, bool DQ>
int launch_dkdv(E *dqkv, float *ws, const E *dout, const E *qkv, const float *lse, const float *D,
                int B, int T, int H, int KV, cudaStream_t st) {
  constexpr size_t smem = bwd_smem_bytes<HD, DQ>();
  static int attr;
  if (!smem_once(fl3_dkdv_kernel<HD, E, DQ>, smem, &attr)) return -2;
  const float scale = 1.0f / sqrtf((float)HD), sl2 = 1.4426950408889634f * scale;
  const dim3 grid = tile_grid((T + BK - 1) / BK, B * KV);
  fl3_dkdv_kernel<HD, E, DQ><<<grid, NT, smem, st>>>(dqkv, ws, dout, qkv, lse, D, T, H, KV, sl2,
                                                      scale);
  return cudaGetLastError() == cudaSuccess ? 0 : -2;
}

template <typename E>
int dkdv(void *dqkv, const void *dout, const void *qkv, const float *lse, const float *D, int B,
         int T, int H, int KV, int hd, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return by_hd(hd, [&](auto h) {
    return launch_dkdv<h(), E, false>((E *)dqkv, NULL, (const E *)dout, (const E *)qkv, lse, D, B,
                                      T, H, KV, st);
  });
}

template <int HD, typename E>
int launch_fused(E *dqkv, float *ws, const E *dout, const E *qkv, const float *lse, const float *D,
                 int B, int T, int H, int KV, cudaStream_t st) {
  if (cudaMemsetAsync(ws, 0, sizeof(float) * (size_t)B * H * HD * ws_rows(T), st) != cudaSuccess)
    return -2;
  const int r = launch_dkdv<HD, E, true>(dqkv, ws, dout, qkv, lse, D, B, T, H, KV, st);
  if (r != 0) return r;
  const dim3 grid((unsigned)(B * H), (unsigned)(ws_rows(T) / 64));
  fl3_dq_out_kernel<HD, E><<<grid, 256, 0, st>>>(dqkv, ws, T, H, KV, 1.0f / sqrtf((float)HD));
  return cudaGetLastError() == cudaSuccess ? 0 : -2;
}

template <typename E>
int fused(void *dqkv, float *ws, const void *dout, const void *qkv, const float *lse,
          const float *D, int B, int T, int H, int KV, int hd, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return by_hd(hd, [&](auto h) {
    return launch_fused<h(), E>((E *)dqkv, ws, (const E *)dout, (const E *)qkv, lse, D, B, T, H,
                                KV, st);
  });
}

} // namespace

extern "C" int ct_fl3_bwd_dkdv(int fp16, void *dqkv, const void *dout, const void *qkv,
                               const float *lse, const float *D, int B, int T, int H, int KV,
                               int hd, void *stream) {
  return fp16 ? dkdv<f16>(dqkv, dout, qkv, lse, D, B, T, H, KV, hd, stream)
              : dkdv<bf16>(dqkv, dout, qkv, lse, D, B, T, H, KV, hd, stream);
}

extern "C" size_t ct_fl3_bwd_ws_floats(int B, int T, int H, int hd) {
  return (size_t)B * H * hd * (size_t)ws_rows(T);
}

extern "C" int ct_fl3_bwd(int fp16, void *dqkv, float *ws, const void *dout, const void *qkv,
                          const float *lse, const float *D, int B, int T, int H, int KV, int hd,
                          void *stream) {
  return fp16 ? fused<f16>(dqkv, ws, dout, qkv, lse, D, B, T, H, KV, hd, stream)
              : fused<bf16>(dqkv, ws, dout, qkv, lse, D, B, T, H, KV, hd, stream);
}

namespace {

// ---- backward: dQ ----
// Block: two warpgroups, 64 queries each (BM = 128 queries of one (b, h)); 64-key tiles of K and
// V double-buffered up to the diagonal. Per tile, with rows = queries:
//   S = Q K^T, dP = dO V^T      wgmma m64n64k16, A = Q / dO, B = K / V (shared, K-major)
//   P = exp2(S sl2 - lse), dS = P (dP - D)          in registers (causal: key <= query)
//   dQ += dS K                  wgmma m64n{HD}k16, A = dS from registers, B = K (MN-major)
// dQ is scaled by 1/sqrt(HD) and added into dqkv's query columns.
template <int HD> constexpr size_t dq_smem_bytes() {
  return (size_t)2 * (2 * BM * HD + 2 * 2 * BN * HD) + 1024;
}

template <int HD, typename E>
__global__ void __launch_bounds__(NT, 1)
    fl3_dq_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D, int T,
                  int H, int KV, float sl2, float scale) {
  constexpr int OD = HD / 2;
  constexpr int QB = BM * 128, KB = BN * 128; // bytes of a 64-column block of Q/dO, of K/V
  extern __shared__ char smem_raw[];
  char *sm = (char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  char *Qs = sm, *dOs = Qs + (HD / 64) * QB, *Ks = dOs + (HD / 64) * QB;
  char *Vs = Ks + 2 * (HD / 64) * KB;
  const int nqb = (T + BM - 1) / BM;
  const tile_id ti = tile_of(nqb);
  const int qb = nqb - 1 - ti.t, b = ti.bh / H, h = ti.bh % H, kv = h / (H / KV);
  const long W3 = (long)(H + 2 * KV) * HD, HDt = (long)H * HD;
  const E *base = qkv + (long)b * T * W3;
  const E *ksrc = base + (long)(H + kv) * HD, *vsrc = base + (long)(H + KV + kv) * HD;
  const int wg = (int)threadIdx.x >> 7, warp = ((int)threadIdx.x >> 5) & 3,
            lane = (int)threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
  const int q0 = qb * BM, w0 = q0 + wg * 64;
  const int r0 = w0 + warp * 16 + g, r1 = r0 + 8;
  const int nkv = ((q0 + BM < T ? q0 + BM : T) + BN - 1) / BN;
  load_tile<HD, BM>(Qs, base + (long)h * HD, W3, q0, T);
  load_tile<HD, BM>(dOs, dout + (long)b * T * HDt + (long)h * HD, HDt, q0, T);
  load_tile<HD, BN>(Ks, ksrc, W3, 0, T);
  load_tile<HD, BN>(Vs, vsrc, W3, 0, T);
  cp_commit();
  const long sr = ((long)b * H + h) * T;
  // padding rows: lse = +inf makes P = 0
  const float l0 = r0 < T ? lse[sr + r0] : INFINITY, l1 = r1 < T ? lse[sr + r1] : INFINITY;
  const float d0 = r0 < T ? D[sr + r0] : 0.0f, d1 = r1 < T ? D[sr + r1] : 0.0f;
  float dq[OD], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < OD; i++) dq[i] = 0.0f;
  for (int j = 0; j < nkv; j++) {
    cp_wait0();
    fence_async_smem();
    __syncthreads();
    if (j + 1 < nkv) {
      const int st = (j + 1) & 1;
      load_tile<HD, BN>(Ks + st * (HD / 64) * KB, ksrc, W3, (j + 1) * BN, T);
      load_tile<HD, BN>(Vs + st * (HD / 64) * KB, vsrc, W3, (j + 1) * BN, T);
      cp_commit();
    }
    const int key0 = j * BN;
    if (w0 >= T || key0 > w0 + 63) continue; // warpgroup-uniform: every key after every query
    const char *K = Ks + (j & 1) * (HD / 64) * KB, *V = Vs + (j & 1) * (HD / 64) * KB;
    fence_regs(s);
    fence_regs(dp);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
      const int cb = ks >> 2, kin = (ks & 3) * 32;
      mma<E>::qk(s, desc(Qs + cb * QB + wg * 64 * 128 + kin, 16, 1024),
                 desc(K + cb * KB + kin, 16, 1024), ks > 0);
      mma<E>::qk(dp, desc(dOs + cb * QB + wg * 64 * 128 + kin, 16, 1024),
                 desc(V + cb * KB + kin, 16, 1024), ks > 0);
    }
    wg_commit();
    wg_wait0();
    fence_regs(s);
    fence_regs(dp);
    // s[nt*4 + {0,1,2,3}] = (r0, k), (r0, k+1), (r1, k), (r1, k+1), k = key0 + nt*8 + tg*2
    const bool diag = key0 + BN - 1 > w0;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      const int key = key0 + nt * 8 + tg * 2;
      float p0 = ex2(fmaf(s[nt * 4 + 0], sl2, -l0)), p1 = ex2(fmaf(s[nt * 4 + 1], sl2, -l0));
      float p2 = ex2(fmaf(s[nt * 4 + 2], sl2, -l1)), p3 = ex2(fmaf(s[nt * 4 + 3], sl2, -l1));
      if (diag) {
        if (key > r0) p0 = 0.0f;
        if (key + 1 > r0) p1 = 0.0f;
        if (key > r1) p2 = 0.0f;
        if (key + 1 > r1) p3 = 0.0f;
      }
      dp[nt * 4 + 0] = p0 * (dp[nt * 4 + 0] - d0);
      dp[nt * 4 + 1] = p1 * (dp[nt * 4 + 1] - d0);
      dp[nt * 4 + 2] = p2 * (dp[nt * 4 + 2] - d1);
      dp[nt * 4 + 3] = p3 * (dp[nt * 4 + 3] - d1);
    }
    uint32_t sa[4][4];
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
      const float *e0 = dp + 8 * kc, *e1 = dp + 8 * kc + 4;
      sa[kc][0] = mma<E>::pack(e0[0], e0[1]);
      sa[kc][1] = mma<E>::pack(e0[2], e0[3]);
      sa[kc][2] = mma<E>::pack(e1[0], e1[1]);
      sa[kc][3] = mma<E>::pack(e1[2], e1[3]);
    }
    fence_regs(dq);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < 4; kc++) mma<E>::pv(dq, sa[kc], desc(K + kc * 2048, KB, 1024), 1);
    wg_commit();
    wg_wait0();
    fence_regs(dq);
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int row = half ? r1 : r0;
    if (row >= T) continue;
    E *d = dqkv + ((long)b * T + row) * W3 + (long)h * HD;
    add_rows<HD, 1, E>({d}, {dq}, {scale}, half, tg);
  }
}

template <int HD, typename E>
int launch_dq(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D, int B, int T,
              int H, int KV, cudaStream_t st) {
  constexpr size_t smem = dq_smem_bytes<HD>();
  static int attr;
  if (!smem_once(fl3_dq_kernel<HD, E>, smem, &attr)) return -2;
  const float scale = 1.0f / sqrtf((float)HD), sl2 = 1.4426950408889634f * scale;
  const dim3 grid = tile_grid((T + BM - 1) / BM, B * H);
  fl3_dq_kernel<HD, E><<<grid, NT, smem, st>>>(dqkv, dout, qkv, lse, D, T, H, KV, sl2, scale);
  return cudaGetLastError() == cudaSuccess ? 0 : -2;
}

template <typename E>
int dqk(void *dqkv, const void *dout, const void *qkv, const float *lse, const float *D, int B,
        int T, int H, int KV, int hd, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return by_hd(hd, [&](auto h) {
    return launch_dq<h(), E>((E *)dqkv, (const E *)dout, (const E *)qkv, lse, D, B, T, H, KV, st);
  });
}

} // namespace

extern "C" int ct_fl3_bwd_dq(int fp16, void *dqkv, const void *dout, const void *qkv,
                             const float *lse, const float *D, int B, int T, int H, int KV,
                             int hd, void *stream) {
  return fp16 ? dqk<f16>(dqkv, dout, qkv, lse, D, B, T, H, KV, hd, stream)
              : dqk<bf16>(dqkv, dout, qkv, lse, D, B, T, H, KV, hd, stream);
}

namespace {

// ---- backward, form 2 (the default): a producer warp, TMA, dQ by bulk reductions ----
// STATUS: written without a GPU at hand (2026-11-30, issue #7). On its first GPU run (H200,
// session 8) it passed test_ops_cuda's checks against the CPU reference (1570 checks: bf16 and
// fp16, GQA 1-8, hd 64/128, T off the tiles) and ran forward + backward in 0.78-0.89x form 1's
// time (two kernels) over B*T = 16k, T 1k-8k: 130-256 TFLOP/s at hd 64, 167-276 at hd 128, where
// cuDNN reaches 205-358 and 256-441 (bench/results/attention_2026-11-30_NVIDIA_H200_0f6490c.txt).
// So it became flash3's backward. A hang would be a barrier phase or transaction count that does
// not add up (see the mbarriers below).
// Variants (template OPT, CT_FLASH3_BWD2_OPT read at every call by ops_cuda.cu; 0 is the kernel
// above unchanged, 2 the default since its GPU run), written without a GPU (2026-11-30) because the
// backward still took 1.5-1.7x cuDNN's time (bench/results/attention_2026-11-30_NVIDIA_H200_
// 5dbda21.txt: hd 128 B2 T8192 H16 KV8 ~4560 us against ~2810, hd 64 B16 T1024 ~645 against 372):
//   bit 1  two dQ^T staging buffers per warpgroup, step it using buffer it % 2: thread 0 waits
//          with cp.async.bulk.wait_group.read 1 (step it - 2's add, the last from that buffer, has
//          read it) before the bar.sync 1 that the step already has, which replaces the extra
//          named barrier and the wait for the previous step's add. Shared memory: 231488 bytes at
//          hd 128 (of sm_90's 232448), 133184 at 64 (OPT 0: 198720 and 116800).
//   bit 2  S^T and dP^T as two wgmma groups: wait_group 1, the exponentials of P, then
//          wait_group 0 and dS, so P's MUFU work runs while dP^T is on the tensor cores. ptxas
//          hoisted the second wait above the exponentials within the basic block (as forward form
//          2 found; ptxas deleted an asm loop on a never-zero argument, and sank the exponentials
//          below a redundant mbarrier wait's loop), so the diagonal mask is one branch after all
//          the exponentials, whose region ptxas keeps them above.
//   bit 4  (hd 64 only, not with bit 1; CT_FLASH3_BWD2_OPT=4 or 6; written 2026-11-30 without a
//          GPU; 6 is the default since its first run, session 10): each consumer warpgroup computes dQ^T over its own 64 keys
//          for all 64 queries of the step (m64n64, 4 k-steps) from its own dS^T part, and both
//          bulk-add 64 x 64 floats into the tile's one workspace part (fl3_dq_out2_kernel<OWN>
//          reads that layout), so the bar.sync 1 that made each warpgroup wait for the other's
//          dS^T every step goes (ncu at hd 128: 7% of the stall samples sat there); a warpgroup
//          whose keys see none of the tile adds nothing. Twice the bulk-add bytes (16 KB a
//          warpgroup a step). At hd 128 the 64-row dQ^T would not fit the registers; there the
//          bit is ignored. tools/sim_flash3.py replays OPT 4 and 6 (and catches a warpgroup that
//          reads the other's dS^T part, or an idle warpgroup that adds). On an H200 both passed
//          test_ops_cuda (1570 checks) and, forward + backward at hd 64, B*T = 16k, 6 took
//          0.90-0.96x OPT 2's time (T 1k-8k) and 4 1.03-1.05x
//          (bench/results/attention_2026-11-30_NVIDIA_H200_834512f.txt): without the split waits
//          the doubled bulk adds cost more than the barrier saved, with them less.
//   bit 8  (not written: issue dQ^T of step it with step it + 1's S^T / dP^T) for a later session.
// All 8 instantiations (hd 64 / 128 x OPT 0-3, per type): 0 spills, 0 stack, 168 registers at
// launch, no C7513; the consumers' code reaches R235 / R237 / R225 / R225 at hd 128 for OPT
// 0 / 1 / 2 / 3 and R180 / R180 / R161 / R160 at 64. The SASS shows, with bit 2, wait_group 1,
// the 32 MUFU.EX2, then wait_group 0; with bit 1, wait_group.read 1 before the step's bar.sync 1
// and one named barrier fewer before the bulk add.
// tools/sim_flash3.py replays OPT 0-3 (wgmma group discipline, dQs buffers read by bulk adds
// completing at random times within the waits). On an H200 the same day all four passed
// test_ops_cuda (2080 checks) and, forward + backward against OPT 0, 2 ran 1.0-2.4% faster at hd
// 64 and 0-0.6% at 128, 1 within +-1%, 3 like 2
// (bench/results/attention_2026-11-30_NVIDIA_H200_b795bbc.txt): 2 is the default. Neither the
// bulk add nor the exponentials were what a step waited on; the backward is still 1.5-1.7x
// cuDNN's. Next: bit 4, and a profile (ncu is on the lent machine) before more guessing.
// The profile (ncu, B4 T4096 H16 KV8 hd128, 2026-11-30): with the (b, kv head) pairs fastest in
// the grid the kernel took 2.23 ms, read 5.0 GB from DRAM (67% busy, L2 hits 24%: Q, dO and dQ's
// workspace re-read by each of 132 different heads at once), the tensor pipe 32% busy; the
// consumers' top stall (24% of samples) was the wait on the producer's full[] barrier, and the
// dK / dV epilogue's load-then-store pairs drew 12%. With the key blocks of a head consecutive
// and longest first (tile_of) and every epilogue load before its stores (add_rows): 1.66 ms,
// DRAM 8% busy, L2 hits 90%, tensor pipe 43% (cuDNN's backward: 1.30 ms, 59%); forward +
// backward 0.70-0.76x the time before at hd 128 and 0.76-0.80x at 64
// (bench/results/attention_2026-11-30_NVIDIA_H200_2cc4359.txt). What stalls now is the wgmma
// waits (15%) and the bar.sync 1 between the consumer warpgroups (7%), as in cuDNN's kernel.
//
// The design follows FlashAttention-3's backward on Hopper, in one pass over the key blocks:
// Block: 384 threads. Warpgroups 0 and 1 consume (64 keys each, BK = 128 keys of one (b, kv
// head), dK and dV accumulated in registers as in fl3_dkdv_kernel); warpgroup 2 produces: it
// gives its registers away (setmaxnreg: 24 for it, 240 for the consumers) and its warp 0 alone
// works: TMA (cp.async.bulk.tensor, 128-byte swizzle, the layout load_tile writes) of K and V once,
// then per step the Q and dO tiles of 64 queries (B2Q; fl3_dkdv_kernel has 32 at hd 128) into a
// 2-stage ring, the lse and D rows by ordinary loads and stores. Per stage two mbarriers:
//   full[s]   33 arrivals (lane 0's arrive.expect_tx with the TMA bytes, then each of the 32 lanes
//             after its lse / D stores) plus the TMA transaction bytes; the consumers wait on it
//   empty[s]  256 arrivals, one per consumer thread once its wgmmas that read the stage are done;
//             the producer waits on it before refilling (parity starts at 1: a fresh barrier's
//             previous phase counts as complete)
// and kvb (1 arrival + K/V bytes). Step it uses stage it % 2, phase (it / 2) % 2.
// Per step the consumers do fl3_dkdv_kernel<DQ = true>'s 5 GEMMs (S^T, dP^T, dV, dK, dQ^T) with
// dS^T double-buffered in shared memory (so one named barrier a step between the two consumer
// warpgroups suffices), and dQ goes out without per-thread atomics: each consumer warpgroup
// stores its dQ^T part (hd 128: 64 of the HD rows x 64 queries; hd 64: all 64 rows x 32 queries)
// to shared memory in its fragment order, and one thread adds that 8-16 KB with a single
// cp.reduce.async.bulk .add.f32 into the fp32 workspace (FA3 does the same with its dQaccum).
// fl3_dq_out2_kernel then undoes the fragment order and adds ws / sqrt(HD) into dqkv.
// Workspace ws: (B, H, Tp / 64 tiles, 2 warpgroup parts, DQA / 4, 128 threads, 4) floats, each
// part 64 * DQN floats; a tile's two parts are 64 * HD floats (ct_fl3_bwd_ws_floats, like form 1).
// dQ's bits can vary from run to run (reduction order), as with CT_FLASH3_DQ_ATOMIC=1.
constexpr int B2Q = 64;        // queries per step
constexpr int B2T = NT + 128;  // two consumer warpgroups + the producer warpgroup

// dQ^T columns (queries) per consumer warpgroup: hd 128 splits the HD rows, hd 64 the queries;
// with CT_FLASH3_BWD2_OPT bit 4 (OWN, hd 64) each warpgroup has all 64 queries over its own keys
template <int HD, bool OWN = false> __host__ __device__ constexpr int b2_dqn() {
  return HD == 128 || OWN ? 64 : 32;
}

// shared memory, byte offsets from the 1024-aligned base: K, V (BK rows), 2 stages of Q and dO
// (B2Q rows), 2 buffers of dS^T (B2Q rows x 128 keys), the dQ^T staging of the two warpgroups,
// 2 stages of lse and D, 5 mbarriers
// (NDQ = 2 dQ^T staging buffers per warpgroup with CT_FLASH3_BWD2_OPT bit 1, else 1)
template <int HD, int NDQ = 1, bool OWN = false> struct b2_smem {
  static constexpr int KBy = BK * 128, QBy = B2Q * 128, NB = HD / 64,
                       DQBy = 64 * b2_dqn<HD, OWN>() * 4;
  static constexpr int K = 0, V = K + NB * KBy, Q = V + NB * KBy, dO = Q + 2 * NB * QBy;
  static constexpr int dS = dO + 2 * NB * QBy, dQ = dS + 2 * 2 * QBy;
  static constexpr int L = dQ + NWG * NDQ * DQBy, Dd = L + 2 * B2Q * 4;
  static constexpr int bar = Dd + 2 * B2Q * 4, total = bar + 8 * 8;
};
template <int HD, int NDQ = 1, bool OWN = false> constexpr size_t b2_smem_bytes() {
  return (size_t)b2_smem<HD, NDQ, OWN>::total + 1024;
}
// 227 KB, the most dynamic shared memory a block may have on sm_90: hd 128 with two dQ^T
// buffers takes 231488 bytes of the 232448 (1024 of them the alignment slack)
static_assert(b2_smem_bytes<128, 2>() <= 232448 && b2_smem_bytes<64, 2>() <= 232448 &&
                  b2_smem_bytes<64, 1, true>() <= 232448,
              "fl3_bwd2_kernel's shared memory");

__device__ __forceinline__ uint32_t sa_of(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sa_of(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sa_of(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t *b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sa_of(b)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra wait_%=;\n}\n" ::"r"(sa_of(b)),
      "r"(parity)
      : "memory");
}
// box (64 columns, rows, 1) at coordinates (x, y, z) of a 3-D tensor map into dst (1024-aligned),
// completing on mbarrier b
__device__ __forceinline__ void tma_load3(void *dst, const CUtensorMap *m, int x, int y, int z,
                                          uint64_t *b) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(sa_of(dst)),
               "l"((uint64_t)m), "r"(x), "r"(y), "r"(z), "r"(sa_of(b))
               : "memory");
}
// global fp32 dst[0 .. bytes / 4) += shared src (bulk, asynchronous: a bulk group of this thread)
__device__ __forceinline__ void bulk_reduce_add(float *dst, const void *src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   dst),
               "r"(sa_of(src)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read0() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// all but this thread's most recent bulk group have finished reading their shared memory
__device__ __forceinline__ void bulk_wait_read1() {
  asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait0() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int N> __device__ __forceinline__ void keep_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}

template <int HD, typename E, int OPT>
__global__ void __launch_bounds__(B2T, 1)
    fl3_bwd2_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tkv,
                    const __grid_constant__ CUtensorMap tdo, E *dqkv, float *ws, const float *lse,
                    const float *D, int T, int H, int KV, float sl2, float scale) {
  constexpr bool DB = OPT & 1, SPLIT = OPT & 2; // CT_FLASH3_BWD2_OPT's bits (see STATUS)
  constexpr bool OWN = (OPT & 4) && HD == 64;  // bit 4: dQ over each warpgroup's own keys
  static_assert(!(OWN && DB), "fl3_bwd2_kernel: bit 4 has one dQ^T staging buffer");
  using SL = b2_smem<HD, DB ? 2 : 1, OWN>;
  constexpr int SN = B2Q / 2, OD = HD / 2, DQN = b2_dqn<HD, OWN>(), DQA = DQN / 2;
  constexpr int KBy = SL::KBy, QBy = SL::QBy, NB = SL::NB;
  extern __shared__ char smem_raw[];
  char *sm = (char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint64_t *full = reinterpret_cast<uint64_t *>(sm + SL::bar), *empty = full + 2, *kvb = full + 4;
  const tile_id ti = tile_of((T + BK - 1) / BK); // key block 0, which sees every query, first
  const int kb = ti.t, b = ti.bh / KV, kv = ti.bh % KV, grp = H / KV;
  const int kb0 = kb * BK, i0 = kb0 / B2Q, nq = (T + B2Q - 1) / B2Q - i0, total = grp * nq;
  const int wg = (int)threadIdx.x >> 7, warp = ((int)threadIdx.x >> 5) & 3,
            lane = (int)threadIdx.x & 31;
  if (threadIdx.x == 0) {
    mbar_init(&full[0], 33);
    mbar_init(&full[1], 33);
    mbar_init(&empty[0], NT);
    mbar_init(&empty[1], NT);
    mbar_init(kvb, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the TMA unit
  }
  __syncthreads(); // the last block-wide barrier: the producer's idle warps leave below
  if (wg == NWG) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (warp != 0) return;
    if (lane == 0) {
      mbar_arrive_tx(kvb, 2u * BK * HD * 2);
#pragma unroll
      for (int cb = 0; cb < NB; cb++) {
        tma_load3(sm + SL::K + cb * KBy, &tkv, (H + kv) * HD + cb * 64, kb0, b, kvb);
        tma_load3(sm + SL::V + cb * KBy, &tkv, (H + KV + kv) * HD + cb * 64, kb0, b, kvb);
      }
    }
    for (int it = 0; it < total; it++) {
      const int stg = it & 1, h = kv * grp + it / nq, q0 = (i0 + it % nq) * B2Q;
      mbar_wait(&empty[stg], ((it >> 1) & 1) ^ 1);
      if (lane == 0) {
        mbar_arrive_tx(&full[stg], 2u * B2Q * HD * 2);
#pragma unroll
        for (int cb = 0; cb < NB; cb++) { // rows past T: the TMA fills zeros
          tma_load3(sm + SL::Q + (stg * NB + cb) * QBy, &tq, h * HD + cb * 64, q0, b, &full[stg]);
          tma_load3(sm + SL::dO + (stg * NB + cb) * QBy, &tdo, h * HD + cb * 64, q0, b,
                    &full[stg]);
        }
      }
      float *Ls = reinterpret_cast<float *>(sm + SL::L) + stg * B2Q;
      float *Ds = reinterpret_cast<float *>(sm + SL::Dd) + stg * B2Q;
      const long sr = ((long)b * H + h) * T;
#pragma unroll
      for (int x = lane; x < B2Q; x += 32) { // padding queries: lse = +inf makes P = 0
        const int t = q0 + x;
        Ls[x] = t < T ? lse[sr + t] : INFINITY;
        Ds[x] = t < T ? D[sr + t] : 0.0f;
      }
      mbar_arrive(&full[stg]); // release: the stores above are seen after the consumers' wait
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int g = lane >> 2, tg = lane & 3, tid = (int)threadIdx.x & 127;
  const int w0 = kb0 + wg * 64, k0 = w0 + warp * 16 + g, k1 = k0 + 8;
  const int mt = HD == 128 ? wg : 0, n0 = HD == 128 || OWN ? 0 : wg * 32;
  const long ntile = ws_rows(T) / 64;
  const char *Ks = sm + SL::K, *Vs = sm + SL::V;
  char *dQw = sm + SL::dQ + wg * (DB ? 2 : 1) * SL::DQBy; // this warpgroup's dQ^T buffer(s)
  float dk[OD], dv[OD], st[SN], dpt[SN], dq[DQA];
  uint32_t pa[B2Q / 16][4], sa[B2Q / 16][4];
#pragma unroll
  for (int i = 0; i < OD; i++) dk[i] = dv[i] = 0.0f;
  mbar_wait(kvb, 0);
  for (int it = 0; it < total; it++) {
    const int stg = it & 1, qt = i0 + it % nq, qbase = qt * B2Q;
    // warpgroup-uniform: some query of the tile is at or after one of this warpgroup's keys
    // (always true for warpgroup 0: the steps start at the tile that holds key kb0)
    const bool on = w0 < T && qbase + B2Q - 1 >= w0;
    const char *Q = sm + SL::Q + stg * NB * QBy, *dO = sm + SL::dO + stg * NB * QBy;
    const float *L = reinterpret_cast<const float *>(sm + SL::L) + stg * B2Q;
    const float *Dd = reinterpret_cast<const float *>(sm + SL::Dd) + stg * B2Q;
    char *dSs = sm + SL::dS + (it & 1) * 2 * QBy;
    mbar_wait(&full[stg], (it >> 1) & 1);
    if (on) {
      fence_regs(st);
      fence_regs(dpt);
      wg_fence();
      // st[nt*4 + {0,1,2,3}] = (k0, q), (k0, q+1), (k1, q), (k1, q+1), q = qbase + nt*8 + tg*2
      const bool diag = qbase < w0 + 63;
      auto probs = [&] { // P = exp2(S sl2 - lse) in st's registers, masked on the diagonal
#pragma unroll
        for (int nt = 0; nt < B2Q / 8; nt++) {
          const int ql = nt * 8 + tg * 2;
          const float l0 = L[ql], l1 = L[ql + 1];
          st[nt * 4 + 0] = ex2(fmaf(st[nt * 4 + 0], sl2, -l0));
          st[nt * 4 + 1] = ex2(fmaf(st[nt * 4 + 1], sl2, -l1));
          st[nt * 4 + 2] = ex2(fmaf(st[nt * 4 + 2], sl2, -l0));
          st[nt * 4 + 3] = ex2(fmaf(st[nt * 4 + 3], sl2, -l1));
        }
        // the mask as one branch after all the exponentials: ptxas keeps instructions above such
        // a branch's region (it sank those below an mbarrier wait's loop, see below)
        if (diag) {
#pragma unroll
          for (int nt = 0; nt < B2Q / 8; nt++) {
            const int q = qbase + nt * 8 + tg * 2;
            if (q < k0) st[nt * 4 + 0] = 0.0f;
            if (q + 1 < k0) st[nt * 4 + 1] = 0.0f;
            if (q < k1) st[nt * 4 + 2] = 0.0f;
            if (q + 1 < k1) st[nt * 4 + 3] = 0.0f;
          }
        }
      };
      auto dsoft = [&] { // dS = P (dP - D) in dpt's registers
#pragma unroll
        for (int nt = 0; nt < B2Q / 8; nt++) {
          const int ql = nt * 8 + tg * 2;
          const float d0 = Dd[ql], d1 = Dd[ql + 1];
          dpt[nt * 4 + 0] = st[nt * 4 + 0] * (dpt[nt * 4 + 0] - d0);
          dpt[nt * 4 + 1] = st[nt * 4 + 1] * (dpt[nt * 4 + 1] - d1);
          dpt[nt * 4 + 2] = st[nt * 4 + 2] * (dpt[nt * 4 + 2] - d0);
          dpt[nt * 4 + 3] = st[nt * 4 + 3] * (dpt[nt * 4 + 3] - d1);
        }
      };
      if constexpr (SPLIT) {
        // S^T and dP^T as two wgmma groups: the exponentials run while dP^T is on the tensor cores
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
          const int cb = ks >> 2, kin = (ks & 3) * 32;
          mma<E>::qk(st, desc(Ks + cb * KBy + wg * 64 * 128 + kin, 16, 1024),
                     desc(Q + cb * QBy + kin, 16, 1024), ks > 0);
        }
        wg_commit();
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
          const int cb = ks >> 2, kin = (ks & 3) * 32;
          mma<E>::qk(dpt, desc(Vs + cb * KBy + wg * 64 * 128 + kin, 16, 1024),
                     desc(dO + cb * QBy + kin, 16, 1024), ks > 0);
        }
        wg_commit();
        wg_wait1(); // S^T done, dP^T may still run
        fence_regs(st);
        probs();
        fence_regs(st);
        // ptxas hoists a wgmma wait within its basic block (forward form 2's lesson; here it put
        // this one before the exponentials, and a second wait on full[stg] placed here did not
        // help: ptxas sank 28 of the 32 exponentials below its try_wait loop)
        wg_wait0();
        fence_regs(dpt);
        dsoft();
      } else {
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
          const int cb = ks >> 2, kin = (ks & 3) * 32;
          const uint64_t dbq = desc(Q + cb * QBy + kin, 16, 1024);
          const uint64_t dd = desc(dO + cb * QBy + kin, 16, 1024);
          mma<E>::qk(st, desc(Ks + cb * KBy + wg * 64 * 128 + kin, 16, 1024), dbq, ks > 0);
          mma<E>::qk(dpt, desc(Vs + cb * KBy + wg * 64 * 128 + kin, 16, 1024), dd, ks > 0);
        }
        wg_commit();
        wg_wait0();
        fence_regs(st);
        fence_regs(dpt);
#pragma unroll
        for (int nt = 0; nt < B2Q / 8; nt++) { // probs and dsoft in one loop, as before the variants
          const int ql = nt * 8 + tg * 2, q = qbase + ql;
          const float l0 = L[ql], l1 = L[ql + 1], d0 = Dd[ql], d1 = Dd[ql + 1];
          float p0 = ex2(fmaf(st[nt * 4 + 0], sl2, -l0)), p1 = ex2(fmaf(st[nt * 4 + 1], sl2, -l1));
          float p2 = ex2(fmaf(st[nt * 4 + 2], sl2, -l0)), p3 = ex2(fmaf(st[nt * 4 + 3], sl2, -l1));
          if (diag) {
            if (q < k0) p0 = 0.0f;
            if (q + 1 < k0) p1 = 0.0f;
            if (q < k1) p2 = 0.0f;
            if (q + 1 < k1) p3 = 0.0f;
          }
          st[nt * 4 + 0] = p0;
          st[nt * 4 + 1] = p1;
          st[nt * 4 + 2] = p2;
          st[nt * 4 + 3] = p3;
          dpt[nt * 4 + 0] = p0 * (dpt[nt * 4 + 0] - d0);
          dpt[nt * 4 + 1] = p1 * (dpt[nt * 4 + 1] - d1);
          dpt[nt * 4 + 2] = p2 * (dpt[nt * 4 + 2] - d0);
          dpt[nt * 4 + 3] = p3 * (dpt[nt * 4 + 3] - d1);
        }
      }
#pragma unroll
      for (int kc = 0; kc < B2Q / 16; kc++) {
        const float *c0 = st + 8 * kc, *c1 = st + 8 * kc + 4;
        pa[kc][0] = mma<E>::pack(c0[0], c0[1]);
        pa[kc][1] = mma<E>::pack(c0[2], c0[3]);
        pa[kc][2] = mma<E>::pack(c1[0], c1[1]);
        pa[kc][3] = mma<E>::pack(c1[2], c1[3]);
        const float *e0 = dpt + 8 * kc, *e1 = dpt + 8 * kc + 4;
        sa[kc][0] = mma<E>::pack(e0[0], e0[1]);
        sa[kc][1] = mma<E>::pack(e0[2], e0[3]);
        sa[kc][2] = mma<E>::pack(e1[0], e1[1]);
        sa[kc][3] = mma<E>::pack(e1[2], e1[3]);
      }
      // dS^T -> dSs as in fl3_dkdv_kernel<DQ = true>: query row q, this warpgroup's column block
      const int kl = warp * 16 + (lane & 8);
#pragma unroll
      for (int kc = 0; kc < B2Q / 16; kc++) {
        const int q = kc * 16 + (lane >> 4) * 8 + (lane & 7);
        stsm_x4_trans(dSs + wg * QBy + q * 128 + (((kl >> 3) ^ (q & 7)) << 4), sa[kc]);
      }
      fence_async_smem(); // for the dQ wgmma (async proxy), after the barrier below
      fence_regs(dv);
      fence_regs(dk);
      wg_fence();
#pragma unroll
      for (int kc = 0; kc < B2Q / 16; kc++) { // 16 queries: 16 rows of 128 bytes into each block
        mma<E>::pv(dv, pa[kc], desc(dO + kc * 2048, QBy, 1024), 1);
        mma<E>::pv(dk, sa[kc], desc(Q + kc * 2048, QBy, 1024), 1);
      }
      wg_commit();
    }
    // double-buffered dQs: step it - 2's bulk add (the last from buffer it % 2) has read it, made
    // known to this warpgroup's threads by the barrier below
    if (DB && tid == 0) bulk_wait_read1();
    // dQ^T = K^T dS^T over key steps ks0 .. ks0 + nks - 1 (16 keys each)
    auto dq_mma = [&](auto nks, int ks0) {
      fence_regs(dq);
      wg_fence();
#pragma unroll
      for (int i = 0; i < decltype(nks)::value; i++) {
        const int ks = ks0 + i, cb = ks >> 2, kin = (ks & 3) * 32;
        mma<E>::ta(dq, desc(Ks + mt * KBy + ks * 2048, KBy, 1024),
                   desc(dSs + cb * QBy + n0 * 128 + kin, 16, 1024), i > 0);
      }
      wg_commit();
    };
    if constexpr (OWN) {
      // bit 4: this warpgroup's 64 keys only, all 64 queries, so neither warpgroup waits for
      // the other; its own dS^T stores are made visible to its wgmma by its own barrier
      if (on) {
        bar_sync(2 + wg, 128);
        dq_mma(std::integral_constant<int, 4>(), wg * 4);
      }
    } else {
      bar_sync(1, NT); // both consumer warpgroups' dS^T are in dSs (the producer is not counted)
      // over the block's 128 keys (64 when warpgroup 1's keys see none of the tile)
      const bool on1 = kb0 + 64 < T && qbase + B2Q - 1 >= kb0 + 64;
      if (on1) dq_mma(std::integral_constant<int, BK / 16>(), 0);
      else dq_mma(std::integral_constant<int, 4>(), 0);
    }
    wg_wait0();
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(dq);
    keep_regs(pa); // the dV / dK wgmmas read them until the wait above
    keep_regs(sa);
    mbar_arrive(&empty[stg]); // this thread's reads of stage stg are done
    if (OWN && !on) continue; // bit 4: no dQ from keys that see none of the tile
    // dQ^T part -> dQs in fragment order (float4 j of thread tid at (j * 128 + tid) * 16 bytes:
    // a warp's stores are 512 contiguous bytes), then one bulk add into the workspace
    char *dQs = dQw + (DB ? (it & 1) * SL::DQBy : 0);
    if (!DB) {
      if (tid == 0) bulk_wait_read0(); // the previous step's bulk add has read dQs
      bar_sync(2 + wg, 128);
    }
#pragma unroll
    for (int j = 0; j < DQA / 4; j++)
      reinterpret_cast<float4 *>(dQs)[j * 128 + tid] =
          make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
    fence_async_smem(); // generic stores, read next by the bulk copy (async proxy)
    bar_sync(2 + wg, 128);
    if (tid == 0) {
      const int h = kv * grp + it / nq;
      // bit 4: both warpgroups add their 64 x 64 into the tile's one part
      const long part = OWN ? ((long)(b * H + h) * ntile + qt) * 64 * HD
                            : (((long)(b * H + h) * ntile + qt) * NWG + wg) * 64 * DQN;
      bulk_reduce_add(ws + part, dQs, 64u * DQN * 4);
    }
  }
  if (tid == 0) bulk_wait0(); // before the block's shared memory goes
  // dk[i*4 + {0,1,2,3}] = (k0, d), (k0, d+1), (k1, d), (k1, d+1), d = i*8 + tg*2
  const long W3 = (long)(H + 2 * KV) * HD, koff = (long)(H + kv) * HD,
             voff = (long)(H + KV + kv) * HD;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int key = half ? k1 : k0;
    if (key >= T) continue;
    E *d = dqkv + ((long)b * T + key) * W3;
    add_rows<HD, 2, E>({d + koff, d + voff}, {dk, dv}, {scale, 1.0f}, half, tg);
  }
}

// dqkv's query columns += ws * scale for one (b, h) and 64 queries a block, ws being
// fl3_bwd2_kernel's dQ^T parts in fragment order: the tile's 64 * HD floats go to shared memory
// as they lie (coalesced), and each (query, d) is looked up by the accumulator layout.
template <int HD, typename E, bool OWN = false>
__global__ void __launch_bounds__(256)
    fl3_dq_out2_kernel(E *dqkv, const float *ws, int T, int H, int KV, float scale) {
  constexpr int DQN = b2_dqn<HD, OWN>();
  __shared__ float4 tile[64 * HD / 4];
  const int b = (int)blockIdx.x / H, h = (int)blockIdx.x % H, qt = (int)blockIdx.y, t0 = qt * 64;
  const long W3 = (long)(H + 2 * KV) * HD;
  const float4 *src = reinterpret_cast<const float4 *>(
      ws + ((long)blockIdx.x * gridDim.y + qt) * 64 * HD);
  for (int i = (int)threadIdx.x; i < 64 * HD / 4; i += 256) tile[i] = src[i];
  __syncthreads();
  const float *f = reinterpret_cast<const float *>(tile);
  for (int i = (int)threadIdx.x; i < 64 * (HD / 2); i += 256) {
    const int tt = i / (HD / 2), d = i % (HD / 2) * 2, t = t0 + tt;
    if (t >= T) break; // i only grows
    // element (row, col) of part p's m64 x DQN accumulator: thread 32 (row / 16) + 4 (row % 8) +
    // col % 8 / 2, register 4 (col / 8) + 2 (row % 16 / 8) + col % 2 (d and d + 1: the next row)
    const int p = DQN == 64 ? d / 64 : tt / 32, col = DQN == 64 ? tt : tt % 32;
    float v[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int row = (d + e) % 64;
      const int th = 32 * (row / 16) + 4 * (row % 8) + col % 8 / 2;
      const int r = 4 * (col / 8) + 2 * (row % 16 / 8) + col % 2;
      v[e] = f[p * 64 * DQN + ((r / 4) * 128 + th) * 4 + r % 4];
    }
    uint32_t *pq = reinterpret_cast<uint32_t *>(dqkv + ((long)b * T + t) * W3 + (long)h * HD + d);
    const float2 o = mma<E>::unpack(*pq);
    *pq = mma<E>::pack(o.x + v[0] * scale, o.y + v[1] * scale);
  }
}

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime's driver entry point (NULL where the driver lacks it)
encode_tiled_fn encode_tiled() {
  static encode_tiled_fn fn;
  static int tried;
  if (!tried) {
    tried = 1;
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (encode_tiled_fn)p;
  }
  return fn;
}

// A map of rows (B, T, width) of 16-bit elements at p: boxes of 64 columns x `rows` rows x 1,
// 128-byte swizzle (load_tile's layout), rows past T read as zeros.
bool tmap_rows(CUtensorMap *m, encode_tiled_fn fn, int fp16, const void *p, long width, int T,
               int B, int rows) {
  const cuuint64_t dim[3] = {(cuuint64_t)width, (cuuint64_t)T, (cuuint64_t)B};
  const cuuint64_t stride[2] = {(cuuint64_t)width * 2, (cuuint64_t)width * 2 * T};
  const cuuint32_t box[3] = {64, (cuuint32_t)rows, 1}, estr[3] = {1, 1, 1};
  return fn(m, fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
            const_cast<void *>(p), dim, stride, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int HD, typename E>
int launch_bwd2(E *dqkv, float *ws, const E *dout, const E *qkv, const float *lse, const float *D,
                int B, int T, int H, int KV, int opt, cudaStream_t st) {
  const encode_tiled_fn fn = encode_tiled();
  if (!fn) return -1;
  const int half16 = std::is_same<E, f16>::value;
  const long W3 = (long)(H + 2 * KV) * HD;
  CUtensorMap tq, tkv, tdo;
  if (!tmap_rows(&tq, fn, half16, qkv, W3, T, B, B2Q) || !tmap_rows(&tkv, fn, half16, qkv, W3, T, B, BK) ||
      !tmap_rows(&tdo, fn, half16, dout, (long)H * HD, T, B, B2Q))
    return -1;
  if (cudaMemsetAsync(ws, 0, sizeof(float) * (size_t)B * H * HD * ws_rows(T), st) != cudaSuccess)
    return -2;
  const float scale = 1.0f / sqrtf((float)HD), sl2 = 1.4426950408889634f * scale;
  const dim3 grid = tile_grid((T + BK - 1) / BK, B * KV);
  // one instantiation per combination of bits 1 and 2 (compile time: 4 per head dim and type),
  // and at hd 64 bit 4 with and without bit 2 (bit 4 clears bit 1; at hd 128 it is ignored)
  auto go = [&](auto o) {
    constexpr int OPT = decltype(o)::value;
    constexpr bool OWN = (OPT & 4) && HD == 64;
    constexpr size_t smem = b2_smem_bytes<HD, (OPT & 1) ? 2 : 1, OWN>();
    static int attr;
    if (!smem_once(fl3_bwd2_kernel<HD, E, OPT>, smem, &attr)) return false;
    fl3_bwd2_kernel<HD, E, OPT><<<grid, B2T, smem, st>>>(tq, tkv, tdo, dqkv, ws, lse, D, T, H, KV,
                                                         sl2, scale);
    if (cudaGetLastError() != cudaSuccess) return false;
    const dim3 g2((unsigned)(B * H), (unsigned)(ws_rows(T) / 64));
    fl3_dq_out2_kernel<HD, E, OWN><<<g2, 256, 0, st>>>(dqkv, ws, T, H, KV, scale);
    return cudaGetLastError() == cudaSuccess;
  };
  bool ok = false;
  if constexpr (HD == 64) {
    if (opt & 4) {
      ok = opt & 2 ? go(std::integral_constant<int, 6>()) : go(std::integral_constant<int, 4>());
      return ok ? 0 : -2;
    }
  }
  switch (opt & 3) {
  case 1: ok = go(std::integral_constant<int, 1>()); break;
  case 2: ok = go(std::integral_constant<int, 2>()); break;
  case 3: ok = go(std::integral_constant<int, 3>()); break;
  default: ok = go(std::integral_constant<int, 0>()); break;
  }
  return ok ? 0 : -2;
}

template <typename E>
int bwd2(void *dqkv, float *ws, const void *dout, const void *qkv, const float *lse,
         const float *D, int B, int T, int H, int KV, int hd, int opt, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return by_hd(hd, [&](auto h) {
    return launch_bwd2<h(), E>((E *)dqkv, ws, (const E *)dout, (const E *)qkv, lse, D, B, T, H, KV,
                               opt, st);
  });
}

} // namespace

extern "C" int ct_fl3_bwd2(int fp16, void *dqkv, float *ws, const void *dout, const void *qkv,
                           const float *lse, const float *D, int B, int T, int H, int KV, int hd,
                           int opt, void *stream) {
  return fp16 ? bwd2<f16>(dqkv, ws, dout, qkv, lse, D, B, T, H, KV, hd, opt, stream)
              : bwd2<bf16>(dqkv, ws, dout, qkv, lse, D, B, T, H, KV, hd, opt, stream);
}

namespace {

// ---- forward, form 2 (the default): a producer warp, TMA, 128-key tiles, S_{j+1} over softmax_j ----
// STATUS: written without a GPU at hand (2026-11-30, session 8); compiles for sm_90a (ptxas: 0
// spills, 0 stack; 168 registers at launch, the consumers' code reaching R183 at hd 128 and R151
// at 64 under their setmaxnreg 240; no C7513 "wgmma serialized" warning; the SASS shows the loop's
// order: wait 0, issue 8 + 8 HGMMA, wait 1, then the exponentials) and tools/sim_flash3.py
// replays its indexing against plain attention to 1e-15. On its first GPU run (H200, the same
// day) it passed test_ops_cuda's attention checks against the CPU reference and took 0.62-0.85x
// form 1's time at hd 128 (486-586 TFLOP/s from T 2048, cuDNN 470-604) and 0.85-0.93x at hd 64
// from T 4096, but 1.07-1.17x at hd 64 and T 1024-2048
// (bench/results/attention_2026-11-30_NVIDIA_H200_5dbda21.txt). With the heads' tiles consecutive
// in the grid (tile_of, 2cc4359; ncu had shown it 44% DRAM-busy re-reading K and V) it runs at
// 209 (hd 64, T 1024) to 613 TFLOP/s (hd 128, T 8192; cuDNN 611 there). Against form 1 with its
// two blocks a multiprocessor (cc145e4): the same time at hd 64, T 1024 (156 against 154 us),
// 0.84-0.91x from T 2048 and 0.62-0.79x at hd 128, so it is the default at every shape
// (bench/results/call22_cc145e4.txt, attention_2026-11-30_NVIDIA_H200_2cc4359.txt). Next: ping-pong between the two
// consumer warpgroups (named barriers), which FA3 adds on top of the in-warpgroup overlap; at hd
// 64 ncu shows the tensor pipe 31% busy (B8 T2048).
// A hang is a barrier phase or transaction count that does not add up (see the mbarriers below).
// Form 1 (fl3_fwd_kernel) reached 60% of cuDNN at head dim 128 on an H200: its consumers load
// K / V themselves and wait on each GEMM before the softmax, so the tensor cores idle while the
// softmax runs. Form 2 follows FlashAttention-3's forward:
// Block: 384 threads, one (b, h) and BM = 128 query rows (reversed order, as form 1). Warpgroups
// 0 and 1 consume (64 rows each); warpgroup 2 produces: it gives its registers away (setmaxnreg:
// 24 for it, 240 for the consumers, as backward form 2) and one thread of it issues every load:
// Q once, then per key tile j the K and V tiles of F2N = 128 keys into a 2-stage ring, all by TMA
// (one tensor map over qkv with boxes of 64 columns x 128 rows in the 128-byte swizzle that
// load_tile writes; rows past T read as zeros). K and V have their own mbarriers so that K_j can
// be refilled as soon as S_j is done, while V_j is still being read:
//   fullk[s], fullv[s]    1 arrival (the producer's arrive.expect_tx) + the TMA bytes
//   emptyk[s], emptyv[s]  256 arrivals, one per consumer thread once its wgmmas that read the
//                         tile are done (parity starts at 1 for the producer, as backward form 2)
//   qbar                  1 arrival + Q's bytes
// Tile j uses stage j % 2, phase (j / 2) % 2; the producer issues K_0, then K_{j+1} before V_j.
// Iteration j (>= 1) of a consumer warpgroup:
//   wait for P_{j-2} V_{j-2} (wait_group 0), release V_{j-2}, rescale O by exp2(m_{j-2} -
//     m_{j-1}), pack P_{j-1} into 16-bit A fragments
//   issue S_j = Q K_j^T         wgmma m64n128k16, A and B from shared memory (as form 1)
//   issue O += P_{j-1} V_{j-1}  wgmma m64n{HD}k16, P from registers (as form 1), k = 128 keys
//   wait for S_j (wait_group 1: the PV group keeps running), release K_j
//   softmax of S_j              mask (diagonal tile only), row max m_j, P_j = exp2(S sl2 - m_j)
//                               in S's registers, row sums
// so the exponentials of tile j overlap the tensor cores' P_{j-1} V_{j-1}; tile 0 comes before
// the loop, the last PV after it. The PV wait sits at the top of the next iteration, not after the
// softmax: ptxas hoists a wgmma wait within its basic block (it put one written after the softmax
// before the exponentials), and the mbarrier waits' loops end the block before it.
// No inter-warpgroup ping-pong yet (FA3 adds one with named barriers: a next step).
// Tiles of 128 keys: S is 64 floats a thread, O HD / 2, P 32 registers: 160 + addresses at hd 128,
// inside the consumers' 240; hd 64 keeps 128-key tiles too (S 64, O 32, P 32), halving the
// tiles' fixed costs (barriers, row-max shuffles, O rescale). If hd 64 times slower than form 1
// on the GPU, fl3_fwd_launch (ops_cuda.cu) can take form 2 at hd 128 only. Shared memory: Q BM x HD, 2 stages of K and V (F2N x HD): 160 KB at
// hd 128, 80 KB at 64 (one block per SM either way: the registers allow one). F2N = BM, so a
// block's key tiles are 0 .. qb and only the last one crosses the diagonal (there warpgroup 0's
// rows see only half the keys: masked, not skipped; one tile of the block's qb + 1). Every row
// sees key q0 in the diagonal tile and key 0 in the first, so every tile's row max is finite.
// Outputs are fl3_fwd_kernel's (fwd_store), so either backward follows.
constexpr int F2N = 128;       // keys per tile
constexpr int F2T = NT + 128;  // two consumer warpgroups + the producer warpgroup
static_assert(F2N == BM, "fl3_fwd2_kernel: the diagonal is the last key tile only if F2N == BM");

// shared memory, byte offsets from the 1024-aligned base: Q, 2 stages of K, 2 of V, 9 mbarriers
template <int HD> struct f2_smem {
  static constexpr int NB = HD / 64, QBy = BM * 128, KBy = F2N * 128;
  static constexpr int Q = 0, K = Q + NB * QBy, V = K + 2 * NB * KBy, bar = V + 2 * NB * KBy;
  static constexpr int total = bar + 9 * 8;
};
template <int HD> constexpr size_t f2_smem_bytes() { return (size_t)f2_smem<HD>::total + 1024; }

template <int HD, typename E>
__global__ void __launch_bounds__(F2T, 1)
    fl3_fwd2_kernel(const __grid_constant__ CUtensorMap tm, E *out, float *lse, E *ocopy, int T,
                    int H, int KV, float sl2, int gh) {
  using SL = f2_smem<HD>;
  constexpr int NB = SL::NB, QBy = SL::QBy, KBy = SL::KBy, OD = HD / 2, SN = F2N / 2;
  extern __shared__ char smem_raw[];
  char *sm = (char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint64_t *qbar = reinterpret_cast<uint64_t *>(sm + SL::bar), *fullk = qbar + 1,
           *fullv = qbar + 3, *emptyk = qbar + 5, *emptyv = qbar + 7;
  const int nqb = (T + BM - 1) / BM;
  const tile_id ti = tile_of(nqb, gh);
  const int qb = nqb - 1 - ti.t, q0 = qb * BM, nkv = qb + 1;
  const int b = ti.bh / H, h = ti.bh % H, kv = h / (H / KV);
  const int wg = (int)threadIdx.x >> 7, warp = ((int)threadIdx.x >> 5) & 3,
            lane = (int)threadIdx.x & 31;
  if (threadIdx.x == 0) {
    mbar_init(qbar, 1);
#pragma unroll
    for (int s = 0; s < 2; s++) {
      mbar_init(&fullk[s], 1);
      mbar_init(&fullv[s], 1);
      mbar_init(&emptyk[s], NT);
      mbar_init(&emptyv[s], NT);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the TMA unit
  }
  __syncthreads(); // the last block-wide barrier: the producer's idle threads leave below
  if (wg == NWG) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x != NT) return;
    mbar_arrive_tx(qbar, (uint32_t)BM * HD * 2);
#pragma unroll
    for (int cb = 0; cb < NB; cb++)
      tma_load3(sm + SL::Q + cb * QBy, &tm, h * HD + cb * 64, q0, b, qbar);
    // K runs one tile ahead of V: refilling K's stage needs only S_{j-1} done, V's needs
    // P_{j-2} V_{j-2} done, which the consumers report one iteration later (see below)
    auto load = [&](int t, bool v) {
      const int s = t & 1;
      uint64_t *full = v ? &fullv[s] : &fullk[s];
      mbar_wait(v ? &emptyv[s] : &emptyk[s], ((t >> 1) & 1) ^ 1);
      mbar_arrive_tx(full, (uint32_t)F2N * HD * 2);
#pragma unroll
      for (int cb = 0; cb < NB; cb++)
        tma_load3(sm + (v ? SL::V : SL::K) + (s * NB + cb) * KBy, &tm,
                  (v ? H + KV + kv : H + kv) * HD + cb * 64, t * F2N, b, full);
    };
    load(0, false);
    for (int j = 0; j < nkv; j++) {
      if (j + 1 < nkv) load(j + 1, false);
      load(j, true);
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int g = lane >> 2, tg = lane & 3;
  const int r0 = q0 + wg * 64 + warp * 16 + g, r1 = r0 + 8; // this thread's two rows
  const char *Qs = sm + SL::Q + wg * 64 * 128;                // this warpgroup's 64 rows
  float o[OD], s[SN];
  uint32_t p[F2N / 16][4];
#pragma unroll
  for (int i = 0; i < OD; i++) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  // O += P V_t over 128 keys: P's A fragment of k-step kc comes from S's n-blocks 2kc, 2kc+1; V's
  // k-step is 16 rows = 2048 bytes into each 64-column block, the blocks LBO = KBy apart
  auto pv = [&](int t) {
    const char *V = sm + SL::V + (t & 1) * NB * KBy;
#pragma unroll
    for (int kc = 0; kc < F2N / 16; kc++) mma<E>::pv(o, p[kc], desc(V + kc * 2048, KBy, 1024), 1);
    wg_commit();
  };
  // S = Q K_t^T over HD / 16 k-steps (a k-step is 32 bytes into a 128-byte swizzled row), issued
  auto qk = [&](int t) {
    const char *K = sm + SL::K + (t & 1) * NB * KBy;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
      const int cb = ks >> 2, kin = (ks & 3) * 32;
      mma<E>::qk(s, desc(Qs + cb * QBy + kin, 16, 1024), desc(K + cb * KBy + kin, 16, 1024),
                 ks > 0);
    }
    wg_commit();
  };
  // S_t -> P_t in s (unpacked): mask (the diagonal tile only), new row max (m0, m1), the factor
  // (a0, a1) that takes the old max's units to the new one, row sums (l0, l1) rescaled and added
  float a0, a1;
  auto softmax = [&](int t) {
    // s[nt*4 + {0,1,2,3}] = (r0, c), (r0, c+1), (r1, c), (r1, c+1), c = t*F2N + nt*8 + tg*2
    if (t == nkv - 1) {
#pragma unroll
      for (int nt = 0; nt < SN / 4; nt++) {
        const int key = t * F2N + nt * 8 + tg * 2;
        if (key > r0) s[nt * 4 + 0] = -INFINITY;
        if (key + 1 > r0) s[nt * 4 + 1] = -INFINITY;
        if (key > r1) s[nt * 4 + 2] = -INFINITY;
        if (key + 1 > r1) s[nt * 4 + 3] = -INFINITY;
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < SN / 4; nt++) {
      mx0 = fmaxf(mx0, fmaxf(s[nt * 4], s[nt * 4 + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt * 4 + 2], s[nt * 4 + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float n0 = fmaxf(m0, mx0 * sl2), n1 = fmaxf(m1, mx1 * sl2);
    a0 = ex2(m0 - n0);
    a1 = ex2(m1 - n1);
    m0 = n0;
    m1 = n1;
    float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < SN / 4; nt++) {
      s[nt * 4 + 0] = ex2(fmaf(s[nt * 4 + 0], sl2, -n0));
      s[nt * 4 + 1] = ex2(fmaf(s[nt * 4 + 1], sl2, -n0));
      s[nt * 4 + 2] = ex2(fmaf(s[nt * 4 + 2], sl2, -n1));
      s[nt * 4 + 3] = ex2(fmaf(s[nt * 4 + 3], sl2, -n1));
      ls0 += s[nt * 4 + 0] + s[nt * 4 + 1];
      ls1 += s[nt * 4 + 2] + s[nt * 4 + 3];
    }
    l0 = l0 * a0 + ls0;
    l1 = l1 * a1 + ls1;
  };
  // P_t's A fragments: k-step kc from n-blocks 2kc and 2kc+1 (16-bit pairs)
  auto pack = [&]() {
#pragma unroll
    for (int kc = 0; kc < F2N / 16; kc++) {
      const float *c0 = s + 8 * kc, *c1 = s + 8 * kc + 4;
      p[kc][0] = mma<E>::pack(c0[0], c0[1]);
      p[kc][1] = mma<E>::pack(c0[2], c0[3]);
      p[kc][2] = mma<E>::pack(c1[0], c1[1]);
      p[kc][3] = mma<E>::pack(c1[2], c1[3]);
    }
  };
  // O (after the last PV) in the units of the max before softmax(t), to those of softmax(t)'s
  auto rescale = [&]() {
#pragma unroll
    for (int i = 0; i < OD / 4; i++) {
      o[i * 4 + 0] *= a0;
      o[i * 4 + 1] *= a0;
      o[i * 4 + 2] *= a1;
      o[i * 4 + 3] *= a1;
    }
  };
  // Tile 0 alone: nothing to overlap yet (O is zero; softmax(0)'s factors are 0).
  mbar_wait(qbar, 0);
  mbar_wait(&fullk[0], 0);
  fence_regs(s);
  wg_fence();
  qk(0);
  wg_wait0();
  fence_regs(s);
  mbar_arrive(&emptyk[0]); // this thread's reads of K_0 are done
  softmax(0);
  // Iteration j: O += P_{j-2} V_{j-2} has been running since iteration j - 1; wait for it at the
  // top of the iteration (after the mbarrier waits: ptxas keeps the wgmma wait inside its basic
  // block but hoists it within one, so a wait written after the softmax would land before the
  // exponentials), then S_j and P_{j-1} V_{j-1} go to the tensor cores while softmax(j) runs.
  for (int j = 1; j < nkv; j++) {
    const int st = j & 1, sp = st ^ 1;
    mbar_wait(&fullk[st], (j >> 1) & 1);
    mbar_wait(&fullv[sp], ((j - 1) >> 1) & 1);
    wg_wait0(); // P_{j-2} V_{j-2} (nothing pending at j = 1)
    fence_regs(o);
    keep_regs(p); // that PV read them until the wait above
    if (j > 1) mbar_arrive(&emptyv[st]); // this thread's reads of V_{j-2} (stage j % 2) are done
    rescale();
    pack(); // P_{j-1}
    fence_regs(o);
    wg_fence(); // orders the register writes above (O's rescale, P's packing) before the wgmmas
    qk(j);
    pv(j - 1);
    wg_wait1(); // S_j done; P_{j-1} V_{j-1} may still run
    fence_regs(s);
    mbar_arrive(&emptyk[st]); // this thread's reads of K_j are done
    softmax(j);
  }
  wg_wait0(); // P_{nkv-2} V_{nkv-2}
  fence_regs(o);
  keep_regs(p);
  rescale();
  pack(); // P_{nkv-1}
  mbar_wait(&fullv[(nkv - 1) & 1], ((nkv - 1) >> 1) & 1);
  fence_regs(o);
  wg_fence();
  pv(nkv - 1);
  wg_wait0();
  fence_regs(o);
  keep_regs(p);
  fwd_store<HD, E>(o, m0, m1, l0, l1, out, lse, ocopy, b, h, H, T, r0, r1, tg);
}

template <int HD, typename E>
int launch_fwd2(E *out, float *lse, E *ocopy, const E *qkv, int B, int T, int H, int KV,
                cudaStream_t st) {
  const encode_tiled_fn fn = encode_tiled();
  if (!fn) return -1;
  CUtensorMap tm; // Q, K and V alike: boxes of 64 columns x 128 rows (BM = F2N)
  if (!tmap_rows(&tm, fn, std::is_same<E, f16>::value, qkv, (long)(H + 2 * KV) * HD, T, B, BM))
    return -1;
  constexpr size_t smem = f2_smem_bytes<HD>();
  static int attr;
  if (!smem_once(fl3_fwd2_kernel<HD, E>, smem, &attr)) return -2;
  const float sl2 = 1.4426950408889634f / sqrtf((float)HD);
  const dim3 grid = tile_grid((T + BM - 1) / BM, B * H);
  fl3_fwd2_kernel<HD, E><<<grid, F2T, smem, st>>>(tm, out, lse, ocopy, T, H, KV, sl2,
                                                   fwd_group(2, HD, T, B * H));
  return cudaGetLastError() == cudaSuccess ? 0 : -2;
}

template <typename E>
int fwd2(void *out, float *lse, void *ocopy, const void *qkv, int B, int T, int H, int KV, int hd,
         void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return by_hd(hd, [&](auto h) {
    return launch_fwd2<h(), E>((E *)out, lse, (E *)ocopy, (const E *)qkv, B, T, H, KV, st);
  });
}

} // namespace

extern "C" int ct_fl3_fwd2(int fp16, void *out, float *lse, void *ocopy, const void *qkv, int B,
                           int T, int H, int KV, int hd, void *stream) {
  return fp16 ? fwd2<f16>(out, lse, ocopy, qkv, B, T, H, KV, hd, stream)
              : fwd2<bf16>(out, lse, ocopy, qkv, B, T, H, KV, hd, stream);
}
