/*
 * drain.c: operating nodes (issue 15): CordonNode forwards a cordon to
 * its node (vmd persists it and refuses new sandboxes); DrainNode
 * cordons the node, then moves each of its sandboxes (every tenant's) to
 * another node: a snapshot on the node, waited for until it is in
 * moat-snapd, that leaves the sandbox paused (leave_paused: nothing
 * changes it after the snapshot; its calls answer UNAVAILABLE, "being
 * moved: retry"); a restore on the target that keeps the sandbox's id
 * (RestoreSandboxRequest.keep_sandbox_id); then the source is destroyed
 * and the route remapped, so the sandbox's calls, its recording (keyed
 * by id, record.c) and its code contexts (in the guest) go on there. A
 * move that fails resumes the source (ResumeSandbox): the sandbox runs
 * where it was (the snapshot is deleted). Both calls are for the tenants
 * of [gateway] operator-tenants only.
 * A drain holds no RPC worker (issue 15, part 7): once its request is
 * checked, the call is deferred and the drain runs on a thread of its
 * own, which answers (what moved, what failed, each pause) when it ends.
 * One drain per node: another call to drain a node being drained is
 * FAILED_PRECONDITION naming the first (a repeat of the same call, by
 * request id, gets the first one's reply from the RPC layer instead).
 * The caller's deadline and the gateway's stop are looked at between
 * moves, never within one: a move under way finishes (its node calls
 * have deadlines of their own), the sandboxes left are reported "not
 * tried", and a drain whose caller has already had DEADLINE_EXCEEDED
 * keeps its report for a repeat of the call. The gateway's stop waits
 * for each drain's thread (moat_drains_free).
 * Not for: placement rules (placement.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define OPERATOR_DEFAULT MOAT_GW_DEFAULT_TENANT
#define SNAPSHOT_MS 120000 /* one snapshot and its push, at most */
#define RESTORE_MS 120000  /* one restore on the target, at most */
#define REASON_MAX 256

int
moat_gw_operator_check(struct moat_rpc_call *call, const char *method)
{
	const struct moat_config *cfg = NULL;
	const char *tenant = moat_gw_tenant(call), *list, *p;
	size_t n = strlen(tenant);
	bool auth_on = false;

	cfg = moat_gateway_config(call->service_ctx, &auth_on);
	if (!auth_on)
		return MOAT_OK;
	list = moat_config_get(cfg, "gateway", "operator-tenants",
	    OPERATOR_DEFAULT);
	for (p = list; n > 0 && (p = strstr(p, tenant)) != NULL; p += n) {
		bool start = p == list || p[-1] == ',' || p[-1] == ' ';
		bool end = p[n] == '\0' || p[n] == ',' || p[n] == ' ';
		if (start && end)
			return MOAT_OK;
	}
	return moat_rpc_error(call, MOAT_PERMISSION_DENIED,
	    "%s is an operator call: tenant %s may not make it (an "
	    "operator adds the tenant to [gateway] operator-tenants, now "
	    "\"%s\")",
	    method, tenant, list);
}

/* node_row: a copy of node `id` from the table into *out (NULL when
 * unknown); RESOURCE_EXHAUSTED when out of memory. */
static int
node_row(struct moat_nodes *nodes, const char *id, Moat__V1__Node **out)
{
	Moat__V1__Node **list = NULL;
	size_t n = 0;

	*out = NULL;
	if (moat_nodes_snapshot(nodes, &list, &n) != MOAT_OK)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < n && *out == NULL; i++)
		if (strcmp(list[i]->node_id, id) == 0) {
			*out = list[i];
			list[i] = NULL;
		}
	for (size_t i = 0; i < n; i++)
		if (list[i] != NULL)
			moat__v1__node__free_unpacked(list[i], NULL);
	free(list);
	return MOAT_OK;
}

/* known_node: node_id names a node the gateway knows (into *node). */
static int
known_node(struct moat_rpc_call *call, struct moat_nodes *nodes,
    const char *what, const char *node_id, struct moat_node_id *node,
    bool *cordoned)
{
	Moat__V1__Node *row = NULL;

	if (node_id[0] == '\0' || !moat_node_id_set(node, node_id))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%s: a node id is required (`moat node ls` lists them)",
		    what);
	if (node_row(nodes, node_id, &row) != MOAT_OK)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	if (row == NULL)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "%s: node %.80s is unknown to the gateway (`moat node "
		    "ls` lists the nodes)",
		    what, node_id);
	if (!row->available) {
		moat__v1__node__free_unpacked(row, NULL);
		return moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "%s: node %s does not answer the gateway's surveys: "
		    "bring it back first",
		    what, node_id);
	}
	if (cordoned != NULL)
		*cordoned = row->cordoned;
	moat__v1__node__free_unpacked(row, NULL);
	return MOAT_OK;
}

