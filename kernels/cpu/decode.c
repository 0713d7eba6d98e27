/* kernels/cpu/decode.c — CPU references of the batched-inference ops (see ops.h, "batched
 * inference"): embedding at per-row positions, RoPE at per-row positions, KV append by
 * (slot, position), attention of one query row over its own slot's cache, row argmax, and the
 * decode-step fusions, composed from the table's plain ops (the reference of the CUDA kernels)
 * with their products through matmul_rows_fwd (a GEMV) instead of matmul_fwd (sgemm). Each
 * computes for a row exactly what a single-sequence call computes (same operation order), so a
 * batched decode step equals per-sequence decode bit for bit on this backend.
 * The devices-and-graphs entries stay NULL: the CPU has one "device" and no graphs. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/ops.h"

void ct_cpu_attention_cached(void *out, const void *qkv, const void *kc, const void *vc, int n,
                             int pos0, int H, int KV, int hd, int max_T);

static inline int slot_of(const int32_t *slot, int n) { return slot ? slot[n] : n; }

void ct_cpu_embed_pos_fwd(void *out_, const int32_t *tok, const int32_t *pos, const void *wte_,
                          const void *wpe_, int N, int C) {
  float *out = out_;
  const float *wte = wte_, *wpe = wpe_;
  for (int n = 0; n < N; n++) {
    float *o = out + (size_t)n * C;
    const float *e = wte + (size_t)tok[n] * C;
    if (wpe) {
      const float *p = wpe + (size_t)pos[n] * C;
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    } else {
      memcpy(o, e, sizeof(float) * (size_t)C);
    }
  }
}

/* The angle is rounded as rope_fwd's table does (inv_freq and pos * inv_freq in fp32). */
void ct_cpu_rope_pos_fwd(void *qkv_, const int32_t *pos, int N, int H, int KV, int hd,
                         float theta) {
  float *qkv = qkv_;
  const int half = hd / 2, nh = H + KV;
  const long W3 = (long)(H + 2 * KV) * hd;
#pragma omp parallel for if ((long)N * nh * hd > 16384)
  for (int n = 0; n < N; n++) {
    float cs[512], sn[512]; /* hd/2 <= 512: head dims up to 1024 */
    for (int i = 0; i < half && i < 512; i++) {
      float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
      float ang = (float)pos[n] * inv;
      cs[i] = (float)cos((double)ang);
      sn[i] = (float)sin((double)ang);
    }
    for (int h = 0; h < nh; h++) {
      float *x = qkv + n * W3 + (long)h * hd;
      for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half], c = cs[i], s = sn[i];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

void ct_cpu_kv_append(void *kc_, void *vc_, const void *qkv_, const int32_t *slot,
                      const int32_t *pos, int N, int H, int KV, int hd, int max_T) {
  float *kc = kc_, *vc = vc_;
  const float *qkv = qkv_;
  const size_t W3 = (size_t)(H + 2 * KV) * hd, seq = (size_t)KV * max_T * hd;
  for (int n = 0; n < N; n++) {
    const float *row = qkv + (size_t)n * W3;
    for (int h = 0; h < KV; h++) {
      const size_t dst = (size_t)slot_of(slot, n) * seq + ((size_t)h * max_T + pos[n]) * hd;
      memcpy(kc + dst, row + (size_t)(H + h) * hd, sizeof(float) * (size_t)hd);
      memcpy(vc + dst, row + (size_t)(H + KV + h) * hd, sizeof(float) * (size_t)hd);
    }
  }
}

/* Row by row through attention_cached (one query at position pos[n]): the same arithmetic. */
void ct_cpu_attention_decode(void *out_, const void *qkv_, const void *kc_, const void *vc_,
                             const int32_t *slot, const int32_t *pos, int N, int H, int KV,
                             int hd, int max_T) {
  float *out = out_;
  const float *qkv = qkv_, *kc = kc_, *vc = vc_;
  const size_t W3 = (size_t)(H + 2 * KV) * hd, seq = (size_t)KV * max_T * hd;
  for (int n = 0; n < N; n++) {
    const size_t s = (size_t)slot_of(slot, n) * seq;
    ct_cpu_attention_cached(out + (size_t)n * H * hd, qkv + (size_t)n * W3, kc + s, vc + s, 1,
                            pos[n], H, KV, hd, max_T);
  }
}

void ct_cpu_argmax_rows(int32_t *out, const void *logits_, int N, int V, int Vp) {
  const float *logits = logits_;
  for (int n = 0; n < N; n++) {
    const float *r = logits + (size_t)n * Vp;
    int best = 0;
    for (int i = 1; i < V; i++)
      if (r[i] > r[best]) best = i;
    out[n] = best;
  }
}

/* ---- decode-step fusions: the plain ops in order (ops.h) ---- */

/* Eight running sums as one vector: AVX2 + FMA where the build targets them (the default
 * -march=native and x86-64-v3 do), eight floats with fmaf elsewhere; the same arithmetic. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 v8;
static inline v8 v8_zero(void) { return _mm256_setzero_ps(); }
static inline v8 v8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline v8 v8_fma(v8 a, v8 b, v8 c) { return _mm256_fmadd_ps(a, b, c); }
static inline void v8_store(float *p, v8 a) { _mm256_storeu_ps(p, a); }
#else
typedef struct { float f[8]; } v8;
static inline v8 v8_zero(void) { return (v8){{0}}; }
static inline v8 v8_load(const float *p) {
  v8 a;
  memcpy(a.f, p, sizeof a.f);
  return a;
}
static inline v8 v8_fma(v8 a, v8 b, v8 c) {
  for (int j = 0; j < 8; j++) c.f[j] = fmaf(a.f[j], b.f[j], c.f[j]);
  return c;
}
static inline void v8_store(float *p, v8 a) { memcpy(p, a.f, sizeof a.f); }
#endif

/* The products of NB rows of inp (from n0) with OB rows of w (from o0), NB, OB <= 4 and
 * NB * OB <= 8, into out
 * (+ bias). Each (row, output) pair has its own 8 running sums, lane j taking k = j, j + 8, ...
 * in k order as fused multiply-adds, then the tail (k past the last multiple of 8) into lanes
 * 0.., then a fixed pairwise tree: a tile only interleaves independent sums, so an output's bits
 * do not depend on the tile shape it was computed in, on N or on the thread count. The sums of
 * a tile stay in vector registers (NB * OB of them hide the add latency) and each weight and
 * input chunk is loaded once per tile. */
static inline __attribute__((always_inline)) void rows_tile(float *restrict out,
                                                            const float *restrict inp,
                                                            const float *restrict w,
                                                            const float *restrict bias, int IC,
                                                            int OC, int n0, int o0, int NB,
                                                            int OB) {
  v8 acc[8];
  const float *x[4], *wr[4];
  for (int r = 0; r < NB; r++) x[r] = inp + (size_t)(n0 + r) * IC;
  for (int c = 0; c < OB; c++) wr[c] = w + (size_t)(o0 + c) * IC;
  for (int i = 0; i < NB * OB; i++) acc[i] = v8_zero();
  int k = 0;
  for (; k + 8 <= IC; k += 8) {
    v8 wv[4];
    for (int c = 0; c < OB; c++) wv[c] = v8_load(wr[c] + k);
    for (int r = 0; r < NB; r++) {
      const v8 xv = v8_load(x[r] + k);
      for (int c = 0; c < OB; c++) acc[r * OB + c] = v8_fma(wv[c], xv, acc[r * OB + c]);
    }
  }
  for (int r = 0; r < NB; r++)
    for (int c = 0; c < OB; c++) {
      float t[8];
      v8_store(t, acc[r * OB + c]);
      for (int j = 0; k + j < IC; j++) t[j] = fmaf(wr[c][k + j], x[r][k + j], t[j]);
      for (int h = 4; h > 0; h /= 2)
        for (int j = 0; j < h; j++) t[j] += t[j + h];
      out[(size_t)(n0 + r) * OC + o0 + c] = bias ? bias[o0 + c] + t[0] : t[0];
    }
}

/* out (N, OC) = inp (N, IC) @ w^T (+ bias) for the few rows of a decode step. sgemm packs the
 * whole weight matrix into its tile layout on every call, which at one or a few rows costs more
 * than the product (38% of a SmolLM2-135M decode step on 2 cores); here each weight row is read
 * once from memory and used for every input row while it is in L1 or L2: tiles of 4 rows x 2
 * outputs, leftover rows 1 x 4 outputs, leftover outputs 1 x 1 (constant shapes, so each
 * compiles to its own unrolled loop). Threads split the outputs in fours; an output's
 * arithmetic depends only on its own row of inp (rows_tile), so a batch row equals its solo
 * run. */
void ct_cpu_matmul_rows_fwd(void *out_, const void *inp_, const void *w_, const void *bias_,
                            int N, int IC, int OC) {
  float *restrict out = out_;
  const float *restrict inp = inp_, *restrict w = w_, *restrict bias = bias_;
  const int quads = OC / 4;
#pragma omp parallel if ((long)N * IC * OC > (1L << 20))
  {
#pragma omp for schedule(static) nowait
    for (int q = 0; q < quads; q++) {
      const int o0 = 4 * q;
      int n = 0;
      for (; n + 4 <= N; n += 4) {
        rows_tile(out, inp, w, bias, IC, OC, n, o0, 4, 2);
        rows_tile(out, inp, w, bias, IC, OC, n, o0 + 2, 4, 2);
      }
      for (; n < N; n++) rows_tile(out, inp, w, bias, IC, OC, n, o0, 1, 4);
    }
#pragma omp for schedule(static)
    for (int o = 4 * quads; o < OC; o++)
      for (int n = 0; n < N; n++) rows_tile(out, inp, w, bias, IC, OC, n, o, 1, 1);
  }
}

void ct_cpu_norm_matmul_fwd(void *out, void *ln, const void *inp, const void *nw, const void *w,
                            const void *bias, int N, int IC, int OC, float eps) {
  const ct_ops *o = ct_ops_cpu();
  o->rmsnorm_fwd(ln, NULL, inp, nw, N, IC, N, 0, eps);
  ct_cpu_matmul_rows_fwd(out, ln, w, bias, N, IC, OC);
}

void ct_cpu_norm_matmul_swiglu_fwd(void *act, void *pre, void *ln, const void *inp,
                                   const void *nw, const void *w, int N, int IC, int F,
                                   float eps) {
  const ct_ops *o = ct_ops_cpu();
  o->rmsnorm_fwd(ln, NULL, inp, nw, N, IC, N, 0, eps);
  ct_cpu_matmul_rows_fwd(pre, ln, w, NULL, N, IC, 2 * F);
  o->swiglu_fwd(act, pre, N, F);
}

void ct_cpu_matmul_add_fwd(void *out, const void *inp, const void *w, const void *bias,
                           const void *res, int N, int IC, int OC) {
  const ct_ops *o = ct_ops_cpu();
  ct_cpu_matmul_rows_fwd(out, inp, w, bias, N, IC, OC);
  o->add_fwd(out, out, res, (size_t)N * OC);
}

void ct_cpu_qkv_rope_append(void *qkv_, const void *raw_, const void *qnw, const void *knw,
                            void *kc, void *vc, const int32_t *slot, const int32_t *pos, int N,
                            int H, int KV, int hd, int max_T, float theta, float eps) {
  const ct_ops *o = ct_ops_cpu();
  float *qkv = qkv_;
  const float *raw = raw_;
  const size_t W = (size_t)(H + 2 * KV) * hd;
  if (qnw) {
    const size_t v0 = (size_t)(H + KV) * hd;
    if (qkv != raw)
      o->copy2d(qkv + v0, W * 4, raw + v0, W * 4, (size_t)KV * hd * 4, (size_t)N);
    o->rmsnorm_fwd(qkv, NULL, raw, qnw, N * H, hd, H, (long)W, eps);
    o->rmsnorm_fwd(qkv + (size_t)H * hd, NULL, raw + (size_t)H * hd, knw, N * KV, hd, KV,
                   (long)W, eps);
  } else if (qkv != raw) {
    memcpy(qkv, raw, sizeof(float) * W * (size_t)N);
  }
  ct_cpu_rope_pos_fwd(qkv, pos, N, H, KV, hd, theta);
  ct_cpu_kv_append(kc, vc, qkv, slot, pos, N, H, KV, hd, max_T);
}
