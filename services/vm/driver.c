/*
 * driver.c: which VMM this vmd drives (`[vmd] driver=auto|qemu|
 * firecracker`). auto picks Firecracker when its binary runs and the KVM
 * device can create a VM, else QEMU; the driver table chosen here is the
 * only place in vmd that knows which VMM runs. Firecracker's own settings
 * come from the [firecracker] section. Not for: the accelerator decision
 * of the QEMU driver (accel.c) or the drivers themselves (drivers/).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "drivers/firecracker/firecracker.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/util.h"
#include "driver.h"

#define FC "firecracker"

/* Reads the [firecracker] section into *fcc; strings stay owned by c. */
static int
driver_fc_config(const struct moat_config *c, const struct vmd_config *cfg,
    struct moat_fc_config *fcc, char **errmsg)
{
	struct moat_fc_jail_config *j = &fcc->jail;
	uint64_t v;
	bool b;
	int rv;

	moat_fc_config_defaults(fcc);
	fcc->kvm_device = cfg->kvm_device;
	if ((rv = moat_config_get_bool(c, FC, "jailer", false, &b,
	    errmsg)) != 0)
		return rv;
	fcc->use_jailer = b;
	if ((rv = moat_config_get_bool(c, FC, "track-dirty-pages", false, &b,
	    errmsg)) != 0)
		return rv;
	fcc->track_dirty_pages = b;
	if ((rv = moat_config_get_bool(c, FC, "test-no-kvm-check", false, &b,
	    errmsg)) != 0)
		return rv;
	if (b && !cfg->test_hooks) {
		*errmsg = strdup("[firecracker] test-no-kvm-check is for "
		    "moat's own tests (a test double stands in for "
		    "Firecracker): remove it, or set [vmd] test-hooks=true on "
		    "a test node");
		return MOAT_INVALID_ARGUMENT;
	}
	if (b)
		moat_warn(0, "[firecracker] test-no-kvm-check: KVM is not "
		    "checked; only a test double can run here");
	fcc->test_no_kvm_check = b;
	if ((rv = moat_config_get_u64(c, FC, "vsock-port", fcc->vsock_port,
	    &v, errmsg)) != 0)
		return rv;
	fcc->vsock_port = (uint32_t)v;
	if ((rv = moat_config_get_u64(c, FC, "api-timeout-ms",
	    fcc->api_timeout_ms, &v, errmsg)) != 0)
		return rv;
	fcc->api_timeout_ms = (uint32_t)v;
	j->jailer = moat_config_get(c, FC, "jailer-binary", j->jailer);
	j->chroot_base = moat_config_get(c, FC, "chroot-base", j->chroot_base);
	j->cgroup_root = moat_config_get(c, FC, "cgroup-root", j->cgroup_root);
	j->parent_cgroup = moat_config_get(c, FC, "parent-cgroup",
	    j->parent_cgroup);
	j->netns = moat_config_get(c, FC, "netns", j->netns);
	if ((rv = moat_config_get_u64(c, FC, "uid-base", j->uid_base, &v,
	    errmsg)) != 0)
		return rv;
	j->uid_base = (uint32_t)v;
	if ((rv = moat_config_get_u64(c, FC, "id-count", j->id_count, &v,
	    errmsg)) != 0)
		return rv;
	j->id_count = (uint32_t)v;
	if ((rv = moat_config_get_bool(c, FC, "new-pid-ns", j->new_pid_ns,
	    &b, errmsg)) != 0)
		return rv;
	j->new_pid_ns = b;
	if ((rv = moat_config_get_u64(c, FC, "memory-overhead-mib",
	    j->memory_overhead_mib, &v, errmsg)) != 0)
		return rv;
	j->memory_overhead_mib = (uint32_t)v;
	return MOAT_OK;
}

int
vmd_driver_select(struct vmd *vmd, const struct moat_config *c,
    char **errmsg)
{
	struct vmd_config *cfg = &vmd->cfg;
	bool want_fc = strcmp(cfg->driver, FC) == 0;
	struct moat_fc_config fcc;
	char *why = NULL;
	int rv;

	vmd->vmm = &moat_vmm_qemu;
	vmd->vmm_binary = cfg->qemu_binary;
	if (strcmp(cfg->driver, "qemu") != 0) {
		if ((rv = driver_fc_config(c, cfg, &fcc, errmsg)) != 0)
			return rv;
		if (fcc.use_jailer && fcc.jail.new_pid_ns)
			(void)prctl(PR_SET_CHILD_SUBREAPER, 1);
		if ((rv = moat_vmm_firecracker_configure(&fcc, errmsg)) != 0)
			return rv;
		rv = moat_vmm_firecracker.probe(cfg->firecracker_binary,
		    &vmd->vmm_version, &why);
		if (rv == MOAT_OK) {
			vmd->vmm = &moat_vmm_firecracker;
			vmd->vmm_binary = cfg->firecracker_binary;
			/* Firecracker has no TCG: the accelerator is KVM. */
			free(cfg->accel);
			if ((cfg->accel = strdup("kvm")) == NULL)
				return MOAT_INTERNAL;
			moat_info(0, "driver: firecracker (%s)",
			    vmd->vmm_version);
			return MOAT_OK;
		}
		if (want_fc) {
			*errmsg = why;
			return rv;
		}
		moat_info(0, "driver=auto: using qemu, not firecracker: %s",
		    why ? why : "not usable");
		free(why);
	}
	if ((rv = vmd->vmm->probe(cfg->qemu_binary, &vmd->vmm_version,
	    errmsg)) != MOAT_OK)
		return rv;
	moat_info(0, "driver: qemu (%s)", vmd->vmm_version);
	return MOAT_OK;
}
