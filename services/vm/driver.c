/*
 * driver.c: the table of VMM drivers vmd can run and the choice among
 * them (`[vmd] driver=auto|qemu|firecracker`, see driver.h). The table is
 * the only place in vmd that knows which drivers exist; a driver's own
 * settings reach it through its entry's configure op. Not for: the
 * accelerator decision of the QEMU driver (accel.c) or the drivers
 * themselves (drivers/).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "drivers/firecracker/firecracker.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "driver.h"

/* One driver vmd can run. */
struct vmd_driver {
	const char *name;               /* [vmd] driver=, and ops->name */
	const struct moat_vmm_ops *ops; /* ops->probe: can it run here? */
	size_t binary;                  /* offsetof the binary's path in struct
	                              vmd_config ([vmd] qemu=, firecracker=) */
	/* configure: reads the driver's own section of `c` into the
	 * driver's state, before its probe; NULL: nothing to read. Returns
	 * 0 or a status with *errmsg (heap). */
	int (*configure)(const struct moat_config *c,
	    const struct moat_vmm_host *host, char **errmsg);
	const char *accel; /* the accelerator it forces, or NULL */
};

/* In the order driver=auto tries them; the last is the fallback, whose
 * failure ends the start. */
static const struct vmd_driver drivers[] = {
	{
	    .name = "firecracker",
	    .ops = &moat_vmm_firecracker,
	    .binary = offsetof(struct vmd_config, firecracker_binary),
	    .configure = moat_fc_configure,
	    .accel = "kvm", /* Firecracker has no TCG */
	},
	{
	    .name = "qemu",
	    .ops = &moat_vmm_qemu,
	    .binary = offsetof(struct vmd_config, qemu_binary),
	},
};

#define N_DRIVERS (sizeof(drivers) / sizeof(drivers[0]))

static const char *
driver_binary(const struct vmd_driver *d, const struct vmd_config *cfg)
{
	return *(char *const *)(const void *)((const char *)cfg + d->binary);
}

/* The message for a driver name the table lacks, listing the table's
 * names (heap, caller frees; NULL when out of memory). */
static char *
driver_unknown(const char *name)
{
	char *names = strdup("auto");

	for (size_t i = 0; names != NULL && i < N_DRIVERS; i++) {
		char *more = moat_asprintf("%s, %s", names, drivers[i].name);

		free(names);
		names = more;
	}
	if (names == NULL)
		return NULL;
	char *msg = moat_asprintf("driver \"%s\" is not one of %s: set "
	                          "[vmd] driver or --driver to one of them",
	    name, names);

	free(names);
	return msg;
}

/* Makes `d` vmd's driver after its probe passed. */
static int
driver_use(struct vmd *vmd, const struct vmd_driver *d)
{
	struct vmd_config *cfg = &vmd->cfg;

	vmd->vmm = d->ops;
	vmd->vmm_binary = driver_binary(d, cfg);
	if (d->accel != NULL) {
		free(cfg->accel);
		if ((cfg->accel = strdup(d->accel)) == NULL)
			return MOAT_INTERNAL;
	}
	moat_info(0, "driver: %s (%s)", d->name, vmd->vmm_version);
	return MOAT_OK;
}

int
vmd_driver_check_name(const char *name, char **errmsg)
{
	*errmsg = NULL;
	if (strcmp(name, "auto") == 0)
		return MOAT_OK;
	for (size_t i = 0; i < N_DRIVERS; i++)
		if (strcmp(name, drivers[i].name) == 0)
			return MOAT_OK;
	*errmsg = driver_unknown(name);
	return MOAT_INVALID_ARGUMENT;
}

int
vmd_driver_select(struct vmd *vmd, const struct moat_config *c, char **errmsg)
{
	struct vmd_config *cfg = &vmd->cfg;
	const struct moat_vmm_host host = {
		.kvm_device = cfg->kvm_device,
		.test_hooks = cfg->test_hooks,
	};
	bool any = strcmp(cfg->driver, "auto") == 0;
	int rv;

	*errmsg = NULL;
	for (size_t i = 0; i < N_DRIVERS; i++) {
		const struct vmd_driver *d = &drivers[i];
		bool last = i + 1 == N_DRIVERS;
		char *why = NULL;

		if (!any && strcmp(cfg->driver, d->name) != 0)
			continue;
		if (d->configure != NULL &&
		    (rv = d->configure(c, &host, errmsg)) != MOAT_OK)
			return rv;
		rv = d->ops->probe(driver_binary(d, cfg), &vmd->vmm_version,
		    &why);
		if (rv == MOAT_OK)
			return driver_use(vmd, d);
		if (!any || last) {
			*errmsg = why;
			return rv;
		}
		moat_info(0, "driver=auto: using %s, not %s: %s",
		    drivers[i + 1].name, d->name, why ? why : "not usable");
		free(why);
	}
	*errmsg = driver_unknown(cfg->driver);
	return MOAT_INVALID_ARGUMENT;
}
