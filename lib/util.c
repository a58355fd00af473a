/*
 * util.c: heap printf, directory creation and removal, whole-file reads
 * and atomic writes. Not for: anything with a domain meaning.
 */
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "moat/util.h"

char *
moat_asprintf(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
}

int
moat_mkdir_p(const char *path, mode_t mode)
{
	char buf[4096];
	size_t len = strlen(path);

	if (len == 0 || len >= sizeof(buf))
		return ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) != 0 && errno != EEXIST)
			return errno;
		*p = '/';
	}
	if (mkdir(buf, mode) != 0 && errno != EEXIST)
		return errno;
	return 0;
}

static int
rm_rf_at(int parent, const char *name)
{
	struct stat st;
	int rv = 0;

	if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return errno == ENOENT ? 0 : errno;
	if (S_ISDIR(st.st_mode)) {
		int fd = openat(parent, name,
		    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		DIR *d;
		struct dirent *de;

		if (fd < 0)
			return errno;
		if ((d = fdopendir(fd)) == NULL) {
			rv = errno;
			close(fd);
			return rv;
		}
		while ((de = readdir(d)) != NULL) {
			int r;
			if (strcmp(de->d_name, ".") == 0 ||
			    strcmp(de->d_name, "..") == 0)
				continue;
			if ((r = rm_rf_at(dirfd(d), de->d_name)) != 0 &&
			    rv == 0)
				rv = r;
		}
		closedir(d);
		if (unlinkat(parent, name, AT_REMOVEDIR) != 0 && rv == 0 &&
		    errno != ENOENT)
			rv = errno;
		return rv;
	}
	if (unlinkat(parent, name, 0) != 0 && errno != ENOENT)
		return errno;
	return 0;
}

int
moat_rm_rf(const char *path)
{
	return rm_rf_at(AT_FDCWD, path);
}

int
moat_read_file(const char *path, size_t max, char **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t cap = 4096, n = 0;
	char *buf;

	*out = NULL;
	*len = 0;
	if (fd < 0)
		return errno;
	if ((buf = malloc(cap + 1)) == NULL) {
		close(fd);
		return ENOMEM;
	}
	for (;;) {
		ssize_t r;
		if (n == cap) {
			char *nb;
			if (cap >= max) {
				free(buf);
				close(fd);
				return EFBIG;
			}
			cap = cap * 2 > max ? max : cap * 2;
			if ((nb = realloc(buf, cap + 1)) == NULL) {
				free(buf);
				close(fd);
				return ENOMEM;
			}
			buf = nb;
		}
		r = read(fd, buf + n, cap - n);
		if (r < 0) {
			int e = errno;
			if (e == EINTR)
				continue;
			free(buf);
			close(fd);
			return e;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

int
moat_write_file_atomic(const char *path, const void *data, size_t len,
    mode_t mode)
{
	char tmp[4096];
	const char *p = data;
	int fd, rv = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return ENAMETOOLONG;
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)) <
	    0)
		return errno;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rv = errno;
			break;
		}
		p += n;
		len -= (size_t)n;
	}
	if (rv == 0 && fsync(fd) != 0)
		rv = errno;
	close(fd);
	if (rv == 0 && rename(tmp, path) != 0)
		rv = errno;
	if (rv != 0)
		unlink(tmp);
	return rv;
}

uint64_t
moat_now_unix_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void
moat_service_malloc_init(void)
{
	/* Setting it turns glibc's dynamic threshold off. */
	(void)mallopt(M_MMAP_THRESHOLD, 128 * 1024);
}
