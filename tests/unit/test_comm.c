/* tests/unit/test_comm.c — the Gloo process group (parallel/comm.h) and bucketed gradient
 * averaging (parallel/ddp.h, with its sparse embedding gradient) across real processes.
 *
 * The test forks its own ranks: the parent starts a token-checked store server on a free
 * loopback port, forks N children (N = 3, then 2), and each child connects, builds a Gloo
 * group and checks every collective against values it computes itself. A child that fails a
 * check exits 1; the parent reports each failed or hung rank and fails. Two short scenarios
 * check that a rank that never joins, or never enters a collective, gives an error naming
 * the rank after the timeout, not a hang. Speed lines report algbw and busbw as nccl-tests
 * does (busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for reduce_scatter / all_gather).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"
#include "common/util.h"
#include "parallel/comm.h"
#include "parallel/ddp.h"
#include "parallel/store.h"
#include "tests/unit/comm_ref.h"
#include "tests/unit/ct_test.h"
#include "trainer/config.h"
#include "trainer/model.h"

#define MAX_RANKS 8
static const char TOKEN[] = "5eed0123456789abcdef0123456789ab";
static int store_port;
static const char *scenario = "";

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- reference values: tests/unit/comm_ref.h ---- */

/* ---- all_reduce ---- */

static void test_all_reduce(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t counts[] = {1, 2, 3, 7, 1000, 262147 /* > Gloo's 1 MiB segment */};
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
    size_t cnt = counts[ci];
    float *f = malloc(cnt * sizeof *f);
    int32_t *i32 = malloc(cnt * sizeof *i32);
    uint16_t *h = malloc(cnt * sizeof *h);
    for (int oi = 0; oi < 4; oi++) {
      ct_redop op = all_ops[oi];
      /* f32: exact (integer-valued inputs, the same division as the reference) */
      for (size_t i = 0; i < cnt; i++) f[i] = fval(me, i);
      CHECK_MSG(ct_comm_all_reduce(c, f, cnt, CT_F32, op) == CT_OK, "%s", ct_last_error());
      size_t bad = 0;
      for (size_t i = 0; i < cnt; i++) {
        float want;
        REDUCE(float, fval, n, i, op, want);
        bad += f[i] != want;
      }
      CHECK_MSG(bad == 0, "all_reduce f32 %s count %zu: %zu wrong", ct_redop_name(op), cnt, bad);

      /* i32: exact, AVG truncates */
      for (size_t i = 0; i < cnt; i++) i32[i] = ival(me, i);
      CHECK_MSG(ct_comm_all_reduce(c, i32, cnt, CT_I32, op) == CT_OK, "%s", ct_last_error());
      bad = 0;
      for (size_t i = 0; i < cnt; i++) {
        int32_t want;
        REDUCE(int32_t, ival, n, i, op, want);
        bad += i32[i] != want;
      }
      CHECK_MSG(bad == 0, "all_reduce i32 %s count %zu: %zu wrong", ct_redop_name(op), cnt, bad);

      /* bf16: fp32 reduction of the (exact) inputs, rounded once to nearest even */
      for (size_t i = 0; i < cnt; i++) h[i] = ref_bf16(hval(me, i));
      CHECK_MSG(ct_comm_all_reduce(c, h, cnt, CT_BF16, op) == CT_OK, "%s", ct_last_error());
      bad = 0;
      for (size_t i = 0; i < cnt; i++) {
        float want;
        REDUCE(float, hval, n, i, op, want); /* exact in fp32 except AVG's division */
        if (h[i] != ref_bf16(want)) bad++;
      }
      CHECK_MSG(bad == 0, "all_reduce bf16 %s count %zu: %zu wrong", ct_redop_name(op), cnt, bad);
    }
    free(f);
    free(i32);
    free(h);
  }

  /* f32 with inexact values: the ring's summation order differs from ours, so a tolerance. */
  {
    size_t cnt = 100003;
    float *f = malloc(cnt * sizeof *f), *want = malloc(cnt * sizeof *want);
    for (size_t i = 0; i < cnt; i++) {
      f[i] = fval(me, i) * 0.37f + 0.001f * (float)me;
      double s = 0;
      for (int r = 0; r < n; r++) s += (double)(fval(r, i) * 0.37f + 0.001f * (float)r);
      want[i] = (float)(s / n);
    }
    CHECK(ct_comm_all_reduce(c, f, cnt, CT_F32, CT_AVG) == CT_OK);
    ct_check_close("all_reduce f32 avg (inexact)", f, want, cnt, 1e-6, 0);
    free(f);
    free(want);
  }

  /* f16: inexact inputs, fp32 reduction, one rounding */
  {
    size_t cnt = 4099;
    uint16_t *h = malloc(cnt * sizeof *h);
    for (int oi = 0; oi < 4; oi++) {
      ct_redop op = all_ops[oi];
      for (size_t i = 0; i < cnt; i++) h[i] = ref_f16(hval(me, i) * 0.3f);
      CHECK(ct_comm_all_reduce(c, h, cnt, CT_F16, op) == CT_OK);
      size_t bad = 0;
      for (size_t i = 0; i < cnt; i++) {
        double acc = f16_f(ref_f16(hval(0, i) * 0.3f));
        for (int r = 1; r < n; r++) {
          double v = f16_f(ref_f16(hval(r, i) * 0.3f));
          acc = op == CT_MAX ? (v > acc ? v : acc) : op == CT_MIN ? (v < acc ? v : acc) : acc + v;
        }
        if (op == CT_AVG) acc /= n;
        /* within half a unit in the last place of f16 (2^-11 relative), plus the smallest
         * subnormal for values near zero */
        if (fabs(f16_f(h[i]) - acc) > fabs(acc) * (1.0 / 2048) + 6e-8) bad++;
      }
      CHECK_MSG(bad == 0, "all_reduce f16 %s: %zu wrong", ct_redop_name(op), bad);
    }
    free(h);
  }

  /* i64 beyond 32 bits; u8 wraps modulo 256 */
  {
    size_t cnt = 1001;
    int64_t *l = malloc(cnt * sizeof *l);
    uint8_t *b = malloc(cnt);
    for (int oi = 0; oi < 4; oi++) {
      ct_redop op = all_ops[oi];
      for (size_t i = 0; i < cnt; i++) l[i] = lval(me, i), b[i] = bval(me, i);
      CHECK(ct_comm_all_reduce(c, l, cnt, CT_I64, op) == CT_OK);
      CHECK(ct_comm_all_reduce(c, b, cnt, CT_U8, op) == CT_OK);
      size_t badl = 0, badb = 0;
      for (size_t i = 0; i < cnt; i++) {
        int64_t wl;
        uint8_t wb;
        REDUCE(int64_t, lval, n, i, op, wl);
        REDUCE(uint8_t, bval, n, i, op, wb);
        badl += l[i] != wl;
        badb += b[i] != wb;
      }
      CHECK_MSG(badl == 0, "all_reduce i64 %s: %zu wrong", ct_redop_name(op), badl);
      CHECK_MSG(badb == 0, "all_reduce u8 %s: %zu wrong", ct_redop_name(op), badb);
    }
    free(l);
    free(b);
  }
}

