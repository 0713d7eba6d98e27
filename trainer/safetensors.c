/* trainer/safetensors.c — see safetensors.h for the format and the checks. */
#define _GNU_SOURCE
#include "trainer/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes little-endian data in place: big-endian hosts need byte swaps"
#endif

static const struct { const char *name; size_t size; } DTYPES[CT_ST_N_DTYPES] = {
  [CT_ST_BOOL] = {"BOOL", 1},       [CT_ST_U8] = {"U8", 1},   [CT_ST_I8] = {"I8", 1},
  [CT_ST_F8_E5M2] = {"F8_E5M2", 1}, [CT_ST_F8_E4M3] = {"F8_E4M3", 1},
  [CT_ST_I16] = {"I16", 2},         [CT_ST_U16] = {"U16", 2}, [CT_ST_F16] = {"F16", 2},
  [CT_ST_BF16] = {"BF16", 2},       [CT_ST_I32] = {"I32", 4}, [CT_ST_U32] = {"U32", 4},
  [CT_ST_F32] = {"F32", 4},         [CT_ST_F64] = {"F64", 8}, [CT_ST_I64] = {"I64", 8},
  [CT_ST_U64] = {"U64", 8},
};

const char *ct_st_dtype_name(ct_st_dtype d) { return (unsigned)d < CT_ST_N_DTYPES ? DTYPES[d].name : "?"; }
size_t ct_st_dtype_size(ct_st_dtype d) { return (unsigned)d < CT_ST_N_DTYPES ? DTYPES[d].size : 0; }

bool ct_st_dtype_parse(const char *s, ct_st_dtype *out) {
  for (int i = 0; i < CT_ST_N_DTYPES; i++)
    if (!strcmp(s, DTYPES[i].name)) { *out = (ct_st_dtype)i; return true; }
  return false;
}

/* ---------------------------------------------------------------- conversions */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float ct_st_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t ct_st_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  /* adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even; a carry out of
   * the mantissa bumps the exponent, and past the largest finite value that gives inf */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float ct_st_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf / NaN */
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    /* subnormal: mant * 2^-24, exact in fp32 */
    float v = (float)mant * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13)); /* rebias 15 -> 127 */
}

uint16_t ct_st_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((u >> 13) & 0x3ffu); /* quiet NaN */
  if (u >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 (halfway past 65504, odd): inf */
  if (u >= 0x38800000u) {                       /* normal half (>= 2^-14) */
    uint32_t h = ((u >> 23) - 112u) << 10 | ((u >> 13) & 0x3ffu), rest = u & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* carry may reach the exponent */
    return sign | (uint16_t)h;
  }
  if (u <= 0x33000000u) return sign; /* <= 2^-25: rounds to zero (2^-25 is a tie -> even 0) */
  /* subnormal half: value / 2^-24 = mant * 2^(e - 126) with the implicit bit */
  uint32_t e = u >> 23, mant = (u & 0x7fffffu) | 0x800000u, shift = 126u - e; /* 14..24 */
  uint32_t h = mant >> shift, rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u))) h++; /* 0x400 becomes the smallest normal */
  return sign | (uint16_t)h;
}

/* ---------------------------------------------------------------- reading */

struct ct_st_file {
  char *path;
  int fd;
  uint64_t data_start;     /* 8 + N */
  uint64_t data_len;
  ct_st_tensor *t;         /* (n) sorted by name */
  int n;
  char **meta;             /* (2 * n_meta) key, value */
  int n_meta;
};

#define BAD(...) ct_set_error(CT_ERR_INPUT, __VA_ARGS__)

/* A JSON number that is a non-negative integer representable exactly (< 2^53). */
static bool json_uint(const cJSON *x, uint64_t *out) {
  if (!cJSON_IsNumber(x)) return false;
  double v = x->valuedouble;
  if (!(v >= 0) || v != floor(v) || v > 9007199254740992.0) return false;
  *out = (uint64_t)v;
  return true;
}

