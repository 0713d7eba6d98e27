/* parallel/zero.c — ZeRO-1/2/3 over the model's units (see zero.h). */
#include "parallel/zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "parallel/tp.h"

#define SLOTS 2 /* rotating gathered-layer buffers: the layer in use and the prefetched one */

struct ct_zero {
  ct_model *m;
  ct_comm *c;
  const ct_ops *o;
  int stage, rank, world, U, L; /* U = L + 2 units */
  bool reshard;                 /* stage 3: free gathered layers after forward */
  size_t ab;                    /* working-dtype bytes */
  ct_dtype wdt;                 /* working dtype for gathers */
  size_t numel, S;              /* flat buffer; shard floats (numel / world) */
  size_t *uoff, *un;            /* (U) unit offset and floats */
  ct_adamw opt;                 /* moments of the shard (lo = 0, hi = S) + hyperparameters */
  float *sg;                    /* (S) stages 2/3: accumulated gradient shard */
  float *sw;                    /* (S) stage 3: fp32 master shard */
  char *swk;                    /* (S) stage 3: working-dtype shard (== sw for fp32) */
  float *gbuf_glob[2];          /* stages 2/3: full gradients of units 0 and L+1 */
  float *gbuf_layer[2];         /* stages 2/3: layer u's full gradient is in gbuf_layer[u % 2]
                                 * (its reduce-scatter overlaps the next layer's backward) */
  char *wglob[2];               /* stage 3: gathered weights of units 0 and L+1 */
  char *wslot[SLOTS];           /* stage 3, reshard: gathered layers */
  char *wfull;                  /* stage 3, no reshard: every layer's gathered weights */
  int slot_holds[SLOTS];        /* layer unit held by each slot (-1: none) */
  bool *gathered;               /* (U) stage 3: unit's gathered weights are current */
  float *lent;                  /* stage 3: full master lent to the model for a checkpoint */
  float *scratch;               /* (2) device floats for the norm all-reduce over NCCL */
  ct_comm *tp;                  /* tensor-parallel group (2-D mesh): the norm sums over it too */
  ct_comm *gc;                  /* stages 2/3: a copy of the dp group in overlap mode for the
                                 * weight gathers and gradient reduce-scatters (NCCL: their own
                                 * stream, joined before the compute stream uses a result) */
};

int ct_zero_numel_multiple(int world) { return 16 * world; }
int ct_zero_stage(const ct_zero *z) { return z->stage; }
double ct_zero_grad_factor(const ct_zero *z) { return z->stage >= 2 ? 1.0 / z->world : 1.0; }
int ct_zero_adam_step(const ct_zero *z) { return z->opt.step; }

static size_t slice(const ct_zero *z, int u) { return z->un[u] / (size_t)z->world; }
/* flat offset of this rank's slice of unit u, and its offset in the shard */
static size_t own(const ct_zero *z, int u) { return z->uoff[u] + (size_t)z->rank * slice(z, u); }
static size_t shard_at(const ct_zero *z, int u) { return z->uoff[u] / (size_t)z->world; }
/* Parameter p's part of this rank's slice: the unit *u holding it and the flat range [*s, *e)
 * (false, nothing owned, when the slice misses p); this rank's slice of *u starts at *lo. */
static bool owned(const ct_zero *z, const ct_param *p, int *u, size_t *lo, size_t *s, size_t *e) {
  int k = 0;
  while (k + 1 < z->U && z->uoff[k + 1] <= p->offset) k++;
  const size_t l = own(z, k), hi = l + slice(z, k);
  *u = k, *lo = l;
  *s = p->offset > l ? p->offset : l;
  *e = p->offset + p->numel < hi ? p->offset + p->numel : hi;
  return *s < *e;
}
static bool global_unit(const ct_zero *z, int u) { return u == 0 || u == z->U - 1; }
static float *gbuf(ct_zero *z, int u) {
  return global_unit(z, u) ? z->gbuf_glob[u ? 1 : 0] : z->gbuf_layer[u % 2];
}

static ct_status ctx(ct_status st, const ct_zero *z, const char *what, int u) {
  if (st == CT_OK) return st;
  return ct_add_context(st, "zero%d %s of unit %d (of %d), rank %d: ", z->stage, what, u, z->U,
                        z->rank);
}

/* ---- stage 3: gathering weights ---- */

static char *weights_of(ct_zero *z, int u) {
  if (global_unit(z, u)) return z->wglob[u ? 1 : 0];
  if (!z->reshard) return z->wfull + (z->uoff[u] - z->uoff[1]) * z->ab;
  return z->wslot[u % SLOTS];
}

