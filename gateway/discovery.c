/*
 * discovery.c: how the gateway learns which vmd nodes exist. It binds a
 * surveyor0 socket; every vmd dials it as a respondent and answers each
 * survey with an encoded moat.v1.Node (its id, RPC url and capacity).
 * Answers feed the node table, which also caches one RPC client per node.
 * A node silent for MOAT_GW_MISSED_SURVEYS surveys in a row is marked
 * unavailable (kept in the table, shown by ListNodes); it is available
 * again as soon as it answers. One silent for [gateway] node-forget-s
 * seconds (default MOAT_GW_NODE_FORGET_S; counted in surveys missed, so a
 * jump of the wall clock drops nothing) drops out of the table: a node
 * that is gone is not listed forever, and if it comes back it joins
 * again. The survey itself carries an empty body.
 * Not for: choosing nodes (placement.c) or calling them (forward.c).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/survey0/survey.h>
#include <nng/supplemental/util/platform.h>

#include "gateway.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/nng_close.h"
#include "moat/status.h"
#include "moat/util.h"

struct moat_node_conn {
	atomic_int refs; /* the entry's one, plus one per caller */
	struct moat_rpc_client *client;
	char *url;
};

struct moat_node_entry {
	struct moat_node_id id;
	Moat__V1__Node *node; /* the last answer, owned */
	uint64_t last_seen_unix_ms;
	uint64_t last_seen_ms; /* monotonic: its last survey answer, or
	                        * call answered (moat_nodes_answered) */
	uint32_t missed;       /* surveys in a row without an answer */
	bool answered;         /* answered in the current round */
	bool available;
	struct moat_node_conn *conn; /* holds one ref, or NULL */
};

struct moat_discovery {
	nng_socket sock;
	bool has_socket;
	pthread_t thread;
	bool thread_started;
	atomic_bool stop; /* set by stop; the thread polls it */
	struct moat_nodes *nodes;
	uint32_t interval_ms;
	char *url;
	/* Proves new ids and urls before they count (node_proof.c); NULL
	 * without TLS to the nodes. */
	struct moat_node_prover *prover;
	/* A stray respondent answers every survey: say so once a minute. */
	uint64_t bad_logged_ms;
	uint32_t bad_since_log;
};

#define BAD_ANSWER_LOG_MS 60000
#define DISCOVERY_POLL_MS 50 /* longest wait inside nng */

bool
moat_node_id_set(struct moat_node_id *id, const char *s)
{
	size_t n = s != NULL ? strlen(s) : 0;

	if (n == 0 || n >= sizeof(id->s))
		return false;
	memcpy(id->s, s, n + 1);
	return true;
}

bool
moat_sandbox_id_set(struct moat_sandbox_id *id, const char *s)
{
	size_t n = s != NULL ? strlen(s) : 0;

	if (n == 0 || n >= sizeof(id->s))
		return false;
	memcpy(id->s, s, n + 1);
	return true;
}

/* node_copy: a deep copy through the wire form (the simplest exact copy
 * protobuf-c offers). NULL on allocation failure. */
static Moat__V1__Node *
node_copy(const Moat__V1__Node *n)
{
	size_t len = moat__v1__node__get_packed_size(n);
	uint8_t *buf = malloc(len ? len : 1);
	Moat__V1__Node *copy;

	if (buf == NULL)
		return NULL;
	moat__v1__node__pack(n, buf);
	copy = moat__v1__node__unpack(NULL, len, buf);
	free(buf);
	return copy;
}

static void
conn_unref(struct moat_node_conn *c)
{
	if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	moat_rpc_client_close(c->client);
	free(c->url);
	free(c);
}

int
moat_nodes_init(struct moat_nodes *nodes)
{
	memset(nodes, 0, sizeof(*nodes));
	nodes->missed_limit = MOAT_GW_MISSED_SURVEYS;
	if (pthread_mutex_init(&nodes->lock, NULL) != 0)
		return MOAT_INTERNAL;
	return MOAT_OK;
}

