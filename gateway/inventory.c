/*
 * inventory.c: the gateway's last known picture of every node's
 * sandboxes (all tenants), so that a node that stops answering does not
 * make its sandboxes vanish. A background thread asks every available
 * node ListAllSandboxes about once a second, all nodes in parallel with a
 * short timeout each; a node's answer replaces what was known of it, a
 * node that does not answer keeps its last list. Each answer also feeds
 * the sandbox -> node routes (forward.c), so locating a sandbox rarely
 * asks anyone. ListSandboxes and GetSandbox (handlers.c) show the
 * sandboxes of a node that is down from here, with state UNAVAILABLE;
 * calls on them fail at once saying how to bring them back.
 * Not for: deciding that a node is down (discovery.c does, by surveys)
 * or the sandbox calls themselves (forward.c).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "admission.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define INVENTORY_POLL_MS 50

struct inv_entry {
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	Moat__V1__Sandbox *last; /* owned: the node's last word on it */
};

/* Guest egress (issue 14): how far each node's egress events were read. */
struct egress_cursor {
	struct moat_node_id node;
	uint64_t epoch, last_seq;
};

struct moat_inventory {
	pthread_mutex_t lock; /* guards entries, n, cap, the egress fields */
	struct moat_auth *audit; /* borrowed; NULL: events stay on nodes */
	struct egress_cursor *cursors;
	size_t n_cursors;
	struct inv_entry *entries;
	size_t n, cap;
	struct moat_nodes *nodes; /* borrowed */
	struct moat_forward *fw;  /* borrowed */
	uint32_t interval_ms, timeout_ms;
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
};

static Moat__V1__Sandbox *
sandbox_copy(const Moat__V1__Sandbox *sb)
{
	size_t len = moat__v1__sandbox__get_packed_size(sb);
	uint8_t *buf = malloc(len ? len : 1);
	Moat__V1__Sandbox *copy;

	if (buf == NULL)
		return NULL;
	moat__v1__sandbox__pack(sb, buf);
	copy = moat__v1__sandbox__unpack(NULL, len, buf);
	free(buf);
	return copy;
}

static void
entry_drop(struct moat_inventory *inv, size_t i)
{
	if (inv->entries[i].last != NULL)
		moat__v1__sandbox__free_unpacked(inv->entries[i].last, NULL);
	memmove(&inv->entries[i], &inv->entries[i + 1],
	    (inv->n - i - 1) * sizeof(inv->entries[0]));
	inv->n--;
}

static struct inv_entry *
entry_find(struct moat_inventory *inv, const char *sandbox_id)
{
	for (size_t i = 0; i < inv->n; i++)
		if (strcmp(inv->entries[i].sandbox.s, sandbox_id) == 0)
			return &inv->entries[i];
	return NULL;
}

/* entry_put: sandbox `sb` on `node`, replacing what was known of it.
 * Lock held; false when out of memory (the entry is then not kept). */
static bool
entry_put(struct moat_inventory *inv, const struct moat_node_id *node,
    const Moat__V1__Sandbox *sb)
{
	struct inv_entry *e;
	Moat__V1__Sandbox *copy;
	struct moat_sandbox_id id;

	if (!moat_sandbox_id_set(&id, sb->id) ||
	    (copy = sandbox_copy(sb)) == NULL)
		return false;
	if ((e = entry_find(inv, id.s)) == NULL) {
		if (inv->n == inv->cap) {
			size_t cap = inv->cap ? inv->cap * 2 : 64;
			struct inv_entry *grown =
			    realloc(inv->entries, cap * sizeof(*grown));

			if (grown == NULL) {
				moat__v1__sandbox__free_unpacked(copy, NULL);
				return false;
			}
			inv->entries = grown;
			inv->cap = cap;
		}
		e = &inv->entries[inv->n++];
		e->sandbox = id;
		e->last = NULL;
	}
	if (e->last != NULL)
		moat__v1__sandbox__free_unpacked(e->last, NULL);
	e->node = *node;
	e->last = copy;
	return true;
}

