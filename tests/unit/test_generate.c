/* Generation with a KV cache: cached logits equal a full forward's at every position (gpt2 and
 * llama with qk_norm + GQA), a batch of prompts of different lengths gives exactly what each
 * prompt gives alone, sampling is deterministic per seed, and top_k = 1 / tiny top_p are greedy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ct_test.h"
#include "trainer/config.h"
#include "trainer/generate.h"
#include "trainer/model.h"
#include "tiny_model.h"

/* Greedy continuation by rerunning the full forward each step (no cache). */
static void greedy_uncached(ct_model *m, const int32_t *prompt, int n, int steps, int32_t *out) {
  int32_t ctx[64];
  memcpy(ctx, prompt, sizeof(int32_t) * (size_t)n);
  const int Vp = ct_model_padded_vocab(ct_model_config(m)), V = ct_model_config(m)->vocab_size;
  for (int k = 0; k < steps; k++) {
    ct_model_forward(m, ctx, NULL, 1, n + k, 0.0f, NULL);
    const float *row = ct_model_logits(m) + (size_t)(n + k - 1) * Vp;
    int best = 0;
    for (int i = 1; i < V; i++)
      if (row[i] > row[best]) best = i;
    out[k] = ctx[n + k] = best;
  }
}

static void test_arch(const char *arch) {
  ct_model *m = tiny_model(arch, 2, 40, 7);
  const int Vp = ct_model_padded_vocab(ct_model_config(m));
  int32_t seq[30];
  for (int i = 0; i < 30; i++) seq[i] = (i * 7 + 3) % 50;

  /* cached logits at every position == the full forward's (prefill 10, then 1 at a time) */
  ct_model_forward(m, seq, NULL, 1, 30, 0.0f, NULL);
  float *full = malloc(sizeof(float) * 30 * (size_t)Vp), *row = malloc(sizeof(float) * (size_t)Vp);
  memcpy(full, ct_model_logits(m), sizeof(float) * 30 * (size_t)Vp);
  ct_kv_cache *c = NULL;
  CHECK(ct_kv_cache_create(m, 1, 40, &c) == CT_OK);
  CHECK(ct_model_forward_cached(m, c, 0, seq, 10, row) == CT_OK);
  char what[64];
  snprintf(what, sizeof what, "%s prefill logits", arch);
  ct_check_close(what, row, full + 9 * (size_t)Vp, (size_t)Vp, 1e-5, 1e-6);
  double worst = 0;
  for (int t = 10; t < 30; t++) {
    CHECK(ct_model_forward_cached(m, c, 0, seq + t, 1, row) == CT_OK);
    snprintf(what, sizeof what, "%s cached logits at %d", arch, t);
    double e = ct_check_close(what, row, full + (size_t)t * Vp, (size_t)Vp, 1e-5, 1e-6);
    if (e > worst) worst = e;
  }
  printf("%s: worst normalized error cached vs full forward %.2e\n", arch, worst);
  CHECK(ct_kv_cache_len(c, 0) == 30);
  /* the cache refuses to overflow */
  int32_t many[20] = {0};
  CHECK(ct_model_forward_cached(m, c, 0, many, 20, row) == CT_ERR_RUNTIME);
  ct_kv_cache_destroy(c);

  /* greedy generate == greedy by full forwards */
  ct_sample_cfg s = CT_SAMPLE_INIT;
  s.temperature = 0;
  s.max_new_tokens = 15;
  int32_t got[15], want[15];
  int n = 0;
  CHECK(ct_generate(m, seq, 5, &s, got, &n, NULL, NULL) == CT_OK);
  greedy_uncached(m, seq, 5, 15, want);
  CHECK(n == 15 && !memcmp(got, want, sizeof got));

  /* a batch of different lengths == each alone (sampling, so streams matter too) */
  s.temperature = 1.0f;
  s.top_k = 10;
  s.seed = 99;
  const int32_t *prompts[3] = {seq, seq + 3, seq + 8};
  int lens[3] = {4, 9, 1};
  int32_t o0[15], o1[15], o2[15], *outs[3] = {o0, o1, o2};
  int nouts[3];
  CHECK(ct_generate_batch(m, 3, prompts, lens, &s, outs, nouts, NULL, NULL) == CT_OK);
  for (int i = 0; i < 3; i++) {
    int32_t alone[15];
    int na = 0;
    ct_sample_cfg si = s;
    si.seed = s.seed + (uint64_t)i; /* sequence i of a batch samples from stream seed + i */
    CHECK(ct_generate(m, prompts[i], lens[i], &si, alone, &na, NULL, NULL) == CT_OK);
    CHECK_MSG(na == nouts[i] && !memcmp(alone, outs[i], sizeof(int32_t) * (size_t)na),
              "%s: batch member %d differs from its solo run", arch, i);
  }
  /* determinism: the same seed gives the same tokens, another seed (almost surely) not */
  int32_t again[15], other[15];
  int na = 0, no = 0;
  CHECK(ct_generate(m, seq, 4, &s, again, &na, NULL, NULL) == CT_OK);
  CHECK(na == nouts[0] && !memcmp(again, o0, sizeof(int32_t) * (size_t)na));
  s.seed = 12345;
  CHECK(ct_generate(m, seq, 4, &s, other, &no, NULL, NULL) == CT_OK);
  CHECK(memcmp(other, o0, sizeof other) != 0);
  /* top_k = 1 and a tiny top_p are greedy */
  s.top_k = 1;
  CHECK(ct_generate(m, seq, 5, &s, got, &n, NULL, NULL) == CT_OK);
  CHECK(!memcmp(got, want, sizeof got));
  s.top_k = 0;
  s.top_p = 1e-6f;
  CHECK(ct_generate(m, seq, 5, &s, got, &n, NULL, NULL) == CT_OK);
  CHECK(!memcmp(got, want, sizeof got));
  /* stop id: generation ends right after it */
  s = (ct_sample_cfg)CT_SAMPLE_INIT;
  s.temperature = 0;
  s.max_new_tokens = 15;
  s.stop_id = want[3];
  CHECK(ct_generate(m, seq, 5, &s, got, &n, NULL, NULL) == CT_OK);
  int first = 0;
  while (want[first] != want[3]) first++;
  CHECK(n == first + 1 && got[n - 1] == want[3]);
  free(full);
  free(row);
  ct_model_destroy(m);
}

