/*
 * mcp_http.c: MCP's Streamable HTTP transport (mcp_http.h): the session
 * table (ids from getrandom, a configured size, the least recently used
 * idle one evicted when full: its sandbox destroyed as its own caller,
 * never as the caller who evicts it), the checks the spec asks of a
 * server (Origin against DNS rebinding, the session header), and the
 * HTTP statuses: 200 with the JSON-RPC reply, 202 for notifications and
 * responses, 400 malformed or no session header, 404 unknown session,
 * 405 GET, 403 foreign Origin, 503 a full table. A session answers only
 * requests with the Authorization header it was initialized with, so an
 * id alone does not reach another caller's default sandbox. With keys
 * on, a request without a valid key never gets here: http.c answers 401
 * on its headers, before its body is read, so no session is made.
 * Not for: JSON-RPC itself (lib/mcp/mcp.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "auth.h"
#include "mcp_http.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"

#define SESSION_HEADER "Mcp-Session-Id"
#define SESSION_ID_LEN 32 /* hex digits */

struct mcp_entry {
	char id[SESSION_ID_LEN + 1]; /* "" : free slot */
	struct moat_mcp_session *session;
	char *authz;   /* heap; the Authorization header
	                                     * of initialize ("" : none) */
	unsigned refs; /* requests using it now */
	bool removed;  /* out of the table; the last
	                                     * request frees it */
	time_t last_used;
	/* The state as last put in or read from the store (m->lock). */
	struct moat_mcp_state stored;
	time_t stored_at; /* 0: never */
};

struct moat_mcp_http {
	pthread_mutex_t lock;       /* guards entries (not the sessions) */
	struct mcp_entry **entries; /* heap, max_sessions; NULL: free */
	size_t max_sessions;
	unsigned idle_s; /* idle this long: may be evicted */
	bool has_store;  /* sessions are kept in `store` too */
	struct moat_mcp_http_store store;
	/* After the store did not answer, it is left alone until then
	 * (moat_rpc_now_ms), so requests do not each wait for it. */
	_Atomic uint64_t store_down_until_ms;
};

#define STORE_BACKOFF_MS 10000

/* One caller of the gateway, as the moat_mcp_call_fn lib/mcp takes:
 * http.c's call as `authz` (NULL: the request's own headers). */
struct caller {
	moat_mcp_http_call_fn call;
	void *arg;
	const char *authz;
};

static int
call_as(void *arg, const char *method, json_t *request, json_t **reply,
    char **errmsg)
{
	struct caller *c = arg;

	return c->call(c->arg, c->authz, method, request, reply, errmsg);
}

