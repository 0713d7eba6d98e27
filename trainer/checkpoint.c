#include "trainer/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "parallel/tp.h"

/* ---- attributes ---- */

static ct_status write_string_attr(hid_t obj, const char *name, const char *value) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, strlen(value) + 1);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = attr < 0 ? -1 : H5Awrite(attr, type, value);
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
  return rc < 0 ? ct_set_error(CT_ERR_IO, "cannot write attribute %s", name) : CT_OK;
}

static ct_status write_num_attr(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                                const void *value) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = attr < 0 ? -1 : H5Awrite(attr, mem_type, value);
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
  return rc < 0 ? ct_set_error(CT_ERR_IO, "cannot write attribute %s", name) : CT_OK;
}

static ct_status write_i64(hid_t obj, const char *name, long long v) {
  return write_num_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, &v);
}
static ct_status write_u64(hid_t obj, const char *name, unsigned long long v) {
  return write_num_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_ULLONG, &v);
}
static ct_status write_f64(hid_t obj, const char *name, double v) {
  return write_num_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

static ct_status read_num_attr(hid_t obj, const char *name, hid_t mem_type, void *out,
                               const char *file) {
  if (H5Aexists(obj, name) <= 0)
    return ct_set_error(CT_ERR_INPUT, "%s: attribute \"%s\" missing", file, name);
  hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
  herr_t rc = attr < 0 ? -1 : H5Aread(attr, mem_type, out);
  if (attr >= 0) H5Aclose(attr);
  return rc < 0 ? ct_set_error(CT_ERR_INPUT, "%s: attribute \"%s\" unreadable", file, name) : CT_OK;
}

static ct_status read_string_attr(hid_t obj, const char *name, const char *file, char **out) {
  if (H5Aexists(obj, name) <= 0)
    return ct_set_error(CT_ERR_INPUT, "%s: attribute \"%s\" missing (not a ctrain checkpoint?)",
                        file, name);
  hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t type = H5Aget_type(attr);
  size_t size = H5Tget_size(type);
  char *buf = calloc(size + 1, 1);
  hid_t mem = H5Tcopy(H5T_C_S1);
  H5Tset_size(mem, size);
  herr_t rc = buf ? H5Aread(attr, mem, buf) : -1;
  H5Tclose(mem);
  H5Tclose(type);
  H5Aclose(attr);
  if (rc < 0) {
    free(buf);
    return ct_set_error(CT_ERR_INPUT, "%s: cannot read attribute %s", file, name);
  }
  *out = buf;
  return CT_OK;
}

/* ---- tensor sets: one dataset per parameter-table entry, under `group` ("" = root) ---- */

static long abort_after = -1; /* CT_CKPT_ABORT_AFTER: crash-during-save testing */

static ct_status write_tensors(hid_t f, const char *file, const char *group, const ct_model *m,
                               const float *host) {
  hid_t g = f;
  if (group[0] && (g = H5Gcreate2(f, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0)
    return ct_set_error(CT_ERR_IO, "%s: cannot create group %s", file, group);
  ct_status st = CT_OK;
  for (int i = 0; i < ct_model_n_params(m) && st == CT_OK; i++) {
    const ct_param *p = ct_model_param(m, i);
    hsize_t dims[2] = {(hsize_t)p->shape[0], (hsize_t)p->shape[1]};
    hid_t space = H5Screate_simple(p->ndim, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, p->ndim, dims); /* one chunk per tensor: checksummed as a whole */
    H5Pset_fletcher32(dcpl);
    hid_t d = H5Dcreate2(g, p->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    herr_t rc = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host + p->offset);
    if (d >= 0) H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
    if (rc < 0) st = ct_set_error(CT_ERR_IO, "%s: cannot write tensor %s%s%s", file, group,
                                  group[0] ? "/" : "", p->name);
    if (abort_after >= 0 && --abort_after < 0) {
      H5Fflush(f, H5F_SCOPE_GLOBAL);
      fprintf(stderr, "CT_CKPT_ABORT_AFTER: aborting mid-save (testing)\n");
      abort();
    }
  }
  if (g != f) H5Gclose(g);
  return st;
}

static ct_status read_tensors(hid_t f, const char *file, const char *group, const ct_model *m,
                              float *host) {
  char path[256];
  for (int i = 0; i < ct_model_n_params(m); i++) {
    const ct_param *p = ct_model_param(m, i);
    snprintf(path, sizeof path, "%s%s%s", group, group[0] ? "/" : "", p->name);
    if ((group[0] && H5Lexists(f, group, H5P_DEFAULT) <= 0) || H5Lexists(f, path, H5P_DEFAULT) <= 0)
      return ct_set_error(CT_ERR_INPUT, "%s: tensor %s missing (checkpoint of a different model?)",
                          file, path);
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (d < 0) return ct_set_error(CT_ERR_INPUT, "%s: tensor %s unreadable", file, path);
    hid_t space = H5Dget_space(d);
    hsize_t dims[2] = {0, 0};
    int nd = H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    ct_status st = CT_OK;
    if (nd != p->ndim || (int)dims[0] != p->shape[0] || (nd == 2 && (int)dims[1] != p->shape[1])) {
      st = ct_set_error(CT_ERR_INPUT, "%s: tensor %s has shape (%llu, %llu), the model expects"
                        " (%d, %d)", file, path, (unsigned long long)dims[0],
                        (unsigned long long)(nd == 2 ? dims[1] : 0), p->shape[0],
                        p->ndim == 2 ? p->shape[1] : 0);
    } else if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host + p->offset) < 0) {
      st = ct_set_error(CT_ERR_INPUT, "%s: tensor %s is corrupted (Fletcher32 checksum mismatch"
                        " or truncated file)", file, path);
    }
    H5Dclose(d);
    if (st != CT_OK) return st;
  }
  return CT_OK;
}

/* ---- files ---- */

/* weight_shards > 0: the weights are in the ranks' model-rank*.h5 files; model.h5 gets the
 * attributes only (m's weights are not read: under zero3 no rank holds them whole). */
static ct_status write_model_file(const char *path, int step, const ct_config *cfg, ct_model *m,
                                  int weight_shards) {
  ct_status st = CT_OK;
  const size_t numel = ct_model_numel(m);
  float *host = NULL;
  if (weight_shards == 0) {
    if (!(host = ct_malloc(numel * sizeof(float), "checkpoint staging"))) return CT_ERR_NOMEM;
    ct_model_ops(m)->to_host(host, ct_model_params(m), numel * sizeof(float));
  }
  char *toml = ct_config_to_toml(cfg);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0 || !toml) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot create checkpoint file", path);
    goto done;
  }
  CT_TRY_GOTO(write_string_attr(f, "config", toml), done);
  CT_TRY_GOTO(write_i64(f, "step", step), done);
  if (weight_shards > 0) CT_TRY_GOTO(write_i64(f, "weight_shards", weight_shards), done);
  else CT_TRY_GOTO(write_tensors(f, path, "", m, host), done);