static double frand(uint64_t *st) {
  *st = *st * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*st >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* The batched-decode ops' CPU references against the single-sequence ops, bit for bit: rows of
 * different sequences (slots in a shuffled order) at different positions. */
static void test_decode_ops(void) {
  const ct_ops *o = ct_ops_cpu();
  enum { N = 3, H = 4, KV = 2, hd = 8, maxT = 12, S = 4, W = (H + 2 * KV) * hd, C = 16 };
  uint64_t rs = 42;
  const int32_t pos[N] = {5, 0, 11}, slot[N] = {2, 0, 3};
  float qkv[N * W], ref[N * W], kc[S * KV * maxT * hd], vc[S * KV * maxT * hd];
  for (int i = 0; i < N * W; i++) qkv[i] = (float)frand(&rs);
  for (int i = 0; i < S * KV * maxT * hd; i++) kc[i] = (float)frand(&rs), vc[i] = (float)frand(&rs);
  memcpy(ref, qkv, sizeof qkv);
  o->rope_pos_fwd(qkv, pos, N, H, KV, hd, 10000.0f);
  for (int n = 0; n < N; n++) o->rope_fwd(ref + n * W, 1, 1, H, KV, hd, pos[n], 10000.0f);
  CHECK_MSG(!memcmp(qkv, ref, sizeof qkv), "rope_pos_fwd differs from rope_fwd at the same position");
  o->kv_append(kc, vc, qkv, slot, pos, N, H, KV, hd, maxT);
  for (int n = 0; n < N; n++)
    for (int h = 0; h < KV; h++) {
      const size_t at = (((size_t)slot[n] * KV + h) * maxT + pos[n]) * hd;
      CHECK(!memcmp(kc + at, qkv + n * W + (H + h) * hd, sizeof(float) * hd));
      CHECK(!memcmp(vc + at, qkv + n * W + (H + KV + h) * hd, sizeof(float) * hd));
    }
  float out[N * H * hd], want[N * H * hd];
  o->attention_decode(out, qkv, kc, vc, slot, pos, N, H, KV, hd, maxT);
  const size_t seq = (size_t)KV * maxT * hd;
  for (int n = 0; n < N; n++)
    o->attention_cached(want + n * H * hd, qkv + n * W, kc + slot[n] * seq, vc + slot[n] * seq, 1,
                        pos[n], H, KV, hd, maxT);
  CHECK_MSG(!memcmp(out, want, sizeof out), "attention_decode differs from attention_cached");
  /* embedding at per-row positions == embed_fwd's row + the position's row */
  float wte[10 * C], wpe[maxT * C], e1[N * C], e2[C];
  for (int i = 0; i < 10 * C; i++) wte[i] = (float)frand(&rs);
  for (int i = 0; i < maxT * C; i++) wpe[i] = (float)frand(&rs);
  const int32_t tok[N] = {7, 1, 9};
  o->embed_pos_fwd(e1, tok, pos, wte, wpe, N, C);
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) e2[c] = wte[tok[n] * C + c] + wpe[pos[n] * C + c];
    CHECK(!memcmp(e1 + n * C, e2, sizeof e2));
  }
  int32_t am[N];
  float lg[N * 12];
  for (int i = 0; i < N * 12; i++) lg[i] = (float)frand(&rs);
  lg[1 * 12 + 4] = lg[1 * 12 + 7] = 5.0f; /* a tie: the lower index wins */
  lg[2 * 12 + 11] = 9.0f;                 /* a padding column is not a candidate (V = 10) */
  o->argmax_rows(am, lg, N, 10, 12);
  CHECK(am[1] == 4);
  CHECK(am[2] != 11);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < 10; i++) CHECK(lg[n * 12 + i] <= lg[n * 12 + am[n]]);
}