int
moat_mcp_http_new(struct moat_mcp_http **out, size_t max_sessions,
    unsigned idle_s)
{
	struct moat_mcp_http *m;

	*out = NULL;
	if (max_sessions == 0)
		return MOAT_INVALID_ARGUMENT;
	if ((m = calloc(1, sizeof(*m))) == NULL ||
	    (m->entries = calloc(max_sessions, sizeof(*m->entries))) == NULL) {
		free(m);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	m->max_sessions = max_sessions;
	m->idle_s = idle_s;
	pthread_mutex_init(&m->lock, NULL);
	*out = m;
	return MOAT_OK;
}

void
moat_mcp_http_set_store(struct moat_mcp_http *m,
    const struct moat_mcp_http_store *store)
{
	m->store = *store;
	m->has_store = true;
}

/* store_on: whether the store is there and not known to be down. */
static bool
store_on(struct moat_mcp_http *m)
{
	return m->has_store &&
	    (uint64_t)moat_rpc_now_ms() >=
	    atomic_load(&m->store_down_until_ms);
}

/* store_answered: notes a store call's status: one that says the store
 * did not answer leaves it alone for STORE_BACKOFF_MS. */
static int
store_answered(struct moat_mcp_http *m, int rv)
{
	if (rv == MOAT_UNAVAILABLE || rv == MOAT_DEADLINE_EXCEEDED)
		atomic_store(&m->store_down_until_ms,
		    moat_rpc_now_ms() + STORE_BACKOFF_MS);
	return rv;
}

static int
st_get(struct moat_mcp_http *m, const char *authz, const char *id,
    struct moat_mcp_http_record *out, char **errmsg)
{
	*errmsg = NULL;
	if (!store_on(m))
		return MOAT_UNAVAILABLE;
	return store_answered(m,
	    m->store.get(m->store.arg, authz ? authz : "", id, out, errmsg));
}

static int
st_put(struct moat_mcp_http *m, const char *authz,
    const struct moat_mcp_http_record *r, char **errmsg)
{
	*errmsg = NULL;
	if (!store_on(m))
		return MOAT_UNAVAILABLE;
	return store_answered(m,
	    m->store.put(m->store.arg, authz ? authz : "", r, errmsg));
}

static int
st_del(struct moat_mcp_http *m, const char *authz, const char *id,
    char **errmsg)
{
	*errmsg = NULL;
	if (!store_on(m))
		return MOAT_UNAVAILABLE;
	return store_answered(m,
	    m->store.del(m->store.arg, authz ? authz : "", id, errmsg));
}

static void
entry_free(struct mcp_entry *e)
{
	if (e == NULL)
		return;
	moat_mcp_session_free(e->session);
	free(e->authz);
	free(e);
}

void
moat_mcp_http_free(struct moat_mcp_http *m)
{
	if (m == NULL)
		return;
	for (size_t i = 0; m->entries != NULL && i < m->max_sessions; i++)
		entry_free(m->entries[i]);
	free(m->entries);
	pthread_mutex_destroy(&m->lock);
	free(m);
}

size_t
moat_mcp_http_sessions(struct moat_mcp_http *m)
{
	size_t n = 0;

	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->max_sessions; i++)
		n += m->entries[i] != NULL;
	pthread_mutex_unlock(&m->lock);
	return n;
}

/* ---- replies ---- */