static ct_status gather(ct_zero *z, int u) {
  if (z->gathered[u] && (global_unit(z, u) || !z->reshard || z->slot_holds[u % SLOTS] == u))
    return CT_OK;
  char *dst = weights_of(z, u);
  ct_status st = ct_comm_all_gather(z->gc, z->swk + shard_at(z, u) * z->ab, dst, slice(z, u), z->wdt);
  CT_TRY(ctx(st, z, "all-gather of weights", u));
  if (!global_unit(z, u) && z->reshard) {
    int prev = z->slot_holds[u % SLOTS];
    if (prev >= 0) z->gathered[prev] = false; /* its slot is reused: freed */
    z->slot_holds[u % SLOTS] = u;
  }
  z->gathered[u] = true;
  ct_model_set_unit(z->m, u, dst, NULL);
  return CT_OK;
}

/* The gathers run on gc's stream (NCCL): each waits for the compute work queued before it (so a
 * slot is overwritten only after the layer that used it), and the compute stream joins before it
 * reads a gathered unit; the prefetch issued after the join overlaps the unit's compute. */
/* Stages 2/3: a micro-batch's forward starts after the bounded wait for the previous backward's
 * reduce-scatters (the host reads this forward's loss, an unbounded stream wait otherwise). */
static ct_status z2_pre_forward(void *p, int u) {
  ct_zero *z = p;
  return u == 0 ? ct_comm_sync(z->gc) : CT_OK;
}

static ct_status z3_pre_forward(void *p, int u) {
  ct_zero *z = p;
  if (u == 0) CT_TRY(ct_comm_sync(z->gc)); /* the last backward's reduce-scatters */
  CT_TRY(gather(z, u));
  CT_TRY(ct_comm_join(z->gc));
  if (u >= 1 && u + 1 <= z->L) CT_TRY(gather(z, u + 1)); /* prefetch the next layer */
  /* the loss comes next and the host reads it (an unbounded stream wait): first the bounded
   * wait for every gather, so a dead peer is an error here and not a hang there */
  if (u == z->U - 1) CT_TRY(ct_comm_sync(z->gc));
  return CT_OK;
}

/* ---- stages 2/3: gradients ---- */

/* Before unit u's backward: clear its gradient buffer and put this rank's accumulated shard in
 * its own block, so the summing reduce-scatter afterwards yields shard + sum of new gradients. */
static void prepare_grad(ct_zero *z, int u) {
  float *g = gbuf(z, u);
  z->o->zero(g, z->un[u] * sizeof(float));
  const size_t s = slice(z, u);
  z->o->copy2d(g + (size_t)z->rank * s, s * sizeof(float), z->sg + shard_at(z, u), s * sizeof(float),
               s * sizeof(float), 1);
  ct_model_set_unit(z->m, u, NULL, g);
}

/* Before unit u's backward. gc's queue then ends with the reduce-scatter of the unit above
 * (u + 1), which may keep running (it reads the other gradient slot): the compute stream joins
 * everything before it, which includes the reduce-scatter of u + 2 (this slot's last user) and
 * the prefetched gather of u. A gather issued here (not prefetched) is joined fully. */
static ct_status z_pre_backward(void *p, int u) {
  ct_zero *z = p;
  bool fresh = false;
  if (z->stage == 3) {
    fresh = !(z->gathered[u] && (global_unit(z, u) || !z->reshard || z->slot_holds[u % SLOTS] == u));
    CT_TRY(gather(z, u));
  }
  CT_TRY(ct_comm_join_lagging(z->gc, fresh || u == z->U - 1 ? 0 : 1));
  if (u == z->U - 1) { /* first backward hook: both global units */
    prepare_grad(z, 0);
    prepare_grad(z, u);
  } else if (u != 0) {
    prepare_grad(z, u);
  }
  if (z->stage == 3 && u >= 2 && u <= z->L) CT_TRY(gather(z, u - 1)); /* prefetch the layer below */
  return CT_OK;
}

static ct_status z_post_backward(void *p, int u) {
  ct_zero *z = p;
  ct_status st = ct_comm_reduce_scatter(z->gc, gbuf(z, u), z->sg + shard_at(z, u), slice(z, u),
                                        CT_F32, CT_SUM);
  return ctx(st, z, "gradient reduce-scatter", u);
}

/* ---- creation ---- */

static void *zalloc(ct_zero *z, size_t bytes, bool *ok) {
  void *p = z->o->alloc(bytes ? bytes : 64);
  if (!p) *ok = false;
  return p;
}

