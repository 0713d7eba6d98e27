/* parallel/comm.c — the C side of the process group: argument checks, dispatch through the
 * backend table, the store side of split, and the failed state after a backend error.
 * The Gloo backend lives in gloo_adapter.cc, the NCCL one in comm_nccl.c (CUDA builds only: a
 * build without it gets a stub init that says so, so callers need no #if). */
#include "parallel/comm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "ct_build_config.h"

struct ct_comm {
  const ct_comm_backend_ops *be;
  const ct_comm_backend_ext *ext; /* NULL for Gloo */
  void *impl;        /* the backend's state */
  ct_store *store;   /* not owned */
  int rank, size;
  double timeout_s;
  char *prefix;      /* store key prefix of this group */
  int nsplit;        /* splits made from this group so far (names their keys) */
  int nce;           /* copy-engine all-reduces set up on this group so far (names their keys) */
  char *failed;      /* first error after a failed collective; NULL while healthy */
};

size_t ct_dtype_size(ct_dtype t) {
  switch (t) {
    case CT_F32: case CT_I32: return 4;
    case CT_BF16: case CT_F16: return 2;
    case CT_I64: return 8;
    case CT_U8: return 1;
  }
  return 0;
}

const char *ct_dtype_name(ct_dtype t) {
  switch (t) {
    case CT_F32: return "f32";
    case CT_BF16: return "bf16";
    case CT_F16: return "f16";
    case CT_I32: return "i32";
    case CT_I64: return "i64";
    case CT_U8: return "u8";
  }
  return "?";
}

const char *ct_redop_name(ct_redop op) {
  switch (op) {
    case CT_SUM: return "sum";
    case CT_AVG: return "avg";
    case CT_MAX: return "max";
    case CT_MIN: return "min";
  }
  return "?";
}

static ct_status comm_new(const ct_comm_backend_ops *be, const ct_comm_backend_ext *ext,
                          void *impl, ct_store *store, int rank, int size, double timeout_s,
                          const char *prefix, ct_comm **out) {
  ct_comm *c = ct_calloc(1, sizeof *c, "process group");
  char *p = c ? ct_strdup(prefix) : NULL;
  if (!c || !p) {
    free(c);
    be->destroy(impl);
    return ct_set_error(CT_ERR_NOMEM, "process group '%s': out of memory", prefix);
  }
  c->be = be;
  c->ext = ext;
  c->impl = impl;
  c->store = store;
  c->rank = rank;
  c->size = size;
  c->timeout_s = timeout_s;
  c->prefix = p;
  *out = c;
  return CT_OK;
}

static ct_status check_init(const char *call, ct_store *store, int rank, int world,
                            const char *prefix, double timeout_s, ct_comm **out) {
  if (!out) return ct_set_error(CT_ERR_USAGE, "%s: out is NULL", call);
  *out = NULL;
  if (!store) return ct_set_error(CT_ERR_USAGE, "%s: store is NULL", call);
  if (!prefix || !*prefix) return ct_set_error(CT_ERR_USAGE, "%s: empty prefix", call);
  if (world < 1 || rank < 0 || rank >= world)
    return ct_set_error(CT_ERR_USAGE, "%s: rank %d is not in a group of %d", call, rank, world);
  if (!(timeout_s > 0))
    return ct_set_error(CT_ERR_USAGE, "%s: timeout %g s must be > 0", call, timeout_s);
  return CT_OK;
}

ct_status ct_comm_init_gloo(ct_store *store, int rank, int world, const char *prefix,
                            double timeout_s, ct_comm **out) {
  CT_TRY(check_init("ct_comm_init_gloo", store, rank, world, prefix, timeout_s, out));
  void *impl;
  CT_TRY(ct_comm_gloo_create(store, rank, world, prefix, timeout_s, &impl));
  return comm_new(&ct_comm_gloo_ops, NULL, impl, store, rank, world, timeout_s, prefix, out);
}

