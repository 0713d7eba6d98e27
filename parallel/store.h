/* parallel/store.h — TCP key-value store for rendezvous (the analogue of torch's TCPStore).
 *
 * One server per run: hosted by ctrain-launch on node 0 (inside the launcher's poll() loop),
 * or by rank 0 on a background thread when srun / mpirun start the workers (there is no
 * launcher then). Every process that needs to agree on something (Gloo / NCCL unique ids,
 * barriers, the launcher's own rendezvous) connects as a client.
 *
 * Keys are NUL-terminated strings of at most CT_STORE_MAX_KEY bytes; values are arbitrary
 * bytes of at most CT_STORE_MAX_VALUE bytes. ct_store_add keeps its counter as a decimal
 * string, so a get after an add reads e.g. "3".
 *
 * Security: the first message of every connection carries the run's token (a random 128-bit
 * hex string made by the launcher and handed to workers in CTRAIN_STORE_TOKEN). A connection
 * with a wrong token is answered "refused" and closed; the client call then fails with
 * CT_ERR_RUNTIME "store at HOST:PORT refused the connection: wrong token".
 *
 * Timeouts: every blocking call takes a timeout in seconds (<= 0 means the default of
 * CT_STORE_DEFAULT_TIMEOUT_S). A timeout is CT_ERR_RUNTIME naming the key(s) and the time
 * waited, never a hang; a server that goes away is CT_ERR_RUNTIME naming HOST:PORT.
 *
 * Threads: a client handle serializes its calls with a mutex, so it may be shared, but a
 * blocking get/wait holds the handle until it returns; threads that wait on each other need
 * a handle each (ct_store_clone). The server is single-threaded: either the caller's loop
 * drives it (ct_store_server_poll_fds + ct_store_server_handle) or its own thread does
 * (ct_store_server_start_thread), never both.
 *
 * All calls return a ct_status and record a message (ct_last_error) on failure.
 */
#ifndef CT_STORE_H
#define CT_STORE_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define CT_STORE_MAX_KEY 4096
#define CT_STORE_MAX_VALUE (256u << 20) /* 256 MiB */
#define CT_STORE_DEFAULT_TIMEOUT_S 300.0
#define CT_STORE_TOKEN_LEN 32 /* hex characters of a launcher-made token (128 bits) */

typedef struct ct_store ct_store;               /* a client connection */
typedef struct ct_store_server ct_store_server; /* the server */

/* ---- server ---- */

/* Listens on bind_host:port (bind_host NULL or "" = all interfaces; port 0 = a free port,
 * reported in *bound_port, which may be NULL). `token` is copied; NULL or "" accepts any
 * token (tests only). A port already in use is CT_ERR_USAGE with one line naming the port
 * and "already in use". The new server owns its sockets; free it with ct_store_server_stop. */
ct_status ct_store_server_start(const char *bind_host, int port, const char *token,
                                ct_store_server **out, int *bound_port);

/* Integrated mode (the launcher's event loop). ct_store_server_nfds says how many pollfd
 * entries the next ct_store_server_poll_fds call will fill (the listening socket plus one
 * per client); poll_fds fills up to `cap` entries and returns how many it filled. After
 * poll(), pass the same entries back to ct_store_server_handle, which accepts, reads,
 * answers, parks and wakes waiting requests, and expires parked requests whose timeout has
 * passed. ct_store_server_timeout_ms is the poll() timeout the server needs for its next
 * expiry (-1 when nothing is parked); the caller may poll for less. A misbehaving client
 * only loses its own connection: handle returns an error only when the listening socket
 * itself fails. */
int ct_store_server_nfds(const ct_store_server *s);
int ct_store_server_poll_fds(ct_store_server *s, struct pollfd *fds, int cap);
ct_status ct_store_server_handle(ct_store_server *s, const struct pollfd *fds, int n);
int ct_store_server_timeout_ms(const ct_store_server *s);

/* Direct access for the thread that drives the server (e.g. the node-0 launcher, which
 * cannot be a blocking client of its own loop). local_set wakes parked waiters exactly like a
 * client's set; local_get copies nothing: *val points into the server's table and is valid
 * until the next server call (NULL when the key is absent, and then CT_OK with *found false).
 * local_add is the atomic counter. Not for use while a server thread runs. */
