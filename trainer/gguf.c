/* trainer/gguf.c — GGUF reader, dequantization and `ctrain import-gguf` (see gguf.h). */
#define _GNU_SOURCE
#include "trainer/gguf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "trainer/checkpoint.h"

/* Dequantization does its float32 products and sums as separate roundings, as numpy and torch
 * do in the reference dequantizers: no fused multiply-adds, even under -march with FMA. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#define REFUSE(...) return ct_set_error(CT_ERR_INPUT, __VA_ARGS__)
#define MAX_DIMS 4
#define MAX_NESTING 8        /* arrays of arrays: deeper is refused (no real file nests at all) */
#define DEFAULT_ALIGNMENT 32

typedef unsigned long long ull; /* for printing uint64_t */

/* ---------------------------------------------------------------- type tables */

static const char *const VTYPE_NAMES[CT_GGUF_VTYPE_COUNT] = {
  "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
  "UINT64", "INT64", "FLOAT64",
};
static const int VTYPE_SIZE[CT_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static const struct { const char *name; int block; int bytes; } GGML[CT_GGML_TYPE_COUNT] = {
  [CT_GGML_F32] = {"F32", 1, 4},      [CT_GGML_F16] = {"F16", 1, 2},
  [CT_GGML_Q4_0] = {"Q4_0", 32, 18},  [CT_GGML_Q4_1] = {"Q4_1", 32, 20},
  [CT_GGML_Q5_0] = {"Q5_0", 32, 22},  [CT_GGML_Q5_1] = {"Q5_1", 32, 24},
  [CT_GGML_Q8_0] = {"Q8_0", 32, 34},  [CT_GGML_Q8_1] = {"Q8_1", 32, 36},
  [CT_GGML_Q2_K] = {"Q2_K", 256, 84}, [CT_GGML_Q3_K] = {"Q3_K", 256, 110},
  [CT_GGML_Q4_K] = {"Q4_K", 256, 144}, [CT_GGML_Q5_K] = {"Q5_K", 256, 176},
  [CT_GGML_Q6_K] = {"Q6_K", 256, 210}, [CT_GGML_Q8_K] = {"Q8_K", 256, 292},
  [CT_GGML_I8] = {"I8", 1, 1},        [CT_GGML_I16] = {"I16", 1, 2},
  [CT_GGML_I32] = {"I32", 1, 4},      [CT_GGML_I64] = {"I64", 1, 8},
  [CT_GGML_F64] = {"F64", 1, 8},      [CT_GGML_BF16] = {"BF16", 1, 2},
};

const char *ct_gguf_vtype_name(ct_gguf_vtype t) {
  return (unsigned)t < CT_GGUF_VTYPE_COUNT ? VTYPE_NAMES[t] : "?";
}
const char *ct_ggml_type_name(ct_ggml_type t) {
  return (unsigned)t < CT_GGML_TYPE_COUNT && GGML[t].name ? GGML[t].name : "?";
}
int ct_ggml_block_size(ct_ggml_type t) { return (unsigned)t < CT_GGML_TYPE_COUNT ? GGML[t].block : 0; }
size_t ct_ggml_type_size(ct_ggml_type t) {
  return (unsigned)t < CT_GGML_TYPE_COUNT ? (size_t)GGML[t].bytes : 0;
}
bool ct_ggml_can_dequantize(ct_ggml_type t) {
  return t == CT_GGML_F32 || t == CT_GGML_F16 || t == CT_GGML_BF16 || t == CT_GGML_Q8_0 ||
         t == CT_GGML_Q4_0 || t == CT_GGML_Q4_1;
}

/* ---------------------------------------------------------------- little-endian loads */

static inline uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* ---------------------------------------------------------------- dequantization */

float ct_gguf_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) bits = sign | 0x7f800000u | man << 13;        /* inf / NaN (payload kept) */
  else if (exp) bits = sign | (exp + 112u) << 23 | man << 13;    /* rebias 15 -> 127 */
  else if (!man) bits = sign;                                     /* +-0 */
  else {                                                          /* subnormal: man * 2^-24 */
    float f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

float ct_gguf_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* One block of each format. Products and sums are separate statements (clang contracts only
 * within one expression; GCC is told above), so the values equal the float32 arithmetic of
 * Transformers' and the gguf package's dequantizers bit for bit. */
static void deq_q8_0(const unsigned char *x, float *y) {
  const float d = ct_gguf_f16_to_f32(le16(x));
  for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)x[2 + j];
}

static void deq_q4_0(const unsigned char *x, float *y) {
  const float d = ct_gguf_f16_to_f32(le16(x));
  const unsigned char *qs = x + 2;
  for (int j = 0; j < 16; j++) {
    y[j] = d * (float)((int)(qs[j] & 15) - 8);
    y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
  }
}

static void deq_q4_1(const unsigned char *x, float *y) {
  const float d = ct_gguf_f16_to_f32(le16(x)), m = ct_gguf_f16_to_f32(le16(x + 2));
  const unsigned char *qs = x + 4;
  for (int j = 0; j < 16; j++) {
    float lo = d * (float)(qs[j] & 15), hi = d * (float)(qs[j] >> 4);
    y[j] = lo + m;
    y[j + 16] = hi + m;
  }
}

ct_status ct_gguf_dequantize(ct_ggml_type type, const void *src, size_t src_bytes, float *dst,
                             int64_t n) {
  if (!ct_ggml_can_dequantize(type))
    return ct_set_error(CT_ERR_INPUT, "GGUF tensor type %s (%d) cannot be dequantized (supported:"
                        " F32, F16, BF16, Q8_0, Q4_0, Q4_1)", ct_ggml_type_name(type), (int)type);
  const int64_t bs = GGML[type].block;
  if (n < 0 || n % bs)
    return ct_set_error(CT_ERR_INPUT, "dequantize %s: %lld values is not a multiple of the block"
                        " size %lld", GGML[type].name, (long long)n, (long long)bs);
  const int64_t nb = n / bs;
  const size_t ts = (size_t)GGML[type].bytes;
  if ((uint64_t)nb > SIZE_MAX / ts || (size_t)nb * ts != src_bytes)
    return ct_set_error(CT_ERR_INPUT, "dequantize %s: %lld values take %llu bytes, got %zu",
                        GGML[type].name, (long long)n, (ull)((uint64_t)nb * ts), src_bytes);
  const unsigned char *s = src;
  /* blocks are independent: split them over threads (the largest tensors have ~1M blocks) */
#pragma omp parallel for schedule(static) if (nb > 65536)
  for (int64_t b = 0; b < nb; b++) {
    const unsigned char *x = s + (size_t)b * ts;
    float *y = dst + b * bs;
    switch (type) {
      case CT_GGML_F32: { uint32_t u = le32(x); memcpy(y, &u, 4); break; }
      case CT_GGML_F16: *y = ct_gguf_f16_to_f32(le16(x)); break;
      case CT_GGML_BF16: *y = ct_gguf_bf16_to_f32(le16(x)); break;
      case CT_GGML_Q8_0: deq_q8_0(x, y); break;
      case CT_GGML_Q4_0: deq_q4_0(x, y); break;
      case CT_GGML_Q4_1: deq_q4_1(x, y); break;
      default: break; /* excluded above */
    }
  }
  return CT_OK;
}

/* ---------------------------------------------------------------- the file */