ct_status ct_comm_init_nccl(ct_store *store, int rank, int world, const char *prefix,
                            double timeout_s, ct_comm **out) {
  CT_TRY(check_init("ct_comm_init_nccl", store, rank, world, prefix, timeout_s, out));
#if CT_HAVE_NCCL
  void *impl;
  CT_TRY(ct_comm_nccl_create(store, rank, world, prefix, timeout_s, &impl));
  return comm_new(&ct_comm_nccl_ops, &ct_comm_nccl_ext, impl, store, rank, world, timeout_s,
                  prefix, out);
#else
  return ct_set_error(CT_ERR_USAGE, "ct_comm_init_nccl (group '%s', rank %d of %d): this build "
                      "has no NCCL (configured without CUDA or without libnccl); use the gloo "
                      "backend", prefix, rank, world);
#endif
}

/* Common front of every collective: the group exists and has not failed. */
static ct_status check_comm(const ct_comm *c, const char *call) {
  if (!c) return ct_set_error(CT_ERR_USAGE, "%s: comm is NULL", call);
  if (c->failed)
    return ct_set_error(CT_ERR_RUNTIME, "%s: group '%s' (rank %d of %d) is unusable after an "
                        "earlier failure: %s", call, c->prefix, c->rank, c->size, c->failed);
  return CT_OK;
}

static ct_status check_type(const ct_comm *c, const char *call, ct_dtype dt, ct_redop op,
                            bool has_op) {
  if (ct_dtype_size(dt) == 0)
    return ct_set_error(CT_ERR_USAGE, "%s (group '%s'): unknown dtype %d", call, c->prefix, (int)dt);
  if (has_op && (op < CT_SUM || op > CT_MIN))
    return ct_set_error(CT_ERR_USAGE, "%s (group '%s'): unknown reduction %d", call, c->prefix, (int)op);
  return CT_OK;
}

/* Records the first failure so later calls fail at once instead of talking to a transport
 * in an unknown state (the analogue of ncclCommAbort). A usage error (e.g. the NCCL backend
 * refusing a host pointer) is found before anything is sent, so it leaves the group healthy. */
static ct_status after(ct_comm *c, ct_status st) {
  if (st != CT_OK && st != CT_ERR_USAGE && !c->failed) c->failed = ct_strdup(ct_last_error());
  return st;
}

static ct_status null_buffer(const ct_comm *c, const char *call, const char *which, size_t count) {
  return ct_set_error(CT_ERR_USAGE, "%s (group '%s', rank %d): %s is NULL with count %zu", call,
                      c->prefix, c->rank, which, count);
}

/* n * count elements of dtype, checked for overflow. */
static ct_status check_span(const ct_comm *c, const char *call, size_t count, ct_dtype dt) {
  size_t n = (size_t)c->size, es = ct_dtype_size(dt);
  if (count > SIZE_MAX / n / es)
    return ct_set_error(CT_ERR_USAGE, "%s (group '%s'): %zu elements per rank x %d ranks "
                        "overflows", call, c->prefix, count, c->size);
  return CT_OK;
}

int ct_comm_rank(const ct_comm *c) { return c ? c->rank : -1; }
int ct_comm_size(const ct_comm *c) { return c ? c->size : 0; }
const char *ct_comm_backend(const ct_comm *c) { return c ? c->be->name : "none"; }
const char *ct_comm_prefix(const ct_comm *c) { return c ? c->prefix : ""; }

ct_status ct_comm_all_reduce(ct_comm *c, void *buf, size_t count, ct_dtype dt, ct_redop op) {
  static const char call[] = "ct_comm_all_reduce";
  CT_TRY(check_comm(c, call));
  CT_TRY(check_type(c, call, dt, op, true));
  if (count == 0) return CT_OK;
  if (!buf) return null_buffer(c, call, "buf", count);
  return after(c, c->be->all_reduce(c->impl, buf, count, dt, op));
}

ct_status ct_comm_reduce_scatter(ct_comm *c, const void *send, void *recv, size_t recv_count,
                                 ct_dtype dt, ct_redop op) {
  static const char call[] = "ct_comm_reduce_scatter";
  CT_TRY(check_comm(c, call));
  CT_TRY(check_type(c, call, dt, op, true));
  if (recv_count == 0) return CT_OK;
  if (!send) return null_buffer(c, call, "send", recv_count * (size_t)c->size);
  if (!recv) return null_buffer(c, call, "recv", recv_count);
  CT_TRY(check_span(c, call, recv_count, dt));
  return after(c, c->be->reduce_scatter(c->impl, send, recv, recv_count, dt, op));
}

