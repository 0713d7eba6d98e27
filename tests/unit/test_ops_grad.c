/* tests/unit/test_ops_grad.c — the CPU op table against naive references and finite differences.
 *
 * For every op with a backward: the forward is compared with a naive double-precision
 * implementation written here; the backward is compared with central finite differences of a
 * random linear functional L = sum(out * R) (evaluated in double, perturbation 1e-3 on fp32
 * inputs, pass at normalized error < 1e-2: FD noise is ~1e-4, a wrong term is O(1)); calling
 * backward twice must double every gradient (it accumulates); NULL gradient pointers must be
 * skipped. Sizes are odd (not multiples of 8) so vector tails are exercised, and a few larger
 * cases cross the kernels' parallel thresholds and are compared with the serial path.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/ops.h"
#include "tests/unit/ct_test.h"

static const ct_ops *ops;
static ct_rng rng = {.seed = 1234, .counter = 0};

#define FD_EPS 1e-3f
#define FD_RTOL 1e-2
#define FWD_RTOL 1e-5

static float *fnew(size_t n) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
  return p;
}
static float *frand(size_t n, float scale) {
  float *p = fnew(n);
  for (size_t i = 0; i < n; i++) p[i] = scale * ct_rng_normal(&rng);
  return p;
}
static float *fdup(const float *x, size_t n) {
  float *p = fnew(n);
  memcpy(p, x, n * sizeof(float));
  return p;
}
static void fd_to_f(float *dst, const double *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}
static double dotR(const float *out, const float *R, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)out[i] * R[i];
  return s;
}

/* Central differences of f(ctx) with respect to every element of x. The step actually taken
 * is measured after fp32 rounding, so the quotient uses the true perturbation. */
typedef double (*loss_fn)(void *ctx);
static float *fd_grad(loss_fn f, void *ctx, float *x, size_t n) {
  float *g = fnew(n);
  for (size_t i = 0; i < n; i++) {
    float x0 = x[i];
    x[i] = x0 + FD_EPS;
    float xp = x[i];
    double lp = f(ctx);
    x[i] = x0 - FD_EPS;
    float xm = x[i];
    double lm = f(ctx);
    x[i] = x0;
    g[i] = (float)((lp - lm) / ((double)xp - (double)xm));
  }
  return g;
}

/* Checks an analytic gradient against finite differences and reports the normalized error. */
static void check_fd(const char *what, const float *analytic, loss_fn f, void *ctx, float *x,
                     size_t n) {
  float *g = fd_grad(f, ctx, x, n);
  double e = ct_check_close(what, analytic, g, n, FD_RTOL, 1e-6);
  printf("  %-34s fd normalized error %.2e\n", what, e);
  free(g);
}

/* Checks that b == 2 a (backward called twice accumulates). */
static void check_doubled(const char *what, const float *once, const float *twice, size_t n) {
  float *want = fnew(n);
  for (size_t i = 0; i < n; i++) want[i] = 2.0f * once[i];
  ct_check_close(what, twice, want, n, 1e-6, 1e-7);
  free(want);
}

/* ======================================================================================== */
/* embedding                                                                                */

typedef struct { int B, T, C; const int32_t *tok; float *wte, *wpe, *out, *R; } embed_ctx;
static double embed_loss(void *p) {
  embed_ctx *c = p;
  ops->embed_fwd(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
  return dotR(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_embed(void) {
  int B = 2, T = 3, C = 5, Vp = 7, maxT = 4, N = B * T;
  int32_t tok[] = {3, 1, 3, 6, 0, 3};
  float *wte = frand((size_t)Vp * C, 1), *wpe = frand((size_t)maxT * C, 1);
  float *out = fnew((size_t)N * C), *R = frand((size_t)N * C, 1);
  embed_ctx c = {B, T, C, tok, wte, wpe, out, R};

  ops->embed_fwd(out, tok, wte, wpe, B, T, C);
  float *ref = fnew((size_t)N * C);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < C; i++) ref[n * C + i] = wte[tok[n] * C + i] + wpe[(n % T) * C + i];
  ct_check_close("embed_fwd", out, ref, (size_t)N * C, FWD_RTOL, 0);
  ops->embed_fwd(out, tok, wte, NULL, B, T, C);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < C; i++) ref[n * C + i] = wte[tok[n] * C + i];
  ct_check_close("embed_fwd (no wpe)", out, ref, (size_t)N * C, FWD_RTOL, 0);

  float *dwte = fnew((size_t)Vp * C), *dwpe = fnew((size_t)maxT * C);
  ops->embed_bwd(dwte, dwpe, R, tok, B, T, C);
  check_fd("embed_bwd dwte", dwte, embed_loss, &c, wte, (size_t)Vp * C);
  check_fd("embed_bwd dwpe", dwpe, embed_loss, &c, wpe, (size_t)maxT * C);
  /* token 3 appears three times: its row is the sum of three dout rows */
  CHECK(fabsf(dwte[3 * C] - (R[0] + R[2 * C] + R[5 * C])) < 1e-6f);
  float *dwte2 = fdup(dwte, (size_t)Vp * C), *dwpe2 = fdup(dwpe, (size_t)maxT * C);
  ops->embed_bwd(dwte2, dwpe2, R, tok, B, T, C);
  check_doubled("embed_bwd accumulates dwte", dwte, dwte2, (size_t)Vp * C);
  check_doubled("embed_bwd accumulates dwpe", dwpe, dwpe2, (size_t)maxT * C);
  memset(dwte2, 0, sizeof(float) * (size_t)Vp * C);
  ops->embed_bwd(dwte2, NULL, R, tok, B, T, C); /* dwpe NULL is skipped */
  ct_check_close("embed_bwd (dwpe NULL)", dwte2, dwte, (size_t)Vp * C, 0, 0);

  /* large: parallel path (columns split over threads) against per-row serial calls */
  {
    int B2 = 4, T2 = 64, C2 = 97, V2 = 50, N2 = B2 * T2;
    int32_t *tk = malloc(sizeof(int32_t) * (size_t)N2);
    for (int n = 0; n < N2; n++) tk[n] = (int32_t)(ct_rng_u64(&rng) % V2);
    float *d = frand((size_t)N2 * C2, 1);
    float *g1 = fnew((size_t)V2 * C2), *g2 = fnew((size_t)V2 * C2);
    float *p1 = fnew((size_t)T2 * C2), *p2 = fnew((size_t)T2 * C2);
    ops->embed_bwd(g1, p1, d, tk, B2, T2, C2);
    for (int n = 0; n < N2; n++)
      for (int i = 0; i < C2; i++) {
        g2[tk[n] * C2 + i] += d[(size_t)n * C2 + i];
        p2[(n % T2) * C2 + i] += d[(size_t)n * C2 + i];
      }
    ct_check_close("embed_bwd large dwte", g1, g2, (size_t)V2 * C2, 1e-6, 0);
    ct_check_close("embed_bwd large dwpe", p1, p2, (size_t)T2 * C2, 1e-6, 0);
    free(tk); free(d); free(g1); free(g2); free(p1); free(p2);
  }
  free(wte); free(wpe); free(out); free(R); free(ref); free(dwte); free(dwpe);
  free(dwte2); free(dwpe2);
}

/* ======================================================================================== */
/* layernorm                                                                                */

typedef struct { int N, C; float *inp, *w, *b, *out, *mean, *rstd, *R; } ln_ctx;
static double ln_loss(void *p) {
  ln_ctx *c = p;
  ops->layernorm_fwd(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 1e-5f);
  return dotR(c->out, c->R, (size_t)c->N * c->C);
}

static void ln_naive(float *out, float *mean, float *rstd, const float *x, const float *w,
                     const float *b, int N, int C, double eps) {
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int i = 0; i < C; i++) m += x[n * C + i];
    m /= C;
    for (int i = 0; i < C; i++) v += (x[n * C + i] - m) * (x[n * C + i] - m);
    v /= C;
    double r = 1.0 / sqrt(v + eps);
    for (int i = 0; i < C; i++) out[n * C + i] = (float)((x[n * C + i] - m) * r * w[i] + b[i]);
    mean[n] = (float)m;
    rstd[n] = (float)r;
  }
}