void
moat_inventory_node_list(struct moat_inventory *inv,
    const struct moat_node_id *node, const Moat__V1__SandboxList *list)
{
	size_t i = 0;

	if (inv == NULL)
		return;
	pthread_mutex_lock(&inv->lock);
	while (i < inv->n)
		if (strcmp(inv->entries[i].node.s, node->s) == 0)
			entry_drop(inv, i);
		else
			i++;
	for (size_t j = 0; j < list->n_sandboxes; j++)
		(void)entry_put(inv, node, list->sandboxes[j]);
	pthread_mutex_unlock(&inv->lock);
	for (size_t j = 0; j < list->n_sandboxes; j++) {
		struct moat_sandbox_id id;

		if (!moat_sandbox_id_set(&id, list->sandboxes[j]->id))
			continue;
		moat_forward_remember(inv->fw, &id, node);
		moat_forward_set_tenant(inv->fw, &id,
		    list->sandboxes[j]->tenant);
	}
}

void
moat_inventory_put(struct moat_inventory *inv, const struct moat_node_id *node,
    const Moat__V1__Sandbox *sb)
{
	if (inv == NULL || sb == NULL)
		return;
	pthread_mutex_lock(&inv->lock);
	(void)entry_put(inv, node, sb);
	pthread_mutex_unlock(&inv->lock);
}

void
moat_inventory_forget(struct moat_inventory *inv, const char *sandbox_id)
{
	struct inv_entry *e;

	if (inv == NULL || sandbox_id == NULL)
		return;
	pthread_mutex_lock(&inv->lock);
	if ((e = entry_find(inv, sandbox_id)) != NULL)
		entry_drop(inv, (size_t)(e - inv->entries));
	pthread_mutex_unlock(&inv->lock);
}

bool
moat_inventory_find(struct moat_inventory *inv, const char *sandbox_id,
    struct moat_node_id *node, Moat__V1__Sandbox **copy)
{
	struct inv_entry *e;
	bool found = false;

	if (copy != NULL)
		*copy = NULL;
	if (inv == NULL || sandbox_id == NULL)
		return false;
	pthread_mutex_lock(&inv->lock);
	if ((e = entry_find(inv, sandbox_id)) != NULL) {
		found = true;
		if (node != NULL)
			*node = e->node;
		if (copy != NULL)
			*copy = sandbox_copy(e->last);
	}
	pthread_mutex_unlock(&inv->lock);
	return found;
}

bool
moat_nodes_is_available(struct moat_nodes *nodes,
    const struct moat_node_id *node)
{
	struct moat_node_id *ids = NULL;
	size_t n = 0;
	bool found = false;

	if (moat_nodes_available_ids(nodes, &ids, &n) != MOAT_OK)
		return true; /* cannot tell: let the call find out */
	for (size_t i = 0; i < n && !found; i++)
		found = strcmp(ids[i].s, node->s) == 0;
	free(ids);
	return found;
}

char *
moat_node_down_message(const char *sandbox_id, const char *node)
{
	return moat_asprintf(
	    "sandbox %s is on node %s, which does not answer (its "
	    "moat-vmd is down or cut off): restart that node's moat-vmd to "
	    "get it back as it is, or bring it back on another node from "
	    "its last snapshot with `moat restore %s --step latest --new` "
	    "(a recorded sandbox whose snapshots reached moat-snapd)",
	    sandbox_id, node, sandbox_id);
}

/* skipped: whether node `id` is one of `skip` (n ids). */
static bool
skipped(const struct moat_node_id *skip, size_t n, const char *id)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(skip[i].s, id) == 0)
			return true;
	return false;
}

int
moat_inventory_unavailable(struct moat_inventory *inv, const char *tenant,
    const struct moat_node_id *answered, size_t n_answered,
    Moat__V1__Sandbox ***out, size_t *n)
{
	Moat__V1__Sandbox **list = NULL;
	size_t count = 0;
	int rv = MOAT_OK;

	*out = NULL;
	*n = 0;
	if (inv == NULL)
		return MOAT_OK;
	pthread_mutex_lock(&inv->lock);
	if (inv->n > 0 && (list = calloc(inv->n, sizeof(*list))) == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; rv == MOAT_OK && i < inv->n; i++) {
		const struct inv_entry *e = &inv->entries[i];

		if (skipped(answered, n_answered, e->node.s) ||
		    (tenant != NULL && strcmp(e->last->tenant, tenant) != 0))
			continue;
		if ((list[count] = sandbox_copy(e->last)) == NULL) {
			rv = MOAT_RESOURCE_EXHAUSTED;
			break;
		}
		list[count]->state =
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNAVAILABLE;
		count++;
	}
	pthread_mutex_unlock(&inv->lock);
	if (rv != MOAT_OK) {
		for (size_t i = 0; i < count; i++)
			moat__v1__sandbox__free_unpacked(list[i], NULL);
		free(list);
		return rv;
	}
	if (count == 0) {
		free(list);
		list = NULL;
	}
	*out = list;
	*n = count;
	return MOAT_OK;
}

