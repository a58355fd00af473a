/*
 * exec.c: processes in a sandbox. ExecStart asks the agent to start one
 * and registers it first, so output that races the reply is never "for an
 * unknown exec"; the guest link's reader appends ExecOutput to the exec's
 * bounded buffers (at most output_cap bytes per stream are kept, the rest
 * is counted and flagged truncated) and records ExecExit. ExecRead reads
 * by offset with a long-poll, ExecWait waits, ExecKill and ExecWrite pass
 * through, and the one-shot Exec is ExecStart plus a wait, answered
 * later by exec_async.c so it holds no RPC worker while it runs. The output of
 * the last VMD_EXEC_KEEP_FINISHED finished execs is kept until the sandbox
 * goes. Everything here is guarded by the sandbox's mu.
 * Not for: files (files.c) or the transport (guest_link.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guest_link.h"
#include "moat/frame.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "exec.h"
#include "files.h"
#include "node.h"
#include "sync.h"
#include "sandbox.h"

#define EXEC_READ_DEFAULT (1u << 20)
#define EXEC_READ_MAX (16u << 20)
/* Room left in a reply for everything but the two output streams. */
#define EXEC_REPLY_SLACK (1u << 20)
/* The largest terminal side (rows or cols) a pty exec may have. */
#define VMD_EXEC_PTY_MAX 1000u

/* ---- the exec table (sb->mu held) ---- */

struct exec *
vmd_exec_find(struct sandbox *sb, uint64_t id)
{
	for (struct exec *e = sb->execs; e != NULL; e = e->next)
		if (e->id == id)
			return e;
	return NULL;
}

/* ---- the node's exec output budget ---- */

/* What every stream keeps whatever the budget (counted all the same):
 * the first allocation. */
#define EXEC_FLOOR 4096u

/* What a stream cut short by the budget ends with. */
#define EXEC_BUDGET_MARKER                                                    \
	"\n[moat: output truncated here: this node's exec output buffers "    \
	"are full ([vmd] exec-output-budget-mib); read output as it comes "   \
	"(ExecRead) or lower output_cap]\n"

/* Takes up to `want` bytes of the node's budget; returns what it got.
 * A sandbox of no node (a unit test's) has no budget. */
