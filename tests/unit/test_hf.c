/* tests/unit/test_hf.c — import-hf / export-hf against Hugging Face Transformers.
 *
 * tools/make_hf_tiny.py saved four tiny random models with save_pretrained under
 * tests/fixtures/hf/<name>/ (GPT-2 with a tokenizer.json; Llama with GQA saved in bf16;
 * Qwen3 with q/k norm, head_dim * heads != hidden and an untied head; Qwen2 with q/k/v bias,
 * sharded) and, in expected.json, a fixed input, HF's float32 logits for it and HF's greedy
 * continuation of 20 tokens. For every model this test
 *   - imports the directory into a ctrain checkpoint and loads that checkpoint back,
 *   - compares the logits (normalized error <= 1e-4; the bf16 model's reference was computed
 *     in fp32 from the same bf16 weights),
 *   - checks the 20 greedy tokens, both through ct_generate (KV cache) and by argmax over full
 *     forwards,
 *   - checks that embedding padding rows are zero,
 *   - exports F32 and re-imports: bit-identical parameters (and the tokenizer.json copied);
 *     exports BF16 and re-imports: exactly the RNE-rounded parameters.
 * Then unsupported configs and malformed weight sets are refused with messages naming the
 * key or tensor, and the commands reject bad usage with CT_ERR_USAGE (exit code 2).
 * CPU only. Fixtures via $CT_SOURCE_ROOT (meson sets it), else relative paths. Scratch files
 * go to a fresh $TMPDIR directory that is removed at the end. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "tests/unit/ct_test.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/generate.h"
#include "trainer/hf.h"
#include "trainer/model.h"
#include "trainer/safetensors.h"

#define N_NEW 20

static char tmpdir[512];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(p);
}

static bool fixture_dir(const char *name, char *out, size_t cap) {
  char probe[1200];
  const char *root = getenv("CT_SOURCE_ROOT");
  if (root && *root) {
    snprintf(out, cap, "%s/tests/fixtures/hf/%s", root, name);
    snprintf(probe, sizeof probe, "%s/config.json", out);
    return ct_file_exists(probe);
  }
  snprintf(out, cap, "tests/fixtures/hf/%s", name);
  snprintf(probe, sizeof probe, "%s/config.json", out);
  if (ct_file_exists(probe)) return true;
  const char *self = __FILE__, *tail = strstr(self, "tests/unit/test_hf.c");
  if (tail) {
    snprintf(out, cap, "%.*stests/fixtures/hf/%s", (int)(tail - self), self, name);
    snprintf(probe, sizeof probe, "%s/config.json", out);
    if (ct_file_exists(probe)) return true;
  }
  return false;
}

static cJSON *read_json(const char *path) {
  char *text = NULL;
  if (ct_read_file(path, &text, NULL) != CT_OK) return NULL;
  cJSON *j = cJSON_Parse(text);
  free(text);
  return j;
}

static int json_ints(const cJSON *arr, int32_t *out, int cap) {
  int n = 0;
  for (const cJSON *e = arr ? arr->child : NULL; e && n < cap; e = e->next) out[n++] = (int32_t)e->valuedouble;
  return n;
}

static float *host_params(ct_model *m) {
  const size_t n = ct_model_numel(m);
  float *h = malloc(n * sizeof(float));
  ct_model_ops(m)->to_host(h, ct_model_params(m), n * sizeof(float));
  return h;
}

static bool files_equal(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  bool eq = ct_read_file(a, &x, &nx) == CT_OK && ct_read_file(b, &y, &ny) == CT_OK && nx == ny &&
            !memcmp(x, y, nx);
  free(x);
  free(y);
  return eq;
}

static bool same_model_cfg(const ct_model_cfg *a, const ct_model_cfg *b) {
  return !strcmp(a->arch, b->arch) && a->n_layer == b->n_layer && a->n_head == b->n_head &&
         a->n_kv_head == b->n_kv_head && a->d_model == b->d_model && a->head_dim == b->head_dim &&
         a->d_ff == b->d_ff && a->vocab_size == b->vocab_size && a->vocab_pad == b->vocab_pad &&
         a->max_seq_len == b->max_seq_len && a->rope_theta == b->rope_theta &&
         a->norm_eps == b->norm_eps && a->qk_norm == b->qk_norm &&
         a->tie_embeddings == b->tie_embeddings && a->attn_bias == b->attn_bias &&
         a->init_std == b->init_std;
}

/* Loads a ctrain checkpoint written by import-hf into a CPU model for B=1, T tokens. */
static ct_model *load_ckpt(const char *ckpt, int T, ct_config *cfg) {
  char file[4200];
  ct_model *m = NULL;
  if (ct_checkpoint_read_config(ckpt, cfg, file, sizeof file) != CT_OK ||
      ct_model_create(&cfg->model, ct_ops_cpu(), 1, T, &m) != CT_OK ||
      ct_checkpoint_load_params(file, m) != CT_OK) {
    fprintf(stderr, "%s: %s\n", ckpt, ct_last_error());
    ct_model_destroy(m);
    return NULL;
  }
  return m;
}

