/*
 * handlers.c: the Gateway service: its method table and the handlers of
 * the calls the gateway answers itself (Health, Info, ListNodes, the
 * cluster-wide ListSandboxes, and CreateSandbox's placement), plus the
 * gateway object's start and stop. Every other method is a sandbox call
 * forwarded unchanged by forward.c, but for those of recorded sandboxes
 * (record.c) and the snapshots' own (snapshots.c: DeleteSession,
 * GcSnapshots). The gateway, never the client, sets the `tenant` fields:
 * every call first passes gate(), which resolves the caller's tenant from
 * its API key (auth.c), hides other tenants' sandboxes, applies the
 * command policy, audits mutating calls and counts every call for
 * /metrics, for both doors (nng and HTTP) in one place.
 * Not for: flags and signals (main.c), the node table (discovery.c).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "admission.h"
#include "auth.h"
#include "gateway.h"
#include "tenants.h"
#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/safety.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"
#include "snapshot.pb-c.h"

#define LIST_TIMEOUT_MS 3000 /* all nodes at once, for ListSandboxes */

struct moat_gateway {
	struct moat_nodes nodes;
	struct moat_forward fw;
	struct moat_record rec;
	bool nodes_ready, fw_ready;
	struct moat_discovery *discovery;
	struct moat_inventory *inventory; /* every node's sandboxes */
	struct moat_rpc_server *server;
	struct moat_rpc_client *sessiond, *snapd;
	char *listen_url, *survey_url, *sessiond_url, *snapd_url, *state_dir;
	uint64_t started_ms;
	struct moat_auth *auth;           /* keys and audit; NULL: no store */
	bool auth_on;                     /* keys required (opts.auth) */
	const struct moat_config *config; /* borrowed: [policy] */
	struct gw_metrics *metrics;
	struct moat_rpc_method *methods; /* the table served: all gate() */
	/* The same for the HTTP door (gate_http: its own admit() took the
	 * API key's token already). */
	struct moat_rpc_method *http_methods;
	struct moat_admission *adm; /* reservations, quotas, key buckets */
	struct moat_drains *drains; /* DrainNode's threads (drain.c) */
	/* Tenants' settings in sessiond (with keys there); NULL: none. */
	struct moat_tenants *tenants;
};

static char *
xstrdup(const char *s)
{
	return strdup(s != NULL ? s : "");
}

/* ---- answered here ---- */

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	r->uptime_ms = moat_rpc_now_ms() - gw->started_ms;
	if ((r->service = strdup("moat-gateway")) == NULL ||
	    (r->version = strdup(MOAT_VERSION)) == NULL ||
	    (r->state_dir = xstrdup(gw->state_dir)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	return MOAT_OK;
}

/* set_unusable: Node.unusable_reason (the gateway's view: why placement
 * skips a node that answers) on each of `nodes`. False when out of
 * memory. */
static bool
set_unusable(Moat__V1__Node **nodes, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char why[256];
		const char *u =
		    moat_placement_unusable(nodes[i], why, sizeof(why));

		if (u == NULL)
			continue;
		if (nodes[i]->unusable_reason != protobuf_c_empty_string)
			free(nodes[i]->unusable_reason);
		if ((nodes[i]->unusable_reason = strdup(u)) == NULL)
			return false;
	}
	return true;
}

static int
h_list_nodes(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	Moat__V1__NodeList *r = (Moat__V1__NodeList *)reply;

	if (moat_nodes_snapshot(&gw->nodes, &r->nodes, &r->n_nodes) !=
	        MOAT_OK ||
	    !set_unusable(r->nodes, r->n_nodes))
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory listing nodes");
	return MOAT_OK;
}

/* One service health check of Info, run on its own thread so a service
 * that is down costs one timeout, not one per service. */
struct health_check {
	pthread_t thread;
	bool started;
	struct moat_gateway *gw;
	struct moat_rpc_client *client; /* sessiond/snapd; NULL for a node */
	struct moat_node_id node;
	const char *rpc_service;      /* "moat.v1.Session" */
	Moat__V1__ServiceHealth *out; /* filled by the thread */
};

static void *
health_main(void *arg)
{
	struct health_check *hc = arg;
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms =
		                          MOAT_GW_HEALTH_TIMEOUT_MS };
	struct moat_node_conn *conn = NULL;
	struct moat_rpc_client *client = hc->client;
	ProtobufCMessage *reply = NULL;
	Moat__V1__HealthReply *hr;
	char *msg = NULL;
	int rv;

	if (client == NULL) {
		if ((rv = moat_nodes_conn_get(&hc->gw->nodes, &hc->node, &conn,
		         NULL, &msg)) != MOAT_OK)
			goto done;
		client = moat_node_conn_client(conn);
	}
	rv = moat_rpc_call(client, hc->rpc_service, "Health", &req.base,
	    &moat__v1__health_reply__descriptor, &reply, &opts, &msg);
done:
	if (rv == MOAT_OK && client != hc->client)
		moat_nodes_answered(&hc->gw->nodes, &hc->node);
	if (rv == MOAT_OK) {
		hr = (Moat__V1__HealthReply *)reply;
		hc->out->up = true;
		free(hc->out->version);
		hc->out->version = xstrdup(hr->version);
		protobuf_c_message_free_unpacked(reply, NULL);
	} else {
		hc->out->up = false;
		free(hc->out->message);
		hc->out->message =
		    moat_asprintf("%s: %s", moat_strerror(rv), msg ? msg : "");
	}
	free(msg);
	moat_node_conn_put(conn);
	return NULL;
}

static Moat__V1__ServiceHealth *
service_health_new(const char *service, const char *url)
{
	Moat__V1__ServiceHealth *s = malloc(sizeof(*s));

	if (s == NULL)
		return NULL;
	moat__v1__service_health__init(s);
	s->service = xstrdup(service);
	s->url = xstrdup(url);
	s->version = xstrdup("");
	s->message = xstrdup("");
	if (s->service == NULL || s->url == NULL || s->version == NULL ||
	    s->message == NULL) {
		moat__v1__service_health__free_unpacked(s, NULL);
		return NULL;
	}
	return s;
}

static int
h_info(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	Moat__V1__ClusterInfo *r = (Moat__V1__ClusterInfo *)reply;
	struct health_check *checks = NULL;
	size_t n_checks = 0;
	int rv = MOAT_OK;

	r->uptime_ms = moat_rpc_now_ms() - gw->started_ms;
	if ((r->version = strdup(MOAT_VERSION)) == NULL ||
	    moat_nodes_snapshot(&gw->nodes, &r->nodes, &r->n_nodes) !=
	        MOAT_OK ||
	    !set_unusable(r->nodes, r->n_nodes))
		goto fail_oom;
	/* gateway itself, sessiond, snapd, then one per node. */
	if ((r->services = calloc(3 + r->n_nodes, sizeof(*r->services))) ==
	        NULL ||
	    (checks = calloc(2 + r->n_nodes, sizeof(*checks))) == NULL)
		goto fail_oom;
	if ((r->services[0] = service_health_new("moat-gateway",
	         gw->listen_url)) == NULL)
		goto fail_oom;
	r->n_services = 1;
	r->services[0]->up = true;
	free(r->services[0]->version);
	r->services[0]->version = xstrdup(MOAT_VERSION);

	const struct {
		const char *name, *url, *rpc;
		struct moat_rpc_client *client;
	} fixed[] = {
		{ "moat-sessiond", gw->sessiond_url, "moat.v1.Session",
		    gw->sessiond },
		{ "moat-snapd", gw->snapd_url, "moat.v1.Snapshot", gw->snapd },
	};
	for (size_t i = 0; i < 2; i++) {
		Moat__V1__ServiceHealth *s =
		    service_health_new(fixed[i].name, fixed[i].url);
		if (s == NULL)
			goto fail_oom;
		r->services[r->n_services++] = s;
		checks[n_checks].gw = gw;
		checks[n_checks].client = fixed[i].client;
		checks[n_checks].rpc_service = fixed[i].rpc;
		checks[n_checks].out = s;
		n_checks++;
	}
	for (size_t i = 0; i < r->n_nodes; i++) {
		Moat__V1__Node *node = r->nodes[i];
		char *name = moat_asprintf("moat-vmd %s", node->node_id);
		Moat__V1__ServiceHealth *s = name == NULL ?
		    NULL :
		    service_health_new(name, node->rpc_url);

		free(name);
		if (s == NULL)
			goto fail_oom;
		r->services[r->n_services++] = s;
		if (!node->available) {
			free(s->message);
			s->message = moat_asprintf(
			    "not answering the "
			    "gateway's surveys: is its moat-vmd running?");
			continue;
		}
		if (!moat_node_id_set(&checks[n_checks].node, node->node_id))
			continue;
		checks[n_checks].gw = gw;
		checks[n_checks].rpc_service = "moat.v1.Vm";
		checks[n_checks].out = s;
		n_checks++;
	}
	for (size_t i = 0; i < n_checks; i++)
		checks[i].started = pthread_create(&checks[i].thread, NULL,
		                        health_main, &checks[i]) == 0;
	for (size_t i = 0; i < n_checks; i++) {
		if (checks[i].started)
			pthread_join(checks[i].thread, NULL);
		else
			health_main(&checks[i]);
	}
	free(checks);
	return MOAT_OK;

fail_oom:
	free(checks);
	rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
	    "out of memory building the cluster info");
	return rv;
}

