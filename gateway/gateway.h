/*
 * gateway.h: the parts of moat-gateway that its files share, and that the
 * unit tests drive in-process: the node table fed by discovery, placement,
 * the sandbox -> node map and forwarding, and the gateway object that ties
 * them to the Gateway RPC service. Every sandbox call goes through the
 * multi-node path (locate the node holding the sandbox, forward to it),
 * even when there is one node.
 * Not for: clients (they use clients/lib/moat_client.h) or the wire
 * (proto/gateway.proto).
 */
#ifndef MOAT_GATEWAY_H
#define MOAT_GATEWAY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway.pb-c.h"
#include "moat/config.h"
#include "moat/rpc.h"
#include "moat/tls.h"
#include "session.pb-c.h"
#include "vm.pb-c.h"

#define MOAT_ID_MAX 128                    /* longest id, with its NUL */
#define MOAT_GW_SURVEY_INTERVAL_MS 1000    /* one survey a second */
#define MOAT_GW_MISSED_SURVEYS 3           /* silent this often: unavailable */
#define MOAT_GW_NODE_FORGET_S 600          /* silent this long: dropped */
#define MOAT_GW_HEALTH_TIMEOUT_MS 1500     /* Info's health calls */
#define MOAT_GW_NODE_ANSWER_MAX (1u << 20) /* cap on one survey answer */
#define MOAT_GW_DEFAULT_TENANT "default"

/* Ids that must not be mixed up get their own types. */
struct moat_node_id {
	char s[MOAT_ID_MAX];
};
struct moat_sandbox_id {
	char s[MOAT_ID_MAX];
};

/* moat_node_id_set / moat_sandbox_id_set: copy `s` in. Return false when
 * it is empty or does not fit (MOAT_ID_MAX - 1 bytes). */
bool moat_node_id_set(struct moat_node_id *id, const char *s);
bool moat_sandbox_id_set(struct moat_sandbox_id *id, const char *s);

/* ---- node table (discovery.c) ---- */

struct moat_node_conn;
struct moat_node_entry;
struct moat_admission;

struct moat_nodes {
	pthread_mutex_t lock; /* guards entries, n, cap, each entry */
	struct moat_node_entry *entries;
	size_t n, cap;
	uint32_t missed_limit; /* MOAT_GW_MISSED_SURVEYS */
	/* Surveys in a row an unavailable node may miss before it is
	 * dropped (0: never); moat_discovery_start sets it from
	 * MOAT_GATEWAY_NODE_FORGET_S and its interval. */
	uint32_t forget_rounds;
	/* TLS for the dials to nodes (borrowed; NULL: none): a node is
	 * dialed with its id as the TLS server name, and with tls-ca set
	 * a survey answer with a new id or url is proven first
	 * (node_proof.c). Set before discovery starts. */
	const struct moat_tls *tls;
};

/* moat_nodes_init / moat_nodes_fini: fini closes every cached client (no
 * call may be in flight) and is safe on a zeroed table. */
int moat_nodes_init(struct moat_nodes *nodes)
    __attribute__((warn_unused_result));
void moat_nodes_fini(struct moat_nodes *nodes);

/* moat_nodes_seen: records one survey answer. Takes ownership of `node`
 * in every case (frees it on failure). A node id seen for the first time
 * joins the table available; a known one is refreshed (capacity, url).
 * Returns INVALID_ARGUMENT (logged by the caller) when the answer lacks a
 * node id or rpc url, or the id is too long. */
int moat_nodes_seen(struct moat_nodes *nodes, Moat__V1__Node *node,
    uint64_t now_ms) __attribute__((warn_unused_result));

/* moat_nodes_knows: `id` is in the table with rpc url `url`. */
bool moat_nodes_knows(struct moat_nodes *nodes, const char *id,
    const char *url);

/* moat_nodes_round_end: ends one survey round: a node that did not answer
 * in it counts a miss; missed_limit misses in a row mark it unavailable
 * (logged once); forget_rounds misses drop an unavailable node from the
 * table (logged). */
void moat_nodes_round_end(struct moat_nodes *nodes);

/* moat_nodes_snapshot: deep copies of every known node (available or
 * not), with `available` and `last_seen_unix_ms` set. On MOAT_OK *out is
 * an array of *n messages the caller frees with moat_nodes_snapshot_free.
 * RESOURCE_EXHAUSTED on allocation failure. */
int moat_nodes_snapshot(struct moat_nodes *nodes, Moat__V1__Node ***out,
    size_t *n) __attribute__((warn_unused_result));
void moat_nodes_snapshot_free(Moat__V1__Node **list, size_t n);

/* moat_nodes_conn_get: a reference to the cached RPC client of node `id`
 * (opened on first use, reopened when the node's url changed). On MOAT_OK
 * *out is held until moat_node_conn_put; *url_out (optional) is a heap
 * copy of its url the caller frees. NOT_FOUND when the node is unknown;
 * other failures set *errmsg (heap, caller frees). Thread-safe. */
int moat_nodes_conn_get(struct moat_nodes *nodes,
    const struct moat_node_id *id, struct moat_node_conn **out, char **url_out,
    char **errmsg) __attribute__((warn_unused_result));
struct moat_rpc_client *moat_node_conn_client(struct moat_node_conn *conn);
void moat_node_conn_put(struct moat_node_conn *conn);

/* moat_nodes_available_ids: ids of the nodes available now. *out is a
 * heap array of *n ids, the caller frees (NULL when none). */
int moat_nodes_available_ids(struct moat_nodes *nodes,
    struct moat_node_id **out, size_t *n) __attribute__((warn_unused_result));

/* ---- discovery (discovery.c) ---- */

struct moat_discovery;

/* moat_discovery_start: binds a surveyor0 socket on `url` (ipc sockets
 * mode 0600) and starts a thread that surveys every `interval_ms` (0:
 * MOAT_GW_SURVEY_INTERVAL_MS), feeding every answer that decodes as a
 * moat.v1.Node into `nodes` (which must outlive the discovery). A
 * malformed answer is logged and ignored. A node silent for [gateway]
 * node-forget-s of `config` (borrowed; NULL: MOAT_GATEWAY_NODE_FORGET_S
 * only) is dropped. On failure returns a status and sets *errmsg (heap,
 * caller frees). */
