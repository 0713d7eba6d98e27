/* parallel/comm_ce.c — the copy-engine all-reduce of parallel/comm.h (CUDA + NCCL builds).
 *
 * STATUS: written without a local GPU, then run on a lent 2 x H200 machine the same day
 * (2026-11-30, bench/results/ce_allreduce_2026-11-30_2xH200.txt): test_comm_nccl's ce scenarios
 * pass (f32 and bf16 bit-equal to NCCL's all-reduce; a 12 MiB f32 bucket alone 67 us against
 * NCCL's 137 us; a skipped one times out after 5 s and cleans up), tests/gpu/ddp_ce.sh passes
 * (losses identical). GPT-2 124M ddp: backward drops from ~79.5 to ~77.7 ms (1 GPU: 77.1), so
 * NCCL's kernels did slow backward's GEMMs, but the tail after backward grows from ~1.3 to
 * ~1.5-2.5 ms and tokens/s is within run-to-run noise (1.105-1.118 M both ways). Putting each
 * all-gather wait off to the next bucket (below) did not change that: tail 1.8-2.1 ms against
 * NCCL's 1.1-1.2, backward 77.5-77.7 against 78.3-78.9, 1.114 M tokens/s against 1.115-1.118 M
 * (bench/results/call17_5dbda21.txt). So the tail is not the waits; next, time the last bucket
 * (the embedding's, ~154 MB in f32) on its own. Opt-in (parallel.ce_allreduce). Rerun:
 * build-gpu/tests/test_comm_nccl; tests/gpu/ddp_ce.sh build-gpu/ctrain;
 * EXTRA=parallel.ce_allreduce=true bench/ddp_probe.sh.
 *
 * Why: NCCL's all-reduce kernels overlapped with backward take multiprocessors from its GEMMs
 * (2 H200s, GPT-2 124M: backward +2.5 ms of ~80 ms). Here the copy engines move the bytes over
 * NVLink and the multiprocessors only run one short add per bucket (kernels/cuda/ce_reduce.cu).
 *
 * Set-up (ct_comm_ce_open, collective, through the store under "<prefix>"):
 *   each rank cudaMallocs a receive area of (n-1) chunks per bucket and the flags (uint32 per
 *   (bucket, phase rs|ag, sender)), zeroes the flags, and publishes its verdict on itself (stream
 *   memory operations, the driver entry points), its host name and GPU bus id, and IPC handles of
 *   the allocation holding its buffer (with the buffer's offset in it), the receive area and the
 *   flags. Round 1 "<prefix>/info/<r>": every rank reads every record, checks one host, equal
 *   buffers and bucket tables, peer access to every other GPU, and opens the handles
 *   (cudaIpcMemLazyEnablePeerAccess). Round 2 "<prefix>/ok/<r>": every rank's verdict; any
 *   failure anywhere makes every rank undo and fall back with the same reason. (The keys stay in
 *   the store: a few hundred bytes per rank, under a prefix used once.)
 *
 * One all-reduce of bucket b, chunk c = ceil(count / n) rounded up to 8 elements (16-byte
 * aligned copies and vector adds when the bucket is), chunk j = elements [j c, min((j+1) c,
 * count)) of the bucket, seq = how many times b was reduced, this one included:
 *   1. rs: for every peer j, copy my chunk j into j's receive slot for me, then write seq into
 *      j's flag (b, rs, me) (cuStreamWriteValue32, default flags: a memory fence before the
 *      write, so the copied bytes are visible before the flag);
 *   2. wait until my flag (b, rs, j) >= seq for every peer j (cuStreamWaitValue32: the stream
 *      waits in the GPU's front end, no kernel spins);
 *   3. add my chunk and the n-1 received ones (ct_cuda_ce_reduce: fp32, rank order, scaled
 *      1/n first for an average as ncclAvg does) over my chunk of my buffer;
 *   4. ag: copy my reduced chunk into every peer's buffer at the same place, write seq into its
 *      flag (b, ag, me); wait until my flags (b, ag, j) >= seq. That wait is queued by the next
 *      all-reduce, after its own rs wait, or by ct_comm_ce_finish after the last one: waiting at
 *      once held the stream, and the next bucket's copies, until the slowest peer's all-gather
 *      had landed (ddp's tail after backward was 1.7-2.5 ms against NCCL's 1.3).
 * Sequence numbers only grow, so flags are never reset (2^31 reductions of one bucket before
 * the GEQ comparison, which is modulo 2^32, would wrap).
 *
 * Why nothing is overwritten early:
 * - my rs copy of call k into j's receive slot: j read call k-1's slot in its add, which j's
 *   stream ran before its ag flags of call k-1; my call k-1 waited for those before it ended, and
 *   call k comes after it on my stream. So the slot is free. (With the wait put off: my call k
 *   waits for call k-1's ag flags before its add, and its rs copies of call k follow call k-1's
 *   rs copies and add on my stream, which j's ag flag of call k-1 follows on j's: j wrote that
 *   flag after its add of call k-1 read the slot. So still free.)
 * - j's ag copy into my chunk j (call k): j issues it after its rs wait, which needs my rs flag,
 *   which my stream writes after my rs copy out of chunk j completed. So I have read chunk j.
 * - my add writes only my chunk r, read by nobody else before my ag copies (after the add).
 * - the next step's backward (or the bf16 rounding) writes my buffer on the compute stream only
 *   after the join on this call's end, which is after my ag wait: every peer's ag copy into my
 *   buffer is done. A peer's ag copy of the next step waits for my rs flag of the next step,
 *   which follows the compute-stream fence after my new gradients.
 *
 * Watchdog: the work is queued through ct_comm_nccl_enqueue, so the group's event ring covers it
 * and ct_comm_sync bounds a flag that never comes by timeout_s (the error names the bucket). On
 * that abort the hook below fills my flags with 0x3F3F3F3F on a stream of its own, which satisfies
 * every pending wait: the stuck stream drains (as ncclCommAbort makes a stuck kernel return), so
 * later cudaFree / synchronize calls on the way out do not hang. What it then computes and copies
 * is garbage; the group is failed and the job stops.
 *
 * Costs: 2 (n-1) copies, 2 (n-1) flag writes, 2 (n-1) waits and one kernel per bucket; the receive
 * area ((n-1)/n of the registered buffer, plus rounding); IPC mappings of every peer's buffer
 * allocation, receive area and flags.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h> /* driver types only: the entry points come through the runtime, no -lcuda */