bool
moat_sandbox_set_session(Moat__V1__Sandbox *sb, const char *id)
{
	char *copy = strdup(id);

	if (copy == NULL)
		return false;
	if (sb->session_id != NULL &&
	    sb->session_id != protobuf_c_empty_string)
		free(sb->session_id);
	sb->session_id = copy;
	return true;
}

/* repack_sandbox: sb (with session_id set) as the new raw reply. */
static int
repack_sandbox(Moat__V1__Sandbox *sb, uint8_t **out, size_t *out_len)
{
	size_t len = moat__v1__sandbox__get_packed_size(sb);
	uint8_t *p = malloc(len ? len : 1);

	if (p == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	moat__v1__sandbox__pack(sb, p);
	free(*out);
	*out = p;
	*out_len = len;
	return MOAT_OK;
}

/* record_new_sandbox: the new sandbox *sb (on `node`) was asked for with
 * `record`: its session is created and its id put in the reply. When
 * sessiond cannot make one the sandbox is destroyed again (a recording
 * asked for and silently missing is worse than none) and the error names
 * sessiond; *errmsg is then set (heap). */
static int
record_new_sandbox(struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, const struct moat_node_id *node,
    Moat__V1__Sandbox **sb, uint8_t **out, size_t *out_len, char **errmsg)
{
	struct moat_gateway *gw = call->service_ctx;
	char session_id[MOAT_ID_MAX];
	int rv;

	rv = moat_record_start(&gw->rec, moat_gw_tenant(call), req, (*sb)->id,
	    call->request_id, call->deadline_ms, session_id,
	    sizeof(session_id), errmsg);
	if (rv == MOAT_OK) {
		if (!moat_sandbox_set_session(*sb, session_id) ||
		    repack_sandbox(*sb, out, out_len) != MOAT_OK) {
			*errmsg = moat_asprintf("out of memory");
			return MOAT_RESOURCE_EXHAUSTED;
		}
		moat_info(call->request_id,
		    "sandbox %s recorded as session "
		    "%s",
		    (*sb)->id, session_id);
		return MOAT_OK;
	} else {
		Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
		uint8_t payload[MOAT_ID_MAX + 8], *dout = NULL;
		size_t len, dlen = 0;
		char *dmsg = NULL;
		struct moat_sandbox_id sandbox;

		ref.sandbox_id = (*sb)->id;
		len = moat__v1__sandbox_ref__get_packed_size(&ref);
		if (len <= sizeof(payload)) {
			moat__v1__sandbox_ref__pack(&ref, payload);
			if (moat_forward_to_node(&gw->fw, node,
			        moat_gw_tenant(call), "DestroySandbox",
			        payload, len, moat_rpc_new_request_id(),
			        moat_rpc_now_ms() +
			            MOAT_RPC_DEFAULT_TIMEOUT_MS,
			        "the unrecorded sandbox", &dout, &dlen,
			        &dmsg) != MOAT_OK)
				moat_warn(call->request_id,
				    "sandbox %s could "
				    "not be recorded and is left running: %s",
				    (*sb)->id, dmsg ? dmsg : "");
			free(dout);
			free(dmsg);
		}
		if (moat_sandbox_id_set(&sandbox, (*sb)->id))
			moat_forward_forget(&gw->fw, &sandbox);
	}
	return rv;
}

static int
h_create_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const Moat__V1__CreateSandboxRequest *req =
	    (const Moat__V1__CreateSandboxRequest *)request;
	/* The tenant is the gateway's to say; whatever the client put there
	 * is replaced. A shallow copy: the request stays untouched. */
	Moat__V1__CreateSandboxRequest fwd = *req;
	struct moat_gw_create c = {
		.nodes = &gw->nodes,
		.fw = &gw->fw,
		.adm = gw->adm,
		.tenant = moat_gw_tenant(call),
		.req = &fwd,
		.survey_url = gw->survey_url,
		.what = "the new sandbox",
		.request_id = call->request_id,
		.deadline_ms = call->deadline_ms,
		.quota = true,
	};
	Moat__V1__Sandbox *sb = NULL;
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	uint8_t *out = NULL;
	size_t out_len = 0;
	char *msg = NULL;
	int rv;

	/* The tenant's default lifetime, and its maximum (lifetime.c). */
	if ((rv = moat_lifetime_fill(gw->config, moat_gw_tenant(call),
	         &fwd.timeout_s, &fwd.idle_timeout_s, &msg)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s", msg);
		free(msg);
		return rv;
	}
	fwd.tenant = (char *)moat_gw_tenant(call);
	if ((rv = moat_gw_create(&c, &node, &out, &out_len, &sb, &msg)) !=
	    MOAT_OK)
		goto fail;
	if (moat_sandbox_id_set(&sandbox, sb->id)) {
		moat_forward_remember(&gw->fw, &sandbox, &node);
		moat_forward_set_tenant(&gw->fw, &sandbox, sb->tenant);
		moat_inventory_put(gw->inventory, &node, sb);
		moat_info(call->request_id, "sandbox %s placed on node %s",
		    sandbox.s, node.s);
	} else {
		moat_warn(call->request_id,
		    "node %s created a sandbox "
		    "without a usable id: calls cannot reach it",
		    node.s);
	}
	if (req->record) {
		if ((rv = record_new_sandbox(call, req, &node, &sb, &out,
		         &out_len, &msg)) != MOAT_OK)
			goto fail;
	}
	moat__v1__sandbox__free_unpacked(sb, NULL);
	call->raw_reply = out;
	call->raw_reply_len = out_len;
	return MOAT_OK;

fail:
	if (sb != NULL)
		moat__v1__sandbox__free_unpacked(sb, NULL);
	free(out);
	rv = moat_rpc_error(call, rv, "%s", msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

/* list_append: moves the sandboxes of `from` (a node's list, freed here)
 * to the end of r, remembering each one's route. */
static int
list_append(struct moat_gateway *gw, Moat__V1__SandboxList *r,
    Moat__V1__SandboxList *from, const struct moat_node_id *node)
{
	Moat__V1__Sandbox **grown;

	if (from->n_sandboxes == 0)
		goto out;
	grown = realloc(r->sandboxes,
	    (r->n_sandboxes + from->n_sandboxes) * sizeof(*grown));
	if (grown == NULL) {
		moat__v1__sandbox_list__free_unpacked(from, NULL);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	r->sandboxes = grown;
	for (size_t i = 0; i < from->n_sandboxes; i++) {
		struct moat_sandbox_id sandbox;

		char session_id[MOAT_ID_MAX];

		if (moat_sandbox_id_set(&sandbox, from->sandboxes[i]->id)) {
			moat_forward_remember(&gw->fw, &sandbox, node);
			moat_forward_set_tenant(&gw->fw, &sandbox,
			    from->sandboxes[i]->tenant);
		}
		if (moat_record_session_of(&gw->rec, from->sandboxes[i]->id,
		        session_id, sizeof(session_id)))
			(void)moat_sandbox_set_session(from->sandboxes[i],
			    session_id);
		r->sandboxes[r->n_sandboxes++] = from->sandboxes[i];
	}
	/* The array now lends its elements to r; free only the shell. */
	from->n_sandboxes = 0;
out:
	moat__v1__sandbox_list__free_unpacked(from, NULL);
	return MOAT_OK;
}

/* list_unavailable: appends to r the inventory's sandboxes of `tenant`
 * on nodes not in `answered`, state UNAVAILABLE, with their sessions. */
static int
list_unavailable(struct moat_gateway *gw, Moat__V1__SandboxList *r,
    const char *tenant, const struct moat_node_id *answered, size_t n_answered)
{
	Moat__V1__Sandbox **lost = NULL, **grown;
	size_t n_lost = 0;
	int rv;

	if ((rv = moat_inventory_unavailable(gw->inventory, tenant, answered,
	         n_answered, &lost, &n_lost)) != MOAT_OK ||
	    n_lost == 0)
		return rv;
	grown =
	    realloc(r->sandboxes, (r->n_sandboxes + n_lost) * sizeof(*grown));
	if (grown == NULL) {
		for (size_t i = 0; i < n_lost; i++)
			moat__v1__sandbox__free_unpacked(lost[i], NULL);
		free(lost);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	r->sandboxes = grown;
	for (size_t i = 0; i < n_lost; i++) {
		char session_id[MOAT_ID_MAX];

		if (moat_record_session_of(&gw->rec, lost[i]->id, session_id,
		        sizeof(session_id)))
			(void)moat_sandbox_set_session(lost[i], session_id);
		r->sandboxes[r->n_sandboxes++] = lost[i];
	}
	free(lost);
	return MOAT_OK;
}

/* One node's part of ListSandboxes, asked on its own thread. */
struct list_job {
	struct moat_gateway *gw;
	struct moat_node_id node;
	const uint8_t *payload;
	size_t len;
	uint64_t deadline;
	const char *tenant;
	pthread_t thread;
	bool started;
	int rv;
	Moat__V1__SandboxList *list;
	char *msg;
};

static void *
list_node(void *arg)
{
	struct list_job *j = arg;
	uint8_t *out = NULL;
	size_t out_len = 0;
	char what[MOAT_ID_MAX + 32];

	snprintf(what, sizeof(what), "the sandboxes of node %s", j->node.s);
	j->rv = moat_forward_to_node(&j->gw->fw, &j->node, j->tenant,
	    "ListSandboxes", j->payload, j->len, moat_rpc_new_request_id(),
	    j->deadline, what, &out, &out_len, &j->msg);
	if (j->rv == MOAT_OK &&
	    (j->list = moat__v1__sandbox_list__unpack(NULL, out_len, out)) ==
	        NULL) {
		j->rv = MOAT_INTERNAL;
		j->msg = moat_asprintf("node %s answered ListSandboxes with "
		                       "something that is not a SandboxList",
		    j->node.s);
	}
	free(out);
	return NULL;
}

/* list_nodes: asks every node of jobs at once, each within
 * LIST_TIMEOUT_MS (a node that died but is not yet marked unavailable
 * delays the answer by that at most, not by that per node). */
static void
list_nodes(struct list_job *jobs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		jobs[i].started = pthread_create(&jobs[i].thread, NULL,
		                      list_node, &jobs[i]) == 0;
	for (size_t i = 0; i < n; i++) {
		if (jobs[i].started)
			pthread_join(jobs[i].thread, NULL);
		else
			list_node(&jobs[i]);
	}
}

static int
h_list_sandboxes(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	Moat__V1__SandboxList *r = (Moat__V1__SandboxList *)reply;
	Moat__V1__ListSandboxesRequest fwd =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	struct moat_node_id *ids = NULL, *answered = NULL;
	struct list_job *jobs = NULL;
	size_t n = 0, failed = 0, len, n_answered = 0;
	uint8_t *payload = NULL;
	char *first_error = NULL;
	int rv = MOAT_OK, first_rv = MOAT_OK;
	uint64_t deadline = moat_rpc_now_ms() + LIST_TIMEOUT_MS;

	(void)request;
	if (deadline > call->deadline_ms)
		deadline = call->deadline_ms;
	fwd.tenant = (char *)moat_gw_tenant(call);
	len = moat__v1__list_sandboxes_request__get_packed_size(&fwd);
	if (moat_nodes_available_ids(&gw->nodes, &ids, &n) != MOAT_OK ||
	    (answered = calloc(n + 1, sizeof(*answered))) == NULL ||
	    (jobs = calloc(n + 1, sizeof(*jobs))) == NULL ||
	    (payload = malloc(len ? len : 1)) == NULL) {
		free(ids);
		free(answered);
		free(jobs);
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	}
	moat__v1__list_sandboxes_request__pack(&fwd, payload);
	for (size_t i = 0; i < n; i++)
		jobs[i] = (struct list_job){ .gw = gw,
			.node = ids[i],
			.payload = payload,
			.len = len,
			.deadline = deadline,
			.tenant = fwd.tenant };
	list_nodes(jobs, n);
	for (size_t i = 0; i < n; i++) {
		struct list_job *j = &jobs[i];

		if (j->rv == MOAT_OK && rv == MOAT_OK) {
			rv = list_append(gw, r, j->list, &j->node);
			j->list = NULL;
			if (rv == MOAT_OK)
				answered[n_answered++] = j->node;
			continue;
		}
		if (j->list != NULL)
			moat__v1__sandbox_list__free_unpacked(j->list, NULL);
		if (j->rv == MOAT_OK) {
			free(j->msg);
			continue;
		}
		/* One node down must not hide the others' sandboxes; the
		 * failure is logged, and only when every node fails (and
		 * nothing is known of them) is the call an error. */
		failed++;
		moat_warn(call->request_id, "ListSandboxes: node %s: %s: %s",
		    j->node.s, moat_strerror(j->rv), j->msg ? j->msg : "");
		if (first_error == NULL) {
			first_error = j->msg;
			first_rv = j->rv;
		} else {
			free(j->msg);
		}
	}
	free(payload);
	free(ids);
	free(jobs);
	/* The nodes that did not answer: their last known sandboxes, shown
	 * UNAVAILABLE rather than silently missing. */
	if (rv == MOAT_OK)
		rv = list_unavailable(gw, r, fwd.tenant, answered, n_answered);
	free(answered);
	if (rv != MOAT_OK) {
		free(first_error);
		return moat_rpc_error(call, rv, "out of memory");
	}
	if (n > 0 && failed == n && r->n_sandboxes == 0) {
		rv = moat_rpc_error(call, first_rv, "%s", first_error);
		free(first_error);
		return rv;
	}
	free(first_error);
	return MOAT_OK;
}

/* request_sandbox_id: the sandbox_id field of any request on one
 * sandbox; NULL (after moat_rpc_error) when the method table names a
 * request without one. */
static const char *
request_sandbox_id(struct moat_rpc_call *call, const ProtobufCMessage *request)
{
	const ProtobufCFieldDescriptor *f;

	f = protobuf_c_message_descriptor_get_field_by_name(
	    request->descriptor, "sandbox_id");
	if (f == NULL || f->type != PROTOBUF_C_TYPE_STRING ||
	    f->label == PROTOBUF_C_LABEL_REPEATED) {
		(void)moat_rpc_error(call, MOAT_INTERNAL,
		    "%s has no "
		    "sandbox_id field: the gateway's method table is wrong",
		    request->descriptor->name);
		return NULL;
	}
	return *(char *const *)((const char *)request + f->offset);
}

/* h_sandbox: every call on one sandbox. The rpc layer decoded the
 * request; only its sandbox_id is read, and the original bytes go on. */
static int
h_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const char *sandbox_id = request_sandbox_id(call, request);

	(void)reply;
	if (sandbox_id == NULL)
		return MOAT_INTERNAL;
	return moat_forward_call(&gw->fw, call, sandbox_id, call->payload,
	    call->payload_len);
}

/* h_exec_start: ExecStart; on a recorded sandbox the command is also
 * followed and recorded as one step when it ends (record_follow.c), a
 * terminal session (pty) as a shell step. */
static int
h_exec_start(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const Moat__V1__ExecRequest *req =
	    (const Moat__V1__ExecRequest *)request;
	Moat__V1__ExecHandle *h;
	char session_id[MOAT_ID_MAX];
	int rv = h_sandbox(call, request, reply);

	if (rv != MOAT_OK ||
	    !moat_record_session_lookup(&gw->rec, moat_gw_tenant(call),
	        req->sandbox_id, call->request_id, session_id,
	        sizeof(session_id)))
		return rv;
	h = moat__v1__exec_handle__unpack(NULL, call->raw_reply_len,
	    call->raw_reply);
	if (h != NULL)
		moat_record_follow(&gw->rec, moat_gw_tenant(call), call,
		    h->exec_id);
	moat__v1__exec_handle__free_unpacked(h, NULL);
	return rv;
}

/* h_exec_resize: ExecResize, also a resize event of a recorded terminal
 * session. */
static int
h_exec_resize(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	int rv = h_sandbox(call, request, reply);

	if (rv == MOAT_OK)
		moat_record_shell_resize(
		    (const Moat__V1__ExecResizeRequest *)request);
	return rv;
}

/* h_sandbox_wait: a call on one sandbox that may wait long (ExecWait,
 * ExecRead's long poll): forwarded without holding a worker. */
static int
h_sandbox_wait(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const char *sandbox_id = request_sandbox_id(call, request);

	if (sandbox_id == NULL)
		return MOAT_INTERNAL;
	return moat_forward_call_async(&gw->fw, call, sandbox_id,
	    call->payload, call->payload_len, reply->descriptor, NULL);
}

/* h_exec_stream: ExecStream over nng, which has no streams: the doors
 * that stream (gRPC, Connect, gRPC-Web) compose it from ExecStart and
 * ExecRead themselves and never call this. */
static int
h_exec_stream(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	(void)request;
	(void)reply;
	return moat_rpc_error(call, MOAT_UNIMPLEMENTED,
	    "ExecStream is a streaming call, which nng cannot carry: "
	    "call it through the gRPC or Connect door, or use ExecStart, "
	    "then ExecRead until eof");
}

/* h_attach: Attach over nng, which has no streams: the gRPC door
 * composes it from ExecStart, ExecWrite, ExecResize and ExecRead and
 * never calls this. */
static int
h_attach(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	(void)request;
	(void)reply;
	return moat_rpc_error(call, MOAT_UNIMPLEMENTED,
	    "Attach is a bidirectional stream, which nng cannot carry: "
	    "call it through the gRPC door, or use ExecStart (stdin_open, "
	    "pty), then ExecWrite and ExecResize for input and ExecRead "
	    "until eof for output");
}

/* ---- recorded sandboxes (record.c) ---- */

/* get_unavailable: GetSandbox of a sandbox whose node does not answer:
 * the inventory's last word on it, state UNAVAILABLE, as the reply. Else
 * the UNAVAILABLE already set stays. */
static int
get_unavailable(struct moat_gateway *gw, struct moat_rpc_call *call,
    const char *sandbox_id)
{
	Moat__V1__Sandbox *sb = NULL;
	struct moat_node_id node;
	int rv;

	if (!moat_inventory_find(gw->inventory, sandbox_id, &node, &sb) ||
	    sb == NULL || moat_nodes_is_available(&gw->nodes, &node) ||
	    strcmp(sb->tenant, moat_gw_tenant(call)) != 0) {
		if (sb != NULL)
			moat__v1__sandbox__free_unpacked(sb, NULL);
		return MOAT_UNAVAILABLE;
	}
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNAVAILABLE;
	rv = repack_sandbox(sb, &call->raw_reply, &call->raw_reply_len);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	if (rv != MOAT_OK)
		return MOAT_UNAVAILABLE;
	free(call->error_message);
	call->error_message = NULL;
	return MOAT_OK;
}

static int
h_get_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const Moat__V1__SandboxRef *req =
	    (const Moat__V1__SandboxRef *)request;
	char session_id[MOAT_ID_MAX];
	Moat__V1__Sandbox *sb;
	int rv;

	rv = moat_forward_call(&gw->fw, call, req->sandbox_id, call->payload,
	    call->payload_len);
	if (rv == MOAT_UNAVAILABLE)
		rv = get_unavailable(gw, call, req->sandbox_id);
	if (rv != MOAT_OK ||
	    !moat_record_session_lookup(&gw->rec, moat_gw_tenant(call),
	        req->sandbox_id, call->request_id, session_id,
	        sizeof(session_id)))
		return rv;
	sb = moat__v1__sandbox__unpack(NULL, call->raw_reply_len,
	    call->raw_reply);
	if (sb == NULL)
		return MOAT_OK; /* passed on as the node said it */
	if (moat_sandbox_set_session(sb, session_id))
		(void)repack_sandbox(sb, &call->raw_reply,
		    &call->raw_reply_len);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	return MOAT_OK;
}

static int
h_destroy_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const Moat__V1__SandboxRef *req =
	    (const Moat__V1__SandboxRef *)request;
	int rv;

	rv = moat_forward_call(&gw->fw, call, req->sandbox_id, call->payload,
	    call->payload_len);
	if (rv == MOAT_OK || rv == MOAT_NOT_FOUND)
		moat_record_forget(&gw->rec, req->sandbox_id);
	if (rv == MOAT_OK)
		moat_quota_destroyed(gw->adm, moat_gw_tenant(call),
		    req->sandbox_id);
	return rv;
}

static const char *command_of(const ProtobufCMessage *request,
    const char **language, char **joined);

/* forward_long: the forward of a call that may run for long (Exec,
 * RunCode): deferred, so no gateway worker waits for the node; the
 * reply carries the command's safety level as gate() would set it. */
static int
forward_long(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply, const char *sandbox_id)
{
	struct moat_gateway *gw = call->service_ctx;
	const char *command, *language, *safety = NULL;
	char *joined = NULL;
	int rv;

	command = command_of(request, &language, &joined);
	if (command != NULL)
		safety = moat_safety_level_name(
		    moat_safety_classify(command, language).level);
	rv = moat_forward_call_async(&gw->fw, call, sandbox_id, call->payload,
	    call->payload_len, reply->descriptor, safety);
	free(joined);
	return rv;
}

/* h_step: Exec and RunCode; a recorded sandbox's command is a step of its
 * recording (moat_record_step_async), any other is forwarded; neither
 * holds a worker while the node runs it. */
static int
h_step(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const char *sandbox_id = request_sandbox_id(call, request);
	const char *command, *language, *safety = NULL;
	char session_id[MOAT_ID_MAX], *joined = NULL;
	bool handled = false;
	int rv;

	if (sandbox_id == NULL)
		return MOAT_INTERNAL;
	if (!moat_record_session_lookup(&gw->rec, moat_gw_tenant(call),
	        sandbox_id, call->request_id, session_id, sizeof(session_id)))
		return forward_long(call, request, reply, sandbox_id);
	command = command_of(request, &language, &joined);
	if (command != NULL)
		safety = moat_safety_level_name(
		    moat_safety_classify(command, language).level);
	rv = moat_record_step_async(&gw->rec, call, request, sandbox_id,
	    moat_gw_tenant(call), reply->descriptor, safety, &handled);
	free(joined);
	if (!handled) /* no longer recorded */
		rv = forward_long(call, request, reply, sandbox_id);
	return rv;
}

static int
h_session(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;

	return moat_record_session_call(&gw->rec, call, request,
	    moat_gw_tenant(call));
}

/* ---- local snapshots (issue 3) ---- */

/* Sends `msg` (re-encoded, with the gateway's tenant already set) as
 * `method` to the node holding `snap_id`, and sets the raw reply. When
 * `remember` the reply is a Sandbox whose route is kept. */
static int
snapshot_forward(struct moat_rpc_call *call, const char *snap_id,
    const ProtobufCMessage *msg, bool remember)
{
	struct moat_gateway *gw = call->service_ctx;
	struct moat_node_id node;
	uint8_t *payload = NULL, *out = NULL;
	size_t len, out_len = 0;
	char *err = NULL, what[MOAT_ID_MAX + 16];
	int rv;

	if (snap_id == NULL || snap_id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%s: "
		    "snapshot_id is required: ListLocalSnapshots lists them",
		    call->method);
	if (!moat_snapshot_node(snap_id, &node))
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "snapshot %.80s "
		    "not found: it is not a snapshot id (\"snap-<node>-...\")",
		    snap_id);
	len = protobuf_c_message_get_packed_size(msg);
	if ((payload = malloc(len ? len : 1)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	protobuf_c_message_pack(msg, payload);
	snprintf(what, sizeof(what), "snapshot %.100s", snap_id);
	rv = moat_forward_to_node(&gw->fw, &node, moat_gw_tenant(call),
	    call->method, payload, len, call->request_id, call->deadline_ms,
	    what, &out, &out_len, &err);
	free(payload);
	if (rv != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s",
		    err ? err : moat_strerror(rv));
		free(err);
		return rv;
	}
	if (remember) {
		Moat__V1__Sandbox *sb =
		    moat__v1__sandbox__unpack(NULL, out_len, out);
		struct moat_sandbox_id sandbox;

		if (sb != NULL && moat_sandbox_id_set(&sandbox, sb->id))
			moat_forward_remember(&gw->fw, &sandbox, &node);
		if (sb != NULL)
			moat__v1__sandbox__free_unpacked(sb, NULL);
	}
	call->raw_reply = out;
	call->raw_reply_len = out_len;
	return MOAT_OK;
}

static int
h_delete_local_snapshot(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	Moat__V1__LocalSnapshotRef fwd =
	    *(const Moat__V1__LocalSnapshotRef *)request;
	char remote[MOAT_ID_MAX] = "";
	struct moat_node_id owner;
	int rv;

	fwd.tenant = (char *)moat_gw_tenant(call);
	/* Copies other nodes pulled of it from snapd go with it. */
	if (!fwd.keep_remote && fwd.snapshot_id != NULL &&
	    moat_snapshot_node(fwd.snapshot_id, &owner))
		(void)moat_snapshots_remote_of(&gw->fw, &owner, fwd.tenant,
		    fwd.snapshot_id, call->deadline_ms, remote,
		    sizeof(remote));
	rv = snapshot_forward(call, fwd.snapshot_id, &fwd.base, false);
	if (rv == MOAT_OK && remote[0] != '\0')
		moat_snapshots_drop_pulled(&gw->fw, fwd.tenant, remote, &owner,
		    call->deadline_ms);
	return rv;
}

/* Every node's snapshots of the tenant; a node that does not answer is
 * logged and skipped, unless none answers. */
static int
h_list_local_snapshots(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	Moat__V1__LocalSnapshotList *r = (Moat__V1__LocalSnapshotList *)reply;
	struct moat_node_id *ids = NULL;
	size_t n = 0, failed = 0;
	int rv = MOAT_OK;

	if (moat_nodes_available_ids(&gw->nodes, &ids, &n) != MOAT_OK)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	for (size_t i = 0; i < n && rv == MOAT_OK; i++) {
		Moat__V1__LocalSnapshotList *list = NULL;
		Moat__V1__LocalSnapshot **grown;
		char *msg = NULL;

		if (moat_snapshots_node_list(&gw->fw, &ids[i],
		        moat_gw_tenant(call), call->deadline_ms, &list,
		        &msg) != MOAT_OK) {
			failed++;
			moat_warn(call->request_id,
			    "ListLocalSnapshots: node "
			    "%s: %s",
			    ids[i].s, msg ? msg : "not a list");
			free(msg);
			continue;
		}
		grown = list->n_snapshots == 0 ?
		    r->snapshots :
		    realloc(r->snapshots,
		        (r->n_snapshots + list->n_snapshots) * sizeof(*grown));
		if (list->n_snapshots > 0 && grown == NULL) {
			rv = MOAT_RESOURCE_EXHAUSTED;
		} else {
			r->snapshots = grown;
			for (size_t j = 0; j < list->n_snapshots; j++)
				r->snapshots[r->n_snapshots++] =
				    list->snapshots[j];
			list->n_snapshots = 0; /* lent to r */
		}
		moat__v1__local_snapshot_list__free_unpacked(list, NULL);
	}
	free(ids);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	if (n > 0 && failed == n)
		return moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "no node answered ListLocalSnapshots: see the gateway "
		    "log");
	return MOAT_OK;
}

/* ---- diff and compare (diff.c) ---- */

static int
h_diff(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;

	return moat_diff_handle(&gw->rec, call, request, reply,
	    moat_gw_tenant(call));
}

static int
h_compare(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;

	return moat_compare_handle(&gw->rec, call, request, reply,
	    moat_gw_tenant(call));
}

/* ---- audit (auth.c keeps it) ---- */

static char *
entry_string(json_t *e, const char *key)
{
	const char *v = json_string_value(json_object_get(e, key));

	return strdup(v != NULL ? v : "");
}

static int
h_list_audit(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_gateway *gw = call->service_ctx;
	const Moat__V1__ListAuditRequest *req =
	    (const Moat__V1__ListAuditRequest *)request;
	Moat__V1__ListAuditReply *r = (Moat__V1__ListAuditReply *)reply;
	json_t *list = NULL, *e;
	char *msg = NULL;
	size_t i;
	int rv;

	if (gw->auth == NULL)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "this "
		    "gateway keeps no audit log (it has no state directory)");
	if ((rv = moat_auth_audit_list(gw->auth, moat_gw_tenant(call),
	         req->limit == 0 ? 100 : req->limit, &list, &msg)) !=
	    MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s", msg ? msg : "");
		free(msg);
		return rv;
	}
	if (json_array_size(list) > 0 &&
	    (r->entries = calloc(json_array_size(list),
	         sizeof(*r->entries))) == NULL)
		goto fail_oom;
	json_array_foreach (list, i, e) {
		Moat__V1__AuditEntry *a = malloc(sizeof(*a));

		if (a == NULL)
			goto fail_oom;
		moat__v1__audit_entry__init(a);
		r->entries[r->n_entries++] = a;
		a->at_unix_ms = (uint64_t)json_integer_value(
		    json_object_get(e, "at_unix_ms"));
		if ((a->key_id = entry_string(e, "key_id")) == NULL ||
		    (a->method = entry_string(e, "method")) == NULL ||
		    (a->sandbox_id = entry_string(e, "sandbox_id")) == NULL ||
		    (a->session_id = entry_string(e, "session_id")) == NULL ||
		    (a->command = entry_string(e, "command")) == NULL ||
		    (a->safety = entry_string(e, "safety")) == NULL ||
		    (a->code = entry_string(e, "code")) == NULL ||
		    (a->request_id = entry_string(e, "request_id")) == NULL)
			goto fail_oom;
	}
	json_decref(list);
	return MOAT_OK;

fail_oom:
	json_decref(list);
	return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
	    "out of memory "
	    "listing the audit log");
}

