/*
 * test_mcp_sessions.c: moat-sessiond's store of the gateways' MCP
 * sessions (issue 15, services/session/mcp_sessions.c) over RPC on the
 * real binary: put then get returns the record (its creation time kept
 * across puts, its used time moved); another tenant's session is
 * NOT_FOUND and its id cannot be taken; delete returns the record, then
 * NOT_FOUND; malformed records are INVALID_ARGUMENT naming the field;
 * sessions survive a SIGKILL, are dropped after mcp-session-ttl-s unused
 * and the least recently used past mcp-sessions-max.
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

#define HASH "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* sid: the session id of number n (32 hex digits). */
static const char *
sid(int n)
{
	static char ids[8][33];

	snprintf(ids[n % 8], sizeof(ids[0]), "%032x", n);
	return ids[n % 8];
}

static int
put(struct ses_proc *p, const char *tenant, const char *id,
    const char *sandbox, const char *hash, Moat__V1__McpSessionRecord **out,
    char **err)
{
	Moat__V1__PutMcpSessionRequest req =
	    MOAT__V1__PUT_MCP_SESSION_REQUEST__INIT;
	Moat__V1__McpSessionRecord r = MOAT__V1__MCP_SESSION_RECORD__INIT;
	ProtobufCMessage *got = NULL;
	int rv;

	r.id = (char *)id;
	r.tenant = (char *)tenant;
	r.authz_sha256 = (char *)hash;
	r.version = (char *)"2025-06-18";
	r.initialized = true;
	r.default_sandbox = (char *)sandbox;
	req.session = &r;
	req.tenant = (char *)tenant;
	rv = ses_call_as(p, tenant, "PutMcpSession", &req.base,
	    &moat__v1__mcp_session_record__descriptor, &got, err);
	if (out != NULL)
		*out = (Moat__V1__McpSessionRecord *)got;
	else if (got != NULL)
		protobuf_c_message_free_unpacked(got, NULL);
	return rv;
}

/* get: GetMcpSession, or DeleteMcpSession (`method`). */
static int
get(struct ses_proc *p, const char *method, const char *tenant, const char *id,
    Moat__V1__McpSessionRecord **out, char **err)
{
	Moat__V1__GetMcpSessionRequest req =
	    MOAT__V1__GET_MCP_SESSION_REQUEST__INIT;
	ProtobufCMessage *got = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.id = (char *)id;
	rv = ses_call_as(p, tenant, method, &req.base,
	    &moat__v1__mcp_session_record__descriptor, &got, err);
	if (out != NULL)
		*out = (Moat__V1__McpSessionRecord *)got;
	else if (got != NULL)
		protobuf_c_message_free_unpacked(got, NULL);
	return rv;
}

static void
put_get_delete(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__McpSessionRecord *r = NULL;
	uint64_t created;
	char *err = NULL;
	int rv;

	assert_int_equal(put(p, "acme", sid(1), "", HASH, &r, NULL), MOAT_OK);
	created = r->created_unix_ms;
	assert_true(created > 0);
	assert_int_equal(r->used_unix_ms, created);
	moat__v1__mcp_session_record__free_unpacked(r, NULL);
	usleep(20 * 1000);
	assert_int_equal(put(p, "acme", sid(1), "sb-1", HASH, NULL, NULL),
	    MOAT_OK);
	assert_int_equal(get(p, "GetMcpSession", "acme", sid(1), &r, NULL),
	    MOAT_OK);
	assert_string_equal(r->tenant, "acme");
	assert_string_equal(r->authz_sha256, HASH);
	assert_string_equal(r->version, "2025-06-18");
	assert_true(r->initialized);
	assert_string_equal(r->default_sandbox, "sb-1");
	assert_int_equal(r->created_unix_ms, created);
	assert_true(r->used_unix_ms > created);
	moat__v1__mcp_session_record__free_unpacked(r, NULL);

	/* Another tenant: as if absent, and its id is not for taking. */
	rv = get(p, "GetMcpSession", "zeta", sid(1), NULL, &err);
	ses_expect(rv, err, MOAT_NOT_FOUND, "initialize a new one");
	err = NULL;
	rv = put(p, "zeta", sid(1), "", HASH, NULL, &err);
	ses_expect(rv, err, MOAT_ALREADY_EXISTS, "another tenant's");
	err = NULL;
	rv = get(p, "DeleteMcpSession", "zeta", sid(1), NULL, &err);
	ses_expect(rv, err, MOAT_NOT_FOUND, "no MCP session");

	/* Malformed. */
	err = NULL;
	rv = put(p, "acme", "nothex", "", HASH, NULL, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "not an MCP session id");
	err = NULL;
	rv = put(p, "acme", sid(2), "", "short", NULL, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "authz_sha256");
	err = NULL;
	rv = get(p, "GetMcpSession", "acme", "", NULL, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "Mcp-Session-Id");

	err = NULL;
	assert_int_equal(get(p, "DeleteMcpSession", "acme", sid(1), &r, NULL),
	    MOAT_OK);
	assert_string_equal(r->default_sandbox, "sb-1");
	moat__v1__mcp_session_record__free_unpacked(r, NULL);
	rv = get(p, "GetMcpSession", "acme", sid(1), NULL, &err);
	ses_expect(rv, err, MOAT_NOT_FOUND, "ended, expired");
}

static void
ttl_bound_and_restart(void **state)
{
	struct ses_proc *p = *state;

	ses_stop(p);
	memset(p, 0, sizeof(*p));
	setenv("MOAT_SESSIOND_MCP_SESSION_TTL_S", "3", 1);
	setenv("MOAT_SESSIOND_MCP_SESSIONS_MAX", "3", 1);
	ses_start(p, NULL);
	for (int i = 1; i <= 3; i++)
		assert_int_equal(put(p, "t", sid(i), "", HASH, NULL, NULL),
		    MOAT_OK);
	/* Survives a SIGKILL. */
	ses_kill(p, SIGKILL);
	ses_start(p, NULL);
	assert_int_equal(get(p, "GetMcpSession", "t", sid(1), NULL, NULL),
	    MOAT_OK);
	/* Session 1 used again: 2 is now the least recently used, and a
	 * 4th pushes it out (max 3). */
	assert_int_equal(put(p, "t", sid(1), "", HASH, NULL, NULL), MOAT_OK);
	assert_int_equal(put(p, "t", sid(4), "", HASH, NULL, NULL), MOAT_OK);
	assert_int_equal(get(p, "GetMcpSession", "t", sid(2), NULL, NULL),
	    MOAT_NOT_FOUND);
	assert_int_equal(get(p, "GetMcpSession", "t", sid(1), NULL, NULL),
	    MOAT_OK);
	/* Unused for the TTL: gone, even before a sweep. */
	usleep(3200 * 1000);
	assert_int_equal(get(p, "GetMcpSession", "t", sid(4), NULL, NULL),
	    MOAT_NOT_FOUND);
	unsetenv("MOAT_SESSIOND_MCP_SESSION_TTL_S");
	unsetenv("MOAT_SESSIOND_MCP_SESSIONS_MAX");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(put_get_delete),
		SES_CASE(ttl_bound_and_restart),
	};

	return cmocka_run_group_tests(tests, NULL, ses_reap_all);
}