static ct_status parse_entry(ct_st_file *f, const cJSON *e, ct_st_tensor *t) {
  const char *p = f->path, *name = t->name;
  if (!name[0]) return BAD("%s: a tensor has an empty name", p);
  if (!cJSON_IsObject(e)) return BAD("%s: tensor \"%s\": entry is not a JSON object", p, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!dt) return BAD("%s: tensor \"%s\": missing \"dtype\"", p, name);
  if (!cJSON_IsString(dt)) return BAD("%s: tensor \"%s\": dtype is not a string", p, name);
  if (!ct_st_dtype_parse(dt->valuestring, &t->dtype))
    return BAD("%s: tensor \"%s\": unknown dtype \"%.40s\"", p, name, dt->valuestring);
  if (!sh) return BAD("%s: tensor \"%s\": missing \"shape\"", p, name);
  if (!cJSON_IsArray(sh)) return BAD("%s: tensor \"%s\": shape is not an array", p, name);
  int nd = cJSON_GetArraySize(sh);
  if (nd > CT_ST_MAX_DIMS)
    return BAD("%s: tensor \"%s\": shape has %d dimensions (at most %d supported)", p, name, nd,
               CT_ST_MAX_DIMS);
  t->ndim = nd;
  const size_t esize = ct_st_dtype_size(t->dtype);
  uint64_t numel = 1, bytes_cap = UINT64_MAX / esize;
  bool overflow = false;
  for (int i = 0; i < nd; i++) {
    uint64_t d;
    if (!json_uint(cJSON_GetArrayItem(sh, i), &d))
      return BAD("%s: tensor \"%s\": shape[%d] is not a non-negative integer", p, name, i);
    t->shape[i] = (int64_t)d;
    if (d && numel > bytes_cap / d) overflow = true;
    else numel *= d;
  }
  if (!off) return BAD("%s: tensor \"%s\": missing \"data_offsets\"", p, name);
  uint64_t b, en;
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
      !json_uint(cJSON_GetArrayItem(off, 0), &b) || !json_uint(cJSON_GetArrayItem(off, 1), &en))
    return BAD("%s: tensor \"%s\": data_offsets must be [begin, end] with non-negative integers",
               p, name);
  if (b > en)
    return BAD("%s: tensor \"%s\": data_offsets [%llu, %llu] begin after end", p, name,
               (unsigned long long)b, (unsigned long long)en);
  if (en > f->data_len)
    return BAD("%s: tensor \"%s\": data_offsets [%llu, %llu] run past the end of the %llu-byte"
               " data buffer", p, name, (unsigned long long)b, (unsigned long long)en,
               (unsigned long long)f->data_len);
  if (overflow)
    return BAD("%s: tensor \"%s\": shape has more elements than a file can hold", p, name);
  if (en - b != numel * esize) {
    char dims[160] = "";
    size_t k = 0;
    for (int i = 0; i < nd && k < sizeof dims - 24; i++)
      k += (size_t)snprintf(dims + k, sizeof dims - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    return BAD("%s: tensor \"%s\": data_offsets span %llu bytes but shape [%s] of %s needs %llu",
               p, name, (unsigned long long)(en - b), dims, ct_st_dtype_name(t->dtype),
               (unsigned long long)(numel * esize));
  }
  t->numel = numel;
  t->begin = b;
  t->end = en;
  return CT_OK;
}

static ct_status parse_metadata(ct_st_file *f, const cJSON *m) {
  if (!cJSON_IsObject(m)) return BAD("%s: __metadata__ is not a JSON object", f->path);
  int n = cJSON_GetArraySize(m);
  f->meta = ct_calloc((size_t)(2 * n + 1), sizeof(char *), "safetensors metadata");
  if (!f->meta) return CT_ERR_NOMEM;
  for (const cJSON *kv = m->child; kv; kv = kv->next) {
    if (!cJSON_IsString(kv))
      return BAD("%s: __metadata__: value of \"%s\" is not a string", f->path, kv->string);
    f->meta[2 * f->n_meta] = ct_strdup(kv->string);
    f->meta[2 * f->n_meta + 1] = ct_strdup(kv->valuestring);
    f->n_meta++;
    if (!f->meta[2 * f->n_meta - 2] || !f->meta[2 * f->n_meta - 1]) return CT_ERR_NOMEM;
  }
  return CT_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const ct_st_tensor *)a)->name, ((const ct_st_tensor *)b)->name);
}

