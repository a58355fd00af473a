/*
 * archive.c: directories in and out as tar archives (issue 17). An
 * upload's chunks go, in order, to a staging file with no name (O_TMPFILE
 * under AGENT_ARCHIVE_DIR on the guest's disk, so a crash leaves nothing
 * behind); on `last` the whole archive is checked (moat/tar.h) before the
 * target is even made, then unpacked under the target's fd. A download
 * packs `path` into such a file on its first call and is read in chunks.
 * At most AGENT_ARCHIVE_MAX transfers at once; each goes on done, on any
 * error, or after AGENT_ARCHIVE_IDLE_MS without a call. The agent does
 * not trust the host's archive either: same checks as the CLI's.
 * Not for: the tar format and rules (lib/tar*.c) or single files
 * (files.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

struct archive {
	bool used, put;
	char id[33];
	int fd;
	uint64_t size; /* put: received; get: the archive's size */
	uint64_t max;
	uint64_t last_ms;
	char path[PATH_MAX];
};

static struct archive archives[AGENT_ARCHIVE_MAX];

static void
archive_drop(struct archive *ar)
{
	if (ar->used && ar->fd >= 0)
		close(ar->fd);
	memset(ar, 0, sizeof(*ar));
	ar->fd = -1;
}

/* staging_open: an unnamed read-write file on the guest's disk (not
 * /tmp, which may be RAM), or in host mode the test's TMPDIR. */
static int
staging_open(struct agent *a)
{
	if (a->pid1)
		(void)mkdir(AGENT_ARCHIVE_DIR, 0700);
	return moat_tar_staging(a->pid1 ? AGENT_ARCHIVE_DIR : NULL);
}

/* archive_new: a free slot with a staging file and a fresh id. */
static int
archive_new(struct agent *a, bool put, const char *clean, uint64_t max,
    struct archive **out, char **why)
{
	struct archive *ar = NULL;
	uint8_t rnd[16];

	for (int i = 0; i < AGENT_ARCHIVE_MAX && ar == NULL; i++)
		if (!archives[i].used)
			ar = &archives[i];
	if (ar == NULL) {
		*why = moat_asprintf("%d archive transfers are already open "
		                     "in this sandbox: wait for one to end "
		                     "(an idle one goes after %d minutes)",
		    AGENT_ARCHIVE_MAX, AGENT_ARCHIVE_IDLE_MS / 60000);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((ar->fd = staging_open(a)) < 0) {
		int err = -ar->fd;

		ar->fd = -1;
		*why = moat_asprintf("cannot make a staging file in %s: %s",
		    a->pid1 ? AGENT_ARCHIVE_DIR : "/tmp", strerror(err));
		return moat_status_from_errno(err);
	}
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		for (size_t i = 0; i < sizeof(rnd); i++)
			rnd[i] = (uint8_t)(agent_now_us() >> (i % 8));
	}
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(ar->id + 2 * i, 3, "%02x", rnd[i]);
	ar->used = true;
	ar->put = put;
	ar->max = max;
	ar->last_ms = agent_now_ms();
	snprintf(ar->path, sizeof(ar->path), "%s", clean);
	*out = ar;
	return MOAT_OK;
}

static struct archive *
archive_find(const char *id, bool put)
{
	for (int i = 0; i < AGENT_ARCHIVE_MAX; i++)
		if (archives[i].used && archives[i].put == put &&
		    strcmp(archives[i].id, id) == 0)
			return &archives[i];
	return NULL;
}

int
agent_archive_timer(struct agent *a, uint64_t now)
{
	int next = -1;

	(void)a;
	for (int i = 0; i < AGENT_ARCHIVE_MAX; i++) {
		struct archive *ar = &archives[i];
		uint64_t due = ar->last_ms + AGENT_ARCHIVE_IDLE_MS;

		if (!ar->used)
			continue;
		if (now >= due) {
			archive_drop(ar);
			continue;
		}
		if (next < 0 || due - now < (uint64_t)next)
			next = (int)(due - now);
	}
	return next;
}

static void
send_archive(struct agent *a, uint64_t id, Moat__V1__GuestArchive *ga)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;

	m.id = id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_ARCHIVE;
	m.archive = ga;
	(void)agent_send(a, &m);
}

