/* kernels/registry.c — the variant tables (see registry.h). */
#include "kernels/registry.h"

#include <string.h>

#include "ct_build_config.h"
#if CT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

typedef struct op_def {
  const char *op;
  const char *optimized, *reference; /* use_kernels = true / false */
  const char *variants[8];           /* every valid name, NULL-terminated */
  const char *help;
} op_def;

/* CUDA: the variants the backend switches with ct_cuda_set_variant. Measured on an H200
 * (bench/results/profile_gpt2_b64_*): the optimized set took GPT-2 124M at B=64 from 189 to
 * 131 ms per step. */
/* flash3 (the Hopper wgmma kernels, kernels/cuda/flash_hopper.cu): in builds for sm_90 */
#if CT_HAVE_FLASH3
#define FLASH3 "flash3",
#define FLASH3_HELP "; flash3: Hopper wgmma forward and backward (sm_90; also timed by auto)"
#else
#define FLASH3
#define FLASH3_HELP ""
#endif
static const op_def CUDA_OPS[] = {
#if CT_HAVE_CUDNN
#define CUDNN_V "cudnn",
#define CUDNN_HELP "; cudnn: cuDNN fused attention (cudnn-frontend)"
#else
#define CUDNN_V
#define CUDNN_HELP ""
#endif
#if CT_HAVE_CUDNN || CT_HAVE_FLASH3
    /* auto: flash, cudnn (where built) or flash3 (where built, on sm_90) per shape, whichever
     * forward + backward ran fastest when the shape was first seen (timed on the device,
     * kernels/cuda/ops_cuda.cu attn_auto_pick). On an H200
     * (bench/results/attention_2026-11-30_NVIDIA_H200_b31116e.txt) cudnn ran forward + backward
     * 1.4-2.4x faster than flash at T = 1k..8k, head dims 64 and 128, and auto picked it there;
     * flash kept the small shapes (e.g. B16 T100 H2 hd64: 0.031 vs 0.048 ms). Without cuDNN,
     * flash3 beat flash on most hd 128 shapes (attention_2026-11-30_NVIDIA_H200_fb38dc6.txt). */
    {"attention", "auto", "eager", {"auto", "flash", CUDNN_V "flash1", "flash2b", FLASH3 "eager", NULL},
     "auto: the fastest per shape as timed on the shape's first use; flash: own FA2-style kernels"
     " (head dims 64/128, sm80+; eager otherwise)" CUDNN_HELP "; flash1: the first flash kernels;"
     " flash2b: 8-warp blocks; eager: matmul + softmax + matmul (cuBLAS batched)" FLASH3_HELP},
#else
    {"attention", "flash", "eager", {"flash", "flash1", "flash2b", "eager", NULL},
     "flash: own FA2-style kernels (head dims 64/128, sm80+; eager otherwise); flash1: the first"
     " flash kernels; flash2b: 8-warp blocks; eager: matmul + softmax + matmul (cuBLAS batched)"},
#endif
    {"matmul", "lt", "gemmex", {"lt", "lt-first", "gemmex", NULL},
     "lt: cuBLASLt with bias/GELU epilogues, candidates timed on first use; lt-first: the same"
     " with the heuristic's first answer, untimed (for shapes seen once); gemmex: cublasGemmEx"},
    {"mlp", "epilogue", "separate", {"epilogue", "separate", NULL},
     "GPT-2 MLP: GELU in the GEMM epilogue forward and backward, or separate GELU kernels"},
    {"norm_bwd", "fused", "twopass", {"fused", "twopass", NULL},
     "norm backward: one pass for dinp and the weight/bias sums, or two kernels"},
    {"add_norm", "fused", "separate", {"fused", "separate", NULL},
     "residual add + next norm in one kernel, or an add then a norm"},
    {"xent", "smem", "rowloop", {"smem", "rowloop", NULL},
     "cross-entropy: the logits row staged in shared memory, or read twice from global memory"},
    {"embed_bwd", "sorted", "blocks", {"sorted", "blocks", NULL},
     "embedding backward: tokens sorted into segments, or one block per distinct token"},
};
static const op_def CPU_OPS[] = {
    {"attention", "eager", "eager", {"eager", NULL}, "matmul + softmax + matmul (OpenMP)"},
    {"matmul", "blas", "blas", {"blas", NULL}, "OpenBLAS sgemm"},
};
#define N_CUDA_OPS ((int)(sizeof CUDA_OPS / sizeof CUDA_OPS[0]))
#define N_CPU_OPS ((int)(sizeof CPU_OPS / sizeof CPU_OPS[0]))

static const op_def *ops_of(const char *device, int *n) {
  if (!strcmp(device, "cuda")) { *n = N_CUDA_OPS; return CUDA_OPS; }
  if (!strcmp(device, "cpu")) { *n = N_CPU_OPS; return CPU_OPS; }
  *n = 0;
  return NULL;
}

static void join_variants(const op_def *d, char *out, size_t cap) {
  out[0] = '\0';
  for (int i = 0; d->variants[i]; i++) {
    size_t k = strlen(out);
    snprintf(out + k, cap - k, "%s%s", i ? ", " : "", d->variants[i]);
  }
}

static void join_ops(const op_def *defs, int n, char *out, size_t cap) {
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    size_t k = strlen(out);
    snprintf(out + k, cap - k, "%s%s", i ? ", " : "", defs[i].op);
  }
}

const char *ct_registry_attention_available(void) {
#if CT_HAVE_CUDNN
  return "auto, sdpa, eager, flash, cudnn";
#else
  /* cuDNN fused attention needs the cudnn-frontend headers at build time: not in this build */
  return "auto, sdpa, eager, flash";
#endif
}

