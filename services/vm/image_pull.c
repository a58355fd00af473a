/*
 * image_pull.c: an image this node lacks, from moat-snapd (issue 17):
 * the newest entry labelled kind=image,name=NAME, each file written in
 * <image-dir>/.NAME.pull.XXXXXX from chunks verified here (holes for
 * zero chunks), the manifest's SHA-256 checked against the entry's
 * image_id and every file against the manifest, then one rename into
 * <image-dir>/NAME: a create sees a whole image or none, and a crashed
 * pull leaves only a .pull directory, removed at the next start.
 * Chunks that an image this node holds shares (the index below, from
 * those images' snapd entries) are read from local files and verified
 * like fetched ones; only the rest cross the wire. One pull per name at
 * a time: concurrent creates wait for it. Not for: pushing (image_store.c)
 * or the chunk transfer itself (snapshot_push.c's pull_missing).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "image.h"
#include "image_store.h"
#include "image_store_internal.h"
#include "metrics.h"
#include "moat/chunk.h"
#include "moat/images.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "snap_client.h"
#include "snapshot_push.h"
#include "sync.h"
#include "verify.h"

#define INDEX_MAX 64u  /* images indexed */
#define PULLING_MAX 16 /* names pulled at once */

/* One local image's snapd entry: its files' chunk lists. */
struct idx_art {
	char file[16];
	uint32_t chunk_size;
	uint64_t size;
	uint8_t *ids;
	size_t n;
};
struct idx_image {
	char *name;
	char id[65];
	char *snapshot_id; /* NULL: looked up, not in snapd */
	struct idx_art arts[VMD_IMAGE_N_FILES];
	size_t n_arts;
};

struct vmd_images {
	pthread_mutex_t mu; /* guards all below */
	pthread_cond_t cv;  /* a pull ended */
	struct idx_image idx[INDEX_MAX];
	size_t n_idx;
	char *pulling[PULLING_MAX];
};

static struct vmd_images *
images_of(struct vmd *vmd)
{
	return vmd->images;
}

static void
idx_clear(struct idx_image *e)
{
	free(e->name);
	free(e->snapshot_id);
	for (size_t i = 0; i < e->n_arts; i++)
		free(e->arts[i].ids);
	memset(e, 0, sizeof(*e));
}

/* Removes what a crashed pull (.NAME.pull.*) or removal (.NAME.rm)
 * left: never an image, never complete. */
static void
sweep_image_dir(struct vmd *vmd)
{
	DIR *d = opendir(vmd->cfg.image_dir);
	struct dirent *de;

	while (d != NULL && (de = readdir(d)) != NULL) {
		char *p;
		size_t n = strlen(de->d_name);

		if (de->d_name[0] != '.' ||
		    (strstr(de->d_name, ".pull.") == NULL &&
		        (n < 4 || strcmp(de->d_name + n - 3, ".rm") != 0)))
			continue;
		if ((p = moat_asprintf("%s/%s", vmd->cfg.image_dir,
		         de->d_name)) == NULL)
			continue;
		moat_warn(0,
		    "image dir: removing %s, left by a pull or "
		    "removal that did not finish",
		    p);
		(void)moat_rm_rf(p);
		free(p);
	}
	if (d != NULL)
		closedir(d);
}

int
vmd_images_init(struct vmd *vmd)
{
	struct vmd_images *im = calloc(1, sizeof(*im));

	if (im == NULL)
		return MOAT_INTERNAL;
	pthread_mutex_init(&im->mu, NULL);
	vmd_cond_init(&im->cv);
	vmd->images = im;
	sweep_image_dir(vmd);
	return MOAT_OK;
}

void
vmd_images_fini(struct vmd *vmd)
{
	struct vmd_images *im = images_of(vmd);

	if (im == NULL)
		return;
	for (size_t i = 0; i < im->n_idx; i++)
		idx_clear(&im->idx[i]);
	pthread_mutex_destroy(&im->mu);
	pthread_cond_destroy(&im->cv);
	free(im);
	vmd->images = NULL;
}

