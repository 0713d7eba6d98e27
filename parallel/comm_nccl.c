/* parallel/comm_nccl.c — the NCCL backend of parallel/comm.h (GPU buffers, one GPU per process).
 *
 * Lifecycle, NCCL's own (REFERENCE.md):
 *   rank 0 ncclGetUniqueId -> store "<prefix>/nccl_id" -> the others get it (timeout_s)
 *   -> ncclCommInitRankConfig(blocking = 0) on the device ct_cuda_init selected, polled with
 *      ncclCommGetAsyncError until ready or timeout_s
 *   -> collectives queued on ct_cuda_stream() (the stream every CUDA op runs on)
 *   -> ncclCommSplit for sub-groups (comm.c's split_all hook: every parent rank takes part)
 *   -> ncclCommFinalize (polled) -> ncclCommDestroy; ncclCommAbort on any failure.
 *
 * Non-blocking communicators: any NCCL call may return ncclInProgress (init, split, finalize,
 * and a collective whose connections NCCL sets up lazily on first use). Then no other call may
 * touch the communicator until ncclCommGetAsyncError leaves ncclInProgress; wait_ready polls for
 * that with the group's deadline, so a peer that never comes is an error, not a hang.
 *
 * Watchdog: NCCL never times out a collective by itself. After every collective an event is
 * recorded on the stream (a ring of RING events remembers which collective each one follows).
 * The host waits that must happen (ct_comm_sync, ct_comm_barrier, destroy) poll cudaEventQuery
 * and ncclCommGetAsyncError against the deadline; on expiry the communicator is aborted, which
 * also makes the stuck kernel return, and the error names the first unfinished collective, the
 * rank and the seconds waited. There is no background thread: a host that waits on the stream
 * some other way (cudaStreamSynchronize) before ct_comm_sync is not protected (comm.h says so).
 *
 * Costs, stated openly: every collective checks its buffers with cudaPointerGetAttributes (about
 * a microsecond; a host pointer would otherwise be an illegal-address fault that kills the CUDA
 * context) and records one event. RING events per group are created up front.
 */
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/log.h"
#include "common/util.h"
#include "kernels/cuda/ops_cuda.h"
#include "parallel/comm.h"
#include "parallel/store.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the NCCL backend needs NCCL >= 2.18 (ncclCommSplit, non-blocking init, ncclCommFinalize)"
#endif

#define RING 64 /* collectives remembered for the watchdog's message */

typedef struct pending {
  cudaEvent_t ev;
  uint64_t seq;  /* 1-based number of the collective in this group */
  char what[96]; /* "all_reduce (f32 sum, 1000 elements)" */
} pending;

/* CT_COMM_TRACE=1 (a measurement, off by default): where the collectives overlapped with a
 * backward sit in time. For each collective queued while overlapping, timing events at the
 * compute-stream point it follows (ready), where the side stream reaches it (start) and after it
 * (end); ct_comm_join closes a batch with a compute-stream event (the join: for ddp the end of
 * backward, after the last bucket was queued). A batch is read at the next join (the host has
 * waited on the stream since), and batches of 3 or more collectives after the first 3 are summed:
 * the last 8 collectives' ready / start / end times from the join, how long the side stream was
 * busy and the longest wait of a collective for it. Printed to stderr when the group is
 * destroyed, one block per rank. */
#define TRACE_LAST 8
typedef struct trace_rec {
  cudaEvent_t ready, start, end;
  double host; /* when the host queued it (ct_now) */
} trace_rec;
typedef struct ctrace {
  trace_rec rec[RING];
  cudaEvent_t join[2];     /* the pending batch's join point ([cur ^ 1]) and this one's */
  int cur;
  double join_host[2];     /* when the host reached those joins */
  uint64_t from, to;       /* its collectives: seq from + 1 .. to */
  bool pending;
  uint64_t open_from;      /* the collectives since the last join start after this seq */
  int seen;                /* batches of 3 or more read */
  int summed;              /* of them, summed below */
  double ready[TRACE_LAST], start[TRACE_LAST], end[TRACE_LAST], host[TRACE_LAST];
  int count[TRACE_LAST];
  double busy, lag, colls;
} ctrace;

typedef struct ngroup {
  ncclComm_t comm; /* NULL once aborted or destroyed */
  int rank, size, device;
  double timeout_s;
  char *prefix;
  cudaStream_t stream;    /* where collectives are queued: compute, or side while overlapping */
  cudaStream_t compute;   /* ct_cuda_stream() */
  cudaStream_t side;      /* created on the first ct_comm_set_overlap(on) */
  cudaEvent_t fence;      /* compute-stream point a side-stream collective waits for */
  bool overlap;
  int32_t *one;           /* one device int: the barrier's all-reduce */
  ncclComm_t nocolor_out; /* where a CT_COMM_NO_COLOR split lets NCCL write (stays NULL) */
  ncclComm_t lean;        /* the same ranks limited to few CTAs (ct_comm_make_lean), or NULL */
  struct {                /* ct_comm_register: handles in the main and the lean communicator */
    void *main, *lean;
  } reg[8];
  int nreg;
  bool use_lean;          /* the next collectives go to `lean` (ct_comm_use_lean) */
  void (*abort_hook)(void *ctx); /* the copy-engine all-reduce's (ct_comm_nccl_set_abort_hook) */
  void *abort_ctx;
  pending ring[RING];
  ctrace *tr;             /* CT_COMM_TRACE=1, or NULL */
  int nev;                /* events created */
  uint64_t issued, done;  /* collectives queued; the first `done` are known complete */
} ngroup;

