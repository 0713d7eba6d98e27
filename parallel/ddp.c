/* parallel/ddp.c — bucketed gradient averaging (see ddp.h). */
#include "parallel/ddp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

size_t ct_ddp_bucket_floats(double bucket_mb) {
  if (!(bucket_mb > 0)) bucket_mb = CT_DDP_BUCKET_MB_DEFAULT;
  double n = bucket_mb * 1024.0 * 1024.0 / sizeof(float);
  return n < 1 ? 1 : (size_t)n;
}

ct_status ct_ddp_reduce_grads(ct_comm *c, float *grads, size_t numel, size_t bucket_floats) {
  if (bucket_floats == 0) bucket_floats = ct_ddp_bucket_floats(0);
  size_t nb = (numel + bucket_floats - 1) / bucket_floats;
  for (size_t b = 0, off = 0; off < numel; b++, off += bucket_floats) {
    size_t n = numel - off < bucket_floats ? numel - off : bucket_floats;
    ct_status st = ct_comm_all_reduce(c, grads ? grads + off : NULL, n, CT_F32, CT_AVG);
    if (st != CT_OK)
      return ct_add_context(st, "ddp gradient bucket %zu of %zu (elements %zu..%zu of %zu): ",
                            b + 1, nb, off, off + n, numel);
  }
  return CT_OK;
}

/* ---- overlapped DDP ---- */

struct ct_ddp {
  ct_model *m;
  ct_comm *c;
  size_t bucket;
  void *wire;    /* reduce_dtype bf16: the gradients rounded to bf16 (numel x 2 bytes), or NULL */
  bool armed;
  size_t lo, hi; /* pending range of finished, not yet reduced gradients */
  int buckets;   /* bucket all-reduces issued in this backward */
  bool lean;     /* buckets before the last go to the lean communicator */
  bool overlap;  /* buckets issued while backward runs (ct_ddp_cfg.overlap) */
  int gemm_sms;  /* CT_DDP_GEMM_SMS=N (measuring): backward's GEMMs after the head's aim at N SMs;
                  * on 2 H200s (GPT-2 124M) 130 with overlap_ctas = 2 and 108 with the default were
                  * 0.5-2% slower (bench/results/call41_3037e8e.txt) */
  bool sms_set;  /* the target is in force (from the first bucket to ct_ddp_finish) */

  /* the copy-engine all-reduce (parallel.ce_allreduce); ce NULL: off or not applicable */
  ct_comm_ce *ce;
  int ce_buckets, reduces; /* all-reduces of this backward through it; all of them */
  bool tail_nccl;          /* CT_CE_TAIL_NCCL=1: the range left at the end of backward goes
                            * through NCCL (see issue) */
  bool in_tail;            /* the buckets being issued are that range */
  bool planning;           /* replaying the hooks to learn the buckets: record, reduce nothing */
  ct_comm_ce_bucket *plan; /* (nplan) the buckets learned, elements of the gradient buffer */
  int nplan, plan_cap;

  /* the sparse embedding gradient (ddp.h); emb NULL: off */
  float *emb;          /* (V, C) the armed backward's lookup gradient; zero outside its rows */
  int V, C;            /* the embedding's rows (padded vocabulary) and width */
  size_t e_lo, e_hi;   /* the embedding's gradient in the flat buffer (it opens unit 0) */
  int32_t *flags;      /* (V) backend memory: 1 where a token of the armed batch uses the row,
                        * then the max over the ranks */
  int32_t *hflags;     /* (V) host: this rank's flags, then the reduced ones */
  bool hpinned;        /* hflags is page-locked (ops->host_alloc), so its copy is asynchronous */
  int32_t *rows;       /* (cap) backend memory: the flagged rows, ascending */
  float *packed;       /* (cap, C) their lookup gradient, averaged in place */
  uint16_t *pwire;     /* (cap, C) packed rounded to bf16 (reduce_dtype bf16), or NULL */
  int cap;             /* rows packed can hold */
  int nrows;           /* rows the last armed backward reduced; -1 before the first */
  bool rows_queued;    /* this backward queued the rows' all-reduce: ct_ddp_finish adds them */
};

