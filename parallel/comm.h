/* parallel/comm.h — process group: collectives over a group of ranks.
 *
 * One ct_comm is one group of `size` ranks (NCCL's communicator, torch's ProcessGroup). The
 * lifecycle follows NCCL: rendezvous out of band (our TCP store, parallel/store.h) → init
 * (every rank of the group calls ct_comm_init_* with the same prefix) → split into sub-groups
 * (dp × tp mesh) → collectives → destroy.
 *
 * Backends sit behind a small table of function pointers (see comm.c):
 *   gloo  CPU buffers over TCP (Debian libgloo-dev through the C++ adapter gloo_adapter.cc).
 *         Its reduce_scatter is an all_reduce plus a copy of the own block (2x the bytes of a
 *         real reduce-scatter; Gloo's own halving-doubling one races, see the adapter).
 *   nccl  GPU buffers of this rank's device (comm_nccl.c, CUDA builds only): collectives are
 *         queued on the CUDA backend's stream (ct_cuda_stream()) and return before they finish;
 *         ct_comm_sync / ct_comm_barrier are the bounded waits (see Completion below).
 *
 * Rules common to every call:
 * - Collective: every rank of the group makes the same calls in the same order with the same
 *   count, dtype, op and root. A rank that never arrives makes the others fail with a timeout
 *   error after `timeout_s` (given at init) — never a hang.
 * - Completion. Gloo is blocking: when a call returns, the result is in the output buffer.
 *   NCCL queues the collective on ct_cuda_stream() in call order and returns: any later work on
 *   that stream sees the result, but the host must call ct_comm_sync (or ct_comm_barrier)
 *   before it reads, reuses or frees a buffer. That wait is bounded by timeout_s; waiting any
 *   other way (cudaStreamSynchronize, ct_cuda_check, a to_host copy) is not, and hangs if a peer
 *   never enters a collective, so sync first. Portable code calls ct_comm_sync where the host
 *   needs results; with Gloo it returns at once.
 * - count 0 is allowed and does nothing. A NULL buffer with count > 0 is CT_ERR_USAGE, naming
 *   the call. Buffers are caller-owned; nothing is retained after a call returns.
 * - Errors come back as a ct_status with ct_last_error() naming the call, the backend, the
 *   rank and the group prefix, plus the backend's own text (a Gloo exception's message).
 *   After a failed collective the group is unusable (the transport state is unknown, as with
 *   ncclCommAbort): later calls fail at once with the first error; destroy it.
 * - Reductions on CT_BF16 / CT_F16 run in fp32 (each buffer is widened, reduced, and rounded
 *   back to nearest even once at the end), so the result is the fp32 result rounded once.
 *   Integer CT_AVG is the sum divided by size with C integer division (truncation); integer
 *   sums wrap (CT_U8 modulo 256).
 *   NCCL differs for floating point: bf16 / f16 are reduced in their own type step by step
 *   (each hop adds in fp32 and rounds back), so with more than 2 ranks a result may be a few
 *   units in the last place off the rounded-once value; CT_AVG is ncclAvg (each input scaled by
 *   1/size, then summed), so it rounds like the sum only when size is a power of two. Integer
 *   rules are the same.
 */
#ifndef CT_COMM_H
#define CT_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "parallel/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_comm ct_comm;

typedef enum { CT_F32, CT_BF16, CT_F16, CT_I32, CT_I64, CT_U8 } ct_dtype;
typedef enum { CT_SUM, CT_AVG, CT_MAX, CT_MIN } ct_redop;

size_t ct_dtype_size(ct_dtype t);      /* bytes per element; 0 for a value out of range */
const char *ct_dtype_name(ct_dtype t); /* "f32", "bf16", ... */
const char *ct_redop_name(ct_redop op);

