/*
 * record_cast.c: a terminal session of a recorded sandbox becomes one
 * step whose stdout is an asciicast v2 file. When an ExecStart with pty
 * on a recorded sandbox succeeds, a watcher thread follows the exec on
 * its node by itself (ExecRead long-polls from offset 0, independent of
 * whichever client reads it, so a client that goes away loses nothing),
 * timestamps each chunk as it arrives and adds ExecResize calls made
 * through this gateway as "r" events. When the exec is over the cast is
 * the stdout of an ExecResult and goes through the ordinary step
 * pipeline (moat_record_step_after: fs trace, append, snapshot) on the
 * sandbox's turn, as one step whose input is the command line.
 * Why in the gateway, not in vmd: vmd's messages have no place for a
 * cast, and a watcher here needs only the existing ExecRead; the
 * timestamps are the gateway's arrival times (a replay's pace, not the
 * guest's exact one).
 * Not for: one-shot Exec steps (record_async.c), the encoding's users
 * outside recording.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "record_cast.h"
#include "record_internal.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

/* ---- the encoding ---- */

static int
cast_put(struct moat_cast *c, const char *s, size_t n)
{
	if (c->len + n + 1 > c->alloc) {
		size_t want = c->alloc ? c->alloc : 4096;
		char *nb;

		while (want < c->len + n + 1)
			want *= 2;
		if ((nb = realloc(c->buf, want)) == NULL)
			return -1;
		c->buf = nb;
		c->alloc = want;
	}
	memcpy(c->buf + c->len, s, n);
	c->len += n;
	c->buf[c->len] = '\0';
	return 0;
}

/* utf8_seq: the length of the valid UTF-8 sequence at p (n bytes
 * there), 0 when p holds only a valid start of one, -1 when invalid
 * (overlong forms, surrogates and code points past U+10FFFF too). */
static int
utf8_seq(const uint8_t *p, size_t n)
{
	uint32_t cp;
	int need, i;

	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		need = 2, cp = p[0] & 0x1f;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		need = 3, cp = p[0] & 0x0f;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		need = 4, cp = p[0] & 0x07;
	else
		return -1;
	for (i = 1; i < need; i++) {
		if ((size_t)i >= n)
			return 0;
		if ((p[i] & 0xc0) != 0x80)
			return -1;
		cp = (cp << 6) | (p[i] & 0x3f);
		/* reject as soon as the prefix says overlong or out of
		 * range, so a bad start is not kept as a tail */
		if (i == 1 &&
		    ((need == 3 && cp < 0x20) ||
		        (need == 3 && cp >= 0x360 && cp < 0x380) ||
		        (need == 4 && (cp < 0x10 || cp > 0x10f))))
			return -1;
	}
	return need;
}

int
moat_cast_json_string(struct moat_cast *c, const uint8_t *data, size_t len,
    bool keep_tail)
{
	size_t i = 0;

	if (cast_put(c, "\"", 1) != 0)
		return -1;
	while (i < len) {
		uint8_t b = data[i];
		char esc[8];
		int n;

		if (b == '"' || b == '\\') {
			esc[0] = '\\';
			esc[1] = (char)b;
			if (cast_put(c, esc, 2) != 0)
				return -1;
			i++;
			continue;
		}
		if (b < 0x20 || b == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", b);
			if (cast_put(c, esc, 6) != 0)
				return -1;
			i++;
			continue;
		}
		n = utf8_seq(data + i, len - i);
		if (n == 0 && keep_tail) {
			memcpy(c->tail, data + i, len - i);
			c->tail_len = len - i;
			break;
		}
		if (n <= 0) {
			if (cast_put(c, "\\ufffd", 6) != 0)
				return -1;
			i++;
			continue;
		}
		if (cast_put(c, (const char *)data + i, (size_t)n) != 0)
			return -1;
		i += (size_t)n;
	}
	return cast_put(c, "\"", 1);
}

