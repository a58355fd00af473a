/*
 * test_egress_policy.c: guest egress's pure checks (services/vm/
 * egress_policy.c, issue 14): the allowlist, IP literals, ports, every
 * refused address range (loopback, link-local, metadata, private, ...),
 * egress-hosts and the proxy request head. No socket is opened and no
 * packet sent. cmocka; label "unit".
 */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "moat/status.h"
#include "egress_policy.h"

static struct vmd_egress_policy
policy(const char *const *allow, size_t n)
{
	struct vmd_egress_policy p;
	char *err = NULL;

	assert_int_equal(vmd_egress_policy_parse(allow, n, &p, &err), MOAT_OK);
	assert_null(err);
	return p;
}

static void
test_parse_refuses_bad_entries(void **state)
{
	static const char *const bad[] = { "127.0.0.1", "10.0.0.1:80",
		"[::1]:443", "::1", "2130706433", "0x7f.1", "a..b", "-", "",
		"host:0", "host:65536", "host:x", "ex ample.com", "a/b",
		"*.127.0.0.1" };
	struct vmd_egress_policy p;
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *err = NULL;

		assert_int_equal(vmd_egress_policy_parse(&bad[i], 1, &p, &err),
		    MOAT_INVALID_ARGUMENT);
		assert_non_null(err);
		assert_non_null(strstr(err, "allow entry"));
		free(err);
	}
}

static void
test_names_and_ports(void **state)
{
	static const char *const allow[] = { "PyPI.org", "files.example:8443",
		"*.cdn.example" };
	struct vmd_egress_policy p = policy(allow, 3);
	const char *why = NULL;
	(void)state;

	assert_true(vmd_egress_name_allowed(&p, "pypi.org", 443, &why));
	assert_true(vmd_egress_name_allowed(&p, "PYPI.ORG", 80, &why));
	assert_false(vmd_egress_name_allowed(&p, "pypi.org", 22, &why));
	assert_string_equal(why, "port not on the allowlist");
	assert_true(vmd_egress_name_allowed(&p, "files.example", 8443, &why));
	assert_false(vmd_egress_name_allowed(&p, "files.example", 443, &why));
	assert_true(vmd_egress_name_allowed(&p, "a.cdn.example", 443, &why));
	assert_true(vmd_egress_name_allowed(&p, "a.b.cdn.example", 80, &why));
	assert_false(vmd_egress_name_allowed(&p, "cdn.example", 443, &why));
	assert_false(vmd_egress_name_allowed(&p, "xcdn.example", 443, &why));
	assert_false(vmd_egress_name_allowed(&p, "evil.org", 443, &why));
	assert_string_equal(why, "host not on the allowlist");
	assert_false(vmd_egress_name_allowed(&p, "pypi.org.evil", 443, &why));
}

static void
test_ip_literals_refused(void **state)
{
	static const char *const lit[] = { "127.0.0.1", "169.254.169.254",
		"[::1]", "::ffff:127.0.0.1", "fd00:ec2::254", "2130706433",
		"0x7f000001", "127.1", "10.1" };
	static const char *const allow[] = { "example.com" };
	struct vmd_egress_policy p = policy(allow, 1);
	const char *why = NULL;
	(void)state;

	for (size_t i = 0; i < sizeof(lit) / sizeof(lit[0]); i++) {
		assert_true(vmd_egress_is_ip_literal(lit[i]));
		assert_false(vmd_egress_name_allowed(&p, lit[i], 80, &why));
		assert_non_null(strstr(why, "IP literal"));
	}
	assert_false(vmd_egress_is_ip_literal("example.com"));
	assert_false(vmd_egress_is_ip_literal("1password.com"));
	assert_false(vmd_egress_is_ip_literal("1.cafe"));
	assert_true(vmd_egress_is_ip_literal("0177.0.0.1"));
}