static void test_layernorm(void) {
  int N = 5, C = 19;
  float *inp = frand((size_t)N * C, 1), *w = frand(C, 1), *b = frand(C, 1);
  for (int i = 0; i < N * C; i++) inp[i] += 0.5f * (float)(i % 3); /* nonzero row means */
  float *out = fnew((size_t)N * C), *mean = fnew(N), *rstd = fnew(N), *R = frand((size_t)N * C, 1);
  ln_ctx c = {N, C, inp, w, b, out, mean, rstd, R};

  ops->layernorm_fwd(out, mean, rstd, inp, w, b, N, C, 1e-5f);
  float *ro = fnew((size_t)N * C), *rm = fnew(N), *rr = fnew(N);
  ln_naive(ro, rm, rr, inp, w, b, N, C, 1e-5);
  ct_check_close("layernorm_fwd out", out, ro, (size_t)N * C, FWD_RTOL, 0);
  ct_check_close("layernorm_fwd mean", mean, rm, N, FWD_RTOL, 0);
  ct_check_close("layernorm_fwd rstd", rstd, rr, N, FWD_RTOL, 0);

  float *dinp = fnew((size_t)N * C), *dw = fnew(C), *db = fnew(C);
  ops->layernorm_bwd(dinp, dw, db, R, inp, w, mean, rstd, N, C);
  /* the FD loss reruns the forward, which rewrites mean/rstd; the analytic pass used the
   * unperturbed ones, already consumed */
  check_fd("layernorm_bwd dinp", dinp, ln_loss, &c, inp, (size_t)N * C);
  check_fd("layernorm_bwd dw", dw, ln_loss, &c, w, C);
  check_fd("layernorm_bwd db", db, ln_loss, &c, b, C);

  ops->layernorm_fwd(out, mean, rstd, inp, w, b, N, C, 1e-5f);
  float *dinp2 = fdup(dinp, (size_t)N * C), *dw2 = fdup(dw, C), *db2 = fdup(db, C);
  ops->layernorm_bwd(dinp2, dw2, db2, R, inp, w, mean, rstd, N, C);
  check_doubled("layernorm_bwd accumulates dinp", dinp, dinp2, (size_t)N * C);
  check_doubled("layernorm_bwd accumulates dw", dw, dw2, C);
  check_doubled("layernorm_bwd accumulates db", db, db2, C);
  memset(dinp2, 0, sizeof(float) * (size_t)N * C);
  ops->layernorm_bwd(dinp2, NULL, NULL, R, inp, w, mean, rstd, N, C);
  ct_check_close("layernorm_bwd (dw, db NULL)", dinp2, dinp, (size_t)N * C, 0, 0);
  memset(dw2, 0, sizeof(float) * C);
  ops->layernorm_bwd(NULL, dw2, NULL, R, inp, w, mean, rstd, N, C);
  ct_check_close("layernorm_bwd (dinp NULL)", dw2, dw, C, 0, 0);

  /* large: the parallel path against row-at-a-time serial calls */
  {
    int N2 = 96, C2 = 301;
    float *x = frand((size_t)N2 * C2, 2), *w2 = frand(C2, 1), *b2 = frand(C2, 1);
    float *o1 = fnew((size_t)N2 * C2), *o2 = fnew((size_t)N2 * C2), *m1 = fnew(N2), *r1 = fnew(N2);
    float *m2 = fnew(N2), *r2 = fnew(N2), *d = frand((size_t)N2 * C2, 1);
    ops->layernorm_fwd(o1, m1, r1, x, w2, b2, N2, C2, 1e-5f);
    ln_naive(o2, m2, r2, x, w2, b2, N2, C2, 1e-5);
    ct_check_close("layernorm_fwd large", o1, o2, (size_t)N2 * C2, FWD_RTOL, 0);
    float *gi1 = fnew((size_t)N2 * C2), *gw1 = fnew(C2), *gb1 = fnew(C2);
    float *gi2 = fnew((size_t)N2 * C2), *gw2 = fnew(C2), *gb2 = fnew(C2);
    ops->layernorm_bwd(gi1, gw1, gb1, d, x, w2, m1, r1, N2, C2);
    for (int n = 0; n < N2; n++)
      ops->layernorm_bwd(gi2 + (size_t)n * C2, gw2, gb2, d + (size_t)n * C2, x + (size_t)n * C2,
                         w2, m1 + n, r1 + n, 1, C2);
    ct_check_close("layernorm_bwd large dinp", gi1, gi2, (size_t)N2 * C2, 1e-6, 0);
    ct_check_close("layernorm_bwd large dw", gw1, gw2, C2, 1e-5, 0);
    ct_check_close("layernorm_bwd large db", gb1, gb2, C2, 1e-5, 0);
    free(x); free(w2); free(b2); free(o1); free(o2); free(m1); free(r1); free(m2); free(r2);
    free(d); free(gi1); free(gw1); free(gb1); free(gi2); free(gw2); free(gb2);
  }
  free(inp); free(w); free(b); free(out); free(mean); free(rstd); free(R); free(ro); free(rm);
  free(rr); free(dinp); free(dw); free(db); free(dinp2); free(dw2); free(db2);
}

/* ======================================================================================== */
/* rmsnorm (plain and strided)                                                              */

typedef struct {
  int N, C, rpg;
  long gs;
  size_t len; /* elements of the inp/out buffers */
  float *inp, *w, *out, *rstd, *R;
} rms_ctx;
static double rms_loss(void *p) {
  rms_ctx *c = p;
  ops->rmsnorm_fwd(c->out, c->rstd, c->inp, c->w, c->N, c->C, c->rpg, c->gs, 1e-6f);
  return dotR(c->out, c->R, c->len);
}

static void rms_naive(float *out, const float *x, const float *w, int N, int C, int rpg, long gs,
                      double eps) {
  for (int n = 0; n < N; n++) {
    long off = (long)(n / rpg) * gs + (long)(n % rpg) * C;
    double ss = 0;
    for (int i = 0; i < C; i++) ss += (double)x[off + i] * x[off + i];
    double r = 1.0 / sqrt(ss / C + eps);
    for (int i = 0; i < C; i++) out[off + i] = (float)(x[off + i] * r * w[i]);
  }
}

