/*
 * crosshost.c: where a restore or a fork's copies of a snapshot run, and
 * under which id. A step's snapshot is a node's local one
 * ("snap-<node>-<16 hex>"); vmd pushes it to moat-snapd too, where it has
 * an id of its own ("snap-<32 hex>") and the label local_id. A copy on
 * the snapshot's own node restores the local id (nothing pulled); a copy
 * anywhere else gets snapd's id, and that node pulls the chunks it lacks.
 * Placement (placement.c) chooses the nodes: the snapshot's own node
 * first for one restore when it is available and fits, the copies of a
 * fork spread over the available nodes; a caller may name the node.
 * Not for: the restores themselves and their branches (travel.c), or
 * fetching chunks (the node does: services/vm/snapshot_fetch.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "admission.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapshot.pb-c.h"

#define SNAPD_SERVICE "moat.v1.Snapshot"
#define LOOKUP_MS 5000 /* at most, for finding snapd's id */
/* A snapshot whose push to snapd is under way: waited for this long. */
#define PUSH_WAIT_MS 60000
#define PUSH_POLL_MS 200

/* available_list: "a, b" of the available nodes into buf. */
static void
available_list(Moat__V1__Node *const *nodes, size_t n, char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && used + 2 < size; i++) {
		if (!nodes[i]->available)
			continue;
		used += (size_t)snprintf(buf + used, size - used, "%s%s",
		    used ? ", " : "", nodes[i]->node_id);
	}
	if (buf[0] == '\0')
		snprintf(buf, size, "none");
}

/* cap_ms: deadline, but at most ms from now. */
static uint64_t
cap_ms(uint64_t deadline, uint64_t ms)
{
	uint64_t cap = moat_rpc_now_ms() + ms;

	return cap < deadline ? cap : deadline;
}

/* remote_from_node: the snapd id of local snapshot `snap` as its node
 * says it (LocalSnapshot.remote_id). A push still under way (vmd pushes
 * in the background, remote_pending) is waited for, polling, until
 * PUSH_WAIT_MS or the deadline. */
static bool
remote_from_node(struct moat_travel *t, const char *snap,
    const struct moat_node_id *node, uint64_t deadline, char *out)
{
	uint64_t until = cap_ms(deadline, PUSH_WAIT_MS);
	bool found = false, pending = true;

	while (!found && pending) {
		Moat__V1__LocalSnapshotList *list = NULL;
		char *msg = NULL;

		if (!moat_nodes_is_available(t->nodes, node) ||
		    moat_snapshots_node_list(t->fw, node, t->tenant,
		        cap_ms(deadline, LOOKUP_MS), &list, &msg) != MOAT_OK) {
			free(msg);
			return false;
		}
		pending = false;
		for (size_t i = 0; i < list->n_snapshots && !found; i++) {
			const Moat__V1__LocalSnapshot *s = list->snapshots[i];

			if (strcmp(s->snapshot_id, snap) != 0)
				continue;
			pending = s->remote_pending;
			if (!s->remote_stored || s->remote_id[0] == '\0')
				continue;
			snprintf(out, MOAT_ID_MAX, "%s", s->remote_id);
			found = true;
		}
		moat__v1__local_snapshot_list__free_unpacked(list, NULL);
		if (pending && moat_rpc_now_ms() + PUSH_POLL_MS >= until)
			break;
		if (!found && pending)
			nng_msleep(PUSH_POLL_MS);
	}
	return found;
}

/* remote_from_snapd: snapd's snapshot of the tenant labelled local_id =
 * snap (the newest, should there be several). */