void
moat_nodes_fini(struct moat_nodes *nodes)
{
	for (size_t i = 0; i < nodes->n; i++) {
		if (nodes->entries[i].node != NULL)
			moat__v1__node__free_unpacked(nodes->entries[i].node,
			    NULL);
		conn_unref(nodes->entries[i].conn);
	}
	free(nodes->entries);
	if (nodes->missed_limit != 0)
		pthread_mutex_destroy(&nodes->lock);
	memset(nodes, 0, sizeof(*nodes));
}

static struct moat_node_entry *
find_entry(struct moat_nodes *nodes, const char *id)
{
	for (size_t i = 0; i < nodes->n; i++)
		if (strcmp(nodes->entries[i].id.s, id) == 0)
			return &nodes->entries[i];
	return NULL;
}

bool
moat_nodes_knows(struct moat_nodes *nodes, const char *id, const char *url)
{
	struct moat_node_entry *e;
	bool known;

	pthread_mutex_lock(&nodes->lock);
	e = find_entry(nodes, id);
	known =
	    e != NULL && e->node != NULL && strcmp(e->node->rpc_url, url) == 0;
	pthread_mutex_unlock(&nodes->lock);
	return known;
}

int
moat_nodes_seen(struct moat_nodes *nodes, Moat__V1__Node *node,
    uint64_t now_ms)
{
	struct moat_node_entry *e;
	struct moat_node_id id;

	if (!moat_node_id_set(&id, node->node_id) || node->rpc_url == NULL ||
	    node->rpc_url[0] == '\0') {
		moat__v1__node__free_unpacked(node, NULL);
		return MOAT_INVALID_ARGUMENT;
	}
	node->available = true;
	node->last_seen_unix_ms = now_ms;
	pthread_mutex_lock(&nodes->lock);
	if ((e = find_entry(nodes, id.s)) == NULL) {
		if (nodes->n == nodes->cap) {
			size_t cap = nodes->cap ? nodes->cap * 2 : 8;
			struct moat_node_entry *grown =
			    realloc(nodes->entries, cap * sizeof(*grown));
			if (grown == NULL) {
				pthread_mutex_unlock(&nodes->lock);
				moat__v1__node__free_unpacked(node, NULL);
				return MOAT_RESOURCE_EXHAUSTED;
			}
			nodes->entries = grown;
			nodes->cap = cap;
		}
		e = &nodes->entries[nodes->n++];
		memset(e, 0, sizeof(*e));
		e->id = id;
		moat_info(0,
		    "node %s joined: rpc %s, %u vcpus, %llu MiB, "
		    "accel %s, driver %s",
		    id.s, node->rpc_url, node->vcpus_total,
		    (unsigned long long)node->memory_mib_total,
		    node->accel[0] ? node->accel : "undecided",
		    node->driver[0] ? node->driver : "unknown");
	} else {
		if (!e->available)
			moat_info(0, "node %s answers again: available", id.s);
		if (e->node != NULL &&
		    strcmp(e->node->rpc_url, node->rpc_url) != 0)
			moat_info(0, "node %s moved from %s to %s", id.s,
			    e->node->rpc_url, node->rpc_url);
		if (e->node != NULL)
			moat__v1__node__free_unpacked(e->node, NULL);
	}
	e->node = node;
	e->last_seen_unix_ms = now_ms;
	e->last_seen_ms = moat_rpc_now_ms();
	e->missed = 0;
	e->answered = true;
	e->available = true;
	pthread_mutex_unlock(&nodes->lock);
	return MOAT_OK;
}

/* entry_forget: drops entry i, keeping the others in order (ListNodes
 * shows them as they joined). Calls still holding its connection finish
 * on it; the lock is held. */
static void
entry_forget(struct moat_nodes *nodes, size_t i)
{
	struct moat_node_entry *e = &nodes->entries[i];

	if (e->node != NULL)
		moat__v1__node__free_unpacked(e->node, NULL);
	conn_unref(e->conn);
	memmove(e, e + 1, (nodes->n - i - 1) * sizeof(*e));
	nodes->n--;
}

