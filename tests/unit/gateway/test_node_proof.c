/*
 * test_node_proof.c: the gateway's proof of a node's identity
 * (gateway/node_proof.c) with fake survey answers and real TLS servers
 * on 127.0.0.1 (certificates from tests/unit/lib/tls_certs.sh): node-a's
 * real server passes and joins; an answer naming node-a at a server that
 * holds node-b's certificate, or a certificate from a foreign CA, is
 * refused and node-a's entry stays as it was; the same (id, url) is not
 * tried again at once; a plain tcp:// url off loopback is refused without
 * a dial; ipc:// and a known (id, url) need no proof. Also discovery
 * over a tls+tcp survey listener with a respondent holding a node
 * certificate.
 * Not for: the RPC layer's TLS (tests/unit/lib/test_tls.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/survey0/respond.h>
#include <nng/supplemental/util/platform.h>

#include "gateway.h"
#include "moat/nng_close.h"
#include "moat/rpc.h"
#include "moat/tls.h"
#include "moat/util.h"

#ifndef CERTS_SH
#error CERTS_SH must name tls_certs.sh
#endif

static char dir[64];

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	r->service = strdup("moat.v1.Vm");
	r->version = strdup("test");
	return MOAT_OK;
}

static int
h_other(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	return moat_rpc_error(call, MOAT_UNIMPLEMENTED, "not in this test");
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
load(const char *leaf, const char *ca, const char *peer_ca)
{
	char *cert = moat_asprintf("%s/%s/cert.pem", dir, leaf);
	char *key = moat_asprintf("%s/%s/key.pem", dir, leaf);
	char *ca_p = moat_asprintf("%s/%s", dir, ca);
	char *peer_p = peer_ca ? moat_asprintf("%s/%s", dir, peer_ca) : NULL;
	struct moat_tls_files f = { .cert = cert,
		.key = key,
		.ca = ca_p,
		.peer_ca = peer_p };
	struct moat_tls *t = NULL;
	char *err = NULL;

	if (moat_tls_load(&t, &f, &err) != MOAT_OK)
		fail_msg("load %s: %s", leaf, err);
	free(cert);
	free(key);
	free(ca_p);
	free(peer_p);
	return t;
}

/* A vmd-like TLS server answering Health with `leaf`'s certificate. */
struct server {
	struct moat_rpc_server *srv;
	struct moat_tls *tls;
	struct moat_rpc_method *table;
	char url[64];
};

static void
server_start(struct server *s, const char *leaf)
{
	const ProtobufCServiceDescriptor *d = &moat__v1__vm__descriptor;
	struct moat_rpc_service svc = { .descriptor = d };
	struct moat_rpc_server_opts o = { .peer = MOAT_TLS_PEER_REQUIRED,
		.workers = 2 };
	char *err = NULL;

	s->table = calloc(d->n_methods, sizeof(*s->table));
	assert_non_null(s->table);
	for (unsigned i = 0; i < d->n_methods; i++) {
		s->table[i].name = d->methods[i].name;
		s->table[i].handler = strcmp(s->table[i].name, "Health") == 0 ?
		    h_health :
		    h_other;
	}
	svc.methods = s->table;
	svc.n_methods = d->n_methods;
	s->tls = load(leaf, "ca/gateway.crt", "ca/gateway.crt");
	o.tls = s->tls;
	snprintf(s->url, sizeof(s->url), "tls+tcp://127.0.0.1:%d",
	    free_port());
	if (moat_rpc_server_start_opts(&s->srv, s->url, &svc, &o, &err) !=
	    MOAT_OK)
		fail_msg("server %s: %s", leaf, err);
}

static void
server_stop(struct server *s)
{
	moat_rpc_server_stop(s->srv);
	moat_tls_free(s->tls);
	free(s->table);
}

static Moat__V1__Node *
make_node(const char *id, const char *url)
{
	Moat__V1__Node *n = malloc(sizeof(*n));

	moat__v1__node__init(n);
	n->node_id = strdup(id);
	n->rpc_url = strdup(url);
	return n;
}