static bool stop_at_three(int seq, const int32_t *ids, int n, void *user) {
  (void)seq; (void)ids; (void)user;
  return n == 3;
}

/* The engine: one decode step over three sequences (slots in any order) == each sequence's own
 * cached forward; stop callbacks end a sequence. */
static void test_engine(const char *arch) {
  ct_model *m = tiny_model(arch, 2, 40, 7);
  const int Vp = ct_model_padded_vocab(ct_model_config(m));
  int32_t seq[30];
  for (int i = 0; i < 30; i++) seq[i] = (i * 11 + 5) % 50;
  const int lens[3] = {6, 2, 9};
  const int32_t *pr[3] = {seq, seq + 10, seq + 20};
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = 3;
  ic.max_len = 20;
  ic.max_rows = 16;
  ct_infer *e = NULL;
  CHECK(ct_infer_create(m, ct_ops_cpu(), &ic, &e) == CT_OK);
  ct_kv_cache *c = NULL;
  CHECK(ct_kv_cache_create(m, 3, 20, &c) == CT_OK);
  float *lg = malloc(sizeof(float) * 3 * (size_t)Vp), *row = malloc(sizeof(float) * (size_t)Vp);
  int32_t ids[3];
  for (int i = 0; i < 3; i++) {
    int sl = i;
    CHECK(ct_infer_prefill(e, 1, &sl, pr[i], lens[i], lg, ids) == CT_OK);
    CHECK(ct_model_forward_cached(m, c, i, pr[i], lens[i], row) == CT_OK);
    char what[64];
    snprintf(what, sizeof what, "%s engine prefill %d", arch, i);
    ct_check_close(what, lg, row, (size_t)Vp, 1e-5, 1e-6);
  }
  double worst = 0;
  for (int step = 0; step < 5; step++) {
    const int slots[3] = {step % 3, (step + 2) % 3, (step + 1) % 3};
    int32_t tok[3];
    for (int b = 0; b < 3; b++) tok[b] = (step * 7 + slots[b] * 3) % 50;
    CHECK(ct_infer_decode(e, 3, slots, tok, lg, ids) == CT_OK);
    for (int b = 0; b < 3; b++) {
      CHECK(ct_model_forward_cached(m, c, slots[b], &tok[b], 1, row) == CT_OK);
      char what[64];
      snprintf(what, sizeof what, "%s batched decode step %d row %d", arch, step, b);
      double err = ct_check_close(what, lg + (size_t)b * Vp, row, (size_t)Vp, 1e-5, 1e-6);
      if (err > worst) worst = err;
      int best = 0;
      for (int v = 1; v < 50; v++)
        if (lg[(size_t)b * Vp + v] > lg[(size_t)b * Vp + best]) best = v;
      CHECK(ids[b] == best);
      CHECK(ct_infer_len(e, slots[b]) == ct_kv_cache_len(c, slots[b]));
    }
  }
  printf("%s: batched decode vs per-sequence decode, worst normalized error %.2e\n", arch, worst);
  /* evaluation through the engine (two sequences, head in chunks of 4 rows) == the model's
   * forward loss of each sequence */
  {
    int32_t in[16], tg[16];
    for (int i = 0; i < 16; i++) in[i] = seq[i], tg[i] = seq[i + 1];
    tg[5] = -1; /* ignored */
    float l0 = 0, l1 = 0;
    CHECK(ct_model_forward(m, in, tg, 1, 8, 0.0f, &l0) == CT_OK);
    CHECK(ct_model_forward(m, in + 8, tg + 8, 1, 8, 0.0f, &l1) == CT_OK);
    const double want = (7.0 * l0 + 8.0 * l1) / 15.0;
    ct_infer_cfg lc = ic;
    lc.logit_rows = 4;
    ct_infer *le = NULL;
    CHECK(ct_infer_create(m, ct_ops_cpu(), &lc, &le) == CT_OK);
    double sum = 0;
    long cnt = 0;
    CHECK_MSG(ct_infer_loss(le, 2, in, tg, 8, &sum, &cnt) == CT_OK, "%s", ct_last_error());
    CHECK(cnt == 15);
    CHECK_MSG(fabs(sum / cnt - want) < 1e-5 * fabs(want) + 1e-6, "%s: engine loss %.7f vs forward %.7f",
              arch, sum / cnt, want);
    CHECK(ct_infer_loss(le, 3, in, tg, 8, &sum, &cnt) == CT_ERR_RUNTIME); /* 24 rows > 16 */
    ct_infer_destroy(le);
  }
  /* a full sequence is refused, as are repeated slots */
  const int twice[2] = {1, 1};
  CHECK(ct_infer_decode(e, 2, twice, ids, NULL, ids) == CT_ERR_RUNTIME);
  ct_infer_destroy(e);
  ct_kv_cache_destroy(c);
  /* should_stop ends a sequence after its third token */
  ct_sample_cfg s = CT_SAMPLE_INIT;
  s.temperature = 0;
  s.max_new_tokens = 10;
  s.should_stop = stop_at_three;
  int32_t out[10];
  int n = 0;
  CHECK(ct_generate(m, seq, 5, &s, out, &n, NULL, NULL) == CT_OK);
  CHECK(n == 3);
  free(lg);
  free(row);
  ct_model_destroy(m);
}

int main(void) {
  test_decode_ops();
  test_engine("gpt2");
  test_engine("llama");
  test_arch("gpt2");
  test_arch("llama");
  return ct_test_finish();
}
