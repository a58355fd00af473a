/*
 * images.c: the Gateway's image calls (issue 17). StartImageBuild picks
 * a node (the request's, else an available uncordoned one with the
 * fewest sandboxes: a build is heavy) and forwards to its vmd, which
 * runs the build and stores the image in moat-snapd when done;
 * GetImageBuild long-polls the build's node without holding a worker
 * (moat_forward_node_async). ListImages merges what moat-snapd keeps
 * (snapshots of MOAT_IMAGES_TENANT labelled kind=image) with each
 * available node's own list: one entry per name, with the nodes holding
 * it. PushImage forwards to a node holding the image. RemoveImage is
 * refused while a known sandbox runs the image or a snapshot in
 * moat-snapd of any tenant was taken of it (naming up to five: snapd's
 * ListSnapshots all_tenants) and for "default"; else each holding node
 * drops its copy (a node refuses while its local snapshots use it) and
 * then moat-snapd's entry goes.
 * Build, push and remove are operator calls ([gateway] operator-tenants,
 * moat_gw_operator_check), listing is anyone's.
 * Not for: building (vmd and images/build.sh), pulling (vmd does it
 * when a sandbox needs an image it lacks) or placement's preference
 * for nodes that hold an image (placement.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "gateway.h"
#include "moat/images.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapshot.pb-c.h"

#define SPEC_MAX (64u * 1024u) /* an image spec's text, at most */
#define NODE_LIST_MS 5000      /* one node's ListImages, at most */
#define SNAPD_LIST_MS 5000     /* one page of snapd's list, at most */
#define USERS_NAMED 5          /* sandboxes a refused remove names */
#define WAIT_MARGIN_MS 2000    /* a long poll ends this long before the call */

/* image_name_ok: the names vmd takes for an image (vmd_image_name_ok):
 * 1-64 letters, digits, '.', '_' or '-', not starting with '.' (the name
 * is a directory on every node). */
static bool
image_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 64 || s[0] == '.')
		return false;
	return strspn(s,
	           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	           "0123456789._-") == n;
}

static int
bad_name(struct moat_rpc_call *call, const char *method, const char *name)
{
	return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
	    "%s: image name \"%.80s\" is not valid: use 1-64 letters, "
	    "digits, '.', '_' or '-', not starting with '.' (`moat image ls` "
	    "lists the images)",
	    method, name);
}

