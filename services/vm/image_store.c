/*
 * image_store.c: this node's images as the API sees them (issue 17):
 * ImageInfo from a manifest, PushImage into moat-snapd (a snapshot of
 * tenant MOAT_IMAGES_TENANT labelled kind=image, name, image_id, source;
 * the files as artifacts cut with snapshot pushes' chunker, so images
 * share chunks with each other), ListImages and RemoveImage. Not for:
 * pulls (image_pull.c), builds (image_build.c) or the image files'
 * checks (verify.c).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "image.h"
#include "image_store.h"
#include "image_store_internal.h"
#include "moat/chunk.h"
#include "moat/images.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "sandbox.h"
#include "snap_client.h"
#include "snapshot_meta.h"
#include "snapshot_push.h"
#include "templates.h"
#include "verify.h"

const char *const vmd_image_files[VMD_IMAGE_N_FILES] = MOAT_IMAGE_FILES;

#define MANIFEST_MAX (1u << 20)
#define REMOVE_USERS_NAMED 5

void
vmd_image_set_str(char **field, const char *v)
{
	char *dup = strdup(v);

	/* An unset field is protobuf-c's shared empty string: not freed. */
	if (dup == NULL)
		return;
	if (*field != protobuf_c_empty_string)
		free(*field);
	*field = dup;
}