static void rms_case(const char *name, int N, int C, int rpg, long gs, size_t len, long base) {
  char what[96];
  float *buf = frand(len, 1), *w = frand(C, 1), *R = frand(len, 1);
  float *inp = buf + base;
  float *outb = fnew(len), *refb = fnew(len), *rstd = fnew(N);
  for (size_t i = 0; i < len; i++) outb[i] = refb[i] = 777.0f; /* guards: must stay untouched */
  float *out = outb + base;
  /* the loss only sees out positions this op writes (others hold 777 * R, a constant) */
  rms_ctx c = {N, C, rpg, gs, len - (size_t)base, inp, w, out, rstd, R + base};

  ops->rmsnorm_fwd(out, rstd, inp, w, N, C, rpg, gs, 1e-6f);
  rms_naive(refb + base, inp, w, N, C, rpg, gs, 1e-6);
  snprintf(what, sizeof what, "%s fwd (with guards)", name);
  ct_check_close(what, outb, refb, len, FWD_RTOL, 0);

  float *dbuf = fnew(len), *dw = fnew(C);
  ops->rmsnorm_bwd(dbuf + base, dw, R + base, inp, w, rstd, N, C, rpg, gs);
  snprintf(what, sizeof what, "%s bwd dinp", name);
  check_fd(what, dbuf + base, rms_loss, &c, inp, len - (size_t)base);
  snprintf(what, sizeof what, "%s bwd dw", name);
  check_fd(what, dw, rms_loss, &c, w, C);

  ops->rmsnorm_fwd(out, rstd, inp, w, N, C, rpg, gs, 1e-6f);
  float *dbuf2 = fdup(dbuf, len), *dw2 = fdup(dw, C);
  ops->rmsnorm_bwd(dbuf2 + base, dw2, R + base, inp, w, rstd, N, C, rpg, gs);
  snprintf(what, sizeof what, "%s bwd accumulates dinp", name);
  check_doubled(what, dbuf, dbuf2, len);
  snprintf(what, sizeof what, "%s bwd accumulates dw", name);
  check_doubled(what, dw, dw2, C);
  memset(dbuf2, 0, sizeof(float) * len);
  ops->rmsnorm_bwd(dbuf2 + base, NULL, R + base, inp, w, rstd, N, C, rpg, gs);
  snprintf(what, sizeof what, "%s bwd (dw NULL)", name);
  ct_check_close(what, dbuf2, dbuf, len, 0, 0);
  free(buf); free(w); free(R); free(outb); free(refb); free(rstd); free(dbuf); free(dw);
  free(dbuf2); free(dw2);
}

static void test_rmsnorm(void) {
  rms_case("rmsnorm plain", 5, 19, 5, 0, 5 * 19, 0);
  /* Qwen3 qk_norm: qkv rows of (H + 2KV) hd; q heads: rows_per_group H, k heads: KV */
  int B = 2, T = 3, H = 4, KV = 2, hd = 6;
  long W3 = (long)(H + 2 * KV) * hd;
  size_t len = (size_t)B * T * W3;
  rms_case("rmsnorm strided q heads", B * T * H, hd, H, W3, len, 0);
  rms_case("rmsnorm strided k heads", B * T * KV, hd, KV, W3, len, (long)H * hd);

  /* large: parallel path against row-at-a-time serial calls */
  {
    int N2 = 80, C2 = 257;
    float *x = frand((size_t)N2 * C2, 2), *w2 = frand(C2, 1), *d = frand((size_t)N2 * C2, 1);
    float *o1 = fnew((size_t)N2 * C2), *o2 = fnew((size_t)N2 * C2), *r1 = fnew(N2);
    ops->rmsnorm_fwd(o1, r1, x, w2, N2, C2, N2, 0, 1e-6f);
    rms_naive(o2, x, w2, N2, C2, N2, 0, 1e-6);
    ct_check_close("rmsnorm_fwd large", o1, o2, (size_t)N2 * C2, FWD_RTOL, 0);
    float *gi1 = fnew((size_t)N2 * C2), *gw1 = fnew(C2), *gi2 = fnew((size_t)N2 * C2), *gw2 = fnew(C2);
    ops->rmsnorm_bwd(gi1, gw1, d, x, w2, r1, N2, C2, N2, 0);
    for (int n = 0; n < N2; n++)
      ops->rmsnorm_bwd(gi2 + (size_t)n * C2, gw2, d + (size_t)n * C2, x + (size_t)n * C2, w2,
                       r1 + n, 1, C2, 1, 0);
    ct_check_close("rmsnorm_bwd large dinp", gi1, gi2, (size_t)N2 * C2, 1e-6, 0);
    ct_check_close("rmsnorm_bwd large dw", gw1, gw2, C2, 1e-5, 0);
    free(x); free(w2); free(d); free(o1); free(o2); free(r1); free(gi1); free(gw1); free(gi2);
    free(gw2);
  }
}

/* ======================================================================================== */
/* matmul                                                                                   */

typedef struct { int N, IC, OC; float *inp, *w, *bias, *out, *R; } mm_ctx;
static double mm_loss(void *p) {
  mm_ctx *c = p;
  ops->matmul_fwd(c->out, c->inp, c->w, c->bias, c->N, c->IC, c->OC);
  return dotR(c->out, c->R, (size_t)c->N * c->OC);
}

static void mm_naive(float *out, const float *x, const float *w, const float *bias, int N, int IC,
                     int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = bias ? bias[o] : 0.0;
      for (int i = 0; i < IC; i++) s += (double)x[n * IC + i] * w[o * IC + i];
      out[n * OC + o] = (float)s;
    }
}