struct ct_gguf {
  char *path;
  const unsigned char *map;   /* (size) the whole file, read-only */
  uint64_t size;
  uint32_t version;
  uint64_t alignment, data_offset;
  ct_gguf_kv *kv;             /* (n_kv) */
  int n_kv;
  ct_gguf_tensor *t;          /* (n_t) in file order */
  int n_t;
  int *by_name;               /* (n_t) tensor indices sorted by name, for lookups */
};

const char *ct_gguf_path(const ct_gguf *g) { return g->path; }
uint32_t ct_gguf_version(const ct_gguf *g) { return g->version; }
uint64_t ct_gguf_alignment(const ct_gguf *g) { return g->alignment; }
uint64_t ct_gguf_data_offset(const ct_gguf *g) { return g->data_offset; }
int ct_gguf_n_kv(const ct_gguf *g) { return g->n_kv; }
const ct_gguf_kv *ct_gguf_kv_at(const ct_gguf *g, int i) { return &g->kv[i]; }
int ct_gguf_n_tensors(const ct_gguf *g) { return g->n_t; }
const ct_gguf_tensor *ct_gguf_tensor_at(const ct_gguf *g, int i) { return &g->t[i]; }

/* A bounds-checked cursor over the mapping. `ctx` names what is being read for messages. */
typedef struct cur {
  const ct_gguf *g;
  uint64_t pos;
  char ctx[320];
} cur;

static ct_status need(cur *c, uint64_t n, const char *what) {
  if (n > c->g->size - c->pos)
    REFUSE("%s: truncated: %s%s%s needs %llu bytes at offset %llu, but the file ends at %llu",
           c->g->path, c->ctx, c->ctx[0] ? ": " : "", what, (ull)n, (ull)c->pos, (ull)c->g->size);
  return CT_OK;
}

static ct_status rd32(cur *c, const char *what, uint32_t *v) {
  CT_TRY(need(c, 4, what));
  *v = le32(c->g->map + c->pos);
  c->pos += 4;
  return CT_OK;
}

static ct_status rd64(cur *c, const char *what, uint64_t *v) {
  CT_TRY(need(c, 8, what));
  *v = le64(c->g->map + c->pos);
  c->pos += 8;
  return CT_OK;
}

/* A GGUF string: u64 length + bytes. *s points into the mapping. */
static ct_status rd_str(cur *c, const char *what, const char **s, uint64_t *len) {
  char w[96];
  snprintf(w, sizeof w, "the length of %s", what);
  CT_TRY(rd64(c, w, len));
  CT_TRY(need(c, *len, what));
  *s = (const char *)c->g->map + c->pos;
  c->pos += *len;
  return CT_OK;
}

static char *dup_n(const char *s, uint64_t n) {
  char *d = malloc((size_t)n + 1);
  if (!d) return NULL;
  memcpy(d, s, (size_t)n);
  d[n] = '\0';
  return d;
}

/* Skips (validating) one value of type t; with kv != NULL (the top level) also records it. */
static ct_status rd_value(cur *c, ct_gguf_vtype t, int depth, ct_gguf_kv *kv) {
  const ct_gguf *g = c->g;
  if ((unsigned)t >= CT_GGUF_VTYPE_COUNT)
    REFUSE("%s: %s: unknown value type %u (known: 0..%d)", g->path, c->ctx, (unsigned)t,
           CT_GGUF_VTYPE_COUNT - 1);
  if (t == CT_GGUF_STRING) {
    const char *s;
    uint64_t len;
    CT_TRY(rd_str(c, "a string value", &s, &len));
    if (kv) {
      if (!(kv->str = dup_n(s, len))) return ct_set_error(CT_ERR_NOMEM, "out of memory reading %s", g->path);
      kv->str_len = len;
    }
    return CT_OK;
  }
  if (t != CT_GGUF_ARRAY) {
    const uint64_t sz = (uint64_t)VTYPE_SIZE[t];
    CT_TRY(need(c, sz, "a value"));
    if (kv) {
      const unsigned char *p = g->map + c->pos;
      switch (t) {
        case CT_GGUF_UINT8: kv->v.u = p[0]; break;
        case CT_GGUF_INT8: kv->v.i = (int8_t)p[0]; break;
        case CT_GGUF_UINT16: kv->v.u = le16(p); break;
        case CT_GGUF_INT16: kv->v.i = (int16_t)le16(p); break;
        case CT_GGUF_UINT32: kv->v.u = le32(p); break;
        case CT_GGUF_INT32: kv->v.i = (int32_t)le32(p); break;
        case CT_GGUF_UINT64: kv->v.u = le64(p); break;
        case CT_GGUF_INT64: kv->v.i = (int64_t)le64(p); break;
        case CT_GGUF_BOOL: kv->v.b = p[0] != 0; break;
        case CT_GGUF_FLOAT32: { uint32_t u = le32(p); float f; memcpy(&f, &u, 4); kv->v.f = f; break; }
        case CT_GGUF_FLOAT64: { uint64_t u = le64(p); double f; memcpy(&f, &u, 8); kv->v.f = f; break; }
        default: break;
      }
    }
    c->pos += sz;
    return CT_OK;
  }
  /* array: element type, count, elements */
  if (depth >= MAX_NESTING) REFUSE("%s: %s: arrays nested deeper than %d", g->path, c->ctx, MAX_NESTING);
  uint32_t et;
  uint64_t n;
  CT_TRY(rd32(c, "the array element type", &et));
  if (et >= CT_GGUF_VTYPE_COUNT)
    REFUSE("%s: %s: unknown array element type %u (known: 0..%d)", g->path, c->ctx, et,
           CT_GGUF_VTYPE_COUNT - 1);
  CT_TRY(rd64(c, "the array length", &n));
  /* every element takes at least one byte (strings 8, arrays 12): a count larger than the bytes
   * left is a lie, refused before anything is allocated for it */
  const uint64_t min_el = et == CT_GGUF_STRING ? 8 : et == CT_GGUF_ARRAY ? 12 : (uint64_t)VTYPE_SIZE[et];
  if (n > (g->size - c->pos) / min_el)
    REFUSE("%s: %s: array of %llu %s elements does not fit in the %llu bytes left", g->path,
           c->ctx, (ull)n, VTYPE_NAMES[et], (ull)(g->size - c->pos));
  if (kv) {
    kv->elem_type = (ct_gguf_vtype)et;
    kv->n = n;
    kv->data = g->map + c->pos;
  }
  if (et != CT_GGUF_STRING && et != CT_GGUF_ARRAY) {
    c->pos += n * min_el;
    return CT_OK;
  }
  if (kv && et == CT_GGUF_STRING) {
    kv->strs = malloc(sizeof *kv->strs * (size_t)(n ? n : 1));
    kv->lens = malloc(sizeof *kv->lens * (size_t)(n ? n : 1));
    if (!kv->strs || !kv->lens) return ct_set_error(CT_ERR_NOMEM, "out of memory reading %s", g->path);
  }
  for (uint64_t i = 0; i < n; i++) {
    if (et == CT_GGUF_STRING) {
      const char *s;
      uint64_t len;
      CT_TRY(rd_str(c, "a string element", &s, &len));
      if (kv) kv->strs[i] = s, kv->lens[i] = len;
    } else {
      CT_TRY(rd_value(c, CT_GGUF_ARRAY, depth + 1, NULL)); /* its own type, count, elements */
    }
  }
  return CT_OK;
}

