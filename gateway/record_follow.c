/*
 * record_follow.c: a command started with ExecStart on a recorded
 * sandbox becomes one step when it ends. After the start succeeds a
 * follower thread reads the exec on its node by itself (ExecRead
 * long-polls from offset 0, independent of whichever client reads it,
 * so a client that goes away, or one that never reads, loses nothing)
 * until the process is over; its output and exit status are then an
 * ExecResult that goes through the ordinary step pipeline
 * (moat_record_step_after: fs trace, append, snapshot) on the sandbox's
 * turn, as one step whose input is the command. So steps of started
 * commands are appended in the order the commands end.
 * A plain exec's step keeps its stdout and stderr as the node kept them
 * (at most the request's output_cap per stream, flagged truncated past
 * it, as an Exec step's). A terminal session (pty) is a SHELL step whose
 * stdout is an asciicast (record_cast.c), with the ExecResize calls made
 * through this gateway as "r" events.
 * Why in the gateway, not in vmd: vmd's messages have no place for a
 * cast, and a follower here needs only the existing ExecRead.
 * Not for: one-shot Exec and RunCode steps (record_async.c), the cast's
 * encoding (record_cast.c).
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

/* How long one ExecRead of the follower waits for output; also how soon
 * it sees the gateway stopping. */
#define FOLLOW_READ_WAIT_MS 2000
#define FOLLOW_CALL_SLACK_MS 10000
/* The most a plain exec's stream may hold here: the node keeps at most
 * its largest output_cap (64 MiB), so only a node past its own bound
 * reaches this. */
#define FOLLOW_STREAM_MAX (64u << 20)

/* One stream of a plain exec, as read so far. */
struct follow_buf {
	uint8_t *data;
	size_t len, alloc;
	bool truncated; /* past FOLLOW_STREAM_MAX */
};

/* One started command being followed. On `following` while it runs, so
 * ExecResize calls find it and the per-sandbox bound can count it; its
 * cast is guarded by follow_lock. */
struct follow {
	struct follow *next;
	struct moat_record *rec;
	char *tenant, *sandbox_id;
	uint64_t exec_id, request_id, start_ms; /* start: monotonic */
	Moat__V1__ExecRequest *request;         /* owned, decoded again */
	bool pty;
	struct moat_cast cast;      /* pty */
	struct follow_buf out, err; /* plain */
};

static pthread_mutex_t follow_lock = PTHREAD_MUTEX_INITIALIZER;
static struct follow *following; /* guarded by follow_lock */

static double
follow_t(const struct follow *f)
{
	return (double)(moat_rpc_now_ms() - f->start_ms) / 1000.0;
}

static int
buf_add(struct follow_buf *b, const uint8_t *data, size_t len)
{
	if (b->truncated || len == 0)
		return 0;
	if (b->len + len > FOLLOW_STREAM_MAX) {
		b->truncated = true;
		len = FOLLOW_STREAM_MAX - b->len;
	}
	if (b->len + len > b->alloc) {
		size_t want = b->alloc ? b->alloc : 4096;
		uint8_t *nb;

		while (want < b->len + len)
			want *= 2;
		if ((nb = realloc(b->data, want)) == NULL)
			return -1;
		b->data = nb;
		b->alloc = want;
	}
	memcpy(b->data + b->len, data, len);
	b->len += len;
	return 0;
}

/* follow_list: f on `following`, unless its sandbox already has
 * MOAT_RECORD_FOLLOW_MAX followers (false). */
static bool
follow_list(struct follow *f)
{
	unsigned n = 0;

	pthread_mutex_lock(&follow_lock);
	for (struct follow *o = following; o != NULL; o = o->next)
		if (strcmp(o->sandbox_id, f->sandbox_id) == 0)
			n++;
	if (n < MOAT_RECORD_FOLLOW_MAX) {
		f->next = following;
		following = f;
	}
	pthread_mutex_unlock(&follow_lock);
	return n < MOAT_RECORD_FOLLOW_MAX;
}

static void
follow_unlist(struct follow *f)
{
	pthread_mutex_lock(&follow_lock);
	for (struct follow **pp = &following; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	}
	pthread_mutex_unlock(&follow_lock);
}

