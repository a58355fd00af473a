/*
 * path.c: where a path from the host may lead. Request paths are checked
 * (absolute, no NUL, bounded, not /proc, /sys or /dev), cleaned lexically,
 * then resolved inside the agent's root directory: "/" as PID 1, the
 * --root DIR in host mode. Symlinks and ".." inside symlink targets can
 * never climb out of that root: openat2(RESOLVE_IN_ROOT) does it where the
 * kernel has it; elsewhere (or with --no-openat2) a component-by-component
 * walk with O_NOFOLLOW does the same, one directory fd at a time, so a
 * concurrent rename cannot slip a symlink in between a check and its use.
 * Whatever is opened is checked again by filesystem type, so a symlink to
 * /proc/self/mem is refused too. Not for: what is done with the file
 * (files.c), or the exec's own view of the filesystem (not confined).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "moat/status.h"
#include "moat/util.h"

#define PATH_LINKS_MAX 40 /* as the kernel's MAXSYMLINKS */

static const char *const path_off_limits[] = { "/proc", "/sys", "/dev" };

/* Filesystems of kernel objects rather than files. */
static const unsigned long path_bad_fs[] = { PROC_SUPER_MAGIC, SYSFS_MAGIC,
	DEVPTS_SUPER_MAGIC, CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC,
	DEBUGFS_MAGIC, SECURITYFS_MAGIC, TRACEFS_MAGIC, BPF_FS_MAGIC,
	EFIVARFS_MAGIC, PSTOREFS_MAGIC, BINFMTFS_MAGIC };

static bool
path_under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	return strncmp(path, dir, n) == 0 &&
	    (path[n] == '\0' || path[n] == '/');
}

static bool
path_off_limits_p(const char *clean)
{
	size_t i;

	for (i = 0; i < sizeof(path_off_limits) / sizeof(path_off_limits[0]);
	     i++)
		if (path_under(clean, path_off_limits[i]))
			return true;
	return false;
}

int
agent_path_clean(const char *path, bool any_place, char *out, char **why)
{
	size_t len, o = 0;
	const char *p;

	if (path == NULL || path[0] == '\0') {
		*why = strdup("the path is empty; give an absolute path such "
		              "as /root/file.txt");
		return MOAT_INVALID_ARGUMENT;
	}
	if ((len = strlen(path)) >= PATH_MAX) {
		*why = moat_asprintf("the path is %zu bytes long; at most %d",
		    len, PATH_MAX - 1);
		return MOAT_INVALID_ARGUMENT;
	}
	if (path[0] != '/') {
		*why = moat_asprintf("path \"%.200s\" is not absolute; start "
		                     "it with /",
		    path);
		return MOAT_INVALID_ARGUMENT;
	}
	out[o++] = '/';
	for (p = path; *p != '\0';) {
		size_t n;

		while (*p == '/')
			p++;
		n = strcspn(p, "/");
		if (n == 0 || (n == 1 && p[0] == '.')) {
			p += n;
			continue;
		}
		if (n == 2 && p[0] == '.' && p[1] == '.') {
			if (o == 1) {
				*why = moat_asprintf("path %.200s climbs "
				                     "above / with ..",
				    path);
				return MOAT_PERMISSION_DENIED;
			}
			while (o > 1 && out[o - 1] != '/')
				o--;
			if (o > 1)
				o--; /* the slash before it */
			p += n;
			continue;
		}
		if (o > 1)
			out[o++] = '/';
		memcpy(out + o, p, n);
		o += n;
		p += n;
	}
	out[o] = '\0';
	if (!any_place && path_off_limits_p(out)) {
		*why = moat_asprintf(
		    "%.200s is not a file the agent may "
		    "touch (/proc, /sys and /dev are off limits; read them "
		    "from an exec)",
		    out);
		return MOAT_PERMISSION_DENIED;
	}
	return MOAT_OK;
}

int
agent_path_fd_allowed(struct agent *a, int fd)
{
	char link[64], target[PATH_MAX];
	struct statfs sfs;
	ssize_t n;
	size_t i;

	if (fstatfs(fd, &sfs) == 0)
		for (i = 0; i < sizeof(path_bad_fs) / sizeof(path_bad_fs[0]);
		     i++)
			if ((unsigned long)sfs.f_type == path_bad_fs[i])
				return -EPERM;
	if (a->confined)
		return 0; /* the root is the host's test tree; /dev there is
		           * an ordinary directory */
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if ((n = readlink(link, target, sizeof(target) - 1)) <= 0)
		return 0; /* no /proc: the fs type check stands alone */
	target[n] = '\0';
	return path_off_limits_p(target) ? -EPERM : 0;
}

/* path_walk_dirs: opens a symlink-free path (components only) from the
 * root, refusing symlinks. For ".." in symlink targets. */
