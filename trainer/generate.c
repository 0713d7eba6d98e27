#include "trainer/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "trainer/checkpoint.h"
#include "trainer/data.h"
#include "trainer/device.h"
#include "trainer/hf.h"
#include "trainer/tokenizer.h"

typedef struct { float p; int32_t id; } cand;

/* A command-line number, all of v and >= lo (and for a float at most hi, > lo where lo_open);
 * else CT_ERR_USAGE naming the command, the flag, the value and what was expected (atoi read
 * "abc" as 0 and "8k" as 8). */
static ct_status arg_int(const char *cmd, const char *flag, const char *v, int lo, int *out) {
  char *end = NULL;
  const long x = strtol(v, &end, 10);
  if (!v[0] || *end || x < lo || x > 1L << 30)
    return ct_set_error(CT_ERR_USAGE, "%s: %s %s: expected an integer >= %d", cmd, flag, v, lo);
  *out = (int)x;
  return CT_OK;
}
static ct_status arg_float(const char *cmd, const char *flag, const char *v, double lo, double hi,
                           bool lo_open, float *out) {
  char *end = NULL;
  const double x = strtod(v, &end);
  if (!v[0] || *end || !(x >= lo && x <= hi) || (lo_open && x == lo))
    return hi >= 1e4 && !lo_open /* a sanity cap, not a range to state */
               ? ct_set_error(CT_ERR_USAGE, "%s: %s %s: expected a number >= %g", cmd, flag, v, lo)
               : ct_set_error(CT_ERR_USAGE, "%s: %s %s: expected a number in %c%g, %g]", cmd, flag,
                              v, lo_open ? '(' : '[', lo, hi);
  *out = (float)x;
  return CT_OK;
}

static int by_prob_desc(const void *a, const void *b) {
  float pa = ((const cand *)a)->p, pb = ((const cand *)b)->p;
  return (pa < pb) - (pa > pb);
}

