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
//
// Decode-step fusions (ops.h: norm_matmul_fwd, norm_matmul_swiglu_fwd, matmul_add_fwd,
// qkv_rope_append). For 16-bit tables and at most GV_MAXN rows a warp-per-output GEMV streams
// the weight once with 16-byte loads and computes every row from it: lane l accumulates, in
// fp32 and in k order, the 16-byte chunks l, l + 32, l + 64, ... of its rows, then a butterfly
// sum; so an output's arithmetic depends only on its own input row, never on how many rows
// ran with it. From 2 rows the GEMV runs on the tensor cores instead (gemv_mma_kernel: the same
// bytes, mma.sync, fixed-order sums, so a row of a 2-8 row batch gives the same bits in any
// other; a solo run, on the CUDA cores, matches it within rounding). The rms norm of the input is
// recomputed by every block (its rows are at most 3072 wide) with the arithmetic of
// rmsnorm_fwd (the sum of squares goes by 16-byte chunks, so its last bit may differ;
// CT_DECODE_V2=0 keeps rmsnorm_fwd's order); products are rounded where the unfused ops round
// them. Other shapes, the fp32 table and more rows compose the table's plain ops (cuBLAS),
// which is the reference too.
// Every kernel of a decode step is launched with programmatic dependent launch: it lets the
// next kernel start while it runs; each kernel waits (griddepcontrol.wait) for the one before
// to finish before it touches activations, and a GEMV loads its first weights before the wait,
// so weight streaming overlaps the tail of the kernel before it. CT_DECODE_GEMV=0 and
// CT_CUDA_PDL=0 turn the fused kernels and the early launches off (for comparisons).
//
// Where a batch-1 token's time goes (H200, Qwen3-0.6B shape, 735 us a token, 40% of the 292.7 us
// bound, before the largest shared-memory carveout became the default (carveout_on: 690 us,
// 42%); ncu of one decode step, bench/results/ncu_prof_2026-11-30_1xH200_2cc4359.tar.xz, each
// kernel alone with cold caches): per layer gate/up 8.0 us (12.6 MB: 1.6 TB/s), down 6.5 (6.3 MB),
// qkv 6.6 (8.4 MB), attention_decode_rope 11.1, o_proj 5.4 (4.2 MB); together 37.6 us, while a
// layer of the graph-launched step costs ~23 us (the CT_DECODE_NULL runs of cc0e9f0: GEMVs ~13
// us a layer for 7.4 us of weight bytes). The GEMVs' first weights are in registers before
// their wait, so what is left on a layer's critical path is five kernel boundaries, each a
// completed grid, the input vector's reload from L2 (the GEMVs' top stall: the barrier after
// it is staged), a short compute and the stores: ~2-2.5 us a boundary. The GEMVs' DRAM time
// is not the limit; 60% of the bound (488 us a token, ~14 us a layer after the head's 77)
// needs fewer boundaries a layer, i.e. fusions across the grid-wide dependencies (o_proj into
// the attention kernel with a fixed-order partial-sum buffer read by the next GEMV, or a
// persistent layer kernel with cheaper-than-launch grid barriers), not faster GEMVs.
// The timeline (CT_DECODE_TIMELINE builds, H200, bench/results/call46_72ab9c2.txt and
// call48_f7961d4.txt; ~705 us a graph-launched step there, 4.5% slower than without the notes)
// puts numbers on that: from each kernel's release (its wait returns) to the next's, a layer's
// qkv GEMV takes 4.4-5.8 us, attention 6.7-8.7, o_proj 2.5-3.4, gate/up 3.1-3.3, down 4.0-4.6:
// ~22 us a layer against 7.6 us of weight bytes at the copy bandwidth; the head GEMV 70 us (311
// MB, at the bandwidth); argmax and the gap between graph replays ~20 us (~30 before decoding
// ahead, trainer/model.c). Attention's block 0 (384 keys): q/k loads + norm + rope 1.8 us, the
// split math 1.8, the first cluster barrier 0.7, the merge over distributed shared memory 1.9,
// then 1.1 to o_proj's release. The qkv GEMV's blocks start ~3 us after down is released.
// What the chain waits on (2026-12-01, H200, bench/results/call66_2dbd9ad .. call74_a06070e; every
// variant below gave the same ids and none was faster than 1,476-1,485 tokens/s):
//  - Kernels launched early slow the kernel they wait on. Attention's phases (block 0, after its
//    release) take q/k rope 1.55 us, split math 2.15, barrier 0.8, merge 1.9 with the output
//    projection's and gate/up's blocks resident beside it (their weight loads in flight), but
//    0.95 / 0.95 / 1.2 / 1.5 without early launches (CT_CUDA_PDL=0, where the step is 28% slower
//    for the launch gaps). Triggering attention's dependents after its split math made the rope
//    and split math fast and the merge slow (1,483 against 1,483 tokens/s, call 73); the output
//    projection triggering gate/up only after its own wait ran 1% slower (call 74). What does pay
//    (2026-12-05, calls 136-141): keeping those blocks off attention's multiprocessors rather than
//    launching them later; attention's blocks ask for unused shared memory where its grid is small
//    (alone): +5.2% at batch 1 on the Qwen3-0.6B shape, +3.3% on Llama-3.2-1B's (H100). Better
//    (calls 143-146, bench/results/call143_2026-12-05_apart): attention's blocks and the output
//    projection's and gate/up's kept apart by pads on both sides, so attention's may still start
//    beside the qkv GEMV's, and attention triggering its dependents only after its wait (att_pad):
//    on an H200 1,593-1,597 tokens/s against 1,516-1,535 alone and 1,475-1,478 with no pad (47% of
//    the bound); padding the output projection alone was no better than no pad (H100).
//  - The old keys' DRAM loads are not on attention's critical path: without them (a measurement
//    build) its phases are the same (call 70). Pushing the splits' rows into block 0's shared
//    memory and loading the q/k norm weights before the wait changed nothing (call 72).
//  - A GEMV whose weights are already in shared memory (the staged GEMV at one row: 1,280) or
//    registers still takes 3-6 us from the kernel before's completion to its own; register caps
//    that let later kernels launch earlier (gate/up at 48 registers: 1,383; the residual GEMVs at
//    64: 1,409) made the step slower (calls 67-69).
//  - norm + qkv + attention as one cluster kernel (attention_decode_qkv, opt-in): 1,375 (call 66).
//  - Attention's split math with a key a lane (32-key splits; a lane's whole score in registers,
//    no shuffles for the dot products, the probabilities broadcast through shared memory): 1,471
//    against 1,490 tokens/s, and 1,334 with 8 warps a block (2026-12-02, call 79; the kernel is in
//    bench/results/call79_2026-12-02_H200/lane_kernel.cu.txt). The split math's instructions are
//    not what attention waits on either.
//  - Attention without its cross-block merge: 8-warp blocks each merging their own splits into a
//    partial, the output projection's GEMV merging the partials in its prologue (the op
//    attention_decode_oproj as two kernels): the same ids, 1,372 against 1,481 tokens/s at batch
//    1 (128-token prompt), 1,168-1,175 both ways at 1,000, 3,507 against 4,460 at batch 8: every
//    projection block loading all heads' partials costs more than the cluster merge it replaces
//    (call 83; bench/results/call80_2026-12-02_H200/attention_part.patch.txt).
//  - The persistent kernel rebuilt with five phases a layer (decode_layers_kernel's STATUS): 1,212.
//  - The MLP as one kernel (gate/up blocks in clusters of 8 going on with the down projection of
//    their units, the shares summed by int64 fixed-point atomics and finished by the next layer's
//    norm + qkv GEMV): the same ids, 1,312 against 1,483 (call 85-86): its cluster barrier and
//    gather cost more than the boundary it removes, and 256 qkv blocks reading the 8 KB of sums
//    from the same L2 lines took 6.4-7.9 us against 3.4-4.0. Several decode steps a CUDA graph
//    (2 to 8): no faster (call 88). Both patches: bench/results/call85-86_*, call87-88_*.
//  - A software hand-off instead of the boundary (calls 92-98): the GEMVs writing their outputs
//    as tagged 16-byte lines (2 values + tag, twice) and the next GEMV, not waiting, polling its
//    input chunks and multiplying each as it arrived. Correct (within bf16 tolerance, graphs = no
//    graphs bit for bit, the same ids); one boundary streamed at best even with its waited
//    version, all three 1,109 against 1,490 tokens/s: every block needs the whole input, so the
//    polls are many requests to a few L2 lines while the weights stream through the same L2,
//    seeing a line is itself a loaded L2 round trip, and the polling blocks resident beside a
//    kernel slow it (bench/results/call92-98_*, the patch).
//  - Loads issued ahead of the arithmetic (call 99, 2026-12-02): attention's rope phase issuing
//    every head's loads (G q heads, the newest key's k and v, the norm weights) before the first
//    head's math (att_rope_split) took it from 1.61 to 1.32 us and attention's release-to-next-
//    release from 7.7 to 6.9-7.0 us; but the GEMVs after it then wait longer (o_proj 3.5 us
//    against 2.8, qkv 4.4 against 3.7; likely their weights had less time to arrive), so a step
//    gains ~8 us, not 28 x 0.8. The argmax reads its slice 16 bytes at a time, all loads in flight
//    before the compares (CT_DECODE_VEC_ARGMAX=0 turns it off). Together 1,491-1,506 against
//    1,479-1,488 tokens/s at batch 1, 4,512-4,518 against 4,442-4,455 at batch 8, the same ids
//    (bench/results/call99_2026-12-02_H200_rope_loads). The argmax's last block stores the id
//    2.9 us after its release; the next step's embedding starts 12 us after that. That gap was
//    the 4-byte copy of the ids that decoding ahead queued between two steps' graphs:
//    bench/graph_gap.cu measured a copy + event between two graph replays at 11.8-12.3 us of
//    idle GPU against 2.1 us for the replays alone (H100, 2026-12-06). The argmax now writes the
//    ids into mapped host memory (argmax_put): +1.6-1.9% at batch 1, +0.8% at 8 (call 156,
//    bench/results/call153-158_2026-12-06_H100_zerocopy; CT_DECODE_ZEROCOPY=0 keeps the copy).
//  - Instruction fetch (2026-12-06, calls 169-170, H100, bench/results/call169-170_*): attention's
//    split math run twice from one copy of its code takes 1.77 us the first time and 0.69 the
//    second, so its instructions cost up to ~1 us a layer. Running each kernel's post-wait code
//    once before its wait, storing nothing (CT_DECODE_WARM, the patch in those results), made every
//    kernel slower (attention -6%, qkv -8%, gate/up -7.5%, down -5%, all -16%): the dry runs take
//    issue slots beside the kernel they wait on and stall on their own loads past the release; the
//    loop form alone raised attention's registers 127 -> 159 (-10% at batch 8). A smaller hot path
//    is what could remove that fetch, not an earlier one.
// So the per-layer chain (~21.9 us in the timeline build: qkv 4.4, attention 7.0, o_proj 3.5,
// gate/up 3.2, down 3.8) is bounded by latencies that more overlap does not remove; the next step
// toward 60% of the bound is fewer dependent stages a layer with less work resident beside each,
// not another placement of the same five. The same kernels on the Llama-3.2-1B shape (16 layers of
// 121.6 MB, 29.3 us of weight bytes each against the Qwen3-0.6B shape's 7.6) reach 68% of the
// bound at batch 1, 3.40x Transformers with static cache + torch.compile (2026-12-03, call 117,
// bench/results/call117-118_*): a layer's ~14-17 us of dependent-stage latency is what the
// thinner model cannot hide. Spreading attention's cluster merge over every block of the cluster
// (each block a share of the outputs, one distributed-shared-memory round trip instead of block
// 0's two) gave the same bits and ran slower: 1,432-1,445 against 1,480-1,493 tokens/s at batch 1,
// 6,768-6,773 against 7,116-7,140 at 8, the Llama-1B shape 1.5-2.9% slower (call 118, the patch in
// bench/results/call117-118_*/call118/spread_merge.patch.txt).
// The GEMVs' first task's bias loaded before the wait and its residual right after it (in flight
// with the input rows, not after the reductions): the same ids, 1.5-2% slower at batch 1 on the
// Qwen3-0.6B shape and 2.7% at batch 8 on GPT-2 (call 131, 2026-12-05; the patch in
// bench/results/call131-132_*). Why the qkv GEMV starts ~3.3 us after the down projection's
// release (call 90's timeline): at batch 1 three gate/up blocks (64 registers x 256 threads) and a
// down block (72) need 67,584 of a multiprocessor's 65,536 registers, so down's blocks, and the
// qkv launch that waits for all of them to start, wait for gate/up blocks to leave. Call 69's
// down projection capped at 64 registers confirms it (bench/results/call69_c253c3b/ctrain-tl4.log:
// qkv's block 0 starts 0.6 us after down's release instead of 3.1) and shows why it does not pay:
// down's weights, now loaded during gate/up, which already runs at the copy bandwidth, make gate/up
// 0.9 us longer, and the step is 4% slower. DRAM idles during attention and the boundaries, not
// during gate/up.
// Three more that lost (2026-12-05, calls 133-135 on an H100, the variants against each other in
// one call; bench/results/call133-134_2026-12-05_H100_tk_l2 with the patch of the first and third):
//  - gemv_kernel holding 2-4 tasks a warp, all their weights loaded before the wait (one block a
//    multiprocessor for gate/up at 3, so it sits beside attention with its weights in flight):
//    gate/up at 2 / 3 / 4 tasks -0.6 / -13.5 / -15.5% at batch 1 on the Qwen3-0.6B shape, qkv at
//    2 -4.8% (GPT-2 -2.7%); bit-identical logits. At 4 all 96 blocks fit beside attention at
//    once, so the loss is not blocks starting late, nor loads issued after the wait (the SASS has
//    every task's loads before its ACQBULK): each task a warp does in sequence after its release
//    costs ~1.6 us, far more than its arithmetic.
//  - the other direction, each task's k range split over 2 or 4 warps (their sums added in shared
//    memory; call 135, bench/results/call135_2026-12-05_H100_splitk, patch there): gate/up -11.5%,
//    qkv -5.1%, the output and down projections even (-0.6% at 4). So for gate/up and qkv any grid
//    but today's (384 and 256 blocks of 64 registers, the shapes that fit beside the kernels
//    resident with them) costs, bigger or smaller blocks alike; a warp's arithmetic is not it.
//  - the vocabulary head's first 32 MB kept in L2 across steps (a persisting access-policy window
//    on the head's launch, the device's whole set-aside): -2.2% (Qwen3-0.6B), -5.3% (GPT-2), -3.3%
//    (Llama-3.2-1B), bit-identical, although the head reads 32 MB less DRAM a token: the rest of
//    the step, left with ~18 MB of L2, loses more on the reads that follow their writes than the
//    head gains.
// Why a faster attention alone does not pay (2026-12-06, calls 178-179 on an H100, timelines in
// bench/results/call178_2026-12-06_H100_xr and call179_*): a dependent launched by a PDL trigger
// placed after the primary's griddepcontrol.wait (att_pad's late trigger) starts its first block
// ~2.5 us after that point, so when attention's post-wait work got 1.1 us shorter (the one-row
// GEMVs norming their input in registers, xr, since taken back) the output projection's blocks
// had ~1.5 us instead of ~2.6 to load their weights and o_proj and gate/up took the time back.
// With the early trigger (CT_DECODE_ATT_LATE=0) o_proj starts before attention's release but
// attention's own phases lengthen beside the early blocks: +0.2 to +1.3% at batch 1 on the H100
// (call 179), left off until an H200 decides (older code measured it 1.5% slower there).
// Session 38 (2026-12-06, one H100, bench/results/call_s38_2026-12-06_H100_f26618f, the same ids
// every way): the head GEMV with the argmax in its tail (norm_matmul_argmax, one kernel fewer a
// step) ran even with the two kernels (1,613.6 against 1,612.6 tokens/s at batch 1, Llama-3.2-1B
// 1,023.7 against 1,025.5): the ~3 us the argmax kernel took after its release went to the head's
// last block merging 528 partials. With CUDA graphs off it decoded 20-33% faster (1,110-1,228
// against 905-930 tokens/s, two rounds), far more than one launch's ~5 us; why is not yet known.
// Kept (the default; CT_DECODE_HEAD_ARGMAX=0 the two kernels): the same bits either way. Since
// session 41 only inside CUDA graphs (cu_norm_matmul_argmax): eager, the two kernels were faster
// again (+15 to +29%).
// The fusions that lost before lose on today's code too: norm + qkv inside attention's cluster
// (CT_DECODE_QKV_ATT=1) -21% at batch 1, the output projection inside it (CT_DECODE_OPROJ=1)
// -36% (-36% at batch 8), and L2 hints filling the DRAM time attention leaves idle -6 to -8% at
// batch 1 (see l2_hint_t; only the whole MLP's hint helped batch 8, +1.4%).
// On an H200 (session 39, 2026-12-06, bench/results/call_s39_2026-12-06_H200_a7ba6d9, a7ba6d9,
// two interleaved rounds, the same ids every way): the default 1,821-1,837 tokens/s at batch 1
// (547-549 us a token, 52-53% of the 287 us bound), the two head kernels 1,814-1,824 (-0.6%);
// QKV_ATT -22%, OPROJ -36%; the L2 hints att -5.4%, gu -5.9%, ogu -6.3%, ogud -9.3% at batch 1,
// ogu +1.7% and ogud +2.6% at batch 8; the early trigger (ATT_LATE=0) -4.1%, the down projection's
// hint (PREFETCH=down) -3.3%; Llama-3.2-1B's shape 1,235-1,240 (~72% of its bound).
// Code size (session 40, 2026-12-07, from `nvcc -cubin -gencode arch=compute_90,code=sm_90` of this
// file, the .text section of each instantiation): a batch-1 layer on the Qwen3-0.6B shape runs
// attention_decode_rope_kernel<bf16, 16, 2> in its cluster + heads-split form (74 KB of SASS; the
// cluster form without the split 79 KB, the one with the output projection 100 KB) and four GEMV
// instantiations (gemv_kernel<bf16, 1, R, U, NORM, MODE>): norm + qkv <1, 2, 4, RMS, PLAIN> 35 KB,
// the output projection <1, 1, 8, -, RESID> 14 KB, norm + gate/up <1, 1, 4, RMS, SWIGLU> 35 KB, the
// down projection <1, 1, 12, -, RESID> 18 KB; the head + argmax <1, 4, 4, RMS, ARGMAX> 52 KB. So
// ~176 KB of distinct code a layer, against the instruction caches of a multiprocessor. With the
// cold split math of calls 169-170 (1.77 us against 0.69 us run a second time), a hot path with
// fewer instructions (attention's runtime push / relax / late branches made template parameters,
// less unrolling where registers do not need it) is the lead left untried for 60% of the bound.
// Session 41 (2026-12-07; bench/results/s41_2026-12-07_H100_e5e30a5+pf, one H100): the SASS of the
// heads-split attention (cuobjdump -sass) puts the pull merge (cl.sync, att_cluster_merge: ~1,200
// instructions, ~19 KB, with local-memory spills) inline between the split math's pushes and the
// push merge, behind a branch on `late & 4` that the heads split always takes. With the push known
// when compiled (HS) the kernel is 46 KB instead of 74 and its post-wait path contiguous (~17 KB);
// that change, and the one-kernel head only inside graphs, were session 41's patch s50. Null-kernel
// steps there (batch 1, tokens/s): 1,621-1,639 as built, 10,193-10,323 with every decode kernel a
// null kernel, 6,470-6,638 with the GEMVs null, 1,841-1,877 with the fused attention null: of a
// ~613 us step the GEMVs take ~458 us, attention ~70 (2.5 a layer), launches and replay ~98.
// The whole-MLP L2 hint as the default from 8 rows (ogud): +1.7% at 8 rows, -3.1 to -3.3% at 16,
// even at 32 and 64, so it stays opt-in (the patch is in those results).
// Session 42 (2026-12-07, one H100, bench/results/s42_2026-12-07_H100_88984a4+s51, three
// interleaved rounds, the same ids every way, test_decode_cuda 8,598 checks, 0 failed): s50 alone
// +0.3% at batch 1 (1,645 against 1,640 tokens/s, the mean of each round's warm runs) and +0.1% at
// 8; with the GEMVs' never-taken norm paths moved out of line as well (gv_rms_row_v1, gv_zero_row:
// before, they sat between every GEMV's wait and its multiply) +1.3% at batch 1 (1,661; every
// round 1,655-1,663 against 1,636-1,642) and +0.5% at 8 (7,043 against 7,010); Llama-3.2-1B even.
// Both landed. Moving code that does not run off the post-wait path paid here; whether through
// instruction fetch or through how the compiler then lays out and schedules the rest, these runs
// do not separate (the one-task form below says it is not the instruction count). The eager head was mixed this time (two kernels 1,046-1,053 and 900-907,
// the one kernel 932-1,195 and 977-1,042); the default stays as session 41 left it. Null-kernel
// steps: 1,659 as built, 11,071 all null, 6,675 GEMVs null, 1,868 attention null.
// Then (calls s52-s54, bench/results/s42_2026-12-07_H100_3eefe97+s52 .. +s54, H100): the one-row
// GEMVs' one-task form (gemv_kernel's MULTI false: no code for further rounds or tasks where a
// row fits one round and the grid has a task a warp) and the L2 hints' work out of line
// (l2_prefetch_run). Together, with the form wherever it applies: +2.3% at batch 1 on the
// Qwen3-0.6B shape but -7.5% on Llama-3.2-1B, whose 2048-wide norm + qkv and norm + gate/up then
// hold 147 registers (94-98 in the general form), one 256-thread block a multiprocessor. With the
// form only where two blocks fit (gv_one_fits): +2.3% (1,698 against 1,660 tokens/s, two rounds,
// s54) and Llama-3.2-1B +0.6%, batch 8 even, the same ids; landed. The parts apart show that
// the gain is layout and scheduling, not fewer instructions: the hints out of line with the
// general form -1.7%, the one-task form with the hints inline +0.2% (s52, s53). From session 42's
// start the Qwen3-0.6B shape is ~3.6% faster at batch 1 (1,640 -> 1,698 on the H100).
// Session 43 (2026-12-07, H100s only; bench/results/s43_2026-12-07_H100_*): norm + qkv and
// attention in one grid with no boundary between them (qkv_att_tail_kernel, CT_DECODE_QKV_ATT=2:
// the projection's blocks grouped by kv head, each head's last arrivals going on as its attention
// after a spin on the head's count, partials in global memory, a last-block merge) gives the two
// kernels' bits but decodes ~19% slower at batch 1 on the Qwen3-0.6B shape (1,355-1,368 against
// 1,662-1,698 tokens/s in three calls). Its variants: the cached keys prefetched into L2, the spin
// without a sleep, or the late trigger alone changed nothing; the late trigger with the rope table
// before the wait, or with one fence a block (and counters a line apart), ~1.5% (1,363-1,390).
// The timeline (s56 in
// 7a12061's results) says why: the fused kernel takes 12.3 us from its release to the output
// projection's, against 3.9 + 4.5 for the two kernels. The boundary it removes (the qkv GEMV's
// completion to attention's release) costs ~1.5 us, while its own chain (an atomic count, the
// cached keys' loads only then, a spin, q from L2, the split math, partials stored and fenced, a
// second count, the merge's loads from L2) has more dependent round trips than the cluster
// kernel's, whose blocks wait resident with their keys in registers and merge in shared memory.
// Opt-in, as a measured form (the variants' switches, CT_DECODE_QT_FLAGS, are in 7a12061).
// Which GEMVs take the one-task form (CT_DECODE_GV_ONE as a mask, s57):
// all four (the default) 1,690-1,692 tokens/s; gate/up in the general form 1,676 (-0.9%), down
// 1,613-1,620 (-4.4%), both 1,606-1,609 (-5.0%; one down block then fits beside three gate/up
// blocks, which does not pay), qkv and the output projection 1,630-1,640 (-3.3%). The output and
// down projections loading their input straight into registers (no copy into shared memory, no
// barrier) compiled to 144 and 213 registers (80 and 114 now: every input chunk stays live beside
// the weights), one block a multiprocessor, the shape that cost Llama-3.2-1B 7.5% in session 42; it
// was taken back before a device call could time it.
// Session 44 (2026-12-07, one H100; bench/results/s44_2026-12-07_H100_8b75db4+s58):
//  - How much code a multiprocessor keeps (bench/icache): a 16 KB probe of straight-line FFMAs
//    runs its body in 1,140 cycles when run twice in a row, 1,527 with one other 16 KB kernel in
//    between and ~2,550 with two or more (up to 384 KB); a 4 KB probe 396 warm, 406 after 16 KB,
//    ~745 after 32 KB. So the instruction caches hold between 20 and 32 KB, with no larger level
//    before L2, and code fetched cold costs ~88 cycles a KB, 2.2-2.9x the warm time. A
//    batch-1 layer's five kernels are ~144 KB of .text (attention 44, norm + qkv 33, gate/up 33,
//    down 18, the output projection 16), so every kernel runs its post-release path cold every
//    layer: up to ~44 ns a KB (1.98 GHz) where the fetch is not hidden behind data stalls. That
//    is why fewer bytes after the wait paid before (sessions 41-42), not a capacity to fit into.
//  - Where "to next" goes (the timeline now notes each launch's last block end): a kernel's own
//    work from its release to its last block's end, then the completion to the next release.
//    Per layer: qkv 2.9-3.1 + 0.53-0.59 us, attention 3.9-4.25 + 0.80-0.90, the output projection
//    1.8 + 0.80-0.88, gate/up 3.3-3.4 + 1.24-1.41 (down's blocks start only as gate/up's leave),
//    down 2.8-3.1 + 0.93-1.04; a step 527.6 us of work and 136.4 of completions (653.5 us, the
//    timeline build at 1,512 tokens/s against 1,673-1,688 without it). The boundary itself is
//    0.5-0.9 us, as graph_gap measures between empty kernels (0.77-1.02); the rest is work after
//    the release. Attention's last block ends ~1 us after block 0 of kv head 0's cluster has
//    stored its merge (2.94 us): the slowest cluster sets attention's end.
//  - Why attention's clusters may start late (a hypothesis for the next call): attention's block
//    (116 registers x 256 threads = 29,696) does not fit beside two qkv GEMV blocks (80 x 256 x
//    2 = 40,960) in 65,536 registers, and the qkv GEMV's 256 blocks sit two to a multiprocessor,
//    so a cluster of six finds room only as qkv blocks leave (its block 0 starts 2.34 us after the
//    qkv GEMV's release); the last clusters' cached keys may then still be in flight after
//    attention's release. At 96 registers (-DCT_ATT_MAXNREG=96, 56 bytes of stack) a block fits
//    exactly beside two. gpu_next.sh s59 times that build against the default, with both
//    timelines' per-cluster starts and ends; it has not run (every device start after s58
//    failed, and the session's device time went to those starts); s60 took its place.
// Session 45 (2026-12-07, one H100, bench/results/s45_2026-12-07_H100_77e0b5e+s60, two
// interleaved rounds, the same ids every way): the register hypothesis is wrong. Attention's
// clusters start 1.6-2.3 us after the qkv GEMV's release whether or not a block fits beside two
// qkv blocks (1.56-2.07 at 96 registers): what they wait for is the PDL launch after the last qkv
// blocks start and trigger (those sit out the down projection's blocks: 114 + 2 x 80 registers do
// not fit), and they are early enough (block 0 waits 1.6-2.2 us for its release). Capped at 96,
// attention's own phases lengthen (rope 0.86 -> 1.20 us after the release, the other blocks' end
// 2.54 -> 3.50): the batch-1 form alone at 96 (-DCT_ATT_HS_MAXNREG=96, no spill) 1,630-1,655
// against 1,666-1,693 tokens/s (-2.3%), batch 8 and Llama-3.2-1B even. The down projection at 80
// registers so one of its blocks fits beside two qkv blocks (-DCT_GV_DOWN_MINB=3: 176 bytes of
// spill) -20% (1,333-1,370), Llama-1B even. Neither is kept. What the per-cluster times show
// instead: the five blocks that push their rows leave ~0.4 us after block 0 has them (2.54 us
// after the release), and block 0 leaves ~0.45 us after its merge's stores (3.2-3.5 us), which
// sets attention's end; the clusters of kv heads 6 and 7 start 0.3-0.7 us after the others.
// That 0.45 us is not the cluster barrier's last wait: with block 0 leaving without it (s61,
// bench/results/s45_2026-12-07_H100_9b78991+s61, the patch there; the same ids, no hang) its end
// moved by 0-0.03 us and the step was even (1,643-1,672 against 1,649-1,681 tokens/s over three
// more rounds at batch 1), so it is block 0's slower warps finishing their shares of the merge
// (the phases note thread 0 only). Not kept.
// Session 47 (2026-12-07, one H100, bench/results/s47_2026-12-07_H100_6c275f4+s63s64; the same
// ids every way, test_decode_cuda 9,330 checks, 0 failed) says otherwise: block 0's ends by warp
// (kv head 0) are 3.44 us after attention's release for warps 1-7 and 3.51 for warp 0, so no warp
// lags; with only 4 of its 8 warps merging (-DCT_ATT_MERGE_NW=4, 2 outputs a lane, the patch
// there) the other 4 leave at 2.71 and the merging ones at 3.58, ~0.7 us after their stores (2.86).
// So a warp that stores the merge leaves ~0.7 us after its stores whatever it shares, which fits
// its exit waiting for its stores to be taken (the grid's completion waits for them anyway), not
// its merge work. Fewer merging warps: 4 -0.2%, 2 -0.6% at batch 1 (1,681-1,697 and 1,677-1,692
// against 1,683-1,701 tokens/s, two rounds), batch 8 even. Not kept. Attention's end is set by
// kv head 7's cluster, which starts 0.7 us after kv head 0's (2.29 against 1.60 us after the qkv
// GEMV's release; kv 6 at 1.93) and ends 0.16 us after it (3.67 against 3.51).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#ifdef CT_DECODE_TIMELINE
#include <string>
#include <vector>
#endif

#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/pack16.cuh"
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
// The current stream's capture status (None where the query fails; its error is cleared), and
// whether a graph is being captured on it now.
cudaStreamCaptureStatus capture_status() {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream(), &cs) != cudaSuccess) {
    cudaGetLastError();
    cs = cudaStreamCaptureStatusNone;
  }
  return cs;
}
bool stream_capturing() { return capture_status() == cudaStreamCaptureStatusActive; }

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

bool env_off(const char *name) {
  const char *v = getenv(name);
  return v && !strcmp(v, "0");
}
// An opt-in switch: the variable is "1". Read at every call, so a test can compare both paths in
// one process.
bool env_on(const char *name) {
  const char *v = getenv(name);
  return v && !strcmp(v, "1");
}
// A switch with a default: "0" forces it off, "1" on, anything else (or unset) leaves dflt.
bool env_switch(const char *name, bool dflt) {
  return env_off(name) ? false : env_on(name) ? true : dflt;
}
bool pdl_on() {
  static int on = -1;
  if (on < 0) on = !env_off("CT_CUDA_PDL");
  return on;
}
bool gemv_on() {
  static int on = -1;
  if (on < 0) on = !env_off("CT_DECODE_GEMV");
  return on;
}
// The second round of decode kernels (attention_decode_vec_kernel, argmax_split_kernel, the
// 16-byte norm prologue, one cos/sin table per row) is the default since it passed
// test_decode_cuda and generate_gpu.sh on an H200 (2026-11-30: batch-1 decode 774 -> 1099
// tokens/s on the Qwen3-0.6B shape); CT_DECODE_V2=0 runs the first round (for comparisons).
bool v2_on() {
  static int on = -1;
  if (on < 0) on = !env_off("CT_DECODE_V2");
  return on;
}
// argmax_split_kernel's 16-byte loads (VEC): on unless CT_DECODE_VEC_ARGMAX=0 (a comparison in
// one process; the ids are the same). Read at every launch.
bool vec_argmax_on() { return !env_off("CT_DECODE_VEC_ARGMAX"); }

// L2 hints (ops.h l2_hint): the next GEMV, attention or qkv_rope_append kernel launched on the
// device asks a later kernel's weights into L2 while it runs (cp.async.bulk.prefetch.L2, a slice
// per block), so DRAM keeps streaming through the gaps between the step's small kernels. No
// effect on any value. Opt-in, read at every hint, so a test can compare the modes in one process:
//   CT_DECODE_PREFETCH=1    every kernel takes its hint (measured slower on an H200: 1,154
//                           against 1,176 tokens/s; the GEMVs already keep DRAM busy, so their
//                           prefetches only move bytes around)
//   CT_DECODE_PREFETCH=att  only the attention kernels take theirs (the layer's output
//                           projection and gate/up weights, trainer/model.c), since DRAM idles
//                           while attention runs; measured slower too: 1,325-1,338 against
//                           1,360 tokens/s at batch 1, 4,272-4,281 against 4,396 at 8
//                           (bench/results/call17_5dbda21.txt). So the GEMVs that follow are not
//                           waiting on DRAM for their first bytes; their cost is elsewhere.
//   CT_DECODE_PREFETCH=down / downqkv   as att, but the hint names the down projection's weights,
//                           or those and the next layer's qkv weights (trainer/model.c): the two
//                           GEMVs whose blocks start late (down's cannot sit beside gate/up's; qkv
//                           launches behind down's), so their weights are not in registers early.
//                           Slower (call 149, an H100, batch 1 on the Qwen3-0.6B shape: down
//                           -4%, downqkv -4.5%; with down's GEMV at 64 registers -9.5%;
//                           bench/results/call149-151_2026-12-06_H100_push): the weights the
//                           hint pulls into L2 take DRAM time from the GEMVs streaming then.
//   CT_DECODE_PREFETCH=gu   as att, but only gate/up's weights (12.6 MB on the Qwen3-0.6B shape:
//                           the GEMV that streams the most right after attention's idle DRAM);
//                           =ogu: the output projection's GEMV asks for them instead, at its start
//                           (its blocks start beside attention), and no other kernel takes a hint;
//                           =ogud: those and the down projection's (18.9 MB). Session 38 (H100,
//                           bench/results/call_s38_*): att -6%, gu -6%, ogu -6.5%, ogud -8% at
//                           batch 1; at batch 8 att -6.5%, gu -5%, ogu +0.5%, ogud +1.4%
//   CT_DECODE_PF_AFTER=1    the fused attention issues its hint after its wait, when the qkv GEMV
//                           it waits on has finished streaming, rather than at its start
//                           (downqkv after the wait: -7.5%, call 149).
struct l2_hint_t {
  const void *p;
  size_t bytes;
};
l2_hint_t hints[16];
long hints_used; // hints handed to a kernel (tests)

int hint_dev() {
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < 16 ? dev : -1;
}

// 0 off, 1 every kernel, 2 attention only, 3 the GEMVs only
int prefetch_mode() {
  const char *v = getenv("CT_DECODE_PREFETCH");
  if (!v) return 0;
  if (!strcmp(v, "ogu") || !strcmp(v, "ogud")) return 3;
  if (!strcmp(v, "1")) return 1;
  const bool att = !strcmp(v, "att") || !strcmp(v, "down") || !strcmp(v, "downqkv") || !strcmp(v, "gu");
  return att ? 2 : 0;
}

void cu_l2_hint(const void *p, size_t bytes) {
  const int dev = hint_dev();
  if (dev < 0) return;
  const bool on = prefetch_mode() && p && bytes;
  hints[dev] = on ? l2_hint_t{p, bytes} : l2_hint_t{NULL, 0};
}

// The pending hint of the current device, cleared: for the kernel about to launch, an attention
// kernel (att) or another. With CT_DECODE_PREFETCH=att the others leave it pending.
l2_hint_t take_hint(bool att = false) {
  const int dev = hint_dev();
  if (dev < 0 || !hints[dev].p) return l2_hint_t{NULL, 0}; // prefetch off: no getenv per launch
  const int mode = prefetch_mode();
  if ((!att && mode == 2) || (att && mode == 3)) return l2_hint_t{NULL, 0};
  const l2_hint_t h = hints[dev];
  hints[dev] = l2_hint_t{NULL, 0};
  if (h.p) hints_used++;
  return h;
}

// CT_CUDA_PROFILE=1 also times every decode kernel launched outside a graph capture, in the op
// profile of ops_cuda.cu (keyed by kernel and grid; the events around a kernel cost it its early
// launch: run with --cuda_graphs off and compare totals, not the step time).

#ifdef CT_DECODE_TIMELINE
// A measurement compiled in on request (meson configure build-gpu -Dcuda_args=-DCT_DECODE_TIMELINE;
// default builds have none of it): block (0,0,0) of every decode kernel notes %globaltimer when
// it starts (pdl_trigger) and when its wait for the kernel before returns (pdl_wait), in launch
// order (block 0 of kernel k + 1 starts only after every block of kernel k has triggered, so the
// counter's order is the launch order). The lent hosts have no timeline profiler, and ncu
// serializes kernels; this shows where a graph-launched decode step's time goes between the
// early-launched kernels. ct_cuda_decode_timeline (at ct_cuda_shutdown) prints it.
#define TL_MAX (1 << 16)
__device__ unsigned long long tl_t[2][TL_MAX]; // [0] start, [1] released (the wait returned)
__device__ unsigned tl_seq;
__device__ __forceinline__ unsigned long long tl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool tl_block0() {
  return threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
}
__device__ __forceinline__ unsigned &tl_slot() { // this block's launch number (block 0 only)
  __shared__ unsigned s;
  return s;
}
// Phases inside attention_decode_rope_kernel's block 0 (thread 0): after the q / k rope, after the
// split math, after the first cluster barrier (the push: the wait for every row), after the merge;
// and inside the push merge (att_local_merge): after the factors, after the rows' FMAs, after the
// output stores (phases 4, 5 and 8 unused: call 169's CT_DECODE_TL_TWICE build, 20b7357, ran
// attention's phases twice from one copy of their code). A note is the multiprocessor's cycle
// counter (clock64), counted from the one block 0 took when its wait returned and printed at the
// card's clock: a %globaltimer read beside each moved the later notes ~0.1 us a note (call 165
// against 163: rope, split math and the rows' arrival 0.17-0.30 us earlier), and both clocks
// agreed on 1.96-1.99 GHz (call 161).
#define TL_PHASES 10
__device__ unsigned long long tl_am[TL_MAX]; // the argmax's note of its stored id (%globaltimer)
__device__ long long tl_pc[TL_PHASES][TL_MAX], tl_c1[TL_MAX];
#define TL_PHASE(k)                                         \
  do {                                                      \
    if (tl_block0()) tl_pc[k][tl_slot()] = clock64();       \
  } while (0)
// TL_PHASE after the value v is ready (a move that consumes it goes first)
#define TL_PHASE_AFTER(k, v)                                \
  do {                                                      \
    float tl_v_;                                            \
    asm volatile("mov.b32 %0, %1;" : "=f"(tl_v_) : "f"(v)); \
    (void)tl_v_;                                            \
    TL_PHASE(k);                                            \
  } while (0)
