/* common/log.h — rank-aware logging to stderr. Rank 0 (or a single process) prints info;
 * warnings and errors print from every rank with a "[rankN]" prefix when world > 1. */
#ifndef CT_LOG_H
#define CT_LOG_H

void ct_log_set_rank(int rank, int world);
int ct_log_rank(void);
void ct_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));  /* rank 0 only */
void ct_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));  /* every rank */
void ct_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* every rank */

#endif
