/* tests/unit/test_data.c — byte tokenizer, token writer/reader, loader windows and validation,
 * and `ctrain prepare` on a small made-up fortune corpus. CPU only; files go to a fresh
 * directory under $TMPDIR (or /tmp), removed at the end. */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "common/util.h"
#include "tests/unit/ct_test.h"
#include "trainer/data.h"

static char tmpdir[1024];

static const char *tmp_path(char *buf, const char *name) {
  snprintf(buf, 2048, "%s/%s", tmpdir, name);
  return buf;
}

static bool contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* Writes tokens[i] = (i * mul) % vocab for i < n, appended in pieces of `piece`. */
static ct_status write_seq(const char *path, int64_t n, int64_t vocab, int64_t mul, size_t piece,
                           const char *tokenizer) {
  ct_token_writer *w;
  CT_TRY(ct_token_writer_create(path, vocab, vocab - 1, tokenizer, &w));
  int32_t *ids = malloc(sizeof *ids * piece);
  for (int64_t i = 0; i < n;) {
    size_t m = 0;
    for (; m < piece && i < n; m++, i++) ids[m] = (int32_t)((i * mul) % vocab);
    ct_status st = ct_token_writer_append(w, ids, m);
    if (st != CT_OK) { free(ids); ct_token_writer_abort(w); return st; }
  }
  free(ids);
  return ct_token_writer_close(w);
}

static void test_byte_tokenizer(void) {
  const char text[] = "caf\xc3\xa9 \x01\xff\n%\0tail"; /* multibyte, control, 0xff and an embedded NUL */
  size_t len = sizeof text - 1;
  int32_t ids[64];
  CHECK(ct_byte_encode(text, len, ids) == len);
  CHECK(ids[0] == 'c' && ids[3] == 0xc3 && ids[4] == 0xa9 && ids[6] == 1 && ids[7] == 255 && ids[10] == 0);
  for (size_t i = 0; i < len; i++) CHECK(ids[i] >= 0 && ids[i] < 256);
  ids[len] = CT_BYTE_EOT; /* EOT is skipped by decode */
  char out[64];
  CHECK(ct_byte_decode(ids, len + 1, out) == len);
  CHECK(memcmp(out, text, len) == 0 && out[len] == '\0');
}

/* Checks that every row is T+1 consecutive tokens of the sequence (i * 1) % V. */
static void check_consecutive(const int32_t *x, const int32_t *y, int B, int T, int64_t V) {
  int bad = 0;
  for (int b = 0; b < B; b++) {
    const int32_t *xi = x + (size_t)b * T, *yi = y + (size_t)b * T;
    for (int j = 0; j < T; j++) {
      if (yi[j] != (int32_t)((xi[j] + 1) % V)) bad++;               /* next token of the file */
      if (j + 1 < T && yi[j] != xi[j + 1]) bad++;                     /* targets = inputs shifted */
    }
  }
  CHECK_MSG(bad == 0, "%d non-consecutive tokens", bad);
}

