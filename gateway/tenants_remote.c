/*
 * tenants_remote.c: tenants' own settings kept in moat-sessiond (issue
 * 15), so every gateway applies the same quotas, key rates and lifetimes
 * (`moat-gateway tenants set acme max-sandboxes=5`). The gateway keeps a
 * copy of every tenant's settings, read again (ListTenants) at most every
 * MOAT_TENANTS_REFRESH_MS by the first lookup that finds it older; other
 * lookups meanwhile use the copy they have. Installed as the overlay of
 * the config's [tenants] section (moat_config_set_overlay), so every
 * moat_config_get_u64_for of it (admission.c, lifetime.c) sees a tenant's
 * setting before the file's. When sessiond does not answer, the last copy
 * stays in force (none yet: the file's values).
 * Not for: sessiond's store (services/session/tenants.c) or the command
 * (keys_cli.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"
#include "tenants.h"

const char *const moat_tenant_setting_keys[] = { "max-sandboxes", "max-vcpus",
	"max-memory-mib", "max-snapshot-bytes", "key-rps", "key-burst",
	"timeout-s", "timeout-max-s", "idle-timeout-s", NULL };

struct moat_tenants {
	pthread_mutex_t lock; /* guards list, fetched_ms, refreshing */
	Moat__V1__ListTenantsReply *list; /* the copy; NULL: none yet */
	uint64_t fetched_ms;              /* monotonic; 0: never */
	bool refreshing;
	struct moat_rpc_client *sessiond; /* borrowed */
	const char *url;                  /* borrowed */
};

int
moat_tenants_new(struct moat_tenants **out, struct moat_rpc_client *sessiond,
    const char *url)
{
	struct moat_tenants *t = calloc(1, sizeof(*t));

	*out = NULL;
	if (t == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	pthread_mutex_init(&t->lock, NULL);
	t->sessiond = sessiond;
	t->url = url;
	*out = t;
	return MOAT_OK;
}

void
moat_tenants_free(struct moat_tenants *t)
{
	if (t == NULL)
		return;
	if (t->list != NULL)
		moat__v1__list_tenants_reply__free_unpacked(t->list, NULL);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

/* refresh: reads every tenant's settings when the copy is older than
 * MOAT_TENANTS_REFRESH_MS and no other thread is reading them. */
static void
refresh(struct moat_tenants *t)
{
	Moat__V1__ListTenantsRequest req =
	    MOAT__V1__LIST_TENANTS_REQUEST__INIT;
	Moat__V1__ListTenantsReply *list = NULL, *old = NULL;
	uint64_t now = moat_rpc_now_ms();
	char *errmsg = NULL;
	int rv;

	pthread_mutex_lock(&t->lock);
	if (t->refreshing ||
	    (t->fetched_ms != 0 &&
	        now - t->fetched_ms < MOAT_TENANTS_REFRESH_MS)) {
		pthread_mutex_unlock(&t->lock);
		return;
	}
	t->refreshing = true;
	pthread_mutex_unlock(&t->lock);
	rv = moat_sessiond_remote_call(t->sessiond, t->url, "ListTenants",
	    &req.base, &moat__v1__list_tenants_reply__descriptor,
	    (ProtobufCMessage **)&list, &errmsg);
	if (rv != MOAT_OK)
		moat_warn(0,
		    "tenants: their settings could not be read (%s): the last "
		    "ones read stay in force",
		    errmsg ? errmsg : moat_strerror(rv));
	free(errmsg);
	pthread_mutex_lock(&t->lock);
	if (rv == MOAT_OK) {
		old = t->list;
		t->list = list;
	}
	/* A failure waits a period too, so calls do not each wait 3 s. */
	t->fetched_ms = moat_rpc_now_ms();
	t->refreshing = false;
	pthread_mutex_unlock(&t->lock);
	if (old != NULL)
		moat__v1__list_tenants_reply__free_unpacked(old, NULL);
}

bool
moat_tenants_overlay(void *arg, const char *key, const char *who, char *buf,
    size_t size)
{
	struct moat_tenants *t = arg;
	bool found = false;

	if (t == NULL || who == NULL)
		return false;
	refresh(t);
	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; t->list != NULL && i < t->list->n_tenants && !found;
	     i++) {
		const Moat__V1__TenantInfo *ti = t->list->tenants[i];

		if (strcmp(ti->name, who) != 0)
			continue;
		for (size_t j = 0; j < ti->n_settings; j++)
			if (strcmp(ti->settings[j]->key, key) == 0) {
				snprintf(buf, size, "%s",
				    ti->settings[j]->value);
				found = true;
				break;
			}
		break;
	}
	pthread_mutex_unlock(&t->lock);
	return found;
}

bool
moat_tenant_setting_known(const char *key)
{
	for (size_t i = 0; moat_tenant_setting_keys[i] != NULL; i++)
		if (strcmp(moat_tenant_setting_keys[i], key) == 0)
			return true;
	return false;
}
