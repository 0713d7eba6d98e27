/* tests/gpu/test_ops_cuda.c — every op of the CUDA table against the CPU reference.
 *
 * Table-driven (ggml's test-backend-ops): a case names an op family, a shape and a tolerance.
 * For each case the inputs are drawn from a seeded generator, the CPU table (ct_ops_cpu) runs on
 * host copies and a CUDA table (ct_ops_cuda, ct_ops_cuda_bf16, ct_ops_cuda_fp16; inputs of a
 * 16-bit table are rounded to its type first, for both sides) on device copies moved with its own
 * to_device / to_host, and every buffer the op writes is compared by normalized error
 * (max|diff| / max|ref|, ct_check_close) with NaN/Inf checks. Around every device buffer sit
 * GUARD sentinel elements on each side that must come back unchanged (out-of-bounds writes);
 * outputs that the op must overwrite start as NaN (unwritten elements fail); gradients start
 * random (backward must accumulate); inputs must come back bit-identical.
 *
 *   test_ops_cuda            correctness, then a table of the worst normalized error per op
 *   test_ops_cuda --perf     time per op, GB/s (bytes each buffer must move once) and TFLOP/s
 *                            on the cases marked perf (realistic shapes); no CPU reference
 *   test_ops_cuda --small    correctness on the small cases only (for compute-sanitizer runs)
 *   test_ops_cuda --op NAME  only the ops whose name contains NAME (with any mode)
 *   test_ops_cuda --case S   only the cases whose shape name contains S (one shape under ncu)
 *   test_ops_cuda --dtype D  only the fp32, bf16 or fp16 table (default all three)
 *   test_ops_cuda --attn L   the attention variants a 16-bit table runs, comma-separated (default
 *                            batched,flash,flash2,flash2b,cudnn,auto,default, and in builds with
 *                            the Hopper kernels flash3 (backward form 1, two kernels:
 *                            CT_FLASH3_BWD=1), flash3-fused (form 1 fused, dQ by atomics:
 *                            CT_FLASH3_DQ_ATOMIC=1), flash3-bwd2 (backward form 2, producer warp +
 *                            TMA: flash3's default), flash3-fwd2 (forward form 2, producer
 *                            warp + TMA: CT_FLASH3_FWD=2, with the default backward); not in
 *                            the default list: flash3-bwd2o1, -bwd2o2, -bwd2o3, -bwd2o4, -bwd2o6
 *                            (form 2's kernel variants, CT_FLASH3_BWD2_OPT=N; 4 and 6 differ from
 *                            0 and 2 at hd 64 only), to time against -bwd2); perf
 *                            skips "default", which is timed as the variant it names; cudnn is
 *                            skipped, with a message, in builds without cuDNN attention)
 * Builds with cuDNN attention also compare the cudnn variant with flash2 on the same inputs
 * (forward output and backward gradients, GQA ratios 1-8, head dims 64 and 128, T off the tiles).
 *   test_ops_cuda --cpu      runs the harness with the CPU table in place of CUDA (checks the
 *                            harness itself on a machine without a GPU)
 *
 * Exits 77 (meson: skipped) when no CUDA device is visible.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "ct_build_config.h"
#include "kernels/cuda/ops_cuda.h"
#if CT_HAVE_CUDNN
#include "kernels/cuda/attention_cudnn.h"
#endif
#include "kernels/ops.h"
#include "tests/unit/ct_test.h"

int ct_cuda_device_count(void); /* kernels/cuda/device_query.cu */

#define GUARD 64              /* sentinel elements on each side of a device buffer */
#define SENTINEL 0x7fc0deadu  /* a NaN bit pattern: no op writes it by accident */
#define MAXB 10
#define RT_ELEM 1e-5          /* elementwise ops */
#define RT_RED 1e-4           /* reductions, matmul, attention */
#define RT_BF16 1e-2          /* any case with bf16 buffers (outputs rounded to 8 bits) */
#define RT_FP16 3e-3          /* any case with fp16 buffers (11 bits: 8x finer than bf16) */
#define SENTINEL16 0xffadu    /* a NaN in bf16 and in fp16: the guards of 16-bit buffers */

/* ---- cases ------------------------------------------------------------------------------ */

enum { R_IN, R_OUT, R_ACC }; /* read only; overwritten (starts NaN); read and written */
enum { I_RAND, I_POS, I_TOK, I_TGT };
enum { NOBIAS = 1, NODINP = 2, NOSTATS = 4, NOWPE = 8, NODW = 16, RMS = 32 };

typedef struct bspec {
  const char *name;
  size_t n; /* elements; 0 passes NULL */
  int role, init;
  float scale, offset; /* I_RAND: offset + scale * U(-sqrt3, sqrt3); I_POS: offset + scale * U(0,1) */
  int range;           /* I_TOK / I_TGT: integers in [0, range); I_TGT also -1 (ignored) */
  int act;             /* working dtype (the table's act_bytes), else fp32 / int32 */
  int opaque;          /* backend-defined (attention state of a 16-bit table): n is the device's
                          size, ncpu the CPU's; never compared, guards still checked */
  size_t ncpu;
} bspec;

struct tcase;
typedef struct family {
  const char *op;                                  /* op name, for the summary */
  int (*setup)(const struct tcase *c, bspec *b);   /* the buffers; returns how many */
  void (*prep)(const struct tcase *c, void **h);   /* derived inputs, computed on the CPU */
  void (*call)(const ct_ops *o, void **p, const struct tcase *c);
  double (*flops)(const struct tcase *c);
  int scalar; /* the call's result is g_scalar (sumsq) */
  /* device-only preparation after upload (fills an opaque state with the device's forward) */
  void (*dprep)(const ct_ops *o, void **p, const struct tcase *c);
} family;

typedef struct tcase {
  const family *fam;
  const char *shape;
  int B, T, C, H, KV, hd;
  int N, IC, OC, F, V, Vp;
  size_t n;
  int flags, pos0, step;
  float x; /* grad_scale / theta / scale factor, per family */
  double rtol;
  int perf; /* 1: also a perf case; 2: perf only (too large for the CPU reference) */
} tcase;

static double g_scalar;
static const ct_ops *dev; /* the table under test */
static int g_act16;       /* dev works in a 16-bit type (bf16 or fp16) */
static int g_fp16;        /* ... and it is fp16 */
static int W3(const tcase *c) { return (c->H + 2 * c->KV) * c->hd; }
static int NT(const tcase *c) { return c->B * c->T; }

#define BUF(nm, cnt, role, init, sc, off, rg) \
  (bspec) { nm, (size_t)(cnt), role, init, sc, off, rg, 0, 0, 0 }
#define IN(nm, cnt) BUF(nm, cnt, R_IN, I_RAND, 1.0f, 0.0f, 0)
#define OUT(nm, cnt) BUF(nm, cnt, R_OUT, I_RAND, 1.0f, 0.0f, 0)
#define ACC(nm, cnt) BUF(nm, cnt, R_ACC, I_RAND, 1.0f, 0.0f, 0)
#define F(i) ((float *)p[i])
/* working-dtype buffer i, `off` elements in */
#define AP(o, i, off) ((void *)((char *)p[i] + (size_t)(off) * (size_t)(o)->act_bytes))
static bspec act(bspec b) {
  b.act = 1;
  return b;
}

/* embedding */
static int su_embed_fwd(const tcase *c, bspec *b) {
  b[0] = act(OUT("out", (size_t)NT(c) * c->C));
  b[1] = BUF("tok", NT(c), R_IN, I_TOK, 0, 0, c->Vp);
  b[2] = act(IN("wte", (size_t)c->Vp * c->C));
  b[3] = act(IN("wpe", c->flags & NOWPE ? 0 : (size_t)(c->T + 3) * c->C));
  return 4;
}
static void ca_embed_fwd(const ct_ops *o, void **p, const tcase *c) {
  o->embed_fwd(p[0], p[1], p[2], p[3], c->B, c->T, c->C);
}
static int su_embed_bwd(const tcase *c, bspec *b) {
  b[0] = ACC("dwte", c->flags & NODW ? 0 : (size_t)c->Vp * c->C);
  b[1] = ACC("dwpe", c->flags & NOWPE ? 0 : (size_t)(c->T + 3) * c->C);
  b[2] = act(IN("dout", (size_t)NT(c) * c->C));
  b[3] = BUF("tok", NT(c), R_IN, I_TOK, 0, 0, c->V); /* V < Vp: small V repeats tokens */
  return 4;
}
static void ca_embed_bwd(const ct_ops *o, void **p, const tcase *c) {
  o->embed_bwd(F(0), F(1), p[2], p[3], c->B, c->T, c->C);
}

/* rows of a table (DDP's sparse embedding gradient): flags mark an irregular ~third of the rows
 * (values 1 or 3: any nonzero counts), and the same rows, ascending, are what take_rows and
 * scatter_add_rows get. The rows buffer is int32: its cases have rtol 0, which compares the bits. */
static int fr_flag(size_t i) { return (i * 7919 + 11) % 13 < 4 ? 1 + 2 * (int)(i & 1) : 0; }
static size_t fr_count(size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += fr_flag(i) != 0;
  return k;
}
static void fr_rows(int32_t *rows, size_t n) {
  for (size_t i = 0, k = 0; i < n; i++)
    if (fr_flag(i)) rows[k++] = (int32_t)i;
}
static int su_flagged_rows(const tcase *c, bspec *b) {
  b[0] = OUT("rows", fr_count(c->n));
  b[1] = BUF("flags", c->n, R_IN, I_TOK, 0, 0, 1); /* prep */
  return 2;
}
static void pr_flagged_rows(const tcase *c, void **h) {
  for (size_t i = 0; i < c->n; i++) ((int32_t *)h[1])[i] = fr_flag(i);
}
static void ca_flagged_rows(const ct_ops *o, void **p, const tcase *c) {
  o->flagged_rows(p[0], p[1], (int)c->n);
}
static int su_take_rows(const tcase *c, bspec *b) {
  const size_t k = fr_count((size_t)c->V);
  b[0] = OUT("dst", k * c->C);
  b[1] = ACC("src", (size_t)c->V * c->C); /* the taken rows must come back zero */
  b[2] = BUF("rows", k, R_IN, I_TOK, 0, 0, 1); /* prep */
  return 3;
}
static int su_scatter_rows(const tcase *c, bspec *b) {
  const size_t k = fr_count((size_t)c->V);
  b[0] = ACC("dst", (size_t)c->V * c->C);
  b[1] = IN("src", k * c->C);
  b[2] = BUF("rows", k, R_IN, I_TOK, 0, 0, 1); /* prep */
  return 3;
}
static void pr_rows(const tcase *c, void **h) { fr_rows(h[2], (size_t)c->V); }
static void ca_take_rows(const ct_ops *o, void **p, const tcase *c) {
  o->take_rows(F(0), F(1), p[2], (int)fr_count((size_t)c->V), c->C);
}
static void ca_scatter_rows(const ct_ops *o, void **p, const tcase *c) {
  o->scatter_add_rows(F(0), F(1), p[2], (int)fr_count((size_t)c->V), c->C);
}

/* layernorm */
static int su_ln_fwd(const tcase *c, bspec *b) {
  size_t nc = (size_t)c->N * c->C, ns = c->flags & NOSTATS ? 0 : (size_t)c->N;
  b[0] = act(OUT("out", nc));
  b[1] = OUT("mean", ns);
  b[2] = OUT("rstd", ns);
  b[3] = act(BUF("inp", nc, R_IN, I_RAND, 2.0f, 0.5f, 0));
  b[4] = act(BUF("w", c->C, R_IN, I_RAND, 0.2f, 1.0f, 0));
  b[5] = act(IN("b", c->flags & NOBIAS ? 0 : c->C));
  return 6;
}
static void ca_ln_fwd(const ct_ops *o, void **p, const tcase *c) {
  o->layernorm_fwd(p[0], F(1), F(2), p[3], p[4], p[5], c->N, c->C, 1e-5f);
}
static int su_ln_bwd(const tcase *c, bspec *b) {
  size_t nc = (size_t)c->N * c->C;
  b[0] = act(ACC("dinp", c->flags & NODINP ? 0 : nc));
  b[1] = ACC("dw", c->C);
  b[2] = ACC("db", c->flags & NOBIAS ? 0 : c->C);
  b[3] = act(IN("dout", nc));
  b[4] = act(BUF("inp", nc, R_IN, I_RAND, 2.0f, 0.5f, 0));
  b[5] = act(BUF("w", c->C, R_IN, I_RAND, 0.2f, 1.0f, 0));
  b[6] = IN("mean", c->N); /* prep */
  b[7] = IN("rstd", c->N);
  return 8;
}
static void pr_ln_bwd(const tcase *c, void **h) {
  float *tmp = malloc(sizeof(float) * (size_t)c->N * c->C);
  ct_ops_cpu()->layernorm_fwd(tmp, h[6], h[7], h[4], h[5], NULL, c->N, c->C, 1e-5f);
  free(tmp);
}
static void ca_ln_bwd(const ct_ops *o, void **p, const tcase *c) {
  o->layernorm_bwd(p[0], F(1), F(2), p[3], p[4], p[5], F(6), F(7), c->N, c->C);
}