/* The index entry of `name` (mu held), or NULL. */
static struct idx_image *
idx_find(struct vmd_images *im, const char *name)
{
	for (size_t i = 0; i < im->n_idx; i++)
		if (strcmp(im->idx[i].name, name) == 0)
			return &im->idx[i];
	return NULL;
}

static void
idx_forget_locked(struct vmd_images *im, const char *name)
{
	struct idx_image *e = idx_find(im, name);

	if (e == NULL)
		return;
	idx_clear(e);
	*e = im->idx[--im->n_idx];
	memset(&im->idx[im->n_idx], 0, sizeof(im->idx[0]));
}

void
vmd_image_index_add(struct vmd *vmd, const char *name, const char *id,
    const char *snapshot_id, const Moat__V1__SnapArtifact *const *arts,
    size_t n)
{
	struct vmd_images *im = images_of(vmd);
	struct idx_image *e;

	if (im == NULL)
		return;
	pthread_mutex_lock(&im->mu);
	idx_forget_locked(im, name);
	if (im->n_idx == INDEX_MAX)
		idx_forget_locked(im, im->idx[0].name);
	e = &im->idx[im->n_idx];
	e->name = strdup(name);
	e->snapshot_id = snapshot_id ? strdup(snapshot_id) : NULL;
	snprintf(e->id, sizeof(e->id), "%s", id);
	for (size_t i = 0; i < n && e->n_arts < VMD_IMAGE_N_FILES; i++) {
		struct idx_art *a = &e->arts[e->n_arts];

		if (arts[i]->chunk_ids.len == 0 ||
		    (a->ids = malloc(arts[i]->chunk_ids.len)) == NULL)
			continue;
		memcpy(a->ids, arts[i]->chunk_ids.data,
		    arts[i]->chunk_ids.len);
		snprintf(a->file, sizeof(a->file), "%s", arts[i]->name);
		a->chunk_size = arts[i]->chunk_size;
		a->size = arts[i]->size;
		a->n = arts[i]->chunk_ids.len / MOAT_CHUNK_ID_LEN;
		e->n_arts++;
	}
	if (e->name != NULL)
		im->n_idx++;
	else
		idx_clear(e);
	pthread_mutex_unlock(&im->mu);
}

void
vmd_image_index_forget(struct vmd *vmd, const char *name)
{
	struct vmd_images *im = images_of(vmd);

	if (im == NULL)
		return;
	pthread_mutex_lock(&im->mu);
	idx_forget_locked(im, name);
	pthread_mutex_unlock(&im->mu);
}

void
vmd_image_index_fill(struct vmd *vmd, const char *name,
    Moat__V1__ImageInfo *info)
{
	struct vmd_images *im = images_of(vmd);
	struct idx_image *e;

	if (im == NULL || info->id == NULL)
		return;
	pthread_mutex_lock(&im->mu);
	e = idx_find(im, name);
	if (e != NULL && e->snapshot_id != NULL &&
	    strcmp(e->id, info->id) == 0) {
		info->stored = true;
		vmd_image_set_str(&info->snapshot_id, e->snapshot_id);
	}
	pthread_mutex_unlock(&im->mu);
}

/* GetSnapshot with_chunks of entry `id` (the caller frees *info). */
static int
get_entry(struct vmd *vmd, const char *id, Moat__V1__SnapshotInfo **info,
    char **errmsg)
{
	Moat__V1__GetSnapshotRequest req =
	    MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	int rv;

	req.tenant = (char *)MOAT_IMAGES_TENANT;
	req.id = (char *)id;
	req.with_chunks = true;
	rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "GetSnapshot",
	    &req.base, &moat__v1__snapshot_info__descriptor, &reply, NULL,
	    errmsg);
	*info = (Moat__V1__SnapshotInfo *)reply;
	return rv;
}