// argmax_split_kernel's launch number (its block 0 leaves it for the last block, which notes in
// tl_am when the id is stored)
__device__ unsigned tl_am_slot;
// When a kernel's last block ends (session 44): block 0 publishes its launch's ring slot in
// tl_epoch when its wait returns, and lane 0 of every warp of every block notes %globaltimer in
// tl_blkend[epoch][block] as it leaves the kernel (TL_END_GUARD, a destructor, so at every
// return). Blocks of launch k end after k's block 0 was released and before k + 1's can be, so
// the epoch they read is their own launch's. The latest of a launch's notes splits the "to next"
// column into the kernel's own work (its release to its last block's end) and the completion (that
// end to the next kernel's release), which graph_gap measures at 0.77-1.02 us between empty
// kernels. A ring of the latest TL_END_RING launches (32 MB), blocks past TL_END_BLOCKS folded in.
// Each block's start (its first warp's, noted when the guard is made) and multiprocessor go with
// its end, and block 0 notes the grid's x and y, for the per-cluster report of attention's
// launches.
#define TL_END_RING 4096
#define TL_END_BLOCKS 512
__device__ unsigned tl_epoch;
__device__ unsigned long long tl_blkend[TL_END_RING][TL_END_BLOCKS];
__device__ unsigned long long tl_blkbeg[TL_END_RING][TL_END_BLOCKS];
__device__ unsigned tl_blksm[TL_END_RING][TL_END_BLOCKS];
__device__ uint2 tl_grid[TL_END_RING];
// block 0's end by warp (session 45: attention's block 0, which makes the merge, ends ~0.45 us
// after thread 0's merge stores; which warps are the late ones)
__device__ unsigned long long tl_w0end[TL_END_RING][32];
struct tl_end_guard {
  unsigned long long t0;
  __device__ tl_end_guard() : t0(tl_now()) {}
  __device__ ~tl_end_guard() {
    if ((threadIdx.x & 31) == 0) {
      const unsigned e = *(volatile unsigned *)&tl_epoch & (TL_END_RING - 1);
      const unsigned b = ((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) &
                         (TL_END_BLOCKS - 1);
      const unsigned long long t = tl_now();
      tl_blkend[e][b] = t;
      if (b == 0) tl_w0end[e][threadIdx.x >> 5] = t; // (blocks of 1,024 threads at most)
      if (threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        tl_blkbeg[e][b] = t0;
        tl_blksm[e][b] = sm;
        if (b == 0) tl_grid[e] = make_uint2(gridDim.x, gridDim.y);
      }
    }
  }
};
#define TL_END_GUARD tl_end_guard tl_end_guard_
#else
#define TL_END_GUARD \
  do {               \
  } while (0)
#define TL_PHASE(k) \
  do {              \
  } while (0)
#define TL_PHASE_AFTER(k, v) \
  do {                       \
  } while (0)
#endif

// Programmatic dependent launch (sm_90): let the next kernel in the stream launch now; wait
// until the kernel before this one has finished and its writes are visible. Both are no-ops
// for a kernel launched without the attribute.
// tl_start: the timeline's note of a kernel's start (pdl_trigger makes it; a kernel that triggers
// its dependents later, pdl_launch_dependents, makes it itself at its start).
__device__ __forceinline__ void tl_start() {
#ifdef CT_DECODE_TIMELINE
  if (tl_block0()) {
    const unsigned s = atomicAdd(&tl_seq, 1u) & (TL_MAX - 1); // a ring: the latest TL_MAX
    tl_slot() = s;
    tl_t[0][s] = tl_now();
  }
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
  tl_start();
  pdl_launch_dependents();
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef CT_DECODE_TIMELINE
  if (tl_block0()) {
    tl_t[1][tl_slot()] = tl_now();
    tl_c1[tl_slot()] = clock64();
    *(volatile unsigned *)&tl_epoch = tl_slot();
  }
#endif
}

// Per-kernel attributes are set once per kernel and device: the kernels already set, by pointer
// (a template keyed by the kernel's type would share one entry between every instantiation with
// the same parameters).
struct kernel_list {
  const void *k[16][64];
  int n[16];
};
// The current device (-1 where it cannot be had) and whether k is on its list.
int listed(const kernel_list &l, const void *k, bool *in) {
  int dev = 0;
  *in = false;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return -1;
  for (int i = 0; i < l.n[dev]; i++)
    if (l.k[dev][i] == k) *in = true;
  return dev;
}
void add_listed(kernel_list &l, int dev, const void *k) {
  if (l.n[dev] < 64) l.k[dev][l.n[dev]++] = k;
}

// Whether decode kernels ask for the largest shared-memory carveout (max_carveout): yes unless
// CT_DECODE_CARVEOUT=0. Measured on an H200 (Qwen3-0.6B shape, bench/results/call31_289960a.txt):
// batch-1 decode 1,449 tokens/s with it against 1,360 (twice) without, batch 8 the same (4,372
// against 4,365). A multiprocessor runs blocks of one carveout at a time, so where the driver
// picked a smaller one for a kernel, the next kernel's blocks (launched early, programmatic
// dependent launch) waited for its blocks to drain instead of starting beside them. Until then it
// was on only with the staged GEMV. Read at every launch.
bool carveout_on() {
  const char *v = getenv("CT_DECODE_CARVEOUT");
  return !(v && !strcmp(v, "0"));
}

// Kernel k asks for the largest shared-memory carveout (carveout_on), once per device.
void max_carveout(const void *k) {
  static kernel_list done;
  bool in;
  const int dev = listed(done, k, &in);
  if (dev < 0 || in) return;
  if (cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared) != cudaSuccess)
    cudaGetLastError(); // a preference: the launch goes on without it
  add_listed(done, dev, k);
}

// CT_DECODE_NULL=NAME,NAME... (or "all"): a measurement, not a mode. The named kernels launch as
// null_kernel (the same grid; it only triggers and waits), so a step's time without their work
// says what they cost and what the chain of launches alone costs. The outputs are garbage. Read
// once (it is on every launch's path).
__global__ void null_kernel() {
  pdl_trigger();
  pdl_wait();
}
bool nulled(const char *name) {
  static const char *v = getenv("CT_DECODE_NULL");
  return v && (!strcmp(v, "all") || strstr(v, name));
}

// A kernel launch on the current stream, with programmatic dependent launch allowed (see the
// file comment) unless CT_CUDA_PDL=0; cluster > 1: blocks in clusters of that many along x.
#ifdef CT_DECODE_TIMELINE
// The kernels of the last decode step captured into a graph, in launch order (their names for
// the timeline; a graph's replays launch the same sequence).
std::vector<std::string> tl_names;
void tl_note(const char *name) {
  static bool in_capture = false;
  if (!stream_capturing()) {
    in_capture = false;
    return;
  }
  if (!in_capture) tl_names.clear();
  in_capture = true;
  tl_names.push_back(name);
}
#endif

template <typename... P, typename... A>
bool launch_cl(const char *op, const char *name, void (*k)(P...), dim3 grid, dim3 block,
               size_t smem, unsigned cluster, A... args) {
  if (carveout_on()) max_carveout((const void *)k);
  if (strcmp(name, "null_kernel") && nulled(name))
    return launch_cl(op, "null_kernel", null_kernel, grid, block, 0, cluster);
#ifdef CT_DECODE_TIMELINE
  tl_note(name);
#endif
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cudaLaunchAttribute at[2];
  unsigned na = 0;
  if (pdl_on()) {
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    at[na].id = cudaLaunchAttributeClusterDimension;
    at[na].val.clusterDim.x = cluster;
    at[na].val.clusterDim.y = 1;
    at[na++].val.clusterDim.z = 1;
  }
  cfg.attrs = at;
  cfg.numAttrs = na;
  void *ev = ct_cuda_prof_begin();
  const bool ok = ck(cudaLaunchKernelEx(&cfg, k, ((P)args)...), op, name, __LINE__);
  if (ev) {
    char key[64];
    snprintf(key, sizeof key, "%s grid %ux%u", name, grid.x, grid.y);
    ct_cuda_prof_end(ev, key);
  }
  return ok;
}
template <typename... P, typename... A>
bool launch(const char *op, const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
            A... args) {
  return launch_cl(op, name, k, grid, block, smem, 1u, args...);
}

// multiprocessors of the current device (cached per device)
int num_sms() {
  static int sms[16];
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 16) return 132;
  if (!sms[dev] && cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    sms[dev] = 132;
  }
  return sms[dev];
}

// The most blocks gemv_go launches (their warps loop over further tasks): 4 a multiprocessor. The
// head GEMV's argmax (GV_ARGMAX) keeps a partial a block, so it applies only within this many.
unsigned gv_block_cap() { return 4u * (unsigned)num_sms(); }

// compute capability major of the current device (cached per device); 0 where it cannot be had
int cc_major() {
  static int major[16];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return 0;
  if (!major[dev] &&
      cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    major[dev] = 0;
  }
  return major[dev];
}

// The plain ops of this dtype's table: the fallback composition of the fused ops.
template <typename T> const ct_ops *base();
template <> const ct_ops *base<float>() { return ct_ops_cuda(); }
template <> const ct_ops *base<bf16>() { return ct_ops_cuda_bf16(); }
template <> const ct_ops *base<f16>() { return ct_ops_cuda_fp16(); }

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}


// 16 bytes of weights, not kept in L1 (each is read once per step). volatile keeps the loads
// issued before pdl_wait where the code puts them.
// CT_LD_EVICT_FIRST (a measurement build, bench/gpu_variant.sh): the weights also marked first to
// go from L2 (an evict_first cache policy), so the streams leave the KV cache, the activations and
// the kernels' code there. Measured slower (call 160, an H100: -0.3 to -0.6% on the Qwen3-0.6B
// shape, +0.5% on Llama-3.2-1B's).
__device__ __forceinline__ uint4 ld_stream(const void *p) {
  uint4 r;
#ifdef CT_LD_EVICT_FIRST
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(pol));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
#endif
  return r;
}

// This block's slice of `bytes` bytes at p into L2 (sm_90 bulk prefetch; nothing elsewhere, and
// nothing for p NULL): the grid's blocks (all three dimensions) split the range. The hints are
// opt-in, so the work (~1.5 KB of SASS with its 64-bit divisions) is a function of its own: inline
// it sat in every decode kernel's code, in attention's after its wait.
__device__ __noinline__ void l2_prefetch_run(const void *p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const size_t nb = (size_t)gridDim.x * gridDim.y * gridDim.z;
  const size_t id = blockIdx.x + (size_t)gridDim.x * (blockIdx.y + (size_t)gridDim.y * blockIdx.z);
  const size_t per = ((bytes + nb - 1) / nb + 15) & ~(size_t)15;
  const size_t lo = per * id;
  if (lo >= bytes) return;
  size_t n = bytes - lo < per ? bytes - lo : per;
  n &= ~(size_t)15;
  const char *a = (const char *)p + lo;
  while (n) {
    const unsigned k = n > (1u << 20) ? (1u << 20) : (unsigned)n;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(k) : "memory");
    a += k;
    n -= k;
  }
#else
  (void)p, (void)bytes;
#endif
}
__device__ __forceinline__ void l2_prefetch_slice(const void *p, size_t bytes) {
  if (p && threadIdx.x == 0) l2_prefetch_run(p, bytes);
}

// Eight 16-bit values (one uint4) as floats.
template <typename T> __device__ __forceinline__ void cvt8(const uint4 &u, float f[8]);
template <> __device__ __forceinline__ void cvt8<bf16>(const uint4 &u, float f[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
template <> __device__ __forceinline__ void cvt8<f16>(const uint4 &u, float f[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
    const float2 v = __half22float2(h);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

using ct16::pack2; // kernels/cuda/pack16.cuh

// Eight floats rounded to 16-bit values (round to nearest even), as one uint4.
template <typename T> __device__ __forceinline__ uint4 pack8(const float f[8]) {
  return make_uint4(pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]),
                    pack2<T>(f[6], f[7]));
}

template <typename T> __device__ __forceinline__ T rnd(float v);
template <> __device__ __forceinline__ bf16 rnd<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16 rnd<f16>(float v) { return __float2half_rn(v); }
template <typename T> __device__ __forceinline__ float rounded(float v) {
  const T t = rnd<T>(v);
  return ldf(&t);
}

// ---------------------------------------------------------------------------------------------
// kernels

template <typename T>
__global__ void embed_pos_kernel(T *out, const int32_t *tok, const int32_t *pos, const T *wte,
                                 const T *wpe, long N, int C) {
  TL_END_GUARD;
  pdl_trigger();
  pdl_wait();
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N * C;
       i += (long)gridDim.x * blockDim.x) {
    const long n = i / C;
    const int c = (int)(i % C);
    float v = ldf(wte + (long)tok[n] * C + c);
    if (wpe) v += ldf(wpe + (long)pos[n] * C + c);
    stf(out + i, v);
  }
}

// cos and sin of rotary pair i (of hd / 2) at position p: the one formula every rope here uses,
// so a table made once per row and a value computed in place agree bit for bit.
__device__ __forceinline__ void rope_cs(int i, int hd, int p, float theta, float *c, float *s) {
  float e = (float)(2 * i) / (float)hd;
  float inv = 1.0f / (float)pow((double)theta, (double)e);
  float ang = (float)p * inv;
  double sd, cd;
  sincos((double)ang, &sd, &cd);
  *c = (float)cd;
  *s = (float)sd;
}

// A row's table cs_[i], sn_[i], i < hd / 2, made by the block's threads (the caller syncs).
__device__ __forceinline__ void rope_table(float *cs_, float *sn_, int hd, int p, float theta) {
  for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) rope_cs(i, hd, p, theta, cs_ + i, sn_ + i);
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
    float c, s;
    rope_cs(i, hd, pos[n], theta, &c, &s);
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

// M(LK, G_) for the 16-bit attention kernels' shapes: head dim hd 64 (LK 8) or 128 (LK 16), G 1, 2
// or 4 query heads a kv head, from the hd and G in scope (the caller has checked them).
#define LK_G_DISPATCH(M)         \
  do {                           \
    if (hd == 64) {              \
      if (G == 1) M(8, 1);       \
      else if (G == 2) M(8, 2);  \
      else M(8, 4);              \
    } else {                     \
      if (G == 1) M(16, 1);      \
      else if (G == 2) M(16, 2); \
      else M(16, 4);             \
    }                            \
  } while (0)
#define DEC_CHUNK 16     // keys per warp (one split)
// DEC_WARPS: -DDEC_WARPS=N builds are measurements. On an H200 (bench/results/call47_72ab9c2.txt,
// Qwen3-0.6B shape, the same ids): 8 or 12 warps a block ran 1% slower at 384 cached keys
// (clusters of 3 or 2 blocks instead of 6), and 12 ran 4% faster at 1,256 (1,218 against 1,170
// tokens/s: a cluster of 7 where 4 warps need 20 blocks, past the cluster limit of 8, and merge
// through L2): a block size chosen by the cache length would take both. With attention's blocks
// alone on their multiprocessors (att_pad's alone; 2026-12-05, call 140, an H100, batch 1), 8 warps
// ran 4.3% slower on the Qwen3-0.6B shape and 2.9% on Llama-3.2-1B's, GPT-2 even; kept apart
// from the GEMVs (att_pad's default; call 147, an H100), 5.2% slower at batch 1 and 2.2% at 8 on
// the Qwen3-0.6B shape, Llama-3.2-1B's even.
#ifndef DEC_WARPS
#define DEC_WARPS 4      // warps (splits) per block
#endif
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
  pdl_trigger();
  pdl_wait();
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
  pdl_trigger();
  pdl_wait();
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

// The two halves of a cluster barrier with no memory ordering of their own (the data they order
// travels by st.async and mbarrier transactions, not by plain stores): arrive, and later wait.
// Every thread of every block of the cluster takes each phase, warp by warp (.aligned).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
// The shared::cluster address of this block's shared variable p in block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_addr(const void *p, unsigned rank) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(r)
               : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
#endif
  return r;
}
// Stores into another block's shared memory (shared::cluster addresses from cluster_addr) whose
// bytes count against that block's mbarrier at bar (st.async: nothing to fence, nothing to wait
// for here; the receiver's mbarrier wait sees them).
__device__ __forceinline__ void st_async4(uint32_t addr, float a, float b, float c, float d,
                                          uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d), "r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void st_async2(uint32_t addr, float a, float b, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               ::"r"(addr), "f"(a), "f"(b), "r"(bar) : "memory");
#endif
}

// One split of attention_decode_vec_kernel, after its keys' K and V rows are in kr / vr (lane l:
// key k0 + j * (32 / LK) + l / LK, 16-byte chunk l % LK): scores, the split's softmax and V sums,
// written to part as (acc[hd], max, sum), or with dst to dst's G rows of hd + 4 floats, or with
// push (a shared::cluster address) by st.async into another block's rows (split sp's G rows of
// hd + 4 floats at push + (sp * G + g) * (hd + 4) floats), counted on its mbarrier pbar. q0: the G
// query heads of kv head kv, hd apart (global memory read through L2, or with QSHARED shared
// memory). gt / h0 (the heads-split attention): the kv head has gt query heads and these G are
// its heads h0 .. h0 + G - 1 (their rows' places). PUSHED: the caller always pushes (push != 0),
// so the other stores are not compiled. Warp-level; shared with decode_layers_kernel.
template <typename T, int LK, int G, bool QSHARED = false, bool PUSHED = false>
__device__ __forceinline__ void att_split_math(float *part, const T *q0,
                                               const uint4 (&kr)[DEC_CHUNK / (32 / LK)],
                                               const uint4 (&vr)[DEC_CHUNK / (32 / LK)], int n,
                                               int kv, int sp, int k0, int len, int H,
                                               int splits, float scale, int lane,
                                               float *dst = nullptr, uint32_t push = 0,
                                               uint32_t pbar = 0, int gt = G, int h0 = 0) {
  constexpr int hd = 8 * LK, KPL = 32 / LK, J = DEC_CHUNK / KPL;
  constexpr int PS = hd + 4;
  const int ks = lane / LK, ch = lane % LK;
  float q[G][8];
  const T *qp = q0 + ch * 8;
#pragma unroll
  for (int g = 0; g < G; g++)
    cvt8<T>(QSHARED ? *(const uint4 *)(qp + (long)g * hd) : __ldcg((const uint4 *)(qp + (long)g * hd)),
            q[g]);
  float sc[G][J];
#pragma unroll
  for (int j = 0; j < J; j++) {
    float kf[8];
    cvt8<T>(kr[j], kf);
#pragma unroll
    for (int g = 0; g < G; g++) {
      float d = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; e++) d = fmaf(q[g][e], kf[e], d);
      sc[g][j] = d;
    }
  }
  // The scores summed over the LK lanes of a key by a reduce-scatter: at each of the butterfly's
  // xor distances, in its order, a lane keeps half of its list (the lower half where its bit of the
  // distance is 0) and adds its partner's values for that half, so each sum is the butterfly's sum
  // of the same pairs in the same order (the same bits) in V - 1 shuffles instead of V log2(LK).
  // A lane ends with R scores x = xb .. xb + R - 1 (x = g * J + j), all of one head; with fewer
  // scores than lanes (V < LK), LK / V lanes share each one. Then the softmax's max, the mask and
  // exp are a lane's R scores only, and the V products take each p from the lane that holds it.
  constexpr int V = G * J, R = V >= LK ? V / LK : 1;
  float red[V];
#pragma unroll
  for (int g = 0; g < G; g++)
#pragma unroll
    for (int j = 0; j < J; j++) red[g * J + j] = sc[g][j];
  {
    int c = V; // the lane's list length (constant in the unrolled code)
#pragma unroll
    for (int o = LK / 2; o > 0; o >>= 1) {
      if (c > 1) {
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < V / 2; i++) {
          if (i < c / 2) {
            const float lo_v = red[i], hi_v = red[i + c / 2];
            const float got = __shfl_xor_sync(0xffffffffu, hi ? lo_v : hi_v, o);
            red[i] = (hi ? hi_v : lo_v) + got;
          }
        }
        c /= 2;
      } else {
        red[0] += __shfl_xor_sync(0xffffffffu, red[0], o);
      }
    }
  }
  const int xb = V >= LK ? ch * R : ch / (LK / V); // the lane's first score
  constexpr int HL = V >= LK ? J / R : LK; // lanes of a key group holding one head's scores
  float mm = -INFINITY, pr[R];
#pragma unroll
  for (int i = 0; i < R; i++) {
    const int j = (xb + i) % J;
    red[i] = k0 + j * KPL + ks < len ? red[i] * scale : -INFINITY;
    mm = fmaxf(mm, red[i]);
  }
#pragma unroll
  for (int o = 1; o < HL; o <<= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
#pragma unroll
  for (int o = LK; o < 32; o <<= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
#pragma unroll
  for (int i = 0; i < R; i++) pr[i] = expf(red[i] - mm);
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) { // head g's max, from the first lane holding its scores
    m[g] = __shfl_sync(0xffffffffu, mm, V >= LK ? g * J / R : 0);
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < J; j++) {
    float vf[8];
    cvt8<T>(vr[j], vf);
#pragma unroll
    for (int g = 0; g < G; g++) {
      const int x = g * J + j;
      const float p = __shfl_sync(0xffffffffu, pr[x % R], ks * LK + (V >= LK ? x / R : x * (LK / V)));
      l[g] += p;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
    }
  }
#pragma unroll
  for (int o = LK; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < G; g++) {
      l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
    }
  if (ks == 0 && (PUSHED || push)) { // the rows into block 0's shared memory (split-major, as dst)
#pragma unroll
    for (int g = 0; g < G; g++) {
      const uint32_t o = push + (uint32_t)((sp * gt + h0 + g) * PS) * 4u + (uint32_t)ch * 32u;
      st_async4(o, acc[g][0], acc[g][1], acc[g][2], acc[g][3], pbar);
      st_async4(o + 16u, acc[g][4], acc[g][5], acc[g][6], acc[g][7], pbar);
      if (ch == 0) st_async2(o + (uint32_t)hd * 4u, m[g], l[g], pbar);
    }
  } else if (!PUSHED && ks == 0) {
#pragma unroll
    for (int g = 0; g < G; g++) {
      float *o = dst ? dst + g * PS : part + (((long)n * H + kv * gt + h0 + g) * splits + sp) * PS;
      *(float4 *)(o + ch * 8) = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
      *(float4 *)(o + ch * 8 + 4) = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
      if (ch == 0) {
        o[hd] = m[g];
        o[hd + 1] = l[g];
      }
    }
  }
}

// The merge of a row's splits for one query head, in split order, into out (hd values): a warp.
// ld(s, i) reads float i of split s's row (acc[hd], max, sum). Its time is load latency (the
// splits were written by other blocks just before), so each round's loads go out together: every
// split's max and sum first (a lane a split), then the accumulator rows of MB splits at a time
// (64 registers; 128 made the persistent kernel spill); the arithmetic stays in split order.
// PARTS > 1: this warp makes only part `part` of the PARTS equal slices of the hd outputs (lane +
// 32 i for i in the slice), so PARTS warps share a head; each output's arithmetic is the same.
template <typename T, int hd, typename Load, int PARTS = 1>
__device__ __forceinline__ void att_merge_core(T *out, Load ld, int used, int lane, int part = 0) {
  constexpr int I = hd / 32 / PARTS, MB = 64 / I < 32 ? 64 / I : 32; // a round: <= 32 splits
  const int i0 = part * I;
  float m0 = -INFINITY, l0 = 0.0f; // split `lane`'s max and sum
  if (lane < used) {
    m0 = ld(lane, hd);
    l0 = ld(lane, hd + 1);
  }
  float M = m0;
  for (int s = lane + 32; s < used; s += 32) M = fmaxf(M, ld(s, hd));
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float L = 0.0f, a[I];
#pragma unroll
  for (int i = 0; i < I; i++) a[i] = 0.0f;
  for (int s0 = 0; s0 < used; s0 += 32) {
    const int s = s0 + lane;
    const float ms = s0 ? (s < used ? ld(s, hd) : 0.0f) : m0;
    const float ls = s0 ? (s < used ? ld(s, hd + 1) : 0.0f) : l0;
    const float f = s < used ? expf(ms - M) : 0.0f;
    if (s < used) L += ls * f;
    const int ns = min(32, used - s0);
    for (int j0 = 0; j0 < ns; j0 += MB) {
      float v[MB][I];
#pragma unroll
      for (int jj = 0; jj < MB; jj++)
#pragma unroll
        for (int i = 0; i < I; i++) v[jj][i] = j0 + jj < ns ? ld(s0 + j0 + jj, lane + 32 * (i0 + i)) : 0.0f;
#pragma unroll
      for (int jj = 0; jj < MB; jj++) {
        const float fj = __shfl_sync(0xffffffffu, f, (j0 + jj) & 31);
        if (j0 + jj < ns)
#pragma unroll
          for (int i = 0; i < I; i++) a[i] = fmaf(fj, v[jj][i], a[i]);
      }
    }
  }
  L = warp_sum(L);
#pragma unroll
  for (int i = 0; i < I; i++) stf(out + lane + 32 * (i0 + i), a[i] / L);
}

// att_merge_core over part (query head h of row n, read through L2); shared with
// decode_layers_kernel.
template <typename T, int hd>
__device__ __forceinline__ void att_merge_head(T *out, const float *part, int n, int h, int H,
                                               int splits, int used, int lane) {
  constexpr int PS = hd + 4;
  const float *p = part + ((long)n * H + h) * splits * PS;
  att_merge_core<T, hd>(out + (long)n * H * hd + (long)h * hd,
                        [&](int s, int i) { return __ldcg(p + (long)s * PS + i); }, used, lane);
}

// The 16-bit attention_decode for hd = 8 * LK (LK lanes read a key's row, 16 bytes each) and G
// query heads per kv head. grid (ceil(splits / DEC_WARPS), KV, N); warp w of block x takes
// split sp = x * DEC_WARPS + w, keys sp * DEC_CHUNK .. +DEC_CHUNK - 1 of kv head blockIdx.y, for
// all G query heads that share it: lane l reads key k0 + j * (32 / LK) + l / LK, j < J, chunk
// l % LK, all keys' loads issued before the first use. Scores are summed over the LK lanes of a
// key (butterfly), softmax and V products over the split's keys. The last block of a (row, kv
// head) to finish (a counter, reset by that block) merges the row's splits in split order, as
// attention_decode_merge_kernel does, so no second kernel is needed.
template <typename T, int LK, int G>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attention_decode_vec_kernel(T *out, float *part, unsigned *count, const T *qkv, const T *kc,
                                const T *vc, const int32_t *slot, const int32_t *pos, int H,
                                int KV, int max_T, int splits, float scale, const void *pf,
                                size_t pfb) {
  // part: a split's hd + 4 floats (acc (hd), max, sum; 16-byte rows)
  constexpr int hd = 8 * LK, KPL = 32 / LK, J = DEC_CHUNK / KPL;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int sp = blockIdx.x * DEC_WARPS + w, kv = blockIdx.y, n = blockIdx.z;
  __shared__ int last;
  l2_prefetch_slice(pf, pfb);
  pdl_trigger();
  // pos and slot were copied in before the step's first kernel, and every key but the row's
  // newest (len - 1, appended by the kernel before) was cached by an earlier step: their loads
  // go out while the kernel before is still finishing
  const int len = pos[n] + 1, k0 = sp * DEC_CHUNK;
  const bool active = sp < splits && k0 < len;
  const int ks = lane / LK, ch = lane % LK;
  const long s = slot ? slot[n] : n;
  const T *K = kc + ((s * KV + kv) * max_T) * (long)hd + ch * 8;
  const T *V = vc + ((s * KV + kv) * max_T) * (long)hd + ch * 8;
  uint4 kr[J], vr[J];
#pragma unroll
  for (int j = 0; j < J; j++) {
    const int key = k0 + j * KPL + ks;
    const bool old_key = active && key < len - 1;
    kr[j] = old_key ? *(const uint4 *)(K + (long)key * hd) : make_uint4(0, 0, 0, 0);
    vr[j] = old_key ? *(const uint4 *)(V + (long)key * hd) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  if (active) {
#pragma unroll
    for (int j = 0; j < J; j++) {
      const int key = k0 + j * KPL + ks;
      if (key == len - 1) {
        kr[j] = *(const uint4 *)(K + (long)key * hd);
        vr[j] = *(const uint4 *)(V + (long)key * hd);
      }
    }
    att_split_math<T, LK, G>(part, qkv + (long)n * (H + 2 * KV) * hd + (long)kv * G * hd, kr, vr, n,
                             kv, sp, k0, len, H, splits, scale, lane);
  }
  // the last block of (n, kv) merges
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(count + (long)n * KV + kv, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int used = min(splits, (len + DEC_CHUNK - 1) / DEC_CHUNK);
  for (int g = w; g < G; g += DEC_WARPS) { // a warp per query head
    att_merge_head<T, hd>(out, part, n, kv * G + g, H, splits, used, lane);
  }
  if (threadIdx.x == 0) count[(long)n * KV + kv] = 0;
}

// Row n's argmax id into out, and (argmax_advance: tok not NULL) the row's next decode inputs:
// the id as its token and the following position; with hid (mapped host memory, 2 x N ids) also
// hid[(new position & 1) * N + n] = id, which the host reads once the step's event is done (no
// copy queued behind the step: bench/graph_gap.cu measured a 4-byte copy between two graph
// replays at ~10 us of idle GPU on an H100, against ~2 us without it).
__device__ __forceinline__ void argmax_put(int32_t *out, int32_t *tok, int32_t *pos, int32_t *hid,
                                           int N, int n, int id) {
  out[n] = id;
  if (tok) {
    tok[n] = id;
    const int p = pos[n] + 1;
    pos[n] = p;
    if (hid) hid[(p & 1) * N + n] = id;
  }
}

// (bv, bi) becomes (v, i) where v is larger, or equal with a lower index: the largest value, the
// lowest index on ties, whatever order candidates come in.
__device__ __forceinline__ void argmax_take(float &bv, int &bi, float v, int i) {
  if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}
// The warp's best (bv, bi) in every lane (butterfly of argmax_take).
__device__ __forceinline__ void argmax_warp(float &bv, int &bi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    argmax_take(bv, bi, ov, oi);
  }
}
// An argmax over many blocks, each block's part: lane 0 of each of the block's W warps holds its
// warp's best (bv, bi); the block's best goes to its partial (*pv, *pi), and the block adds one to
// the counter *cnt shared by the nb blocks. True, in every thread, in the last block to arrive.
template <int W>
__device__ __forceinline__ bool argmax_block_partial(float bv, int bi, float *pv, int *pi,
                                                     unsigned *cnt, unsigned nb) {
  __shared__ float sv[W];
  __shared__ int si[W];
  __shared__ int last;
  if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = bv; si[threadIdx.x >> 5] = bi; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < W; k++) argmax_take(bv, bi, sv[k], si[k]);
    *pv = bv;
    *pi = bi;
    __threadfence();
    last = atomicAdd(cnt, 1u) == nb - 1;
  }
  __syncthreads();
  return last;
}
// The last block's warp then: the best of the nb <= 32 * PL partials in every lane, lowest index on
// ties. Every lane's loads go out together (one thread reading them in turn waited an L2 round trip
// each; the warp saves ~3 us a decode step on an H200, bench/results/call89_*), then the butterfly.
template <int PL>
__device__ __forceinline__ void argmax_partials(const float *pv, const int *pi, int nb, int lane,
                                                float &bv, int &bi) {
  __threadfence();
  float pvs[PL];
  int pis[PL];
#pragma unroll
  for (int j = 0; j < PL; j++) {
    const int k = lane + 32 * j;
    pvs[j] = k < nb ? __ldcg(pv + k) : -INFINITY;
    pis[j] = k < nb ? __ldcg(pi + k) : 0x7fffffff;
  }
  bv = -INFINITY;
  bi = 0x7fffffff;
#pragma unroll
  for (int j = 0; j < PL; j++) argmax_take(bv, bi, pvs[j], pis[j]);
  argmax_warp(bv, bi);
}

// One block per row: the largest of the first V entries, lowest index on ties.
#define ARGMAX_THREADS 1024
template <typename T>
__global__ void argmax_rows_kernel(int32_t *out, int32_t *tok, int32_t *pos, int32_t *hid,
                                   const T *logits, int V, int Vp) {
  __shared__ float sv[32];
  __shared__ int si[32];
  pdl_trigger();
  pdl_wait();
  const T *r = logits + (long)blockIdx.x * Vp;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = ldf(r + i);
    if (v > bv) { bv = v; bi = i; } // i grows: a thread keeps its first maximum
  }
  argmax_warp(bv, bi);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) { sv[w] = bv; si[w] = bi; }
  __syncthreads();
  if (w == 0) {
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
    argmax_warp(bv, bi);
    if (lane == 0) argmax_put(out, tok, pos, hid, gridDim.x, blockIdx.x, bi == 0x7fffffff ? 0 : bi);
  }
}

// ---- decode GEMV: out rows n < nr of inp (nr <= N <= GV_MAXN rows), weights w (OC, IC) ----
// MODE: GV_PLAIN  out(N,OC) = acc + bias;
//       GV_RESID  out(N,OC) = round(acc + bias) + res (out may alias res);
//       GV_GELU   out(N,OC) = gelu(round(acc + bias)) (matmul_fwd then gelu_fwd: the tanh form);
//       GV_SWIGLU out(N,F) = silu(round(acc_gate)) * round(acc_up), gate rows j and up rows F + j
//                 of w (2F, IC), no bias;
//       GV_ARGMAX GV_PLAIN for one row, then the argmax of its first am.V outputs as stored (the
//                 head of a batch-1 decode step: norm_matmul_argmax, see gv_argmax_tail).
// NORM (GV_NONORM, GV_RMS, GV_LAYER): the input rows are first rmsnorm'd with weight nw (as
// rmsnorm_fwd, rounded to T) or layernorm'd with weight nw and bias nb (as layernorm_rows_fwd).
// A warp task is R output rows (R gate + R up rows for GV_SWIGLU); each lane holds U 16-byte
// chunks of each of them per round. x sits in shared memory as T: (N, IC).
#define GV_WARPS 8
#define GV_MAXN 8
enum { GV_PLAIN = 0, GV_RESID = 1, GV_SWIGLU = 2, GV_GELU = 3, GV_ARGMAX = 4 };
enum { GV_NONORM = 0, GV_RMS = 1, GV_LAYER = 2 }; // NORM: the input rows as they are, rmsnorm'd, layernorm'd

// GV_ARGMAX's arguments (argmax_put's, and the blocks' partials: pv / pi a block each, cnt the
// row's counter, zero between launches); empty for the other modes.
struct gv_am {
  int32_t *out, *tok, *pos, *hid;
  float *pv;
  int *pi;
  unsigned *cnt;
  int V;
};
#define GV_AM_MAX_BLOCKS 640 // partials the last block merges (20 a lane)

// The end of a GV_ARGMAX launch: lane 0 of each warp holds the warp's best (bv, bi) of the outputs
// it stored (the first maximum in index order: a warp's outputs grow); the block's best goes to
// its partial, and the last block to arrive (the counter) takes the best of all, lowest index on
// ties, and puts it as argmax_split_kernel does. The same id as argmax_advance over the stored
// logits: each candidate is an output's stored value, and argmax_take's order does not matter.
__device__ __forceinline__ void gv_argmax_tail(const gv_am &am, float bv, int bi, int lane,
                                               int warp) {
  if (!argmax_block_partial<GV_WARPS>(bv, bi, am.pv + blockIdx.x, am.pi + blockIdx.x, am.cnt,
                                      gridDim.x) ||
      warp)
    return;
  argmax_partials<GV_AM_MAX_BLOCKS / 32>(am.pv, am.pi, (int)gridDim.x, lane, bv, bi);
  if (lane) return;
  argmax_put(am.out, am.tok, am.pos, am.hid, 1, 0, bi == 0x7fffffff ? 0 : bi);
  *am.cnt = 0;
}

// gelu_fwd's formula (ops_cuda.cu), so GV_GELU's outputs equal matmul_fwd + gelu_fwd's up to the
// order of the product's sums
__device__ __forceinline__ float gv_gelu(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
// cp.async: 16 bytes global -> shared, completed by cp_async_wait_all in the same thread.
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// The norm weight nw (IC values; then the norm bias nb, if any, at nws + IC) into shared memory
// nws, asked before the GEMV waits on the kernel before (they come from DRAM: every step streams
// more than L2 holds); gv_x_rows waits for them.
template <typename T>
__device__ __forceinline__ void gv_norm_weight(T *nws, const T *nw, int IC, const T *nb = NULL) {
  for (int c = threadIdx.x; c < IC / 8; c += blockDim.x) cp_async16(nws + (long)c * 8, nw + (long)c * 8);
  if (nb)
    for (int c = threadIdx.x; c < IC / 8; c += blockDim.x)
      cp_async16(nws + IC + (long)c * 8, nb + (long)c * 8);
}
// The norm's parameter rows of IC values that shared memory holds beside the input rows: none
// unless vn == 2, the weight, and for GV_LAYER the bias too
__host__ __device__ constexpr int gv_np(int norm, int vn) { return vn != 2 || !norm ? 0 : norm == 2 ? 2 : 1; }

// The GEMV's input: rows n < nr of inp (NORM GV_RMS: rmsnorm'd by nw; GV_LAYER: layernorm'd by
// nw and the bias nb, which may be NULL) into shared memory xs (N, IC) as T; rows nr .. N-1 zero.
// The block's warps share the rows. nws: nw (and for GV_LAYER nb) already on its way into shared
// memory (gv_norm_weight), or NULL. The layer norm holds its row in registers as norm_rows_kernel
// does (lane l the 16-byte chunks l, l + 32, ..., IC up to 2048) and sums in its order (the mean
// first, then the squares of the differences), so its values are the bits of layernorm_rows_fwd's.
// gv_x_rows' paths that a decode step's kernels never take (the first round's norm,
// CT_DECODE_V2=0, and the zero rows past nr of a batch padded to N) are functions of their own,
// out of line: inline they sat between the wait and the multiply in every GEMV's code, and an
// instruction fetched after the wait is on the critical path (the notes on code size).
template <typename T>
__device__ __noinline__ void gv_rms_row_v1(T *xo, const T *x, const T *nw, int IC, float eps) {
  const int lane = threadIdx.x & 31; // as rmsnorm_fwd: lane sums c = lane, lane + 32, ...
  float ss = 0.0f;
  for (int c = lane; c < IC; c += 32) {
    float v = ldf(x + c);
    ss += v * v;
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / IC + eps);
  for (int c = lane; c < IC; c += 32) stf(xo + c, ldf(x + c) * r * ldf(nw + c));
}
template <typename T> __device__ __noinline__ void gv_zero_row(T *xo, int nchunk) {
  for (int c = threadIdx.x & 31; c < nchunk; c += 32) *(uint4 *)(xo + (long)c * 8) = make_uint4(0, 0, 0, 0);
}

template <typename T, int N, int NORM>
__device__ __forceinline__ void gv_x_rows(T *xs, const T *inp, const T *nw, const T *nb, int nr, int IC,
                                          float eps, int vnorm, const T *nws = NULL) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nchunk = IC / 8;
  if constexpr (NORM) {
    if (nws) {
      cp_async_wait_all();
      __syncthreads();
      nw = nws;
      if (NORM == GV_LAYER && nb) nb = nws + IC;
    }
    for (int n = warp; n < N; n += GV_WARPS) {
      T *xo = xs + (long)n * IC;
      if (NORM == GV_LAYER && n < nr) { // (cu_layernorm_matmul_fwd: IC <= 2048)
        constexpr int CH = 8;
        const T *x = inp + (long)n * IC;
        float v[CH][8];
#pragma unroll
        for (int k = 0; k < CH; k++) {
          const int c = lane + 32 * k;
          cvt8<T>(c < nchunk ? *(const uint4 *)(x + (long)c * 8) : make_uint4(0, 0, 0, 0), v[k]);
        }
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CH; k++)
#pragma unroll
          for (int e = 0; e < 8; e++) sum += v[k][e];
        const float mean = warp_sum(sum) / IC;
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < CH; k++)
          if (lane + 32 * k < nchunk)
#pragma unroll
            for (int e = 0; e < 8; e++) {
              const float d = v[k][e] - mean;
              ss = fmaf(d, d, ss);
            }
        const float r = 1.0f / sqrtf(warp_sum(ss) / IC + eps);
#pragma unroll
        for (int k = 0; k < CH; k++) {
          const int c = lane + 32 * k;
          if (c >= nchunk) continue;
          float g[8], bb[8], y[8];
          cvt8<T>(*(const uint4 *)(nw + (long)c * 8), g);
          cvt8<T>(nb ? *(const uint4 *)(nb + (long)c * 8) : make_uint4(0, 0, 0, 0), bb);
#pragma unroll
          for (int e = 0; e < 8; e++) y[e] = (v[k][e] - mean) * r * g[e] + bb[e];
          *(uint4 *)(xo + (long)c * 8) = pack8<T>(y);
        }
      } else if (n < nr && !vnorm) {
        gv_rms_row_v1(xo, inp + (long)n * IC, nw, IC, eps);
      } else if (n < nr) { // 16-byte chunks lane, lane + 32, ...: a few rounds of loads
        const T *x = inp + (long)n * IC;
        float ss = 0.0f;
#pragma unroll 4
        for (int c = lane; c < nchunk; c += 32) {
          float v[8];
          cvt8<T>(*(const uint4 *)(x + (long)c * 8), v);
#pragma unroll
          for (int e = 0; e < 8; e++) ss = fmaf(v[e], v[e], ss);
        }
        const float r = 1.0f / sqrtf(warp_sum(ss) / IC + eps);
#pragma unroll 4
        for (int c = lane; c < nchunk; c += 32) {
          float v[8], g[8];
          cvt8<T>(*(const uint4 *)(x + (long)c * 8), v);
          cvt8<T>(*(const uint4 *)(nw + (long)c * 8), g);
          float y[8];
#pragma unroll
          for (int e = 0; e < 8; e++) y[e] = v[e] * r * g[e];
          *(uint4 *)(xo + (long)c * 8) = pack8<T>(y);
        }
      } else {
        gv_zero_row(xo, nchunk);
      }
    }
  } else {
    const uint4 *src = (const uint4 *)inp;
    uint4 *dst = (uint4 *)xs;
    for (int i = threadIdx.x; i < N * nchunk; i += blockDim.x)
      dst[i] = i < nr * nchunk ? src[i] : make_uint4(0, 0, 0, 0);
  }
}