/* Joins a CPU group over TCP through Gloo. Every rank in [0, world) calls it with the same
 * prefix; `store` (not owned, must outlive the group) carries the addresses, under keys that
 * start with `prefix` so several groups coexist on one store (e.g. "run7/world", "run7/dp").
 * Use a prefix unique to this group's lifetime (include the restart count): keys from an
 * earlier group of the same name would otherwise be read. `timeout_s` (> 0) bounds the
 * rendezvous, the connection set-up and every later collective of this group and of groups
 * split from it.
 * The socket binds to the interface named by CTRAIN_SOCKET_IFNAME, else to the local address
 * that routes to MASTER_ADDR, else to 127.0.0.1 (MASTER_ADDR unset: one host).
 * On success *out is a new group, owned by the caller (ct_comm_destroy). */
ct_status ct_comm_init_gloo(ct_store *store, int rank, int world, const char *prefix,
                            double timeout_s, ct_comm **out);

/* Joins a GPU group through NCCL (same rules as ct_comm_init_gloo for rank, world, prefix and
 * timeout_s). Call ct_cuda_init(device) first: the communicator belongs to the current device
 * and every collective is queued on ct_cuda_stream(). Rank 0 makes the unique id and sets it
 * under "<prefix>/nccl_id" (removed once everyone has joined); the others get it, waiting up to
 * timeout_s. Init is non-blocking and polled, so a rank that never comes makes the others fail
 * after timeout_s. Collective buffers are device memory of this rank's GPU (cudaMalloc, or the
 * CUDA op table's alloc); a host pointer is CT_ERR_USAGE. A build without CUDA / NCCL returns
 * CT_ERR_USAGE "this build has no NCCL". Keep NCCL_NVLS_ENABLE=0 where NVLink multicast must stay
 * off (NCCL reads its environment at its first call). */
ct_status ct_comm_init_nccl(ct_store *store, int rank, int world, const char *prefix,
                            double timeout_s, ct_comm **out);

/* Splits `parent` (collective over the parent group): ranks passing the same color >= 0 form
 * one new group, ordered by key (ties by parent rank); its store keys live under
 * "<parent prefix>/split<n>/c<color>" (n counts this parent's splits). A negative color
 * (CT_COMM_NO_COLOR) joins no group: *out is set to NULL and CT_OK returned. For a dp × tp mesh
 * with tp size T: tp = split(world, r / T, r % T), dp = split(world, r % T, r / T).
 * The new group shares the parent's store and timeout and must be destroyed on its own (before
 * or after the parent). NCCL splits with ncclCommSplit: every parent rank takes part, the ones
 * with CT_COMM_NO_COLOR too; a split that fails or times out leaves the parent unusable. */
#define CT_COMM_NO_COLOR (-1)
ct_status ct_comm_split(ct_comm *parent, int color, int key, ct_comm **out);

int ct_comm_rank(const ct_comm *c);
int ct_comm_size(const ct_comm *c);
const char *ct_comm_backend(const ct_comm *c);  /* "gloo" or "nccl" */
const char *ct_comm_prefix(const ct_comm *c);   /* the group's store key prefix */

/* In place: buf (count elements) on every rank becomes the reduction over ranks. */
ct_status ct_comm_all_reduce(ct_comm *c, void *buf, size_t count, ct_dtype dt, ct_redop op);

/* send holds size * recv_count elements (block b = elements [b*recv_count, (b+1)*recv_count));
 * rank r receives the reduction of block r in recv (recv_count elements). In place is allowed
 * when recv == send + r * recv_count (elements); other overlaps are not. send is not modified
 * (except through recv in the in-place form). */
ct_status ct_comm_reduce_scatter(ct_comm *c, const void *send, void *recv, size_t recv_count,
                                 ct_dtype dt, ct_redop op);

/* Every rank contributes send_count elements; recv (size * send_count) gets rank b's
 * contribution in block b on every rank. In place is allowed when send == recv + r * send_count
 * (elements); other overlaps are not. */
ct_status ct_comm_all_gather(ct_comm *c, const void *send, void *recv, size_t send_count,
                             ct_dtype dt);

