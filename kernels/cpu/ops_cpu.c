/* kernels/cpu/ops_cpu.c — the CPU reference backend of the op table (kernels/ops.h).
 *
 * Contract (ops.h has the full text; this file follows it exactly):
 *   - Every activation is fp32: the `void *` of the table are `float *`. Row-major, N = B*T rows.
 *   - Backward ACCUMULATES (+=) into every gradient it writes; a NULL gradient pointer means
 *     "not wanted" and is skipped. rope_bwd is the one in-place op: it rotates dqkv back.
 *   - Linear weights use the nn.Linear layout (OC, IC); matmuls are OpenBLAS cblas_sgemm.
 *   - qkv rows are [H q heads | KV k heads | KV v heads], hd each; query head h reads kv head
 *     h / (H/KV). The attention state is the probabilities (B, H, T, T), zero above the diagonal.
 *   - Statistics (norm mean/variance, softmax normalizers, sums of squares, column sums of
 *     gradients) accumulate in double; RoPE angles are rounded as HF computes them in fp32.
 *   - Deterministic for a given thread count: no atomics; every cross-thread reduction is
 *     combined in a fixed order.
 *
 * Threading: OpenMP is the one thread pool — over rows, columns or (batch, head). OpenBLAS is
 * kept single-threaded and each OpenMP thread calls sgemm on its own slice (matmul) or its own
 * (batch, head) (attention), so two pools never spin against each other. Inner loops are plain
 * unit-stride loops (with `omp simd` where they reduce) so gcc -O3 vectorizes them without
 * -ffast-math; exp goes through ct_expf below because libm's expf does not vectorize.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kernels/ops.h"

/* Below this many elements of work a loop runs on the calling thread: waking the OpenMP team
 * costs a few microseconds, more than the loop itself. */
#define CT_PAR_MIN 16384

/* exp(x) in fp32 without a libm call, so loops around it vectorize: Cephes' expf polynomial
 * on x = n ln2 + r (|r| <= ln2/2), with 2^n built in the exponent bits. Max error ~2 ulp.
 * x is clamped to [-87.33, 88.37] (finite, normal results): below, the result is ~1.2e-38
 * instead of a smaller number, which no softmax sum or sigmoid can tell apart. */
static inline float ct_expf(float x) {
  /* Clamp on the bit pattern: a float compare-and-select here makes gcc (with the default
   * -ftrapping-math) split the loop on a branch it then cannot vectorize; integer min/max is
   * branch-free. As unsigned, every x < -87.33 (and -NaN) is above bits(-87.33); as signed,
   * every x > 88.37 (and +NaN) is above bits(88.37), and negative floats are negative ints. */
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u = u > 0xC2AEA8F6u ? 0xC2AEA8F6u : u; /* -87.33f */
  int32_t xi = (int32_t)u;
  xi = xi > 0x42B0BD71 ? 0x42B0BD71 : xi; /* 88.37f */
  memcpy(&x, &xi, sizeof x);
  const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float t = x * 1.44269504088896341f + shifter;
  float n = t - shifter;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t ti;
  memcpy(&ti, &t, sizeof ti);              /* bits of t = 0x4B400000 + n */
  int32_t ei = (ti - 0x4B400000 + 127) << 23; /* 2^n */
  float s;
  memcpy(&s, &ei, sizeof s);
  return p * s;
}

/* Scratch for kernels (O(C) column accumulators, O(T hd) attention blocks). The op table has
 * no status channel, so running out of memory here is fatal, as in an out-of-memory CUDA
 * launch. */
static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) abort();
  return p;
}
static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) abort();
  return p;
}

/* [lo, hi) of a static split of n items over the calling OpenMP team. */
static inline void ct_split(long n, long *lo, long *hi) {
  int nt = omp_get_num_threads(), id = omp_get_thread_num();
  *lo = n * id / nt;
  *hi = n * (id + 1) / nt;
}

/* ---------------------------------------------------------------------------------------- */
/* memory                                                                                   */

static void *cpu_alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (p) memset(p, 0, rounded);
  return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) {
  if (dst != src && bytes) memcpy(dst, src, bytes);
}
static void cpu_copy2d(void *dst, size_t dst_stride, const void *src, size_t src_stride,
                       size_t row_bytes, size_t rows) {
  if (!rows || !row_bytes) return;
  /* rows go in parallel only when the two regions are disjoint (then no row reads another's
   * destination); overlapping copies run in order, row by row */
  const char *d0 = dst, *d1 = d0 + (rows - 1) * dst_stride + row_bytes;
  const char *s0 = src, *s1 = s0 + (rows - 1) * src_stride + row_bytes;
  int disjoint = d1 <= s0 || s1 <= d0;
#pragma omp parallel for if (disjoint && rows * row_bytes > 4 * CT_PAR_MIN)
  for (size_t r = 0; r < rows; r++)
    memmove((char *)dst + r * dst_stride, (const char *)src + r * src_stride, row_bytes);
}

/* ---------------------------------------------------------------------------------------- */
/* embedding                                                                                */

static void embed_fwd(void *out_, const int32_t *tok, const void *wte_, const void *wpe_, int B,
                      int T, int C) {
  float *out = out_;
  const float *wte = wte_, *wpe = wpe_;
  long N = (long)B * T;
#pragma omp parallel for if (N * C > CT_PAR_MIN)
  for (long n = 0; n < N; n++) {
    float *o = out + n * C;
    const float *e = wte + (long)tok[n] * C;
    if (wpe) {
      const float *p = wpe + (n % T) * C;
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    } else {
      memcpy(o, e, sizeof(float) * (size_t)C);
    }
  }
}

