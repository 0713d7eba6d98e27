/* tests/unit/test_model_grad.c — whole-model gradients against finite differences.
 *
 * Tiny models (L=2, d=16, 4 heads, V=31 padded to 32, T=5, B=2) of each family:
 *   gpt2                 tied head, learned positions, LayerNorm + biases, GELU
 *   llama qk_norm GQA    4 query heads over 2 kv heads, q/k RMSNorm, untied head, SwiGLU
 *   llama bias MQA tied  qkv bias (Qwen2), 1 kv head, tied head, no qk_norm
 * are initialized with ct_model_init_weights, then norm weights and biases are perturbed so
 * no norm weight is exactly 1 and no bias exactly 0 (else their gradients could hide
 * mistakes). For every parameter tensor, five entries (its largest-gradient entry, two of at
 * least 10 % of that, two anywhere) and one whole-tensor direction are checked: the analytic
 * gradient of the mean loss (grad_scale = 1/(B*T)) against central differences of L computed
 * in double from the logits (the model's own fp32 mean would round every difference).
 *
 * Error budget. The fp32 forward puts ~2e-7 of rounding noise into L, so a difference quotient
 * over a step h carries ~1e-7/h of noise; curvature adds O(h^2). Both are kept small by
 * Richardson extrapolation of steps h and h/2 (cancels h^2, so h can stay large) with h chosen
 * so the loss moves by ~2e-3 over the step, capped at 2e-2. Pass: |a - n| <= 2e-2 * max(|n|,
 * 2e-3). Over 60 seeds of weights and data (x 3 models, ~14k samples) the worst error was 8e-3
 * for entries and 4e-4 for directions: 2.5x and 50x below the limit. The direction's slope must
 * also be large enough that a gradient 5 % off would fail, so the check is known to
 * discriminate. Set CT_GRAD_DEBUG=1 to print every comparison.
 * Also: gradient accumulation over two micro-batches equals one double-size batch,
 * zero_grad zeroes, padded embedding rows get exactly zero gradient, out-of-vocabulary inputs
 * and targets are CT_ERR_INPUT, and a seed determines the loss bit-exactly. CPU only. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "tests/unit/ct_test.h"
#include "trainer/config.h"
#include "trainer/model.h"

enum { B = 2, T = 5, V = 31, VOCAB_PAD = 8, SAMPLES = 5 };
#define H_MAX 2e-2
#define DELTA 2e-3
#define TOL 2e-2
#define FLOOR_ENTRY 2e-3
#define FLOOR_DIR 2e-3

typedef struct gc_case {
  const char *label;
  const char *arch;
  int n_kv_head;
  int d_ff;
  bool qk_norm, tie, attn_bias;
} gc_case;

static const gc_case CASES[] = {
  {"gpt2", "gpt2", 4, 0, false, true, true},
  {"llama qk_norm GQA untied", "llama", 2, 24, true, false, false},
  {"llama attn_bias MQA tied", "llama", 1, 24, false, true, true},
};

static bool is_vocab_tensor(const char *name) {
  return !strcmp(name, "wte") || !strcmp(name, "embed_tokens") || !strcmp(name, "lm_head");
}

/* Rows of a parameter that a (B,T) batch can reach: vocab tensors V, positions T. */
static int live_rows(const ct_param *p) {
  if (p->ndim == 1) return p->shape[0];
  if (is_vocab_tensor(p->name)) return V;
  if (!strcmp(p->name, "wpe")) return T;
  return p->shape[0];
}

static const char *tensor_class(const char *name) {
  const char *p = name;
  if (!strncmp(p, "h.", 2)) p += 2;
  else if (!strncmp(p, "layers.", 7)) p += 7;
  else return name;
  while (*p >= '0' && *p <= '9') p++;
  return *p == '.' ? p + 1 : name;
}

