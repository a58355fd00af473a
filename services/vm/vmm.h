/*
 * vmm.h: the one interface between moat-vmd and a virtual machine monitor.
 * A driver (drivers/qemu.c, drivers/firecracker/) is a `const struct
 * moat_vmm_ops` table; the rest of vmd calls only these ops, so the
 * sandbox lifecycle, the guest link and the RPC handlers never learn which
 * VMM runs a sandbox. Every VMM is a child process of vmd: the driver
 * starts it (through the spawner, see spawn.h) and names its pid; vmd's
 * sandbox code supervises that pid (waits, signals, reaps). A driver links
 * only the host utilities (moat_vmhost: spawn.h, extents.h, sync.h,
 * ramdir.h, vmhost.h), never vmd's core. Not for: the guest protocol
 * (guest_link.h), the choice of driver (driver.h) or of accelerator
 * (accel.c).
 */
#ifndef MOAT_VMD_VMM_H
#define MOAT_VMD_VMM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct vmd_jail;

/* What to boot. Every string is borrowed from the caller for the duration
 * of `start`. */
struct moat_vmm_spec {
	const char *sandbox_id; /* "sb-0123456789abcdef", the last part
	                              of dir (a restore in place adds
	                              "-r<8 hex>": unique per VM) */
	const char *dir;        /* the sandbox's own directory */
	const char *kernel;     /* image files */
	const char *initrd;
	const char *rootfs;       /* attached read-only */
	const char *scratch_disk; /* attached read-write */
	uint32_t vcpus;
	uint32_t memory_mib;
	const char *accel;         /* "kvm" or "tcg" */
	const char *extra_cmdline; /* appended to the kernel command line, or
	                              NULL ("moat.test=flood") */
	const char *ram_source;    /* restore: the RAM to copy, when not
	                              <snap_dir>/ram (NULL) */
	const char *ram_ready;     /* restore: a complete copy of the RAM to
	                              rename into place instead of copying
	                              (a template spare), or NULL */
	const char *egress_socket; /* network allowlist: the Unix socket of
	                              the egress virtio-serial port (QEMU
	                              only; egress.h), or NULL: the port
	                              leads nowhere (QEMU adds it always) */
	bool no_egress_port;       /* restore of a snapshot taken without the
	                              port: the VM must not have it */

	/* The console's cap, console.log and console.log.1 together
	 * ([vmd] console-max-kib; 0: the default). */
	uint64_t console_max_bytes;

	/* adopt only: what the state file kept of the VMM's adopt_info
	 * (below), or NULL (a file written before the driver kept any). */
	const char *adopt_info;
};

struct vmd_console;

/* One VMM process. Filled by `start`; the strings are heap memory owned
 * by the struct and freed by `release`. */
/* Where a restore's resume spent its time (ms), filled by a driver that
 * measures it when moat_vmm.timings is set (CreateTimings, issue 18). */
struct moat_vmm_timings {
	double qmp_wait_ms;    /* until the VMM's control socket answered */
	double ram_copy_ms;    /* the RAM copy's own time (overlaps) */
	double ram_wait_ms;    /* resume blocked waiting for the copy */
	double device_load_ms; /* migrate-incoming until loaded */
	double resume_ms;      /* cont */
};

struct moat_vmm {
	pid_t pid;          /* 0 when not started */
	char *agent_socket; /* where connect_agent connects */
	char *console_log;  /* the guest's serial console, a file */
	char *vmm_log;      /* the VMM's own stderr, a file */
	char *ram_file;     /* guest RAM (a file so snapshots can copy
	                              it), removed by release; a restored
	                              VMM has its own (a sparse copy of the
	                              snapshot's); NULL when the driver
	                              keeps none (then no snapshot) */
	char *qmp_socket;   /* the VMM's control socket */
	void *driver_data;  /* the driver's own, freed by release */

