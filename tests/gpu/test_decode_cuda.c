/* GPU suite: the batched-inference ops of the CUDA tables (kernels/cuda/decode.cu) against the
 * CPU references (kernels/cpu/decode.c) on random inputs — rope at per-row positions, KV
 * append by (slot, position), attention of each row over its own slot's cache (lengths from 1
 * to past one split), embedding at per-row positions, row argmax — for the fp32 and bf16
 * tables; and a decode op sequence captured as a CUDA graph and replayed after the host
 * rewrites the positions equals running the ops directly, bit for bit. Model level: the
 * inference engine on the fp32 and bf16 CUDA tables (weights copied from a model built on the
 * CPU table; head_dim 128, so prefill runs the flash kernels) gives the CPU engine's logits for
 * a prefill and batched decode steps, also with the layers split over 2 GPUs. Exits 77 without
 * a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/ct_test.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "trainer/config.h"
#include "trainer/model.h"

enum { N = 5, H = 8, KV = 2, hd = 128, maxT = 300, S = 6, W = (H + 2 * KV) * hd, C = 64, V = 1000 };

static uint64_t rs = 7;
static float frand(void) {
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* host fp32 -> device in the table's dtype; device -> host fp32 */
static void *up(const ct_ops *o, const float *x, size_t n) {
  void *d = o->alloc(n * (size_t)o->act_bytes);
  float *tmp = o->alloc(n * sizeof(float));
  o->to_device(tmp, x, n * sizeof(float));
  o->cast_params(d, tmp, n);
  o->free(tmp);
  return d;
}
static void down(const ct_ops *o, float *x, const void *d, size_t n) { o->to_host_f32(x, d, n); }
/* the values the device holds (rounded to its dtype), for the CPU reference */
static void rounded(const ct_ops *o, float *x, size_t n) {
  void *d = up(o, x, n);
  down(o, x, d, n);
  o->free(d);
}