static size_t
budget_take(struct vmd *vmd, size_t want)
{
	uint64_t budget, used;

	if (vmd == NULL)
		return want;
	budget = vmd->cfg.exec_output_budget ? vmd->cfg.exec_output_budget :
	                                       (UINT64_C(256) << 20);
	used = __atomic_load_n(&vmd->exec_output_used, __ATOMIC_RELAXED);
	for (;;) {
		size_t got = used >= budget ? 0 :
		    budget - used < want    ? (size_t)(budget - used) :
		                              want;

		if (got == 0)
			return 0;
		if (__atomic_compare_exchange_n(&vmd->exec_output_used, &used,
		        used + got, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			return got;
	}
}

static void
budget_give(struct vmd *vmd, size_t n)
{
	if (vmd != NULL && n > 0)
		__atomic_sub_fetch(&vmd->exec_output_used, n,
		    __ATOMIC_RELAXED);
}

static void
exec_free(struct vmd *vmd, struct exec *e)
{
	budget_give(vmd, e->out[0].alloc + e->out[1].alloc);
	free(e->out[0].buf);
	free(e->out[1].buf);
	free(e);
}

static void
exec_unlink(struct sandbox *sb, struct exec *e)
{
	for (struct exec **pp = &sb->execs; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			if (e->exited)
				sb->execs_finished--;
			else
				sb->execs_running--;
			return;
		}
	}
}

/* Drops the oldest finished execs past the keep limit. */
void
vmd_exec_evict(struct sandbox *sb)
{
	while (sb->execs_finished > VMD_EXEC_KEEP_FINISHED) {
		struct exec *oldest = NULL;

		for (struct exec *e = sb->execs; e != NULL; e = e->next)
			if (e->exited && e->waiter == NULL &&
			    e->watchers == 0 &&
			    (oldest == NULL ||
			        e->finish_seq < oldest->finish_seq))
				oldest = e;
		if (oldest == NULL)
			return;
		exec_unlink(sb, oldest);
		exec_free(sb->vmd, oldest);
	}
}

void
vmd_exec_free_all(struct sandbox *sb)
{
	while (sb->execs != NULL) {
		struct exec *e = sb->execs;
		sb->execs = e->next;
		exec_free(sb->vmd, e);
	}
	sb->execs_running = sb->execs_finished = 0;
}

/* Ends a stream the budget cut short: the marker (counted, though it
 * may pass the budget by its few bytes), a counter, one log line. */
static void
stream_cut(struct sandbox *sb, uint64_t exec_id, struct exec_stream *st)
{
	struct vmd *vmd = sb->vmd;
	size_t m = sizeof(EXEC_BUDGET_MARKER) - 1;
	uint8_t *nb;
	uint64_t cuts;

	st->budget_cut = true;
	st->truncated = true;
	if (vmd == NULL)
		return;
	if ((nb = realloc(st->buf, st->len + m)) != NULL) {
		__atomic_add_fetch(&vmd->exec_output_used,
		    st->len + m - st->alloc, __ATOMIC_RELAXED);
		st->buf = nb;
		st->alloc = st->len + m;
		memcpy(st->buf + st->len, EXEC_BUDGET_MARKER, m);
		st->len += m;
	}
	cuts = __atomic_add_fetch(&vmd->exec_output_cut, 1, __ATOMIC_RELAXED);
	moat_warn(0,
	    "sandbox %s: exec %" PRIu64 "'s output cut short after %zu "
	    "bytes: the node's exec output budget of %" PRIu64 " MiB is "
	    "full (%" PRIu64 " streams cut so far; [vmd] "
	    "exec-output-budget-mib)",
	    sb->id.str, exec_id, st->len - (nb ? m : 0),
	    vmd->cfg.exec_output_budget >> 20, cuts);
}

/* Keeps what fits under the cap and the node's budget; counts
 * everything. Memory is counted as allocated. */
static void
stream_append(struct sandbox *sb, uint64_t exec_id, struct exec_stream *st,
    const uint8_t *data, size_t len)
{
	size_t keep = 0;

	if (st->len < st->cap && !st->budget_cut)
		keep = st->cap - st->len < len ? (size_t)(st->cap - st->len) :
		                                 len;
	if (keep > 0 && st->len + keep > st->alloc) {
		size_t n = st->alloc ? st->alloc : EXEC_FLOOR;
		size_t forced, want, got = 0;
		uint8_t *nb;

		while (n < st->len + keep)
			n *= 2;
		if (n > st->cap)
			n = (size_t)st->cap;
		/* A stream's first EXEC_FLOOR bytes are kept whatever the
		 * budget says, so a small output arrives while others flood;
		 * they are counted all the same. Past them, short of
		 * budget: grow only by what is needed, and only as far as
		 * the budget allows. */
		forced = st->alloc >= EXEC_FLOOR ? 0 :
		    n < EXEC_FLOOR               ? n - st->alloc :
		                                   EXEC_FLOOR - st->alloc;
		if (forced > 0 && sb->vmd != NULL)
			__atomic_add_fetch(&sb->vmd->exec_output_used, forced,
			    __ATOMIC_RELAXED);
		want = n - st->alloc - forced;
		if (want > 0 && (got = budget_take(sb->vmd, want)) < want) {
			size_t need = st->len + keep > st->alloc + forced ?
			    st->len + keep - st->alloc - forced :
			    0;

			budget_give(sb->vmd, got);
			got = need ? budget_take(sb->vmd, need) : 0;
			n = st->alloc + forced + got;
		}
		got += forced;
		if (n <= st->len) {
			budget_give(sb->vmd, got);
			keep = 0;
		} else if ((nb = realloc(st->buf, n)) == NULL) {
			budget_give(sb->vmd, got);
			keep = 0;
		} else {
			st->buf = nb;
			st->alloc = n;
			if (keep > n - st->len)
				keep = n - st->len;
		}
	}
	if (keep > 0) {
		memcpy(st->buf + st->len, data, keep);
		st->len += keep;
	}
	if (keep < len) {
		st->truncated = true;
		/* Cut by the budget, not by the stream's own cap. */
		if (!st->budget_cut && st->len < st->cap)
			stream_cut(sb, exec_id, st);
	}
}

int
vmd_exec_on_message(struct sandbox *sb, const Moat__V1__GuestMessage *m,
    char **why)
{
	struct exec *e;
	int rv = 0;

	*why = NULL;
	pthread_mutex_lock(&sb->mu);
	e = vmd_exec_find(sb, m->id);
	if (m->body_case == MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT) {
		const Moat__V1__ExecOutput *o = m->exec_output;
		struct exec_stream *st;

		if (e == NULL) {
			*why = moat_asprintf("output for exec %" PRIu64
			                     ", which does not exist",
			    m->id);
			rv = -1;
			goto out;
		}
		if (o->stream != MOAT__V1__STREAM__STREAM_STDOUT &&
		    o->stream != MOAT__V1__STREAM__STREAM_STDERR) {
			*why = moat_asprintf(
			    "output on stream %d of exec %" PRIu64,
			    (int)o->stream, m->id);
			rv = -1;
			goto out;
		}
		st = &e->out[o->stream];
		st->received += o->data.len;
		if (st->received > st->cap + MOAT_FRAME_MAX) {
			*why = moat_asprintf("%" PRIu64 " bytes of output for "
			                     "exec %" PRIu64
			                     ", far past its %" PRIu64 "-byte "
			                     "cap",
			    st->received, m->id, st->cap);
			rv = -1;
			goto out;
		}
		if (!e->exited)
			stream_append(sb, e->id, st, o->data.data,
			    o->data.len);
		if (e->watchers > 0)
			vmd_exec_waiters_kick();
	} else {
		const Moat__V1__ExecExit *x = m->exec_exit;

		if (e == NULL || e->exited) {
			*why = moat_asprintf("an exit for exec %" PRIu64
			                     ", which %s",
			    m->id,
			    e ? "had already exited" : "does not exist");
			rv = -1;
			goto out;
		}
		e->exited = true;
		e->exit_code = x->exit_code;
		e->signal = x->signal;
		e->timed_out = x->timed_out;
		e->out[0].truncated |= x->stdout_truncated;
		e->out[1].truncated |= x->stderr_truncated;
		e->duration_ms = x->duration_us / 1000;
		e->stdout_bytes = x->stdout_bytes > e->out[0].received ?
		    x->stdout_bytes :
		    e->out[0].received;
		e->stderr_bytes = x->stderr_bytes > e->out[1].received ?
		    x->stderr_bytes :
		    e->out[1].received;
		if (e->stdout_bytes > e->out[0].len)
			e->out[0].truncated = true;
		if (e->stderr_bytes > e->out[1].len)
			e->out[1].truncated = true;
		e->finish_seq = ++sb->exec_finish_seq;
		sb->execs_running--;
		sb->execs_finished++;
		vmd_exec_evict(sb);
		if (e->waiter != NULL || e->watchers > 0)
			vmd_exec_waiters_kick();
	}
	pthread_cond_broadcast(&sb->cv);
out:
	pthread_mutex_unlock(&sb->mu);
	return rv;
}

/* ---- helpers ---- */

static Moat__V1__ExecStatus *
exec_status_new(const struct exec *e)
{
	Moat__V1__ExecStatus *st = malloc(sizeof(*st));

	if (st == NULL)
		return NULL;
	moat__v1__exec_status__init(st);
	st->exec_id = e->id;
	st->exited = e->exited;
	st->exit_code = e->exit_code;
	st->signal = e->signal;
	st->timed_out = e->timed_out;
	st->stdout_truncated = e->out[0].truncated;
	st->stderr_truncated = e->out[1].truncated;
	st->duration_ms =
	    e->exited ? e->duration_ms : moat_rpc_now_ms() - e->start_ms;
	st->stdout_bytes = e->exited ? e->stdout_bytes : e->out[0].received;
	st->stderr_bytes = e->exited ? e->stderr_bytes : e->out[1].received;
	return st;
}

static void
exec_status_copy(const struct exec *e, Moat__V1__ExecStatus *st)
{
	Moat__V1__ExecStatus *tmp = exec_status_new(e);

	if (tmp == NULL)
		return;
	*st = *tmp;
	free(tmp);
}

static int
bytes_copy(ProtobufCBinaryData *dst, const uint8_t *src, size_t len)
{
	dst->len = 0;
	dst->data = NULL;
	if (len == 0)
		return MOAT_OK;
	if ((dst->data = malloc(len)) == NULL)
		return MOAT_INTERNAL;
	memcpy(dst->data, src, len);
	dst->len = len;
	return MOAT_OK;
}

/* Why a sandbox that stopped running cannot answer about an exec.
 * sb->mu held. */
static int
exec_sandbox_gone(struct sandbox *sb, struct moat_rpc_call *call)
{
	return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
	    "sandbox %s "
	    "is no longer running%s%s: its execs will not finish",
	    sb->id.str, sb->failure_reason ? ": " : "",
	    sb->failure_reason ? sb->failure_reason : "");
}