/* ---- the refresh ---- */

struct refresh_job {
	struct moat_inventory *inv;
	struct moat_node_id node;
	pthread_t thread;
	bool started;
};

void
moat_inventory_set_audit(struct moat_inventory *inv, struct moat_auth *auth)
{
	if (inv == NULL)
		return;
	pthread_mutex_lock(&inv->lock);
	inv->audit = auth;
	pthread_mutex_unlock(&inv->lock);
}

/* The node's cursor (made at 0 when new), under inv->lock; NULL: OOM. */
static struct egress_cursor *
egress_cursor(struct moat_inventory *inv, const struct moat_node_id *node)
{
	struct egress_cursor *grown;

	for (size_t i = 0; i < inv->n_cursors; i++)
		if (strcmp(inv->cursors[i].node.s, node->s) == 0)
			return &inv->cursors[i];
	grown = realloc(inv->cursors, (inv->n_cursors + 1) * sizeof(*grown));
	if (grown == NULL)
		return NULL;
	inv->cursors = grown;
	memset(&grown[inv->n_cursors], 0, sizeof(*grown));
	grown[inv->n_cursors].node = *node;
	return &grown[inv->n_cursors++];
}

/* One egress event as an audit entry of its tenant. */
static void
egress_audit(struct moat_auth *auth, const struct moat_node_id *node,
    const Moat__V1__EgressEvent *ev)
{
	char *cmd = ev->allowed ?
	    moat_asprintf("egress %s %s:%u -> %s", ev->kind, ev->host,
	        ev->port, ev->reason) :
	    moat_asprintf("egress %s %s:%u refused: %s", ev->kind, ev->host,
	        ev->port, ev->reason);
	json_t *e = json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:s, s:s, s:i, "
	                      "s:b, s:s, s:s}}",
	    "key_id", "", "method", "Egress", "code",
	    ev->allowed ? "OK" : "PERMISSION_DENIED", "sandbox_id",
	    ev->sandbox_id, "command", cmd ? cmd : "egress", "egress", "kind",
	    ev->kind, "host", ev->host, "port", (int)ev->port, "allowed",
	    (int)ev->allowed, "reason", ev->reason, "node", node->s);
	char *msg = NULL;

	if (e == NULL ||
	    moat_auth_audit_append(auth, ev->tenant, e, &msg) != MOAT_OK)
		moat_warn(0, "audit: egress event %llu of %s not logged: %s",
		    (unsigned long long)ev->seq, ev->tenant,
		    msg ? msg : "out of memory");
	json_decref(e);
	free(msg);
	free(cmd);
}

/* egress_poll: the node's new egress events into the audit log. */
static void
egress_poll(struct refresh_job *j)
{
	struct moat_inventory *inv = j->inv;
	Moat__V1__EgressEventsRequest req =
	    MOAT__V1__EGRESS_EVENTS_REQUEST__INIT;
	Moat__V1__EgressEventList *list = NULL;
	struct egress_cursor *c;
	struct moat_auth *auth;
	uint64_t epoch;
	char *msg = NULL;

	pthread_mutex_lock(&inv->lock);
	auth = inv->audit;
	c = auth ? egress_cursor(inv, &j->node) : NULL;
	req.after_seq = c ? c->last_seq : 0;
	epoch = c ? c->epoch : 0;
	pthread_mutex_unlock(&inv->lock);
	if (c == NULL)
		return;
	req.limit = 1024;
	/* A node without the method (older) answers UNIMPLEMENTED: fine. */
	if (moat_forward_node_call(inv->fw, &j->node, NULL, "EgressEvents",
	        &req.base, &moat__v1__egress_event_list__descriptor,
	        moat_rpc_new_request_id(), moat_rpc_now_ms() + inv->timeout_ms,
	        "its egress events", (ProtobufCMessage **)&list,
	        &msg) != MOAT_OK) {
		free(msg);
		return;
	}
	if (list->epoch != epoch && req.after_seq != 0) {
		/* The node restarted: its numbering did too. Read again. */
		pthread_mutex_lock(&inv->lock);
		if ((c = egress_cursor(inv, &j->node)) != NULL) {
			c->epoch = list->epoch;
			c->last_seq = 0;
		}
		pthread_mutex_unlock(&inv->lock);
		moat__v1__egress_event_list__free_unpacked(list, NULL);
		return;
	}
	for (size_t i = 0; i < list->n_events; i++)
		egress_audit(auth, &j->node, list->events[i]);
	if (list->dropped > 0)
		moat_warn(0,
		    "node %s: %llu egress events were lost before "
		    "the gateway read them",
		    j->node.s, (unsigned long long)list->dropped);
	pthread_mutex_lock(&inv->lock);
	if ((c = egress_cursor(inv, &j->node)) != NULL) {
		c->epoch = list->epoch;
		if (list->n_events > 0)
			c->last_seq = list->events[list->n_events - 1]->seq;
	}
	pthread_mutex_unlock(&inv->lock);
	moat__v1__egress_event_list__free_unpacked(list, NULL);
}