/* ---- reduce_scatter ---- */

static void test_reduce_scatter(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t counts[] = {1, 2, 3, 5, 64, 1001, 262147};
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
    size_t rc = counts[ci], tot = rc * (size_t)n;
    float *send = malloc(tot * sizeof *send), *recv = malloc((rc + 1) * sizeof *recv);
    for (int oi = 0; oi < 4; oi++) {
      ct_redop op = all_ops[oi];
      for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t j = 0; j < tot; j++) send[j] = fval(me, j);
        recv[rc] = 12345.0f; /* guard: nothing past recv_count is written */
        float *out = inplace ? send + (size_t)me * rc : recv;
        CHECK_MSG(ct_comm_reduce_scatter(c, send, out, rc, CT_F32, op) == CT_OK, "%s",
                  ct_last_error());
        size_t bad = 0;
        for (size_t i = 0; i < rc; i++) {
          float want;
          REDUCE(float, fval, n, (size_t)me * rc + i, op, want);
          bad += out[i] != want;
        }
        if (!inplace) {
          CHECK(recv[rc] == 12345.0f);
          /* send is left alone */
          size_t changed = 0;
          for (size_t j = 0; j < tot; j++) changed += send[j] != fval(me, j);
          CHECK_MSG(changed == 0, "reduce_scatter modified send (%zu elements)", changed);
        }
        CHECK_MSG(bad == 0, "reduce_scatter f32 %s recv_count %zu%s: %zu wrong",
                  ct_redop_name(op), rc, inplace ? " in place" : "", bad);
      }
    }
    free(send);
    free(recv);
  }

  /* other dtypes, one op each */
  size_t rc = 777, tot = rc * (size_t)n;
  int32_t *si = malloc(tot * sizeof *si), *ri = malloc(rc * sizeof *ri);
  int64_t *sl = malloc(tot * sizeof *sl), *rl = malloc(rc * sizeof *rl);
  uint8_t *sb = malloc(tot), *rb = malloc(rc);
  uint16_t *sh = malloc(tot * sizeof *sh), *rh = malloc(rc * sizeof *rh);
  for (size_t j = 0; j < tot; j++) si[j] = ival(me, j), sl[j] = lval(me, j), sb[j] = bval(me, j);
  CHECK(ct_comm_reduce_scatter(c, si, ri, rc, CT_I32, CT_SUM) == CT_OK);
  CHECK(ct_comm_reduce_scatter(c, sl, rl, rc, CT_I64, CT_MAX) == CT_OK);
  CHECK(ct_comm_reduce_scatter(c, sb, rb, rc, CT_U8, CT_SUM) == CT_OK);
  size_t bad = 0;
  for (size_t i = 0; i < rc; i++) {
    size_t j = (size_t)me * rc + i;
    int32_t wi;
    int64_t wl;
    uint8_t wb;
    REDUCE(int32_t, ival, n, j, CT_SUM, wi);
    REDUCE(int64_t, lval, n, j, CT_MAX, wl);
    REDUCE(uint8_t, bval, n, j, CT_SUM, wb);
    bad += (ri[i] != wi) + (rl[i] != wl) + (rb[i] != wb);
  }
  CHECK_MSG(bad == 0, "reduce_scatter i32/i64/u8: %zu wrong", bad);
  for (int oi = 0; oi < 4; oi++) {
    ct_redop op = all_ops[oi];
    for (size_t j = 0; j < tot; j++) sh[j] = ref_bf16(hval(me, j));
    CHECK(ct_comm_reduce_scatter(c, sh, rh, rc, CT_BF16, op) == CT_OK);
    bad = 0;
    for (size_t i = 0; i < rc; i++) {
      float want;
      REDUCE(float, hval, n, (size_t)me * rc + i, op, want);
      bad += rh[i] != ref_bf16(want);
    }
    CHECK_MSG(bad == 0, "reduce_scatter bf16 %s: %zu wrong", ct_redop_name(op), bad);
  }
  free(si), free(ri), free(sl), free(rl), free(sb), free(rb), free(sh), free(rh);
}

