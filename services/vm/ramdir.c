/*
 * ramdir.c: where guest RAM lives ([vmd] ram-dir): the QEMU driver's RAM
 * files, the RAM copies of snapshots and template spares. On tmpfs (the
 * default, /dev/shm) a snapshot copies the guest's RAM while the guest is
 * paused, so the pause grows with the RAM the guest has touched (~45 ms
 * for 93 MB here). On a filesystem with reflinks (XFS, btrfs) the driver
 * writes the dirty pages back before the pause and clones the file inside
 * it: the pause no longer depends on RAM, and snapshots and clones share
 * unchanged blocks. The directory is chosen once, at start, before any
 * thread runs. Not for: copying files (extents.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat/util.h"
#include "ramdir.h"

#define RAM_DIR_DEFAULT "/dev/shm"
#define RAM_DIR_RECORD "ram-dir"

static char ram_dir[PATH_MAX] = RAM_DIR_DEFAULT;
static bool ram_reflinks;

/* Whether files in `dir` can be cloned with FICLONE: tries it on two
 * small files made there. */
static bool
probe_reflink(const char *dir)
{
	char *a = moat_asprintf("%s/moat-probe-%ld.a", dir, (long)getpid());
	char *b = moat_asprintf("%s/moat-probe-%ld.b", dir, (long)getpid());
	static const char block[4096];
	int fa = -1, fb = -1;
	bool ok = false;

	if (a == NULL || b == NULL)
		goto out;
	fa = open(a, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	fb = open(b, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fa >= 0 && fb >= 0 &&
	    write(fa, block, sizeof(block)) == (ssize_t)sizeof(block) &&
	    fsync(fa) == 0)
		ok = ioctl(fb, FICLONE, fa) == 0;
out:
	if (fa >= 0)
		close(fa);
	if (fb >= 0)
		close(fb);
	if (a != NULL)
		(void)unlink(a);
	if (b != NULL)
		(void)unlink(b);
	free(a);
	free(b);
	return ok;
}

int
vmd_ram_dir_set(const char *dir, char **errmsg)
{
	struct stat st;

	*errmsg = NULL;
	if (dir == NULL || dir[0] != '/' ||
	    strlen(dir) >= sizeof(ram_dir) - 64 ||
	    strstr(dir, "/..") != NULL || strchr(dir, ',') != NULL) {
		*errmsg = moat_asprintf(
		    "ram-dir \"%s\" must be an absolute "
		    "path without \"..\" or commas, under %zu characters",
		    dir ? dir : "", sizeof(ram_dir) - 64);
		return MOAT_INVALID_ARGUMENT;
	}
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
	    access(dir, W_OK) != 0) {
		*errmsg = moat_asprintf(
		    "ram-dir %s is not a writable "
		    "directory: create it (tmpfs such as /dev/shm, or XFS "
		    "with reflinks for short snapshot pauses)",
		    dir);
		return MOAT_FAILED_PRECONDITION;
	}
	snprintf(ram_dir, sizeof(ram_dir), "%s", dir);
	/* "/dev/shm/" and "/dev/shm" name the same place. */
	for (size_t n = strlen(ram_dir); n > 1 && ram_dir[n - 1] == '/'; n--)
		ram_dir[n - 1] = '\0';
	ram_reflinks = probe_reflink(ram_dir);
	return MOAT_OK;
}

const char *
vmd_ram_dir(void)
{
	return ram_dir;
}

bool
vmd_ram_dir_reflinks(void)
{
	return ram_reflinks;
}

bool
vmd_ram_path_ours(const char *path)
{
	const char *base = strrchr(path, '/');
	size_t n = strlen(ram_dir);

	return base != NULL && strncmp(base + 1, "moat-", 5) == 0 &&
	    strstr(path, "/..") == NULL && (size_t)(base - path) == n &&
	    strncmp(path, ram_dir, n) == 0;
}

char *
vmd_ram_sandbox_path(const char *sandbox_id)
{
	return moat_asprintf("%s/moat-%s.ram", vmd_ram_dir(), sandbox_id);
}

int
vmd_ram_unlink(const char *path)
{
	int fd;

	if (unlink(path) != 0)
		return errno;
	/* The unlink changed the directory: forcing the directory to the
	 * log forces the transaction that freed the file's blocks. */
	if (ram_reflinks &&
	    (fd = open(ram_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
		(void)fsync(fd);
		close(fd);
	}
	return 0;
}

int
vmd_ram_dir_record(const char *state_dir)
{
	char *path = moat_asprintf("%s/" RAM_DIR_RECORD, state_dir);
	int err;

	if (path == NULL)
		return ENOMEM;
	err = moat_write_file_atomic(path, ram_dir, strlen(ram_dir), 0600);
	free(path);
	return err;
}

int
vmd_ram_dir_recall(const char *state_dir)
{
	char *path = moat_asprintf("%s/" RAM_DIR_RECORD, state_dir);
	char *text = NULL, *errmsg = NULL;
	size_t len = 0;
	int err, rv;

	if (path == NULL)
		return ENOMEM;
	err = moat_read_file(path, PATH_MAX, &text, &len);
	free(path);
	if (err != 0)
		return err == ENOENT ? 0 : err;
	rv = vmd_ram_dir_set(text, &errmsg);
	free(text);
	free(errmsg);
	return rv == MOAT_OK ? 0 : ENOENT;
}

int
vmd_ram_create(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

	if (fd < 0)
		return errno;
	close(fd);
	return 0;
}

static bool ram_private;
static char ram_preload[PATH_MAX];

int
vmd_ram_sharing_set(const char *mode, const char *preload, char **errmsg)
{
	bool autom = strcmp(mode, "auto") == 0;

	*errmsg = NULL;
	if (strcmp(mode, "copy") == 0) {
		ram_private = false;
		return MOAT_OK;
	}
	if (strcmp(mode, "private") != 0 && !autom) {
		*errmsg = moat_asprintf("ram-sharing = \"%s\" is not a mode: "
		                        "use auto, copy or private",
		    mode);
		return MOAT_INVALID_ARGUMENT;
	}
	/* auto: private where it works (the library is there, and vmd is
	 * root, which snapshotting a private clone needs), else copy. */
	if (autom &&
	    (geteuid() != 0 || preload == NULL ||
	        access(preload, R_OK) != 0)) {
		ram_private = false;
		return MOAT_OK;
	}
	if (preload == NULL || realpath(preload, ram_preload) == NULL ||
	    access(ram_preload, R_OK) != 0 || strchr(ram_preload, ':') ||
	    strchr(ram_preload, ' ')) {
		*errmsg = moat_asprintf("ram-sharing = private needs the "
		                        "library %s (built as "
		                        "libmoat-qemu-ramro.so next to "
		                        "moat-vmd's bin directory, in lib/): "
		                        "build it, or set ram-sharing = copy",
		    preload ? preload : "?");
		ram_preload[0] = '\0';
		return MOAT_FAILED_PRECONDITION;
	}
	ram_private = true;
	return MOAT_OK;
}

bool
vmd_ram_private(void)
{
	return ram_private;
}

const char *
vmd_ram_sharing(void)
{
	return ram_private ? "private" : "copy";
}

const char *
vmd_ram_preload(void)
{
	return ram_private ? ram_preload : "";
}