int32_t ct_sample_logits(const float *logits, int V, const ct_sample_cfg *s, uint64_t seed,
                         uint64_t counter) {
  int32_t best = 0;
  for (int i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  if (s->temperature <= 0) return best;
  cand *c = malloc(sizeof(cand) * (size_t)V);
  if (!c) return best;
  double sum = 0;
  for (int i = 0; i < V; i++) {
    c[i].id = i;
    c[i].p = expf((logits[i] - logits[best]) / s->temperature);
  }
  qsort(c, (size_t)V, sizeof *c, by_prob_desc);
  int n = (s->top_k > 0 && s->top_k < V) ? s->top_k : V;
  for (int i = 0; i < n; i++) sum += c[i].p;
  if (s->top_p < 1.0f) { /* smallest prefix whose mass reaches top_p */
    double acc = 0;
    for (int i = 0; i < n; i++) {
      acc += c[i].p / sum;
      if (acc >= s->top_p) { n = i + 1; break; }
    }
    sum = 0;
    for (int i = 0; i < n; i++) sum += c[i].p;
  }
  ct_rng rng = {seed, counter};
  double r = ct_rng_uniform(&rng) * sum, acc = 0;
  int32_t id = c[n - 1].id;
  for (int i = 0; i < n; i++) {
    acc += c[i].p;
    if (r < acc) { id = c[i].id; break; }
  }
  free(c);
  return id;
}

/* Prefill of every prompt: prompts of equal length go together, as many per forward as the
 * engine's rows hold; a prompt longer than the rows is prefilled alone in chunks. next[i]
 * receives each prompt's first new token. */
static ct_status prefill_all(ct_infer *e, int n_seq, const int32_t *const *p, const int *len,
                             const ct_sample_cfg *s, int V, int Vp, int32_t *next) {
  const int R = ct_infer_max_rows(e);
  int *order = malloc(sizeof(int) * (size_t)n_seq), *slots = malloc(sizeof(int) * (size_t)n_seq);
  int32_t *toks = malloc(sizeof(int32_t) * (size_t)R), *ids = malloc(sizeof(int32_t) * (size_t)n_seq);
  float *logits = s->temperature > 0 ? malloc(sizeof(float) * (size_t)n_seq * Vp) : NULL;
  ct_status st = (order && slots && toks && ids && (logits || s->temperature <= 0))
                     ? CT_OK : ct_set_error(CT_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n_seq; i++) order[i] = i;
  for (int i = 1; i < n_seq; i++) /* stable insertion sort by length */
    for (int j = i; j > 0 && len[order[j - 1]] > len[order[j]]; j--) {
      int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
    }
  for (int g = 0; st == CT_OK && g < n_seq;) {
    const int n = len[order[g]];
    int k = 1; /* sequences in this forward */
    if (n <= R)
      while (g + k < n_seq && len[order[g + k]] == n && (long)(k + 1) * n <= R) k++;
    for (int at = 0; st == CT_OK && at < n; at += R) {
      const int c = n - at < R ? n - at : R;
      for (int b = 0; b < k; b++) {
        slots[b] = order[g + b];
        memcpy(toks + (size_t)b * c, p[order[g + b]] + at, sizeof(int32_t) * (size_t)c);
      }
      const bool end = at + c == n;
      st = ct_infer_prefill(e, k, slots, toks, c, end ? logits : NULL, end ? ids : NULL);
    }
    for (int b = 0; st == CT_OK && b < k; b++) {
      const int i = order[g + b];
      next[i] = logits ? ct_sample_logits(logits + (size_t)b * Vp, V, s, s->seed + (uint64_t)i, 0)
                       : ids[b];
    }
    g += k;
  }
  free(order);
  free(slots);
  free(toks);
  free(ids);
  free(logits);
  return st;
}

ct_status ct_generate_infer(ct_infer *e, int n_seq, const int32_t *const *prompts,
                            const int *prompt_lens, const ct_sample_cfg *s, int32_t **outs,
                            int *n_outs, ct_token_cb on_token, void *user, ct_gen_stats *stats) {
  const ct_model_cfg *cfg = ct_model_config(ct_infer_model(e));
  const int Vp = ct_model_padded_vocab(cfg), V = cfg->vocab_size, ctx = cfg->max_seq_len;
  const int cap = ct_infer_capacity(e);
  ct_gen_stats gs = {0};
  const double t0 = ct_now();
  const int32_t **p = calloc((size_t)n_seq, sizeof *p);
  int *len = calloc((size_t)n_seq, sizeof(int)), *slots = calloc((size_t)n_seq, sizeof(int));
  int32_t *next = calloc((size_t)n_seq, sizeof(int32_t)), *feed = calloc((size_t)n_seq, sizeof(int32_t));
  int32_t *ids = calloc((size_t)n_seq, sizeof(int32_t)), start = s->stop_id;
  bool *done = calloc((size_t)n_seq, sizeof(bool));
  float *logits = s->temperature > 0 ? malloc(sizeof(float) * (size_t)n_seq * Vp) : NULL;
  ct_status st = (p && len && slots && next && feed && ids && done &&
                  (logits || s->temperature <= 0)) ? CT_OK : ct_set_error(CT_ERR_NOMEM, "out of memory");
  for (int i = 0; st == CT_OK && i < n_seq; i++) {
    n_outs[i] = 0;
    ct_infer_reset(e, i);
    p[i] = prompts[i];
    len[i] = prompt_lens[i];
    if (len[i] == 0) {
      if (s->stop_id < 0) {
        st = ct_set_error(CT_ERR_USAGE, "generate: prompt %d is empty and there is no"
                          " end-of-text id to start from", i);
        break;
      }
      p[i] = &start;
      len[i] = 1;
    }
    if (len[i] >= ctx || len[i] >= cap)
      st = ct_set_error(CT_ERR_USAGE, "generate: prompt %d has %d tokens; the context"
                        " (model.max_seq_len) is %d and the cache holds %d", i, len[i], ctx, cap);
    gs.prompt_tokens += len[i];
  }
  if (st == CT_OK) st = prefill_all(e, n_seq, p, len, s, V, Vp, next);
  gs.ttft_s = ct_now() - t0;
  const double t1 = ct_now();
  for (int k = 0; st == CT_OK && k < s->max_new_tokens; k++) {
    int nb = 0;
    for (int i = 0; i < n_seq; i++) {
      if (done[i]) continue;
      const int32_t id = next[i];
      outs[i][n_outs[i]++] = id;
      if (on_token) on_token(i, id, user);
      if (id == s->stop_id || n_outs[i] == s->max_new_tokens || ct_infer_len(e, i) + 1 >= ctx ||
          ct_infer_len(e, i) + 1 > cap ||
          (s->should_stop && s->should_stop(i, outs[i], n_outs[i], s->stop_user))) {
        done[i] = true;
        continue;
      }
      slots[nb] = i;
      feed[nb++] = id;
    }
    if (!nb) break;
    st = ct_infer_decode(e, nb, slots, feed, logits, logits ? NULL : ids);
    for (int b = 0; st == CT_OK && b < nb; b++) {
      const int i = slots[b];
      next[i] = logits ? ct_sample_logits(logits + (size_t)b * Vp, V, s, s->seed + (uint64_t)i,
                                          (uint64_t)k + 1)
                       : ids[b];
    }
    gs.decode_steps++;
    gs.decode_tokens += nb;
  }
  ct_infer_settle(e); /* a step decoded ahead and not wanted counts in the decode time */
  gs.decode_s = ct_now() - t1;
  gs.graph_steps = ct_infer_graph_steps(e);
  gs.ahead_steps = ct_infer_ahead_steps(e);
  if (stats) *stats = gs;
  free(p);
  free(len);
  free(slots);
  free(next);
  free(feed);
  free(ids);
  free(done);
  free(logits);
  return st;
}

ct_status ct_generate_batch(ct_model *m, int n_seq, const int32_t *const *prompts,
                            const int *prompt_lens, const ct_sample_cfg *s, int32_t **outs,
                            int *n_outs, ct_token_cb on_token, void *user) {
  const ct_model_cfg *cfg = ct_model_config(m);
  int longest = 1;
  for (int i = 0; i < n_seq; i++)
    if (prompt_lens[i] > longest) longest = prompt_lens[i];
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = n_seq > 0 ? n_seq : 1;
  ic.max_len = longest + (s->max_new_tokens > 0 ? s->max_new_tokens : 1);
  if (ic.max_len > cfg->max_seq_len) ic.max_len = cfg->max_seq_len;
  ic.max_rows = ct_model_max_T(m);
  ct_infer *e = NULL;
  CT_TRY(ct_infer_create(m, ct_model_ops(m), &ic, &e));
  ct_status st = ct_generate_infer(e, n_seq, prompts, prompt_lens, s, outs, n_outs, on_token,
                                   user, NULL);
  ct_infer_destroy(e);
  return st;
}

ct_status ct_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_sample_cfg *s,
                      int32_t *out, int *n_out, ct_token_cb on_token, void *user) {
  return ct_generate_batch(m, 1, &prompt, &n_prompt, s, &out, n_out, on_token, user);
}

