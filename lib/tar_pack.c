/*
 * tar_pack.c: packing a directory tree (or one file) into a tar archive.
 * The walk goes by fd (openat with O_NOFOLLOW from the top), so a symlink
 * is stored as a link and never followed, and a tree changed during the
 * walk cannot make it read outside the top. FIFOs, sockets and device
 * nodes are skipped and counted: opening one can block or have effects.
 * Entries in a directory are sorted by name so an archive is reproducible.
 * Also the staging file an archive waits in. Not for: reading (tar.c)
 * or unpacking (tar_unpack.c).
 */
#include <dirent.h>
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

#define PACK_BUF (256u << 10)

struct pack {
	int out;
	uint8_t *buf;
	struct moat_tar_stats st;
};

static int
pack_err(int err, const char *name, const char *doing, char **why)
{
	*why = moat_asprintf("cannot %s \"%s\" while packing: %s", doing, name,
	    strerror(err));
	return moat_status_from_errno(err);
}

/* pack_file: a regular file's header and contents; exactly st_size
 * bytes go out even if the file changes meanwhile (zeros pad a file
 * that shrank, a grown one is cut), so the archive stays well formed. */
static int
pack_fd(struct pack *p, int fd, const char *name, const struct stat *st,
    char **why)
{
	struct moat_tar_entry e = { '0', (char *)name, NULL,
		(uint64_t)st->st_size, st->st_mode & 07777,
		st->st_mtim.tv_sec };
	uint64_t left = e.size;
	size_t pad =
	    (MOAT_TAR_BLOCK - e.size % MOAT_TAR_BLOCK) % MOAT_TAR_BLOCK;
	int rv;

	if ((rv = moat_tar_write_header(p->out, &e)) != 0)
		return pack_err(-rv, name, "write the archive for", why);
	while (left > 0) {
		size_t want = left > PACK_BUF ? PACK_BUF : (size_t)left;
		ssize_t n = read(fd, p->buf, want);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return pack_err(errno, name, "read", why);
		if (n == 0) {
			memset(p->buf, 0, want);
			n = (ssize_t)want;
		}
		if ((rv = moat_tar_write_all(p->out, p->buf, (size_t)n)) != 0)
			return pack_err(-rv, name, "write the archive for",
			    why);
		left -= (uint64_t)n;
	}
	memset(p->buf, 0, pad);
	if ((rv = moat_tar_write_all(p->out, p->buf, pad)) != 0)
		return pack_err(-rv, name, "write the archive for", why);
	p->st.files++;
	p->st.bytes += e.size;
	return 0;
}

static int
pack_file(struct pack *p, int dfd, const char *base, const char *name,
    const struct stat *st, char **why)
{
	int fd =
	    openat(dfd, base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	int rv;

	if (fd < 0)
		return pack_err(errno, name, "open", why);
	rv = pack_fd(p, fd, name, st, why);
	close(fd);
	return rv;
}

static int
pack_link(struct pack *p, int dfd, const char *base, const char *name,
    const struct stat *st, char **why)
{
	char target[4096];
	ssize_t n = readlinkat(dfd, base, target, sizeof(target) - 1);
	struct moat_tar_entry e = { '2', (char *)name, target, 0, 0777,
		st->st_mtim.tv_sec };
	int rv;

	if (n < 0)
		return pack_err(errno, name, "read the symlink", why);
	target[n] = '\0';
	if ((rv = moat_tar_write_header(p->out, &e)) != 0)
		return pack_err(-rv, name, "write the archive for", why);
	p->st.symlinks++;
	return 0;
}

static int
name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* dir_names: the sorted entry names of an open directory (heap). */
static int
dir_names(int dfd, char ***out, size_t *count)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int fd = dup(dfd);

	if (fd < 0 || (d = fdopendir(fd)) == NULL) {
		int err = errno;

		if (fd >= 0)
			close(fd);
		return -err;
	}
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 ||
		    strcmp(de->d_name, "..") == 0)
			continue;
		if (n == cap) {
			char **g = realloc(names,
			    (cap = cap ? cap * 2 : 64) * sizeof(*names));

			if (g == NULL)
				break;
			names = g;
		}
		if ((names[n] = strdup(de->d_name)) == NULL)
			break;
		n++;
	}
	closedir(d);
	if (n > 1)
		qsort(names, n, sizeof(*names), name_cmp);
	*out = names;
	*count = n;
	return 0;
}

