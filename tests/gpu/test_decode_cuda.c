/* GPU suite: the batched-inference ops of the CUDA tables (kernels/cuda/decode.cu) against the
 * CPU references (kernels/cpu/decode.c) on random inputs — rope at per-row positions, KV
 * append by (slot, position), attention of each row over its own slot's cache (lengths from 1
 * to past one split), embedding at per-row positions, row argmax — for the fp32 and bf16
 * tables; and a decode op sequence captured as a CUDA graph and replayed after the host
 * rewrites the positions equals running the ops directly, bit for bit. Model level: the
 * inference engine on the fp32 and bf16 CUDA tables (weights copied from a model built on the
 * CPU table; head_dim 128, so prefill runs the flash kernels) gives the CPU engine's logits for
 * a prefill and batched decode steps, also with the layers split over 2 GPUs. The decode-step
 * fusions (norm_matmul_fwd, norm_matmul_swiglu_fwd, matmul_add_fwd, qkv_rope_append) and the
 * row products of the layers without them (matmul_rows_fwd, matmul_gelu_rows_fwd) against
 * the CPU compositions over a table of shapes (each GEMV variant, row counts 1..8 and past the
 * GEMV's 8, tails), with guard values after every output; a row of a batch equals its solo run
 * bit for bit; a captured sequence of them replays bit for bit. CT_TEST_PERF=1 also times the
 * fused ops against the plain ops on the Qwen3-0.6B shapes. Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* 2n ids of mapped host memory set to -1 (argmax_advance's host ids; *dev its device address),
 * NULL with a failed check where the table cannot map host memory */
static int32_t *mapped_ids(const ct_ops *o, int n, void **dev) {
  *dev = NULL;
  int32_t *h = o->host_alloc_mapped ? o->host_alloc_mapped(sizeof(int32_t) * 2 * n, dev) : NULL;
  CHECK_MSG(h && *dev, "%s host_alloc_mapped failed", o->name);
  if (h) memset(h, 0xff, sizeof(int32_t) * 2 * n);
  return h;
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
  /* argmax_advance: the same ids, each row's token set to it and its position one further */
  int32_t adv_tok[N], adv_pos[N];
  o->to_device(dtok, tok, sizeof tok);
  o->to_device(dpos, pos, sizeof pos);
  memset(am, 0xff, sizeof am);
  o->to_device(dam, am, sizeof am);
  /* with host ids: row n's id in mapped host memory at [(its new position & 1) * N + n], the
   * other half untouched */
  void *dmap;
  int32_t *hmap = mapped_ids(o, N, &dmap);
  o->argmax_advance(dam, dtok, dpos, (int32_t *)dmap, dl, N, V, 1024);
  o->to_host(am, dam, sizeof am);
  o->to_host(adv_tok, dtok, sizeof adv_tok);
  o->to_host(adv_pos, dpos, sizeof adv_pos);
  for (int n = 0; n < N; n++) {
    CHECK_MSG(am[n] == want[n] && adv_tok[n] == want[n] && adv_pos[n] == pos[n] + 1,
              "%s argmax_advance row %d: id %d token %d position %d, expected %d %d %d", o->name,
              n, am[n], adv_tok[n], adv_pos[n], want[n], want[n], pos[n] + 1);
    const int half = (pos[n] + 1) & 1;
    if (hmap)
      CHECK_MSG(hmap[half * N + n] == want[n] && hmap[(1 - half) * N + n] == -1,
                "%s argmax_advance row %d: host ids %d (half %d) and %d (other half), expected"
                " %d and -1", o->name, n, hmap[half * N + n], half, hmap[(1 - half) * N + n],
                want[n]);
  }
  if (hmap) o->host_free(hmap);
  char err[512];
  CHECK_MSG(ct_cuda_check(err, sizeof err) == 0, "%s", err);
  void *dev[] = {dq, dk, dv, dpos, dslot, dout, dtok, dwte, dwpe, de, dl, dam};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) o->free(dev[i]);
  free(qkv); free(kc); free(vc); free(got); free(ref); free(direct); free(wte); free(wpe);
  free(e); free(lg);
}


/* ---- decode-step fusions ---- */

enum { F_NORM = 0, F_SWIGLU = 1, F_ADD = 2, F_ROWS = 3, F_GELU = 4, F_LN = 5, F_LNGELU = 6 };
typedef struct fcase {
  int op, N, IC, OC; /* F_SWIGLU: OC is F */
  int bias;
} fcase;
static const fcase fcases[] = {
    {F_NORM, 1, 1024, 20000, 0},  {F_NORM, 3, 1024, 4098, 1}, {F_NORM, 8, 2048, 1000, 0},
    {F_NORM, 5, 3072, 300, 1},    {F_NORM, 1, 4096, 256, 0},  {F_NORM, 2, 512, 77, 0},
    {F_NORM, 12, 1024, 500, 1},   {F_SWIGLU, 1, 1024, 3072, 0}, {F_SWIGLU, 8, 1024, 100, 0},
    {F_SWIGLU, 4, 2048, 64, 0},   {F_SWIGLU, 6, 3072, 33, 0}, {F_ADD, 1, 2048, 1024, 0},
    {F_ADD, 8, 3072, 1024, 1},    {F_ADD, 2, 1024, 130, 0},   {F_ADD, 16, 1024, 256, 0},
    /* 4 rows of the Qwen3-0.6B shape's GEMVs (staged with CT_DECODE_STAGE=1: on 132
     * multiprocessors the output projection's slice asks exactly 48 KB of shared memory) */
    {F_NORM, 4, 1024, 4096, 0},   {F_SWIGLU, 4, 1024, 3072, 0}, {F_ADD, 4, 2048, 1024, 0},
    {F_ADD, 4, 3072, 1024, 0},
    /* GPT-2's decode products (matmul_rows_fwd, matmul_gelu_rows_fwd): the 124M shapes, the
     * head, and shapes past the GEMV (16 rows, IC not a multiple of 8) that go to cuBLAS */
    {F_ROWS, 1, 768, 2304, 1},    {F_ROWS, 3, 768, 50304, 0}, {F_ROWS, 8, 3072, 768, 1},
    {F_ROWS, 5, 1024, 333, 1},    {F_ROWS, 16, 768, 256, 1},  {F_ROWS, 9, 100, 64, 1},
    {F_GELU, 1, 768, 3072, 1},    {F_GELU, 4, 768, 3072, 1},  {F_GELU, 7, 2048, 129, 1},
    {F_GELU, 12, 768, 512, 1},
    /* 9-64 rows (a batch of sequences decoding): the tensor-core GEMV with 16-row A tiles, in
     * launches of up to 64 rows (32 where a row is 2048+ wide); 65 rows go to cuBLAS */
    {F_NORM, 64, 1024, 4096, 0},  {F_NORM, 40, 1024, 1000, 1}, {F_NORM, 17, 1024, 20000, 0},
    {F_SWIGLU, 64, 1024, 3072, 0}, {F_SWIGLU, 33, 2048, 100, 0}, {F_ADD, 64, 3072, 1024, 0},
    {F_ADD, 64, 2048, 1024, 1},   {F_ADD, 50, 3072, 130, 0},  {F_ROWS, 24, 768, 2304, 1},
    {F_ROWS, 64, 768, 5000, 0},   {F_GELU, 64, 768, 3072, 1}, {F_NORM, 65, 1024, 256, 0},
    /* more of gemm_rows_kernel's shapes (17-64 rows): a partial last block, a slice of 1024 */
    {F_ADD, 30, 1024, 1000, 1},   {F_SWIGLU, 20, 1024, 3072, 0}, {F_NORM, 48, 2048, 4096, 1},
    {F_GELU, 40, 1024, 520, 1},
    /* GPT-2's norms inside its products (layernorm_matmul_fwd): the 124M qkv and fc, a few rows
     * on the CUDA and the tensor cores, 12 and 64 rows (the tensor-core GEMV from 9 rows with
     * CT_DECODE_MMA_MAXN, else the composition), a width past the GEMV's norm (composed) */
    {F_LN, 1, 768, 2304, 1},      {F_LNGELU, 1, 768, 3072, 1}, {F_LN, 4, 768, 2304, 1},
    {F_LNGELU, 8, 768, 3072, 1},  {F_LN, 3, 1024, 333, 0},  {F_LNGELU, 5, 2048, 129, 1},
    {F_LN, 12, 768, 2304, 1},     {F_LNGELU, 64, 768, 3072, 1}, {F_LN, 2, 3072, 64, 1},
};
#define GUARD 64
static const float guard_val = 4096.0f; /* exact in bf16 and fp16 */

/* Runs case fc on table o (inputs host fp32, already rounded); out host fp32 (N * outw). */
static void fused_run(const ct_ops *o, const fcase *fc, const float *x, const float *nw,
                      const float *nb, const float *w, const float *b, const float *res,
                      float *out, int *guard_ok) {
  const int N = fc->N, IC = fc->IC, OC = fc->OC;
  const int wrows = fc->op == F_SWIGLU ? 2 * OC : OC;
  const size_t on = (size_t)N * OC;
  void *dx = up(o, x, (size_t)N * IC), *dnw = up(o, nw, (size_t)IC), *dnb = up(o, nb, (size_t)IC);
  void *dw = up(o, w, (size_t)wrows * IC), *db = fc->bias ? up(o, b, (size_t)OC) : NULL;
  void *dres = up(o, res, on);
  float *init = malloc((on + GUARD) * 4);
  for (size_t i = 0; i < on + GUARD; i++) init[i] = guard_val;
  void *dout = up(o, init, on + GUARD);
  void *ln = o->alloc((size_t)N * IC * o->act_bytes), *pre = o->alloc((size_t)N * 2 * OC * o->act_bytes);
  if (fc->op == F_NORM) o->norm_matmul_fwd(dout, ln, dx, dnw, dw, db, N, IC, OC, 1e-6f);
  else if (fc->op == F_SWIGLU) o->norm_matmul_swiglu_fwd(dout, pre, ln, dx, dnw, dw, N, IC, OC, 1e-6f);
  else if (fc->op == F_ADD) o->matmul_add_fwd(dout, dx, dw, db, dres, N, IC, OC);
  else if (fc->op == F_ROWS) o->matmul_rows_fwd(dout, dx, dw, db, N, IC, OC);
  else if (fc->op == F_GELU) o->matmul_gelu_rows_fwd(dout, pre, dx, dw, db, N, IC, OC);
  else o->layernorm_matmul_fwd(dout, pre, ln, dx, dnw, dnb, dw, db, N, IC, OC, fc->op == F_LNGELU, 1e-5f);
  down(o, init, dout, on + GUARD);
  memcpy(out, init, on * 4);
  *guard_ok = 1;
  for (int i = 0; i < GUARD; i++)
    if (init[on + i] != guard_val) *guard_ok = 0;
  void *d[] = {dx, dnw, dnb, dw, db, dres, dout, ln, pre};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
    if (d[i]) o->free(d[i]);
  free(init);
}

/* layernorm_matmul_fwd's composition on table o: layernorm_rows_fwd, then matmul_rows_fwd or
 * matmul_gelu_rows_fwd (out host fp32, N * OC) */
static void ln_composed(const ct_ops *o, const fcase *fc, const float *x, const float *nw,
                        const float *nb, const float *w, const float *b, float *out) {
  const int N = fc->N, IC = fc->IC, OC = fc->OC;
  void *dx = up(o, x, (size_t)N * IC), *dnw = up(o, nw, (size_t)IC), *dnb = up(o, nb, (size_t)IC);
  void *dw = up(o, w, (size_t)OC * IC), *db = fc->bias ? up(o, b, (size_t)OC) : NULL;
  void *ln = o->alloc((size_t)N * IC * o->act_bytes), *pre = o->alloc((size_t)N * OC * o->act_bytes);
  void *dout = o->alloc((size_t)N * OC * o->act_bytes);
  o->layernorm_rows_fwd(ln, dx, dnw, dnb, N, IC, 1e-5f);
  if (fc->op == F_LNGELU) o->matmul_gelu_rows_fwd(dout, pre, ln, dw, db, N, IC, OC);
  else o->matmul_rows_fwd(dout, ln, dw, db, N, IC, OC);
  down(o, out, dout, (size_t)N * OC);
  void *d[] = {dx, dnw, dnb, dw, db, ln, pre, dout};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
    if (d[i]) o->free(d[i]);
}

static float *rnd_buf(const ct_ops *o, size_t n, float scale) {
  float *v = malloc(n * 4);
  for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
  rounded(o, v, n);
  return v;
}

