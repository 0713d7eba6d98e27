/* trainer/model.h — decoder-only transformer (gpt2 / llama families) over the op table.
 *
 * Parameters live in one flat fp32 buffer described by a parameter table generated from one
 * X-macro list per architecture (model.c); gradients mirror it exactly (same offsets), and
 * optimizer state, checkpoints and HF name mapping work on the same table. Each layer's
 * parameters are contiguous, in layer order, so a layer is one slice of the buffer (what
 * ZeRO-3 gathers).
 *
 * Forward with `grad_scale != 0` computes the loss and writes d(grad_scale * sum of token
 * losses)/d(logits) in place of the logits; backward then propagates it and ACCUMULATES into
 * the gradient buffer, so gradient accumulation over micro-batches is: zero_grad, then
 * (forward, backward) per micro-batch with grad_scale = 1 / (B * T * accum).
 */
#ifndef CT_MODEL_H
#define CT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/ops.h"
#include "trainer/config.h"

typedef enum ct_init { CT_INIT_NORMAL, CT_INIT_NORMAL_RESID, CT_INIT_ZERO, CT_INIT_ONE } ct_init;

typedef struct ct_param {
  char name[96];     /* ctrain name, e.g. "h.3.attn.c_attn.weight" */
  int ndim;          /* 1 or 2 */
  int shape[2];      /* (rows, cols) for 2-D (rows = out features), (n) for 1-D */
  size_t offset;     /* in floats, into the flat parameter buffer */
  size_t numel;
  int layer;         /* -1 for embeddings / final norm / head */
  ct_init init;
  bool decay;        /* weight decay applies (2-D parameters) */
  int tp_split;      /* how tensor parallelism cuts it (ct_tp_split); shape is the local slice */
} ct_param;

/* Tensor-parallel cut of a parameter (Megatron): rank k of T holds
 *   CT_TP_REPLICATED  all of it (norms, row-parallel biases, wpe; identical on every rank)
 *   CT_TP_ROWS        rows [k R/T, (k+1) R/T) (gpt2 c_fc, vocab-parallel wte / lm_head)
 *   CT_TP_COLS        columns [k C/T, (k+1) C/T) (row-parallel attention output, MLP down)
 *   CT_TP_QKV         its q heads, then its k heads, then its v heads (fused qkv rows)
 *   CT_TP_GATE_UP     rows [k F/T ..) of the gate half, then the same of the up half
 *   CT_TP_PARTIAL     replicated, but each rank's gradient is a partial sum over its heads
 *                     (q_norm / k_norm: summed over the tp group in backward) */
enum ct_tp_split { CT_TP_REPLICATED, CT_TP_ROWS, CT_TP_COLS, CT_TP_QKV, CT_TP_GATE_UP, CT_TP_PARTIAL };

typedef struct ct_model ct_model;

/* Tensor parallelism (parallel/tp.c), set when cfg.tp_size > 1: the model holds its slice of
 * every parameter (ct_param.tp_split) and calls these at the Megatron points. */
typedef struct ct_model_tp {
  void *ctx;
  /* In place: n elements (working dtype, or fp32 when f32) become the sum over the tp group. */
  ct_status (*all_reduce)(void *ctx, void *buf, size_t n, bool f32);
  /* Vocab-parallel cross-entropy over this rank's logits columns (N, Vp / T; working dtype,
   * backend memory) for host targets (N): host_losses[n] gets the full-vocabulary token loss;
   * with grad_scale != 0 the logits become their gradient (as ops->xent_fwd_bwd). */
  ct_status (*xent)(void *ctx, float *host_losses, void *logits, const int32_t *targets, int N,
                    float grad_scale);
} ct_model_tp;

/* Per-unit hooks, called by ct_model_forward / ct_model_backward when set (NULL = none).
 * Units: 0 = embeddings (wte, wpe), 1..L = layers, L+1 = final norm (+ untied head).
 * pre_forward(u) before unit u's forward; pre_backward(u) before unit u's backward
 * (pre_backward(L+1) comes first and stands for both global units, since a tied head writes
 * wte's gradient); post_backward(u) once unit u's gradients are final for this backward
 * (order L+1, L, ..., 1, 0: the reverse of the flat-buffer order). A non-OK status ends the
 * pass with that status. The eval-only cached forward (generate) calls no hooks. */