done:
  if (f >= 0 && H5Fclose(f) < 0 && st == CT_OK) st = ct_set_error(CT_ERR_IO, "%s: close failed", path);
  free(toml);
  free(host);
  return st;
}

static ct_status write_state_file(const char *path, const ct_train_state *ts, ct_model *m,
                                  int n_shards) {
  ct_status st = CT_OK;
  const size_t numel = ct_model_numel(m);
  float *host = n_shards > 0 ? NULL : ct_malloc(numel * sizeof(float), "checkpoint staging");
  if (n_shards == 0 && !host) return CT_ERR_NOMEM;
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot create checkpoint file", path);
    goto done;
  }
  CT_TRY_GOTO(write_i64(f, "step", ts->step), done);
  CT_TRY_GOTO(write_i64(f, "adam_step", ts->opt->step), done);
  CT_TRY_GOTO(write_u64(f, "data_position", ts->data_position), done);
  CT_TRY_GOTO(write_u64(f, "data_seed", ts->data_seed), done);
  CT_TRY_GOTO(write_i64(f, "world_size", ts->world_size), done);
  CT_TRY_GOTO(write_i64(f, "rank", ts->rank), done);
  CT_TRY_GOTO(write_f64(f, "loss_scale", ts->loss_scale), done);
  CT_TRY_GOTO(write_i64(f, "scaler_good_steps", ts->scaler_good_steps), done);
  CT_TRY_GOTO(write_string_attr(f, "parallel_data", ts->parallel_data[0] ? ts->parallel_data : "ddp"), done);
  CT_TRY_GOTO(write_i64(f, "tensor_parallel", ts->tensor_parallel > 0 ? ts->tensor_parallel : 1), done);
  if (n_shards > 0) { /* the moments are in the ranks' shard files */
    CT_TRY_GOTO(write_i64(f, "shards", n_shards), done);
    goto done;
  }
  ct_model_ops(m)->to_host(host, ts->opt->m, numel * sizeof(float));
  CT_TRY_GOTO(write_tensors(f, path, "adam_m", m, host), done);
  ct_model_ops(m)->to_host(host, ts->opt->v, numel * sizeof(float));
  CT_TRY_GOTO(write_tensors(f, path, "adam_v", m, host), done);