/* rmsnorm, plain rows */
static int su_rms_fwd(const tcase *c, bspec *b) {
  size_t nc = (size_t)c->N * c->C;
  b[0] = act(OUT("out", nc));
  b[1] = OUT("rstd", c->flags & NOSTATS ? 0 : (size_t)c->N);
  b[2] = act(BUF("inp", nc, R_IN, I_RAND, 2.0f, 0.3f, 0));
  b[3] = act(BUF("w", c->C, R_IN, I_RAND, 0.2f, 1.0f, 0));
  return 4;
}
static void ca_rms_fwd(const ct_ops *o, void **p, const tcase *c) {
  o->rmsnorm_fwd(p[0], F(1), p[2], p[3], c->N, c->C, c->N, 0, 1e-6f);
}
static int su_rms_bwd(const tcase *c, bspec *b) {
  size_t nc = (size_t)c->N * c->C;
  b[0] = act(ACC("dinp", c->flags & NODINP ? 0 : nc));
  b[1] = ACC("dw", c->flags & NODW ? 0 : c->C);
  b[2] = act(IN("dout", nc));
  b[3] = act(BUF("inp", nc, R_IN, I_RAND, 2.0f, 0.3f, 0));
  b[4] = act(BUF("w", c->C, R_IN, I_RAND, 0.2f, 1.0f, 0));
  b[5] = IN("rstd", c->N); /* prep */
  return 6;
}
static void pr_rms_bwd(const tcase *c, void **h) {
  float *tmp = malloc(sizeof(float) * (size_t)c->N * c->C);
  ct_ops_cpu()->rmsnorm_fwd(tmp, h[5], h[3], h[4], c->N, c->C, c->N, 0, 1e-6f);
  free(tmp);
}
static void ca_rms_bwd(const ct_ops *o, void **p, const tcase *c) {
  o->rmsnorm_bwd(p[0], F(1), p[2], p[3], p[4], F(5), c->N, c->C, c->N, 0);
}

/* rmsnorm, strided (Qwen3 qk_norm): the q heads then the k heads of N qkv rows, like model.c */
static int su_qk_fwd(const tcase *c, bspec *b) {
  size_t nw = (size_t)c->N * W3(c);
  b[0] = act(ACC("qkv", nw)); /* v section untouched: starts random, must stay so */
  b[1] = OUT("rstd_q", (size_t)c->N * c->H);
  b[2] = OUT("rstd_k", (size_t)c->N * c->KV);
  b[3] = act(BUF("raw", nw, R_IN, I_RAND, 2.0f, 0.3f, 0));
  b[4] = act(BUF("wq", c->hd, R_IN, I_RAND, 0.2f, 1.0f, 0));
  b[5] = act(BUF("wk", c->hd, R_IN, I_RAND, 0.2f, 1.0f, 0));
  return 6;
}
static void ca_qk_fwd(const ct_ops *o, void **p, const tcase *c) {
  const int H = c->H, KV = c->KV, hd = c->hd, N = c->N, W = W3(c);
  o->rmsnorm_fwd(p[0], F(1), p[3], p[4], N * H, hd, H, W, 1e-6f);
  o->rmsnorm_fwd(AP(o, 0, (size_t)H * hd), F(2), AP(o, 3, (size_t)H * hd), p[5], N * KV, hd, KV, W,
                 1e-6f);
}
static int su_qk_bwd(const tcase *c, bspec *b) {
  size_t nw = (size_t)c->N * W3(c);
  b[0] = act(ACC("draw", nw));
  b[1] = ACC("dwq", c->hd);
  b[2] = ACC("dwk", c->hd);
  b[3] = act(IN("dqkv", nw));
  b[4] = act(BUF("raw", nw, R_IN, I_RAND, 2.0f, 0.3f, 0));
  b[5] = act(BUF("wq", c->hd, R_IN, I_RAND, 0.2f, 1.0f, 0));
  b[6] = act(BUF("wk", c->hd, R_IN, I_RAND, 0.2f, 1.0f, 0));
  b[7] = IN("rstd_q", (size_t)c->N * c->H); /* prep */
  b[8] = IN("rstd_k", (size_t)c->N * c->KV);
  return 9;
}
static void pr_qk_bwd(const tcase *c, void **h) {
  const int H = c->H, KV = c->KV, hd = c->hd, N = c->N, W = W3(c);
  float *tmp = calloc((size_t)N * W, sizeof(float));
  const ct_ops *o = ct_ops_cpu();
  o->rmsnorm_fwd(tmp, h[7], h[4], h[5], N * H, hd, H, W, 1e-6f);
  o->rmsnorm_fwd(tmp + (size_t)H * hd, h[8], (float *)h[4] + (size_t)H * hd, h[6], N * KV, hd, KV,
                 W, 1e-6f);
  free(tmp);
}
static void ca_qk_bwd(const ct_ops *o, void **p, const tcase *c) {
  const int H = c->H, KV = c->KV, hd = c->hd, N = c->N, W = W3(c);
  o->rmsnorm_bwd(p[0], F(1), p[3], p[4], p[5], F(7), N * H, hd, H, W);
  o->rmsnorm_bwd(AP(o, 0, (size_t)H * hd), F(2), AP(o, 3, (size_t)H * hd), AP(o, 4, (size_t)H * hd),
                 p[6], F(8), N * KV, hd, KV, W);
}

/* matmul */
static int su_mm_fwd(const tcase *c, bspec *b) {
  b[0] = act(OUT("out", (size_t)c->N * c->OC));
  b[1] = act(IN("inp", (size_t)c->N * c->IC));
  b[2] = act(BUF("w", (size_t)c->OC * c->IC, R_IN, I_RAND, 1.0f / sqrtf((float)c->IC), 0, 0));
  b[3] = act(IN("bias", c->flags & NOBIAS ? 0 : c->OC));
  return 4;
}
static void ca_mm_fwd(const ct_ops *o, void **p, const tcase *c) {
  o->matmul_fwd(p[0], p[1], p[2], p[3], c->N, c->IC, c->OC);
}
static double fl_mm_fwd(const tcase *c) { return 2.0 * c->N * c->IC * c->OC; }
static int su_mm_bwd(const tcase *c, bspec *b) {
  b[0] = act(ACC("dinp", c->flags & NODINP ? 0 : (size_t)c->N * c->IC));
  b[1] = ACC("dw", c->flags & NODW ? 0 : (size_t)c->OC * c->IC);
  b[2] = ACC("dbias", c->flags & NOBIAS ? 0 : c->OC);
  b[3] = act(IN("dout", (size_t)c->N * c->OC));
  b[4] = act(IN("inp", (size_t)c->N * c->IC));
  b[5] = act(BUF("w", (size_t)c->OC * c->IC, R_IN, I_RAND, 1.0f / sqrtf((float)c->IC), 0, 0));
  return 6;
}
static void ca_mm_bwd(const ct_ops *o, void **p, const tcase *c) {
  o->matmul_bwd(p[0], F(1), F(2), p[3], p[4], p[5], c->N, c->IC, c->OC);
}
static double fl_mm_bwd(const tcase *c) {
  return 2.0 * c->N * c->IC * c->OC * (!(c->flags & NODINP) + !(c->flags & NODW));
}

/* rope (in place on q and k of qkv) */
static int su_rope(const tcase *c, bspec *b) {
  b[0] = act(ACC("qkv", (size_t)NT(c) * W3(c)));
  return 1;
}
static void ca_rope_fwd(const ct_ops *o, void **p, const tcase *c) {
  o->rope_fwd(p[0], c->B, c->T, c->H, c->KV, c->hd, c->pos0, c->x);
}
static void ca_rope_bwd(const ct_ops *o, void **p, const tcase *c) {
  o->rope_bwd(p[0], c->B, c->T, c->H, c->KV, c->hd, c->pos0, c->x);
}

/* attention; flops counted as the useful (causal) ones: half of the dense products */
static size_t att_state(const tcase *c) {
  return ct_ops_cpu()->attention_state_floats(c->B, c->T, c->H, c->KV, c->hd);
}
/* fp32 tables keep the CPU's state (probabilities) and are compared on it; a 16-bit table's
 * state is its own (sized by its table) and is filled, for backward, by its own forward. */
static bspec state_spec(bspec s, const tcase *c) {
  if (!g_act16) return s;
  s.ncpu = s.n;
  s.n = dev->attention_state_floats(c->B, c->T, c->H, c->KV, c->hd);
  s.opaque = 1;
  return s;
}
static int su_att_fwd(const tcase *c, bspec *b) {
  b[0] = act(OUT("out", (size_t)NT(c) * c->H * c->hd));
  b[1] = state_spec(OUT("state", att_state(c)), c);
  b[2] = act(IN("qkv", (size_t)NT(c) * W3(c)));
  return 3;
}
static void ca_att_fwd(const ct_ops *o, void **p, const tcase *c) {
  o->attention_fwd(p[0], F(1), p[2], c->B, c->T, c->H, c->KV, c->hd);
}
static double fl_att_fwd(const tcase *c) { return 2.0 * c->B * c->H * (double)c->T * c->T * c->hd; }
static int su_att_bwd(const tcase *c, bspec *b) {
  b[0] = act(ACC("dqkv", (size_t)NT(c) * W3(c)));
  b[1] = act(IN("dout", (size_t)NT(c) * c->H * c->hd));
  b[2] = act(IN("qkv", (size_t)NT(c) * W3(c)));
  b[3] = state_spec(IN("state", att_state(c)), c); /* prep (CPU), dprep (bf16 device) */
  return 4;
}
static void dp_att_bwd(const ct_ops *o, void **p, const tcase *c) {
  if (!g_act16) return;
  void *tmp = o->alloc((size_t)NT(c) * c->H * c->hd * o->act_bytes);
  if (!tmp) return;
  o->attention_fwd(tmp, F(3), p[2], c->B, c->T, c->H, c->KV, c->hd);
  o->free(tmp);
}
static void pr_att_bwd(const tcase *c, void **h) {
  float *tmp = malloc(sizeof(float) * (size_t)NT(c) * c->H * c->hd);
  ct_ops_cpu()->attention_fwd(tmp, h[3], h[2], c->B, c->T, c->H, c->KV, c->hd);
  free(tmp);
}
static int g_perf_run; /* the case is being timed: attention backward as the model calls it */
static void ca_att_bwd(const ct_ops *o, void **p, const tcase *c) {
  if (g_perf_run && o->attention_bwd_set)
    o->attention_bwd_set(p[0], p[1], p[2], F(3), c->B, c->T, c->H, c->KV, c->hd);
  else
    o->attention_bwd(p[0], p[1], p[2], F(3), c->B, c->T, c->H, c->KV, c->hd);
}
static double fl_att_bwd(const tcase *c) { return 2.0 * fl_att_fwd(c); }

/* attention over a KV cache: N new queries at positions pos0.., cache (KV, T = max_T, hd) */
static int su_att_cached(const tcase *c, bspec *b) {
  b[0] = act(OUT("out", (size_t)c->N * c->H * c->hd));
  b[1] = act(IN("qkv", (size_t)c->N * W3(c)));
  b[2] = act(IN("kc", (size_t)c->KV * c->T * c->hd));
  b[3] = act(IN("vc", (size_t)c->KV * c->T * c->hd));
  return 4;
}
static void ca_att_cached(const ct_ops *o, void **p, const tcase *c) {
  o->attention_cached(p[0], p[1], p[2], p[3], c->N, c->pos0, c->H, c->KV, c->hd, c->T);
}
static double fl_att_cached(const tcase *c) {
  return 4.0 * c->N * c->H * c->hd * (c->pos0 + (c->N + 1) / 2.0);
}

/* activations */
static int su_gelu_fwd(const tcase *c, bspec *b) {
  b[0] = act(OUT("out", c->n));
  b[1] = act(BUF("inp", c->n, R_IN, I_RAND, 3.0f, 0, 0));
  return 2;
}
static void ca_gelu_fwd(const ct_ops *o, void **p, const tcase *c) { o->gelu_fwd(p[0], p[1], c->n); }
static int su_gelu_bwd(const tcase *c, bspec *b) {
  b[0] = act(ACC("dinp", c->n));
  b[1] = act(IN("dout", c->n));
  b[2] = act(BUF("inp", c->n, R_IN, I_RAND, 3.0f, 0, 0));
  return 3;
}
static void ca_gelu_bwd(const ct_ops *o, void **p, const tcase *c) {
  o->gelu_bwd(p[0], p[1], p[2], c->n);
}
static int su_swi_fwd(const tcase *c, bspec *b) {
  b[0] = act(OUT("out", (size_t)c->N * c->F));
  b[1] = act(BUF("inp", (size_t)c->N * 2 * c->F, R_IN, I_RAND, 3.0f, 0, 0));
  return 2;
}
static void ca_swi_fwd(const ct_ops *o, void **p, const tcase *c) {
  o->swiglu_fwd(p[0], p[1], c->N, c->F);
}
static int su_swi_bwd(const tcase *c, bspec *b) {
  b[0] = act(ACC("dinp", (size_t)c->N * 2 * c->F));
  b[1] = act(IN("dout", (size_t)c->N * c->F));
  b[2] = act(BUF("inp", (size_t)c->N * 2 * c->F, R_IN, I_RAND, 3.0f, 0, 0));
  return 3;
}
static void ca_swi_bwd(const ct_ops *o, void **p, const tcase *c) {
  o->swiglu_bwd(p[0], p[1], p[2], c->N, c->F);
}
static int su_add(const tcase *c, bspec *b) {
  b[0] = act(OUT("out", c->n));
  b[1] = act(IN("a", c->n));
  b[2] = act(IN("b", c->n));
  return 3;
}
static void ca_add(const ct_ops *o, void **p, const tcase *c) { o->add_fwd(p[0], p[1], p[2], c->n); }
static int su_add_alias(const tcase *c, bspec *b) {
  b[0] = act(ACC("out=a", c->n));
  b[1] = act(IN("b", c->n));
  return 2;
}
static void ca_add_alias(const ct_ops *o, void **p, const tcase *c) {
  o->add_fwd(p[0], p[0], p[1], c->n);
}

/* fused softmax + cross-entropy (logits overwritten by the gradient when grad_scale != 0) */
static int su_xent(const tcase *c, bspec *b) {
  b[0] = OUT("losses", c->N);
  b[1] = act(BUF("logits", (size_t)c->N * c->Vp, R_ACC, I_RAND, 3.0f, 0, 0));
  b[2] = BUF("targets", c->N, R_IN, I_TGT, 0, 0, c->V);
  return 3;
}
static void ca_xent(const ct_ops *o, void **p, const tcase *c) {
  o->xent_fwd_bwd(F(0), p[1], p[2], c->N, c->V, c->Vp, c->x);
}

