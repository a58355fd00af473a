/*
 * spawn.h: the one place moat-vmd creates child processes. A dedicated
 * spawner thread, started at vmd start and stopped only at exit, does
 * every fork, so the PR_SET_PDEATHSIG(SIGKILL) each child sets fires when
 * vmd itself dies (the kernel sends it when the *thread* that forked the
 * child exits, so forking from an RPC worker thread would not do: nng may
 * end its threads at any time). A VMM therefore never outlives a killed
 * vmd. Children also get their own session, an empty signal mask, and
 * only the file descriptors named in the request. Not for: reaping (the
 * caller waits for its own children).
 */
#ifndef MOAT_VMD_SPAWN_H
#define MOAT_VMD_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

/* One step of building a jail's root (jail.c plans them, the child runs
 * them in order, before pivot_root). Paths are absolute, in the staging
 * root. */
enum moat_jail_op_kind {
	MOAT_JAIL_MKDIR,    /* dst: a directory (0755) */
	MOAT_JAIL_MKFILE,   /* dst: an empty file to bind a file onto */
	MOAT_JAIL_SYMLINK,  /* dst -> src (a symlink's text) */
	MOAT_JAIL_BIND_RO,  /* src bound at dst read-only, nosuid, nodev */
	MOAT_JAIL_BIND_RW,  /* src bound at dst, nosuid, nodev */
	MOAT_JAIL_BIND_DEV, /* a device node src at dst, nosuid, noexec */
	MOAT_JAIL_PROC,     /* a proc of the new pid namespace at dst */
};

struct moat_jail_op {
	enum moat_jail_op_kind kind;
	const char *src;
	const char *dst;
};

/* How a child is confined (jail.c builds one per VMM). The child joins
 * the cgroups, enters new namespaces (clone_flags), builds its root from
 * `ops` in a tmpfs at `staging` and pivots into it, sets the rlimits,
 * drops to uid/gid with no supplementary groups, and sets no_new_privs.
 * Each piece is skipped where its field is empty (isolation = relaxed). */
struct moat_jail {
	int clone_flags;     /* CLONE_NEW*; 0: none */
	const char *staging; /* an empty directory for the new root, or
	                        NULL: no new root (needs CLONE_NEWNS) */
	const struct moat_jail_op *ops;
	size_t n_ops;
	const char *const *cgroup_procs; /* cgroup.procs files to join */
	size_t n_cgroups;
	uid_t uid; /* 0: keep root */
	gid_t gid;
	rlim_t nofile;        /* 0: unchanged */
	rlim_t fsize;         /* 0: unchanged */
	const char *hostname; /* with CLONE_NEWUTS */
};

struct moat_spawn_req {
	const char *const *argv; /* argv[0] is looked up in PATH */
	const char *output_file; /* stdout and stderr go here (created,
	                              truncated, 0600); NULL: /dev/null */
	const char *cwd;         /* NULL: inherit */
	bool no_hugepage_advice; /* madvise(MADV_HUGEPAGE) fails with
	                              EINVAL in the child (a seccomp filter;
	                              see spawn.c) */
	int keep_fd;   /* > 2: stays open in the child under the same number
	                  (QEMU's console pipe, named by -add-fd); 0: none */
	int output_fd; /* > 2: the child's stdout and stderr instead of
	                  output_file (a console pipe); 0: none */
	const struct moat_jail *jail; /* NULL: not confined (helpers) */
	const char *const *env; /* the child's environment; NULL: vmd's */
	bool outlive_vmd;       /* no parent-death signal: the child (a VMM a
	                     restarted vmd re-adopts, adopt.h) keeps running
	                     when vmd dies; else it is killed with vmd */
};

/* moat_spawner_start: starts the spawner thread. Call once, before any
 * other thread that might fork. Returns 0 or an errno value. */
int moat_spawner_start(void) __attribute__((warn_unused_result));

/* moat_spawner_stop: stops the spawner thread (after every child it made
 * was reaped or should die with vmd). Safe if never started. */
void moat_spawner_stop(void);

/* moat_spawn: runs `req` through the spawner thread and waits until the
 * child has exec'd (or failed to). Thread-safe. On success *pid is the
 * child, which the caller must reap with waitpid. On failure returns a
 * status and sets *errmsg (heap, caller frees): exec's errno is reported
 * ("qemu-system-x86_64: No such file or directory"). */
int moat_spawn(const struct moat_spawn_req *req, pid_t *pid, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_spawn_wait: moat_spawn, then waits for the child to exit. Returns
 * 0 with *exit_status as from waitpid, or the spawn error. For short
 * helpers (mkfs.ext4). */
int moat_spawn_wait(const struct moat_spawn_req *req, int *exit_status,
    char **errmsg) __attribute__((warn_unused_result));

#endif
