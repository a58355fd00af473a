/*
 * scratch.c: per-sandbox scratch disks. Each is a sparse ext4 file
 * labelled moat-scratch (the agent mounts it as the overlay's upper
 * layer). mkfs.ext4 costs tens of milliseconds and a process, so vmd
 * formats one template per size under <state>/scratch/ and gives each
 * sandbox a copy of the template's allocated extents only (a reflink where
 * the filesystem offers one): a 1 GiB disk costs a few MiB of writes.
 * Disks are admitted against the state dir's free space: each counts
 * at its full size, so a guest that fills its disk cannot take the host
 * below [vmd] disk-reserve-mib. Not for: what the guest does with the
 * disk.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
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

/* ---- admission ---- */

/* Bytes admitted whose files are not made yet. */
static pthread_mutex_t admit_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t admit_pending;

/* What the scratch disks under <state>/vms may still grow by: size
 * less allocated, each. */
static uint64_t
scratch_growth(const struct vmd *vmd)
{
	char *root = moat_asprintf("%s/vms", vmd->cfg.state_dir);
	DIR *d = root ? opendir(root) : NULL;
	struct dirent *e;
	uint64_t sum = 0;

	while (d != NULL && (e = readdir(d)) != NULL) {
		struct stat st;
		char *path;

		if (e->d_name[0] == '.' ||
		    (path = moat_asprintf("%s/%s/scratch.ext4", root,
		         e->d_name)) == NULL)
			continue;
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
		    (uint64_t)st.st_size > (uint64_t)st.st_blocks * 512)
			sum += (uint64_t)st.st_size -
			    (uint64_t)st.st_blocks * 512;
		free(path);
	}
	if (d != NULL)
		closedir(d);
	free(root);
	return sum;
}

int
vmd_scratch_admit(struct vmd *vmd, uint64_t bytes, char **errmsg)
{
	const uint64_t mib = 1u << 20;
	uint64_t reserve = vmd->cfg.disk_reserve_bytes;
	uint64_t avail, growth, pending;
	struct statvfs fs;

	*errmsg = NULL;
	if (statvfs(vmd->cfg.state_dir, &fs) != 0) {
		*errmsg = moat_asprintf("cannot measure the free space of %s: "
		                        "%s",
		    vmd->cfg.state_dir, strerror(errno));
		return moat_status_from_errno(errno);
	}
	avail = (uint64_t)fs.f_bavail * fs.f_frsize;
	pthread_mutex_lock(&admit_mu);
	growth = scratch_growth(vmd);
	pending = admit_pending;
	if (avail >= reserve && avail - reserve >= growth + pending &&
	    avail - reserve - growth - pending >= bytes) {
		admit_pending += bytes;
		pthread_mutex_unlock(&admit_mu);
		return MOAT_OK;
	}
	pthread_mutex_unlock(&admit_mu);
	*errmsg = moat_asprintf(
	    "node %s has no disk for a %" PRIu64 " MiB scratch disk: %s has "
	    "%" PRIu64 " MiB free, the scratch disks there may still grow by "
	    "%" PRIu64 " MiB (each counts at its full size)%s and [vmd] "
	    "disk-reserve-mib keeps %" PRIu64 " MiB: destroy sandboxes, ask "
	    "for a smaller scratch_mib or free disk space",
	    vmd->cfg.node_id, (bytes + mib - 1) / mib, vmd->cfg.state_dir,
	    avail / mib, (growth + pending) / mib,
	    pending ? " (with disks being made now)" : "", reserve / mib);
	moat_warn(0, "%s", *errmsg);
	return MOAT_RESOURCE_EXHAUSTED;
}

void
vmd_scratch_admit_done(struct vmd *vmd, uint64_t bytes)
{
	(void)vmd;
	pthread_mutex_lock(&admit_mu);
	admit_pending -= bytes < admit_pending ? bytes : admit_pending;
	pthread_mutex_unlock(&admit_mu);
}

uint64_t
vmd_scratch_free(struct vmd *vmd)
{
	uint64_t reserve = vmd->cfg.disk_reserve_bytes, avail, held;
	struct statvfs fs;

	if (statvfs(vmd->cfg.state_dir, &fs) != 0)
		return 0;
	avail = (uint64_t)fs.f_bavail * fs.f_frsize;
	pthread_mutex_lock(&admit_mu);
	held = scratch_growth(vmd) + admit_pending;
	pthread_mutex_unlock(&admit_mu);
	/* 1, not 0: 0 is "not measured" in Node.scratch_free_bytes. */
	return avail > reserve + held ? avail - reserve - held : 1;
}
