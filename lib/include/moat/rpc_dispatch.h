/*
 * moat/rpc_dispatch.h: an RPC server's dispatcher without its socket, for
 * a door that receives calls by another transport and answers them in
 * process exactly as the nng server would (the gateway's HTTP/JSON door
 * and /mcp, which wait for each reply; the gRPC door, which does not),
 * and for tests and fuzz targets that feed it bytes.
 * Not for: serving over nng (moat_rpc_server_start in moat/rpc.h) or
 * calling a service (moat_rpc_call).
 */
#ifndef MOAT_RPC_DISPATCH_H
#define MOAT_RPC_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"

/* moat_rpc_server_new_detached: a server that dispatches `svc` but owns no
 * socket and no workers. Checks the method table like
 * moat_rpc_server_start, and keeps pointers to `svc`'s descriptor, table
 * and ctx, which must outlive it. On success *out is the caller's, freed
 * with moat_rpc_server_stop; on failure returns a status and sets *errmsg
 * (heap, caller frees). */
int moat_rpc_server_new_detached(struct moat_rpc_server **out,
    const struct moat_rpc_service *svc, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_rpc_server_dispatch: handles one request exactly as a worker does:
 * decodes `request` (a packed moat.v1.Envelope: any bytes, from anyone),
 * validates, deduplicates, runs the handler on the calling thread and
 * encodes a moat.v1.Reply into *reply (heap, caller frees) of *reply_len
 * bytes. Thread-safe. Returns 0, or MOAT_INTERNAL when no reply could be
 * built (out of memory); bad input always yields a reply, never an error
 * here. */
int moat_rpc_server_dispatch(struct moat_rpc_server *srv,
    const uint8_t *request, size_t len, uint8_t **reply, size_t *reply_len)
    __attribute__((warn_unused_result));

/* Called exactly once with a call's encoded moat.v1.Reply: `reply` is
 * heap and the callee's to free (NULL, len 0, when out of memory). */
typedef void (
    *moat_rpc_dispatch_done)(void *arg, uint8_t *reply, size_t reply_len);

/* moat_rpc_server_dispatch_async: moat_rpc_server_dispatch without
 * waiting for a deferred reply, so that a door whose calls wait for long
 * (an exec) holds no thread while they do. The handler runs on the
 * calling thread; when it answers at once, done(arg, ...) runs on the
 * calling thread before this returns; when it defers (moat_rpc_defer),
 * this returns at once and done runs on the thread that completes the
 * call (moat_rpc_complete), possibly before this returns. No deadline
 * answer is made here (no thread waits to make one): the handler's
 * completion must come by itself, as the gateway's forwarded calls do
 * (their node call has the same timeout); a door that must answer by a
 * deadline answers itself and still gets done later. Stopping `srv`
 * (moat_rpc_server_stop) while calls are pending is allowed: its memory
 * stays until the last one completes, whose done still runs once; only a
 * call its handler never completes is lost (as with any deferred call).
 * Returns 0 when done will run (or ran), MOAT_INTERNAL (out of memory)
 * when it never will. Thread-safe. */
int moat_rpc_server_dispatch_async(struct moat_rpc_server *srv,
    const uint8_t *request, size_t len, moat_rpc_dispatch_done done, void *arg)
    __attribute__((warn_unused_result));

#endif
