/*
 * tenants.c: each tenant's own settings of the gateways' [tenants]
 * section (issue 15): quotas, key rates and lifetimes an operator sets at
 * run time with `moat-gateway tenants set NAME KEY=VALUE`, so every
 * gateway of the cluster applies the same ones (each reads them every
 * 5 s, over its config file's values). Kept as TenantInfo under the
 * tenant's name in the "tenants" database of the keys' environment
 * (<state>/sessiond-keys). sessiond checks the shape of a setting (a
 * key of 1-63 lowercase letters, digits or '-', a value of 1-64
 * printable characters, at most 64 settings); the gateway checks that
 * the key is one of [tenants] and the value a number.
 * Not for: API keys (keys.c) or how a gateway uses the values
 * (gateway/tenants_remote.c, admission.c, lifetime.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

#define DB_TENANTS "tenants"
#define SETTINGS_MAX 64
#define SETTING_KEY_MAX 63
#define SETTING_VALUE_MAX 64
#define LIST_MAX 100000

typedef Moat__V1__TenantInfo__SettingsEntry Setting;

static int
check_setting(struct moat_rpc_call *call, const char *key, const char *value)
{
	size_t k = key != NULL ? strlen(key) : 0;
	size_t v = value != NULL ? strlen(value) : 0;

	if (k < 1 || k > SETTING_KEY_MAX ||
	    strspn(key, "abcdefghijklmnopqrstuvwxyz0123456789-") != k)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "setting \"%.80s\" is not a [tenants] key (1-63 "
		    "lowercase letters, digits or '-', such as "
		    "max-sandboxes)",
		    key ? key : "");
	for (size_t i = 0; i < v; i++)
		if ((unsigned char)value[i] < 0x20 || value[i] == 0x7f)
			v = 0;
	if (v < 1 || v > SETTING_VALUE_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "the value of %s must be 1-%d printable characters", key,
		    SETTING_VALUE_MAX);
	return MOAT_OK;
}

/* load: the record of `name` (heap) or NOT_FOUND. */
static int
load(struct moat_store_txn *txn, const char *name, Moat__V1__TenantInfo **out,
    char **errmsg)
{
	const void *val;
	size_t vlen;
	int rv;

	*out = NULL;
	if ((rv = moat_store_get(txn, DB_TENANTS, name, strlen(name), &val,
	         &vlen, errmsg)) != MOAT_OK)
		return rv;
	if ((*out = moat__v1__tenant_info__unpack(NULL, vlen, val)) == NULL) {
		*errmsg = moat_asprintf("tenant %s: its record is not "
		                        "readable",
		    name);
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* copy_out: `t` into the reply `out` (heap copies). */
static int
copy_out(const Moat__V1__TenantInfo *t, Moat__V1__TenantInfo *out)
{
	out->created_unix_ms = t->created_unix_ms;
	out->updated_unix_ms = t->updated_unix_ms;
	if ((out->name = strdup(t->name)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if (t->n_settings == 0)
		return MOAT_OK;
	if ((out->settings = calloc(t->n_settings, sizeof(Setting *))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < t->n_settings; i++) {
		Setting *s = malloc(sizeof(*s));

		if (s == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		moat__v1__tenant_info__settings_entry__init(s);
		out->settings[out->n_settings++] = s;
		if ((s->key = strdup(t->settings[i]->key)) == NULL ||
		    (s->value = strdup(t->settings[i]->value)) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}

/* find_setting: the index of `key` among n settings, or n. */
static size_t
find_setting(Setting *const *s, size_t n, const char *key)
{
	size_t i;

	for (i = 0; i < n && strcmp(s[i]->key, key) != 0; i++)
		;
	return i;
}

/* merge: `old`'s settings (may be NULL) with the request's unset then set
 * applied, into `t` (borrowing every string; `slots` holds the entries).
 * INVALID_ARGUMENT past SETTINGS_MAX. */
static int
merge(struct moat_rpc_call *call, const Moat__V1__TenantInfo *old,
    const Moat__V1__SetTenantRequest *req, Moat__V1__TenantInfo *t,
    Setting *slots, Setting **ptrs)
{
	size_t n = 0, i;

	for (i = 0; old != NULL && i < old->n_settings; i++) {
		bool dropped = false;

		for (size_t u = 0; u < req->n_unset; u++)
			dropped |=
			    strcmp(req->unset[u], old->settings[i]->key) == 0;
		if (dropped || n == SETTINGS_MAX)
			continue;
		slots[n] = *old->settings[i];
		ptrs[n] = &slots[n];
		n++;
	}
	for (i = 0; i < req->n_set; i++) {
		size_t at = find_setting(ptrs, n, req->set[i]->key);

		if (at == n && n == SETTINGS_MAX)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "a tenant has at most %d settings", SETTINGS_MAX);
		moat__v1__tenant_info__settings_entry__init(&slots[at]);
		slots[at].key = req->set[i]->key;
		slots[at].value = req->set[i]->value;
		ptrs[at] = &slots[at];
		if (at == n)
			n++;
	}
	t->settings = ptrs;
	t->n_settings = n;
	return MOAT_OK;
}

static int
check_set(struct moat_rpc_call *call, const Moat__V1__SetTenantRequest *req)
{
	int rv;

	if ((rv = sessiond_check_tenant_name(call, req->tenant)) != MOAT_OK)
		return rv;
	if (req->n_set > SETTINGS_MAX || req->n_unset > SETTINGS_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "at most %d settings a call", SETTINGS_MAX);
	for (size_t i = 0; i < req->n_set; i++)
		if ((rv = check_setting(call, req->set[i]->key,
		         req->set[i]->value)) != MOAT_OK)
			return rv;
	for (size_t i = 0; i < req->n_unset; i++)
		if ((rv = check_setting(call, req->unset[i], "-")) != MOAT_OK)
			return rv;
	return MOAT_OK;
}

int
sessiond_h_set_tenant(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__SetTenantRequest *req =
	    (const Moat__V1__SetTenantRequest *)request;
	Moat__V1__TenantInfo t = MOAT__V1__TENANT_INFO__INIT, *old = NULL;
	Setting slots[SETTINGS_MAX], *ptrs[SETTINGS_MAX];
	struct moat_store_txn *txn = NULL;
	uint8_t *packed = NULL;
	size_t len;
	char *errmsg = NULL;
	int rv;

	if ((rv = check_set(call, req)) != MOAT_OK)
		return rv;
	if ((rv = moat_store_txn_begin(sd->keys, true, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = load(txn, req->tenant, &old, &errmsg);
	if (rv == MOAT_NOT_FOUND) {
		free(errmsg);
		errmsg = NULL;
		rv = MOAT_OK;
	}
	t.name = req->tenant;
	t.updated_unix_ms = moat_now_unix_ms();
	t.created_unix_ms =
	    old != NULL ? old->created_unix_ms : t.updated_unix_ms;
	if (rv == MOAT_OK &&
	    (rv = merge(call, old, req, &t, slots, ptrs)) != MOAT_OK) {
		moat_store_txn_abort(txn);
		moat__v1__tenant_info__free_unpacked(old, NULL);
		return rv;
	}
	if (rv == MOAT_OK && (packed = sessiond_pack(&t.base, &len)) == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	if (rv == MOAT_OK)
		rv = moat_store_put(txn, DB_TENANTS, t.name, strlen(t.name),
		    packed, len, false, &errmsg);
	free(packed);
	if (rv == MOAT_OK)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	if (rv == MOAT_OK)
		rv = copy_out(&t, (Moat__V1__TenantInfo *)reply);
	if (old != NULL)
		moat__v1__tenant_info__free_unpacked(old, NULL);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}

/* get_or_delete: GetTenant, or with `del` DeleteTenant. */
static int
get_or_delete(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply, bool del)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__GetTenantRequest *req =
	    (const Moat__V1__GetTenantRequest *)request;
	Moat__V1__TenantInfo *t = NULL;
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	int rv;

	if ((rv = sessiond_check_tenant_name(call, req->tenant)) != MOAT_OK)
		return rv;
	if ((rv = moat_store_txn_begin(sd->keys, del, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = load(txn, req->tenant, &t, &errmsg);
	if (rv == MOAT_OK && del &&
	    (rv = moat_store_del(txn, DB_TENANTS, req->tenant,
	         strlen(req->tenant), &errmsg)) == MOAT_OK)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	if (rv == MOAT_OK)
		rv = copy_out(t, (Moat__V1__TenantInfo *)reply);
	if (t != NULL)
		moat__v1__tenant_info__free_unpacked(t, NULL);
	if (rv == MOAT_NOT_FOUND) {
		free(errmsg);
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "tenant %s has no settings (the config file's apply): "
		    "`moat-gateway tenants ls` lists those that have",
		    req->tenant);
	}
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}

int
sessiond_h_get_tenant(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	return get_or_delete(call, request, reply, false);
}

int
sessiond_h_delete_tenant(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	return get_or_delete(call, request, reply, true);
}

struct list_ctx {
	Moat__V1__ListTenantsReply *out;
	size_t cap;
};

static int
list_one(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
	struct list_ctx *c = arg;
	Moat__V1__TenantInfo *t =
	    moat__v1__tenant_info__unpack(NULL, vlen, val);
	Moat__V1__TenantInfo **grown;

	(void)key;
	(void)klen;
	if (t == NULL)
		return MOAT_OK; /* unreadable: skipped */
	if (c->out->n_tenants == LIST_MAX) {
		moat__v1__tenant_info__free_unpacked(t, NULL);
		return MOAT_STORE_SCAN_STOP;
	}
	if (c->out->n_tenants == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 16;
		if ((grown = realloc(c->out->tenants,
		         c->cap * sizeof(*grown))) == NULL) {
			moat__v1__tenant_info__free_unpacked(t, NULL);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		c->out->tenants = grown;
	}
	c->out->tenants[c->out->n_tenants++] = t;
	return MOAT_OK;
}

int
sessiond_h_list_tenants(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	struct list_ctx c = { .out = (Moat__V1__ListTenantsReply *)reply };
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	int rv;

	(void)request;
	if ((rv = moat_store_txn_begin(sd->keys, false, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = moat_store_scan(txn, DB_TENANTS, NULL, 0, NULL, 0, list_one, &c,
	    &errmsg);
	moat_store_txn_abort(txn);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}