/* ---- all_gather, broadcast ---- */

static void test_all_gather(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t counts[] = {1, 3, 1000, 262147};
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
    size_t sc = counts[ci], tot = sc * (size_t)n;
    float *send = malloc(sc * sizeof *send), *recv = malloc((tot + 1) * sizeof *recv);
    for (int inplace = 0; inplace < 2; inplace++) {
      for (size_t j = 0; j < tot; j++) recv[j] = -999.0f;
      recv[tot] = 4242.0f;
      float *in = inplace ? recv + (size_t)me * sc : send;
      for (size_t i = 0; i < sc; i++) in[i] = fval(me, i) + 100.0f * (float)me;
      CHECK_MSG(ct_comm_all_gather(c, in, recv, sc, CT_F32) == CT_OK, "%s", ct_last_error());
      size_t bad = 0;
      for (int r = 0; r < n; r++)
        for (size_t i = 0; i < sc; i++) bad += recv[(size_t)r * sc + i] != fval(r, i) + 100.0f * (float)r;
      CHECK_MSG(bad == 0, "all_gather f32 count %zu%s: %zu wrong", sc, inplace ? " in place" : "", bad);
      CHECK(recv[tot] == 4242.0f);
    }
    free(send);
    free(recv);
  }
  /* 2- and 8-byte elements move as bytes */
  size_t sc = 513, tot = sc * (size_t)n;
  uint16_t *sh = malloc(sc * sizeof *sh), *rh = malloc(tot * sizeof *rh);
  int64_t *sl = malloc(sc * sizeof *sl), *rl = malloc(tot * sizeof *rl);
  for (size_t i = 0; i < sc; i++) sh[i] = ref_bf16(hval(me, i)), sl[i] = lval(me, i);
  CHECK(ct_comm_all_gather(c, sh, rh, sc, CT_BF16) == CT_OK);
  CHECK(ct_comm_all_gather(c, sl, rl, sc, CT_I64) == CT_OK);
  size_t bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < sc; i++)
      bad += (rh[(size_t)r * sc + i] != ref_bf16(hval(r, i))) + (rl[(size_t)r * sc + i] != lval(r, i));
  CHECK_MSG(bad == 0, "all_gather bf16/i64: %zu wrong", bad);
  free(sh), free(rh), free(sl), free(rl);
}

static void test_broadcast(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  for (int root = 0; root < n; root++) {
    const size_t counts[] = {1, 1000, 262147};
    for (size_t ci = 0; ci < 3; ci++) {
      size_t cnt = counts[ci];
      float *f = malloc(cnt * sizeof *f);
      for (size_t i = 0; i < cnt; i++) f[i] = me == root ? fval(root, i) * 3.0f : -1.0f;
      CHECK_MSG(ct_comm_broadcast(c, f, cnt, CT_F32, root) == CT_OK, "%s", ct_last_error());
      size_t bad = 0;
      for (size_t i = 0; i < cnt; i++) bad += f[i] != fval(root, i) * 3.0f;
      CHECK_MSG(bad == 0, "broadcast f32 root %d count %zu: %zu wrong", root, cnt, bad);
      free(f);
    }
    uint8_t b[13];
    int64_t l[5];
    for (int i = 0; i < 13; i++) b[i] = me == root ? bval(root, (size_t)i) : 0;
    for (int i = 0; i < 5; i++) l[i] = me == root ? lval(root, (size_t)i) : 0;
    CHECK(ct_comm_broadcast(c, b, 13, CT_U8, root) == CT_OK);
    CHECK(ct_comm_broadcast(c, l, 5, CT_I64, root) == CT_OK);
    int bad = 0;
    for (int i = 0; i < 13; i++) bad += b[i] != bval(root, (size_t)i);
    for (int i = 0; i < 5; i++) bad += l[i] != lval(root, (size_t)i);
    CHECK_MSG(bad == 0, "broadcast u8/i64 root %d: %d wrong", root, bad);
  }
}

/* Barrier: ranks arrive staggered and mark their arrival in the store; after the barrier
 * every mark must be there. */
static void test_barrier(ct_comm *c, ct_store *s) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  for (int round = 0; round < 2; round++) {
    sleep_ms(40 * ((me + round) % n));
    char key[64];
    snprintf(key, sizeof key, "%s/arrived/%d/%d", scenario, round, me);
    CHECK(ct_store_set(s, key, "1", 1) == CT_OK);
    CHECK_MSG(ct_comm_barrier(c) == CT_OK, "%s", ct_last_error());
    int missing = 0;
    for (int r = 0; r < n; r++) {
      bool ex = false;
      snprintf(key, sizeof key, "%s/arrived/%d/%d", scenario, round, r);
      CHECK(ct_store_check(s, key, &ex) == CT_OK);
      missing += !ex;
    }
    CHECK_MSG(missing == 0, "barrier round %d returned before %d rank(s) arrived", round, missing);
  }
}