/* optimizer and reductions */
static int su_adamw(const tcase *c, bspec *b) {
  b[0] = ACC("param", c->n);
  b[1] = IN("grad", c->n);
  b[2] = BUF("m", c->n, R_ACC, I_RAND, 0.1f, 0, 0);
  b[3] = BUF("v", c->n, R_ACC, I_POS, 0.01f, 1e-4f, 0);
  return 4;
}
static void ca_adamw(const ct_ops *o, void **p, const tcase *c) {
  o->adamw(F(0), F(1), F(2), F(3), c->n, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, c->x, c->step);
}
static int su_sumsq(const tcase *c, bspec *b) {
  b[0] = IN("x", c->n);
  return 1;
}
static void ca_sumsq(const ct_ops *o, void **p, const tcase *c) { g_scalar = o->sumsq(F(0), c->n); }
static int su_scale(const tcase *c, bspec *b) {
  b[0] = ACC("x", c->n);
  return 1;
}
static void ca_scale(const ct_ops *o, void **p, const tcase *c) { o->scale(F(0), c->x, c->n); }

/* memory: copy2d moves `C` elements (working dtype) from each of N rows, src stride OC, dst
 * stride IC, both starting `H` elements in (the v section of qkv rows, as model.c does); zero
 * clears all but 5 elements (fp32) at each end. */
static int su_copy2d(const tcase *c, bspec *b) {
  b[0] = act(ACC("dst", (size_t)c->N * c->IC));
  b[1] = act(IN("src", (size_t)c->N * c->OC));
  return 2;
}
static void ca_copy2d(const ct_ops *o, void **p, const tcase *c) {
  const size_t e = (size_t)o->act_bytes;
  o->copy2d(AP(o, 0, c->H), (size_t)c->IC * e, AP(o, 1, c->H), (size_t)c->OC * e, (size_t)c->C * e,
            (size_t)c->N);
}
static int su_zero(const tcase *c, bspec *b) {
  b[0] = ACC("x", c->n);
  return 1;
}
static void ca_zero(const ct_ops *o, void **p, const tcase *c) {
  o->zero(F(0) + 5, (c->n - 10) * sizeof(float));
}

/* fused residual add + norm: res (= a, aliased as the model uses it) += b, out = norm(res) */
static int su_add_norm(const tcase *c, bspec *b) {
  size_t nc = (size_t)c->N * c->C;
  const int rms = c->flags & RMS;
  b[0] = act(ACC("res=a", nc));
  b[1] = act(OUT("out", nc));
  b[2] = OUT("mean", rms ? 0 : (size_t)c->N);
  b[3] = OUT("rstd", c->N);
  b[4] = act(BUF("b", nc, R_IN, I_RAND, 2.0f, 0.5f, 0));
  b[5] = act(BUF("w", c->C, R_IN, I_RAND, 0.2f, 1.0f, 0));
  b[6] = act(IN("bias", rms || (c->flags & NOBIAS) ? 0 : c->C));
  return 7;
}
static void ca_add_norm(const ct_ops *o, void **p, const tcase *c) {
  o->add_norm_fwd(p[0], p[1], F(2), F(3), p[0], p[4], p[5], p[6], c->N, c->C, 1e-5f,
                  (c->flags & RMS) != 0);
}
/* fused matmul + GELU: pre = inp w^T + bias, act = gelu(pre) */
static int su_mm_gelu(const tcase *c, bspec *b) {
  b[0] = act(OUT("act", (size_t)c->N * c->OC));
  b[1] = act(OUT("pre", (size_t)c->N * c->OC));
  b[2] = act(IN("inp", (size_t)c->N * c->IC));
  b[3] = act(BUF("w", (size_t)c->OC * c->IC, R_IN, I_RAND, 2.0f / sqrtf((float)c->IC), 0, 0));
  b[4] = act(IN("bias", c->flags & NOBIAS ? 0 : c->OC));
  return 5;
}
static void ca_mm_gelu(const ct_ops *o, void **p, const tcase *c) {
  o->matmul_gelu_fwd(p[0], p[1], p[2], p[3], p[4], c->N, c->IC, c->OC);
}
/* dpre = (dout @ w) * gelu'(pre), overwritten */
static int su_mm_dgelu(const tcase *c, bspec *b) {
  b[0] = act(OUT("dpre", (size_t)c->N * c->IC));
  b[1] = act(IN("dout", (size_t)c->N * c->OC));
  b[2] = act(BUF("w", (size_t)c->OC * c->IC, R_IN, I_RAND, 1.0f / sqrtf((float)c->OC), 0, 0));
  b[3] = act(BUF("pre", (size_t)c->N * c->IC, R_IN, I_RAND, 3.0f, 0, 0));
  return 4;
}
static void ca_mm_dgelu(const ct_ops *o, void **p, const tcase *c) {
  o->matmul_dgelu_bwd(p[0], p[1], p[2], p[3], c->N, c->IC, c->OC);
}

static const family
    fam_embed_fwd = {"embed_fwd", su_embed_fwd, NULL, ca_embed_fwd, NULL, 0, NULL},
    fam_embed_bwd = {"embed_bwd", su_embed_bwd, NULL, ca_embed_bwd, NULL, 0, NULL},
    fam_flagged_rows = {"flagged_rows", su_flagged_rows, pr_flagged_rows, ca_flagged_rows, NULL, 0, NULL},
    fam_take_rows = {"take_rows", su_take_rows, pr_rows, ca_take_rows, NULL, 0, NULL},
    fam_scatter_rows = {"scatter_add_rows", su_scatter_rows, pr_rows, ca_scatter_rows, NULL, 0, NULL},
    fam_ln_fwd = {"layernorm_fwd", su_ln_fwd, NULL, ca_ln_fwd, NULL, 0, NULL},
    fam_ln_bwd = {"layernorm_bwd", su_ln_bwd, pr_ln_bwd, ca_ln_bwd, NULL, 0, NULL},
    fam_rms_fwd = {"rmsnorm_fwd", su_rms_fwd, NULL, ca_rms_fwd, NULL, 0, NULL},
    fam_rms_bwd = {"rmsnorm_bwd", su_rms_bwd, pr_rms_bwd, ca_rms_bwd, NULL, 0, NULL},
    fam_qk_fwd = {"rmsnorm_fwd", su_qk_fwd, NULL, ca_qk_fwd, NULL, 0, NULL},
    fam_qk_bwd = {"rmsnorm_bwd", su_qk_bwd, pr_qk_bwd, ca_qk_bwd, NULL, 0, NULL},
    fam_mm_fwd = {"matmul_fwd", su_mm_fwd, NULL, ca_mm_fwd, fl_mm_fwd, 0, NULL},
    fam_mm_bwd = {"matmul_bwd", su_mm_bwd, NULL, ca_mm_bwd, fl_mm_bwd, 0, NULL},
    fam_rope_fwd = {"rope_fwd", su_rope, NULL, ca_rope_fwd, NULL, 0, NULL},
    fam_rope_bwd = {"rope_bwd", su_rope, NULL, ca_rope_bwd, NULL, 0, NULL},
    fam_att_fwd = {"attention_fwd", su_att_fwd, NULL, ca_att_fwd, fl_att_fwd, 0, NULL},
    fam_att_bwd = {"attention_bwd", su_att_bwd, pr_att_bwd, ca_att_bwd, fl_att_bwd, 0, dp_att_bwd},
    fam_att_cached = {"attention_cached", su_att_cached, NULL, ca_att_cached, fl_att_cached, 0, NULL},
    fam_gelu_fwd = {"gelu_fwd", su_gelu_fwd, NULL, ca_gelu_fwd, NULL, 0, NULL},
    fam_gelu_bwd = {"gelu_bwd", su_gelu_bwd, NULL, ca_gelu_bwd, NULL, 0, NULL},
    fam_swi_fwd = {"swiglu_fwd", su_swi_fwd, NULL, ca_swi_fwd, NULL, 0, NULL},
    fam_swi_bwd = {"swiglu_bwd", su_swi_bwd, NULL, ca_swi_bwd, NULL, 0, NULL},
    fam_add = {"add_fwd", su_add, NULL, ca_add, NULL, 0, NULL},
    fam_add_alias = {"add_fwd", su_add_alias, NULL, ca_add_alias, NULL, 0, NULL},
    fam_xent = {"xent_fwd_bwd", su_xent, NULL, ca_xent, NULL, 0, NULL},
    fam_adamw = {"adamw", su_adamw, NULL, ca_adamw, NULL, 0, NULL},
    fam_sumsq = {"sumsq", su_sumsq, NULL, ca_sumsq, NULL, 1, NULL},
    fam_scale = {"scale", su_scale, NULL, ca_scale, NULL, 0, NULL},
    fam_copy2d = {"copy2d", su_copy2d, NULL, ca_copy2d, NULL, 0, NULL},
    fam_zero = {"zero", su_zero, NULL, ca_zero, NULL, 0, NULL},
    fam_add_norm = {"add_norm_fwd", su_add_norm, NULL, ca_add_norm, NULL, 0, NULL},
    fam_mm_gelu = {"matmul_gelu_fwd", su_mm_gelu, NULL, ca_mm_gelu, fl_mm_fwd, 0, NULL},
    fam_mm_dgelu = {"matmul_dgelu_bwd", su_mm_dgelu, NULL, ca_mm_dgelu, fl_mm_fwd, 0, NULL};

/* Small and odd shapes (not multiples of 32) first, then realistic ones (perf = 1):
 * GPT-2 124M (B=4, T=256, C=768, H=12), Qwen3-0.6B-like GQA (H=16/KV=8, hd=128; H=8/KV=2, hd=64). */
