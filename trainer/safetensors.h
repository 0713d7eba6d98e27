/* trainer/safetensors.h — safetensors files: a validating reader, a writer, sharded sets.
 *
 * Format: u64 little-endian header length N, N bytes of JSON, then the data buffer.
 * The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the data buffer), with an optional "__metadata__" object of strings.
 *
 * ct_st_open() validates the whole header before any tensor byte is read: N within the
 * 100,000,000-byte limit and the file, a JSON object, known dtypes, non-negative integer
 * shapes, [begin, end] with end - begin == numel * dtype size, no duplicate names, and the
 * tensors tiling the data buffer exactly (sorted by begin: no overlap, no gap, nothing left
 * over). Every problem is CT_ERR_INPUT with its own message naming the file and the tensor.
 * Reads use pread on the open descriptor; F32, F16, BF16 (and F64) convert to fp32.
 *
 * A ct_st_set is what a Hugging Face checkpoint directory holds: one model.safetensors, or
 * shards listed by model.safetensors.index.json ("weight_map": tensor -> file), checked both
 * ways (every mapped tensor is in its file, every tensor of every shard is mapped to it).
 *
 * Host byte order must be little-endian (checked at compile time in the .c file).
 */
#ifndef CT_SAFETENSORS_H
#define CT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define CT_ST_MAX_HEADER 100000000ull
#define CT_ST_MAX_DIMS 8

typedef enum ct_st_dtype {
  CT_ST_BOOL, CT_ST_U8, CT_ST_I8, CT_ST_F8_E5M2, CT_ST_F8_E4M3, CT_ST_I16, CT_ST_U16, CT_ST_F16,
  CT_ST_BF16, CT_ST_I32, CT_ST_U32, CT_ST_F32, CT_ST_F64, CT_ST_I64, CT_ST_U64,
  CT_ST_N_DTYPES
} ct_st_dtype;

const char *ct_st_dtype_name(ct_st_dtype d);   /* "F32", ... */
size_t ct_st_dtype_size(ct_st_dtype d);        /* bytes per element */
/* Parses a dtype name (exact, upper case); false when unknown. */
bool ct_st_dtype_parse(const char *s, ct_st_dtype *out);

typedef struct ct_st_tensor {
  const char *name;                 /* owned by the file */
  ct_st_dtype dtype;
  int ndim;                         /* 0 (scalar) .. CT_ST_MAX_DIMS */
  int64_t shape[CT_ST_MAX_DIMS];
  uint64_t numel;
  uint64_t begin, end;              /* byte range in the data buffer */
  int file;                         /* shard index within a ct_st_set (0 for a single file) */
} ct_st_tensor;

/* ---- one file ---- */

typedef struct ct_st_file ct_st_file;

/* Opens and validates `path` (see above). The handle keeps the descriptor open. */
ct_status ct_st_open(const char *path, ct_st_file **out);
void ct_st_close(ct_st_file *f);
const char *ct_st_path(const ct_st_file *f);
int ct_st_n_tensors(const ct_st_file *f);
const ct_st_tensor *ct_st_tensor_at(const ct_st_file *f, int i); /* sorted by name */
const ct_st_tensor *ct_st_find(const ct_st_file *f, const char *name); /* NULL if absent */
/* __metadata__ value for key, NULL when absent. */
const char *ct_st_metadata(const ct_st_file *f, const char *key);
/* Reads tensor t (of this file) into out[numel] as fp32. F32/F16/BF16/F64 only: other dtypes
 * are CT_ERR_INPUT naming the tensor; a short read is CT_ERR_IO. */
ct_status ct_st_read_f32(const ct_st_file *f, const ct_st_tensor *t, float *out);

/* ---- writing ---- */

/* Fills dst[numel] with the fp32 values of output tensor i (for tensors with data == NULL). */
typedef void (*ct_st_fill_fn)(void *user, int i, float *dst);

typedef struct ct_st_out {
  const char *name;
  ct_st_dtype dtype;                /* F32, F16 or BF16: fp32 values are converted (RNE) */
  int ndim;
  int64_t shape[CT_ST_MAX_DIMS];
  const float *data;                /* numel values in C order, or NULL: use the fill callback */
} ct_st_out;

/* Writes tensors in the given order (header order = data order) with optional metadata
 * (n_meta key/value pairs in meta[2*i], meta[2*i+1]). The header is padded with spaces so the
 * data buffer starts at a multiple of 8 bytes. Written to path.tmp and renamed over path. */
ct_status ct_st_write(const char *path, const ct_st_out *tensors, int n, const char *const *meta,
                      int n_meta, ct_st_fill_fn fill, void *user);

/* ---- sharded sets ---- */

typedef struct ct_st_set ct_st_set;

/* `path`: a directory (holding model.safetensors, else model.safetensors.index.json), a
 * .safetensors file, or an index .json file. */
ct_status ct_st_set_open(const char *path, ct_st_set **out);
void ct_st_set_close(ct_st_set *s);
int ct_st_set_n_tensors(const ct_st_set *s);
const ct_st_tensor *ct_st_set_tensor(const ct_st_set *s, int i); /* sorted by name */
const ct_st_tensor *ct_st_set_find(const ct_st_set *s, const char *name);
int ct_st_set_n_files(const ct_st_set *s);
const ct_st_file *ct_st_set_file(const ct_st_set *s, int i);
ct_status ct_st_set_read_f32(const ct_st_set *s, const ct_st_tensor *t, float *out);

/* ---- fp16 / bf16 conversions (exposed for tests) ---- */

float ct_st_bf16_to_f32(uint16_t h);
float ct_st_f16_to_f32(uint16_t h);
/* Round to nearest, ties to even; overflow gives inf; NaN stays a (quiet) NaN with its sign. */
uint16_t ct_st_f32_to_bf16(float f);
uint16_t ct_st_f32_to_f16(float f);

#endif