/* buf on every rank becomes root's buf (count elements). */
ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t count, ct_dtype dt, int root);

/* Returns once every rank of the group has entered it. NCCL: an all-reduce of one int followed by
 * ct_comm_sync, so it also waits for everything queued on the stream before it. */
ct_status ct_comm_barrier(ct_comm *c);

/* Waits until every collective this group has queued is complete, at most timeout_s (from the
 * start of the wait). On expiry the group's communicator is aborted (ncclCommAbort) and the call
 * returns CT_ERR_RUNTIME naming the collective that did not finish, this rank and the seconds
 * waited; an asynchronous NCCL error (a peer that died) fails the same way, sooner. The wait
 * covers all work queued on ct_cuda_stream() before the last collective. Gloo: returns at once. */
ct_status ct_comm_sync(ct_comm *c);

/* Overlap (NCCL): while on, this group's collectives run on a stream of their own; each first
 * waits for the work queued on ct_cuda_stream() before the call, and runs concurrently with
 * what is queued after it (DDP's bucket all-reduce during the rest of backward). The caller
 * must not touch a buffer on the compute stream until ct_comm_join (or turning overlap off,
 * which joins) has made later compute-stream work wait for the collectives. Not collective.
 * Gloo (blocking calls): both return CT_OK and change nothing. */
ct_status ct_comm_set_overlap(ct_comm *c, bool on);
ct_status ct_comm_join(ct_comm *c);
/* As ct_comm_join, but for every collective queued so far except the last `keep` (those keep
 * running concurrently with later compute-stream work). keep = 0 is ct_comm_join. */
ct_status ct_comm_join_lagging(ct_comm *c, int keep);

/* Lean collectives (NCCL). ct_comm_make_lean (collective, once; later calls do nothing) makes a
 * second communicator over the same ranks whose kernels use at most max_ctas (>= 1)
 * multiprocessors; ct_comm_use_lean (not collective, but every rank switches at the same points
 * of its call sequence) sends the following all_reduce / reduce_scatter / all_gather calls to it
 * (on) or back to the full communicator (off). Both queue on the same stream, so their
 * collectives never run at the same time. For collectives that overlap compute (DDP's buckets
 * during backward): they take fewer multiprocessors from the GEMMs; the last bucket, which
 * nothing overlaps, goes to the full one. Gloo: both return CT_OK and change nothing. */
ct_status ct_comm_make_lean(ct_comm *c, int max_ctas);
ct_status ct_comm_use_lean(ct_comm *c, bool on);

/* Registers `bytes` of device memory at buf with the group's communicators (NCCL:
 * ncclCommRegister, for collectives that read and write the buffer in place without NCCL's own
 * staging copies; collective in the sense that every rank registers the buffers it passes to the
 * same collectives). Deregistered when the group is destroyed; at most 8 buffers. Gloo: CT_OK.
 * Measured (NCCL 2.28, 2 H200s, bench/results/call44_comm_dd51b6f.txt): NCCL accepts cudaMalloc
 * memory here but declines to share it at the first collective (its INFO log: "failed to IPC
 * register", then it runs unregistered); ncclMemAlloc memory registers, and the all-reduce is as
 * fast as without (313 GB/s at 512 MB either way), so the trainer does not use it. */
ct_status ct_comm_register(ct_comm *c, void *buf, size_t bytes);

