/* tests/unit/test_tokenizer.c — tokenizer.json BPE against the Hugging Face `tokenizers` library.
 *
 * The fixtures (tests/fixtures/tokenizers, written by tools/make_tokenizers.py) hold a GPT-2
 * style and a Qwen2 style byte-level BPE and, for every sample, the ids and the decoded text the
 * library produced; both must match exactly. Also: the byte tokenizer, streaming decode, invalid
 * UTF-8, concurrent encoding, load errors, SHA-256 (FIPS 180-2 vectors), and an encode speed line
 * over the fortunes corpus (printed, not asserted).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/status.h"
#include "common/util.h"
#include "tests/unit/ct_test.h"
#include "trainer/data.h"
#include "trainer/tokenizer.h"

static char fixtures[2048], tmpdir[1024];
static const char *tok_names[2] = {"gpt2", "qwen"};

typedef struct sample {
  const char *name;
  uint8_t *input;
  size_t input_len;
  int32_t *ids[2];
  size_t n_ids[2];
  uint8_t *decoded[2];
  size_t decoded_len[2];
  char *pieces[2]; /* the library's pre-tokens, concatenated (NULL: not recorded, the text has added tokens) */
  size_t *piece_lens[2], n_pieces[2];
} sample;

static sample *samples;
static int n_samples;

static bool contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static uint8_t *unhex(const char *hex, size_t *n) {
  size_t len = strlen(hex) / 2;
  uint8_t *out = malloc(len + 1);
  for (size_t i = 0; i < len; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    out[i] = (uint8_t)v;
  }
  *n = len;
  return out;
}

static void tok_path(char *buf, size_t cap, int which) {
  snprintf(buf, cap, "%s/%s/tokenizer.json", fixtures, tok_names[which]);
}

static bool load_expected(void) {
  char path[2300], *text;
  snprintf(path, sizeof path, "%s/expected.json", fixtures);
  if (ct_read_file(path, &text, NULL) != CT_OK) {
    fprintf(stderr, "%s\n", ct_last_error());
    return false;
  }
  cJSON *root = cJSON_Parse(text);
  free(text);
  const cJSON *list = cJSON_GetObjectItem(root, "samples"), *it;
  n_samples = cJSON_GetArraySize(list);
  samples = calloc((size_t)n_samples, sizeof *samples);
  int i = 0;
  cJSON_ArrayForEach(it, list) {
    sample *s = &samples[i++];
    s->name = strdup(cJSON_GetObjectItem(it, "name")->valuestring);
    s->input = unhex(cJSON_GetObjectItem(it, "input_hex")->valuestring, &s->input_len);
    for (int k = 0; k < 2; k++) {
      const cJSON *ids = cJSON_GetObjectItem(cJSON_GetObjectItem(it, "ids"), tok_names[k]), *v;
      s->n_ids[k] = (size_t)cJSON_GetArraySize(ids);
      s->ids[k] = malloc(sizeof(int32_t) * (s->n_ids[k] + 1));
      size_t j = 0;
      cJSON_ArrayForEach(v, ids) s->ids[k][j++] = (int32_t)v->valuedouble;
      s->decoded[k] = unhex(cJSON_GetObjectItem(cJSON_GetObjectItem(it, "decoded_hex"), tok_names[k])->valuestring,
                            &s->decoded_len[k]);
      const cJSON *pieces = cJSON_GetObjectItem(cJSON_GetObjectItem(it, "pieces_hex"), tok_names[k]);
      if (pieces) {
        size_t total = 0, np = 0;
        cJSON_ArrayForEach(v, pieces) total += strlen(v->valuestring) / 2;
        s->pieces[k] = malloc(total + 1);
        s->piece_lens[k] = malloc(sizeof(size_t) * ((size_t)cJSON_GetArraySize(pieces) + 1));
        total = 0;
        cJSON_ArrayForEach(v, pieces) {
          size_t len;
          uint8_t *b = unhex(v->valuestring, &len);
          memcpy(s->pieces[k] + total, b, len);
          free(b);
          total += len;
          s->piece_lens[k][np++] = len;
        }
        s->n_pieces[k] = np;
      }
    }
  }
  cJSON_Delete(root);
  return n_samples > 0;
}

static const sample *find_sample(const char *name) {
  for (int i = 0; i < n_samples; i++)
    if (strcmp(samples[i].name, name) == 0) return &samples[i];
  return NULL;
}