static void test_model(const char *name, const char *arch, bool expect_tokenizer) {
  char dir[1024], path[1300], ckpt[1024], out[1024], ckpt2[1024];
  if (!fixture_dir(name, dir, sizeof dir)) {
    CHECK_MSG(false, "fixture tests/fixtures/hf/%s not found (run tools/make_hf_tiny.py)", name);
    return;
  }
  snprintf(path, sizeof path, "%s/expected.json", dir);
  cJSON *exp = read_json(path);
  CHECK_MSG(exp != NULL, "%s unreadable", path);
  if (!exp) return;
  int32_t ids[64], greedy[N_NEW];
  const int T = json_ints(cJSON_GetObjectItem(exp, "input_ids"), ids, 64);
  const int n_greedy = json_ints(cJSON_GetObjectItem(exp, "greedy"), greedy, N_NEW);
  const int V = (int)cJSON_GetObjectItem(exp, "vocab_size")->valuedouble;
  const cJSON *lj = cJSON_GetObjectItem(exp, "logits");
  CHECK(T > 0 && n_greedy == N_NEW && cJSON_GetArraySize(lj) == T * V);
  float *ref = malloc(sizeof(float) * (size_t)T * V), *got = malloc(sizeof(float) * (size_t)T * V);
  int k = 0;
  for (const cJSON *e = lj->child; e && k < T * V; e = e->next) ref[k++] = (float)e->valuedouble;

  /* import -> checkpoint -> model */
  snprintf(ckpt, sizeof ckpt, "%s/%s_ckpt", tmpdir, name);
  ct_status st = ct_hf_import(dir, ckpt);
  CHECK_MSG(st == CT_OK, "%s: import: %s", name, ct_last_error());
  ct_config cfg;
  ct_model *m = st == CT_OK ? load_ckpt(ckpt, T + N_NEW, &cfg) : NULL;
  CHECK(m != NULL);
  if (!m) { cJSON_Delete(exp); free(ref); free(got); return; }
  CHECK_MSG(!strcmp(cfg.model.arch, arch), "%s: arch %s, want %s", name, cfg.model.arch, arch);
  CHECK(cfg.model.vocab_size == V);
  if (expect_tokenizer) {
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK_MSG(files_equal(cfg.data.tokenizer, path), "%s: data.tokenizer = %s", name, cfg.data.tokenizer);
  } else {
    CHECK_MSG(!strcmp(cfg.data.tokenizer, "byte"), "%s: data.tokenizer = %s", name, cfg.data.tokenizer);
  }

  /* logits */
  const int Vp = ct_model_padded_vocab(&cfg.model);
  CHECK(ct_model_forward(m, ids, NULL, 1, T, 0.0f, NULL) == CT_OK);
  float *logits = malloc(sizeof(float) * (size_t)T * Vp);
  ct_model_ops(m)->to_host(logits, ct_model_logits(m), sizeof(float) * (size_t)T * Vp);
  for (int t = 0; t < T; t++) memcpy(got + (size_t)t * V, logits + (size_t)t * Vp, sizeof(float) * V);
  char what[128];
  snprintf(what, sizeof what, "%s logits", name);
  double err = ct_check_close(what, got, ref, (size_t)T * V, 1e-4, 0.0);
  printf("%-10s %-6s V=%d (Vp=%d) T=%d: logits normalized error %.3e", name, arch, V, Vp, T, err);

  /* greedy: KV-cache generation and argmax over full forwards must both equal HF's */
  ct_sample_cfg sc = CT_SAMPLE_INIT;
  sc.max_new_tokens = N_NEW;
  sc.temperature = 0.0f;
  sc.stop_id = -1;
  int32_t gen[N_NEW] = {0}, seq[64 + N_NEW];
  int n_gen = 0;
  st = ct_generate(m, ids, T, &sc, gen, &n_gen, NULL, NULL);
  CHECK_MSG(st == CT_OK, "%s: generate: %s", name, ct_last_error());
  CHECK_MSG(n_gen == N_NEW && !memcmp(gen, greedy, sizeof greedy), "%s: ct_generate greedy differs from HF", name);
  memcpy(seq, ids, sizeof(int32_t) * T);
  float *row = malloc(sizeof(float) * Vp);
  for (int s = 0; s < N_NEW; s++) {
    const int n = T + s;
    if (ct_model_forward(m, seq, NULL, 1, n, 0.0f, NULL) != CT_OK) break;
    ct_model_ops(m)->to_host(row, ct_model_logits(m) + (size_t)(n - 1) * Vp, sizeof(float) * Vp);
    int best = 0;
    for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
    seq[n] = best;
  }
  CHECK_MSG(!memcmp(seq + T, greedy, sizeof greedy), "%s: argmax greedy differs from HF", name);
  int same = 0;
  for (int s = 0; s < N_NEW; s++) same += gen[s] == greedy[s];
  printf(", greedy %d/%d tokens equal\n", same, N_NEW);

  /* padding rows of the embedding (and head) are zero */
  float *p1 = host_params(m);
  for (int i = 0; i < ct_model_n_params(m); i++) {
    const ct_param *p = ct_model_param(m, i);
    if (strcmp(p->name, "wte") && strcmp(p->name, "embed_tokens") && strcmp(p->name, "lm_head")) continue;
    int nonzero = 0;
    for (size_t j = (size_t)V * p->shape[1]; j < p->numel; j++) nonzero += p1[p->offset + j] != 0.0f;
    CHECK_MSG(nonzero == 0, "%s: %s has %d non-zero padding values", name, p->name, nonzero);
  }

  /* export F32 -> import: bit-identical */
  snprintf(out, sizeof out, "%s/%s_export", tmpdir, name);
  st = ct_hf_export(ckpt, out, CT_ST_F32);
  CHECK_MSG(st == CT_OK, "%s: export: %s", name, ct_last_error());
  ct_config cfg2;
  ct_model *m2 = NULL;
  st = ct_hf_load(out, ct_ops_cpu(), 1, 1, &cfg2, &m2);
  CHECK_MSG(st == CT_OK, "%s: re-import: %s", name, ct_last_error());
  if (m2) {
    CHECK(same_model_cfg(&cfg2.model, &cfg.model));
    CHECK(ct_model_numel(m2) == ct_model_numel(m));
    float *p2 = host_params(m2);
    CHECK_MSG(!memcmp(p1, p2, ct_model_numel(m) * sizeof(float)),
              "%s: export -> import changed the parameters", name);
    free(p2);
    ct_model_destroy(m2);
  }
  snprintf(path, sizeof path, "%s/tokenizer.json", out);
  CHECK_MSG(ct_file_exists(path) == expect_tokenizer, "%s: exported tokenizer.json %s", name,
            expect_tokenizer ? "missing" : "unexpected");
  if (expect_tokenizer) {
    char src[1300];
    snprintf(src, sizeof src, "%s/tokenizer.json", dir);
    CHECK(files_equal(src, path));
  }
  /* and the exported directory imports into a checkpoint identical in parameters */
  snprintf(ckpt2, sizeof ckpt2, "%s/%s_ckpt2", tmpdir, name);
  CHECK(ct_hf_import(out, ckpt2) == CT_OK);
  ct_config cfg3;
  ct_model *m3 = load_ckpt(ckpt2, 1, &cfg3);
  if (m3) {
    float *p3 = host_params(m3);
    CHECK(!memcmp(p1, p3, ct_model_numel(m) * sizeof(float)));
    free(p3);
    ct_model_destroy(m3);
  }

  /* export BF16 -> import: exactly the round-to-nearest-even bf16 values */
  snprintf(out, sizeof out, "%s/%s_export_bf16", tmpdir, name);
  st = ct_hf_export(ckpt, out, CT_ST_BF16);
  CHECK_MSG(st == CT_OK, "%s: export bf16: %s", name, ct_last_error());
  m2 = NULL;
  if (st == CT_OK && ct_hf_load(out, ct_ops_cpu(), 1, 1, &cfg2, &m2) == CT_OK) {
    float *p2 = host_params(m2);
    size_t diff = 0, changed = 0;
    for (size_t j = 0; j < ct_model_numel(m); j++) {
      float want = ct_st_bf16_to_f32(ct_st_f32_to_bf16(p1[j]));
      diff += memcmp(&want, &p2[j], sizeof(float)) != 0;
      changed += want != p1[j];
    }
    CHECK_MSG(diff == 0, "%s: %zu values differ from their bf16 rounding", name, diff);
    /* the bf16 fixture holds bf16 values: its bf16 export is lossless */
    if (!strcmp(name, "llama_gqa")) CHECK_MSG(changed == 0, "%s: %zu values changed", name, changed);
    else CHECK(changed > 0);
    free(p2);
    ct_model_destroy(m2);
  } else {
    CHECK_MSG(false, "%s: re-import of the bf16 export: %s", name, ct_last_error());
  }
  free(p1);
  free(row);
  free(logits);
  ct_model_destroy(m);
  cJSON_Delete(exp);
  free(ref);
  free(got);
}

