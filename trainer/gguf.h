/* trainer/gguf.h — GGUF files (llama.cpp's model format): a validating reader, dequantization to
 * fp32, and `ctrain import-gguf` for llama-architecture models.
 *
 * Reader. The file is mapped read-only; ct_gguf_open parses the header (magic "GGUF", version 2
 * or 3, little-endian), every metadata key/value (all 13 value types, arrays of any of them,
 * nested arrays included) and every tensor info, and checks each count, length and offset
 * against the file size before it is used: string and array lengths against the bytes left,
 * general.alignment (a power of two, default 32), tensor offsets (aligned, data inside the file),
 * dimensions (1..4, each >= 1, the first a multiple of the type's block size), unique keys and
 * tensor names. Anything wrong is CT_ERR_INPUT with a message naming the file and the key or
 * tensor. Parsed keys, strings and tensor names are copied (NUL-terminated); string arrays
 * point into the mapping with a length each (GGUF strings are not NUL-terminated).
 *
 * Tensor types. GGUF dims run fastest-first: ne[0] is the row length (PyTorch's last dim), so a
 * (out, in) PyTorch matrix is ne = {in, out}; quantization blocks run along ne[0].
 * ct_gguf_read_f32 dequantizes F32, F16, BF16, Q8_0, Q4_0 and Q4_1 (what small llama GGUFs such as
 * SmolLM2-135M Q4_1 use); other known types (K-quants, Q5_x, IQ*) open fine and are refused by
 * name when read.
 *   Q8_0: 34-byte blocks of 32: f16 d, int8 q[32]; x = d * q
 *   Q4_0: 18-byte blocks of 32: f16 d, uint8 qs[16]; x[j] = d * ((qs[j] & 15) - 8),
 *         x[j + 16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1: 20-byte blocks of 32: f16 d, f16 m, uint8 qs[16]; x = d * nibble + m (same order)
 *
 * import-gguf (general.architecture "llama" only; others are refused by name). Metadata maps to
 * ct_config.model: llama.block_count -> n_layer, embedding_length -> d_model,
 * feed_forward_length -> d_ff, attention.head_count(_kv) -> n_head (n_kv_head),
 * rope.freq_base -> rope_theta, attention.layer_norm_rms_epsilon -> norm_eps,
 * context_length -> max_seq_len, llama.vocab_size (else the token list, else token_embd's rows)
 * -> vocab_size; tie_embeddings when there is no output.weight. RoPE scaling, partial RoPE
 * (rope.dimension_count != head_dim) and key/value lengths that differ are refused.
 * Tensors: token_embd -> embed_tokens, blk.N.attn_norm -> input_layernorm,
 * [attn_q; attn_k; attn_v] -> qkv_proj, attn_output -> o_proj, ffn_norm ->
 * post_attention_layernorm, [ffn_gate; ffn_up] -> gate_up_proj, ffn_down -> down_proj,
 * output_norm -> norm, output -> lm_head. llama.cpp's converter permutes the rows of q and k
 * within each head for its interleaved RoPE (HF row s*hd/2 + i is GGUF row 2i + s, s = 0, 1;
 * heads of q counted with head_count, of k with head_count_kv); the import undoes it, so the
 * weights are the HF ones that ctrain's rotate-half RoPE expects. Every GGUF tensor must be used.
 *
 * Tokenizer: tokenizer.ggml.model "gpt2" (byte-level BPE) becomes a Hugging Face tokenizer.json in
 * the checkpoint directory: vocab from tokenizer.ggml.tokens, merges, CONTROL tokens (type 3) as
 * special added tokens and USER_DEFINED ones (type 4) as plain added tokens, and the
 * pre-tokenizer that tokenizer.ggml.pre names (the model's own tokenizer.json layout):
 *   "default", "gpt2" (or absent)                      ByteLevel (GPT-2 regex)
 *   "smollm", "starcoder", "refact", "codeshell"       Split(\p{N}, Isolated) + ByteLevel
 *   "llama3", "llama-bpe", "llama-v3", "smaug-bpe"     Split(Llama-3 regex) + ByteLevel(no regex)
 *   "qwen2", "deepseek-r1-qwen"                        Split(Qwen2 regex) + ByteLevel(no regex)
 * Other tokenizer models or pre-tokenizers are refused (a wrong tokenizer is worse than none).
 * The checkpoint's data.tokenizer is the absolute path of that tokenizer.json (ctrain generate
 * loads data.tokenizer as given, relative to the working directory, so an absolute path works
 * from anywhere; a moved checkpoint needs data.tokenizer updated, as with import-hf).
 */