static int
exec_not_found(struct sandbox *sb, struct moat_rpc_call *call, uint64_t id)
{
	if (id <= sb->exec_id_floor)
		return moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "exec %" PRIu64 " of sandbox %s is from before its vmd "
		    "restarted: the exec's vmd restarted and its outcome is "
		    "unknown (run it again if it is safe to repeat)",
		    id, sb->id.str);
	return moat_rpc_error(call, MOAT_NOT_FOUND,
	    "exec %" PRIu64 " not "
	    "found in sandbox %s (the last %u finished execs are kept)",
	    id, sb->id.str, VMD_EXEC_KEEP_FINISHED);
}

/* ---- start ---- */

static const struct {
	const char *language;
	const char *program;
	const char *flag;
} exec_languages[] = {
	{ "python", "python3", "-c" },
	{ "bash", "bash", "-c" },
	{ "sh", "sh", "-c" },
	{ "node", "node", "-e" },
};

/* Checks `req` before anything reaches the guest: one form of command,
 * a known language (its argv put in lang_argv, borrowing req->code),
 * limits within bounds, env entries KEY=VALUE. Returns a status after
 * moat_rpc_error on failure. */
static int
exec_validate(struct moat_rpc_call *call, const Moat__V1__ExecRequest *req,
    uint64_t cap, char *lang_argv[3])
{
	int forms = (req->n_argv > 0) + (req->shell[0] != '\0') +
	    (req->language[0] != '\0' || req->code[0] != '\0');

	if (forms != 1)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "give "
		    "exactly one of argv, shell, or language with code");
	if (req->language[0] != '\0' || req->code[0] != '\0') {
		size_t i;

		for (i = 0;
		     i < sizeof(exec_languages) / sizeof(exec_languages[0]);
		     i++)
			if (strcmp(req->language,
			        exec_languages[i].language) == 0)
				break;
		if (i == sizeof(exec_languages) / sizeof(exec_languages[0]))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "language \"%s\" is unknown: use python, bash, sh "
			    "or node",
			    req->language);
		lang_argv[0] = (char *)exec_languages[i].program;
		lang_argv[1] = (char *)exec_languages[i].flag;
		lang_argv[2] = req->code;
	}
	if (req->timeout_ms > VMD_EXEC_MAX_TIMEOUT_MS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "timeout_ms "
		    "%u is over the limit of %u ms (24 h)",
		    req->timeout_ms, VMD_EXEC_MAX_TIMEOUT_MS);
	if (cap > VMD_EXEC_MAX_CAP)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "output_cap "
		    "%" PRIu64 " is over the limit of %u bytes (64 MiB) per "
		    "stream",
		    cap, VMD_EXEC_MAX_CAP);
	if (req->rows > VMD_EXEC_PTY_MAX || req->cols > VMD_EXEC_PTY_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "terminal size %ux%u (rows x cols) is out of range: give "
		    "1 to %u each, or 0 for 24x80",
		    req->rows, req->cols, VMD_EXEC_PTY_MAX);
	if (!req->pty && (req->rows || req->cols || req->term[0]))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "rows, cols and term are for a terminal: set pty too");
	for (size_t i = 0; i < req->n_env; i++)
		if (strchr(req->env[i], '=') == NULL)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "env entry \"%.64s\" is not KEY=VALUE",
			    req->env[i]);
	return MOAT_OK;
}

