#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

double ct_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *ct_malloc(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) ct_set_error(CT_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
  return p;
}

void *ct_calloc(size_t n, size_t size, const char *what) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) ct_set_error(CT_ERR_NOMEM, "out of memory allocating %zu x %zu bytes for %s", n, size, what);
  return p;
}

char *ct_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

float ct_rng_normal(ct_rng *r) {
  /* Box-Muller; u1 in (0, 1] so log() is finite */
  float u1 = 1.0f - ct_rng_uniform(r);
  float u2 = ct_rng_uniform(r);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

int ct_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 255 || lb > 255) return 1 << 20;
  int prev[256], cur[256];
  for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
      int del = prev[j] + 1, ins = cur[j - 1] + 1;
      cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
    memcpy(prev, cur, sizeof(int) * (lb + 1));
  }
  return prev[lb];
}

ct_status ct_read_file(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return ct_set_error(CT_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) { fclose(f); return ct_set_error(CT_ERR_NOMEM, "%s: out of memory", path); }
  for (;;) {
    if (n + 1 >= cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) { free(buf); fclose(f); return ct_set_error(CT_ERR_NOMEM, "%s: out of memory", path); }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err) { free(buf); return ct_set_error(CT_ERR_IO, "%s: read error", path); }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return CT_OK;
}

ct_status ct_mkdirs(const char *path) {
  char tmp[4096];
  size_t n = strlen(path);
  if (n >= sizeof tmp) return ct_set_error(CT_ERR_USAGE, "path too long: %s", path);
  memcpy(tmp, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (tmp[i] == '/' || tmp[i] == '\0') {
      char c = tmp[i];
      tmp[i] = '\0';
      if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
        return ct_set_error(CT_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
      tmp[i] = c;
    }
  }
  return CT_OK;
}

bool ct_file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}
