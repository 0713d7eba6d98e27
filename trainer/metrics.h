/* trainer/metrics.h — metrics.jsonl (one JSON object per line) and the terminal progress line.
 * Step lines: {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms"}; eval lines:
 * {"step", "val_loss"}. Lines are flushed as written so a crash loses nothing already logged. */
#ifndef CT_METRICS_H
#define CT_METRICS_H

#include <stdbool.h>

#include "common/status.h"

typedef struct ct_metrics ct_metrics;

ct_status ct_metrics_open(const char *out_dir, ct_metrics **out);
void ct_metrics_step(ct_metrics *mt, int step, double loss, double lr, double grad_norm,
                     double tokens_per_s, double step_ms);
/* fp16 runs: also the loss scale, and whether the step was skipped (inf/nan gradients). */
void ct_metrics_scaler(ct_metrics *mt, int step, double loss_scale, bool skipped);
void ct_metrics_eval(ct_metrics *mt, int step, double val_loss);
void ct_metrics_close(ct_metrics *mt);

/* One updating line on a terminal (stderr is a tty): step/total, loss, tokens/s, ETA.
 * Off a terminal it prints a plain line when `force` is set (every train.log_every steps). */
void ct_progress(int step, int total, double loss, double tokens_per_s, double eta_s, bool force);
void ct_progress_end(void); /* ends the updating line before other output */

#endif
