/*
 * extents.c: copying a sparse file by its allocated extents only
 * (SEEK_DATA/SEEK_HOLE and copy_file_range, a reflink where the
 * filesystem offers one), for scratch disks made from a template and for
 * the RAM files and disks of snapshots. Not for: what the files hold.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "extents.h"

/* Copies [off, off+len) with copy_file_range, else read/write. */
static int
copy_range(int in, int out, off_t off, off_t len)
{
	static const size_t bufsize = 1 << 20;
	char *buf = NULL;
	off_t in_off = off, out_off = off;

	while (len > 0) {
		ssize_t n = copy_file_range(in, &in_off, out, &out_off,
		    (size_t)len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 &&
		    (errno == ENOSPC || errno == EDQUOT || errno == EIO))
			return errno;
		if (n <= 0)
			break;
		len -= n;
	}
	if (len == 0)
		return 0;
	if ((buf = malloc(bufsize)) == NULL)
		return ENOMEM;
	while (len > 0) {
		size_t want = (size_t)len < bufsize ? (size_t)len : bufsize;
		ssize_t n = pread(in, buf, want, in_off);
		ssize_t w = 0;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int err = n < 0 ? errno : EIO;
			free(buf);
			return err;
		}
		/* A short write is retried, so a full disk says ENOSPC. */
		while (w < n) {
			ssize_t k =
			    pwrite(out, buf + w, (size_t)(n - w), out_off + w);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0) {
				int err = k < 0 ? errno : EIO;
				free(buf);
				return err;
			}
			w += k;
		}
		in_off += n;
		out_off += n;
		len -= n;
	}
	free(buf);
	return 0;
}

int
vmd_copy_extents(int in, int out, uint64_t *copied)
{
	struct stat st;
	off_t data, hole;
	int err = 0;

	if (copied != NULL)
		*copied = 0;
	if (fstat(in, &st) != 0)
		return errno;
	/* Where the filesystem has reflinks, share the blocks instead. */
	if (ioctl(out, FICLONE, in) == 0) {
		if (copied != NULL)
			*copied = (uint64_t)st.st_blocks * 512u;
		return 0;
	}
	for (data = 0; data < st.st_size; data = hole) {
		data = lseek(in, data, SEEK_DATA);
		if (data < 0) {
			if (errno != ENXIO)
				err = errno;
			break;
		}
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0) {
			err = errno;
			break;
		}
		if ((err = copy_range(in, out, data, hole - data)) != 0)
			break;
		if (copied != NULL)
			*copied += (uint64_t)(hole - data);
	}
	return err;
}

int
vmd_copy_sparse(const char *src, const char *dst, uint64_t *copied)
{
	struct stat st;
	int in = -1, out = -1;
	int err = 0;
	off_t data, hole;

	if (copied != NULL)
		*copied = 0;

	if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0)
		return errno;
	if (fstat(in, &st) != 0) {
		err = errno;
		goto out;
	}
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0) {
		err = errno;
		goto out;
	}
	if (ioctl(out, FICLONE, in) == 0) {
		if (copied != NULL)
			*copied = (uint64_t)st.st_blocks * 512u;
		goto out;
	}
	if (ftruncate(out, st.st_size) != 0) {
		err = errno;
		goto out;
	}
	for (data = 0; data < st.st_size; data = hole) {
		data = lseek(in, data, SEEK_DATA);
		if (data < 0) {
			if (errno != ENXIO)
				err = errno;
			break;
		}
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0) {
			err = errno;
			break;
		}
		if ((err = copy_range(in, out, data, hole - data)) != 0)
			break;
		if (copied != NULL)
			*copied += (uint64_t)(hole - data);
	}
out:
	if (out >= 0 && close(out) != 0 && err == 0)
		err = errno;
	if (in >= 0)
		close(in);
	if (err != 0)
		(void)unlink(dst);
	return err;
}
