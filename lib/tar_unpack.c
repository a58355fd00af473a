/*
 * tar_unpack.c: unpacking a checked archive under one directory fd. Every
 * member's directory is reached component by component with openat(...,
 * O_NOFOLLOW), made with mkdirat where missing, so neither a link in the
 * archive nor one a racing process plants can send a write elsewhere;
 * what already sits at a member's name (a file or a link) is unlinked
 * first rather than written through. Directory modes and mtimes are set
 * last, deepest first, so a read-only directory is still filled.
 * Not for: the rules (tar.c, moat_tar_check) or packing (tar_pack.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

#define UNPACK_BUF (256u << 10)

struct dir_fix {
	char *name;
	uint32_t mode;
	int64_t mtime;
};

struct unpack {
	int root;
	char *last_dir; /* the directory of the last member, open ... */
	int last_fd;    /* ... as this fd (-1: none) */
	struct dir_fix *dirs;
	size_t ndirs, cap;
	uint8_t *buf;
	struct moat_tar_stats st;
};

static int
unpack_err(int err, const char *name, const char *doing, char **why)
{
	*why = moat_asprintf("cannot %s \"%s\" in the target: %s%s", doing,
	    name, strerror(err),
	    err == ELOOP || err == ENOTDIR ?
	        " (a symlink or file is in the way; remove it and retry)" :
	        "");
	if (err == ELOOP || err == ENOTDIR)
		return MOAT_FAILED_PRECONDITION;
	return moat_status_from_errno(err);
}

/* open_dir: opens the directory `path` (cleaned, relative; "" is the
 * root) below u->root without following links, making what is missing.
 * Returns an fd (O_RDONLY) or -errno. */
static int
open_dir(const struct unpack *u, const char *path, bool make)
{
	int cur = dup(u->root);
	const char *p = path;

	if (cur < 0)
		return -errno;
	while (*p) {
		const char *s = strchr(p, '/');
		size_t n = s ? (size_t)(s - p) : strlen(p);
		char comp[256];
		int next;

		if (n >= sizeof(comp)) {
			close(cur);
			return -ENAMETOOLONG;
		}
		memcpy(comp, p, n);
		comp[n] = '\0';
		next = openat(cur, comp,
		    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0 && errno == ENOENT && make &&
		    mkdirat(cur, comp, 0755) == 0)
			next = openat(cur, comp,
			    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			int err = errno;

			close(cur);
			return -err;
		}
		close(cur);
		cur = next;
		p += n;
		if (*p == '/')
			p++;
	}
	return cur;
}

/* split: the parent part of a cleaned name into dir (PATH_MAX) and a
 * pointer to the last component. */
static const char *
split(const char *clean, char *dir, size_t dirlen)
{
	const char *slash = strrchr(clean, '/');

	if (slash == NULL) {
		dir[0] = '\0';
		return clean;
	}
	snprintf(dir, dirlen, "%.*s", (int)(slash - clean), clean);
	return slash + 1;
}

/* clear_name: removes a non-directory at name so it can be made anew. */
static int
clear_name(int dfd, const char *base)
{
	if (unlinkat(dfd, base, 0) == 0 || errno == ENOENT)
		return 0;
	return -errno;
}

static int
put_file(struct unpack *u, struct moat_tar_reader *r,
    const struct moat_tar_entry *e, int dfd, const char *base,
    const char *clean, char **why)
{
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { e->mtime, 0 } };
	ssize_t n;
	int fd, rv;

	fd = openat(dfd, base,
	    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EEXIST) {
		/* Something is there: replaced, never written through. */
		if ((rv = clear_name(dfd, base)) != 0)
			return unpack_err(-rv, clean, "replace", why);
		fd = openat(dfd, base,
		    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	}
	if (fd < 0)
		return unpack_err(errno, clean, "create", why);
	while ((n = moat_tar_read_data(r, u->buf, UNPACK_BUF, why)) > 0) {
		if ((rv = moat_tar_write_all(fd, u->buf, (size_t)n)) != 0) {
			close(fd);
			return unpack_err(-rv, clean, "write", why);
		}
	}
	if (n < 0) {
		close(fd);
		return (int)-n;
	}
	/* No setuid or setgid: the files belong to whoever unpacks. */
	if (fchmod(fd, e->mode & 0777) != 0 || futimens(fd, ts) != 0) {
		int err = errno;

		close(fd);
		return unpack_err(err, clean, "set the mode of", why);
	}
	close(fd);
	u->st.files++;
	u->st.bytes += e->size;
	return 0;
}