static void run(const ct_ops *o, double tol) {
  const ct_ops *c = ct_ops_cpu();
  const int32_t pos[N] = {0, 17, 299, 63, 64}, slot[N] = {3, 0, 5, 1, 2};
  const size_t nq = (size_t)N * W, nc = (size_t)S * KV * maxT * hd;
  float *qkv = malloc(nq * 4), *kc = malloc(nc * 4), *vc = malloc(nc * 4), *got = malloc(nc * 4);
  for (size_t i = 0; i < nq; i++) qkv[i] = frand();
  for (size_t i = 0; i < nc; i++) kc[i] = frand(), vc[i] = frand();
  rounded(o, qkv, nq);
  rounded(o, kc, nc);
  rounded(o, vc, nc);
  void *dq = up(o, qkv, nq), *dk = up(o, kc, nc), *dv = up(o, vc, nc);
  int32_t *dpos = o->alloc(sizeof pos), *dslot = o->alloc(sizeof slot);
  o->to_device(dpos, pos, sizeof pos);
  o->to_device(dslot, slot, sizeof slot);
  char what[96];
  /* rope */
  c->rope_pos_fwd(qkv, pos, N, H, KV, hd, 1e6f);
  o->rope_pos_fwd(dq, dpos, N, H, KV, hd, 1e6f);
  down(o, got, dq, nq);
  snprintf(what, sizeof what, "%s rope_pos_fwd", o->name);
  ct_check_close(what, got, qkv, nq, tol, 1e-6);
  memcpy(qkv, got, nq * 4); /* continue from the device's values */
  /* append */
  c->kv_append(kc, vc, qkv, slot, pos, N, H, KV, hd, maxT);
  o->kv_append(dk, dv, dq, dslot, dpos, N, H, KV, hd, maxT);
  down(o, got, dk, nc);
  CHECK_MSG(!memcmp(got, kc, nc * 4), "%s kv_append: keys differ", o->name);
  down(o, got, dv, nc);
  CHECK_MSG(!memcmp(got, vc, nc * 4), "%s kv_append: values differ", o->name);
  /* attention */
  float *ref = malloc((size_t)N * H * hd * 4);
  void *dout = o->alloc((size_t)N * H * hd * o->act_bytes);
  c->attention_decode(ref, qkv, kc, vc, slot, pos, N, H, KV, hd, maxT);
  o->attention_decode(dout, dq, dk, dv, dslot, dpos, N, H, KV, hd, maxT);
  down(o, got, dout, (size_t)N * H * hd);
  snprintf(what, sizeof what, "%s attention_decode", o->name);
  ct_check_close(what, got, ref, (size_t)N * H * hd, tol, 1e-6);
  /* graph: capture, rewrite positions, replay == direct */
  CHECK(o->graph_begin != NULL);
  o->graph_begin();
  o->attention_decode(dout, dq, dk, dv, dslot, dpos, N, H, KV, hd, maxT);
  void *g = o->graph_end();
  CHECK(g != NULL);
  const int32_t pos2[N] = {5, 100, 1, 250, 16};
  o->to_device(dpos, pos2, sizeof pos2);
  float *direct = malloc((size_t)N * H * hd * 4);
  o->attention_decode(dout, dq, dk, dv, dslot, dpos, N, H, KV, hd, maxT);
  down(o, direct, dout, (size_t)N * H * hd);
  o->zero(dout, (size_t)N * H * hd * o->act_bytes);
  if (g) o->graph_launch(g);
  down(o, got, dout, (size_t)N * H * hd);
  CHECK_MSG(!memcmp(got, direct, (size_t)N * H * hd * 4), "%s: graph replay differs", o->name);
  if (g) o->graph_destroy(g);
  /* embedding and argmax */
  float *wte = malloc((size_t)V * C * 4), *wpe = malloc((size_t)maxT * C * 4), *e = malloc(N * C * 4);
  for (size_t i = 0; i < (size_t)V * C; i++) wte[i] = frand();
  for (size_t i = 0; i < (size_t)maxT * C; i++) wpe[i] = frand();
  rounded(o, wte, (size_t)V * C);
  rounded(o, wpe, (size_t)maxT * C);
  const int32_t tok[N] = {3, 999, 0, 500, 3};
  int32_t *dtok = o->alloc(sizeof tok);
  o->to_device(dtok, tok, sizeof tok);
  void *dwte = up(o, wte, (size_t)V * C), *dwpe = up(o, wpe, (size_t)maxT * C);
  void *de = o->alloc((size_t)N * C * o->act_bytes);
  c->embed_pos_fwd(e, tok, pos, wte, wpe, N, C);
  o->to_device(dpos, pos, sizeof pos);
  o->embed_pos_fwd(de, dtok, dpos, dwte, dwpe, N, C);
  down(o, got, de, (size_t)N * C);
  snprintf(what, sizeof what, "%s embed_pos_fwd", o->name);
  ct_check_close(what, got, e, (size_t)N * C, tol, 1e-6);
  float *lg = malloc((size_t)N * 1024 * 4);
  for (size_t i = 0; i < (size_t)N * 1024; i++) lg[i] = frand();
  lg[2 * 1024 + 7] = lg[2 * 1024 + 900] = 4.0f; /* tie: lowest index */
  lg[3 * 1024 + 1010] = 9.0f;                   /* padding column */
  rounded(o, lg, (size_t)N * 1024);
  void *dl = up(o, lg, (size_t)N * 1024);
  int32_t want[N], am[N], *dam = o->alloc(sizeof am);
  c->argmax_rows(want, lg, N, V, 1024);
  o->argmax_rows(dam, dl, N, V, 1024);
  o->to_host(am, dam, sizeof am);
  CHECK_MSG(!memcmp(am, want, sizeof am), "%s argmax_rows: %d %d %d %d %d vs %d %d %d %d %d",
            o->name, am[0], am[1], am[2], am[3], am[4], want[0], want[1], want[2], want[3], want[4]);
  char err[512];
  CHECK_MSG(ct_cuda_check(err, sizeof err) == 0, "%s", err);
  void *dev[] = {dq, dk, dv, dpos, dslot, dout, dtok, dwte, dwpe, de, dl, dam};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) o->free(dev[i]);
  free(qkv); free(kc); free(vc); free(got); free(ref); free(direct); free(wte); free(wpe);
  free(e); free(lg);
}

/* prefill 3 prompts (lengths 20, 7, 20: two go together), then 4 batched decode steps; logits
 * of every output row appended to out (rows x Vp) */