static void test_fused(const ct_ops *o, double tol) {
  const ct_ops *c = ct_ops_cpu();
  char what[128];
  for (size_t k = 0; k < sizeof fcases / sizeof fcases[0]; k++) {
    const fcase *fc = &fcases[k];
    const int N = fc->N, IC = fc->IC, OC = fc->OC;
    const int wrows = fc->op == F_SWIGLU ? 2 * OC : OC;
    const size_t on = (size_t)N * OC;
    float *x = rnd_buf(o, (size_t)N * IC, 2.0f), *nw = rnd_buf(o, (size_t)IC, 1.0f);
    float *nb = rnd_buf(o, (size_t)IC, 0.5f);
    float *w = rnd_buf(o, (size_t)wrows * IC, 0.05f), *b = rnd_buf(o, (size_t)OC, 0.5f);
    float *res = rnd_buf(o, on, 1.0f);
    float *ref = malloc(on * 4), *got = malloc(on * 4), *ln = malloc((size_t)N * IC * 4);
    float *pre = malloc((size_t)N * 2 * OC * 4);
    static const char *names[] = {"norm_matmul_fwd", "norm_matmul_swiglu_fwd", "matmul_add_fwd",
                                  "matmul_rows_fwd", "matmul_gelu_rows_fwd",
                                  "layernorm_matmul_fwd", "layernorm_matmul_fwd +gelu"};
    const char *name = names[fc->op];
    const float *bb = fc->bias ? b : NULL;
    if (fc->op == F_NORM) c->norm_matmul_fwd(ref, ln, x, nw, w, bb, N, IC, OC, 1e-6f);
    else if (fc->op == F_SWIGLU) c->norm_matmul_swiglu_fwd(ref, pre, ln, x, nw, w, N, IC, OC, 1e-6f);
    else if (fc->op == F_ADD) c->matmul_add_fwd(ref, x, w, bb, res, N, IC, OC);
    else if (fc->op == F_ROWS) c->matmul_rows_fwd(ref, x, w, bb, N, IC, OC);
    else if (fc->op == F_GELU) { /* the composition: the product rounded to the working dtype, then gelu */
      c->matmul_rows_fwd(pre, x, w, bb, N, IC, OC);
      rounded(o, pre, on);
      c->gelu_fwd(ref, pre, on);
    } else { /* the norm rounded, the product (rounded), gelu */
      float *mean = malloc((size_t)N * 4), *rstd = malloc((size_t)N * 4);
      c->layernorm_fwd(ln, mean, rstd, x, nw, nb, N, IC, 1e-5f);
      rounded(o, ln, (size_t)N * IC);
      c->matmul_rows_fwd(fc->op == F_LNGELU ? pre : ref, ln, w, bb, N, IC, OC);
      if (fc->op == F_LNGELU) {
        rounded(o, pre, on);
        c->gelu_fwd(ref, pre, on);
      }
      free(mean);
      free(rstd);
    }
    int gok = 0;
    const long gr_before = ct_cuda_gemm_rows_launches(), one_before = ct_cuda_gemv_one_launches();
    fused_run(o, fc, x, nw, nb, w, b, res, got, &gok);
    const int gr_ran = ct_cuda_gemm_rows_launches() > gr_before;
    const int one_ran = ct_cuda_gemv_one_launches() > one_before;
    snprintf(what, sizeof what, "%s %s N=%d IC=%d OC=%d%s", o->name, name, N, IC, OC,
             fc->bias ? " +bias" : "");
    ct_check_close(what, got, ref, on, tol, 1e-6);
    CHECK_MSG(gok, "%s: wrote past its output", what);
    if (fc->op >= F_LN) { /* the same bits as the ops it fuses on this table */
      float *comp = malloc(on * 4);
      ln_composed(o, fc, x, nw, nb, w, b, comp);
      CHECK_MSG(!memcmp(comp, got, on * 4), "%s: differs from layernorm_rows_fwd + its product", what);
      free(comp);
    }
    /* rows give the same bits in another batch: the last alone where one row takes the same
     * kernel as N (the CUDA-core GEMV at every row count up to 8: CT_DECODE_MMA=0,
     * CT_DECODE_STAGE=1, IC not a multiple of 256; the tensor-core GEMV at every row count:
     * CT_DECODE_MMA=all), else the first and the last as a batch of 2 (by default the tensor
     * cores take 2-16 rows, up to 64 with CT_DECODE_MMA_MAXN, the CUDA cores one); the 16-bit GEMVs
     * only: cuBLAS (past 8 rows where the tensor-core GEMV is off, past its limit) promises no such
     * thing */
    const char *mm = getenv("CT_DECODE_MMA"), *st = getenv("CT_DECODE_STAGE");
    const char *mx = getenv("CT_DECODE_MMA_MAXN");
    const int off = (mm && !strcmp(mm, "0")) || (st && !strcmp(st, "1"));
    const int tc = !off && IC % 256 == 0 && N <= (mx ? atoi(mx) : 16); /* tensor cores: N rows */
    const int pair = tc && !(mm && !strcmp(mm, "all"));
    if (N > 1 && o->act_bytes == 2 && (tc || (N <= 8 && !(IC % 256 == 0 && !off)))) {
      fcase one = *fc;
      one.N = pair ? 2 : 1;
      const int rows[2] = {pair ? 0 : N - 1, N - 1};
      float *xin = malloc((size_t)2 * IC * 4), *rin = malloc((size_t)2 * OC * 4);
      for (int r = 0; r < 2; r++) {
        memcpy(xin + (size_t)r * IC, x + (size_t)rows[r] * IC, (size_t)IC * 4);
        memcpy(rin + (size_t)r * OC, res + (size_t)rows[r] * OC, (size_t)OC * 4);
      }
      float *solo = malloc((size_t)2 * OC * 4);
      fused_run(o, &one, xin, nw, nb, w, b, rin, solo, &gok);
      for (int r = 2 - one.N; r < 2; r++)
        CHECK_MSG(!memcmp(solo + (size_t)(r - (2 - one.N)) * OC, got + (size_t)rows[r] * OC,
                          (size_t)OC * 4),
                  "%s: row %d differs from its run in a batch of %d", what, rows[r], one.N);
      free(solo);
      free(xin);
      free(rin);
    }
    /* one row in the GEMV's one-task form (a row in one round, a task a warp): the same bits as
     * its general form (CT_DECODE_GV_ONE=0), which must not take it */
    if (one_ran) {
      float *gen = malloc(on * 4);
      int gok2 = 0;
      setenv("CT_DECODE_GV_ONE", "0", 1);
      const long n1 = ct_cuda_gemv_one_launches();
      fused_run(o, fc, x, nw, nb, w, b, res, gen, &gok2);
      CHECK_MSG(ct_cuda_gemv_one_launches() == n1, "%s: CT_DECODE_GV_ONE=0 took the one-task form", what);
      CHECK_MSG(gok2, "%s: the general form wrote past its output", what);
      unsetenv("CT_DECODE_GV_ONE");
      CHECK_MSG(!memcmp(gen, got, on * 4), "%s: the one-task GEMV differs from the general one", what);
      free(gen);
    }
    /* with CT_DECODE_GR=1, past the tensor-core GEMV up to 64 rows, the 16-bit products go to
     * gemm_rows_kernel (IC a multiple of 64, outputs narrower than a vocabulary, its shared
     * memory enough): where it ran, its rows give the same bits in a batch of 17, the case's
     * last 17 rows */
    const int maxn = mx ? atoi(mx) : 16;
    const char *gr = getenv("CT_DECODE_GR");
    const int gr_on = gr && !strcmp(gr, "1");
    CHECK_MSG(gr_ran == (gr_on && o->act_bytes == 2 && N > maxn && N <= 64 && IC % 64 == 0 &&
                         OC <= 16384) || getenv("CT_DECODE_GR_KS") || off,
              "%s: gemm_rows_kernel %s %d rows", what, gr_ran ? "took" : "did not take", N);
    if (gr_ran && N > 17 && maxn < 17) {
      fcase sub = *fc;
      sub.N = 17;
      float *part = malloc((size_t)17 * OC * 4);
      fused_run(o, &sub, x + (size_t)(N - 17) * IC, nw, nb, w, b, res + (size_t)(N - 17) * OC, part, &gok);
      CHECK_MSG(!memcmp(part, got + (size_t)(N - 17) * OC, (size_t)17 * OC * 4),
                "%s: rows %d-%d differ from their run as a batch of 17", what, N - 17, N - 1);
      free(part);
    }
    free(x); free(nw); free(nb); free(w); free(b); free(res); free(ref); free(got); free(ln); free(pre);
  }

  /* qkv_rope_append, with and without qk norm, against the CPU composition */
  enum { QN = 5, QH = 4, QKV = 2, QT = 40, QS = 6 };
  static const int hds[] = {64, 128, 256, 32};
  for (int hi = 0; hi < 4; hi++) {
    for (int qk = 0; qk < 2; qk++) {
      const int qhd = hds[hi], QW = (QH + 2 * QKV) * qhd;
      const int32_t pos[QN] = {0, 17, 39, 3, 21}, slot[QN] = {3, 0, 5, 1, 2};
      const size_t nq = (size_t)QN * QW, nc = (size_t)QS * QKV * QT * qhd;
      float *raw = rnd_buf(o, nq, 2.0f), *qn = rnd_buf(o, (size_t)qhd, 1.0f);
      float *kn = rnd_buf(o, (size_t)qhd, 1.0f), *kc = rnd_buf(o, nc, 1.0f), *vc = rnd_buf(o, nc, 1.0f);
      float *qkv = malloc(nq * 4), *got = malloc((nc > nq ? nc : nq) * 4);
      void *draw = up(o, raw, nq), *dqn = up(o, qn, (size_t)qhd), *dkn = up(o, kn, (size_t)qhd);
      void *dk = up(o, kc, nc), *dv = up(o, vc, nc), *dq = o->alloc(nq * o->act_bytes);
      int32_t *dpos = o->alloc(sizeof pos), *dslot = o->alloc(sizeof slot);
      o->to_device(dpos, pos, sizeof pos);
      o->to_device(dslot, slot, sizeof slot);
      c->qkv_rope_append(qkv, raw, qk ? qn : NULL, qk ? kn : NULL, kc, vc, slot, pos, QN, QH, QKV,
                         qhd, QT, 1e6f, 1e-6f);
      o->qkv_rope_append(dq, draw, qk ? dqn : NULL, qk ? dkn : NULL, dk, dv, dslot, dpos, QN, QH,
                         QKV, qhd, QT, 1e6f, 1e-6f);
      snprintf(what, sizeof what, "%s qkv_rope_append hd=%d%s: qkv", o->name, qhd, qk ? " qk_norm" : "");
      down(o, got, dq, nq);
      ct_check_close(what, got, qkv, nq, tol, 1e-6);
      snprintf(what, sizeof what, "%s qkv_rope_append hd=%d%s: k cache", o->name, qhd, qk ? " qk_norm" : "");
      down(o, got, dk, nc);
      ct_check_close(what, got, kc, nc, tol, 1e-6);
      down(o, got, dv, nc);
      CHECK_MSG(!memcmp(got, vc, nc * 4), "%s qkv_rope_append hd=%d: v cache differs", o->name, qhd);
      void *d[] = {draw, dqn, dkn, dk, dv, dq, dpos, dslot};
      for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) o->free(d[i]);
      free(raw); free(qn); free(kn); free(kc); free(vc); free(qkv); free(got);
    }
  }

  /* a captured chain of fused ops (programmatic dependent launches) replays bit for bit */
  {
    const int N = 3, C = 1024, F = 3072;
    float *x = rnd_buf(o, (size_t)N * C, 2.0f), *nw = rnd_buf(o, (size_t)C, 1.0f);
    float *w1 = rnd_buf(o, (size_t)2 * F * C, 0.05f), *w2 = rnd_buf(o, (size_t)C * F, 0.05f);
    void *dx = up(o, x, (size_t)N * C), *dnw = up(o, nw, (size_t)C), *dw1 = up(o, w1, (size_t)2 * F * C);
    void *dw2 = up(o, w2, (size_t)C * F), *act = o->alloc((size_t)N * F * o->act_bytes);
    void *pre = o->alloc((size_t)N * 2 * F * o->act_bytes), *ln = o->alloc((size_t)N * C * o->act_bytes);
    void *dy = o->alloc((size_t)N * C * o->act_bytes);
    float *direct = malloc((size_t)N * C * 4), *replay = malloc((size_t)N * C * 4);
    o->norm_matmul_swiglu_fwd(act, pre, ln, dx, dnw, dw1, N, C, F, 1e-6f);
    o->matmul_add_fwd(dy, act, dw2, NULL, dx, N, F, C);
    down(o, direct, dy, (size_t)N * C);
    o->zero(dy, (size_t)N * C * o->act_bytes);
    o->zero(act, (size_t)N * F * o->act_bytes);
    o->graph_begin();
    o->norm_matmul_swiglu_fwd(act, pre, ln, dx, dnw, dw1, N, C, F, 1e-6f);
    o->matmul_add_fwd(dy, act, dw2, NULL, dx, N, F, C);
    void *g = o->graph_end();
    CHECK(g != NULL);
    if (g) {
      o->graph_launch(g);
      o->graph_launch(g);
      down(o, replay, dy, (size_t)N * C);
      CHECK_MSG(!memcmp(direct, replay, (size_t)N * C * 4), "%s: fused ops replayed from a graph differ",
                o->name);
      o->graph_destroy(g);
    }
    void *d[] = {dx, dnw, dw1, dw2, act, pre, ln, dy};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) o->free(d[i]);
    free(x); free(nw); free(w1); free(w2); free(direct); free(replay);
  }
  /* argmax over a vocabulary-sized row (several blocks a row on CUDA): ties across blocks go to
   * the lowest index, padding columns are ignored; again from a captured graph */
  {
    enum { AN = 3, AV = 150000, AVp = 150016 };
    float *lg = malloc((size_t)AN * AVp * 4);
    for (size_t i = 0; i < (size_t)AN * AVp; i++) lg[i] = frand();
    lg[140000] = lg[5] = 8.0f;
    lg[(size_t)AVp + 149999] = 9.0f;
    lg[(size_t)2 * AVp + 150010] = 20.0f; /* padding */
    lg[(size_t)2 * AVp + 77777] = 3.0f;
    rounded(o, lg, (size_t)AN * AVp);
    void *dl = up(o, lg, (size_t)AN * AVp);
    int32_t want[AN], am[AN], *dam = o->alloc(sizeof am);
    c->argmax_rows(want, lg, AN, AV, AVp);
    for (int rep = 0; rep < 2; rep++) {
      void *g = NULL;
      o->zero(dam, sizeof am);
      if (rep) o->graph_begin();
      o->argmax_rows(dam, dl, AN, AV, AVp);
      if (rep) {
        g = o->graph_end();
        CHECK(g != NULL);
        if (g) o->graph_launch(g);
        if (g) o->graph_launch(g);
      }
      o->to_host(am, dam, sizeof am);
      CHECK_MSG(!memcmp(am, want, sizeof am), "%s argmax_rows V=%d%s: %d %d %d vs %d %d %d", o->name,
                AV, rep ? " (graph)" : "", am[0], am[1], am[2], want[0], want[1], want[2]);
      if (g) o->graph_destroy(g);
    }
    CHECK(want[0] == 5 && want[1] == 149999 && want[2] == 77777);
    { /* argmax_advance through the split kernel, replayed twice from a graph: the positions
       * move twice, the tokens are the ids */
      const int32_t p0[AN] = {4, 0, 200};
      int32_t tk[AN], ps[AN], *dtk = o->alloc(sizeof tk), *dps = o->alloc(sizeof ps);
      o->to_device(dps, p0, sizeof p0);
      o->zero(dtk, sizeof tk);
      /* the ids also into mapped host memory (allocated before the capture, which an allocation
       * would end): the two replays fill both halves */
      void *dmap;
      int32_t *hmap = mapped_ids(o, AN, &dmap);
      o->graph_begin();
      o->argmax_advance(dam, dtk, dps, (int32_t *)dmap, dl, AN, AV, AVp);
      void *g = o->graph_end();
      CHECK(g != NULL);
      if (g) o->graph_launch(g);
      if (g) o->graph_launch(g);
      o->sync();
      for (int n = 0; hmap && n < 2 * AN; n++)
        CHECK_MSG(hmap[n] == want[n % AN], "%s argmax_advance V=%d (graph): host id %d of half %d"
                  " is %d, expected %d", o->name, AV, n % AN, n / AN, hmap[n], want[n % AN]);
      if (hmap) o->host_free(hmap);
      o->to_host(am, dam, sizeof am);
      o->to_host(tk, dtk, sizeof tk);
      o->to_host(ps, dps, sizeof ps);
      for (int n = 0; n < AN; n++)
        CHECK_MSG(am[n] == want[n] && tk[n] == want[n] && ps[n] == p0[n] + 2,
                  "%s argmax_advance V=%d row %d: id %d token %d position %d, expected %d %d %d",
                  o->name, AV, n, am[n], tk[n], ps[n], want[n], want[n], p0[n] + 2);
      if (g) o->graph_destroy(g);
      o->free(dtk);
      o->free(dps);
    }
    o->free(dl);
    o->free(dam);
    free(lg);
  }
  char err[512];
  CHECK_MSG(ct_cuda_check(err, sizeof err) == 0, "%s", err);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* CT_TEST_PERF=1 (after the tests) or =only (alone): the Qwen3-0.6B decode shapes, fused op vs the plain ops it replaces, mean of
 * 200 back-to-back calls replayed from a CUDA graph, over 256 MB of rotating weight copies (so
 * they come from memory, not the 60 MB L2). */
