#include "trainer/config.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/toml.h"
#include "common/util.h"

typedef enum { K_INT, K_U64, K_FLOAT, K_BOOL, K_STR, K_ENUM } key_kind;

typedef struct key_def {
  const char *section;
  const char *name;
  key_kind kind;
  size_t off;           /* offset of the field in ct_config */
  size_t size;          /* for strings: capacity */
  const char *choices;  /* K_ENUM: "|"-separated */
  const char *help;
} key_def;

#define F(sec, field) offsetof(ct_config, sec.field)
#define S(sec, field) sizeof(((ct_config *)0)->sec.field)

/* The one schema: loading, unknown-key suggestions, printing and serialization all walk it.
 * Keys of a section stay together: ct_config_to_toml writes one [section] header per run. */
static const key_def KEYS[] = {
  {"model", "arch", K_ENUM, F(model, arch), S(model, arch), "gpt2|llama", "architecture family"},
  {"model", "n_layer", K_INT, F(model, n_layer), 0, NULL, "transformer blocks"},
  {"model", "n_head", K_INT, F(model, n_head), 0, NULL, "query heads"},
  {"model", "n_kv_head", K_INT, F(model, n_kv_head), 0, NULL, "key/value heads (0 = n_head)"},
  {"model", "d_model", K_INT, F(model, d_model), 0, NULL, "model width"},
  {"model", "head_dim", K_INT, F(model, head_dim), 0, NULL, "per-head width (0 = d_model/n_head)"},
  {"model", "d_ff", K_INT, F(model, d_ff), 0, NULL, "MLP hidden width (0 = arch default)"},
  {"model", "vocab_size", K_INT, F(model, vocab_size), 0, NULL, "vocabulary size"},
  {"model", "vocab_pad", K_INT, F(model, vocab_pad), 0, NULL, "pad embedding rows to a multiple"},
  {"model", "max_seq_len", K_INT, F(model, max_seq_len), 0, NULL, "longest sequence"},
  {"model", "rope_theta", K_FLOAT, F(model, rope_theta), 0, NULL, "RoPE base (llama)"},
  {"model", "norm_eps", K_FLOAT, F(model, norm_eps), 0, NULL, "norm epsilon (0 = arch default)"},
  {"model", "qk_norm", K_BOOL, F(model, qk_norm), 0, NULL, "RMSNorm on q/k heads (Qwen3)"},
  {"model", "tie_embeddings", K_BOOL, F(model, tie_embeddings), 0, NULL, "lm head = embedding"},
  {"model", "attn_bias", K_BOOL, F(model, attn_bias), 0, NULL, "qkv bias (llama; Qwen2)"},
  {"model", "init_std", K_FLOAT, F(model, init_std), 0, NULL, "init standard deviation"},
  {"data", "train", K_STR, F(data, train), S(data, train), NULL, "training tokens (HDF5)"},
  {"data", "val", K_STR, F(data, val), S(data, val), NULL, "validation tokens (HDF5)"},
  {"data", "tokenizer", K_STR, F(data, tokenizer), S(data, tokenizer), NULL, "tokenizer"},
  {"train", "seq_len", K_INT, F(train, seq_len), 0, NULL, "tokens per sequence"},
  {"train", "micro_batch", K_INT, F(train, micro_batch), 0, NULL, "sequences per micro-batch"},
  {"train", "grad_accum", K_INT, F(train, grad_accum), 0, NULL, "micro-batches per step"},
  {"train", "max_steps", K_INT, F(train, max_steps), 0, NULL, "optimizer steps"},
  {"train", "lr", K_FLOAT, F(train, lr), 0, NULL, "peak learning rate"},
  {"train", "min_lr_ratio", K_FLOAT, F(train, min_lr_ratio), 0, NULL, "final lr / peak lr"},
  {"train", "schedule", K_ENUM, F(train, schedule), S(train, schedule),
   "constant|linear|cosine|wsd", "lr schedule after warmup"},
  {"train", "warmup_steps", K_INT, F(train, warmup_steps), 0, NULL, "linear warmup steps"},
  {"train", "decay_frac", K_FLOAT, F(train, decay_frac), 0, NULL, "wsd: decay fraction"},
  {"train", "weight_decay", K_FLOAT, F(train, weight_decay), 0, NULL, "AdamW decoupled decay"},
  {"train", "beta1", K_FLOAT, F(train, beta1), 0, NULL, "AdamW beta1"},
  {"train", "beta2", K_FLOAT, F(train, beta2), 0, NULL, "AdamW beta2"},
  {"train", "eps", K_FLOAT, F(train, eps), 0, NULL, "AdamW epsilon"},
  {"train", "grad_clip", K_FLOAT, F(train, grad_clip), 0, NULL, "global-norm clip (0 = off)"},
  {"train", "eval_every", K_INT, F(train, eval_every), 0, NULL, "steps between evals"},
  {"train", "eval_steps", K_INT, F(train, eval_steps), 0, NULL, "batches per eval"},
  {"train", "checkpoint_every", K_INT, F(train, checkpoint_every), 0, NULL, "steps between checkpoints"},
  {"train", "keep_last", K_INT, F(train, keep_last), 0, NULL, "checkpoints kept (0 = all)"},
  {"train", "out_dir", K_STR, F(train, out_dir), S(train, out_dir), NULL, "output directory"},
  {"train", "seed", K_U64, F(train, seed), 0, NULL, "seed for init and data order"},
  {"train", "precision", K_ENUM, F(train, precision), S(train, precision), "auto|fp32|bf16|fp16",
   "compute precision"},
  {"train", "cuda_graphs", K_ENUM, F(train, cuda_graphs), S(train, cuda_graphs), "auto|on|off",
   "record the training step as a CUDA graph (auto: with CUDA, <= 16384 tokens per micro-batch)"},
  {"train", "loss_scale", K_ENUM, F(train, loss_scale), S(train, loss_scale), "auto|dynamic|off",
   "dynamic loss scaling (auto: for fp16)"},
  {"train", "threads", K_INT, F(train, threads), 0, NULL, "CPU threads (0 = all)"},
  {"train", "log_every", K_INT, F(train, log_every), 0, NULL, "steps between log lines"},
  {"train", "sample_tokens", K_INT, F(train, sample_tokens), 0, NULL, "tokens sampled at the end"},
  {"train", "sample_prompt", K_STR, F(train, sample_prompt), S(train, sample_prompt), NULL,
   "prompt for the final sample"},
  {"train", "resume", K_ENUM, F(train, resume), S(train, resume), "never|auto",
   "auto: continue from out_dir's latest checkpoint"},
  {"train", "stop_after", K_INT, F(train, stop_after), 0, NULL,
   "stop after N steps this run, with a checkpoint (0 = off)"},
  {"train", "init_from", K_STR, F(train, init_from), S(train, init_from), NULL,
   "start from a checkpoint's weights"},
  {"parallel", "data", K_ENUM, F(parallel, data), S(parallel, data), "ddp|zero1|zero2|zero3",
   "ddp: replicated; zero1: optimizer state sharded; zero2: + gradients; zero3: + parameters"},
  {"parallel", "tensor", K_INT, F(parallel, tensor), 0, NULL,
   "tensor-parallel degree T (data parallel = world / T)"},
  {"parallel", "reshard_after_forward", K_BOOL, F(parallel, reshard_after_forward), 0, NULL,
   "zero3: free gathered layers after forward (false: keep them for backward)"},
  {"parallel", "bucket_mb", K_FLOAT, F(parallel, bucket_mb), 0, NULL, "all-reduce bucket (MiB)"},
  {"parallel", "reduce_dtype", K_ENUM, F(parallel, reduce_dtype), S(parallel, reduce_dtype),
   "fp32|bf16", "ddp: gradient buckets all-reduced in fp32, or rounded to bf16 (half the bytes)"},
  {"parallel", "overlap_ctas", K_INT, F(parallel, overlap_ctas), 0, NULL,
   "ddp over NCCL: multiprocessors the bucket all-reduces overlapped with backward may take "
   "(0 = no limit); the last bucket always gets all"},
  {"parallel", "sparse_embedding_grad", K_BOOL, F(parallel, sparse_embedding_grad), 0, NULL,
   "ddp without tensor parallelism: the embedding's gradient reduced early, the lookup's as the "
   "rows the step's tokens use"},
  {"parallel", "ce_allreduce", K_BOOL, F(parallel, ce_allreduce), 0, NULL,
   "ddp over NCCL on one node: gradient buckets all-reduced by the GPUs' copy engines over "
   "NVLink (peer copies + one add kernel) instead of NCCL's kernels"},
  {"parallel", "overlap", K_BOOL, F(parallel, overlap), 0, NULL,
   "ddp: all-reduce the gradient buckets while backward still runs (true), or every bucket after "
   "it (false: no all-reduce competes with backward's kernels)"},
  {"parallel", "timeout_s", K_FLOAT, F(parallel, timeout_s), 0, NULL,
   "rendezvous / collective timeout"},
  {"attention", "implementation", K_ENUM, F(kernels, attention), S(kernels, attention),
   "auto|sdpa|eager|flash|cudnn", "attention kernels (auto/sdpa: fastest available)"},
  {"attention", "deterministic", K_BOOL, F(kernels, deterministic), 0, NULL,
   "bit-reproducible backward: auto takes flash, cudnn its deterministic algorithm"},
  {"kernels", "use_kernels", K_BOOL, F(kernels, use_kernels), 0, NULL,
   "optimized kernel variants (false: the reference ones)"},
  {"kernels", "head_chunk", K_INT, F(kernels, head_chunk), 0, NULL,
   "fused head + cross-entropy over chunks of N rows: logits for one chunk only (0 = off)"},
  /* + [kernels] DEVICE.MODE.OP = "VARIANT" entries, checked against kernels/registry.c */
};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

