/*
 * jail.c: the per-VMM jail (see jail.h): the node's probe of what the
 * host can give, the uid pool, and the plan of one VMM's root that the
 * spawner's child carries out (spawn.c). Not for: running the plan
 * (spawn.c) or the cgroup files (cgroup.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "cgroup.h"
#include "jail.h"

#define JAIL_NS_FLAGS                                                         \
	(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |           \
	    CLONE_NEWUTS)
#define JAIL_MAX_OPS 96
#define JAIL_MIB (UINT64_C(1) << 20)
/* The CPU quota per 100 ms period: each vCPU's full share, plus half a
 * core for the VMM's own threads (QEMU's main loop and I/O; under TCG
 * its RCU and code generation too). With vCPUs alone the quota
 * throttled a busy 1-vCPU guest in 11 of 100 periods here and exec
 * `true` took ~1.4 ms longer. */
#define JAIL_CPU_PERIOD_US 100000u
#define JAIL_VMM_CPU_US 50000u

/* The node's jail state: set at start (vmd_jail_init, missing_add),
 * read-only after, but for the uid pool (mu). */
static struct {
	struct vmd_jail_settings s;
	char *cgroup_root;
	bool ids_ok; /* vmd is root: can switch uids */
	bool ns_ok;  /* the namespaces can be made */
	bool seccomp_ok;
	struct vmd_cgroup_host cg;
	char missing[512];
	char isolation[768];
	pthread_mutex_t mu;
	uint8_t *used; /* uid_count flags */
	uint32_t next;
} J = { .seccomp_ok = true, .mu = PTHREAD_MUTEX_INITIALIZER };

struct vmd_jail {
	struct moat_jail plan;
	struct moat_jail_op ops[JAIL_MAX_OPS];
	char *strs[4 * JAIL_MAX_OPS]; /* every string the plan holds */
	size_t n_strs;
	char *made[JAIL_MAX_OPS]; /* host paths made or bound in the root */
	bool
	    made_bound[JAIL_MAX_OPS]; /* ...bound or a symlink: covers below */
	size_t n_made;
	bool overflow;
	struct vmd_cgroup cg;
	const char *procs[VMD_CGROUP_MAX];
	bool has_uid;
};

static void
isolation_update(void)
{
	if (J.missing[0] == '\0')
		snprintf(J.isolation, sizeof(J.isolation), "strict");
	else if (J.s.relaxed)
		snprintf(J.isolation, sizeof(J.isolation), "relaxed: no %s",
		    J.missing);
	else
		snprintf(J.isolation, sizeof(J.isolation),
		    "refused: no %s (set [vmd] isolation = relaxed to run "
		    "sandboxes without it)",
		    J.missing);
}

void
vmd_jail_missing_add(const char *piece)
{
	size_t n = strlen(J.missing);

	if (J.s.off)
		return;
	if (strstr(piece, "-sandbox") != NULL)
		J.seccomp_ok = false;
	snprintf(J.missing + n, sizeof(J.missing) - n, "%s%s", n ? ", " : "",
	    piece);
	isolation_update();
	moat_warn(0, "jail: the host lacks %s: %s", piece,
	    J.s.relaxed ? "isolation = relaxed: VMMs run without it" :
	                  "sandboxes are refused (isolation = strict)");
}

/* Can this process make the jail's namespaces? A child tries. */
static int
probe_namespaces(void)
{
	pid_t pid = (pid_t)syscall(SYS_clone,
	    (unsigned long)(SIGCHLD | JAIL_NS_FLAGS), NULL, NULL, NULL, NULL);
	int status = 0;

	if (pid < 0)
		return errno;
	if (pid == 0)
		_exit(0);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : EIO;
}

