/* parallel/zero.h — ZeRO-1/2/3 data parallelism over the model's units.
 *
 * The flat buffer is a sequence of units (trainer/model.h: embeddings, each layer, final norm
 * and head), each padded to a multiple of 16 x world floats. Rank r of W owns slice r of every
 * unit (unit u of n_u floats: [off_u + r n_u/W, off_u + (r+1) n_u/W)); its shard is the
 * concatenation of those slices, numel / W floats in unit order (shard offset off_u / W).
 *
 *   stage 1  AdamW moments sharded. Gradients stay full; at the end of the step each unit is
 *            reduce-scattered (averaged) in place, AdamW updates the owned slices of the full
 *            master, and the slices are all-gathered back.
 *   stage 2  also gradients: the full gradient buffer is freed. Layer units alternate between
 *            two gradient buffers (the global units keep their own); after each unit's backward
 *            (post_backward hook) it is reduce-scattered into this rank's fp32 gradient shard,
 *            over NCCL on the overlap group's stream while the next layer's backward runs.
 *   stage 3  also parameters (FSDP-style): the full master and working weights are freed; each
 *            rank keeps its fp32 master shard and a working-dtype copy of it. A layer's weights
 *            are all-gathered into one of two rotating buffers just before its forward (the
 *            next layer is prefetched) and again before its backward; with
 *            reshard_after_forward = false every layer keeps its gathered weights from forward
 *            to backward instead (a full working copy). The global units stay gathered.
 *            The gathers go through a copy of the group (ct_comm_split) in overlap mode: over
 *            NCCL they run on a stream of their own, so the prefetch of the next layer overlaps
 *            this layer's compute (the compute stream joins before it reads a gathered layer).
 *
 * Gradient accumulation under stages 2/3: each backward's reduce-scatter SUMS, and the rank's
 * accumulated shard is added by placing it in its own block of the unit's gradient buffer
 * before the unit's backward. The trainer therefore scales the loss gradient by 1/W
 * (ct_zero_grad_factor) instead of averaging.
 *
 * Collectives are queued in call order on the communicator (NCCL: the compute stream, so
 * buffer reuse is stream-ordered); ct_zero_finish_grads and ct_zero_step end with ct_comm_sync,
 * the bounded wait. Every rank must call everything here in the same order.
 */
#ifndef CT_ZERO_H
#define CT_ZERO_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "optim/optim.h"
#include "parallel/comm.h"
#include "trainer/config.h"
#include "trainer/model.h"

typedef struct ct_zero ct_zero;

/* Floats each unit must be a multiple of (the model's numel_multiple) for `world` ranks. */
int ct_zero_numel_multiple(int world);

/* Shards a model whose full weights are final (initialized or loaded, identical on every
 * rank): allocates the shards, takes this rank's slices, frees what the stage does not keep,
 * repoints the model's units and installs its hooks. `full_moments` (optional: NULL = fresh)
 * holds AdamW moments for the whole flat buffer (a checkpoint's), whose step is taken too.
 * The model must have been created with numel_multiple = ct_zero_numel_multiple(size of c).
 * On failure the model is unusable; destroy it. */
ct_status ct_zero_create(ct_model *m, ct_comm *c, int stage, bool reshard_after_forward,
                         const ct_train_cfg *t, const ct_adamw *full_moments, ct_zero **out);
void ct_zero_destroy(ct_zero *z); /* frees the shards and buffers; the model keeps its hooks
                                   * cleared; NULL is ignored */

int ct_zero_stage(const ct_zero *z);
/* Factor the trainer multiplies its loss-gradient scale by: 1/W for stages 2/3 (summing
 * reduce-scatter), 1 for stage 1 (averaging). */
double ct_zero_grad_factor(const ct_zero *z);
/* Completed optimizer steps (the AdamW step counter). */
int ct_zero_adam_step(const ct_zero *z);

/* Start of an optimizer step: clears the gradients (the full buffer or the shard). */
void ct_zero_zero_grad(ct_zero *z);
/* After the last micro-batch's backward: stage 1 reduce-scatters every unit; all stages wait
 * (bounded) for the queued collectives. */
ct_status ct_zero_finish_grads(ct_zero *z);
/* 2-D mesh: the gradient norm also sums over the tensor-parallel group `tp` (not owned),
 * counting replicated parameters once. */
void ct_zero_set_tp(ct_zero *z, ct_comm *tp);
/* Global L2 norm of the averaged gradient, from per-shard sums of squares (collective). */
ct_status ct_zero_grad_norm(ct_zero *z, double *norm);
/* AdamW on this rank's shard (grad read as grad * grad_scale), then: stages 1/2 all-gather the
 * updated slices into every rank's master; stage 3 re-casts the working shard (the next
 * forward gathers). */
ct_status ct_zero_step(ct_zero *z, double lr, float grad_scale);

/* For a checkpoint (collective): `full` gets AdamW moments for the whole flat buffer (backend
 * memory, allocated here; free with ct_adamw_destroy) and the step; under stage 3 the full
 * fp32 master is gathered into a buffer lent to the model (ct_model_params works until
 * ct_zero_release_full). */
ct_status ct_zero_gather_full(ct_zero *z, ct_adamw *full);
void ct_zero_release_full(ct_zero *z, ct_adamw *full);
/* (full = NULL: only the stage-3 weights; sharded checkpoints save the moments per rank) */

/* This rank's slice of unit u: flat offset and floats in the model's buffer, offset in the
 * shard; and the shard's AdamW state (m, v: numel / world floats, backend memory; step). */
int ct_zero_n_units(const ct_zero *z);
void ct_zero_unit_slice(const ct_zero *z, int u, size_t *flat, size_t *n, size_t *at);
const ct_adamw *ct_zero_moments(const ct_zero *z);
/* Stage 3: this rank's fp32 master shard (numel / world floats, backend memory, the shard layout
 * of ct_zero_unit_slice's `at`), which sharded checkpoints save; NULL below stage 3 (the
 * model's full buffer holds the weights). */
const float *ct_zero_master_shard(const ct_zero *z);

#endif
