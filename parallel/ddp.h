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

#include <stddef.h>

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
 * each call blocks, so the CPU simply issues each bucket as soon as it is ready. */
typedef struct ct_ddp ct_ddp;

/* Installs the hook on `model` (not owned; neither is c). reduce_dtype CT_F32 reduces the fp32
 * gradients in place; CT_BF16 rounds each bucket into a bf16 buffer of the model's backend
 * (numel x 2 bytes), reduces that (half the bytes on the wire, like torch DDP's
 * bf16_compress_hook) and widens the averages back into the fp32 gradients in ct_ddp_finish. */
/* overlap_ctas > 0 (NCCL): the buckets issued while backward still runs go to a lean
 * communicator of at most overlap_ctas CTAs (ct_comm_make_lean, made here: collective), so
 * they take few multiprocessors from backward's kernels; the last bucket, which nothing
 * overlaps, goes to the full communicator. 0: every bucket to the full one. */
ct_status ct_ddp_create(ct_model *model, ct_comm *c, size_t bucket_floats, ct_dtype reduce_dtype,
                        int overlap_ctas, ct_ddp **out);
void ct_ddp_destroy(ct_ddp *d); /* clears the model's hooks; NULL is ignored */
/* Whether the next backward reduces (the last micro-batch of a step; earlier ones only
 * accumulate, like torch's no_sync()). */
ct_status ct_ddp_arm(ct_ddp *d, bool reduce);
/* After the armed backward: every bucket is queued; joins the side stream and waits (bounded)
 * for the results. */
ct_status ct_ddp_finish(ct_ddp *d);
/* Buckets issued by the last armed backward (for the log and tests). */
int ct_ddp_buckets(const ct_ddp *d);

/* In place: grads[0..numel) becomes the mean over the ranks of `c`. bucket_floats 0 means
 * the default (25 MiB); the last bucket holds the remainder. Every rank must pass the same
 * numel and bucket_floats. Errors name the bucket and its offsets. */
ct_status ct_ddp_reduce_grads(ct_comm *c, float *grads, size_t numel, size_t bucket_floats);

#endif
