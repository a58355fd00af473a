/*
 * auth_audit.c: the gateway's per-tenant audit log (auth.h). Entries
 * are JSON under tenant NUL + big-endian microseconds in the "audit"
 * database, so one tenant's entries are one ordered range. Appends never
 * touch the disk in the caller's thread: they go into a bounded queue
 * that one writer thread per moat_auth drains, committing whatever is
 * queued in one transaction (one fsync per batch), or sending the batch
 * to sessiond (audit_remote.c) when the gateway has one, keeping it
 * locally when sessiond does not take it. A caller that finds the queue
 * full waits up to 2 s for room; past that the entry is dropped, counted
 * per tenant, and logged once space returns.
 * Not for: what is audited (handlers.c) or the keys (auth_keys.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "auth_internal.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

/* audit_key: tenant NUL then the big-endian time in us; returns its
 * length. */
static size_t
audit_key(uint8_t *key, const char *tenant, uint64_t us)
{
	size_t n = strlen(tenant) + 1;

	memcpy(key, tenant, n);
	moat_store_key_u64(key + n, us);
	return n + 8;
}

/* How long a caller waits for room in a full audit queue before its
 * entry is counted as dropped (the disk is then stuck, not just busy). */
#define AUDIT_FULL_WAIT_MS 2000

/* note_drop: counts a dropped entry of `tenant`; lock held. */
static void
note_drop(struct moat_auth *a, const char *tenant)
{
	for (size_t i = 0; i < a->n_drops; i++)
		if (strcmp(a->drops[i].tenant, tenant) == 0) {
			a->drops[i].n++;
			return;
		}
	if (a->n_drops == DROP_TENANTS) {
		a->drops_unattributed++;
		return;
	}
	snprintf(a->drops[a->n_drops].tenant, MOAT_AUTH_TENANT_MAX, "%s",
	    tenant);
	a->drops[a->n_drops++].n = 1;
}