// (a measurement build: -DCT_GV_DOWN_MINB=4 caps the 3072-wide residual GEMV, the down
// projection, at 64 registers so one of its blocks fits beside three gate/up blocks; =3 at 80,
// beside two qkv blocks: -20% at batch 1 from its spills, Session 45)
#ifdef CT_GV_DOWN_MINB
// (0 for the others: no minimum, so they compile as in the default build; 1 would change them)
template <int MODE, int U> constexpr int gv_minb() { return MODE == GV_RESID && U == 12 ? CT_GV_DOWN_MINB : 0; }
#define GV_BOUNDS __launch_bounds__(GV_WARPS * 32, (gv_minb<MODE, U>()))
#else
#define GV_BOUNDS __launch_bounds__(GV_WARPS * 32)
#endif
// MULTI false: the launch has one task a warp at most and a row fits one round (IC <= 8 * 32 *
// U), so the code for further rounds and tasks, never run there, is not compiled in (it sat
// between the wait and the multiply); gemv_go picks it for one row where two of its blocks fit a
// multiprocessor (gv_one_fits).
template <typename T, int N, int R, int U, int NORM, int MODE, bool MULTI = true>
__global__ void GV_BOUNDS
    gemv_kernel(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias, const T *res,
                int nr, int IC, int OC, float eps, int vnorm, const void *pf, size_t pfb,
                gv_am am) {
  static_assert(MODE != GV_ARGMAX || N == 1, "GV_ARGMAX takes one row");
  constexpr int RR = MODE == GV_SWIGLU ? 2 * R : R;
  float bv = -INFINITY; // GV_ARGMAX: lane 0's best output so far, and its index
  int bi = 0x7fffffff;
  extern __shared__ uint4 gv_smem[];
  T *xs = (T *)gv_smem;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int F = OC; // GV_SWIGLU: OC is F (outputs per row); w has 2F rows
  const int nchunk = IC / 8;
  const int tasks = (OC + R - 1) / R, stride = gridDim.x * GV_WARPS;
  int t = blockIdx.x * GV_WARPS + warp;
  auto row_of = [&](int task, int rr) -> int {
    if constexpr (MODE == GV_SWIGLU) return rr < R ? task * R + rr : F + task * R + (rr - R);
    return task * R + rr;
  };
  auto row_ok = [&](int task, int rr) -> bool {
    return (MODE == GV_SWIGLU ? task * R + (rr < R ? rr : rr - R) : task * R + rr) < OC;
  };
  uint4 wv[RR][U];
  auto load_round = [&](int task, int c0) {
#pragma unroll
    for (int rr = 0; rr < RR; rr++) {
      const bool ok = row_ok(task, rr);
      const T *wr = w + (long)row_of(task, rr) * IC;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = c0 + u * 32 + lane;
        wv[rr][u] = ok && c < nchunk ? ld_stream(wr + (long)c * 8) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // the first weights do not depend on the kernel before: load them while it finishes
  if (t < tasks) load_round(t, 0);
  T *nws = NORM && vnorm == 2 ? xs + (long)N * IC : NULL; // the norm weight's copy (gemv_go)
  if (nws) gv_norm_weight(nws, nw, IC, NORM == GV_LAYER ? nb : NULL);
  l2_prefetch_slice(pf, pfb); // a later kernel's weights (l2_hint), while this one streams
  TL_END_GUARD;
  pdl_trigger();
  pdl_wait();
  gv_x_rows<T, N, NORM>(xs, inp, nw, nb, nr, IC, eps, vnorm, nws);
  __syncthreads();
  for (; t < tasks; t += stride) {
    float acc[RR][N];
#pragma unroll
    for (int rr = 0; rr < RR; rr++)
#pragma unroll
      for (int n = 0; n < N; n++) acc[rr][n] = 0.0f;
    for (int c0 = 0; c0 < (MULTI ? nchunk : 1); c0 += U * 32) {
      if (MULTI && c0 > 0) load_round(t, c0);
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = c0 + u * 32 + lane;
        if (c < nchunk) {
          float wf[RR][8];
#pragma unroll
          for (int rr = 0; rr < RR; rr++) cvt8<T>(wv[rr][u], wf[rr]);
#pragma unroll
          for (int n = 0; n < N; n++) {
            float xf[8];
            cvt8<T>(*(const uint4 *)(xs + (long)n * IC + (long)c * 8), xf);
#pragma unroll
            for (int rr = 0; rr < RR; rr++)
#pragma unroll
              for (int e = 0; e < 8; e++) acc[rr][n] = fmaf(wf[rr][e], xf[e], acc[rr][n]);
          }
        }
      }
    }
    // prefetch the next task's first round before the reductions
    const int tn = t + stride;
    if (MULTI && tn < tasks) load_round(tn, 0);
#pragma unroll
    for (int rr = 0; rr < RR; rr++)
#pragma unroll
      for (int n = 0; n < N; n++) acc[rr][n] = warp_sum(acc[rr][n]);
#pragma unroll
    for (int n = 0; n < N; n++) {
      if (lane != n || n >= nr) continue;
#pragma unroll
      for (int r = 0; r < R; r++) {
        const int o = t * R + r;
        if (o >= OC) continue;
        if constexpr (MODE == GV_SWIGLU) {
          const float gt = rounded<T>(acc[r][n]), up = rounded<T>(acc[R + r][n]);
          stf(out + (long)n * F + o, gt / (1.0f + expf(-gt)) * up);
        } else {
          float v = acc[r][n] + (bias ? ldf(bias + o) : 0.0f);
          if (MODE == GV_RESID) v = rounded<T>(v) + ldf(res + (long)n * OC + o);
          if (MODE == GV_GELU) v = gv_gelu(rounded<T>(v));
          stf(out + (long)n * OC + o, v);
          if constexpr (MODE == GV_ARGMAX) {
            const float st = rounded<T>(v); // the value stored, which argmax_rows would read
            if (o < am.V && st > bv) { bv = st; bi = o; }
          }
        }
      }
    }
  }
  if constexpr (MODE == GV_ARGMAX) gv_argmax_tail(am, bv, bi, lane, warp);
}

// ---- tensor-core GEMV: 2 to GM_MAXN rows on mma.sync, IC a multiple of 256 ----
// gemv_kernel computes every row from each weight in fp32 FMAs, so at 8 rows a step's GEMVs run
// 8x the multiply-adds of one row on the CUDA cores, with every weight's conversion and every
// input chunk's shared-memory load repeated per row; from 9 rows the step went to cuBLAS, whose
// kernels for a few dozen rows read the weights at a fraction of the bandwidth and need the norm,
// the residual and SwiGLU as kernels of their own. Here the same bytes go through the tensor
// cores: a block of GV_WARPS warps makes a tile of 8 outputs (GV_SWIGLU: 8 gate outputs and their
// 8 up outputs) for all its rows, warp w the w-th eighth of the k range, in 32-wide k blocks.
// One mma.sync.m16n8k16 (fp32 accumulation) takes 16 input rows as A (16 rows x 16 k; up to 8
// rows: rows 8..15 zero) and the tile's weights as B (16 k x 8 outputs); MT such tiles of 16
// rows share each weight load. Thread (g = lane / 4, t = lane % 4) loads 16 bytes of output g's
// weight row and 16 bytes of input rows g and g + 8 at k = 32 b + 8 t .. 32 b + 8 t + 7 and
// hands them to two mmas as their k positions 2t, 2t + 1, 2t + 8, 2t + 9: a dot product may sum
// over k in any order, so permuting the k of both operands alike changes nothing, and every load
// stays 16 contiguous bytes. The warps' partial sums meet in shared memory and are added in warp
// order.
// An output's arithmetic depends only on its own input row (each element of an mma is its own
// dot product; other rows, zero or not, change nothing), and the per-element arithmetic is the
// same at every row count and row position, so a row of a 2..GM_MAXN row batch gives the same
// bits in any other. One row stays on gemv_kernel (faster there, see mma_mode), whose sums go in
// another order: a solo run matches its batch row within rounding.
// CT_DECODE_MMA=0 keeps gemv_kernel for 1-8 rows (cuBLAS beyond); CT_DECODE_STAGE=1 forces the
// staged GEMV.
#define GM_TILE 8  // outputs a tile
#define GM_MAXN 64 // rows the kernel takes at most (CT_DECODE_MMA_MAXN up to this)
#define GM_MAXN_DEFAULT 16 // rows it takes by default (more: cuBLAS; see gm_maxn)

// c += A B for one m16n8k16 tile (T: bf16 or f16, fp32 accumulation): a0 / a2 row g's k pairs,
// a1 / a3 row g + 8's (zero where the launch has at most 8 rows).
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GM_MMA(TY)                                                                               \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, "         \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                          \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                  \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
  if constexpr (std::is_same<T, bf16>::value) GM_MMA("bf16");
  else GM_MMA("f16");
#undef GM_MMA
#else
  __trap();
#endif
}

// U: 32-wide k blocks a warp loads per round (its share of a row is IC / 256 blocks: one round
// where that is at most U). TT: tiles a block takes at a time (GV_SWIGLU: 1), so that a wide
// output (the vocabulary head) keeps as many weight bytes in flight as gemv_kernel's 4-row tasks:
// with one tile at a time the head ran at a quarter of the bandwidth. MT: 16-row tiles of A (1:
// up to 16 rows). nx: the input rows held (1, 4, 8, 16 with MT = 1, else 16 MT; rows nr .. nx - 1
// zero, rows past nx zero in registers only, so a few rows do not fill 16 rows of shared memory).
// Dynamic shared memory: the nx input rows (T), the norm's gv_np rows, then two buffers
// of the warps' partial sums (float [GV_WARPS][S * TT][rs][8], rs = max(nx, 8) rows).
template <typename T, int U, int TT, int NORM, int MODE, int MT>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gemv_mma_kernel(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias, const T *res,
                    int nr, int nx, int IC, int OC, float eps, int vnorm, const void *pf,
                    size_t pfb) {
  constexpr int S = MODE == GV_SWIGLU ? 2 : 1; // weight rows a tile output: gate and up, or one
  static_assert(S == 1 || TT == 1, "GV_SWIGLU takes one tile at a time");
  constexpr int RT = S * TT; // weight rows a thread loads in each k block
  extern __shared__ uint4 gv_smem[];
  T *xs = (T *)gv_smem;
  T *nws = NORM && vnorm == 2 ? xs + (long)nx * IC : NULL;
  float *red = (float *)(xs + (long)(nx + gv_np(NORM, vnorm)) * IC); // [2][GV_WARPS][RT][rs][8]
  const int rs = nx > 8 ? nx : 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int F = OC; // GV_SWIGLU: OC is F (outputs a row); w has 2F rows
  const int kbw = IC / (32 * GV_WARPS); // k blocks a warp
  const int kb0 = warp * kbw;
  const int groups = (OC + GM_TILE * TT - 1) / (GM_TILE * TT); // TT tiles a group
  uint4 wv[RT][U];
  // output of row j of group grp for this thread (column g of its tile)
  auto out_of = [&](int grp, int j) { return (grp * TT + (S == 2 ? 0 : j)) * GM_TILE + g; };
  // round r of group grp: this thread's 16 bytes of its RT weight rows in k blocks kb0 + r * U ..
  auto load_round = [&](int grp, int r) {
#pragma unroll
    for (int j = 0; j < RT; j++) {
      const int o = out_of(grp, j);
      const T *wr = w + (long)(S == 2 && j ? F + o : o) * IC + t4 * 8;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int kb = r * U + u;
        wv[j][u] = o < OC && kb < kbw ? ld_stream(wr + (long)(kb0 + kb) * 32) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  int grp = blockIdx.x;
  // the first weights do not depend on the kernel before: load them while it finishes
  if (grp < groups) load_round(grp, 0);
  if (nws) gv_norm_weight(nws, nw, IC, NORM == GV_LAYER ? nb : NULL);
  l2_prefetch_slice(pf, pfb);
  pdl_trigger();
  pdl_wait();
  if constexpr (MT == 1) {
    if (nx == 1) gv_x_rows<T, 1, NORM>(xs, inp, nw, nb, nr, IC, eps, vnorm, nws);
    else if (nx == 4) gv_x_rows<T, 4, NORM>(xs, inp, nw, nb, nr, IC, eps, vnorm, nws);
    else if (nx == 8) gv_x_rows<T, 8, NORM>(xs, inp, nw, nb, nr, IC, eps, vnorm, nws);
    else gv_x_rows<T, 16, NORM>(xs, inp, nw, nb, nr, IC, eps, vnorm, nws);
  } else {
    gv_x_rows<T, 16 * MT, NORM>(xs, inp, nw, nb, nr, IC, eps, vnorm, nws);
  }
  __syncthreads();
  // this thread's input rows g + 8 h (h even: A's row g of m tile h / 2; odd: its row g + 8)
  bool xrow[2 * MT];
  const T *xr[2 * MT];
#pragma unroll
  for (int h = 0; h < 2 * MT; h++) {
    xrow[h] = g + 8 * h < nx;
    xr[h] = xs + (long)(xrow[h] ? g + 8 * h : 0) * IC + t4 * 8;
  }
  const int rounds = (kbw + U - 1) / U;
  for (int it = 0; grp < groups; grp += gridDim.x, it++) {
    // the two mmas of a k block accumulate apart (no chained latency)
    float ca[RT][MT][4], cb[RT][MT][4];
#pragma unroll
    for (int j = 0; j < RT; j++)
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) ca[j][m][i] = cb[j][m][i] = 0.0f;
    for (int r = 0; r < rounds; r++) {
      if (r > 0) load_round(grp, r);
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int kb = r * U + u;
        if (kb < kbw) {
          uint4 xv[2 * MT];
#pragma unroll
          for (int h = 0; h < 2 * MT; h++)
            xv[h] = xrow[h] ? *(const uint4 *)(xr[h] + (long)(kb0 + kb) * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int j = 0; j < RT; j++)
#pragma unroll
            for (int m = 0; m < MT; m++) {
              const uint4 &lo = xv[2 * m], &hi = xv[2 * m + 1];
              mma16816<T>(ca[j][m], lo.x, hi.x, lo.y, hi.y, wv[j][u].x, wv[j][u].y);
              mma16816<T>(cb[j][m], lo.z, hi.z, lo.w, hi.w, wv[j][u].z, wv[j][u].w);
            }
        }
      }
    }
    // the next group's first round goes out before the reduction
    if (grp + (int)gridDim.x < groups) load_round(grp + gridDim.x, 0);
    // c[0], c[1]: row 16 m + g, outputs 2 t4 and 2 t4 + 1 of the tile; c[2], c[3]: row 16 m + g + 8
    float *rb = red + (it & 1) * (GV_WARPS * RT * rs * 8);
#pragma unroll
    for (int j = 0; j < RT; j++)
#pragma unroll
      for (int m = 0; m < MT; m++) {
        const int n0 = 16 * m + g;
        float *b = rb + ((warp * RT + j) * rs + n0) * 8 + 2 * t4;
        if (n0 < rs) *(float2 *)b = make_float2(ca[j][m][0] + cb[j][m][0], ca[j][m][1] + cb[j][m][1]);
        if (n0 + 8 < rs) *(float2 *)(b + 64) = make_float2(ca[j][m][2] + cb[j][m][2], ca[j][m][3] + cb[j][m][3]);
      }
    __syncthreads();
    // element e < TT rs 8: tile j = e / (8 rs) of the group, row n = e / 8 % rs, output e % 8
    for (int e = threadIdx.x; e < TT * rs * 8; e += blockDim.x) {
      const int j = e / (8 * rs), n = (e >> 3) % rs, o = (grp * TT + j) * GM_TILE + (e & 7);
      if (n < nr && o < OC) {
        float acc[S];
#pragma unroll
        for (int sp = 0; sp < S; sp++) {
          acc[sp] = 0.0f;
#pragma unroll
          for (int k = 0; k < GV_WARPS; k++) acc[sp] += rb[((k * RT + j + sp) * rs + n) * 8 + (e & 7)];
        }
        if constexpr (MODE == GV_SWIGLU) {
          const float gt = rounded<T>(acc[0]), up = rounded<T>(acc[1]);
          stf(out + (long)n * F + o, gt / (1.0f + expf(-gt)) * up);
        } else {
          float v = acc[0] + (bias ? ldf(bias + o) : 0.0f);
          if (MODE == GV_RESID) v = rounded<T>(v) + ldf(res + (long)n * OC + o);
          if (MODE == GV_GELU) v = gv_gelu(rounded<T>(v));
          stf(out + (long)n * OC + o, v);
        }
      }
    }
  }
}

// ---- staged GEMV: a block's whole weight slice in shared memory before the kernel waits ----
// gemv_kernel loads its first weights into registers before pdl_wait; the registers cannot hold
// a whole layer's, so the rest streams after the wait, on the step's critical path. Here each
// block owns `rpb` consecutive outputs (their weight rows are one contiguous span; two for
// GV_SWIGLU: the gate rows and the up rows) and its first thread hands the span to the bulk copy
// engine (cp.async.bulk, completing on an mbarrier) at the kernel's start. The next kernel's
// blocks start as soon as this one triggers, so DRAM streams the following kernels' weights
// while this kernel and the kernel before are still running, and after the wait a block only
// reads its input rows and multiplies from shared memory. The arithmetic is gemv_kernel's
// (a warp per output; lane l sums the 16-byte chunks l, l + 32, ... in k order; the same
// butterfly and epilogue), so the outputs equal its bit for bit.
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// Copies `bytes` (a multiple of 16, 16-byte aligned both sides) from global src to shared dst;
// the completed bytes count against bar's expected transaction bytes.
__device__ __forceinline__ void bulk_to_smem(void *dst, const void *src, unsigned bytes,
                                             uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .pred p;\n"
               "W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra W;\n}" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
}

template <typename T, int N, int NORM, int MODE>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gemv_staged_kernel(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias,
                       const T *res, int nr, int IC, int OC, float eps, int vnorm, int rpb) {
  constexpr int S = MODE == GV_SWIGLU ? 2 : 1; // weight spans: the gate and up rows, or the rows
  extern __shared__ uint4 gv_smem[];
  __shared__ uint64_t bar;
  T *ws = (T *)gv_smem;                   // S spans of rpb rows of IC
  T *xs = ws + (size_t)S * rpb * IC;      // the N input rows
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nchunk = IC / 8;
  const int o0 = blockIdx.x * rpb, rows = min(OC - o0, rpb);
  if (threadIdx.x == 0) {
    const unsigned span = (unsigned)((size_t)rows * IC * sizeof(T));
    mbar_init(&bar, 1);
    mbar_expect(&bar, S * span);
    bulk_to_smem(ws, w + (size_t)o0 * IC, span, &bar);
    if (S == 2) bulk_to_smem(ws + (size_t)rpb * IC, w + (size_t)(OC + o0) * IC, span, &bar);
  }
  pdl_trigger();
  pdl_wait();
  gv_x_rows<T, N, NORM>(xs, inp, nw, nb, nr, IC, eps, vnorm);
  __syncthreads(); // xs, and the barrier's initialization, seen by every thread
  mbar_wait(&bar, 0);
  for (int r = warp; r < rows; r += GV_WARPS) {
    float acc[S][N];
#pragma unroll
    for (int sp = 0; sp < S; sp++)
#pragma unroll
      for (int n = 0; n < N; n++) acc[sp][n] = 0.0f;
    for (int c = lane; c < nchunk; c += 32) {
      float wf[S][8];
#pragma unroll
      for (int sp = 0; sp < S; sp++)
        cvt8<T>(*(const uint4 *)(ws + ((size_t)sp * rpb + r) * IC + (size_t)c * 8), wf[sp]);
#pragma unroll
      for (int n = 0; n < N; n++) {
        float xf[8];
        cvt8<T>(*(const uint4 *)(xs + (long)n * IC + (long)c * 8), xf);
#pragma unroll
        for (int sp = 0; sp < S; sp++)
#pragma unroll
          for (int e = 0; e < 8; e++) acc[sp][n] = fmaf(wf[sp][e], xf[e], acc[sp][n]);
      }
    }
#pragma unroll
    for (int sp = 0; sp < S; sp++)
#pragma unroll
      for (int n = 0; n < N; n++) acc[sp][n] = warp_sum(acc[sp][n]);
    const int o = o0 + r;
#pragma unroll
    for (int n = 0; n < N; n++) {
      if (lane != n || n >= nr) continue;
      if constexpr (MODE == GV_SWIGLU) {
        const float gt = rounded<T>(acc[0][n]), up = rounded<T>(acc[1][n]);
        stf(out + (long)n * OC + o, gt / (1.0f + expf(-gt)) * up);
      } else {
        float v = acc[0][n] + (bias ? ldf(bias + o) : 0.0f);
        if (MODE == GV_RESID) v = rounded<T>(v) + ldf(res + (long)n * OC + o);
        if (MODE == GV_GELU) v = gv_gelu(rounded<T>(v));
        stf(out + (long)n * OC + o, v);
      }
    }
  }
}

// A value written earlier in the same kernel by another block: read from L2 (not a stale L1 line).
template <typename T> __device__ __forceinline__ float ldcgf(const T *p) { return __ldcg(p); }
template <> __device__ __forceinline__ float ldcgf<bf16>(const bf16 *p) {
  return __bfloat162float(__ushort_as_bfloat16(__ldcg((const unsigned short *)p)));
}
template <> __device__ __forceinline__ float ldcgf<f16>(const f16 *p) {
  return __half2float(__ushort_as_half(__ldcg((const unsigned short *)p)));
}

// rope_head_vals in two parts, so that a caller with several heads can issue every head's loads
// before the first head's arithmetic: the head x and its norm weight nwt (when given) into v and
// g, lane l holding d = l + 32 j.
template <typename T, int J>
__device__ __forceinline__ void rope_load(float (&v)[J], float (&g)[J], const T *x, const T *nwt,
                                          int lane) {
#pragma unroll
  for (int j = 0; j < J; j++) {
    v[j] = ldcgf(x + lane + 32 * j);
    g[j] = nwt ? ldf(nwt + lane + 32 * j) : 0.0f;
  }
}
// The head's sum of squares over this lane's values (warp_sum makes the head's).
template <int J> __device__ __forceinline__ float rope_ss(const float (&v)[J]) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < J; j++) ss += v[j] * v[j];
  return ss;
}
// The arithmetic: v rms-normalized by g when `norm` (ss: the head's sum of squares, rounded as
// rmsnorm_fwd), then rotated by the row's angles: o[j], still to be rounded by the store.
template <typename T, int J>
__device__ __forceinline__ void rope_math(float (&o)[J], float (&v)[J], const float (&g)[J],
                                          bool norm, float ss, int p, float theta, float eps,
                                          int table, const float *cs_, const float *sn_, int lane) {
  constexpr int hd = 32 * J;
  if (norm) {
    const float r = 1.0f / sqrtf(ss / hd + eps);
#pragma unroll
    for (int j = 0; j < J; j++) v[j] = rounded<T>(v[j] * r * g[j]);
  }
#pragma unroll
  for (int j = 0; j < J / 2; j++) {
    const int i = lane + 32 * j; // pairs with i + hd/2, held at j + J/2
    float c, sn;
    if (table) {
      c = cs_[i];
      sn = sn_[i];
    } else {
      rope_cs(i, hd, p, theta, &c, &sn);
    }
    const float x1 = v[j], x2 = v[j + J / 2];
    o[j] = x1 * c - x2 * sn;
    o[j + J / 2] = x2 * c + x1 * sn;
  }
}

// Head x (hd values, lane holds d = lane + 32 j) rms-normalized by nwt when given (rounded, as
// rmsnorm_fwd) and rotated by the row's angles (rope_pos_kernel's formulas; cs / sn: the table
// when `table`): o[j], still to be rounded by the store. Warp-level.
template <typename T, int J>
__device__ __forceinline__ void rope_head_vals(float (&o)[J], const T *x, const T *nwt, int p,
                                               float theta, float eps, int table, const float *cs_,
                                               const float *sn_, int lane) {
  float v[J], g[J]; // the head and its norm weight, loaded together (one latency, not two)
  rope_load<T, J>(v, g, x, nwt, lane);
  const float ss = nwt ? warp_sum(rope_ss<J>(v)) : 0.0f;
  rope_math<T, J>(o, v, g, nwt != nullptr, ss, p, theta, eps, table, cs_, sn_, lane);
}

// qkv_rope_append_kernel's work on head h of row n (a warp): q / k heads rms-normalized (when
// given) and rotated, k and v appended to the cache at (s, p). cs / sn: the row's cos / sin table
// when `table`.
template <typename T, int J>
__device__ __forceinline__ void rope_head_warp(T *qkv, const T *raw, const T *qnw, const T *knw,
                                               T *kc, T *vc, long s, int p, int n, int h, int H,
                                               int KV, int max_T, float theta, float eps,
                                               int table, const float *cs_, const float *sn_,
                                               int lane) {
  constexpr int hd = 32 * J;
  const int nh = H + 2 * KV;
  const long W3 = (long)nh * hd;
  const T *x = raw + n * W3 + (long)h * hd;
  T *y = qkv + n * W3 + (long)h * hd;
  if (h >= H + KV) { // v head: copy
    T *dst = vc + ((s * KV + (h - H - KV)) * max_T + p) * (long)hd;
#pragma unroll
    for (int j = 0; j < J; j++) {
      const float v = ldcgf(x + lane + 32 * j);
      stf(dst + lane + 32 * j, v);
      if (y != x) stf(y + lane + 32 * j, v);
    }
    return;
  }
  float o[J];
  rope_head_vals<T, J>(o, x, h < H ? qnw : knw, p, theta, eps, table, cs_, sn_, lane);
  T *kdst = h >= H ? kc + ((s * KV + (h - H)) * max_T + p) * (long)hd : NULL;
#pragma unroll
  for (int j = 0; j < J; j++) {
    stf(y + lane + 32 * j, o[j]);
    if (kdst) stf(kdst + lane + 32 * j, o[j]);
  }
}

// qkv row n = raw row n with q and k heads rms-normalized by qnw / knw (when given), then
// rotated (rope_pos_fwd's angles); k and v heads appended to the cache at (slot[n], pos[n]).
// grid (N), one warp per head (q heads, k heads, v heads); lane holds d = lane + 32 j, j < J =
// hd / 32, so the rotation pairs d and d + hd/2 sit in one lane (J even).
template <typename T, int J>
__global__ void qkv_rope_append_kernel(T *qkv, const T *raw, const T *qnw, const T *knw, T *kc,
                                       T *vc, const int32_t *slot, const int32_t *pos, int H,
                                       int KV, int max_T, float theta, float eps,
                                       int table, const void *pf, size_t pfb) {
  l2_prefetch_slice(pf, pfb);
  pdl_trigger();
  constexpr int hd = 32 * J;
  const int lane = threadIdx.x & 31, n = blockIdx.x, nh = H + 2 * KV;
  // slot and pos were copied in before the step's first kernel, so they (and the cos / sin
  // table made from them) can be read while the kernel before is still finishing
  const long s = slot ? slot[n] : n;
  const int p = pos[n];
  // cos / sin of the row's angles, once for all heads (rope_pos_kernel's formulas)
  __shared__ float cs_[hd / 2], sn_[hd / 2];
  if (table) rope_table(cs_, sn_, hd, p, theta);
  pdl_wait();
  __syncthreads();
  for (int h = threadIdx.x >> 5; h < nh; h += blockDim.x >> 5)
    rope_head_warp<T, J>(qkv, raw, qnw, knw, kc, vc, s, p, n, h, H, KV, max_T, theta, eps, table,
                         cs_, sn_, lane);
}

// A split warp's part of qkv_rope_append for kv head kv of one row (rr: its raw qkv row, p its
// position): its G query heads (heads h0 .. h0 + G - 1 of the kv head's GT: the heads-split
// attention) rms-normalized (qn) and rotated into q[0 .. G-1] (shared memory, rounded to T as
// qkv_rope_append stores them); the warp whose keys k0 .. k0 + DEC_CHUNK - 1 include the newest
// (p) also makes that key's k (kn) and v, appends them (with h0 = 0) to the cache rows Kc,
// Vc (the kv head's, position 0) and puts them into its key registers kr / vr from q[G], q[G + 1].
// cs_ / sn_: the row's cos / sin table. Warp-level; attention_decode_rope_kernel and
// decode_layers_kernel's attention phase.
template <typename T, int LK, int G, int GT = G>
__device__ __forceinline__ void att_rope_split(T (*q)[8 * LK], uint4 (&kr)[DEC_CHUNK / (32 / LK)],
                                               uint4 (&vr)[DEC_CHUNK / (32 / LK)], const T *rr,
                                               const T *qn, const T *kn, T *Kc, T *Vc, int H,
                                               int KV, int kv, int k0, int p, float theta,
                                               float eps, const float *cs_, const float *sn_,
                                               int lane, int h0 = 0) {
  constexpr int hd = 8 * LK, J = hd / 32, KPL = 32 / LK, JK = DEC_CHUNK / KPL;
  const int ks = lane / LK, ch = lane % LK;
  const bool newest = k0 <= p && p < k0 + DEC_CHUNK; // the newest key is this split's
  // Every load first (the G query heads, their norm weight; the newest key's k head, its norm
  // weight and v head), then the arithmetic: one L2 latency for them all. Head by head, each
  // head's loads waited behind the shared-memory stores of the head before (a store through a
  // generic pointer may alias them): three latencies in a row.
  float v[G + 1][J], gq[J], gk[J], vv[J];
#pragma unroll
  for (int g = 0; g < G; g++)
    rope_load<T, J>(v[g], gq, rr + (long)(kv * GT + h0 + g) * hd, qn, lane);
  if (newest) {
    rope_load<T, J>(v[G], gk, rr + (long)(H + kv) * hd, kn, lane);
    const T *vsrc = rr + (long)(H + KV + kv) * hd;
#pragma unroll
    for (int j = 0; j < J; j++) vv[j] = ldcgf(vsrc + lane + 32 * j);
  }
  float ss[G + 1];
#pragma unroll
  for (int g = 0; g < G; g++) ss[g] = qn ? warp_sum(rope_ss<J>(v[g])) : 0.0f;
  ss[G] = newest && kn ? warp_sum(rope_ss<J>(v[G])) : 0.0f;
#pragma unroll
  for (int g = 0; g < G; g++) {
    float o[J];
    rope_math<T, J>(o, v[g], gq, qn != nullptr, ss[g], p, theta, eps, 1, cs_, sn_, lane);
#pragma unroll
    for (int j = 0; j < J; j++) stf(&q[g][lane + 32 * j], o[j]);
  }
  if (newest) {
    float o[J];
    rope_math<T, J>(o, v[G], gk, kn != nullptr, ss[G], p, theta, eps, 1, cs_, sn_, lane);
    T *kd = Kc + (long)p * hd, *vd = Vc + (long)p * hd;
#pragma unroll
    for (int j = 0; j < J; j++) {
      stf(&q[G][lane + 32 * j], o[j]);
      if (h0 == 0) stf(kd + lane + 32 * j, o[j]); // (the heads split: one warp of a split appends)
      stf(&q[G + 1][lane + 32 * j], vv[j]);
      if (h0 == 0) stf(vd + lane + 32 * j, vv[j]);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < JK; j++) {
      if (k0 + j * KPL + ks == p) {
        kr[j] = *(const uint4 *)(&q[G][ch * 8]);
        vr[j] = *(const uint4 *)(&q[G + 1][ch * 8]);
      }
    }
  }
  __syncwarp();
}

// The output projection that attention_decode_oproj adds to attention_decode_rope_kernel's
// cluster variant (ops.h): w (C, H*hd) and bias (C, or NULL) of the projection, res (N, C) the
// residual, out (N, C) = round(round(atty @ w^T + bias) + res) as matmul_add_fwd stores it;
// part (N, KV, C) fp32 and count (N, zero between launches) its scratch. w == NULL: no projection.
template <typename T> struct oproj_args {
  const T *w, *bias, *res;
  T *out;
  float *part;
  unsigned *count;
  int C;
};

// Block `r` of a cluster of `cs` owns output rows [j0, j1) = the r-th of cs equal spans of C.
__device__ __forceinline__ void oproj_span(int C, unsigned cs, unsigned r, int *j0, int *j1) {
  const int per = (C + (int)cs - 1) / (int)cs;
  *j0 = min(C, (int)r * per);
  *j1 = min(C, *j0 + per);
}

// Before the kernel waits: this block's rows of w, columns [kv*K, kv*K + K) (K = G * hd, the kv
// head's query heads), copied into shared memory wsm (rows x K) by the bulk copy engine, a
// 2K-byte row per copy, all completing on bar; thread 0 issues them. (Asked into L2 and loaded
// after the merge instead, the first GPU run took 1.28x the separate projection's step time: 48
// blocks cannot keep enough loads in flight.)
template <typename T, int K>
__device__ __forceinline__ void oproj_stage(const oproj_args<T> &op, int IC, int kv, unsigned cs,
                                            unsigned r, T *wsm, uint64_t *bar) {
  if (threadIdx.x != 0) return;
  int j0, j1;
  oproj_span(op.C, cs, r, &j0, &j1);
  mbar_init(bar, 1);
  mbar_expect(bar, (unsigned)((j1 - j0) * K * sizeof(T)));
  for (int j = j0; j < j1; j++)
    bulk_to_smem(wsm + (long)(j - j0) * K, op.w + (long)j * IC + (long)kv * K,
                 (unsigned)(K * sizeof(T)), bar);
}

#ifdef _CG_HAS_CLUSTER_GROUP
// After the merge: om (block 0's shared memory) holds the kv head's K merged outputs, rounded to T
// as attention_decode stores them. Each block of the cluster computes its rows' share of the
// projection over those K columns (a warp per row: lane l the 16-byte chunks l, l + 32, ..., in
// k order, then a butterfly sum) into part[n][kv]; the cluster that finishes row n last (a
// counter, reset by it) sums the KV shares of each output in kv order and stores out as
// matmul_add_fwd rounds it. wsm: the block's rows of w (oproj_stage), complete when bar is.
// Every block of the cluster calls it (it has cluster barriers).
template <typename T, int K>
__device__ __forceinline__ void oproj_tail(const oproj_args<T> &op, cooperative_groups::cluster_group &cl,
                                           const T *om, const T *wsm, uint64_t *bar, int n,
                                           int kv, int KV) {
  constexpr int CH = (K / 8 + 31) / 32; // 16-byte chunks a lane holds of a row
  constexpr int RB = 8;                  // rows whose loads go out together
  __shared__ __align__(16) T ol[K];
  __shared__ int lastc;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const unsigned r = cl.block_rank();
  int j0, j1;
  oproj_span(op.C, cl.num_blocks(), r, &j0, &j1);
  const T *o0 = cl.map_shared_rank(om, 0u);
  for (int i = threadIdx.x; i < K / 8; i += blockDim.x) ((uint4 *)ol)[i] = ((const uint4 *)o0)[i];
  cl.sync(); // every block has its copy of om (block 0 may leave after the next barrier)
  float xf[CH][8];
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const int ch = lane + 32 * c;
    if (ch < K / 8) cvt8<T>(((const uint4 *)ol)[ch], xf[c]);
    else
#pragma unroll
      for (int e = 0; e < 8; e++) xf[c][e] = 0.0f;
  }
  float *part = op.part + ((long)n * KV + kv) * op.C;
  mbar_wait(bar, 0);
  for (int jb = j0 + w; jb < j1; jb += nw * RB) {
    uint4 wv[RB][CH];
#pragma unroll
    for (int b = 0; b < RB; b++) {
      const int j = jb + b * nw;
#pragma unroll
      for (int c = 0; c < CH; c++) {
        const int ch = lane + 32 * c;
        wv[b][c] = j < j1 && ch < K / 8 ? ((const uint4 *)(wsm + (long)(j - j0) * K))[ch]
                                        : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < RB; b++) {
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < CH; c++) {
        float wf[8];
        cvt8<T>(wv[b][c], wf);
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(wf[e], xf[c][e], acc);
      }
      acc = warp_sum(acc);
      const int j = jb + b * nw;
      if (lane == 0 && j < j1) part[j] = acc;
    }
  }
  __threadfence();
  cl.sync(); // the cluster's share of row n stored and fenced
  if (r == 0 && threadIdx.x == 0) lastc = atomicAdd(op.count + n, 1u) == (unsigned)KV - 1;
  cl.sync();
  const int last = *cl.map_shared_rank(&lastc, 0u);
  cl.sync(); // block 0's flag read by every block
  if (!last) return;
  __threadfence();
  for (int j = j0 + (int)threadIdx.x; j < j1; j += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < KV; k++) acc += __ldcg(op.part + ((long)n * KV + k) * op.C + j);
    float v = acc + (op.bias ? ldf(op.bias + j) : 0.0f);
    v = rounded<T>(v) + ldf(op.res + (long)n * op.C + j);
    stf(op.out + (long)n * op.C + j, v);
  }
  if (r == 0 && threadIdx.x == 0) op.count[n] = 0;
}
#endif

