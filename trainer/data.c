/* trainer/data.c — byte tokenizer, streaming HDF5 token writer, metadata reader and loader.
 *
 * Layout and contracts are in data.h. Notes on choices made here:
 * - Chunks are 64 Ki tokens (fewer for small files). With the Fletcher32 filter HDF5 must read
 *   and checksum a whole chunk to serve any part of it, so a random T+1 window in a large file
 *   costs one or two chunk reads (128-256 KiB for uint16); 1 Mi-token chunks would make that 16x.
 * - Files whose tokens take <= 64 MiB are read into memory once at open (the validation scan
 *   reads them anyway); larger files are read per window with hyperslab selections. The
 *   environment variable CT_DATA_CACHE_MAX_BYTES overrides the 64 MiB (tests set 0 to exercise
 *   the hyperslab path).
 * - Every HDF5 call is checked. HDF5's own error printing is turned off; our messages name the
 *   path and what was expected, and append HDF5's innermost error description when useful.
 * - Object modification times are not recorded, so the same tokens give byte-identical files.
 */
#include "trainer/data.h"

#include <errno.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

enum {
  WRITER_BUF_TOKENS = 1 << 20, /* append buffer: 1 Mi tokens, flushed as one hyperslab write */
  CHUNK_TOKENS = 1 << 16,      /* see the note at the top */
  SCAN_BLOCK_TOKENS = 1 << 20, /* validation scan reads this many tokens at a time */
};
#define CACHE_MAX_BYTES_DEFAULT ((int64_t)64 << 20)
#define PREPARE_HINT "expected a token file made by `ctrain prepare`"

/* ---------------------------------------------------------------- byte tokenizer */

size_t ct_byte_encode(const char *text, size_t len, int32_t *ids) {
  for (size_t i = 0; i < len; i++) ids[i] = (int32_t)(unsigned char)text[i];
  return len;
}

size_t ct_byte_decode(const int32_t *ids, size_t n, char *out) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= 0 && ids[i] < 256) out[m++] = (char)ids[i];
  out[m] = '\0';
  return m;
}

/* ---------------------------------------------------------------- HDF5 helpers */

static void h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

static herr_t h5_walk_cb(unsigned n, const H5E_error2_t *e, void *data) {
  if (n == 0 && e->desc) snprintf((char *)data, 256, "%s", e->desc);
  return 0;
}

/* The innermost description on HDF5's error stack ("" if none). Call right after the failing
 * call: the next HDF5 API call clears the stack. */
static const char *h5_detail(void) {
  static _Thread_local char buf[256];
  buf[0] = '\0';
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5_walk_cb, buf);
  if (!buf[0]) snprintf(buf, sizeof buf, "HDF5 error");
  return buf;
}

static void h5_close_id(hid_t *id, herr_t (*fn)(hid_t)) {
  if (*id >= 0) fn(*id);
  *id = H5I_INVALID_HID;
}

static ct_status write_attr_i64(hid_t obj, const char *path, const char *name, int64_t v) {
  ct_status st = CT_OK;
  hid_t space = H5Screate(H5S_SCALAR), attr = H5I_INVALID_HID;
  if (space < 0) return ct_set_error(CT_ERR_IO, "%s: H5Screate: %s", path, h5_detail());
  attr = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  if (attr < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot create attribute %s: %s", path, name, h5_detail());
  } else if (H5Awrite(attr, H5T_NATIVE_INT64, &v) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot write attribute %s: %s", path, name, h5_detail());
  }
  h5_close_id(&attr, H5Aclose);
  H5Sclose(space);
  return st;
}

