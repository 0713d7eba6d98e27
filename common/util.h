/* common/util.h — small utilities: time, checked allocation, counter-based RNG, strings. */
#ifndef CT_UTIL_H
#define CT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Monotonic seconds. */
double ct_now(void);

/* malloc/calloc that record CT_ERR_NOMEM with `what` in the message when they fail. */
void *ct_malloc(size_t bytes, const char *what);
void *ct_calloc(size_t n, size_t size, const char *what);
char *ct_strdup(const char *s);

/* SplitMix64 finalizer: a good 64-bit mix, used as a counter-based RNG (hash of seed+counter),
 * so that a stream's whole state is (seed, counter) and it can be saved and resumed exactly. */
static inline uint64_t ct_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

typedef struct ct_rng { uint64_t seed, counter; } ct_rng;
static inline uint64_t ct_rng_u64(ct_rng *r) { return ct_mix64(r->seed ^ ct_mix64(r->counter++)); }
/* uniform in [0, 1) with 24 random bits */
static inline float ct_rng_uniform(ct_rng *r) { return (float)(ct_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }
float ct_rng_normal(ct_rng *r); /* standard normal (Box-Muller) */

/* Levenshtein distance, for "did you mean" suggestions. */
int ct_edit_distance(const char *a, const char *b);

/* Reads a whole file; *out is NUL-terminated and owned by the caller. CT_ERR_INPUT if absent. */
ct_status ct_read_file(const char *path, char **out, size_t *len);

/* mkdir -p */
ct_status ct_mkdirs(const char *path);

bool ct_file_exists(const char *path);

#endif
