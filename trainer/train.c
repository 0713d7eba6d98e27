#include "trainer/train.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "optim/optim.h"
#include "parallel/comm.h"
#include "parallel/ddp.h"
#include "parallel/env.h"
#include "parallel/tp.h"
#include "parallel/zero.h"
#include "trainer/checkpoint.h"
#include "trainer/data.h"
#include "trainer/device.h"
#include "trainer/generate.h"
#include "trainer/memory.h"
#include "trainer/metrics.h"
#include "trainer/model.h"
#include "trainer/tokenizer.h"

typedef struct run {
  const ct_config *cfg;
  ct_backend be;
  ct_kernel_table kt;        /* kernel variants for train and eval (kernels/registry.h) */
  ct_model *model;
  ct_adamw opt;
  ct_loader *train, *val;
  ct_metrics *metrics;
  int32_t *inputs, *targets; /* (B, T) host */
  ct_dist_env env;
  ct_store_server *server;   /* rank 0 under srun/mpirun hosts the store */
  ct_store *store;
  ct_comm *comm;             /* data-parallel group; NULL when it would have one rank */
  ct_comm *world;            /* every rank (== comm without tensor parallelism); NULL alone */
  ct_comm *tp;               /* tensor-parallel group; NULL when parallel.tensor = 1 */
  int T, tp_rank, dp_rank, dp_size; /* 2-D mesh: rank = dp_rank * T + tp_rank */
  ct_zero *zero;             /* ZeRO-1/2/3 state; NULL for ddp */
  ct_ddp *ddp;               /* overlapped bucketed all-reduce; NULL unless ddp with peers */
  ct_tp *tpx;                /* tensor-parallel callbacks; NULL without */
  ct_tokenizer *tok;
  float *scratch;            /* a few device floats for host-value collectives over NCCL */
} run;

/* SIGTERM / SIGINT (stop) and SIGUSR1 (Slurm's pre-emption warning): finish the step, agree
 * across ranks, save a checkpoint, exit. */
static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) {
  if (!stop_signal) stop_signal = sig;
}

/* Where collectives read and write: NCCL reduces device buffers in place; Gloo reduces host
 * memory, so with the CUDA table and Gloo (CUDA build without NCCL peers) buffers are staged
 * through the host. */
static bool comm_on_device(const run *r) { return r->be.cuda && !strcmp(ct_comm_backend(r->world), "nccl"); }

/* All-reduce of a few host floats over group c (identity without one). */
static ct_status host_all_reduce(run *r, ct_comm *c, float *vals, int n, ct_redop op) {
  if (!c) return CT_OK;
  if (!comm_on_device(r)) return ct_comm_all_reduce(c, vals, (size_t)n, CT_F32, op);
  r->be.ops->to_device(r->scratch, vals, sizeof(float) * (size_t)n);
  CT_TRY(ct_comm_all_reduce(c, r->scratch, (size_t)n, CT_F32, op));
  CT_TRY(ct_comm_sync(c)); /* bounded wait before the host reads the result */
  r->be.ops->to_host(vals, r->scratch, sizeof(float) * (size_t)n);
  return CT_OK;
}

/* ... over the data-parallel ranks (tensor-parallel peers hold the same values already) */
static ct_status dp_all_reduce_host(run *r, float *vals, int n, ct_redop op) {
  return host_all_reduce(r, r->comm, vals, n, op);
}

/* A named point of the step for CT_STEP_MARKS=1 (kernels/ops.h, mark). */
static void mark(run *r, const char *name) {
  if (r->be.ops->mark) r->be.ops->mark(name);
}

static ct_status dp_mean(run *r, double *v) {
  float f = (float)*v;
  CT_TRY(dp_all_reduce_host(r, &f, 1, CT_AVG));
  *v = f;
  return CT_OK;
}

/* Once per step, after the gradients: the loss mean over the data-parallel ranks and the stop
 * vote over all ranks (every rank must stop at the same step). Without tensor parallelism both are
 * the same ranks, so one 4-float sum carries the loss and which signals arrived anywhere: one
 * host wait less per step. */
/* The 4 floats of that sum: the loss, then one flag per signal. */
static void vote_pack(float v[4], double loss, double sig) {
  const int s = (int)sig;
  v[0] = (float)loss;
  v[1] = s == SIGTERM;
  v[2] = s == SIGINT;
  v[3] = s == SIGUSR1;
}

static void vote_unpack(const float v[4], int ranks, double *loss, double *sig) {
  *loss = v[0] / ranks;
  *sig = v[1] > 0 ? SIGTERM : v[2] > 0 ? SIGINT : v[3] > 0 ? SIGUSR1 : 0;
}

static ct_status step_agree(run *r, double *loss, double *sig) {
  if (!r->comm) return CT_OK;
  if (r->T > 1) {
    CT_TRY(dp_mean(r, loss));
    float f = (float)*sig;
    CT_TRY(host_all_reduce(r, r->world, &f, 1, CT_MAX));
    *sig = f;
    return CT_OK;
  }
  float v[4];
  vote_pack(v, *loss, *sig);
  CT_TRY(host_all_reduce(r, r->comm, v, 4, CT_SUM));
  vote_unpack(v, ct_comm_size(r->comm), loss, sig);
  return CT_OK;
}

/* step_agree for ddp over NCCL, in two halves: the 4 values are queued behind the last gradient
 * bucket (the compute stream has drained already: the loss was read), so the host's wait for the
 * gradients covers them too and the GPU does not idle through a vote of its own before the
 * optimizer. vote_read only after ct_ddp_finish (which waited for every collective). */
static bool vote_early(const run *r, bool sharded) {
  return r->comm && !sharded && r->T == 1 && comm_on_device(r);
}