static void perf_fused(const ct_ops *o) {
  enum { COPIES = 64, ITERS = 200 };
  const int C = 1024, W = 4096, Hhd = 2048, F = 3072, V = 151936;
  const struct { const char *name; int op, IC, OC; } sh[] = {
      {"qkv norm+proj", F_NORM, C, W},   {"o proj+residual", F_ADD, Hhd, C},
      {"gate/up+swiglu", F_SWIGLU, C, F}, {"down proj+residual", F_ADD, F, C},
      {"final norm+head", F_NORM, C, V},
  };
  printf("perf %s: op, rows, fused us (GB/s), plain ops us (GB/s)\n", o->name);
  for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) {
    const int IC = sh[k].IC, OC = sh[k].OC, wrows = sh[k].op == F_SWIGLU ? 2 * OC : OC;
    const size_t wn = (size_t)wrows * IC, ab = (size_t)o->act_bytes;
    int copies = (int)((256u << 20) / (wn * ab)) + 1; /* 256 MB of weights: past the L2 */
    if (copies > COPIES) copies = COPIES;
    void *w[COPIES];
    float *tmp = malloc(wn * 4);
    for (size_t i = 0; i < wn; i++) tmp[i] = frand() * 0.05f;
    for (int i = 0; i < copies; i++) w[i] = up(o, tmp, wn);
    free(tmp);
    const int Nmax = 64;
    float *xh = malloc((size_t)Nmax * 2 * F * 4);
    for (size_t i = 0; i < (size_t)Nmax * 2 * F; i++) xh[i] = frand();
    void *x = up(o, xh, (size_t)Nmax * 2 * F), *nw = up(o, xh, (size_t)IC);
    void *out = o->alloc((size_t)Nmax * 2 * OC * ab), *pre = o->alloc((size_t)Nmax * 2 * OC * ab);
    void *ln = o->alloc((size_t)Nmax * IC * ab), *res = o->alloc((size_t)Nmax * OC * ab);
    free(xh);
    static const int rows[] = {1, 8, 32, 64};
    for (int ri = 0; ri < 4; ri++) {
      const int N = rows[ri];
      double t[2];
      for (int v = 0; v < 2; v++) {
        void *g = NULL;
        for (int it = -10; it < ITERS; it++) {
          if (it == 0) o->graph_begin(); /* GPU time, not launch time: replay a graph */
          void *wi = w[(it + 10) % copies];
          if (v == 0) {
            if (sh[k].op == F_NORM) o->norm_matmul_fwd(out, ln, x, nw, wi, NULL, N, IC, OC, 1e-6f);
            else if (sh[k].op == F_SWIGLU) o->norm_matmul_swiglu_fwd(out, pre, ln, x, nw, wi, N, IC, OC, 1e-6f);
            else o->matmul_add_fwd(out, x, wi, NULL, res, N, IC, OC);
          } else {
            if (sh[k].op != F_ADD) o->rmsnorm_fwd(ln, NULL, x, nw, N, IC, N, 0, 1e-6f);
            o->matmul_fwd(sh[k].op == F_SWIGLU ? pre : out, sh[k].op == F_ADD ? x : ln, wi, NULL,
                          N, IC, wrows);
            if (sh[k].op == F_SWIGLU) o->swiglu_fwd(out, pre, N, OC);
            if (sh[k].op == F_ADD) o->add_fwd(out, out, res, (size_t)N * OC);
          }
        }
        g = o->graph_end();
        t[v] = 0;
        if (g) {
          o->graph_launch(g);
          o->sync();
          t[v] = now_s();
          o->graph_launch(g);
          o->sync();
          t[v] = (now_s() - t[v]) / ITERS;
          o->graph_destroy(g);
        }
      }
      const double gb = (double)wn * ab / 1e9;
      printf("  %-20s %d  %8.1f us (%6.0f GB/s)  %8.1f us (%6.0f GB/s)\n", sh[k].name, N, t[0] * 1e6,
             gb / t[0], t[1] * 1e6, gb / t[1]);
    }
    for (int i = 0; i < copies; i++) o->free(w[i]);
    void *d[] = {x, nw, out, pre, ln, res};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) o->free(d[i]);
  }
}

/* attention_decode_blk_kernel (attention_decode from 9 rows: a block per row and kv head, keys
 * streamed through shared memory) against attention_decode_vec_kernel (CT_DECODE_ATT_BLK=0) bit
 * for bit, and against the CPU within tolerance; with its block sizes, stage counts and both
 * homes of the split rows; GQA 1, 2 and 4, head dims 64 and 128, row lengths 1, 16, 17, max_T and
 * random ones; a captured call replayed after the positions change equals the direct call. */
static void blk_case(const ct_ops *o, int Nr, int Hh, int KVh, int hdh, int maxTh, double tol) {
  const ct_ops *c = ct_ops_cpu();
  const int Wh = (Hh + 2 * KVh) * hdh, S2 = Nr + 1;
  const size_t nq = (size_t)Nr * Wh, nc = (size_t)S2 * KVh * maxTh * hdh, no = (size_t)Nr * Hh * hdh;
  float *qkv = malloc(nq * 4), *kc = malloc(nc * 4), *vc = malloc(nc * 4);
  float *ref = malloc(no * 4), *a = malloc(no * 4), *b = malloc(no * 4);
  int32_t *pos = malloc(Nr * 4), *slot = malloc(Nr * 4), *pos2 = malloc(Nr * 4);
  for (size_t i = 0; i < nq; i++) qkv[i] = frand();
  for (size_t i = 0; i < nc; i++) kc[i] = frand(), vc[i] = frand();
  for (int r = 0; r < Nr; r++) {
    const int fixed[] = {0, 15, 16, maxTh - 1};
    pos[r] = r < 4 ? fixed[r] : (int)((frand() * 0.5 + 0.5) * (maxTh - 1));
    pos2[r] = (pos[r] * 7 + 3) % maxTh;
    slot[r] = (r * 5 + 1) % S2;
  }
  rounded(o, qkv, nq);
  rounded(o, kc, nc);
  rounded(o, vc, nc);
  void *dq = up(o, qkv, nq), *dk = up(o, kc, nc), *dv = up(o, vc, nc);
  void *dout = o->alloc(no * o->act_bytes);
  int32_t *dpos = o->alloc(Nr * 4), *dslot = o->alloc(Nr * 4);
  o->to_device(dpos, pos, Nr * 4);
  o->to_device(dslot, slot, Nr * 4);
  c->attention_decode(ref, qkv, kc, vc, slot, pos, Nr, Hh, KVh, hdh, maxTh);
  setenv("CT_DECODE_ATT_BLK", "0", 1);
  const long b0 = ct_cuda_attention_blk_launches();
  o->attention_decode(dout, dq, dk, dv, dslot, dpos, Nr, Hh, KVh, hdh, maxTh);
  down(o, a, dout, no);
  CHECK_MSG(ct_cuda_attention_blk_launches() == b0, "CT_DECODE_ATT_BLK=0: the block kernel ran");
  setenv("CT_DECODE_ATT_BLK", "1", 1);
  static const char *var[][3] = {{"4", "3", "1"}, {"4", "2", "1"}, {"8", "3", "1"},
                                 {"8", "2", "0"}, {"4", "3", "0"}};
  char what[160];
  for (size_t vi = 0; vi < sizeof var / sizeof var[0]; vi++) {
    setenv("CT_DECODE_AB_W", var[vi][0], 1);
    setenv("CT_DECODE_AB_R", var[vi][1], 1);
    setenv("CT_DECODE_AB_PS", var[vi][2], 1);
    snprintf(what, sizeof what, "%s attention_decode_blk N%d H%d KV%d hd%d T%d W%s R%s PS%s",
             o->name, Nr, Hh, KVh, hdh, maxTh, var[vi][0], var[vi][1], var[vi][2]);
    const long before = ct_cuda_attention_blk_launches();
    o->zero(dout, no * o->act_bytes);
    o->attention_decode(dout, dq, dk, dv, dslot, dpos, Nr, Hh, KVh, hdh, maxTh);
    down(o, b, dout, no);
    CHECK_MSG(ct_cuda_attention_blk_launches() == before + 1, "%s: the block kernel did not run", what);
    ct_check_close(what, b, ref, no, tol, 1e-6);
    size_t diff = 0;
    for (size_t i = 0; i < no; i++) diff += memcmp(&a[i], &b[i], 4) != 0;
    CHECK_MSG(diff == 0, "%s: %zu of %zu outputs differ from the vec kernel's", what, diff, no);
  }
  unsetenv("CT_DECODE_AB_W");
  unsetenv("CT_DECODE_AB_R");
  unsetenv("CT_DECODE_AB_PS");
  /* graph: capture, rewrite positions, replay == direct */
  o->graph_begin();
  o->attention_decode(dout, dq, dk, dv, dslot, dpos, Nr, Hh, KVh, hdh, maxTh);
  void *g = o->graph_end();
  CHECK(g != NULL);
  o->to_device(dpos, pos2, Nr * 4);
  o->attention_decode(dout, dq, dk, dv, dslot, dpos, Nr, Hh, KVh, hdh, maxTh);
  down(o, a, dout, no);
  o->zero(dout, no * o->act_bytes);
  if (g) {
    o->graph_launch(g);
    o->graph_destroy(g);
  }
  down(o, b, dout, no);
  snprintf(what, sizeof what, "%s attention_decode_blk N%d hd%d G%d", o->name, Nr, hdh, Hh / KVh);
  CHECK_MSG(!memcmp(a, b, no * 4), "%s: graph replay differs", what);
  unsetenv("CT_DECODE_ATT_BLK");
  printf("%s: = vec kernel bit for bit, graph replay = direct\n", what);
  void *d[] = {dq, dk, dv, dout, dpos, dslot};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) o->free(d[i]);
  free(qkv), free(kc), free(vc), free(ref), free(a), free(b), free(pos), free(slot), free(pos2);
}