/* ---- copy-engine all-reduce (NCCL groups whose ranks share one node) ----
 * An all-reduce of registered buckets of one device buffer that moves the bytes with the GPUs'
 * copy engines over NVLink (cudaMemcpyAsync between peer-mapped buffers) and uses the
 * multiprocessors only for one short elementwise add per bucket, so it takes fewer of them from
 * the kernels it overlaps (DDP's bucket all-reduces during backward). Per bucket: reduce-scatter
 * by copies into the peers' receive areas, a flag write per peer (a stream memory operation,
 * ordered after the copies), a stream wait on the peers' flags (no kernel spins), the add (fp32
 * accumulation, in rank order), and an all-gather by copies into the peers' buffers, again
 * flagged. Implementation and its ordering argument: parallel/comm_ce.c.
 *
 * ct_comm_ce_create is collective over the group: every rank passes a buffer of the same count
 * and dtype (CT_F32 or CT_BF16) and the same bucket table (ranges of elements of buf). It applies
 * only to an NCCL group of >= 2 ranks on one host whose GPUs can all access each other as peers
 * and support stream memory operations; otherwise (on every rank alike, the ranks agree through
 * the store) it returns CT_OK with *out = NULL and the reason in why. buf must stay allocated
 * (it may be inside a larger cudaMalloc allocation) and is written by the peers during each
 * all-reduce. Costs: a receive area of (size - 1) chunks of every bucket (chunk = ceil(count /
 * size) elements), 8 bytes per bucket and rank of flags, and an IPC mapping of every peer's
 * allocations. An error status means the rendezvous or CUDA failed (a rank died during setup).
 * ct_comm_ce_find: the bucket whose range is exactly [offset, offset + count), or -1.
 * ct_comm_ce_all_reduce: queued like the group's NCCL collectives (same stream, after the same
 * compute-stream fence while overlapping, covered by ct_comm_sync's watchdog and joins), in place
 * on the bucket; ops CT_SUM and CT_AVG (ncclAvg's rounding: each input scaled by 1/size, then
 * summed; with 2 ranks bit-equal to NCCL's all-reduce for f32 and bf16). Collective: every rank
 * reduces the same buckets in the same order. After a timeout the group is aborted as for NCCL
 * and the stuck stream waits are released (their results are garbage; the job must stop).
 * Each all-reduce leaves its all-gather's wait to the next one (so the stream does not stop for
 * the slowest peer between buckets): ct_comm_ce_finish queues the last one; call it after a
 * backward's last all-reduce, before the buffer is read or written again.
 * ct_comm_ce_destroy: waits (bounded by the group's timeout) for its last all-reduce, unmaps
 * and frees; call it before destroying the group. NULL is ignored. */
typedef struct ct_comm_ce ct_comm_ce;
typedef struct ct_comm_ce_bucket {
  size_t offset, count; /* elements of the registered buffer */
} ct_comm_ce_bucket;
ct_status ct_comm_ce_create(ct_comm *c, void *buf, size_t count, ct_dtype dt,
                            const ct_comm_ce_bucket *buckets, int nb, ct_comm_ce **out, char *why,
                            size_t why_len);
int ct_comm_ce_find(const ct_comm_ce *ce, size_t offset, size_t count);
ct_status ct_comm_ce_all_reduce(ct_comm *c, ct_comm_ce *ce, int bucket, ct_redop op);
ct_status ct_comm_ce_finish(ct_comm *c, ct_comm_ce *ce);
void ct_comm_ce_destroy(ct_comm_ce *ce);

/* Frees the group and closes its connections. Not collective; NULL is ignored. */
void ct_comm_destroy(ct_comm *c);

/* ---- backend interface: used by comm.c and the backends only ----
 * A backend is a table of function pointers over its own opaque state (`impl`). comm.c checks
 * the arguments (so a backend sees non-NULL buffers, count > 0, a valid dtype/op/root), keeps
 * rank/size/prefix/store, runs the store side of split, and marks a group failed after its
 * first error. A backend function records its message with ct_set_error and returns a status;
 * it must not throw, print or exit. */
typedef struct ct_comm_backend_ops {
  const char *name;
  /* New group of `size` ranks (this one is `rank`) made from members of the parent group;
   * rendezvous keys under `prefix`. Called only on the ranks that join a group. */
  ct_status (*split)(void *parent_impl, int rank, int size, const char *prefix, void **out);
  ct_status (*all_reduce)(void *impl, void *buf, size_t count, ct_dtype dt, ct_redop op);
  ct_status (*reduce_scatter)(void *impl, const void *send, void *recv, size_t recv_count,
                              ct_dtype dt, ct_redop op);
  ct_status (*all_gather)(void *impl, const void *send, void *recv, size_t send_count,
                          ct_dtype dt);
  ct_status (*broadcast)(void *impl, void *buf, size_t count, ct_dtype dt, int root);
  ct_status (*barrier)(void *impl);
  void (*destroy)(void *impl);
} ct_comm_backend_ops;

