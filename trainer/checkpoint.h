/* trainer/checkpoint.h — checkpoint directories with exact resume.
 *
 * <out_dir>/ckpt/step_NNNNNNNN/
 *   model.h5   every parameter as an fp32 dataset named as in the parameter table (shape as
 *              the table, chunked, Fletcher32-checksummed); root attributes "config" (the
 *              resolved config as TOML text) and "step". Layouts whose weights are sharded
 *              (zero3, tensor parallelism) write no datasets here but root attribute
 *              weight_shards = N: the weights are blocks in model-rank*.h5 (see below), and
 *              ct_checkpoint_load_params reassembles them.
 *   state.h5   training state (absent in weights-only checkpoints such as import-hf output;
 *              sharded layouts keep the moments in state-rank*.h5, see below):
 *              groups adam_m/ and adam_v/ (one dataset per parameter, same names: a checkpoint
 *              is resharded by name, not by offset), root attributes step, adam_step,
 *              data_position, data_seed, world_size, rank, loss_scale, scaler_good_steps,
 *              and the layout it was saved from: parallel_data ("ddp", "zero3", ...) and
 *              tensor_parallel (informational: readers always assemble whole tensors, from
 *              model.h5 / state.h5 or from the shard files, so any layout loads any checkpoint).
 * The directory is written as step_NNNNNNNN.tmp and renamed when complete; <out_dir>/ckpt/latest
 * (a symlink) is replaced atomically afterwards; older step directories beyond keep_last are
 * removed last. A crash at any point leaves the previous checkpoint intact and `latest`
 * pointing at a complete one. CT_CKPT_ABORT_AFTER=N (testing only) aborts the process after N
 * tensors have been written.
 */
#ifndef CT_CHECKPOINT_H
#define CT_CHECKPOINT_H

#include <stdint.h>

#include "common/status.h"
#include "optim/optim.h"
#include "trainer/config.h"
#include "trainer/model.h"

typedef struct ct_train_state {
  int step;                   /* completed optimizer steps */
  uint64_t data_position;     /* windows drawn by all ranks together (per-rank position x world),
                               * so a resume at another world size continues the shared stream */
  uint64_t data_seed;
  int world_size, rank;
  double loss_scale;          /* fp16 dynamic loss scale (1 when unused) */
  int scaler_good_steps;
  char parallel_data[8];      /* layout it was saved from: parallel.data ("" = ddp) */
  int tensor_parallel;        /* ... and the tensor-parallel degree (0 = 1) */
  ct_adamw *opt;              /* moments are saved from / loaded into opt->m, opt->v */
} ct_train_state;

/* Saves model (+ state when `ts` is not NULL) as <out_dir>/ckpt/step_<step>, updates latest,
 * prunes. `saved_path` (optional) receives the directory. */
ct_status ct_checkpoint_save(const char *out_dir, int step, const ct_config *cfg, ct_model *m,
                             const ct_train_state *ts, int keep_last, char *saved_path,
                             size_t saved_cap);

/* Writes a checkpoint directory `dir` (model.h5, plus state.h5 when ts != NULL), as dir.tmp
 * renamed over `dir` when complete. import-hf uses it weights-only. */
ct_status ct_checkpoint_write_dir(const char *dir, int step, const ct_config *cfg, ct_model *m,
                                  const ct_train_state *ts);

/* Resolves a user path (a step directory, <out_dir>/ckpt/latest, or <out_dir>) to the
 * checkpoint's model file and reads the config stored in it. */
ct_status ct_checkpoint_read_config(const char *path, ct_config *cfg, char *model_file,
                                    size_t model_file_cap);

/* Loads parameters into a model whose table matches, from model.h5's tensors or, when model.h5
 * says weight_shards, from the model-rank*.h5 files beside it. Missing or mis-shaped tensors,
 * missing shard files, uncovered elements, checksum failures and truncated files are
 * CT_ERR_INPUT naming the file and the tensor. */
ct_status ct_checkpoint_load_params(const char *model_file, ct_model *m);

/* Loads state.h5 next to model_file into *ts (and ts->opt's moments). CT_ERR_INPUT if the
 * checkpoint has no training state or it does not match the model. */
ct_status ct_checkpoint_load_state(const char *model_file, ct_model *m, ct_train_state *ts);