static const tcase cases[] = {
    {&fam_embed_fwd, "B3 T7 C37 Vp53", .B = 3, .T = 7, .C = 37, .Vp = 53, .rtol = RT_ELEM},
    {&fam_embed_fwd, "B2 T5 C70 Vp9 no wpe", .B = 2, .T = 5, .C = 70, .Vp = 9, .flags = NOWPE, .rtol = RT_ELEM},
    {&fam_embed_fwd, "B4 T256 C768 Vp50304", .B = 4, .T = 256, .C = 768, .Vp = 50304, .rtol = RT_ELEM, .perf = 1},
    {&fam_embed_bwd, "B3 T7 C37 V5 (repeats)", .B = 3, .T = 7, .C = 37, .V = 5, .Vp = 6, .rtol = RT_ELEM},
    {&fam_embed_bwd, "B4 T300 C45 V3 no wpe", .B = 4, .T = 300, .C = 45, .V = 3, .Vp = 3, .flags = NOWPE, .rtol = RT_ELEM},
    {&fam_embed_bwd, "B2 T9 C33 V40 no dwte", .B = 2, .T = 9, .C = 33, .V = 40, .Vp = 40, .flags = NODW, .rtol = RT_ELEM},
    {&fam_embed_bwd, "B4 T256 C768 V50257", .B = 4, .T = 256, .C = 768, .V = 50257, .Vp = 50304, .rtol = RT_ELEM, .perf = 1},
    {&fam_embed_bwd, "B64 T1024 C768 V50257", .B = 64, .T = 1024, .C = 768, .V = 50257, .Vp = 50304, .rtol = RT_ELEM, .perf = 2},
    {&fam_embed_bwd, "B64 T1024 C768 V257 (bytes)", .B = 64, .T = 1024, .C = 768, .V = 257, .Vp = 50304, .rtol = RT_ELEM, .perf = 2},
    /* flagged_rows runs one block of 1024 threads: fewer flags than threads, and many per thread */
    {&fam_flagged_rows, "n1000", .n = 1000, .rtol = 0},
    {&fam_flagged_rows, "n50304 (GPT-2 vocabulary)", .n = 50304, .rtol = 0, .perf = 1},
    {&fam_take_rows, "V53 C37", .V = 53, .C = 37, .rtol = 0},
    {&fam_take_rows, "V50304 C768 (GPT-2 wte)", .V = 50304, .C = 768, .rtol = 0, .perf = 1},
    {&fam_scatter_rows, "V53 C37", .V = 53, .C = 37, .rtol = 0},
    {&fam_scatter_rows, "V50304 C768 (GPT-2 wte)", .V = 50304, .C = 768, .rtol = 0, .perf = 1},
    {&fam_ln_fwd, "N37 C45", .N = 37, .C = 45, .rtol = RT_RED},
    {&fam_ln_fwd, "N5 C1000 no bias/stats", .N = 5, .C = 1000, .flags = NOBIAS | NOSTATS, .rtol = RT_RED},
    {&fam_ln_fwd, "N1024 C768", .N = 1024, .C = 768, .rtol = RT_RED, .perf = 1},
    {&fam_ln_fwd, "N65536 C768 (GPT-2 B64)", .N = 65536, .C = 768, .rtol = RT_RED, .perf = 2},
    {&fam_ln_bwd, "N37 C45", .N = 37, .C = 45, .rtol = RT_RED},
    {&fam_ln_bwd, "N300 C17 no bias/dinp", .N = 300, .C = 17, .flags = NOBIAS | NODINP, .rtol = RT_RED},
    {&fam_ln_bwd, "N1024 C768", .N = 1024, .C = 768, .rtol = RT_RED, .perf = 1},
    {&fam_ln_bwd, "N65536 C768 (GPT-2 B64)", .N = 65536, .C = 768, .rtol = RT_RED, .perf = 2},
    {&fam_rms_fwd, "N37 C45", .N = 37, .C = 45, .rtol = RT_RED},
    {&fam_rms_fwd, "N3 C999 no stats", .N = 3, .C = 999, .flags = NOSTATS, .rtol = RT_RED},
    {&fam_rms_fwd, "N1024 C1024", .N = 1024, .C = 1024, .rtol = RT_RED, .perf = 1},
    {&fam_rms_bwd, "N37 C45", .N = 37, .C = 45, .rtol = RT_RED},
    {&fam_rms_bwd, "N129 C7 no dinp", .N = 129, .C = 7, .flags = NODINP, .rtol = RT_RED},
    {&fam_rms_bwd, "N9 C33 no dw", .N = 9, .C = 33, .flags = NODW, .rtol = RT_RED},
    {&fam_rms_bwd, "N1024 C1024", .N = 1024, .C = 1024, .rtol = RT_RED, .perf = 1},
    {&fam_rms_bwd, "N16384 C1024", .N = 16384, .C = 1024, .rtol = RT_RED, .perf = 2},
    {&fam_qk_fwd, "qk N13 H3 KV1 hd10", .N = 13, .H = 3, .KV = 1, .hd = 10, .rtol = RT_RED},
    {&fam_qk_fwd, "qk N1024 H16 KV8 hd128", .N = 1024, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 1},
    {&fam_qk_bwd, "qk N13 H3 KV1 hd10", .N = 13, .H = 3, .KV = 1, .hd = 10, .rtol = RT_RED},
    {&fam_qk_bwd, "qk N1024 H16 KV8 hd128", .N = 1024, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 1},
    {&fam_mm_fwd, "N37 IC45 OC71 bias", .N = 37, .IC = 45, .OC = 71, .rtol = RT_RED},
    {&fam_mm_fwd, "N1 IC3 OC5", .N = 1, .IC = 3, .OC = 5, .flags = NOBIAS, .rtol = RT_RED},
    {&fam_mm_fwd, "N1024 768->2304 bias", .N = 1024, .IC = 768, .OC = 2304, .rtol = RT_RED, .perf = 1},
    {&fam_mm_fwd, "N1024 768->3072 bias", .N = 1024, .IC = 768, .OC = 3072, .rtol = RT_RED, .perf = 1},
    {&fam_mm_fwd, "N1024 3072->768 bias", .N = 1024, .IC = 3072, .OC = 768, .rtol = RT_RED, .perf = 1},
    {&fam_mm_fwd, "N1024 768->50304 head", .N = 1024, .IC = 768, .OC = 50304, .flags = NOBIAS, .rtol = RT_RED, .perf = 1},
    {&fam_mm_fwd, "N16384 768->2304 bias (qkv)", .N = 16384, .IC = 768, .OC = 2304, .rtol = RT_RED, .perf = 2},
    {&fam_mm_fwd, "N65536 768->2304 bias (qkv B64)", .N = 65536, .IC = 768, .OC = 2304, .rtol = RT_RED, .perf = 2},
    {&fam_mm_fwd, "N65536 768->3072 bias (fc B64)", .N = 65536, .IC = 768, .OC = 3072, .rtol = RT_RED, .perf = 2},
    {&fam_mm_fwd, "N16384 768->768 bias (proj)", .N = 16384, .IC = 768, .OC = 768, .rtol = RT_RED, .perf = 2},
    {&fam_mm_fwd, "N16384 768->3072 bias (fc)", .N = 16384, .IC = 768, .OC = 3072, .rtol = RT_RED, .perf = 2},
    {&fam_mm_fwd, "N16384 3072->768 bias (fcproj)", .N = 16384, .IC = 3072, .OC = 768, .rtol = RT_RED, .perf = 2},
    {&fam_mm_fwd, "N16384 768->50304 (head)", .N = 16384, .IC = 768, .OC = 50304, .flags = NOBIAS, .rtol = RT_RED, .perf = 2},
    {&fam_mm_bwd, "N37 IC45 OC71 bias", .N = 37, .IC = 45, .OC = 71, .rtol = RT_RED},
    {&fam_mm_bwd, "N300 IC5 OC3 no dinp/bias", .N = 300, .IC = 5, .OC = 3, .flags = NODINP | NOBIAS, .rtol = RT_RED},
    {&fam_mm_bwd, "N7 IC33 OC9 no dw", .N = 7, .IC = 33, .OC = 9, .flags = NODW, .rtol = RT_RED},
    {&fam_mm_bwd, "N1024 768->2304 bias", .N = 1024, .IC = 768, .OC = 2304, .rtol = RT_RED, .perf = 1},
    {&fam_mm_bwd, "N1024 768->3072 bias", .N = 1024, .IC = 768, .OC = 3072, .rtol = RT_RED, .perf = 1},
    {&fam_mm_bwd, "N1024 3072->768 bias", .N = 1024, .IC = 3072, .OC = 768, .rtol = RT_RED, .perf = 1},
    {&fam_mm_bwd, "N1024 768->50304 head", .N = 1024, .IC = 768, .OC = 50304, .flags = NOBIAS, .rtol = RT_RED, .perf = 1},
    {&fam_mm_bwd, "N16384 768->2304 bias (qkv)", .N = 16384, .IC = 768, .OC = 2304, .rtol = RT_RED, .perf = 2},
    {&fam_mm_bwd, "N16384 768->768 bias (proj)", .N = 16384, .IC = 768, .OC = 768, .rtol = RT_RED, .perf = 2},
    {&fam_mm_bwd, "N16384 768->3072 bias (fc)", .N = 16384, .IC = 768, .OC = 3072, .rtol = RT_RED, .perf = 2},
    {&fam_mm_bwd, "N16384 3072->768 bias (fcproj)", .N = 16384, .IC = 3072, .OC = 768, .rtol = RT_RED, .perf = 2},
    {&fam_mm_bwd, "N16384 768->50304 (head)", .N = 16384, .IC = 768, .OC = 50304, .flags = NOBIAS, .rtol = RT_RED, .perf = 2},
    {&fam_rope_fwd, "B2 T5 H4 KV2 hd6 pos0=3", .B = 2, .T = 5, .H = 4, .KV = 2, .hd = 6, .pos0 = 3, .x = 10000.0f, .rtol = RT_ELEM},
    {&fam_rope_fwd, "B1 T64 H2 KV1 hd16 pos0=4000", .B = 1, .T = 64, .H = 2, .KV = 1, .hd = 16, .pos0 = 4000, .x = 1e6f, .rtol = RT_ELEM},
    {&fam_rope_fwd, "B4 T256 H16 KV8 hd128", .B = 4, .T = 256, .H = 16, .KV = 8, .hd = 128, .x = 1e6f, .rtol = RT_ELEM, .perf = 1},
    {&fam_rope_bwd, "B2 T5 H4 KV2 hd6 pos0=3", .B = 2, .T = 5, .H = 4, .KV = 2, .hd = 6, .pos0 = 3, .x = 10000.0f, .rtol = RT_ELEM},
    {&fam_rope_bwd, "B4 T256 H16 KV8 hd128", .B = 4, .T = 256, .H = 16, .KV = 8, .hd = 128, .x = 1e6f, .rtol = RT_ELEM, .perf = 1},
    {&fam_att_fwd, "B2 T7 H3 KV3 hd5", .B = 2, .T = 7, .H = 3, .KV = 3, .hd = 5, .rtol = RT_RED},
    {&fam_att_fwd, "B2 T33 H4 KV2 hd8", .B = 2, .T = 33, .H = 4, .KV = 2, .hd = 8, .rtol = RT_RED},
    {&fam_att_fwd, "B1 T1 H2 KV1 hd4", .B = 1, .T = 1, .H = 2, .KV = 1, .hd = 4, .rtol = RT_RED},
    {&fam_att_fwd, "B4 T256 H12 hd64", .B = 4, .T = 256, .H = 12, .KV = 12, .hd = 64, .rtol = RT_RED, .perf = 1},
    {&fam_att_fwd, "B4 T256 H8 KV2 hd64", .B = 4, .T = 256, .H = 8, .KV = 2, .hd = 64, .rtol = RT_RED, .perf = 1},
    {&fam_att_fwd, "B4 T1024 H12 hd64", .B = 4, .T = 1024, .H = 12, .KV = 12, .hd = 64, .rtol = RT_RED, .perf = 1},
    {&fam_att_fwd, "B2 T77 H4 KV2 hd64", .B = 2, .T = 77, .H = 4, .KV = 2, .hd = 64, .rtol = RT_RED},
    {&fam_att_fwd, "B1 T130 H4 KV1 hd128", .B = 1, .T = 130, .H = 4, .KV = 1, .hd = 128, .rtol = RT_RED},
    {&fam_att_fwd, "B2 T64 H2 KV2 hd128", .B = 2, .T = 64, .H = 2, .KV = 2, .hd = 128, .rtol = RT_RED},
    /* GQA ratio 8, and T just past 64- and 128-row tiles (flash2 uses 128-row blocks) */
    {&fam_att_fwd, "B2 T100 H8 KV1 hd64", .B = 2, .T = 100, .H = 8, .KV = 1, .hd = 64, .rtol = RT_RED},
    {&fam_att_fwd, "B1 T200 H16 KV2 hd64", .B = 1, .T = 200, .H = 16, .KV = 2, .hd = 64, .rtol = RT_RED},
    {&fam_att_fwd, "B1 T65 H8 KV1 hd128", .B = 1, .T = 65, .H = 8, .KV = 1, .hd = 128, .rtol = RT_RED},
    {&fam_att_fwd, "B1 T257 H2 KV1 hd128", .B = 1, .T = 257, .H = 2, .KV = 1, .hd = 128, .rtol = RT_RED},
    {&fam_att_fwd, "B4 T512 H16 KV8 hd128", .B = 4, .T = 512, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 1},
    {&fam_att_fwd, "B16 T1024 H12 hd64 (GPT-2)", .B = 16, .T = 1024, .H = 12, .KV = 12, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "B4 T2048 H16 KV8 hd128", .B = 4, .T = 2048, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "B2 T7 H3 KV3 hd5", .B = 2, .T = 7, .H = 3, .KV = 3, .hd = 5, .rtol = RT_RED},
    {&fam_att_bwd, "B2 T33 H4 KV2 hd8", .B = 2, .T = 33, .H = 4, .KV = 2, .hd = 8, .rtol = RT_RED},
    {&fam_att_bwd, "B4 T256 H12 hd64", .B = 4, .T = 256, .H = 12, .KV = 12, .hd = 64, .rtol = RT_RED, .perf = 1},
    {&fam_att_bwd, "B4 T256 H8 KV2 hd64", .B = 4, .T = 256, .H = 8, .KV = 2, .hd = 64, .rtol = RT_RED, .perf = 1},
    {&fam_att_bwd, "B4 T1024 H12 hd64", .B = 4, .T = 1024, .H = 12, .KV = 12, .hd = 64, .rtol = RT_RED, .perf = 1},
    {&fam_att_bwd, "B2 T77 H4 KV2 hd64", .B = 2, .T = 77, .H = 4, .KV = 2, .hd = 64, .rtol = RT_RED},
    {&fam_att_bwd, "B1 T130 H4 KV1 hd128", .B = 1, .T = 130, .H = 4, .KV = 1, .hd = 128, .rtol = RT_RED},
    {&fam_att_bwd, "B2 T64 H2 KV2 hd128", .B = 2, .T = 64, .H = 2, .KV = 2, .hd = 128, .rtol = RT_RED},
    {&fam_att_bwd, "B2 T100 H8 KV1 hd64", .B = 2, .T = 100, .H = 8, .KV = 1, .hd = 64, .rtol = RT_RED},
    {&fam_att_bwd, "B1 T200 H16 KV2 hd64", .B = 1, .T = 200, .H = 16, .KV = 2, .hd = 64, .rtol = RT_RED},
    {&fam_att_bwd, "B1 T65 H8 KV1 hd128", .B = 1, .T = 65, .H = 8, .KV = 1, .hd = 128, .rtol = RT_RED},
    {&fam_att_bwd, "B1 T257 H2 KV1 hd128", .B = 1, .T = 257, .H = 2, .KV = 1, .hd = 128, .rtol = RT_RED},
    {&fam_att_bwd, "B4 T512 H16 KV8 hd128", .B = 4, .T = 512, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 1},
    {&fam_att_bwd, "B16 T1024 H12 hd64 (GPT-2)", .B = 16, .T = 1024, .H = 12, .KV = 12, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "B4 T2048 H16 KV8 hd128", .B = 4, .T = 2048, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    /* bench/attention.sh: 16k tokens per call, T = 1k..8k, head dims 64 (MHA) and 128 (GQA 2) */
    {&fam_att_fwd, "bench B16 T1024 H16 KV16 hd64", .B = 16, .T = 1024, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B16 T1024 H16 KV16 hd64", .B = 16, .T = 1024, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "bench B16 T1024 H16 KV8 hd128", .B = 16, .T = 1024, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B16 T1024 H16 KV8 hd128", .B = 16, .T = 1024, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "bench B8 T2048 H16 KV16 hd64", .B = 8, .T = 2048, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B8 T2048 H16 KV16 hd64", .B = 8, .T = 2048, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "bench B8 T2048 H16 KV8 hd128", .B = 8, .T = 2048, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B8 T2048 H16 KV8 hd128", .B = 8, .T = 2048, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "bench B4 T4096 H16 KV16 hd64", .B = 4, .T = 4096, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B4 T4096 H16 KV16 hd64", .B = 4, .T = 4096, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "bench B4 T4096 H16 KV8 hd128", .B = 4, .T = 4096, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B4 T4096 H16 KV8 hd128", .B = 4, .T = 4096, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "bench B2 T8192 H16 KV16 hd64", .B = 2, .T = 8192, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B2 T8192 H16 KV16 hd64", .B = 2, .T = 8192, .H = 16, .KV = 16, .hd = 64, .rtol = RT_RED, .perf = 2},
    {&fam_att_fwd, "bench B2 T8192 H16 KV8 hd128", .B = 2, .T = 8192, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_bwd, "bench B2 T8192 H16 KV8 hd128", .B = 2, .T = 8192, .H = 16, .KV = 8, .hd = 128, .rtol = RT_RED, .perf = 2},
    {&fam_att_cached, "n5 pos0=0 H4 KV2 hd8 maxT16", .N = 5, .pos0 = 0, .H = 4, .KV = 2, .hd = 8, .T = 16, .rtol = RT_RED},
    {&fam_att_cached, "n1 pos0=37 H3 KV1 hd10 maxT64", .N = 1, .pos0 = 37, .H = 3, .KV = 1, .hd = 10, .T = 64, .rtol = RT_RED},
    {&fam_att_cached, "n3 pos0=200 H6 KV3 hd300", .N = 3, .pos0 = 200, .H = 6, .KV = 3, .hd = 300, .T = 203, .rtol = RT_RED},
    {&fam_att_cached, "decode n1 pos0=1000 H16 KV8 hd128", .N = 1, .pos0 = 1000, .H = 16, .KV = 8, .hd = 128, .T = 2048, .rtol = RT_RED, .perf = 1},
    {&fam_att_cached, "prefill n256 H12 hd64 maxT1024", .N = 256, .pos0 = 0, .H = 12, .KV = 12, .hd = 64, .T = 1024, .rtol = RT_RED, .perf = 1},
    {&fam_gelu_fwd, "n1001", .n = 1001, .rtol = RT_ELEM},
    {&fam_gelu_fwd, "n 1024x3072", .n = 1024 * 3072, .rtol = RT_ELEM, .perf = 1},
    {&fam_gelu_bwd, "n1001", .n = 1001, .rtol = RT_ELEM},
    {&fam_gelu_bwd, "n 1024x3072", .n = 1024 * 3072, .rtol = RT_ELEM, .perf = 1},
    {&fam_swi_fwd, "N7 F13", .N = 7, .F = 13, .rtol = RT_ELEM},
    {&fam_swi_fwd, "N1024 F3072", .N = 1024, .F = 3072, .rtol = RT_ELEM, .perf = 1},
    {&fam_swi_bwd, "N7 F13", .N = 7, .F = 13, .rtol = RT_ELEM},
    {&fam_swi_bwd, "N1024 F3072", .N = 1024, .F = 3072, .rtol = RT_ELEM, .perf = 1},
    {&fam_add, "n1001", .n = 1001, .rtol = RT_ELEM},
    {&fam_add_alias, "n1001 out=a", .n = 1001, .rtol = RT_ELEM},
    {&fam_add, "n 1024x768", .n = 1024 * 768, .rtol = RT_ELEM, .perf = 1},
    {&fam_xent, "N7 V37 Vp40 gs=1/7", .N = 7, .V = 37, .Vp = 40, .x = 1.0f / 7, .rtol = RT_RED},
    {&fam_xent, "N9 V1000 Vp1000 gs=0", .N = 9, .V = 1000, .Vp = 1000, .x = 0.0f, .rtol = RT_RED},
    {&fam_xent, "N1024 V50257 Vp50304", .N = 1024, .V = 50257, .Vp = 50304, .x = 1.0f / 1024, .rtol = RT_RED, .perf = 1},
    {&fam_xent, "N16384 V50257 Vp50304", .N = 16384, .V = 50257, .Vp = 50304, .x = 1.0f / 16384, .rtol = RT_RED, .perf = 2},
    /* fp16 loss scaling: grad_scale = 2^16 / (B*T = 1024) = 64, |dlogit| <= 64 (no overflow) */
    {&fam_xent, "N64 V50257 Vp50304 gs=64 (2^16/1024)", .N = 64, .V = 50257, .Vp = 50304, .x = 64.0f, .rtol = RT_RED},
    {&fam_adamw, "n1001 step1 gs0.5", .n = 1001, .step = 1, .x = 0.5f, .rtol = RT_ELEM},
    {&fam_adamw, "n1001 step7", .n = 1001, .step = 7, .x = 1.0f, .rtol = RT_ELEM},
    {&fam_adamw, "n 16M step3", .n = 16 << 20, .step = 3, .x = 1.0f, .rtol = RT_ELEM, .perf = 1},
    {&fam_sumsq, "n1", .n = 1, .rtol = 1e-10},
    {&fam_sumsq, "n1000003", .n = 1000003, .rtol = 1e-10},
    {&fam_sumsq, "n 16M", .n = 16 << 20, .rtol = 1e-10, .perf = 1},
    {&fam_scale, "n1001", .n = 1001, .x = 0.37f, .rtol = RT_ELEM},
    {&fam_scale, "n 16M", .n = 16 << 20, .x = 0.999f, .rtol = RT_ELEM, .perf = 1},
    {&fam_copy2d, "37 rows 5 of 11<-13", .N = 37, .C = 5, .IC = 11, .OC = 13, .H = 2, .rtol = 0},
    {&fam_copy2d, "1 row", .N = 1, .C = 7, .IC = 8, .OC = 9, .H = 1, .rtol = 0},
    {&fam_copy2d, "qkv v: 1024 rows 1024 of 4096", .N = 1024, .C = 1024, .IC = 4096, .OC = 4096, .H = 3072, .rtol = 0, .perf = 1},
    {&fam_zero, "n1001", .n = 1001, .rtol = 0},
    /* fused ops: widths the register paths take (768, 1024, 1536) and ones they leave to the
     * unfused fallback (45: not a multiple of 8; 2048: wider than the fused kernels) */
    {&fam_add_norm, "layernorm N37 C45", .N = 37, .C = 45, .rtol = RT_RED},
    {&fam_add_norm, "layernorm N300 C768", .N = 300, .C = 768, .rtol = RT_RED},
    {&fam_add_norm, "layernorm N33 C1536 no bias", .N = 33, .C = 1536, .flags = NOBIAS, .rtol = RT_RED},
    {&fam_add_norm, "rmsnorm N129 C1024", .N = 129, .C = 1024, .flags = RMS, .rtol = RT_RED},
    {&fam_add_norm, "rmsnorm N17 C2048", .N = 17, .C = 2048, .flags = RMS, .rtol = RT_RED},
    {&fam_add_norm, "layernorm N65536 C768 (GPT-2 B64)", .N = 65536, .C = 768, .rtol = RT_RED, .perf = 2},
    {&fam_mm_gelu, "N37 768->3072 bias", .N = 37, .IC = 768, .OC = 3072, .rtol = RT_RED},
    {&fam_mm_gelu, "N5 20->12 (fallback)", .N = 5, .IC = 20, .OC = 12, .rtol = RT_RED},
    {&fam_mm_gelu, "N300 64->40 no bias", .N = 300, .IC = 64, .OC = 40, .flags = NOBIAS, .rtol = RT_RED},
    {&fam_mm_gelu, "N65536 768->3072 (GPT-2 B64)", .N = 65536, .IC = 768, .OC = 3072, .rtol = RT_RED, .perf = 2},
    {&fam_mm_dgelu, "N37 3072<-768", .N = 37, .IC = 3072, .OC = 768, .rtol = RT_RED},
    {&fam_mm_dgelu, "N7 12<-20 (fallback)", .N = 7, .IC = 12, .OC = 20, .rtol = RT_RED},
    {&fam_mm_dgelu, "N65536 3072<-768 (GPT-2 B64)", .N = 65536, .IC = 3072, .OC = 768, .rtol = RT_RED, .perf = 2},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* ---- harness ---------------------------------------------------------------------------- */

static int dev_is_cpu;
static const char *g_variant = ""; /* the variant a case runs under, for labels */

static int dev_check(const char *what) {
  if (dev_is_cpu) return 0;
  char err[768];
  if (ct_cuda_check(err, sizeof err) == 0) return 0;
  fprintf(stderr, "%s: %s\n", what, err);
  return -1;
}

/* bf16 / fp16 <-> fp32 on the host, round to nearest even (NaN -> a quiet NaN) */
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* fp16: |x| >= 65520 (half an ulp past 65504) rounds to inf as IEEE says; subnormals below 2^-14
 * are kept (units of 2^-24), ties to even throughout. */
static uint16_t f2h(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7e00;
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) { /* normal: drop 13 mantissa bits, rebias 127 -> 15 */
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r >> 13) - (112u << 10));
  }
  if (a < 0x33000000u) return sign; /* below 2^-25: rounds to zero */
  const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23); /* 14 .. 24 */
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return sign | (uint16_t)q; /* q = 0x400 is the smallest normal, correctly encoded */
}
static float h2f(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t u;
  if (e == 0x1f) u = sign | 0x7f800000u | (m << 13);
  else if (e) u = sign | ((e + 112u) << 23) | (m << 13);
  else if (!m) u = sign;
  else { /* subnormal: m * 2^-24, exact in fp32 */
    float f = (float)m * 5.9604644775390625e-8f;
    memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* the table under test's 16-bit type */
static uint16_t to16(float f) { return g_fp16 ? f2h(f) : f2bf(f); }
static float from16(uint16_t h) { return g_fp16 ? h2f(h) : bf2f(h); }

/* Counter-based, so buffers fill in parallel and the values depend only on (seed, index). */
static void fill(void *dst, const bspec *b, size_t n, uint64_t seed) {
  if (b->role == R_OUT) {
    uint32_t nan = 0x7fc00000u;
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) memcpy((char *)dst + 4 * i, &nan, 4);
    return;
  }
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    uint64_t r = ct_mix64(seed ^ ct_mix64(i));
    float u = (float)(r >> 40) * (1.0f / 16777216.0f);
    if (b->init == I_TOK) {
      ((int32_t *)dst)[i] = (int32_t)((r >> 8) % (uint64_t)b->range);
    } else if (b->init == I_TGT) {
      ((int32_t *)dst)[i] = (r & 7) == 0 ? -1 : (int32_t)((r >> 8) % (uint64_t)b->range);
    } else if (b->init == I_POS) {
      ((float *)dst)[i] = b->offset + b->scale * u;
    } else {
      ((float *)dst)[i] = b->offset + b->scale * 1.7320508f * (2.0f * u - 1.0f);
    }
  }
}

