/*
 * rpc.h: the one RPC layer every moat service and client uses. Requests
 * and replies are moat.v1.Envelope / moat.v1.Reply messages on nng REQ/REP
 * sockets; the server dispatches on (service, method) through protobuf-c's
 * generated service descriptors, decodes the payload with the method's
 * input descriptor, validates, and calls the handler listed for it in the
 * service's method table. A pool of worker contexts serves calls
 * concurrently, so one slow call (a boot, a long-poll) never blocks the
 * others; a call that waits for long (an exec) defers its reply
 * (moat_rpc_defer) and holds no worker at all, and a client can call
 * without a waiting thread (moat_rpc_call_raw_async).
 *
 * Mutating calls are never executed twice for one request id: clients turn
 * nng's REQ resend off, and the server remembers the replies of recent
 * mutating calls by request id and answers a repeat from that memory (a
 * repeat that arrives while the first is still running gets ABORTED).
 *
 * Not for: HTTP (the gateway's HTTP door decodes JSON into the same
 * messages and calls the same handlers), or the guest link (frame.h).
 */
#ifndef MOAT_RPC_H
#define MOAT_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moat/status.h"
#include "moat/tls.h"

#define MOAT_RPC_MAX_MSG (64u << 20) /* largest envelope or reply */
#define MOAT_RPC_DEFAULT_WORKERS 64  /* calls in flight per server */
#define MOAT_RPC_DEFAULT_TIMEOUT_MS 30000

/* The cluster protocol (issue 15): vmd reports MOAT_PROTOCOL_VERSION in
 * Node.protocol_version; a gateway lists a node below
 * MOAT_PROTOCOL_VERSION_MIN (0, from builds that did not say, counts as
 * 1) and never places on it. */
#define MOAT_PROTOCOL_VERSION 2
#define MOAT_PROTOCOL_VERSION_MIN 2

struct moat_rpc_server;
struct moat_rpc_client;

/* One call as a handler sees it. Valid only during the handler. */
struct moat_rpc_call {
	const char *service; /* "moat.v1.Vm" */
	const char *method;  /* "CreateSandbox" */
	uint64_t request_id;
	uint32_t timeout_ms;  /* as sent; 0: server default */
	uint64_t deadline_ms; /* monotonic ms (moat_rpc_now_ms) */
	const char *auth;     /* "" when none */
	/* Whom the call acts for, set by a service's own auth before its
	 * handler runs (the gateway's tenant); NULL in the rpc layer. */
	const char *principal;
	/* Envelope.tenant: the tenant a gateway-forwarded call acts for;
	 * "" when absent. Services check it against the objects named. */
	const char *tenant;
	void *service_ctx;      /* moat_rpc_service.ctx */
	const uint8_t *payload; /* the request's encoded bytes */
	size_t payload_len;
	/* Set by moat_rpc_error; freed by the server. */
	char *error_message;
	/* A handler that forwards may set an already-encoded reply payload
	 * here (heap, freed by the server) instead of filling `reply`. */
	uint8_t *raw_reply;
	size_t raw_reply_len;
	/* Set by moat_rpc_defer: the reply comes later. */
	struct moat_rpc_deferred *deferred;
	/* The rpc layer's own (NULL: a call built outside a server, which
	 * cannot be deferred); handlers leave it alone. */
	void *rpc_private;
};

/* A handler fills `reply` (already initialised with the method's output
 * descriptor; every field it sets must be heap memory from malloc, freed
 * by the server with protobuf_c_message_free_unpacked) and returns
 * MOAT_OK, or returns a status after moat_rpc_error, or defers the reply
 * (moat_rpc_defer). Handlers may block; they should not run past
 * call->deadline_ms, and one that waits for long should defer, so it
 * holds no worker. */