#define NOT_FLAT SIZE_MAX /* a buffer outside the gradients (the packed rows) */

static ct_status plan_add(ct_ddp *d, size_t off, size_t k) {
  if (d->nplan == d->plan_cap) {
    int cap = d->plan_cap ? 2 * d->plan_cap : 32;
    ct_comm_ce_bucket *p = realloc(d->plan, sizeof *p * (size_t)cap);
    if (!p) return ct_set_error(CT_ERR_NOMEM, "ddp: out of memory for the bucket table");
    d->plan = p;
    d->plan_cap = cap;
  }
  d->plan[d->nplan++] = (ct_comm_ce_bucket){off, k};
  return CT_OK;
}

/* One bucket, p[0, k) = elements [flat, flat + k) of the gradients (or of the bf16 wire, which
 * mirrors them): the copy-engine all-reduce when it has the bucket, else the group's own. */
static ct_status reduce_bucket(ct_ddp *d, void *p, size_t flat, size_t k, ct_dtype dt) {
  if (d->planning) return flat == NOT_FLAT ? CT_OK : plan_add(d, flat, k);
  d->reduces++;
  const int b = flat == NOT_FLAT || d->in_tail ? -1 : ct_comm_ce_find(d->ce, flat, k);
  if (b >= 0) {
    d->ce_buckets++;
    return ct_comm_ce_all_reduce(d->c, d->ce, b, CT_AVG);
  }
  return ct_comm_all_reduce(d->c, p, k, dt, CT_AVG);
}

/* All-reduces g[0, n) to the mean over the ranks: in place in fp32, or rounded into the bf16 wire
 * w (widened back in ct_ddp_finish, after the join). Buckets of d->bucket floats (as
 * ct_ddp_reduce_grads), or as many bytes of bf16. flat: g's offset in the gradients, or NOT_FLAT. */
static ct_status reduce_floats(ct_ddp *d, float *g, uint16_t *w, size_t n, size_t flat) {
  const size_t per = w ? d->bucket * 2 : d->bucket; /* a bucket holds as many bytes as in fp32 */
  const size_t nb = (n + per - 1) / per;
  for (size_t b = 0, off = 0; off < n; b++, off += per) {
    const size_t k = n - off < per ? n - off : per;
    /* rounded a bucket at a time: the next bucket's rounding overlaps this one's all-reduce */
    if (w && !d->planning) ct_model_ops(d->m)->f32_to_bf16(w + off, g + off, k);
    ct_status st = reduce_bucket(d, w ? (void *)(w + off) : (void *)(g + off),
                                 flat == NOT_FLAT ? NOT_FLAT : flat + off, k, w ? CT_BF16 : CT_F32);
    if (st != CT_OK)
      return ct_add_context(st, "ddp gradient bucket %zu of %zu in %s (elements %zu..%zu of %zu): ",
                            b + 1, nb, w ? "bf16" : "f32", off, off + k, n);
    if (!d->planning) d->buckets++; /* one all-reduce */
  }
  return CT_OK;
}

/* Issues grads[lo, lo + n) as one bucket. `last`: nothing is left to compute that it could
 * overlap (the end of backward, or the range a backward that stopped early left): the full
 * communicator takes it. */
