/*
 * test_quota.c: moat-sessiond's table of the gateways' quota
 * reservations (issue 15, services/session/quota.c) over RPC on the real
 * binary: each limit (sandboxes, vcpus, memory) refuses with
 * RESOURCE_EXHAUSTED naming its [tenants] key; reservations of one
 * gateway count against another's; a landed reservation counts its
 * sandbox for every caller whose listed ids do not contain it (a
 * gateway whose survey has not seen it yet) and for none once it was
 * destroyed (ReleaseQuota by id); a released or expired one frees its
 * share; other tenants' do not
 * count; a full table says to retry; bad fields are INVALID_ARGUMENT
 * naming the field; a handle is its tenant's only.
 */
#include <setjmp.h>
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

/* EXPECT: `expr` (which sets err) failed with `code`, its message
 * mentioning `needle` (err freed). */
#define EXPECT(expr, code, needle)                                            \
	do {                                                                  \
		int rv_ = (expr);                                             \
		ses_expect(rv_, err, code, needle);                           \
		err = NULL;                                                   \
	} while (0)

/* One ReserveQuota: `count` of (vcpus, memory) against max[3], with the
 * caller's inventory `listed` (sandboxes, vcpus, memory) and `ids`. */
struct ask {
	const char *tenant;
	uint32_t count, vcpus, memory_mib, pending_ms;
	uint64_t max[3], listed[3];
	const char *const *ids;
	size_t n_ids;
};

static int
reserve(struct ses_proc *p, const struct ask *a, uint64_t *handle, char **err)
{
	Moat__V1__ReserveQuotaRequest req =
	    MOAT__V1__RESERVE_QUOTA_REQUEST__INIT;
	ProtobufCMessage *got = NULL;
	int rv;

	req.tenant = (char *)a->tenant;
	req.count = a->count;
	req.vcpus = a->vcpus;
	req.memory_mib = a->memory_mib;
	req.pending_ms = a->pending_ms;
	req.max_sandboxes = a->max[0];
	req.max_vcpus = a->max[1];
	req.max_memory_mib = a->max[2];
	req.listed_sandboxes = a->listed[0];
	req.listed_vcpus = a->listed[1];
	req.listed_memory_mib = a->listed[2];
	req.listed_ids = (char **)a->ids;
	req.n_listed_ids = a->n_ids;
	rv = ses_call(p, "ReserveQuota", &req.base,
	    &moat__v1__reserve_quota_reply__descriptor, &got, err);
	if (rv == MOAT_OK && handle != NULL)
		*handle = ((Moat__V1__ReserveQuotaReply *)got)->handle;
	if (got != NULL)
		protobuf_c_message_free_unpacked(got, NULL);
	return rv;
}

static int
finish(struct ses_proc *p, const char *method, const char *tenant,
    uint64_t handle, const char *const *ids, size_t n, char **err)
{
	Moat__V1__LandQuotaRequest land = MOAT__V1__LAND_QUOTA_REQUEST__INIT;
	Moat__V1__ReleaseQuotaRequest rel =
	    MOAT__V1__RELEASE_QUOTA_REQUEST__INIT;
	ProtobufCMessage *got = NULL;
	bool is_land = strcmp(method, "LandQuota") == 0;
	int rv;

	land.tenant = rel.tenant = (char *)tenant;
	land.handle = rel.handle = handle;
	land.sandbox_ids = rel.sandbox_ids = (char **)ids;
	land.n_sandbox_ids = rel.n_sandbox_ids = n;
	rv = ses_call(p, method, is_land ? &land.base : &rel.base,
	    &moat__v1__quota_reply__descriptor, &got, err);
	if (got != NULL)
		protobuf_c_message_free_unpacked(got, NULL);
	return rv;
}

/* one: a sandbox of 1 vcpu and 256 MiB for tenant t, max-sandboxes
 * `max` (vcpus and memory unlimited). */
static struct ask
one(uint64_t max)
{
	return (struct ask){ .tenant = "t",
		.count = 1,
		.vcpus = 1,
		.memory_mib = 256,
		.max = { max, 0, 0 } };
}

static void
limits_per_field(void **state)
{
	struct ses_proc *p = *state;
	struct ask a = one(3);
	char *err = NULL;

	/* The inventory counts 2: one more passes, the next is refused,
	 * counting the reservation made a moment ago. */
	a.listed[0] = 2;
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "(moat-gateway tenants set t max-sandboxes=N)");
	/* Another tenant's reservations are not counted. */
	a.tenant = "u";
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	/* vcpus: 4 held + 2 x 2 asked > 7. */
	a = (struct ask){ .tenant = "v",
		.count = 2,
		.vcpus = 2,
		.memory_mib = 256,
		.max = { 0, 7, 0 },
		.listed = { 2, 4, 512 } };
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "asked for 4 more, its limit is 7 ([tenants] max-vcpus.v");
	a.count = 1;
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	/* memory: 512 listed + 2048 reserved... */
	a = (struct ask){ .tenant = "w",
		.count = 1,
		.vcpus = 1,
		.memory_mib = 2048,
		.max = { 0, 0, 4096 },
		.listed = { 1, 1, 512 } };
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "max-memory-mib.w");
	/* 0 is unlimited. */
	a.max[2] = 0;
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
}