ct_status ct_zero_create(ct_model *m, ct_comm *c, int stage, bool reshard_after_forward,
                         const ct_train_cfg *t, const ct_adamw *full_moments, ct_zero **out) {
  if (stage < 1 || stage > 3) return ct_set_error(CT_ERR_USAGE, "zero: stage %d (1, 2 or 3)", stage);
  ct_zero *z = ct_calloc(1, sizeof *z, "zero");
  if (!z) return CT_ERR_NOMEM;
  z->m = m;
  z->c = c;
  z->o = ct_model_ops(m);
  z->stage = stage;
  z->rank = ct_comm_rank(c);
  z->world = ct_comm_size(c);
  z->U = ct_model_n_units(m);
  z->L = z->U - 2;
  z->reshard = reshard_after_forward;
  z->ab = (size_t)z->o->act_bytes;
  z->wdt = z->ab == 4 ? CT_F32 : CT_BF16; /* gathers copy bits: any 2-byte type moves alike */
  z->numel = ct_model_numel(m);
  z->S = z->numel / (size_t)z->world;
  z->uoff = ct_calloc((size_t)z->U, sizeof *z->uoff, "zero units");
  z->un = ct_calloc((size_t)z->U, sizeof *z->un, "zero units");
  z->gathered = ct_calloc((size_t)z->U, sizeof *z->gathered, "zero units");
  ct_status st = CT_OK;
  if (!z->uoff || !z->un || !z->gathered) { st = CT_ERR_NOMEM; goto fail; }
  size_t max_layer = 0;
  for (int u = 0; u < z->U; u++) {
    ct_model_unit(m, u, &z->uoff[u], &z->un[u]);
    if (z->un[u] % (size_t)ct_zero_numel_multiple(z->world)) {
      st = ct_set_error(CT_ERR_USAGE, "zero: unit %d holds %zu floats, not a multiple of %d (model"
                        " built without numel_multiple for %d ranks)", u, z->un[u],
                        ct_zero_numel_multiple(z->world), z->world);
      goto fail;
    }
    if (!global_unit(z, u) && z->un[u] > max_layer) max_layer = z->un[u];
  }
  for (int k = 0; k < SLOTS; k++) z->slot_holds[k] = -1;
  CT_TRY_GOTO(ct_adamw_create_shard(&z->opt, m, t, 0, z->S), fail);
  const ct_ops *o = z->o;
  bool ok = true;
  if (full_moments && full_moments->m) { /* a checkpoint's whole moments: take our slices */
    for (int u = 0; u < z->U; u++) {
      const size_t s = slice(z, u) * sizeof(float);
      o->copy2d(z->opt.m + shard_at(z, u), s, full_moments->m + own(z, u), s, s, 1);
      o->copy2d(z->opt.v + shard_at(z, u), s, full_moments->v + own(z, u), s, s, 1);
    }
    z->opt.step = full_moments->step;
  }
  if (stage >= 2) {
    z->sg = zalloc(z, z->S * sizeof(float), &ok);
    z->gbuf_glob[0] = zalloc(z, z->un[0] * sizeof(float), &ok);
    z->gbuf_glob[1] = zalloc(z, z->un[z->U - 1] * sizeof(float), &ok);
    z->gbuf_layer[0] = zalloc(z, max_layer * sizeof(float), &ok);
    z->gbuf_layer[1] = zalloc(z, max_layer * sizeof(float), &ok);
  }
  if (stage == 3) {
    z->sw = zalloc(z, z->S * sizeof(float), &ok);
    z->swk = z->ab == sizeof(float) ? (char *)z->sw : zalloc(z, z->S * z->ab, &ok);
    z->wglob[0] = zalloc(z, z->un[0] * z->ab, &ok);
    z->wglob[1] = zalloc(z, z->un[z->U - 1] * z->ab, &ok);
    if (z->reshard)
      for (int k = 0; k < SLOTS; k++) z->wslot[k] = zalloc(z, max_layer * z->ab, &ok);
    else
      z->wfull = zalloc(z, (z->uoff[z->U - 1] - z->uoff[1]) * z->ab, &ok);
  }
  if (!strcmp(ct_comm_backend(c), "nccl")) z->scratch = zalloc(z, 2 * sizeof(float), &ok);
  if (!ok) {
    st = ct_set_error(CT_ERR_NOMEM, "zero%d: out of memory on %s for the shards and buffers", stage,
                      o->name);
    goto fail;
  }
  if (stage >= 2) { /* gathers and reduce-scatters get a group of their own to overlap on */
    CT_TRY_GOTO(ct_comm_split(c, 0, z->rank, &z->gc), fail);
    CT_TRY_GOTO(ct_comm_set_overlap(z->gc, true), fail);
  }
  if (stage == 3) { /* the master shard from the full master, then the full copies go */
    const float *w = ct_model_params(m);
    for (int u = 0; u < z->U; u++) {
      const size_t s = slice(z, u) * sizeof(float);
      o->copy2d(z->sw + shard_at(z, u), s, w + own(z, u), s, s, 1);
    }
    if (z->swk != (char *)z->sw) o->cast_params(z->swk, z->sw, z->S);
  }
  if (stage >= 2) ct_model_drop_full(m, stage == 3, true);
  ct_model_hooks h = {.ctx = z};
  if (stage >= 2) {
    h.pre_forward = z2_pre_forward;
    h.pre_backward = z_pre_backward;
    h.post_backward = z_post_backward;
  }
  if (stage == 3) h.pre_forward = z3_pre_forward;
  ct_model_set_hooks(m, &h);
  *out = z;
  return CT_OK;
fail:
  ct_zero_destroy(z);
  return st;
}