ct_status ct_comm_all_gather(ct_comm *c, const void *send, void *recv, size_t send_count,
                             ct_dtype dt) {
  static const char call[] = "ct_comm_all_gather";
  CT_TRY(check_comm(c, call));
  CT_TRY(check_type(c, call, dt, CT_SUM, false));
  if (send_count == 0) return CT_OK;
  if (!send) return null_buffer(c, call, "send", send_count);
  if (!recv) return null_buffer(c, call, "recv", send_count * (size_t)c->size);
  CT_TRY(check_span(c, call, send_count, dt));
  return after(c, c->be->all_gather(c->impl, send, recv, send_count, dt));
}

ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t count, ct_dtype dt, int root) {
  static const char call[] = "ct_comm_broadcast";
  CT_TRY(check_comm(c, call));
  CT_TRY(check_type(c, call, dt, CT_SUM, false));
  if (root < 0 || root >= c->size)
    return ct_set_error(CT_ERR_USAGE, "%s (group '%s'): root %d is not a rank of a group of %d",
                        call, c->prefix, root, c->size);
  if (count == 0) return CT_OK;
  if (!buf) return null_buffer(c, call, "buf", count);
  return after(c, c->be->broadcast(c->impl, buf, count, dt, root));
}

ct_status ct_comm_barrier(ct_comm *c) {
  CT_TRY(check_comm(c, "ct_comm_barrier"));
  return after(c, c->be->barrier(c->impl));
}

ct_status ct_comm_sync(ct_comm *c) {
  CT_TRY(check_comm(c, "ct_comm_sync"));
  if (!c->ext || !c->ext->sync) return CT_OK; /* Gloo: every call has completed already */
  return after(c, c->ext->sync(c->impl));
}

ct_status ct_comm_set_overlap(ct_comm *c, bool on) {
  CT_TRY(check_comm(c, "ct_comm_set_overlap"));
  if (!c->ext || !c->ext->set_overlap) return CT_OK;
  return after(c, c->ext->set_overlap(c->impl, on));
}

ct_status ct_comm_make_lean(ct_comm *c, int max_ctas) {
  CT_TRY(check_comm(c, "ct_comm_make_lean"));
  if (max_ctas < 1)
    return ct_set_error(CT_ERR_USAGE, "ct_comm_make_lean (group '%s'): max_ctas = %d, expected >= 1",
                        c->prefix, max_ctas);
  if (!c->ext || !c->ext->make_lean) return CT_OK;
  return after(c, c->ext->make_lean(c->impl, max_ctas));
}

ct_status ct_comm_register(ct_comm *c, void *buf, size_t bytes) {
  CT_TRY(check_comm(c, "ct_comm_register"));
  if (!buf || !bytes)
    return ct_set_error(CT_ERR_USAGE, "ct_comm_register (group '%s'): no buffer (%p, %zu bytes)",
                        c->prefix, buf, bytes);
  if (!c->ext || !c->ext->register_buf) return CT_OK;
  return after(c, c->ext->register_buf(c->impl, buf, bytes));
}

ct_status ct_comm_use_lean(ct_comm *c, bool on) {
  CT_TRY(check_comm(c, "ct_comm_use_lean"));
  if (!c->ext || !c->ext->use_lean) return CT_OK;
  return after(c, c->ext->use_lean(c->impl, on));
}

ct_status ct_comm_join(ct_comm *c) { return ct_comm_join_lagging(c, 0); }

ct_status ct_comm_join_lagging(ct_comm *c, int keep) {
  CT_TRY(check_comm(c, "ct_comm_join"));
  if (keep < 0) return ct_set_error(CT_ERR_USAGE, "ct_comm_join_lagging: keep = %d", keep);
  if (!c->ext || !c->ext->join) return CT_OK;
  return after(c, c->ext->join(c->impl, keep));
}

