/*
 * test_keys.c: moat-sessiond's API keys (issue 15, services/session/
 * keys.c) over RPC on the real binary: CreateKey then VerifyKey gives the
 * tenant, hash and created time; CreateKey again with the same tenant and
 * hash is an import (idempotent, revoked carries over and never back),
 * with another hash ALREADY_EXISTS; RevokeKey (twice is fine); ListKeys
 * by tenant; unknown ids NOT_FOUND; bad ids, hashes and tenants refused
 * with what to do; keys survive a SIGKILL.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "moat/status.h"

#define H1 "1111111111111111111111111111111111111111111111111111111111111111"
#define H2 "2222222222222222222222222222222222222222222222222222222222222222"

static int
create(struct ses_proc *p, const char *tenant, const char *id,
    const char *hash, bool revoked, char **err)
{
	Moat__V1__CreateKeyRequest req = MOAT__V1__CREATE_KEY_REQUEST__INIT;
	ProtobufCMessage *r = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.key_id = (char *)id;
	req.sha256 = (char *)hash;
	req.created_unix_ms = 1000;
	req.revoked = revoked;
	rv = ses_call(p, "CreateKey", &req.base,
	    &moat__v1__key_info__descriptor, &r, err);
	if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	return rv;
}

/* get: VerifyKey; *out on MOAT_OK (caller frees). */
static int
get(struct ses_proc *p, const char *id, Moat__V1__KeyInfo **out, char **err)
{
	Moat__V1__VerifyKeyRequest req = MOAT__V1__VERIFY_KEY_REQUEST__INIT;

	req.key_id = (char *)id;
	return ses_call(p, "VerifyKey", &req.base,
	    &moat__v1__key_info__descriptor, (ProtobufCMessage **)out, err);
}

static int
key_revoke(struct ses_proc *p, const char *id, char **err)
{
	Moat__V1__RevokeKeyRequest req = MOAT__V1__REVOKE_KEY_REQUEST__INIT;
	ProtobufCMessage *r = NULL;
	int rv;

	req.key_id = (char *)id;
	rv = ses_call(p, "RevokeKey", &req.base,
	    &moat__v1__key_info__descriptor, &r, err);
	if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	return rv;
}

static size_t
count(struct ses_proc *p, const char *tenant)
{
	Moat__V1__ListKeysRequest req = MOAT__V1__LIST_KEYS_REQUEST__INIT;
	Moat__V1__ListKeysReply *r = NULL;
	size_t n;

	req.tenant = (char *)tenant;
	assert_int_equal(ses_call(p, "ListKeys", &req.base,
	                     &moat__v1__list_keys_reply__descriptor,
	                     (ProtobufCMessage **)&r, NULL),
	    MOAT_OK);
	n = r->n_keys;
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return n;
}

static void
create_verify_revoke(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__KeyInfo *k = NULL;
	char *err = NULL;
	int rv;

	assert_int_equal(create(p, "acme", "0123456789ab", H1, false, NULL),
	    MOAT_OK);
	assert_int_equal(create(p, "zeta", "bbbbbbbbbbbb", H2, false, NULL),
	    MOAT_OK);
	assert_int_equal(get(p, "0123456789ab", &k, NULL), MOAT_OK);
	assert_string_equal(k->tenant, "acme");
	assert_string_equal(k->sha256, H1);
	assert_false(k->revoked);
	assert_int_equal(k->created_unix_ms, 1000);
	protobuf_c_message_free_unpacked(&k->base, NULL);
	/* The same key again: an import, nothing changes. */
	assert_int_equal(create(p, "acme", "0123456789ab", H1, false, NULL),
	    MOAT_OK);
	/* Another secret under that id: refused. */
	assert_int_equal(create(p, "acme", "0123456789ab", H2, false, &err),
	    MOAT_ALREADY_EXISTS);
	ses_expect(MOAT_ALREADY_EXISTS, err, MOAT_ALREADY_EXISTS,
	    "make a new key");
	err = NULL;
	assert_int_equal(count(p, ""), 2);
	assert_int_equal(count(p, "acme"), 1);
	assert_int_equal(count(p, "nobody"), 0);
	/* Revoke; again is fine; an import never brings it back. */
	assert_int_equal(key_revoke(p, "0123456789ab", NULL), MOAT_OK);
	assert_int_equal(key_revoke(p, "0123456789ab", NULL), MOAT_OK);
	assert_int_equal(create(p, "acme", "0123456789ab", H1, false, NULL),
	    MOAT_OK);
	assert_int_equal(get(p, "0123456789ab", &k, NULL), MOAT_OK);
	assert_true(k->revoked);
	assert_true(k->revoked_unix_ms > 0);
	protobuf_c_message_free_unpacked(&k->base, NULL);
	/* An import of a revoked key revokes it. */
	assert_int_equal(create(p, "zeta", "bbbbbbbbbbbb", H2, true, NULL),
	    MOAT_OK);
	assert_int_equal(get(p, "bbbbbbbbbbbb", &k, NULL), MOAT_OK);
	assert_true(k->revoked);
	protobuf_c_message_free_unpacked(&k->base, NULL);
	/* Unknown ids. */
	rv = get(p, "cccccccccccc", &k, &err);
	ses_expect(rv, err, MOAT_NOT_FOUND, "no key cccccccccccc");
	err = NULL;
	rv = key_revoke(p, "cccccccccccc", &err);
	ses_expect(rv, err, MOAT_NOT_FOUND, "keys ls");
}

static void
bad_input(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__KeyInfo *k = NULL;
	char *err = NULL;
	int rv;

	rv = create(p, "acme", "short", H1, false, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "not a key id");
	err = NULL;
	rv = create(p, "acme", "0123456789AB", H1, false, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "12 lowercase hex");
	err = NULL;
	rv = create(p, "acme", "0123456789ab", "abc", false, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "SHA-256");
	err = NULL;
	rv = create(p, "bad name!", "0123456789ab", H1, false, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "is not a name");
	err = NULL;
	rv = create(p, "", "0123456789ab", H1, false, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "is not a name");
	err = NULL;
	rv = get(p, "", &k, &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "not a key id");
	err = NULL;
	rv = key_revoke(p, "../../etc/pw", &err);
	ses_expect(rv, err, MOAT_INVALID_ARGUMENT, "not a key id");
}

static void
survive_kill(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__KeyInfo *k = NULL;

	assert_int_equal(create(p, "acme", "aaaaaaaaaaaa", H1, false, NULL),
	    MOAT_OK);
	assert_int_equal(key_revoke(p, "aaaaaaaaaaaa", NULL), MOAT_OK);
	assert_int_equal(create(p, "acme", "dddddddddddd", H2, false, NULL),
	    MOAT_OK);
	ses_kill(p, SIGKILL);
	ses_start(p, NULL);
	assert_int_equal(get(p, "aaaaaaaaaaaa", &k, NULL), MOAT_OK);
	assert_true(k->revoked);
	protobuf_c_message_free_unpacked(&k->base, NULL);
	assert_int_equal(get(p, "dddddddddddd", &k, NULL), MOAT_OK);
	assert_false(k->revoked);
	protobuf_c_message_free_unpacked(&k->base, NULL);
	assert_int_equal(count(p, "acme"), 2);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(create_verify_revoke),
		SES_CASE(bad_input),
		SES_CASE(survive_kill),
	};

	return cmocka_run_group_tests(tests, NULL, ses_reap_all);
}
