/*
 * forward.c: how a sandbox call reaches the node that holds the sandbox.
 * A sorted sandbox -> node map is filled by CreateSandbox, ListSandboxes
 * and the inventory (inventory.c); on a miss the inventory is looked at,
 * then every available node is asked GetSandbox, all at once (the first
 * that has it answers the caller; slower nodes do not delay it). A
 * sandbox whose node the survey marked unavailable fails at once. The
 * call is then sent to that node's moat.v1.Vm service as the same method,
 * with the client's original payload bytes, the same request id (so the
 * node's deduplication of mutating calls holds end to end) and the time
 * left before the client's deadline. The node's reply bytes go back
 * untouched; so do its error code and message. One RPC client per node
 * is cached in the node table (discovery.c).
 * Not for: choosing where a new sandbox goes (placement.c) or calls that
 * span nodes (handlers.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define VM_SERVICE "moat.v1.Vm"
#define LOCATE_TIMEOUT_MS 5000 /* each node, asked in parallel */
#define DEADLINE_MARGIN_MS 50  /* left for the way back to the client */

struct moat_sandbox_route {
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	char tenant[MOAT_ID_MAX]; /* "" : not learnt yet */
};

int
moat_forward_init(struct moat_forward *fw, struct moat_nodes *nodes)
{
	memset(fw, 0, sizeof(*fw));
	fw->nodes = nodes;
	if (pthread_mutex_init(&fw->lock, NULL) != 0)
		return MOAT_INTERNAL;
	return MOAT_OK;
}

void
moat_forward_fini(struct moat_forward *fw)
{
	if (fw->nodes != NULL) {
		/* Locate's slow askers still use fw: wait for them. */
		for (;;) {
			int left;

			pthread_mutex_lock(&fw->lock);
			left = fw->locating;
			pthread_mutex_unlock(&fw->lock);
			if (left == 0)
				break;
			usleep(10000);
		}
		pthread_mutex_destroy(&fw->lock);
	}
	free(fw->routes);
	memset(fw, 0, sizeof(*fw));
}

bool
moat_forward_drain(struct moat_forward *fw, uint64_t max_ms)
{
	uint64_t until = moat_rpc_now_ms() + max_ms;
	int left;

	if (fw->nodes == NULL)
		return true;
	pthread_mutex_lock(&fw->lock);
	fw->draining = true;
	pthread_mutex_unlock(&fw->lock);
	for (;;) {
		pthread_mutex_lock(&fw->lock);
		left = fw->async_calls;
		pthread_mutex_unlock(&fw->lock);
		if (left == 0)
			return true;
		if (moat_rpc_now_ms() >= until)
			break;
		usleep(10000);
	}
	moat_warn(0,
	    "gateway: %d forwarded execs still wait for their node; "
	    "their state is left to the process's exit",
	    left);
	return false;
}

bool
moat_forward_async_begin(struct moat_forward *fw)
{
	bool ok;

	pthread_mutex_lock(&fw->lock);
	if ((ok = !fw->draining))
		fw->async_calls++;
	pthread_mutex_unlock(&fw->lock);
	return ok;
}

void
moat_forward_async_end(struct moat_forward *fw)
{
	pthread_mutex_lock(&fw->lock);
	fw->async_calls--;
	pthread_mutex_unlock(&fw->lock);
}

bool
moat_forward_draining(struct moat_forward *fw)
{
	bool draining;

	pthread_mutex_lock(&fw->lock);
	draining = fw->draining;
	pthread_mutex_unlock(&fw->lock);
	return draining;
}

/* route_find: index of the first route whose sandbox id is >= id (the
 * place to insert it); *found says whether it is equal. Lock held. */
static size_t
route_find(const struct moat_forward *fw, const char *id, bool *found)
{
	size_t lo = 0, hi = fw->n_routes;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(fw->routes[mid].sandbox.s, id) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found =
	    lo < fw->n_routes && strcmp(fw->routes[lo].sandbox.s, id) == 0;
	return lo;
}