/* dwte rows repeat when tokens repeat, so threads split the columns (not the rows): each
 * thread owns dwte[:, lo:hi) and walks all N rows in order — no races, fixed order. */
static void embed_bwd(float *dwte, float *dwpe, const void *dout_, const int32_t *tok, int B,
                      int T, int C) {
  const float *dout = dout_;
  long N = (long)B * T;
  if (dwte) {
#pragma omp parallel if (N * C > CT_PAR_MIN)
    {
      long lo, hi;
      ct_split(C, &lo, &hi);
      for (long n = 0; n < N && lo < hi; n++) {
        float *g = dwte + (long)tok[n] * C;
        const float *d = dout + n * C;
        for (long c = lo; c < hi; c++) g[c] += d[c];
      }
    }
  }
  if (dwpe) {
#pragma omp parallel for if (N * C > CT_PAR_MIN)
    for (int t = 0; t < T; t++) {
      float *g = dwpe + (long)t * C;
      for (int b = 0; b < B; b++) {
        const float *d = dout + ((long)b * T + t) * C;
        for (int c = 0; c < C; c++) g[c] += d[c];
      }
    }
  }
}

/* ---- rows of a table (parallel/ddp.c's sparse embedding gradient) ---- */

static void flagged_rows(int32_t *rows, const int32_t *flags, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (flags[i]) rows[k++] = i;
}

/* rows are distinct, so each row is one thread's alone */
static void take_rows(float *dst, float *src, const int32_t *rows, int n, int C) {
#pragma omp parallel for if ((long)n * C > CT_PAR_MIN)
  for (int i = 0; i < n; i++) {
    float *s = src + (long)rows[i] * C;
    memcpy(dst + (long)i * C, s, sizeof(float) * (size_t)C);
    memset(s, 0, sizeof(float) * (size_t)C);
  }
}

static void scatter_add_rows(float *dst, const float *src, const int32_t *rows, int n, int C) {
#pragma omp parallel for if ((long)n * C > CT_PAR_MIN)
  for (int i = 0; i < n; i++) {
    float *d = dst + (long)rows[i] * C;
    const float *s = src + (long)i * C;
    for (int c = 0; c < C; c++) d[c] += s[c];
  }
}

/* ---------------------------------------------------------------------------------------- */
/* normalization                                                                            */

static void layernorm_fwd(void *out_, float *mean, float *rstd, const void *inp_, const void *w_,
                          const void *b_, int N, int C, float eps) {
  float *out = out_;
  const float *inp = inp_, *w = w_, *b = b_;
#pragma omp parallel for if ((long)N * C > CT_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (long)n * C;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    float m = (float)(s / C);
    double v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) {
      float d = x[c] - m;
      v += (double)d * d;
    }
    float r = (float)(1.0 / sqrt(v / C + eps));
    float *o = out + (long)n * C;
    if (b) {
      for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
    } else {
      for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c];
    }
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
  }
}

static void layernorm_bwd(void *dinp_, float *dw, float *db, const void *dout_, const void *inp_,
                          const void *w_, const float *mean, const float *rstd, int N, int C) {
  float *dinp = dinp_;
  const float *dout = dout_, *inp = inp_, *w = w_;
  int par = (long)N * C > CT_PAR_MIN;
  if (dinp) {
#pragma omp parallel for if (par)
    for (int n = 0; n < N; n++) {
      const float *x = inp + (long)n * C, *dy = dout + (long)n * C;
      float m = mean[n], r = rstd[n];
      double sg = 0, sgx = 0; /* sum of dnorm, sum of dnorm * norm */
#pragma omp simd reduction(+ : sg, sgx)
      for (int c = 0; c < C; c++) {
        float g = dy[c] * w[c];
        sg += g;
        sgx += (double)g * ((x[c] - m) * r);
      }
      float mg = (float)(sg / C), mgx = (float)(sgx / C);
      float *dx = dinp + (long)n * C;
      for (int c = 0; c < C; c++) {
        float nrm = (x[c] - m) * r;
        dx[c] += (dy[c] * w[c] - mg - nrm * mgx) * r;
      }
    }
  }
  if (dw || db) { /* column sums: each thread owns a column range and walks every row */
#pragma omp parallel if (par)
    {
      long lo, hi;
      ct_split(C, &lo, &hi);
      long w_ = hi - lo;
      if (w_ > 0) {
        double *acc = xcalloc((size_t)(2 * w_), sizeof(double));
        double *aw = acc, *ab = acc + w_;
        for (int n = 0; n < N; n++) {
          const float *x = inp + (long)n * C + lo, *dy = dout + (long)n * C + lo;
          float m = mean[n], r = rstd[n];
          for (long c = 0; c < w_; c++) {
            aw[c] += (double)(dy[c] * ((x[c] - m) * r));
            ab[c] += (double)dy[c];
          }
        }
        for (long c = 0; c < w_; c++) {
          if (dw) dw[lo + c] += (float)aw[c];
          if (db) db[lo + c] += (float)ab[c];
        }
        free(acc);
      }
    }
  }
}

/* Start of rmsnorm row r: see ops.h (plain form: rows_per_group = N, group_stride = 0). */
static inline long rms_row(long r, int C, int rpg, long gs) {
  return (r / rpg) * gs + (r % rpg) * (long)C;
}