static ct_status vote_queue(run *r, double loss, double sig) {
  float v[4];
  vote_pack(v, loss, sig);
  r->be.ops->to_device(r->scratch, v, sizeof v);
  return ct_comm_all_reduce(r->comm, r->scratch, 4, CT_F32, CT_SUM);
}

static void vote_read(run *r, double *loss, double *sig) {
  float v[4];
  r->be.ops->to_host(v, r->scratch, sizeof v);
  vote_unpack(v, ct_comm_size(r->comm), loss, sig);
}

static ct_status with_host_copy(run *r, float *dev, size_t n, float **host) {
  *host = dev;
  if (!r->be.cuda || comm_on_device(r)) return CT_OK;
  *host = ct_malloc(n * sizeof(float), "host staging");
  if (!*host) return CT_ERR_NOMEM;
  r->be.ops->to_host(*host, dev, n * sizeof(float));
  return CT_OK;
}

static void back_to_device(run *r, float *dev, float *host, size_t n) {
  if (host == dev) return;
  r->be.ops->to_device(dev, host, n * sizeof(float));
  free(host);
}

static ct_status broadcast_params(run *r) {
  float *w, *dev = ct_model_params(r->model);
  const size_t n = ct_model_numel(r->model);
  CT_TRY(with_host_copy(r, dev, n, &w));
  ct_status st = ct_comm_broadcast(r->comm, w, n, CT_F32, 0);
  back_to_device(r, dev, w, n);
  if (st == CT_OK) st = ct_comm_sync(r->comm);
  return st;
}

/* ZeRO-1/2/3 (parallel/zero.h): 0 for ddp or a single process. */
static int zero_stage(const run *r) {
  const char *d = r->cfg->parallel.data;
  if (!r->comm || strncmp(d, "zero", 4)) return 0;
  return d[4] - '0';
}

/* ---- tensor parallelism: whole tensors go through a full fp32 model in host memory ---- */

static ct_status full_host_model(run *r, ct_model **fm) {
  ct_model_cfg c = r->cfg->model; /* tp_size 0, no padding: the layout checkpoints use */
  c.no_grads = true; /* only weights pass through it: 4 bytes a parameter on every rank's host */
  return ct_model_create(&c, ct_ops_cpu(), 1, 1, fm);
}

/* Cuts this rank's slice of the full weights (and moments, when fopt) into the model / lopt. */
static ct_status tp_take(run *r, ct_model *fm, const ct_adamw *fopt, ct_adamw *lopt) {
  const ct_ops *o = r->be.ops;
  const size_t n = ct_model_numel(r->model);
  float *h = ct_calloc(n, sizeof(float), "tensor-parallel staging");
  if (!h) return CT_ERR_NOMEM;
  ct_tp_cut(fm, ct_model_params(fm), r->model, h, r->tp_rank);
  o->to_device(ct_model_params(r->model), h, n * sizeof(float));
  if (fopt) {
    ct_tp_cut(fm, fopt->m, r->model, h, r->tp_rank);
    o->to_device(lopt->m, h, n * sizeof(float));
    ct_tp_cut(fm, fopt->v, r->model, h, r->tp_rank);
    o->to_device(lopt->v, h, n * sizeof(float));
    lopt->step = fopt->step;
  }
  free(h);
  return CT_OK;
}

/* ---- sharded checkpoints (ZeRO, tensor parallelism): each rank writes its own moments ---- */

/* Every rank learns whether all succeeded (collective over the world). */
static ct_status agree(run *r, ct_status st, const char *what) {
  float failed = st != CT_OK;
  ct_status cst = host_all_reduce(r, r->world, &failed, 1, CT_MAX);
  if (st != CT_OK) return st;
  if (cst != CT_OK) return cst;
  return failed > 0 ? ct_set_error(CT_ERR_IO, "%s failed on another rank (see its log)", what) : CT_OK;
}

/* Whether no rank holds the whole weights (zero3 slices, tensor-parallel cuts): then each rank
 * writes its weight blocks beside its moments and nothing is gathered for a checkpoint. */
static bool weights_sharded(const run *r) {
  return r->T > 1 || (r->zero && ct_zero_stage(r->zero) == 3);
}

/* This rank's moments (and, when weights_sharded, its weights) as ranges of its flat buffer,
 * copied to the host, into tmp/state-rank*.h5 (and tmp/model-rank*.h5). */
static ct_status write_own_shard(run *r, const char *tmp) {
  const ct_ops *o = r->be.ops;
  const ct_adamw *a = r->zero ? ct_zero_moments(r->zero) : &r->opt;
  const size_t n = r->zero ? a->hi - a->lo : ct_model_numel(r->model);
  const int nr = r->zero ? ct_zero_n_units(r->zero) : 1;
  const bool with_w = weights_sharded(r);
  const float *zw = r->zero ? ct_zero_master_shard(r->zero) : NULL; /* zero3: the master shard */
  float *hm = ct_malloc(n * sizeof(float), "checkpoint shard");
  float *hv = ct_malloc(n * sizeof(float), "checkpoint shard");
  float *hw = with_w ? ct_malloc(n * sizeof(float), "checkpoint shard") : NULL;
  ct_ckpt_range *rg = ct_calloc((size_t)nr, sizeof *rg, "checkpoint shard");
  ct_model *full = NULL;
  ct_status st = hm && hv && rg && (hw || !with_w) ? CT_OK : CT_ERR_NOMEM;
  if (st == CT_OK) {
    o->to_host(hm, a->m, n * sizeof(float));
    o->to_host(hv, a->v, n * sizeof(float));
    if (with_w && (zw || !r->zero)) o->to_host(hw, zw ? zw : ct_model_params(r->model), n * sizeof(float));
    for (int u = 0; u < nr; u++) {
      size_t flat = 0, cnt = n, at = 0;
      if (r->zero) ct_zero_unit_slice(r->zero, u, &flat, &cnt, &at);
      /* zero1/2 under tensor parallelism: the owned slices of the full local weights */
      if (with_w && r->zero && !zw)
        o->to_host(hw + at, ct_model_params(r->model) + flat, cnt * sizeof(float));
      rg[u] = (ct_ckpt_range){flat, flat + cnt, hm + at, hv + at, with_w ? hw + at : NULL};
    }
    /* the whole-tensor table (no memory) that the blocks are cut from */
    if (r->T > 1) st = ct_memory_table_model(&r->cfg->model, r->be.ops, &full);
  }
  if (st == CT_OK)
    st = ct_checkpoint_write_shard(tmp, r->env.rank, full ? full : r->model, r->model, r->tp_rank,
                                   rg, nr);
  ct_model_destroy(full);
  free(hm);
  free(hv);
  free(hw);
  free(rg);
  return st;
}