/* Indexes each local image not indexed yet (or rebuilt since) whose id
 * snapd holds under its name, so the pull can read shared chunks here.
 * Failures only cost the pull bytes. */
static void
index_local_images(struct vmd *vmd, const char *skip)
{
	struct vmd_images *im = images_of(vmd);
	char **names = NULL;
	size_t n = 0;

	(void)vmd_images_list(vmd, &names, &n);
	for (size_t i = 0; i < n; i++) {
		Moat__V1__SnapshotInfo **e = NULL, *info = NULL;
		char id[65], *dir, *err = NULL;
		struct idx_image *have;
		const char *found = NULL;
		void *hold = NULL;
		size_t ne = 0;
		bool known;

		dir = moat_asprintf("%s/%s", vmd->cfg.image_dir, names[i]);
		if (strcmp(names[i], skip) == 0 || dir == NULL ||
		    vmd_image_manifest_id(dir, id, NULL, NULL, &err) != 0)
			goto next;
		pthread_mutex_lock(&im->mu);
		have = idx_find(im, names[i]);
		/* One not in snapd at the last pull may be now. */
		known = have != NULL && have->snapshot_id != NULL &&
		    strcmp(have->id, id) == 0;
		pthread_mutex_unlock(&im->mu);
		if (known ||
		    vmd_image_list_entries(vmd, names[i], &e, &ne, &hold,
		        &err) != MOAT_OK)
			goto next;
		for (size_t k = 0; k < ne; k++)
			if (strcmp(vmd_image_label(e[k], MOAT_IMAGE_LABEL_ID),
			        id) == 0)
				found = e[k]->id;
		if (found == NULL)
			vmd_image_index_add(vmd, names[i], id, NULL, NULL, 0);
		else if (get_entry(vmd, found, &info, &err) == MOAT_OK)
			vmd_image_index_add(vmd, names[i], id, info->id,
			    (const Moat__V1__SnapArtifact *const *)
			        info->artifacts,
			    info->n_artifacts);
next:
		if (info != NULL)
			protobuf_c_message_free_unpacked(&info->base, NULL);
		if (hold != NULL)
			protobuf_c_message_free_unpacked(hold, NULL);
		free(err);
		free(dir);
		free(names[i]);
	}
	free(names);
}

/* A chunk an indexed local image holds. */
struct local_hit {
	const uint8_t *id;
	uint32_t e, a;
	uint64_t idx;
};

static int
hit_cmp(const void *x, const void *y)
{
	return memcmp(((const struct local_hit *)x)->id,
	    ((const struct local_hit *)y)->id, MOAT_CHUNK_ID_LEN);
}

/* Every chunk of the indexed images, sorted by id (mu held; the ids
 * point into the index). */
static struct local_hit *
hits_make(struct vmd_images *im, size_t *n)
{
	struct local_hit *h;
	size_t count = 0, k = 0;

	*n = 0;
	for (size_t e = 0; e < im->n_idx; e++)
		for (size_t a = 0; a < im->idx[e].n_arts; a++)
			count += im->idx[e].arts[a].n;
	if (count == 0 || (h = calloc(count, sizeof(*h))) == NULL)
		return NULL;
	for (size_t e = 0; e < im->n_idx; e++)
		for (size_t a = 0; a < im->idx[e].n_arts; a++)
			for (uint64_t i = 0; i < im->idx[e].arts[a].n; i++) {
				const uint8_t *id = im->idx[e].arts[a].ids +
				    i * MOAT_CHUNK_ID_LEN;

				if (moat_chunk_id_is_zero(
				        (const struct moat_chunk_id *)id))
					continue;
				h[k++] = (struct local_hit){ .id = id,
					.e = (uint32_t)e,
					.a = (uint32_t)a,
					.idx = i };
			}
	qsort(h, k, sizeof(*h), hit_cmp);
	*n = k;
	return h;
}

/* Puts into `w` every chunk of `art` that a local image holds, read
 * from its file and verified by the writer (a local file changed since
 * is skipped: the chunk is fetched). Returns the bytes read here. */