void
moat_nodes_round_end(struct moat_nodes *nodes)
{
	size_t i = 0;

	pthread_mutex_lock(&nodes->lock);
	while (i < nodes->n) {
		struct moat_node_entry *e = &nodes->entries[i];

		if (!e->answered && e->missed < UINT32_MAX)
			e->missed++;
		e->answered = false;
		if (e->available && e->missed >= nodes->missed_limit) {
			e->available = false;
			if (e->node != NULL)
				e->node->available = false;
			moat_warn(0,
			    "node %s stopped answering surveys (%u "
			    "missed): marked unavailable; is its moat-vmd "
			    "running?",
			    e->id.s, e->missed);
		}
		/* Only an unavailable node is forgotten: one that still
		 * answers is never dropped. */
		if (!e->available && nodes->forget_rounds != 0 &&
		    e->missed >= nodes->forget_rounds) {
			moat_warn(0,
			    "node %s silent for %u surveys in a row "
			    "([gateway] node-forget-s): dropped from the "
			    "node list; it joins again when it answers",
			    e->id.s, e->missed);
			entry_forget(nodes, i);
			continue;
		}
		i++;
	}
	pthread_mutex_unlock(&nodes->lock);
}

void
moat_nodes_mark_down(struct moat_nodes *nodes, const struct moat_node_id *id,
    const char *method, uint64_t since_ms)
{
	struct moat_node_entry *e;

	pthread_mutex_lock(&nodes->lock);
	if ((e = find_entry(nodes, id->s)) != NULL && e->available &&
	    e->last_seen_ms < since_ms) {
		e->available = false;
		if (e->node != NULL)
			e->node->available = false;
		/* Counted as silent from now: its next answer brings it
		 * back, as after any outage. */
		if (e->missed < nodes->missed_limit)
			e->missed = nodes->missed_limit;
		moat_warn(0,
		    "node %s does not take calls (no connection; %s did "
		    "not get through): marked unavailable until it answers "
		    "a survey again",
		    e->id.s, method);
	}
	pthread_mutex_unlock(&nodes->lock);
}

void
moat_nodes_answered(struct moat_nodes *nodes, const struct moat_node_id *id)
{
	struct moat_node_entry *e;

	pthread_mutex_lock(&nodes->lock);
	if ((e = find_entry(nodes, id->s)) != NULL && e->available) {
		e->last_seen_ms = moat_rpc_now_ms();
		e->answered = true;
		e->missed = 0;
	}
	pthread_mutex_unlock(&nodes->lock);
}

int
moat_nodes_snapshot(struct moat_nodes *nodes, Moat__V1__Node ***out, size_t *n)
{
	Moat__V1__Node **list = NULL;
	size_t count = 0;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&nodes->lock);
	if (nodes->n > 0 && (list = calloc(nodes->n, sizeof(*list))) == NULL)
		goto fail;
	for (size_t i = 0; i < nodes->n; i++) {
		struct moat_node_entry *e = &nodes->entries[i];

		if (e->node == NULL)
			continue;
		if ((list[count] = node_copy(e->node)) == NULL)
			goto fail;
		list[count]->available = e->available;
		list[count]->last_seen_unix_ms = e->last_seen_unix_ms;
		count++;
	}
	pthread_mutex_unlock(&nodes->lock);
	*out = list;
	*n = count;
	return MOAT_OK;

fail:
	pthread_mutex_unlock(&nodes->lock);
	moat_nodes_snapshot_free(list, count);
	return MOAT_RESOURCE_EXHAUSTED;
}