void ct_config_defaults(ct_config *c) {
  memset(c, 0, sizeof *c);
  ct_model_cfg *m = &c->model;
  snprintf(m->arch, sizeof m->arch, "gpt2");
  m->n_layer = 4; m->n_head = 4; m->d_model = 128;
  m->vocab_size = 257; m->vocab_pad = 64; m->max_seq_len = 256;
  m->rope_theta = 10000.0; m->tie_embeddings = true; m->init_std = 0.02;
  snprintf(c->data.train, CT_STR, "data/fortunes/train.h5");
  snprintf(c->data.val, CT_STR, "data/fortunes/val.h5");
  snprintf(c->data.tokenizer, CT_STR, "byte");
  ct_train_cfg *t = &c->train;
  t->seq_len = 128; t->micro_batch = 8; t->grad_accum = 1; t->max_steps = 100;
  t->lr = 1e-3; t->min_lr_ratio = 0.1; snprintf(t->schedule, sizeof t->schedule, "cosine");
  t->warmup_steps = 0; t->decay_frac = 0.2; t->weight_decay = 0.1;
  t->beta1 = 0.9; t->beta2 = 0.95; t->eps = 1e-8; t->grad_clip = 1.0;
  t->eval_every = 0; t->eval_steps = 10; t->checkpoint_every = 0; t->keep_last = 3;
  t->seed = 1337; snprintf(t->precision, sizeof t->precision, "auto");
  snprintf(t->loss_scale, sizeof t->loss_scale, "auto");
  snprintf(t->cuda_graphs, sizeof t->cuda_graphs, "auto");
  t->log_every = 10; t->sample_tokens = 0;
  snprintf(t->resume, sizeof t->resume, "never");
  snprintf(c->parallel.data, sizeof c->parallel.data, "ddp");
  c->parallel.bucket_mb = 25;
  snprintf(c->parallel.reduce_dtype, sizeof c->parallel.reduce_dtype, "fp32");
  c->parallel.timeout_s = 600;
  c->parallel.overlap_ctas = 0;
  c->parallel.reshard_after_forward = true;
  c->parallel.sparse_embedding_grad = false;
  c->parallel.ce_allreduce = false;
  c->parallel.overlap = true;
  c->parallel.tensor = 1;
  c->kernels.use_kernels = true;
  snprintf(c->kernels.attention, sizeof c->kernels.attention, "auto");
  c->kernels.n = 0;
}