/* Registers a new exec in sb->execs before it is sent, so its output
 * has somewhere to go; sets *ep and *exec_id. Takes sb->mu. Returns a status after
 * moat_rpc_error on failure. */
static int
exec_register(struct sandbox *sb, struct moat_rpc_call *call, uint64_t cap,
    struct exec **ep, uint64_t *exec_id)
{
	struct exec *e;

	pthread_mutex_lock(&sb->mu);
	if (sb->execs_running >= VMD_EXEC_MAX_RUNNING) {
		pthread_mutex_unlock(&sb->mu);
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "sandbox "
		    "%s already runs %u execs: wait for some to finish",
		    sb->id.str, VMD_EXEC_MAX_RUNNING);
	}
	if ((e = calloc(1, sizeof(*e))) == NULL) {
		pthread_mutex_unlock(&sb->mu);
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	}
	e->id = guest_link_new_id(sb->link);
	e->start_ms = moat_rpc_now_ms();
	e->out[0].cap = e->out[1].cap = cap;
	e->next = sb->execs;
	sb->execs = e;
	sb->execs_running++;
	*ep = e;
	*exec_id = e->id;
	pthread_mutex_unlock(&sb->mu);
	return MOAT_OK;
}

/* Sends the rest of a large stdin after the ExecStart, a frame at a
 * time, from offset `off`. */
