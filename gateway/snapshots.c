/*
 * snapshots.c: what becomes of snapshots once steps no longer need them
 * (issue 11): the snapshots a deleted session leaves unreferenced are
 * deleted with it, and GcSnapshots removes the tenant's snapshots that
 * nothing names (no step, no step 0, no live sandbox) on every node and
 * in moat-snapd. A snapshot id says where it lives: "snap-<node>-<16
 * hex>" is a node's local snapshot (deleting it there also deletes its
 * copy in moat-snapd), any other id is moat-snapd's own. Whether anything
 * still names a snapshot is moat-sessiond's to say (SnapshotRefs).
 * Not for: which step snapshots a session keeps (retention.c), taking
 * snapshots (record.c, travel.c), the node's side (services/vm/).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapshot.pb-c.h"

#define SNAPD_SERVICE "moat.v1.Snapshot"
#define REFS_BATCH 4096    /* SnapshotRefs takes at most this many */
#define NODE_LIST_MS 10000 /* per node, for its lists */
#define GC_MIN_AGE_S 60    /* GcSnapshotsRequest.min_age_s 0 */
#define SNAPD_PAGE 1000

bool
moat_snapshot_node(const char *snap_id, struct moat_node_id *node)
{
	const char *last;
	size_t n;

	if (snap_id == NULL || strncmp(snap_id, "snap-", 5) != 0 ||
	    (last = strrchr(snap_id, '-')) == NULL || last < snap_id + 6 ||
	    strlen(last + 1) != 16)
		return false;
	n = (size_t)(last - (snap_id + 5));
	if (n == 0 || n >= sizeof(node->s))
		return false;
	memcpy(node->s, snap_id + 5, n);
	node->s[n] = '\0';
	return true;
}

uint64_t
moat_snapshot_local_bytes(const Moat__V1__LocalSnapshot *s)
{
	/* A vmd from before issue 11 says no location: its RAM copy is all
	 * in the RAM dir. */
	uint64_t ram = s->location != NULL && s->location[0] != '\0' ?
	    s->ram_resident_bytes :
	    s->ram_bytes;

	return ram + s->disk_bytes;
}

/* deadline_cap: deadline_ms, but at most `ms` from now. */
static uint64_t
deadline_cap(uint64_t deadline_ms, uint64_t ms)
{
	uint64_t cap = moat_rpc_now_ms() + ms;

	return deadline_ms < cap ? deadline_ms : cap;
}

int
moat_snapshots_node_list(struct moat_forward *fw,
    const struct moat_node_id *node, const char *tenant, uint64_t deadline_ms,
    Moat__V1__LocalSnapshotList **out, char **errmsg)
{
	Moat__V1__ListLocalSnapshotsRequest req =
	    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;

	req.tenant = (char *)tenant;
	return moat_forward_node_call(fw, node, tenant, "ListLocalSnapshots",
	    &req.base, &moat__v1__local_snapshot_list__descriptor,
	    moat_rpc_new_request_id(), deadline_cap(deadline_ms, NODE_LIST_MS),
	    "the tenant's snapshots", (ProtobufCMessage **)out, errmsg);
}