#ifndef CT_GGUF_H
#define CT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/ops.h"
#include "trainer/config.h"
#include "trainer/model.h"

/* Metadata value types (numbering as in the file). */
typedef enum ct_gguf_vtype {
  CT_GGUF_UINT8 = 0, CT_GGUF_INT8 = 1, CT_GGUF_UINT16 = 2, CT_GGUF_INT16 = 3,
  CT_GGUF_UINT32 = 4, CT_GGUF_INT32 = 5, CT_GGUF_FLOAT32 = 6, CT_GGUF_BOOL = 7,
  CT_GGUF_STRING = 8, CT_GGUF_ARRAY = 9, CT_GGUF_UINT64 = 10, CT_GGUF_INT64 = 11,
  CT_GGUF_FLOAT64 = 12, CT_GGUF_VTYPE_COUNT
} ct_gguf_vtype;

/* Tensor types (ggml's numbering). */
typedef enum ct_ggml_type {
  CT_GGML_F32 = 0, CT_GGML_F16 = 1, CT_GGML_Q4_0 = 2, CT_GGML_Q4_1 = 3, CT_GGML_Q5_0 = 6,
  CT_GGML_Q5_1 = 7, CT_GGML_Q8_0 = 8, CT_GGML_Q8_1 = 9, CT_GGML_Q2_K = 10, CT_GGML_Q3_K = 11,
  CT_GGML_Q4_K = 12, CT_GGML_Q5_K = 13, CT_GGML_Q6_K = 14, CT_GGML_Q8_K = 15, CT_GGML_I8 = 24,
  CT_GGML_I16 = 25, CT_GGML_I32 = 26, CT_GGML_I64 = 27, CT_GGML_F64 = 28, CT_GGML_BF16 = 30,
  CT_GGML_TYPE_COUNT = 31
} ct_ggml_type;

typedef struct ct_gguf_kv {
  char *key;
  ct_gguf_vtype type;
  /* scalars: the value widened (u for unsigned, i for signed, f for floats, b for bool) */
  union { uint64_t u; int64_t i; double f; bool b; } v;
  char *str;                  /* STRING: NUL-terminated copy (may hold NULs: see str_len) */
  uint64_t str_len;
  /* ARRAY */
  ct_gguf_vtype elem_type;
  uint64_t n;                 /* elements */
  const unsigned char *data;  /* fixed-size elements, little-endian, in the mapping */
  const char **strs;          /* (n) STRING elements: pointers into the mapping, not NUL-terminated */
  uint64_t *lens;             /* (n) their lengths */
} ct_gguf_kv;

typedef struct ct_gguf_tensor {
  char *name;
  int n_dims;                 /* 1..4 */
  int64_t ne[4];              /* ne[0] fastest (row length); unused dims are 1 */
  ct_ggml_type type;
  uint64_t offset;            /* absolute file offset of the data */
  uint64_t nbytes;
  int64_t numel;
} ct_gguf_tensor;

typedef struct ct_gguf ct_gguf;

/* Maps and parses `path` (see the checks above). On failure *out is NULL. */
ct_status ct_gguf_open(const char *path, ct_gguf **out);
void ct_gguf_close(ct_gguf *g); /* NULL is fine */

const char *ct_gguf_path(const ct_gguf *g);
uint32_t ct_gguf_version(const ct_gguf *g);
uint64_t ct_gguf_alignment(const ct_gguf *g);
uint64_t ct_gguf_data_offset(const ct_gguf *g); /* start of the tensor data section */