/* pack_reply: `m` encoded into call->raw_reply (the reply to send). */
static int
pack_reply(struct moat_rpc_call *call, const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);

	if ((call->raw_reply = malloc(len ? len : 1)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	protobuf_c_message_pack(m, call->raw_reply);
	call->raw_reply_len = len;
	return MOAT_OK;
}

/* build_node: where a build runs: `want` when given (known and
 * available), else the usable available node with the fewest
 * sandboxes. Errors go through moat_rpc_error. */
static int
build_node(struct moat_rpc_call *call, struct moat_nodes *nodes,
    const char *want, struct moat_node_id *out)
{
	Moat__V1__Node **list = NULL;
	size_t n = 0, best = SIZE_MAX;
	char why[160];
	int rv = MOAT_OK;

	if (moat_nodes_snapshot(nodes, &list, &n) != MOAT_OK)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	for (size_t i = 0; i < n; i++) {
		bool named =
		    want[0] != '\0' && strcmp(list[i]->node_id, want) == 0;

		if (want[0] != '\0' && !named)
			continue;
		if (named && !list[i]->available) {
			rv = moat_rpc_error(call, MOAT_UNAVAILABLE,
			    "StartImageBuild: node %s does not answer the "
			    "gateway's surveys: bring it back or leave "
			    "--node out",
			    want);
			break;
		}
		if (!list[i]->available ||
		    (!named &&
		        moat_placement_unusable(list[i], why, sizeof(why)) !=
		            NULL))
			continue;
		if (best == SIZE_MAX ||
		    list[i]->sandboxes < list[best]->sandboxes)
			best = i;
	}
	if (rv == MOAT_OK && best == SIZE_MAX)
		rv = want[0] != '\0' ?
		    moat_rpc_error(call, MOAT_NOT_FOUND,
		        "StartImageBuild: node %.80s is unknown to the "
		        "gateway (`moat node ls` lists the nodes)",
		        want) :
		    moat_rpc_error(call, MOAT_UNAVAILABLE,
		        "StartImageBuild: no available, uncordoned node to "
		        "build on: start moat-vmd or uncordon a node (`moat "
		        "node ls` shows them)");
	if (rv == MOAT_OK && !moat_node_id_set(out, list[best]->node_id))
		rv = moat_rpc_error(call, MOAT_INTERNAL, "node id too long");
	moat_nodes_snapshot_free(list, n);
	return rv;
}

int
moat_images_start_build(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	const Moat__V1__ImageBuildRequest *req =
	    (const Moat__V1__ImageBuildRequest *)request;
	struct moat_travel t;
	struct moat_node_id node;
	Moat__V1__ImageBuild *b = NULL;
	char *msg = NULL;
	int rv;

	(void)reply;
	if ((rv = moat_gw_operator_check(call, "StartImageBuild")) != MOAT_OK)
		return rv;
	if (!image_name_ok(req->name))
		return bad_name(call, "StartImageBuild", req->name);
	if (req->spec[0] == '\0' || strlen(req->spec) > SPEC_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "StartImageBuild: the spec is %s: send the INI spec's "
		    "text (at most %u KiB; images/README.md describes it)",
		    req->spec[0] ? "too long" : "empty", SPEC_MAX / 1024);
	moat_gateway_travel(call->service_ctx, &t);
	if ((rv = build_node(call, t.nodes, req->node_id, &node)) != MOAT_OK)
		return rv;
	if ((rv = moat_forward_node_call(t.fw, &node, moat_gw_tenant(call),
	         "StartImageBuild", request,
	         &moat__v1__image_build__descriptor, call->request_id,
	         call->deadline_ms, "the image build", (ProtobufCMessage **)&b,
	         &msg)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s", msg ? msg : "");
		free(msg);
		return rv;
	}
	/* The client passes node_id back in GetImageBuild: it must be
	 * this node's, whatever vmd put there. */
	if (b->node_id != protobuf_c_empty_string)
		free(b->node_id);
	b->node_id = strdup(node.s);
	moat_info(call->request_id,
	    "image %s: build %s started on node %s "
	    "by tenant %s",
	    req->name, b->id, node.s, moat_gw_tenant(call));
	rv = b->node_id != NULL ?
	    pack_reply(call, &b->base) :
	    moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED, "out of memory");
	moat__v1__image_build__free_unpacked(b, NULL);
	return rv;
}

int
moat_images_get_build(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	const Moat__V1__ImageBuildRef *ref =
	    (const Moat__V1__ImageBuildRef *)request;
	struct moat_travel t;
	struct moat_node_id node;
	char what[MOAT_ID_MAX + 16];
	uint64_t now = moat_rpc_now_ms(), left;

	if (ref->build_id[0] == '\0' || ref->node_id[0] == '\0' ||
	    !moat_node_id_set(&node, ref->node_id))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "GetImageBuild: build_id and node_id are required: pass "
		    "back those of StartImageBuild's reply");
	if (ref->wait_ms > 30000)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "GetImageBuild: wait_ms %u is over 30000: poll again "
		    "instead",
		    ref->wait_ms);
	moat_gateway_travel(call->service_ctx, &t);
	if (!moat_nodes_is_available(t.nodes, &node))
		return moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "GetImageBuild: node %s, which runs build %.80s, is gone "
		    "or does not answer: `moat node ls` shows it; start the "
		    "build again elsewhere if it does not come back",
		    node.s, ref->build_id);
	snprintf(what, sizeof(what), "build %.80s", ref->build_id);
	/* The node must answer before the call's deadline (a client that
	 * sets none has the default, which a 30 s wait would meet): its
	 * wait is cut to what is left, less a margin for the answer. */
	left = call->deadline_ms > now ? call->deadline_ms - now : 0;
	if (call->deadline_ms != 0 && ref->wait_ms + WAIT_MARGIN_MS > left) {
		Moat__V1__ImageBuildRef cut = *ref;
		uint8_t buf[512];

		cut.wait_ms = left > WAIT_MARGIN_MS ?
		    (uint32_t)(left - WAIT_MARGIN_MS) :
		    0;
		if (moat__v1__image_build_ref__get_packed_size(&cut) <=
		    sizeof(buf))
			return moat_forward_node_async(t.fw, call, &node, what,
			    buf, moat__v1__image_build_ref__pack(&cut, buf),
			    reply->descriptor);
	}
	return moat_forward_node_async(t.fw, call, &node, what, call->payload,
	    call->payload_len, reply->descriptor);
}