static void mm_case(int N, int IC, int OC, int with_bias) {
  char what[96];
  const char *tag = with_bias ? "bias" : "no bias";
  float *inp = frand((size_t)N * IC, 1), *w = frand((size_t)OC * IC, 1);
  float *bias = with_bias ? frand(OC, 1) : NULL;
  float *out = fnew((size_t)N * OC), *ref = fnew((size_t)N * OC), *R = frand((size_t)N * OC, 1);
  for (int i = 0; i < N * OC; i++) out[i] = 1e3f; /* fwd overwrites, never accumulates */
  mm_ctx c = {N, IC, OC, inp, w, bias, out, R};

  ops->matmul_fwd(out, inp, w, bias, N, IC, OC);
  mm_naive(ref, inp, w, bias, N, IC, OC);
  snprintf(what, sizeof what, "matmul_fwd %dx%dx%d %s", N, IC, OC, tag);
  ct_check_close(what, out, ref, (size_t)N * OC, FWD_RTOL, 0);

  float *dinp = fnew((size_t)N * IC), *dw = fnew((size_t)OC * IC), *db = fnew(OC);
  ops->matmul_bwd(dinp, dw, with_bias ? db : NULL, R, inp, w, N, IC, OC);
  snprintf(what, sizeof what, "matmul_bwd dinp (%s)", tag);
  check_fd(what, dinp, mm_loss, &c, inp, (size_t)N * IC);
  snprintf(what, sizeof what, "matmul_bwd dw (%s)", tag);
  check_fd(what, dw, mm_loss, &c, w, (size_t)OC * IC);
  if (with_bias) {
    check_fd("matmul_bwd dbias", db, mm_loss, &c, bias, OC);
  }
  float *dinp2 = fdup(dinp, (size_t)N * IC), *dw2 = fdup(dw, (size_t)OC * IC), *db2 = fdup(db, OC);
  ops->matmul_bwd(dinp2, dw2, with_bias ? db2 : NULL, R, inp, w, N, IC, OC);
  check_doubled("matmul_bwd accumulates dinp", dinp, dinp2, (size_t)N * IC);
  check_doubled("matmul_bwd accumulates dw", dw, dw2, (size_t)OC * IC);
  if (with_bias) check_doubled("matmul_bwd accumulates dbias", db, db2, OC);
  memset(dinp2, 0, sizeof(float) * (size_t)N * IC);
  ops->matmul_bwd(dinp2, NULL, NULL, R, inp, w, N, IC, OC);
  ct_check_close("matmul_bwd (dw, dbias NULL)", dinp2, dinp, (size_t)N * IC, 1e-6, 0);
  memset(dw2, 0, sizeof(float) * (size_t)OC * IC);
  ops->matmul_bwd(NULL, dw2, NULL, R, inp, w, N, IC, OC);
  ct_check_close("matmul_bwd (dinp NULL)", dw2, dw, (size_t)OC * IC, 1e-6, 0);
  free(inp); free(w); free(bias); free(out); free(ref); free(R); free(dinp); free(dw); free(db);
  free(dinp2); free(dw2); free(db2);
}

static void mm_large(int N, int IC, int OC) {
  char what[96];
  float *x = frand((size_t)N * IC, 1), *w = frand((size_t)OC * IC, 1), *b = frand(OC, 1);
  float *o = fnew((size_t)N * OC), *r = fnew((size_t)N * OC), *d = frand((size_t)N * OC, 1);
  ops->matmul_fwd(o, x, w, b, N, IC, OC);
  mm_naive(r, x, w, b, N, IC, OC);
  snprintf(what, sizeof what, "matmul_fwd large %dx%dx%d", N, IC, OC);
  ct_check_close(what, o, r, (size_t)N * OC, FWD_RTOL, 0);
  float *db = frand(OC, 1), *dw = frand((size_t)OC * IC, 1), *dx = frand((size_t)N * IC, 1);
  float *dbr = fdup(db, OC), *dwr = fdup(dw, (size_t)OC * IC), *dxr = fdup(dx, (size_t)N * IC);
  ops->matmul_bwd(dx, dw, db, d, x, w, N, IC, OC); /* accumulates onto the random values */
  for (int o2 = 0; o2 < OC; o2++) {
    double s = dbr[o2];
    for (int n = 0; n < N; n++) s += d[n * OC + o2];
    dbr[o2] = (float)s;
    for (int i = 0; i < IC; i++) {
      double t = dwr[o2 * IC + i];
      for (int n = 0; n < N; n++) t += (double)d[n * OC + o2] * x[n * IC + i];
      dwr[o2 * IC + i] = (float)t;
    }
  }
  for (int n = 0; n < N; n++)
    for (int i = 0; i < IC; i++) {
      double t = dxr[n * IC + i];
      for (int o2 = 0; o2 < OC; o2++) t += (double)d[n * OC + o2] * w[o2 * IC + i];
      dxr[n * IC + i] = (float)t;
    }
  snprintf(what, sizeof what, "matmul_bwd large %dx%dx%d dinp", N, IC, OC);
  ct_check_close(what, dx, dxr, (size_t)N * IC, 1e-5, 0);
  snprintf(what, sizeof what, "matmul_bwd large %dx%dx%d dw", N, IC, OC);
  ct_check_close(what, dw, dwr, (size_t)OC * IC, 1e-5, 0);
  snprintf(what, sizeof what, "matmul_bwd large %dx%dx%d dbias", N, IC, OC);
  ct_check_close(what, db, dbr, OC, 1e-5, 0);
  free(x); free(w); free(b); free(o); free(r); free(d); free(db); free(dw); free(dx); free(dbr);
  free(dwr); free(dxr);
}

/* matmul_rows_fwd (the decode GEMV): matmul_fwd's values against naive sums, and each row's bits
 * independent of the other rows and of the thread count (a batch row equals its solo run). */
static void mm_rows(int N, int IC, int OC, int bias) {
  char what[96];
  float *x = frand((size_t)N * IC, 1), *w = frand((size_t)OC * IC, 1), *b = frand(OC, 1);
  float *o = fnew((size_t)N * OC), *r = fnew((size_t)N * OC), *solo = fnew(OC);
  ops->matmul_rows_fwd(o, x, w, bias ? b : NULL, N, IC, OC);
  mm_naive(r, x, w, bias ? b : NULL, N, IC, OC);
  snprintf(what, sizeof what, "matmul_rows_fwd %dx%dx%d%s", N, IC, OC, bias ? " +bias" : "");
  ct_check_close(what, o, r, (size_t)N * OC, FWD_RTOL, 0);
  for (int n = 0; n < N; n++) {
    ct_ops_cpu_set_threads(1 + n % 2); /* solo runs on one thread and on two */
    ops->matmul_rows_fwd(solo, x + (size_t)n * IC, w, bias ? b : NULL, 1, IC, OC);
    CHECK_MSG(!memcmp(solo, o + (size_t)n * OC, sizeof(float) * (size_t)OC),
              "%s: row %d alone (%d threads) differs from its batch run", what, n, 1 + n % 2);
  }
  ct_ops_cpu_set_threads(2);
  free(x); free(w); free(b); free(o); free(r); free(solo);
}

static void test_matmul(void) {
  /* below 4 rows: 1 x 4 tiles, leftover outputs 1 x 1; from 4: 4 x 3 tiles, leftover rows
   * (N % 4) x 3, leftover outputs 4 x 1 and 1 x 1; the solo runs take the 1-row path */
  mm_rows(3, 13, 11, 1);    /* one 8-lane vector and a tail; 3 single outputs */
  mm_rows(2, 100, 1031, 0); /* threaded; 2 rows share each prefetch; 3 single outputs */
  mm_rows(5, 67, 33, 0);    /* one 4-row block and a 1 x 3 leftover row; no single output */
  mm_rows(4, 576, 1700, 1); /* threaded; 2 leftover outputs as 4 x 1 */
  mm_rows(11, 24, 31, 0);   /* 2 row blocks and a 3 x 3 leftover; no tail; 1 single output */
  mm_rows(17, 67, 35, 1);   /* threaded; 4 row blocks, 1 x 3 leftover; 4 x 1 and 1 x 1 outputs */
  mm_rows(34, 200, 97, 1);  /* threaded; 8 row blocks and a 2 x 3 leftover; 1 single output */
  mm_case(7, 13, 11, 1);
  mm_case(7, 13, 11, 0);
  mm_case(5, 3, 17, 1);
  /* large: threaded, sliced sgemm (by columns, then by rows) against naive sums */
  mm_large(130, 67, 171);
  mm_large(403, 67, 50);
}