static int pack_dir(struct pack *p, int dfd, const char *prefix, int depth,
    char **why);

/* pack_one: the entry `base` of directory dfd, archived as `name`. */
static int
pack_one(struct pack *p, int dfd, const char *base, const char *name,
    int depth, char **why)
{
	struct stat st;
	int sub, rv;

	if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return errno == ENOENT ? 0 :
		                         pack_err(errno, name, "stat", why);
	if (S_ISREG(st.st_mode))
		return pack_file(p, dfd, base, name, &st, why);
	if (S_ISLNK(st.st_mode))
		return pack_link(p, dfd, base, name, &st, why);
	if (!S_ISDIR(st.st_mode)) {
		p->st.skipped++;
		return 0;
	}
	if (depth >= MOAT_TAR_DEPTH_MAX) {
		*why = moat_asprintf("\"%s\" is nested more than %d "
		                     "directories deep",
		    name, MOAT_TAR_DEPTH_MAX);
		return MOAT_OUT_OF_RANGE;
	}
	char *dname = moat_asprintf("%s/", name);
	struct moat_tar_entry e = { '5', dname, NULL, 0, st.st_mode & 07777,
		st.st_mtim.tv_sec };

	if (dname == NULL)
		return pack_err(ENOMEM, name, "pack", why);
	rv = moat_tar_write_header(p->out, &e);
	free(dname);
	if (rv != 0)
		return pack_err(-rv, name, "write the archive for", why);
	p->st.dirs++;
	sub =
	    openat(dfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sub < 0)
		return pack_err(errno, name, "open directory", why);
	rv = pack_dir(p, sub, name, depth + 1, why);
	close(sub);
	return rv;
}

static int
pack_dir(struct pack *p, int dfd, const char *prefix, int depth, char **why)
{
	char **names = NULL;
	size_t n = 0, i;
	int rv;

	if ((rv = dir_names(dfd, &names, &n)) != 0)
		return pack_err(-rv, prefix[0] ? prefix : ".", "list", why);
	for (i = 0, rv = 0; i < n && rv == 0; i++) {
		char *name = prefix[0] ?
		    moat_asprintf("%s/%s", prefix, names[i]) :
		    strdup(names[i]);

		rv = name ? pack_one(p, dfd, names[i], name, depth, why) :
		            pack_err(ENOMEM, names[i], "pack", why);
		free(name);
	}
	for (i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return rv;
}

int
moat_tar_pack(int src, const char *name, int out_fd, struct moat_tar_stats *st,
    char **why)
{
	struct pack p = { .out = out_fd };
	struct stat sst;
	int rv;

	if (fstat(src, &sst) != 0)
		return pack_err(errno, name, "stat", why);
	if ((p.buf = malloc(PACK_BUF)) == NULL)
		return pack_err(ENOMEM, name, "pack", why);
	if (S_ISDIR(sst.st_mode)) {
		rv = pack_dir(&p, src, "", 0, why);
	} else if (S_ISREG(sst.st_mode)) {
		rv = pack_fd(&p, src, name, &sst, why);
	} else {
		*why = moat_asprintf("\"%s\" is neither a directory nor a "
		                     "regular file: nothing to pack",
		    name);
		rv = MOAT_FAILED_PRECONDITION;
	}
	if (rv == 0 && (rv = moat_tar_write_end(out_fd)) != 0)
		rv = pack_err(-rv, name, "end the archive", why);
	free(p.buf);
	if (st != NULL)
		*st = p.st;
	return rv;
}

int
moat_tar_staging(const char *dir)
{
	char tmpl[4096];
	int fd;

	if (dir == NULL && (dir = getenv("TMPDIR")) == NULL)
		dir = "/tmp";
	if (dir[0] == '\0')
		dir = "/tmp";
	if ((fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) >= 0)
		return fd;
	snprintf(tmpl, sizeof(tmpl), "%s/moat-archive-XXXXXX", dir);
	if ((fd = mkostemp(tmpl, O_CLOEXEC)) < 0)
		return -errno;
	(void)unlink(tmpl);
	return fd;
}
