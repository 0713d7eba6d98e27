/* trainer/main.c — the `ctrain` command line. Only main() prints errors and exits:
 * 0 success, 2 bad usage/config/input, 1 runtime failure. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "trainer/checkpoint.h"
#include "trainer/data.h"
#include "trainer/device.h"
#include "trainer/generate.h"
#include "trainer/gguf.h"
#include "trainer/hf.h"
#include "trainer/memory.h"
#include "trainer/train.h"

static const char *USAGE =
    "ctrain — train and run transformer language models\n"
    "\n"
    "usage: ctrain COMMAND [args]\n"
    "  train CONFIG.toml [key=value ...]   train (GPU 0 if present, else the CPU)\n"
    "  prepare [--out-dir DIR] [FILES...]    tokenize text into train/val HDF5 files\n"
    "                                        (default: the Debian fortunes corpus)\n"
    "  generate --model PATH [--prompt TEXT] sample from a checkpoint\n"
    "  eval --model PATH --data FILE.h5      loss and perplexity (--device_map across GPUs)\n"
    "  import-hf DIR OUT_CKPT                Hugging Face model dir -> ctrain checkpoint\n"
    "  export-hf CKPT DIR [--dtype bf16]     ctrain checkpoint -> Hugging Face model dir\n"
    "  consolidate CKPT OUT_CKPT             sharded checkpoint -> whole weights in model.h5\n"
    "  import-gguf FILE.gguf OUT_CKPT        llama GGUF (llama.cpp) model -> ctrain checkpoint\n"
    "  memory CONFIG.toml [--world N]        per-rank memory estimate for the parallel layout\n"
    "  env [--model PATH [--device_map M]]   devices, precision, backends, libraries\n"
    "                                        (and where the model's layers would go)\n"
    "  help                                  this text\n";

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(USAGE, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  ct_status st;
  if (!strcmp(cmd, "train")) st = ct_cmd_train(argc - 2, argv + 2);
  else if (!strcmp(cmd, "prepare")) st = ct_cmd_prepare(argc - 1, argv + 1);
  else if (!strcmp(cmd, "generate")) st = ct_cmd_generate(argc - 2, argv + 2);
  else if (!strcmp(cmd, "eval")) st = ct_cmd_eval(argc - 2, argv + 2);
  else if (!strcmp(cmd, "import-hf")) st = ct_cmd_import_hf(argc - 2, argv + 2);
  else if (!strcmp(cmd, "export-hf")) st = ct_cmd_export_hf(argc - 2, argv + 2);
  else if (!strcmp(cmd, "consolidate")) st = ct_cmd_consolidate(argc - 2, argv + 2);
  else if (!strcmp(cmd, "memory")) st = ct_cmd_memory(argc - 2, argv + 2);
  else if (!strcmp(cmd, "import-gguf")) st = ct_cmd_import_gguf(argc - 2, argv + 2);
  else if (!strcmp(cmd, "env")) st = ct_cmd_env(argc - 2, argv + 2);
  else if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) { fputs(USAGE, stdout); st = CT_OK; }
  else st = ct_set_error(CT_ERR_USAGE, "unknown command \"%s\"\n%s", cmd, USAGE);
  if (st != CT_OK) {
    fflush(stdout);
    fprintf(stderr, "ctrain %s: error: %s\n", cmd, ct_last_error()[0] ? ct_last_error() : ct_status_str(st));
  }
  return ct_status_exit_code(st);
}
