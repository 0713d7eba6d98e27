/* trainer/data.h — token datasets in HDF5, the built-in byte tokenizer, and the loader.
 *
 * File layout (one file per split, e.g. data/fortunes/train.h5 and val.h5):
 *   dataset  /tokens      1-D, uint16 (vocab <= 65536) or uint32, chunked (1 Mi tokens or
 *                         fewer), documents separated by eot_id
 *   attrs on /tokens      vocab_size (int64), eot_id (int64), tokenizer (string: "byte" for
 *                         the built-in tokenizer, later a tokenizer digest)
 * Writers create "<path>.tmp" and rename it over <path> only when complete, so an interrupted
 * prepare never leaves a half-written file where a good one was.
 */
#ifndef CT_DATA_H
#define CT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* ---- built-in byte-level tokenizer: ids 0..255 are bytes, 256 is end-of-text ---- */
enum { CT_BYTE_VOCAB = 257, CT_BYTE_EOT = 256 };
/* Writes one id per byte of `text` into ids (capacity >= len). Returns the count. */
size_t ct_byte_encode(const char *text, size_t len, int32_t *ids);
/* Appends the bytes of ids < 256 to out (capacity >= n + 1, NUL-terminated); EOT and other
 * ids are skipped. Returns the number of bytes written. */
size_t ct_byte_decode(const int32_t *ids, size_t n, char *out);

/* ---- writer (streaming: memory does not grow with the number of tokens) ---- */
typedef struct ct_token_writer ct_token_writer;
ct_status ct_token_writer_create(const char *path, int64_t vocab_size, int64_t eot_id,
                                 const char *tokenizer, ct_token_writer **out);
ct_status ct_token_writer_append(ct_token_writer *w, const int32_t *ids, size_t n);
/* Flushes, closes and renames into place; frees w even on failure. */
ct_status ct_token_writer_close(ct_token_writer *w);
/* Frees w and removes the temporary file without renaming (error paths). */
void ct_token_writer_abort(ct_token_writer *w);

/* ---- reader metadata ---- */
typedef struct ct_tokens_info {
  int64_t n_tokens;
  int64_t vocab_size;
  int64_t eot_id;
  char tokenizer[128];
  int bits; /* 16 or 32 */
} ct_tokens_info;
/* Opens `path`, checks the layout, fills info. Missing file, missing dataset or attribute,
 * wrong type: CT_ERR_INPUT naming the path and what was expected. */
ct_status ct_tokens_info_read(const char *path, ct_tokens_info *info);

/* ---- loader ----
 * Draws windows of T+1 consecutive tokens (inputs = first T, targets = last T).
 * RANDOM: window k of this rank starts at a position drawn from a counter-based hash of
 *   (seed, k * world + rank), so ranks draw disjoint streams and a position (the counter) is
 *   all the state there is: saving `ct_loader_position` and restoring it resumes exactly.
 * SEQUENTIAL: windows at offsets 0, T, 2T, ... (rank r takes every world-th), wrapping at the
 *   end; used for evaluation, `ct_loader_reset` goes back to the first window.
 * Opening validates the file: the tokenizer name must equal `tokenizer` (when not NULL), the
 * vocab_size attribute must be <= model_vocab, every token id must be < model_vocab (an O(n)
 * streaming scan at open, ~1 GB/s), and the file must hold at least T+1 tokens. Each failure is
 * CT_ERR_INPUT with the path, and the offending value and position. */
typedef enum ct_loader_mode { CT_LOADER_RANDOM, CT_LOADER_SEQUENTIAL } ct_loader_mode;
typedef struct ct_loader ct_loader;
ct_status ct_loader_open(const char *path, const char *tokenizer, int64_t model_vocab, int T,
                         int rank, int world, uint64_t seed, ct_loader_mode mode,
                         ct_loader **out);
/* Fills inputs and targets, each (B, T) int32. */
ct_status ct_loader_next(ct_loader *l, int B, int32_t *inputs, int32_t *targets);
void ct_loader_reset(ct_loader *l);
uint64_t ct_loader_position(const ct_loader *l);
void ct_loader_set_position(ct_loader *l, uint64_t pos);
const ct_tokens_info *ct_loader_info(const ct_loader *l);
void ct_loader_destroy(ct_loader *l);

/* ---- `ctrain prepare` ----
 * ctrain prepare [--out-dir DIR] [--val-every K] [--tokenizer byte] [FILE|GLOB ...]
 * Without inputs: the Debian `fortunes` corpus (/usr/share/games/fortunes/<name>, excluding
 * *.dat, *.u8 and subdirectories), each fortune (text between lines holding only "%") a document.
 * Plain files (other than fortune files) are one document each. Document i (0-based, in input
 * order) goes to val when i % K == 0 (default K = 20, i.e. 5%), else train: a deterministic
 * split. Writes DIR/train.h5 and DIR/val.h5 (default DIR data/fortunes) and prints counts.
 * Returns a status; main() turns it into the exit code. */
ct_status ct_cmd_prepare(int argc, char **argv);

#endif