/* ---- ListImages ---- */

static bool
str_add(char ***list, size_t *n, const char *s)
{
	char **nl = realloc(*list, (*n + 1) * sizeof(*nl));

	if (nl == NULL)
		return false;
	*list = nl;
	if ((nl[*n] = strdup(s)) == NULL)
		return false;
	(*n)++;
	return true;
}

/* entry_of: the reply's entry of image `name`, added (empty) when it
 * has none; NULL when out of memory. */
static Moat__V1__ImageInfo *
entry_of(Moat__V1__ImageList *r, const char *name)
{
	Moat__V1__ImageInfo **nl, *e;

	for (size_t i = 0; i < r->n_images; i++)
		if (strcmp(r->images[i]->name, name) == 0)
			return r->images[i];
	if ((e = malloc(sizeof(*e))) == NULL)
		return NULL;
	moat__v1__image_info__init(e);
	if ((e->name = strdup(name)) == NULL ||
	    (nl = realloc(r->images, (r->n_images + 1) * sizeof(*nl))) ==
	        NULL) {
		moat__v1__image_info__free_unpacked(e, NULL);
		return NULL;
	}
	r->images = nl;
	r->images[r->n_images++] = e;
	return e;
}

/* set_str: *dst (heap, or protobuf-c's empty default) becomes a copy of
 * src when it is still empty and src is not. */
static bool
set_str(char **dst, const char *src)
{
	char *c;

	if ((*dst != NULL && (*dst)[0] != '\0') || src == NULL ||
	    src[0] == '\0')
		return true;
	if ((c = strdup(src)) == NULL)
		return false;
	if (*dst != NULL && *dst != protobuf_c_empty_string)
		free(*dst);
	*dst = c;
	return true;
}

/* merge_node: node `node`'s copy of an image into e. */
static bool
merge_node(Moat__V1__ImageInfo *e, const Moat__V1__ImageInfo *in,
    const char *node)
{
	bool ok = set_str(&e->id, in->id) && set_str(&e->source, in->source) &&
	    str_add(&e->nodes, &e->n_nodes, node);

	if (e->size_bytes == 0)
		e->size_bytes = in->size_bytes;
	if (e->created_unix_ms == 0)
		e->created_unix_ms = in->created_unix_ms;
	/* The first copy that has them gives the lists, whole. */
	if (e->n_packages == 0)
		for (size_t i = 0; ok && i < in->n_packages; i++)
			ok = str_add(&e->packages, &e->n_packages,
			    in->packages[i]);
	if (e->n_languages == 0)
		for (size_t i = 0; ok && i < in->n_languages; i++)
			ok = str_add(&e->languages, &e->n_languages,
			    in->languages[i]);
	return ok;
}

/* merge_snapd: moat-snapd's image entries (named `name`, NULL: all)
 * into r. A snapd that does not answer is logged, not an error: the
 * nodes' lists still say what runs. */
