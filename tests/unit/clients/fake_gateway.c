/*
 * fake_gateway.c: the fake Gateway of fake_gateway.h. Exec is scripted by
 * the code sent: "timeout" ends timed out, "signal" killed by SIGKILL,
 * "forever" never ends, anything else prints "hello" / "warn" and exits 3.
 * Info, ListSandboxes and ListFiles answer canned, non-empty replies.
 * Not for: anything but tests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "fake_gateway.h"
#include "gateway.pb-c.h"
#include "moat/util.h"

static Moat__V1__ExecStatus *status_new(void);
static void set_bytes(ProtobufCBinaryData *b, const char *s);

static int
h_create(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__CreateSandboxRequest *req = (const void *)request;
	Moat__V1__Sandbox *sb = (Moat__V1__Sandbox *)reply;

	/* A slow boot, for interrupting a create. */
	if (strcmp(req->image, "slow") == 0)
		nng_msleep(1500);
	pthread_mutex_lock(&fg->lock);
	fg->creates++;
	fg->create_timeout = req->timeout_s;
	fg->create_idle = req->idle_timeout_s;
	sb->id = moat_asprintf("sb-fake-%d", fg->creates);
	pthread_mutex_unlock(&fg->lock);
	sb->node_id = strdup("node-x");
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	return MOAT_OK;
}

/* GetSandbox: only "sb-rec" exists, recorded as session ses-rec. */
static int
h_get(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__SandboxRef *ref = (const void *)request;
	Moat__V1__Sandbox *sb = (Moat__V1__Sandbox *)reply;

	if (strcmp(ref->sandbox_id, "sb-rec") != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "sandbox %s does "
		    "not exist: `moat sandbox ls` lists the sandboxes",
		    ref->sandbox_id);
	sb->id = strdup("sb-rec");
	sb->session_id = strdup("ses-rec");
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	return MOAT_OK;
}

/* Exec (a recorded sandbox's): prints "rec\n", exits 0, is step 1. */
static int
h_exec(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__ExecRequest *req = (const void *)request;
	Moat__V1__ExecResult *r = (Moat__V1__ExecResult *)reply;

	pthread_mutex_lock(&fg->lock);
	fg->execs++;
	fg->exec_keep = req->keep;
	pthread_mutex_unlock(&fg->lock);
	r->status = status_new();
	set_bytes(&r->stdout, "rec\n");
	r->step_index = 1;
	r->session_id = strdup("ses-rec");
	return MOAT_OK;
}

/* RunCode: "42", remembering keep. */
static int
h_run_code(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__RunCodeRequest *req = (const void *)request;
	Moat__V1__RunCodeResult *r = (Moat__V1__RunCodeResult *)reply;

	pthread_mutex_lock(&fg->lock);
	fg->code_keep = req->keep;
	pthread_mutex_unlock(&fg->lock);
	r->result = malloc(sizeof(*r->result));
	moat__v1__code_result__init(r->result);
	r->result->has_result = true;
	r->result->result = strdup("42");
	return MOAT_OK;
}

/* SetTimeout: remembered; "sb-none" is NOT_FOUND; over 1000 s is
 * refused as the gateway refuses over the tenant's maximum. */
static int
h_set_timeout(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__SetTimeoutRequest *req = (const void *)request;
	Moat__V1__Sandbox *sb = (Moat__V1__Sandbox *)reply;

	if (strcmp(req->sandbox_id, "sb-none") == 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "sandbox %s not found", req->sandbox_id);
	if (req->timeout_s > 1000)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "timeout_s %u is over tenant default's maximum of 1000 s "
		    "([tenants] timeout-max-s.default, else timeout-max-s)",
		    req->timeout_s);
	pthread_mutex_lock(&fg->lock);
	fg->set_timeouts++;
	fg->life_timeout = req->timeout_s;
	fg->life_idle = req->idle_timeout_s;
	fg->life_clear = req->clear_idle_timeout;
	pthread_mutex_unlock(&fg->lock);
	sb->id = strdup(req->sandbox_id);
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	/* 2026-12-05 03:00:00Z */
	sb->expires_unix_ms = req->timeout_s ? 1796439600000ull : 0;
	sb->idle_timeout_s = req->idle_timeout_s;
	return MOAT_OK;
}

/* SetStepKeep: remembered; session "ses-none" is NOT_FOUND. */
static int
h_set_step_keep(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__SetStepKeepRequest *req = (const void *)request;
	Moat__V1__Step *st = (Moat__V1__Step *)reply;

	if (strcmp(req->session_id, "ses-none") == 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "session %s does "
		    "not exist",
		    req->session_id);
	pthread_mutex_lock(&fg->lock);
	snprintf(fg->keep_session, sizeof(fg->keep_session), "%s",
	    req->session_id);
	fg->keep_index = req->index;
	fg->keep_keep = req->keep;
	pthread_mutex_unlock(&fg->lock);
	st->session_id = strdup(req->session_id);
	st->index = req->index;
	st->keep = req->keep;
	return MOAT_OK;
}

