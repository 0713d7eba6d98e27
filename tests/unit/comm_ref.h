/* tests/unit/comm_ref.h — the reference values and reductions the collective tests check
 * against: tests/unit/test_comm.c (Gloo, CPU) and tests/gpu/test_comm_nccl.c (NCCL).
 *
 * Each rank's inputs are a function of (rank, element), so any rank can compute what every
 * other rank sent and the exact expected result, whatever order the backend reduced in.
 */
#ifndef CT_COMM_REF_H
#define CT_COMM_REF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "parallel/comm.h"

/* Small integers (exact in f32 sums), different per rank so max/min mean something. */
static inline float fval(int rank, size_t i) {
  return (float)((int)((i * 7 + (size_t)rank * 13) % 17) - 8);
}
static inline int32_t ival(int rank, size_t i) {
  return (int32_t)((i * 31 + (size_t)rank * 1000003) % 2000001) - 1000000;
}
static inline int64_t lval(int rank, size_t i) {
  return ((int64_t)1 << 40) * (rank + 1) - (int64_t)(i * 977) * (rank % 2 ? 1 : -1);
}
static inline uint8_t bval(int rank, size_t i) { return (uint8_t)(i * 37 + (size_t)rank * 101); }
/* Multiples of 1/8 with |k| <= 255: exact in bf16 (8 significant bits); sums need rounding. */
static inline float hval(int rank, size_t i) {
  return (float)((int)((i * 53 + (size_t)rank * 71) % 511) - 255) / 8.0f;
}

/* Round to nearest even, written out as the rule (independent of the backends' add tricks). */
static inline uint16_t ref_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t hi = u >> 16, lo = u & 0xffff;
  if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) hi++;
  return (uint16_t)hi;
}
static inline float bf16_f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t ref_f16(float f) {
  _Float16 h = (_Float16)f; /* GCC's conversion rounds to nearest even */
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static inline float f16_f(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}

/* Reference reduction of f over ranks 0..n-1 at element i. */
#define REDUCE(T, f, n, i, op, out)                                                        \
  do {                                                                                     \
    T acc_ = f(0, i);                                                                      \
    for (int r_ = 1; r_ < (n); r_++) {                                                     \
      T v_ = f(r_, i);                                                                     \
      if ((op) == CT_MAX) acc_ = v_ > acc_ ? v_ : acc_;                                    \
      else if ((op) == CT_MIN) acc_ = v_ < acc_ ? v_ : acc_;                               \
      else acc_ = (T)(acc_ + v_);                                                          \
    }                                                                                      \
    if ((op) == CT_AVG) acc_ = (T)(acc_ / (T)(n));                                         \
    (out) = acc_;                                                                          \
  } while (0)

static const ct_redop all_ops[] = {CT_SUM, CT_AVG, CT_MAX, CT_MIN};

#endif