static const key_def *find_key(const char *section, const char *name) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (!strcmp(KEYS[i].section, section) && !strcmp(KEYS[i].name, name)) return &KEYS[i];
  return NULL;
}

/* "did you mean" over all full keys; empty when nothing is close. */
static void suggest(const char *full, char *out, size_t cap) {
  int best = 1 << 30;
  char cand[128];
  out[0] = '\0';
  for (size_t i = 0; i < N_KEYS; i++) {
    snprintf(cand, sizeof cand, "%s.%s", KEYS[i].section, KEYS[i].name);
    int d = ct_edit_distance(full, cand);
    if (d < best) { best = d; snprintf(out, cap, "%s", cand); }
  }
  if (best > 3 && best * 3 > (int)strlen(full)) out[0] = '\0';
}

static bool enum_ok(const char *choices, const char *v) {
  size_t n = strlen(v);
  for (const char *p = choices; *p;) {
    const char *e = strchr(p, '|');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && !strncmp(p, v, n)) return true;
    if (!e) break;
    p = e + 1;
  }
  return false;
}

/* `where` is "FILE:LINE:COL" or "override K=V". */
static ct_status set_value(ct_config *c, const key_def *k, const ct_toml_value *v,
                           const char *where) {
  char *field = (char *)c + k->off;
  char full[128];
  snprintf(full, sizeof full, "%s.%s", k->section, k->name);
  switch (k->kind) {
    case K_INT:
    case K_U64:
      if (v->type != CT_TOML_INT)
        return ct_set_error(CT_ERR_CONFIG, "%s: %s: expected an integer, got %s", where, full,
                            ct_toml_type_name(v->type));
      if (k->kind == K_U64) {
        if (v->u.i < 0)
          return ct_set_error(CT_ERR_CONFIG, "%s: %s: expected a non-negative integer, got %" PRId64,
                              where, full, v->u.i);
        *(uint64_t *)field = (uint64_t)v->u.i;
      } else {
        if (v->u.i < INT32_MIN || v->u.i > INT32_MAX)
          return ct_set_error(CT_ERR_CONFIG, "%s: %s: %" PRId64 " is out of range", where, full,
                              v->u.i);
        *(int *)field = (int)v->u.i;
      }
      return CT_OK;
    case K_FLOAT:
      if (v->type == CT_TOML_INT) { *(double *)field = (double)v->u.i; return CT_OK; }
      if (v->type != CT_TOML_FLOAT)
        return ct_set_error(CT_ERR_CONFIG, "%s: %s: expected a number, got %s", where, full,
                            ct_toml_type_name(v->type));
      *(double *)field = v->u.f;
      return CT_OK;
    case K_BOOL:
      if (v->type != CT_TOML_BOOL)
        return ct_set_error(CT_ERR_CONFIG, "%s: %s: expected true or false, got %s", where, full,
                            ct_toml_type_name(v->type));
      *(bool *)field = v->u.b;
      return CT_OK;
    case K_STR:
    case K_ENUM:
      if (v->type != CT_TOML_STRING)
        return ct_set_error(CT_ERR_CONFIG, "%s: %s: expected a string, got %s", where, full,
                            ct_toml_type_name(v->type));
      if (strlen(v->u.s) >= k->size)
        return ct_set_error(CT_ERR_CONFIG, "%s: %s: value longer than %zu bytes", where, full,
                            k->size - 1);
      if (k->kind == K_ENUM && !enum_ok(k->choices, v->u.s))
        return ct_set_error(CT_ERR_CONFIG, "%s: %s: \"%s\" is not one of %s", where, full, v->u.s,
                            k->choices);
      snprintf(field, k->size, "%s", v->u.s);
      return CT_OK;
  }
  return CT_ERR_RUNTIME;
}