/* cordon: Cordon on `node`; the node's answer into *out (optional). */
static int
cordon(struct moat_forward *fw, const struct moat_node_id *node,
    const char *tenant, bool on, const char *reason, uint64_t request_id,
    uint64_t deadline, Moat__V1__Node **out, char **errmsg)
{
	Moat__V1__CordonRequest req = MOAT__V1__CORDON_REQUEST__INIT;
	Moat__V1__Node *reply = NULL;
	int rv;

	req.cordoned = on;
	req.reason = (char *)(reason ? reason : "");
	rv = moat_forward_node_call(fw, node, tenant, "Cordon", &req.base,
	    &moat__v1__node__descriptor, request_id, deadline, "its cordon",
	    (ProtobufCMessage **)&reply, errmsg);
	if (rv == MOAT_UNIMPLEMENTED) {
		free(*errmsg);
		*errmsg = moat_asprintf("node %s runs a moat-vmd without "
		                        "Cordon (protocol version 1): upgrade "
		                        "moat-vmd there",
		    node->s);
	}
	if (rv == MOAT_OK && out != NULL)
		*out = reply;
	else if (reply != NULL)
		moat__v1__node__free_unpacked(reply, NULL);
	return rv;
}

int
moat_drain_cordon_node(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	const Moat__V1__CordonNodeRequest *req =
	    (const Moat__V1__CordonNodeRequest *)request;
	struct moat_travel t;
	struct moat_node_id node;
	Moat__V1__Node *n = NULL;
	char *msg = NULL;
	size_t len;
	int rv;

	(void)reply;
	if ((rv = moat_gw_operator_check(call, "CordonNode")) != MOAT_OK)
		return rv;
	moat_gateway_travel(call->service_ctx, &t);
	if ((rv = known_node(call, t.nodes, "CordonNode", req->node_id, &node,
	         NULL)) != MOAT_OK)
		return rv;
	if ((rv = cordon(t.fw, &node, moat_gw_tenant(call), req->cordoned,
	         req->reason, call->request_id, call->deadline_ms, &n,
	         &msg)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s", msg ? msg : "");
		free(msg);
		return rv;
	}
	moat_info(call->request_id, "node %s %s by tenant %s%s%s", node.s,
	    req->cordoned ? "cordoned" : "uncordoned", moat_gw_tenant(call),
	    req->reason[0] ? ": " : "", req->reason);
	len = moat__v1__node__get_packed_size(n);
	if ((call->raw_reply = malloc(len ? len : 1)) == NULL) {
		moat__v1__node__free_unpacked(n, NULL);
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	}
	moat__v1__node__pack(n, call->raw_reply);
	call->raw_reply_len = len;
	moat__v1__node__free_unpacked(n, NULL);
	return MOAT_OK;
}

/* ---- DrainNode ---- */

/* One running drain in the gateway's table (struct moat_drains). */
struct drain_slot {
	struct drain_slot *next;
	struct moat_node_id node;
	uint64_t request_id, started_ms;
	size_t done, total; /* sandboxes tried, and listed */
	pthread_t thread;
	bool joinable; /* thread is the drain's own (deferred call) */
	bool finished; /* the drain answered or is about to */
};

struct moat_drains {
	pthread_mutex_t lock; /* guards all below */
	struct drain_slot *head;
	bool stopping; /* the gateway stops: drains end after their move */
};

/* One drain: what every move shares, copied out of its call so that it
 * can outlive the worker that took the call. */
struct drain {
	struct moat_travel t;
	struct moat_node_id from;
	char target[MOAT_ID_MAX]; /* "": placement picks */
	char tenant[MOAT_AUTH_TENANT_MAX];
	char reason[REASON_MAX];
	char *refusal; /* heap: why the target takes none, or NULL */
	uint64_t request_id, deadline;
	struct drain_slot *slot;
	struct moat_rpc_deferred *deferred; /* NULL: answered in place */
};

/* node_call: `method` of `req` on `node` for `tenant`. */
static int
node_call(struct drain *d, const struct moat_node_id *node, const char *tenant,
    const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, uint64_t deadline,
    const char *what, ProtobufCMessage **out, char **errmsg)
{
	ProtobufCMessage *reply = NULL;
	int rv;

	rv = moat_forward_node_call(d->t.fw, node, tenant, method, req, desc,
	    moat_rpc_new_request_id(), deadline, what, &reply, errmsg);
	if (out != NULL)
		*out = reply;
	else if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

/* snapshot_delete: the drain's snapshot on the source, and unless
 * keep_remote its copy in snapd (best effort: logged). A moved sandbox's
 * copy stays: its node's later pushes name it as their parent. */
static void
snapshot_delete(struct drain *d, const char *tenant, const char *snap,
    bool keep_remote)
{
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	char *msg = NULL;

	ref.snapshot_id = (char *)snap;
	ref.tenant = (char *)tenant;
	ref.keep_remote = keep_remote;
	if (node_call(d, &d->from, tenant, "DeleteLocalSnapshot", &ref.base,
	        &moat__v1__empty__descriptor,
	        moat_rpc_now_ms() + MOAT_RPC_DEFAULT_TIMEOUT_MS,
	        "a drain's snapshot", NULL, &msg) != MOAT_OK)
		moat_warn(d->request_id,
		    "drain of %s: snapshot %s left (`moat "
		    "snapshot gc` removes it): %s",
		    d->from.s, snap, msg ? msg : "?");
	free(msg);
}

/* destroy_on: DestroySandbox `id` on `node`. */
static int
destroy_on(struct drain *d, const struct moat_node_id *node,
    const char *tenant, const char *id, char **errmsg)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;

	ref.sandbox_id = (char *)id;
	return node_call(d, node, tenant, "DestroySandbox", &ref.base,
	    &moat__v1__empty__descriptor,
	    moat_rpc_now_ms() + MOAT_RPC_DEFAULT_TIMEOUT_MS,
	    "a drained sandbox", NULL, errmsg);
}

/* pick_target: the node `sb` moves to: the named target, else placement
 * among the available nodes but the source, cordoned ones and those of
 * an older protocol. */
static int
pick_target(struct drain *d, const Moat__V1__Sandbox *sb,
    struct moat_node_id *to, char **errmsg)
{
	Moat__V1__Node **nodes = NULL;
	size_t n = 0, idx = 0;
	int rv;

	if (d->target[0] != '\0') {
		(void)moat_node_id_set(to, d->target);
		return MOAT_OK;
	}
	if (moat_nodes_snapshot(d->t.nodes, &nodes, &n) != MOAT_OK) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < n; i++)
		if (strcmp(nodes[i]->node_id, d->from.s) == 0 ||
		    nodes[i]->cordoned ||
		    nodes[i]->protocol_version < MOAT_PROTOCOL_VERSION_MIN)
			nodes[i]->available = false;
	rv = moat_placement_choose(nodes, n, sb->vcpus, sb->memory_mib,
	    sb->image, d->t.survey_url, &idx, errmsg);
	if (rv == MOAT_OK)
		(void)moat_node_id_set(to, nodes[idx]->node_id);
	moat_nodes_snapshot_free(nodes, n);
	return rv;
}