static int
path_walk_dirs(struct agent *a, const char *resolved)
{
	char comp[NAME_MAX + 1];
	const char *p = resolved;
	int fd = openat(a->root_fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);

	while (fd >= 0) {
		size_t n;
		int next;

		while (*p == '/')
			p++;
		if ((n = strcspn(p, "/")) == 0)
			return fd;
		if (n > NAME_MAX) {
			close(fd);
			return -ENAMETOOLONG;
		}
		memcpy(comp, p, n);
		comp[n] = '\0';
		p += n;
		next = openat(fd, comp,
		    O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		close(fd);
		fd = next;
	}
	return -errno;
}

/* path_walk: openat2(RESOLVE_IN_ROOT) by hand. `rest` is what is left to
 * resolve; `resolved` the symlink-free path of dirfd below the root. */
static int
path_walk(struct agent *a, const char *clean, int flags, mode_t mode)
{
	char rest[2 * PATH_MAX], resolved[PATH_MAX], comp[NAME_MAX + 1];
	char target[PATH_MAX];
	bool follow_last = !(flags & O_NOFOLLOW);
	int dirfd, fd, links = 0;
	size_t rlen = 0;
	struct stat st;
	char *p;

	snprintf(rest, sizeof(rest), "%s", clean);
	resolved[0] = '\0';
	if ((dirfd = path_walk_dirs(a, "")) < 0)
		return dirfd;
	p = rest;
	for (;;) {
		size_t n;
		bool last;
		ssize_t tl;

		while (*p == '/')
			p++;
		n = strcspn(p, "/");
		if (n == 0) {
			/* the root itself, or a trailing slash */
			fd = openat(dirfd, ".", flags | O_CLOEXEC, mode);
			fd = fd < 0 ? -errno : fd;
			break;
		}
		if (n > NAME_MAX) {
			fd = -ENAMETOOLONG;
			break;
		}
		memcpy(comp, p, n);
		comp[n] = '\0';
		p += n;
		last = p[strspn(p, "/")] == '\0';
		if (strcmp(comp, ".") == 0)
			continue;
		if (strcmp(comp, "..") == 0) {
			while (rlen > 0 && resolved[rlen - 1] != '/')
				rlen--;
			if (rlen > 0)
				rlen--;
			resolved[rlen] = '\0';
			close(dirfd);
			if ((dirfd = path_walk_dirs(a, resolved)) < 0)
				return dirfd;
			continue;
		}
		if ((!last || follow_last) &&
		    fstatat(dirfd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISLNK(st.st_mode)) {
			if (++links > PATH_LINKS_MAX) {
				fd = -ELOOP;
				break;
			}
			tl = readlinkat(dirfd, comp, target,
			    sizeof(target) - 1);
			if (tl <= 0 ||
			    (size_t)tl + strlen(p) + 2 > sizeof(rest)) {
				fd = tl < 0 ? -errno : -ENAMETOOLONG;
				break;
			}
			target[tl] = '\0';
			/* rest = target + what followed the link */
			memmove(rest + tl + 1, p, strlen(p) + 1);
			memcpy(rest, target, (size_t)tl);
			rest[tl] = '/';
			p = rest;
			if (target[0] == '/') {
				close(dirfd);
				rlen = 0;
				resolved[0] = '\0';
				if ((dirfd = path_walk_dirs(a, "")) < 0)
					return dirfd;
			}
			continue;
		}
		if (last) {
			fd = openat(dirfd, comp,
			    flags | O_NOFOLLOW | O_CLOEXEC, mode);
			if (fd < 0 && follow_last && errno == ELOOP &&
			    ++links <= PATH_LINKS_MAX) {
				/* a symlink since fstatat: look again */
				p -= n;
				continue;
			}
			fd = fd < 0 ? -errno : fd;
			break;
		}
		fd = openat(dirfd, comp,
		    O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			fd = -errno;
			break;
		}
		close(dirfd);
		dirfd = fd;
		if (rlen + n + 2 > sizeof(resolved)) {
			fd = -ENAMETOOLONG;
			break;
		}
		resolved[rlen++] = '/';
		memcpy(resolved + rlen, comp, n + 1);
		rlen += n;
		fd = -1;
	}
	close(dirfd);
	return fd;
}

static int
path_openat2(struct agent *a, const char *clean, int flags, mode_t mode)
{
	struct open_how how;
	const char *rel = clean[1] ? clean + 1 : ".";
	int tries, fd = -1;

	memset(&how, 0, sizeof(how));
	how.flags = (uint64_t)(flags | O_CLOEXEC);
	how.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
	how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
	/* EAGAIN: a rename raced the lookup; the kernel asks to retry */
	for (tries = 0; tries < 8; tries++) {
		fd = (int)syscall(SYS_openat2, a->root_fd, rel, &how,
		    sizeof(how));
		if (fd >= 0 || errno != EAGAIN)
			break;
	}
	return fd >= 0 ? fd : -errno;
}

int
agent_path_open(struct agent *a, const char *clean, int flags, mode_t mode)
{
	int fd = -ENOSYS, rv;

	if (!a->no_openat2) {
		fd = path_openat2(a, clean, flags, mode);
		if (fd == -ENOSYS)
			a->no_openat2 = true; /* a kernel before 5.6 */
	}
	if (a->no_openat2)
		fd = path_walk(a, clean, flags, mode);
	if (fd < 0)
		return fd;
	if ((rv = agent_path_fd_allowed(a, fd)) != 0) {
		close(fd);
		return rv;
	}
	return fd;
}

int
agent_path_parent(struct agent *a, const char *clean, const char **name)
{
	char parent[PATH_MAX];
	const char *slash = strrchr(clean, '/');
	size_t n;

	if (slash == NULL || slash[1] == '\0')
		return -EINVAL;
	n = (size_t)(slash - clean);
	if (n == 0)
		n = 1;
	memcpy(parent, clean, n);
	parent[n] = '\0';
	*name = slash + 1;
	return agent_path_open(a, parent, O_PATH | O_DIRECTORY, 0);
}

int
agent_path_mkdirs(struct agent *a, const char *clean, mode_t mode)
{
	char prefix[PATH_MAX];
	size_t len = strlen(clean), i;

	for (i = 1; i <= len; i++) {
		const char *name;
		int fd;

		if (clean[i] != '/' && clean[i] != '\0')
			continue;
		memcpy(prefix, clean, i);
		prefix[i] = '\0';
		fd = agent_path_open(a, prefix, O_PATH | O_DIRECTORY, 0);
		if (fd >= 0) {
			close(fd);
			continue;
		}
		if (fd != -ENOENT)
			return fd;
		if ((fd = agent_path_parent(a, prefix, &name)) < 0)
			return fd;
		if (mkdirat(fd, name, mode) != 0 && errno != EEXIST) {
			int rv = -errno;

			close(fd);
			return rv;
		}
		close(fd);
	}
	return 0;
}

int
agent_path_error(int neg_errno, const char *path, const char *doing,
    char **why)
{
	int err = -neg_errno;

	switch (err) {
	case ENOENT:
		*why = moat_asprintf("%s does not exist (%s)", path, doing);
		return MOAT_NOT_FOUND;
	case ENOTDIR:
		*why = moat_asprintf("cannot %s %s: a component of the path "
		                     "is not a directory",
		    doing, path);
		return MOAT_FAILED_PRECONDITION;
	case EISDIR:
		*why = moat_asprintf("cannot %s %s: it is a directory", doing,
		    path);
		return MOAT_FAILED_PRECONDITION;
	case EPERM:
	case EACCES:
		*why = moat_asprintf("cannot %s %s: %s%s", doing, path,
		    strerror(err),
		    err == EPERM ? " (or it is not a file the "
		                   "agent may touch)" :
		                   "");
		return MOAT_PERMISSION_DENIED;
	case EROFS:
		*why = moat_asprintf("cannot %s %s: read-only filesystem",
		    doing, path);
		return MOAT_PERMISSION_DENIED;
	case ELOOP:
		*why = moat_asprintf("cannot %s %s: too many symbolic links",
		    doing, path);
		return MOAT_FAILED_PRECONDITION;
	case ENAMETOOLONG:
		*why = moat_asprintf("cannot %s %s: a name in it is too long",
		    doing, path);
		return MOAT_INVALID_ARGUMENT;
	case ENOSPC:
	case EDQUOT:
		*why = moat_asprintf("cannot %s %s: the guest disk is full; "
		                     "free space or use a bigger scratch disk",
		    doing, path);
		return MOAT_RESOURCE_EXHAUSTED;
	case EEXIST:
		*why = moat_asprintf("cannot %s %s: it already exists", doing,
		    path);
		return MOAT_ALREADY_EXISTS;
	case ENOTEMPTY:
		*why = moat_asprintf("cannot %s %s: it is a directory that is "
		                     "not empty; set recursive",
		    doing, path);
		return MOAT_FAILED_PRECONDITION;
	case EBUSY:
	case EXDEV:
		*why = moat_asprintf("cannot %s %s: it is a mount point or "
		                     "crosses one",
		    doing, path);
		return MOAT_FAILED_PRECONDITION;
	case ENXIO:
		*why = moat_asprintf("cannot %s %s: it is not a regular file",
		    doing, path);
		return MOAT_FAILED_PRECONDITION;
	default:
		*why = moat_asprintf("cannot %s %s: %s", doing, path,
		    strerror(err));
		return moat_status_from_errno(err) == MOAT_OK ?
		    MOAT_INTERNAL :
		    moat_status_from_errno(err);
	}
}
