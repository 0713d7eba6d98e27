/* tests/gpu/test_comm_nccl.c — the NCCL process group (parallel/comm.h) on every visible GPU.
 *
 * The parent never touches CUDA (a forked child of a CUDA process cannot use it): a probe child
 * counts the devices, then the parent starts a token-checked store server on a free loopback
 * port and forks one rank per GPU (world = device count, at most 8). Each rank runs
 * ct_cuda_init(rank) and ct_comm_init_nccl, and checks every collective on device buffers
 * against values it computes itself: all_reduce (f32 sum/avg/max/min, i32/i64/u8, bf16 and f16
 * sums within a tolerance, bf16 max/min exactly), reduce_scatter and all_gather (out of place and
 * in place, with guard elements past the end), broadcast from each root, a staggered barrier,
 * splits (singleton groups, reversed keys, a rank with no color), overlap mode on a split copy
 * (side-stream collectives, ct_comm_join_lagging), argument errors (a host
 * pointer), then prints algbw / busbw for 256 MiB all_reduce, reduce_scatter and all_gather the
 * nccl-tests way (busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for the others; time
 * averaged over ranks after warm-up).
 * The ce scenario: the copy-engine all-reduce (ct_comm_ce_*) of f32 and bf16 buckets against
 * NCCL's all-reduce of the same data, bit-equal with 2 ranks; ce_watchdog: a skipped one times
 * out like a NCCL collective and cleanup does not hang.
 * The watchdog scenario (timeout 5 s): rank 1 skips a collective; every other rank's
 * all_reduce + ct_comm_sync must fail with CT_ERR_RUNTIME naming the collective and the rank
 * within about 5 s, not hang; the group then refuses work at once.
 *
 * Exits 77 (meson: skipped) when fewer than 2 CUDA devices are visible, or in a build without
 * NCCL. NCCL_NVLS_ENABLE defaults to 0 here (NVLink multicast stays off on shared machines).
 */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ct_build_config.h"

#if !CT_HAVE_NCCL
int main(void) {
  printf("test_comm_nccl: skipped: this build has no NCCL\n");
  return 77;
}
#else

#include <cuda_runtime.h>

#include "common/status.h"
#include "common/util.h"
#include "kernels/cuda/ops_cuda.h"
#include "parallel/comm.h"
#include "parallel/store.h"
#include "tests/unit/comm_ref.h"
#include "tests/unit/ct_test.h"

int ct_cuda_device_count(void); /* kernels/cuda/device_query.cu */

#define MAX_RANKS 8
static const char TOKEN[] = "0123456789abcdef5eed0123456789ab";
static int store_port;
static const char *scenario = "";
static cudaStream_t stream; /* ct_cuda_stream() of this rank */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- device buffers (every copy goes through the backend's stream) ---- */

static void die_cuda(const char *call, cudaError_t e) {
  fprintf(stderr, "[%s] %s: %s\n", scenario, call, cudaGetErrorString(e));
  fflush(stderr);
  _exit(3);
}

static void *dmalloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) die_cuda("cudaMalloc", e);
  return p;
}

static void up(void *d, const void *h, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) die_cuda("upload", e);
}

/* Results are read only after ct_comm_sync: that wait is the bounded one. */
static bool fetch(ct_comm *c, void *h, const void *d, size_t bytes) {
  ct_status st = ct_comm_sync(c);
  CHECK_MSG(st == CT_OK, "ct_comm_sync: %s", ct_last_error());
  if (st != CT_OK) return false;
  cudaError_t e = cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) die_cuda("download", e);
  return true;
}

/* ---- reference values: tests/unit/comm_ref.h ---- */

/* f32 element j of a reduction: exact for sum/max/min (small integers, any order); NCCL's avg
 * scales each input by 1/n before summing, so within a few roundings of sum(|x|)/n. */
static bool f32_ok(float got, int n, size_t j, ct_redop op) {
  float want;
  REDUCE(float, fval, n, j, op, want);
  if (op != CT_AVG) return got == want;
  double s = 0, a = 0;
  for (int r = 0; r < n; r++) s += fval(r, j), a += fabs(fval(r, j));
  return fabs(got - s / n) <= 1e-6 * (a / n) + 1e-30;
}

/* A 16-bit float sum reduced step by step in its own type: every partial sum is at most
 * sum(|v|), and each of the (at most n) roundings costs half an ulp of it, at most
 * 2^-bits * sum(|v|) with `bits` significant bits (bf16 8, f16 11). Allowed: twice that. */
static bool half_sum_ok(double got, double exact, double sum_abs, int n, int bits) {
  return fabs(got - exact) <= n * ldexp(sum_abs, 1 - bits) + 1e-30;
}

/* ---- argument checks ---- */

static void test_args(ct_comm *c) {
  CHECK(strcmp(ct_comm_backend(c), "nccl") == 0);
  CHECK(ct_comm_all_reduce(c, NULL, 0, CT_F32, CT_SUM) == CT_OK);
  CHECK(ct_comm_reduce_scatter(c, NULL, NULL, 0, CT_F32, CT_SUM) == CT_OK);
  CHECK(ct_comm_all_gather(c, NULL, NULL, 0, CT_F32) == CT_OK);
  CHECK(ct_comm_broadcast(c, NULL, 0, CT_F32, 0) == CT_OK);
  CHECK(ct_comm_all_reduce(c, NULL, 4, CT_F32, CT_SUM) == CT_ERR_USAGE);
  /* a host buffer is refused before anything is queued, and the group stays usable */
  float host[8] = {0};
  CHECK(ct_comm_all_reduce(c, host, 8, CT_F32, CT_SUM) == CT_ERR_USAGE);
  CHECK_MSG(strstr(ct_last_error(), "host memory") && strstr(ct_last_error(), "all_reduce"),
            "host pointer error: %s", ct_last_error());
  float *d = dmalloc(8 * ct_comm_size(c) * sizeof *d);
  /* reduce_scatter: recv inside send but not at this rank's block (block 2 * rank) */
  CHECK(ct_comm_reduce_scatter(c, d, d + 1, 2, CT_F32, CT_SUM) == CT_ERR_USAGE);
  CHECK_MSG(strstr(ct_last_error(), "in-place") != NULL, "%s", ct_last_error());
  CHECK(ct_comm_broadcast(c, d, 4, CT_F32, ct_comm_size(c)) == CT_ERR_USAGE);
  /* still healthy */
  float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[8];
  up(d, ones, sizeof ones);
  CHECK_MSG(ct_comm_all_reduce(c, d, 8, CT_F32, CT_SUM) == CT_OK, "%s", ct_last_error());
  if (fetch(c, out, d, sizeof out))
    CHECK_MSG(out[0] == (float)ct_comm_size(c) && out[7] == (float)ct_comm_size(c),
              "all_reduce of ones after usage errors: %g", out[0]);
  cudaFree(d);
  CHECK(ct_comm_sync(c) == CT_OK); /* nothing queued: returns at once */
}