/* ---- errors: "nccl <what> failed on rank r of n (group 'p'): ..." (as the Gloo adapter) ---- */

static ct_status fail(const ngroup *g, const char *what, ct_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ct_status fail(const ngroup *g, const char *what, ct_status st, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ct_set_error(st, "nccl %s failed on rank %d of %d (group '%s'): %s", what, g->rank,
                      g->size, g->prefix, msg);
}

/* Aborts the communicator (the group is dropped either way) and returns a suffix for the
 * message saying how that went ("" when there was none yet). */
static const char *abort_comm(ngroup *g) {
  if (g->abort_hook) { /* releases the copy-engine all-reduce's stream waits (comm_ce.c) */
    void (*fn)(void *) = g->abort_hook;
    g->abort_hook = NULL;
    fn(g->abort_ctx);
  }
  if (g->lean) { /* queued on the same stream as the main communicator's collectives */
    (void)ncclCommAbort(g->lean);
    g->lean = NULL;
  }
  if (!g->comm) return "";
  ncclResult_t r = ncclCommAbort(g->comm);
  g->comm = NULL;
  return r == ncclSuccess ? "; communicator aborted" : "; ncclCommAbort failed too";
}

/* NCCL's own detail for the message; it may belong to an earlier call (NCCL's caveat), so it is
 * labeled as such. */
static const char *nccl_detail(const ngroup *g) {
  const char *s = ncclGetLastError(g->comm);
  return s ? s : "";
}

static ct_status nccl_fail(ngroup *g, const char *what, const char *call, ncclResult_t r) {
  char detail[384];
  snprintf(detail, sizeof detail, "%s", nccl_detail(g));
  const char *ab = abort_comm(g);
  return fail(g, what, CT_ERR_RUNTIME, "%s: %s%s%s%s (NCCL_DEBUG=WARN shows more)%s", call,
              ncclGetErrorString(r), *detail ? " [NCCL's last message: " : "", detail,
              *detail ? "]" : "", ab);
}

static ct_status cuda_fail(ngroup *g, const char *what, const char *call, cudaError_t e) {
  const char *ab = abort_comm(g);
  return fail(g, what, CT_ERR_RUNTIME, "%s: %s%s", call, cudaGetErrorString(e), ab);
}

/* How a bounded wait passes time between polls. For its first 2 s it only yields the CPU: the
 * host usually waits for a whole backward pass here, and a sleeping host wakes late (a 0.5 ms
 * pause left the GPU idle for 0.25 ms per step on average). Past 2 s something is slow or stuck:
 * sleep with a growing pause capped at 0.5 ms, so the deadline is still checked often and a long
 * wait costs little CPU. */
static void backoff(int *n, double waited) {
  int k = (*n)++;
  if (waited < 2.0) {
    sched_yield();
    return;
  }
  long us = k < 200 ? 20 : k < 400 ? 100 : 500;
  struct timespec ts = {0, us * 1000L};
  nanosleep(&ts, NULL);
}

/* Polls `comm` (this group's, or a new one during split) until it leaves ncclInProgress. On an
 * error or once timeout_s has passed since t0, aborts this group's communicator. */
static ct_status wait_ready(ngroup *g, ncclComm_t comm, const char *what, const char *call,
                            double t0) {
  for (int spins = 0;;) {
    ncclResult_t a = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &a);
    if (r != ncclSuccess) return nccl_fail(g, what, "ncclCommGetAsyncError", r);
    if (a == ncclSuccess) return CT_OK;
    if (a != ncclInProgress) return nccl_fail(g, what, call, a);
    double waited = ct_now() - t0;
    if (waited > g->timeout_s) {
      const char *ab = abort_comm(g);
      return fail(g, what, CT_ERR_RUNTIME, "%s did not complete within the timeout of %.1f s "
                  "(waited %.1f s): a rank did not take part or died%s", call, g->timeout_s,
                  waited, ab);
    }
    backoff(&spins, waited);
  }
}

/* A cheap look for an asynchronous error (a peer died, a network error) before queuing more. */
static ct_status check_async(ngroup *g, const char *what) {
  if (!g->comm)
    return fail(g, what, CT_ERR_RUNTIME, "the communicator was aborted by an earlier failure");
  ncclResult_t a = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(g->comm, &a);
  if (r != ncclSuccess) return nccl_fail(g, what, "ncclCommGetAsyncError", r);
  if (a != ncclSuccess && a != ncclInProgress)
    return nccl_fail(g, what, "asynchronous error from an earlier collective", a);
  if (g->lean) {
    r = ncclCommGetAsyncError(g->lean, &a);
    if (r != ncclSuccess) return nccl_fail(g, what, "ncclCommGetAsyncError (lean)", r);
    if (a != ncclSuccess && a != ncclInProgress)
      return nccl_fail(g, what, "asynchronous error from an earlier lean collective", a);
  }
  return CT_OK;
}

/* The communicator the next collective goes to. */
static ncclComm_t cur(const ngroup *g) { return g->use_lean && g->lean ? g->lean : g->comm; }

/* ---- the group ---- */