static void test_roundtrip_random(void) {
  char path[2048];
  tmp_path(path, "seq16.h5");
  const int64_t V = 50000, N = (5 << 19) + 123; /* 2.5 Mi tokens: several buffer flushes and chunks */
  ct_status st = write_seq(path, N, V, 1, 100003, "test-tok");
  CHECK_MSG(st == CT_OK, "%s", ct_last_error());
  char tmp[2100];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(!ct_file_exists(tmp));

  ct_tokens_info info;
  st = ct_tokens_info_read(path, &info);
  CHECK_MSG(st == CT_OK, "%s", ct_last_error());
  CHECK(info.n_tokens == N && info.vocab_size == V && info.eot_id == V - 1 && info.bits == 16);
  CHECK(strcmp(info.tokenizer, "test-tok") == 0);

  enum { T = 64, B = 8 };
  static int32_t x[3][B * T], y[3][B * T], x2[B * T], y2[B * T];
  ct_loader *l = NULL, *l2 = NULL;
  st = ct_loader_open(path, "test-tok", V, T, 0, 1, 1234, CT_LOADER_RANDOM, &l);
  CHECK_MSG(st == CT_OK, "%s", ct_last_error());
  if (!l) return;
  CHECK(ct_loader_info(l)->n_tokens == N);
  for (int s = 0; s < 3; s++) {
    CHECK(ct_loader_position(l) == (uint64_t)(s * B));
    CHECK(ct_loader_next(l, B, x[s], y[s]) == CT_OK);
    check_consecutive(x[s], y[s], B, T, V);
  }
  CHECK(memcmp(x[0], x[1], sizeof x[0]) != 0); /* windows move */
  /* rows start at different offsets within a batch */
  int same_rows = 0;
  for (int b = 1; b < B; b++) same_rows += x[0][b * T] == x[0][0];
  CHECK(same_rows == 0);

  /* same seed: same stream; resume from a saved position; reset */
  CHECK(ct_loader_open(path, "test-tok", V, T, 0, 1, 1234, CT_LOADER_RANDOM, &l2) == CT_OK);
  CHECK(ct_loader_next(l2, B, x2, y2) == CT_OK);
  CHECK(memcmp(x2, x[0], sizeof x2) == 0 && memcmp(y2, y[0], sizeof y2) == 0);
  ct_loader_set_position(l2, 2 * B);
  CHECK(ct_loader_next(l2, B, x2, y2) == CT_OK);
  CHECK(memcmp(x2, x[2], sizeof x2) == 0 && memcmp(y2, y[2], sizeof y2) == 0);
  ct_loader_set_position(l2, B + 3); /* positions count windows, not batches */
  CHECK(ct_loader_next(l2, 1, x2, y2) == CT_OK);
  CHECK(memcmp(x2, x[1] + 3 * T, sizeof(int32_t) * T) == 0);
  ct_loader_reset(l2);
  CHECK(ct_loader_position(l2) == 0);
  CHECK(ct_loader_next(l2, B, x2, y2) == CT_OK);
  CHECK(memcmp(x2, x[0], sizeof x2) == 0);
  ct_loader_destroy(l2);

  /* another seed: another stream */
  CHECK(ct_loader_open(path, "test-tok", V, T, 0, 1, 1235, CT_LOADER_RANDOM, &l2) == CT_OK);
  CHECK(ct_loader_next(l2, B, x2, y2) == CT_OK);
  CHECK(memcmp(x2, x[0], sizeof x2) != 0);
  check_consecutive(x2, y2, B, T, V);
  ct_loader_destroy(l2);

  /* world = 2: rank r's window k is global window k*2 + r of the world-1 stream, so the two
   * ranks draw different windows that interleave into the single-process stream */
  for (int r = 0; r < 2; r++) {
    CHECK(ct_loader_open(path, "test-tok", V, T, r, 2, 1234, CT_LOADER_RANDOM, &l2) == CT_OK);
    CHECK(ct_loader_next(l2, B / 2, x2, y2) == CT_OK);
    int mism = 0;
    for (int b = 0; b < B / 2; b++) mism += memcmp(x2 + b * T, x[0] + (2 * b + r) * T, sizeof(int32_t) * T) != 0;
    CHECK_MSG(mism == 0, "rank %d: %d windows differ from the interleaved stream", r, mism);
    ct_loader_destroy(l2);
  }

  /* the hyperslab path (no in-memory cache) gives the same windows */
  setenv("CT_DATA_CACHE_MAX_BYTES", "0", 1);
  CHECK(ct_loader_open(path, "test-tok", V, T, 0, 1, 1234, CT_LOADER_RANDOM, &l2) == CT_OK);
  unsetenv("CT_DATA_CACHE_MAX_BYTES");
  for (int s = 0; s < 3 && l2; s++) {
    CHECK(ct_loader_next(l2, B, x2, y2) == CT_OK);
    CHECK(memcmp(x2, x[s], sizeof x2) == 0 && memcmp(y2, y[s], sizeof y2) == 0);
  }
  ct_loader_destroy(l2);
  ct_loader_destroy(l);

  /* tokenizer NULL skips the name check */
  CHECK(ct_loader_open(path, NULL, V, T, 0, 1, 1, CT_LOADER_RANDOM, &l2) == CT_OK);
  ct_loader_destroy(l2);
}

