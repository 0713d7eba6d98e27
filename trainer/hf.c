/* trainer/hf.c — Hugging Face config.json / safetensors <-> ctrain model (see hf.h). */
#define _GNU_SOURCE
#include "trainer/hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "trainer/checkpoint.h"

typedef enum { FAM_GPT2, FAM_LLAMA, FAM_QWEN2, FAM_QWEN3, FAM_COUNT } family;

static const struct { const char *arch, *model_type; } FAMILIES[FAM_COUNT] = {
  [FAM_GPT2] = {"GPT2LMHeadModel", "gpt2"},
  [FAM_LLAMA] = {"LlamaForCausalLM", "llama"},
  [FAM_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
  [FAM_QWEN3] = {"Qwen3ForCausalLM", "qwen3"},
};
#define SUPPORTED "GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"

/* ---------------------------------------------------------------- config.json */

typedef struct jcfg { const cJSON *root; const char *path; } jcfg;

#define REFUSE(...) return ct_set_error(CT_ERR_INPUT, __VA_ARGS__)

static const cJSON *jget(const cJSON *obj, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  return x && !cJSON_IsNull(x) ? x : NULL; /* null means "not set", as in Transformers */
}

/* Each getter leaves *out alone when the key is absent or null (unless required). */
static ct_status j_int(const jcfg *j, const char *key, bool required, int *out) {
  const cJSON *x = jget(j->root, key);
  if (!x) {
    if (required) REFUSE("%s: \"%s\" missing", j->path, key);
    return CT_OK;
  }
  if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || fabs(x->valuedouble) > INT_MAX)
    REFUSE("%s: \"%s\" must be an integer", j->path, key);
  *out = (int)x->valuedouble;
  return CT_OK;
}

static ct_status j_num(const jcfg *j, const cJSON *obj, const char *key, double *out) {
  const cJSON *x = jget(obj, key);
  if (!x) return CT_OK;
  if (!cJSON_IsNumber(x)) REFUSE("%s: \"%s\" must be a number", j->path, key);
  *out = x->valuedouble;
  return CT_OK;
}

static ct_status j_bool(const jcfg *j, const char *key, bool *out) {
  const cJSON *x = jget(j->root, key);
  if (!x) return CT_OK;
  if (!cJSON_IsBool(x)) REFUSE("%s: \"%s\" must be true or false", j->path, key);
  *out = cJSON_IsTrue(x);
  return CT_OK;
}

static ct_status j_str(const jcfg *j, const cJSON *obj, const char *key, const char **out) {
  const cJSON *x = jget(obj, key);
  if (!x) return CT_OK;
  if (!cJSON_IsString(x)) REFUSE("%s: \"%s\" must be a string", j->path, key);
  *out = x->valuestring;
  return CT_OK;
}

static ct_status read_family(const jcfg *j, family *fam) {
  const char *mt = NULL, *arch = NULL;
  CT_TRY(j_str(j, j->root, "model_type", &mt));
  const cJSON *archs = jget(j->root, "architectures");
  if (archs) {
    if (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) < 1 ||
        !cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
      REFUSE("%s: \"architectures\" must be a list of class names", j->path);
    arch = cJSON_GetArrayItem(archs, 0)->valuestring;
  }
  if (!arch && !mt) REFUSE("%s: neither \"architectures\" nor \"model_type\" is set", j->path);
  for (int f = 0; f < FAM_COUNT; f++) {
    if (arch ? strcmp(arch, FAMILIES[f].arch) : strcmp(mt, FAMILIES[f].model_type)) continue;
    if (mt && strcmp(mt, FAMILIES[f].model_type))
      REFUSE("%s: model_type \"%s\" does not match architecture %s", j->path, mt, FAMILIES[f].arch);
    *fam = (family)f;
    return CT_OK;
  }
  if (arch) REFUSE("%s: architecture %s is not supported (supported: " SUPPORTED ")", j->path, arch);
  REFUSE("%s: model_type \"%s\" is not supported (supported: gpt2, llama, qwen2, qwen3)", j->path, mt);
}

/* rope_theta lives at the top level (transformers < 5) or in rope_parameters (>= 5); any
 * scaling (linear, dynamic, yarn, llama3, ...) changes the positions ctrain computes. */
