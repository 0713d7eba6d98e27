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

/* w (OC, IC) row o times x (IC): 16 running sums, lane j taking k = j, j + 16, ... in k order,
 * then the tail, then a fixed pairwise tree. gcc vectorizes the lanes (unit stride, no
 * cross-lane dependence), so the sum order is the same however the caller loops. */
static inline float dot_row(const float *restrict w, const float *restrict x, int IC) {
  float s[16] = {0};
  int k = 0;
  for (; k + 16 <= IC; k += 16)
    for (int j = 0; j < 16; j++) s[j] += w[k + j] * x[k + j];
  for (int j = 0; k + j < IC; j++) s[j] += w[k + j] * x[k + j];
  for (int h = 8; h > 0; h /= 2)
    for (int j = 0; j < h; j++) s[j] += s[j + h];
  return s[0];
}

/* out (N, OC) = inp (N, IC) @ w^T (+ bias) for the few rows of a decode step. sgemm packs the
 * whole weight matrix into its tile layout on every call, which at one or a few rows costs more
 * than the product (38% of a SmolLM2-135M decode step on 2 cores); here each weight row is read
 * once, from memory, and used for every input row while it is in L1. Threads split the outputs;
 * an output's arithmetic depends only on its own row of inp (dot_row), not on N or the number of
 * threads, so a batch row equals its solo run. */
void ct_cpu_matmul_rows_fwd(void *out_, const void *inp_, const void *w_, const void *bias_,
                            int N, int IC, int OC) {
  float *restrict out = out_;
  const float *restrict inp = inp_, *restrict w = w_, *restrict bias = bias_;
#pragma omp parallel for schedule(static) if ((long)N * IC * OC > (1L << 20))
  for (int o = 0; o < OC; o++) {
    const float *wo = w + (size_t)o * IC;
    for (int n = 0; n < N; n++) {
      const float d = dot_row(wo, inp + (size_t)n * IC, IC);
      out[(size_t)n * OC + o] = bias ? bias[o] + d : d;
    }
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