/* ---- argument checks (no communication) ---- */

static void test_args(ct_comm *c) {
  CHECK(ct_comm_all_reduce(c, NULL, 0, CT_F32, CT_SUM) == CT_OK);
  CHECK(ct_comm_reduce_scatter(c, NULL, NULL, 0, CT_F32, CT_SUM) == CT_OK);
  CHECK(ct_comm_all_gather(c, NULL, NULL, 0, CT_F32) == CT_OK);
  CHECK(ct_comm_broadcast(c, NULL, 0, CT_F32, 0) == CT_OK);
  float x[4] = {0};
  CHECK(ct_comm_all_reduce(c, NULL, 4, CT_F32, CT_SUM) == CT_ERR_USAGE);
  CHECK(strstr(ct_last_error(), "ct_comm_all_reduce") && strstr(ct_last_error(), "buf is NULL"));
  CHECK(ct_comm_reduce_scatter(c, x, NULL, 1, CT_F32, CT_SUM) == CT_ERR_USAGE);
  CHECK(strstr(ct_last_error(), "ct_comm_reduce_scatter") && strstr(ct_last_error(), "recv"));
  CHECK(ct_comm_all_gather(c, NULL, x, 1, CT_F32) == CT_ERR_USAGE);
  CHECK(strstr(ct_last_error(), "ct_comm_all_gather") && strstr(ct_last_error(), "send"));
  CHECK(ct_comm_broadcast(c, NULL, 4, CT_F32, 0) == CT_ERR_USAGE);
  CHECK(strstr(ct_last_error(), "ct_comm_broadcast") != NULL);
  CHECK(ct_comm_broadcast(c, x, 4, CT_F32, ct_comm_size(c)) == CT_ERR_USAGE);
  CHECK(strstr(ct_last_error(), "root") != NULL);
  CHECK(ct_comm_all_reduce(c, x, 4, (ct_dtype)99, CT_SUM) == CT_ERR_USAGE);
  CHECK(ct_comm_all_reduce(c, x, 4, CT_F32, (ct_redop)99) == CT_ERR_USAGE);
  CHECK(ct_comm_all_reduce(NULL, x, 4, CT_F32, CT_SUM) == CT_ERR_USAGE);
  CHECK(ct_dtype_size(CT_BF16) == 2 && ct_dtype_size(CT_I64) == 8 && ct_dtype_size(CT_U8) == 1);
  /* lean collectives: max_ctas must be positive; Gloo has nothing to limit (no-ops) */
  CHECK(ct_comm_make_lean(c, 0) == CT_ERR_USAGE);
  CHECK(strstr(ct_last_error(), "ct_comm_make_lean") && strstr(ct_last_error(), "max_ctas = 0"));
  CHECK(ct_comm_make_lean(c, 2) == CT_OK);
  CHECK(ct_comm_use_lean(c, true) == CT_OK && ct_comm_use_lean(c, false) == CT_OK);
  CHECK(ct_comm_make_lean(NULL, 2) == CT_ERR_USAGE);
  /* registration: a buffer is required; Gloo has nothing to register (a no-op) */
  CHECK(ct_comm_register(c, NULL, 16) == CT_ERR_USAGE);
  CHECK(strstr(ct_last_error(), "ct_comm_register") && strstr(ct_last_error(), "no buffer"));
  CHECK(ct_comm_register(c, x, 0) == CT_ERR_USAGE);
  CHECK(ct_comm_register(c, x, sizeof(float) * 4) == CT_OK);
  CHECK(ct_comm_register(NULL, x, 16) == CT_ERR_USAGE);
  /* usage errors do not poison the group: it still works (checked by the next collective) */
}

/* ---- split ---- */