static Moat__V1__GcSnapshot *
gc_snapshot_new(const char *id, const char *where, uint64_t bytes)
{
	Moat__V1__GcSnapshot *g = malloc(sizeof(*g));

	moat__v1__gc_snapshot__init(g);
	g->snapshot_id = strdup(id);
	g->where = strdup(where);
	g->bytes = bytes;
	g->sandbox_id = strdup("sb-gone");
	return g;
}

/* GcSnapshots: two snapshots (3 MiB), one kept, one node that failed. */
/* RestoreStep: records what was asked; the sandbox comes back as
 * "sb-restored" (in place: the one named). */
static int
h_restore_step(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__RestoreStepRequest *req = (const void *)request;
	Moat__V1__RestoreStepReply *r = (Moat__V1__RestoreStepReply *)reply;

	pthread_mutex_lock(&fg->lock);
	fg->restores++;
	snprintf(fg->restore_session, sizeof(fg->restore_session), "%s",
	    req->session_id);
	snprintf(fg->restore_sandbox, sizeof(fg->restore_sandbox), "%s",
	    req->sandbox_id);
	fg->restore_step = req->step;
	fg->restore_new = req->new_sandbox;
	fg->restore_reseed = req->reseed;
	pthread_mutex_unlock(&fg->lock);
	r->sandbox = malloc(sizeof(*r->sandbox));
	moat__v1__sandbox__init(r->sandbox);
	r->sandbox->id =
	    strdup(req->sandbox_id[0] ? req->sandbox_id : "sb-restored");
	r->sandbox->node_id = strdup("node-x");
	r->session_id = strdup("ses-branch");
	r->snapshot_id = strdup("snap-node-x-00000000000000aa");
	return MOAT_OK;
}

static int
h_gc(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__GcSnapshotsRequest *req = (const void *)request;
	Moat__V1__GcSnapshotsReply *r = (Moat__V1__GcSnapshotsReply *)reply;

	pthread_mutex_lock(&fg->lock);
	fg->gc_calls++;
	fg->gc_dry_run = req->dry_run;
	fg->gc_min_age = req->min_age_s;
	pthread_mutex_unlock(&fg->lock);
	r->dry_run = req->dry_run;
	r->removed = calloc(2, sizeof(*r->removed));
	r->removed[r->n_removed++] =
	    gc_snapshot_new("snap-node-x-00000000000000aa", "node node-x",
	        2u << 20);
	r->removed[r->n_removed++] =
	    gc_snapshot_new("snap-0123456789abcdef0123456789abcdef", "snapd",
	        1u << 20);
	r->bytes_freed = 3u << 20;
	r->kept = 4;
	r->errors = calloc(1, sizeof(*r->errors));
	r->errors[r->n_errors++] = strdup("node node-y: fake: down");
	return MOAT_OK;
}

/* ListLocalSnapshots: one evicted snapshot of step 2 of ses-rec, with a
 * copy in snapd. */
static int
h_list_snapshots(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	Moat__V1__LocalSnapshotList *r = (Moat__V1__LocalSnapshotList *)reply;
	Moat__V1__LocalSnapshot *s = malloc(sizeof(*s));

	moat__v1__local_snapshot__init(s);
	s->snapshot_id = strdup("snap-node-x-00000000000000bb");
	s->sandbox_id = strdup("sb-rec");
	s->session_id = strdup("ses-rec");
	s->step = 2;
	s->location = strdup("disk");
	s->evicted_to = strdup("snapd");
	s->remote_stored = true;
	s->ram_bytes = 3u << 20;
	s->disk_bytes = 1u << 20;
	r->snapshots = calloc(1, sizeof(*r->snapshots));
	r->snapshots[r->n_snapshots++] = s;
	return MOAT_OK;
}

/* DeleteSession: 3 steps, 2 of 3 unreferenced snapshots deleted (5 MiB
 * freed). */
static int
h_delete_session(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	Moat__V1__DeleteSessionReply *r =
	    (Moat__V1__DeleteSessionReply *)reply;

	r->steps_deleted = 3;
	r->unreferenced_snapshots =
	    calloc(3, sizeof(*r->unreferenced_snapshots));
	for (int i = 0; i < 3; i++)
		r->unreferenced_snapshots[r->n_unreferenced_snapshots++] =
		    moat_asprintf("snap-node-x-%016x", i);
	r->snapshots_deleted = 2;
	r->snapshot_bytes_freed = 5u << 20;
	return MOAT_OK;
}