/* ---- refusals ---- */

static void write_json(const char *path, const cJSON *j) {
  char *s = cJSON_Print(j);
  FILE *f = fopen(path, "w");
  fputs(s, f);
  fclose(f);
  free(s);
}

/* Makes tmpdir/<tag>/ with the fixture's config.json edited by (key, JSON value) pairs
 * (value NULL deletes the key) and symlinks to its weights. */
static void make_variant(const char *fixture, const char *tag, const char *const *edits, int n,
                         char *out, size_t cap) {
  char src[1024], p[1400], q[1400];
  fixture_dir(fixture, src, sizeof src);
  snprintf(out, cap, "%s/%s", tmpdir, tag);
  ct_mkdirs(out);
  snprintf(p, sizeof p, "%s/config.json", src);
  cJSON *j = read_json(p);
  for (int i = 0; i < n; i++) {
    cJSON_DeleteItemFromObjectCaseSensitive(j, edits[2 * i]);
    if (edits[2 * i + 1]) cJSON_AddItemToObject(j, edits[2 * i], cJSON_Parse(edits[2 * i + 1]));
  }
  snprintf(q, sizeof q, "%s/config.json", out);
  write_json(q, j);
  cJSON_Delete(j);
  const char *weights[] = {"model.safetensors", "model.safetensors.index.json"};
  for (int w = 0; w < 2; w++) {
    snprintf(p, sizeof p, "%s/%s", src, weights[w]);
    snprintf(q, sizeof q, "%s/%s", out, weights[w]);
    if (ct_file_exists(p) && !ct_file_exists(q)) {
      char abs[4096];
      if (realpath(p, abs)) (void)!symlink(abs, q);
    }
  }
}