static void print_ids(const char *what, const int32_t *v, size_t n, size_t around) {
  size_t lo = around > 6 ? around - 6 : 0, hi = around + 6 < n ? around + 6 : n;
  fprintf(stderr, "  %s (%zu ids) [%zu..%zu):", what, n, lo, hi);
  for (size_t i = lo; i < hi; i++) fprintf(stderr, " %d", v[i]);
  fputc('\n', stderr);
}

/* Every sample: ids equal to the library's, decode of those ids equal to the library's. */
static int pieces_checked;

static void test_against_library(int which, ct_tokenizer *t) {
  int bad = 0;
  for (int i = 0; i < n_samples; i++) {
    const sample *s = &samples[i];
    int32_t *ids = NULL;
    size_t n = 0;
    ct_status st = ct_tokenizer_encode(t, (const char *)s->input, s->input_len, &ids, &n);
    CHECK_MSG(st == CT_OK, "%s/%s: %s", tok_names[which], s->name, ct_last_error());
    bool same = st == CT_OK && n == s->n_ids[which] && memcmp(ids, s->ids[which], sizeof *ids * n) == 0;
    CHECK_MSG(same, "%s/%s: ids differ from the tokenizers library", tok_names[which], s->name);
    if (!same && st == CT_OK && bad++ < 5) {
      size_t d = 0;
      while (d < n && d < s->n_ids[which] && ids[d] == s->ids[which][d]) d++;
      print_ids("got ", ids, n, d);
      print_ids("want", s->ids[which], s->n_ids[which], d);
    }
    free(ids);

    char *text = NULL;
    size_t len = 0;
    st = ct_tokenizer_decode(t, s->ids[which], s->n_ids[which], &text, &len);
    CHECK_MSG(st == CT_OK && len == s->decoded_len[which] && memcmp(text, s->decoded[which], len) == 0 &&
                  text[len] == '\0',
              "%s/%s: decode differs from the tokenizers library (got %zu bytes \"%.60s\", want %zu)",
              tok_names[which], s->name, len, text ? text : "", s->decoded_len[which]);
    free(text);

    /* the pre-tokens themselves: a split the ids of a small vocabulary cannot show */
    if (!s->pieces[which]) continue;
    char *bytes = NULL;
    size_t *lens = NULL, np = 0;
    st = ct_tokenizer_pieces(t, (const char *)s->input, s->input_len, &bytes, &lens, &np);
    bool same_pieces = st == CT_OK && np == s->n_pieces[which];
    for (size_t j = 0, off = 0; same_pieces && j < np; off += lens[j++])
      same_pieces = lens[j] == s->piece_lens[which][j] && memcmp(bytes + off, s->pieces[which] + off, lens[j]) == 0;
    CHECK_MSG(same_pieces, "%s/%s: pre-tokens differ from the tokenizers library (%zu pieces, want %zu)",
              tok_names[which], s->name, np, s->n_pieces[which]);
    free(bytes), free(lens);
    pieces_checked++;
  }
}

