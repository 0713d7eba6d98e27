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

static void print_byte_token(int seq, int32_t id, void *user) {
  (void)user;
  (void)seq;
  if (id >= 0 && id < 256) { fputc(id, stdout); fflush(stdout); }
}

static const char *USAGE =
    "usage: ctrain generate --model PATH [--prompt TEXT] [--max_new_tokens N] [--temperature T]\n"
    "                       [--top_k K] [--top_p P] [--seed S] [--greedy]\n"
    "  PATH: a checkpoint step directory, <out_dir>/ckpt/latest, or <out_dir>\n";

ct_status ct_cmd_generate(int argc, char **argv) {
  const char *model_path = NULL, *prompt = "";
  ct_sample_cfg s = CT_SAMPLE_INIT;
  s.max_new_tokens = 200;
  s.temperature = 0.8f;
  s.top_k = 40;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (!strcmp(a, name) && (v || (ct_set_error(CT_ERR_USAGE, "%s needs a value\n%s", name, USAGE), 0)) && ++i)
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(USAGE, stdout); return CT_OK; }
    else if (!strcmp(a, "--greedy")) s.temperature = 0;
    else if (ARG("--model")) model_path = v;
    else if (ARG("--prompt")) prompt = v;
    else if (ARG("--max_new_tokens")) s.max_new_tokens = atoi(v);
    else if (ARG("--temperature")) s.temperature = (float)atof(v);
    else if (ARG("--top_k")) s.top_k = atoi(v);
    else if (ARG("--top_p")) s.top_p = (float)atof(v);
    else if (ARG("--seed")) s.seed = strtoull(v, NULL, 10);
    else if (ct_last_error()[0] && strstr(ct_last_error(), "needs a value")) return CT_ERR_USAGE;
    else return ct_set_error(CT_ERR_USAGE, "generate: unknown argument %s\n%s", a, USAGE);
#undef ARG
  }
  if (!model_path) return ct_set_error(CT_ERR_USAGE, "generate: --model is required\n%s", USAGE);
  if (s.max_new_tokens < 0 || s.top_k < 0 || s.top_p <= 0 || s.top_p > 1)
    return ct_set_error(CT_ERR_USAGE, "generate: --max_new_tokens and --top_k must be >= 0 and"
                        " --top_p in (0, 1]");
  ct_config cfg;
  char file[4096];
  CT_TRY(ct_checkpoint_read_config(model_path, &cfg, file, sizeof file));
  if (strcmp(cfg.data.tokenizer, "byte"))
    return ct_set_error(CT_ERR_INPUT, "%s: tokenizer \"%s\" is not supported by generate yet"
                        " (only the built-in byte tokenizer)", file, cfg.data.tokenizer);
  ct_backend be;
  CT_TRY(ct_backend_select(&cfg.train, 0, &be));
  ct_model *m = NULL;
  CT_TRY(ct_model_create(&cfg.model, be.ops, 1, cfg.model.max_seq_len, &m));
  ct_status st = ct_checkpoint_load_params(file, m);
  size_t plen = strlen(prompt);
  int32_t *ids = malloc(sizeof(int32_t) * (plen + 1));
  int32_t *out = malloc(sizeof(int32_t) * (size_t)(s.max_new_tokens + 1));
  if (st == CT_OK && (!ids || !out)) st = ct_set_error(CT_ERR_NOMEM, "out of memory");
  if (st == CT_OK) {
    size_t n = ct_byte_encode(prompt, plen, ids);
    s.stop_id = CT_BYTE_EOT;
    int produced = 0;
    fputs(prompt, stdout);
    double t0 = ct_now();
    st = ct_generate(m, ids, (int)n, &s, out, &produced, print_byte_token, NULL);
    double dt = ct_now() - t0;
    fputc('\n', stdout);
    ct_log_info("generated %d tokens in %.2f s (%.1f tokens/s)", produced, dt, produced / (dt > 0 ? dt : 1));
  }
  free(ids);
  free(out);
  ct_model_destroy(m);
  ct_backend_shutdown(&be);
  return st;
}