static int
h_destroy(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__SandboxRef *ref = (const void *)request;

	pthread_mutex_lock(&fg->lock);
	fg->destroys++;
	snprintf(fg->destroyed, sizeof(fg->destroyed), "%s", ref->sandbox_id);
	pthread_mutex_unlock(&fg->lock);
	return MOAT_OK;
}

static int
h_exec_start(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__ExecRequest *req = (const void *)request;
	Moat__V1__ExecHandle *h = (Moat__V1__ExecHandle *)reply;

	pthread_mutex_lock(&fg->lock);
	snprintf(fg->exec_language, sizeof(fg->exec_language), "%s",
	    req->language);
	if (req->code[0] != '\0')
		snprintf(fg->exec_code, sizeof(fg->exec_code), "%s",
		    req->code);
	else if (req->n_argv > 0)
		snprintf(fg->exec_code, sizeof(fg->exec_code), "%s",
		    req->argv[req->n_argv - 1]);
	fg->exec_reads = 0;
	pthread_mutex_unlock(&fg->lock);
	h->sandbox_id = strdup(req->sandbox_id);
	h->exec_id = 1;
	return MOAT_OK;
}

static Moat__V1__ExecStatus *
status_new(void)
{
	Moat__V1__ExecStatus *st = malloc(sizeof(*st));

	moat__v1__exec_status__init(st);
	st->exited = 1;
	return st;
}

static void
set_bytes(ProtobufCBinaryData *b, const char *s)
{
	b->len = strlen(s);
	b->data = malloc(b->len);
	memcpy(b->data, s, b->len);
}

static int
h_exec_read(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__ExecReadRequest *req = (const void *)request;
	Moat__V1__ExecReadReply *r = (Moat__V1__ExecReadReply *)reply;
	char code[256];
	int n;

	pthread_mutex_lock(&fg->lock);
	n = fg->exec_reads++;
	snprintf(code, sizeof(code), "%s", fg->exec_code);
	pthread_mutex_unlock(&fg->lock);
	r->stdout_next = req->stdout_offset;
	r->stderr_next = req->stderr_offset;
	if (strcmp(code, "forever") == 0) {
		nng_msleep(req->wait_ms < 200 ? req->wait_ms : 200);
		return MOAT_OK;
	}
	/* "ratelimited": the second read is refused as the gateway's rate
	 * limit refuses it; the client tries it again. */
	if (n == 1 && strcmp(code, "ratelimited") == 0)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "too many requests with this API key: retry in 1 s");
	if (n == 0) {
		set_bytes(&r->stdout, "hello\n");
		set_bytes(&r->stderr, "warn\n");
		r->stdout_next += 6;
		r->stderr_next += 5;
		return MOAT_OK;
	}
	r->status = status_new();
	r->eof = 1;
	if (strcmp(code, "timeout") == 0) {
		r->status->timed_out = 1;
		r->status->exit_code = -1;
		r->status->signal = 9;
	} else if (strcmp(code, "signal") == 0) {
		r->status->exit_code = -1;
		r->status->signal = 9;
	} else {
		r->status->exit_code = 3;
	}
	return MOAT_OK;
}

static int
h_write_file(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__FileWriteRequest *req = (const void *)request;
	Moat__V1__FileInfo *fi = (Moat__V1__FileInfo *)reply;
	int rv = MOAT_OK;

	pthread_mutex_lock(&fg->lock);
	if (req->offset + req->data.len > FAKE_GW_FILE_MAX) {
		rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED, "too big");
		goto out;
	}
	if (fg->write_calls++ == 0)
		fg->first_write_truncated = req->truncate;
	if (req->data.len > fg->largest_write)
		fg->largest_write = req->data.len;
	if (req->truncate) {
		fg->file_len = req->offset;
		snprintf(fg->file_path, sizeof(fg->file_path), "%s",
		    req->path);
		fg->file_mode = req->mode;
	}
	if (req->data.len > 0)
		memcpy(fg->file + req->offset, req->data.data, req->data.len);
	if (req->offset + req->data.len > fg->file_len)
		fg->file_len = req->offset + req->data.len;
	fi->name = strdup(req->path);
	fi->size = fg->file_len;
	fi->type = MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR;
out:
	pthread_mutex_unlock(&fg->lock);
	return rv;
}

