/*
 * log.h: one line per event on stderr:
 *   2026-12-02T13:06:04.123Z INFO vmd req=0123abcd sandbox sb-1 created
 * Level and component first so operators can grep; the request id is the
 * RPC's, or "-" outside a call. Thread-safe (one write(2) per line).
 * Not for: metrics, or anything a client reads.
 */
#ifndef MOAT_LOG_H
#define MOAT_LOG_H

#include <stdint.h>

enum moat_log_level {
	MOAT_LOG_DEBUG = 0,
	MOAT_LOG_INFO = 1,
	MOAT_LOG_WARN = 2,
	MOAT_LOG_ERROR = 3,
};

/* moat_log_init: sets the component name (copied, at most 31 chars) and
 * the lowest level written. Call once at start; before it, component is
 * "moat" and level INFO. MOAT_LOG_LEVEL=debug|info|warn|error overrides
 * `level`. */
void moat_log_init(const char *component, enum moat_log_level level);

/* moat_log: writes one line. request_id 0 prints "-". */
void moat_log(enum moat_log_level level, uint64_t request_id, const char *fmt,
    ...) __attribute__((format(printf, 3, 4)));

#define moat_debug(rid, ...) moat_log(MOAT_LOG_DEBUG, (rid), __VA_ARGS__)
#define moat_info(rid, ...) moat_log(MOAT_LOG_INFO, (rid), __VA_ARGS__)
#define moat_warn(rid, ...) moat_log(MOAT_LOG_WARN, (rid), __VA_ARGS__)
#define moat_error(rid, ...) moat_log(MOAT_LOG_ERROR, (rid), __VA_ARGS__)

#endif
