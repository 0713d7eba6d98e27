/* tests/fuzz/fuzz_tokenizer_encode.c — libFuzzer harness for ct_tokenizer_encode / decode /
 * decode_stream / pieces (trainer/tokenizer.c) on arbitrary bytes, invalid UTF-8 included.
 *
 * Tokenizers are loaded once: the GPT-2-style fixture (ByteLevel regex, lstrip/rstrip and
 * single_word added tokens), the Qwen-style one (NFC, a Split regex, ignore_merges) and "byte".
 * The first input byte picks the tokenizer (bits 0-1) and the mode (bit 2); the rest is either
 * text or, in id mode, little-endian int32 ids (any value, negative and out of range included).
 *
 * Text mode: encode must succeed with ids inside the vocabulary; decode must give valid UTF-8 no
 * longer than ids * stream_cap; pieces must succeed. For GPT-2 (no normalizer), valid UTF-8 text
 * without the lstrip/rstrip token "<mask>" must round-trip exactly. Both modes: decode_stream of
 * the ids one at a time, then decode_flush, must equal decode (valid UTF-8 ids only for "byte").
 *
 * Fixture paths: $CT_SOURCE_ROOT/tests/fixtures/tokenizers/{gpt2,qwen}/tokenizer.json, or
 * relative to the working directory when CT_SOURCE_ROOT is unset. Built by tests/fuzz/run.sh.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "trainer/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static ct_tokenizer *toks[3]; /* gpt2, qwen, byte */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *root = getenv("CT_SOURCE_ROOT");
  const char *names[2] = {"gpt2", "qwen"};
  for (int i = 0; i < 2; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s%stests/fixtures/tokenizers/%s/tokenizer.json", root ? root : "",
             root ? "/" : "", names[i]);
    if (ct_tokenizer_load(path, &toks[i]) != CT_OK) {
      fprintf(stderr, "fuzz_tokenizer_encode: %s\n", ct_last_error());
      exit(1);
    }
  }
  CHECK(ct_tokenizer_load("byte", &toks[2]) == CT_OK);
  return 0;
}

/* decode_stream over ids, then decode_flush, must equal `want` */
static void check_stream(const ct_tokenizer *t, const int32_t *ids, size_t n, const char *want,
                         size_t want_len) {
  const size_t cap = ct_tokenizer_stream_cap(t);
  char *out = malloc(cap), *all = malloc(want_len + cap + 1);
  CHECK(out && all);
  size_t pos = 0;
  ct_decode_state s = CT_DECODE_STATE_INIT;
  for (size_t i = 0; i <= n; i++) {
    size_t k = i < n ? ct_tokenizer_decode_stream(t, &s, ids[i], out, cap)
                     : ct_tokenizer_decode_flush(t, &s, out, cap);
    CHECK(k <= cap);
    CHECK(pos + k <= want_len);
    memcpy(all + pos, out, k);
    pos += k;
  }
  CHECK(pos == want_len && memcmp(all, want, want_len) == 0);
  free(out);
  free(all);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const int which = data[0] & 3;
  if (which == 3) return 0;
  const ct_tokenizer *t = toks[which];
  const bool id_mode = data[0] & 4;
  const char *text = (const char *)data + 1;
  const size_t len = size - 1;
  const int64_t vs = ct_tokenizer_vocab_size(t);

  int32_t *ids = NULL;
  size_t n = 0;
  if (id_mode) {
    n = len / 4;
    ids = malloc(sizeof *ids * (n ? n : 1));
    CHECK(ids);
    memcpy(ids, text, n * 4);
  } else {
    CHECK(ct_tokenizer_encode(t, text, len, &ids, &n) == CT_OK);
    CHECK(ids);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < vs);
    char *bytes = NULL;
    size_t *lens = NULL, np = 0;
    CHECK(ct_tokenizer_pieces(t, text, len, &bytes, &lens, &np) == CT_OK);
    CHECK(bytes && lens);
    free(bytes);
    free(lens);
  }

  char *dec = NULL;
  size_t dlen = 0;
  CHECK(ct_tokenizer_decode(t, ids, n, &dec, &dlen) == CT_OK);
  CHECK(dec && dec[dlen] == '\0');
  CHECK(dlen <= n * ct_tokenizer_stream_cap(t));
  const bool byte_tok = which == 2;
  if (!byte_tok) CHECK(utf8_ok((const unsigned char *)dec, dlen));
  if (!id_mode && which == 0 && utf8_ok((const unsigned char *)text, len) &&
      !memmem(text, len, "<mask>", 6))
    CHECK(dlen == len && memcmp(dec, text, len) == 0);
  if (!id_mode && byte_tok) CHECK(dlen == len && memcmp(dec, text, len) == 0);
  if (!byte_tok || utf8_ok((const unsigned char *)dec, dlen)) check_stream(t, ids, n, dec, dlen);
  free(dec);
  free(ids);
  return 0;
}