static void expect_refused(const char *dir, const char *what, const char *expect) {
  ct_config cfg;
  ct_model *m = NULL;
  ct_clear_error();
  ct_status st = ct_hf_load(dir, ct_ops_cpu(), 1, 1, &cfg, &m);
  /* config values the schema rejects come back as CT_ERR_CONFIG; both exit with 2 */
  CHECK_MSG((st == CT_ERR_INPUT || st == CT_ERR_CONFIG) && !m && strstr(ct_last_error(), expect),
            "%s: status %d, message \"%s\" (want \"%s\")", what, (int)st, ct_last_error(), expect);
  ct_model_destroy(m);
}

static void test_unsupported_configs(void) {
  static const struct { const char *fixture, *tag, *edit[4], *expect; } C[] = {
    {"qwen3", "yarn", {"rope_parameters", "{\"rope_type\":\"yarn\",\"rope_theta\":10000.0,\"factor\":4.0}"},
     "rope_parameters.rope_type = \"yarn\": RoPE scaling is not supported"},
    {"llama_gqa", "linear_scaling", {"rope_scaling", "{\"rope_type\":\"linear\",\"factor\":2.0}"},
     "rope_scaling (linear): RoPE scaling is not supported"},
    {"llama_gqa", "gelu", {"hidden_act", "\"gelu\""}, "/gelu/config.json: hidden_act = \"gelu\": only silu"},
    {"llama_gqa", "o_bias", {"attention_bias", "true"}, "attention_bias = true: LlamaForCausalLM then has a bias on o_proj"},
    {"qwen3", "qwen3_bias", {"attention_bias", "true"}, "bias on o_proj"},
    {"llama_gqa", "mlp_bias", {"mlp_bias", "true"}, "mlp_bias = true"},
    {"qwen2", "sliding", {"use_sliding_window", "true"}, "use_sliding_window = true: sliding-window attention"},
    {"qwen3", "layer_types", {"layer_types", "[\"full_attention\",\"sliding_attention\"]"},
     "layer_types[1] = \"sliding_attention\""},
    {"qwen3", "partial", {"partial_rotary_factor", "0.5"}, "partial_rotary_factor = 0.5"},
    {"gpt2", "relu", {"activation_function", "\"relu\""}, "activation_function = \"relu\""},
    {"gpt2", "layer_scale", {"scale_attn_by_inverse_layer_idx", "true"}, "scale_attn_by_inverse_layer_idx"},
    {"gpt2", "mistral", {"architectures", "[\"MistralForCausalLM\"]", "model_type", "\"mistral\""},
     "architecture MistralForCausalLM is not supported (supported: GPT2LMHeadModel"},
    {"gpt2", "mismatch", {"model_type", "\"llama\""}, "model_type \"llama\" does not match architecture GPT2LMHeadModel"},
    {"qwen3", "no_arch", {"architectures", NULL, "model_type", NULL}, "neither \"architectures\" nor \"model_type\""},
    {"qwen3", "bad_int", {"num_hidden_layers", "2.5"}, "\"num_hidden_layers\" must be an integer"},
    {"qwen3", "no_hidden", {"hidden_size", NULL}, "\"hidden_size\" missing"},
    {"qwen3", "gqa_bad", {"num_key_value_heads", "3"}, "not divisible by model.n_kv_head = 3"},
    /* config and weights disagree */
    {"qwen3", "ffn_shape", {"intermediate_size", "100"},
     "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [96, 64], but config.json implies [100, 64]"},
    {"gpt2", "untied_missing", {"tie_word_embeddings", "false"}, "tensor \"lm_head.weight\" missing"},
    {"qwen3", "tied_extra", {"tie_word_embeddings", "true"},
     "tie_word_embeddings = true, but lm_head.weight differs from the embedding"},
  };
  char dir[1024];
  for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
    int n = C[i].edit[2] ? 2 : 1;
    make_variant(C[i].fixture, C[i].tag, C[i].edit, n, dir, sizeof dir);
    expect_refused(dir, C[i].tag, C[i].expect);
  }
}