static void rmsnorm_fwd(void *out_, float *rstd, const void *inp_, const void *w_, int N, int C,
                        int rpg, long gs, float eps) {
  float *out = out_;
  const float *inp = inp_, *w = w_;
  if (rpg <= 0) rpg = N > 0 ? N : 1;
#pragma omp parallel for if ((long)N * C > CT_PAR_MIN)
  for (int n = 0; n < N; n++) {
    long off = rms_row(n, C, rpg, gs);
    const float *x = inp + off;
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    float r = (float)(1.0 / sqrt(ss / C + eps));
    float *o = out + off;
    for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
    if (rstd) rstd[n] = r;
  }
}

static void rmsnorm_bwd(void *dinp_, float *dw, const void *dout_, const void *inp_,
                        const void *w_, const float *rstd, int N, int C, int rpg, long gs) {
  float *dinp = dinp_;
  const float *dout = dout_, *inp = inp_, *w = w_;
  if (rpg <= 0) rpg = N > 0 ? N : 1;
  int par = (long)N * C > CT_PAR_MIN;
  if (dinp) {
    /* y = x r w, r = (mean(x^2) + eps)^-1/2:  dx = r w dy - x r^3 / C * sum(w dy x) */
#pragma omp parallel for if (par)
    for (int n = 0; n < N; n++) {
      long off = rms_row(n, C, rpg, gs);
      const float *x = inp + off, *dy = dout + off;
      float r = rstd[n];
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int c = 0; c < C; c++) s += (double)(dy[c] * w[c]) * x[c];
      float k = (float)(s * r * r * r / C);
      float *dx = dinp + off;
      for (int c = 0; c < C; c++) dx[c] += r * w[c] * dy[c] - x[c] * k;
    }
  }
  if (dw) {
#pragma omp parallel if (par)
    {
      long lo, hi;
      ct_split(C, &lo, &hi);
      long w_ = hi - lo;
      if (w_ > 0) {
        double *aw = xcalloc((size_t)w_, sizeof(double));
        for (int n = 0; n < N; n++) {
          long off = rms_row(n, C, rpg, gs) + lo;
          const float *x = inp + off, *dy = dout + off;
          float r = rstd[n];
          for (long c = 0; c < w_; c++) aw[c] += (double)(dy[c] * (x[c] * r));
        }
        for (long c = 0; c < w_; c++) dw[lo + c] += (float)aw[c];
        free(aw);
      }
    }
  }
}

/* ---------------------------------------------------------------------------------------- */
/* matmul                                                                                   */

/* OpenBLAS runs single-threaded (see ct_ops_cpu) and each OpenMP thread issues one sgemm on
 * its slice of the output: one thread pool for the whole backend, so sgemm workers never spin
 * against the OpenMP loops around them, and attention can call sgemm from inside its own
 * parallel loop. A slice is a block of rows or of columns of the output, whichever dimension
 * is longer; boundaries are multiples of 16 so the BLAS micro-kernels see full tiles. */
#define CT_GEMM_PAR_MIN (1L << 21) /* flops below which one thread does the whole sgemm */

/* Every sgemm of this backend goes through here. OpenBLAS's OpenMP build threads whenever the
 * caller's OpenMP thread count is above one and it is not inside an ACTIVE parallel region,
 * and our regions are inactive when their `if` clause is false (a small matmul, a decode step):
 * there it opened a nested team for each call, whose threads libgomp creates afresh (2,611
 * thread creations for 30 decode steps of SmolLM2-135M on 2 cores: 3.5 instead of 15.5
 * tokens/s). A thread count of one for the call (this task's own setting, put back after)
 * keeps it on the calling thread in every case. */
static void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, long M, long N, long K, float alpha,
                  const float *A, long lda, const float *B, long ldb, float beta, float *C,
                  long ldc) {
  const int nt = omp_get_max_threads();
  if (nt > 1) omp_set_num_threads(1);
  cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb,
              beta, C, (int)ldc);
  if (nt > 1) omp_set_num_threads(nt);
}

static inline void ct_split16(long n, long *lo, long *hi) {
  long blocks = (n + 15) / 16;
  ct_split(blocks, lo, hi);
  *lo = *lo * 16 < n ? *lo * 16 : n;
  *hi = *hi * 16 < n ? *hi * 16 : n;
}

/* C(M, Nc) (+)= op(A) op(B) restricted to this thread's slice of C's rows or columns. A is
 * (M, K) (or (K, M) when ta), B is (K, Nc) (or (Nc, K) when tb), row-major. */
static void gemm_slice(int ta, int tb, long M, long Nc, long K, const float *A, long lda,
                       const float *B, long ldb, float beta, float *C, long ldc) {
  long lo, hi;
  if (M >= Nc) {
    ct_split16(M, &lo, &hi);
    if (hi <= lo) return;
    A += ta ? lo : lo * lda;
    C += lo * ldc;
    M = hi - lo;
  } else {
    ct_split16(Nc, &lo, &hi);
    if (hi <= lo) return;
    B += tb ? lo * ldb : lo;
    C += lo;
    Nc = hi - lo;
  }
  sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, Nc, K, 1.0f, A, lda, B,
        ldb, beta, C, ldc);
}

static void matmul_fwd(void *out_, const void *inp, const void *w, const void *bias_, int N,
                       int IC, int OC) {
  float *out = out_;
  const float *bias = bias_;
  if (N <= 0 || OC <= 0) return;
  if (bias) { /* out = bias, then out += inp @ w^T inside the sgemm */
#pragma omp parallel for if ((long)N * OC > CT_PAR_MIN)
    for (int n = 0; n < N; n++) memcpy(out + (long)n * OC, bias, sizeof(float) * (size_t)OC);
  }
  float beta = bias ? 1.0f : 0.0f;
#pragma omp parallel if (2.0 * N * IC * OC > CT_GEMM_PAR_MIN)
  gemm_slice(0, 1, N, OC, IC, inp, IC, w, IC, beta, out, OC);
}