static void *
refresh_node(void *arg)
{
	struct refresh_job *j = arg;
	Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;
	Moat__V1__SandboxList *list = NULL;
	char *msg = NULL;

	/* Every tenant's: no tenant is named. */
	if (moat_forward_node_call(j->inv->fw, &j->node, NULL,
	        "ListAllSandboxes", &req.base,
	        &moat__v1__sandbox_list__descriptor, moat_rpc_new_request_id(),
	        moat_rpc_now_ms() + j->inv->timeout_ms, "its sandboxes",
	        (ProtobufCMessage **)&list, &msg) == MOAT_OK) {
		moat_inventory_node_list(j->inv, &j->node, list);
		moat__v1__sandbox_list__free_unpacked(list, NULL);
		egress_poll(j);
	}
	/* A node that does not answer keeps its last list: that is the
	 * point. Discovery logs the node's silence. */
	free(msg);
	return NULL;
}

/* drop_unknown: the entries of nodes the table no longer has. */
static void
drop_unknown(struct moat_inventory *inv)
{
	Moat__V1__Node **nodes = NULL;
	size_t n_nodes = 0, i = 0;

	if (moat_nodes_snapshot(inv->nodes, &nodes, &n_nodes) != MOAT_OK)
		return;
	pthread_mutex_lock(&inv->lock);
	while (i < inv->n) {
		bool known = false;

		for (size_t k = 0; k < n_nodes && !known; k++)
			known = strcmp(nodes[k]->node_id,
			            inv->entries[i].node.s) == 0;
		if (known)
			i++;
		else
			entry_drop(inv, i);
	}
	pthread_mutex_unlock(&inv->lock);
	moat_nodes_snapshot_free(nodes, n_nodes);
}

void
moat_inventory_refresh(struct moat_inventory *inv)
{
	struct moat_node_id *ids = NULL;
	struct refresh_job *jobs;
	size_t n = 0;

	if (inv == NULL)
		return;
	drop_unknown(inv);
	if (moat_nodes_available_ids(inv->nodes, &ids, &n) != MOAT_OK ||
	    n == 0) {
		free(ids);
		return;
	}
	if ((jobs = calloc(n, sizeof(*jobs))) == NULL) {
		free(ids);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		jobs[i].inv = inv;
		jobs[i].node = ids[i];
		jobs[i].started = pthread_create(&jobs[i].thread, NULL,
		                      refresh_node, &jobs[i]) == 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (jobs[i].started)
			pthread_join(jobs[i].thread, NULL);
		else
			refresh_node(&jobs[i]);
	}
	free(jobs);
	free(ids);
}

static void *
inventory_main(void *arg)
{
	struct moat_inventory *inv = arg;

	while (!atomic_load(&inv->stop)) {
		uint64_t started = moat_rpc_now_ms(), spent;

		moat_inventory_refresh(inv);
		while (!atomic_load(&inv->stop) &&
		    (spent = moat_rpc_now_ms() - started) < inv->interval_ms)
			nng_msleep((nng_duration)(inv->interval_ms - spent <
			            INVENTORY_POLL_MS ?
			        inv->interval_ms - spent :
			        INVENTORY_POLL_MS));
	}
	return NULL;
}

