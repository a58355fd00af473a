/*
 * files.c: the file requests: read and write (binary, at an offset, at
 * most MOAT_GUEST_IO_MAX bytes a request), list, stat, remove and mkdir.
 * Every path goes through path.c first, so it is absolute, cleaned, not
 * under /proc, /sys or /dev, and resolved inside the agent's root. Only
 * regular files are read or written: a FIFO or a device node is refused
 * before it is opened for real (opening one can block or have effects).
 * Not for: path rules (path.c) or the fs trace (fstrace.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "moat/status.h"
#include "moat/util.h"

#define FILES_RM_DEPTH_MAX 128
#define FILES_OFFSET_MAX (1ull << 60)

struct files_entry {
	char *name;
	struct stat st;
};

Moat__V1__FileType
agent_file_type(mode_t mode)
{
	if (S_ISREG(mode))
		return MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR;
	if (S_ISDIR(mode))
		return MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
	if (S_ISLNK(mode))
		return MOAT__V1__FILE_TYPE__FILE_TYPE_SYMLINK;
	return MOAT__V1__FILE_TYPE__FILE_TYPE_OTHER;
}

static const char *
files_kind(mode_t mode)
{
	if (S_ISDIR(mode))
		return "a directory";
	if (S_ISLNK(mode))
		return "a symbolic link";
	if (S_ISFIFO(mode))
		return "a FIFO";
	if (S_ISSOCK(mode))
		return "a socket";
	if (S_ISCHR(mode) || S_ISBLK(mode))
		return "a device node";
	return "not a regular file";
}

static const char *
files_basename(const char *clean)
{
	const char *slash = strrchr(clean, '/');

	return slash[1] ? slash + 1 : "/";
}

/* files_info: fills fi from st; strings are borrowed. */
static void
files_info(Moat__V1__FileInfo *fi, const char *name, const char *path,
    const struct stat *st)
{
	fi->name = (char *)name;
	fi->path = (char *)path;
	fi->size = (uint64_t)st->st_size;
	fi->mode = st->st_mode & 07777;
	fi->mtime_ns =
	    (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
	fi->type = agent_file_type(st->st_mode);
}

static void
files_send_info(struct agent *a, uint64_t id, const char *clean,
    const struct stat *st)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__FileInfo fi = MOAT__V1__FILE_INFO__INIT;

	files_info(&fi, files_basename(clean), clean, st);
	m.id = id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_FILE_STAT;
	m.file_stat = &fi;
	(void)agent_send(a, &m);
}

/* files_open_regular: opens an existing regular file with flags, after
 * making sure (through an O_PATH fd, which opens nothing) that it is
 * one. Returns an fd with *st filled, or -1 with the status in *rv. */
static int
files_open_regular(struct agent *a, const char *clean, int flags,
    const char *doing, struct stat *st, int *rv, char **why)
{
	struct stat again;
	int fdp, fd;

	if ((fdp = agent_path_open(a, clean, O_PATH, 0)) < 0) {
		*rv = agent_path_error(fdp, clean, doing, why);
		return -1;
	}
	if (fstat(fdp, st) != 0) {
		*rv = agent_path_error(-errno, clean, doing, why);
		close(fdp);
		return -1;
	}
	close(fdp);
	if (!S_ISREG(st->st_mode)) {
		*why = moat_asprintf("cannot %s %s: it is %s, not a regular "
		                     "file%s",
		    doing, clean, files_kind(st->st_mode),
		    S_ISDIR(st->st_mode) ? " (use file_list)" : "");
		*rv = MOAT_FAILED_PRECONDITION;
		return -1;
	}
	fd = agent_path_open(a, clean, flags | O_NONBLOCK | O_NOCTTY, 0);
	if (fd < 0) {
		*rv = agent_path_error(fd, clean, doing, why);
		return -1;
	}
	if (fstat(fd, &again) != 0 || again.st_dev != st->st_dev ||
	    again.st_ino != st->st_ino) {
		close(fd);
		*why = moat_asprintf("cannot %s %s: it was replaced while "
		                     "being opened; retry",
		    doing, clean);
		*rv = MOAT_ABORTED;
		return -1;
	}
	*st = again;
	return fd;
}