int
moat_cast_begin(struct moat_cast *c, uint32_t rows, uint32_t cols,
    int64_t timestamp, const char *term, size_t cap)
{
	char head[160];
	int n;

	memset(c, 0, sizeof(*c));
	c->cap = cap ? cap : MOAT_CAST_MAX;
	n = snprintf(head, sizeof(head),
	    "{\"version\": 2, \"width\": %u, \"height\": %u, \"timestamp\": "
	    "%" PRId64 ", \"env\": {\"TERM\": ",
	    cols, rows, timestamp);
	if (cast_put(c, head, (size_t)n) != 0 ||
	    moat_cast_json_string(c, (const uint8_t *)term, strlen(term),
	        false) != 0 ||
	    cast_put(c, "}}\n", 3) != 0)
		return -1;
	return 0;
}

/* cast_event: one event line; past the cap, one marker instead and
 * nothing after it. */
static int
cast_event(struct moat_cast *c, double t, const char *code,
    const uint8_t *data, size_t len)
{
	static const char cut[] =
	    "\r\n[moat: recording truncated here: the cast reached its "
	    "size limit]\r\n";
	char head[64];
	size_t before = c->len;
	int n;

	if (c->truncated)
		return 0;
	n = snprintf(head, sizeof(head), "[%.6f, \"%s\", ", t < 0 ? 0 : t,
	    code);
	if (cast_put(c, head, (size_t)n) != 0 ||
	    moat_cast_json_string(c, data, len, code[0] == 'o') != 0 ||
	    cast_put(c, "]\n", 2) != 0)
		return -1;
	if (c->len <= c->cap)
		return 0;
	/* Over the cap: this event goes, the marker comes instead. */
	c->len = before;
	c->buf[c->len] = '\0';
	c->truncated = true;
	c->tail_len = 0;
	n = snprintf(head, sizeof(head), "[%.6f, \"o\", ", t < 0 ? 0 : t);
	if (cast_put(c, head, (size_t)n) != 0 ||
	    moat_cast_json_string(c, (const uint8_t *)cut, sizeof(cut) - 1,
	        false) != 0 ||
	    cast_put(c, "]\n", 2) != 0)
		return -1;
	return 0;
}

int
moat_cast_output(struct moat_cast *c, double t, const uint8_t *data,
    size_t len)
{
	uint8_t *joined;
	int rv;

	if (c->tail_len == 0)
		return len == 0 ? 0 : cast_event(c, t, "o", data, len);
	/* The last chunk ended inside a character: it starts this one. */
	if ((joined = malloc(c->tail_len + len)) == NULL)
		return -1;
	memcpy(joined, c->tail, c->tail_len);
	memcpy(joined + c->tail_len, data, len);
	len += c->tail_len;
	c->tail_len = 0;
	rv = cast_event(c, t, "o", joined, len);
	free(joined);
	return rv;
}

int
moat_cast_resize(struct moat_cast *c, double t, uint32_t rows, uint32_t cols)
{
	char size[32];
	int n = snprintf(size, sizeof(size), "%ux%u", cols, rows);

	return cast_event(c, t, "r", (const uint8_t *)size, (size_t)n);
}

void
moat_cast_fini(struct moat_cast *c)
{
	free(c->buf);
	memset(c, 0, sizeof(*c));
}

/* ---- the watcher ---- */

/* How long one ExecRead of the watcher waits for output; also how soon
 * it sees the gateway stopping. */
#define CAST_READ_WAIT_MS 2000
#define CAST_CALL_SLACK_MS 10000

/* One terminal session being recorded. On `watching` while it runs, so
 * ExecResize calls find it; its cast is guarded by watch_lock. */
struct cast_watch {
	struct cast_watch *next;
	struct moat_record *rec;
	char *tenant, *sandbox_id;
	uint64_t exec_id, request_id, start_ms; /* start: monotonic */
	Moat__V1__ExecRequest *request;         /* owned, decoded again */
	struct moat_cast cast;
};

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cast_watch *watching; /* guarded by watch_lock */