static bool valid_utf8(const char *s, size_t n) {
  /* independent of the tokenizer's own check: round trip through mbrtowc-free manual rules */
  for (size_t i = 0; i < n;) {
    uint8_t b = (uint8_t)s[i];
    size_t k = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (!k || i + k > n) return false;
    uint32_t cp = k == 1 ? b : k == 2 ? (b & 0x1Fu) : k == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (size_t j = 1; j < k; j++) {
      if (((uint8_t)s[i + j] & 0xC0) != 0x80) return false;
      cp = cp << 6 | ((uint8_t)s[i + j] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += k;
  }
  return true;
}

/* Streaming decode, one id at a time, equals the full decode, and every chunk is valid UTF-8. */
static void check_stream(const ct_tokenizer *t, const char *what, const int32_t *ids, size_t n) {
  char *full = NULL;
  size_t full_len = 0;
  CHECK(ct_tokenizer_decode(t, ids, n, &full, &full_len) == CT_OK);
  size_t cap = ct_tokenizer_stream_cap(t);
  char *chunk = malloc(cap), *joined = malloc(3 * full_len + 64);
  size_t pos = 0;
  int bad_chunks = 0, held = 0;
  ct_decode_state st = CT_DECODE_STATE_INIT;
  for (size_t i = 0; i <= n; i++) {
    size_t k = i < n ? ct_tokenizer_decode_stream(t, &st, ids[i], chunk, cap) : ct_tokenizer_decode_flush(t, &st, chunk, cap);
    CHECK(k <= cap);
    if (!valid_utf8(chunk, k)) bad_chunks++;
    if (i < n && st.n_pending) held++;
    if (pos + k <= 3 * full_len + 64) memcpy(joined + pos, chunk, k);
    pos += k;
  }
  CHECK_MSG(bad_chunks == 0, "%s: %d streamed chunks are not valid UTF-8", what, bad_chunks);
  CHECK_MSG(pos == full_len && memcmp(joined, full, full_len) == 0, "%s: streamed text (%zu bytes) != decode (%zu bytes)",
            what, pos, full_len);
  printf("stream %s: %zu ids, %zu bytes, %d times a partial character was held back\n", what, n, pos, held);
  /* a small buffer truncates but reports the full length, like snprintf */
  ct_decode_state s2 = CT_DECODE_STATE_INIT;
  char tiny[2] = {'x', 'y'};
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += ct_tokenizer_decode_stream(t, &s2, ids[i], tiny, 1);
  total += ct_tokenizer_decode_flush(t, &s2, tiny, 1);
  CHECK(total == full_len && tiny[1] == 'y');
  free(chunk), free(joined), free(full);
}

static void test_streaming(ct_tokenizer *tk[2], ct_tokenizer *byte) {
  const sample *s = find_sample("japanese_emoji");
  CHECK(s != NULL);
  if (!s) return;
  for (int k = 0; k < 2; k++) {
    char what[64];
    snprintf(what, sizeof what, "%s/japanese_emoji", tok_names[k]);
    check_stream(tk[k], what, s->ids[k], s->n_ids[k]);
  }
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(ct_tokenizer_encode(byte, (const char *)s->input, s->input_len, &ids, &n) == CT_OK);
  check_stream(byte, "byte/japanese_emoji", ids, n);
  free(ids);
  /* invalid UTF-8 streams as the full decode does: U+FFFD per maximal subpart */
  const sample *bad = find_sample("invalid_utf8");
  if (bad) check_stream(tk[0], "gpt2/invalid_utf8", bad->ids[0], bad->n_ids[0]);
  /* ids that are no token are skipped */
  int32_t odd[] = {-5, 1 << 30, 3000, 5};
  check_stream(tk[0], "gpt2/out-of-range ids", odd, 4);
}

static void test_byte_tokenizer(ct_tokenizer *t) {
  CHECK(ct_tokenizer_vocab_size(t) == 257 && ct_tokenizer_eot_id(t) == 256);
  CHECK(strcmp(ct_tokenizer_digest(t), "byte") == 0);
  uint8_t text[512];
  for (int i = 0; i < 512; i++) text[i] = (uint8_t)(i * 37 + 11); /* every byte value, invalid UTF-8 too */
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(ct_tokenizer_encode(t, (const char *)text, sizeof text, &ids, &n) == CT_OK && n == sizeof text);
  bool same = true;
  for (size_t i = 0; i < n; i++) same &= ids[i] == text[i];
  CHECK(same);
  ids[7] = CT_BYTE_EOT; /* skipped on decode */
  char *out = NULL;
  size_t len = 0;
  CHECK(ct_tokenizer_decode(t, ids, n, &out, &len) == CT_OK && len == n - 1);
  CHECK(out && memcmp(out, text, 7) == 0 && memcmp(out + 7, text + 8, n - 8) == 0 && out[len] == '\0');
  free(out), free(ids);
  CHECK(ct_tokenizer_encode(t, "", 0, &ids, &n) == CT_OK && ids != NULL && n == 0);
  free(ids);
}

/* Random bytes never crash; the output decodes to valid UTF-8, and for GPT-2 (no normalizer)
 * decode(encode(x)) == x whenever x is valid UTF-8. */
static void test_random_bytes(ct_tokenizer *tk[2]) {
  ct_rng rng = {42, 0};
  int failures = 0, valid_inputs = 0;
  for (int r = 0; r < 300; r++) {
    size_t len = (size_t)(ct_rng_u64(&rng) % 96);
    char buf[96];
    for (size_t i = 0; i < len; i++) {
      uint64_t v = ct_rng_u64(&rng);
      /* mostly high bytes and separators, to hit the UTF-8 edge cases often */
      buf[i] = (char)(v % 4 == 0 ? " a<|\n"[v / 4 % 5] : (int)(0x80 + (v >> 8) % 0x80));
    }
    bool valid = valid_utf8(buf, len);
    valid_inputs += valid;
    for (int k = 0; k < 2; k++) {
      int32_t *ids = NULL;
      size_t n = 0;
      char *out = NULL;
      size_t olen = 0;
      if (ct_tokenizer_encode(tk[k], buf, len, &ids, &n) != CT_OK ||
          ct_tokenizer_decode(tk[k], ids, n, &out, &olen) != CT_OK || !valid_utf8(out, olen) ||
          (k == 0 && valid && (olen != len || memcmp(out, buf, len) != 0)))
        failures++;
      free(ids), free(out);
    }
  }
  CHECK_MSG(failures == 0, "%d random byte strings failed (%d of 300 were valid UTF-8)", failures, valid_inputs);

  /* large pathological inputs: a 1 MB run of spaces, a 1 MB word, a 1 MB run of invalid bytes */
  size_t big = 1 << 20;
  char *b = malloc(big);
  const char fill[3] = {' ', 'a', (char)0xFF};
  for (int f = 0; f < 3; f++) {
    memset(b, fill[f], big);
    int32_t *ids = NULL;
    size_t n = 0;
    double t0 = ct_now();
    ct_status st = ct_tokenizer_encode(tk[0], b, big, &ids, &n);
    CHECK_MSG(st == CT_OK && n > 0, "1 MB of 0x%02x: %s", (uint8_t)fill[f], ct_last_error());
    char *out = NULL;
    size_t olen = 0;
    if (st == CT_OK) CHECK(ct_tokenizer_decode(tk[0], ids, n, &out, &olen) == CT_OK && olen == (f == 2 ? 3 * big : big));
    printf("1 MB of 0x%02x: %zu ids in %.3f s\n", (uint8_t)fill[f], n, ct_now() - t0);
    free(ids), free(out);
  }
  free(b);
}

typedef struct thread_arg {
  ct_tokenizer *t;
  int which, mismatches;
} thread_arg;

static void *encode_all(void *p) {
  thread_arg *a = p;
  for (int rep = 0; rep < 20; rep++)
    for (int i = 0; i < n_samples; i++) {
      int32_t *ids = NULL;
      size_t n = 0;
      const sample *s = &samples[i];
      if (ct_tokenizer_encode(a->t, (const char *)s->input, s->input_len, &ids, &n) != CT_OK || n != s->n_ids[a->which] ||
          memcmp(ids, s->ids[a->which], sizeof *ids * n) != 0)
        a->mismatches++;
      free(ids);
    }
  return NULL;
}

/* One tokenizer shared by threads (the word cache is the only shared mutable state). */
static void test_threads(ct_tokenizer *t, int which) {
  pthread_t th[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){t, which, 0};
    pthread_create(&th[i], NULL, encode_all, &args[i]);
  }
  int bad = 0;
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL), bad += args[i].mismatches;
  CHECK_MSG(bad == 0, "%s: %d mismatches when encoding from 4 threads", tok_names[which], bad);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  fputs(text, f);
  fclose(f);
}