int
agent_file_read(struct agent *a, const Moat__V1__GuestRequest *req, char **why)
{
	const Moat__V1__GuestFileRead *fr = req->file_read;
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__FileData fd_msg = MOAT__V1__FILE_DATA__INIT;
	char clean[PATH_MAX];
	size_t want, got = 0;
	struct stat st;
	uint8_t *buf;
	int rv, fd;

	if ((rv = agent_path_clean(fr->path, false, clean, why)) != 0)
		return rv;
	if (fr->length > MOAT_GUEST_IO_MAX) {
		*why = moat_asprintf("length %u is over the %u-byte limit of "
		                     "one read; read in chunks",
		    fr->length, MOAT_GUEST_IO_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	want = fr->length ? fr->length : MOAT_GUEST_IO_MAX;
	if ((fd = files_open_regular(a, clean, O_RDONLY, "read", &st, &rv,
	         why)) < 0)
		return rv;
	if ((buf = malloc(want)) == NULL) {
		close(fd);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	while (got < want && fr->offset < FILES_OFFSET_MAX) {
		ssize_t n = pread(fd, buf + got, want - got,
		    (off_t)(fr->offset + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rv = agent_path_error(-errno, clean, "read", why);
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	m.id = req->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_FILE_DATA;
	m.file_data = &fd_msg;
	fd_msg.data.data = buf;
	fd_msg.data.len = got;
	fd_msg.size = (uint64_t)st.st_size;
	fd_msg.eof = got < want || fr->offset + got >= (uint64_t)st.st_size;
	fd_msg.mode = st.st_mode & 07777;
	(void)agent_send(a, &m);
	rv = MOAT_OK;
out:
	free(buf);
	close(fd);
	return rv;
}

/* files_create: makes a new regular file (and its parents when asked)
 * with exactly `mode`. Returns an fd, or -1 with *rv set. */
static int
files_create(struct agent *a, const char *clean, mode_t mode, bool parents,
    int *rv, char **why)
{
	int fd;

	if (parents && strrchr(clean, '/') != clean) {
		char dir[PATH_MAX];
		size_t n = (size_t)(strrchr(clean, '/') - clean);

		memcpy(dir, clean, n);
		dir[n] = '\0';
		if ((fd = agent_path_mkdirs(a, dir, 0755)) != 0) {
			*rv = agent_path_error(fd, dir, "make directory", why);
			return -1;
		}
	}
	fd = agent_path_open(a, clean,
	    O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK | O_NOCTTY, mode);
	if (fd == -ENOENT) {
		*why = moat_asprintf("the directory holding %s does not "
		                     "exist; create it or set make_parents",
		    clean);
		*rv = MOAT_NOT_FOUND;
		return -1;
	}
	if (fd < 0) {
		*rv = agent_path_error(fd, clean, "create", why);
		return -1;
	}
	if (fchmod(fd, mode) != 0) {
		*rv = agent_path_error(-errno, clean, "chmod", why);
		close(fd);
		return -1;
	}
	return fd;
}

int
agent_file_write(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__GuestFileWrite *fw = req->file_write;
	mode_t mode = fw->mode ? (fw->mode & 07777) : 0644;
	char clean[PATH_MAX];
	size_t done = 0;
	struct stat st;
	int rv, fd;

	if ((rv = agent_path_clean(fw->path, false, clean, why)) != 0)
		return rv;
	if (fw->data.len > MOAT_GUEST_IO_MAX) {
		*why = moat_asprintf(
		    "%zu bytes is over the %u-byte limit of "
		    "one write; write in chunks at increasing offsets",
		    fw->data.len, MOAT_GUEST_IO_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if (fw->offset > FILES_OFFSET_MAX) {
		*why = moat_asprintf("offset %llu is past any file size",
		    (unsigned long long)fw->offset);
		return MOAT_INVALID_ARGUMENT;
	}
	fd = agent_path_open(a, clean, O_PATH, 0);
	if (fd == -ENOENT) {
		fd = files_create(a, clean, mode, fw->make_parents, &rv, why);
	} else if (fd >= 0) {
		close(fd);
		fd = files_open_regular(a, clean, O_WRONLY, "write", &st, &rv,
		    why);
	} else {
		rv = agent_path_error(fd, clean, "write", why);
	}
	if (fd < 0)
		return rv;
	if (fw->truncate &&
	    ftruncate(fd, (off_t)(fw->offset + fw->data.len)) != 0) {
		rv = agent_path_error(-errno, clean, "truncate", why);
		goto out;
	}
	while (done < fw->data.len) {
		ssize_t n = pwrite(fd, fw->data.data + done,
		    fw->data.len - done, (off_t)(fw->offset + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rv = agent_path_error(n < 0 ? -errno : -EIO, clean,
			    "write", why);
			goto out;
		}
		done += (size_t)n;
	}
	if (fstat(fd, &st) != 0) {
		rv = agent_path_error(-errno, clean, "stat", why);
		goto out;
	}
	files_send_info(a, req->id, clean, &st);
	rv = MOAT_OK;
out:
	close(fd);
	return rv;
}

static int
files_entry_cmp(const void *x, const void *y)
{
	const struct files_entry *ex = x, *ey = y;

	return strcmp(ex->name, ey->name);
}

/* files_not_dir: the error for a path that should be a directory. */
static int
files_not_dir(struct agent *a, const char *clean, int err, char **why)
{
	struct stat st;
	int fd;

	if (err == -ENOTDIR &&
	    (fd = agent_path_open(a, clean, O_PATH, 0)) >= 0) {
		int known = fstat(fd, &st) == 0;

		close(fd);
		if (known && !S_ISDIR(st.st_mode)) {
			*why = moat_asprintf("%s is %s, not a directory; use "
			                     "file_stat or file_read",
			    clean,
			    S_ISREG(st.st_mode) ? "a file" :
			                          files_kind(st.st_mode));
			return MOAT_FAILED_PRECONDITION;
		}
	}
	return agent_path_error(err, clean, "list", why);
}

int
agent_file_list(struct agent *a, const Moat__V1__GuestRequest *req, char **why)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__FileList list = MOAT__V1__FILE_LIST__INIT;
	Moat__V1__FileInfo *infos = NULL, **ptrs = NULL;
	struct files_entry *ents = NULL;
	char clean[PATH_MAX], **paths = NULL;
	size_t n = 0, alloc = 0, i, budget = 0;
	struct dirent *de;
	DIR *dir;
	int rv, fd;

	if ((rv = agent_path_clean(req->file_list->path, false, clean, why)) !=
	    0)
		return rv;
	fd = agent_path_open(a, clean, O_RDONLY | O_DIRECTORY, 0);
	if (fd < 0)
		return files_not_dir(a, clean, fd, why);
	if ((dir = fdopendir(fd)) == NULL) {
		close(fd);
		return agent_path_error(-errno, clean, "list", why);
	}
	while ((de = readdir(dir)) != NULL) {
		struct stat st;

		if (strcmp(de->d_name, ".") == 0 ||
		    strcmp(de->d_name, "..") == 0)
			continue;
		if (n == AGENT_LIST_MAX) {
			list.truncated = true;
			break;
		}
		if (fstatat(dirfd(dir), de->d_name, &st,
		        AT_SYMLINK_NOFOLLOW) != 0)
			continue; /* removed meanwhile */
		if (n == alloc) {
			size_t na = alloc ? alloc * 2 : 64;
			void *ne = realloc(ents, na * sizeof(*ents));

			if (ne == NULL)
				goto fail_mem;
			ents = ne;
			alloc = na;
		}
		if ((ents[n].name = strdup(de->d_name)) == NULL)
			goto fail_mem;
		ents[n++].st = st;
	}
	if (n > 1) /* an empty directory has ents NULL: no qsort(NULL) */
		qsort(ents, n, sizeof(*ents), files_entry_cmp);
	infos = calloc(n ? n : 1, sizeof(*infos));
	ptrs = calloc(n ? n : 1, sizeof(*ptrs));
	paths = calloc(n ? n : 1, sizeof(*paths));
	if (infos == NULL || ptrs == NULL || paths == NULL)
		goto fail_mem;
	for (i = 0; i < n; i++) {
		paths[i] = moat_asprintf("%s/%s", clean[1] ? clean : "",
		    ents[i].name);
		if (paths[i] == NULL)
			goto fail_mem;
		budget += 2 * strlen(paths[i]) + 64;
		if (budget > AGENT_REPLY_BUDGET) {
			list.truncated = true;
			break;
		}
		moat__v1__file_info__init(&infos[i]);
		files_info(&infos[i], ents[i].name, paths[i], &ents[i].st);
		ptrs[i] = &infos[i];
	}
	list.n_entries = i;
	list.entries = ptrs;
	m.id = req->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_FILE_LIST;
	m.file_list = &list;
	(void)agent_send(a, &m);
	rv = MOAT_OK;
	goto out;
fail_mem:
	rv = MOAT_RESOURCE_EXHAUSTED;
	*why = moat_asprintf("out of memory listing %s", clean);
out:
	for (i = 0; i < n; i++) {
		free(ents[i].name);
		if (paths != NULL)
			free(paths[i]);
	}
	free(ents);
	free(paths);
	free(ptrs);
	free(infos);
	closedir(dir);
	return rv;
}

int
agent_file_stat(struct agent *a, const Moat__V1__GuestRequest *req, char **why)
{
	char clean[PATH_MAX];
	struct stat st;
	int rv, fd;

	if ((rv = agent_path_clean(req->file_stat->path, false, clean, why)) !=
	    0)
		return rv;
	if ((fd = agent_path_open(a, clean, O_PATH | O_NOFOLLOW, 0)) < 0)
		return agent_path_error(fd, clean, "stat", why);
	if (fstat(fd, &st) != 0) {
		rv = agent_path_error(-errno, clean, "stat", why);
		close(fd);
		return rv;
	}
	close(fd);
	files_send_info(a, req->id, clean, &st);
	return MOAT_OK;
}

/* files_rm_tree: removes directory `name` in dirfd and all below it,
 * staying on device `dev`. Returns 0 or the first -errno met (it goes on
 * after errors so as much as possible is gone). */
static int
files_rm_tree(int dirfd, const char *name, dev_t dev, int depth)
{
	struct dirent *de;
	struct stat st;
	int fd, rv = 0, pass;
	DIR *dir;

	if (depth > FILES_RM_DEPTH_MAX)
		return -ELOOP;
	fd = openat(dirfd, name,
	    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) != 0 || st.st_dev != dev) {
		close(fd);
		return -EXDEV;
	}
	if ((dir = fdopendir(fd)) == NULL) {
		close(fd);
		return -errno;
	}
	/* a second pass catches what readdir skipped while entries went */
	for (pass = 0; pass < 2; pass++) {
		rewinddir(dir);
		while ((de = readdir(dir)) != NULL) {
			int r = 0;

			if (strcmp(de->d_name, ".") == 0 ||
			    strcmp(de->d_name, "..") == 0)
				continue;
			if (fstatat(fd, de->d_name, &st,
			        AT_SYMLINK_NOFOLLOW) != 0)
				continue;
			if (S_ISDIR(st.st_mode))
				r = files_rm_tree(fd, de->d_name, dev,
				    depth + 1);
			else if (unlinkat(fd, de->d_name, 0) != 0)
				r = -errno;
			if (r != 0 && rv == 0)
				rv = r;
		}
	}
	closedir(dir);
	if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && rv == 0)
		rv = -errno;
	return rv;
}

int
agent_file_remove(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__GuestPath *gp = req->file_remove;
	char clean[PATH_MAX];
	const char *name;
	struct stat st;
	int rv, pfd, r;

	if ((rv = agent_path_clean(gp->path, false, clean, why)) != 0)
		return rv;
	if (strcmp(clean, "/") == 0) {
		*why = strdup("refusing to remove /");
		return MOAT_PERMISSION_DENIED;
	}
	if ((pfd = agent_path_parent(a, clean, &name)) < 0)
		return agent_path_error(pfd, clean, "remove", why);
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
		r = -errno;
	else if (!S_ISDIR(st.st_mode))
		r = unlinkat(pfd, name, 0) == 0 ? 0 : -errno;
	else if (gp->recursive)
		r = files_rm_tree(pfd, name, st.st_dev, 0);
	else
		r = unlinkat(pfd, name, AT_REMOVEDIR) == 0 ? 0 : -errno;
	close(pfd);
	if (r == -EEXIST)
		r = -ENOTEMPTY;
	if (r == -ELOOP && gp->recursive) {
		*why = moat_asprintf("%s is more than %d directories deep; "
		                     "remove it from an exec (rm -rf)",
		    clean, FILES_RM_DEPTH_MAX);
		return MOAT_FAILED_PRECONDITION;
	}
	if (r != 0)
		return agent_path_error(r, clean, "remove", why);
	agent_send_ack(a, req->id);
	return MOAT_OK;
}

int
agent_file_mkdir(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__GuestPath *gp = req->mkdir;
	mode_t mode = gp->mode ? (gp->mode & 07777) : 0755;
	char clean[PATH_MAX];
	const char *name;
	struct stat st;
	int rv, pfd, fd;

	if ((rv = agent_path_clean(gp->path, false, clean, why)) != 0)
		return rv;
	if (strcmp(clean, "/") == 0) {
		if (!gp->parents) {
			*why = strdup("/ already exists");
			return MOAT_ALREADY_EXISTS;
		}
		goto ack;
	}
	if (gp->parents && strrchr(clean, '/') != clean) {
		char dir[PATH_MAX];
		size_t n = (size_t)(strrchr(clean, '/') - clean);

		memcpy(dir, clean, n);
		dir[n] = '\0';
		if ((rv = agent_path_mkdirs(a, dir, 0755)) != 0)
			return agent_path_error(rv, dir, "make directory",
			    why);
	}
	if ((pfd = agent_path_parent(a, clean, &name)) < 0) {
		if (pfd != -ENOENT)
			return agent_path_error(pfd, clean, "mkdir", why);
		*why = moat_asprintf("the directory holding %s does not "
		                     "exist; create it or set parents",
		    clean);
		return MOAT_NOT_FOUND;
	}
	if (mkdirat(pfd, name, mode) != 0) {
		rv = -errno;
		if (rv == -EEXIST &&
		    fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    !S_ISDIR(st.st_mode)) {
			close(pfd);
			*why = moat_asprintf("%s exists and is %s, not a "
			                     "directory",
			    clean,
			    S_ISREG(st.st_mode) ? "a file" :
			                          files_kind(st.st_mode));
			return MOAT_FAILED_PRECONDITION;
		}
		close(pfd);
		if (rv == -EEXIST && gp->parents)
			goto ack;
		return agent_path_error(rv, clean, "mkdir", why);
	}
	/* the exact mode asked, whatever the umask */
	fd =
	    openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(pfd);
	if (fd < 0 || fchmod(fd, mode) != 0) {
		rv = agent_path_error(-errno, clean, "chmod", why);
		if (fd >= 0)
			close(fd);
		return rv;
	}
	close(fd);
ack:
	agent_send_ack(a, req->id);
	return MOAT_OK;
}