static ct_status issue(ct_ddp *d, size_t lo, size_t n, bool last) {
  if (d->lean && !d->planning) CT_TRY(ct_comm_use_lean(d->c, !last));
  /* CT_CE_TAIL_NCCL=1 (a measurement switch): with the copy-engine all-reduce, the range left
   * at the end of backward (the embedding's gradient, ~154 MB in f32 for GPT-2) goes through
   * NCCL, which moves large buffers faster (297 against ~190 GB/s on 2 H200s) and has no GEMMs
   * left to slow down; the overlapped buckets keep the copy engines. On 2 H200s (GPT-2 124M,
   * bench/results/ddp_ce_tail_2026-11-30_2xH200_cc145e4.txt) rank 0's tail was 4.0 ms against
   * 4.4 without it, and tokens/s stayed within the runs' spread, so it stays off. */
  d->in_tail = last && d->tail_nccl && !d->planning;
  float *g = ct_model_grads(d->m) + lo;
  ct_status st = reduce_floats(d, g, d->wire ? (uint16_t *)d->wire + lo : NULL, n, lo);
  d->in_tail = false;
  if (st != CT_OK) return ct_add_context(st, "overlapped ddp (elements %zu..%zu): ", lo, lo + n);
  return CT_OK;
}

static ct_status flush(ct_ddp *d, bool last) {
  if (d->lo == d->hi) return CT_OK;
  CT_TRY(issue(d, d->lo, d->hi - d->lo, last));
  d->hi = d->lo;
  return CT_OK;
}

/* This rank's flags for the armed batch's tokens, and their max over the group: queued before the
 * forward, so it runs during the forward (NCCL: on the side stream; pre_forward joins it). */
static ct_status flag_tokens(ct_ddp *d, const int32_t *tok, int n) {
  const size_t bytes = (size_t)d->V * sizeof(int32_t);
  memset(d->hflags, 0, bytes);
  for (int i = 0; i < n; i++)
    if (tok[i] >= 0 && tok[i] < d->V) d->hflags[tok[i]] = 1; /* the forward refuses other ids */
  ct_model_ops(d->m)->to_device(d->flags, d->hflags, bytes);
  if (d->lean) CT_TRY(ct_comm_use_lean(d->c, true));
  ct_status st = ct_comm_all_reduce(d->c, d->flags, (size_t)d->V, CT_I32, CT_MAX);
  if (st != CT_OK) return ct_add_context(st, "ddp: flagging the embedding rows of the batch: ");
  return CT_OK;
}

/* Before the forward of the last unit (final norm and head), while the host still queues the
 * forward: the compute stream waits for the flags' all-reduce (done by now), compacts them into
 * the row list and copies them to the host behind the rest of the forward, whose loss the host
 * waits for anyway: no wait of its own. */
static ct_status pre_forward(void *ctx, int u) {
  ct_ddp *d = ctx;
  if (!d->armed || u != ct_model_n_units(d->m) - 1) return CT_OK;
  const ct_ops *o = ct_model_ops(d->m);
  CT_TRY(ct_comm_join(d->c));
  o->flagged_rows(d->rows, d->flags, d->V);
  const size_t bytes = (size_t)d->V * sizeof(int32_t);
  if (d->hpinned && o->to_host_async) o->to_host_async(d->hflags, d->flags, bytes);
  else o->to_host(d->hflags, d->flags, bytes);
  return CT_OK;
}

/* The lookup's share, at the end of backward: the flagged rows move out of emb (leaving it zero)
 * into packed, whose average is backward's last collective; ct_ddp_finish adds it in. hflags
 * holds the reduced flags: its copy was queued before the forward's loss, which the host has
 * read since (reading waits for the stream). Every rank reduced the same flags, so every rank
 * counts the same rows; at most cap (each rank's batch flags at most its max_B x max_T tokens). */
static ct_status reduce_rows(ct_ddp *d) {
  int k = 0;
  for (int i = 0; i < d->V; i++) k += d->hflags[i] != 0;
  ct_model_ops(d->m)->take_rows(d->packed, d->emb, d->rows, k, d->C);
  if (d->lean) CT_TRY(ct_comm_use_lean(d->c, false));
  ct_status st = reduce_floats(d, d->packed, d->pwire, (size_t)k * d->C, NOT_FLAT);
  if (st != CT_OK) return ct_add_context(st, "ddp: the embedding lookup's %d rows: ", k);
  d->nrows = k;
  d->rows_queued = true;
  return CT_OK;
}

