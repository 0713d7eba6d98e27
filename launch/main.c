/* launch/main.c — `ctrain-launch`: parse the command line, run the agent, exit with its code.
 * 0 success, 2 bad usage (unknown option, port in use), else the failing worker's code
 * (128 + signal when it died by one), or 128 + signal when the launcher itself was stopped. */
#include <stdio.h>

#include "common/status.h"
#include "launch/launch.h"

int main(int argc, char **argv) {
  ct_launch_config cfg = CT_LAUNCH_CONFIG_INIT;
  bool help = false;
  ct_status st = ct_launch_parse(argc, argv, &cfg, &help);
  if (st != CT_OK) {
    fprintf(stderr, "ctrain-launch: error: %s\n", ct_last_error());
    ct_launch_config_free(&cfg);
    return ct_status_exit_code(st);
  }
  int code = help ? 0 : ct_agent_run(&cfg);
  ct_launch_config_free(&cfg);
  return code;
}
