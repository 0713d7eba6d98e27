/* Tensor-parallel slices and ZeRO units of the parameter table: ct_tp_cut takes exactly the
 * Megatron rows/columns (q, k, v heads with GQA, gate and up halves, output-projection columns,
 * vocabulary rows) out of a full flat buffer; pasting every rank's slice back rebuilds it; the
 * model's units tile the flat buffer and are padded to numel_multiple; a model whose dimensions
 * tp does not divide is a config error naming parallel.tensor. */
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "parallel/tp.h"
#include "trainer/config.h"
#include "trainer/model.h"

static const ct_param *find(const ct_model *m, const char *name) {
  const ct_param *p = ct_model_find_param(m, name);
  if (!p) fprintf(stderr, "no parameter %s\n", name);
  return p;
}

/* full[p][row][col] */
static float at(const ct_model *m, const float *buf, const char *name, int row, int col) {
  const ct_param *p = find(m, name);
  const int cols = p->ndim == 2 ? p->shape[1] : 1;
  return buf[p->offset + (size_t)row * cols + col];
}

int main(void) {
  ct_config cfg;
  CHECK(ct_config_load(NULL, 0, NULL, &cfg) == CT_OK);
  ct_model_cfg mc = cfg.model;
  snprintf(mc.arch, sizeof mc.arch, "llama");
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_kv_head = 2;
  mc.head_dim = 8;
  mc.d_model = 32;
  mc.d_ff = 64;
  mc.tie_embeddings = false;
  mc.qk_norm = true;
  mc.norm_eps = 1e-6;
  const ct_ops *cpu = ct_ops_cpu();
  ct_model *full = NULL;
  CHECK(ct_model_create(&mc, cpu, 1, 4, &full) == CT_OK);
  if (!full) return ct_test_finish();
  const size_t n = ct_model_numel(full);
  float *fb = malloc(n * sizeof(float)), *back = calloc(n, sizeof(float));
  for (size_t i = 0; i < n; i++) fb[i] = (float)i;
  const int T = 2, H = 4, KV = 2, hd = 8, F = 64, Vp = ct_model_padded_vocab(&mc);
  for (int k = 0; k < T; k++) {
    ct_model_cfg lc = mc;
    lc.tp_size = T;
    lc.tp_rank = k;
    ct_model *loc = NULL;
    CHECK(ct_model_create(&lc, cpu, 1, 4, &loc) == CT_OK);
    if (!loc) break;
    CHECK(ct_model_tp_size(loc) == T);
    float *lb = calloc(ct_model_numel(loc), sizeof(float));
    ct_tp_cut(full, fb, loc, lb, k);
    const char *qkv = "layers.1.self_attn.qkv_proj.weight";
    const int Hl = H / T * hd, KVl = KV / T * hd, Fl = F / T;
    CHECK(find(loc, qkv)->shape[0] == Hl + 2 * KVl && find(loc, qkv)->tp_split == CT_TP_QKV);
    for (int c = 0; c < 32; c += 7) {
      CHECK(at(loc, lb, qkv, 0, c) == at(full, fb, qkv, k * Hl, c));                  /* q heads */
      CHECK(at(loc, lb, qkv, Hl - 1, c) == at(full, fb, qkv, k * Hl + Hl - 1, c));
      CHECK(at(loc, lb, qkv, Hl, c) == at(full, fb, qkv, H * hd + k * KVl, c));       /* k heads */
      CHECK(at(loc, lb, qkv, Hl + KVl, c) == at(full, fb, qkv, (H + KV) * hd + k * KVl, c)); /* v */
      const char *gu = "layers.0.mlp.gate_up_proj.weight";
      CHECK(at(loc, lb, gu, 0, c) == at(full, fb, gu, k * Fl, c));                    /* gate */
      CHECK(at(loc, lb, gu, Fl, c) == at(full, fb, gu, F + k * Fl, c));               /* up */
      CHECK(at(loc, lb, "embed_tokens", 3, c) == at(full, fb, "embed_tokens", k * Vp / T + 3, c));
      CHECK(at(loc, lb, "lm_head", 0, c) == at(full, fb, "lm_head", k * Vp / T, c));
    }
    const char *o = "layers.0.self_attn.o_proj.weight", *down = "layers.1.mlp.down_proj.weight";
    CHECK(find(loc, o)->tp_split == CT_TP_COLS && find(loc, o)->shape[1] == Hl);
    CHECK(at(loc, lb, o, 5, 0) == at(full, fb, o, 5, k * Hl));
    CHECK(at(loc, lb, down, 31, Fl - 1) == at(full, fb, down, 31, k * Fl + Fl - 1));
    CHECK(at(loc, lb, "norm.weight", 0, 0) == at(full, fb, "norm.weight", 0, 0));
    CHECK(find(loc, "layers.0.self_attn.q_norm.weight")->tp_split == CT_TP_PARTIAL);
    CHECK(ct_tp_norm_weight(find(loc, "norm.weight"), T) == 0.5);
    CHECK(ct_tp_norm_weight(find(loc, qkv), T) == 1.0);
    ct_tp_paste(full, back, loc, lb, k);
    free(lb);
    ct_model_destroy(loc);
  }
  /* every parameter element comes back (padding between parameters is not a parameter) */
  size_t diff = 0;
  for (int i = 0; i < ct_model_n_params(full); i++) {
    const ct_param *p = ct_model_param(full, i);
    for (size_t j = 0; j < p->numel; j++) diff += back[p->offset + j] != fb[p->offset + j];
  }
  CHECK_MSG(diff == 0, "%zu elements differ after cut + paste over %d ranks", diff, T);

  /* units tile the buffer, each padded to numel_multiple */
  ct_model_cfg zc = mc;
  zc.numel_multiple = 48;
  ct_model *z = NULL;
  CHECK(ct_model_create(&zc, cpu, 1, 4, &z) == CT_OK);
  if (z) {
    size_t end = 0, off, un;
    CHECK(ct_model_n_units(z) == mc.n_layer + 2);
    for (int u = 0; u < ct_model_n_units(z); u++) {
      ct_model_unit(z, u, &off, &un);
      CHECK(off == end && un % 48 == 0 && un > 0);
      end = off + un;
    }
    CHECK(end == ct_model_numel(z));
    const ct_param *p = find(z, "layers.1.input_layernorm.weight");
    ct_model_unit(z, 2, &off, &un);
    CHECK(p->offset >= off && p->offset < off + un); /* layer 1 is unit 2 */
    ct_model_destroy(z);
  }

  /* dimensions tp does not divide: a config error naming the key */
  ct_model_cfg bad = mc;
  bad.tp_size = 4; /* 4 does not divide n_kv_head = 2 */
  ct_model *b = NULL;
  CHECK(ct_model_create(&bad, cpu, 1, 4, &b) == CT_ERR_CONFIG);
  CHECK(strstr(ct_last_error(), "parallel.tensor = 4") != NULL);
  free(fb);
  free(back);
  ct_model_destroy(full);
  return ct_test_finish();
}