static int
remote_from_snapd(struct moat_travel *t, const char *snap, uint64_t deadline,
    char *out, char **errmsg)
{
	Moat__V1__ListSnapshotsRequest req =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__SnapLabel label = MOAT__V1__SNAP_LABEL__INIT;
	Moat__V1__SnapLabel *labels[1] = { &label };
	Moat__V1__ListSnapshotsReply *page = NULL;
	uint64_t until = cap_ms(deadline, LOOKUP_MS), now = moat_rpc_now_ms();
	struct moat_rpc_opts opts = {
		.request_id = moat_rpc_new_request_id(),
		.timeout_ms = until > now ? (uint32_t)(until - now) : 1,
	};
	char *msg = NULL;
	int rv;

	out[0] = '\0';
	if (t->rec->snapd == NULL) {
		*errmsg =
		    moat_asprintf("the gateway has no moat-snapd to ask "
		                  "for snapshot %s (set [gateway] snapd)",
		        snap);
		return MOAT_UNAVAILABLE;
	}
	label.key = (char *)"local_id";
	label.value = (char *)snap;
	req.tenant = (char *)t->tenant;
	req.labels = labels;
	req.n_labels = 1;
	req.page_size = 1000;
	rv = moat_rpc_call(t->rec->snapd, SNAPD_SERVICE, "ListSnapshots",
	    &req.base, &moat__v1__list_snapshots_reply__descriptor,
	    (ProtobufCMessage **)&page, &opts, &msg);
	if (rv != MOAT_OK) {
		*errmsg = moat_asprintf("moat-snapd at %s, asked for the copy "
		                        "of snapshot %s: %s",
		    t->rec->snapd_url ? t->rec->snapd_url : "?", snap,
		    msg ? msg : moat_strerror(rv));
		free(msg);
		return rv;
	}
	free(msg);
	if (page->n_snapshots > 0)
		snprintf(out, MOAT_ID_MAX, "%s",
		    page->snapshots[page->n_snapshots - 1]->id);
	moat__v1__list_snapshots_reply__free_unpacked(page, NULL);
	if (out[0] != '\0')
		return MOAT_OK;
	*errmsg = moat_asprintf(
	    "snapshot %s was never stored in moat-snapd (its node "
	    "pushes snapshots there only when run with --snapd, and a push "
	    "that failed is not retried): it can be restored only on its own "
	    "node; bring that node back, or restore a later step",
	    snap);
	return MOAT_FAILED_PRECONDITION;
}

int
moat_travel_remote_id(struct moat_travel *t, const char *snap,
    uint64_t deadline_ms, char *out, char **errmsg)
{
	struct moat_node_id own;

	if (!moat_snapshot_node(snap, &own)) {
		snprintf(out, MOAT_ID_MAX, "%s", snap); /* snapd's already */
		return MOAT_OK;
	}
	if (remote_from_node(t, snap, &own, deadline_ms, out))
		return MOAT_OK;
	return remote_from_snapd(t, snap, deadline_ms, out, errmsg);
}

/* want_node: the index of available node `name` in nodes, else
 * FAILED_PRECONDITION naming the available ones. */
static int
want_node(Moat__V1__Node *const *nodes, size_t n, const char *name,
    size_t *idx, char **errmsg)
{
	char avail[512];

	for (size_t i = 0; i < n; i++) {
		if (strcmp(nodes[i]->node_id, name) != 0)
			continue;
		if (nodes[i]->available) {
			*idx = i;
			return MOAT_OK;
		}
		available_list(nodes, n, avail, sizeof(avail));
		*errmsg = moat_asprintf("node %s is not available (it stopped "
		                        "answering): pick another with --node "
		                        "(available: %s), or leave --node out",
		    name, avail);
		return MOAT_FAILED_PRECONDITION;
	}
	available_list(nodes, n, avail, sizeof(avail));
	*errmsg = moat_asprintf("node %s is unknown to the gateway: pick one "
	                        "with --node (available: %s; `moat info` "
	                        "lists them), or leave --node out",
	    name, avail);
	return MOAT_FAILED_PRECONDITION;
}