/* The Gateway service. Mutating calls are deduplicated by request id here
 * and, because the id travels with the forward, on the node as well;
 * they are also the calls the audit log keeps. needs_auth: the caller's
 * API key is checked (when auth is on) by gate() before the handler. */
static const struct moat_rpc_method gateway_methods[] = {
	{ "Health", h_health, false, false },
	{ "Info", h_info, false, true },
	{ "ListNodes", h_list_nodes, false, true },
	{ "CreateSandbox", h_create_sandbox, true, true },
	{ "GetSandbox", h_get_sandbox, false, true },
	{ "ListSandboxes", h_list_sandboxes, false, true },
	{ "DestroySandbox", h_destroy_sandbox, true, true },
	{ "ExecStart", h_exec_start, true, true },
	{ "ExecRead", h_sandbox_wait, false, true },
	{ "ExecWrite", h_sandbox, true, true },
	{ "ExecResize", h_exec_resize, true, true },
	{ "ExecWait", h_sandbox_wait, false, true },
	{ "ExecKill", h_sandbox, true, true },
	{ "Exec", h_step, true, true },
	{ "ExecStream", h_exec_stream, false, true },
	{ "Attach", h_attach, false, true },
	{ "ReadFile", h_sandbox, false, true },
	{ "WriteFile", h_sandbox, true, true },
	{ "ListFiles", h_sandbox, false, true },
	{ "StatFile", h_sandbox, false, true },
	{ "RemoveFile", h_sandbox, true, true },
	{ "MakeDir", h_sandbox, true, true },
	{ "PutArchive", h_sandbox, true, true },
	{ "GetArchive", h_sandbox, false, true },
	{ "SandboxInfo", h_sandbox, false, true },
	{ "TraceFs", h_sandbox, false, true },
	{ "SnapshotSandbox", moat_travel_snapshot_sandbox, true, true },
	{ "RestoreSandbox", moat_travel_restore_sandbox, true, true },
	{ "ListLocalSnapshots", h_list_local_snapshots, false, true },
	{ "DeleteLocalSnapshot", h_delete_local_snapshot, true, true },
	{ "ListSessions", h_session, false, true },
	{ "GetSession", h_session, false, true },
	{ "ListSteps", h_session, false, true },
	{ "GetStep", h_session, false, true },
	{ "GetSessionTree", h_session, false, true },
	{ "ExportSession", h_session, false, true },
	{ "DeleteSession", moat_snapshots_delete_session, true, true },
	{ "RestoreStep", moat_travel_restore_step, true, true },
	{ "Fork", moat_travel_fork, true, true },
	{ "Replay", moat_travel_replay, true, true },
	{ "Diff", h_diff, false, true },
	{ "Compare", h_compare, false, true },
	{ "RunCode", h_step, true, true },
	{ "CloseCodeContext", moat_travel_close_code_context, true, true },
	{ "ListAudit", h_list_audit, false, true },
	{ "SetStepKeep", h_session, true, true },
	{ "GcSnapshots", moat_snapshots_gc, true, true },
	{ "CordonNode", moat_drain_cordon_node, true, true },
	{ "DrainNode", moat_drain_node, true, true },
	{ "SetTimeout", moat_lifetime_set_timeout, true, true },
	{ "StartImageBuild", moat_images_start_build, true, true },
	{ "GetImageBuild", moat_images_get_build, false, true },
	{ "ListImages", moat_images_list, false, true },
	{ "PushImage", moat_images_push, true, true },
	{ "RemoveImage", moat_images_remove, true, true },
};

