/*
 * audit_remote.c: the gateway's audit log in moat-sessiond (issue 15),
 * used by auth_audit.c's writer thread when the gateway keeps its keys there
 * (moat_auth_use_sessiond): each batch the writer takes from its bounded
 * queue is one AppendAudit call (callers never wait for it: they only
 * queue, as with the local log); ListAudit reads sessiond's ListAuditLog,
 * so it shows the calls made through every gateway. When sessiond does
 * not take a batch, auth_audit.c keeps it in the gateway's local log (logged)
 * and marks it pending; moat_audit_pending_push sends it once sessiond
 * takes batches again, so no entry stays out of the cluster's log.
 * Not for: queueing, drops and the local log (auth_audit.c) or retention
 * (services/session/audit.c).
 */
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/store.h"
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

/* ---- entries kept locally while sessiond was away ---- */

struct pending {
	struct moat_store_txn *txn;
	struct moat_audit_item items[MOAT_AUDIT_PUSH_MAX];
	uint8_t keys[MOAT_AUDIT_PUSH_MAX][MOAT_AUTH_TENANT_MAX + 8];
	size_t lens[MOAT_AUDIT_PUSH_MAX];
	size_t n;
	char *errmsg;
};

static int
pending_one(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct pending *p = arg;
	const uint8_t *k = key;
	const void *text;
	size_t tlen, tenant_len;
	int rv;

	(void)val;
	(void)vlen;
	if (p->n == MOAT_AUDIT_PUSH_MAX)
		return MOAT_STORE_SCAN_STOP;
	tenant_len = klen > 8 ? strnlen(key, klen - 8) : klen;
	if (klen > sizeof(p->keys[0]) || tenant_len + 1 + 8 != klen)
		return MOAT_OK; /* not a key of ours: left alone */
	rv = moat_store_get(p->txn, MOAT_AUTH_DB_AUDIT, key, klen, &text,
	    &tlen, &p->errmsg);
	memcpy(p->keys[p->n], key, klen);
	p->lens[p->n] = klen;
	if (rv == MOAT_OK) {
		p->items[p->n].tenant = (const char *)p->keys[p->n];
		p->items[p->n].us =
		    moat_store_u64_from_key(k + tenant_len + 1);
		/* Copied: the read txn ends before the call. */
		if ((p->items[p->n].text = strndup(text, tlen)) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
	} else {
		free(p->errmsg);
		p->errmsg = NULL;
		p->items[p->n].text = NULL; /* gone: just forgotten */
	}
	p->n++;
	return MOAT_OK;
}

/* pending_take: the oldest pending entries (and their keys) into p. */
static int
pending_take(struct moat_store *st, struct pending *p)
{
	int rv;

	if ((rv = moat_store_txn_begin(st, false, &p->txn, &p->errmsg)) !=
	    MOAT_OK)
		return rv;
	rv = moat_store_scan(p->txn, MOAT_AUTH_DB_AUDIT_PENDING, NULL, 0, NULL,
	    0, pending_one, p, &p->errmsg);
	moat_store_txn_abort(p->txn);
	p->txn = NULL;
	return rv;
}

/* pending_forget: the first `n` keys of p are no longer pending. */
static int
pending_forget(struct moat_store *st, struct pending *p)
{
	struct moat_store_txn *txn = NULL;
	int rv;

	if ((rv = moat_store_txn_begin(st, true, &txn, &p->errmsg)) != MOAT_OK)
		return rv;
	for (size_t i = 0; i < p->n && rv == MOAT_OK; i++) {
		rv = moat_store_del(txn, MOAT_AUTH_DB_AUDIT_PENDING,
		    p->keys[i], p->lens[i], &p->errmsg);
		if (rv == MOAT_NOT_FOUND) {
			free(p->errmsg);
			p->errmsg = NULL;
			rv = MOAT_OK;
		}
	}
	if (rv == MOAT_OK)
		return moat_store_txn_commit(txn, &p->errmsg);
	moat_store_txn_abort(txn);
	return rv;
}

void
moat_audit_pending_push(struct moat_store *st, struct moat_rpc_client *c,
    const char *url)
{
	struct pending *p = calloc(1, sizeof(*p));
	struct moat_audit_item *send = NULL;
	size_t n_send = 0;
	int rv;

	if (p == NULL)
		return;
	rv = pending_take(st, p);
	if (rv == MOAT_OK && p->n > 0 &&
	    (send = calloc(p->n, sizeof(*send))) == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; rv == MOAT_OK && i < p->n; i++)
		if (p->items[i].text != NULL)
			send[n_send++] = p->items[i];
	if (rv == MOAT_OK && n_send > 0)
		rv =
		    moat_audit_remote_append(c, url, send, n_send, &p->errmsg);
	if (rv == MOAT_OK && p->n > 0)
		rv = pending_forget(st, p);
	if (rv == MOAT_OK && n_send > 0)
		moat_info(0,
		    "audit: %zu entries this gateway kept while "
		    "moat-sessiond was away are now in it",
		    n_send);
	else if (rv != MOAT_OK)
		moat_warn(0,
		    "audit: entries kept while moat-sessiond was away stay "
		    "pending: %s",
		    p->errmsg ? p->errmsg : moat_strerror(rv));
	for (size_t i = 0; i < p->n; i++)
		free((char *)p->items[i].text);
	free(send);
	free(p->errmsg);
	free(p);
}
