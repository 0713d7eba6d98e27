#include <math.h>
#include <string.h>

#include "optim/optim.h"

double ct_lr_at(const ct_train_cfg *t, int step) {
  const double peak = t->lr, floor = t->lr * t->min_lr_ratio;
  if (step < t->warmup_steps) return peak * (step + 1) / t->warmup_steps;
  if (!strcmp(t->schedule, "constant")) return peak;
  const int span = t->max_steps - t->warmup_steps;
  if (span <= 1) return peak;
  if (!strcmp(t->schedule, "wsd")) {
    /* warmup, then stable at peak, then linear decay over the last decay_frac of the run */
    const int decay = (int)ceil(t->decay_frac * t->max_steps);
    const int start = t->max_steps - decay;
    if (step < start || decay <= 0) return peak;
    const double p = (double)(step - start + 1) / decay;
    return peak + (floor - peak) * p;
  }
  const double p = (double)(step - t->warmup_steps) / (span - 1); /* 0 .. 1 over the rest */
  if (!strcmp(t->schedule, "linear")) return peak + (floor - peak) * p;
  /* cosine */
  return floor + 0.5 * (peak - floor) * (1.0 + cos(M_PI * p));
}

void ct_loss_scaler_enable(ct_loss_scaler *s) {
  s->enabled = true;
  s->scale = 65536.0;
  s->good_steps = 0;
}

bool ct_loss_scaler_update(ct_loss_scaler *s, bool finite) {
  if (!s->enabled) return finite;
  if (!finite) {
    s->scale *= s->backoff;
    s->good_steps = 0;
    return false;
  }
  if (++s->good_steps >= s->growth_interval) {
    s->scale *= 2.0;
    s->good_steps = 0;
  }
  return true;
}
