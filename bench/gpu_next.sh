#!/usr/bin/env bash
# What the next GPU session should run first, in priority order (each PART well under the
# 10-minute call limit; CUDA build in build-gpu with cuDNN attention; pass COMMIT). Session 12
# learned: #6 — the GPUs train at their 700 W power limit (686-688 W, SM 1710-1740 MHz alone);
# overlapped all-reduces cost GPU 0 1.3-3% of its clock at the same power, which is the 2-GPU
# step's loss (bench/results/ddp_power_2026-11-30_2xH200_dd51b6f.txt); NCCL buffer registration
# does not help (NCCL declines cudaMalloc memory; ncclMemAlloc memory all-reduces no faster).
# #8 — the decode timeline (now a ring: until call 46 a full buffer left its kernel names
# rotated, so readings before it named the wrong kernels) shows ~22 us a layer against 7.6 us
# of weight DRAM time. Decoding ahead removed ~10 us a token of the gap between graph replays
# (~20 us left: argmax + graph boundary; two steps a graph would halve it); gate/up with one
# pair a task +1%.
# With the aligned timeline (call46_72ab9c2.txt) a layer is qkv 4.4, attention 7.2-8.7, o_proj
# 2.5-3.3, gate/up 3.1-3.2, down 4.0-4.6 us from release to release; attention's phases
# (call48_f7961d4.txt, 384 keys): q/k load + norm + rope 1.8 us, split math 1.8, first cluster
# barrier 0.7, block 0's DSMEM merge of 24 splits 1.9, to o_proj's release 1.1.
# Next for #8: the attention kernel (28 x 7.4 us of ~680 a token): each block merging its own
# splits before block 0 merges the blocks (6 partials instead of 24 over DSMEM; two warps a head
# in block 0's merge gave +0.6%, call49_9c15eaa.txt), q/k/v loads
# earlier (the qkv GEMV writing the rope'd q/k itself), attention blocks sized by the cache
# length (12 warps were 4% faster at 1,256 keys, call47_72ab9c2.txt: clusters stay <= 8);
# a per-block timeline (a global block counter gives every block its kernel) to see when a
# kernel's last block starts and ends.
# Session 13 rebuilt the persistent decode kernel (CT_DECODE_PERSIST=1: a shared-memory weight
# ring fed by the bulk copy engine, a one-atomic grid barrier, a merge phase) and timed it per
# phase (-DCT_DL_TIMES): bit-identical, 1,019 against 1,484 tokens/s (call59_persist8.txt). Its
# weights arrive in time; barriers (1-2 us each, six a layer) and the L2 round trips of each
# phase (x, the norm weight, attention's splits and merge) make ~32 us a layer (~25 without any
# weight copies). A faster persistent step needs fewer phases a layer, not faster weight
# streaming: e.g. the qkv GEMV computed by the attention blocks themselves (each kv head's 512
# rows), the norm weights in the ring, and a merge inside a cluster as the per-layer kernel does.
# Session 15 (no device time) changed the CPU backend's decode: its products now go through
# matmul_rows_fwd (a row GEMV) instead of sgemm, so the first GPU call should run `checks`
# (generate_gpu.sh compares greedy GPU fp32 text with the CPU backend's, test_decode_cuda the
# fused GEMVs with the CPU's) before anything is timed.
# Session 16 (call 78, a1d0bd5): GPT-2-style decode now runs through the decode GEMV (2,475 against
# 1,196 tokens/s at batch 1 with CT_DECODE_GEMV=0); its first prefill of a new shape costs 69-113 ms
# at batch 8 / 64 (the same shape again: ~1 ms): find out why first (CT_CUDA_PROFILE=1, suspect the
# cuBLASLt bias / GELU epilogues' first use at a shape) before timing anything else.
# Session 17 (calls 79-84): it was cuBLASLt timing 8 candidates per new product shape (lt_exec);
# generate now takes the heuristic's first (lt-first): 125 -> 11.6 ms at batch 8, the repeated
# shape 1.4 ms both ways. ~10-15 ms remain on a new shape's first prefill (GPT-2 and Qwen3 alike;
# CUDA_MODULE_LOADING=EAGER does not remove it): cuBLAS's own first use of a shape is the suspect.
# #8: a key-a-lane attention split (1,471 vs 1,490), attention partials merged by the o_proj GEMV
# (1,372 vs 1,481) and the persistent kernel with five phases (1,212 vs 1,481) all lost to the
# per-layer kernels (bench/results/call79_*, call80_*): with weights streaming, each L2 round trip
# and grid barrier costs ~2x its idle latency. Untried: two decode steps a CUDA graph (the ~20 us
# gap between replays), and the head GEMV (70 us, at the bandwidth) overlapping the last layers.
# Session 18 (calls 85-89): the decode MLP as one kernel (split-K down projection summed by int64
# fixed-point atomics, finished by the next op: 1,312 against 1,483 tokens/s; the cluster barrier
# costs more than the boundary it removes and every next-layer block reads 4x the bytes from the
# same L2 lines) and several decode steps a CUDA graph (K = 2 / 4 / 8: no faster) were correct
# and slower, taken out (bench/results/call85-86_*, call87-88_*, patches as text). The argmax's
# last-block merge with all loads in flight landed (+0.5%). The ~20 us from the argmax's release
# to the next step's first kernel is neither the graph boundary nor the ids' copy; after a50641f it
# is 16.9 us (call 90's timeline), and not the argmax's or the embedding's own work either
# (CT_DECODE_NULL of each: no faster). Next: what the embedding kernel's start waits for.
# Session 19 (calls 92-98): a software hand-off between the one-row GEMVs (outputs as tagged LL
# lines, the next GEMV polling and multiplying its input chunks as they arrive, no wait at its
# start) was correct; one boundary streamed was at best even, all three 26% slower
# (bench/results/call92-98_*): polls of the same L2 lines by every consumer block contend with
# the weight streams, and seeing a line costs a loaded L2 round trip, about what a PDL wait's
# release costs. The kernel boundary is not beatable that way.
# Sessions 20-21 (calls 103-115): the tensor-core GEMV (mma.sync) for 2-16 rows (17-64 opt-in via
# CT_DECODE_MMA_MAXN: its 2- and 4-tile blocks lose to cuBLAS by 40% at 64 rows even with the blocks
# capped at what fits at once); inference norms with a row in a warp's registers (GPT-2 124M +43% at
# batch 1, the Qwen3 shape +24% at 64). Left at batch 64 (call 113/114 profiles, graphs off): the
# cuBLAS down projection 64x3072x1024 ~25 us (0.25 TB/s; split-K partials help only at 64 rows,
# CT_DECODE_SPLITK), attention_decode_vec ~24 us a layer (~47% of the KV bandwidth), add_fwd and
# swiglu_fwd as kernels of their own past 16 rows.
# Session 22 (calls 117-118): split-K partials the default for 64-128 rows once the engine runs its
# residual products at setup (+5.4% at batch 64 on the Qwen3 shape, +4.2% on GPT-2); the Llama-3.2-1B
# shape (configs/llama3.2-1b.toml) decodes at 68% of the bandwidth bound at batch 1 with the same
# kernels, 3.40x Transformers compiled: the Qwen3-0.6B shape's 43% is its 28 thin layers (7.6 us of
# weight bytes against ~14 us of dependent-stage latency each), not a kernel that misses its bytes.
# Attention's cluster merge spread over every block of the cluster (one DSMEM round trip, a thread
# an output): the same bits, 3.6% slower at batch 1, 5% at 8 (call 118; patch in the results).
# Session 23 (calls 119-123): gemm_rows_kernel, the 9-64 row products with the weights as the mma A
# operand and k slices summed over a cluster (opt-in CT_DECODE_GR=1): correct (same bits in any
# batch of 9-64), slower than cuBLAS + split-K (batch 64 25,753 against 31,324 tokens/s on the Qwen3
# shape); its phases (CT_DECODE_GR_STOP, timed by test_decode_cuda CT_TEST_PERF=only) put 2-6 us
# in the cluster sum. Next for batch 64: that sum (residual loads before the barrier, partials
# through L2), more blocks a multiprocessor, or wgmma from shared memory; then attention_decode_vec.
# Session 25 (calls 131-132, 2026-12-05): CT_CUDA_VIRTUAL_DEVICES ran on an H200 for the first time
# (decode_cuda_2dev 7,441 checks, generate_gpu.sh 69, none failed). The GEMVs' bias / residual loaded
# before the reductions: same ids, 1.5-2.7% slower, taken back. main: 1,477 tokens/s at batch 1 =
# 5.53x Transformers compiled, 43% of the bound. Register arithmetic (decode.cu header): 3 gate/up
# blocks + 1 down block exceed a multiprocessor's registers, which delays down's blocks and the qkv
# launch behind them; call 69's timeline with down at 64 registers shows that removing the delay
# moves down's weight loads into gate/up's window, which is already at the copy bandwidth (4% slower
# overall), so that is not the way either: the bytes that could move are those of the windows where
# DRAM idles (attention, the boundaries). Untried idea for that: gate/up's 12.6 MB loading during
# attention rather than during o_proj. Its block 0 starts only ~2.3 us into attention's ~7 us
# (call 90: gate/up "start -5.28" before o_proj's release), and its 384 blocks of 16,384 registers
# fit 3 a multiprocessor at most. A gate/up grid of one block a multiprocessor whose warps hold
# all their 3 tasks' weights in registers (~130 registers a thread, ~33K a block: a TK template
# parameter of gemv_kernel, the same arithmetic and bits) would sit beside o_proj (14,336) during
# attention on the ~108 multiprocessors without an attention block. Check with ptxas -v first
# (no device time), then the timeline build: gate/up's release-to-release should fall from ~3.2 us
# towards ~1.5. The risk, measured in call 66-74's notes (decode.cu header): weight loads in flight
# beside attention lengthen its phases (rope 0.95 -> 1.55 us, split math 0.95 -> 2.15), so what
# gate/up gains attention may lose.
# Session 26 (calls 133-134, 2026-12-05, an H100: no H200 started): that idea, gemv_kernel with 2-4
# tasks a warp (all weights loaded before the wait; gate/up at 3 or 4 tasks one block a
# multiprocessor, all of them resident beside attention at 4), ran 0.6 / 13.5 / 15.5% slower at
# 2 / 3 / 4 (qkv at 2: 4.8%): each task a warp does in sequence after the release costs ~1.6 us.
# An L2 persisting window over the head's first 32 MB: 2-5% slower on every model (the layers lose
# the L2). Both taken out (bench/results/call133-134_*). Call 135 tried the other direction, a task's
# k range over 2 or 4 warps: gate/up -11.5%, qkv -5.1%, the output / down projections even
# (bench/results/call135_*). The batch-1 grids of gate/up and qkv are at a local optimum both ways.
# SASS without a GPU: pip download nvidia-cuda-cuobjdump (13.5.37 reads these sm_90 objects), unzip,
# cuobjdump -sass build-gpu/libctrain_core.a.p/kernels_cuda_decode.cu.o (ACQBULK is the PDL wait).
# For scale: the fastest public batch-1 Qwen3-0.6B decoder found (a persistent megakernel on an RTX
# 5090, blog.alpindale.net/posts/5090_decode_optimization: ~0.97 ms a token against its 712 us
# bound) spends ~260 us a token beyond streaming the weights, ~9 us a layer; that overhead over the
# H200's 293 us bound would be ~53%. ctrain spends ~384 us (~13.7 us a layer); 60% allows 195 us.
# Session 27 (calls 136-140, 2026-12-05, H100s again): the co-residency cost above, taken the other
# way: attention's blocks alone on their multiprocessors (unused shared memory asked for, so the
# early GEMV blocks sit elsewhere) is +5.2% at batch 1 (Qwen3-0.6B shape) and +3.3% (Llama-1B), but
# -2 to -4% on Llama-1B at batch 2-4 where attention takes 73% of the multiprocessors: the default
# now where its grid is at most half of them (att_alone_pad; bench/results/call136-140_*). Next along
# this line: the timeline with it on (call 141, summary.txt there) shows attention's block 0 ~0.9
# us faster but the kernel no shorter (its blocks wait for empty multiprocessors, so they start
# later); the gain is qkv (-0.93 us a layer) and o_proj (-1.09) with no attention block beside
# them, less gate/up (+0.40) and down (+0.85). Try: attention's blocks started no later than before
# (fewer of them, or room kept for them while qkv runs), and whether other latency-bound kernels with early-launched neighbours (the argmax after the head; the output
# projection beside gate/up's preloads) gain from the same, traded against the room the early
# blocks lose (8-warp attention blocks, fewer multiprocessors taken: -4.3%, call 140). On the H100
# the batch-1 Qwen3 step is then at 58% of that card's bound (bench/gpu_decode.sh, call 139: 2,997
# GB/s copy bandwidth: 407.6 us); the issue's H200 has ~39% more bandwidth and needs ~2,050 tokens/s.
# Session 28 (calls 143-147, 2026-12-05; 145-146 on an H200): the start-no-later idea above done by
# padding both sides: attention's blocks ask for just over three quarters of a multiprocessor's
# shared memory and the output projection's and gate/up's blocks for a quarter each, so those
# cannot sit beside attention while the qkv GEMV's small blocks still can; attention triggers its
# dependents after its wait. Default (att_pad, CT_DECODE_ATT_APART=50): on the H200 1,594 tokens/s
# at batch 1 = 47% of the bound (gpu_decode.sh, call 145), +4.5% on alone, +8% on no pad; Llama-1B
# +2.2% on alone; padding the output projection alone is no better than no pad; the early trigger
# -1.5%; 8-warp attention blocks -5.2%; at batch 2 (APART=80) Qwen3 +7% but Llama-1B -1.5%
# (bench/results/call143_2026-12-05_apart/summary.txt). 60% on the H200 needs ~2,030 tokens/s
# (492 us a token; now 628). Next: (1) run `timeline` on the default (call 147's build noted no
# start for the late-triggering attention; tl_start fixes it) to see what each kernel's share is
# now; (2) the same two-sided pad for other neighbours whose early blocks preload beside a
# latency-bound kernel (the qkv GEMV's blocks beside down's tail, the head beside the last down);
# (3) a batch-2 rule that gains on both shapes (room the early GEMV blocks keep, not a fixed 50%);
# (4) the ~12 us from the argmax's stored id to the next step's first kernel (2% of the step).
# Session 29 (2026-12-05): no device was lent (the first call was refused). Prepared instead, for
# the first call of the next session (part `s29`, ~5 min): call 147's timeline (H100, alone)
# puts a layer at qkv 3.2, attention 8.0, o_proj 2.2, gate/up 3.6, down 4.6 us from release to
# release. o_proj's and gate/up's weights are in registers before their release (their blocks
# start beside attention), but down's blocks cannot sit beside three gate/up blocks (registers),
# so they start and load late, and the qkv GEMV launches behind them (its block 0 starts 4 us
# after down's release, 0.6 us before its own): those two GEMVs' ~4.5 MB-a-layer of weights
# (H200: ~3.5 us) come from DRAM after their release, while DRAM idles during attention. So:
# attention's L2 hint naming the down projection's weights (CT_DECODE_PREFETCH=down) or those and
# the next layer's qkv weights (=downqkv; the att mode named o_proj and gate/up, which now preload
# anyway), issued at attention's start or after its wait (CT_DECODE_PF_AFTER=1), alone and with
# the down GEMV capped at 64 registers (ctrain-v4, bench/gpu_variant.sh v4 -DCT_GV_DOWN_MINB=4:
# call 69 lost 4% with it because down's preloads then competed with gate/up's for DRAM; from
# L2 they would not). And the default's timeline (ctrain-tl), which call 148 could not run.
# Also prepared: attention's split rows pushed into block 0 by st.async (CT_DECODE_ATT_PUSH=1|2).
# The SASS of the cluster variant shows why its merge may cost more than it should: cl.sync()'s
# release is MEMBAR.ALL.GPU (it waits for every outstanding global store, the newest key's cache
# append included) + CCTL.IVALL, twice a launch, and block 0 then loads 24 splits' rows over
# distributed shared memory (call 147: barrier 0.61 us, merge 1.70, to o_proj's release 2.28).
# With the push there is no barrier between the split math and the merge (block 0 waits on its
# mbarrier's byte count), the merge reads its own shared memory and the other blocks leave as
# soon as block 0 has their rows. test_decode_cuda's test_attention_push checks the bits first.
# A smaller step on the default pull merge: CT_DECODE_ATT_RELAX=1 relaxes only its second barrier
# (lifetime only: no release, so no MEMBAR.ALL.GPU waiting for block 0's output stores).
# Here: ninja -C build-gpu; bench/gpu_variant.sh tl -DCT_DECODE_TIMELINE & bench/gpu_variant.sh v4
# -DCT_GV_DOWN_MINB=4; EXTRA="build-gpu/ctrain-tl=build-gpu/ctrain-tl build-gpu/ctrain-v4=build-gpu/ctrain-v4"
# bench/gpu_pack.sh ctrain tests/test_decode_cuda; the call: carry [".carry"], command
# "tar -xJf .carry/pack.tar.xz && bash bench/gpu_next.sh s29" (its output under $OUT comes back).
# Session 30 (2026-12-05 23:22 to 12-06 01:30 UTC): again no device started (15 calls from 23:27 to
# 01:12, both one-GPU kinds; each failed start cost ~90 s, a call inside a retry wait 15 s, until
# the 30 minutes were spent), so s29 is still unrun. Part s30 below is s29 cut to what fits
# a call of ~6 minutes when little device time is left (tests, ids, two A/B rounds of the main
# variants, Llama-1B once, the default's timeline); ROUNDS=3 for a third round.
# Session 31 (2026-12-06): ten failed starts from 01:57, then call 149 at 03:35 got an H100
# and ran s30 (bench/results/call149-151_2026-12-06_H100_push): test_decode_cuda 8182 checks, 0
# failed, the same greedy ids everywhere; the push +5% at batch 1 (Qwen3 shape), +2% on Llama-1B;
# relax +1% at batch 1 and 8; every L2 prefetch mode and the 64-register down GEMV slower (-2.7 to
# -9.5%). Push and relax are the defaults now. Call 151: gpu_decode.sh with the push, 1,530
# tokens/s at batch 1 = 5.52x Transformers compiled, 62% of the H100's bound; the H200's is still
# to measure: part s31 (carry [".carry"], "tar -xJf .carry/pack.tar.xz && bash bench/gpu_next.sh
# s31"; the pack holds ctrain, test_decode_cuda and ctrain-tl), which also takes the timeline.
# Session 32 (2026-12-06, H100s only; bench/results/call152_* and call153-158_*): the s31 default
# (push + relax) ran for the first time (8182 checks, 0 failed; +5.5% at batch 1, 61% of the H100's
# bound). bench/graph_gap.cu found the ~12 us from the argmax's id to the next step's first block:
# the 4-byte copy of the ids queued between two graphs (11.8-12.3 us of idle GPU against 2.1 for
# replays alone). The argmax now writes the ids into mapped host memory (CT_DECODE_ZEROCOPY=0:
# the copy): +1.6-1.9% at batch 1, 63% of the H100's bound (gpu_decode.sh, call 157). Still not
# run on an H200: part s32 (or s31's gpu_decode.sh step) on the next H200 gives the issue's number.
# A lead for attention (6.85 us of a ~20.3 us layer on the H100): with the push, block 0's merge
# of 24 split rows already in its own shared memory still takes 1.52 us (phases 4.17 -> 5.69,
# call 152), about what the pull merge over distributed shared memory took (1.70, call 147),
# although the code is ~100 dependent instructions and ptxas reports no spills (128 registers).
# So its time is not the loads: time the merge's steps (max, the loads, the FMAs, the output
# stores: stores queued behind the other SMs' weight streams are one suspect) with more
# TL_PHASE marks in a timeline build before changing it.
# Session 33 (2026-12-06, H100s again; bench/results/call159_* to call163-164_*): done. Not cold
# instruction fetch (the split math and merge run twice take as long the second time, call 160);
# the SM ran at 1.97 GHz (clock64 against %globaltimer, call 161), and the merge's 32-way unrolled
# round of 24 splits took ~2,400 of its ~3,700 cycles: one warp a scheduler, so each of ~460
# dependent instructions pays its full latency. Every phase of attention is that: instruction
# latency on four warps, not memory. Two changes with the same bits: the push merge by every
# thread (factors once a split, a short loop a thread an output pair: +0.8% at batch 1) and the
# split's scores summed by a reduce-scatter (V - 1 shuffles, one exp a lane: +0.8 to +1.9% at
# batch 1, +1.1 to +1.6% at 8). gpu_decode.sh (call 164): 1,594 tokens/s at batch 1 = 4.92x
# Transformers compiled, 64% of the H100's bound. Also tried: the weights' loads marked L2
# evict_first (ctrain-ef: -0.3 to -0.6%) and the old merge rolled in rounds of 8 (+0.3%, noise).
# Timeline notes: a %globaltimer read moves the later phase notes ~0.1 us each, so since s37 they
# are clock64 only (printed at the card's clock). The merge's loop on output pairs (8-byte row
# loads, 16-byte factor loads) was 1.2-2.5% slower (call 165), taken back. Next along this line: fewer dependent instructions on the
# four warps of every phase (rope's norms and table, the split's q.k products and V sums: e.g.
# two warps a split, one a head, where G >= 2), and the same count for the GEMVs' post-wait tails.
# Session 34 (2026-12-06, H100s again, calls 169-170, bench/results/call169-170_*): instruction fetch.
# CT_DECODE_TL_TWICE now runs attention's phases twice from one copy of their code (call 160's build
# had two inlined copies, both cold): the split math 1.77 us the first time, 0.69 the second. Warming
# the code by a dry run before each kernel's wait (CT_DECODE_WARM, s39) was slower for every kernel
# (-1 to -8% each, -16% all): taken out, the patch in the results. Part s39 needs that patch.
# Then two changes with the same bits (calls 171-173, bench/results/call171_*, call172_*, call173_*):
# the push merge by every warp, each finding its head's factors itself (no shared-memory factors, no
# block barrier; the merge 0.86 us against 1.5, +1.0 to +1.7% at batch 1), and the heads split (two
# warps a split, each with half the query heads, capped at 128 registers: +1.5 to +1.8% at batch 1
# on the Qwen3 shape; default at one row where G = 2, since Llama-1B's G = 4 lost 1%). With the
# merge faster the output projection's weights, loaded while attention runs, arrive later on the
# H100 (o_proj 2.6 us release to release against 2.0): the layer now waits on DRAM there, which an
# H200 has ~39% more of. Still not run on an H200: part h200. gpu_decode.sh (call 174, H100): 1,635
# tokens/s at batch 1 = 5.38x Transformers compiled, 67% of the H100's bound. Next along this line:
# the heads split lost on Llama-1B (G = 4, head dim 64) where each split's keys load twice; two
# warps a split each taking half its keys (8 a warp) would not duplicate loads but needs the push
# merge for more than 32 splits; the rope's and split math's code is ~18 KB fetched each launch.
# Session 35 (2026-12-06; two H100 calls, 178-179, in ~25 tries; bench/results/call178_2026-12-06_H100_xr):
# the one-row rms-normed GEMVs (qkv, gate/up) norming their input in each lane's registers (xr:
# each lane loads the chunks it multiplies and norms them in gv_x_rows' order, no block barrier,
# no warp 0 norming for eight; the same bits) ran 1.5-3% slower than their shared-memory path at
# batch 1 and CT_DECODE_PREFETCH=gudown (gate/up asking down's weights into L2 after its wait) 1%
# slower still; both taken back (the patch is in the results). What the timeline showed is the
# lead: with xr attention's own phases were ~1.1 us shorter (next kernel released 4.06 us after
# its release against 5.14), but the output projection's blocks, which attention launches only
# after its wait (att_pad's late trigger), start ~2.5 us after attention's release either way, so
# they had ~1.5 us instead of ~2.6 to load their weights, and o_proj and gate/up took the time
# back (+1.1 and +0.9 us). A faster attention pays only if o_proj's blocks start earlier. Call
# 179 (s45, bench/results/call179_2026-12-06_H100_late0): attention's early trigger
# (CT_DECODE_ATT_LATE=0) on the current code +0.2 to +1.3% at batch 1 (six pairs of six), batch 8
# and Llama-1B even; with xr +2-3% but still 3-4% below the current code. Session 28 had measured
# the early trigger 1.5% slower on older code, so the default stays late until an H200 decides:
# run s45 there (it times the issue's benchmark on ctrain-base first; pack the current ctrain
# as both ctrain and ctrain-base, EXTRA="build-gpu/ctrain=build-gpu/ctrain-base"; its xr rows
# then time the same code).
# Session 36 (2026-12-06): 17 requests for an H200, two H100s started (probes only), the rest
# refused; nothing measured. Part s46 replaces s45 for the next H200: the issue's benchmark first,
# then the tests, the ids and two A/B rounds (CT_DECODE_ATT_LATE=0, CT_DECODE_PREFETCH=down), all
# on the current code (pack: EXTRA="build-gpu/ctrain-tl=build-gpu/ctrain-tl" bench/gpu_pack.sh
# ctrain tests/test_decode_cuda); on an H100 it runs only tests/gpu/generate_gpu.sh.
# Session 37 (2026-12-06): 12 requests for an H200, three H100s started, no H200; on 3077b59 the
# generate suite (69/0), test_decode_cuda (8398/0) and the batch-1 benchmark (1,623.6 tok/s, 66% of
# the H100's bound; bench/results/call_s37_*). s46 now prints only the card on anything but an
# H200 (GEN=1 adds the generate suite, ANY_CARD=1 the batch-1 benchmark and the decode tests),
# and starts an A/B round only before 330 s (S46_ROUNDS_BEFORE). Pack as session 36 did.
# Session 38 (2026-12-06): ~10 requests, one H100 (held for three calls), no H200. s47 on f26618f
# (bench/results/call_s38_*): test_decode_cuda 8568/0, generate suite 69/0, the one-kernel head +
# argmax even with graphs and 20-33% faster without, the old fusions and new L2 hints slower.
# Its plan for the next H200 (s46, then s47) ran in session 39.
# Session 39 (2026-12-06): an H200 at the first request (held for two calls), then only failed
# starts. s46 + s47 on a7ba6d9 (bench/results/call_s39_*): 1,821-1,829 tokens/s at batch 1, 52-53% of
# the bound, test_decode_cuda 8568/0, generate suite 69/0. On the next card: s48 (~5 min; any card).
# Session 40 (2026-12-07): 18 requests, every one a failed start or a back-off refusal, until too
# little device time was left to start one; nothing ran. Next: s49 (it carries s48's questions
# too) with the patch it names.
# Session 41 (2026-12-07): s49 ran on an H100 (bench/results/s41_2026-12-07_H100_*); the ogud
# default lost 3% at batch 16, so it stays opt-in. Then 17 requests for s50, every one a failed
# start or a back-off refusal until the device time ran out, so s50's change is kept as a patch:
# bench/results/s41_patches/s50_hs_push_eager_head.patch.txt. Build the tree, cp build-gpu/ctrain
# /tmp/base/ctrain, git apply the patch, EXTRA="/tmp/base/ctrain=build-gpu/ctrain-base"
# bench/gpu_pack.sh ctrain tests/test_decode_cuda, run s50; land the patch if its tests pass and
# it is not slower (its eager half on the rounds' data, the other on the rounds at batch 1).
# Session 42 measured that patch in s51 (beside the GEMVs' norm paths out of line) and landed
# both, so part s50, which never ran, is gone.
#   s64      session 47, after s63 (`s63 s64`): block 0's merge by 4 or 2 of its warps against all 8
#            (ran on an H100: -0.2 / -0.6%; the define's patch is in that call's results)
#   s63      the next session's first call: the landed tree's decode tests and ids, the issue's
#            benchmark (on an H200 at 1, 8 and 64, S63_BATCHES to change; elsewhere at 1), then
#            the timeline with attention's block 0 by warp (ctrain-tl). It replaces session 45's
#            s62 (the same work, the timeline first), which never ran: session 46's device time
#            went on failed starts
#   s61      session 45: attention's block 0 leaving without the cluster barrier's last wait
#            (ctrain-nw, -DCT_ATT_B0_NOWAIT, which needs the patch in
#            bench/results/s45_2026-12-07_H100_9b78991+s61: the code was taken out) against the
#            default: ids, both timelines (ctrain-tl, ctrain-tlnw), two A/B rounds; on an H200
#            the issue's benchmark
#   s60      session 45 (in place of session 44's s59, which never ran and is gone):
#            attention's batch-1 form at 96 registers (ctrain-hs96) and the down
#            projection at 80 (ctrain-d3) against the default; timelines of the default and of
#            every attention form at 96 (ctrain-tl, ctrain-tl96); on an H200 the issue's benchmark
#   s58      session 44: the instruction-cache probe (bench/icache), tests, ids, the issue's
#            benchmark at batch 1 (1, 8, 64 on an H200) against Transformers
#   s55      session 42's last call: the landed tree's tests and ids, batch 1 against Transformers on
#            an H200 (else two batch-1 runs)
#   s54      session 42: s53 with the L2 hints out of line again, two rounds of both shapes (~2 min)
#   s53      session 42: s52 with the one-task form only where two blocks fit a multiprocessor and
#            the L2 hints inline; Qwen3-0.6B and Llama-3.2-1B each round (~3 min)
#   s52      session 42: the one-row GEMVs' one-task form + the L2 hints out of line (ctrain) against
#            the landed s51 code (ctrain-base) and CT_DECODE_GV_ONE=0; on an H200 the benchmark
#   s51      session 42: s50 (ctrain-s50) and s50 + the GEMVs' unused norm paths out of line (ctrain)
#            against the tree (ctrain-base), three interleaved rounds; on an H200 then the issue's
#            benchmark (~4 min, ~9 with the benchmark)
#   s49      session 40: the whole-MLP L2 hint as the default from 8 rows against the tree without
#            it (ctrain-base), rounds at batches 1-64, then s48's eager and null-kernel steps (~6 min)
#   s48      the eager step with / without the one-kernel head (A/B, op profile, nsys), null-kernel
#            steps, the MLP L2 hints at batches 2-64
#   s29      test_decode_cuda (the push and hint tests first: a hang or a differing bit stops the
#            rest), then the timeline (default, push, downqkv) and the A/B above (needs
#            build-gpu/ctrain-tl and ctrain-v4 from bench/gpu_variant.sh)
#   s30      s29 in ~6 minutes (same builds); since f2aeb26 push and relax are the default, so
#            their lines in s29 / s30 measure the default against itself
#   s31      the new default (push + relax) on the next card, ~5 min: test_decode_cuda, the
#            default against both off (two rounds, batch 1 and 8), gpu_decode.sh at batch 1 and
#            8, the default's timeline (needs build-gpu/ctrain-tl: bench/gpu_variant.sh tl)
#   s32      the argmax's ids into mapped host memory (no copy between steps), ~4 min: the decode
#            tests, generate_gpu.sh on qwen3 + gpt2, ids, the default against CT_DECODE_ZEROCOPY=0
#            (two rounds, batch 1 and 8; Llama-1B once), gpu_decode.sh when the card is an H200
#   s33-s37  session 33's measurements (see each part's comment); s37 the merge's output pairs
#            against call 163's binary, gpu_decode.sh when the card is an H200
#   s47      session 38: the decode tests, ids and two A/B rounds of the head + argmax kernel, the
#            old fusions (QKV_ATT, OPROJ) and the L2 hints (att, gu, ogu, ogud); on an H200 the
#            issue's benchmark at 1, 8, 64 first (~7 min on an H100)
#   s44      session 35: the normed GEMVs' row in registers against CT_DECODE_XR=0 and ctrain-base
#            (needs the patch in bench/results/call178_*: xr was taken back)
#   s45      session 35: attention's early trigger (CT_DECODE_ATT_LATE=0) with and without xr
#   h200     the issue's benchmark (tests, ids, gpu_decode.sh at 1, 8, 64) only when the card is
#            an H200; otherwise it prints the card and stops
#   timeline the decode step's kernel timeline (a CT_DECODE_TIMELINE build; see the part), first
#   decode   PROF=decode on a few kernels, to see what the carveout changed
#   checks   golden + every CUDA op + the GPU smoke suite + the decode op tests + generation
#            (session 9's last commits changed flash3's tile_of after its checks) and backward
#            form 2's new bit 4 (flash3-bwd2o4 / -bwd2o6: hd 64's own-keys dQ, never run yet)
#   prof     PROF="bwd2_hd64 fwd2_hd64": flash3 at head dim 64, T 2048-4096, is 76-79% of PyTorch's
#            best (the target is 80%); hd 128's backward after the block-order fix: tensor pipe
#            43% against cuDNN's 59%, stalls on the wgmma waits and the bar.sync between the
#            consumer warpgroups. PROF=decode profiles a decode step (attention_decode_rope_kernel:
#            11 us a layer alone, 37% of its samples at the cluster barriers).
#   decode   bench/gpu_decode.sh on the default path (against Transformers), then the variants
#            (CT_DECODE_CLUSTER=0, CT_DECODE_FUSED_ATT=0, CT_DECODE_STAGE=1, CT_DECODE_PREFETCH=att)
#   null     what each decode kernel costs (CT_DECODE_NULL runs, see the results of cc0e9f0)
#   ddp      bench/ddp_probe.sh with parallel.ce_allreduce (the copy-engine all-reduce) on, and
#            the step marks of ce alone and with CT_CE_TAIL_NCCL=1 (session 9: the same 118.8 ms
#            step all three ways, bench/results/ddp_ce_tail_2026-11-30_2xH200_cc145e4.txt)
#   perf     bench/gpt2_124m.sh, bench/attention.sh with flash3's forms (flash3: both forms 1;
#            flash3-fwd2: forward form 2 + the default backward; flash3-bwd2o2: the default backward)
#   llama    bench/qwen3_0p6b.sh (use_kernels on/off and attention=flash3 vs torch.compile)
#   dist     bench/gpu_dist.sh equiv ckpt fault
# On a 4- or 8-GPU machine (nvidia-h200-x4 / -x8, issues #10 and #11): bench/gpu_scale.sh, one part per call.
# usage: bench/gpu_next.sh PART...     results under $OUT (default bench/results)
# (build and pack here first with bench/gpu_pack.sh BIN...: the device call sends at most 64 MiB,
# which build-gpu itself exceeds; unpack there with tar -xJf .carry/pack.tar.xz)
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
: "${OUT:=bench/results}"
export OUT
mkdir -p "$OUT"
CT=$PWD/build-gpu/ctrain
: "${COMMIT:=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
# the card's model in the name (H100 and H200 calls both happen): "NVIDIA H100 80GB HBM3" -> H100
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE '[A-Z][0-9]{2,3}[A-Za-z]*' | head -1)
tag=$(date +%F)_${ngpu}x${card:-GPU}_$COMMIT
# The s29 / s30 parts' steps: dec_tests runs test_decode_cuda (non-zero on a failed check or a
# hang); ab TAG BIN MODEL BATCHES [ENV...] prints a generate run's decode tokens/s; ids BIN [ENV...]
# the md5 of Qwen3-0.6B's greedy ids at batch 1 and 8; dec_tl NAME [ENV...] the timeline build's
# phases into $OUT/timeline_NAME.txt.
DG="generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
dec_tests() {
  export CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  local t=$SECONDS rc
  timeout 200 build-gpu/tests/test_decode_cuda > "$OUT/test_decode.txt" 2>&1
  rc=$?; echo "test_decode_cuda rc $rc ($((SECONDS - t)) s)"
  grep -E "pushed|relaxed|l2 hints|FAIL|differ" "$OUT/test_decode.txt" | head -30; tail -1 "$OUT/test_decode.txt"
  return $rc
}
ab() {
  local tag=$1 bin=$2 m=$3 b=$4; shift 4
  env X=1 "$@" timeout 60 build-gpu/$bin $DG --model configs/$m.toml --batch $b 2>"$OUT/ab.err" >/dev/null
  echo "$tag: $(grep '^stats' "$OUT/ab.err" | grep -oE "decode_tok_s=[0-9.]+" | tr '\n' ' ')"
  grep -iE "error|fail" "$OUT/ab.err" | head -3
}
# ab_rounds N "TAG BIN MODEL BATCHES [ENV...]" ...: N interleaved rounds of those ab runs, each
# TAG suffixed _ROUND (parts s51-s54)
ab_rounds() {
  local n=$1 r s a
  shift
  for r in $(seq "$n"); do
    for s in "$@"; do
      read -ra a <<< "$s"
      ab "${a[0]}_$r" "${a[@]:1}"
    done
  done
}
# The eager step (--cuda_graphs off) with the one-kernel head (base) and the two kernels (ham0,
# CT_DECODE_HEAD_ARGMAX=0): two interleaved rounds, both without early launches, then each under
# the op profile (events around every kernel; $OUT/prof_eager_*.txt). Parts s48 and s49.
eager_ab() {
  local r v e
  for r in 1 2; do
    DG="$DG --cuda_graphs off" ab eager_base_$r ctrain qwen3-0.6b 1,1
    DG="$DG --cuda_graphs off" ab eager_ham0_$r ctrain qwen3-0.6b 1,1 CT_DECODE_HEAD_ARGMAX=0
  done
  DG="$DG --cuda_graphs off" ab eager_base_pdl0 ctrain qwen3-0.6b 1,1 CT_CUDA_PDL=0
  DG="$DG --cuda_graphs off" ab eager_ham0_pdl0 ctrain qwen3-0.6b 1,1 CT_CUDA_PDL=0 CT_DECODE_HEAD_ARGMAX=0
  for v in base ham0; do
    e=X=1; [ $v = ham0 ] && e=CT_DECODE_HEAD_ARGMAX=0
    env $e CT_CUDA_PROFILE=1 timeout 60 build-gpu/ctrain $DG --cuda_graphs off \
      --model configs/qwen3-0.6b.toml --batch 1 > /dev/null 2> "$OUT/prof_eager_$v.txt"
    echo "-- op profile, eager, $v"; grep -vE "^(stats|info|ctrain|model)" "$OUT/prof_eager_$v.txt" | head -14
  done
}
ids() {
  local bin=$1; shift
  env X=1 "$@" timeout 60 build-gpu/$bin $DG --model configs/qwen3-0.6b.toml --batch 1,8 \
    --max_new_tokens 48 --print_ids 2>/dev/null | md5sum | cut -c1-12
}
dec_tl() {
  local f=$OUT/timeline_$1.txt; shift
  env X=1 "$@" timeout 60 build-gpu/${TLBIN:-ctrain-tl} $DG --model configs/qwen3-0.6b.toml --batch 1 2>&1 >/dev/null |
    grep -E "^stats|decode timeline|^  " > "$f"
  echo "-- timeline $*"; grep -oE "decode_tok_s=[0-9.]+" "$f"; sed -n '3,9p' "$f"; tail -4 "$f"
}
# bench/gpu_decode.sh when the card is the issue's H200: batches, Transformers' compile timeout,
# the whole run's timeout
decode_all() {
  CTRAIN=$CT BATCHES="$1" COMPILE_BATCHES=1 COMPILE_TIMEOUT=$2 timeout "$3" bash bench/gpu_decode.sh
}
decode_if_h200() {
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || return 0
  decode_all "$@"
}
# A timeline's (dec_tl TAG's) step, attention's phases, its blocks by cluster and block 0's warps
tl_lines() {
  grep -E "^stats|a step|attention_decode_rope_kernel phases|kv [0-9]+:|attention blocks|by warp" \
    "$OUT/timeline_$1.txt"
}
# The default (ctrain) against measurement builds TAG:BIN ... (parts s60, s61): the ids of each,
# the timelines TLS="TAG:TLBIN ..." with attention's per-cluster lines, ROUNDS (2) interleaved A/B
# rounds on the Qwen3-0.6B shape at batch 1, 1, 8, the Llama-3.2-1B shape once (LLAMA=0 skips
# it), and on an H200 the issue's benchmark at batch 1 (VS_BENCH=0 skips it)
vs_default() {
  local t0=$SECONDS v ids="base $(ids ctrain)" q=("base ctrain qwen3-0.6b 1,1,8")
  local l=("llama_base ctrain llama3.2-1b 1,1")
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
  for v in "$@"; do
    ids+=" ${v%%:*} $(ids "${v#*:}")"
    q+=("${v%%:*} ${v#*:} qwen3-0.6b 1,1,8")
    l+=("llama_${v%%:*} ${v#*:} llama3.2-1b 1,1")
  done
  echo "ids qwen3: $ids (0b1cea1e507a before)"
  for v in ${TLS:-}; do
    [ -x "build-gpu/${v#*:}" ] || continue
    TLBIN=${v#*:} dec_tl "${v%%:*}" X=1 > /dev/null
    echo "-- timeline ${v%%:*}"
    tl_lines "${v%%:*}"
    sed -n '/last block end/,/a step:/p' "$OUT/timeline_${v%%:*}.txt" | sed -n '2,7p'
  done
  ab_rounds "${ROUNDS:-2}" "${q[@]}"
  [ "${LLAMA:-1}" = 1 ] && ab_rounds 1 "${l[@]}"
  rm -f "$OUT/ab.err"
  [ "${VS_BENCH:-1}" = 1 ] && decode_if_h200 "1" 100 170
  echo "-- done ($((SECONDS - t0)) s)"
}
# CT_DECODE_ATT_HS=1 (the heads split) against the same binary without it and ctrain-base: the
# decode tests, the ids of all three, with HS_TL=1 both timelines, three interleaved rounds on the
# Qwen3 shape (batch 1, 1, 8) and the Llama-1B shape (batch 1, 1) each round (parts s41, s42)
hs_vs_off() {
  dec_tests || return 1
  echo "ids qwen3: new $(ids ctrain) hs $(ids ctrain CT_DECODE_ATT_HS=1) base $(ids ctrain-base) (0b1cea1e507a before)"
  if [ "${HS_TL:-0}" = 1 ]; then
    dec_tl hs0 X=1
    dec_tl hs1 CT_DECODE_ATT_HS=1
  fi
  for r in 1 2 3; do
    ab hs0_$r ctrain qwen3-0.6b 1,1,8
    ab hs1_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_HS=1
    ab base_$r ctrain-base qwen3-0.6b 1,1,8
    ab llama_hs0_$r ctrain llama3.2-1b 1,1
    ab llama_hs1_$r ctrain llama3.2-1b 1,1 CT_DECODE_ATT_HS=1
  done
}
# build-gpu/ctrain against build-gpu/ctrain-base (the binary before a change): the decode tests,
# the ids of both and of the pull merge, the timeline (ctrain-tl), three interleaved A/B rounds on
# the Qwen3 shape (batch 1, 1, 8) and the Llama-1B shape at batch 1 (after the rounds, or in each
# with LLAMA_EACH=1)
new_vs_base() {
  dec_tests || return 1
  echo "ids qwen3: new $(ids ctrain) pull $(ids ctrain CT_DECODE_ATT_PUSH=0) base $(ids ctrain-base) (0b1cea1e507a before)"
  dec_tl default X=1; tail -2 "$OUT/timeline_default.txt"
  for r in 1 2 3; do
    ab new_$r ctrain qwen3-0.6b 1,1,8
    ab base_$r ctrain-base qwen3-0.6b 1,1,8
    if [ "${LLAMA_EACH:-0}" = 1 ]; then
      ab new_llama_$r ctrain llama3.2-1b 1,1
      ab base_llama_$r ctrain-base llama3.2-1b 1,1
    fi
  done
  if [ "${LLAMA_EACH:-0}" != 1 ]; then
    ab new_llama ctrain llama3.2-1b 1,1
    ab base_llama ctrain-base llama3.2-1b 1,1
  fi
}
for part in "$@"; do
  echo "== $part"
  {
  echo "# bench/gpu_next.sh $part, $(date -u +%FT%TZ), commit $COMMIT, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $ngpu"
  case $part in
    prof)
      # --clock-control none: ncu would otherwise lock the clocks to base (METHOD.md: leave them).
      # Each report is printed three ways: the details page with every section body, the raw
      # metrics (stall reasons by name) and the SASS source page with each instruction's warp-stall
      # samples; all of it goes into one $OUT/ncu_prof_*.tar.xz (at most 8 files come back from
      # the lent machine). PROF names the profiles (default: flash3 and cuDNN at hd 64, flash3's hd 128
      # backward; decode, fwd1_hd64 and cudnn_hd128 on request).
      ncu=/usr/local/cuda/bin/ncu T=build-gpu/tests/test_ops_cuda P=$(mktemp -d)
      prof1() { # name, kernel regex, launch skip, count, command...
        local name=$1 k=$2 s=$3 c=$4; shift 4
        timeout 300 $ncu --clock-control none --set full --import-source no -k "regex:$k" -s "$s" -c "$c" \
          -f -o "$P/$name" "$@" > "$P/${name}_run.txt" 2>&1 || echo "$name: ncu rc $?"
        $ncu -i "$P/$name.ncu-rep" --page details --print-details all > "$P/${name}_details.txt" 2>&1
        $ncu -i "$P/$name.ncu-rep" --page raw --csv > "$P/${name}_raw.csv" 2>&1
        $ncu -i "$P/$name.ncu-rep" --page source --print-source sass --csv > "$P/${name}_sass.csv" 2>&1
        rm -f "$P/$name.ncu-rep"
        grep -E "^  [a-zA-Z_].*\(|    Duration|DRAM Throughput  |Compute \(SM\) Throughput|Pipe Tensor Cycles|L2 Hit Rate  " \
          "$P/${name}_details.txt" | head -40
      }
      att() { A=("$T" --perf --dtype bf16 --op attention --case "$1" --attn "$2"); }
      for n in ${PROF:-bwd2_hd64 cudnn_hd64 fwd2_hd64 bwd2_hd128}; do
        echo "-- $n"
        case $n in
          bwd2_hd128) att "bench B4 T4096 H16 KV8 hd128" flash3-bwd2; prof1 $n fl3_bwd2_kernel 0 1 "${A[@]}" ;;
          bwd2_hd64) att "bench B4 T4096 H16 KV16 hd64" flash3-bwd2; prof1 $n fl3_bwd2_kernel 0 1 "${A[@]}" ;;
          cudnn_hd64) att "bench B4 T4096 H16 KV16 hd64" cudnn; prof1 $n 'sdpa.*bprop|bprop.*sdpa' 0 1 "${A[@]}" ;;
          cudnn_hd128) att "bench B4 T4096 H16 KV8 hd128" cudnn; prof1 $n 'sdpa.*bprop|bprop.*sdpa' 0 1 "${A[@]}" ;;
          fwd2_hd64) att "bench B8 T2048 H16 KV16 hd64" flash3-fwd2; prof1 $n fl3_fwd2_kernel 0 1 "${A[@]}" ;;
          fwd1_hd64) att "bench B8 T2048 H16 KV16 hd64" flash3; prof1 $n fl3_fwd_kernel 0 1 "${A[@]}" ;;
          # one decode step's kernels at batch 1 (no graphs, so each launch is seen), after warm-up
          decode) prof1 $n . 3000 60 $CT generate --model configs/qwen3-0.6b.toml --prompt_ids 128 \
                    --max_new_tokens 64 --ignore_eos --greedy --precision bf16 --cuda_graphs off --batch 1 ;;
        esac
      done
      tar cJf "$OUT/ncu_prof_$tag.tar.xz" -C "$P" . && rm -rf "$P" ;;
    checks)
      CT_TEST_BACKEND=cuda timeout 100 build-gpu/tests/test_golden 2>&1 | tail -1
      timeout 300 build-gpu/tests/test_ops_cuda 2>&1 | grep -E "FAIL|MISMATCH|^test:"
      timeout 200 build-gpu/tests/test_ops_cuda --op attention --attn flash3-bwd2o4,flash3-bwd2o6 2>&1 |
        grep -E "FAIL|MISMATCH|CHECK|^test:" | sed 's/^/bwd2 bit 4: /'
      ATTN=flash3-bwd2o2,flash3-bwd2o4,flash3-bwd2o6 timeout 200 bench/attention.sh build-gpu 2>&1 | grep -E "D64|->"
      timeout 300 bash tests/gpu/smoke_gpu.sh "$CT" 2>&1 | grep -vE "^ok"
      timeout 120 build-gpu/tests/test_decode_cuda 2>&1 | grep -E "decode_layers|attention_decode_rope|l2 hints|staged|cluster|FAIL|^test:"
      timeout 120 build-gpu/tests/test_comm_nccl 2>&1 | tail -3
      timeout 300 bash tests/gpu/generate_gpu.sh "$CT" 2>&1 | grep -vE "^ok"
      CT_DECODE_STAGE=1 timeout 300 bash tests/gpu/generate_gpu.sh "$CT" 2>&1 | grep -vE "^ok" | sed 's/^/staged gemv: /' ;;
    decode)
      CTRAIN=$CT COMPILE_BATCHES=1 timeout 300 bash bench/gpu_decode.sh
      G="$CT generate --model configs/qwen3-0.6b.toml --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16"
      for e in CT_DECODE_CARVEOUT=0 CT_DECODE_OPROJ=1 CT_DECODE_CLUSTER=0 CT_DECODE_FUSED_ATT=0 CT_DECODE_STAGE=1; do
        env $e timeout 90 $G --batch 1,1,8,64 --cuda_graphs auto 2>&1 >/dev/null | grep '^stats' | sed "s/^/$e /"
      done
      a=$(CT_DECODE_STAGE=1 timeout 30 $G --batch 1 --max_new_tokens 48 --print_ids --cuda_graphs on 2>/dev/null | md5sum)
      b=$(CT_DECODE_STAGE=1 timeout 30 $G --batch 1 --max_new_tokens 48 --print_ids --cuda_graphs off 2>/dev/null | md5sum)
      c=$(timeout 30 $G --batch 1 --max_new_tokens 48 --print_ids 2>/dev/null | md5sum)
      echo "staged gemv qwen3-0.6b: graphs = no graphs: $([ "$a" = "$b" ] && echo ok || echo DIFF);" \
           "= default: $([ "$a" = "$c" ] && echo ok || echo DIFF)" ;;
    timeline)
      # a binary built with the decode timeline (here: meson configure build-gpu
      # -Dcuda_args=-DCT_DECODE_TIMELINE; ninja -C build-gpu; cp build-gpu/ctrain build-gpu/ctrain-tl;
      # then configure -Dcuda_args= back and rebuild): where a graph-launched batch-1 decode step's
      # time goes between its early-launched kernels (never run yet: check that the step's tokens/s
      # is within a few % of ctrain's, i.e. that the notes cost little)
      TL=${TL:-build-gpu/ctrain-tl}
      G="$TL generate --model configs/qwen3-0.6b.toml --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto --batch 1"
      timeout 60 $G 2>&1 >/dev/null | grep -E "^stats|decode timeline|^  " | head -170 ;;
    s29)
      dec_tests || exit 1
      for e in X=1 CT_DECODE_ATT_PUSH=1 CT_DECODE_PREFETCH=downqkv; do dec_tl "${e#*=}" "$e"; done
      echo "ids qwen3: default $(ids ctrain) v4 $(ids ctrain-v4) downqkv $(ids ctrain CT_DECODE_PREFETCH=downqkv)" \
           "push $(ids ctrain CT_DECODE_ATT_PUSH=2) relax $(ids ctrain CT_DECODE_ATT_RELAX=1) (0b1cea1e507a before)"
      for r in 1 2; do
        ab def_$r ctrain qwen3-0.6b 1,1,8
        ab push_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_PUSH=1
        ab push2_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_PUSH=2
        ab relax_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_RELAX=1
        ab att_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=att
        ab down_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=down
        ab dq_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=downqkv
        ab dq_after_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=downqkv CT_DECODE_PF_AFTER=1
        ab down_after_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=down CT_DECODE_PF_AFTER=1
        ab all_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=1
        ab v4_$r ctrain-v4 qwen3-0.6b 1,1
        ab v4_down_$r ctrain-v4 qwen3-0.6b 1,1 CT_DECODE_PREFETCH=down
        ab v4_dq_$r ctrain-v4 qwen3-0.6b 1,1 CT_DECODE_PREFETCH=downqkv
        ab v4_dq_after_$r ctrain-v4 qwen3-0.6b 1,1 CT_DECODE_PREFETCH=downqkv CT_DECODE_PF_AFTER=1
      done
      for r in 1 2; do
        ab def_llama_$r ctrain llama3.2-1b 1,1
        ab push_llama_$r ctrain llama3.2-1b 1,1 CT_DECODE_ATT_PUSH=1
        ab dq_llama_$r ctrain llama3.2-1b 1,1 CT_DECODE_PREFETCH=downqkv
        ab v4_llama_$r ctrain-v4 llama3.2-1b 1,1
        ab v4_dq_llama_$r ctrain-v4 llama3.2-1b 1,1 CT_DECODE_PREFETCH=downqkv
      done
      rm -f "$OUT/ab.err" ;;
    s30)
      t0=$SECONDS
      dec_tests || exit 1
      echo "ids qwen3: default $(ids ctrain) push $(ids ctrain CT_DECODE_ATT_PUSH=2)" \
           "relax $(ids ctrain CT_DECODE_ATT_RELAX=1) downqkv $(ids ctrain CT_DECODE_PREFETCH=downqkv)" \
           "v4 $(ids ctrain-v4) (0b1cea1e507a before; $((SECONDS - t0)) s)"
      for r in $(seq 1 "${ROUNDS:-2}"); do
        ab def_$r ctrain qwen3-0.6b 1,1,8
        ab push_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_PUSH=1
        ab push2_$r ctrain qwen3-0.6b 1,1 CT_DECODE_ATT_PUSH=2
        ab relax_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_RELAX=1
        ab down_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=down
        ab dq_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=downqkv
        ab dq_after_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=downqkv CT_DECODE_PF_AFTER=1
        ab v4_$r ctrain-v4 qwen3-0.6b 1,1
        ab v4_dq_$r ctrain-v4 qwen3-0.6b 1,1 CT_DECODE_PREFETCH=downqkv
        echo "round $r ($((SECONDS - t0)) s)"
      done
      ab def_llama ctrain llama3.2-1b 1,1
      ab push_llama ctrain llama3.2-1b 1,1 CT_DECODE_ATT_PUSH=1
      ab dq_llama ctrain llama3.2-1b 1,1 CT_DECODE_PREFETCH=downqkv
      dec_tl default X=1; echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s31)
      t0=$SECONDS
      dec_tests || exit 1
      echo "ids qwen3: default $(ids ctrain) off $(ids ctrain CT_DECODE_ATT_PUSH=0 CT_DECODE_ATT_RELAX=0)" \
           "(0b1cea1e507a before)"
      for r in 1 2; do
        ab def_$r ctrain qwen3-0.6b 1,1,8
        ab off_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_PUSH=0 CT_DECODE_ATT_RELAX=0
      done
      CTRAIN=$CT BATCHES="1 8" COMPILE_BATCHES=1 COMPILE_TIMEOUT=120 timeout 200 bash bench/gpu_decode.sh
      dec_tl default X=1; echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s32)
      # the ids written by the argmax into mapped host memory instead of a copy between steps:
      # the decode tests, generation's checks (decoding ahead = step by step), the same ids, then
      # the default against CT_DECODE_ZEROCOPY=0 (two rounds), gpu_decode.sh on an H200
      t0=$SECONDS
      dec_tests || exit 1
      CT_SOURCE_ROOT=$PWD FIXTURES="qwen3 gpt2" timeout 240 bash tests/gpu/generate_gpu.sh "$CT" \
        > "$OUT/generate_gpu.txt" 2>&1; echo "generate_gpu.sh rc $? ($((SECONDS - t0)) s)"
      grep -E "^(not )?ok|FAIL|passed|failed" "$OUT/generate_gpu.txt" | grep -vE "^ok" | head; grep -c "^ok" "$OUT/generate_gpu.txt"
      echo "ids qwen3: default $(ids ctrain) copy $(ids ctrain CT_DECODE_ZEROCOPY=0) (0b1cea1e507a before)"
      for r in 1 2; do
        ab def_$r ctrain qwen3-0.6b 1,1,8
        ab copy_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ZEROCOPY=0
      done
      ab def_llama ctrain llama3.2-1b 1,1
      ab copy_llama ctrain llama3.2-1b 1,1 CT_DECODE_ZEROCOPY=0
      decode_if_h200 "1 8" 120 200
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s33)
      # session 33's measurement builds (bench/gpu_variant.sh): ef = the weights' loads marked
      # L2::evict_first; mb8 = attention's merge in rounds of 8 splits, rolled (less code; its
      # -DCT_ATT_MERGE_MB was taken out after this call: +0.3%, within noise); tl2 =
      # the timeline with attention's split math and merge each run twice, timed apart (is their
      # time the instruction fetch of code run once a launch?); tlef = the timeline of ef
      t0=$SECONDS
      echo "ids qwen3: default $(ids ctrain) ef $(ids ctrain-ef) mb8 $(ids ctrain-mb8) (0b1cea1e507a before)"
      dec_tl default X=1
      TLBIN=ctrain-tl2 dec_tl twice X=1
      [ -x build-gpu/ctrain-tlef ] && TLBIN=ctrain-tlef dec_tl ef X=1
      for r in 1 2; do
        ab def_$r ctrain qwen3-0.6b 1,1,8
        ab ef_$r ctrain-ef qwen3-0.6b 1,1,8
        ab mb8_$r ctrain-mb8 qwen3-0.6b 1,1,8
      done
      ab def_llama ctrain llama3.2-1b 1,1
      ab ef_llama ctrain-ef llama3.2-1b 1,1
      decode_if_h200 "1 8" 120 200
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s34)
      # call 160 (s33) found attention's split math and merge as slow when run a second time
      # (2.2 and 1.9 us), so not cold instruction fetch. Here: the timeline with the merge's steps
      # (max, FMAs, sum, stores) and every phase in the multiprocessor's cycles too (its clock), and
      # the SM clock nvidia-smi reports while ctrain decodes
      t0=$SECONDS
      dec_tl default X=1; tail -2 "$OUT/timeline_default.txt"
      nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,clocks_throttle_reasons.active --format=csv,noheader \
        -lms 20 > "$OUT/clocks.txt" 2>&1 & cpid=$!
      ab def_1 ctrain qwen3-0.6b 1,1,1,1
      kill $cpid; sort "$OUT/clocks.txt" | uniq -c | sort -rn | head -8
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s35)
      # the push merge rewritten (att_local_merge: a thread an output over a short loop, the
      # factors once a split) against the binary before it (ctrain-base, call 161's): tests (push
      # = pull bit for bit), ids, its phases in the timeline, then A/B rounds
      t0=$SECONDS
      new_vs_base || exit 1
      decode_if_h200 "1 8" 120 200
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s36)
      # attention's split math with its scores summed by a reduce-scatter (one score a lane, the
      # same sums) against the binary before it (ctrain-base: call 162's, with the new merge):
      # tests, ids, the timeline, A/B rounds on both shapes
      t0=$SECONDS
      LLAMA_EACH=1 new_vs_base || exit 1
      decode_if_h200 "1 8" 120 200
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s37)
      # the push merge's FMA loop on output pairs (8-byte row loads, four factors a 16-byte load)
      # against the binary before it (ctrain-base: call 163's), the timeline with clock64-only
      # phase notes; gpu_decode.sh on an H200
      t0=$SECONDS
      new_vs_base || exit 1
      decode_if_h200 "1 8 64" 110 230
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s38)
      # session 34: attention's rope, split math and merge each run twice from one copy of their
      # code (ctrain-tl2: CT_DECODE_TIMELINE + CT_DECODE_TL_TWICE): is the first run's time the
      # fetching of the code? Then the issue's benchmark when the card is an H200
      t0=$SECONDS
      nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
      TLBIN=ctrain-tl2 dec_tl twice X=1
      TLBIN=ctrain-tl2 dec_tl twice2 X=1
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        dec_tests || exit 1
        echo "ids qwen3: $(ids ctrain) (0b1cea1e507a before)"
        decode_if_h200 "1 8 64" 110 230
      fi
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s39)
      # session 34: CT_DECODE_WARM (the decode kernels' post-wait code run dry before their wait,
      # so its instructions are fetched while the kernel before finishes; bits: 1 attention, 2 qkv,
      # 4 gate/up, 8 o_proj, 16 down, 32 the head): the tests (test_warm: the same bits), the ids,
      # two interleaved rounds of each bit alone and all, Llama-1B, the timeline with and without;
      # gpu_decode.sh when the card is an H200
      t0=$SECONDS
      dec_tests || exit 1
      echo "ids qwen3: default $(ids ctrain) warm 63 $(ids ctrain CT_DECODE_WARM=63) (0b1cea1e507a before)"
      for r in 1 2; do
        for wm in 0 1 2 4 8 16 32 63; do ab warm${wm}_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_WARM=$wm; done
        ab base_$r ctrain-base qwen3-0.6b 1,1,8
      done
      ab llama_warm0 ctrain llama3.2-1b 1,1 CT_DECODE_WARM=0
      ab llama_warm63 ctrain llama3.2-1b 1,1 CT_DECODE_WARM=63
      dec_tl warm0 X=1
      dec_tl warm63 CT_DECODE_WARM=63
      decode_if_h200 "1 8 64" 110 230
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s40)
      # session 34: the push merge by every warp (DEC_WARPS / G warps a head, each finding the
      # factors itself: no shared-memory factors, no block barrier) against the binary before it
      # (ctrain-base: f79f798's, the same SASS as 901b29b); gpu_decode.sh on an H200
      t0=$SECONDS
      new_vs_base || exit 1
      decode_if_h200 "1 8 64" 110 230
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s41)
      # session 34: attention's heads split (CT_DECODE_ATT_HS=1: two warps a split, each with half
      # the query heads) against the same binary without it and the binary before (ctrain-base:
      # 75fa9b4's); the tests (push = pull = heads split bit for bit), the ids, both timelines,
      # three interleaved rounds, Llama-1B (G = 4) each round; gpu_decode.sh on an H200
      t0=$SECONDS
      HS_TL=1 hs_vs_off || exit 1
      decode_if_h200 "1 8 64" 110 230
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s42)
      # session 34: the heads split capped at 128 registers (two blocks' worth a multiprocessor, so
      # it fits beside the qkv GEMV's blocks as the 4-warp block did; call 172's took 177 and
      # started 1.3 us later), three interleaved rounds against it off and ctrain-base (75fa9b4's),
      # Llama-1B each round; then gpu_decode.sh at 1, 8 and 64 on the default, on any card
      t0=$SECONDS
      hs_vs_off || exit 1
      decode_all "1 8 64" 110 230
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s43)
      # session 34: the heads split on by default at one row where G = 2: the tests, the ids, two
      # interleaved rounds against CT_DECODE_ATT_HS=0 (Llama-1B: off by the rule, so once), then
      # gpu_decode.sh at 1, 8 and 64 on any card
      t0=$SECONDS
      dec_tests || exit 1
      echo "ids qwen3: default $(ids ctrain) hs off $(ids ctrain CT_DECODE_ATT_HS=0) (0b1cea1e507a before)"
      for r in 1 2; do
        ab default_$r ctrain qwen3-0.6b 1,1,8
        ab hs_off_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_HS=0
      done
      ab llama_default ctrain llama3.2-1b 1,1
      decode_all "1 8 64" 110 230
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s44)
      # session 35: the normed GEMVs' one row in registers (qkv and gate/up: each lane loads and
      # norms its own chunks of the input, so no block barrier and no one warp norming for eight)
      # against CT_DECODE_XR=0 in the same binary and ctrain-base (c04ab2d's): the tests (xr =
      # shared memory bit for bit), the ids, both timelines, three interleaved rounds, Llama-1B
      # each round; also CT_DECODE_PREFETCH=gudown (the gate/up GEMV asks the down projection's
      # weights into L2 after its wait); gpu_decode.sh on an H200
      t0=$SECONDS
      dec_tests || exit 1
      grep -E "gemv row in registers" "$OUT/test_decode.txt" | head -6
      echo "ids qwen3: xr $(ids ctrain) off $(ids ctrain CT_DECODE_XR=0) base $(ids ctrain-base) (0b1cea1e507a before)"
      if [ -x build-gpu/ctrain-tl ]; then
        dec_tl xr X=1
        dec_tl xr_off CT_DECODE_XR=0
        dec_tl gudown CT_DECODE_PREFETCH=gudown
      fi
      for r in 1 2 3; do
        ab xr_$r ctrain qwen3-0.6b 1,1,8
        ab off_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_XR=0
        ab gudown_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_PREFETCH=gudown
        ab base_$r ctrain-base qwen3-0.6b 1,1,8
        ab llama_xr_$r ctrain llama3.2-1b 1,1
        ab llama_off_$r ctrain llama3.2-1b 1,1 CT_DECODE_XR=0
      done
      decode_if_h200 "1 8 64" 110 230
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s45)
      # session 35, after call 178 (s44: xr made attention ~1.1 us faster and the output
      # projection ~1.1 us slower, whose blocks start ~2.5 us after attention's release, when
      # attention triggers them after its wait): the early trigger (CT_DECODE_ATT_LATE=0) with and
      # without xr, against ctrain-base, same binaries as call 178 (aded402); ids, two timelines,
      # three interleaved rounds, Llama-1B each round
      # (on an H200 the issue's benchmark of ctrain-base, the current code, comes first)
      t0=$SECONDS
      CT=$PWD/build-gpu/ctrain-base decode_if_h200 "1 8 64" 110 230
      echo "ids qwen3: xr late0 $(ids ctrain CT_DECODE_ATT_LATE=0) base late0 $(ids ctrain-base CT_DECODE_ATT_LATE=0) (0b1cea1e507a before)"
      if [ -x build-gpu/ctrain-tl ]; then
        dec_tl xr_late0 CT_DECODE_ATT_LATE=0
        dec_tl off_late0 CT_DECODE_XR=0 CT_DECODE_ATT_LATE=0
      fi
      for r in 1 2 3; do
        ab base_$r ctrain-base qwen3-0.6b 1,1,8
        ab base_late0_$r ctrain-base qwen3-0.6b 1,1,8 CT_DECODE_ATT_LATE=0
        ab xr_$r ctrain qwen3-0.6b 1,1,8
        ab xr_late0_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_LATE=0
        ab llama_base_$r ctrain-base llama3.2-1b 1,1
        ab llama_base_late0_$r ctrain-base llama3.2-1b 1,1 CT_DECODE_ATT_LATE=0
      done
      echo "done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err" ;;
    s46)
      # session 36: the issue's number on an H200 and the early trigger's A/B there (the same A/B
      # ran on an H100 in call 179), with the L2 hint for the down projection's weights (lost 2.7%
      # on an H100, call 149, where DRAM is the scarcer; never timed on an H200); on any other card
      # only its name, so an H100 costs little (GEN=1 adds tests/gpu/generate_gpu.sh, ~1.5 min;
      # ANY_CARD=1 the batch-1 benchmark and the decode tests, ~2 min). Sized for one call of
      # < 10 min on an H200: the generate suite comes last there.
      t0=$SECONDS
      gen_suite() {
        CT_SOURCE_ROOT=$PWD timeout "$1" bash tests/gpu/generate_gpu.sh "$CT" 2>&1 | grep -vE "^ok"
        echo "-- generate_gpu.sh done ($((SECONDS - t0)) s)"
      }
      batch1_and_tests() {
        decode_all "1" 110 200; echo "-- benchmark done ($((SECONDS - t0)) s)"; dec_tests
      }
      if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        [ "${GEN:-0}" = 1 ] && gen_suite 240
        [ "${ANY_CARD:-0}" = 1 ] && batch1_and_tests
        echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"; exit 0
      fi
      # the benchmark first (its raw log comes back even if the call is cut short), then the tests;
      # S46_QUICK=1: batch 1 and the decode tests only (for the last of a session's device time)
      [ "${S46_QUICK:-0}" = 1 ] && { batch1_and_tests; exit; }
      decode_all "1 8 64" 110 240
      echo "-- benchmark done ($((SECONDS - t0)) s)"
      dec_tests || exit 1
      echo "ids qwen3: $(ids ctrain) late0 $(ids ctrain CT_DECODE_ATT_LATE=0) (0b1cea1e507a before)"
      for r in 1 2; do
        # (a round takes ~70 s; none starts past ${S46_ROUNDS_BEFORE:-330} s, so a call sized to
        # a small device budget still returns the benchmark and the tests)
        [ $((SECONDS - t0)) -lt "${S46_ROUNDS_BEFORE:-330}" ] || break
        ab base_$r ctrain qwen3-0.6b 1,1,8
        ab late0_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_ATT_LATE=0
        ab pfdown_$r ctrain qwen3-0.6b 1,1 CT_DECODE_PREFETCH=down
        ab llama_base_$r ctrain llama3.2-1b 1,1
        ab llama_late0_$r ctrain llama3.2-1b 1,1 CT_DECODE_ATT_LATE=0
      done
      echo "-- rounds done ($((SECONDS - t0)) s)"
      rm -f "$OUT/ab.err"
      [ $((SECONDS - t0)) -lt 450 ] && gen_suite $((540 - (SECONDS - t0))) ;;
    s47)
      # session 38: the head GEMV with the argmax in its tail (norm_matmul_argmax, the default;
      # CT_DECODE_HEAD_ARGMAX=0 the two kernels) against the two, and the two fusions across a
      # layer's kernel boundaries that lost long ago, the norm + qkv GEMV inside the attention
      # cluster (CT_DECODE_QKV_ATT=1, call 66: 1,375 against 1,48x) and the output projection
      # inside it (CT_DECODE_OPROJ=1, call 30), and attention asking the layer's output projection
      # and gate/up weights into L2 (CT_DECODE_PREFETCH=att, call 17; =gu gate/up's alone, =ogu
      # those asked by the output projection's GEMV instead), timed again against the
      # default now that attention pushes its rows, sits apart and the ids go to mapped memory.
      # On an H200 the issue's benchmark first; on any card the decode tests, the ids and two
      # interleaved rounds (batch 1, 1, 8 on the Qwen3 shape; 1, 1 on Llama-1B's).
      t0=$SECONDS
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        decode_all "1 8 64" 110 240; echo "-- benchmark done ($((SECONDS - t0)) s)"
      fi
      dec_tests || exit 1
      echo "ids qwen3: base $(ids ctrain) ham0 $(ids ctrain CT_DECODE_HEAD_ARGMAX=0)" \
        "qkvatt $(ids ctrain CT_DECODE_QKV_ATT=1) oproj $(ids ctrain CT_DECODE_OPROJ=1)" \
        "(0b1cea1e507a before)"
      for r in 1 2; do
        [ $((SECONDS - t0)) -lt "${S47_ROUNDS_BEFORE:-440}" ] || break
        ab base_$r ctrain qwen3-0.6b 1,1,8
        ab ham0_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_HEAD_ARGMAX=0
        ab qkvatt_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_QKV_ATT=1
        ab oproj_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_OPROJ=1
        ab pfatt_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_PREFETCH=att
        ab pfgu_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_PREFETCH=gu
        ab pfogu_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_PREFETCH=ogu
        ab pfogud_$r ctrain qwen3-0.6b 1,1,8 CT_DECODE_PREFETCH=ogud
        ab llama_base_$r ctrain llama3.2-1b 1,1
        ab llama_ham0_$r ctrain llama3.2-1b 1,1 CT_DECODE_HEAD_ARGMAX=0
      done
      echo "-- rounds done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err" ;;
    s48)
      # session 39: why the eager step (--cuda_graphs off) decodes 20-33% faster with the head's
      # argmax in the head GEMV than with the two kernels (session 38, H100): two interleaved
      # rounds, without early launches, under the op profile (events around every kernel) and,
      # where nsys is installed, its GPU kernel and CUDA API summaries; the batch-1 step with its
      # kernels launched as null kernels (all, the GEMVs, attention); and the whole-MLP L2 hint
      # (ogud: +2.6% at batch 8 on an H200, -9% at batch 1) at batches 2 to 64. Cheapest first.
      t0=$SECONDS
      eager_ab
      for e in X=1 CT_DECODE_NULL=all CT_DECODE_NULL=gemv_kernel CT_DECODE_NULL=attention_decode_rope_kernel; do
        ab "null $e" ctrain qwen3-0.6b 1,1 $e
      done
      echo "-- eager + null done ($((SECONDS - t0)) s)"
      for r in 1 2; do
        ab base_$r ctrain qwen3-0.6b 2,2,4,16,32,64
        ab ogud_$r ctrain qwen3-0.6b 2,2,4,16,32,64 CT_DECODE_PREFETCH=ogud
        ab ogu_$r ctrain qwen3-0.6b 2,2,4,16,32,64 CT_DECODE_PREFETCH=ogu
      done
      echo "-- rounds done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err"
      NS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
      echo "nsys: ${NS:-none}"
      if [ -n "$NS" ]; then
        for v in base ham0; do
          e=X=1; [ $v = ham0 ] && e=CT_DECODE_HEAD_ARGMAX=0
          env $e timeout 90 "$NS" profile -o "$OUT/eager_$v" --force-overwrite true -t cuda \
            build-gpu/ctrain $DG --cuda_graphs off --model configs/qwen3-0.6b.toml --batch 1 \
            > "$OUT/nsys_$v.log" 2>&1
          echo "-- nsys $v: $(grep -oE 'decode_tok_s=[0-9.]+' "$OUT/nsys_$v.log" | tr '\n' ' ')"
          for rep in cuda_gpu_kern_sum cuda_api_sum; do
            timeout 90 "$NS" stats -q --report $rep --format csv "$OUT/eager_$v.nsys-rep" \
              > "$OUT/nsys_${rep}_$v.csv" 2>&1
            head -9 "$OUT/nsys_${rep}_$v.csv" | cut -c1-200
          done
          rm -f "$OUT/eager_$v.sqlite" "$OUT/eager_$v.nsys-rep"
        done
      fi ;;
    s49)
      # session 40: the whole-MLP L2 hint (ogud) the default from 8 rows (ctrain, with the patch;
      # ctrain-base, the tree without it; CT_DECODE_PREFETCH=0 turns it off): the decode tests and
      # ids, two interleaved rounds at batches 1-64, then s48's eager-step A/B and null-kernel steps.
      # The change is bench/results/s41_2026-12-07_H100_e5e30a5+pf/pf_default.patch.txt (not in
      # the tree: no device came in session 40 to measure it; session 41 ran s49 and kept it out):
      # build and copy build-gpu/ctrain to /tmp/base/ctrain, git
      # apply the patch, then EXTRA="/tmp/base/ctrain=build-gpu/ctrain-base" bench/gpu_pack.sh ctrain
      # tests/test_decode_cuda. If it lands, README's CT_DECODE_PREFETCH paragraph, ops.h's l2_hint
      # comment and decode.cu's "Opt-in" line say the new default and the batches it was measured at.
      t0=$SECONDS
      dec_tests || exit 1
      echo "ids qwen3: new $(ids ctrain) base $(ids ctrain-base) (0b1cea1e507a before)"
      for r in 1 2; do
        ab base_$r ctrain-base qwen3-0.6b 1,1,2,4,8,16,32,64
        ab new_$r ctrain qwen3-0.6b 1,1,2,4,8,16,32,64
        ab new_pf0_$r ctrain qwen3-0.6b 1,1,2,4,8,16,32,64 CT_DECODE_PREFETCH=0
        ab base_ogu_$r ctrain-base qwen3-0.6b 1,1,2,4,8,16,32,64 CT_DECODE_PREFETCH=ogu
      done
      ab llama_base ctrain-base llama3.2-1b 1,1,8
      ab llama_new ctrain llama3.2-1b 1,1,8
      echo "-- rounds done ($((SECONDS - t0)) s)"
      eager_ab
      [ $((SECONDS - t0)) -lt 420 ] &&
        for e in X=1 CT_DECODE_NULL=all CT_DECODE_NULL=gemv_kernel CT_DECODE_NULL=attention_decode_rope_kernel; do
          ab "null $e" ctrain qwen3-0.6b 1,1,8 $e
        done
      echo "-- eager + null done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err" ;;
    s57)
      # session 43: which batch-1 GEMVs take the one-task form (CT_DECODE_GV_ONE, gv_one_mask: 1
      # norm + qkv, 2 the output projection, 4 norm + gate/up, 8 the down projection): the general
      # form holds fewer registers (gate/up 60 against 80, down 70 against 114), so with it one down
      # block fits beside three gate/up blocks; MASKS interleaved rounds on the Qwen3-0.6B shape
      t0=$SECONDS
      dec_tests || echo "(the decode tests failed: the A/B still runs)"
      echo "ids qwen3: default $(ids ctrain) 19 $(ids ctrain CT_DECODE_GV_ONE=19) (0b1cea1e507a before)"
      cfgs=()
      for m in ${MASKS:-31 27 23 19 28}; do cfgs+=("m$m ctrain qwen3-0.6b 1,1,1 CT_DECODE_GV_ONE=$m"); done
      ab_rounds "${ROUNDS:-2}" "${cfgs[@]}"
      echo "-- s57 A/B done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err" ;;
    s56)
      # session 43: norm + qkv + attention in one grid (CT_DECODE_QKV_ATT=2, the tail form: each
      # kv head's last projection blocks go on as its attention, no kernel boundary between them)
      # against the default in the same binary (7a12061 had switches for variants of it): the
      # decode tests, the ids, three interleaved rounds on the Qwen3-0.6B shape (batch 1, 1, 1, 8);
      # on an H200 then the issue's benchmark (the default; its copy bandwidth gives the tail
      # form's fraction of the bound from the rounds)
      t0=$SECONDS
      dec_tests || echo "(the decode tests failed: the A/B still runs)"
      grep -E "tail form" "$OUT/test_decode.txt" | head -4
      echo "ids qwen3: default $(ids ctrain) tail $(ids ctrain CT_DECODE_QKV_ATT=2) (0b1cea1e507a before)"
      ab_rounds "${ROUNDS:-3}" "base ctrain qwen3-0.6b 1,1,1,8" "tail ctrain qwen3-0.6b 1,1,1,8 CT_DECODE_QKV_ATT=2"
      echo "-- s56 A/B done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err"
      if [ -x build-gpu/ctrain-tl ]; then # the timelines of both (a CT_DECODE_TIMELINE build)
        dec_tl base X=1
        dec_tl tail CT_DECODE_QKV_ATT=2
      fi
      if [ $((SECONDS - t0)) -lt 200 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        decode_all "1" 100 170
      fi ;;
    s63)
      # the decode tests, the ids and the issue's benchmark first, so that a short lease still
      # returns them, then the timeline with block 0's ends by warp (session 47, H100: all its
      # warps end together, ~0.7 us after the merge's stores); ~4-5 min on an H200
      t0=$SECONDS
      dec_tests || echo "(the decode tests failed)"
      echo "ids qwen3: $(ids ctrain) (0b1cea1e507a before)"
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        decode_all "${S63_BATCHES:-1 8 64}" 100 250
      else
        decode_all "1" 100 180
      fi
      if [ -x build-gpu/ctrain-tl ]; then
        dec_tl base X=1 > /dev/null
        tl_lines base
      fi
      echo "-- s63 done ($((SECONDS - t0)) s)" ;;
    s64)
      # session 47, run after s63 (`gpu_next.sh s63 s64`): attention's block 0 merging with fewer
      # of its 8 warps (the batch-1 form: 4 splits a block, 2 warps a split; ctrain-m4 /
      # ctrain-m2, -DCT_ATT_MERGE_NW=4 / 2: 2 or 4 adjacent outputs a lane, the other warps of
      # block 0 leave at once; the same bits) against the default: ids, the timeline of m4
      # (ctrain-tlm4) beside s63's, two interleaved rounds at batch 1, 1, 8 (~3-4 min). The define
      # needs the patch in bench/results/s47_2026-12-07_H100_6c275f4+s63s64 (taken out: it lost)
      TLS="m4:ctrain-tlm4" LLAMA=0 VS_BENCH=0 vs_default m4:ctrain-m4 m2:ctrain-m2 ;;
    s61)
      # session 45: s60's timeline put attention's block 0 (the merge) ending ~0.45 us after its
      # merge's stores and ~0.7 us after the other blocks; without the barrier's last wait in
      # block 0 (nw, built with the patch in s61's results) it leaves when its warps are done.
      # ids, timelines, A/B (~3 min)
      TLS="base:ctrain-tl nw:ctrain-tlnw" vs_default nw:ctrain-nw ;;
    s60)
      # session 45: which register caps let the next kernel's blocks in early: attention's
      # batch-1 form at 96 (hs96, -DCT_ATT_HS_MAXNREG=96: beside two qkv blocks; the timeline's
      # r96 build caps every form, -DCT_ATT_MAXNREG=96), the down projection at 80 (d3,
      # -DCT_GV_DOWN_MINB=3: beside two qkv blocks; a build with both did not fit the 64 MiB a
      # call sends); ids, timelines of the default and of r96, two interleaved A/B rounds, the
      # Llama-1B shape once; on an H200 the issue's benchmark (~5 min)
      TLS="base:ctrain-tl r96:ctrain-tl96" vs_default hs96:ctrain-hs96 d3:ctrain-d3 ;;
    s58)
      # session 44's first call: the instruction-cache probe (bench/icache), the landed tree's
      # decode tests and ids, then the issue's benchmark at batch 1 against Transformers on
      # whatever card came (on an H200 at 1, 8 and 64) (~4-6 min)
      t0=$SECONDS
      timeout 120 build-gpu/bench/icache | tee "$OUT/icache.txt"
      dec_tests || echo "(the decode tests failed)"
      echo "ids qwen3: $(ids ctrain) (0b1cea1e507a before)"
      if [ -x build-gpu/ctrain-tl ]; then # the timeline with each kernel's last block end
        dec_tl base X=1
        sed -n '/last block end/,/completions/p' "$OUT/timeline_base.txt" | head -12
        grep -E "completions|a step, release" "$OUT/timeline_base.txt"
      fi
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        decode_all "1 8 64" 100 330
      else
        decode_all "1" 100 200
      fi
      echo "-- s58 done ($((SECONDS - t0)) s)" ;;
    s55)
      # session 42's last call: the landed tree's decode tests and ids; on an H200 the issue's
      # benchmark at batch 1 (against Transformers), else two batch-1 runs (~1-3 min)
      dec_tests || echo "(the decode tests failed)"
      echo "ids qwen3: $(ids ctrain) (0b1cea1e507a before)"
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        decode_all "1" 100 170
      else
        ab qwen_1 ctrain qwen3-0.6b 1,1,8
        ab llama_1 ctrain llama3.2-1b 1,1
      fi ;;
    s54)
      # session 42: s53 with the L2 hints' work out of line again (s52's form, the one-task GEMV
      # only where two blocks fit), against the landed code, two rounds of both shapes (~2 min)
      t0=$SECONDS
      dec_tests || echo "(the decode tests failed: the A/B still runs)"
      echo "ids qwen3: new $(ids ctrain) base $(ids ctrain-base) (0b1cea1e507a before)"
      ab_rounds 2 "base ctrain-base qwen3-0.6b 1,1,1,8" "new ctrain qwen3-0.6b 1,1,1,8" \
        "llama_base ctrain-base llama3.2-1b 1,1" "llama_new ctrain llama3.2-1b 1,1"
      echo "-- s54 done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err" ;;
    s53)
      # session 42: s52 with the one-task form only where two of its blocks fit a multiprocessor's
      # registers and the L2 hints inline again (ctrain) against the landed code (ctrain-base) and
      # CT_DECODE_GV_ONE=0, the Qwen3-0.6B and Llama-3.2-1B shapes in each round
      t0=$SECONDS
      dec_tests || echo "(the decode tests failed: the A/B still runs)"
      echo "ids qwen3: new $(ids ctrain) one0 $(ids ctrain CT_DECODE_GV_ONE=0) base $(ids ctrain-base) (0b1cea1e507a before)"
      ab_rounds 3 "base ctrain-base qwen3-0.6b 1,1,1,8" "new ctrain qwen3-0.6b 1,1,1,8" \
        "one0 ctrain qwen3-0.6b 1,1,1,8 CT_DECODE_GV_ONE=0" "llama_base ctrain-base llama3.2-1b 1,1" \
        "llama_new ctrain llama3.2-1b 1,1" "llama_one0 ctrain llama3.2-1b 1,1 CT_DECODE_GV_ONE=0"
      echo "-- s53 A/B done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err"
      if [ $((SECONDS - t0)) -lt 200 ]; then decode_if_h200 "1 8 64" 100 300; fi ;;
    s52)
      # session 42: the one-row GEMVs' one-task form (MULTI false) and the L2 hints' work out of
      # line (ctrain) against the landed s51 build (ctrain-base, 3eefe97's code) and against
      # itself with CT_DECODE_GV_ONE=0; then, on an H200 and with time left, the issue's benchmark
      t0=$SECONDS
      dec_tests || echo "(the decode tests failed: the A/B still runs)"
      echo "ids qwen3: new $(ids ctrain) one0 $(ids ctrain CT_DECODE_GV_ONE=0) base $(ids ctrain-base) (0b1cea1e507a before)"
      ab_rounds 3 "base ctrain-base qwen3-0.6b 1,1,1,8" "new ctrain qwen3-0.6b 1,1,1,8" \
        "one0 ctrain qwen3-0.6b 1,1,1,8 CT_DECODE_GV_ONE=0"
      ab llama_base ctrain-base llama3.2-1b 1,1
      ab llama_new ctrain llama3.2-1b 1,1
      echo "-- s52 A/B done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err"
      if [ $((SECONDS - t0)) -lt 200 ]; then decode_if_h200 "1 8 64" 100 300; fi ;;
    s51)
      # session 42: s50's change alone (ctrain-s50), and with the GEMV's never-taken norm paths out
      # of line (ctrain), against the tree without either (ctrain-base); then, on an H200 and with
      # time left, the issue's benchmark with ctrain
      t0=$SECONDS
      dec_tests || echo "(the decode tests failed: the A/B still runs)"
      echo "ids qwen3: gv $(ids ctrain) s50 $(ids ctrain-s50) base $(ids ctrain-base) gv eager $(DG="$DG --cuda_graphs off" ids ctrain) (0b1cea1e507a before)"
      ab_rounds 3 "base ctrain-base qwen3-0.6b 1,1,1,8" "s50 ctrain-s50 qwen3-0.6b 1,1,1,8" \
        "gv ctrain qwen3-0.6b 1,1,1,8"
      DG="$DG --cuda_graphs off" ab_rounds 2 "eager_gv ctrain qwen3-0.6b 1,1" \
        "eager_ham1 ctrain qwen3-0.6b 1,1 CT_DECODE_HEAD_ARGMAX=1"
      ab llama_base ctrain-base llama3.2-1b 1,1
      ab llama_s50 ctrain-s50 llama3.2-1b 1,1
      ab llama_gv ctrain llama3.2-1b 1,1
      echo "-- s51 A/B done ($((SECONDS - t0)) s)"; rm -f "$OUT/ab.err"
      if [ $((SECONDS - t0)) -lt 240 ]; then decode_if_h200 "1 8 64" 100 300; fi ;;
    h200)
      # the issue's benchmark when the lent card is an H200 (the tests and ids first); on any other
      # card only its name, so a call that gets an H100 costs little device time
      if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"; exit 0
      fi
      dec_tests || exit 1
      echo "ids qwen3: $(ids ctrain) (0b1cea1e507a before)"
      decode_if_h200 "1 8 64" 110 230 ;;
    null)
      G="$CT generate --model configs/qwen3-0.6b.toml --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
      for e in X=1 CT_DECODE_NULL=all CT_DECODE_NULL=gemv_kernel CT_DECODE_NULL=attention_decode_rope_kernel; do
        env $e timeout 60 $G --batch 1,1,8 2>&1 >/dev/null | grep '^stats' | sed -n '2,3p' | sed "s/^/$e /"
      done ;;
    ddp)
      # parallel.ce_allreduce: the copy-engine bucket all-reduce (parallel/comm_ce.c; run
      # tests/gpu/ddp_ce.sh and test_comm_nccl's ce scenarios first), tokens/s and step marks,
      # alone and with CT_CE_TAIL_NCCL=1 (the end-of-backward range through NCCL)
      MARKS=1 EXTRA="parallel.ce_allreduce=true" timeout 300 bench/ddp_probe.sh build-gpu
      for e in X=1 CT_CE_TAIL_NCCL=1 X=1 CT_CE_TAIL_NCCL=1; do
        env $e CT_STEP_MARKS=1 timeout 60 build-gpu/ctrain-launch --nproc_per_node 2 --standalone \
          configs/smoke.toml model.n_layer=12 model.d_model=768 model.n_head=12 model.vocab_size=50257 \
          model.max_seq_len=1024 train.seq_len=1024 train.max_steps=23 train.eval_every=0 data.val= \
          train.sample_tokens=0 train.warmup_steps=5 train.precision=bf16 train.micro_batch=64 \
          train.checkpoint_every=100000 parallel.ce_allreduce=true train.out_dir=/tmp/ce_$RANDOM 2>&1 |
          grep -E "copy-engine|copy engines|does not apply|rank0.*step marks|tok/s" -A6 | tail -12 | sed "s/^/ce $e: /"
      done ;;
    perf) TORCH=compile bench/gpt2_124m.sh build-gpu; ATTN=flash2,flash3,flash3-fwd2,flash3-bwd2o2,cudnn,auto bench/attention.sh build-gpu ;;
    llama) bench/qwen3_0p6b.sh build-gpu ;;
    dist) bench/gpu_dist.sh equiv ckpt fault ;;
    *) echo "unknown part $part (s29 s30 s31 s32 s33 s34 s35 s36 s37 h200 timeline prof checks decode null ddp perf llama dist)"; exit 2 ;;
  esac
  } 2>&1 | tee "$OUT/gpu_next_${part}_$tag.txt"
done