bool
vmd_image_find_hex_id(const char *msg, char out[65])
{
	size_t run = 0;

	for (const char *p = msg; p != NULL && *p != '\0'; p++) {
		bool hex = (*p >= '0' && *p <= '9') ||
		    (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F');

		run = hex ? run + 1 : 0;
		if (run == 64 &&
		    !((p[1] >= '0' && p[1] <= '9') ||
		        (p[1] >= 'a' && p[1] <= 'f') ||
		        (p[1] >= 'A' && p[1] <= 'F'))) {
			for (size_t i = 0; i < 64; i++) {
				char c = p[-63 + (ptrdiff_t)i];
				out[i] = c >= 'A' && c <= 'F' ? c + 32 : c;
			}
			out[64] = '\0';
			return true;
		}
	}
	return false;
}

int
vmd_image_manifest_id(const char *dir, char id[65], char **text, size_t *len,
    char **errmsg)
{
	char *path = moat_asprintf("%s/manifest.json", dir);
	struct moat_chunk_id sum;
	char *buf = NULL;
	size_t n = 0;
	int rv;

	if (path == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if ((rv = moat_read_file(path, MANIFEST_MAX, &buf, &n)) != 0) {
		*errmsg = moat_asprintf("%s: %s", path, strerror(rv));
		free(path);
		return rv == ENOENT ? MOAT_NOT_FOUND :
		                      MOAT_FAILED_PRECONDITION;
	}
	free(path);
	moat_chunk_hash(buf, n, &sum);
	moat_chunk_id_hex(&sum, id);
	if (text != NULL) {
		*text = buf;
		*len = n;
	} else {
		free(buf);
	}
	return MOAT_OK;
}

/* A manifest's array of strings into a repeated string field. */
static int
strings_from(json_t *arr, char ***out, size_t *n)
{
	size_t i;
	json_t *v;

	*out = NULL;
	*n = 0;
	if (!json_is_array(arr) || json_array_size(arr) == 0)
		return MOAT_OK;
	if ((*out = calloc(json_array_size(arr), sizeof(**out))) == NULL)
		return MOAT_INTERNAL;
	json_array_foreach (arr, i, v) {
		if (json_is_string(v) &&
		    ((*out)[(*n)++] = strdup(json_string_value(v))) == NULL)
			return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* "2026-12-05T11:50:36Z" as unix ms; 0 when it is not that. */
static uint64_t
iso_ms(const char *s)
{
	struct tm tm;
	const char *end;

	memset(&tm, 0, sizeof(tm));
	if (s == NULL || (end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm)) == NULL)
		return 0;
	return (uint64_t)timegm(&tm) * 1000u;
}

int
vmd_image_info_dir(const char *dir, const char *name, Moat__V1__ImageInfo *out,
    char **errmsg)
{
	char id[65], *text = NULL;
	json_t *root, *src;
	size_t len = 0;
	int rv;

	if ((rv = vmd_image_manifest_id(dir, id, &text, &len, errmsg)) !=
	    MOAT_OK)
		return rv;
	root = json_loadb(text, len, 0, NULL);
	free(text);
	if (!json_is_object(root)) {
		json_decref(root);
		*errmsg = moat_asprintf("image \"%s\": its manifest.json is "
		                        "not a JSON object: build it again",
		    name);
		return MOAT_FAILED_PRECONDITION;
	}
	out->name = strdup(name);
	out->id = strdup(id);
	src = json_object_get(root, "source");
	out->source =
	    strdup(json_is_string(src) ? json_string_value(src) : "default");
	out->created_unix_ms =
	    iso_ms(json_string_value(json_object_get(root, "created")));
	for (size_t i = 0; i < VMD_IMAGE_N_FILES; i++) {
		char *p = moat_asprintf("%s/%s", dir, vmd_image_files[i]);
		struct stat st;

		if (p != NULL && stat(p, &st) == 0)
			out->size_bytes += (uint64_t)st.st_size;
		free(p);
	}
	rv = strings_from(json_object_get(root, "installed_packages"),
	    &out->packages, &out->n_packages);
	if (rv == MOAT_OK)
		rv = strings_from(json_object_get(root, "languages"),
		    &out->languages, &out->n_languages);
	json_decref(root);
	if (rv != MOAT_OK || !out->name || !out->id || !out->source) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

int
vmd_image_info(struct vmd *vmd, struct moat_rpc_call *call, const char *name,
    Moat__V1__ImageInfo *out)
{
	char *dir = moat_asprintf("%s/%s", vmd->cfg.image_dir, name);
	char *err = NULL;
	int rv;

	if (dir == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	rv = vmd_image_info_dir(dir, name, out, &err);
	free(dir);
	if (rv != MOAT_OK)
		rv = moat_rpc_error(call, rv, "%s", err ? err : "?");
	free(err);
	if (rv == MOAT_OK)
		vmd_image_index_fill(vmd, name, out);
	return rv;
}

int
vmd_image_name_check(struct vmd *vmd, struct moat_rpc_call *call,
    const char *name, bool present)
{
	if (name == NULL || !vmd_image_name_ok(name))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "image name \"%s\" is not valid: use 1 to 64 letters, "
		    "digits, '-', '_' and '.', not starting with '.'",
		    name ? name : "");
	if (present && !vmd_image_present(vmd, name))
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "image \"%s\" is not on node %s (looked in %s/%s): list "
		    "this node's images (ListImages) or pull it (PullImage)",
		    name, vmd->cfg.node_id, vmd->cfg.image_dir, name);
	return MOAT_OK;
}

int
vmd_image_list_entries(struct vmd *vmd, const char *name,
    Moat__V1__SnapshotInfo ***out, size_t *n, void **hold, char **errmsg)
{
	Moat__V1__ListSnapshotsRequest req =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__SnapLabel l[2], *lp[2] = { &l[0], &l[1] };
	ProtobufCMessage *reply = NULL;
	int rv;

	moat__v1__snap_label__init(&l[0]);
	moat__v1__snap_label__init(&l[1]);
	l[0].key = (char *)MOAT_IMAGE_LABEL_KIND;
	l[0].value = (char *)MOAT_IMAGE_KIND;
	l[1].key = (char *)MOAT_IMAGE_LABEL_NAME;
	l[1].value = (char *)name;
	req.tenant = (char *)MOAT_IMAGES_TENANT;
	req.page_size = 1000;
	req.labels = lp;
	req.n_labels = 2;
	/* Entries of one name are few (a push deletes the older ones
	 * after committing): one page holds them all. */
	if ((rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "ListSnapshots",
	         &req.base, &moat__v1__list_snapshots_reply__descriptor,
	         &reply, NULL, errmsg)) != MOAT_OK)
		return rv;
	*out = ((Moat__V1__ListSnapshotsReply *)reply)->snapshots;
	*n = ((Moat__V1__ListSnapshotsReply *)reply)->n_snapshots;
	*hold = reply;
	return MOAT_OK;
}

const char *
vmd_image_label(const Moat__V1__SnapshotInfo *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i]->key, key) == 0)
			return s->labels[i]->value;
	return "";
}

