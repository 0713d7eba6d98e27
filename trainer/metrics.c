#include "trainer/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

struct ct_metrics { FILE *f; };

ct_status ct_metrics_open(const char *out_dir, ct_metrics **out) {
  char path[4096];
  CT_TRY(ct_mkdirs(out_dir));
  snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
  ct_metrics *mt = ct_calloc(1, sizeof *mt, "metrics");
  if (!mt) return CT_ERR_NOMEM;
  mt->f = fopen(path, "a");
  if (!mt->f) {
    free(mt);
    return ct_set_error(CT_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
  }
  *out = mt;
  return CT_OK;
}

/* JSON has no NaN/Infinity: write null so every line stays parseable. */
static void num(FILE *f, const char *key, double v) {
  const bool exact = !strcmp(key, "loss") || !strcmp(key, "val_loss") || !strcmp(key, "grad_norm");
  if (isfinite(v)) fprintf(f, exact ? ", \"%s\": %.17g" : ", \"%s\": %.7g", key, v);
  else fprintf(f, ", \"%s\": null", key);
}

void ct_metrics_step(ct_metrics *mt, int step, double loss, double lr, double grad_norm,
                     double tokens_per_s, double step_ms) {
  if (!mt) return;
  fprintf(mt->f, "{\"step\": %d", step);
  num(mt->f, "loss", loss); /* %.17g below for losses: exact, so resumed runs compare bit-for-bit */
  num(mt->f, "lr", lr);
  num(mt->f, "grad_norm", grad_norm);
  num(mt->f, "tokens_per_s", tokens_per_s);
  num(mt->f, "step_ms", step_ms);
  fputs("}\n", mt->f);
  fflush(mt->f);
}

void ct_metrics_scaler(ct_metrics *mt, int step, double loss_scale, bool skipped) {
  if (!mt) return;
  fprintf(mt->f, "{\"step\": %d", step);
  num(mt->f, "loss_scale", loss_scale);
  fprintf(mt->f, ", \"skipped\": %s}\n", skipped ? "true" : "false");
  fflush(mt->f);
}

void ct_metrics_eval(ct_metrics *mt, int step, double val_loss) {
  if (!mt) return;
  fprintf(mt->f, "{\"step\": %d", step);
  num(mt->f, "val_loss", val_loss);
  fputs("}\n", mt->f);
  fflush(mt->f);
}

void ct_metrics_close(ct_metrics *mt) {
  if (!mt) return;
  fclose(mt->f);
  free(mt);
}

static int progress_open;

void ct_progress(int step, int total, double loss, double tokens_per_s, double eta_s, bool force) {
  int eta = isfinite(eta_s) && eta_s > 0 ? (int)(eta_s + 0.5) : 0;
  char line[256];
  snprintf(line, sizeof line, "step %*d/%d | loss %.4f | %.0f tok/s | ETA %d:%02d:%02d",
           (int)(total >= 10000 ? 5 : total >= 1000 ? 4 : 3), step, total, loss, tokens_per_s,
           eta / 3600, eta / 60 % 60, eta % 60);
  if (isatty(STDERR_FILENO)) {
    fprintf(stderr, "\r%s\033[K", line);
    progress_open = 1;
    if (force && step == total) ct_progress_end();
  } else if (force) {
    fprintf(stderr, "%s\n", line);
  }
}

void ct_progress_end(void) {
  if (progress_open) fputc('\n', stderr);
  progress_open = 0;
}