ct_status ct_store_server_local_set(ct_store_server *s, const char *key, const void *val, size_t len);
ct_status ct_store_server_local_get(ct_store_server *s, const char *key, const void **val,
                                    size_t *len, bool *found);
ct_status ct_store_server_local_add(ct_store_server *s, const char *key, int64_t delta,
                                    int64_t *new_value);

/* Thread mode (rank 0 under srun / mpirun): serves on a background thread until stop. */
ct_status ct_store_server_start_thread(ct_store_server *s);

/* Stops the thread if one runs, closes every socket and frees the server. NULL is a no-op. */
void ct_store_server_stop(ct_store_server *s);

/* Thread mode: waits until every client has closed its connection (or timeout_s passes), then
 * stops. Rank 0 closes its own client and calls this, so a peer that is still leaving the last
 * barrier never finds the store gone. */
void ct_store_server_stop_when_idle(ct_store_server *s, double timeout_s);

/* ---- client ---- */

/* Connects to host:port and presents `token`, retrying (with backoff) while the server is not
 * up yet, until timeout_s passes. The handle owns its socket; free it with ct_store_close. */
ct_status ct_store_connect(const char *host, int port, const char *token, double timeout_s,
                           ct_store **out);

/* A second connection to the same server with the same token and key prefix (for another
 * thread). */
ct_status ct_store_clone(ct_store *s, double timeout_s, ct_store **out);

/* Sets key to a copy of val[0..len) (replacing any value) and wakes its waiters. */
ct_status ct_store_set(ct_store *s, const char *key, const void *val, size_t len);

/* Blocks until key exists (or timeout), then returns a malloc'd copy of its value in *val
 * (caller frees; one extra NUL byte follows the value, so string values can be used as is)
 * and its length in *len (len may be NULL). */
ct_status ct_store_get(ct_store *s, const char *key, double timeout_s, void **val, size_t *len);

/* Blocks until every key in keys[0..n) exists. The timeout error names the missing keys. */
ct_status ct_store_wait(ct_store *s, const char *const *keys, int n, double timeout_s);

/* Atomically adds delta to the counter at key (absent = 0) and returns the new value in
 * *new_value (may be NULL). add(key, 0) reads a counter. CT_ERR_RUNTIME if the key holds a
 * value that is not a decimal integer. Wakes waiters of key. */
ct_status ct_store_add(ct_store *s, const char *key, int64_t delta, int64_t *new_value);

/* Removes key; *existed (may be NULL) says whether it was there. */
ct_status ct_store_delete(ct_store *s, const char *key, bool *existed);

/* Non-blocking: *exists says whether key is set now. */
ct_status ct_store_check(ct_store *s, const char *key, bool *exists);

/* Blocks until all `world` ranks have called barrier with the same name. Reusable: the k-th
 * call with a name on every rank forms the k-th barrier of that name. The timeout error says
 * how many ranks arrived and lists the missing ones (up to 16). Keys live under "ct/barrier/". */
ct_status ct_store_barrier(ct_store *s, const char *name, int rank, int world, double timeout_s);

/* Prepends `prefix` (copied; NULL or "" for none) to every key this handle sends, so that
 * e.g. each restart of a worker group gets fresh keys ("w1/...") on a store that outlives
 * it. Error messages name keys without the prefix. */
ct_status ct_store_set_prefix(ct_store *s, const char *prefix);

/* Bounds how long this handle waits on a server that stopped answering (a cut link sends no
 * FIN, so only a clock notices): quick requests (set, add, check, delete) fail after `seconds`,
 * and a get/wait fails `seconds` (at most the usual 10 s margin) past its own timeout.
 * <= 0 restores the defaults (60 s; 10 s). The launcher's heartbeat connection uses its
 * --heartbeat_timeout, so a node cut off from node 0 notices within that time. */
void ct_store_set_io_timeout(ct_store *s, double seconds);

/* "HOST:PORT" of the server this client talks to (valid while the handle lives). */
const char *ct_store_address(const ct_store *s);

/* Closes the connection and frees the handle. NULL is a no-op. */
void ct_store_close(ct_store *s);

/* Fills out[CT_STORE_TOKEN_LEN + 1] with a random 128-bit hex token (from getrandom()). */
ct_status ct_store_make_token(char *out);

#endif