static int
h_read_file(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__FileReadRequest *req = (const void *)request;
	Moat__V1__FileData *d = (Moat__V1__FileData *)reply;
	size_t n;
	int rv = MOAT_OK;

	pthread_mutex_lock(&fg->lock);
	fg->read_calls++;
	if (strcmp(req->path, fg->file_path) != 0) {
		rv = moat_rpc_error(call, MOAT_NOT_FOUND, "%s: no such file",
		    req->path);
		goto out;
	}
	n = req->offset < fg->file_len ? fg->file_len - req->offset : 0;
	if (req->length != 0 && n > req->length)
		n = req->length;
	d->data.data = malloc(n ? n : 1);
	if (n > 0)
		memcpy(d->data.data, fg->file + req->offset, n);
	d->data.len = n;
	d->size = fg->file_len;
	d->eof = req->offset + n >= fg->file_len;
	d->mode = fg->file_mode;
out:
	pthread_mutex_unlock(&fg->lock);
	return rv;
}

static int
h_stat(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__PathRequest *req = (const void *)request;
	Moat__V1__FileInfo *fi = (Moat__V1__FileInfo *)reply;
	int rv = MOAT_OK;

	pthread_mutex_lock(&fg->lock);
	if (strcmp(req->path, "/dir") == 0 || strcmp(req->path, "/") == 0) {
		fi->type = MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
		fi->name = strdup(req->path);
	} else if (strcmp(req->path, fg->file_path) == 0) {
		fi->type = MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR;
		fi->name = strdup(req->path);
		fi->size = fg->file_len;
		fi->mode = fg->file_mode;
	} else {
		rv = moat_rpc_error(call, MOAT_NOT_FOUND, "%s: no such file",
		    req->path);
	}
	pthread_mutex_unlock(&fg->lock);
	return rv;
}

static int
h_ok(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return MOAT_OK;
}

/* Info: the gateway up, sessiond down, and one available node. */
static int
h_info(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	Moat__V1__ClusterInfo *r = (Moat__V1__ClusterInfo *)reply;
	static const char *names[] = { "moat-gateway", "moat-sessiond" };

	r->version = strdup("0.0-fake");
	r->uptime_ms = 1234;
	r->services = calloc(2, sizeof(*r->services));
	for (size_t i = 0; i < 2; i++) {
		Moat__V1__ServiceHealth *h = malloc(sizeof(*h));

		moat__v1__service_health__init(h);
		h->service = strdup(names[i]);
		h->url = strdup("ipc:///fake.sock");
		h->up = i == 0;
		h->version = strdup(i == 0 ? "0.0-fake" : "");
		h->message = strdup(i == 0 ? "" : "fake: down");
		r->services[r->n_services++] = h;
	}
	r->nodes = calloc(1, sizeof(*r->nodes));
	r->nodes[0] = malloc(sizeof(*r->nodes[0]));
	moat__v1__node__init(r->nodes[0]);
	r->nodes[0]->node_id = strdup("node-x");
	r->nodes[0]->rpc_url = strdup("ipc:///fake-vmd.sock");
	r->nodes[0]->accel = strdup("tcg");
	r->nodes[0]->driver = strdup("qemu");
	r->nodes[0]->version = strdup("0.0-fake");
	r->nodes[0]->isolation = strdup("relaxed: no cgroup (fake)");
	r->nodes[0]->available = true;
	r->nodes[0]->vcpus_total = 4;
	r->nodes[0]->snapshot_ram_budget_bytes = 512u << 20;
	r->nodes[0]->snapshot_ram_used_bytes = 128u << 20;
	r->nodes[0]->snapshot_evictions = 7;
	r->nodes[0]->snapshots_in_ram = 3;
	r->nodes[0]->snapshots_on_disk = 5;
	r->nodes[0]->ram_dir = strdup("/dev/shm/moat-ram");
	r->nodes[0]->ram_dir_capacity_bytes = 1024u << 20;
	r->nodes[0]->ram_dir_reserved_bytes = 300u << 20;
	r->n_nodes = 1;
	return MOAT_OK;
}

/* ListSandboxes: one running sandbox, sb-1 on node-x. */
static int
h_list_sandboxes(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	Moat__V1__SandboxList *r = (Moat__V1__SandboxList *)reply;
	Moat__V1__Sandbox *sb = malloc(sizeof(*sb));

	moat__v1__sandbox__init(sb);
	sb->id = strdup("sb-1");
	sb->node_id = strdup("node-x");
	sb->image = strdup("default");
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	sb->vcpus = 1;
	sb->memory_mib = 256;
	r->sandboxes = calloc(1, sizeof(*r->sandboxes));
	r->sandboxes[0] = sb;
	r->n_sandboxes = 1;
	return MOAT_OK;
}

/* ListFiles: one regular file, "hello.txt" of 6 bytes, in any directory. */
static int
h_list_files(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__PathRequest *req = (const void *)request;
	Moat__V1__FileList *r = (Moat__V1__FileList *)reply;
	Moat__V1__FileInfo *fi = malloc(sizeof(*fi));

	moat__v1__file_info__init(fi);
	fi->name = strdup("hello.txt");
	fi->path = moat_asprintf("%s/hello.txt", req->path);
	fi->size = 6;
	fi->mode = 0644;
	fi->type = MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR;
	r->entries = calloc(1, sizeof(*r->entries));
	r->entries[0] = fi;
	r->n_entries = 1;
	return MOAT_OK;
}