void
moat_forward_remember(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, const struct moat_node_id *node)
{
	bool found;
	size_t i;

	pthread_mutex_lock(&fw->lock);
	i = route_find(fw, sandbox->s, &found);
	if (found) {
		if (strcmp(fw->routes[i].node.s, node->s) != 0)
			fw->routes[i].tenant[0] = '\0';
		fw->routes[i].node = *node;
		goto out;
	}
	if (fw->n_routes == fw->cap_routes) {
		size_t cap = fw->cap_routes ? fw->cap_routes * 2 : 64;
		struct moat_sandbox_route *grown =
		    realloc(fw->routes, cap * sizeof(*grown));
		/* Without room the route is simply not cached: the next
		 * call finds the node by asking, so nothing breaks. */
		if (grown == NULL)
			goto out;
		fw->routes = grown;
		fw->cap_routes = cap;
	}
	memmove(&fw->routes[i + 1], &fw->routes[i],
	    (fw->n_routes - i) * sizeof(fw->routes[0]));
	fw->routes[i].sandbox = *sandbox;
	fw->routes[i].node = *node;
	fw->routes[i].tenant[0] = '\0';
	fw->n_routes++;
out:
	pthread_mutex_unlock(&fw->lock);
}

void
moat_forward_forget(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox)
{
	bool found;
	size_t i;

	pthread_mutex_lock(&fw->lock);
	i = route_find(fw, sandbox->s, &found);
	if (found) {
		memmove(&fw->routes[i], &fw->routes[i + 1],
		    (fw->n_routes - i - 1) * sizeof(fw->routes[0]));
		fw->n_routes--;
	}
	pthread_mutex_unlock(&fw->lock);
}

static bool
route_lookup(struct moat_forward *fw, const struct moat_sandbox_id *sandbox,
    struct moat_node_id *node)
{
	bool found;
	size_t i;

	pthread_mutex_lock(&fw->lock);
	i = route_find(fw, sandbox->s, &found);
	if (found)
		*node = fw->routes[i].node;
	pthread_mutex_unlock(&fw->lock);
	return found;
}

/* time_left: ms a call to a node may take so the reply still reaches the
 * client in time; 0 when none is left. */
static uint32_t
time_left(uint64_t deadline_ms)
{
	uint64_t now = moat_rpc_now_ms();

	if (deadline_ms <= now + DEADLINE_MARGIN_MS)
		return 0;
	if (deadline_ms - now - DEADLINE_MARGIN_MS > UINT32_MAX)
		return UINT32_MAX;
	return (uint32_t)(deadline_ms - now - DEADLINE_MARGIN_MS);
}

/* transport_unavailable: whether an UNAVAILABLE came from the transport
 * (no server took the request) rather than from the node's own reply.
 * rpc_client.c words the former "no answer from <url>...". */
static bool
transport_unavailable(int rv, const char *msg)
{
	return rv == MOAT_UNAVAILABLE && msg != NULL &&
	    strncmp(msg, "no answer from ", 15) == 0;
}

int
moat_forward_to_node(struct moat_forward *fw, const struct moat_node_id *node,
    const char *tenant, const char *method, const uint8_t *payload, size_t len,
    uint64_t request_id, uint64_t deadline_ms, const char *what,
    uint8_t **reply, size_t *reply_len, char **errmsg)
{
	struct moat_node_conn *conn = NULL;
	struct moat_rpc_opts opts = { .request_id = request_id,
		.tenant = tenant };
	char *url = NULL, *msg = NULL;
	uint64_t started = moat_rpc_now_ms();
	int rv;

	*reply = NULL;
	*reply_len = 0;
	*errmsg = NULL;
	if ((rv = moat_nodes_conn_get(fw->nodes, node, &conn, &url, &msg)) !=
	    MOAT_OK) {
		*errmsg = moat_asprintf("%s is on node %s, which the gateway "
		                        "cannot call: %s",
		    what, node->s, msg);
		free(msg);
		return rv == MOAT_NOT_FOUND ? MOAT_UNAVAILABLE : rv;
	}
	if ((opts.timeout_ms = time_left(deadline_ms)) == 0) {
		*errmsg = moat_asprintf(
		    "%s %s on node %s: the call's deadline "
		    "passed before it could be forwarded: allow a longer "
		    "timeout",
		    method, what, node->s);
		rv = MOAT_DEADLINE_EXCEEDED;
		goto out;
	}
	rv = moat_rpc_call_raw(moat_node_conn_client(conn), VM_SERVICE, method,
	    payload, len, reply, reply_len, &opts, &msg);
	if (!transport_unavailable(rv, msg))
		moat_nodes_answered(fw->nodes, node);
	if (rv == MOAT_OK)
		goto out;
	if (transport_unavailable(rv, msg)) {
		moat_nodes_mark_down(fw->nodes, node, method, started);
		*errmsg = moat_asprintf(
		    "node %s (%s), which holds %s, did "
		    "not answer %s: is its moat-vmd running? `moat info` "
		    "shows the nodes; deploy/moat-stack start restarts a "
		    "local one",
		    node->s, url ? url : "?", what, method);
		free(msg);
	} else {
		*errmsg = msg; /* the node's own words, unchanged */
	}
	if (*errmsg == NULL)
		*errmsg = strdup(moat_strerror(rv));
out:
	free(url);
	moat_node_conn_put(conn);
	return rv;
}

