/* common/status.h — status codes and the per-thread last-error message.
 *
 * Library code never prints or exits: it returns a ct_status and, on failure, records a
 * message naming what went wrong (file, key, line, rank, CUDA call) with ct_set_error().
 * Only main() and tests print ct_last_error() and exit with ct_status_exit_code().
 *
 *     CT_TRY(ct_toml_parse_file(path, &doc));          // return on failure
 *     CT_TRY_GOTO(ct_model_create(&cfg, &m), fail);     // jump to cleanup on failure
 */
#ifndef CT_STATUS_H
#define CT_STATUS_H

typedef enum ct_status {
  CT_OK = 0,
  CT_ERR_USAGE,   /* bad command line                                  -> exit 2 */
  CT_ERR_CONFIG,  /* bad config: syntax, unknown key, type, value       -> exit 2 */
  CT_ERR_INPUT,   /* bad input data: missing file, bad tokens, format   -> exit 2 */
  CT_ERR_IO,      /* read/write failure of something that should work   -> exit 1 */
  CT_ERR_NOMEM,   /* allocation failed                                  -> exit 1 */
  CT_ERR_RUNTIME, /* anything else that went wrong while running        -> exit 1 */
} ct_status;

const char *ct_status_str(ct_status s);

/* Process exit code for a status: 0 success, 2 bad usage/config/input, 1 runtime failure. */
int ct_status_exit_code(ct_status s);

/* Records a printf-style message for the calling thread and returns `s`, so that
 * `return ct_set_error(CT_ERR_CONFIG, "%s: unknown key", key);` reads naturally. */
ct_status ct_set_error(ct_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends context to the current message ("loading x.h5: " + old message). */
ct_status ct_add_context(ct_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last message ("" when none). Valid until the next ct_set_error. */
const char *ct_last_error(void);
void ct_clear_error(void);

#define CT_TRY(call)                 \
  do {                               \
    ct_status ct_try_s_ = (call);    \
    if (ct_try_s_ != CT_OK) return ct_try_s_; \
  } while (0)

#define CT_TRY_GOTO(call, label)     \
  do {                               \
    st = (call);                     \
    if (st != CT_OK) goto label;     \
  } while (0)

#endif