static void test_attention_blk(void) {
  blk_case(ct_ops_cuda_bf16(), 64, 16, 8, 128, 384, 2e-2);
  blk_case(ct_ops_cuda_fp16(), 9, 8, 2, 128, 300, 2e-2);
  blk_case(ct_ops_cuda_bf16(), 20, 8, 8, 64, 200, 2e-2);
  blk_case(ct_ops_cuda_bf16(), 12, 32, 8, 64, 520, 2e-2);
  blk_case(ct_ops_cuda_bf16(), 3, 16, 8, 128, 2100, 2e-2); /* past the rows' room in shared memory */
  /* the default choice of kernel */
  const long b0 = ct_cuda_attention_blk_launches();
  const ct_ops *o = ct_ops_cuda_bf16();
  const int Nr = 9, Wh = (16 + 16) * 128;
  void *dq = o->alloc((size_t)Nr * Wh * 2), *dk = o->alloc((size_t)Nr * 8 * 64 * 128 * 2);
  void *dv = o->alloc((size_t)Nr * 8 * 64 * 128 * 2), *dout = o->alloc((size_t)Nr * 16 * 128 * 2);
  int32_t pos[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8}, *dpos = o->alloc(sizeof pos);
  o->zero(dq, (size_t)Nr * Wh * 2);
  o->zero(dk, (size_t)Nr * 8 * 64 * 128 * 2);
  o->zero(dv, (size_t)Nr * 8 * 64 * 128 * 2);
  o->to_device(dpos, pos, sizeof pos);
  /* two query heads a kv head: the vec kernel below AB_MIN_ROWS (8) rows, the block kernel from it */
  o->attention_decode(dout, dq, dk, dv, NULL, dpos, 7, 16, 8, 128, 64);
  CHECK_MSG(ct_cuda_attention_blk_launches() == b0, "7 rows, 2 heads a kv head: the block kernel ran by default");
  o->attention_decode(dout, dq, dk, dv, NULL, dpos, 8, 16, 8, 128, 64);
  CHECK_MSG(ct_cuda_attention_blk_launches() == b0 + 1,
            "8 rows, 2 heads a kv head: the block kernel did not run by default");
  /* one query head a kv head (GPT-2's multi-head attention): the block kernel from one row */
  o->attention_decode(dout, dq, dk, dv, NULL, dpos, 1, 8, 8, 128, 64);
  CHECK_MSG(ct_cuda_attention_blk_launches() == b0 + 2,
            "1 row, 1 head a kv head: the block kernel did not run by default");
  void *d[] = {dq, dk, dv, dout, dpos};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) o->free(d[i]);
  char err[512];
  CHECK_MSG(ct_cuda_check(err, sizeof err) == 0, "%s", err);
}

/* CT_TEST_PERF=att (alone) or with =1/only: attention_decode on a model's shape (Qwen3-0.6B: 16
 * heads, 8 kv heads, hd 128; GPT-2: 12, 12, 64; Llama-3.2-1B: 32, 8, 64), a 384-key cache, every
 * row at `len` keys: the vec kernel, the block kernel's default choice and its variants (warps /
 * stages / split rows in shared memory); mean of 200 calls replayed from a CUDA graph over rotating
 * caches past the L2. GB/s: the K and V bytes read. */
static void perf_attention_shape(const ct_ops *o, const char *model, int Hh, int KVh, int hdh) {
  enum { ITERS = 200, maxTh = 384 };
  static const int rows[] = {1, 4, 8, 16, 24, 32, 64}, lens[] = {256, 384};
  /* ATT_BLK, W, R, PS; "" unsets */
  static const char *var[][4] = {{"0", "", "", ""},     {"", "", "", ""},     {"1", "4", "2", "1"},
                                 {"1", "8", "3", "1"}, {"1", "8", "2", "1"}, {"1", "4", "3", "1"}};
  static const char *names[] = {"vec", "default", "4/2", "8/3", "8/2", "4/3"};
  static const char *keys[] = {"CT_DECODE_ATT_BLK", "CT_DECODE_AB_W", "CT_DECODE_AB_R", "CT_DECODE_AB_PS"};
  printf("perf %s attention_decode %s H%d KV%d hd%d max_T %d: rows, len, us (GB/s) for vec | default "
         "| blk warps/stages ...\n", o->name, model, Hh, KVh, hdh, maxTh);
  for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
    const int Nr = rows[ri];
    const size_t cache = (size_t)Nr * KVh * maxTh * hdh * o->act_bytes;
    int copies = (int)((512u << 20) / (2 * cache)) + 1;
    if (copies > 32) copies = 32;
    void *kc[32], *vc[32];
    for (int i = 0; i < copies; i++) {
      kc[i] = o->alloc(cache), vc[i] = o->alloc(cache);
      o->zero(kc[i], cache), o->zero(vc[i], cache);
    }
    void *dq = o->alloc((size_t)Nr * (Hh + 2 * KVh) * hdh * o->act_bytes);
    void *dout = o->alloc((size_t)Nr * Hh * hdh * o->act_bytes);
    o->zero(dq, (size_t)Nr * (Hh + 2 * KVh) * hdh * o->act_bytes);
    int32_t *dpos = o->alloc(Nr * 4), pos[64];
    for (int li = 0; li < 2; li++) {
      for (int r = 0; r < Nr; r++) pos[r] = lens[li] - 1;
      o->to_device(dpos, pos, Nr * 4);
      printf("  %2d rows %3d keys:", Nr, lens[li]);
      for (size_t vi = 0; vi < sizeof var / sizeof var[0]; vi++) {
        for (int k = 0; k < 4; k++) {
          if (var[vi][k][0]) setenv(keys[k], var[vi][k], 1);
          else unsetenv(keys[k]);
        }
        for (int it = -10; it < ITERS; it++) {
          if (it == 0) o->graph_begin();
          const int c = (it + 10) % copies;
          o->attention_decode(dout, dq, kc[c], vc[c], NULL, dpos, Nr, Hh, KVh, hdh, maxTh);
        }
        void *g = o->graph_end();
        double t = 0;
        if (g) {
          o->graph_launch(g);
          o->sync();
          t = now_s();
          o->graph_launch(g);
          o->sync();
          t = (now_s() - t) / ITERS;
          o->graph_destroy(g);
        }
        const double gb = 2.0 * Nr * KVh * lens[li] * hdh * o->act_bytes / 1e9;
        printf("  %s %.1f us (%.0f)", names[vi], t * 1e6, t > 0 ? gb / t : 0.0);
      }
      printf("\n");
    }
    for (int k = 0; k < 4; k++) unsetenv(keys[k]);
    for (int i = 0; i < copies; i++) o->free(kc[i]), o->free(vc[i]);
    o->free(dq), o->free(dout), o->free(dpos);
  }
}

static void perf_attention(const ct_ops *o) {
  perf_attention_shape(o, "Qwen3-0.6B", 16, 8, 128);
  perf_attention_shape(o, "GPT-2", 12, 12, 64);
  perf_attention_shape(o, "Llama-3.2-1B", 32, 8, 64);
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

/* a small llama-style model (vocabulary 300, max_T positions; tiny_llama: 64; attn_bias: with a
 * qkv bias, zeros as initialized) with random weights, on the CPU table (engines copy it to their
 * device); NULL when it cannot be made */
static ct_model *tiny_llama_B(int layers, int C, int H, int KV, bool qk_norm, bool attn_bias,
                              uint64_t seed, int max_T) {
  ct_config c;
  ct_config_defaults(&c);
  snprintf(c.model.arch, sizeof c.model.arch, "llama");
  c.model.n_layer = layers;
  c.model.d_model = C;
  c.model.n_head = H;
  c.model.n_kv_head = KV;
  c.model.vocab_size = 300;
  c.model.max_seq_len = max_T;
  c.model.qk_norm = qk_norm;
  c.model.attn_bias = attn_bias;
  c.model.init_std = 0.05;
  c.train.seq_len = max_T;
  CHECK(ct_config_validate(&c) == CT_OK);
  ct_model *m = NULL;
  CHECK(ct_model_create(&c.model, ct_ops_cpu(), 1, 1, &m) == CT_OK);
  if (m) ct_model_init_weights(m, seed);
  return m;
}
static ct_model *tiny_llama_T(int layers, int C, int H, int KV, bool qk_norm, uint64_t seed,
                              int max_T) {
  return tiny_llama_B(layers, C, H, KV, qk_norm, false, seed, max_T);
}
static ct_model *tiny_llama(int layers, int C, int H, int KV, bool qk_norm, uint64_t seed) {
  return tiny_llama_T(layers, C, H, KV, qk_norm, seed, 64);
}

static void test_engine(void) {
  ct_model *m = tiny_llama(2, 256, 2, 1, true, 3);
  if (!m) return;
  const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m)), rows = 15;
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
      CHECK_MSG(!memcmp(one, got, rows * Vp * 4), "engine %s: layers on 2 devices differ from one",
                tabs[t]->name);
    }
  }
  free(ref);
  free(got);
  free(one);
  ct_model_destroy(m);
}

/* nseq sequences of 6-token prompts, each prefilled alone (so the caches do not depend on the
 * batch), then 3 decode steps of the npick sequences pick[] as one batch: logits appended to out
 * (3 npick rows of Vp) */
static void engine_logits_rows(ct_model *m, const ct_ops *o, int nseq, const int *pick, int npick,
                               float *out) {
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = nseq;
  ic.max_len = 16;
  ic.max_rows = 64;
  ic.device = o == ct_ops_cpu() ? -1 : 0;
  ic.graphs = o == ct_ops_cpu() ? 0 : 1;
  ct_infer *e = NULL;
  CHECK(ct_infer_create(m, o, &ic, &e) == CT_OK);
  if (!e) return;
  const int Vp = ct_model_padded_vocab(ct_model_config(m));
  float *scratch = malloc((size_t)Vp * 4);
  for (int s = 0; s < nseq; s++) {
    int32_t toks[6];
    for (int i = 0; i < 6; i++) toks[i] = (s * 31 + i * 7 + 3) % 300;
    CHECK(ct_infer_prefill(e, 1, &s, toks, 6, scratch, NULL) == CT_OK);
  }
  for (int step = 0; step < 3; step++) {
    int32_t t[64];
    for (int i = 0; i < npick; i++) t[i] = (pick[i] * 13 + step * 5 + 1) % 300;
    CHECK(ct_infer_decode(e, npick, pick, t, out + (size_t)step * npick * Vp, NULL) == CT_OK);
  }
  free(scratch);
  ct_infer_destroy(e);
}