/* ---- the command ---- */

typedef struct stream_ctx {
  const ct_tokenizer *tok;
  ct_decode_state state;
  char *buf;
  size_t cap;
} stream_ctx;

static void stream_token(int seq, int32_t id, void *user) {
  (void)seq;
  stream_ctx *c = user;
  size_t n = ct_tokenizer_decode_stream(c->tok, &c->state, id, c->buf, c->cap);
  fwrite(c->buf, 1, n, stdout);
  fflush(stdout);
}

/* Stop strings: a sequence ends once its generated text contains one of them. The text is
 * decoded again after each token (O(n^2) in the generated length; fine for stop checks). */
typedef struct stop_ctx {
  const ct_tokenizer *tok;
  char **stops;
  int n_stops;
} stop_ctx;

static bool stop_string_hit(int seq, const int32_t *ids, int n, void *user) {
  (void)seq;
  stop_ctx *c = user;
  char *text = NULL;
  size_t len = 0;
  if (ct_tokenizer_decode(c->tok, ids, (size_t)n, &text, &len) != CT_OK) return false;
  bool hit = false;
  for (int i = 0; i < c->n_stops && !hit; i++) hit = strstr(text, c->stops[i]) != NULL;
  free(text);
  return hit;
}

/* whether --device_map / --max_memory ask for anything beyond the default placement */
static bool map_asked(const char *device_map) { return device_map && strcmp(device_map, "auto"); }
static bool budget_asked(const char *max_memory) { return max_memory && max_memory[0]; }

/* --device_map / --max_memory on a backend without CUDA: a misspelt one is named as such; else
 * the error names the options given and the backend in use. */
static ct_status gpu_only_opts(const char *cmd, const char *device_map, const char *max_memory,
                               const char *device) {
  CT_TRY(ct_device_map_check(device_map, max_memory));
  const bool dm = map_asked(device_map), mm = budget_asked(max_memory);
  return ct_set_error(CT_ERR_USAGE, "%s: %s%s%s%s%s: device maps need a CUDA device (running on %s)",
                      cmd, dm ? "--device_map " : "", dm ? device_map : "", dm && mm ? " and " : "",
                      mm ? "--max_memory " : "", mm ? max_memory : "", device);
}

static const char *USAGE =
    "usage: ctrain generate --model PATH [--prompt TEXT]... [--prompt-file FILE]...\n"
    "                       [--max_new_tokens N] [--temperature T] [--top_k K] [--top_p P]\n"
    "                       [--seed S] [--greedy] [--precision auto|fp32|bf16|fp16]\n"
    "                       [--stop TEXT]... [--ignore_eos] [--device_map auto|balanced|\n"
    "                       sequential|cuda:N] [--max_memory 0=20GiB,1=40GiB]\n"
    "                       [--cuda_graphs auto|on|off] [--prompt_ids N] [--batch B]\n"
    "                       [--print_ids] [--matmul lt-first|lt|gemmex]\n"
    "  PATH: a checkpoint step directory, <out_dir>/ckpt/latest, <out_dir>, a Hugging Face\n"
    "        model directory (config.json + safetensors), or a CONFIG.toml: random weights\n"
    "        (seeded by --seed; for benchmarks). Several prompts run as one batch (one forward\n"
    "        per step for all of them); a single prompt streams its tokens as they are produced.\n"
    "        Generation stops at end-of-text (unless --ignore_eos), at a --stop string, at\n"
    "        --max_new_tokens, or when the context is full.\n"
    "  --device_map: where the layers live on the GPUs (auto: GPU 0 if the model fits, else\n"
    "        balanced over all visible GPUs); --max_memory caps each GPU's share.\n"
    "  --cuda_graphs: capture each decode step once its batch size is steady and replay it.\n"
    "  --prompt_ids N: B random prompts of N token ids (no tokenizer needed), B = --batch\n"
    "        (default 1); --batch B also repeats text prompts B times. --print_ids prints ids.\n"
    "  --matmul (GPU): lt-first (default) takes cuBLASLt's first answer for each new product\n"
    "        shape; lt times its candidates on a shape's first use (training's default: 60-110 ms\n"
    "        of a new prompt shape's first prefill on GPT-2 124M); gemmex: plain cuBLAS.\n";