static ct_status post_backward(void *ctx, int u) {
  ct_ddp *d = ctx;
  if (!d->armed) return CT_OK;
  size_t off, n;
  ct_model_unit(d->m, u, &off, &n);
  const bool sparse = d->emb != NULL;
  /* CT_DDP_GEMM_SMS=N: from here on the buckets' all-reduces overlap backward's GEMMs; those aim
   * at N multiprocessors so an all-reduce's few CTAs do not push a GEMM's last blocks into a
   * second wave */
  if (d->gemm_sms > 0 && !d->sms_set && !d->planning && ct_model_ops(d->m)->gemm_sm_target) {
    ct_model_ops(d->m)->gemm_sm_target(d->gemm_sms);
    d->sms_set = true;
  }
  /* the head is done, so the embedding's own gradient is final: reduce it while the layers run */
  if (sparse && u == ct_model_n_units(d->m) - 1)
    CT_TRY(issue(d, d->e_lo, d->e_hi - d->e_lo, false));
  if (sparse && u == 0) { /* the rest of the unit (wpe); the embedding is reduced already */
    n = off + n - d->e_hi;
    off = d->e_hi;
  }
  if (off + n != d->lo) { /* not adjacent (never, with the model's order): reduce what is pending */
    CT_TRY(flush(d, false));
    d->hi = off + n;
  }
  d->lo = off;
  /* The full communicator takes what is issued at the very end of backward: the embedding's unit
   * (unless sparse: its rows follow, below) and, with the lean one, the first layer's bucket too:
   * issued a fraction of a millisecond before backward ends, it would still be crawling through
   * the lean communicator's few CTAs after backward (2 H200s, GPT-2 124M: tails of 1.1-3.2 ms
   * with it there, bench/results/ddp_lean_marks_2026-11-30_2xH200_807a8db.txt; 1.3-2.5 ms with it
   * here, call35_399fdea.txt and call41_3037e8e.txt: no clear change). */
  const bool full = u == 0 ? !sparse : d->lean && u == 1;
  if ((d->overlap && d->hi - d->lo >= d->bucket) || u == 0 || full) CT_TRY(flush(d, full));
  if (sparse && u == 0 && !d->planning) CT_TRY(reduce_rows(d));
  return CT_OK;
}

/* The buckets an armed backward issues, learned by running the hook over the units in
 * backward's order (trainer/model.h: L+1, L, ..., 0) with nothing reduced. */
static ct_status plan_buckets(ct_ddp *d) {
  d->planning = d->armed = true;
  d->lo = d->hi = ct_model_numel(d->m);
  ct_status st = CT_OK;
  for (int u = ct_model_n_units(d->m) - 1; u >= 0 && st == CT_OK; u--) st = post_backward(d, u);
  if (st == CT_OK) st = flush(d, true);
  d->planning = d->armed = false;
  d->buckets = 0;
  return st;
}

/* parallel.ce_allreduce: the bucket table, registered with the buffer the buckets travel in. */
static ct_status ce_init(ct_ddp *d) {
  CT_TRY(plan_buckets(d));
  const bool bf16 = d->wire != NULL;
  void *buf = bf16 ? d->wire : (void *)ct_model_grads(d->m);
  char why[320] = "";
  CT_TRY(ct_comm_ce_create(d->c, buf, ct_model_numel(d->m), bf16 ? CT_BF16 : CT_F32, d->plan,
                           d->nplan, &d->ce, why, sizeof why));
  if (ct_comm_rank(d->c) != 0) return CT_OK;
  if (d->ce)
    ct_log_info("ddp: parallel.ce_allreduce: %d gradient buckets (%s) all-reduced by the copy "
                "engines over peer-mapped buffers", d->nplan, bf16 ? "bf16" : "fp32");
  else
    ct_log_info("ddp: parallel.ce_allreduce = true does not apply, the buckets go through %s: %s",
                ct_comm_backend(d->c), why);
  return CT_OK;
}