static bool
addr_ok(const char *text, const char **why)
{
	struct sockaddr_storage ss = { 0 };

	if (inet_pton(AF_INET, text, &((struct sockaddr_in *)&ss)->sin_addr) ==
	    1)
		ss.ss_family = AF_INET;
	else {
		assert_int_equal(inet_pton(AF_INET6, text,
		                     &((struct sockaddr_in6 *)&ss)->sin6_addr),
		    1);
		ss.ss_family = AF_INET6;
	}
	return vmd_egress_addr_allowed((struct sockaddr *)&ss, NULL, 0, why);
}

static void
test_refused_addresses(void **state)
{
	static const struct {
		const char *addr, *why;
	} cases[] = {
		{ "127.0.0.1", "loopback address" },
		{ "127.255.0.9", "loopback address" },
		{ "::1", "loopback address" },
		{ "0.0.0.0", "unspecified address" },
		{ "::", "unspecified address" },
		{ "169.254.169.254", "metadata address" },
		{ "fd00:ec2::254", "metadata address" },
		{ "169.254.1.1", "link-local address" },
		{ "fe80::1", "link-local address" },
		{ "10.0.0.1", "private address" },
		{ "172.16.0.1", "private address" },
		{ "172.31.255.255", "private address" },
		{ "192.168.1.1", "private address" },
		{ "fc00::1", "private address" },
		{ "fd12:3456::1", "private address" },
		{ "100.64.0.1", "shared (CGNAT) address" },
		{ "224.0.0.1", "multicast address" },
		{ "ff02::1", "multicast address" },
		{ "255.255.255.255", "reserved address" },
		{ "::ffff:127.0.0.1", "loopback address" },
		{ "::ffff:169.254.169.254", "metadata address" },
		{ "::ffff:10.0.0.1", "private address" },
	};
	const char *why = NULL;
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		why = NULL;
		assert_false(addr_ok(cases[i].addr, &why));
		assert_non_null(why);
		if (strcmp(why, cases[i].why) != 0)
			fail_msg("%s: \"%s\", want \"%s\"", cases[i].addr, why,
			    cases[i].why);
	}
	assert_true(addr_ok("93.184.216.34", &why));
	assert_true(addr_ok("172.32.0.1", &why));
	assert_true(addr_ok("2606:2800:220:1::1", &why));
	assert_true(addr_ok("::ffff:93.184.216.34", &why));
}

static void
test_host_own_address_refused(void **state)
{
	struct sockaddr_storage mine = { 0 };
	struct sockaddr_in a = { .sin_family = AF_INET };
	const char *why = NULL;
	(void)state;

	mine.ss_family = AF_INET;
	inet_pton(AF_INET, "203.0.113.7",
	    &((struct sockaddr_in *)&mine)->sin_addr);
	inet_pton(AF_INET, "203.0.113.7", &a.sin_addr);
	/* 203.0.113.0/24 is documentation space, not refused by range. */
	assert_false(
	    vmd_egress_addr_allowed((struct sockaddr *)&a, &mine, 1, &why));
	assert_string_equal(why, "the host's own address");
	inet_pton(AF_INET, "203.0.113.8", &a.sin_addr);
	assert_true(
	    vmd_egress_addr_allowed((struct sockaddr *)&a, &mine, 1, &why));
}

