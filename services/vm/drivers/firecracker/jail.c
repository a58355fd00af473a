/*
 * jail.c: the jail of one Firecracker (see jail.h): its paths, uid/gid,
 * cgroup v2 preparation, the jailer's argv and cleanup. Plain file system
 * work, so it is unit-tested with every root in a temporary folder. Not
 * for: spawning the jailer or linking files into the chroot
 * (firecracker.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat/util.h"
#include "jail.h"

#define JAIL_ID_MAX 64
#define JAIL_MAX_ARGS 48
#define JAIL_CPU_PERIOD_US 100000u

static bool
jail_id_ok(const char *id)
{
	size_t n = strlen(id);

	if (n == 0 || n > JAIL_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '-'))
			return false;
	}
	return true;
}

void
moat_fc_jail_fini(struct moat_fc_jail *j)
{
	free(j->id);
	free(j->dir);
	free(j->root);
	free(j->cgroup);
	free(j->pid_file);
	memset(j, 0, sizeof(*j));
}

int
moat_fc_jail_init(const struct moat_fc_jail_config *cfg,
    const char *firecracker, const char *id, uint32_t slot,
    struct moat_fc_jail *j, char **errmsg)
{
	const char *exec_name = strrchr(firecracker, '/');

	*errmsg = NULL;
	memset(j, 0, sizeof(*j));
	exec_name = exec_name ? exec_name + 1 : firecracker;
	if (!jail_id_ok(id)) {
		*errmsg =
		    moat_asprintf("sandbox id \"%s\" cannot be a jailer "
		                  "--id (alphanumerics and '-', at most %d)",
		        id, JAIL_ID_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if (exec_name[0] == '\0' || strcmp(exec_name, "..") == 0 ||
	    strcmp(exec_name, ".") == 0) {
		*errmsg =
		    moat_asprintf("firecracker binary \"%s\" has no file "
		                  "name: set [firecracker] binary to the file",
		        firecracker);
		return MOAT_INVALID_ARGUMENT;
	}
	if (slot >= cfg->id_count) {
		*errmsg = moat_asprintf(
		    "no jail uid/gid left: all %u of "
		    "%u..%u are in use; raise [firecracker] jail-id-count",
		    cfg->id_count, cfg->uid_base,
		    cfg->uid_base + cfg->id_count - 1);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	j->id = strdup(id);
	j->dir = moat_asprintf("%s/%s/%s", cfg->chroot_base, exec_name, id);
	j->root =
	    moat_asprintf("%s/%s/%s/root", cfg->chroot_base, exec_name, id);
	j->cgroup = moat_asprintf("%s/%s/%s", cfg->cgroup_root,
	    cfg->parent_cgroup, id);
	j->pid_file = moat_asprintf("%s/%s/%s/root/%s.pid", cfg->chroot_base,
	    exec_name, id, exec_name);
	j->uid = (uid_t)(cfg->uid_base + slot);
	j->gid = (gid_t)(cfg->uid_base + slot);
	if (!j->id || !j->dir || !j->root || !j->cgroup || !j->pid_file) {
		moat_fc_jail_fini(j);
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* Writes `text` to an existing control file (no create, no truncate: a
 * cgroup file takes one write). Returns 0 or errno. */
static int
jail_write_control(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
	ssize_t n;
	int err = 0;

	if (fd < 0)
		return errno;
	n = write(fd, text, strlen(text));
	if (n < 0)
		err = errno;
	else if ((size_t)n != strlen(text))
		err = EIO;
	close(fd);
	return err;
}

/* True when the space-separated list `text` holds `word` as a whole. */
static bool
jail_has_word(const char *text, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = text; (p = strstr(p, word)) != NULL; p += n) {
		bool starts = p == text || p[-1] == ' ' || p[-1] == '\n';
		bool ends = p[n] == '\0' || p[n] == ' ' || p[n] == '\n';

		if (starts && ends)
			return true;
	}
	return false;
}

/* Adds the cpu and memory controllers to `dir`/cgroup.subtree_control
 * unless they are already there. */