/* ---- sharded optimizer state (ZeRO, tensor parallelism) ----
 * The AdamW moments are not gathered: every rank writes its own pieces into the step's temporary
 * directory as state-rank<RANK>.h5, groups m/<tensor>/ and v/<tensor>/ holding datasets 0, 1, ...
 * each a block [row0, row0 + rows) x [col0, col0 + cols) of the whole tensor (attributes row0,
 * col0; Fletcher32). A ZeRO slice of a flat buffer becomes up to 3 blocks per tensor (partial
 * row, whole rows, partial row), a tensor-parallel slice one block per segment (q, k, v heads;
 * gate, up). state.h5 then holds no moments but attribute shards = the number of shard files,
 * and ct_checkpoint_load_state assembles whole moments from all of them, whatever layout wrote
 * them, checking that every element of every tensor is covered.
 * Weights: where no rank holds them whole (zero3: each rank has a 1/N slice; parallel.tensor > 1:
 * each tp rank has its heads / halves) they are not gathered either. Each shard-writing rank
 * also writes model-rank<RANK>.h5 with group w/<tensor>/ holding the same blocks of the weights
 * (same cuts, same row0/col0, Fletcher32); model.h5 then holds no tensors, only config, step
 * and weight_shards = N (the files model-rank00000.h5 ... model-rank<N-1>.h5, written by ranks
 * 0..N-1). ct_checkpoint_load_params reassembles whole weights from them (every element covered,
 * a missing file named), so generate, eval, export-hf, export-gguf, init_from and resume read
 * them unchanged. zero1/zero2 without tensor parallelism keep every rank's full weights, so
 * rank 0 still writes them whole to model.h5 (no weight shards).
 * Protocol: rank 0 ct_checkpoint_tmp_dir(create) -> barrier -> every writing rank
 * ct_checkpoint_write_shard -> agreement that all succeeded -> rank 0 ct_checkpoint_save_sharded
 * (model.h5, state.h5, rename, latest, prune). A crash anywhere leaves only a .tmp directory. */
typedef struct ct_ckpt_range {
  size_t lo, hi;        /* floats [lo, hi) of the flat buffer of `local` */
  const float *m, *v;   /* (hi - lo) host floats each */
  const float *w;       /* (hi - lo) host floats of the fp32 weights, or NULL in every range:
                         * the weights are written whole to model.h5 instead */
} ct_ckpt_range;

/* <out_dir>/ckpt/step_<step>.tmp into tmp; with create (rank 0 only) made afresh and empty. */
ct_status ct_checkpoint_tmp_dir(const char *out_dir, int step, bool create, char *tmp, size_t cap);

/* Writes tmp/state-rank<rank>.h5 with the moments of `ranges` of the flat buffer of `local`
 * (the tensor-parallel model of rank tp_rank, or the model itself) as blocks of the tensors of
 * `full` (the same table with whole shapes; only its table is read), and, when the ranges carry
 * weights, tmp/model-rank<rank>.h5 with the same blocks of the weights. */
ct_status ct_checkpoint_write_shard(const char *tmp, int rank, const ct_model *full,
                                    const ct_model *local, int tp_rank, const ct_ckpt_range *ranges,
                                    int n);

/* As ct_checkpoint_save, into the existing tmp directory holding n_shards shard files; ts->opt
 * is not read. weights_sharded: the shard files carry the weights too (model-rank*.h5), model.h5
 * gets weight_shards = n_shards and no tensors, and m's weights are not read (m's table is). */
ct_status ct_checkpoint_save_sharded(const char *out_dir, int step, const ct_config *cfg,
                                     ct_model *m, const ct_train_state *ts, int n_shards,
                                     bool weights_sharded, int keep_last, char *saved_path,
                                     size_t saved_cap);

/* `ctrain consolidate CKPT OUT_CKPT`: a weights-only checkpoint with whole tensors in model.h5
 * (same config and step) from any checkpoint, sharded or not: for tools that read model.h5's
 * datasets directly (h5py, h5diff). */
ct_status ct_cmd_consolidate(int argc, char **argv);

/* Path of <out_dir>/ckpt/latest/model.h5 if it exists (returns false otherwise). */
bool ct_checkpoint_latest(const char *out_dir, char *model_file, size_t cap);

#endif
