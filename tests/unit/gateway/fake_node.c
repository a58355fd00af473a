/*
 * fake_node.c: the fake vmd of fake_node.h: survey answers from a
 * respondent thread, and Vm handlers over an in-memory sandbox list (and
 * the local snapshots taken of them) that record the method, request id
 * and tenant of every call.
 * Not for: anything but tests.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/survey0/respond.h>

#include "fake_node.h"
#include "moat/nng_close.h"
#include "moat/util.h"
#include "vm.pb-c.h"

static int
find_sandbox(struct fake_node *fn, const char *id)
{
	for (int i = 0; i < fn->n_sandboxes; i++)
		if (strcmp(fn->sandboxes[i], id) == 0)
			return i;
	return -1;
}

/* exec_log_to: appends to the log `log` of `size` bytes (fn->lock
 * held); what does not fit is dropped. */
static void
exec_log_to(char *log, size_t size, const char *fmt, ...)
{
	size_t n = strlen(log);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(log + n, size - n, fmt, ap);
	va_end(ap);
}

#define exec_log(fn, ...)                                                     \
	exec_log_to((fn)->exec_log, sizeof((fn)->exec_log), __VA_ARGS__)

static int
fill_sandbox(struct fake_node *fn, Moat__V1__Sandbox *sb, const char *id,
    const char *tenant)
{
	sb->id = strdup(id);
	sb->node_id = strdup(fn->id);
	sb->tenant = strdup(tenant ? tenant : "");
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	sb->memory_mib = 256;
	sb->vcpus = 1;
	for (int i = 0; i < fn->n_sandboxes; i++)
		if (strcmp(fn->sandboxes[i], id) == 0 &&
		    fn->sb_images[i][0] != '\0')
			sb->image = strdup(fn->sb_images[i]);
	return sb->id && sb->node_id && sb->tenant ? MOAT_OK :
	                                             MOAT_RESOURCE_EXHAUSTED;
}

/* snap_find: the index of snapshot `id` held, or -1. Lock held. */
static int
snap_find(struct fake_node *fn, const char *id)
{
	for (int i = 0; i < fn->n_snaps; i++)
		if (strcmp(fn->snaps[i].id, id) == 0)
			return i;
	return -1;
}

/* snap_fill: `s` as vmd would say it (a RAM copy in the RAM dir). */
static void
snap_fill(const struct fake_snapshot *s, Moat__V1__LocalSnapshot *r)
{
	r->snapshot_id = strdup(s->id);
	r->sandbox_id = strdup(s->sandbox);
	r->tenant = strdup(s->tenant);
	r->session_id = strdup(s->session);
	r->step = s->step;
	r->created_unix_ms = s->created_ms;
	r->template_ = s->is_template;
	r->location = strdup("ram");
	r->ram_bytes = FAKE_SNAP_RAM + 4096;
	r->ram_resident_bytes = FAKE_SNAP_RAM;
	r->disk_bytes = FAKE_SNAP_DISK;
	r->last_used_unix_ms = s->created_ms;
}

