/*
 * test_tenants.c: moat-sessiond's store of tenants' own settings (issue
 * 15, services/session/tenants.c) over RPC on the real binary: SetTenant
 * makes a tenant, a later one replaces and adds settings and keeps the
 * rest (its creation time too), unset removes; Get, List and Delete;
 * malformed names, keys and values are INVALID_ARGUMENT naming what is
 * wrong; an unknown tenant is NOT_FOUND saying the config file's values
 * apply; settings survive a SIGKILL.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "moat/status.h"

/* set: SetTenant of `tenant` with "key=value" words in `set` (NULL
 * ended) and keys in `unset` (NULL ended). */
static int
set(struct ses_proc *p, const char *tenant, const char *const *set,
    const char *const *unset, Moat__V1__TenantInfo **out, char **err)
{
	Moat__V1__SetTenantRequest req = MOAT__V1__SET_TENANT_REQUEST__INIT;
	Moat__V1__SetTenantRequest__SetEntry e[8], *ep[8];
	char words[8][64];
	ProtobufCMessage *got = NULL;
	int rv;

	for (size_t i = 0; set != NULL && set[i] != NULL; i++) {
		char *eq;

		snprintf(words[i], sizeof(words[i]), "%s", set[i]);
		eq = strchr(words[i], '=');
		*eq = '\0';
		moat__v1__set_tenant_request__set_entry__init(&e[i]);
		e[i].key = words[i];
		e[i].value = eq + 1;
		ep[i] = &e[i];
		req.n_set = i + 1;
	}
	req.set = ep;
	for (size_t i = 0; unset != NULL && unset[i] != NULL; i++)
		req.n_unset = i + 1;
	req.unset = (char **)unset;
	req.tenant = (char *)tenant;
	rv = ses_call(p, "SetTenant", &req.base,
	    &moat__v1__tenant_info__descriptor, &got, err);
	if (out != NULL)
		*out = (Moat__V1__TenantInfo *)got;
	else if (got != NULL)
		protobuf_c_message_free_unpacked(got, NULL);
	return rv;
}

static int
get(struct ses_proc *p, const char *method, const char *tenant,
    Moat__V1__TenantInfo **out, char **err)
{
	Moat__V1__GetTenantRequest req = MOAT__V1__GET_TENANT_REQUEST__INIT;
	ProtobufCMessage *got = NULL;
	int rv;

	req.tenant = (char *)tenant;
	rv = ses_call(p, method, &req.base, &moat__v1__tenant_info__descriptor,
	    &got, err);
	if (out != NULL)
		*out = (Moat__V1__TenantInfo *)got;
	else if (got != NULL)
		protobuf_c_message_free_unpacked(got, NULL);
	return rv;
}

/* value: the value of `key` in t, or NULL. */
static const char *
value(const Moat__V1__TenantInfo *t, const char *key)
{
	for (size_t i = 0; i < t->n_settings; i++)
		if (strcmp(t->settings[i]->key, key) == 0)
			return t->settings[i]->value;
	return NULL;
}

static void
set_get_list_delete(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__TenantInfo *t = NULL;
	Moat__V1__ListTenantsRequest lr = MOAT__V1__LIST_TENANTS_REQUEST__INIT;
	Moat__V1__ListTenantsReply *all = NULL;
	uint64_t created;
	char *err = NULL;
	int rv;

	assert_int_equal(set(p, "acme",
	                     (const char *const[]){ "max-sandboxes=5",
	                         "key-rps=10", NULL },
	                     NULL, &t, NULL),
	    MOAT_OK);
	created = t->created_unix_ms;
	assert_true(created > 0);
	assert_int_equal(t->n_settings, 2);
	moat__v1__tenant_info__free_unpacked(t, NULL);
	usleep(10 * 1000);
	assert_int_equal(set(p, "acme",
	                     (const char *const[]){ "max-sandboxes=7",
	                         "timeout-s=60", NULL },
	                     (const char *const[]){ "key-rps", NULL }, &t,
	                     NULL),
	    MOAT_OK);
	assert_int_equal(t->n_settings, 2);
	assert_string_equal(value(t, "max-sandboxes"), "7");
	assert_string_equal(value(t, "timeout-s"), "60");
	assert_null(value(t, "key-rps"));
	assert_int_equal(t->created_unix_ms, created);
	assert_true(t->updated_unix_ms > created);
	moat__v1__tenant_info__free_unpacked(t, NULL);
	assert_int_equal(set(p, "zeta",
	                     (const char *const[]){ "max-vcpus=4", NULL },
	                     NULL, NULL, NULL),
	    MOAT_OK);

	/* Survives a SIGKILL. */
	ses_kill(p, SIGKILL);
	ses_start(p, NULL);
	assert_int_equal(get(p, "GetTenant", "acme", &t, NULL), MOAT_OK);
	assert_string_equal(value(t, "max-sandboxes"), "7");
	moat__v1__tenant_info__free_unpacked(t, NULL);
	assert_int_equal(ses_call(p, "ListTenants", &lr.base,
	                     &moat__v1__list_tenants_reply__descriptor,
	                     (ProtobufCMessage **)&all, NULL),
	    MOAT_OK);
	assert_int_equal(all->n_tenants, 2);
	assert_string_equal(all->tenants[0]->name, "acme");
	assert_string_equal(all->tenants[1]->name, "zeta");
	moat__v1__list_tenants_reply__free_unpacked(all, NULL);

	assert_int_equal(get(p, "DeleteTenant", "acme", &t, NULL), MOAT_OK);
	assert_string_equal(value(t, "timeout-s"), "60");
	moat__v1__tenant_info__free_unpacked(t, NULL);
	rv = get(p, "GetTenant", "acme", NULL, &err);
	ses_expect(rv, err, MOAT_NOT_FOUND, "config file's apply");
}

static void
bad_requests(void **state)
{
	struct ses_proc *p = *state;
	char *err = NULL;
	int rv;

	rv = set(p, "bad name!", (const char *const[]){ "key-rps=1", NULL },
	    NULL, NULL, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "is not a name");
	err = NULL;
	rv = set(p, "acme", (const char *const[]){ "Max_Sandboxes=1", NULL },
	    NULL, NULL, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "is not a [tenants] key");
	err = NULL;
	rv = set(p, "acme", (const char *const[]){ "key-rps=", NULL }, NULL,
	    NULL, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "printable characters");
	err = NULL;
	rv = get(p, "DeleteTenant", "nobody", NULL, &err);
	ses_expect(rv, err, MOAT_NOT_FOUND, "tenants ls");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(set_get_list_delete),
		SES_CASE(bad_requests),
	};

	return cmocka_run_group_tests(tests, NULL, ses_reap_all);
}
