/* tests/unit/test_safetensors.c — the safetensors reader, writer and conversions.
 *
 *   - a table of bad files, each refused with CT_ERR_INPUT and its own message (which must
 *     also name the file, and the tensor where there is one);
 *   - write -> read round trips for F32, F16 and BF16 (with a scalar, an empty tensor, the
 *     fill callback and metadata), header padding to 8 bytes, lookups by name;
 *   - sharded sets through model.safetensors.index.json, and index mismatches refused;
 *   - fp16 / bf16 conversions: every fp16 value decoded against a formula, every value
 *     round-tripping, fixed edge cases (inf, NaN, signed zero, subnormals, rounding ties,
 *     overflow), and 4M random floats against a nearest-value reference.
 * Files go to a fresh $TMPDIR directory that is removed at the end. */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "common/util.h"
#include "tests/unit/ct_test.h"
#include "trainer/safetensors.h"

static char tmpdir[512];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(p);
}

/* Writes: 8-byte length (declared, or the header's own length when declared < 0), header,
 * then data_len bytes of 0x5a. */
static void write_raw(const char *path, const char *header, long long declared, size_t data_len) {
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); exit(1); }
  uint64_t n = declared < 0 ? strlen(header) : (uint64_t)declared;
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
  fwrite(len8, 1, 8, f);
  fwrite(header, 1, strlen(header), f);
  for (size_t i = 0; i < data_len; i++) fputc(0x5a, f);
  fclose(f);
}

/* ---- bad files ---- */

#define T4(name, off) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":" off "}"

typedef struct bad_case {
  const char *what;
  const char *header;
  long long declared;     /* -1: the header's length */
  size_t data;            /* data buffer bytes */
  const char *expect;     /* substring of the message */
  const char *tensor;     /* the message must name it (NULL: no tensor involved) */
} bad_case;

