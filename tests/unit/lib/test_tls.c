/*
 * test_tls.c: unit tests of moat/tls.h and the RPC layer's TLS
 * (moat_rpc_server_start_opts, moat_rpc_client_open_opts) over tls+tcp on
 * 127.0.0.1 with throwaway certificates (tls_certs.sh, openssl): a root,
 * intermediates "gateway", "vmd" and "rogue", leaves. A vmd-like
 * listener trusts only the gateway intermediate for callers; the
 * gateway-like caller trusts only the vmd intermediate for servers (an
 * intermediate alone as the trust anchor, as moat-pki's files do). Shows:
 * the right certificates work (and one connection serves many calls);
 * no client certificate, one from the wrong intermediate, a server from
 * the wrong intermediate and a wrong server name all fail at the
 * handshake with a message that says so; the address rules (plain tcp
 * off loopback refused before any dial, tls+tcp without settings);
 * settings read from moat_config; bad PEM files. Not for: the services'
 * wiring (their tests) or the gateway's node proof (test_discovery).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.pb-c.h"
#include "moat/config.h"
#include "moat/rpc.h"
#include "moat/tls.h"
#include "moat/util.h"
#include "vm.pb-c.h"

#ifndef CERTS_SH
#error CERTS_SH must name tls_certs.sh
#endif

static char dir[64];

static char *
path(const char *rel)
{
	return moat_asprintf("%s/%s", dir, rel);
}

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	r->service = strdup("tls-test");
	r->version = strdup("test");
	return MOAT_OK;
}

static int
h_other(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	return moat_rpc_error(call, MOAT_UNIMPLEMENTED, "not in this test");
}

/* A method table for every method of moat.v1.Vm (Health answers). */
static struct moat_rpc_method *
vm_table(size_t *n)
{
	const ProtobufCServiceDescriptor *d = &moat__v1__vm__descriptor;
	struct moat_rpc_method *m = calloc(d->n_methods, sizeof(*m));

	for (unsigned i = 0; m != NULL && i < d->n_methods; i++) {
		m[i].name = d->methods[i].name;
		m[i].handler =
		    strcmp(m[i].name, "Health") == 0 ? h_health : h_other;
	}
	*n = d->n_methods;
	return m;
}

static int
free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) != 0)
		fail_msg("no free port");
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static struct moat_tls *
load(const char *cert_dir, const char *ca, const char *peer_ca)
{
	struct moat_tls_files f = { 0 };
	struct moat_tls *t = NULL;
	char *cert = NULL, *key = NULL, *ca_p = NULL, *peer_p = NULL;
	char *err = NULL;

	if (cert_dir != NULL) {
		cert = moat_asprintf("%s/%s/cert.pem", dir, cert_dir);
		key = moat_asprintf("%s/%s/key.pem", dir, cert_dir);
	}
	if (ca != NULL)
		ca_p = path(ca);
	if (peer_ca != NULL)
		peer_p = path(peer_ca);
	f.cert = cert;
	f.key = key;
	f.ca = ca_p;
	f.peer_ca = peer_p;
	f.section = "test";
	if (moat_tls_load(&t, &f, &err) != MOAT_OK)
		fail_msg("load: %s", err);
	free(cert);
	free(key);
	free(ca_p);
	free(peer_p);
	return t;
}

/* A vmd-like server: node-a's certificate, callers from the gateway
 * intermediate only. */
struct server {
	struct moat_rpc_server *srv;
	struct moat_tls *tls;
	struct moat_rpc_method *table;
	char url[64];
};

static void
server_start(struct server *s, const char *cert_dir)
{
	struct moat_rpc_service svc = { .descriptor =
		                            &moat__v1__vm__descriptor };
	struct moat_rpc_server_opts o = { 0 };
	char *err = NULL;

	s->table = vm_table(&svc.n_methods);
	svc.methods = s->table;
	s->tls = load(cert_dir, "ca/gateway.crt", "ca/gateway.crt");
	snprintf(s->url, sizeof(s->url), "tls+tcp://127.0.0.1:%d",
	    free_port());
	o.tls = s->tls;
	o.peer = MOAT_TLS_PEER_REQUIRED;
	o.workers = 4;
	if (moat_rpc_server_start_opts(&s->srv, s->url, &svc, &o, &err) !=
	    MOAT_OK)
		fail_msg("server: %s", err);
}

static void
server_stop(struct server *s)
{
	moat_rpc_server_stop(s->srv);
	moat_tls_free(s->tls);
	free(s->table);
}

/* health: one Health call to url with `t` and `name`; its status, and
 * its message in *msg (heap). */