/* restore_on: the snapshot (snapd's id `remote`) restored on `to` as
 * sb's id, with sb's labels. */
static int
restore_on(struct drain *d, const Moat__V1__Sandbox *sb, const char *remote,
    const struct moat_node_id *to, Moat__V1__Sandbox **out, char **errmsg)
{
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__RestoreSandboxRequest__LabelsEntry *e = NULL, **pe = NULL;
	int rv;

	if (sb->n_labels > 0 &&
	    ((e = calloc(sb->n_labels, sizeof(*e))) == NULL ||
	        (pe = calloc(sb->n_labels, sizeof(*pe))) == NULL)) {
		free(e);
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < sb->n_labels; i++) {
		moat__v1__restore_sandbox_request__labels_entry__init(&e[i]);
		e[i].key = sb->labels[i]->key;
		e[i].value = sb->labels[i]->value;
		pe[i] = &e[i];
	}
	req.snapshot_id = (char *)remote;
	req.tenant = sb->tenant;
	req.keep_sandbox_id = sb->id;
	req.labels = pe;
	req.n_labels = sb->n_labels;
	/* Its own deadline, not the call's: a move under way finishes. */
	rv = node_call(d, to, sb->tenant, "RestoreSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, moat_rpc_now_ms() + RESTORE_MS,
	    "a drained sandbox", (ProtobufCMessage **)out, errmsg);
	free(pe);
	free(e);
	return rv;
}

/* keep_lifetime: the moved sandbox keeps what was left of sb's
 * lifetime on the source (a restore alone would give it none): its
 * expiry and its idle timeout, through SetTimeout on `to`. Best effort:
 * logged. */