typedef struct ct_model_hooks {
  void *ctx;
  ct_status (*pre_forward)(void *ctx, int unit);
  ct_status (*pre_backward)(void *ctx, int unit);
  ct_status (*post_backward)(void *ctx, int unit);
} ct_model_hooks;

/* Builds the parameter table, allocates parameters and gradients (zeroed) through `ops`, and
 * activations for up to max_B sequences of max_T tokens. */
ct_status ct_model_create(const ct_model_cfg *cfg, const ct_ops *ops, int max_B, int max_T,
                          ct_model **out);
void ct_model_destroy(ct_model *m);

/* Seeded initialization: normal(0, init_std) for weights, init_std / sqrt(2 n_layer) for the
 * residual output projections, zeros for biases and embedding padding rows, ones for norm
 * weights. Deterministic for a seed. */
void ct_model_init_weights(ct_model *m, uint64_t seed);

int ct_model_n_params(const ct_model *m);
const ct_param *ct_model_param(const ct_model *m, int i);
const ct_param *ct_model_find_param(const ct_model *m, const char *name);
size_t ct_model_numel(const ct_model *m);       /* floats in the flat buffer */
float *ct_model_params(ct_model *m);             /* flat fp32 parameters (backend memory) */
float *ct_model_grads(ct_model *m);              /* flat fp32 gradients (backend memory) */
const ct_model_cfg *ct_model_config(const ct_model *m);
const ct_ops *ct_model_ops(const ct_model *m);
int ct_model_max_B(const ct_model *m);           /* most sequences the activations hold */
int ct_model_max_T(const ct_model *m);           /* longest sequence the activations hold */
/* The token embedding table (wte / embed_tokens): (padded vocabulary, d_model), the first tensor
 * of unit 0. */
const ct_param *ct_model_embedding(const ct_model *m);

/* Forward pass over inputs (B,T) (host int32). With targets (B,T), *mean_loss receives the
 * mean token loss; grad_scale != 0 prepares backward (see above). targets may be NULL
 * (inference: logits only). With grad_scale == 0 (evaluation) nothing is kept for backward:
 * every block runs in the first block's activation slots. */
ct_status ct_model_forward(ct_model *m, const int32_t *inputs, const int32_t *targets, int B,
                           int T, float grad_scale, float *mean_loss);
/* Backward for the last forward (which must have had grad_scale != 0). */
ct_status ct_model_backward(ct_model *m);
void ct_model_zero_grad(ct_model *m);

/* One micro-batch of training: forward with targets (grad_scale != 0) then backward, as the two
 * calls above. With graphs on (ct_model_set_graphs, backends with graph capture), the device work
 * of both is recorded once as a graph after two direct runs with the same (B, T, grad_scale) and
 * replayed afterwards: only the batch copy, the loss read-back and the launch stay on the host.
 * Results are bit-identical to the direct path. A different shape or scale records again. */
ct_status ct_model_train_micro(ct_model *m, const int32_t *inputs, const int32_t *targets, int B,
                               int T, float grad_scale, float *mean_loss);
void ct_model_set_graphs(ct_model *m, bool on); /* ignored (stays off) without graph capture */
bool ct_model_graphs(const ct_model *m);

/* Logits of the last forward without targets: (B, T, Vp) in backend memory, in the working
 * dtype (a float * only for fp32 tables; use ct_model_logits_to_host otherwise). */
const float *ct_model_logits(const ct_model *m);
/* Copies `rows` logit rows (Vp each) starting at row `first_row` to host fp32. */
void ct_model_logits_to_host(const ct_model *m, size_t first_row, size_t rows, float *dst);

/* ---- inference with a KV cache ----
 * Per layer K and V of shape (KV, max_T, hd) for each of max_B sequences, in backend memory.
 * Sequences are independent (each has its own length), so prompts of different lengths are
 * prefilled one by one and decoded together without padding. */
typedef struct ct_kv_cache ct_kv_cache;
ct_status ct_kv_cache_create(const ct_model *m, int max_B, int max_T, ct_kv_cache **out);
void ct_kv_cache_destroy(ct_kv_cache *c);
void ct_kv_cache_reset(ct_kv_cache *c, int b);
int ct_kv_cache_len(const ct_kv_cache *c, int b);
int ct_kv_cache_capacity(const ct_kv_cache *c);
/* Runs n new tokens of sequence b (positions len .. len+n-1) through the model, appending their
 * keys and values to the cache; writes the last token's logits (Vp floats) to logits_host.
 * n must fit the model's activations (n <= max_B * max_T given to ct_model_create) and the
 * cache (len + n <= its max_T). Uses the eval path: nothing is kept for backward. */