#include <cuda_runtime.h>

#include "common/log.h"
#include "common/util.h"
#include "kernels/cuda/ce_reduce.h"
#include "parallel/comm.h"

enum { RS = 0, AG = 1 };
#define POISON 0x3F /* byte of the abort value 0x3F3F3F3F: >= any seq the GEQ wait compares */

/* ---- driver entry points ---- */

typedef CUresult (*value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*devget_fn)(CUdevice *, int);
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*errstr_fn)(CUresult, const char **);

static struct {
  value32_fn wait32, write32;
  attr_fn attr;
  devget_fn devget;
  range_fn range;
  errstr_fn errstr;
} drv;

static void *entry(const char *name, const char **missing) {
  void *p = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError();
    if (!*missing) *missing = name;
    return NULL;
  }
  return p;
}

/* NULL when every entry point is there, else the name of the first missing one. */
static const char *load_driver(void) {
  static int tried;
  static const char *missing;
  if (tried) return missing;
  tried = 1;
  drv.wait32 = (value32_fn)entry("cuStreamWaitValue32", &missing);
  drv.write32 = (value32_fn)entry("cuStreamWriteValue32", &missing);
  drv.attr = (attr_fn)entry("cuDeviceGetAttribute", &missing);
  drv.devget = (devget_fn)entry("cuDeviceGet", &missing);
  drv.range = (range_fn)entry("cuMemGetAddressRange", &missing);
  drv.errstr = (errstr_fn)entry("cuGetErrorString", &missing);
  return missing;
}

static const char *drv_str(CUresult r) {
  const char *s = NULL;
  if (drv.errstr) drv.errstr(r, &s);
  return s ? s : "unknown driver error";
}

/* ---- state ---- */

typedef struct ce_info { /* one rank's round-1 record (binary, same build on every rank) */
  int32_t ok;            /* 1: this rank can take part; else why says why not */
  char why[192];
  char host[64];
  char bus[32];          /* PCI bus id of its GPU */
  uint64_t count, table; /* buffer elements; hash of the bucket table */
  int32_t dt, nb;
  uint64_t buf_off;      /* bytes from the base of hbuf's allocation to the buffer */
  cudaIpcMemHandle_t hbuf, hrecv, hflags;
} ce_info;