/* a batch of 40 sequences decoding (the tensor-core GEMV with 16-row tiles, attention's
 * many-row kernels) against the CPU engine, and two of its rows against their run as a batch of
 * 2 (the 2-8 row kernels): bit for bit */
static void test_engine_rows(void) {
  ct_model *m = tiny_llama(2, 256, 2, 1, true, 5);
  if (!m) return;
  enum { NS = 40 };
  int all[NS];
  for (int i = 0; i < NS; i++) all[i] = (i * 7) % NS; /* slots out of order */
  const int two[2] = {all[9], all[33]};
  const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m));
  float *ref = calloc(3 * NS * Vp, 4), *got = calloc(3 * NS * Vp, 4), *pair = calloc(3 * 2 * Vp, 4);
  engine_logits_rows(m, ct_ops_cpu(), NS, all, NS, ref);
  setenv("CT_DECODE_MMA_MAXN", "64", 1); /* all 40 rows on the tensor cores (opt-in past 16) */
  const long mma0 = ct_cuda_gemv_mma_launches();
  engine_logits_rows(m, ct_ops_cuda_bf16(), NS, all, NS, got);
  const long ran = ct_cuda_gemv_mma_launches() - mma0;
  double err = ct_check_close("engine cuda-bf16 vs CPU engine, 40-row decode", got, ref, 3 * NS * Vp,
                              3e-2, 1e-6);
  printf("engine cuda-bf16 vs CPU engine, 40-row decode: normalized error %.2e, %ld tensor-core GEMV launches\n",
         err, ran);
  CHECK_MSG(ran > 0, "40-row decode: no tensor-core GEMV ran");
  engine_logits_rows(m, ct_ops_cuda_bf16(), NS, two, 2, pair);
  size_t diff = 0;
  for (int step = 0; step < 3; step++)
    for (int r = 0; r < 2; r++)
      diff += memcmp(pair + ((size_t)step * 2 + r) * Vp, got + ((size_t)step * NS + (r ? 33 : 9)) * Vp,
                     Vp * 4) != 0;
  CHECK_MSG(diff == 0, "40-row decode: %zu of 6 rows differ from their run in a batch of 2", diff);
  unsetenv("CT_DECODE_MMA_MAXN");
  free(ref);
  free(got);
  free(pair);
  ct_model_destroy(m);
}

/* one sequence with room for max_len positions: a `prompt`-token prompt, then `steps` decode
 * steps of one row; logits of each (1 + steps rows of Vp) */
static int g_graphs = 1; /* engine_logits_seq's CUDA graphs for decode steps: 1 on, 0 off */
static void engine_logits_seq(ct_model *m, const ct_ops *o, float *out, int max_len, int max_rows,
                              int prompt, int steps) {
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = 1;
  ic.max_len = max_len;
  ic.max_rows = max_rows;
  ic.device = 0;
  ic.graphs = g_graphs;
  ct_infer *e = NULL;
  CHECK(ct_infer_create(m, o, &ic, &e) == CT_OK);
  if (!e) return;
  const int Vp = ct_model_padded_vocab(ct_model_config(m)), s0 = 0;
  int32_t *toks = malloc(sizeof(int32_t) * (size_t)(prompt + steps));
  for (int i = 0; i < prompt + steps; i++) toks[i] = (i * 41 + 3) % 300;
  CHECK(ct_infer_prefill(e, 1, &s0, toks, prompt, out, NULL) == CT_OK);
  for (int step = 0; step < steps; step++)
    CHECK(ct_infer_decode(e, 1, &s0, toks + prompt + step, out + (size_t)(1 + step) * Vp, NULL) ==
          CT_OK);
  free(toks);
  ct_infer_destroy(e);
}

/* a 14-token prompt, then 8 decode steps (positions 14 .. 21: the newest key opens a new 16-key
 * split at 16); 9 x Vp logits */
static void engine_logits_1row(ct_model *m, const ct_ops *o, float *out) {
  engine_logits_seq(m, o, out, 40, 64, 14, 8);
}

/* A variant (its `ran` launches, or hints) against the default: the n logits a and b equal bit for
 * bit. Prints the outcome under `what`. */
static void same_bits(const char *what, const float *a, const float *b, size_t n, long ran,
                      const char *unit) {
  CHECK_MSG(ran > 0, "%s: no %s: the variant did not run", what, unit);
  size_t diff = 0;
  for (size_t i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], 4) != 0;
  CHECK_MSG(diff == 0, "%s: %zu of %zu logits differ from the default's", what, diff, n);
  printf("%s: %ld %s, logits %s\n", what, ran, unit, diff ? "DIFFER" : "bit-identical");
}

/* A variant whose arithmetic differs from the reference's (its `ran` launches): its n logits b,
 * after the first `skip`, within bf16 tolerance of ref's a (normalized), and its run without CUDA
 * graphs c equal to b bit for bit (all n). Prints the outcome under `what`; `ref` names the
 * reference. */
static void close_and_graph_bits(const char *what, const char *ref, const float *a, const float *b,
                                 const float *c, size_t n, size_t skip, long ran) {
  CHECK_MSG(ran > 0, "%s: the variant did not run", what);
  char w2[320];
  snprintf(w2, sizeof w2, "%s vs %s", what, ref);
  const double err = ct_check_close(w2, b + skip, a + skip, n - skip, 3e-2, 1e-6);
  size_t diff = 0;
  for (size_t i = 0; i < n; i++) diff += memcmp(&b[i], &c[i], 4) != 0;
  CHECK_MSG(diff == 0, "%s: %zu of %zu logits differ between graphs and no graphs", what, diff, n);
  printf("%s: %ld launches; normalized error %.2e vs %s; graphs = no graphs: %s\n", what, ran, err,
         ref, diff ? "DIFFER" : "bit-identical");
}

/* decode_layers (the batch-1 decode step as one persistent kernel, CT_DECODE_PERSIST=1) against
 * the per-layer kernels: logits within bf16 tolerance (its attention merges each block's splits,
 * then the blocks' partials: another order of the same sums), and with CUDA graphs equal to
 * without them bit for bit; GQA ratios 1, 2 and 4, head dims 64 / 128, with and without qk norm;
 * a 40-position cache (one attention block a kv head), 200 (a 70-token prompt, steps at 70 .. 81:
 * one block, 5-6 splits) and 512 (steps at 490 .. 501: 4 blocks a kv head, 31-32 splits) */
static void test_decode_layers(void) {
  static const int S[][4] = {{256, 2, 1, 0}, {256, 4, 4, 0}, {512, 8, 2, 0}, {256, 4, 1, 1}};
  static const int L[][3] = {{40, 14, 8}, {200, 70, 12}, {512, 490, 12}}; /* max_len, prompt, steps */
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama_T(3, S[si][0], S[si][1], S[si][2], !S[si][3], 5 + (uint64_t)si, 512);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m));
    for (size_t li = 0; li < sizeof L / sizeof L[0]; li++) {
      const size_t n = (size_t)(1 + L[li][2]) * Vp;
      float *a = calloc(n, 4), *b = calloc(n, 4), *c = calloc(n, 4);
      char what[192];
      snprintf(what, sizeof what, "decode_layers C%d H%d KV%d hd%d%s, %d-position cache", S[si][0],
               S[si][1], S[si][2], S[si][0] / S[si][1], S[si][3] ? " no qk norm" : "", L[li][0]);
      unsetenv("CT_DECODE_PERSIST");
      engine_logits_seq(m, ct_ops_cuda_bf16(), a, L[li][0], L[li][0], L[li][1], L[li][2]);
      const long before = ct_cuda_decode_layers_launches();
      setenv("CT_DECODE_PERSIST", "1", 1);
      engine_logits_seq(m, ct_ops_cuda_bf16(), b, L[li][0], L[li][0], L[li][1], L[li][2]);
      const long ran = ct_cuda_decode_layers_launches() - before;
      g_graphs = 0;
      engine_logits_seq(m, ct_ops_cuda_bf16(), c, L[li][0], L[li][0], L[li][1], L[li][2]);
      g_graphs = 1;
      unsetenv("CT_DECODE_PERSIST");
      /* tolerance on the decode steps' rows (row 0, the prefill's, comes from the same kernels) */
      close_and_graph_bits(what, "the per-layer kernels", a, b, c, n, Vp, ran);
      free(a);
      free(b);
      free(c);
    }
    ct_model_destroy(m);
  }
}

/* attention_decode_rope (qkv_rope_append + attention_decode as one kernel: the default up to 8
 * rows, CT_DECODE_FUSED_ATT=0 turns it off) gives the two kernels' logits bit for bit: one row
 * (prefill, then decode steps that open a new 16-key split) and three rows of different lengths in other slots, GQA ratios 1, 2 and 4, head
 * dims 64 / 128, with and without qk norm */
static void test_attention_decode_rope(void) {
  static const int S[][4] = {{256, 2, 1, 0}, {256, 4, 4, 0}, {512, 8, 2, 0}, {256, 4, 1, 1}};
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama(2, S[si][0], S[si][1], S[si][2], !S[si][3], 11 + (uint64_t)si);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m));
    for (int batch = 0; batch < 2; batch++) {
      const size_t rows = batch ? 15 : 9;
      float *a = calloc(rows * Vp, 4), *b = calloc(rows * Vp, 4);
      char what[160];
      snprintf(what, sizeof what, "attention_decode_rope C%d H%d KV%d hd%d%s, %s", S[si][0],
               S[si][1], S[si][2], S[si][0] / S[si][1], S[si][3] ? " no qk norm" : "",
               batch ? "3 rows" : "1 row");
      setenv("CT_DECODE_FUSED_ATT", "0", 1);
      if (batch) engine_logits(m, ct_ops_cuda_bf16(), NULL, a);
      else engine_logits_1row(m, ct_ops_cuda_bf16(), a);
      const long before = ct_cuda_attention_decode_rope_launches();
      setenv("CT_DECODE_FUSED_ATT", "1", 1);
      if (batch) engine_logits(m, ct_ops_cuda_bf16(), NULL, b);
      else engine_logits_1row(m, ct_ops_cuda_bf16(), b);
      unsetenv("CT_DECODE_FUSED_ATT");
      const long ran = ct_cuda_attention_decode_rope_launches() - before;
      same_bits(what, a, b, rows * Vp, ran, "launches");
      free(a);
      free(b);
    }
    ct_model_destroy(m);
  }
}

/* L2 hints (CT_DECODE_PREFETCH=1: decode kernels prefetch later kernels' weights; =att: only the
 * attention kernels do; =down / =downqkv: only they, naming the down projection's weights, or
 * those and the next layer's qkv weights; CT_DECODE_PF_AFTER=1: the fused attention prefetches
 * after its wait) change no value: logits bit for bit equal without them, with the two
 * attention kernels and with the fused one */
static void test_l2_hints(void) {
  static const char *const mode[] = {"1", "att", "down", "downqkv", "downqkv"};
  ct_model *m = tiny_llama(3, 512, 8, 2, true, 21);
  if (!m) return;
  const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m));
  for (int v = 0; v < 20; v++) {
    const int batch = v & 1, fused = (v >> 1) & 1, mi = v >> 2, after = mi == 4;
    const size_t rows = batch ? 15 : 9;
    float *a = calloc(rows * Vp, 4), *b = calloc(rows * Vp, 4);
    char what[128];
    snprintf(what, sizeof what, "l2 hints %s%s, %s, %s", mode[mi], after ? " after the wait" : "",
             batch ? "3 rows" : "1 row", fused ? "fused attention" : "two attention kernels");
    setenv("CT_DECODE_FUSED_ATT", fused ? "1" : "0", 1);
    unsetenv("CT_DECODE_PREFETCH");
    if (batch) engine_logits(m, ct_ops_cuda_bf16(), NULL, a);
    else engine_logits_1row(m, ct_ops_cuda_bf16(), a);
    const long before = ct_cuda_l2_hints_used();
    setenv("CT_DECODE_PREFETCH", mode[mi], 1);
    if (after) setenv("CT_DECODE_PF_AFTER", "1", 1);
    if (batch) engine_logits(m, ct_ops_cuda_bf16(), NULL, b);
    else engine_logits_1row(m, ct_ops_cuda_bf16(), b);
    unsetenv("CT_DECODE_PREFETCH");
    unsetenv("CT_DECODE_PF_AFTER");
    unsetenv("CT_DECODE_FUSED_ATT");
    const long used = ct_cuda_l2_hints_used() - before;
    same_bits(what, a, b, rows * Vp, used, "hints taken");
    free(a);
    free(b);
  }
  ct_model_destroy(m);
}