static void
test_egress_hosts(void **state)
{
	struct vmd_egress_hosts h;
	const struct vmd_egress_host_entry *e;
	char *err = NULL;
	(void)state;

	assert_int_equal(vmd_egress_hosts_parse("# test\n\nAllowed.test "
	                                        "127.0.0.1:8080 # local\n"
	                                        "six.test [::1]:81\n"
	                                        "plain.test 10.0.0.2\n",
	                     &h, &err),
	    MOAT_OK);
	assert_int_equal(h.n, 3);
	e = vmd_egress_hosts_find(&h, "allowed.TEST");
	assert_non_null(e);
	assert_int_equal(e->addr.ss_family, AF_INET);
	assert_int_equal(ntohs(((struct sockaddr_in *)&e->addr)->sin_port),
	    8080);
	e = vmd_egress_hosts_find(&h, "six.test");
	assert_non_null(e);
	assert_int_equal(e->addr.ss_family, AF_INET6);
	assert_int_equal(ntohs(((struct sockaddr_in6 *)&e->addr)->sin6_port),
	    81);
	e = vmd_egress_hosts_find(&h, "plain.test");
	assert_int_equal(ntohs(((struct sockaddr_in *)&e->addr)->sin_port), 0);
	assert_null(vmd_egress_hosts_find(&h, "other.test"));
	vmd_egress_hosts_free(&h);

	assert_int_equal(vmd_egress_hosts_parse("ok.test 1.2.3.4\nbad\n", &h,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "line 2"));
	free(err);
	assert_int_equal(vmd_egress_hosts_parse("x.test 1.2.3.4:99999\n", &h,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	free(err);
	assert_int_equal(vmd_egress_hosts_parse("x.test name.example\n", &h,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	free(err);
}

static int
head(const char *text, struct vmd_egress_target *t, const char **why)
{
	return vmd_egress_head_parse(text, strlen(text), t, why);
}

static void
test_request_heads(void **state)
{
	struct vmd_egress_target t;
	const char *why = NULL;
	const char *get = "GET http://Example.com:8080/a/b?c HTTP/1.1\r\n"
	                  "Host: example.com:8080\r\n\r\nBODY";
	char big[VMD_EGRESS_HEAD_MAX + 16];
	(void)state;

	assert_int_equal(head("GET http://example.com/ HTTP/1.1\r\nHo", &t,
	                     &why),
	    0);
	assert_int_equal(head(get, &t, &why), 1);
	assert_false(t.connect);
	assert_string_equal(t.host, "example.com");
	assert_int_equal(t.port, 8080);
	assert_int_equal(t.head_len, strlen(get) - 4);
	assert_memory_equal(get + t.path_off, "/a/b?c", t.path_len);

	assert_int_equal(head("CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", &t,
	                     &why),
	    1);
	assert_true(t.connect);
	assert_string_equal(t.host, "pypi.org");
	assert_int_equal(t.port, 443);
	assert_int_equal(head("CONNECT [::1]:443 HTTP/1.1\r\n\r\n", &t, &why),
	    1);
	assert_string_equal(t.host, "::1");
	assert_true(vmd_egress_is_ip_literal(t.host));

	assert_int_equal(head("CONNECT pypi.org HTTP/1.1\r\n\r\n", &t, &why),
	    -1);
	assert_int_equal(head("GET / HTTP/1.1\r\nHost: x\r\n\r\n", &t, &why),
	    -1);
	assert_non_null(strstr(why, "absolute"));
	assert_int_equal(head("GET https://x/ HTTP/1.1\r\n\r\n", &t, &why),
	    -1);
	assert_non_null(strstr(why, "CONNECT"));
	/* A Host header naming another host: no smuggling past the list. */
	assert_int_equal(head("GET http://ok.test/ HTTP/1.1\r\n"
	                      "Host: evil.test\r\n\r\n",
	                     &t, &why),
	    -1);
	assert_non_null(strstr(why, "Host header"));
	assert_int_equal(head("GET http://user@evil.test@ok.test/ HTTP/1.1"
	                      "\r\n\r\n",
	                     &t, &why),
	    -1);
	assert_int_equal(head("GET http://ok.test:99999/ HTTP/1.1\r\n\r\n", &t,
	                     &why),
	    -1);
	assert_int_equal(head("garbage\r\n\r\n", &t, &why), -1);
	memset(big, 'a', sizeof(big));
	assert_int_equal(vmd_egress_head_parse(big, sizeof(big), &t, &why),
	    -1);
	assert_non_null(strstr(why, "too long"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_refuses_bad_entries),
		cmocka_unit_test(test_names_and_ports),
		cmocka_unit_test(test_ip_literals_refused),
		cmocka_unit_test(test_refused_addresses),
		cmocka_unit_test(test_host_own_address_refused),
		cmocka_unit_test(test_egress_hosts),
		cmocka_unit_test(test_request_heads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
