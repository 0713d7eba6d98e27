/* trainer/model.c — the decoder over the op table: parameter tables, forward, backward.
 *
 * gpt2 block:  x -> LN -> qkv (+b) -> attention -> proj (+b) -> +x -> LN -> fc (+b) -> GELU
 *              -> proj (+b) -> +    with learned positions and a tied head.
 * llama block: x -> RMSNorm -> qkv [+b] -> [q/k RMSNorm] -> RoPE -> GQA attention -> o_proj
 *              -> +x -> RMSNorm -> gate_up -> SwiGLU -> down -> +    (Llama / Qwen2 / Qwen3).
 */
#include "trainer/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

/* Parameter roles shared by both architectures; the forward code addresses parameters by role. */
typedef enum {
  P_WTE, P_WPE, P_LNF_W, P_LNF_B, P_LM_HEAD,
  P_LN1_W, P_LN1_B, P_QKV_W, P_QKV_B, P_QNORM, P_KNORM, P_ATTO_W, P_ATTO_B,
  P_LN2_W, P_LN2_B, P_FC_W, P_FC_B, P_PROJ_W, P_PROJ_B,
  P_COUNT
} role;
#define P_FIRST_LAYER P_LN1_W

/* The one list per architecture: X(role, name, rows, cols (0 = 1-D), init, present).
 * Names follow the Hugging Face checkpoints (minus the "transformer." / "model." prefix);
 * fused tensors (c_attn, qkv_proj, gate_up_proj) are concatenations along rows. */
#define GPT2_PRE(X)                                         \
  X(P_WTE, "wte", Vp, C, CT_INIT_NORMAL, 1)                 \
  X(P_WPE, "wpe", maxT, C, CT_INIT_NORMAL, 1)
#define GPT2_LAYER(X)                                                   \
  X(P_LN1_W, "ln_1.weight", C, 0, CT_INIT_ONE, 1)                       \
  X(P_LN1_B, "ln_1.bias", C, 0, CT_INIT_ZERO, 1)                        \
  X(P_QKV_W, "attn.c_attn.weight", Wqkv, C, CT_INIT_NORMAL, 1)          \
  X(P_QKV_B, "attn.c_attn.bias", Wqkv, 0, CT_INIT_ZERO, 1)              \
  X(P_ATTO_W, "attn.c_proj.weight", C, Hhd, CT_INIT_NORMAL_RESID, 1)    \
  X(P_ATTO_B, "attn.c_proj.bias", C, 0, CT_INIT_ZERO, 1)                \
  X(P_LN2_W, "ln_2.weight", C, 0, CT_INIT_ONE, 1)                       \
  X(P_LN2_B, "ln_2.bias", C, 0, CT_INIT_ZERO, 1)                        \
  X(P_FC_W, "mlp.c_fc.weight", F, C, CT_INIT_NORMAL, 1)                 \
  X(P_FC_B, "mlp.c_fc.bias", F, 0, CT_INIT_ZERO, 1)                     \
  X(P_PROJ_W, "mlp.c_proj.weight", C, F, CT_INIT_NORMAL_RESID, 1)       \
  X(P_PROJ_B, "mlp.c_proj.bias", C, 0, CT_INIT_ZERO, 1)
#define GPT2_POST(X)                                        \
  X(P_LNF_W, "ln_f.weight", C, 0, CT_INIT_ONE, 1)           \
  X(P_LNF_B, "ln_f.bias", C, 0, CT_INIT_ZERO, 1)            \
  X(P_LM_HEAD, "lm_head", Vp, C, CT_INIT_NORMAL, !tie)

#define LLAMA_PRE(X) X(P_WTE, "embed_tokens", Vp, C, CT_INIT_NORMAL, 1)
#define LLAMA_LAYER(X)                                                           \
  X(P_LN1_W, "input_layernorm.weight", C, 0, CT_INIT_ONE, 1)                     \
  X(P_QKV_W, "self_attn.qkv_proj.weight", Wqkv, C, CT_INIT_NORMAL, 1)            \
  X(P_QKV_B, "self_attn.qkv_proj.bias", Wqkv, 0, CT_INIT_ZERO, attn_bias)        \
  X(P_QNORM, "self_attn.q_norm.weight", hd, 0, CT_INIT_ONE, qk_norm)             \
  X(P_KNORM, "self_attn.k_norm.weight", hd, 0, CT_INIT_ONE, qk_norm)             \
  X(P_ATTO_W, "self_attn.o_proj.weight", C, Hhd, CT_INIT_NORMAL_RESID, 1)        \
  X(P_LN2_W, "post_attention_layernorm.weight", C, 0, CT_INIT_ONE, 1)            \
  X(P_FC_W, "mlp.gate_up_proj.weight", 2 * F, C, CT_INIT_NORMAL, 1)              \
  X(P_PROJ_W, "mlp.down_proj.weight", C, F, CT_INIT_NORMAL_RESID, 1)
#define LLAMA_POST(X)                                       \
  X(P_LNF_W, "norm.weight", C, 0, CT_INIT_ONE, 1)           \
  X(P_LM_HEAD, "lm_head", Vp, C, CT_INIT_NORMAL, !tie)

#define ALIGN_FLOATS 128 /* parameters start 512-byte aligned (256 bytes in a 16-bit working copy):
                          * cuBLASLt picks its fastest kernels only for 256-byte-aligned operands */
#define NONE ((size_t)-1)

/* Activation offsets (floats into `acts`) for one layer. */
typedef struct layer_acts {
  size_t ln1, ln1_mean, ln1_rstd;   /* (N,C) (N) (N) */
  size_t qkv_raw;                   /* (N,W) pre-qk_norm projection (qk_norm only) */
  size_t qkv;                       /* (N,W) q,k normed + roped; v */
  size_t qn_rstd, kn_rstd;          /* (N*H) (N*KV) */
  size_t att;                       /* attention saved state */
  size_t atty;                      /* (N,H*hd) */
  size_t res2;                      /* (N,C) x + attention */
  size_t ln2, ln2_mean, ln2_rstd;   /* (N,C) (N) (N) */
  size_t fch;                       /* (N,Fw) fc output (gpt2: F, llama: 2F) */
  size_t act;                       /* (N,F) after GELU / SwiGLU */
  size_t out;                       /* (N,C) block output */
} layer_acts;

struct ct_model {
  ct_model_cfg cfg;
  const ct_ops *ops;
  bool gpt2;
  int C, H, KV, hd, F, Vp, W;       /* W = qkv row width (H + 2KV) * hd */
  int max_B, max_T;

  ct_param *params;                  /* table */
  int n_params;
  size_t (*off)[P_COUNT];            /* per layer (L entries) + one global row at index L */
  size_t numel;
  float *w;                          /* (numel) fp32 master parameters */
  float *g;                          /* (numel) fp32 gradients */
  char *wk;                          /* (numel) working-dtype weights; == w for fp32 tables */
  bool wk_stale;                     /* master changed since the last cast (see ct_model_params) */
  size_t ab;                         /* bytes per working-dtype element (ops->act_bytes) */

  char *acts;                        /* activation arena (backend memory); offsets in bytes */
  layer_acts *la;                    /* (L) */
  size_t emb, lnf, lnf_mean, lnf_rstd, logits, losses;
  size_t d_res, d_ln, d_qkv, d_qkv_raw, d_atty, d_fch, d_act;
  int32_t *tok, *tgt;                /* (max_B*max_T) backend memory */
  float *host_losses;                /* (max_B*max_T) */

  int B, T;                          /* shape of the last forward */
  bool have_grad;                    /* last forward prepared backward */
  bool head_done;                    /* a chunked forward left d(final norm output) in d_ln and
                                      * added the head's weight gradient already */

  /* ct_model_train_micro's recorded forward + backward (backends with graph capture) */
  bool graphs;
  void *graph;
  int graph_B, graph_T, graph_warm;
  float graph_scale;

  /* Units (what ZeRO shards and ZeRO-3 gathers): 0 = embeddings (wte, wpe), 1..L = layers,
   * L+1 = final norm (+ untied head). Weights and gradients of unit u are addressed through
   * uw[u] / ug[u] (default: into wk / g at uoff[u]); parallel/zero.c repoints them. */
  int n_units;                       /* L + 2 */
  size_t *uoff, *un;                 /* (n_units) offset and floats (with padding) of a unit */
  char **uw;                         /* (n_units) working-dtype base of each unit */
  float **ug;                        /* (n_units) fp32 gradient base of each unit */
  ct_model_hooks hooks;
  float *embed_grad;                 /* (Vp, C) where the lookup's backward adds, or NULL: into
                                      * wte's gradient (ct_model_set_embed_grad) */

  /* tensor parallelism (parallel/tp.c): H, KV, F, W, Vp above are this rank's slice */
  int tp, tpr;                       /* degree (1 = none) and rank in the tp group */
  ct_model_tp tpx;
  int32_t *host_tok;                 /* (max_B*max_T) tokens mapped to this rank's wte rows */
  size_t arena_bytes;                /* activation arena size (trainer/memory.c) */
};

/* ---- parameter table ---- */

