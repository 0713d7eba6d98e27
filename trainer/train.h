/* trainer/train.h — the training loop: `ctrain train CONFIG.toml [key=value ...]`. */
#ifndef CT_TRAIN_H
#define CT_TRAIN_H

#include "common/status.h"
#include "trainer/config.h"

typedef struct ct_train_result {
  int steps;
  double final_loss;      /* last training step's loss */
  double final_val_loss;  /* NAN when there is no validation set */
  double tokens_per_s;    /* mean over steps after the first */
  double seconds;
  int stop_signal;        /* SIGTERM / SIGINT / SIGUSR1 that stopped the run early, else 0 */
} ct_train_result;

/* Runs training for a loaded, validated config. */
ct_status ct_train_run(const ct_config *cfg, ct_train_result *res);

ct_status ct_cmd_train(int argc, char **argv);

#endif