static enum MHD_Result
reply(struct MHD_Connection *conn, unsigned status, json_t *body,
    const char *session_id, const char *allow)
{
	struct MHD_Response *resp;
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	enum MHD_Result ret;

	json_decref(body);
	resp = MHD_create_response_from_buffer(text ? strlen(text) : 0, text,
	    text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (resp == NULL) {
		free(text);
		return MHD_NO;
	}
	if (text != NULL)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
		    "application/json");
	if (session_id != NULL)
		MHD_add_response_header(resp, SESSION_HEADER, session_id);
	if (allow != NULL)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
	ret = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* reply_error: a JSON-RPC error object (id null) with an HTTP status. */
static enum MHD_Result
reply_error(struct MHD_Connection *conn, unsigned status, int code,
    const char *message)
{
	return reply(conn, status, moat_mcp_error_reply(code, message), NULL,
	    NULL);
}

/* ---- the session table ---- */

/* new_session_id: 32 random hex digits into id. */
static bool
new_session_id(char id[SESSION_ID_LEN + 1])
{
	uint8_t rnd[SESSION_ID_LEN / 2];

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return false;
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(id + 2 * i, 3, "%02x", rnd[i]);
	return true;
}

/* session_evict: closes `victim`, out of the table and used by no
 * request, as its own caller (victim->authz through `call`, never the
 * Authorization of the request that evicts it, which may be another
 * tenant's), then frees it. Blocks while the sandbox is destroyed. */
static void
session_evict(struct moat_mcp_http *m, struct mcp_entry *victim, time_t now,
    moat_mcp_http_call_fn call, void *arg)
{
	struct caller as_victim = { .call = call,
		.arg = arg,
		.authz = victim->authz };
	long long idle = (long long)(now - victim->last_used);
	int rv = moat_mcp_session_close(victim->session, call_as, &as_victim);
	char *errmsg = NULL;

	if (m->has_store) {
		(void)st_del(m, victim->authz, victim->id, &errmsg);
		free(errmsg);
	}

	if (rv == MOAT_OK || rv == MOAT_NOT_FOUND)
		moat_info(0,
		    "mcp-session-evicted %s: idle for %lld s "
		    "(mcp-idle-s %u) with all %zu sessions open; %s",
		    victim->id, idle, m->idle_s, m->max_sessions,
		    rv == MOAT_OK ? "its sandbox was destroyed" :
		                    "it had no sandbox");
	else
		moat_warn(0,
		    "mcp-session-evicted %s: idle for %lld s "
		    "(mcp-idle-s %u) with all %zu sessions open; its sandbox "
		    "(label mcp-session=%s) could not be destroyed: %s (see "
		    "mcp-sandbox-leaked)",
		    victim->id, idle, m->idle_s, m->max_sessions, victim->id,
		    moat_strerror(rv));
	entry_free(victim);
}

/* retire: `victim` leaves the full table. Without a store it ends
 * (session_evict). With one it ends only when idle idle_s seconds here
 * and on every gateway (the store's used time); otherwise it stays in the
 * store, where a later request finds it. */
static void
retire(struct moat_mcp_http *m, struct mcp_entry *victim, time_t now,
    moat_mcp_http_call_fn call, void *arg)
{
	struct moat_mcp_http_record r;
	uint64_t idle_ms = (uint64_t)m->idle_s * 1000;
	char *errmsg = NULL;
	int rv;

	if (!store_on(m)) {
		session_evict(m, victim, now, call, arg);
		return;
	}
	rv = st_get(m, victim->authz, victim->id, &r, &errmsg);
	free(errmsg);
	if (rv == MOAT_OK && now - victim->last_used >= (time_t)m->idle_s &&
	    moat_now_unix_ms() - r.used_unix_ms >= idle_ms) {
		session_evict(m, victim, now, call, arg);
		return;
	}
	if (rv == MOAT_OK)
		moat_info(0,
		    "mcp-session-uncached %s: out of this gateway's full "
		    "table (%zu sessions); it goes on in moat-sessiond",
		    victim->id, m->max_sessions);
	entry_free(victim);
}

/* session_add: a new entry `id` for `s` (taken), made with the
 * Authorization header `authz` (NULL: none). When the table is full, the
 * least recently used session that no request uses and that has been
 * idle idle_s seconds or more makes room (session_evict, through `call`
 * with `arg`). False when none may (s is then freed). */
static bool
session_add(struct moat_mcp_http *m, struct moat_mcp_session *s,
    const char *id, const char *authz, moat_mcp_http_call_fn call, void *arg)
{
	struct mcp_entry *e, *victim = NULL;
	size_t slot = m->max_sessions;
	time_t now = time(NULL);

	if ((e = calloc(1, sizeof(*e))) == NULL ||
	    (e->authz = strdup(authz ? authz : "")) == NULL) {
		free(e);
		moat_mcp_session_free(s);
		return false;
	}
	snprintf(e->id, sizeof(e->id), "%s", id);
	e->session = s;
	e->last_used = now;
	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->max_sessions; i++)
		if (m->entries[i] != NULL &&
		    strcmp(m->entries[i]->id, id) == 0) {
			/* Brought from the store by a request at the same
			 * time: that one stays. */
			pthread_mutex_unlock(&m->lock);
			entry_free(e);
			return true;
		}
	for (size_t i = 0; i < m->max_sessions; i++) {
		struct mcp_entry *o = m->entries[i];

		if (o == NULL) {
			slot = i;
			break;
		}
		/* >=: with idle_s 0 any session not in use may go, even
		 * one used this very second. One the store keeps may
		 * always leave the table. */
		if (o->refs == 0 &&
		    (store_on(m) || now - o->last_used >= (time_t)m->idle_s) &&
		    (slot == m->max_sessions ||
		        o->last_used < m->entries[slot]->last_used))
			slot = i;
	}
	if (slot < m->max_sessions) {
		victim = m->entries[slot];
		m->entries[slot] = e;
	}
	pthread_mutex_unlock(&m->lock);
	if (slot == m->max_sessions) {
		entry_free(e);
		return false;
	}
	if (victim != NULL)
		retire(m, victim, now, call, arg);
	return true;
}