static void test_sequential(void) {
  char path[2048];
  tmp_path(path, "seq_small.h5");
  const int64_t V = 257, N = 1000;
  CHECK(write_seq(path, N, V, 1, 77, "byte") == CT_OK);
  enum { T = 100 };
  int32_t x[12 * T], y[12 * T];
  for (int cached = 1; cached >= 0; cached--) {
    if (!cached) setenv("CT_DATA_CACHE_MAX_BYTES", "0", 1);
    ct_loader *l = NULL;
    CHECK(ct_loader_open(path, "byte", V, T, 0, 1, 99, CT_LOADER_SEQUENTIAL, &l) == CT_OK);
    unsetenv("CT_DATA_CACHE_MAX_BYTES");
    if (!l) return;
    /* 999 / 100 = 9 full windows (starts 0..800, last one reads token 900..1000), then wrap */
    CHECK(ct_loader_next(l, 4, x, y) == CT_OK);
    CHECK(ct_loader_next(l, 8, x + 4 * T, y + 4 * T) == CT_OK);
    for (int w = 0; w < 12; w++) {
      int start = (w % 9) * T;
      CHECK_MSG(x[w * T] == start % V, "window %d starts at token %d, want %d", w, x[w * T], (int)(start % V));
      CHECK(y[w * T + T - 1] == (start + T) % V);
    }
    check_consecutive(x, y, 12, T, V);
    ct_loader_reset(l);
    CHECK(ct_loader_next(l, 1, x, y) == CT_OK && x[0] == 0);
    ct_loader_destroy(l);
  }
  /* two ranks take alternate windows: rank 1 gets T, 3T, 5T, ... */
  ct_loader *l1 = NULL;
  CHECK(ct_loader_open(path, "byte", V, T, 1, 2, 0, CT_LOADER_SEQUENTIAL, &l1) == CT_OK);
  if (l1) {
    CHECK(ct_loader_next(l1, 3, x, y) == CT_OK);
    CHECK(x[0] == T % V && x[T] == 3 * T % V && x[2 * T] == 5 * T % V);
    ct_loader_destroy(l1);
  }
  /* N tokens hold one window of T = N-1; T = N needs N+1 tokens: too few */
  ct_loader *l = NULL;
  CHECK(ct_loader_open(path, "byte", V, (int)N - 1, 0, 1, 0, CT_LOADER_SEQUENTIAL, &l) == CT_OK);
  ct_loader_destroy(l);
  l = NULL;
  ct_status st = ct_loader_open(path, "byte", V, (int)N, 0, 1, 0, CT_LOADER_SEQUENTIAL, &l);
  CHECK(st == CT_ERR_INPUT && l == NULL);
  CHECK_MSG(contains(ct_last_error(), path) && contains(ct_last_error(), "1000"), "%s", ct_last_error());
}

static void test_uint32(void) {
  char path[2048];
  tmp_path(path, "seq32.h5");
  const int64_t V = 70000, N = 5000;
  CHECK(write_seq(path, N, V, 997, 999, "wide") == CT_OK);
  ct_tokens_info info;
  CHECK(ct_tokens_info_read(path, &info) == CT_OK);
  CHECK(info.bits == 32 && info.vocab_size == V && info.n_tokens == N);
  enum { T = 100 };
  int32_t x[3 * T], y[3 * T];
  for (int cached = 1; cached >= 0; cached--) {
    if (!cached) setenv("CT_DATA_CACHE_MAX_BYTES", "0", 1);
    ct_loader *l = NULL;
    CHECK(ct_loader_open(path, "wide", V, T, 0, 1, 0, CT_LOADER_SEQUENTIAL, &l) == CT_OK);
    unsetenv("CT_DATA_CACHE_MAX_BYTES");
    if (!l) return;
    CHECK(ct_loader_next(l, 3, x, y) == CT_OK);
    int bad = 0, big = 0;
    for (int i = 0; i < 3 * T; i++) {
      bad += x[i] != (int32_t)((int64_t)i * 997 % V);
      bad += y[i] != (int32_t)((int64_t)(i + 1) * 997 % V);
      big += x[i] > 65535;
    }
    CHECK(bad == 0);
    CHECK(big > 0); /* the values really need 32 bits */
    ct_loader_destroy(l);
  }
}

/* A hand-made file: `n` uint16 tokens (i % 200, with `bad_id` at `bad_pos` if >= 0); attributes
 * included when their flags are set; tokenizer as a variable-length string if vl_str. */