/* ---- all_reduce ---- */

static void test_all_reduce(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t counts[] = {1, 3, 1000, 262147, 4194307};
  const size_t maxc = counts[sizeof counts / sizeof *counts - 1];
  void *d = dmalloc(maxc * 8);
  void *h = malloc(maxc * 8);
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
    size_t cnt = counts[ci];
    for (int oi = 0; oi < 4; oi++) {
      ct_redop op = all_ops[oi];
      float *f = h;
      for (size_t i = 0; i < cnt; i++) f[i] = fval(me, i);
      up(d, f, cnt * 4);
      CHECK_MSG(ct_comm_all_reduce(c, d, cnt, CT_F32, op) == CT_OK, "%s", ct_last_error());
      size_t bad = 0;
      if (fetch(c, f, d, cnt * 4))
        for (size_t i = 0; i < cnt; i++) bad += !f32_ok(f[i], n, i, op);
      CHECK_MSG(bad == 0, "all_reduce f32 %s count %zu: %zu wrong", ct_redop_name(op), cnt, bad);

      int32_t *x = h;
      for (size_t i = 0; i < cnt; i++) x[i] = ival(me, i);
      up(d, x, cnt * 4);
      CHECK(ct_comm_all_reduce(c, d, cnt, CT_I32, op) == CT_OK);
      bad = 0;
      if (fetch(c, x, d, cnt * 4))
        for (size_t i = 0; i < cnt; i++) {
          int32_t want;
          REDUCE(int32_t, ival, n, i, op, want);
          bad += x[i] != want;
        }
      CHECK_MSG(bad == 0, "all_reduce i32 %s count %zu: %zu wrong", ct_redop_name(op), cnt, bad);
    }

    /* bf16: sum within the step-by-step rounding bound; max / min pick an input exactly */
    uint16_t *b = h;
    const ct_redop bops[] = {CT_SUM, CT_MAX, CT_MIN};
    for (int oi = 0; oi < 3; oi++) {
      for (size_t i = 0; i < cnt; i++) b[i] = ref_bf16(hval(me, i));
      up(d, b, cnt * 2);
      CHECK(ct_comm_all_reduce(c, d, cnt, CT_BF16, bops[oi]) == CT_OK);
      size_t bad = 0;
      if (fetch(c, b, d, cnt * 2))
        for (size_t i = 0; i < cnt; i++) {
          if (bops[oi] == CT_SUM) {
            double s = 0, a = 0;
            for (int r = 0; r < n; r++) s += hval(r, i), a += fabs(hval(r, i));
            bad += !half_sum_ok(bf16_f(b[i]), s, a, n, 8);
          } else {
            float want;
            REDUCE(float, hval, n, i, bops[oi], want);
            bad += b[i] != ref_bf16(want);
          }
        }
      CHECK_MSG(bad == 0, "all_reduce bf16 %s count %zu: %zu wrong", ct_redop_name(bops[oi]), cnt, bad);
    }
  }

  /* f16 sum; i64 and u8 (sums wrap modulo 256, avg truncates) */
  size_t cnt = 4099;
  uint16_t *hh = h;
  for (size_t i = 0; i < cnt; i++) hh[i] = ref_f16(hval(me, i) * 0.3f);
  up(d, hh, cnt * 2);
  CHECK(ct_comm_all_reduce(c, d, cnt, CT_F16, CT_SUM) == CT_OK);
  size_t bad = 0;
  if (fetch(c, hh, d, cnt * 2))
    for (size_t i = 0; i < cnt; i++) {
      double s = 0, a = 0;
      for (int r = 0; r < n; r++) {
        double v = f16_f(ref_f16(hval(r, i) * 0.3f));
        s += v, a += fabs(v);
      }
      bad += !half_sum_ok(f16_f(hh[i]), s, a, n, 11);
    }
  CHECK_MSG(bad == 0, "all_reduce f16 sum: %zu wrong", bad);
  for (int oi = 0; oi < 4; oi++) {
    ct_redop op = all_ops[oi];
    int64_t *l = h;
    for (size_t i = 0; i < cnt; i++) l[i] = lval(me, i);
    up(d, l, cnt * 8);
    CHECK(ct_comm_all_reduce(c, d, cnt, CT_I64, op) == CT_OK);
    size_t badl = 0;
    if (fetch(c, l, d, cnt * 8))
      for (size_t i = 0; i < cnt; i++) {
        int64_t want;
        REDUCE(int64_t, lval, n, i, op, want);
        badl += l[i] != want;
      }
    uint8_t *u = h;
    for (size_t i = 0; i < cnt; i++) u[i] = bval(me, i);
    up(d, u, cnt);
    CHECK(ct_comm_all_reduce(c, d, cnt, CT_U8, op) == CT_OK);
    size_t badb = 0;
    if (fetch(c, u, d, cnt))
      for (size_t i = 0; i < cnt; i++) {
        uint8_t want;
        REDUCE(uint8_t, bval, n, i, op, want);
        badb += u[i] != want;
      }
    CHECK_MSG(badl == 0, "all_reduce i64 %s: %zu wrong", ct_redop_name(op), badl);
    CHECK_MSG(badb == 0, "all_reduce u8 %s: %zu wrong", ct_redop_name(op), badb);
  }
  cudaFree(d);
  free(h);
}

/* ---- reduce_scatter ---- */