/* The buffers of the sparse embedding gradient (ddp.h). */
static ct_status sparse_init(ct_ddp *d, bool bf16) {
  const ct_ops *o = ct_model_ops(d->m);
  const ct_param *e = ct_model_embedding(d->m);
  d->V = e->shape[0];
  d->C = e->shape[1];
  d->e_lo = e->offset;
  d->e_hi = e->offset + e->numel;
  const size_t tokens = (size_t)ct_comm_size(d->c) * (size_t)ct_model_max_B(d->m) *
                        (size_t)ct_model_max_T(d->m);
  d->cap = tokens < (size_t)d->V ? (int)tokens : d->V;
  const size_t vbytes = (size_t)d->V * sizeof(int32_t), pn = (size_t)d->cap * d->C;
  d->hpinned = o->host_alloc && o->host_free;
  d->hflags = d->hpinned ? o->host_alloc(vbytes) : malloc(vbytes);
  d->emb = o->alloc((size_t)d->V * d->C * sizeof(float));
  d->flags = o->alloc(vbytes);
  d->rows = o->alloc((size_t)d->cap * sizeof(int32_t));
  d->packed = o->alloc(pn * sizeof(float));
  if (bf16) d->pwire = o->alloc(pn * sizeof(uint16_t));
  if (!d->hflags || !d->emb || !d->flags || !d->rows || !d->packed || (bf16 && !d->pwire)) {
    const double mib =
        ((double)d->V * d->C * 4 + (double)pn * (bf16 ? 6 : 4) + 2.0 * vbytes) / 1048576.0;
    return ct_set_error(CT_ERR_NOMEM, "ddp: no memory for the sparse embedding gradient (%.1f MiB;"
                        " parallel.sparse_embedding_grad = false does without)", mib);
  }
  return CT_OK;
}

ct_status ct_ddp_create(ct_model *model, ct_comm *c, const ct_ddp_cfg *cfg, ct_ddp **out) {
  if (cfg->reduce_dtype != CT_F32 && cfg->reduce_dtype != CT_BF16)
    return ct_set_error(CT_ERR_USAGE, "ddp: gradients are reduced in fp32 or bf16, not %s",
                        ct_dtype_name(cfg->reduce_dtype));
  ct_ddp *d = ct_calloc(1, sizeof *d, "ddp");
  if (!d) return CT_ERR_NOMEM;
  d->m = model;
  d->c = c;
  d->bucket = cfg->bucket_floats ? cfg->bucket_floats : ct_ddp_bucket_floats(0);
  d->nrows = -1;
  d->overlap = cfg->overlap;
  const char *sms = getenv("CT_DDP_GEMM_SMS");
  d->gemm_sms = sms && cfg->overlap ? atoi(sms) : 0;
  ct_status st = CT_OK;
  if (!cfg->overlap && (cfg->overlap_ctas > 0 || cfg->sparse_embedding || cfg->ce_allreduce)) {
    st = ct_set_error(CT_ERR_USAGE, "ddp: overlap = false reduces every bucket after backward; the"
                      " lean communicator, the sparse embedding gradient and the copy-engine"
                      " all-reduce are ways of overlapping (turn them off)");
    goto fail;
  }
  if (cfg->reduce_dtype == CT_BF16) {
    const size_t bytes = ct_model_numel(model) * sizeof(uint16_t);
    d->wire = ct_model_ops(model)->alloc(bytes);
    if (!d->wire) {
      st = ct_set_error(CT_ERR_NOMEM, "ddp: no memory for the bf16 gradient buffer (%.1f MiB)",
                        (double)bytes / 1048576.0);
      goto fail;
    }
  }
  if (cfg->overlap_ctas > 0) {
    st = ct_comm_make_lean(c, cfg->overlap_ctas);
    if (st != CT_OK) {
      ct_add_context(st, "ddp (parallel.overlap_ctas = %d): ", cfg->overlap_ctas);
      goto fail;
    }
    d->lean = true;
  }
  /* tensor parallelism: the tokens are not this rank's embedding rows (a vocabulary slice) */
  if (cfg->sparse_embedding && ct_model_tp_size(model) == 1)
    CT_TRY_GOTO(sparse_init(d, cfg->reduce_dtype == CT_BF16), fail);
  if (cfg->ce_allreduce) {
    const char *tn = getenv("CT_CE_TAIL_NCCL");
    d->tail_nccl = tn && !strcmp(tn, "1");
    st = ce_init(d);
    if (st != CT_OK) {
      ct_add_context(st, "ddp (parallel.ce_allreduce = true): ");
      goto fail;
    }
  }
  ct_model_hooks h = {.ctx = d, .pre_forward = d->emb ? pre_forward : NULL,
                      .post_backward = post_backward};
  ct_model_set_hooks(model, &h);
  *out = d;
  return CT_OK;
fail:
  ct_ddp_destroy(d);
  return st;
}

