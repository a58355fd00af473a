/*
 * verify.c: vmd's checks of what a VMM will read (issue 14). Snapshots:
 * a SHA-256 digest of each artifact and an HMAC-SHA256 under the
 * snapshot key ([vmd] snapshot-key-file, shared by a cluster) in
 * meta.pb, checked before a restore, a fork or a template clone starts
 * a VMM. Images: each file checked against the image's manifest.json.
 * Hashing a RAM file on every restore would cost more than the restore:
 * a file verified once stays verified while its (dev, inode, size, mtime
 * ns, ctime ns) do not change. Not for: what a snapshot holds
 * (snapshot.c) or image paths (image.c).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "vmm.h"
#include "verify.h"

#define CACHE_MAX 1024u

/* The artifacts of a snapshot: snapd's names (snapshot_push.c's table,
 * which must agree) and the files in its directory. */
static const struct {
	const char *name, *file;
} seal_artifacts[VMD_SEAL_N] = {
	{ "ram", MOAT_VMM_SNAP_RAM },
	{ "disk", MOAT_VMM_SNAP_SCRATCH },
	{ "device_state", MOAT_VMM_SNAP_DEVICE_STATE },
};
#define IMAGE_MANIFEST "manifest.json"
#define IMAGE_MANIFEST_MAX (256u << 10)

struct cache_entry {
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime, ctime;
	bool plain;
	uint8_t digest[VMD_DIGEST_LEN];
};

struct vmd_verify {
	uint8_t key[VMD_SNAPSHOT_KEY_LEN];
	pthread_mutex_t mu;
	struct cache_entry cache[CACHE_MAX];
	size_t n, next; /* used entries; the next one a full cache reuses */
};

/* ---- the key ---- */

/* Makes `path` holding 32 random bytes, mode 0600, unless another vmd
 * made it first (a link, so a concurrent first start never replaces
 * the key the other one uses). Returns 0 or an errno. */
static int
key_create(const char *path)
{
	uint8_t key[VMD_SNAPSHOT_KEY_LEN];
	char *tmp = moat_asprintf("%s.%d.new", path, (int)getpid());
	int e = 0, fd;

	if (tmp == NULL)
		return ENOMEM;
	(void)unlink(tmp); /* a crashed start's, under the same pid */
	if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key))
		e = EIO;
	else if ((fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
	              0600)) < 0)
		e = errno;
	else {
		if (write(fd, key, sizeof(key)) != (ssize_t)sizeof(key) ||
		    fsync(fd) != 0)
			e = errno ? errno : EIO;
		close(fd);
		if (e == 0 && link(tmp, path) != 0 && errno != EEXIST)
			e = errno;
		(void)unlink(tmp);
	}
	OPENSSL_cleanse(key, sizeof(key));
	free(tmp);
	return e;
}

int
vmd_verify_key_load(const char *path, uint8_t key[VMD_SNAPSHOT_KEY_LEN],
    bool *created, char **errmsg)
{
	struct stat st;
	int fd, e;

	*created = false;
	*errmsg = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 && errno == ENOENT) {
		if ((e = key_create(path)) != 0) {
			*errmsg = moat_asprintf("cannot make the snapshot key "
			                        "%s: %s (fix [vmd] "
			                        "snapshot-key-file)",
			    path, strerror(e));
			return moat_status_from_errno(e);
		}
		*created = true;
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	}
	if (fd < 0) {
		e = errno;
		*errmsg = moat_asprintf("cannot open the snapshot key %s: %s "
		                        "(fix [vmd] snapshot-key-file)",
		    path, strerror(e));
		return moat_status_from_errno(e);
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_size != VMD_SNAPSHOT_KEY_LEN) {
		close(fd);
		*errmsg =
		    moat_asprintf("the snapshot key %s is not a file of "
		                  "%u bytes: restore the cluster's key "
		                  "file there, or remove it to make a new "
		                  "one (snapshots sealed with the old key "
		                  "are then refused)",
		        path, VMD_SNAPSHOT_KEY_LEN);
		return MOAT_FAILED_PRECONDITION;
	}
	if ((st.st_mode & 077) != 0) {
		close(fd);
		*errmsg =
		    moat_asprintf("the snapshot key %s is readable by "
		                  "group or others (mode %03o): chmod 600 "
		                  "it",
		        path, (unsigned)(st.st_mode & 0777));
		return MOAT_FAILED_PRECONDITION;
	}
	e = read(fd, key, VMD_SNAPSHOT_KEY_LEN) == VMD_SNAPSHOT_KEY_LEN ?
	    0 :
	    (errno ? errno : EIO);
	close(fd);
	if (e != 0) {
		*errmsg = moat_asprintf("cannot read the snapshot key %s: %s",
		    path, strerror(e));
		return moat_status_from_errno(e);
	}
	return MOAT_OK;
}