/* Fixed-length, NUL-terminated string attribute (h5py reads it as bytes). */
static ct_status write_attr_str(hid_t obj, const char *path, const char *name, const char *s) {
  ct_status st = CT_OK;
  hid_t type = H5I_INVALID_HID, space = H5I_INVALID_HID, attr = H5I_INVALID_HID;
  if ((type = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(type, strlen(s) + 1) < 0 ||
      H5Tset_strpad(type, H5T_STR_NULLTERM) < 0 || (space = H5Screate(H5S_SCALAR)) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot make string type for %s: %s", path, name, h5_detail());
    goto done;
  }
  attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (attr < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot create attribute %s: %s", path, name, h5_detail());
  } else if (H5Awrite(attr, type, s) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot write attribute %s: %s", path, name, h5_detail());
  }
done:
  h5_close_id(&attr, H5Aclose);
  h5_close_id(&space, H5Sclose);
  h5_close_id(&type, H5Tclose);
  return st;
}

/* Opens attribute `name` on the tokens dataset; a missing one is CT_ERR_INPUT naming what was
 * expected. */
static ct_status open_attr(hid_t dset, const char *path, const char *name, const char *expect,
                           hid_t *out) {
  htri_t ex = H5Aexists(dset, name);
  if (ex < 0) return ct_set_error(CT_ERR_IO, "%s: cannot query attribute %s: %s", path, name, h5_detail());
  if (ex == 0)
    return ct_set_error(CT_ERR_INPUT, "%s: dataset \"tokens\" has no attribute \"%s\" (expected %s; %s)",
                        path, name, expect, PREPARE_HINT);
  *out = H5Aopen(dset, name, H5P_DEFAULT);
  if (*out < 0) return ct_set_error(CT_ERR_IO, "%s: cannot open attribute %s: %s", path, name, h5_detail());
  return CT_OK;
}

/* 1 if the attribute's dataspace holds exactly one element. */
static int attr_is_single(hid_t attr) {
  hid_t space = H5Aget_space(attr);
  if (space < 0) return 0;
  hssize_t n = H5Sget_simple_extent_npoints(space);
  H5Sclose(space);
  return n == 1;
}

static ct_status read_attr_i64(hid_t dset, const char *path, const char *name, int64_t *v) {
  hid_t attr = H5I_INVALID_HID, type = H5I_INVALID_HID;
  CT_TRY(open_attr(dset, path, name, "an int64 scalar", &attr));
  ct_status st = CT_OK;
  if ((type = H5Aget_type(attr)) < 0 || H5Tget_class(type) != H5T_INTEGER || !attr_is_single(attr)) {
    st = ct_set_error(CT_ERR_INPUT, "%s: attribute \"%s\" of \"tokens\" is not an integer scalar "
                      "(expected int64; %s)", path, name, PREPARE_HINT);
  } else if (H5Aread(attr, H5T_NATIVE_INT64, v) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot read attribute %s: %s", path, name, h5_detail());
  }
  h5_close_id(&type, H5Tclose);
  H5Aclose(attr);
  return st;
}

/* Reads a fixed- or variable-length string attribute into out (cap bytes, NUL-terminated). */
static ct_status read_attr_str(hid_t dset, const char *path, const char *name, char *out, size_t cap) {
  hid_t attr = H5I_INVALID_HID, type = H5I_INVALID_HID, mtype = H5I_INVALID_HID;
  CT_TRY(open_attr(dset, path, name, "a string", &attr));
  ct_status st = CT_OK;
  if ((type = H5Aget_type(attr)) < 0 || H5Tget_class(type) != H5T_STRING || !attr_is_single(attr)) {
    st = ct_set_error(CT_ERR_INPUT, "%s: attribute \"%s\" of \"tokens\" is not a string (%s)",
                      path, name, PREPARE_HINT);
    goto done;
  }
  htri_t vl = H5Tis_variable_str(type);
  if (vl < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: attribute %s: %s", path, name, h5_detail());
  } else if (vl) {
    char *s = NULL;
    if ((mtype = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(mtype, H5T_VARIABLE) < 0 ||
        H5Aread(attr, mtype, &s) < 0) {
      st = ct_set_error(CT_ERR_IO, "%s: cannot read attribute %s: %s", path, name, h5_detail());
    } else {
      if (!s || strlen(s) >= cap)
        st = ct_set_error(CT_ERR_INPUT, "%s: attribute \"%s\" is %s (expected at most %zu characters)",
                          path, name, s ? "too long" : "null", cap - 1);
      else
        memcpy(out, s, strlen(s) + 1);
      if (s) H5free_memory(s);
    }
  } else {
    size_t size = H5Tget_size(type);
    if (size == 0 || size >= cap) {
      st = ct_set_error(CT_ERR_INPUT, "%s: attribute \"%s\" is a %zu-byte string (expected at most %zu)",
                        path, name, size, cap - 1);
    } else if (H5Aread(attr, type, out) < 0) {
      st = ct_set_error(CT_ERR_IO, "%s: cannot read attribute %s: %s", path, name, h5_detail());
    } else {
      out[size] = '\0'; /* NULLPAD / SPACEPAD strings need not be terminated */
      if (H5Tget_strpad(type) == H5T_STR_SPACEPAD)
        for (size_t n = strlen(out); n > 0 && out[n - 1] == ' '; n--) out[n - 1] = '\0';
    }
  }
done:
  h5_close_id(&mtype, H5Tclose);
  h5_close_id(&type, H5Tclose);
  H5Aclose(attr);
  return st;
}

/* Opens path read-only and checks the layout. On success *file and *dset are open and info is
 * filled; on failure nothing is left open. */
static ct_status tokens_open(const char *path, hid_t *file_out, hid_t *dset_out, ct_tokens_info *info) {
  h5_quiet();
  memset(info, 0, sizeof *info);
  *file_out = *dset_out = H5I_INVALID_HID;
  struct stat sb;
  if (stat(path, &sb) != 0)
    return ct_set_error(CT_ERR_INPUT, "%s: cannot open: %s (%s)", path, strerror(errno), PREPARE_HINT);
  if (S_ISDIR(sb.st_mode))
    return ct_set_error(CT_ERR_INPUT, "%s: is a directory (%s)", path, PREPARE_HINT);
  if (access(path, R_OK) != 0)
    return ct_set_error(CT_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  if (H5Fis_hdf5(path) <= 0)
    return ct_set_error(CT_ERR_INPUT, "%s: not an HDF5 file (%s)", path, PREPARE_HINT);

  ct_status st = CT_OK;
  hid_t file = H5I_INVALID_HID, dset = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
  file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) {
    st = ct_set_error(CT_ERR_INPUT, "%s: cannot open as HDF5: %s", path, h5_detail());
    goto fail;
  }
  htri_t ex = H5Lexists(file, "tokens", H5P_DEFAULT);
  if (ex <= 0) {
    st = ct_set_error(CT_ERR_INPUT, "%s: no dataset \"tokens\" (%s)", path, PREPARE_HINT);
    goto fail;
  }
  dset = H5Dopen2(file, "tokens", H5P_DEFAULT);
  if (dset < 0) {
    st = ct_set_error(CT_ERR_INPUT, "%s: \"tokens\" is not a dataset (%s)", path, PREPARE_HINT);
    goto fail;
  }
  if ((type = H5Dget_type(dset)) < 0 || (space = H5Dget_space(dset)) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot query \"tokens\": %s", path, h5_detail());
    goto fail;
  }
  H5T_class_t cls = H5Tget_class(type);
  size_t tsize = H5Tget_size(type);
  H5T_sign_t sign = cls == H5T_INTEGER ? H5Tget_sign(type) : H5T_SGN_ERROR;
  if (cls != H5T_INTEGER || sign != H5T_SGN_NONE || (tsize != 2 && tsize != 4)) {
    st = ct_set_error(CT_ERR_INPUT, "%s: dataset \"tokens\" has type %s%zu (expected uint16 or uint32; %s)",
                      path, cls != H5T_INTEGER ? "non-integer " : sign == H5T_SGN_NONE ? "uint" : "int",
                      tsize * 8, PREPARE_HINT);
    goto fail;
  }
  int ndims = H5Sget_simple_extent_ndims(space);
  if (ndims != 1) {
    st = ct_set_error(CT_ERR_INPUT, "%s: dataset \"tokens\" has %d dimensions (expected 1; %s)",
                      path, ndims, PREPARE_HINT);
    goto fail;
  }
  hsize_t dim = 0;
  if (H5Sget_simple_extent_dims(space, &dim, NULL) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot query the size of \"tokens\": %s", path, h5_detail());
    goto fail;
  }
  info->n_tokens = (int64_t)dim;
  info->bits = (int)tsize * 8;
  CT_TRY_GOTO(read_attr_i64(dset, path, "vocab_size", &info->vocab_size), fail);
  CT_TRY_GOTO(read_attr_i64(dset, path, "eot_id", &info->eot_id), fail);
  CT_TRY_GOTO(read_attr_str(dset, path, "tokenizer", info->tokenizer, sizeof info->tokenizer), fail);
  if (info->vocab_size < 1 || info->vocab_size > ((int64_t)1 << 32)) {
    st = ct_set_error(CT_ERR_INPUT, "%s: vocab_size attribute %" PRId64 " is out of range (expected 1..2^32)",
                      path, info->vocab_size);
    goto fail;
  }
  if (info->eot_id < 0 || info->eot_id >= info->vocab_size) {
    st = ct_set_error(CT_ERR_INPUT, "%s: eot_id attribute %" PRId64 " is outside the vocabulary 0..%" PRId64,
                      path, info->eot_id, info->vocab_size - 1);
    goto fail;
  }
  H5Tclose(type);
  H5Sclose(space);
  *file_out = file;
  *dset_out = dset;
  return CT_OK;
fail:
  h5_close_id(&type, H5Tclose);
  h5_close_id(&space, H5Sclose);
  h5_close_id(&dset, H5Dclose);
  h5_close_id(&file, H5Fclose);
  return st;
}