static ct_status add_param(ct_model *m, int *cap, int layer, role r, const char *name, int rows,
                           int cols, ct_init init) {
  if (m->n_params == *cap) {
    *cap = *cap ? *cap * 2 : 64;
    ct_param *grown = realloc(m->params, sizeof(ct_param) * (size_t)*cap);
    if (!grown) return ct_set_error(CT_ERR_NOMEM, "out of memory for the parameter table");
    m->params = grown;
  }
  ct_param *p = &m->params[m->n_params++];
  memset(p, 0, sizeof *p);
  if (layer >= 0) snprintf(p->name, sizeof p->name, "%s%d.%s", m->gpt2 ? "h." : "layers.", layer, name);
  else snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = cols ? 2 : 1;
  p->shape[0] = rows;
  p->shape[1] = cols;
  p->numel = (size_t)rows * (size_t)(cols ? cols : 1);
  p->offset = m->numel;
  p->layer = layer;
  p->init = init;
  p->decay = p->ndim == 2;
  switch (r) {
    case P_WTE: case P_LM_HEAD: p->tp_split = CT_TP_ROWS; break;
    case P_QKV_W: case P_QKV_B: p->tp_split = CT_TP_QKV; break;
    case P_FC_W: p->tp_split = m->gpt2 ? CT_TP_ROWS : CT_TP_GATE_UP; break;
    case P_FC_B: p->tp_split = CT_TP_ROWS; break;
    case P_ATTO_W: case P_PROJ_W: p->tp_split = CT_TP_COLS; break;
    case P_QNORM: case P_KNORM: p->tp_split = CT_TP_PARTIAL; break;
    default: p->tp_split = CT_TP_REPLICATED;
  }
  m->numel += (p->numel + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
  /* vocab-parallel embedding: tokens of other ranks' rows read one zero row after wte */
  if (r == P_WTE && m->tp > 1) m->numel += ((size_t)cols + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
  m->off[layer >= 0 ? layer : m->cfg.n_layer][r] = p->offset;
  return CT_OK;
}

static ct_status build_table(ct_model *m) {
  const ct_model_cfg *c = &m->cfg;
  const int C = m->C, Vp = m->Vp, maxT = c->max_seq_len, Wqkv = m->W, Hhd = m->H * m->hd;
  const int F = m->F, hd = m->hd;
  const bool tie = c->tie_embeddings, attn_bias = c->attn_bias, qk_norm = c->qk_norm;
  (void)hd; (void)attn_bias; (void)qk_norm; (void)maxT;
  int cap = 0, layer = -1;
  for (int l = 0; l <= c->n_layer; l++)
    for (int r = 0; r < P_COUNT; r++) m->off[l][r] = NONE;
#define X(r, name, rows, cols, init, present) \
  if (present) CT_TRY(add_param(m, &cap, layer, r, name, rows, cols, init));
  /* ZeRO shards every unit into equal slices: each unit is padded to numel_multiple */
  const size_t k = (size_t)(c->numel_multiple > 0 ? c->numel_multiple : 1);
#define END_UNIT(u) \
  do { m->numel = (m->numel + k - 1) / k * k; m->un[u] = m->numel - m->uoff[u]; \
       if ((u) + 1 < m->n_units) m->uoff[(u) + 1] = m->numel; } while (0)
  m->uoff[0] = 0;
  if (m->gpt2) {
    GPT2_PRE(X)
    END_UNIT(0);
    for (layer = 0; layer < c->n_layer; layer++) { GPT2_LAYER(X) END_UNIT(layer + 1); }
    layer = -1;
    GPT2_POST(X)
  } else {
    LLAMA_PRE(X)
    END_UNIT(0);
    for (layer = 0; layer < c->n_layer; layer++) { LLAMA_LAYER(X) END_UNIT(layer + 1); }
    layer = -1;
    LLAMA_POST(X)
  }
  END_UNIT(c->n_layer + 1);
#undef END_UNIT
#undef X
  return CT_OK;
}

/* ---- creation ---- */

/* Reserves `count` elements of `bytes` each in the arena; returns the byte offset (256-aligned). */
static size_t take(size_t *top, size_t count, size_t bytes) {
  size_t at = *top;
  *top += (count * bytes + 255) / 256 * 256; /* 256-byte aligned, as cudaMalloc, for cuBLASLt */
  return at;
}

ct_status ct_model_create(const ct_model_cfg *cfg, const ct_ops *ops, int max_B, int max_T,
                          ct_model **out) {
  ct_status st = CT_OK;
  ct_model *m = ct_calloc(1, sizeof *m, "model");
  if (!m) return CT_ERR_NOMEM;
  m->cfg = *cfg;
  m->ops = ops;
  m->gpt2 = !strcmp(cfg->arch, "gpt2");
  m->C = cfg->d_model;
  m->H = cfg->n_head;
  m->KV = cfg->n_kv_head ? cfg->n_kv_head : cfg->n_head;
  m->hd = cfg->head_dim ? cfg->head_dim : cfg->d_model / cfg->n_head;
  m->F = cfg->d_ff;
  m->Vp = ct_model_padded_vocab(cfg);
  m->tp = cfg->tp_size > 1 ? cfg->tp_size : 1;
  m->tpr = m->tp > 1 ? cfg->tp_rank : 0;
  if (m->tp > 1) { /* this rank's slice: heads, MLP width and vocabulary rows */
    const int T = m->tp;
    if (m->H % T || m->KV % T || m->F % T || m->Vp % T) {
      st = ct_set_error(CT_ERR_CONFIG, "parallel.tensor = %d must divide model.n_head (%d),"
                        " model.n_kv_head (%d), model.d_ff (%d) and the padded vocabulary (%d)",
                        T, m->H, m->KV, m->F, m->Vp);
      goto fail;
    }
    m->H /= T;
    m->KV /= T;
    m->F /= T;
    m->Vp /= T;
  }
  m->W = (m->H + 2 * m->KV) * m->hd;
  m->max_B = max_B;
  m->max_T = max_T;
  if (max_T > cfg->max_seq_len) {
    st = ct_set_error(CT_ERR_CONFIG, "sequence length %d exceeds model.max_seq_len = %d", max_T,
                      cfg->max_seq_len);
    goto fail;
  }
  const int L = cfg->n_layer;
  m->off = ct_calloc((size_t)L + 1, sizeof *m->off, "parameter offsets");
  m->la = ct_calloc((size_t)L, sizeof *m->la, "activation offsets");
  m->n_units = L + 2;
  m->uoff = ct_calloc((size_t)m->n_units, sizeof *m->uoff, "units");
  m->un = ct_calloc((size_t)m->n_units, sizeof *m->un, "units");
  m->uw = ct_calloc((size_t)m->n_units, sizeof *m->uw, "units");
  m->ug = ct_calloc((size_t)m->n_units, sizeof *m->ug, "units");
  if (!m->off || !m->la || !m->uoff || !m->un || !m->uw || !m->ug) { st = CT_ERR_NOMEM; goto fail; }
  CT_TRY_GOTO(build_table(m), fail);

  m->ab = (size_t)ops->act_bytes;
  m->w = ops->alloc(m->numel * sizeof(float));
  m->g = cfg->no_grads ? NULL : ops->alloc(m->numel * sizeof(float));
  /* fp32 tables compute on the master weights; others keep a working copy (cast lazily) */
  m->wk = m->ab == sizeof(float) ? (char *)m->w : ops->alloc(m->numel * m->ab);
  if (!m->w || (!m->g && !cfg->no_grads) || !m->wk) {
    st = ct_set_error(CT_ERR_NOMEM, "out of memory for %zu parameters (+ gradients) on %s",
                      m->numel, ops->name);
    goto fail;
  }
  for (int u = 0; u < m->n_units; u++) {
    m->uw[u] = m->wk + m->uoff[u] * m->ab;
    m->ug[u] = m->g ? m->g + m->uoff[u] : NULL;
  }

  /* Activation arena: everything a forward keeps for backward, plus backward scratch. */
  const size_t N = (size_t)max_B * max_T, C = m->C, W = m->W, Hhd = (size_t)m->H * m->hd;
  const size_t Fw = m->gpt2 ? (size_t)m->F : 2 * (size_t)m->F;
  const size_t att = ops->attention_state_floats(max_B, max_T, m->H, m->KV, m->hd);
  const size_t ab = m->ab;
  size_t top = 0;
  m->emb = take(&top, N * C, ab);
  for (int l = 0; l < L; l++) {
    layer_acts *a = &m->la[l];
    a->ln1 = take(&top, N * C, ab);
    a->ln1_mean = take(&top, N, 4);
    a->ln1_rstd = take(&top, N, 4);
    a->qkv_raw = cfg->qk_norm ? take(&top, N * W, ab) : NONE;
    a->qkv = take(&top, N * W, ab);
    a->qn_rstd = take(&top, N * m->H, 4);
    a->kn_rstd = take(&top, N * m->KV, 4);
    a->att = take(&top, att, 4);
    a->atty = take(&top, N * Hhd, ab);
    a->res2 = take(&top, N * C, ab);
    a->ln2 = take(&top, N * C, ab);
    a->ln2_mean = take(&top, N, 4);
    a->ln2_rstd = take(&top, N, 4);
    a->fch = take(&top, N * Fw, ab);
    a->act = take(&top, N * m->F, ab);
    a->out = take(&top, N * C, ab);
  }
  m->lnf = take(&top, N * C, ab);
  m->lnf_mean = take(&top, N, 4);
  m->lnf_rstd = take(&top, N, 4);
  /* logits for one head chunk when the head runs chunked, else for every row */
  const size_t lrows = cfg->head_chunk > 0 && (size_t)cfg->head_chunk < N ? (size_t)cfg->head_chunk : N;
  m->logits = take(&top, lrows * m->Vp, ab);
  m->losses = take(&top, N, 4);
  m->d_res = take(&top, N * C, ab);
  m->d_ln = take(&top, N * C, ab);
  m->d_qkv = take(&top, N * W, ab);
  m->d_qkv_raw = cfg->qk_norm ? take(&top, N * W, ab) : NONE;
  m->d_atty = take(&top, N * Hhd, ab);
  m->d_fch = take(&top, N * Fw, ab);
  m->d_act = take(&top, N * m->F, ab);
  m->arena_bytes = top;
  m->acts = ops->alloc(top);
  m->tok = ops->alloc(N * sizeof(int32_t));
  m->tgt = ops->alloc(N * sizeof(int32_t));
  m->host_losses = ct_malloc(N * sizeof(float), "losses");
  m->host_tok = ct_malloc(N * sizeof(int32_t), "tokens");
  if (!m->acts || !m->tok || !m->tgt || !m->host_losses || !m->host_tok) {
    st = ct_set_error(CT_ERR_NOMEM, "out of memory for activations (%.1f MiB for %d x %d tokens)"
                      " on %s", top / 1048576.0, max_B, max_T, ops->name);
    goto fail;
  }
  *out = m;
  return CT_OK;
fail:
  ct_model_destroy(m);
  return st;
}

void ct_model_destroy(ct_model *m) {
  if (!m) return;
  if (m->ops) {
    if (m->graph) m->ops->graph_destroy(m->graph);
    if (m->wk && m->wk != (char *)m->w) m->ops->free(m->wk);
    if (m->w) m->ops->free(m->w);
    if (m->g) m->ops->free(m->g);
    if (m->acts) m->ops->free(m->acts);
    if (m->tok) m->ops->free(m->tok);
    if (m->tgt) m->ops->free(m->tgt);
  }
  free(m->host_losses);
  free(m->host_tok);
  free(m->params);
  free(m->off);
  free(m->la);
  free(m->uoff);
  free(m->un);
  free(m->uw);
  free(m->ug);
  free(m);
}

void ct_model_init_weights(ct_model *m, uint64_t seed) {
  const double std = m->cfg.init_std, resid = std / sqrt(2.0 * m->cfg.n_layer);
  /* the CPU table's weights are host memory: drawn in place (no second copy of the model,
   * which tensor parallelism's full host model on every rank of an 8B run cannot afford) */
  const bool direct = m->ops == ct_ops_cpu();
  float *host = direct ? m->w : malloc(m->numel * sizeof(float));
  if (!host) return;
  memset(host, 0, m->numel * sizeof(float));
  for (int i = 0; i < m->n_params; i++) {
    const ct_param *p = &m->params[i];
    float *w = host + p->offset;
    /* one RNG stream per parameter (seeded by index): adding a parameter does not reshuffle
     * the others, and the init does not depend on the parallel layout */
    /* element j draws counters 2j and 2j+1 of the stream (ct_rng_normal takes two), so the
     * elements can be drawn in parallel with identical results */
    const uint64_t key = ct_mix64(seed) ^ ct_mix64(0x1000 + (uint64_t)i);
    size_t n = p->numel;
    /* embedding rows past the real vocabulary stay zero */
    if (!strcmp(p->name, "wte") || !strcmp(p->name, "embed_tokens") || !strcmp(p->name, "lm_head"))
      n = (size_t)m->cfg.vocab_size * (size_t)p->shape[1];
    switch (p->init) {
      case CT_INIT_ZERO: break;
      case CT_INIT_ONE: for (size_t j = 0; j < n; j++) w[j] = 1.0f; break;
      case CT_INIT_NORMAL:
      case CT_INIT_NORMAL_RESID: {
        const float sd = (float)(p->init == CT_INIT_NORMAL ? std : resid);
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t j = 0; j < n; j++) {
          ct_rng rng = {key, 2 * (uint64_t)j};
          w[j] = sd * ct_rng_normal(&rng);
        }
        break;
      }
    }
  }
  if (!direct) {
    m->ops->to_device(m->w, host, m->numel * sizeof(float));
    free(host);
  }
  m->wk_stale = true;
}

int ct_model_n_params(const ct_model *m) { return m->n_params; }
const ct_param *ct_model_param(const ct_model *m, int i) { return &m->params[i]; }
const ct_param *ct_model_find_param(const ct_model *m, const char *name) {
  for (int i = 0; i < m->n_params; i++)
    if (!strcmp(m->params[i].name, name)) return &m->params[i];
  return NULL;
}
size_t ct_model_numel(const ct_model *m) { return m->numel; }
/* Whoever asks for the master weights may change them (optimizer, checkpoint and HF loading,
 * broadcast): the working copy is re-cast before the next forward. */
float *ct_model_params(ct_model *m) {
  m->wk_stale = true;
  return m->w;
}

static void refresh_working(ct_model *m) {
  /* (no full master under ZeRO-3: zero.c casts and gathers the working weights itself) */
  if (m->wk_stale && m->w && m->wk && m->wk != (char *)m->w) m->ops->cast_params(m->wk, m->w, m->numel);
  m->wk_stale = false;
}

void ct_model_logits_to_host(const ct_model *m, size_t first_row, size_t rows, float *dst) {
  m->ops->to_host_f32(dst, m->acts + m->logits + first_row * m->Vp * m->ab, rows * m->Vp);
}
float *ct_model_grads(ct_model *m) { return m->g; }
const ct_model_cfg *ct_model_config(const ct_model *m) { return &m->cfg; }
const ct_ops *ct_model_ops(const ct_model *m) { return m->ops; }
int ct_model_max_B(const ct_model *m) { return m->max_B; }
int ct_model_max_T(const ct_model *m) { return m->max_T; }
/* P_WTE opens both architectures' lists */
const ct_param *ct_model_embedding(const ct_model *m) { return &m->params[0]; }
const float *ct_model_logits(const ct_model *m) { return (const float *)(m->acts + m->logits); }

size_t ct_model_count_params(const ct_model *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_params; i++) {
    const ct_param *p = &m->params[i];
    if (!strcmp(p->name, "wte") || !strcmp(p->name, "embed_tokens") || !strcmp(p->name, "lm_head"))
      n += (size_t)m->cfg.vocab_size * (size_t)p->shape[1];
    else
      n += p->numel;
  }
  return n;
}

double ct_model_flops_per_token(const ct_model *m, int T) {
  /* 6 * matmul parameters (embedding lookups are not matmuls; the head is) + attention
   * (QK^T and AV: 2 * 2 * T * H * hd forward per layer per token, x3 with backward, halved by
   * causality) */
  double n = 0;
  for (int i = 0; i < m->n_params; i++) {
    const ct_param *p = &m->params[i];
    if (p->ndim == 2 && strcmp(p->name, "wpe")) n += (double)p->numel;
  }
  if (m->cfg.tie_embeddings) n += 0; /* wte counted once: it is the head */
  double attn = 6.0 * m->cfg.n_layer * (double)T * m->H * m->hd;
  return 6.0 * n + attn;
}

/* ---- forward / backward ---- */

/* Pointers: working-dtype weights and activations are char * (element size m->ab); fp32
 * buffers (gradients, norm statistics, attention state, losses) are float *. */
/* unit of a parameter: layer l -> l + 1; globals (row L) -> 0 (embeddings) or L + 1 */
#define UNIT(l, r) ((l) < m->cfg.n_layer ? (l) + 1 : ((r) == P_WTE || (r) == P_WPE) ? 0 : (l) + 1)
#define PW(l, r) (m->uw[UNIT(l, r)] + (m->off[l][r] - m->uoff[UNIT(l, r)]) * m->ab) /* weight */
#define PWO(l, r) (m->off[l][r] == NONE ? NULL : PW(l, r))
#define PG(l, r) (m->off[l][r] == NONE ? NULL : m->ug[UNIT(l, r)] + (m->off[l][r] - m->uoff[UNIT(l, r)]))
/* tensor parallelism: row-parallel biases are added on tp rank 0 only (before the all-reduce) */
#define PWB(l, r) (m->tpr ? NULL : PWO(l, r))
#define TP_AR(buf, n) \
  do { if (m->tp > 1) CT_TRY(m->tpx.all_reduce(m->tpx.ctx, (buf), (n), false)); } while (0)
/* optional per-unit hooks (ZeRO-2/3, overlapped DDP): a failing hook ends the pass */
#define HOOK(fn, u) \
  do { if (m->hooks.fn) CT_TRY(m->hooks.fn(m->hooks.ctx, (u))); } while (0)
#define A(x) (m->acts + (x))                                    /* working-dtype activation */
#define AF(x) ((float *)(m->acts + (x)))                        /* fp32 buffer */
#define EL(p, n) ((char *)(p) + (size_t)(n) * m->ab)             /* element n of a working buffer */

static void norm_fwd(ct_model *m, void *out, float *mean, float *rstd, const void *inp,
                     const void *w, const void *b, int N) {
  if (m->gpt2) m->ops->layernorm_fwd(out, mean, rstd, inp, w, b, N, m->C, (float)m->cfg.norm_eps);
  else m->ops->rmsnorm_fwd(out, rstd, inp, w, N, m->C, N, 0, (float)m->cfg.norm_eps);
}

static void norm_bwd(ct_model *m, void *dinp, float *dw, float *db, const void *dout,
                     const void *inp, const void *w, const float *mean, const float *rstd, int N) {
  if (m->gpt2) m->ops->layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, m->C);
  else m->ops->rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, N, m->C, N, 0);
}

/* qkv projection (+ qk_norm) + RoPE for n rows at positions pos0 + (row % T). */
static void qkv_fwd(ct_model *m, layer_acts *a, int l, const void *ln, int B, int T, int pos0) {
  const ct_ops *o = m->ops;
  const int N = B * T, C = m->C, H = m->H, KV = m->KV, hd = m->hd, W = m->W;
  const float eps = (float)m->cfg.norm_eps;
  char *qkv = A(a->qkv);
  if (m->cfg.qk_norm) {
    char *raw = A(a->qkv_raw);
    o->matmul_fwd(raw, ln, PW(l, P_QKV_W), PWO(l, P_QKV_B), N, C, W);
    const size_t row = (size_t)W * m->ab, v0 = (size_t)(H + KV) * hd;
    o->copy2d(EL(qkv, v0), row, EL(raw, v0), row, (size_t)KV * hd * m->ab, (size_t)N);
    o->rmsnorm_fwd(qkv, AF(a->qn_rstd), raw, PW(l, P_QNORM), N * H, hd, H, W, eps);
    o->rmsnorm_fwd(EL(qkv, (size_t)H * hd), AF(a->kn_rstd), EL(raw, (size_t)H * hd),
                   PW(l, P_KNORM), N * KV, hd, KV, W, eps);
  } else {
    o->matmul_fwd(qkv, ln, PW(l, P_QKV_W), PWO(l, P_QKV_B), N, C, W);
  }
  if (!m->gpt2) o->rope_fwd(qkv, B, T, H, KV, hd, pos0, (float)m->cfg.rope_theta);
}