static uint64_t
fill_local(struct vmd *vmd, const Moat__V1__SnapArtifact *art,
    struct moat_chunk_writer *w)
{
	struct vmd_images *im = images_of(vmd);
	uint64_t n_ids = art->chunk_ids.len / MOAT_CHUNK_ID_LEN, got = 0;
	struct local_hit *h, key;
	uint32_t open_e = UINT32_MAX, open_a = UINT32_MAX;
	size_t n_h;
	char *buf;
	int fd = -1;

	pthread_mutex_lock(&im->mu);
	h = hits_make(im, &n_h);
	buf = h ? malloc(art->chunk_size) : NULL;
	for (uint64_t i = 0; buf != NULL && i < n_ids; i++) {
		const struct local_hit *hit;
		const struct idx_art *src;
		uint64_t off = i * art->chunk_size;
		size_t len = art->size - off < art->chunk_size ?
		    (size_t)(art->size - off) :
		    art->chunk_size;
		char *err = NULL;

		key.id = art->chunk_ids.data + i * MOAT_CHUNK_ID_LEN;
		if (moat_chunk_id_is_zero(
		        (const struct moat_chunk_id *)key.id) ||
		    (hit = bsearch(&key, h, n_h, sizeof(*h), hit_cmp)) == NULL)
			continue;
		src = &im->idx[hit->e].arts[hit->a];
		if (hit->e != open_e || hit->a != open_a) {
			char *p = moat_asprintf("%s/%s/%s", vmd->cfg.image_dir,
			    im->idx[hit->e].name, src->file);

			if (fd >= 0)
				close(fd);
			fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
			free(p);
			open_e = hit->e;
			open_a = hit->a;
		}
		if (fd < 0 ||
		    pread(fd, buf, len, (off_t)(hit->idx * src->chunk_size)) !=
		        (ssize_t)len)
			continue;
		if (moat_chunk_writer_put(w, i, buf, len, &err) == MOAT_OK)
			got += len;
		free(err);
	}
	pthread_mutex_unlock(&im->mu);
	if (fd >= 0)
		close(fd);
	free(buf);
	free(h);
	return got;
}

/* The bytes of the non-zero chunks of `art`. */
static uint64_t
nonzero_bytes(const Moat__V1__SnapArtifact *art)
{
	uint64_t n = art->chunk_ids.len / MOAT_CHUNK_ID_LEN, sum = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t off = i * art->chunk_size;

		if (!moat_chunk_id_is_zero(
		        (const struct moat_chunk_id *)(art->chunk_ids.data +
		            i * MOAT_CHUNK_ID_LEN)))
			sum += art->size - off < art->chunk_size ?
			    art->size - off :
			    art->chunk_size;
	}
	return sum;
}

/* A DATA_LOSS of a pull, said with the chunk, its file and offset. */
static char *
data_loss_text(const char *name, const char *snap_id,
    const Moat__V1__SnapArtifact *art, const char *why)
{
	uint64_t n = art->chunk_ids.len / MOAT_CHUNK_ID_LEN, off = UINT64_MAX;
	char hex[65], *reason = NULL, *text;
	const char *at;

	/* snapd's text says what to do about a snapshot; only its reason
	 * ("chunk HEX: ...") fits an image. */
	if ((at = strstr(why, "chunk ")) != NULL &&
	    (reason = strndup(at, strcspn(at, ";("))) != NULL) {
		size_t len = strlen(reason);

		while (len > 0 && reason[len - 1] == ' ')
			reason[--len] = '\0';
		why = reason;
	}
	for (uint64_t i = 0; vmd_image_find_hex_id(why, hex) && i < n; i++) {
		char h[65];

		moat_chunk_id_hex(
		    (const struct moat_chunk_id *)(art->chunk_ids.data +
		        i * MOAT_CHUNK_ID_LEN),
		    h);
		if (strcmp(h, hex) == 0) {
			off = i * (uint64_t)art->chunk_size;
			break;
		}
	}
	if (off != UINT64_MAX)
		text =
		    moat_asprintf("image %s: chunk %s of %s at offset "
		                  "%" PRIu64 " (moat-snapd entry %s) is "
		                  "corrupt (%s): push the image again from "
		                  "a node that holds it (moat image push %s)",
		        name, hex, art->name, off, snap_id, why, name);
	else
		text = moat_asprintf("image %s: a chunk of %s (moat-snapd "
		                     "entry %s) is corrupt (%s): push the "
		                     "image again from a node that holds it "
		                     "(moat image push %s)",
		    name, art->name, snap_id, why, name);
	free(reason);
	return text;
}