static void
keep_lifetime(struct drain *d, const Moat__V1__Sandbox *sb,
    const struct moat_node_id *to)
{
	Moat__V1__SetTimeoutRequest req = MOAT__V1__SET_TIMEOUT_REQUEST__INIT;
	uint64_t now = moat_now_unix_ms();
	char *msg = NULL;

	if (sb->expires_unix_ms == 0 && sb->idle_timeout_s == 0)
		return;
	req.sandbox_id = sb->id;
	req.tenant = sb->tenant;
	if (sb->expires_unix_ms != 0)
		req.timeout_s = sb->expires_unix_ms > now + 1000 ?
		    (uint32_t)((sb->expires_unix_ms - now + 999) / 1000) :
		    1;
	req.idle_timeout_s = sb->idle_timeout_s;
	if (node_call(d, to, sb->tenant, "SetTimeout", &req.base,
	        &moat__v1__sandbox__descriptor,
	        moat_rpc_now_ms() + MOAT_RPC_DEFAULT_TIMEOUT_MS,
	        "a drained sandbox's lifetime", NULL, &msg) != MOAT_OK)
		moat_warn(d->request_id,
		    "drain: sandbox %s on %s keeps no lifetime: %s", sb->id,
		    to->s, msg ? msg : "?");
	free(msg);
}

/* resume_source: ResumeSandbox of sb on the source after a failed move
 * (a sandbox not paused, or a vmd without the call, is fine). */
static void
resume_source(struct drain *d, const Moat__V1__Sandbox *sb)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	char *msg = NULL;
	int rv;

	ref.sandbox_id = sb->id;
	rv = node_call(d, &d->from, sb->tenant, "ResumeSandbox", &ref.base,
	    &moat__v1__sandbox__descriptor,
	    moat_rpc_now_ms() + MOAT_RPC_DEFAULT_TIMEOUT_MS,
	    "a sandbox whose move failed", NULL, &msg);
	if (rv != MOAT_OK && rv != MOAT_FAILED_PRECONDITION &&
	    rv != MOAT_UNIMPLEMENTED)
		moat_warn(d->request_id,
		    "drain of %s: sandbox %s may stay paused there (its "
		    "calls answer UNAVAILABLE): drain again, destroy it, or "
		    "restart moat-vmd there, which resumes it: %s",
		    d->from.s, sb->id, msg ? msg : "?");
	free(msg);
}

/* take_snapshot: sb snapshotted on the source, left paused there, and
 * pushed to snapd; its local id into *snap (heap) and snapd's into
 * remote. A driver that cannot leave it paused (Firecracker) gets a
 * plain snapshot: that move is not exact (logged). */
static int
take_snapshot(struct drain *d, const Moat__V1__Sandbox *sb, char **snap,
    char *remote, char **errmsg)
{
	Moat__V1__SnapshotSandboxRequest req =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *ls = NULL;
	uint64_t deadline = moat_rpc_now_ms() + SNAPSHOT_MS;
	int rv;

	req.sandbox_id = sb->id;
	req.wait_push = true;
	req.leave_paused = true;
	rv = node_call(d, &d->from, sb->tenant, "SnapshotSandbox", &req.base,
	    &moat__v1__local_snapshot__descriptor, deadline,
	    "a drain's snapshot", (ProtobufCMessage **)&ls, errmsg);
	if (rv == MOAT_UNIMPLEMENTED) {
		moat_warn(d->request_id,
		    "drain of %s: sandbox %s moves without a pause (%s): "
		    "what changes in it during the move is lost",
		    d->from.s, sb->id, *errmsg ? *errmsg : "?");
		free(*errmsg);
		*errmsg = NULL;
		req.leave_paused = false;
		rv = node_call(d, &d->from, sb->tenant, "SnapshotSandbox",
		    &req.base, &moat__v1__local_snapshot__descriptor, deadline,
		    "a drain's snapshot", (ProtobufCMessage **)&ls, errmsg);
	}
	if (rv != MOAT_OK)
		return rv;
	*snap = strdup(ls->snapshot_id);
	if (ls->remote_stored && ls->remote_id[0] != '\0')
		snprintf(remote, MOAT_ID_MAX, "%s", ls->remote_id);
	else {
		*errmsg = moat_asprintf("its snapshot %s is not in "
		                        "moat-snapd (%s): node %s needs "
		                        "--snapd for its sandboxes to move",
		    ls->snapshot_id,
		    ls->remote_error[0] ? ls->remote_error : "not pushed",
		    d->from.s);
		rv = MOAT_FAILED_PRECONDITION;
	}
	moat__v1__local_snapshot__free_unpacked(ls, NULL);
	if (*snap == NULL && rv == MOAT_OK) {
		*errmsg = moat_asprintf("out of memory");
		rv = MOAT_RESOURCE_EXHAUSTED;
	}
	return rv;
}