static void test_split(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  /* colors by parity, keys reversed: the group is ordered by descending parent rank */
  ct_comm *sub = NULL;
  CHECK_MSG(ct_comm_split(c, me % 2, -me, &sub) == CT_OK, "%s", ct_last_error());
  if (!sub) return;
  int members[MAX_RANKS], m = 0;
  for (int r = n - 1; r >= 0; r--)
    if (r % 2 == me % 2) members[m++] = r;
  int want_rank = -1;
  for (int j = 0; j < m; j++)
    if (members[j] == me) want_rank = j;
  CHECK(ct_comm_size(sub) == m);
  CHECK_MSG(ct_comm_rank(sub) == want_rank, "split rank %d, want %d", ct_comm_rank(sub), want_rank);
  CHECK(strcmp(ct_comm_backend(sub), "gloo") == 0);
  int32_t v = me, sum = 0;
  for (int j = 0; j < m; j++) sum += members[j];
  CHECK(ct_comm_all_reduce(sub, &v, 1, CT_I32, CT_SUM) == CT_OK);
  CHECK_MSG(v == sum, "sum of parent ranks in group %d: %d, want %d", me % 2, v, sum);
  int32_t gathered[MAX_RANKS];
  int32_t mine = me;
  CHECK(ct_comm_all_gather(sub, &mine, gathered, 1, CT_I32) == CT_OK);
  int bad = 0;
  for (int j = 0; j < m; j++) bad += gathered[j] != members[j];
  CHECK_MSG(bad == 0, "all_gather in split group: not ordered by key");

  /* the parent still works, interleaved with the child */
  float f = 1.0f;
  CHECK(ct_comm_all_reduce(c, &f, 1, CT_F32, CT_SUM) == CT_OK);
  CHECK(f == (float)n);
  CHECK(ct_comm_barrier(sub) == CT_OK);

  /* a second split: rank 1 joins no group; the rest keep their parent order (equal keys) */
  ct_comm *sub2 = (ct_comm *)1;
  CHECK_MSG(ct_comm_split(c, me == 1 ? CT_COMM_NO_COLOR : 7, 0, &sub2) == CT_OK, "%s",
            ct_last_error());
  if (me == 1) {
    CHECK(sub2 == NULL);
  } else if (sub2) {
    CHECK(ct_comm_size(sub2) == n - 1);
    CHECK(ct_comm_rank(sub2) == (me == 0 ? 0 : me - 1));
    int64_t x = me;
    CHECK(ct_comm_all_reduce(sub2, &x, 1, CT_I64, CT_MAX) == CT_OK);
    CHECK(x == (n - 1 == 1 ? 0 : n - 1)); /* the largest parent rank other than 1 */
    ct_comm_destroy(sub2);
  }
  ct_comm_destroy(sub);
}

/* ---- ddp ---- */

static float gval(int rank, size_t i) { return fval(rank, i) * 0.5f * (float)(rank + 1); }

static void test_ddp(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  CHECK(ct_ddp_bucket_floats(0) == 25u * 1024 * 1024 / 4);
  CHECK(ct_ddp_bucket_floats(1.0) == 262144);
  const size_t numels[] = {1000003, 5};
  const size_t buckets[] = {65536 /* does not divide 1000003 */, 2};
  for (int t = 0; t < 2; t++) {
    size_t numel = numels[t];
    float *g = malloc(numel * sizeof *g);
    for (int pass = 0; pass < 2; pass++) {
      size_t bucket = pass == 0 ? buckets[t] : 0 /* default 25 MiB: one bucket */;
      for (size_t i = 0; i < numel; i++) g[i] = gval(me, i);
      CHECK_MSG(ct_ddp_reduce_grads(c, g, numel, bucket) == CT_OK, "%s", ct_last_error());
      size_t bad = 0;
      for (size_t i = 0; i < numel; i++) {
        float want;
        REDUCE(float, gval, n, i, CT_AVG, want);
        bad += g[i] != want;
      }
      CHECK_MSG(bad == 0, "ddp numel %zu bucket %zu: %zu wrong", numel, bucket, bad);
    }
    free(g);
  }
}

/* The sparse embedding gradient (ddp.h) against the dense reduce, on two models that start alike
 * (gpt2 tied with wpe; llama untied): two steps of two micro-batches, each rank with its own
 * tokens, rows overlapping across ranks. The rows reduced are the union over the ranks of the
 * armed (second) micro-batch's tokens; every gradient is within a few ulps of the dense one, and
 * with 2 ranks (a + b rounds as b + a) the embedding rows no armed token uses are bit-identical.
 * The second step checks that the lookup's buffer is all zero again after the first. */
static int32_t sparse_tok(int rank, int micro, int step, int i) {
  return (int32_t)((i * 7 + rank * 11 + micro * 29 + step * 5) % 61 + (i % 3 == 0 ? 190 : 0));
}