struct vmd_verify *
vmd_verify_new(const uint8_t key[VMD_SNAPSHOT_KEY_LEN])
{
	struct vmd_verify *v = calloc(1, sizeof(*v));

	if (v == NULL)
		return NULL;
	memcpy(v->key, key, VMD_SNAPSHOT_KEY_LEN);
	pthread_mutex_init(&v->mu, NULL);
	return v;
}

void
vmd_verify_free(struct vmd_verify *v)
{
	if (v == NULL)
		return;
	OPENSSL_cleanse(v->key, sizeof(v->key));
	pthread_mutex_destroy(&v->mu);
	free(v);
}

void
vmd_verify_cache_clear(struct vmd_verify *v)
{
	pthread_mutex_lock(&v->mu);
	v->n = 0;
	v->next = 0;
	pthread_mutex_unlock(&v->mu);
}

/* ---- digests and the verified-once cache ---- */

static bool
same_key(const struct cache_entry *c, const struct stat *st, bool plain)
{
	return c->dev == st->st_dev && c->ino == st->st_ino &&
	    c->size == st->st_size && c->plain == plain &&
	    c->mtime.tv_sec == st->st_mtim.tv_sec &&
	    c->mtime.tv_nsec == st->st_mtim.tv_nsec &&
	    c->ctime.tv_sec == st->st_ctim.tv_sec &&
	    c->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

static bool
cache_get(struct vmd_verify *v, const struct stat *st, bool plain,
    uint8_t out[VMD_DIGEST_LEN])
{
	bool hit = false;

	pthread_mutex_lock(&v->mu);
	for (size_t i = 0; i < v->n && !hit; i++)
		if (same_key(&v->cache[i], st, plain)) {
			memcpy(out, v->cache[i].digest, VMD_DIGEST_LEN);
			hit = true;
		}
	pthread_mutex_unlock(&v->mu);
	return hit;
}

static void
cache_put(struct vmd_verify *v, const struct stat *st, bool plain,
    const uint8_t digest[VMD_DIGEST_LEN])
{
	struct cache_entry *c;
	size_t i;

	pthread_mutex_lock(&v->mu);
	/* A file with the same dev and inode but another stat key is
	 * replaced: its old digest can never be asked for again. */
	for (i = 0; i < v->n; i++)
		if (v->cache[i].dev == st->st_dev &&
		    v->cache[i].ino == st->st_ino &&
		    v->cache[i].plain == plain)
			break;
	if (i == v->n) {
		if (v->n < CACHE_MAX)
			i = v->n++;
		else
			i = v->next++ % CACHE_MAX;
	}
	c = &v->cache[i];
	c->dev = st->st_dev;
	c->ino = st->st_ino;
	c->size = st->st_size;
	c->mtime = st->st_mtim;
	c->ctime = st->st_ctim;
	c->plain = plain;
	memcpy(c->digest, digest, VMD_DIGEST_LEN);
	pthread_mutex_unlock(&v->mu);
}

/* Reads exactly n bytes at off. Returns 0 or an errno. */
static int
read_at(int fd, uint8_t *buf, size_t n, off_t off)
{
	while (n > 0) {
		ssize_t r = pread(fd, buf, n, off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? errno : EIO; /* shrank meanwhile */
		buf += r;
		n -= (size_t)r;
		off += r;
	}
	return 0;
}

/* The chunked digest (verify.h) of fd, `size` bytes: chunks that lie in
 * a hole are hashed as zeros without reading them. */
static int
digest_chunked(int fd, uint64_t size, uint8_t *buf, uint8_t out[32])
{
	static const char tag[] = "moat-artifact-v1";
	uint8_t zero_full[32], le[8], h[32];
	off_t data = 0; /* the next data at or after off (or size) */
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int e = 0;

	if (ctx == NULL)
		return ENOMEM;
	memset(buf, 0, VMD_DIGEST_CHUNK);
	SHA256(buf, VMD_DIGEST_CHUNK, zero_full);
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(size >> (8 * i));
	EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
	EVP_DigestUpdate(ctx, tag, sizeof(tag) - 1);
	EVP_DigestUpdate(ctx, le, sizeof(le));
	for (uint64_t off = 0; off < size && e == 0; off += VMD_DIGEST_CHUNK) {
		size_t n = size - off < VMD_DIGEST_CHUNK ?
		    (size_t)(size - off) :
		    VMD_DIGEST_CHUNK;

		if (data < (off_t)off) {
			off_t d = lseek(fd, (off_t)off, SEEK_DATA);

			if (d >= 0)
				data = d;
			else if (errno == ENXIO)
				data = (off_t)size; /* only a hole is left */
			else
				data = (off_t)off; /* cannot tell: read it */
		}
		if (data >= (off_t)(off + n) && n == VMD_DIGEST_CHUNK) {
			memcpy(h, zero_full, sizeof(h));
		} else if (data >= (off_t)(off + n)) {
			memset(buf, 0, n);
			SHA256(buf, n, h);
		} else if ((e = read_at(fd, buf, n, (off_t)off)) == 0) {
			SHA256(buf, n, h);
		}
		EVP_DigestUpdate(ctx, h, sizeof(h));
	}
	EVP_DigestFinal_ex(ctx, out, NULL);
	EVP_MD_CTX_free(ctx);
	return e;
}

/* SHA-256 of fd's `size` bytes (as images/build.sh writes them). */
static int
digest_plain(int fd, uint64_t size, uint8_t *buf, uint8_t out[32])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int e = 0;

	if (ctx == NULL)
		return ENOMEM;
	EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
	for (uint64_t off = 0; off < size && e == 0; off += VMD_DIGEST_CHUNK) {
		size_t n = size - off < VMD_DIGEST_CHUNK ?
		    (size_t)(size - off) :
		    VMD_DIGEST_CHUNK;

		if ((e = read_at(fd, buf, n, (off_t)off)) == 0)
			EVP_DigestUpdate(ctx, buf, n);
	}
	EVP_DigestFinal_ex(ctx, out, NULL);
	EVP_MD_CTX_free(ctx);
	return e;
}

int
vmd_verify_file(struct vmd_verify *v, const char *path, bool plain,
    uint8_t out[VMD_DIGEST_LEN], uint64_t *size, bool *cached)
{
	struct stat st, after;
	uint8_t *buf = NULL;
	int fd, e;

	if (cached != NULL)
		*cached = false;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return errno;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		e = errno ? errno : EINVAL;
		close(fd);
		return e;
	}
	*size = (uint64_t)st.st_size;
	if (cache_get(v, &st, plain, out)) {
		close(fd);
		if (cached != NULL)
			*cached = true;
		return 0;
	}
	if ((buf = malloc(VMD_DIGEST_CHUNK)) == NULL) {
		close(fd);
		return ENOMEM;
	}
	e = plain ? digest_plain(fd, *size, buf, out) :
	            digest_chunked(fd, *size, buf, out);
	/* Cached only when nothing changed it while it was read. */
	if (e == 0 && fstat(fd, &after) == 0 &&
	    same_key(&(struct cache_entry){ .dev = st.st_dev,
	                 .ino = st.st_ino,
	                 .size = st.st_size,
	                 .mtime = st.st_mtim,
	                 .ctime = st.st_ctim,
	                 .plain = plain },
	        &after, plain))
		cache_put(v, &st, plain, out);
	free(buf);
	close(fd);
	return e;
}