static int cmp_name_idx(const void *a, const void *b, void *arg) {
  const ct_gguf_tensor *t = arg;
  return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

const ct_gguf_tensor *ct_gguf_find_tensor(const ct_gguf *g, const char *name) {
  int lo = 0, hi = g->n_t - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(g->t[g->by_name[mid]].name, name);
    if (!c) return &g->t[g->by_name[mid]];
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}

/* O(n_kv) scan: files have a few dozen keys. */
const ct_gguf_kv *ct_gguf_find_kv(const ct_gguf *g, const char *key) {
  for (int i = 0; i < g->n_kv; i++)
    if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
  return NULL;
}

void ct_gguf_close(ct_gguf *g) {
  if (!g) return;
  for (int i = 0; i < g->n_kv; i++) {
    free(g->kv[i].key);
    free(g->kv[i].str);
    free(g->kv[i].strs);
    free(g->kv[i].lens);
  }
  free(g->kv);
  for (int i = 0; i < g->n_t; i++) free(g->t[i].name);
  free(g->t);
  free(g->by_name);
  if (g->map) munmap((void *)g->map, (size_t)g->size);
  free(g->path);
  free(g);
}

static ct_status parse_header(ct_gguf *g) {
  cur c = {.g = g, .pos = 0, .ctx = "header"};
  if (g->size < 4 || memcmp(g->map, "GGUF", 4))
    REFUSE("%s: not a GGUF file (it does not start with the magic \"GGUF\")", g->path);
  c.pos = 4;
  CT_TRY(rd32(&c, "the version", &g->version));
  if (g->version == 1)
    REFUSE("%s: GGUF version 1 (32-bit counts) is not supported: convert the model again with a"
           " current llama.cpp (versions 2 and 3 are read)", g->path);
  if (g->version >= 0x10000 && !(g->version & 0xffff))
    REFUSE("%s: a big-endian GGUF file (version reads as 0x%08x): only little-endian files are"
           " supported", g->path, g->version);
  if (g->version != 2 && g->version != 3)
    REFUSE("%s: GGUF version %u is not supported (2 and 3 are)", g->path, g->version);
  uint64_t n_t, n_kv;
  CT_TRY(rd64(&c, "the tensor count", &n_t));
  CT_TRY(rd64(&c, "the metadata key/value count", &n_kv));
  /* the smallest key/value takes 13 bytes and the smallest tensor info 32 */
  if (n_kv > (g->size - c.pos) / 13)
    REFUSE("%s: header says %llu metadata key/values, more than the file's %llu bytes can hold",
           g->path, (ull)n_kv, (ull)g->size);
  if (n_t > (g->size - c.pos) / 32)
    REFUSE("%s: header says %llu tensors, more than the file's %llu bytes can hold", g->path,
           (ull)n_t, (ull)g->size);
  if (n_kv > INT_MAX || n_t > INT_MAX) REFUSE("%s: too many keys or tensors", g->path);
  g->kv = calloc((size_t)n_kv + 1, sizeof *g->kv);
  g->t = calloc((size_t)n_t + 1, sizeof *g->t);
  g->by_name = calloc((size_t)n_t + 1, sizeof *g->by_name);
  if (!g->kv || !g->t || !g->by_name) return ct_set_error(CT_ERR_NOMEM, "out of memory reading %s", g->path);

  /* metadata */
  for (uint64_t i = 0; i < n_kv; i++) {
    ct_gguf_kv *kv = &g->kv[g->n_kv];
    snprintf(c.ctx, sizeof c.ctx, "metadata key/value %llu", (ull)i);
    const char *key;
    uint64_t klen;
    CT_TRY(rd_str(&c, "the key", &key, &klen));
    if (!(kv->key = dup_n(key, klen))) return ct_set_error(CT_ERR_NOMEM, "out of memory reading %s", g->path);
    g->n_kv++;
    if (!klen || strlen(kv->key) != klen)
      REFUSE("%s: metadata key/value %llu: the key is empty or holds a NUL byte", g->path, (ull)i);
    snprintf(c.ctx, sizeof c.ctx, "key \"%.200s\"", kv->key);
    for (int j = 0; j + 1 < g->n_kv; j++)
      if (!strcmp(g->kv[j].key, kv->key)) REFUSE("%s: key \"%.200s\" appears twice", g->path, kv->key);
    uint32_t t;
    CT_TRY(rd32(&c, "the value type", &t));
    kv->type = (ct_gguf_vtype)t;
    CT_TRY(rd_value(&c, kv->type, 0, kv));
  }
  g->alignment = DEFAULT_ALIGNMENT;
  const ct_gguf_kv *al = ct_gguf_find_kv(g, "general.alignment");
  if (al) {
    if (al->type != CT_GGUF_UINT32)
      REFUSE("%s: general.alignment is %s, not UINT32", g->path, VTYPE_NAMES[al->type]);
    if (!al->v.u || (al->v.u & (al->v.u - 1)))
      REFUSE("%s: general.alignment = %llu: must be a power of two", g->path, (ull)al->v.u);
    g->alignment = al->v.u;
  }

  /* tensor infos */
  for (uint64_t i = 0; i < n_t; i++) {
    ct_gguf_tensor *t = &g->t[g->n_t];
    snprintf(c.ctx, sizeof c.ctx, "tensor info %llu", (ull)i);
    const char *name;
    uint64_t nlen;
    CT_TRY(rd_str(&c, "the name", &name, &nlen));
    if (!(t->name = dup_n(name, nlen))) return ct_set_error(CT_ERR_NOMEM, "out of memory reading %s", g->path);
    g->n_t++;
    if (!nlen || strlen(t->name) != nlen)
      REFUSE("%s: tensor info %llu: the name is empty or holds a NUL byte", g->path, (ull)i);
    snprintf(c.ctx, sizeof c.ctx, "tensor \"%.200s\"", t->name);
    uint32_t nd, type;
    CT_TRY(rd32(&c, "the dimension count", &nd));
    if (nd < 1 || nd > MAX_DIMS)
      REFUSE("%s: tensor \"%.200s\": %u dimensions (1..%d are allowed)", g->path, t->name, nd, MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t numel = 1;
    for (int d = 0; d < MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
      uint64_t ne;
      CT_TRY(rd64(&c, "a dimension", &ne));
      if (ne < 1 || ne > (uint64_t)INT64_MAX / numel)
        REFUSE("%s: tensor \"%.200s\": dimension %u is %llu (must be >= 1, and the element count"
               " must fit 63 bits)", g->path, t->name, d, (ull)ne);
      t->ne[d] = (int64_t)ne;
      numel *= ne;
    }
    t->numel = (int64_t)numel;
    CT_TRY(rd32(&c, "the type", &type));
    if (type >= CT_GGML_TYPE_COUNT || !GGML[type].name)
      REFUSE("%s: tensor \"%.200s\": tensor type %u is unknown or not supported", g->path, t->name, type);
    t->type = (ct_ggml_type)type;
    CT_TRY(rd64(&c, "the data offset", &t->offset));
    const uint64_t bs = (uint64_t)GGML[type].block, ts = (uint64_t)GGML[type].bytes;
    if ((uint64_t)t->ne[0] % bs)
      REFUSE("%s: tensor \"%.200s\": row length ne[0] = %lld is not a multiple of %s's block of %llu",
             g->path, t->name, (long long)t->ne[0], GGML[type].name, (ull)bs);
    const uint64_t rows = numel / (uint64_t)t->ne[0], row_bytes = (uint64_t)t->ne[0] / bs * ts;
    if (rows > UINT64_MAX / row_bytes)
      REFUSE("%s: tensor \"%.200s\": size overflows", g->path, t->name);
    t->nbytes = rows * row_bytes;
    if (t->offset % g->alignment)
      REFUSE("%s: tensor \"%.200s\": data offset %llu is not a multiple of the alignment %llu",
             g->path, t->name, (ull)t->offset, (ull)g->alignment);
  }
  /* data section: after the infos, aligned; each tensor inside the file */
  uint64_t data = c.pos + (g->alignment - c.pos % g->alignment) % g->alignment;
  g->data_offset = data;
  for (int i = 0; i < g->n_t; i++) {
    ct_gguf_tensor *t = &g->t[i];
    if (data > g->size || t->offset > g->size - data || t->nbytes > g->size - data - t->offset)
      REFUSE("%s: tensor \"%.200s\" (%s, %llu bytes at data offset %llu) extends past the end of the"
             " file (%llu bytes; data section at %llu): truncated file?", g->path, t->name,
             GGML[t->type].name, (ull)t->nbytes, (ull)t->offset, (ull)g->size, (ull)data);
    t->offset += data;
    g->by_name[i] = i;
  }
  qsort_r(g->by_name, (size_t)g->n_t, sizeof(int), cmp_name_idx, g->t);
  for (int i = 1; i < g->n_t; i++)
    if (!strcmp(g->t[g->by_name[i]].name, g->t[g->by_name[i - 1]].name))
      REFUSE("%s: tensor \"%.200s\" appears twice", g->path, g->t[g->by_name[i]].name);
  return CT_OK;
}

ct_status ct_gguf_open(const char *path, ct_gguf **out) {
  *out = NULL;
  ct_gguf *g = calloc(1, sizeof *g);
  if (!g || !(g->path = ct_strdup(path))) {
    free(g);
    return ct_set_error(CT_ERR_NOMEM, "out of memory opening %s", path);
  }
  ct_status st = CT_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (fd < 0) {
    st = ct_set_error(errno == ENOENT ? CT_ERR_INPUT : CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    goto fail;
  }
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    st = ct_set_error(CT_ERR_INPUT, "%s: not a regular file", path);
    goto fail;
  }
  g->size = (uint64_t)sb.st_size;
  if (g->size < 24) { /* tell "not GGUF" from "truncated header" by the bytes that are there */
    unsigned char head[4] = {0};
    bool magic = g->size >= 4 && pread(fd, head, 4, 0) == 4 && !memcmp(head, "GGUF", 4);
    close(fd);
    if (magic)
      st = ct_set_error(CT_ERR_INPUT, "%s: truncated header: %llu bytes, a GGUF header takes 24",
                        path, (ull)g->size);
    else
      st = ct_set_error(CT_ERR_INPUT, "%s: not a GGUF file (%llu bytes, no \"GGUF\" magic)", path,
                        (ull)g->size);
    goto fail;
  }
  void *map = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot map %llu bytes: %s", path, (ull)g->size, strerror(errno));
    goto fail;
  }
  g->map = map;
  CT_TRY_GOTO(parse_header(g), fail);
  *out = g;
  return CT_OK;
fail:
  ct_gguf_close(g);
  return st;
}

ct_status ct_gguf_read_f32(const ct_gguf *g, const ct_gguf_tensor *t, float *dst) {
  if (!ct_ggml_can_dequantize(t->type))
    REFUSE("%s: tensor \"%s\" has type %s, which import cannot dequantize (supported: F32, F16,"
           " BF16, Q8_0, Q4_0, Q4_1)", g->path, t->name, ct_ggml_type_name(t->type));
  ct_status st = ct_gguf_dequantize(t->type, g->map + t->offset, (size_t)t->nbytes, dst, t->numel);
  if (st != CT_OK) ct_add_context(st, "%s: tensor \"%s\": ", g->path, t->name);
  return st;
}

/* ---------------------------------------------------------------- typed metadata getters */

static bool is_int(ct_gguf_vtype t) {
  return t <= CT_GGUF_INT32 || t == CT_GGUF_UINT64 || t == CT_GGUF_INT64;
}
static bool is_unsigned(ct_gguf_vtype t) {
  return t == CT_GGUF_UINT8 || t == CT_GGUF_UINT16 || t == CT_GGUF_UINT32 || t == CT_GGUF_UINT64;
}

static ct_status lookup(const ct_gguf *g, const char *key, bool required, const ct_gguf_kv **kv) {
  *kv = ct_gguf_find_kv(g, key);
  if (!*kv && required) REFUSE("%s: metadata key \"%s\" missing", g->path, key);
  return CT_OK;
}

ct_status ct_gguf_get_int(const ct_gguf *g, const char *key, bool required, int64_t *out) {
  const ct_gguf_kv *kv;
  CT_TRY(lookup(g, key, required, &kv));
  if (!kv) return CT_OK;
  if (!is_int(kv->type)) REFUSE("%s: metadata \"%s\" is %s, expected an integer", g->path, key, VTYPE_NAMES[kv->type]);
  if (is_unsigned(kv->type) && kv->v.u > (uint64_t)INT64_MAX)
    REFUSE("%s: metadata \"%s\" = %llu is out of range", g->path, key, (ull)kv->v.u);
  *out = is_unsigned(kv->type) ? (int64_t)kv->v.u : kv->v.i;
  return CT_OK;
}

ct_status ct_gguf_get_num(const ct_gguf *g, const char *key, bool required, double *out) {
  const ct_gguf_kv *kv;
  CT_TRY(lookup(g, key, required, &kv));
  if (!kv) return CT_OK;
  if (kv->type == CT_GGUF_FLOAT32 || kv->type == CT_GGUF_FLOAT64) *out = kv->v.f;
  else if (is_int(kv->type)) *out = is_unsigned(kv->type) ? (double)kv->v.u : (double)kv->v.i;
  else REFUSE("%s: metadata \"%s\" is %s, expected a number", g->path, key, VTYPE_NAMES[kv->type]);
  return CT_OK;
}

ct_status ct_gguf_get_bool(const ct_gguf *g, const char *key, bool required, bool *out) {
  const ct_gguf_kv *kv;
  CT_TRY(lookup(g, key, required, &kv));
  if (!kv) return CT_OK;
  if (kv->type != CT_GGUF_BOOL) REFUSE("%s: metadata \"%s\" is %s, expected BOOL", g->path, key, VTYPE_NAMES[kv->type]);
  *out = kv->v.b;
  return CT_OK;
}

ct_status ct_gguf_get_str(const ct_gguf *g, const char *key, bool required, const char **out) {
  const ct_gguf_kv *kv;
  CT_TRY(lookup(g, key, required, &kv));
  if (!kv) return CT_OK;
  if (kv->type != CT_GGUF_STRING) REFUSE("%s: metadata \"%s\" is %s, expected STRING", g->path, key, VTYPE_NAMES[kv->type]);
  *out = kv->str;
  return CT_OK;
}

ct_status ct_gguf_get_array(const ct_gguf *g, const char *key, ct_gguf_vtype elem, bool required,
                            const ct_gguf_kv **out) {
  const ct_gguf_kv *kv;
  CT_TRY(lookup(g, key, required, &kv));
  if (!kv) return CT_OK;
  if (kv->type != CT_GGUF_ARRAY) REFUSE("%s: metadata \"%s\" is %s, expected an ARRAY", g->path, key, VTYPE_NAMES[kv->type]);
  if (elem != CT_GGUF_VTYPE_COUNT && kv->elem_type != elem &&
      !(is_int(elem) && is_int(kv->elem_type)))
    REFUSE("%s: metadata \"%s\" is an array of %s, expected %s", g->path, key,
           VTYPE_NAMES[kv->elem_type], VTYPE_NAMES[elem]);
  *out = kv;
  return CT_OK;
}

int64_t ct_gguf_array_int(const ct_gguf_kv *kv, uint64_t i) {
  const unsigned char *p = kv->data + i * (uint64_t)VTYPE_SIZE[kv->elem_type];
  switch (kv->elem_type) {
    case CT_GGUF_UINT8: case CT_GGUF_BOOL: return p[0];
    case CT_GGUF_INT8: return (int8_t)p[0];
    case CT_GGUF_UINT16: return le16(p);
    case CT_GGUF_INT16: return (int16_t)le16(p);
    case CT_GGUF_UINT32: return le32(p);
    case CT_GGUF_INT32: return (int32_t)le32(p);
    case CT_GGUF_UINT64: case CT_GGUF_INT64: return (int64_t)le64(p);
    default: return 0;
  }
}

/* ---------------------------------------------------------------- llama config */

static ct_status get_dim(const ct_gguf *g, const char *key, bool required, int *out) {
  if (!required && !ct_gguf_find_kv(g, key)) return CT_OK;
  int64_t v = 0;
  CT_TRY(ct_gguf_get_int(g, key, required, &v));
  if (v < 1 || v > INT_MAX) REFUSE("%s: metadata \"%s\" = %lld: must be a positive int", g->path, key, (long long)v);
  *out = (int)v;
  return CT_OK;
}

ct_status ct_gguf_read_config(const ct_gguf *g, ct_config *cfg) {
  const char *arch = NULL;
  CT_TRY(ct_gguf_get_str(g, "general.architecture", true, &arch));
  if (strcmp(arch, "llama"))
    REFUSE("%s: general.architecture = \"%.100s\" is not supported (only \"llama\")", g->path, arch);
  ct_config_defaults(cfg);
  ct_model_cfg *m = &cfg->model;
  memset(m->arch, 0, sizeof m->arch);
  snprintf(m->arch, sizeof m->arch, "llama");
  m->head_dim = m->n_kv_head = m->d_ff = 0;
  int64_t experts = 0;
  CT_TRY(ct_gguf_get_int(g, "llama.expert_count", false, &experts));
  if (experts > 0)
    REFUSE("%s: llama.expert_count = %lld: mixture-of-experts models are not supported", g->path, (long long)experts);
  CT_TRY(get_dim(g, "llama.block_count", true, &m->n_layer));
  CT_TRY(get_dim(g, "llama.embedding_length", true, &m->d_model));
  CT_TRY(get_dim(g, "llama.feed_forward_length", true, &m->d_ff));
  CT_TRY(get_dim(g, "llama.attention.head_count", true, &m->n_head));
  m->n_kv_head = m->n_head;
  CT_TRY(get_dim(g, "llama.attention.head_count_kv", false, &m->n_kv_head));
  m->max_seq_len = 2048;
  CT_TRY(get_dim(g, "llama.context_length", false, &m->max_seq_len));
  m->rope_theta = 10000.0;
  CT_TRY(ct_gguf_get_num(g, "llama.rope.freq_base", false, &m->rope_theta));
  m->norm_eps = 1e-5;
  CT_TRY(ct_gguf_get_num(g, "llama.attention.layer_norm_rms_epsilon", false, &m->norm_eps));
  if (m->d_model % m->n_head)
    REFUSE("%s: embedding_length %d is not a multiple of head_count %d", g->path, m->d_model, m->n_head);
  int hd = m->d_model / m->n_head, kl = 0, vl = 0;
  CT_TRY(get_dim(g, "llama.attention.key_length", false, &kl));
  CT_TRY(get_dim(g, "llama.attention.value_length", false, &vl));
  if (kl && vl && kl != vl)
    REFUSE("%s: llama.attention.key_length %d != value_length %d: not supported", g->path, kl, vl);
  if (kl || vl) hd = kl ? kl : vl;
  m->head_dim = hd;
  int rot = hd;
  CT_TRY(get_dim(g, "llama.rope.dimension_count", false, &rot));
  if (rot != hd)
    REFUSE("%s: llama.rope.dimension_count = %d but the head dimension is %d: partial RoPE is not"
           " supported", g->path, rot, hd);
  const char *scaling = NULL;
  CT_TRY(ct_gguf_get_str(g, "llama.rope.scaling.type", false, &scaling));
  double factor = 1.0;
  CT_TRY(ct_gguf_get_num(g, "llama.rope.scaling.factor", false, &factor));
  if ((scaling && strcmp(scaling, "none")) || (!scaling && factor != 1.0 && factor != 0.0))
    REFUSE("%s: llama.rope.scaling (type %s, factor %g): RoPE scaling is not supported", g->path,
           scaling ? scaling : "unset", factor);
  if (ct_gguf_find_tensor(g, "rope_freqs.weight"))
    REFUSE("%s: tensor rope_freqs.weight (Llama 3.1 style RoPE frequency scaling) is not supported", g->path);
  const ct_gguf_tensor *emb = ct_gguf_find_tensor(g, "token_embd.weight");
  const ct_gguf_kv *toks = NULL;
  if (ct_gguf_find_kv(g, "tokenizer.ggml.tokens"))
    CT_TRY(ct_gguf_get_array(g, "tokenizer.ggml.tokens", CT_GGUF_STRING, false, &toks));
  int vocab = 0;
  if (ct_gguf_find_kv(g, "llama.vocab_size")) CT_TRY(get_dim(g, "llama.vocab_size", true, &vocab));
  else if (toks && toks->n > 0 && toks->n <= INT_MAX) vocab = (int)toks->n;
  else if (emb && emb->n_dims == 2 && emb->ne[1] <= INT_MAX) vocab = (int)emb->ne[1];
  if (!vocab) REFUSE("%s: no llama.vocab_size, tokenizer.ggml.tokens or token_embd.weight to take the vocabulary size from", g->path);
  m->vocab_size = vocab;
  m->tie_embeddings = ct_gguf_find_tensor(g, "output.weight") == NULL;
  m->attn_bias = m->qk_norm = false;

  snprintf(cfg->data.tokenizer, CT_STR, "byte");
  const char *slash = strrchr(g->path, '/'), *base = slash ? slash + 1 : g->path;
  size_t bl = strlen(base);
  if (bl > 5 && !strcmp(base + bl - 5, ".gguf")) bl -= 5;
  snprintf(cfg->name, CT_STR, "%.*s", (int)(bl < CT_STR - 1 ? bl : CT_STR - 1), base);
  if (cfg->train.seq_len > m->max_seq_len) cfg->train.seq_len = m->max_seq_len;
  ct_status st = ct_config_validate(cfg);
  if (st != CT_OK) ct_add_context(st, "%s: ", g->path);
  return st;
}

/* ---------------------------------------------------------------- tensors -> parameter table */

/* Where one ctrain parameter comes from: up to 3 GGUF tensors stacked along rows, each possibly
 * with its rows permuted back from llama.cpp's RoPE layout (heads > 0). */
typedef struct gguf_map {
  int n;
  char name[3][128];
  int rows[3];
  int heads[3];     /* > 0: undo the q/k row permutation with this many heads */
} gguf_map;

static const struct { const char *ct, *gguf[3]; } LAYER_NAMES[] = {
  {"input_layernorm.weight", {"attn_norm.weight", NULL, NULL}},
  {"self_attn.qkv_proj.weight", {"attn_q.weight", "attn_k.weight", "attn_v.weight"}},
  {"self_attn.o_proj.weight", {"attn_output.weight", NULL, NULL}},
  {"post_attention_layernorm.weight", {"ffn_norm.weight", NULL, NULL}},
  {"mlp.gate_up_proj.weight", {"ffn_gate.weight", "ffn_up.weight", NULL}},
  {"mlp.down_proj.weight", {"ffn_down.weight", NULL, NULL}},
};

static ct_status map_param(const ct_model_cfg *c, const ct_param *p, gguf_map *mp) {
  memset(mp, 0, sizeof *mp);
  mp->n = 1;
  mp->rows[0] = p->shape[0];
  const char *global = !strcmp(p->name, "embed_tokens") ? "token_embd.weight"
                     : !strcmp(p->name, "lm_head") ? "output.weight"
                     : !strcmp(p->name, "norm.weight") ? "output_norm.weight" : NULL;
  if (global) {
    snprintf(mp->name[0], sizeof mp->name[0], "%s", global);
    if (p->ndim == 2) mp->rows[0] = c->vocab_size; /* padding rows stay zero */
    return CT_OK;
  }
  const char *dot = p->layer >= 0 ? strchr(p->name, '.') : NULL;
  dot = dot ? strchr(dot + 1, '.') : NULL; /* "layers.3." + suffix */
  for (size_t i = 0; dot && i < sizeof LAYER_NAMES / sizeof LAYER_NAMES[0]; i++) {
    if (strcmp(dot + 1, LAYER_NAMES[i].ct)) continue;
    const int hd = c->head_dim, qkv[3] = {c->n_head * hd, c->n_kv_head * hd, c->n_kv_head * hd};
    const bool is_qkv = LAYER_NAMES[i].gguf[2] != NULL, is_gu = !is_qkv && LAYER_NAMES[i].gguf[1];
    mp->n = is_qkv ? 3 : is_gu ? 2 : 1;
    int total = 0;
    for (int k = 0; k < mp->n; k++) {
      snprintf(mp->name[k], sizeof mp->name[k], "blk.%d.%s", p->layer, LAYER_NAMES[i].gguf[k]);
      mp->rows[k] = is_qkv ? qkv[k] : is_gu ? c->d_ff : p->shape[0];
      mp->heads[k] = is_qkv && k < 2 ? (k == 0 ? c->n_head : c->n_kv_head) : 0;
      total += mp->rows[k];
    }
    if (total != p->shape[0])
      return ct_set_error(CT_ERR_RUNTIME, "parameter %s: %d rows, but its GGUF parts have %d",
                          p->name, p->shape[0], total);
    return CT_OK;
  }
  return ct_set_error(CT_ERR_RUNTIME, "parameter %s has no GGUF counterpart", p->name);
}

static void fmt_ne(char *out, size_t cap, int nd, const int64_t *ne) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int i = 0; i < nd && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "", (long long)ne[i]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/* llama.cpp's converter stores, per head of hd rows, HF row s * hd/2 + i at row 2i + s
 * (s = 0, 1; i < hd/2): interleaved pairs for ggml's RoPE. This puts them back. */
static void unpermute_rows(const float *src, float *dst, int heads, int hd, size_t cols) {
  const int half = hd / 2;
  for (int h = 0; h < heads; h++)
    for (int i = 0; i < half; i++)
      for (int s = 0; s < 2; s++)
        memcpy(dst + ((size_t)h * hd + (size_t)s * half + i) * cols,
               src + ((size_t)h * hd + 2 * (size_t)i + s) * cols, cols * sizeof(float));
}

static ct_status fill_params(const ct_gguf *g, const ct_model *m, float *host) {
  const ct_model_cfg *c = ct_model_config(m);
  unsigned char *used = ct_calloc((size_t)g->n_t + 1, 1, "import bookkeeping");
  float *scratch = NULL;
  size_t cap = 0;
  ct_status st = used ? CT_OK : CT_ERR_NOMEM;
  char want[64], got[64];
  for (int i = 0; i < ct_model_n_params(m) && st == CT_OK; i++) {
    const ct_param *p = ct_model_param(m, i);
    gguf_map mp;
    CT_TRY_GOTO(map_param(c, p, &mp), done);
    const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
    size_t row0 = 0;
    for (int k = 0; k < mp.n; k++) {
      const ct_gguf_tensor *t = ct_gguf_find_tensor(g, mp.name[k]);
      if (!t) {
        st = ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\" missing (needed for ctrain parameter %s)",
                          g->path, mp.name[k], p->name);
        goto done;
      }
      const int nd = p->ndim;
      const int64_t ne[2] = {p->ndim == 2 ? (int64_t)cols : mp.rows[k], mp.rows[k]};
      if (t->n_dims != nd || t->ne[0] != ne[0] || (nd == 2 && t->ne[1] != ne[1])) {
        fmt_ne(want, sizeof want, nd, ne);
        fmt_ne(got, sizeof got, t->n_dims, t->ne);
        st = ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\" has ne %s, but the metadata implies %s",
                          g->path, t->name, got, want);
        goto done;
      }
      if (mp.heads[k] && (c->head_dim % 2 || (int64_t)mp.heads[k] * c->head_dim != mp.rows[k])) {
        st = ct_set_error(CT_ERR_INPUT, "%s: tensor \"%s\": %d rows do not split into %d heads of an"
                          " even size", g->path, t->name, mp.rows[k], mp.heads[k]);
        goto done;
      }
      used[t - g->t] = 1;
      const size_t numel = (size_t)t->numel;
      if (numel > cap) {
        float *grown = realloc(scratch, numel * sizeof(float));
        if (!grown) { st = ct_set_error(CT_ERR_NOMEM, "out of memory for tensor %s", t->name); goto done; }
        scratch = grown;
        cap = numel;
      }
      CT_TRY_GOTO(ct_gguf_read_f32(g, t, scratch), done);
      float *dst = host + p->offset + row0 * cols;
      if (mp.heads[k]) unpermute_rows(scratch, dst, mp.heads[k], c->head_dim, cols);
      else memcpy(dst, scratch, numel * sizeof(float));
      row0 += (size_t)mp.rows[k];
    }
  }
  for (int i = 0; i < g->n_t && st == CT_OK; i++)
    if (!used[i])
      st = ct_set_error(CT_ERR_INPUT, "%s: unexpected tensor \"%s\": it has no place in a llama"
                        " model with this metadata", g->path, g->t[i].name);