static int
jail_enable_controllers(const char *dir, char **errmsg)
{
	char *path = moat_asprintf("%s/cgroup.subtree_control", dir);
	char *have = NULL;
	size_t len;
	int err;

	if (path == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if ((err = moat_read_file(path, 4096, &have, &len)) != 0) {
		*errmsg =
		    moat_asprintf("cannot read %s: %s: is %s a cgroup v2 "
		                  "mount? set [firecracker] cgroup-root to it",
		        path, strerror(err), dir);
		free(path);
		return moat_status_from_errno(err);
	}
	if (jail_has_word(have, "cpu") && jail_has_word(have, "memory")) {
		free(have);
		free(path);
		return MOAT_OK;
	}
	free(have);
	/* One controller per write: the kernel refuses the whole line if one
	 * is missing, and the message should say which. */
	if ((err = jail_write_control(path, "+cpu")) != 0 ||
	    (err = jail_write_control(path, "+memory")) != 0) {
		*errmsg = moat_asprintf(
		    "cannot enable the cpu and memory "
		    "controllers in %s: %s (the jail needs them for its "
		    "limits)",
		    path, strerror(err));
		free(path);
		return moat_status_from_errno(err);
	}
	free(path);
	return MOAT_OK;
}

int
moat_fc_jail_prepare(const struct moat_fc_jail_config *cfg,
    const struct moat_fc_jail *j, char **errmsg)
{
	char *parent = NULL;
	int err;
	int rv;

	*errmsg = NULL;
	(void)moat_fc_jail_clean(j);
	if ((err = moat_mkdir_p(j->root, 0750)) != 0) {
		*errmsg = moat_asprintf("cannot create the jail %s: %s: check "
		                        "[firecracker] chroot-base",
		    j->root, strerror(err));
		return moat_status_from_errno(err);
	}
	if (chown(j->root, j->uid, j->gid) != 0) {
		err = errno;
		*errmsg = moat_asprintf(
		    "cannot give the jail %s to uid %u: "
		    "%s (vmd must run as root to use the jailer)",
		    j->root, (unsigned)j->uid, strerror(err));
		return moat_status_from_errno(err);
	}
	if ((parent = moat_asprintf("%s/%s", cfg->cgroup_root,
	         cfg->parent_cgroup)) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if ((rv = jail_enable_controllers(cfg->cgroup_root, errmsg)) != 0)
		goto cleanup;
	if (mkdir(parent, 0755) != 0 && errno != EEXIST) {
		err = errno;
		*errmsg = moat_asprintf("cannot create the cgroup %s: %s",
		    parent, strerror(err));
		rv = moat_status_from_errno(err);
		goto cleanup;
	}
	rv = jail_enable_controllers(parent, errmsg);
cleanup:
	free(parent);
	return rv;
}

static bool
argv_push(char **argv, int *n, char *s)
{
	if (s == NULL || *n >= JAIL_MAX_ARGS) {
		free(s);
		return false;
	}
	argv[(*n)++] = s;
	argv[*n] = NULL;
	return true;
}

char **
moat_fc_jail_argv(const struct moat_fc_jail_config *cfg,
    const struct moat_fc_jail *j, const char *firecracker, uint32_t vcpus,
    uint32_t memory_mib, const char *const *fc_args)
{
	char **argv = calloc(JAIL_MAX_ARGS + 1, sizeof(*argv));
	uint64_t mem_max = ((uint64_t)memory_mib + cfg->memory_overhead_mib)
	    << 20;
	bool ok = true;
	int n = 0;

	if (argv == NULL)
		return NULL;
	ok = ok && argv_push(argv, &n, strdup(cfg->jailer));
	ok = ok && argv_push(argv, &n, strdup("--id"));
	ok = ok && argv_push(argv, &n, strdup(j->id));
	ok = ok && argv_push(argv, &n, strdup("--exec-file"));
	ok = ok && argv_push(argv, &n, strdup(firecracker));
	ok = ok && argv_push(argv, &n, strdup("--uid"));
	ok = ok && argv_push(argv, &n, moat_asprintf("%u", (unsigned)j->uid));
	ok = ok && argv_push(argv, &n, strdup("--gid"));
	ok = ok && argv_push(argv, &n, moat_asprintf("%u", (unsigned)j->gid));
	ok = ok && argv_push(argv, &n, strdup("--chroot-base-dir"));
	ok = ok && argv_push(argv, &n, strdup(cfg->chroot_base));
	ok = ok && argv_push(argv, &n, strdup("--cgroup-version"));
	ok = ok && argv_push(argv, &n, strdup("2"));
	ok = ok && argv_push(argv, &n, strdup("--parent-cgroup"));
	ok = ok && argv_push(argv, &n, strdup(cfg->parent_cgroup));
	ok = ok && argv_push(argv, &n, strdup("--cgroup"));
	ok = ok &&
	    argv_push(argv, &n,
	        moat_asprintf("memory.max=%llu", (unsigned long long)mem_max));
	ok = ok && argv_push(argv, &n, strdup("--cgroup"));
	ok = ok &&
	    argv_push(argv, &n,
	        moat_asprintf("cpu.max=%llu %u",
	            (unsigned long long)vcpus * JAIL_CPU_PERIOD_US,
	            JAIL_CPU_PERIOD_US));
	if (cfg->netns != NULL && cfg->netns[0] != '\0') {
		ok = ok && argv_push(argv, &n, strdup("--netns"));
		ok = ok && argv_push(argv, &n, strdup(cfg->netns));
	}
	if (cfg->new_pid_ns)
		ok = ok && argv_push(argv, &n, strdup("--new-pid-ns"));
	ok = ok && argv_push(argv, &n, strdup("--"));
	for (int i = 0; ok && fc_args != NULL && fc_args[i] != NULL; i++)
		ok = argv_push(argv, &n, strdup(fc_args[i]));
	if (!ok) {
		moat_fc_jail_argv_free(argv);
		return NULL;
	}
	return argv;
}

void
moat_fc_jail_argv_free(char **argv)
{
	if (argv == NULL)
		return;
	for (int i = 0; argv[i] != NULL; i++)
		free(argv[i]);
	free(argv);
}

int
moat_fc_jail_clean(const struct moat_fc_jail *j)
{
	int first = 0;
	int err;

	if (j->dir != NULL && (err = moat_rm_rf(j->dir)) != 0)
		first = err;
	/* A cgroup folder goes with rmdir (its files are not files); it
	 * fails while a process is still in it, which the caller prevents. */
	if (j->cgroup != NULL && rmdir(j->cgroup) != 0 && errno != ENOENT &&
	    first == 0)
		first = errno;
	return first;
}