/* ---- the gate: auth, tenant, policy, audit, metrics (one place) ---- */

#define N_METHODS (sizeof(gateway_methods) / sizeof(gateway_methods[0]))
#define N_CODES 17
#define N_BUCKETS 8
static const double latency_bounds_s[N_BUCKETS] = {
	0.005,
	0.025,
	0.1,
	0.5,
	1,
	5,
	30,
	120,
};

/* The gateway's metrics, for /metrics, in a registry of lib/metrics
 * (moat/metrics.h) like every service's. A method's series are made on
 * its first call (only methods called show); the pointers are written
 * once, atomically (a race makes the same series twice: the registry
 * returns the one it has). */
struct gw_metrics {
	struct moat_metrics *reg;
	struct moat_counter *calls[N_METHODS][N_CODES];
	struct moat_histogram *latency[N_METHODS];
};

const char *
moat_gw_tenant(const struct moat_rpc_call *call)
{
	return call->principal != NULL ? call->principal :
	                                 MOAT_GW_DEFAULT_TENANT;
}

int
moat_gateway_check_key(struct moat_gateway *gw, const char *key, char *key_id,
    char *tenant)
{
	char own[MOAT_AUTH_TENANT_MAX];
	int rv;

	if (tenant == NULL)
		tenant = own;
	key_id[0] = '\0';
	snprintf(tenant, MOAT_AUTH_TENANT_MAX, "%s", MOAT_GW_DEFAULT_TENANT);
	if (!gw->auth_on)
		return MOAT_OK;
	rv = moat_auth_key_verify(gw->auth, key ? key : "", tenant,
	    MOAT_AUTH_TENANT_MAX, key_id);
	return rv == MOAT_OK || rv == MOAT_UNAUTHENTICATED ||
	        rv == MOAT_UNAVAILABLE ?
	    rv :
	    MOAT_INTERNAL;
}