done:
  free(scratch);
  free(used);
  return st;
}

ct_status ct_gguf_load(const ct_gguf *g, const ct_ops *ops, int max_B, int max_T, ct_config *cfg,
                       ct_model **out) {
  *out = NULL;
  CT_TRY(ct_gguf_read_config(g, cfg));
  ct_model *m = NULL;
  float *host = NULL;
  ct_status st = CT_OK;
  CT_TRY_GOTO(ct_model_create(&cfg->model, ops, max_B, max_T, &m), fail);
  host = ct_calloc(ct_model_numel(m), sizeof(float), "import staging");
  if (!host) { st = CT_ERR_NOMEM; goto fail; }
  CT_TRY_GOTO(fill_params(g, m, host), fail);
  ops->to_device(ct_model_params(m), host, ct_model_numel(m) * sizeof(float));
  free(host);
  *out = m;
  return CT_OK;
fail:
  free(host);
  ct_model_destroy(m);
  return st;
}

/* ---------------------------------------------------------------- tokenizer.json */

/* GPT-2's byte-level alphabet: bytes 33..126, 161..172 and 174..255 stand for themselves, the
 * other 68 bytes for U+0100.. in byte order. */
static uint32_t byte_char(unsigned b) {
  static uint32_t map[256];
  static bool init;
  if (!init) { /* idempotent: concurrent first calls write the same values */
    uint32_t next = 256;
    for (unsigned x = 0; x < 256; x++)
      map[x] = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174) ? x : next++;
    init = true;
  }
  return map[b & 255];
}