static void locate(char *out, size_t cap, const char *file, int line, int col) {
  if (line > 0) snprintf(out, cap, "%s:%d:%d", file, line, col);
  else snprintf(out, cap, "%s", file);
}

/* [kernels] DEVICE.MODE.OP = "VARIANT": the device's table holds mode tables of op strings.
 * A later entry for the same device/mode/op replaces the earlier one (overrides). */
static ct_status apply_kernel_entries(ct_config *c, const ct_toml_entry *dev, const char *where) {
  const ct_toml_value *modes = dev->value;
  for (int i = 0; i < modes->u.table.n; i++) {
    const ct_toml_entry *me = &modes->u.table.items[i];
    if (me->value->type != CT_TOML_TABLE)
      return ct_set_error(CT_ERR_CONFIG, "%s: kernels.%s.%s: expected a table of op = \"variant\""
                          " (e.g. kernels.cuda.train.attention = \"flash\")", where, dev->key, me->key);
    for (int j = 0; j < me->value->u.table.n; j++) {
      const ct_toml_entry *oe = &me->value->u.table.items[j];
      if (oe->value->type != CT_TOML_STRING)
        return ct_set_error(CT_ERR_CONFIG, "%s: kernels.%s.%s.%s: expected a variant name (string)",
                            where, dev->key, me->key, oe->key);
      ct_status st = ct_registry_check(dev->key, me->key, oe->key, oe->value->u.s);
      if (st != CT_OK) return ct_add_context(st, "%s: ", where);
      ct_kernels_cfg *k = &c->kernels;
      int slot = k->n;
      for (int x = 0; x < k->n; x++)
        if (!strcmp(k->entries[x].device, dev->key) && !strcmp(k->entries[x].mode, me->key) &&
            !strcmp(k->entries[x].op, oe->key))
          slot = x;
      if (slot == (int)(sizeof k->entries / sizeof k->entries[0]))
        return ct_set_error(CT_ERR_CONFIG, "%s: too many [kernels] entries", where);
      ct_kernel_entry *en = &k->entries[slot];
      snprintf(en->device, sizeof en->device, "%s", dev->key);
      snprintf(en->mode, sizeof en->mode, "%s", me->key);
      snprintf(en->op, sizeof en->op, "%s", oe->key);
      snprintf(en->variant, sizeof en->variant, "%s", oe->value->u.s);
      if (slot == k->n) k->n++;
    }
  }
  return CT_OK;
}

