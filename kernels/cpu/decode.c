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
 * -march=native and x86-64-v3 do), eight floats with fmaf elsewhere; the same arithmetic.
 * v8_fma_part adds the tail (k past the last multiple of 8) into lanes 0.. and leaves the others
 * as they are (a blend, not an fma with zeros, which would turn a -0 lane into +0); v8_sum is
 * the fixed pairwise tree over the lanes (h = 4, 2, 1), and v8_sum4 the same adds in the same
 * order for four vectors at once. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 v8;
static inline v8 v8_zero(void) { return _mm256_setzero_ps(); }
static inline v8 v8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline v8 v8_fma(v8 a, v8 b, v8 c) { return _mm256_fmadd_ps(a, b, c); }
static inline v8 v8_fma_part(const float *a, const float *b, v8 c, int n) { /* 0 < n < 8 */
  static const int32_t ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1};
  const __m256i m = _mm256_loadu_si256((const __m256i *)(ones + 8 - n)); /* lanes < n */
  const v8 r = _mm256_fmadd_ps(_mm256_maskload_ps(a, m), _mm256_maskload_ps(b, m), c);
  return _mm256_blendv_ps(c, r, _mm256_castsi256_ps(m));
}
static inline float v8_sum(v8 a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* h = 4 */
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));                                          /* h = 2 */
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));                        /* h = 1 */
}
static inline void v8_sum4(float *s, v8 a0, v8 a1, v8 a2, v8 a3) {
  const __m128 h0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  const __m128 h1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
  const __m128 h2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
  const __m128 h3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
  /* (h0[0] + h0[2], h0[1] + h0[3], h1[0] + h1[2], h1[1] + h1[3]), then the pairs added */
  const __m128 q01 = _mm_add_ps(_mm_shuffle_ps(h0, h1, 0x44), _mm_shuffle_ps(h0, h1, 0xee));
  const __m128 q23 = _mm_add_ps(_mm_shuffle_ps(h2, h3, 0x44), _mm_shuffle_ps(h2, h3, 0xee));
  _mm_storeu_ps(s, _mm_hadd_ps(q01, q23));
}
/* Into L2, not L1: the weights read now and the input rows keep L1 to themselves.
 * always_inline: GCC 12 finds a not yet inlined wrapper of a prefetch "const" and drops it. */
static inline __attribute__((always_inline)) void prefetch_l2(const float *p) {
  _mm_prefetch((const char *)p, _MM_HINT_T1);
}
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
static inline v8 v8_fma_part(const float *a, const float *b, v8 c, int n) {
  for (int j = 0; j < n; j++) c.f[j] = fmaf(a[j], b[j], c.f[j]);
  return c;
}
static inline float v8_sum(v8 a) {
  for (int h = 4; h > 0; h /= 2)
    for (int j = 0; j < h; j++) a.f[j] += a.f[j + h];
  return a.f[0];
}
static inline void v8_sum4(float *s, v8 a0, v8 a1, v8 a2, v8 a3) {
  s[0] = v8_sum(a0);
  s[1] = v8_sum(a1);
  s[2] = v8_sum(a2);
  s[3] = v8_sum(a3);
}
static inline void prefetch_l2(const float *p) { (void)p; }
#endif

/* The products of NB rows of inp (from n0) with OB rows of w (from o0) into out (+ bias),
 * NB, OB <= 4 and NB * OB <= 12. Each (row, output) pair has its own 8 running sums, lane j
 * taking k = j, j + 8, ... in k order as fused multiply-adds, then the tail (k past the last
 * multiple of 8) into lanes 0.., then a fixed pairwise tree: a tile only interleaves
 * independent sums, so an output's bits do not depend on the tile shape it was computed in, on
 * N or on the thread count. The sums of a tile stay in vector registers (4 x 3: 12 sums, 3
 * weight vectors and one input vector fill AVX2's 16; 8 or more sums hide the FMA latency) and
 * each weight and input chunk is loaded once per tile. On the way it prefetches pfn weight rows,
 * pfs floats apart from pf, at the same k (see rows_pf). */