static int
exec_send_stdin(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, uint64_t exec_id, size_t off)
{
	Moat__V1__GuestMessage *msg = NULL;
	int rv;

	while (off < req->stdin.len) {
		Moat__V1__GuestRequest in_req = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__ExecInput in = MOAT__V1__EXEC_INPUT__INIT;
		size_t n = req->stdin.len - off;

		if (n > MOAT_GUEST_IO_MAX)
			n = MOAT_GUEST_IO_MAX;
		in_req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_INPUT;
		in_req.exec_input = &in;
		in.exec_id = exec_id;
		in.data.data = req->stdin.data + off;
		in.data.len = n;
		off += n;
		in.close =
		    off == req->stdin.len && !req->stdin_open && !req->pty;
		if ((rv = vmd_guest_call(sb, call, &in_req,
		         MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, &msg)) !=
		    MOAT_OK)
			return rv;
		moat__v1__guest_message__free_unpacked(msg, NULL);
	}
	return MOAT_OK;
}

/* Validates and starts `req`; sets *exec_id and *pid. `default_timeout`
 * applies when req->timeout_ms is 0. Returns a status after
 * moat_rpc_error on failure. */
int
vmd_exec_launch(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, uint32_t default_timeout,
    uint64_t *exec_id, int32_t *pid)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecStart start = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestMessage *msg = NULL;
	char *lang_argv[4] = { NULL, NULL, NULL, NULL };
	uint64_t cap =
	    req->output_cap ? req->output_cap : VMD_EXEC_DEFAULT_CAP;
	uint32_t timeout = req->timeout_ms ? req->timeout_ms : default_timeout;
	size_t stdin_first = req->stdin.len;
	struct exec *e = NULL;
	bool answered = false;
	int rv;

	if ((rv = exec_validate(call, req, cap, lang_argv)) != MOAT_OK)
		return rv;
	if (stdin_first > MOAT_GUEST_IO_MAX)
		stdin_first = MOAT_GUEST_IO_MAX;
	if ((rv = exec_register(sb, call, cap, &e, exec_id)) != MOAT_OK)
		return rv;

	greq.id = *exec_id;
	greq.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	greq.exec_start = &start;
	if (lang_argv[0] != NULL) {
		start.argv = lang_argv;
		start.n_argv = 3;
	} else {
		start.argv = req->argv;
		start.n_argv = req->n_argv;
		start.shell = req->shell;
	}
	start.env = req->env;
	start.n_env = req->n_env;
	start.cwd = req->cwd;
	start.stdin.data = req->stdin.data;
	start.stdin.len = stdin_first;
	/* A terminal's stdin stays open: it ends with a Ctrl-D. */
	start.stdin_close =
	    !req->stdin_open && !req->pty && stdin_first == req->stdin.len;
	start.timeout_ms = timeout;
	start.output_cap = cap;
	start.pty = req->pty;
	start.rows = req->rows;
	start.cols = req->cols;
	start.term = req->term;

	rv = vmd_guest_call_until(sb, call, &greq,
	    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_STARTED,
	    vmd_call_deadline(call), &msg, &answered);
	if (rv != MOAT_OK) {
		if (answered) {
			/* The agent refused: no output will come. */
			pthread_mutex_lock(&sb->mu);
			exec_unlink(sb, e);
			exec_free(sb->vmd, e);
			pthread_mutex_unlock(&sb->mu);
		}
		return rv;
	}
	pthread_mutex_lock(&sb->mu);
	e->pid = msg->exec_started->pid;
	e->started = true;
	e->pty = req->pty;
	*pid = e->pid;
	pthread_mutex_unlock(&sb->mu);
	moat__v1__guest_message__free_unpacked(msg, NULL);
	return exec_send_stdin(sb, call, req, *exec_id, stdin_first);
}

int
vmd_exec_start(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecHandle *reply)
{
	struct sandbox *sb;
	uint64_t id = 0;
	int32_t pid = 0;
	int rv;

	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	rv = vmd_exec_launch(sb, call, req, 0, &id, &pid);
	if (rv == MOAT_OK) {
		reply->sandbox_id = strdup(sb->id.str);
		reply->exec_id = id;
		reply->pid = pid;
		if (reply->sandbox_id == NULL)
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
	}
	vmd_sandbox_put(sb);
	return rv;
}