static void matmul_bwd(void *dinp, float *dw, float *dbias, const void *dout_, const void *inp,
                       const void *w, int N, int IC, int OC) {
  const float *dout = dout_;
  if (N <= 0) return;
  /* the three outputs are independent: each thread does its slice of each, no barrier */
#pragma omp parallel if (2.0 * N * IC * OC > CT_GEMM_PAR_MIN)
  {
    if (dinp) /* dinp(N,IC) += dout(N,OC) @ w(OC,IC) */
      gemm_slice(0, 0, N, IC, OC, dout, OC, w, IC, 1.0f, dinp, IC);
    if (dw) /* dw(OC,IC) += dout^T @ inp */
      gemm_slice(1, 0, OC, IC, N, dout, OC, inp, IC, 1.0f, dw, IC);
    if (dbias) { /* column sums in double; each thread owns a column range */
      long lo, hi;
      ct_split(OC, &lo, &hi);
      long w_ = hi - lo;
      if (w_ > 0) {
        double *acc = xcalloc((size_t)w_, sizeof(double));
        for (int n = 0; n < N; n++) {
          const float *d = dout + (long)n * OC + lo;
          for (long c = 0; c < w_; c++) acc[c] += (double)d[c];
        }
        for (long c = 0; c < w_; c++) dbias[lo + c] += (float)acc[c];
        free(acc);
      }
    }
  }
}

/* ---------------------------------------------------------------------------------------- */
/* rotary position embedding                                                                */

/* cos/sin table (T, hd/2) for positions pos0 .. pos0+T-1, computed the way HF's
 * LlamaRotaryEmbedding does in fp32 (inv_freq = 1 / theta^(2i/hd) in float, angle = pos *
 * inv_freq rounded to float) so that long positions round like the PyTorch reference; only
 * cos/sin themselves are taken in double (correctly rounded). Caller frees. */
static float *rope_table(int T, int hd, int pos0, float theta) {
  int half = hd / 2;
  float *tab = xmalloc(sizeof(float) * (size_t)T * hd);
#pragma omp parallel for if ((long)T * half > CT_PAR_MIN / 8)
  for (int t = 0; t < T; t++) {
    float *cs = tab + (long)t * hd, *sn = cs + half;
    for (int i = 0; i < half; i++) {
      float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
      float ang = (float)(pos0 + t) * inv;
      cs[i] = (float)cos((double)ang);
      sn[i] = (float)sin((double)ang);
    }
  }
  return tab;
}

/* dir = +1: forward rotation; dir = -1: the inverse (= transpose), which is rope's backward. */
static void rope_apply(float *qkv, int B, int T, int H, int KV, int hd, int pos0, float theta,
                       float dir) {
  int half = hd / 2, nh = H + KV;
  long W3 = (long)(H + 2 * KV) * hd, N = (long)B * T;
  float *tab = rope_table(T, hd, pos0, theta);
#pragma omp parallel for if (N * nh * hd > CT_PAR_MIN)
  for (long n = 0; n < N; n++) {
    const float *cs = tab + (n % T) * hd, *sn = cs + half;
    for (int h = 0; h < nh; h++) {
      float *x = qkv + n * W3 + (long)h * hd;
      for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half], c = cs[i], s = dir * sn[i];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
  free(tab);
}

static void rope_fwd(void *qkv, int B, int T, int H, int KV, int hd, int pos0, float theta) {
  rope_apply(qkv, B, T, H, KV, hd, pos0, theta, 1.0f);
}
static void rope_bwd(void *dqkv, int B, int T, int H, int KV, int hd, int pos0, float theta) {
  rope_apply(dqkv, B, T, H, KV, hd, pos0, theta, -1.0f);
}

/* ---------------------------------------------------------------------------------------- */
/* causal attention (grouped-query)                                                         */

/* Queries are processed in blocks of ATT_BQ rows: a block [t0, t1) only needs keys [0, t1), so
 * causality skips about half the work while each step is still one sgemm (single-threaded,
 * called from the OpenMP thread that owns the (batch, head)). Heads are read in place from the
 * qkv rows (leading dimension = row width), no copies. */
#define ATT_BQ 64

static size_t attention_state_floats(int B, int T, int H, int KV, int hd) {
  return (size_t)B * H * T * T;
}

/* p[0..n) <- softmax(p[0..n)), p[n..T) <- 0. Max subtraction; the normalizer in double. */
static inline void softmax_row(float *p, int n, int T) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int s = 0; s < n; s++) mx = p[s] > mx ? p[s] : mx;
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int s = 0; s < n; s++) {
    float e = ct_expf(p[s] - mx);
    p[s] = e;
    sum += e;
  }
  float inv = (float)(1.0 / sum);
  for (int s = 0; s < n; s++) p[s] *= inv;
  for (int s = n; s < T; s++) p[s] = 0.0f;
}

/* Per (b, h) and query block: S = scale Q K^T written straight into the state rows, a stable
 * softmax row by row (zero above the diagonal), then out = P V. */