/* One artifact digested on a thread of its own (digest_all). */
struct digest_job {
	struct vmd_verify *v;
	char *path; /* heap; NULL: nothing to digest */
	uint8_t out[VMD_DIGEST_LEN];
	uint64_t size;
	int e;
	pthread_t thread;
	bool started;
};

static void *
digest_main(void *arg)
{
	struct digest_job *j = arg;

	j->e = j->path ?
	    vmd_verify_file(j->v, j->path, false, j->out, &j->size, NULL) :
	    ENOMEM;
	return NULL;
}

/* Digests the n artifacts of one snapshot side by side: a cold check or
 * a seal hashes the RAM and the disk at once, one core each. A thread
 * that cannot start is run here instead. */
static void
digest_all(struct digest_job *jobs, size_t n)
{
	for (size_t i = 1; i < n; i++)
		jobs[i].started = pthread_create(&jobs[i].thread, NULL,
		                      digest_main, &jobs[i]) == 0;
	if (n > 0)
		digest_main(&jobs[0]);
	for (size_t i = 1; i < n; i++) {
		if (jobs[i].started)
			pthread_join(jobs[i].thread, NULL);
		else
			digest_main(&jobs[i]);
	}
}

/* ---- the seal ---- */

struct enc {
	uint8_t *b;
	size_t n, cap;
	bool oom;
};