static ct_status make_cfg(const gc_case *gc, ct_model_cfg *out) {
  ct_config c;
  ct_config_defaults(&c);
  snprintf(c.model.arch, sizeof c.model.arch, "%s", gc->arch);
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.n_kv_head = gc->n_kv_head;
  c.model.d_model = 16;
  c.model.d_ff = gc->d_ff;
  c.model.vocab_size = V;
  c.model.vocab_pad = VOCAB_PAD;
  c.model.max_seq_len = 8;
  c.model.qk_norm = gc->qk_norm;
  c.model.tie_embeddings = gc->tie;
  c.model.attn_bias = gc->attn_bias;
  c.model.init_std = 0.25; /* q.k / sqrt(hd) ~ 1 and logits ~ 1: softmaxes far from uniform */
  c.train.seq_len = T;
  c.train.micro_batch = B;
  CT_TRY(ct_config_validate(&c));
  *out = c.model;
  return CT_OK;
}

/* Seeded init, then norm weights 1 + 0.2 n and biases 0.05 n (padding rows stay zero). */
static void init_perturbed(ct_model *m, uint64_t seed, float *host) {
  ct_model_init_weights(m, seed);
  const ct_ops *ops = ct_model_ops(m);
  const size_t numel = ct_model_numel(m);
  ops->to_host(host, ct_model_params(m), numel * sizeof(float));
  ct_rng rng = {ct_mix64(seed ^ 0xabcdefull), 0};
  for (int i = 0; i < ct_model_n_params(m); i++) {
    const ct_param *p = ct_model_param(m, i);
    float *w = host + p->offset;
    if (p->init == CT_INIT_ONE)
      for (size_t j = 0; j < p->numel; j++) w[j] = 1.0f + 0.2f * ct_rng_normal(&rng);
    else if (p->init == CT_INIT_ZERO)
      for (size_t j = 0; j < p->numel; j++) w[j] = 0.05f * ct_rng_normal(&rng);
  }
  ops->to_device(ct_model_params(m), host, numel * sizeof(float));
}

/* Mean token loss of `w` in double, from the logits of a forward without targets. */
static double loss_of(ct_model *m, const float *w, const int32_t *in, const int32_t *tg, int b,
                      float *logits) {
  const ct_ops *ops = ct_model_ops(m);
  const int Vp = ct_model_padded_vocab(ct_model_config(m)), N = b * T;
  ops->to_device(ct_model_params(m), w, ct_model_numel(m) * sizeof(float));
  if (ct_model_forward(m, in, NULL, b, T, 0.0f, NULL) != CT_OK) return NAN;
  ops->to_host(logits, ct_model_logits(m), (size_t)N * Vp * sizeof(float));
  double sum = 0;
  for (int n = 0; n < N; n++) {
    const float *row = logits + (size_t)n * Vp;
    double mx = row[0];
    for (int v = 1; v < V; v++) mx = fmax(mx, row[v]);
    double se = 0;
    for (int v = 0; v < V; v++) se += exp((double)row[v] - mx);
    sum += mx + log(se) - (double)row[tg[n]];
  }
  return sum / N;
}

/* d L / d t at t = 0 for w + t u, u on the n entries of p starting at j0: central differences
 * at steps h and h/2, Richardson-extrapolated ((4 D(h/2) - D(h)) / 3 cancels the h^2 term,
 * so h can stay large enough for the fp32 forward's noise). The step actually taken (w +- h u
 * rounded to fp32) is used: h_eff = sum u (x+ - x-) / 2 / sum u^2. */
