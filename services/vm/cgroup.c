/*
 * cgroup.c: per-VMM control groups on cgroup v2 or v1 (see cgroup.h).
 * Limits are written as files: v2 memory.max, pids.max, cpu.max; v1
 * memory.limit_in_bytes, pids.max, cpu.cfs_period_us and
 * cpu.cfs_quota_us. Files are opened with O_CREAT (a no-op on cgroupfs)
 * so a plain directory tree stands in for cgroupfs in unit tests. Not
 * for: putting a process in a group (spawn.c, in the child).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include "moat/status.h"
#include "moat/util.h"
#include "cgroup.h"

#define CG_AUTO_V2 "/sys/fs/cgroup"
#define CG_PARENT "moat"

static const char *const v1_controllers[VMD_CGROUP_MAX] = { "memory", "pids",
	"cpu" };

/* Writes `text` to `dir`/`file`. Returns 0 or an errno. */
static int
cg_write(const char *dir, const char *file, const char *text)
{
	char *path = moat_asprintf("%s/%s", dir, file);
	size_t len = strlen(text);
	int fd, err = 0;

	if (path == NULL)
		return ENOMEM;
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		err = errno;
	else if (write(fd, text, len) != (ssize_t)len)
		err = errno ? errno : EIO;
	if (fd >= 0 && close(fd) != 0 && err == 0)
		err = errno;
	free(path);
	return err;
}

/* Does `dir`/`file` (a space-separated list) name every controller? */
static bool
cg_lists_all(const char *dir, const char *file)
{
	char *path = moat_asprintf("%s/%s", dir, file);
	char *text = NULL;
	size_t len;
	bool all = true;

	if (path == NULL || moat_read_file(path, 4096, &text, &len) != 0) {
		free(path);
		return false;
	}
	for (int i = 0; i < VMD_CGROUP_MAX && all; i++) {
		const char *c = v1_controllers[i];
		size_t n = strlen(c);
		const char *p = text;

		all = false;
		while ((p = strstr(p, c)) != NULL) {
			if ((p == text || p[-1] == ' ') &&
			    (p[n] == '\0' || p[n] == ' ' || p[n] == '\n')) {
				all = true;
				break;
			}
			p += n;
		}
	}
	free(text);
	free(path);
	return all;
}

void
vmd_cgroup_host_fini(struct vmd_cgroup_host *h)
{
	for (int i = 0; i < VMD_CGROUP_MAX; i++) {
		free(h->base[i]);
		h->base[i] = NULL;
	}
	h->n_base = 0;
	h->version = 0;
}

/* v2 at `root`: enables the controllers for "moat" and its children. */
static int
cg_detect_v2(const char *root, struct vmd_cgroup_host *h, char **why)
{
	const char *enable = "+memory +pids +cpu";
	char *base = moat_asprintf("%s/" CG_PARENT, root);
	int err;

	if (base == NULL)
		return MOAT_INTERNAL;
	if ((err = cg_write(root, "cgroup.subtree_control", enable)) != 0 ||
	    ((err = mkdir(base, 0755)) != 0 && (err = errno) != EEXIST) ||
	    (err = cg_write(base, "cgroup.subtree_control", enable)) != 0) {
		*why =
		    moat_asprintf("cgroup v2 at %s: cannot enable the "
		                  "memory, pids and cpu controllers for %s: "
		                  "%s",
		        root, base, strerror(err));
		free(base);
		return MOAT_FAILED_PRECONDITION;
	}
	h->base[0] = base;
	h->n_base = 1;
	h->version = 2;
	return MOAT_OK;
}

/* The mount point of v1 controller `c` from /proc/self/mounts (heap),
 * or NULL. */
static char *
cg_v1_mount(const char *c)
{
	FILE *f = fopen("/proc/self/mounts", "re");
	char dev[256], dir[4096], type[64], opts[1024];
	char *found = NULL;

	if (f == NULL)
		return NULL;
	while (found == NULL &&
	    fscanf(f, "%255s %4095s %63s %1023s %*d %*d", dev, dir, type,
	        opts) == 4) {
		char *save = NULL;

		if (strcmp(type, "cgroup") != 0)
			continue;
		for (char *o = strtok_r(opts, ",", &save); o != NULL;
		     o = strtok_r(NULL, ",", &save))
			if (strcmp(o, c) == 0) {
				found = strdup(dir);
				break;
			}
	}
	fclose(f);
	return found;
}