static void write_raw(const char *path, hid_t ftype, int n, int bad_pos, int bad_id, int64_t vocab,
                      bool with_eot, bool vl_str) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t dim = (hsize_t)n;
  hid_t sp = H5Screate_simple(1, &dim, NULL);
  hid_t d = H5Dcreate2(f, "tokens", ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  int32_t *v = malloc(sizeof *v * (size_t)n);
  for (int i = 0; i < n; i++) v[i] = i % 200;
  if (bad_pos >= 0) v[bad_pos] = bad_id;
  H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  free(v);
  hid_t sc = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(d, "vocab_size", H5T_STD_I64LE, sc, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &vocab);
  H5Aclose(a);
  if (with_eot) {
    int64_t eot = vocab - 1;
    a = H5Acreate2(d, "eot_id", H5T_STD_I64LE, sc, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &eot);
    H5Aclose(a);
  }
  hid_t st = H5Tcopy(H5T_C_S1);
  const char *name = "byte";
  if (vl_str) {
    H5Tset_size(st, H5T_VARIABLE);
    a = H5Acreate2(d, "tokenizer", st, sc, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, st, &name);
  } else {
    H5Tset_size(st, 4); /* NULLTERM by default: "byt"; use NULLPAD to hold all 4 bytes */
    H5Tset_strpad(st, H5T_STR_NULLPAD);
    a = H5Acreate2(d, "tokenizer", st, sc, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, st, name);
  }
  H5Aclose(a);
  H5Tclose(st);
  H5Sclose(sc);
  H5Dclose(d);
  H5Sclose(sp);
  H5Fclose(f);
}

static void expect_input_error(ct_status st, const char *path, const char *a, const char *b) {
  const char *m = ct_last_error();
  CHECK_MSG(st == CT_ERR_INPUT, "status %s: %s", ct_status_str(st), m);
  CHECK_MSG(contains(m, path), "message lacks the path: %s", m);
  if (a) CHECK_MSG(contains(m, a), "message lacks '%s': %s", a, m);
  if (b) CHECK_MSG(contains(m, b), "message lacks '%s': %s", b, m);
}

static void test_validation(void) {
  char path[2048];
  ct_loader *l = NULL;
  ct_tokens_info info;

  tmp_path(path, "missing.h5");
  expect_input_error(ct_loader_open(path, "byte", 257, 8, 0, 1, 0, CT_LOADER_RANDOM, &l), path, "cannot open",
                     "ctrain prepare");
  CHECK(l == NULL);
  expect_input_error(ct_tokens_info_read(path, &info), path, "No such file", NULL);

  /* token id 300 at position 1234 in a file that claims vocab 257 */
  tmp_path(path, "bad_id.h5");
  write_raw(path, H5T_STD_U16LE, 2000, 1234, 300, 257, true, false);
  CHECK(ct_tokens_info_read(path, &info) == CT_OK && strcmp(info.tokenizer, "byte") == 0);
  for (int cached = 1; cached >= 0; cached--) {
    if (!cached) setenv("CT_DATA_CACHE_MAX_BYTES", "0", 1);
    expect_input_error(ct_loader_open(path, "byte", 257, 8, 0, 1, 0, CT_LOADER_RANDOM, &l), path,
                       "token id 300 at position 1234", ">= model vocab_size 257");
    unsetenv("CT_DATA_CACHE_MAX_BYTES");
  }
  CHECK(l == NULL);
  /* same file, a model with a big enough vocabulary: fine */
  CHECK(ct_loader_open(path, "byte", 512, 8, 0, 1, 0, CT_LOADER_RANDOM, &l) == CT_OK);
  ct_loader_destroy(l);
  l = NULL;

  /* variable-length tokenizer string reads the same */
  tmp_path(path, "vlstr.h5");
  write_raw(path, H5T_STD_U16LE, 100, -1, 0, 257, true, true);
  CHECK(ct_tokens_info_read(path, &info) == CT_OK && strcmp(info.tokenizer, "byte") == 0);

  /* missing attribute, signed dtype, not HDF5 at all */
  tmp_path(path, "no_eot.h5");
  write_raw(path, H5T_STD_U16LE, 100, -1, 0, 257, false, false);
  expect_input_error(ct_tokens_info_read(path, &info), path, "eot_id", NULL);
  tmp_path(path, "signed.h5");
  write_raw(path, H5T_STD_I32LE, 100, -1, 0, 257, true, false);
  expect_input_error(ct_tokens_info_read(path, &info), path, "uint16 or uint32", NULL);
  tmp_path(path, "text.h5");
  FILE *f = fopen(path, "w");
  fputs("not hdf5\n", f);
  fclose(f);
  expect_input_error(ct_loader_open(path, "byte", 257, 8, 0, 1, 0, CT_LOADER_RANDOM, &l), path,
                     "not an HDF5 file", NULL);

  /* vocab_size attribute larger than the model's */
  tmp_path(path, "vocab1000.h5");
  CHECK(write_seq(path, 500, 1000, 1, 500, "byte") == CT_OK);
  expect_input_error(ct_loader_open(path, "byte", 257, 8, 0, 1, 0, CT_LOADER_RANDOM, &l), path, "1000", "257");

  /* tokenizer mismatch */
  tmp_path(path, "tok.h5");
  CHECK(write_seq(path, 500, 257, 1, 500, "byte") == CT_OK);
  expect_input_error(ct_loader_open(path, "gpt2", 257, 8, 0, 1, 0, CT_LOADER_RANDOM, &l), path, "\"byte\"",
                     "\"gpt2\"");

  /* too few tokens */
  tmp_path(path, "short.h5");
  CHECK(write_seq(path, 10, 257, 1, 10, "byte") == CT_OK);
  expect_input_error(ct_loader_open(path, "byte", 257, 10, 0, 1, 0, CT_LOADER_RANDOM, &l), path, "10 tokens",
                     NULL);
  CHECK(l == NULL);

  /* bad arguments are config errors, not crashes */
  tmp_path(path, "tok.h5");
  CHECK(ct_loader_open(path, "byte", 257, 0, 0, 1, 0, CT_LOADER_RANDOM, &l) == CT_ERR_CONFIG);
  CHECK(ct_loader_open(path, "byte", 257, 8, 2, 2, 0, CT_LOADER_RANDOM, &l) == CT_ERR_CONFIG);

  /* the writer rejects ids outside its vocabulary */
  ct_token_writer *w = NULL;
  tmp_path(path, "reject.h5");
  CHECK(ct_token_writer_create(path, 257, 256, "byte", &w) == CT_OK);
  int32_t ids[3] = {1, 257, 2};
  CHECK(ct_token_writer_append(w, ids, 3) == CT_ERR_INPUT && contains(ct_last_error(), "257"));
  ct_token_writer_abort(w);
}

