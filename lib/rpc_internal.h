/*
 * rpc_internal.h: what lib/'s RPC files and their unit tests know of a
 * client's timed-out calls. The detached dispatcher that used to be here
 * is public now (moat/rpc_dispatch.h).
 * Not for: services, clients or the gateway (moat/rpc.h,
 * moat/rpc_dispatch.h); nothing here is a stable interface.
 */
#ifndef MOAT_RPC_INTERNAL_H
#define MOAT_RPC_INTERNAL_H

#include "moat/rpc.h"
#include "moat/rpc_dispatch.h"

/* moat_rpc_client_late_replies: how many of c's calls timed out and may
 * still be answered; while any may, moat_rpc_client_close parks the
 * client (socket open) rather than risk nng 1.5's hang on close, and a
 * later moat_rpc_client_close (of any client, or NULL) finishes it. */
unsigned moat_rpc_client_late_replies(struct moat_rpc_client *c);

#endif