/* Pushes each file of the image that exists as an artifact and commits
 * them; *info is snapd's answer (the caller frees). */
static int
push_commit(struct vmd *vmd, const char *name, const char *dir, const char *id,
    const char *source, Moat__V1__SnapshotInfo **info, char **errmsg)
{
	Moat__V1__CommitManifestRequest req =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__SnapArtifact arts[VMD_IMAGE_N_FILES];
	Moat__V1__SnapArtifact *ap[VMD_IMAGE_N_FILES];
	Moat__V1__SnapLabel l[5], *lp[5];
	char mtimes[512] = "";
	const char *kv[5][2] = { { MOAT_IMAGE_LABEL_KIND, MOAT_IMAGE_KIND },
		{ MOAT_IMAGE_LABEL_NAME, name }, { MOAT_IMAGE_LABEL_ID, id },
		{ MOAT_IMAGE_LABEL_SOURCE, source },
		{ MOAT_IMAGE_LABEL_MTIMES, mtimes } };
	ProtobufCMessage *reply = NULL;
	size_t n = 0;
	int rv = MOAT_OK;

	for (size_t i = 0; i < VMD_IMAGE_N_FILES && rv == MOAT_OK; i++) {
		char *p = moat_asprintf("%s/%s", dir, vmd_image_files[i]);
		struct stat st;

		if (p == NULL) {
			rv = MOAT_INTERNAL;
			*errmsg = strdup("out of memory");
		} else if (stat(p, &st) == 0) {
			size_t used = strlen(mtimes);

			snprintf(mtimes + used, sizeof(mtimes) - used,
			    "%s%s=%jd.%09ld", used ? "," : "",
			    vmd_image_files[i], (intmax_t)st.st_mtim.tv_sec,
			    st.st_mtim.tv_nsec);
			rv = moat_snap_push_file(vmd->snapd,
			    MOAT_IMAGES_TENANT, vmd_image_files[i], p,
			    VMD_IMAGE_CHUNK_SIZE, &arts[n], NULL, errmsg);
			ap[n] = &arts[n];
			n++;
		}
		free(p);
	}
	for (size_t i = 0; i < 5; i++) {
		moat__v1__snap_label__init(&l[i]);
		l[i].key = (char *)kv[i][0];
		l[i].value = (char *)kv[i][1];
		lp[i] = &l[i];
	}
	/* snapd's fields for a VM snapshot, which it requires: an image
	 * boots on any VMM and shape, so these say nothing of it. */
	req.tenant = (char *)MOAT_IMAGES_TENANT;
	req.vmm = (char *)vmd->vmm->name;
	req.vcpus = 1;
	req.memory_mib = 1;
	req.image_id = (char *)id;
	req.parent_id = (char *)"";
	req.labels = lp;
	req.n_labels = 5;
	req.artifacts = ap;
	req.n_artifacts = n;
	if (rv == MOAT_OK &&
	    (rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE,
	         "CommitManifest", &req.base,
	         &moat__v1__snapshot_info__descriptor, &reply, NULL,
	         errmsg)) == MOAT_OK) {
		*info = (Moat__V1__SnapshotInfo *)reply;
		vmd_image_index_add(vmd, name, id, (*info)->id,
		    (const Moat__V1__SnapArtifact *const *)ap, n);
	}
	for (size_t i = 0; i < n; i++)
		moat_snap_artifact_clear(&arts[i]);
	return rv;
}

/* Deletes the entries of `name` other than `keep` (older ids). */
static void
push_drop_older(struct vmd *vmd, uint64_t rid, Moat__V1__SnapshotInfo **e,
    size_t n, const char *keep)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t freed = 0;
		char *err = NULL;

		if (strcmp(e[i]->id, keep) == 0)
			continue;
		if (vmd_snapshot_delete_remote(vmd, MOAT_IMAGES_TENANT,
		        e[i]->id, &freed, &err) != MOAT_OK)
			moat_warn(rid,
			    "image: older moat-snapd entry %s not deleted: "
			    "%s",
			    e[i]->id, err ? err : "?");
		free(err);
	}
}

