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

ct_status ct_generate_batch(ct_model *m, int n_seq, const int32_t *const *prompts,
                            const int *prompt_lens, const ct_sample_cfg *s, int32_t **outs,
                            int *n_outs, ct_token_cb on_token, void *user) {
  const ct_model_cfg *cfg = ct_model_config(m);
  const int Vp = ct_model_padded_vocab(cfg), V = cfg->vocab_size, ctx = cfg->max_seq_len;
  ct_kv_cache *cache = NULL;
  float *row = ct_malloc(sizeof(float) * (size_t)Vp, "logits row");
  int32_t *next = ct_calloc((size_t)n_seq, sizeof(int32_t), "next tokens");
  bool *done = ct_calloc((size_t)n_seq, sizeof(bool), "sequence flags");
  ct_status st = (row && next && done) ? CT_OK : CT_ERR_NOMEM;
  if (st == CT_OK) st = ct_kv_cache_create(m, n_seq, ctx, &cache);
  for (int i = 0; st == CT_OK && i < n_seq; i++) {
    n_outs[i] = 0;
    const int32_t *p = prompts[i];
    int len = prompt_lens[i];
    int32_t start = s->stop_id;
    if (len == 0) {
      if (s->stop_id < 0) {
        st = ct_set_error(CT_ERR_USAGE, "generate: prompt %d is empty and there is no"
                          " end-of-text id to start from", i);
        break;
      }
      p = &start;
      len = 1;
    }
    if (len >= ctx) {
      st = ct_set_error(CT_ERR_USAGE, "generate: prompt %d has %d tokens; the context"
                        " (model.max_seq_len) is %d", i, len, ctx);
      break;
    }
    /* prefill in chunks the activations hold */
    int chunk = ct_model_max_T(m);
    for (int at = 0; st == CT_OK && at < len; at += chunk)
      st = ct_model_forward_cached(m, cache, i, p + at, len - at < chunk ? len - at : chunk, row);
    if (st == CT_OK) next[i] = ct_sample_logits(row, V, s, s->seed + (uint64_t)i, 0);
  }
  for (int k = 0; st == CT_OK && k < s->max_new_tokens; k++) {
    bool any = false;
    for (int i = 0; i < n_seq && st == CT_OK; i++) {
      if (done[i]) continue;
      int32_t id = next[i];
      outs[i][n_outs[i]++] = id;
      if (on_token) on_token(i, id, user);
      if (id == s->stop_id || n_outs[i] == s->max_new_tokens ||
          ct_kv_cache_len(cache, i) + 1 >= ctx) {
        done[i] = true;
        continue;
      }
      st = ct_model_forward_cached(m, cache, i, &id, 1, row);
      if (st == CT_OK) next[i] = ct_sample_logits(row, V, s, s->seed + (uint64_t)i, (uint64_t)k + 1);
      any = true;
    }
    if (!any) break;
  }
  ct_kv_cache_destroy(cache);
  free(row);
  free(next);
  free(done);
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

static const char *USAGE =
    "usage: ctrain generate --model PATH [--prompt TEXT]... [--prompt-file FILE]...\n"
    "                       [--max_new_tokens N] [--temperature T] [--top_k K] [--top_p P]\n"
    "                       [--seed S] [--greedy] [--precision auto|fp32|bf16]\n"
    "  PATH: a checkpoint step directory, <out_dir>/ckpt/latest, <out_dir>, or a Hugging Face\n"
    "        model directory (config.json + safetensors). Several prompts run as one batch;\n"
    "        a single prompt streams its tokens as they are produced. Generation stops at\n"
    "        end-of-text, at --max_new_tokens, or when the context is full.\n";

ct_status ct_cmd_generate(int argc, char **argv) {
  const char *model_path = NULL, *precision = NULL;
  char **prompts = calloc((size_t)argc + 1, sizeof(char *));
  bool *owned = calloc((size_t)argc + 1, sizeof(bool));
  int n_prompts = 0;
  ct_sample_cfg s = CT_SAMPLE_INIT;
  s.max_new_tokens = 200;
  s.temperature = 0.8f;
  s.top_k = 40;
  ct_status st = prompts && owned ? CT_OK : ct_set_error(CT_ERR_NOMEM, "out of memory");
  for (int i = 0; st == CT_OK && i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes = !strcmp(a, "--model") || !strcmp(a, "--prompt") || !strcmp(a, "--prompt-file") ||
                 !strcmp(a, "--max_new_tokens") || !strcmp(a, "--temperature") ||
                 !strcmp(a, "--top_k") || !strcmp(a, "--top_p") || !strcmp(a, "--seed") ||
                 !strcmp(a, "--precision");
    if (takes && !v) { st = ct_set_error(CT_ERR_USAGE, "generate: %s needs a value\n%s", a, USAGE); break; }
    if (takes) i++;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(USAGE, stdout); goto done; }
    else if (!strcmp(a, "--greedy")) s.temperature = 0;
    else if (!strcmp(a, "--model")) model_path = v;
    else if (!strcmp(a, "--prompt")) prompts[n_prompts++] = (char *)v;
    else if (!strcmp(a, "--prompt-file")) {
      char *text = NULL;
      size_t len = 0;
      st = ct_read_file(v, &text, &len);
      if (st == CT_OK) { owned[n_prompts] = true; prompts[n_prompts++] = text; }
    }
    else if (!strcmp(a, "--max_new_tokens")) s.max_new_tokens = atoi(v);
    else if (!strcmp(a, "--temperature")) s.temperature = (float)atof(v);
    else if (!strcmp(a, "--top_k")) s.top_k = atoi(v);
    else if (!strcmp(a, "--top_p")) s.top_p = (float)atof(v);
    else if (!strcmp(a, "--seed")) s.seed = strtoull(v, NULL, 10);
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
  if (st != CT_OK) goto done;
  if (n_prompts == 0) prompts[n_prompts++] = "";

  ct_config cfg;
  ct_backend be = {0};
  ct_model *m = NULL;
  ct_tokenizer *tok = NULL;
  int32_t **ids = calloc((size_t)n_prompts, sizeof *ids), **outs = calloc((size_t)n_prompts, sizeof *outs);
  int *lens = calloc((size_t)n_prompts, sizeof(int)), *n_out = calloc((size_t)n_prompts, sizeof(int));
  char hf_config[4200], file[4096];
  snprintf(hf_config, sizeof hf_config, "%s/config.json", model_path);
  bool hf = ct_file_exists(hf_config);
  if (!ids || !outs || !lens || !n_out) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
  if (hf) CT_TRY_GOTO(ct_hf_read_config(model_path, &cfg), cleanup);
  else CT_TRY_GOTO(ct_checkpoint_read_config(model_path, &cfg, file, sizeof file), cleanup);
  if (precision) snprintf(cfg.train.precision, sizeof cfg.train.precision, "%s", precision);
  st = ct_tokenizer_load(cfg.data.tokenizer, &tok);
  if (st != CT_OK) { ct_add_context(st, "%s: data.tokenizer: ", model_path); goto cleanup; }
  CT_TRY_GOTO(ct_backend_select(&cfg.train, 0, &be), cleanup);
  /* activations for prefill chunks of up to 512 tokens (ct_generate_batch prefills in chunks);
   * the KV cache still spans the whole context */
  const int chunk = cfg.model.max_seq_len < 512 ? cfg.model.max_seq_len : 512;
  if (hf) CT_TRY_GOTO(ct_hf_load(model_path, be.ops, 1, chunk, &cfg, &m), cleanup);
  else {
    CT_TRY_GOTO(ct_model_create(&cfg.model, be.ops, 1, chunk, &m), cleanup);
    CT_TRY_GOTO(ct_checkpoint_load_params(file, m), cleanup);
  }
  s.stop_id = ct_tokenizer_eot_id(tok);
  size_t total = 0;
  for (int i = 0; i < n_prompts; i++) {
    size_t n = 0;
    CT_TRY_GOTO(ct_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), &ids[i], &n), cleanup);
    lens[i] = (int)n;
    outs[i] = malloc(sizeof(int32_t) * (size_t)(s.max_new_tokens + 1));
    if (!outs[i]) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
  }
  stream_ctx sc = {.tok = tok, .state = CT_DECODE_STATE_INIT, .cap = ct_tokenizer_stream_cap(tok)};
  sc.buf = malloc(sc.cap);
  if (!sc.buf) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); goto cleanup; }
  double t0 = ct_now();
  if (n_prompts == 1) fputs(prompts[0], stdout);
  st = ct_generate_batch(m, n_prompts, (const int32_t *const *)ids, lens, &s, outs, n_out,
                         n_prompts == 1 ? stream_token : NULL, &sc);
  double dt = ct_now() - t0;
  if (st == CT_OK && n_prompts == 1) {
    size_t n = ct_tokenizer_decode_flush(tok, &sc.state, sc.buf, sc.cap);
    fwrite(sc.buf, 1, n, stdout);
    fputc('\n', stdout);
  }
  for (int i = 0; st == CT_OK && n_prompts > 1 && i < n_prompts; i++) {
    char *text = NULL;
    size_t tl = 0;
    CT_TRY_GOTO(ct_tokenizer_decode(tok, outs[i], (size_t)n_out[i], &text, &tl), cleanup);
    printf("=== prompt %d ===\n%s%s\n", i, prompts[i], text);
    free(text);
  }
  for (int i = 0; i < n_prompts; i++) total += (size_t)n_out[i];
  free(sc.buf);
  if (st == CT_OK)
    ct_log_info("generated %zu tokens for %d prompt(s) in %.2f s (%.1f tokens/s)", total, n_prompts,
                dt, total / (dt > 0 ? dt : 1));
cleanup:
  for (int i = 0; i < n_prompts; i++) {
    if (ids) free(ids[i]);
    if (outs) free(outs[i]);
  }
  free(ids);
  free(outs);
  free(lens);
  free(n_out);
  ct_tokenizer_destroy(tok);
  ct_model_destroy(m);
  ct_backend_shutdown(&be);
done:
  for (int i = 0; i < n_prompts; i++)
    if (owned && owned[i]) free(prompts[i]);
  free(prompts);
  free(owned);
  return st;
}
