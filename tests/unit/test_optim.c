/* Learning-rate schedules (warmup, constant, linear, cosine, warmup-stable-decay) at their
 * defining points, and the clip factor of global-norm clipping. */
#include <math.h>
#include <string.h>

#include "ct_test.h"
#include "optim/optim.h"

static ct_train_cfg cfg(const char *schedule, int max_steps, int warmup) {
  ct_config c;
  ct_config_defaults(&c);
  snprintf(c.train.schedule, sizeof c.train.schedule, "%s", schedule);
  c.train.max_steps = max_steps;
  c.train.warmup_steps = warmup;
  c.train.lr = 1.0;
  c.train.min_lr_ratio = 0.1;
  c.train.decay_frac = 0.2;
  return c.train;
}

#define NEAR(a, b) (fabs((a) - (b)) < 1e-12)

int main(void) {
  ct_train_cfg t = cfg("constant", 100, 10);
  /* linear warmup from lr/warmup to lr over the first `warmup` steps */
  CHECK(NEAR(ct_lr_at(&t, 0), 0.1));
  CHECK(NEAR(ct_lr_at(&t, 4), 0.5));
  CHECK(NEAR(ct_lr_at(&t, 9), 1.0));
  CHECK(NEAR(ct_lr_at(&t, 10), 1.0) && NEAR(ct_lr_at(&t, 99), 1.0));

  t = cfg("linear", 110, 10); /* 100 post-warmup steps: 1.0 at step 10 down to 0.1 at step 109 */
  CHECK(NEAR(ct_lr_at(&t, 10), 1.0));
  CHECK(NEAR(ct_lr_at(&t, 109), 0.1));
  CHECK(fabs(ct_lr_at(&t, 10 + 99 / 3) - (1.0 - 0.9 / 3)) < 1e-9);

  t = cfg("cosine", 110, 10);
  CHECK(NEAR(ct_lr_at(&t, 10), 1.0));
  CHECK(NEAR(ct_lr_at(&t, 109), 0.1));
  CHECK(fabs(ct_lr_at(&t, 10) - ct_lr_at(&t, 11)) < 1e-3); /* flat start */
  double mid = ct_lr_at(&t, 10) + ct_lr_at(&t, 109);
  CHECK(fabs(ct_lr_at(&t, 10 + 99 / 2) + ct_lr_at(&t, 10 + 99 - 99 / 2) - mid) < 1e-9); /* symmetric */
  for (int s = 11; s < 110; s++) CHECK(ct_lr_at(&t, s) <= ct_lr_at(&t, s - 1) + 1e-15);

  t = cfg("wsd", 100, 10); /* stable until step 80, then linear to 0.1 at step 99 */
  CHECK(NEAR(ct_lr_at(&t, 5), 0.6));
  CHECK(NEAR(ct_lr_at(&t, 50), 1.0) && NEAR(ct_lr_at(&t, 79), 1.0));
  CHECK(NEAR(ct_lr_at(&t, 99), 0.1));
  CHECK(ct_lr_at(&t, 80) < 1.0 && ct_lr_at(&t, 80) > ct_lr_at(&t, 90));

  /* no warmup: the schedule starts at the peak */
  t = cfg("cosine", 50, 0);
  CHECK(NEAR(ct_lr_at(&t, 0), 1.0));

  /* clipping: torch.nn.utils.clip_grad_norm_ semantics */
  CHECK(ct_clip_scale(0.5, 1.0) == 1.0f);
  CHECK(fabsf(ct_clip_scale(4.0, 1.0) - (float)(1.0 / (4.0 + 1e-6))) < 1e-7f);
  CHECK(ct_clip_scale(100.0, 0.0) == 1.0f); /* clip 0 = off */
  return ct_test_finish();
}