done:
  if (f >= 0 && H5Fclose(f) < 0 && st == CT_OK) st = ct_set_error(CT_ERR_IO, "%s: close failed", path);
  free(host);
  return st;
}

static ct_status remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (!d)
    return unlink(path) == 0 || errno == ENOENT ? CT_OK
                                                : ct_set_error(CT_ERR_IO, "cannot remove %s", path);
  struct dirent *e;
  char child[4096];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(child, sizeof child, "%s/%s", path, e->d_name);
    remove_tree(child);
  }
  closedir(d);
  return rmdir(path) == 0 ? CT_OK
                          : ct_set_error(CT_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Keeps the newest keep_last step directories (names sort by step: zero-padded). */
static void prune(const char *ckdir, int keep_last) {
  if (keep_last <= 0) return;
  DIR *d = opendir(ckdir);
  if (!d) return;
  char *names[4096];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 4096)
    if (!strncmp(e->d_name, "step_", 5) && strlen(e->d_name) == 13) names[n++] = ct_strdup(e->d_name);
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  char path[4096];
  for (int i = 0; i < n; i++) {
    if (i < n - keep_last) {
      snprintf(path, sizeof path, "%s/%s", ckdir, names[i]);
      remove_tree(path);
    }
    free(names[i]);
  }
}

/* n_shards > 0: dir.tmp already holds the ranks' shard files (ct_checkpoint_write_shard), with
 * the weights too when weight_shards > 0. */