/* ---- read, wait ---- */

int
vmd_exec_read(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecReadRequest *req, Moat__V1__ExecReadReply *reply)
{
	uint64_t deadline = vmd_call_deadline(call);
	uint64_t max = req->max_bytes ? req->max_bytes : EXEC_READ_DEFAULT;
	uint64_t offs[2] = { req->stdout_offset, req->stderr_offset };
	ProtobufCBinaryData *outs[2] = { &reply->stdout, &reply->stderr };
	struct sandbox *sb;
	struct exec *e;
	int rv = MOAT_OK;

	if (vmd_exec_watch(vmd, call, NULL, req))
		return MOAT_OK; /* answered later */
	if (max > EXEC_READ_MAX)
		max = EXEC_READ_MAX;
	if (req->wait_ms > 0 && moat_rpc_now_ms() + req->wait_ms < deadline)
		deadline = moat_rpc_now_ms() + req->wait_ms;
	else if (req->wait_ms == 0)
		deadline = 0;
	if ((rv = vmd_sandbox_get(vmd, call, req->sandbox_id, &sb)) != 0)
		return rv;
	pthread_mutex_lock(&sb->mu);
	for (;;) {
		bool running = vmd_sandbox_api_state(sb) ==
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;

		if ((e = vmd_exec_find(sb, req->exec_id)) == NULL) {
			rv = exec_not_found(sb, call, req->exec_id);
			goto out;
		}
		for (int s = 0; s < 2; s++)
			if (offs[s] > e->out[s].len) {
				rv = moat_rpc_error(call, MOAT_OUT_OF_RANGE,
				    "%s_offset %" PRIu64 " is past the %zu "
				    "bytes kept for exec %" PRIu64,
				    s ? "stderr" : "stdout", offs[s],
				    e->out[s].len, e->id);
				goto out;
			}
		if (e->exited || e->out[0].len > offs[0] ||
		    e->out[1].len > offs[1])
			break;
		if (!running) {
			rv = exec_sandbox_gone(sb, call);
			goto out;
		}
		if (vmd_cond_wait_until(&sb->cv, &sb->mu, deadline) ==
		    ETIMEDOUT)
			break;
	}
	for (int s = 0; s < 2; s++) {
		size_t n = e->out[s].len - (size_t)offs[s];

		if (n > max)
			n = (size_t)max;
		if (bytes_copy(outs[s], e->out[s].buf + offs[s], n) != 0) {
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
			goto out;
		}
		offs[s] += n;
	}
	reply->stdout_next = offs[0];
	reply->stderr_next = offs[1];
	if ((reply->status = exec_status_new(e)) == NULL) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	reply->eof =
	    e->exited && offs[0] == e->out[0].len && offs[1] == e->out[1].len;
out:
	pthread_mutex_unlock(&sb->mu);
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_exec_wait(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWaitRequest *req, Moat__V1__ExecStatus *reply)
{
	uint64_t deadline = vmd_call_deadline(call);
	struct sandbox *sb;
	struct exec *e;
	int rv = MOAT_OK;

	if (vmd_exec_watch(vmd, call, req, NULL))
		return MOAT_OK; /* answered later */
	if (req->wait_ms > 0 && moat_rpc_now_ms() + req->wait_ms < deadline)
		deadline = moat_rpc_now_ms() + req->wait_ms;
	if ((rv = vmd_sandbox_get(vmd, call, req->sandbox_id, &sb)) != 0)
		return rv;
	pthread_mutex_lock(&sb->mu);
	for (;;) {
		if ((e = vmd_exec_find(sb, req->exec_id)) == NULL) {
			rv = exec_not_found(sb, call, req->exec_id);
			goto out;
		}
		if (e->exited)
			break;
		if (vmd_sandbox_api_state(sb) !=
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING) {
			rv = exec_sandbox_gone(sb, call);
			goto out;
		}
		if (vmd_cond_wait_until(&sb->cv, &sb->mu, deadline) ==
		    ETIMEDOUT)
			break;
	}
	/* Not exited by the deadline: the status says so. */
	exec_status_copy(e, reply);
out:
	pthread_mutex_unlock(&sb->mu);
	vmd_sandbox_put(sb);
	return rv;
}

/* ---- write, kill ---- */

/* Checks that exec `id` exists and still runs. */
static int
exec_check_running(struct sandbox *sb, struct moat_rpc_call *call, uint64_t id,
    bool *exited)
{
	struct exec *e;
	int rv = MOAT_OK;

	pthread_mutex_lock(&sb->mu);
	if ((e = vmd_exec_find(sb, id)) == NULL)
		rv = exec_not_found(sb, call, id);
	else
		*exited = e->exited;
	pthread_mutex_unlock(&sb->mu);
	return rv;
}

int
vmd_exec_write(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWriteRequest *req)
{
	struct sandbox *sb;
	bool exited = false;
	size_t off = 0;
	int rv;

	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	if ((rv = exec_check_running(sb, call, req->exec_id, &exited)) != 0)
		goto out;
	if (exited) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "exec %" PRIu64
		    " in sandbox %s has exited: its stdin is gone",
		    req->exec_id, sb->id.str);
		goto out;
	}
	do {
		Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__ExecInput in = MOAT__V1__EXEC_INPUT__INIT;
		Moat__V1__GuestMessage *msg = NULL;
		size_t n = req->data.len - off;

		if (n > MOAT_GUEST_IO_MAX)
			n = MOAT_GUEST_IO_MAX;
		greq.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_INPUT;
		greq.exec_input = &in;
		in.exec_id = req->exec_id;
		in.data.data = n ? req->data.data + off : NULL;
		in.data.len = n;
		off += n;
		in.close = req->close && off == req->data.len;
		if ((rv = vmd_guest_call(sb, call, &greq,
		         MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, &msg)) !=
		    MOAT_OK)
			goto out;
		moat__v1__guest_message__free_unpacked(msg, NULL);
	} while (off < req->data.len);