static void test_writer_atomic(void) {
  char path[2048], tmp[2100];
  tmp_path(path, "atomic.h5");
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(write_seq(path, 300, 257, 1, 300, "byte") == CT_OK);
  ct_token_writer *w = NULL;
  CHECK(ct_token_writer_create(path, 257, 256, "byte", &w) == CT_OK);
  int32_t ids[5] = {1, 2, 3, 4, 5};
  CHECK(ct_token_writer_append(w, ids, 5) == CT_OK);
  CHECK(ct_file_exists(tmp));
  ct_token_writer_abort(w); /* the good file stays, the temporary goes */
  CHECK(!ct_file_exists(tmp));
  ct_tokens_info info;
  CHECK(ct_tokens_info_read(path, &info) == CT_OK && info.n_tokens == 300);
  CHECK(ct_token_writer_create(path, 257, 256, "byte", &w) == CT_OK);
  CHECK(ct_token_writer_append(w, ids, 5) == CT_OK);
  CHECK(ct_tokens_info_read(path, &info) == CT_OK && info.n_tokens == 300); /* not replaced yet */
  CHECK(ct_token_writer_close(w) == CT_OK);
  CHECK(!ct_file_exists(tmp));
  CHECK(ct_tokens_info_read(path, &info) == CT_OK && info.n_tokens == 5);
  /* an empty file is valid to write and to describe */
  CHECK(ct_token_writer_create(path, 257, 256, "byte", &w) == CT_OK);
  CHECK(ct_token_writer_close(w) == CT_OK);
  CHECK(ct_tokens_info_read(path, &info) == CT_OK && info.n_tokens == 0);
}

/* ---- prepare ---- */

enum { N_DOCS = 40 };
static char docs[N_DOCS][128];