static int
merge_snapd(struct moat_rpc_call *call, struct moat_record *rec,
    Moat__V1__ImageList *r, const char *name)
{
	Moat__V1__SnapLabel kind = MOAT__V1__SNAP_LABEL__INIT,
	                    nm = MOAT__V1__SNAP_LABEL__INIT;
	Moat__V1__SnapLabel *labels[2] = { &kind, &nm };
	Moat__V1__ListSnapshotsRequest req =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	char *token = NULL, *msg = NULL;
	int rv = MOAT_OK;

	if (rec->snapd == NULL)
		return MOAT_OK;
	kind.key = (char *)MOAT_IMAGE_LABEL_KIND;
	kind.value = (char *)MOAT_IMAGE_KIND;
	nm.key = (char *)MOAT_IMAGE_LABEL_NAME;
	nm.value = (char *)(name ? name : "");
	req.tenant = (char *)MOAT_IMAGES_TENANT;
	req.labels = labels;
	req.n_labels = name ? 2 : 1;
	req.page_size = 1000;
	do {
		Moat__V1__ListSnapshotsReply *page = NULL;

		req.page_token = token ? token : (char *)"";
		if (moat_snapshots_snapd_call(rec, "ListSnapshots", &req.base,
		        &moat__v1__list_snapshots_reply__descriptor,
		        (ProtobufCMessage **)&page,
		        moat_rpc_now_ms() + SNAPD_LIST_MS, &msg) != MOAT_OK) {
			moat_warn(call->request_id, "ListImages: %s", msg);
			free(msg);
			break;
		}
		for (size_t i = 0; rv == MOAT_OK && i < page->n_snapshots;
		     i++) {
			const Moat__V1__SnapshotInfo *s = page->snapshots[i];
			const char *n =
			    moat_snapshots_label(s, MOAT_IMAGE_LABEL_NAME);
			Moat__V1__ImageInfo *e;

			if (n == NULL || n[0] == '\0')
				continue;
			if ((e = entry_of(r, n)) == NULL ||
			    !set_str(&e->id,
			        moat_snapshots_label(s,
			            MOAT_IMAGE_LABEL_ID)) ||
			    !set_str(&e->source,
			        moat_snapshots_label(s,
			            MOAT_IMAGE_LABEL_SOURCE)) ||
			    !set_str(&e->snapshot_id, s->id)) {
				rv = MOAT_RESOURCE_EXHAUSTED;
				break;
			}
			e->stored = true;
			e->stored_bytes = s->stored_bytes;
			if (e->size_bytes == 0)
				e->size_bytes = s->logical_bytes;
			if (e->created_unix_ms == 0)
				e->created_unix_ms = s->created_ms;
		}
		free(token);
		token = page->next_page_token[0] ?
		    strdup(page->next_page_token) :
		    NULL;
		moat__v1__list_snapshots_reply__free_unpacked(page, NULL);
	} while (token != NULL && rv == MOAT_OK);
	free(token);
	return rv;
}

/* node_images: node `node`'s ListImages (of `name`; "" all). On MOAT_OK
 * *out is the caller's; errors set *errmsg (heap). */
static int
node_images(struct moat_travel *t, const struct moat_node_id *node,
    const char *tenant, const char *name, uint64_t request_id,
    Moat__V1__ImageList **out, char **errmsg)
{
	Moat__V1__ListImagesRequest req = MOAT__V1__LIST_IMAGES_REQUEST__INIT;

	req.name = (char *)name;
	return moat_forward_node_call(t->fw, node, tenant, "ListImages",
	    &req.base, &moat__v1__image_list__descriptor, request_id,
	    moat_rpc_now_ms() + NODE_LIST_MS, "its images",
	    (ProtobufCMessage **)out, errmsg);
}

/* merge_nodes: every available node's images (named `name`; "" all)
 * into r; `holders` (optional) gets the ids of nodes that hold `name`.
 * A node that does not answer is logged and left out. */
static int
merge_nodes(struct moat_rpc_call *call, struct moat_travel *t,
    Moat__V1__ImageList *r, const char *name, char ***holders,
    size_t *n_holders)
{
	struct moat_node_id *ids = NULL;
	size_t n = 0;
	int rv = MOAT_OK;

	if (moat_nodes_available_ids(t->nodes, &ids, &n) != MOAT_OK)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < n && rv == MOAT_OK; i++) {
		Moat__V1__ImageList *l = NULL;
		char *msg = NULL;

		if (node_images(t, &ids[i], moat_gw_tenant(call), name,
		        call->request_id, &l, &msg) != MOAT_OK) {
			moat_warn(call->request_id, "images of node %s: %s",
			    ids[i].s, msg ? msg : "");
			free(msg);
			continue;
		}
		for (size_t k = 0; rv == MOAT_OK && k < l->n_images; k++) {
			const Moat__V1__ImageInfo *in = l->images[k];
			Moat__V1__ImageInfo *e;

			if (name[0] != '\0' && strcmp(in->name, name) != 0)
				continue;
			if ((e = entry_of(r, in->name)) == NULL ||
			    !merge_node(e, in, ids[i].s) ||
			    (holders != NULL &&
			        !str_add(holders, n_holders, ids[i].s)))
				rv = MOAT_RESOURCE_EXHAUSTED;
		}
		moat__v1__image_list__free_unpacked(l, NULL);
	}
	free(ids);
	return rv;
}