static int by_begin(const void *a, const void *b) {
  const ct_st_tensor *x = *(const ct_st_tensor *const *)a, *y = *(const ct_st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* Sorted by begin the tensors must tile [0, data_len): each starts where the previous ended. */
static ct_status check_layout(ct_st_file *f) {
  ct_status st = CT_OK;
  const ct_st_tensor **order = ct_malloc(sizeof *order * (size_t)(f->n ? f->n : 1), "layout check");
  if (!order) return CT_ERR_NOMEM;
  for (int i = 0; i < f->n; i++) order[i] = &f->t[i];
  qsort(order, (size_t)f->n, sizeof *order, by_begin);
  uint64_t at = 0;
  for (int i = 0; i < f->n && st == CT_OK; i++) {
    const ct_st_tensor *t = order[i];
    if (t->begin < at)
      st = BAD("%s: tensor \"%s\" (bytes [%llu, %llu)) overlaps tensor \"%s\" (bytes [%llu, %llu))",
               f->path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
               order[i - 1]->name, (unsigned long long)order[i - 1]->begin,
               (unsigned long long)order[i - 1]->end);
    else if (t->begin > at)
      st = BAD("%s: gap in the data buffer: bytes [%llu, %llu) before tensor \"%s\" belong to no"
               " tensor", f->path, (unsigned long long)at, (unsigned long long)t->begin, t->name);
    at = t->end;
  }
  if (st == CT_OK && at != f->data_len)
    st = BAD("%s: the data buffer is not fully covered: tensors end at byte %llu of %llu",
             f->path, (unsigned long long)at, (unsigned long long)f->data_len);
  free(order);
  return st;
}

static ct_status read_exact(int fd, void *buf, size_t n, uint64_t off, const char *path) {
  char *p = buf;
  while (n) {
    ssize_t got = pread(fd, p, n, (off_t)off);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ct_set_error(CT_ERR_IO, "%s: read failed at byte %llu: %s", path,
                                     (unsigned long long)off, strerror(errno));
    if (got == 0) return ct_set_error(CT_ERR_IO, "%s: file ends at byte %llu (truncated while"
                                      " open?)", path, (unsigned long long)off);
    p += got;
    n -= (size_t)got;
    off += (uint64_t)got;
  }
  return CT_OK;
}

static ct_status parse_header(ct_st_file *f, uint64_t file_size) {
  const char *p = f->path;
  if (file_size < 8)
    return BAD("%s: %llu bytes: too short for the 8-byte header length", p,
               (unsigned long long)file_size);
  unsigned char len8[8];
  CT_TRY(read_exact(f->fd, len8, 8, 0, p));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  if (n > CT_ST_MAX_HEADER)
    return BAD("%s: header length %llu exceeds the %llu-byte limit (not a safetensors file?)", p,
               (unsigned long long)n, CT_ST_MAX_HEADER);
  if (n > file_size - 8)
    return BAD("%s: header length %llu runs past the end of the file (%llu bytes follow the"
               " length): truncated header", p, (unsigned long long)n,
               (unsigned long long)(file_size - 8));
  f->data_start = 8 + n;
  f->data_len = file_size - 8 - n;
  char *text = ct_malloc((size_t)n + 1, "safetensors header");
  if (!text) return CT_ERR_NOMEM;
  ct_status st = read_exact(f->fd, text, (size_t)n, 8, p);
  cJSON *root = NULL;
  if (st != CT_OK) goto done;
  text[n] = '\0';
  const char *end = NULL;
  root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, false);
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    size_t pos = at && at >= text && at <= text + n ? (size_t)(at - text) : 0;
    st = BAD("%s: header is not valid JSON (error near byte %zu of %llu)", p, pos, (unsigned long long)n);
    goto done;
  }
  for (const char *q = end; q && q < text + n; q++)
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
      st = BAD("%s: header has data after the JSON value (byte %zu of %llu)", p,
               (size_t)(q - text), (unsigned long long)n);
      goto done;
    }
  if (!cJSON_IsObject(root)) { st = BAD("%s: header is not a JSON object", p); goto done; }
  int count = 0;
  for (const cJSON *e = root->child; e; e = e->next) count++;
  f->t = ct_calloc((size_t)(count ? count : 1), sizeof *f->t, "safetensors tensors");
  if (!f->t) { st = CT_ERR_NOMEM; goto done; }
  bool seen_meta = false;
  for (const cJSON *e = root->child; e; e = e->next) {
    if (!strcmp(e->string, "__metadata__")) {
      if (seen_meta) { st = BAD("%s: __metadata__ appears twice", p); goto done; }
      seen_meta = true;
      CT_TRY_GOTO(parse_metadata(f, e), done);
      continue;
    }
    ct_st_tensor *t = &f->t[f->n++];
    t->name = ct_strdup(e->string);
    if (!t->name) { st = CT_ERR_NOMEM; goto done; }
    CT_TRY_GOTO(parse_entry(f, e, t), done);
  }
  /* cJSON keeps duplicate keys as separate members: sorting by name exposes them */
  qsort(f->t, (size_t)f->n, sizeof *f->t, by_name);
  for (int i = 1; i < f->n; i++)
    if (!strcmp(f->t[i].name, f->t[i - 1].name)) {
      st = BAD("%s: duplicate tensor name \"%s\" in the header", p, f->t[i].name);
      goto done;
    }
  st = check_layout(f);