int moat_discovery_start(struct moat_discovery **out, struct moat_nodes *nodes,
    const char *url, uint32_t interval_ms, const struct moat_config *config,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_discovery_start_tls: moat_discovery_start with the address rules
 * and, on tls+tcp://, TLS on the survey listener from `survey_tls` (the
 * answering nodes' certificates required, from its peer CAs). With
 * nodes->tls able to dial TLS (tls-ca), answers with a new node id or a
 * new url are proven before they count (moat_node_prover). */
int moat_discovery_start_tls(struct moat_discovery **out,
    struct moat_nodes *nodes, const char *url, uint32_t interval_ms,
    const struct moat_config *config, const struct moat_tls *survey_tls,
    char **errmsg) __attribute__((warn_unused_result));

/* ---- node identity (node_proof.c) ---- */

/* How long a node's Health call may take to prove its id, how soon the
 * same (id, url) is tried again, how often a refusal per id is logged. */
#define MOAT_GW_PROOF_TIMEOUT_MS 1000
#define MOAT_GW_PROOF_RETRY_MS 10000
#define MOAT_GW_PROOF_LOG_MS 60000

struct moat_node_prover;

/* moat_node_prover_start: a thread that proves survey answers: a short
 * Health call to the answer's rpc_url with TLS server name = its node id
 * (so only the holder of that node's certificate passes). A proven
 * answer goes into `nodes` (moat_nodes_seen); a refused one is logged (at
 * most once per id per MOAT_GW_PROOF_LOG_MS) and the table is left as it
 * was. Needs nodes->tls. */
int moat_node_prover_start(struct moat_node_prover **out,
    struct moat_nodes *nodes, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_node_prover_offer: takes `node` (ownership) when it needs a proof
 * (an id not in the table, or a known id with another url) and returns
 * true: queued, or refused (plain tcp:// without insecure; the same (id,
 * url) tried in the last MOAT_GW_PROOF_RETRY_MS). False when no proof is
 * needed (known id and url; an ipc:// url): the caller records it. */
bool moat_node_prover_offer(struct moat_node_prover *p, Moat__V1__Node *node);

/* moat_node_prover_counts: proofs passed and refused so far (tests). */
void moat_node_prover_counts(struct moat_node_prover *p, unsigned *passed,
    unsigned *refused);

/* moat_node_prover_stop: joins the thread, drops what is queued. Safe on
 * NULL. */
void moat_node_prover_stop(struct moat_node_prover *p);

/* moat_discovery_stop: closes the socket, joins the thread, frees. Safe
 * on NULL. */
void moat_discovery_stop(struct moat_discovery *d);

/* ---- placement (placement.c) ---- */

/* moat_placement_choose: picks the node for a sandbox of `vcpus` and
 * `memory_mib` (0: the node defaults, 1 and 256) running `image` (""
 * is "default") among `nodes`: available, fits the per-sandbox limits,
 * has the memory free; nodes holding the image first (others must pull
 * it from moat-snapd), then fewest sandboxes, then most free memory,
 * then node id. On MOAT_OK *chosen is an index into nodes. Otherwise
 * returns UNAVAILABLE (no available node; the message names
 * `survey_url`), INVALID_ARGUMENT (no node could ever hold such a
 * sandbox), FAILED_PRECONDITION (every node unusable) or
 * RESOURCE_EXHAUSTED
 * (nodes are full), with *errmsg (heap, caller frees). Pure: no locks, no
 * I/O. */
int moat_placement_choose(Moat__V1__Node *const *nodes, size_t n,
    uint32_t vcpus, uint32_t memory_mib, const char *image,
    const char *survey_url, size_t *chosen, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_placement_spread: moat_placement_choose for `count` sandboxes in
 * a row (a fork's copies): each choice counts the ones before it on its
 * node (one sandbox more, its memory used), so equal nodes share them.
 * `prefer` (NULL or "": none) is taken for the first whenever it is
 * available and fits (a restore on the snapshot's own node pulls
 * nothing). When the counts say the nodes are full after the first, the
 * node of the one before is taken again (the node itself refuses if it
 * really is full). On MOAT_OK chosen[0..count)
 * are indexes into nodes. `nodes` is modified (its counts). Errors as
 * moat_placement_choose. */
int moat_placement_spread(Moat__V1__Node **nodes, size_t n, uint32_t count,
    uint32_t vcpus, uint32_t memory_mib, const char *image, const char *prefer,
    const char *survey_url, size_t *chosen, char **errmsg)
    __attribute__((warn_unused_result));

/* ---- forwarding (forward.c) ---- */

struct moat_sandbox_route;

struct moat_inventory;

struct moat_forward {
	struct moat_nodes *nodes;
	pthread_mutex_t lock; /* guards routes, n_routes, cap_routes */
	struct moat_sandbox_route *routes; /* sorted by sandbox id */
	size_t n_routes, cap_routes;
	/* Set by the gateway after init (NULL: none): the last known
	 * sandboxes of every node (inventory.c). Borrowed. */
	struct moat_inventory *inv;
	/* Locate's threads still asking nodes (guarded by lock): fini
	 * waits for them. */
	int locating;
	/* Forwards answered later still waiting for their node, and
	 * deferred recorded steps not yet answered (guarded by lock):
	 * moat_forward_drain waits for them. */
	int async_calls;
	bool draining; /* moat_forward_drain began (guarded by lock) */
};

int moat_forward_init(struct moat_forward *fw, struct moat_nodes *nodes)
    __attribute__((warn_unused_result));
/* moat_forward_fini: safe on a zeroed object. */
void moat_forward_fini(struct moat_forward *fw);

/* moat_forward_drain: waits (at most max_ms) for the forwards answered
 * later (moat_forward_call_async) to end: their completion still uses
 * the gateway. False when some still run (the gateway must then not be
 * freed). */
bool moat_forward_drain(struct moat_forward *fw, uint64_t max_ms);

/* moat_forward_async_begin / _end: a deferred recorded step (record_async.c)
 * counts as a forward answered later from its deferral to its answer,
 * so moat_forward_drain waits for it too. begin is false once draining
 * began (the step is then not deferred). moat_forward_draining: whether
 * it began (a step whose turn comes then does not run). */
bool moat_forward_async_begin(struct moat_forward *fw);
void moat_forward_async_end(struct moat_forward *fw);
bool moat_forward_draining(struct moat_forward *fw);

/* moat_forward_remember / moat_forward_forget: the sandbox -> node map. */
void moat_forward_remember(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, const struct moat_node_id *node);
void moat_forward_forget(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox);

/* moat_forward_locate: the node holding `sandbox` of `tenant`: from the
 * map, else from the inventory (fw->inv; the node may be unavailable),
 * else by asking every available node GetSandbox for `tenant` in
 * parallel (the first that has it wins; remembered). Threads asking slow
 * nodes outlive the call; moat_forward_fini waits for them.
 * NOT_FOUND when every node answered that it has no such sandbox (of
 * that tenant); UNAVAILABLE when some node did not answer and none has
 * it. Errors set *errmsg (heap, caller frees). */
int moat_forward_locate(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, const char *tenant,
    uint64_t deadline_ms, struct moat_node_id *node, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_forward_set_tenant: the tenant of a remembered sandbox, as its
 * node said it (a Sandbox reply); "" or NULL is ignored. */
void moat_forward_set_tenant(struct moat_forward *fw,
    const struct moat_sandbox_id *sandbox, const char *tenant);

/* moat_forward_check_owner: whether sandbox `sandbox_id` is `tenant`'s:
 * MOAT_OK when it is (the tenant cached with its route, else asked of
 * its node: GetSandbox for `tenant`, which answers NOT_FOUND for another
 * tenant's). NOT_FOUND, worded as for a missing sandbox, when it is
 * another tenant's or no node has it; other errors as
 * moat_forward_locate, with *errmsg (heap, caller frees). */
int moat_forward_check_owner(struct moat_forward *fw, const char *sandbox_id,
    const char *tenant, uint64_t deadline_ms, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_forward_to_node: sends the encoded `payload` as `method` of
 * moat.v1.Vm to node `node` for `tenant` (Envelope.tenant: the node
 * checks every sandbox, snapshot and listing against it; the gateway's
 * tenant rule is moat_gw_tenant, never "") with `request_id` and the
 * time left before `deadline_ms`. On MOAT_OK *reply (heap, caller frees; NULL when
 * *reply_len is 0) is the node's encoded reply. A node's error comes back
 * with its code and message unchanged; a node that does not answer is
 * UNAVAILABLE naming the node and `what` (e.g. "sandbox sb-1"). */
int moat_forward_to_node(struct moat_forward *fw,
    const struct moat_node_id *node, const char *tenant, const char *method,
    const uint8_t *payload, size_t len, uint64_t request_id,
    uint64_t deadline_ms, const char *what, uint8_t **reply, size_t *reply_len,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_forward_node_call: moat_forward_to_node with `req` encoded here
 * and the node's reply decoded as `reply_desc`: on MOAT_OK *out is the
 * caller's (free with protobuf_c_message_free_unpacked); a reply that
 * does not decode is INTERNAL naming the node. Errors set *errmsg
 * (heap). */
int moat_forward_node_call(struct moat_forward *fw,
    const struct moat_node_id *node, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *reply_desc,
    uint64_t request_id, uint64_t deadline_ms, const char *what,
    ProtobufCMessage **out, char **errmsg) __attribute__((warn_unused_result));

/* moat_forward_call: the whole forward of one sandbox call: locate the
 * node holding `sandbox_id` (UNAVAILABLE at once, saying how to bring
 * the sandbox back, when that node is marked unavailable), send it
 * `payload` (call->payload unless the gateway re-encoded the request) as
 * the same method for the call's tenant (moat_gw_tenant) with the same
 * request id and the remaining deadline, and put the node's reply in
 * call->raw_reply. Errors go through moat_rpc_error. Keeps the map in
 * step (NOT_FOUND from the node forgets the route; a DestroySandbox that
 * succeeded forgets it). */
int moat_forward_call(struct moat_forward *fw, struct moat_rpc_call *call,
    const char *sandbox_id, const uint8_t *payload, size_t len);

/* moat_forward_call_async: moat_forward_call for a call that may run
 * long (Exec, RunCode): the call is deferred (moat_rpc_defer) and sent
 * with moat_rpc_call_raw_async, so no gateway worker waits for the
 * node; the node's reply (with `safety`, when not NULL, set in its
 * `safety` field: `reply_desc` is its message) completes it. A call
 * that cannot be deferred (built outside the rpc server) is forwarded
 * as moat_forward_call does. Returns MOAT_OK once deferred, or the
 * routing error after moat_rpc_error. */
int moat_forward_call_async(struct moat_forward *fw,
    struct moat_rpc_call *call, const char *sandbox_id, const uint8_t *payload,
    size_t len, const ProtobufCMessageDescriptor *reply_desc,
    const char *safety);

/* moat_forward_node_async: call's method with `payload` (borrowed:
 * call->payload, or the request re-encoded) to node `node` (not a
 * sandbox's: an image build's, issue 17) as
 * moat_forward_call_async sends it: deferred, no worker waiting (a long
 * poll). `what` names what the node holds in the UNAVAILABLE message
 * ("build b-1"). A call that cannot be deferred is forwarded at once
 * into call->raw_reply. MOAT_OK once deferred or answered; else the
 * status after moat_rpc_error. */
int moat_forward_node_async(struct moat_forward *fw,
    struct moat_rpc_call *call, const struct moat_node_id *node,
    const char *what, const uint8_t *payload, size_t len,
    const ProtobufCMessageDescriptor *reply_desc);

/* Called once with the node's outcome of moat_forward_call_async_fn, on
 * the rpc client's thread (it must not block: it only queues work).
 * `reply` (heap; NULL unless code is MOAT_OK) and `errmsg` (heap or
 * NULL; the node's words, or the gateway's for a node that did not
 * answer) are the callback's to free. */
typedef void (*moat_forward_done)(void *arg, int code, uint8_t *reply,
    size_t len, char *errmsg);

/* moat_forward_call_async_fn: the callback flavour of
 * moat_forward_call_async, for a caller that does more after the node's
 * answer (a recorded step, record_async.c): `call` (only its method,
 * request id, deadline and tenant are read; it need not be deferrable)
 * is routed and sent to the node without waiting. Returns MOAT_OK when
 * done(arg, ...) will be called exactly once; else a status after
 * moat_rpc_error(call), and done is never called. Counted by
 * moat_forward_drain until done has returned. */
int moat_forward_call_async_fn(struct moat_forward *fw,
    struct moat_rpc_call *call, const char *sandbox_id, const uint8_t *payload,
    size_t len, moat_forward_done done, void *arg)
    __attribute__((warn_unused_result));

/* moat_gw_set_safety_raw: sets the `safety` string field of the encoded
 * `desc` message in *raw (re-encoded in place; unchanged when it has no
 * such field or does not decode). handlers.c. */
void moat_gw_set_safety_raw(const ProtobufCMessageDescriptor *desc,
    uint8_t **raw, size_t *len, const char *level);

/* ---- inventory of every node's sandboxes (inventory.c) ---- */

#define MOAT_GW_INVENTORY_INTERVAL_MS 1000 /* one refresh a second */
#define MOAT_GW_INVENTORY_TIMEOUT_MS 800   /* per node, per refresh */

/* moat_inventory_start: the inventory over `nodes`, asking them through
 * `fw` (both borrowed, outliving it) every interval_ms (0:
 * MOAT_GW_INVENTORY_INTERVAL_MS) when `background` (else only when
 * moat_inventory_refresh is called: the tests). Errors set *errmsg
 * (heap). */
int moat_inventory_start(struct moat_inventory **out, struct moat_nodes *nodes,
    struct moat_forward *fw, uint32_t interval_ms, bool background,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_inventory_set_audit: from now on each round also fetches every
 * node's guest egress events (vmd EgressEvents) into `auth`'s audit log
 * of each event's tenant (method "Egress"; issue 14). Safe on NULL. */
struct moat_auth;
void moat_inventory_set_audit(struct moat_inventory *inv,
    struct moat_auth *auth);

/* moat_inventory_stop: joins the thread, frees. Safe on NULL. */
void moat_inventory_stop(struct moat_inventory *inv);

/* moat_inventory_refresh: one round: every available node is asked
 * ListAllSandboxes, all in parallel, each within the refresh timeout; an
 * answer replaces the node's list (and feeds the routes); a node that
 * does not answer keeps its last one; the entries of nodes dropped from
 * the table go. Blocks for at most the timeout. */
void moat_inventory_refresh(struct moat_inventory *inv);

/* moat_inventory_node_list: `list` is all node `node` holds now.
 * moat_inventory_put: one sandbox more (created or restored there).
 * moat_inventory_forget: a sandbox destroyed. All safe on inv NULL. */
void moat_inventory_node_list(struct moat_inventory *inv,
    const struct moat_node_id *node, const Moat__V1__SandboxList *list);
void moat_inventory_put(struct moat_inventory *inv,
    const struct moat_node_id *node, const Moat__V1__Sandbox *sb);
void moat_inventory_forget(struct moat_inventory *inv, const char *sandbox_id);

/* moat_inventory_find: whether the inventory knows `sandbox_id`; its node
 * into *node and (copy not NULL) a heap copy of its last known Sandbox
 * (NULL when out of memory), freed by the caller. */
bool moat_inventory_find(struct moat_inventory *inv, const char *sandbox_id,
    struct moat_node_id *node, Moat__V1__Sandbox **copy);

/* moat_inventory_unavailable: copies of `tenant`'s (NULL: everyone's)
 * known sandboxes on nodes other than the `n_answered` in `answered`,
 * with state UNAVAILABLE. *out (heap array of *n, NULL when none) is the
 * caller's. RESOURCE_EXHAUSTED when out of memory. */
int moat_inventory_unavailable(struct moat_inventory *inv, const char *tenant,
    const struct moat_node_id *answered, size_t n_answered,
    Moat__V1__Sandbox ***out, size_t *n) __attribute__((warn_unused_result));

/* moat_nodes_mark_down: node `id` did not take a call (`method`, for the
 * log) begun at
 * `since_ms` (monotonic, moat_rpc_now_ms): unavailable at once, not only
 * after the surveys it misses, so that placement and calls skip it; its
 * next survey answer brings it back. A node that answered a survey after
 * since_ms stays as it is: the call failed on the connection of the
 * process before (a vmd restarted meanwhile), not on the one that
 * answers now. */
void moat_nodes_mark_down(struct moat_nodes *nodes,
    const struct moat_node_id *id, const char *method, uint64_t since_ms);

/* moat_nodes_answered: node `id` answered a call (whatever its status):
 * as good as a survey answer for the round in progress (an available
 * node is not counted silent) and for moat_nodes_mark_down's since. A
 * node already marked unavailable waits for a survey, which brings its
 * figures too. */
void moat_nodes_answered(struct moat_nodes *nodes,
    const struct moat_node_id *id);

/* moat_nodes_is_available: whether node `node` is available now. */
bool moat_nodes_is_available(struct moat_nodes *nodes,
    const struct moat_node_id *node);

/* moat_node_down_message: the UNAVAILABLE message for a call on
 * `sandbox_id` held by node `node`, which does not answer: how to bring
 * the sandbox back (heap, caller frees). */
char *moat_node_down_message(const char *sandbox_id, const char *node);

/* ---- recording (record.c, record_step.c, record_trace.c) ---- */

struct moat_record_entry;

/* The recorded sandboxes (sandbox -> session) and how to reach sessiond.
 * In memory; a restarted gateway finds a sandbox's latest session in
 * sessiond (ListSessions by sandbox) on its next step. */
struct moat_record {
	pthread_mutex_t lock; /* guards entries, n, cap (not the entries) */
	struct moat_record_entry **entries;
	size_t n, cap;
	struct moat_forward *fw;          /* borrowed */
	struct moat_rpc_client *sessiond; /* borrowed */
	const char *sessiond_url;         /* borrowed, for messages */
	/* Set by the gateway after moat_record_init (NULL: none, the
	 * defaults): snapd for deleting snapshots it holds, the config for
	 * [retention]. Borrowed. */
	struct moat_rpc_client *snapd;
	const char *snapd_url;
	const struct moat_config *config;
	/* The recorder threads that finish deferred steps
	 * (record_async.c). */
	struct moat_record_pool *pool;
	bool ready;
};

/* moat_record_init / moat_record_fini: fini is safe on a zeroed object;
 * no call may be in flight, but deferred steps may: fini lets those
 * that run end (their node call, trace, append and snapshot), fails
 * those still waiting for their turn, and only then frees the table. */
int moat_record_init(struct moat_record *rec, struct moat_forward *fw,
    struct moat_rpc_client *sessiond, const char *sessiond_url)
    __attribute__((warn_unused_result));
void moat_record_fini(struct moat_record *rec);

/* moat_record_start: creates the session of the new sandbox `sandbox_id`
 * (created by `req`) in sessiond for `tenant`, takes its starting fs
 * trace and remembers it. On MOAT_OK `session_id` (size bytes) holds the
 * session's id; else *errmsg (heap, caller frees) names sessiond. */
int moat_record_start(struct moat_record *rec, const char *tenant,
    const Moat__V1__CreateSandboxRequest *req, const char *sandbox_id,
    uint64_t request_id, uint64_t deadline_ms, char *session_id, size_t size,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_record_session_of: true (and the id in session_id) when
 * `sandbox_id` is recorded. */
bool moat_record_session_of(struct moat_record *rec, const char *sandbox_id,
    char *session_id, size_t size);

/* moat_record_session_lookup: as moat_record_session_of, but a sandbox
 * this gateway does not know is looked up in sessiond once (a gateway
 * restarted since it was created). Blocks up to a few seconds. */
bool moat_record_session_lookup(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t request_id, char *session_id,
    size_t size);

/* moat_record_forget: the sandbox was destroyed: no more steps. */
void moat_record_forget(struct moat_record *rec, const char *sandbox_id);

/* The session label holding the snapshot of step 0 (the state before
 * step 1): sessiond's SetStepSnapshot knows steps from 1 only. */
#define MOAT_RECORD_STEP0_LABEL "moat.step0_snapshot"
/* The label saying why step 0 has no snapshot any more (moat-sessiond
 * keeps it when SetStepSnapshot of index 0 removes it with a reason). */
#define MOAT_RECORD_STEP0_REMOVED_LABEL "moat.step0_removed"

/* Where a new recording comes from: its policy and, for a branch, the
 * session and step it continues and the snapshot it was restored from
 * (its step 0). NULL / 0 for a fresh sandbox. */
struct moat_record_origin {
	Moat__V1__SnapshotPolicy policy;
	const char *parent_session_id;
	uint64_t parent_step;
	const char *base_snapshot;
	/* The fs trace of the starting state when the caller has it (the
	 * copies of a fork start alike: one trace serves them all); NULL:
	 * traced here. Borrowed, copied. */
	const Moat__V1__FsTrace *base_trace;
};

/* moat_record_begin: starts a session for `sandbox_id` (which from now
 * on records into it, whatever session it recorded into before): takes
 * the step-0 snapshot (EVERY, unless origin has one), creates the session
 * and takes the trace baseline. On MOAT_OK session_id holds its id; else
 * *errmsg (heap, caller frees). Blocks on sessiond and the node. */
int moat_record_begin(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, const struct moat_record_origin *origin,
    uint64_t request_id, uint64_t deadline_ms, char *session_id, size_t size,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_record_step: one Exec, RunCode or WriteFile (`request`, decoded;
 * call->payload its bytes) on `sandbox_id`. When the sandbox is not
 * recorded (asking sessiond once after a gateway restart) sets *handled
 * false and does nothing. Else forwards it, records the step (and under
 * EVERY its snapshot) and puts the reply, with step_index / session_id /
 * recording_error where the reply has them, in call->raw_reply; returns
 * the forward's status: a recording failure never fails the call. */
int moat_record_step(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, const char *sandbox_id,
    const char *tenant, bool *handled);

/* moat_record_step_async: moat_record_step for a call the rpc server can
 * defer (Exec, RunCode from a client): the reply is deferred and no
 * worker waits for the node, the trace, sessiond or the snapshot; the
 * steps of one sandbox still run one at a time in arrival order, those
 * of different sandboxes at once, on the recorder threads. The reply
 * (`reply_desc`) gets `safety` (NULL: none) in its safety field, as gate
 * sets it on replies sent at once. A call that cannot be deferred is
 * recorded as moat_record_step does. *handled and the return as there
 * (MOAT_OK once deferred). */
int moat_record_step_async(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, const char *sandbox_id,
    const char *tenant, const ProtobufCMessageDescriptor *reply_desc,
    const char *safety, bool *handled);

/* moat_record_steps_waiting: steps (of any gateway in this process)
 * waiting for an earlier step of their sandbox to end; for tests and
 * diagnostics. */
size_t moat_record_steps_waiting(void);

/* ---- record.c <-> record_async.c only ---- */

/* One step waiting for its turn on a sandbox's entry: a thread (job
 * NULL; granted when its turn comes) or a deferred step. */
struct moat_record_job;
struct moat_record_waiter {
	struct moat_record_waiter *next;
	struct moat_record_job *job;
	bool granted;
};

/* What moat_record_step_after needs of the call (borrowed). */
struct moat_record_step_ctx {
	const ProtobufCMessage *request;
	const char *sandbox_id, *tenant, *method;
	uint64_t request_id, deadline_ms;
	uint64_t started_ms, ended_ms; /* unix ms, around the node's run */
};

/* moat_record_follow: the ExecStart `call` (its reply's exec `exec_id`)
 * started a command on a recorded sandbox: follow it and record it as
 * one step when it ends (a terminal session's output an asciicast)
 * (record_follow.c). moat_record_shell_resize: an ExecResize that
 * succeeded, a resize event of the session it names (if recorded). */
void moat_record_follow(struct moat_record *rec, const char *tenant,
    const struct moat_rpc_call *call, uint64_t exec_id);
void moat_record_shell_resize(const Moat__V1__ExecResizeRequest *req);

/* moat_record_entry_of: the entry of a recorded sandbox (looked up as
 * moat_record_session_lookup does), NULL when not recorded. Valid until
 * moat_record_fini. */
struct moat_record_entry *moat_record_entry_of(struct moat_record *rec,
    const char *tenant, const char *sandbox_id, uint64_t request_id);
/* moat_record_entry_enqueue: w's turn on e: true when it is w's at once;
 * else w waits in e's FIFO and its job is started
 * (moat_record_job_start) when the turn before it ends. */
bool moat_record_entry_enqueue(struct moat_record_entry *e,
    struct moat_record_waiter *w);
/* moat_record_entry_release: the caller's turn on e ends; the next
 * waiter's begins. */
void moat_record_entry_release(struct moat_record *rec,
    struct moat_record_entry *e);
/* moat_record_step_before: before the node runs the step: follow what
 * sessiond says of the sandbox's session (other gateways). In e's turn. */
void moat_record_step_before(struct moat_record *rec,
    struct moat_record_entry *e, const char *tenant, uint64_t request_id);
/* moat_record_step_after: after the node ran the step and answered
 * *raw: trace, diff, append, snapshot (EVERY), retention; *raw becomes
 * the reply with step_index / session_id / recording_error. In e's
 * turn. */
void moat_record_step_after(struct moat_record *rec,
    struct moat_record_entry *e, const struct moat_record_step_ctx *c,
    uint8_t **raw, size_t *raw_len);
/* record_async.c: the pool's life, and the start of a job whose turn
 * came. */
int moat_record_pool_init(struct moat_record *rec);
void moat_record_pool_fini(struct moat_record *rec);
void moat_record_job_start(struct moat_record *rec,
    struct moat_record_job *job);

/* moat_record_trace: the hashed fs trace of `tenant`'s `sandbox_id` from
 * its node; on MOAT_OK *out is the caller's, else *errmsg (heap). */
int moat_record_trace(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t deadline_ms, Moat__V1__FsTrace **out,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_record_snapshot: snapshots `tenant`'s `sandbox_id` on its node as
 * step
 * `step` of session `session_id` (kept in the snapshot's meta; NULL: none
 * known); the id goes to snapshot_id (size bytes). Errors set *errmsg
 * (heap). */
int moat_record_snapshot(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, const char *session_id, uint64_t step,
    uint64_t deadline_ms, char *snapshot_id, size_t size, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_record_snapshot_call: a client's SnapshotSandbox (`req`, decoded;
 * call->payload its bytes). On a recorded MANUAL sandbox the request goes
 * to the node with the session and its latest step set, the snapshot is
 * attached to that step (or is step 0) and retention runs; otherwise it
 * is forwarded unchanged. The node's reply goes to call->raw_reply;
 * returns the forward's status (attaching failures are logged only: the
 * snapshot exists either way). */
int moat_record_snapshot_call(struct moat_record *rec,
    struct moat_rpc_call *call, const Moat__V1__SnapshotSandboxRequest *req,
    const char *tenant);

/* moat_record_set_step_snapshot: SetStepSnapshot in sessiond for
 * `tenant`: step `index` (0: the session's step 0) gets `snapshot_id`, or
 * none ("") with `removed_reason` (NULL: none) saying why. Within
 * deadline_ms (monotonic); errors set *errmsg (heap). */
int moat_record_set_step_snapshot(struct moat_record *rec, const char *tenant,
    const char *session_id, uint64_t index, const char *snapshot_id,
    const char *removed_reason, uint64_t request_id, uint64_t deadline_ms,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_record_step0_forget: the step-0 snapshot of `session_id` kept in
 * memory is gone (retention removed it). */
void moat_record_step0_forget(struct moat_record *rec, const char *session_id);

/* moat_record_step0: the step-0 snapshot of `session_id` known to this
 * gateway (MANUAL sessions keep it in memory only). */
bool moat_record_step0(struct moat_record *rec, const char *session_id,
    char *snapshot_id, size_t size);

/* moat_record_session_step0: the step-0 snapshot in a session's labels
 * (borrowed from s), or NULL. moat_record_session_label: any label. */
const char *moat_record_session_step0(const Moat__V1__SessionInfo *s);
const char *moat_record_session_label(const Moat__V1__SessionInfo *s,
    const char *key);

/* moat_record_sessiond: one call to sessiond, the request's tenant set by
 * the caller. On MOAT_OK *reply is the caller's; else *errmsg (heap)
 * names sessiond when it did not answer (UNAVAILABLE within
 * deadline_ms, or DEADLINE_EXCEEDED). */
int moat_record_sessiond(struct moat_record *rec, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *reply_desc,
    ProtobufCMessage **reply, uint64_t deadline_ms, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_record_session_call: forwards a session call (request decoded as
 * the method's input, which has a `tenant` field) to sessiond with
 * `tenant`, the same method, request id and the deadline left. Errors go
 * through moat_rpc_error; sessiond not answering is UNAVAILABLE naming
 * its url. */
int moat_record_session_call(struct moat_record *rec,
    struct moat_rpc_call *call, const ProtobufCMessage *request,
    const char *tenant);

/* moat_record_sessiond_call: one call of `method` to sessiond with
 * `request` as built by the caller (its tenant already set), the request
 * id and the time left before `deadline_ms` (monotonic). On MOAT_OK
 * *reply is a message of `reply_desc` the caller frees with
 * protobuf_c_message_free_unpacked; otherwise *reply is NULL and *errmsg
 * (heap, caller frees) has sessiond's message, or names sessiond's url
 * when it did not answer. For handlers that make several sessiond calls
 * of their own (diff.c). */
int moat_record_sessiond_call(struct moat_record *rec, const char *method,
    const ProtobufCMessage *request,
    const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply,
    uint64_t request_id, uint64_t deadline_ms, char **errmsg)
    __attribute__((warn_unused_result));

/* ---- snapshot deletion and garbage (snapshots.c) ---- */

/* moat_snapshot_node: the node named in a local snapshot id
 * "snap-<node>-<16 hex>" (services/vm/snapshot.c); false for any other
 * shape (moat-snapd's ids are "snap-<32 hex>"). */
bool moat_snapshot_node(const char *snap_id, struct moat_node_id *node);

/* moat_snapshot_local_bytes: what a local snapshot holds on its node: its
 * RAM copy in the RAM dir (or, from a vmd that does not say, its RAM
 * bytes) plus its disk copy. */
uint64_t moat_snapshot_local_bytes(const Moat__V1__LocalSnapshot *s);

/* What deleting snapshots did. */
struct moat_snapshots_freed {
	uint32_t deleted;
	uint64_t bytes;
	uint32_t left;     /* not deleted now: left for `moat snapshot gc` */
	char *first_error; /* heap (caller frees): why the first was left */
};

/* moat_snapshots_delete: deletes the `n` snapshot ids of `tenant`: a
 * local id on the node it names (DeleteLocalSnapshot, which also deletes
 * the snapshot's copy in moat-snapd; its size read from the node's list
 * first), any other id in moat-snapd (DeleteSnapshot). One that is gone
 * already is skipped; one whose node or snapd does not answer is left
 * (counted, logged) for `moat snapshot gc`. Never fails: *out says what
 * happened; the caller frees out->first_error. Blocks, within
 * deadline_ms. */
void moat_snapshots_delete(struct moat_record *rec, const char *tenant,
    char *const *ids, size_t n, uint64_t request_id, uint64_t deadline_ms,
    struct moat_snapshots_freed *out);

/* moat_snapshots_refs: sessiond's SnapshotRefs of `n` ids for `tenant`,
 * in batches; on MOAT_OK refs (n entries, the caller's array) holds how
 * many steps name each id. Errors set *errmsg (heap). */
int moat_snapshots_refs(struct moat_record *rec, const char *tenant,
    char *const *ids, size_t n, uint32_t *refs, uint64_t request_id,
    uint64_t deadline_ms, char **errmsg) __attribute__((warn_unused_result));

/* moat_snapshots_drop_pulled: deletes the copies other nodes than
 * `owner` (NULL: none) pulled of moat-snapd's snapshot `remote_id` for
 * their restores, once the snapshot itself is deleted (they would stay,
 * listed and holding RAM). Best effort: logged. */
void moat_snapshots_drop_pulled(struct moat_forward *fw, const char *tenant,
    const char *remote_id, const struct moat_node_id *owner,
    uint64_t deadline_ms);

/* moat_snapshots_remote_of: snapd's id of `node`'s local snapshot `id`
 * into `remote` ("" when it was not pushed or is not listed). */
int moat_snapshots_remote_of(struct moat_forward *fw,
    const struct moat_node_id *node, const char *tenant, const char *id,
    uint64_t deadline_ms, char *remote, size_t size);

/* moat_snapshots_node_list: node `node`'s local snapshots of `tenant`
 * (ListLocalSnapshots, within deadline_ms but at most 10 s). On MOAT_OK
 * *out is the caller's; errors set *errmsg (heap). */
int moat_snapshots_node_list(struct moat_forward *fw,
    const struct moat_node_id *node, const char *tenant, uint64_t deadline_ms,
    Moat__V1__LocalSnapshotList **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_snapshots_snapd_call: `method` of moat-snapd with `req` (its
 * tenant set by the caller: it also goes in Envelope.tenant); on MOAT_OK
 * *out is the caller's. A snapd that does not answer is UNAVAILABLE
 * naming its url; errors set *errmsg (heap). */
int moat_snapshots_snapd_call(struct moat_record *rec, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *reply_desc,
    ProtobufCMessage **out, uint64_t deadline_ms, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_snapshots_label: the value of label `key` of moat-snapd's
 * snapshot `s` (borrowed), or NULL. Declared with snapshot.pb-c.h's
 * type by name: gateway.h does not include it. */
struct Moat__V1__SnapshotInfo;
const char *moat_snapshots_label(const struct Moat__V1__SnapshotInfo *s,
    const char *key);

/* The Gateway handlers of snapshots.c (call->service_ctx is the gateway):
 * DeleteSession (sessiond deletes the session, the gateway the snapshots
 * nothing names any more) and GcSnapshots. Errors go through
 * moat_rpc_error. */
int moat_snapshots_delete_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_snapshots_gc(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* ---- snapshot retention (retention.c) ---- */

#define MOAT_RETENTION_KEEP_LAST 16   /* step snapshots per session */
#define MOAT_RETENTION_KEEP_AGE_S 900 /* younger ones are always kept */

struct moat_retention {
	uint64_t keep_last; /* 0: keep every snapshot */
	uint64_t keep_age_s;
};

/* moat_retention_policy: `tenant`'s policy from [retention]
 * keep-last.<tenant> / keep-age-s.<tenant>, else keep-last / keep-age-s
 * (also MOAT_RETENTION_* and the gateway's flags), else the defaults.
 * INVALID_ARGUMENT with *errmsg (heap) naming the key when a value is not
 * a number; *out then holds the defaults for it. cfg may be NULL. */
int moat_retention_policy(const struct moat_config *cfg, const char *tenant,
    struct moat_retention *out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_retention_apply: applies `policy` (keep_last > 0) to session
 * `session_id` of `tenant`: the snapshots of its steps (and of step 0)
 * beyond the newest keep_last, older than keep_age_s (since the step
 * ended; step 0: since the session began) and not pinned are taken off
 * their steps in sessiond with the reason, and deleted when no step of
 * the tenant names them any more. Errors are logged, never returned; it
 * takes a few seconds at most. Returns how many of the session's steps
 * still have a snapshot (UINT32_MAX when it could not tell). */
uint32_t moat_retention_apply(struct moat_record *rec, const char *tenant,
    const char *session_id, const struct moat_retention *policy,
    uint64_t request_id);

/* ---- diff and compare (diff.c) ---- */

/* One recorded session as diff.c reads it: all borrowed. */
struct moat_session_view {
	const char *session_id;
	const Moat__V1__SessionInfo *info; /* NULL: unknown */
	Moat__V1__Step *const *steps;      /* by index, from 1 */
	size_t n_steps;
};

/* moat_diff_build: the DiffReply of sessions `a` and `b` (see
 * gateway.proto): steps aligned by position, per-step file differences
 * and the sessions' net filesystem effects where they differ. `out` is
 * an initialised heap DiffReply; its fields are filled with heap memory,
 * and the caller frees the whole with protobuf_c_message_free_unpacked
 * (also after a failure, which leaves it partly filled). Returns MOAT_OK
 * or RESOURCE_EXHAUSTED. Pure: no I/O, no locks. */
int moat_diff_build(const struct moat_session_view *a,
    const struct moat_session_view *b, Moat__V1__DiffReply *out)
    __attribute__((warn_unused_result));

/* moat_compare_build: the CompareReply of `n` sessions: one score each
 * (destructive_actions from moat_safety_classify of each step's input),
 * ranked best first (final success, fewer failed steps, fewer
 * destructive actions, fewer files deleted, less time, then the order
 * given). Ownership and errors as moat_diff_build. */
int moat_compare_build(const struct moat_session_view *sessions, size_t n,
    Moat__V1__CompareReply *out) __attribute__((warn_unused_result));

/* moat_diff_handle / moat_compare_handle: the Diff and Compare calls:
 * fetch the sessions and all their steps (Diff: with outputs) from
 * sessiond as `tenant` through `rec`, then build the reply into `reply`.
 * A session unknown to the tenant is NOT_FOUND naming it; Compare wants
 * 2..32 ids (INVALID_ARGUMENT). Errors go through moat_rpc_error. */
int moat_diff_handle(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply,
    const char *tenant);
int moat_compare_handle(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply,
    const char *tenant);

/* moat_trace_diff: what changed between two fs traces of one sandbox
 * (each relative to the image; prev NULL: none yet): only the paths that
 * changed since prev, as CREATED / MODIFIED / DELETED with cur's size and
 * sha256, sorted by path. On MOAT_OK *out is a heap array of *n deep
 * copies the caller frees with moat_trace_diff_free (NULL when *n is 0);
 * RESOURCE_EXHAUSTED otherwise. */
int moat_trace_diff(const Moat__V1__FsTrace *prev,
    const Moat__V1__FsTrace *cur, Moat__V1__FsTraceEntry ***out, size_t *n)
    __attribute__((warn_unused_result));
void moat_trace_diff_free(Moat__V1__FsTraceEntry **ents, size_t n);

/* ---- the gateway (handlers.c) ---- */

struct moat_gateway_opts {
	const char *listen_url; /* Gateway RPC */
	const char *survey_url; /* discovery */
	const char *sessiond_url;
	const char *snapd_url;
	const char *state_dir;
	uint32_t survey_interval_ms; /* 0: MOAT_GW_SURVEY_INTERVAL_MS */
	int workers;                 /* 0: the RPC default */
	/* API keys (auth.c): on, every call but Health needs a key of
	 * state_dir's key store and acts for its tenant; off (zeroed opts,
	 * the unit tests), every caller is MOAT_GW_DEFAULT_TENANT. */
	bool auth;
	/* [policy] refuse / refuse.<tenant> (auth.c); NULL: env and the
	 * default. Borrowed: must outlive the gateway. */
	const struct moat_config *config;
	/* TLS (moat/tls.h; borrowed, NULL: none): `tls` for the RPC
	 * listener (client certificates optional) and the dials to nodes,
	 * sessiond and snapd; `survey_tls` for the survey listener (node
	 * certificates required, from survey-tls-peer-ca). The server names
	 * of sessiond's and snapd's certificates (NULL: "sessiond",
	 * "snapd"). */
	const struct moat_tls *tls;
	const struct moat_tls *survey_tls;
	const char *sessiond_tls_name;
	const char *snapd_tls_name;
	/* API keys in sessiond (keys_remote.c) rather than state_dir's own
	 * store: set when the gateway is configured with a sessiond. */
	bool keys_in_sessiond;
	/* [gateway] keys-stale-s: while sessiond does not answer, a key it
	 * confirmed this long ago still passes (0: none). */
	uint32_t keys_stale_s;
};

struct moat_gateway;

/* moat_sandbox_set_session: puts a heap copy of `id` in sb->session_id
 * (of an unpacked message, freed with it), freeing the one before unless
 * it is protobuf-c's static empty string. False on allocation failure,
 * sb unchanged. */
bool moat_sandbox_set_session(Moat__V1__Sandbox *sb, const char *id);

/* moat_gateway_start: starts discovery, then serves the Gateway service
 * on opts->listen_url. Strings in opts are copied. On success *out is
 * the caller's (moat_gateway_stop). On failure returns a status and sets
 * *errmsg (heap, caller frees). */
int moat_gateway_start(struct moat_gateway **out,
    const struct moat_gateway_opts *opts, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_gateway_stop: stops serving, then discovery; frees. Safe on NULL. */
void moat_gateway_stop(struct moat_gateway *gw);

/* idempotency.c (issue 15): moat_idem_run runs `fn` for `call` once per
 * (tenant, request id) across every gateway sharing a sessiond: a repeat
 * gets the first run's stored reply (see the file). Other methods, calls
 * without a request id and a gateway without sessiond just run fn. */
bool moat_idem_method(const char *method);
int moat_idem_run(struct moat_record *rec, struct moat_rpc_call *call,
    moat_rpc_handler fn, const ProtobufCMessage *request,
    ProtobufCMessage *reply);

/* moat_gw_tenant: the tenant `call` acts for (resolved from its API key
 * before the handler ran; MOAT_GW_DEFAULT_TENANT when auth is off).
 * Borrowed: valid during the call. */
const char *moat_gw_tenant(const struct moat_rpc_call *call);

/* moat_gateway_check_key: whether API key `key` (NULL or "": none) may
 * call the gateway, for doors that check before reading a request
 * (http.c): MOAT_OK with its id in key_id (MOAT_AUTH_KEY_ID_LEN + 1
 * bytes; "" when auth is off, which accepts any caller),
 * UNAUTHENTICATED for a missing, unknown or revoked key, INTERNAL when
 * the key store fails; its tenant in `tenant` (MOAT_AUTH_TENANT_MAX
 * bytes; MOAT_GW_DEFAULT_TENANT when auth is off) unless NULL.
 * Thread-safe; a recent key is answered from memory
 * (moat_auth_key_verify). */
int moat_gateway_check_key(struct moat_gateway *gw, const char *key,
    char *key_id, char *tenant) __attribute__((warn_unused_result));

/* moat_gateway_record: the gateway's recording state, with its sessiond
 * link (rec->sessiond NULL: none). */
struct moat_record *moat_gateway_record(struct moat_gateway *gw);

/* moat_gateway_mcp_store: the MCP session store of /mcp in moat-sessiond
 * (mcp_store.c), for moat_mcp_http_set_store; false when the gateway has
 * no sessiond (sessions stay in the gateway's table). */
struct moat_mcp_http_store;
bool moat_gateway_mcp_store(struct moat_gateway *gw,
    struct moat_mcp_http_store *out);

/* moat_gateway_key_admit: takes one token of API key `key`'s bucket
 * ([tenants] key-rps / key-burst of its tenant, else the door's `rps`
 * and `burst`; rps 0: no limit), for doors that check
 * before reading a request (http.c). MOAT_OK when there was one, or the
 * key is not valid (the gate refuses it), or auth is off;
 * RESOURCE_EXHAUSTED with *retry_s and *errmsg (heap) otherwise. */
int moat_gateway_key_admit(struct moat_gateway *gw, const char *key,
    uint32_t rps, uint32_t burst, uint32_t *retry_s, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_gw_message_tenant: the `tenant` field of a sessiond or snapd
 * request the gateway built (it sets that field from moat_gw_tenant), or
 * NULL when the message has none: what such a call puts in
 * Envelope.tenant, so sessiond and snapd see one tenant in both. */
const char *moat_gw_message_tenant(const ProtobufCMessage *msg);

/* moat_gateway_metrics: the Prometheus text of the gateway's counters
 * (calls by method and code, latency per method, sandboxes per node).
 * Heap string, the caller frees; NULL when out of memory. */
char *moat_gateway_metrics(struct moat_gateway *gw);

/* moat_gateway_nodes: the gateway's node table (for tests). */
struct moat_nodes *moat_gateway_nodes(struct moat_gateway *gw);

/* moat_gateway_service: the Gateway service as the RPC server serves it
 * (descriptor, method table, ctx = gw), for doors other than nng (the
 * HTTP door, http.c) to dispatch through the same handlers. Borrowed:
 * valid while gw runs. */
void moat_gateway_service(struct moat_gateway *gw,
    struct moat_rpc_service *out);

/* ---- time travel and code contexts (travel.c) ---- */

/* The parts of a gateway travel.c works with (borrowed from it). */
struct moat_travel {
	struct moat_nodes *nodes;
	struct moat_forward *fw;
	struct moat_record *rec;
	const char *survey_url;
	const char *tenant;               /* the caller's (moat_gw_tenant) */
	const struct moat_config *config; /* [tenants] lifetimes; NULL ok */
	struct moat_admission *adm; /* reservations, quotas (admission.h) */
	struct moat_drains *drains; /* DrainNode's running drains (drain.c) */
	bool reseed; /* a restore in place reseeds the code contexts'
	                random generators (issue 18; a new sandbox always
	                does) */
};

/* Where one restored copy runs, and the snapshot id its node gets: the
 * local id on the snapshot's own node, snapd's id anywhere else. */
struct moat_restore_target {
	struct moat_node_id node;
	char snapshot_id[MOAT_ID_MAX];
};

/* moat_travel_place: the targets of `count` restores of `snap`
 * (crosshost.c): on `node` when given (FAILED_PRECONDITION naming the
 * available nodes when it is unknown or unavailable), else by placement,
 * the snapshot's own node first, copies spread. A copy off the
 * snapshot's node gets snapd's id (moat_travel_remote_id); when snapd has
 * none and no node was named, copies fall back to the snapshot's own
 * node if it is available. out has count entries. Errors set *errmsg. */
int moat_travel_place(struct moat_travel *t, const char *snap,
    const char *node, uint32_t count, uint64_t deadline_ms,
    struct moat_restore_target *out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_travel_remote_id: moat-snapd's id of snapshot `snap` into out
 * (MOAT_ID_MAX): snap itself when it is one already; else its node's
 * LocalSnapshot.remote_id when the node answers, else snapd's
 * ListSnapshots of the tenant by label local_id. FAILED_PRECONDITION when
 * snapd has no copy; errors set *errmsg. */
int moat_travel_remote_id(struct moat_travel *t, const char *snap,
    uint64_t deadline_ms, char *out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_travel_snapd_size: the vcpus and memory of moat-snapd's snapshot
 * `snap` (GetSnapshot of the tenant, within deadline_ms or 5 s); false,
 * *vcpus and *memory_mib untouched, when there is no snapd or it does
 * not answer. */
bool moat_travel_snapd_size(struct moat_travel *t, const char *snap,
    uint64_t deadline_ms, uint32_t *vcpus, uint32_t *memory_mib);

/* moat_gateway_policy_refuses: whether `tenant`'s policy refuses the
 * command in `request` (an Exec or RunCode request; others pass), with
 * *why (heap) naming its safety level and reason. handlers.c. */
bool moat_gateway_policy_refuses(struct moat_gateway *gw, const char *tenant,
    const ProtobufCMessage *request, char **why);

/* moat_gateway_config: the gateway's config (borrowed; may be NULL) and
 * whether API keys are required (handlers.c). */
const struct moat_config *moat_gateway_config(struct moat_gateway *gw,
    bool *auth_on);

/* Operating nodes (drain.c, issue 15): CordonNode and DrainNode, for
 * the tenants of [gateway] operator-tenants (default "default"; auth
 * off: anyone). DrainNode is deferred: it runs on a thread of its own
 * (one per drain) and holds no RPC worker while it moves each sandbox;
 * a second drain of a node being drained is FAILED_PRECONDITION. */
struct moat_drains;

/* moat_drains_new: the gateway's table of running drains; NULL when out
 * of memory. */
struct moat_drains *moat_drains_new(void);

/* moat_drains_free: stops the drains still running (each finishes the
 * move under way, reports the sandboxes it did not try, and answers its
 * call), waits for their threads and frees the table. After the RPC
 * server stopped (no new drain starts) and before the forwarder and the
 * inventory go (a move uses them). NULL is fine. */
void moat_drains_free(struct moat_drains *drains);

/* moat_gw_operator_check: MOAT_OK when the caller's tenant is in
 * [gateway] operator-tenants (auth off: anyone); else PERMISSION_DENIED
 * after moat_rpc_error, naming `method` and how to allow it (drain.c). */
int moat_gw_operator_check(struct moat_rpc_call *call, const char *method);

int moat_drain_cordon_node(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_drain_node(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* Images (images.c, issue 17), handlers of the Gateway table:
 * StartImageBuild, PushImage and RemoveImage are operator calls
 * (moat_gw_operator_check); GetImageBuild (a long poll, deferred) and
 * PushImage go to one node without holding a worker; ListImages merges
 * moat-snapd's entries with every available node's list. */
int moat_images_start_build(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_images_get_build(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_images_list(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_images_push(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_images_remove(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* moat_gateway_travel: fills *out from gw (handlers.c). */
void moat_gateway_travel(struct moat_gateway *gw, struct moat_travel *out);

/* Handlers of the Gateway service's table (call->service_ctx is the
 * gateway). RestoreStep, Fork and Replay block for the restores and
 * steps they run, each within the call's deadline. */
int moat_travel_restore_step(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_travel_fork(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
/* RestoreSandbox through the gateway: snapshot_id a node's local id or
 * moat-snapd's; placed as RestoreStep places (moat_travel_place), the
 * replaced sandbox destroyed when the restore lands on another node. */
int moat_travel_restore_sandbox(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_travel_replay(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_travel_close_code_context(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int moat_travel_snapshot_sandbox(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* ---- lifetimes (lifetime.c, issue 15) ---- */

#define MOAT_LIFETIME_TIMEOUT_S 3600u      /* [tenants] timeout-s */
#define MOAT_LIFETIME_TIMEOUT_MAX_S 86400u /* [tenants] timeout-max-s */

/* A tenant's lifetimes, in seconds: the default timeout (0: none), the
 * most a create or SetTimeout may ask (0: no maximum), the default idle
 * timeout (0: none). */
struct moat_lifetime_policy {
	uint64_t timeout_s;
	uint64_t timeout_max_s;
	uint64_t idle_timeout_s;
};

/* moat_lifetime_policy: `tenant`'s from [tenants] (key.<tenant>, else
 * key, else the default); cfg may be NULL. A value that is not a number
 * is an error with *errmsg (heap). */
int moat_lifetime_policy(const struct moat_config *cfg, const char *tenant,
    struct moat_lifetime_policy *out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_lifetime_fill: a create's timeout and idle timeout: 0 takes the
 * tenant's default; a timeout over the tenant's maximum is
 * INVALID_ARGUMENT naming it (*errmsg, heap). */
int moat_lifetime_fill(const struct moat_config *cfg, const char *tenant,
    uint32_t *timeout_s, uint32_t *idle_timeout_s, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_lifetime_apply: a sandbox a restore or fork made on `node` gets
 * the tenant's default lifetime (SetTimeout on the node); *sb gets the
 * node's expires_unix_ms, idle_timeout_s and last_active_unix_ms.
 * Nothing to do: MOAT_OK. */
int moat_lifetime_apply(struct moat_travel *t, const struct moat_node_id *node,
    uint64_t deadline, Moat__V1__Sandbox **sb, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_lifetime_set_timeout: the Gateway's SetTimeout handler: refuses a
 * timeout over the tenant's maximum, forwards the rest to the node. */
int moat_lifetime_set_timeout(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

#endif