static void
follow_free(struct follow *f)
{
	moat_cast_fini(&f->cast);
	free(f->out.data);
	free(f->err.data);
	if (f->request != NULL)
		moat__v1__exec_request__free_unpacked(f->request, NULL);
	free(f->tenant);
	free(f->sandbox_id);
	free(f);
}

/* follow_take: one ExecRead's output into f. Returns 0, or -1 out of
 * memory. */
static int
follow_take(struct follow *f, const Moat__V1__ExecReadReply *r)
{
	int rv;

	if (!f->pty)
		return buf_add(&f->out, r->stdout.data, r->stdout.len) != 0 ||
		        buf_add(&f->err, r->stderr.data, r->stderr.len) != 0 ?
		    -1 :
		    0;
	pthread_mutex_lock(&follow_lock);
	rv = moat_cast_output(&f->cast, follow_t(f), r->stdout.data,
	    r->stdout.len);
	pthread_mutex_unlock(&follow_lock);
	return rv;
}

/* follow_run: the exec's output into f until it is over; on MOAT_OK
 * *status (caller frees) is its exit. */
static int
follow_run(struct follow *f, Moat__V1__ExecStatus **status, char **errmsg)
{
	Moat__V1__ExecReadRequest req = MOAT__V1__EXEC_READ_REQUEST__INIT;
	int rv;

	req.sandbox_id = f->sandbox_id;
	req.exec_id = f->exec_id;
	req.wait_ms = FOLLOW_READ_WAIT_MS;
	for (;;) {
		ProtobufCMessage *out = NULL;
		Moat__V1__ExecReadReply *r;

		if (moat_forward_draining(f->rec->fw)) {
			*errmsg = moat_asprintf(
			    "the gateway stopped while the command ran");
			return MOAT_UNAVAILABLE;
		}
		if ((rv = record_node_call(f->rec, f->tenant, f->sandbox_id,
		         "ExecRead", &req.base,
		         &moat__v1__exec_read_reply__descriptor,
		         moat_rpc_now_ms() + FOLLOW_READ_WAIT_MS +
		             FOLLOW_CALL_SLACK_MS,
		         "recording a started command", &out, errmsg)) !=
		    MOAT_OK)
			return rv;
		r = (Moat__V1__ExecReadReply *)out;
		rv = follow_take(f, r);
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

/* follow_step: the command as one step (on the sandbox's turn): an
 * ExecResult of what was read, through the step pipeline. */
static void
follow_step(struct follow *f, Moat__V1__ExecStatus *status,
    uint64_t started_ms)
{
	Moat__V1__ExecResult res = MOAT__V1__EXEC_RESULT__INIT;
	struct moat_record_step_ctx c = {
		.request = &f->request->base,
		.sandbox_id = f->sandbox_id,
		.tenant = f->tenant,
		.method = "ExecStart",
		.request_id = f->request_id,
		.deadline_ms = moat_rpc_now_ms() + FOLLOW_CALL_SLACK_MS,
		.started_ms = started_ms,
		.ended_ms = moat_now_unix_ms(),
	};
	struct moat_record_entry *e;
	uint8_t *raw;
	size_t len;

	if ((e = moat_record_entry_of(f->rec, f->tenant, f->sandbox_id,
	         f->request_id)) == NULL)
		return; /* no longer recorded */
	res.status = status;
	if (f->pty) {
		status->stdout_truncated |= f->cast.truncated;
		res.stdout.data = (uint8_t *)f->cast.buf;
		res.stdout.len = f->cast.len;
	} else {
		status->stdout_truncated |= f->out.truncated;
		status->stderr_truncated |= f->err.truncated;
		res.stdout.data = f->out.data;
		res.stdout.len = f->out.len;
		res.stderr.data = f->err.data;
		res.stderr.len = f->err.len;
	}
	len = protobuf_c_message_get_packed_size(&res.base);
	if ((raw = malloc(len ? len : 1)) == NULL)
		return;
	protobuf_c_message_pack(&res.base, raw);
	record_entry_own(e);
	moat_record_step_before(f->rec, e, f->tenant, f->request_id);
	moat_record_step_after(f->rec, e, &c, &raw, &len);
	moat_record_entry_release(f->rec, e);
	free(raw);
}

static void *
follow_main(void *arg)
{
	struct follow *f = arg;
	Moat__V1__ExecStatus *status = NULL;
	uint64_t started_ms = moat_now_unix_ms();
	char *errmsg = NULL;
	int rv;

	rv = follow_run(f, &status, &errmsg);
	follow_unlist(f);
	if (rv == MOAT_OK)
		follow_step(f, status, started_ms);
	else
		moat_warn(f->request_id,
		    "recording exec %" PRIu64 " in %s: not recorded: %s: %s",
		    f->exec_id, f->sandbox_id, moat_strerror(rv),
		    errmsg ? errmsg : "");
	free(errmsg);
	if (status != NULL)
		moat__v1__exec_status__free_unpacked(status, NULL);
	moat_forward_async_end(f->rec->fw);
	follow_free(f);
	return NULL;
}

/* follow_new: the follower of `call`'s exec, not yet listed (NULL: out
 * of memory, or a request that does not decode). */
static struct follow *
follow_new(struct moat_record *rec, const char *tenant,
    const struct moat_rpc_call *call, uint64_t exec_id)
{
	struct follow *f;
	const Moat__V1__ExecRequest *q;

	if ((f = calloc(1, sizeof(*f))) == NULL)
		return NULL;
	f->rec = rec;
	f->exec_id = exec_id;
	f->request_id = call->request_id;
	f->start_ms = moat_rpc_now_ms();
	f->request = moat__v1__exec_request__unpack(NULL, call->payload_len,
	    call->payload);
	f->tenant = strdup(tenant);
	f->sandbox_id = f->request ? strdup(f->request->sandbox_id) : NULL;
	if ((q = f->request) == NULL || f->tenant == NULL ||
	    f->sandbox_id == NULL) {
		follow_free(f);
		return NULL;
	}
	f->pty = q->pty;
	if (f->pty &&
	    moat_cast_begin(&f->cast, q->rows ? q->rows : 24,
	        q->cols ? q->cols : 80, (int64_t)(moat_now_unix_ms() / 1000),
	        q->term[0] ? q->term : "xterm-256color", 0) != 0) {
		follow_free(f);
		return NULL;
	}
	return f;
}

void
moat_record_follow(struct moat_record *rec, const char *tenant,
    const struct moat_rpc_call *call, uint64_t exec_id)
{
	struct follow *f;
	pthread_attr_t attr;
	pthread_t t;
	bool ok;

	if ((f = follow_new(rec, tenant, call, exec_id)) == NULL) {
		moat_warn(call->request_id,
		    "recording exec %" PRIu64 ": not recorded: out of memory",
		    exec_id);
		return;
	}
	/* Counted as a forward answered later, so the gateway's drain
	 * waits for the follower (which stops within a read's wait). */
	if (!moat_forward_async_begin(rec->fw)) {
		follow_free(f);
		return;
	}
	if (!follow_list(f)) {
		/* The start stands (ExecHandle has no place to say so):
		 * the log does. */
		moat_warn(call->request_id,
		    "recording exec %" PRIu64 " in %s: not recorded: the "
		    "sandbox already has %u followed commands running "
		    "(MOAT_RECORD_FOLLOW_MAX); end some, or run it with Exec",
		    exec_id, f->sandbox_id, MOAT_RECORD_FOLLOW_MAX);
		moat_forward_async_end(rec->fw);
		follow_free(f);
		return;
	}
	ok = pthread_attr_init(&attr) == 0;
	if (ok) {
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		ok = pthread_create(&t, &attr, follow_main, f) == 0;
		pthread_attr_destroy(&attr);
	}
	if (!ok) {
		moat_warn(call->request_id,
		    "recording exec %" PRIu64 ": not recorded: no thread",
		    exec_id);
		follow_unlist(f);
		moat_forward_async_end(rec->fw);
		follow_free(f);
	}
}

void
moat_record_shell_resize(const Moat__V1__ExecResizeRequest *req)
{
	pthread_mutex_lock(&follow_lock);
	for (struct follow *f = following; f != NULL; f = f->next)
		if (f->pty && f->exec_id == req->exec_id &&
		    strcmp(f->sandbox_id, req->sandbox_id) == 0)
			(void)moat_cast_resize(&f->cast, follow_t(f),
			    req->rows, req->cols);
	pthread_mutex_unlock(&follow_lock);
}
