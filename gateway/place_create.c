/*
 * place_create.c: CreateSandbox sent to a node placement picked, and to
 * the next one when it refuses. The tenant's quotas are held once, across
 * every gateway, in sessiond (quota_remote.c; this gateway's own count
 * when sessiond does not answer). Each try is placed with this gateway's
 * reservations (admission.c) and holds one until the sandbox lands (or
 * is refused); a node that answers RESOURCE_EXHAUSTED, UNAVAILABLE or
 * FAILED_PRECONDITION is skipped and counted, any other error ends the
 * create. When every node refuses, the error lists each node's refusal.
 * Not for: ranking (placement.c) or what a create does after it landed
 * (recording, routes: handlers.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define REFUSALS_MAX 1024 /* bytes of the refusals said in an error */

/* A node that refused this create, and why. */
struct refusals {
	char ids[MOAT_PLACE_TRIES_MAX][MOAT_ID_MAX];
	size_t n;
	int last_code;
	char text[REFUSALS_MAX];
};

static bool
is_refusal(int code)
{
	return code == MOAT_RESOURCE_EXHAUSTED || code == MOAT_UNAVAILABLE ||
	    code == MOAT_FAILED_PRECONDITION;
}

static void
refusal_add(struct refusals *r, const char *node, int code, const char *msg)
{
	size_t len = strlen(r->text);

	if (r->n < MOAT_PLACE_TRIES_MAX)
		snprintf(r->ids[r->n++], MOAT_ID_MAX, "%s", node);
	r->last_code = code;
	snprintf(r->text + len, sizeof(r->text) - len, "%snode %s: %s",
	    len ? "; " : "", node, msg ? msg : moat_strerror(code));
}

/* skips: which of `nodes` refused already (n entries, heap). */
static bool *
skips(Moat__V1__Node *const *nodes, size_t n, const struct refusals *r)
{
	bool *skip = calloc(n ? n : 1, sizeof(*skip));

	for (size_t i = 0; skip != NULL && i < n; i++)
		for (size_t j = 0; nodes[i] != NULL && j < r->n; j++)
			if (strcmp(nodes[i]->node_id, r->ids[j]) == 0)
				skip[i] = true;
	return skip;
}

/* place_once: one pick (a fresh node table) into *node; *handle held.
 * `quota`: check this gateway's count of the tenant's quotas (first try,
 * when sessiond did not hold them). */
static int
place_once(struct moat_gw_create *c, const struct refusals *r, bool quota,
    struct moat_node_id *node, uint64_t *handle, char **errmsg)
{
	Moat__V1__Node **nodes = NULL;
	size_t n = 0, chosen;
	bool *skip = NULL;
	struct moat_place_req req = {
		.vcpus = c->req->vcpus,
		.memory_mib = c->req->memory_mib,
		.scratch_mib = c->req->scratch_mib,
		.image = c->req->image,
		.selector = c->req->node_selector,
		.n_selector = c->req->n_node_selector,
		.survey_url = c->survey_url,
	};
	int rv;