/* remap: the sandbox now lives on `to`: routes and inventory follow. */
static void
remap(struct drain *d, const Moat__V1__Sandbox *restored,
    const struct moat_node_id *to)
{
	struct moat_sandbox_id id;

	if (!moat_sandbox_id_set(&id, restored->id))
		return;
	moat_inventory_forget(d->t.fw->inv, restored->id);
	moat_forward_remember(d->t.fw, &id, to);
	moat_forward_set_tenant(d->t.fw, &id, restored->tenant);
	moat_inventory_put(d->t.fw->inv, to, restored);
}

/* move_one: moves `sb` off the source; *why (heap) on failure, the
 * sandbox then running where it was. */
static int
move_one(struct drain *d, const Moat__V1__Sandbox *sb, struct moat_node_id *to,
    uint64_t *pause_ms, char **why)
{
	uint64_t t0;
	Moat__V1__Sandbox *restored = NULL;
	char remote[MOAT_ID_MAX] = "", *snap = NULL, *msg = NULL;
	int rv;

	if (d->refusal != NULL) {
		*why = strdup(d->refusal);
		return MOAT_FAILED_PRECONDITION;
	}
	if (sb->state != MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING) {
		const ProtobufCEnumValue *v =
		    protobuf_c_enum_descriptor_get_value(
		        &moat__v1__sandbox_state__descriptor, (int)sb->state);

		*why = moat_asprintf("it is %s, not running: only running "
		                     "sandboxes move; destroy it or wait",
		    v != NULL ? v->name : "in an unknown state");
		return MOAT_FAILED_PRECONDITION;
	}
	if ((rv = pick_target(d, sb, to, &msg)) != MOAT_OK) {
		*why = moat_asprintf("no node to move it to: %s",
		    msg ? msg : "?");
		free(msg);
		return rv;
	}
	t0 = moat_rpc_now_ms();
	if ((rv = take_snapshot(d, sb, &snap, remote, &msg)) != MOAT_OK) {
		*why = moat_asprintf("snapshot on %s: %s", d->from.s,
		    msg ? msg : "?");
		goto out;
	}
	if ((rv = restore_on(d, sb, remote, to, &restored, &msg)) != MOAT_OK) {
		*why = moat_asprintf("node %s refused the restore: %s", to->s,
		    msg ? msg : "?");
		goto out;
	}
	if ((rv = destroy_on(d, &d->from, sb->tenant, sb->id, &msg)) !=
	    MOAT_OK) {
		/* Two copies must not run: the source stays the one. */
		char *m2 = NULL;

		if (destroy_on(d, to, sb->tenant, sb->id, &m2) != MOAT_OK)
			moat_warn(d->request_id,
			    "drain: sandbox %s now runs on %s and %s: %s",
			    sb->id, d->from.s, to->s, m2 ? m2 : "?");
		free(m2);
		*why = moat_asprintf("the source could not be destroyed (%s): "
		                     "the copy on %s was removed",
		    msg ? msg : "?", to->s);
		goto out;
	}
	remap(d, restored, to);
	*pause_ms = moat_rpc_now_ms() - t0;
	keep_lifetime(d, sb, to);
out:
	if (rv != MOAT_OK)
		resume_source(d, sb);
	if (snap != NULL)
		snapshot_delete(d, sb->tenant, snap, rv == MOAT_OK);
	if (restored != NULL)
		moat__v1__sandbox__free_unpacked(restored, NULL);
	free(snap);
	free(msg);
	return rv;
}

/* drained: one reply row for sb. */
static Moat__V1__DrainedSandbox *
drained(const struct drain *d, const Moat__V1__Sandbox *sb,
    const struct moat_node_id *to, bool moved, uint64_t pause_ms,
    const char *why)
{
	Moat__V1__DrainedSandbox *r = malloc(sizeof(*r));

	if (r == NULL)
		return NULL;
	moat__v1__drained_sandbox__init(r);
	r->moved = moved;
	r->pause_ms = moved ? pause_ms : 0;
	if ((r->sandbox_id = strdup(sb->id)) == NULL ||
	    (r->tenant = strdup(sb->tenant)) == NULL ||
	    (r->from_node_id = strdup(d->from.s)) == NULL ||
	    (r->to_node_id = strdup(moved ? to->s : "")) == NULL ||
	    (r->error = strdup(why ? why : "")) == NULL) {
		moat__v1__drained_sandbox__free_unpacked(r, NULL);
		return NULL;
	}
	return r;
}