/* Applies every key of the document; `origin` names the file (or the override) in messages. */
static ct_status apply_doc(ct_config *c, const ct_toml_value *root, const char *origin) {
  char where[512], sug[128], full[256];
  for (int i = 0; i < root->u.table.n; i++) {
    const ct_toml_entry *sec = &root->u.table.items[i];
    locate(where, sizeof where, origin, sec->line, sec->col);
    if (sec->value->type != CT_TOML_TABLE) {
      suggest(sec->key, sug, sizeof sug);
      return ct_set_error(CT_ERR_CONFIG, "%s: %s: unknown key (keys live in [model], [data],"
                          " [train], [parallel])%s%s%s", where, sec->key, sug[0] ? "; did you mean " : "",
                          sug, sug[0] ? "?" : "");
    }
    if (strcmp(sec->key, "model") && strcmp(sec->key, "data") && strcmp(sec->key, "train") &&
        strcmp(sec->key, "parallel") && strcmp(sec->key, "attention") && strcmp(sec->key, "kernels"))
      return ct_set_error(CT_ERR_CONFIG, "%s: [%s]: unknown section (expected model, data, train,"
                          " parallel, attention or kernels)", where, sec->key);
    const ct_toml_value *t = sec->value;
    for (int j = 0; j < t->u.table.n; j++) {
      const ct_toml_entry *e = &t->u.table.items[j];
      snprintf(full, sizeof full, "%s.%s", sec->key, e->key);
      locate(where, sizeof where, origin, e->line, e->col);
      if (!strcmp(sec->key, "kernels") && e->value->type == CT_TOML_TABLE) {
        CT_TRY(apply_kernel_entries(c, e, where));
        continue;
      }
      const key_def *k = find_key(sec->key, e->key);
      if (!k) {
        suggest(full, sug, sizeof sug);
        return ct_set_error(CT_ERR_CONFIG, "%s: %s: unknown key%s%s%s", where, full,
                            sug[0] ? "; did you mean " : "", sug, sug[0] ? "?" : "");
      }
      locate(where, sizeof where, origin, e->value->line, e->value->col); /* type errors: the value */
      CT_TRY(set_value(c, k, e->value, where));
    }
  }
  return CT_OK;
}

static void set_name_from_path(ct_config *c, const char *path) {
  snprintf(c->path, CT_STR, "%s", path);
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  snprintf(c->name, CT_STR, "%s", base);
  char *dot = strrchr(c->name, '.');
  if (dot && !strcmp(dot, ".toml")) *dot = '\0';
}

ct_status ct_config_load(const char *path, int n_overrides, char **overrides, ct_config *c) {
  ct_config_defaults(c);
  ct_toml_value *root = NULL;
  ct_status st = CT_OK;
  if (path) {
    set_name_from_path(c, path);
    CT_TRY(ct_toml_parse_file(path, &root));
  } else {
    snprintf(c->name, CT_STR, "default");
    CT_TRY(ct_toml_parse("", 0, "<defaults>", &root));
  }
  /* Overrides are applied to the document (so they go through the same checks), then each is
   * re-applied alone to name it in any type/unknown-key message. */
  for (int i = 0; i < n_overrides; i++) {
    ct_toml_value *single = NULL;
    char origin[512];
    snprintf(origin, sizeof origin, "override %s", overrides[i]);
    CT_TRY_GOTO(ct_toml_parse("", 0, origin, &single), done);
    st = ct_toml_set_override(single, overrides[i]);
    if (st == CT_OK) st = ct_toml_set_override(root, overrides[i]);
    if (st == CT_OK) {
      ct_config probe = *c;
      st = apply_doc(&probe, single, origin);
    }
    ct_toml_free(single);
    if (st != CT_OK) goto done;
  }
  CT_TRY_GOTO(apply_doc(c, root, path ? path : "<defaults>"), done);
  st = ct_config_validate(c);
  if (st != CT_OK && path) ct_add_context(st, "%s: ", path);
done:
  ct_toml_free(root);
  return st;
}