/* the staged GEMV (each block's weight slice copied to shared memory by the bulk copy engine
 * before the kernel waits: the default for 5-8 rows, CT_DECODE_STAGE=1 / =0 force it on / off)
 * changes no value: logits bit for bit equal without it (=0), for 1 row and 3 rows forced on, at
 * C 512 (its slices fit) and with GQA, qk norm and the fused attention; test_fused runs the
 * 8-row default against the CPU */
static void test_staged_gemv(void) {
  static const int S[][3] = {{512, 8, 2}, {256, 4, 4}};
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama(3, S[si][0], S[si][1], S[si][2], true, 31 + (uint64_t)si);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m));
    for (int batch = 0; batch < 2; batch++) {
      const size_t rows = batch ? 15 : 9;
      float *a = calloc(rows * Vp, 4), *b = calloc(rows * Vp, 4);
      char what[128];
      snprintf(what, sizeof what, "staged gemv C%d H%d KV%d, %s", S[si][0], S[si][1], S[si][2],
               batch ? "3 rows" : "1 row");
      setenv("CT_DECODE_STAGE", "0", 1);
      const long off0 = ct_cuda_gemv_staged_launches();
      if (batch) engine_logits(m, ct_ops_cuda_bf16(), NULL, a);
      else engine_logits_1row(m, ct_ops_cuda_bf16(), a);
      CHECK_MSG(ct_cuda_gemv_staged_launches() == off0, "%s: CT_DECODE_STAGE=0 still staged", what);
      const long before = ct_cuda_gemv_staged_launches();
      setenv("CT_DECODE_STAGE", "1", 1);
      if (batch) engine_logits(m, ct_ops_cuda_bf16(), NULL, b);
      else engine_logits_1row(m, ct_ops_cuda_bf16(), b);
      unsetenv("CT_DECODE_STAGE");
      const long ran = ct_cuda_gemv_staged_launches() - before;
      same_bits(what, a, b, rows * Vp, ran, "launches");
      free(a);
      free(b);
    }
    ct_model_destroy(m);
  }
}

/* attention_decode_rope merging in a thread block cluster (the default on sm_90) gives the
 * counter-merged kernel's logits bit for bit: GQA 1, 2 and 4, head dims 64 and 128; room for 200
 * positions (13 16-key splits in 4 blocks: clusters of 4), a 70-token prompt and 12 decode steps
 * at positions 70 .. 81 (the newest key opens a new split at 80) */
static void test_attention_cluster(void) {
  static const int S[][3] = {{256, 2, 1}, {256, 4, 4}, {512, 8, 2}};
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama_T(2, S[si][0], S[si][1], S[si][2], true, 41 + (uint64_t)si, 256);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m)), rows = 13;
    float *a = calloc(rows * Vp, 4), *b = calloc(rows * Vp, 4);
    char what[128];
    snprintf(what, sizeof what, "attention cluster merge C%d H%d KV%d", S[si][0], S[si][1], S[si][2]);
    setenv("CT_DECODE_CLUSTER", "0", 1);
    engine_logits_seq(m, ct_ops_cuda_bf16(), a, 200, 256, 70, 12);
    const long before = ct_cuda_attention_cluster_launches();
    setenv("CT_DECODE_CLUSTER", "1", 1);
    engine_logits_seq(m, ct_ops_cuda_bf16(), b, 200, 256, 70, 12);
    unsetenv("CT_DECODE_CLUSTER");
    const long ran = ct_cuda_attention_cluster_launches() - before;
    same_bits(what, a, b, rows * Vp, ran, "cluster launches");
    free(a);
    free(b);
    ct_model_destroy(m);
  }
}

/* attention_decode_rope with its blocks kept from sharing multiprocessors by unused shared memory
 * (att_pad in decode.cu) gives the logits of the unpadded launch bit for bit, clustered and not:
 * GQA 1, 2 and 4, head dims 64 and 128, the cluster test's lengths. Both modes, each asked for up
 * to one block a multiprocessor so that a GPU smaller than the default's half runs them too:
 * alone (CT_DECODE_ATT_ALONE=100: nothing beside attention's blocks) and apart
 * (CT_DECODE_ATT_APART=100, the default at most half: the output projection's and gate/up's GEMV
 * blocks padded so they cannot sit beside attention's, which triggers its dependents after its
 * wait; two padded GEMV launches for each attention launch). CT_DECODE_ATT_APART=0 with
 * CT_DECODE_ATT_ALONE=0 must pad nothing. */
static void test_attention_pad(void) {
  static const int S[][3] = {{256, 2, 1}, {256, 4, 4}, {512, 8, 2}};
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama_T(2, S[si][0], S[si][1], S[si][2], true, 61 + (uint64_t)si, 256);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m)), rows = 13, n = rows * Vp;
    for (int cl = 0; cl < 2; cl++) {
      float *a = calloc(n, 4), *b = calloc(n, 4);
      char what[160];
      setenv("CT_DECODE_CLUSTER", cl ? "1" : "0", 1);
      setenv("CT_DECODE_ATT_ALONE", "0", 1);
      setenv("CT_DECODE_ATT_APART", "0", 1);
      const long alone0 = ct_cuda_attention_alone_launches(), apart0 = ct_cuda_attention_apart_launches(),
                 gemv0 = ct_cuda_apart_gemv_launches();
      engine_logits_seq(m, ct_ops_cuda_bf16(), a, 200, 256, 70, 12);
      CHECK_MSG(ct_cuda_attention_alone_launches() == alone0 &&
                    ct_cuda_attention_apart_launches() == apart0 && ct_cuda_apart_gemv_launches() == gemv0,
                "C%d H%d KV%d: CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=0 still padded", S[si][0],
                S[si][1], S[si][2]);
      for (int mode = 0; mode < 2; mode++) {
        snprintf(what, sizeof what, "attention %s C%d H%d KV%d%s", mode ? "apart from the GEMVs" : "alone",
                 S[si][0], S[si][1], S[si][2], cl ? "" : " (no clusters)");
        setenv(mode ? "CT_DECODE_ATT_APART" : "CT_DECODE_ATT_ALONE", "100", 1);
        const long al = ct_cuda_attention_alone_launches(), ap = ct_cuda_attention_apart_launches(),
                   gv = ct_cuda_apart_gemv_launches();
        engine_logits_seq(m, ct_ops_cuda_bf16(), b, 200, 256, 70, 12);
        const long ran_alone = ct_cuda_attention_alone_launches() - al,
                   ran_apart = ct_cuda_attention_apart_launches() - ap,
                   gemvs = ct_cuda_apart_gemv_launches() - gv;
        setenv(mode ? "CT_DECODE_ATT_APART" : "CT_DECODE_ATT_ALONE", "0", 1);
        CHECK_MSG(mode ? ran_alone == 0 : ran_apart == 0 && gemvs == 0,
                  "%s: the other mode ran (%ld alone, %ld apart)", what, ran_alone, ran_apart);
        if (mode)
          CHECK_MSG(gemvs == 2 * ran_apart, "%s: %ld padded GEMV launches for %ld attention launches"
                    " (expected two each)", what, gemvs, ran_apart);
        same_bits(what, a, b, n, mode ? ran_apart : ran_alone, "padded launches");
      }
      unsetenv("CT_DECODE_ATT_ALONE");
      unsetenv("CT_DECODE_ATT_APART");
      unsetenv("CT_DECODE_CLUSTER");
      free(a);
      free(b);
    }
    ct_model_destroy(m);
  }
}

/* attention's split rows pushed into block 0 of its cluster by st.async and merged there from its
 * own shared memory (CT_DECODE_ATT_PUSH=1, the default, where the apart pad holds them, =2 at every
 * launch, asking for the bytes where there is no pad), and the pulled merge's second barrier
 * relaxed (CT_DECODE_ATT_RELAX=1, the default where nothing is pushed), change no value: logits bit
 * for bit equal to the merge over distributed shared memory with both barriers (both set to 0),
 * with CUDA graphs and without, GQA 1, 2 and 4, head dims 64 and 128, clusters of 4 blocks; so does
 * the heads split (CT_DECODE_ATT_HS=1: two warps a split, each with half the query heads; on by
 * default at one row where G = 2, so v 0-3 turn it off) */
static void test_attention_push(void) {
  static const int S[][3] = {{256, 2, 1}, {256, 4, 4}, {512, 8, 2}};
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama_T(2, S[si][0], S[si][1], S[si][2], true, 71 + (uint64_t)si, 256);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m)), rows = 13, n = rows * Vp;
    float *a = calloc(n, 4), *b = calloc(n, 4);
    setenv("CT_DECODE_CLUSTER", "1", 1);
    setenv("CT_DECODE_ATT_APART", "100", 1);
    setenv("CT_DECODE_ATT_PUSH", "0", 1);
    setenv("CT_DECODE_ATT_RELAX", "0", 1);
    engine_logits_seq(m, ct_ops_cuda_bf16(), a, 200, 256, 70, 12);
    /* v 0-2: pad, pad without graphs, no pad; v 3: the relaxed barrier; v 4-5: the heads split
     * (two warps a split where G >= 2) with the push into the pad, with graphs and without */
    for (int v = 0; v < 6; v++) {
      if (v >= 4 && S[si][1] == S[si][2]) continue; /* G 1: nothing to split */
      char what[160];
      snprintf(what, sizeof what, "attention %s (%s) C%d H%d KV%d",
               v < 3 ? "rows pushed to block 0" : v == 3 ? "merge's second barrier relaxed"
                                                         : "heads split, rows pushed to block 0",
               v == 0 || v == 4 ? "into the apart pad"
               : v == 1 || v == 5 ? "into the apart pad, no graphs" : "no pad",
               S[si][0], S[si][1], S[si][2]);
      if (v < 3 || v >= 4) setenv("CT_DECODE_ATT_PUSH", v < 2 || v >= 4 ? "1" : "2", 1);
      else setenv("CT_DECODE_ATT_PUSH", "0", 1);
      if (v == 3) setenv("CT_DECODE_ATT_RELAX", "1", 1);
      setenv("CT_DECODE_ATT_APART", v == 2 || v == 3 ? "0" : "100", 1);
      setenv("CT_DECODE_ATT_HS", v >= 4 ? "1" : "0", 1); /* (its default: on at 1 row, G 2) */
      g_graphs = v != 1 && v != 5;
      const long pb = ct_cuda_attention_push_launches(), rb = ct_cuda_attention_relax_launches();
      const long hb = ct_cuda_attention_hs_launches();
      engine_logits_seq(m, ct_ops_cuda_bf16(), b, 200, 256, 70, 12);
      g_graphs = 1;
      unsetenv("CT_DECODE_ATT_HS");
      if (v < 3)
        same_bits(what, a, b, n, ct_cuda_attention_push_launches() - pb, "pushed launches");
      else if (v == 3)
        same_bits(what, a, b, n, ct_cuda_attention_relax_launches() - rb, "relaxed launches");
      else
        same_bits(what, a, b, n, ct_cuda_attention_hs_launches() - hb, "heads-split launches");
    }
    unsetenv("CT_DECODE_ATT_RELAX");
    unsetenv("CT_DECODE_ATT_PUSH");
    unsetenv("CT_DECODE_ATT_APART");
    unsetenv("CT_DECODE_CLUSTER");
    free(a);
    free(b);
    ct_model_destroy(m);
  }
}

/* attention_decode_oproj (CT_DECODE_OPROJ=1: the output projection inside the cluster attention
 * kernel, each kv head's share summed apart and the shares in kv order) against the separate
 * projection (which test_engine checks against the CPU engine): logits within bf16 tolerance
 * (the projection's sums go in another order), and with CUDA graphs equal to without them bit
 * for bit; GQA 1, 2 and 4, head
 * dims 64 and 128, the cluster test's lengths (clusters of 4 blocks) */
static void test_attention_oproj(void) {
  static const int S[][3] = {{256, 2, 1}, {256, 4, 4}, {512, 8, 2}};
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama_T(2, S[si][0], S[si][1], S[si][2], true, 51 + (uint64_t)si, 256);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m)), rows = 13, n = rows * Vp;
    float *a = calloc(n, 4), *b = calloc(n, 4), *c = calloc(n, 4);
    char what[160];
    unsetenv("CT_DECODE_OPROJ");
    engine_logits_seq(m, ct_ops_cuda_bf16(), a, 200, 256, 70, 12);
    const long before = ct_cuda_attention_oproj_launches();
    setenv("CT_DECODE_OPROJ", "1", 1);
    engine_logits_seq(m, ct_ops_cuda_bf16(), b, 200, 256, 70, 12);
    const long ran = ct_cuda_attention_oproj_launches() - before;
    g_graphs = 0;
    engine_logits_seq(m, ct_ops_cuda_bf16(), c, 200, 256, 70, 12);
    g_graphs = 1;
    unsetenv("CT_DECODE_OPROJ");
    snprintf(what, sizeof what, "attention + output projection C%d H%d KV%d", S[si][0], S[si][1],
             S[si][2]);
    close_and_graph_bits(what, "the separate projection", a, b, c, n, 0, ran);
    free(a);
    free(b);
    free(c);
    ct_model_destroy(m);
  }
}