ct_status ct_model_forward_cached(ct_model *m, ct_kv_cache *c, int b, const int32_t *tokens,
                                  int n, float *logits_host);

/* ---- batched inference engine ----
 * Decodes a batch of sequences with ONE forward per step (row n = one sequence's new token, its
 * position and cache slot in device buffers, attention over each row's own cache length) and
 * prefills prompts through the eval path (flash attention from position 0, cached attention
 * after). Layers can live on several devices (a device map): each device holds the working
 * weights of its layers (the embedding on the first, the final norm and head on the last), their
 * KV caches and its own activations; the hidden state hops between devices (peer to peer where
 * possible). With a backend that has graphs, a decode step of a given batch size is captured as
 * a CUDA graph once and replayed: what changes between steps (tokens, positions, slots) is
 * written to fixed device buffers before the launch.
 *
 * The model's weights are read once at creation: from the model's own working copy when `ops`
 * is the model's table and everything is on one device (no copy), otherwise from the fp32
 * master on the host (a model built on the CPU table), cast to ops' working dtype per device. */
typedef struct ct_infer ct_infer;

typedef struct ct_infer_cfg {
  int max_seqs;          /* sequence slots in the KV cache (the largest decode batch) */
  int max_len;           /* tokens per sequence, prompt + generated (<= model.max_seq_len) */
  int max_rows;          /* rows one prefill forward holds (prompt chunk) */
  const int *layer_dev;  /* (n_layer) device index of each layer, non-decreasing; NULL: all on
                            device `device` */
  int device;            /* the device when layer_dev is NULL (-1: the backend's current one) */
  int graphs;            /* CUDA graphs for decode steps: 1 on, 0 off, -1 auto (on where the
                            backend has them); a failed capture is an error either way */
  int logit_rows;        /* rows of logits computed at once (ct_infer_loss); 0: max_seqs */
} ct_infer_cfg;
#define CT_INFER_CFG_INIT {1, 0, 512, NULL, -1, -1, 0}

ct_status ct_infer_create(ct_model *m, const ct_ops *ops, const ct_infer_cfg *cfg, ct_infer **out);
void ct_infer_destroy(ct_infer *e);
ct_model *ct_infer_model(const ct_infer *e);
/* Forgets sequence slot `slot`'s tokens (its length becomes 0). */
void ct_infer_reset(ct_infer *e, int slot);
int ct_infer_len(const ct_infer *e, int slot);
int ct_infer_capacity(const ct_infer *e);   /* max_len */
int ct_infer_max_rows(const ct_infer *e);
/* Decode steps replayed from captured graphs so far (0 when graphs are off). */
long ct_infer_graph_steps(const ct_infer *e);
/* Decode steps that were queued ahead and taken (ct_infer_decode). */
long ct_infer_ahead_steps(const ct_infer *e);
/* One line per device: "cuda:0: layers 0-13 + embedding, 1.23 GiB weights, 0.10 GiB KV cache". */
void ct_infer_describe(const ct_infer *e, char *buf, size_t cap);

/* Runs n tokens of each of nseq sequences (slots[b], tokens (nseq, n) row-major) whose current
 * lengths are all equal, appending keys and values to their caches; nseq * n <= max_rows.
 * Outputs for each sequence's last token: logits (nseq, Vp) fp32 host and / or argmax ids
 * (nseq) over the real vocabulary; either may be NULL. */
ct_status ct_infer_prefill(ct_infer *e, int nseq, const int *slots, const int32_t *tokens, int n,
                           float *logits, int32_t *ids);
/* One decode step: token tokens[b] of sequence slots[b] (distinct slots, nseq <= max_seqs) at
 * position ct_infer_len(slots[b]); outputs as ct_infer_prefill. With greedy ids only (logits
 * NULL) on one CUDA device the call queues the next step for the same rows before returning,
 * fed with these ids on the device (CT_DECODE_AHEAD=0: never); a next call with those rows and
 * tokens takes it, any other engine call waits for it and drops it. The step's argmax writes the
 * ids into mapped host memory itself (CT_DECODE_ZEROCOPY=0: a copy queued after the step). */