/* session_get: the entry of `id` initialized with the Authorization
 * header `authz` (NULL: none), with a reference taken, or NULL. */
static struct mcp_entry *
session_get(struct moat_mcp_http *m, const char *id, const char *authz)
{
	struct mcp_entry *found = NULL;

	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->max_sessions; i++) {
		struct mcp_entry *e = m->entries[i];

		if (e != NULL && strcmp(e->id, id) == 0 &&
		    strcmp(e->authz, authz ? authz : "") == 0) {
			e->refs++;
			e->last_used = time(NULL);
			found = e;
			break;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return found;
}

/* session_put: drops a reference; `remove` takes the entry out of the
 * table. The last reference of a removed entry frees it. */
static void
session_put(struct moat_mcp_http *m, struct mcp_entry *e, bool remove)
{
	bool free_it = false;

	pthread_mutex_lock(&m->lock);
	if (remove && !e->removed) {
		for (size_t i = 0; i < m->max_sessions; i++)
			if (m->entries[i] == e)
				m->entries[i] = NULL;
		e->removed = true;
	}
	e->refs--;
	free_it = e->removed && e->refs == 0;
	pthread_mutex_unlock(&m->lock);
	if (free_it)
		entry_free(e);
}

/* ---- the cluster's store (moat-sessiond) ---- */

static bool
state_same(const struct moat_mcp_state *a, const struct moat_mcp_state *b)
{
	return a->initialized == b->initialized &&
	    strcmp(a->version, b->version) == 0 &&
	    strcmp(a->default_sandbox, b->default_sandbox) == 0;
}

/* store_put: puts e's session when the store has never had it from here,
 * its state changed since, or it was put MOAT_MCP_HTTP_TOUCH_S ago (the
 * store drops sessions unused for long). A failure is logged: the table
 * goes on. */
static void
store_put(struct moat_mcp_http *m, struct mcp_entry *e, const char *authz)
{
	struct moat_mcp_http_record r;
	time_t now = time(NULL);
	char *errmsg = NULL;
	bool due;
	int rv;

	if (!store_on(m))
		return;
	memset(&r, 0, sizeof(r));
	snprintf(r.id, sizeof(r.id), "%s", e->id);
	moat_auth_sha256_hex(authz ? authz : "", r.authz_sha256);
	moat_mcp_session_state(e->session, &r.state);
	pthread_mutex_lock(&m->lock);
	due = e->stored_at == 0 || !state_same(&r.state, &e->stored) ||
	    now - e->stored_at >= MOAT_MCP_HTTP_TOUCH_S;
	pthread_mutex_unlock(&m->lock);
	if (!due)
		return;
	rv = st_put(m, authz, &r, &errmsg);
	if (rv != MOAT_OK) {
		moat_warn(0,
		    "mcp-session-unstored %s: moat-sessiond did not take it "
		    "(%s): other gateways do not see its latest state",
		    e->id, errmsg ? errmsg : moat_strerror(rv));
		free(errmsg);
		return;
	}
	pthread_mutex_lock(&m->lock);
	e->stored = r.state;
	e->stored_at = now;
	pthread_mutex_unlock(&m->lock);
}

/* store_refresh: before a request, what another gateway put since this
 * one last synced (a default sandbox made there) replaces the table's; a
 * change made here and not put yet stays. NOT_FOUND when the store no
 * longer has a session it had (ended through another gateway, expired);
 * MOAT_OK otherwise, also when it does not answer (logged). */
static int
store_refresh(struct moat_mcp_http *m, struct mcp_entry *e, const char *authz)
{
	struct moat_mcp_http_record r;
	struct moat_mcp_state cur;
	char *errmsg = NULL;
	bool had;
	int rv;

	if (!store_on(m))
		return MOAT_OK;
	rv = st_get(m, authz, e->id, &r, &errmsg);
	if (rv != MOAT_OK) {
		pthread_mutex_lock(&m->lock);
		had = e->stored_at != 0;
		pthread_mutex_unlock(&m->lock);
		if (rv != MOAT_NOT_FOUND)
			moat_warn(0,
			    "mcp-session %s: moat-sessiond did not answer "
			    "(%s): going on with this gateway's state",
			    e->id, errmsg ? errmsg : moat_strerror(rv));
		free(errmsg);
		return rv == MOAT_NOT_FOUND && had ? MOAT_NOT_FOUND : MOAT_OK;
	}
	moat_mcp_session_state(e->session, &cur);
	pthread_mutex_lock(&m->lock);
	if (strcmp(r.state.default_sandbox, e->stored.default_sandbox) != 0)
		snprintf(cur.default_sandbox, sizeof(cur.default_sandbox),
		    "%s", r.state.default_sandbox);
	if (strcmp(r.state.version, e->stored.version) != 0 ||
	    r.state.initialized != e->stored.initialized) {
		snprintf(cur.version, sizeof(cur.version), "%s",
		    r.state.version);
		cur.initialized = r.state.initialized;
	}
	e->stored = r.state;
	if (e->stored_at == 0)
		e->stored_at = time(NULL);
	pthread_mutex_unlock(&m->lock);
	moat_mcp_session_set_state(e->session, &cur);
	return MOAT_OK;
}

/* store_load: a session the table lacks, from the store, made by the
 * caller whose Authorization is `authz`: added to the table and returned
 * with a reference, or NULL with *status NOT_FOUND (none, or another
 * caller's) or why the store did not give it. */
static struct mcp_entry *
store_load(struct moat_mcp_http *m, const char *sid, const char *authz,
    struct caller *self, int *status)
{
	struct moat_mcp_http_record r;
	struct moat_mcp_session *s;
	struct mcp_entry *e;
	char hash[MOAT_AUTH_SHA256_HEX], *errmsg = NULL;

	*status = MOAT_NOT_FOUND;
	if (!m->has_store || strlen(sid) != SESSION_ID_LEN)
		return NULL;
	if (!store_on(m)) {
		*status = MOAT_UNAVAILABLE;
		return NULL;
	}
	*status = st_get(m, authz, sid, &r, &errmsg);
	if (*status != MOAT_OK) {
		if (*status != MOAT_NOT_FOUND)
			moat_warn(0, "mcp-session %s: moat-sessiond: %s", sid,
			    errmsg ? errmsg : moat_strerror(*status));
		free(errmsg);
		if (*status != MOAT_UNAVAILABLE &&
		    *status != MOAT_DEADLINE_EXCEEDED)
			*status = MOAT_NOT_FOUND;
		return NULL;
	}
	moat_auth_sha256_hex(authz ? authz : "", hash);
	*status = MOAT_NOT_FOUND;
	if (strcmp(hash, r.authz_sha256) != 0)
		return NULL; /* another caller's: as if absent */
	*status = MOAT_RESOURCE_EXHAUSTED;
	if (moat_mcp_session_new(&s, NULL, sid, &errmsg) != MOAT_OK) {
		free(errmsg);
		return NULL;
	}
	moat_mcp_session_set_state(s, &r.state);
	if (!session_add(m, s, sid, authz, self->call, self->arg) ||
	    (e = session_get(m, sid, authz)) == NULL)
		return NULL;
	pthread_mutex_lock(&m->lock);
	e->stored = r.state;
	e->stored_at = time(NULL);
	pthread_mutex_unlock(&m->lock);
	*status = MOAT_OK;
	moat_info(0, "mcp-session-resumed %s: from moat-sessiond", sid);
	return e;
}

/* find: the session `sid` of the caller (`authz`), from the table or the
 * store, brought up to date, with a reference; NULL with *status why. */
static struct mcp_entry *
find(struct moat_mcp_http *m, const char *sid, const char *authz,
    struct caller *self, int *status)
{
	struct mcp_entry *e = session_get(m, sid, authz);

	*status = MOAT_OK;
	if (e == NULL)
		return store_load(m, sid, authz, self, status);
	if (store_refresh(m, e, authz) == MOAT_NOT_FOUND) {
		moat_info(0,
		    "mcp-session-end %s: ended through another gateway, or "
		    "expired in moat-sessiond",
		    sid);
		session_put(m, e, true);
		*status = MOAT_NOT_FOUND;
		return NULL;
	}
	return e;
}

/* reply_not_found: no session for `status` from find(). */
static enum MHD_Result
reply_not_found(struct MHD_Connection *conn, int status)
{
	if (status == MOAT_NOT_FOUND)
		return reply_error(conn, MHD_HTTP_NOT_FOUND,
		    MOAT_MCP_INVALID_REQUEST,
		    "no such MCP session (ended or "
		    "expired): initialize a new one");
	return reply_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
	    MOAT_MCP_INTERNAL_ERROR,
	    "the MCP session could not be read from moat-sessiond (the "
	    "cluster's store): retry");
}