static void attention_fwd(void *out_, float *state, const void *qkv_, int B, int T, int H,
                          int KV, int hd) {
  float *out = out_;
  const float *qkv = qkv_;
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) schedule(static) if ((long)B * H * T * T * hd > CT_PAR_MIN)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      int kv = h / grp;
      const float *Q = qkv + (long)b * T * W3 + (long)h * hd;
      const float *K = qkv + (long)b * T * W3 + HD + (long)kv * hd;
      const float *V = K + (long)KV * hd;
      float *P = state + ((long)b * H + h) * T * T;
      float *O = out + (long)b * T * HD + (long)h * hd;
      for (int t0 = 0; t0 < T; t0 += ATT_BQ) {
        int t1 = t0 + ATT_BQ < T ? t0 + ATT_BQ : T, bt = t1 - t0;
        sgemm(CblasNoTrans, CblasTrans, bt, t1, hd, scale, Q + t0 * W3, W3, K, W3, 0.0f,
              P + (long)t0 * T, T);
        for (int t = t0; t < t1; t++) softmax_row(P + (long)t * T, t + 1, T);
        sgemm(CblasNoTrans, CblasNoTrans, bt, hd, t1, 1.0f, P + (long)t0 * T, T, V, W3, 0.0f,
              O + t0 * HD, HD);
      }
    }
  }
}

/* Backward, with P the saved probabilities and dO the output gradient, per query block:
 *   dP = dO V^T;  dS = P (dP - rowsum(P dP)) scale;  dQ += dS K;  dK += dS^T Q;  dV += P^T dO.
 * Query heads of one group share dK/dV, so a task is (b, kv head, slice of the group's query
 * heads). With one slice per group (enough tasks for the team) the task owns its dK/dV rows
 * in dqkv and accumulates there directly; otherwise each slice sums into `park` and a second
 * pass adds the slices in order — no atomics, deterministic for a given thread count. */
static void attention_bwd(void *dqkv_, const void *dout_, const void *qkv_, const float *state,
                          int B, int T, int H, int KV, int hd) {
  float *dqkv = dqkv_;
  const float *dout = dout_, *qkv = qkv_;
  const long W3 = (long)(H + 2 * KV) * hd, HD = (long)H * hd, THD = (long)T * hd;
  const int grp = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
  int par = (long)B * H * T * T * hd > CT_PAR_MIN;
  int nthr = par ? omp_get_max_threads() : 1;
  int ns = 1; /* slices per group */
  if ((long)B * KV < nthr) {
    ns = (int)((nthr + (long)B * KV - 1) / ((long)B * KV));
    if (ns > grp) ns = grp;
  }
  float *park = NULL;
  if (ns > 1) {
    park = calloc((size_t)B * KV * ns * 2 * THD, sizeof(float));
    if (!park) ns = 1; /* fall back to fewer, larger tasks */
  }
#pragma omp parallel if (par)
  {
    int bq = T < ATT_BQ ? T : ATT_BQ;
    float *dS = xmalloc(sizeof(float) * (size_t)bq * T);
#pragma omp for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int kv = 0; kv < KV; kv++) {
        for (int sl = 0; sl < ns; sl++) {
          const float *K = qkv + (long)b * T * W3 + HD + (long)kv * hd;
          const float *V = K + (long)KV * hd;
          float *dK, *dV;
          long ldk;
          if (ns == 1) {
            dK = dqkv + (long)b * T * W3 + HD + (long)kv * hd;
            dV = dK + (long)KV * hd;
            ldk = W3;
          } else {
            dK = park + (((long)b * KV + kv) * ns + sl) * 2 * THD;
            dV = dK + THD;
            ldk = hd;
          }
          int h0 = kv * grp + grp * sl / ns, h1 = kv * grp + grp * (sl + 1) / ns;
          for (int h = h0; h < h1; h++) {
            const float *P = state + ((long)b * H + h) * T * T;
            const float *Q = qkv + (long)b * T * W3 + (long)h * hd;
            const float *dO = dout + (long)b * T * HD + (long)h * hd;
            float *dQ = dqkv + (long)b * T * W3 + (long)h * hd;
            for (int t0 = 0; t0 < T; t0 += ATT_BQ) {
              int t1 = t0 + ATT_BQ < T ? t0 + ATT_BQ : T, bt = t1 - t0;
              sgemm(CblasNoTrans, CblasTrans, bt, t1, hd, 1.0f, dO + t0 * HD, HD, V, W3, 0.0f, dS,
                    T);
              for (int t = t0; t < t1; t++) {
                const float *p = P + (long)t * T;
                float *ds = dS + (long)(t - t0) * T;
                double sd = 0;
#pragma omp simd reduction(+ : sd)
                for (int s = 0; s <= t; s++) sd += (double)(p[s] * ds[s]);
                float sdf = (float)sd;
                for (int s = 0; s <= t; s++) ds[s] = p[s] * (ds[s] - sdf) * scale;
                for (int s = t + 1; s < t1; s++) ds[s] = 0.0f;
              }
              sgemm(CblasNoTrans, CblasNoTrans, bt, hd, t1, 1.0f, dS, T, K, W3, 1.0f, dQ + t0 * W3,
                    W3);
              sgemm(CblasTrans, CblasNoTrans, t1, hd, bt, 1.0f, dS, T, Q + t0 * W3, W3, 1.0f, dK,
                    ldk);
              sgemm(CblasTrans, CblasNoTrans, t1, hd, bt, 1.0f, P + (long)t0 * T, T, dO + t0 * HD,
                    HD, 1.0f, dV, ldk);
            }
          }
        }
      }
    }
    free(dS);
  }
  if (ns > 1) {
#pragma omp parallel for collapse(2) if (par)
    for (int b = 0; b < B; b++) {
      for (int kv = 0; kv < KV; kv++) {
        for (int sl = 0; sl < ns; sl++) {
          const float *src = park + (((long)b * KV + kv) * ns + sl) * 2 * THD;
          for (int s = 0; s < T; s++) {
            float *row = dqkv + ((long)b * T + s) * W3 + HD;
            float *dk = row + (long)kv * hd, *dv = row + (long)(KV + kv) * hd;
            const float *sk = src + (long)s * hd, *sv = src + THD + (long)s * hd;
            for (int d = 0; d < hd; d++) {
              dk[d] += sk[d];
              dv[d] += sv[d];
            }
          }
        }
      }
    }
    free(park);
  }
}