struct pull_bytes {
	uint64_t fetched, local, size;
};

/* One artifact of entry `snap_id` into <tmp>/<its name>. */
static int
pull_file(struct vmd *vmd, const char *name, const char *snap_id,
    const Moat__V1__SnapArtifact *art, const char *tmp, struct pull_bytes *b,
    char **errmsg)
{
	struct moat_chunk_writer *w = NULL;
	uint64_t local, want;
	bool known = false;
	char *path;
	int rv;

	for (size_t i = 0; i < VMD_IMAGE_N_FILES; i++)
		known = known || strcmp(art->name, vmd_image_files[i]) == 0;
	if (!known) {
		*errmsg = moat_asprintf("image %s: moat-snapd entry %s holds "
		                        "\"%s\", not a file of an image: push "
		                        "the image again",
		    name, snap_id, art->name);
		return MOAT_FAILED_PRECONDITION;
	}
	if ((path = moat_asprintf("%s/%s", tmp, art->name)) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if ((rv = moat_chunk_writer_open(&w, path, art->size, art->chunk_size,
	         art->chunk_ids.data, art->chunk_ids.len / MOAT_CHUNK_ID_LEN,
	         errmsg)) != MOAT_OK) {
		free(path);
		return rv;
	}
	want = nonzero_bytes(art);
	local = fill_local(vmd, art, w);
	rv = vmd_snapshot_pull_missing(vmd, MOAT_IMAGES_TENANT, snap_id, art,
	    w, NULL, errmsg);
	if (rv == MOAT_OK) {
		rv = moat_chunk_writer_commit(w, errmsg);
	} else {
		moat_chunk_writer_abort(w);
		if (rv == MOAT_DATA_LOSS) {
			char *t = data_loss_text(name, snap_id, art,
			    *errmsg ? *errmsg : "?");

			free(*errmsg);
			*errmsg = t;
		}
	}
	/* The VMM's jail reads images as another user. */
	if (rv == MOAT_OK)
		(void)chmod(path, 0644);
	free(path);
	b->local += local;
	b->fetched += want - local;
	b->size += art->size;
	return rv;
}

/* The manifest pulled is the entry's id, and every file matches it. */
static int
pull_check(struct vmd *vmd, const char *name, const char *tmp,
    const char *want, char **errmsg)
{
	char id[65], vid[65];
	const char *base = strrchr(tmp, '/') + 1;
	int rv;

	if ((rv = vmd_image_manifest_id(tmp, id, NULL, NULL, errmsg)) !=
	    MOAT_OK)
		return rv;
	if (strcmp(id, want) != 0) {
		*errmsg =
		    moat_asprintf("image %s: the manifest.json pulled "
		                  "hashes to %s, not its entry's image_id "
		                  "%s: push the image again from a node "
		                  "that holds it",
		        name, id, want);
		return MOAT_DATA_LOSS;
	}
	return vmd_image_verify(vmd, base, vid, errmsg);
}

/* pull_mtimes: gives the pulled files in `dir` the pushing node's mtimes
 * ("FILE=SEC.NSEC,...", MOAT_IMAGE_LABEL_MTIMES), so that the image's
 * build stamp matches that node's and its snapshots restore here. An
 * entry without them (or a name that is no image file) changes nothing:
 * the image still works, only another node's snapshots of it do not
 * restore here. */
static void
pull_mtimes(const char *dir, const char *list)
{
	char *copy = list != NULL ? strdup(list) : NULL, *save = NULL;

	for (char *f = copy ? strtok_r(copy, ",", &save) : NULL; f != NULL;
	     f = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(f, '='), *end = NULL, *p;
		struct timespec ts[2];
		long long sec;
		long nsec = 0;
		bool known = false;

		if (eq == NULL)
			continue;
		*eq = '\0';
		for (size_t i = 0; i < VMD_IMAGE_N_FILES; i++)
			known = known || strcmp(f, vmd_image_files[i]) == 0;
		sec = strtoll(eq + 1, &end, 10);
		if (end != NULL && *end == '.')
			nsec = strtol(end + 1, &end, 10);
		if (!known || end == NULL || *end != '\0' || nsec < 0 ||
		    nsec > 999999999)
			continue;
		ts[0].tv_sec = ts[1].tv_sec = (time_t)sec;
		ts[0].tv_nsec = ts[1].tv_nsec = nsec;
		if ((p = moat_asprintf("%s/%s", dir, f)) != NULL)
			(void)utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW);
		free(p);
	}
	free(copy);
}