ct_status ct_infer_decode(ct_infer *e, int nseq, const int *slots, const int32_t *tokens,
                          float *logits, int32_t *ids);
/* Waits for a decode step queued ahead and drops it (the engine is then idle). */
void ct_infer_settle(ct_infer *e);

/* Evaluation: nseq fresh sequences of T tokens (inputs and targets (nseq, T) row-major,
 * nseq * T <= max_rows, nseq <= max_seqs) through the eval path; adds the token losses
 * (natural log) of targets >= 0 to *sum and their count to *count. Uses (and resets) slots
 * 0 .. nseq-1. Equals ct_model_forward's loss, computed across the engine's devices. */
ct_status ct_infer_loss(ct_infer *e, int nseq, const int32_t *inputs, const int32_t *targets,
                        int T, double *sum, long *count);

/* Device map: assigns layers to devices for ct_infer_cfg.layer_dev. spec: "auto" (device 0 if
 * the model fits there, else balanced), "balanced" (layers spread evenly over the devices),
 * "sequential" (fill device 0 to its budget, then 1, ...), or "cuda:N" / "N" (all on one).
 * max_memory (may be NULL or ""): "0=20GiB,1=40GiB" budgets (GiB, MiB, GB, MB or bytes); devices
 * without a budget get 90% of their free memory. Counts working weights (embedding on the
 * first device, final norm + head on the last, a tied head copied there), each layer's KV cache
 * for max_seqs x max_len tokens and activations. CT_ERR_USAGE for a bad spec, CT_ERR_RUNTIME
 * when the model does not fit; report (may be NULL) receives the placement. */
ct_status ct_infer_plan(const ct_model *m, const ct_ops *ops, const char *spec,
                        const char *max_memory, int max_seqs, int max_len, int max_rows,
                        int *layer_dev, char *report, size_t report_cap);
/* Only the spelling of a device map and a --max_memory (NULL or "" for none), no device asked:
 * CT_ERR_USAGE naming the option for a bad one. */
ct_status ct_device_map_check(const char *spec, const char *max_memory);
/* ---- units: what data-parallel sharding works on (parallel/zero.c, parallel/ddp.c) ----
 * The flat buffer is the units in order; with cfg.numel_multiple = k each unit is padded to a
 * multiple of k floats (ZeRO cuts each unit into equal slices). */
int ct_model_n_units(const ct_model *m); /* n_layer + 2 */
void ct_model_unit(const ct_model *m, int u, size_t *offset, size_t *numel);
/* Repoints unit u's working weights (unit's numel elements of the working dtype) and/or fp32
 * gradients (NULL keeps the current one). Not owned; the caller keeps them alive. */
void ct_model_set_unit(ct_model *m, int u, char *weights, float *grads);
void ct_model_set_hooks(ct_model *m, const ct_model_hooks *h); /* NULL clears */
/* Where backward adds the token lookup's share of the embedding gradient: dwte (the embedding's
 * shape, fp32, backend memory, not owned) instead of the embedding's own gradient, which then
 * holds only the tied head's share; NULL restores. DDP reduces the two apart (parallel/ddp.c). */
void ct_model_set_embed_grad(ct_model *m, float *dwte);
void ct_model_set_tp(ct_model *m, const ct_model_tp *tp);
int ct_model_tp_size(const ct_model *m); /* 1 without tensor parallelism */
/* Bytes of the activation arena (what forward keeps for backward plus backward scratch). With
 * an op table whose alloc hands out no real memory (trainer/memory.c), a model can be created
 * just to size a layout. */
size_t ct_model_arena_bytes(const ct_model *m);
/* Frees the full gradient buffer (grads) and/or the full master + working weights (params);
 * afterwards ct_model_grads / ct_model_params return NULL and every unit must have been
 * repointed with ct_model_set_unit. ZeRO-2 drops grads, ZeRO-3 both. */
void ct_model_drop_full(ct_model *m, bool params, bool grads);
/* Temporarily lends a full fp32 master buffer (numel floats, backend memory, not owned) as
 * ct_model_params, e.g. for saving a checkpoint under ZeRO-3; returns the previous one. */
float *ct_model_attach_params(ct_model *m, float *w);

/* Parameter count excluding embedding padding rows. */
size_t ct_model_count_params(const ct_model *m);

/* Training FLOPs per token (6N + attention), for MFU and throughput reports. */
double ct_model_flops_per_token(const ct_model *m, int T);

#endif