static double central(ct_model *m, const float *w, float *wp, const ct_param *p, size_t j0,
                      size_t n, const float *u, double h, const int32_t *in, const int32_t *tg,
                      float *logits) {
  double D[2];
  for (int k = 0; k < 2; k++) {
    const float hk = (float)(k ? h / 2 : h);
    double Lpm[2], num = 0, den = 0;
    for (int sgn = 0; sgn < 2; sgn++) {
      for (size_t j = 0; j < n; j++) {
        const size_t o = p->offset + j0 + j;
        wp[o] = sgn ? w[o] - hk * u[j] : w[o] + hk * u[j];
      }
      Lpm[sgn] = loss_of(m, wp, in, tg, B, logits);
    }
    for (size_t j = 0; j < n; j++) {
      const size_t o = p->offset + j0 + j;
      num += (double)u[j] * (((double)(w[o] + hk * u[j]) - (double)(w[o] - hk * u[j])) / 2);
      den += (double)u[j] * u[j];
      wp[o] = w[o];
    }
    D[k] = (Lpm[0] - Lpm[1]) / (2 * (num / den));
  }
  return (4 * D[1] - D[0]) / 3;
}

/* Step for a slope `ana`: the loss moves by about DELTA over the step (so steep directions do
 * not leave the region where the extrapolation holds), at most H_MAX (so flat ones still move
 * it well above the fp32 noise). */
static double step_for(double ana) { return fmin(H_MAX, DELTA / fmax(fabs(ana), 1e-30)); }

typedef struct worst_entry { char cls[96]; double err; } worst_entry;

static void note(worst_entry *w, int *nw, const char *cls, double err) {
  for (int i = 0; i < *nw; i++)
    if (!strcmp(w[i].cls, cls)) { w[i].err = fmax(w[i].err, err); return; }
  if (*nw == 32) return;
  snprintf(w[*nw].cls, sizeof w[0].cls, "%s", cls);
  w[(*nw)++].err = err;
}

static void random_tokens(ct_rng *rng, int32_t *x, int n) {
  for (int i = 0; i < n; i++) x[i] = (int32_t)(ct_rng_u64(rng) % V);
}