typedef struct opstat {
  char op[48];
  double worst;
  int cases;
} opstat;
static opstat stats[64];
static int nstats;
static void note(const char *op, double err) {
  for (int i = 0; i < nstats; i++)
    if (!strcmp(stats[i].op, op)) {
      if (err > stats[i].worst) stats[i].worst = err;
      stats[i].cases++;
      return;
    }
  if (nstats == 64) return;
  snprintf(stats[nstats].op, sizeof stats[nstats].op, "%s", op);
  stats[nstats].worst = err;
  stats[nstats++].cases = 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Times the op on the device: warm-up, then 5 batches sized to ~20 ms; median batch mean. */
static double time_op_runs(const tcase *c, void **gp);
static double time_op(const tcase *c, void **gp) {
  g_perf_run = 1;
  const double t = time_op_runs(c, gp);
  g_perf_run = 0;
  return t;
}
static double time_op_runs(const tcase *c, void **gp) {
  for (int i = 0; i < 2; i++) c->fam->call(dev, gp, c);
  if (dev_check("warm-up")) return NAN;
  double t0 = ct_now();
  c->fam->call(dev, gp, c);
  dev_check("timing");
  double est = ct_now() - t0;
  int reps = est > 0 ? (int)(0.02 / est) : 1000;
  reps = reps < 3 ? 3 : reps > 1000 ? 1000 : reps;
  double samples[5];
  for (int s = 0; s < 5; s++) {
    t0 = ct_now();
    for (int r = 0; r < reps; r++) c->fam->call(dev, gp, c);
    if (dev_check("timing")) return NAN;
    samples[s] = (ct_now() - t0) / reps;
  }
  qsort(samples, 5, sizeof samples[0], cmp_double);
  return samples[2];
}

static size_t esz(const bspec *b) { return b->act ? (size_t)dev->act_bytes : 4; }

static void run_case(size_t ci, int perf) {
  const tcase *c = &cases[ci];
  bspec b[MAXB];
  memset(b, 0, sizeof b);
  const int nb = c->fam->setup(c, b);
  void *init[MAXB] = {0}, *cpu[MAXB] = {0}, *gbase[MAXB] = {0};
  void *gp[MAXB] = {0};
  unsigned char *got[MAXB] = {0}, *sent[MAXB] = {0};
  float *gf = NULL;
  char what[256], label[64];
  int ok = 1, uses_act = 0;

  snprintf(label, sizeof label, "%s%s%s", c->fam->op, g_variant[0] ? "/" : "", g_variant);
  for (int i = 0; i < nb; i++) {
    if (!b[i].n) continue;
    if (!b[i].ncpu) b[i].ncpu = b[i].n;
    uses_act |= b[i].act;
    size_t m = b[i].n > b[i].ncpu ? b[i].n : b[i].ncpu;
    init[i] = malloc(4 * m);
    if (!init[i]) { fprintf(stderr, "out of host memory\n"); exit(1); }
    fill(init[i], &b[i], m, 0x5eed0000ull + ci * 131 + i);
    if (b[i].act && dev->act_bytes == 2) { /* both sides see the 16-bit values */
      float *f = init[i];
#pragma omp parallel for if (m > 65536)
      for (size_t k = 0; k < m; k++) f[k] = from16(to16(f[k]));
    }
  }
  if (c->fam->prep) c->fam->prep(c, init);
  const double rtol = g_act16 && uses_act && c->rtol > 0
                         ? fmax(c->rtol, g_fp16 ? RT_FP16 : RT_BF16) : c->rtol;

  double cpu_scalar = 0;
  if (!perf) { /* the reference */
    for (int i = 0; i < nb; i++) {
      if (!b[i].n) continue;
      cpu[i] = malloc(4 * b[i].ncpu);
      memcpy(cpu[i], init[i], 4 * b[i].ncpu);
    }
    c->fam->call(ct_ops_cpu(), cpu, c);
    cpu_scalar = g_scalar;
  }

  /* device copies: [GUARD sentinels | data | GUARD sentinels], elements of esz bytes */
  for (int i = 0; i < nb; i++) {
    if (!b[i].n) continue;
    const size_t es = esz(&b[i]), tot = b[i].n + 2 * GUARD;
    got[i] = malloc(es * tot);
    sent[i] = malloc(es * tot);
    if (!got[i] || !sent[i]) { fprintf(stderr, "out of host memory\n"); exit(1); }
    if (es == 4) {
      uint32_t *w = (uint32_t *)sent[i];
      for (size_t k = 0; k < GUARD; k++) w[k] = w[GUARD + b[i].n + k] = SENTINEL;
      memcpy(w + GUARD, init[i], 4 * b[i].n);
    } else {
      uint16_t *w = (uint16_t *)sent[i];
      const float *f = init[i];
      for (size_t k = 0; k < GUARD; k++) w[k] = w[GUARD + b[i].n + k] = SENTINEL16;
#pragma omp parallel for if (b[i].n > 65536)
      for (size_t k = 0; k < b[i].n; k++) w[GUARD + k] = to16(f[k]);
    }
    gbase[i] = dev->alloc(es * tot);
    CHECK_MSG(gbase[i] != NULL, "%s %s: alloc of %zu bytes failed", label, c->shape, es * tot);
    if (!gbase[i]) { ok = 0; goto done; }
    dev->to_device(gbase[i], sent[i], es * tot);
    gp[i] = (char *)gbase[i] + GUARD * es;
  }
  snprintf(what, sizeof what, "%s [%s] (%s)", label, c->shape, dev->name);
  if (c->fam->dprep) c->fam->dprep(dev, gp, c);
  c->fam->call(dev, gp, c);
  if (dev_check(what)) { CHECK_MSG(0, "%s: the device reported an error", what); ok = 0; goto done; }

  if (!perf) {
    double worst = 0;
    if (c->fam->scalar) {
      double err = fabs(g_scalar - cpu_scalar) / (fabs(cpu_scalar) > 1e-300 ? fabs(cpu_scalar) : 1e-300);
      CHECK_MSG(isfinite(g_scalar) && err <= rtol, "%s: got %.17g, want %.17g (normalized %.3e)",
                what, g_scalar, cpu_scalar, err);
      worst = err;
    }
    for (int i = 0; i < nb; i++) {
      if (!b[i].n) continue;
      const size_t es = esz(&b[i]), tot = b[i].n + 2 * GUARD;
      dev->to_host(got[i], gbase[i], es * tot);
      if (dev_check(what)) { ok = 0; goto done; }
      size_t bad = memcmp(got[i], sent[i], es * GUARD) != 0;
      bad += memcmp(got[i] + es * (GUARD + b[i].n), sent[i] + es * (GUARD + b[i].n), es * GUARD) != 0;
      CHECK_MSG(bad == 0, "%s: %s: guard elements overwritten (out-of-bounds write)", what, b[i].name);
      if (b[i].opaque) continue;
      if (b[i].role == R_IN) {
        CHECK_MSG(!memcmp(got[i] + es * GUARD, sent[i] + es * GUARD, es * b[i].n),
                  "%s: input %s was modified", what, b[i].name);
        continue;
      }
      const float *g = (const float *)(got[i] + es * GUARD);
      if (es == 2) {
        free(gf);
        gf = malloc(4 * b[i].n);
        const uint16_t *h = (const uint16_t *)(got[i] + es * GUARD);
#pragma omp parallel for if (b[i].n > 65536)
        for (size_t k = 0; k < b[i].n; k++) gf[k] = from16(h[k]);
        g = gf;
      }
      char nm[300];
      snprintf(nm, sizeof nm, "%s: %s", what, b[i].name);
      double e = ct_check_close(nm, g, cpu[i], b[i].n, rtol, 0.0);
      if (e > worst) worst = e;
    }
    note(label, worst);
    printf("  %-22s %-32s worst normalized error %.2e\n", label, c->shape, worst);
  } else {
    double t = time_op(c, gp);
    double bytes = 0;
    for (int i = 0; i < nb; i++) bytes += (double)esz(&b[i]) * b[i].n * (b[i].role == R_ACC ? 2 : 1);
    double fl = c->fam->flops ? c->fam->flops(c) : 0;
    printf("  %-22s %-32s %10.1f us %9.1f GB/s", label, c->shape, t * 1e6, bytes / t / 1e9);
    if (fl > 0) printf(" %8.2f TFLOP/s", fl / t / 1e12);
    printf("\n");
  }

done:
  if (!ok) note(label, INFINITY);
  for (int i = 0; i < nb; i++) {
    if (gbase[i]) dev->free(gbase[i]);
    free(init[i]);
    free(cpu[i]);
    free(got[i]);
    free(sent[i]);
  }
  free(gf);
}

/* alloc returns zero-filled memory; zero-byte allocations are valid and freeable. */
static void test_alloc(void) {
  size_t n = 1000;
  float *d = dev->alloc(n * sizeof(float));
  CHECK(d != NULL);
  if (!d) return;
  float *h = malloc(n * sizeof(float));
  memset(h, 0xff, n * sizeof(float));
  dev->to_host(h, d, n * sizeof(float));
  size_t nz = 0;
  for (size_t i = 0; i < n; i++) nz += h[i] != 0.0f;
  CHECK_MSG(nz == 0, "alloc: %zu of %zu elements not zero", nz, n);
  dev->free(d);
  void *z = dev->alloc(0);
  CHECK(z != NULL);
  dev->free(z);
  CHECK(dev_check("alloc") == 0);
  free(h);
}

/* cast_params (fp32 -> working dtype, round to nearest even) and to_host_f32 (back), bit-exact,
 * with guards; n odd (scalar path) and a multiple of 8 at an aligned start (vector path). Inputs
 * include rounding ties, values that round up into the next binade or to infinity, signed zeros,
 * infinities and subnormals (fp16: its own ties, 65504 and the overflow threshold 65520, its
 * subnormal range and what rounds into or out of it). */
static void test_cast(void) {
  static const uint32_t special_bf[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu,
                                        0x7f7fffffu, 0x80000000u, 0x00000000u, 0x7f800000u,
                                        0xff800000u, 0x00000001u, 0x00018000u, 0xbf838000u};
  static const uint32_t special_h[] = {
      0x3f801000u, /* 1 + 2^-11: tie -> 1 */
      0x3f803000u, /* 1 + 3*2^-11: tie -> 1 + 2^-9 */
      0x3f800fffu, 0x3f7fffffu,
      0x477fe000u, /* 65504, the largest finite */
      0x477fefffu, /* just under 65520 -> 65504 */
      0x477ff000u, /* 65520 -> inf */
      0xc77ff000u, /* -65520 -> -inf */
      0x7f7fffffu, 0x80000000u, 0x00000000u, 0x7f800000u, 0xff800000u,
      0x38800000u, /* 2^-14, the smallest normal */
      0x387fc000u, /* the largest subnormal */
      0x387fe000u, /* tie between it and 2^-14 -> 2^-14 (even) */
      0x33800000u, /* 2^-24, the smallest subnormal */
      0x33000000u, /* 2^-25: tie -> 0 */
      0x33000001u, /* just over 2^-25 -> 2^-24 */
      0x33c00000u, /* 1.5 * 2^-24: tie -> 2 * 2^-24 */
      0xb3c00000u, 0x00000001u, 0x3a800800u};
  const uint32_t *special = g_fp16 ? special_h : special_bf;
  const size_t ns = g_fp16 ? sizeof special_h / sizeof special_h[0]
                           : sizeof special_bf / sizeof special_bf[0];
  const size_t e = (size_t)dev->act_bytes;
  const size_t sizes[2] = {1001, (size_t)1 << 20};
  for (int si = 0; si < 2; si++) {
    const size_t n = sizes[si], tot = n + 2 * GUARD;
    float *src = malloc(4 * n), *back = malloc(4 * n);
    unsigned char *dst = malloc(e * tot), *want = malloc(e * tot);
    bspec bs = IN("src", n);
    fill(src, &bs, n, 0xca57u + si);
    for (size_t k = 0; k < n; k++) /* fp16: also its subnormals and past its range */
      src[k] *= (k % 3 == 0) ? (g_fp16 ? 1e-6f : 1e-30f) : (k % 3 == 1) ? 1.0f : (g_fp16 ? 4e4f : 1e30f);
    for (size_t k = 0; k < ns && k < n; k++) memcpy(src + 7 * k, &special[k], 4);
    memset(want, 0x5a, e * tot);
    for (size_t k = 0; k < n; k++) {
      if (e == 2) {
        uint16_t h = to16(src[k]);
        memcpy(want + e * (GUARD + k), &h, 2);
      } else {
        memcpy(want + e * (GUARD + k), src + k, 4);
      }
    }
    float *dsrc = dev->alloc(4 * n);
    unsigned char *ddst = dev->alloc(e * tot);
    if (!dsrc || !ddst) { CHECK(dsrc && ddst); return; }
    dev->to_device(dsrc, src, 4 * n);
    dev->to_device(ddst, want, e * GUARD); /* guards */
    dev->to_device(ddst + e * (GUARD + n), want + e * (GUARD + n), e * GUARD);
    dev->cast_params(ddst + e * GUARD, dsrc, n);
    dev->to_host(dst, ddst, e * tot);
    dev->to_host_f32(back, ddst + e * GUARD, n);
    CHECK(dev_check("cast_params / to_host_f32") == 0);
    size_t bad = 0, badg = 0, badb = 0;
    for (size_t k = 0; k < e * tot; k++) {
      if (dst[k] == want[k]) continue;
      if (k < e * GUARD || k >= e * (GUARD + n)) badg++;
      else bad++;
    }
    for (size_t k = 0; k < n; k++) {
      float w = e == 2 ? from16(to16(src[k])) : src[k];
      badb += memcmp(&w, back + k, 4) != 0;
    }
    CHECK_MSG(bad == 0 && badg == 0, "%s cast_params n=%zu: %zu bytes differ from round-to-nearest-even, "
              "%zu guard bytes overwritten", dev->name, n, bad, badg);
    CHECK_MSG(badb == 0, "%s to_host_f32 n=%zu: %zu values differ", dev->name, n, badb);
    printf("  %-22s n=%-30zu %s\n", "cast_params/to_host_f32", n, bad + badg + badb ? "MISMATCH" : "bit-exact");
    note("cast_params", bad + badg ? INFINITY : 0.0);
    note("to_host_f32", badb ? INFINITY : 0.0);
    dev->free(dsrc);
    dev->free(ddst);
    free(src);
    free(back);
    free(dst);
    free(want);
  }
}

/* f32_to_bf16 / bf16_to_f32 (ddp's bf16 gradient wire, in every table): bit-exact against the
 * CPU table, with the bf16 rounding specials, NaN and infinities, and the exact way back. */
static void test_wire_bf16(void) {
  static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu,
                                     0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                     0x7f800001u, 0x00000001u, 0xbf838000u};
  const size_t n = ((size_t)1 << 20) + 3, ns = sizeof special / sizeof special[0];
  float *src = malloc(4 * n), *back = malloc(4 * n), *wantb = malloc(4 * n);
  uint16_t *got = malloc(2 * n), *want = malloc(2 * n);
  bspec bs = IN("src", n);
  fill(src, &bs, n, 0xb16u);
  for (size_t k = 0; k < n; k++) src[k] *= (k % 3 == 0) ? 1e-30f : (k % 3 == 1) ? 1.0f : 1e30f;
  for (size_t k = 0; k < ns; k++) memcpy(src + 5 * k, &special[k], 4);
  ct_ops_cpu()->f32_to_bf16(want, src, n);
  ct_ops_cpu()->bf16_to_f32(wantb, want, n);
  float *dsrc = dev->alloc(4 * n), *dback = dev->alloc(4 * n);
  uint16_t *dw = dev->alloc(2 * n);
  if (!dsrc || !dback || !dw) { CHECK(dsrc && dback && dw); return; }
  dev->to_device(dsrc, src, 4 * n);
  dev->f32_to_bf16(dw, dsrc, n);
  dev->bf16_to_f32(dback, dw, n);
  dev->to_host(got, dw, 2 * n);
  dev->to_host(back, dback, 4 * n);
  CHECK(dev_check("f32_to_bf16 / bf16_to_f32") == 0);
  size_t bad = 0, badb = 0;
  for (size_t k = 0; k < n; k++) {
    bad += got[k] != want[k];
    badb += memcmp(back + k, wantb + k, 4) != 0;
  }
  CHECK_MSG(bad == 0 && badb == 0, "%s f32_to_bf16 / bf16_to_f32: %zu / %zu of %zu values differ"
            " from the CPU table", dev->name, bad, badb, n);
  printf("  %-22s n=%-30zu %s\n", "f32_to_bf16/bf16_to_f32", n, bad + badb ? "MISMATCH" : "bit-exact");
  note("f32_to_bf16", bad ? INFINITY : 0.0);
  note("bf16_to_f32", badb ? INFINITY : 0.0);
  dev->free(dsrc);
  dev->free(dback);
  dev->free(dw);
  free(src);
  free(back);
  free(wantb);
  free(got);
  free(want);
}