ct_status ct_tokens_info_read(const char *path, ct_tokens_info *info) {
  hid_t file, dset;
  CT_TRY(tokens_open(path, &file, &dset, info));
  H5Dclose(dset);
  H5Fclose(file);
  return CT_OK;
}

/* Reads tokens [start, start+n) of dset into buf, converting to mtype. */
static ct_status read_range(hid_t dset, const char *path, hid_t mtype, int64_t start, int64_t n, void *buf) {
  ct_status st = CT_OK;
  hsize_t off = (hsize_t)start, cnt = (hsize_t)n;
  hid_t fspace = H5Dget_space(dset), mspace = H5I_INVALID_HID;
  if (fspace < 0 || H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &off, NULL, &cnt, NULL) < 0 ||
      (mspace = H5Screate_simple(1, &cnt, NULL)) < 0 ||
      H5Dread(dset, mtype, mspace, fspace, H5P_DEFAULT, buf) < 0)
    st = ct_set_error(CT_ERR_IO, "%s: cannot read tokens [%" PRId64 ", %" PRId64 "): %s", path, start,
                      start + n, h5_detail());
  h5_close_id(&mspace, H5Sclose);
  h5_close_id(&fspace, H5Sclose);
  return st;
}

/* ---------------------------------------------------------------- writer */

