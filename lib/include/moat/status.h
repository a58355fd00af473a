/*
 * status.h: the one set of status codes for the whole project (gRPC's
 * numbering, the same values as moat.v1.Code on the wire) and their names.
 * Not for: carrying messages; a call that fails returns a code and, where
 * it has one, a heap string saying what to do next.
 */
#ifndef MOAT_STATUS_H
#define MOAT_STATUS_H

enum moat_status {
	MOAT_OK = 0,
	MOAT_CANCELLED = 1,
	MOAT_UNKNOWN = 2,
	MOAT_INVALID_ARGUMENT = 3,
	MOAT_DEADLINE_EXCEEDED = 4,
	MOAT_NOT_FOUND = 5,
	MOAT_ALREADY_EXISTS = 6,
	MOAT_PERMISSION_DENIED = 7,
	MOAT_RESOURCE_EXHAUSTED = 8,
	MOAT_FAILED_PRECONDITION = 9,
	MOAT_ABORTED = 10,
	MOAT_OUT_OF_RANGE = 11,
	MOAT_UNIMPLEMENTED = 12,
	MOAT_INTERNAL = 13,
	MOAT_UNAVAILABLE = 14,
	MOAT_DATA_LOSS = 15,
	MOAT_UNAUTHENTICATED = 16,
};

#define MOAT_STATUS_MAX MOAT_UNAUTHENTICATED

/* moat_strerror: "NOT_FOUND" for MOAT_NOT_FOUND; "UNKNOWN" for values out
 * of range. Static storage, never freed. */
const char *moat_strerror(int code);

/* moat_status_from_errno: the closest status for an errno value (ENOENT ->
 * NOT_FOUND, EACCES -> PERMISSION_DENIED, ENOSPC -> RESOURCE_EXHAUSTED,
 * EINVAL -> INVALID_ARGUMENT, ETIMEDOUT -> DEADLINE_EXCEEDED, ...). */
int moat_status_from_errno(int err);

/* moat_status_from_nng: the status for an nng error (NNG_ETIMEDOUT ->
 * DEADLINE_EXCEEDED, NNG_ECONNREFUSED/NNG_ECLOSED -> UNAVAILABLE, ...). */
int moat_status_from_nng(int nng_err);

/* moat_status_exit_code: a process exit code for a status, so scripts can
 * tell kinds of failure apart (documented in README). */
int moat_status_exit_code(int code);

#endif
