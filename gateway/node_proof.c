/*
 * node_proof.c: a node's identity, proven before a survey answer counts.
 * The survey listener only checks that an answer comes from a holder of
 * some node certificate (the vmd intermediate); which node it is, is
 * proven at the dial: a Health call to the answer's rpc_url with the TLS
 * server name set to its node id, so only the holder of that node's
 * certificate passes. An answer with a new id, or a known id with another
 * url, is queued here; one thread proves the queue (a bounded Health call
 * each), so the survey loop never waits on a dial. A refused answer
 * leaves the node table as it was (the real node's entry untouched), is
 * logged at most once per id a minute, and the same (id, url) is not
 * tried again for MOAT_GW_PROOF_RETRY_MS.
 * Not for: the node table itself (discovery.c) or the dials of calls
 * (moat_nodes_conn_get, which uses the same server name).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.pb-c.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/tls.h"
#include "moat/util.h"

#define PROOF_QUEUE_MAX 16  /* answers waiting; more are dropped */
#define PROOF_MEMORY_MAX 64 /* (id, url) pairs remembered */

/* One (id, url) tried lately. */
struct proof_seen {
	char id[sizeof(((struct moat_node_id *)0)->s)];
	char *url;
	uint64_t tried_ms;
	uint64_t logged_ms; /* of a refusal of this id; 0: none */
};

struct proof_item {
	Moat__V1__Node *node;
	struct proof_item *next;
};

struct moat_node_prover {
	struct moat_nodes *nodes;
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t wake;
	bool stop;
	struct proof_item *head, **tail;
	unsigned queued;
	struct proof_seen seen[PROOF_MEMORY_MAX];
	unsigned passed, refused;
};

/* seen_find: the record of (id, url), or a free or the oldest slot
 * (reset) when `make`. Lock held. */
static struct proof_seen *
seen_find(struct moat_node_prover *p, const char *id, const char *url,
    bool make)
{
	struct proof_seen *oldest = &p->seen[0];

	for (size_t i = 0; i < PROOF_MEMORY_MAX; i++) {
		struct proof_seen *s = &p->seen[i];

		if (s->url != NULL && strcmp(s->id, id) == 0 &&
		    strcmp(s->url, url) == 0)
			return s;
		if (s->url == NULL || s->tried_ms < oldest->tried_ms)
			oldest = s;
	}
	if (!make)
		return NULL;
	free(oldest->url);
	memset(oldest, 0, sizeof(*oldest));
	if ((oldest->url = strdup(url)) == NULL)
		return NULL;
	snprintf(oldest->id, sizeof(oldest->id), "%s", id);
	return oldest;
}

/* log_refusal: at most once per id per MOAT_GW_PROOF_LOG_MS. Lock held. */
static void
log_refusal(struct moat_node_prover *p, const char *id, const char *url,
    const char *why)
{
	uint64_t now = moat_rpc_now_ms();
	struct proof_seen *mine;

	for (size_t i = 0; i < PROOF_MEMORY_MAX; i++) {
		struct proof_seen *s = &p->seen[i];

		if (s->url != NULL && s->logged_ms != 0 &&
		    strcmp(s->id, id) == 0 &&
		    now - s->logged_ms < MOAT_GW_PROOF_LOG_MS)
			return;
	}
	if ((mine = seen_find(p, id, url, true)) != NULL)
		mine->logged_ms = now;
	moat_warn(0,
	    "discovery: refused a survey answer naming node %s at %s: "
	    "%s; the node table is unchanged (a node's certificate must "
	    "name its node id and come from the gateway's tls-ca)",
	    id, url, why);
}

bool
moat_node_prover_offer(struct moat_node_prover *p, Moat__V1__Node *node)
{
	const char *url = node->rpc_url, *id = node->node_id;
	struct proof_seen *s;
	struct proof_item *it;
	uint64_t now = moat_rpc_now_ms();

	if (id == NULL || id[0] == '\0' || url == NULL || url[0] == '\0' ||
	    strlen(id) >= sizeof(s->id))
		return false; /* moat_nodes_seen refuses it, and says so */
	if (strncmp(url, "ipc://", 6) == 0 ||
	    moat_nodes_knows(p->nodes, id, url))
		return false;
	pthread_mutex_lock(&p->lock);
	if (!moat_tls_url_is_tls(url) && !moat_tls_insecure(p->nodes->tls)) {
		p->refused++;
		log_refusal(p, id, url,
		    "its rpc url is not tls+tcp://, so its identity "
		    "cannot be proven (set [vmd] listen to tls+tcp://, or "
		    "[gateway] insecure = true)");
		goto taken;
	}
	if (!moat_tls_url_is_tls(url)) {
		pthread_mutex_unlock(&p->lock);
		return false; /* insecure: as without TLS */
	}
	if ((s = seen_find(p, id, url, false)) != NULL &&
	    now - s->tried_ms < MOAT_GW_PROOF_RETRY_MS)
		goto taken;
	if (p->queued >= PROOF_QUEUE_MAX || p->stop ||
	    (s = seen_find(p, id, url, true)) == NULL ||
	    (it = calloc(1, sizeof(*it))) == NULL)
		goto taken; /* answered again next round */
	s->tried_ms = now;
	it->node = node;
	*p->tail = it;
	p->tail = &it->next;
	p->queued++;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	return true;
taken:
	pthread_mutex_unlock(&p->lock);
	moat__v1__node__free_unpacked(node, NULL);
	return true;
}