struct ct_token_writer {
  char *path, *tmp_path;
  hid_t file, dset; /* dset is created at the first flush, when the chunk size can be capped */
  int64_t vocab_size, eot_id;
  char *tokenizer;
  int bits;
  void *buf;       /* (WRITER_BUF_TOKENS,) uint16 or uint32 */
  size_t n_buf;    /* tokens in buf */
  int64_t n_flushed; /* tokens already in the file */
};

static void writer_free(ct_token_writer *w) {
  h5_close_id(&w->dset, H5Dclose);
  h5_close_id(&w->file, H5Fclose);
  free(w->path);
  free(w->tmp_path);
  free(w->tokenizer);
  free(w->buf);
  free(w);
}

void ct_token_writer_abort(ct_token_writer *w) {
  if (!w) return;
  h5_quiet();
  h5_close_id(&w->dset, H5Dclose);
  h5_close_id(&w->file, H5Fclose);
  if (w->tmp_path) unlink(w->tmp_path);
  writer_free(w);
}

ct_status ct_token_writer_create(const char *path, int64_t vocab_size, int64_t eot_id,
                                 const char *tokenizer, ct_token_writer **out) {
  h5_quiet();
  *out = NULL;
  if (vocab_size < 1 || vocab_size > ((int64_t)1 << 32))
    return ct_set_error(CT_ERR_CONFIG, "%s: vocab_size %" PRId64 " out of range 1..2^32", path, vocab_size);
  if (eot_id < 0 || eot_id >= vocab_size)
    return ct_set_error(CT_ERR_CONFIG, "%s: eot_id %" PRId64 " outside vocabulary 0..%" PRId64, path,
                        eot_id, vocab_size - 1);
  if (!tokenizer || strlen(tokenizer) >= sizeof(((ct_tokens_info *)0)->tokenizer))
    return ct_set_error(CT_ERR_CONFIG, "%s: tokenizer name missing or longer than 127 characters", path);

  ct_status st = CT_OK;
  ct_token_writer *w = ct_calloc(1, sizeof *w, "token writer");
  if (!w) return CT_ERR_NOMEM;
  w->file = w->dset = H5I_INVALID_HID;
  w->vocab_size = vocab_size;
  w->eot_id = eot_id;
  w->bits = vocab_size <= 65536 ? 16 : 32;
  size_t tmp_len = strlen(path) + 5;
  w->path = ct_strdup(path);
  w->tokenizer = ct_strdup(tokenizer);
  w->tmp_path = malloc(tmp_len);
  w->buf = malloc((size_t)WRITER_BUF_TOKENS * (size_t)(w->bits / 8));
  if (!w->path || !w->tokenizer || !w->tmp_path || !w->buf) {
    writer_free(w);
    return ct_set_error(CT_ERR_NOMEM, "%s: out of memory creating the token writer", path);
  }
  snprintf(w->tmp_path, tmp_len, "%s.tmp", path);

  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  if (fcpl < 0 || H5Pset_obj_track_times(fcpl, 0) < 0) {
    h5_close_id(&fcpl, H5Pclose);
    writer_free(w);
    return ct_set_error(CT_ERR_IO, "%s: cannot set up file properties: %s", path, h5_detail());
  }
  w->file = H5Fcreate(w->tmp_path, H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
  H5Pclose(fcpl);
  if (w->file < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot create: %s", w->tmp_path, h5_detail());
    writer_free(w); /* nothing was created */
    return st;
  }
  *out = w;
  return CT_OK;
}

static ct_status writer_create_dataset(ct_token_writer *w, int64_t first_flush) {
  ct_status st = CT_OK;
  hsize_t dim0 = 0, maxdim = H5S_UNLIMITED;
  hsize_t chunk = (hsize_t)(first_flush < 1 ? 1 : first_flush < CHUNK_TOKENS ? first_flush : CHUNK_TOKENS);
  hid_t space = H5I_INVALID_HID, dcpl = H5I_INVALID_HID;
  hid_t ftype = w->bits == 16 ? H5T_STD_U16LE : H5T_STD_U32LE;
  if ((space = H5Screate_simple(1, &dim0, &maxdim)) < 0 || (dcpl = H5Pcreate(H5P_DATASET_CREATE)) < 0 ||
      H5Pset_chunk(dcpl, 1, &chunk) < 0 || H5Pset_fletcher32(dcpl) < 0 ||
      H5Pset_obj_track_times(dcpl, 0) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot set up the tokens dataset: %s", w->tmp_path, h5_detail());
    goto done;
  }
  w->dset = H5Dcreate2(w->file, "tokens", ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (w->dset < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot create dataset tokens: %s", w->tmp_path, h5_detail());
    goto done;
  }
  CT_TRY_GOTO(write_attr_i64(w->dset, w->tmp_path, "vocab_size", w->vocab_size), done);
  CT_TRY_GOTO(write_attr_i64(w->dset, w->tmp_path, "eot_id", w->eot_id), done);
  CT_TRY_GOTO(write_attr_str(w->dset, w->tmp_path, "tokenizer", w->tokenizer), done);
done:
  h5_close_id(&dcpl, H5Pclose);
  h5_close_id(&space, H5Sclose);
  return st;
}

static ct_status writer_flush(ct_token_writer *w) {
  if (w->dset < 0) CT_TRY(writer_create_dataset(w, (int64_t)w->n_buf));
  if (w->n_buf == 0) return CT_OK;
  ct_status st = CT_OK;
  hsize_t start = (hsize_t)w->n_flushed, cnt = (hsize_t)w->n_buf, size = start + cnt;
  hid_t fspace = H5I_INVALID_HID, mspace = H5I_INVALID_HID;
  hid_t mtype = w->bits == 16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32;
  if (H5Dset_extent(w->dset, &size) < 0 || (fspace = H5Dget_space(w->dset)) < 0 ||
      H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, NULL, &cnt, NULL) < 0 ||
      (mspace = H5Screate_simple(1, &cnt, NULL)) < 0 ||
      H5Dwrite(w->dset, mtype, mspace, fspace, H5P_DEFAULT, w->buf) < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot write %llu tokens at %llu: %s", w->tmp_path,
                      (unsigned long long)cnt, (unsigned long long)start, h5_detail());
  } else {
    w->n_flushed += (int64_t)cnt;
    w->n_buf = 0;
  }
  h5_close_id(&mspace, H5Sclose);
  h5_close_id(&fspace, H5Sclose);
  return st;
}