/* A checkpoint whose moments stay sharded: rank 0 makes the temporary directory, every rank
 * holding moments of its own writes its shard files (with its weight blocks when no rank holds
 * whole weights: zero3, tensor parallelism; no gather) and rank 0 finishes the directory
 * (model.h5 — whole weights for zero1/2, else only attributes —, state.h5, rename). */
static ct_status save_sharded(run *r, int step, const ct_train_state *ts, bool writer, char *saved,
                              size_t cap) {
  const ct_train_cfg *t = &r->cfg->train;
  char tmp[4200];
  CT_TRY(agree(r, ct_checkpoint_tmp_dir(t->out_dir, step, writer, tmp, sizeof tmp),
               "creating the checkpoint directory"));
  /* ZeRO: every rank owns distinct moments; tp without ZeRO: one copy per tp rank (dp rank 0) */
  const bool mine = r->zero || r->dp_rank == 0;
  const int n_shards = r->zero ? r->env.world_size : r->T;
  CT_TRY(agree(r, mine ? write_own_shard(r, tmp) : CT_OK, "writing a checkpoint shard"));
  ct_status st = CT_OK;
  if (writer) {
    ct_train_state w = *ts;
    ct_adamw step_only = {.step = r->zero ? ct_zero_adam_step(r->zero) : r->opt.step};
    w.opt = &step_only;
    /* zero1/2 without tensor parallelism: every rank's model holds the whole weights */
    st = ct_checkpoint_save_sharded(t->out_dir, step, r->cfg, r->model, &w, n_shards,
                                    weights_sharded(r), t->keep_last, saved, cap);
  }
  return agree(r, st, "finishing the checkpoint");
}

/* Rank and world from the environment (launcher, Open MPI, Slurm, or a single process). */
static ct_status dist_detect(run *r) {
  CT_TRY(ct_dist_env_detect(&r->env));
  ct_log_set_rank(r->env.rank, r->env.world_size);
  return CT_OK;
}

/* The 2-D mesh: parallel.tensor = T ranks in a row share a model (tensor parallel), the
 * world / T rows are data parallel. */
static ct_status mesh_layout(run *r) {
  const int T = r->cfg->parallel.tensor > 1 ? r->cfg->parallel.tensor : 1, world = r->env.world_size;
  if (world % T)
    return ct_set_error(CT_ERR_CONFIG, "parallel.tensor = %d does not divide the world size %d"
                        " (data parallel = world / tensor)", T, world);
  r->T = T;
  r->tp_rank = r->env.rank % T;
  r->dp_rank = r->env.rank / T;
  r->dp_size = world / T;
  return CT_OK;
}

/* Store and process groups, once the device is chosen: NCCL between GPUs, Gloo between CPUs.
 * tp = split(world, r / T, r % T), dp = split(world, r % T, r / T) (comm.h). */
static ct_status dist_connect(run *r) {
  if (r->env.world_size == 1) return CT_OK;
  const double timeout = r->cfg->parallel.timeout_s, t0 = ct_now();
  const int rank = r->env.rank, T = r->T;
  CT_TRY(ct_dist_store_open(&r->env, timeout, &r->server, &r->store));
  if (r->be.cuda) {
    r->scratch = r->be.ops->alloc(64 * sizeof(float));
    if (!r->scratch) return ct_set_error(CT_ERR_NOMEM, "out of device memory");
    CT_TRY(ct_comm_init_nccl(r->store, rank, r->env.world_size, "dp", timeout, &r->world));
  } else {
    CT_TRY(ct_comm_init_gloo(r->store, rank, r->env.world_size, "dp", timeout, &r->world));
  }
  if (T == 1) {
    r->comm = r->world;
  } else {
    CT_TRY(ct_comm_split(r->world, rank / T, rank % T, &r->tp));
    CT_TRY(ct_comm_split(r->world, rank % T, rank / T, &r->comm));
    if (r->dp_size == 1) { /* pure tensor parallelism: no data-parallel peers */
      ct_comm_destroy(r->comm);
      r->comm = NULL;
    }
  }
  char where[512];
  ct_dist_env_describe(&r->env, where, sizeof where);
  ct_log_info("distributed: %s, %d-way %s data parallel x %d-way tensor parallel over %s,"
              " rendezvous %.2f s", where, r->dp_size, r->cfg->parallel.data, T,
              ct_comm_backend(r->world), ct_now() - t0);
  return CT_OK;
}

static void destroy_groups(run *r) {
  if (r->comm && r->comm != r->world) ct_comm_destroy(r->comm);
  if (r->tp) ct_comm_destroy(r->tp);
  if (r->world) ct_comm_destroy(r->world);
  r->comm = r->tp = r->world = NULL;
}