static int
put_dir(struct unpack *u, const struct moat_tar_entry *e, int dfd,
    const char *base, const char *clean, char **why)
{
	struct dir_fix *d;

	if (mkdirat(dfd, base, 0700) != 0 && errno != EEXIST)
		return unpack_err(errno, clean, "make directory", why);
	if (u->ndirs == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 64;

		if ((d = realloc(u->dirs, cap * sizeof(*d))) == NULL)
			return unpack_err(ENOMEM, clean, "remember", why);
		u->dirs = d;
		u->cap = cap;
	}
	d = &u->dirs[u->ndirs];
	if ((d->name = strdup(clean)) == NULL)
		return unpack_err(ENOMEM, clean, "remember", why);
	d->mode = e->mode & 01777;
	d->mtime = e->mtime;
	u->ndirs++;
	u->st.dirs++;
	return 0;
}

static int
put_link(struct unpack *u, const struct moat_tar_entry *e, int dfd,
    const char *base, const char *clean, char **why)
{
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { e->mtime, 0 } };
	int rv;

	if ((rv = clear_name(dfd, base)) != 0)
		return unpack_err(-rv, clean, "replace", why);
	if (symlinkat(e->link, dfd, base) != 0)
		return unpack_err(errno, clean, "make symlink", why);
	(void)utimensat(dfd, base, ts, AT_SYMLINK_NOFOLLOW);
	u->st.symlinks++;
	return 0;
}

/* member_dir: the fd of a member's directory; the last one is kept, as
 * members of one directory usually follow each other. Not to be closed
 * by the caller. */
static int
member_dir(struct unpack *u, const char *dir)
{
	int fd;

	if (u->last_fd >= 0 && strcmp(u->last_dir, dir) == 0)
		return u->last_fd;
	if ((fd = open_dir(u, dir, true)) < 0)
		return fd;
	if (u->last_fd >= 0)
		close(u->last_fd);
	free(u->last_dir);
	if ((u->last_dir = strdup(dir)) == NULL) {
		close(fd);
		u->last_fd = -1;
		return -ENOMEM;
	}
	u->last_fd = fd;
	return fd;
}

static int
put_member(struct unpack *u, struct moat_tar_reader *r,
    const struct moat_tar_entry *e, char **why)
{
	char clean[4096], dir[4096];
	const char *base;
	int dfd, rv;

	if ((rv = moat_tar_clean_name(e->name, clean, sizeof(clean), why)) !=
	    0)
		return -rv;
	if (clean[0] == '\0')
		return 0; /* "./": the target itself */
	base = split(clean, dir, sizeof(dir));
	if ((dfd = member_dir(u, dir)) < 0)
		return unpack_err(-dfd, dir, "open directory", why);
	if (e->type == '5')
		rv = put_dir(u, e, dfd, base, clean, why);
	else if (e->type == '2')
		rv = put_link(u, e, dfd, base, clean, why);
	else
		rv = put_file(u, r, e, dfd, base, clean, why);
	return rv;
}

/* fix_dirs: modes and mtimes of the directories, deepest last-made
 * first, so making their contents did not change the mtimes again. */
static void
fix_dirs(struct unpack *u)
{
	for (size_t i = u->ndirs; i-- > 0;) {
		struct dir_fix *d = &u->dirs[i];
		struct timespec ts[2] = { { 0, UTIME_OMIT }, { d->mtime, 0 } };
		int fd = open_dir(u, d->name, false);

		if (fd >= 0) {
			(void)fchmod(fd, d->mode);
			(void)futimens(fd, ts);
			close(fd);
		}
		free(d->name);
	}
	free(u->dirs);
}

int
moat_tar_unpack(int fd, int dirfd, uint64_t cap, struct moat_tar_stats *st,
    char **why)
{
	struct unpack u = { .root = dirfd, .last_fd = -1 };
	struct moat_tar_reader r;
	struct moat_tar_entry *e;
	int rv;

	if (lseek(fd, 0, SEEK_SET) != 0) {
		*why = moat_asprintf("the archive cannot be reread: %s",
		    strerror(errno));
		return MOAT_INTERNAL;
	}
	if ((rv = moat_tar_check(fd, cap, NULL, why)) != 0)
		return rv;
	if (lseek(fd, 0, SEEK_SET) != 0) {
		*why = moat_asprintf("the archive cannot be reread: %s",
		    strerror(errno));
		return MOAT_INTERNAL;
	}
	if ((u.buf = malloc(UNPACK_BUF)) == NULL) {
		*why = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	moat_tar_reader_init(&r, fd);
	while ((rv = moat_tar_next(&r, &e, why)) > 0)
		if ((rv = put_member(&u, &r, e, why)) != 0)
			break;
	if (rv < 0)
		rv = -rv;
	moat_tar_reader_free(&r);
	if (u.last_fd >= 0)
		close(u.last_fd);
	free(u.last_dir);
	fix_dirs(&u);
	free(u.buf);
	if (st != NULL)
		*st = u.st;
	return rv;
}