/* wait_counts: until the prover has passed/refused at least these. */
static void
wait_counts(struct moat_node_prover *p, unsigned passed, unsigned refused)
{
	unsigned ps = 0, rf = 0;

	for (int i = 0; i < 1000; i++) {
		moat_node_prover_counts(p, &ps, &rf);
		if (ps >= passed && rf >= refused)
			break;
		nng_msleep(10);
	}
	assert_int_equal(ps, passed);
	assert_int_equal(rf, refused);
}

static void
test_proof(void **state)
{
	struct server real, other, rogue;
	struct moat_nodes nodes;
	struct moat_node_prover *p = NULL;
	struct moat_tls *gw = load("gw", "ca/vmd.crt", NULL);
	unsigned ps, rf;
	char *err = NULL;

	server_start(&real, "node-a");
	server_start(&other, "node-b"); /* a real node, but node-b */
	server_start(&rogue, "rogue");  /* names node-a, foreign CA */
	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	nodes.tls = gw;
	assert_int_equal(moat_node_prover_start(&p, &nodes, &err), MOAT_OK);

	/* A new id at its real server: proven, then in the table. */
	assert_true(moat_node_prover_offer(p, make_node("node-a", real.url)));
	wait_counts(p, 1, 0);
	assert_true(moat_nodes_knows(&nodes, "node-a", real.url));
	/* Known id and url: no proof, the caller records it. */
	{
		Moat__V1__Node *n = make_node("node-a", real.url);

		assert_false(moat_node_prover_offer(p, n));
		moat__v1__node__free_unpacked(n, NULL);
	}
	/* node-a "moved" to a server holding node-b's certificate: refused,
	 * the entry left at the real url. */
	assert_true(moat_node_prover_offer(p, make_node("node-a", other.url)));
	wait_counts(p, 1, 1);
	assert_true(moat_nodes_knows(&nodes, "node-a", real.url));
	/* A certificate naming node-a from a foreign CA: refused. */
	assert_true(moat_node_prover_offer(p, make_node("node-a", rogue.url)));
	wait_counts(p, 1, 2);
	assert_true(moat_nodes_knows(&nodes, "node-a", real.url));
	/* A new id from the rogue: refused, never in the table. */
	assert_true(moat_node_prover_offer(p, make_node("node-c", rogue.url)));
	wait_counts(p, 1, 3);
	assert_false(moat_nodes_knows(&nodes, "node-c", rogue.url));
	/* The same (id, url) again at once: dropped without a probe. */
	assert_true(moat_node_prover_offer(p, make_node("node-a", rogue.url)));
	nng_msleep(300);
	moat_node_prover_counts(p, &ps, &rf);
	assert_int_equal(ps, 1);
	assert_int_equal(rf, 3);
	/* Plain tcp off loopback: refused at once, nothing dialed. */
	assert_true(moat_node_prover_offer(p,
	    make_node("node-x", "tcp://10.0.0.1:1")));
	moat_node_prover_counts(p, &ps, &rf);
	assert_int_equal(rf, 4);
	/* ipc: local, as without TLS. */
	{
		Moat__V1__Node *n = make_node("node-y", "ipc:///tmp/y.sock");

		assert_false(moat_node_prover_offer(p, n));
		moat__v1__node__free_unpacked(n, NULL);
	}
	/* node-b at its own server: passes. */
	assert_true(moat_node_prover_offer(p, make_node("node-b", other.url)));
	wait_counts(p, 2, 4);
	assert_true(moat_nodes_knows(&nodes, "node-b", other.url));

	moat_node_prover_stop(p);
	moat_nodes_fini(&nodes);
	moat_tls_free(gw);
	server_stop(&real);
	server_stop(&other);
	server_stop(&rogue);
}

/* A respondent holding `leaf`'s certificate answering as (id, url). */
struct respondent {
	nng_socket sock;
	pthread_t thread;
	atomic_bool stop;
	char id[32], url[64];
};

static void *
respond_main(void *arg)
{
	struct respondent *r = arg;

	while (!atomic_load(&r->stop)) {
		Moat__V1__Node n = MOAT__V1__NODE__INIT;
		nng_msg *m;

		if (nng_recvmsg(r->sock, &m, 0) != 0)
			continue;
		n.node_id = r->id;
		n.protocol_version = 2;
		n.rpc_url = r->url;
		nng_msg_clear(m);
		if (nng_msg_realloc(m, moat__v1__node__get_packed_size(&n)) ==
		    0) {
			moat__v1__node__pack(&n, nng_msg_body(m));
			if (nng_sendmsg(r->sock, m, 0) == 0)
				continue;
		}
		nng_msg_free(m);
	}
	return NULL;
}