struct ct_comm_ce {
  void *g;               /* the NCCL group (comm_nccl.c), which outlives this */
  int rank, n, device;
  double timeout_s;
  size_t es;             /* bytes per element */
  int bf16;
  char *buf;             /* the registered buffer (count elements) */
  size_t count;
  int nb;
  ct_comm_ce_bucket *bk; /* (nb) */
  size_t *chunk, *roff;  /* (nb) chunk elements; element offset of the bucket in the receive area */
  uint32_t *seq;         /* (nb) reductions of each bucket so far */
  char *recv;            /* (sum over buckets of (n-1) chunk) elements: the peers' chunks */
  uint32_t *flags;       /* (nb, 2, n) written by the peers */
  size_t flag_bytes;
  char **pbuf, **precv;  /* (n) peer j's buffer and receive area, mapped here; NULL for me */
  uint32_t **pflags;     /* (n) peer j's flags, mapped here */
  void **pbase;          /* (n) the base of peer j's buffer allocation as opened (to close) */
  cudaStream_t aux;      /* zeroes the flags at set-up, poisons them on abort */
  cudaEvent_t last;      /* recorded after each all-reduce's last wait */
  int pend;              /* the bucket whose all-gather wait is still to be queued, or -1 */
  uint32_t pend_seq;     /* its sequence number */
  bool aborted;
};

static size_t flag_idx(const ct_comm_ce *ce, int b, int phase, int sender) {
  return ((size_t)b * 2 + (size_t)phase) * (size_t)ce->n + (size_t)sender;
}

/* Elements of chunk j of bucket b (the last ones may be short or empty). */
static size_t chunk_len(const ct_comm_ce *ce, int b, int j) {
  size_t c = ce->chunk[b], lo = (size_t)j * c, cnt = ce->bk[b].count;
  return lo >= cnt ? 0 : (cnt - lo < c ? cnt - lo : c);
}

/* Receive slot of `sender`'s chunk at rank `at` (the peers in rank order, `at` left out). */
static size_t slot(int sender, int at) { return (size_t)(sender < at ? sender : sender - 1); }

static ct_status cuda_err(const ct_comm_ce *ce, const char *what, cudaError_t e) {
  return ct_set_error(CT_ERR_RUNTIME, "ce all-reduce on rank %d of %d: %s: %s", ce->rank, ce->n,
                      what, cudaGetErrorString(e));
}

static ct_status drv_err(const ct_comm_ce *ce, const char *what, CUresult r) {
  return ct_set_error(CT_ERR_RUNTIME, "ce all-reduce on rank %d of %d: %s: %s", ce->rank, ce->n,
                      what, drv_str(r));
}

/* The abort hook (comm_nccl.c's abort_comm): every pending wait of this rank's stream passes. */
static void release_waits(void *ctx) {
  ct_comm_ce *ce = ctx;
  if (ce->aborted || !ce->flags) return;
  ce->aborted = true;
  cudaError_t e = cudaMemsetAsync(ce->flags, POISON, ce->flag_bytes, ce->aux);
  if (e != cudaSuccess)
    ct_log_warn("ce all-reduce on rank %d of %d: releasing the flag waits after an abort: "
                "cudaMemsetAsync: %s", ce->rank, ce->n, cudaGetErrorString(e));
}

/* Polls the last all-reduce's event for up to `limit` seconds. */
static bool idle_within(ct_comm_ce *ce, double limit) {
  double t0 = ct_now();
  for (;;) {
    cudaError_t e = cudaEventQuery(ce->last);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    if (ct_now() - t0 > limit) return false;
    struct timespec ts = {0, 200000L};
    nanosleep(&ts, NULL);
  }
}