static bool in_alphabet(uint32_t cp) {
  return (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255) ||
         (cp >= 256 && cp < 256 + 68);
}

static size_t put_utf8(char *o, uint32_t cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
  o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63));
  return 3;
}

/* Decodes one UTF-8 character of s[0..n) (strictly: no overlongs, no surrogates); 0 if invalid. */
static size_t get_utf8(const unsigned char *s, size_t n, uint32_t *cp) {
  if (!n) return 0;
  unsigned c = s[0];
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (!len || len > n) return 0;
  uint32_t v = len == 1 ? c : c & (0x7Fu >> len);
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (s[i] & 63);
  }
  static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < min[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

/* The vocab key of a GGUF token: itself when every character is in the byte-level alphabet
 * (always, for tokens a byte-level converter wrote), else its UTF-8 bytes spelled in the
 * alphabet (as Transformers' GGUF tokenizer builder does). out holds 3 * n + 1 bytes. */
static void vocab_key(const char *tok, size_t n, char *out) {
  const unsigned char *s = (const unsigned char *)tok;
  bool all = n > 0;
  for (size_t i = 0; i < n && all;) {
    uint32_t cp;
    size_t l = get_utf8(s + i, n - i, &cp);
    if (!l || !in_alphabet(cp)) all = false;
    i += l ? l : 1;
  }
  size_t o = 0;
  if (all) memcpy(out, tok, n), o = n;
  else for (size_t i = 0; i < n; i++) o += put_utf8(out + o, byte_char(s[i]));
  out[o] = '\0';
}

static const char *const DIGITS_PRE[] = {"smollm", "starcoder", "refact", "codeshell", NULL};
static const char *const LLAMA3_PRE[] = {"llama3", "llama-bpe", "llama-v3", "smaug-bpe", NULL};
static const char *const QWEN2_PRE[] = {"qwen2", "deepseek-r1-qwen", NULL};
/* The split regexes of those families' tokenizer.json files. */
#define LLAMA3_REGEX "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_REGEX "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static bool listed(const char *const *list, const char *s) {
  for (; *list; list++)
    if (!strcmp(*list, s)) return true;
  return false;
}

