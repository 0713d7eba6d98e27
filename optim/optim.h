/* optim/optim.h — AdamW over the flat parameter table, global-norm clipping, lr schedules.
 *
 * Optimizer state (m, v) mirrors the flat parameter buffer (same offsets). Weight decay is
 * decoupled and applies to 2-D parameters only (ct_param.decay), as in nanoGPT / HF recipes.
 */
#ifndef CT_OPTIM_H
#define CT_OPTIM_H

#include "common/status.h"
#include "trainer/config.h"
#include "trainer/model.h"

typedef struct ct_adamw {
  float *m, *v;   /* (hi - lo) first and second moments of the owned slice, backend memory */
  size_t numel;   /* floats in the model's flat buffer */
  size_t lo, hi;  /* the slice of the flat buffer this optimizer updates ([0, numel) unsharded;
                   * ZeRO-1: one rank's contiguous shard) */
  int step;       /* completed optimizer steps */
  double lr, beta1, beta2, eps, weight_decay;
  ct_adamw_seg *segs; /* backend memory: the slice cut into segments for adamw_multi (built at */
  int nseg;           /* the first step) */
} ct_adamw;

ct_status ct_adamw_create(ct_adamw *opt, const ct_model *model, const ct_train_cfg *t);
/* An optimizer for the slice [lo, hi) of the flat buffer only (ZeRO-1 shard). */
ct_status ct_adamw_create_shard(ct_adamw *opt, const ct_model *model, const ct_train_cfg *t,
                                size_t lo, size_t hi);
void ct_adamw_destroy(ct_adamw *opt, const ct_ops *ops);

/* Global L2 norm of all gradients (double accumulation). */
double ct_grad_norm(ct_model *model);

/* One update of the optimizer's slice with learning rate `lr`; gradients are read as
 * grad * grad_scale (the clip factor min(1, clip / (norm + 1e-6)), as
 * torch.nn.utils.clip_grad_norm_). Parameters crossing a slice edge are updated piecewise with
 * their own weight-decay setting. */
void ct_adamw_step(ct_adamw *opt, ct_model *model, double lr, float grad_scale);

/* Clip factor for a global norm (1 when clip <= 0 or norm <= clip). */
float ct_clip_scale(double norm, double clip);

/* Dynamic loss scaling for fp16 (torch.cuda.amp.GradScaler semantics): the loss gradient is
 * multiplied by `scale` so small fp16 gradients do not flush to zero; a step whose gradients
 * hold inf/nan is skipped and the scale halves; after `growth_interval` good steps in a row it
 * doubles. The scale and the good-step count are part of the checkpoint. */
typedef struct ct_loss_scaler {
  bool enabled;
  double scale;         /* 2^16 initially; 1 when disabled */
  int good_steps;
  int growth_interval;  /* 2000 */
  double backoff;       /* 0.5 */
} ct_loss_scaler;
#define CT_LOSS_SCALER_INIT {false, 1.0, 0, 2000, 0.5}

/* Enables the scaler with its initial scale (65536). */
void ct_loss_scaler_enable(ct_loss_scaler *s);
/* Records a step's outcome; returns true when the step's gradients are finite and the update
 * should be applied. Adjusts the scale as described above. */
bool ct_loss_scaler_update(ct_loss_scaler *s, bool finite);

/* Learning rate for 0-based step `step` of `max_steps` (train.schedule, warmup, min ratio). */
double ct_lr_at(const ct_train_cfg *t, int step);

#endif
