/* trainer/tokenizer.h — text <-> token ids: the built-in byte tokenizer, or a Hugging Face
 * `tokenizer.json` holding a byte-level BPE (GPT-2, Qwen2/3, Llama 3 style), encoded and decoded
 * exactly as the `tokenizers` library does.
 *
 * Supported tokenizer.json (anything else is a CT_ERR_INPUT naming the file and the field):
 *   model          BPE; vocab; merges as "a b" strings or ["a", "b"] pairs (rank = index);
 *                  ignore_merges; unk_token/fuse_unk; continuing_subword_prefix and
 *                  end_of_word_suffix null or ""; dropout is ignored (encoding is deterministic,
 *                  as with dropout 0); byte_fallback false.
 *   normalizer     null, NFC, NFD, NFKC, NFKD, or a Sequence of these (utf8proc).
 *   pre_tokenizer  ByteLevel (use_regex: the GPT-2 regex; add_prefix_space), Split (Regex or
 *                  String pattern, behavior Isolated, invert false), or a Sequence of these whose
 *                  last step is ByteLevel. Regexes run in PCRE2 (UTF + UCP, JIT when available).
 *   decoder        ByteLevel.
 *   post_processor ignored: encode() is `encode(text, add_special_tokens=False)`; the trainer
 *                  places end-of-text tokens itself.
 *   added_tokens   matched in the text before pre-tokenization, leftmost then longest first;
 *                  `normalized: false` ones against the raw text, `normalized: true` ones (their
 *                  normalized content) against the normalized text; single_word, lstrip and
 *                  rstrip as in the library. Special or not, they are matched (the library's
 *                  default, split_special_tokens=False).
 *
 * Unicode versions: the library's regex engine and normalizer use other Unicode versions than
 * PCRE2 and utf8proc here; tokenizer.c carries tables (made by tools/make_tokenizers.py) so that
 * \p{L}, \p{N}, \s and the normalization forms classify every code point as the library does.
 *
 * Invalid UTF-8 input: the library takes Python str, which cannot hold invalid UTF-8, so this
 * tokenizer defines it as Python's bytes.decode("utf-8", errors="replace") would: each maximal
 * invalid subpart (Unicode 'substitution of maximal subparts') becomes one U+FFFD before
 * normalization and pre-tokenization. The byte tokenizer takes the bytes as they are.
 *
 * A loaded tokenizer is immutable except for an internal word cache behind a mutex, so one
 * tokenizer may be shared by threads encoding concurrently.
 */
#ifndef CT_TOKENIZER_H
#define CT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct ct_tokenizer ct_tokenizer;

/* spec: "byte" for the built-in byte tokenizer of trainer/data.h (ids 0..255 are bytes, 256 is
 * end-of-text), or a path to a tokenizer.json file or to a directory holding one. On failure
 * *out is NULL and the message names the file and what is wrong with it. */
ct_status ct_tokenizer_load(const char *spec, ct_tokenizer **out);
void ct_tokenizer_destroy(ct_tokenizer *t); /* NULL is fine */

/* max id + 1 over the model vocab and the added tokens (257 for "byte"). */
int64_t ct_tokenizer_vocab_size(const ct_tokenizer *t);
/* End-of-text id: the token "<|endoftext|>" when there is one (GPT-2, Qwen), else the first
 * special added token that reads as an end token (</s>, <eos>, <|end_of_text|>, <|eot_id|>,
 * ...); -1 if none. 256 for "byte". */
int32_t ct_tokenizer_eot_id(const ct_tokenizer *t);
/* "byte" for the built-in tokenizer, else "sha256:<64 hex digits>" of the tokenizer.json bytes.
 * Token files record it, and the loader refuses a file made with another tokenizer. Owned by t. */
const char *ct_tokenizer_digest(const ct_tokenizer *t);
/* The file the tokenizer was loaded from ("byte" for the built-in one). Owned by t. */
const char *ct_tokenizer_path(const ct_tokenizer *t);

/* Encodes len bytes of text (need not be NUL-terminated; may hold NUL). *ids is malloc'd (never
 * NULL on success, even when *n is 0) and owned by the caller. */
ct_status ct_tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, int32_t **ids,
                              size_t *n);
/* For tests and debugging: the pieces the BPE would see — the pre-tokens of the normalized text
 * (bytes, before the byte-level mapping) and the text matched by each added token — in order,
 * concatenated in *bytes (malloc'd, NUL-terminated) with their lengths in *lens (malloc'd, *n of
 * them). The byte tokenizer returns the text as one piece. */
ct_status ct_tokenizer_pieces(const ct_tokenizer *t, const char *text, size_t len, char **bytes, size_t **lens,
                              size_t *n);
/* Decodes ids to text: *text is malloc'd, NUL-terminated, owned by the caller; *len excludes the
 * NUL. As the library's decode(ids, skip_special_tokens=False): special tokens are written out,
 * ids that are no token are skipped, and invalid UTF-8 in the joined bytes becomes U+FFFD.
 * The byte tokenizer writes bytes 0..255 as they are and skips every other id. */
ct_status ct_tokenizer_decode(const ct_tokenizer *t, const int32_t *ids, size_t n, char **text,
                              size_t *len);

/* ---- streaming decode (for generation: one id at a time) ----
 * Emits only complete UTF-8 characters and holds back the start of a multi-byte character until
 * the ids that complete it arrive; invalid sequences become U+FFFD as in ct_tokenizer_decode. The
 * concatenated output of decode_stream over ids, then decode_flush, equals ct_tokenizer_decode of
 * all the ids (for the byte tokenizer: when the bytes are valid UTF-8). */
typedef struct ct_decode_state {
  unsigned char pending[4]; /* bytes of an incomplete character */
  int n_pending;
} ct_decode_state;
#define CT_DECODE_STATE_INIT {{0}, 0}

/* A capacity for `out` that always suffices for one call of decode_stream or decode_flush. */
size_t ct_tokenizer_stream_cap(const ct_tokenizer *t);
/* Appends the text that id completes to out (not NUL-terminated) and returns its length. Like
 * snprintf, writes at most cap bytes but returns the full length; with cap >= stream_cap it
 * never truncates. */
size_t ct_tokenizer_decode_stream(const ct_tokenizer *t, ct_decode_state *s, int32_t id, char *out,
                                  size_t cap);
/* End of stream: a held-back incomplete character becomes U+FFFD. Returns the length written. */
size_t ct_tokenizer_decode_flush(const ct_tokenizer *t, ct_decode_state *s, char *out, size_t cap);

#endif