static void test_reduce_scatter(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t counts[] = {1, 3, 1000, 262147};
  const float GUARD = 12345.0f;
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
    size_t rc = counts[ci], tot = rc * (size_t)n;
    float *send = dmalloc(tot * 4), *recv = dmalloc((rc + 1) * 4);
    float *h = malloc((tot + 1) * 4);
    for (int oi = 0; oi < 4; oi++) {
      ct_redop op = all_ops[oi];
      for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t j = 0; j < tot; j++) h[j] = fval(me, j);
        up(send, h, tot * 4);
        h[0] = GUARD;
        up(recv + rc, h, 4); /* guard: nothing past recv_count is written */
        float *out = inplace ? send + (size_t)me * rc : recv;
        CHECK_MSG(ct_comm_reduce_scatter(c, send, out, rc, CT_F32, op) == CT_OK, "%s",
                  ct_last_error());
        size_t bad = 0;
        if (fetch(c, h, out, (rc + !inplace) * 4)) {
          for (size_t i = 0; i < rc; i++) bad += !f32_ok(h[i], n, (size_t)me * rc + i, op);
          if (!inplace) CHECK_MSG(h[rc] == GUARD, "reduce_scatter wrote past recv_count");
        }
        CHECK_MSG(bad == 0, "reduce_scatter f32 %s recv_count %zu%s: %zu wrong",
                  ct_redop_name(op), rc, inplace ? " in place" : "", bad);
        if (!inplace && fetch(c, h, send, tot * 4)) {
          size_t changed = 0;
          for (size_t j = 0; j < tot; j++) changed += h[j] != fval(me, j);
          CHECK_MSG(changed == 0, "reduce_scatter modified send (%zu elements)", changed);
        }
      }
    }
    cudaFree(send);
    cudaFree(recv);
    free(h);
  }

  /* bf16 sum (tolerance) and i32 sum (exact) */
  size_t rc = 777, tot = rc * (size_t)n;
  void *ds = dmalloc(tot * 4), *dr = dmalloc(rc * 4);
  uint16_t *hb = malloc(tot * 2);
  for (size_t j = 0; j < tot; j++) hb[j] = ref_bf16(hval(me, j));
  up(ds, hb, tot * 2);
  CHECK(ct_comm_reduce_scatter(c, ds, dr, rc, CT_BF16, CT_SUM) == CT_OK);
  size_t bad = 0;
  if (fetch(c, hb, dr, rc * 2))
    for (size_t i = 0; i < rc; i++) {
      size_t j = (size_t)me * rc + i;
      double s = 0, a = 0;
      for (int r = 0; r < n; r++) s += hval(r, j), a += fabs(hval(r, j));
      bad += !half_sum_ok(bf16_f(hb[i]), s, a, n, 8);
    }
  CHECK_MSG(bad == 0, "reduce_scatter bf16 sum: %zu wrong", bad);
  int32_t *hi = malloc(tot * 4);
  for (size_t j = 0; j < tot; j++) hi[j] = ival(me, j);
  up(ds, hi, tot * 4);
  CHECK(ct_comm_reduce_scatter(c, ds, dr, rc, CT_I32, CT_SUM) == CT_OK);
  bad = 0;
  if (fetch(c, hi, dr, rc * 4))
    for (size_t i = 0; i < rc; i++) {
      int32_t want;
      REDUCE(int32_t, ival, n, (size_t)me * rc + i, CT_SUM, want);
      bad += hi[i] != want;
    }
  CHECK_MSG(bad == 0, "reduce_scatter i32 sum: %zu wrong", bad);
  cudaFree(ds);
  cudaFree(dr);
  free(hb);
  free(hi);
}

/* ---- all_gather, broadcast ---- */

static float gval(int rank, size_t i) { return fval(rank, i) + 100.0f * (float)rank; }

static void test_all_gather(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t counts[] = {1, 3, 1000, 262147};
  const float GUARD = 4242.0f;
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
    size_t sc = counts[ci], tot = sc * (size_t)n;
    float *send = dmalloc(sc * 4), *recv = dmalloc((tot + 1) * 4);
    float *h = malloc((tot + 1) * 4);
    for (int inplace = 0; inplace < 2; inplace++) {
      for (size_t j = 0; j < tot; j++) h[j] = -999.0f;
      h[tot] = GUARD;
      for (size_t i = 0; i < sc; i++) h[(size_t)me * sc + i] = gval(me, i);
      up(recv, h, (tot + 1) * 4);
      if (!inplace) up(send, h + (size_t)me * sc, sc * 4);
      float *in = inplace ? recv + (size_t)me * sc : send;
      CHECK_MSG(ct_comm_all_gather(c, in, recv, sc, CT_F32) == CT_OK, "%s", ct_last_error());
      size_t bad = 0;
      if (fetch(c, h, recv, (tot + 1) * 4)) {
        for (int r = 0; r < n; r++)
          for (size_t i = 0; i < sc; i++) bad += h[(size_t)r * sc + i] != gval(r, i);
        CHECK_MSG(h[tot] == GUARD, "all_gather wrote past the end");
      }
      CHECK_MSG(bad == 0, "all_gather f32 count %zu%s: %zu wrong", sc, inplace ? " in place" : "", bad);
    }
    cudaFree(send);
    cudaFree(recv);
    free(h);
  }
  /* 2- and 8-byte elements */
  size_t sc = 513, tot = sc * (size_t)n;
  void *ds = dmalloc(sc * 8), *dr = dmalloc(tot * 8);
  uint16_t *hb = malloc(tot * 2);
  int64_t *hl = malloc(tot * 8);
  for (size_t i = 0; i < sc; i++) hb[i] = ref_bf16(hval(me, i)), hl[i] = lval(me, i);
  up(ds, hb, sc * 2);
  CHECK(ct_comm_all_gather(c, ds, dr, sc, CT_BF16) == CT_OK);
  size_t bad = 0;
  if (fetch(c, hb, dr, tot * 2))
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < sc; i++) bad += hb[(size_t)r * sc + i] != ref_bf16(hval(r, i));
  up(ds, hl, sc * 8);
  CHECK(ct_comm_all_gather(c, ds, dr, sc, CT_I64) == CT_OK);
  if (fetch(c, hl, dr, tot * 8))
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < sc; i++) bad += hl[(size_t)r * sc + i] != lval(r, i);
  CHECK_MSG(bad == 0, "all_gather bf16/i64: %zu wrong", bad);
  cudaFree(ds);
  cudaFree(dr);
  free(hb);
  free(hl);
}

/* Overlap mode (a split copy of the group): a collective on the side stream sees what the
 * compute stream wrote before the call; after ct_comm_join (or join_lagging past it) the compute
 * stream sees its result; the last `keep` collectives may still run. The first two go to the
 * lean communicator (2 CTAs, as DDP's overlapped buckets with parallel.overlap_ctas = 2), the
 * third to the full one, on the same side stream. */