static ct_status read_rope(const jcfg *j, double *theta) {
  *theta = 10000.0;
  CT_TRY(j_num(j, j->root, "rope_theta", theta));
  const char *type = NULL;
  const cJSON *rp = jget(j->root, "rope_parameters");
  if (rp) {
    if (!cJSON_IsObject(rp)) REFUSE("%s: \"rope_parameters\" must be an object", j->path);
    CT_TRY(j_str(j, rp, "rope_type", &type));
    if (!type) CT_TRY(j_str(j, rp, "type", &type));
    if (type && strcmp(type, "default"))
      REFUSE("%s: rope_parameters.rope_type = \"%s\": RoPE scaling is not supported (only"
             " \"default\")", j->path, type);
    CT_TRY(j_num(j, rp, "rope_theta", theta));
    double prf = 1.0;
    CT_TRY(j_num(j, rp, "partial_rotary_factor", &prf));
    if (prf != 1.0)
      REFUSE("%s: rope_parameters.partial_rotary_factor = %g: partial RoPE is not supported",
             j->path, prf);
  }
  const cJSON *rs = jget(j->root, "rope_scaling");
  if (rs) {
    type = NULL;
    if (cJSON_IsObject(rs)) {
      CT_TRY(j_str(j, rs, "rope_type", &type));
      if (!type) CT_TRY(j_str(j, rs, "type", &type));
    }
    if (!type || strcmp(type, "default"))
      REFUSE("%s: rope_scaling (%s): RoPE scaling is not supported (only null or \"default\")",
             j->path, type ? type : "not an object with a rope_type");
  }
  double prf = 1.0;
  CT_TRY(j_num(j, j->root, "partial_rotary_factor", &prf));
  if (prf != 1.0)
    REFUSE("%s: partial_rotary_factor = %g: partial RoPE is not supported", j->path, prf);
  return CT_OK;
}

static ct_status refuse_sliding(const jcfg *j) {
  bool sliding = false;
  CT_TRY(j_bool(j, "use_sliding_window", &sliding));
  if (sliding)
    REFUSE("%s: use_sliding_window = true: sliding-window attention is not supported", j->path);
  const cJSON *lt = jget(j->root, "layer_types");
  if (lt) {
    if (!cJSON_IsArray(lt)) REFUSE("%s: \"layer_types\" must be a list", j->path);
    int i = 0;
    for (const cJSON *e = lt->child; e; e = e->next, i++)
      if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
        REFUSE("%s: layer_types[%d] = \"%s\": only full attention is supported (no sliding"
               " windows)", j->path, i, cJSON_IsString(e) ? e->valuestring : "?");
  }
  return CT_OK;
}