static void expect_load_error(const char *spec, const char *want1, const char *want2) {
  ct_tokenizer *t = (ct_tokenizer *)1;
  ct_status st = ct_tokenizer_load(spec, &t);
  CHECK_MSG(st == CT_ERR_INPUT && t == NULL, "%s: status %s", spec, ct_status_str(st));
  CHECK_MSG(contains(ct_last_error(), want1) && (!want2 || contains(ct_last_error(), want2)),
            "message for %s: \"%s\" (wanted \"%s\"%s%s)", spec, ct_last_error(), want1, want2 ? " and " : "",
            want2 ? want2 : "");
}

static void test_load_errors(void) {
  char p[2200], d[2200];
  snprintf(p, sizeof p, "%s/nope/tokenizer.json", tmpdir);
  expect_load_error(p, p, "No such file");
  snprintf(d, sizeof d, "%s/emptydir", tmpdir);
  mkdir(d, 0777);
  snprintf(p, sizeof p, "%s/emptydir/tokenizer.json", tmpdir);
  expect_load_error(d, p, NULL); /* a directory without tokenizer.json names the file it looked for */

  const struct { const char *name, *json, *want; } cases[] = {
      {"notjson.json", "this is not json {", "not valid JSON"},
      {"array.json", "[1, 2]", "not a JSON object"},
      {"nomodel.json", "{\"added_tokens\": []}", "missing \"model\""},
      {"wordpiece.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "\"WordPiece\""},
      {"novocab.json", "{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "missing model.vocab"},
      {"badmerge.json",
       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\", \"a c\"]},"
       " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
       "model.merges[1]"},
      {"badmerged.json",
       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}",
       "merged token \"ab\""},
      {"metaspace.json",
       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\"}}",
       "\"Metaspace\""},
      {"badregex.json",
       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Sequence\","
       " \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"},"
       " {\"type\": \"ByteLevel\"}]}}",
       "pretokenizers[0]: regex does not compile"},
      {"lowercase.json",
       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"Lowercase\"}}",
       "\"Lowercase\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(p, sizeof p, "%s/%s", tmpdir, cases[i].name);
    write_file(p, cases[i].json);
    expect_load_error(p, p, cases[i].want);
  }
  /* the "a c" merge names the missing token */
  snprintf(p, sizeof p, "%s/badmerge.json", tmpdir);
  expect_load_error(p, "token \"c\" is not in model.vocab", NULL);
}