/* ---- requests ---- */

/* origin_ok: no Origin (not a browser), or a loopback one: a web page
 * elsewhere must not drive a local server (DNS rebinding). */
static bool
origin_ok(struct MHD_Connection *conn)
{
	static const char *const local[] = { "http://localhost",
		"http://127.0.0.1", "http://[::1]", "https://localhost",
		"https://127.0.0.1", "https://[::1]" };
	const char *o =
	    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");

	if (o == NULL || strcmp(o, "null") == 0)
		return o == NULL;
	for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++) {
		size_t n = strlen(local[i]);
		if (strncmp(o, local[i], n) == 0 &&
		    (o[n] == '\0' || o[n] == ':' || o[n] == '/'))
			return true;
	}
	return false;
}

/* serve_post: one POST; `self` is the request's own caller. */
static enum MHD_Result
serve_post(struct moat_mcp_http *m, struct MHD_Connection *conn,
    const char *body, size_t len, struct caller *self)
{
	const char *sid =
	    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, SESSION_HEADER);
	const char *authz = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_AUTHORIZATION);
	struct moat_mcp_session *s;
	struct mcp_entry *e;
	char new_id[SESSION_ID_LEN + 1], *errmsg = NULL;
	json_error_t jerr;
	int status;
	json_t *msg, *out;
	enum MHD_Result ret;

	msg = len > 0 ? json_loadb(body, len,
	                    JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr) :
	                NULL;
	if (msg == NULL) {
		char *text = len > 0 ? moat_asprintf("malformed JSON at line "
		                                     "%d column %d: %s",
		                           jerr.line, jerr.column, jerr.text) :
		                       NULL;
		ret = reply_error(conn, MHD_HTTP_BAD_REQUEST,
		    MOAT_MCP_PARSE_ERROR,
		    text ? text :
		           "the body must be a "
		           "JSON-RPC message");
		free(text);
		return ret;
	}
	if (moat_mcp_is_initialize(msg)) {
		if (!new_session_id(new_id) ||
		    moat_mcp_session_new(&s, NULL, new_id, &errmsg) !=
		        MOAT_OK) {
			json_decref(msg);
			ret = reply_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
			    MOAT_MCP_INTERNAL_ERROR,
			    errmsg ? errmsg : "out of memory");
			free(errmsg);
			return ret;
		}
		if (!session_add(m, s, new_id, authz, self->call, self->arg)) {
			json_decref(msg);
			return reply_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
			    MOAT_MCP_INTERNAL_ERROR,
			    "too many MCP sessions: "
			    "end unused ones with DELETE /mcp");
		}
		if ((e = session_get(m, new_id, authz)) == NULL) {
			json_decref(msg);
			return reply_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
			    MOAT_MCP_INTERNAL_ERROR,
			    "the new session was "
			    "evicted at once: retry");
		}
		out = moat_mcp_handle(e->session, msg, call_as, self);
		store_put(m, e, authz);
		session_put(m, e, false);
		json_decref(msg);
		moat_info(0, "mcp-session-start %s", new_id);
		return reply(conn, MHD_HTTP_OK, out, new_id, NULL);
	}
	if (sid == NULL) {
		json_decref(msg);
		return reply_error(conn, MHD_HTTP_BAD_REQUEST,
		    MOAT_MCP_INVALID_REQUEST,
		    "the Mcp-Session-Id header is "
		    "required: send initialize first and echo the id it "
		    "returns");
	}
	if ((e = find(m, sid, authz, self, &status)) == NULL) {
		json_decref(msg);
		return reply_not_found(conn, status);
	}
	out = moat_mcp_handle(e->session, msg, call_as, self);
	store_put(m, e, authz);
	session_put(m, e, false);
	if (!moat_mcp_has_request(msg)) {
		json_decref(msg);
		json_decref(out);
		return reply(conn, MHD_HTTP_ACCEPTED, NULL, NULL, NULL);
	}
	json_decref(msg);
	return reply(conn, MHD_HTTP_OK, out, NULL, NULL);
}