static void trace_free(ctrace *t) {
  if (!t) return;
  for (int i = 0; i < RING; i++) {
    if (t->rec[i].ready) cudaEventDestroy(t->rec[i].ready);
    if (t->rec[i].start) cudaEventDestroy(t->rec[i].start);
    if (t->rec[i].end) cudaEventDestroy(t->rec[i].end);
  }
  for (int i = 0; i < 2; i++)
    if (t->join[i]) cudaEventDestroy(t->join[i]);
  free(t);
}

/* The tracer's events (timing ones); NULL where any cannot be made (tracing is then off). */
static ctrace *trace_new(void) {
  ctrace *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  bool ok = cudaEventCreate(&t->join[0]) == cudaSuccess && cudaEventCreate(&t->join[1]) == cudaSuccess;
  for (int i = 0; ok && i < RING; i++)
    ok = cudaEventCreate(&t->rec[i].ready) == cudaSuccess &&
         cudaEventCreate(&t->rec[i].start) == cudaSuccess &&
         cudaEventCreate(&t->rec[i].end) == cudaSuccess;
  if (!ok) {
    cudaGetLastError();
    trace_free(t);
    return NULL;
  }
  return t;
}

/* Milliseconds from a to b (both complete). */
static double trace_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return ms;
}

/* Adds the pending batch to the sums (its events are complete by the next join). */
static void trace_read(ctrace *t) {
  const uint64_t n = t->to - t->from;
  if (!t->pending || n < 3 || n > RING) return;
  if (++t->seen <= 3) return; /* warm-up */
  /* times from the batch's first ready point, which precedes every other event */
  cudaEvent_t a = t->rec[t->from % RING].ready;
  const double j = trace_ms(a, t->join[t->cur ^ 1]);
  double busy = 0, lag = 0;
  for (uint64_t s = t->from; s < t->to; s++) {
    const trace_rec *r = &t->rec[s % RING];
    const double rd = trace_ms(a, r->ready), st = trace_ms(a, r->start), en = trace_ms(a, r->end);
    busy += en - st;
    if (st - rd > lag) lag = st - rd;
    const uint64_t k = t->to - 1 - s; /* 0: the last */
    if (k < TRACE_LAST) {
      t->ready[k] += rd - j;
      t->start[k] += st - j;
      t->end[k] += en - j;
      t->host[k] += (r->host - t->join_host[t->cur ^ 1]) * 1e3;
      t->count[k]++;
    }
  }
  t->busy += busy;
  t->lag += lag;
  t->colls += (double)n;
  t->summed++;
}

static void trace_print(const ngroup *g) {
  const ctrace *t = g->tr;
  if (!t || !t->summed) return;
  const double n = t->summed;
  fprintf(stderr, "comm trace (rank %d of %d, group '%s'): %d batches of %.1f collectives; side"
          " stream busy %.3f ms a batch, a collective's longest wait for it %.3f ms (mean)\n",
          g->rank, g->size, g->prefix, t->summed, t->colls / n, t->busy / n, t->lag / n);
  fprintf(stderr, "  ms from the join (mean): collective  ready  start  end  host (queued)\n");
  for (int k = TRACE_LAST - 1; k >= 0; k--)
    if (t->count[k])
      fprintf(stderr, "    last-%d  %8.3f %8.3f %8.3f %8.3f\n", k, t->ready[k] / t->count[k],
              t->start[k] / t->count[k], t->end[k] / t->count[k], t->host[k] / t->count[k]);
}

static void group_free(ngroup *g) {
  if (!g) return;
  trace_free(g->tr);
  for (int i = 0; i < g->nev; i++) cudaEventDestroy(g->ring[i].ev);
  if (g->fence) cudaEventDestroy(g->fence);
  if (g->side) cudaStreamDestroy(g->side);
  if (g->one) cudaFree(g->one);
  free(g->prefix);
  free(g);
}

/* A group's host-side state on the current device; the communicator comes later. */
static ct_status group_new(int rank, int size, const char *prefix, double timeout_s,
                           ngroup **out) {
  *out = NULL;
  ngroup *g = ct_calloc(1, sizeof *g, "nccl group");
  if (!g) return CT_ERR_NOMEM;
  g->rank = rank;
  g->size = size;
  g->timeout_s = timeout_s;
  g->prefix = ct_strdup(prefix);
  if (!g->prefix) {
    free(g);
    return ct_set_error(CT_ERR_NOMEM, "nccl group '%s': out of memory", prefix);
  }
  g->stream = g->compute = (cudaStream_t)ct_cuda_stream();
  ct_status st = CT_OK;
  if (!g->stream) {
    st = fail(g, "init", CT_ERR_USAGE, "the CUDA backend is not initialized: call "
              "ct_cuda_init(device) first (it selects the GPU and makes the stream NCCL uses)");
    goto bad;
  }
  cudaError_t e = cudaGetDevice(&g->device);
  if (e != cudaSuccess) {
    st = cuda_fail(g, "init", "cudaGetDevice", e);
    goto bad;
  }
  const char *tr = getenv("CT_COMM_TRACE");
  if (tr && !strcmp(tr, "1")) g->tr = trace_new();
  for (; g->nev < RING; g->nev++) {
    e = cudaEventCreateWithFlags(&g->ring[g->nev].ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      st = cuda_fail(g, "init", "cudaEventCreateWithFlags", e);
      goto bad;
    }
  }
  if ((e = cudaMalloc((void **)&g->one, sizeof *g->one)) != cudaSuccess) {
    g->one = NULL;
    st = cuda_fail(g, "init", "cudaMalloc (4 bytes for the barrier)", e);
    goto bad;
  }
  if ((e = cudaMemsetAsync(g->one, 0, sizeof *g->one, g->stream)) != cudaSuccess) {
    st = cuda_fail(g, "init", "cudaMemsetAsync", e);
    goto bad;
  }
  *out = g;
  return CT_OK;
bad:
  group_free(g);
  return st;
}