int
moat_auth_audit_append(struct moat_auth *a, const char *tenant, json_t *entry,
    char **errmsg)
{
	struct timespec ts;
	uint64_t us;
	char *text;

	if (!moat_auth_tenant_valid(tenant)) {
		*errmsg = moat_asprintf("audit: bad tenant name");
		return MOAT_INVALID_ARGUMENT;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	if (json_object_set_new(entry, "at_unix_ms",
	        json_integer((json_int_t)(us / 1000))) != 0 ||
	    (text = json_dumps(entry, JSON_COMPACT)) == NULL) {
		*errmsg = moat_asprintf("out of memory writing the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	pthread_mutex_lock(&a->lock);
	a->seq++;
	if (a->len == a->cap) {
		/* A full queue slows the caller down rather than losing its
		 * entry: wait (at most AUDIT_FULL_WAIT_MS) for the writer's
		 * next commit to make room. */
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += AUDIT_FULL_WAIT_MS / 1000;
		pthread_cond_signal(&a->work);
		while (a->len == a->cap && !a->stopping &&
		    pthread_cond_timedwait(&a->done, &a->lock, &until) == 0)
			;
	}
	if (a->len == a->cap) {
		/* The disk is stuck: count it, the writer says so. */
		note_drop(a, tenant);
		free(text);
	} else {
		struct audit_item *it = &a->ring[(a->head + a->len) % a->cap];

		snprintf(it->tenant, sizeof(it->tenant), "%s", tenant);
		it->us = us;
		it->text = text;
		a->len++;
	}
	pthread_cond_signal(&a->work);
	pthread_mutex_unlock(&a->lock);
	return MOAT_OK;
}

void
moat_auth_audit_flush(struct moat_auth *a)
{
	uint64_t target;

	if (a == NULL)
		return;
	pthread_mutex_lock(&a->lock);
	target = a->seq;
	while (a->done_seq < target)
		pthread_cond_wait(&a->done, &a->lock);
	pthread_mutex_unlock(&a->lock);
}

/* put_entry: stores one entry in the write transaction; two entries in
 * one microsecond: the later one takes the next. */
static int
put_entry(struct moat_store_txn *txn, const char *tenant, uint64_t us,
    const char *text, bool pending, char **errmsg)
{
	uint8_t key[MOAT_AUTH_TENANT_MAX + 8];
	size_t klen;
	int rv;

	do {
		klen = audit_key(key, tenant, us++);
		rv = moat_store_put(txn, DB_AUDIT, key, klen, text,
		    strlen(text), true, errmsg);
		if (rv == MOAT_ALREADY_EXISTS) {
			free(*errmsg);
			*errmsg = NULL;
		}
	} while (rv == MOAT_ALREADY_EXISTS);
	/* Kept here while sessiond is away: sent there when it is back
	 * (moat_audit_pending_push). */
	if (rv == MOAT_OK && pending)
		rv = moat_store_put(txn, MOAT_AUTH_DB_AUDIT_PENDING, key, klen,
		    "", 0, false, errmsg);
	return rv;
}

/* drop_text: the one entry saying how many of `tenant`'s were dropped
 * (heap JSON, NULL when out of memory) and its time in *us. */
static char *
drop_text(uint64_t n, uint64_t *us)
{
	struct timespec ts;
	char *text, *msg;
	json_t *e;

	clock_gettime(CLOCK_REALTIME, &ts);
	*us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	msg = moat_asprintf("%llu audit entries dropped (queue full)",
	    (unsigned long long)n);
	/* The text also as "command": the one field of ListAudit's
	 * AuditEntry that carries free text. */
	e = json_pack("{s:s, s:s, s:s?, s:s?, s:I, s:I}", "method",
	    "AuditDropped", "code", "RESOURCE_EXHAUSTED", "message", msg,
	    "command", msg, "dropped", (json_int_t)n, "at_unix_ms",
	    (json_int_t)(*us / 1000));
	free(msg);
	text = e != NULL ? json_dumps(e, JSON_COMPACT) : NULL;
	json_decref(e);
	return text;
}

/* put_drop: drop_text's entry for `tenant`, in the write txn. */
static int
put_drop(struct moat_store_txn *txn, const char *tenant, uint64_t n,
    bool pending, char **errmsg)
{
	uint64_t us;
	char *text = drop_text(n, &us);
	int rv;

	if (text == NULL) {
		*errmsg = moat_asprintf("out of memory writing the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rv = put_entry(txn, tenant, us, text, pending, errmsg);
	free(text);
	return rv;
}

/* commit_remote: the batch and the drop counts as one AppendAudit. */
static int
commit_remote(struct moat_rpc_client *c, const char *url,
    const struct audit_item *batch, size_t n, const struct audit_drop *drops,
    size_t n_drops, char **errmsg)
{
	struct moat_audit_item *items =
	    calloc(n + n_drops + 1, sizeof(*items));
	size_t k = 0;
	int rv = MOAT_OK;

	if (items == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < n; i++, k++)
		items[k] = (struct moat_audit_item){ batch[i].tenant,
			batch[i].us, batch[i].text };
	for (size_t i = 0; i < n_drops && rv == MOAT_OK; i++, k++) {
		items[k].tenant = drops[i].tenant;
		if ((items[k].text = drop_text(drops[i].n, &items[k].us)) ==
		    NULL)
			rv = MOAT_RESOURCE_EXHAUSTED;
	}
	if (rv == MOAT_OK)
		rv = moat_audit_remote_append(c, url, items, k, errmsg);
	for (size_t i = n; i < k; i++)
		free((char *)items[i].text);
	free(items);
	return rv;
}

/* commit_batch: one write transaction (one fsync) for the whole batch
 * and the drop counts; writer thread only. */
static void
commit_batch(struct moat_auth *a, struct audit_item *batch, size_t n,
    const struct audit_drop *drops, size_t n_drops, uint64_t unattributed)
{
	struct moat_store_txn *txn = NULL;
	struct moat_rpc_client *remote;
	const char *url;
	char *errmsg = NULL;
	uint64_t dropped = unattributed, now;
	int rv;

	for (size_t i = 0; i < n_drops; i++)
		dropped += drops[i].n;
	pthread_mutex_lock(&a->lock);
	remote = a->sessiond;
	url = a->sessiond_url;
	pthread_mutex_unlock(&a->lock);
	if (remote != NULL && n + n_drops > 0) {
		if ((rv = commit_remote(remote, url, batch, n, drops, n_drops,
		         &errmsg)) == MOAT_OK) {
			moat_audit_pending_push(a->st, remote, url);
			goto out;
		}
		moat_warn(0,
		    "audit: %zu entries kept in this gateway's own log until "
		    "moat-sessiond takes them: %s",
		    n + n_drops, errmsg ? errmsg : moat_strerror(rv));
		free(errmsg);
		errmsg = NULL;
	}
	if ((rv = moat_store_txn_begin(a->st, true, &txn, &errmsg)) != MOAT_OK)
		goto out;
	for (size_t i = 0; i < n && rv == MOAT_OK; i++)
		rv = put_entry(txn, batch[i].tenant, batch[i].us,
		    batch[i].text, remote != NULL, &errmsg);
	for (size_t i = 0; i < n_drops && rv == MOAT_OK; i++)
		rv = put_drop(txn, drops[i].tenant, drops[i].n, remote != NULL,
		    &errmsg);
	if (rv != MOAT_OK) {
		moat_store_txn_abort(txn);
		goto out;
	}
	rv = moat_store_txn_commit(txn, &errmsg);
out:
	if (rv != MOAT_OK)
		moat_warn(0, "audit: %zu entries not logged: %s", n + n_drops,
		    errmsg ? errmsg : "?");
	free(errmsg);
	if (dropped > 0) {
		a->warn_dropped += dropped;
		now = mono_ms();
		if (a->warn_at_ms == 0 ||
		    now - a->warn_at_ms >= DROP_WARN_EVERY_MS) {
			moat_warn(0,
			    "audit: %llu entries dropped (queue of %zu "
			    "full)%s",
			    (unsigned long long)a->warn_dropped, a->cap,
			    unattributed > 0 ?
			        "; some of tenants "
			        "beyond the first 64 not logged per tenant" :
			        "");
			a->warn_at_ms = now;
			a->warn_dropped = 0;
		}
	}
}

/* moat_auth_audit_writer: the one LMDB writer of the audit log: takes
 * all that is queued, commits it in one transaction, again until
 * stopped with an empty queue. */
void *
moat_auth_audit_writer(void *arg)
{
	struct moat_auth *a = arg;
	struct audit_drop drops[DROP_TENANTS];
	size_t n, n_drops;
	uint64_t unattributed, taken;

	pthread_mutex_lock(&a->lock);
	for (;;) {
		while (a->len == 0 && a->n_drops == 0 &&
		    a->drops_unattributed == 0 && !a->stopping)
			pthread_cond_wait(&a->work, &a->lock);
		if (a->len == 0 && a->n_drops == 0 &&
		    a->drops_unattributed == 0)
			break; /* stopping, all done */
		/* Take everything: the queue is empty again for handlers. */
		for (n = 0; n < a->len; n++)
			a->batch[n] = a->ring[(a->head + n) % a->cap];
		a->head = (a->head + n) % a->cap;
		a->len = 0;
		n_drops = a->n_drops;
		memcpy(drops, a->drops, n_drops * sizeof(*drops));
		unattributed = a->drops_unattributed;
		a->n_drops = 0;
		a->drops_unattributed = 0;
		taken = a->seq;
		pthread_mutex_unlock(&a->lock);
		commit_batch(a, a->batch, n, drops, n_drops, unattributed);
		for (size_t i = 0; i < n; i++)
			free(a->batch[i].text);
		pthread_mutex_lock(&a->lock);
		a->done_seq = taken;
		pthread_cond_broadcast(&a->done);
	}
	a->done_seq = a->seq;
	pthread_cond_broadcast(&a->done);
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

struct audit_ctx {
	json_t **ring;
	size_t limit, n; /* n: entries seen */
};

static int
audit_one(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct audit_ctx *c = arg;
	json_t *e = json_loadb(val, vlen, 0, NULL);
	size_t slot = c->n % c->limit;

	if (e == NULL)
		return MOAT_OK;
	json_decref(c->ring[slot]);
	c->ring[slot] = e;
	c->n++;
	return MOAT_OK;
}

int
moat_auth_audit_list(struct moat_auth *a, const char *tenant, size_t limit,
    json_t **out, char **errmsg)
{
	struct moat_store_txn *txn = NULL;
	struct audit_ctx c = { .limit = limit };
	size_t plen, first, count;
	json_t *arr = NULL;
	int rv;

	*out = NULL;
	if (!moat_auth_tenant_valid(tenant) || limit == 0 ||
	    limit > MOAT_AUTH_AUDIT_MAX_LIMIT) {
		*errmsg = moat_asprintf("audit: limit must be 1-%d",
		    MOAT_AUTH_AUDIT_MAX_LIMIT);
		return MOAT_INVALID_ARGUMENT;
	}
	if (a->sessiond != NULL)
		return moat_audit_remote_list(a->sessiond, a->sessiond_url,
		    tenant, limit, out, errmsg);
	if ((c.ring = calloc(limit, sizeof(*c.ring))) == NULL ||
	    (arr = json_array()) == NULL) {
		free(c.ring);
		*errmsg = moat_asprintf("out of memory reading the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	plen = strlen(tenant) + 1; /* with its NUL: not a longer name */
	if ((rv = moat_store_txn_begin(a->st, false, &txn, errmsg)) ==
	    MOAT_OK) {
		rv = moat_store_scan(txn, DB_AUDIT, tenant, plen, NULL, 0,
		    audit_one, &c, errmsg);
		moat_store_txn_abort(txn);
	}
	count = c.n < limit ? c.n : limit;
	first = c.n < limit ? 0 : c.n % limit;
	for (size_t i = 0; i < count && rv == MOAT_OK; i++) {
		json_t *e = c.ring[(first + i) % limit];
		if (json_array_append(arr, e) != 0) {
			rv = MOAT_RESOURCE_EXHAUSTED;
			*errmsg = moat_asprintf("out of memory");
		}
	}
	for (size_t i = 0; i < limit; i++)
		json_decref(c.ring[i]);
	free(c.ring);
	if (rv != MOAT_OK) {
		json_decref(arr);
		return rv;
	}
	*out = arr;
	return MOAT_OK;
}