/* A Split with a literal String pattern in front of the Qwen pre-tokenizer: encoding a text
 * equals encoding, with the unchanged tokenizer, each piece of it cut around the literal. */
static void test_split_string(ct_tokenizer *qwen) {
  char path[2300], *json;
  tok_path(path, sizeof path, 1);
  CHECK(ct_read_file(path, &json, NULL) == CT_OK);
  cJSON *root = cJSON_Parse(json);
  free(json);
  cJSON *list = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "pre_tokenizer"), "pretokenizers");
  cJSON *split = cJSON_Parse("{\"type\": \"Split\", \"pattern\": {\"String\": \"e.\"}, \"behavior\": \"Isolated\","
                             " \"invert\": false}");
  cJSON_InsertItemInArray(list, 0, split);
  char *text = cJSON_PrintUnformatted(root);
  snprintf(path, sizeof path, "%s/split_string.json", tmpdir);
  write_file(path, text);
  free(text);
  cJSON_Delete(root);
  ct_tokenizer *v = NULL;
  CHECK_MSG(ct_tokenizer_load(path, &v) == CT_OK, "%s", ct_last_error());
  if (!v) return;
  const char *in = "The deer ate. Here we are: three e.e. cummings poems, e.g. this one.e.";
  int32_t *ids = NULL, *part = NULL, want[256];
  size_t n = 0, k = 0, nw = 0;
  CHECK(ct_tokenizer_encode(v, in, strlen(in), &ids, &n) == CT_OK);
  for (const char *p = in, *q; *p; p = q) { /* pieces: text up to "e.", then "e." itself */
    const char *hit = strstr(p, "e.");
    q = hit == p ? p + 2 : hit ? hit : p + strlen(p);
    CHECK(ct_tokenizer_encode(qwen, p, (size_t)(q - p), &part, &k) == CT_OK);
    for (size_t i = 0; i < k && nw < 256; i++) want[nw++] = part[i];
    free(part);
  }
  CHECK_MSG(n == nw && memcmp(ids, want, sizeof *ids * n) == 0, "Split String: %zu ids, want %zu", n, nw);
  free(ids);
  ct_tokenizer_destroy(v);
}

static void test_sha256(void) {
  const struct { const char *msg, *hex; } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  char hex[65];
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
    ct_sha256_hex(v[i].msg, strlen(v[i].msg), hex);
    CHECK_MSG(strcmp(hex, v[i].hex) == 0, "sha256(\"%s\") = %s", v[i].msg, hex);
  }
  /* one million 'a', fed in uneven pieces through the streaming interface */
  static char a[1000000];
  memset(a, 'a', sizeof a);
  ct_sha256_ctx c;
  ct_sha256_init(&c);
  for (size_t off = 0, step = 1; off < sizeof a; off += step, step = step * 3 % 1000 + 1)
    ct_sha256_update(&c, a + off, off + step <= sizeof a ? step : sizeof a - off);
  uint8_t d[32];
  ct_sha256_final(&c, d);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
  CHECK_MSG(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0, "sha256(1M 'a') = %s", hex);
}