/* serve_delete: DELETE of session `sid`: its sandbox destroyed, the
 * session out of the table and the store. */
static enum MHD_Result
serve_delete(struct moat_mcp_http *m, struct MHD_Connection *conn,
    const char *sid, struct caller *self)
{
	const char *authz = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_AUTHORIZATION);
	struct mcp_entry *e;
	char *errmsg = NULL;
	int status, rv;

	if ((e = find(m, sid, authz, self, &status)) == NULL)
		return reply_not_found(conn, status);
	moat_mcp_session_close(e->session, call_as, self);
	if (m->has_store &&
	    (rv = st_del(m, authz, e->id, &errmsg)) != MOAT_OK &&
	    rv != MOAT_NOT_FOUND)
		moat_warn(0,
		    "mcp-session %s: ended here, but moat-sessiond did not "
		    "forget it (%s): it expires there after "
		    "mcp-session-ttl-s",
		    e->id, errmsg ? errmsg : moat_strerror(rv));
	free(errmsg);
	moat_info(0, "mcp-session-end %s", e->id);
	session_put(m, e, true);
	return reply(conn, MHD_HTTP_NO_CONTENT, NULL, NULL, NULL);
}

enum MHD_Result
moat_mcp_http_serve(struct moat_mcp_http *m, struct MHD_Connection *conn,
    const char *method, const char *body, size_t len,
    moat_mcp_http_call_fn call, void *arg)
{
	struct caller self = { .call = call, .arg = arg, .authz = NULL };
	const char *sid;

	if (!origin_ok(conn))
		return reply_error(conn, MHD_HTTP_FORBIDDEN,
		    MOAT_MCP_INVALID_REQUEST,
		    "the Origin header names a "
		    "site other than this host: /mcp serves local clients");
	if (strcmp(method, "POST") == 0)
		return serve_post(m, conn, body, len, &self);
	if (strcmp(method, "DELETE") == 0) {
		sid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
		    SESSION_HEADER);
		if (sid == NULL)
			return reply_error(conn, MHD_HTTP_BAD_REQUEST,
			    MOAT_MCP_INVALID_REQUEST,
			    "DELETE /mcp needs the "
			    "Mcp-Session-Id header of the session to end");
		return serve_delete(m, conn, sid, &self);
	}
	return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
	    moat_mcp_error_reply(MOAT_MCP_INVALID_REQUEST,
	        "/mcp takes POST "
	        "(JSON-RPC messages) and DELETE (end a session); this server "
	        "offers no server-initiated stream"),
	    NULL, "POST, DELETE");
}