static double
watch_t(const struct cast_watch *w)
{
	return (double)(moat_rpc_now_ms() - w->start_ms) / 1000.0;
}

static void
watch_unlist(struct cast_watch *w)
{
	pthread_mutex_lock(&watch_lock);
	for (struct cast_watch **pp = &watching; *pp != NULL;
	     pp = &(*pp)->next) {
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	}
	pthread_mutex_unlock(&watch_lock);
}

static void
watch_free(struct cast_watch *w)
{
	moat_cast_fini(&w->cast);
	if (w->request != NULL)
		moat__v1__exec_request__free_unpacked(w->request, NULL);
	free(w->tenant);
	free(w->sandbox_id);
	free(w);
}

/* watch_follow: the exec's output into the cast until it is over; on
 * MOAT_OK *status (caller frees) is its exit. */
static int
watch_follow(struct cast_watch *w, Moat__V1__ExecStatus **status,
    char **errmsg)
{
	Moat__V1__ExecReadRequest req = MOAT__V1__EXEC_READ_REQUEST__INIT;
	int rv;

	req.sandbox_id = w->sandbox_id;
	req.exec_id = w->exec_id;
	req.wait_ms = CAST_READ_WAIT_MS;
	for (;;) {
		ProtobufCMessage *out = NULL;
		Moat__V1__ExecReadReply *r;

		if (moat_forward_draining(w->rec->fw)) {
			*errmsg =
			    moat_asprintf("the gateway stopped while the "
			                  "terminal session ran");
			return MOAT_UNAVAILABLE;
		}
		if ((rv = record_node_call(w->rec, w->tenant, w->sandbox_id,
		         "ExecRead", &req.base,
		         &moat__v1__exec_read_reply__descriptor,
		         moat_rpc_now_ms() + CAST_READ_WAIT_MS +
		             CAST_CALL_SLACK_MS,
		         "recording a terminal session", &out, errmsg)) !=
		    MOAT_OK)
			return rv;
		r = (Moat__V1__ExecReadReply *)out;
		pthread_mutex_lock(&watch_lock);
		rv = moat_cast_output(&w->cast, watch_t(w), r->stdout.data,
		    r->stdout.len);
		pthread_mutex_unlock(&watch_lock);
		req.stdout_offset = r->stdout_next;
		req.stderr_offset = r->stderr_next;
		if (rv == 0 && r->eof) {
			*status = r->status;
			r->status = NULL;
		}
		moat__v1__exec_read_reply__free_unpacked(r, NULL);
		if (rv != 0) {
			*errmsg = moat_asprintf("out of memory");
			return MOAT_RESOURCE_EXHAUSTED;
		}
		if (*status != NULL)
			return MOAT_OK;
	}
}

/* watch_step: the session as one step (on the sandbox's turn): an
 * ExecResult whose stdout is the cast, through the step pipeline. */
static void
watch_step(struct cast_watch *w, Moat__V1__ExecStatus *status,
    uint64_t started_ms)
{
	Moat__V1__ExecResult res = MOAT__V1__EXEC_RESULT__INIT;
	struct moat_record_step_ctx c = {
		.request = &w->request->base,
		.sandbox_id = w->sandbox_id,
		.tenant = w->tenant,
		.method = "ExecStart",
		.request_id = w->request_id,
		.deadline_ms = moat_rpc_now_ms() + CAST_CALL_SLACK_MS,
		.started_ms = started_ms,
		.ended_ms = moat_now_unix_ms(),
	};
	struct moat_record_entry *e;
	uint8_t *raw;
	size_t len;

	if ((e = moat_record_entry_of(w->rec, w->tenant, w->sandbox_id,
	         w->request_id)) == NULL)
		return; /* no longer recorded */
	status->stdout_truncated |= w->cast.truncated;
	res.status = status;
	res.stdout.data = (uint8_t *)w->cast.buf;
	res.stdout.len = w->cast.len;
	len = protobuf_c_message_get_packed_size(&res.base);
	if ((raw = malloc(len ? len : 1)) == NULL)
		return;
	protobuf_c_message_pack(&res.base, raw);
	record_entry_own(e);
	moat_record_step_before(w->rec, e, w->tenant, w->request_id);
	moat_record_step_after(w->rec, e, &c, &raw, &len);
	moat_record_entry_release(w->rec, e);
	free(raw);
}