out:
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_exec_resize(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecResizeRequest *req)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecWinsize ws = MOAT__V1__EXEC_WINSIZE__INIT;
	Moat__V1__GuestMessage *msg = NULL;
	struct sandbox *sb;
	struct exec *e;
	int rv = MOAT_OK;

	if (req->rows == 0 || req->cols == 0 || req->rows > VMD_EXEC_PTY_MAX ||
	    req->cols > VMD_EXEC_PTY_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "terminal size %ux%u (rows x cols) is out of range: give "
		    "1 to %u each",
		    req->rows, req->cols, VMD_EXEC_PTY_MAX);
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	if ((e = vmd_exec_find(sb, req->exec_id)) == NULL)
		rv = exec_not_found(sb, call, req->exec_id);
	else if (!e->pty)
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "exec %" PRIu64 " in sandbox %s is not a terminal: only "
		    "an exec started with pty (moat shell) has a window size",
		    req->exec_id, sb->id.str);
	else if (e->exited)
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "exec %" PRIu64 " in sandbox %s has exited: its terminal "
		    "is gone",
		    req->exec_id, sb->id.str);
	pthread_mutex_unlock(&sb->mu);
	if (rv == MOAT_OK) {
		greq.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_RESIZE;
		greq.exec_resize = &ws;
		ws.exec_id = req->exec_id;
		ws.rows = req->rows;
		ws.cols = req->cols;
		rv = vmd_guest_call(sb, call, &greq,
		    MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, &msg);
		if (rv == MOAT_OK)
			moat__v1__guest_message__free_unpacked(msg, NULL);
	}
	vmd_sandbox_put(sb);
	return rv;
}

/* Sends `sig` to exec `id`'s process group. */
int
vmd_exec_signal(struct sandbox *sb, struct moat_rpc_call *call, uint64_t id,
    int sig, uint64_t deadline)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecSignal es = MOAT__V1__EXEC_SIGNAL__INIT;
	Moat__V1__GuestMessage *msg = NULL;
	int rv;

	greq.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL;
	greq.exec_signal = &es;
	es.exec_id = id;
	es.signal = sig;
	rv = vmd_guest_call_until(sb, call, &greq,
	    MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, deadline, &msg, NULL);
	if (rv == MOAT_OK)
		moat__v1__guest_message__free_unpacked(msg, NULL);
	return rv;
}

int
vmd_exec_kill(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecKillRequest *req)
{
	struct sandbox *sb;
	bool exited = false;
	int sig = req->signal ? req->signal : SIGKILL;
	int rv;

	if (sig < 1 || sig > 64)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "signal %d "
		    "is not a signal number (1-64; 0 means SIGKILL)",
		    sig);
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	if ((rv = exec_check_running(sb, call, req->exec_id, &exited)) == 0 &&
	    !exited)
		rv = vmd_exec_signal(sb, call, req->exec_id, sig,
		    vmd_call_deadline(call));
	vmd_sandbox_put(sb);
	return rv;
}