/* ======================================================================================== */
/* rope                                                                                     */

typedef struct { int B, T, H, KV, hd, pos0; float theta; size_t len; float *qkv, *tmp, *R; } rope_ctx;
static double rope_loss(void *p) {
  rope_ctx *c = p;
  memcpy(c->tmp, c->qkv, sizeof(float) * c->len);
  ops->rope_fwd(c->tmp, c->B, c->T, c->H, c->KV, c->hd, c->pos0, c->theta);
  return dotR(c->tmp, c->R, c->len);
}

static void test_rope(void) {
  int B = 2, T = 5, H = 4, KV = 2, hd = 8, pos0 = 3;
  float theta = 10000.0f;
  long W3 = (long)(H + 2 * KV) * hd;
  size_t len = (size_t)B * T * W3;
  float *qkv = frand(len, 1), *y = fdup(qkv, len), *ref = fdup(qkv, len);
  ops->rope_fwd(y, B, T, H, KV, hd, pos0, theta);
  for (int n = 0; n < B * T; n++) {
    int t = n % T;
    for (int h = 0; h < H + KV; h++) { /* v heads (h >= H + KV) keep their values */
      const float *x = qkv + n * W3 + h * hd;
      float *o = ref + n * W3 + h * hd;
      for (int i = 0; i < hd / 2; i++) {
        double ang = (pos0 + t) * pow(theta, -2.0 * i / hd);
        o[i] = (float)(x[i] * cos(ang) - x[i + hd / 2] * sin(ang));
        o[i + hd / 2] = (float)(x[i + hd / 2] * cos(ang) + x[i] * sin(ang));
      }
    }
  }
  ct_check_close("rope_fwd (v untouched)", y, ref, len, 1e-5, 0);
  /* first position with pos0 = 0 is the identity */
  float *z = fdup(qkv, len);
  ops->rope_fwd(z, B, T, H, KV, hd, 0, theta);
  ct_check_close("rope_fwd pos 0 = identity", z, qkv, W3, 0, 0);

  /* rope is linear: its backward is the transpose, applied to dqkv = R in place */
  float *R = frand(len, 1), *g = fdup(R, len), *tmp = fnew(len);
  ops->rope_bwd(g, B, T, H, KV, hd, pos0, theta);
  rope_ctx c = {B, T, H, KV, hd, pos0, theta, len, qkv, tmp, R};
  check_fd("rope_bwd dqkv", g, rope_loss, &c, qkv, len);
  /* the rotation is orthogonal: bwd(fwd(x)) = x */
  ops->rope_bwd(y, B, T, H, KV, hd, pos0, theta);
  ct_check_close("rope_bwd(rope_fwd(x)) = x", y, qkv, len, 1e-6, 0);

  /* Qwen3-like theta and long positions: the angles still match double precision closely */
  {
    int T2 = 4, pos2 = 4000, hd2 = 128;
    long W = (long)(1 + 2) * hd2;
    float *a = frand((size_t)T2 * W, 1), *b = fdup(a, (size_t)T2 * W), *r = fdup(a, (size_t)T2 * W);
    ops->rope_fwd(b, 1, T2, 1, 1, hd2, pos2, 1e6f);
    for (int t = 0; t < T2; t++)
      for (int h = 0; h < 2; h++)
        for (int i = 0; i < hd2 / 2; i++) {
          const float *x = a + t * W + h * hd2;
          double ang = (pos2 + t) * pow(1e6, -2.0 * i / hd2);
          r[t * W + h * hd2 + i] = (float)(x[i] * cos(ang) - x[i + hd2 / 2] * sin(ang));
          r[t * W + h * hd2 + i + hd2 / 2] = (float)(x[i + hd2 / 2] * cos(ang) + x[i] * sin(ang));
        }
    ct_check_close("rope_fwd long positions", b, r, (size_t)T2 * W, 1e-3, 0);
    free(a); free(b); free(r);
  }
  free(qkv); free(y); free(ref); free(z); free(R); free(g); free(tmp);
}

/* ======================================================================================== */
/* attention                                                                                */

/* Naive causal GQA attention in double; P (B,H,T,T) optional. */
static void attn_naive_fwd(double *out, double *P, const float *qkv, int B, int T, int H, int KV,
                           int hd) {
  long W3 = (long)(H + 2 * KV) * hd;
  double scale = 1.0 / sqrt((double)hd);
  double *p = malloc(sizeof(double) * (size_t)T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      int kv = h / (H / KV);
      for (int t = 0; t < T; t++) {
        const float *q = qkv + ((long)b * T + t) * W3 + (long)h * hd;
        double mx = -INFINITY, sum = 0;
        for (int s = 0; s <= t; s++) {
          const float *k = qkv + ((long)b * T + s) * W3 + (long)(H + kv) * hd;
          double d = 0;
          for (int i = 0; i < hd; i++) d += (double)q[i] * k[i];
          p[s] = d * scale;
          if (p[s] > mx) mx = p[s];
        }
        for (int s = 0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
        for (int s = 0; s < T; s++) {
          double ps = s <= t ? p[s] / sum : 0.0;
          if (P) P[(((long)b * H + h) * T + t) * T + s] = ps;
        }
        double *o = out + ((long)b * T + t) * H * hd + (long)h * hd;
        for (int i = 0; i < hd; i++) {
          double a = 0;
          for (int s = 0; s <= t; s++)
            a += p[s] / sum * qkv[((long)b * T + s) * W3 + (long)(H + KV + kv) * hd + i];
          o[i] = a;
        }
      }
    }
  free(p);
}

/* Naive backward in double: dqkv += d/dqkv sum(out * dout). */
static void attn_naive_bwd(double *dqkv, const float *dout, const float *qkv, int B, int T, int H,
                           int KV, int hd) {
  long W3 = (long)(H + 2 * KV) * hd;
  double scale = 1.0 / sqrt((double)hd);
  double *P = malloc(sizeof(double) * (size_t)B * H * T * T);
  double *out = malloc(sizeof(double) * (size_t)B * T * H * hd);
  double *dp = malloc(sizeof(double) * (size_t)T);
  attn_naive_fwd(out, P, qkv, B, T, H, KV, hd);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      int kv = h / (H / KV);
      for (int t = 0; t < T; t++) {
        const double *p = P + (((long)b * H + h) * T + t) * T;
        const float *dO = dout + ((long)b * T + t) * H * hd + (long)h * hd;
        const float *q = qkv + ((long)b * T + t) * W3 + (long)h * hd;
        double sd = 0;
        for (int s = 0; s <= t; s++) {
          const float *v = qkv + ((long)b * T + s) * W3 + (long)(H + KV + kv) * hd;
          double d = 0;
          for (int i = 0; i < hd; i++) d += (double)dO[i] * v[i];
          dp[s] = d;
          sd += p[s] * d;
        }
        for (int s = 0; s <= t; s++) {
          double ds = p[s] * (dp[s] - sd) * scale;
          const float *k = qkv + ((long)b * T + s) * W3 + (long)(H + kv) * hd;
          double *dq = dqkv + ((long)b * T + t) * W3 + (long)h * hd;
          double *dk = dqkv + ((long)b * T + s) * W3 + (long)(H + kv) * hd;
          double *dv = dqkv + ((long)b * T + s) * W3 + (long)(H + KV + kv) * hd;
          for (int i = 0; i < hd; i++) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
            dv[i] += p[s] * dO[i];
          }
        }
      }
    }
  free(P); free(out); free(dp);
}