ct_status ct_cmd_generate(int argc, char **argv) {
  const char *model_path = NULL, *precision = NULL, *device_map = NULL, *max_memory = NULL;
  const char *matmul = "lt-first";
  char **prompts = calloc((size_t)argc + 1, sizeof(char *));
  char **stops = calloc((size_t)argc + 1, sizeof(char *));
  bool *owned = calloc((size_t)argc + 1, sizeof(bool));
  int n_prompts = 0, n_stops = 0, graphs = -1, prompt_ids = 0, batches[16] = {1}, nb = 1;
  bool ignore_eos = false, print_ids = false;
  ct_sample_cfg s = CT_SAMPLE_INIT;
  s.max_new_tokens = 200;
  s.temperature = 0.8f;
  s.top_k = 40;
  ct_status st = prompts && owned && stops ? CT_OK : ct_set_error(CT_ERR_NOMEM, "out of memory");
  for (int i = 0; st == CT_OK && i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes = !strcmp(a, "--model") || !strcmp(a, "--prompt") || !strcmp(a, "--prompt-file") ||
                 !strcmp(a, "--max_new_tokens") || !strcmp(a, "--temperature") ||
                 !strcmp(a, "--top_k") || !strcmp(a, "--top_p") || !strcmp(a, "--seed") ||
                 !strcmp(a, "--precision") || !strcmp(a, "--stop") ||
                 !strcmp(a, "--device_map") || !strcmp(a, "--max_memory") ||
                 !strcmp(a, "--cuda_graphs") || !strcmp(a, "--prompt_ids") || !strcmp(a, "--batch") ||
                 !strcmp(a, "--matmul");
    if (takes && !v) { st = ct_set_error(CT_ERR_USAGE, "generate: %s needs a value\n%s", a, USAGE); break; }
    if (takes) i++;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(USAGE, stdout); goto done; }
    else if (!strcmp(a, "--greedy")) s.temperature = 0;
    else if (!strcmp(a, "--ignore_eos")) ignore_eos = true;
    else if (!strcmp(a, "--print_ids")) print_ids = true;
    else if (!strcmp(a, "--model")) model_path = v;
    else if (!strcmp(a, "--prompt")) prompts[n_prompts++] = (char *)v;
    else if (!strcmp(a, "--stop")) {
      if (!v[0]) st = ct_set_error(CT_ERR_USAGE, "generate: --stop needs a non-empty string");
      stops[n_stops++] = (char *)v;
    }
    else if (!strcmp(a, "--prompt-file")) {
      char *text = NULL;
      size_t len = 0;
      st = ct_read_file(v, &text, &len);
      if (st == CT_OK) { owned[n_prompts] = true; prompts[n_prompts++] = text; }
    }
    else if (!strcmp(a, "--max_new_tokens")) st = arg_int("generate", a, v, 0, &s.max_new_tokens);
    else if (!strcmp(a, "--temperature")) st = arg_float("generate", a, v, 0, 1e4, false, &s.temperature);
    else if (!strcmp(a, "--top_k")) st = arg_int("generate", a, v, 0, &s.top_k);
    else if (!strcmp(a, "--top_p")) st = arg_float("generate", a, v, 0, 1, true, &s.top_p);
    else if (!strcmp(a, "--seed")) {
      char *end = NULL;
      s.seed = strtoull(v, &end, 10);
      if (!v[0] || *end || v[0] == '-')
        st = ct_set_error(CT_ERR_USAGE, "generate: --seed %s: expected an integer >= 0", v);
    }
    else if (!strcmp(a, "--device_map")) device_map = v;
    else if (!strcmp(a, "--max_memory")) max_memory = v;
    else if (!strcmp(a, "--prompt_ids")) st = arg_int("generate", a, v, 1, &prompt_ids);
    else if (!strcmp(a, "--matmul")) {
      if (strcmp(v, "lt-first") && strcmp(v, "lt") && strcmp(v, "gemmex"))
        st = ct_set_error(CT_ERR_USAGE, "generate: --matmul %s: expected lt-first, lt or gemmex", v);
      matmul = v;
    }
    else if (!strcmp(a, "--batch")) { /* B or a list B1,B2,... (one run each, one model load) */
      nb = 0;
      for (const char *q = v; st == CT_OK && nb < 16;) {
        char *end = NULL;
        const long b = strtol(q, &end, 10);
        if (end == q || b < 1 || b > 1 << 20 || (*end && *end != ','))
          st = ct_set_error(CT_ERR_USAGE, "generate: --batch %s: expected B or B1,B2,... (each >= 1)", v);
        else batches[nb++] = (int)b;
        if (st != CT_OK || !*end) break;
        q = end + 1;
        if (nb == 16)
          st = ct_set_error(CT_ERR_USAGE, "generate: --batch %s: at most 16 batch sizes", v);
      }
    }
    else if (!strcmp(a, "--cuda_graphs")) {
      if (!strcmp(v, "auto")) graphs = -1;
      else if (!strcmp(v, "on")) graphs = 1;
      else if (!strcmp(v, "off")) graphs = 0;
      else st = ct_set_error(CT_ERR_USAGE, "generate: --cuda_graphs %s: expected auto, on or off", v);
    }
    else if (!strcmp(a, "--precision")) {
      if (strcmp(v, "auto") && strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16"))
        st = ct_set_error(CT_ERR_USAGE, "generate: --precision %s: expected auto, fp32, bf16 or fp16", v);
      precision = v;
    }
    else st = ct_set_error(CT_ERR_USAGE, "generate: unknown argument %s\n%s", a, USAGE);
  }
  if (st == CT_OK && !model_path) st = ct_set_error(CT_ERR_USAGE, "generate: --model is required\n%s", USAGE);
  if (st == CT_OK && (s.max_new_tokens < 0 || s.top_k < 0 || s.top_p <= 0 || s.top_p > 1))
    st = ct_set_error(CT_ERR_USAGE, "generate: --max_new_tokens and --top_k must be >= 0 and"
                      " --top_p in (0, 1]");
  if (st == CT_OK && (nb < 1 || prompt_ids < 0 || (prompt_ids && n_prompts)))
    st = ct_set_error(CT_ERR_USAGE, "generate: --batch needs a value, --prompt_ids >= 0, and"
                      " --prompt_ids replaces --prompt");
  if (st != CT_OK) goto done;
  if (n_prompts == 0 && !prompt_ids) prompts[n_prompts++] = "";
  const int n_text = n_prompts;
  int max_batch = 1;
  for (int b = 0; b < nb; b++)
    if (batches[b] > max_batch) max_batch = batches[b];
  const int n_max = (prompt_ids ? 1 : n_text) * max_batch;

  ct_config cfg;
  ct_backend be = {0};
  ct_model *m = NULL;
  ct_infer *e = NULL;
  ct_tokenizer *tok = NULL;
  int *layer_dev = NULL;
  int32_t **ids = calloc((size_t)n_max, sizeof *ids), **outs = calloc((size_t)n_max, sizeof *outs);
  int *lens = calloc((size_t)n_max, sizeof(int)), *n_out = calloc((size_t)n_max, sizeof(int));
  char hf_config[4200], file[4096];
  snprintf(hf_config, sizeof hf_config, "%s/config.json", model_path);
  const bool hf = ct_file_exists(hf_config);
  const size_t pl = strlen(model_path);
  const bool toml = pl > 5 && !strcmp(model_path + pl - 5, ".toml");
  if (!ids || !outs || !lens || !n_out) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
  if (hf) CT_TRY_GOTO(ct_hf_read_config(model_path, &cfg), cleanup);
  else if (toml) CT_TRY_GOTO(ct_config_load(model_path, 0, NULL, &cfg), cleanup);
  else CT_TRY_GOTO(ct_checkpoint_read_config(model_path, &cfg, file, sizeof file), cleanup);
  if (precision) snprintf(cfg.train.precision, sizeof cfg.train.precision, "%s", precision);
  if (!prompt_ids || n_stops) {
    st = ct_tokenizer_load(cfg.data.tokenizer, &tok);
    if (st != CT_OK) { ct_add_context(st, "%s: data.tokenizer: ", model_path); goto cleanup; }
  }
  CT_TRY_GOTO(ct_backend_select(&cfg.train, 0, &be), cleanup);
  /* A prompt's (batch, length) is usually new, so timing cuBLASLt's candidates at its first use
   * (training's default, worth it over thousands of steps) would cost each new prompt shape more
   * than its prefill: GPT-2 124M on an H200, the first prefill of 8 x 128 tokens took 125 ms
   * timed and 16 ms untimed, and the same shape again 1.4 ms both ways
   * (bench/results/call79_2026-12-02_H200/). */
  CT_TRY_GOTO(ct_backend_set_variant(&be, "matmul", matmul), cleanup);
  /* GPU: the model is read into host memory and the engine copies each layer to its device;
   * CPU: the engine computes on the model's own weights */
  const ct_ops *mops = be.cuda ? ct_ops_cpu() : be.ops;
  const double tl = ct_now();
  if (hf) CT_TRY_GOTO(ct_hf_load(model_path, mops, 1, 1, &cfg, &m), cleanup);
  else {
    CT_TRY_GOTO(ct_model_create(&cfg.model, mops, 1, 1, &m), cleanup);
    if (toml) ct_model_init_weights(m, s.seed);
    else CT_TRY_GOTO(ct_checkpoint_load_params(file, m), cleanup);
  }
  ct_log_info("model loaded in %.2f s", ct_now() - tl);
  s.stop_id = ignore_eos || !tok ? -1 : ct_tokenizer_eot_id(tok);
  layer_dev = calloc((size_t)cfg.model.n_layer, sizeof(int));
  if (!layer_dev) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
  for (int bi = 0; bi < nb; bi++) {
  const int n_seq = (prompt_ids ? 1 : n_text) * batches[bi];
  for (int i = 0; i < n_max; i++) {
    free(ids[i]);
    free(outs[i]);
    ids[i] = outs[i] = NULL;
  }
  ct_infer_destroy(e);
  e = NULL;
  ct_rng rng = {s.seed ^ 0x9e3779b97f4a7c15ull, 0};
  int longest = 1;
  for (int i = 0; i < n_seq; i++) {
    size_t n = 0;
    if (prompt_ids) {
      ids[i] = malloc(sizeof(int32_t) * (size_t)prompt_ids);
      if (!ids[i]) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
      for (int t = 0; t < prompt_ids; t++)
        ids[i][t] = (int32_t)(ct_rng_u64(&rng) % (uint64_t)cfg.model.vocab_size);
      n = (size_t)prompt_ids;
    } else {
      const char *text = prompts[i % n_text];
      CT_TRY_GOTO(ct_tokenizer_encode(tok, text, strlen(text), &ids[i], &n), cleanup);
    }
    lens[i] = (int)n;
    if (lens[i] > longest) longest = lens[i];
    outs[i] = malloc(sizeof(int32_t) * (size_t)(s.max_new_tokens + 1));
    if (!outs[i]) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
  }
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = n_seq;
  ic.max_len = longest + (s.max_new_tokens > 0 ? s.max_new_tokens : 1);
  if (ic.max_len > cfg.model.max_seq_len) ic.max_len = cfg.model.max_seq_len;
  /* prefill rows: every prompt in one forward when they fit 8192 rows, else chunks of 512 */
  ic.max_rows = (long)longest * n_seq <= 8192 ? longest * n_seq : 512;
  if (ic.max_rows < 512) ic.max_rows = 512;
  if (ic.max_rows > cfg.model.max_seq_len * n_seq) ic.max_rows = cfg.model.max_seq_len * n_seq;
  ic.graphs = graphs;
  if (be.cuda) {
    char report[1024];
    CT_TRY_GOTO(ct_infer_plan(m, be.ops, device_map, max_memory, ic.max_seqs, ic.max_len,
                              ic.max_rows, layer_dev, report, sizeof report), cleanup);
    ct_log_info("%s", report);
    ic.layer_dev = layer_dev;
  } else if (map_asked(device_map) || budget_asked(max_memory)) {
    st = gpu_only_opts("generate", device_map, max_memory, be.device);
    goto cleanup;
  }
  const double te = ct_now();
  CT_TRY_GOTO(ct_infer_create(m, be.ops, &ic, &e), cleanup);
  CT_TRY_GOTO(ct_backend_check(&be), cleanup);
  {
    char desc[2048];
    ct_infer_describe(e, desc, sizeof desc);
    ct_log_info("engine for %d sequence(s) of up to %d tokens ready in %.2f s; placement:\n%s",
                n_seq, ic.max_len, ct_now() - te, desc);
  }
  stop_ctx stc = {.tok = tok, .stops = stops, .n_stops = n_stops};
  if (n_stops) {
    s.should_stop = stop_string_hit;
    s.stop_user = &stc;
  }
  stream_ctx sc = {.tok = tok, .state = CT_DECODE_STATE_INIT, .cap = tok ? ct_tokenizer_stream_cap(tok) : 0};
  sc.buf = tok ? malloc(sc.cap) : NULL;
  if (tok && !sc.buf) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
  const bool stream = n_seq == 1 && tok && !print_ids;
  if (stream) fputs(prompts[0], stdout);
  ct_gen_stats gs;
  st = ct_generate_infer(e, n_seq, (const int32_t *const *)ids, lens, &s, outs, n_out,
                         stream ? stream_token : NULL, &sc, &gs);
  if (st == CT_OK) st = ct_backend_check(&be);
  if (st == CT_OK && stream) {
    size_t n = ct_tokenizer_decode_flush(tok, &sc.state, sc.buf, sc.cap);
    fwrite(sc.buf, 1, n, stdout);
    fputc('\n', stdout);
  }
  for (int i = 0; st == CT_OK && !stream && i < n_seq; i++) {
    if (print_ids || !tok) {
      printf("=== sequence %d: %d new tokens\n", i, n_out[i]);
      if (print_ids) {
        for (int k = 0; k < n_out[i]; k++) printf("%s%d", k ? " " : "", outs[i][k]);
        putchar('\n');
      }
      continue;
    }
    char *text = NULL;
    size_t tl2 = 0;
    CT_TRY_GOTO(ct_tokenizer_decode(tok, outs[i], (size_t)n_out[i], &text, &tl2), cleanup);
    printf("=== prompt %d ===\n%s%s\n", i, prompts[i % n_text], text);
    free(text);
  }
  free(sc.buf);
  if (st == CT_OK) {
    size_t total = 0;
    for (int i = 0; i < n_seq; i++) total += (size_t)n_out[i];
    ct_log_info("generated %zu tokens for %d sequence(s): time to first token %.2f ms (prefill"
                " %ld tokens, %.0f tokens/s), decode %ld steps %.0f tokens/s%s", total, n_seq,
                gs.ttft_s * 1e3, gs.prompt_tokens, gs.prompt_tokens / (gs.ttft_s > 0 ? gs.ttft_s : 1),
                gs.decode_steps, gs.decode_tokens / (gs.decode_s > 0 ? gs.decode_s : 1),
                gs.graph_steps ? " (CUDA graphs)" : "");
    fprintf(stderr, "stats: batch=%d prompt_tokens=%ld ttft_ms=%.3f prefill_tok_s=%.1f decode_steps=%ld"
           " decode_tokens=%ld decode_s=%.6f decode_tok_s=%.1f graph_steps=%ld"
           " ahead_steps=%ld\n", n_seq,
           gs.prompt_tokens, gs.ttft_s * 1e3, gs.prompt_tokens / (gs.ttft_s > 0 ? gs.ttft_s : 1),
           gs.decode_steps, gs.decode_tokens, gs.decode_s,
           gs.decode_tokens / (gs.decode_s > 0 ? gs.decode_s : 1), gs.graph_steps, gs.ahead_steps);
  }
  if (st != CT_OK) break;
  } /* batches */
cleanup:
  for (int i = 0; ids && outs && i < n_max; i++) {
    if (ids) free(ids[i]);
    if (outs) free(outs[i]);
  }
  free(ids);
  free(outs);
  free(lens);
  free(n_out);
  free(layer_dev);
  ct_infer_destroy(e);
  ct_tokenizer_destroy(tok);
  ct_model_destroy(m);
  ct_backend_shutdown(&be);
done:
  for (int i = 0; i < n_prompts; i++)
    if (owned && owned[i]) free(prompts[i]);
  free(prompts);
  free(owned);
  free(stops);
  return st;
}