/* The pull itself (this thread is the one pulling `name`): entry, files,
 * checks, rename. */
static int
pull_do(struct vmd *vmd, struct moat_rpc_call *call, const char *name)
{
	Moat__V1__SnapshotInfo **e = NULL, *info = NULL;
	struct pull_bytes b = { 0 };
	uint64_t t0 = moat_rpc_now_ms();
	char *tmp = NULL, *final = NULL, *err = NULL;
	const char *want, *sid;
	void *hold = NULL;
	size_t n = 0;
	int rv;

	/* A snapd that is down costs seconds, not the RPC default. */
	if ((rv = vmd_snapd_ping(vmd, &err)) != MOAT_OK ||
	    (rv = vmd_image_list_entries(vmd, name, &e, &n, &hold, &err)) !=
	        MOAT_OK)
		goto fail;
	if (n == 0) {
		rv = moat_rpc_error(call, MOAT_NOT_FOUND,
		    "image %s is neither on this node nor in moat-snapd: "
		    "build it (moat image build SPEC) or push it from a node "
		    "that has it (moat image push %s)",
		    name, name);
		goto out;
	}
	want = vmd_image_label(e[n - 1], MOAT_IMAGE_LABEL_ID);
	sid = e[n - 1]->id;
	if ((rv = get_entry(vmd, sid, &info, &err)) != MOAT_OK)
		goto fail;
	index_local_images(vmd, name);
	tmp = moat_asprintf("%s/.%s.pull.XXXXXX", vmd->cfg.image_dir, name);
	final = moat_asprintf("%s/%s", vmd->cfg.image_dir, name);
	if (tmp == NULL || final == NULL || mkdtemp(tmp) == NULL) {
		err = moat_asprintf("cannot make a directory in %s: %s",
		    vmd->cfg.image_dir, strerror(errno));
		rv = MOAT_INTERNAL;
		free(tmp);
		tmp = NULL;
		goto fail;
	}
	(void)chmod(tmp, 0755);
	for (size_t i = 0; i < info->n_artifacts && rv == MOAT_OK; i++)
		rv = pull_file(vmd, name, sid, info->artifacts[i], tmp, &b,
		    &err);
	if (rv == MOAT_OK)
		pull_mtimes(tmp,
		    vmd_image_label(e[n - 1], MOAT_IMAGE_LABEL_MTIMES));
	if (rv == MOAT_OK)
		rv = pull_check(vmd, name, tmp, want, &err);
	if (rv != MOAT_OK)
		goto fail;
	/* One rename: a create sees the whole image or none. A name that
	 * appeared meanwhile (a build) wins. */
	if (rename(tmp, final) != 0 && errno != EEXIST && errno != ENOTEMPTY) {
		err = moat_asprintf("cannot rename %s to %s: %s", tmp, final,
		    strerror(errno));
		rv = MOAT_INTERNAL;
		goto fail;
	}
	(void)moat_rm_rf(tmp);
	vmd_image_index_add(vmd, name, want, sid,
	    (const Moat__V1__SnapArtifact *const *)info->artifacts,
	    info->n_artifacts);
	vmd_metrics_image_pull(b.fetched, b.local);
	moat_info(call->request_id,
	    "image %s pulled from moat-snapd entry %s: fetched %" PRIu64
	    " B, read locally %" PRIu64 " B, image %" PRIu64 " B (%" PRIu64
	    " ms)",
	    name, sid, b.fetched, b.local, b.size, moat_rpc_now_ms() - t0);
	goto out;
fail:
	if (tmp != NULL)
		(void)moat_rm_rf(tmp);
	moat_warn(call->request_id, "image %s: pull failed: %s", name,
	    err ? err : "?");
	if (rv == MOAT_UNAVAILABLE || rv == MOAT_DEADLINE_EXCEEDED)
		rv = moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "image %s is not on node %s and moat-snapd %s does not "
		    "answer (%s): start moat-snapd or create on a node that "
		    "has the image",
		    name, vmd->cfg.node_id, vmd->cfg.snapd_url,
		    err ? err : "?");
	else
		rv = moat_rpc_error(call, rv, "%s", err ? err : "?");
