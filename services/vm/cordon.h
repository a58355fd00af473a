/*
 * cordon.h: the node's cordon (issue 15): a cordoned node takes no new
 * sandbox (CreateSandbox, RestoreSandbox of a new one) until it is
 * uncordoned; what runs there runs on. Persisted in <state>/cordon (the
 * reason, one line; absent: not cordoned), so it survives a restart.
 * Not for: placement (the gateway's) or moving sandboxes (gateway drain).
 */
#ifndef MOAT_VMD_CORDON_H
#define MOAT_VMD_CORDON_H

#include <stdbool.h>

#include "moat/rpc.h"
#include "vm.pb-c.h"

struct vmd;

#define VMD_CORDON_FILE "cordon"
#define VMD_CORDON_REASON_MAX 512 /* bytes of a reason kept */

/* vmd_cordon_read: whether the cordon file `path` says cordoned, and its
 * reason (heap, "" when none; NULL when not cordoned). An absent file is
 * not cordoned. Returns 0 or errno (the file unreadable). */
int vmd_cordon_read(const char *path, bool *cordoned, char **reason);

/* vmd_cordon_write: cordoned: writes `reason` (NULL: "") atomically to
 * `path` (control characters become spaces, cut to
 * VMD_CORDON_REASON_MAX); else removes the file. Returns 0 or errno. */
int vmd_cordon_write(const char *path, bool cordoned, const char *reason);

/* vmd_cordon_load: reads <state>/cordon into vmd at start (a file that
 * cannot be read is logged and counts as cordoned: the safe side). */
void vmd_cordon_load(struct vmd *vmd);

/* vmd_cordon_set: the Cordon call: persists, then sets the node's
 * state. Errors go through moat_rpc_error. */
int vmd_cordon_set(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CordonRequest *req);

/* vmd_cordon_check: MOAT_OK when the node takes new sandboxes, else
 * FAILED_PRECONDITION (after moat_rpc_error) naming the node, its reason
 * and `moat node uncordon`. `what`: "create" or "restore". */
int vmd_cordon_check(struct vmd *vmd, struct moat_rpc_call *call,
    const char *what);

/* vmd_cordon_fill: Node.cordoned, cordon_reason (heap) and
 * protocol_version. MOAT_INTERNAL when out of memory. */
int vmd_cordon_fill(struct vmd *vmd, Moat__V1__Node *node);

#endif