typedef int (*moat_rpc_handler)(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* A call whose reply is sent later, from any thread (moat_rpc_defer). */
struct moat_rpc_deferred;

/* moat_rpc_defer: called by a handler that will answer later (a long
 * exec): the worker goes back to serving other calls as soon as the
 * handler returns, and the reply goes out when moat_rpc_complete is
 * called. Once deferred, the handler's return value and `reply` are
 * ignored. The call's deadline still applies: if no completion comes by
 * call->deadline_ms the caller gets DEADLINE_EXCEEDED, and a later
 * completion is only kept for repeats (a mutating call's request id
 * stays "still running" until it completes, then repeats get its
 * reply). Returns NULL when the call cannot be deferred (it was built
 * outside a server, or too many calls already wait: MOAT_RPC_MAX_DEFERRED);
 * the handler then answers as usual. The handle is the caller's until
 * it passes it to moat_rpc_complete, exactly once; it stays valid (and
 * the server's memory with it) until then, even past
 * moat_rpc_server_stop. */
struct moat_rpc_deferred *moat_rpc_defer(struct moat_rpc_call *call)
    __attribute__((warn_unused_result));

#define MOAT_RPC_MAX_DEFERRED 8192 /* deferred calls waiting per server */

/* Called once with a deferred call's final code (see
 * moat_rpc_deferred_on_complete). */
typedef void (*moat_rpc_complete_hook)(void *arg, int code);

/* moat_rpc_deferred_on_complete: `fn(arg, code)` runs once with the
 * code `d` is completed with (for a service's own accounting: audit,
 * metrics), on the completer's thread, or at once on this one when `d`
 * is already completed. Only while the handler that deferred `d` has
 * not returned (d is valid then). */
void moat_rpc_deferred_on_complete(struct moat_rpc_deferred *d,
    moat_rpc_complete_hook fn, void *arg);

/* moat_rpc_complete: answers a deferred call and frees `d`. On MOAT_OK,
 * `reply` (borrowed; NULL: an empty reply) is encoded as the payload;
 * otherwise `message` (borrowed; NULL: the code's name) says what
 * failed. Thread-safe, never blocks on the network: the send happens
 * on the server's own thread. */
void moat_rpc_complete(struct moat_rpc_deferred *d, int code,
    const ProtobufCMessage *reply, const char *message);

/* moat_rpc_complete_raw: moat_rpc_complete with an already-encoded
 * payload (`payload`, heap, taken in every case; may be NULL when len
 * is 0), for a handler that forwards. */
void moat_rpc_complete_raw(struct moat_rpc_deferred *d, int code,
    uint8_t *payload, size_t len, const char *message);

/* One row of a service's method table. The dispatcher checks that every
 * method of the descriptor has a row at start, and refuses unknown
 * methods with UNIMPLEMENTED. */
struct moat_rpc_method {
	const char *name; /* as in the .proto */
	moat_rpc_handler handler;
	bool mutating;   /* deduplicated by request id */
	bool needs_auth; /* refused with UNAUTHENTICATED if no auth */
};

struct moat_rpc_service {
	const ProtobufCServiceDescriptor *descriptor;
	const struct moat_rpc_method *methods;
	size_t n_methods;
	void *ctx; /* handed to handlers as service_ctx */
};

/* moat_rpc_error: formats a message for the reply (what failed, on which
 * object, what to do next) and returns `code`, so handlers can write
 * `return moat_rpc_error(call, MOAT_NOT_FOUND, "sandbox %s ...", id);`. */
int moat_rpc_error(struct moat_rpc_call *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* moat_rpc_server_start: listens on `url` (ipc://, tcp://, tls+tcp://;
 * ipc sockets are made mode 0600) and serves `svc` (copied by value; the
 * method table and descriptor must outlive the server) with `workers`
 * concurrent calls (0: MOAT_RPC_DEFAULT_WORKERS). On success *out is the
 * caller's, stopped with moat_rpc_server_stop. On failure returns a status
 * and sets *errmsg (heap, caller frees) naming the url and the cause. */
int moat_rpc_server_start(struct moat_rpc_server **out, const char *url,
    const struct moat_rpc_service *svc, int workers, char **errmsg)
    __attribute__((warn_unused_result));

/* Options of a server (moat_rpc_server_start_opts). Zeroed means
 * defaults: no TLS, the default workers. */
struct moat_rpc_server_opts {
	int workers;                /* 0: MOAT_RPC_DEFAULT_WORKERS */
	const struct moat_tls *tls; /* NULL: no TLS (tls+tcp:// refused) */
	enum moat_tls_peer peer;    /* callers' certificates (tls+tcp) */
	const char *what;           /* the listener in messages */
};

/* moat_rpc_server_start_opts: moat_rpc_server_start with the address
 * rules of moat_tls_check_url (plain tcp:// off loopback refused unless
 * insecure; tls+tcp:// needs the TLS settings) and, on tls+tcp://, TLS
 * with opts->tls's certificate, callers checked as opts->peer says. */
int moat_rpc_server_start_opts(struct moat_rpc_server **out, const char *url,
    const struct moat_rpc_service *svc, const struct moat_rpc_server_opts *o,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_rpc_server_stop: closes the socket, waits for running handlers to
 * return, frees everything. Safe on NULL. */
void moat_rpc_server_stop(struct moat_rpc_server *srv);

/* moat_rpc_client_open: a client for `url`. Thread-safe: many threads may
 * call at once (each call uses its own nng context). The dial is
 * non-blocking, so a server that is not up yet is not an error here; calls
 * then fail with UNAVAILABLE until it is. On failure returns a status and
 * sets *errmsg (heap, caller frees). */
int moat_rpc_client_open(struct moat_rpc_client **out, const char *url,
    char **errmsg) __attribute__((warn_unused_result));

/* Options of a client (moat_rpc_client_open_opts). Zeroed: no TLS. */
struct moat_rpc_client_opts {
	const struct moat_tls *tls; /* NULL: no TLS (tls+tcp:// refused) */
	/* The name the server's certificate must carry (tls+tcp); NULL:
	 * the url's host. */
	const char *server_name;
	const char *what; /* the link in messages ("the dial to snapd") */
	bool quiet;       /* a failed handshake is not logged (the caller
	                     says it) */
};

/* moat_rpc_client_open_opts: moat_rpc_client_open with the address rules
 * of moat_tls_check_url and, on tls+tcp://, TLS from opts->tls. One
 * connection serves every call (no handshake per call). When a call on a
 * TLS link finds no server, its UNAVAILABLE message says whether the
 * handshake failed (a probe, at most every few seconds per client; the
 * failure is logged once a minute per client). */
int moat_rpc_client_open_opts(struct moat_rpc_client **out, const char *url,
    const struct moat_rpc_client_opts *o, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_rpc_client_close: safe on NULL; no call may be in flight. */
void moat_rpc_client_close(struct moat_rpc_client *c);

/* moat_rpc_client_late_replies: how many of c's calls timed out and may
 * still be answered; while any may, moat_rpc_client_close parks the
 * client (socket open) rather than risk nng 1.5's hang on close, and a
 * later moat_rpc_client_close (of any client, or NULL) finishes it. For
 * tests and diagnostics; thread-safe. */
unsigned moat_rpc_client_late_replies(struct moat_rpc_client *c);

/* Options of one call. Zeroed means defaults. */
struct moat_rpc_opts {
	uint32_t timeout_ms; /* 0: MOAT_RPC_DEFAULT_TIMEOUT_MS */
	uint64_t request_id; /* 0: a fresh random id */
	const char *auth;    /* NULL: none */
	const char *tenant;  /* Envelope.tenant; NULL: none */
};

/* moat_rpc_call: sends `request` to `service`/`method` and waits for the
 * reply. On MOAT_OK, *reply is a message of `reply_desc` the caller frees
 * with protobuf_c_message_free_unpacked(*reply, NULL). On any other
 * status, *reply is NULL and *errmsg is a heap string (caller frees) with
 * the server's message, or the transport's (UNAVAILABLE: "no answer from
 * <url>: is the service running?"; DEADLINE_EXCEEDED). */
int moat_rpc_call(struct moat_rpc_client *c, const char *service,
    const char *method, const ProtobufCMessage *request,
    const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply,
    const struct moat_rpc_opts *opts, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_rpc_call_raw: like moat_rpc_call with an encoded request and reply
 * payload (for forwarding). On MOAT_OK, *reply_payload (heap, caller
 * frees; may be NULL when *reply_len is 0). */
int moat_rpc_call_raw(struct moat_rpc_client *c, const char *service,
    const char *method, const uint8_t *payload, size_t len,
    uint8_t **reply_payload, size_t *reply_len,
    const struct moat_rpc_opts *opts, char **errmsg)
    __attribute__((warn_unused_result));

/* Called once when an asynchronous call ends (moat_rpc_call_raw_async),
 * on an rpc thread: it must not block for long. `code` and `errmsg` as
 * moat_rpc_call_raw says; `reply_payload` (heap, may be NULL) and
 * `errmsg` (heap or NULL) are the callback's to free. */
typedef void (*moat_rpc_done)(void *arg, int code, uint8_t *reply_payload,
    size_t reply_len, char *errmsg);

/* moat_rpc_call_raw_async: moat_rpc_call_raw without a waiting thread:
 * sends and returns; `done` is called exactly once with the outcome
 * (reply, server error, UNAVAILABLE, or DEADLINE_EXCEEDED at the
 * timeout). `payload` is borrowed (encoded before return). Returns
 * MOAT_OK when `done` will be called; else a status with *errmsg (heap)
 * and `done` is never called. `c` must stay open until `done` ran. */
int moat_rpc_call_raw_async(struct moat_rpc_client *c, const char *service,
    const char *method, const uint8_t *payload, size_t len,
    const struct moat_rpc_opts *opts, moat_rpc_done done, void *arg,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_rpc_now_ms: CLOCK_MONOTONIC in ms. */
uint64_t moat_rpc_now_ms(void);

/* moat_rpc_new_request_id: a random non-zero 64-bit id. */
uint64_t moat_rpc_new_request_id(void);

#endif