/* MLP branch: out = proj(act(fc(ln2))) (bias where the arch has one). */
static void mlp_fwd(ct_model *m, layer_acts *a, int l, void *out, int N) {
  const ct_ops *o = m->ops;
  const int C = m->C, F = m->F;
  if (m->gpt2) {
    o->matmul_gelu_fwd(A(a->act), A(a->fch), A(a->ln2), PW(l, P_FC_W), PWO(l, P_FC_B), N, C, F);
  } else {
    o->matmul_fwd(A(a->fch), A(a->ln2), PW(l, P_FC_W), NULL, N, C, 2 * F);
    o->swiglu_fwd(A(a->act), A(a->fch), N, F);
  }
  o->matmul_fwd(out, A(a->act), PW(l, P_PROJ_W), PWB(l, P_PROJ_B), N, F, C);
}

/* Checks a batch and copies it to the device (targets may be NULL). */
static ct_status load_batch(ct_model *m, const int32_t *inputs, const int32_t *targets, int B,
                            int T) {
  if (B > m->max_B || T > m->max_T || B <= 0 || T <= 0)
    return ct_set_error(CT_ERR_RUNTIME, "forward shape (%d, %d) outside the allocated (%d, %d)", B,
                        T, m->max_B, m->max_T);
  const int N = B * T;
  for (int i = 0; i < N; i++)
    if (inputs[i] < 0 || inputs[i] >= m->cfg.vocab_size)
      return ct_set_error(CT_ERR_INPUT, "input token %d at position %d is outside the vocabulary"
                          " [0, %d)", inputs[i], i, m->cfg.vocab_size);
  for (int i = 0; targets && i < N; i++)
    if (targets[i] >= m->cfg.vocab_size)
      return ct_set_error(CT_ERR_INPUT, "target token %d at position %d is outside the vocabulary"
                          " [0, %d)", targets[i], i, m->cfg.vocab_size);
  m->B = B;
  m->T = T;
  m->have_grad = false;
  if (m->tp > 1) { /* vocab-parallel embedding: other ranks' tokens read the zero row */
    if (!m->tpx.all_reduce) return ct_set_error(CT_ERR_USAGE, "tensor-parallel model without a group");
    const int v0 = m->tpr * m->Vp;
    for (int i = 0; i < N; i++)
      m->host_tok[i] = inputs[i] >= v0 && inputs[i] < v0 + m->Vp ? inputs[i] - v0 : m->Vp;
  }
  m->ops->to_device(m->tok, m->tp > 1 ? m->host_tok : inputs, (size_t)N * sizeof(int32_t));
  if (targets && m->tp == 1) m->ops->to_device(m->tgt, targets, (size_t)N * sizeof(int32_t));
  return CT_OK;
}

/* Mean loss over the targets that count (>= 0), from the per-token losses (on the device, or
 * already on the host after a vocab-parallel cross-entropy). */
static void read_loss(ct_model *m, const int32_t *targets, float *mean_loss) {
  const int N = m->B * m->T;
  if (m->tp == 1) m->ops->to_host(m->host_losses, AF(m->losses), (size_t)N * sizeof(float));
  double sum = 0;
  int counted = 0;
  for (int i = 0; i < N; i++)
    if (targets[i] >= 0) { sum += m->host_losses[i]; counted++; }
  if (mean_loss) *mean_loss = counted ? (float)(sum / counted) : 0.0f;
}

/* The forward on the device for the loaded batch (m->B, m->T): only device work, nothing that
 * waits for the host, so it can be recorded into a graph. */
/* Hooks (ZeRO-3 gathers) and tensor-parallel all-reduces are host calls: graphs are only
 * recorded without them (ct_model_train_micro). targets: host copy, read by the vocab-parallel
 * cross-entropy only. */
static ct_status forward_device(ct_model *m, const int32_t *targets, float grad_scale) {
  const ct_ops *o = m->ops;
  const int B = m->B, T = m->T;
  const int L = m->cfg.n_layer, N = B * T, C = m->C, H = m->H, KV = m->KV, hd = m->hd;
  const int G = L; /* G: row of global parameters in m->off */
  HOOK(pre_forward, 0);
  o->embed_fwd(A(m->emb), m->tok, PW(G, P_WTE), PWB(G, P_WPE), B, T, C);
  TP_AR(A(m->emb), (size_t)N * C);

  /* each residual add is fused with the norm that reads its result: the block's second norm,
   * then the next block's first norm (the final norm after the last block) */
  const char *x = A(m->emb);
  const float eps = (float)m->cfg.norm_eps;
  const int rms = !m->gpt2;
  /* a unit's weights are gathered (pre_forward) before the first op that reads them: layer
   * l + 1's first norm runs at the end of layer l */
  HOOK(pre_forward, L ? 1 : L + 1);
  if (L) norm_fwd(m, A(m->la[0].ln1), AF(m->la[0].ln1_mean), AF(m->la[0].ln1_rstd), x,
                  PW(0, P_LN1_W), PWO(0, P_LN1_B), N);
  else norm_fwd(m, A(m->lnf), AF(m->lnf_mean), AF(m->lnf_rstd), x, PW(G, P_LNF_W),
                PWO(G, P_LNF_B), N);
  /* Evaluation keeps no activations for backward: every block reuses block 0's slots (each op
   * reads and writes different buffers of a slot, and the residual adds are in place). */
  const bool keep = grad_scale != 0.0f;
  for (int l = 0; l < L; l++) {
    layer_acts *a = &m->la[keep ? l : 0];
    qkv_fwd(m, a, l, A(a->ln1), B, T, 0);
    o->attention_fwd(A(a->atty), AF(a->att), A(a->qkv), B, T, H, KV, hd);
    o->matmul_fwd(A(a->res2), A(a->atty), PW(l, P_ATTO_W), PWB(l, P_ATTO_B), N, H * hd, C);
    TP_AR(A(a->res2), (size_t)N * C);
    o->add_norm_fwd(A(a->res2), A(a->ln2), AF(a->ln2_mean), AF(a->ln2_rstd), A(a->res2), x,
                    PW(l, P_LN2_W), PWO(l, P_LN2_B), N, C, eps, rms);
    mlp_fwd(m, a, l, A(a->out), N);
    TP_AR(A(a->out), (size_t)N * C);
    HOOK(pre_forward, l + 2); /* the next layer, or the final norm (unit L + 1) */
    if (l + 1 < L) {
      layer_acts *n = &m->la[keep ? l + 1 : 0];
      o->add_norm_fwd(A(a->out), A(n->ln1), AF(n->ln1_mean), AF(n->ln1_rstd), A(a->out),
                      A(a->res2), PW(l + 1, P_LN1_W), PWO(l + 1, P_LN1_B), N, C, eps, rms);
    } else {
      o->add_norm_fwd(A(a->out), A(m->lnf), AF(m->lnf_mean), AF(m->lnf_rstd), A(a->out),
                      A(a->res2), PW(G, P_LNF_W), PWO(G, P_LNF_B), N, C, eps, rms);
    }
    x = A(a->out);
  }
  const char *head = m->cfg.tie_embeddings ? PW(G, P_WTE) : PW(G, P_LM_HEAD);
  const int ch = m->cfg.head_chunk;
  m->head_done = false;
  if (ch > 0 && ch < N) {
    /* fused linear + cross-entropy: per chunk of rows the logits, the loss and its gradient in
     * place, then at once the head's backward for the chunk (d(final norm output) into d_ln, the
     * weight gradient accumulated), so logits exist for one chunk only */
    if (!targets)
      return ct_set_error(CT_ERR_RUNTIME, "logits for %d rows requested from a model whose head"
                          " runs in chunks of %d (kernels.head_chunk)", N, ch);
    if (m->tp > 1 || m->hooks.pre_backward)
      return ct_set_error(CT_ERR_RUNTIME, "kernels.head_chunk works without tensor parallelism"
                          " and without ZeRO-2/3");
    float *hg = m->cfg.tie_embeddings ? PG(G, P_WTE) : PG(G, P_LM_HEAD);
    if (grad_scale != 0.0f) o->zero(A(m->d_ln), (size_t)N * C * m->ab);
    for (int r0 = 0; r0 < N; r0 += ch) {
      const int n = N - r0 < ch ? N - r0 : ch;
      const char *x = EL(A(m->lnf), (size_t)r0 * C);
      o->matmul_fwd(A(m->logits), x, head, NULL, n, C, m->Vp);
      o->xent_fwd_bwd(AF(m->losses) + r0, A(m->logits), m->tgt + r0, n, m->cfg.vocab_size, m->Vp,
                      grad_scale);
      if (grad_scale != 0.0f)
        o->matmul_bwd(EL(A(m->d_ln), (size_t)r0 * C), hg, NULL, A(m->logits), x, head, n, C, m->Vp);
    }
    m->head_done = grad_scale != 0.0f;
    return CT_OK;
  }
  o->matmul_fwd(A(m->logits), A(m->lnf), head, NULL, N, C, m->Vp);
  if (!targets) return CT_OK;
  if (m->tp > 1)
    return m->tpx.xent(m->tpx.ctx, m->host_losses, A(m->logits), targets, N, grad_scale);
  o->xent_fwd_bwd(AF(m->losses), A(m->logits), m->tgt, N, m->cfg.vocab_size, m->Vp, grad_scale);
  return CT_OK;
}

ct_status ct_model_forward(ct_model *m, const int32_t *inputs, const int32_t *targets, int B,
                           int T, float grad_scale, float *mean_loss) {
  CT_TRY(load_batch(m, inputs, targets, B, T));
  refresh_working(m);
  CT_TRY(forward_device(m, targets, grad_scale));
  if (m->ops->mark) m->ops->mark("forward");
  if (!targets) return CT_OK;
  read_loss(m, targets, mean_loss);
  m->have_grad = grad_scale != 0.0f;
  return CT_OK;
}

static ct_status backward_device(ct_model *m);

ct_status ct_model_backward(ct_model *m) {
  if (!m->have_grad)
    return ct_set_error(CT_ERR_RUNTIME, "backward without a forward that prepared gradients");
  return backward_device(m);
}

void ct_model_set_graphs(ct_model *m, bool on) {
  m->graphs = on && m->ops->graph_begin;
  if (!m->graphs && m->graph) {
    m->ops->graph_destroy(m->graph);
    m->graph = NULL;
  }
  m->graph_warm = 0;
}

bool ct_model_graphs(const ct_model *m) { return m->graphs; }

ct_status ct_model_train_micro(ct_model *m, const int32_t *inputs, const int32_t *targets, int B,
                               int T, float grad_scale, float *mean_loss) {
  const ct_model_hooks *h = &m->hooks;
  if (!m->graphs || m->tp > 1 || h->pre_forward || h->pre_backward || h->post_backward) {
    CT_TRY(ct_model_forward(m, inputs, targets, B, T, grad_scale, mean_loss));
    return ct_model_backward(m);
  }
  const ct_ops *o = m->ops;
  CT_TRY(load_batch(m, inputs, targets, B, T));
  refresh_working(m); /* outside the graph: only after the weights changed */
  if (m->graph && (m->graph_B != B || m->graph_T != T || m->graph_scale != grad_scale)) {
    o->graph_destroy(m->graph); /* another shape or loss scale: record again */
    m->graph = NULL;
    m->graph_warm = 0;
  }
  if (!m->graph && m->graph_warm < 2) {
    /* the first calls run directly: scratch buffers and GEMM plans reach their steady sizes */
    CT_TRY(forward_device(m, targets, grad_scale));
    CT_TRY(backward_device(m));
    m->graph_warm++;
  } else {
    if (!m->graph) {
      o->graph_begin();
      ct_status st = forward_device(m, targets, grad_scale);
      if (st == CT_OK) st = backward_device(m);
      m->graph = o->graph_end();
      if (st != CT_OK) return st;
      if (!m->graph)
        return ct_set_error(CT_ERR_RUNTIME, "recording the training step as a CUDA graph failed"
                            " (train.cuda_graphs = \"off\" runs without)");
      m->graph_B = B, m->graph_T = T, m->graph_scale = grad_scale;
    }
    o->graph_launch(m->graph);
  }
  read_loss(m, targets, mean_loss);
  return CT_OK;
}