/* Weight sets with a tensor too many or too few (from the qwen3 fixture). */
static void test_weight_sets(void) {
  char src[1024], dir[1024], p[1400];
  if (!fixture_dir("qwen3", src, sizeof src)) return;
  ct_st_set *set = NULL;
  CHECK(ct_st_set_open(src, &set) == CT_OK);
  if (!set) return;
  const int n = ct_st_set_n_tensors(set);
  ct_st_out *outs = calloc((size_t)n + 1, sizeof *outs);
  float **data = calloc((size_t)n + 1, sizeof *data);
  for (int i = 0; i < n; i++) {
    const ct_st_tensor *t = ct_st_set_tensor(set, i);
    data[i] = malloc(sizeof(float) * (t->numel ? t->numel : 1));
    ct_st_set_read_f32(set, t, data[i]);
    outs[i] = (ct_st_out){t->name, CT_ST_F32, t->ndim, {t->shape[0], t->shape[1]}, data[i]};
  }
  static float zeros[64];
  const struct { const char *tag, *drop, *add, *expect; } W[] = {
    {"extra_tensor", NULL, "model.layers.0.self_attn.o_proj.bias",
     "unexpected tensor \"model.layers.0.self_attn.o_proj.bias\""},
    {"rotary_buffer", NULL, "model.layers.0.self_attn.rotary_emb.inv_freq", NULL}, /* ignored */
    {"missing_norm", "model.norm.weight", NULL, "tensor \"model.norm.weight\" missing (needed for ctrain parameter norm.weight)"},
    {"missing_k", "model.layers.1.self_attn.k_proj.weight", NULL,
     "tensor \"model.layers.1.self_attn.k_proj.weight\" missing (needed for ctrain parameter layers.1.self_attn.qkv_proj.weight)"},
  };
  for (size_t w = 0; w < sizeof W / sizeof W[0]; w++) {
    make_variant("qwen3", W[w].tag, NULL, 0, dir, sizeof dir);
    ct_st_out *list = calloc((size_t)n + 1, sizeof *list);
    int m = 0;
    for (int i = 0; i < n; i++)
      if (!W[w].drop || strcmp(outs[i].name, W[w].drop)) list[m++] = outs[i];
    if (W[w].add) list[m++] = (ct_st_out){W[w].add, CT_ST_F32, 1, {64}, zeros};
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    CHECK(ct_st_write(p, list, m, NULL, 0, NULL, NULL) == CT_OK);
    if (W[w].expect) {
      expect_refused(dir, W[w].tag, W[w].expect);
    } else {
      ct_config cfg;
      ct_model *mm = NULL;
      CHECK_MSG(ct_hf_load(dir, ct_ops_cpu(), 1, 1, &cfg, &mm) == CT_OK, "%s: %s", W[w].tag, ct_last_error());
      ct_model_destroy(mm);
    }
    free(list);
  }
  /* a tied model may carry lm_head.weight if it equals the embedding (older GPT-2 files) */
  char g[1024];
  if (fixture_dir("gpt2", g, sizeof g)) {
    ct_st_set *gs = NULL;
    CHECK(ct_st_set_open(g, &gs) == CT_OK);
    if (gs) {
      const int gn = ct_st_set_n_tensors(gs);
      ct_st_out *gl = calloc((size_t)gn + 3, sizeof *gl);
      float **gd = calloc((size_t)gn + 1, sizeof *gd);
      const ct_st_tensor *wte = ct_st_set_find(gs, "transformer.wte.weight");
      for (int i = 0; i < gn; i++) {
        const ct_st_tensor *t = ct_st_set_tensor(gs, i);
        gd[i] = malloc(sizeof(float) * t->numel);
        ct_st_set_read_f32(gs, t, gd[i]);
        gl[i] = (ct_st_out){t->name, CT_ST_F32, t->ndim, {t->shape[0], t->shape[1]}, gd[i]};
        if (t == wte) gl[gn] = (ct_st_out){"lm_head.weight", CT_ST_F32, 2, {t->shape[0], t->shape[1]}, gd[i]};
      }
      static float mask[4 * 64 * 64];
      gl[gn + 1] = (ct_st_out){"transformer.h.0.attn.bias", CT_ST_F32, 4, {1, 1, 64, 64}, mask};
      make_variant("gpt2", "gpt2_with_head", NULL, 0, dir, sizeof dir);
      snprintf(p, sizeof p, "%s/model.safetensors", dir);
      unlink(p);
      CHECK(ct_st_write(p, gl, gn + 2, NULL, 0, NULL, NULL) == CT_OK);
      ct_config cfg;
      ct_model *mm = NULL;
      CHECK_MSG(ct_hf_load(dir, ct_ops_cpu(), 1, 1, &cfg, &mm) == CT_OK, "gpt2 with lm_head: %s", ct_last_error());
      ct_model_destroy(mm);
      for (int i = 0; i < gn; i++) free(gd[i]);
      free(gd);
      free(gl);
      ct_st_set_close(gs);
    }
  }
  for (int i = 0; i < n; i++) free(data[i]);
  free(data);
  free(outs);
  ct_st_set_close(set);
}