ct_status ct_token_writer_append(ct_token_writer *w, const int32_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || (int64_t)ids[i] >= w->vocab_size)
      return ct_set_error(CT_ERR_INPUT, "%s: token id %" PRId32 " at position %" PRId64
                          " is outside the vocabulary 0..%" PRId64, w->path, ids[i],
                          w->n_flushed + (int64_t)w->n_buf, w->vocab_size - 1);
    if (w->bits == 16) ((uint16_t *)w->buf)[w->n_buf++] = (uint16_t)ids[i];
    else ((uint32_t *)w->buf)[w->n_buf++] = (uint32_t)ids[i];
    if (w->n_buf == WRITER_BUF_TOKENS) CT_TRY(writer_flush(w));
  }
  return CT_OK;
}

ct_status ct_token_writer_close(ct_token_writer *w) {
  h5_quiet();
  ct_status st = writer_flush(w);
  if (st == CT_OK) {
    herr_t e1 = H5Dclose(w->dset);
    w->dset = H5I_INVALID_HID;
    herr_t e2 = e1 < 0 ? -1 : H5Fclose(w->file);
    if (e2 >= 0) w->file = H5I_INVALID_HID;
    if (e1 < 0 || e2 < 0)
      st = ct_set_error(CT_ERR_IO, "%s: cannot close: %s", w->tmp_path, h5_detail());
  }
  if (st == CT_OK && rename(w->tmp_path, w->path) != 0)
    st = ct_set_error(CT_ERR_IO, "cannot rename %s to %s: %s", w->tmp_path, w->path, strerror(errno));
  if (st != CT_OK) {
    ct_token_writer_abort(w);
    return st;
  }
  writer_free(w);
  return CT_OK;
}

