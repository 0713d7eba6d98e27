/* tests/fuzz/fuzz.h — what the libFuzzer harnesses of tests/fuzz/ share: CHECK (a failed
 * invariant traps, so libFuzzer keeps the input; the last error says what happened), a strict
 * UTF-8 check for decoded text, and the input as a file for parsers that take a path. */
#ifndef CT_FUZZ_H
#define CT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/status.h"

#define CHECK(c)                                                                          \
  do {                                                                                    \
    if (!(c)) {                                                                           \
      fprintf(stderr, "CHECK failed: %s (line %d): %s\n", #c, __LINE__, ct_last_error()); \
      __builtin_trap();                                                                   \
    }                                                                                     \
  } while (0)

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static inline int utf8_ok(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!k || i + k > n) return 0;
    uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
    for (size_t j = 1; j < k; j++) {
      if ((s[i + j] & 0xc0) != 0x80) return 0;
      cp = cp << 6 | (s[i + j] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    i += k;
  }
  return 1;
}

/* The input's bytes as the whole of one memfd (made on the first call, named `name`), returned
 * as its /proc/self/fd path: the parser under test opens it like any file, unchanged. */
static inline const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create(name, MFD_CLOEXEC);
    CHECK(fd >= 0);
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  CHECK(ftruncate(fd, 0) == 0);
  if (size) CHECK(pwrite(fd, data, size, 0) == (ssize_t)size);
  return path;
}

#endif
