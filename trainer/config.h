/* trainer/config.h — the typed run configuration, loaded from TOML plus command-line overrides.
 *
 * Every key lives in one schema table (config.c): its section, name, type, field offset, the
 * allowed enum values and a one-line help. Loading walks the TOML document against the schema:
 * an unknown key is an error with a "did you mean" suggestion, a wrong type names the expected
 * one, and ct_config_validate() checks values and their relations (d_model % n_head, ...).
 * Errors carry "FILE:LINE:COL: key: ..." (or "override KEY=VALUE: ...") and CT_ERR_CONFIG.
 */
#ifndef CT_CONFIG_H
#define CT_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "kernels/registry.h"

#define CT_STR 256

typedef struct ct_model_cfg {
  char arch[16];        /* "gpt2" | "llama" */
  int n_layer;
  int n_head;
  int n_kv_head;        /* 0 -> n_head */
  int d_model;
  int head_dim;         /* 0 -> d_model / n_head */
  int d_ff;             /* 0 -> 4*d_model (gpt2), 8/3*d_model rounded up to 64 (llama) */
  int vocab_size;       /* real vocabulary */
  int vocab_pad;        /* the embedding/head rows are padded to a multiple of this */
  int max_seq_len;
  double rope_theta;
  double norm_eps;      /* 0 -> 1e-5 (gpt2), 1e-6 (llama) */
  bool qk_norm;         /* Qwen3: RMSNorm on each q and k head */
  bool tie_embeddings;
  bool attn_bias;       /* Qwen2: bias on the qkv projection (gpt2 always has biases) */
  double init_std;
  int numel_multiple;   /* not a config key: the trainer pads the flat buffer to a multiple of
                         * this (ZeRO shards it into equal slices); 0 = no padding */
  int head_chunk;       /* not a config key (kernels.head_chunk): the head matmul and the
                         * cross-entropy run over this many rows at a time, the head's backward
                         * right after each chunk, so logits exist for one chunk only (0: all) */
  bool no_grads;        /* not a config key: no full gradient buffer (ZeRO-2/3 repoint every
                         * unit's gradients to their own buffers before backward) */
  int tp_size, tp_rank; /* not config keys: tensor-parallel degree (0/1 = none) and this rank's
                         * place in its tp group; the model then holds its slice (parallel/tp.h) */
} ct_model_cfg;

typedef struct ct_data_cfg {
  char train[CT_STR];
  char val[CT_STR];     /* "" -> no validation */
  char tokenizer[CT_STR];
} ct_data_cfg;

typedef struct ct_train_cfg {
  int seq_len;
  int micro_batch;
  int grad_accum;
  int max_steps;
  double lr;
  double min_lr_ratio;  /* final lr = lr * min_lr_ratio for linear/cosine/wsd */
  char schedule[16];    /* constant | linear | cosine | wsd */
  int warmup_steps;
  double decay_frac;    /* wsd: fraction of max_steps spent decaying at the end */
  double weight_decay;
  double beta1, beta2, eps;
  double grad_clip;     /* 0 = off */
  int eval_every;       /* 0 = only at the end */
  int eval_steps;
  int checkpoint_every; /* 0 = only at the end */
  int keep_last;
  char out_dir[CT_STR]; /* "" -> runs/<config name> */
  uint64_t seed;
  char precision[8];    /* auto | fp32 | bf16 | fp16 */
  char loss_scale[8];   /* auto (dynamic for fp16, else off) | dynamic | off */
  char cuda_graphs[8];  /* auto (CUDA, small micro-batches) | on | off: step as a CUDA graph */
  int threads;          /* CPU threads, 0 = all cores (OMP_NUM_THREADS honoured) */
  int log_every;
  int sample_tokens;    /* tokens generated after training (0 = none) */
  char sample_prompt[CT_STR];
  char resume[8];       /* never | auto: continue from <out_dir>/ckpt/latest when it exists */
  char init_from[CT_STR]; /* start from this checkpoint's weights ("" = fresh init) */
  int stop_after;       /* stop (with a checkpoint) after this many steps in this invocation */
} ct_train_cfg;

typedef struct ct_parallel_cfg {
  char data[8];         /* ddp | zero1 | zero2 | zero3 (parallel/zero.h) */
  bool reshard_after_forward; /* zero3: gathered layers freed after forward (default true) */
  int tensor;           /* tensor-parallel degree (1 = none); data parallel = world / tensor */
  double bucket_mb;     /* gradient all-reduce bucket size */
  char reduce_dtype[8]; /* fp32 | bf16: what ddp's gradient buckets travel as */
  double timeout_s;     /* rendezvous and collective timeout */
  int overlap_ctas;     /* ddp (NCCL): CTAs of the overlapped bucket all-reduces, 0 (default) = no limit */
  bool sparse_embedding_grad; /* ddp: the embedding lookup's gradient reduced as its used rows
                              * (parallel/ddp.h; default false: no gain
                              * measured on 2 H200s) */
  bool ce_allreduce;    /* ddp (NCCL, one node): bucket all-reduces by the GPUs' copy engines
                         * (parallel/comm_ce.c; default false) */
  bool overlap;         /* ddp: buckets all-reduced while backward runs (default true), or all of
                         * them after it (false) */
} ct_parallel_cfg;

typedef struct ct_config {
  ct_model_cfg model;
  ct_data_cfg data;
  ct_train_cfg train;
  ct_parallel_cfg parallel;
  ct_kernels_cfg kernels; /* [attention] implementation, [kernels] use_kernels and the
                           * device.mode.op = "variant" entries (kernels/registry.h) */
  char name[CT_STR];    /* config file base name without .toml */
  char path[CT_STR];    /* the config file */
} ct_config;

/* Defaults for every key. */
void ct_config_defaults(ct_config *c);

/* Loads `path` (may be NULL: defaults only), applies overrides ("train.lr=3e-4", ...) in
 * order, fills derived defaults and validates. */
ct_status ct_config_load(const char *path, int n_overrides, char **overrides, ct_config *c);

/* Fills derived values (n_kv_head, head_dim, d_ff, norm_eps, out_dir) and checks every value
 * and the relations between them. Called by ct_config_load. */
ct_status ct_config_validate(ct_config *c);

/* Prints the resolved configuration as an aligned "key  value" table. */
void ct_config_print(const ct_config *c, FILE *f);

/* Writes the resolved configuration as TOML text (for checkpoints); returns malloc'd text. */
char *ct_config_to_toml(const ct_config *c);

/* Parses TOML text produced by ct_config_to_toml (from a checkpoint). */
ct_status ct_config_from_toml_text(const char *text, const char *origin, ct_config *c);

/* Derived model sizes. */
static inline int ct_model_padded_vocab(const ct_model_cfg *m) {
  return (m->vocab_size + m->vocab_pad - 1) / m->vocab_pad * m->vocab_pad;
}

#endif