/* ---------------------------------------------------------------- loader */

struct ct_loader {
  char *path;
  hid_t file, dset; /* open only when the tokens are not cached */
  ct_tokens_info info;
  int T, rank, world;
  uint64_t seed;
  ct_loader_mode mode;
  uint64_t k;      /* windows drawn by this rank: the whole resumable state */
  void *cache;     /* (n_tokens,) uint16 or uint32, or NULL */
  uint32_t *win;   /* (T+1,) scratch for one window */
};

static int64_t cache_max_bytes(void) {
  const char *s = getenv("CT_DATA_CACHE_MAX_BYTES");
  if (!s || !*s) return CACHE_MAX_BYTES_DEFAULT;
  char *end;
  long long v = strtoll(s, &end, 10);
  return *end == '\0' && v >= 0 ? (int64_t)v : CACHE_MAX_BYTES_DEFAULT;
}

/* Returns the index of the first id >= vocab in the block, or -1. */
static int64_t scan_block(const void *p, int bits, int64_t n, int64_t vocab, uint32_t *bad) {
  if (bits == 16) {
    const uint16_t *a = p;
    for (int64_t i = 0; i < n; i++)
      if ((int64_t)a[i] >= vocab) { *bad = a[i]; return i; }
  } else {
    const uint32_t *a = p;
    for (int64_t i = 0; i < n; i++)
      if ((int64_t)a[i] >= vocab) { *bad = a[i]; return i; }
  }
  return -1;
}

