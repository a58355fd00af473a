/*
 * test_sha256.c: the agent's own SHA-256 (guest/agent/sha256.c) against
 * the FIPS 180-4 / NIST example vectors, against OpenSSL on many lengths
 * (every padding case around the 56- and 64-byte block edges), and fed
 * in odd pieces. Not for: the fs trace that uses it (test_trace.c).
 */
#include <openssl/sha.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sha256.h"

static void
hex(const uint8_t *d, char *out)
{
	int i;

	for (i = 0; i < AGENT_SHA256_LEN; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void
check(const void *data, size_t len, const char *want)
{
	uint8_t d[AGENT_SHA256_LEN];
	char got[2 * AGENT_SHA256_LEN + 1];

	agent_sha256(data, len, d);
	hex(d, got);
	assert_string_equal(got, want);
}

static void
test_vectors(void **state)
{
	check("", 0,
	    "e3b0c44298fc1c149afbf4c8996fb924"
	    "27ae41e4649b934ca495991b7852b855");
	check("abc", 3,
	    "ba7816bf8f01cfea414140de5dae2223"
	    "b00361a396177a9cb410ff61f20015ad");
	check("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
	    "248d6a61d20638b8e5c026930c3e6039"
	    "a33ce45964ff2167f6ecedd419db06c1");
	check("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
	      "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
	    112,
	    "cf5b16a778af8380036ce59e7b049237"
	    "0b249b11e8f07a51afac45037afee9d1");
}

static void
test_million_a(void **state)
{
	struct agent_sha256 h;
	uint8_t d[AGENT_SHA256_LEN], block[1000];
	char got[2 * AGENT_SHA256_LEN + 1];
	int i;

	memset(block, 'a', sizeof(block));
	agent_sha256_init(&h);
	for (i = 0; i < 1000; i++)
		agent_sha256_update(&h, block, sizeof(block));
	agent_sha256_final(&h, d);
	hex(d, got);
	assert_string_equal(got,
	    "cdc76e5c9914fb9281a1c7e284d73e67"
	    "f1809a48a497200e046d39ccc7112cd0");
}

static void
test_against_openssl(void **state)
{
	uint8_t buf[1100], mine[AGENT_SHA256_LEN];
	uint8_t theirs[SHA256_DIGEST_LENGTH];
	size_t len, i;

	for (i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 131 + 7);
	for (len = 0; len <= sizeof(buf); len++) {
		agent_sha256(buf, len, mine);
		SHA256(buf, len, theirs);
		assert_memory_equal(mine, theirs, sizeof(mine));
	}
}

static void
test_pieces(void **state)
{
	uint8_t buf[4099], one[AGENT_SHA256_LEN], split[AGENT_SHA256_LEN];
	struct agent_sha256 h;
	size_t off = 0, step = 1, i;

	for (i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i ^ (i >> 8));
	agent_sha256(buf, sizeof(buf), one);
	agent_sha256_init(&h);
	while (off < sizeof(buf)) {
		size_t n = step < sizeof(buf) - off ? step : sizeof(buf) - off;

		agent_sha256_update(&h, buf + off, n);
		off += n;
		step = step * 3 % 97 + 1; /* 1, 4, 13, 40, 24, ... */
	}
	agent_sha256_final(&h, split);
	assert_memory_equal(one, split, sizeof(one));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors),
		cmocka_unit_test(test_million_a),
		cmocka_unit_test(test_against_openssl),
		cmocka_unit_test(test_pieces),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
