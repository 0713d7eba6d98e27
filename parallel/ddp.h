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

#define CT_DDP_BUCKET_MB_DEFAULT 25.0 /* parallel.bucket_mb, as torch DDP's bucket_cap_mb */

/* Elements of fp32 in a bucket of `bucket_mb` MiB (<= 0: the default); at least 1. */
size_t ct_ddp_bucket_floats(double bucket_mb);

/* In place: grads[0..numel) becomes the mean over the ranks of `c`. bucket_floats 0 means
 * the default (25 MiB); the last bucket holds the remainder. Every rank must pass the same
 * numel and bucket_floats. Errors name the bucket and its offsets. */
ct_status ct_ddp_reduce_grads(ct_comm *c, float *grads, size_t numel, size_t bucket_floats);

#endif