// A split's keys cached by earlier steps (k0 .. len - 2 of the DEC_CHUNK from k0) into its key
// registers kr / vr (lane l: key k0 + j * (32 / LK) + l / LK, 16-byte chunk l % LK; zeros past
// them, and everywhere when !active). Kc / Vc: the (row, kv head)'s cache rows, position 0.
template <typename T, int LK>
__device__ __forceinline__ void att_old_keys(uint4 (&kr)[DEC_CHUNK / (32 / LK)],
                                             uint4 (&vr)[DEC_CHUNK / (32 / LK)], const T *Kc,
                                             const T *Vc, int k0, int len, bool active, int lane) {
  constexpr int hd = 8 * LK, KPL = 32 / LK, JK = DEC_CHUNK / KPL;
  const int ks = lane / LK, ch = lane % LK;
#pragma unroll
  for (int j = 0; j < JK; j++) {
    const int key = k0 + j * KPL + ks;
    const bool old_key = active && key < len - 1;
    kr[j] = old_key ? *(const uint4 *)(Kc + (long)key * hd + ch * 8) : make_uint4(0, 0, 0, 0);
    vr[j] = old_key ? *(const uint4 *)(Vc + (long)key * hd + ch * 8) : make_uint4(0, 0, 0, 0);
  }
}

// Block 0's merge of every query head of its kv head into out + g * hd, g < G, by warps w <
// DEC_WARPS, from split rows wherever they are: row(sp, g) points at split sp's (acc[hd], max, sum)
// row of head g. Two warps a head where the block has them (see att_cluster_merge).
template <typename T, int hd, int G, typename Row>
__device__ __forceinline__ void att_heads_merge(T *out, Row row, int used, int w, int lane) {
  constexpr int HP = DEC_WARPS >= 2 * G && hd % 64 == 0 ? 2 : 1;
  for (int t = w; t < G * HP; t += DEC_WARPS) {
    const int g = t / HP;
    auto ld = [&](int sp_, int i) { return row(sp_, g)[i]; };
    att_merge_core<T, hd, decltype(ld), HP>(out + (long)g * hd, ld, used, lane, t % HP);
  }
}

#ifdef _CG_HAS_CLUSTER_GROUP
// The cluster merge (block 0, after the barrier that follows the split math): warp w of block 0
// (w < DEC_WARPS) merges query heads of the kv head from the split rows ps[DEC_WARPS][G][hd + 4]
// of every block of the cluster (split sp: block sp / DEC_WARPS, warp sp % DEC_WARPS, read through
// distributed shared memory) into out + g * hd, g < G. Two warps a head where the block has them
// (each makes half the head's outputs: the merge's time is its load latency, and this halves each
// warp's loads): 1,485-1,486 against 1,476-1,478 tokens/s at batch 1 on the Qwen3-0.6B shape,
// batch 8 within 0.2%, the same ids (bench/results/call49_9c15eaa.txt).
template <typename T, int hd, int G>
__device__ __forceinline__ void att_cluster_merge(T *out, cooperative_groups::cluster_group &cl,
                                                  const float *ps, int used, int w, int lane) {
  att_heads_merge<T, hd, G>(out, [&](int sp_, int g) {
    return cl.map_shared_rank(ps, (unsigned)(sp_ / DEC_WARPS)) + ((sp_ % DEC_WARPS) * G + g) * (hd + 4);
  }, used, w, lane);
}
#endif

// The push variant's merge, by every warp of block 0 (NW of them), with every split's rows already
// in its shared memory (split-major: split s's head g at ps + (s * G + g) * (hd + 4)).
// att_merge_core's arithmetic in its order, so the same bits: NW / G warps a query head, each
// making an equal slice of its outputs (OPL adjacent ones a lane); each warp finds the head's
// factors itself (lane s: split s's max and sum; their max M by the butterfly; f = exp(m - M); L
// the butterfly sum of l * f), then a lane's outputs are fmaf(f, row value, a) over the splits in
// order (f by a shuffle from lane s), over L. No shared-memory factors and no block barrier: each
// warp's chain is a few dozen instructions, and its code a short loop. Call 171 (H100,
// bench/results/call171_*): +1.0 to +1.7% at batch 1 on the Qwen3-0.6B shape, batch 8 even,
// Llama-1B +0.1 to +0.5%; the merge 0.86 us from the rows' arrival to its end against 1.5 when one
// warp a head made the factors into shared memory and, after a block barrier, every thread made two
// outputs of different heads.
template <typename T, int hd, int G, int NW = DEC_WARPS>
__device__ __forceinline__ void att_local_merge(T *out, const float *ps, int used, int w, int lane) {
  static_assert(NW % G == 0, "a whole number of warps a query head");
  constexpr int PS = hd + 4, RS = G * PS;       // a split's G rows
  constexpr int WPH = NW / G, OW = hd / WPH;    // warps a head, outputs a warp
  constexpr int OPL = OW >= 32 ? OW / 32 : 1;   // adjacent outputs a lane
  static_assert(OPL == 1 || OPL == 2 || OPL == 4, "one, two or four outputs a lane");
  const int g = w / WPH, o0 = (w % WPH) * OW + lane * OPL; // the lane's first output of head g
  const bool has = lane * OPL < OW;
  const float *row = ps + g * PS;
  // used <= 8 * DEC_WARPS <= 32 (a cluster has at most 8 blocks): a lane a split
  float m0 = -INFINITY, l0 = 0.0f;
  if (lane < used) {
    m0 = row[lane * RS + hd];
    l0 = row[lane * RS + hd + 1];
  }
  float M = m0;
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  const float f = lane < used ? expf(m0 - M) : 0.0f;
  const float L = warp_sum(lane < used ? l0 * f : 0.0f);
  TL_PHASE(6);
  float a[OPL];
#pragma unroll
  for (int k = 0; k < OPL; k++) a[k] = 0.0f;
  const float *v = row + o0;
#pragma unroll 4
  for (int sp = 0; sp < used; sp++) {
    const float fs = __shfl_sync(0xffffffffu, f, sp);
    float x[OPL];
    if constexpr (OPL == 4) {
      const float4 t = *(const float4 *)(v + sp * RS);
      x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    } else if constexpr (OPL == 2) {
      const float2 t = *(const float2 *)(v + sp * RS);
      x[0] = t.x, x[1] = t.y;
    } else {
      x[0] = has ? v[sp * RS] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < OPL; k++) a[k] = fmaf(fs, x[k], a[k]);
  }
  TL_PHASE_AFTER(7, a[OPL - 1]);
  if (has) {
    T *dst = out + (long)g * hd + o0;
    if constexpr (OPL == 1) {
      stf(dst, a[0] / L);
    } else {
#pragma unroll
      for (int k = 0; k < OPL; k += 2) *(uint32_t *)(dst + k) = pack2<T>(a[k] / L, a[k + 1] / L);
    }
  }
  TL_PHASE(9);
}

// qkv_rope_append_kernel and attention_decode_vec_kernel in one kernel (attention_decode_rope):
// grid (ceil(splits / DEC_WARPS), KV, N) as the vec kernel. Each active split warp makes its G
// query heads' q norm + rope from raw itself (into its shared memory, rounded to T as
// qkv_rope_append stores them); the warp whose keys include the newest also that key's k norm +
// rope and v, appends them to the cache and uses them from shared memory; then the vec kernel's
// split math and merge by the last block of (row, kv head). The same values as the two kernels
// bit for bit (decode_layers_kernel's attention phase does the same), one launch fewer a layer;
// qkv itself is not written. Old keys' loads and the row's cos / sin table go out before
// griddepcontrol.wait.
// CL (the default on sm_90; CT_DECODE_CLUSTER=0 turns it off): the blocks of one (row, kv head) form a thread block cluster
// (at most 8: max_T <= 512); each split warp leaves its (acc, max, sum) rows in its own block's
// shared memory, a cluster barrier replaces the fence + counter + L2 round trips, and block 0 of
// the cluster merges reading the others' shared memory (distributed shared memory); a second
// barrier keeps the blocks resident until it has. Same arithmetic, so the same bits.
// OP (with CL; attention_decode_oproj): the merged heads stay in block 0's shared memory and the
// cluster goes on with the output projection (oproj_tail); out is not written.
// HS (with CL, launched only with the push; att_hs_on): the heads split, two warps a split where
// G >= 2, each with half the query heads (GW = G / 2 of them: the rope, scores, softmax and V sums
// of fewer heads a warp, so a shorter chain of dependent instructions), both loading the split's
// keys; blocks of 2 * DEC_WARPS warps, all of which make block 0's merge. A head's arithmetic is
// the same whichever warp makes it, so the same bits.
// (a measurement build: -DCT_ATT_MAXNREG=N caps its registers at N instead, __maxnreg__, which
// excludes __launch_bounds__: at 96 a heads-split block, 256 threads, fits beside two blocks of
// the 80-register qkv GEMV, 2 x 20,480 + 24,576 = 65,536 registers; slower, see Session 45)
// -DCT_ATT_HS_MAXNREG=N caps only the heads-split form with two warps a split (the batch-1
// form) at N or below, through its bounds: a maximum of 65,536 / (2 N) threads, in whole warps
// (ptxas rounds up to them), with two blocks a multiprocessor leaves at most N registers a
// thread (96 at N = 96: 320 threads), while the launch stays at 256 threads (__maxnreg__ on
// every form would change the others: ptxas then gives the batch-8 forms up to 219).
#ifdef CT_ATT_MAXNREG
#define ATT_BOUNDS(threads, minb) __maxnreg__(CT_ATT_MAXNREG)
#elif defined(CT_ATT_HS_MAXNREG)
#define ATT_BOUNDS(threads, minb) \
  __launch_bounds__((minb) == 2 ? 65536 / (2 * CT_ATT_HS_MAXNREG) / 32 * 32 : (threads), minb)
#else
#define ATT_BOUNDS(threads, minb) __launch_bounds__(threads, minb)
#endif
template <typename T, int LK, int G, bool CL = false, bool OP = false, bool HS = false>
__global__ void ATT_BOUNDS(DEC_WARPS * 32 * (HS && G > 1 ? 2 : 1), HS && G > 1 ? 2 : 0)
    attention_decode_rope_kernel(T *out, float *part, unsigned *count, const T *raw,
                                 const T *qnw, const T *knw, T *kc, T *vc, const int32_t *slot,
                                 const int32_t *pos, int H, int KV, int max_T, int splits,
                                 float scale, float theta, float eps, const void *pf,
                                 size_t pfb, oproj_args<T> op, int late) {
  static_assert(!OP || CL, "the output projection runs in the cluster variant only");
  static_assert(!HS || (CL && !OP), "the heads split runs in the cluster variant's push only");
  constexpr int hd = 8 * LK, KPL = 32 / LK, JK = DEC_CHUNK / KPL;
  // warps a split, query heads a warp, warps a block
  constexpr int WPS = HS && G > 1 ? 2 : 1, GW = G / WPS, NW = DEC_WARPS * WPS;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, ws = w / WPS, hg = w % WPS;
  const int sp = blockIdx.x * DEC_WARPS + ws, kv = blockIdx.y, n = blockIdx.z;
  __shared__ float cs_[hd / 2], sn_[hd / 2];
  __shared__ __align__(16) T qs[NW][GW + 2][hd]; // a warp's q heads, the newest k, v
  __shared__ __align__(16) float ps[CL ? DEC_WARPS : 1][G][hd + 4]; // CL: the splits' rows
  __shared__ __align__(16) T om[OP ? G * hd : 8];                    // OP: the merged heads
  __shared__ int last;
  // the split rows pushed to block 0 (att_push_on; HS always, known when compiled, so its code
  // holds no pull merge)
  const bool push = HS || (CL && !OP && (late & 4));
  const bool relax = CL && !OP && (late & 8); // the pull merge's 2nd barrier relaxed (att_relax_on)
  const bool pf_after = late & 2; // the L2 hint after the wait (CT_DECODE_PF_AFTER), not now
  late &= 1;
  if (!pf_after) l2_prefetch_slice(pf, pfb);
  TL_END_GUARD;
  if (late) tl_start();
  else pdl_trigger();
  const int p = pos[n], len = p + 1, k0 = sp * DEC_CHUNK;
  const bool active = sp < splits && k0 < len;
  const long s = slot ? slot[n] : n;
  T *Kc = kc + ((s * KV + kv) * max_T) * (long)hd, *Vc = vc + ((s * KV + kv) * max_T) * (long)hd;
  uint4 kr[JK], vr[JK];
  att_old_keys<T, LK>(kr, vr, Kc, Vc, k0, len, active, lane);
  rope_table(cs_, sn_, hd, p, theta); // qkv_rope_append_kernel's table
  extern __shared__ uint4 att_dyn[]; // OP: the block's rows of the projection (oproj_stage)
  __shared__ uint64_t obar;
  if constexpr (OP) oproj_stage<T, G * hd>(op, H * hd, kv, gridDim.x, blockIdx.x, (T *)att_dyn, &obar);
  // push: block 0 (the cluster's rank 0: a cluster spans the grid's x) expects the rows of the
  // `used` splits in att_dyn; its mbarrier is initialized before any block pushes (the cluster
  // barrier's first phase, arrived here and waited on after the wait)
  __shared__ uint64_t rbar;
  const int used = min(splits, (len + DEC_CHUNK - 1) / DEC_CHUNK);
  uint32_t pdst = 0, pbar = 0;
  if (push) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      mbar_init(&rbar, 1);
      mbar_expect(&rbar, (unsigned)(used * G * (hd + 2)) * 4u);
    }
    cluster_arrive_relaxed();
    pdst = cluster_addr(att_dyn, 0);
    pbar = cluster_addr(&rbar, 0);
  }
  pdl_wait();
  if (late) pdl_launch_dependents();
  if (pf_after) l2_prefetch_slice(pf, pfb);
  __syncthreads();
  if (push) cluster_wait();
  if (active) {
    T(*q)[hd] = qs[w];
    att_rope_split<T, LK, GW, G>(q, kr, vr, raw + (long)n * (H + 2 * KV) * hd, qnw, knw, Kc, Vc, H,
                                 KV, kv, k0, p, theta, eps, cs_, sn_, lane, hg * GW);
    TL_PHASE(0);
    att_split_math<T, LK, GW, true, HS>(part, &q[0][0], kr, vr, n, kv, sp, k0, len, H, splits, scale,
                                    lane, CL ? &ps[CL ? ws : 0][hg * GW][0] : nullptr, pdst, pbar,
                                    G, hg * GW);
    TL_PHASE(1);
  }
  if constexpr (CL) {
#ifdef _CG_HAS_CLUSTER_GROUP // sm_90 and up (the host launches CL only there: cluster_on)
    if (push) {
      // block 0 merges from its own shared memory once every row has arrived; the others stay
      // until then (the barrier's second phase), so no block leaves with its stores in flight
      if (blockIdx.x == 0) {
        mbar_wait(&rbar, 0);
        TL_PHASE(2);
        cluster_arrive_relaxed();
        att_local_merge<T, hd, G, NW>(out + (long)n * H * hd + (long)kv * G * hd,
                                      (const float *)att_dyn, used, w, lane);
        TL_PHASE(3);
      } else {
        cluster_arrive_relaxed();
      }
      cluster_wait();
      return;
    }
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); // every split's rows written, and visible to the cluster
    TL_PHASE(2);
    if (cl.block_rank() == 0)
      att_cluster_merge<T, hd, G>(OP ? &om[0] : out + (long)n * H * hd + (long)kv * G * hd, cl,
                                  &ps[0][0][0], used, w, lane);
    TL_PHASE(3);
    // block 0 has read every block's rows (and with OP written om). relax: only the reads matter
    // (block 0's merge consumed them before it arrives), so no release (cl.sync()'s is a GPU-scope
    // memory barrier, which also waits for block 0's output stores)
    if (relax) {
      cluster_arrive_relaxed();
      cluster_wait();
    } else {
      cl.sync();
    }
    if constexpr (OP) oproj_tail<T, G * hd>(op, cl, &om[0], (const T *)att_dyn, &obar, n, kv, KV);
#else
    __trap();
#endif
    return;
  }
  // the last block of (n, kv) merges (attention_decode_vec_kernel's)
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(count + (long)n * KV + kv, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int g = w; g < G; g += DEC_WARPS) att_merge_head<T, hd>(out, part, n, kv * G + g, H, splits, used, lane);
  if (threadIdx.x == 0) count[(long)n * KV + kv] = 0;
}

// norm_matmul_fwd (inp -> raw: rmsnorm, then the qkv projection) and attention_decode_rope as one
// kernel for one row (attention_decode_qkv, ops.h): grid (QA_CS, KV), a cluster of QA_CS blocks a
// kv head. Block r of kv head kv owns rows [r * rpb, (r + 1) * rpb) of the head's (G + 2) * hd
// projection rows (its G query heads, then its k head, then its v head: three spans of w); its
// first thread hands them to the bulk copy engine before the kernel waits, so they stream into
// shared memory while the kernel before (the last layer's down projection) runs. After the wait
// every block makes the normed input as gemv_kernel does (gv_x_rows), multiplies its rows with
// gemv_kernel's arithmetic (a warp a row; lane l sums the 16-byte chunks l, l + 32, ... in k
// order; the butterfly; + bias; rounded to T) and stores them into raw; after a cluster barrier
// the first DEC_WARPS warps of each block go on as attention_decode_rope_kernel's cluster variant
// (split sp = block * DEC_WARPS + warp). The same bits as the two kernels, one kernel boundary a
// layer fewer.
// STATUS (H200, Qwen3-0.6B shape, batch 1, the same ids both ways; bench/results/call66_2dbd9ad,
// call67_2dbd9ad, call68_2dbd9ad): slower, 1,373-1,379 against 1,475-1,485 tokens/s, so opt-in
// (CT_DECODE_QKV_ATT=1). The timeline shows why: its blocks (155 registers a thread, 141 KB of
// shared memory, clusters of 8) find no room beside the down projection's and gate/up's blocks, so
// they start ~4.4 us after the down projection is released, when the GPU has drained, and then
// stream 128 KB of weights each into 64 multiprocessors: ~11 us from its release to the output
// projection's, against 3.8 + 7.6 for the two kernels it replaces. Capping the gate/up GEMV at 48
// registers (so the kernels after it launch early) made every kernel start early and the step
// slower (1,383 tokens/s; 1,303 with this kernel), as did the staged GEMV (1,280; 1,302): a kernel
// that starts early with its weights in shared memory still takes 3-6 us after the kernel before
// completes (its input from L2, the norm, the stores, the grid's completion).
#define QA_CS 8    // blocks a cluster: room for QA_CS * DEC_WARPS splits (max_T <= 512)
#define QA_WARPS 8 // warps a block (the GEMV's); DEC_WARPS of them run attention's splits
template <typename T, int LK, int G>
__global__ void __launch_bounds__(QA_WARPS * 32, 1)
    attention_decode_qkv_kernel(T *out, T *raw, const T *inp, const T *nw, const T *w,
                                const T *bias, const T *qnw, const T *knw, T *kc, T *vc,
                                const int32_t *slot, const int32_t *pos, int IC, int H, int KV,
                                int max_T, int splits, int rpb, float scale, float theta,
                                float eps, int vn) {
#ifdef _CG_HAS_CLUSTER_GROUP // sm_90 and up (the host launches it only there: cluster_on)
  namespace cg = cooperative_groups;
  constexpr int hd = 8 * LK, KPL = 32 / LK, JK = DEC_CHUNK / KPL, RT = (G + 2) * hd;
  cg::cluster_group cl = cg::this_cluster();
  const int lane = threadIdx.x & 31, w8 = threadIdx.x >> 5, kv = blockIdx.y, n = 0;
  extern __shared__ uint4 qa_smem[];
  T *ws = (T *)qa_smem;               // the block's rpb projection rows
  T *xs = ws + (size_t)rpb * IC;      // the normed input
  T *nws = xs + IC;                   // the norm weight (vn == 2)
  __shared__ uint64_t bar;
  __shared__ float cs_[hd / 2], sn_[hd / 2];
  __shared__ __align__(16) T qs[DEC_WARPS][G + 2][hd];
  __shared__ __align__(16) float ps[DEC_WARPS][G][hd + 4];
  const int r0 = (int)blockIdx.x * rpb, rows = max(0, min(RT - r0, rpb));
  auto grow = [&](int i) -> long { // the head's projection row i: its row of w and raw
    return i < G * hd         ? (long)kv * G * hd + i
           : i < (G + 1) * hd ? (long)H * hd + (long)kv * hd + (i - G * hd)
                              : (long)(H + KV) * hd + (long)kv * hd + (i - (G + 1) * hd);
  };
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_expect(&bar, (unsigned)((size_t)rows * IC * sizeof(T)));
    for (int i = 0; i < rows;) { // a copy a contiguous piece: the spans end at G*hd and (G+1)*hd
      const int a = r0 + i, end = a < G * hd ? G * hd : a < (G + 1) * hd ? (G + 1) * hd : RT;
      const int m = min(rows - i, end - a);
      bulk_to_smem(ws + (size_t)i * IC, w + grow(a) * IC, (unsigned)((size_t)m * IC * sizeof(T)),
                   &bar);
      i += m;
    }
  }
  if (vn == 2) gv_norm_weight(nws, nw, IC);
  // attention's split of this warp, and its keys cached by earlier steps
  const int sp = (int)blockIdx.x * DEC_WARPS + w8;
  const int p = pos[n], len = p + 1, k0 = sp * DEC_CHUNK;
  const bool active = w8 < DEC_WARPS && sp < splits && k0 < len;
  const long s = slot ? slot[n] : n;
  T *Kc = kc + ((s * KV + kv) * max_T) * (long)hd, *Vc = vc + ((s * KV + kv) * max_T) * (long)hd;
  uint4 kr[JK], vr[JK];
  att_old_keys<T, LK>(kr, vr, Kc, Vc, k0, len, active, lane);
  rope_table(cs_, sn_, hd, p, theta);
  pdl_trigger();
  pdl_wait();
  gv_x_rows<T, 1, 1>(xs, inp, nw, NULL, 1, IC, eps, vn, vn == 2 ? nws : NULL);
  __syncthreads(); // xs, and the barrier's initialization, seen by every thread
  mbar_wait(&bar, 0);
  const int nchunk = IC / 8;
  for (int r = w8; r < rows; r += QA_WARPS) {
    float acc = 0.0f;
    for (int c = lane; c < nchunk; c += 32) {
      float wf[8], xf[8];
      cvt8<T>(*(const uint4 *)(ws + (size_t)r * IC + (size_t)c * 8), wf);
      cvt8<T>(*(const uint4 *)(xs + (size_t)c * 8), xf);
#pragma unroll
      for (int e = 0; e < 8; e++) acc = fmaf(wf[e], xf[e], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const long o = grow(r0 + r);
      stf(raw + o, acc + (bias ? ldf(bias + o) : 0.0f));
    }
  }
  __threadfence();
  cl.sync(); // the head's projection rows stored, and visible to the cluster
  TL_PHASE(0);
  if (active) {
    T(*q)[hd] = qs[w8];
    att_rope_split<T, LK, G>(q, kr, vr, raw, qnw, knw, Kc, Vc, H, KV, kv, k0, p, theta, eps, cs_,
                             sn_, lane);
    att_split_math<T, LK, G, true>(nullptr, &q[0][0], kr, vr, n, kv, sp, k0, len, H, splits,
                                   scale, lane, &ps[w8][0][0]);
  }
  TL_PHASE(1);
  cl.sync(); // every split's rows written, and visible to the cluster
  TL_PHASE(2);
  if (cl.block_rank() == 0 && w8 < DEC_WARPS)
    att_cluster_merge<T, hd, G>(out + (long)kv * G * hd, cl, &ps[0][0][0],
                                min(splits, (len + DEC_CHUNK - 1) / DEC_CHUNK), w8, lane);
  TL_PHASE(3);
  cl.sync(); // block 0 has read every block's rows
#else
  __trap();
#endif
}

// norm_matmul_fwd (inp -> raw) and attention_decode_rope for one row in one grid with no grid-wide
// wait between them (attention_decode_qkv's tail form, qkv_att_mode 2): the GEMV's blocks are
// grouped by kv head (BPG blocks a head own its G query heads' rows, its k head's and its v head's;
// gemv_kernel's one-task arithmetic, a warp R rows, the norm by gv_x_rows, so raw gets the same
// bits), and each block counts its head's arrivals when its rows are stored. The last tb arrivals
// of a head (tb = its splits over SPB, a block's splits) go on as attention: each loads its splits'
// cached keys, waits until the head's last block has arrived (a spin by one thread on the count:
// the blocks it waits for are already running or will start, since at most KV * (tb - 1) blocks
// spin and the host keeps that under the multiprocessors' count), then makes the heads-split
// attention's rope and split math (att_rope_split, att_split_math: the same bits), writes its rows
// to part, and the last of the tb blocks (a second count) merges them in split order (the bits of
// the cluster merge). Each head's attention starts when its own 32 blocks are done, not when the
// whole projection and a kernel boundary are, and overlaps the other heads' projection. Counters
// cnt[kv] and cnt[KV + kv] are zero between launches (the merging block resets them).
// STATUS (session 43, H100; the file comment's notes): ~19% slower at batch 1 on the Qwen3-0.6B
// shape than the two kernels it replaces, with the same bits and ids; opt-in.
#define QT_WARPS GV_WARPS
__device__ __forceinline__ unsigned ld_acquire32(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
template <typename T, int R, int U, int LK, int G>
__global__ void __launch_bounds__(QT_WARPS * 32, 2)
    qkv_att_tail_kernel(T *out, T *raw, const T *inp, const T *nw, const T *w, const T *bias,
                        const T *qnw, const T *knw, T *kc, T *vc, const int32_t *slot,
                        const int32_t *pos, float *part, unsigned *cnt, int IC, int H, int KV,
                        int max_T, int splits, float scale, float theta, float eps, int vn) {
  constexpr int hd = 8 * LK, KPL = 32 / LK, JK = DEC_CHUNK / KPL, RT = (G + 2) * hd;
  constexpr int BPG = RT / (QT_WARPS * R); // blocks a kv head
  constexpr int WPS = G > 1 ? 2 : 1, GW = G / WPS, SPB = QT_WARPS / WPS; // the heads split
  constexpr int MP = QT_WARPS / G < hd / 32 ? QT_WARPS / G : hd / 32;    // merge warps a head
  static_assert(hd % (QT_WARPS * R) == 0, "a block's rows lie in one head");
  extern __shared__ uint4 qt_smem[];
  T *xs = (T *)qt_smem;
  T *nws = vn == 2 ? xs + IC : NULL;
  __shared__ float cs_[hd / 2], sn_[hd / 2];
  __shared__ __align__(16) T qs[QT_WARPS][GW + 2][hd];
  __shared__ unsigned arrival;
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kv = (int)blockIdx.x / BPG, lr0 = ((int)blockIdx.x % BPG * QT_WARPS + warp) * R;
  auto grow = [&](int i) -> long { // the head's projection row i: its row of w and raw
    return i < G * hd         ? (long)kv * G * hd + i
           : i < (G + 1) * hd ? (long)H * hd + (long)kv * hd + (i - G * hd)
                              : (long)(H + KV) * hd + (long)kv * hd + (i - (G + 1) * hd);
  };
  const int nchunk = IC / 8;
  uint4 wv[R][U];
#pragma unroll
  for (int rr = 0; rr < R; rr++) {
    const T *wr = w + grow(lr0 + rr) * IC;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = u * 32 + lane;
      wv[rr][u] = c < nchunk ? ld_stream(wr + (long)c * 8) : make_uint4(0, 0, 0, 0);
    }
  }
  if (nws) gv_norm_weight(nws, nw, IC);
  pdl_trigger();
  pdl_wait();
  gv_x_rows<T, 1, GV_RMS>(xs, inp, nw, NULL, 1, IC, eps, vn, nws);
  __syncthreads();
  float acc[R];
#pragma unroll
  for (int rr = 0; rr < R; rr++) acc[rr] = 0.0f;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int c = u * 32 + lane;
    if (c < nchunk) {
      float wf[R][8], xf[8];
#pragma unroll
      for (int rr = 0; rr < R; rr++) cvt8<T>(wv[rr][u], wf[rr]);
      cvt8<T>(*(const uint4 *)(xs + (long)c * 8), xf);
#pragma unroll
      for (int rr = 0; rr < R; rr++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[rr] = fmaf(wf[rr][e], xf[e], acc[rr]);
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; rr++) acc[rr] = warp_sum(acc[rr]);
  if (lane == 0) {
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
      const long o = grow(lr0 + rr);
      stf(raw + o, acc[rr] + (bias ? ldf(bias + o) : 0.0f));
    }
  }
  // the head's arrivals: the last tb blocks go on as its attention
  const int p = pos[0], len = p + 1;
  const int used = min(splits, (len + DEC_CHUNK - 1) / DEC_CHUNK), tb = (used + SPB - 1) / SPB;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) arrival = atomicAdd(cnt + kv, 1u);
  __syncthreads();
  const int a = (int)arrival - (BPG - tb); // this block's place among the attention blocks
  if (a < 0) return;
  const int ws = warp / WPS, hg = warp % WPS, sp = a * SPB + ws, k0 = sp * DEC_CHUNK;
  const bool active = sp < used;
  const long s = slot ? slot[0] : 0;
  T *Kc = kc + ((s * KV + kv) * max_T) * (long)hd, *Vc = vc + ((s * KV + kv) * max_T) * (long)hd;
  uint4 kr[JK], vr[JK];
  att_old_keys<T, LK>(kr, vr, Kc, Vc, k0, len, active, lane);
  rope_table(cs_, sn_, hd, p, theta);
  if (threadIdx.x == 0)
    while (ld_acquire32(cnt + kv) < (unsigned)BPG) __nanosleep(32);
  __syncthreads(); // the head's raw rows stored (the count's release) and the table made
  if (active) {
    T(*q)[hd] = qs[warp];
    att_rope_split<T, LK, GW, G>(q, kr, vr, raw, qnw, knw, Kc, Vc, H, KV, kv, k0, p, theta, eps,
                                 cs_, sn_, lane, hg * GW);
    att_split_math<T, LK, GW, true>(part, &q[0][0], kr, vr, 0, kv, sp, k0, len, H, splits, scale,
                                    lane, nullptr, 0, 0, G, hg * GW);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(cnt + KV + kv, 1u) == (unsigned)tb - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp < G * MP) {
    const int g = warp / MP, h = kv * G + g;
    const float *ph = part + (long)h * splits * (hd + 4);
    auto ldp = [&](int s_, int i) { return __ldcg(ph + (long)s_ * (hd + 4) + i); };
    att_merge_core<T, hd, decltype(ldp), MP>(out + (long)h * hd, ldp, used, lane, warp % MP);
  }
  if (threadIdx.x == 0) {
    cnt[kv] = 0;
    cnt[KV + kv] = 0;
  }
}

// argmax over many blocks: grid (B, N); block b scans a slice of row n, writes its (value,
// index), and the last block of the row (a counter, reset by it) takes the best of the B. Ties
// go to the lowest index, as argmax_rows_kernel.
#define AM_THREADS 256
#define AM_MAX_BLOCKS 64 // blocks a row (cu_argmax_advance's B)
// VEC (16-bit T, the row 16-byte aligned: Vp % 8 == 0): each block's slice starts at a multiple
// of 8 and is read 16 bytes at a time, all of a thread's loads in flight at once (a thread's
// strided 2-byte loads went out a few at a time). A thread still compares its values in index
// order and argmax_take breaks ties to the lowest index, so the id is the same either way.
template <typename T, bool VEC>
__global__ void __launch_bounds__(AM_THREADS)
    argmax_split_kernel(int32_t *out, int32_t *tok, int32_t *pos, int32_t *hid, float *pv, int *pi,
                        unsigned *count, const T *logits, int V, int Vp) {
  pdl_trigger();
#ifdef CT_DECODE_TIMELINE
  if (tl_block0()) tl_am_slot = tl_slot();
#endif
  pdl_wait();
  const int n = blockIdx.y, B = gridDim.x, b = blockIdx.x;
  const T *r = logits + (long)n * Vp;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  if constexpr (VEC) { // 16-byte loads of 8 values, a round's issued before its compares
    const int per = ((V + B - 1) / B + 7) & ~7, lo = b * per, hi = min(V, lo + per);
    constexpr int U = 2; // chunks a thread a round: a block's slice (<= 2,376 values) in one
    for (int i0 = lo + 8 * threadIdx.x; i0 < hi; i0 += 8 * U * AM_THREADS) {
      uint4 c[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int i = i0 + 8 * u * AM_THREADS;
        c[u] = i < hi ? __ldcg((const uint4 *)(r + i)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int i = i0 + 8 * u * AM_THREADS;
        float f[8];
        cvt8<T>(c[u], f);
#pragma unroll
        for (int e = 0; e < 8; e++)
          if (i + e < hi && f[e] > bv) { bv = f[e]; bi = i + e; }
      }
    }
  } else {
    const int per = (V + B - 1) / B, lo = b * per, hi = min(V, lo + per);
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const float v = ldf(r + i);
      if (v > bv) { bv = v; bi = i; }
    }
  }
  argmax_warp(bv, bi);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (!argmax_block_partial<AM_THREADS / 32>(bv, bi, pv + (long)n * B + b, pi + (long)n * B + b,
                                             count + n, (unsigned)B) ||
      w)
    return;
  // the last block's first warp merges the blocks' partials
  argmax_partials<AM_MAX_BLOCKS / 32>(pv + (long)n * B, pi + (long)n * B, B, lane, bv, bi);
  if (lane) return;
  argmax_put(out, tok, pos, hid, gridDim.y, n, bi == 0x7fffffff ? 0 : bi);
  count[n] = 0;
#ifdef CT_DECODE_TIMELINE
  if (n == 0) tl_am[*(volatile unsigned *)&tl_am_slot] = tl_now();
#endif
}

// ---------------------------------------------------------------------------------------------
// launchers