/* ---------------------------------------------------------------------------------------- */
/* activations                                                                              */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh(u) = 1 - 2 / (1 + e^{2u}): vectorizes through ct_expf; absolute error ~1e-7, which is
 * what gelu needs (it uses 1 + tanh). */
static inline float ct_tanhf(float u) { return 1.0f - 2.0f / (1.0f + ct_expf(2.0f * u)); }

static void gelu_fwd(void *out_, const void *inp_, size_t n) {
  float *out = out_;
  const float *inp = inp_;
#pragma omp parallel for simd if (n > CT_PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_K * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + ct_tanhf(u));
  }
}

static void gelu_bwd(void *dinp_, const void *dout_, const void *inp_, size_t n) {
  float *dinp = dinp_;
  const float *dout = dout_, *inp = inp_;
#pragma omp parallel for simd if (n > CT_PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float th = ct_tanhf(u);
    float sech2 = 1.0f - th * th;
    float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += g * dout[i];
  }
}

static void swiglu_fwd(void *out_, const void *inp_, int N, int F) {
  float *out = out_;
  const float *inp = inp_;
#pragma omp parallel for if ((long)N * F > CT_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *g = inp + (long)n * 2 * F, *u = g + F;
    float *o = out + (long)n * F;
    for (int i = 0; i < F; i++) o[i] = g[i] / (1.0f + ct_expf(-g[i])) * u[i];
  }
}

static void swiglu_bwd(void *dinp_, const void *dout_, const void *inp_, int N, int F) {
  float *dinp = dinp_;
  const float *dout = dout_, *inp = inp_;
#pragma omp parallel for if ((long)N * F > CT_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *g = inp + (long)n * 2 * F, *u = g + F, *dy = dout + (long)n * F;
    float *dg = dinp + (long)n * 2 * F, *du = dg + F;
    for (int i = 0; i < F; i++) {
      float sig = 1.0f / (1.0f + ct_expf(-g[i]));
      float silu = g[i] * sig;
      dg[i] += dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
      du[i] += dy[i] * silu;
    }
  }
}

static void add_fwd(void *out_, const void *a_, const void *b_, size_t n) {
  float *out = out_;
  const float *a = a_, *b = b_;
#pragma omp parallel for simd if (n > CT_PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static size_t mem_peak(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? (size_t)ru.ru_maxrss * 1024 : 0; /* Linux: KiB */
}

/* ---------------------------------------------------------------------------------------- */
/* vocab-parallel cross-entropy pieces (see ops.h)                                          */

static void xent_stats(float *stats, const void *logits_, const int32_t *tgt, int N, int V, int Vp) {
  const float *logits = logits_;
#pragma omp parallel for if ((long)N * V > CT_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *x = logits + (long)n * Vp;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += ct_expf(x[i] - mx);
    stats[n] = mx;
    stats[N + n] = (float)sum;
    stats[2 * (long)N + n] = tgt[n] >= 0 ? x[tgt[n]] : 0.0f;
  }
}

static void xent_grad(void *logits_, const float *lse, const int32_t *tgt, int N, int V, int Vp,
                      float grad_scale) {
  float *logits = logits_;
#pragma omp parallel for if ((long)N * V > CT_PAR_MIN)
  for (int n = 0; n < N; n++) {
    float *x = logits + (long)n * Vp;
    if (isinf(lse[n]) && lse[n] > 0) {
      memset(x, 0, sizeof(float) * (size_t)Vp);
      continue;
    }
    for (int i = 0; i < V; i++) x[i] = grad_scale * expf(x[i] - lse[n]);
    if (tgt[n] >= 0) x[tgt[n]] -= grad_scale;
    for (int i = V; i < Vp; i++) x[i] = 0.0f;
  }
}

/* ---------------------------------------------------------------------------------------- */
/* fused softmax + cross-entropy                                                            */

static void xent_fwd_bwd(float *losses, void *logits_, const int32_t *targets, int N, int V,
                         int Vp, float grad_scale) {
  float *logits = logits_;
#pragma omp parallel for if ((long)N * V > CT_PAR_MIN)
  for (int n = 0; n < N; n++) {
    float *x = logits + (long)n * Vp;
    int tgt = targets[n];
    if (tgt < 0) {
      losses[n] = 0.0f;
      if (grad_scale != 0.0f) memset(x, 0, sizeof(float) * (size_t)Vp);
      continue;
    }
    float mx = -INFINITY, chk = 0.0f;
#pragma omp simd reduction(max : mx) reduction(+ : chk)
    for (int i = 0; i < V; i++) {
      mx = x[i] > mx ? x[i] : mx;
      chk += x[i] * 0.0f; /* NaN iff some logit is NaN or infinite (the max hides NaN, and
                           * ct_expf clamps it): the loss must then be NaN, not a number */
    }
    float xt = x[tgt];
    if (chk != 0.0f) {
      losses[n] = NAN;
      if (grad_scale != 0.0f)
        for (int i = 0; i < Vp; i++) x[i] = i < V ? NAN : 0.0f;
      continue;
    }
    double sum = 0;
    if (grad_scale != 0.0f) { /* keep e = exp(x - max) in place for the gradient pass */
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) {
        float e = ct_expf(x[i] - mx);
        x[i] = e;
        sum += e;
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) sum += ct_expf(x[i] - mx);
    }
    losses[n] = (float)(log(sum) - ((double)xt - mx));
    if (grad_scale != 0.0f) {
      float k = (float)(grad_scale / sum);
      for (int i = 0; i < V; i++) x[i] *= k;
      x[tgt] -= grad_scale;
      for (int i = V; i < Vp; i++) x[i] = 0.0f;
    }
  }
}