int
vmd_jail_init(const struct vmd_jail_settings *s, char **errmsg)
{
	char *why = NULL;
	char piece[400];
	uint32_t r = 0;
	int err;

	*errmsg = NULL;
	J.s = *s;
	if (s->uid_count == 0 || s->uid_base == 0 ||
	    (uint64_t)s->uid_base + s->uid_count > UINT32_MAX) {
		*errmsg = moat_asprintf("jail-uid-base=%u jail-uid-count=%u: "
		                        "the range must be non-empty, above 0 "
		                        "and below 2^32",
		    s->uid_base, s->uid_count);
		return MOAT_INVALID_ARGUMENT;
	}
	J.cgroup_root = strdup(s->cgroup_root ? s->cgroup_root : "auto");
	J.used = calloc(s->uid_count, 1);
	if (J.cgroup_root == NULL || J.used == NULL)
		return MOAT_INTERNAL;
	J.s.cgroup_root = J.cgroup_root;
	if (s->off) {
		J.seccomp_ok = false;
		snprintf(J.isolation, sizeof(J.isolation),
		    "off (isolation = off, a test node: VMMs run as root, "
		    "unconfined)");
		moat_warn(0, "jail: isolation = off: VMMs run unconfined");
		return MOAT_OK;
	}
	/* Start the pool at a random place: two vmds on one host with the
	 * same range are then unlikely to share a uid at once. */
	(void)!getrandom(&r, sizeof(r), GRND_NONBLOCK);
	J.next = r % s->uid_count;
	isolation_update();
	J.ids_ok = geteuid() == 0;
	if (!J.ids_ok)
		vmd_jail_missing_add("uid switch (vmd does not run as root)");
	if ((err = probe_namespaces()) != 0) {
		snprintf(piece, sizeof(piece),
		    "mount, pid, net, ipc and uts namespaces (clone: %s)",
		    strerror(err));
		vmd_jail_missing_add(piece);
	} else {
		J.ns_ok = true;
	}
	if (vmd_cgroup_detect(J.cgroup_root, &J.cg, &why) != MOAT_OK) {
		snprintf(piece, sizeof(piece),
		    "cgroup (%s; [vmd] cgroup-root)", why ? why : "?");
		vmd_jail_missing_add(piece);
	} else {
		moat_info(0,
		    "jail: VMMs run as uids %u..%u (gid %u) in their own "
		    "namespaces and cgroup v%d under %s",
		    s->uid_base, s->uid_base + s->uid_count - 1, s->gid,
		    J.cg.version, J.cg.base[0]);
	}
	free(why);
	return MOAT_OK;
}

const char *
vmd_jail_isolation(void)
{
	return J.isolation[0] ? J.isolation : "strict";
}

bool
vmd_jail_seccomp(void)
{
	return J.seccomp_ok;
}

int
vmd_jail_admit(char **errmsg)
{
	*errmsg = NULL;
	if (J.missing[0] == '\0' || J.s.relaxed)
		return MOAT_OK;
	*errmsg =
	    moat_asprintf("this node cannot jail its VMMs: it lacks %s; "
	                  "fix the host or set [vmd] isolation = relaxed "
	                  "to run sandboxes with less isolation",
	        J.missing);
	return MOAT_FAILED_PRECONDITION;
}

/* ---- the uid pool ---- */

static bool
uid_take(uint32_t *uid)
{
	bool ok = false;

	pthread_mutex_lock(&J.mu);
	for (uint32_t i = 0; i < J.s.uid_count; i++) {
		uint32_t k = (J.next + i) % J.s.uid_count;

		if (!J.used[k]) {
			J.used[k] = 1;
			J.next = (k + 1) % J.s.uid_count;
			*uid = J.s.uid_base + k;
			ok = true;
			break;
		}
	}
	pthread_mutex_unlock(&J.mu);
	return ok;
}

static void
uid_give(uint32_t uid)
{
	pthread_mutex_lock(&J.mu);
	if (uid >= J.s.uid_base && uid - J.s.uid_base < J.s.uid_count)
		J.used[uid - J.s.uid_base] = 0;
	pthread_mutex_unlock(&J.mu);
}

/* ---- the plan ---- */