template <typename T>
void cu_embed_pos_fwd(void *out, const int32_t *tok, const int32_t *pos, const void *wte,
                      const void *wpe, int N, int C) {
  if (N <= 0 || C <= 0) return;
  launch("embed_pos_fwd", "embed_pos_kernel", embed_pos_kernel<T>, blocks_for((size_t)N * C, 256),
         256, 0, (T *)out, tok, pos, (const T *)wte, (const T *)wpe, (long)N, C);
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

// The split buffer of each device (split_scratch, a grow_scratch buffer): its first
// SPLIT_COUNT_BYTES hold the merge counters of attention_decode_vec_kernel (zero between
// launches), the rest the split results.
#define SPLIT_COUNT_BYTES 65536
#define ARGMAX_MAX_ROWS 1024 // argmax_split_kernel's counters: the last 4 KB of the 64 KB
// A per-device scratch buffer that only grows (at least twofold, so what is kept stays under
// twice the largest) and is never freed: graphs captured earlier (smaller batches) still write
// to the old one. It never grows during a capture: NULL then, reported as
// an error of `op` unless `quiet` (a caller with a plain path to take). A new buffer's first
// `zero` bytes are set to zero.
struct grow_buf {
  float *p;
  size_t bytes;
};
float *grow_scratch(grow_buf (&bufs)[16], size_t bytes, size_t zero, const char *op, bool quiet) {
  int dev = 0;
  if (quiet ? cudaGetDevice(&dev) != cudaSuccess : !CKD(op, cudaGetDevice(&dev))) {
    cudaGetLastError();
    return NULL;
  }
  if (dev < 0 || dev >= 16) return NULL;
  grow_buf *b = &bufs[dev];
  if (bytes <= b->bytes) return b->p;
  if (capture_status() != cudaStreamCaptureStatusNone) {
    if (!quiet)
      ct_cuda_report(op, "scratch buffer", "would grow during graph capture (run one uncaptured"
                     " step of this shape first)", __FILE__, __LINE__);
    return NULL;
  }
  if (bytes < 2 * b->bytes) bytes = 2 * b->bytes;
  float *p = NULL;
  if (quiet ? cudaMalloc((void **)&p, bytes) != cudaSuccess : !CKD(op, cudaMalloc((void **)&p, bytes))) {
    cudaGetLastError();
    return NULL;
  }
  if (zero && !CKD(op, cudaMemsetAsync(p, 0, zero, stream()))) return NULL;
  b->p = p;
  b->bytes = bytes;
  return p;
}

grow_buf split_bufs[16];
float *split_scratch(size_t bytes) {
  return grow_scratch(split_bufs, bytes, SPLIT_COUNT_BYTES, "attention_decode", false);
}

// ---- decode_layers: a batch-1 decode step's layers in one persistent kernel ----
// One block per multiprocessor (DL_WARPS warps, all resident: launched without programmatic
// dependent launch, so the kernel before has finished and the one after waits for this one),
// phases separated by a grid-wide barrier (one release-add a block on a counter that only grows).
// Five phases a layer, with infer_layer_fused's ops' arithmetic except attention's merge order:
//   qkv GEMV (rms norm of x in every block)
//   attention: ceil(splits / DL_WARPS) blocks a kv head, a warp a 16-key split; each makes its
//     query heads' q norm + rope, the warp whose keys hold the newest also that key's k norm +
//     rope and v (appended to the cache), the split math (the cluster kernel's), then the block
//     merges its splits into one partial a query head (the keys cached by earlier steps are
//     loaded before the qkv phase)
//   o_proj + residual, each block first merging every head's partials into its input row
//   norm + gate/up + SwiGLU | down + residual
// Each block owns a contiguous span of every GEMV's output rows, and their weight rows stream
// into a ring in its shared memory (DL_RING bytes, the bulk copy engine) up to `ahead` phases
// ahead (CT_DL_AHEAD, default 2); a phase reads its weights from shared memory. The norm weights
// sit in shared memory too, each layer's copied in by the barrier after its last use in the layer
// before. Activations written by other blocks are read with ld.cg (never a stale L1 line). Its
// values differ from the per-layer kernels' in the last bits (the attention merge goes in two
// levels); a CUDA graph's replay equals the uncaptured step bit for bit (test_decode_layers).
// STATUS (H200): slower than the per-layer kernels, so opt-in (CT_DECODE_PERSIST=1).
// - 2026-11-30, first two versions (weights loaded into registers at each phase, L2 prefetch two
//   phases ahead): 804 and 858 against 1,181 / 1,171 tokens/s at batch 1 on the Qwen3-0.6B shape
//   (gpu_decode_persist_2026-11-30_H200_19a67d2.txt, gpu_next_decode_2026-11-30_2xH200_cc33bec.txt).
// - 2026-12-01, third version (six phases: a merge phase of its own; the norm weights read from
//   DRAM in each phase; bit-identical to the per-layer kernels): 1,019 against 1,484 (128-token
//   prompt) and 898 against 1,172 (1,000), bench/results/call59_persist8.txt. Its timeline (a
//   -DCT_DL_TIMES build prints each phase's events, min / mean / max over the blocks, at exit):
//   ~32 us a layer; without the weight copies still ~25.
// - 2026-12-02, this version (five phases, norm weights in shared memory, several outputs a warp
//   at once): 1,212 tokens/s with 2 phases ahead (1,174 with 3, 1,167 with 4) against 1,481 for
//   the per-layer kernels at a 128-token prompt; 1,109 against 1,175 at 1,000
//   (bench/results/call80_2026-12-02_H200/). Its timeline (call82_r.txt): ~27 us a layer; the
//   qkv phase 2-3.5 us, the barrier after it ~2 us from the last arrival to the first release
//   (~1 us without weight streaming, call 59), attention's blocks 4.6 us, the partials' merge
//   before o_proj 2.3, gate/up and down 2-2.5 each, every barrier 1-2 us. With the weight ring
//   and the other SMs' copies in flight, each L2 round trip and barrier costs about twice its
//   idle latency, and the phases' chains are one or two round trips each: the per-layer
//   kernels' 21.4 us a layer stays ahead.
#define DL_WARPS 8
#define DL_MAX_LAYERS 96
#define DL_MAX_KV 32
#define DL_MAX_BPH 16 // attention blocks a kv head (DL_WARPS splits each): max_T <= 2048
#define DL_RING (200 * 1024) // bytes of weight ring (dynamic shared memory) a block
struct dl_args {
  void *x, *res2, *raw, *qkv, *atty, *act;
  float *part;
  unsigned long long *bar; // the grid barrier: [0] the counter, [1] the next launch's base
  const int32_t *slot, *pos;
  int nl, C, H, KV, hd, F, max_T, splits;
  int ahead; // GEMV phases whose weights may be in flight or waiting at once (1 .. DL_NBAR)
  float theta, eps, scale;
  ct_decode_layer L[DL_MAX_LAYERS];
};

__device__ __forceinline__ unsigned long long ld_acquire64(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The grid barrier: a 64-bit arrival counter that only grows (dl_args.bar[0]). A
// block's thread 0 adds 1 with release semantics (no reply to wait for) and spins until the
// counter reaches base + k * gridDim.x for the k-th barrier of this launch, base being the count
// when the launch began; one atomic a block and no reset, where a count-and-reset barrier costs
// the last block a second round trip. The launch's block 0 leaves the next launch's base behind
// once every block has passed the last barrier (so every block has read this launch's base).
__device__ __forceinline__ void dl_arrive(unsigned long long *ctr) {
  asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(ctr) : "memory");
}
__device__ __forceinline__ void dl_await(const unsigned long long *ctr, unsigned long long target) {
  while (ld_acquire64(ctr) < target) {
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// Output rows [*r0, *r0 + n) of OC are block b's (of nb): equal spans of ceil(OC / nb), the last
// ones shorter or empty. Returns n.
__device__ __forceinline__ int dl_rows(int OC, int b, int nb, int *r0) {
  const int per = (OC + nb - 1) / nb;
  *r0 = b * per;
  const int e = min(OC, *r0 + per);
  return e > *r0 ? e - *r0 : 0;
}

// The weight ring: every GEMV phase's slice of this block's weight rows is copied into shared
// memory by the bulk copy engine (cp.async.bulk) phases ahead of its use, as far as the ring
// (DL_RING bytes) holds; thread 0 issues and keeps the books. Phase j = 4 * layer + {0 qkv,
// 1 o_proj, 2 gate/up, 3 down}; its slice sits at a ring offset that does not wrap (a tail too
// short for it is skipped) and completes on mbarrier j % 4 (so at most four are in flight).
#define DL_NBAR 4
struct dl_ring_t {
  unsigned long long vbeg[DL_NBAR]; // virtual start (bytes since the launch began) of phase j
  unsigned long long vhead;         // the virtual end of the last issued phase
  int issued, consumed;             // phases issued / consumed so far
};

// Phase j's weight span(s) for this block: rows of its GEMV's weight matrix (gate rows then up
// rows for gate/up), as (source, bytes) pairs; returns the block's row count.
template <typename T>
__device__ __forceinline__ int dl_span(const dl_args &a, int j, const char **s1, unsigned *b1,
                                       const char **s2, unsigned *b2) {
  const ct_decode_layer &Ly = a.L[j >> 2];
  const int W = (a.H + 2 * a.KV) * a.hd;
  int OC, IC, r0;
  const T *w;
  switch (j & 3) {
  case 0: OC = W, IC = a.C, w = (const T *)Ly.qkv_w; break;
  case 1: OC = a.C, IC = a.H * a.hd, w = (const T *)Ly.o_w; break;
  case 2: OC = a.F, IC = a.C, w = (const T *)Ly.fc_w; break;
  default: OC = a.C, IC = a.F, w = (const T *)Ly.proj_w; break;
  }
  const int n = dl_rows(OC, blockIdx.x, gridDim.x, &r0);
  *s1 = (const char *)(w + (long)r0 * IC);
  *b1 = (unsigned)((size_t)n * IC * sizeof(T));
  *s2 = (j & 3) == 2 ? (const char *)(w + (long)(OC + r0) * IC) : NULL;
  *b2 = (j & 3) == 2 ? *b1 : 0;
  return n;
}

// Issue the next phases' copies while they fit: thread 0 hands each span to the bulk copy
// engine, completing on the phase's mbarrier. Every thread keeps the same books (so every thread
// knows where a phase's slice is). Copying with cp.async from every thread instead (16-byte
// pieces, a commit group a phase) measured the same (bench/results/call55_persist4.txt).
template <typename T>
__device__ __forceinline__ void dl_issue(const dl_args &a, dl_ring_t &r, char *ring, uint64_t *mb) {
  const int nph = 4 * a.nl;
  bool fenced = false;
  while (r.issued < nph && r.issued - r.consumed < a.ahead) {
    const char *s1, *s2;
    unsigned b1, b2;
    dl_span<T>(a, r.issued, &s1, &b1, &s2, &b2);
    const unsigned s = b1 + b2;
    unsigned long long v = r.vhead;
    if (v % DL_RING + s > DL_RING) v += DL_RING - v % DL_RING;
    const unsigned long long oldest = r.consumed < r.issued ? r.vbeg[r.consumed % DL_NBAR] : v;
    if (v + s - oldest > DL_RING) break;
    const int k = r.issued % DL_NBAR;
    r.vbeg[k] = v;
    r.vhead = v + s;
    const unsigned off = (unsigned)(v % DL_RING);
    if (threadIdx.x == 0) {
      if (!fenced) { // the ring's bytes were read by this block's threads (generic proxy)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
        fenced = true;
      }
      mbar_expect(mb + k, s);
      if (b1) bulk_to_smem(ring + off, s1, b1, mb + k);
      if (b2) bulk_to_smem(ring + off + b1, s2, b2, mb + k);
    }
    r.issued++;
  }
}

// The GEMV input of one row into shared memory xs4 (IC / 8 16-byte chunks): inp itself, or with
// NORM its rms norm by nws (the norm weight, already in shared memory): warp 0 holds the row in
// registers (one L2 round trip), sums its squares by 16-byte chunks as gemv_kernel does and
// writes the normed row.
template <typename T, int U, int NORM>
__device__ __forceinline__ void dl_x(uint4 *xs4, const T *inp, const T *nws, int IC, float eps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nchunk = IC / 8;
  const uint4 *x4 = (const uint4 *)inp;
  if constexpr (NORM) {
    if (warp == 0) {
      uint4 xr[U];
      float ss = 0.0f;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = u * 32 + lane;
        xr[u] = c < nchunk ? __ldcg(x4 + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (u * 32 + lane < nchunk) {
          float v[8];
          cvt8<T>(xr[u], v);
#pragma unroll
          for (int e = 0; e < 8; e++) ss = fmaf(v[e], v[e], ss);
        }
      }
      const float r = 1.0f / sqrtf(warp_sum(ss) / IC + eps);
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = u * 32 + lane;
        if (c < nchunk) {
          float v[8], g[8], y[8];
          cvt8<T>(xr[u], v);
          cvt8<T>(*(const uint4 *)(nws + (long)c * 8), g);
#pragma unroll
          for (int e = 0; e < 8; e++) y[e] = v[e] * r * g[e];
          xs4[c] = pack8<T>(y);
        }
      }
    }
  } else {
    for (int c = threadIdx.x; c < nchunk; c += blockDim.x) xs4[c] = __ldcg(x4 + c);
  }
  __syncthreads();
}

// One GEMV phase's rows [r0, r0 + n) for one row of input (xs4, shared memory) from this block's
// weight rows in shared memory (ws; for GV_SWIGLU the n gate rows, then the n up rows):
// gemv_kernel's arithmetic (lane l sums the 16-byte chunks l, l + 32, ... in k order, a
// butterfly sum, its epilogue), RB outputs (gate/up pairs) a warp at once so their dependent
// multiply-add chains overlap.
template <typename T, int U, int MODE, int RB>
__device__ __forceinline__ void dl_rows(T *out, const uint4 *ws, const uint4 *xs4, int r0, int n,
                                        const T *bias, const T *res, int IC) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nchunk = IC / 8;
  constexpr int RR = MODE == GV_SWIGLU ? 2 : 1;
  for (int i0 = warp * RB; i0 < n; i0 += DL_WARPS * RB) {
    float acc[RB][RR];
#pragma unroll
    for (int b = 0; b < RB; b++)
#pragma unroll
      for (int rr = 0; rr < RR; rr++) acc[b][rr] = 0.0f;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = u * 32 + lane;
      if (c < nchunk) {
        float xf[8];
        cvt8<T>(xs4[c], xf);
#pragma unroll
        for (int b = 0; b < RB; b++) {
          const int i = min(i0 + b, n - 1); // past the block's rows: the last again, not stored
#pragma unroll
          for (int rr = 0; rr < RR; rr++) {
            float wf[8];
            cvt8<T>(ws[(long)(i + rr * n) * nchunk + c], wf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[b][rr] = fmaf(wf[e], xf[e], acc[b][rr]);
          }
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int b = 0; b < RB; b++)
#pragma unroll
        for (int rr = 0; rr < RR; rr++) acc[b][rr] += __shfl_xor_sync(0xffffffffu, acc[b][rr], o);
#pragma unroll
    for (int b = 0; b < RB; b++) {
      if (lane != b || i0 + b >= n) continue;
      const int o = r0 + i0 + b;
      if constexpr (MODE == GV_SWIGLU) {
        const float gt = rounded<T>(acc[b][0]), up = rounded<T>(acc[b][1]);
        stf(out + o, gt / (1.0f + expf(-gt)) * up);
      } else {
        float v = acc[b][0] + (bias ? ldf(bias + o) : 0.0f);
        if (MODE == GV_RESID) v = rounded<T>(v) + ldcgf(res + o);
        stf(out + o, v);
      }
    }
  }
}

// A layer's norm weights into shared memory (cp.async, 16 bytes a thread at a time; nothing for a
// NULL source): n values of src at dst.
template <typename T>
__device__ __forceinline__ void dl_norm_copy(T *dst, const void *src, int n) {
  if (!src) return;
  for (int c = threadIdx.x; c < n / 8; c += blockDim.x)
    cp_async16(dst + (long)c * 8, (const T *)src + (long)c * 8);
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_prev() { // every group but the newest complete
  asm volatile("cp.async.wait_group 1;" ::: "memory");
}

#ifdef CT_DL_TIMES
// A measurement compiled in on request (-DCT_DL_TIMES): thread 0 of every block of
// decode_layers_kernel notes %globaltimer at each phase's events of every layer (the last launch's
// stay); ct_cuda_decode_timeline prints them.
#define DL_EV 16
__device__ unsigned long long dl_tm[256][DL_MAX_LAYERS][DL_EV];
__device__ int dl_tm_nl;
#define DLT(l, ev)                                                                   \
  do {                                                                               \
    if (threadIdx.x == 0 && blockIdx.x < 256) {                                      \
      unsigned long long t_;                                                         \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                         \
      dl_tm[blockIdx.x][l][ev] = t_;                                                 \
    }                                                                                \
  } while (0)
#else
#define DLT(l, ev) \
  do {             \
  } while (0)
#endif

// UQ: 16-byte chunks per lane for the C-wide inputs (qkv, gate/up); UR: for the o_proj and down
// inputs (H * hd and F wide; chunks past the row are not loaded). Dynamic shared memory: the
// weight ring (DL_RING bytes), then the norm weights (ln1 and ln2: C each, q and k norm: hd each).
template <typename T, int LK, int G, int UQ, int UR>
__global__ void __launch_bounds__(DL_WARPS * 32, 1)
    decode_layers_kernel(const __grid_constant__ dl_args a) {
  constexpr int hd = 8 * LK, KPL = 32 / LK, JK = DEC_CHUNK / KPL, PS = hd + 4;
  constexpr int XS = (UR > UQ ? UR : UQ) * 32 * 16, PSB = DL_WARPS * G * PS * 4;
  extern __shared__ __align__(128) char dl_ring[];
  // the GEMV input (xs4) and, in the attention phase, the splits' rows (ps): never both at once
  __shared__ __align__(16) char scr[XS > PSB ? XS : PSB];
  uint4 *xs4 = (uint4 *)scr;
  float(*ps)[G][PS] = (float(*)[G][PS])scr;
  __shared__ float cs_[hd / 2], sn_[hd / 2];
  __shared__ __align__(16) T qs[DL_WARPS][G + 2][hd]; // a warp's q heads, then the newest k, v
  __shared__ __align__(8) uint64_t mb[DL_NBAR];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int H = a.H, KV = a.KV, C = a.C, F = a.F, nh = H + 2 * KV, W = nh * hd;
  T *nws1 = (T *)(dl_ring + DL_RING), *nws2 = nws1 + C, *qns = nws2 + C, *kns = qns + hd;
  const long s = a.slot ? a.slot[0] : 0;
  const int p = a.pos[0], len = p + 1, nsp = (len + DEC_CHUNK - 1) / DEC_CHUNK;
  // attention: BPH blocks a kv head, each DL_WARPS splits (the host checks KV * BPH <= blocks)
  const int BPH = (nsp + DL_WARPS - 1) / DL_WARPS, A = KV * BPH;
  const int akv = blockIdx.x / BPH, ar = blockIdx.x % BPH, asp = ar * DL_WARPS + warp;
  const bool att_block = (int)blockIdx.x < A, att_warp = att_block && asp < nsp;
  const int nact = att_block ? min(DL_WARPS, nsp - ar * DL_WARPS) : 0;
  T *x = (T *)a.x, *res2 = (T *)a.res2, *raw = (T *)a.raw, *act = (T *)a.act;
  unsigned long long *ctr = a.bar;
  dl_ring_t ring = {};         // the weight ring's books (every thread keeps the same)
  unsigned long long base = 0; // thread 0's: the counter when this launch began
  int nbar = 0;                // barriers passed
  if (threadIdx.x == 0) base = ((volatile unsigned long long *)ctr)[1];
  if (threadIdx.x == 0)
    for (int k = 0; k < DL_NBAR; k++) mbar_init(mb + k, 1);
  dl_issue<T>(a, ring, dl_ring, mb);
  // the first layer's norm weights; later layers' are copied in by the barriers after their last
  // use (cp.async groups, one a barrier, each complete two barriers later)
  dl_norm_copy<T>(nws1, a.L[0].ln1_w, C);
  dl_norm_copy<T>(nws2, a.L[0].ln2_w, C);
  dl_norm_copy<T>(qns, a.L[0].q_norm, hd);
  dl_norm_copy<T>(kns, a.L[0].k_norm, hd);
  cp_async_commit();
  rope_table(cs_, sn_, hd, p, a.theta); // the row's cos / sin table
  cp_async_wait_all();
  __syncthreads();
  // the end of a phase: this block's ring slice is consumed (when `done`), the next layer's norm
  // weights asked for (copy), then the grid barrier
  auto barrier = [&](bool done, int l, int ev, const void *src, T *dst, int n) {
    __syncthreads();
    DLT(l, ev);
    if (threadIdx.x == 0) dl_arrive(ctr);
    if (done) {
      ring.consumed++;
      dl_issue<T>(a, ring, dl_ring, mb);
    }
    dl_norm_copy<T>(dst, src, n);
    cp_async_commit();
    nbar++;
    if (threadIdx.x == 0) dl_await(ctr, base + (unsigned long long)nbar * gridDim.x);
    cp_async_wait_prev();
    __syncthreads();
    if (ev != 13) DLT(l, ev + 1);
    else DLT(l + 1, 0);
  };
  int ph = 0; // the next GEMV phase
  // phase ph's weights in shared memory (waits for its copy)
  auto weights = [&]() -> const uint4 * {
    const int k = ph % DL_NBAR;
    mbar_wait(mb + k, (unsigned)(ph / DL_NBAR) & 1u);
    return (const uint4 *)(dl_ring + ring.vbeg[k] % DL_RING);
  };
  for (int l = 0; l < a.nl; l++) {
    const ct_decode_layer &Ly = a.L[l];
    const bool more = l + 1 < a.nl;
    const ct_decode_layer &Ln = a.L[more ? l + 1 : l];
    T *kc = (T *)Ly.kc, *vc = (T *)Ly.vc;
    T *Kc = kc + ((s * KV + akv) * a.max_T) * (long)hd, *Vc = vc + ((s * KV + akv) * a.max_T) * (long)hd;
    // this warp's attention split: the keys cached by earlier steps, loaded now (they do not
    // depend on this step) so the loads overlap the qkv phase
    uint4 kr[JK], vr[JK];
    if (att_warp) {
      const int k0 = asp * DEC_CHUNK, ks = lane / LK, ch = lane % LK;
#pragma unroll
      for (int j = 0; j < JK; j++) {
        const int key = k0 + j * KPL + ks;
        kr[j] = key < len - 1 ? __ldcg((const uint4 *)(Kc + (long)key * hd + ch * 8)) : make_uint4(0, 0, 0, 0);
        vr[j] = key < len - 1 ? __ldcg((const uint4 *)(Vc + (long)key * hd + ch * 8)) : make_uint4(0, 0, 0, 0);
      }
    }
    int r0, n;
    const uint4 *ws;
    if (l == 0) DLT(0, 0);
    // raw = qkv projection of rmsnorm(x)
    n = dl_rows(W, blockIdx.x, gridDim.x, &r0);
    ws = weights();
    DLT(l, 1);
    dl_x<T, UQ, true>(xs4, x, nws1, C, a.eps);
    dl_rows<T, UQ, GV_PLAIN, 4>(raw, ws, xs4, r0, n, (const T *)Ly.qkv_b, NULL, C);
    ph++;
    barrier(true, l, 2, more ? Ln.ln1_w : NULL, nws1, C);
    // attention (q / k norm + rope, the cache append): a warp per split of its block's kv head,
    // then the block's splits merged into one partial a query head
    if (att_warp) {
      T(*q)[hd] = qs[warp];
      const int k0 = asp * DEC_CHUNK;
      att_rope_split<T, LK, G>(q, kr, vr, raw, Ly.q_norm ? qns : NULL, Ly.k_norm ? kns : NULL, Kc,
                               Vc, H, KV, akv, k0, p, a.theta, a.eps, cs_, sn_, lane);
      att_split_math<T, LK, G, true>(NULL, &q[0][0], kr, vr, 0, akv, asp, k0, len, H, a.splits,
                                     a.scale, lane, &ps[warp][0][0]);
    }
    __syncthreads();
    for (int g = warp; att_block && g < G; g += DL_WARPS) {
      float M = -INFINITY;
      for (int sp = 0; sp < nact; sp++) M = fmaxf(M, ps[sp][g][hd]);
      float L = 0.0f, o[hd / 32];
#pragma unroll
      for (int i = 0; i < hd / 32; i++) o[i] = 0.0f;
      for (int sp = 0; sp < nact; sp++) {
        const float f = expf(ps[sp][g][hd] - M);
        L = fmaf(f, ps[sp][g][hd + 1], L);
#pragma unroll
        for (int i = 0; i < hd / 32; i++) o[i] = fmaf(f, ps[sp][g][lane + 32 * i], o[i]);
      }
      float *dst = a.part + ((long)(akv * G + g) * BPH + ar) * PS;
#pragma unroll
      for (int i = 0; i < hd / 32; i++) __stcg(dst + lane + 32 * i, o[i]);
      if (lane == 0) {
        __stcg(dst + hd, M);
        __stcg(dst + hd + 1, L);
      }
    }
    barrier(false, l, 4, more ? Ln.q_norm : NULL, qns, hd);
    // res2 = o_proj(attention) + x: every block merges each query head's BPH partials into its
    // input row first (rounded to T, as the attention kernels store it)
    n = dl_rows(C, blockIdx.x, gridDim.x, &r0);
    {
      T *xs = (T *)scr;
      for (int hh = warp; hh < H; hh += DL_WARPS) {
        const float *pp = a.part + (long)hh * BPH * PS;
        float mr = -INFINITY, lr = 0.0f, v[DL_MAX_BPH][hd / 32];
        if (lane < BPH) {
          mr = __ldcg(pp + (long)lane * PS + hd);
          lr = __ldcg(pp + (long)lane * PS + hd + 1);
        }
#pragma unroll
        for (int r = 0; r < DL_MAX_BPH; r++)
#pragma unroll
          for (int i = 0; i < hd / 32; i++) v[r][i] = r < BPH ? __ldcg(pp + (long)r * PS + lane + 32 * i) : 0.0f;
        float M = mr;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float f = lane < BPH ? expf(mr - M) : 0.0f;
        const float L = warp_sum(f * lr);
        float o[hd / 32];
#pragma unroll
        for (int i = 0; i < hd / 32; i++) o[i] = 0.0f;
#pragma unroll
        for (int r = 0; r < DL_MAX_BPH; r++) {
          const float fr = __shfl_sync(0xffffffffu, f, r);
#pragma unroll
          for (int i = 0; i < hd / 32; i++) o[i] = fmaf(fr, v[r][i], o[i]);
        }
#pragma unroll
        for (int i = 0; i < hd / 32; i++) stf(xs + (long)hh * hd + lane + 32 * i, o[i] / L);
      }
    }
    __syncthreads();
    ws = weights();
    DLT(l, 6);
    dl_rows<T, UR, GV_RESID, 1>(res2, ws, xs4, r0, n, (const T *)Ly.o_b, x, H * hd);
    ph++;
    barrier(true, l, 7, NULL, NULL, 0);
    // act = swiglu(rmsnorm(res2) @ fc^T)
    n = dl_rows(F, blockIdx.x, gridDim.x, &r0);
    ws = weights();
    DLT(l, 9);
    dl_x<T, UQ, true>(xs4, res2, nws2, C, a.eps);
    dl_rows<T, UQ, GV_SWIGLU, 3>(act, ws, xs4, r0, n, NULL, NULL, C);
    ph++;
    barrier(true, l, 10, more ? Ln.ln2_w : NULL, nws2, C);
    // x = proj(act) + res2
    n = dl_rows(C, blockIdx.x, gridDim.x, &r0);
    ws = weights();
    DLT(l, 12);
    dl_x<T, UR, false>(xs4, act, NULL, F, 0.0f);
    dl_rows<T, UR, GV_RESID, 1>(x, ws, xs4, r0, n, (const T *)Ly.proj_b, res2, F);
    ph++;
    // ev 14 -> the next layer's 0; the k norm weight here (the q norm's went at the attention's)
    if (more) barrier(true, l, 13, Ln.k_norm, kns, hd);
    else DLT(l, 13);
  }
#ifdef CT_DL_TIMES
  if (blockIdx.x == 0 && threadIdx.x == 0) dl_tm_nl = a.nl;
#endif
  // every block has passed the last barrier, so every block has read base: the next launch's
  if (blockIdx.x == 0 && threadIdx.x == 0)
    ((volatile unsigned long long *)ctr)[1] = base + (unsigned long long)nbar * gridDim.x;
}

unsigned long long *bar_bufs[16]; // decode_layers' grid barriers, a device each
long dl_launches; // decode_layers kernels launched (or recorded into a graph)

// CT_DECODE_PERSIST=1 (opt-in: slower than the per-layer kernels, see above): decode_layers runs.
// Read at every call, so a test can compare both paths in one process.
bool persist_on() {
  return env_on("CT_DECODE_PERSIST");
}

template <typename T, int LK, int G>
bool dl_launch(const dl_args &a) {
  // chunks per lane: C / 256 for qkv and gate/up (at most 4: C <= 1024), max(H * hd, F) / 256
  // for o_proj and down (4, 8 or 12: up to 3072)
  const int uq = (a.C / 8 + 31) / 32, ur0 = ((a.H * a.hd > a.F ? a.H * a.hd : a.F) / 8 + 31) / 32;
  const int ur = ur0 <= 4 ? 4 : ur0 <= 8 ? 8 : ur0 <= 12 ? 12 : 0;
  if (uq > 4 || !ur) return false;
  void (*k)(dl_args) = ur == 4    ? decode_layers_kernel<T, LK, G, 4, 4>
                       : ur == 8 ? decode_layers_kernel<T, LK, G, 4, 8>
                                 : decode_layers_kernel<T, LK, G, 4, 12>;
  // the weight ring and the norm weights in shared memory, then one resident block per
  // multiprocessor (the barriers need every block resident): asked at every launch (the norm
  // weights' bytes depend on the model; graph replays launch nothing)
  const size_t dyn = DL_RING + (size_t)(2 * a.C + 2 * a.hd) * sizeof(T);
  int per_sm = 0;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, DL_WARPS * 32, dyn) != cudaSuccess ||
      per_sm < 1) {
    cudaGetLastError();
    return false;
  }
  const int nb = num_sms();
  // every GEMV phase's slice a block fits in half the ring (so the next streams beside it)
  const int W = (a.H + 2 * a.KV) * a.hd;
  const size_t e = sizeof(T), half = DL_RING / 2;
  auto per = [&](int oc) { return (size_t)((oc + nb - 1) / nb); };
  if (per(W) * a.C * e > half || per(a.C) * a.H * a.hd * e > half ||
      2 * per(a.F) * a.C * e > half || per(a.C) * a.F * e > half)
    return false;
  // attention: ceil(splits / DL_WARPS) blocks a kv head at the longest cache
  const int bph = (a.splits + DL_WARPS - 1) / DL_WARPS;
  if (bph > DL_MAX_BPH || a.KV * bph > nb) return false;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)nb);
  cfg.blockDim = dim3(DL_WARPS * 32);
  cfg.dynamicSmemBytes = dyn;
  cfg.stream = stream();
  void *ev = ct_cuda_prof_begin();
  const bool ok = CKD("decode_layers", cudaLaunchKernelEx(&cfg, k, a));
  if (ok) dl_launches++;
  if (ev) ct_cuda_prof_end(ev, "decode_layers_kernel");
  return ok;
}

template <typename T>
int cu_decode_layers(void *x, void *res2, void *raw, void *qkv, void *atty, void *act,
                     const ct_decode_layer *layers, int nl, const int32_t *slot,
                     const int32_t *pos, int C, int H, int KV, int hd, int F, int max_T,
                     float theta, float eps) {
  if constexpr (sizeof(T) != 2) {
    return 1;
  } else {
    if (!persist_on() || !gemv_on() || !v2_on() || nl <= 0 || nl > DL_MAX_LAYERS || H % KV ||
        KV > DL_MAX_KV ||
        (hd != 64 && hd != 128) || C % 8 || F % 8)
      return 1;
    const int G = H / KV;
    if (G != 1 && G != 2 && G != 4) return 1;
    if (!aligned16(x) || !aligned16(res2) || !aligned16(raw) || !aligned16(qkv) ||
        !aligned16(atty) || !aligned16(act))
      return 1;
    for (int l = 0; l < nl; l++) {
      const ct_decode_layer &L = layers[l];
      if (!aligned16(L.ln1_w) || !aligned16(L.qkv_w) || !aligned16(L.o_w) || !aligned16(L.ln2_w) ||
          !aligned16(L.fc_w) || !aligned16(L.proj_w) || !aligned16(L.kc) || !aligned16(L.vc) ||
          !aligned16(L.q_norm) || !aligned16(L.k_norm))
        return 1;
    }
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return 1;
    if (!bar_bufs[dev]) { // allocated outside graph capture (the first, uncaptured step)
      if (capture_status() != cudaStreamCaptureStatusNone) return 1;
      unsigned long long *b = NULL;
      if (!CKD("decode_layers", cudaMalloc((void **)&b, 2 * sizeof *b))) return -1;
      if (!CKD("decode_layers", cudaMemsetAsync(b, 0, 2 * sizeof *b, stream()))) return -1;
      bar_bufs[dev] = b;
    }
    const int splits = (max_T + DEC_CHUNK - 1) / DEC_CHUNK;
    char *buf = (char *)split_scratch(SPLIT_COUNT_BYTES + sizeof(float) * (size_t)H * splits * (hd + 4));
    if (!buf) return 1;
    static dl_args a; // 10+ KB: not on the stack
    a.x = x, a.res2 = res2, a.raw = raw, a.qkv = qkv, a.atty = atty, a.act = act;
    a.part = (float *)(buf + SPLIT_COUNT_BYTES);
    a.bar = bar_bufs[dev];
    a.slot = slot, a.pos = pos;
    a.nl = nl, a.C = C, a.H = H, a.KV = KV, a.hd = hd, a.F = F, a.max_T = max_T, a.splits = splits;
    a.theta = theta, a.eps = eps, a.scale = 1.0f / sqrtf((float)hd);
    const char *ah = getenv("CT_DL_AHEAD");
    a.ahead = ah && atoi(ah) >= 1 && atoi(ah) <= DL_NBAR ? atoi(ah) : 2;
    for (int l = 0; l < nl; l++) a.L[l] = layers[l];
    bool ok;
    if (hd == 64) ok = G == 1 ? dl_launch<T, 8, 1>(a) : G == 2 ? dl_launch<T, 8, 2>(a) : dl_launch<T, 8, 4>(a);
    else ok = G == 1 ? dl_launch<T, 16, 1>(a) : G == 2 ? dl_launch<T, 16, 2>(a) : dl_launch<T, 16, 4>(a);
    return ok ? 0 : 1;
  }
}

// ---- attention_decode for 9 rows and more: a block per (row, kv head) ----
// attention_decode_vec_kernel launches a 4-warp block for every 64 keys of max_T; each warp loads
// its 16-key split into registers once, does the split's math and leaves; the last block of a
// (row, kv head) merges the splits read back through L2. At batch 64 that is ~47% of the KV
// bandwidth. Here one block takes a whole (row, kv head): warp w does the splits w, w + AB_W, ...
// of the row's keys (only those below its length: no warps for the rest of max_T), each split's
// K and V rows stream into a ring of AB_R stages in the warp's shared memory (cp.async, a lane
// its own 16-byte chunks, so it reads back only what it copied and no warp waits on another), the
// next AB_R - 1 splits in flight while one is computed. The split math is the vec kernel's
// (att_split_math), its rows go to shared memory (or, where they do not fit beside the rings, to
// the part scratch), and after one block barrier the block merges them in split order with
// att_merge_core: the same arithmetic on the same values as the vec kernel and the fused batch-1
// kernels, so a row has the same bits whichever of them ran. The old keys' copies for the first
// splits go out before griddepcontrol.wait, the newest key (appended by the kernel before) is
// read after it.
template <typename T, int LK, int G, int BW, int R>
__global__ void __launch_bounds__(BW * 32)
    attention_decode_blk_kernel(T *out, float *part, const T *qkv, const T *kc, const T *vc,
                                const int32_t *slot, const int32_t *pos, int H, int KV,
                                int max_T, int splits, float scale, int ps_in_smem) {
  constexpr int hd = 8 * LK, KPL = 32 / LK, J = DEC_CHUNK / KPL, PS = hd + 4;
  constexpr int SB = DEC_CHUNK * hd; // elements of a split's K rows (and of its V rows)
  extern __shared__ __align__(16) uint4 ab_smem[];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, kv = blockIdx.x, n = blockIdx.y;
  T *ring = (T *)ab_smem + (size_t)w * R * 2 * SB; // warp w's stages: K rows, then V rows
  float *ps = ps_in_smem ? (float *)((T *)ab_smem + (size_t)BW * R * 2 * SB)
                         : part + ((long)n * KV + kv) * splits * G * PS;
  pdl_trigger();
  // pos and slot were copied in before the step's first kernel; every key but the newest was
  // cached by an earlier step (see attention_decode_vec_kernel)
  const int len = pos[n] + 1, used = min(splits, (len + DEC_CHUNK - 1) / DEC_CHUNK);
  const int ks = lane / LK, ch = lane % LK;
  const long s = slot ? slot[n] : n;
  const T *K = kc + ((s * KV + kv) * max_T) * (long)hd + ch * 8;
  const T *V = vc + ((s * KV + kv) * max_T) * (long)hd + ch * 8;
  // the old keys of the warp's i-th split into stage i % R; one commit group a split, empty past
  // the warp's last, so the wait below always leaves the newest R - 1 in flight
  auto issue = [&](int i) {
    const int sp = w + i * BW;
    if (sp < used) {
      T *kst = ring + (i % R) * 2 * SB, *vst = kst + SB;
#pragma unroll
      for (int j = 0; j < J; j++) {
        const int r = j * KPL + ks, key = sp * DEC_CHUNK + r;
        if (key < len - 1) {
          cp_async16(kst + r * hd + ch * 8, K + (long)key * hd);
          cp_async16(vst + r * hd + ch * 8, V + (long)key * hd);
        }
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int i = 0; i < R - 1; i++) issue(i);
  pdl_wait();
  const T *q0 = qkv + (long)n * (H + 2 * KV) * hd + (long)kv * G * hd;
  for (int i = 0; w + i * BW < used; i++) {
    issue(i + R - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(R - 1) : "memory"); // split i has landed
    const int sp = w + i * BW, k0 = sp * DEC_CHUNK;
    const T *kst = ring + (i % R) * 2 * SB, *vst = kst + SB;
    uint4 kr[J], vr[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
      const int r = j * KPL + ks, key = k0 + r;
      if (key < len - 1) {
        kr[j] = *(const uint4 *)(kst + r * hd + ch * 8);
        vr[j] = *(const uint4 *)(vst + r * hd + ch * 8);
      } else if (key == len - 1) {
        kr[j] = *(const uint4 *)(K + (long)key * hd);
        vr[j] = *(const uint4 *)(V + (long)key * hd);
      } else {
        kr[j] = vr[j] = make_uint4(0, 0, 0, 0);
      }
    }
    att_split_math<T, LK, G>(nullptr, q0, kr, vr, n, kv, sp, k0, len, H, splits, scale, lane,
                             ps + (long)sp * G * PS);
  }
  cp_async_wait_all();
  __syncthreads(); // every split's rows written
  constexpr int HP = BW >= 2 * G && hd % 64 == 0 ? 2 : 1; // two warps a head where there are
  for (int t = w; t < G * HP; t += BW) {
    const int g = t / HP;
    auto ld = [&](int sp_, int i) { return ps[((long)sp_ * G + g) * PS + i]; };
    att_merge_core<T, hd, decltype(ld), HP>(out + (long)n * H * hd + (long)(kv * G + g) * hd, ld,
                                            used, lane, t % HP);
  }
}

// CT_DECODE_ATT_BLK: attention_decode_blk_kernel for attention_decode where it applies ("0" off,
// "1" at every row count; default: from AB_MIN_ROWS rows, and at any row count where every query
// head has its own kv head (G 1: GPT-2 decodes 7-11% faster at batch 1 with it, 3-3.5% at 8; the
// grouped shapes gain nothing below 8 rows; H200, 2026-12-04, calls 1-2). CT_DECODE_AB_W (4 or 8 warps a block;
// default: by the grid, see ab_try), CT_DECODE_AB_R (2 or 3 stages a warp) and CT_DECODE_AB_PS
// (0: the split rows in the part scratch, 1: in shared memory where they fit) are for
// measurements. Read at every call.
#define AB_MIN_ROWS 8
long ab_launches; // attention_decode_blk kernels launched (or recorded into a graph)
int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}
// The device's largest opt-in dynamic shared memory a block (cached per device), 48 KB if unknown.
size_t smem_optin() {
  static int v[16];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return 48 * 1024;
  if (!v[dev] && cudaDeviceGetAttribute(&v[dev], cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    cudaGetLastError();
    v[dev] = 48 * 1024;
  }
  return (size_t)v[dev];
}
// A multiprocessor's shared memory and the part reserved for each block resident on it (bytes;
// cached per device); false where the device does not say.
bool sm_smem_info(int *per_sm, int *reserved) {
  static int sm[16], res[16];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return false;
  if (!sm[dev] &&
      (cudaDeviceGetAttribute(&sm[dev], cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
       cudaDeviceGetAttribute(&res[dev], cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess)) {
    cudaGetLastError();
    sm[dev] = -1;
  }
  if (sm[dev] <= 0) return false;
  *per_sm = sm[dev];
  *reserved = res[dev];
  return true;
}
// Kernel k's static shared memory (bytes), -1 where it cannot be had.
long static_smem(const void *k) {
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, k) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return (long)fa.sharedSizeBytes;
}
// Kernel k's dynamic shared memory limit raised to the device's opt-in limit less its static bytes
// (once per kernel and device); false where that failed (nothing reported: the callers then launch
// without a pad).
bool smem_raise_quiet(const void *k) {
  static kernel_list raised;
  bool in;
  const int dev = listed(raised, k, &in);
  if (dev < 0) return false;
  if (in) return true;
  const long st = static_smem(k); // the limit counts the dynamic bytes on top of the static ones
  if (st < 0 || cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)((long)smem_optin() - st)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  add_listed(raised, dev, k);
  return true;
}

// The GEMV launches still to pad after an attention launch kept apart from them (att_pad), and
// how many were padded.
int apart_left;
long apart_gemvs;
// The dynamic shared memory of a GEMV launch of kernel k that needs `smem`: while apart_left
// lasts, a quarter of a multiprocessor's shared memory with the reserved part (one launch of
// apart_left taken).
size_t apart_gemv_smem(const void *k, size_t smem) {
  if (apart_left <= 0) return smem;
  apart_left--;
  int sm = 0, res = 0;
  const long st = static_smem(k);
  if (!sm_smem_info(&sm, &res) || st < 0) return smem;
  const long want = (long)sm / 4 - res - st;
  if (want <= (long)smem || want > (long)smem_optin() - st || !smem_raise_quiet(k)) return smem;
  apart_gemvs++;
  return (size_t)want;
}

// Kernel k may use `bytes` of dynamic shared memory (raised once per kernel and device to the
// device's opt-in limit).
bool smem_allow(const void *k, const char *op) {
  static kernel_list done;
  bool in;
  const int dev = listed(done, k, &in);
  if (dev < 0) return false;
  if (in) return true;
  if (!CKD(op, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_optin())))
    return false;
  add_listed(done, dev, k);
  return true;
}

template <typename T, int LK, int G, int BW, int R>
bool ab_launch(T *o, float *part, const T *q, const T *K, const T *V, const int32_t *slot,
               const int32_t *pos, int N, int H, int KV, int max_T, int splits, float sc,
               bool ps_smem) {
  constexpr int hd = 8 * LK;
  const size_t ring = (size_t)BW * R * 2 * DEC_CHUNK * hd * sizeof(T);
  const size_t psb = (size_t)splits * G * (hd + 4) * sizeof(float);
  const bool in_smem = ps_smem && ring + psb + 1024 <= smem_optin();
  const size_t smem = ring + (in_smem ? psb : 0);
  if (smem + 1024 > smem_optin()) return false;
  void (*k)(T *, float *, const T *, const T *, const T *, const int32_t *, const int32_t *, int,
            int, int, int, float, int) = attention_decode_blk_kernel<T, LK, G, BW, R>;
  if (smem > 48 * 1024 && !smem_allow((const void *)k, "attention_decode")) return false;
  if (!launch("attention_decode", "attention_decode_blk_kernel", k, dim3(KV, N), BW * 32, smem, o,
              part, q, K, V, slot, pos, H, KV, max_T, splits, sc, (int)in_smem))
    return false;
  ab_launches++;
  return true;
}

// 1: launched; 0: does not apply (the caller goes on with the vec kernel). By default the block
// shape follows the grid: the first of 8 warps x 3 stages, 8 x 2 and 4 x 2 whose KV x N blocks
// all fit the multiprocessors at once (one wave: as many keys in flight a row as can be), and where
// none does, the one with the most warps resident a multiprocessor (the occupancy calculator's
// count: registers, threads and shared memory; CT_DECODE_AB_SHOW=1 prints it), a tie going to the
// smaller block (more blocks resident: Qwen3-0.6B at 64 rows holds 8 warps a multiprocessor in
// every shape, and 4 x 2 runs 32.7 us against 40.6 for 8 x 3). On an H200 (call 1 of 2026-12-04,
// 384 keys, us for vec | 8x3 | 8x2 | 4x2): Qwen3-0.6B (hd 128, G 2) 16 rows 13.5 | 10.9 | 10.5 |
// 13.4, 32 rows 23.6 | 21.5 | 20.4 | 16.5, 64 rows 41.9 | 40.6 | 38.5 | 32.7; GPT-2 (hd 64, G 1)
// 64 rows 34.1 | 24.9 | 20.9 | 25.2; Llama-3.2-1B (hd 64, G 4) 32 rows 19.4 | 17.1 | 12.5 | 17.1.
template <typename T, int LK, int G>
int ab_try(T *o, float *part, const T *q, const T *K, const T *V, const int32_t *slot,
           const int32_t *pos, int N, int H, int KV, int max_T, int splits, float sc) {
  int bw = env_int("CT_DECODE_AB_W", 0), r = env_int("CT_DECODE_AB_R", 0);
  const bool ps = env_int("CT_DECODE_AB_PS", 1) != 0;
  if (!bw) {
    constexpr int hd = 8 * LK;
    void (*const ks[3])(T *, float *, const T *, const T *, const T *, const int32_t *,
                        const int32_t *, int, int, int, int, float, int) = {
        attention_decode_blk_kernel<T, LK, G, 8, 3>, attention_decode_blk_kernel<T, LK, G, 8, 2>,
        attention_decode_blk_kernel<T, LK, G, 4, 2>};
    static const int cand[3][2] = {{8, 3}, {8, 2}, {4, 2}};
    long best_warps = -1;
    for (int c = 0; c < 3; c++) {
      // the shared memory ab_launch will ask for: the ring, and the split rows where they fit
      const size_t ring = (size_t)cand[c][0] * cand[c][1] * 2 * DEC_CHUNK * hd * sizeof(T);
      const size_t psb = (size_t)splits * G * (hd + 4) * sizeof(float);
      const size_t bytes = ring + (ps && ring + psb + 1024 <= smem_optin() ? psb : 0);
      // blocks a multiprocessor holds at once (registers, threads and shared memory counted)
      int per_sm = 0;
      if (bytes + 1024 > smem_optin() || !smem_allow((const void *)ks[c], "attention_decode") ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ks[c], cand[c][0] * 32, bytes) != cudaSuccess) {
        cudaGetLastError();
        per_sm = 0;
      }
      if (getenv("CT_DECODE_AB_SHOW"))
        fprintf(stderr, "attention_decode_blk: N %d KV %d hd %d G %d: %dx%d %zu B, %d a multiprocessor\n",
                N, KV, hd, G, cand[c][0], cand[c][1], bytes, per_sm);
      if (per_sm > 0 && (long)KV * N <= (long)per_sm * num_sms()) {
        bw = cand[c][0], r = cand[c][1];
        break;
      }
      if (per_sm > 0 && (long)per_sm * cand[c][0] >= best_warps) best_warps = (long)per_sm * cand[c][0], bw = cand[c][0], r = cand[c][1];
    }
    if (!bw) return 0; // no shape fits a multiprocessor: the vec kernel
  }
  if (!r) r = 3;
  if (bw == 8) {
    if (r == 2) return ab_launch<T, LK, G, 8, 2>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc, ps);
    return ab_launch<T, LK, G, 8, 3>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc, ps);
  }
  if (r == 2) return ab_launch<T, LK, G, 4, 2>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc, ps);
  return ab_launch<T, LK, G, 4, 3>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc, ps);
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
  char *buf = (char *)split_scratch(SPLIT_COUNT_BYTES + sizeof(float) * (size_t)N * H * splits *
                                                            (hd + 4)); // vec kernel: hd + 4
  if (!buf) return;
  float *part = (float *)(buf + SPLIT_COUNT_BYTES);
  if constexpr (sizeof(T) == 2) {
    const int G = H / KV;
    if (gemv_on() && v2_on() &&
        (size_t)(N * KV + ARGMAX_MAX_ROWS) * sizeof(unsigned) <= SPLIT_COUNT_BYTES &&
        (hd == 64 || hd == 128) && (G == 1 || G == 2 || G == 4) && aligned16(qkv) &&
        aligned16(kc) && aligned16(vc)) {
      const dim3 g((splits + DEC_WARPS - 1) / DEC_WARPS, KV, N);
      const float sc = 1.0f / sqrtf((float)hd);
      T *o = (T *)out;
      const T *q = (const T *)qkv, *K = (const T *)kc, *V = (const T *)vc;
      unsigned *cnt = (unsigned *)buf;
      const l2_hint_t h = take_hint(true);
      if (env_switch("CT_DECODE_ATT_BLK", N >= AB_MIN_ROWS || G == 1) && cc_major() >= 8) {
        int done;
        if (hd == 64) done = G == 1 ? ab_try<T, 8, 1>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc)
                             : G == 2 ? ab_try<T, 8, 2>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc)
                                      : ab_try<T, 8, 4>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc);
        else done = G == 1 ? ab_try<T, 16, 1>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc)
                  : G == 2 ? ab_try<T, 16, 2>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc)
                           : ab_try<T, 16, 4>(o, part, q, K, V, slot, pos, N, H, KV, max_T, splits, sc);
        if (done) return;
      }