/* prove: the Health call; MOAT_OK or the status with *why (heap). */
static int
prove(struct moat_node_prover *p, const Moat__V1__Node *node, char **why)
{
	struct moat_rpc_client_opts co = {
		.tls = p->nodes->tls,
		.server_name = node->node_id,
		.what = "the proof of a node's identity",
		.quiet = true,
	};
	struct moat_rpc_opts o = { .timeout_ms = MOAT_GW_PROOF_TIMEOUT_MS };
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_client *c = NULL;
	ProtobufCMessage *reply = NULL;
	int rv;

	*why = NULL;
	if ((rv = moat_rpc_client_open_opts(&c, node->rpc_url, &co, why)) !=
	    MOAT_OK)
		return rv;
	rv = moat_rpc_call(c, "moat.v1.Vm", "Health", &req.base,
	    &moat__v1__health_reply__descriptor, &reply, &o, why);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	moat_rpc_client_close(c);
	return rv;
}

static void *
prover_main(void *arg)
{
	struct moat_node_prover *p = arg;
	struct proof_item *it;
	char *why;
	int rv;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->stop && p->head == NULL)
			pthread_cond_wait(&p->wake, &p->lock);
		if (p->stop)
			break;
		it = p->head;
		if ((p->head = it->next) == NULL)
			p->tail = &p->head;
		p->queued--;
		pthread_mutex_unlock(&p->lock);
		rv = prove(p, it->node, &why);
		pthread_mutex_lock(&p->lock);
		if (rv == MOAT_OK) {
			/* Recorded first, counted after: whoever sees the
			 * count finds the node in the table. */
			pthread_mutex_unlock(&p->lock);
			moat_info(0, "discovery: node %s proved its id at %s",
			    it->node->node_id, it->node->rpc_url);
			if (moat_nodes_seen(p->nodes, it->node,
			        moat_now_unix_ms()) != MOAT_OK)
				moat_warn(0,
				    "discovery: could not record a "
				    "proven node");
			pthread_mutex_lock(&p->lock);
			p->passed++;
		} else {
			p->refused++;
			log_refusal(p, it->node->node_id, it->node->rpc_url,
			    why ? why : moat_strerror(rv));
			moat__v1__node__free_unpacked(it->node, NULL);
		}
		free(why);
		free(it);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int
moat_node_prover_start(struct moat_node_prover **out, struct moat_nodes *nodes,
    char **errmsg)
{
	struct moat_node_prover *p;
	int rv;

	*out = NULL;
	if ((p = calloc(1, sizeof(*p))) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	p->nodes = nodes;
	p->tail = &p->head;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	if ((rv = pthread_create(&p->thread, NULL, prover_main, p)) != 0) {
		*errmsg = moat_asprintf("cannot start the node prover "
		                        "thread: %s",
		    strerror(rv));
		moat_node_prover_stop(p);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	p->thread_started = true;
	*out = p;
	return MOAT_OK;
}

void
moat_node_prover_counts(struct moat_node_prover *p, unsigned *passed,
    unsigned *refused)
{
	pthread_mutex_lock(&p->lock);
	*passed = p->passed;
	*refused = p->refused;
	pthread_mutex_unlock(&p->lock);
}

void
moat_node_prover_stop(struct moat_node_prover *p)
{
	struct proof_item *it;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	if (p->thread_started)
		pthread_join(p->thread, NULL);
	while ((it = p->head) != NULL) {
		p->head = it->next;
		moat__v1__node__free_unpacked(it->node, NULL);
		free(it);
	}
	for (size_t i = 0; i < PROOF_MEMORY_MAX; i++)
		free(p->seen[i].url);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