typedef struct { int B, T, H, KV, hd; float *qkv, *out, *state, *R; } attn_ctx;
static double attn_loss(void *p) {
  attn_ctx *c = p;
  ops->attention_fwd(c->out, c->state, c->qkv, c->B, c->T, c->H, c->KV, c->hd);
  return dotR(c->out, c->R, (size_t)c->B * c->T * c->H * c->hd);
}

static void attn_case(int B, int T, int H, int KV, int hd, int fd) {
  char what[96];
  long W3 = (long)(H + 2 * KV) * hd;
  size_t len = (size_t)B * T * W3, olen = (size_t)B * T * H * hd;
  size_t sf = ops->attention_state_floats(B, T, H, KV, hd);
  CHECK(sf >= (size_t)B * H * T * T);
  float *qkv = frand(len, 1), *out = fnew(olen), *state = fnew(sf), *R = frand(olen, 1);
  for (size_t i = 0; i < sf; i++) state[i] = -1.0f; /* fwd must fill all of it */
  double *ro = malloc(sizeof(double) * olen), *rP = malloc(sizeof(double) * (size_t)B * H * T * T);
  float *rof = fnew(olen), *rPf = fnew((size_t)B * H * T * T);

  ops->attention_fwd(out, state, qkv, B, T, H, KV, hd);
  attn_naive_fwd(ro, rP, qkv, B, T, H, KV, hd);
  fd_to_f(rof, ro, olen);
  fd_to_f(rPf, rP, (size_t)B * H * T * T);
  snprintf(what, sizeof what, "attention_fwd B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
  ct_check_close(what, out, rof, olen, FWD_RTOL, 0);
  snprintf(what, sizeof what, "attention_fwd probabilities H%d KV%d", H, KV);
  ct_check_close(what, state, rPf, (size_t)B * H * T * T, FWD_RTOL, 0);
  int upper_zero = 1;
  for (int bh = 0; bh < B * H; bh++)
    for (int t = 0; t < T; t++)
      for (int s = t + 1; s < T; s++) upper_zero &= state[((long)bh * T + t) * T + s] == 0.0f;
  CHECK_MSG(upper_zero, "attention state must be zero above the diagonal");

  float *dqkv = fnew(len);
  ops->attention_bwd(dqkv, R, qkv, state, B, T, H, KV, hd);
  double *rd = calloc(len, sizeof(double));
  float *rdf = fnew(len);
  attn_naive_bwd(rd, R, qkv, B, T, H, KV, hd);
  fd_to_f(rdf, rd, len);
  snprintf(what, sizeof what, "attention_bwd vs naive H%d KV%d T%d", H, KV, T);
  ct_check_close(what, dqkv, rdf, len, 1e-5, 0);
  if (fd) {
    attn_ctx c = {B, T, H, KV, hd, qkv, out, state, R};
    snprintf(what, sizeof what, "attention_bwd dqkv H%d KV%d", H, KV);
    check_fd(what, dqkv, attn_loss, &c, qkv, len);
    ops->attention_fwd(out, state, qkv, B, T, H, KV, hd);
  }
  float *dqkv2 = fdup(dqkv, len);
  ops->attention_bwd(dqkv2, R, qkv, state, B, T, H, KV, hd);
  snprintf(what, sizeof what, "attention_bwd accumulates H%d KV%d T%d", H, KV, T);
  check_doubled(what, dqkv, dqkv2, len);
  free(qkv); free(out); free(state); free(R); free(ro); free(rP); free(rof); free(rPf);
  free(dqkv); free(rd); free(rdf); free(dqkv2);
}

static void test_attention(void) {
  attn_case(2, 5, 4, 2, 6, 1); /* GQA */
  attn_case(2, 5, 3, 3, 6, 1); /* multi-head */
  attn_case(1, 7, 4, 1, 5, 1); /* multi-query, odd hd */
  attn_case(1, 70, 2, 1, 4, 1); /* T over one query block of the kernel (64 rows) */
  /* larger cases run the threaded path; with 4 threads and B*KV < 4 the group's query heads are
   * split over tasks whose dK/dV are summed afterwards */
  ct_ops_cpu_set_threads(4);
  attn_case(1, 33, 4, 1, 16, 0);
  attn_case(1, 40, 6, 2, 16, 0);
  attn_case(3, 37, 4, 4, 24, 0);
  attn_case(2, 150, 4, 2, 8, 0);
  ct_ops_cpu_set_threads(2);
}

/* ======================================================================================== */
/* activations                                                                              */

typedef struct { size_t n; float *inp, *out, *R; } act_ctx;
static double gelu_loss(void *p) {
  act_ctx *c = p;
  ops->gelu_fwd(c->out, c->inp, c->n);
  return dotR(c->out, c->R, c->n);
}

static void test_gelu(void) {
  size_t n = 37;
  float *x = frand(n, 2), *out = fnew(n), *ref = fnew(n), *R = frand(n, 1);
  x[0] = 0.0f; x[1] = 12.0f; x[2] = -12.0f; x[3] = 1e-4f; /* tails and the origin */
  ops->gelu_fwd(out, x, n);
  for (size_t i = 0; i < n; i++) {
    double v = x[i];
    ref[i] = (float)(0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
  }
  ct_check_close("gelu_fwd", out, ref, n, FWD_RTOL, 1e-7);
  float *d = fnew(n);
  ops->gelu_bwd(d, R, x, n);
  act_ctx c = {n, x, out, R};
  check_fd("gelu_bwd", d, gelu_loss, &c, x, n);
  float *d2 = fdup(d, n);
  ops->gelu_bwd(d2, R, x, n);
  check_doubled("gelu_bwd accumulates", d, d2, n);
  /* large: threaded, vectorized path against the naive formula */
  {
    size_t m = 40000;
    float *a = frand(m, 3), *o = fnew(m), *r = fnew(m);
    ops->gelu_fwd(o, a, m);
    for (size_t i = 0; i < m; i++) {
      double v = a[i];
      r[i] = (float)(0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
    }
    ct_check_close("gelu_fwd large", o, r, m, 1e-6, 1e-7);
    free(a); free(o); free(r);
  }
  free(x); free(out); free(ref); free(R); free(d); free(d2);
}

typedef struct { int N, F; float *inp, *out, *R; } swiglu_ctx;
static double swiglu_loss(void *p) {
  swiglu_ctx *c = p;
  ops->swiglu_fwd(c->out, c->inp, c->N, c->F);
  return dotR(c->out, c->R, (size_t)c->N * c->F);
}

static void test_swiglu(void) {
  int N = 3, F = 7;
  float *x = frand((size_t)N * 2 * F, 2), *out = fnew((size_t)N * F), *ref = fnew((size_t)N * F);
  float *R = frand((size_t)N * F, 1);
  x[0] = 30.0f; x[1] = -30.0f;
  ops->swiglu_fwd(out, x, N, F);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < F; i++) {
      double g = x[n * 2 * F + i], u = x[n * 2 * F + F + i];
      ref[n * F + i] = (float)(g / (1.0 + exp(-g)) * u);
    }
  ct_check_close("swiglu_fwd", out, ref, (size_t)N * F, FWD_RTOL, 0);
  float *d = fnew((size_t)N * 2 * F);
  ops->swiglu_bwd(d, R, x, N, F);
  swiglu_ctx c = {N, F, x, out, R};
  check_fd("swiglu_bwd", d, swiglu_loss, &c, x, (size_t)N * 2 * F);
  float *d2 = fdup(d, (size_t)N * 2 * F);
  ops->swiglu_bwd(d2, R, x, N, F);
  check_doubled("swiglu_bwd accumulates", d, d2, (size_t)N * 2 * F);
  free(x); free(out); free(ref); free(R); free(d); free(d2);
}

/* ======================================================================================== */
/* cross-entropy                                                                            */

typedef struct { int N, V, Vp; const int32_t *tg; float *logits, *tmp, *losses; double gs; } xent_ctx;
static double xent_loss(void *p) {
  xent_ctx *c = p;
  memcpy(c->tmp, c->logits, sizeof(float) * (size_t)c->N * c->Vp);
  ops->xent_fwd_bwd(c->losses, c->tmp, c->tg, c->N, c->V, c->Vp, 0.0f);
  double s = 0;
  for (int n = 0; n < c->N; n++) s += c->losses[n];
  return c->gs * s;
}

static void xent_naive(float *losses, const float *x, const int32_t *tg, int N, int V, int Vp) {
  for (int n = 0; n < N; n++) {
    if (tg[n] < 0) { losses[n] = 0; continue; }
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, x[n * Vp + i]);
    for (int i = 0; i < V; i++) s += exp(x[n * Vp + i] - mx);
    losses[n] = (float)(log(s) + mx - x[n * Vp + tg[n]]);
  }
}

static void test_xent(void) {
  int N = 4, V = 9, Vp = 12;
  int32_t tg[] = {3, -1, 8, 0};
  float gs = 0.7f;
  float *x = frand((size_t)N * Vp, 3);
  for (int n = 0; n < N; n++)
    for (int i = V; i < Vp; i++) x[n * Vp + i] = 1e4f; /* breaks the loss if not excluded */
  x[2 * Vp + 1] = 40.0f; /* a large real logit: max subtraction keeps exp finite */
  float *losses = fnew(N), *ref = fnew(N), *tmp = fnew((size_t)N * Vp);
  xent_naive(ref, x, tg, N, V, Vp);

  float *y = fdup(x, (size_t)N * Vp);
  ops->xent_fwd_bwd(losses, y, tg, N, V, Vp, 0.0f);
  ct_check_close("xent losses (no grad)", losses, ref, N, FWD_RTOL, 0);
  ct_check_close("xent grad_scale 0 leaves logits", y, x, (size_t)N * Vp, 0, 0);
  CHECK(losses[1] == 0.0f);

  ops->xent_fwd_bwd(losses, y, tg, N, V, Vp, gs);
  ct_check_close("xent losses (with grad)", losses, ref, N, FWD_RTOL, 0);
  int pad_zero = 1, ignored_zero = 1;
  for (int n = 0; n < N; n++)
    for (int i = V; i < Vp; i++) pad_zero &= y[n * Vp + i] == 0.0f;
  for (int i = 0; i < Vp; i++) ignored_zero &= y[1 * Vp + i] == 0.0f;
  CHECK_MSG(pad_zero, "padding columns must get zero gradient");
  CHECK_MSG(ignored_zero, "an ignored row must get zero gradient");
  /* each real row of the gradient sums to 0 (softmax minus one-hot) */
  for (int n = 0; n < N; n++) {
    double s = 0;
    for (int i = 0; i < V; i++) s += y[n * Vp + i];
    CHECK_MSG(fabs(s) < 1e-6, "row %d gradient sums to %g", n, s);
  }
  xent_ctx c = {N, V, Vp, tg, x, tmp, fnew(N), gs};
  check_fd("xent_fwd_bwd dlogits", y, xent_loss, &c, x, (size_t)N * Vp);

  /* large: threaded rows, a GPT-2-like padded vocabulary */
  {
    int N2 = 24, V2 = 5003, Vp2 = 5056;
    float *a = frand((size_t)N2 * Vp2, 4), *l1 = fnew(N2), *l2 = fnew(N2);
    int32_t *t2 = malloc(sizeof(int32_t) * N2);
    for (int n = 0; n < N2; n++) t2[n] = n % 5 == 4 ? -1 : (int32_t)(ct_rng_u64(&rng) % V2);
    xent_naive(l2, a, t2, N2, V2, Vp2);
    float *g = fdup(a, (size_t)N2 * Vp2);
    ops->xent_fwd_bwd(l1, g, t2, N2, V2, Vp2, 1.0f / N2);
    ct_check_close("xent losses large", l1, l2, N2, 1e-6, 0);
    float *gr = fnew((size_t)N2 * Vp2); /* naive gradient */
    for (int n = 0; n < N2; n++) {
      if (t2[n] < 0) continue;
      double mx = -INFINITY, s = 0;
      for (int i = 0; i < V2; i++) mx = fmax(mx, a[(size_t)n * Vp2 + i]);
      for (int i = 0; i < V2; i++) s += exp(a[(size_t)n * Vp2 + i] - mx);
      for (int i = 0; i < V2; i++)
        gr[(size_t)n * Vp2 + i] = (float)((exp(a[(size_t)n * Vp2 + i] - mx) / s - (i == t2[n])) / N2);
    }
    ct_check_close("xent grad large", g, gr, (size_t)N2 * Vp2, 1e-5, 0);
    free(a); free(l1); free(l2); free(t2); free(g); free(gr);
  }
  free(x); free(losses); free(ref); free(tmp); free(y); free(c.losses);
}

/* ======================================================================================== */
/* optimizer, reductions, memory                                                            */

static void test_adamw(void) {
  /* Expected values from torch.optim.AdamW(lr=0.1, betas=(0.9, 0.95), eps=1e-8,
   * weight_decay=0.1, foreach=False) with p.grad = 0.5 * g (grad_scale 0.5); element 0 by hand,
   * step 1: g = 0.2, p = 1 * (1 - 0.01) = 0.99, m = 0.02, v = 0.002, mhat = 0.2, vhat = 0.04,
   * p = 0.99 - 0.1 * 0.2 / 0.2 = 0.89. */
  float p[4] = {1.0f, -0.5f, 0.25f, 2.0f}, m[4] = {0}, v[4] = {0};
  const float g1[4] = {0.4f, -0.8f, 0.0f, 2.0f}, g2[4] = {-0.2f, 0.6f, 0.1f, 2.0f};
  const float want1[4] = {0.889999986f, -0.394999981f, 0.247500002f, 1.88f};
  const float want2[4] = {0.854263067f, -0.38208586f, 0.171529025f, 1.76119995f};
  const float wantm[4] = {0.00800000038f, -0.00600000191f, 0.00500000035f, 0.189999998f};
  const float wantv[4] = {0.00240000011f, 0.0121000009f, 0.000125000006f, 0.0974999964f};
  ops->adamw(p, g1, m, v, 4, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 1);
  ct_check_close("adamw step 1", p, want1, 4, 1e-6, 0);
  ops->adamw(p, g2, m, v, 4, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 2);
  ct_check_close("adamw step 2", p, want2, 4, 1e-6, 0);
  ct_check_close("adamw m", m, wantm, 4, 1e-6, 0);
  ct_check_close("adamw v", v, wantv, 4, 1e-6, 0);

  /* large, threaded: against the same formulas in double */
  size_t n = 50001;
  float *P = frand(n, 1), *G = frand(n, 1), *M = frand(n, 0.1f), *Vv = fnew(n);
  for (size_t i = 0; i < n; i++) Vv[i] = 0.01f * (float)(i % 7);
  double *pd = malloc(sizeof(double) * n);
  for (size_t i = 0; i < n; i++) {
    double g = (double)G[i] * 2.0, mm = 0.9 * M[i] + 0.1 * g, vv = 0.999 * Vv[i] + 0.001 * g * g;
    double bc1 = 1 - pow(0.9, 5), bc2 = 1 - pow(0.999, 5);
    pd[i] = P[i] * (1 - 1e-3 * 0.01) - 1e-3 * (mm / bc1) / (sqrt(vv / bc2) + 1e-8);
  }
  ops->adamw(P, G, M, Vv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 2.0f, 5);
  float *pf = fnew(n);
  fd_to_f(pf, pd, n);
  ct_check_close("adamw large", P, pf, n, 1e-6, 0);
  free(P); free(G); free(M); free(Vv); free(pd); free(pf);
}

/* flagged_rows, take_rows, scatter_add_rows (DDP's sparse embedding gradient) against plain loops:
 * any nonzero flag counts, rows come out ascending and nothing past them is written; taken rows
 * are left zero and the others untouched. R x C crosses the parallel threshold. */
static void test_rows(void) {
  const int R = 3001, C = 37;
  int32_t *flags = malloc(R * sizeof(int32_t)), *rows = malloc((R + 1) * sizeof(int32_t));
  int k = 0;
  for (int i = 0; i < R; i++) {
    flags[i] = i % 7 == 3 ? 1 : i % 11 == 0 ? -2 : i % 13 == 5 ? 5 : 0;
    k += flags[i] != 0;
  }
  for (int i = 0; i <= R; i++) rows[i] = -7;
  ops->flagged_rows(rows, flags, R);
  int bad = rows[k] != -7;
  for (int i = 0, j = 0; i < R; i++)
    if (flags[i]) bad += rows[j++] != i;
  CHECK_MSG(bad == 0, "flagged_rows: %d of %d rows wrong (or written past)", bad, k);

  const size_t RC = (size_t)R * C, KC = (size_t)k * C;
  float *src = frand(RC, 1), *ref = fdup(src, RC), *dst = fnew(KC), *want = fnew(KC);
  for (int i = 0; i < k; i++) {
    memcpy(want + (size_t)i * C, ref + (size_t)rows[i] * C, C * sizeof(float));
    memset(ref + (size_t)rows[i] * C, 0, C * sizeof(float));
  }
  ops->take_rows(dst, src, rows, k, C);
  ct_check_close("take_rows: the rows", dst, want, KC, 0, 0);
  ct_check_close("take_rows: the table left", src, ref, RC, 0, 0);

  float *add = frand(KC, 1);
  memcpy(ref, src, RC * sizeof(float));
  for (int i = 0; i < k; i++)
    for (int c = 0; c < C; c++) ref[(size_t)rows[i] * C + c] += add[(size_t)i * C + c];
  ops->scatter_add_rows(src, add, rows, k, C);
  ct_check_close("scatter_add_rows", src, ref, RC, 0, 0);
  free(flags); free(rows); free(src); free(ref); free(dst); free(want); free(add);
}

static void test_misc(void) {
  size_t n = 70001;
  float *a = frand(n, 1), *b = frand(n, 1), *o = fnew(n), *r = fnew(n);
  ops->add_fwd(o, a, b, n);
  for (size_t i = 0; i < n; i++) r[i] = a[i] + b[i];
  ct_check_close("add_fwd", o, r, n, 0, 0);
  ops->add_fwd(a, a, b, n); /* out aliases a */
  ct_check_close("add_fwd in place", a, r, n, 0, 0);

  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)b[i] * b[i];
  double got = ops->sumsq(b, n);
  CHECK_MSG(fabs(got - s) <= 1e-12 * s, "sumsq %.17g want %.17g", got, s);
  CHECK(ops->sumsq(b, 3) == (double)b[0] * b[0] + (double)b[1] * b[1] + (double)b[2] * b[2]);

  memcpy(r, b, n * sizeof(float));
  for (size_t i = 0; i < n; i++) r[i] *= 0.25f;
  ops->scale(b, 0.25f, n);
  ct_check_close("scale", b, r, n, 0, 0);

  float *d = ops->alloc(1000 * sizeof(float) + 3);
  CHECK(d != NULL && ((uintptr_t)d % 64) == 0);
  int zero = 1;
  for (int i = 0; i < 1000; i++) zero &= d[i] == 0.0f;
  CHECK_MSG(zero, "alloc must zero-fill");
  ops->to_device(d, a, 1000 * sizeof(float));
  ops->to_host(o, d, 1000 * sizeof(float));
  ct_check_close("to_device/to_host", o, a, 1000, 0, 0);
  ops->zero(d, 1000 * sizeof(float));
  CHECK(d[0] == 0.0f && d[999] == 0.0f);
  /* copy2d: 3 rows of 2 floats from stride 5 to stride 4 */
  for (int i = 0; i < 20; i++) d[i] = -1.0f;
  ops->copy2d(d, 4 * sizeof(float), a, 5 * sizeof(float), 2 * sizeof(float), 3);
  CHECK(d[0] == a[0] && d[1] == a[1] && d[2] == -1.0f && d[4] == a[5] && d[9] == a[11] &&
        d[10] == -1.0f);
  ops->free(d);
  free(a); free(b); free(o); free(r);
}

int main(void) {
  ops = ct_ops_cpu();
  ct_ops_cpu_set_threads(2);
  CHECK(strcmp(ops->name, "cpu") == 0);
  test_embed();
  test_layernorm();
  test_rmsnorm();
  test_matmul();
  test_rope();
  test_attention();
  test_gelu();
  test_swiglu();
  test_xent();
  test_adamw();
  test_rows();
  test_misc();
  return ct_test_finish();
}