/* The sticky error: a bad copy2d (pitch smaller than the row) must be reported, naming the op. */
static void test_sticky_error(void) {
  char err[768] = "";
  float *d = dev->alloc(64 * sizeof(float));
  if (!d) { CHECK(d != NULL); return; }
  dev->copy2d(d, 4, d + 32, 4, 16, 4);
  int rc = ct_cuda_check(err, sizeof err);
  CHECK_MSG(rc == -1 && strstr(err, "copy2d"), "sticky error: rc %d, message \"%s\"", rc, err);
  printf("  sticky error reported as: %s\n", err);
  rc = ct_cuda_check(err, sizeof err);
  CHECK_MSG(rc == -1, "the error state must stay set");
}

/* Non-finite values must flow, never be clamped or hidden: with fp16 the trainer finds an
 * overflow by a non-finite gradient norm and skips the step. Per table:
 *   - an inf in matmul_bwd's inp reaches dW (the whole column it touches, and nothing else);
 *   - an inf in dout reaches dW's row, dbias and dinp's row;
 *   - xent (CUDA tables): a NaN or +inf logit makes that row's loss and gradient non-finite, the
 *     others not, and |gradient| <= grad_scale;
 *   - fp16: a matmul_fwd product past 65504 comes out as +inf (not 65504), through cuBLASLt's
 *     bias epilogue and through cublasGemmEx, and that output as the next inp makes dW non-finite. */