void ct_ddp_destroy(ct_ddp *d) {
  if (!d) return;
  const ct_ops *o = ct_model_ops(d->m);
  ct_model_set_hooks(d->m, NULL);
  ct_model_set_embed_grad(d->m, NULL);
  ct_comm_ce_destroy(d->ce); /* before the buffers it maps */
  free(d->plan);
  if (d->wire) o->free(d->wire);
  if (d->hpinned) o->host_free(d->hflags);
  else free(d->hflags);
  if (d->emb) o->free(d->emb);
  if (d->flags) o->free(d->flags);
  if (d->rows) o->free(d->rows);
  if (d->packed) o->free(d->packed);
  if (d->pwire) o->free(d->pwire);
  free(d);
}

ct_status ct_ddp_arm(ct_ddp *d, bool reduce, const int32_t *tokens, int n) {
  d->armed = reduce;
  d->lo = d->hi = ct_model_numel(d->m);
  d->buckets = d->ce_buckets = d->reduces = 0;
  d->rows_queued = false;
  if (d->emb) ct_model_set_embed_grad(d->m, reduce ? d->emb : NULL);
  if (!reduce) return CT_OK;
  CT_TRY(ct_comm_set_overlap(d->c, true));
  return d->emb ? flag_tokens(d, tokens, n) : CT_OK;
}

ct_status ct_ddp_finish(ct_ddp *d) {
  ct_status st = flush(d, true); /* a backward that stopped early leaves a pending range */
  if (st == CT_OK && d->ce) st = ct_comm_ce_finish(d->c, d->ce); /* the last all-gather's wait */
  d->armed = false;
  if (d->sms_set) { /* the optimizer and the next forward have nothing to share SMs with */
    ct_model_ops(d->m)->gemm_sm_target(0);
    d->sms_set = false;
  }
  if (d->emb) ct_model_set_embed_grad(d->m, NULL);
  ct_status off = ct_comm_set_overlap(d->c, false); /* joins the side stream */
  if (st == CT_OK) st = off;
  /* queued after the join: these see every result */
  const ct_ops *o = ct_model_ops(d->m);
  if (st == CT_OK && d->wire && d->buckets)
    o->bf16_to_f32(ct_model_grads(d->m), d->wire, ct_model_numel(d->m));
  if (st == CT_OK && d->rows_queued) { /* the lookup's averaged rows join the embedding's average */
    if (d->pwire) o->bf16_to_f32(d->packed, d->pwire, (size_t)d->nrows * d->C);
    o->scatter_add_rows(ct_model_grads(d->m) + d->e_lo, d->packed, d->rows, d->nrows, d->C);
  }
  if (st == CT_OK) st = ct_comm_sync(d->c); /* bounded wait: a dead peer is an error */
  return st;
}

int ct_ddp_buckets(const ct_ddp *d) { return d->buckets; }

int ct_ddp_ce_buckets(const ct_ddp *d, int *of) {
  if (of) *of = d->reduces;
  return d->ce_buckets;
}

int ct_ddp_sparse_rows(const ct_ddp *d) { return d->emb ? d->nrows : -1; }