ct_status ct_loader_open(const char *path, const char *tokenizer, int64_t model_vocab, int T,
                         int rank, int world, uint64_t seed, ct_loader_mode mode,
                         ct_loader **out) {
  *out = NULL;
  if (T < 1) return ct_set_error(CT_ERR_CONFIG, "%s: sequence length T = %d must be >= 1", path, T);
  if (world < 1 || rank < 0 || rank >= world)
    return ct_set_error(CT_ERR_CONFIG, "%s: rank %d / world %d is not a valid rank", path, rank, world);
  if (model_vocab < 1) return ct_set_error(CT_ERR_CONFIG, "%s: model vocab_size %" PRId64 " must be >= 1", path, model_vocab);
  if (mode != CT_LOADER_RANDOM && mode != CT_LOADER_SEQUENTIAL)
    return ct_set_error(CT_ERR_CONFIG, "%s: unknown loader mode %d", path, (int)mode);

  ct_status st = CT_OK;
  void *block = NULL;
  ct_loader *l = ct_calloc(1, sizeof *l, "loader");
  if (!l) return CT_ERR_NOMEM;
  l->file = l->dset = H5I_INVALID_HID;
  l->T = T, l->rank = rank, l->world = world, l->seed = seed, l->mode = mode;
  if (!(l->path = ct_strdup(path))) {
    st = ct_set_error(CT_ERR_NOMEM, "%s: out of memory", path);
    goto fail;
  }
  CT_TRY_GOTO(tokens_open(path, &l->file, &l->dset, &l->info), fail);
  const ct_tokens_info *in = &l->info;

  if (tokenizer && strcmp(tokenizer, in->tokenizer) != 0) {
    st = ct_set_error(CT_ERR_INPUT, "%s: tokenizer is \"%s\" but the model uses \"%s\" "
                      "(re-run `ctrain prepare` with the model's tokenizer)", path, in->tokenizer, tokenizer);
    goto fail;
  }
  if (in->vocab_size > model_vocab) {
    st = ct_set_error(CT_ERR_INPUT, "%s: vocab_size attribute %" PRId64 " is larger than the model's "
                      "vocab_size %" PRId64, path, in->vocab_size, model_vocab);
    goto fail;
  }
  if (in->n_tokens < (int64_t)T + 1) {
    st = ct_set_error(CT_ERR_INPUT, "%s: holds %" PRId64 " tokens, too few for one window of T+1 = %d "
                      "(use a larger file or a smaller sequence length)", path, in->n_tokens, T + 1);
    goto fail;
  }

  /* Validation scan, streaming in blocks; small files land in the cache on the way. */
  int bytes = in->bits / 8;
  hid_t mtype = in->bits == 16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32;
  int use_cache = in->n_tokens * bytes <= cache_max_bytes();
  if (use_cache) {
    if (!(l->cache = ct_malloc((size_t)in->n_tokens * bytes, "token cache"))) { st = CT_ERR_NOMEM; goto fail; }
  } else {
    if (!(block = ct_malloc((size_t)SCAN_BLOCK_TOKENS * bytes, "scan block"))) { st = CT_ERR_NOMEM; goto fail; }
  }
  for (int64_t off = 0; off < in->n_tokens; off += SCAN_BLOCK_TOKENS) {
    int64_t n = in->n_tokens - off < SCAN_BLOCK_TOKENS ? in->n_tokens - off : SCAN_BLOCK_TOKENS;
    void *dst = use_cache ? (char *)l->cache + (size_t)off * bytes : block;
    CT_TRY_GOTO(read_range(l->dset, path, mtype, off, n, dst), fail);
    uint32_t bad = 0;
    int64_t i = scan_block(dst, in->bits, n, model_vocab, &bad);
    if (i >= 0) {
      st = ct_set_error(CT_ERR_INPUT, "%s: token id %" PRIu32 " at position %" PRId64 " is >= model "
                        "vocab_size %" PRId64, path, bad, off + i, model_vocab);
      goto fail;
    }
  }
  free(block);
  block = NULL;
  if (use_cache) {
    h5_close_id(&l->dset, H5Dclose);
    h5_close_id(&l->file, H5Fclose);
  }
  if (!(l->win = ct_malloc(sizeof(uint32_t) * ((size_t)T + 1), "loader window"))) { st = CT_ERR_NOMEM; goto fail; }
  *out = l;
  return CT_OK;
fail:
  free(block);
  ct_loader_destroy(l);
  return st;
}