static ct_status read_gpt2(const jcfg *j, ct_model_cfg *m) {
  snprintf(m->arch, sizeof m->arch, "gpt2");
  CT_TRY(j_int(j, "n_layer", true, &m->n_layer));
  CT_TRY(j_int(j, "n_head", true, &m->n_head));
  CT_TRY(j_int(j, "n_embd", true, &m->d_model));
  CT_TRY(j_int(j, "vocab_size", true, &m->vocab_size));
  m->max_seq_len = 1024;
  CT_TRY(j_int(j, "n_positions", false, &m->max_seq_len));
  m->d_ff = 4 * m->d_model;
  CT_TRY(j_int(j, "n_inner", false, &m->d_ff));
  m->norm_eps = 1e-5;
  CT_TRY(j_num(j, j->root, "layer_norm_epsilon", &m->norm_eps));
  m->tie_embeddings = true;
  CT_TRY(j_bool(j, "tie_word_embeddings", &m->tie_embeddings));
  const char *act = "gelu_new";
  CT_TRY(j_str(j, j->root, "activation_function", &act));
  if (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
    REFUSE("%s: activation_function = \"%s\": only the tanh GELU (gelu_new, gelu_pytorch_tanh) is"
           " supported", j->path, act);
  bool scale = true, by_layer = false, cross = false;
  CT_TRY(j_bool(j, "scale_attn_weights", &scale));
  CT_TRY(j_bool(j, "scale_attn_by_inverse_layer_idx", &by_layer));
  CT_TRY(j_bool(j, "add_cross_attention", &cross));
  if (!scale) REFUSE("%s: scale_attn_weights = false is not supported", j->path);
  if (by_layer) REFUSE("%s: scale_attn_by_inverse_layer_idx = true is not supported", j->path);
  if (cross) REFUSE("%s: add_cross_attention = true is not supported", j->path);
  return CT_OK;
}

static ct_status read_llama(const jcfg *j, family fam, ct_model_cfg *m) {
  snprintf(m->arch, sizeof m->arch, "llama");
  CT_TRY(j_int(j, "num_hidden_layers", true, &m->n_layer));
  CT_TRY(j_int(j, "num_attention_heads", true, &m->n_head));
  CT_TRY(j_int(j, "hidden_size", true, &m->d_model));
  CT_TRY(j_int(j, "intermediate_size", true, &m->d_ff));
  CT_TRY(j_int(j, "vocab_size", true, &m->vocab_size));
  m->n_kv_head = m->n_head;
  CT_TRY(j_int(j, "num_key_value_heads", false, &m->n_kv_head));
  CT_TRY(j_int(j, "head_dim", false, &m->head_dim)); /* absent: hidden_size / heads */
  m->max_seq_len = fam == FAM_LLAMA ? 2048 : 32768;
  CT_TRY(j_int(j, "max_position_embeddings", false, &m->max_seq_len));
  m->norm_eps = 1e-6;
  CT_TRY(j_num(j, j->root, "rms_norm_eps", &m->norm_eps));
  m->tie_embeddings = false;
  CT_TRY(j_bool(j, "tie_word_embeddings", &m->tie_embeddings));
  CT_TRY(read_rope(j, &m->rope_theta));
  const char *act = "silu";
  CT_TRY(j_str(j, j->root, "hidden_act", &act));
  if (strcmp(act, "silu"))
    REFUSE("%s: hidden_act = \"%s\": only silu (SwiGLU) is supported", j->path, act);
  bool attn_bias = false, mlp_bias = false;
  CT_TRY(j_bool(j, "attention_bias", &attn_bias));
  CT_TRY(j_bool(j, "mlp_bias", &mlp_bias));
  /* Llama and Qwen3 put attention_bias on o_proj too; Qwen2 has q/k/v biases only, always */
  if (attn_bias && fam != FAM_QWEN2)
    REFUSE("%s: attention_bias = true: %s then has a bias on o_proj, which ctrain does not"
           " support", j->path, FAMILIES[fam].arch);
  if (mlp_bias) REFUSE("%s: mlp_bias = true: biases on the MLP are not supported", j->path);
  m->attn_bias = fam == FAM_QWEN2;
  m->qk_norm = fam == FAM_QWEN3;
  CT_TRY(refuse_sliding(j));
  return CT_OK;
}

ct_status ct_hf_read_config(const char *dir, ct_config *cfg) {
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  char *text = NULL;
  CT_TRY(ct_read_file(path, &text, NULL));
  cJSON *root = cJSON_Parse(text);
  free(text);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    REFUSE("%s: not a JSON object", path);
  }
  jcfg j = {root, path};
  ct_config_defaults(cfg);
  ct_model_cfg *m = &cfg->model;
  memset(m->arch, 0, sizeof m->arch);
  m->head_dim = m->n_kv_head = m->d_ff = 0;
  family fam = FAM_GPT2;
  ct_status st = read_family(&j, &fam);
  if (st == CT_OK) st = fam == FAM_GPT2 ? read_gpt2(&j, m) : read_llama(&j, fam, m);
  double init = 0;
  if (st == CT_OK) st = j_num(&j, root, "initializer_range", &init);
  cJSON_Delete(root);
  if (st != CT_OK) return st;
  if (init > 0) m->init_std = init;

  char tok[4200], abs_tok[PATH_MAX];
  snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
  snprintf(cfg->data.tokenizer, CT_STR, "byte");
  if (ct_file_exists(tok) && realpath(tok, abs_tok)) {
    if (strlen(abs_tok) < CT_STR) snprintf(cfg->data.tokenizer, CT_STR, "%s", abs_tok);
    else ct_log_warn("import-hf: %s: path longer than %d bytes, data.tokenizer stays \"byte\"", abs_tok, CT_STR - 1);
  }
  char base[CT_STR]; /* the config's name: the directory's base name */
  snprintf(base, sizeof base, "%s", dir);
  for (size_t n = strlen(base); n > 1 && base[n - 1] == '/'; n--) base[n - 1] = '\0';
  const char *slash = strrchr(base, '/');
  snprintf(cfg->name, CT_STR, "%s", slash && slash[1] ? slash + 1 : base);
  if (cfg->train.seq_len > m->max_seq_len) cfg->train.seq_len = m->max_seq_len;
  st = ct_config_validate(cfg);
  if (st != CT_OK) ct_add_context(st, "%s: ", path);
  return st;
}

/* ---------------------------------------------------------------- the name/layout mapping */

/* How one ctrain parameter is stored in a HF checkpoint: one or more tensors stacked along
 * rows (fused q|k|v and gate|up), possibly transposed (GPT-2's Conv1D keeps (in, out)), and
 * possibly fewer rows than ctrain has (the vocabulary padding rows). */
typedef struct hf_map {
  int n;                /* parts */
  char name[3][200];
  int rows[3];          /* ctrain rows covered by each part */
  int cols;             /* 0 for 1-D */
  bool transpose;       /* HF shape is (cols, rows) */
} hf_map;