static int
health(const char *url, const struct moat_tls *t, const char *name,
    uint32_t timeout_ms, char **msg)
{
	struct moat_rpc_client_opts o = { .tls = t, .server_name = name };
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts co = { .timeout_ms = timeout_ms };
	struct moat_rpc_client *c = NULL;
	ProtobufCMessage *reply = NULL;
	int rv;

	*msg = NULL;
	if ((rv = moat_rpc_client_open_opts(&c, url, &o, msg)) != MOAT_OK)
		return rv;
	for (int i = 0; i < 3 && rv == MOAT_OK; i++) {
		free(*msg);
		*msg = NULL;
		rv = moat_rpc_call(c, "moat.v1.Vm", "Health", &req.base,
		    &moat__v1__health_reply__descriptor, &reply, &co, msg);
		if (reply != NULL)
			protobuf_c_message_free_unpacked(reply, NULL);
		reply = NULL;
	}
	moat_rpc_client_close(c);
	return rv;
}

static void
test_right_certs(void **state)
{
	struct server s;
	struct moat_tls *gw = load("gw", "ca/vmd.crt", NULL);
	char *msg = NULL;

	server_start(&s, "node-a");
	assert_int_equal(health(s.url, gw, "node-a", 5000, &msg), MOAT_OK);
	free(msg);
	moat_tls_free(gw);
	server_stop(&s);
}

/* expect_refused: a call that fails at the handshake, said so. */
static void
expect_refused(const char *url, const struct moat_tls *t, const char *name)
{
	char *msg = NULL;
	int rv = health(url, t, name, 1500, &msg);

	assert_int_equal(rv, MOAT_UNAVAILABLE);
	assert_non_null(msg);
	if (strstr(msg, "TLS handshake") == NULL)
		fail_msg("no word of the handshake in: %s", msg);
	free(msg);
}

static void
test_no_client_cert(void **state)
{
	struct server s;
	struct moat_tls *anon = load(NULL, "ca/vmd.crt", NULL);

	server_start(&s, "node-a");
	expect_refused(s.url, anon, "node-a");
	moat_tls_free(anon);
	server_stop(&s);
}

static void
test_wrong_intermediate(void **state)
{
	struct server s;
	/* A gateway name, but signed by the vmd intermediate: a vmd
	 * calling a vmd. */
	struct moat_tls *vmdgw = load("vmdgw", "ca/vmd.crt", NULL);

	server_start(&s, "node-a");
	expect_refused(s.url, vmdgw, "node-a");
	moat_tls_free(vmdgw);
	server_stop(&s);
}

static void
test_rogue_server(void **state)
{
	struct server s;
	struct moat_tls *gw = load("gw", "ca/vmd.crt", NULL);

	/* Names node-a, but from a CA the gateway does not trust. */
	server_start(&s, "rogue");
	expect_refused(s.url, gw, "node-a");
	moat_tls_free(gw);
	server_stop(&s);
}

static void
test_wrong_name(void **state)
{
	struct server s;
	struct moat_tls *gw = load("gw", "ca/vmd.crt", NULL);

	/* node-a's certificate, asked to be node-b. */
	server_start(&s, "node-a");
	expect_refused(s.url, gw, "node-b");
	moat_tls_free(gw);
	server_stop(&s);
}

