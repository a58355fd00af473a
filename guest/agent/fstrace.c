/*
 * fstrace.c: what a sandbox changed on its filesystem, read from the
 * overlay's upper dir (everything written lives there) against the lower
 * dir (the read-only image). Each upper entry becomes an FsTraceEntry:
 * - a whiteout (a character device 0:0) is DELETED;
 * - an entry that also exists in lower is MODIFIED, else CREATED;
 * - a directory that exists in both is reported only when it itself
 *   changed: its mode, owner or type differ, or it is opaque (it was
 *   removed and made again, hiding what lower had: then the lower entries
 *   it hides are reported DELETED too). A directory that is in upper only
 *   because something under it changed is not reported; its mtime is not
 *   looked at, since creating a child always changes it.
 * Entries come in path order (sorted within each directory, parents
 * before children), with sha256 of regular files when asked, and stop at
 * the entry cap or at what one frame holds (truncated then says so).
 * Hashes are remembered (memo below): a file unchanged since it was last
 * hashed is not read again, so recording a step costs what the step
 * changed, not the size of everything it ever wrote.
 * Not for: mounting the overlay (boot.c) or diffing traces (sessiond).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sha256.h"

#define TRACE_DEPTH_MAX 256
#define TRACE_HASH_CHUNK (64u << 10)
#define TRACE_MEMO_SLOTS 4096 /* direct-mapped by (dev, inode) */
#define TRACE_MEMO_SETTLE_NS 20000000LL
#define TRACE_MEMO_WAIT_MIN (1u << 20) /* bytes: worth waiting to keep */

/* One remembered hash. A file's ctime changes with every write to it and
 * cannot be set, so the same inode with the same size, mtime and ctime
 * holds what was hashed, as long as no write landed in the same clock
 * tick as the hashing: an entry is kept only when the file's ctime was
 * TRACE_MEMO_SETTLE_NS older than the moment its hashing began (file
 * times come from a coarse clock). A file of TRACE_MEMO_WAIT_MIN bytes or
 * more written just now is hashed once it has settled (a wait of at most
 * TRACE_MEMO_SETTLE_NS), so the step that wrote it pays for its hash
 * once and the next trace, or a clone's, does not read it again. The
 * agent is one thread: no lock. */
struct trace_memo {
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime, ctime;
	bool used;
	uint8_t sum[AGENT_SHA256_LEN];
};

static struct trace_memo trace_memo[TRACE_MEMO_SLOTS];

struct trace {
	Moat__V1__FsTraceEntry *ents;
	uint8_t (*sums)[AGENT_SHA256_LEN];
	size_t n, alloc, max;
	size_t budget; /* encoded bytes, roughly */
	bool hash;
	bool truncated;
	uint64_t files_hashed, bytes_hashed;
	int err; /* first error that stops the walk (-errno) */
};

static int
trace_name_cmp(const void *x, const void *y)
{
	return strcmp(*(char *const *)x, *(char *const *)y);
}