/* ---- one-shot ---- */

int
vmd_exec_run(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecResult *reply)
{
	struct sandbox *sb;
	int rv;

	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	rv = vmd_exec_run_on(sb, call, req, reply);
	vmd_sandbox_put(sb);
	return rv;
}

/* vmd_exec_result_locked: the ExecResult of exited exec `e` into `reply`;
 * MOAT_OK or MOAT_INTERNAL (out of memory). sb->mu held. */
int
vmd_exec_result_locked(const struct exec *e, Moat__V1__ExecResult *reply)
{
	size_t n_out = e->out[0].len, n_err = e->out[1].len;
	const size_t room = MOAT_RPC_MAX_MSG - EXEC_REPLY_SLACK;

	/* Both streams at a 64 MiB cap would not fit one reply. */
	if (n_out + n_err > room) {
		if (n_out > room / 2 && n_err > room / 2)
			n_out = n_err = room / 2;
		else if (n_out > n_err)
			n_out = room - n_err;
		else
			n_err = room - n_out;
	}
	reply->status = exec_status_new(e);
	if (reply->status == NULL ||
	    bytes_copy(&reply->stdout, e->out[0].buf, n_out) != 0 ||
	    bytes_copy(&reply->stderr, e->out[1].buf, n_err) != 0)
		return MOAT_INTERNAL;
	reply->status->stdout_truncated |= n_out < e->out[0].len;
	reply->status->stderr_truncated |= n_err < e->out[1].len;
	return MOAT_OK;
}

/* exec_wait_here: the one-shot exec's wait on the calling thread (a call
 * that cannot be deferred: a template build's, or too many deferred). */
static int
exec_wait_here(struct sandbox *sb, struct moat_rpc_call *call, uint64_t id,
    Moat__V1__ExecResult *reply)
{
	uint64_t deadline = vmd_call_deadline(call);
	struct exec *e;
	int rv = MOAT_OK;

	pthread_mutex_lock(&sb->mu);
	for (;;) {
		if ((e = vmd_exec_find(sb, id)) == NULL) {
			rv = exec_not_found(sb, call, id);
			break;
		}
		if (e->exited)
			break;
		if (vmd_sandbox_api_state(sb) !=
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING) {
			rv = exec_sandbox_gone(sb, call);
			break;
		}
		if (vmd_cond_wait_until(&sb->cv, &sb->mu, deadline) ==
		    ETIMEDOUT) {
			rv = MOAT_DEADLINE_EXCEEDED;
			break;
		}
	}
	if (rv == MOAT_DEADLINE_EXCEEDED) {
		pthread_mutex_unlock(&sb->mu);
		(void)vmd_exec_signal(sb, call, id, SIGKILL,
		    call->deadline_ms);
		free(call->error_message);
		call->error_message = NULL;
		return moat_rpc_error(call, MOAT_DEADLINE_EXCEEDED,
		    EXEC_DEADLINE_FMT, id, sb->id.str);
	}
	if (rv == MOAT_OK && vmd_exec_result_locked(e, reply) != MOAT_OK)
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	pthread_mutex_unlock(&sb->mu);
	return rv;
}

int
vmd_exec_run_on(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecResult *reply)
{
	uint64_t cap =
	    req->output_cap ? req->output_cap : VMD_EXEC_DEFAULT_CAP;
	char *lang_argv[4] = { NULL, NULL, NULL, NULL };
	uint64_t id = 0;
	int32_t pid = 0;
	int rv;

	/* A bad request is answered at once; a good one is launched and
	 * waited for off the RPC workers when it can be. */
	if ((rv = exec_validate(call, req, cap, lang_argv)) != MOAT_OK)
		return rv;
	if (vmd_exec_enqueue(sb, call, req))
		return MOAT_OK; /* answered later */
	if ((rv = vmd_exec_launch(sb, call, req, VMD_EXEC_DEFAULT_TIMEOUT_MS,
	         &id, &pid)) != MOAT_OK)
		return rv;
	return exec_wait_here(sb, call, id, reply);
}

static const struct vmd_guest_handler exec_guest_handler = {
	.on_message = vmd_exec_on_message,
	.release = vmd_exec_free_all,
};

void
vmd_exec_register(struct vmd *vmd)
{
	vmd_sandbox_set_guest_handler(vmd, &exec_guest_handler);
}