static void
enc_bytes(struct enc *e, const void *p, size_t n)
{
	uint8_t le[8];

	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)((uint64_t)n >> (8 * i));
	if (e->n + n + 8 > e->cap) {
		size_t cap = (e->cap ? e->cap * 2 : 256) + n + 8;
		uint8_t *g = realloc(e->b, cap);

		if (g == NULL) {
			e->oom = true;
			return;
		}
		e->b = g;
		e->cap = cap;
	}
	memcpy(e->b + e->n, le, 8);
	if (n > 0)
		memcpy(e->b + e->n + 8, p, n);
	e->n += n + 8;
}

static void
enc_str(struct enc *e, const char *s)
{
	enc_bytes(e, s ? s : "", s ? strlen(s) : 0);
}

static void
enc_u64(struct enc *e, uint64_t v)
{
	uint8_t le[8];

	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(v >> (8 * i));
	enc_bytes(e, le, sizeof(le));
}

void
vmd_seal_mac(const uint8_t key[VMD_SNAPSHOT_KEY_LEN],
    const Moat__V1__LocalSnapshot *m, uint8_t mac[VMD_DIGEST_LEN])
{
	struct enc e = { 0 };
	unsigned int len = VMD_DIGEST_LEN;

	enc_str(&e, "moat-snapshot-seal-v1");
	enc_str(&e, m->tenant);
	enc_str(&e, m->sandbox_id);
	enc_str(&e, m->image);
	enc_str(&e, m->image_stamp);
	enc_str(&e, m->accel);
	enc_str(&e, m->vmm);
	enc_u64(&e, m->vcpus);
	enc_u64(&e, m->memory_mib);
	enc_u64(&e, m->scratch_mib);
	enc_u64(&e, m->template_ ? 1 : 0);
	/* Issue 14: an allowlist is sealed too, so no one widens what a
	 * restore lets the guest reach ("none" or unset adds nothing: seals
	 * made before it was recorded still match). */
	if (m->network != NULL && m->network->mode != NULL &&
	    strcmp(m->network->mode, "allowlist") == 0) {
		enc_str(&e, "network:allowlist");
		enc_u64(&e, m->network->n_allow);
		for (size_t i = 0; i < m->network->n_allow; i++)
			enc_str(&e, m->network->allow[i]);
	}
	enc_u64(&e, m->n_digests);
	for (size_t i = 0; i < m->n_digests; i++) {
		enc_str(&e, m->digests[i]->name);
		enc_u64(&e, m->digests[i]->size);
		enc_bytes(&e, m->digests[i]->sha256.data,
		    m->digests[i]->sha256.len);
	}
	if (e.oom ||
	    HMAC(EVP_sha256(), key, VMD_SNAPSHOT_KEY_LEN, e.b, e.n, mac,
	        &len) == NULL)
		memset(mac, 0, VMD_DIGEST_LEN); /* matches no real seal */
	free(e.b);
}