static void *up_act(const float *h, size_t n) { /* host fp32 -> device working dtype */
  const size_t e = (size_t)dev->act_bytes;
  void *d = dev->alloc(e * n);
  if (!d) return NULL;
  if (e == 4) {
    dev->to_device(d, h, 4 * n);
  } else {
    uint16_t *t = malloc(2 * n);
    for (size_t k = 0; k < n; k++) t[k] = to16(h[k]);
    dev->to_device(d, t, 2 * n);
    free(t);
  }
  return d;
}
static void *up_f32(const float *h, size_t n) {
  void *d = dev->alloc(4 * n);
  if (d && h) dev->to_device(d, h, 4 * n);
  return d;
}
/* non-finite count of x[i*stride] for i in [0, n) */
static size_t nonfinite(const float *x, size_t n, size_t stride) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += !isfinite(x[i * stride]);
  return c;
}
static void fill_nz(float *x, size_t n, uint64_t seed) { /* +-[0.25, 1.25): never zero */
  for (size_t i = 0; i < n; i++) {
    uint64_t r = ct_mix64(seed ^ ct_mix64(i));
    x[i] = (0.25f + (float)(r >> 40) * (1.0f / 16777216.0f)) * ((r & 1) ? -1.0f : 1.0f);
  }
}

static void test_nonfinite(void) {
  enum { N = 64, IC = 40, OC = 24, n0 = 5, i0 = 7, o0 = 3 };
  const char *nm = dev->name;
  float *inp = malloc(sizeof(float) * N * IC), *dout = malloc(sizeof(float) * N * OC);
  float *w = malloc(sizeof(float) * OC * IC), *dw = malloc(sizeof(float) * OC * IC);
  float *dinp = malloc(sizeof(float) * N * IC), *db = malloc(sizeof(float) * OC);
  fill_nz(inp, N * IC, 0x1f1);
  fill_nz(dout, N * OC, 0x1f2);
  fill_nz(w, OC * IC, 0x1f3);
  for (int pass = 0; pass < 2; pass++) { /* 0: inf in inp; 1: inf in dout */
    if (pass == 0) inp[n0 * IC + i0] = INFINITY;
    else { inp[n0 * IC + i0] = 0.5f; dout[n0 * OC + o0] = INFINITY; }
    void *d_inp = up_act(inp, N * IC), *d_dout = up_act(dout, N * OC), *d_w = up_act(w, OC * IC);
    void *d_dinp = dev->alloc((size_t)dev->act_bytes * N * IC); /* zero-filled */
    float *d_dw = up_f32(NULL, OC * IC), *d_db = up_f32(NULL, OC);
    if (!d_inp || !d_dout || !d_w || !d_dinp || !d_dw || !d_db) { CHECK(0); return; }
    dev->matmul_bwd(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, IC, OC);
    dev->to_host(dw, d_dw, sizeof(float) * OC * IC);
    dev->to_host(db, d_db, sizeof(float) * OC);
    dev->to_host_f32(dinp, d_dinp, (size_t)N * IC);
    CHECK(dev_check("nonfinite matmul_bwd") == 0);
    const size_t all_dw = nonfinite(dw, OC * IC, 1), all_db = nonfinite(db, OC, 1);
    const size_t all_dinp = nonfinite(dinp, N * IC, 1);
    if (pass == 0) {
      const size_t col = nonfinite(dw + i0, OC, IC);
      CHECK_MSG(col == OC && all_dw == OC && all_db == 0 && all_dinp == 0,
                "%s: inf in matmul inp: dW column %zu/%d non-finite, %zu in all of dW (want %d), "
                "dbias %zu, dinp %zu (want 0)", nm, col, OC, all_dw, OC, all_db, all_dinp);
      printf("  %-22s %-32s dW column all non-finite (%zu/%d), rest finite\n", "nonfinite",
             "inf in matmul_bwd inp", col, OC);
    } else {
      const size_t row = nonfinite(dw + (size_t)o0 * IC, IC, 1);
      const size_t drow = nonfinite(dinp + (size_t)n0 * IC, IC, 1);
      CHECK_MSG(row == IC && all_dw == IC && !isfinite(db[o0]) && all_db == 1 && drow == IC &&
                    all_dinp == IC,
                "%s: inf in matmul dout: dW row %zu/%d (all %zu), dbias[o0] %g (all %zu), dinp row "
                "%zu/%d (all %zu): each should be exactly the touched row / element",
                nm, row, IC, all_dw, db[o0], all_db, drow, IC, all_dinp);
      printf("  %-22s %-32s dW row, dbias, dinp row non-finite (%zu, %zu, %zu)\n", "nonfinite",
             "inf in matmul_bwd dout", row, all_db, drow);
    }
    dev->free(d_inp); dev->free(d_dout); dev->free(d_w); dev->free(d_dinp);
    dev->free(d_dw); dev->free(d_db);
  }

  /* xent: row 1 has a NaN logit, row 2 a +inf one (neither the target), rows 0 and 3 finite.
   * CUDA tables only: the CPU table's vectorized expf clamps its argument (NaN included), so its
   * NaN row comes out finite. */
  if (!dev_is_cpu) {
    enum { XN = 4, XV = 37, XVp = 40 };
    float lg[XN * XVp], loss[XN];
    int32_t tg[XN] = {3, 30, 11, 36};
    fill_nz(lg, XN * XVp, 0x1f4);
    lg[1 * XVp + 17] = NAN;
    lg[2 * XVp + 5] = INFINITY;
    void *d_lg = up_act(lg, XN * XVp);
    float *d_loss = up_f32(NULL, XN);
    int32_t *d_tg = dev->alloc(sizeof tg);
    if (!d_lg || !d_loss || !d_tg) { CHECK(0); return; }
    dev->to_device(d_tg, tg, sizeof tg);
    dev->xent_fwd_bwd(d_loss, d_lg, d_tg, XN, XV, XVp, 64.0f);
    dev->to_host(loss, d_loss, sizeof loss);
    dev->to_host_f32(lg, d_lg, XN * XVp);
    CHECK(dev_check("nonfinite xent") == 0);
    size_t g[XN];
    for (int r = 0; r < XN; r++) g[r] = nonfinite(lg + r * XVp, XVp, 1);
    CHECK_MSG(isfinite(loss[0]) && !isfinite(loss[1]) && !isfinite(loss[2]) && isfinite(loss[3]) &&
                  g[0] == 0 && g[1] > 0 && g[2] > 0 && g[3] == 0,
              "%s: xent with a NaN (row 1) and an inf (row 2) logit: losses %g %g %g %g, non-finite "
              "gradients per row %zu %zu %zu %zu", nm, loss[0], loss[1], loss[2], loss[3], g[0], g[1],
              g[2], g[3]);
    float mx = 0;
    for (int r = 0; r < XN; r += 3)
      for (int i = 0; i < XVp; i++) mx = fmaxf(mx, fabsf(lg[r * XVp + i]));
    CHECK_MSG(mx <= 64.0f, "%s: xent gradient %g exceeds grad_scale 64", nm, mx);
    printf("  %-22s %-32s loss and gradient rows non-finite (%zu, %zu), max|dlogit| %.1f <= 64\n",
           "nonfinite", "xent NaN / inf logit", g[1], g[2], mx);
    dev->free(d_lg); dev->free(d_loss); dev->free(d_tg);
  }

  if (g_fp16) { /* 40 products of 256 * 256 = 2.6e6 > 65504: +inf in fp16 */
    dout[n0 * OC + o0] = 0.5f; /* finite again: dout of the next layer below */
    float *big = malloc(sizeof(float) * N * IC), *out = malloc(sizeof(float) * N * OC);
    float bias[OC];
    for (int i = 0; i < N * IC; i++) big[i] = 256.0f;
    for (int i = 0; i < OC * IC; i++) w[i] = 256.0f;
    for (int i = 0; i < OC; i++) bias[i] = 1.0f;
    void *d_x = up_act(big, N * IC), *d_w = up_act(w, OC * IC), *d_b = up_act(bias, OC);
    void *d_out = dev->alloc(2u * N * OC), *d_dout = up_act(dout, N * OC);
    float *d_dw = up_f32(NULL, OC * IC);
    if (!d_x || !d_w || !d_b || !d_out || !d_dout || !d_dw) { CHECK(0); return; }
    static const char *v[] = {"lt", "gemmex"};
    for (int k = 0; k < 3; k++) {
      if (!dev_is_cpu && k < 2) ct_cuda_set_variant("matmul", v[k]);
      dev->matmul_fwd(d_out, d_x, d_w, k < 2 ? d_b : NULL, N, IC, OC);
      dev->to_host_f32(out, d_out, (size_t)N * OC);
      CHECK(dev_check("nonfinite matmul_fwd") == 0);
      size_t pinf = 0;
      for (int i = 0; i < N * OC; i++) pinf += out[i] == INFINITY;
      CHECK_MSG(pinf == (size_t)N * OC, "%s: matmul_fwd (%s) overflowing fp16: %zu of %d outputs "
                "+inf (e.g. %g): an overflow must not be clamped", nm, k < 2 ? v[k] : "no bias",
                pinf, N * OC, out[0]);
      printf("  %-22s %-32s %zu/%d outputs +inf\n", "nonfinite",
             k == 0 ? "fp16 overflow, bias, lt" : k == 1 ? "fp16 overflow, bias, gemmex"
                                                        : "fp16 overflow, no bias", pinf, N * OC);
    }
    if (!dev_is_cpu) ct_cuda_set_variant("matmul", "default");
    /* the overflowed activations as the next layer's input: dW all non-finite */
    /* next layer (IC' = OC' = OC): dW' (OC, OC) += dout'^T out; no dinp, so w is not read */
    dev->matmul_bwd(NULL, d_dw, NULL, d_dout, d_out, d_w, N, OC, OC);
    dev->to_host(dw, d_dw, sizeof(float) * OC * OC);
    CHECK(dev_check("nonfinite matmul_bwd after overflow") == 0);
    const size_t bad = nonfinite(dw, OC * OC, 1);
    CHECK_MSG(bad == (size_t)OC * OC, "%s: dW from an overflowed fp16 input: %zu of %d non-finite",
              nm, bad, OC * OC);
    printf("  %-22s %-32s %zu/%d dW non-finite\n", "nonfinite", "dW from overflowed activations",
           bad, OC * OC);
    dev->free(d_x); dev->free(d_w); dev->free(d_b); dev->free(d_out); dev->free(d_dout);
    dev->free(d_dw);
    free(big);
    free(out);
  }
  free(inp); free(dout); free(w); free(dw); free(dinp); free(db);
}

/* Variants compared on the same cases within one run (16-bit tables): attention batched, flash,
 * flash2 and flash2b (or those named by --attn), bias matmul through cuBLASLt vs cublasGemmEx. */
static int is_att(const family *f) { return f == &fam_att_fwd || f == &fam_att_bwd; }
#if CT_HAVE_FLASH3 /* the Hopper wgmma kernels (kernels/cuda/flash_hopper.cu): flash3 with its
                     * two-kernel backward, flash3-fused with the fused one (dQ by atomics),
                     * flash3-bwd2 with backward form 2 (flash3's default since it ran on an
                     * H200; CT_FLASH3_BWD=1 asks for form 1), flash3-fwd2 with forward form 2
                     * (CT_FLASH3_FWD=2) and the default backward */
#define FLASH3_LIST ",flash3,flash3-fused,flash3-bwd2,flash3-fwd2"
#else
#define FLASH3_LIST ""
#endif
#if CT_HAVE_CUDNN
static const char *g_attn_list = "batched,flash,flash2,flash2b,cudnn,auto,default" FLASH3_LIST;
#elif CT_HAVE_FLASH3 /* auto times flash2 against flash3 */
static const char *g_attn_list = "batched,flash,flash2,flash2b,auto,default" FLASH3_LIST;
#else
static const char *g_attn_list = "batched,flash,flash2,flash2b,default";
#endif
#define NO_CUDNN_MSG "cudnn attention: not in this build (configured without the cudnn-frontend headers): its cases are skipped"

#if CT_HAVE_CUDNN
/* cudnn against flash2 on the same device inputs: forward output and backward gradients (into
 * zeroed dqkv), both 16-bit results of the same exact values, so the bound is two 16-bit
 * tolerances. Where cuDNN runs its deterministic backward (CT_CUDA_CUDNN_DETERMINISTIC=1), a
 * second backward must be bit-identical. Shapes: GQA ratios 1, 2, 4, 8; head dims 64 and 128; T off the 64/128 tiles. */