static void dist_teardown(run *r) {
  if (r->world) {
    ct_comm_barrier(r->world); /* nobody leaves while a peer (or the store host) still works */
    destroy_groups(r);
  }
  if (r->store) ct_store_close(r->store);
  /* rank 0 hosting the store (srun/mpirun) lets peers finish their last requests first */
  if (r->server) ct_store_server_stop_when_idle(r->server, r->cfg->parallel.timeout_s);
}

/* Validation runs with the eval kernel variants (model.eval()), training resumes with the train
 * ones (model.train()), also when evaluation fails. */
static ct_status evaluate(run *r, double *val_loss) {
  const ct_train_cfg *t = &r->cfg->train;
  double sum = 0;
  ct_loader_reset(r->val);
  CT_TRY(ct_registry_apply(&r->kt, CT_KMODE_EVAL));
  ct_status st = CT_OK;
  for (int i = 0; i < t->eval_steps && st == CT_OK; i++) {
    float loss = 0;
    st = ct_loader_next(r->val, t->micro_batch, r->inputs, r->targets);
    if (st == CT_OK)
      st = ct_model_forward(r->model, r->inputs, r->targets, t->micro_batch, t->seq_len, 0.0f, &loss);
    sum += loss;
  }
  ct_status back = ct_registry_apply(&r->kt, CT_KMODE_TRAIN);
  CT_TRY(st);
  CT_TRY(back);
  *val_loss = sum / t->eval_steps;
  return dp_mean(r, val_loss);
}

/* The kernel table for this run's device, applied for training. The activation arena holds the
 * attention state of the train variant; when the eval variant needs more (eager's probabilities
 * against flash's log-sum-exp), the model is sized under the eval table. */
static ct_status kernels_setup(run *r, const ct_model_cfg *mc, int B, int T, ct_kmode *size_mode) {
  CT_TRY(ct_registry_resolve(r->be.cuda ? "cuda" : "cpu", &r->cfg->kernels, &r->kt));
  /* an explicit cudnn backend under attention.deterministic: cuDNN's deterministic backward
   * (kernels/cuda/attention_cudnn.cpp reads this when it builds a backward graph) */
  if (r->cfg->kernels.deterministic) setenv("CT_CUDA_CUDNN_DETERMINISTIC", "1", 0);
  const int H = mc->n_head, KV = mc->n_kv_head ? mc->n_kv_head : mc->n_head;
  const int hd = mc->head_dim ? mc->head_dim : mc->d_model / mc->n_head;
  CT_TRY(ct_registry_apply(&r->kt, CT_KMODE_EVAL));
  const size_t s_eval = r->be.ops->attention_state_floats(B, T, H, KV, hd);
  CT_TRY(ct_registry_apply(&r->kt, CT_KMODE_TRAIN));
  const size_t s_train = r->be.ops->attention_state_floats(B, T, H, KV, hd);
  *size_mode = s_eval > s_train ? CT_KMODE_EVAL : CT_KMODE_TRAIN;
  if (r->env.rank == 0) {
    fprintf(stderr, "kernels (%s, use_kernels = %s, attention.implementation = %s):\n",
            r->kt.device, r->cfg->kernels.use_kernels ? "true" : "false", r->cfg->kernels.attention);
    ct_registry_print(&r->kt, stderr, "  ");
  }
  return CT_OK;
}

static ct_status sample(run *r) {
  const ct_train_cfg *t = &r->cfg->train;
  if (t->sample_tokens <= 0) return CT_OK;
  int32_t *ids = NULL, *out = malloc(sizeof(int32_t) * (size_t)t->sample_tokens);
  size_t n_ids = 0;
  ct_decode_state ds = CT_DECODE_STATE_INIT;
  size_t cap = ct_tokenizer_stream_cap(r->tok);
  char *buf = malloc(cap);
  ct_status st = out && buf ? CT_OK : ct_set_error(CT_ERR_NOMEM, "out of memory");
  if (st == CT_OK)
    st = ct_tokenizer_encode(r->tok, t->sample_prompt, strlen(t->sample_prompt), &ids, &n_ids);
  if (st == CT_OK) {
    ct_sample_cfg s = CT_SAMPLE_INIT;
    s.max_new_tokens = t->sample_tokens;
    s.temperature = 0.8f;
    s.top_k = 40;
    s.seed = t->seed;
    s.stop_id = ct_tokenizer_eot_id(r->tok);
    int n = 0;
    st = ct_registry_apply(&r->kt, CT_KMODE_EVAL); /* generation is eval: the eval variants */
    if (st == CT_OK) st = ct_generate(r->model, ids, (int)n_ids, &s, out, &n, NULL, NULL);
    printf("sample (temperature 0.8, top_k 40):\n%s", t->sample_prompt);
    for (int i = 0; st == CT_OK && i < n; i++) {
      size_t k = ct_tokenizer_decode_stream(r->tok, &ds, out[i], buf, cap);
      fwrite(buf, 1, k, stdout);
    }
    fwrite(buf, 1, ct_tokenizer_decode_flush(r->tok, &ds, buf, cap), stdout);
    printf("\n");
    fflush(stdout);
  }
  free(ids);
  free(out);
  free(buf);
  return st;
}

/* The tokenizer named by data.tokenizer: its digest must match the data files' and its
 * vocabulary must fit the model's. */
static ct_status load_tokenizer(run *r) {
  const ct_config *cfg = r->cfg;
  ct_status st = ct_tokenizer_load(cfg->data.tokenizer, &r->tok);
  if (st != CT_OK) return ct_add_context(st, "data.tokenizer = \"%s\": ", cfg->data.tokenizer);
  if (ct_tokenizer_vocab_size(r->tok) > cfg->model.vocab_size)
    return ct_set_error(CT_ERR_CONFIG, "data.tokenizer %s has %lld tokens but model.vocab_size is %d",
                        cfg->data.tokenizer, (long long)ct_tokenizer_vocab_size(r->tok),
                        cfg->model.vocab_size);
  return CT_OK;
}

