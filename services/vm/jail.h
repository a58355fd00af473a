/*
 * jail.h: the jail every QEMU VMM runs in. Per VMM: a uid of its own
 * from [vmd] jail-uid-base/jail-uid-count (group jail-gid), new mount,
 * pid, net, ipc and uts namespaces whose root is a read-only tmpfs
 * holding, at the same absolute paths as on the host (so QEMU's command
 * line does not change), only the sandbox directory (read-write), the
 * image's kernel, initramfs and root filesystem, the guest RAM file, the
 * system's /usr and libraries (read-only), /dev/null, zero, urandom,
 * random and kvm, and its own /proc; rlimits (open files, file size, no
 * core); no_new_privs; and a cgroup (cgroup.h) with memory = guest RAM +
 * vmm-overhead-mib, pids = vmm-pids and a CPU quota of vCPUs x 100 ms per
 * 100 ms. Everything is undone by vmd_jail_free after the VMM was reaped.
 * At start vmd_jail_init finds which pieces the host lacks: with
 * isolation = strict (the default) sandboxes are then refused, with
 * relaxed they run without those pieces and every reply says so. Not for:
 * QEMU's own seccomp (-sandbox, drivers/qemu.c) or Firecracker (its
 * jailer).
 */
#ifndef MOAT_VMD_JAIL_H
#define MOAT_VMD_JAIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "spawn.h"

/* [vmd] settings of the jail. */
struct vmd_jail_settings {
	bool relaxed;            /* isolation = relaxed */
	bool off;                /* isolation = off: no jail at all; only with
	                         test-hooks (the isolation benchmark) */
	uint32_t uid_base;       /* jail-uid-base (200000) */
	uint32_t uid_count;      /* jail-uid-count (4096) */
	uint32_t gid;            /* jail-gid (default uid_base) */
	uint32_t overhead_mib;   /* vmm-overhead-mib (160) */
	uint32_t pids;           /* vmm-pids (256) */
	uint32_t nofile;         /* vmm-nofile (1024) */
	const char *cgroup_root; /* cgroup-root ("auto") */
};

/* vmd_jail_init: takes the settings and probes the host (root, the
 * namespaces, the cgroup controllers); logs what is missing. Call once at
 * start, before the spawner runs children. Returns 0, or a status with
 * *errmsg (heap) for a setting that cannot work. */
int vmd_jail_init(const struct vmd_jail_settings *s, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_jail_missing_add: a driver reports a piece its VMM lacks ("qemu
 * -sandbox (seccomp)"); at start, from the main thread. */
void vmd_jail_missing_add(const char *piece);

/* vmd_jail_isolation: what the node gives its VMMs, for Node.isolation
 * and Sandbox.isolation: "strict", "relaxed: <what is missing>", or
 * "refused: <what is missing> (set [vmd] isolation = relaxed ...)". */
const char *vmd_jail_isolation(void);

/* vmd_jail_admit: MOAT_OK when sandboxes may run; else
 * MOAT_FAILED_PRECONDITION with *errmsg (heap) naming the missing piece
 * and `isolation = relaxed`. */
int vmd_jail_admit(char **errmsg) __attribute__((warn_unused_result));

/* vmd_jail_seccomp: whether QEMU should get -sandbox (not reported
 * missing). */
bool vmd_jail_seccomp(void);

/* The most read-only or read-write files one VMM gets (each list ends
 * early at a NULL). */
#define VMD_JAIL_FILES 6

/* What one VMM may reach. Borrowed for vmd_jail_make. */
struct vmd_jail_spec {
	const char *name;   /* the sandbox directory's name: the cgroup's */
	const char *dir;    /* the sandbox directory: read-write */
	const char *binary; /* the VMM binary (PATH looked up) */
	/* kernel, initrd, rootfs (and, with ram-sharing = private, the
	 * snapshot's RAM file and the LD_PRELOAD library); NULL ends */
	const char *ro_files[VMD_JAIL_FILES];
	/* RAM file (not with a private mapping), scratch disk, console
	 * log; NULL ends */
	const char *rw_files[VMD_JAIL_FILES];
	bool kvm; /* bind /dev/kvm */
	uint32_t vcpus;
	uint32_t memory_mib;
	uint32_t extra_mib; /* the driver's own beyond vmm-overhead-mib (TCG's
	                       code buffer) */
};

struct vmd_jail;

/* vmd_jail_make: takes a uid, opens spec->dir to it (root:jail-gid
 * 01770) and the rw_files (those that exist: in spec->dir root:jail-gid
 * 0660, elsewhere the uid's, 0600), makes the cgroup and plans the
 * root. Returns 0 with *out (free with vmd_jail_free after the VMM was
 * reaped), or a status with *errmsg (heap). With isolation refused,
 * MOAT_FAILED_PRECONDITION. */
int vmd_jail_make(const struct vmd_jail_spec *spec, struct vmd_jail **out,
    char **errmsg) __attribute__((warn_unused_result));

/* vmd_jail_plan: what the spawner runs (spawn.h); borrowed from j. */
const struct moat_jail *vmd_jail_plan(const struct vmd_jail *j);

/* vmd_jail_uid: the VMM's uid (0 when not dropped). */
uid_t vmd_jail_uid(const struct vmd_jail *j);

/* vmd_jail_adopt: the jail of a VMM that an earlier vmd started in
 * sandbox directory `dir` as jail uid `uid` (0: none) and that a new vmd
 * re-adopts: claims the uid and names its cgroup, so vmd_jail_free undoes
 * them as for a jail vmd_jail_make made. Returns 0 with *out (NULL with
 * isolation = off), or a status with *errmsg (heap) when the uid is
 * outside the pool or taken. */
int vmd_jail_adopt(const char *dir, uid_t uid, struct vmd_jail **out,
    char **errmsg) __attribute__((warn_unused_result));

/* vmd_jail_detach: frees j but leaves its cgroup, staging directory and
 * VMM alone (vmd stops and a later one re-adopts the VMM). NULL-safe. */
void vmd_jail_detach(struct vmd_jail *j);

/* vmd_jail_forget: removes the cgroup of a VMM named `name` that a
 * killed vmd left (reap_orphan). */
void vmd_jail_forget(const char *name);

/* vmd_jail_free: removes the cgroup, returns the uid. NULL-safe. */
void vmd_jail_free(struct vmd_jail *j);

#endif