	if (moat_nodes_snapshot(c->nodes, &nodes, &n) != MOAT_OK ||
	    (skip = skips(nodes, n, r)) == NULL) {
		moat_nodes_snapshot_free(nodes, n);
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	req.skip = skip;
	rv = moat_admission_place(c->adm, nodes, n, c->tenant, &req,
	    r->n == 0 && quota, &chosen, handle, errmsg);
	if (rv == MOAT_OK && !moat_node_id_set(node, nodes[chosen]->node_id)) {
		moat_admission_release(c->adm, *handle);
		rv = MOAT_INTERNAL;
		*errmsg =
		    moat_asprintf("placement chose a node without an id");
	}
	free(skip);
	moat_nodes_snapshot_free(nodes, n);
	return rv;
}

/* all_refused: the error after nodes refused and no other is left. */
static int
all_refused(const struct refusals *r, char *pick_msg, char **errmsg)
{
	*errmsg = moat_asprintf("no node took the sandbox: %s (%s)", r->text,
	    pick_msg ? pick_msg : "no other node fits");
	free(pick_msg);
	return r->last_code;
}

int
moat_gw_create(struct moat_gw_create *c, struct moat_node_id *node,
    uint8_t **out, size_t *out_len, Moat__V1__Sandbox **sb, char **errmsg)
{
	struct refusals r = { .n = 0 };
	size_t len = moat__v1__create_sandbox_request__get_packed_size(c->req);
	uint8_t *payload = malloc(len ? len : 1);
	uint64_t handle = 0;
	struct moat_quota_hold hold = { .handle = 0, .local = false };
	char *msg = NULL;
	int rv = MOAT_RESOURCE_EXHAUSTED;

	*out = NULL;
	*sb = NULL;
	if (payload == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return rv;
	}
	/* The tenant's quotas across every gateway (sessiond), or this
	 * gateway's count when sessiond does not answer. */
	if (c->quota &&
	    (rv = moat_quota_reserve(c->adm, c->tenant, 1, c->req->vcpus,
	         c->req->memory_mib, c->deadline_ms, &hold, errmsg)) !=
	        MOAT_OK) {
		free(payload);
		return rv;
	}
	moat__v1__create_sandbox_request__pack(c->req, payload);
	for (size_t tries = 0; tries < MOAT_PLACE_TRIES_MAX; tries++) {
		if ((rv = place_once(c, &r, c->quota && hold.local, node,
		         &handle, &msg)) != MOAT_OK) {
			if (r.n != 0)
				rv = all_refused(&r, msg, &msg);
			break;
		}
		rv = moat_forward_to_node(c->fw, node, c->tenant,
		    "CreateSandbox", payload, len, c->request_id,
		    c->deadline_ms, c->what, out, out_len, &msg);
		if (rv == MOAT_OK)
			break;
		moat_admission_release(c->adm, handle);
		if (!is_refusal(rv) || moat_rpc_now_ms() >= c->deadline_ms)
			break;
		moat_admission_refused(c->adm, node->s);
		moat_info(c->request_id,
		    "node %s refused the sandbox (%s): "
		    "trying the next",
		    node->s, msg ? msg : "");
		refusal_add(&r, node->s, rv, msg);
		free(msg);
		msg = NULL;
	}
	free(payload);
	if (rv == MOAT_OK &&
	    (*sb = moat__v1__sandbox__unpack(NULL, *out_len, *out)) == NULL) {
		moat_admission_release(c->adm, handle);
		rv = MOAT_INTERNAL;
		msg = moat_asprintf(
		    "node %s answered CreateSandbox with "
		    "something that is not a moat.v1.Sandbox: are the gateway "
		    "and moat-vmd built from the same protos?",
		    node->s);
	}
	if (rv == MOAT_OK) {
		const char *id = (*sb)->id;

		moat_admission_landed(c->adm, handle, id);
		moat_quota_landed(c->adm, c->tenant, &hold, &id, 1);
		return MOAT_OK;
	}
	moat_quota_release(c->adm, c->tenant, &hold);
	free(*out);
	*out = NULL;
	*errmsg = msg;
	return rv;
}

/* tenant_snapshot_bytes: what `tenant`'s local snapshots hold on the
 * available nodes (a node that does not answer counts 0). */
static uint64_t
tenant_snapshot_bytes(struct moat_travel *t, uint64_t deadline_ms)
{
	struct moat_node_id *ids = NULL;
	size_t n = 0;
	uint64_t bytes = 0;

	if (moat_nodes_available_ids(t->nodes, &ids, &n) != MOAT_OK)
		return 0;
	for (size_t i = 0; i < n; i++) {
		Moat__V1__LocalSnapshotList *list = NULL;
		char *msg = NULL;

		if (moat_snapshots_node_list(t->fw, &ids[i], t->tenant,
		        deadline_ms, &list, &msg) != MOAT_OK) {
			free(msg);
			continue;
		}
		for (size_t j = 0; j < list->n_snapshots; j++)
			bytes += moat_snapshot_local_bytes(list->snapshots[j]);
		moat__v1__local_snapshot_list__free_unpacked(list, NULL);
	}
	free(ids);
	return bytes;
}

int
moat_gw_snapshot_quota(struct moat_travel *t, uint64_t deadline_ms,
    char **errmsg)
{
	if (moat_admission_snapshot_limit(t->adm, t->tenant) == 0)
		return MOAT_OK;
	return moat_admission_snapshot_quota(t->adm, t->tenant,
	    tenant_snapshot_bytes(t, deadline_ms), errmsg);
}