/* Points m's digests and seal into buf. */
static void
seal_bind(Moat__V1__LocalSnapshot *m, struct vmd_seal *buf)
{
	for (size_t i = 0; i < VMD_SEAL_N; i++) {
		uint64_t size = buf->d[i].size;

		moat__v1__snapshot_digest__init(&buf->d[i]);
		buf->d[i].size = size;
		buf->d[i].name = buf->names[i];
		buf->d[i].sha256.data = buf->sha[i];
		buf->d[i].sha256.len = VMD_DIGEST_LEN;
		buf->p[i] = &buf->d[i];
	}
	m->digests = buf->p;
	m->n_digests = VMD_SEAL_N;
	m->seal.data = buf->mac;
	m->seal.len = VMD_DIGEST_LEN;
}

int
vmd_snapshot_seal(struct vmd *vmd, Moat__V1__LocalSnapshot *m, const char *dir,
    struct vmd_seal *buf, char **errmsg)
{
	struct digest_job jobs[VMD_SEAL_N];
	int rv = MOAT_OK;

	*errmsg = NULL;
	if (vmd->verify == NULL)
		return MOAT_OK;

	memset(buf, 0, sizeof(*buf));
	memset(jobs, 0, sizeof(jobs));
	for (size_t i = 0; i < VMD_SEAL_N; i++) {
		jobs[i].v = vmd->verify;
		jobs[i].path =
		    moat_asprintf("%s/%s", dir, seal_artifacts[i].file);
	}
	digest_all(jobs, VMD_SEAL_N);
	for (size_t i = 0; i < VMD_SEAL_N; i++) {
		const char *name = seal_artifacts[i].name;

		if (jobs[i].e != 0 && rv == MOAT_OK) {
			*errmsg =
			    moat_asprintf("cannot digest its %s (%s/%s): "
			                  "%s",
			        name, dir, seal_artifacts[i].file,
			        strerror(jobs[i].e));
			rv = moat_status_from_errno(jobs[i].e);
		}
		memcpy(buf->sha[i], jobs[i].out, VMD_DIGEST_LEN);
		buf->d[i].size = jobs[i].size;
		snprintf(buf->names[i], sizeof(buf->names[i]), "%s", name);
		free(jobs[i].path);
	}
	if (rv != MOAT_OK)
		return rv;
	seal_bind(m, buf);
	vmd_seal_mac(vmd->verify->key, m, buf->mac);
	return MOAT_OK;
}

/* The error of a failed check (text: heap, taken): through call, else
 * into *errmsg (may be NULL). Returns code. */
static int
verify_fail(struct moat_rpc_call *call, char **errmsg, int code, char *text)
{
	if (call != NULL) {
		(void)moat_rpc_error(call, code, "%s", text ? text : "?");
		free(text);
	} else if (errmsg != NULL) {
		*errmsg = text;
	} else {
		free(text);
	}
	return code;
}

/* The file of artifact `name`, or NULL. */
static const char *
artifact_file(const char *name)
{
	for (size_t i = 0; i < VMD_SEAL_N; i++)
		if (strcmp(seal_artifacts[i].name, name) == 0)
			return seal_artifacts[i].file;
	return NULL;
}

/* Sets *path to the file of artifact d of snapshot m in dir (heap).
 * Returns 0 or a status after verify_fail (an artifact vmd does not
 * make, or no memory). */
static int
artifact_path(struct moat_rpc_call *call, const Moat__V1__LocalSnapshot *m,
    const Moat__V1__SnapshotDigest *d, const char *dir, char **path,
    char **errmsg)
{
	const char *file = artifact_file(d->name);

	if (file == NULL || d->sha256.len != VMD_DIGEST_LEN)
		return verify_fail(call, errmsg, MOAT_DATA_LOSS,
		    moat_asprintf("snapshot %s: its seal lists an artifact "
		                  "\"%.32s\" vmd does not make: nothing was "
		                  "started; delete the snapshot",
		        m->snapshot_id, d->name));
	if ((*path = moat_asprintf("%s/%s", dir, file)) == NULL)
		return verify_fail(call, errmsg, MOAT_INTERNAL,
		    strdup("out of memory"));
	return MOAT_OK;
}

