/*
 * auth.c: tenants, API keys, the per-tenant audit log and the command
 * policy of the gateway (auth.h). A key is "moat_<keyid>_<secret>": the
 * key id finds its record (tenant, SHA-256 of the secret, created,
 * revoked) in the "keys" database; the secret itself is never stored.
 * The "audit" database holds JSON entries under tenant NUL + big-endian
 * microseconds, so one tenant's entries are one ordered range. Writes go
 * through LMDB's single writer lock (moat/store.h), which also serialises
 * the gateway and an operator's `keys` command in another process.
 * Audit appends never touch the disk in the caller's thread: they go into
 * a bounded queue that one writer thread per moat_auth drains, committing
 * whatever is queued in one transaction (one fsync per batch). A caller
 * that finds the queue full waits up to 2 s for room; past that (a stuck
 * disk) the entry is dropped, counted per tenant, and the writer logs one
 * "N audit entries dropped (queue full)" entry once space returns.
 * Verified keys are cached in memory for MOAT_AUTH_KEY_CACHE_TTL_MS so a
 * call costs no LMDB read; a revoke in this process evicts at once.
 * With a sessiond (moat_auth_use_sessiond, issue 15) keys are read and
 * written there (keys_remote.c; a key only the local store has is
 * imported on first use) and the writer sends each batch there
 * (audit_remote.c), keeping a batch locally when sessiond does not take
 * it.
 * This file: opening and closing the store (and the audit writer's
 * thread), tenant names and the command policy; the keys are in
 * auth_keys.c, the audit log in auth_audit.c (auth_internal.h: what they
 * share).
 * Not for: which calls need a key, or what is audited (handlers.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "auth_internal.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

static const char *const db_names[] = { DB_KEYS, DB_AUDIT,
	MOAT_AUTH_DB_AUDIT_PENDING, NULL };

int
moat_auth_open(struct moat_auth **out, const char *state_dir, char **errmsg)
{
	struct moat_auth *a;
	char *path;
	int rv;

	*out = NULL;
	if ((a = calloc(1, sizeof(*a))) == NULL ||
	    (path = moat_asprintf("%s/%s", state_dir, MOAT_AUTH_DB_DIR)) ==
	        NULL) {
		free(a);
		*errmsg = moat_asprintf("out of memory opening the key store");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rv = moat_store_open(&a->st, path, AUTH_MAP_BYTES, db_names, errmsg);
	free(path);
	if (rv != MOAT_OK) {
		free(a);
		return rv;
	}
	a->cap = MOAT_AUTH_AUDIT_QUEUE_LEN;
	if ((a->ring = calloc(a->cap, sizeof(*a->ring))) == NULL ||
	    (a->batch = calloc(a->cap, sizeof(*a->batch))) == NULL) {
		*errmsg = moat_asprintf("out of memory for the audit queue");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
	}
	if (pthread_mutex_init(&a->lock, NULL) != 0 ||
	    pthread_mutex_init(&a->cache_lock, NULL) != 0 ||
	    pthread_cond_init(&a->work, NULL) != 0 ||
	    pthread_cond_init(&a->done, NULL) != 0) {
		/* glibc's init does not fail; other libcs may. */
		*errmsg = moat_asprintf("cannot create the audit queue's "
		                        "locks");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	a->sync_ready = true;
	if (pthread_create(&a->writer, NULL, moat_auth_audit_writer, a) != 0) {
		*errmsg = moat_asprintf("cannot start the audit writer "
		                        "thread");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
	}
	a->writer_started = true;
	*out = a;
	return MOAT_OK;
fail:
	moat_auth_close(a);
	return rv;
}

void
moat_auth_close(struct moat_auth *a)
{
	if (a == NULL)
		return;
	if (a->writer_started) {
		/* The writer drains the queue and commits before it ends. */
		pthread_mutex_lock(&a->lock);
		a->stopping = true;
		pthread_cond_signal(&a->work);
		pthread_mutex_unlock(&a->lock);
		pthread_join(a->writer, NULL);
	}
	for (size_t i = 0; a->ring != NULL && i < a->len; i++)
		free(a->ring[(a->head + i) % a->cap].text);
	free(a->ring);
	free(a->batch);
	if (a->sync_ready) {
		pthread_mutex_destroy(&a->lock);
		pthread_mutex_destroy(&a->cache_lock);
		pthread_cond_destroy(&a->work);
		pthread_cond_destroy(&a->done);
	}
	moat_store_close(a->st);
	free(a);
}

bool
moat_auth_tenant_valid(const char *tenant)
{
	size_t n = tenant != NULL ? strlen(tenant) : 0;

	if (n == 0 || n >= MOAT_AUTH_TENANT_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = tenant[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		        c == '-'))
			return false;
	}
	return true;
}

bool
moat_auth_tenant_reserved(const char *tenant)
{
	return tenant != NULL && strncmp(tenant, "moat.", 5) == 0;
}

bool
moat_policy_refuses(const struct moat_config *cfg, const char *tenant,
    enum moat_safety_level level)
{
	const char *name = moat_safety_level_name(level), *list = NULL, *p;
	char key[MOAT_AUTH_TENANT_MAX + 16];
	size_t n = strlen(name);

	if (tenant != NULL && strlen(tenant) < MOAT_AUTH_TENANT_MAX) {
		snprintf(key, sizeof(key), "refuse.%s", tenant);
		list = moat_config_get(cfg, "policy", key, NULL);
	}
	if (list == NULL)
		list = moat_config_get(cfg, "policy", "refuse", "blocked");
	for (p = list; (p = strstr(p, name)) != NULL; p += n) {
		bool start = p == list || p[-1] == ',' || p[-1] == ' ';
		bool end = p[n] == '\0' || p[n] == ',' || p[n] == ' ';
		if (start && end)
			return true;
	}
	return false;
}