static char *
keep(struct vmd_jail *j, char *s)
{
	if (s == NULL || j->n_strs >= sizeof(j->strs) / sizeof(j->strs[0])) {
		free(s);
		j->overflow = true;
		return NULL;
	}
	j->strs[j->n_strs++] = s;
	return s;
}

/* Is host path `p` already in the root: made, or under a bind or a
 * symlink? */
static bool
covered(const struct vmd_jail *j, const char *p, bool *exact)
{
	*exact = false;
	for (size_t i = 0; i < j->n_made; i++) {
		size_t n = strlen(j->made[i]);

		if (strcmp(j->made[i], p) == 0) {
			*exact = true;
			return true;
		}
		if (j->made_bound[i] && strncmp(j->made[i], p, n) == 0 &&
		    (p[n] == '/' || n == 1))
			return true;
	}
	return false;
}

/* Appends an op on an already planned destination. */
static void
op_push(struct vmd_jail *j, enum moat_jail_op_kind kind, const char *src,
    const char *dst)
{
	if (j->plan.n_ops >= JAIL_MAX_OPS) {
		j->overflow = true;
		return;
	}
	j->ops[j->plan.n_ops++] = (struct moat_jail_op){ kind, src, dst };
}

static void
op_add(struct vmd_jail *j, enum moat_jail_op_kind kind, const char *src,
    const char *host_path, bool bound)
{
	char *dst = keep(j, moat_asprintf("%s%s", j->plan.staging, host_path));
	char *made = keep(j, strdup(host_path));

	if (dst == NULL || made == NULL || j->plan.n_ops >= JAIL_MAX_OPS ||
	    j->n_made >= JAIL_MAX_OPS) {
		j->overflow = true;
		return;
	}
	j->ops[j->plan.n_ops++] = (struct moat_jail_op){ kind, src, dst };
	j->made_bound[j->n_made] = bound;
	j->made[j->n_made++] = made;
}

/* Makes the directories above host path `p` in the root. */
static void
op_parents(struct vmd_jail *j, const char *p)
{
	char buf[PATH_MAX];
	bool exact;

	snprintf(buf, sizeof(buf), "%s", p);
	for (char *s = strchr(buf + 1, '/'); s != NULL;
	     s = strchr(s + 1, '/')) {
		*s = '\0';
		if (!covered(j, buf, &exact))
			op_add(j, MOAT_JAIL_MKDIR, NULL, buf, false);
		*s = '/';
	}
}

/* Puts host path `p` in the root at the same path: a symlink as a
 * symlink, a directory or file as a bind of `kind` (a directory with
 * MOAT_JAIL_BIND_DEV is not done); with `follow`, a symlink as what it
 * points to. Missing paths are skipped. */