/* Extra entry points of a backend whose collectives complete asynchronously and whose split is
 * collective over the whole parent (NCCL). Gloo has none (NULL). */
typedef struct ct_comm_backend_ext {
  /* Bounded wait for everything queued (ct_comm_sync). */
  ct_status (*sync)(void *impl);
  /* Used instead of ops->split, on EVERY rank of the parent after comm.c's store exchange:
   * color < 0 joins no group (*out stays NULL); otherwise `rank` of `size` is this rank's place
   * in the new group as comm.c computed it (the backend checks its own agrees). */
  ct_status (*split_all)(void *parent_impl, int color, int key, int rank, int size,
                         const char *prefix, void **out);
  /* ct_comm_set_overlap / ct_comm_join (NULL: nothing to do) */
  ct_status (*set_overlap)(void *impl, bool on);
  ct_status (*join)(void *impl, int keep); /* all but the last `keep` collectives */
  /* ct_comm_make_lean / ct_comm_use_lean (NULL: nothing to do) */
  ct_status (*make_lean)(void *impl, int max_ctas);
  ct_status (*use_lean)(void *impl, bool on);
  /* ct_comm_register (NULL: nothing to do) */
  ct_status (*register_buf)(void *impl, void *buf, size_t bytes);
} ct_comm_backend_ext;

/* Gloo (gloo_adapter.cc): creates the state of one rank of a new group. */
extern const ct_comm_backend_ops ct_comm_gloo_ops;
ct_status ct_comm_gloo_create(ct_store *store, int rank, int world, const char *prefix,
                              double timeout_s, void **impl);

/* NCCL (comm_nccl.c, built only with CUDA and NCCL; ct_build_config.h: CT_HAVE_NCCL). */
extern const ct_comm_backend_ops ct_comm_nccl_ops;
extern const ct_comm_backend_ext ct_comm_nccl_ext;
ct_status ct_comm_nccl_create(ct_store *store, int rank, int world, const char *prefix,
                              double timeout_s, void **impl);

/* Services of the NCCL backend for the copy-engine all-reduce (comm_ce.c). enqueue: checks the
 * group, fences the side stream while overlapping, runs fn(ctx, stream) to queue work on the
 * group's current stream, then records the watchdog's event for it under desc; a failing fn
 * aborts the group. set_abort_hook: fn(ctx) runs once when the group is aborted (a timeout, an
 * error), before the communicator is; NULL clears it. */
ct_status ct_comm_nccl_enqueue(void *impl, const char *what, const char *desc,
                               ct_status (*fn)(void *ctx, void *stream), void *ctx);
void ct_comm_nccl_set_abort_hook(void *impl, void (*fn)(void *ctx), void *ctx);
/* The copy-engine all-reduce over an NCCL group's state (comm_ce.c; comm.c's ct_comm_ce_* check
 * the arguments and call these). */
ct_status ct_comm_ce_open(void *nccl_impl, ct_store *store, int rank, int size,
                          const char *prefix, double timeout_s, void *buf, size_t count,
                          ct_dtype dt, const ct_comm_ce_bucket *buckets, int nb, ct_comm_ce **out,
                          char *why, size_t why_len);
int ct_comm_ce_lookup(const ct_comm_ce *ce, size_t offset, size_t count);
ct_status ct_comm_ce_run(ct_comm_ce *ce, int bucket, ct_redop op);
ct_status ct_comm_ce_end(ct_comm_ce *ce);
void ct_comm_ce_close(ct_comm_ce *ce);

#ifdef __cplusplus
}
#endif

#endif