/* ---------------------------------------------------------------------------------------- */
/* optimizer and reductions                                                                 */

/* In the order torch.optim.AdamW's single-tensor path computes it: p *= 1 - lr wd; update m and
 * v; p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), with the bias corrections in double.
 * sqrtf keeps this loop scalar under gcc's default -fmath-errno; it is memory-bound anyway
 * (28 bytes per parameter) and runs once per step. */
static void adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                  float b1, float b2, float eps, float wd, float grad_scale, int step) {
  double bc1 = 1.0 - pow((double)b1, step), bc2 = 1.0 - pow((double)b2, step);
  const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  const float decay = 1.0f - lr * wd, a1 = 1.0f - b1, a2 = 1.0f - b2;
#pragma omp parallel for if (n > CT_PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) {
    float g = grad[i] * grad_scale;
    float mi = b1 * m[i] + a1 * g;
    float vi = b2 * v[i] + a2 * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = param[i] * decay;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    param[i] = p - step_size * mi / denom;
  }
}

/* Per-thread partial sums combined in thread order, so the result is deterministic. */
static double sumsq(const float *x, size_t n) {
  int maxt = n > CT_PAR_MIN ? omp_get_max_threads() : 1;
  double *part = xcalloc((size_t)maxt, sizeof(double)), total = 0;
#pragma omp parallel if (maxt > 1) num_threads(maxt)
  {
    long lo, hi;
    ct_split((long)n, &lo, &hi);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = lo; i < hi; i++) s += (double)x[i] * x[i];
    part[omp_get_thread_num()] = s;
  }
  for (int i = 0; i < maxt; i++) total += part[i];
  free(part);
  return total;
}

