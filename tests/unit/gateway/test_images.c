/*
 * test_images.c: the Gateway's image calls (issue 17) on a real gateway
 * in-process with API keys on, two fake nodes and a fake moat-snapd:
 * build, push and remove are for operator tenants only; ListImages
 * merges snapd's entries with the nodes' lists; a build goes to a node
 * and GetImageBuild to the same node; RemoveImage is refused while a
 * sandbox runs the image (naming it), while a snapshot of any tenant in
 * snapd was taken of it, for "default" and when a node refuses, and otherwise removes every copy and snapd's entry; a
 * sandbox of an image goes to the node holding it.
 * Not for: vmd's side of images (services/vm) or placement on its own
 * (test_placement.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "auth.h"
#include "fake_node.h"
#include "gateway.h"
#include "moat/images.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapshot.pb-c.h"

static struct {
	char dir[64];
	char *survey_url, *listen_url, *snapd_url;
	struct moat_gateway *gw;
	struct moat_rpc_client *client;
	struct moat_rpc_server *snapd;
	struct fake_node a, b;
	char *key_op, *key_acme; /* tenants "default" (operator), "acme" */
	char deleted[128];       /* the last snapd DeleteSnapshot */
	char snapd_tenant[64];   /* the last snapd call's tenant */
} E;

/* ---- a fake moat-snapd: two image entries in moat.images ---- */

static Moat__V1__SnapshotInfo *
snap_entry(const char *id, const char *name)
{
	Moat__V1__SnapshotInfo *s = calloc(1, sizeof(*s));

	moat__v1__snapshot_info__init(s);
	s->id = strdup(id);
	s->tenant = strdup(MOAT_IMAGES_TENANT);
	s->logical_bytes = 5000;
	s->stored_bytes = 4000;
	s->created_ms = 1700000000000ull;
	s->labels = calloc(3, sizeof(*s->labels));
	for (int i = 0; i < 3; i++) {
		Moat__V1__SnapLabel *l = calloc(1, sizeof(*l));

		moat__v1__snap_label__init(l);
		l->key = strdup(i == 0 ? MOAT_IMAGE_LABEL_KIND :
		        i == 1         ? MOAT_IMAGE_LABEL_NAME :
		                         MOAT_IMAGE_LABEL_ID);
		l->value = strdup(i == 0 ? MOAT_IMAGE_KIND :
		        i == 1           ? name :
		                           "snapd-id");
		s->labels[s->n_labels++] = l;
	}
	return s;
}

static int
snapd_handler(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	snprintf(E.snapd_tenant, sizeof(E.snapd_tenant), "%s", call->tenant);
	if (strcmp(call->method, "ListSnapshots") == 0) {
		const Moat__V1__ListSnapshotsRequest *q =
		    (const void *)request;
		Moat__V1__ListSnapshotsReply *r = (void *)reply;
		const char *only = NULL;

		if (q->all_tenants) {
			/* A user of "snapped" in tenant acme, and the
			 * image's own entry (no user). */
			r->snapshots = calloc(2, sizeof(*r->snapshots));
			if (strcmp(q->image_id, "snapped") != 0)
				return MOAT_OK;
			r->snapshots[r->n_snapshots] =
			    snap_entry("snap-user", "x");
			free(r->snapshots[r->n_snapshots]->tenant);
			r->snapshots[r->n_snapshots++]->tenant =
			    strdup("acme");
			r->snapshots[r->n_snapshots++] =
			    snap_entry("snap-own", "snapped");
			return MOAT_OK;
		}
		for (size_t i = 0; i < q->n_labels; i++)
			if (strcmp(q->labels[i]->key, MOAT_IMAGE_LABEL_NAME) ==
			    0)
				only = q->labels[i]->value;
		r->snapshots = calloc(2, sizeof(*r->snapshots));
		if (only == NULL || strcmp(only, "tools") == 0)
			r->snapshots[r->n_snapshots++] =
			    snap_entry("snap-tools", "tools");
		if (only == NULL || strcmp(only, "stored-only") == 0)
			r->snapshots[r->n_snapshots++] =
			    snap_entry("snap-stored", "stored-only");
		return MOAT_OK;
	}
	if (strcmp(call->method, "DeleteSnapshot") == 0) {
		const Moat__V1__DeleteSnapshotRequest *q =
		    (const void *)request;

		snprintf(E.deleted, sizeof(E.deleted), "%s", q->id);
		((Moat__V1__DeleteSnapshotReply *)reply)->freed_bytes = 4000;
		return MOAT_OK;
	}
	return moat_rpc_error(call, MOAT_UNIMPLEMENTED, "fake snapd");
}