ct_status ct_train_run(const ct_config *cfg, ct_train_result *res) {
  const ct_train_cfg *t = &cfg->train;
  const int B = t->micro_batch, T = t->seq_len;
  run r = {.cfg = cfg};
  ct_adamw full = {0}; /* whole moments while saving / loading a ZeRO checkpoint */
  ct_status st = CT_OK;
  double t_start = ct_now();
  memset(res, 0, sizeof *res);
  res->final_val_loss = NAN;

  CT_TRY_GOTO(dist_detect(&r), done);
  CT_TRY_GOTO(mesh_layout(&r), done);
  /* `world` is the data-parallel size: what batches, data positions and ZeRO shards count */
  const int rank = r.env.rank, world = r.dp_size, dprank = r.dp_rank;
  const bool writer = rank == 0; /* one writer for metrics, checkpoints and samples */
  if (writer) ct_config_print(cfg, stderr);
  CT_TRY_GOTO(ct_backend_select(t, r.env.local_rank, &r.be), done);
  CT_TRY_GOTO(dist_connect(&r), done);
  CT_TRY_GOTO(load_tokenizer(&r), done);
  CT_TRY_GOTO(ct_loader_open(cfg->data.train, ct_tokenizer_digest(r.tok), cfg->model.vocab_size, T, dprank,
                             world, t->seed, CT_LOADER_RANDOM, &r.train), done);
  if (cfg->data.val[0])
    CT_TRY_GOTO(ct_loader_open(cfg->data.val, ct_tokenizer_digest(r.tok), cfg->model.vocab_size, T, dprank,
                               world, t->seed, CT_LOADER_SEQUENTIAL, &r.val), done);
  const int zstage = zero_stage(&r);
  const bool sharded = zstage > 0;
  ct_model_cfg mcfg = cfg->model;
  if (sharded) mcfg.numel_multiple = ct_zero_numel_multiple(world); /* equal unit slices */
  mcfg.no_grads = zstage >= 2; /* zero2/3 keep gradient shards and per-unit buffers instead */
  mcfg.tp_size = r.T;
  mcfg.tp_rank = r.tp_rank;
  mcfg.head_chunk = cfg->kernels.head_chunk;
  ct_kmode size_mode;
  CT_TRY_GOTO(kernels_setup(&r, &mcfg, B, T, &size_mode), done);
  CT_TRY_GOTO(ct_registry_apply(&r.kt, size_mode), done);
  CT_TRY_GOTO(ct_model_create(&mcfg, r.be.ops, B, T, &r.model), done);
  CT_TRY_GOTO(ct_registry_apply(&r.kt, CT_KMODE_TRAIN), done);
  /* tensor parallel: initial weights and checkpoints are whole tensors, made or read in a full
   * model on the host and cut into this rank's slice */
  ct_model *fm = NULL;
  ct_adamw fopt = {0};
  if (r.T > 1) {
    CT_TRY_GOTO(ct_tp_create(r.model, r.tp, B * T, &r.tpx), done);
    CT_TRY_GOTO(full_host_model(&r, &fm), done);
  }
  ct_model_init_weights(fm ? fm : r.model, t->seed);
  /* auto: graphs where launch overhead shows. H200, GPT-2 124M bf16: B=4 x 1024 tokens 11.68 ->
   * 11.16 ms/step with the graph, B=64 133.5 vs 134.3 ms (no gain). Runs with per-layer hooks
   * (ZeRO-2/3, overlapped DDP) or tensor parallelism run op by op (host calls inside the step). */
  const bool graphs_pay = (long)B * T <= 16384;
  ct_model_set_graphs(r.model, r.be.cuda && (!strcmp(t->cuda_graphs, "on") ||
                                             (!strcmp(t->cuda_graphs, "auto") && graphs_pay)));
  if (!strcmp(t->cuda_graphs, "on") && !ct_model_graphs(r.model))
    ct_log_warn("train.cuda_graphs = \"on\": the %s backend records no graphs; running without",
                r.be.ops->name);
  /* ZeRO: a checkpoint's whole moments live in `full` until the model is sharded */
  if (!sharded) CT_TRY_GOTO(ct_adamw_create(&r.opt, r.model, t), done);
  ct_train_state ts = {.data_seed = t->seed, .world_size = world, .rank = rank, .loss_scale = 1.0,
                       .opt = sharded ? &full : &r.opt};
  char ckfile[4200];
  if (!strcmp(t->resume, "auto") && ct_checkpoint_latest(t->out_dir, ckfile, sizeof ckfile)) {
    /* exact resume: weights, AdamW moments and step, data position; the schedule is a
     * function of the step, and every other source of randomness is counter-based */
    CT_TRY_GOTO(ct_checkpoint_load_params(ckfile, fm ? fm : r.model), done);
    if (sharded) CT_TRY_GOTO(ct_adamw_create(&full, r.model, t), done);
    if (fm) {
      CT_TRY_GOTO(ct_adamw_create(&fopt, fm, t), done);
      ts.opt = &fopt;
    }
    CT_TRY_GOTO(ct_checkpoint_load_state(ckfile, fm ? fm : r.model, &ts), done);
    if (ts.data_seed != t->seed) {
      st = ct_set_error(CT_ERR_CONFIG, "%s: saved with train.seed = %llu, but the config says %llu"
                        " (resuming would change the data order)", ckfile,
                        (unsigned long long)ts.data_seed, (unsigned long long)t->seed);
      goto done;
    }
    /* data_position counts windows drawn by all ranks together: rank r of W draws windows
     * k*W + r, so at another world size the stream continues where the whole group stopped */
    ct_loader_set_position(r.train, ts.data_position / (uint64_t)world);
    if (ts.world_size != world)
      ct_log_info("world size %d -> %d: data continues at window %llu of the shared stream",
                  ts.world_size, world, (unsigned long long)ts.data_position);
    ct_log_info("checkpoint layout: %s on %d data-parallel ranks, tensor parallel %d (now %s on"
                " %d, tensor parallel %d)", ts.parallel_data, ts.world_size, ts.tensor_parallel,
                r.comm ? cfg->parallel.data : "ddp", world, r.T);
    ct_log_info("resumed from %s at step %d", ckfile, ts.step);
  } else if (t->init_from[0]) {
    ct_config src;
    CT_TRY_GOTO(ct_checkpoint_read_config(t->init_from, &src, ckfile, sizeof ckfile), done);
    CT_TRY_GOTO(ct_checkpoint_load_params(ckfile, fm ? fm : r.model), done);
    ct_log_info("initialized weights from %s", ckfile);
  }
  if (fm) { /* this rank's slice of the weights (and of the moments when resuming) */
    ts.opt = sharded ? &full : &r.opt;
    st = tp_take(&r, fm, fopt.m ? &fopt : NULL, ts.opt);
    ct_adamw_destroy(&fopt, ct_model_ops(fm));
    ct_model_destroy(fm);
    if (st != CT_OK) goto done;
  }
  if (r.comm) /* identical starting weights everywhere, whatever each rank computed or loaded */
    CT_TRY_GOTO(broadcast_params(&r), done);
  if (sharded) { /* take this rank's slices; zero2/3 free the full gradients (and weights) */
    CT_TRY_GOTO(ct_zero_create(r.model, r.comm, zstage, cfg->parallel.reshard_after_forward, t,
                               full.m ? &full : NULL, &r.zero), done);
    ct_zero_set_tp(r.zero, r.tp);
    ct_adamw_destroy(&full, r.be.ops);
    ts.opt = NULL;
  }
  if (writer) CT_TRY_GOTO(ct_metrics_open(t->out_dir, &r.metrics), done);
  struct sigaction sa = {.sa_handler = on_stop_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
  r.inputs = ct_malloc(sizeof(int32_t) * (size_t)B * T, "batch");
  r.targets = ct_malloc(sizeof(int32_t) * (size_t)B * T, "batch");
  if (!r.inputs || !r.targets) { st = CT_ERR_NOMEM; goto done; }
  ct_log_info("model: %s, %.2fM parameters%s, %d layers, d_model %d, %d heads (%d kv), vocab %d",
              cfg->model.arch, ct_model_count_params(r.model) / 1e6,
              r.T > 1 ? " on this tensor-parallel rank" : "", cfg->model.n_layer,
              cfg->model.d_model, cfg->model.n_head, cfg->model.n_kv_head, cfg->model.vocab_size);
  ct_log_info("data: %s (%lld tokens)%s%s; %d x %d tokens x %d accumulation x %d data-parallel ranks = %d"
              " tokens per step", cfg->data.train, (long long)ct_loader_info(r.train)->n_tokens,
              r.val ? ", val " : "", r.val ? cfg->data.val : "", B, T, t->grad_accum, world,
              B * T * t->grad_accum * world);
  ct_mem_estimate mem;
  const bool have_mem = ct_memory_estimate(cfg, r.env.world_size, r.be.ops, &mem) == CT_OK;
  if (writer && have_mem) ct_memory_print(cfg, &mem, r.be.ops->name, stderr);
  ct_log_info("start-up %.2f s; writing %s/metrics.jsonl", ct_now() - t_start, t->out_dir);

  const double tokens_per_step = (double)B * T * t->grad_accum * world;
  if (r.comm && !sharded) { /* ddp: bucket all-reduces issued during backward */
    ct_ddp_cfg dc = CT_DDP_CFG_INIT;
    dc.bucket_floats = ct_ddp_bucket_floats(cfg->parallel.bucket_mb);
    dc.reduce_dtype = strcmp(cfg->parallel.reduce_dtype, "bf16") ? CT_F32 : CT_BF16;
    dc.overlap_ctas = cfg->parallel.overlap_ctas;
    dc.sparse_embedding = cfg->parallel.sparse_embedding_grad;
    dc.ce_allreduce = cfg->parallel.ce_allreduce;
    dc.overlap = cfg->parallel.overlap;
    CT_TRY_GOTO(ct_ddp_create(r.model, r.comm, &dc, &r.ddp), done);
  }
  /* fp16: the loss gradient is multiplied by the dynamic loss scale; the optimizer divides it
   * back out together with the clip factor, so no extra pass over the gradients is needed */
  ct_loss_scaler scaler = CT_LOSS_SCALER_INIT;
  if (!strcmp(t->loss_scale, "dynamic") ||
      (!strcmp(t->loss_scale, "auto") && !strcmp(r.be.precision, "fp16"))) {
    ct_loss_scaler_enable(&scaler);
    if (ts.step > 0 && ts.loss_scale != 1.0) { /* resumed a scaled run: continue its scale */
      scaler.scale = ts.loss_scale;
      scaler.good_steps = ts.scaler_good_steps;
    }
    ct_log_info("dynamic loss scaling: scale %g, growth every %d good steps", scaler.scale,
                scaler.growth_interval);
  }
  const long poison_step = getenv("CT_TEST_POISON_STEP") ? atol(getenv("CT_TEST_POISON_STEP")) : -1;
  double timed = 0;
  int timed_steps = 0;
  double t_loop = ct_now();
  if (ts.step >= t->max_steps)
    ct_log_info("nothing to do: the checkpoint is at step %d, train.max_steps = %d", ts.step, t->max_steps);
  const int start_step = ts.step;
  for (int step = ts.step; step < t->max_steps; step++) {
    double t0 = ct_now();
    double loss = 0;
    mark(&r, "step");
    if (r.zero) ct_zero_zero_grad(r.zero);
    else ct_model_zero_grad(r.model);
    const double gfactor = r.zero ? ct_zero_grad_factor(r.zero) : 1.0;
    for (int micro = 0; micro < t->grad_accum; micro++) {
      float l = 0;
      CT_TRY_GOTO(ct_loader_next(r.train, B, r.inputs, r.targets), done);
      const float grad_scale = (float)(scaler.scale * gfactor / ((double)B * T * t->grad_accum));
      /* overlapped DDP: only the last micro-batch's backward starts the all-reduces */
      if (r.ddp) CT_TRY_GOTO(ct_ddp_arm(r.ddp, micro == t->grad_accum - 1, r.inputs, B * T), done);
      CT_TRY_GOTO(ct_model_train_micro(r.model, r.inputs, r.targets, B, T, grad_scale, &l), done);
      loss += l / t->grad_accum;
    }
    mark(&r, "backward");
    double norm = 0;
    /* the stop signal as of the end of backward */
    double sig = stop_signal;
    const bool early = vote_early(&r, sharded);
    if (early) CT_TRY_GOTO(vote_queue(&r, loss, sig), done);
    if (sharded) { /* each rank averages and keeps its own slice of the gradient */
      CT_TRY_GOTO(ct_zero_finish_grads(r.zero), done);
      CT_TRY_GOTO(ct_zero_grad_norm(r.zero, &norm), done);
    } else {
      if (r.comm) { /* average gradients (each rank's are means over its own tokens), losses */
        CT_TRY_GOTO(ct_ddp_finish(r.ddp), done); /* buckets were queued during backward */
        if (step == start_step)
          ct_log_info("ddp: gradients all-reduced in %d buckets of %s (parallel.bucket_mb = %g) %s",
                      ct_ddp_buckets(r.ddp), cfg->parallel.reduce_dtype, cfg->parallel.bucket_mb,
                      cfg->parallel.overlap ? "as backward produced them" : "after backward");
        if (step == start_step && cfg->parallel.ce_allreduce) {
          int of = 0, k = ct_ddp_ce_buckets(r.ddp, &of);
          ct_log_info("ddp: %d of the %d buckets went through the copy-engine all-reduce "
                      "(parallel.ce_allreduce)", k, of);
        }
        if (step == start_step && ct_ddp_sparse_rows(r.ddp) >= 0)
          ct_log_info("ddp: the embedding lookup's gradient reduced as the %d of %d rows the step's"
                      " tokens use (parallel.sparse_embedding_grad)", ct_ddp_sparse_rows(r.ddp),
                      ct_model_embedding(r.model)->shape[0]);
      }
      if (r.tpx) CT_TRY_GOTO(ct_tp_grad_norm(r.tpx, &norm), done);
      else norm = ct_grad_norm(r.model);
    }
    mark(&r, "grads reduced + norm");
    /* The loss mean and the stop vote, here where the host has just waited for the gradients
     * anyway: after the optimizer the vote would drain the GPU every step. */
    if (early) vote_read(&r, &loss, &sig);
    else CT_TRY_GOTO(step_agree(&r, &loss, &sig), done);
    if (step + 1 == poison_step) norm = INFINITY; /* testing: an overflowed gradient */
    double lr = ct_lr_at(t, step);
    const double used_scale = scaler.enabled ? scaler.scale : 1.0;
    bool apply = true;
    if (scaler.enabled) {
      apply = ct_loss_scaler_update(&scaler, isfinite(norm));
      ct_metrics_scaler(r.metrics, step + 1, used_scale, !apply);
      if (!apply) {
        ct_progress_end();
        ct_log_warn("step %d: inf/nan gradients at loss scale %g: step skipped, scale now %g",
                    step + 1, used_scale, scaler.scale);
        if (scaler.scale < 1.0) {
          st = ct_set_error(CT_ERR_RUNTIME, "step %d: the loss scale fell below 1: the gradients"
                            " overflow even unscaled (lower train.lr or use bf16)", step + 1);
          goto done;
        }
      }
      norm /= used_scale; /* the norm of the true (unscaled) gradient */
    }
    if (apply && (!isfinite(loss) || !isfinite(norm))) {
      st = ct_set_error(CT_ERR_RUNTIME, "step %d: loss %g, gradient norm %g: training diverged"
                        " (lower train.lr or check the data)", step + 1, loss, norm);
      goto done;
    }
    if (apply) {
      const float gs = ct_clip_scale(norm, t->grad_clip) / (float)used_scale;
      if (sharded) CT_TRY_GOTO(ct_zero_step(r.zero, lr, gs), done);
      else ct_adamw_step(&r.opt, r.model, lr, gs);
    }
    mark(&r, "optimizer");
    CT_TRY_GOTO(ct_backend_check(&r.be), done);
    double dt = ct_now() - t0;
    if (step > 0) { timed += dt; timed_steps++; }  /* the first step includes warm-up */
    double tok_s = tokens_per_step / dt;
    ct_metrics_step(r.metrics, step + 1, loss, lr, norm, tok_s, dt * 1e3);
    res->final_loss = loss;
    double avg_step = (ct_now() - t_loop) / (step + 1 - ts.step);
    if (writer)
      ct_progress(step + 1, t->max_steps, loss, tok_s, avg_step * (t->max_steps - step - 1),
                  (step + 1) % t->log_every == 0 || step + 1 == t->max_steps);
    bool last = step + 1 == t->max_steps;
    bool stopping = !last && ((t->stop_after > 0 && step + 1 - start_step == t->stop_after) || sig);
    if (r.val && ((t->eval_every > 0 && (step + 1) % t->eval_every == 0) || last)) {
      double vl;
      CT_TRY_GOTO(evaluate(&r, &vl), done);
      ct_metrics_eval(r.metrics, step + 1, vl);
      res->final_val_loss = vl;
      ct_progress_end();
      ct_log_info("step %d: val_loss %.4f", step + 1, vl);
    }
    if ((t->checkpoint_every > 0 && (step + 1) % t->checkpoint_every == 0) || last || stopping) {
      char saved[4096];
      ts.step = step + 1;
      ts.data_position = ct_loader_position(r.train) * (uint64_t)world;
      ts.world_size = world;
      snprintf(ts.parallel_data, sizeof ts.parallel_data, "%s", r.comm ? cfg->parallel.data : "ddp");
      ts.tensor_parallel = r.T;
      ts.loss_scale = scaler.scale;
      ts.scaler_good_steps = scaler.good_steps;
      if (sharded || r.T > 1) /* moments per rank, weights whole (collective) */
        st = save_sharded(&r, step + 1, &ts, writer, saved, sizeof saved);
      else if (writer)
        st = ct_checkpoint_save(t->out_dir, step + 1, cfg, r.model, &ts, t->keep_last, saved,
                                sizeof saved);
      if (writer) {
        if (st == CT_OK) {
          ct_progress_end();
          ct_log_info("step %d: saved %s", step + 1, saved);
        }
      }
      if (st != CT_OK) goto done;
      if (r.world) CT_TRY_GOTO(ct_comm_barrier(r.world), done); /* saved before anyone exits */
    }
    res->steps = step + 1;
    if (stopping) {
      if (sig) {
        res->stop_signal = (int)sig;
        ct_log_info("%s: stopped at step %d after saving a checkpoint (resume with"
                    " train.resume=auto)", (int)sig == SIGUSR1 ? "SIGUSR1" : (int)sig == SIGINT ? "SIGINT" : "SIGTERM", step + 1);
      } else {
        ct_log_info("train.stop_after = %d: stopping at step %d (resume with train.resume=auto)",
                    t->stop_after, step + 1);
      }
      break;
    }
  }
  ct_progress_end();
  res->tokens_per_s = timed_steps ? tokens_per_step * timed_steps / timed : 0;
  res->seconds = ct_now() - t_start;
  ct_log_info("done: %d steps in %.1f s, %.0f tokens/s, final loss %.4f%s", res->steps,
              res->seconds, res->tokens_per_s, res->final_loss, "");
  if (have_mem && r.be.ops->mem_peak) /* every rank has its own measured peak to report */
    fprintf(stderr, "memory: rank %d: estimated %.1f MiB per rank (model state %.1f MiB), measured peak %.1f MiB"
                " (%s)\n", r.env.rank, mem.total / 1048576.0, ct_memory_model_state(&mem) / 1048576.0,
                r.be.ops->mem_peak() / 1048576.0, r.be.cuda ? "device memory in use, CUDA context included" : "peak RSS of the process");
  if (writer && !isnan(res->final_val_loss)) printf("final val_loss %.4f\n", res->final_val_loss);
  fflush(stdout);
  if (writer && !res->stop_signal && (zstage == 3 || r.T > 1) && t->sample_tokens > 0)
    ct_log_info("%s: no sample (the weights are sharded; ctrain generate --model CKPT)",
                r.T > 1 ? "tensor parallel" : "zero3");
  else if (writer && !res->stop_signal) CT_TRY_GOTO(sample(&r), done);
done:
  if (st != CT_OK) ct_progress_end();
  if (st == CT_OK) dist_teardown(&r);
  else { /* a failed rank must not wait in a barrier for peers that may be gone */
    destroy_groups(&r);
    if (r.store) ct_store_close(r.store);
    if (r.server) ct_store_server_stop(r.server);
  }
  free(r.inputs);
  free(r.targets);
  ct_metrics_close(r.metrics);
  ct_zero_destroy(r.zero);
  ct_ddp_destroy(r.ddp);
  ct_tp_destroy(r.tpx);
  if (r.model) {
    ct_adamw_destroy(&r.opt, r.be.ops);
    ct_adamw_destroy(&full, r.be.ops);
  }
  ct_model_destroy(r.model);
  ct_loader_destroy(r.train);
  ct_loader_destroy(r.val);
  ct_tokenizer_destroy(r.tok);
  if (r.scratch) r.be.ops->free(r.scratch);
  ct_backend_shutdown(&r.be);
  return st;
}

ct_status ct_cmd_train(int argc, char **argv) {
  const char *path = NULL;
  char **overrides = calloc((size_t)argc + 1, sizeof(char *));
  int n_over = 0;
  if (!overrides) return ct_set_error(CT_ERR_NOMEM, "out of memory");
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: ctrain train CONFIG.toml [section.key=value ...]\n");
      free(overrides);
      return CT_OK;
    }
    if (strchr(argv[i], '=')) overrides[n_over++] = argv[i];
    else if (!path && argv[i][0] != '-') path = argv[i];
    else { free(overrides); return ct_set_error(CT_ERR_USAGE, "train: unexpected argument %s (usage: ctrain train CONFIG.toml [key=value ...])", argv[i]); }
  }
  if (!path) { free(overrides); return ct_set_error(CT_ERR_USAGE, "train: missing CONFIG.toml (usage: ctrain train CONFIG.toml [key=value ...])"); }
  ct_config cfg;
  ct_status st = ct_config_load(path, n_over, overrides, &cfg);
  free(overrides);
  if (st != CT_OK) return st;
  ct_train_result res;
  st = ct_train_run(&cfg, &res);
  if (st == CT_OK && (res.stop_signal == SIGTERM || res.stop_signal == SIGINT))
    return ct_set_error(CT_ERR_RUNTIME, "interrupted by %s at step %d (checkpoint saved)",
                        res.stop_signal == SIGTERM ? "SIGTERM" : "SIGINT", res.steps);
  return st;
}