#define REQUIRE(cond, ...) \
  do { if (!(cond)) return ct_set_error(CT_ERR_CONFIG, __VA_ARGS__); } while (0)

ct_status ct_config_validate(ct_config *c) {
  ct_model_cfg *m = &c->model;
  ct_train_cfg *t = &c->train;
  bool gpt2 = !strcmp(m->arch, "gpt2");
  REQUIRE(m->n_layer > 0, "model.n_layer = %d: must be positive", m->n_layer);
  REQUIRE(m->n_head > 0, "model.n_head = %d: must be positive", m->n_head);
  REQUIRE(m->d_model > 0, "model.d_model = %d: must be positive", m->d_model);
  REQUIRE(m->vocab_size > 1, "model.vocab_size = %d: must be at least 2", m->vocab_size);
  REQUIRE(m->vocab_pad > 0, "model.vocab_pad = %d: must be positive", m->vocab_pad);
  REQUIRE(m->max_seq_len > 0, "model.max_seq_len = %d: must be positive", m->max_seq_len);
  REQUIRE(m->n_kv_head >= 0, "model.n_kv_head = %d: must be positive (or 0 = n_head)", m->n_kv_head);
  if (m->n_kv_head == 0) m->n_kv_head = m->n_head;
  REQUIRE(m->n_head % m->n_kv_head == 0,
          "model.n_head = %d is not divisible by model.n_kv_head = %d", m->n_head, m->n_kv_head);
  REQUIRE(m->head_dim >= 0, "model.head_dim = %d: must be positive (or 0 = d_model/n_head)", m->head_dim);
  if (m->head_dim == 0) {
    REQUIRE(m->d_model % m->n_head == 0,
            "model.d_model = %d is not divisible by model.n_head = %d (set model.head_dim or change"
            " one of them)", m->d_model, m->n_head);
    m->head_dim = m->d_model / m->n_head;
  }
  REQUIRE(m->d_ff >= 0, "model.d_ff = %d: must be positive (or 0 = default)", m->d_ff);
  if (m->d_ff == 0) m->d_ff = gpt2 ? 4 * m->d_model : (8 * m->d_model / 3 + 63) / 64 * 64;
  if (m->norm_eps == 0) m->norm_eps = gpt2 ? 1e-5 : 1e-6;
  REQUIRE(m->norm_eps > 0, "model.norm_eps = %g: must be positive", m->norm_eps);
  REQUIRE(m->init_std > 0, "model.init_std = %g: must be positive", m->init_std);
  if (gpt2) {
    REQUIRE(m->n_kv_head == m->n_head, "model.n_kv_head = %d: gpt2 has no grouped-query attention"
            " (use n_kv_head = n_head = %d, or arch = \"llama\")", m->n_kv_head, m->n_head);
    REQUIRE(m->head_dim * m->n_head == m->d_model, "model.head_dim = %d: gpt2 needs head_dim *"
            " n_head == d_model = %d", m->head_dim, m->d_model);
    REQUIRE(!m->qk_norm, "model.qk_norm = true: only arch = \"llama\" supports qk_norm");
  } else {
    REQUIRE(m->head_dim % 2 == 0, "model.head_dim = %d: RoPE needs an even head dimension", m->head_dim);
    REQUIRE(m->rope_theta > 0, "model.rope_theta = %g: must be positive", m->rope_theta);
  }
  REQUIRE(t->seq_len > 0, "train.seq_len = %d: must be positive", t->seq_len);
  REQUIRE(t->seq_len <= m->max_seq_len, "train.seq_len = %d exceeds model.max_seq_len = %d",
          t->seq_len, m->max_seq_len);
  REQUIRE(t->micro_batch > 0, "train.micro_batch = %d: must be positive", t->micro_batch);
  REQUIRE(t->grad_accum > 0, "train.grad_accum = %d: must be positive", t->grad_accum);
  REQUIRE(t->max_steps >= 0, "train.max_steps = %d: must not be negative", t->max_steps);
  REQUIRE(t->lr >= 0 && isfinite(t->lr), "train.lr = %g: must be a non-negative number", t->lr);
  REQUIRE(t->min_lr_ratio >= 0 && t->min_lr_ratio <= 1, "train.min_lr_ratio = %g: must be in [0, 1]",
          t->min_lr_ratio);
  REQUIRE(t->warmup_steps >= 0, "train.warmup_steps = %d: must not be negative", t->warmup_steps);
  REQUIRE(t->decay_frac >= 0 && t->decay_frac <= 1, "train.decay_frac = %g: must be in [0, 1]",
          t->decay_frac);
  REQUIRE(t->weight_decay >= 0, "train.weight_decay = %g: must not be negative", t->weight_decay);
  REQUIRE(t->beta1 >= 0 && t->beta1 < 1, "train.beta1 = %g: must be in [0, 1)", t->beta1);
  REQUIRE(t->beta2 >= 0 && t->beta2 < 1, "train.beta2 = %g: must be in [0, 1)", t->beta2);
  REQUIRE(t->eps > 0, "train.eps = %g: must be positive", t->eps);
  REQUIRE(t->grad_clip >= 0, "train.grad_clip = %g: must not be negative (0 = off)", t->grad_clip);
  REQUIRE(t->eval_every >= 0, "train.eval_every = %d: must not be negative", t->eval_every);
  REQUIRE(t->eval_steps > 0, "train.eval_steps = %d: must be positive", t->eval_steps);
  REQUIRE(t->checkpoint_every >= 0, "train.checkpoint_every = %d: must not be negative",
          t->checkpoint_every);
  REQUIRE(t->keep_last >= 0, "train.keep_last = %d: must not be negative", t->keep_last);
  REQUIRE(t->stop_after >= 0, "train.stop_after = %d: must not be negative", t->stop_after);
  REQUIRE(t->threads >= 0, "train.threads = %d: must not be negative", t->threads);
  REQUIRE(t->log_every > 0, "train.log_every = %d: must be positive", t->log_every);
  REQUIRE(t->sample_tokens >= 0, "train.sample_tokens = %d: must not be negative", t->sample_tokens);
  REQUIRE(c->parallel.bucket_mb > 0, "parallel.bucket_mb = %g: must be positive", c->parallel.bucket_mb);
  REQUIRE(!strcmp(c->parallel.reduce_dtype, "fp32") || !strcmp(c->parallel.data, "ddp"),
          "parallel.reduce_dtype = \"%s\" works with parallel.data = \"ddp\" (ZeRO reduces in fp32),"
          " not \"%s\"", c->parallel.reduce_dtype, c->parallel.data);
  REQUIRE(c->parallel.overlap || (!c->parallel.ce_allreduce && !c->parallel.sparse_embedding_grad &&
                                   c->parallel.overlap_ctas == 0),
          "parallel.overlap = false all-reduces every bucket after backward: parallel.ce_allreduce,"
          " parallel.sparse_embedding_grad and parallel.overlap_ctas are ways of overlapping (turn"
          " them off)");
  REQUIRE(!c->parallel.ce_allreduce || !strcmp(c->parallel.data, "ddp"),
          "parallel.ce_allreduce = true works with parallel.data = \"ddp\", not \"%s\"",
          c->parallel.data);
  REQUIRE(c->parallel.overlap_ctas >= 0, "parallel.overlap_ctas = %d: must not be negative (0 = no "
          "limit)", c->parallel.overlap_ctas);
  REQUIRE(c->parallel.timeout_s > 0, "parallel.timeout_s = %g: must be positive", c->parallel.timeout_s);
  {
    const int T = c->parallel.tensor, kv = m->n_kv_head ? m->n_kv_head : m->n_head;
    REQUIRE(T >= 1, "parallel.tensor = %d: must be at least 1", T);
    REQUIRE(m->n_head % T == 0 && kv % T == 0, "parallel.tensor = %d must divide model.n_head (%d)"
            " and model.n_kv_head (%d): each rank takes whole attention heads", T, m->n_head, kv);
    REQUIRE(m->d_ff % T == 0, "parallel.tensor = %d must divide model.d_ff (%d)", T, m->d_ff);
    REQUIRE(ct_model_padded_vocab(m) % T == 0, "parallel.tensor = %d must divide the padded"
            " vocabulary (%d = model.vocab_size rounded up to model.vocab_pad)", T,
            ct_model_padded_vocab(m));
  }
  REQUIRE(c->data.train[0], "data.train: must name a token file (make one with `ctrain prepare`)");
  if (!t->out_dir[0]) snprintf(t->out_dir, CT_STR, "runs/%.240s", c->name[0] ? c->name : "default");
  REQUIRE(c->kernels.head_chunk >= 0, "kernels.head_chunk = %d: must be 0 (off) or a row count",
          c->kernels.head_chunk);
  REQUIRE(c->kernels.head_chunk == 0 || (c->parallel.tensor <= 1 && (!strcmp(c->parallel.data, "ddp") ||
          !strcmp(c->parallel.data, "zero1"))),
          "kernels.head_chunk = %d computes the head's gradient during the forward: it needs"
          " parallel.data = ddp or zero1 and parallel.tensor = 1 (got %s, %d)",
          c->kernels.head_chunk, c->parallel.data, c->parallel.tensor);
  return CT_OK;
}