static void test_attn_cudnn_vs_flash(void) {
  static const int S[][5] = {/* B, T, H, KV, hd */
                             {2, 77, 4, 4, 64},    {2, 100, 8, 4, 64},  {1, 200, 16, 4, 64},
                             {2, 100, 8, 1, 64},   {4, 1023, 12, 12, 64}, {1, 130, 4, 4, 128},
                             {1, 257, 8, 4, 128},  {1, 65, 8, 2, 128},  {2, 300, 16, 2, 128},
                             {4, 1000, 16, 8, 128}};
  const double tol = 2 * (g_fp16 ? RT_FP16 : RT_BF16);
  printf("cudnn vs flash2 on the same inputs (%s table, bound %.0e):\n", dev->name, tol);
  for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
    const int B = S[si][0], T = S[si][1], H = S[si][2], KV = S[si][3], hd = S[si][4];
    const size_t nq = (size_t)B * T * (H + 2 * KV) * hd, no = (size_t)B * T * H * hd;
    const size_t sf = dev->attention_state_floats(B, T, H, KV, hd), e = 2;
    uint16_t *h16 = malloc(e * (nq > no ? nq : no));
    float *a = malloc(4 * nq), *b = malloc(4 * nq);
    void *qkv = dev->alloc(e * nq), *dout = dev->alloc(e * no), *out[2], *st[2], *dq[2], *dq2;
    for (int k = 0; k < 2; k++) {
      out[k] = dev->alloc(e * no);
      st[k] = dev->alloc(4 * sf);
      dq[k] = dev->alloc(e * nq);
    }
    dq2 = dev->alloc(e * nq);
    char what[160];
    snprintf(what, sizeof what, "cudnn vs flash2 B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
    if (!h16 || !a || !b || !qkv || !dout || !out[0] || !out[1] || !st[0] || !st[1] || !dq[0] ||
        !dq[1] || !dq2) {
      CHECK_MSG(0, "%s: out of memory", what);
      goto next;
    }
    for (size_t i = 0; i < nq; i++)
      h16[i] = to16(1.7320508f * (2.0f * (float)(ct_mix64(0xa77e0000ull + si * 7919 + i) >> 40) / 16777216.0f - 1.0f));
    dev->to_device(qkv, h16, e * nq);
    for (size_t i = 0; i < no; i++)
      h16[i] = to16(1.7320508f * (2.0f * (float)(ct_mix64(0xd0e70000ull + si * 7919 + i) >> 40) / 16777216.0f - 1.0f));
    dev->to_device(dout, h16, e * no);
    static const char *vs[2] = {"flash2", "cudnn"};
    for (int k = 0; k < 2; k++) {
      ct_cuda_set_variant("attention", vs[k]);
      dev->attention_fwd(out[k], st[k], qkv, B, T, H, KV, hd);
      dev->attention_bwd(dq[k], dout, qkv, st[k], B, T, H, KV, hd);
    }
    if (dev_check(what)) {
      CHECK_MSG(0, "%s: the device reported an error", what);
      goto next;
    }
    double err[2];
    for (int pass = 0; pass < 2; pass++) { /* 0: out, 1: dqkv */
      const size_t n = pass ? nq : no;
      for (int k = 0; k < 2; k++) {
        dev->to_host(h16, pass ? dq[k] : out[k], e * n);
        float *f = k ? b : a;
        for (size_t i = 0; i < n; i++) f[i] = from16(h16[i]);
      }
      char nm[200];
      snprintf(nm, sizeof nm, "%s: %s", what, pass ? "dqkv" : "out");
      err[pass] = ct_check_close(nm, b, a, n, tol, 0.0);
    }
    ct_cudnn_attn_shape cs = {0, B, T, H, KV, hd, g_fp16};
    const int det = ct_cudnn_attn_bwd_deterministic(&cs);
    if (det == 1) { /* a second backward from the same state: the same bits */
      dev->attention_bwd(dq2, dout, qkv, st[1], B, T, H, KV, hd);
      dev->to_host(h16, dq2, e * nq);
      float *f = a;
      for (size_t i = 0; i < nq; i++) f[i] = from16(h16[i]);
      size_t diff = 0;
      for (size_t i = 0; i < nq; i++) diff += memcmp(&f[i], &b[i], 4) != 0;
      CHECK_MSG(diff == 0, "%s: deterministic backward differs in %zu elements", what, diff);
    }
    /* attention_bwd_set over a dqkv full of other values: what attention_bwd added into zeros
     * (flash2: the same bits; cudnn, written in place: within the bound of its dQ atomics) */
    if (dev->attention_bwd_set) {
      for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < nq; i++) h16[i] = to16(3.0f);
        dev->to_device(dq2, h16, e * nq);
        ct_cuda_set_variant("attention", vs[k]);
        dev->attention_bwd_set(dq2, dout, qkv, st[k], B, T, H, KV, hd);
        dev->to_host(h16, dq2, e * nq);
        for (size_t i = 0; i < nq; i++) a[i] = from16(h16[i]);
        dev->to_host(h16, dq[k], e * nq);
        size_t diff = 0;
        for (size_t i = 0; i < nq; i++) diff += a[i] != from16(h16[i]);
        if (k == 0 || det == 1) {
          CHECK_MSG(diff == 0, "%s: %s attention_bwd_set differs from attention_bwd into zeros"
                    " in %zu of %zu elements", what, vs[k], diff, nq);
        } else {
          float *ref = b; /* b still holds cudnn's dqkv from attention_bwd */
          char nm[200];
          snprintf(nm, sizeof nm, "%s: cudnn attention_bwd_set", what);
          ct_check_close(nm, a, ref, nq, tol, 0.0);
        }
      }
    }
    note("attention/cudnn~flash2", err[0] > err[1] ? err[0] : err[1]);
    printf("  %-40s out %.2e  dqkv %.2e  (cudnn backward %s)\n", what, err[0], err[1],
           det == 1 ? "deterministic, repeat bit-identical" : "default algorithm, dQ atomics");
  next:
    free(h16);
    free(a);
    free(b);
    dev->free(qkv);
    dev->free(dout);
    for (int k = 0; k < 2; k++) {
      dev->free(out[k]);
      dev->free(st[k]);
      dev->free(dq[k]);
    }
    dev->free(dq2);
  }
  ct_cuda_set_variant("attention", "default");
}
#endif

static void run_selected(size_t i, int perf) {
  const tcase *c = &cases[i];
  if (!dev_is_cpu && g_act16 && is_att(c->fam)) {
    char list[256], *save = NULL;
    snprintf(list, sizeof list, "%s", g_attn_list);
    for (char *v = strtok_r(list, ",", &save); v; v = strtok_r(NULL, ",", &save)) {
      if (perf && !strcmp(v, "default")) continue; /* timed as the variant it names */
      if (!CT_HAVE_CUDNN && !strcmp(v, "cudnn")) {
        static int said;
        if (!said++) printf("  %s\n", NO_CUDNN_MSG);
        continue;
      }
      /* flash3's forward and backward forms are four environment switches that ops_cuda.cu
       * reads at every call: set for flash3 (two kernels), flash3-fused, flash3-bwd2,
       * flash3-bwd2o<N> (backward form 2 with CT_FLASH3_BWD2_OPT=N, its kernel variants; the
       * default for the others) and flash3-fwd2 (CT_FLASH3_BWD unset: the default backward) alike,
       * then put back */
      const int bwd2o = !strncmp(v, "flash3-bwd2o", 12) && v[12] >= '0' && v[12] <= '9';
      const int fused = !strcmp(v, "flash3-fused"), bwd2 = bwd2o || !strcmp(v, "flash3-bwd2");
      const int fwd2 = !strcmp(v, "flash3-fwd2");
      const int fl3 = fused || bwd2 || fwd2 || !strcmp(v, "flash3");
      char prev[16] = "", prev2[16] = "", prev3[16] = "", prev4[16] = "";
      const int had = fl3 && getenv("CT_FLASH3_DQ_ATOMIC");
      const int had2 = fl3 && getenv("CT_FLASH3_BWD");
      const int had3 = fl3 && getenv("CT_FLASH3_FWD");
      const int had4 = fl3 && getenv("CT_FLASH3_BWD2_OPT");
      if (had) snprintf(prev, sizeof prev, "%s", getenv("CT_FLASH3_DQ_ATOMIC"));
      if (had2) snprintf(prev2, sizeof prev2, "%s", getenv("CT_FLASH3_BWD"));
      if (had3) snprintf(prev3, sizeof prev3, "%s", getenv("CT_FLASH3_FWD"));
      if (had4) snprintf(prev4, sizeof prev4, "%s", getenv("CT_FLASH3_BWD2_OPT"));
      if (fl3) setenv("CT_FLASH3_DQ_ATOMIC", fused ? "1" : "0", 1);
      if (fwd2) unsetenv("CT_FLASH3_BWD");
      else if (fl3) setenv("CT_FLASH3_BWD", bwd2 ? "2" : "1", 1);
      if (fl3) setenv("CT_FLASH3_FWD", fwd2 ? "2" : "1", 1);
      if (bwd2o) setenv("CT_FLASH3_BWD2_OPT", v + 12, 1);
      else if (fl3) unsetenv("CT_FLASH3_BWD2_OPT");
      if (ct_cuda_set_variant("attention", fl3 ? "flash3" : v) != 0)
        CHECK_MSG(0, "--attn: unknown attention variant %s", v);
      else {
        static char name[32];
        snprintf(name, sizeof name, "%s", v);
        g_variant = name;
        run_case(i, perf);
      }
      if (had) setenv("CT_FLASH3_DQ_ATOMIC", prev, 1);
      else if (fl3) unsetenv("CT_FLASH3_DQ_ATOMIC");
      if (had2) setenv("CT_FLASH3_BWD", prev2, 1);
      else if (fl3) unsetenv("CT_FLASH3_BWD");
      if (had3) setenv("CT_FLASH3_FWD", prev3, 1);
      else if (fl3) unsetenv("CT_FLASH3_FWD");
      if (had4) setenv("CT_FLASH3_BWD2_OPT", prev4, 1);
      else if (fl3) unsetenv("CT_FLASH3_BWD2_OPT");
    }
    ct_cuda_set_variant("attention", "default");
  } else if (!dev_is_cpu && g_act16 && c->fam == &fam_mm_fwd && !(c->flags & NOBIAS)) {
    /* lt-first first: a plan keeps the algorithm that lt's timing picked */
    static const char *v[] = {"lt-first", "lt", "gemmex"};
    for (int k = 0; k < 3; k++) {
      ct_cuda_set_variant("matmul", v[k]);
      g_variant = v[k];
      run_case(i, perf);
    }
    ct_cuda_set_variant("matmul", "default");
  } else {
    run_case(i, perf);
  }
  g_variant = "";
}

/* --op and --case: the case's op name contains op, its shape name contains shape (NULL: any) */
static int wanted(const tcase *c, const char *op, const char *shape) {
  return (!op || strstr(c->fam->op, op)) && (!shape || strstr(c->shape, shape));
}

int main(int argc, char **argv) {
  int perf = 0, small = 0;
  const char *only = NULL, *dtype = "all", *only_case = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--perf")) perf = 1;
    else if (!strcmp(argv[i], "--small")) small = 1;
    else if (!strcmp(argv[i], "--op") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--case") && i + 1 < argc) only_case = argv[++i];
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
    else if (!strcmp(argv[i], "--attn") && i + 1 < argc) g_attn_list = argv[++i];
    else if (!strcmp(argv[i], "--cpu")) dev_is_cpu = 1;
    else {
      fprintf(stderr, "usage: %s [--perf | --small] [--op NAME] [--case SHAPE] [--dtype fp32|bf16|fp16|all] [--attn LIST] [--cpu]\n", argv[0]);
      return 2;
    }
  }
  if (strcmp(dtype, "all") && strcmp(dtype, "fp32") && strcmp(dtype, "bf16") && strcmp(dtype, "fp16")) {
    fprintf(stderr, "--dtype %s: want fp32, bf16, fp16 or all\n", dtype);
    return 2;
  }
  const ct_ops *tables[3] = {0};
  int ntables = 0;
  if (dev_is_cpu) {
    tables[ntables++] = ct_ops_cpu();
  } else {
    char err[512];
    if (ct_cuda_device_count() <= 0) {
      printf("no CUDA device visible: skipped\n");
      return 77;
    }
    if (ct_cuda_init(0, err, sizeof err) != 0) {
      fprintf(stderr, "ct_cuda_init: %s\n", err);
      return 1;
    }
    const int all = !strcmp(dtype, "all");
    if (all || !strcmp(dtype, "fp32")) tables[ntables++] = ct_ops_cuda();
    if (all || !strcmp(dtype, "bf16")) tables[ntables++] = ct_ops_cuda_bf16();
    if (all || !strcmp(dtype, "fp16")) tables[ntables++] = ct_ops_cuda_fp16();
    CHECK(ct_ops_cuda()->attention_state_floats(3, 5, 4, 2, 8) == ct_ops_cpu()->attention_state_floats(3, 5, 4, 2, 8));
    CHECK(!strcmp(ct_ops_cuda()->dtype, "fp32") && ct_ops_cuda()->act_bytes == 4);
    CHECK(!strcmp(ct_ops_cuda_bf16()->dtype, "bf16") && ct_ops_cuda_bf16()->act_bytes == 2);
    CHECK(!strcmp(ct_ops_cuda_fp16()->dtype, "fp16") && ct_ops_cuda_fp16()->act_bytes == 2 &&
          !strcmp(ct_ops_cuda_fp16()->name, "cuda-fp16"));
  }
  for (int ti = 0; ti < ntables; ti++) {
    dev = tables[ti];
    g_act16 = dev->act_bytes == 2;
    g_fp16 = g_act16 && !strcmp(dev->dtype, "fp16");
    nstats = 0;
    printf("%s: %s table (%s) against the CPU reference%s\n", argv[0], dev->name, dev->dtype,
           perf ? " (perf: realistic shapes)" : "");
    if (perf) {
      printf("  %-22s %-32s %13s %14s %16s\n", "op", "shape", "time", "bandwidth", "compute");
      for (size_t i = 0; i < NCASES; i++)
        if (cases[i].perf && wanted(&cases[i], only, only_case)) run_selected(i, 1);
      printf("  (GB/s counts each buffer once, read+write for accumulated ones; attention TFLOP/s"
             " counts the causal half)\n");
      continue;
    }
    if (ti == 0) test_alloc();
    if (!only || strstr("cast_params to_host_f32", only)) test_cast();
    if (!only || strstr("f32_to_bf16 bf16_to_f32", only)) test_wire_bf16();
    if (!only || strstr("nonfinite matmul xent", only)) test_nonfinite();
    if (g_act16 && !dev_is_cpu && (!only || strstr("attention", only))) {
#if CT_HAVE_CUDNN
      test_attn_cudnn_vs_flash();
#else
      printf("%s (cudnn vs flash2 comparison skipped)\n", NO_CUDNN_MSG);
#endif
    }
    for (size_t i = 0; i < NCASES; i++)
      if ((!small || !cases[i].perf) && cases[i].perf != 2 && wanted(&cases[i], only, only_case))
        run_selected(i, 0);
    printf("\nworst normalized error per op (cases), %s table%s:\n", dev->name,
           g_act16 ? (g_fp16 ? " (fp16 tolerance " : " (bf16 tolerance ") : "");
    if (g_act16) printf("  %.0e where a case has %s buffers)\n", g_fp16 ? RT_FP16 : RT_BF16, dev->dtype);
    for (int i = 0; i < nstats; i++)
      printf("  %-22s %.2e (%d)\n", stats[i].op, stats[i].worst, stats[i].cases);
  }
  if (!dev_is_cpu && !small && !only) test_sticky_error(); /* last: it leaves the error state set */
  return ct_test_finish();
}