void
moat_nodes_snapshot_free(Moat__V1__Node **list, size_t n)
{
	if (list == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		if (list[i] != NULL)
			moat__v1__node__free_unpacked(list[i], NULL);
	free(list);
}

int
moat_nodes_available_ids(struct moat_nodes *nodes, struct moat_node_id **out,
    size_t *n)
{
	struct moat_node_id *ids = NULL;
	size_t count = 0;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&nodes->lock);
	if (nodes->n > 0 && (ids = calloc(nodes->n, sizeof(*ids))) == NULL) {
		pthread_mutex_unlock(&nodes->lock);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < nodes->n; i++)
		if (nodes->entries[i].available)
			ids[count++] = nodes->entries[i].id;
	pthread_mutex_unlock(&nodes->lock);
	if (count == 0) {
		free(ids);
		ids = NULL;
	}
	*out = ids;
	*n = count;
	return MOAT_OK;
}

int
moat_nodes_conn_get(struct moat_nodes *nodes, const struct moat_node_id *id,
    struct moat_node_conn **out, char **url_out, char **errmsg)
{
	struct moat_node_entry *e;
	struct moat_node_conn *c;
	int rv;

	*out = NULL;
	if (url_out != NULL)
		*url_out = NULL;
	pthread_mutex_lock(&nodes->lock);
	if ((e = find_entry(nodes, id->s)) == NULL || e->node == NULL) {
		pthread_mutex_unlock(&nodes->lock);
		*errmsg = moat_asprintf("node %s is not known to the gateway: "
		                        "list nodes with `moat info`",
		    id->s);
		return MOAT_NOT_FOUND;
	}
	if (e->conn == NULL || strcmp(e->conn->url, e->node->rpc_url) != 0) {
		/* A new url: drop the entry's ref on the old client (calls
		 * still holding it finish on it) and dial the new one. The
		 * dial does not block. */
		conn_unref(e->conn);
		e->conn = NULL;
		if ((c = calloc(1, sizeof(*c))) == NULL ||
		    (c->url = strdup(e->node->rpc_url)) == NULL) {
			free(c);
			pthread_mutex_unlock(&nodes->lock);
			*errmsg =
			    moat_asprintf("node %s: out of memory", id->s);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		/* The node's id is the TLS server name: only the holder of
		 * its certificate answers as it. */
		struct moat_rpc_client_opts co = {
			.tls = nodes->tls,
			.server_name = id->s,
			.what = "the dial to a node (its survey rpc_url)",
		};
		if ((rv = moat_rpc_client_open_opts(&c->client, c->url, &co,
		         errmsg)) != MOAT_OK) {
			free(c->url);
			free(c);
			pthread_mutex_unlock(&nodes->lock);
			return rv;
		}
		atomic_init(&c->refs, 1);
		e->conn = c;
	}
	c = e->conn;
	atomic_fetch_add(&c->refs, 1);
	if (url_out != NULL)
		*url_out = strdup(c->url);
	pthread_mutex_unlock(&nodes->lock);
	*out = c;
	return MOAT_OK;
}

struct moat_rpc_client *
moat_node_conn_client(struct moat_node_conn *conn)
{
	return conn->client;
}

void
moat_node_conn_put(struct moat_node_conn *conn)
{
	conn_unref(conn);
}

/* ---- the survey loop ---- */

/* survey_answer: decodes and records one answer; never fails the loop. */
static void
survey_answer(struct moat_discovery *d, nng_msg *m)
{
	size_t len = nng_msg_len(m);
	Moat__V1__Node *node;
	int rv;

	uint64_t now = moat_rpc_now_ms();

	node = moat__v1__node__unpack(NULL, len, nng_msg_body(m));
	/* A new id or url waits for its proof (node_proof.c). */
	if (node != NULL && d->prover != NULL &&
	    moat_node_prover_offer(d->prover, node))
		return;
	rv = node == NULL ?
	    MOAT_INVALID_ARGUMENT :
	    moat_nodes_seen(d->nodes, node, moat_now_unix_ms());
	if (rv == MOAT_INVALID_ARGUMENT) {
		d->bad_since_log++;
		if (d->bad_logged_ms != 0 &&
		    now - d->bad_logged_ms < BAD_ANSWER_LOG_MS)
			return;
		moat_warn(0,
		    "discovery: ignored %u survey answer(s) that are "
		    "not a moat.v1.Node with a node_id and rpc_url (last: %zu "
		    "bytes); a program of another version dials %s",
		    d->bad_since_log, len, d->url);
		d->bad_logged_ms = now;
		d->bad_since_log = 0;
	} else if (rv != MOAT_OK)
		moat_warn(0, "discovery: could not record a node answer: %s",
		    moat_strerror(rv));
}

/* The thread never blocks in nng longer than DISCOVERY_POLL_MS, and
 * stop joins it before closing the socket: nng 1.5 can deadlock in
 * nng_close while another thread sits in a receive on the socket. */
static void *
survey_main(void *arg)
{
	struct moat_discovery *d = arg;
	uint64_t survey_ms = d->interval_ms * 9 / 10;

	while (!atomic_load(&d->stop)) {
		uint64_t started = moat_rpc_now_ms(), spent;
		nng_msg *m;
		int rv;

		if ((rv = nng_msg_alloc(&m, 0)) != 0)
			goto pause;
		if ((rv = nng_sendmsg(d->sock, m, 0)) != 0) {
			nng_msg_free(m);
			if (rv == NNG_ECLOSED)
				return NULL;
			moat_warn(0, "discovery: survey on %s failed: %s",
			    d->url, nng_strerror(rv));
			goto pause;
		}
		/* Answers arrive until the survey time runs out (ETIMEDOUT
		 * once it has; ESTATE after). */
		while (!atomic_load(&d->stop)) {
			rv = nng_recvmsg(d->sock, &m, 0);
			if (rv == NNG_ECLOSED)
				return NULL;
			if (rv == NNG_ETIMEDOUT &&
			    moat_rpc_now_ms() - started < survey_ms)
				continue; /* a poll, not the survey's end */
			if (rv != 0)
				break;
			survey_answer(d, m);
			nng_msg_free(m);
		}
		moat_nodes_round_end(d->nodes);
pause:
		/* Keep a steady pace even when the survey ended early. */
		while (!atomic_load(&d->stop) &&
		    (spent = moat_rpc_now_ms() - started) < d->interval_ms)
			nng_msleep((nng_duration)(d->interval_ms - spent <
			            DISCOVERY_POLL_MS ?
			        d->interval_ms - spent :
			        DISCOVERY_POLL_MS));
	}
	return NULL;
}

/* forget_rounds: the table's forget_rounds from [gateway] node-forget-s
 * in `config` or MOAT_GATEWAY_NODE_FORGET_S (config NULL: the
 * environment only) and the survey interval. */
static int
forget_rounds(const struct moat_discovery *d, const struct moat_config *config,
    uint32_t *out, char **errmsg)
{
	uint64_t forget_s, rounds;
	int rv;

	if ((rv = moat_config_get_u64(config, "gateway", "node-forget-s",
	         MOAT_GW_NODE_FORGET_S, &forget_s, errmsg)) != MOAT_OK)
		return rv;
	if (forget_s > UINT32_MAX) {
		*errmsg = moat_asprintf(
		    "node-forget-s (MOAT_GATEWAY_NODE_FORGET_S) %llu is "
		    "too large: give seconds, at most %u (0: never drop a "
		    "node)",
		    (unsigned long long)forget_s, UINT32_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	/* Rounded up: a node is dropped no sooner than the stated time. */
	rounds = (forget_s * 1000 + d->interval_ms - 1) / d->interval_ms;
	*out = rounds > UINT32_MAX ? UINT32_MAX : (uint32_t)rounds;
	return MOAT_OK;
}

int
moat_discovery_start(struct moat_discovery **out, struct moat_nodes *nodes,
    const char *url, uint32_t interval_ms, const struct moat_config *config,
    char **errmsg)
{
	return moat_discovery_start_tls(out, nodes, url, interval_ms, config,
	    NULL, errmsg);
}

int
moat_discovery_start_tls(struct moat_discovery **out, struct moat_nodes *nodes,
    const char *url, uint32_t interval_ms, const struct moat_config *config,
    const struct moat_tls *survey_tls, char **errmsg)
{
	struct moat_discovery *d;
	nng_listener l;
	uint32_t forget;
	int rv;

	*out = NULL;
	if ((d = calloc(1, sizeof(*d))) == NULL ||
	    (d->url = strdup(url)) == NULL) {
		free(d);
		*errmsg = moat_asprintf("discovery on %s: out of memory", url);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	d->nodes = nodes;
	d->interval_ms =
	    interval_ms ? interval_ms : MOAT_GW_SURVEY_INTERVAL_MS;
	if ((rv = forget_rounds(d, config, &forget, errmsg)) != MOAT_OK) {
		moat_discovery_stop(d);
		return rv;
	}
	if ((rv = nng_surveyor0_open(&d->sock)) != 0)
		goto fail_nng;
	d->has_socket = true;
	/* The survey lasts a little less than the interval, so a round ends
	 * before the next one starts. */
	if ((rv = nng_socket_set_ms(d->sock, NNG_OPT_SURVEYOR_SURVEYTIME,
	         (nng_duration)(d->interval_ms * 9 / 10))) != 0 ||
	    (rv = nng_socket_set_ms(d->sock, NNG_OPT_RECVTIMEO,
	         DISCOVERY_POLL_MS)) != 0 ||
	    (rv = nng_socket_set_ms(d->sock, NNG_OPT_SENDTIMEO,
	         DISCOVERY_POLL_MS)) != 0 ||
	    (rv = nng_socket_set_size(d->sock, NNG_OPT_RECVMAXSZ,
	         MOAT_GW_NODE_ANSWER_MAX)) != 0)
		goto fail_nng;
	if ((rv = nng_listener_create(&l, d->sock, url)) != 0)
		goto fail_nng;
	/* Answers only from holders of a node certificate (the survey's
	 * peer CAs); which node, the prover checks. */
	if ((rv = moat_tls_listener_apply(l, url, survey_tls,
	         MOAT_TLS_PEER_REQUIRED,
	         "the survey listener ([gateway] survey)", errmsg)) !=
	        MOAT_OK ||
	    (moat_tls_has_ca(nodes->tls) &&
	        (rv = moat_node_prover_start(&d->prover, nodes, errmsg)) !=
	            MOAT_OK)) {
		moat_discovery_stop(d);
		return rv;
	}
	if ((rv = nng_listener_start(l, 0)) != 0)
		goto fail_nng;
	/* Set only once this discovery owns the url: a second start that
	 * fails leaves the running one's table alone. */
	pthread_mutex_lock(&nodes->lock);
	nodes->forget_rounds = forget;
	pthread_mutex_unlock(&nodes->lock);
	if ((rv = pthread_create(&d->thread, NULL, survey_main, d)) != 0) {
		*errmsg = moat_asprintf("discovery on %s: cannot start its "
		                        "thread: %s",
		    url, strerror(rv));
		moat_discovery_stop(d);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	d->thread_started = true;
	*out = d;
	return MOAT_OK;

fail_nng:
	*errmsg = moat_asprintf("discovery: cannot listen on %s: %s%s", url,
	    nng_strerror(rv),
	    rv == NNG_EADDRINUSE ?
	        ": another gateway is "
	        "running there; stop it or pick another --survey url" :
	        "");
	moat_discovery_stop(d);
	return rv == NNG_EADDRINUSE ? MOAT_ALREADY_EXISTS :
	                              moat_status_from_nng(rv);
}

void
moat_discovery_stop(struct moat_discovery *d)
{
	if (d == NULL)
		return;
	atomic_store(&d->stop, true);
	if (d->thread_started)
		pthread_join(d->thread, NULL);
	moat_node_prover_stop(d->prover);
	if (d->has_socket && !moat_nng_close_bounded(d->sock, 2000))
		moat_warn(0,
		    "discovery %s: closing the socket hung (an nng "
		    "1.5 bug); left it open",
		    d->url);
	free(d->url);
	free(d);
}