/* request_string: the string field `name` of `request`, or NULL. */
static const char *
request_string(const ProtobufCMessage *request, const char *name)
{
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(
	        request->descriptor, name);

	if (f == NULL || f->type != PROTOBUF_C_TYPE_STRING ||
	    f->label == PROTOBUF_C_LABEL_REPEATED)
		return NULL;
	return *(char *const *)((const char *)request + f->offset);
}

const char *
moat_gw_message_tenant(const ProtobufCMessage *msg)
{
	return request_string(msg, "tenant");
}

/* command_of: the command text of an Exec, ExecStart or RunCode request
 * and its language; NULL for other calls. *joined (heap, caller frees)
 * holds an argv joined by spaces. */
static const char *
command_of(const ProtobufCMessage *request, const char **language,
    char **joined)
{
	*joined = NULL;
	*language = NULL;
	if (request->descriptor == &moat__v1__exec_request__descriptor) {
		const Moat__V1__ExecRequest *r =
		    (const Moat__V1__ExecRequest *)request;
		size_t len = 1;

		if (r->shell != NULL && r->shell[0] != '\0')
			return r->shell;
		if (r->code != NULL && r->code[0] != '\0') {
			*language = r->language;
			return r->code;
		}
		for (size_t i = 0; i < r->n_argv; i++)
			len += strlen(r->argv[i]) + 1;
		if ((*joined = calloc(1, len)) == NULL)
			return NULL;
		for (size_t i = 0; i < r->n_argv; i++) {
			if (i > 0)
				strcat(*joined, " ");
			strcat(*joined, r->argv[i]);
		}
		return *joined;
	}
	if (request->descriptor == &moat__v1__run_code_request__descriptor) {
		const Moat__V1__RunCodeRequest *r =
		    (const Moat__V1__RunCodeRequest *)request;

		*language = r->language != NULL && r->language[0] != '\0' ?
		    r->language :
		    "python";
		return r->code;
	}
	return NULL;
}