#define ATT_VEC(LK, G_)                                                                           \
  launch("attention_decode", "attention_decode_vec_kernel", attention_decode_vec_kernel<T, LK, G_>, \
         g, DEC_WARPS * 32, 0, o, part, cnt, q, K, V, slot, pos, H, KV, max_T, splits, sc, h.p,  \
         h.bytes)
      LK_G_DISPATCH(ATT_VEC);
#undef ATT_VEC
      return;
    }
  }
  dim3 grid((splits + DEC_WARPS - 1) / DEC_WARPS, H, N);
  if (!launch("attention_decode", "attention_decode_split_kernel", attention_decode_split_kernel<T>,
              grid, DEC_WARPS * 32, 0, part, (const T *)qkv, (const T *)kc, (const T *)vc, slot,
              pos, H, KV, hd, max_T, splits, 1.0f / sqrtf((float)hd)))
    return;
  launch("attention_decode", "attention_decode_merge_kernel", attention_decode_merge_kernel<T>,
         dim3(H, N), hd, 0, (T *)out, (const float *)part, pos, H, hd, splits);
}

template <typename T>
void cu_argmax_advance(int32_t *out, int32_t *tok, int32_t *pos, int32_t *hid, const void *logits,
                       int N, int V, int Vp) {
  if (N <= 0) return;
  const int B = V >= AM_MAX_BLOCKS * 2048 ? AM_MAX_BLOCKS : (V + 2047) / 2048;
  if (gemv_on() && v2_on() && B > 1 && N <= ARGMAX_MAX_ROWS) {
    char *buf = (char *)split_scratch(SPLIT_COUNT_BYTES + (size_t)N * B * 8);
    if (!buf) return;
    float *pv = (float *)(buf + SPLIT_COUNT_BYTES);
    int *pi = (int *)(pv + (size_t)N * B);
    unsigned *cnt = (unsigned *)(buf + SPLIT_COUNT_BYTES) - ARGMAX_MAX_ROWS;
    if constexpr (sizeof(T) == 2) {
      if (Vp % 8 == 0 && aligned16(logits) && vec_argmax_on()) {
        launch("argmax_rows", "argmax_split_kernel", argmax_split_kernel<T, true>, dim3(B, N),
               AM_THREADS, 0, out, tok, pos, hid, pv, pi, cnt, (const T *)logits, V, Vp);
        return;
      }
    }
    launch("argmax_rows", "argmax_split_kernel", argmax_split_kernel<T, false>, dim3(B, N),
           AM_THREADS, 0, out, tok, pos, hid, pv, pi, cnt, (const T *)logits, V, Vp);
    return;
  }
  launch("argmax_rows", "argmax_rows_kernel", argmax_rows_kernel<T>, N, ARGMAX_THREADS, 0, out,
         tok, pos, hid, (const T *)logits, V, Vp);
}
template <typename T> void cu_argmax_rows(int32_t *out, const void *logits, int N, int V, int Vp) {
  cu_argmax_advance<T>(out, NULL, NULL, NULL, logits, N, V, Vp);
}


// ---- decode-step fusions (ops.h) ----

int gv_rows(int n) { return n <= 1 ? 1 : n <= 4 ? 4 : 8; } // the N a kernel is built for

bool gm_applies(int nr, int IC);

// The GEMV applies: 16-bit, 16-byte rows and pointers; up to GV_MAXN rows x fits the default
// 48 KB, more rows only where the tensor-core GEMV takes them.
template <typename T>
bool gemv_fits(int N, int IC, const void *inp, const void *w, const void *nw = NULL) {
  if (sizeof(T) != 2 || !gemv_on() || IC <= 0 || IC % 8) return false;
  if (!aligned16(inp) || !aligned16(w) || !aligned16(nw)) return false;
  if (N > GV_MAXN) return gm_applies(N, IC); // the tensor-core GEMV's rows only
  return (size_t)gv_rows(N) * IC * sizeof(T) <= 48 * 1024;
}

// CT_DECODE_STAGE=1: the staged GEMV where its slices fit. STATUS (H200, 2026-11-30): bit-identical
// to gemv_kernel (test_decode_cuda) and slower: 1,229 against 1,274 tokens/s at batch 1 on the
// Qwen3-0.6B shape (bench/results/gpu_decode_variants_2026-11-30_2xH200_8ecbce4.txt). gemv_kernel
// already has every weight of a step's GEMV in flight before it waits; what the step waits on is
// the chain of dependent latencies (bench/results/gpu_decode_null_2026-11-30_2xH200_cc0e9f0.txt).
// The default for 5-8 rows (the 8-row kernels), opt-in below: on the Qwen3-0.6B shape (H200,
// 2026-12-01, the same ids both ways, bench/results/call62_6ba50d4.txt) batch 8 ran 1.8% faster
// with it (4,484-4,490 against 4,406-4,413 tokens/s), batch 2 and 4 19% slower (1,670 against
// 2,062; 3,063 against 3,762: at 4 rows gate/up's slice fills 106 KB, one block a
// multiprocessor; at 8 it does not fit and stays with gemv_kernel). CT_DECODE_STAGE=1 / =0 force
// it on / off at any row count. Read at every call, so a test can compare both paths in one
// process.
bool stage_on(int nr) { return env_switch("CT_DECODE_STAGE", nr > 4); }
long staged_launches; // gemv_staged_kernel launches (tests)
#define GV_STAGE_MAX (112 * 1024) // a block's shared memory: two such blocks share a multiprocessor

// Kernel k's dynamic shared-memory limit raised to `limit`, once per device, whatever a launch
// asks: the default 48 KB counts the kernel's static bytes too, so even a launch asking less can
// be past it.
bool raise_smem(const void *k, size_t limit) {
  static kernel_list done;
  bool in;
  const int dev = listed(done, k, &in);
  if (dev < 0) return false;
  if (in) return true;
  if (!CKD("decode gemv", cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)limit)))
    return false;
  add_listed(done, dev, k);
  return true;
}

// The staged GEMV, when its per-block slice (an SM's share of the outputs) fits GV_STAGE_MAX;
// false: not launched (the caller runs gemv_kernel).
template <typename T, int N, int NORM, int MODE>
bool gemv_staged(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias, const T *res,
                 int nr, int IC, int OC, float eps) {
  const int S = MODE == GV_SWIGLU ? 2 : 1, sms = num_sms();
  const int rpb = (OC + sms - 1) / sms;
  const size_t smem = ((size_t)S * rpb + N) * IC * sizeof(T);
  if (!stage_on(nr) || smem > GV_STAGE_MAX) return false;
  auto k = gemv_staged_kernel<T, N, NORM, MODE>;
  // (4 rows of the Qwen3-0.6B shape's output projection ask exactly 48 KB: with the static bytes
  // past the default)
  if (!raise_smem((const void *)k, GV_STAGE_MAX)) return false;
  take_hint(); // its weights are already on their way: an L2 hint adds nothing
  if (!launch("decode gemv", "gemv_staged_kernel", k, (OC + rpb - 1) / rpb, GV_WARPS * 32, smem,
              out, inp, nw, nb, w, bias, res, nr, IC, OC, eps, (int)v2_on(), rpb))
    return true; // reported; the step fails at its check
  staged_launches++;
  return true;
}

// CT_DECODE_MMA: the tensor-core GEMV (gemv_mma_kernel) for 2 to GV_MAXN rows where IC is a
// multiple of 256 (the default); "0" keeps gemv_kernel / the staged GEMV there too; "all" takes
// it for one row as well (a measurement: one row runs slower on it, below). CT_DECODE_MMA_TT=1,
// 2 or 4 sets the tiles a block takes at a time (as far as gm_pick allows; default: gemv_mma).
// Read at every call, so a test can compare the paths in one process.
// Measured (H200, Qwen3-0.6B shape, bf16, 128 + 256 tokens, decode tokens/s; bench/results/
// call103-108_2026-12-02_H200_mma, the default of call 108): batch 8 7,449 against 4,489 (+66%),
// 4 4,090 against 3,794, 2 2,145 against 2,062; GPT-2 124M batch 8 11,667 against 9,736, 4 7,151
// against 6,961, 2 4,097 against 4,244. One row (call 104): 1,113 against 1,498, the layers'
// GEMVs alone (the head on gemv_kernel) 1,191, the head alone 1,362: each GEMV ran 1-2 us longer
// in isolation (CT_CUDA_PROFILE, call 105) and the head 138 against 77 us. Likely causes, not
// measured apart: one instruction's loads span 8 weight rows (64 bytes each) where gemv_kernel's
// read 512 contiguous bytes of one, and the head's 4-tile blocks (142 registers) fit one to a
// multiprocessor (2 tiles, the default now, fit 3). A weight tile staged into shared memory by
// the bulk copy engine and read with ldmatrix would answer the first. So one row stays on
// gemv_kernel, and a row of a 2-8 row batch equals itself in any other 2-8 row batch bit for bit,
// but its solo run only within rounding.
#define GM_WIDE 16384     // outputs from which a block takes 2 tiles at a time (gemv_mma)
#define GM_MIN_BLOCKS 64  // the fewest blocks a narrower GEMV's tiles a block leave (gemv_mma)
#define GM_SMEM_MAX (220 * 1024) // gemv_mma_kernel's dynamic shared memory at most
int mma_mode() {
  const char *v = getenv("CT_DECODE_MMA");
  if (!v) return 1;
  return !strcmp(v, "0") ? 0 : !strcmp(v, "all") ? 2 : 1;
}
long mma_launches; // gemv_mma_kernel launches (tests)


typedef void (*gm_kernel_t)(void *, const void *, const void *, const void *, const void *,
                            const void *, const void *, int, int, int, int, float, int, const void *, size_t);
// gemv_mma_kernel for k blocks a warp kbw, tiles at a time tt and MT m tiles of 16 rows, which it
// lowers tt to the most the kernels are built for (U: one round up to 4 / 8 k blocks, 12 beyond;
// TT 4 only with U 4 and MT 1, 2 up to U 8 (MT 4: U 4), so a thread's weights and accumulators
// stay in registers; GV_SWIGLU 1).
template <typename T, int NORM, int MODE, int MT> gm_kernel_t gm_pick_mt(int kbw, int &tt) {
#define GM_K(U, TT) ((gm_kernel_t)gemv_mma_kernel<T, U, TT, NORM, MODE, MT>)
  const int tmax = MODE == GV_SWIGLU || kbw > 8 || (MT == 4 && kbw > 4) ? 1 : MT == 1 && kbw <= 4 ? 4 : 2;
  tt = tt >= 4 && tmax >= 4 ? 4 : tt >= 2 && tmax >= 2 ? 2 : 1;
  if constexpr (MODE == GV_SWIGLU) {
    return kbw <= 4 ? GM_K(4, 1) : kbw <= 8 ? GM_K(8, 1) : GM_K(12, 1);
  } else if constexpr (MT == 1) {
    if (kbw <= 4) return tt == 4 ? GM_K(4, 4) : tt == 2 ? GM_K(4, 2) : GM_K(4, 1);
    if (kbw <= 8) return tt == 2 ? GM_K(8, 2) : GM_K(8, 1);
    return GM_K(12, 1);
  } else if constexpr (MT == 2) {
    if (kbw <= 4) return tt == 2 ? GM_K(4, 2) : GM_K(4, 1);
    if (kbw <= 8) return tt == 2 ? GM_K(8, 2) : GM_K(8, 1);
    return GM_K(12, 1);
  } else {
    if (kbw <= 4) return tt == 2 ? GM_K(4, 2) : GM_K(4, 1);
    return kbw <= 8 ? GM_K(8, 1) : GM_K(12, 1);
  }
#undef GM_K
}
template <typename T, int NORM, int MODE> gm_kernel_t gm_pick(int kbw, int &tt, int mt) {
  return mt == 1 ? gm_pick_mt<T, NORM, MODE, 1>(kbw, tt)
         : mt == 2 ? gm_pick_mt<T, NORM, MODE, 2>(kbw, tt)
                   : gm_pick_mt<T, NORM, MODE, 4>(kbw, tt);
}

// The rows the tensor-core GEMV takes at most: CT_DECODE_MMA_MAXN (8 sends 9+ rows to cuBLAS as
// before it took them; at most GM_MAXN), default GM_MAXN_DEFAULT. 16 because that is where it
// wins (H200, call 111: Qwen3-0.6B batch 16 10,480 against 7,320 tokens/s on cuBLAS); past 16
// rows its 2- and 4-tile blocks lose to cuBLAS (batch 32 13,520 against 13,700, batch 64 14,310
// against 23,920), so they stay opt-in until they are tuned.
int gm_maxn() {
  const char *v = getenv("CT_DECODE_MMA_MAXN");
  const int n = v ? atoi(v) : GM_MAXN_DEFAULT;
  return n < 1 ? 1 : n > GM_MAXN ? GM_MAXN : n;
}
// gemv_mma_kernel's dynamic shared memory for nx input rows held, rt weight rows a thread and
// vn (2: the norm weight copied too)
size_t gm_smem(int nx, int IC, int rt, int np) { // np: the norm's rows (gv_np)
  const int rs = nx > 8 ? nx : 8;
  return (size_t)(nx + np) * IC * 2 + 2 * (size_t)GV_WARPS * rt * rs * 8 * sizeof(float);
}
// The tensor-core GEMV takes nr rows of width IC: mma_mode, 2+ rows (1 with CT_DECODE_MMA=all),
// at most gm_maxn(), IC % 256 == 0, sm_80 and up, and from 9 rows 16 of them fit its shared memory
bool gm_applies(int nr, int IC) {
  const int mode = mma_mode();
  if (!mode || env_on("CT_DECODE_STAGE") || IC % (32 * GV_WARPS)) return false;
  if ((nr < 2 && mode != 2) || nr > gm_maxn() || cc_major() < 8) return false;
  return nr <= GV_MAXN || gm_smem(16, IC, 2, 1) <= GM_SMEM_MAX;
}

// One launch of gemv_mma_kernel for rows [0, nr) of inp / res / out (nr <= 16 mt).
template <typename T, int NORM, int MODE>
void gemv_mma_go(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias, const T *res,
                 int nr, int mt, int IC, int OC, float eps) {
  const int S = MODE == GV_SWIGLU ? 2 : 1, kbw = IC / (32 * GV_WARPS);
  // tiles a block at a time: CT_DECODE_MMA_TT, else 2 for the wide outputs (4 hold 142
  // registers a thread: one block a multiprocessor) and for the others the most that still
  // leave GM_MIN_BLOCKS blocks (from 9 rows: a block a multiprocessor). Measured (H200,
  // bench/results/call103-108_2026-12-02_H200_mma, call107-108), tokens/s at batch 2 / 4 / 8:
  // Qwen3-0.6B shape 2,145 / 4,090 / 7,449 with 64 (its output projection 2 tiles a block, 64
  // blocks), 2,127 / 4,023 / 7,284 with 96; GPT-2 124M 4,097 / 7,151 / 11,667 with 64 (its qkv 4
  // tiles, 72 blocks), 4,172 / 7,156 / 11,826 with 96; the wide outputs at 4 tiles 0-1.4% slower
  // than at 2.
  // (measurements: CT_DECODE_MMA_WIDE_TT and CT_DECODE_MMA_MIN_BLOCKS replace the 2 and GM_MIN_BLOCKS)
  const char *ttv = getenv("CT_DECODE_MMA_TT"), *wtv = getenv("CT_DECODE_MMA_WIDE_TT");
  const char *mbv = getenv("CT_DECODE_MMA_MIN_BLOCKS");
  const int minb = mbv ? atoi(mbv) : nr > GV_MAXN ? num_sms() : GM_MIN_BLOCKS;
  int tt = ttv ? atoi(ttv) : OC >= GM_WIDE ? (wtv ? atoi(wtv) : 2) : 4;
  if (!ttv && OC < GM_WIDE)
    while (tt > 1 && (OC + GM_TILE * tt - 1) / (GM_TILE * tt) < minb) tt /= 2;
  gm_kernel_t k = gm_pick<T, NORM, MODE>(kbw, tt, mt);
  // the input rows held: gv_rows up to 8, else 16 mt
  const int nx = nr <= GV_MAXN ? gv_rows(nr) : 16 * mt;
  // vnorm as gemv_go: the norm weight copied to shared memory where the rows and it fit 48 KB
  // (from 9 rows: where it fits at all)
  const size_t vlim = nx > GV_MAXN ? GM_SMEM_MAX : 48 * 1024;
  int vn = !v2_on() ? 0 : NORM && (size_t)(nx + gv_np(NORM, 2)) * IC * sizeof(T) <= vlim ? 2 : 1;
  size_t smem = gm_smem(nx, IC, S * tt, gv_np(NORM, vn));
  while (smem > GM_SMEM_MAX && tt > 1) { // fewer tiles: a smaller reduction buffer
    tt /= 2;
    k = gm_pick<T, NORM, MODE>(kbw, tt, mt);
    smem = gm_smem(nx, IC, S * tt, gv_np(NORM, vn));
  }
  if (smem > GM_SMEM_MAX && vn == 2) smem = gm_smem(nx, IC, S * tt, gv_np(NORM, vn = 1)); // same values
  const int groups = (OC + GM_TILE * tt - 1) / (GM_TILE * tt);
  unsigned blocks = (unsigned)groups;
  // blocks loop over further groups. From 9 rows a block's input rows cost more to fetch (and
  // norm) than a group's weights, so no more blocks than run at once, each fetching them once
  // (CT_DECODE_MMA_ONCE=0: up to 4 a multiprocessor, as for 2-8 rows)
  unsigned cap = 4u * (unsigned)num_sms();
  if (nx > GV_MAXN && !env_off("CT_DECODE_MMA_ONCE")) {
    const size_t fit = (size_t)227 * 1024 / (smem + 1024); // blocks a multiprocessor holds
    cap = (unsigned)num_sms() * (unsigned)(fit < 1 ? 1 : fit > 4 ? 4 : fit);
  }
  if (blocks > cap) blocks = cap;
  if (!raise_smem((const void *)k, GM_SMEM_MAX)) return; // reported; the step fails at its check
  const l2_hint_t h = take_hint();
  if (launch("decode gemv", "gemv_mma_kernel", k, blocks, GV_WARPS * 32,
             apart_gemv_smem((const void *)k, smem), (void *)out,
             (const void *)inp, (const void *)nw, (const void *)nb, (const void *)w, (const void *)bias,
             (const void *)res, nr, nx, IC, OC, eps, vn, h.p, h.bytes))
    mma_launches++;
}

// The tensor-core GEMV where it applies (gm_applies); false: not launched (the caller goes on
// with the other GEMVs). From 9 rows the rows go in launches of 16 mt rows, mt the largest of
// 4 / 2 / 1 whose rows fit the shared memory (a wide input, the down projection's, holds 32 rows
// at most): each launch reads the weights again, from L2 where they stayed.
template <typename T, int NORM, int MODE>
bool gemv_mma(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias, const T *res, int nr,
              int IC, int OC, float eps) {
  if (!gm_applies(nr, IC)) return false;
  if (nr <= GV_MAXN) {
    gemv_mma_go<T, NORM, MODE>(out, inp, nw, nb, w, bias, res, nr, 1, IC, OC, eps);
    return true;
  }
  int mt = nr > 32 ? 4 : nr > 16 ? 2 : 1;
  while (mt > 1 && gm_smem(16 * mt, IC, 1, 0) > GM_SMEM_MAX) mt /= 2;
  for (int r0 = 0; r0 < nr; r0 += 16 * mt) {
    const int n = nr - r0 < 16 * mt ? nr - r0 : 16 * mt;
    int m = 1; // the last launch: the fewest m tiles that hold its rows
    while (16 * m < n) m *= 2;
    gemv_mma_go<T, NORM, MODE>(out + (size_t)r0 * OC, inp + (size_t)r0 * IC, nw, nb, w, bias,
                               res ? res + (size_t)r0 * OC : NULL, n, m, IC, OC, eps);
  }
  return true;
}

long gv_one_launches; // gemv_kernel launches in the one-task form (MULTI false; tests)
// Which GEMVs may take the one-task form (CT_DECODE_GV_ONE, a mask read at every call; default
// all, 0 none): 1 GV_PLAIN (norm + qkv), 2 GV_RESID in one or two rounds' width (the output
// projection), 4 GV_SWIGLU (norm + gate/up), 8 GV_RESID at U 12 (the down projection), 16 GV_GELU.
int gv_one_mask() { return env_int("CT_DECODE_GV_ONE", 31); }
constexpr int gv_one_bit(int mode, int u) {
  return mode == GV_PLAIN ? 1 : mode == GV_RESID ? (u >= 12 ? 8 : 2) : mode == GV_SWIGLU ? 4 : 16;
}
// Whether two blocks of gemv_kernel's one-task form fit a multiprocessor's registers. Compiled
// without the code for further rounds, the form holds more registers than the general one (on
// sm_90 with nvcc 13.0, the Qwen3-0.6B shape's batch-1 GEMVs 79-114 against 56-70; Llama-3.2-1B's
// 2048-wide norm + qkv and norm + gate/up 147 against 94-98); at 147 one block fills a
// multiprocessor and the next kernel's blocks find no room to load their weights early: with the
// form there the Llama-3.2-1B shape decoded 7.5% slower at batch 1, with this check 0.6% faster
// (H100, session 42, bench/results/s42_2026-12-07_H100_3eefe97+s52 and +s54). Asked once per
// instantiation.
template <typename T, int R, int U, int NORM, int MODE> bool gv_one_fits() {
  static int fits = -1;
  if (fits < 0) {
    cudaFuncAttributes a;
    int dev = 0, regs = 65536;
    if (cudaFuncGetAttributes(&a, (const void *)gemv_kernel<T, 1, R, U, NORM, MODE, false>) != cudaSuccess ||
        cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&regs, cudaDevAttrMaxRegistersPerMultiprocessor, dev) != cudaSuccess) {
      cudaGetLastError();
      fits = 0;
    } else {
      fits = 2L * a.numRegs * GV_WARPS * 32 <= (long)regs;
    }
  }
  return fits == 1;
}
template <typename T, int N, int NORM, int MODE, int R, int U>
void gemv_go(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias, const T *res, int nr,
             int IC, int OC, float eps, gv_am am = gv_am{}) {
  if constexpr (MODE != GV_ARGMAX) {
    if (gemv_mma<T, NORM, MODE>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps)) return;
    if (gemv_staged<T, N, NORM, MODE>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps)) return;
  }
  const int tasks = (OC + R - 1) / R;
  unsigned blocks = (unsigned)((tasks + GV_WARPS - 1) / GV_WARPS);
  const unsigned cap = gv_block_cap(); // warps loop over further tasks
  if (blocks > cap) blocks = cap;
  const l2_hint_t h = take_hint();
  // vnorm: 0 the first round's norm, 1 the second's, 2 the second's with the norm weight copied
  // to shared memory first (where that still fits the 48 KB)
  const int vn = !v2_on() ? 0 : NORM && (size_t)(N + gv_np(NORM, 2)) * IC * sizeof(T) <= 48 * 1024 ? 2 : 1;
  const size_t xsb = (size_t)(N + gv_np(NORM, vn)) * IC * sizeof(T);
  auto go = [&](auto k) {
    launch("decode gemv", "gemv_kernel", k, blocks, GV_WARPS * 32, apart_gemv_smem((const void *)k, xsb),
           out, inp, nw, nb, w, bias, res, nr, IC, OC, eps, vn, h.p, h.bytes, am);
  };
  // one row, one round, a task a warp (every GEMV of a batch-1 step but the head): MULTI false,
  // where two of its blocks fit a multiprocessor's registers (gv_one_fits); CT_DECODE_GV_ONE
  // (gv_one_mask) keeps the general form for some or all (for comparisons)
  if constexpr (N == 1 && MODE != GV_ARGMAX) {
    if (IC / 8 <= 32 * U && (long)tasks <= (long)blocks * GV_WARPS &&
        gv_one_fits<T, R, U, NORM, MODE>() && (gv_one_mask() & gv_one_bit(MODE, U))) {
      go(gemv_kernel<T, N, R, U, NORM, MODE, false>);
      gv_one_launches++;
      return;
    }
  }
  go(gemv_kernel<T, N, R, U, NORM, MODE>);
}

// Rows per warp task (R) and 16-byte chunks per lane and round (U): one round covers a row of
// up to 1024 / 2048 values (U = 4 / 8), 3072 with U = 12, more rounds beyond. Wide outputs
// (the vocabulary head) take 4 rows a task, the rest 1 or 2, so even 1024 outputs fill the GPU.
template <typename T, int N, int NORM, int MODE>
void gemv_shape(T *out, const T *inp, const T *nw, const T *nb, const T *w, const T *bias, const T *res,
                int nr, int IC, int OC, float eps) {
  if constexpr (MODE == GV_PLAIN) {
    if (IC <= 1024 && OC >= 16384) gemv_go<T, N, NORM, MODE, 4, 4>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else if (IC <= 1024) gemv_go<T, N, NORM, MODE, 2, 4>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else if (IC <= 2048) gemv_go<T, N, NORM, MODE, 2, 8>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else gemv_go<T, N, NORM, MODE, 1, 12>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
  } else if constexpr (MODE == GV_SWIGLU) {
    // One row, up to 1024 wide: one gate/up pair a task (a warp holds half the weights in
    // registers, so more of the kernel's blocks can be resident beside the kernel before, with
    // their weights loaded before they wait): 1,478 against 1,463 tokens/s at batch 1 on the Qwen3-0.6B shape,
    // twice each, the same ids (bench/results/call45_3e44ff9_r1.txt); the qkv GEMV with one row a
    // task ran slower (1,418). More rows: 2 pairs a task even where 3 would spread the blocks more
    // evenly over the multiprocessors (Qwen3-0.6B: 128 blocks of 3 instead of 192 of 2, 60
    // multiprocessors with two): 3 ran slower, 1,194-1,208 against 1,293 tokens/s at batch 1 on an
    // H200 (bench/results/gpu_decode_swiglu_r3_2026-11-30_2xH200_7f359d9.txt)
    if (N == 1 && IC <= 1024)
      gemv_go<T, N, NORM, MODE, 1, 4>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else if (IC <= 1024) gemv_go<T, N, NORM, MODE, 2, 4>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else if (IC <= 2048) gemv_go<T, N, NORM, MODE, 1, 8>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else gemv_go<T, N, NORM, MODE, 1, 12>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
  } else {
    if (IC <= 1024) gemv_go<T, N, NORM, MODE, 1, 4>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else if (IC <= 2048) gemv_go<T, N, NORM, MODE, 1, 8>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
    else gemv_go<T, N, NORM, MODE, 1, 12>(out, inp, nw, nb, w, bias, res, nr, IC, OC, eps);
  }
}

template <typename T, int NORM, int MODE>
void gemv(void *out, const void *inp, const void *nw, const void *nb, const void *w,
          const void *bias, const void *res, int N, int IC, int OC, float eps) {
  T *o = (T *)out;
  const T *x = (const T *)inp, *g = (const T *)nw, *gb = (const T *)nb, *W = (const T *)w,
          *b = (const T *)bias, *r = (const T *)res;
  if (N > GV_MAXN) { // gemv_fits: the tensor-core GEMV applies
    gemv_mma<T, NORM, MODE>(o, x, g, gb, W, b, r, N, IC, OC, eps);
    return;
  }
  switch (gv_rows(N)) {
  case 1: gemv_shape<T, 1, NORM, MODE>(o, x, g, gb, W, b, r, N, IC, OC, eps); break;
  case 4: gemv_shape<T, 4, NORM, MODE>(o, x, g, gb, W, b, r, N, IC, OC, eps); break;
  default: gemv_shape<T, 8, NORM, MODE>(o, x, g, gb, W, b, r, N, IC, OC, eps); break;
  }
}

// ---- inference norms over whole rows (ops.h rmsnorm_rows_fwd / layernorm_rows_fwd) ----
// rmsnorm_fwd / layernorm_fwd give each row a warp that reads one 2-byte value a lane at a time,
// twice (three times for LayerNorm), each pass waiting on the last: at a decode step of 64 rows
// that took 16.5 us a norm on an H200, two a layer (the profile of call 113 in
// bench/results/call111-116_2026-12-03_H200_rows64). Here a warp holds its row in registers
// (lane l the 16-byte chunks l, l + 32, ..., CH of them), all loads in flight at once, and sums
// from registers: 7.1 us in the same profile (launch and event overhead included), and decode
// tokens/s in call 114, Qwen3-0.6B shape batch 32 / 64 16,435-17,505 / 29,526-29,569 against
// 13,221-13,244 / 23,722-23,866 (the norms before the cuBLAS products from 17 rows), GPT-2 124M
// (its LayerNorms at every batch) batch 1 / 8 / 64 3,533-3,584 / 17,670-17,703 / 76,543-76,997
// against 2,461-2,496 / 11,309-11,453 / 62,384-63,179. CT_DECODE_NORM_ROWS=0: the training ops.
// RMSNorm's sums and products are gv_x_rows's, so a norm here has the bits of the norm inside
// the GEMV (test_decode_cuda).
#define NR_WARPS 4
template <typename T, int CH, bool LN>
__global__ void __launch_bounds__(NR_WARPS * 32)
    norm_rows_kernel(T *out, const T *inp, const T *w, const T *b, int N, int C, float eps) {
  const int row = blockIdx.x * NR_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const int nchunk = C / 8;
  pdl_trigger();
  pdl_wait();
  if (row >= N) return;
  const T *x = inp + (long)row * C;
  float v[CH][8];
#pragma unroll
  for (int k = 0; k < CH; k++) {
    const int c = lane + 32 * k;
    const uint4 u = c < nchunk ? *(const uint4 *)(x + (long)c * 8) : make_uint4(0, 0, 0, 0);
    cvt8<T>(u, v[k]);
  }
  float mean = 0.0f;
  if constexpr (LN) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < CH; k++)
#pragma unroll
      for (int e = 0; e < 8; e++) sum += v[k][e];
    mean = warp_sum(sum) / C;
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < CH; k++)
    if (lane + 32 * k < nchunk)
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const float d = v[k][e] - mean;
        ss = fmaf(d, d, ss);
      }
  const float r = 1.0f / sqrtf(warp_sum(ss) / C + eps);
  T *o = out + (long)row * C;
#pragma unroll
  for (int k = 0; k < CH; k++) {
    const int c = lane + 32 * k;
    if (c >= nchunk) continue;
    float g[8], y[8];
    cvt8<T>(*(const uint4 *)(w + (long)c * 8), g);
    if constexpr (LN) {
      float bb[8];
      cvt8<T>(b ? *(const uint4 *)(b + (long)c * 8) : make_uint4(0, 0, 0, 0), bb);
#pragma unroll
      for (int e = 0; e < 8; e++) y[e] = (v[k][e] - mean) * r * g[e] + bb[e];
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) y[e] = v[k][e] * r * g[e];
    }
    *(uint4 *)(o + (long)c * 8) = pack8<T>(y);
  }
}

// One launch of norm_rows_kernel; false where it does not apply (fp32, a width not a multiple
// of 8 or above 2048, operands not 16-byte aligned): the caller takes the training op.
template <typename T, bool LN>
bool norm_rows(void *out, const void *inp, const void *w, const void *b, int N, int C, float eps) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (C % 8 || C > 2048 || N <= 0 || !aligned16(out) || !aligned16(inp) || !aligned16(w) ||
        (b && !aligned16(b)) || env_off("CT_DECODE_NORM_ROWS"))
      return false;
    const int lanes = (C / 8 + 31) / 32; // chunks a lane
    const unsigned blocks = (unsigned)((N + NR_WARPS - 1) / NR_WARPS);
    auto go = [&](auto k) {
      launch("norm_rows_fwd", "norm_rows_kernel", k, blocks, NR_WARPS * 32, 0, (T *)out,
             (const T *)inp, (const T *)w, (const T *)b, N, C, eps);
    };
    if (lanes <= 1) go(norm_rows_kernel<T, 1, LN>);
    else if (lanes <= 2) go(norm_rows_kernel<T, 2, LN>);
    else if (lanes <= 4) go(norm_rows_kernel<T, 4, LN>);
    else go(norm_rows_kernel<T, 8, LN>);
    return true;
  }
}

template <typename T>
void cu_rmsnorm_rows_fwd(void *out, const void *inp, const void *w, int N, int C, float eps) {
  if (!norm_rows<T, false>(out, inp, w, NULL, N, C, eps))
    base<T>()->rmsnorm_fwd(out, NULL, inp, w, N, C, N, 0, eps);
}
template <typename T>
void cu_layernorm_rows_fwd(void *out, const void *inp, const void *w, const void *b, int N, int C,
                           float eps) {
  if (!norm_rows<T, true>(out, inp, w, b, N, C, eps))
    base<T>()->layernorm_fwd(out, NULL, NULL, inp, w, b, N, C, eps);
}

