/*
 * test_audit.c: moat-sessiond's audit log for the gateways (issue 15,
 * services/session/audit.c) over RPC on the real binary: AppendAudit of
 * several tenants, ListAuditLog gives a tenant's newest entries oldest
 * first (two at the same microsecond both kept); retention drops entries
 * older than audit-max-age-s and the oldest past audit-max-bytes; bad
 * requests refused; entries survive a SIGKILL.
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
#include "moat/util.h"

/* append: one call with n entries of `tenant` at us, us+1, ... */
static int
append(struct ses_proc *p, const char *tenant, uint64_t us, size_t n,
    const char *json, char **err)
{
	Moat__V1__AppendAuditRequest req =
	    MOAT__V1__APPEND_AUDIT_REQUEST__INIT;
	Moat__V1__AuditLogEntry *e = calloc(n ? n : 1, sizeof(*e));
	Moat__V1__AuditLogEntry **v = calloc(n ? n : 1, sizeof(*v));
	ProtobufCMessage *r = NULL;
	int rv;

	assert_non_null(e);
	assert_non_null(v);
	for (size_t i = 0; i < n; i++) {
		moat__v1__audit_log_entry__init(&e[i]);
		e[i].tenant = (char *)tenant;
		e[i].at_unix_us = us + i;
		e[i].json = (char *)json;
		v[i] = &e[i];
	}
	req.entries = v;
	req.n_entries = n;
	rv = ses_call(p, "AppendAudit", &req.base,
	    &moat__v1__append_audit_reply__descriptor, &r, err);
	if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	free(v);
	free(e);
	return rv;
}

static Moat__V1__ListAuditLogReply *
list(struct ses_proc *p, const char *tenant, uint32_t limit)
{
	Moat__V1__ListAuditLogRequest req =
	    MOAT__V1__LIST_AUDIT_LOG_REQUEST__INIT;
	Moat__V1__ListAuditLogReply *r = NULL;

	req.tenant = (char *)tenant;
	req.limit = limit;
	assert_int_equal(ses_call_as(p, tenant, "ListAuditLog", &req.base,
	                     &moat__v1__list_audit_log_reply__descriptor,
	                     (ProtobufCMessage **)&r, NULL),
	    MOAT_OK);
	return r;
}

static void
append_list(void **state)
{
	struct ses_proc *p = *state;
	uint64_t now = moat_now_unix_ms() * 1000;
	Moat__V1__ListAuditLogReply *r;
	char *err = NULL;
	int rv;

	assert_int_equal(append(p, "acme", now, 3, "{\"m\":\"a\"}", NULL),
	    MOAT_OK);
	assert_int_equal(append(p, "zeta", now, 2, "{\"m\":\"z\"}", NULL),
	    MOAT_OK);
	/* Same tenant, same microsecond as the first: kept, moved on. */
	assert_int_equal(append(p, "acme", now, 1, "{\"m\":\"b\"}", NULL),
	    MOAT_OK);
	r = list(p, "acme", 1000);
	assert_int_equal(r->n_entries, 4);
	assert_string_equal(r->entries[0]->json, "{\"m\":\"a\"}");
	assert_string_equal(r->entries[3]->json, "{\"m\":\"b\"}");
	assert_string_equal(r->entries[3]->tenant, "acme");
	assert_true(r->entries[3]->at_unix_us > r->entries[2]->at_unix_us);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	r = list(p, "acme", 2); /* the newest 2, oldest first */
	assert_int_equal(r->n_entries, 2);
	assert_int_equal(r->entries[0]->at_unix_us, now + 2);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	r = list(p, "zeta", 10);
	assert_int_equal(r->n_entries, 2);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	r = list(p, "nobody", 10);
	assert_int_equal(r->n_entries, 0);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	/* Bad requests. */
	rv = append(p, "", now, 1, "{}", &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "needs a tenant");
	err = NULL;
	rv = append(p, "acme", 0, 1, "{}", &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "at_unix_us");
	{
		Moat__V1__ListAuditLogRequest req =
		    MOAT__V1__LIST_AUDIT_LOG_REQUEST__INIT;
		ProtobufCMessage *out = NULL;

		err = NULL;
		req.tenant = "acme";
		req.limit = 0;
		rv = ses_call(p, "ListAuditLog", &req.base,
		    &moat__v1__list_audit_log_reply__descriptor, &out, &err);
		ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "limit must be");
	}
	/* Survives a SIGKILL. */
	ses_kill(p, SIGKILL);
	ses_start(p, NULL);
	r = list(p, "acme", 1000);
	assert_int_equal(r->n_entries, 4);
	protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void
restart_with(struct ses_proc *p, const char *age, const char *bytes)
{
	ses_stop(p);
	memset(p, 0, sizeof(*p));
	setenv("MOAT_SESSIOND_AUDIT_MAX_AGE_S", age, 1);
	setenv("MOAT_SESSIOND_AUDIT_MAX_BYTES", bytes, 1);
	ses_start(p, NULL);
	unsetenv("MOAT_SESSIOND_AUDIT_MAX_AGE_S");
	unsetenv("MOAT_SESSIOND_AUDIT_MAX_BYTES");
}

static void
retention_age(void **state)
{
	struct ses_proc *p = *state;
	uint64_t now = moat_now_unix_ms() * 1000;
	Moat__V1__ListAuditLogReply *r;

	restart_with(p, "60", "1048576");
	/* Two 2 minutes old, then one now: the append drops the old. */
	assert_int_equal(append(p, "acme", now - 120000000ull, 2, "{\"o\":1}",
	                     NULL),
	    MOAT_OK);
	assert_int_equal(append(p, "acme", now, 1, "{\"n\":1}", NULL),
	    MOAT_OK);
	r = list(p, "acme", 100);
	assert_int_equal(r->n_entries, 1);
	assert_string_equal(r->entries[0]->json, "{\"n\":1}");
	protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void
retention_size(void **state)
{
	struct ses_proc *p = *state;
	uint64_t now = moat_now_unix_ms() * 1000;
	Moat__V1__ListAuditLogReply *r;
	char json[101];
	size_t per = 4 + 1 + 8 + 100; /* "acme" NUL time, then the JSON */

	restart_with(p, "0", "4096");
	memset(json, 'x', 100);
	json[100] = '\0';
	for (int i = 0; i < 10; i++)
		assert_int_equal(append(p, "acme", now + (uint64_t)i * 100, 10,
		                     json, NULL),
		    MOAT_OK);
	r = list(p, "acme", 1000);
	/* 100 appended; what is kept fits 4096 bytes, the newest kept. */
	assert_true(r->n_entries * per <= 4096);
	assert_true(r->n_entries >= 4096 / per - 1);
	assert_int_equal(r->entries[r->n_entries - 1]->at_unix_us,
	    now + 9 * 100 + 9);
	protobuf_c_message_free_unpacked(&r->base, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(append_list),
		SES_CASE(retention_age),
		SES_CASE(retention_size),
	};

	return cmocka_run_group_tests(tests, NULL, ses_reap_all);
}