static ct_status backward_device(ct_model *m) {
  const ct_ops *o = m->ops;
  const int L = m->cfg.n_layer, B = m->B, T = m->T, N = B * T, C = m->C, H = m->H, KV = m->KV;
  const int hd = m->hd, W = m->W, F = m->F, G = L;
  const float theta = (float)m->cfg.rope_theta;
  const size_t NC = (size_t)N * C * m->ab;
  const size_t Fw = m->gpt2 ? (size_t)F : 2 * (size_t)F;
  char *dres = A(m->d_res), *dln = A(m->d_ln), *dqkv = A(m->d_qkv), *datty = A(m->d_atty);
  char *dfch = A(m->d_fch), *dact = A(m->d_act);

  /* head and final norm: dlogits sit in the logits buffer */
  const bool tie = m->cfg.tie_embeddings;
  m->have_grad = false;
  HOOK(pre_backward, L + 1); /* prepares both global units: a tied head writes wte's gradient */
  if (m->head_done) { /* the chunked forward did the head's backward */
    m->head_done = false;
  } else {
    o->zero(dln, NC);
    o->matmul_bwd(dln, tie ? PG(G, P_WTE) : PG(G, P_LM_HEAD), NULL, A(m->logits), A(m->lnf),
                  tie ? PW(G, P_WTE) : PW(G, P_LM_HEAD), N, C, m->Vp);
    TP_AR(dln, (size_t)N * C); /* column-parallel input gradient: partial sums over the tp group */
  }
  const char *xL = L ? A(m->la[L - 1].out) : A(m->emb);
  o->zero(dres, NC);
  norm_bwd(m, dres, PG(G, P_LNF_W), PG(G, P_LNF_B), dln, xL, PW(G, P_LNF_W), AF(m->lnf_mean),
           AF(m->lnf_rstd), N);
  HOOK(post_backward, L + 1);

  /* dres holds d(block output); each block adds its branch gradients and passes it down */
  for (int l = L - 1; l >= 0; l--) {
    layer_acts *a = &m->la[l];
    HOOK(pre_backward, l + 1);
    const char *x = l ? A(m->la[l - 1].out) : A(m->emb);
    /* MLP branch */
    if (m->gpt2) { /* d(fc output) straight from d(block output) through proj and GELU */
      o->matmul_bwd(NULL, PG(l, P_PROJ_W), PG(l, P_PROJ_B), dres, A(a->act), PW(l, P_PROJ_W), N,
                    F, C);
      o->matmul_dgelu_bwd(dfch, dres, PW(l, P_PROJ_W), A(a->fch), N, F, C);
      o->zero(dln, NC);
      o->matmul_bwd(dln, PG(l, P_FC_W), PG(l, P_FC_B), dfch, A(a->ln2), PW(l, P_FC_W), N, C, F);
    } else {
      o->zero(dact, (size_t)N * F * m->ab);
      o->matmul_bwd(dact, PG(l, P_PROJ_W), PG(l, P_PROJ_B), dres, A(a->act), PW(l, P_PROJ_W), N,
                    F, C);
      o->zero(dfch, (size_t)N * Fw * m->ab);
      o->swiglu_bwd(dfch, dact, A(a->fch), N, F);
      o->zero(dln, NC);
      o->matmul_bwd(dln, PG(l, P_FC_W), NULL, dfch, A(a->ln2), PW(l, P_FC_W), N, C, 2 * F);
    }
    TP_AR(dln, (size_t)N * C);
    norm_bwd(m, dres, PG(l, P_LN2_W), PG(l, P_LN2_B), dln, A(a->res2), PW(l, P_LN2_W),
             AF(a->ln2_mean), AF(a->ln2_rstd), N);
    /* attention branch (dres is now d res2) */
    o->zero(datty, (size_t)N * H * hd * m->ab);
    o->matmul_bwd(datty, PG(l, P_ATTO_W), PG(l, P_ATTO_B), dres, A(a->atty), PW(l, P_ATTO_W), N,
                  H * hd, C);
    if (o->attention_bwd_set) {
      o->attention_bwd_set(dqkv, datty, A(a->qkv), AF(a->att), B, T, H, KV, hd);
    } else {
      o->zero(dqkv, (size_t)N * W * m->ab);
      o->attention_bwd(dqkv, datty, A(a->qkv), AF(a->att), B, T, H, KV, hd);
    }
    if (!m->gpt2) o->rope_bwd(dqkv, B, T, H, KV, hd, 0, theta);
    char *dproj = dqkv; /* gradient w.r.t. the qkv projection output */
    if (m->cfg.qk_norm) {
      char *draw = A(m->d_qkv_raw), *raw = A(a->qkv_raw);
      const size_t row = (size_t)W * m->ab, v0 = (size_t)(H + KV) * hd;
      o->zero(draw, (size_t)N * W * m->ab);
      o->copy2d(EL(draw, v0), row, EL(dqkv, v0), row, (size_t)KV * hd * m->ab, (size_t)N);
      /* tp: each rank adds its heads' part; what the buffer held is scaled by 1/T first so
       * the sum over the group keeps it once (exact: T is a power of two) */
      if (m->tp > 1) {
        o->scale(PG(l, P_QNORM), 1.0f / (float)m->tp, (size_t)hd);
        o->scale(PG(l, P_KNORM), 1.0f / (float)m->tp, (size_t)hd);
      }
      o->rmsnorm_bwd(draw, PG(l, P_QNORM), dqkv, raw, PW(l, P_QNORM), AF(a->qn_rstd), N * H, hd, H, W);
      o->rmsnorm_bwd(EL(draw, (size_t)H * hd), PG(l, P_KNORM), EL(dqkv, (size_t)H * hd),
                     EL(raw, (size_t)H * hd), PW(l, P_KNORM), AF(a->kn_rstd), N * KV, hd, KV, W);
      if (m->tp > 1) {
        CT_TRY(m->tpx.all_reduce(m->tpx.ctx, PG(l, P_QNORM), (size_t)hd, true));
        CT_TRY(m->tpx.all_reduce(m->tpx.ctx, PG(l, P_KNORM), (size_t)hd, true));
      }
      dproj = draw;
    }
    o->zero(dln, NC);
    o->matmul_bwd(dln, PG(l, P_QKV_W), PG(l, P_QKV_B), dproj, A(a->ln1), PW(l, P_QKV_W), N, C, W);
    TP_AR(dln, (size_t)N * C);
    norm_bwd(m, dres, PG(l, P_LN1_W), PG(l, P_LN1_B), dln, x, PW(l, P_LN1_W), AF(a->ln1_mean),
             AF(a->ln1_rstd), N);
    HOOK(post_backward, l + 1);
  }
  HOOK(pre_backward, 0);
  o->embed_bwd(m->embed_grad ? m->embed_grad : PG(G, P_WTE), PG(G, P_WPE), dres, m->tok, B, T, C);
  if (m->tp > 1) /* the zero row collected other ranks' tokens: not a parameter */
    o->zero(PG(G, P_WTE) + (size_t)m->Vp * C, (size_t)C * sizeof(float));
  HOOK(post_backward, 0);
  return CT_OK;
}

void ct_model_zero_grad(ct_model *m) {
  if (m->g) m->ops->zero(m->g, m->numel * sizeof(float));
}

/* ---- units and hooks (parallel/zero.c, parallel/ddp.c) ---- */

int ct_model_n_units(const ct_model *m) { return m->n_units; }
void ct_model_unit(const ct_model *m, int u, size_t *offset, size_t *numel) {
  *offset = m->uoff[u];
  *numel = m->un[u];
}
void ct_model_set_unit(ct_model *m, int u, char *weights, float *grads) {
  if (weights) m->uw[u] = weights;
  if (grads) m->ug[u] = grads;
}
void ct_model_set_hooks(ct_model *m, const ct_model_hooks *h) {
  if (h) m->hooks = *h;
  else memset(&m->hooks, 0, sizeof m->hooks);
}
void ct_model_set_embed_grad(ct_model *m, float *dwte) { m->embed_grad = dwte; }
void ct_model_drop_full(ct_model *m, bool params, bool grads) {
  if (grads && m->g) {
    m->ops->free(m->g);
    m->g = NULL;
  }
  if (params) {
    if (m->wk && m->wk != (char *)m->w) m->ops->free(m->wk);
    if (m->w) m->ops->free(m->w);
    m->w = NULL;
    m->wk = NULL;
  }
}
void ct_model_set_tp(ct_model *m, const ct_model_tp *tp) {
  if (tp) m->tpx = *tp;
  else memset(&m->tpx, 0, sizeof m->tpx);
}
int ct_model_tp_size(const ct_model *m) { return m->tp; }
size_t ct_model_arena_bytes(const ct_model *m) { return m->arena_bytes; }

float *ct_model_attach_params(ct_model *m, float *w) {
  float *old = m->w;
  m->w = w;
  return old;
}

/* ---- KV cache ---- */

struct ct_kv_cache {
  const ct_ops *ops;
  int L, max_B, max_T, KV, hd;
  char *k, *v;  /* (L, max_B, KV, max_T, hd) in the working dtype */
  int *len;     /* (max_B) */
};

ct_status ct_kv_cache_create(const ct_model *m, int max_B, int max_T, ct_kv_cache **out) {
  ct_kv_cache *c = ct_calloc(1, sizeof *c, "KV cache");
  if (!c) return CT_ERR_NOMEM;
  c->ops = m->ops;
  c->L = m->cfg.n_layer;
  c->max_B = max_B;
  c->max_T = max_T;
  c->KV = m->KV;
  c->hd = m->hd;
  const size_t n = (size_t)c->L * max_B * m->KV * max_T * m->hd;
  c->k = m->ops->alloc(n * m->ab);
  c->v = m->ops->alloc(n * m->ab);
  c->len = ct_calloc((size_t)max_B, sizeof(int), "KV cache lengths");
  if (!c->k || !c->v || !c->len) {
    ct_kv_cache_destroy(c);
    return ct_set_error(CT_ERR_NOMEM, "out of memory for a KV cache of %d x %d tokens (%.1f MiB)",
                        max_B, max_T, 2.0 * n * m->ab / 1048576.0);
  }
  *out = c;
  return CT_OK;
}

void ct_kv_cache_destroy(ct_kv_cache *c) {
  if (!c) return;
  if (c->k) c->ops->free(c->k);
  if (c->v) c->ops->free(c->v);
  free(c->len);
  free(c);
}

void ct_kv_cache_reset(ct_kv_cache *c, int b) { c->len[b] = 0; }
int ct_kv_cache_len(const ct_kv_cache *c, int b) { return c->len[b]; }
int ct_kv_cache_capacity(const ct_kv_cache *c) { return c->max_T; }

ct_status ct_model_forward_cached(ct_model *m, ct_kv_cache *c, int b, const int32_t *tokens,
                                  int n, float *logits_host) {
  const int pos0 = c->len[b];
  if (b < 0 || b >= c->max_B || n <= 0 || n > m->max_B * m->max_T || pos0 + n > c->max_T)
    return ct_set_error(CT_ERR_RUNTIME, "cached forward: %d new tokens at position %d of sequence %d"
                        " exceed the cache (%d x %d) or the activations (%d tokens)", n, pos0, b,
                        c->max_B, c->max_T, m->max_B * m->max_T);
  if (pos0 + n > m->cfg.max_seq_len)
    return ct_set_error(CT_ERR_RUNTIME, "position %d exceeds model.max_seq_len", pos0 + n);
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
      return ct_set_error(CT_ERR_INPUT, "token %d outside the vocabulary [0, %d)", tokens[i],
                          m->cfg.vocab_size);
  refresh_working(m);
  const ct_ops *o = m->ops;
  const int L = m->cfg.n_layer, C = m->C, H = m->H, KV = m->KV, hd = m->hd, W = m->W, G = L;
  const size_t seq = (size_t)KV * c->max_T * hd, layer = (size_t)c->max_B * seq;
  const size_t ab = m->ab;
  layer_acts *a = &m->la[0]; /* nothing is kept for backward: every layer reuses layer 0's space */
  char *x = A(m->emb), *tmp = A(a->out);

  o->to_device(m->tok, tokens, (size_t)n * sizeof(int32_t));
  o->embed_fwd(x, m->tok, PW(G, P_WTE), NULL, 1, n, C);
  if (m->gpt2) /* learned positions pos0 .. pos0+n-1 */
    o->add_fwd(x, x, EL(PW(G, P_WPE), (size_t)pos0 * C), (size_t)n * C);
  for (int l = 0; l < L; l++) {
    norm_fwd(m, A(a->ln1), AF(a->ln1_mean), AF(a->ln1_rstd), x, PW(l, P_LN1_W), PWO(l, P_LN1_B), n);
    qkv_fwd(m, a, l, A(a->ln1), 1, n, pos0);
    char *qkv = A(a->qkv);
    char *kc = c->k + (l * layer + b * seq) * ab, *vc = c->v + (l * layer + b * seq) * ab;
    for (int h = 0; h < KV; h++) { /* append this chunk's keys and values */
      const size_t dst = ((size_t)h * c->max_T + pos0) * hd;
      o->copy2d(kc + dst * ab, (size_t)hd * ab, EL(qkv, (size_t)(H + h) * hd), (size_t)W * ab,
                (size_t)hd * ab, (size_t)n);
      o->copy2d(vc + dst * ab, (size_t)hd * ab, EL(qkv, (size_t)(H + KV + h) * hd), (size_t)W * ab,
                (size_t)hd * ab, (size_t)n);
    }
    o->attention_cached(A(a->atty), qkv, kc, vc, n, pos0, H, KV, hd, c->max_T);
    o->matmul_fwd(A(a->res2), A(a->atty), PW(l, P_ATTO_W), PWO(l, P_ATTO_B), n, H * hd, C);
    o->add_fwd(A(a->res2), A(a->res2), x, (size_t)n * C);
    norm_fwd(m, A(a->ln2), AF(a->ln2_mean), AF(a->ln2_rstd), A(a->res2), PW(l, P_LN2_W),
             PWO(l, P_LN2_B), n);
    mlp_fwd(m, a, l, tmp, n);
    o->add_fwd(x, tmp, A(a->res2), (size_t)n * C); /* the block output replaces x in place */
  }
  /* only the last position's logits are needed */
  norm_fwd(m, A(m->lnf), AF(m->lnf_mean), AF(m->lnf_rstd), EL(x, (size_t)(n - 1) * C),
           PW(G, P_LNF_W), PWO(G, P_LNF_B), 1);
  const char *head = m->cfg.tie_embeddings ? PW(G, P_WTE) : PW(G, P_LM_HEAD);
  o->matmul_fwd(A(m->logits), A(m->lnf), head, NULL, 1, C, m->Vp);
  o->to_host_f32(logits_host, A(m->logits), (size_t)m->Vp);
  c->len[b] = pos0 + n;
  return CT_OK;
}

/* ---- batched inference engine (see model.h) ---- */

#define INFER_MAX_DEV 16

/* Activation offsets (bytes into a device's arena) for R rows and S decode rows. */
typedef struct infer_acts {
  size_t x, ln, raw, qkv, atty, res2, tmp, fch, act;   /* (R, ...) working dtype */
  size_t last, lnf, logits;                           /* (S', C) (S', C) (S', Vp) */
  size_t mean, rstd, qn, kn, att;                     /* fp32 */
  size_t tok, pos, slot, ids;                         /* int32 (R) */
  size_t bytes;
} infer_acts;

static infer_acts infer_layout(const ct_model *m, const ct_ops *ops, int R, int S) {
  /* S: rows of the head (last, lnf, logits): decode rows, or logit_rows for ct_infer_loss */
  infer_acts a;
  size_t top = 0, ab = (size_t)ops->act_bytes;
  const size_t C = (size_t)m->C, W = (size_t)m->W, Hhd = (size_t)m->H * m->hd;
  const size_t Fw = m->gpt2 ? (size_t)m->F : 2 * (size_t)m->F;
  a.x = take(&top, (size_t)R * C, ab);
  a.ln = take(&top, (size_t)R * C, ab);
  a.raw = take(&top, m->cfg.qk_norm ? (size_t)R * W : 0, ab);
  a.qkv = take(&top, (size_t)R * W, ab);
  a.atty = take(&top, (size_t)R * Hhd, ab);
  a.res2 = take(&top, (size_t)R * C, ab);
  a.tmp = take(&top, (size_t)R * C, ab);
  a.fch = take(&top, (size_t)R * Fw, ab);
  a.act = take(&top, (size_t)R * m->F, ab);
  a.last = take(&top, (size_t)S * C, ab);
  a.lnf = take(&top, (size_t)S * C, ab);
  a.logits = take(&top, (size_t)S * m->Vp, ab);
  a.mean = take(&top, (size_t)R, sizeof(float));
  a.rstd = take(&top, (size_t)R, sizeof(float));
  a.qn = take(&top, (size_t)R * m->H, sizeof(float));
  a.kn = take(&top, (size_t)R * m->KV, sizeof(float));
  a.att = take(&top, ops->attention_state_floats(1, R, m->H, m->KV, m->hd), sizeof(float));
  a.tok = take(&top, (size_t)R, sizeof(int32_t));
  a.pos = take(&top, (size_t)R, sizeof(int32_t));
  a.slot = take(&top, (size_t)R, sizeof(int32_t));
  a.ids = take(&top, (size_t)R, sizeof(int32_t));
  a.bytes = top;
  return a;
}

/* Floats of the flat table: the embedding part [0, layer 0), layer l, the final part. */
static size_t layer_lo(const ct_model *m, int l) {
  return l < m->cfg.n_layer ? m->off[l][P_LN1_W] : m->off[m->cfg.n_layer][P_LNF_W];
}