/* set_string_field: sets string field `f` of message `m` to a copy of
 * `value`. */
static void
set_string_field(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
    const char *value)
{
	char **slot = (char **)((char *)m + f->offset), *copy;

	if ((copy = strdup(value)) != NULL) {
		if (*slot != NULL && *slot != protobuf_c_empty_string &&
		    *slot != f->default_value)
			free(*slot);
		*slot = copy;
	}
}

void
moat_gw_set_safety_raw(const ProtobufCMessageDescriptor *desc, uint8_t **raw,
    size_t *len, const char *level)
{
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(desc, "safety");
	ProtobufCMessage *m;
	size_t n;
	uint8_t *p;

	if (f == NULL || f->type != PROTOBUF_C_TYPE_STRING ||
	    (m = protobuf_c_message_unpack(desc, NULL, *len, *raw)) == NULL)
		return;
	set_string_field(m, f, level);
	n = protobuf_c_message_get_packed_size(m);
	if ((p = malloc(n ? n : 1)) != NULL) {
		protobuf_c_message_pack(m, p);
		free(*raw);
		*raw = p;
		*len = n;
	}
	protobuf_c_message_free_unpacked(m, NULL);
}

/* set_safety: puts `level` in the reply's `safety` field, whether the
 * handler filled `reply` or left an encoded raw reply. */
static void
set_safety(struct moat_rpc_call *call, ProtobufCMessage *reply,
    const char *level)
{
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(reply->descriptor,
	        "safety");

	if (f == NULL || f->type != PROTOBUF_C_TYPE_STRING)
		return;
	if (call->raw_reply != NULL)
		moat_gw_set_safety_raw(reply->descriptor, &call->raw_reply,
		    &call->raw_reply_len, level);
	else
		set_string_field(reply, f, level);
}

/* audit_entry: the audit record of `call` without its code (NULL when
 * out of memory); the caller owns the reference. */
static json_t *
audit_entry(struct moat_rpc_call *call, const ProtobufCMessage *request,
    const char *key_id, const char *command, const char *safety)
{
	const char *sandbox = request_string(request, "sandbox_id");
	const char *session = request_string(request, "session_id");
	char rid[17];
	json_t *e;

	snprintf(rid, sizeof(rid), "%016llx",
	    (unsigned long long)call->request_id);
	e = json_pack("{s:s, s:s, s:s}", "key_id", key_id, "method",
	    call->method, "request_id", rid);
	if (e == NULL)
		return NULL;
	if (sandbox != NULL && sandbox[0] != '\0')
		json_object_set_new(e, "sandbox_id", json_string(sandbox));
	if (session != NULL && session[0] != '\0')
		json_object_set_new(e, "session_id", json_string(session));
	if (command != NULL)
		json_object_set_new(e, "command", json_string(command));
	if (safety != NULL)
		json_object_set_new(e, "safety", json_string(safety));
	return e;
}

/* audit_append: records entry `e` (NULL: out of memory; its reference
 * is taken) with code `rv` for `tenant`. */
static void
audit_append(struct moat_gateway *gw, json_t *e, const char *tenant,
    const char *method, uint64_t request_id, int rv)
{
	char *msg = NULL;

	if (e == NULL ||
	    json_object_set_new(e, "code", json_string(moat_strerror(rv))) !=
	        0)
		goto fail;
	/* Queued for auth.c's writer thread: no disk wait in a handler. */
	if (moat_auth_audit_append(gw->auth, tenant, e, &msg) != MOAT_OK)
		goto fail;
	json_decref(e);
	return;
fail:
	moat_warn(request_id, "audit: %s %s not logged: %s", tenant, method,
	    msg ? msg : "out of memory");
	json_decref(e);
	free(msg);
}

static void
audit(struct moat_gateway *gw, struct moat_rpc_call *call,
    const ProtobufCMessage *request, const char *key_id, const char *command,
    const char *safety, int rv)
{
	if (gw->auth == NULL)
		return;
	audit_append(gw, audit_entry(call, request, key_id, command, safety),
	    moat_gw_tenant(call), call->method, call->request_id, rv);
}

static void
count_call(struct moat_gateway *gw, size_t row, int code, uint64_t ms)
{
	struct gw_metrics *m = gw->metrics;
	struct moat_counter *c;
	struct moat_histogram *h;

	if (m == NULL)
		return;
	code = code >= 0 && code < N_CODES ? code : MOAT_UNKNOWN;
	if ((c = __atomic_load_n(&m->calls[row][code], __ATOMIC_ACQUIRE)) ==
	    NULL) {
		const char *labels[] = { "method", gateway_methods[row].name,
			"code", moat_strerror(code), NULL };

		c = moat_metrics_counter(m->reg, "moat_gateway_calls_total",
		    "Gateway calls (nng and HTTP) by method and code.",
		    labels);
		__atomic_store_n(&m->calls[row][code], c, __ATOMIC_RELEASE);
	}
	if ((h = __atomic_load_n(&m->latency[row], __ATOMIC_ACQUIRE)) ==
	    NULL) {
		const char *labels[] = { "method", gateway_methods[row].name,
			NULL };

		h = moat_metrics_histogram(m->reg, "moat_gateway_call_seconds",
		    "Gateway call latency by method.", labels,
		    latency_bounds_s, N_BUCKETS);
		__atomic_store_n(&m->latency[row], h, __ATOMIC_RELEASE);
	}
	moat_counter_inc(c);
	moat_histogram_observe_ms(h, ms);
}

/* What gate() still owes a call whose reply was deferred (Exec and
 * RunCode forwarded without holding a worker): its audit record and
 * its count, with the code it is completed with. */
struct gate_later {
	struct moat_gateway *gw;
	size_t row;
	uint64_t started;
	uint64_t request_id;
	const char *method; /* the table's: static */
	json_t *audit;      /* NULL: not audited */
	char tenant[MOAT_AUTH_TENANT_MAX];
};

static void
gate_later_done(void *arg, int code)
{
	struct gate_later *g = arg;

	if (g->audit != NULL)
		audit_append(g->gw, g->audit, g->tenant, g->method,
		    g->request_id, code);
	count_call(g->gw, g->row, code, moat_rpc_now_ms() - g->started);
	free(g);
}

/* gate_defer: hands gate()'s audit and count of a deferred call to its
 * completion. False when out of memory (gate then does them now). */
static bool
gate_defer(struct moat_gateway *gw, struct moat_rpc_call *call, size_t row,
    uint64_t started, json_t *audit_e)
{
	struct gate_later *g = calloc(1, sizeof(*g));

	if (g == NULL)
		return false;
	g->gw = gw;
	g->row = row;
	g->started = started;
	g->request_id = call->request_id;
	g->method = gateway_methods[row].name;
	g->audit = audit_e;
	snprintf(g->tenant, sizeof(g->tenant), "%s", moat_gw_tenant(call));
	moat_rpc_deferred_on_complete(call->deferred, gate_later_done, g);
	return true;
}

/* method_row: the gateway table's row of `method`, or N_METHODS. */
static size_t
method_row(const char *method)
{
	size_t i;

	for (i = 0; i < N_METHODS; i++)
		if (strcmp(gateway_methods[i].name, method) == 0)
			break;
	return i;
}

/* check_owner: NOT_FOUND (worded as for a missing sandbox) when the
 * request names a sandbox that is not the caller's tenant's. */