/* Compares artifact d of snapshot m with what job j found. Returns 0 or
 * a status after verify_fail. */
static int
verify_artifact(struct moat_rpc_call *call, const Moat__V1__LocalSnapshot *m,
    const Moat__V1__SnapshotDigest *d, const struct digest_job *j,
    char **errmsg)
{
	if (j->e != 0)
		return verify_fail(call, errmsg, MOAT_DATA_LOSS,
		    moat_asprintf("snapshot %s: its %s (%s) cannot be read: "
		                  "%s; nothing was started; delete the "
		                  "snapshot and take another",
		        m->snapshot_id, d->name, j->path, strerror(j->e)));
	if (j->size != d->size ||
	    CRYPTO_memcmp(j->out, d->sha256.data, VMD_DIGEST_LEN) != 0)
		return verify_fail(call, errmsg, MOAT_DATA_LOSS,
		    moat_asprintf("snapshot %s: its %s (%s) does not match "
		                  "the digest in its manifest (%" PRIu64
		                  " B, sealed %" PRIu64 " B): changed "
		                  "since it was taken; nothing was started; "
		                  "delete the snapshot and take another",
		        m->snapshot_id, d->name, j->path, j->size, d->size));
	return MOAT_OK;
}

int
vmd_snapshot_verify(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__LocalSnapshot *m, const char *dir, char **errmsg)
{
	struct digest_job jobs[VMD_SEAL_N];
	uint8_t mac[VMD_DIGEST_LEN];
	int rv = MOAT_OK;

	if (errmsg != NULL)
		*errmsg = NULL;
	if (vmd->verify == NULL)
		return MOAT_OK;
	if (m->seal.len == 0)
		return verify_fail(call, errmsg, MOAT_FAILED_PRECONDITION,
		    moat_asprintf("snapshot %s has no seal: it was taken "
		                  "before vmd verified snapshots, so what "
		                  "it holds cannot be checked and it is not "
		                  "restored; delete it and take a new one",
		        m->snapshot_id));
	vmd_seal_mac(vmd->verify->key, m, mac);
	if (m->seal.len != VMD_DIGEST_LEN ||
	    CRYPTO_memcmp(mac, m->seal.data, VMD_DIGEST_LEN) != 0 ||
	    m->n_digests != VMD_SEAL_N)
		return verify_fail(call, errmsg, MOAT_DATA_LOSS,
		    moat_asprintf(
		        "snapshot %s: its manifest (%s/meta.pb) "
		        "does not match its seal: changed since it "
		        "was taken, or sealed under another snapshot "
		        "key (nodes that restore each other's "
		        "snapshots share [vmd] snapshot-key-file); "
		        "nothing was started",
		        m->snapshot_id, dir));
	memset(jobs, 0, sizeof(jobs));
	for (size_t i = 0; i < VMD_SEAL_N; i++) {
		jobs[i].v = vmd->verify;
		if ((rv = artifact_path(call, m, m->digests[i], dir,
		         &jobs[i].path, errmsg)) != MOAT_OK)
			goto out;
	}
	digest_all(jobs, VMD_SEAL_N);
	for (size_t i = 0; i < VMD_SEAL_N && rv == MOAT_OK; i++)
		rv = verify_artifact(call, m, m->digests[i], &jobs[i], errmsg);
out:
	for (size_t i = 0; i < VMD_SEAL_N; i++)
		free(jobs[i].path);
	return rv;
}

/* ---- the seal as snapd labels (each value under SNAPD_MAX_TEXT):
 * "seal" = the MAC, "digest.<name>" = "<size>:<sha256>", in hex ---- */

