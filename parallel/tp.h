/* parallel/tp.h — tensor parallelism (Megatron-style) over a tp group of T ranks.
 *
 * The model (trainer/model.c, built with cfg.tp_size = T, cfg.tp_rank = k) holds rank k's slice
 * of every parameter (ct_param.tp_split): column-parallel qkv (its q, k and v heads; GQA kv
 * heads split too) and MLP up / gate_up (matching gate and up halves), row-parallel attention
 * output and MLP down (bias added by rank 0 only), vocab-parallel wte / lm_head (rows of the
 * padded vocabulary). It calls back here for:
 *   - one all-reduce (sum) of the activations after each row-parallel matmul in forward and of
 *     the input gradient of each column-parallel matmul in backward (and of the q/k-norm
 *     weight gradients, which are partial sums over a rank's heads);
 *   - the vocab-parallel cross-entropy: per-row max, sum of exp and target logit over this
 *     rank's columns (ops->xent_stats), all-reduced over the group (max, then sums), the loss
 *     and log-sum-exp on the host, and the gradient in place (ops->xent_grad), so full logits
 *     are never gathered.
 * A 2-D mesh pairs it with data parallelism: tp = split(world, r / T, r % T),
 * dp = split(world, r % T, r / T); ZeRO / DDP then run over dp on each rank's local buffer.
 *
 * Checkpoints hold whole tensors: ct_tp_cut takes rank k's slice out of a full model's flat
 * buffer, ct_tp_paste puts it back (both host memory, same parameter order and names).
 */
#ifndef CT_TP_H
#define CT_TP_H

#include "common/status.h"
#include "parallel/comm.h"
#include "trainer/model.h"

typedef struct ct_tp ct_tp;

/* Installs the model's tp callbacks over group `tp` (size = the model's tp degree, which must
 * equal cfg.tp_size; the model's tp rank must equal the rank in `tp`). max_tokens = B * T of
 * the largest forward. */
ct_status ct_tp_create(ct_model *m, ct_comm *tp, int max_tokens, ct_tp **out);
void ct_tp_destroy(ct_tp *t); /* clears the model's callbacks; NULL is ignored */

/* Global L2 norm of the gradients of a tp model (replicated parameters counted once; the
 * gradient must already be data-parallel averaged). Collective over the tp group. */
ct_status ct_tp_grad_norm(ct_tp *t, double *norm);

/* Weight of a parameter's squared gradient in a tp-wide sum: 1 / T for the ones every tp rank
 * holds in full (replicated, and the partial ones after their all-reduce), else 1. */
double ct_tp_norm_weight(const ct_param *p, int T);

/* Host buffers: full_buf (numel of `full`, a model with tp_size 1) <-> local_buf (numel of
 * `local`, the tp model of rank k of T). Padding between parameters is left alone. */
void ct_tp_cut(const ct_model *full, const float *full_buf, const ct_model *local, float *local_buf,
               int k);
void ct_tp_paste(const ct_model *full, float *full_buf, const ct_model *local,
                 const float *local_buf, int k);

/* Rows of local parameter p (rank k; T = 1 maps a table onto itself) as up to 3 segments of
 * full parameter f: seg[j] = {first local row, first full row, rows}; the local columns start
 * at full column *fcol0. Returns the number of segments. */
int ct_tp_segments(const ct_model *full, const ct_param *p, const ct_param *f, int k,
                   int seg[3][3], int *fcol0);

#endif