// ---- decode products for 9-64 rows: the weights as the tensor cores' A operand ----
// Past 16 rows the tensor-core GEMV above loses to cuBLAS: its A operand is the input rows, so
// each 16-byte weight load feeds 2 MT mmas while every warp reloads all rows' inputs from shared
// memory (8x the weight bytes at 64 rows) and every 8-output block stages all of them. cuBLAS in
// turn picks tiles for a few dozen rows that leave most multiprocessors idle (the down
// projection 64x3072x1024 at ~0.25 TB/s). gemm_rows_kernel turns the product around: A is 16
// weight rows (outputs), B 8 input rows, so a warp's weight loads feed NT mmas each and its input
// reads from shared memory are NT / 2 times its weight bytes. Thread (g = lane / 4, t4 = lane % 4)
// loads 16 bytes of weight rows g and g + 8 and of input row g at k = 32 kb + 8 t4 .. + 7 and
// hands them to two mmas as their k positions 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 (the permutation
// of gemv_mma_kernel: the same for both operands, so each dot product is unchanged).
// A warp takes 32 weight rows (two 16-row tiles; GV_SWIGLU: 16 gate rows and their 16 up rows)
// over a block's slice of the k range, GR_U k blocks a round, two rounds of weights in flight
// (the first two loaded before the kernel waits on the one before). The blocks of a cluster (up to
// GR_KSMAX) take the slices of k of the same outputs; their fp32 partials meet in shared memory and every
// block of the cluster sums a share of the outputs over the cluster's blocks in slice order
// (distributed shared memory), then applies the bias, residual, GELU or SwiGLU at the GEMV's
// rounding points. So an output's arithmetic depends only on its own input row and on the shape
// (the slices are chosen by IC and OC, never by the row count): a row gives the same bits in any
// batch of 9-64 rows. Opt-in (CT_DECODE_GR=1; otherwise cuBLAS and the split-K partials below):
// STATUS (H200, 2026-12-03, bench/results/call119-123_2026-12-03_H200_gemm_rows): correct (the
// CPU within tolerance, the same bits in a batch of 17), and slower than cuBLAS + split-K at 24-64
// rows. The Qwen3-0.6B shape's products at 64 rows, graph-replayed with cold weights
// (test_decode_cuda CT_TEST_PERF=only; in us, with the norm where there is one; the default path
// in brackets): qkv 9.1 [7.2], o 11.5 [5.5], gate/up 14.2 [10.0], down 10.3 [6.0]; decode at batch
// 64 25,870-25,904 against 31,315-31,505 tokens/s, GPT-2 124M 65,835 against 79,576. Ending the
// kernel early (CT_DECODE_GR_STOP=2: after the weights' and the input's loads; =3: after the mmas)
// puts the time in phases, 64 rows: qkv 5.3 / 7.0 / 9.1, o 3.8 / 5.6 / 11.5, down 4.2 / 7.5 /
// 10.3, gate/up 6.0 / 11.8 / 14.2. So the cross-block sum costs 2-6 us (the 8-block clusters
// most: two cluster barriers, the distributed shared-memory round trip, the residual's loads after
// it), and the phases run one after another in one block a multiprocessor (~170 registers a
// thread), with nothing to overlap them; cuBLAS's pipelined tiles do. The first version, with
// one mma after another on the same accumulator and one DSMEM round trip per block and output,
// was twice as slow again (calls 119-120). What to try next: the residual and bias loads before
// the cluster barrier, partials through L2 so a block need not wait for the others to read its
// own, fewer slices with more blocks a multiprocessor (fewer registers: one weight round in
// flight), or wgmma with the weights as A from shared memory (TMA).
// CT_DECODE_GR_KS=k forces k slices (1, 2, 4 or 8 where IC allows); CT_DECODE_GR_WPB=w blocks
// of w warps (2, 4 or 8; default 8); CT_DECODE_GR_WK=g: the block's warps in g groups that split
// its slice again (default 4, fewer where the slice does not divide), their sums added in shared
// memory before the cluster's.
#define GR_MAXN 64 // rows at most (NT = 8 tiles of 8)
#define GR_U 2     // 32-wide k blocks a round
#define GR_KSMAX 8 // slices (blocks of a cluster) at most
#define GR_SMEM_MAX (200 * 1024)

template <typename T, int NT, int MODE>
__global__ void __launch_bounds__(256)
    gemm_rows_kernel(T *out, const T *inp, const T *w, const T *bias, const T *res, int nr, int IC,
                     int OC, int kslice, int wk, int stop) {
#ifdef _CG_HAS_CLUSTER_GROUP // sm_90 and up (the host launches it only there: gemm_rows)
  namespace cg = cooperative_groups;
  constexpr int MT = 2;                         // 16-row weight tiles a warp
  constexpr int S = MODE == GV_SWIGLU ? 2 : 1;  // weight rows an output: gate and up, or one
  extern __shared__ uint4 gv_smem[];
  T *xs = (T *)gv_smem;         // the input slice: 8 NT rows of kslice + 32 values
  float *red = (float *)gv_smem; // then the partials: wk planes of 8 NT rows of 32 wo + 4 floats
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  // warp = (wi, kg): output group wi of wo, k group kg of wk (a wk-th of the block's slice)
  const int wo = (blockDim.x >> 5) / wk, wi = warp / wk, kg = warp - wi * wk;
  const int XS = kslice + 32, RW = 32 * wo + 4, kw = kslice / wk, plane = 8 * NT * RW;
  const int k0 = blockIdx.x * kslice + kg * kw, rounds = kw / (32 * GR_U);
  const int obase = (blockIdx.y * wo + wi) * (32 / S); // this warp's first output
  const T *wr[MT][2];
  bool ok[MT][2];
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int o = obase + (S == 2 ? 0 : 16 * m) + g + 8 * h;
      ok[m][h] = o < OC;
      wr[m][h] = w + (long)(S == 2 && m ? OC + o : (ok[m][h] ? o : 0)) * IC + k0 + t4 * 8;
    }
  uint4 wa[MT][2][GR_U], wb[MT][2][GR_U];
  auto load = [&](uint4 (&d)[MT][2][GR_U], int r) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int u = 0; u < GR_U; u++)
          d[m][h][u] = ok[m][h] ? ld_stream(wr[m][h] + (long)(r * GR_U + u) * 32) : make_uint4(0, 0, 0, 0);
  };
  // the weights do not depend on the kernel before: the first two rounds go out while it finishes
  load(wa, 0);
  if (rounds > 1) load(wb, 1);
  pdl_trigger();
  pdl_wait();
  const int cpr = kslice / 8; // 16-byte chunks of a row's slice
  for (int i = threadIdx.x; i < 8 * NT * cpr; i += blockDim.x) {
    const int n = i / cpr, c = i - n * cpr;
    T *d = xs + (long)n * XS + c * 8;
    if (n < nr) cp_async16(d, inp + (long)n * IC + blockIdx.x * kslice + c * 8);
    else *(uint4 *)d = make_uint4(0, 0, 0, 0);
  }
  cp_async_wait_all();
  __syncthreads();
  if (stop == 2) { // a measurement (CT_DECODE_GR_STOP): the weights' and the input's loads only
    uint32_t z = 0;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int u = 0; u < GR_U; u++) z ^= wa[m][h][u].x ^ (rounds > 1 ? wb[m][h][u].y : 0u);
    if (z == 0x9e3779b9u) out[0] = xs[threadIdx.x];
    return;
  }
  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[m][j][i] = 0.0f;
  const T *xr = xs + (long)g * XS + kg * kw + t4 * 8;
  // a k block's inputs first, then its 2 MT NT mmas with no two in a row on one accumulator
  // (the mmas are asm volatile: the compiler keeps their order, and each waits for the one
  // before on its accumulator)
  auto mul_round = [&](const uint4 (&wv)[MT][2][GR_U], int r) {
#pragma unroll
    for (int u = 0; u < GR_U; u++) {
      const int kb = r * GR_U + u;
      uint4 xv[NT];
#pragma unroll
      for (int j = 0; j < NT; j++) xv[j] = *(const uint4 *)(xr + (long)j * 8 * XS + kb * 32);
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int m = 0; m < MT; m++)
          mma16816<T>(acc[m][j], wv[m][0][u].x, wv[m][1][u].x, wv[m][0][u].y, wv[m][1][u].y,
                      xv[j].x, xv[j].y);
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int m = 0; m < MT; m++)
          mma16816<T>(acc[m][j], wv[m][0][u].z, wv[m][1][u].z, wv[m][0][u].w, wv[m][1][u].w,
                      xv[j].z, xv[j].w);
    }
  };
  // two register buffers, alternated without copies (a copy would wait for the loads)
  for (int r = 0; r < rounds; r += 2) {
    mul_round(wa, r);
    if (r + 2 < rounds) load(wa, r + 2);
    if (r + 1 < rounds) {
      mul_round(wb, r + 1);
      if (r + 3 < rounds) load(wb, r + 3);
    }
  }
  if (stop == 3) { // a measurement: no partial sums across the cluster
    if (acc[0][0][0] == 1.2345f) out[0] = inp[0];
    return;
  }
  __syncthreads(); // the partials take the input's shared memory
  // c[0], c[1]: weight row g of tile m, input rows 8 j + 2 t4 and + 1; c[2], c[3]: weight row g + 8
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int j = 0; j < NT; j++) {
      float *p = red + (long)kg * plane + (long)(8 * j + 2 * t4) * RW + wi * 32 + m * 16 + g;
      p[0] = acc[m][j][0];
      p[RW] = acc[m][j][1];
      p[8] = acc[m][j][2];
      p[RW + 8] = acc[m][j][3];
    }
  // the k groups' partials summed into plane 0, in group order
  if (wk > 1) {
    __syncthreads();
    for (int i = threadIdx.x; i < nr * (RW / 4); i += blockDim.x) {
      float4 *d = (float4 *)red + i;
      float4 a = *d;
      for (int q = 1; q < wk; q++) {
        const float4 b = *(const float4 *)(red + (long)q * plane + 4 * i);
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      }
      *d = a;
    }
  }
  const int ks = gridDim.x;
  cg::cluster_group cl = cg::this_cluster();
  if (ks > 1) cl.sync();
  else __syncthreads();
  // 4 outputs a thread at a time: every block's 16 bytes of them read at once (a distributed
  // shared-memory round trip, not one per block), then summed in block order
  const int bo = wo * (32 / S), q4 = bo / 4; // outputs a block, and in fours
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < nr * q4; e += ks * blockDim.x) {
    const int n = e / q4, of = (e - n * q4) * 4, o = blockIdx.y * bo + of;
    if (o >= OC) continue;
    const int ri = n * RW + (S == 2 ? (of >> 4) * 32 + (of & 15) : of);
    float4 pv[GR_KSMAX], pu[S == 2 ? GR_KSMAX : 1];
#pragma unroll
    for (int p = 0; p < GR_KSMAX; p++)
      if (p < ks) {
        const float *rp = ks > 1 ? cl.map_shared_rank(red, (unsigned)p) : red;
        pv[p] = *(const float4 *)(rp + ri);
        if (S == 2) pu[S == 2 ? p : 0] = *(const float4 *)(rp + ri + 16);
      }
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f}, up[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int p = 0; p < GR_KSMAX; p++)
      if (p < ks) {
        v[0] += pv[p].x, v[1] += pv[p].y, v[2] += pv[p].z, v[3] += pv[p].w;
        if (S == 2) {
          const float4 &q = pu[S == 2 ? p : 0];
          up[0] += q.x, up[1] += q.y, up[2] += q.z, up[3] += q.w;
        }
      }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int oi = o + i;
      if (oi >= OC) break;
      T *dst = out + (long)n * OC + oi;
      if constexpr (MODE == GV_SWIGLU) {
        const float gt = rounded<T>(v[i]), u = rounded<T>(up[i]);
        stf(dst, gt / (1.0f + expf(-gt)) * u);
      } else {
        float y = v[i] + (bias ? ldf(bias + oi) : 0.0f);
        if (MODE == GV_RESID) y = rounded<T>(y) + ldf(res + (long)n * OC + oi);
        if (MODE == GV_GELU) y = gv_gelu(rounded<T>(y));
        stf(dst, y);
      }
    }
  }
  if (ks > 1) cl.sync(); // the other blocks may still read this block's partials
#else
  __trap();
#endif
}

long gr_launches; // gemm_rows_kernel launches (tests)
// The slices of IC a cluster splits (each a multiple of unit): CT_DECODE_GR_KS, else the most
// (1, 2, 4, 8) whose blocks still run at once, one a multiprocessor (a block holds ~170 registers
// a thread), else the fewest; 0 where none divides IC.
int gr_slices(int IC, int tiles, int unit) {
  const char *v = getenv("CT_DECODE_GR_KS");
  if (v) {
    const int k = atoi(v);
    return k >= 1 && k <= GR_KSMAX && IC % (unit * k) == 0 ? k : 0;
  }
  int best = 0;
  for (int k = 1; k <= GR_KSMAX; k *= 2)
    if (IC % (unit * k) == 0 && (!best || (long)tiles * k <= num_sms())) best = k;
  return best;
}

// One launch of gemm_rows_kernel for out(N, OC) (GV_SWIGLU: OC is F, w has 2F rows); false where it
// does not apply (the caller takes the path before it): not 16-bit, not asked for (CT_DECODE_GR=1), more
// than GR_MAXN rows, before sm_90 (clusters), IC not a multiple of 64, unaligned operands, or
// outputs as wide as a vocabulary (cuBLAS streams the head well).
template <typename T, int MODE>
bool gemm_rows(void *out, const void *inp, const void *w, const void *bias, const void *res, int N,
               int IC, int OC) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (N < 1 || N > GR_MAXN || OC > 16384 || !env_on("CT_DECODE_GR") || cc_major() < 9) return false;
    if (!aligned16(inp) || !aligned16(w) || !aligned16(out)) return false;
    const int S = MODE == GV_SWIGLU ? 2 : 1;
    const char *wv = getenv("CT_DECODE_GR_WPB"), *kv = getenv("CT_DECODE_GR_WK");
    int wpb = wv ? atoi(wv) : 8;
    if (wpb != 2 && wpb != 4) wpb = 8;
    // the shared memory of the most rows decides whether a shape applies, so that a row takes
    // this kernel (and its bits) at every row count
    int wk = 0, ks = 0, tiles = 0;
    auto smem_of = [&](int nt) {
      const size_t xsb = (size_t)8 * nt * (IC / ks + 32) * sizeof(T);
      const size_t rb = (size_t)wk * 8 * nt * (32 * (wpb / wk) + 4) * sizeof(float);
      return xsb > rb ? xsb : rb;
    };
    // k groups a block: CT_DECODE_GR_WK, else the most (4, 2, 1) the slices allow
    for (int c = kv ? atoi(kv) : 4; c >= 1; c /= 2) {
      if (wpb % c) continue;
      wk = c;
      const int bo = wpb / wk * 32 / S;
      tiles = (OC + bo - 1) / bo;
      ks = gr_slices(IC, tiles, 32 * GR_U * wk);
      if ((ks && smem_of(GR_MAXN / 8) <= GR_SMEM_MAX) || kv) break;
      ks = 0;
    }
    if (!ks || smem_of(GR_MAXN / 8) > GR_SMEM_MAX) return false;
    const int nt = N <= 16 ? 2 : N <= 32 ? 4 : 8, kslice = IC / ks;
    const size_t smem = smem_of(nt);
    const char *sv = getenv("CT_DECODE_GR_STOP"); // a measurement: 2 / 3 end after the loads / the mmas
    const int stop = sv ? atoi(sv) : 0;
    auto go = [&](auto k) {
      if (!raise_smem((const void *)k, GR_SMEM_MAX)) return false;
      if (!launch_cl("decode gemm_rows", "gemm_rows_kernel", k, dim3(ks, tiles), wpb * 32, smem,
                     (unsigned)ks, (T *)out, (const T *)inp, (const T *)w, (const T *)bias,
                     (const T *)res, N, IC, OC, kslice, wk, stop))
        return true; // reported; the op failed rather than run twice
      gr_launches++;
      return true;
    };
    if (nt == 2) return go(gemm_rows_kernel<T, 2, MODE>);
    if (nt == 4) return go(gemm_rows_kernel<T, 4, MODE>);
    return go(gemm_rows_kernel<T, 8, MODE>);
  }
}

template <typename T>
void cu_norm_matmul_fwd(void *out, void *ln, const void *inp, const void *nw, const void *w,
                        const void *bias, int N, int IC, int OC, float eps) {
  if (N <= 0 || OC <= 0) return;
  if constexpr (sizeof(T) == 2) {
    if (gemv_fits<T>(N, IC, inp, w, nw)) {
      gemv<T, GV_RMS, GV_PLAIN>(out, inp, nw, NULL, w, bias, NULL, N, IC, OC, eps);
      return;
    }
  }
  cu_rmsnorm_rows_fwd<T>(ln, inp, nw, N, IC, eps);
  if (gemm_rows<T, GV_PLAIN>(out, ln, w, bias, NULL, N, IC, OC)) return;
  base<T>()->matmul_fwd(out, ln, w, bias, N, IC, OC);
}

// norm_matmul_argmax (ops.h): the head GEMV of one row with the argmax in its tail (GV_ARGMAX), so
// a batch-1 decode step ends without the argmax kernel, which only read the logits back (its
// release to the id stored took ~3 us on an H100, beside the kernel boundary before it). The
// head's shapes of gemv_shape (R 4 / 2, U 4 / 8: one round of a row up to 2048 wide). 1 where it
// does not apply: CT_DECODE_HEAD_ARGMAX=0, another row count or table, the shapes, more blocks
// than the merge takes, or a scratch buffer that would grow during a capture; and by default
// outside a graph capture. Read at every call.
// Only in graphs by default (CT_DECODE_HEAD_ARGMAX=1 everywhere): with CUDA graphs it runs even
// with the two kernels, without them the two kernels decode faster, the same ids either way (H100,
// batch 1, Qwen3-0.6B shape, --cuda_graphs off: 905-930 against 1,110-1,228 tokens/s in session 38,
// 901-1,007 against 1,157-1,169 in session 41; bench/results/s41_2026-12-07_H100_e5e30a5+pf). Why
// is not known: the op profile (events around every kernel) times the two ways alike. The scratch
// is grown either way, so the uncaptured step before a capture leaves it big enough.
long head_argmax_launches; // GV_ARGMAX launches (tests)
template <typename T>
int cu_norm_matmul_argmax(void *logits, const void *inp, const void *nw, const void *w, int IC,
                          int OC, float eps, int32_t *out, int32_t *tok, int32_t *pos,
                          int32_t *hid, int V) {
  if constexpr (sizeof(T) != 2) {
    return 1;
  } else {
    if (env_off("CT_DECODE_HEAD_ARGMAX") || !v2_on() || !gemv_fits<T>(1, IC, inp, w, nw) ||
        IC > 2048 || OC <= 0 || V <= 0 || V > OC || !out || !logits ||
        gv_block_cap() > GV_AM_MAX_BLOCKS)
      return 1;
    char *buf = (char *)grow_scratch(split_bufs, SPLIT_COUNT_BYTES + (size_t)GV_AM_MAX_BLOCKS * 8,
                                     SPLIT_COUNT_BYTES, "norm_matmul_argmax", true);
    if (!buf || (!env_on("CT_DECODE_HEAD_ARGMAX") && !stream_capturing())) return 1;
    float *pv = (float *)(buf + SPLIT_COUNT_BYTES);
    gv_am am{out, tok, pos, hid, pv, (int *)(pv + GV_AM_MAX_BLOCKS),
             (unsigned *)(buf + SPLIT_COUNT_BYTES) - ARGMAX_MAX_ROWS, V};
    T *o = (T *)logits;
    const T *x = (const T *)inp, *g = (const T *)nw, *W = (const T *)w;
    if (IC <= 1024)
      gemv_go<T, 1, GV_RMS, GV_ARGMAX, 4, 4>(o, x, g, NULL, W, NULL, NULL, 1, IC, OC, eps, am);
    else
      gemv_go<T, 1, GV_RMS, GV_ARGMAX, 2, 8>(o, x, g, NULL, W, NULL, NULL, 1, IC, OC, eps, am);
    if (cudaPeekAtLastError() != cudaSuccess) return -1;
    head_argmax_launches++;
    return 0;
  }
}

template <typename T>
void cu_norm_matmul_swiglu_fwd(void *act, void *pre, void *ln, const void *inp, const void *nw,
                               const void *w, int N, int IC, int F, float eps) {
  if (N <= 0 || F <= 0) return;
  if constexpr (sizeof(T) == 2) {
    if (gemv_fits<T>(N, IC, inp, w, nw)) {
      gemv<T, GV_RMS, GV_SWIGLU>(act, inp, nw, NULL, w, NULL, NULL, N, IC, F, eps);
      return;
    }
  }
  const ct_ops *b = base<T>();
  cu_rmsnorm_rows_fwd<T>(ln, inp, nw, N, IC, eps);
  if (gemm_rows<T, GV_SWIGLU>(act, ln, w, NULL, NULL, N, IC, F)) return;
  b->matmul_fwd(pre, ln, w, NULL, N, IC, 2 * F);
  b->swiglu_fwd(act, pre, N, F);
}

// Split-K residual products: the residual products the GEMV does not take, from SPLITK_MIN_ROWS
// to SPLITK_MAX_ROWS rows, as SPLITK_SLICES fp32 partials over slices of IC (ct_cuda_splitk_gemm:
// s times cuBLAS's thread blocks for a few dozen rows, where its own choice for the down
// projection at 64 rows reads the weights at ~0.25 TB/s), summed in slice order by
// splitk_add_kernel with the bias and the residual: the GEMV's rounding points (the product + bias
// rounded, then the residual added). CT_DECODE_SPLITK=s (2-16) takes s slices at every row count
// past the GEMV, =0 none.
// Measured (H200, bench/results/call117-118_*): +5.4-5.5% at 64 rows on the Qwen3-0.6B shape,
// +2.9-3.2% at 96, +1.4-1.6% at 128, GPT-2 124M +4.2-4.3% / +2.3-3.3% / +2.5-2.7%; at 32 rows it
// was even to 16% slower (call 115), 8 slices at 256 rows 3% slower (call 117). cuBLAS's first use
// of these products in a process costs ~45 ms (call 116); the inference engine runs them once at
// its full batch when it is made (trainer/model.c, infer_warm), so that cost is in its setup.
#define SPLITK_MIN_ROWS 64
#define SPLITK_MAX_ROWS 128
#define SPLITK_SLICES 8
grow_buf skbufs[16];
long splitk_launches; // splitk_add_kernel launches (tests)
float *splitk_scratch(size_t bytes) { return grow_scratch(skbufs, bytes, 0, "matmul_add_fwd", true); }
template <typename T>
__global__ void splitk_add_kernel(T *out, const float *P, const T *bias, const T *res, long n,
                                  int OC, int s) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = 0.0f;
  for (int j = 0; j < s; j++) v += P[(long)j * n + i];
  if (bias) v += ldf(bias + i % OC);
  stf(out + i, rounded<T>(v) + ldf(res + i));
}
template <typename T>
bool splitk_add(void *out, const void *inp, const void *w, const void *bias, const void *res, int N,
                int IC, int OC) {
  const char *v = getenv("CT_DECODE_SPLITK");
  const int s = v ? atoi(v) : N >= SPLITK_MIN_ROWS && N <= SPLITK_MAX_ROWS ? SPLITK_SLICES : 0;
  if (s < 2 || s > 16 || IC % (8 * s)) return false;
  const long n = (long)N * OC;
  float *P = splitk_scratch((size_t)s * n * sizeof(float));
  if (!P) return false;
  if (ct_cuda_splitk_gemm(P, inp, w, N, IC, OC, s, std::is_same<T, f16>::value) != 0) return true;
  splitk_add_kernel<T><<<blocks_for((size_t)n, 256), 256, 0, stream()>>>(
      (T *)out, P, (const T *)bias, (const T *)res, n, OC, s);
  if (CKD_LAUNCH("matmul_add_fwd", splitk_add_kernel)) splitk_launches++;
  return true;
}

template <typename T>
void cu_matmul_add_fwd(void *out, const void *inp, const void *w, const void *bias,
                       const void *res, int N, int IC, int OC) {
  if (N <= 0 || OC <= 0) return;
  if constexpr (sizeof(T) == 2) {
    if (gemv_fits<T>(N, IC, inp, w)) {
      gemv<T, GV_NONORM, GV_RESID>(out, inp, NULL, NULL, w, bias, res, N, IC, OC, 0.0f);
      return;
    }
    if (gemm_rows<T, GV_RESID>(out, inp, w, bias, res, N, IC, OC)) return;
    if (splitk_add<T>(out, inp, w, bias, res, N, IC, OC)) return;
  }
  const ct_ops *b = base<T>();
  b->matmul_fwd(out, inp, w, bias, N, IC, OC);
  b->add_fwd(out, out, res, (size_t)N * OC);
}

// ops.h matmul_rows_fwd: out(N,OC) = inp @ w^T + bias through the decode GEMV (gemv_kernel or
// gemv_mma_kernel, its arithmetic depending only on the output's own row) where it
// applies, else matmul_fwd (cuBLAS). The products of a decode step that have no fusion (GPT-2's
// LayerNorm + GELU layers) and the head after a LayerNorm come here.
template <typename T>
void cu_matmul_rows_fwd(void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                        int OC) {
  if (N <= 0 || OC <= 0) return;
  if constexpr (sizeof(T) == 2) {
    if (gemv_fits<T>(N, IC, inp, w)) {
      gemv<T, GV_NONORM, GV_PLAIN>(out, inp, NULL, NULL, w, bias, NULL, N, IC, OC, 0.0f);
      return;
    }
    if (gemm_rows<T, GV_PLAIN>(out, inp, w, bias, NULL, N, IC, OC)) return;
  }
  base<T>()->matmul_fwd(out, inp, w, bias, N, IC, OC);
}

// ops.h layernorm_matmul_fwd: GPT-2's norm + qkv projection and norm + fc (+ GELU) of a decode
// step as one GEMV (its layer norm in the GEMV's prologue, every block norming its rows: a kernel
// boundary less each), where the GEMV applies; else layernorm_rows_fwd into ln, then the product.
template <typename T>
void cu_layernorm_matmul_fwd(void *out, void *pre, void *ln, const void *inp, const void *nw,
                             const void *nb, const void *w, const void *bias, int N, int IC,
                             int OC, int gelu, float eps);
// ops.h matmul_gelu_rows_fwd: act(N,OC) = gelu(inp @ w^T + bias), the GEMV with a GELU epilogue
// where it applies, else matmul_fwd + gelu_fwd (pre holds the product then).
template <typename T>
void cu_matmul_gelu_rows_fwd(void *act, void *pre, const void *inp, const void *w,
                             const void *bias, int N, int IC, int OC) {
  if (N <= 0 || OC <= 0) return;
  if constexpr (sizeof(T) == 2) {
    if (gemv_fits<T>(N, IC, inp, w)) {
      gemv<T, GV_NONORM, GV_GELU>(act, inp, NULL, NULL, w, bias, NULL, N, IC, OC, 0.0f);
      return;
    }
    if (gemm_rows<T, GV_GELU>(act, inp, w, bias, NULL, N, IC, OC)) return;
  }
  const ct_ops *b = base<T>();
  b->matmul_fwd(pre, inp, w, bias, N, IC, OC);
  b->gelu_fwd(act, pre, (size_t)N * OC);
}

template <typename T>
void cu_layernorm_matmul_fwd(void *out, void *pre, void *ln, const void *inp, const void *nw,
                             const void *nb, const void *w, const void *bias, int N, int IC,
                             int OC, int gelu, float eps) {
  if (N <= 0 || OC <= 0) return;
  if constexpr (sizeof(T) == 2) {
    // IC up to 2048: where layernorm_rows_fwd has its own kernel (the same sums, so both ways
    // give the same bits) and a warp holds a row in registers. Up to 16 rows: every block norms
    // all the rows again, which from 32 rows costs more than the launch it saves. GPT-2 124M,
    // H200, bf16, 128 + 256 tokens, decode tokens/s fused / composed (CT_DECODE_LNMM=0), twice
    // each (bench/results/call128-130_2026-12-04_H200_gpt2_lnmm): batch 1 3,844 3,841 / 3,889
    // 3,832, 8 18,490 18,507 / 18,220 18,204, 16 31,301 31,387 / 30,072 30,016, 32 53,567 53,830
    // / 54,007 54,295, 64 92,458 92,664 / 93,080 94,469; with this 16-row limit (call 130)
    // batch 8 18,527 18,453 / 18,095 18,121, 16 31,428 31,330 / 29,913 29,958, the same ids
    // (--print_ids, batches 4 and 12) and Qwen3 / Llama unchanged. Reading the row three
    // times from L2 instead of once, the fused GEMV lost 8% at batch 1 (3,550 against 3,891).
    if (N <= 16 && IC <= 2048 && gemv_fits<T>(N, IC, inp, w, nw) && aligned16(nb) &&
        !env_off("CT_DECODE_LNMM")) {
      if (gelu) gemv<T, GV_LAYER, GV_GELU>(out, inp, nw, nb, w, bias, NULL, N, IC, OC, eps);
      else gemv<T, GV_LAYER, GV_PLAIN>(out, inp, nw, nb, w, bias, NULL, N, IC, OC, eps);
      return;
    }
  }
  cu_layernorm_rows_fwd<T>(ln, inp, nw, nb, N, IC, eps);
  if (gelu) cu_matmul_gelu_rows_fwd<T>(out, pre, ln, w, bias, N, IC, OC);
  else cu_matmul_rows_fwd<T>(out, ln, w, bias, N, IC, OC);
}

template <typename T>
void cu_qkv_rope_append(void *qkv, const void *raw, const void *qnw, const void *knw, void *kc,
                        void *vc, const int32_t *slot, const int32_t *pos, int N, int H, int KV,
                        int hd, int max_T, float theta, float eps) {
  if (N <= 0) return;
  if constexpr (sizeof(T) == 2) {
    if (gemv_on() && (hd == 64 || hd == 128 || hd == 256) && H % KV == 0) {
      const int nh = H + 2 * KV, threads = 32 * (nh < 32 ? nh : 32);
      T *q = (T *)qkv, *K = (T *)kc, *V = (T *)vc;
      const T *r = (const T *)raw, *gq = (const T *)qnw, *gk = (const T *)knw;
      const l2_hint_t h = take_hint(true);
      if (hd == 64)
        launch("qkv_rope_append", "qkv_rope_append_kernel", qkv_rope_append_kernel<T, 2>, N,
               threads, 0, q, r, gq, gk, K, V, slot, pos, H, KV, max_T, theta, eps,
               (int)v2_on(), h.p, h.bytes);
      else if (hd == 128)
        launch("qkv_rope_append", "qkv_rope_append_kernel", qkv_rope_append_kernel<T, 4>, N,
               threads, 0, q, r, gq, gk, K, V, slot, pos, H, KV, max_T, theta, eps,
               (int)v2_on(), h.p, h.bytes);
      else
        launch("qkv_rope_append", "qkv_rope_append_kernel", qkv_rope_append_kernel<T, 8>, N,
               threads, 0, q, r, gq, gk, K, V, slot, pos, H, KV, max_T, theta, eps,
               (int)v2_on(), h.p, h.bytes);
      return;
    }
  }
  const ct_ops *b = base<T>();
  const size_t ab = sizeof(T), W = (size_t)(H + 2 * KV) * hd, row = W * ab;
  char *out = (char *)qkv;
  const char *in = (const char *)raw;
  if (qnw) {
    const size_t v0 = (size_t)(H + KV) * hd;
    if (out != in) b->copy2d(out + v0 * ab, row, in + v0 * ab, row, (size_t)KV * hd * ab, (size_t)N);
    b->rmsnorm_fwd(out, NULL, in, qnw, N * H, hd, H, (long)W, eps);
    b->rmsnorm_fwd(out + (size_t)H * hd * ab, NULL, in + (size_t)H * hd * ab, knw, N * KV, hd, KV,
                   (long)W, eps);
  } else if (out != in) {
    b->copy2d(out, row, in, row, row, (size_t)N);
  }
  b->rope_pos_fwd(qkv, pos, N, H, KV, hd, theta);
  b->kv_append(kc, vc, qkv, slot, pos, N, H, KV, hd, max_T);
}

// ---------------------------------------------------------------------------------------------
// devices and graphs

int cu_device_count() { return ct_cuda_backend_devices(); }

int cu_set_device(int dev) { return ct_cuda_use_device(dev); }