/* Diff: canned: the sessions part at step 2, where B created /w/new. */
static int
h_diff(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__DiffRequest *req = (const void *)request;
	Moat__V1__DiffReply *r = (Moat__V1__DiffReply *)reply;
	Moat__V1__StepDiff *d;
	Moat__V1__FileDiff *f;

	if (strncmp(req->session_a, "ses-", 4) != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "session %s does "
		    "not exist",
		    req->session_a);
	r->session_a = strdup(req->session_a);
	r->session_b = strdup(req->session_b);
	r->first_divergent_step = 2;
	r->steps_a = 2;
	r->steps_b = 2;
	r->steps = calloc(1, sizeof(*r->steps));
	d = malloc(sizeof(*d));
	f = malloc(sizeof(*f));
	moat__v1__step_diff__init(d);
	moat__v1__file_diff__init(f);
	d->index = 2;
	d->in_a = d->in_b = true;
	d->input_differs = true;
	d->input_a = strdup("true");
	d->input_b = strdup("touch /w/new");
	d->exit_code_b = 1;
	d->stdout_differs = true;
	f->path = strdup("/w/new");
	f->change_a = strdup("");
	f->change_b = strdup("created");
	f->sha256_a = strdup("");
	f->sha256_b = strdup("ab");
	d->files = calloc(1, sizeof(*d->files));
	d->files[0] = f;
	d->n_files = 1;
	r->steps[0] = d;
	r->n_steps = 1;
	return MOAT_OK;
}

/* Compare: every session scored, ranked in the order asked. */
static int
h_compare(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__CompareRequest *req = (const void *)request;
	Moat__V1__CompareReply *r = (Moat__V1__CompareReply *)reply;

	r->sessions = calloc(req->n_session_ids + 1, sizeof(*r->sessions));
	for (size_t i = 0; i < req->n_session_ids; i++) {
		Moat__V1__SessionScore *s = malloc(sizeof(*s));

		moat__v1__session_score__init(s);
		s->session_id = strdup(req->session_ids[i]);
		s->sandbox_id = strdup("sb-<b>");
		s->rank = (uint32_t)i + 1;
		s->steps = 1;
		s->final_success = i == 0;
		r->sessions[r->n_sessions++] = s;
	}
	return MOAT_OK;
}

/* ListSteps: none, but for sessions named "ses-html...": one step whose
 * input is markup, for the HTML report's escaping; "ses-rec": a pinned
 * step 1 and a step 2 whose snapshot retention removed. */
static int
rec_steps(Moat__V1__ListStepsReply *r)
{
	r->steps = calloc(2, sizeof(*r->steps));
	for (int i = 0; i < 2; i++) {
		Moat__V1__Step *st = malloc(sizeof(*st));

		moat__v1__step__init(st);
		st->session_id = strdup("ses-rec");
		st->index = (uint64_t)i + 1;
		st->kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
		st->input = strdup(i == 0 ? "make" : "make test");
		if (i == 0) {
			/* Inherited from its parent (issue 18). */
			st->held_by_session = strdup("ses-parent");
			st->keep = true;
			st->snapshot_id =
			    strdup("snap-node-x-00000000000000cc");
		} else {
			st->snapshot_removed = strdup("removed by retention "
			                              "(keep-last 3)");
		}
		r->steps[r->n_steps++] = st;
	}
	return MOAT_OK;
}

static int
h_list_steps(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ListStepsRequest *req = (const void *)request;
	Moat__V1__ListStepsReply *r = (Moat__V1__ListStepsReply *)reply;
	Moat__V1__Step *st;

	if (strcmp(req->session_id, "ses-rec") == 0)
		return rec_steps(r);
	if (strncmp(req->session_id, "ses-html", 8) != 0)
		return MOAT_OK;
	st = malloc(sizeof(*st));
	moat__v1__step__init(st);
	st->session_id = strdup(req->session_id);
	st->index = 1;
	st->kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	st->input = strdup("echo '<script>alert(1)</script>' & \"q\"");
	st->exit_code = 0;
	r->steps = calloc(1, sizeof(*r->steps));
	r->steps[0] = st;
	r->n_steps = 1;
	return MOAT_OK;
}