/* attention_decode_qkv (the norm + qkv projection inside the cluster attention kernel for one row,
 * opt-in: CT_DECODE_QKV_ATT=1; and its tail form, CT_DECODE_QKV_ATT=2: the projection's blocks
 * grouped by kv head, the last ones of each going on as its attention) gives the separate
 * projection's and attention kernel's logits bit for bit, with CUDA graphs and without: GQA 1, 2
 * and 4, head dims 64 and 128, with and without qk norm, with a (zero) qkv bias; a 14-token prompt then 8 steps (3 splits),
 * 70 then 12 (clusters with idle blocks), and 490 then 12 in a 512-position cache (every split of
 * the 8-block cluster busy, the largest max_T it takes) */
static void test_attention_qkv(void) {
  static const int S[][5] = {
      {256, 2, 1, 1, 0}, {256, 4, 4, 1, 0}, {512, 8, 2, 1, 0}, {256, 4, 1, 0, 0}, {256, 4, 2, 1, 1}};
  static const int L[][3] = {{40, 14, 8}, {200, 70, 12}, {512, 490, 12}}; /* max_len, prompt, steps */
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    ct_model *m = tiny_llama_B(2, S[si][0], S[si][1], S[si][2], S[si][3], S[si][4],
                               61 + (uint64_t)si, 512);
    if (!m) return;
    const size_t Vp = (size_t)ct_model_padded_vocab(ct_model_config(m));
    for (size_t li = 0; li < sizeof L / sizeof L[0]; li++) {
      const size_t n = (size_t)(1 + L[li][2]) * Vp;
      float *a = calloc(n, 4), *b = calloc(n, 4), *c = calloc(n, 4);
      char what[192];
      snprintf(what, sizeof what, "norm + qkv + attention C%d H%d KV%d hd%d%s%s, %d-position cache, "
               "%d-token prompt", S[si][0], S[si][1], S[si][2], S[si][0] / S[si][1],
               S[si][3] ? "" : " no qk norm", S[si][4] ? " qkv bias" : "", L[li][0], L[li][1]);
      setenv("CT_DECODE_QKV_ATT", "0", 1);
      const long off0 = ct_cuda_attention_qkv_launches();
      engine_logits_seq(m, ct_ops_cuda_bf16(), a, L[li][0], L[li][0], L[li][1], L[li][2]);
      CHECK_MSG(ct_cuda_attention_qkv_launches() == off0, "%s: CT_DECODE_QKV_ATT=0 still ran it", what);
      setenv("CT_DECODE_QKV_ATT", "1", 1);
      const long before = ct_cuda_attention_qkv_launches();
      engine_logits_seq(m, ct_ops_cuda_bf16(), b, L[li][0], L[li][0], L[li][1], L[li][2]);
      g_graphs = 0;
      engine_logits_seq(m, ct_ops_cuda_bf16(), c, L[li][0], L[li][0], L[li][1], L[li][2]);
      g_graphs = 1;
      unsetenv("CT_DECODE_QKV_ATT");
      const long ran = ct_cuda_attention_qkv_launches() - before;
      same_bits(what, a, b, n, ran, "launches");
      size_t diff = 0;
      for (size_t i = 0; i < n; i++) diff += memcmp(&b[i], &c[i], 4) != 0;
      CHECK_MSG(diff == 0, "%s: %zu of %zu logits differ between graphs and no graphs", what, diff, n);
      /* the tail form (CT_DECODE_QKV_ATT=2): the same bits as the separate kernels, graphs or not */
      char tw[224];
      snprintf(tw, sizeof tw, "%s, tail form", what);
      setenv("CT_DECODE_QKV_ATT", "2", 1);
      const long tail0 = ct_cuda_attention_qkv_tail_launches();
      memset(b, 0, n * 4);
      memset(c, 0, n * 4);
      engine_logits_seq(m, ct_ops_cuda_bf16(), b, L[li][0], L[li][0], L[li][1], L[li][2]);
      g_graphs = 0;
      engine_logits_seq(m, ct_ops_cuda_bf16(), c, L[li][0], L[li][0], L[li][1], L[li][2]);
      g_graphs = 1;
      unsetenv("CT_DECODE_QKV_ATT");
      same_bits(tw, a, b, n, ct_cuda_attention_qkv_tail_launches() - tail0, "launches");
      diff = 0;
      for (size_t i = 0; i < n; i++) diff += memcmp(&b[i], &c[i], 4) != 0;
      CHECK_MSG(diff == 0, "%s: %zu of %zu logits differ between graphs and no graphs", tw, diff, n);
      free(a);
      free(b);
      free(c);
    }
    ct_model_destroy(m);
  }
}

/* rmsnorm_rows_fwd / layernorm_rows_fwd against the CPU's rmsnorm_fwd / layernorm_fwd, guard values
 * after the output, widths that take the register path (multiples of 8 up to 2048, lanes with
 * and without a tail chunk) and two that fall back (2056, 100); then RMSNorm's bits against the
 * norm inside norm_matmul_fwd's GEMV: with an identity weight its product is the norm's value
 * itself (each output sums one nonzero product), for 1 to 16 rows (the CUDA-core GEMV at one
 * row, the tensor-core GEMV from 2: a warp a row up to 8, two from 9) and 40 (cuBLAS after this
 * norm). */
/* norm_matmul_argmax (the head GEMV with the argmax in its tail) against norm_matmul_fwd then
 * argmax_advance / argmax_rows on the same table: logits bit for bit, the same id, token,
 * position and host id. Each shape runs three times: random weights; the best row copied to a
 * lower index (a tie: the lower index wins); and a padding row (past V) made the largest (not
 * taken). A shape of 40,000 outputs has more blocks than run at once (warps loop over tasks and
 * the last block merges every block's partial); 2048 wide takes the other task shape. The fused
 * op applies by default only inside a graph capture: round 1 captures it, rounds 0 and 2 check that
 * an eager call is not applied, then force it (CT_DECODE_HEAD_ARGMAX=1). */
static void head_argmax_case(const ct_ops *o, int IC, int OC, int V, int advance) {
  char what[128];
  snprintf(what, sizeof what, "%s norm_matmul_argmax IC %d OC %d V %d%s", o->name, IC, OC, V,
           advance ? " advance" : "");
  const size_t nw_ = (size_t)OC * IC;
  float *x = malloc(IC * 4), *g = malloc(IC * 4), *w = malloc(nw_ * 4);
  float *la = malloc((size_t)OC * 4), *lb = malloc((size_t)OC * 4);
  for (int i = 0; i < IC; i++) x[i] = frand(), g[i] = 1.0f + 0.5f * frand();
  for (size_t i = 0; i < nw_; i++) w[i] = 0.05f * frand();
  void *dx = up(o, x, IC), *dg = up(o, g, IC), *dw = up(o, w, nw_);
  void *dla = o->alloc((size_t)OC * o->act_bytes), *dlb = o->alloc((size_t)OC * o->act_bytes);
  void *dln = o->alloc((size_t)IC * o->act_bytes);
  int32_t *dia = o->alloc(4), *dib = o->alloc(4), *dt = o->alloc(8), *dp = o->alloc(8);
  void *dmap = NULL;
  int32_t *hmap = advance ? mapped_ids(o, 1, &dmap) : NULL;
  int best = -1, lo = -1;
  for (int round = 0; round < 3; round++) {
    const int32_t tok0 = 5, pos0 = 41 + round;
    int32_t ia = -1, ib = -2, ta = -1, pa = -1, tb = -1, pb = -1, ha = -1, hb = -1;
    /* the reference: the two ops */
    o->to_device(dt, &tok0, 4);
    o->to_device(dp, &pos0, 4);
    o->norm_matmul_fwd(dlb, dln, dx, dg, dw, NULL, 1, IC, OC, 1e-6f);
    if (advance) o->argmax_advance(dib, dt, dp, (int32_t *)dmap, dlb, 1, V, OC);
    else o->argmax_rows(dib, dlb, 1, V, OC);
    o->to_host(&ib, dib, 4);
    o->to_host(&tb, dt, 4);
    o->to_host(&pb, dp, 4);
    if (hmap) hb = hmap[((pos0 + 1) & 1)], hmap[0] = hmap[1] = -1;
    down(o, lb, dlb, OC);
    /* the fused op: by default only while a graph is captured (round 1 captures it and replays
     * the graph); rounds 0 and 2 run it eagerly with CT_DECODE_HEAD_ARGMAX=1, after checking that
     * without it the eager call is not applied (rc 1: the caller runs the two ops) */
    o->to_device(dt, &tok0, 4);
    o->to_device(dp, &pos0, 4);
    o->zero(dla, (size_t)OC * o->act_bytes);
    const long n0 = ct_cuda_head_argmax_launches();
#define HEAD_AM() \
  o->norm_matmul_argmax(dla, dx, dg, dw, IC, OC, 1e-6f, dia, advance ? dt : NULL, \
                        advance ? dp : NULL, advance ? (int32_t *)dmap : NULL, V)
    int rc;
    if (round == 1) {
      o->graph_begin();
      rc = HEAD_AM();
      void *gr = o->graph_end();
      CHECK_MSG(gr != NULL, "%s: the capture failed", what);
      if (gr) {
        o->graph_launch(gr);
        o->graph_destroy(gr);
      }
    } else {
      CHECK_MSG(HEAD_AM() == 1 && ct_cuda_head_argmax_launches() == n0,
                "%s round %d: applied outside a graph capture by default", what, round);
      setenv("CT_DECODE_HEAD_ARGMAX", "1", 1);
      rc = HEAD_AM();
      unsetenv("CT_DECODE_HEAD_ARGMAX");
    }
#undef HEAD_AM
    CHECK_MSG(rc == 0 && ct_cuda_head_argmax_launches() == n0 + 1,
              "%s round %d: rc %d, %ld launches", what, round, rc,
              ct_cuda_head_argmax_launches() - n0);
    o->to_host(&ia, dia, 4);
    o->to_host(&ta, dt, 4);
    o->to_host(&pa, dp, 4);
    if (hmap) ha = hmap[((pos0 + 1) & 1)], hmap[0] = hmap[1] = -1;
    down(o, la, dla, OC);
    CHECK_MSG(!memcmp(la, lb, (size_t)OC * 4), "%s round %d: logits differ", what, round);
    CHECK_MSG(ia == ib && ia >= 0 && ia < V, "%s round %d: id %d, the two ops' %d", what, round,
              ia, ib);
    if (advance)
      CHECK_MSG(ta == ib && pa == pos0 + 1 && tb == ib && pb == pos0 + 1 && ha == ib && hb == ib,
                "%s round %d: token %d position %d host id %d (two ops: %d %d %d), expected %d %d",
                what, round, ta, pa, ha, tb, pb, hb, ib, pos0 + 1);
    else
      CHECK_MSG(ta == tok0 && pa == pos0, "%s round %d: token / position changed", what, round);
    if (round == 1) /* the tie took: the copy's lower index, with the same logit */
      CHECK_MSG(ib == lo && lb[lo] == lb[best], "%s: tie round: id %d, expected %d", what, ib, lo);
    if (round == 2) /* the padding row is the largest logit and not taken */
      CHECK_MSG(ib == lo && (V == OC || lb[OC - 1] > lb[lo]),
                "%s: padding round: id %d (expected %d), padding logit %g against %g", what, ib,
                lo, lb[OC - 1], lb[lo]);
    if (round == 0) { /* the best row again at a lower index */
      best = ib;
      lo = ib / 3;
      CHECK_MSG(lo < ib, "%s: the best row is row 0, no lower index to copy it to", what);
      memcpy(w + (size_t)lo * IC, w + (size_t)ib * IC, (size_t)IC * 4);
    } else if (round == 1 && V < OC) { /* a padding row, twice the best: the largest logit */
      for (int k = 0; k < IC; k++) w[(size_t)(OC - 1) * IC + k] = 2.0f * w[(size_t)lo * IC + k];
    }
    if (round < 2) {
      o->free(dw);
      dw = up(o, w, nw_);
    }
  }
  if (hmap) o->host_free(hmap);
  char err[512];
  CHECK_MSG(ct_cuda_check(err, sizeof err) == 0, "%s: %s", what, err);
  void *dev[] = {dx, dg, dw, dla, dlb, dln, dia, dib, dt, dp};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) o->free(dev[i]);
  free(x); free(g); free(w); free(la); free(lb);
}
static void test_head_argmax(void) {
  const ct_ops *ts[] = {ct_ops_cuda_bf16(), ct_ops_cuda_fp16()};
  for (int t = 0; t < 2; t++) {
    const ct_ops *o = ts[t];
    CHECK_MSG(o->norm_matmul_argmax != NULL, "%s: no norm_matmul_argmax", o->name);
    if (!o->norm_matmul_argmax) continue;
    head_argmax_case(o, 64, 1000, 990, 1);
    head_argmax_case(o, 1024, 40000, 39990, 1);
    head_argmax_case(o, 1024, 40000, 39990, 0);
    head_argmax_case(o, 2048, 5000, 4999, 1);
    head_argmax_case(o, 1536, 3000, 3000, 0);
  }
  /* the fp32 table and CT_DECODE_HEAD_ARGMAX=0: not applied (the caller runs the two ops) */
  const ct_ops *f = ct_ops_cuda();
  CHECK_MSG(!f->norm_matmul_argmax ||
                f->norm_matmul_argmax(NULL, NULL, NULL, NULL, 64, 100, 1e-6f, NULL, NULL, NULL,
                                      NULL, 100) == 1,
            "fp32 table: norm_matmul_argmax applied");
  setenv("CT_DECODE_HEAD_ARGMAX", "0", 1);
  const ct_ops *o = ct_ops_cuda_bf16();
  const long n0 = ct_cuda_head_argmax_launches();
  CHECK_MSG(o->norm_matmul_argmax(NULL, NULL, NULL, NULL, 64, 100, 1e-6f, NULL, NULL, NULL, NULL,
                                  100) == 1 &&
                ct_cuda_head_argmax_launches() == n0,
            "CT_DECODE_HEAD_ARGMAX=0: norm_matmul_argmax applied");
  unsetenv("CT_DECODE_HEAD_ARGMAX");
}