/* target_check: a named target must be known; one that cannot take
 * sandboxes (cordoned, not answering, too old) is every sandbox's
 * failure (d->refusal), not the call's. */
static int
target_check(struct moat_rpc_call *call, struct drain *d, const char *id)
{
	Moat__V1__Node *row = NULL;

	if (node_row(d->t.nodes, id, &row) != MOAT_OK)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	if (row == NULL)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "DrainNode: target node %.80s is unknown to the gateway "
		    "(`moat node ls` lists the nodes)",
		    id);
	if (!row->available)
		d->refusal = moat_asprintf("target node %s does not answer "
		                           "the gateway's surveys",
		    id);
	else if (row->cordoned)
		d->refusal = moat_asprintf("target node %s is cordoned%s%s%s: "
		                           "`moat node uncordon %s` or drain "
		                           "to another node",
		    id, row->cordon_reason[0] ? " (" : "", row->cordon_reason,
		    row->cordon_reason[0] ? ")" : "", id);
	else if (row->protocol_version < MOAT_PROTOCOL_VERSION_MIN)
		d->refusal = moat_asprintf("target node %s runs protocol "
		                           "version %u < %d: upgrade moat-vmd "
		                           "there",
		    id, row->protocol_version ? row->protocol_version : 1,
		    MOAT_PROTOCOL_VERSION_MIN);
	moat__v1__node__free_unpacked(row, NULL);
	return MOAT_OK;
}

/* ---- the table of running drains ---- */

struct moat_drains *
moat_drains_new(void)
{
	struct moat_drains *t = calloc(1, sizeof(*t));

	if (t != NULL && pthread_mutex_init(&t->lock, NULL) != 0) {
		free(t);
		t = NULL;
	}
	return t;
}

/* reap: frees the finished slots, joining their threads (which only
 * answer their call after `finished`: no wait on the network). Lock
 * held. */
static void
reap(struct moat_drains *t)
{
	struct drain_slot **pp = &t->head, *s;

	while ((s = *pp) != NULL) {
		if (!s->finished) {
			pp = &s->next;
			continue;
		}
		*pp = s->next;
		if (s->joinable)
			pthread_join(s->thread, NULL);
		free(s);
	}
}

void
moat_drains_free(struct moat_drains *t)
{
	struct drain_slot *s;

	if (t == NULL)
		return;
	pthread_mutex_lock(&t->lock);
	t->stopping = true;
	while ((s = t->head) != NULL) {
		t->head = s->next;
		if (s->joinable) {
			/* Its move under way ends (every node call has a
			 * deadline), then it answers and ends. */
			pthread_mutex_unlock(&t->lock);
			pthread_join(s->thread, NULL);
			pthread_mutex_lock(&t->lock);
		}
		free(s);
	}
	pthread_mutex_unlock(&t->lock);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

/* slot_claim: d's node in the table, or FAILED_PRECONDITION naming the
 * drain that runs there already: two drains of one node would move the
 * same sandboxes at once. A repeat of the same call (its request id) is
 * answered by the RPC layer before this, with the first one's reply. */
static int
slot_claim(struct moat_rpc_call *call, struct drain *d)
{
	struct moat_drains *t = d->t.drains;
	struct drain_slot *s;
	int rv = MOAT_OK;

	pthread_mutex_lock(&t->lock);
	reap(t);
	for (s = t->head; s != NULL; s = s->next)
		if (strcmp(s->node.s, d->from.s) == 0)
			break;
	if (t->stopping)
		rv = moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "DrainNode: the gateway is stopping; drain again on "
		    "another gateway or once it is back");
	else if (s != NULL)
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "DrainNode: node %s is already being drained (request "
		    "%016llx, %llu s ago, %zu of %zu sandboxes tried): wait "
		    "for that call's reply, then drain again for what it "
		    "left",
		    d->from.s, (unsigned long long)s->request_id,
		    (unsigned long long)(moat_rpc_now_ms() - s->started_ms) /
		        1000,
		    s->done, s->total);
	else if ((s = calloc(1, sizeof(*s))) == NULL)
		rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	else {
		s->node = d->from;
		s->request_id = d->request_id;
		s->started_ms = moat_rpc_now_ms();
		s->next = t->head;
		t->head = s;
		d->slot = s;
	}
	pthread_mutex_unlock(&t->lock);
	return rv;
}

/* slot_progress: `done` of `total` sandboxes tried; whether the drain
 * should stop (the gateway stops). */
static bool
slot_progress(struct drain *d, size_t done, size_t total)
{
	bool stopping;

	pthread_mutex_lock(&d->t.drains->lock);
	d->slot->done = done;
	d->slot->total = total;
	stopping = d->t.drains->stopping;
	pthread_mutex_unlock(&d->t.drains->lock);
	return stopping;
}