int
moat_images_list(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ListImagesRequest *req =
	    (const Moat__V1__ListImagesRequest *)request;
	Moat__V1__ImageList *r = (Moat__V1__ImageList *)reply;
	struct moat_travel t;

	if (req->name[0] != '\0' && !image_name_ok(req->name))
		return bad_name(call, "ListImages", req->name);
	moat_gateway_travel(call->service_ctx, &t);
	if (merge_nodes(call, &t, r, req->name, NULL, NULL) != MOAT_OK ||
	    merge_snapd(call, t.rec, r, req->name[0] ? req->name : NULL) !=
	        MOAT_OK)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory listing the images");
	return MOAT_OK;
}

/* ---- PushImage, RemoveImage ---- */

static void
strs_free(char **list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(list[i]);
	free(list);
}

/* holders_of: the ids of the available nodes holding image `name`. */
static int
holders_of(struct moat_rpc_call *call, struct moat_travel *t, const char *name,
    char ***out, size_t *n)
{
	Moat__V1__ImageList r = MOAT__V1__IMAGE_LIST__INIT;
	int rv = merge_nodes(call, t, &r, name, out, n);

	for (size_t i = 0; i < r.n_images; i++)
		moat__v1__image_info__free_unpacked(r.images[i], NULL);
	free(r.images);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;
}

int
moat_images_push(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ImageRef *ref = (const Moat__V1__ImageRef *)request;
	struct moat_travel t;
	struct moat_node_id node;
	char **holders = NULL, what[96];
	size_t n = 0;
	int rv;

	if ((rv = moat_gw_operator_check(call, "PushImage")) != MOAT_OK)
		return rv;
	if (!image_name_ok(ref->name))
		return bad_name(call, "PushImage", ref->name);
	moat_gateway_travel(call->service_ctx, &t);
	if (ref->node_id[0] != '\0') {
		if (!moat_node_id_set(&node, ref->node_id) ||
		    !moat_nodes_is_available(t.nodes, &node))
			return moat_rpc_error(call, MOAT_UNAVAILABLE,
			    "PushImage: node %.80s is unknown or does not "
			    "answer: `moat node ls` shows the nodes",
			    ref->node_id);
	} else {
		if ((rv = holders_of(call, &t, ref->name, &holders, &n)) !=
		    MOAT_OK)
			return rv;
		if (n == 0 || !moat_node_id_set(&node, holders[0])) {
			strs_free(holders, n);
			return moat_rpc_error(call, MOAT_NOT_FOUND,
			    "PushImage: no available node holds image %s: "
			    "`moat image ls` lists the images and their "
			    "nodes",
			    ref->name);
		}
		strs_free(holders, n);
	}
	snprintf(what, sizeof(what), "image %s", ref->name);
	/* A push moves gigabytes to snapd: no worker waits for it. */
	return moat_forward_node_async(t.fw, call, &node, what, call->payload,
	    call->payload_len, reply->descriptor);
}

/* users_of: the known sandboxes (every node's, every tenant's: the
 * inventory) running image `name`: their count and the first
 * USERS_NAMED ids in `names` (size bytes). */
static size_t
users_of(struct moat_inventory *inv, const char *name, char *names,
    size_t size)
{
	Moat__V1__Sandbox **all = NULL;
	size_t n = 0, users = 0, len = 0;

	names[0] = '\0';
	if (moat_inventory_unavailable(inv, NULL, NULL, 0, &all, &n) !=
	    MOAT_OK)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(all[i]->image, name) == 0 && users++ < USERS_NAMED)
			len += (size_t)snprintf(names + len,
			    len < size ? size - len : 0, "%s%s (tenant %s)",
			    len ? ", " : "", all[i]->id, all[i]->tenant);
		moat__v1__sandbox__free_unpacked(all[i], NULL);
	}
	free(all);
	return users;
}