static int
snapd_needed(struct vmd *vmd, struct moat_rpc_call *call, const char *what)
{
	if (vmd->snapd == NULL)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "%s needs moat-snapd: node %s has no [vmd] snapd set",
		    what, vmd->cfg.node_id);
	return MOAT_OK;
}

int
vmd_image_push(struct vmd *vmd, struct moat_rpc_call *call, const char *name,
    Moat__V1__ImageInfo *out)
{
	Moat__V1__SnapshotInfo **e = NULL, *info = NULL;
	void *hold = NULL;
	char *dir = NULL, *err = NULL;
	size_t n = 0;
	uint64_t t0 = moat_rpc_now_ms();
	int rv;

	if ((rv = snapd_needed(vmd, call, "PushImage")) != MOAT_OK ||
	    (rv = vmd_image_name_check(vmd, call, name, true)) != MOAT_OK ||
	    (rv = vmd_image_check(vmd, call, name)) != MOAT_OK ||
	    (rv = vmd_image_info(vmd, call, name, out)) != MOAT_OK)
		return rv;
	if ((dir = moat_asprintf("%s/%s", vmd->cfg.image_dir, name)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	if ((rv = vmd_snapd_ping(vmd, &err)) != MOAT_OK ||
	    (rv = vmd_image_list_entries(vmd, name, &e, &n, &hold, &err)) !=
	        MOAT_OK)
		goto fail;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(vmd_image_label(e[i], MOAT_IMAGE_LABEL_ID),
		        out->id) != 0)
			continue;
		/* Stored already: nothing to put. */
		out->stored = true;
		vmd_image_set_str(&out->snapshot_id, e[i]->id);
		goto out;
	}
	if ((rv = push_commit(vmd, name, dir, out->id, out->source, &info,
	         &err)) != MOAT_OK)
		goto fail;
	/* The new entry is there: readers always find one of the name. */
	push_drop_older(vmd, call->request_id, e, n, info->id);
	out->stored = true;
	out->stored_bytes = info->stored_bytes;
	vmd_image_set_str(&out->snapshot_id, info->id);
	moat_info(call->request_id,
	    "image %s (id %.16s...) stored in moat-snapd as %s: %" PRIu64
	    " B new of %" PRIu64 " B (%" PRIu64 " ms)",
	    name, out->id, info->id, info->stored_bytes, info->logical_bytes,
	    moat_rpc_now_ms() - t0);
	goto out;
fail:
	rv = moat_rpc_error(call, rv,
	    "image %s not stored in moat-snapd %s: %s%s", name,
	    vmd->cfg.snapd_url, err ? err : "?",
	    rv == MOAT_UNAVAILABLE ? " (is moat-snapd running?)" : "");
out:
	if (info != NULL)
		protobuf_c_message_free_unpacked(&info->base, NULL);
	if (hold != NULL)
		protobuf_c_message_free_unpacked(hold, NULL);
	free(dir);
	free(err);
	return rv;
}

int
vmd_images_list_rpc(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ListImagesRequest *req, Moat__V1__ImageList *reply)
{
	char **names = NULL;
	size_t n = 0;
	int rv = MOAT_OK;

	(void)vmd_images_list(vmd, &names, &n);
	if (n > 0 &&
	    (reply->images = calloc(n, sizeof(*reply->images))) == NULL)
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		Moat__V1__ImageInfo *info;
		char *dir, *err = NULL;

		if (rv != MOAT_OK ||
		    (req->name[0] != '\0' &&
		        strcmp(req->name, names[i]) != 0)) {
			free(names[i]);
			continue;
		}
		if ((info = malloc(sizeof(*info))) == NULL ||
		    (dir = moat_asprintf("%s/%s", vmd->cfg.image_dir,
		         names[i])) == NULL) {
			free(info);
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
			free(names[i]);
			continue;
		}
		moat__v1__image_info__init(info);
		reply->images[reply->n_images++] = info;
		/* An image whose manifest does not read is listed by name. */
		if (vmd_image_info_dir(dir, names[i], info, &err) != MOAT_OK &&
		    info->name[0] == '\0')
			vmd_image_set_str(&info->name, names[i]);
		vmd_image_index_fill(vmd, names[i], info);
		free(err);
		free(dir);
		free(names[i]);
	}
	free(names);
	return rv;
}