/* CT_NCCL_CTA_POLICY=0|1|2 (NCCL >= 2.27: default, efficiency, zero-CTA) asks NCCL to run its
 * kernels on fewer multiprocessors, for comparing how much the all-reduces overlapped with
 * backward slow its GEMMs down (bench/ddp_probe.sh). */
static ncclConfig_t nonblocking_config(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
#if defined(NCCL_CTA_POLICY_EFFICIENCY)
  const char *pol = getenv("CT_NCCL_CTA_POLICY");
  if (pol && *pol) cfg.CTAPolicy = atoi(pol);
#endif
  return cfg;
}

ct_status ct_comm_nccl_create(ct_store *store, int rank, int world, const char *prefix,
                              double timeout_s, void **impl) {
  *impl = NULL;
  ngroup *g;
  CT_TRY(group_new(rank, world, prefix, timeout_s, &g));
  ct_status st = CT_OK;
  ncclUniqueId id;
  ncclConfig_t cfg = nonblocking_config();
  ncclResult_t r;
  double t0;
  size_t klen = strlen(prefix) + 16;
  char *key = ct_malloc(klen, "store key");
  if (!key) {
    group_free(g);
    return CT_ERR_NOMEM;
  }
  snprintf(key, klen, "%s/nccl_id", prefix);

  /* The unique id, out of band through the store. */
  if (rank == 0) {
    r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      st = nccl_fail(g, "init", "ncclGetUniqueId", r);
      goto done;
    }
    if ((st = ct_store_set(store, key, &id, sizeof id)) != CT_OK) {
      ct_add_context(st, "nccl init failed on rank 0 of %d (group '%s'): publishing the unique "
                     "id: ", world, prefix);
      goto done;
    }
  } else {
    void *v = NULL;
    size_t len = 0;
    if ((st = ct_store_get(store, key, timeout_s, &v, &len)) != CT_OK) {
      ct_add_context(st, "nccl init failed on rank %d of %d (group '%s'): waiting for rank 0's "
                     "unique id: ", rank, world, prefix);
      goto done;
    }
    if (len != sizeof id) {
      free(v);
      st = fail(g, "init", CT_ERR_RUNTIME, "store key %s holds %zu bytes, not a %zu-byte NCCL "
                "unique id", key, len, sizeof id);
      goto done;
    }
    memcpy(&id, v, sizeof id);
    free(v);
  }

  /* Non-blocking init: returns at once (ncclInProgress) and connects in the background. */
  t0 = ct_now();
  r = ncclCommInitRankConfig(&g->comm, world, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    st = nccl_fail(g, "init", "ncclCommInitRankConfig", r);
    goto done;
  }
  if (!g->comm) {
    st = fail(g, "init", CT_ERR_RUNTIME, "ncclCommInitRankConfig returned no communicator");
    goto done;
  }
  if ((st = wait_ready(g, g->comm, "init", "ncclCommInitRankConfig", t0)) != CT_OK) goto done;
  /* Every rank has joined, so every rank has read the id: rank 0 removes it. */
  if (rank == 0) ct_store_delete(store, key, NULL);

done:
  free(key);
  if (st != CT_OK) {
    abort_comm(g);
    group_free(g);
    return st;
  }
  *impl = g;
  return CT_OK;
}

/* ---- collectives ---- */

static ncclDataType_t nccl_type(ct_dtype dt) {
  switch (dt) {
    case CT_F32: return ncclFloat32;
    case CT_BF16: return ncclBfloat16;
    case CT_F16: return ncclFloat16;
    case CT_I32: return ncclInt32;
    case CT_I64: return ncclInt64;
    case CT_U8: return ncclUint8;
  }
  return ncclFloat32; /* comm.c has checked dt */
}

static ncclRedOp_t nccl_op(ct_redop op) {
  switch (op) {
    case CT_SUM: return ncclSum;
    case CT_AVG: return ncclAvg;
    case CT_MAX: return ncclMax;
    case CT_MIN: return ncclMin;
  }
  return ncclSum; /* comm.c has checked op */
}

/* A buffer must be device (or managed) memory of this rank's GPU. CT_ERR_USAGE before anything
 * is queued, so the group stays usable. */
static ct_status check_ptr(ngroup *g, const char *what, const char *which, const void *p) {
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not sticky; clear it */
    return fail(g, what, CT_ERR_USAGE, "%s (%p) is not a pointer CUDA knows: %s", which, p,
                cudaGetErrorString(e));
  }
  if (a.type == cudaMemoryTypeManaged) return CT_OK;
  if (a.type != cudaMemoryTypeDevice)
    return fail(g, what, CT_ERR_USAGE, "%s (%p) is host memory; the NCCL backend takes device "
                "buffers (cudaMalloc / the CUDA op table's alloc)", which, p);
  if (a.device != g->device)
    return fail(g, what, CT_ERR_USAGE, "%s (%p) is on device %d, this rank's GPU is device %d",
                which, p, a.device, g->device);
  return CT_OK;
}