typedef struct infer_dev {
  int dev;                 /* device index for ops->set_device (-1: never switch) */
  int l0, l1;              /* layers [l0, l1) */
  bool first, last;        /* embedding here / final norm and head here */
  char *w;                 /* working weights of floats [lo, hi) of the flat table */
  size_t lo, hi;
  bool own_w;
  char *head;              /* copy of the tied head when the embedding lives elsewhere */
  char *arena;
  infer_acts a;
  void **graph;            /* (max_seqs + 1) captured decode steps by row count */
  unsigned char *seen;     /* (max_seqs + 1) uncaptured steps run per row count */
} infer_dev;

struct ct_infer {
  ct_model *m;
  const ct_ops *ops;
  ct_infer_cfg cfg;
  int R, S, max_T;
  int LR;                  /* rows of the head buffers (>= S) */
  int n_dev;
  infer_dev d[INFER_MAX_DEV];
  int *at;                 /* (L) index into d[] of each layer */
  char **kc, **vc;         /* (L) caches (S, KV, max_T, hd) on the layer's device */
  int *len;                /* (S) */
  int32_t *h_tok, *h_pos, *h_slot, *h_ids; /* host staging (pinned where possible): tok, pos,
                                              slot in one block laid out like the arena's */
  bool pinned;
  int graphs;              /* -1 auto, 0 off, 1 on */
  long graph_steps;
  /* Decoding ahead (one device, greedy ids, a captured step): each decode call queues the next
   * step right behind its own, fed on the device by its argmax (argmax_advance), so the GPU
   * does not wait for the host between steps. The next call takes that step when it asks for
   * the same rows with the tokens just returned; anything else waits for it and drops it (its
   * cache writes are past the committed lengths, so later steps overwrite them). */
  bool ahead_ok;           /* the backend can and CT_DECODE_AHEAD is not 0 */
  int ahead_n;             /* rows of the step in flight ahead (0: none) */
  int ahead_buf;           /* which of h_ab / ev it writes */
  int *ahead_slots;        /* (S) its slots */
  int32_t *ahead_tok;      /* (S) its tokens (the ids of the step before it) */
  int32_t *h_ab[2];        /* pinned ids of a step and of the step ahead */
  int32_t *h_map, *d_map;  /* or, where the backend maps host memory (CT_DECODE_ZEROCOPY not 0),
                              2 x S ids the argmax writes itself (host and device addresses): a
                              step's row b at [(its new position & 1) * rows + b], so no copy
                              sits between two steps (~10 us of idle GPU a step on an H100) and
                              the step ahead writes the other half */
  long ahead_steps;        /* steps decoded ahead and taken */
  void *ev[2];             /* after a step (and its ids' copy into h_ab where h_map is NULL) */
};

static int infer_set(ct_infer *e, const infer_dev *d) {
  return (d->dev >= 0 && e->ops->set_device) ? e->ops->set_device(d->dev) : 0;
}

/* Waits for the decode step queued ahead, if any, and forgets it (it was never committed). */
static void ahead_drop(ct_infer *e) {
  if (!e->ahead_n) return;
  e->ops->event_wait(e->ev[e->ahead_buf]);
  e->ahead_n = 0;
  e->graph_steps--;
}

/* working weights and activations use the ENGINE's dtype (ops->act_bytes), not the model's:
 * a model built on the CPU table (fp32) feeds a bf16 engine */
#define DW(d, l, r) ((d)->w + (m->off[l][r] - (d)->lo) * (size_t)e->ops->act_bytes)
#define DWO(d, l, r) (m->off[l][r] == NONE ? NULL : DW(d, l, r))
#define DA(d, x) ((d)->arena + (d)->a.x)
#define DAF(d, x) ((float *)((d)->arena + (d)->a.x))
#define DAI(d, x) ((int32_t *)((d)->arena + (d)->a.x))

void ct_infer_destroy(ct_infer *e) {
  if (!e) return;
  const ct_ops *o = e->ops;
  ahead_drop(e);
  for (int i = 0; i < e->n_dev; i++) {
    infer_dev *d = &e->d[i];
    infer_set(e, d);
    if (d->graph)
      for (int n = 0; n <= e->S; n++)
        if (d->graph[n] && o->graph_destroy) o->graph_destroy(d->graph[n]);
    free(d->graph);
    free(d->seen);
    if (d->own_w && d->w) o->free(d->w);
    if (d->head) o->free(d->head);
    if (d->arena) o->free(d->arena);
    for (int l = d->l0; e->kc && l < d->l1; l++) {
      if (e->kc[l]) o->free(e->kc[l]);
      if (e->vc[l]) o->free(e->vc[l]);
    }
  }
  if (e->n_dev) infer_set(e, &e->d[0]);
  void (*hf)(void *) = e->pinned ? o->host_free : free;
  if (e->h_tok) hf(e->h_tok); /* h_pos, h_slot point into it */
  if (e->h_ids) hf(e->h_ids);
  for (int i = 0; i < 2; i++) {
    if (e->h_ab[i]) hf(e->h_ab[i]);
    if (e->ev[i]) o->event_free(e->ev[i]);
  }
  if (e->h_map) o->host_free(e->h_map);
  free(e->ahead_slots);
  free(e->ahead_tok);
  free(e->at);
  free(e->kc);
  free(e->vc);
  free(e->len);
  free(e);
}

/* Fills d->w (floats [lo, hi) of the table, working dtype) from the model's fp32 master on the
 * host, through an fp32 staging buffer on the device. */
static ct_status infer_upload(ct_infer *e, infer_dev *d, char *dst, size_t lo, size_t hi) {
  const ct_ops *o = e->ops;
  ct_model *m = e->m;
  const float *src = m->w; /* host memory: the model is on the CPU table */
  const size_t chunk = (size_t)1 << 23, n = hi - lo;
  float *tmp = o->act_bytes == 4 ? NULL : o->alloc(sizeof(float) * (n < chunk ? n : chunk));
  if (o->act_bytes != 4 && !tmp)
    return ct_set_error(CT_ERR_NOMEM, "out of device memory staging weights on device %d", d->dev);
  for (size_t at = 0; at < n; at += chunk) {
    const size_t k = n - at < chunk ? n - at : chunk;
    if (o->act_bytes == 4) {
      o->to_device(dst + at * 4, src + lo + at, k * sizeof(float));
    } else {
      o->to_device(tmp, src + lo + at, k * sizeof(float));
      o->cast_params(dst + at * o->act_bytes, tmp, k);
    }
  }
  if (tmp) o->free(tmp);
  return CT_OK;
}

/* A GPU engine's residual products (output projection, down projection: matmul_add_fwd) run
 * once at the engine's full batch before its first generate, on the arena's unset rows (their
 * outputs are overwritten by every step), so that a library's first use of its kernels for that
 * shape falls into the engine's setup and not into the first decode: cuBLAS loads its split-K
 * products lazily, ~45 ms on an H200 (bench/results/call111-116_*, call 116). */
static void infer_warm(ct_infer *e) {
  const ct_model *m = e->m;
  const ct_ops *o = e->ops;
  if (!o->graph_begin || !o->matmul_add_fwd || !o->sync || e->S < 2) return;
  for (int i = 0; i < e->n_dev; i++) {
    infer_dev *d = &e->d[i];
    const int l = d->l0;
    infer_set(e, d);
    o->matmul_add_fwd(DA(d, res2), DA(d, atty), DW(d, l, P_ATTO_W), DWO(d, l, P_ATTO_B),
                      DA(d, x), e->S, m->H * m->hd, m->C);
    o->matmul_add_fwd(DA(d, res2), DA(d, act), DW(d, l, P_PROJ_W), DWO(d, l, P_PROJ_B), DA(d, x),
                      e->S, m->F, m->C);
    o->sync();
  }
  infer_set(e, &e->d[0]);
}

ct_status ct_infer_create(ct_model *m, const ct_ops *ops, const ct_infer_cfg *cfg, ct_infer **out) {
  *out = NULL;
  const int L = m->cfg.n_layer, G = L;
  if (cfg->max_seqs <= 0 || cfg->max_rows <= 0 || cfg->max_len <= 0 ||
      cfg->max_len > m->cfg.max_seq_len)
    return ct_set_error(CT_ERR_USAGE, "inference: %d sequences of %d tokens with %d-row prefills"
                        " (model.max_seq_len %d)", cfg->max_seqs, cfg->max_len, cfg->max_rows,
                        m->cfg.max_seq_len);
  if (!ops->embed_pos_fwd || !ops->attention_decode)
    return ct_set_error(CT_ERR_RUNTIME, "backend %s has no batched-decode ops", ops->name);
  ct_infer *e = ct_calloc(1, sizeof *e, "inference engine");
  if (!e) return CT_ERR_NOMEM;
  ct_status st = CT_OK;
  e->m = m;
  e->ops = ops;
  e->cfg = *cfg;
  e->S = cfg->max_seqs;
  e->R = cfg->max_rows > cfg->max_seqs ? cfg->max_rows : cfg->max_seqs;
  e->LR = cfg->logit_rows > cfg->max_seqs ? cfg->logit_rows : cfg->max_seqs;
  if (e->LR > e->R) e->LR = e->R; /* the norm statistics hold R rows */
  e->max_T = cfg->max_len;
  e->graphs = ops->graph_begin ? cfg->graphs : 0;
  if (cfg->graphs == 1 && !ops->graph_begin) {
    st = ct_set_error(CT_ERR_USAGE, "CUDA graphs: backend %s has none", ops->name);
    goto fail;
  }
  e->at = ct_calloc((size_t)L + 1, sizeof(int), "layer devices");
  e->kc = ct_calloc((size_t)L + 1, sizeof(char *), "KV caches");
  e->vc = ct_calloc((size_t)L + 1, sizeof(char *), "KV caches");
  e->len = ct_calloc((size_t)e->S, sizeof(int), "sequence lengths");
  if (!e->at || !e->kc || !e->vc || !e->len) { st = CT_ERR_NOMEM; goto fail; }

  /* devices in layer order */
  for (int l = 0; l < L; l++) {
    const int dev = cfg->layer_dev ? cfg->layer_dev[l] : cfg->device;
    if (l > 0 && cfg->layer_dev && dev < cfg->layer_dev[l - 1]) {
      st = ct_set_error(CT_ERR_USAGE, "device map: layer %d on device %d after device %d (layers"
                        " must be placed in non-decreasing device order)", l, dev,
                        cfg->layer_dev[l - 1]);
      goto fail;
    }
    if (e->n_dev == 0 || e->d[e->n_dev - 1].dev != dev) {
      if (e->n_dev == INFER_MAX_DEV) { st = ct_set_error(CT_ERR_USAGE, "device map: too many devices"); goto fail; }
      infer_dev *d = &e->d[e->n_dev++];
      d->dev = dev;
      d->l0 = l;
    }
    e->d[e->n_dev - 1].l1 = l + 1;
    e->at[l] = e->n_dev - 1;
  }
  if (e->n_dev > 1 && (!ops->set_device || !ops->copy_peer)) {
    st = ct_set_error(CT_ERR_USAGE, "device map over %d devices: backend %s has one device",
                      e->n_dev, ops->name);
    goto fail;
  }
  const bool share = ops == m->ops && e->n_dev == 1;
  if (!share && m->ops != ct_ops_cpu()) {
    st = ct_set_error(CT_ERR_USAGE, "inference on %s across devices needs the model built on the"
                      " CPU table (the weights are copied to each device)", ops->name);
    goto fail;
  }
  if (share && !m->wk) {
    st = ct_set_error(CT_ERR_USAGE, "inference needs the model's full working weights (not a"
                      " ZeRO-3 sharded model)");
    goto fail;
  }
  if (!share && !m->w) {
    st = ct_set_error(CT_ERR_USAGE, "inference needs the model's full fp32 weights");
    goto fail;
  }
  if (share) refresh_working(m);
  const size_t ab = (size_t)ops->act_bytes;
  const size_t kvb = (size_t)e->S * m->KV * e->max_T * m->hd * ab;
  for (int i = 0; i < e->n_dev; i++) {
    infer_dev *d = &e->d[i];
    d->first = i == 0;
    d->last = i == e->n_dev - 1;
    if (infer_set(e, d) != 0) {
      st = ct_set_error(CT_ERR_RUNTIME, "device map: cannot use device %d", d->dev);
      goto fail;
    }
    d->lo = d->first ? 0 : layer_lo(m, d->l0);
    d->hi = d->last ? m->numel : layer_lo(m, d->l1);
    if (share) {
      d->w = m->wk;
    } else {
      d->w = ops->alloc((d->hi - d->lo) * ab);
      d->own_w = true;
      if (!d->w) {
        st = ct_set_error(CT_ERR_NOMEM, "out of memory for %.2f GiB of weights on device %d",
                          (d->hi - d->lo) * ab / 1073741824.0, d->dev);
        goto fail;
      }
      CT_TRY_GOTO(infer_upload(e, d, d->w, d->lo, d->hi), fail);
      if (d->last && !d->first && m->cfg.tie_embeddings) {
        const size_t n = (size_t)m->Vp * m->C;
        d->head = ops->alloc(n * ab);
        if (!d->head) { st = ct_set_error(CT_ERR_NOMEM, "out of memory for the tied head on device %d", d->dev); goto fail; }
        CT_TRY_GOTO(infer_upload(e, d, d->head, m->off[G][P_WTE], m->off[G][P_WTE] + n), fail);
      }
    }
    d->a = infer_layout(m, ops, e->R, e->LR);
    d->arena = ops->alloc(d->a.bytes);
    d->graph = ct_calloc((size_t)e->S + 1, sizeof(void *), "graphs");
    d->seen = ct_calloc((size_t)e->S + 1, 1, "graph flags");
    if (!d->arena || !d->graph || !d->seen) {
      st = ct_set_error(CT_ERR_NOMEM, "out of memory for inference activations (%.1f MiB) on"
                        " device %d", d->a.bytes / 1048576.0, d->dev);
      goto fail;
    }
    for (int l = d->l0; l < d->l1; l++) {
      e->kc[l] = ops->alloc(kvb);
      e->vc[l] = ops->alloc(kvb);
      if (!e->kc[l] || !e->vc[l]) {
        st = ct_set_error(CT_ERR_NOMEM, "out of memory for layer %d's KV cache (%d x %d tokens,"
                          " %.1f MiB) on device %d", l, e->S, e->max_T, 2.0 * kvb / 1048576.0,
                          d->dev);
        goto fail;
      }
    }
  }
  infer_set(e, &e->d[0]);
  e->pinned = ops->host_alloc && ops->host_free;
  void *(*ha)(size_t) = e->pinned ? ops->host_alloc : malloc;
  const infer_acts *a0 = &e->d[0].a; /* every device has the same layout */
  e->h_tok = ha(a0->ids - a0->tok);   /* tok, pos, slot as in the arena */
  e->h_ids = ha(sizeof(int32_t) * (size_t)e->R);
  if (!e->h_tok || !e->h_ids) { st = CT_ERR_NOMEM; goto fail; }
  e->h_pos = (int32_t *)((char *)e->h_tok + (a0->pos - a0->tok));
  e->h_slot = (int32_t *)((char *)e->h_tok + (a0->slot - a0->tok));
  const char *av = getenv("CT_DECODE_AHEAD");
  if (e->n_dev == 1 && e->graphs != 0 && e->pinned && ops->argmax_advance && ops->event_new &&
      ops->to_host_async && !(av && !strcmp(av, "0"))) {
    e->ahead_slots = malloc(sizeof(int) * (size_t)e->S);
    e->ahead_tok = malloc(sizeof(int32_t) * (size_t)e->S);
    for (int i = 0; i < 2; i++) {
      e->h_ab[i] = ha(sizeof(int32_t) * (size_t)e->S);
      e->ev[i] = ops->event_new();
    }
    if (!e->ahead_slots || !e->ahead_tok || !e->h_ab[0] || !e->h_ab[1] || !e->ev[0] || !e->ev[1]) {
      st = ct_set_error(CT_ERR_NOMEM, "decoding ahead: out of memory (pinned buffers or events)");
      goto fail;
    }
    const char *zc = getenv("CT_DECODE_ZEROCOPY");
    if (ops->host_alloc_mapped && !(zc && !strcmp(zc, "0"))) { /* else the copies into h_ab */
      void *dm = NULL;
      e->h_map = ops->host_alloc_mapped(sizeof(int32_t) * 2 * (size_t)e->S, &dm);
      e->d_map = e->h_map ? dm : NULL;
    }
    e->ahead_ok = true;
  }
  infer_warm(e);
  *out = e;
  return CT_OK;
fail:
  ct_infer_destroy(e);
  return st;
}

