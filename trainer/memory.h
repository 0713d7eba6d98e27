/* trainer/memory.c — per-rank memory estimates for a parallel layout, and `ctrain memory`.
 *
 * A rank holds (bytes per parameter of its local model: n = its flat buffer, which tensor
 * parallelism divides by about T; dp = world / T):
 *              fp32 master   working copy*   gradients                optimizer (AdamW m, v)
 *   ddp        4n            2n              4n                       8n
 *   zero1      4n            2n              4n                       8n / dp
 *   zero2      4n            2n              4n / dp + unit buffers   8n / dp
 *   zero3      4n / dp       2n / dp + gathered units   4n / dp + unit buffers   8n / dp
 *   (* 16-bit working weights; none for fp32 compute, which runs on the master)
 * ddp with more than one rank and no tensor parallelism adds, to the gradients, its sparse
 * embedding gradient's buffers (parallel/ddp.h: the embedding's size again plus the packed rows);
 * "unit buffers" are the full gradients of the embedding and final units plus two layers'
 * (a layer's reduce-scatter overlaps the backward of the next);
 * "gathered units" the embedding and final units plus two layers (one with
 * parallel.reshard_after_forward = false: every layer). Activations are the model's own arena
 * sizing (ct_model_arena_bytes for the micro-batch), computed by creating the model with an op
 * table that allocates nothing.
 */
#ifndef CT_MEMORY_H
#define CT_MEMORY_H

#include <stdio.h>

#include "common/status.h"
#include "kernels/ops.h"
#include "trainer/config.h"
#include "trainer/model.h"

typedef struct ct_mem_estimate {
  int world, dp, tp;
  size_t numel;                       /* floats in this rank's flat buffer */
  size_t master, working, grads, optim, acts, workspace, total; /* bytes */
} ct_mem_estimate;

/* Estimate for one rank of `world` ranks laid out as cfg->parallel says, with op table `ops`
 * (its working dtype and attention-state sizing). CT_ERR_CONFIG when the layout cannot work
 * (parallel.tensor not dividing world, ...). */
ct_status ct_memory_estimate(const ct_config *cfg, int world, const ct_ops *ops, ct_mem_estimate *e);

/* Prints the table ("component  MiB") for an estimate. */
void ct_memory_print(const ct_config *cfg, const ct_mem_estimate *e, const char *ops_name, FILE *f);

/* Model state (master + working + gradients + optimizer) in bytes. */
size_t ct_memory_model_state(const ct_mem_estimate *e);

/* A model that holds no memory (an op table whose alloc hands out nothing): for its parameter
 * table and sizes only. Destroy with ct_model_destroy. */
ct_status ct_memory_table_model(const ct_model_cfg *cfg, const ct_ops *ops, ct_model **out);

/* `ctrain memory CONFIG.toml [--world N] [key=value ...]` */
ct_status ct_cmd_memory(int argc, char **argv);

#endif