done:
  cJSON_Delete(root);
  free(text);
  return st;
}

ct_status ct_st_open(const char *path, ct_st_file **out) {
  *out = NULL;
  ct_st_file *f = ct_calloc(1, sizeof *f, "safetensors file");
  if (!f) return CT_ERR_NOMEM;
  f->fd = -1;
  ct_status st = CT_OK;
  f->path = ct_strdup(path);
  if (!f->path) { st = CT_ERR_NOMEM; goto fail; }
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) { st = BAD("%s: cannot open: %s", path, strerror(errno)); goto fail; }
  struct stat sb;
  if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = BAD("%s: not a regular file", path);
    goto fail;
  }
  CT_TRY_GOTO(parse_header(f, (uint64_t)sb.st_size), fail);
  *out = f;
  return CT_OK;
fail:
  ct_st_close(f);
  return st;
}

void ct_st_close(ct_st_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
  for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
  free(f->meta);
  free(f->t);
  free(f->path);
  free(f);
}

const char *ct_st_path(const ct_st_file *f) { return f->path; }
int ct_st_n_tensors(const ct_st_file *f) { return f->n; }
const ct_st_tensor *ct_st_tensor_at(const ct_st_file *f, int i) { return &f->t[i]; }

const ct_st_tensor *ct_st_find(const ct_st_file *f, const char *name) {
  ct_st_tensor key = {.name = name};
  return bsearch(&key, f->t, (size_t)f->n, sizeof *f->t, by_name);
}

const char *ct_st_metadata(const ct_st_file *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
  return NULL;
}

ct_status ct_st_read_f32(const ct_st_file *f, const ct_st_tensor *t, float *out) {
  const uint64_t off = f->data_start + t->begin;
  if (t->dtype == CT_ST_F32) return read_exact(f->fd, out, (size_t)(t->numel * 4), off, f->path);
  if (t->dtype != CT_ST_F16 && t->dtype != CT_ST_BF16 && t->dtype != CT_ST_F64)
    return BAD("%s: tensor \"%s\" has dtype %s: only F32, F16, BF16 and F64 read as floats",
               f->path, t->name, ct_st_dtype_name(t->dtype));
  /* convert through a bounded staging buffer: O(1) extra memory for any tensor size */
  enum { CHUNK = 1 << 16 };
  const size_t es = ct_st_dtype_size(t->dtype);
  void *stage = ct_malloc(CHUNK * es, "safetensors staging");
  if (!stage) return CT_ERR_NOMEM;
  ct_status st = CT_OK;
  for (uint64_t i = 0; i < t->numel && st == CT_OK; i += CHUNK) {
    size_t k = (size_t)(t->numel - i < CHUNK ? t->numel - i : CHUNK);
    st = read_exact(f->fd, stage, k * es, off + i * es, f->path);
    if (st != CT_OK) break;
    float *o = out + i;
    if (t->dtype == CT_ST_F16) {
      const uint16_t *h = stage;
      for (size_t j = 0; j < k; j++) o[j] = ct_st_f16_to_f32(h[j]);
    } else if (t->dtype == CT_ST_BF16) {
      const uint16_t *h = stage;
      for (size_t j = 0; j < k; j++) o[j] = ct_st_bf16_to_f32(h[j]);
    } else {
      const double *d = stage;
      for (size_t j = 0; j < k; j++) o[j] = (float)d[j];
    }
  }
  free(stage);
  return st;
}

