/*
 * mcp_internal.h: the session state mcp.c and tools.c share.
 * Not for: anything outside lib/mcp/.
 */
#ifndef MOAT_MCP_INTERNAL_H
#define MOAT_MCP_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

#include "moat/mcp.h"

struct moat_mcp_session {
	char *allow_dir;      /* heap real path; NULL: no host files */
	char *label;          /* heap; NULL: none */
	pthread_mutex_t lock; /* guards the fields below */
	bool initialized;     /* initialize answered */
	char version[16];     /* the negotiated protocol version */
	char default_sandbox[MOAT_MCP_ID_MAX]; /* "" : none yet */
};

#endif