/* Reads the config of PATH (checkpoint, HF dir or CONFIG.toml), picks the backend and builds the
 * model in host memory: weights loaded (or seeded random for a .toml) when `load`, else left
 * zero (placement only). */
static ct_status open_model(const char *path, const char *precision, bool load, uint64_t seed,
                            ct_config *cfg, ct_backend *be, ct_model **m) {
  char hf_config[4200], file[4096];
  snprintf(hf_config, sizeof hf_config, "%s/config.json", path);
  const size_t pl = strlen(path);
  const bool hf = ct_file_exists(hf_config), toml = pl > 5 && !strcmp(path + pl - 5, ".toml");
  if (hf) CT_TRY(ct_hf_read_config(path, cfg));
  else if (toml) CT_TRY(ct_config_load(path, 0, NULL, cfg));
  else CT_TRY(ct_checkpoint_read_config(path, cfg, file, sizeof file));
  if (precision) snprintf(cfg->train.precision, sizeof cfg->train.precision, "%s", precision);
  CT_TRY(ct_backend_select(&cfg->train, 0, be));
  const ct_ops *mops = be->cuda ? ct_ops_cpu() : be->ops;
  if (hf && load) return ct_hf_load(path, mops, 1, 1, cfg, m);
  CT_TRY(ct_model_create(&cfg->model, mops, 1, 1, m));
  if (!load) return CT_OK;
  if (toml) {
    ct_model_init_weights(*m, seed);
    return CT_OK;
  }
  return ct_checkpoint_load_params(file, *m);
}