static const struct { const char *ct, *hf[3]; } FUSED[] = {
  {"self_attn.qkv_proj.weight", {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
  {"self_attn.qkv_proj.bias", {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}},
  {"mlp.gate_up_proj.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight", NULL}},
};

static ct_status map_param(const ct_model_cfg *c, const char *prefix, const ct_param *p, hf_map *m) {
  const bool gpt2 = !strcmp(c->arch, "gpt2");
  memset(m, 0, sizeof *m);
  m->n = 1;
  m->rows[0] = p->shape[0];
  m->cols = p->ndim == 2 ? p->shape[1] : 0;
  const char *name = p->name;
  if (!strcmp(name, "lm_head")) {
    snprintf(m->name[0], sizeof m->name[0], "lm_head.weight");
    m->rows[0] = c->vocab_size;
    return CT_OK;
  }
  if (!strcmp(name, "wte") || !strcmp(name, "embed_tokens") || !strcmp(name, "wpe")) {
    snprintf(m->name[0], sizeof m->name[0], "%s%s.weight", prefix, name);
    if (strcmp(name, "wpe")) m->rows[0] = c->vocab_size;
    return CT_OK;
  }
  /* "h.3.attn.c_attn.weight" -> layer part "h.3." + suffix "attn.c_attn.weight" */
  const char *suffix = name;
  int lp = 0;
  if (p->layer >= 0) {
    const char *dot = strchr(name, '.');
    dot = dot ? strchr(dot + 1, '.') : NULL;
    if (!dot) return ct_set_error(CT_ERR_RUNTIME, "parameter %s: unexpected name", name);
    lp = (int)(dot + 1 - name);
    suffix = dot + 1;
  }
  for (size_t f = 0; f < sizeof FUSED / sizeof FUSED[0]; f++) {
    if (strcmp(suffix, FUSED[f].ct)) continue;
    const int hd = c->head_dim, kv = c->n_kv_head;
    const int qkv[3] = {c->n_head * hd, kv * hd, kv * hd}, gu[3] = {c->d_ff, c->d_ff, 0};
    const int *rows = FUSED[f].hf[2] ? qkv : gu;
    m->n = FUSED[f].hf[2] ? 3 : 2;
    int total = 0;
    for (int k = 0; k < m->n; k++) {
      snprintf(m->name[k], sizeof m->name[k], "%s%.*s%s", prefix, lp, name, FUSED[f].hf[k]);
      m->rows[k] = rows[k];
      total += rows[k];
    }
    if (total != p->shape[0])
      return ct_set_error(CT_ERR_RUNTIME, "parameter %s: %d rows, but its HF parts have %d", name,
                          p->shape[0], total);
    return CT_OK;
  }
  snprintf(m->name[0], sizeof m->name[0], "%s%s", prefix, name);
  m->transpose = gpt2 && p->ndim == 2 && p->layer >= 0; /* Conv1D: c_attn, c_proj, c_fc */
  return CT_OK;
}

/* Expected HF shape of part k, formatted for messages and compared against a tensor. */
static bool part_shape_ok(const hf_map *m, int k, const ct_st_tensor *t) {
  if (!m->cols) return t->ndim == 1 && t->shape[0] == m->rows[k];
  int64_t a = m->transpose ? m->cols : m->rows[k], b = m->transpose ? m->rows[k] : m->cols;
  return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b;
}

static void fmt_shape(char *out, size_t cap, int nd, const int64_t *dims) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int i = 0; i < nd && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "", (long long)dims[i]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

static void part_shape(const hf_map *m, int k, int *nd, int64_t dims[2]) {
  *nd = m->cols ? 2 : 1;
  dims[0] = m->cols && m->transpose ? m->cols : m->rows[k];
  dims[1] = m->transpose ? m->rows[k] : m->cols;
}

/* ---------------------------------------------------------------- import */

static int set_index_of(const ct_st_set *s, const char *name) {
  int lo = 0, hi = ct_st_set_n_tensors(s) - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(ct_st_set_tensor(s, mid)->name, name);
    if (!c) return mid;
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

static ct_status grow(float **buf, size_t *cap, size_t n) {
  if (n <= *cap) return CT_OK;
  float *g = realloc(*buf, n * sizeof(float));
  if (!g) return ct_set_error(CT_ERR_NOMEM, "out of memory for a %zu-float tensor", n);
  *buf = g;
  *cap = n;
  return CT_OK;
}

/* Fills host[numel] (zeroed by the caller) from the set through the parameter table, then
 * accounts for every tensor of the set. */
static ct_status fill_params(const char *dir, const ct_st_set *set, const ct_model *m, float *host) {
  const ct_model_cfg *c = ct_model_config(m);
  const bool gpt2 = !strcmp(c->arch, "gpt2");
  const char *emb = gpt2 ? "wte.weight" : "embed_tokens.weight", *prefix = gpt2 ? "transformer." : "model.";
  char probe[256];
  snprintf(probe, sizeof probe, "%s%s", prefix, emb);
  if (set_index_of(set, probe) < 0) {
    if (set_index_of(set, emb) < 0)
      REFUSE("%s: no %s or %s tensor: not a %s checkpoint?", dir, probe, emb, c->arch);
    prefix = ""; /* saved from the bare GPT2Model / LlamaModel */
  }
  const int n_set = ct_st_set_n_tensors(set);
  unsigned char *used = ct_calloc((size_t)n_set + 1, 1, "import bookkeeping");
  float *scratch = NULL;
  size_t cap = 0;
  ct_status st = used ? CT_OK : CT_ERR_NOMEM;
  char want[64], got[64];
  for (int i = 0; i < ct_model_n_params(m) && st == CT_OK; i++) {
    const ct_param *p = ct_model_param(m, i);
    hf_map mp;
    CT_TRY_GOTO(map_param(c, prefix, p, &mp), done);
    const size_t cols = mp.cols ? (size_t)mp.cols : 1;
    size_t row0 = 0;
    for (int k = 0; k < mp.n; k++) {
      int idx = set_index_of(set, mp.name[k]);
      if (idx < 0) {
        st = ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\" missing (needed for ctrain parameter %s)",
                          dir, mp.name[k], p->name);
        goto done;
      }
      const ct_st_tensor *t = ct_st_set_tensor(set, idx);
      if (!part_shape_ok(&mp, k, t)) {
        int nd;
        int64_t dims[2];
        part_shape(&mp, k, &nd, dims);
        fmt_shape(want, sizeof want, nd, dims);
        fmt_shape(got, sizeof got, t->ndim, t->shape);
        st = ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\" has shape %s, but config.json implies %s",
                          dir, t->name, got, want);
        goto done;
      }
      if (used[idx]) {
        st = ct_set_error(CT_ERR_RUNTIME, "%s: tensor \"%s\" mapped twice", dir, t->name);
        goto done;
      }
      used[idx] = 1;
      CT_TRY_GOTO(grow(&scratch, &cap, (size_t)t->numel), done);
      CT_TRY_GOTO(ct_st_set_read_f32(set, t, scratch), done);
      float *dst = host + p->offset + row0 * cols;
      const size_t rows = (size_t)mp.rows[k];
      if (mp.transpose) {
        for (size_t r = 0; r < rows; r++)
          for (size_t q = 0; q < cols; q++) dst[r * cols + q] = scratch[q * rows + r];
      } else {
        memcpy(dst, scratch, rows * cols * sizeof(float));
      }
      row0 += rows;
    }
  }
  /* every HF tensor must have gone somewhere, unless it is a known redundant one */
  for (int idx = 0; idx < n_set && st == CT_OK; idx++) {
    if (used[idx]) continue;
    const ct_st_tensor *t = ct_st_set_tensor(set, idx);
    const char *n = t->name;
    bool layer_buf = gpt2 && !strncmp(n, prefix, strlen(prefix)) && !strncmp(n + strlen(prefix), "h.", 2) &&
                     (ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias"));
    if (layer_buf || (!gpt2 && ends_with(n, ".rotary_emb.inv_freq"))) continue;
    if (!strcmp(n, "lm_head.weight") && c->tie_embeddings) {
      /* redundant only if it really is the embedding */
      const ct_param *e = ct_model_find_param(m, gpt2 ? "wte" : "embed_tokens");
      const size_t numel = (size_t)c->vocab_size * (size_t)c->d_model;
      if (t->ndim != 2 || t->shape[0] != c->vocab_size || t->shape[1] != c->d_model) {
        fmt_shape(got, sizeof got, t->ndim, t->shape);
        st = ct_set_error(CT_ERR_INPUT, "%s: tensor \"lm_head.weight\" has shape %s, not [%d, %d]",
                          dir, got, c->vocab_size, c->d_model);
        break;
      }
      CT_TRY_GOTO(grow(&scratch, &cap, numel), done);
      CT_TRY_GOTO(ct_st_set_read_f32(set, t, scratch), done);
      if (memcmp(scratch, host + e->offset, numel * sizeof(float)))
        st = ct_set_error(CT_ERR_INPUT, "%s: config.json says tie_word_embeddings = true, but"
                          " lm_head.weight differs from the embedding", dir);
      continue;
    }
    st = ct_set_error(CT_ERR_INPUT, "%s: unexpected tensor \"%s\": it has no place in a %s model"
                      " with this config.json", dir, n, c->arch);
  }
done:
  free(scratch);
  free(used);
  return st;
}

ct_status ct_hf_load(const char *dir, const ct_ops *ops, int max_B, int max_T, ct_config *cfg,
                     ct_model **out) {
  *out = NULL;
  CT_TRY(ct_hf_read_config(dir, cfg));
  ct_st_set *set = NULL;
  ct_model *m = NULL;
  float *host = NULL;
  ct_status st = CT_OK;
  CT_TRY_GOTO(ct_st_set_open(dir, &set), fail);
  CT_TRY_GOTO(ct_model_create(&cfg->model, ops, max_B, max_T, &m), fail);
  host = ct_calloc(ct_model_numel(m), sizeof(float), "import staging");
  if (!host) { st = CT_ERR_NOMEM; goto fail; }
  CT_TRY_GOTO(fill_params(dir, set, m, host), fail);
  ops->to_device(ct_model_params(m), host, ct_model_numel(m) * sizeof(float));
  free(host);
  ct_st_set_close(set);
  *out = m;
  return CT_OK;
fail:
  free(host);
  ct_model_destroy(m);
  ct_st_set_close(set);
  return st;
}

ct_status ct_hf_import(const char *dir, const char *out_ckpt) {
  ct_config cfg;
  ct_model *m = NULL;
  CT_TRY(ct_hf_load(dir, ct_ops_cpu(), 1, 1, &cfg, &m));
  ct_status st = ct_checkpoint_write_dir(out_ckpt, 0, &cfg, m, NULL);
  ct_model_destroy(m);
  return st;
}

/* ---------------------------------------------------------------- export */

static family export_family(const ct_model_cfg *c, ct_status *st) {
  *st = CT_OK;
  if (!strcmp(c->arch, "gpt2")) return FAM_GPT2;
  if (c->qk_norm && c->attn_bias) {
    *st = ct_set_error(CT_ERR_INPUT, "export-hf: qk_norm together with attn_bias has no"
                       " Transformers equivalent (Qwen3 with attention_bias also biases o_proj)");
    return FAM_COUNT;
  }
  return c->qk_norm ? FAM_QWEN3 : c->attn_bias ? FAM_QWEN2 : FAM_LLAMA;
}

static const char *torch_dtype(ct_st_dtype d) {
  return d == CT_ST_BF16 ? "bfloat16" : d == CT_ST_F16 ? "float16" : "float32";
}

static char *config_json(const ct_model_cfg *c, family fam, ct_st_dtype dtype, double init_std) {
  cJSON *r = cJSON_CreateObject();
  if (!r) return NULL;
  cJSON *archs = cJSON_AddArrayToObject(r, "architectures");
  cJSON_AddItemToArray(archs, cJSON_CreateString(FAMILIES[fam].arch));
  cJSON_AddStringToObject(r, "model_type", FAMILIES[fam].model_type);
  cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
  if (fam == FAM_GPT2) {
    cJSON_AddNumberToObject(r, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(r, "n_head", c->n_head);
    cJSON_AddNumberToObject(r, "n_embd", c->d_model);
    cJSON_AddNumberToObject(r, "n_inner", c->d_ff);
    cJSON_AddNumberToObject(r, "n_positions", c->max_seq_len);
    cJSON_AddStringToObject(r, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(r, "layer_norm_epsilon", c->norm_eps);
    cJSON_AddNumberToObject(r, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(r, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(r, "attn_pdrop", 0.0);
    cJSON_AddBoolToObject(r, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(r, "scale_attn_by_inverse_layer_idx", 0);
    cJSON_AddBoolToObject(r, "reorder_and_upcast_attn", 0);
    cJSON_AddBoolToObject(r, "add_cross_attention", 0);
  } else {
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->n_layer);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->n_head);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->n_kv_head);
    cJSON_AddNumberToObject(r, "hidden_size", c->d_model);
    cJSON_AddNumberToObject(r, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(r, "intermediate_size", c->d_ff);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_seq_len);
    cJSON_AddNumberToObject(r, "rms_norm_eps", c->norm_eps);
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    /* both spellings: transformers < 5 reads rope_theta/rope_scaling, >= 5 rope_parameters */
    cJSON_AddNumberToObject(r, "rope_theta", c->rope_theta);
    cJSON_AddNullToObject(r, "rope_scaling");
    cJSON *rp = cJSON_AddObjectToObject(r, "rope_parameters");
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNumberToObject(rp, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(r, "attention_dropout", 0.0);
    if (fam != FAM_QWEN2) cJSON_AddBoolToObject(r, "attention_bias", 0);
    if (fam == FAM_LLAMA) {
      cJSON_AddBoolToObject(r, "mlp_bias", 0);
      cJSON_AddNumberToObject(r, "pretraining_tp", 1);
    } else {
      cJSON_AddBoolToObject(r, "use_sliding_window", 0);
      cJSON_AddNullToObject(r, "sliding_window");
      cJSON_AddNumberToObject(r, "max_window_layers", c->n_layer);
      cJSON *lt = cJSON_AddArrayToObject(r, "layer_types");
      for (int i = 0; i < c->n_layer; i++) cJSON_AddItemToArray(lt, cJSON_CreateString("full_attention"));
    }
  }
  cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_embeddings);
  cJSON_AddNumberToObject(r, "initializer_range", init_std);
  /* ctrain does not know the special tokens: leave them unset rather than guess */
  cJSON_AddNullToObject(r, "bos_token_id");
  cJSON_AddNullToObject(r, "eos_token_id");
  cJSON_AddNullToObject(r, "pad_token_id");
  cJSON_AddBoolToObject(r, "use_cache", 1);
  cJSON_AddStringToObject(r, "torch_dtype", torch_dtype(dtype)); /* transformers < 5 */
  cJSON_AddStringToObject(r, "dtype", torch_dtype(dtype));       /* transformers >= 5 */
  char *s = cJSON_Print(r);
  cJSON_Delete(r);
  return s;
}

typedef struct export_item { int param, part, row0; } export_item;
typedef struct export_ctx {
  const ct_model *m;
  const float *host;
  const hf_map *maps;     /* (n_params) */
  const export_item *items;
} export_ctx;

static void export_fill(void *user, int i, float *dst) {
  const export_ctx *x = user;
  const export_item *it = &x->items[i];
  const ct_param *p = ct_model_param(x->m, it->param);
  const hf_map *mp = &x->maps[it->param];
  const size_t rows = (size_t)mp->rows[it->part], cols = mp->cols ? (size_t)mp->cols : 1;
  const float *src = x->host + p->offset + (size_t)it->row0 * cols;
  if (mp->transpose) {
    for (size_t r = 0; r < rows; r++)
      for (size_t q = 0; q < cols; q++) dst[q * rows + r] = src[r * cols + q];
  } else {
    memcpy(dst, src, rows * cols * sizeof(float));
  }
}

static ct_status write_text(const char *path, const char *text, size_t n) {
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return ct_set_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  bool ok = fwrite(text, 1, n, f) == n;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return ct_set_error(CT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  }
  return CT_OK;
}

static ct_status copy_tokenizer(const char *src, const char *dir) {
  char dst[4200], a[PATH_MAX], b[PATH_MAX];
  snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
  if (realpath(src, a) && realpath(dst, b) && !strcmp(a, b)) return CT_OK; /* already there */
  if (!ct_file_exists(src)) {
    ct_log_warn("export-hf: the checkpoint's tokenizer %s is gone: %s gets no tokenizer.json", src, dir);
    return CT_OK;
  }
  char *text = NULL;
  size_t n = 0;
  CT_TRY(ct_read_file(src, &text, &n));
  ct_status st = write_text(dst, text, n);
  free(text);
  return st;
}

ct_status ct_hf_save(const ct_config *cfg, ct_model *m, const char *dir, ct_st_dtype dtype) {
  if (dtype != CT_ST_F32 && dtype != CT_ST_BF16 && dtype != CT_ST_F16)
    return ct_set_error(CT_ERR_USAGE, "export-hf: dtype %s: expected F32, BF16 or F16", ct_st_dtype_name(dtype));
  const ct_model_cfg *c = ct_model_config(m);
  ct_status st;
  family fam = export_family(c, &st);
  if (st != CT_OK) return st;
  const int np = ct_model_n_params(m);
  const size_t numel = ct_model_numel(m);
  float *host = ct_malloc(numel * sizeof(float), "export staging");
  hf_map *maps = ct_calloc((size_t)np, sizeof *maps, "export mapping");
  export_item *items = ct_calloc((size_t)np * 3, sizeof *items, "export mapping");
  ct_st_out *outs = ct_calloc((size_t)np * 3, sizeof *outs, "export mapping");
  char *json = NULL;
  if (!host || !maps || !items || !outs) { st = CT_ERR_NOMEM; goto done; }
  ct_model_ops(m)->to_host(host, ct_model_params(m), numel * sizeof(float));
  int n = 0;
  for (int i = 0; i < np; i++) {
    CT_TRY_GOTO(map_param(c, fam == FAM_GPT2 ? "transformer." : "model.", ct_model_param(m, i), &maps[i]), done);
    int row0 = 0;
    for (int k = 0; k < maps[i].n; k++) {
      items[n] = (export_item){i, k, row0};
      row0 += maps[i].rows[k];
      outs[n].name = maps[i].name[k];
      outs[n].dtype = dtype;
      part_shape(&maps[i], k, &outs[n].ndim, outs[n].shape);
      n++;
    }
  }
  CT_TRY_GOTO(ct_mkdirs(dir), done);
  json = config_json(c, fam, dtype, cfg->model.init_std);
  if (!json) { st = ct_set_error(CT_ERR_NOMEM, "export-hf: out of memory for config.json"); goto done; }
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  CT_TRY_GOTO(write_text(path, json, strlen(json)), done);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  static const char *const meta[] = {"format", "pt"}; /* transformers checks this key */
  export_ctx ctx = {m, host, maps, items};
  CT_TRY_GOTO(ct_st_write(path, outs, n, meta, 1, export_fill, &ctx), done);
  if (ends_with(cfg->data.tokenizer, ".json")) st = copy_tokenizer(cfg->data.tokenizer, dir);
done:
  free(json);
  free(outs);
  free(items);
  free(maps);
  free(host);
  return st;
}

ct_status ct_hf_export(const char *ckpt, const char *dir, ct_st_dtype dtype) {
  ct_config cfg;
  char model_file[4200];
  CT_TRY(ct_checkpoint_read_config(ckpt, &cfg, model_file, sizeof model_file));
  ct_model *m = NULL;
  CT_TRY(ct_model_create(&cfg.model, ct_ops_cpu(), 1, 1, &m));
  ct_status st = ct_checkpoint_load_params(model_file, m);
  if (st == CT_OK) st = ct_hf_save(&cfg, m, dir, dtype);
  ct_model_destroy(m);
  return st;
}

/* ---------------------------------------------------------------- commands */

static const char *IMPORT_USAGE =
    "usage: ctrain import-hf DIR OUT_CKPT\n"
    "  DIR       a Hugging Face model directory: config.json and model.safetensors (or\n"
    "            model.safetensors.index.json with its shards); tokenizer.json if present\n"
    "  OUT_CKPT  the ctrain checkpoint directory to write (weights only)\n"
    "  architectures: " SUPPORTED "\n";

static const char *EXPORT_USAGE =
    "usage: ctrain export-hf CKPT DIR [--dtype f32|bf16|f16]\n"
    "  CKPT      a checkpoint step directory, <out_dir>/ckpt/latest, or <out_dir>\n"
    "  DIR       output: config.json, model.safetensors (and tokenizer.json if the model has one)\n"
    "  --dtype   stored precision (default f32; bf16/f16 round to nearest even)\n";

static bool is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

ct_status ct_cmd_import_hf(int argc, char **argv) {
  if (argc >= 1 && is_help(argv[0])) { fputs(IMPORT_USAGE, stdout); return CT_OK; }
  for (int i = 0; i < argc; i++)
    if (argv[i][0] == '-')
      return ct_set_error(CT_ERR_USAGE, "import-hf: unknown argument %s\n%s", argv[i], IMPORT_USAGE);
  if (argc != 2)
    return ct_set_error(CT_ERR_USAGE, "import-hf: expected DIR and OUT_CKPT (got %d arguments)\n%s",
                        argc, IMPORT_USAGE);
  const double t0 = ct_now();
  ct_config cfg;
  ct_model *m = NULL;
  CT_TRY(ct_hf_load(argv[0], ct_ops_cpu(), 1, 1, &cfg, &m));
  ct_status st = ct_checkpoint_write_dir(argv[1], 0, &cfg, m, NULL);
  if (st == CT_OK)
    ct_log_info("import-hf: %s -> %s: arch %s, %d layers, d_model %d, vocab %d (padded to %d),"
                " %zu parameters, tokenizer %s (%.2f s)", argv[0], argv[1], cfg.model.arch,
                cfg.model.n_layer, cfg.model.d_model, cfg.model.vocab_size,
                ct_model_padded_vocab(&cfg.model), ct_model_count_params(m), cfg.data.tokenizer,
                ct_now() - t0);
  ct_model_destroy(m);
  return st;
}

ct_status ct_cmd_export_hf(int argc, char **argv) {
  if (argc >= 1 && is_help(argv[0])) { fputs(EXPORT_USAGE, stdout); return CT_OK; }
  const char *pos[2] = {NULL, NULL}, *dt = "f32";
  int npos = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--dtype")) {
      if (i + 1 >= argc) return ct_set_error(CT_ERR_USAGE, "export-hf: --dtype needs a value\n%s", EXPORT_USAGE);
      dt = argv[++i];
    } else if (!strncmp(a, "--dtype=", 8)) {
      dt = a + 8;
    } else if (a[0] == '-') {
      return ct_set_error(CT_ERR_USAGE, "export-hf: unknown argument %s\n%s", a, EXPORT_USAGE);
    } else if (npos < 2) {
      pos[npos++] = a;
    } else {
      return ct_set_error(CT_ERR_USAGE, "export-hf: unexpected argument %s\n%s", a, EXPORT_USAGE);
    }
  }
  if (npos != 2)
    return ct_set_error(CT_ERR_USAGE, "export-hf: expected CKPT and DIR\n%s", EXPORT_USAGE);
  ct_st_dtype dtype;
  if (!strcmp(dt, "f32") || !strcmp(dt, "float32")) dtype = CT_ST_F32;
  else if (!strcmp(dt, "bf16") || !strcmp(dt, "bfloat16")) dtype = CT_ST_BF16;
  else if (!strcmp(dt, "f16") || !strcmp(dt, "float16")) dtype = CT_ST_F16;
  else return ct_set_error(CT_ERR_USAGE, "export-hf: --dtype %s: expected f32, bf16 or f16", dt);
  const double t0 = ct_now();
  CT_TRY(ct_hf_export(pos[0], pos[1], dtype));
  ct_log_info("export-hf: %s -> %s (%s, %.2f s)", pos[0], pos[1], ct_st_dtype_name(dtype), ct_now() - t0);
  return CT_OK;
}