static void test_norm_rows(const ct_ops *o, double tol) {
  const ct_ops *c = ct_ops_cpu();
  static const int shapes[][2] = {{1, 64},  {3, 768},  {17, 1024}, {64, 1024},
                                  {5, 2048}, {7, 1000}, {4, 2056},  {2, 100}};
  char what[128];
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
    for (int ln = 0; ln < 2; ln++) {
      const int n = shapes[k][0], C = shapes[k][1];
      const size_t on = (size_t)n * C;
      float *x = rnd_buf(o, on, 3.0f), *w = rnd_buf(o, (size_t)C, 1.0f), *b = rnd_buf(o, (size_t)C, 0.5f);
      float *ref = malloc(on * 4), *st = malloc((size_t)2 * n * 4), *got = malloc((on + GUARD) * 4);
      if (ln) c->layernorm_fwd(ref, st, st + n, x, w, b, n, C, 1e-5f);
      else c->rmsnorm_fwd(ref, st, x, w, n, C, n, 0, 1e-6f);
      for (size_t i = 0; i < on + GUARD; i++) got[i] = guard_val;
      void *dx = up(o, x, on), *dw = up(o, w, (size_t)C), *db = up(o, b, (size_t)C);
      void *dout = up(o, got, on + GUARD);
      if (ln) o->layernorm_rows_fwd(dout, dx, dw, db, n, C, 1e-5f);
      else o->rmsnorm_rows_fwd(dout, dx, dw, n, C, 1e-6f);
      down(o, got, dout, on + GUARD);
      snprintf(what, sizeof what, "%s %s_rows_fwd N%d C%d", o->name, ln ? "layernorm" : "rmsnorm", n, C);
      ct_check_close(what, got, ref, on, tol, 1e-6);
      int guard_ok = 1;
      for (int i = 0; i < GUARD; i++) guard_ok &= got[on + i] == guard_val;
      CHECK_MSG(guard_ok, "%s: wrote past its output", what);
      o->free(dx), o->free(dw), o->free(db), o->free(dout);
      free(x), free(w), free(b), free(ref), free(st), free(got);
    }
  const int C = 1024;
  float *eye = calloc((size_t)C * C, 4);
  for (int i = 0; i < C; i++) eye[(size_t)i * C + i] = 1.0f;
  void *deye = up(o, eye, (size_t)C * C);
  static const int rows[] = {1, 2, 5, 8, 9, 12, 16, 40};
  for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
    const int n = rows[k];
    const size_t on = (size_t)n * C;
    float *x = rnd_buf(o, on, 3.0f), *w = rnd_buf(o, (size_t)C, 1.0f);
    float *a = malloc(on * 4), *g = malloc(on * 4);
    void *dx = up(o, x, on), *dw = up(o, w, (size_t)C);
    void *d1 = o->alloc(on * o->act_bytes), *d2 = o->alloc(on * o->act_bytes), *dl = o->alloc(on * o->act_bytes);
    o->rmsnorm_rows_fwd(d1, dx, dw, n, C, 1e-6f);
    o->norm_matmul_fwd(d2, dl, dx, dw, deye, NULL, n, C, C, 1e-6f);
    down(o, a, d1, on);
    down(o, g, d2, on);
    snprintf(what, sizeof what, "%s rmsnorm_rows_fwd N%d = the GEMV's norm", o->name, n);
    size_t diff = 0;
    for (size_t i = 0; i < on; i++) diff += memcmp(&a[i], &g[i], 4) != 0;
    CHECK_MSG(diff == 0, "%s: %zu of %zu values differ", what, diff, on);
    o->free(dx), o->free(dw), o->free(d1), o->free(d2), o->free(dl);
    free(x), free(w), free(a), free(g);
  }
  o->free(deye);
  free(eye);
}

int main(void) {
  char err[512];
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if ((vis && !vis[0]) || ct_cuda_init(0, err, sizeof err) != 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  const char *perf = getenv("CT_TEST_PERF");
  if (perf && !strcmp(perf, "att")) { /* attention_decode's timings alone */
    perf_attention(ct_ops_cuda_bf16());
    ct_cuda_shutdown();
    return ct_test_finish();
  }
  if (perf && !strcmp(perf, "only")) { /* the timings alone, under the caller's environment */
    perf_fused(ct_ops_cuda_bf16());
    ct_cuda_shutdown();
    return ct_test_finish();
  }
  run(ct_ops_cuda(), 1e-5);
  run(ct_ops_cuda_bf16(), 2e-2);
  const ct_ops *o = ct_ops_cuda_bf16();
  if (o->device_count() >= 2) { /* a second device's state: same results there */
    CHECK(o->set_device(1) == 0);
    run(o, 2e-2);
    CHECK(o->set_device(0) == 0);
  }
  test_fused(ct_ops_cuda(), 1e-5);
  /* the 16-bit GEMVs on the tensor cores (the default for 2-8 rows where IC is a multiple of
   * 256), then on the CUDA cores (CT_DECODE_MMA=0): both against the CPU, a batch's last row
   * against its run in another batch (test_fused) */
  const long mma0 = ct_cuda_gemv_mma_launches(), skd = ct_cuda_splitk_launches();
  const long gr_off = ct_cuda_gemm_rows_launches(), one0 = ct_cuda_gemv_one_launches();
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  test_fused(ct_ops_cuda_fp16(), 2e-2);
  CHECK_MSG(ct_cuda_gemv_mma_launches() > mma0, "no tensor-core GEMV ran");
  CHECK_MSG(ct_cuda_gemv_one_launches() > one0, "no one-row GEMV ran in its one-task form");
  CHECK_MSG(ct_cuda_gemm_rows_launches() == gr_off, "gemm_rows ran without CT_DECODE_GR=1");
  /* split-K partials are the default for 64-128 rows (the 64-row residual products above) */
  CHECK_MSG(ct_cuda_splitk_launches() > skd, "64-row residual products: no split-K product ran");
  setenv("CT_DECODE_SPLITK", "0", 1);
  const long sk_off = ct_cuda_splitk_launches();
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  CHECK_MSG(ct_cuda_splitk_launches() == sk_off, "CT_DECODE_SPLITK=0: a split-K product ran");
  unsetenv("CT_DECODE_SPLITK");
  /* the opt-in products of 9-64 rows (CT_DECODE_GR=1), with their default slices and k groups,
   * then other slice counts, k groups and block sizes: the same checks */
  setenv("CT_DECODE_GR", "1", 1);
  const long gr0 = ct_cuda_gemm_rows_launches();
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  test_fused(ct_ops_cuda_fp16(), 2e-2);
  CHECK_MSG(ct_cuda_gemm_rows_launches() > gr0, "CT_DECODE_GR=1: no gemm_rows product ran");
  setenv("CT_DECODE_GR_KS", "2", 1);
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  setenv("CT_DECODE_GR_KS", "1", 1);
  setenv("CT_DECODE_GR_WPB", "4", 1);
  test_fused(ct_ops_cuda_fp16(), 2e-2);
  unsetenv("CT_DECODE_GR_KS");
  setenv("CT_DECODE_GR_WK", "1", 1);
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  unsetenv("CT_DECODE_GR_WPB");
  setenv("CT_DECODE_GR_WK", "2", 1);
  setenv("CT_DECODE_MMA_MAXN", "8", 1); /* 9-16 rows too */
  test_fused(ct_ops_cuda_fp16(), 2e-2);
  unsetenv("CT_DECODE_MMA_MAXN");
  unsetenv("CT_DECODE_GR_WK");
  unsetenv("CT_DECODE_GR");
  setenv("CT_DECODE_MMA", "0", 1);
  const long mma1 = ct_cuda_gemv_mma_launches();
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  CHECK_MSG(ct_cuda_gemv_mma_launches() == mma1, "CT_DECODE_MMA=0: a tensor-core GEMV ran");
  /* the tensor-core GEMV for one row too (its solo runs then on the same kernel), and with one
   * and two tiles a block at a time */
  setenv("CT_DECODE_MMA", "all", 1);
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  unsetenv("CT_DECODE_MMA");
  setenv("CT_DECODE_MMA_TT", "1", 1);
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  setenv("CT_DECODE_MMA_TT", "2", 1);
  test_fused(ct_ops_cuda_fp16(), 2e-2);
  unsetenv("CT_DECODE_MMA_TT");
  /* the tensor-core GEMV up to 64 rows (2- and 4-tile blocks; opt-in), and 9+ rows back on
   * cuBLAS (CT_DECODE_MMA_MAXN=8, as before the tensor cores took them) */
  setenv("CT_DECODE_MMA_MAXN", "64", 1);
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  test_fused(ct_ops_cuda_fp16(), 2e-2);
  setenv("CT_DECODE_MMA_MAXN", "8", 1);
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  unsetenv("CT_DECODE_MMA_MAXN");
  /* the residual products past the GEMV as split-K partials at every row count (CT_DECODE_SPLITK=4) */
  setenv("CT_DECODE_SPLITK", "4", 1);
  const long sk0 = ct_cuda_splitk_launches();
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  test_fused(ct_ops_cuda_fp16(), 2e-2);
  CHECK_MSG(ct_cuda_splitk_launches() > sk0, "CT_DECODE_SPLITK=4: no split-K product ran");
  unsetenv("CT_DECODE_SPLITK");
  /* again with the staged GEMV at every row count where its slices fit */
  setenv("CT_DECODE_STAGE", "1", 1);
  const long staged0 = ct_cuda_gemv_staged_launches();
  test_fused(ct_ops_cuda_bf16(), 2e-2);
  CHECK_MSG(ct_cuda_gemv_staged_launches() > staged0, "CT_DECODE_STAGE=1: no staged GEMV ran");
  unsetenv("CT_DECODE_STAGE");
  test_norm_rows(ct_ops_cuda(), 1e-5);
  test_norm_rows(ct_ops_cuda_bf16(), 2e-2);
  test_norm_rows(ct_ops_cuda_fp16(), 2e-2);
  test_engine();
  test_engine_rows();
  test_decode_layers();
  test_attention_decode_rope();
  test_l2_hints();
  test_attention_cluster();
  test_attention_pad();
  test_attention_push();
  test_attention_oproj();
  test_attention_blk();
  test_head_argmax();
  /* the staged GEMV and the norm + qkv + attention kernel repeat gemv_kernel's arithmetic: their
   * bits are checked against it, so these run with the tensor-core GEMV off */
  setenv("CT_DECODE_MMA", "0", 1);
  test_staged_gemv();
  test_attention_qkv();
  unsetenv("CT_DECODE_MMA");
  if (perf && perf[0] == '1') {
    perf_fused(ct_ops_cuda_bf16());
    perf_attention(ct_ops_cuda_bf16());
  }
  ct_cuda_shutdown();
  return ct_test_finish();
}
