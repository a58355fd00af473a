/*
 * cgroup.h: one control group per VMM, with a memory limit (guest RAM +
 * VMM overhead), a pids limit and a CPU quota (vCPUs x period), on
 * cgroup v2 where the host has it with the memory, pids and cpu
 * controllers, else on the v1 memory, pids and cpu hierarchies. Groups
 * live under "moat/" of each hierarchy ([vmd] cgroup-root). The VMM's
 * child joins its groups itself before exec (spawn.c writes "0" to each
 * cgroup.procs). Not for: the rest of the jail (jail.h).
 */
#ifndef MOAT_VMD_CGROUP_H
#define MOAT_VMD_CGROUP_H

#include <stdint.h>

#define VMD_CGROUP_MAX 3 /* v1: memory, pids, cpu; v2: one */

/* What the host offers (vmd_cgroup_detect). */
struct vmd_cgroup_host {
	int version; /* 0: none usable, 1 or 2 */
	/* The "moat" parent group of each hierarchy: v2: one, v1: the
	 * memory, pids and cpu ones, in that order. Heap. */
	char *base[VMD_CGROUP_MAX];
	int n_base;
};

struct vmd_cgroup_limits {
	uint64_t memory_bytes;
	uint32_t pids;
	uint32_t cpu_quota_us; /* per cpu_period_us */
	uint32_t cpu_period_us;
};

/* One VMM's groups. */
struct vmd_cgroup {
	char *dir[VMD_CGROUP_MAX];   /* heap */
	char *procs[VMD_CGROUP_MAX]; /* <dir>/cgroup.procs, heap */
	int n;
};

/* vmd_cgroup_detect: finds the hierarchies under `root` ("auto" or
 * NULL: v2 at /sys/fs/cgroup when its cgroup.controllers has memory,
 * pids and cpu, else the v1 mounts of those controllers from
 * /proc/self/mounts; a path: v2 there when it has cgroup.controllers,
 * else v1 at <root>/memory, <root>/pids, <root>/cpu) and makes the
 * "moat" parent groups (enabling the v2 controllers for them). Returns 0
 * with *h filled, or a status with *why (heap) naming what is missing;
 * h->version is then 0. */
int vmd_cgroup_detect(const char *root, struct vmd_cgroup_host *h, char **why)
    __attribute__((warn_unused_result));
void vmd_cgroup_host_fini(struct vmd_cgroup_host *h);

/* vmd_cgroup_create: makes the groups `name` (a sandbox directory's
 * name) under h's parents with `lim` written. Returns 0 with *cg, or a
 * status with *errmsg (heap); nothing is left on failure. */
int vmd_cgroup_create(const struct vmd_cgroup_host *h, const char *name,
    const struct vmd_cgroup_limits *lim, struct vmd_cgroup *cg, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_cgroup_remove: removes cg's groups (after its processes exited;
 * any still there are killed first) and frees cg's strings. Safe on a
 * zeroed cg. */
void vmd_cgroup_remove(struct vmd_cgroup *cg);

/* vmd_cgroup_remove_named: removes the groups `name` (a sandbox
 * directory's name) that a vmd made under `root` (as vmd_cgroup_detect
 * reads it) and did not remove (it was killed): `moat-vmd purge`. Any
 * process still in them is killed. Nothing when the host has none. */
void vmd_cgroup_remove_named(const char *root, const char *name);

#endif