static void
trace_names_free(char **names, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* trace_names: the sorted names in a directory (at most `max`), heap
 * array of heap strings; the caller frees with trace_names_free. */
static int
trace_names(int dirfd, size_t max, char ***out, size_t *count)
{
	char **names = NULL;
	size_t n = 0, alloc = 0;
	struct dirent *de;
	DIR *dir;
	int fd;

	fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if ((dir = fdopendir(fd)) == NULL) {
		close(fd);
		return -errno;
	}
	while (n < max && (de = readdir(dir)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 ||
		    strcmp(de->d_name, "..") == 0)
			continue;
		if (n == alloc) {
			size_t na = alloc ? alloc * 2 : 32;
			char **nn = realloc(names, na * sizeof(*names));

			if (nn == NULL)
				goto fail;
			names = nn;
			alloc = na;
		}
		if ((names[n] = strdup(de->d_name)) == NULL)
			goto fail;
		n++;
	}
	closedir(dir);
	if (n > 0)
		qsort(names, n, sizeof(*names), trace_name_cmp);
	*out = names;
	*count = n;
	return 0;
fail:
	closedir(dir);
	trace_names_free(names, n);
	return -ENOMEM;
}

static struct trace_memo *
trace_memo_slot(const struct stat *st)
{
	uint64_t k = ((uint64_t)st->st_dev * 0x9e3779b97f4a7c15ULL) ^
	    (uint64_t)st->st_ino;

	k ^= k >> 29;
	return &trace_memo[(k * 0xbf58476d1ce4e5b9ULL >> 40) %
	    TRACE_MEMO_SLOTS];
}

static bool
trace_same_time(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static int64_t
trace_ns(struct timespec t)
{
	return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* trace_hash: the sha256 of regular file `name` in `dirfd`, whose lstat
 * is `st`: remembered, or read (and then remembered when it may be). */
static int
trace_hash(struct trace *t, int dirfd, const char *name, const struct stat *st,
    uint8_t out[AGENT_SHA256_LEN])
{
	struct trace_memo *m = trace_memo_slot(st);
	struct agent_sha256 h;
	struct timespec began;
	struct stat after;
	uint64_t bytes = 0;
	uint8_t *buf;
	ssize_t n;
	int fd;

	if (m->used && m->dev == st->st_dev && m->ino == st->st_ino &&
	    m->size == st->st_size && trace_same_time(m->mtime, st->st_mtim) &&
	    trace_same_time(m->ctime, st->st_ctim)) {
		memcpy(out, m->sum, AGENT_SHA256_LEN);
		return 0;
	}
	clock_gettime(CLOCK_REALTIME, &began);
	if (st->st_size >= (off_t)TRACE_MEMO_WAIT_MIN &&
	    trace_ns(st->st_ctim) + TRACE_MEMO_SETTLE_NS >= trace_ns(began)) {
		int64_t wait = trace_ns(st->st_ctim) + TRACE_MEMO_SETTLE_NS +
		    1 - trace_ns(began);
		struct timespec w;

		if (wait > TRACE_MEMO_SETTLE_NS + 1)
			wait = TRACE_MEMO_SETTLE_NS +
			    1; /* a ctime ahead of now */
		w.tv_sec = 0;
		w.tv_nsec = (long)wait;
		while (nanosleep(&w, &w) != 0 && errno == EINTR)
			;
		clock_gettime(CLOCK_REALTIME, &began);
	}

	fd = openat(dirfd, name,
	    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if ((buf = malloc(TRACE_HASH_CHUNK)) == NULL) {
		close(fd);
		return -ENOMEM;
	}
	agent_sha256_init(&h);
	while ((n = read(fd, buf, TRACE_HASH_CHUNK)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		agent_sha256_update(&h, buf, (size_t)n);
		bytes += (uint64_t)n;
	}
	free(buf);
	t->files_hashed++;
	t->bytes_hashed += bytes;
	if (n < 0 || fstat(fd, &after) != 0) {
		close(fd);
		return -EIO;
	}
	close(fd);
	agent_sha256_final(&h, out);
	/* Remembered only for what was read: the same file, unchanged
	 * while it was read, and settled before. */
	if (after.st_ino == st->st_ino && after.st_dev == st->st_dev &&
	    after.st_size == st->st_size && (uint64_t)after.st_size == bytes &&
	    trace_same_time(after.st_mtim, st->st_mtim) &&
	    trace_same_time(after.st_ctim, st->st_ctim) &&
	    trace_ns(st->st_ctim) + TRACE_MEMO_SETTLE_NS < trace_ns(began)) {
		m->used = true;
		m->dev = st->st_dev;
		m->ino = st->st_ino;
		m->size = st->st_size;
		m->mtime = st->st_mtim;
		m->ctime = st->st_ctim;
		memcpy(m->sum, out, AGENT_SHA256_LEN);
	} else if (m->used && m->dev == st->st_dev && m->ino == st->st_ino) {
		m->used = false;
	}
	return 0;
}

/* trace_add: appends one entry. Returns 0, or -1 when the trace is full
 * (truncated is then set) or out of memory (err set). */
static int
trace_add(struct trace *t, const char *path, Moat__V1__FsChange change,
    const struct stat *st, int hash_dirfd, const char *name)
{
	Moat__V1__FsTraceEntry *e;
	size_t cost = strlen(path) + 64;

	if (t->n >= t->max || t->budget + cost > AGENT_REPLY_BUDGET) {
		t->truncated = true;
		return -1;
	}
	if (t->n == t->alloc) {
		size_t na = t->alloc ? t->alloc * 2 : 64;
		void *ne = realloc(t->ents, na * sizeof(*t->ents));
		void *ns;

		if (ne == NULL) {
			t->err = -ENOMEM;
			return -1;
		}
		t->ents = ne;
		if ((ns = realloc(t->sums, na * sizeof(*t->sums))) == NULL) {
			t->err = -ENOMEM;
			return -1;
		}
		t->sums = ns;
		t->alloc = na;
	}
	e = &t->ents[t->n];
	moat__v1__fs_trace_entry__init(e);
	if ((e->path = strdup(path)) == NULL) {
		t->err = -ENOMEM;
		return -1;
	}
	e->change = change;
	if (st != NULL) {
		e->type = agent_file_type(st->st_mode);
		e->mode = st->st_mode & 07777;
		if (change != MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED &&
		    !S_ISDIR(st->st_mode))
			e->size = (uint64_t)st->st_size;
	}
	if (t->hash && change != MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED &&
	    st != NULL && S_ISREG(st->st_mode) &&
	    trace_hash(t, hash_dirfd, name, st, t->sums[t->n]) == 0) {
		e->sha256.data = t->sums[t->n];
		e->sha256.len = AGENT_SHA256_LEN;
	}
	t->budget += cost;
	t->n++;
	return 0;
}

static bool
trace_is_whiteout(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

static bool
trace_is_opaque(int dirfd)
{
	char v[4];
	ssize_t n;

	n = fgetxattr(dirfd, "trusted.overlay.opaque", v, sizeof(v));
	if (n < 0) /* overlays mounted with userxattr */
		n = fgetxattr(dirfd, "user.overlay.opaque", v, sizeof(v));
	return n == 1 && v[0] == 'y';
}

static int
trace_open_dir(int dirfd, const char *name)
{
	if (dirfd < 0)
		return -1;
	return openat(dirfd, name,
	    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* trace_hidden: the lower entries an opaque upper dir hides. */
static int
trace_hidden(struct trace *t, int upper, int lower, const char *dir)
{
	char **names = NULL;
	size_t n = 0, i;
	int rv = 0;

	if (trace_names(lower, t->max + 1, &names, &n) != 0)
		return 0; /* nothing readable to hide */
	for (i = 0; i < n && rv == 0; i++) {
		struct stat ust, lst;
		char *path;

		if (fstatat(upper, names[i], &ust, AT_SYMLINK_NOFOLLOW) == 0 ||
		    fstatat(lower, names[i], &lst, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if ((path = moat_asprintf("%s/%s", dir, names[i])) == NULL) {
			t->err = -ENOMEM;
			rv = -1;
			break;
		}
		rv = trace_add(t, path, MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED,
		    &lst, -1, NULL);
		free(path);
	}
	trace_names_free(names, n);
	return rv;
}

/* trace_dir: reports what is under upper dir `dir` ("" is the root);
 * `lower` is the same dir in the image, or -1 when it has none. Returns
 * 0, or -1 to stop the whole walk. */
static int
trace_dir(struct trace *t, int upper, int lower, const char *dir, int depth)
{
	char **names = NULL;
	size_t n = 0, i;
	int rv = 0;

	if (depth > TRACE_DEPTH_MAX) {
		t->truncated = true;
		return 0;
	}
	if ((rv = trace_names(upper, t->max + 1, &names, &n)) != 0) {
		t->err = rv;
		return -1;
	}
	for (i = 0; i < n && rv == 0; i++) {
		struct stat st, lst;
		bool in_lower;
		char *path;

		if (fstatat(upper, names[i], &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue; /* gone meanwhile */
		in_lower = lower >= 0 &&
		    fstatat(lower, names[i], &lst, AT_SYMLINK_NOFOLLOW) == 0;
		if ((path = moat_asprintf("%s/%s", dir, names[i])) == NULL) {
			t->err = -ENOMEM;
			rv = -1;
			break;
		}
		if (trace_is_whiteout(&st)) {
			rv = trace_add(t, path,
			    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED,
			    in_lower ? &lst : NULL, -1, NULL);
		} else if (S_ISDIR(st.st_mode)) {
			int ufd = trace_open_dir(upper, names[i]);
			int lfd = -1;
			bool opaque = false, report = !in_lower;

			if (ufd < 0) {
				free(path);
				continue;
			}
			if (in_lower && S_ISDIR(lst.st_mode)) {
				opaque = trace_is_opaque(ufd);
				report = opaque || st.st_uid != lst.st_uid ||
				    st.st_gid != lst.st_gid ||
				    (st.st_mode & 07777) !=
				        (lst.st_mode & 07777);
				lfd = trace_open_dir(lower, names[i]);
			} else if (in_lower) {
				report = true; /* a file became a directory */
			}
			if (report)
				rv = trace_add(t, path,
				    in_lower ?
				        MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED :
				        MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED,
				    &st, -1, NULL);
			if (rv == 0 && opaque && lfd >= 0)
				rv = trace_hidden(t, ufd, lfd, path);
			if (rv == 0)
				rv = trace_dir(t, ufd, opaque ? -1 : lfd, path,
				    depth + 1);
			if (lfd >= 0)
				close(lfd);
			close(ufd);
		} else {
			rv = trace_add(t, path,
			    in_lower ?
			        MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED :
			        MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED,
			    &st, upper, names[i]);
		}
		free(path);
	}
	trace_names_free(names, n);
	return rv;
}

int
agent_fs_trace(struct agent *a, const Moat__V1__GuestRequest *req, char **why)
{
	const Moat__V1__FsTraceRequest *fr = req->fs_trace;
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__FsTrace trace = MOAT__V1__FS_TRACE__INIT;
	Moat__V1__FsTraceEntry **ptrs = NULL;
	struct trace t = { 0 };
	int upper, lower = -1, rv = MOAT_OK;
	size_t i;

	if (a->upper_fd < 0) {
		*why = strdup("this agent has no overlay to trace (it was not "
		              "booted with a scratch disk; in host mode pass "
		              "--trace-upper and --trace-lower)");
		return MOAT_FAILED_PRECONDITION;
	}
	t.max = fr->max_entries ? fr->max_entries : AGENT_TRACE_MAX;
	if (t.max > AGENT_TRACE_HARD_MAX)
		t.max = AGENT_TRACE_HARD_MAX;
	t.hash = fr->hash;
	upper = openat(a->upper_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (upper < 0)
		return agent_path_error(-errno, "the overlay upper dir",
		    "read", why);
	if (a->lower_fd >= 0)
		lower = openat(a->lower_fd, ".",
		    O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	(void)trace_dir(&t, upper, lower, "", 0);
	close(upper);
	if (lower >= 0)
		close(lower);
	if (t.err != 0) {
		rv = agent_path_error(t.err, "the overlay upper dir", "trace",
		    why);
		goto out;
	}
	if (t.n > 0 && (ptrs = calloc(t.n, sizeof(*ptrs))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	for (i = 0; i < t.n; i++) {
		/* sums moved with realloc: point the hashes again */
		if (t.ents[i].sha256.len > 0)
			t.ents[i].sha256.data = t.sums[i];
		ptrs[i] = &t.ents[i];
	}
	trace.entries = ptrs;
	trace.n_entries = t.n;
	trace.truncated = t.truncated;
	trace.files_hashed = t.files_hashed;
	trace.bytes_hashed = t.bytes_hashed;
	m.id = req->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_FS_TRACE;
	m.fs_trace = &trace;
	(void)agent_send(a, &m);
out:
	for (i = 0; i < t.n; i++)
		free(t.ents[i].path);
	free(t.ents);
	free(t.sums);
	free(ptrs);
	return rv;
}