static void scale(float *x, float s, size_t n) {
#pragma omp parallel for simd if (n > CT_PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ---------------------------------------------------------------------------------------- */
/* table                                                                                    */

/* kernels/cpu/decode.c: the batched-inference ops */
void ct_cpu_embed_pos_fwd(void *out, const int32_t *tok, const int32_t *pos, const void *wte,
                          const void *wpe, int N, int C);
void ct_cpu_rope_pos_fwd(void *qkv, const int32_t *pos, int N, int H, int KV, int hd, float theta);
void ct_cpu_kv_append(void *kc, void *vc, const void *qkv, const int32_t *slot, const int32_t *pos,
                      int N, int H, int KV, int hd, int max_T);
void ct_cpu_attention_decode(void *out, const void *qkv, const void *kc, const void *vc,
                             const int32_t *slot, const int32_t *pos, int N, int H, int KV, int hd,
                             int max_T);
void ct_cpu_argmax_rows(int32_t *out, const void *logits, int N, int V, int Vp);
void ct_cpu_norm_matmul_fwd(void *out, void *ln, const void *inp, const void *nw, const void *w,
                            const void *bias, int N, int IC, int OC, float eps);
void ct_cpu_norm_matmul_swiglu_fwd(void *act, void *pre, void *ln, const void *inp,
                                   const void *nw, const void *w, int N, int IC, int F, float eps);
void ct_cpu_matmul_rows_fwd(void *out, const void *inp, const void *w, const void *bias, int N,
                            int IC, int OC);
void ct_cpu_matmul_add_fwd(void *out, const void *inp, const void *w, const void *bias,
                           const void *res, int N, int IC, int OC);
void ct_cpu_qkv_rope_append(void *qkv, const void *raw, const void *qnw, const void *knw,
                            void *kc, void *vc, const int32_t *slot, const int32_t *pos, int N,
                            int H, int KV, int hd, int max_T, float theta, float eps);
void ct_cpu_attention_cached(void *out, const void *qkv, const void *kc, const void *vc, int n,
                             int pos0, int H, int KV, int hd, int max_T); /* attention_cached.c */

static void cpu_cast_params(void *dst, const float *src, size_t n) {
  memcpy(dst, src, n * sizeof(float));
}

static void cpu_f32_to_bf16(void *dst, const float *src, size_t n) {
  uint16_t *d = dst;
#pragma omp parallel for if (n > CT_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) d[i] = 0x7fffu; /* NaN: the canonical one, as CUDA's */
    else d[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

static void cpu_bf16_to_f32(float *dst, const void *src, size_t n) {
  const uint16_t *s = src;
#pragma omp parallel for if (n > CT_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)s[i] << 16;
    memcpy(&dst[i], &u, sizeof u);
  }
}

static void cpu_to_host_f32(float *dst, const void *src, size_t n) {
  memcpy(dst, src, n * sizeof(float));
}

/* Multi-tensor AdamW on the CPU: the segments one by one (the table's memory is host memory). */
static void adamw_multi(float *param, const float *grad, float *m, float *v, size_t mv_base,
                        const ct_adamw_seg *segs, int nseg, float lr, float b1, float b2, float eps,
                        float grad_scale, int step) {
  for (int s = 0; s < nseg; s++) {
    const size_t o = segs[s].off;
    adamw(param + o, grad + o, m + (o - mv_base), v + (o - mv_base), segs[s].n, lr, b1, b2, eps,
          segs[s].wd, grad_scale, step);
  }
}

/* Residual add + norm, composed (the reference for the fused CUDA kernel). */
static void add_norm_fwd(void *res, void *out, float *mean, float *rstd, const void *a,
                         const void *b, const void *w, const void *bias, int N, int C, float eps,
                         int rms) {
  add_fwd(res, a, b, (size_t)N * C);
  if (rms) rmsnorm_fwd(out, rstd, res, w, N, C, N, 0, eps);
  else layernorm_fwd(out, mean, rstd, res, w, bias, N, C, eps);
}

/* The fused MLP ops, composed from the plain ones (the reference the CUDA epilogues match). */
static void matmul_gelu_fwd(void *act, void *pre, const void *inp, const void *w, const void *bias,
                            int N, int IC, int OC) {
  matmul_fwd(pre, inp, w, bias, N, IC, OC);
  gelu_fwd(act, pre, (size_t)N * OC);
}

static void matmul_dgelu_bwd(void *dpre, const void *dout, const void *w, const void *pre, int N,
                             int IC, int OC) {
  const size_t n = (size_t)N * IC;
  float *dact = calloc(n, sizeof(float));
  if (!dact) { /* the CPU table has no error channel: poison the result so it cannot pass */
    for (size_t i = 0; i < n; i++) ((float *)dpre)[i] = NAN;
    return;
  }
  matmul_bwd(dact, NULL, NULL, dout, NULL, w, N, IC, OC);
  memset(dpre, 0, n * sizeof(float));
  gelu_bwd(dpre, dact, pre, n);
  free(dact);
}

static const ct_ops cpu_ops = {
    .name = "cpu",
    .dtype = "fp32",
    .act_bytes = 4,
    .cast_params = cpu_cast_params,
    .f32_to_bf16 = cpu_f32_to_bf16,
    .bf16_to_f32 = cpu_bf16_to_f32,
    .to_host_f32 = cpu_to_host_f32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy2d = cpu_copy2d,
    .embed_fwd = embed_fwd,
    .embed_bwd = embed_bwd,
    .flagged_rows = flagged_rows,
    .take_rows = take_rows,
    .scatter_add_rows = scatter_add_rows,
    .layernorm_fwd = layernorm_fwd,
    .layernorm_bwd = layernorm_bwd,
    .rmsnorm_fwd = rmsnorm_fwd,
    .rmsnorm_bwd = rmsnorm_bwd,
    .add_norm_fwd = add_norm_fwd,
    .matmul_fwd = matmul_fwd,
    .matmul_bwd = matmul_bwd,
    .rope_fwd = rope_fwd,
    .rope_bwd = rope_bwd,
    .attention_state_floats = attention_state_floats,
    .attention_fwd = attention_fwd,
    .attention_bwd = attention_bwd,
    .gelu_fwd = gelu_fwd,
    .gelu_bwd = gelu_bwd,
    .matmul_gelu_fwd = matmul_gelu_fwd,
    .matmul_dgelu_bwd = matmul_dgelu_bwd,
    .swiglu_fwd = swiglu_fwd,
    .swiglu_bwd = swiglu_bwd,
    .add_fwd = add_fwd,
    .xent_fwd_bwd = xent_fwd_bwd,
    .attention_cached = ct_cpu_attention_cached,
    .adamw = adamw,
    .adamw_multi = adamw_multi,
    .sumsq = sumsq,
    .scale = scale,
    .xent_stats = xent_stats,
    .xent_grad = xent_grad,
    .mem_peak = mem_peak,
    .embed_pos_fwd = ct_cpu_embed_pos_fwd,
    .rope_pos_fwd = ct_cpu_rope_pos_fwd,
    .kv_append = ct_cpu_kv_append,
    .attention_decode = ct_cpu_attention_decode,
    .argmax_rows = ct_cpu_argmax_rows,
    .matmul_rows_fwd = ct_cpu_matmul_rows_fwd,
    .norm_matmul_fwd = ct_cpu_norm_matmul_fwd,
    .norm_matmul_swiglu_fwd = ct_cpu_norm_matmul_swiglu_fwd,
    .matmul_add_fwd = ct_cpu_matmul_add_fwd,
    .qkv_rope_append = ct_cpu_qkv_rope_append,
};

/* Every sgemm here is issued by an OpenMP thread on its own slice (see matmul), so OpenMP is
 * the backend's one thread pool and `threads` its size; OpenBLAS must not thread on its own.
 * Which OpenBLAS is loaded is a run-time fact (Debian switches libopenblas.so.0 by
 * alternatives). The pthread build (openblas_get_parallel() == 1) would, with a pool that spins
 * against ours, so it is set to one thread here. The OpenMP build (== 2) follows the caller's
 * OpenMP thread count instead (openblas_set_num_threads would also set OUR count: it calls
 * omp_set_num_threads), which sgemm above sets to one around each call. */
static void blas_keep_single_threaded(void) {
  if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
}

const ct_ops *ct_ops_cpu(void) {
  blas_keep_single_threaded();
  return &cpu_ops;
}

void ct_ops_cpu_set_threads(int threads) {
  blas_keep_single_threaded();
  if (threads > 0) omp_set_num_threads(threads);
}