static cJSON *byte_level(bool use_regex) {
  cJSON *b = cJSON_CreateObject();
  cJSON_AddStringToObject(b, "type", "ByteLevel");
  cJSON_AddBoolToObject(b, "add_prefix_space", 0);
  cJSON_AddBoolToObject(b, "trim_offsets", 1);
  cJSON_AddBoolToObject(b, "use_regex", use_regex);
  return b;
}

static cJSON *split(const char *regex) {
  cJSON *s = cJSON_CreateObject();
  cJSON_AddStringToObject(s, "type", "Split");
  cJSON_AddStringToObject(cJSON_AddObjectToObject(s, "pattern"), "Regex", regex);
  cJSON_AddStringToObject(s, "behavior", "Isolated");
  cJSON_AddBoolToObject(s, "invert", 0);
  return s;
}

static ct_status pre_tokenizer(const ct_gguf *g, cJSON **out) {
  const char *pre = "default";
  CT_TRY(ct_gguf_get_str(g, "tokenizer.ggml.pre", false, &pre));
  const char *regex = listed(DIGITS_PRE, pre) ? "\\p{N}" : listed(LLAMA3_PRE, pre) ? LLAMA3_REGEX
                    : listed(QWEN2_PRE, pre) ? QWEN2_REGEX : NULL;
  if (!regex && strcmp(pre, "default") && strcmp(pre, "gpt2") && strcmp(pre, "gpt-2"))
    REFUSE("%s: tokenizer.ggml.pre = \"%.100s\" is not supported (known: default, gpt2, smollm,"
           " starcoder, refact, codeshell, llama3, llama-bpe, llama-v3, smaug-bpe, qwen2,"
           " deepseek-r1-qwen)", g->path, pre);
  if (!regex) { *out = byte_level(true); return CT_OK; }
  cJSON *seq = cJSON_CreateObject();
  cJSON_AddStringToObject(seq, "type", "Sequence");
  cJSON *steps = cJSON_AddArrayToObject(seq, "pretokenizers");
  cJSON_AddItemToArray(steps, split(regex));
  /* digits only split off: the GPT-2 regex still runs; the others replace it */
  cJSON_AddItemToArray(steps, byte_level(listed(DIGITS_PRE, pre)));
  *out = seq;
  return CT_OK;
}

