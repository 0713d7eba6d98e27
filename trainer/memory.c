/* trainer/memory.c — per-rank memory estimates and `ctrain memory` (see memory.h). */
#include "trainer/memory.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ct_build_config.h"
#include "common/util.h"
#include "parallel/zero.h"
#include "trainer/device.h"
#include "trainer/model.h"
#if CT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

/* An op table that allocates nothing: a model built with it only sizes itself. */
static char sizing_dummy[64] __attribute__((aligned(64)));
static void *sizing_alloc(size_t bytes) { (void)bytes; return sizing_dummy; }
static void sizing_free(void *p) { (void)p; }

static const ct_ops *sizing_table(const ct_ops *ops) {
  static ct_ops t; /* one table per process is enough: only alloc/free differ */
  t = *ops;
  t.alloc = sizing_alloc;
  t.free = sizing_free;
  return &t;
}

ct_status ct_memory_table_model(const ct_model_cfg *cfg, const ct_ops *ops, ct_model **out) {
  return ct_model_create(cfg, sizing_table(ops), 1, 1, out);
}

size_t ct_memory_model_state(const ct_mem_estimate *e) {
  return e->master + e->working + e->grads + e->optim;
}

ct_status ct_memory_estimate(const ct_config *cfg, int world, const ct_ops *ops, ct_mem_estimate *e) {
  memset(e, 0, sizeof *e);
  const int T = cfg->parallel.tensor > 1 ? cfg->parallel.tensor : 1;
  if (world < 1 || world % T)
    return ct_set_error(CT_ERR_CONFIG, "parallel.tensor = %d does not divide the world size %d"
                        " (data parallel = world / tensor)", T, world);
  const int dp = world / T;
  const char *mode = dp > 1 ? cfg->parallel.data : "ddp";
  const int stage = !strncmp(mode, "zero", 4) ? mode[4] - '0' : 0;
  ct_ops sizing = *ops;
  sizing.alloc = sizing_alloc;
  sizing.free = sizing_free;
  ct_model_cfg mc = cfg->model;
  mc.tp_size = T;
  mc.tp_rank = 0;
  mc.numel_multiple = stage ? ct_zero_numel_multiple(dp) : 0;
  mc.head_chunk = cfg->kernels.head_chunk; /* the logits buffer holds one chunk */
  ct_model *m = NULL;
  CT_TRY(ct_model_create(&mc, &sizing, cfg->train.micro_batch, cfg->train.seq_len, &m));
  const size_t n = ct_model_numel(m), ab = (size_t)ops->act_bytes, F = sizeof(float);
  size_t u_glob = 0, u_layer = 0, u_all = 0; /* unit floats: global units, largest layer, layers */
  for (int u = 0; u < ct_model_n_units(m); u++) {
    size_t off, un;
    ct_model_unit(m, u, &off, &un);
    if (u == 0 || u == ct_model_n_units(m) - 1) u_glob += un;
    else {
      u_all += un;
      if (un > u_layer) u_layer = un;
    }
  }
  const size_t N = (size_t)cfg->train.micro_batch * cfg->train.seq_len;
  e->world = world;
  e->dp = dp;
  e->tp = T;
  e->numel = n;
  e->acts = ct_model_arena_bytes(m) + 2 * N * sizeof(int32_t);
  ct_model_destroy(m);
  const bool work = ab != F; /* fp32 compute runs on the master weights */
  e->master = stage == 3 ? F * n / dp : F * n;
  e->working = !work ? 0 : stage == 3 ? ab * n / dp : ab * n;
  if (stage == 3) /* gathered weights: global units + two layers (or every layer) */
    e->working += ab * (u_glob + (cfg->parallel.reshard_after_forward ? 2 * u_layer : u_all));
  e->grads = stage >= 2 ? F * (n / dp + u_glob + 2 * u_layer) : F * n; /* 2 layer slots */
  const bool bf16_wire = !strcmp(cfg->parallel.reduce_dtype, "bf16");
  if (!stage && dp > 1 && bf16_wire)
    e->grads += sizeof(uint16_t) * n; /* ddp's bf16 copy of the gradients for the wire */
  /* parallel.ce_allreduce (ddp on GPUs): each rank's receive area for its peers' chunks of every
   * bucket, dp - 1 chunks of about numel / dp wire elements (parallel/comm_ce.c; the flags are a
   * few bytes a bucket). The CPU table's Gloo all-reduce has none. */
  if (!stage && dp > 1 && cfg->parallel.ce_allreduce && !strncmp(ops->name, "cuda", 4))
    e->grads += (bf16_wire ? sizeof(uint16_t) : F) * (size_t)(dp - 1) * ((n + dp - 1) / dp);
  if (!stage && dp > 1 && T == 1 && cfg->parallel.sparse_embedding_grad) {
    /* ddp's sparse embedding gradient (parallel/ddp.h): the lookup's own (Vp, C) gradient, the
     * packed rows (at most Vp, at most every rank's tokens), the flags and the row list */
    const size_t V = (size_t)ct_model_padded_vocab(&mc), C = (size_t)mc.d_model;
    const size_t rows = (size_t)dp * N < V ? (size_t)dp * N : V;
    e->grads += F * V * (C + 1) + (F * C + (bf16_wire ? sizeof(uint16_t) * C : 0) + F) * rows;
  }
  e->optim = stage >= 1 ? 2 * F * n / dp : 2 * F * n;
  /* cuBLAS workspace on the GPU; tp cross-entropy buffers (3 + 1 floats and a target per token) */
  e->workspace = (strncmp(ops->name, "cuda", 4) ? 0 : (size_t)32 << 20) +
                 (T > 1 ? N * (4 * F + sizeof(int32_t)) : 0);
  /* cuDNN attention (builds with it, 16-bit tables, attention auto or cudnn): its backward writes
   * dq/dk/dv into a scratch of the qkv gradient's size before adding them, and cuDNN keeps an
   * fp32 dQ accumulator (N x H x hd); counted whether or not auto ends up choosing it */
  const char *att = cfg->kernels.attention[0] ? cfg->kernels.attention : "auto";
  if (CT_HAVE_CUDNN && !strncmp(ops->name, "cuda", 4) && ab == 2 &&
      (!strcmp(att, "auto") || !strcmp(att, "sdpa") || !strcmp(att, "cudnn"))) {
    const int H = mc.n_head / T, KV = (mc.n_kv_head ? mc.n_kv_head : mc.n_head) / T;
    const size_t hd = (size_t)(mc.head_dim ? mc.head_dim : mc.d_model / mc.n_head);
    e->workspace += N * (size_t)(H + 2 * KV) * hd * ab + N * (size_t)H * hd * F;
  }
  e->total = ct_memory_model_state(e) + e->acts + e->workspace;
  /* saving takes no device memory: each rank writes its own shard of the moments (and, under
   * zero3 or tp, of the weights) from host copies; nothing is gathered */
  return CT_OK;
}