static void run_case(const gc_case *gc) {
  double t0 = ct_now();
  ct_model_cfg mc;
  ct_status st = make_cfg(gc, &mc);
  CHECK_MSG(st == CT_OK, "%s: config: %s", gc->label, ct_last_error());
  if (st != CT_OK) return;
  const ct_ops *ops = ct_ops_cpu();
  ct_model *m = NULL;
  st = ct_model_create(&mc, ops, 2 * B, T, &m); /* 2B: the accumulation check's big batch */
  CHECK_MSG(st == CT_OK, "%s: create: %s", gc->label, ct_last_error());
  if (st != CT_OK) return;
  const int Vp = ct_model_padded_vocab(&mc), N = B * T;
  CHECK(Vp == 32 && Vp > V);
  const size_t numel = ct_model_numel(m);
  float *w = calloc(numel, sizeof(float)), *g = calloc(numel, sizeof(float));
  float *g2 = calloc(numel, sizeof(float)), *wp = calloc(numel, sizeof(float));
  float *dir = calloc(numel, sizeof(float));
  float *logits = malloc((size_t)2 * N * Vp * sizeof(float));
  init_perturbed(m, 42, w);

  ct_rng rng = {ct_mix64(1234), 0};
  int32_t in[2 * B * T], tg[2 * B * T];
  random_tokens(&rng, in, 2 * N);
  random_tokens(&rng, tg, 2 * N);

  /* analytic gradient of the mean loss over the first B sequences */
  float loss = 0;
  ct_model_zero_grad(m);
  st = ct_model_forward(m, in, tg, B, T, 1.0f / (float)N, &loss);
  if (st == CT_OK) st = ct_model_backward(m);
  CHECK_MSG(st == CT_OK, "%s: forward/backward: %s", gc->label, ct_last_error());
  ops->to_host(g, ct_model_grads(m), numel * sizeof(float));
  double L0 = loss_of(m, w, in, tg, B, logits);
  CHECK_MSG(fabs(L0 - loss) <= 1e-6 * fabs(L0), "%s: model mean loss %.9g vs double %.12g",
            gc->label, loss, L0);

  /* evaluation (grad_scale 0) runs every block in block 0's activation slots: the same loss bit
   * for bit, and a training step right after it the same gradient */
  {
    float eval_loss = -1, again = -1;
    st = ct_model_forward(m, in, tg, B, T, 0.0f, &eval_loss);
    CHECK_MSG(st == CT_OK && eval_loss == loss, "%s: eval loss %.9g vs train-mode loss %.9g",
              gc->label, eval_loss, loss);
    CHECK_MSG(ct_model_backward(m) != CT_OK, "%s: backward after an eval forward was accepted",
              gc->label);
    float *g3 = calloc(numel, sizeof(float));
    ct_model_zero_grad(m);
    st = ct_model_forward(m, in, tg, B, T, 1.0f / (float)N, &again);
    if (st == CT_OK) st = ct_model_backward(m);
    ops->to_host(g3, ct_model_grads(m), numel * sizeof(float));
    CHECK_MSG(st == CT_OK && again == loss && memcmp(g3, g, numel * sizeof(float)) == 0,
              "%s: the training step after an eval forward differs", gc->label);
    free(g3);
  }

  /* every tensor must get a gradient (a zero one would make the comparison vacuous), and the
   * padded vocab rows exactly zero */
  for (int i = 0; i < ct_model_n_params(m); i++) {
    const ct_param *p = ct_model_param(m, i);
    double mx = 0;
    size_t live = (size_t)live_rows(p) * (p->ndim == 2 ? p->shape[1] : 1);
    for (size_t j = 0; j < live; j++) mx = fmax(mx, fabs(g[p->offset + j]));
    CHECK_MSG(mx > 0, "%s: %s has an all-zero gradient", gc->label, p->name);
    if (is_vocab_tensor(p->name)) {
      int nonzero = 0;
      for (size_t j = (size_t)V * p->shape[1]; j < p->numel; j++) nonzero += g[p->offset + j] != 0;
      CHECK_MSG(nonzero == 0, "%s: %s: %d nonzero gradients in the padded rows", gc->label,
                p->name, nonzero);
    }
  }

  /* per tensor: SAMPLES entries and one random direction */
  worst_entry worst[32];
  int nworst = 0;
  double worst_entry_err = 0, worst_dir_err = 0, min_dir_discrim = INFINITY;
  memcpy(wp, w, numel * sizeof(float));
  const bool debug = getenv("CT_GRAD_DEBUG") != NULL;
  for (int i = 0; i < ct_model_n_params(m); i++) {
    const ct_param *p = ct_model_param(m, i);
    const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
    const size_t live = (size_t)live_rows(p) * cols;
    const bool lookup = !strcmp(p->name, "wte") || !strcmp(p->name, "embed_tokens");
    const float *gp = g + p->offset;
    size_t jmax = 0;
    for (size_t j = 1; j < live; j++) if (fabsf(gp[j]) > fabsf(gp[jmax])) jmax = j;
    for (int s = 0; s < SAMPLES; s++) {
      /* the largest entry, two of the large ones (>= 10 % of it: a clear signal), and two
       * anywhere (embedding lookups: rows of input tokens; small ones meet the floor) */
      size_t j = jmax;
      if (s == 1 || s == 2) {
        for (int tries = 0; tries < 10000; tries++) {
          size_t c = ct_rng_u64(&rng) % live;
          if (fabsf(gp[c]) >= 0.1f * fabsf(gp[jmax])) { j = c; break; }
        }
      } else if (s > 2) {
        j = lookup ? (size_t)in[ct_rng_u64(&rng) % N] * cols + ct_rng_u64(&rng) % cols
                   : ct_rng_u64(&rng) % live;
      }
      const float one = 1.0f;
      double ana = gp[j], num = central(m, w, wp, p, j, 1, &one, step_for(ana), in, tg, logits);
      double err = fabs(ana - num) / fmax(fabs(num), FLOOR_ENTRY);
      if (debug) printf("  %-36s [%5zu] ana %+.6e num %+.6e err %.2e\n", p->name, j, ana, num, err);
      CHECK_MSG(err <= TOL, "%s: %s[%zu]: analytic %.6e vs central difference %.6e (error %.2e"
                " > %.0e)", gc->label, p->name, j, ana, num, err, TOL);
      note(worst, &nworst, tensor_class(p->name), err);
      worst_entry_err = fmax(worst_entry_err, err);
    }

    /* a direction over all live entries, u_j = sign(g_j) (0.5 + uniform): a random one can be
     * nearly orthogonal to g and leave nothing but difference noise to compare */
    double ana = 0;
    for (size_t j = 0; j < live; j++) {
      dir[j] = (gp[j] > 0 ? 1.0f : gp[j] < 0 ? -1.0f : 0.0f) * (0.5f + ct_rng_uniform(&rng));
      ana += (double)gp[j] * dir[j];
    }
    double num = central(m, w, wp, p, 0, live, dir, step_for(ana), in, tg, logits);
    double tol = TOL * fmax(fabs(num), FLOOR_DIR);
    double err = fabs(ana - num) / fmax(fabs(num), FLOOR_DIR);
    if (debug) printf("  %-36s dir     ana %+.6e num %+.6e err %.2e\n", p->name, ana, num, err);
    CHECK_MSG(err <= TOL, "%s: %s along a random direction: analytic %.6e vs central difference"
              " %.6e (error %.2e > %.0e)", gc->label, p->name, ana, num, err, TOL);
    /* the tolerance must be tight enough to reject a gradient 5 % off */
    double discrim = fabs(1.05 * ana - num) / tol;
    CHECK_MSG(discrim > 1, "%s: %s: directional derivative %.3e too small for the check to"
              " tell a 5%% error (tolerance %.2e)", gc->label, p->name, num, tol);
    min_dir_discrim = fmin(min_dir_discrim, discrim);
    note(worst, &nworst, tensor_class(p->name), err);
    worst_dir_err = fmax(worst_dir_err, err);
  }

  /* gradient accumulation: two micro-batches at 1/(2BT) == one batch of 2B at 1/(2BT) */
  ops->to_device(ct_model_params(m), w, numel * sizeof(float));
  const float half = 1.0f / (float)(2 * N);
  float l1 = 0, l2 = 0, l12 = 0;
  ct_model_zero_grad(m);
  st = ct_model_forward(m, in, tg, B, T, half, &l1);
  if (st == CT_OK) st = ct_model_backward(m);
  if (st == CT_OK) st = ct_model_forward(m, in + N, tg + N, B, T, half, &l2);
  if (st == CT_OK) st = ct_model_backward(m);
  CHECK_MSG(st == CT_OK, "%s: accumulation: %s", gc->label, ct_last_error());
  ops->to_host(g, ct_model_grads(m), numel * sizeof(float));
  ct_model_zero_grad(m);
  st = ct_model_forward(m, in, tg, 2 * B, T, half, &l12);
  if (st == CT_OK) st = ct_model_backward(m);
  CHECK_MSG(st == CT_OK, "%s: double batch: %s", gc->label, ct_last_error());
  ops->to_host(g2, ct_model_grads(m), numel * sizeof(float));
  char what[128];
  snprintf(what, sizeof what, "%s: accumulated vs double-batch gradient", gc->label);
  double e_accum = ct_check_close(what, g, g2, numel, 1e-5, 0.0);
  CHECK_MSG(fabs(0.5 * (l1 + l2) - l12) <= 1e-6 * fabs(l12), "%s: micro-batch losses %.9g, %.9g"
            " do not average to the double batch's %.9g", gc->label, l1, l2, l12);
  CHECK_MSG(l1 != l2, "%s: the two micro-batches have the same loss (same data?)", gc->label);

  /* zero_grad */
  ct_model_zero_grad(m);
  ops->to_host(g, ct_model_grads(m), numel * sizeof(float));
  size_t nonzero = 0;
  for (size_t j = 0; j < numel; j++) nonzero += g[j] != 0.0f;
  CHECK_MSG(nonzero == 0, "%s: %zu gradients nonzero after zero_grad", gc->label, nonzero);

  /* out-of-vocabulary tokens */
  int32_t bad[2 * B * T];
  memcpy(bad, in, sizeof bad);
  bad[3] = V;
  CHECK(ct_model_forward(m, bad, tg, B, T, half, NULL) == CT_ERR_INPUT);
  CHECK(ct_model_forward(m, bad, NULL, B, T, 0.0f, NULL) == CT_ERR_INPUT);
  bad[3] = -1;
  CHECK(ct_model_forward(m, bad, tg, B, T, half, NULL) == CT_ERR_INPUT);
  bad[3] = Vp - 1; /* a padding row is not a token either */
  CHECK(ct_model_forward(m, bad, tg, B, T, half, NULL) == CT_ERR_INPUT);
  memcpy(bad, tg, sizeof bad);
  bad[7] = V;
  CHECK(ct_model_forward(m, in, bad, B, T, half, NULL) == CT_ERR_INPUT);
  CHECK(ct_model_forward(m, in, tg, B, T, half, NULL) == CT_OK); /* and the model still works */

  /* determinism: a seed fixes the weights and the loss bit-exactly; another seed differs */
  ct_model *m2 = NULL;
  st = ct_model_create(&mc, ops, 2 * B, T, &m2);
  CHECK_MSG(st == CT_OK, "%s: create: %s", gc->label, ct_last_error());
  if (st == CT_OK) {
    float la = 0, lb = 0, lc = 0;
    ct_model_init_weights(m, 7);
    ct_model_init_weights(m2, 7);
    ops->to_host(g, ct_model_params(m), numel * sizeof(float));
    ops->to_host(g2, ct_model_params(m2), numel * sizeof(float));
    CHECK_MSG(!memcmp(g, g2, numel * sizeof(float)), "%s: same seed, different weights", gc->label);
    int pad_nonzero = 0;
    for (int i = 0; i < ct_model_n_params(m); i++) {
      const ct_param *p = ct_model_param(m, i);
      if (is_vocab_tensor(p->name))
        for (size_t j = (size_t)V * p->shape[1]; j < p->numel; j++) pad_nonzero += g[p->offset + j] != 0;
    }
    CHECK_MSG(pad_nonzero == 0, "%s: %d padded vocab weights nonzero after init", gc->label,
              pad_nonzero);
    ct_model_forward(m, in, tg, B, T, 0.0f, &la);
    ct_model_forward(m2, in, tg, B, T, 0.0f, &lb);
    CHECK_MSG(!memcmp(&la, &lb, sizeof la), "%s: same seed, losses %.9g vs %.9g", gc->label, la, lb);
    ct_model_init_weights(m2, 8);
    ct_model_forward(m2, in, tg, B, T, 0.0f, &lc);
    CHECK_MSG(lc != la, "%s: seeds 7 and 8 give the same loss %.9g", gc->label, la);
    ct_model_destroy(m2);
  }

  printf("%-26s numel %6zu: worst error entries %.2e, directions %.2e (limit %.0e; a 5%% wrong"
         " gradient would exceed the directional tolerance by >= %.1fx); accumulation %.2e;"
         " %.2f s\n", gc->label, numel, worst_entry_err, worst_dir_err, TOL, min_dir_discrim,
         e_accum, ct_now() - t0);
  for (int i = 0; i < nworst; i++) printf("    %-34s %.2e\n", worst[i].cls, worst[i].err);
  free(w);
  free(g);
  free(g2);
  free(wp);
  free(dir);
  free(logits);
  ct_model_destroy(m);
}

int main(void) {
  double t0 = ct_now();
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i]);
  printf("total %.2f s\n", ct_now() - t0);
  return ct_test_finish();
}
