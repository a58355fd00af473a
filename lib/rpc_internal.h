/*
 * rpc_internal.h: the parts of the RPC server that tests and fuzz targets
 * reach without a socket: building a dispatcher for a service and feeding
 * it one encoded Envelope; and what a client knows of its timed-out calls.
 * Not for: services or clients (they use
 * moat/rpc.h only); nothing here is a stable interface.
 */
#ifndef MOAT_RPC_INTERNAL_H
#define MOAT_RPC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"

/* moat_rpc_server_new_detached: a server that dispatches `svc` but owns no
 * socket and no workers (for tests and fuzzing). Checks the method table
 * like moat_rpc_server_start. On success *out is the caller's, freed with
 * moat_rpc_server_stop; on failure returns a status and sets *errmsg
 * (heap, caller frees). */
int moat_rpc_server_new_detached(struct moat_rpc_server **out,
    const struct moat_rpc_service *svc, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_rpc_server_dispatch: handles one request exactly as a worker does:
 * decodes `request` (any bytes, from anyone), validates, deduplicates,
 * runs the handler and encodes a moat.v1.Reply into *reply (heap, caller
 * frees) of *reply_len bytes. Thread-safe. Returns 0, or MOAT_INTERNAL
 * when no reply could be built (out of memory); bad input always yields a
 * reply, never an error here. */
int moat_rpc_server_dispatch(struct moat_rpc_server *srv,
    const uint8_t *request, size_t len, uint8_t **reply, size_t *reply_len)
    __attribute__((warn_unused_result));

/* moat_rpc_client_late_replies: how many of c's calls timed out and may
 * still be answered; while any may, moat_rpc_client_close parks the
 * client (socket open) rather than risk nng 1.5's hang on close, and a
 * later moat_rpc_client_close (of any client, or NULL) finishes it. */
unsigned moat_rpc_client_late_replies(struct moat_rpc_client *c);

#endif