static void test_overlap(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  ct_comm *g = NULL;
  CHECK_MSG(ct_comm_split(c, 0, me, &g) == CT_OK && g, "split: %s", ct_last_error());
  if (!g) return;
  CHECK_MSG(ct_comm_set_overlap(g, true) == CT_OK, "set_overlap: %s", ct_last_error());
  CHECK_MSG(ct_comm_make_lean(g, 2) == CT_OK, "make_lean: %s", ct_last_error());
  const size_t cnt = (size_t)1 << 22;
  float *d[3], *h = malloc(cnt * 4);
  for (int k = 0; k < 3; k++) d[k] = dmalloc(cnt * 4);
  for (size_t i = 0; i < cnt; i++) h[i] = fval(me, i);
  size_t bad = 0;
  for (int k = 0; k < 3; k++) { /* compute-stream writes, not waited for by the host */
    cudaError_t e = cudaMemcpyAsync(d[k], h, cnt * 4, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) die_cuda("upload", e);
    CHECK(ct_comm_use_lean(g, k < 2) == CT_OK);
    CHECK(ct_comm_all_reduce(g, d[k], cnt, CT_F32, CT_SUM) == CT_OK);
  }
  CHECK_MSG(ct_comm_join_lagging(g, 1) == CT_OK, "join_lagging: %s", ct_last_error());
  for (int k = 0; k < 2; k++) { /* read on the compute stream after the join */
    cudaError_t e = cudaMemcpyAsync(h, d[k], cnt * 4, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) die_cuda("download", e);
    for (size_t i = 0; i < cnt; i += 97) {
      float want = 0;
      for (int r = 0; r < n; r++) want += fval(r, i);
      bad += h[i] != want;
    }
  }
  if (fetch(g, h, d[2], cnt * 4))
    for (size_t i = 0; i < cnt; i += 97) {
      float want = 0;
      for (int r = 0; r < n; r++) want += fval(r, i);
      bad += h[i] != want;
    }
  CHECK_MSG(bad == 0, "overlap-mode all_reduce: %zu wrong values", bad);
  CHECK(ct_comm_set_overlap(g, false) == CT_OK);
  for (int k = 0; k < 3; k++) cudaFree(d[k]);
  free(h);
  ct_comm_destroy(g);
}

static void test_broadcast(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t counts[] = {1, 1000, 262147};
  float *d = dmalloc(262147 * 4), *h = malloc(262147 * 4);
  for (int root = 0; root < n; root++) {
    for (size_t ci = 0; ci < 3; ci++) {
      size_t cnt = counts[ci];
      for (size_t i = 0; i < cnt; i++) h[i] = me == root ? fval(root, i) * 3.0f : -1.0f;
      up(d, h, cnt * 4);
      CHECK_MSG(ct_comm_broadcast(c, d, cnt, CT_F32, root) == CT_OK, "%s", ct_last_error());
      size_t bad = 0;
      if (fetch(c, h, d, cnt * 4))
        for (size_t i = 0; i < cnt; i++) bad += h[i] != fval(root, i) * 3.0f;
      CHECK_MSG(bad == 0, "broadcast f32 root %d count %zu: %zu wrong", root, cnt, bad);
    }
    uint8_t b[13];
    int64_t l[5];
    for (int i = 0; i < 13; i++) b[i] = me == root ? bval(root, (size_t)i) : 0;
    for (int i = 0; i < 5; i++) l[i] = me == root ? lval(root, (size_t)i) : 0;
    void *db = dmalloc(13), *dl = dmalloc(5 * 8);
    up(db, b, 13);
    up(dl, l, 5 * 8);
    CHECK(ct_comm_broadcast(c, db, 13, CT_U8, root) == CT_OK);
    CHECK(ct_comm_broadcast(c, dl, 5, CT_I64, root) == CT_OK);
    int bad = 0;
    if (fetch(c, b, db, 13) && fetch(c, l, dl, 5 * 8)) {
      for (int i = 0; i < 13; i++) bad += b[i] != bval(root, (size_t)i);
      for (int i = 0; i < 5; i++) bad += l[i] != lval(root, (size_t)i);
    }
    CHECK_MSG(bad == 0, "broadcast u8/i64 root %d: %d wrong", root, bad);
    cudaFree(db);
    cudaFree(dl);
  }
  cudaFree(d);
  free(h);
}

/* Ranks arrive staggered and mark their arrival in the store; after the barrier every mark
 * must be there. */