/* snapd_users_of: moat-snapd's snapshots of any tenant whose image is
 * `name` (one page, all_tenants): their count (USERS_NAMED + 1 at most)
 * and the first USERS_NAMED in `names`. A snapd that does not answer
 * counts as none (logged): the nodes still refuse for their own. */
static size_t
snapd_users_of(struct moat_rpc_call *call, struct moat_record *rec,
    const char *name, char *names, size_t size)
{
	Moat__V1__ListSnapshotsRequest req =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__ListSnapshotsReply *r = NULL;
	size_t users = 0, len = 0;
	char *msg = NULL;

	names[0] = '\0';
	if (rec->snapd == NULL)
		return 0;
	req.tenant = (char *)MOAT_IMAGES_TENANT;
	req.all_tenants = true;
	req.image_id = (char *)name;
	req.page_size = USERS_NAMED + 2; /* itself, if listed, and one more */
	if (moat_snapshots_snapd_call(rec, "ListSnapshots", &req.base,
	        &moat__v1__list_snapshots_reply__descriptor,
	        (ProtobufCMessage **)&r, moat_rpc_now_ms() + SNAPD_LIST_MS,
	        &msg) != MOAT_OK) {
		moat_warn(call->request_id,
		    "RemoveImage: cannot ask moat-snapd which snapshots use "
		    "image %s: %s",
		    name, msg ? msg : "");
		free(msg);
		return 0;
	}
	for (size_t i = 0; i < r->n_snapshots; i++) {
		const Moat__V1__SnapshotInfo *s = r->snapshots[i];

		/* The image's own entry is no user. */
		if (strcmp(s->tenant, MOAT_IMAGES_TENANT) == 0)
			continue;
		if (users++ < USERS_NAMED)
			len += (size_t)snprintf(names + len,
			    len < size ? size - len : 0, "%s%s (tenant %s)",
			    len ? ", " : "", s->id, s->tenant);
	}
	moat__v1__list_snapshots_reply__free_unpacked(r, NULL);
	return users;
}

/* remove_on_nodes: RemoveImage of `name` on each holder; those done go
 * in r->nodes. A refusal stops there (its error after moat_rpc_error,
 * naming the nodes done already). */
static int
remove_on_nodes(struct moat_rpc_call *call, struct moat_travel *t,
    const char *name, char **holders, size_t n, Moat__V1__RemoveImageReply *r)
{
	Moat__V1__ImageRef one = MOAT__V1__IMAGE_REF__INIT;
	int rv = MOAT_OK;

	one.name = (char *)name;
	for (size_t i = 0; i < n && rv == MOAT_OK; i++) {
		Moat__V1__RemoveImageReply *nr = NULL;
		struct moat_node_id node;
		char *msg = NULL;

		if (!moat_node_id_set(&node, holders[i]))
			continue;
		one.node_id = node.s;
		rv = moat_forward_node_call(t->fw, &node, moat_gw_tenant(call),
		    "RemoveImage", &one.base,
		    &moat__v1__remove_image_reply__descriptor,
		    call->request_id, call->deadline_ms, "its image copy",
		    (ProtobufCMessage **)&nr, &msg);
		if (rv != MOAT_OK) {
			rv = moat_rpc_error(call, rv,
			    "RemoveImage: node %s kept its copy of %s: "
			    "%s%s%s%s",
			    node.s, name, msg ? msg : "",
			    r->n_nodes ? " (removed already on " : "",
			    r->n_nodes ? r->nodes[0] : "",
			    r->n_nodes ?
			        r->n_nodes > 1 ? " and others)" : ")" :
			        "");
			free(msg);
			break;
		}
		r->freed_bytes += nr->freed_bytes;
		moat__v1__remove_image_reply__free_unpacked(nr, NULL);
		if (!str_add(&r->nodes, &r->n_nodes, node.s))
			rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory");
	}
	return rv;
}

/* remove_stored: moat-snapd's entry of image `name` deleted (none is
 * fine); what it freed added to r. */