void ct_comm_ce_close(ct_comm_ce *ce) {
  if (!ce) return;
  if (ce->g) ct_comm_nccl_set_abort_hook(ce->g, NULL, NULL);
  /* a last all-gather wait still to queue: peers may be copying into this buffer */
  if (ce->pend >= 0 && !ce->aborted && ce->g && ce->last && ct_comm_ce_end(ce) != CT_OK)
    ct_log_warn("ce all-reduce on rank %d of %d: the last all-gather wait: %s", ce->rank, ce->n,
                ct_last_error());
  bool idle = true;
  if (ce->last) {
    idle = idle_within(ce, ce->timeout_s);
    if (!idle) { /* a peer never came: release the waits, give the stream a moment to drain */
      release_waits(ce);
      idle = idle_within(ce, 5.0);
    }
  }
  if (!idle) { /* freeing memory a queued copy still uses would fault: leak it (we are failing) */
    ct_log_warn("ce all-reduce on rank %d of %d: its stream did not drain; its buffers are left "
                "allocated", ce->rank, ce->n);
  } else {
    for (int j = 0; ce->pbase && j < ce->n; j++) {
      if (ce->pbase[j]) cudaIpcCloseMemHandle(ce->pbase[j]);
      if (ce->precv && ce->precv[j]) cudaIpcCloseMemHandle(ce->precv[j]);
      if (ce->pflags && ce->pflags[j]) cudaIpcCloseMemHandle(ce->pflags[j]);
    }
    if (ce->recv) cudaFree(ce->recv);
    if (ce->flags) cudaFree(ce->flags);
    if (ce->aux) cudaStreamDestroy(ce->aux);
    if (ce->last) cudaEventDestroy(ce->last);
    cudaGetLastError(); /* best effort on the way out */
  }
  free(ce->bk);
  free(ce->chunk);
  free(ce->roff);
  free(ce->seq);
  free(ce->pbuf);
  free(ce->precv);
  free(ce->pflags);
  free(ce->pbase);
  free(ce);
}

int ct_comm_ce_lookup(const ct_comm_ce *ce, size_t offset, size_t count) {
  for (int b = 0; b < ce->nb; b++) /* O(buckets): tens */
    if (ce->bk[b].offset == offset && ce->bk[b].count == count) return b;
  return -1;
}

/* ---- set-up ---- */