static void test_barrier(ct_comm *c, ct_store *s) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  for (int round = 0; round < 2; round++) {
    sleep_ms(60 * ((me + round) % n));
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

/* ---- split ---- */

/* All-reduce (sum) and all-gather of one i32 per rank in `g`; returns false on a failure. */
static bool sum_gather(ct_comm *g, int32_t mine, int32_t *sum, int32_t *gathered) {
  int m = ct_comm_size(g);
  int32_t *d = dmalloc(sizeof(int32_t) * (size_t)(m + 1));
  up(d, &mine, 4);
  bool ok = ct_comm_all_reduce(g, d, 1, CT_I32, CT_SUM) == CT_OK && fetch(g, sum, d, 4);
  up(d + m, &mine, 4);
  ok = ok && ct_comm_all_gather(g, d + m, d, 1, CT_I32) == CT_OK &&
       fetch(g, gathered, d, sizeof(int32_t) * (size_t)m);
  CHECK_MSG(ok, "collective in split group '%s': %s", ct_comm_prefix(g), ct_last_error());
  cudaFree(d);
  return ok;
}

static void test_split(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  int32_t sum = 0, gathered[MAX_RANKS];

  /* singletons: color = rank */
  ct_comm *one = NULL;
  CHECK_MSG(ct_comm_split(c, me, 0, &one) == CT_OK, "%s", ct_last_error());
  if (one) {
    CHECK(ct_comm_size(one) == 1 && ct_comm_rank(one) == 0);
    CHECK(strcmp(ct_comm_backend(one), "nccl") == 0);
    if (sum_gather(one, 1000 + me, &sum, gathered))
      CHECK_MSG(sum == 1000 + me && gathered[0] == 1000 + me, "singleton: sum %d gathered %d",
                sum, gathered[0]);
    CHECK(ct_comm_barrier(one) == CT_OK);
  }

  /* parity, keys reversed: ordered by descending parent rank */
  ct_comm *sub = NULL;
  CHECK_MSG(ct_comm_split(c, me % 2, -me, &sub) == CT_OK, "%s", ct_last_error());
  int members[MAX_RANKS], m = 0, want_rank = -1;
  for (int r = n - 1; r >= 0; r--)
    if (r % 2 == me % 2) members[m++] = r;
  for (int j = 0; j < m; j++)
    if (members[j] == me) want_rank = j;
  if (sub) {
    CHECK(ct_comm_size(sub) == m);
    CHECK_MSG(ct_comm_rank(sub) == want_rank, "split rank %d, want %d", ct_comm_rank(sub), want_rank);
    int32_t want_sum = 0;
    for (int j = 0; j < m; j++) want_sum += members[j];
    if (sum_gather(sub, me, &sum, gathered)) {
      CHECK_MSG(sum == want_sum, "sum of parent ranks in group %d: %d, want %d", me % 2, sum, want_sum);
      int bad = 0;
      for (int j = 0; j < m; j++) bad += gathered[j] != members[j];
      CHECK_MSG(bad == 0, "all_gather in split group: not ordered by key");
    }
  }

  /* the parent still works, interleaved with its children */
  CHECK(sum_gather(c, 1, &sum, gathered) && sum == n);

  /* rank 1 joins no group; the rest keep parent order (equal keys) */
  ct_comm *sub2 = (ct_comm *)1;
  CHECK_MSG(ct_comm_split(c, me == 1 ? CT_COMM_NO_COLOR : 7, 0, &sub2) == CT_OK, "%s", ct_last_error());
  if (me == 1) {
    CHECK(sub2 == NULL);
  } else if (sub2) {
    CHECK(ct_comm_size(sub2) == n - 1);
    CHECK(ct_comm_rank(sub2) == (me == 0 ? 0 : me - 1));
    int32_t want_sum = 0;
    for (int r = 0; r < n; r++) want_sum += r == 1 ? 0 : r;
    if (sum_gather(sub2, me, &sum, gathered)) CHECK(sum == want_sum);
    ct_comm_destroy(sub2);
  }
  ct_comm_destroy(sub);
  ct_comm_destroy(one);
  CHECK_MSG(ct_comm_barrier(c) == CT_OK, "parent barrier after the splits: %s", ct_last_error());
}

/* ---- speed (nccl-tests style) ---- */

static void report(ct_comm *c, const char *what, size_t bytes, double t, double factor) {
  float tf = (float)t, *d = dmalloc(4);
  up(d, &tf, 4);
  CHECK(ct_comm_all_reduce(c, d, 1, CT_F32, CT_AVG) == CT_OK); /* average over ranks */
  fetch(c, &tf, d, 4);
  cudaFree(d);
  if (ct_comm_rank(c) == 0) {
    double algbw = (double)bytes / tf / 1e9;
    printf("[%s] %-14s %d ranks %8.1f MB %9.3f ms  algbw %7.2f GB/s  busbw %7.2f GB/s\n",
           scenario, what, ct_comm_size(c), bytes / 1e6, tf * 1e3, algbw, algbw * factor);
    fflush(stdout);
  }
}

static void test_speed(ct_comm *c) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t N = (256u << 20) / 4; /* 256 MiB of f32 */
  const int warm = 3, iters = 20;
  float *buf = dmalloc(N * 4), *out = dmalloc(N * 4), *h = malloc(N * 4);

  /* all_reduce; the first result is checked */
  for (size_t i = 0; i < N; i++) h[i] = fval(me, i);
  up(buf, h, N * 4);
  CHECK(ct_comm_all_reduce(c, buf, N, CT_F32, CT_SUM) == CT_OK);
  size_t bad = 0;
  if (fetch(c, h, buf, N * 4))
    for (size_t i = 0; i < N; i += 997) {
      float want;
      REDUCE(float, fval, n, i, CT_SUM, want);
      bad += h[i] != want;
    }
  CHECK_MSG(bad == 0, "all_reduce 256 MiB: %zu wrong", bad);
  for (int it = 0; it < warm; it++) CHECK(ct_comm_all_reduce(c, buf, N, CT_F32, CT_AVG) == CT_OK);
  CHECK(ct_comm_barrier(c) == CT_OK);
  double t0 = ct_now();
  for (int it = 0; it < iters; it++) CHECK(ct_comm_all_reduce(c, buf, N, CT_F32, CT_AVG) == CT_OK);
  CHECK(ct_comm_sync(c) == CT_OK);
  report(c, "all_reduce", N * 4, (ct_now() - t0) / iters, 2.0 * (n - 1) / n);

  /* reduce_scatter of 256 MiB in all */
  size_t rc = N / (size_t)n;
  for (size_t i = 0; i < rc * (size_t)n; i++) h[i] = fval(me, i);
  up(buf, h, rc * (size_t)n * 4);
  CHECK(ct_comm_reduce_scatter(c, buf, out, rc, CT_F32, CT_SUM) == CT_OK);
  bad = 0;
  if (fetch(c, h, out, rc * 4))
    for (size_t i = 0; i < rc; i += 991) {
      float want;
      REDUCE(float, fval, n, (size_t)me * rc + i, CT_SUM, want);
      bad += h[i] != want;
    }
  CHECK_MSG(bad == 0, "reduce_scatter 256 MiB: %zu wrong", bad);
  for (int it = 0; it < warm; it++) CHECK(ct_comm_reduce_scatter(c, buf, out, rc, CT_F32, CT_SUM) == CT_OK);
  CHECK(ct_comm_barrier(c) == CT_OK);
  t0 = ct_now();
  for (int it = 0; it < iters; it++) CHECK(ct_comm_reduce_scatter(c, buf, out, rc, CT_F32, CT_SUM) == CT_OK);
  CHECK(ct_comm_sync(c) == CT_OK);
  report(c, "reduce_scatter", rc * (size_t)n * 4, (ct_now() - t0) / iters, (double)(n - 1) / n);

  /* all_gather to 256 MiB in all */
  for (size_t i = 0; i < rc; i++) h[i] = gval(me, i);
  up(buf, h, rc * 4);
  CHECK(ct_comm_all_gather(c, buf, out, rc, CT_F32) == CT_OK);
  bad = 0;
  if (fetch(c, h, out, rc * (size_t)n * 4))
    for (size_t j = 0; j < rc * (size_t)n; j += 991) bad += h[j] != gval((int)(j / rc), j % rc);
  CHECK_MSG(bad == 0, "all_gather 256 MiB: %zu wrong", bad);
  for (int it = 0; it < warm; it++) CHECK(ct_comm_all_gather(c, buf, out, rc, CT_F32) == CT_OK);
  CHECK(ct_comm_barrier(c) == CT_OK);
  t0 = ct_now();
  for (int it = 0; it < iters; it++) CHECK(ct_comm_all_gather(c, buf, out, rc, CT_F32) == CT_OK);
  CHECK(ct_comm_sync(c) == CT_OK);
  report(c, "all_gather", rc * (size_t)n * 4, (ct_now() - t0) / iters, (double)(n - 1) / n);

  cudaFree(buf);
  cudaFree(out);
  free(h);
}

