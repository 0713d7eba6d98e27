/* parallel/env.h — who am I in a distributed run: rank, world, master address, store token.
 *
 * ct_dist_env_detect reads the environment in this order and takes the first that applies:
 *   "launcher": RANK and WORLD_SIZE (ctrain-launch, or anything torchrun-like). With
 *               CTRAIN_STORE_TOKEN the launcher hosts the store at MASTER_ADDR:MASTER_PORT;
 *               without it (variables set by hand) rank 0 hosts it there.
 *   "openmpi":  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE (mpirun).
 *   "slurm":    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NNODES / SLURM_NODEID, inside
 *               an srun step (SLURM_STEP_ID set; a batch script itself is a single process);
 *               master = first host of SLURM_STEP_NODELIST or SLURM_JOB_NODELIST.
 *   "single":   none of these: world size 1.
 * Under mpirun and srun there is no launcher, so rank 0 hosts the store (rank0_hosts_store).
 * Detection only reads the environment; it starts nothing.
 */
#ifndef CT_DIST_ENV_H
#define CT_DIST_ENV_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "parallel/store.h"

#define CT_DIST_DEFAULT_PORT 29500

typedef struct ct_dist_env {
  int rank, world_size;             /* global */
  int local_rank, local_world_size; /* on this node */
  int node_rank, nnodes;
  char master_addr[256];            /* host of the store (and of rank 0) */
  int master_port;                  /* port of the store */
  int restart_count;                /* CTRAIN_RESTART_COUNT (0 outside the launcher) */
  char run_id[128];                 /* CTRAIN_RUN_ID, or the scheduler's job id, or "local" */
  char store_token[128];            /* token every store connection must present */
  bool rank0_hosts_store;           /* srun / mpirun / hand-set variables: rank 0 serves */
  const char *source;               /* "single" | "launcher" | "openmpi" | "slurm" (static) */
} ct_dist_env;

/* Fills *e from the environment. CT_ERR_USAGE with a message naming the variable when the
 * variables are inconsistent (RANK >= WORLD_SIZE, a non-number, a multi-node mpirun without
 * MASTER_ADDR, ...). */
ct_status ct_dist_env_detect(ct_dist_env *e);

/* Opens the store in the right way for e->source, waiting up to timeout_s (<= 0: default):
 *   launcher: connects to MASTER_ADDR:MASTER_PORT with CTRAIN_STORE_TOKEN; *server = NULL.
 *   openmpi / slurm / hand-set: rank 0 starts a server thread on master_port (all interfaces
 *             when nnodes > 1, loopback otherwise) and returns it in *server; every rank,
 *             rank 0 included, connects (127.0.0.1 when nnodes == 1).
 *   single:   a private loopback server on a free port plus one client, so code paths are
 *             the same at world size 1.
 * Under the launcher the client's keys are prefixed "w<restart_count>/" (ct_store_set_prefix),
 * so a restarted group never sees keys (barrier counters, unique ids) left by the group before.
 * The caller owns both: ct_store_close(*client) first, then
 * ct_store_server_stop_when_idle(*server, timeout), which waits for the other ranks to close
 * theirs (a NULL server is a no-op). */
ct_status ct_dist_store_open(const ct_dist_env *e, double timeout_s, ct_store_server **server,
                             ct_store **client);

/* Expands a Slurm host list ("node[01-04,07],gpu-a[1-2],login") into n malloc'd names
 * (zero padding kept: node01 node02 node03 node04 node07 gpu-a1 gpu-a2 login). The caller
 * frees each name and the array. CT_ERR_INPUT naming the list when it is malformed. */
ct_status ct_slurm_expand_nodelist(const char *list, char ***names, int *n);

/* One line for logs: "rank 3/8 (local 1/4, node 1/2) via slurm, store 10.0.0.1:29617". */
void ct_dist_env_describe(const ct_dist_env *e, char *buf, size_t cap);

#endif