/* Reads every token of a file (SEQUENTIAL loader with one window of T = n-1). */
static int32_t *read_all(const char *path, int64_t *n) {
  ct_tokens_info info;
  if (ct_tokens_info_read(path, &info) != CT_OK || info.n_tokens < 2) return NULL;
  int T = (int)info.n_tokens - 1;
  int32_t *x = malloc(sizeof *x * (size_t)T), *y = malloc(sizeof *y * (size_t)T);
  int32_t *all = malloc(sizeof *all * (size_t)info.n_tokens);
  ct_loader *l = NULL;
  if (ct_loader_open(path, "byte", CT_BYTE_VOCAB, T, 0, 1, 0, CT_LOADER_SEQUENTIAL, &l) == CT_OK &&
      ct_loader_next(l, 1, x, y) == CT_OK) {
    memcpy(all, x, sizeof *x * (size_t)T);
    all[T] = y[T - 1];
    *n = info.n_tokens;
  } else {
    free(all);
    all = NULL;
  }
  ct_loader_destroy(l);
  free(x);
  free(y);
  return all;
}

static void check_split(const char *path, int val, int K) {
  int32_t expect[N_DOCS * 130];
  int64_t n = 0, ndocs = 0;
  for (int i = 0; i < N_DOCS; i++) {
    if ((i % K == 0) != val) continue;
    n += (int64_t)ct_byte_encode(docs[i], strlen(docs[i]), expect + n);
    expect[n++] = CT_BYTE_EOT;
    ndocs++;
  }
  int64_t got_n = 0;
  int32_t *got = read_all(path, &got_n);
  CHECK_MSG(got != NULL, "%s: %s", path, ct_last_error());
  if (!got) return;
  CHECK_MSG(got_n == n, "%s: %lld tokens, want %lld", path, (long long)got_n, (long long)n);
  CHECK(got_n == n && memcmp(got, expect, sizeof *got * (size_t)n) == 0);
  int64_t eots = 0;
  for (int64_t i = 0; i < got_n; i++) eots += got[i] == CT_BYTE_EOT;
  CHECK(eots == ndocs);
  free(got);
}

static bool same_bytes(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  bool ok = ct_read_file(a, &x, &nx) == CT_OK && ct_read_file(b, &y, &ny) == CT_OK && nx == ny &&
            memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return ok;
}

static void write_text(const char *path, const char *s) {
  FILE *f = fopen(path, "w");
  fputs(s, f);
  fclose(f);
}