/* ---- scenarios (each runs in every child) ---- */

static void full_scenario(ct_store *s, int me, int n) {
  double t0 = ct_now();
  ct_comm *c = NULL;
  ct_status st = ct_comm_init_nccl(s, me, n, "t/world", 60.0, &c);
  CHECK_MSG(st == CT_OK, "init: %s", ct_last_error());
  if (st != CT_OK) return;
  if (me == 0) printf("[%s] NCCL init of %d ranks: %.0f ms\n", scenario, n, (ct_now() - t0) * 1e3);
  CHECK(ct_comm_rank(c) == me && ct_comm_size(c) == n);
  CHECK(strcmp(ct_comm_prefix(c), "t/world") == 0);
  if (me == 0) { /* rank 0 removed the unique id once everyone had joined */
    bool ex = true;
    CHECK(ct_store_check(s, "t/world/nccl_id", &ex) == CT_OK && !ex);
  }
  test_args(c);
  test_all_reduce(c);
  test_reduce_scatter(c);
  test_all_gather(c);
  test_broadcast(c);
  test_barrier(c, s);
  test_split(c);
  test_overlap(c);
  test_speed(c);
  t0 = ct_now();
  ct_comm_destroy(c);
  if (me == 0) printf("[%s] finalize + destroy: %.0f ms\n", scenario, (ct_now() - t0) * 1e3);
}

/* Rank 1 joins, takes part in a warm-up, then skips the next collective. Every other rank's
 * all_reduce + sync must fail with CT_ERR_RUNTIME after about the 5 s timeout. */
static void watchdog_scenario(ct_store *s, int me, int n) {
  const double timeout = 5.0;
  ct_comm *c = NULL;
  CHECK_MSG(ct_comm_init_nccl(s, me, n, "t/wd", timeout, &c) == CT_OK, "%s", ct_last_error());
  if (!c) return;
  float zeros[1000] = {0}, *d = dmalloc(sizeof zeros);
  up(d, zeros, sizeof zeros);
  /* warm-up of the same shape: NCCL's connections exist, so the wait below is the watchdog's */
  CHECK_MSG(ct_comm_all_reduce(c, d, 1000, CT_F32, CT_SUM) == CT_OK, "%s", ct_last_error());
  CHECK_MSG(ct_comm_sync(c) == CT_OK, "%s", ct_last_error());
  CHECK_MSG(ct_comm_barrier(c) == CT_OK, "%s", ct_last_error());
  char key[64];
  if (me == 1) {
    for (int r = 0; r < n; r++) { /* wait until every other rank has seen its failure */
      if (r == 1) continue;
      void *v = NULL;
      snprintf(key, sizeof key, "t/wd/failed/%d", r);
      CHECK_MSG(ct_store_get(s, key, 30.0, &v, NULL) == CT_OK, "%s", ct_last_error());
      free(v);
    }
    double t0 = ct_now();
    ct_comm_destroy(c); /* its peers are gone: finalize is bounded by the timeout too */
    printf("[%s] rank 1 (the one that skipped): destroy after its peers aborted took %.2f s\n",
           scenario, ct_now() - t0);
    cudaFree(d);
    return;
  }
  double t0 = ct_now();
  const char *where = "all_reduce";
  ct_status st = ct_comm_all_reduce(c, d, 1000, CT_F32, CT_SUM);
  if (st == CT_OK) {
    where = "ct_comm_sync";
    st = ct_comm_sync(c);
  }
  double dt = ct_now() - t0;
  CHECK_MSG(st == CT_ERR_RUNTIME, "a skipped collective gave status %d: %s", (int)st, ct_last_error());
  char want[32];
  snprintf(want, sizeof want, "rank %d of %d", me, n);
  CHECK_MSG(strstr(ct_last_error(), want) && strstr(ct_last_error(), "all_reduce") &&
            strstr(ct_last_error(), "5.0 s"),
            "the error does not name the collective, the rank and the timeout: %s", ct_last_error());
  CHECK_MSG(dt >= timeout - 0.5 && dt < timeout + 3.0, "failed after %.2f s (timeout %.0f s)", dt, timeout);
  if (me == 0)
    printf("[%s] rank 1 skipped a collective -> %s failed after %.2f s: %s\n", scenario, where,
           dt, ct_last_error());
  t0 = ct_now();
  CHECK(ct_comm_barrier(c) != CT_OK);
  CHECK_MSG(strstr(ct_last_error(), "unusable") != NULL, "%s", ct_last_error());
  CHECK(ct_now() - t0 < 0.1);
  snprintf(key, sizeof key, "t/wd/failed/%d", me);
  CHECK(ct_store_set(s, key, "1", 1) == CT_OK);
  ct_comm_destroy(c);
  cudaFree(d);
}

/* ---- the copy-engine all-reduce (parallel/comm_ce.c) ---- */