/* put_finish: the whole archive is in: check it, make the target, and
 * unpack (moat_tar_unpack checks again: the rules hold whoever calls). */
static int
put_finish(struct agent *a, struct archive *ar, Moat__V1__GuestArchive *ga,
    char **why)
{
	struct moat_tar_stats st = { 0 };
	int rv, dfd;

	if (lseek(ar->fd, 0, SEEK_SET) != 0)
		return agent_path_error(-errno, ar->path, "stage", why);
	if ((rv = moat_tar_check(ar->fd, ar->max, NULL, why)) != 0)
		return rv;
	if ((rv = agent_path_mkdirs(a, ar->path, 0755)) != 0)
		return agent_path_error(rv, ar->path, "make directory", why);
	dfd = agent_path_open(a, ar->path, O_RDONLY | O_DIRECTORY, 0);
	if (dfd < 0)
		return agent_path_error(dfd, ar->path, "open directory", why);
	rv = moat_tar_unpack(ar->fd, dfd, ar->max, &st, why);
	close(dfd);
	ga->done = rv == 0;
	ga->files = st.files;
	ga->dirs = st.dirs;
	ga->symlinks = st.symlinks;
	ga->bytes = st.bytes;
	return rv;
}

static int
put_chunk(struct agent *a, struct archive *ar,
    const Moat__V1__GuestArchivePut *p, char **why)
{
	size_t done = 0;

	if (p->offset != ar->size) {
		*why =
		    moat_asprintf("upload %s: chunk at offset %llu, expected "
		                  "offset %llu (the bytes received so far): "
		                  "send chunks in order, or start again",
		        ar->id, (unsigned long long)p->offset,
		        (unsigned long long)ar->size);
		return MOAT_FAILED_PRECONDITION;
	}
	if (ar->size + p->data.len > ar->max) {
		*why = moat_asprintf("the archive is over the %llu-byte cap: "
		                     "send less, or raise [vmd] "
		                     "archive-max-mib",
		    (unsigned long long)ar->max);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	while (done < p->data.len) {
		ssize_t n = pwrite(ar->fd, p->data.data + done,
		    p->data.len - done, (off_t)(ar->size + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return agent_path_error(n < 0 ? -errno : -EIO,
			    AGENT_ARCHIVE_DIR, "stage the archive in", why);
		done += (size_t)n;
	}
	ar->size += p->data.len;
	return MOAT_OK;
}

int
agent_archive_put(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__GuestArchivePut *p = req->archive_put;
	Moat__V1__GuestArchive ga = MOAT__V1__GUEST_ARCHIVE__INIT;
	uint64_t max = p->max_bytes ? p->max_bytes : AGENT_ARCHIVE_DEFAULT_MAX;
	char clean[PATH_MAX];
	struct archive *ar;
	int rv;

	if ((rv = agent_path_clean(p->path, false, clean, why)) != 0)
		return rv;
	if (p->data.len > MOAT_GUEST_IO_MAX) {
		*why =
		    moat_asprintf("a chunk of %zu bytes is over the %u-byte "
		                  "limit",
		        p->data.len, MOAT_GUEST_IO_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if (p->upload_id[0] == '\0') {
		if (p->offset != 0) {
			*why =
			    moat_asprintf("the first chunk has no upload_id "
			                  "and must be at offset 0, not %llu",
			        (unsigned long long)p->offset);
			return MOAT_INVALID_ARGUMENT;
		}
		if ((rv = archive_new(a, true, clean, max, &ar, why)) != 0)
			return rv;
	} else if ((ar = archive_find(p->upload_id, true)) == NULL) {
		*why =
		    moat_asprintf("upload %s is not open (it ended, failed, "
		                  "or sat idle %d minutes): start again "
		                  "without upload_id",
		        p->upload_id, AGENT_ARCHIVE_IDLE_MS / 60000);
		return MOAT_NOT_FOUND;
	} else if (strcmp(ar->path, clean) != 0) {
		*why = moat_asprintf("upload %s is into %s, not %s: keep the "
		                     "path of its first chunk",
		    ar->id, ar->path, clean);
		return MOAT_INVALID_ARGUMENT;
	}
	ar->last_ms = agent_now_ms();
	if ((rv = put_chunk(a, ar, p, why)) == MOAT_OK && p->last)
		rv = put_finish(a, ar, &ga, why);
	ga.id = ar->id;
	ga.received = ar->size;
	if (rv == MOAT_OK)
		send_archive(a, req->id, &ga);
	if (rv != MOAT_OK || p->last)
		archive_drop(ar);
	return rv;
}

/* get_pack: packs the cleaned path into the staging file of ar. */
static int
get_pack(struct agent *a, struct archive *ar, Moat__V1__GuestArchive *ga,
    char **why)
{
	struct moat_tar_stats st = { 0 };
	const char *base = strrchr(ar->path, '/') + 1;
	struct stat sst;
	off_t end;
	int fd, rv;

	if ((fd = agent_path_open(a, ar->path, O_PATH, 0)) < 0)
		return agent_path_error(fd, ar->path, "pack", why);
	rv = fstat(fd, &sst);
	close(fd);
	if (rv != 0)
		return agent_path_error(-errno, ar->path, "stat", why);
	if (!S_ISDIR(sst.st_mode) && !S_ISREG(sst.st_mode)) {
		*why = moat_asprintf("%s is neither a directory nor a regular "
		                     "file: nothing to pack",
		    ar->path);
		return MOAT_FAILED_PRECONDITION;
	}
	fd = agent_path_open(a, ar->path,
	    S_ISDIR(sst.st_mode) ? O_RDONLY | O_DIRECTORY :
	                           O_RDONLY | O_NONBLOCK | O_NOCTTY,
	    0);
	if (fd < 0)
		return agent_path_error(fd, ar->path, "pack", why);
	rv = moat_tar_pack(fd, base[0] ? base : "root", ar->fd, &st, why);
	close(fd);
	if (rv != 0)
		return rv;
	if ((end = lseek(ar->fd, 0, SEEK_END)) < 0)
		return agent_path_error(-errno, ar->path, "pack", why);
	ar->size = (uint64_t)end;
	ga->files = st.files;
	ga->dirs = st.dirs;
	ga->symlinks = st.symlinks;
	ga->bytes = st.bytes;
	ga->skipped = st.skipped;
	return MOAT_OK;
}

int
agent_archive_get(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__GuestArchiveGet *g = req->archive_get;
	Moat__V1__GuestArchive ga = MOAT__V1__GUEST_ARCHIVE__INIT;
	uint32_t want = g->length && g->length < MOAT_GUEST_IO_MAX ?
	    g->length :
	    MOAT_GUEST_IO_MAX;
	char clean[PATH_MAX];
	struct archive *ar;
	ssize_t n = 0;
	uint8_t *buf;
	int rv;

	if ((rv = agent_path_clean(g->path, false, clean, why)) != 0)
		return rv;
	if (g->download_id[0] == '\0') {
		if ((rv = archive_new(a, false, clean, 0, &ar, why)) != 0)
			return rv;
		if ((rv = get_pack(a, ar, &ga, why)) != 0) {
			archive_drop(ar);
			return rv;
		}
	} else if ((ar = archive_find(g->download_id, false)) == NULL) {
		*why = moat_asprintf("download %s is not open (it was read to "
		                     "its end, failed, or sat idle %d "
		                     "minutes): start again without "
		                     "download_id",
		    g->download_id, AGENT_ARCHIVE_IDLE_MS / 60000);
		return MOAT_NOT_FOUND;
	}
	ar->last_ms = agent_now_ms();
	if ((buf = malloc(want)) == NULL) {
		archive_drop(ar);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (g->offset < ar->size) {
		do
			n = pread(ar->fd, buf, want, (off_t)g->offset);
		while (n < 0 && errno == EINTR);
	}
	if (n < 0) {
		rv = agent_path_error(-errno, ar->path, "read the archive of",
		    why);
		free(buf);
		archive_drop(ar);
		return rv;
	}
	ga.id = ar->id;
	ga.data.data = buf;
	ga.data.len = (size_t)n;
	ga.size = ar->size;
	ga.eof = g->offset + (uint64_t)n >= ar->size;
	send_archive(a, req->id, &ga);
	free(buf);
	if (ga.eof)
		archive_drop(ar);
	return MOAT_OK;
}