/* place_nodes: the node of each of `count` copies into out[].node. */
static int
place_nodes(struct moat_travel *t, const char *snap, const char *node,
    uint32_t count, struct moat_restore_target *out, char **errmsg)
{
	Moat__V1__Node **nodes = NULL;
	struct moat_node_id own;
	size_t n = 0, *chosen = NULL, idx;
	int rv;

	if (moat_nodes_snapshot(t->nodes, &nodes, &n) != MOAT_OK ||
	    (chosen = calloc(count, sizeof(*chosen))) == NULL) {
		moat_nodes_snapshot_free(nodes, n);
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (node != NULL && node[0] != '\0') {
		if ((rv = want_node(nodes, n, node, &idx, errmsg)) == MOAT_OK)
			for (uint32_t k = 0; k < count; k++)
				chosen[k] = idx;
	} else {
		/* Ranked with this gateway's reservations (admission.c). */
		moat_admission_apply(t->adm, nodes, n, t->tenant, NULL);
		rv = moat_placement_spread(nodes, n, count, 0, 0, "",
		    moat_snapshot_node(snap, &own) ? own.s : NULL,
		    t->survey_url, chosen, errmsg);
	}
	for (uint32_t k = 0; rv == MOAT_OK && k < count; k++) {
		/* Held until the node's next survey counts it (30 s at
		 * most): the restore itself may still fail. */
		struct moat_place_req req = { .vcpus = 0 };

		moat_admission_landed(t->adm,
		    moat_admission_reserve(t->adm, nodes[chosen[k]]->node_id,
		        t->tenant, &req),
		    "");
	}
	for (uint32_t k = 0; rv == MOAT_OK && k < count; k++)
		if (!moat_node_id_set(&out[k].node,
		        nodes[chosen[k]]->node_id)) {
			*errmsg =
			    moat_asprintf("placement chose a node without "
			                  "an id");
			rv = MOAT_INTERNAL;
		}
	free(chosen);
	moat_nodes_snapshot_free(nodes, n);
	return rv;
}

int
moat_travel_place(struct moat_travel *t, const char *snap, const char *node,
    uint32_t count, uint64_t deadline_ms, struct moat_restore_target *out,
    char **errmsg)
{
	struct moat_node_id own;
	bool local = moat_snapshot_node(snap, &own);
	char remote[MOAT_ID_MAX] = "";
	int rv;

	if ((rv = place_nodes(t, snap, node, count, out, errmsg)) != MOAT_OK)
		return rv;
	for (uint32_t k = 0; k < count; k++) {
		if (local && strcmp(out[k].node.s, own.s) == 0) {
			snprintf(out[k].snapshot_id, MOAT_ID_MAX, "%s", snap);
			continue;
		}
		if (remote[0] == '\0' &&
		    (rv = moat_travel_remote_id(t, snap, deadline_ms, remote,
		         errmsg)) != MOAT_OK) {
			/* Not in snapd: the snapshot's own node, when it is
			 * up and the caller named no node, still can. */
			if (!local || (node != NULL && node[0] != '\0') ||
			    !moat_nodes_is_available(t->nodes, &own))
				return rv;
			moat_info(0,
			    "snapshot %s restores on its own node %s: "
			    "%s",
			    snap, own.s, *errmsg);
			free(*errmsg);
			*errmsg = NULL;
			out[k].node = own;
			snprintf(out[k].snapshot_id, MOAT_ID_MAX, "%s", snap);
			continue;
		}
		snprintf(out[k].snapshot_id, MOAT_ID_MAX, "%s", remote);
	}
	return MOAT_OK;
}

bool
moat_travel_snapd_size(struct moat_travel *t, const char *snap,
    uint64_t deadline, uint32_t *vcpus, uint32_t *memory_mib)
{
	Moat__V1__GetSnapshotRequest req =
	    MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	Moat__V1__SnapshotInfo *info = NULL;
	uint64_t until = cap_ms(deadline, LOOKUP_MS), now = moat_rpc_now_ms();
	struct moat_rpc_opts opts = {
		.request_id = moat_rpc_new_request_id(),
		.timeout_ms = until > now ? (uint32_t)(until - now) : 1,
	};
	char *msg = NULL;
	bool ok;

	if (t->rec == NULL || t->rec->snapd == NULL)
		return false;
	req.tenant = (char *)t->tenant;
	req.id = (char *)snap;
	ok = moat_rpc_call(t->rec->snapd, SNAPD_SERVICE, "GetSnapshot",
	         &req.base, &moat__v1__snapshot_info__descriptor,
	         (ProtobufCMessage **)&info, &opts, &msg) == MOAT_OK;
	free(msg);
	if (ok) {
		*vcpus = info->vcpus;
		*memory_mib = info->memory_mib;
		moat__v1__snapshot_info__free_unpacked(info, NULL);
	}
	return ok;
}