void ct_zero_destroy(ct_zero *z) {
  if (!z) return;
  const ct_ops *o = z->o;
  ct_model_set_hooks(z->m, NULL);
  ct_adamw_destroy(&z->opt, o);
  void *bufs[] = {z->sg, z->gbuf_glob[0], z->gbuf_glob[1], z->gbuf_layer[0], z->gbuf_layer[1], z->wglob[0],
                  z->wglob[1], z->wslot[0], z->wslot[1], z->wfull, z->lent, z->scratch};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) o->free(bufs[i]);
  if (z->swk && z->swk != (char *)z->sw) o->free(z->swk);
  if (z->sw) o->free(z->sw);
  if (z->gc) {
    ct_comm_set_overlap(z->gc, false);
    ct_comm_destroy(z->gc);
  }
  free(z->uoff);
  free(z->un);
  free(z->gathered);
  free(z);
}

/* ---- the step ---- */

void ct_zero_zero_grad(ct_zero *z) {
  if (z->stage == 1) ct_model_zero_grad(z->m);
  else z->o->zero(z->sg, z->S * sizeof(float));
}

/* This rank's gradient slice of unit u (averaged once finish_grads is done). */
static float *grad_slice(ct_zero *z, int u) {
  return z->stage == 1 ? ct_model_grads(z->m) + own(z, u) : z->sg + shard_at(z, u);
}

ct_status ct_zero_finish_grads(ct_zero *z) {
  if (z->stage == 1) {
    float *g = ct_model_grads(z->m);
    for (int u = 0; u < z->U; u++) {
      ct_status st = ct_comm_reduce_scatter(z->c, g + z->uoff[u], g + own(z, u), slice(z, u),
                                            CT_F32, CT_AVG);
      CT_TRY(ctx(st, z, "gradient reduce-scatter", u));
    }
  }
  if (z->gc) CT_TRY(ct_comm_sync(z->gc)); /* prefetches issued and not used (none normally) */
  return ct_comm_sync(z->c); /* bounded wait: a dead peer is an error, not a hang */
}

void ct_zero_set_tp(ct_zero *z, ct_comm *tp) { z->tp = tp; }

/* Sum of squares of this rank's gradient slices, parameter by parameter, each weighted for
 * tensor parallelism (replicated parameters count once over the tp group). */
static double tp_weighted_sumsq(ct_zero *z) {
  const int T = ct_model_tp_size(z->m);
  double sq = 0;
  for (int i = 0; i < ct_model_n_params(z->m); i++) {
    const ct_param *p = ct_model_param(z->m, i);
    int u;
    size_t lo, s, e;
    if (owned(z, p, &u, &lo, &s, &e))
      sq += z->o->sumsq(grad_slice(z, u) + (s - lo), e - s) * ct_tp_norm_weight(p, T);
  }
  return sq;
}

ct_status ct_zero_grad_norm(ct_zero *z, double *norm) {
  double sq = 0; /* padding gaps hold zero gradients */
  if (z->tp && ct_comm_size(z->tp) > 1)
    sq = tp_weighted_sumsq(z);
  else if (z->stage == 1)
    for (int u = 0; u < z->U; u++) sq += z->o->sumsq(grad_slice(z, u), slice(z, u));
  else
    sq = z->o->sumsq(z->sg, z->S);
  /* the double partial sums travel as f32 (hi, lo) pairs: summing both keeps far more digits
   * than one float would */
  float v[2] = {(float)sq, (float)(sq - (double)(float)sq)};
  float *dev = z->scratch ? z->scratch : v; /* NCCL reduces device memory */
  if (z->scratch) z->o->to_device(dev, v, sizeof v);
  ct_status st = ct_comm_all_reduce(z->c, dev, 2, CT_F32, CT_SUM);
  if (st == CT_OK) st = ct_comm_sync(z->c);
  if (st == CT_OK && z->tp && ct_comm_size(z->tp) > 1) {
    st = ct_comm_all_reduce(z->tp, dev, 2, CT_F32, CT_SUM);
    if (st == CT_OK) st = ct_comm_sync(z->tp);
  }
  if (st == CT_OK && z->scratch) z->o->to_host(v, dev, sizeof v);
  CT_TRY(ctx(st, z, "gradient-norm all-reduce", -1));
  *norm = sqrt((double)v[0] + (double)v[1]);
  return CT_OK;
}

