/*
 * firecracker.h: the Firecracker driver (`moat_vmm_firecracker`) and what
 * it offers beyond struct moat_vmm_ops: its configuration (jailer or not,
 * limits, the agent's vsock port) and the snapshot calls (pause,
 * snapshot create, snapshot load into a fresh process, resume) that its
 * snapshot, restore and resume ops are built on. Not for: the REST
 * client (api.h) or the jail layout (jail.h).
 *
 * Every Firecracker sees one folder as its working directory (the
 * sandbox folder, or the chroot when jailed) holding the same names:
 * vmlinux, initrd.img, rootfs.ext4, scratch.ext4, api.sock, vsock.sock,
 * firecracker.log, metrics.json. Every path given to the API is relative
 * to it, so a snapshot taken in one sandbox loads in another.
 */
#ifndef MOAT_VMM_FIRECRACKER_H
#define MOAT_VMM_FIRECRACKER_H

#include <stdbool.h>
#include <stdint.h>

#include "../../vmm.h"
#include "jail.h"

struct moat_config;

/* The driver's settings. Strings are copied by configure. */
struct moat_fc_config {
	const char *kvm_device;  /* "/dev/kvm" */
	uint32_t api_timeout_ms; /* per API call, and for the API socket
	                              to appear after spawn */
	uint32_t vsock_port;     /* the agent's port (moat.vsock=) */
	bool track_dirty_pages;  /* needed for Diff snapshots */
	bool use_jailer;         /* false: `jail` is ignored */
	bool test_no_kvm_check;  /* moat's own tests only: probe does not
	                              ask KVM for a VM (a test double stands
	                              in for Firecracker) */
	struct moat_fc_jail_config jail;
};

extern const struct moat_vmm_ops moat_vmm_firecracker;

/* moat_fc_config_defaults: fills *cfg with the defaults (no jailer;
 * /dev/kvm; 5 s API timeout; vsock port 1024; jail under /srv/jailer,
 * cgroup /sys/fs/cgroup/moat, uids 900000.., 64 MiB overhead). The
 * strings are static. */
void moat_fc_config_defaults(struct moat_fc_config *cfg);

/* moat_fc_configure: the driver's configure op (vmd's driver table,
 * driver.h): reads the [firecracker] section of `c` (NULL: environment
 * and defaults only) with the node's kvm-device and test-hooks from
 * `host`, makes vmd a child subreaper when a jailed Firecracker gets its
 * own pid namespace, and applies the settings with
 * moat_vmm_firecracker_configure. Main thread, before probe. Returns 0,
 * or a status with *errmsg (heap, caller frees) naming the key. */
int moat_fc_configure(const struct moat_config *c,
    const struct moat_vmm_host *host, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_vmm_firecracker_configure: sets the driver's own settings from a
 * filled struct (moat_fc_configure's last step; the driver's unit tests
 * call it directly). Call from the main thread, before probe and any
 * other op; without it the defaults apply. Returns 0, or a status with
 * *errmsg (heap, caller frees) for settings that cannot work. */
int moat_vmm_firecracker_configure(const struct moat_fc_config *cfg,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_fc_exit_text: "exit code 152 (bad configuration)" or "killed by
 * signal 9 (Killed)" for a waitpid status of a Firecracker. Heap; caller
 * frees; NULL when out of memory. */
char *moat_fc_exit_text(int wait_status);

/* moat_fc_vm_pause, moat_fc_vm_resume: PATCH /vm to Paused / Resumed
 * (repeating one is harmless). `vm` was filled by start or
 * moat_fc_snapshot_load and is not released. Returns 0 or a status with
 * *errmsg (heap, caller frees) quoting Firecracker's fault_message. */
int moat_fc_vm_pause(const struct moat_vmm *vm, char **errmsg)
    __attribute__((warn_unused_result));
int moat_fc_vm_resume(const struct moat_vmm *vm, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_fc_snapshot_create: on a paused VM, PUT /snapshot/create writing
 * `name`.vmstate and `name`.mem (name: alphanumerics, '-', '_') in the
 * VM's folder; `diff` asks for a Diff snapshot (needs
 * track_dirty_pages). Sets *state_file and *mem_file to their host paths
 * (heap, caller frees; the files are the caller's to move away before the
 * next snapshot of that name). The scratch disk is not in it: capture it
 * while still paused. Returns 0 or a status with *errmsg (heap). */
int moat_fc_snapshot_create(const struct moat_vmm *vm, const char *name,
    bool diff, char **state_file, char **mem_file, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_fc_snapshot_load: like start, but the fresh Firecracker loads the
 * snapshot `state_file` + `mem_file` (File backend: mapped privately,
 * so the file must stay unchanged while the VM lives; it is hard-linked,
 * or symlinked when not jailed, never written) instead of booting, and
 * resumes it when `resume`. spec->rootfs and spec->scratch_disk must hold
 * the disks the snapshot was taken with (the scratch disk as captured);
 * spec->kernel and spec->initrd are not used. Ownership as for start: on
 * success the caller reaps vm->pid and calls release; on failure nothing
 * runs and *errmsg (heap) says why. The guest clock and RNG reset stay
 * vmd's job, as for QEMU. */
int moat_fc_snapshot_load(const char *binary, const struct moat_vmm_spec *spec,
    const char *state_file, const char *mem_file, bool resume,
    struct moat_vmm *vm, char **errmsg) __attribute__((warn_unused_result));

#endif