out:
	if (info != NULL)
		protobuf_c_message_free_unpacked(&info->base, NULL);
	if (hold != NULL)
		protobuf_c_message_free_unpacked(hold, NULL);
	free(tmp);
	free(final);
	free(err);
	return rv;
}

/* Waits while another thread pulls `name`, then claims it (mu held):
 * false when the image is there now. */
static bool
pull_claim(struct vmd *vmd, struct vmd_images *im, const char *name, int *slot)
{
	for (;;) {
		bool busy = false;

		*slot = -1;
		for (int i = 0; i < PULLING_MAX; i++) {
			if (im->pulling[i] == NULL && *slot < 0)
				*slot = i;
			busy = busy ||
			    (im->pulling[i] != NULL &&
			        strcmp(im->pulling[i], name) == 0);
		}
		if (!busy && vmd_image_present(vmd, name))
			return false;
		if (!busy && *slot >= 0 &&
		    (im->pulling[*slot] = strdup(name)) != NULL)
			return true;
		(void)vmd_cond_wait_until(&im->cv, &im->mu, UINT64_MAX);
	}
}

int
vmd_image_pull(struct vmd *vmd, struct moat_rpc_call *call, const char *name,
    Moat__V1__ImageInfo *out)
{
	struct vmd_images *im = images_of(vmd);
	int rv, slot;
	bool mine;

	if (vmd->snapd == NULL)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "PullImage needs moat-snapd: node %s has no [vmd] snapd "
		    "set",
		    vmd->cfg.node_id);
	if ((rv = vmd_image_name_check(vmd, call, name, false)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&im->mu);
	mine = pull_claim(vmd, im, name, &slot);
	pthread_mutex_unlock(&im->mu);
	if (mine) {
		rv = pull_do(vmd, call, name);
		pthread_mutex_lock(&im->mu);
		free(im->pulling[slot]);
		im->pulling[slot] = NULL;
		pthread_cond_broadcast(&im->cv);
		pthread_mutex_unlock(&im->mu);
		if (rv != MOAT_OK)
			return rv;
	}
	return out != NULL ? vmd_image_info(vmd, call, name, out) : MOAT_OK;
}

int
vmd_image_ensure(struct vmd *vmd, struct moat_rpc_call *call, const char *name)
{
	if (vmd->snapd == NULL || vmd->images == NULL ||
	    vmd_image_present(vmd, name))
		return MOAT_OK;
	return vmd_image_pull(vmd, call, name, NULL);
}