static void format_value(const ct_config *c, const key_def *k, char *out, size_t cap) {
  const char *field = (const char *)c + k->off;
  switch (k->kind) {
    case K_INT: snprintf(out, cap, "%d", *(const int *)field); break;
    case K_U64: snprintf(out, cap, "%" PRIu64, *(const uint64_t *)field); break;
    case K_FLOAT: snprintf(out, cap, "%.17g", *(const double *)field); break;
    case K_BOOL: snprintf(out, cap, "%s", *(const bool *)field ? "true" : "false"); break;
    case K_STR:
    case K_ENUM: snprintf(out, cap, "\"%s\"", field); break;
  }
}

void ct_config_print(const ct_config *c, FILE *f) {
  char val[CT_STR + 8], full[64];
  fprintf(f, "config %s\n", c->path[0] ? c->path : "(defaults)");
  for (size_t i = 0; i < N_KEYS; i++) {
    format_value(c, &KEYS[i], val, sizeof val);
    if (KEYS[i].kind == K_FLOAT) snprintf(val, sizeof val, "%g", *(const double *)((const char *)c + KEYS[i].off));
    snprintf(full, sizeof full, "%s.%s", KEYS[i].section, KEYS[i].name);
    fprintf(f, "  %-24s %-28s %s\n", full, val, KEYS[i].help);
  }
  for (int i = 0; i < c->kernels.n; i++) {
    const ct_kernel_entry *e = &c->kernels.entries[i];
    snprintf(full, sizeof full, "kernels.%s.%s.%s", e->device, e->mode, e->op);
    fprintf(f, "  %-24s \"%s\"\n", full, e->variant);
  }
}