static void ddp_sparse_case(ct_comm *c, const char *what, int n_over, char **over) {
  const int me = ct_comm_rank(c), n = ct_comm_size(c), B = 2, T = 8, N = B * T;
  ct_config cfg;
  const ct_status st = ct_config_load(NULL, n_over, over, &cfg);
  CHECK_MSG(st == CT_OK, "%s: %s", what, ct_last_error());
  if (st != CT_OK) return;
  const ct_ops *o = ct_ops_cpu();
  ct_model *m[2] = {NULL, NULL};
  ct_ddp *d[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    CHECK_MSG(ct_model_create(&cfg.model, o, B, T, &m[k]) == CT_OK, "%s: %s", what, ct_last_error());
    if (!m[k]) return;
    ct_model_init_weights(m[k], 7);
    ct_ddp_cfg dc = CT_DDP_CFG_INIT;
    dc.sparse_embedding = k == 0;
    dc.ce_allreduce = true; /* Gloo: falls back; its bucket planning must leave no trace */
    CHECK_MSG(ct_ddp_create(m[k], c, &dc, &d[k]) == CT_OK, "%s: %s", what, ct_last_error());
  }
  const ct_param *e = ct_model_embedding(m[0]);
  const size_t numel = ct_model_numel(m[0]), C = (size_t)e->shape[1];
  int32_t tok[2][16], tgt[16];
  for (int step = 0; step < 2; step++) {
    for (int k = 0; k < 2; k++) {
      ct_model_zero_grad(m[k]);
      for (int micro = 0; micro < 2; micro++) {
        for (int i = 0; i < N; i++) {
          tok[micro][i] = sparse_tok(me, micro, step, i);
          tgt[i] = sparse_tok(me, micro, step, i + 1);
        }
        float loss;
        CHECK(ct_ddp_arm(d[k], micro == 1, tok[micro], N) == CT_OK);
        CHECK_MSG(ct_model_train_micro(m[k], tok[micro], tgt, B, T, 1.0f / (2 * N), &loss) == CT_OK,
                  "%s: %s", what, ct_last_error());
      }
      CHECK_MSG(ct_ddp_finish(d[k]) == CT_OK, "%s: %s", what, ct_last_error());
    }
    bool used[512] = {false};
    int want = 0;
    for (int r = 0; r < n; r++)
      for (int i = 0; i < N; i++) {
        const int32_t t = sparse_tok(r, 1, step, i);
        want += !used[t];
        used[t] = true;
      }
    CHECK_MSG(ct_ddp_sparse_rows(d[0]) == want && ct_ddp_sparse_rows(d[1]) == -1,
              "%s step %d: %d sparse rows, want %d", what, step, ct_ddp_sparse_rows(d[0]), want);
    CHECK_MSG(ct_ddp_buckets(d[0]) == 3, "%s: %d buckets, want 3 (embedding, the rest, rows)", what,
              ct_ddp_buckets(d[0]));
    const float *gs = ct_model_grads(m[0]), *gd = ct_model_grads(m[1]);
    char label[96];
    snprintf(label, sizeof label, "%s step %d: sparse vs dense gradients", what, step);
    ct_check_close(label, gs, gd, numel, 1e-6, 0);
    size_t moved = 0;
    for (size_t v = 0; n == 2 && v < (size_t)e->shape[0]; v++)
      if (!used[v]) moved += memcmp(gs + e->offset + v * C, gd + e->offset + v * C, C * sizeof(float)) != 0;
    CHECK_MSG(moved == 0, "%s step %d: %zu embedding rows no token used differ", what, step, moved);
  }
  for (int k = 0; k < 2; k++) {
    ct_ddp_destroy(d[k]);
    ct_model_destroy(m[k]);
  }
}

static void test_ddp_sparse(ct_comm *c) {
  char *gpt2[] = {"model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.max_seq_len=8",
                  "train.seq_len=8"};
  ddp_sparse_case(c, "gpt2 (tied)", 5, gpt2);
  char *llama[] = {"model.arch=llama", "model.n_layer=1", "model.d_model=16", "model.n_head=2",
                   "model.max_seq_len=8", "train.seq_len=8", "model.tie_embeddings=false"};
  ddp_sparse_case(c, "llama (untied)", 7, llama);
}

/* The copy-engine all-reduce applies to NCCL groups only: on Gloo it declines with a reason,
 * and argument errors come first. */
static void test_ce_fallback(ct_comm *c) {
  float buf[16];
  ct_comm_ce_bucket b[1] = {{0, 16}}, bad[1] = {{8, 9}};
  ct_comm_ce *ce = (ct_comm_ce *)buf;
  char why[128];
  CHECK(ct_comm_ce_create(c, buf, 16, CT_F32, b, 1, &ce, why, sizeof why) == CT_OK && !ce);
  CHECK_MSG(strstr(why, "gloo") != NULL, "why: %s", why);
  CHECK(ct_comm_ce_create(c, buf, 16, CT_F32, bad, 1, &ce, why, sizeof why) == CT_ERR_USAGE && !ce);
  CHECK(ct_comm_ce_create(c, buf, 16, CT_I32, b, 1, &ce, why, sizeof why) == CT_ERR_USAGE);
  CHECK(ct_comm_ce_find(NULL, 0, 16) == -1);
}

/* ---- speed (nccl-tests style) ---- */

static void report(ct_comm *c, const char *what, size_t bytes, double t, double factor) {
  float tf = (float)t;
  ct_comm_all_reduce(c, &tf, 1, CT_F32, CT_AVG); /* average over ranks */
  if (ct_comm_rank(c) == 0) {
    double algbw = (double)bytes / tf / 1e9;
    printf("[%s] %-14s %4d ranks %8.1f MB  %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n",
           scenario, what, ct_comm_size(c), bytes / 1e6, tf * 1e3, algbw, algbw * factor);
    fflush(stdout);
  }
}

