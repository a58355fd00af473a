/*
 * status.c: names of the project's status codes and the mapping of errno
 * and nng errors onto them. Not for: messages (callers write those).
 */
#include <errno.h>
#include <nng/nng.h>

#include "moat/status.h"

static const char *const status_names[] = {
	[MOAT_OK] = "OK",
	[MOAT_CANCELLED] = "CANCELLED",
	[MOAT_UNKNOWN] = "UNKNOWN",
	[MOAT_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
	[MOAT_DEADLINE_EXCEEDED] = "DEADLINE_EXCEEDED",
	[MOAT_NOT_FOUND] = "NOT_FOUND",
	[MOAT_ALREADY_EXISTS] = "ALREADY_EXISTS",
	[MOAT_PERMISSION_DENIED] = "PERMISSION_DENIED",
	[MOAT_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
	[MOAT_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
	[MOAT_ABORTED] = "ABORTED",
	[MOAT_OUT_OF_RANGE] = "OUT_OF_RANGE",
	[MOAT_UNIMPLEMENTED] = "UNIMPLEMENTED",
	[MOAT_INTERNAL] = "INTERNAL",
	[MOAT_UNAVAILABLE] = "UNAVAILABLE",
	[MOAT_DATA_LOSS] = "DATA_LOSS",
	[MOAT_UNAUTHENTICATED] = "UNAUTHENTICATED",
};

const char *
moat_strerror(int code)
{
	if (code < 0 || code > MOAT_STATUS_MAX)
		return "UNKNOWN";
	return status_names[code];
}

int
moat_status_from_errno(int err)
{
	switch (err) {
	case 0:
		return MOAT_OK;
	case ENOENT:
	case ESRCH:
		return MOAT_NOT_FOUND;
	case EACCES:
	case EPERM:
	case EROFS:
		return MOAT_PERMISSION_DENIED;
	case ENOSPC:
	case ENOMEM:
	case EMFILE:
	case ENFILE:
	case EDQUOT:
	case EFBIG:
		return MOAT_RESOURCE_EXHAUSTED;
	case EINVAL:
	case ENAMETOOLONG:
	case ENOTDIR:
	case EISDIR:
	case ELOOP:
		return MOAT_INVALID_ARGUMENT;
	case EEXIST:
	case ENOTEMPTY:
		return MOAT_ALREADY_EXISTS;
	case ETIMEDOUT:
		return MOAT_DEADLINE_EXCEEDED;
	case ECONNREFUSED:
	case ECONNRESET:
	case EPIPE:
	case ENOTCONN:
		return MOAT_UNAVAILABLE;
	case EINTR:
	case ECANCELED:
		return MOAT_CANCELLED;
	case ENOSYS:
	case EOPNOTSUPP:
		return MOAT_UNIMPLEMENTED;
	default:
		return MOAT_INTERNAL;
	}
}

int
moat_status_from_nng(int nng_err)
{
	switch (nng_err) {
	case 0:
		return MOAT_OK;
	case NNG_ETIMEDOUT:
		return MOAT_DEADLINE_EXCEEDED;
	case NNG_ECONNREFUSED:
	case NNG_ECLOSED:
	case NNG_ECONNRESET:
	case NNG_ECONNSHUT:
	case NNG_EADDRINVAL:
	case NNG_EUNREACHABLE:
	case NNG_ESTATE:
		return MOAT_UNAVAILABLE;
	case NNG_ECANCELED:
	case NNG_EINTR:
		return MOAT_CANCELLED;
	case NNG_ENOMEM:
	case NNG_EMSGSIZE:
		return MOAT_RESOURCE_EXHAUSTED;
	case NNG_EINVAL:
		return MOAT_INVALID_ARGUMENT;
	case NNG_EPERM:
	case NNG_EPEERAUTH:
	case NNG_ECRYPTO:
		return MOAT_PERMISSION_DENIED;
	case NNG_ENOTSUP:
		return MOAT_UNIMPLEMENTED;
	default:
		return MOAT_INTERNAL;
	}
}

int
moat_status_exit_code(int code)
{
	/* 0 is success; 1 stays for "the program in the sandbox failed";
	 * moat's own failures use 64 + code so scripts can tell them apart. */
	if (code == MOAT_OK)
		return 0;
	if (code < 0 || code > MOAT_STATUS_MAX)
		code = MOAT_UNKNOWN;
	return 64 + code;
}