static void
hex(const uint8_t *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static bool
unhex(const char *s, size_t n, uint8_t *out)
{
	if (strlen(s) != 2 * n)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned v;

		if (!isxdigit((unsigned char)s[2 * i]) ||
		    !isxdigit((unsigned char)s[2 * i + 1]) ||
		    sscanf(s + 2 * i, "%2x", &v) != 1)
			return false;
		out[i] = (uint8_t)v;
	}
	return true;
}

bool
vmd_seal_label(const Moat__V1__LocalSnapshot *m, size_t i,
    char key[VMD_SEAL_LABEL_MAX], char value[VMD_SEAL_LABEL_MAX])
{
	char sha[2 * VMD_DIGEST_LEN + 1];
	const Moat__V1__SnapshotDigest *d;

	if (m->seal.len != VMD_DIGEST_LEN || m->n_digests != VMD_SEAL_N ||
	    i > VMD_SEAL_N)
		return false;
	if (i == 0) {
		snprintf(key, VMD_SEAL_LABEL_MAX, "seal");
		hex(m->seal.data, VMD_DIGEST_LEN, value);
		return true;
	}
	d = m->digests[i - 1];
	if (d->sha256.len != VMD_DIGEST_LEN || strlen(d->name) > 15)
		return false;
	hex(d->sha256.data, VMD_DIGEST_LEN, sha);
	snprintf(key, VMD_SEAL_LABEL_MAX, "digest.%s", d->name);
	snprintf(value, VMD_SEAL_LABEL_MAX, "%" PRIu64 ":%s", d->size, sha);
	return true;
}

/* Label `key` of info, or NULL. */
static const char *
info_label(const Moat__V1__SnapshotInfo *info, const char *key)
{
	for (size_t i = 0; i < info->n_labels; i++)
		if (strcmp(info->labels[i]->key, key) == 0)
			return info->labels[i]->value;
	return NULL;
}

bool
vmd_seal_from_info(const Moat__V1__SnapshotInfo *info,
    Moat__V1__LocalSnapshot *m, struct vmd_seal *buf)
{
	const char *mac = info_label(info, "seal");

	if (mac == NULL)
		return true; /* unsealed: refused at restore */
	memset(buf, 0, sizeof(*buf));
	if (!unhex(mac, VMD_DIGEST_LEN, buf->mac))
		return false;
	for (size_t i = 0; i < VMD_SEAL_N; i++) {
		const char *name = seal_artifacts[i].name;
		char key[VMD_SEAL_LABEL_MAX], *end;
		const char *v;

		snprintf(key, sizeof(key), "digest.%s", name);
		if ((v = info_label(info, key)) == NULL ||
		    !isdigit((unsigned char)v[0]))
			return false;
		errno = 0;
		buf->d[i].size = strtoull(v, &end, 10);
		if (errno != 0 || *end != ':' ||
		    !unhex(end + 1, VMD_DIGEST_LEN, buf->sha[i]))
			return false;
		snprintf(buf->names[i], sizeof(buf->names[i]), "%s", name);
	}
	seal_bind(m, buf);
	return true;
}

/* ---- images ---- */

/* Checks one file the manifest lists ({"sha256": hex, "size": n}).
 * Returns 0 or a status with *errmsg. */