static uint64_t table_hash(const ct_comm_ce_bucket *bk, int nb) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the (offset, count) pairs */
  for (int b = 0; b < nb; b++) {
    uint64_t v[2] = {bk[b].offset, bk[b].count};
    const unsigned char *p = (const unsigned char *)v;
    for (size_t i = 0; i < sizeof v; i++) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

/* Marks this rank unable to take part, with the reason; returns 0. */
static int no(ce_info *me, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int no(ce_info *me, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(me->why, sizeof me->why, fmt, ap);
  va_end(ap);
  me->ok = 0;
  return 0;
}
#define NO(...) no(me, __VA_ARGS__)

/* This rank's own checks and allocations; a failure is a reason in me->why (returns 0), not an
 * error. */
static int prepare(ct_comm_ce *ce, ce_info *me) {
  me->ok = 1;
  cudaError_t e;
  if (ce->n < 2) return NO("one rank: nothing to reduce");
  if (ce->n > CT_CE_MAX_SRC) return NO("%d ranks; at most %d (one node)", ce->n, CT_CE_MAX_SRC);
  const char *missing = load_driver();
  if (missing) return NO("the driver has no %s (through cudaGetDriverEntryPointByVersion)", missing);
  /* The 32-bit stream memory operations are always there since CUDA 12 (the v2 API); the
   * attribute CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 describes the removed v1 API and
   * reads 0 on an H200 with driver 13 (seen 2026-11-30), so it only goes into the message. The
   * probe below (one write and one wait on the zeroed flags) is the check. */
  int drv_version = 0;
  if ((e = cudaDriverGetVersion(&drv_version)) != cudaSuccess || drv_version < 12000)
    return NO("the CUDA driver (%d) is older than 12.0: no v2 stream memory operations",
              drv_version);
  CUdevice dev;
  CUresult r = drv.devget(&dev, ce->device);
  int memops_v1 = -1;
  if (r == CUDA_SUCCESS) r = drv.attr(&memops_v1, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
  if (r != CUDA_SUCCESS) return NO("cuDeviceGetAttribute: %s", drv_str(r));
  if (gethostname(me->host, sizeof me->host - 1) != 0) return NO("gethostname failed");
  if ((e = cudaDeviceGetPCIBusId(me->bus, sizeof me->bus, ce->device)) != cudaSuccess)
    return NO("cudaDeviceGetPCIBusId: %s", cudaGetErrorString(e));
  /* IPC exports whole allocations: find the one holding the buffer */
  CUdeviceptr base = 0;
  size_t bytes = 0;
  if ((r = drv.range(&base, &bytes, (CUdeviceptr)(uintptr_t)ce->buf)) != CUDA_SUCCESS)
    return NO("cuMemGetAddressRange of the buffer: %s (not device memory?)", drv_str(r));
  me->buf_off = (uint64_t)((uintptr_t)ce->buf - (uintptr_t)base);
  if (me->buf_off + ce->count * ce->es > bytes)
    return NO("the buffer runs past the end of its allocation");
  if ((e = cudaIpcGetMemHandle(&me->hbuf, (void *)(uintptr_t)base)) != cudaSuccess)
    return NO("cudaIpcGetMemHandle of the buffer's allocation: %s", cudaGetErrorString(e));
  size_t relems = 0;
  for (int b = 0; b < ce->nb; b++) {
    ce->roff[b] = relems;
    relems += (size_t)(ce->n - 1) * ce->chunk[b];
  }
  if ((e = cudaMalloc((void **)&ce->recv, relems * ce->es)) != cudaSuccess) {
    ce->recv = NULL;
    return NO("cudaMalloc of the receive area (%.1f MiB): %s", relems * ce->es / 1048576.0,
              cudaGetErrorString(e));
  }
  ce->flag_bytes = (size_t)ce->nb * 2 * (size_t)ce->n * sizeof(uint32_t);
  if ((e = cudaMalloc((void **)&ce->flags, ce->flag_bytes)) != cudaSuccess) {
    ce->flags = NULL;
    return NO("cudaMalloc of the flags: %s", cudaGetErrorString(e));
  }
  if ((e = cudaStreamCreateWithFlags(&ce->aux, cudaStreamNonBlocking)) != cudaSuccess) {
    ce->aux = NULL;
    return NO("cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
  }
  if ((e = cudaEventCreateWithFlags(&ce->last, cudaEventDisableTiming)) != cudaSuccess) {
    ce->last = NULL;
    return NO("cudaEventCreateWithFlags: %s", cudaGetErrorString(e));
  }
  /* probe the stream memory operations on my own flags, then zero them before anyone can see
   * the handles (published after this) */
  const CUdeviceptr f0 = (CUdeviceptr)(uintptr_t)ce->flags;
  if ((e = cudaMemsetAsync(ce->flags, 0, ce->flag_bytes, ce->aux)) != cudaSuccess)
    return NO("zeroing the flags: %s", cudaGetErrorString(e));
  if ((r = drv.write32((CUstream)ce->aux, f0, 1, CU_STREAM_WRITE_VALUE_DEFAULT)) != CUDA_SUCCESS ||
      (r = drv.wait32((CUstream)ce->aux, f0, 1, CU_STREAM_WAIT_VALUE_GEQ)) != CUDA_SUCCESS)
    return NO("GPU %d: stream memory operations fail: %s (driver %d, "
              "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = %d)", ce->device, drv_str(r),
              drv_version, memops_v1);
  if ((e = cudaMemsetAsync(ce->flags, 0, ce->flag_bytes, ce->aux)) != cudaSuccess ||
      (e = cudaStreamSynchronize(ce->aux)) != cudaSuccess)
    return NO("zeroing the flags: %s", cudaGetErrorString(e));
  if ((e = cudaIpcGetMemHandle(&me->hrecv, ce->recv)) != cudaSuccess ||
      (e = cudaIpcGetMemHandle(&me->hflags, ce->flags)) != cudaSuccess)
    return NO("cudaIpcGetMemHandle: %s", cudaGetErrorString(e));
  return 1;
}

/* Checks the others' records against mine, then maps their memory. */
static int connect_peers(ct_comm_ce *ce, const ce_info *all, ce_info *me) {
  for (int j = 0; j < ce->n; j++)
    if (!all[j].ok) return NO("rank %d: %s", j, all[j].why);
  for (int j = 0; j < ce->n; j++) {
    const ce_info *p = &all[j];
    if (strcmp(p->host, me->host))
      return NO("rank %d runs on %s, rank %d on %s: one node only", j, p->host, ce->rank, me->host);
    if (p->count != me->count || p->dt != me->dt || p->nb != me->nb || p->table != me->table)
      return NO("rank %d registered a different buffer or bucket table", j);
  }
  cudaError_t e;
  for (int j = 0; j < ce->n; j++) {
    if (j == ce->rank) continue;
    const ce_info *p = &all[j];
    int dev = -1, ok = 0;
    if ((e = cudaDeviceGetByPCIBusId(&dev, p->bus)) != cudaSuccess) {
      cudaGetLastError();
      return NO("rank %d's GPU (%s) is not visible to rank %d (CUDA_VISIBLE_DEVICES?)", j, p->bus,
                ce->rank);
    }
    if ((e = cudaDeviceCanAccessPeer(&ok, ce->device, dev)) != cudaSuccess || !ok)
      return NO("GPU %d (rank %d) cannot access GPU %d (rank %d) as a peer", ce->device, ce->rank,
                dev, j);
    const unsigned fl = cudaIpcMemLazyEnablePeerAccess;
    void *b = NULL, *rcv = NULL, *fg = NULL;
    if ((e = cudaIpcOpenMemHandle(&b, p->hbuf, fl)) != cudaSuccess)
      return (void)cudaGetLastError(), NO("cudaIpcOpenMemHandle of rank %d's buffer: %s", j,
                                    cudaGetErrorString(e));
    ce->pbase[j] = b;
    ce->pbuf[j] = (char *)b + p->buf_off;
    if ((e = cudaIpcOpenMemHandle(&rcv, p->hrecv, fl)) != cudaSuccess)
      return (void)cudaGetLastError(), NO("cudaIpcOpenMemHandle of rank %d's receive area: %s", j,
                                    cudaGetErrorString(e));
    ce->precv[j] = rcv;
    if ((e = cudaIpcOpenMemHandle(&fg, p->hflags, fl)) != cudaSuccess)
      return (void)cudaGetLastError(), NO("cudaIpcOpenMemHandle of rank %d's flags: %s", j,
                                    cudaGetErrorString(e));
    ce->pflags[j] = fg;
  }
  return 1;
}

#undef NO

/* Publishes `val` under "<prefix>/<what>/<rank>" and reads every rank's into all[] (len bytes
 * each), waiting up to timeout_s. */
static ct_status exchange(ct_store *store, const char *prefix, const char *what, int rank, int n,
                          double timeout_s, const void *val, size_t len, void *all) {
  char key[512];
  snprintf(key, sizeof key, "%s/%s/%d", prefix, what, rank);
  CT_TRY(ct_store_set(store, key, val, len));
  for (int j = 0; j < n; j++) {
    void *v = NULL;
    size_t got = 0;
    snprintf(key, sizeof key, "%s/%s/%d", prefix, what, j);
    CT_TRY(ct_store_get(store, key, timeout_s, &v, &got));
    if (got != len) {
      free(v);
      return ct_set_error(CT_ERR_RUNTIME, "store key %s holds %zu bytes, not %zu (a rank of "
                          "another build?)", key, got, len);
    }
    memcpy((char *)all + (size_t)j * len, v, len);
    free(v);
  }
  return CT_OK;
}

ct_status ct_comm_ce_open(void *nccl_impl, ct_store *store, int rank, int size,
                          const char *prefix, double timeout_s, void *buf, size_t count,
                          ct_dtype dt, const ct_comm_ce_bucket *bk, int nb, ct_comm_ce **out,
                          char *why, size_t why_len) {
  *out = NULL;
  ct_status st = CT_OK;
  ce_info *all = NULL;
  char (*verdict)[192] = NULL;
  ct_comm_ce *ce = ct_calloc(1, sizeof *ce, "ce all-reduce");
  if (!ce) return CT_ERR_NOMEM;
  ce->pend = -1;
  ce->rank = rank;
  ce->n = size;
  ce->timeout_s = timeout_s;
  ce->bf16 = dt == CT_BF16;
  ce->es = ct_dtype_size(dt);
  ce->buf = buf;
  ce->count = count;
  ce->nb = nb;
  ce->bk = ct_malloc(sizeof *ce->bk * (size_t)nb, "ce buckets");
  ce->chunk = ct_calloc((size_t)nb, sizeof *ce->chunk, "ce buckets");
  ce->roff = ct_calloc((size_t)nb, sizeof *ce->roff, "ce buckets");
  ce->seq = ct_calloc((size_t)nb, sizeof *ce->seq, "ce buckets");
  ce->pbuf = ct_calloc((size_t)size, sizeof *ce->pbuf, "ce peers");
  ce->precv = ct_calloc((size_t)size, sizeof *ce->precv, "ce peers");
  ce->pflags = ct_calloc((size_t)size, sizeof *ce->pflags, "ce peers");
  ce->pbase = ct_calloc((size_t)size, sizeof *ce->pbase, "ce peers");
  all = ct_calloc((size_t)size, sizeof *all, "ce records");
  verdict = ct_calloc((size_t)size, sizeof *verdict, "ce records");
  if (!ce->bk || !ce->chunk || !ce->roff || !ce->seq || !ce->pbuf || !ce->precv || !ce->pflags ||
      !ce->pbase || !all || !verdict) {
    st = CT_ERR_NOMEM;
    goto done;
  }
  memcpy(ce->bk, bk, sizeof *bk * (size_t)nb);
  for (int b = 0; b < nb; b++) {
    size_t c = (bk[b].count + (size_t)size - 1) / (size_t)size;
    ce->chunk[b] = (c + 7) / 8 * 8; /* 16-byte aligned slots and chunk starts */
  }
  cudaError_t e = cudaGetDevice(&ce->device);
  if (e != cudaSuccess) {
    st = cuda_err(ce, "cudaGetDevice", e);
    goto done;
  }

  ce_info me;
  memset(&me, 0, sizeof me);
  me.count = count;
  me.dt = (int32_t)dt;
  me.nb = nb;
  me.table = table_hash(bk, nb);
  prepare(ce, &me);
  CT_TRY_GOTO(exchange(store, prefix, "info", rank, size, timeout_s, &me, sizeof me, all), done);
  if (me.ok) connect_peers(ce, all, &me);
  /* round 2: everyone's verdict; the first failing rank's reason is everyone's */
  char mine[192] = "";
  if (!me.ok) snprintf(mine, sizeof mine, "%s", me.why);
  CT_TRY_GOTO(exchange(store, prefix, "ok", rank, size, timeout_s, mine, sizeof mine, verdict),
              done);
  for (int j = 0; j < size; j++)
    if (verdict[j][0]) {
      if (why && why_len) snprintf(why, why_len, "rank %d: %s", j, verdict[j]);
      goto done; /* CT_OK, *out NULL: the NCCL path */
    }
  ce->g = nccl_impl;
  ct_comm_nccl_set_abort_hook(nccl_impl, release_waits, ce);
  *out = ce;
  ce = NULL;
done:
  if (st != CT_OK)
    ct_add_context(st, "ce all-reduce set-up on rank %d of %d (store keys %s/*): ", rank, size,
                   prefix);
  ct_comm_ce_close(ce);
  free(all);
  free(verdict);
  return st;
}

/* ---- one all-reduce ---- */

typedef struct run_args {
  ct_comm_ce *ce;
  int b;
  ct_redop op;
} run_args;

/* A failed stream memory operation on rank `who`'s flag of (bucket b, phase), as an error. */
static ct_status flag_err(ct_comm_ce *ce, const char *call, int who, int b, int phase, CUresult r) {
  char what[96];
  snprintf(what, sizeof what, "%s (rank %d's %s flag, bucket %d)", call, who,
           phase == RS ? "reduce-scatter" : "all-gather", b);
  return drv_err(ce, what, r);
}

static ct_status write_flag(ct_comm_ce *ce, cudaStream_t s, int peer, int b, int phase,
                            uint32_t seq) {
  CUdeviceptr a = (CUdeviceptr)(uintptr_t)(ce->pflags[peer] + flag_idx(ce, b, phase, ce->rank));
  CUresult r = drv.write32((CUstream)s, a, seq, CU_STREAM_WRITE_VALUE_DEFAULT);
  return r == CUDA_SUCCESS ? CT_OK : flag_err(ce, "cuStreamWriteValue32", peer, b, phase, r);
}

static ct_status wait_flags(ct_comm_ce *ce, cudaStream_t s, int b, int phase, uint32_t seq) {
  for (int j = 0; j < ce->n; j++) {
    if (j == ce->rank) continue;
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)(ce->flags + flag_idx(ce, b, phase, j));
    CUresult r = drv.wait32((CUstream)s, a, seq, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) return flag_err(ce, "cuStreamWaitValue32", j, b, phase, r);
  }
  return CT_OK;
}

static ct_status run_work(void *ctx, void *stream) {
  const run_args *a = ctx;
  ct_comm_ce *ce = a->ce;
  cudaStream_t s = stream;
  const int b = a->b, n = ce->n, r = ce->rank;
  cudaError_t e;
  if (b < 0) { /* ct_comm_ce_finish: the last all-gather wait */
    if (ce->pend >= 0) CT_TRY(wait_flags(ce, s, ce->pend, AG, ce->pend_seq));
    ce->pend = -1;
    if ((e = cudaEventRecord(ce->last, s)) != cudaSuccess) return cuda_err(ce, "cudaEventRecord", e);
    return CT_OK;
  }
  const size_t c = ce->chunk[b], es = ce->es, off = ce->bk[b].offset;
  const uint32_t seq = ++ce->seq[b];
  char *own = ce->buf + (off + (size_t)r * c) * es;
  const size_t mine = chunk_len(ce, b, r);
  /* 1. reduce-scatter: peers in the order r+1, r+2, ... so that not every rank copies to rank 0
   * first */
  for (int d = 1; d < n; d++) {
    const int j = (r + d) % n;
    const size_t len = chunk_len(ce, b, j);
    if (len) {
      char *dst = ce->precv[j] + (ce->roff[b] + slot(r, j) * c) * es;
      e = cudaMemcpyAsync(dst, ce->buf + (off + (size_t)j * c) * es, len * es,
                          cudaMemcpyDeviceToDevice, s);
      if (e != cudaSuccess) return cuda_err(ce, "cudaMemcpyAsync (reduce-scatter)", e);
    }
    CT_TRY(write_flag(ce, s, j, b, RS, seq));
  }
  /* 2., and the previous bucket's all-gather wait, put off until now: the peers queued its copies
   * before this bucket's reduce-scatter, so by now it costs nothing, where waiting at once held
   * this stream (and this bucket's copies) until the slowest peer's all-gather landed */
  CT_TRY(wait_flags(ce, s, b, RS, seq));
  if (ce->pend >= 0) CT_TRY(wait_flags(ce, s, ce->pend, AG, ce->pend_seq));
  /* 3. the add, in rank order */
  if (mine) {
    const void *src[CT_CE_MAX_SRC];
    for (int k = 0; k < n; k++)
      src[k] = k == r ? (const void *)own
                      : (const void *)(ce->recv + (ce->roff[b] + slot(k, r) * c) * es);
    const float scale = a->op == CT_AVG ? (float)(1.0 / n) : 1.0f;
    int rc = ct_cuda_ce_reduce(ce->bf16, own, src, n, mine, scale, s);
    if (rc) return cuda_err(ce, "ct_cuda_ce_reduce (the add)", (cudaError_t)rc);
  }
  /* 4. all-gather */
  for (int d = 1; d < n; d++) {
    const int j = (r + d) % n;
    if (mine) {
      e = cudaMemcpyAsync(ce->pbuf[j] + (off + (size_t)r * c) * es, own, mine * es,
                          cudaMemcpyDeviceToDevice, s);
      if (e != cudaSuccess) return cuda_err(ce, "cudaMemcpyAsync (all-gather)", e);
    }
    CT_TRY(write_flag(ce, s, j, b, AG, seq));
  }
  ce->pend = b; /* waited by the next all-reduce or by ct_comm_ce_finish */
  ce->pend_seq = seq;
  if ((e = cudaEventRecord(ce->last, s)) != cudaSuccess) return cuda_err(ce, "cudaEventRecord", e);
  return CT_OK;
}

/* Queues the wait for the last all-reduce's all-gather (run_work puts each one off to the next
 * call): after it, every peer's copies into this rank's buffer have landed. */
ct_status ct_comm_ce_end(ct_comm_ce *ce) {
  if (ce->pend < 0) return CT_OK;
  run_args a = {ce, -1, CT_SUM};
  return ct_comm_nccl_enqueue(ce->g, "ce_all_reduce", "ce all-gather wait", run_work, &a);
}

ct_status ct_comm_ce_run(ct_comm_ce *ce, int bucket, ct_redop op) {
  if (bucket < 0 || bucket >= ce->nb)
    return ct_set_error(CT_ERR_USAGE, "ce all-reduce on rank %d of %d: bucket %d of %d", ce->rank,
                        ce->n, bucket, ce->nb);
  char desc[96];
  snprintf(desc, sizeof desc, "ce all_reduce (%s %s, bucket %d: %zu elements)",
           ce->bf16 ? "bf16" : "f32", ct_redop_name(op), bucket, ce->bk[bucket].count);
  run_args a = {ce, bucket, op};
  return ct_comm_nccl_enqueue(ce->g, "ce_all_reduce", desc, run_work, &a);
}