static void engine_logits(ct_model *m, const ct_ops *o, const int *layer_dev, float *out) {
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = 3;
  ic.max_len = 40;
  ic.max_rows = 64;
  ic.layer_dev = layer_dev;
  ic.device = o == ct_ops_cpu() ? -1 : 0;
  ic.graphs = o == ct_ops_cpu() ? 0 : 1;
  ct_infer *e = NULL;
  CHECK(ct_infer_create(m, o, &ic, &e) == CT_OK);
  if (!e) return;
  const int Vp = ct_model_padded_vocab(ct_model_config(m));
  int32_t toks[40];
  for (int i = 0; i < 40; i++) toks[i] = (i * 37 + 11) % 300;
  const int s02[2] = {0, 2}, s1 = 1;
  int32_t pair[40];
  memcpy(pair, toks, 20 * 4);
  memcpy(pair + 20, toks + 20, 20 * 4);
  CHECK(ct_infer_prefill(e, 2, s02, pair, 20, out, NULL) == CT_OK);
  CHECK(ct_infer_prefill(e, 1, &s1, toks + 5, 7, out + 2 * (size_t)Vp, NULL) == CT_OK);
  for (int step = 0; step < 4; step++) {
    const int slots[3] = {2, 0, 1};
    int32_t t[3] = {toks[step], toks[step + 9], toks[step + 17]};
    CHECK(ct_infer_decode(e, 3, slots, t, out + (size_t)(3 + 3 * step) * Vp, NULL) == CT_OK);
  }
  ct_infer_destroy(e);
}

static void test_engine(void) {
  ct_config c;
  ct_config_defaults(&c);
  snprintf(c.model.arch, sizeof c.model.arch, "llama");
  c.model.n_layer = 2;
  c.model.d_model = 256;
  c.model.n_head = 2;
  c.model.n_kv_head = 1;
  c.model.vocab_size = 300;
  c.model.max_seq_len = 64;
  c.model.qk_norm = true;
  c.model.init_std = 0.05;
  c.train.seq_len = 64;
  CHECK(ct_config_validate(&c) == CT_OK);
  ct_model *m = NULL;
  CHECK(ct_model_create(&c.model, ct_ops_cpu(), 1, 1, &m) == CT_OK);
  if (!m) return;
  ct_model_init_weights(m, 3);
  const size_t Vp = (size_t)ct_model_padded_vocab(&c.model), rows = 15;
  float *ref = calloc(rows * Vp, 4), *got = calloc(rows * Vp, 4), *one = calloc(rows * Vp, 4);
  engine_logits(m, ct_ops_cpu(), NULL, ref);
  const ct_ops *tabs[2] = {ct_ops_cuda(), ct_ops_cuda_bf16()};
  const double tol[2] = {1e-4, 3e-2};
  for (int t = 0; t < 2; t++) {
    char what[96];
    memset(got, 0, rows * Vp * 4);
    engine_logits(m, tabs[t], NULL, got);
    snprintf(what, sizeof what, "engine %s vs CPU engine (prefill + batched decode)", tabs[t]->name);
    double err = ct_check_close(what, got, ref, rows * Vp, tol[t], 1e-6);
    printf("%s: normalized error %.2e\n", what, err);
    if (tabs[t]->device_count() >= 2) {
      const int split[2] = {0, 1};
      memcpy(one, got, rows * Vp * 4);
      engine_logits(m, tabs[t], split, got);
      CHECK_MSG(!memcmp(one, got, rows * Vp * 4), "engine %s: layers on 2 GPUs differ from one GPU",
                tabs[t]->name);
    }
  }
  free(ref);
  free(got);
  free(one);
  ct_model_destroy(m);
}

int main(void) {
  char err[512];
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if ((vis && !vis[0]) || ct_cuda_init(0, err, sizeof err) != 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  run(ct_ops_cuda(), 1e-5);
  run(ct_ops_cuda_bf16(), 2e-2);
  const ct_ops *o = ct_ops_cuda_bf16();
  if (o->device_count() >= 2) { /* a second device's state: same results there */
    CHECK(o->set_device(1) == 0);
    run(o, 2e-2);
    CHECK(o->set_device(0) == 0);
  }
  test_engine();
  ct_cuda_shutdown();
  return ct_test_finish();
}