/* Start offset of window k (this rank's k-th window). */
static int64_t window_start(const ct_loader *l, uint64_t k) {
  uint64_t g = k * (uint64_t)l->world + (uint64_t)l->rank; /* global window counter */
  int64_t T = l->T, n = l->info.n_tokens;
  if (l->mode == CT_LOADER_RANDOM) {
    ct_rng r = {l->seed, g};
    return (int64_t)(ct_rng_u64(&r) % (uint64_t)(n - T)); /* starts 0..n-T-1 keep T+1 tokens in range */
  }
  uint64_t n_windows = (uint64_t)((n - 1) / T); /* windows j*T with j*T + T + 1 <= n */
  return (int64_t)(g % n_windows) * T;
}

ct_status ct_loader_next(ct_loader *l, int B, int32_t *inputs, int32_t *targets) {
  if (B < 1) return ct_set_error(CT_ERR_CONFIG, "%s: batch size %d must be >= 1", l->path, B);
  h5_quiet();
  int T = l->T;
  uint64_t k = l->k; /* committed only when the whole batch was read */
  for (int b = 0; b < B; b++, k++) {
    int64_t start = window_start(l, k);
    if (l->cache) {
      if (l->info.bits == 16) {
        const uint16_t *c = (const uint16_t *)l->cache + start;
        for (int i = 0; i <= T; i++) l->win[i] = c[i];
      } else {
        memcpy(l->win, (const uint32_t *)l->cache + start, sizeof(uint32_t) * ((size_t)T + 1));
      }
    } else {
      CT_TRY(read_range(l->dset, l->path, H5T_NATIVE_UINT32, start, (int64_t)T + 1, l->win));
    }
    int32_t *x = inputs + (size_t)b * T, *y = targets + (size_t)b * T;
    for (int i = 0; i < T; i++) {
      x[i] = (int32_t)l->win[i];
      y[i] = (int32_t)l->win[i + 1];
    }
  }
  l->k = k;
  return CT_OK;
}

void ct_loader_reset(ct_loader *l) { l->k = 0; }
uint64_t ct_loader_position(const ct_loader *l) { return l->k; }
void ct_loader_set_position(ct_loader *l, uint64_t pos) { l->k = pos; }
const ct_tokens_info *ct_loader_info(const ct_loader *l) { return &l->info; }

void ct_loader_destroy(ct_loader *l) {
  if (!l) return;
  h5_close_id(&l->dset, H5Dclose);
  h5_close_id(&l->file, H5Fclose);
  free(l->cache);
  free(l->win);
  free(l->path);
  free(l);
}