int
moat_snapshots_snapd_call(struct moat_record *rec, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *reply_desc,
    ProtobufCMessage **out, uint64_t deadline_ms, char **errmsg)
{
	uint64_t now = moat_rpc_now_ms();
	struct moat_rpc_opts opts = {
		.request_id = moat_rpc_new_request_id(),
		.timeout_ms =
		    deadline_ms > now ? (uint32_t)(deadline_ms - now) : 1,
		.tenant = moat_gw_message_tenant(req),
	};
	char *msg = NULL;
	int rv;

	*out = NULL;
	if (rec->snapd == NULL) {
		*errmsg = moat_asprintf("the gateway has no moat-snapd to "
		                        "call (set [gateway] snapd)");
		return MOAT_UNAVAILABLE;
	}
	rv = moat_rpc_call(rec->snapd, SNAPD_SERVICE, method, req, reply_desc,
	    out, &opts, &msg);
	if (rv == MOAT_OK) {
		free(msg);
		return MOAT_OK;
	}
	if (rv == MOAT_UNAVAILABLE || rv == MOAT_DEADLINE_EXCEEDED)
		*errmsg =
		    moat_asprintf("moat-snapd at %s did not answer %s "
		                  "(%s): is it running? `moat info` shows it",
		        rec->snapd_url ? rec->snapd_url : "?", method,
		        moat_strerror(rv));
	else
		*errmsg = moat_asprintf("moat-snapd: %s",
		    msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

int
moat_snapshots_refs(struct moat_record *rec, const char *tenant,
    char *const *ids, size_t n, uint32_t *refs, uint64_t request_id,
    uint64_t deadline_ms, char **errmsg)
{
	for (size_t done = 0; done < n;) {
		Moat__V1__SnapshotRefsRequest req =
		    MOAT__V1__SNAPSHOT_REFS_REQUEST__INIT;
		Moat__V1__SnapshotRefsReply *r = NULL;
		size_t batch = n - done < REFS_BATCH ? n - done : REFS_BATCH;
		int rv;

		req.tenant = (char *)tenant;
		req.snapshot_ids = (char **)ids + done;
		req.n_snapshot_ids = batch;
		if ((rv = moat_record_sessiond_call(rec, "SnapshotRefs",
		         &req.base, &moat__v1__snapshot_refs_reply__descriptor,
		         (ProtobufCMessage **)&r, request_id, deadline_ms,
		         errmsg)) != MOAT_OK)
			return rv;
		if (r->n_refs != batch) {
			*errmsg = moat_asprintf(
			    "moat-sessiond answered "
			    "SnapshotRefs of %zu ids with %zu counts",
			    batch, r->n_refs);
			moat__v1__snapshot_refs_reply__free_unpacked(r, NULL);
			return MOAT_INTERNAL;
		}
		memcpy(refs + done, r->refs, batch * sizeof(*refs));
		moat__v1__snapshot_refs_reply__free_unpacked(r, NULL);
		done += batch;
	}
	return MOAT_OK;
}

/* ---- deleting snapshots by id ---- */

/* One node's list of snapshots, asked for once per batch of deletes. */
struct listed {
	struct moat_node_id node;
	int rv;                            /* MOAT_OK: `list` is set */
	char *msg;                         /* heap: why not */
	Moat__V1__LocalSnapshotList *list; /* owned */
};

/* The context of one moat_snapshots_delete. */
struct deleting {
	struct moat_record *rec;
	const char *tenant;
	uint64_t request_id, deadline;
	struct moat_node_id *available; /* heap */
	size_t n_available;
	struct listed *listed; /* heap */
	size_t n_listed;
	struct moat_snapshots_freed *out;
};

static bool
node_available(const struct deleting *d, const struct moat_node_id *node)
{
	for (size_t i = 0; i < d->n_available; i++)
		if (strcmp(d->available[i].s, node->s) == 0)
			return true;
	return false;
}

/* listed_get: node's list, asked for on first use; NULL when out of
 * memory. */
static struct listed *
listed_get(struct deleting *d, const struct moat_node_id *node)
{
	struct listed *grown, *l;

	for (size_t i = 0; i < d->n_listed; i++)
		if (strcmp(d->listed[i].node.s, node->s) == 0)
			return &d->listed[i];
	if ((grown = realloc(d->listed, (d->n_listed + 1) * sizeof(*grown))) ==
	    NULL)
		return NULL;
	d->listed = grown;
	l = &d->listed[d->n_listed++];
	memset(l, 0, sizeof(*l));
	l->node = *node;
	l->rv = moat_snapshots_node_list(d->rec->fw, node, d->tenant,
	    d->deadline, &l->list, &l->msg);
	return l;
}

/* left: snapshot `id` stays for `moat snapshot gc`, because of `why`
 * (taken). */
static void
left(struct deleting *d, const char *id, char *why)
{
	d->out->left++;
	moat_warn(d->request_id,
	    "snapshot %s of tenant %s not deleted (left "
	    "for `moat snapshot gc`): %s",
	    id, d->tenant, why ? why : "out of memory");
	if (d->out->first_error == NULL)
		d->out->first_error = moat_asprintf("snapshot %s: %s", id,
		    why ? why : "out of memory");
	free(why);
}

static const Moat__V1__LocalSnapshot *
list_find(const Moat__V1__LocalSnapshotList *list, const char *id)
{
	for (size_t i = 0; list != NULL && i < list->n_snapshots; i++)
		if (strcmp(list->snapshots[i]->snapshot_id, id) == 0)
			return list->snapshots[i];
	return NULL;
}

/* delete_on_node: DeleteLocalSnapshot of `id` on `node` as `tenant`; the
 * node also deletes its copy in moat-snapd. NOT_FOUND passes back. */
static int
delete_on_node(struct moat_forward *fw, const struct moat_node_id *node,
    const char *tenant, const char *id, uint64_t request_id,
    uint64_t deadline_ms, char **errmsg)
{
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	ProtobufCMessage *reply = NULL;
	char what[MOAT_ID_MAX + 16];
	int rv;

	ref.snapshot_id = (char *)id;
	ref.tenant = (char *)tenant;
	snprintf(what, sizeof(what), "snapshot %.100s", id);
	rv = moat_forward_node_call(fw, node, tenant, "DeleteLocalSnapshot",
	    &ref.base, &moat__v1__empty__descriptor, request_id, deadline_ms,
	    what, &reply, errmsg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

void
moat_snapshots_drop_pulled(struct moat_forward *fw, const char *tenant,
    const char *remote_id, const struct moat_node_id *owner,
    uint64_t deadline_ms)
{
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	struct moat_node_id *ids = NULL;
	size_t n = 0;

	if (remote_id == NULL || remote_id[0] == '\0' ||
	    moat_nodes_available_ids(fw->nodes, &ids, &n) != MOAT_OK)
		return;
	ref.snapshot_id = (char *)remote_id;
	ref.tenant = (char *)tenant;
	ref.keep_remote = true; /* snapd's copy is the owner's to delete */
	for (size_t i = 0; i < n; i++) {
		ProtobufCMessage *reply = NULL;
		char *msg = NULL;
		int rv;

		if (owner != NULL && strcmp(ids[i].s, owner->s) == 0)
			continue;
		rv = moat_forward_node_call(fw, &ids[i], tenant,
		    "DeleteLocalSnapshot", &ref.base,
		    &moat__v1__empty__descriptor, moat_rpc_new_request_id(),
		    deadline_ms, "a pulled snapshot copy", &reply, &msg);
		if (rv == MOAT_OK)
			moat_info(0,
			    "snapshot %s: the copy node %s pulled "
			    "is deleted with it",
			    remote_id, ids[i].s);
		else if (rv != MOAT_NOT_FOUND)
			moat_warn(0,
			    "snapshot %s: the copy node %s pulled "
			    "stays (`moat snapshot gc` removes it): %s",
			    remote_id, ids[i].s, msg ? msg : "?");
		if (reply != NULL)
			protobuf_c_message_free_unpacked(reply, NULL);
		free(msg);
	}
	free(ids);
}

int
moat_snapshots_remote_of(struct moat_forward *fw,
    const struct moat_node_id *node, const char *tenant, const char *id,
    uint64_t deadline_ms, char *remote, size_t size)
{
	Moat__V1__LocalSnapshotList *list = NULL;
	const Moat__V1__LocalSnapshot *s;
	char *msg = NULL;
	int rv;

	remote[0] = '\0';
	if ((rv = moat_snapshots_node_list(fw, node, tenant, deadline_ms,
	         &list, &msg)) != MOAT_OK) {
		free(msg);
		return rv;
	}
	if ((s = list_find(list, id)) != NULL && s->remote_id != NULL)
		snprintf(remote, size, "%s", s->remote_id);
	moat__v1__local_snapshot_list__free_unpacked(list, NULL);
	return MOAT_OK;
}

static void
delete_local(struct deleting *d, const char *id,
    const struct moat_node_id *node)
{
	const Moat__V1__LocalSnapshot *s;
	struct listed *l;
	char *msg = NULL;
	int rv;

	if (!node_available(d, node)) {
		left(d, id,
		    moat_asprintf("its node %s is not available "
		                  "(`moat info` shows the nodes)",
		        node->s));
		return;
	}
	if ((l = listed_get(d, node)) == NULL || l->rv != MOAT_OK) {
		left(d, id,
		    l == NULL ? NULL :
		                moat_asprintf("%s",
		                    l->msg ? l->msg : moat_strerror(l->rv)));
		return;
	}
	if ((s = list_find(l->list, id)) == NULL)
		return; /* gone already */
	rv = delete_on_node(d->rec->fw, node, d->tenant, id,
	    moat_rpc_new_request_id(), d->deadline, &msg);
	if (rv == MOAT_OK) {
		d->out->deleted++;
		d->out->bytes += moat_snapshot_local_bytes(s);
		moat_snapshots_drop_pulled(d->rec->fw, d->tenant, s->remote_id,
		    node, d->deadline);
	} else if (rv != MOAT_NOT_FOUND) {
		left(d, id, msg);
		msg = NULL;
	}
	free(msg);
}

/* delete_in_snapd: DeleteSnapshot of moat-snapd's `id`; on MOAT_OK
 * *freed is what it freed. NOT_FOUND passes back. */
static int
delete_in_snapd(struct moat_record *rec, const char *tenant, const char *id,
    uint64_t deadline_ms, uint64_t *freed, char **errmsg)
{
	Moat__V1__DeleteSnapshotRequest req =
	    MOAT__V1__DELETE_SNAPSHOT_REQUEST__INIT;
	Moat__V1__DeleteSnapshotReply *r = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.id = (char *)id;
	if ((rv = moat_snapshots_snapd_call(rec, "DeleteSnapshot", &req.base,
	         &moat__v1__delete_snapshot_reply__descriptor,
	         (ProtobufCMessage **)&r, deadline_ms, errmsg)) != MOAT_OK)
		return rv;
	*freed = r->freed_bytes;
	moat__v1__delete_snapshot_reply__free_unpacked(r, NULL);
	return MOAT_OK;
}

static void
delete_remote(struct deleting *d, const char *id)
{
	uint64_t freed = 0;
	char *msg = NULL;
	int rv =
	    delete_in_snapd(d->rec, d->tenant, id, d->deadline, &freed, &msg);

	if (rv == MOAT_OK) {
		d->out->deleted++;
		d->out->bytes += freed;
		moat_snapshots_drop_pulled(d->rec->fw, d->tenant, id, NULL,
		    d->deadline);
	} else if (rv != MOAT_NOT_FOUND) {
		left(d, id, msg);
		msg = NULL;
	}
	free(msg);
}

void
moat_snapshots_delete(struct moat_record *rec, const char *tenant,
    char *const *ids, size_t n, uint64_t request_id, uint64_t deadline_ms,
    struct moat_snapshots_freed *out)
{
	struct deleting d = {
		.rec = rec,
		.tenant = tenant,
		.request_id = request_id,
		.deadline = deadline_ms,
		.out = out,
	};
	struct moat_node_id node;

	memset(out, 0, sizeof(*out));
	if (n == 0)
		return;
	if (moat_nodes_available_ids(rec->fw->nodes, &d.available,
	        &d.n_available) != MOAT_OK) {
		d.available = NULL;
		d.n_available = 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (ids[i] == NULL || ids[i][0] == '\0')
			continue;
		if (moat_snapshot_node(ids[i], &node))
			delete_local(&d, ids[i], &node);
		else
			delete_remote(&d, ids[i]);
	}
	for (size_t i = 0; i < d.n_listed; i++) {
		free(d.listed[i].msg);
		if (d.listed[i].list != NULL)
			moat__v1__local_snapshot_list__free_unpacked(
			    d.listed[i].list, NULL);
	}
	free(d.listed);
	free(d.available);
}

/* ---- DeleteSession ---- */

static int
pack_reply(struct moat_rpc_call *call, const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	uint8_t *p = malloc(len ? len : 1);

	if (p == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	protobuf_c_message_pack(m, p);
	call->raw_reply = p;
	call->raw_reply_len = len;
	return MOAT_OK;
}

int
moat_snapshots_delete_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct moat_travel t;
	Moat__V1__DeleteSessionRequest fwd =
	    *(const Moat__V1__DeleteSessionRequest *)request;
	Moat__V1__DeleteSessionReply *r = NULL;
	struct moat_snapshots_freed freed;
	char *msg = NULL;
	int rv;

	(void)reply;
	moat_gateway_travel(call->service_ctx, &t);
	fwd.tenant = (char *)moat_gw_tenant(call);
	if ((rv = moat_record_sessiond_call(t.rec, "DeleteSession", &fwd.base,
	         &moat__v1__delete_session_reply__descriptor,
	         (ProtobufCMessage **)&r, call->request_id, call->deadline_ms,
	         &msg)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s", msg);
		free(msg);
		return rv;
	}
	/* The session is gone: its snapshots go now, and what cannot go
	 * now is left for `moat snapshot gc`, never failing the delete. */
	moat_snapshots_delete(t.rec, fwd.tenant, r->unreferenced_snapshots,
	    r->n_unreferenced_snapshots, call->request_id, call->deadline_ms,
	    &freed);
	r->snapshots_deleted = freed.deleted;
	r->snapshot_bytes_freed = freed.bytes;
	if (freed.left > 0)
		moat_warn(call->request_id,
		    "session %s deleted; %u of its "
		    "%zu snapshots are left for `moat snapshot gc`: %s",
		    fwd.session_id, freed.left, r->n_unreferenced_snapshots,
		    freed.first_error ? freed.first_error : "");
	else if (r->n_unreferenced_snapshots > 0)
		moat_info(call->request_id,
		    "session %s deleted with %u "
		    "snapshots (%llu bytes freed)",
		    fwd.session_id, freed.deleted,
		    (unsigned long long)freed.bytes);
	free(freed.first_error);
	rv = pack_reply(call, &r->base);
	moat__v1__delete_session_reply__free_unpacked(r, NULL);
	return rv;
}

/* ---- GcSnapshots ---- */

/* One GcSnapshots call: what it found and what it answers. */
struct gc {
	struct moat_record *rec;
	const char *tenant;
	uint64_t request_id, deadline;
	uint64_t cutoff_ms; /* created after this: spared (min_age) */
	bool dry_run;
	Moat__V1__GcSnapshotsReply *r;
	char **live; /* ids of sandboxes on the nodes (heap) */
	size_t n_live, cap_live;
	char **held; /* local ids listed and their snapd ids */
	size_t n_held, cap_held;
	struct moat_node_id *unsure; /* nodes that did not list (heap) */
	size_t n_unsure;
	bool oom;
};

/* set_add: a heap copy of s joins the set (no order; small sets, linear
 * lookups). */
static void
set_add(struct gc *g, char ***v, size_t *n, size_t *cap, const char *s)
{
	char **grown;

	if (s == NULL || s[0] == '\0')
		return;
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 64;

		if ((grown = realloc(*v, c * sizeof(*grown))) == NULL) {
			g->oom = true;
			return;
		}
		*v = grown;
		*cap = c;
	}
	if (((*v)[*n] = strdup(s)) == NULL)
		g->oom = true;
	else
		(*n)++;
}

static bool
set_has(char *const *v, size_t n, const char *s)
{
	for (size_t i = 0; s != NULL && i < n; i++)
		if (strcmp(v[i], s) == 0)
			return true;
	return false;
}

static void
set_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static void gc_error(struct gc *g, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* gc_error: one line of reply.errors (and the log). */
static void
gc_error(struct gc *g, const char *fmt, ...)
{
	char **grown, *line;
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(&line, fmt, ap) < 0)
		line = NULL;
	va_end(ap);
	if (line == NULL) {
		g->oom = true;
		return;
	}
	moat_warn(g->request_id, "GcSnapshots of tenant %s: %s", g->tenant,
	    line);
	if ((grown = realloc(g->r->errors,
	         (g->r->n_errors + 1) * sizeof(*grown))) == NULL) {
		free(line);
		g->oom = true;
		return;
	}
	g->r->errors = grown;
	g->r->errors[g->r->n_errors++] = line;
}

/* gc_removed: one entry of reply.removed. */
static void
gc_removed(struct gc *g, const char *id, const char *where, uint64_t bytes,
    const char *sandbox_id)
{
	Moat__V1__GcSnapshot *s = malloc(sizeof(*s)), **grown;

	if (s == NULL)
		goto oom;
	moat__v1__gc_snapshot__init(s);
	s->bytes = bytes;
	if ((s->snapshot_id = strdup(id)) == NULL ||
	    (s->where = strdup(where)) == NULL ||
	    (s->sandbox_id = strdup(sandbox_id ? sandbox_id : "")) == NULL ||
	    (grown = realloc(g->r->removed,
	         (g->r->n_removed + 1) * sizeof(*grown))) == NULL) {
		moat__v1__gc_snapshot__free_unpacked(s, NULL);
		goto oom;
	}
	g->r->removed = grown;
	g->r->removed[g->r->n_removed++] = s;
	g->r->bytes_freed += bytes;
	moat_info(g->request_id,
	    "GcSnapshots of tenant %s: %s %s in %s "
	    "(%llu bytes)",
	    g->tenant, g->dry_run ? "would remove" : "removed", id, where,
	    (unsigned long long)bytes);
	return;
oom:
	g->oom = true;
}

/* gc_list_node: what node `node` holds: its sandboxes join g->live, its
 * snapshots (and their snapd ids) g->held. On MOAT_OK *out is its list
 * of snapshots (the caller's); a node that does not answer is an error
 * line and counts as unsure. */
static int
gc_list_node(struct gc *g, const struct moat_node_id *node,
    Moat__V1__LocalSnapshotList **out)
{
	Moat__V1__ListSandboxesRequest req =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	Moat__V1__SandboxList *sbs = NULL;
	char *msg = NULL;
	int rv;

	*out = NULL;
	req.tenant = (char *)g->tenant;
	if ((rv = moat_forward_node_call(g->rec->fw, node, g->tenant,
	         "ListSandboxes", &req.base,
	         &moat__v1__sandbox_list__descriptor,
	         moat_rpc_new_request_id(),
	         deadline_cap(g->deadline, NODE_LIST_MS),
	         "the tenant's sandboxes", (ProtobufCMessage **)&sbs, &msg)) !=
	        MOAT_OK ||
	    (rv = moat_snapshots_node_list(g->rec->fw, node, g->tenant,
	         g->deadline, out, &msg)) != MOAT_OK) {
		gc_error(g, "node %s: %s: its snapshots are left as they are",
		    node->s, msg ? msg : moat_strerror(rv));
		free(msg);
		if (sbs != NULL)
			moat__v1__sandbox_list__free_unpacked(sbs, NULL);
		g->unsure[g->n_unsure++] = *node;
		return rv;
	}
	for (size_t i = 0; i < sbs->n_sandboxes; i++)
		set_add(g, &g->live, &g->n_live, &g->cap_live,
		    sbs->sandboxes[i]->id);
	for (size_t i = 0; i < (*out)->n_snapshots; i++) {
		set_add(g, &g->held, &g->n_held, &g->cap_held,
		    (*out)->snapshots[i]->snapshot_id);
		set_add(g, &g->held, &g->n_held, &g->cap_held,
		    (*out)->snapshots[i]->remote_id);
	}
	moat__v1__sandbox_list__free_unpacked(sbs, NULL);
	return MOAT_OK;
}

/* gc_node: removes node's unreferenced snapshots in `list`: not
 * templates, old enough, their sandbox gone. */
static void
gc_node(struct gc *g, const struct moat_node_id *node,
    const Moat__V1__LocalSnapshotList *list)
{
	const Moat__V1__LocalSnapshot **cand;
	char **ids, *msg = NULL, where[MOAT_ID_MAX + 8];
	uint32_t *refs;
	size_t n = 0;

	cand = calloc(list->n_snapshots + 1, sizeof(*cand));
	ids = calloc(list->n_snapshots + 1, sizeof(*ids));
	refs = calloc(list->n_snapshots + 1, sizeof(*refs));
	if (cand == NULL || ids == NULL || refs == NULL) {
		g->oom = true;
		goto out;
	}
	for (size_t i = 0; i < list->n_snapshots; i++) {
		const Moat__V1__LocalSnapshot *s = list->snapshots[i];

		if (s->template_ || s->created_unix_ms > g->cutoff_ms ||
		    set_has(g->live, g->n_live, s->sandbox_id))
			continue;
		cand[n] = s;
		ids[n++] = s->snapshot_id;
	}
	if (n > 0 &&
	    moat_snapshots_refs(g->rec, g->tenant, ids, n, refs, g->request_id,
	        g->deadline, &msg) != MOAT_OK) {
		gc_error(g,
		    "node %s: cannot tell what names its snapshots: "
		    "%s",
		    node->s, msg);
		goto out;
	}
	snprintf(where, sizeof(where), "node %s", node->s);
	for (size_t i = 0; i < n; i++) {
		int rv = MOAT_OK;

		if (refs[i] > 0) {
			g->r->kept++;
			continue;
		}
		if (!g->dry_run &&
		    (rv = delete_on_node(g->rec->fw, node, g->tenant, ids[i],
		         moat_rpc_new_request_id(), g->deadline, &msg)) !=
		        MOAT_OK &&
		    rv != MOAT_NOT_FOUND)
			gc_error(g, "snapshot %s on node %s: %s", ids[i],
			    node->s, msg ? msg : moat_strerror(rv));
		else if (rv == MOAT_OK)
			gc_removed(g, ids[i], where,
			    moat_snapshot_local_bytes(cand[i]),
			    cand[i]->sandbox_id);
		free(msg);
		msg = NULL;
	}
out:
	free(msg);
	free(cand);
	free(ids);
	free(refs);
}

const char *
moat_snapshots_label(const Moat__V1__SnapshotInfo *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i]->key, key) == 0)
			return s->labels[i]->value;
	return NULL;
}

/* snapd_spared: whether snapd's snapshot `s` is left alone before asking
 * sessiond: too young, or its local snapshot (label local_id) is listed
 * on a node, or is on a node that did not answer. */
static bool
snapd_spared(const struct gc *g, const Moat__V1__SnapshotInfo *s)
{
	const char *local = moat_snapshots_label(s, "local_id");
	struct moat_node_id node;

	if (s->created_ms > g->cutoff_ms ||
	    set_has(g->held, g->n_held, s->id) ||
	    set_has(g->held, g->n_held, local))
		return true;
	if (local == NULL || !moat_snapshot_node(local, &node))
		return false;
	for (size_t i = 0; i < g->n_unsure; i++)
		if (strcmp(g->unsure[i].s, node.s) == 0)
			return true;
	return false;
}

/* gc_snapd_page: the garbage of one page of snapd's list: a snapshot
 * that no step names, by its own id or its local one. */
static void
gc_snapd_page(struct gc *g, const Moat__V1__ListSnapshotsReply *page)
{
	const Moat__V1__SnapshotInfo **cand;
	char **ids, *msg = NULL;
	uint32_t *refs;
	size_t n = 0;

	/* Two ids per snapshot: snapd's and its local_id ("" : none). */
	cand = calloc(page->n_snapshots + 1, sizeof(*cand));
	ids = calloc(2 * page->n_snapshots + 1, sizeof(*ids));
	refs = calloc(2 * page->n_snapshots + 1, sizeof(*refs));
	if (cand == NULL || ids == NULL || refs == NULL) {
		g->oom = true;
		goto out;
	}
	for (size_t i = 0; i < page->n_snapshots; i++) {
		const char *local =
		    moat_snapshots_label(page->snapshots[i], "local_id");

		if (snapd_spared(g, page->snapshots[i]))
			continue;
		cand[n] = page->snapshots[i];
		ids[2 * n] = page->snapshots[i]->id;
		ids[2 * n + 1] = (char *)(local ? local : "");
		n++;
	}
	if (n > 0 &&
	    moat_snapshots_refs(g->rec, g->tenant, ids, 2 * n, refs,
	        g->request_id, g->deadline, &msg) != MOAT_OK) {
		gc_error(g,
		    "moat-snapd: cannot tell what names its snapshots: "
		    "%s",
		    msg);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t freed = cand[i]->stored_bytes;
		int rv = MOAT_OK;

		if (refs[2 * i] > 0 || refs[2 * i + 1] > 0) {
			g->r->kept++;
			continue;
		}
		if (!g->dry_run &&
		    (rv = delete_in_snapd(g->rec, g->tenant, cand[i]->id,
		         g->deadline, &freed, &msg)) != MOAT_OK &&
		    rv != MOAT_NOT_FOUND)
			gc_error(g, "snapshot %s in moat-snapd: %s",
			    cand[i]->id, msg ? msg : moat_strerror(rv));
		else if (rv == MOAT_OK)
			gc_removed(g, cand[i]->id, "snapd", freed, "");
		free(msg);
		msg = NULL;
	}
out:
	free(msg);
	free(cand);
	free(ids);
	free(refs);
}

/* gc_snapd: every page of snapd's list of the tenant's snapshots. */
static void
gc_snapd(struct gc *g)
{
	Moat__V1__ListSnapshotsRequest req =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__ListSnapshotsReply *page = NULL;
	char *token = NULL, *msg = NULL;
	int rv;

	req.tenant = (char *)g->tenant;
	req.page_size = SNAPD_PAGE;
	do {
		req.page_token = token != NULL ? token : (char *)"";
		if ((rv = moat_snapshots_snapd_call(g->rec, "ListSnapshots",
		         &req.base,
		         &moat__v1__list_snapshots_reply__descriptor,
		         (ProtobufCMessage **)&page, g->deadline, &msg)) !=
		    MOAT_OK) {
			gc_error(g, "%s", msg ? msg : moat_strerror(rv));
			free(msg);
			break;
		}
		gc_snapd_page(g, page);
		free(token);
		token = page->next_page_token[0] != '\0' ?
		    strdup(page->next_page_token) :
		    NULL;
		moat__v1__list_snapshots_reply__free_unpacked(page, NULL);
	} while (token != NULL && !g->oom);
	free(token);
}

/* gc_nodes: every available node's garbage. */
static int
gc_nodes(struct gc *g)
{
	struct moat_node_id *ids = NULL;
	Moat__V1__LocalSnapshotList **lists = NULL;
	size_t n = 0;

	if (moat_nodes_available_ids(g->rec->fw->nodes, &ids, &n) != MOAT_OK ||
	    (n > 0 &&
	        ((lists = calloc(n, sizeof(*lists))) == NULL ||
	            (g->unsure = calloc(n, sizeof(*g->unsure))) == NULL))) {
		free(ids);
		free(lists);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	/* Every node's sandboxes are known before any snapshot goes. */
	for (size_t i = 0; i < n; i++)
		(void)gc_list_node(g, &ids[i], &lists[i]);
	for (size_t i = 0; i < n && !g->oom; i++)
		if (lists[i] != NULL)
			gc_node(g, &ids[i], lists[i]);
	for (size_t i = 0; i < n; i++)
		if (lists[i] != NULL)
			moat__v1__local_snapshot_list__free_unpacked(lists[i],
			    NULL);
	free(lists);
	free(ids);
	return MOAT_OK;
}

int
moat_snapshots_gc(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__GcSnapshotsRequest *req =
	    (const Moat__V1__GcSnapshotsRequest *)request;
	uint32_t min_age = req->min_age_s != 0 ? req->min_age_s : GC_MIN_AGE_S;
	uint64_t now = moat_now_unix_ms();
	struct moat_travel t;
	struct gc g = {
		.tenant = moat_gw_tenant(call),
		.request_id = call->request_id,
		.deadline = call->deadline_ms,
		.dry_run = req->dry_run,
		.r = (Moat__V1__GcSnapshotsReply *)reply,
	};
	int rv;

	moat_gateway_travel(call->service_ctx, &t);
	g.rec = t.rec;
	g.cutoff_ms = now > (uint64_t)min_age * 1000 ?
	    now - (uint64_t)min_age * 1000 :
	    0;
	g.r->dry_run = req->dry_run;
	rv = gc_nodes(&g);
	if (rv == MOAT_OK && !g.oom)
		gc_snapd(&g);
	set_free(g.live, g.n_live);
	set_free(g.held, g.n_held);
	free(g.unsure);
	if (rv != MOAT_OK || g.oom)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of "
		    "memory collecting snapshot garbage");
	moat_info(call->request_id,
	    "GcSnapshots of tenant %s%s: %zu "
	    "snapshots, %llu bytes; %u kept; %zu errors",
	    g.tenant, g.dry_run ? " (dry run)" : "", g.r->n_removed,
	    (unsigned long long)g.r->bytes_freed, g.r->kept, g.r->n_errors);
	return MOAT_OK;
}