/* Builds the tokenizer.json text (malloc'd) from the file's tokenizer metadata. */
static ct_status tokenizer_json(const ct_gguf *g, char **text) {
  *text = NULL;
  const char *model = NULL;
  CT_TRY(ct_gguf_get_str(g, "tokenizer.ggml.model", true, &model));
  if (strcmp(model, "gpt2"))
    REFUSE("%s: tokenizer.ggml.model = \"%.100s\" is not supported (only \"gpt2\", byte-level BPE)",
           g->path, model);
  const ct_gguf_kv *toks = NULL, *merges = NULL, *types = NULL;
  CT_TRY(ct_gguf_get_array(g, "tokenizer.ggml.tokens", CT_GGUF_STRING, true, &toks));
  CT_TRY(ct_gguf_get_array(g, "tokenizer.ggml.merges", CT_GGUF_STRING, true, &merges));
  CT_TRY(ct_gguf_get_array(g, "tokenizer.ggml.token_type", CT_GGUF_INT32, false, &types));
  if (toks->n > INT32_MAX) REFUSE("%s: tokenizer.ggml.tokens: %llu tokens", g->path, (ull)toks->n);
  if (types && types->n != toks->n)
    REFUSE("%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", g->path,
           (ull)types->n, (ull)toks->n);
  cJSON *pre = NULL;
  CT_TRY(pre_tokenizer(g, &pre));

  size_t kcap = 0;
  for (uint64_t i = 0; i < toks->n; i++) kcap = toks->lens[i] > kcap ? toks->lens[i] : kcap;
  for (uint64_t i = 0; i < merges->n; i++) kcap = merges->lens[i] > kcap ? merges->lens[i] : kcap;
  char *key = malloc(3 * kcap + 1);
  cJSON *root = cJSON_CreateObject();
  ct_status st = CT_OK;
  if (!key || !root) { st = ct_set_error(CT_ERR_NOMEM, "out of memory building tokenizer.json"); goto done; }
  cJSON_AddStringToObject(root, "version", "1.0");
  cJSON_AddNullToObject(root, "truncation");
  cJSON_AddNullToObject(root, "padding");
  cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
  for (uint64_t i = 0; types && i < toks->n; i++) {
    const int64_t ty = ct_gguf_array_int(types, i); /* 3 CONTROL, 4 USER_DEFINED */
    if ((ty != 3 && ty != 4) || !toks->lens[i] || memchr(toks->strs[i], 0, (size_t)toks->lens[i])) continue;
    memcpy(key, toks->strs[i], (size_t)toks->lens[i]);
    key[toks->lens[i]] = '\0';
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", (double)i);
    cJSON_AddStringToObject(a, "content", key);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", ty == 3);
    cJSON_AddItemToArray(added, a);
  }
  cJSON_AddNullToObject(root, "normalizer");
  cJSON_AddItemToObject(root, "pre_tokenizer", pre);
  pre = NULL;
  cJSON_AddNullToObject(root, "post_processor");
  cJSON *dec = byte_level(true);
  cJSON_ReplaceItemInObject(dec, "add_prefix_space", cJSON_CreateBool(1));
  cJSON_AddItemToObject(root, "decoder", dec);
  cJSON *bpe = cJSON_AddObjectToObject(root, "model");
  cJSON_AddStringToObject(bpe, "type", "BPE");
  cJSON_AddNullToObject(bpe, "dropout");
  cJSON_AddNullToObject(bpe, "unk_token");
  cJSON_AddNullToObject(bpe, "continuing_subword_prefix");
  cJSON_AddNullToObject(bpe, "end_of_word_suffix");
  cJSON_AddBoolToObject(bpe, "fuse_unk", 0);
  cJSON_AddBoolToObject(bpe, "byte_fallback", 0);
  cJSON_AddBoolToObject(bpe, "ignore_merges", 0);
  cJSON *vocab = cJSON_AddObjectToObject(bpe, "vocab");
  for (uint64_t i = 0; i < toks->n; i++) {
    vocab_key(toks->strs[i], (size_t)toks->lens[i], key);
    if (!key[0]) continue; /* an empty token can never be produced */
    cJSON_AddNumberToObject(vocab, key, (double)i);
  }
  cJSON *ml = cJSON_AddArrayToObject(bpe, "merges");
  for (uint64_t i = 0; i < merges->n; i++) {
    if (memchr(merges->strs[i], 0, (size_t)merges->lens[i])) {
      st = ct_set_error(CT_ERR_INPUT, "%s: tokenizer.ggml.merges[%llu] holds a NUL byte", g->path, (ull)i);
      goto done;
    }
    memcpy(key, merges->strs[i], (size_t)merges->lens[i]);
    key[merges->lens[i]] = '\0';
    cJSON_AddItemToArray(ml, cJSON_CreateString(key));
  }
  *text = cJSON_PrintUnformatted(root);
  if (!*text) st = ct_set_error(CT_ERR_NOMEM, "out of memory writing tokenizer.json");
done:
  cJSON_Delete(pre);
  cJSON_Delete(root);
  free(key);
  return st;
}