/* Encodes the fortunes corpus file by file with the GPT-2 tokenizer; prints MB/s. */
static void speed(ct_tokenizer *t) {
  const char *dir = "/usr/share/games/fortunes";
  DIR *d = opendir(dir);
  if (!d) {
    printf("speed: %s not found, skipped\n", dir);
    return;
  }
  char **texts = NULL;
  size_t *lens = NULL, n = 0, bytes = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (e->d_name[0] == '.' || (l > 4 && strcmp(e->d_name + l - 4, ".dat") == 0) || (l > 3 && strcmp(e->d_name + l - 3, ".u8") == 0))
      continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    texts = realloc(texts, sizeof *texts * (n + 1));
    lens = realloc(lens, sizeof *lens * (n + 1));
    if (ct_read_file(p, &texts[n], &lens[n]) == CT_OK) bytes += lens[n++];
  }
  closedir(d);
  size_t tokens = 0;
  double t0 = ct_now();
  for (size_t i = 0; i < n; i++) {
    int32_t *ids = NULL;
    size_t k = 0;
    CHECK(ct_tokenizer_encode(t, texts[i], lens[i], &ids, &k) == CT_OK);
    tokens += k;
    free(ids);
  }
  double dt = ct_now() - t0;
  printf("speed: gpt2 encode of the fortunes corpus: %.2f MB, %zu tokens (%.2f bytes/token) in %.3f s: %.1f MB/s\n",
         bytes / 1e6, tokens, (double)bytes / (double)(tokens ? tokens : 1), dt, bytes / 1e6 / dt);
  for (size_t i = 0; i < n; i++) free(texts[i]);
  free(texts), free(lens);
}

int main(void) {
  const char *root = getenv("CT_SOURCE_ROOT");
  if (root && *root) snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures/tokenizers", root);
  else { /* run by hand: the fixtures relative to this source file */
    char src[1024];
    snprintf(src, sizeof src, "%s", __FILE__);
    char *slash = strrchr(src, '/');
    if (slash) *slash = '\0';
    snprintf(fixtures, sizeof fixtures, "%s/../fixtures/tokenizers", slash ? src : ".");
  }
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/ct_test_tok_XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_sha256();
  if (!load_expected()) {
    fprintf(stderr, "cannot read the fixtures under %s (set CT_SOURCE_ROOT)\n", fixtures);
    return 1;
  }

  ct_tokenizer *tk[2] = {NULL, NULL}, *byte = NULL;
  const int64_t want_vocab[2] = {2002, 2001};
  for (int k = 0; k < 2; k++) {
    char path[2300], hex[65], dir[2300];
    tok_path(path, sizeof path, k);
    ct_status st = ct_tokenizer_load(path, &tk[k]);
    CHECK_MSG(st == CT_OK, "%s", ct_last_error());
    if (st != CT_OK) return ct_test_finish();
    CHECK(ct_tokenizer_vocab_size(tk[k]) == want_vocab[k]);
    CHECK(ct_tokenizer_eot_id(tk[k]) == 0); /* <|endoftext|> is the first special token in both */
    char *json;
    size_t len;
    CHECK(ct_read_file(path, &json, &len) == CT_OK);
    ct_sha256_hex(json, len, hex);
    free(json);
    CHECK(strncmp(ct_tokenizer_digest(tk[k]), "sha256:", 7) == 0 && strcmp(ct_tokenizer_digest(tk[k]) + 7, hex) == 0);
    /* the directory loads the same file */
    snprintf(dir, sizeof dir, "%s/%s", fixtures, tok_names[k]);
    ct_tokenizer *again = NULL;
    CHECK(ct_tokenizer_load(dir, &again) == CT_OK && strcmp(ct_tokenizer_digest(again), ct_tokenizer_digest(tk[k])) == 0);
    ct_tokenizer_destroy(again);
    test_against_library(k, tk[k]);
    /* twice: the second pass runs from the word cache */
    test_against_library(k, tk[k]);
  }
  CHECK(strcmp(ct_tokenizer_digest(tk[0]), ct_tokenizer_digest(tk[1])) != 0);
  CHECK_MSG(pieces_checked >= 100, "only %d samples had pre-tokens to compare", pieces_checked);
  CHECK(ct_tokenizer_load("byte", &byte) == CT_OK);
  test_byte_tokenizer(byte);
  test_streaming(tk, byte);
  test_random_bytes(tk);
  for (int k = 0; k < 2; k++) test_threads(tk[k], k);
  test_load_errors();
  test_split_string(tk[1]);
  speed(tk[0]);

  for (int k = 0; k < 2; k++) ct_tokenizer_destroy(tk[k]);
  ct_tokenizer_destroy(byte);
  char cmd[1100];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return ct_test_finish();
}
