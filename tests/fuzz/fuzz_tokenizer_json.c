/* tests/fuzz/fuzz_tokenizer_json.c — libFuzzer harness for the tokenizer.json loader
 * (ct_tokenizer_load in trainer/tokenizer.c).
 *
 * ct_tokenizer_load() takes a path, so the input goes into a memfd and is loaded by its
 * /proc/self/fd path. A tokenizer that loads must then encode a few fixed texts (ASCII, added
 * token look-alikes, invalid UTF-8) to ids inside its vocabulary, decode them to valid UTF-8, and
 * destroy cleanly; one that does not load must fail with CT_ERR_INPUT. Built by tests/fuzz/run.sh.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "trainer/tokenizer.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *mpath = fuzz_file("tokenizer.json", data, size);

  ct_tokenizer *t = NULL;
  ct_status st = ct_tokenizer_load(mpath, &t);
  if (st != CT_OK) {
    CHECK(t == NULL);
    CHECK(st == CT_ERR_INPUT); /* a bad file is an input error, never "out of memory" */
    return 0;
  }
  const int64_t vs = ct_tokenizer_vocab_size(t);
  CHECK(vs > 0);
  CHECK(ct_tokenizer_eot_id(t) >= -1 && ct_tokenizer_eot_id(t) < vs);
  static const char *texts[] = {
    "Hello world, it's 2024!\n\n  x",
    "<|endoftext|> <mask> <s></s> kitten\xc3\xa9",
    "\xff\xfe a\xe2\x82 \xf0\x9f\x98\x80\xed\xa0\x80 caf\x65\xcc\x81",
  };
  for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (ct_tokenizer_encode(t, texts[k], strlen(texts[k]), &ids, &n) != CT_OK) continue;
    CHECK(ids);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < vs);
    char *text = NULL;
    size_t len = 0;
    if (ct_tokenizer_decode(t, ids, n, &text, &len) == CT_OK) {
      CHECK(text && text[len] == '\0');
      CHECK(utf8_ok((const unsigned char *)text, len));
      free(text);
    }
    free(ids);
  }
  ct_tokenizer_destroy(t);
  return 0;
}