/* tree_node: one node of the fake tree. */
static Moat__V1__SessionTreeNode *
tree_node(const char *id, const char *parent, uint32_t depth, uint64_t at,
    uint64_t steps, uint64_t own, int exit_code)
{
	Moat__V1__SessionTreeNode *n = malloc(sizeof(*n));

	moat__v1__session_tree_node__init(n);
	n->session_id = strdup(id);
	n->parent_session_id = strdup(parent);
	n->depth = depth;
	n->branched_at = at;
	n->step_count = steps;
	n->own_steps = own;
	n->first_step = steps - own + 1;
	n->has_exit = own > 0;
	n->last_exit_code = exit_code;
	n->sandbox_id = strdup("sb-1");
	return n;
}

/* GetSessionTree (issue 18): "ses-tree" has 3 steps, a branch at step 1
 * with one step of its own (exit 7), and under it a branch at step 2
 * with none; any other session is not found. */
static int
h_get_session_tree(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__GetSessionTreeRequest *req = (const void *)request;
	Moat__V1__SessionTreeReply *r = (Moat__V1__SessionTreeReply *)reply;

	if (strcmp(req->session_id, "ses-tree") != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "session %s not found: `moat session ls` lists them",
		    req->session_id);
	r->nodes = calloc(3, sizeof(*r->nodes));
	r->nodes[r->n_nodes++] = tree_node("ses-tree", "", 0, 0, 3, 3, 0);
	r->nodes[r->n_nodes++] =
	    tree_node("ses-branch", "ses-tree", 1, 1, 2, 1, 7);
	r->nodes[r->n_nodes++] =
	    tree_node("ses-leaf", "ses-branch", 2, 2, 2, 0, 0);
	return MOAT_OK;
}

/* ---- operating nodes (issue 15) ---- */

/* ListNodes: node-x, cordoned, protocol 2; node-old, protocol 0 (1). */
static int
h_list_nodes(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	Moat__V1__NodeList *r = (Moat__V1__NodeList *)reply;
	static const char *ids[] = { "node-x", "node-old" };

	(void)call;
	(void)request;
	r->nodes = calloc(2, sizeof(*r->nodes));
	for (int i = 0; i < 2; i++) {
		Moat__V1__Node *n = malloc(sizeof(*n));

		moat__v1__node__init(n);
		n->node_id = strdup(ids[i]);
		n->rpc_url = strdup("tls+tcp://10.0.0.2:7710");
		n->available = true;
		n->vcpus_total = 8;
		n->memory_mib_total = 4096;
		n->sandboxes = (uint32_t)i + 2;
		n->protocol_version = i == 0 ? 2 : 0;
		n->cordoned = i == 0;
		n->cordon_reason = strdup(i == 0 ? "kernel upgrade" : "");
		n->unusable_reason =
		    strdup(i == 0 ? "cordoned: kernel upgrade" :
		                    "protocol version 1 < 2: "
		                    "upgrade moat-vmd");
		r->nodes[r->n_nodes++] = n;
	}
	return MOAT_OK;
}

/* CordonNode: the node as asked. */
static int
h_cordon_node(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__CordonNodeRequest *req = (const void *)request;
	Moat__V1__Node *n = (Moat__V1__Node *)reply;

	if (strcmp(req->node_id, "node-x") != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "CordonNode: node %s is unknown to the gateway",
		    req->node_id);
	n->node_id = strdup(req->node_id);
	n->cordoned = req->cordoned;
	n->cordon_reason = strdup(req->cordoned ? req->reason : "");
	return MOAT_OK;
}

/* DrainNode: sb-1 moved to the target (or node-y), sb-2 failed. */
static int
h_drain_node(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__DrainNodeRequest *req = (const void *)request;
	Moat__V1__DrainNodeReply *r = (Moat__V1__DrainNodeReply *)reply;

	(void)call;
	r->sandboxes = calloc(2, sizeof(*r->sandboxes));
	for (int i = 0; i < 2; i++) {
		Moat__V1__DrainedSandbox *d = malloc(sizeof(*d));

		moat__v1__drained_sandbox__init(d);
		d->sandbox_id = strdup(i == 0 ? "sb-1" : "sb-2");
		d->tenant = strdup("default");
		d->from_node_id = strdup(req->node_id);
		d->moved = i == 0;
		d->to_node_id = strdup(i == 0 ?
		        (req->target_node_id[0] ? req->target_node_id :
		                                  "node-y") :
		        "");
		d->pause_ms = i == 0 ? 1234 : 0;
		d->error = strdup(i == 0 ? "" :
		                           "node node-y refused the restore: "
		                           "full");
		r->sandboxes[r->n_sandboxes++] = d;
	}
	r->moved = 1;
	r->failed = 1;
	return MOAT_OK;
}

/* ---- images (issue 17) ---- */