static void
op_path(struct vmd_jail *j, const char *p, enum moat_jail_op_kind kind,
    bool follow)
{
	struct stat st;
	bool exact;
	char *src;

	if (p == NULL || p[0] != '/' ||
	    (follow ? stat(p, &st) : lstat(p, &st)) != 0 ||
	    covered(j, p, &exact))
		return;
	op_parents(j, p);
	if (S_ISLNK(st.st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlink(p, target, sizeof(target) - 1);

		if (n <= 0)
			return;
		target[n] = '\0';
		if ((src = keep(j, strdup(target))) != NULL)
			op_add(j, MOAT_JAIL_SYMLINK, src, p, true);
		return;
	}
	if ((src = keep(j, strdup(p))) == NULL)
		return;
	/* What to bind onto, then the bind; it covers what is below. */
	op_add(j, S_ISDIR(st.st_mode) ? MOAT_JAIL_MKDIR : MOAT_JAIL_MKFILE,
	    NULL, p, true);
	if (!j->overflow)
		op_push(j, kind, src, j->ops[j->plan.n_ops - 1].dst);
}

/* The VMM binary's path: as given when it has a slash, else the first
 * executable of that name on PATH. Heap or NULL. */
static char *
binary_path(const char *binary)
{
	const char *path = getenv("PATH");

	if (strchr(binary, '/') != NULL)
		return strdup(binary);
	while (path != NULL && *path != '\0') {
		const char *end = strchr(path, ':');
		size_t n = end ? (size_t)(end - path) : strlen(path);
		char *exe = moat_asprintf("%.*s/%s", (int)n, path, binary);

		if (exe != NULL && n > 0 && path[0] == '/' &&
		    access(exe, X_OK) == 0)
			return exe;
		free(exe);
		path = end ? end + 1 : path + n;
	}
	return NULL;
}

static void
plan_root(struct vmd_jail *j, const struct vmd_jail_spec *spec)
{
	static const char *const sys[] = { "/usr", "/lib", "/lib64", "/lib32",
		"/libx32", "/bin", "/sbin", "/etc/ld.so.cache",
		"/etc/ld.so.conf", "/etc/ld.so.conf.d" };
	static const char *const devs[] = { "/dev/null", "/dev/zero",
		"/dev/urandom", "/dev/random" };
	char *bin = binary_path(spec->binary);

	for (size_t i = 0; i < sizeof(sys) / sizeof(sys[0]); i++)
		op_path(j, sys[i], MOAT_JAIL_BIND_RO, false);
	if (bin != NULL)
		op_path(j, keep(j, bin), MOAT_JAIL_BIND_RO, true);
	for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++)
		op_path(j, devs[i], MOAT_JAIL_BIND_DEV, true);
	if (spec->kvm)
		op_path(j, "/dev/kvm", MOAT_JAIL_BIND_DEV, true);
	op_add(j, MOAT_JAIL_MKDIR, NULL, "/proc", true);
	if (!j->overflow)
		op_push(j, MOAT_JAIL_PROC, NULL,
		    j->ops[j->plan.n_ops - 1].dst);
	op_path(j, spec->dir, MOAT_JAIL_BIND_RW, true);
	for (int i = 0; i < VMD_JAIL_FILES && spec->ro_files[i] != NULL; i++)
		op_path(j, spec->ro_files[i], MOAT_JAIL_BIND_RO, true);
	for (int i = 0; i < VMD_JAIL_FILES && spec->rw_files[i] != NULL; i++)
		op_path(j, spec->rw_files[i], MOAT_JAIL_BIND_RW, true);
}

/* Is `f` right in directory `dir`? */
static bool
in_dir(const char *f, const char *dir)
{
	size_t n = strlen(dir);

	return strncmp(f, dir, n) == 0 && f[n] == '/' &&
	    strchr(f + n + 1, '/') == NULL;
}

/* Opens the sandbox directory and the files the VMM writes to it. The
 * directory stays root's, group jail-gid, sticky (01770): the VMM makes
 * its sockets there but cannot rename or replace vmd's files (the
 * scratch disk and console log, root:jail-gid 0660), so nothing vmd reads
 * later (a snapshot's disk copy, the console's tail) can be swapped for
 * a symlink to a host file. Files elsewhere (the RAM file) become the
 * uid's, 0600. */
