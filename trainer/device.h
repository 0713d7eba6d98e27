/* trainer/device.h — backend selection and the `ctrain env` report.
 * The same binary runs everywhere: without a CUDA build, a driver or a visible device
 * (CUDA_VISIBLE_DEVICES= empty) it uses the CPU backend and says so in one line. */
#ifndef CT_DEVICE_H
#define CT_DEVICE_H

#include <stdbool.h>
#include <stdio.h>

#include "common/status.h"
#include "kernels/ops.h"
#include "trainer/config.h"

typedef struct ct_backend {
  const ct_ops *ops;
  char device[160];    /* "cpu (2 threads)", "cuda:0 (NVIDIA H200)" */
  char precision[8];   /* resolved: fp32 | bf16 | fp16 */
  int threads;
  bool cuda;           /* ops live in device memory */
} ct_backend;

/* Picks the backend for this process — CUDA device `local_rank` among the visible devices
 * when there is one, else the CPU — and resolves train.precision; prints one line. */
ct_status ct_backend_select(const ct_train_cfg *t, int local_rank, ct_backend *b);

/* Waits for queued device work and reports the first asynchronous failure (CUDA: the op and
 * call that failed). CT_OK on the CPU. Called once per training step. */
ct_status ct_backend_check(const ct_backend *b);

/* Switches one of the CUDA backend's kernel variants (ct_cuda_set_variant's op and variant
 * names); nothing on the CPU, which has one of each. CT_ERR_USAGE naming both if unknown. */
ct_status ct_backend_set_variant(const ct_backend *b, const char *op, const char *variant);

/* Releases backend resources after every buffer has been freed. */
void ct_backend_shutdown(ct_backend *b);

/* Number of visible CUDA devices (0 without a CUDA build, driver or device). */
int ct_cuda_visible_devices(void);

/* `ctrain env`: devices, CUDA_VISIBLE_DEVICES mapping, precision auto picks, library versions. */
void ct_env_print(FILE *f);

#endif