/* `ctrain eval --model PATH --data FILE.h5 [--seq_len T] [--batch B] [--max_batches N]
 *  [--device_map SPEC] [--max_memory SPEC] [--precision P]`: mean token loss and perplexity of
 * consecutive windows of the token file, through the inference engine (so across GPUs with a
 * device map). */
ct_status ct_cmd_eval(int argc, char **argv) {
  const char *model_path = NULL, *data = NULL, *device_map = NULL, *max_memory = NULL;
  const char *precision = NULL;
  int T = 0, B = 4, max_batches = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      puts("usage: ctrain eval --model PATH --data FILE.h5 [--seq_len T] [--batch B]"
           " [--max_batches N] [--device_map auto|balanced|sequential|cuda:N]"
           " [--max_memory 0=20GiB,...] [--precision auto|fp32|bf16|fp16]");
      return CT_OK;
    }
    if (!v) return ct_set_error(CT_ERR_USAGE, "eval: %s needs a value", a);
    i++;
    if (!strcmp(a, "--model")) model_path = v;
    else if (!strcmp(a, "--data")) data = v;
    else if (!strcmp(a, "--seq_len")) CT_TRY(arg_int("eval", a, v, 0, &T));
    else if (!strcmp(a, "--batch")) CT_TRY(arg_int("eval", a, v, 1, &B));
    else if (!strcmp(a, "--max_batches")) CT_TRY(arg_int("eval", a, v, 0, &max_batches));
    else if (!strcmp(a, "--device_map")) device_map = v;
    else if (!strcmp(a, "--max_memory")) max_memory = v;
    else if (!strcmp(a, "--precision")) precision = v;
    else return ct_set_error(CT_ERR_USAGE, "eval: unknown argument %s", a);
  }
  if (!model_path || !data) return ct_set_error(CT_ERR_USAGE, "eval: --model and --data are required");
  if (T < 0 || B < 1 || max_batches < 0)
    return ct_set_error(CT_ERR_USAGE, "eval: --seq_len >= 1, --batch >= 1, --max_batches >= 0");
  ct_config cfg;
  ct_backend be = {0};
  ct_model *m = NULL;
  ct_infer *e = NULL;
  ct_loader *ld = NULL;
  int *layer_dev = NULL;
  int32_t *in = NULL, *tg = NULL;
  ct_status st = open_model(model_path, precision, true, 1337, &cfg, &be, &m);
  if (st != CT_OK) goto done;
  if (!T) T = cfg.model.max_seq_len < 1024 ? cfg.model.max_seq_len : 1024;
  if (T > cfg.model.max_seq_len) {
    st = ct_set_error(CT_ERR_USAGE, "eval: --seq_len %d exceeds model.max_seq_len %d", T,
                      cfg.model.max_seq_len);
    goto done;
  }
  st = ct_loader_open(data, NULL, cfg.model.vocab_size, T, 0, 1, 0, CT_LOADER_SEQUENTIAL, &ld);
  if (st != CT_OK) goto done;
  const int64_t windows = (ct_loader_info(ld)->n_tokens - 1) / T;
  int64_t batches = (windows + B - 1) / B;
  if (max_batches && batches > max_batches) batches = max_batches;
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = B;
  ic.max_len = T;
  ic.max_rows = B * T;
  ic.logit_rows = B * T < 256 ? B * T : 256;
  ic.graphs = 0;
  if (be.cuda) {
    char report[1024];
    layer_dev = calloc((size_t)cfg.model.n_layer, sizeof(int));
    if (!layer_dev) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto done; }
    st = ct_infer_plan(m, be.ops, device_map, max_memory, B, T, B * T, layer_dev, report,
                       sizeof report);
    if (st != CT_OK) goto done;
    ct_log_info("%s", report);
    ic.layer_dev = layer_dev;
  } else if (map_asked(device_map) || budget_asked(max_memory)) {
    st = gpu_only_opts("eval", device_map, max_memory, be.device);
    goto done;
  }
  st = ct_infer_create(m, be.ops, &ic, &e);
  in = malloc(sizeof(int32_t) * (size_t)B * T);
  tg = malloc(sizeof(int32_t) * (size_t)B * T);
  if (st == CT_OK && (!in || !tg)) st = ct_set_error(CT_ERR_NOMEM, "out of memory");
  double sum = 0;
  long count = 0;
  const double t0 = ct_now();
  for (int64_t k = 0; st == CT_OK && k < batches; k++) {
    const int n = (int)(windows - k * B < B ? windows - k * B : B);
    st = ct_loader_next(ld, n, in, tg);
    if (st == CT_OK) st = ct_infer_loss(e, n, in, tg, T, &sum, &count);
  }
  if (st == CT_OK) st = ct_backend_check(&be);
  if (st == CT_OK) {
    const double dt = ct_now() - t0, mean = count ? sum / count : 0;
    printf("eval: %ld tokens in %lld windows of %d: loss %.6f, perplexity %.4f (%.0f tokens/s)\n",
           count, (long long)(batches * B < windows ? batches * B : windows), T, mean, exp(mean),
           count / (dt > 0 ? dt : 1));
  }