/* ---- overlap: collectives on a side stream ----
 * While overlapping, each collective is queued on the group's side stream after an event on the
 * compute stream, so it sees everything computed before the call and runs concurrently with
 * what is computed after it; join makes the compute stream wait for the last collective. */
static ct_status follow(ngroup *g, const char *what) {
  if (!g->overlap) return CT_OK;
  cudaError_t e = cudaEventRecord(g->fence, g->compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(g->side, g->fence, 0);
  if (e == cudaSuccess && g->tr) {
    trace_rec *r = &g->tr->rec[g->issued % RING];
    r->host = ct_now();
    e = cudaEventRecord(r->ready, g->compute);
    if (e == cudaSuccess) e = cudaEventRecord(r->start, g->side);
  }
  return e == cudaSuccess ? CT_OK : cuda_fail(g, what, "cudaStreamWaitEvent (overlap)", e);
}

static ct_status nccl_join(void *impl, int keep) {
  ngroup *g = impl;
  if (!g->overlap || g->issued <= (uint64_t)keep) return CT_OK;
  if (keep >= RING) return fail(g, "join", CT_ERR_USAGE, "keep = %d exceeds the %d remembered collectives", keep, RING);
  if (g->tr && keep == 0) { /* the batch before is complete by now; this one waits */
    ctrace *t = g->tr;
    /* this join's point first: reading the batch before takes host time */
    const int k = t->cur ^= 1;
    t->join_host[k] = ct_now();
    const bool ok = cudaEventRecord(t->join[k], g->compute) == cudaSuccess;
    trace_read(t);
    t->pending = ok;
    t->from = t->open_from;
    t->to = t->open_from = g->issued;
  }
  /* collectives run in order on the side stream: waiting for one waits for all before it */
  cudaError_t e = cudaStreamWaitEvent(g->compute, g->ring[(g->issued - 1 - (uint64_t)keep) % RING].ev, 0);
  return e == cudaSuccess ? CT_OK : cuda_fail(g, "join", "cudaStreamWaitEvent", e);
}

static ct_status nccl_set_overlap(void *impl, bool on) {
  ngroup *g = impl;
  if (on == g->overlap) return CT_OK;
  if (on && !g->side) {
    /* The highest priority: a bucket's all-reduce gets multiprocessors as soon as blocks of
     * the backward kernels retire, instead of queuing behind the whole next kernel. */
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    const char *pri = getenv("CT_NCCL_SIDE_PRIORITY"); /* "0": the default priority (measuring) */
    cudaError_t e = cudaStreamCreateWithPriority(&g->side, cudaStreamNonBlocking,
                                                 pri && !strcmp(pri, "0") ? least : greatest);
    if (e != cudaSuccess) {
      g->side = NULL;
      return cuda_fail(g, "set_overlap", "cudaStreamCreateWithPriority", e);
    }
    e = cudaEventCreateWithFlags(&g->fence, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      g->fence = NULL;
      return cuda_fail(g, "set_overlap", "cudaEventCreateWithFlags", e);
    }
  }
  if (!on) CT_TRY(nccl_join(g, 0)); /* later compute-stream work sees every result */
  g->overlap = on;
  g->stream = on ? g->side : g->compute;
  return CT_OK;
}

/* After ncclXxx returned r: wait out ncclInProgress, then record the watchdog's event. */
static ct_status queued(ngroup *g, const char *what, const char *call, ncclResult_t r, double t0,
                        const char *desc) {
  if (r == ncclInProgress) {
    CT_TRY(wait_ready(g, cur(g), what, call, t0));
  } else if (r != ncclSuccess) {
    return nccl_fail(g, what, call, r);
  }
  pending *p = &g->ring[g->issued % RING];
  cudaError_t e = cudaEventRecord(p->ev, g->stream);
  if (e == cudaSuccess && g->tr) { /* its end; queued without overlap, it is one point (ready =
                                    * start = end) on the compute stream */
    trace_rec *r = &g->tr->rec[g->issued % RING];
    e = cudaEventRecord(r->end, g->stream);
    if (!g->overlap) r->host = ct_now();
    if (e == cudaSuccess && !g->overlap) e = cudaEventRecord(r->ready, g->stream);
    if (e == cudaSuccess && !g->overlap) e = cudaEventRecord(r->start, g->stream);
  }
  if (e != cudaSuccess) return cuda_fail(g, what, "cudaEventRecord", e);
  p->seq = ++g->issued;
  snprintf(p->what, sizeof p->what, "%s", desc);
  return CT_OK;
}

static ct_status nccl_all_reduce(void *impl, void *buf, size_t count, ct_dtype dt, ct_redop op) {
  ngroup *g = impl;
  static const char what[] = "all_reduce";
  CT_TRY(check_ptr(g, what, "buf", buf));
  CT_TRY(check_async(g, what));
  CT_TRY(follow(g, what));
  char desc[96];
  snprintf(desc, sizeof desc, "all_reduce (%s %s, %zu elements)", ct_dtype_name(dt),
           ct_redop_name(op), count);
  double t0 = ct_now();
  ncclResult_t r = ncclAllReduce(buf, buf, count, nccl_type(dt), nccl_op(op), cur(g), g->stream);
  return queued(g, what, "ncclAllReduce", r, t0, desc);
}

/* Work of the copy-engine all-reduce (comm_ce.c) queued as one collective of this group. */
ct_status ct_comm_nccl_enqueue(void *impl, const char *what, const char *desc,
                               ct_status (*fn)(void *ctx, void *stream), void *ctx) {
  ngroup *g = impl;
  CT_TRY(check_async(g, what));
  CT_TRY(follow(g, what));
  ct_status st = fn(ctx, g->stream);
  if (st != CT_OK) { /* partly queued: the peers' state is unknown, as after a failed collective */
    char msg[768];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    const char *ab = abort_comm(g);
    return ct_set_error(st, "%s%s", msg, ab);
  }
  return queued(g, what, "enqueue", ncclSuccess, 0, desc);
}

void ct_comm_nccl_set_abort_hook(void *impl, void (*fn)(void *ctx), void *ctx) {
  ngroup *g = impl;
  g->abort_hook = fn;
  g->abort_ctx = fn ? ctx : NULL;
}

/* [a, a+an) and [b, b+bn) share a byte. */
static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

static ct_status nccl_reduce_scatter(void *impl, const void *send, void *recv, size_t recv_count,
                                     ct_dtype dt, ct_redop op) {
  ngroup *g = impl;
  static const char what[] = "reduce_scatter";
  size_t es = ct_dtype_size(dt), block = recv_count * es;
  const char *own = (const char *)send + (size_t)g->rank * block;
  if ((const char *)recv != own && overlaps(send, block * (size_t)g->size, recv, block))
    return fail(g, what, CT_ERR_USAGE, "recv overlaps send but is not the in-place form (recv "
                "== send + rank * recv_count elements)");
  CT_TRY(check_ptr(g, what, "send", send));
  CT_TRY(check_ptr(g, what, "recv", recv));
  CT_TRY(check_async(g, what));
  CT_TRY(follow(g, what));
  char desc[96];
  snprintf(desc, sizeof desc, "reduce_scatter (%s %s, %zu elements per rank)", ct_dtype_name(dt),
           ct_redop_name(op), recv_count);
  double t0 = ct_now();
  ncclResult_t r = ncclReduceScatter(send, recv, recv_count, nccl_type(dt), nccl_op(op), cur(g),
                                     g->stream);
  return queued(g, what, "ncclReduceScatter", r, t0, desc);
}

static ct_status nccl_all_gather(void *impl, const void *send, void *recv, size_t send_count,
                                 ct_dtype dt) {
  ngroup *g = impl;
  static const char what[] = "all_gather";
  size_t es = ct_dtype_size(dt), block = send_count * es;
  const char *own = (const char *)recv + (size_t)g->rank * block;
  if ((const char *)send != own && overlaps(send, block, recv, block * (size_t)g->size))
    return fail(g, what, CT_ERR_USAGE, "send overlaps recv but is not the in-place form (send "
                "== recv + rank * send_count elements)");
  CT_TRY(check_ptr(g, what, "send", send));
  CT_TRY(check_ptr(g, what, "recv", recv));
  CT_TRY(check_async(g, what));
  CT_TRY(follow(g, what));
  char desc[96];
  snprintf(desc, sizeof desc, "all_gather (%s, %zu elements per rank)", ct_dtype_name(dt),
           send_count);
  double t0 = ct_now();
  ncclResult_t r = ncclAllGather(send, recv, send_count, nccl_type(dt), cur(g), g->stream);
  return queued(g, what, "ncclAllGather", r, t0, desc);
}

static ct_status nccl_broadcast(void *impl, void *buf, size_t count, ct_dtype dt, int root) {
  ngroup *g = impl;
  static const char what[] = "broadcast";
  CT_TRY(check_ptr(g, what, "buf", buf));
  CT_TRY(check_async(g, what));
  CT_TRY(follow(g, what));
  char desc[96];
  snprintf(desc, sizeof desc, "broadcast (%s, %zu elements, root %d)", ct_dtype_name(dt), count,
           root);
  double t0 = ct_now();
  ncclResult_t r = ncclBroadcast(buf, buf, count, nccl_type(dt), root, g->comm, g->stream);
  return queued(g, what, "ncclBroadcast", r, t0, desc);
}

/* ---- the watchdog's wait ---- */

/* Everything queued so far is complete, or the group is aborted after timeout_s. */
static ct_status wait_all(ngroup *g, const char *what) {
  CT_TRY(check_async(g, what));
  if (g->done == g->issued) return CT_OK;
  const pending *last = &g->ring[(g->issued - 1) % RING];
  double t0 = ct_now();
  for (int spins = 0;;) {
    cudaError_t e = cudaEventQuery(last->ev);
    if (e == cudaSuccess) {
      g->done = g->issued;
      return check_async(g, what);
    }
    if (e != cudaErrorNotReady) return cuda_fail(g, what, "cudaEventQuery", e);
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(g->comm, &a);
    if (r != ncclSuccess) return nccl_fail(g, what, "ncclCommGetAsyncError", r);
    if (a != ncclSuccess && a != ncclInProgress) {
      char msg[64];
      snprintf(msg, sizeof msg, "asynchronous error while waiting for collective #%llu",
               (unsigned long long)g->issued);
      return nccl_fail(g, what, msg, a);
    }
    if (g->lean && (r = ncclCommGetAsyncError(g->lean, &a)) == ncclSuccess && a != ncclSuccess &&
        a != ncclInProgress)
      return nccl_fail(g, what, "asynchronous error of the lean communicator", a);
    double waited = ct_now() - t0;
    if (waited > g->timeout_s) {
      /* The first unfinished collective still in the ring names the culprit. */
      uint64_t lo = g->issued > RING ? g->issued - RING + 1 : 1, first = 0;
      if (g->done + 1 > lo) lo = g->done + 1;
      for (uint64_t s = lo; s <= g->issued && !first; s++)
        if (cudaEventQuery(g->ring[(s - 1) % RING].ev) == cudaErrorNotReady) first = s;
      if (!first) first = lo;
      char culprit[160];
      snprintf(culprit, sizeof culprit, "%s (collective #%llu of this group, %llu queued)",
               g->ring[(first - 1) % RING].what, (unsigned long long)first,
               (unsigned long long)g->issued);
      const char *ab = abort_comm(g);
      return fail(g, what, CT_ERR_RUNTIME, "%s did not complete within the timeout of %.1f s "
                  "(waited %.1f s): a peer did not enter it or died%s", culprit, g->timeout_s,
                  waited, ab);
    }
    backoff(&spins, waited);
  }
}

static ct_status nccl_sync(void *impl) { return wait_all(impl, "sync"); }

static ct_status nccl_barrier(void *impl) {
  ngroup *g = impl;
  static const char what[] = "barrier";
  CT_TRY(check_async(g, what));
  CT_TRY(follow(g, what));
  double t0 = ct_now();
  ncclResult_t r = ncclAllReduce(g->one, g->one, 1, ncclInt32, ncclSum, g->comm, g->stream);
  CT_TRY(queued(g, what, "ncclAllReduce", r, t0, "barrier (all_reduce of one i32)"));
  return wait_all(g, what);
}

/* ---- split ---- */

static ct_status nccl_split_unused(void *parent_impl, int rank, int size, const char *prefix,
                                   void **out) {
  (void)parent_impl, (void)rank, (void)size;
  *out = NULL;
  return ct_set_error(CT_ERR_RUNTIME, "nccl split of '%s': internal error: comm.c must use "
                      "ct_comm_nccl_ext.split_all", prefix);
}

static ct_status nccl_split_all(void *parent_impl, int color, int key, int rank, int size,
                                const char *prefix, void **out) {
  ngroup *p = parent_impl, *g = NULL;
  static const char what[] = "split";
  *out = NULL;
  CT_TRY(check_async(p, what));
  if (color >= 0) {
    ct_status st = group_new(rank, size, prefix, p->timeout_s, &g);
    /* Still take part, without a color, so the others fail on a size mismatch, not a hang. */
    if (st != CT_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", ct_last_error());
      ncclConfig_t cfg = nonblocking_config();
      p->nocolor_out = NULL;
      /* best effort: this rank's own error is the one to report */
      if (ncclCommSplit(p->comm, NCCL_SPLIT_NOCOLOR, key, &p->nocolor_out, &cfg) == ncclInProgress)
        (void)wait_ready(p, p->comm, what, "ncclCommSplit", ct_now());
      return ct_set_error(st, "%s", msg);
    }
  }
  /* NCCL may write the new communicator when the split completes, after ncclCommSplit returned:
   * the target lives on the heap (the new group, or the parent's spare slot). */
  ncclComm_t *target = g ? &g->comm : &p->nocolor_out;
  *target = NULL;
  ncclConfig_t cfg = nonblocking_config();
  double t0 = ct_now();
  ncclResult_t r = ncclCommSplit(p->comm, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, target,
                                 &cfg);
  ct_status st = CT_OK;
  if (r != ncclSuccess && r != ncclInProgress) {
    st = nccl_fail(p, what, "ncclCommSplit", r);
    goto bad;
  }
  /* The split runs as a job of the parent: the parent is ncclInProgress until it is done. */
  if ((st = wait_ready(p, p->comm, what, "ncclCommSplit", t0)) != CT_OK) goto bad;
  if (!g) return CT_OK;
  ncclComm_t nc = __atomic_load_n(&g->comm, __ATOMIC_ACQUIRE);
  if (!nc) {
    st = fail(g, what, CT_ERR_RUNTIME, "ncclCommSplit completed without a communicator for "
              "color %d", color);
    goto bad;
  }
  if ((st = wait_ready(g, nc, what, "ncclCommSplit", t0)) != CT_OK) goto bad;
  int nr = -1, nn = -1;
  if ((r = ncclCommUserRank(g->comm, &nr)) != ncclSuccess ||
      (r = ncclCommCount(g->comm, &nn)) != ncclSuccess) {
    st = nccl_fail(g, what, "ncclCommUserRank / ncclCommCount", r);
    goto bad;
  }
  if (nr != rank || nn != size) {
    st = fail(g, what, CT_ERR_RUNTIME, "NCCL placed this rank at %d of %d, the store exchange at "
              "%d of %d (color %d, key %d)", nr, nn, rank, size, color, key);
    goto bad;
  }
  *out = g;
  return CT_OK;
bad:
  if (g) {
    abort_comm(g);
    group_free(g);
  }
  return st;
}

/* ---- destroy ---- */

/* ---- registered buffers ---- */

/* ncclCommRegister of buf in the main communicator (and the lean one, when there is one), polled
 * like every call of a non-blocking communicator. */
static ct_status nccl_register(void *impl, void *buf, size_t bytes) {
  ngroup *g = impl;
  static const char what[] = "register";
  if (g->nreg == (int)(sizeof g->reg / sizeof g->reg[0]))
    return fail(g, what, CT_ERR_USAGE, "at most %d registered buffers", g->nreg);
  CT_TRY(check_async(g, what));
  ncclComm_t comms[2] = {g->comm, g->lean};
  void **slots[2] = {&g->reg[g->nreg].main, &g->reg[g->nreg].lean};
  for (int i = 0; i < 2; i++) {
    if (!comms[i]) continue;
    double t0 = ct_now();
    ncclResult_t r = ncclCommRegister(comms[i], buf, bytes, slots[i]);
    if (r != ncclSuccess && r != ncclInProgress)
      return nccl_fail(g, what, i ? "ncclCommRegister (lean)" : "ncclCommRegister", r);
    CT_TRY(wait_ready(g, comms[i], what, "ncclCommRegister", t0));
  }
  g->nreg++;
  return CT_OK;
}

/* Before the communicators are finalized: their registrations go. */
static void nccl_deregister_all(ngroup *g) {
  for (int k = 0; k < g->nreg; k++) {
    if (g->lean && g->reg[k].lean) (void)ncclCommDeregister(g->lean, g->reg[k].lean);
    if (g->comm && g->reg[k].main) (void)ncclCommDeregister(g->comm, g->reg[k].main);
  }
  g->nreg = 0;
}

static void nccl_destroy(void *impl) {
  ngroup *g = impl;
  if (!g) return;
  trace_print(g);
  nccl_deregister_all(g);
  if (g->lean) { /* its collectives ran on the stream the main communicator's finalize flushes */
    double t0 = ct_now();
    ncclResult_t r = ncclCommFinalize(g->lean);
    if (r == ncclSuccess || r == ncclInProgress) {
      if (wait_ready(g, g->lean, "destroy", "ncclCommFinalize (lean)", t0) != CT_OK)
        ct_log_warn("%s", ct_last_error()); /* aborted, both communicators */
    }
    if (g->lean) {
      (void)ncclCommDestroy(g->lean);
      g->lean = NULL;
    }
  }
  if (g->comm) {
    /* Finalize flushes what is queued and is polled like everything else, so a stuck peer costs
     * at most timeout_s here; then destroy frees local resources only. */
    double t0 = ct_now();
    ncclResult_t r = ncclCommFinalize(g->comm);
    ct_status st = CT_OK;
    if (r == ncclSuccess || r == ncclInProgress)
      st = wait_ready(g, g->comm, "destroy", "ncclCommFinalize", t0);
    else
      st = nccl_fail(g, "destroy", "ncclCommFinalize", r);
    if (st != CT_OK) ct_log_warn("%s", ct_last_error()); /* the communicator was aborted */
    if (g->comm) {
      r = ncclCommDestroy(g->comm);
      g->comm = NULL;
      if (r != ncclSuccess)
        ct_log_warn("nccl destroy on rank %d of %d (group '%s'): ncclCommDestroy: %s", g->rank,
                    g->size, g->prefix, ncclGetErrorString(r));
    }
  }
  group_free(g);
}

/* ---- the lean communicator ---- */

/* ncclCommSplit of the whole group (one color, keys = ranks) with maxCTAs limited: its kernels
 * take at most max_ctas multiprocessors, so an all-reduce overlapped with backward slows the
 * backward's GEMMs down less (and itself runs slower). Polled like every split. */
static ct_status nccl_make_lean(void *impl, int max_ctas) {
  ngroup *g = impl;
  static const char what[] = "make_lean";
  if (g->lean) return CT_OK;
  CT_TRY(check_async(g, what));
  ncclConfig_t cfg = nonblocking_config();
  cfg.minCTAs = 1;
  cfg.maxCTAs = max_ctas;
  /* NCCL may write the new communicator when the split completes: into the group (heap), which
   * outlives a timed-out wait */
  double t0 = ct_now();
  ncclResult_t r = ncclCommSplit(g->comm, 0, g->rank, &g->lean, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(g, what, "ncclCommSplit (lean)", r);
  CT_TRY(wait_ready(g, g->comm, what, "ncclCommSplit (lean)", t0));
  ncclComm_t lean = __atomic_load_n(&g->lean, __ATOMIC_ACQUIRE);
  if (!lean) return fail(g, what, CT_ERR_RUNTIME, "ncclCommSplit (lean) returned no communicator");
  return wait_ready(g, lean, what, "ncclCommSplit (lean)", t0);
}

static ct_status nccl_use_lean(void *impl, bool on) {
  ((ngroup *)impl)->use_lean = on;
  return CT_OK;
}

const ct_comm_backend_ops ct_comm_nccl_ops = {
    "nccl",          nccl_split_unused, nccl_all_reduce, nccl_reduce_scatter,
    nccl_all_gather, nccl_broadcast,    nccl_barrier,    nccl_destroy,
};

const ct_comm_backend_ext ct_comm_nccl_ext = {nccl_sync,      nccl_split_all, nccl_set_overlap,
                                              nccl_join,      nccl_make_lean, nccl_use_lean,
                                              nccl_register};
