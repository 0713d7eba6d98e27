#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* 4 KiB is enough for a message with a path and a suggestion; longer ones are truncated. */
static _Thread_local char last_error[4096];

const char *ct_status_str(ct_status s) {
  switch (s) {
    case CT_OK: return "ok";
    case CT_ERR_USAGE: return "usage error";
    case CT_ERR_CONFIG: return "config error";
    case CT_ERR_INPUT: return "input error";
    case CT_ERR_IO: return "i/o error";
    case CT_ERR_NOMEM: return "out of memory";
    case CT_ERR_RUNTIME: return "runtime error";
  }
  return "unknown status";
}

int ct_status_exit_code(ct_status s) {
  switch (s) {
    case CT_OK: return 0;
    case CT_ERR_USAGE:
    case CT_ERR_CONFIG:
    case CT_ERR_INPUT: return 2;
    default: return 1;
  }
}

ct_status ct_set_error(ct_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return s;
}

ct_status ct_add_context(ct_status s, const char *fmt, ...) {
  char prefix[1024], old[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_error, sizeof old);
  snprintf(last_error, sizeof last_error, "%s%s", prefix, old);
  return s;
}

const char *ct_last_error(void) { return last_error; }

void ct_clear_error(void) { last_error[0] = '\0'; }