static int
check_owner(struct moat_gateway *gw, struct moat_rpc_call *call,
    const ProtobufCMessage *request)
{
	const char *sandbox = request_string(request, "sandbox_id");
	char *msg = NULL;
	int rv;

	if (!gw->auth_on || sandbox == NULL || sandbox[0] == '\0')
		return MOAT_OK;
	rv = moat_forward_check_owner(&gw->fw, sandbox, moat_gw_tenant(call),
	    call->deadline_ms, &msg);
	if (rv != MOAT_OK)
		rv = moat_rpc_error(call, rv, "%s",
		    msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

/* owned_run: check_owner, then the method's handler. A call that carries
 * a request id runs this under its idempotency claim, so a retry of a
 * DestroySandbox on another gateway replays the first result (OK) rather
 * than finding the sandbox gone. */
static int
owned_run(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	size_t i = method_row(call->method);
	int rv = check_owner(call->service_ctx, call, request);

	if (rv != MOAT_OK)
		return rv;
	return gateway_methods[i].handler(call, request, reply);
}

/* gate: every Gateway call of both doors runs through here: the API key
 * gives the tenant (call->principal), a sandbox of another tenant is
 * NOT_FOUND, commands the tenant's policy refuses never reach the
 * sandbox, then the handler runs; mutating and refused calls are
 * audited, and every call counted. */
static int
gate_door(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply, bool take_key)
{
	struct moat_gateway *gw = call->service_ctx;
	const struct moat_rpc_method *row = NULL;
	char tenant[MOAT_AUTH_TENANT_MAX] = MOAT_GW_DEFAULT_TENANT;
	char key_id[MOAT_AUTH_KEY_ID_LEN + 1] = "";
	char *msg = NULL, *joined = NULL;
	const char *command = NULL, *language, *safety = NULL;
	struct moat_safety_verdict v;
	uint64_t started = moat_rpc_now_ms();
	bool audited = false, claimed;
	size_t i = method_row(call->method);
	int rv;

	if (i < N_METHODS)
		row = &gateway_methods[i];
	if (row == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL,
		    "%s has no row in "
		    "the gateway's method table",
		    call->method);
	if (gw->auth_on && row->needs_auth) {
		rv = moat_auth_key_verify(gw->auth, call->auth, tenant,
		    sizeof(tenant), key_id);
		if (rv == MOAT_UNAUTHENTICATED) {
			rv = moat_rpc_error(call, rv, "%s",
			    MOAT_AUTH_UNAUTHENTICATED_MSG);
			goto done;
		}
		if (rv == MOAT_UNAVAILABLE) {
			rv = moat_rpc_error(call, rv,
			    "cannot verify the API key: moat-sessiond (the "
			    "key store) at %s did not answer; retry",
			    gw->sessiond_url);
			goto done;
		}
		if (rv != MOAT_OK) {
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "the gateway's "
			    "key store failed: see the gateway log");
			goto done;
		}
	}
	call->principal = tenant;
	if (take_key &&
	    !moat_admission_key(gw->adm, tenant, key_id, NULL,
	        &(uint32_t){ 0 }, &msg)) {
		rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED, "%s", msg);
		goto done;
	}
	audited = row->mutating;
	/* Another tenant's sandbox does not exist, as far as this caller can
	 * tell; a call with a request id is checked under its claim. */
	claimed = call->request_id != 0 && moat_idem_method(call->method);
	if (!claimed && (rv = check_owner(gw, call, request)) != MOAT_OK)
		goto done;
	command = command_of(request, &language, &joined);
	if (command != NULL) {
		v = moat_safety_classify(command, language);
		safety = moat_safety_level_name(v.level);
		if (moat_policy_refuses(gw->config, tenant, v.level)) {
			audited = true;
			moat_info(call->request_id,
			    "policy: tenant %s: %s "
			    "refused: %s (%s)",
			    tenant, call->method, safety, v.reason);
			rv = moat_rpc_error(call, MOAT_PERMISSION_DENIED,
			    "the "
			    "policy of tenant %s refuses %s commands: %s; the "
			    "command was not run (an operator sets [policy] "
			    "refuse)",
			    tenant, safety, v.reason);
			goto done;
		}
	}
	rv = moat_idem_run(&gw->rec, call, claimed ? owned_run : row->handler,
	    request, reply);
	if (call->deferred != NULL) {
		json_t *e = audited && gw->auth != NULL ?
		    audit_entry(call, request, key_id, command, safety) :
		    NULL;

		/* Audited and counted when the reply comes. */
		if (gate_defer(gw, call, i, started, e))
			goto deferred;
		json_decref(e);
	} else if (rv == MOAT_OK && safety != NULL &&
	    strcmp(call->method, "ExecStart") != 0) {
		set_safety(call, reply, safety);
	}
done:
	if (audited)
		audit(gw, call, request, key_id, command, safety, rv);
	count_call(gw, i, rv, moat_rpc_now_ms() - started);
deferred:
	call->principal = NULL;
	free(joined);
	free(msg);
	return rv;
}

/* gate: the nng door's calls, each taking a token of its API key's
 * bucket ([tenants] key-rps). */
static int
gate(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return gate_door(call, request, reply, true);
}

/* gate_http: the HTTP door's (and /mcp's) calls: admit() in http.c took
 * the key's token for the whole request, with Retry-After. */
static int
gate_http(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return gate_door(call, request, reply, false);
}

int
moat_gateway_key_admit(struct moat_gateway *gw, const char *key, uint32_t rps,
    uint32_t burst, uint32_t *retry_s, char **errmsg)
{
	struct moat_key_rate door = { rps, burst };
	char tenant[MOAT_AUTH_TENANT_MAX], key_id[MOAT_AUTH_KEY_ID_LEN + 1];

	*retry_s = 0;
	*errmsg = NULL;
	if (!gw->auth_on ||
	    moat_auth_key_verify(gw->auth, key ? key : "", tenant,
	        sizeof(tenant), key_id) != MOAT_OK)
		return MOAT_OK;
	return moat_admission_key(gw->adm, tenant, key_id, &door, retry_s,
	           errmsg) ?
	    MOAT_OK :
	    MOAT_RESOURCE_EXHAUSTED;
}

/* node_snapshot_metrics: each node's snapshot RAM (issue 11), from its
 * last survey answer, one metric after the other. */
static void
node_snapshot_metrics(FILE *f, Moat__V1__Node *const *nodes, size_t n)
{
	static const struct {
		const char *name, *type, *help;
		size_t offset;
	} metrics[] = {
		{ "moat_node_snapshot_ram_bytes", "gauge",
		    "What snapshot RAM "
		    "copies hold in the node's RAM dir.",
		    offsetof(Moat__V1__Node, snapshot_ram_used_bytes) },
		{ "moat_node_snapshot_ram_budget_bytes", "gauge",
		    "The node's "
		    "budget for snapshot RAM copies ([vmd] snapshot-ram-mib).",
		    offsetof(Moat__V1__Node, snapshot_ram_budget_bytes) },
		{ "moat_node_snapshot_evictions_total", "counter",
		    "Snapshot "
		    "RAM copies evicted to the on-disk store since vmd "
		    "started.",
		    offsetof(Moat__V1__Node, snapshot_evictions) },
	};

	for (size_t m = 0; m < sizeof(metrics) / sizeof(metrics[0]); m++) {
		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", metrics[m].name,
		    metrics[m].help, metrics[m].name, metrics[m].type);
		for (size_t i = 0; i < n; i++)
			fprintf(f, "%s{node=\"%s\"} %llu\n", metrics[m].name,
			    nodes[i]->node_id,
			    (unsigned long long)*(
			        const uint64_t *)((const char *)nodes[i] +
			        metrics[m].offset));
	}
}

/* node_state_metrics: each node's sandboxes by state and whether it
 * answers, from its last survey answer; each metric's samples together,
 * as the text format wants. */
static void
node_state_metrics(FILE *f, Moat__V1__Node *const *nodes, size_t n)
{
	static const char *const states[4] = { "creating", "running", "failed",
		"stopped" };

	fprintf(f,
	    "# HELP moat_sandboxes Sandboxes on each node by state, "
	    "from its last survey answer.\n# TYPE moat_sandboxes gauge\n");
	for (size_t i = 0; i < n; i++) {
		const uint32_t by_state[4] = { nodes[i]->sandboxes_creating,
			nodes[i]->sandboxes_running,
			nodes[i]->sandboxes_failed,
			nodes[i]->sandboxes_stopped };

		for (size_t s = 0; s < 4; s++)
			fprintf(f,
			    "moat_sandboxes{node=\"%s\",state=\"%s\"} %u\n",
			    nodes[i]->node_id, states[s], by_state[s]);
	}
	fprintf(f,
	    "# HELP moat_node_up Whether the node answers the "
	    "gateway's surveys.\n# TYPE moat_node_up gauge\n");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "moat_node_up{node=\"%s\"} %d\n", nodes[i]->node_id,
		    nodes[i]->available ? 1 : 0);
}

char *
moat_gateway_metrics(struct moat_gateway *gw)
{
	Moat__V1__Node **nodes = NULL;
	size_t n_nodes = 0, len = 0;
	char *text = NULL;
	FILE *f = open_memstream(&text, &len);
	int err;

	if (f == NULL)
		return NULL;
	err = moat_metrics_write(gw->metrics->reg, f);
	if (moat_nodes_snapshot(&gw->nodes, &nodes, &n_nodes) == MOAT_OK) {
		node_state_metrics(f, nodes, n_nodes);
		node_snapshot_metrics(f, nodes, n_nodes);
		moat_nodes_snapshot_free(nodes, n_nodes);
	}
	if (fclose(f) != 0 || err != 0) {
		free(text);
		return NULL;
	}
	return text;
}

/* ---- lifecycle ---- */

/* open_backends: the clients of sessiond and snapd, TLS by opts. */
static int
open_backends(struct moat_gateway *gw, const struct moat_gateway_opts *opts,
    char **errmsg)
{
	struct moat_rpc_client_opts co = {
		.tls = opts->tls,
		.server_name = opts->sessiond_tls_name != NULL ?
		    opts->sessiond_tls_name :
		    "sessiond",
		.what = "the dial to sessiond ([gateway] sessiond)",
	};
	int rv;

	if ((rv = moat_rpc_client_open_opts(&gw->sessiond, gw->sessiond_url,
	         &co, errmsg)) != MOAT_OK)
		return rv;
	co.server_name =
	    opts->snapd_tls_name != NULL ? opts->snapd_tls_name : "snapd";
	co.what = "the dial to snapd ([gateway] snapd)";
	return moat_rpc_client_open_opts(&gw->snapd, gw->snapd_url, &co,
	    errmsg);
}