/* v1: the memory, pids and cpu hierarchies, at <root>/<c> or (root
 * NULL) wherever they are mounted. */
static int
cg_detect_v1(const char *root, struct vmd_cgroup_host *h, char **why)
{
	for (int i = 0; i < VMD_CGROUP_MAX; i++) {
		const char *c = v1_controllers[i];
		char *mnt =
		    root ? moat_asprintf("%s/%s", root, c) : cg_v1_mount(c);
		struct stat st;
		int err = 0;

		if (mnt == NULL || stat(mnt, &st) != 0 ||
		    !S_ISDIR(st.st_mode)) {
			*why =
			    moat_asprintf("no cgroup v2 with the memory, "
			                  "pids and cpu controllers, and no "
			                  "cgroup v1 %s controller (%s)",
			        c, mnt ? mnt : "not mounted");
			free(mnt);
			vmd_cgroup_host_fini(h);
			return MOAT_FAILED_PRECONDITION;
		}
		h->base[i] = moat_asprintf("%s/" CG_PARENT, mnt);
		free(mnt);
		if (h->base[i] == NULL) {
			vmd_cgroup_host_fini(h);
			return MOAT_INTERNAL;
		}
		if (mkdir(h->base[i], 0755) != 0 && (err = errno) != EEXIST) {
			*why = moat_asprintf("cannot create cgroup %s: %s",
			    h->base[i], strerror(err));
			vmd_cgroup_host_fini(h);
			return MOAT_FAILED_PRECONDITION;
		}
		h->n_base = i + 1;
	}
	h->version = 1;
	return MOAT_OK;
}

int
vmd_cgroup_detect(const char *root, struct vmd_cgroup_host *h, char **why)
{
	bool autodetect =
	    root == NULL || root[0] == '\0' || strcmp(root, "auto") == 0;
	const char *v2 = autodetect ? CG_AUTO_V2 : root;
	char *ctl = moat_asprintf("%s/cgroup.controllers", v2);
	bool has_v2 = ctl != NULL && access(ctl, F_OK) == 0;
	int rv;

	free(ctl);
	*why = NULL;
	memset(h, 0, sizeof(*h));
	if (has_v2 && cg_lists_all(v2, "cgroup.controllers"))
		return cg_detect_v2(v2, h, why);
	if (has_v2 && !autodetect) {
		*why = moat_asprintf("cgroup v2 at %s lacks one of the "
		                     "memory, pids and cpu controllers "
		                     "(cgroup.controllers)",
		    v2);
		return MOAT_FAILED_PRECONDITION;
	}
	rv = cg_detect_v1(autodetect ? NULL : root, h, why);
	return rv;
}

/* Removes one group directory: rmdir on cgroupfs (its files go with
 * it); a plain tree (tests) is removed whole. */
static void
cg_rmdir(const char *dir)
{
	struct statfs fs;

	if (rmdir(dir) == 0 || errno == ENOENT)
		return;
	if (errno == EBUSY) {
		/* Processes left: kill them, then try again for a while. */
		char *procs = moat_asprintf("%s/cgroup.procs", dir);
		char *text = NULL;
		size_t len;

		if (procs != NULL &&
		    moat_read_file(procs, 1 << 16, &text, &len) == 0) {
			for (char *p = text; *p != '\0';) {
				char *end;
				long pid = strtol(p, &end, 10);

				if (end == p)
					break;
				if (pid > 1)
					(void)kill((pid_t)pid, SIGKILL);
				p = end + (*end != '\0');
			}
		}
		free(text);
		free(procs);
		for (int i = 0; i < 100 && rmdir(dir) != 0 && errno == EBUSY;
		     i++)
			usleep(10 * 1000);
		return;
	}
	if (statfs(dir, &fs) == 0 && fs.f_type != CGROUP_SUPER_MAGIC &&
	    fs.f_type != CGROUP2_SUPER_MAGIC)
		(void)moat_rm_rf(dir);
}