static void
test_plain_tcp_off_loopback(void **state)
{
	struct moat_rpc_client_opts o = { 0 };
	struct moat_rpc_client *c = NULL;
	struct moat_tls_files f = { .insecure = true, .section = "test" };
	struct moat_tls *insecure = NULL;
	char *err = NULL;

	/* Refused before any dial: nothing is sent to 10.0.0.1. */
	assert_int_equal(moat_rpc_client_open_opts(&c, "tcp://10.0.0.1:1", &o,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	assert_null(c);
	assert_non_null(strstr(err, "tls+tcp://10.0.0.1:1"));
	assert_non_null(strstr(err, "insecure"));
	free(err);
	err = NULL;
	assert_int_equal(moat_tls_check_url(NULL, "tcp://[2001:db8::1]:5",
	                     true, MOAT_TLS_PEER_REQUIRED, "x", &err),
	    MOAT_INVALID_ARGUMENT);
	free(err);
	/* Loopback and ipc pass; insecure lets the check pass (a
	 * warning). */
	assert_int_equal(moat_tls_check_url(NULL, "tcp://127.0.2.1:5", false,
	                     MOAT_TLS_PEER_NONE, "x", &err),
	    MOAT_OK);
	assert_int_equal(moat_tls_check_url(NULL, "tcp://[::1]:5", false,
	                     MOAT_TLS_PEER_NONE, "x", &err),
	    MOAT_OK);
	assert_int_equal(moat_tls_check_url(NULL, "tcp://localhost:5", false,
	                     MOAT_TLS_PEER_NONE, "x", &err),
	    MOAT_OK);
	assert_int_equal(moat_tls_check_url(NULL, "ipc:///tmp/x.sock", true,
	                     MOAT_TLS_PEER_REQUIRED, "x", &err),
	    MOAT_OK);
	assert_int_equal(moat_tls_load(&insecure, &f, &err), MOAT_OK);
	assert_false(moat_tls_enabled(insecure));
	assert_int_equal(moat_tls_check_url(insecure, "tcp://10.0.0.1:1",
	                     false, MOAT_TLS_PEER_NONE, "x", &err),
	    MOAT_OK);
	moat_tls_free(insecure);
}

static void
test_tls_without_settings(void **state)
{
	struct moat_rpc_server_opts so = { 0 };
	struct moat_rpc_client_opts co = { 0 };
	struct moat_rpc_service svc = { .descriptor =
		                            &moat__v1__vm__descriptor };
	struct moat_rpc_server *srv = NULL;
	struct moat_rpc_client *c = NULL;
	char *err = NULL;

	assert_int_equal(moat_rpc_client_open_opts(&c, "tls+tcp://127.0.0.1:1",
	                     &co, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(err, "tls-ca"));
	free(err);
	err = NULL;
	assert_int_equal(moat_rpc_server_start_opts(&srv,
	                     "tls+tcp://127.0.0.1:1", &svc, &so, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(err, "tls-cert"));
	free(err);
}

static void
test_from_config(void **state)
{
	struct moat_config *cfg = NULL;
	struct moat_tls *t = NULL;
	char *conf = path("moat.conf"), *err = NULL;
	FILE *f = fopen(conf, "w");

	assert_non_null(f);
	fprintf(f,
	    "[vmd]\ntls-cert = %s/node-a/cert.pem\ntls-key = "
	    "%s/node-a/key.pem\ntls-ca = %s/ca/gateway.crt\n",
	    dir, dir, dir);
	fclose(f);
	assert_int_equal(moat_config_load(&cfg, conf, &err), MOAT_OK);
	assert_int_equal(moat_tls_from_config(cfg, "vmd", &t, &err), MOAT_OK);
	assert_true(moat_tls_enabled(t));
	assert_false(moat_tls_insecure(t));
	moat_tls_free(t);
	/* A key without its certificate: named. */
	assert_int_equal(moat_config_set_flag(cfg, "vmd", "tls-cert", ""),
	    MOAT_OK);
	assert_int_equal(moat_tls_from_config(cfg, "vmd", &t, &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err,
	    "[vmd] tls-cert (--tls-cert, "
	    "MOAT_VMD_TLS_CERT)"));
	free(err);
	err = NULL;
	/* Not a PEM file. */
	assert_int_equal(moat_config_set_flag(cfg, "vmd", "tls-cert", conf),
	    MOAT_OK);
	assert_int_not_equal(moat_tls_from_config(cfg, "vmd", &t, &err),
	    MOAT_OK);
	assert_non_null(strstr(err, "tls-cert"));
	free(err);
	err = NULL;
	/* A certificate with another's key. */
	{
		char *other = path("node-b/key.pem");
		char *cert = path("node-a/cert.pem");

		assert_int_equal(moat_config_set_flag(cfg, "vmd", "tls-cert",
		                     cert),
		    MOAT_OK);
		assert_int_equal(moat_config_set_flag(cfg, "vmd", "tls-key",
		                     other),
		    MOAT_OK);
		assert_int_not_equal(moat_tls_from_config(cfg, "vmd", &t,
		                         &err),
		    MOAT_OK);
		free(err);
		free(other);
		free(cert);
	}
	moat_config_free(cfg);
	free(conf);
}

static int
group_setup(void **state)
{
	char *cmd;
	int rv;

	snprintf(dir, sizeof(dir), "/tmp/moat-tls-XXXXXX");
	if (mkdtemp(dir) == NULL)
		return -1;
	cmd = moat_asprintf("sh %s %s", CERTS_SH, dir);
	rv = system(cmd);
	free(cmd);
	return rv == 0 ? 0 : -1;
}

static int
group_teardown(void **state)
{
	char *cmd = moat_asprintf("rm -rf %s", dir);
	int rv = system(cmd);

	free(cmd);
	return rv == 0 ? 0 : -1;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_right_certs),
		cmocka_unit_test(test_no_client_cert),
		cmocka_unit_test(test_wrong_intermediate),
		cmocka_unit_test(test_rogue_server),
		cmocka_unit_test(test_wrong_name),
		cmocka_unit_test(test_plain_tcp_off_loopback),
		cmocka_unit_test(test_tls_without_settings),
		cmocka_unit_test(test_from_config),
	};

	if (system("openssl version >/dev/null 2>&1") != 0) {
		fprintf(stderr, "no openssl command: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