ct_status ct_zero_step(ct_zero *z, double lr, float grad_scale) {
  const ct_ops *o = z->o;
  ct_adamw *a = &z->opt;
  float *w = z->stage == 3 ? NULL : ct_model_params(z->m);
  a->step++;
  for (int i = 0; i < ct_model_n_params(z->m); i++) {
    const ct_param *p = ct_model_param(z->m, i);
    int u;
    size_t lo, s, e;
    if (!owned(z, p, &u, &lo, &s, &e)) continue; /* outside this rank's slice of its unit */
    const size_t k = shard_at(z, u) + (s - lo); /* position in the shard */
    float *master = z->stage == 3 ? z->sw + k : w + s;
    o->adamw(master, grad_slice(z, u) + (s - lo), a->m + k, a->v + k, e - s, (float)lr,
             (float)a->beta1, (float)a->beta2, (float)a->eps,
             p->decay ? (float)a->weight_decay : 0.0f, grad_scale, a->step);
  }
  if (z->stage == 3) {
    if (z->swk != (char *)z->sw) o->cast_params(z->swk, z->sw, z->S);
    for (int u = 0; u < z->U; u++) z->gathered[u] = false; /* the next forward gathers */
    return CT_OK;
  }
  for (int u = 0; u < z->U; u++) {
    ct_status st = ct_comm_all_gather(z->c, w + own(z, u), w + z->uoff[u], slice(z, u), CT_F32);
    CT_TRY(ctx(st, z, "all-gather of updated weights", u));
  }
  return ct_comm_sync(z->c);
}

/* ---- checkpoints ---- */

static ct_status gather_into(ct_zero *z, float *full, const float *shard) {
  for (int u = 0; u < z->U; u++) {
    ct_status st = ct_comm_all_gather(z->c, shard + shard_at(z, u), full + z->uoff[u], slice(z, u),
                                      CT_F32);
    CT_TRY(ctx(st, z, "checkpoint all-gather", u));
  }
  return CT_OK;
}

ct_status ct_zero_gather_full(ct_zero *z, ct_adamw *full) {
  const ct_ops *o = z->o;
  if (full) {
    *full = z->opt;
    full->segs = NULL; /* not shared with the shard's optimizer (each frees its own) */
    full->nseg = 0;
    full->lo = 0;
    full->hi = z->numel;
    full->m = o->alloc(z->numel * sizeof(float));
    full->v = o->alloc(z->numel * sizeof(float));
    if (!full->m || !full->v) return ct_set_error(CT_ERR_NOMEM, "zero: out of memory gathering AdamW state");
    CT_TRY(gather_into(z, full->m, z->opt.m));
    CT_TRY(gather_into(z, full->v, z->opt.v));
  }
  if (z->stage == 3) {
    z->lent = o->alloc(z->numel * sizeof(float));
    if (!z->lent) return ct_set_error(CT_ERR_NOMEM, "zero3: out of memory gathering the weights");
    CT_TRY(gather_into(z, z->lent, z->sw));
    ct_model_attach_params(z->m, z->lent);
  }
  return ct_comm_sync(z->c);
}

void ct_zero_release_full(ct_zero *z, ct_adamw *full) {
  if (full) ct_adamw_destroy(full, z->o);
  if (z->lent) {
    ct_model_attach_params(z->m, NULL);
    z->o->free(z->lent);
    z->lent = NULL;
  }
}

int ct_zero_n_units(const ct_zero *z) { return z->U; }
void ct_zero_unit_slice(const ct_zero *z, int u, size_t *flat, size_t *n, size_t *at) {
  *flat = own(z, u);
  *n = slice(z, u);
  *at = shard_at(z, u);
}
const ct_adamw *ct_zero_moments(const ct_zero *z) { return &z->opt; }
const float *ct_zero_master_shard(const ct_zero *z) { return z->stage == 3 ? z->sw : NULL; }