void ct_infer_settle(ct_infer *e) { ahead_drop(e); }

void ct_infer_reset(ct_infer *e, int slot) {
  ahead_drop(e);
  e->len[slot] = 0;
}
int ct_infer_len(const ct_infer *e, int slot) { return e->len[slot]; }
int ct_infer_capacity(const ct_infer *e) { return e->max_T; }
ct_model *ct_infer_model(const ct_infer *e) { return e->m; }
int ct_infer_max_rows(const ct_infer *e) { return e->R; }
long ct_infer_graph_steps(const ct_infer *e) { return e->graph_steps; }
long ct_infer_ahead_steps(const ct_infer *e) { return e->ahead_steps; }

void ct_infer_describe(const ct_infer *e, char *buf, size_t cap) {
  const ct_model *m = e->m;
  size_t at = 0;
  buf[0] = 0;
  const size_t ab = (size_t)e->ops->act_bytes;
  const double kv = 2.0 * e->S * m->KV * e->max_T * m->hd * ab / 1073741824.0;
  for (int i = 0; i < e->n_dev && at < cap; i++) {
    const infer_dev *d = &e->d[i];
    char name[32];
    if (d->dev >= 0) snprintf(name, sizeof name, "cuda:%d", d->dev);
    else snprintf(name, sizeof name, "%s", e->ops->name);
    at += (size_t)snprintf(buf + at, cap - at, "%s%s: layers %d-%d%s%s, %.3f GiB weights, %.3f GiB"
                           " KV cache, %.1f MiB activations", i ? "\n" : "", name, d->l0,
                           d->l1 - 1, d->first ? " + embedding" : "", d->last ? " + head" : "",
                           ((d->hi - d->lo) * ab + (d->head ? (size_t)m->Vp * m->C * ab : 0)) /
                               1073741824.0,
                           kv * (d->l1 - d->l0), d->a.bytes / 1048576.0);
  }
}

static void infer_norm(const ct_infer *e, infer_dev *d, void *out, const void *inp, const void *w,
                       const void *b, int N) {
  const ct_model *m = e->m;
  const ct_ops *o = e->ops;
  const float eps = (float)m->cfg.norm_eps;
  if (m->gpt2 && o->layernorm_rows_fwd)
    o->layernorm_rows_fwd(out, inp, w, b, N, m->C, eps);
  else if (m->gpt2)
    o->layernorm_fwd(out, DAF(d, mean), DAF(d, rstd), inp, w, b, N, m->C, eps);
  else if (o->rmsnorm_rows_fwd)
    o->rmsnorm_rows_fwd(out, inp, w, N, m->C, eps);
  else
    o->rmsnorm_fwd(out, DAF(d, rstd), inp, w, N, m->C, N, 0, eps);
}

/* The decode-step fusions apply: a llama-style layer (RMSNorm, SwiGLU) on a table that has them. */
static bool infer_fused(const ct_infer *e) {
  const ct_ops *o = e->ops;
  return !e->m->gpt2 && o->norm_matmul_fwd && o->norm_matmul_swiglu_fwd && o->matmul_add_fwd &&
         o->qkv_rope_append;
}

/* What attention's L2 hint names (a measurement, CT_DECODE_PREFETCH, read at each uncaptured
 * step of a backend with hints, so a test can switch it): 0 the output projection's and gate/up
 * weights, 1 the down projection's ("down"), 2 those and the next layer's qkv weights
 * ("downqkv"), 3 gate/up's alone ("gu"); 4 ("ogu"): no hint for attention, gate/up's weights for
 * the output projection's GEMV, and no other; 5 ("ogud") as 4 with the down projection's weights
 * too. The backend decides whether a kernel takes it. */
static int prefetch_target(void) {
  const char *v = getenv("CT_DECODE_PREFETCH");
  if (!v) return 0;
  return !strcmp(v, "down") ? 1 : !strcmp(v, "downqkv") ? 2 : !strcmp(v, "gu") ? 3
                                                           : !strcmp(v, "ogu") ? 4
                                                           : !strcmp(v, "ogud") ? 5 : 0;
}

/* A decode step's layer through the fused ops (ops.h): norm + qkv projection, qk norm + rope +
 * cache append, attention, output projection + residual, norm + gate/up + SwiGLU, down
 * projection + residual. The same values as infer_layer's plain ops up to the order of sums. */
static void infer_layer_fused(ct_infer *e, infer_dev *d, int l, int N) {
  const ct_model *m = e->m;
  const ct_ops *o = e->ops;
  const int C = m->C, H = m->H, KV = m->KV, hd = m->hd, W = m->W, F = m->F;
  const float eps = (float)m->cfg.norm_eps;
  const size_t ab = (size_t)o->act_bytes;
  /* L2 hints (ops.h): each op's first kernel asks the weights of the GEMV two kernels later
   * into L2; cleared after the op, so a hint never outlives the op it was meant for */
#define HINT(p, bytes) \
  do { if (o->l2_hint) o->l2_hint(p, bytes); } while (0)
  char *x = DA(d, x), *ln = DA(d, ln), *qkv = DA(d, qkv), *res2 = DA(d, res2);
  char *raw = m->cfg.qk_norm ? DA(d, raw) : qkv, *atty = DA(d, atty);
  const int32_t *pos = DAI(d, pos), *slot = DAI(d, slot);
  const void *qn = m->cfg.qk_norm ? DW(d, l, P_QNORM) : NULL;
  const void *kn = m->cfg.qk_norm ? DW(d, l, P_KNORM) : NULL;
  const float theta = (float)m->cfg.rope_theta;
  const int tgt = o->l2_hint ? prefetch_target() : 0;
  /* the weights the L2 hints name: output projection, gate/up, down projection */
  const char *ow = DW(d, l, P_ATTO_W), *fw = DW(d, l, P_FC_W), *pw = DW(d, l, P_PROJ_W);
  const size_t fb = (size_t)2 * F * C * ab, pb = (size_t)F * C * ab;
  /* norm + qkv projection + attention as one kernel where the table has it (one row, opt-in) */
  const bool with_qkv =
      o->attention_decode_qkv &&
      o->attention_decode_qkv(atty, raw, x, DW(d, l, P_LN1_W), DW(d, l, P_QKV_W),
                              DWO(d, l, P_QKV_B), qn, kn, e->kc[l], e->vc[l], slot, pos, N, C, H,
                              KV, hd, e->max_T, theta, eps) <= 0;
  if (tgt < 4) HINT(ow, (size_t)C * H * hd * ab);
  if (!with_qkv)
    o->norm_matmul_fwd(raw, ln, x, DW(d, l, P_LN1_W), DW(d, l, P_QKV_W), DWO(d, l, P_QKV_B), N, C,
                       W, eps);
  { /* for attention: the output projection's and gate/up weights, one span where the layer's
     * parameters lie in that order (CT_DECODE_PREFETCH=att prefetches only here); with
     * CT_DECODE_PREFETCH=down / downqkv the down projection's weights instead, or those and the
     * next layer's qkv weights where they follow them (the GEMVs whose blocks start late) */
    if (tgt >= 4) HINT(NULL, 0);
    else if (tgt == 3) HINT(fw, fb);
    else if (tgt >= 1) { /* one span from the down weights to the end of the next qkv weights, where
                      * they follow within 64 MB (the layers of a device lie in order) */
      const char *qw = tgt == 2 && l + 1 < d->l1 ? DW(d, l + 1, P_QKV_W) : NULL;
      const size_t qb = (size_t)W * C * ab;
      if (qw && qw > pw && (size_t)(qw - pw) < pb + ((size_t)64 << 20)) HINT(pw, (size_t)(qw - pw) + qb);
      else HINT(pw, pb);
    } else if (fw > ow) HINT(ow, (size_t)(fw - ow) + fb);
    else HINT(fw, fb);
  }
  /* attention with the output projection, or attention, as one kernel where the table has it
   * (< 0: a device error, reported by the backend's check) */
  const bool with_proj =
      !with_qkv && o->attention_decode_oproj &&
      o->attention_decode_oproj(res2, raw, qn, kn, e->kc[l], e->vc[l], slot, pos,
                                DW(d, l, P_ATTO_W), DWO(d, l, P_ATTO_B), x, N, H, KV, hd, C,
                                e->max_T, theta, eps) <= 0;
  if (!with_qkv && !with_proj &&
      (!o->attention_decode_rope ||
       o->attention_decode_rope(atty, raw, qn, kn, e->kc[l], e->vc[l], slot, pos, N, H, KV, hd,
                                e->max_T, theta, eps) > 0)) {
    o->qkv_rope_append(qkv, raw, qn, kn, e->kc[l], e->vc[l], slot, pos, N, H, KV, hd, e->max_T,
                       theta, eps);
    o->attention_decode(atty, qkv, e->kc[l], e->vc[l], slot, pos, N, H, KV, hd, e->max_T);
  }
  if (tgt >= 4) { /* the MLP's weights: gate/up's, with 5 the down projection's where they follow */
    if (tgt == 5 && pw > fw && (size_t)(pw - fw) < fb + ((size_t)64 << 20))
      HINT(fw, (size_t)(pw - fw) + pb);
    else
      HINT(fw, fb);
  } else {
    HINT(pw, pb);
  }
  if (!with_proj)
    o->matmul_add_fwd(res2, atty, DW(d, l, P_ATTO_W), DWO(d, l, P_ATTO_B), x, N, H * hd, C);
  /* the next layer's qkv weights, when that layer is on this device */
  if (l + 1 < d->l1 && tgt < 4) HINT(DW(d, l + 1, P_QKV_W), (size_t)W * C * ab);
  o->norm_matmul_swiglu_fwd(DA(d, act), DA(d, fch), ln, res2, DW(d, l, P_LN2_W), DW(d, l, P_FC_W),
                            N, C, F, eps);
  HINT(NULL, 0);
  o->matmul_add_fwd(x, DA(d, act), DW(d, l, P_PROJ_W), DWO(d, l, P_PROJ_B), res2, N, F, C);
#undef HINT
}

/* One layer over N rows whose positions and slots are in d's pos / slot buffers. Attention:
 * decode (one row per sequence): attention_decode; prefill from position 0 of nseq sequences of
 * n rows: attention_fwd (causal, eval); prefill after position p0 > 0: attention_cached. */
static void infer_layer(ct_infer *e, infer_dev *d, int l, int N, bool decode, int nseq, int n,
                        int p0, const int *slots) {
  const ct_model *m = e->m;
  const ct_ops *o = e->ops;
  const int C = m->C, H = m->H, KV = m->KV, hd = m->hd, W = m->W, F = m->F;
  const size_t ab = (size_t)e->ops->act_bytes;
  const float eps = (float)m->cfg.norm_eps;
  char *x = DA(d, x), *ln = DA(d, ln), *qkv = DA(d, qkv), *res2 = DA(d, res2), *tmp = DA(d, tmp);
  const int32_t *pos = DAI(d, pos), *slot = DAI(d, slot);
  /* a decode step's products through the table's row GEMV where it has one (ops.h) */
  void (*mm)(void *, const void *, const void *, const void *, int, int, int) =
      decode && o->matmul_rows_fwd ? o->matmul_rows_fwd : o->matmul_fwd;
  /* a GPT-2 decode step's norms inside the products after them (ops.h layernorm_matmul_fwd) */
  const bool lnmm = decode && m->gpt2 && !m->cfg.qk_norm && o->layernorm_matmul_fwd;
  if (!lnmm) infer_norm(e, d, ln, x, DW(d, l, P_LN1_W), DWO(d, l, P_LN1_B), N);
  if (lnmm) {
    o->layernorm_matmul_fwd(qkv, NULL, ln, x, DW(d, l, P_LN1_W), DWO(d, l, P_LN1_B),
                            DW(d, l, P_QKV_W), DWO(d, l, P_QKV_B), N, C, W, 0, eps);
  } else if (m->cfg.qk_norm) {
    char *raw = DA(d, raw);
    mm(raw, ln, DW(d, l, P_QKV_W), DWO(d, l, P_QKV_B), N, C, W);
    const size_t row = (size_t)W * ab, v0 = (size_t)(H + KV) * hd;
    o->copy2d(qkv + v0 * ab, row, raw + v0 * ab, row, (size_t)KV * hd * ab, (size_t)N);
    o->rmsnorm_fwd(qkv, DAF(d, qn), raw, DW(d, l, P_QNORM), N * H, hd, H, W, eps);
    o->rmsnorm_fwd(qkv + (size_t)H * hd * ab, DAF(d, kn), raw + (size_t)H * hd * ab,
                   DW(d, l, P_KNORM), N * KV, hd, KV, W, eps);
  } else {
    mm(qkv, ln, DW(d, l, P_QKV_W), DWO(d, l, P_QKV_B), N, C, W);
  }
  if (!m->gpt2) o->rope_pos_fwd(qkv, pos, N, H, KV, hd, (float)m->cfg.rope_theta);
  o->kv_append(e->kc[l], e->vc[l], qkv, slot, pos, N, H, KV, hd, e->max_T);
  char *atty = DA(d, atty);
  if (decode) {
    o->attention_decode(atty, qkv, e->kc[l], e->vc[l], slot, pos, N, H, KV, hd, e->max_T);
  } else if (p0 == 0) {
    o->attention_fwd(atty, DAF(d, att), qkv, nseq, n, H, KV, hd);
  } else {
    const size_t seq = (size_t)KV * e->max_T * hd * ab;
    for (int b = 0; b < nseq; b++)
      o->attention_cached(atty + (size_t)b * n * H * hd * ab, qkv + (size_t)b * n * W * ab,
                          e->kc[l] + slots[b] * seq, e->vc[l] + slots[b] * seq, n, p0, H, KV, hd,
                          e->max_T);
  }
  /* a decode step's residual products through the table's product + residual fusion (ops.h:
   * the same values as mm then add_fwd; CUDA: one GEMV kernel instead of two kernels) */
  const bool madd = decode && o->matmul_add_fwd;
  if (madd) {
    o->matmul_add_fwd(res2, atty, DW(d, l, P_ATTO_W), DWO(d, l, P_ATTO_B), x, N, H * hd, C);
  } else {
    mm(res2, atty, DW(d, l, P_ATTO_W), DWO(d, l, P_ATTO_B), N, H * hd, C);
    o->add_fwd(res2, res2, x, (size_t)N * C);
  }
  if (!lnmm) infer_norm(e, d, ln, res2, DW(d, l, P_LN2_W), DWO(d, l, P_LN2_B), N);
  if (lnmm) {
    o->layernorm_matmul_fwd(DA(d, act), DA(d, fch), ln, res2, DW(d, l, P_LN2_W),
                            DWO(d, l, P_LN2_B), DW(d, l, P_FC_W), DWO(d, l, P_FC_B), N, C, F, 1,
                            eps);
  } else if (m->gpt2 && decode && o->matmul_gelu_rows_fwd) {
    o->matmul_gelu_rows_fwd(DA(d, act), DA(d, fch), ln, DW(d, l, P_FC_W), DWO(d, l, P_FC_B), N, C,
                            F);
  } else if (m->gpt2) {
    mm(DA(d, fch), ln, DW(d, l, P_FC_W), DWO(d, l, P_FC_B), N, C, F);
    o->gelu_fwd(DA(d, act), DA(d, fch), (size_t)N * F);
  } else {
    mm(DA(d, fch), ln, DW(d, l, P_FC_W), NULL, N, C, 2 * F);
    o->swiglu_fwd(DA(d, act), DA(d, fch), N, F);
  }
  if (madd) {
    o->matmul_add_fwd(x, DA(d, act), DW(d, l, P_PROJ_W), DWO(d, l, P_PROJ_B), res2, N, F, C);
  } else {
    mm(tmp, DA(d, act), DW(d, l, P_PROJ_W), DWO(d, l, P_PROJ_B), N, F, C);
    o->add_fwd(x, tmp, res2, (size_t)N * C);
  }
}

