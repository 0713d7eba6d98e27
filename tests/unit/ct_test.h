/* tests/unit/ct_test.h — tiny assertion helpers shared by the C tests.
 *
 * A test is a main() that runs checks and ends with `return ct_test_finish();`, which prints
 * "name: N checks, M failed" and returns 1 if any check failed (meson counts that as a fail).
 * Checks never abort, so one run reports every mismatch.
 */
#ifndef CT_TEST_H
#define CT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ct_test_checks, ct_test_failed;

#define CHECK(cond)                                                              \
  do {                                                                           \
    ct_test_checks++;                                                            \
    if (!(cond)) {                                                               \
      ct_test_failed++;                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
    }                                                                            \
  } while (0)

#define CHECK_MSG(cond, ...)                                                     \
  do {                                                                           \
    ct_test_checks++;                                                            \
    if (!(cond)) {                                                               \
      ct_test_failed++;                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                              \
      fputc('\n', stderr);                                                       \
    }                                                                            \
  } while (0)

/* Compares n floats: passes when max|a-b| <= atol + rtol * max|ref| (normalized error, as in
 * ggml's test-backend-ops) and nothing is NaN/Inf. Prints the worst element on failure.
 * Returns the normalized error max|a-b| / max(max|ref|, 1e-30). */
static inline double ct_check_close(const char *what, const float *got, const float *ref,
                                    size_t n, double rtol, double atol) {
  double maxdiff = 0, maxref = 0;
  size_t worst = 0;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) bad = 1;
    double d = fabs((double)got[i] - (double)ref[i]);
    if (d > maxdiff) { maxdiff = d; worst = i; }
    if (fabs((double)ref[i]) > maxref) maxref = fabs((double)ref[i]);
  }
  double norm = maxdiff / (maxref > 1e-30 ? maxref : 1e-30);
  ct_test_checks++;
  if (bad || maxdiff > atol + rtol * maxref) {
    ct_test_failed++;
    fprintf(stderr, "%s: mismatch: max|diff| %.3e at [%zu] (got %.8g, want %.8g), max|ref| %.3e,"
            " normalized %.3e > rtol %.1e%s\n", what, maxdiff, worst, n ? got[worst] : 0.0,
            n ? ref[worst] : 0.0, maxref, norm, rtol, bad ? " (non-finite values)" : "");
  }
  return norm;
}

static inline int ct_test_finish(void) {
  const char *name = getenv("MESON_TEST_NAME");
  printf("%s: %d checks, %d failed\n", name ? name : "test", ct_test_checks, ct_test_failed);
  return ct_test_failed ? 1 : 0;
}

#endif