static void test_speed(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t N = 10u * 1000 * 1000; /* 10M floats, 40 MB */
  const int iters = 4;
  float *buf = malloc(N * sizeof *buf);
  float *out = malloc(N * sizeof *out);

  /* all_reduce; the warm-up result is checked */
  for (size_t i = 0; i < N; i++) buf[i] = fval(me, i);
  CHECK(ct_comm_all_reduce(c, buf, N, CT_F32, CT_SUM) == CT_OK);
  size_t bad = 0;
  for (size_t i = 0; i < N; i += 997) {
    float want;
    REDUCE(float, fval, n, i, CT_SUM, want);
    bad += buf[i] != want;
  }
  CHECK_MSG(bad == 0, "all_reduce 10M: %zu wrong", bad);
  double t0 = ct_now();
  for (int it = 0; it < iters; it++) {
    for (size_t i = 0; i < 4; i++) buf[i] = 1.0f; /* keep the values bounded */
    CHECK(ct_comm_all_reduce(c, buf, N, CT_F32, CT_AVG) == CT_OK);
  }
  report(c, "all_reduce", N * 4, (ct_now() - t0) / iters, 2.0 * (n - 1) / n);

  /* reduce_scatter over 10M elements in all: several pieces; checked in full */
  size_t rc = N / (size_t)n;
  for (size_t i = 0; i < rc * (size_t)n; i++) buf[i] = fval(me, i);
  CHECK(ct_comm_reduce_scatter(c, buf, out, rc, CT_F32, CT_SUM) == CT_OK);
  bad = 0;
  for (size_t i = 0; i < rc; i++) {
    float want;
    REDUCE(float, fval, n, (size_t)me * rc + i, CT_SUM, want);
    bad += out[i] != want;
  }
  CHECK_MSG(bad == 0, "reduce_scatter 10M: %zu wrong", bad);
  t0 = ct_now();
  for (int it = 0; it < iters; it++) CHECK(ct_comm_reduce_scatter(c, buf, out, rc, CT_F32, CT_SUM) == CT_OK);
  report(c, "reduce_scatter", rc * (size_t)n * 4, (ct_now() - t0) / iters, (double)(n - 1) / n);

  /* all_gather to 10M elements in all */
  for (size_t i = 0; i < rc; i++) buf[i] = fval(me, i);
  CHECK(ct_comm_all_gather(c, buf, out, rc, CT_F32) == CT_OK);
  bad = 0;
  for (size_t j = 0; j < rc * (size_t)n; j += 991) bad += out[j] != fval((int)(j / rc), j % rc);
  CHECK_MSG(bad == 0, "all_gather 10M: %zu wrong", bad);
  t0 = ct_now();
  for (int it = 0; it < iters; it++) CHECK(ct_comm_all_gather(c, buf, out, rc, CT_F32) == CT_OK);
  report(c, "all_gather", rc * (size_t)n * 4, (ct_now() - t0) / iters, (double)(n - 1) / n);

  free(buf);
  free(out);
}

/* ---- scenarios (each runs in every child) ---- */

static void full_scenario(ct_store *s, int me, int n) {
  double t0 = ct_now();
  ct_comm *c = NULL;
  ct_status st = ct_comm_init_gloo(s, me, n, "t/world", 20.0, &c);
  CHECK_MSG(st == CT_OK, "init: %s", ct_last_error());
  if (st != CT_OK) return;
  if (me == 0) printf("[%s] rendezvous + connect of %d ranks: %.0f ms\n", scenario, n, (ct_now() - t0) * 1e3);
  CHECK(ct_comm_rank(c) == me && ct_comm_size(c) == n);
  CHECK(strcmp(ct_comm_backend(c), "gloo") == 0);
  CHECK(strcmp(ct_comm_prefix(c), "t/world") == 0);
  /* init removed its rendezvous keys once everyone had connected */
  char key[64];
  bool ex = true;
  snprintf(key, sizeof key, "t/world/%d", me);
  CHECK(ct_store_check(s, key, &ex) == CT_OK && !ex);

  test_args(c);
  test_all_reduce(c);
  test_reduce_scatter(c);
  test_all_gather(c);
  test_broadcast(c);
  test_barrier(c, s);
  test_split(c);
  test_ddp(c);
  test_ddp_sparse(c);
  test_ce_fallback(c);
  test_speed(c);
  ct_comm_destroy(c);
}

/* World 3, but rank 2 is never started: init must fail on 0 and 1 after the timeout. */
static void nojoin_scenario(ct_store *s, int me, int n) {
  double t0 = ct_now();
  ct_comm *c = (ct_comm *)1;
  ct_status st = ct_comm_init_gloo(s, me, n, "t/nojoin", 1.0, &c);
  double dt = ct_now() - t0;
  CHECK(st != CT_OK);
  CHECK(c == NULL);
  char want[32];
  snprintf(want, sizeof want, "rank %d of %d", me, n);
  CHECK_MSG(strstr(ct_last_error(), want) != NULL, "error does not name the rank: %s", ct_last_error());
  CHECK_MSG(strstr(ct_last_error(), "t/nojoin") != NULL, "error does not name the group: %s", ct_last_error());
  CHECK_MSG(dt >= 0.9 && dt < 8.0, "init failed after %.2f s (timeout 1 s)", dt);
  if (me == 0) printf("[%s] missing rank -> error after %.2f s: %s\n", scenario, dt, ct_last_error());
}

/* World 2: rank 1 joins but does not enter the all_reduce. Rank 0 gets a timeout error, then
 * the group refuses further work at once; after rank 1 exits, a second group fails fast. */