	/* Drains the guest's serial console into console_log (console.h);
	 * closed by release. */
	struct vmd_console *console;
	/* The VMM's jail (jail.h), freed by release; NULL: none. */
	struct vmd_jail *jail;
	/* One line (no newline) the driver needs to adopt this VMM again
	 * and cannot find from the sandbox directory alone (Firecracker:
	 * its slot, whether jailed, its working folder); the state file
	 * keeps it (adopt.h) and adopt gets it back as spec->adopt_info.
	 * Heap, freed by release and detach; NULL: none. */
	char *adopt_info;
	/* Where resume writes its phases (the sandbox's; not owned), or
	 * NULL: not measured. */
	struct moat_vmm_timings *timings;
};

/* What `snapshot` wrote into a snapshot directory, and how long the
 * guest stood still for it. */
struct moat_vmm_snapshot_stats {
	uint64_t device_state_bytes;
	uint64_t ram_bytes; /* allocated bytes copied */
	uint64_t disk_bytes;
	double pause_ms;
};

/* What a driver's configure op (driver.h) may know of the node's own
 * settings ([vmd]); borrowed for the call. */
struct moat_vmm_host {
	const char *kvm_device; /* [vmd] kvm-device: "/dev/kvm" */
	bool test_hooks;        /* [vmd] test-hooks: a test node, where
	                              settings for test doubles are allowed */
};

/* The files of a snapshot directory, named by every driver alike. The
 * RAM may be a symlink to a file elsewhere (tmpfs): whoever deletes a
 * snapshot removes the link's target too. */
#define MOAT_VMM_SNAP_DEVICE_STATE "device_state"
#define MOAT_VMM_SNAP_RAM "ram"
#define MOAT_VMM_SNAP_SCRATCH "scratch.ext4"

struct moat_vmm_ops {
	const char *name; /* "qemu": Node.driver, Sandbox.driver */

	/* probe: is this VMM usable on this host? Sets *version to a heap
	 * string (the VMM's version line; caller frees) on success. On
	 * failure returns a status and sets *errmsg (heap) naming what is
	 * missing and the Debian package that provides it. Called once at
	 * start, from the main thread. */
	int (*probe)(const char *binary, char **version, char **errmsg)
	    __attribute__((warn_unused_result));

	/* start: creates the VMM process for `spec` (the spawner forks it;
	 * it dies with vmd unless the driver can adopt). On success vm->pid and the paths are set and
	 * the caller must eventually reap vm->pid and call release. On
	 * failure nothing is left running, vm is released, and *errmsg
	 * (heap, caller frees) says why. */
	int (*start)(const char *binary, const struct moat_vmm_spec *spec,
	    struct moat_vmm *vm, char **errmsg)
	    __attribute__((warn_unused_result));

	/* connect_agent: one attempt to open the byte stream to the guest
	 * agent. Returns 0 with *fd (caller owns, blocking, CLOEXEC), or
	 * MOAT_UNAVAILABLE while the VMM is not listening yet (the caller
	 * retries), or another status with *errmsg (heap). */
	int (*connect_agent)(const struct moat_vmm *vm, int *fd, char **errmsg)
	    __attribute__((warn_unused_result));

	/* stop: asks the VMM to go: gracefully (SIGTERM: QEMU exits at
	 * once) or, with `force`, SIGKILL. Only signals; the caller reaps.
	 * Must be called only while vm->pid is not yet reaped. */
	void (*stop)(const struct moat_vmm *vm, bool force);

	/* release: after the process was reaped (or never started): removes
	 * the files the driver made outside the sandbox directory (the RAM
	 * file) and frees vm's strings. Safe on a zeroed vm; idempotent. */
	void (*release)(struct moat_vmm *vm);

	/* reap_orphan: a sandbox directory `dir` (of sandbox `id`) left by a
	 * vmd that died: kills its VMM if that process still runs from this
	 * directory, waits for it to go, and removes the driver's files
	 * outside `dir`. Returns true when a live process was killed. The
	 * caller removes `dir`. */
	bool (*reap_orphan)(const char *dir, const char *id);