static void
listed_dedupe_and_release(void **state)
{
	struct ses_proc *p = *state;
	struct ask a = one(2);
	const char *ids[] = { "sb-1" };
	uint64_t h1 = 0, h2 = 0;
	char *err = NULL;

	assert_int_equal(reserve(p, &a, &h1, NULL), MOAT_OK);
	assert_int_equal(reserve(p, &a, &h2, NULL), MOAT_OK);
	assert_true(h1 != 0 && h2 != 0 && h1 != h2);
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "max-sandboxes");
	/* Released: its share is free again. */
	assert_int_equal(finish(p, "ReleaseQuota", "t", h2, NULL, 0, NULL),
	    MOAT_OK);
	EXPECT(finish(p, "ReleaseQuota", "t", h2, NULL, 0, &err),
	    MOAT_NOT_FOUND, "no quota reservation");
	assert_int_equal(reserve(p, &a, &h2, NULL), MOAT_OK);
	assert_int_equal(finish(p, "ReleaseQuota", "t", h2, NULL, 0, NULL),
	    MOAT_OK);
	/* h1 landed as sb-1: still counted while no inventory lists it. */
	EXPECT(finish(p, "LandQuota", "u", h1, ids, 1, &err), MOAT_NOT_FOUND,
	    "tenant u");
	assert_int_equal(finish(p, "LandQuota", "t", h1, ids, 1, NULL),
	    MOAT_OK);
	EXPECT(finish(p, "LandQuota", "t", h1, ids, 1, &err),
	    MOAT_FAILED_PRECONDITION, "landed already");
	a.max[0] = 1;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "has 1 sandboxes");
	/* A caller whose inventory lists sb-1 counts it once, not twice. */
	a.listed[0] = 1;
	a.ids = ids;
	a.n_ids = 1;
	a.max[0] = 2;
	assert_int_equal(reserve(p, &a, &h2, NULL), MOAT_OK);
	assert_int_equal(finish(p, "ReleaseQuota", "t", h2, NULL, 0, NULL),
	    MOAT_OK);
	/* Another gateway whose survey has not listed sb-1 yet still
	 * counts it: listed by one inventory is not listed by all. */
	a = one(1);
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "has 1 sandboxes");
	/* Destroyed (its id released by another tenant: not theirs). */
	assert_int_equal(finish(p, "ReleaseQuota", "u", 0, ids, 1, NULL),
	    MOAT_OK);
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "has 1 sandboxes");
	EXPECT(finish(p, "ReleaseQuota", "t", 0, NULL, 0, &err),
	    MOAT_INVALID_ARGUMENT, "ids of destroyed sandboxes");
	/* Destroyed by its tenant: counted by nobody, the quota free. */
	assert_int_equal(finish(p, "ReleaseQuota", "t", 0, ids, 1, NULL),
	    MOAT_OK);
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
}

static void
expiry_and_full(void **state)
{
	struct ses_proc *p = *state;
	struct ask a = one(1);
	char *err = NULL;

	/* Pending for 1 ms: gone by the next call after it. */
	a.pending_ms = 1;
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	usleep(20 * 1000);
	a.pending_ms = 0;
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED,
	    "max-sandboxes");
	/* The table holds 3 (MOAT_SESSIOND_QUOTA_RESERVATIONS_MAX). */
	a = one(0);
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	assert_int_equal(reserve(p, &a, NULL, NULL), MOAT_OK);
	EXPECT(reserve(p, &a, NULL, &err), MOAT_RESOURCE_EXHAUSTED, "retry");
}

static void
bad_input(void **state)
{
	struct ses_proc *p = *state;
	char long_id[300];
	const char *ids[] = { long_id };
	const char *empty[] = { "" };
	const char *two[] = { "a", "b" };
	struct ask a = one(1);
	uint64_t h = 0;
	char *err = NULL;

	memset(long_id, 'a', sizeof(long_id) - 1);
	long_id[sizeof(long_id) - 1] = '\0';
	a.tenant = "";
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT,
	    "tenant is required");
	a = one(1);
	a.count = 0;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT, "count 0");
	a = one(1);
	a.count = 5000;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT,
	    "count 5000");
	a = one(1);
	a.vcpus = 0;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT, "vcpus 0");
	a = one(1);
	a.memory_mib = 0;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT,
	    "memory_mib 0");
	a = one(1);
	a.pending_ms = 700000;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT,
	    "pending_ms 700000");
	a = one(1);
	a.ids = ids;
	a.n_ids = 1;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT,
	    "listed_sandboxes 0");
	a.listed[0] = 1;
	EXPECT(reserve(p, &a, NULL, &err), MOAT_INVALID_ARGUMENT,
	    "listed_ids");
	/* Land: ids checked, never more than reserved. */
	a = one(0);
	assert_int_equal(reserve(p, &a, &h, NULL), MOAT_OK);
	EXPECT(finish(p, "LandQuota", "t", h, empty, 1, &err),
	    MOAT_INVALID_ARGUMENT, "sandbox_ids[0] is empty");
	EXPECT(finish(p, "LandQuota", "t", h, ids, 1, &err),
	    MOAT_INVALID_ARGUMENT, "sandbox_ids");
	EXPECT(finish(p, "LandQuota", "t", h, two, 2, &err),
	    MOAT_FAILED_PRECONDITION, "at most 1 sandbox ids");
	EXPECT(finish(p, "ReleaseQuota", "t", h + 1, NULL, 0, &err),
	    MOAT_NOT_FOUND, "no quota reservation");
}

static int
small_table(void **state)
{
	setenv("MOAT_SESSIOND_QUOTA_RESERVATIONS_MAX", "3", 1);
	return ses_case_setup(state);
}

static int
small_table_done(void **state)
{
	unsetenv("MOAT_SESSIOND_QUOTA_RESERVATIONS_MAX");
	return ses_case_teardown(state);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(limits_per_field),
		SES_CASE(listed_dedupe_and_release),
		cmocka_unit_test_setup_teardown(expiry_and_full, small_table,
		    small_table_done),
		SES_CASE(bad_input),
	};

	return cmocka_run_group_tests(tests, NULL, ses_reap_all);
}