void
vmd_cgroup_remove(struct vmd_cgroup *cg)
{
	for (int i = 0; i < VMD_CGROUP_MAX; i++) {
		if (cg->dir[i] != NULL)
			cg_rmdir(cg->dir[i]);
		free(cg->dir[i]);
		free(cg->procs[i]);
		cg->dir[i] = cg->procs[i] = NULL;
	}
	cg->n = 0;
}

void
vmd_cgroup_remove_named(const char *root, const char *name)
{
	struct vmd_cgroup_host h = { .version = 0 };
	char *why = NULL;

	if (name == NULL || name[0] == '\0' || name[0] == '.' ||
	    strchr(name, '/') != NULL) {
		return;
	}
	if (vmd_cgroup_detect(root, &h, &why) == 0) {
		for (int i = 0; i < h.n_base; i++) {
			char *dir = moat_asprintf("%s/%s", h.base[i], name);

			if (dir != NULL)
				cg_rmdir(dir);
			free(dir);
		}
	}
	free(why);
	vmd_cgroup_host_fini(&h);
}

/* Writes lim's files into the group(s) of one hierarchy. */
static int
cg_limit(int version, int which, const char *dir,
    const struct vmd_cgroup_limits *lim, const char **what)
{
	char num[64];
	int err = 0;

	if (version == 2 || which == 0) {
		snprintf(num, sizeof(num), "%llu",
		    (unsigned long long)lim->memory_bytes);
		*what = version == 2 ? "memory.max" : "memory.limit_in_bytes";
		if ((err = cg_write(dir, *what, num)) != 0)
			return err;
	}
	if (version == 2 || which == 1) {
		snprintf(num, sizeof(num), "%u", lim->pids);
		*what = "pids.max";
		if ((err = cg_write(dir, *what, num)) != 0)
			return err;
	}
	if (version == 2) {
		snprintf(num, sizeof(num), "%u %u", lim->cpu_quota_us,
		    lim->cpu_period_us);
		*what = "cpu.max";
		return cg_write(dir, *what, num);
	}
	if (which == 2) {
		snprintf(num, sizeof(num), "%u", lim->cpu_period_us);
		*what = "cpu.cfs_period_us";
		if ((err = cg_write(dir, *what, num)) != 0)
			return err;
		snprintf(num, sizeof(num), "%u", lim->cpu_quota_us);
		*what = "cpu.cfs_quota_us";
		return cg_write(dir, *what, num);
	}
	return 0;
}

int
vmd_cgroup_create(const struct vmd_cgroup_host *h, const char *name,
    const struct vmd_cgroup_limits *lim, struct vmd_cgroup *cg, char **errmsg)
{
	*errmsg = NULL;
	memset(cg, 0, sizeof(*cg));
	if (h->version == 0 || strchr(name, '/') != NULL || name[0] == '.') {
		*errmsg = moat_asprintf("no cgroup for %s: %s", name,
		    h->version == 0 ? "the host has none usable" : "bad name");
		return MOAT_FAILED_PRECONDITION;
	}
	for (int i = 0; i < h->n_base; i++) {
		const char *what = "mkdir";
		int err = 0;

		cg->dir[i] = moat_asprintf("%s/%s", h->base[i], name);
		cg->procs[i] = moat_asprintf("%s/cgroup.procs", cg->dir[i]);
		if (cg->dir[i] == NULL || cg->procs[i] == NULL) {
			vmd_cgroup_remove(cg);
			*errmsg = strdup("out of memory");
			return MOAT_INTERNAL;
		}
		cg->n = i + 1;
		/* A stale empty group of the same name (a vmd killed
		 * before its teardown) is removed first. */
		if (mkdir(cg->dir[i], 0755) != 0 &&
		    (errno != EEXIST || rmdir(cg->dir[i]) != 0 ||
		        mkdir(cg->dir[i], 0755) != 0))
			err = errno;
		else
			err = cg_limit(h->version, i, cg->dir[i], lim, &what);
		if (err != 0) {
			*errmsg = moat_asprintf("cannot set up cgroup %s "
			                        "(%s): %s",
			    cg->dir[i], what, strerror(err));
			if (err == EEXIST || err == EBUSY) {
				/* Not ours to remove. */
				free(cg->dir[i]);
				cg->dir[i] = NULL;
			}
			vmd_cgroup_remove(cg);
			return moat_status_from_errno(err);
		}
	}
	return MOAT_OK;
}
