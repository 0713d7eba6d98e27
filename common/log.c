#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int log_rank = 0, log_world = 1;

static int log_prefix = 1;

void ct_log_set_rank(int rank, int world) {
  log_rank = rank;
  log_world = world;
  /* ctrain-launch (which sets CTRAIN_RUN_ID) already prefixes each worker's lines */
  log_prefix = getenv("CTRAIN_RUN_ID") == NULL;
}
int ct_log_rank(void) { return log_rank; }

static void vlog(const char *level, const char *fmt, va_list ap) {
  char line[8192];
  int off = 0;
  if (log_world > 1 && log_prefix) off = snprintf(line, sizeof line, "[rank%d]: ", log_rank);
  if (level) off += snprintf(line + off, sizeof line - off, "%s: ", level);
  vsnprintf(line + off, sizeof line - off, fmt, ap);
  fprintf(stderr, "%s\n", line); /* one write per line keeps ranks' lines whole */
}

void ct_log_info(const char *fmt, ...) {
  if (log_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(NULL, fmt, ap);
  va_end(ap);
}

void ct_log_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog("warning", fmt, ap);
  va_end(ap);
}

void ct_log_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog("error", fmt, ap);
  va_end(ap);
}