static void *
watch_main(void *arg)
{
	struct cast_watch *w = arg;
	Moat__V1__ExecStatus *status = NULL;
	uint64_t started_ms = moat_now_unix_ms();
	char *errmsg = NULL;
	int rv;

	rv = watch_follow(w, &status, &errmsg);
	watch_unlist(w);
	if (rv == MOAT_OK)
		watch_step(w, status, started_ms);
	else
		moat_warn(w->request_id,
		    "recording the terminal session of exec %" PRIu64
		    " in %s: not recorded: %s: %s",
		    w->exec_id, w->sandbox_id, moat_strerror(rv),
		    errmsg ? errmsg : "");
	free(errmsg);
	if (status != NULL)
		moat__v1__exec_status__free_unpacked(status, NULL);
	moat_forward_async_end(w->rec->fw);
	watch_free(w);
	return NULL;
}

void
moat_record_shell_watch(struct moat_record *rec, const char *tenant,
    const struct moat_rpc_call *call, uint64_t exec_id)
{
	struct cast_watch *w;
	pthread_attr_t attr;
	pthread_t t;
	bool ok;

	if ((w = calloc(1, sizeof(*w))) == NULL)
		return;
	w->rec = rec;
	w->exec_id = exec_id;
	w->request_id = call->request_id;
	w->start_ms = moat_rpc_now_ms();
	w->request = moat__v1__exec_request__unpack(NULL, call->payload_len,
	    call->payload);
	w->tenant = strdup(tenant);
	w->sandbox_id = w->request ? strdup(w->request->sandbox_id) : NULL;
	if (w->request == NULL || w->tenant == NULL || w->sandbox_id == NULL ||
	    moat_cast_begin(&w->cast, w->request->rows ? w->request->rows : 24,
	        w->request->cols ? w->request->cols : 80,
	        (int64_t)(moat_now_unix_ms() / 1000),
	        w->request->term[0] ? w->request->term : "xterm-256color",
	        0) != 0) {
		watch_free(w);
		return;
	}
	/* Counted as a forward answered later, so the gateway's drain
	 * waits for the watcher (which stops within a read's wait). */
	if (!moat_forward_async_begin(rec->fw)) {
		watch_free(w);
		return;
	}
	pthread_mutex_lock(&watch_lock);
	w->next = watching;
	watching = w;
	pthread_mutex_unlock(&watch_lock);
	ok = pthread_attr_init(&attr) == 0;
	if (ok) {
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		ok = pthread_create(&t, &attr, watch_main, w) == 0;
		pthread_attr_destroy(&attr);
	}
	if (!ok) {
		moat_warn(call->request_id,
		    "recording the terminal session "
		    "of exec %" PRIu64 ": no thread",
		    exec_id);
		watch_unlist(w);
		moat_forward_async_end(rec->fw);
		watch_free(w);
	}
}

void
moat_record_shell_resize(const Moat__V1__ExecResizeRequest *req)
{
	pthread_mutex_lock(&watch_lock);
	for (struct cast_watch *w = watching; w != NULL; w = w->next)
		if (w->exec_id == req->exec_id &&
		    strcmp(w->sandbox_id, req->sandbox_id) == 0)
			(void)moat_cast_resize(&w->cast, watch_t(w), req->rows,
			    req->cols);
	pthread_mutex_unlock(&watch_lock);
}