/* Split, store side: every rank of the parent publishes "color key" under
 * <prefix>/split<n>/r<rank>, reads everyone's (O(size) gets; fine for the group sizes we run),
 * and the ranks of one color rendezvous again under <prefix>/split<n>/c<color>. */
ct_status ct_comm_split(ct_comm *p, int color, int key, ct_comm **out) {
  static const char call[] = "ct_comm_split";
  if (!out) return ct_set_error(CT_ERR_USAGE, "%s: out is NULL", call);
  *out = NULL;
  CT_TRY(check_comm(p, call));
  ct_status st = CT_OK;
  int n = p->size, seq = p->nsplit++;
  int *colors = ct_malloc(sizeof(int) * 2 * (size_t)n, "split table");
  int *members = ct_malloc(sizeof(int) * (size_t)n, "split table");
  size_t klen = strlen(p->prefix) + 64;
  char *base = ct_malloc(klen, "split key"), *k = ct_malloc(klen + 16, "split key");
  if (!colors || !members || !base || !k) {
    st = CT_ERR_NOMEM;
    goto done;
  }
  int *keys = colors + n;
  snprintf(base, klen, "%s/split%d", p->prefix, seq);

  char val[64];
  snprintf(val, sizeof val, "%d %d", color, key);
  snprintf(k, klen + 16, "%s/r%d", base, p->rank);
  CT_TRY_GOTO(ct_store_set(p->store, k, val, strlen(val)), done);
  for (int i = 0; i < n; i++) {
    void *v = NULL;
    snprintf(k, klen + 16, "%s/r%d", base, i);
    CT_TRY_GOTO(ct_store_get(p->store, k, p->timeout_s, &v, NULL), done);
    int ok = sscanf((const char *)v, "%d %d", &colors[i], &keys[i]) == 2;
    free(v);
    if (!ok) {
      st = ct_set_error(CT_ERR_RUNTIME, "store key %s does not hold 'color key'", k);
      goto done;
    }
  }
  /* Everyone has read every entry once the parent passes a barrier; then each rank removes
   * its own. */
  CT_TRY_GOTO(after(p, p->be->barrier(p->impl)), done);
  snprintf(k, klen + 16, "%s/r%d", base, p->rank);
  ct_store_delete(p->store, k, NULL);
  void *impl = NULL;
  /* A backend whose split is collective over the parent (ncclCommSplit) needs every rank. */
  bool all = p->ext && p->ext->split_all;
  if (color < 0) { /* CT_COMM_NO_COLOR: in no group */
    if (all) st = after(p, p->ext->split_all(p->impl, CT_COMM_NO_COLOR, key, -1, 0, NULL, &impl));
    goto done;
  }

  /* Members of my color ordered by (key, parent rank): insertion sort, O(size^2). */
  int m = 0, me = -1;
  for (int i = 0; i < n; i++) {
    if (colors[i] != color) continue;
    int j = m++;
    while (j > 0 && (keys[members[j - 1]] > keys[i] ||
                     (keys[members[j - 1]] == keys[i] && members[j - 1] > i))) {
      members[j] = members[j - 1];
      j--;
    }
    members[j] = i;
  }
  for (int j = 0; j < m; j++)
    if (members[j] == p->rank) me = j;

  snprintf(k, klen + 16, "%s/c%d", base, color);
  if (all)
    CT_TRY_GOTO(after(p, p->ext->split_all(p->impl, color, key, me, m, k, &impl)), done);
  else
    CT_TRY_GOTO(p->be->split(p->impl, me, m, k, &impl), done);
  st = comm_new(p->be, p->ext, impl, p->store, me, m, p->timeout_s, k, out);

done:
  if (st != CT_OK) ct_add_context(st, "%s (group '%s', rank %d, color %d, key %d): ", call,
                                  p->prefix, p->rank, color, key);
  free(colors);
  free(members);
  free(base);
  free(k);
  return st;
}

/* ---- copy-engine all-reduce (comm.h; the work is in comm_ce.c, CUDA + NCCL builds) ---- */

static void say_why(char *why, size_t len, const char *fmt, const char *a) {
  if (why && len) snprintf(why, len, fmt, a);
}

