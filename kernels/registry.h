/* kernels/registry.h — named kernel variants per op, resolved per device and mode.
 *
 * Every op the CUDA backend implements more than one way has named variants here; the CPU has
 * one of each. A run resolves a table op -> variant for its device from, in order:
 *   1. the default set: `use_kernels = true` (default) takes each op's optimized variant,
 *      false its reference variant (the plain, unfused path: what the op table did before the
 *      fused kernels, kept for comparison and debugging);
 *   2. [attention] implementation (auto | sdpa | eager | flash | cudnn) for the attention op;
 *   3. the [kernels] mapping, e.g. kernels.cuda.train.attention = "flash", per mode.
 * Train and eval resolve separately: switching the model to eval (validation, generation)
 * applies the eval table, switching back the train table, like model.train() / model.eval()
 * swapping Hub kernels. Unknown ops, variants, devices or modes are errors that list the valid
 * names.
 */
#ifndef CT_REGISTRY_H
#define CT_REGISTRY_H

#include <stdbool.h>
#include <stdio.h>

#include "common/status.h"

typedef enum ct_kmode { CT_KMODE_TRAIN = 0, CT_KMODE_EVAL = 1 } ct_kmode;

#define CT_KERNEL_OPS_MAX 16

/* One [kernels] entry: device.mode.op = variant (from the config). */
typedef struct ct_kernel_entry {
  char device[8], mode[8], op[24], variant[24];
} ct_kernel_entry;

/* What the config says about kernels. */
typedef struct ct_kernels_cfg {
  bool use_kernels;
  int head_chunk;    /* rows per fused head matmul + cross-entropy chunk (0: all rows at once) */
  char attention[16]; /* auto | sdpa | eager | flash | cudnn */
  bool deterministic; /* attention.deterministic: bit-reproducible attention backward (auto takes
                       * flash, cudnn its deterministic algorithm) */
  int n;
  ct_kernel_entry entries[CT_KERNEL_OPS_MAX * 4];
} ct_kernels_cfg;

/* A resolved table for one device: variant[i] names the choice for op i of the device. */
typedef struct ct_kernel_table {
  const char *device; /* "cuda" | "cpu" */
  int n_ops;
  const char *op[CT_KERNEL_OPS_MAX];
  const char *variant[2][CT_KERNEL_OPS_MAX]; /* [mode][op] */
} ct_kernel_table;

/* Checks one entry against the registry (device, mode, op and variant exist); the message
 * lists the valid names. Used by the config loader. */
ct_status ct_registry_check(const char *device, const char *mode, const char *op,
                            const char *variant);

/* Resolves the table for `device` ("cuda" or "cpu"). attention = "cudnn" is CT_ERR_CONFIG
 * naming the available implementations when the build has no cuDNN attention. */
ct_status ct_registry_resolve(const char *device, const ct_kernels_cfg *cfg, ct_kernel_table *t);

/* Applies the mode's variants to the backend (CUDA: ct_cuda_set_variant; the CPU has nothing
 * to switch). Call between steps only: an attention variant change invalidates saved state. */
ct_status ct_registry_apply(const ct_kernel_table *t, ct_kmode mode);

/* Prints the resolved table ("op  train-variant  eval-variant"), one op per line. */
void ct_registry_print(const ct_kernel_table *t, FILE *f, const char *indent);

/* The names of the attention implementations this build offers ("auto, sdpa, eager, flash"). */
const char *ct_registry_attention_available(void);

#endif