char *ct_config_to_toml(const ct_config *c) {
  size_t cap = 16384, n = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  const char *cur = "";
  char val[CT_STR * 2];
  for (size_t i = 0; i < N_KEYS; i++) {
    const key_def *k = &KEYS[i];
    if (strcmp(cur, k->section)) {
      n += snprintf(out + n, cap - n, "%s[%s]\n", n ? "\n" : "", k->section);
      cur = k->section;
    }
    if (k->kind == K_STR) { /* escape for a TOML basic string */
      const char *s = (const char *)c + k->off;
      size_t j = 0;
      val[j++] = '"';
      for (; *s && j < sizeof val - 8; s++) {
        if (*s == '"' || *s == '\\') val[j++] = '\\';
        if ((unsigned char)*s < 0x20) { j += snprintf(val + j, 8, "\\u%04x", *s); continue; }
        val[j++] = *s;
      }
      val[j++] = '"';
      val[j] = '\0';
    } else {
      format_value(c, k, val, sizeof val);
    }
    n += snprintf(out + n, cap - n, "%s = %s\n", k->name, val);
    if (n + 1024 > cap) {
      char *grown = realloc(out, cap *= 2);
      if (!grown) { free(out); return NULL; }
      out = grown;
    }
  }
  /* the last schema section is [kernels]: its entries follow as dotted keys */
  for (int i = 0; i < c->kernels.n && n + 256 < cap; i++) {
    const ct_kernel_entry *e = &c->kernels.entries[i];
    n += snprintf(out + n, cap - n, "%s.%s.%s = \"%s\"\n", e->device, e->mode, e->op, e->variant);
  }
  return out;
}

ct_status ct_config_from_toml_text(const char *text, const char *origin, ct_config *c) {
  ct_config_defaults(c);
  ct_toml_value *root = NULL;
  CT_TRY(ct_toml_parse(text, strlen(text), origin, &root));
  ct_status st = apply_doc(c, root, origin);
  ct_toml_free(root);
  if (st == CT_OK) st = ct_config_validate(c);
  return st;
}