ct_status ct_registry_check(const char *device, const char *mode, const char *op,
                            const char *variant) {
  int n;
  const op_def *defs = ops_of(device, &n);
  if (!defs)
    return ct_set_error(CT_ERR_CONFIG, "kernels: unknown device '%s' (expected cuda or cpu)", device);
  if (strcmp(mode, "train") && strcmp(mode, "eval"))
    return ct_set_error(CT_ERR_CONFIG, "kernels.%s: unknown mode '%s' (expected train or eval)",
                        device, mode);
  char names[256];
  for (int i = 0; i < n; i++) {
    if (strcmp(defs[i].op, op)) continue;
    for (int j = 0; defs[i].variants[j]; j++)
      if (!strcmp(defs[i].variants[j], variant)) return CT_OK;
    join_variants(&defs[i], names, sizeof names);
    return ct_set_error(CT_ERR_CONFIG, "kernels.%s.%s.%s: unknown variant '%s' (valid: %s)", device,
                        mode, op, variant, names);
  }
  join_ops(defs, n, names, sizeof names);
  return ct_set_error(CT_ERR_CONFIG, "kernels.%s.%s: unknown op '%s' (ops with variants on %s: %s)",
                      device, mode, op, device, names);
}

ct_status ct_registry_resolve(const char *device, const ct_kernels_cfg *cfg, ct_kernel_table *t) {
  int n;
  const op_def *defs = ops_of(device, &n);
  if (!defs) return ct_set_error(CT_ERR_CONFIG, "kernels: unknown device '%s'", device);
  memset(t, 0, sizeof *t);
  t->device = defs == CUDA_OPS ? "cuda" : "cpu";
  t->n_ops = n;
  const char *att = cfg->attention[0] ? cfg->attention : "auto";
  if (!CT_HAVE_CUDNN && !strcmp(att, "cudnn"))
    return ct_set_error(CT_ERR_CONFIG, "attention.implementation = \"cudnn\": this build has no cuDNN"
                        " attention (it needs the cudnn-frontend headers); available: %s",
                        ct_registry_attention_available());
  if (defs == CPU_OPS && (!strcmp(att, "flash") || !strcmp(att, "cudnn")))
    return ct_set_error(CT_ERR_CONFIG, "attention.implementation = \"%s\" is a CUDA kernel; on"
                        " the CPU the available implementations are auto, sdpa and eager", att);
  for (int i = 0; i < n; i++) {
    t->op[i] = defs[i].op;
    const char *v = cfg->use_kernels ? defs[i].optimized : defs[i].reference;
    if (!strcmp(defs[i].op, "attention") && strcmp(att, "auto") && strcmp(att, "sdpa"))
      v = !strcmp(att, "eager") || defs == CPU_OPS ? "eager" : !strcmp(att, "cudnn") ? "cudnn" : "flash";
    t->variant[CT_KMODE_TRAIN][i] = t->variant[CT_KMODE_EVAL][i] = v;
  }
  for (int k = 0; k < cfg->n; k++) {
    const ct_kernel_entry *e = &cfg->entries[k];
    if (strcmp(e->device, t->device)) continue;
    CT_TRY(ct_registry_check(e->device, e->mode, e->op, e->variant));
    const int mode = !strcmp(e->mode, "eval") ? CT_KMODE_EVAL : CT_KMODE_TRAIN;
    for (int i = 0; i < n; i++)
      if (!strcmp(defs[i].op, e->op))
        for (int j = 0; defs[i].variants[j]; j++)
          if (!strcmp(defs[i].variants[j], e->variant)) t->variant[mode][i] = defs[i].variants[j];
  }
  /* attention.deterministic: the timed choice may land on cuDNN, whose default backward adds
   * with atomics (bits differ run to run); flash's backward is deterministic */
  if (cfg->deterministic)
    for (int i = 0; i < n; i++)
      for (int m = 0; m < 2; m++)
        if (!strcmp(defs[i].op, "attention") && !strcmp(t->variant[m][i], "auto"))
          t->variant[m][i] = "flash";
  return CT_OK;
}

#if CT_HAVE_CUDA
/* registry names -> ops_cuda.cu's names */
static const char *cuda_name(const char *op, const char *v) {
  if (!strcmp(op, "attention")) {
    if (!strcmp(v, "flash")) return "default"; /* flash2 where it applies, eager elsewhere */
    if (!strcmp(v, "flash1")) return "flash";
    if (!strcmp(v, "eager")) return "batched";
  }
  return v;
}
#endif

ct_status ct_registry_apply(const ct_kernel_table *t, ct_kmode mode) {
  if (strcmp(t->device, "cuda")) return CT_OK; /* one variant of each CPU op */
#if CT_HAVE_CUDA
  for (int i = 0; i < t->n_ops; i++)
    if (ct_cuda_set_variant(t->op[i], cuda_name(t->op[i], t->variant[mode][i])) != 0)
      return ct_set_error(CT_ERR_RUNTIME, "the CUDA backend has no variant '%s' of %s",
                          t->variant[mode][i], t->op[i]);
  return CT_OK;
#else
  (void)mode;
  return ct_set_error(CT_ERR_RUNTIME, "CUDA kernels requested from a CPU-only build");
#endif
}

void ct_registry_print(const ct_kernel_table *t, FILE *f, const char *indent) {
  int n;
  const op_def *defs = ops_of(t->device, &n);
  fprintf(f, "%s%-10s %-10s %-10s %s\n", indent, "op", "train", "eval", "variants");
  for (int i = 0; i < t->n_ops; i++) {
    char names[256];
    join_variants(&defs[i], names, sizeof names);
    fprintf(f, "%s%-10s %-10s %-10s %s\n", indent, t->op[i], t->variant[CT_KMODE_TRAIN][i],
            t->variant[CT_KMODE_EVAL][i], names);
  }
}