static ct_status write_dir(const char *dir, int step, const ct_config *cfg, ct_model *m,
                           const ct_train_state *ts, int n_shards, int weight_shards) {
  char tmp[4200], file[4300];
  const char *abort_env = getenv("CT_CKPT_ABORT_AFTER");
  if (n_shards == 0) abort_after = abort_env ? atol(abort_env) : -1; /* shards counted already */
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  snprintf(tmp, sizeof tmp, "%s.tmp", dir);
  if (n_shards == 0) {
    remove_tree(tmp);
    if (mkdir(tmp, 0777) != 0)
      return ct_set_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  }
  snprintf(file, sizeof file, "%s/model.h5", tmp);
  ct_status st = write_model_file(file, step, cfg, m, weight_shards);
  if (st == CT_OK && ts) {
    snprintf(file, sizeof file, "%s/state.h5", tmp);
    st = write_state_file(file, ts, m, n_shards);
  }
  if (st != CT_OK) {
    remove_tree(tmp);
    return st;
  }
  /* an older checkpoint at the same path is replaced only once the new one is complete */
  if (ct_file_exists(dir)) remove_tree(dir);
  if (rename(tmp, dir) != 0)
    return ct_set_error(CT_ERR_IO, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
  return CT_OK;
}

ct_status ct_checkpoint_write_dir(const char *dir, int step, const ct_config *cfg, ct_model *m,
                                  const ct_train_state *ts) {
  return write_dir(dir, step, cfg, m, ts, 0, 0);
}

static ct_status save(const char *out_dir, int step, const ct_config *cfg, ct_model *m,
                      const ct_train_state *ts, int n_shards, int weight_shards, int keep_last,
                      char *saved_path, size_t saved_cap) {
  char ckdir[4096], final[4200], link_tmp[4200], link[4200], target[64];
  snprintf(ckdir, sizeof ckdir, "%s/ckpt", out_dir);
  CT_TRY(ct_mkdirs(ckdir));
  snprintf(target, sizeof target, "step_%08d", step);
  snprintf(final, sizeof final, "%s/%s", ckdir, target);
  CT_TRY(write_dir(final, step, cfg, m, ts, n_shards, weight_shards));
  snprintf(link, sizeof link, "%s/latest", ckdir);
  snprintf(link_tmp, sizeof link_tmp, "%s/latest.tmp", ckdir);
  unlink(link_tmp);
  if (symlink(target, link_tmp) != 0 || rename(link_tmp, link) != 0)
    return ct_set_error(CT_ERR_IO, "cannot update %s: %s", link, strerror(errno));
  prune(ckdir, keep_last);
  if (saved_path) snprintf(saved_path, saved_cap, "%s", final);
  return CT_OK;
}

ct_status ct_checkpoint_save(const char *out_dir, int step, const ct_config *cfg, ct_model *m,
                             const ct_train_state *ts, int keep_last, char *saved_path,
                             size_t saved_cap) {
  return save(out_dir, step, cfg, m, ts, 0, 0, keep_last, saved_path, saved_cap);
}

ct_status ct_checkpoint_save_sharded(const char *out_dir, int step, const ct_config *cfg,
                                     ct_model *m, const ct_train_state *ts, int n_shards,
                                     bool weights_sharded, int keep_last, char *saved_path,
                                     size_t saved_cap) {
  if (n_shards <= 0) return ct_set_error(CT_ERR_USAGE, "sharded checkpoint without shards");
  return save(out_dir, step, cfg, m, ts, n_shards, weights_sharded ? n_shards : 0, keep_last,
              saved_path, saved_cap);
}

/* ---- sharded optimizer state ---- */

ct_status ct_checkpoint_tmp_dir(const char *out_dir, int step, bool create, char *tmp, size_t cap) {
  char ckdir[4096];
  snprintf(ckdir, sizeof ckdir, "%s/ckpt", out_dir);
  snprintf(tmp, cap, "%s/step_%08d.tmp", ckdir, step);
  const char *abort_env = getenv("CT_CKPT_ABORT_AFTER"); /* counts this rank's blocks/tensors */
  abort_after = abort_env ? atol(abort_env) : -1;
  if (!create) return CT_OK;
  CT_TRY(ct_mkdirs(ckdir));
  remove_tree(tmp);
  if (mkdir(tmp, 0777) != 0)
    return ct_set_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  return CT_OK;
}

/* One block of a whole tensor: dataset <group>/<name>/<index> (rows, cols), attributes row0, col0. */
static ct_status write_block(hid_t f, const char *file, const char *group, const char *name,
                             int index, int row0, int rows, int col0, int cols, const float *data) {
  char path[320];
  snprintf(path, sizeof path, "%s/%s", group, name);
  if (H5Lexists(f, group, H5P_DEFAULT) <= 0) {
    hid_t g = H5Gcreate2(f, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return ct_set_error(CT_ERR_IO, "%s: cannot create group %s", file, group);
    H5Gclose(g);
  }
  if (H5Lexists(f, path, H5P_DEFAULT) <= 0) {
    hid_t g = H5Gcreate2(f, path, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return ct_set_error(CT_ERR_IO, "%s: cannot create group %s", file, path);
    H5Gclose(g);
  }
  snprintf(path, sizeof path, "%s/%s/%d", group, name, index);
  hsize_t dims[2] = {(hsize_t)rows, (hsize_t)cols};
  hid_t space = H5Screate_simple(2, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, dims);
  H5Pset_fletcher32(dcpl);
  hid_t d = H5Dcreate2(f, path, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  herr_t rc = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  ct_status st = rc < 0 ? ct_set_error(CT_ERR_IO, "%s: cannot write %s", file, path) : CT_OK;
  if (st == CT_OK) st = write_i64(d, "row0", row0);
  if (st == CT_OK) st = write_i64(d, "col0", col0);
  if (d >= 0) H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  if (abort_after >= 0 && --abort_after < 0) {
    H5Fflush(f, H5F_SCOPE_GLOBAL);
    fprintf(stderr, "CT_CKPT_ABORT_AFTER: aborting mid-save (testing)\n");
    abort();
  }
  return st;
}

ct_status ct_checkpoint_write_shard(const char *tmp, int rank, const ct_model *full,
                                    const ct_model *local, int tp_rank, const ct_ckpt_range *ranges,
                                    int n) {
  char file[4300], wfile[4300];
  snprintf(file, sizeof file, "%s/state-rank%05d.h5", tmp, rank);
  snprintf(wfile, sizeof wfile, "%s/model-rank%05d.h5", tmp, rank);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  bool weights = false; /* all ranges carry weights or none do */
  for (int r = 0; r < n; r++) weights |= ranges[r].w != NULL;
  for (int r = 0; r < n; r++)
    if (weights && !ranges[r].w)
      return ct_set_error(CT_ERR_USAGE, "%s: range %d of %d carries no weights", wfile, r, n);
  hid_t f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return ct_set_error(CT_ERR_IO, "%s: cannot create checkpoint shard", file);
  hid_t wf = weights ? H5Fcreate(wfile, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT) : -1;
  if (weights && wf < 0) {
    H5Fclose(f);
    return ct_set_error(CT_ERR_IO, "%s: cannot create checkpoint shard", wfile);
  }
  ct_status st = write_i64(f, "rank", rank);
  if (st == CT_OK && weights) st = write_i64(wf, "rank", rank);
  int *count = ct_calloc((size_t)ct_model_n_params(local), sizeof(int), "shard");
  if (!count) st = CT_ERR_NOMEM;
  for (int r = 0; r < n && st == CT_OK; r++) {
    const ct_ckpt_range *g = &ranges[r];
    for (int i = 0; i < ct_model_n_params(local) && st == CT_OK; i++) {
      const ct_param *p = ct_model_param(local, i), *fp = ct_model_param(full, i);
      /* every tp rank holds the replicated tensors: tp rank 0 writes them */
      if (ct_model_tp_size(local) > 1 && tp_rank != 0 &&
          (p->tp_split == CT_TP_REPLICATED || p->tp_split == CT_TP_PARTIAL))
        continue;
      const size_t a = p->offset > g->lo ? p->offset : g->lo;
      const size_t b = p->offset + p->numel < g->hi ? p->offset + p->numel : g->hi;
      if (a >= b) continue;
      const size_t lc = (size_t)(p->ndim == 2 ? p->shape[1] : 1);
      int seg[3][3], fcol0;
      const int ns = ct_tp_segments(full, p, fp, tp_rank, seg, &fcol0);
      /* the element range [a, b) as row runs: a partial first row, whole rows, a partial last */
      for (size_t e = a - p->offset; e < b - p->offset && st == CT_OK;) {
        const size_t row = e / lc, col = e % lc, left = b - p->offset - e;
        size_t rows = 1, cols = lc - col < left ? lc - col : left;
        if (col == 0 && left >= lc) { rows = left / lc; cols = lc; }
        for (int j = 0; j < ns && st == CT_OK; j++) { /* cut along the tensor-parallel segments */
          const size_t s0 = (size_t)seg[j][0], s1 = s0 + (size_t)seg[j][2];
          const size_t r0 = row > s0 ? row : s0, r1 = row + rows < s1 ? row + rows : s1;
          if (r0 >= r1) continue;
          const size_t at = p->offset + r0 * lc + col - g->lo;
          const int frow = seg[j][1] + (int)(r0 - s0), fcol = fcol0 + (int)col;
          st = write_block(f, file, "m", fp->name, count[i], frow, (int)(r1 - r0), fcol, (int)cols, g->m + at);
          if (st == CT_OK)
            st = write_block(f, file, "v", fp->name, count[i], frow, (int)(r1 - r0), fcol, (int)cols, g->v + at);
          if (st == CT_OK && weights)
            st = write_block(wf, wfile, "w", fp->name, count[i], frow, (int)(r1 - r0), fcol, (int)cols, g->w + at);
          count[i]++;
        }
        e += rows * cols;
      }
    }
  }
  free(count);
  if (H5Fclose(f) < 0 && st == CT_OK) st = ct_set_error(CT_ERR_IO, "%s: close failed", file);
  if (wf >= 0 && H5Fclose(wf) < 0 && st == CT_OK) st = ct_set_error(CT_ERR_IO, "%s: close failed", wfile);
  return st;
}

/* Assembles whole tensors (host, the layout of m) from the shard files <prefix>00000.h5 ...
 * <prefix><n_shards - 1>.h5 in dir that `index` (model.h5 or state.h5) names: group groups[g]
 * into dst[g] (labelled what[g] in errors). Every element of every tensor must be covered. */
static ct_status read_shards(const char *dir, const char *index, const char *prefix, int n_shards,
                             const ct_model *m, int ng, const char *const *groups,
                             const char *const *what, float *const *dst) {
  DIR *d = opendir(dir);
  if (!d) return ct_set_error(CT_ERR_INPUT, "%s: cannot list the checkpoint directory", dir);
  int nf = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, prefix, strlen(prefix)) && strstr(e->d_name, ".h5")) nf++;
  closedir(d);
  char **files = ct_calloc((size_t)(n_shards > 0 ? n_shards : 1), sizeof *files, "shard paths");
  ct_status st = files ? CT_OK : CT_ERR_NOMEM;
  for (int k = 0; k < n_shards && st == CT_OK; k++) { /* rank k wrote <prefix>k */
    files[k] = ct_malloc(strlen(dir) + strlen(prefix) + 16, "path");
    if (!files[k]) { st = CT_ERR_NOMEM; break; }
    sprintf(files[k], "%s/%s%05d.h5", dir, prefix, k);
    if (!ct_file_exists(files[k]))
      st = ct_set_error(CT_ERR_INPUT, "%s is missing: %s names %d shard files (%s*.h5), %d found"
                        " (an incomplete copy of the checkpoint?)", files[k], index, n_shards,
                        prefix, nf);
  }
  if (st == CT_OK && nf != n_shards)
    st = ct_set_error(CT_ERR_INPUT, "%s: %s names %d shard files (%s*.h5), %d found (files of"
                      " another checkpoint mixed in?)", dir, index, n_shards, prefix, nf);
  const int np = ct_model_n_params(m);
  size_t *covered = st == CT_OK ? ct_calloc((size_t)np * (size_t)ng, sizeof(size_t), "coverage") : NULL;
  if (st == CT_OK && !covered) st = CT_ERR_NOMEM;
  float *buf = NULL;
  for (int k = 0; k < n_shards && st == CT_OK; k++) {
    hid_t f = H5Fopen(files[k], H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) { st = ct_set_error(CT_ERR_INPUT, "%s: not a readable HDF5 file (truncated?)", files[k]); break; }
    for (int i = 0; i < np && st == CT_OK; i++) {
      const ct_param *p = ct_model_param(m, i);
      const size_t pc = (size_t)(p->ndim == 2 ? p->shape[1] : 1);
      for (int w = 0; w < ng && st == CT_OK; w++) {
        float *out = dst[w];
        char path[320];
        for (int j = 0;; j++) {
          snprintf(path, sizeof path, "%s/%s/%d", groups[w], p->name, j);
          if (j == 0) {
            char grp[320];
            snprintf(grp, sizeof grp, "%s", groups[w]);
            if (H5Lexists(f, grp, H5P_DEFAULT) <= 0) break;
            snprintf(grp, sizeof grp, "%s/%s", groups[w], p->name);
            if (H5Lexists(f, grp, H5P_DEFAULT) <= 0) break;
          }
          if (H5Lexists(f, path, H5P_DEFAULT) <= 0) break;
          hid_t ds = H5Dopen2(f, path, H5P_DEFAULT);
          hid_t space = ds < 0 ? -1 : H5Dget_space(ds);
          hsize_t dims[2] = {0, 0};
          long long row0 = -1, col0 = -1;
          if (space >= 0) { H5Sget_simple_extent_dims(space, dims, NULL); H5Sclose(space); }
          if (ds < 0 || read_num_attr(ds, "row0", H5T_NATIVE_LLONG, &row0, files[k]) != CT_OK ||
              read_num_attr(ds, "col0", H5T_NATIVE_LLONG, &col0, files[k]) != CT_OK ||
              row0 < 0 || col0 < 0 || row0 + (long long)dims[0] > p->shape[0] ||
              col0 + (long long)dims[1] > (long long)pc) {
            if (ds >= 0) H5Dclose(ds);
            st = ct_set_error(CT_ERR_INPUT, "%s: block %s does not fit tensor %s (%d x %zu)", files[k],
                              path, p->name, p->shape[0], pc);
            break;
          }
          float *grown = realloc(buf, sizeof(float) * (size_t)(dims[0] * dims[1]) + 4);
          if (!grown) { H5Dclose(ds); st = CT_ERR_NOMEM; break; }
          buf = grown;
          if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
            H5Dclose(ds);
            st = ct_set_error(CT_ERR_INPUT, "%s: block %s is corrupted (Fletcher32 checksum"
                              " mismatch or truncated file)", files[k], path);
            break;
          }
          H5Dclose(ds);
          for (hsize_t r = 0; r < dims[0]; r++)
            memcpy(out + p->offset + ((size_t)row0 + r) * pc + (size_t)col0, buf + r * dims[1],
                   sizeof(float) * dims[1]);
          covered[(size_t)ng * (size_t)i + (size_t)w] += dims[0] * dims[1];
        }
      }
    }
    H5Fclose(f);
  }
  for (int i = 0; i < np && st == CT_OK; i++)
    for (int w = 0; w < ng && st == CT_OK; w++)
      if (covered[(size_t)ng * (size_t)i + (size_t)w] != ct_model_param(m, i)->numel)
        st = ct_set_error(CT_ERR_INPUT, "%s: the shard files (%s*.h5) hold %zu of the %zu elements"
                          " of %s for %s (a missing or foreign shard?)", dir, prefix,
                          covered[(size_t)ng * (size_t)i + (size_t)w], ct_model_param(m, i)->numel,
                          ct_model_param(m, i)->name, what[w]);
  for (int k = 0; files && k < n_shards; k++) free(files[k]);
  free(files);
  free(covered);
  free(buf);
  return st;
}

/* The directory part of a file path (or "."). */
static void dir_of(const char *file, char *dir, size_t cap) {
  snprintf(dir, cap, "%s", file);
  char *slash = strrchr(dir, '/');
  if (slash == dir) slash[1] = '\0';
  else if (slash) *slash = '\0';
  else snprintf(dir, cap, ".");
}

bool ct_checkpoint_latest(const char *out_dir, char *model_file, size_t cap) {
  snprintf(model_file, cap, "%s/ckpt/latest/model.h5", out_dir);
  return ct_file_exists(model_file);
}

ct_status ct_checkpoint_read_config(const char *path, ct_config *cfg, char *model_file,
                                    size_t cap) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  const char *tries[] = {"%s/model.h5", "%s/ckpt/latest/model.h5", "%s"};
  model_file[0] = '\0';
  for (int i = 0; i < 3; i++) {
    char cand[4200];
    snprintf(cand, sizeof cand, tries[i], path);
    struct stat st;
    if (stat(cand, &st) == 0 && S_ISREG(st.st_mode)) {
      snprintf(model_file, cap, "%s", cand);
      break;
    }
  }
  if (!model_file[0])
    return ct_set_error(CT_ERR_INPUT, "%s: no checkpoint found (expected a step directory with"
                        " model.h5, <out_dir>/ckpt/latest, or <out_dir>)", path);
  hid_t f = H5Fopen(model_file, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return ct_set_error(CT_ERR_INPUT, "%s: not a readable HDF5 file (truncated?)", model_file);
  char *toml = NULL;
  ct_status st = read_string_attr(f, "config", model_file, &toml);
  H5Fclose(f);
  if (st != CT_OK) return st;
  char origin[4300];
  snprintf(origin, sizeof origin, "%s:config", model_file);
  st = ct_config_from_toml_text(toml, origin, cfg);
  free(toml);
  return st;
}

ct_status ct_checkpoint_load_params(const char *model_file, ct_model *m) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(model_file, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return ct_set_error(CT_ERR_INPUT, "%s: not a readable HDF5 file (truncated?)", model_file);
  const size_t numel = ct_model_numel(m);
  float *host = ct_calloc(numel, sizeof(float), "checkpoint staging");
  ct_status st = host ? CT_OK : CT_ERR_NOMEM;
  long long shards = 0;
  if (st == CT_OK && H5Aexists(f, "weight_shards") > 0)
    st = read_num_attr(f, "weight_shards", H5T_NATIVE_LLONG, &shards, model_file);
  if (st == CT_OK && shards > 0) { /* each rank's weight blocks in model-rank*.h5: reassemble */
    char dir[4200];
    dir_of(model_file, dir, sizeof dir);
    const char *groups[] = {"w"}, *what[] = {"the weights"};
    float *dst[] = {host};
    st = read_shards(dir, "model.h5", "model-rank", (int)shards, m, 1, groups, what, dst);
  } else if (st == CT_OK) {
    st = read_tensors(f, model_file, "", m, host);
  }
  if (st == CT_OK) ct_model_ops(m)->to_device(ct_model_params(m), host, numel * sizeof(float));
  free(host);
  H5Fclose(f);
  return st;
}

ct_status ct_checkpoint_load_state(const char *model_file, ct_model *m, ct_train_state *ts) {
  char path[4200];
  snprintf(path, sizeof path, "%s", model_file);
  char *slash = strrchr(path, '/');
  snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0), "state.h5");
  if (!ct_file_exists(path))
    return ct_set_error(CT_ERR_INPUT, "%s: no training state (a weights-only checkpoint; use"
                        " train.init_from to start from its weights)", path);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return ct_set_error(CT_ERR_INPUT, "%s: not a readable HDF5 file (truncated?)", path);
  const size_t numel = ct_model_numel(m);
  long long step = 0, adam_step = 0, world = 0, rank = 0, good = 0;
  unsigned long long pos = 0, seed = 0;
  double scale = 1;
  float *host = ct_calloc(numel, sizeof(float), "checkpoint staging");
  ct_status st = host ? CT_OK : CT_ERR_NOMEM;
  CT_TRY_GOTO(read_num_attr(f, "step", H5T_NATIVE_LLONG, &step, path), done);
  CT_TRY_GOTO(read_num_attr(f, "adam_step", H5T_NATIVE_LLONG, &adam_step, path), done);
  CT_TRY_GOTO(read_num_attr(f, "data_position", H5T_NATIVE_ULLONG, &pos, path), done);
  CT_TRY_GOTO(read_num_attr(f, "data_seed", H5T_NATIVE_ULLONG, &seed, path), done);
  CT_TRY_GOTO(read_num_attr(f, "world_size", H5T_NATIVE_LLONG, &world, path), done);
  CT_TRY_GOTO(read_num_attr(f, "rank", H5T_NATIVE_LLONG, &rank, path), done);
  CT_TRY_GOTO(read_num_attr(f, "loss_scale", H5T_NATIVE_DOUBLE, &scale, path), done);
  CT_TRY_GOTO(read_num_attr(f, "scaler_good_steps", H5T_NATIVE_LLONG, &good, path), done);
  long long tp = 1; /* layout attributes are newer than the format: optional */
  if (H5Aexists(f, "tensor_parallel") > 0)
    CT_TRY_GOTO(read_num_attr(f, "tensor_parallel", H5T_NATIVE_LLONG, &tp, path), done);
  snprintf(ts->parallel_data, sizeof ts->parallel_data, "ddp");
  if (H5Aexists(f, "parallel_data") > 0) {
    char *mode = NULL;
    CT_TRY_GOTO(read_string_attr(f, "parallel_data", path, &mode), done);
    snprintf(ts->parallel_data, sizeof ts->parallel_data, "%s", mode);
    free(mode);
  }
  ts->tensor_parallel = (int)tp;
  long long shards = 0;
  if (H5Aexists(f, "shards") > 0)
    CT_TRY_GOTO(read_num_attr(f, "shards", H5T_NATIVE_LLONG, &shards, path), done);
  if (shards > 0) { /* moments in the ranks' shard files: assemble whole tensors */
    float *hv = ct_calloc(numel, sizeof(float), "checkpoint staging");
    if (!hv) { st = CT_ERR_NOMEM; goto done; }
    char dir[4200];
    dir_of(path, dir, sizeof dir);
    const char *groups[] = {"m", "v"}, *what[] = {"adam_m", "adam_v"};
    float *dst[] = {host, hv};
    st = read_shards(dir, "state.h5", "state-rank", (int)shards, m, 2, groups, what, dst);
    if (st == CT_OK) {
      ct_model_ops(m)->to_device(ts->opt->m, host, numel * sizeof(float));
      ct_model_ops(m)->to_device(ts->opt->v, hv, numel * sizeof(float));
    }
    free(hv);
    if (st != CT_OK) goto done;
  } else {
    CT_TRY_GOTO(read_tensors(f, path, "adam_m", m, host), done);
    ct_model_ops(m)->to_device(ts->opt->m, host, numel * sizeof(float));
    CT_TRY_GOTO(read_tensors(f, path, "adam_v", m, host), done);
    ct_model_ops(m)->to_device(ts->opt->v, host, numel * sizeof(float));
  }
  ts->step = (int)step;
  ts->opt->step = (int)adam_step;
  ts->data_position = pos;
  ts->data_seed = seed;
  ts->world_size = (int)world;
  ts->rank = (int)rank;
  ts->loss_scale = scale;
  ts->scaler_good_steps = (int)good;