int ct_gguf_n_kv(const ct_gguf *g);
const ct_gguf_kv *ct_gguf_kv_at(const ct_gguf *g, int i);
const ct_gguf_kv *ct_gguf_find_kv(const ct_gguf *g, const char *key); /* NULL if absent */

/* Typed getters. Absent keys leave *out alone (CT_ERR_INPUT "missing" when required); a value of
 * another kind is CT_ERR_INPUT naming file, key and both types. get_int accepts every integer
 * type (and checks the value fits int64); get_num every integer and float type. */
ct_status ct_gguf_get_int(const ct_gguf *g, const char *key, bool required, int64_t *out);
ct_status ct_gguf_get_num(const ct_gguf *g, const char *key, bool required, double *out);
ct_status ct_gguf_get_bool(const ct_gguf *g, const char *key, bool required, bool *out);
ct_status ct_gguf_get_str(const ct_gguf *g, const char *key, bool required, const char **out);
/* An array key whose elements are `elem` (CT_GGUF_VTYPE_COUNT: any). */
ct_status ct_gguf_get_array(const ct_gguf *g, const char *key, ct_gguf_vtype elem, bool required,
                            const ct_gguf_kv **out);
/* Element i (< kv->n) of an integer array as int64 (unsigned 64-bit values above INT64_MAX
 * come out negative; callers range-check). */
int64_t ct_gguf_array_int(const ct_gguf_kv *kv, uint64_t i);

int ct_gguf_n_tensors(const ct_gguf *g);
const ct_gguf_tensor *ct_gguf_tensor_at(const ct_gguf *g, int i);
const ct_gguf_tensor *ct_gguf_find_tensor(const ct_gguf *g, const char *name); /* NULL if absent */

/* Dequantizes tensor t into dst (t->numel floats, in file order: ne[0] fastest). */
ct_status ct_gguf_read_f32(const ct_gguf *g, const ct_gguf_tensor *t, float *dst);

/* Dequantizes n values of `type` from src (exactly the bytes n values take) into dst. n must
 * be a multiple of the block size. For tests and other readers. */
ct_status ct_gguf_dequantize(ct_ggml_type type, const void *src, size_t src_bytes, float *dst,
                             int64_t n);

const char *ct_gguf_vtype_name(ct_gguf_vtype t);
const char *ct_ggml_type_name(ct_ggml_type t); /* "F32", "Q4_1", ...; "?" for unknown */
/* Values per block and bytes per block; 0 for unknown types. */
int ct_ggml_block_size(ct_ggml_type t);
size_t ct_ggml_type_size(ct_ggml_type t);
bool ct_ggml_can_dequantize(ct_ggml_type t);
/* IEEE half / bfloat16 bits -> float (exact; subnormals, infinities and NaNs included). */
float ct_gguf_f16_to_f32(uint16_t h);
float ct_gguf_bf16_to_f32(uint16_t h);

/* Reads the llama metadata into a validated ct_config (defaults for everything else; name = the
 * file's base name without .gguf; data.tokenizer left "byte"). */
ct_status ct_gguf_read_config(const ct_gguf *g, ct_config *cfg);

/* Builds a model on `ops` (activations for max_B x max_T) from the file's tensors. */
ct_status ct_gguf_load(const ct_gguf *g, const ct_ops *ops, int max_B, int max_T, ct_config *cfg,
                       ct_model **out);

/* Writes the file's tokenizer as a Hugging Face tokenizer.json at `path` (see above). */
ct_status ct_gguf_write_tokenizer(const ct_gguf *g, const char *path);

/* import-gguf: FILE -> a weights-only checkpoint directory OUT_CKPT (ct_checkpoint_write_dir)
 * holding tokenizer.json, with data.tokenizer its absolute path. */
ct_status ct_gguf_import(const char *path, const char *out_ckpt);

/* `ctrain import-gguf FILE.gguf OUT_CKPT` (argv[0] is the first argument after the command). */
ct_status ct_cmd_import_gguf(int argc, char **argv);

#endif