/* Up to REMOVE_USERS_NAMED sandboxes and local snapshots (not
 * templates) of this node that use `image`, as "sandbox X, snapshot Y";
 * *count all of them. Heap, "" when none. */
static char *
image_users(struct vmd *vmd, const char *image, size_t *count)
{
	char *list = strdup(""), *root, *next;
	struct dirent *de;
	DIR *d;

	*count = 0;
	pthread_mutex_lock(&vmd->mu);
	for (struct sandbox *sb = vmd->sandboxes; sb && list; sb = sb->next) {
		if (sb->image == NULL || strcmp(sb->image, image) != 0)
			continue;
		if (++*count <= REMOVE_USERS_NAMED) {
			next = moat_asprintf("%s%ssandbox %s", list,
			    list[0] ? ", " : "", sb->id.str);
			free(list);
			list = next;
		}
	}
	pthread_mutex_unlock(&vmd->mu);
	root = moat_asprintf("%s/snapshots", vmd->cfg.state_dir);
	d = root ? opendir(root) : NULL;
	while (d != NULL && list != NULL && (de = readdir(d)) != NULL) {
		Moat__V1__LocalSnapshot *m = NULL;
		char *dir = de->d_name[0] == '.' ?
		    NULL :
		    moat_asprintf("%s/%s", root, de->d_name);

		if (dir != NULL && vmd_snapshot_read_meta(dir, &m) == 0 &&
		    !m->template_ && strcmp(m->image, image) == 0 &&
		    ++*count <= REMOVE_USERS_NAMED) {
			next = moat_asprintf("%s%ssnapshot %s", list,
			    list[0] ? ", " : "", m->snapshot_id);
			free(list);
			list = next;
		}
		if (m != NULL)
			moat__v1__local_snapshot__free_unpacked(m, NULL);
		free(dir);
	}
	if (d != NULL)
		closedir(d);
	free(root);
	return list;
}

int
vmd_image_remove(struct vmd *vmd, struct moat_rpc_call *call, const char *name,
    Moat__V1__RemoveImageReply *reply)
{
	char *dir = NULL, *gone = NULL, *users;
	size_t count = 0;
	int rv;

	if ((rv = vmd_image_name_check(vmd, call, name, true)) != MOAT_OK)
		return rv;
	if ((users = image_users(vmd, name, &count)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	if (count > 0) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "image %s is in use on node %s by %zu: %s%s: destroy "
		    "those sandboxes and delete those snapshots first",
		    name, vmd->cfg.node_id, count, users,
		    count > REMOVE_USERS_NAMED ? ", ..." : "");
		free(users);
		return rv;
	}
	free(users);
	dir = moat_asprintf("%s/%s", vmd->cfg.image_dir, name);
	gone = moat_asprintf("%s/.%s.rm", vmd->cfg.image_dir, name);
	if (dir == NULL || gone == NULL) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	vmd_templates_drop_image(vmd, name);
	(void)moat_rm_rf(gone);
	/* One rename: a create sees the whole image or none. */
	if (rename(dir, gone) != 0) {
		rv = moat_rpc_error(call, MOAT_INTERNAL,
		    "image %s: cannot move %s aside: %s", name, dir,
		    strerror(errno));
		goto out;
	}
	(void)moat_rm_rf(gone);
	vmd_image_index_forget(vmd, name);
	if ((reply->nodes = calloc(1, sizeof(*reply->nodes))) != NULL &&
	    (reply->nodes[0] = strdup(vmd->cfg.node_id)) != NULL)
		reply->n_nodes = 1;
	moat_info(call->request_id, "image %s removed from node %s", name,
	    vmd->cfg.node_id);
out:
	free(dir);
	free(gone);
	return rv;
}