static void
slot_finish(struct drain *d)
{
	pthread_mutex_lock(&d->t.drains->lock);
	d->slot->finished = true;
	pthread_mutex_unlock(&d->t.drains->lock);
}

/* ---- DrainNode: the call ---- */

/* drain_check: the request, checked before the call is deferred (its
 * errors are answered at once); d filled from it. */
static int
drain_check(struct moat_rpc_call *call, const Moat__V1__DrainNodeRequest *req,
    struct drain *d)
{
	int rv;

	if ((rv = moat_gw_operator_check(call, "DrainNode")) != MOAT_OK)
		return rv;
	moat_gateway_travel(call->service_ctx, &d->t);
	d->request_id = call->request_id;
	d->deadline = call->deadline_ms;
	snprintf(d->tenant, sizeof(d->tenant), "%s", moat_gw_tenant(call));
	snprintf(d->reason, sizeof(d->reason), "%s",
	    req->reason[0] ? req->reason : "draining");
	if ((rv = known_node(call, d->t.nodes, "DrainNode", req->node_id,
	         &d->from, NULL)) != MOAT_OK)
		return rv;
	if (req->target_node_id[0] != '\0') {
		if (strcmp(req->target_node_id, req->node_id) == 0)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "DrainNode: the target is the node drained (%s): "
			    "name another node, or none",
			    req->node_id);
		if (strlen(req->target_node_id) >= sizeof(d->target))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "DrainNode: target node id %.80s... is too long "
			    "(`moat node ls` lists the nodes)",
			    req->target_node_id);
		if ((rv = target_check(call, d, req->target_node_id)) !=
		    MOAT_OK)
			return rv;
		snprintf(d->target, sizeof(d->target), "%s",
		    req->target_node_id);
	}
	return slot_claim(call, d);
}

/* drain_list: cordons the source and lists every sandbox on it (all
 * tenants). Both are short calls: they get the default timeout at most,
 * not the drain's (`moat node drain` allows 30 min), so a node that
 * does not answer holds a stopping gateway no longer than that. */
static int
drain_list(struct drain *d, Moat__V1__SandboxList **out, char **errmsg)
{
	Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;
	uint64_t deadline = moat_rpc_now_ms() + MOAT_RPC_DEFAULT_TIMEOUT_MS;
	char *msg = NULL;
	int rv;

	if (deadline > d->deadline)
		deadline = d->deadline;
	if ((rv = cordon(d->t.fw, &d->from, d->tenant, true, d->reason,
	         d->request_id, deadline, NULL, &msg)) != MOAT_OK) {
		*errmsg = moat_asprintf("DrainNode: cordon of %s: %s",
		    d->from.s, msg ? msg : "?");
		free(msg);
		return rv;
	}
	if ((rv = node_call(d, &d->from, d->tenant, "ListAllSandboxes",
	         &req.base, &moat__v1__sandbox_list__descriptor, deadline,
	         "its sandboxes", (ProtobufCMessage **)out, &msg)) !=
	    MOAT_OK) {
		*errmsg = moat_asprintf("DrainNode: listing node %s's "
		                        "sandboxes: %s (it is cordoned now; "
		                        "drain again)",
		    d->from.s, msg ? msg : "?");
		free(msg);
	}
	return rv;
}

/* not_tried: why a sandbox was not moved when the drain ended early, or
 * NULL to go on. A move under way is never cut: the gateway's stop and
 * the call's deadline are looked at between moves. */
static char *
not_tried(struct drain *d, bool stopping)
{
	if (stopping)
		return moat_asprintf("not tried: the gateway stopped during "
		                     "the drain; drain %s again",
		    d->from.s);
	if (moat_rpc_now_ms() >= d->deadline)
		return moat_asprintf("not tried: the DrainNode call's "
		                     "deadline passed first; drain %s again, "
		                     "with a longer timeout",
		    d->from.s);
	return NULL;
}

