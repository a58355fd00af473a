/*
 * egress.h: guest egress by allowlist (issue 14), vmd's side. A sandbox
 * created with network "allowlist" gets a second virtio-serial port
 * (QEMU_EGRESS_PORT, a Unix socket egress.sock in its directory); one
 * thread per such sandbox connects to it and serves the streams the guest
 * agent opens (moat/tunnel.h) as an HTTP proxy: absolute-URI requests by
 * their host, CONNECT by host:port, each checked against the sandbox's
 * allowlist (egress_policy.h), resolved through [vmd] egress-hosts and
 * then getaddrinfo, never to a refused address. Every stream, allowed or
 * refused, becomes a node egress event that the gateway fetches
 * (EgressEvents) into the tenant's audit log. Not for: the policy's pure
 * checks (egress_policy.c) or the guest's listener (guest/agent/egress.c).
 */
#ifndef MOAT_VMD_EGRESS_H
#define MOAT_VMD_EGRESS_H

#include "moat/config.h"
#include "moat/rpc.h"
#include "egress_policy.h"
#include "vm.pb-c.h"

#define VMD_EGRESS_PORT_NAME "org.moat.egress"
#define VMD_EGRESS_DEFAULT_MAX_CONNS 64
#define VMD_EGRESS_EVENTS 4096 /* the node's ring */
#define VMD_EGRESS_CONNECT_MS 10000

struct vmd;
struct vmd_egress;

/* vmd_egress_node_init: reads [vmd] egress-hosts (a file; unset: none)
 * and egress-max-conns into vmd->egress. Errors name the key and what to
 * fix, printed by the caller. */
int vmd_egress_node_init(struct vmd *vmd, const struct moat_config *c,
    char **errmsg) __attribute__((warn_unused_result));
void vmd_egress_node_fini(struct vmd *vmd);

/* vmd_egress_request_policy: the create request's network as a policy:
 * *out NULL for mode "none" (or unset), else heap (free()). Errors
 * (INVALID_ARGUMENT) set *errmsg saying what to send instead. */
int vmd_egress_request_policy(const Moat__V1__NetworkPolicy *np,
    struct vmd_egress_policy **out, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_egress_to_proto: the policy as the reply's NetworkPolicy (NULL:
 * mode "none"). Returns NULL when out of memory. */
Moat__V1__NetworkPolicy *vmd_egress_to_proto(
    const struct vmd_egress_policy *p);

/* vmd_egress_proto_copy: a deep copy of np (NULL when np is NULL or out
 * of memory; free with moat__v1__network_policy__free_unpacked). */
Moat__V1__NetworkPolicy *vmd_egress_proto_copy(
    const Moat__V1__NetworkPolicy *np);
/* vmd_egress_label: a snapshot's policy as its snapd label "network":
 * "none" or "allowlist:<host[:port]>,..." (heap; NULL: out of memory).
 * vmd_egress_from_label: back (*out NULL for an empty label, a snapshot
 * pushed before the label existed); INVALID_ARGUMENT when malformed. */
char *vmd_egress_label(const Moat__V1__NetworkPolicy *np);
int vmd_egress_from_label(const char *label, Moat__V1__NetworkPolicy **out)
    __attribute__((warn_unused_result));
/* vmd_egress_start: the proxy thread for one VM whose egress port is the
 * Unix socket `sock` (it retries until QEMU makes it). Copies what it
 * keeps. Returns NULL (after a log line) when it cannot start. */
struct vmd_egress *vmd_egress_start(struct vmd *vmd, const char *sock,
    const struct vmd_egress_policy *p, const char *tenant,
    const char *sandbox_id);

/* vmd_egress_stop: ends the thread and every stream; safe on NULL. */
void vmd_egress_stop(struct vmd_egress *e);

/* vmd_egress_events: the EgressEvents RPC. */
int vmd_egress_events(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__EgressEventsRequest *req,
    Moat__V1__EgressEventList *reply);

#endif