/* ---------------------------------------------------------------- writing */

typedef struct sbuf { char *p; size_t n, cap; bool oom; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n + 1) cap *= 2;
    char *g = realloc(b->p, cap);
    if (!g) { b->oom = true; return; }
    b->p = g;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal; bytes >= 0x80 pass through (names are UTF-8). */
static void sb_json_str(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; sb_put(b, e, 2); }
    else if (c < 0x20) sb_printf(b, "\\u%04x", c);
    else sb_put(b, (const char *)&c, 1);
  }
  sb_put(b, "\"", 1);
}

static uint64_t out_numel(const ct_st_out *t) {
  uint64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
  return n;
}

ct_status ct_st_write(const char *path, const ct_st_out *tensors, int n, const char *const *meta,
                      int n_meta, ct_st_fill_fn fill, void *user) {
  for (int i = 0; i < n; i++) {
    const ct_st_out *t = &tensors[i];
    if (t->dtype != CT_ST_F32 && t->dtype != CT_ST_F16 && t->dtype != CT_ST_BF16)
      return ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\": can only write F32, F16 or BF16, not %s",
                          path, t->name, ct_st_dtype_name(t->dtype));
    if (t->ndim < 0 || t->ndim > CT_ST_MAX_DIMS)
      return ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\": %d dimensions", path, t->name, t->ndim);
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] < 0)
        return ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\": negative dimension", path, t->name);
    if (!t->data && !fill)
      return ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\": no data and no fill callback", path, t->name);
    if (!strcmp(t->name, "__metadata__") || !t->name[0])
      return ct_set_error(CT_ERR_INPUT, "%s: invalid tensor name \"%s\"", path, t->name);
    for (int j = 0; j < i; j++) /* O(n^2): fine for the few thousand tensors of a checkpoint */
      if (!strcmp(tensors[j].name, t->name))
        return ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\" given twice", path, t->name);
  }
  sbuf h = {0};
  sb_put(&h, "{", 1);
  if (n_meta > 0) {
    sb_put(&h, "\"__metadata__\":{", 16);
    for (int i = 0; i < n_meta; i++) {
      if (i) sb_put(&h, ",", 1);
      sb_json_str(&h, meta[2 * i]);
      sb_put(&h, ":", 1);
      sb_json_str(&h, meta[2 * i + 1]);
    }
    sb_put(&h, "}", 1);
  }
  uint64_t off = 0, max_numel = 0;
  for (int i = 0; i < n; i++) {
    const ct_st_out *t = &tensors[i];
    uint64_t bytes = out_numel(t) * ct_st_dtype_size(t->dtype);
    if (out_numel(t) > max_numel) max_numel = out_numel(t);
    if (i || n_meta > 0) sb_put(&h, ",", 1);
    sb_json_str(&h, t->name);
    sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", ct_st_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++) sb_printf(&h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
              (unsigned long long)(off + bytes));
    off += bytes;
  }
  sb_put(&h, "}", 1);
  while (!h.oom && h.n % 8) sb_put(&h, " ", 1); /* data buffer starts 8-byte aligned */
  if (h.oom) { free(h.p); return ct_set_error(CT_ERR_NOMEM, "%s: out of memory for the header", path); }

  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  ct_status st = CT_OK;
  FILE *fp = fopen(tmp, "wb");
  const size_t CHUNK = 1 << 16;
  float *scratch = NULL;
  uint16_t *half = ct_malloc(CHUNK * sizeof(uint16_t), "safetensors writer");
  if (!fp || !half) {
    st = fp ? CT_ERR_NOMEM : ct_set_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    goto done;
  }
  if (fill && max_numel) {
    scratch = ct_malloc((size_t)max_numel * sizeof(float), "safetensors writer");
    if (!scratch) { st = CT_ERR_NOMEM; goto done; }
  }
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
  bool ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(h.p, 1, h.n, fp) == h.n;
  for (int i = 0; i < n && ok; i++) {
    const ct_st_out *t = &tensors[i];
    const uint64_t numel = out_numel(t);
    const float *src = t->data;
    if (!src) { fill(user, i, scratch); src = scratch; }
    if (t->dtype == CT_ST_F32) { ok = fwrite(src, 4, (size_t)numel, fp) == numel; continue; }
    for (uint64_t j = 0; j < numel && ok; j += CHUNK) {
      size_t k = (size_t)(numel - j < CHUNK ? numel - j : CHUNK);
      for (size_t q = 0; q < k; q++)
        half[q] = t->dtype == CT_ST_BF16 ? ct_st_f32_to_bf16(src[j + q]) : ct_st_f32_to_f16(src[j + q]);
      ok = fwrite(half, 2, k, fp) == k;
    }
  }
  if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) ok = false;
  if (!ok) st = ct_set_error(CT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
done:
  if (fp && fclose(fp) != 0 && st == CT_OK) st = ct_set_error(CT_ERR_IO, "%s: close failed", tmp);
  if (st == CT_OK && rename(tmp, path) != 0)
    st = ct_set_error(CT_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
  if (st != CT_OK && fp) unlink(tmp);
  free(scratch);
  free(half);
  free(h.p);
  return st;
}

/* ---------------------------------------------------------------- sharded sets */

struct ct_st_set {
  ct_st_file **files;      /* (n_files) */
  int n_files;
  const ct_st_tensor **t;  /* (n) sorted by name, pointing into the files */
  int n;
};

static int by_name_ptr(const void *a, const void *b) {
  return strcmp((*(const ct_st_tensor *const *)a)->name, (*(const ct_st_tensor *const *)b)->name);
}

static ct_status set_add_file(ct_st_set *s, const char *path) {
  ct_st_file **g = realloc(s->files, sizeof *g * (size_t)(s->n_files + 1));
  if (!g) return ct_set_error(CT_ERR_NOMEM, "out of memory opening %s", path);
  s->files = g;
  ct_st_file *f;
  CT_TRY(ct_st_open(path, &f));
  for (int i = 0; i < f->n; i++) f->t[i].file = s->n_files;
  s->files[s->n_files++] = f;
  return CT_OK;
}

static ct_status set_index(ct_st_set *s) {
  int total = 0;
  for (int i = 0; i < s->n_files; i++) total += s->files[i]->n;
  s->t = ct_malloc(sizeof *s->t * (size_t)(total ? total : 1), "safetensors index");
  if (!s->t) return CT_ERR_NOMEM;
  for (int i = 0; i < s->n_files; i++)
    for (int j = 0; j < s->files[i]->n; j++) s->t[s->n++] = &s->files[i]->t[j];
  qsort(s->t, (size_t)s->n, sizeof *s->t, by_name_ptr);
  for (int i = 1; i < s->n; i++)
    if (!strcmp(s->t[i]->name, s->t[i - 1]->name))
      return BAD("tensor \"%s\" is in both %s and %s", s->t[i]->name,
                 s->files[s->t[i - 1]->file]->path, s->files[s->t[i]->file]->path);
  return CT_OK;
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: file}} */
static ct_status open_index(ct_st_set *s, const char *index_path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", index_path);
  char *slash = strrchr(dir, '/');
  if (slash) slash[1] = '\0';
  else dir[0] = '\0';
  char *text = NULL;
  CT_TRY(ct_read_file(index_path, &text, NULL));
  ct_status st = CT_OK;
  cJSON *root = cJSON_Parse(text);
  const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
  if (!root) { st = BAD("%s: not valid JSON", index_path); goto done; }
  if (!cJSON_IsObject(wm)) { st = BAD("%s: no \"weight_map\" object", index_path); goto done; }
  /* open each distinct shard once, in order of first mention */
  const char **names = ct_calloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof *names, "shard names");
  if (!names) { st = CT_ERR_NOMEM; goto done; }
  int n_names = 0;
  for (const cJSON *e = wm->child; e && st == CT_OK; e = e->next) {
    if (!cJSON_IsString(e)) { st = BAD("%s: weight_map[\"%s\"] is not a file name", index_path, e->string); break; }
    const char *fn = e->valuestring;
    if (!fn[0] || fn[0] == '/' || strstr(fn, "..") || strchr(fn, '/')) {
      st = BAD("%s: weight_map[\"%s\"] = \"%s\": shard must be a file name in the same directory",
               index_path, e->string, fn);
      break;
    }
    int k = 0;
    while (k < n_names && strcmp(names[k], fn)) k++;
    if (k < n_names) continue;
    names[n_names++] = fn;
    char path[8192];
    snprintf(path, sizeof path, "%s%s", dir, fn);
    st = set_add_file(s, path);
  }
  /* both directions: every listed tensor is in its shard, every shard tensor is listed there */
  for (const cJSON *e = wm->child; e && st == CT_OK; e = e->next) {
    int k = 0;
    while (strcmp(names[k], e->valuestring)) k++;
    if (!ct_st_find(s->files[k], e->string))
      st = BAD("%s: weight_map puts tensor \"%s\" in %s, which does not hold it", index_path,
               e->string, s->files[k]->path);
  }
  for (int k = 0; k < s->n_files && st == CT_OK; k++)
    for (int j = 0; j < s->files[k]->n && st == CT_OK; j++) {
      const char *tn = s->files[k]->t[j].name;
      const cJSON *e = cJSON_GetObjectItemCaseSensitive(wm, tn);
      if (!e) st = BAD("%s: holds tensor \"%s\", which %s does not list", s->files[k]->path, tn, index_path);
      else if (strcmp(e->valuestring, names[k]))
        st = BAD("%s: holds tensor \"%s\", but %s maps it to %s", s->files[k]->path, tn,
                 index_path, e->valuestring);
    }
  free(names);