/* Everything device d does for one forward: [embedding], its layers, [final norm, head,
 * argmax]. rows: N; outputs of the last device: logits of `nout` rows and their argmax. */
static void infer_segment(ct_infer *e, infer_dev *d, int N, bool decode, int nseq, int n, int p0,
                          const int *slots) {
  const ct_model *m = e->m;
  const ct_ops *o = e->ops;
  const int G = m->cfg.n_layer, C = m->C;
  const size_t ab = (size_t)e->ops->act_bytes;
  if (d->first)
    o->embed_pos_fwd(DA(d, x), DAI(d, tok), DAI(d, pos), DW(d, G, P_WTE), DWO(d, G, P_WPE), N, C);
  const bool fused = infer_fused(e);
  int l_done = d->l0;
  if (decode && fused && N == 1 && o->decode_layers && d->l1 - d->l0 <= 96) {
    /* one row: the device's layers in one call (CUDA: one persistent kernel) */
    ct_decode_layer L[96];
    for (int l = d->l0; l < d->l1; l++)
      L[l - d->l0] = (ct_decode_layer){DW(d, l, P_LN1_W), DW(d, l, P_QKV_W), DWO(d, l, P_QKV_B),
                                       m->cfg.qk_norm ? DW(d, l, P_QNORM) : NULL,
                                       m->cfg.qk_norm ? DW(d, l, P_KNORM) : NULL,
                                       DW(d, l, P_ATTO_W), DWO(d, l, P_ATTO_B), DW(d, l, P_LN2_W),
                                       DW(d, l, P_FC_W), DW(d, l, P_PROJ_W), DWO(d, l, P_PROJ_B),
                                       e->kc[l], e->vc[l]};
    char *raw = m->cfg.qk_norm ? DA(d, raw) : DA(d, qkv);
    if (o->decode_layers(DA(d, x), DA(d, res2), raw, DA(d, qkv), DA(d, atty), DA(d, act), L,
                         d->l1 - d->l0, DAI(d, slot), DAI(d, pos), C, m->H, m->KV, m->hd, m->F,
                         e->max_T, (float)m->cfg.rope_theta, (float)m->cfg.norm_eps) == 0)
      l_done = d->l1;
  }
  for (int l = l_done; l < d->l1; l++) {
    if (decode && fused) infer_layer_fused(e, d, l, N);
    else infer_layer(e, d, l, N, decode, nseq, n, p0, slots);
  }
  if (!d->last) return;
  const char *h = DA(d, x);
  if (!decode && n > 1) { /* each sequence's last row */
    o->copy2d(DA(d, last), (size_t)C * ab, DA(d, x) + (size_t)(n - 1) * C * ab,
              (size_t)n * C * ab, (size_t)C * ab, (size_t)nseq);
    h = DA(d, last);
  }
  const char *head = m->cfg.tie_embeddings ? (d->head ? d->head : DW(d, G, P_WTE))
                                           : DW(d, G, P_LM_HEAD);
  const bool advance = decode && e->ahead_ok; /* one device: the next step's inputs from its ids */
  if (fused && nseq == 1 && o->norm_matmul_argmax &&
      o->norm_matmul_argmax(DA(d, logits), h, DW(d, G, P_LNF_W), head, C, m->Vp,
                            (float)m->cfg.norm_eps, DAI(d, ids), advance ? DAI(d, tok) : NULL,
                            advance ? DAI(d, pos) : NULL, advance ? e->d_map : NULL,
                            m->cfg.vocab_size) <= 0)
    return; /* final norm + head + argmax as one kernel (< 0: reported by the backend's check) */
  if (fused) { /* final norm + head in one pass over the head's weights */
    o->norm_matmul_fwd(DA(d, logits), DA(d, lnf), h, DW(d, G, P_LNF_W), head, NULL, nseq, C,
                       m->Vp, (float)m->cfg.norm_eps);
  } else {
    infer_norm(e, d, DA(d, lnf), h, DW(d, G, P_LNF_W), DWO(d, G, P_LNF_B), nseq);
    (o->matmul_rows_fwd ? o->matmul_rows_fwd : o->matmul_fwd)(DA(d, logits), DA(d, lnf), head,
                                                              NULL, nseq, C, m->Vp);
  }
  if (advance)
    o->argmax_advance(DAI(d, ids), DAI(d, tok), DAI(d, pos), e->d_map, DA(d, logits), nseq,
                      m->cfg.vocab_size, m->Vp);
  else
    o->argmax_rows(DAI(d, ids), DA(d, logits), nseq, m->cfg.vocab_size, m->Vp);
}

static ct_status infer_check_tokens(const ct_infer *e, const int32_t *t, int n) {
  for (int i = 0; i < n; i++)
    if (t[i] < 0 || t[i] >= e->m->cfg.vocab_size)
      return ct_set_error(CT_ERR_INPUT, "token %d outside the vocabulary [0, %d)", t[i],
                          e->m->cfg.vocab_size);
  return CT_OK;
}

/* Uploads tokens / positions / slots (N rows) to device d: the host staging buffer mirrors the
 * arena's tok, pos, slot span, so this is one copy (one synchronization) per step. */
static void infer_upload_rows(ct_infer *e, infer_dev *d, int N) {
  e->ops->to_device(DA(d, tok), e->h_tok, d->a.slot - d->a.tok + sizeof(int32_t) * (size_t)N);
}

static void infer_hop(ct_infer *e, infer_dev *d, int N) {
  infer_dev *next = d + 1;
  e->ops->copy_peer(DA(next, x), next->dev, DA(d, x), d->dev,
                    (size_t)N * e->m->C * (size_t)e->ops->act_bytes);
}

static ct_status infer_outputs(ct_infer *e, int nseq, float *logits, int32_t *ids) {
  const ct_ops *o = e->ops;
  infer_dev *d = &e->d[e->n_dev - 1];
  if (ids) {
    if (o->to_host_async) {
      o->to_host_async(e->h_ids, DAI(d, ids), sizeof(int32_t) * (size_t)nseq);
      o->sync();
    } else {
      o->to_host(e->h_ids, DAI(d, ids), sizeof(int32_t) * (size_t)nseq);
    }
    memcpy(ids, e->h_ids, sizeof(int32_t) * (size_t)nseq);
  }
  if (logits) o->to_host_f32(logits, DA(d, logits), (size_t)nseq * e->m->Vp);
  infer_set(e, &e->d[0]);
  return CT_OK;
}

ct_status ct_infer_prefill(ct_infer *e, int nseq, const int *slots, const int32_t *tokens, int n,
                           float *logits, int32_t *ids) {
  if (nseq <= 0 || n <= 0 || nseq > e->S || (long)nseq * n > e->R)
    return ct_set_error(CT_ERR_RUNTIME, "prefill of %d x %d tokens: at most %d sequences and %d"
                        " rows", nseq, n, e->S, e->R);
  ahead_drop(e);
  const int p0 = e->len[slots[0]];
  for (int b = 0; b < nseq; b++) {
    if (slots[b] < 0 || slots[b] >= e->S || e->len[slots[b]] != p0)
      return ct_set_error(CT_ERR_RUNTIME, "prefill: slot %d (length %d) is not at position %d",
                          slots[b], slots[b] >= 0 && slots[b] < e->S ? e->len[slots[b]] : -1, p0);
  }
  if (p0 + n > e->max_T)
    return ct_set_error(CT_ERR_RUNTIME, "prefill: %d + %d tokens exceed the cache (%d per"
                        " sequence)", p0, n, e->max_T);
  CT_TRY(infer_check_tokens(e, tokens, nseq * n));
  const int N = nseq * n;
  memcpy(e->h_tok, tokens, sizeof(int32_t) * (size_t)N);
  for (int b = 0; b < nseq; b++)
    for (int t = 0; t < n; t++) {
      e->h_pos[b * n + t] = p0 + t;
      e->h_slot[b * n + t] = slots[b];
    }
  for (int i = 0; i < e->n_dev; i++) {
    infer_dev *d = &e->d[i];
    if (infer_set(e, d) != 0) return ct_set_error(CT_ERR_RUNTIME, "cannot use device %d", d->dev);
    infer_upload_rows(e, d, N);
    infer_segment(e, d, N, false, nseq, n, p0, slots);
    if (!d->last) infer_hop(e, d, N);
  }
  for (int b = 0; b < nseq; b++) e->len[slots[b]] += n;
  return infer_outputs(e, nseq, logits, ids);
}

/* Queues the copy of the last queued step's ids into h_ab[buf] (none where the argmax writes
 * them into h_map itself), then ev[buf]. */
static void ids_to_host(ct_infer *e, int nseq, int buf) {
  if (!e->h_map)
    e->ops->to_host_async(e->h_ab[buf], DAI(&e->d[0], ids), sizeof(int32_t) * (size_t)nseq);
  e->ops->event_record(e->ev[buf]);
}

/* Queues the captured nseq-row step again (its tokens and positions advanced on the device by
 * the step before) and its ids' copy into h_ab[buf]: the step ahead. */
static void ahead_queue(ct_infer *e, int nseq, int buf) {
  e->ops->graph_launch(e->d[0].graph[nseq]);
  ids_to_host(e, nseq, buf);
  e->ahead_n = nseq;
  e->graph_steps++;
}

/* Waits for the step whose ids go to h_ab[buf] and returns them in ids; they are also the tokens
 * of the step queued behind it (in h_ab[buf ^ 1]). The rows' lengths grow by that step. */
static void ahead_take(ct_infer *e, int nseq, const int *slots, int buf, int32_t *ids) {
  const size_t tb = sizeof(int32_t) * (size_t)nseq;
  e->ops->event_wait(e->ev[buf]);
  if (e->h_map) {
    const volatile int32_t *hm = e->h_map;
    for (int b = 0; b < nseq; b++) ids[b] = hm[((e->len[slots[b]] + 1) & 1) * nseq + b];
  } else {
    memcpy(ids, e->h_ab[buf], tb);
  }
  memcpy(e->ahead_tok, ids, tb);
  e->ahead_buf = buf ^ 1;
  for (int b = 0; b < nseq; b++) e->len[slots[b]]++;
}

ct_status ct_infer_decode(ct_infer *e, int nseq, const int *slots, const int32_t *tokens,
                          float *logits, int32_t *ids) {
  if (nseq <= 0 || nseq > e->S)
    return ct_set_error(CT_ERR_RUNTIME, "decode of %d sequences: at most %d", nseq, e->S);
  for (int b = 0; b < nseq; b++) {
    if (slots[b] < 0 || slots[b] >= e->S)
      return ct_set_error(CT_ERR_RUNTIME, "decode: slot %d outside [0, %d)", slots[b], e->S);
    if (e->len[slots[b]] + 1 > e->max_T)
      return ct_set_error(CT_ERR_RUNTIME, "decode: sequence %d is full (%d tokens)", slots[b],
                          e->max_T);
    for (int c = 0; c < b; c++)
      if (slots[c] == slots[b])
        return ct_set_error(CT_ERR_RUNTIME, "decode: slot %d appears twice", slots[b]);
  }
  CT_TRY(infer_check_tokens(e, tokens, nseq));
  const ct_ops *o = e->ops;
  /* greedy ids on one device: decode ahead when the captured step exists and both this step and
   * the one after it fit the cache */
  const bool greedy = e->ahead_ok && !logits && ids;
  bool ahead = greedy;
  for (int b = 0; ahead && b < nseq; b++) ahead = e->len[slots[b]] + 2 <= e->max_T;
  if (e->ahead_n) {
    if (greedy && e->ahead_n == nseq && !memcmp(e->ahead_slots, slots, sizeof(int) * (size_t)nseq) &&
        !memcmp(e->ahead_tok, tokens, sizeof(int32_t) * (size_t)nseq)) { /* in flight: this one */
      const int buf = e->ahead_buf;
      e->ahead_n = 0;
      if (ahead) ahead_queue(e, nseq, buf ^ 1); /* the next, before waiting for this one */
      ahead_take(e, nseq, slots, buf, ids);
      e->ahead_steps++;
      return CT_OK;
    }
    ahead_drop(e);
  }
  memcpy(e->h_tok, tokens, sizeof(int32_t) * (size_t)nseq);
  for (int b = 0; b < nseq; b++) {
    e->h_pos[b] = e->len[slots[b]];
    e->h_slot[b] = slots[b];
  }
  for (int i = 0; i < e->n_dev; i++) {
    infer_dev *d = &e->d[i];
    if (infer_set(e, d) != 0) return ct_set_error(CT_ERR_RUNTIME, "cannot use device %d", d->dev);
    infer_upload_rows(e, d, nseq);
    bool ran = false;
    if (e->graphs != 0) {
      if (!d->graph[nseq] && d->seen[nseq]) { /* steady shape: capture it */
        o->graph_begin();
        infer_segment(e, d, nseq, true, nseq, 1, 0, slots);
        void *g = o->graph_end();
        if (!g) /* the backend recorded why; its error is sticky */
          return ct_set_error(CT_ERR_RUNTIME, "CUDA graph capture of a %d-row decode step failed"
                              " (--cuda_graphs off decodes without graphs)", nseq);
        d->graph[nseq] = g;
      }
      if (d->graph[nseq]) {
        o->graph_launch(d->graph[nseq]);
        ran = true;
        if (d->last) e->graph_steps++;
      }
    }
    if (!ran) {
      infer_segment(e, d, nseq, true, nseq, 1, 0, slots);
      d->seen[nseq] = 1;
    }
    if (!d->last) infer_hop(e, d, nseq);
  }
  if (ahead && e->d[0].graph[nseq]) { /* this step's ids, then the step after it */
    ids_to_host(e, nseq, 0);
    memcpy(e->ahead_slots, slots, sizeof(int) * (size_t)nseq);
    ahead_queue(e, nseq, 1);
    ahead_take(e, nseq, slots, 0, ids);
    return CT_OK;
  }
  for (int b = 0; b < nseq; b++) e->len[slots[b]]++;
  return infer_outputs(e, nseq, logits, ids);
}

