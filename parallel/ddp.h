/* parallel/ddp.h — data parallelism: average gradients across the ranks of a group.
 *
 * The flat gradient buffer (DESIGN.md "Flat buffers") is all-reduced with CT_AVG in buckets
 * of `bucket_floats` elements, in order from offset 0. Bucketing is what lets a later version
 * start a bucket's all-reduce while backward still produces the next one (on a side stream
 * with NCCL); over Gloo on the CPU each bucket is a blocking call, so this is synchronous and
 * its only effect is to bound the size of one transfer.
 */
#ifndef CT_DDP_H
#define CT_DDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "parallel/comm.h"
#include "trainer/model.h"

#define CT_DDP_BUCKET_MB_DEFAULT 25.0 /* parallel.bucket_mb, as torch DDP's bucket_cap_mb */

/* Elements of fp32 in a bucket of `bucket_mb` MiB (<= 0: the default); at least 1. */
size_t ct_ddp_bucket_floats(double bucket_mb);

/* ---- overlapped DDP ----
 * Gradients are averaged in buckets as backward produces them: the model's post_backward hook
 * (trainer/model.h: units finish in the order L+1, L, ..., 0, the reverse of the flat buffer)
 * grows a pending range [lo, hi) downward; once it holds bucket_floats or more (or unit 0 is
 * done) it is all-reduced, so communication runs while backward computes the layers below.
 * Over NCCL the collectives run on the group's side stream (ct_comm_set_overlap); over Gloo
 * each call blocks, so the CPU simply issues each bucket as soon as it is ready.
 *
 * Sparse embedding gradient (sparse_embedding, parallel.sparse_embedding_grad). The token
 * embedding's gradient has two shares: the tied head's, final once the head's backward (the first
 * thing backward does) is done, and the lookup's, from the last thing backward does, nonzero only
 * in the rows of the batch's tokens. Reduced together, the whole embedding (GPT-2 124M: 154 MB)
 * is a bucket that only starts once backward has ended, with nothing left to overlap it. Instead,
 * the lookup adds into a buffer of its own (ct_model_set_embed_grad); the embedding's gradient
 * (the head's share, plus what earlier micro-batches accumulated) is reduced as soon as the head
 * is done; and at the end only the rows some rank's batch uses move into a packed buffer, which is
 * reduced as the last collective (GPT-2, 64 x 1024 tokens a rank: an estimated 10-15k of the 50k
 * rows) and added into the reduced embedding gradient in ct_ddp_finish. Both shares are averaged,
 * so their sum is the average of the sums (rounded differently: a few fp32 ulps). An untied
 * embedding takes the same path (its own gradient then holds only earlier micro-batches' shares).
 * The rows: ct_ddp_arm flags the tokens of the armed batch, a max all-reduce of the flags runs
 * during the forward, and before the forward's last unit the device compacts them into a row list
 * and copies them to the host, which has waited for the forward's loss by the time backward
 * counts them.
 * Applies without tensor parallelism only (a tp rank's embedding rows are a vocabulary slice: the
 * option is ignored there). Costs device memory: the embedding's size again (the lookup's buffer),
 * the packed rows (at most the vocabulary, or every rank's micro-batch tokens when fewer) and 8
 * bytes a vocabulary row (flags and row list).
 * Measured (2 H200s, GPT-2 124M, bf16, 64 x 1024 tokens a rank, commit 8ecbce4): 1,099,590
 * tokens/s with it, 1,103,930 without (bench/results/ddp_probe_sparse_2026-11-30_2xH200_8ecbce4.txt):
 * the step does not wait on that tail, so it is off by default. */
typedef struct ct_ddp ct_ddp;

typedef struct ct_ddp_cfg {
  size_t bucket_floats;  /* elements of fp32 in a bucket; 0: the default (25 MiB) */
  /* CT_F32 reduces the fp32 gradients in place; CT_BF16 rounds each bucket into a bf16 buffer of
   * the model's backend (numel x 2 bytes), reduces that (half the bytes on the wire, like torch
   * DDP's bf16_compress_hook) and widens the averages back into the fp32 gradients in
   * ct_ddp_finish. */
  ct_dtype reduce_dtype;
  /* > 0 (NCCL): the buckets issued while backward still runs go to a lean communicator of at
   * most overlap_ctas CTAs (ct_comm_make_lean, made here: collective), so they take few
   * multiprocessors from backward's kernels; the last bucket, which nothing overlaps, goes to the
   * full communicator. 0: every bucket to the full one. */
  int overlap_ctas;
  bool sparse_embedding; /* reduce the embedding lookup's gradient as its used rows (above) */
  /* parallel.ce_allreduce: the gradient buckets go through the copy-engine all-reduce
   * (ct_comm_ce_create in parallel/comm.h: NCCL, one node, peer access between all GPUs) instead
   * of NCCL's kernels, so they take (almost) no multiprocessors from the backward they overlap.
   * ct_ddp_create learns the buckets by replaying the post_backward hook over the units without
   * reducing, and registers them with the model's gradient buffer (fp32) or the bf16 wire; where
   * it does not apply every rank logs why and stays on NCCL. A bucket not in the table (a backward
   * that stopped early) and the sparse embedding's packed rows still go through NCCL. */
  bool ce_allreduce;
  /* false: nothing is reduced while backward runs; at its end every gradient goes in buckets as
   * above, the full communicator's (no sparse embedding, no copy engines, no lean communicator:
   * those are for overlapping). */
  bool overlap;
} ct_ddp_cfg;
#define CT_DDP_CFG_INIT {0, CT_F32, 0, true, false, true}

/* Installs the hooks on `model` (not owned; neither is c). */
ct_status ct_ddp_create(ct_model *model, ct_comm *c, const ct_ddp_cfg *cfg, ct_ddp **out);
void ct_ddp_destroy(ct_ddp *d); /* clears the model's hooks; NULL is ignored */
/* Whether the next backward reduces (the last micro-batch of a step; earlier ones only
 * accumulate, like torch's no_sync()). tokens (n, host): that micro-batch's inputs, which the
 * sparse embedding gradient flags (read only when reduce is true). */
ct_status ct_ddp_arm(ct_ddp *d, bool reduce, const int32_t *tokens, int n);
/* After the armed backward: every bucket is queued; joins the side stream and waits (bounded)
 * for the results. */
ct_status ct_ddp_finish(ct_ddp *d);
/* All-reduces of gradient buckets issued by the last armed backward (for the log and tests), the
 * packed rows included; a range larger than a bucket counts each bucket it was cut into. */
int ct_ddp_buckets(const ct_ddp *d);
/* All-reduces of the last armed backward that the copy-engine all-reduce took (0 when
 * parallel.ce_allreduce is off or fell back); *of (if not NULL): all of its gradient all-reduces
 * (a bucket range above bucket_floats is several). */
int ct_ddp_ce_buckets(const ct_ddp *d, int *of);
/* Embedding rows the last armed backward reduced as the lookup's share; -1 when the sparse
 * embedding gradient is off (or before the first armed backward). */
int ct_ddp_sparse_rows(const ct_ddp *d);

/* In place: grads[0..numel) becomes the mean over the ranks of `c`. bucket_floats 0 means
 * the default (25 MiB); the last bucket holds the remainder. Every rank must pass the same
 * numel and bucket_floats. Errors name the bucket and its offsets. */
ct_status ct_ddp_reduce_grads(ct_comm *c, float *grads, size_t numel, size_t bucket_floats);

#endif