static void stall_scenario(ct_store *s, int me, int n) {
  ct_comm *c = NULL, *d = NULL;
  CHECK_MSG(ct_comm_init_gloo(s, me, n, "t/stall", 1.0, &c) == CT_OK, "%s", ct_last_error());
  CHECK_MSG(ct_comm_init_gloo(s, me, n, "t/dead", 1.0, &d) == CT_OK, "%s", ct_last_error());
  if (!c || !d) return;
  CHECK(ct_comm_barrier(c) == CT_OK);
  if (me == 1) {
    sleep_ms(2500); /* longer than the timeout */
    ct_comm_destroy(c);
    ct_comm_destroy(d);
    CHECK(ct_store_set(s, "t/gone", "1", 1) == CT_OK);
    return; /* the process exits */
  }
  float x[1000] = {0};
  double t0 = ct_now();
  ct_status st = ct_comm_all_reduce(c, x, 1000, CT_F32, CT_SUM);
  double dt = ct_now() - t0;
  CHECK(st != CT_OK);
  CHECK_MSG(strstr(ct_last_error(), "rank 0 of 2") && strstr(ct_last_error(), "all_reduce"),
            "error does not name the call and rank: %s", ct_last_error());
  CHECK_MSG(dt >= 0.9 && dt < 2.4, "all_reduce failed after %.2f s (timeout 1 s)", dt);
  printf("[%s] stalled peer -> error after %.2f s: %s\n", scenario, dt, ct_last_error());
  t0 = ct_now();
  CHECK(ct_comm_barrier(c) != CT_OK);
  CHECK(strstr(ct_last_error(), "unusable") != NULL);
  CHECK(ct_now() - t0 < 0.1);

  void *v = NULL;
  CHECK(ct_store_get(s, "t/gone", 10.0, &v, NULL) == CT_OK);
  free(v);
  sleep_ms(100);
  t0 = ct_now();
  st = ct_comm_all_reduce(d, x, 1000, CT_F32, CT_SUM);
  dt = ct_now() - t0;
  CHECK(st != CT_OK);
  CHECK_MSG(dt < 2.4, "dead peer noticed after %.2f s", dt);
  printf("[%s] dead peer -> error after %.2f s: %s\n", scenario, dt, ct_last_error());
  ct_comm_destroy(c);
  ct_comm_destroy(d);
}

/* ---- the parent: store server, fork, reap ---- */

typedef void (*scenario_fn)(ct_store *s, int rank, int world);

static void child_main(scenario_fn fn, int rank, int world, double limit_s) {
  ct_test_checks = ct_test_failed = 0;
  alarm((unsigned)limit_s + 5); /* a hung child dies; the parent reports the signal */
  ct_store *s = NULL;
  if (ct_store_connect("127.0.0.1", store_port, TOKEN, 10.0, &s) != CT_OK) {
    fprintf(stderr, "[%s rank %d] store connect: %s\n", scenario, rank, ct_last_error());
    fflush(stderr);
    _exit(3);
  }
  fn(s, rank, world);
  ct_store_close(s);
  if (ct_test_failed)
    fprintf(stderr, "[%s rank %d] %d of %d checks failed\n", scenario, rank, ct_test_failed, ct_test_checks);
  else if (rank == 0)
    printf("[%s] rank 0: %d checks passed\n", scenario, ct_test_checks);
  fflush(stdout);
  fflush(stderr);
  _exit(ct_test_failed ? 1 : 0);
}

/* Runs fn on ranks 0..started-1 of a world of `world`. Returns true when every child exited 0
 * within limit_s. */
static bool run_scenario(const char *name, scenario_fn fn, int world, int started, double limit_s) {
  scenario = name;
  double t0 = ct_now();
  ct_store_server *srv = NULL;
  if (ct_store_server_start("127.0.0.1", 0, TOKEN, &srv, &store_port) != CT_OK) {
    fprintf(stderr, "[%s] store server: %s\n", name, ct_last_error());
    CHECK(0);
    return false;
  }
  fflush(stdout);
  fflush(stderr);
  /* Fork before the server thread starts: children of a threaded parent inherit locks. */
  pid_t pids[MAX_RANKS];
  int status[MAX_RANKS];
  bool done[MAX_RANKS] = {false};
  for (int r = 0; r < started; r++) {
    pids[r] = fork();
    if (pids[r] == 0) child_main(fn, r, world, limit_s);
    if (pids[r] < 0) {
      perror("fork");
      started = r;
      break;
    }
  }
  if (ct_store_server_start_thread(srv) != CT_OK) fprintf(stderr, "[%s] %s\n", name, ct_last_error());

  int left = started;
  while (left > 0 && ct_now() - t0 < limit_s) {
    for (int r = 0; r < started; r++) {
      if (done[r]) continue;
      pid_t p = waitpid(pids[r], &status[r], WNOHANG);
      if (p == pids[r]) done[r] = true, left--;
    }
    if (left) sleep_ms(10);
  }
  bool ok = true;
  for (int r = 0; r < started; r++) {
    if (!done[r]) {
      fprintf(stderr, "[%s] rank %d hung for %.0f s: killed\n", name, r, limit_s);
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      ok = false;
    } else if (WIFSIGNALED(status[r])) {
      fprintf(stderr, "[%s] rank %d died by signal %d (%s)\n", name, r, WTERMSIG(status[r]),
              strsignal(WTERMSIG(status[r])));
      ok = false;
    } else if (WEXITSTATUS(status[r]) != 0) {
      fprintf(stderr, "[%s] rank %d exited with code %d\n", name, r, WEXITSTATUS(status[r]));
      ok = false;
    }
  }
  ct_store_server_stop(srv);
  CHECK_MSG(ok, "scenario %s failed", name);
  printf("[%s] %s in %.1f s\n", name, ok ? "ok" : "FAILED", ct_now() - t0);
  fflush(stdout);
  return ok;
}

int main(void) {
  run_scenario("world3", full_scenario, 3, 3, 45.0);
  run_scenario("world2", full_scenario, 2, 2, 45.0);
  run_scenario("nojoin", nojoin_scenario, 3, 2, 15.0);
  run_scenario("stall", stall_scenario, 2, 2, 15.0);
  return ct_test_finish();
}