static int
h_start_build(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__ImageBuildRequest *req = (const void *)request;
	Moat__V1__ImageBuild *b = (Moat__V1__ImageBuild *)reply;
	size_t used = 0;

	pthread_mutex_lock(&fg->lock);
	snprintf(fg->build_name, sizeof(fg->build_name), "%s", req->name);
	snprintf(fg->build_spec, sizeof(fg->build_spec), "%s", req->spec);
	snprintf(fg->build_node, sizeof(fg->build_node), "%s", req->node_id);
	fg->build_force = req->force;
	fg->build_files[0] = '\0';
	for (size_t i = 0; i < req->n_files; i++)
		used += (size_t)snprintf(fg->build_files + used,
		    used < sizeof(fg->build_files) ?
		        sizeof(fg->build_files) - used :
		        0,
		    "%s:%o:%zu ", req->files[i]->name, req->files[i]->mode,
		    req->files[i]->data.len);
	fg->build_polls = 0;
	pthread_mutex_unlock(&fg->lock);
	b->id = strdup("b-1");
	b->node_id = strdup("node-x");
	b->name = strdup(req->name);
	b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_RUNNING;
	return MOAT_OK;
}

static Moat__V1__ImageInfo *
fake_image(const char *name, bool stored, const char *node)
{
	Moat__V1__ImageInfo *e = malloc(sizeof(*e));

	moat__v1__image_info__init(e);
	e->name = strdup(name);
	e->id = strdup("0123456789abcdef0123456789abcdef");
	e->size_bytes = 3u << 20;
	e->packages = calloc(2, sizeof(char *));
	e->packages[e->n_packages++] = strdup("jq=1.6-2.1");
	e->packages[e->n_packages++] = strdup("bash=5.2");
	e->stored = stored;
	if (node != NULL) {
		e->nodes = calloc(1, sizeof(char *));
		e->nodes[e->n_nodes++] = strdup(node);
	}
	return e;
}

/* GetImageBuild: from step 0, two steps; from step 2, the end. */
static int
h_get_build(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__ImageBuildRef *ref = (const void *)request;
	Moat__V1__ImageBuild *b = (Moat__V1__ImageBuild *)reply;
	bool broken;

	if (strcmp(ref->build_id, "b-1") != 0 ||
	    strcmp(ref->node_id, "node-x") != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "no build %s on node %s", ref->build_id, ref->node_id);
	pthread_mutex_lock(&fg->lock);
	fg->build_polls++;
	broken = strcmp(fg->build_name, "broken") == 0;
	b->name = strdup(fg->build_name);
	pthread_mutex_unlock(&fg->lock);
	b->id = strdup("b-1");
	b->node_id = strdup("node-x");
	b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_RUNNING;
	if (ref->from_step == 0) {
		b->steps = calloc(2, sizeof(*b->steps));
		for (int i = 0; i < 2; i++) {
			Moat__V1__ImageBuildStep *st = malloc(sizeof(*st));

			moat__v1__image_build_step__init(st);
			st->text = strdup(i == 0 ? "debootstrap bookworm" :
			                           "apt-get install jq");
			st->at_ms = i == 0 ? 100 : 12345;
			b->steps[b->n_steps++] = st;
		}
		b->next_step = 2;
		return MOAT_OK;
	}
	b->next_step = ref->from_step;
	if (broken) {
		b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_FAILED;
		b->error = strdup("apt-get: unable to locate package nope");
		b->code = MOAT_FAILED_PRECONDITION;
		return MOAT_OK;
	}
	b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_DONE;
	b->image = fake_image(b->name, true, "node-x");
	b->elapsed_ms = 20000;
	return MOAT_OK;
}

static int
h_list_images(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	Moat__V1__ImageList *r = (Moat__V1__ImageList *)reply;

	(void)call;
	(void)request;
	r->images = calloc(2, sizeof(*r->images));
	r->images[r->n_images++] = fake_image("default", true, "node-x");
	r->images[r->n_images++] = fake_image("tools", false, NULL);
	return MOAT_OK;
}

static int
h_push_image(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__ImageRef *ref = (const void *)request;
	Moat__V1__ImageInfo *e = (Moat__V1__ImageInfo *)reply;

	pthread_mutex_lock(&fg->lock);
	snprintf(fg->pushed, sizeof(fg->pushed), "%s", ref->name);
	snprintf(fg->push_node, sizeof(fg->push_node), "%s", ref->node_id);
	pthread_mutex_unlock(&fg->lock);
	e->name = strdup(ref->name);
	e->id = strdup("0123456789abcdef0123456789abcdef");
	e->stored = true;
	e->stored_bytes = 1u << 20;
	return MOAT_OK;
}