static int
remove_stored(struct moat_rpc_call *call, struct moat_record *rec,
    const char *name, Moat__V1__RemoveImageReply *r)
{
	Moat__V1__ImageList l = MOAT__V1__IMAGE_LIST__INIT;
	Moat__V1__DeleteSnapshotRequest del =
	    MOAT__V1__DELETE_SNAPSHOT_REQUEST__INIT;
	Moat__V1__DeleteSnapshotReply *dr = NULL;
	char *msg = NULL;
	int rv = merge_snapd(call, rec, &l, name);

	del.tenant = (char *)MOAT_IMAGES_TENANT;
	for (size_t i = 0; rv == MOAT_OK && i < l.n_images; i++) {
		if (l.images[i]->snapshot_id[0] == '\0')
			continue;
		del.id = l.images[i]->snapshot_id;
		rv = moat_snapshots_snapd_call(rec, "DeleteSnapshot",
		    &del.base, &moat__v1__delete_snapshot_reply__descriptor,
		    (ProtobufCMessage **)&dr, call->deadline_ms, &msg);
		if (rv == MOAT_NOT_FOUND) {
			free(msg);
			msg = NULL;
			rv = MOAT_OK;
			continue;
		}
		if (rv != MOAT_OK)
			break;
		r->stored_removed = true;
		r->freed_bytes += dr->freed_bytes;
		moat__v1__delete_snapshot_reply__free_unpacked(dr, NULL);
	}
	for (size_t i = 0; i < l.n_images; i++)
		moat__v1__image_info__free_unpacked(l.images[i], NULL);
	free(l.images);
	if (rv != MOAT_OK) {
		rv = moat_rpc_error(call, rv,
		    "RemoveImage: the nodes dropped %s but its moat-snapd "
		    "entry stays: %s; run `moat image rm %s` again",
		    name, msg ? msg : "out of memory", name);
		free(msg);
	}
	return rv;
}

int
moat_images_remove(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ImageRef *ref = (const Moat__V1__ImageRef *)request;
	Moat__V1__RemoveImageReply *r = (Moat__V1__RemoveImageReply *)reply;
	struct moat_travel t;
	struct moat_forward *fw;
	char **holders = NULL, users[512];
	size_t n = 0, n_users;
	int rv;

	if ((rv = moat_gw_operator_check(call, "RemoveImage")) != MOAT_OK)
		return rv;
	if (!image_name_ok(ref->name))
		return bad_name(call, "RemoveImage", ref->name);
	if (strcmp(ref->name, "default") == 0)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "RemoveImage: \"default\" is the image every sandbox "
		    "without --image runs: it is never removed (build another "
		    "and remove that instead)");
	moat_gateway_travel(call->service_ctx, &t);
	fw = t.fw;
	if ((n_users = users_of(fw->inv, ref->name, users, sizeof(users))) > 0)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "RemoveImage: %zu sandbox(es) run image %s: %s%s; "
		    "destroy them first (`moat sandbox rm ID`)",
		    n_users, ref->name, users,
		    n_users > USERS_NAMED ? " and more" : "");
	if ((n_users = snapd_users_of(call, t.rec, ref->name, users,
	         sizeof(users))) > 0)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "RemoveImage: %s%zu snapshot(s) in moat-snapd were taken "
		    "of image %s: %s; delete them first (`moat snapshot rm "
		    "ID` or `moat session rm` as their tenant)",
		    n_users > USERS_NAMED ? "at least " : "", n_users,
		    ref->name, users);
	if ((rv = holders_of(call, &t, ref->name, &holders, &n)) != MOAT_OK)
		return rv;
	rv = remove_on_nodes(call, &t, ref->name, holders, n, r);
	strs_free(holders, n);
	if (rv == MOAT_OK)
		rv = remove_stored(call, t.rec, ref->name, r);
	if (rv == MOAT_OK && r->n_nodes == 0 && !r->stored_removed)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "RemoveImage: no node and no moat-snapd entry holds "
		    "image %s: `moat image ls` lists the images",
		    ref->name);
	if (rv == MOAT_OK)
		moat_info(call->request_id,
		    "image %s removed by tenant %s: %zu node(s)%s, %llu "
		    "bytes freed",
		    ref->name, moat_gw_tenant(call), r->n_nodes,
		    r->stored_removed ? " and moat-snapd" : "",
		    (unsigned long long)r->freed_bytes);
	return rv;
}