static void test_usage(void) {
  char *none[] = {NULL};
  char *one[] = {"dir"};
  char *three[] = {"a", "b", "c"};
  char *flag[] = {"a", "b", "--bogus"};
  char *dtype_bad[] = {"a", "b", "--dtype", "fp8"};
  char *dtype_missing[] = {"a", "b", "--dtype"};
  CHECK(ct_cmd_import_hf(0, none) == CT_ERR_USAGE && ct_status_exit_code(CT_ERR_USAGE) == 2);
  CHECK(ct_cmd_import_hf(1, one) == CT_ERR_USAGE && strstr(ct_last_error(), "usage: ctrain import-hf"));
  CHECK(ct_cmd_import_hf(3, three) == CT_ERR_USAGE);
  CHECK(ct_cmd_import_hf(3, flag) == CT_ERR_USAGE && strstr(ct_last_error(), "--bogus"));
  CHECK(ct_cmd_export_hf(1, one) == CT_ERR_USAGE && strstr(ct_last_error(), "usage: ctrain export-hf"));
  CHECK(ct_cmd_export_hf(3, three) == CT_ERR_USAGE);
  CHECK(ct_cmd_export_hf(3, flag) == CT_ERR_USAGE);
  CHECK(ct_cmd_export_hf(4, dtype_bad) == CT_ERR_USAGE && strstr(ct_last_error(), "fp8"));
  CHECK(ct_cmd_export_hf(3, dtype_missing) == CT_ERR_USAGE);
  /* missing inputs are input errors (exit 2) naming the path */
  char missing[700], *args[2] = {missing, missing};
  snprintf(missing, sizeof missing, "%s/no_such_model", tmpdir);
  CHECK(ct_cmd_import_hf(2, args) == CT_ERR_INPUT && strstr(ct_last_error(), "no_such_model/config.json"));
  CHECK(ct_cmd_export_hf(2, args) == CT_ERR_INPUT && strstr(ct_last_error(), "no_such_model"));
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/ct_hf_XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
  test_model("gpt2", "gpt2", true);
  test_model("llama_gqa", "llama", false);
  test_model("qwen3", "llama", false);
  test_model("qwen2", "llama", false);
  test_unsupported_configs();
  test_weight_sets();
  test_usage();
  nftw(tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  return ct_test_finish();
}
