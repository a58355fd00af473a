/*
 * config.c: the Firecracker driver's configure op, the one vmd's driver
 * table (driver.c) calls: reads the [firecracker] section into a struct
 * moat_fc_config and hands it to the driver's own state. Not for: the
 * meaning of the settings (firecracker.h, jail.h) or [vmd]'s keys.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>

#include "firecracker.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/status.h"

#define FC "firecracker"

/* Reads the section into *fcc; strings stay owned by c. */
static int
fc_config_read(const struct moat_config *c, const struct moat_vmm_host *host,
    struct moat_fc_config *fcc, char **errmsg)
{
	struct moat_fc_jail_config *j = &fcc->jail;
	uint64_t v;
	bool b;
	int rv;

	moat_fc_config_defaults(fcc);
	fcc->kvm_device = host->kvm_device;
	if ((rv = moat_config_get_bool(c, FC, "jailer", true, &b, errmsg)) !=
	    0)
		return rv;
	fcc->use_jailer = b;
	if ((rv = moat_config_get_bool(c, FC, "track-dirty-pages", false, &b,
	         errmsg)) != 0)
		return rv;
	fcc->track_dirty_pages = b;
	if ((rv = moat_config_get_bool(c, FC, "test-no-kvm-check", false, &b,
	         errmsg)) != 0)
		return rv;
	if (b && !host->test_hooks) {
		*errmsg = strdup(
		    "[firecracker] test-no-kvm-check is for "
		    "moat's own tests (a test double stands in for "
		    "Firecracker): remove it, or set [vmd] test-hooks=true on "
		    "a test node");
		return MOAT_INVALID_ARGUMENT;
	}
	if (b)
		moat_warn(0,
		    "[firecracker] test-no-kvm-check: KVM is not "
		    "checked; only a test double can run here");
	fcc->test_no_kvm_check = b;
	if ((rv = moat_config_get_u64(c, FC, "vsock-port", fcc->vsock_port, &v,
	         errmsg)) != 0)
		return rv;
	fcc->vsock_port = (uint32_t)v;
	if ((rv = moat_config_get_u64(c, FC, "api-timeout-ms",
	         fcc->api_timeout_ms, &v, errmsg)) != 0)
		return rv;
	fcc->api_timeout_ms = (uint32_t)v;
	j->jailer = moat_config_get(c, FC, "jailer-binary", j->jailer);
	j->chroot_base = moat_config_get(c, FC, "chroot-base", j->chroot_base);
	j->cgroup_root = moat_config_get(c, FC, "cgroup-root", j->cgroup_root);
	j->parent_cgroup =
	    moat_config_get(c, FC, "parent-cgroup", j->parent_cgroup);
	j->netns = moat_config_get(c, FC, "netns", j->netns);
	if ((rv = moat_config_get_u64(c, FC, "uid-base", j->uid_base, &v,
	         errmsg)) != 0)
		return rv;
	j->uid_base = (uint32_t)v;
	if ((rv = moat_config_get_u64(c, FC, "id-count", j->id_count, &v,
	         errmsg)) != 0)
		return rv;
	j->id_count = (uint32_t)v;
	if ((rv = moat_config_get_bool(c, FC, "new-pid-ns", j->new_pid_ns, &b,
	         errmsg)) != 0)
		return rv;
	j->new_pid_ns = b;
	if ((rv = moat_config_get_u64(c, FC, "memory-overhead-mib",
	         j->memory_overhead_mib, &v, errmsg)) != 0)
		return rv;
	j->memory_overhead_mib = (uint32_t)v;
	return MOAT_OK;
}

int
moat_fc_configure(const struct moat_config *c,
    const struct moat_vmm_host *host, char **errmsg)
{
	struct moat_fc_config fcc;
	int rv;

	*errmsg = NULL;
	if ((rv = fc_config_read(c, host, &fcc, errmsg)) != MOAT_OK)
		return rv;
	/* With --new-pid-ns the jailer's parent exits and Firecracker is
	 * re-parented to vmd, which must therefore be a subreaper before
	 * the first jail starts (probe checks it). */
	if (fcc.use_jailer && fcc.jail.new_pid_ns)
		(void)prctl(PR_SET_CHILD_SUBREAPER, 1);
	return moat_vmm_firecracker_configure(&fcc, errmsg);
}
