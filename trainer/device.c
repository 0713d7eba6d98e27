#include "trainer/device.h"

#include "kernels/registry.h"

#include <H5public.h>
#include <dlfcn.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "ct_build_config.h"

#if CT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
int ct_cuda_device_count(void);
int ct_cuda_device_info(int i, char *name, size_t name_cap, char *pci, size_t pci_cap, int *major,
                        int *minor, size_t *mem_bytes);
void ct_cuda_versions(int *runtime, int *driver);
#endif
#if CT_HAVE_CUDNN
#include "kernels/cuda/attention_cudnn.h"
#endif

int ct_cuda_visible_devices(void) {
#if CT_HAVE_CUDA
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis && !vis[0]) return 0; /* empty: the user asked for the CPU */
  return ct_cuda_device_count();
#else
  return 0;
#endif
}

ct_status ct_backend_select(const ct_train_cfg *t, int local_rank, ct_backend *b) {
  memset(b, 0, sizeof *b);
  const int ngpu = ct_cuda_visible_devices();
  (void)ngpu; /* CPU-only builds see none */
  if (t->threads > 0) ct_ops_cpu_set_threads(t->threads);
  b->threads = t->threads > 0 ? t->threads : omp_get_max_threads();
  b->ops = ct_ops_cpu();
  snprintf(b->precision, sizeof b->precision, "fp32");
  snprintf(b->device, sizeof b->device, "cpu (%d threads)", b->threads);
#if CT_HAVE_CUDA
  if (ngpu > 0) {
    if (local_rank >= ngpu)
      return ct_set_error(CT_ERR_USAGE, "LOCAL_RANK %d but only %d CUDA device(s) visible"
                          " (CUDA_VISIBLE_DEVICES=%s)", local_rank, ngpu,
                          getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    char err[512], name[256], pci[32];
    int major = 0, minor = 0;
    size_t mem = 0;
    if (ct_cuda_init(local_rank, err, sizeof err) != 0)
      return ct_set_error(CT_ERR_RUNTIME, "cuda:%d: %s", local_rank, err);
    ct_cuda_device_info(local_rank, name, sizeof name, pci, sizeof pci, &major, &minor, &mem);
    /* auto: bf16 mixed precision on compute capability >= 8.0 (fp32 master weights and
     * AdamW, bf16 activations and working weights, fp32 accumulation / norms / softmax / loss) */
    const bool bf16_ok = major >= 8;
    if (!strcmp(t->precision, "bf16") && !bf16_ok)
      return ct_set_error(CT_ERR_CONFIG, "train.precision = \"bf16\": cuda:%d (%s) is sm_%d%d;"
                          " bf16 needs compute capability 8.0 or newer (use fp16)", local_rank,
                          name, major, minor);
    /* auto: bf16 on compute capability >= 8.0, fp16 with dynamic loss scaling before */
    const char *prec = !strcmp(t->precision, "auto") ? (bf16_ok ? "bf16" : "fp16") : t->precision;
    b->ops = !strcmp(prec, "bf16") ? ct_ops_cuda_bf16()
             : !strcmp(prec, "fp16") ? ct_ops_cuda_fp16() : ct_ops_cuda();
    b->cuda = true;
    snprintf(b->precision, sizeof b->precision, "%s", prec);
    snprintf(b->device, sizeof b->device, "cuda:%d (%s, pci %s, sm_%d%d)", local_rank, name, pci,
             major, minor);
    ct_log_info("device: %s, %s%s", b->device,
                !strcmp(prec, "fp32") ? "fp32" : !strcmp(prec, "bf16") ? "bf16 mixed precision"
                                                                     : "fp16 mixed precision",
                !strcmp(prec, "fp32") && getenv("CT_CUDA_TF32") ? " (TF32 matmuls)" : "");
    return CT_OK;
  }
#endif
  (void)local_rank;
  if (strcmp(t->precision, "auto") && strcmp(t->precision, "fp32"))
    ct_log_warn("train.precision = \"%s\": the CPU backend computes in fp32", t->precision);
  ct_log_info("device: %s, fp32 (%s)", b->device,
              CT_HAVE_CUDA ? "no CUDA device visible" : "CPU-only build");
  return CT_OK;
}

ct_status ct_backend_check(const ct_backend *b) {
#if CT_HAVE_CUDA
  if (b->cuda) {
    char err[1024];
    if (ct_cuda_check(err, sizeof err) != 0) return ct_set_error(CT_ERR_RUNTIME, "%s", err);
  }
#endif
  (void)b;
  return CT_OK;
}

ct_status ct_backend_set_variant(const ct_backend *b, const char *op, const char *variant) {
#if CT_HAVE_CUDA
  if (b->cuda && ct_cuda_set_variant(op, variant) != 0)
    return ct_set_error(CT_ERR_USAGE, "the CUDA backend has no %s variant '%s'", op, variant);
#endif
  (void)b, (void)op, (void)variant;
  return CT_OK;
}

void ct_backend_shutdown(ct_backend *b) {
#if CT_HAVE_CUDA
  if (b->cuda) ct_cuda_shutdown();
#endif
  b->cuda = false;
}

#if CT_HAVE_CUDA
/* Version of a CUDA-family library, read at run time through dlopen so `ctrain env` can report
 * libraries the binary does not link (cuDNN) without depending on them. */
static void lib_version(FILE *f, const char *label, const char *const *sonames, const char *sym,
                        int kind) {
  for (int i = 0; sonames[i]; i++) {
    void *h = dlopen(sonames[i], RTLD_LAZY | RTLD_LOCAL);
    if (!h) continue;
    void *fn = dlsym(h, sym);
    long v = -1;
    if (fn && kind == 0) v = ((size_t (*)(void))fn)();                 /* cudnnGetVersion */
    if (fn && kind == 1) { int x = 0; if (((int (*)(int *))fn)(&x) == 0) v = x; } /* ncclGetVersion */
    if (fn && kind == 2) { /* cublasGetProperty(MAJOR=0, MINOR=1, PATCH=2) */
      int ma = 0, mi = 0, pa = 0;
      int (*get)(int, int *) = (int (*)(int, int *))fn;
      if (!get(0, &ma) && !get(1, &mi) && !get(2, &pa)) v = ma * 10000L + mi * 100 + pa;
    }
    dlclose(h);
    if (v < 0) continue;
    fprintf(f, "  %-8s %ld.%ld.%ld (%s)\n", label, v / 10000, v / 100 % 100, v % 100, sonames[i]);
    return;
  }
  fprintf(f, "  %-8s not found\n", label);
}
#endif

void ct_env_print(FILE *f) {
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  const char *order = getenv("CUDA_DEVICE_ORDER");
  unsigned maj, min, rel;
  H5get_libversion(&maj, &min, &rel);
  fprintf(f, "ctrain %s\n", "0.1.0");
  fprintf(f, "build: %s\n", CT_HAVE_CUDA ? "CUDA + CPU" : "CPU only");
  fprintf(f, "CUDA_VISIBLE_DEVICES: %s\n", vis ? (vis[0] ? vis : "(empty: CPU only)") : "(unset: all)");
  fprintf(f, "CUDA_DEVICE_ORDER: %s\n", order ? order : "(unset: FASTEST_FIRST; set PCI_BUS_ID to match nvidia-smi)");
#if CT_HAVE_CUDA
  int rt = 0, drv = 0;
  ct_cuda_versions(&rt, &drv);
  fprintf(f, "CUDA runtime %d.%d, driver %d.%d\n", rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
  int n = ct_cuda_visible_devices();
  fprintf(f, "devices: %d\n", n);
  for (int i = 0; i < n; i++) {
    char name[256], pci[32];
    int ma, mi;
    size_t mem;
    if (ct_cuda_device_info(i, name, sizeof name, pci, sizeof pci, &ma, &mi, &mem) == 0)
      fprintf(f, "  cuda:%d  %-28s pci %s  %.1f GiB  sm_%d%d  precision auto -> %s\n", i, name, pci,
              mem / 1073741824.0, ma, mi, ma >= 8 ? "bf16" : "fp16");
  }
  const char *virt = getenv("CT_CUDA_VIRTUAL_DEVICES");
  if (n > 0 && virt && atoi(virt) > 0)
    fprintf(f, "CT_CUDA_VIRTUAL_DEVICES=%s: inference sees %d devices, device i on cuda:(i mod %d)"
            " (for tests)\n", virt, atoi(virt) < 16 ? atoi(virt) : 16, n);
#else
  fprintf(f, "devices: none (CPU-only build)\n");
#endif
  fprintf(f, "cpu: %d OpenMP threads; precision auto -> fp32\n", omp_get_max_threads());
#if CT_HAVE_CUDA
  fprintf(f, "CUDA libraries:\n");
  lib_version(f, "cuBLAS", (const char *const[]){"libcublas.so.13", "libcublas.so.12", "libcublas.so", NULL},
              "cublasGetProperty", 2);
  lib_version(f, "NCCL", (const char *const[]){"libnccl.so.2", "libnccl.so", NULL}, "ncclGetVersion", 1);
  lib_version(f, "cuDNN", (const char *const[]){"libcudnn.so.9", "libcudnn.so", NULL}, "cudnnGetVersion", 0);
#endif
  fprintf(f, "libraries: HDF5 %u.%u.%u, OpenBLAS\n", maj, min, rel);
  fprintf(f, "attention backends: cpu: eager%s%s\n",
          CT_HAVE_CUDA ? "; cuda fp32: eager (cuBLAS batched); cuda bf16/fp16: flash (own FA2-style"
                         " kernel, head dims 64/128; others fall back to eager)" : "",
          CT_HAVE_CUDNN ? ", cudnn (cuDNN fused attention, head dims 64/128), auto (flash or cudnn"
                          " per shape, timed on first use)" : "");
#if CT_HAVE_CUDNN
  const size_t cv = ct_cudnn_attn_runtime_version();
  const int fv = ct_cudnn_attn_frontend_version();
  fprintf(f, "attention.implementation choices: %s (cudnn: built with cudnn-frontend %d.%d.%d,"
          " runtime cuDNN %zu.%zu.%zu%s)\n", ct_registry_attention_available(), fv / 10000,
          fv / 100 % 100, fv % 100, cv / 10000, cv / 100 % 100, cv % 100,
          cv < 90000 ? ": too old, fused attention needs 9.0+" : "");
#else
  fprintf(f, "attention.implementation choices: %s (cudnn: not in this build; it needs the"
          " cudnn-frontend headers at configure time)\n", ct_registry_attention_available());
#endif
  /* the default kernel tables ([kernels] and use_kernels in a config change them) */
  ct_kernels_cfg kc = {.use_kernels = true, .attention = "auto"};
  ct_kernel_table kt;
  for (int d = CT_HAVE_CUDA ? 0 : 1; d < 2; d++)
    if (ct_registry_resolve(d ? "cpu" : "cuda", &kc, &kt) == CT_OK) {
      fprintf(f, "kernels %s (use_kernels = true, no [kernels] entries):\n", kt.device);
      ct_registry_print(&kt, f, "  ");
    }
}