/* is_snapd_id: "snap-" and 32 hex digits, as moat-snapd names them. */
static bool
is_snapd_id(const char *id)
{
	if (strncmp(id, "snap-", 5) != 0 || strlen(id) != 37)
		return false;
	for (const char *p = id + 5; *p != '\0'; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

/* snap_handler: the snapshot calls that need no sandbox: listing the
 * tenant's, deleting one (remembered), restoring one (NOT_FOUND when
 * the node does not hold it). *handled false for other methods. */
static int
snap_handler(struct fake_node *fn, struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply, bool *handled)
{
	const char *m = call->method;
	int i;

	*handled = true;
	if (strcmp(m, "ListLocalSnapshots") == 0) {
		const Moat__V1__ListLocalSnapshotsRequest *q =
		    (const void *)request;
		Moat__V1__LocalSnapshotList *r = (void *)reply;

		r->snapshots =
		    calloc((size_t)fn->n_snaps + 1, sizeof(*r->snapshots));
		for (i = 0; i < fn->n_snaps; i++) {
			Moat__V1__LocalSnapshot *ls;

			if (!fn->snaps[i].is_template &&
			    strcmp(fn->snaps[i].tenant, q->tenant) != 0)
				continue;
			ls = malloc(sizeof(*ls));
			moat__v1__local_snapshot__init(ls);
			snap_fill(&fn->snaps[i], ls);
			r->snapshots[r->n_snapshots++] = ls;
		}
		return MOAT_OK;
	}
	if (strcmp(m, "DeleteLocalSnapshot") == 0) {
		const Moat__V1__LocalSnapshotRef *q = (const void *)request;

		if ((i = snap_find(fn, q->snapshot_id)) < 0 ||
		    strcmp(fn->snaps[i].tenant, q->tenant) != 0)
			return moat_rpc_error(call, MOAT_NOT_FOUND,
			    "fake node "
			    "%s: no snapshot %s",
			    fn->id, q->snapshot_id);
		if (fn->n_deleted < FAKE_MAX_SNAPSHOTS)
			snprintf(fn->deleted[fn->n_deleted++], 128, "%s",
			    q->snapshot_id);
		memmove(&fn->snaps[i], &fn->snaps[i + 1],
		    (size_t)(fn->n_snaps - i - 1) * sizeof(fn->snaps[0]));
		fn->n_snaps--;
		return MOAT_OK;
	}
	if (strcmp(m, "RestoreSandbox") == 0) {
		const Moat__V1__RestoreSandboxRequest *q =
		    (const void *)request;

		snprintf(fn->last_restore_snap, sizeof(fn->last_restore_snap),
		    "%s", q->snapshot_id);
		snprintf(fn->last_restore_replace,
		    sizeof(fn->last_restore_replace), "%s",
		    q->replace_sandbox_id);
		fn->last_restore_reseed = q->reseed;
		if (snap_find(fn, q->snapshot_id) < 0 &&
		    !is_snapd_id(q->snapshot_id))
			return moat_rpc_error(call, MOAT_NOT_FOUND,
			    "fake node "
			    "%s: no snapshot %s",
			    fn->id, q->snapshot_id);
	}
	*handled = false;
	return MOAT_OK;
}

/* snap_take: SnapshotSandbox of sandbox `idx`: an id that names this
 * node, as vmd's do, kept with the session and step asked for. */
static int
snap_take(struct fake_node *fn, const ProtobufCMessage *request, int idx,
    Moat__V1__LocalSnapshot *r)
{
	const Moat__V1__SnapshotSandboxRequest *q = (const void *)request;
	struct fake_snapshot s;

	if (fn->n_snaps >= FAKE_MAX_SNAPSHOTS)
		return MOAT_RESOURCE_EXHAUSTED;
	memset(&s, 0, sizeof(s));
	snprintf(s.id, sizeof(s.id), "snap-%s-%016x", fn->id,
	    (unsigned)++fn->snapshots);
	snprintf(s.sandbox, sizeof(s.sandbox), "%s", fn->sandboxes[idx]);
	snprintf(s.tenant, sizeof(s.tenant), "%s", fn->tenants[idx]);
	snprintf(s.session, sizeof(s.session), "%s", q->session_id);
	s.step = q->step;
	s.created_ms = moat_now_unix_ms();
	fn->snaps[fn->n_snaps++] = s;
	snap_fill(&s, r);
	return MOAT_OK;
}

/* list_all: every sandbox, each with its own tenant ("default" for
 * added ones). Lock held. */
static int
list_all(struct fake_node *fn, Moat__V1__SandboxList *r)
{
	r->sandboxes =
	    calloc((size_t)fn->n_sandboxes + 1, sizeof(*r->sandboxes));
	if (r->sandboxes == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (int i = 0; i < fn->n_sandboxes; i++) {
		Moat__V1__Sandbox *sb = malloc(sizeof(*sb));

		if (sb == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		moat__v1__sandbox__init(sb);
		r->sandboxes[r->n_sandboxes++] = sb;
		if (fill_sandbox(fn, sb, fn->sandboxes[i],
		        fn->tenants[i][0] ? fn->tenants[i] : "default") !=
		    MOAT_OK)
			return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}

static const char *
sandbox_id_of(const ProtobufCMessage *request)
{
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(
	        request->descriptor, "sandbox_id");

	if (f == NULL)
		return NULL;
	return *(char *const *)((const char *)request + f->offset);
}

/* tenant_of: the request's own tenant field, or "" when it has none. */
static const char *
tenant_of(const ProtobufCMessage *request)
{
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(
	        request->descriptor, "tenant");

	if (f == NULL)
		return "";
	return *(char *const *)((const char *)request + f->offset);
}

/* hold_exec: an Exec of argv {"hold", N}: deferred until
 * fake_node_release_held. Returns true when it was one. */
static bool
hold_exec(struct fake_node *fn, struct moat_rpc_call *call,
    const ProtobufCMessage *request)
{
	const Moat__V1__ExecRequest *q = (const void *)request;
	struct moat_rpc_deferred *d;

	if (strcmp(call->method, "Exec") != 0 || q->n_argv != 2 ||
	    strcmp(q->argv[0], "hold") != 0)
		return false;
	pthread_mutex_lock(&fn->lock);
	if (fn->n_held < FAKE_MAX_HELD && (d = moat_rpc_defer(call)) != NULL) {
		fn->held_code[fn->n_held] = atoi(q->argv[1]);
		fn->held[fn->n_held++] = d;
	}
	pthread_mutex_unlock(&fn->lock);
	return true;
}

/* hold_snapshot: a SnapshotSandbox of a sandbox held while
 * hold_snapshots is set: deferred until fake_node_release_held. Returns
 * true when it was one. */
static bool
hold_snapshot(struct fake_node *fn, struct moat_rpc_call *call,
    const char *sid)
{
	struct moat_rpc_deferred *d;
	bool held = false;

	if (strcmp(call->method, "SnapshotSandbox") != 0 ||
	    !atomic_load(&fn->hold_snapshots) || sid == NULL)
		return false;
	pthread_mutex_lock(&fn->lock);
	if (find_sandbox(fn, sid) >= 0 && fn->n_held_snaps < FAKE_MAX_HELD &&
	    (d = moat_rpc_defer(call)) != NULL) {
		snprintf(fn->held_snap_sandbox[fn->n_held_snaps], 128, "%s",
		    sid);
		fn->held_snap[fn->n_held_snaps++] = d;
		held = true;
	}
	pthread_mutex_unlock(&fn->lock);
	return held;
}

/* release_snap: answers held snapshot i: taken, and in "snapd" under a
 * snapd-style id. Lock held. */
static void
release_snap(struct fake_node *fn, int i)
{
	Moat__V1__LocalSnapshot r = MOAT__V1__LOCAL_SNAPSHOT__INIT;
	struct fake_snapshot s;
	char remote[40];
	int idx = find_sandbox(fn, fn->held_snap_sandbox[i]);

	if (idx < 0 || fn->n_snaps >= FAKE_MAX_SNAPSHOTS) {
		moat_rpc_complete(fn->held_snap[i], MOAT_NOT_FOUND, NULL,
		    "fake node: the held snapshot's sandbox is gone");
		return;
	}
	memset(&s, 0, sizeof(s));
	snprintf(s.id, sizeof(s.id), "snap-%s-%016x", fn->id,
	    (unsigned)++fn->snapshots);
	snprintf(s.sandbox, sizeof(s.sandbox), "%s", fn->sandboxes[idx]);
	snprintf(s.tenant, sizeof(s.tenant), "%s",
	    fn->tenants[idx][0] ? fn->tenants[idx] : "default");
	s.created_ms = moat_now_unix_ms();
	fn->snaps[fn->n_snaps++] = s;
	snap_fill(&s, &r);
	snprintf(remote, sizeof(remote), "snap-%032x",
	    (unsigned)fn->snapshots);
	r.remote_id = remote;
	r.remote_stored = true;
	moat_rpc_complete(fn->held_snap[i], MOAT_OK, &r.base, NULL);
	r.remote_id = NULL;
	free(r.snapshot_id);
	free(r.sandbox_id);
	free(r.tenant);
	free(r.session_id);
	free(r.location);
}

int
fake_node_held(struct fake_node *fn)
{
	int n;

	pthread_mutex_lock(&fn->lock);
	n = fn->n_held + fn->n_held_snaps;
	pthread_mutex_unlock(&fn->lock);
	return n;
}

void
fake_node_release_held(struct fake_node *fn)
{
	pthread_mutex_lock(&fn->lock);
	while (fn->n_held > 0) {
		Moat__V1__ExecResult r = MOAT__V1__EXEC_RESULT__INIT;
		Moat__V1__ExecStatus st = MOAT__V1__EXEC_STATUS__INIT;
		int i = --fn->n_held;

		st.exited = true;
		st.exit_code = fn->held_code[i];
		r.status = &st;
		moat_rpc_complete(fn->held[i], MOAT_OK, &r.base, NULL);
	}
	while (fn->n_held_snaps > 0)
		release_snap(fn, --fn->n_held_snaps);
	pthread_mutex_unlock(&fn->lock);
}

/* put_archive: PutArchive as the guest takes it, checked as a client
 * of the contract must send it: the upload's id after the first chunk,
 * each chunk at the offset received so far, at most 4 MiB. Lock held. */
static int
put_archive(struct fake_node *fn, struct moat_rpc_call *call,
    const Moat__V1__ArchivePutRequest *q, Moat__V1__ArchivePutReply *r)
{
	char id[32];
	uint8_t *nb;

	exec_log_to(fn->archive_log, sizeof(fn->archive_log),
	    "put(%s@%llu+%zu%s) ", q->upload_id, (unsigned long long)q->offset,
	    q->data.len, q->last ? ",last" : "");
	if (q->upload_id[0] == '\0') {
		free(fn->put_data);
		fn->put_data = NULL;
		fn->put_len = 0;
		fn->put_done = false;
		fn->archive_ids++;
	}
	snprintf(id, sizeof(id), "up-%d", fn->archive_ids);
	if (q->upload_id[0] != '\0' && strcmp(q->upload_id, id) != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "fake node: no upload %s", q->upload_id);
	if (q->offset != fn->put_len || q->data.len > (4u << 20))
		return moat_rpc_error(call, MOAT_OUT_OF_RANGE,
		    "fake node: chunk of %zu bytes at %llu, %zu received",
		    q->data.len, (unsigned long long)q->offset, fn->put_len);
	if (q->last && strcmp(q->path, "/refuse") == 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "archive member ../etc/passwd is outside %s: nothing was "
		    "written",
		    q->path);
	if ((nb = realloc(fn->put_data, fn->put_len + q->data.len + 1)) ==
	    NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	memcpy(nb + fn->put_len, q->data.data, q->data.len);
	fn->put_data = nb;
	fn->put_len += q->data.len;
	fn->put_done = q->last;
	r->upload_id = strdup(id);
	r->received = fn->put_len;
	r->done = q->last;
	if (q->last) {
		r->files = 1;
		r->dirs = 2;
		r->symlinks = 3;
		r->bytes = fn->put_len;
	}
	return MOAT_OK;
}

/* get_archive: GetArchive of the node's pattern archive. Lock held. */
static int
get_archive(struct fake_node *fn, struct moat_rpc_call *call,
    const Moat__V1__ArchiveGetRequest *q, Moat__V1__ArchiveGetReply *r)
{
	uint64_t len = q->length ? q->length : (4u << 20), left;
	char id[32];

	exec_log_to(fn->archive_log, sizeof(fn->archive_log),
	    "get(%s@%llu+%u) ", q->download_id, (unsigned long long)q->offset,
	    q->length);
	if (strcmp(q->path, "/missing") == 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "fake node: no such file or directory: %s", q->path);
	if (q->download_id[0] == '\0')
		fn->archive_ids++;
	snprintf(id, sizeof(id), "dl-%d", fn->archive_ids);
	if ((q->download_id[0] != '\0' && strcmp(q->download_id, id) != 0) ||
	    len > (4u << 20) || q->offset > fn->archive_get_size)
		return moat_rpc_error(call, MOAT_OUT_OF_RANGE,
		    "fake node: download %s at %llu+%llu", q->download_id,
		    (unsigned long long)q->offset, (unsigned long long)len);
	left = fn->archive_get_size - q->offset;
	if (len > left)
		len = left;
	r->download_id = strdup(id);
	r->size = fn->archive_get_size;
	r->eof = q->offset + len == fn->archive_get_size;
	r->data.data = malloc(len ? len : 1);
	if (r->data.data == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (uint64_t i = 0; i < len; i++)
		r->data.data[i] = (uint8_t)(((q->offset + i) * 7) % 251);
	r->data.len = len;
	return MOAT_OK;
}

/* image_index: where image `name` is held, or -1. Lock held. */
static int
image_index(struct fake_node *fn, const char *name)
{
	for (int i = 0; i < fn->n_images; i++)
		if (strcmp(fn->images[i], name) == 0)
			return i;
	return -1;
}

static void
image_fill(struct fake_node *fn, Moat__V1__ImageInfo *e, const char *name)
{
	e->name = strdup(name);
	e->id = moat_asprintf("id-of-%s", name);
	e->size_bytes = 1000;
	e->packages = calloc(2, sizeof(char *));
	e->packages[e->n_packages++] = moat_asprintf("pkg-%s=1", fn->id);
	e->packages[e->n_packages++] = strdup("libc6=2.36");
	e->source = strdup("fake");
}

static Moat__V1__ImageInfo *
image_info(struct fake_node *fn, const char *name)
{
	Moat__V1__ImageInfo *e = malloc(sizeof(*e));

	moat__v1__image_info__init(e);
	image_fill(fn, e, name);
	return e;
}

/* image_call: the image calls of vm.proto (issue 17), as vmd answers
 * them. Lock held. False when `m` is no image call. */
static bool
image_call(struct fake_node *fn, struct moat_rpc_call *call, const char *m,
    const ProtobufCMessage *request, ProtobufCMessage *reply, int *rv)
{
	const Moat__V1__ImageRef *ref = (const void *)request;

	if (strcmp(m, "StartImageBuild") == 0) {
		const Moat__V1__ImageBuildRequest *q = (const void *)request;
		Moat__V1__ImageBuild *b = (Moat__V1__ImageBuild *)reply;

		fn->builds++;
		snprintf(fn->last_build, sizeof(fn->last_build), "%s",
		    q->name);
		b->id = moat_asprintf("build-%d", fn->builds);
		b->name = strdup(q->name);
		b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_RUNNING;
	} else if (strcmp(m, "GetImageBuild") == 0) {
		const Moat__V1__ImageBuildRef *q = (const void *)request;
		Moat__V1__ImageBuild *b = (Moat__V1__ImageBuild *)reply;

		fn->build_polls++;
		fn->last_wait_ms = q->wait_ms;
		b->id = strdup(q->build_id);
		b->node_id = strdup(fn->id);
		b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_DONE;
		b->next_step = q->from_step;
		b->image = image_info(fn, fn->last_build);
	} else if (strcmp(m, "ListImages") == 0) {
		const Moat__V1__ListImagesRequest *q = (const void *)request;
		Moat__V1__ImageList *r = (Moat__V1__ImageList *)reply;

		r->images = calloc(FAKE_MAX_IMAGES, sizeof(*r->images));
		for (int i = 0; i < fn->n_images; i++)
			if (q->name[0] == '\0' ||
			    strcmp(q->name, fn->images[i]) == 0)
				r->images[r->n_images++] =
				    image_info(fn, fn->images[i]);
	} else if (strcmp(m, "PushImage") == 0) {
		fn->image_pushes++;
		if (image_index(fn, ref->name) < 0)
			*rv = moat_rpc_error(call, MOAT_NOT_FOUND,
			    "fake node %s: no image %s", fn->id, ref->name);
		else
			image_fill(fn, (Moat__V1__ImageInfo *)reply,
			    ref->name);
	} else if (strcmp(m, "RemoveImage") == 0) {
		Moat__V1__RemoveImageReply *r = (void *)reply;
		int i = image_index(fn, ref->name);

		if (strcmp(ref->name, fn->refuse_remove) == 0) {
			*rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
			    "fake node %s: local snapshot snap-1 uses image "
			    "%s",
			    fn->id, ref->name);
		} else if (i < 0) {
			*rv = moat_rpc_error(call, MOAT_NOT_FOUND,
			    "fake node %s: no image %s", fn->id, ref->name);
		} else {
			fn->image_removes++;
			memmove(fn->images[i], fn->images[i + 1],
			    (size_t)(fn->n_images - i - 1) *
			        sizeof(fn->images[0]));
			fn->n_images--;
			r->freed_bytes = 1000;
		}
	} else if (strcmp(m, "PullImage") != 0) {
		return false;
	}
	return true;
}

static int
fake_handler(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_node *fn = call->service_ctx;
	const char *m = call->method, *sid = sandbox_id_of(request);
	const char *req_tenant = tenant_of(request);
	bool handled;
	int rv = MOAT_OK, idx;

	if (strcmp(m, "Exec") == 0) {
		pthread_mutex_lock(&fn->lock);
		fn->execs++;
		pthread_mutex_unlock(&fn->lock);
	}
	if (hold_exec(fn, call, request) || hold_snapshot(fn, call, sid))
		return MOAT_OK;
	if (strcmp(m, "GetSandbox") == 0 && atomic_load(&fn->get_delay_ms) > 0)
		usleep((useconds_t)atomic_load(&fn->get_delay_ms) * 1000u);
	pthread_mutex_lock(&fn->lock);
	if (strcmp(m, "ListAllSandboxes") == 0) {
		/* The gateway's inventory asks this all the time: not a
		 * call the tests count or look at. */
		rv = list_all(fn, (Moat__V1__SandboxList *)reply);
		pthread_mutex_unlock(&fn->lock);
		return rv;
	}
	if (strcmp(m, "EgressEvents") == 0) {
		/* Likewise each inventory round (issue 14): no events. */
		pthread_mutex_unlock(&fn->lock);
		return MOAT_OK;
	}
	fn->calls++;
	fn->last_request_id = call->request_id;
	snprintf(fn->last_method, sizeof(fn->last_method), "%s", m);
	snprintf(fn->last_sandbox, sizeof(fn->last_sandbox), "%s",
	    sid ? sid : "");
	snprintf(fn->last_call_tenant, sizeof(fn->last_call_tenant), "%s",
	    call->tenant);
	/* As vmd: every call but Health and NodeInfo names its tenant in
	 * the envelope, and another tenant's sandbox does not exist. */
	idx = sid != NULL ? find_sandbox(fn, sid) : -1;
	handled = strcmp(m, "Health") != 0 && strcmp(m, "NodeInfo") != 0;
	if (handled && call->tenant[0] == '\0') {
		fn->untenanted++;
		rv = moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "fake node %s: tenant is required: %s", fn->id, m);
	} else if (handled && req_tenant[0] != '\0' &&
	    strcmp(req_tenant, call->tenant) != 0) {
		fn->untenanted++;
		rv = moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "fake node %s: %s for tenant %s names tenant %s", fn->id,
		    m, call->tenant, req_tenant);
	} else if (handled && idx >= 0 && fn->tenants[idx][0] != '\0' &&
	    strcmp(fn->tenants[idx], call->tenant) != 0) {
		rv = moat_rpc_error(call, MOAT_NOT_FOUND,
		    "fake node %s: no sandbox %s", fn->id, sid);
	} else {
		rv = snap_handler(fn, call, request, reply, &handled);
	}
	if (rv != MOAT_OK || handled) {
		/* answered */
	} else if (image_call(fn, call, m, request, reply, &rv)) {
		/* answered (issue 17) */
	} else if (strcmp(m, "Health") == 0) {
		Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;
		r->service = strdup("fake-vmd");
		r->version = strdup("9.9.9");
		r->node_id = strdup(fn->id);
	} else if (strcmp(m, "CreateSandbox") == 0) {
		const Moat__V1__CreateSandboxRequest *q =
		    (const void *)request;
		char id[128];

		snprintf(fn->last_tenant, sizeof(fn->last_tenant), "%s",
		    q->tenant);
		snprintf(id, sizeof(id), "%s-sb-%d", fn->id,
		    fn->next_sandbox++);
		if (fn->n_sandboxes < FAKE_MAX_SANDBOXES) {
			snprintf(fn->sb_images[fn->n_sandboxes], 64, "%s",
			    q->image);
			snprintf(fn->tenants[fn->n_sandboxes], 64, "%s",
			    q->tenant);
			snprintf(fn->sandboxes[fn->n_sandboxes++], 128, "%s",
			    id);
		}
		rv = fill_sandbox(fn, (Moat__V1__Sandbox *)reply, id,
		    q->tenant);
	} else if (strcmp(m, "ListSandboxes") == 0) {
		const Moat__V1__ListSandboxesRequest *q =
		    (const void *)request;
		Moat__V1__SandboxList *r = (Moat__V1__SandboxList *)reply;

		snprintf(fn->last_tenant, sizeof(fn->last_tenant), "%s",
		    q->tenant);
		r->sandboxes =
		    calloc((size_t)fn->n_sandboxes + 1, sizeof(*r->sandboxes));
		for (int i = 0; i < fn->n_sandboxes; i++) {
			Moat__V1__Sandbox *sb;

			/* As vmd: a tenant lists only its own. */
			if (fn->tenants[i][0] != '\0' &&
			    strcmp(fn->tenants[i], q->tenant) != 0)
				continue;
			sb = malloc(sizeof(*sb));
			moat__v1__sandbox__init(sb);
			fill_sandbox(fn, sb, fn->sandboxes[i], q->tenant);
			r->sandboxes[r->n_sandboxes++] = sb;
		}
	} else if (strcmp(m, "RestoreSandbox") == 0) {
		/* A new sandbox of the snapshot's tenant; every
		 * fail_restore_every-th restore fails as a node's would. */
		const Moat__V1__RestoreSandboxRequest *q =
		    (const void *)request;
		char id[128];

		fn->restores++;
		if (strcmp(fn->corrupt_snap, q->snapshot_id) == 0) {
			rv = moat_rpc_error(call, MOAT_DATA_LOSS,
			    "snapshot %s is corrupt in moat-snapd (its "
			    "memory): chunk 7 does not match its id; it was "
			    "not restored",
			    q->snapshot_id);
		} else if (fn->fail_restore_every > 0 &&
		    fn->restores % fn->fail_restore_every == 0) {
			rv = moat_rpc_error(call, MOAT_UNAVAILABLE,
			    "fake node "
			    "%s: restore %d of %s failed on purpose",
			    fn->id, fn->restores, q->snapshot_id);
		} else {
			snprintf(id, sizeof(id), "%s-sb-%d", fn->id,
			    fn->next_sandbox++);
			if (fn->n_sandboxes < FAKE_MAX_SANDBOXES) {
				snprintf(fn->tenants[fn->n_sandboxes], 64,
				    "%s", q->tenant);
				snprintf(fn->sandboxes[fn->n_sandboxes++], 128,
				    "%s", id);
			}
			rv = fill_sandbox(fn, (Moat__V1__Sandbox *)reply, id,
			    q->tenant);
			if (is_snapd_id(q->snapshot_id))
				((Moat__V1__Sandbox *)reply)->pulled_bytes =
				    FAKE_PULLED_BYTES;
		}
	} else if (strcmp(m, "NodeInfo") == 0) {
		Moat__V1__Node *r = (Moat__V1__Node *)reply;
		r->node_id = strdup(fn->id);
	} else if (strcmp(m, "Cordon") == 0) {
		/* Taken, as vmd would (DrainNode's first step). */
		const Moat__V1__CordonRequest *q = (const void *)request;
		Moat__V1__Node *r = (Moat__V1__Node *)reply;

		fn->cordons++;
		r->node_id = strdup(fn->id);
		r->cordoned = q->cordoned;
		r->cordon_reason = strdup(q->reason);
	} else if (sid == NULL || (idx = find_sandbox(fn, sid)) < 0) {
		rv = moat_rpc_error(call, MOAT_NOT_FOUND,
		    "fake node %s: no "
		    "sandbox %s",
		    fn->id, sid ? sid : "(none)");
	} else if (strcmp(m, "GetSandbox") == 0 ||
	    strcmp(m, "SetTimeout") == 0) {
		rv = fill_sandbox(fn, (Moat__V1__Sandbox *)reply, sid,
		    fn->tenants[idx][0] != '\0' ? fn->tenants[idx] :
		                                  "default");
		if (strcmp(m, "SetTimeout") == 0) {
			const Moat__V1__SetTimeoutRequest *q =
			    (const void *)request;

			fn->set_timeouts++;
			fn->last_timeout_s = q->timeout_s;
			((Moat__V1__Sandbox *)reply)->expires_unix_ms =
			    q->timeout_s ? 1000ull * q->timeout_s : 0;
			((Moat__V1__Sandbox *)reply)->idle_timeout_s =
			    q->idle_timeout_s;
		}
	} else if (strcmp(m, "DestroySandbox") == 0) {
		memmove(fn->sandboxes[idx], fn->sandboxes[idx + 1],
		    (size_t)(fn->n_sandboxes - idx - 1) * 128);
		memmove(fn->tenants[idx], fn->tenants[idx + 1],
		    (size_t)(fn->n_sandboxes - idx - 1) * 64);
		fn->n_sandboxes--;
	} else if (strcmp(m, "ExecStart") == 0) {
		const Moat__V1__ExecRequest *q = (const void *)request;
		Moat__V1__ExecHandle *r = (Moat__V1__ExecHandle *)reply;
		r->sandbox_id = strdup(sid);
		/* argv[0] "sleep": exec 8, which never exits (ExecRead). */
		r->exec_id =
		    q->n_argv > 0 && strcmp(q->argv[0], "sleep") == 0 ? 8 : 7;
		r->pid = 42;
		exec_log(fn, "start(%s) ", q->pty ? "pty" : "pipes");
	} else if (strcmp(m, "ExecWrite") == 0) {
		const Moat__V1__ExecWriteRequest *q = (const void *)request;
		if (q->data.len > 32) /* too long to log: its size */
			exec_log(fn, "write(%zu bytes) ", q->data.len);
		else if (q->data.len > 0)
			exec_log(fn, "write(%.*s) ", (int)q->data.len,
			    (const char *)q->data.data);
		if (q->close)
			exec_log(fn, "close ");
	} else if (strcmp(m, "ExecResize") == 0) {
		const Moat__V1__ExecResizeRequest *q = (const void *)request;
		exec_log(fn, "resize(%ux%u) ", q->rows, q->cols);
	} else if (strcmp(m, "ExecRead") == 0) {
		/* Exec 7 prints "hello\n" and "oops\n" and exits 3; exec 8
		 * prints nothing and runs until killed. */
		const Moat__V1__ExecReadRequest *q = (const void *)request;
		Moat__V1__ExecReadReply *r = (Moat__V1__ExecReadReply *)reply;

		r->stdout_next = q->stdout_offset;
		r->stderr_next = q->stderr_offset;
		if (q->exec_id == 7 && q->stdout_offset == 0) {
			r->stdout.data = (uint8_t *)strdup("hello\n");
			r->stdout.len = 6;
			r->stdout_next = 6;
			r->stderr.data = (uint8_t *)strdup("oops\n");
			r->stderr.len = 5;
			r->stderr_next = 5;
		} else if (q->exec_id != 7) {
			usleep(20000); /* a long poll that times out */
		} else {
			r->status = malloc(sizeof(*r->status));
			moat__v1__exec_status__init(r->status);
			r->status->exited = true;
			r->status->exit_code = 3;
			r->status->exec_id = 7;
			r->status->stdout_bytes = 6;
			r->status->stderr_bytes = 5;
			r->eof = true;
		}
	} else if (strcmp(m, "ExecWait") == 0) {
		Moat__V1__ExecStatus *r = (Moat__V1__ExecStatus *)reply;
		r->exited = true;
		r->exit_code = 3;
		r->exec_id = 7;
	} else if (strcmp(m, "SnapshotSandbox") == 0) {
		rv = snap_take(fn, request, idx,
		    (Moat__V1__LocalSnapshot *)reply);
	} else if (strcmp(m, "TraceFs") == 0) {
		/* One file, the same every time. */
		Moat__V1__FsTrace *r = (Moat__V1__FsTrace *)reply;
		Moat__V1__FsTraceEntry *e = malloc(sizeof(*e));

		fn->traces++;
		r->entries = malloc(sizeof(*r->entries));
		if (e == NULL || r->entries == NULL) {
			free(e);
			rv = MOAT_RESOURCE_EXHAUSTED;
		} else {
			moat__v1__fs_trace_entry__init(e);
			e->path = strdup("/root/fake.txt");
			e->type = MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR;
			e->size = 3;
			r->entries[r->n_entries++] = e;
		}
	} else if (strcmp(m, "PutArchive") == 0) {
		rv = put_archive(fn, call, (const void *)request,
		    (Moat__V1__ArchivePutReply *)reply);
	} else if (strcmp(m, "GetArchive") == 0) {
		rv = get_archive(fn, call, (const void *)request,
		    (Moat__V1__ArchiveGetReply *)reply);
	} else if (strcmp(m, "StatFile") == 0) {
		/* An error of the node's own: the gateway must pass it on
		 * unchanged. */
		rv = moat_rpc_error(call, MOAT_PERMISSION_DENIED,
		    "fake node "
		    "%s says: no peeking at %s",
		    fn->id, sid);
	}
	pthread_mutex_unlock(&fn->lock);
	return rv;
}

#define ROW(name, mut)                                                        \
	{                                                                     \
		name, fake_handler, mut, false                                \
	}
static const struct moat_rpc_method fake_methods[] = {
	ROW("Health", false),
	ROW("NodeInfo", false),
	ROW("CreateSandbox", true),
	ROW("GetSandbox", false),
	ROW("ListSandboxes", false),
	ROW("ListAllSandboxes", false),
	ROW("DestroySandbox", true),
	ROW("ExecStart", true),
	ROW("ExecRead", false),
	ROW("ExecWrite", true),
	ROW("ExecWait", false),
	ROW("ExecKill", true),
	ROW("Exec", true),
	ROW("ReadFile", false),
	ROW("WriteFile", true),
	ROW("ListFiles", false),
	ROW("StatFile", false),
	ROW("RemoveFile", true),
	ROW("MakeDir", true),
	ROW("PutArchive", true),
	ROW("GetArchive", false),
	ROW("SandboxInfo", false),
	ROW("TraceFs", false),
	ROW("SnapshotSandbox", true),
	ROW("RestoreSandbox", true),
	ROW("ListLocalSnapshots", false),
	ROW("DeleteLocalSnapshot", true),
	ROW("ResumeSandbox", true),
	ROW("RunCode", true),
	ROW("CloseCodeContext", true),
	ROW("EgressEvents", false),
	ROW("Cordon", true),
	ROW("SetTimeout", true),
	ROW("ExecResize", true),
	ROW("StartImageBuild", true),
	ROW("GetImageBuild", false),
	ROW("ListImages", false),
	ROW("PushImage", true),
	ROW("PullImage", true),
	ROW("RemoveImage", true),
};

static void *
respond_main(void *arg)
{
	struct fake_node *fn = arg;

	while (!atomic_load(&fn->stop)) {
		Moat__V1__Node node = MOAT__V1__NODE__INIT;
		char *images[FAKE_MAX_IMAGES];
		nng_msg *m;
		size_t len;
		int rv;

		if ((rv = nng_recvmsg(fn->resp, &m, 0)) != 0) {
			if (rv == NNG_ECLOSED)
				break;
			continue; /* timeout: look at stop again */
		}
		nng_msg_clear(m);
		if (atomic_load(&fn->silent)) {
			nng_msg_free(m);
			continue;
		}
		if (atomic_load(&fn->garbage)) {
			nng_msg_append(m, "\xff\xff\xff\xff\x0f", 5);
		} else {
			pthread_mutex_lock(&fn->lock);
			node.node_id = fn->id;
			node.protocol_version = 2;
			node.rpc_url = fn->rpc_url;
			node.vcpus_total = 8;
			node.memory_mib_total = fn->memory_total_mib;
			node.memory_mib_used = (uint64_t)fn->n_sandboxes * 256;
			node.sandboxes = (uint32_t)fn->n_sandboxes;
			node.sandboxes_running = (uint32_t)fn->n_sandboxes;
			node.accel = "tcg";
			node.driver = "qemu";
			node.snapshot_ram_budget_bytes = 1ull << 30;
			node.snapshot_ram_used_bytes =
			    (uint64_t)fn->n_snaps * FAKE_SNAP_RAM;
			node.snapshots_in_ram = (uint32_t)fn->n_snaps;
			node.snapshot_evictions = 3;
			node.version = "9.9.9";
			for (int i = 0; i < fn->n_images; i++)
				images[i] = fn->images[i];
			node.images = images;
			node.n_images = (size_t)fn->n_images;
			len = moat__v1__node__get_packed_size(&node);
			nng_msg_realloc(m, len);
			moat__v1__node__pack(&node, nng_msg_body(m));
			pthread_mutex_unlock(&fn->lock);
		}
		if (nng_sendmsg(fn->resp, m, 0) != 0)
			nng_msg_free(m);
		else
			atomic_fetch_add(&fn->surveys_answered, 1);
	}
	return NULL;
}

int
fake_node_start(struct fake_node *fn, const char *id, const char *dir,
    const char *survey_url)
{
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__vm__descriptor,
		.methods = fake_methods,
		.n_methods = sizeof(fake_methods) / sizeof(fake_methods[0]),
		.ctx = fn,
	};
	char *errmsg = NULL;
	int rv;

	memset(fn, 0, sizeof(*fn));
	pthread_mutex_init(&fn->lock, NULL);
	snprintf(fn->id, sizeof(fn->id), "%s", id);
	snprintf(fn->rpc_url, sizeof(fn->rpc_url), "ipc://%s/%s.sock", dir,
	    id);
	snprintf(fn->survey_url, sizeof(fn->survey_url), "%s",
	    survey_url ? survey_url : "");
	fn->memory_total_mib = 4096;
	snprintf(fn->images[fn->n_images++], sizeof(fn->images[0]), "%s",
	    "default");
	if ((rv = moat_rpc_server_start(&fn->srv, fn->rpc_url, &svc, 8,
	         &errmsg)) != MOAT_OK) {
		fprintf(stderr, "fake node %s: %s\n", id, errmsg);
		free(errmsg);
		return rv;
	}
	if (survey_url == NULL || survey_url[0] == '\0')
		return MOAT_OK;
	if (nng_respondent0_open(&fn->resp) != 0)
		return MOAT_INTERNAL;
	fn->has_resp = true;
	nng_socket_set_ms(fn->resp, NNG_OPT_RECVTIMEO, 50);
	nng_socket_set_ms(fn->resp, NNG_OPT_SENDTIMEO, 50);
	nng_socket_set_ms(fn->resp, NNG_OPT_RECONNMINT, 10);
	nng_socket_set_ms(fn->resp, NNG_OPT_RECONNMAXT, 100);
	if (nng_dial(fn->resp, survey_url, NULL, NNG_FLAG_NONBLOCK) != 0)
		return MOAT_INTERNAL;
	if (pthread_create(&fn->thread, NULL, respond_main, fn) != 0)
		return MOAT_INTERNAL;
	fn->thread_started = true;
	return MOAT_OK;
}

bool
fake_node_has_sandbox(struct fake_node *fn, const char *sandbox_id)
{
	bool found;

	pthread_mutex_lock(&fn->lock);
	found = find_sandbox(fn, sandbox_id) >= 0;
	pthread_mutex_unlock(&fn->lock);
	return found;
}

void
fake_node_add_sandbox(struct fake_node *fn, const char *sandbox_id)
{
	pthread_mutex_lock(&fn->lock);
	if (fn->n_sandboxes < FAKE_MAX_SANDBOXES) {
		fn->tenants[fn->n_sandboxes][0] = '\0';
		snprintf(fn->sandboxes[fn->n_sandboxes++], 128, "%s",
		    sandbox_id);
	}
	pthread_mutex_unlock(&fn->lock);
}

void
fake_node_add_snapshot(struct fake_node *fn, const char *id,
    const char *sandbox_id, const char *tenant, uint64_t age_ms,
    bool is_template)
{
	struct fake_snapshot *s;

	pthread_mutex_lock(&fn->lock);
	if (fn->n_snaps < FAKE_MAX_SNAPSHOTS) {
		s = &fn->snaps[fn->n_snaps++];
		memset(s, 0, sizeof(*s));
		snprintf(s->id, sizeof(s->id), "%s", id);
		snprintf(s->sandbox, sizeof(s->sandbox), "%s", sandbox_id);
		snprintf(s->tenant, sizeof(s->tenant), "%s", tenant);
		s->created_ms = moat_now_unix_ms() - age_ms;
		s->is_template = is_template;
	}
	pthread_mutex_unlock(&fn->lock);
}

void
fake_node_age_snapshots(struct fake_node *fn, uint64_t ms)
{
	pthread_mutex_lock(&fn->lock);
	for (int i = 0; i < fn->n_snaps; i++)
		fn->snaps[i].created_ms -= ms;
	pthread_mutex_unlock(&fn->lock);
}

bool
fake_node_snapshot(struct fake_node *fn, const char *id,
    struct fake_snapshot *out)
{
	int i;

	pthread_mutex_lock(&fn->lock);
	if ((i = snap_find(fn, id)) >= 0 && out != NULL)
		*out = fn->snaps[i];
	pthread_mutex_unlock(&fn->lock);
	return i >= 0;
}

bool
fake_node_was_deleted(struct fake_node *fn, const char *id)
{
	bool found = false;

	pthread_mutex_lock(&fn->lock);
	for (int i = 0; i < fn->n_deleted && !found; i++)
		found = strcmp(fn->deleted[i], id) == 0;
	pthread_mutex_unlock(&fn->lock);
	return found;
}

void
fake_node_kill_rpc(struct fake_node *fn)
{
	moat_rpc_server_stop(fn->srv);
	fn->srv = NULL;
}

void
fake_node_halt(struct fake_node *fn)
{
	atomic_store(&fn->stop, true);
	if (fn->thread_started)
		pthread_join(fn->thread, NULL);
	fn->thread_started = false;
}

void
fake_node_stop(struct fake_node *fn)
{
	fake_node_halt(fn);
	if (fn->has_resp && !moat_nng_close_bounded(fn->resp, 2000))
		fprintf(stderr,
		    "fake node %s: nng_close hung (nng 1.5 "
		    "bug); socket abandoned\n",
		    fn->id);
	fn->has_resp = false;
	fn->thread_started = false;
	fake_node_release_held(fn);
	fake_node_kill_rpc(fn);
	fake_node_release_held(fn);
	free(fn->put_data);
	fn->put_data = NULL;
	pthread_mutex_destroy(&fn->lock);
}

void
fake_node_add_image(struct fake_node *fn, const char *name)
{
	pthread_mutex_lock(&fn->lock);
	if (fn->n_images < FAKE_MAX_IMAGES && image_index(fn, name) < 0)
		snprintf(fn->images[fn->n_images++], sizeof(fn->images[0]),
		    "%s", name);
	pthread_mutex_unlock(&fn->lock);
}

bool
fake_node_has_image(struct fake_node *fn, const char *name)
{
	bool has;

	pthread_mutex_lock(&fn->lock);
	has = image_index(fn, name) >= 0;
	pthread_mutex_unlock(&fn->lock);
	return has;
}
