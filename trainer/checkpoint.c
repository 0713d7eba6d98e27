#include "trainer/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

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

static ct_status write_model_file(const char *path, int step, const ct_config *cfg, ct_model *m) {
  ct_status st = CT_OK;
  const size_t numel = ct_model_numel(m);
  float *host = ct_malloc(numel * sizeof(float), "checkpoint staging");
  if (!host) return CT_ERR_NOMEM;
  ct_model_ops(m)->to_host(host, ct_model_params(m), numel * sizeof(float));
  char *toml = ct_config_to_toml(cfg);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0 || !toml) {
    st = ct_set_error(CT_ERR_IO, "%s: cannot create checkpoint file", path);
    goto done;
  }
  CT_TRY_GOTO(write_string_attr(f, "config", toml), done);
  CT_TRY_GOTO(write_i64(f, "step", step), done);
  CT_TRY_GOTO(write_tensors(f, path, "", m, host), done);
done:
  if (f >= 0 && H5Fclose(f) < 0 && st == CT_OK) st = ct_set_error(CT_ERR_IO, "%s: close failed", path);
  free(toml);
  free(host);
  return st;
}

static ct_status write_state_file(const char *path, const ct_train_state *ts, ct_model *m) {
  ct_status st = CT_OK;
  const size_t numel = ct_model_numel(m);
  float *host = ct_malloc(numel * sizeof(float), "checkpoint staging");
  if (!host) return CT_ERR_NOMEM;
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

ct_status ct_checkpoint_write_dir(const char *dir, int step, const ct_config *cfg, ct_model *m,
                                  const ct_train_state *ts) {
  char tmp[4200], file[4300];
  const char *abort_env = getenv("CT_CKPT_ABORT_AFTER");
  abort_after = abort_env ? atol(abort_env) : -1;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  snprintf(tmp, sizeof tmp, "%s.tmp", dir);
  remove_tree(tmp);
  if (mkdir(tmp, 0777) != 0)
    return ct_set_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  snprintf(file, sizeof file, "%s/model.h5", tmp);
  ct_status st = write_model_file(file, step, cfg, m);
  if (st == CT_OK && ts) {
    snprintf(file, sizeof file, "%s/state.h5", tmp);
    st = write_state_file(file, ts, m);
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

ct_status ct_checkpoint_save(const char *out_dir, int step, const ct_config *cfg, ct_model *m,
                             const ct_train_state *ts, int keep_last, char *saved_path,
                             size_t saved_cap) {
  char ckdir[4096], final[4200], link_tmp[4200], link[4200], target[64];
  snprintf(ckdir, sizeof ckdir, "%s/ckpt", out_dir);
  CT_TRY(ct_mkdirs(ckdir));
  snprintf(target, sizeof target, "step_%08d", step);
  snprintf(final, sizeof final, "%s/%s", ckdir, target);
  CT_TRY(ct_checkpoint_write_dir(final, step, cfg, m, ts));
  snprintf(link, sizeof link, "%s/latest", ckdir);
  snprintf(link_tmp, sizeof link_tmp, "%s/latest.tmp", ckdir);
  unlink(link_tmp);
  if (symlink(target, link_tmp) != 0 || rename(link_tmp, link) != 0)
    return ct_set_error(CT_ERR_IO, "cannot update %s: %s", link, strerror(errno));
  prune(ckdir, keep_last);
  if (saved_path) snprintf(saved_path, saved_cap, "%s", final);
  return CT_OK;
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
  ct_status st = host ? read_tensors(f, model_file, "", m, host) : CT_ERR_NOMEM;
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
  CT_TRY_GOTO(read_tensors(f, path, "adam_m", m, host), done);
  ct_model_ops(m)->to_device(ts->opt->m, host, numel * sizeof(float));
  CT_TRY_GOTO(read_tensors(f, path, "adam_v", m, host), done);
  ct_model_ops(m)->to_device(ts->opt->v, host, numel * sizeof(float));
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