ct_status ct_infer_loss(ct_infer *e, int nseq, const int32_t *inputs, const int32_t *targets,
                        int T, double *sum, long *count) {
  const ct_model *m = e->m;
  const ct_ops *o = e->ops;
  const int N = nseq * T, C = m->C, G = m->cfg.n_layer, V = m->cfg.vocab_size;
  if (nseq <= 0 || T <= 0 || nseq > e->S || N > e->R || T > e->max_T)
    return ct_set_error(CT_ERR_RUNTIME, "evaluation of %d x %d tokens: at most %d sequences,"
                        " %d rows and %d tokens each", nseq, T, e->S, e->R, e->max_T);
  CT_TRY(infer_check_tokens(e, inputs, N));
  ahead_drop(e);
  for (int i = 0; i < N; i++)
    if (targets[i] >= V)
      return ct_set_error(CT_ERR_INPUT, "target token %d outside the vocabulary [0, %d)",
                          targets[i], V);
  int *slots = malloc(sizeof(int) * (size_t)nseq);
  float *losses = malloc(sizeof(float) * (size_t)N);
  if (!slots || !losses) {
    free(slots);
    free(losses);
    return ct_set_error(CT_ERR_NOMEM, "out of memory");
  }
  for (int b = 0; b < nseq; b++) {
    slots[b] = b;
    e->len[b] = 0;
  }
  memcpy(e->h_tok, inputs, sizeof(int32_t) * (size_t)N);
  for (int b = 0; b < nseq; b++)
    for (int t = 0; t < T; t++) {
      e->h_pos[b * T + t] = t;
      e->h_slot[b * T + t] = b;
    }
  ct_status st = CT_OK;
  for (int i = 0; i < e->n_dev && st == CT_OK; i++) {
    infer_dev *d = &e->d[i];
    if (infer_set(e, d) != 0) { st = ct_set_error(CT_ERR_RUNTIME, "cannot use device %d", d->dev); break; }
    infer_upload_rows(e, d, N);
    if (d->first)
      o->embed_pos_fwd(DA(d, x), DAI(d, tok), DAI(d, pos), DW(d, G, P_WTE), DWO(d, G, P_WPE), N, C);
    for (int l = d->l0; l < d->l1; l++) infer_layer(e, d, l, N, false, nseq, T, 0, slots);
    if (!d->last) {
      infer_hop(e, d, N);
      continue;
    }
    /* the head over every row, LR rows at a time; losses land in qn (R*H floats) */
    const size_t ab = (size_t)o->act_bytes;
    float *dl = DAF(d, qn);
    int32_t *dt = DAI(d, ids);
    o->to_device(dt, targets, sizeof(int32_t) * (size_t)N);
    const char *head = m->cfg.tie_embeddings ? (d->head ? d->head : DW(d, G, P_WTE))
                                             : DW(d, G, P_LM_HEAD);
    for (int r = 0; r < N; r += e->LR) {
      const int k = N - r < e->LR ? N - r : e->LR;
      infer_norm(e, d, DA(d, lnf), DA(d, x) + (size_t)r * C * ab, DW(d, G, P_LNF_W),
                 DWO(d, G, P_LNF_B), k);
      o->matmul_fwd(DA(d, logits), DA(d, lnf), head, NULL, k, C, m->Vp);
      o->xent_fwd_bwd(dl + r, DA(d, logits), dt + r, k, V, m->Vp, 0.0f);
    }
    o->to_host(losses, dl, sizeof(float) * (size_t)N);
  }
  infer_set(e, &e->d[0]);
  for (int b = 0; b < nseq; b++) e->len[b] = 0;
  for (int i = 0; st == CT_OK && i < N; i++)
    if (targets[i] >= 0) {
      *sum += losses[i];
      (*count)++;
    }
  free(slots);
  free(losses);
  return st;
}

/* ---- device map ---- */

/* "20GiB", "512MiB", "40GB", "1e9" -> bytes; false on bad syntax. */
static bool parse_bytes(const char *s, size_t len, double *out) {
  char buf[64];
  if (len == 0 || len >= sizeof buf) return false;
  memcpy(buf, s, len);
  buf[len] = 0;
  char *end = NULL;
  double v = strtod(buf, &end);
  if (end == buf || !(v >= 0)) return false;
  static const struct { const char *u; double f; } units[] = {
      {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcmp(end, units[i].u)) {
      *out = v * units[i].f;
      return true;
    }
  return false;
}

/* a --device_map's kind: all layers on one device, or spread by the planner */
enum { MAP_ONE, MAP_AUTO, MAP_BALANCED, MAP_SEQUENTIAL };

/* --max_memory "DEV=SIZE,...": its spelling, and with nd >= 0 each budget into budget / given
 * (a device at or past nd is an error; ndev, the devices visible, is what the message says);
 * nd < 0 checks the spelling alone. */
static ct_status parse_max_memory(const char *max_memory, int nd, int ndev, double *budget,
                                  bool *given) {
  for (const char *p = max_memory; p && *p;) {
    const char *comma = strchr(p, ',');
    const size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    char *end = NULL;
    double bytes = 0;
    const long dev = eq ? strtol(p, &end, 10) : -1;
    if (!eq || end != eq || dev < 0 || !parse_bytes(eq + 1, len - (size_t)(eq + 1 - p), &bytes))
      return ct_set_error(CT_ERR_USAGE, "--max_memory %s: expected DEVICE=SIZE[,DEVICE=SIZE...]"
                          " such as 0=20GiB,1=40GiB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                          max_memory);
    if (nd >= 0 && dev >= nd)
      return ct_set_error(CT_ERR_USAGE, "--max_memory %s: device %ld is not visible (%d device(s))",
                          max_memory, dev, ndev);
    if (nd >= 0) {
      budget[dev] = bytes;
      given[dev] = true;
    }
    p = comma ? comma + 1 : p + len;
  }
  return CT_OK;
}

/* The spelling of --device_map (its kind and, for "cuda:N" / "N", the device) and --max_memory,
 * before any device is asked about. */
static ct_status device_map_spelling(const char *spec, const char *max_memory, int *kind, int *one) {
  char *end = NULL;
  *one = 0;
  if (!strcmp(spec, "auto")) *kind = MAP_AUTO;
  else if (!strcmp(spec, "balanced")) *kind = MAP_BALANCED;
  else if (!strcmp(spec, "sequential")) *kind = MAP_SEQUENTIAL;
  else {
    const char *num = !strncmp(spec, "cuda:", 5) ? spec + 5 : spec;
    const long v = strtol(num, &end, 10);
    if (!num[0] || *end || v < 0 || v > 1 << 20)
      return ct_set_error(CT_ERR_USAGE, "--device_map %s: expected auto, balanced, sequential or"
                          " cuda:N", spec);
    *kind = MAP_ONE;
    *one = (int)v;
  }
  return parse_max_memory(max_memory, -1, 0, NULL, NULL);
}

ct_status ct_device_map_check(const char *spec, const char *max_memory) {
  int kind = MAP_AUTO, one = 0;
  return device_map_spelling(spec && spec[0] ? spec : "auto", max_memory, &kind, &one);
}

ct_status ct_infer_plan(const ct_model *m, const ct_ops *ops, const char *spec,
                        const char *max_memory, int max_seqs, int max_len, int max_rows,
                        int *layer_dev, char *report, size_t report_cap) {
  const int L = m->cfg.n_layer;
  const int ndev = ops->device_count ? ops->device_count() : 0;
  if (report && report_cap) report[0] = 0;
  if (!spec || !spec[0]) spec = "auto";
  int kind = MAP_AUTO, one = 0;
  CT_TRY(device_map_spelling(spec, max_memory, &kind, &one));
  if (ndev <= 0)
    return ct_set_error(CT_ERR_USAGE, "--device_map %s: no CUDA device is visible (backend %s)",
                        spec, ops->name);
  if (kind == MAP_ONE && one >= ndev)
    return ct_set_error(CT_ERR_USAGE, "--device_map %s: only %d CUDA device(s) visible", spec, ndev);

  double budget[INFER_MAX_DEV];
  const int nd = ndev < INFER_MAX_DEV ? ndev : INFER_MAX_DEV;
  bool given[INFER_MAX_DEV] = {false};
  CT_TRY(parse_max_memory(max_memory, nd, ndev, budget, given));
  for (int d = 0; d < nd; d++) {
    if (given[d]) continue;
    size_t fr = 0, tot = 0;
    if (!ops->device_memory || ops->device_memory(d, &fr, &tot) != 0)
      return ct_set_error(CT_ERR_RUNTIME, "device map: cannot read cuda:%d's free memory", d);
    budget[d] = 0.9 * (double)fr;
  }

  /* what each piece costs, bytes */
  const size_t ab = (size_t)ops->act_bytes;
  const int R = max_rows > max_seqs ? max_rows : max_seqs;
  const double kv = 2.0 * max_seqs * m->KV * (double)max_len * m->hd * ab;
  const double splits = (max_len + 15) / 16;
  const double fixed = (double)infer_layout(m, ops, R, max_seqs).bytes + 256.0 * 1048576.0 +
                       4.0 * max_seqs * m->Vp + 4.0 * max_seqs * m->H * splits * (m->hd + 2);
  const double pre = (double)layer_lo(m, 0) * ab, post = (double)(m->numel - layer_lo(m, L)) * ab;
  const double tied = m->cfg.tie_embeddings ? (double)m->Vp * m->C * ab : 0;
  double *lw = malloc(sizeof(double) * (size_t)L);
  if (!lw) return ct_set_error(CT_ERR_NOMEM, "out of memory");
  for (int l = 0; l < L; l++) lw[l] = (double)(layer_lo(m, l + 1) - layer_lo(m, l)) * ab + kv;

  /* cost of a given assignment per device; the first fit failure, if any */
  double need[INFER_MAX_DEV] = {0};
  int bad = -1;
#define EVAL()                                                                               \
  do {                                                                                       \
    for (int d = 0; d < nd; d++) need[d] = 0;                                                \
    for (int l = 0; l < L; l++) need[layer_dev[l]] += lw[l];                                 \
    const int f = layer_dev[0], la = layer_dev[L - 1];                                       \
    for (int d = 0; d < nd; d++)                                                             \
      if (need[d] > 0) need[d] += fixed;                                                     \
    need[f] += pre;                                                                          \
    need[la] += post + (la != f ? tied : 0);                                                 \
    bad = -1;                                                                                \
    for (int d = 0; d < nd; d++)                                                             \
      if (need[d] > budget[d] && bad < 0) bad = d;                                           \
  } while (0)

  const char *chosen = spec;
  const bool is_auto = kind == MAP_AUTO;
  bool placed = false;
  if (kind == MAP_ONE || is_auto) {
    for (int l = 0; l < L; l++) layer_dev[l] = one;
    EVAL();
    placed = kind == MAP_ONE || bad < 0;
    if (is_auto) chosen = "auto (one device)";
  }
  if (!placed && (kind == MAP_BALANCED || is_auto)) {
    const int n = nd < L ? nd : L;
    for (int l = 0; l < L; l++) layer_dev[l] = (int)((long)l * n / L);
    EVAL();
    placed = kind == MAP_BALANCED || bad < 0;
    if (is_auto) chosen = "auto (balanced)";
  }
  if (!placed) {
    int d = 0;
    double used = fixed + pre;
    for (int l = 0; l < L; l++) {
      /* the last layer brings the final norm and head with it (and the tied head's copy
       * where the embedding is on another device) */
      for (;;) {
        const double tail = l < L - 1 ? 0 : post + (l > 0 && d != layer_dev[0] ? tied : 0);
        if (d == nd - 1 || used + lw[l] + tail <= budget[d]) break;
        d++;
        used = fixed;
      }
      layer_dev[l] = d;
      used += lw[l];
    }
    EVAL();
    if (is_auto) chosen = "auto (sequential)";
  }
#undef EVAL
  free(lw);
  if (bad >= 0)
    return ct_set_error(CT_ERR_RUNTIME, "device map %s: the model does not fit: cuda:%d needs"
                        " %.2f GiB (weights, KV cache for %d x %d tokens, activations) but has"
                        " %.2f GiB%s", spec, bad, need[bad] / 1073741824.0, max_seqs, max_len,
                        budget[bad] / 1073741824.0,
                        given[bad] ? " (--max_memory)" : " (90% of its free memory)");
  if (report && report_cap) {
    size_t at = (size_t)snprintf(report, report_cap, "device_map %s:", chosen);
    for (int l = 0; l < L && at < report_cap;) {
      int k = l;
      while (k + 1 < L && layer_dev[k + 1] == layer_dev[l]) k++;
      at += (size_t)snprintf(report + at, report_cap - at, " cuda:%d layers %d-%d (%.2f of %.2f"
                             " GiB)%s", layer_dev[l], l, k, need[layer_dev[l]] / 1073741824.0,
                             budget[layer_dev[l]] / 1073741824.0, k + 1 < L ? ";" : "");
      l = k + 1;
    }
  }
  return CT_OK;
}