static inline __attribute__((always_inline)) void rows_tile(float *restrict out,
                                                            const float *restrict inp,
                                                            const float *restrict w,
                                                            const float *restrict bias, int IC,
                                                            int OC, int n0, int o0, int NB,
                                                            int OB, const float *pf, int pfn,
                                                            long pfs) {
  v8 acc[12];
  const float *x[4], *wr[4];
  for (int r = 0; r < NB; r++) x[r] = inp + (size_t)(n0 + r) * IC;
  for (int c = 0; c < OB; c++) wr[c] = w + (size_t)(o0 + c) * IC;
  for (int i = 0; i < NB * OB; i++) acc[i] = v8_zero();
  int k = 0;
  for (; k + 8 <= IC; k += 8) {
    v8 wv[4];
    for (int i = 0; i < pfn; i++) prefetch_l2(pf + i * pfs + k);
    for (int c = 0; c < OB; c++) wv[c] = v8_load(wr[c] + k);
    for (int r = 0; r < NB; r++) {
      const v8 xv = v8_load(x[r] + k);
      for (int c = 0; c < OB; c++) acc[r * OB + c] = v8_fma(wv[c], xv, acc[r * OB + c]);
    }
  }
  if (k < IC)
    for (int r = 0; r < NB; r++)
      for (int c = 0; c < OB; c++)
        acc[r * OB + c] = v8_fma_part(wr[c] + k, x[r] + k, acc[r * OB + c], IC - k);
  float s[12];
  int i = 0;
  for (; i + 4 <= NB * OB; i += 4) v8_sum4(s + i, acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
  for (; i < NB * OB; i++) s[i] = v8_sum(acc[i]);
  for (int r = 0; r < NB; r++)
    for (int c = 0; c < OB; c++)
      out[(size_t)(n0 + r) * OC + o0 + c] = bias ? bias[o0 + c] + s[r * OB + c] : s[r * OB + c];
}

/* A tile of OB outputs is swept in P passes (one per input row or block of rows) while the
 * weights of the tile ROWS_PF_AHEAD tiles on (OB consecutive rows of w) are prefetched, pass p
 * taking its rows p, p + P, ...: spread over the passes, they arrive while this tile computes,
 * and no pass issues a burst that fills the line-fill buffers (prefetching all of them in the
 * first pass was about 5% slower at 16 and 32 rows; none at all, 10-90% from 4 rows up). rows_pf:
 * how many rows pass p prefetches. */
#define ROWS_PF_AHEAD 2
static inline int rows_pf(int p, int P, int OB) { return p < OB ? (OB - p + P - 1) / P : 0; }

/* Pass p of P over the tile at output o0: rows NB * p .. of inp, prefetching its share of the
 * tile ROWS_PF_AHEAD on when there is one (ahead). */
static inline __attribute__((always_inline)) void rows_pass(float *restrict out,
                                                            const float *restrict inp,
                                                            const float *restrict w,
                                                            const float *restrict bias, int IC,
                                                            int OC, int o0, int NB, int OB, int p,
                                                            int P, int ahead) {
  const int pfn = ahead ? rows_pf(p, P, OB) : 0;
  const float *pf = pfn ? w + (size_t)(o0 + OB * ROWS_PF_AHEAD + p) * IC : NULL;
  rows_tile(out, inp, w, bias, IC, OC, NB * p, o0, NB, OB, pf, pfn, (long)P * IC);
}

/* N < 4: the memory-bound GEMV of one to three rows. Tiles of 1 row x 4 outputs (4 sums do not
 * hide the FMA latency, but memory is slower still), each weight row read from memory once and
 * again from L1 for the next input row; leftover outputs 1 x 1. */
static void rows_few(float *restrict out, const float *restrict inp, const float *restrict w,
                     const float *restrict bias, int N, int IC, int OC) {
  const int quads = OC / 4;
#pragma omp for schedule(static) nowait
  for (int q = 0; q < quads; q++) {
    const int o0 = 4 * q, ahead = q + ROWS_PF_AHEAD < quads;
    for (int n = 0; n < N; n++) rows_pass(out, inp, w, bias, IC, OC, o0, 1, 4, n, N, ahead);
  }
#pragma omp for schedule(static)
  for (int o = 4 * quads; o < OC; o++)
    for (int n = 0; n < N; n++) rows_tile(out, inp, w, bias, IC, OC, n, o, 1, 1, NULL, 0, 0);
}

/* N >= 4: tiles of 4 rows x 3 outputs (7 loads for 12 FMAs, against 6 for 8 with 4 x 2), the
 * 3 weight rows read from memory once and from L1 or L2 for each further block of 4 rows;
 * leftover rows (N % 4) x 3, leftover outputs 4 x 1 and 1 x 1. */
static void rows_many(float *restrict out, const float *restrict inp, const float *restrict w,
                      const float *restrict bias, int N, int IC, int OC) {
  const int triples = OC / 3, P = N / 4;
#pragma omp for schedule(static) nowait
  for (int t = 0; t < triples; t++) {
    const int o0 = 3 * t, ahead = t + ROWS_PF_AHEAD < triples;
    for (int p = 0; p < P; p++) rows_pass(out, inp, w, bias, IC, OC, o0, 4, 3, p, P, ahead);
    const int n = 4 * P;
    switch (N - n) { /* constant shapes, each its own unrolled loop */
    case 3: rows_tile(out, inp, w, bias, IC, OC, n, o0, 3, 3, NULL, 0, 0); break;
    case 2: rows_tile(out, inp, w, bias, IC, OC, n, o0, 2, 3, NULL, 0, 0); break;
    case 1: rows_tile(out, inp, w, bias, IC, OC, n, o0, 1, 3, NULL, 0, 0); break;
    }
  }
#pragma omp for schedule(static)
  for (int o = 3 * triples; o < OC; o++) {
    int n = 0;
    for (; n + 4 <= N; n += 4) rows_tile(out, inp, w, bias, IC, OC, n, o, 4, 1, NULL, 0, 0);
    for (; n < N; n++) rows_tile(out, inp, w, bias, IC, OC, n, o, 1, 1, NULL, 0, 0);
  }
}

/* out (N, OC) = inp (N, IC) @ w^T (+ bias) for the few rows of a decode step. sgemm packs the
 * whole weight matrix into its tile layout on every call, which at one or a few rows costs more
 * than the product (38% of a SmolLM2-135M decode step on 2 cores); here each weight row is read
 * once from memory and used for every input row while it is in L1 or L2: rows_few below 4
 * rows, rows_many from 4 (all tile shapes compile to their own unrolled loops). Threads split
 * the outputs in fours or threes; an output's arithmetic depends only on its own row of inp
 * (rows_tile), so a batch row equals its solo run. Threads from 32K multiply-adds (a 576 x 64
 * weight), not 1M: a fork costs about a microsecond, and on 2 cores a one-row 576 x 64 product
 * takes a fifth less time threaded, 576 x 576 half. */
void ct_cpu_matmul_rows_fwd(void *out_, const void *inp_, const void *w_, const void *bias_,
                            int N, int IC, int OC) {
  float *restrict out = out_;
  const float *restrict inp = inp_, *restrict w = w_, *restrict bias = bias_;
#pragma omp parallel if ((long)N * IC * OC >= (1L << 15))
  {
    if (N < 4) rows_few(out, inp, w, bias, N, IC, OC);
    else rows_many(out, inp, w, bias, N, IC, OC);
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