ct_status ct_comm_ce_create(ct_comm *c, void *buf, size_t count, ct_dtype dt,
                            const ct_comm_ce_bucket *buckets, int nb, ct_comm_ce **out, char *why,
                            size_t why_len) {
  static const char call[] = "ct_comm_ce_create";
  if (!out) return ct_set_error(CT_ERR_USAGE, "%s: out is NULL", call);
  *out = NULL;
  say_why(why, why_len, "%s", "");
  CT_TRY(check_comm(c, call));
  if (dt != CT_F32 && dt != CT_BF16)
    return ct_set_error(CT_ERR_USAGE, "%s (group '%s'): dtype %s; f32 or bf16 only", call,
                        c->prefix, ct_dtype_name(dt));
  if (!buf || !count || !buckets || nb < 1)
    return ct_set_error(CT_ERR_USAGE, "%s (group '%s', rank %d): an empty buffer or bucket table",
                        call, c->prefix, c->rank);
  for (int b = 0; b < nb; b++)
    if (!buckets[b].count || buckets[b].offset > count || buckets[b].count > count - buckets[b].offset)
      return ct_set_error(CT_ERR_USAGE, "%s (group '%s', rank %d): bucket %d (elements %zu + %zu)"
                          " is empty or outside the buffer of %zu elements", call, c->prefix,
                          c->rank, b, buckets[b].offset, buckets[b].count, count);
#if CT_HAVE_NCCL
  if (c->ext != &ct_comm_nccl_ext) {
    say_why(why, why_len, "the group's backend is %s, not nccl", c->be->name);
    return CT_OK;
  }
  size_t klen = strlen(c->prefix) + 32;
  char *k = ct_malloc(klen, "store key");
  if (!k) return CT_ERR_NOMEM;
  snprintf(k, klen, "%s/ce%d", c->prefix, c->nce++);
  ct_status st = ct_comm_ce_open(c->impl, c->store, c->rank, c->size, k, c->timeout_s, buf, count,
                                 dt, buckets, nb, out, why, why_len);
  free(k);
  return after(c, st);
#else
  say_why(why, why_len, "this build has no NCCL (backend %s)", c->be->name);
  return CT_OK;
#endif
}

int ct_comm_ce_find(const ct_comm_ce *ce, size_t offset, size_t count) {
#if CT_HAVE_NCCL
  return ce ? ct_comm_ce_lookup(ce, offset, count) : -1;
#else
  (void)ce, (void)offset, (void)count;
  return -1;
#endif
}

ct_status ct_comm_ce_all_reduce(ct_comm *c, ct_comm_ce *ce, int bucket, ct_redop op) {
  static const char call[] = "ct_comm_ce_all_reduce";
  CT_TRY(check_comm(c, call));
  if (!ce) return ct_set_error(CT_ERR_USAGE, "%s (group '%s'): ce is NULL", call, c->prefix);
  if (op != CT_SUM && op != CT_AVG)
    return ct_set_error(CT_ERR_USAGE, "%s (group '%s'): reduction %s; sum or avg only", call,
                        c->prefix, ct_redop_name(op));
#if CT_HAVE_NCCL
  return after(c, ct_comm_ce_run(ce, bucket, op));
#else
  (void)bucket;
  return ct_set_error(CT_ERR_USAGE, "%s: this build has no NCCL", call);
#endif
}

ct_status ct_comm_ce_finish(ct_comm *c, ct_comm_ce *ce) {
  static const char call[] = "ct_comm_ce_finish";
  CT_TRY(check_comm(c, call));
  if (!ce) return CT_OK;
#if CT_HAVE_NCCL
  return after(c, ct_comm_ce_end(ce));
#else
  return ct_set_error(CT_ERR_USAGE, "%s: this build has no NCCL", call);
#endif
}

void ct_comm_ce_destroy(ct_comm_ce *ce) {
#if CT_HAVE_NCCL
  ct_comm_ce_close(ce);
#else
  (void)ce;
#endif
}

void ct_comm_destroy(ct_comm *c) {
  if (!c) return;
  c->be->destroy(c->impl);
  free(c->prefix);
  free(c->failed);
  free(c);
}