done:
  free(host);
  H5Fclose(f);
  return st;
}

/* ---- ctrain consolidate ---- */

static const char *CONSOLIDATE_USAGE =
    "usage: ctrain consolidate CKPT OUT_CKPT\n"
    "  CKPT      a checkpoint (step directory, <out_dir>/ckpt/latest or <out_dir>), sharded or not\n"
    "  OUT_CKPT  directory for a weights-only checkpoint with whole tensors in model.h5\n";

ct_status ct_cmd_consolidate(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (argv[i][0] == '-')
      return ct_set_error(CT_ERR_USAGE, "consolidate: unknown argument %s\n%s", argv[i],
                          CONSOLIDATE_USAGE);
  if (argc != 2)
    return ct_set_error(CT_ERR_USAGE, "consolidate: expected CKPT and OUT_CKPT (got %d arguments)"
                        "\n%s", argc, CONSOLIDATE_USAGE);
  const double t0 = ct_now();
  ct_config cfg;
  char model_file[4200];
  CT_TRY(ct_checkpoint_read_config(argv[0], &cfg, model_file, sizeof model_file));
  long long step = 0;
  hid_t f = H5Fopen(model_file, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return ct_set_error(CT_ERR_INPUT, "%s: not a readable HDF5 file (truncated?)", model_file);
  ct_status st = read_num_attr(f, "step", H5T_NATIVE_LLONG, &step, model_file);
  H5Fclose(f);
  CT_TRY(st);
  ct_model *m = NULL;
  CT_TRY(ct_model_create(&cfg.model, ct_ops_cpu(), 1, 1, &m));
  st = ct_checkpoint_load_params(model_file, m);
  if (st == CT_OK) st = ct_checkpoint_write_dir(argv[1], (int)step, &cfg, m, NULL);
  if (st == CT_OK)
    ct_log_info("consolidate: %s -> %s/model.h5: %d tensors, step %lld (%.2f s)", model_file,
                argv[1], ct_model_n_params(m), step, ct_now() - t0);
  ct_model_destroy(m);
  return st;
}
