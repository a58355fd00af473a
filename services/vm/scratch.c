/*
 * scratch.c: per-sandbox scratch disks. Each is a sparse ext4 file
 * labelled moat-scratch (the agent mounts it as the overlay's upper
 * layer). mkfs.ext4 costs tens of milliseconds and a process, so vmd
 * formats one template per size under <state>/scratch/ and gives each
 * sandbox a copy of the template's allocated extents only (a reflink where
 * the filesystem offers one): a 1 GiB disk costs a few MiB of writes.
 * Not for: what the guest does with the disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "extents.h"
#include "spawn.h"
#include "node.h"
#include "scratch.h"

/* Makes <state>/scratch/template-<mib>.ext4 if missing. scratch_mu held. */
static int
template_make(struct vmd *vmd, const char *path, uint64_t mib, char **errmsg)
{
	char *tmp = moat_asprintf("%s.tmp", path);
	const char *argv[] = { "mkfs.ext4", "-q", "-F", "-L", "moat-scratch",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", tmp,
		NULL };
	struct moat_spawn_req req = { .argv = argv };
	int status = 0;
	int fd;
	int rv;

	if (tmp == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	(void)unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)(mib << 20)) != 0) {
		*errmsg =
		    moat_asprintf("cannot create scratch template %s: %s", tmp,
		        strerror(errno));
		rv = moat_status_from_errno(errno);
		if (fd >= 0)
			close(fd);
		goto out;
	}
	close(fd);
	if ((rv = moat_spawn_wait(&req, &status, errmsg)) != MOAT_OK) {
		if (rv == MOAT_FAILED_PRECONDITION) {
			char *m =
			    moat_asprintf("%s (install the Debian package "
			                  "e2fsprogs)",
			        *errmsg);
			free(*errmsg);
			*errmsg = m;
		}
		goto out;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		*errmsg = moat_asprintf("mkfs.ext4 of scratch template %s "
		                        "failed (status %d)",
		    tmp, status);
		rv = MOAT_INTERNAL;
		goto out;
	}
	if (rename(tmp, path) != 0) {
		*errmsg = moat_asprintf("rename %s: %s", tmp, strerror(errno));
		rv = moat_status_from_errno(errno);
		goto out;
	}
	moat_info(0, "scratch template %s made (%" PRIu64 " MiB)", path, mib);
out:
	(void)unlink(tmp);
	free(tmp);
	return rv;
}

int
vmd_scratch_make(struct vmd *vmd, const char *path, uint64_t mib,
    char **errmsg)
{
	char *dir = moat_asprintf("%s/scratch", vmd->cfg.state_dir);
	char *template = moat_asprintf("%s/scratch/template-%" PRIu64 ".ext4",
	    vmd->cfg.state_dir, mib);
	int rv = MOAT_OK;
	int err;

	*errmsg = NULL;
	if (dir == NULL || template == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto out;
	}
	pthread_mutex_lock(&vmd->scratch_mu);
	if (access(template, R_OK) != 0) {
		if ((err = moat_mkdir_p(dir, 0700)) != 0) {
			*errmsg = moat_asprintf("cannot create %s: %s", dir,
			    strerror(err));
			rv = moat_status_from_errno(err);
		} else {
			rv = template_make(vmd, template, mib, errmsg);
		}
	}
	pthread_mutex_unlock(&vmd->scratch_mu);
	if (rv != MOAT_OK)
		goto out;
	if ((err = vmd_copy_sparse(template, path, NULL)) != 0) {
		*errmsg = moat_asprintf("cannot make scratch disk %s: %s",
		    path, strerror(err));
		rv = moat_status_from_errno(err);
	}
out:
	free(dir);
	free(template);
	return rv;
}