static void test_prepare(void) {
  char corpus[2048], a[2100], b[2100], c[2100], dat[2200];
  tmp_path(corpus, "corpus");
  CHECK(ct_mkdirs(corpus) == CT_OK);
  snprintf(a, sizeof a, "%s/a", corpus);
  snprintf(b, sizeof b, "%s/b", corpus);
  snprintf(c, sizeof c, "%s/c.txt", corpus);

  /* documents 0..24 in a, 25..38 in b, 39 is all of c.txt (a plain file: its "%" lines stay) */
  for (int i = 0; i < N_DOCS - 1; i++)
    snprintf(docs[i], sizeof docs[i], i % 3 ? "fortune %d\n  second line %%\n" : "fortune %d, one line\n", i);
  snprintf(docs[N_DOCS - 1], sizeof docs[0], "plain file\n%%\nstill the same document\n");
  snprintf(docs[38], sizeof docs[0], "last fortune, no newline at the end");
  char text[8192];
  size_t n = 0;
  n += (size_t)snprintf(text + n, sizeof text - n, "%%\n"); /* leading separator: empty doc, skipped */
  for (int i = 0; i < 25; i++) {
    n += (size_t)snprintf(text + n, sizeof text - n, "%s%%\n", docs[i]);
    if (i == 10) n += (size_t)snprintf(text + n, sizeof text - n, "%%\n"); /* empty doc, skipped */
  }
  write_text(a, text);
  n = 0;
  for (int i = 25; i < 39; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, i < 38 ? "%s%%\n" : "%s", docs[i]);
  write_text(b, text);
  write_text(c, docs[N_DOCS - 1]);
  snprintf(dat, sizeof dat, "%s.dat", a);
  write_text(dat, "");
  snprintf(dat, sizeof dat, "%s.dat", b);
  write_text(dat, "");

  char out1[2048], out2[2048], out3[2048], p1[2100], p2[2100], saved[2100];
  tmp_path(out1, "prep1");
  tmp_path(out2, "prep2");
  tmp_path(out3, "prep3");
  char *argv1[] = {"prepare", "--out-dir", out1, "--val-every", "20", a, b, c, NULL};
  ct_status st = ct_cmd_prepare(8, argv1);
  CHECK_MSG(st == CT_OK, "%s", ct_last_error());
  snprintf(p1, sizeof p1, "%s/val.h5", out1);
  check_split(p1, 1, 20); /* documents 0 and 20 */
  ct_tokens_info info;
  CHECK(ct_tokens_info_read(p1, &info) == CT_OK && info.vocab_size == CT_BYTE_VOCAB &&
        info.eot_id == CT_BYTE_EOT && strcmp(info.tokenizer, "byte") == 0 && info.bits == 16);
  snprintf(p1, sizeof p1, "%s/train.h5", out1);
  check_split(p1, 0, 20);
  snprintf(saved, sizeof saved, "%s/train.saved", tmpdir);
  CHECK(rename(p1, saved) == 0);

  /* again: identical bytes; a glob over the directory (the .dat companions are skipped) and the
   * default K give the same files */
  char glob_arg[2100], outarg[2100];
  snprintf(glob_arg, sizeof glob_arg, "%s/*", corpus);
  snprintf(outarg, sizeof outarg, "--out-dir=%s", out2);
  char *argv2[] = {"prepare", outarg, glob_arg, NULL};
  st = ct_cmd_prepare(3, argv2);
  CHECK_MSG(st == CT_OK, "%s", ct_last_error());
  st = ct_cmd_prepare(8, argv1);
  CHECK_MSG(st == CT_OK, "%s", ct_last_error());
  CHECK(same_bytes(p1, saved));
  snprintf(p2, sizeof p2, "%s/train.h5", out2);
  CHECK(same_bytes(p1, p2));
  snprintf(p1, sizeof p1, "%s/val.h5", out1);
  snprintf(p2, sizeof p2, "%s/val.h5", out2);
  CHECK(same_bytes(p1, p2));

  /* another K: val gets every 8th document */
  char *argv3[] = {"prepare", a, "--out-dir", out3, b, "--val-every", "8", "--", c, NULL}; /* options anywhere */
  CHECK(ct_cmd_prepare(9, argv3) == CT_OK);
  snprintf(p1, sizeof p1, "%s/val.h5", out3);
  check_split(p1, 1, 8);
  snprintf(p1, sizeof p1, "%s/train.h5", out3);
  check_split(p1, 0, 8);

  /* errors */
  char missing[2100], noglob[2100];
  snprintf(missing, sizeof missing, "%s/nope.txt", corpus);
  snprintf(noglob, sizeof noglob, "%s/*.md", corpus);
  char *argv4[] = {"prepare", "--out-dir", out3, a, missing, noglob, NULL};
  st = ct_cmd_prepare(6, argv4);
  CHECK(st == CT_ERR_INPUT);
  CHECK_MSG(contains(ct_last_error(), missing) && contains(ct_last_error(), noglob), "%s", ct_last_error());
  char *argv5[] = {"prepare", "--tokenizer", "gpt2", a, NULL};
  CHECK(ct_cmd_prepare(4, argv5) == CT_ERR_USAGE && contains(ct_last_error(), "gpt2") &&
        contains(ct_last_error(), "byte"));
  char *argv6[] = {"prepare", "--out-dri", out3, a, NULL};
  CHECK(ct_cmd_prepare(4, argv6) == CT_ERR_USAGE && contains(ct_last_error(), "--out-dri") &&
        contains(ct_last_error(), "--out-dir"));
  char *argv7[] = {"prepare", "--val-every", "0", a, NULL};
  CHECK(ct_cmd_prepare(4, argv7) == CT_ERR_USAGE && contains(ct_last_error(), "--val-every"));
  char *argv8[] = {"prepare", "--out-dir", NULL};
  CHECK(ct_cmd_prepare(2, argv8) == CT_ERR_USAGE);
  char *argv9[] = {"prepare", "--help", NULL};
  CHECK(ct_cmd_prepare(2, argv9) == CT_OK);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/ct_test_data_XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_byte_tokenizer();
  test_roundtrip_random();
  test_sequential();
  test_uint32();
  test_validation();
  test_writer_atomic();
  test_prepare();
  /* every file, dataset and attribute the code opened was closed, on error paths too */
  ssize_t open_ids = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  CHECK_MSG(open_ids == 0, "%zd HDF5 objects left open", open_ids);
  if (ct_test_failed == 0) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  } else {
    fprintf(stderr, "test files kept in %s\n", tmpdir);
  }
  return ct_test_finish();
}
