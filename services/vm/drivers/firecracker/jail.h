/*
 * jail.h: where a jailed Firecracker lives and what the jailer is told:
 * the chroot `<chroot_base>/<exec name>/<sandbox id>/root`, the uid/gid
 * picked from a configured range, the cgroup v2 `<cgroup_root>/<parent>/
 * <sandbox id>` with memory and CPU limits, the jailer's argv, and the
 * cleanup on destroy. Everything is computed from the configuration and
 * the sandbox id, so a vmd that restarts finds an orphan's jail again.
 * Not for: starting the process (firecracker.c) or the files put in the
 * chroot (firecracker.c links them).
 */
#ifndef MOAT_FC_JAIL_H
#define MOAT_FC_JAIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The jailer's settings; strings borrowed for the life of the jail
 * calls (firecracker.c keeps them in its configuration). */
struct moat_fc_jail_config {
	const char *jailer;           /* jailer binary */
	const char *chroot_base;      /* --chroot-base-dir ("/srv/jailer") */
	const char *cgroup_root;      /* cgroup v2 mount ("/sys/fs/cgroup") */
	const char *parent_cgroup;    /* --parent-cgroup ("moat") */
	uint32_t uid_base;            /* uid = gid = uid_base + slot */
	uint32_t id_count;            /* slots in the range */
	const char *netns;            /* --netns path, or NULL */
	bool new_pid_ns;              /* --new-pid-ns */
	uint32_t memory_overhead_mib; /* memory.max = guest + this */
};

/* One sandbox's jail. Strings are heap, owned, freed by
 * moat_fc_jail_fini. */
struct moat_fc_jail {
	char *id;       /* sandbox id, the jailer's --id */
	char *dir;      /* <base>/<exec name>/<id> */
	char *root;     /* dir + "/root": the VM's "/" */
	char *cgroup;   /* <cgroup_root>/<parent>/<id> */
	char *pid_file; /* root + "/<exec name>.pid" */
	uid_t uid;
	gid_t gid;
};

/* moat_fc_jail_init: fills *j for sandbox `id` in `slot` (0 <=
 * slot < id_count), with `firecracker` the binary the jailer copies in
 * (its base name names the folder). Only computes; touches no file.
 * Returns 0, or a status with *errmsg (heap, caller frees) for an id the
 * jailer would refuse (alphanumerics and '-', at most 64) or a slot out of
 * range. On failure *j is finied. */
int moat_fc_jail_init(const struct moat_fc_jail_config *cfg,
    const char *firecracker, const char *id, uint32_t slot,
    struct moat_fc_jail *j, char **errmsg) __attribute__((warn_unused_result));

/* moat_fc_jail_prepare: makes the chroot folder (owned by the jail's
 * uid/gid, mode 0750) and the parent cgroup with the cpu and memory
 * controllers enabled for its children (cgroup.subtree_control of the
 * cgroup root and of the parent). Any stale jail of the same id is
 * removed first. Returns 0 or a status with *errmsg (heap). */
int moat_fc_jail_prepare(const struct moat_fc_jail_config *cfg,
    const struct moat_fc_jail *j, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_fc_jail_argv: the jailer's command line for this jail with
 * `vcpus` and `memory_mib` as cgroup limits, then "--" and the
 * Firecracker arguments `fc_args` (NULL-terminated, borrowed; without
 * --id, which the jailer passes to Firecracker itself). Returns a
 * NULL-terminated heap array of heap strings (free with
 * moat_fc_jail_argv_free), or NULL when out of memory. */
char **moat_fc_jail_argv(const struct moat_fc_jail_config *cfg,
    const struct moat_fc_jail *j, const char *firecracker, uint32_t vcpus,
    uint32_t memory_mib, const char *const *fc_args);

/* moat_fc_jail_argv_free: frees what moat_fc_jail_argv returned; NULL is
 * fine. */
void moat_fc_jail_argv_free(char **argv);

/* moat_fc_jail_clean: after the jailed process is gone: removes the jail
 * folder (the chroot and what the jailer made in it; hard links to the
 * sandbox's files go, the files stay) and the sandbox's cgroup. Missing
 * pieces are fine. Returns 0, or the first errno met (it keeps going). */
int moat_fc_jail_clean(const struct moat_fc_jail *j);

/* moat_fc_jail_fini: frees j's strings. Safe on a zeroed jail. */
void moat_fc_jail_fini(struct moat_fc_jail *j);

#endif