int
moat_forward_node_call(struct moat_forward *fw,
    const struct moat_node_id *node, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *reply_desc,
    uint64_t request_id, uint64_t deadline_ms, const char *what,
    ProtobufCMessage **out, char **errmsg)
{
	uint8_t *payload, *reply = NULL;
	size_t len, reply_len = 0;
	int rv;

	*out = NULL;
	len = protobuf_c_message_get_packed_size(req);
	if ((payload = malloc(len ? len : 1)) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	protobuf_c_message_pack(req, payload);
	rv = moat_forward_to_node(fw, node, tenant, method, payload, len,
	    request_id, deadline_ms, what, &reply, &reply_len, errmsg);
	free(payload);
	if (rv != MOAT_OK)
		return rv;
	*out = protobuf_c_message_unpack(reply_desc, NULL, reply_len, reply);
	free(reply);
	if (*out == NULL) {
		*errmsg = moat_asprintf("node %s answered %s with something "
		                        "that is not a %s: are the gateway "
		                        "and moat-vmd built from "
		                        "the same protos?",
		    node->s, method, reply_desc->name);
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* One locate: the nodes asked in parallel, the first to have the
 * sandbox wins; the caller does not wait for slower ones (their threads
 * finish on their own and the last one out frees this). */
struct locate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs; /* the caller's, plus one per thread */
	size_t pending;
	bool found;
	struct moat_node_id node;
	struct moat_forward *fw;
	struct moat_sandbox_id sandbox;
	char tenant[MOAT_ID_MAX];
	uint64_t deadline_ms;
	char silent[512]; /* nodes that did not answer, for the message */
	size_t n_silent;
};

struct locate_job {
	struct locate *l;
	struct moat_node_id node;
};

static void
locate_unref(struct locate *l)
{
	bool last;

	pthread_mutex_lock(&l->mu);
	last = --l->refs == 0;
	pthread_mutex_unlock(&l->mu);
	if (!last)
		return;
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}

/* locate_ask: asks one node GetSandbox; records what it said. */
static void *
locate_ask(void *arg)
{
	struct locate_job *j = arg;
	struct locate *l = j->l;
	struct moat_forward *fw = l->fw;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	uint8_t req[MOAT_ID_MAX + 8], *reply = NULL;
	size_t req_len, reply_len = 0;
	char *msg = NULL, what[MOAT_ID_MAX + 16];
	uint64_t deadline = l->deadline_ms;
	uint64_t cap = moat_rpc_now_ms() + LOCATE_TIMEOUT_MS;
	int rv;

	if (cap < deadline)
		deadline = cap;
	ref.sandbox_id = l->sandbox.s;
	req_len = moat__v1__sandbox_ref__get_packed_size(&ref);
	moat__v1__sandbox_ref__pack(&ref, req);
	snprintf(what, sizeof(what), "sandbox %s", l->sandbox.s);
	rv = moat_forward_to_node(fw, &j->node, l->tenant, "GetSandbox", req,
	    req_len, moat_rpc_new_request_id(), deadline, what, &reply,
	    &reply_len, &msg);
	free(reply);
	if (rv != MOAT_OK && rv != MOAT_NOT_FOUND)
		moat_warn(0, "looking for sandbox %s on node %s: %s: %s",
		    l->sandbox.s, j->node.s, moat_strerror(rv),
		    msg ? msg : "");
	free(msg);
	if (rv == MOAT_OK)
		moat_forward_remember(fw, &l->sandbox, &j->node);
	pthread_mutex_lock(&l->mu);
	if (rv == MOAT_OK && !l->found) {
		l->found = true;
		l->node = j->node;
	} else if (rv != MOAT_OK && rv != MOAT_NOT_FOUND) {
		size_t used = strlen(l->silent);

		snprintf(l->silent + used, sizeof(l->silent) - used, "%s%s",
		    l->n_silent ? ", " : "", j->node.s);
		l->n_silent++;
	}
	l->pending--;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	pthread_mutex_lock(&fw->lock);
	fw->locating--;
	pthread_mutex_unlock(&fw->lock);
	locate_unref(l);
	free(j);
	return NULL;
}

/* locate_start: one thread per node of ids; a node whose thread cannot
 * start is asked inline. */
static void
locate_start(struct locate *l, const struct moat_node_id *ids, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct locate_job *j = calloc(1, sizeof(*j));
		pthread_attr_t attr;
		pthread_t th;
		bool started = false;

		pthread_mutex_lock(&l->mu);
		l->refs++;
		pthread_mutex_unlock(&l->mu);
		pthread_mutex_lock(&l->fw->lock);
		l->fw->locating++;
		pthread_mutex_unlock(&l->fw->lock);
		if (j == NULL) {
			/* Counted as a node that did not answer. */
			pthread_mutex_lock(&l->mu);
			l->n_silent++;
			l->pending--;
			pthread_mutex_unlock(&l->mu);
			pthread_mutex_lock(&l->fw->lock);
			l->fw->locating--;
			pthread_mutex_unlock(&l->fw->lock);
			locate_unref(l);
			continue;
		}
		j->l = l;
		j->node = ids[i];
		if (pthread_attr_init(&attr) == 0) {
			pthread_attr_setdetachstate(&attr,
			    PTHREAD_CREATE_DETACHED);
			started =
			    pthread_create(&th, &attr, locate_ask, j) == 0;
			pthread_attr_destroy(&attr);
		}
		if (!started)
			locate_ask(j);
	}
}

/* locate_ask_all: asks every node of ids at once; MOAT_OK with *node as
 * soon as one has the sandbox, else the verdict once all answered. */
static int
locate_ask_all(struct moat_forward *fw, const struct moat_sandbox_id *sandbox,
    const char *tenant, const struct moat_node_id *ids, size_t n,
    uint64_t deadline_ms, struct moat_node_id *node, char **errmsg)
{
	struct locate *l = calloc(1, sizeof(*l));
	int rv;

	if (l == NULL) {
		*errmsg = moat_asprintf("looking for sandbox %s: out of "
		                        "memory",
		    sandbox->s);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->refs = 1;
	l->pending = n;
	l->fw = fw;
	l->sandbox = *sandbox;
	snprintf(l->tenant, sizeof(l->tenant), "%s", tenant ? tenant : "");
	l->deadline_ms = deadline_ms;
	locate_start(l, ids, n);
	pthread_mutex_lock(&l->mu);
	while (!l->found && l->pending > 0)
		pthread_cond_wait(&l->cv, &l->mu);
	if (l->found) {
		*node = l->node;
		rv = MOAT_OK;
	} else if (l->n_silent > 0) {
		*errmsg = moat_asprintf(
		    "sandbox %s is on none of the nodes "
		    "that answered, and node(s) %s did not: retry when they "
		    "are back (`moat info` shows them)",
		    sandbox->s, l->silent);
		rv = MOAT_UNAVAILABLE;
	} else {
		*errmsg = moat_asprintf(
		    "sandbox %s does not exist (or was "
		    "destroyed): `moat sandbox ls` lists the sandboxes",
		    sandbox->s);
		rv = MOAT_NOT_FOUND;
	}
	pthread_mutex_unlock(&l->mu);
	locate_unref(l);
	return rv;
}

int
moat_forward_locate(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, const char *tenant,
    uint64_t deadline_ms, struct moat_node_id *node, char **errmsg)
{
	struct moat_node_id *ids = NULL;
	size_t n = 0;
	int rv;

	*errmsg = NULL;
	if (route_lookup(fw, sandbox, node))
		return MOAT_OK;
	/* The inventory knows every node's sandboxes, the lost ones too. */
	if (moat_inventory_find(fw->inv, sandbox->s, node, NULL)) {
		moat_forward_remember(fw, sandbox, node);
		return MOAT_OK;
	}
	if ((rv = moat_nodes_available_ids(fw->nodes, &ids, &n)) != MOAT_OK) {
		*errmsg = moat_asprintf("looking for sandbox %s: out of "
		                        "memory",
		    sandbox->s);
		return rv;
	}
	if (n == 0) {
		*errmsg = moat_asprintf(
		    "sandbox %s: no vmd node is "
		    "available to hold it: start moat-vmd (deploy/moat-stack "
		    "start); `moat info` lists the nodes",
		    sandbox->s);
		return MOAT_UNAVAILABLE;
	}
	rv = locate_ask_all(fw, sandbox, tenant, ids, n, deadline_ms, node,
	    errmsg);
	free(ids);
	return rv;
}

static bool route_tenant(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, const char *set, char *out,
    size_t size);
static bool inventory_tenant(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, char *tenant, size_t size);
static char *not_found_msg(const char *sandbox_id);

/* forward_route: the node to forward `call` on `sandbox_id` to; on
 * failure a status with *msg (heap). */
static int
forward_route(struct moat_forward *fw, struct moat_rpc_call *call,
    const char *sandbox_id, struct moat_sandbox_id *sandbox,
    struct moat_node_id *node, char **msg)
{
	int rv;

	*msg = NULL;
	if (sandbox_id == NULL || sandbox_id[0] == '\0') {
		*msg = moat_asprintf("%s: sandbox_id is required: `moat "
		                     "sandbox ls` lists the sandboxes",
		    call->method);
		return MOAT_INVALID_ARGUMENT;
	}
	if (!moat_sandbox_id_set(sandbox, sandbox_id)) {
		*msg = moat_asprintf("%s: sandbox_id is longer than %d bytes: "
		                     "no sandbox has such an id",
		    call->method, MOAT_ID_MAX - 1);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((rv = moat_forward_locate(fw, sandbox, moat_gw_tenant(call),
	         call->deadline_ms, node, msg)) != MOAT_OK)
		return rv;
	if (!moat_nodes_is_available(fw->nodes, node)) {
		char owner[MOAT_ID_MAX];

		/* No waiting for a node the survey says is gone; another
		 * tenant's sandbox there is as absent as anywhere else. */
		if ((route_tenant(fw, sandbox, NULL, owner, sizeof(owner)) ||
		        inventory_tenant(fw, sandbox, owner, sizeof(owner))) &&
		    strcmp(owner, moat_gw_tenant(call)) != 0) {
			*msg = not_found_msg(sandbox->s);
			return MOAT_NOT_FOUND;
		}
		*msg = moat_node_down_message(sandbox->s, node->s);
		return MOAT_UNAVAILABLE;
	}
	return MOAT_OK;
}

int
moat_forward_call(struct moat_forward *fw, struct moat_rpc_call *call,
    const char *sandbox_id, const uint8_t *payload, size_t len)
{
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	char *msg = NULL, what[MOAT_ID_MAX + 16];
	uint8_t *reply = NULL;
	size_t reply_len = 0;
	int rv;

	if ((rv = forward_route(fw, call, sandbox_id, &sandbox, &node,
	         &msg)) != MOAT_OK)
		goto fail;
	snprintf(what, sizeof(what), "sandbox %s", sandbox.s);
	rv = moat_forward_to_node(fw, &node, moat_gw_tenant(call),
	    call->method, payload, len, call->request_id, call->deadline_ms,
	    what, &reply, &reply_len, &msg);
	if (rv != MOAT_OK) {
		/* For these two, NOT_FOUND can only mean the sandbox. */
		if (rv == MOAT_NOT_FOUND &&
		    (strcmp(call->method, "GetSandbox") == 0 ||
		        strcmp(call->method, "DestroySandbox") == 0)) {
			moat_forward_forget(fw, &sandbox);
			moat_inventory_forget(fw->inv, sandbox.s);
		}
		goto fail;
	}
	if (strcmp(call->method, "DestroySandbox") == 0) {
		moat_forward_forget(fw, &sandbox);
		moat_inventory_forget(fw->inv, sandbox.s);
	}
	call->raw_reply = reply;
	call->raw_reply_len = reply_len;
	return MOAT_OK;

fail:
	rv = moat_rpc_error(call, rv, "%s", msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

/* ---- forwards answered later (Exec, RunCode) ---- */

/* One forward whose reply the gateway deferred: no gateway worker waits
 * for the node; the node's answer completes the call from the rpc
 * client's thread. */
struct forward_async {
	struct moat_forward *fw;
	struct moat_rpc_deferred *d;
	struct moat_node_conn *conn; /* held until the answer */
	struct moat_node_id node;
	char *url;
	char method[32];
	char what[MOAT_ID_MAX + 16];
	const ProtobufCMessageDescriptor *reply_desc;
	char *safety; /* heap or NULL */
	/* The callback flavour (moat_forward_call_async_fn): the outcome
	 * goes to done(done_arg, ...) instead of completing d (NULL). */
	moat_forward_done done;
	void *done_arg;
	uint64_t started_ms; /* monotonic: when it was sent */
};

static void
forward_async_free(struct forward_async *a)
{
	moat_node_conn_put(a->conn);
	free(a->url);
	free(a->safety);
	free(a);
}

/* forward_async_hand: the callback flavour's end: the node's outcome
 * (a transport failure worded as moat_forward_to_node words it) goes to
 * a->done, which owns payload and the message. */
static void
forward_async_hand(struct forward_async *a, int code, uint8_t *payload,
    size_t len, char *errmsg)
{
	struct moat_forward *fw = a->fw;
	moat_forward_done done = a->done;
	void *done_arg = a->done_arg;

	if (code != MOAT_OK && transport_unavailable(code, errmsg)) {
		moat_nodes_mark_down(fw->nodes, &a->node, a->method,
		    a->started_ms);
		free(errmsg);
		errmsg = moat_asprintf(
		    "node %s (%s), which holds %s, did not answer %s: is its "
		    "moat-vmd running? `moat info` shows the nodes; "
		    "deploy/moat-stack start restarts a local one",
		    a->node.s, a->url ? a->url : "?", a->what, a->method);
	}
	if (code != MOAT_OK) {
		free(payload);
		payload = NULL;
		len = 0;
	}
	forward_async_free(a);
	/* Counted down after done ran: drain waits for done too. */
	done(done_arg, code, payload, len, errmsg);
	pthread_mutex_lock(&fw->lock);
	fw->async_calls--;
	pthread_mutex_unlock(&fw->lock);
}

static void
forward_async_done(void *arg, int code, uint8_t *payload, size_t len,
    char *errmsg)
{
	struct forward_async *a = arg;
	struct moat_forward *fw;
	char *msg = NULL;

	if (!transport_unavailable(code, errmsg))
		moat_nodes_answered(a->fw->nodes, &a->node);
	if (a->done != NULL) {
		forward_async_hand(a, code, payload, len, errmsg);
		return;
	}
	if (code == MOAT_OK) {
		if (a->safety != NULL)
			moat_gw_set_safety_raw(a->reply_desc, &payload, &len,
			    a->safety);
		moat_rpc_complete_raw(a->d, MOAT_OK, payload, len, NULL);
	} else {
		if (transport_unavailable(code, errmsg)) {
			moat_nodes_mark_down(a->fw->nodes, &a->node, a->method,
			    a->started_ms);
			msg = moat_asprintf(
			    "node %s (%s), which holds %s, did not answer "
			    "%s: is its moat-vmd running? `moat info` shows "
			    "the nodes; deploy/moat-stack start restarts a "
			    "local one",
			    a->node.s, a->url ? a->url : "?", a->what,
			    a->method);
		}
		moat_rpc_complete_raw(a->d, code, NULL, 0,
		    msg != NULL ? msg : errmsg);
		free(payload);
	}
	free(msg);
	free(errmsg);
	fw = a->fw;
	forward_async_free(a);
	pthread_mutex_lock(&fw->lock);
	fw->async_calls--;
	pthread_mutex_unlock(&fw->lock);
}

/* forward_async_start: defers `call` and sends it to `node` without
 * waiting. False when it could not be deferred (nothing was sent: the
 * caller forwards it the synchronous way); true when the call is
 * answered later, whatever happens. */
static bool
forward_async_start(struct moat_forward *fw, struct moat_rpc_call *call,
    const struct moat_node_id *node, const char *what, const uint8_t *payload,
    size_t len, const ProtobufCMessageDescriptor *reply_desc,
    const char *safety)
{
	struct moat_rpc_opts opts = { .request_id = call->request_id,
		.tenant = moat_gw_tenant(call) };
	struct forward_async *a;
	char *msg = NULL;
	int rv;

	if (call->rpc_private == NULL || strlen(call->method) >= 32 ||
	    (opts.timeout_ms = time_left(call->deadline_ms)) == 0)
		return false;
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return false;
	if ((safety != NULL && (a->safety = strdup(safety)) == NULL) ||
	    moat_nodes_conn_get(fw->nodes, node, &a->conn, &a->url, &msg) !=
	        MOAT_OK) {
		free(msg);
		free(a->safety);
		free(a);
		return false;
	}
	a->fw = fw;
	a->node = *node;
	a->started_ms = moat_rpc_now_ms();
	a->reply_desc = reply_desc;
	snprintf(a->method, sizeof(a->method), "%s", call->method);
	snprintf(a->what, sizeof(a->what), "%s", what);
	if ((a->d = moat_rpc_defer(call)) == NULL) {
		forward_async_free(a);
		return false;
	}
	pthread_mutex_lock(&fw->lock);
	fw->async_calls++;
	pthread_mutex_unlock(&fw->lock);
	rv = moat_rpc_call_raw_async(moat_node_conn_client(a->conn),
	    VM_SERVICE, call->method, payload, len, &opts, forward_async_done,
	    a, &msg);
	if (rv != MOAT_OK) {
		moat_rpc_complete_raw(a->d, rv, NULL, 0, msg);
		free(msg);
		forward_async_free(a);
		pthread_mutex_lock(&fw->lock);
		fw->async_calls--;
		pthread_mutex_unlock(&fw->lock);
	}
	return true;
}

int
moat_forward_call_async(struct moat_forward *fw, struct moat_rpc_call *call,
    const char *sandbox_id, const uint8_t *payload, size_t len,
    const ProtobufCMessageDescriptor *reply_desc, const char *safety)
{
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	char *msg = NULL, what[MOAT_ID_MAX + 16];
	int rv;

	if ((rv = forward_route(fw, call, sandbox_id, &sandbox, &node,
	         &msg)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s",
		    msg ? msg : moat_strerror(rv));
		free(msg);
		return rv;
	}
	snprintf(what, sizeof(what), "sandbox %s", sandbox.s);
	if (forward_async_start(fw, call, &node, what, payload, len,
	        reply_desc, safety))
		return MOAT_OK; /* answered later */
	return moat_forward_call(fw, call, sandbox_id, payload, len);
}

int
moat_forward_node_async(struct moat_forward *fw, struct moat_rpc_call *call,
    const struct moat_node_id *node, const char *what, const uint8_t *payload,
    size_t len, const ProtobufCMessageDescriptor *reply_desc)
{
	uint8_t *reply = NULL;
	size_t reply_len = 0;
	char *msg = NULL;
	int rv;

	if (forward_async_start(fw, call, node, what, payload, len, reply_desc,
	        NULL))
		return MOAT_OK; /* answered later */
	rv = moat_forward_to_node(fw, node, moat_gw_tenant(call), call->method,
	    payload, len, call->request_id, call->deadline_ms, what, &reply,
	    &reply_len, &msg);
	if (rv != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s",
		    msg ? msg : moat_strerror(rv));
		free(msg);
		return rv;
	}
	free(msg);
	call->raw_reply = reply;
	call->raw_reply_len = reply_len;
	return MOAT_OK;
}

int
moat_forward_call_async_fn(struct moat_forward *fw, struct moat_rpc_call *call,
    const char *sandbox_id, const uint8_t *payload, size_t len,
    moat_forward_done done, void *arg)
{
	struct moat_rpc_opts opts = { .request_id = call->request_id,
		.tenant = moat_gw_tenant(call) };
	struct moat_sandbox_id sandbox;
	struct forward_async *a = NULL;
	struct moat_node_id node;
	char *msg = NULL;
	int rv;

	if ((rv = forward_route(fw, call, sandbox_id, &sandbox, &node,
	         &msg)) != MOAT_OK)
		goto fail;
	if ((opts.timeout_ms = time_left(call->deadline_ms)) == 0) {
		rv = MOAT_DEADLINE_EXCEEDED;
		msg = moat_asprintf("%s sandbox %s on node %s: the call's "
		                    "deadline passed before it could be "
		                    "forwarded: allow a longer timeout",
		    call->method, sandbox.s, node.s);
		goto fail;
	}
	if ((a = calloc(1, sizeof(*a))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
	}
	if ((rv = moat_nodes_conn_get(fw->nodes, &node, &a->conn, &a->url,
	         &msg)) != MOAT_OK) {
		rv = rv == MOAT_NOT_FOUND ? MOAT_UNAVAILABLE : rv;
		goto fail;
	}
	a->fw = fw;
	a->node = node;
	a->started_ms = moat_rpc_now_ms();
	a->done = done;
	a->done_arg = arg;
	snprintf(a->method, sizeof(a->method), "%s", call->method);
	snprintf(a->what, sizeof(a->what), "sandbox %s", sandbox.s);
	pthread_mutex_lock(&fw->lock);
	fw->async_calls++;
	pthread_mutex_unlock(&fw->lock);
	rv = moat_rpc_call_raw_async(moat_node_conn_client(a->conn),
	    VM_SERVICE, call->method, payload, len, &opts, forward_async_done,
	    a, &msg);
	if (rv == MOAT_OK)
		return MOAT_OK; /* done is called */
	pthread_mutex_lock(&fw->lock);
	fw->async_calls--;
	pthread_mutex_unlock(&fw->lock);
fail:
	if (a != NULL)
		forward_async_free(a);
	rv = moat_rpc_error(call, rv, "%s", msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

/* route_tenant: the tenant cached for `sandbox` into `out` (size bytes);
 * false when unknown. When `set` is not NULL it is stored instead. */
static bool
route_tenant(struct moat_forward *fw, const struct moat_sandbox_id *sandbox,
    const char *set, char *out, size_t size)
{
	bool found, known = false;
	size_t i;

	pthread_mutex_lock(&fw->lock);
	i = route_find(fw, sandbox->s, &found);
	if (found && set != NULL) {
		snprintf(fw->routes[i].tenant, sizeof(fw->routes[i].tenant),
		    "%s", set);
	} else if (found && fw->routes[i].tenant[0] != '\0') {
		snprintf(out, size, "%s", fw->routes[i].tenant);
		known = true;
	}
	pthread_mutex_unlock(&fw->lock);
	return known;
}

/* inventory_tenant: the tenant the inventory knows for `sandbox` (its
 * node's last word), cached with its route. */
static bool
inventory_tenant(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, char *tenant, size_t size)
{
	Moat__V1__Sandbox *sb = NULL;
	bool known;

	if (!moat_inventory_find(fw->inv, sandbox->s, NULL, &sb) || sb == NULL)
		return false;
	known = sb->tenant[0] != '\0';
	if (known) {
		snprintf(tenant, size, "%s", sb->tenant);
		route_tenant(fw, sandbox, tenant, NULL, 0);
	}
	moat__v1__sandbox__free_unpacked(sb, NULL);
	return known;
}

/* not_found_msg: a missing sandbox's words; another tenant's gets the
 * same. Heap. */
static char *
not_found_msg(const char *sandbox_id)
{
	return moat_asprintf("sandbox %s does not exist (or was "
	                     "destroyed): `moat sandbox ls` lists the "
	                     "sandboxes",
	    sandbox_id);
}

int
moat_forward_check_owner(struct moat_forward *fw, const char *sandbox_id,
    const char *tenant, uint64_t deadline_ms, char **errmsg)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	uint8_t req[MOAT_ID_MAX + 8], *reply = NULL;
	size_t len, reply_len = 0;
	char what[MOAT_ID_MAX + 16], owner[MOAT_ID_MAX];
	int rv;

	*errmsg = NULL;
	if (!moat_sandbox_id_set(&sandbox, sandbox_id)) {
		*errmsg = moat_asprintf(
		    "sandbox_id is empty or longer than "
		    "%d bytes: `moat sandbox ls` lists the sandboxes",
		    MOAT_ID_MAX - 1);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((rv = moat_forward_locate(fw, &sandbox, tenant, deadline_ms, &node,
	         errmsg)) != MOAT_OK)
		return rv;
	if (route_tenant(fw, &sandbox, NULL, owner, sizeof(owner)) ||
	    inventory_tenant(fw, &sandbox, owner, sizeof(owner))) {
		if (strcmp(owner, tenant) == 0)
			return MOAT_OK;
		*errmsg = not_found_msg(sandbox.s);
		return MOAT_NOT_FOUND;
	}
	/* The node answers NOT_FOUND for another tenant's sandbox. */
	ref.sandbox_id = sandbox.s;
	len = moat__v1__sandbox_ref__get_packed_size(&ref);
	moat__v1__sandbox_ref__pack(&ref, req);
	snprintf(what, sizeof(what), "sandbox %s", sandbox.s);
	rv = moat_forward_to_node(fw, &node, tenant, "GetSandbox", req, len,
	    moat_rpc_new_request_id(), deadline_ms, what, &reply, &reply_len,
	    errmsg);
	free(reply);
	if (rv == MOAT_NOT_FOUND) {
		free(*errmsg);
		*errmsg = not_found_msg(sandbox.s);
	} else if (rv == MOAT_OK) {
		route_tenant(fw, &sandbox, tenant, NULL, 0);
	}
	return rv;
}

void
moat_forward_set_tenant(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, const char *tenant)
{
	if (tenant != NULL && tenant[0] != '\0')
		route_tenant(fw, sandbox, tenant, NULL, 0);
}