static int
snapd_start(void)
{
	static struct moat_rpc_method rows[16];
	const ProtobufCServiceDescriptor *d = &moat__v1__snapshot__descriptor;
	struct moat_rpc_service svc = { .descriptor = d,
		.methods = rows,
		.n_methods = d->n_methods };
	char *errmsg = NULL;
	int rv;

	for (unsigned i = 0; i < d->n_methods && i < 16; i++)
		rows[i] = (struct moat_rpc_method){ d->methods[i].name,
			snapd_handler, false, false };
	rv = moat_rpc_server_start(&E.snapd, E.snapd_url, &svc, 2, &errmsg);
	if (rv != MOAT_OK)
		fprintf(stderr, "fake snapd: %s\n", errmsg);
	free(errmsg);
	return rv;
}

/* ---- calls ---- */

static int
call(const char *key, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, void *out, char **msg)
{
	struct moat_rpc_opts opts = { .timeout_ms = 10000, .auth = key };

	*msg = NULL;
	return moat_rpc_call(E.client, "moat.v1.Gateway", method, req, desc,
	    (ProtobufCMessage **)out, &opts, msg);
}

static int
available_nodes(void)
{
	Moat__V1__Node **list = NULL;
	size_t n = 0;
	int up = 0;

	if (moat_nodes_snapshot(moat_gateway_nodes(E.gw), &list, &n) !=
	    MOAT_OK)
		return 0;
	for (size_t i = 0; i < n; i++)
		up += list[i]->available && list[i]->n_images > 0;
	moat_nodes_snapshot_free(list, n);
	return up;
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	struct moat_auth *a = NULL;
	char *errmsg = NULL, id[MOAT_AUTH_KEY_ID_LEN + 1], sessiond[96];

	(void)state;
	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-images-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	assert_int_equal(moat_auth_open(&a, E.dir, &errmsg), MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "default", &E.key_op, id,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "acme", &E.key_acme, id,
	                     &errmsg),
	    MOAT_OK);
	moat_auth_close(a);
	E.survey_url = moat_asprintf("ipc://%s/survey.sock", E.dir);
	E.listen_url = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	E.snapd_url = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	assert_int_equal(snapd_start(), MOAT_OK);
	snprintf(sessiond, sizeof(sessiond), "ipc://%s/sessiond.sock", E.dir);
	opts.listen_url = E.listen_url;
	opts.survey_url = E.survey_url;
	opts.snapd_url = E.snapd_url;
	/* Nothing listens there: no call here records. */
	opts.sessiond_url = sessiond;
	opts.state_dir = E.dir;
	opts.survey_interval_ms = 100;
	opts.auth = true; /* operator-tenants: "default" only */
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	assert_int_equal(moat_rpc_client_open(&E.client, E.listen_url,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	assert_int_equal(fake_node_start(&E.b, "node-b", E.dir, E.survey_url),
	    0);
	fake_node_add_image(&E.b, "tools");
	for (int i = 0; i < 200 && available_nodes() < 2; i++)
		usleep(50000);
	assert_int_equal(available_nodes(), 2);
	usleep(300000); /* a survey round after "tools" was added */
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	moat_rpc_client_close(E.client);
	fake_node_halt(&E.a);
	fake_node_halt(&E.b);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	fake_node_stop(&E.b);
	moat_rpc_server_stop(E.snapd);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	free(E.snapd_url);
	free(E.key_op);
	free(E.key_acme);
	return 0;
}

static const Moat__V1__ImageInfo *
find(const Moat__V1__ImageList *l, const char *name)
{
	for (size_t i = 0; i < l->n_images; i++)
		if (strcmp(l->images[i]->name, name) == 0)
			return l->images[i];
	return NULL;
}

/* Build, push and remove are operator calls; listing is anyone's. */
static void
test_operator_only(void **state)
{
	Moat__V1__ImageBuildRequest b = MOAT__V1__IMAGE_BUILD_REQUEST__INIT;
	Moat__V1__ImageRef ref = MOAT__V1__IMAGE_REF__INIT;
	Moat__V1__ListImagesRequest lr = MOAT__V1__LIST_IMAGES_REQUEST__INIT;
	Moat__V1__ImageList *l = NULL;
	ProtobufCMessage *out = NULL;
	char *msg;

	(void)state;
	b.name = (char *)"x";
	b.spec = (char *)"[packages]\njq =\n";
	ref.name = (char *)"tools";
	assert_int_equal(call(E.key_acme, "StartImageBuild", &b.base,
	                     &moat__v1__image_build__descriptor, &out, &msg),
	    MOAT_PERMISSION_DENIED);
	assert_non_null(strstr(msg, "operator-tenants"));
	free(msg);
	assert_int_equal(call(E.key_acme, "RemoveImage", &ref.base,
	                     &moat__v1__remove_image_reply__descriptor, &out,
	                     &msg),
	    MOAT_PERMISSION_DENIED);
	free(msg);
	assert_int_equal(call(E.key_acme, "PushImage", &ref.base,
	                     &moat__v1__image_info__descriptor, &out, &msg),
	    MOAT_PERMISSION_DENIED);
	free(msg);
	assert_true(fake_node_has_image(&E.b, "tools"));
	assert_int_equal(E.a.builds + E.b.builds, 0);
	assert_int_equal(call(E.key_acme, "ListImages", &lr.base,
	                     &moat__v1__image_list__descriptor, &l, &msg),
	    MOAT_OK);
	assert_non_null(find(l, "default"));
	moat__v1__image_list__free_unpacked(l, NULL);
	free(msg);
}

/* One entry per name: the nodes holding it, snapd's stored flag and
 * entry, packages from a node's copy; snapd-only images listed. */
static void
test_list_merges_snapd_and_nodes(void **state)
{
	Moat__V1__ListImagesRequest lr = MOAT__V1__LIST_IMAGES_REQUEST__INIT;
	Moat__V1__ImageList *l = NULL;
	const Moat__V1__ImageInfo *e;
	char *msg;

	(void)state;
	assert_int_equal(call(E.key_op, "ListImages", &lr.base,
	                     &moat__v1__image_list__descriptor, &l, &msg),
	    MOAT_OK);
	free(msg);
	assert_int_equal(l->n_images, 3);
	assert_non_null(e = find(l, "default"));
	assert_int_equal(e->n_nodes, 2);
	assert_false(e->stored);
	assert_non_null(e = find(l, "tools"));
	assert_int_equal(e->n_nodes, 1);
	assert_string_equal(e->nodes[0], "node-b");
	assert_true(e->stored);
	assert_string_equal(e->snapshot_id, "snap-tools");
	assert_int_equal(e->stored_bytes, 4000);
	assert_string_equal(e->id, "id-of-tools"); /* the node's */
	assert_int_equal(e->n_packages, 2); /* every package, not the first */
	assert_string_equal(e->packages[0], "pkg-node-b=1");
	assert_string_equal(e->packages[1], "libc6=2.36");
	assert_non_null(e = find(l, "stored-only"));
	assert_int_equal(e->n_nodes, 0);
	assert_true(e->stored);
	assert_string_equal(e->id, "snapd-id");
	assert_int_equal(e->size_bytes, 5000);
	assert_int_equal(e->n_packages, 0);
	assert_string_equal(E.snapd_tenant, MOAT_IMAGES_TENANT);
	moat__v1__image_list__free_unpacked(l, NULL);
}

/* A build goes to a node (the one named, else one picked) and its
 * reply names it; GetImageBuild goes to that same node. */
static void
test_build_routed_to_its_node(void **state)
{
	Moat__V1__ImageBuildRequest b = MOAT__V1__IMAGE_BUILD_REQUEST__INIT;
	Moat__V1__ImageBuildRef ref = MOAT__V1__IMAGE_BUILD_REF__INIT;
	Moat__V1__ImageBuild *r = NULL, *g = NULL;
	char *msg;

	(void)state;
	b.name = (char *)"tiny";
	b.spec = (char *)"[packages]\njq =\n";
	b.node_id = (char *)"node-b";
	assert_int_equal(call(E.key_op, "StartImageBuild", &b.base,
	                     &moat__v1__image_build__descriptor, &r, &msg),
	    MOAT_OK);
	free(msg);
	assert_string_equal(r->node_id, "node-b");
	assert_string_equal(r->id, "build-1");
	assert_int_equal(E.b.builds, 1);
	assert_int_equal(E.a.builds, 0);
	ref.build_id = r->id;
	ref.node_id = r->node_id;
	ref.wait_ms = 1000;
	assert_int_equal(call(E.key_op, "GetImageBuild", &ref.base,
	                     &moat__v1__image_build__descriptor, &g, &msg),
	    MOAT_OK);
	free(msg);
	assert_int_equal(g->state,
	    MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_DONE);
	assert_string_equal(g->image->name, "tiny");
	assert_int_equal(E.b.build_polls, 1);
	assert_int_equal(E.a.build_polls, 0);
	assert_int_equal(E.b.last_wait_ms, 1000);
	moat__v1__image_build__free_unpacked(g, NULL);
	/* A wait the call's deadline (10 s here) would not outlast is cut
	 * so the node answers in time. */
	ref.wait_ms = 30000;
	assert_int_equal(call(E.key_op, "GetImageBuild", &ref.base,
	                     &moat__v1__image_build__descriptor, &g, &msg),
	    MOAT_OK);
	free(msg);
	assert_true(E.b.last_wait_ms > 0 && E.b.last_wait_ms <= 8000);
	moat__v1__image_build__free_unpacked(g, NULL);
	moat__v1__image_build__free_unpacked(r, NULL);

	/* No node named: one is picked, and named in the reply. */
	b.node_id = (char *)"";
	assert_int_equal(call(E.key_op, "StartImageBuild", &b.base,
	                     &moat__v1__image_build__descriptor, &r, &msg),
	    MOAT_OK);
	free(msg);
	assert_true(strcmp(r->node_id, "node-a") == 0 ||
	    strcmp(r->node_id, "node-b") == 0);
	assert_int_equal(E.a.builds + E.b.builds, 2);
	moat__v1__image_build__free_unpacked(r, NULL);

	/* Unknown nodes, bad names, a node gone. */
	b.node_id = (char *)"node-q";
	assert_int_equal(call(E.key_op, "StartImageBuild", &b.base,
	                     &moat__v1__image_build__descriptor, &r, &msg),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(msg, "node-q"));
	free(msg);
	b.node_id = (char *)"";
	b.name = (char *)"../etc";
	assert_int_equal(call(E.key_op, "StartImageBuild", &b.base,
	                     &moat__v1__image_build__descriptor, &r, &msg),
	    MOAT_INVALID_ARGUMENT);
	free(msg);
	ref.node_id = (char *)"node-gone";
	ref.build_id = (char *)"build-1";
	assert_int_equal(call(E.key_op, "GetImageBuild", &ref.base,
	                     &moat__v1__image_build__descriptor, &g, &msg),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(msg, "node-gone"));
	free(msg);
}

/* A sandbox of "tools" goes to node-b (it holds it; node-a has fewer
 * sandboxes after the other tests' none); while it runs, RemoveImage is
 * refused naming it; once destroyed, every copy and snapd's entry go.
 * "default" is never removed; a node's own refusal is passed on. */
static void
test_remove_refused_while_used(void **state)
{
	Moat__V1__CreateSandboxRequest c =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef sr = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ImageRef ref = MOAT__V1__IMAGE_REF__INIT;
	Moat__V1__RemoveImageReply *rr = NULL;
	Moat__V1__Sandbox *sb = NULL;
	ProtobufCMessage *out = NULL;
	char *msg;

	(void)state;
	fake_node_add_sandbox(&E.b, "other-1"); /* b is busier than a */
	c.image = (char *)"tools";
	assert_int_equal(call(E.key_op, "CreateSandbox", &c.base,
	                     &moat__v1__sandbox__descriptor, &sb, &msg),
	    MOAT_OK);
	free(msg);
	assert_string_equal(sb->node_id, "node-b");
	ref.name = (char *)"tools";
	assert_int_equal(call(E.key_op, "RemoveImage", &ref.base,
	                     &moat__v1__remove_image_reply__descriptor, &rr,
	                     &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, sb->id));
	free(msg);
	assert_true(fake_node_has_image(&E.b, "tools"));
	sr.sandbox_id = sb->id;
	assert_int_equal(call(E.key_op, "DestroySandbox", &sr.base,
	                     &moat__v1__empty__descriptor, &out, &msg),
	    MOAT_OK);
	free(msg);
	protobuf_c_message_free_unpacked(out, NULL);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	assert_int_equal(call(E.key_op, "RemoveImage", &ref.base,
	                     &moat__v1__remove_image_reply__descriptor, &rr,
	                     &msg),
	    MOAT_OK);
	free(msg);
	assert_int_equal(rr->n_nodes, 1);
	assert_string_equal(rr->nodes[0], "node-b");
	assert_true(rr->stored_removed);
	assert_int_equal(rr->freed_bytes, 1000 + 4000);
	assert_string_equal(E.deleted, "snap-tools");
	assert_false(fake_node_has_image(&E.b, "tools"));
	moat__v1__remove_image_reply__free_unpacked(rr, NULL);

	ref.name = (char *)"default";
	assert_int_equal(call(E.key_op, "RemoveImage", &ref.base,
	                     &moat__v1__remove_image_reply__descriptor, &rr,
	                     &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "never removed"));
	free(msg);
	assert_true(fake_node_has_image(&E.a, "default"));

	fake_node_add_image(&E.a, "old");
	snprintf(E.a.refuse_remove, sizeof(E.a.refuse_remove), "old");
	E.deleted[0] = '\0';
	ref.name = (char *)"old";
	assert_int_equal(call(E.key_op, "RemoveImage", &ref.base,
	                     &moat__v1__remove_image_reply__descriptor, &rr,
	                     &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "node-a"));
	assert_non_null(strstr(msg, "snap-1"));
	free(msg);
	assert_string_equal(E.deleted, "");

	/* A snapshot of another tenant in moat-snapd uses it. */
	fake_node_add_image(&E.a, "snapped");
	ref.name = (char *)"snapped";
	assert_int_equal(call(E.key_op, "RemoveImage", &ref.base,
	                     &moat__v1__remove_image_reply__descriptor, &rr,
	                     &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "snap-user (tenant acme)"));
	assert_null(strstr(msg, "snap-own"));
	free(msg);
	assert_true(fake_node_has_image(&E.a, "snapped"));
	assert_string_equal(E.deleted, "");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_operator_only),
		cmocka_unit_test(test_list_merges_snapd_and_nodes),
		cmocka_unit_test(test_build_routed_to_its_node),
		cmocka_unit_test(test_remove_refused_while_used),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