static int
give_files(const struct vmd_jail_spec *spec, uid_t uid, gid_t gid,
    char **errmsg)
{
	struct stat st;

	if (chown(spec->dir, 0, gid) != 0 || chmod(spec->dir, 01770) != 0) {
		*errmsg =
		    moat_asprintf("cannot give %s to the jail uid %u: %s",
		        spec->dir, (unsigned)uid, strerror(errno));
		return moat_status_from_errno(errno);
	}
	for (int i = 0; i < VMD_JAIL_FILES && spec->rw_files[i] != NULL; i++) {
		const char *f = spec->rw_files[i];

		bool shared = in_dir(f, spec->dir);

		if (lstat(f, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (chown(f, shared ? 0 : uid, gid) != 0 ||
		    chmod(f, shared ? 0660 : 0600) != 0) {
			*errmsg = moat_asprintf("cannot give %s to the jail "
			                        "uid %u: %s",
			    f, (unsigned)uid, strerror(errno));
			return moat_status_from_errno(errno);
		}
	}
	/* Shared read-only files: readable by all, or made group jail-gid
	 * and group-readable (0640). */
	for (int i = 0; i < VMD_JAIL_FILES && spec->ro_files[i] != NULL; i++) {
		const char *f = spec->ro_files[i];

		if (stat(f, &st) != 0 || (st.st_mode & S_IROTH) ||
		    (st.st_gid == gid && (st.st_mode & S_IRGRP)))
			continue;
		if (chown(f, (uid_t)-1, gid) != 0 ||
		    chmod(f, (st.st_mode & 07777) | S_IRGRP) != 0) {
			*errmsg = moat_asprintf("cannot make %s readable to "
			                        "the jail gid %u: %s",
			    f, (unsigned)gid, strerror(errno));
			return moat_status_from_errno(errno);
		}
	}
	return MOAT_OK;
}

/* Sets up the namespaces and the new root's plan in j. */
static int
jail_plan_make(struct vmd_jail *j, const struct vmd_jail_spec *spec,
    char **errmsg)
{
	char *staging;

	j->plan.clone_flags = JAIL_NS_FLAGS;
	j->plan.hostname = "moat";
	staging = keep(j, moat_asprintf("%s/.jail", spec->dir));
	if (staging == NULL ||
	    (mkdir(staging, 0700) != 0 && errno != EEXIST)) {
		*errmsg =
		    moat_asprintf("cannot make the jail's root in %s: %s",
		        spec->dir,
		        staging ? strerror(errno) : "out of memory");
		return MOAT_INTERNAL;
	}
	j->plan.staging = staging;
	j->plan.ops = j->ops;
	plan_root(j, spec);
	if (j->overflow) {
		*errmsg = moat_asprintf("the jail of %s needs more than %d "
		                        "mounts or out of memory",
		    spec->name, JAIL_MAX_OPS);
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

int
vmd_jail_make(const struct vmd_jail_spec *spec, struct vmd_jail **out,
    char **errmsg)
{
	struct vmd_jail *j;
	uint64_t largest = (uint64_t)spec->memory_mib * JAIL_MIB;
	uint32_t uid = 0;
	int rv;

	*out = NULL;
	if (J.s.off)
		return MOAT_OK;
	if ((rv = vmd_jail_admit(errmsg)) != MOAT_OK)
		return rv;
	if ((j = calloc(1, sizeof(*j))) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	j->plan.nofile = J.s.nofile;
	if (J.ns_ok && (rv = jail_plan_make(j, spec, errmsg)) != MOAT_OK)
		goto fail;
	/* A uid of its own only inside the new root: on the host the
	 * directories above the sandbox may be closed to it. */
	if (J.ids_ok && J.ns_ok) {
		if (!uid_take(&uid)) {
			*errmsg = moat_asprintf("all %u jail uids are in use "
			                        "(raise [vmd] jail-uid-count)",
			    J.s.uid_count);
			rv = MOAT_RESOURCE_EXHAUSTED;
			goto fail;
		}
		j->has_uid = true;
		j->plan.uid = uid;
		j->plan.gid = J.s.gid;
		if ((rv = give_files(spec, uid, J.s.gid, errmsg)) != MOAT_OK)
			goto fail;
	}
	/* File size: the largest file it writes (RAM, scratch disk), and
	 * room for its logs. */
	for (int i = 0; i < VMD_JAIL_FILES && spec->rw_files[i] != NULL; i++) {
		struct stat st;

		if (stat(spec->rw_files[i], &st) == 0 &&
		    (uint64_t)st.st_size > largest)
			largest = (uint64_t)st.st_size;
	}
	j->plan.fsize = largest + 64 * JAIL_MIB;
	if (J.cg.version != 0) {
		struct vmd_cgroup_limits lim = {
			.memory_bytes =
			    ((uint64_t)spec->memory_mib + J.s.overhead_mib +
			        spec->extra_mib) *
			    JAIL_MIB,
			.pids = J.s.pids,
			.cpu_quota_us =
			    spec->vcpus * JAIL_CPU_PERIOD_US + JAIL_VMM_CPU_US,
			.cpu_period_us = JAIL_CPU_PERIOD_US,
		};

		if ((rv = vmd_cgroup_create(&J.cg, spec->name, &lim, &j->cg,
		         errmsg)) != MOAT_OK)
			goto fail;
		for (int i = 0; i < j->cg.n; i++)
			j->procs[i] = j->cg.procs[i];
		j->plan.cgroup_procs = j->procs;
		j->plan.n_cgroups = (size_t)j->cg.n;
	}
	*out = j;
	return MOAT_OK;
fail:
	vmd_jail_free(j);
	return rv;
}

const struct moat_jail *
vmd_jail_plan(const struct vmd_jail *j)
{
	return j ? &j->plan : NULL;
}

uid_t
vmd_jail_uid(const struct vmd_jail *j)
{
	return j ? j->plan.uid : 0;
}

void
vmd_jail_free(struct vmd_jail *j)
{
	if (j == NULL)
		return;
	vmd_cgroup_remove(&j->cg);
	if (j->plan.staging != NULL)
		(void)rmdir(j->plan.staging);
	if (j->has_uid)
		uid_give(j->plan.uid);
	for (size_t i = 0; i < j->n_strs; i++)
		free(j->strs[i]);
	free(j);
}

int
vmd_jail_adopt(const char *dir, uid_t uid, struct vmd_jail **out,
    char **errmsg)
{
	const char *slash = strrchr(dir, '/');
	const char *name = slash ? slash + 1 : dir;
	struct vmd_jail *j;

	*out = NULL;
	if (J.s.off)
		return MOAT_OK;
	if ((j = calloc(1, sizeof(*j))) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if (uid != 0) {
		bool taken = false;

		pthread_mutex_lock(&J.mu);
		if (uid >= J.s.uid_base &&
		    uid - J.s.uid_base < J.s.uid_count && J.used != NULL &&
		    !J.used[uid - J.s.uid_base]) {
			J.used[uid - J.s.uid_base] = 1;
			taken = true;
		}
		pthread_mutex_unlock(&J.mu);
		if (!taken) {
			*errmsg =
			    moat_asprintf("its jail uid %u is outside "
			                  "[vmd] jail-uid-base/-count or "
			                  "already another VMM's",
			        (unsigned)uid);
			free(j);
			return MOAT_FAILED_PRECONDITION;
		}
		j->has_uid = true;
		j->plan.uid = uid;
		j->plan.gid = J.s.gid;
	}
	if (J.ns_ok)
		j->plan.staging = keep(j, moat_asprintf("%s/.jail", dir));
	for (int i = 0; J.cg.version != 0 && i < J.cg.n_base; i++) {
		j->cg.dir[i] = moat_asprintf("%s/%s", J.cg.base[i], name);
		j->cg.n = i + 1;
	}
	*out = j;
	return MOAT_OK;
}

void
vmd_jail_detach(struct vmd_jail *j)
{
	if (j == NULL)
		return;
	for (int i = 0; i < VMD_CGROUP_MAX; i++) {
		free(j->cg.dir[i]);
		free(j->cg.procs[i]);
	}
	if (j->has_uid)
		uid_give(j->plan.uid);
	for (size_t i = 0; i < j->n_strs; i++)
		free(j->strs[i]);
	free(j);
}

void
vmd_jail_forget(const char *name)
{
	struct vmd_cgroup cg = { .n = 0 };

	if (J.cg.version == 0 || name == NULL || name[0] == '\0' ||
	    name[0] == '.' || strchr(name, '/') != NULL)
		return;
	for (int i = 0; i < J.cg.n_base; i++)
		cg.dir[i] = moat_asprintf("%s/%s", J.cg.base[i], name);
	cg.n = J.cg.n_base;
	vmd_cgroup_remove(&cg);
}