static ct_status write_text(const char *path, const char *text) {
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return ct_set_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  const size_t n = strlen(text);
  bool ok = fwrite(text, 1, n, f) == n;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return ct_set_error(CT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  }
  return CT_OK;
}

ct_status ct_gguf_write_tokenizer(const ct_gguf *g, const char *path) {
  char *text = NULL;
  CT_TRY(tokenizer_json(g, &text));
  ct_status st = write_text(path, text);
  free(text);
  return st;
}

/* ---------------------------------------------------------------- import */

ct_status ct_gguf_import(const char *path, const char *out_ckpt) {
  ct_gguf *g = NULL;
  CT_TRY(ct_gguf_open(path, &g));
  ct_config cfg;
  ct_model *m = NULL;
  char *tok_text = NULL, abs_dir[PATH_MAX + 8], tok_path[PATH_MAX + 32];
  ct_status st = CT_OK;
  /* the tokenizer path the config records: absolute, so generate finds it from any directory */
  if (out_ckpt[0] == '/') {
    snprintf(abs_dir, sizeof abs_dir, "%s", out_ckpt);
  } else {
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) { st = ct_set_error(CT_ERR_IO, "import-gguf: getcwd: %s", strerror(errno)); goto done; }
    snprintf(abs_dir, sizeof abs_dir, "%s/%s", cwd, out_ckpt);
  }
  for (size_t n = strlen(abs_dir); n > 1 && abs_dir[n - 1] == '/'; n--) abs_dir[n - 1] = '\0';
  snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", abs_dir);
  if (strlen(tok_path) >= CT_STR) {
    st = ct_set_error(CT_ERR_USAGE, "import-gguf: %s: the tokenizer path would be longer than %d"
                      " bytes (data.tokenizer's limit): choose a shorter OUT_CKPT", tok_path, CT_STR - 1);
    goto done;
  }
  CT_TRY_GOTO(tokenizer_json(g, &tok_text), done); /* before anything is written */
  CT_TRY_GOTO(ct_gguf_load(g, ct_ops_cpu(), 1, 1, &cfg, &m), done);
  snprintf(cfg.data.tokenizer, CT_STR, "%s", tok_path);
  CT_TRY_GOTO(ct_checkpoint_write_dir(out_ckpt, 0, &cfg, m, NULL), done);
  st = write_text(tok_path, tok_text);
  if (st != CT_OK) ct_add_context(st, "import-gguf: the checkpoint %s was written, but its tokenizer was not: ", out_ckpt);
done:
  free(tok_text);
  ct_model_destroy(m);
  ct_gguf_close(g);
  return st;
}

static const char *IMPORT_USAGE =
    "usage: ctrain import-gguf FILE.gguf OUT_CKPT\n"
    "  FILE.gguf  a llama-architecture GGUF model (F32, F16, BF16, Q8_0, Q4_0, Q4_1 tensors are\n"
    "             dequantized to fp32) with a byte-level BPE (gpt2) tokenizer\n"
    "  OUT_CKPT   the ctrain checkpoint directory to write (weights only, with tokenizer.json;\n"
    "             data.tokenizer records its absolute path)\n";

ct_status ct_cmd_import_gguf(int argc, char **argv) {
  if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
    fputs(IMPORT_USAGE, stdout);
    return CT_OK;
  }
  for (int i = 0; i < argc; i++)
    if (argv[i][0] == '-')
      return ct_set_error(CT_ERR_USAGE, "import-gguf: unknown argument %s\n%s", argv[i], IMPORT_USAGE);
  if (argc != 2)
    return ct_set_error(CT_ERR_USAGE, "import-gguf: expected FILE.gguf and OUT_CKPT (got %d"
                        " arguments)\n%s", argc, IMPORT_USAGE);
  const double t0 = ct_now();
  CT_TRY(ct_gguf_import(argv[0], argv[1]));
  ct_config cfg;
  char model_file[4200];
  CT_TRY(ct_checkpoint_read_config(argv[1], &cfg, model_file, sizeof model_file));
  ct_log_info("import-gguf: %s -> %s: arch %s, %d layers, d_model %d, %d/%d heads, vocab %d"
              " (padded to %d), tied %s, tokenizer %s (%.2f s)", argv[0], argv[1], cfg.model.arch,
              cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head, cfg.model.n_kv_head,
              cfg.model.vocab_size, ct_model_padded_vocab(&cfg.model),
              cfg.model.tie_embeddings ? "yes" : "no", cfg.data.tokenizer, ct_now() - t0);
  return CT_OK;
}
