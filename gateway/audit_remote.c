/*
 * audit_remote.c: the gateway's audit log in moat-sessiond (issue 15),
 * used by auth.c's writer thread when the gateway keeps its keys there
 * (moat_auth_use_sessiond): each batch the writer takes from its bounded
 * queue is one AppendAudit call (callers never wait for it: they only
 * queue, as with the local log); ListAudit reads sessiond's ListAuditLog,
 * so it shows the calls made through every gateway. When sessiond does
 * not take a batch, auth.c keeps it in the gateway's local log (logged).
 * Not for: queueing, drops and the local log (auth.c) or retention
 * (services/session/audit.c).
 */
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define AUDIT_SERVICE "moat.v1.Session"
#define AUDIT_CALL_MS 3000

static int
fail(const char *url, const char *method, int rv, char *msg, char **errmsg)
{
	if (rv == MOAT_DEADLINE_EXCEEDED)
		rv = MOAT_UNAVAILABLE;
	*errmsg = moat_asprintf("moat-sessiond at %s: %s: %s", url, method,
	    msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

int
moat_audit_remote_append(struct moat_rpc_client *c, const char *url,
    const struct moat_audit_item *items, size_t n, char **errmsg)
{
	Moat__V1__AppendAuditRequest req =
	    MOAT__V1__APPEND_AUDIT_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = AUDIT_CALL_MS };
	Moat__V1__AuditLogEntry *e = calloc(n ? n : 1, sizeof(*e));
	Moat__V1__AuditLogEntry **v = calloc(n ? n : 1, sizeof(*v));
	ProtobufCMessage *reply = NULL;
	char *msg = NULL;
	int rv;

	if (e == NULL || v == NULL) {
		free(e);
		free(v);
		*errmsg = moat_asprintf("out of memory sending the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < n; i++) {
		moat__v1__audit_log_entry__init(&e[i]);
		e[i].tenant = (char *)items[i].tenant;
		e[i].at_unix_us = items[i].us;
		e[i].json = (char *)items[i].text;
		v[i] = &e[i];
	}
	req.entries = v;
	req.n_entries = n;
	rv = moat_rpc_call(c, AUDIT_SERVICE, "AppendAudit", &req.base,
	    &moat__v1__append_audit_reply__descriptor, &reply, &opts, &msg);
	free(v);
	free(e);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	if (rv != MOAT_OK)
		return fail(url, "AppendAudit", rv, msg, errmsg);
	free(msg);
	return MOAT_OK;
}

int
moat_audit_remote_list(struct moat_rpc_client *c, const char *url,
    const char *tenant, size_t limit, json_t **out, char **errmsg)
{
	Moat__V1__ListAuditLogRequest req =
	    MOAT__V1__LIST_AUDIT_LOG_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = AUDIT_CALL_MS,
		.tenant = tenant };
	Moat__V1__ListAuditLogReply *r = NULL;
	json_t *arr;
	char *msg = NULL;
	int rv;

	*out = NULL;
	req.tenant = (char *)tenant;
	req.limit = (uint32_t)limit;
	rv = moat_rpc_call(c, AUDIT_SERVICE, "ListAuditLog", &req.base,
	    &moat__v1__list_audit_log_reply__descriptor,
	    (ProtobufCMessage **)&r, &opts, &msg);
	if (rv != MOAT_OK)
		return fail(url, "ListAuditLog", rv, msg, errmsg);
	free(msg);
	if ((arr = json_array()) == NULL) {
		protobuf_c_message_free_unpacked(&r->base, NULL);
		*errmsg = moat_asprintf("out of memory reading the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < r->n_entries; i++) {
		json_t *e = json_loads(r->entries[i]->json, 0, NULL);

		/* An entry that is not a JSON object is skipped. */
		if (json_is_object(e))
			json_array_append(arr, e);
		json_decref(e);
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	*out = arr;
	return MOAT_OK;
}