int
moat_inventory_start(struct moat_inventory **out, struct moat_nodes *nodes,
    struct moat_forward *fw, uint32_t interval_ms, bool background,
    char **errmsg)
{
	struct moat_inventory *inv;
	int rv;

	*out = NULL;
	if ((inv = calloc(1, sizeof(*inv))) == NULL) {
		*errmsg = moat_asprintf("inventory: out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (pthread_mutex_init(&inv->lock, NULL) != 0) {
		free(inv);
		*errmsg = moat_asprintf("inventory: cannot make its lock");
		return MOAT_INTERNAL;
	}
	inv->nodes = nodes;
	inv->fw = fw;
	inv->interval_ms =
	    interval_ms ? interval_ms : MOAT_GW_INVENTORY_INTERVAL_MS;
	/* An answer later than the round is of no use to it. */
	inv->timeout_ms = inv->interval_ms < MOAT_GW_INVENTORY_TIMEOUT_MS ?
	    inv->interval_ms :
	    MOAT_GW_INVENTORY_TIMEOUT_MS;
	if (background) {
		if ((rv = pthread_create(&inv->thread, NULL, inventory_main,
		         inv)) != 0) {
			*errmsg = moat_asprintf("inventory: cannot start its "
			                        "thread: %s",
			    strerror(rv));
			moat_inventory_stop(inv);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		inv->thread_started = true;
	}
	*out = inv;
	return MOAT_OK;
}

void
moat_inventory_stop(struct moat_inventory *inv)
{
	if (inv == NULL)
		return;
	atomic_store(&inv->stop, true);
	if (inv->thread_started)
		pthread_join(inv->thread, NULL);
	for (size_t i = 0; i < inv->n; i++)
		if (inv->entries[i].last != NULL)
			moat__v1__sandbox__free_unpacked(inv->entries[i].last,
			    NULL);
	free(inv->entries);
	free(inv->cursors);
	pthread_mutex_destroy(&inv->lock);
	free(inv);
}

/* usage_locked: what moat_inventory_usage counts, and with `ids` each
 * sandbox's id (heap) appended to *ids (room for inv->n); false when out
 * of memory. Lock held. */
static bool
usage_locked(struct moat_inventory *inv, const char *tenant,
    Moat__V1__Node *const *nodes, size_t n, uint32_t *per_node,
    struct moat_usage *total, char **ids, size_t *n_ids)
{
	for (size_t i = 0; i < inv->n; i++) {
		const Moat__V1__Sandbox *sb = inv->entries[i].last;

		if (sb == NULL || sb->tenant == NULL ||
		    strcmp(sb->tenant, tenant) != 0)
			continue;
		total->sandboxes++;
		total->vcpus += sb->vcpus;
		total->memory_mib += sb->memory_mib;
		for (size_t j = 0; per_node != NULL && j < n; j++)
			if (nodes[j] != NULL &&
			    strcmp(nodes[j]->node_id,
			        inv->entries[i].node.s) == 0)
				per_node[j]++;
		if (ids != NULL && (ids[(*n_ids)++] = strdup(sb->id)) == NULL)
			return false;
	}
	return true;
}

void
moat_inventory_usage(struct moat_inventory *inv, const char *tenant,
    Moat__V1__Node *const *nodes, size_t n, uint32_t *per_node,
    struct moat_usage *total)
{
	if (per_node != NULL)
		memset(per_node, 0, n * sizeof(*per_node));
	memset(total, 0, sizeof(*total));
	if (inv == NULL || tenant == NULL)
		return;
	pthread_mutex_lock(&inv->lock);
	(void)usage_locked(inv, tenant, nodes, n, per_node, total, NULL, NULL);
	pthread_mutex_unlock(&inv->lock);
}

bool
moat_inventory_tenant_ids(struct moat_inventory *inv, const char *tenant,
    struct moat_usage *total, char ***ids, size_t *n)
{
	bool ok;

	memset(total, 0, sizeof(*total));
	*ids = NULL;
	*n = 0;
	if (inv == NULL || tenant == NULL)
		return true;
	pthread_mutex_lock(&inv->lock);
	ok = (*ids = calloc(inv->n ? inv->n : 1, sizeof(**ids))) != NULL &&
	    usage_locked(inv, tenant, NULL, 0, NULL, total, *ids, n);
	pthread_mutex_unlock(&inv->lock);
	return ok;
}