done:
  cJSON_Delete(root);
  free(text);
  return st;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

ct_status ct_st_set_open(const char *path, ct_st_set **out) {
  *out = NULL;
  ct_st_set *s = ct_calloc(1, sizeof *s, "safetensors set");
  if (!s) return CT_ERR_NOMEM;
  ct_status st = CT_OK;
  struct stat sb;
  char cand[4200];
  if (stat(path, &sb) != 0) {
    st = BAD("%s: cannot open: %s", path, strerror(errno));
  } else if (S_ISDIR(sb.st_mode)) {
    snprintf(cand, sizeof cand, "%s/model.safetensors", path);
    if (ct_file_exists(cand)) {
      st = set_add_file(s, cand);
    } else {
      snprintf(cand, sizeof cand, "%s/model.safetensors.index.json", path);
      if (ct_file_exists(cand)) st = open_index(s, cand);
      else st = BAD("%s: no model.safetensors or model.safetensors.index.json (PyTorch .bin"
                    " checkpoints are not read: re-save with safe_serialization=True)", path);
    }
  } else if (ends_with(path, ".json")) {
    st = open_index(s, path);
  } else {
    st = set_add_file(s, path);
  }
  if (st == CT_OK) st = set_index(s);
  if (st != CT_OK) { ct_st_set_close(s); return st; }
  *out = s;
  return CT_OK;
}

void ct_st_set_close(ct_st_set *s) {
  if (!s) return;
  for (int i = 0; i < s->n_files; i++) ct_st_close(s->files[i]);
  free(s->files);
  free(s->t);
  free(s);
}

int ct_st_set_n_tensors(const ct_st_set *s) { return s->n; }
const ct_st_tensor *ct_st_set_tensor(const ct_st_set *s, int i) { return s->t[i]; }
int ct_st_set_n_files(const ct_st_set *s) { return s->n_files; }
const ct_st_file *ct_st_set_file(const ct_st_set *s, int i) { return s->files[i]; }

const ct_st_tensor *ct_st_set_find(const ct_st_set *s, const char *name) {
  ct_st_tensor key = {.name = name};
  const ct_st_tensor *kp = &key, **hit = bsearch(&kp, s->t, (size_t)s->n, sizeof *s->t, by_name_ptr);
  return hit ? *hit : NULL;
}

ct_status ct_st_set_read_f32(const ct_st_set *s, const ct_st_tensor *t, float *out) {
  return ct_st_read_f32(s->files[t->file], t, out);
}