/* drain_one: moves sb (or says why not) and adds its row to r. */
static int
drain_one(struct drain *d, const Moat__V1__Sandbox *sb, bool stopping,
    Moat__V1__DrainNodeReply *r)
{
	struct moat_node_id to = { "" };
	uint64_t pause_ms = 0;
	char *why = not_tried(d, stopping);
	bool moved =
	    why == NULL && move_one(d, sb, &to, &pause_ms, &why) == MOAT_OK;
	Moat__V1__DrainedSandbox *row =
	    drained(d, sb, &to, moved, pause_ms, why);

	if (moved)
		moat_info(d->request_id,
		    "drain: sandbox %s moved %s -> %s, paused %llu ms", sb->id,
		    d->from.s, to.s, (unsigned long long)pause_ms);
	else
		moat_warn(d->request_id, "drain: sandbox %s stays on %s: %s",
		    sb->id, d->from.s, why ? why : "?");
	free(why);
	if (row == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	r->sandboxes[r->n_sandboxes++] = row;
	*(moved ? &r->moved : &r->failed) += 1;
	return MOAT_OK;
}

/* drain_run: the drain itself, into r (a reply the caller frees);
 * *errmsg (heap) when it fails as a whole. */
static int
drain_run(struct drain *d, Moat__V1__DrainNodeReply *r, char **errmsg)
{
	Moat__V1__SandboxList *list = NULL;
	bool stopping = false;
	int rv;

	if ((rv = drain_list(d, &list, errmsg)) != MOAT_OK)
		return rv;
	if (list->n_sandboxes > 0 &&
	    (r->sandboxes = calloc(list->n_sandboxes,
	         sizeof(*r->sandboxes))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	moat_info(d->request_id, "drain of node %s: %zu sandboxes, to %s",
	    d->from.s, list->n_sandboxes,
	    d->target[0] ? d->target : "any node");
	for (size_t i = 0; i < list->n_sandboxes && rv == MOAT_OK; i++) {
		stopping = slot_progress(d, i, list->n_sandboxes) || stopping;
		rv = drain_one(d, list->sandboxes[i], stopping, r);
	}
	if (rv != MOAT_OK)
		*errmsg = moat_asprintf("out of memory");
	else if (moat_rpc_now_ms() >= d->deadline)
		/* Its caller has DEADLINE_EXCEEDED already; the reply is
		 * kept for a repeat of the call (same request id). */
		moat_warn(d->request_id,
		    "drain of %s outlived its call's deadline: %zu moved, %zu "
		    "not (retry the call with its request id for the "
		    "report)",
		    d->from.s, (size_t)r->moved, (size_t)r->failed);
out:
	moat__v1__sandbox_list__free_unpacked(list, NULL);
	return rv;
}

static void
drain_free(struct drain *d)
{
	free(d->refusal);
	free(d);
}

/* drain_main: a deferred drain's thread: runs it, answers its call. */
static void *
drain_main(void *arg)
{
	struct drain *d = arg;
	Moat__V1__DrainNodeReply r = MOAT__V1__DRAIN_NODE_REPLY__INIT;
	char *msg = NULL;
	int rv = drain_run(d, &r, &msg);

	/* Finished before the reply goes: whoever reads it may drain the
	 * node again at once. */
	slot_finish(d);
	moat_rpc_complete(d->deferred, rv, rv == MOAT_OK ? &r.base : NULL,
	    msg);
	for (size_t i = 0; i < r.n_sandboxes; i++)
		moat__v1__drained_sandbox__free_unpacked(r.sandboxes[i], NULL);
	free(r.sandboxes);
	free(msg);
	drain_free(d);
	return NULL;
}

/* drain_start: d's thread; without one, d runs on this thread. */
static void
drain_start(struct drain *d)
{
	struct moat_drains *t = d->t.drains;
	int err;

	pthread_mutex_lock(&t->lock);
	err = pthread_create(&d->slot->thread, NULL, drain_main, d);
	d->slot->joinable = err == 0;
	pthread_mutex_unlock(&t->lock);
	if (err != 0) {
		moat_warn(d->request_id,
		    "drain of %s: no thread for it (%s): it holds a worker",
		    d->from.s, strerror(err));
		(void)drain_main(d);
	}
}

int
moat_drain_node(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__DrainNodeRequest *req =
	    (const Moat__V1__DrainNodeRequest *)request;
	struct drain *d = calloc(1, sizeof(*d));
	char *msg = NULL;
	int rv;

	if (d == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	if ((rv = drain_check(call, req, d)) != MOAT_OK) {
		drain_free(d);
		return rv;
	}
	/* A drain takes minutes: it answers from its own thread. */
	if ((d->deferred = moat_rpc_defer(call)) != NULL) {
		drain_start(d);
		return MOAT_OK;
	}
	/* Not deferrable (a call built outside the server, or too many
	 * deferred calls): answered here. */
	rv = drain_run(d, (Moat__V1__DrainNodeReply *)reply, &msg);
	slot_finish(d);
	if (rv != MOAT_OK)
		rv = moat_rpc_error(call, rv, "%s", msg ? msg : "?");
	free(msg);
	drain_free(d);
	return rv;
}
