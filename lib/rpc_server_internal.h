/*
 * rpc_server_internal.h: what rpc_server.c (the dispatcher and its
 * workers) and rpc_defer.c (calls answered later) share about a server.
 * Not for: anything outside lib/ (moat/rpc.h is the interface).
 */
#ifndef MOAT_RPC_SERVER_INTERNAL_H
#define MOAT_RPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "moat/rpc.h"
#include "moat/rpc_dispatch.h"

/* Memory of mutating calls. Bounded by count, bytes and age, so a client
 * that sends many mutations cannot grow the server without limit. */
#define DEDUP_MAX_ENTRIES 4096
#define DEDUP_TTL_MS (10u * 60u * 1000u)
#define DEDUP_MAX_BYTES (64u << 20)
#define DEDUP_MAX_REPLY (4u << 20)
#define DEDUP_BUCKETS 8192 /* power of two */

/* The deferred calls of one server (rpc_defer.c). `lock` guards every
 * field below it and the flags of every deferred call. */
struct rpc_defer_table {
	pthread_mutex_t lock;
	pthread_cond_t replier_cv; /* wakes the replier */
	pthread_cond_t waiter_cv;  /* wakes moat_rpc_server_dispatch */
	bool inited;
	struct moat_rpc_deferred *head; /* every deferred call */
	size_t n;
	pthread_t replier; /* sends replies and answers deadlines */
	bool replier_started;
	bool replier_stop;
	/* moat_rpc_server_stop has run: the last completion frees the
	 * server. */
	bool stopped;
};

/* Where a call being dispatched came from, for moat_rpc_defer
 * (moat_rpc_call.rpc_private). */
struct rpc_origin {
	struct moat_rpc_server *srv;
	struct dedup_entry *entry; /* taken by moat_rpc_defer */
	uint64_t started_ms;
};

struct dedup_entry {
	uint64_t request_id;
	const char *method; /* the descriptor's; static storage */
	char *auth;         /* the caller's credentials, copied */
	char *tenant;       /* Envelope.tenant, copied */
	uint64_t created_ms;
	bool done;
	uint8_t *reply; /* encoded moat.v1.Reply, when done */
	size_t reply_len;
	struct dedup_entry *bucket_next;
	struct dedup_entry *older;
	struct dedup_entry *newer;
};

struct dedup_cache {
	pthread_mutex_t lock; /* guards every field below */
	struct dedup_entry *buckets[DEDUP_BUCKETS];
	struct dedup_entry *oldest;
	struct dedup_entry *newest;
	size_t n_entries;
	size_t n_bytes;
};

enum dedup_verdict {
	DEDUP_NEW,        /* inserted as running; run the handler */
	DEDUP_DONE,       /* a copy of the stored reply returned */
	DEDUP_RUNNING,    /* the first is still running */
	DEDUP_OTHER_CALL, /* the id was used for another method
	                             * or by another caller */
	DEDUP_FULL,       /* every entry is running */
	DEDUP_NOMEM,
};

struct worker {
	struct moat_rpc_server *srv;
	nng_ctx ctx;
	nng_aio *aio; /* the receive */
	/* The reply's send. The worker does not wait for it: it takes the
	 * next request meanwhile, and only finishes the send (send_finish)
	 * before the next reply, by which time it has long completed. */
	nng_aio *send_aio;
	bool send_pending; /* the worker's own */
	/* Guards starting operations on ctx against moat_rpc_server_stop
	 * (see moat_rpc_server.stopping). One per worker, so workers never
	 * wait for each other's sends. */
	pthread_mutex_t lock;
	bool lock_inited;
	pthread_t thread;
	bool thread_started;
};

struct moat_rpc_server {
	struct moat_rpc_service svc;
	/* rows[i] is the table row of descriptor->methods[i]. */
	const struct moat_rpc_method **rows;
	struct dedup_cache dedup;
	bool dedup_inited;
	/* nng 1.5 can crash when a context operation starts while its socket
	 * is closing (the context's release touches a freed mutex). So a
	 * worker starts operations only under its own lock while `stopping`
	 * is false; stop sets it, then takes each worker's lock once (so no
	 * operation is still starting), and closes the socket after every
	 * worker has left. */
	atomic_bool stopping;
	bool has_socket;
	nng_socket sock;
	struct worker *workers;
	int n_workers;
	char *url;
	struct rpc_defer_table defer; /* rpc_defer.c */
};

/* rpc_encode_reply: a packed moat.v1.Reply into *out (heap). */
int rpc_encode_reply(uint64_t request_id, int code, const char *message,
    const uint8_t *payload, size_t payload_len, uint8_t **out, size_t *out_len)
    __attribute__((warn_unused_result));

/* rpc_sanitize_message: a reply message made safe text, in place. */
void rpc_sanitize_message(char *msg);

/* rpc_log_outcome: the one log line of a finished call. */
void rpc_log_outcome(const struct moat_rpc_server *srv, uint64_t rid,
    const char *method, int code, const char *message, uint64_t started);

/* rpc_dedup_keep: keeps the reply of a mutating call for repeats. */
void rpc_dedup_keep(struct moat_rpc_server *srv, struct dedup_entry *entry,
    uint64_t rid, const uint8_t *reply, size_t reply_len);

/* rpc_server_free: frees what a stopped server still holds. */
void rpc_server_free(struct moat_rpc_server *srv);

/* rpc_defer_init: the table's lock and conditions; false when out of
 * memory. rpc_defer_start_replier: its thread (servers with a socket).
 * rpc_defer_stop: stops the thread and takes every in-flight send back
 * (after the workers have stopped, before the socket closes: returns
 * true when the server may be freed now, false when deferred calls
 * still hold it and the last moat_rpc_complete frees it). */
bool rpc_defer_init(struct rpc_defer_table *t);
int rpc_defer_start_replier(struct moat_rpc_server *srv)
    __attribute__((warn_unused_result));
void rpc_defer_stop_replier(struct moat_rpc_server *srv);
bool rpc_defer_release(struct moat_rpc_server *srv);
void rpc_defer_fini(struct rpc_defer_table *t);

/* rpc_defer_arm: after the handler of `d` returned, on a worker: the
 * request's context `ctx` goes with `d` (has_ctx false: none to answer
 * on, the server stops), and the replier may answer. */
void rpc_defer_arm(struct moat_rpc_deferred *d, nng_ctx ctx, bool has_ctx);

/* rpc_defer_wait: after the handler of `d` returned, on a thread that
 * waits for its reply (moat_rpc_server_dispatch, or a worker that could
 * not open a new context): the encoded Reply into *reply (heap), the
 * deadline's when no completion came in time. Frees d when it was
 * completed. Returns MOAT_OK or MOAT_INTERNAL (out of memory). */
int rpc_defer_wait(struct moat_rpc_deferred *d, uint8_t **reply,
    size_t *reply_len) __attribute__((warn_unused_result));

/* rpc_defer_arm_async: after the handler of `d` returned, on the thread
 * of moat_rpc_server_dispatch_async: done(arg, reply) runs now when `d`
 * was already completed, else from moat_rpc_complete; frees d then. */
void rpc_defer_arm_async(struct moat_rpc_deferred *d,
    moat_rpc_dispatch_done done, void *arg);

#endif