static void
respondent_start(struct respondent *r, const char *survey_url,
    struct moat_tls *t, const char *id, const char *url)
{
	nng_dialer d;
	char *err = NULL;

	memset(r, 0, sizeof(*r));
	snprintf(r->id, sizeof(r->id), "%s", id);
	snprintf(r->url, sizeof(r->url), "%s", url);
	assert_int_equal(nng_respondent0_open(&r->sock), 0);
	nng_socket_set_ms(r->sock, NNG_OPT_RECVTIMEO, 50);
	assert_int_equal(nng_dialer_create(&d, r->sock, survey_url), 0);
	if (moat_tls_dialer_apply(d, survey_url, t, "gateway", "test", &err) !=
	    MOAT_OK)
		fail_msg("%s", err);
	assert_int_equal(nng_dialer_start(d, NNG_FLAG_NONBLOCK), 0);
	assert_int_equal(pthread_create(&r->thread, NULL, respond_main, r), 0);
}

/* respondent_quiet: stops answering (first: nng 1.5 can hang for good
 * in nng_close when a message arrives on a pipe while it closes, so
 * neither side closes while the other still sends). */
static void
respondent_quiet(struct respondent *r)
{
	atomic_store(&r->stop, true);
	pthread_join(r->thread, NULL);
}

static void
respondent_close(struct respondent *r)
{
	(void)moat_nng_close_bounded(r->sock, 2000);
}

static void
test_survey_over_tls(void **state)
{
	struct server real, other;
	struct moat_nodes nodes;
	struct moat_discovery *d = NULL;
	struct respondent a, liar;
	/* The gateway: dials nodes trusting vmd's CA; its survey listener
	 * takes answers only from vmd certificates. */
	struct moat_tls *gw = load("gw", "ca/vmd.crt", "ca/vmd.crt");
	struct moat_tls *na = load("node-a", "ca/gateway.crt", NULL);
	struct moat_tls *nb = load("node-b", "ca/gateway.crt", NULL);
	char survey[64], *err = NULL;

	server_start(&real, "node-a");
	server_start(&other, "node-b");
	snprintf(survey, sizeof(survey), "tls+tcp://127.0.0.1:%d",
	    free_port());
	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	nodes.tls = gw;
	if (moat_discovery_start_tls(&d, &nodes, survey, 100, NULL, gw,
	        &err) != MOAT_OK)
		fail_msg("discovery: %s", err);
	respondent_start(&a, survey, na, "node-a", real.url);
	/* node-b's holder says it is node-a, at its own server. */
	respondent_start(&liar, survey, nb, "node-a", other.url);
	for (int i = 0;
	     i < 300 && !moat_nodes_knows(&nodes, "node-a", real.url); i++)
		nng_msleep(20);
	assert_true(moat_nodes_knows(&nodes, "node-a", real.url));
	/* A few more rounds: the liar never moves node-a. */
	for (int i = 0; i < 15; i++) {
		nng_msleep(100);
		assert_true(moat_nodes_knows(&nodes, "node-a", real.url));
	}
	respondent_quiet(&a);
	respondent_quiet(&liar);
	nng_msleep(200);
	moat_discovery_stop(d);
	respondent_close(&a);
	respondent_close(&liar);
	moat_nodes_fini(&nodes);
	moat_tls_free(gw);
	moat_tls_free(na);
	moat_tls_free(nb);
	server_stop(&real);
	server_stop(&other);
}

static int
group_setup(void **state)
{
	char *cmd;
	int rv;

	snprintf(dir, sizeof(dir), "/tmp/moat-proof-XXXXXX");
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
		cmocka_unit_test(test_proof),
		cmocka_unit_test(test_survey_over_tls),
	};

	if (system("openssl version >/dev/null 2>&1") != 0) {
		fprintf(stderr, "no openssl command: skipped\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