done:
  free(in);
  free(tg);
  free(layer_dev);
  ct_loader_destroy(ld);
  ct_infer_destroy(e);
  ct_model_destroy(m);
  ct_backend_shutdown(&be);
  return st;
}

/* `ctrain env [--model PATH [--device_map SPEC] [--max_memory SPEC] [--batch B] [--max_len N]
 *  [--precision P]]`: the environment report, then where the model's layers would go. The model
 * is built on the host without reading its weights (untouched pages cost no memory). */
ct_status ct_cmd_env(int argc, char **argv) {
  ct_env_print(stdout);
  if (argc == 0) return CT_OK;
  const char *model_path = NULL, *device_map = NULL, *max_memory = NULL, *precision = NULL;
  int batch = 1, max_len = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return ct_set_error(CT_ERR_USAGE, "env: %s needs a value", a);
    i++;
    if (!strcmp(a, "--model")) model_path = v;
    else if (!strcmp(a, "--device_map")) device_map = v;
    else if (!strcmp(a, "--max_memory")) max_memory = v;
    else if (!strcmp(a, "--precision")) precision = v;
    else if (!strcmp(a, "--batch")) CT_TRY(arg_int("env", a, v, 1, &batch));
    else if (!strcmp(a, "--max_len")) CT_TRY(arg_int("env", a, v, 0, &max_len));
    else return ct_set_error(CT_ERR_USAGE, "env: unknown argument %s (env [--model PATH"
                             " [--device_map SPEC] [--max_memory SPEC] [--batch B] [--max_len N]"
                             " [--precision P]])", a);
  }
  if (!model_path) return ct_set_error(CT_ERR_USAGE, "env: placement needs --model PATH");
  if (batch < 1 || max_len < 0) return ct_set_error(CT_ERR_USAGE, "env: --batch >= 1, --max_len >= 0");
  ct_config cfg;
  ct_backend be = {0};
  ct_model *m = NULL;
  int *layer_dev = NULL;
  ct_status st = open_model(model_path, precision, false, 0, &cfg, &be, &m);
  if (!max_len || max_len > cfg.model.max_seq_len) max_len = cfg.model.max_seq_len;
  if (st == CT_OK && !be.cuda && (map_asked(device_map) || budget_asked(max_memory))) {
    st = gpu_only_opts("env", device_map, max_memory, be.device);
  } else if (st == CT_OK && !be.cuda) {
    printf("placement of %s: %s, all %d layers (no CUDA device)\n", model_path, be.device,
           cfg.model.n_layer);
  } else if (st == CT_OK) {
    char report[2048];
    layer_dev = calloc((size_t)cfg.model.n_layer, sizeof(int));
    if (!layer_dev) st = ct_set_error(CT_ERR_NOMEM, "out of memory");
    else st = ct_infer_plan(m, be.ops, device_map, max_memory, batch, max_len, 512, layer_dev,
                            report, sizeof report);
    if (st == CT_OK)
      printf("placement of %s (%s, %d sequence(s) x %d tokens): %s\n", model_path, be.precision,
             batch, max_len, report);
  }
  free(layer_dev);
  ct_model_destroy(m);
  ct_backend_shutdown(&be);
  return st;
}

