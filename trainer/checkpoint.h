/* trainer/checkpoint.h — checkpoint directories.
 *
 * <out_dir>/ckpt/step_NNNNNNNN/model.h5 holds every parameter as an fp32 dataset named as in
 * the parameter table (shape as the table, Fletcher32-checksummed), the resolved config as
 * TOML text (root attribute "config") and the step (attribute "step"). The directory is written
 * as step_NNNNNNNN.tmp and renamed when complete; <out_dir>/ckpt/latest (a symlink) is
 * replaced atomically afterwards; older step directories beyond keep_last are removed.
 * (Optimizer state, data position and RNG come with exact resume in the checkpoint issue.)
 */
#ifndef CT_CHECKPOINT_H
#define CT_CHECKPOINT_H

#include "common/status.h"
#include "trainer/config.h"
#include "trainer/model.h"

ct_status ct_checkpoint_save(const char *out_dir, int step, const ct_config *cfg, ct_model *m,
                             int keep_last, char *saved_path, size_t saved_cap);

/* Writes a weights-only checkpoint directory `dir` (model.h5 as above, step 0): written as
 * dir.tmp and renamed over `dir` when complete. Used by import-hf. */
ct_status ct_checkpoint_write_dir(const char *dir, int step, const ct_config *cfg, ct_model *m);

/* Resolves a user path (a step directory, <out_dir>/ckpt/latest, or <out_dir>) to the model
 * file and reads the config stored in it. */
ct_status ct_checkpoint_read_config(const char *path, ct_config *cfg, char *model_file,
                                    size_t model_file_cap);

/* Loads parameters into a model built from that config. Missing or mis-shaped tensors and
 * checksum failures are CT_ERR_INPUT naming the file and the tensor. */
ct_status ct_checkpoint_load_params(const char *model_file, ct_model *m);

#endif