static const bad_case BAD_CASES[] = {
  {"absurd header length", "{}", 200000000, 0, "exceeds the 100000000-byte limit", NULL},
  {"truncated header", "{\"a\":{}}", 4000, 0, "runs past the end of the file", NULL},
  {"not JSON", "{\"a\": {\"dtype\": ", -1, 0, "not valid JSON", NULL},
  {"data after JSON", "{} x", -1, 0, "data after the JSON value", NULL},
  {"not an object", "[1, 2, 3]", -1, 0, "header is not a JSON object", NULL},
  {"entry not an object", "{\"w\": 5}", -1, 0, "entry is not a JSON object", "w"},
  {"empty name", "{" T4("", "[0,4]") "}", -1, 4, "empty name", NULL},
  {"missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "missing \"dtype\"", "w"},
  {"dtype not a string", "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
   "dtype is not a string", "w"},
  {"unknown dtype", "{\"w\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
   "unknown dtype \"F17\"", "w"},
  {"lower-case dtype", "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
   "unknown dtype \"f32\"", "w"},
  {"missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", -1, 4, "missing \"shape\"", "w"},
  {"shape not an array", "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", -1, 4,
   "shape is not an array", "w"},
  {"negative shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", -1, 4,
   "shape[1] is not a non-negative integer", "w"},
  {"non-integer shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", -1, 4,
   "shape[0] is not a non-negative integer", "w"},
  {"string in shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", -1, 4,
   "shape[0] is not a non-negative integer", "w"},
  {"too many dimensions", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
   -1, 4, "9 dimensions", "w"},
  {"missing data_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", -1, 4, "missing \"data_offsets\"", "w"},
  {"one offset", "{" T4("w", "[0]") "}", -1, 4, "data_offsets must be [begin, end]", "w"},
  {"negative offset", "{" T4("w", "[-4,0]") "}", -1, 4, "data_offsets must be [begin, end]", "w"},
  {"begin after end", "{" T4("w", "[8,4]") "}", -1, 8, "begin after end", "w"},
  {"offsets out of range", "{" T4("w", "[0,8]") "}", -1, 4, "run past the end of the 4-byte data buffer", "w"},
  {"element count overflow",
   "{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", -1, 0,
   "more elements than a file can hold", "w"},
  {"size mismatch with shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1, 8,
   "span 8 bytes but shape [3] of F32 needs 12", "w"},
  {"bf16 size mismatch", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", -1, 16,
   "shape [2, 2] of BF16 needs 8", "w"},
  {"overlap", "{" T4("a", "[0,4]") "," T4("b", "[2,6]") "," T4("c", "[6,10]") "}", -1, 10, "overlaps", "b"},
  {"gap", "{" T4("a", "[0,4]") "," T4("b", "[8,12]") "}", -1, 12, "gap in the data buffer: bytes [4, 8)", "b"},
  {"gap at the start", "{" T4("a", "[4,8]") "}", -1, 8, "gap in the data buffer: bytes [0, 4)", "a"},
  {"buffer not covered", "{" T4("a", "[0,4]") "}", -1, 12, "not fully covered: tensors end at byte 4 of 12", NULL},
  {"duplicate name", "{" T4("a", "[0,4]") "," T4("a", "[4,8]") "}", -1, 8, "duplicate tensor name", "a"},
  {"metadata not an object", "{\"__metadata__\":[1]," T4("a", "[0,4]") "}", -1, 4,
   "__metadata__ is not a JSON object", NULL},
  {"metadata value not a string", "{\"__metadata__\":{\"format\":1}," T4("a", "[0,4]") "}", -1, 4,
   "__metadata__: value of \"format\" is not a string", NULL},
  {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", -1, 0, "__metadata__ appears twice", NULL},
};

static void test_bad_files(void) {
  char path[700];
  const size_t n = sizeof BAD_CASES / sizeof BAD_CASES[0];
  for (size_t i = 0; i < n; i++) {
    const bad_case *b = &BAD_CASES[i];
    snprintf(path, sizeof path, "%s/bad_%02zu.safetensors", tmpdir, i);
    write_raw(path, b->header, b->declared, b->data);
    ct_st_file *f = NULL;
    ct_clear_error();
    ct_status st = ct_st_open(path, &f);
    const char *msg = ct_last_error();
    CHECK_MSG(st == CT_ERR_INPUT && !f, "%s: status %d", b->what, (int)st);
    CHECK_MSG(strstr(msg, b->expect) != NULL, "%s: message \"%s\" lacks \"%s\"", b->what, msg, b->expect);
    CHECK_MSG(strstr(msg, path) != NULL, "%s: message \"%s\" does not name the file", b->what, msg);
    if (b->tensor) {
      char quoted[64];
      snprintf(quoted, sizeof quoted, "\"%s\"", b->tensor);
      CHECK_MSG(strstr(msg, quoted) != NULL, "%s: message \"%s\" does not name tensor %s", b->what,
                msg, quoted);
    }
    ct_st_close(f);
  }
  /* every message differs from every other (one problem, one message) */
  char *msgs[64];
  for (size_t i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/bad_%02zu.safetensors", tmpdir, i);
    ct_st_file *f = NULL;
    ct_st_open(path, &f);
    /* drop the path prefix so that only the problem is compared */
    const char *m = ct_last_error(), *tail = strstr(m, ".safetensors: ");
    msgs[i] = ct_strdup(tail ? tail + 14 : m);
  }
  int same = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (!strcmp(msgs[i], msgs[j]) && strcmp(BAD_CASES[i].expect, BAD_CASES[j].expect)) same++;
  CHECK_MSG(same == 0, "%d pairs of different problems share a message", same);
  for (size_t i = 0; i < n; i++) free(msgs[i]);

  /* a file shorter than the length field; a missing file; a directory */
  snprintf(path, sizeof path, "%s/short.safetensors", tmpdir);
  FILE *fp = fopen(path, "wb");
  fwrite("\x02\x00\x00", 1, 3, fp);
  fclose(fp);
  ct_st_file *f = NULL;
  CHECK(ct_st_open(path, &f) == CT_ERR_INPUT && strstr(ct_last_error(), "too short for the 8-byte header length"));
  snprintf(path, sizeof path, "%s/none.safetensors", tmpdir);
  CHECK(ct_st_open(path, &f) == CT_ERR_INPUT && strstr(ct_last_error(), "cannot open"));
  CHECK(ct_st_open(tmpdir, &f) == CT_ERR_INPUT && strstr(ct_last_error(), "not a regular file"));

  /* accepted corner cases: whitespace padding, zero tensors, zero-size tensors anywhere,
   * unknown extra fields in an entry (the reference implementation ignores them) */
  snprintf(path, sizeof path, "%s/ok_empty.safetensors", tmpdir);
  write_raw(path, "{}      ", -1, 0);
  CHECK(ct_st_open(path, &f) == CT_OK && ct_st_n_tensors(f) == 0);
  ct_st_close(f);
  snprintf(path, sizeof path, "%s/ok_zero.safetensors", tmpdir);
  write_raw(path, "{\"z\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[4,4]}," T4("a", "[0,4]")
            ",\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[4,5],\"extra\":1}}", -1, 5);
  CHECK_MSG(ct_st_open(path, &f) == CT_OK, "%s", ct_last_error());
  if (f) {
    CHECK(ct_st_n_tensors(f) == 3);
    const ct_st_tensor *s = ct_st_find(f, "s"), *z = ct_st_find(f, "z");
    CHECK(s && s->ndim == 0 && s->numel == 1 && s->dtype == CT_ST_U8);
    CHECK(z && z->ndim == 2 && z->numel == 0 && z->shape[1] == 3);
    float v;
    CHECK(ct_st_read_f32(f, s, &v) == CT_ERR_INPUT && strstr(ct_last_error(), "dtype U8"));
    ct_st_close(f);
  }
}

/* ---- round trips ---- */

static float rt(ct_st_dtype d, float x) {
  if (d == CT_ST_BF16) return ct_st_bf16_to_f32(ct_st_f32_to_bf16(x));
  if (d == CT_ST_F16) return ct_st_f16_to_f32(ct_st_f32_to_f16(x));
  return x;
}

static void fill_ramp(void *user, int i, float *dst) {
  (void)user;
  for (int j = 0; j < 300; j++) dst[j] = (float)(i * 1000 + j) * 0.01f - 1.0f;
}

static bool bits_equal(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

static void test_round_trip(void) {
  enum { N = 5 * 7 };
  float w[N], big[70000], scalar = 3.25f, got[70000], want[70000];
  ct_rng rng = {42, 0};
  for (int i = 0; i < N; i++) w[i] = ct_rng_normal(&rng) * 10.0f;
  w[0] = 1.0f / 3.0f; w[1] = -0.0f; w[2] = 65504.0f; w[3] = 1e-7f;
  for (int i = 0; i < 70000; i++) big[i] = ct_rng_normal(&rng); /* > one conversion chunk */
  const ct_st_dtype dts[3] = {CT_ST_F32, CT_ST_F16, CT_ST_BF16};
  char path[700];
  for (int d = 0; d < 3; d++) {
    const ct_st_dtype dt = dts[d];
    ct_st_out outs[5] = {
      {"layers.0.w", dt, 2, {5, 7}, w},
      {"scalar", dt, 0, {0}, &scalar},
      {"empty", dt, 1, {0}, w},
      {"ramp", dt, 2, {3, 100}, NULL}, /* from the fill callback */
      {"big \"quoted\"\\name", dt, 1, {70000}, big},
    };
    const char *meta[] = {"format", "pt", "note", "line\nbreak \"q\""};
    snprintf(path, sizeof path, "%s/rt_%s.safetensors", tmpdir, ct_st_dtype_name(dt));
    ct_status st = ct_st_write(path, outs, 5, meta, 2, fill_ramp, NULL);
    CHECK_MSG(st == CT_OK, "write %s: %s", path, ct_last_error());
    FILE *fp = fopen(path, "rb");
    unsigned char len8[8] = {0};
    CHECK(fp && fread(len8, 1, 8, fp) == 8);
    if (fp) fclose(fp);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
    CHECK_MSG((8 + hl) % 8 == 0, "header length %llu: data not 8-byte aligned", (unsigned long long)hl);

    ct_st_file *f = NULL;
    st = ct_st_open(path, &f);
    CHECK_MSG(st == CT_OK, "open %s: %s", path, ct_last_error());
    if (!f) continue;
    CHECK(ct_st_n_tensors(f) == 5);
    for (int i = 1; i < ct_st_n_tensors(f); i++)
      CHECK(strcmp(ct_st_tensor_at(f, i - 1)->name, ct_st_tensor_at(f, i)->name) < 0);
    CHECK(ct_st_metadata(f, "format") && !strcmp(ct_st_metadata(f, "format"), "pt"));
    CHECK(ct_st_metadata(f, "note") && !strcmp(ct_st_metadata(f, "note"), "line\nbreak \"q\""));
    CHECK(ct_st_metadata(f, "missing") == NULL);
    CHECK(ct_st_find(f, "nope") == NULL);
    for (int k = 0; k < 5; k++) {
      const ct_st_tensor *t = ct_st_find(f, outs[k].name);
      CHECK_MSG(t != NULL, "%s missing", outs[k].name);
      if (!t) continue;
      CHECK(t->dtype == dt && t->ndim == outs[k].ndim);
      for (int q = 0; q < t->ndim; q++) CHECK(t->shape[q] == outs[k].shape[q]);
      size_t n = (size_t)t->numel;
      if (outs[k].data) for (size_t j = 0; j < n; j++) want[j] = rt(dt, outs[k].data[j]);
      else { fill_ramp(NULL, k, want); for (size_t j = 0; j < n; j++) want[j] = rt(dt, want[j]); }
      memset(got, 0xff, sizeof got);
      CHECK_MSG(ct_st_read_f32(f, t, got) == CT_OK, "%s", ct_last_error());
      CHECK_MSG(bits_equal(got, want, n), "%s %s: values differ after the round trip",
                ct_st_dtype_name(dt), t->name);
      CHECK(n == 70000 || got[n] != got[n]); /* nothing written past numel (0xffffffff is NaN) */
    }
    ct_st_close(f);
  }
  /* the writer refuses what it cannot write */
  ct_st_out dup[2] = {{"a", CT_ST_F32, 1, {1}, w}, {"a", CT_ST_F32, 1, {1}, w}};
  snprintf(path, sizeof path, "%s/dup.safetensors", tmpdir);
  CHECK(ct_st_write(path, dup, 2, NULL, 0, NULL, NULL) == CT_ERR_INPUT && strstr(ct_last_error(), "given twice"));
  ct_st_out i64[1] = {{"a", CT_ST_I64, 1, {1}, w}};
  CHECK(ct_st_write(path, i64, 1, NULL, 0, NULL, NULL) == CT_ERR_INPUT && strstr(ct_last_error(), "I64"));
  CHECK(!ct_file_exists(path));
}

/* ---- sharded sets ---- */

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

static void test_sets(void) {
  char dir[700], p[800];
  snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
  ct_mkdirs(dir);
  float a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, c[3] = {7, 8, 9};
  ct_st_out s1[2] = {{"a", CT_ST_F32, 2, {2, 2}, a}, {"b", CT_ST_BF16, 1, {2}, b}};
  ct_st_out s2[1] = {{"c", CT_ST_F16, 1, {3}, c}};
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
  CHECK(ct_st_write(p, s1, 2, NULL, 0, NULL, NULL) == CT_OK);
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
  CHECK(ct_st_write(p, s2, 1, NULL, 0, NULL, NULL) == CT_OK);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  write_text(p, "{\"metadata\":{\"total_size\":30},\"weight_map\":{\"c\":\"model-00002-of-00002.safetensors\","
                "\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\"}}");
  ct_st_set *s = NULL;
  CHECK_MSG(ct_st_set_open(dir, &s) == CT_OK, "%s", ct_last_error());
  if (s) {
    CHECK(ct_st_set_n_tensors(s) == 3 && ct_st_set_n_files(s) == 2);
    const char *names[3] = {"a", "b", "c"};
    const float *vals[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
      const ct_st_tensor *t = ct_st_set_find(s, names[i]);
      CHECK(t && t == ct_st_set_tensor(s, i));
      float got[4] = {0};
      CHECK(t && ct_st_set_read_f32(s, t, got) == CT_OK && bits_equal(got, vals[i], (size_t)t->numel));
    }
    CHECK(ct_st_set_find(s, "d") == NULL);
    ct_st_set_close(s);
  }
  /* index mismatches */
  const struct { const char *index, *expect; } bad[] = {
    {"{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}",
     "holds tensor \"b\", which"},
    {"{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\","
     "\"c\":\"model-00001-of-00002.safetensors\"}}", "puts tensor \"c\" in"},
    {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "same directory"},
    {"{\"weight_map\":{\"a\":\"missing.safetensors\"}}", "cannot open"},
    {"{\"weights\":{}}", "no \"weight_map\""},
    {"{\"weight_map\":{\"a\":1}}", "is not a file name"},
    {"not json", "not valid JSON"},
  };
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_text(p, bad[i].index);
    s = NULL;
    ct_status st = ct_st_set_open(dir, &s);
    CHECK_MSG(st == CT_ERR_INPUT && !s && strstr(ct_last_error(), bad[i].expect),
              "index %zu: status %d, message \"%s\" (want \"%s\")", i, (int)st, ct_last_error(), bad[i].expect);
    ct_st_set_close(s);
  }
  /* a single file opens as a set of one; an empty directory names what it looked for */
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
  CHECK(ct_st_set_open(p, &s) == CT_OK && ct_st_set_n_tensors(s) == 2);
  ct_st_set_close(s);
  snprintf(p, sizeof p, "%s/emptydir", tmpdir);
  ct_mkdirs(p);
  s = NULL;
  CHECK(ct_st_set_open(p, &s) == CT_ERR_INPUT && strstr(ct_last_error(), "no model.safetensors"));
}

/* ---- conversions ---- */

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Reference fp16 decode from the definition. */
static double f16_value(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

/* Reference nearest-even rounding: candidates lo (truncation) and lo + 1 compared in double. */
static uint16_t ref_f32_to_bf16(float x) {
  uint32_t u = fbits(x);
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  double dl = fabs((double)x - (double)ct_st_bf16_to_f32(lo));
  if ((hi & 0x7fff) == 0x7f80) { /* the next step up is inf: halfway point is 2^128 - 2^119 */
    double mid = ldexp(1.0, 128) - ldexp(1.0, 119);
    return fabs((double)x) >= mid ? hi : lo;
  }
  double dh = fabs((double)x - (double)ct_st_bf16_to_f32(hi));
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

static double F16_VALS[0x7c00]; /* all finite non-negative halves, increasing */

static uint16_t ref_f32_to_f16(float x) {
  uint16_t sign = fbits(x) >> 31 ? 0x8000 : 0;
  double a = fabs((double)x);
  if (a >= 65520.0) return sign | 0x7c00;
  int lo = 0, hi = 0x7bff; /* largest index with value <= a */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (F16_VALS[mid] <= a) lo = mid;
    else hi = mid - 1;
  }
  if (lo == 0x7bff) return sign | 0x7bff;
  double dl = a - F16_VALS[lo], dh = F16_VALS[lo + 1] - a;
  int r = dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1 ? lo + 1 : lo);
  return sign | (uint16_t)r;
}

static void test_conversions(void) {
  /* every half: decode matches the definition, encode(decode(h)) == h except NaN */
  int bad_dec = 0, bad_rt = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = ct_st_f16_to_f32((uint16_t)h);
    int e = (h >> 10) & 31;
    if (e == 31) {
      if ((h & 1023) ? !isnan(f) : !(isinf(f) && (f < 0) == (h >> 15))) bad_dec++;
      if (!(h & 1023) && ct_st_f32_to_f16(f) != h) bad_rt++;
      if ((h & 1023) && (ct_st_f32_to_f16(f) & 0x7c00) != 0x7c00) bad_rt++;
      continue;
    }
    if ((double)f != f16_value((uint16_t)h) || (fbits(f) >> 31) != (h >> 15)) bad_dec++;
    if (ct_st_f32_to_f16(f) != h) bad_rt++;
    if (h < 0x7c00) F16_VALS[h] = f16_value((uint16_t)h);
  }
  CHECK_MSG(bad_dec == 0, "%d fp16 values decode wrongly", bad_dec);
  CHECK_MSG(bad_rt == 0, "%d fp16 values do not survive fp16 -> fp32 -> fp16", bad_rt);
  /* every bf16 value survives bf16 -> fp32 -> bf16 (NaN stays NaN) */
  int bad_b = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = ct_st_bf16_to_f32((uint16_t)h);
    uint16_t back = ct_st_f32_to_bf16(f);
    if (isnan(f) ? !isnan(ct_st_bf16_to_f32(back)) : back != h) bad_b++;
  }
  CHECK_MSG(bad_b == 0, "%d bf16 values do not survive bf16 -> fp32 -> bf16", bad_b);

  /* fixed edge cases */
  const struct { uint32_t in; uint16_t bf16, f16; const char *what; } E[] = {
    {0x3f800000, 0x3f80, 0x3c00, "1"},
    {0x80000000, 0x8000, 0x8000, "-0"},
    {0x7f800000, 0x7f80, 0x7c00, "inf"},
    {0xff800000, 0xff80, 0xfc00, "-inf"},
    {0x7f7fffff, 0x7f80, 0x7c00, "FLT_MAX overflows"},
    {0x3f808000, 0x3f80, 0x3c04, "1 + 2^-8: bf16 tie -> even (down)"},
    {0x3f818000, 0x3f82, 0x3c0c, "1 + 3*2^-8: bf16 tie -> even (up)"},
    {0x3f808001, 0x3f81, 0x3c04, "just above a bf16 tie"},
    {0x3f801000, 0x3f80, 0x3c00, "1 + 2^-11: f16 tie -> even (down)"},
    {0x3f803000, 0x3f80, 0x3c02, "1 + 3*2^-11: f16 tie -> even (up)"},
    {0x3fffffff, 0x4000, 0x4000, "2 - 2^-23: carry into the exponent"},
    {0x477fe000, 0x4780, 0x7bff, "65504 = fp16 max"},
    {0x477fefff, 0x4780, 0x7bff, "just below 65520"},
    {0x477ff000, 0x4780, 0x7c00, "65520 rounds to inf"},
    {0x33800000, 0x3380, 0x0001, "2^-24: smallest fp16 subnormal"},
    {0x33000000, 0x3300, 0x0000, "2^-25: tie -> 0"},
    {0x33000001, 0x3300, 0x0001, "just above 2^-25"},
    {0x33c00000, 0x33c0, 0x0002, "1.5*2^-24: tie -> 2"},
    {0x38800000, 0x3880, 0x0400, "2^-14: smallest fp16 normal"},
    {0x387fe000, 0x3880, 0x0400, "1023.5*2^-24: subnormal tie rounds up into the normals"},
    {0x387fc000, 0x3880, 0x03ff, "largest fp16 subnormal"},
    {0x00010000, 0x0001, 0x0000, "smallest bf16 subnormal"},
    {0x00008000, 0x0000, 0x0000, "half of it: tie -> 0"},
    {0x00018000, 0x0002, 0x0000, "1.5 of it: tie -> 2"},
    {0x80018000, 0x8002, 0x8000, "negative subnormal tie"},
    {0xc0490fdb, 0xc049, 0xc248, "-pi"},
  };
  for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
    float x = bitsf(E[i].in);
    uint16_t b = ct_st_f32_to_bf16(x), h = ct_st_f32_to_f16(x);
    CHECK_MSG(b == E[i].bf16, "%s: bf16 0x%04x, want 0x%04x", E[i].what, b, E[i].bf16);
    CHECK_MSG(h == E[i].f16, "%s: f16 0x%04x, want 0x%04x", E[i].what, h, E[i].f16);
  }
  /* NaN in, quiet NaN out, sign kept, for a signalling payload too */
  const uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fffffff};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    float x = bitsf(nans[i]);
    uint16_t b = ct_st_f32_to_bf16(x), h = ct_st_f32_to_f16(x);
    CHECK(isnan(ct_st_bf16_to_f32(b)) && (b >> 15) == (nans[i] >> 31) && (b & 0x0040));
    CHECK(isnan(ct_st_f16_to_f32(h)) && (h >> 15) == (nans[i] >> 31) && (h & 0x0200));
  }

  /* random floats against the nearest-value references */
  ct_rng rng = {7, 0};
  int bad_bf = 0, bad_h = 0;
  for (int i = 0; i < 4000000; i++) {
    uint32_t u = (uint32_t)ct_rng_u64(&rng);
    if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(97 + (ct_rng_u64(&rng) % 50)) << 23); /* f16 range */
    float x = bitsf(u);
    if (isnan(x)) continue;
    if (ct_st_f32_to_bf16(x) != ref_f32_to_bf16(x)) { if (bad_bf++ < 5) fprintf(stderr, "bf16 0x%08x\n", u); }
    if (ct_st_f32_to_f16(x) != ref_f32_to_f16(x)) { if (bad_h++ < 5) fprintf(stderr, "f16 0x%08x\n", u); }
  }
  CHECK_MSG(bad_bf == 0, "%d random floats round to bf16 differently from the reference", bad_bf);
  CHECK_MSG(bad_h == 0, "%d random floats round to f16 differently from the reference", bad_h);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/ct_st_XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
  test_bad_files();
  test_round_trip();
  test_sets();
  test_conversions();
  nftw(tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  return ct_test_finish();
}