int
moat_gateway_start(struct moat_gateway **out,
    const struct moat_gateway_opts *opts, char **errmsg)
{
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__gateway__descriptor,
		.methods = gateway_methods,
		.n_methods =
		    sizeof(gateway_methods) / sizeof(gateway_methods[0]),
	};
	struct moat_gateway *gw;
	int rv;

	*out = NULL;
	if ((gw = calloc(1, sizeof(*gw))) == NULL)
		goto fail_oom;
	gw->started_ms = moat_rpc_now_ms();
	gw->auth_on = opts->auth;
	gw->config = opts->config;
	if ((gw->metrics = calloc(1, sizeof(*gw->metrics))) == NULL ||
	    (gw->methods = calloc(N_METHODS, sizeof(*gw->methods))) == NULL ||
	    (gw->http_methods = calloc(N_METHODS, sizeof(*gw->methods))) ==
	        NULL ||
	    moat_metrics_new(&gw->metrics->reg) != MOAT_OK ||
	    moat_metrics_process(gw->metrics->reg, "gateway") != MOAT_OK)
		goto fail_oom;
	/* gate() checks keys itself (with its own message, and only when
	 * auth is on); the rpc layer's check stays off. */
	for (size_t i = 0; i < N_METHODS; i++) {
		gw->methods[i] = gateway_methods[i];
		gw->methods[i].handler = gate;
		gw->methods[i].needs_auth = false;
		gw->http_methods[i] = gw->methods[i];
		gw->http_methods[i].handler = gate_http;
	}
	if ((rv = moat_admission_new(&gw->adm, opts->config, gw->metrics->reg,
	         errmsg)) != MOAT_OK)
		goto fail;
	if ((gw->drains = moat_drains_new()) == NULL)
		goto fail_oom;
	svc.methods = gw->methods;
	if (opts->state_dir != NULL && opts->state_dir[0] != '\0') {
		if ((rv = moat_auth_open(&gw->auth, opts->state_dir,
		         errmsg)) != MOAT_OK &&
		    gw->auth_on)
			goto fail;
		if (rv != MOAT_OK) {
			moat_warn(0, "gateway: no audit log: %s", *errmsg);
			free(*errmsg);
			*errmsg = NULL;
		}
	}
	if (gw->auth_on && gw->auth == NULL) {
		rv = MOAT_INVALID_ARGUMENT;
		*errmsg = moat_asprintf(
		    "auth is on but the gateway has no "
		    "state directory for its keys: set state-dir");
		goto fail;
	}
	if ((gw->listen_url = strdup(opts->listen_url)) == NULL ||
	    (gw->survey_url = strdup(opts->survey_url)) == NULL ||
	    (gw->sessiond_url = strdup(opts->sessiond_url)) == NULL ||
	    (gw->snapd_url = strdup(opts->snapd_url)) == NULL ||
	    (gw->state_dir = xstrdup(opts->state_dir)) == NULL)
		goto fail_oom;
	if (moat_nodes_init(&gw->nodes) != MOAT_OK)
		goto fail_oom;
	gw->nodes_ready = true;
	gw->nodes.tls = opts->tls;
	if (moat_forward_init(&gw->fw, &gw->nodes) != MOAT_OK)
		goto fail_oom;
	gw->fw_ready = true;
	/* Dials do not block: a service that starts later is found. */
	if ((rv = open_backends(gw, opts, errmsg)) != MOAT_OK)
		goto fail;
	if (opts->keys_in_sessiond && gw->auth != NULL)
		moat_auth_sessiond_start(gw->auth, gw->sessiond,
		    gw->sessiond_url, gw->state_dir,
		    (uint64_t)opts->keys_stale_s * 1000);
	if (opts->keys_in_sessiond &&
	    moat_tenants_new(&gw->tenants, gw->sessiond, gw->sessiond_url) !=
	        MOAT_OK)
		goto fail_oom;
	/* Quotas counted across every gateway through sessiond's
	 * reservations (quota_remote.c). */
	if (opts->keys_in_sessiond) {
		struct moat_quota_remote *qr =
		    moat_quota_remote_new(gw->sessiond, gw->sessiond_url);

		if (qr == NULL)
			goto fail_oom;
		moat_admission_set_remote(gw->adm, qr);
	}
	if (moat_record_init(&gw->rec, &gw->fw, gw->sessiond,
	        gw->sessiond_url) != MOAT_OK)
		goto fail_oom;
	gw->rec.snapd = gw->snapd;
	gw->rec.snapd_url = gw->snapd_url;
	gw->rec.config = gw->config;
	if ((rv = moat_discovery_start_tls(&gw->discovery, &gw->nodes,
	         gw->survey_url, opts->survey_interval_ms, gw->config,
	         opts->survey_tls != NULL ? opts->survey_tls : opts->tls,
	         errmsg)) != MOAT_OK)
		goto fail;
	if ((rv = moat_inventory_start(&gw->inventory, &gw->nodes, &gw->fw,
	         opts->survey_interval_ms, true, errmsg)) != MOAT_OK)
		goto fail;
	gw->fw.inv = gw->inventory;
	moat_admission_set_inventory(gw->adm, gw->inventory);
	moat_inventory_set_audit(gw->inventory, gw->auth);
	svc.ctx = gw;
	/* Clients prove themselves by API key; a certificate is checked
	 * when one is shown and a CA for it is set. */
	struct moat_rpc_server_opts so = {
		.workers = opts->workers,
		.tls = opts->tls,
		.peer = moat_tls_has_peer_ca(opts->tls) ?
		    MOAT_TLS_PEER_OPTIONAL :
		    MOAT_TLS_PEER_NONE,
		.what = "the gateway's RPC listener ([gateway] listen)",
	};
	if ((rv = moat_rpc_server_start_opts(&gw->server, gw->listen_url, &svc,
	         &so, errmsg)) != MOAT_OK)
		goto fail;
	*out = gw;
	return MOAT_OK;

fail_oom:
	rv = MOAT_RESOURCE_EXHAUSTED;
	*errmsg = moat_asprintf("out of memory starting the gateway");
fail:
	moat_gateway_stop(gw);
	return rv;
}

void
moat_gateway_stop(struct moat_gateway *gw)
{
	if (gw == NULL)
		return;
	/* Serving stops first: no handler may run on what follows. */
	moat_rpc_server_stop(gw->server);
	/* Drains end their move under way and answer; they use the
	 * forwarder and the inventory, so they go first. */
	moat_drains_free(gw->drains);
	gw->drains = NULL;
	/* Forwarded execs complete through the gateway's state. */
	if (gw->fw_ready && !moat_forward_drain(&gw->fw, 10000))
		return;
	moat_discovery_stop(gw->discovery);
	gw->fw.inv = NULL;
	moat_inventory_stop(gw->inventory);
	moat_record_fini(&gw->rec);
	moat_rpc_client_close(gw->sessiond);
	moat_rpc_client_close(gw->snapd);
	if (gw->fw_ready)
		moat_forward_fini(&gw->fw);
	if (gw->nodes_ready)
		moat_nodes_fini(&gw->nodes);
	free(gw->listen_url);
	free(gw->survey_url);
	free(gw->sessiond_url);
	free(gw->snapd_url);
	free(gw->state_dir);
	/* Commits the audit entries still queued, then ends its writer. */
	moat_auth_close(gw->auth);
	if (gw->metrics != NULL)
		moat_metrics_free(gw->metrics->reg);
	free(gw->metrics);
	free(gw->methods);
	free(gw->http_methods);
	moat_admission_free(gw->adm);
	moat_tenants_free(gw->tenants);
	free(gw);
}

struct moat_tenants *
moat_gateway_tenants(struct moat_gateway *gw)
{
	return gw->tenants;
}

struct moat_nodes *
moat_gateway_nodes(struct moat_gateway *gw)
{
	return &gw->nodes;
}

bool
moat_gateway_policy_refuses(struct moat_gateway *gw, const char *tenant,
    const ProtobufCMessage *request, char **why)
{
	const char *language, *command;
	struct moat_safety_verdict v;
	char *joined = NULL;
	bool refused = false;

	*why = NULL;
	command = command_of(request, &language, &joined);
	if (command != NULL) {
		v = moat_safety_classify(command, language);
		refused = moat_policy_refuses(gw->config, tenant, v.level);
		if (refused)
			*why = moat_asprintf("%s: %s",
			    moat_safety_level_name(v.level), v.reason);
	}
	free(joined);
	return refused;
}

const struct moat_config *
moat_gateway_config(struct moat_gateway *gw, bool *auth_on)
{
	*auth_on = gw->auth_on;
	return gw->config;
}

struct moat_record *
moat_gateway_record(struct moat_gateway *gw)
{
	return &gw->rec;
}

void
moat_gateway_travel(struct moat_gateway *gw, struct moat_travel *out)
{
	out->nodes = &gw->nodes;
	out->fw = &gw->fw;
	out->rec = &gw->rec;
	out->survey_url = gw->survey_url;
	out->config = gw->config;
	out->adm = gw->adm;
	out->drains = gw->drains;
	out->reseed = false;
}

void
moat_gateway_service(struct moat_gateway *gw, struct moat_rpc_service *out)
{
	out->descriptor = &moat__v1__gateway__descriptor;
	out->methods = gw->http_methods;
	out->n_methods = N_METHODS;
	out->ctx = gw;
}