	/* adopt: a VMM that an earlier vmd started for spec->dir (the
	 * sandbox's directory; spec->console_max_bytes also read) and
	 * that should still run as `pid` in jail uid `jail_uid` (0: none):
	 * checks that pid is that VMM and that it answers, then fills vm as
	 * start would have (paths, console drained again, jail). The process
	 * is not vmd's child: the caller watches it by pidfd. On failure vm
	 * is zeroed, nothing of the VMM is touched, and *errmsg (heap) says
	 * why. NULL: this driver's VMMs die with vmd (reap_orphan). */
	int (*adopt)(const struct moat_vmm_spec *spec, pid_t pid,
	    uid_t jail_uid, struct moat_vmm *vm, char **errmsg)
	    __attribute__((warn_unused_result));

	/* detach: frees what vm holds in vmd (strings, console thread,
	 * jail object) but leaves the VMM running with its files, RAM and
	 * cgroup, for the next vmd to adopt. NULL with adopt. */
	void (*detach)(struct moat_vmm *vm);

	/* snapshot: pauses the running VMM `vm`, writes its device state,
	 * a copy of guest RAM and a copy of `scratch_disk` (flushed first)
	 * into the existing empty directory `snap_dir` (named per
	 * MOAT_VMM_SNAP_*), and resumes it. The guest runs on whatever
	 * happens, but for `leave_paused` and a snapshot that worked: then
	 * it stays paused until `unpause` (a drain's move, issue 15). Returns 0 with *st, or a status with *errmsg (heap);
	 * on failure the caller removes snap_dir. NULL: not supported.
	 * Blocks up to `timeout_ms`; the caller serialises snapshots of one
	 * VMM. */
	int (*snapshot)(const struct moat_vmm *vm, const char *scratch_disk,
	    const char *snap_dir, uint32_t timeout_ms, bool leave_paused,
	    struct moat_vmm_snapshot_stats *st, char **errmsg)
	    __attribute__((warn_unused_result));

	/* unpause: lets a VM that `snapshot` left paused run again, before
	 * `timeout_ms`. Returns 0 or a status with *errmsg (heap). */
	int (*unpause)(const struct moat_vmm *vm, uint32_t timeout_ms,
	    char **errmsg) __attribute__((warn_unused_result));

	/* restore: like start, but the new VMM takes its RAM (the QEMU
	 * driver: a sparse copy of the snapshot's file, the clone's own, so
	 * a clone can be snapshotted in turn) and its device state from
	 * `snap_dir` and stays paused until `resume`. The RAM file is named
	 * after spec->dir's last component, so two VMs of one sandbox id
	 * (a restore in place) never share it.
	 * spec->scratch_disk is the clone's own copy of the snapshot's
	 * disk; kernel, initrd and rootfs must be the snapshot's. Same
	 * ownership and failure rules as start. */
	int (*restore)(const char *binary, const struct moat_vmm_spec *spec,
	    const char *snap_dir, struct moat_vmm *vm, char **errmsg)
	    __attribute__((warn_unused_result));

	/* resume: loads the device state into a VMM made by `restore` and
	 * lets the guest run, before `timeout_ms`. The agent socket should
	 * be connected first so the guest never sees its host missing.
	 * Returns 0 or a status with *errmsg (heap). */
	int (*resume)(const struct moat_vmm *vm, const char *snap_dir,
	    uint32_t timeout_ms, char **errmsg)
	    __attribute__((warn_unused_result));

	/* snapshot_resets_agent_link: a snapshot closes the agent's stream
	 * once the guest runs again (Firecracker resets its vsock device
	 * when it snapshots; the guest's listener survives), so after each
	 * snapshot vmd connects a new one (after a leave_paused one: at
	 * unpause, once the guest runs); the agent greets it with a new
	 * AgentReady. */
	bool snapshot_resets_agent_link;
};

extern const struct moat_vmm_ops moat_vmm_qemu;

#endif