static int
h_remove_image(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_gateway *fg = call->service_ctx;
	const Moat__V1__ImageRef *ref = (const void *)request;
	Moat__V1__RemoveImageReply *r = (Moat__V1__RemoveImageReply *)reply;

	if (strcmp(ref->name, "busy") == 0)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "RemoveImage: 1 sandbox(es) run image busy: sb-1 (tenant "
		    "default); destroy them first (`moat sandbox rm ID`)");
	pthread_mutex_lock(&fg->lock);
	snprintf(fg->removed, sizeof(fg->removed), "%s", ref->name);
	pthread_mutex_unlock(&fg->lock);
	r->nodes = calloc(1, sizeof(char *));
	r->nodes[r->n_nodes++] = strdup("node-x");
	r->stored_removed = true;
	r->freed_bytes = 2u << 20;
	return MOAT_OK;
}

static const struct moat_rpc_method fake_gateway_methods[] = {
	{ "Health", h_ok, false, false },
	{ "Info", h_info, false, false },
	{ "ListNodes", h_list_nodes, false, false },
	{ "CreateSandbox", h_create, true, false },
	{ "GetSandbox", h_get, false, false },
	{ "ListSandboxes", h_list_sandboxes, false, false },
	{ "DestroySandbox", h_destroy, true, false },
	{ "ExecStart", h_exec_start, true, false },
	{ "ExecRead", h_exec_read, false, false },
	{ "ExecWrite", h_ok, true, false },
	{ "ExecWait", h_ok, false, false },
	{ "ExecKill", h_ok, true, false },
	{ "Exec", h_exec, true, false },
	{ "ExecStream", h_ok, false, false },
	{ "Attach", h_ok, false, false },
	{ "ReadFile", h_read_file, false, false },
	{ "WriteFile", h_write_file, true, false },
	{ "ListFiles", h_list_files, false, false },
	{ "StatFile", h_stat, false, false },
	{ "RemoveFile", h_ok, true, false },
	{ "MakeDir", h_ok, true, false },
	{ "PutArchive", h_ok, true, false },
	{ "GetArchive", h_ok, false, false },
	{ "SandboxInfo", h_ok, false, false },
	{ "TraceFs", h_ok, false, false },
	{ "SnapshotSandbox", h_ok, true, false },
	{ "RestoreSandbox", h_ok, true, false },
	{ "ListLocalSnapshots", h_list_snapshots, false, false },
	{ "DeleteLocalSnapshot", h_ok, true, false },
	{ "ListSessions", h_ok, false, false },
	{ "GetSession", h_ok, false, false },
	{ "ListSteps", h_list_steps, false, false },
	{ "GetStep", h_ok, false, false },
	{ "GetSessionTree", h_get_session_tree, false, false },
	{ "ExportSession", h_ok, false, false },
	{ "DeleteSession", h_delete_session, true, false },
	{ "RestoreStep", h_restore_step, true, false },
	{ "Fork", h_ok, true, false },
	{ "Replay", h_ok, true, false },
	{ "Diff", h_diff, false, false },
	{ "Compare", h_compare, false, false },
	{ "RunCode", h_run_code, true, false },
	{ "CloseCodeContext", h_ok, true, false },
	{ "ListAudit", h_ok, false, false },
	{ "SetStepKeep", h_set_step_keep, true, false },
	{ "SetTimeout", h_set_timeout, true, false },
	{ "ExecResize", h_ok, true, false },
	{ "GcSnapshots", h_gc, true, false },
	{ "CordonNode", h_cordon_node, true, false },
	{ "DrainNode", h_drain_node, true, false },
	{ "StartImageBuild", h_start_build, true, false },
	{ "GetImageBuild", h_get_build, false, false },
	{ "ListImages", h_list_images, false, false },
	{ "PushImage", h_push_image, true, false },
	{ "RemoveImage", h_remove_image, true, false },
};

int
fake_gateway_start(struct fake_gateway *fg, const char *dir)
{
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__gateway__descriptor,
		.methods = fake_gateway_methods,
		.n_methods = sizeof(fake_gateway_methods) /
		    sizeof(fake_gateway_methods[0]),
		.ctx = fg,
	};
	char *errmsg = NULL;
	int rv;

	memset(fg, 0, sizeof(*fg));
	pthread_mutex_init(&fg->lock, NULL);
	if ((fg->file = malloc(FAKE_GW_FILE_MAX)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	snprintf(fg->url, sizeof(fg->url), "ipc://%s/gateway.sock", dir);
	if ((rv = moat_rpc_server_start(&fg->srv, fg->url, &svc, 8,
	         &errmsg)) != MOAT_OK) {
		fprintf(stderr, "fake gateway: %s\n", errmsg);
		free(errmsg);
	}
	return rv;
}

void
fake_gateway_stop(struct fake_gateway *fg)
{
	moat_rpc_server_stop(fg->srv);
	fg->srv = NULL;
	free(fg->file);
	fg->file = NULL;
	pthread_mutex_destroy(&fg->lock);
}