static double mib(size_t b) { return (double)b / 1048576.0; }

void ct_memory_print(const ct_config *cfg, const ct_mem_estimate *e, const char *ops_name, FILE *f) {
  const char *mode = e->dp > 1 ? cfg->parallel.data : "ddp";
  fprintf(f, "memory per rank: %d ranks = %d data parallel (%s) x %d tensor parallel, op table %s,"
          " micro-batch %d x %d tokens\n", e->world, e->dp, mode, e->tp, ops_name,
          cfg->train.micro_batch, cfg->train.seq_len);
  fprintf(f, "  %-28s %12.1f MiB   (%zu floats in this rank's flat buffer)\n", "fp32 master weights",
          mib(e->master), e->numel);
  fprintf(f, "  %-28s %12.1f MiB\n", "working weights", mib(e->working));
  fprintf(f, "  %-28s %12.1f MiB\n", "gradients (fp32)", mib(e->grads));
  fprintf(f, "  %-28s %12.1f MiB\n", "AdamW moments", mib(e->optim));
  fprintf(f, "  %-28s %12.1f MiB\n", "= model state", mib(ct_memory_model_state(e)));
  fprintf(f, "  %-28s %12.1f MiB\n", "activations", mib(e->acts));
  fprintf(f, "  %-28s %12.1f MiB\n", "workspace", mib(e->workspace));
  fprintf(f, "  %-28s %12.1f MiB\n", "total", mib(e->total));
}

/* The op table whose dtype and attention sizing the estimate uses: the GPU table for the
 * configured precision in a CUDA build (auto = bf16, as on compute capability >= 8.0), else the
 * CPU table (fp32). No device is touched: the sizing functions are host code. */
static const ct_ops *estimate_ops(const ct_config *cfg) {
#if CT_HAVE_CUDA
  /* the variant choice (and so the attention state's size) is set up by ct_cuda_init, which a
   * machine without a GPU never runs: ask for the defaults explicitly (no device is touched) */
  ct_cuda_set_variant("attention", "default");
  const char *p = cfg->train.precision;
  if (!strcmp(p, "fp32")) return ct_ops_cuda();
  if (!strcmp(p, "fp16")) return ct_ops_cuda_fp16();
  return ct_ops_cuda_bf16();
#else
  (void)cfg;
  return ct_ops_cpu();
#endif
}

ct_status ct_cmd_memory(int argc, char **argv) {
  static const char usage[] = "usage: ctrain memory CONFIG.toml [--world N] [section.key=value ...]";
  const char *path = NULL;
  int world = 0;
  char **over = calloc((size_t)argc + 1, sizeof(char *));
  int n_over = 0;
  if (!over) return ct_set_error(CT_ERR_NOMEM, "out of memory");
  ct_status st = CT_OK;
  for (int i = 0; i < argc && st == CT_OK; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("%s\n  per-rank memory estimate for the configured parallel layout; --world N"
             " evaluates N ranks (default: WORLD_SIZE, else 1)\n", usage);
      free(over);
      return CT_OK;
    }
    if (!strcmp(argv[i], "--world")) {
      char *end = NULL;
      long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
      if (i + 1 >= argc || !end || *end || v < 1 || v > 1 << 20)
        st = ct_set_error(CT_ERR_USAGE, "memory: --world needs a positive integer (%s)", usage);
      world = (int)v;
      i++;
    } else if (strchr(argv[i], '=')) {
      over[n_over++] = argv[i];
    } else if (!path && argv[i][0] != '-') {
      path = argv[i];
    } else {
      st = ct_set_error(CT_ERR_USAGE, "memory: unexpected argument %s (%s)", argv[i], usage);
    }
  }
  if (st == CT_OK && !path) st = ct_set_error(CT_ERR_USAGE, "memory: missing CONFIG.toml (%s)", usage);
  ct_config cfg;
  if (st == CT_OK) st = ct_config_load(path, n_over, over, &cfg);
  free(over);
  if (st != CT_OK) return st;
  if (!world) world = getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 1;
  if (world < 1) world = 1;
  const ct_ops *ops = estimate_ops(&cfg);
  ct_mem_estimate e;
  CT_TRY(ct_memory_estimate(&cfg, world, ops, &e));
  ct_memory_print(&cfg, &e, ops->name, stdout);
  return CT_OK;
}
