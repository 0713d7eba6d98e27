/* tests/fuzz/fuzz_safetensors.c — libFuzzer harness for the safetensors reader
 * (trainer/safetensors.c): the input is a whole file (u64 header length, JSON header, data).
 *
 * ct_st_open() reads through a descriptor (pread), so each input is written to a memfd (made
 * once) and opened by its /proc/self/fd path: the parser under test is the real one, unchanged.
 * A file that validates must keep the promises of safetensors.h: tensors sorted by unique name,
 * each findable, shapes within CT_ST_MAX_DIMS, numel * dtype size == end - begin, the spans
 * tiling the data buffer exactly; and every float tensor must read back (bounded by the input
 * size, since the spans lie inside it).
 * A file that does not validate must be CT_ERR_INPUT. Built by tests/fuzz/run.sh.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "trainer/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *mpath = fuzz_file("fuzz.safetensors", data, size);

  ct_st_file *f = NULL;
  ct_status st = ct_st_open(mpath, &f);
  if (st != CT_OK) {
    CHECK(f == NULL);
    CHECK(st == CT_ERR_INPUT); /* every problem with the bytes is an input error */
    return 0;
  }
  CHECK(f && size >= 8);
  const int n = ct_st_n_tensors(f);
  uint64_t header = 0;
  for (int i = 7; i >= 0; i--) header = header << 8 | data[i];
  const uint64_t data_len = size - 8 - header;
  uint64_t covered = 0;
  for (int i = 0; i < n; i++) {
    const ct_st_tensor *t = ct_st_tensor_at(f, i);
    CHECK(t->name && t->name[0]);
    if (i) CHECK(strcmp(ct_st_tensor_at(f, i - 1)->name, t->name) < 0);
    CHECK(ct_st_find(f, t->name) == t);
    CHECK(t->ndim >= 0 && t->ndim <= CT_ST_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      CHECK(t->shape[d] >= 0);
      numel *= (uint64_t)t->shape[d];
    }
    CHECK(numel == t->numel);
    CHECK(t->begin <= t->end && t->end <= data_len);
    CHECK(t->end - t->begin == t->numel * ct_st_dtype_size(t->dtype));
    covered += t->end - t->begin;
    if (t->dtype == CT_ST_F32 || t->dtype == CT_ST_F16 || t->dtype == CT_ST_BF16 ||
        t->dtype == CT_ST_F64) {
      float *out = malloc(sizeof *out * (size_t)(t->numel ? t->numel : 1));
      CHECK(out);
      CHECK(ct_st_read_f32(f, t, out) == CT_OK);
      free(out);
    } else {
      CHECK(ct_st_read_f32(f, t, NULL) != CT_OK); /* refused before any write */
    }
  }
  CHECK(covered == data_len);
  ct_st_metadata(f, "format");
  ct_st_close(f);
  return 0;
}