int cu_device_memory(int dev, size_t *free_bytes, size_t *total_bytes) {
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess || cudaSetDevice(ct_cuda_physical_device(dev)) != cudaSuccess) {
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
  dst_dev = ct_cuda_physical_device(dst_dev); // the GPUs (CT_CUDA_VIRTUAL_DEVICES: one may
  src_dev = ct_cuda_physical_device(src_dev); // hold several devices)
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

void *cu_host_alloc_mapped(size_t bytes, void **dev) {
  void *p = NULL;
  *dev = NULL;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  if (cudaHostGetDevicePointer(dev, p, 0) != cudaSuccess) {
    cudaGetLastError();
    cudaFreeHost(p);
    *dev = NULL;
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

void *cu_event_new() {
  cudaEvent_t ev = NULL;
  return CKD("event_new", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) ? (void *)ev : NULL;
}
void cu_event_record(void *ev) { CKD("event_record", cudaEventRecord((cudaEvent_t)ev, stream())); }
void cu_event_wait(void *ev) { CKD("event_wait", cudaEventSynchronize((cudaEvent_t)ev)); }
void cu_event_free(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

// attention_decode_rope runs its one kernel for up to FA_MAX_ROWS rows: bit-identical to the two
// kernels and faster at batch 1 (1,218 against 1,176 tokens/s on the Qwen3-0.6B shape, H200,
// bench/results/gpu_next_decode_2026-11-30_2xH200_0bb99f2.txt), as fast at 8 and slower at 64
// (20,971 against 23,969: its grid has a block per (split group, kv head, row)).
// CT_DECODE_FUSED_ATT=1 / =0 force it on / off at any row count. Read at every call, so a test
// can compare both paths in one process.
#define FA_MAX_ROWS 8
bool fused_att_on(int N) { return env_switch("CT_DECODE_FUSED_ATT", N <= FA_MAX_ROWS); }
long fa_launches; // attention_decode_rope kernels launched (or recorded into a graph)
// attention_decode_rope merges within a thread block cluster where a (row, kv head) has 2 to 8
// blocks, on devices that have clusters (compute capability 9 and up), unless CT_DECODE_CLUSTER=0.
// Bit-identical to the counter merge and faster on an H200: 1,355 against 1,280 tokens/s at batch
// 1, 4,386 against 4,250 at 8 on the Qwen3-0.6B shape
// (bench/results/gpu_next_new_2026-11-30_2xH200_0f6490c.txt). Read at every call.
bool cluster_on() {
  const char *v = getenv("CT_DECODE_CLUSTER");
  if (v && !strcmp(v, "0")) return false;
  return cc_major() >= 9;
}
long cluster_launches; // of them, launched as clusters
long alone_launches;   // of them, alone on their multiprocessors (att_pad)
// Tried and taken out (f528c9f, bench/results/call72_f528c9f): each split pushing its rows into
// block 0's shared memory (block 0 merges locally, the other blocks leave after one barrier) and
// the q / k norm weights loaded into shared memory before the wait: bit-identical and no faster
// (1,455-1,465 against 1,476-1,481 tokens/s at batch 1); the merge phase stayed ~1.7 us, so
// reading the other blocks' shared memory was not its cost.

// attention_decode_oproj (ops.h): the output projection inside the cluster attention kernel, so
// a layer's step has one kernel boundary fewer (oproj_tail). Correct on an H200 (test_decode_cuda:
// logits equal to the separate projection's, graphs equal to no graphs; generate_gpu.sh; the same
// greedy tokens on the Qwen3-0.6B shape) but slower there: batch-1 decode 1,145-1,151 tokens/s
// against 1,361-1,362, batch 8 3,457-3,460 against 4,381-4,386 (bench/results/call30_3dc83bd.txt;
// without the largest carveout 1,109). At batch 8 every row's cluster copies its kv head's
// projection columns again (8 x 4.2 MB); at batch 1 the cluster barriers, the counter and the last
// cluster's sum cost more on the attention kernel's critical path than the projection's own
// kernel did. So it stays opt-in (CT_DECODE_OPROJ=1), read at every call.
bool oproj_on() {
  const char *v = getenv("CT_DECODE_OPROJ");
  return v && !strcmp(v, "1");
}
long oproj_launches; // attention kernels launched with the output projection
#define OP_SMEM_MAX (160 * 1024)
// The OP kernel's dynamic shared memory limit raised to OP_SMEM_MAX, once per kernel and device.
bool smem_raised(const void *k) {
  static kernel_list done;
  bool in;
  const int dev = listed(done, k, &in);
  if (dev < 0) {
    ct_cuda_report("attention_decode_oproj", "cudaGetDevice", "no current device", __FILE__, __LINE__);
    return false;
  }
  if (in) return true;
  if (!CKD("attention_decode_oproj",
           cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, OP_SMEM_MAX)))
    return false;
  add_listed(done, dev, k);
  return true;
}

// Attention's blocks kept apart from the GEMVs launched early beside them. attention_decode_rope
// is a chain of short latencies (L2 loads, shuffles, a cluster barrier, the merge); the output
// projection's and gate/up's blocks, launched early beside it with their weight loads in flight,
// slow each of its phases. Where attention's grid has at most P percent as many blocks as the
// device has multiprocessors, its blocks and those GEMVs' ask for unused dynamic shared memory so
// that they cannot share a multiprocessor (same arithmetic, so the same bits: test_attention_pad):
//  - apart (the default, CT_DECODE_ATT_APART=P, 50; 0 turns it off): each attention block asks for
//    just over three quarters of a multiprocessor's shared memory and each block of the next two
//    GEMV launches (the output projection, gate/up) for a quarter (apart_gemv_smem: four still fit
//    together, as their registers allow). The qkv GEMV's small blocks still fit beside attention's,
//    so attention's blocks start beside them as without a pad, their old keys loaded early; and
//    attention triggers its dependents only after its wait (CT_DECODE_ATT_LATE=0 at its start), so
//    the projection's weight loads stay out of the qkv GEMV's tail.
//  - alone (CT_DECODE_ATT_ALONE=P, 0 by default; it wins over apart where set): each attention
//    block asks for a whole multiprocessor's shared memory, so nothing sits beside it; its blocks
//    then wait for empty multiprocessors.
// Measured (one H100, 128 + 256 tokens, greedy, bf16, graphs; the variants against each other in
// one call, interleaved rounds), decode tokens/s at batch 1:
//   call 144 (bench/results/call143_2026-12-05_apart): Qwen3-0.6B shape apart 1,455-1,468, apart
//   with the early trigger 1,430-1,450, alone 1,419-1,426, no pad 1,335-1,367, only the output
//   projection padded (not gate/up) 1,347-1,357; Llama-3.2-1B shape apart 985-994, alone 972-989.
//   Calls 136-141 (bench/results/call136-140_2026-12-05_H100_attalone), alone against no pad:
//   Qwen3-0.6B +5.2%, Llama-3.2-1B +3.3%, GPT-2 124M (72 blocks, over half) even when forced;
//   alone at batch 2 (96 blocks: 73% of the 132 multiprocessors): Qwen3 +3.8%, Llama-1B -3.9%;
//   batch 4 with two blocks a multiprocessor: +1.1% / -2.0%; batch 8 with three: Qwen3 -10%. The
//   bigger the share taken, the fewer early GEMV blocks find room; hence the cap. Call 141's
//   timeline (alone, a layer 22.01 against 22.84 us release to release): the qkv GEMV 3.24 against
//   4.17 us, the output projection 2.25 against 3.34, attention no shorter (its blocks started
//   later), gate/up and down 0.4 and 0.85 longer.
// Read at every call.
int att_alone_pct() { return env_int("CT_DECODE_ATT_ALONE", 0); }
int att_apart_pct() { return env_int("CT_DECODE_ATT_APART", 50); }
// Attention's cluster variant with its split rows pushed into block 0 (the default,
// CT_DECODE_ATT_PUSH=1: where the launch's pad already holds them, which is where att_pad applies;
// =2 at every launch, asking for the bytes where there is no pad; 0 turns it off). Each split warp
// stores its rows into block 0's shared memory by st.async, counted on block 0's mbarrier, and
// block 0 merges from its own shared memory once they are all in: no cluster barrier between the
// split math and the merge (cl.sync(), whose release is a GPU-scope memory barrier: it waits for
// the newest key's cache stores too), no distributed-shared-memory loads in the merge, and the
// other blocks leave as soon as block 0 has their rows. The merge's arithmetic and order are the
// same, so the bits are too. fits: the pad holds the rows.
// Measured (call 149, one H100, bench/results/call149-151_2026-12-06_H100_push; two interleaved
// rounds, 128 + 256 tokens, bf16, graphs, the same greedy ids): batch 1 on the Qwen3-0.6B shape
// 1,505-1,527 tokens/s against 1,434-1,448 without (+5%), =2 the same; Llama-3.2-1B 1,017-1,020
// against 994-1,002 (+2%). At batch 8 no pad applies, so =1 changes nothing there.
long push_launches; // attention launches with the rows pushed
bool att_push_on(bool fits) {
  const int m = env_int("CT_DECODE_ATT_PUSH", 1);
  return m > 1 || (m == 1 && fits);
}
// Where the rows are not pushed (the default, CT_DECODE_ATT_RELAX=1; 0 turns it off): the cluster
// merge's second barrier, which only keeps the blocks resident until block 0 has read their rows,
// relaxed (no release, so no GPU-scope memory barrier before it). The same bits. Call 149: batch 8
// on the Qwen3-0.6B shape 6,859-6,863 tokens/s against 6,792-6,800 (+1%); batch 1 with the push
// off 1,450-1,468 against 1,434-1,448.
long relax_launches;
bool att_relax_on() { return env_int("CT_DECODE_ATT_RELAX", 1) > 0; }
// The heads split (attention_decode_rope_kernel's HS: two warps a split, each with half the query
// heads) with the push: by default at one row where G = 2; CT_DECODE_ATT_HS=1 wherever G >= 2, =0
// never. Read at every call. Calls 172-173 (H100, bench/results/call172_*, call173_*, the same bits
// and ids): at 177 registers its blocks started 1.3 us later than the 4-warp blocks (no room beside
// the qkv GEMV's) and the step was even; capped at 128, +1.5 to +1.8% at batch 1 on the Qwen3-0.6B
// shape (G 2, head dim 128), but -0.2% at its batch 8 and -0.8 to -1.3% on Llama-3.2-1B's (G 4,
// head dim 64: two heads a warp still, and each split's keys loaded twice).
bool att_hs_on(int N, int G) {
  const int m = env_int("CT_DECODE_ATT_HS", -1);
  return G >= 2 && (m > 0 || (m < 0 && N == 1 && G == 2));
}
long hs_launches; // attention launches with the heads split
long apart_launches; // attention kernels launched apart (att_pad)
// Dynamic shared memory a block of attention kernel k for a grid of `blocks` (0: no pad: the rule
// does not apply, or the device does not allow it); with apart, apart_left = 2 and *late set
// (attention triggers its dependents after its wait). Raises k's limit once per device. Called by
// att_rope_launch only, which has cleared apart_left.
size_t att_pad(const void *k, long blocks, int *late) {
  *late = 0;
  const int alone = att_alone_pct(), apart = att_apart_pct(), sms = num_sms();
  const int pct = alone > 0 ? alone : apart;
  if (pct <= 0 || sms <= 0 || blocks * 100 > (long)sms * pct) return 0;
  int sm = 0, res = 0;
  const long st = static_smem(k);
  if (!sm_smem_info(&sm, &res) || st < 0) return 0;
  // alone: the multiprocessor's shared memory less the reserved part and the static arrays;
  // apart: 1 KB more than all but the quarter each padded GEMV block takes
  long want = alone > 0 ? (long)sm - res - st : (long)sm - sm / 4 + 1024 - res - st;
  if (want > (long)smem_optin() - st) want = (long)smem_optin() - st;
  if (want <= 0 || !smem_raise_quiet(k)) return 0;
  if (alone <= 0) {
    apart_left = 2;
    *late = env_int("CT_DECODE_ATT_LATE", 1) != 0;
  }
  return (size_t)want;
}

// qkv_rope_append then attention_decode (ops.h) as attention_decode_rope_kernel: 16-bit tables,
// head dims 64 / 128, 1, 2 or 4 query heads per kv head; 1 (the caller runs the two ops) where it
// does not apply. op.w != NULL: attention_decode_oproj, which needs the cluster variant.
template <typename T>
int att_rope_launch(void *out, const void *raw, const void *qnw, const void *knw, void *kc,
                    void *vc, const int32_t *slot, const int32_t *pos, int N, int H, int KV,
                    int hd, int max_T, float theta, float eps, oproj_args<T> op) {
  apart_left = 0;
  if (N <= 0 || !fused_att_on(N) || !gemv_on() || !v2_on() || (hd != 64 && hd != 128) || KV <= 0 ||
      H % KV)
    return 1;
  const int G = H / KV;
  const size_t counters = (size_t)(N * KV + (op.w ? N : 0) + ARGMAX_MAX_ROWS) * sizeof(unsigned);
  if ((G != 1 && G != 2 && G != 4) || !aligned16(kc) || !aligned16(vc) || counters > SPLIT_COUNT_BYTES)
    return 1;
  const int splits = (max_T + DEC_CHUNK - 1) / DEC_CHUNK;
  const dim3 g((splits + DEC_WARPS - 1) / DEC_WARPS, KV, N);
  const bool cl = cluster_on() && g.x > 1 && g.x <= 8;
  // OP: the block's rows of the projection in shared memory (oproj_stage), at most OP_SMEM_MAX
  const size_t osmem = op.w ? (size_t)((op.C + g.x - 1) / g.x) * G * hd * sizeof(T) : 0;
  if (op.w && (!cl || !aligned16(op.w) || op.C <= 0 || osmem > OP_SMEM_MAX)) return 1;
  const size_t part_floats = (size_t)N * H * splits * (hd + 4);
  char *buf = (char *)split_scratch(SPLIT_COUNT_BYTES + sizeof(float) *
                                    (part_floats + (op.w ? (size_t)N * KV * op.C : 0)));
  if (!buf) return -1;
  float *part = (float *)(buf + SPLIT_COUNT_BYTES);
  unsigned *cnt = (unsigned *)buf;
  if (op.w) {
    op.part = part + part_floats;
    op.count = cnt + N * KV; // after attention's counters (unused by the cluster merge)
  }
  const float sc = 1.0f / sqrtf((float)hd);
  const l2_hint_t h = take_hint(true);
  T *o = (T *)out, *K = (T *)kc, *V = (T *)vc;
  const T *r = (const T *)raw, *gq = (const T *)qnw, *gk = (const T *)knw;
  bool ok = false;
  const long nblk = (long)g.x * g.y * g.z;
  size_t pad = 0; // attention's blocks kept apart (att_pad)
  int late = 0;    // with apart: attention triggers its dependents after its wait
  // its L2 hint after its wait rather than at its start (a measurement: CT_DECODE_PF_AFTER=1)
  const int pf_bit = h.p && env_int("CT_DECODE_PF_AFTER", 0) > 0 ? 2 : 0;
  // the split rows pushed into block 0 (att_push_on): the bytes its shared memory must hold
  const size_t push_need = (size_t)g.x * DEC_WARPS * G * (hd + 4) * sizeof(float);
  int merge_bit = 0; // 4: the rows pushed (att_push_on), 8: the 2nd barrier relaxed (att_relax_on)
  size_t dyn = 0;   // the cluster variant's dynamic shared memory: the pad, or the push rows
#define ATT_ROPE(LK, G_)                                                                          \
  do {                                                                                            \
    if (op.w) {                                                                                   \
      auto k = attention_decode_rope_kernel<T, LK, G_, true, true>;                               \
      ok = smem_raised((const void *)k) &&                                                        \
           launch_cl("attention_decode_oproj", "attention_decode_rope_kernel", k, g,              \
                     DEC_WARPS * 32, osmem, g.x, o, part, cnt, r, gq, gk, K, V, slot, pos, H, KV, \
                     max_T, splits, sc, theta, eps, h.p, h.bytes, op, 0);                         \
    } else if (cl) {                                                                              \
      auto k = attention_decode_rope_kernel<T, LK, G_, true>;                                     \
      pad = att_pad((const void *)k, nblk, &late);                                                \
      dyn = pad;                                                                                  \
      if (att_push_on(pad >= push_need)) {                                                        \
        merge_bit = 4;                                                                            \
        if (dyn < push_need) dyn = push_need;                                                     \
      } else if (att_relax_on()) {                                                                \
        merge_bit = 8;                                                                            \
      }                                                                                           \
      int threads = DEC_WARPS * 32;                                                               \
      if (merge_bit == 4 && att_hs_on(N, G_)) { /* the heads split (its own pad) */               \
        auto kh = attention_decode_rope_kernel<T, LK, G_, true, false, true>;                     \
        const size_t hpad = att_pad((const void *)kh, nblk, &late);                               \
        if (hpad >= push_need || (!pad && smem_raised((const void *)kh))) {                       \
          k = kh;                                                                                 \
          pad = hpad;                                                                             \
          dyn = pad > push_need ? pad : push_need;                                                \
          threads *= 2;                                                                           \
          hs_launches++;                                                                          \
        }                                                                                         \
      }                                                                                           \
      ok = launch_cl("attention_decode_rope", "attention_decode_rope_kernel", k, g, threads,      \
                     dyn, g.x, o, part, cnt, r, gq, gk, K, V, slot, pos, H, KV, max_T, splits,    \
                     sc, theta, eps, h.p, h.bytes, op, late | pf_bit | merge_bit);                \
    } else {                                                                                      \
      auto k = attention_decode_rope_kernel<T, LK, G_>;                                           \
      pad = att_pad((const void *)k, nblk, &late);                                                \
      ok = launch("attention_decode_rope", "attention_decode_rope_kernel", k, g, DEC_WARPS * 32,  \
                  pad, o, part, cnt, r, gq, gk, K, V, slot, pos, H, KV, max_T, splits, sc, theta, \
                  eps, h.p, h.bytes, op, late | pf_bit);                                          \
    }                                                                                             \
  } while (0)
  LK_G_DISPATCH(ATT_ROPE);
#undef ATT_ROPE
  if (!ok) return -1;
  fa_launches++;
  if (cl) cluster_launches++;
  if (pad && apart_left) apart_launches++;
  else if (pad) alone_launches++;
  if (merge_bit == 4) push_launches++;
  if (merge_bit == 8) relax_launches++;
  if (op.w) oproj_launches++;
  return 0;
}

template <typename T>
int cu_attention_decode_rope(void *out, const void *raw, const void *qnw, const void *knw,
                             void *kc, void *vc, const int32_t *slot, const int32_t *pos, int N,
                             int H, int KV, int hd, int max_T, float theta, float eps) {
  if constexpr (sizeof(T) != 2) {
    return 1;
  } else {
    return att_rope_launch<T>(out, raw, qnw, knw, kc, vc, slot, pos, N, H, KV, hd, max_T, theta,
                              eps, oproj_args<T>{});
  }
}

template <typename T>
int cu_attention_decode_oproj(void *out, const void *raw, const void *qnw, const void *knw,
                              void *kc, void *vc, const int32_t *slot, const int32_t *pos,
                              const void *w, const void *bias, const void *res, int N, int H,
                              int KV, int hd, int C, int max_T, float theta, float eps) {
  if constexpr (sizeof(T) != 2) {
    return 1;
  } else {
    if (!oproj_on() || !w || !res || !out || out == res) return 1;
    oproj_args<T> op{(const T *)w, (const T *)bias, (const T *)res, (T *)out, nullptr, nullptr, C};
    return att_rope_launch<T>(NULL, raw, qnw, knw, kc, vc, slot, pos, N, H, KV, hd, max_T, theta,
                              eps, op);
  }
}

// attention_decode_qkv (ops.h): attention_decode_qkv_kernel for one row where it applies (16-bit
// tables, thread block clusters, head dims 64 / 128, 1, 2 or 4 query heads a kv head, max_T <= 512,
// the block's projection rows within QA_SMEM_MAX) and CT_DECODE_QKV_ATT=1 (opt-in: slower on an
// H200, see the kernel's STATUS); 1 otherwise (the caller runs norm_matmul_fwd and
// attention_decode_rope). Read at every call, so a test can compare both paths in one process.
#define QA_SMEM_MAX (200 * 1024)
// CT_DECODE_QKV_ATT: 1 the cluster kernel (attention_decode_qkv_kernel), 2 the tail form
// (qkv_att_tail_kernel), 0 neither; read at every call.
int qkv_att_mode() { return env_int("CT_DECODE_QKV_ATT", 0); }
bool qkv_att_on() { return qkv_att_mode() == 1; }
long qa_launches; // attention_decode_qkv kernels launched (or recorded into a graph)
long qt_launches; // of them, in the tail form

// attention_decode_qkv as qkv_att_tail_kernel: one row, 16-bit tables, rows up to 1024 wide (a
// warp's two projection rows in one round, gemv_kernel's <1, 2, 4> shape), head dims 64 / 128, 1, 2
// or 4 query heads a kv head; 1 where it does not apply.
template <typename T>
int qkv_tail_launch(void *out, void *raw, const void *inp, const void *nw, const void *w,
                    const void *bias, const void *qnw, const void *knw, void *kc, void *vc,
                    const int32_t *slot, const int32_t *pos, int N, int C, int H, int KV, int hd,
                    int max_T, float theta, float eps) {
  if (N != 1 || !fused_att_on(N) || oproj_on() || !gemv_on() || !v2_on() || (hd != 64 && hd != 128) ||
      KV <= 0 || H % KV || C <= 0 || C % 8 || C > 1024 || !raw || !out)
    return 1;
  const int G = H / KV, splits = (max_T + DEC_CHUNK - 1) / DEC_CHUNK;
  if ((G != 1 && G != 2 && G != 4) || !aligned16(kc) || !aligned16(vc) || !aligned16(inp) ||
      !aligned16(w) || !aligned16(nw))
    return 1;
  // attention blocks a kv head at most (the splits of a full cache) within the head's blocks, and
  // all heads' spinning ones fewer than the multiprocessors (so every block of the grid can start)
  const int spb = G > 1 ? QT_WARPS / 2 : QT_WARPS, tb = (splits + spb - 1) / spb;
  const int bpg = (G + 2) * hd / (QT_WARPS * 2);
  const size_t counters = (size_t)(2 * KV + ARGMAX_MAX_ROWS) * sizeof(unsigned);
  if (tb > bpg || (long)KV * tb > num_sms() || counters > SPLIT_COUNT_BYTES) return 1;
  const size_t part_floats = (size_t)H * splits * (hd + 4);
  char *buf = (char *)split_scratch(SPLIT_COUNT_BYTES + sizeof(float) * part_floats);
  if (!buf) return -1;
  float *part = (float *)(buf + SPLIT_COUNT_BYTES);
  unsigned *cnt = (unsigned *)buf;
  // gemv_go's norm (the same bits): 2 = the norm weight into shared memory first
  const int vn = (size_t)2 * C * sizeof(T) <= 48 * 1024 ? 2 : 1;
  const size_t smem = (size_t)(vn == 2 ? 2 : 1) * C * sizeof(T);
  const float sc = 1.0f / sqrtf((float)hd);
  take_hint(); // its weights are loaded before it waits: an L2 hint adds nothing
  T *o = (T *)out, *r = (T *)raw, *K = (T *)kc, *V = (T *)vc;
  const T *x = (const T *)inp, *g = (const T *)nw, *W = (const T *)w, *b = (const T *)bias,
          *gq = (const T *)qnw, *gk = (const T *)knw;
  bool ok = false;
#define QT(LK, G_)                                                                                \
  ok = launch("attention_decode_qkv", "qkv_att_tail_kernel", qkv_att_tail_kernel<T, 2, 4, LK, G_>, \
              dim3((unsigned)(KV * bpg)), QT_WARPS * 32, smem, o, r, x, g, W, b, gq, gk, K, V,    \
              slot, pos, part, cnt, C, H, KV, max_T, splits, sc, theta, eps, vn)
  LK_G_DISPATCH(QT);
#undef QT
  if (!ok) return -1;
  qa_launches++;
  qt_launches++;
  return 0;
}

template <typename T>
int cu_attention_decode_qkv(void *out, void *raw, const void *inp, const void *nw, const void *w,
                            const void *bias, const void *qnw, const void *knw, void *kc,
                            void *vc, const int32_t *slot, const int32_t *pos, int N, int C,
                            int H, int KV, int hd, int max_T, float theta, float eps) {
  if constexpr (sizeof(T) != 2) {
    return 1;
  } else {
    if (qkv_att_mode() == 2)
      return qkv_tail_launch<T>(out, raw, inp, nw, w, bias, qnw, knw, kc, vc, slot, pos, N, C, H,
                                KV, hd, max_T, theta, eps);
    // CT_DECODE_FUSED_ATT=0 (no fused attention) and CT_DECODE_OPROJ=1 (attention with the
    // output projection) keep their kernels
    if (N != 1 || !qkv_att_on() || !fused_att_on(N) || oproj_on() || !gemv_on() || !v2_on() ||
        !cluster_on() ||
        (hd != 64 && hd != 128) || KV <= 0 || H % KV || C <= 0 || C % 8 || !raw || !out)
      return 1;
    const int G = H / KV, splits = (max_T + DEC_CHUNK - 1) / DEC_CHUNK;
    if ((G != 1 && G != 2 && G != 4) || splits > QA_CS * DEC_WARPS || !aligned16(kc) ||
        !aligned16(vc) || !aligned16(inp) || !aligned16(w) || !aligned16(nw))
      return 1;
    const int rpb = ((G + 2) * hd + QA_CS - 1) / QA_CS;
    const size_t smem = ((size_t)rpb + 2) * C * sizeof(T);
    if (smem > QA_SMEM_MAX) return 1;
    // gemv_go's choice of norm (the same bits): 2 = the norm weight into shared memory first
    const int vn = (size_t)2 * C * sizeof(T) <= 48 * 1024 ? 2 : 1;
    const float sc = 1.0f / sqrtf((float)hd);
    take_hint(); // its weights are copied before it waits: an L2 hint adds nothing
    T *o = (T *)out, *r = (T *)raw, *K = (T *)kc, *V = (T *)vc;
    const T *x = (const T *)inp, *g = (const T *)nw, *W = (const T *)w, *b = (const T *)bias,
            *gq = (const T *)qnw, *gk = (const T *)knw;
    const dim3 grid(QA_CS, KV, 1);
    bool ok = false;
#define QA(LK, G_)                                                                                \
  do {                                                                                            \
    auto k = attention_decode_qkv_kernel<T, LK, G_>;                                              \
    static kernel_list raised;                                                                    \
    bool in;                                                                                      \
    const int dev = listed(raised, (const void *)k, &in);                                         \
    if (dev < 0) return 1;                                                                        \
    if (!in) {                                                                                    \
      if (!CKD("attention_decode_qkv",                                                            \
               cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, QA_SMEM_MAX))) \
        return -1;                                                                                \
      add_listed(raised, dev, (const void *)k);                                                   \
    }                                                                                             \
    ok = launch_cl("attention_decode_qkv", "attention_decode_qkv_kernel", k, grid,                \
                   QA_WARPS * 32, smem, QA_CS, o, r, x, g, W, b, gq, gk, K, V, slot, pos, C, H,   \
                   KV, max_T, splits, rpb, sc, theta, eps, vn);                                   \
  } while (0)
    LK_G_DISPATCH(QA);
#undef QA
    if (!ok) return -1;
    qa_launches++;
    return 0;
  }
}

template <typename T> void fill(ct_ops *t) {
  t->embed_pos_fwd = cu_embed_pos_fwd<T>;
  t->rope_pos_fwd = cu_rope_pos_fwd<T>;
  t->kv_append = cu_kv_append<T>;
  t->attention_decode = cu_attention_decode<T>;
  t->argmax_rows = cu_argmax_rows<T>;
  t->argmax_advance = cu_argmax_advance<T>;
  t->norm_matmul_argmax = cu_norm_matmul_argmax<T>;
  t->norm_matmul_fwd = cu_norm_matmul_fwd<T>;
  t->norm_matmul_swiglu_fwd = cu_norm_matmul_swiglu_fwd<T>;
  t->matmul_add_fwd = cu_matmul_add_fwd<T>;
  t->matmul_rows_fwd = cu_matmul_rows_fwd<T>;
  t->matmul_gelu_rows_fwd = cu_matmul_gelu_rows_fwd<T>;
  t->layernorm_matmul_fwd = cu_layernorm_matmul_fwd<T>;
  t->qkv_rope_append = cu_qkv_rope_append<T>;
  t->decode_layers = cu_decode_layers<T>;
  t->attention_decode_rope = cu_attention_decode_rope<T>;
  t->attention_decode_oproj = cu_attention_decode_oproj<T>;
  t->attention_decode_qkv = cu_attention_decode_qkv<T>;
  t->l2_hint = cu_l2_hint;
  t->rmsnorm_rows_fwd = cu_rmsnorm_rows_fwd<T>;
  t->layernorm_rows_fwd = cu_layernorm_rows_fwd<T>;
}

} // namespace

// The decode timeline (CT_DECODE_TIMELINE builds; nothing otherwise): for the last whole replays
// of the last captured decode step, aligned at the end of what was noted, each kernel's mean
// start after the kernel before was released (negative: launched early), its own release after
// its start (the wait), and the time from its release to the next kernel's (what it adds to the
// step's critical path), in microseconds. Run with one batch size, so the last capture is the
// step that was replayed last.
extern "C" void ct_cuda_decode_timeline(void) {
#ifdef CT_DL_TIMES
  { // decode_layers_kernel's last launch: each event's time after the layer's first block began
    // it, min / mean / max over the blocks, means over the layers 1 .. nl - 2
    int nl = 0;
    const int nb = num_sms() < 256 ? num_sms() : 256;
    static unsigned long long t[256][DL_MAX_LAYERS][DL_EV];
    if (cudaMemcpyFromSymbol(&nl, dl_tm_nl, sizeof nl) == cudaSuccess && nl > 2 &&
        cudaMemcpyFromSymbol(t, dl_tm, sizeof t) == cudaSuccess) {
      static const char *en[DL_EV] = {"layer start", "qkv weights in", "qkv done", "barrier",
                                      "attention done", "barrier", "o_proj weights in",
                                      "o_proj done", "barrier", "gate/up weights in",
                                      "gate/up done", "barrier", "down weights in", "down done",
                                      "(unused)", "(unused)"};
      fprintf(stderr, "decode_layers times (us after the layer's first block started it; min / mean"
              " / max over %d blocks, means over layers 1 .. %d):\n", nb, nl - 2);
      double per = 0;
      for (int l = 1; l < nl - 1; l++) {
        unsigned long long r0 = ~0ull, r1 = ~0ull;
        for (int b = 0; b < nb; b++) {
          r0 = t[b][l][0] < r0 ? t[b][l][0] : r0;
          r1 = t[b][l + 1][0] < r1 ? t[b][l + 1][0] : r1;
        }
        per += (double)(r1 - r0);
      }
      for (int e = 0; e < DL_EV; e++) {
        double mn = 0, me = 0, mx = 0;
        for (int l = 1; l < nl - 1; l++) {
          unsigned long long r0 = ~0ull;
          for (int b = 0; b < nb; b++) r0 = t[b][l][0] < r0 ? t[b][l][0] : r0;
          double lo = 1e30, sum = 0, hi = -1e30;
          for (int b = 0; b < nb; b++) {
            const double v = (double)t[b][l][e] - (double)r0;
            lo = v < lo ? v : lo, hi = v > hi ? v : hi, sum += v;
          }
          mn += lo, me += sum / nb, mx += hi;
        }
        const double k = 1e3 * (nl - 2);
        fprintf(stderr, "  %2d %-20s %8.2f %8.2f %8.2f\n", e, en[e], mn / k, me / k, mx / k);
      }
      fprintf(stderr, "  a layer: %.2f us\n", per / 1e3 / (nl - 2));
    } else {
      cudaGetLastError();
    }
  }
#endif
#ifdef CT_DECODE_TIMELINE
  unsigned n = 0;
  if (cudaMemcpyFromSymbol(&n, tl_seq, sizeof n) != cudaSuccess || !n) {
    cudaGetLastError();
    return;
  }
  // the ring holds the latest TL_MAX notes; note i is at i % TL_MAX
  std::vector<unsigned long long> t0(TL_MAX), t1(TL_MAX);
  if (cudaMemcpyFromSymbol(t0.data(), tl_t, TL_MAX * sizeof(unsigned long long), 0) != cudaSuccess ||
      cudaMemcpyFromSymbol(t1.data(), tl_t, TL_MAX * sizeof(unsigned long long),
                           TL_MAX * sizeof(unsigned long long)) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  const size_t K = tl_names.size();
  if (!K || n < 2 * K) {
    fprintf(stderr, "decode timeline: %u kernels noted, %zu in the captured step: too few to align\n",
            n, K);
    return;
  }
  size_t M = n / K - 1 < 200 ? n / K - 1 : 200;
  if (M * K + 1 > TL_MAX) M = (TL_MAX - 1) / K; // note base - 1 must still be in the ring
  const size_t base = n - M * K;
  fprintf(stderr, "decode timeline (%%globaltimer at block 0 of each kernel, %u noted; means over the"
          " last %zu replays of the %zu-kernel step, us):\n", n, M, K);
  fprintf(stderr, "  %-4s %-34s %9s %9s %9s\n", "#", "kernel", "start", "wait", "to next");
  double step = 0;
  for (size_t k = 0; k < K; k++) {
    double a = 0, b = 0, c = 0;
    for (size_t r = 0; r < M; r++) {
      const size_t i = base + r * K + k, w = TL_MAX - 1; // base >= K >= 1
      a += (double)t0[i & w] - (double)t1[(i - 1) & w];
      b += (double)t1[i & w] - (double)t0[i & w];
      c += i + 1 < n ? (double)t1[(i + 1) & w] - (double)t1[i & w] : 0.0;
    }
    fprintf(stderr, "  %-4zu %-34s %9.2f %9.2f %9.2f\n", k, tl_names[k].c_str(), a / M / 1e3,
            b / M / 1e3, c / M / 1e3);
    step += c / M;
  }
  fprintf(stderr, "  a step, release to release: %.1f us (the last replay's last kernel counts 0)\n",
          step / 1e3);
  { // "to next" split at each launch's last block end (tl_blkend), over the launches still in its
    // ring (the latest TL_END_RING), for the kernels that note their ends (TL_END_GUARD)
    std::vector<unsigned long long> be((size_t)TL_END_RING * TL_END_BLOCKS);
    if (cudaMemcpyFromSymbol(be.data(), tl_blkend, be.size() * sizeof(unsigned long long)) !=
        cudaSuccess) {
      cudaGetLastError();
    } else {
      fprintf(stderr, "  each kernel's last block end (launches of the latest %d; us, means): its"
              " release -> last end, last end -> next release\n", TL_END_RING);
      // launch i's row of block ends, or NULL where the ring no longer holds it or no launch
      // follows it
      auto ends_of = [&](size_t i) -> const unsigned long long * {
        return i + TL_END_RING < n || i + 1 >= n ? NULL : &be[(i & (TL_END_RING - 1)) * TL_END_BLOCKS];
      };
      double sw = 0, sc = 0;
      for (size_t k = 0; k < K; k++) {
        double a = 0, c = 0;
        long m = 0;
        for (size_t r = 0; r < M; r++) {
          const size_t i = base + r * K + k, w = TL_MAX - 1;
          const unsigned long long *row = ends_of(i);
          if (!row) continue;
          unsigned long long last = 0;
          for (int b = 0; b < TL_END_BLOCKS; b++) last = row[b] > last ? row[b] : last;
          if (last < t1[i & w] || last > t1[(i + 1) & w]) continue; // no notes (or stale)
          a += (double)last - (double)t1[i & w];
          c += (double)t1[(i + 1) & w] - (double)last;
          m++;
        }
        if (!m) continue;
        fprintf(stderr, "  %-4zu %-34s %9.2f %9.2f   (%ld)\n", k, tl_names[k].c_str(), a / m / 1e3,
                c / m / 1e3, m);
        sw += a / m, sc += c / m;
      }
      fprintf(stderr, "  a step: %.1f us of kernels' work after their releases, %.1f us of"
              " completions\n", sw / 1e3, sc / 1e3);
      // attention's launches, by cluster (grid y: the kv head) and block (grid x): each block's
      // start after the kernel before's release and its end after attention's release (means
      // over the launches in the ring of the latest one's grid), and the multiprocessors of the
      // latest launch; at most 8 x 8 blocks
      std::vector<unsigned long long> bb((size_t)TL_END_RING * TL_END_BLOCKS);
      std::vector<unsigned> bs((size_t)TL_END_RING * TL_END_BLOCKS);
      std::vector<uint2> gd(TL_END_RING);
      std::vector<unsigned long long> we((size_t)TL_END_RING * 32);
      if (cudaMemcpyFromSymbol(bb.data(), tl_blkbeg, bb.size() * sizeof(unsigned long long)) ==
              cudaSuccess &&
          cudaMemcpyFromSymbol(bs.data(), tl_blksm, bs.size() * sizeof(unsigned)) == cudaSuccess &&
          cudaMemcpyFromSymbol(gd.data(), tl_grid, gd.size() * sizeof(uint2)) == cudaSuccess &&
          cudaMemcpyFromSymbol(we.data(), tl_w0end, we.size() * sizeof(unsigned long long)) ==
              cudaSuccess) {
        double st[8][8] = {{0}}, en[8][8] = {{0}}, wn[32] = {0};
        long wc[32] = {0}; // block 0's warps: the sum of their ends after the release, the count
        unsigned sm[8][8] = {{0}}, gx = 0, gy = 0;
        long cn = 0;
        for (size_t r = M; r-- > 0;) // the latest launch first: its grid is the one reported
          for (size_t k = 1; k < K; k++) {
            if (tl_names[k] != "attention_decode_rope_kernel") continue;
            const size_t i = base + r * K + k, w = TL_MAX - 1, e = i & (TL_END_RING - 1);
            const unsigned long long *ends = ends_of(i);
            if (!ends) continue;
            if (!gx) gx = gd[e].x, gy = gd[e].y;
            if (gd[e].x != gx || gd[e].y != gy || gx > 8 || gy > 8) continue;
            const size_t row = e * TL_END_BLOCKS;
            bool ok = true; // every block's end noted by this launch
            for (unsigned b = 0; b < gx * gy && ok; b++)
              ok = ends[b] >= t1[i & w] && ends[b] <= t1[(i + 1) & w];
            if (!ok) continue;
            for (unsigned y = 0; y < gy; y++)
              for (unsigned x = 0; x < gx; x++) {
                const size_t b = row + y * gx + x;
                st[y][x] += (double)bb[b] - (double)t1[(i - 1) & w];
                en[y][x] += (double)be[b] - (double)t1[i & w];
                if (!cn) sm[y][x] = bs[b];
              }
            for (int v = 0; v < 32; v++) { // a warp's note from this launch (block 0 of kv 0)
              const unsigned long long t = we[e * 32 + v];
              if (t < t1[i & w] || t > t1[(i + 1) & w]) continue;
              wn[v] += (double)t - (double)t1[i & w];
              wc[v]++;
            }
            cn++;
          }
        if (cn) {
          fprintf(stderr, "  attention blocks (%u a cluster, a cluster a kv head; means of %ld"
                  " launches): start after the kernel before's release / end after attention's"
                  " release, us; [multiprocessors of the latest]\n", gx, cn);
          for (unsigned y = 0; y < gy; y++) {
            fprintf(stderr, "    kv %u:", y);
            for (unsigned x = 0; x < gx; x++)
              fprintf(stderr, " %5.2f/%5.2f", st[y][x] / cn / 1e3, en[y][x] / cn / 1e3);
            fprintf(stderr, "  [");
            for (unsigned x = 0; x < gx; x++) fprintf(stderr, "%u%s", sm[y][x], x + 1 < gx ? " " : "]\n");
          }
          fprintf(stderr, "    block 0 of kv 0 by warp, end after attention's release, us:");
          for (int v = 0; v < 32; v++)
            if (wc[v]) fprintf(stderr, " %d:%.2f", v, wn[v] / wc[v] / 1e3);
          fprintf(stderr, "\n");
        }
      } else {
        cudaGetLastError();
      }
    }
  }
  // the attention kernels' phases (block 0 of the cluster of kv head 0), after their release
  std::vector<unsigned long long> ph(TL_MAX);
  std::vector<long long> pc((size_t)TL_PHASES * TL_MAX), c1(TL_MAX);
  if (cudaMemcpyFromSymbol(ph.data(), tl_am, ph.size() * sizeof(unsigned long long)) != cudaSuccess ||
      cudaMemcpyFromSymbol(pc.data(), tl_pc, pc.size() * sizeof(long long)) != cudaSuccess ||
      cudaMemcpyFromSymbol(c1.data(), tl_c1, c1.size() * sizeof(long long)) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  // cycles to ns at the card's clock (cudaDevAttrClockRate, kHz)
  int dev = 0, khz = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev) != cudaSuccess || khz <= 0) {
    cudaGetLastError();
    khz = 1000000;
  }
  // a phase counts where this launch noted it: a note from another launch in the ring's slot (or,
  // where attention merges through L2, none) is before this launch's wait or far after it (another
  // multiprocessor's counter), so only notes 0 .. 1e6 cycles after the wait's count
  double pm[TL_PHASES + 1] = {0}, pcy[TL_PHASES] = {0};
  long cnt[TL_PHASES + 1] = {0};
  for (size_t k = 0; k < K; k++) {
    if (tl_names[k] != "attention_decode_rope_kernel") continue;
    for (size_t r = 0; r < M; r++) {
      const size_t i = base + r * K + k, w = TL_MAX - 1;
      for (int f = 0; f < TL_PHASES; f++) {
        const long long d = pc[(size_t)f * TL_MAX + (i & w)] - c1[i & w];
        if (d < 0 || d > 1000000) continue;
        pm[f] += (double)d * 1e6 / khz;
        pcy[f] += (double)d;
        cnt[f]++;
      }
      pm[TL_PHASES] += i + 1 < n ? (double)t1[(i + 1) & w] - (double)t1[i & w] : 0.0;
      cnt[TL_PHASES]++;
    }
  }
  // the argmax: from its release to its last block's store of the id, then to the next kernel's
  // (the next step's embedding) block 0 start
  double ad = 0, an = 0;
  long ac = 0;
  for (size_t k = 0; k < K; k++) {
    if (tl_names[k] != "argmax_split_kernel") continue;
    for (size_t r = 0; r < M; r++) {
      const size_t i = base + r * K + k, w = TL_MAX - 1;
      const unsigned long long v = ph[i & w];
      if (v < t0[i & w] || i + 1 >= n) continue;
      ad += (double)v - (double)t1[i & w];
      an += (double)t0[(i + 1) & w] - (double)v;
      ac++;
    }
  }
  if (ac)
    fprintf(stderr, "  argmax_split_kernel (means of %ld): id stored %.2f us after its release, the"
            " next kernel's block 0 starts %.2f us after that\n", ac, ad / ac / 1e3, an / ac / 1e3);
  static const char *pn[TL_PHASES + 1] = {"rope", "split math", "cluster barrier", "merge",
                                          "(unused)", "(unused)", "merge: factors",
                                          "merge: FMAs", "(unused)", "merge: stores",
                                          "next kernel released"};
  if (cnt[TL_PHASES]) {
    fprintf(stderr, "  attention_decode_rope_kernel phases (block 0, thread 0; us after its release,"
            " means of %ld):", cnt[TL_PHASES]);
    for (int f = 0; f <= TL_PHASES; f++)
      if (cnt[f]) fprintf(stderr, " %s %.2f%s", pn[f], pm[f] / cnt[f] / 1e3, f < TL_PHASES ? "," : "");
    fputc('\n', stderr);
    fprintf(stderr, "  the same phases in block 0's cycles after its release (us above at %.2f GHz):",
            khz / 1e6);
    for (int f = 0; f < TL_PHASES; f++)
      if (cnt[f]) fprintf(stderr, " %s %.0f%s", pn[f], pcy[f] / cnt[f], f + 1 < TL_PHASES ? "," : "");
    fputc('\n', stderr);
  }
#endif
}

extern "C" void ct_cuda_decode_table(ct_ops *t) {
  if (t->act_bytes == 4) fill<float>(t);
  else if (!strcmp(t->dtype, "fp16")) fill<f16>(t);
  else fill<bf16>(t);
  t->device_count = cu_device_count;
  t->set_device = cu_set_device;
  t->device_memory = cu_device_memory;
  t->copy_peer = cu_copy_peer;
  t->host_alloc = cu_host_alloc;
  t->host_alloc_mapped = cu_host_alloc_mapped;
  t->host_free = cu_host_free;
  t->to_host_async = cu_to_host_async;
  t->sync = cu_sync;
  t->event_new = cu_event_new;
  t->event_record = cu_event_record;
  t->event_wait = cu_event_wait;
  t->event_free = cu_event_free;
}


extern "C" long ct_cuda_decode_layers_launches(void) { return dl_launches; }
extern "C" long ct_cuda_attention_decode_rope_launches(void) { return fa_launches; }
extern "C" long ct_cuda_l2_hints_used(void) { return hints_used; }
extern "C" long ct_cuda_gemv_staged_launches(void) { return staged_launches; }
extern "C" long ct_cuda_gemv_mma_launches(void) { return mma_launches; }
extern "C" long ct_cuda_splitk_launches(void) { return splitk_launches; }
extern "C" long ct_cuda_gemm_rows_launches(void) { return gr_launches; }
extern "C" long ct_cuda_attention_cluster_launches(void) { return cluster_launches; }
extern "C" long ct_cuda_attention_alone_launches(void) { return alone_launches; }
extern "C" long ct_cuda_attention_apart_launches(void) { return apart_launches; }
extern "C" long ct_cuda_apart_gemv_launches(void) { return apart_gemvs; }
extern "C" long ct_cuda_attention_push_launches(void) { return push_launches; }
extern "C" long ct_cuda_attention_relax_launches(void) { return relax_launches; }
extern "C" long ct_cuda_attention_hs_launches(void) { return hs_launches; }
extern "C" long ct_cuda_attention_blk_launches(void) { return ab_launches; }
extern "C" long ct_cuda_attention_oproj_launches(void) { return oproj_launches; }
extern "C" long ct_cuda_attention_qkv_launches(void) { return qa_launches; }
extern "C" long ct_cuda_attention_qkv_tail_launches(void) { return qt_launches; }
extern "C" long ct_cuda_head_argmax_launches(void) { return head_argmax_launches; }
extern "C" long ct_cuda_gemv_one_launches(void) { return gv_one_launches; }