/* Random-looking values of varied magnitude (exponents over 2^-12 .. 2^11), per rank and round. */
static float rval(int rank, int round, size_t i) {
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull +
               (uint64_t)round * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E9F2C1B5A3E7F1ull;
  x ^= x >> 29;
  float m = (float)((x >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
  return ldexpf(m, (int)((x >> 8) % 24) - 12);
}

/* Buckets of a buffer that starts 384 bytes into its allocation (the IPC handle is the
 * allocation's, so the offset must be carried): an unaligned offset (scalar adds), a gap left
 * alone, a bucket of 1 element (empty chunks past the first), a large aligned one. For f32 and
 * bf16, three rounds (the flags' sequence numbers grow) of the ce all-reduce against NCCL's
 * all-reduce of the same data: with 2 ranks bit-equal (ncclAvg is x/2 + y/2 in either order,
 * rounded once, as here); with more, within 2 ulps of the operand scale (the sum orders differ).
 * One round runs in overlap mode on the side stream, as DDP does; one uses CT_SUM. */
static void ce_case(ct_comm *c, ct_dtype dt) {
  int me = ct_comm_rank(c), n = ct_comm_size(c);
  const size_t es = ct_dtype_size(dt), pad = 384 / es;
  const ct_comm_ce_bucket bk[] = {{0, 1000003}, {1000008, 7}, {1000015, 1}, {1000016, 3u << 20}};
  const int nb = 4;
  const size_t count = 1000016 + (3u << 20) + 40; /* 40 elements past the last bucket */
  char *alloc = dmalloc((count + pad) * es), *ref = dmalloc(count * es);
  char *buf = alloc + pad * es;
  char why[256] = "";
  ct_comm_ce *ce = NULL;
  ct_status st = ct_comm_ce_create(c, buf, count, dt, bk, nb, &ce, why, sizeof why);
  CHECK_MSG(st == CT_OK, "ct_comm_ce_create: %s", ct_last_error());
  CHECK_MSG(ce != NULL, "the ce all-reduce does not apply on this machine: %s", why);
  if (!ce) {
    cudaFree(alloc);
    cudaFree(ref);
    return;
  }
  CHECK(ct_comm_ce_find(ce, 1000008, 7) == 1 && ct_comm_ce_find(ce, 1000008, 8) == -1);
  float *hf = malloc(count * sizeof(float));
  char *h = malloc(count * es), *a = malloc(count * es), *r = malloc(count * es);
  size_t bad = 0, diff = 0, gap = 0;
  double worst = 0;
  for (int round = 0; round < 3; round++) {
    const ct_redop op = round == 1 ? CT_SUM : CT_AVG;
    for (size_t i = 0; i < count; i++) {
      hf[i] = rval(me, round, i);
      if (dt == CT_BF16) ((uint16_t *)h)[i] = ref_bf16(hf[i]);
      else ((float *)h)[i] = hf[i];
    }
    up(buf, h, count * es);
    up(ref, h, count * es);
    if (round == 2) CHECK(ct_comm_set_overlap(c, true) == CT_OK);
    for (int b = 0; b < nb; b++) {
      CHECK_MSG(ct_comm_ce_all_reduce(c, ce, b, op) == CT_OK, "ce all_reduce: %s", ct_last_error());
      CHECK_MSG(ct_comm_all_reduce(c, ref + bk[b].offset * es, bk[b].count, dt, op) == CT_OK,
                "all_reduce: %s", ct_last_error());
    }
    CHECK_MSG(ct_comm_ce_finish(c, ce) == CT_OK, "ce finish: %s", ct_last_error());
    if (round == 2) CHECK(ct_comm_set_overlap(c, false) == CT_OK);
    if (!fetch(c, a, buf, count * es) || !fetch(c, r, ref, count * es)) break;
    for (int b = 0; b < nb; b++)
      for (size_t i = bk[b].offset; i < bk[b].offset + bk[b].count; i++) {
        float x = dt == CT_BF16 ? bf16_f(((uint16_t *)a)[i]) : ((float *)a)[i];
        float y = dt == CT_BF16 ? bf16_f(((uint16_t *)r)[i]) : ((float *)r)[i];
        if (memcmp(a + i * es, r + i * es, es)) diff++;
        /* more than 2 ranks: ulps of the largest operand (the sum orders differ) */
        double scale = 0;
        for (int k = 0; k < n; k++) scale = fmax(scale, fabs((double)rval(k, round, i)));
        double ulp = scale * (dt == CT_BF16 ? 0x1p-7 : 0x1p-23), err = fabs((double)x - y);
        if (!(err <= 2 * ulp * (op == CT_AVG ? 1 : n))) bad++;
        if (ulp > 0 && err / ulp > worst) worst = err / ulp;
      }
    for (size_t i = 1000003; i < 1000008; i++) gap += memcmp(a + i * es, h + i * es, es) != 0;
    for (size_t i = count - 40; i < count; i++) gap += memcmp(a + i * es, h + i * es, es) != 0;
  }
  CHECK_MSG(bad == 0, "ce all_reduce (%s): %zu values off NCCL's by more than 2 ulps (worst %.1f)",
            ct_dtype_name(dt), bad, worst);
  CHECK_MSG(n > 2 || diff == 0, "ce all_reduce (%s), 2 ranks: %zu values differ from NCCL's in "
            "their bits", ct_dtype_name(dt), diff);
  CHECK_MSG(gap == 0, "ce all_reduce (%s): %zu elements outside the buckets changed",
            ct_dtype_name(dt), gap);
  if (me == 0)
    printf("[%s] ce all_reduce %s, %d ranks, 3 rounds: %zu of %zu values differ from NCCL's bits "
           "(worst %.2f ulp)\n", scenario, ct_dtype_name(dt), n, diff, (size_t)3 * (count - 45),
           worst);
  /* speed of one 25 MiB bucket against NCCL's (not asserted) */
  if (dt == CT_F32) {
    for (int k = 0; k < 2; k++) {
      double t0 = 0;
      for (int it = 0; it < 23; it++) {
        if (it == 3) {
          CHECK(ct_comm_sync(c) == CT_OK);
          t0 = ct_now();
        }
        if (k) CHECK(ct_comm_ce_all_reduce(c, ce, 3, CT_AVG) == CT_OK);
        else CHECK(ct_comm_all_reduce(c, ref + bk[3].offset * es, bk[3].count, dt, CT_AVG) == CT_OK);
      }
      CHECK(ct_comm_ce_finish(c, ce) == CT_OK);
      CHECK(ct_comm_sync(c) == CT_OK);
      if (me == 0)
        printf("[%s] %s all_reduce of %zu MiB f32: %.1f us\n", scenario, k ? "ce" : "nccl",
               bk[3].count * es >> 20, (ct_now() - t0) / 20 * 1e6);
    }
  }
  ct_comm_ce_destroy(ce);
  free(hf);
  free(h);
  free(a);
  free(r);
  cudaFree(alloc);
  cudaFree(ref);
}

static void ce_scenario(ct_store *s, int me, int n) {
  ct_comm *c = NULL;
  CHECK_MSG(ct_comm_init_nccl(s, me, n, "t/ce", 60.0, &c) == CT_OK, "%s", ct_last_error());
  if (!c) return;
  ce_case(c, CT_F32);
  ce_case(c, CT_BF16);
  ct_comm_destroy(c);
}

/* Rank 1 skips a ce all-reduce: every other rank's ct_comm_sync fails after the 5 s timeout
 * naming it (the stream waits on a flag that never comes), and destroying the ce state and the
 * group afterwards does not hang (the abort released the waits). */
static void ce_watchdog_scenario(ct_store *s, int me, int n) {
  const double timeout = 5.0;
  ct_comm *c = NULL;
  CHECK_MSG(ct_comm_init_nccl(s, me, n, "t/cewd", timeout, &c) == CT_OK, "%s", ct_last_error());
  if (!c) return;
  float *d = dmalloc(4096 * sizeof(float));
  ct_comm_ce_bucket bk[1] = {{0, 4096}};
  ct_comm_ce *ce = NULL;
  char why[256] = "";
  CHECK_MSG(ct_comm_ce_create(c, d, 4096, CT_F32, bk, 1, &ce, why, sizeof why) == CT_OK && ce,
            "ct_comm_ce_create: %s %s", ct_last_error(), why);
  if (!ce) return;
  CHECK_MSG(ct_comm_ce_all_reduce(c, ce, 0, CT_SUM) == CT_OK, "%s", ct_last_error());
  CHECK_MSG(ct_comm_ce_finish(c, ce) == CT_OK, "%s", ct_last_error());
  CHECK_MSG(ct_comm_sync(c) == CT_OK, "%s", ct_last_error());
  CHECK_MSG(ct_comm_barrier(c) == CT_OK, "%s", ct_last_error());
  char key[64];
  if (me == 1) {
    for (int r = 0; r < n; r++) {
      if (r == 1) continue;
      void *v = NULL;
      snprintf(key, sizeof key, "t/cewd/failed/%d", r);
      CHECK_MSG(ct_store_get(s, key, 30.0, &v, NULL) == CT_OK, "%s", ct_last_error());
      free(v);
    }
  } else {
    double t0 = ct_now();
    ct_status st = ct_comm_ce_all_reduce(c, ce, 0, CT_SUM);
    if (st == CT_OK) st = ct_comm_ce_finish(c, ce);
    if (st == CT_OK) st = ct_comm_sync(c);
    double dt = ct_now() - t0;
    CHECK_MSG(st == CT_ERR_RUNTIME && strstr(ct_last_error(), "ce all_reduce") &&
              strstr(ct_last_error(), "5.0 s"), "a skipped ce all-reduce gave status %d: %s",
              (int)st, ct_last_error());
    CHECK_MSG(dt >= timeout - 0.5 && dt < timeout + 3.0, "failed after %.2f s", dt);
    if (me == 0) printf("[%s] rank 1 skipped a ce all-reduce -> failed after %.2f s: %s\n", scenario, dt, ct_last_error());
    snprintf(key, sizeof key, "t/cewd/failed/%d", me);
    CHECK(ct_store_set(s, key, "1", 1) == CT_OK);
  }
  double t0 = ct_now();
  ct_comm_ce_destroy(ce);
  ct_comm_destroy(c);
  cudaError_t e = cudaFree(d);
  CHECK_MSG(e == cudaSuccess && ct_now() - t0 < timeout + 8.0, "cleanup: %s after %.1f s",
            cudaGetErrorString(e), ct_now() - t0);
}

/* ---- the parent: device probe, store server, fork, reap ---- */

/* Counts the devices in a child: CUDA must not be initialized in the parent before fork. */
static int probe_devices(void) {
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    int n = ct_cuda_device_count();
    _exit(n > 200 ? 200 : n < 0 ? 0 : n);
  }
  int status = 0;
  if (p < 0 || waitpid(p, &status, 0) != p || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

typedef void (*scenario_fn)(ct_store *s, int rank, int world);

static void child_main(scenario_fn fn, int rank, int world, double limit_s) {
  ct_test_checks = ct_test_failed = 0;
  alarm((unsigned)limit_s + 5); /* a hung child dies; the parent reports the signal */
  char err[256];
  if (ct_cuda_init(rank, err, sizeof err) != 0) {
    fprintf(stderr, "[%s rank %d] ct_cuda_init(%d): %s\n", scenario, rank, rank, err);
    fflush(stderr);
    _exit(3);
  }
  stream = (cudaStream_t)ct_cuda_stream();
  ct_store *s = NULL;
  if (ct_store_connect("127.0.0.1", store_port, TOKEN, 10.0, &s) != CT_OK) {
    fprintf(stderr, "[%s rank %d] store connect: %s\n", scenario, rank, ct_last_error());
    fflush(stderr);
    _exit(3);
  }
  fn(s, rank, world);
  ct_store_close(s);
  ct_cuda_shutdown();
  if (ct_test_failed)
    fprintf(stderr, "[%s rank %d] %d of %d checks failed\n", scenario, rank, ct_test_failed, ct_test_checks);
  else if (rank == 0)
    printf("[%s] rank 0: %d checks passed\n", scenario, ct_test_checks);
  fflush(stdout);
  fflush(stderr);
  _exit(ct_test_failed ? 1 : 0);
}

static bool run_scenario(const char *name, scenario_fn fn, int world, double limit_s) {
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
  int started = world;
  for (int r = 0; r < world; r++) {
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
  while (left > 0 && ct_now() - t0 < limit_s + 10) {
    for (int r = 0; r < started; r++) {
      if (done[r]) continue;
      if (waitpid(pids[r], &status[r], WNOHANG) == pids[r]) done[r] = true, left--;
    }
    if (left) sleep_ms(10);
  }
  bool ok = started == world;
  for (int r = 0; r < started; r++) {
    if (!done[r]) {
      fprintf(stderr, "[%s] rank %d hung for %.0f s: killed\n", name, r, limit_s + 10);
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
  setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast stays off unless the caller says */
  int ndev = probe_devices();
  if (ndev < 2) {
    printf("test_comm_nccl: skipped: %d CUDA device(s) visible, 2 needed\n", ndev);
    return 77;
  }
  int world = ndev > MAX_RANKS ? MAX_RANKS : ndev;
  printf("test_comm_nccl: %d CUDA devices, %d ranks\n", ndev, world);
  run_scenario("full", full_scenario, world, 300.0);
  run_scenario("watchdog", watchdog_scenario, world, 60.0);
  run_scenario("ce", ce_scenario, world, 120.0);
  run_scenario("ce_watchdog", ce_watchdog_scenario, world, 60.0);
  return ct_test_finish();
}

#endif /* CT_HAVE_NCCL */