static int
image_file_check(struct vmd *vmd, const char *image, const char *name,
    json_t *spec, char **errmsg)
{
	const char *want = json_string_value(json_object_get(spec, "sha256"));
	json_t *jsize = json_object_get(spec, "size");
	uint8_t got[VMD_DIGEST_LEN], sum[VMD_DIGEST_LEN];
	uint64_t size = 0;
	char *path;
	int e;

	if (want == NULL || strlen(want) != 64 ||
	    !unhex(want, VMD_DIGEST_LEN, sum) || !json_is_integer(jsize) ||
	    strchr(name, '/') != NULL || name[0] == '.') {
		*errmsg =
		    moat_asprintf("image \"%s\": its manifest.json "
		                  "lists \"%.64s\" without a sha256 and "
		                  "size: rebuild it with images/build.sh",
		        image, name);
		return MOAT_FAILED_PRECONDITION;
	}
	if ((path = vmd_image_path(vmd, image, name)) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	e = vmd_verify_file(vmd->verify, path, true, got, &size, NULL);
	if (e != 0 || size != (uint64_t)json_integer_value(jsize) ||
	    CRYPTO_memcmp(got, sum, VMD_DIGEST_LEN) != 0) {
		*errmsg =
		    moat_asprintf("image \"%s\": %s %s its manifest.json "
		                  "(%s): the image was changed after it "
		                  "was built and is refused; rebuild it "
		                  "with images/build.sh --force",
		        image, path,
		        e ? "cannot be read to check it against" :
		            "does not match the SHA-256 and size in",
		        e ? strerror(e) : "changed bytes");
		free(path);
		return MOAT_DATA_LOSS;
	}
	free(path);
	return MOAT_OK;
}

/* The files a sandbox boots from must each be in the manifest. */
static const char *const image_needed[] = { "vmlinux", "initrd.img",
	"rootfs.ext4" };

int
vmd_image_verify(struct vmd *vmd, const char *image, char id_hex[65],
    char **errmsg)
{
	uint8_t id[VMD_DIGEST_LEN];
	char *path, *text = NULL;
	json_t *root, *files, *spec;
	const char *name;
	size_t len = 0;
	int e, rv = MOAT_OK;

	*errmsg = NULL;
	id_hex[0] = '\0';
	if (vmd->verify == NULL)
		return MOAT_OK;
	if ((path = vmd_image_path(vmd, image, IMAGE_MANIFEST)) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	e = moat_read_file(path, IMAGE_MANIFEST_MAX, &text, &len);
	if (e != 0) {
		*errmsg =
		    moat_asprintf("image \"%s\" has no readable %s (%s): "
		                  "an image is identified by its manifest; "
		                  "rebuild it with images/build.sh",
		        image, path, strerror(e));
		free(path);
		return MOAT_FAILED_PRECONDITION;
	}
	free(path);
	SHA256((const uint8_t *)text, len, id);
	hex(id, VMD_DIGEST_LEN, id_hex);
	root = json_loadb(text, len, 0, NULL);
	free(text);
	files = json_object_get(root, "files");
	for (size_t i = 0; root != NULL && json_is_object(files) &&
	     i < sizeof(image_needed) / sizeof(image_needed[0]);
	     i++)
		if (json_object_get(files, image_needed[i]) == NULL)
			files = NULL;
	if (!json_is_object(files)) {
		*errmsg = moat_asprintf("image \"%s\": its manifest.json does "
		                        "not list vmlinux, initrd.img and "
		                        "rootfs.ext4 with their digests: "
		                        "rebuild it with images/build.sh",
		    image);
		rv = MOAT_FAILED_PRECONDITION;
	}
	json_object_foreach (rv == MOAT_OK ? files : NULL, name, spec) {
		if ((rv = image_file_check(vmd, image, name, spec, errmsg)) !=
		    MOAT_OK)
			break;
	}
	json_decref(root);
	return rv;
}

unsigned
vmd_images_verify_all(struct vmd *vmd)
{
	char **names = NULL;
	size_t n = 0;
	unsigned bad = 0;

	if (vmd->verify == NULL || vmd_images_list(vmd, &names, &n) != MOAT_OK)
		return 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t t0 = moat_rpc_now_ms();
		char id[65], *err = NULL;

		if (vmd_image_verify(vmd, names[i], id, &err) != MOAT_OK) {
			moat_error(0, "%s (sandboxes of it are refused)",
			    err ? err : "image check failed");
			bad++;
		} else {
			moat_info(0,
			    "image \"%s\": id sha256:%.16s..., every file "
			    "matches its manifest (%" PRIu64 " ms)",
			    names[i], id, moat_rpc_now_ms() - t0);
		}
		free(err);
		free(names[i]);
	}
	free(names);
	return bad;
}

int
vmd_image_check(struct vmd *vmd, struct moat_rpc_call *call, const char *image)
{
	char id[65], *err = NULL;
	int rv;

	if ((rv = vmd_image_verify(vmd, image, id, &err)) != MOAT_OK)
		rv = moat_rpc_error(call, rv, "%s", err ? err : "?");
	free(err);
	return rv;
}
