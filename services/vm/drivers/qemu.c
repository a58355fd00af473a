/*
 * qemu.c: the QEMU driver (`moat_vmm_qemu`): one qemu-system-x86_64
 * process per sandbox with the microvm machine, guest RAM in a shared file
 * in the RAM dir (ramdir.c: /dev/shm, or XFS with reflinks; so snapshots
 * can capture and clones can map it), the
 * image's root filesystem read-only and the scratch disk read-write as
 * virtio-blk, the agent on a virtio-serial port bridged to a Unix socket
 * in the sandbox directory, QMP on another, and the serial console in a
 * named pipe vmd drains into a capped file (console.h). Every socket is
 * QEMU's (server side) and the console a named pipe, so a VMM outlives
 * its vmd and a new vmd re-adopts it (qemu_adopt). Not for: supervising the process (sandbox.c) or deciding the
 * accelerator (accel.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "../console.h"
#include "../extents.h"
#include "../jail.h"
#include "../ramdir.h"
#include "../spawn.h"
#include "../sync.h"
#include "../vmhost.h"
#include "../vmm.h"
#include "qmp.h"

#define QEMU_MAX_ARGS 96
#define QEMU_AGENT_PORT "org.moat.agent"
#define QEMU_CONSOLE_FIFO "console.fifo"
/* How long an adoption waits for QMP to answer. */
#define QEMU_ADOPT_QMP_MS 5000

/* The kernel command line every sandbox gets; keys per guest/agent/boot.h
 * and images/README.md. */
/* pci=off, cryptomgr.notests, 8250.nr_uarts=1 save ~0.4 s of guest boot
 * under TCG (microvm has no PCI); init_on_alloc=0 makes python's first
 * run ~0.4 s faster and only drops hardening inside the guest kernel, not
 * at the VM boundary. The kernel is the uncompressed vmlinux: a bzImage
 * spends 3-4 s of TCG time decompressing itself. */
#define QEMU_CMDLINE                                                          \
	"console=ttyS0 reboot=t panic=-1 quiet pci=off "                      \
	"cryptomgr.notests 8250.nr_uarts=1 init_on_alloc=0 "                  \
	"moat.root=LABEL=moat-root moat.scratch=LABEL=moat-scratch "          \
	"moat.port=" QEMU_AGENT_PORT

/* Under TCG the guest's TSC runs at the host's TSC rate, but the guest
 * kernel calibrates it against the emulated PIT, and on a loaded host that
 * calibration fails ("Unable to calibrate against PIT") and the boot hangs
 * after "Marking TSC unstable" (seen here with 3 boots in parallel on 2
 * busy cores: 3 of 3 hung; with tsc_early_khz, 6 of 6 booted). So vmd
 * measures the host TSC once and tells the guest (tsc_early_khz=);
 * tsc=reliable keeps the guest's watchdog from distrusting it under load
 * and no_timer_check skips the IO-APIC timer test that load can fail.
 * Set by probe; 0 when it could not be measured (then nothing is added). */
static uint32_t qemu_host_tsc_khz;
#define QEMU_TCG_CMDLINE "tsc=reliable no_timer_check"

/* TCG's translated-code buffer (MiB): QEMU's default is 1 GiB, which a
 * long-running guest fills and a VMM's cgroup would have to allow. The
 * jail's memory limit adds twice this under TCG (the buffer and TCG's
 * own tables). */
#define QEMU_TCG_TB_MIB "128"
#define QEMU_TCG_EXTRA_MIB 256u

/* The host TSC rate in kHz: ticks over ~50 ms of CLOCK_MONOTONIC_RAW,
 * best of three (a preempted sample only reads slower or faster by the
 * preemption, so take the median). */
static uint32_t
measure_tsc_khz(void)
{
	uint64_t khz[3];

	for (int i = 0; i < 3; i++) {
		struct timespec a, b;
		struct timespec nap = { 0, 50 * 1000 * 1000 };
		uint64_t t0, t1, ns;

		clock_gettime(CLOCK_MONOTONIC_RAW, &a);
		t0 = __rdtsc();
		nanosleep(&nap, NULL);
		clock_gettime(CLOCK_MONOTONIC_RAW, &b);
		t1 = __rdtsc();
		ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u +
		    (uint64_t)b.tv_nsec - (uint64_t)a.tv_nsec;
		if (ns == 0 || t1 <= t0)
			return 0;
		khz[i] = (t1 - t0) * 1000000u / ns;
	}
	/* median of three */
	if ((khz[0] <= khz[1] && khz[1] <= khz[2]) ||
	    (khz[2] <= khz[1] && khz[1] <= khz[0]))
		return (uint32_t)khz[1];
	if ((khz[1] <= khz[0] && khz[0] <= khz[2]) ||
	    (khz[2] <= khz[0] && khz[0] <= khz[1]))
		return (uint32_t)khz[0];
	return (uint32_t)khz[2];
}

/* Heap strings collected for one argv; freed together. */
struct qemu_argv {
	char *arg[QEMU_MAX_ARGS + 1];
	int n;
	bool oom;
};

static void
argv_add(struct qemu_argv *a, char *s)
{
	if (s == NULL || a->n >= QEMU_MAX_ARGS) {
		free(s);
		a->oom = true;
		return;
	}
	a->arg[a->n++] = s;
	a->arg[a->n] = NULL;
}

static void
argv_fini(struct qemu_argv *a)
{
	for (int i = 0; i < a->n; i++)
		free(a->arg[i]);
	a->n = 0;
}

/* The last component of a directory path (borrowed). */
static const char *
dir_base(const char *dir)
{
	const char *slash = strrchr(dir, '/');

	return slash ? slash + 1 : dir;
}

/* QEMU splits option values at commas; a path with one would be
 * misread, so such paths are refused instead of escaped. */
static bool
path_ok(const char *p)
{
	return p != NULL && strchr(p, ',') == NULL;
}

/* QEMU's own seccomp filter, given to every VMM (jail.h):
 * -sandbox with the obsolete, privilege, spawn and resource calls
 * denied. */
#define QEMU_SANDBOX                                                          \
	"on,obsolete=deny,elevateprivileges=deny,spawn=deny,"                 \
	"resourcecontrol=deny"

/* A QEMU built without seccomp refuses -sandbox: the jail then lacks it
 * (vmd_jail_missing_add). `binary` has no single quote (checked by
 * vmd_version_line). */
static void
qemu_probe_sandbox(const char *binary)
{
	char *cmd = moat_asprintf("'%s' -sandbox " QEMU_SANDBOX
	                          " -version >/dev/null 2>&1",
	    binary);

	if (cmd != NULL && system(cmd) != 0)
		vmd_jail_missing_add("qemu -sandbox (this QEMU was built "
		                     "without seccomp)");
	free(cmd);
}

static int
qemu_probe(const char *binary, char **version, char **errmsg)
{
	char line[256];
	int rv;

	*version = NULL;
	rv = vmd_version_line(binary, "qemu", "QEMU emulator", line,
	    sizeof(line), errmsg);
	if (rv == MOAT_FAILED_PRECONDITION)
		*errmsg = moat_asprintf(
		    "%s is not installed or does not run: "
		    "install the Debian package qemu-system-x86 (apt-get "
		    "install qemu-system-x86) or set [vmd] qemu= to its path",
		    binary);
	if (rv != MOAT_OK)
		return rv;
	qemu_probe_sandbox(binary);
	qemu_host_tsc_khz = measure_tsc_khz();
	moat_info(0, "qemu: host TSC %u kHz (given to TCG guests)",
	    qemu_host_tsc_khz);
	*version = strdup(line);
	return *version ? MOAT_OK : MOAT_INTERNAL;
}

/* A restore's RAM copy, made while QEMU starts (QEMU does not touch
 * guest RAM while it waits for an incoming migration), and joined before
 * the device state loads. */
struct qemu_ram_copy {
	pthread_t thread;
	bool joined;
	int in, out; /* the snapshot's RAM, the VM's */
	int err;     /* errno of the copy */
	uint64_t bytes;
	double ms;
	char *what; /* "<src> to <dst>", heap */
};

static void *
ram_copy_main(void *arg)
{
	struct qemu_ram_copy *rc = arg;
	double t0 = vmd_now_ms_exact();

	rc->err = vmd_copy_extents(rc->in, rc->out, &rc->bytes);
	rc->ms = vmd_now_ms_exact() - t0;
	return NULL;
}

/* Waits for the RAM copy; returns its errno (0: done). Idempotent. */
static int
ram_copy_join(struct qemu_ram_copy *rc)
{
	if (rc == NULL)
		return 0;
	if (!rc->joined) {
		pthread_join(rc->thread, NULL);
		rc->joined = true;
		close(rc->in);
		close(rc->out);
		moat_debug(0, "restore: RAM copy %s: %.1f ms, %llu B%s%s",
		    rc->what ? rc->what : "?", rc->ms,
		    (unsigned long long)rc->bytes, rc->err ? ": " : "",
		    rc->err ? strerror(rc->err) : "");
	}
	return rc->err;
}

/* Starts copying snapshot RAM `src` into the new file `dst` (same size,
 * holes kept). Returns 0 with *out (release frees it) or an errno. */
static int
ram_copy_start(const char *src, const char *dst, struct qemu_ram_copy **out)
{
	struct qemu_ram_copy *rc = calloc(1, sizeof(*rc));
	struct stat st;
	int err;

	*out = NULL;
	if (rc == NULL)
		return ENOMEM;
	rc->in = rc->out = -1;
	rc->what = moat_asprintf("%s to %s", src, dst);
	if ((rc->in = open(src, O_RDONLY | O_CLOEXEC)) < 0 ||
	    fstat(rc->in, &st) != 0 ||
	    (rc->out = open(dst, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
	         0600)) < 0 ||
	    ftruncate(rc->out, st.st_size) != 0) {
		err = errno;
		goto fail;
	}
	if ((err = vmd_thread_create(&rc->thread, ram_copy_main, rc)) != 0)
		goto fail;
	*out = rc;
	return 0;
fail:
	if (rc->in >= 0)
		close(rc->in);
	if (rc->out >= 0) {
		close(rc->out);
		(void)unlink(dst);
	}
	free(rc->what);
	free(rc);
	return err;
}

static void
qemu_release(struct moat_vmm *vm)
{
	struct qemu_ram_copy *rc = vm->driver_data;

	if (rc != NULL) {
		(void)ram_copy_join(rc);
		free(rc->what);
		free(rc);
		vm->driver_data = NULL;
	}
	if (vm->ram_file != NULL)
		(void)vmd_ram_unlink(vm->ram_file);
	vmd_console_close(vm->console);
	vm->console = NULL;
	vmd_jail_free(vm->jail);
	vm->jail = NULL;
	free(vm->agent_socket);
	free(vm->console_log);
	free(vm->vmm_log);
	free(vm->ram_file);
	free(vm->qmp_socket);
	vm->agent_socket = vm->console_log = vm->vmm_log = NULL;
	vm->ram_file = vm->qmp_socket = NULL;
	vm->pid = 0;
}

/* Refuses paths QEMU's option syntax or a Unix socket cannot take, with
 * a message saying what to move. */
static int
qemu_check_paths(const struct moat_vmm_spec *spec, const char *snap_dir,
    const struct moat_vmm *vm, char **errmsg)
{
	if (!path_ok(spec->dir) || !path_ok(spec->kernel) ||
	    !path_ok(spec->initrd) || !path_ok(spec->rootfs) ||
	    !path_ok(spec->scratch_disk) ||
	    (snap_dir != NULL && !path_ok(snap_dir))) {
		*errmsg = moat_asprintf(
		    "a path for sandbox %s has a comma in "
		    "it, which QEMU cannot take: move the state or image "
		    "directory",
		    spec->sandbox_id);
		return MOAT_FAILED_PRECONDITION;
	}
	if (strlen(vm->agent_socket) >=
	    sizeof(((struct sockaddr_un *)0)->sun_path)) {
		*errmsg =
		    moat_asprintf("socket path %s is too long for a Unix "
		                  "socket: use a shorter state directory",
		        vm->agent_socket);
		return MOAT_FAILED_PRECONDITION;
	}
	return MOAT_OK;
}

/* Gives a restored VM its own RAM file vm->ram_file: a template spare
 * when one is ready, else a copy of `snap_ram` started in the
 * background. A boot (snap_dir NULL) gets a new empty one (0600). */
static int
qemu_prepare_ram(const struct moat_vmm_spec *spec, const char *snap_dir,
    const char *snap_ram, const char *ram_base, struct moat_vmm *vm,
    char **errmsg)
{
	int err;

	/* A RAM file left by an earlier boot attempt must not be reused. */
	(void)unlink(vm->ram_file);
	if (ram_base != NULL) {
		/* A private mapping of the snapshot's RAM: no file of its
		 * own (qemu_ram_backing). */
		moat_debug(0, "restore: RAM %s mapped privately", ram_base);
	} else if (snap_dir != NULL && spec->ram_ready != NULL &&
	    rename(spec->ram_ready, vm->ram_file) == 0) {
		/* A template spare: already a complete copy, now ours. */
		moat_debug(0, "restore: RAM %s taken as %s", spec->ram_ready,
		    vm->ram_file);
	} else if (snap_dir != NULL) {
		/* The clone's own RAM: a copy of the snapshot's allocated
		 * extents (holes stay holes), mapped shared like a booted
		 * VM's, so a clone snapshots like any sandbox. It is made
		 * while QEMU starts; resume waits for it. */
		err = ram_copy_start(snap_ram, vm->ram_file,
		    (struct qemu_ram_copy **)&vm->driver_data);

		if (err != 0) {
			*errmsg = moat_asprintf("cannot copy the snapshot's "
			                        "RAM %s to %s: %s",
			    snap_ram, vm->ram_file, strerror(err));
			return moat_status_from_errno(err);
		}
	} else if ((err = vmd_ram_create(vm->ram_file)) != 0) {
		/* A boot: QEMU opens the file made here (0600). */
		*errmsg = moat_asprintf("cannot create the guest RAM file "
		                        "%s: %s",
		    vm->ram_file, strerror(err));
		return moat_status_from_errno(err);
	}
	return MOAT_OK;
}

/* Puts the VMM of `spec` in a jail of its own (jail.h): vm->jail. */
static int
qemu_jail(const char *binary, const struct moat_vmm_spec *spec,
    const char *ram_base, struct moat_vmm *vm, bool kvm, char **errmsg)
{
	/* A private mapping's RAM file and the library that opens it
	 * read-only (ramdir.h) are read-only; a VM's own RAM file is
	 * read-write. */
	struct vmd_jail_spec js = {
		.name = dir_base(spec->dir),
		.dir = spec->dir,
		.binary = binary,
		.ro_files = { spec->kernel, spec->initrd, spec->rootfs,
		    ram_base, ram_base ? vmd_ram_preload() : NULL, NULL },
		.rw_files = { ram_base ? spec->scratch_disk : vm->ram_file,
		    ram_base ? vm->console_log : spec->scratch_disk,
		    ram_base ? NULL : vm->console_log, NULL },
		.kvm = kvm,
		.vcpus = spec->vcpus,
		.memory_mib = spec->memory_mib,
		.extra_mib = kvm ? 0 : QEMU_TCG_EXTRA_MIB,
	};
	/* Made here, root's: one a jailed QEMU made itself it could later
	 * swap for a symlink (jail.h). */
	int fd = open(vm->console_log,
	    O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd >= 0)
		close(fd);
	return vmd_jail_make(&js, &vm->jail, errmsg);
}

/* A VMM in its own pid namespace writes its pid there (1) to -pidfile:
 * vmd writes the host's instead, for reap_orphan. */
static void
qemu_write_pidfile(const char *pidfile, pid_t pid)
{
	char text[32];
	int n = snprintf(text, sizeof(text), "%d\n", (int)pid);
	int err = moat_write_file_atomic(pidfile, text, (size_t)n, 0600);

	if (err != 0)
		moat_warn(0, "cannot write %s: %s", pidfile, strerror(err));
}

/* The RAM backing of a VM, the one place that chooses it ([vmd]
 * ram-sharing, ramdir.h). A boot, or a restore with ram-sharing = copy,
 * maps the VM's own RAM file shared (vm->ram_file: snapshots capture it
 * with x-ignore-shared); a restore with ram-sharing = private maps the
 * snapshot's RAM file `ram_base` privately (share=off), so the pages a
 * clone has not written stay one copy in the page cache for all clones
 * and the file never changes (QEMU opens it read-only through
 * drivers/ramro). *ram_base (heap) is NULL for the former. */
static int
qemu_ram_backing(const char *snap_dir, const char *snap_ram, char **ram_base,
    char **errmsg)
{
	*ram_base = NULL;
	if (snap_dir == NULL || !vmd_ram_private())
		return MOAT_OK;
	if ((*ram_base = realpath(snap_ram, NULL)) == NULL) {
		int err = errno;

		*errmsg =
		    moat_asprintf("cannot find the snapshot's RAM %s: %s",
		        snap_ram, strerror(err));
		return moat_status_from_errno(err);
	}
	if (!path_ok(*ram_base)) {
		*errmsg = moat_asprintf("the snapshot's RAM %s has a comma in "
		                        "its path, which QEMU cannot take: "
		                        "move the RAM dir",
		    *ram_base);
		free(*ram_base);
		*ram_base = NULL;
		return MOAT_FAILED_PRECONDITION;
	}
	return MOAT_OK;
}

/* The -object of the guest RAM (qemu_ram_backing). Heap. */
static char *
qemu_ram_object(const struct moat_vmm_spec *spec, const struct moat_vmm *vm,
    const char *ram_base)
{
	return moat_asprintf("memory-backend-file,id=ram,size=%uM,"
	                     "mem-path=%s,share=%s",
	    spec->memory_mib, ram_base ? ram_base : vm->ram_file,
	    ram_base ? "off" : "on");
}

/* The environment of a VMM that maps `ram_base` privately: vmd's, with
 * the library that opens that file read-only (drivers/ramro/ramro.c).
 * NULL-terminated, heap (env_free). */
static char **
qemu_ram_env(const char *ram_base)
{
	extern char **environ;
	size_t n = 0, k = 0;
	char **env;

	while (environ[n] != NULL)
		n++;
	if ((env = calloc(n + 3, sizeof(*env))) == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (strncmp(environ[i], "LD_PRELOAD=", 11) == 0 ||
		    strncmp(environ[i], "MOAT_RAM_RO=", 12) == 0)
			continue;
		env[k++] = environ[i];
	}
	/* Only these two are the array's own (freed by env_free). */
	env[k] = moat_asprintf("LD_PRELOAD=%s", vmd_ram_preload());
	env[k + 1] = moat_asprintf("MOAT_RAM_RO=%s", ram_base);
	if (env[k] == NULL || env[k + 1] == NULL) {
		free(env[k]);
		free(env[k + 1]);
		free(env);
		return NULL;
	}
	return env;
}

static void
env_free(char **env)
{
	size_t n = 0;

	if (env == NULL)
		return;
	while (env[n] != NULL)
		n++;
	/* The last two are qemu_ram_env's own. */
	if (n >= 2) {
		free(env[n - 1]);
		free(env[n - 2]);
	}
	free(env);
}

/* Adds the machine, CPU, memory, console and kernel arguments. */
static void
qemu_argv_machine(struct qemu_argv *a, const char *binary,
    const struct moat_vmm_spec *spec, const struct moat_vmm *vm,
    const char *ram_base, bool kvm, int console_fd)
{
	char *tcg_cmdline;

	argv_add(a, strdup(binary));
	argv_add(a, strdup("-M"));
	argv_add(a,
	    strdup("microvm,x-option-roms=off,rtc=on,"
	           "memory-backend=ram"));
	argv_add(a, strdup("-accel"));
	argv_add(a, strdup(kvm ? "kvm" : "tcg,tb-size=" QEMU_TCG_TB_MIB));
	argv_add(a, strdup("-cpu"));
	argv_add(a, strdup(kvm ? "host" : "max"));
	argv_add(a, strdup("-smp"));
	argv_add(a, moat_asprintf("%u", spec->vcpus));
	argv_add(a, strdup("-m"));
	argv_add(a, moat_asprintf("%u", spec->memory_mib));
	argv_add(a, strdup("-object"));
	argv_add(a, qemu_ram_object(spec, vm, ram_base));
	argv_add(a, strdup("-no-reboot"));
	argv_add(a, strdup("-nodefaults"));
	argv_add(a, strdup("-no-user-config"));
	argv_add(a, strdup("-display"));
	argv_add(a, strdup("none"));
	/* The serial console goes into a pipe that vmd drains into a
	 * capped console.log (console.h): QEMU gets the pipe as an fd set
	 * (append=on: a pipe cannot be truncated). */
	argv_add(a, strdup("-add-fd"));
	argv_add(a, moat_asprintf("fd=%d,set=%d", console_fd, console_fd));
	argv_add(a, strdup("-chardev"));
	argv_add(a,
	    moat_asprintf("file,id=console,path=/dev/fdset/%d,append=on",
	        console_fd));
	argv_add(a, strdup("-serial"));
	argv_add(a, strdup("chardev:console"));
	argv_add(a, strdup("-kernel"));
	argv_add(a, strdup(spec->kernel));
	argv_add(a, strdup("-initrd"));
	argv_add(a, strdup(spec->initrd));
	argv_add(a, strdup("-append"));
	if (!kvm && qemu_host_tsc_khz > 0)
		tcg_cmdline =
		    moat_asprintf(" tsc_early_khz=%u " QEMU_TCG_CMDLINE,
		        qemu_host_tsc_khz);
	else
		tcg_cmdline = strdup(kvm ? "" : " " QEMU_TCG_CMDLINE);
	argv_add(a,
	    moat_asprintf("%s%s%s%s", QEMU_CMDLINE,
	        tcg_cmdline ? tcg_cmdline : "", spec->extra_cmdline ? " " : "",
	        spec->extra_cmdline ? spec->extra_cmdline : ""));
	free(tcg_cmdline);
}

/* Adds the disks, the agent's serial port, QMP, the pidfile and, for a
 * restore, the paused incoming migration. */
static void
qemu_argv_devices(struct qemu_argv *a, const struct moat_vmm_spec *spec,
    const char *snap_dir, const struct moat_vmm *vm, const char *qmp,
    const char *pidfile)
{
	argv_add(a, strdup("-drive"));
	argv_add(a,
	    moat_asprintf("id=root,file=%s,format=raw,if=none,"
	                  "readonly=on",
	        spec->rootfs));
	argv_add(a, strdup("-device"));
	argv_add(a, strdup("virtio-blk-device,drive=root"));
	argv_add(a, strdup("-drive"));
	argv_add(a,
	    moat_asprintf("id=scratch,file=%s,format=raw,if=none",
	        spec->scratch_disk));
	argv_add(a, strdup("-device"));
	argv_add(a, strdup("virtio-blk-device,drive=scratch"));
	argv_add(a, strdup("-device"));
	argv_add(a, strdup("virtio-serial-device"));
	argv_add(a, strdup("-chardev"));
	argv_add(a,
	    moat_asprintf("socket,id=agent,path=%s,server=on,"
	                  "wait=off",
	        vm->agent_socket));
	argv_add(a, strdup("-device"));
	argv_add(a,
	    strdup("virtserialport,chardev=agent,name=" QEMU_AGENT_PORT));
	/* Guest egress (issue 14): a second port for the tunnel to vmd's
	 * proxy (services/vm/egress.h); no guest NIC. Every VM has it, so
	 * every snapshot can be restored with or without egress: a sandbox
	 * with network "none" gets a null chardev (nothing behind it). A
	 * snapshot taken before then restores only without it. */
	if (spec->no_egress_port)
		goto qmp;
	argv_add(a, strdup("-chardev"));
	if (spec->egress_socket != NULL) {
		(void)unlink(spec->egress_socket);
		argv_add(a,
		    moat_asprintf("socket,id=egress,path=%s,server=on,"
		                  "wait=off",
		        spec->egress_socket));
	} else {
		argv_add(a, strdup("null,id=egress"));
	}
	argv_add(a, strdup("-device"));
	argv_add(a,
	    strdup("virtserialport,chardev=egress,name=org.moat.egress"));
qmp:
	argv_add(a, strdup("-qmp"));
	argv_add(a, moat_asprintf("unix:%s,server=on,wait=off", qmp));
	if (pidfile != NULL) {
		argv_add(a, strdup("-pidfile"));
		argv_add(a, strdup(pidfile));
	}
	if (vmd_jail_seccomp()) {
		argv_add(a, strdup("-sandbox"));
		argv_add(a, strdup(QEMU_SANDBOX));
	}
	if (snap_dir != NULL) {
		/* Paused, the device state loaded by resume (x-ignore-shared
		 * must be set before the stream is read, so not at once). */
		argv_add(a, strdup("-S"));
		argv_add(a, strdup("-incoming"));
		argv_add(a, strdup("defer"));
	}
}

/* Starts a VMM for `spec`: booting when `snap_dir` is NULL, else paused
 * and waiting for the device state of the snapshot in snap_dir (with a
 * sparse copy of its RAM file as the VM's own). See start and restore in
 * vmm.h. */
static int
qemu_launch(const char *binary, const struct moat_vmm_spec *spec,
    const char *snap_dir, struct moat_vmm *vm, char **errmsg)
{
	struct qemu_argv a = { 0 };
	struct moat_spawn_req req = { 0 };
	bool kvm = strcmp(spec->accel, "kvm") == 0;
	int console_fd = -1;
	char *qmp = NULL;
	char *pidfile = NULL;
	char *snap_ram = NULL;
	char *ram_base = NULL;
	char **env = NULL;
	char *console_fifo;
	bool jailed_pid;
	int rv;

	*errmsg = NULL;
	memset(vm, 0, sizeof(*vm));
	vm->agent_socket = moat_asprintf("%s/agent.sock", spec->dir);
	vm->console_log = moat_asprintf("%s/console.log", spec->dir);
	vm->vmm_log = moat_asprintf("%s/qemu.log", spec->dir);
	/* Named after the directory, not the id: a restore in place runs
	 * next to the VM it replaces, under the same sandbox id. */
	vm->ram_file = vmd_ram_sandbox_path(dir_base(spec->dir));
	if (snap_dir != NULL)
		snap_ram = spec->ram_source ?
		    strdup(spec->ram_source) :
		    moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, snap_dir);
	vm->qmp_socket = moat_asprintf("%s/qmp.sock", spec->dir);
	qmp = moat_asprintf("%s/qmp.sock", spec->dir);
	pidfile = moat_asprintf("%s/qemu.pid", spec->dir);
	if (!vm->agent_socket || !vm->console_log || !vm->vmm_log ||
	    !vm->ram_file || (snap_dir != NULL && !snap_ram) ||
	    !vm->qmp_socket || !qmp || !pidfile) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if ((rv = qemu_check_paths(spec, snap_dir, vm, errmsg)) != MOAT_OK ||
	    (rv = qemu_ram_backing(snap_dir, snap_ram, &ram_base, errmsg)) !=
	        MOAT_OK ||
	    (rv = qemu_prepare_ram(spec, snap_dir, snap_ram, ram_base, vm,
	         errmsg)) != MOAT_OK ||
	    (rv = qemu_jail(binary, spec, ram_base, vm, kvm, errmsg)) !=
	        MOAT_OK)
		goto fail;
	if (ram_base != NULL && (env = qemu_ram_env(ram_base)) == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	(void)unlink(vm->agent_socket);
	(void)unlink(qmp);
	/* A named pipe, so a restarted vmd drains the same console. */
	if ((console_fifo = moat_asprintf("%s/" QEMU_CONSOLE_FIFO,
	         spec->dir)) == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	rv = vmd_console_open_fifo(vm->console_log, console_fifo,
	    spec->console_max_bytes, &vm->console, &console_fd, errmsg);
	free(console_fifo);
	if (rv != MOAT_OK)
		goto fail;
	(void)unlink(pidfile);
	jailed_pid = vm->jail != NULL && vmd_jail_plan(vm->jail)->staging;

	qemu_argv_machine(&a, binary, spec, vm, ram_base, kvm, console_fd);
	qemu_argv_devices(&a, spec, snap_dir, vm, qmp,
	    jailed_pid ? NULL : pidfile);
	if (a.oom) {
		*errmsg = strdup("out of memory building the qemu command");
		rv = MOAT_INTERNAL;
		goto fail;
	}

	req.argv = (const char *const *)a.arg;
	req.output_file = vm->vmm_log;
	req.keep_fd = console_fd;
	req.cwd = spec->dir;
	/* RAM on a block-backed filesystem (reflinks): no huge-page advice,
	 * or each fault reads and dirties 2 MiB of the RAM file (spawn.h).
	 * On tmpfs the advice is the operator's shmem THP policy: kept. */
	req.no_hugepage_advice = vmd_ram_dir_reflinks();
	req.jail = vmd_jail_plan(vm->jail);
	req.outlive_vmd = true; /* a restarted vmd re-adopts it */
	req.env = (const char *const *)env;
	rv = moat_spawn(&req, &vm->pid, errmsg);
	close(console_fd); /* QEMU holds its own */
	console_fd = -1;
	if (rv != MOAT_OK)
		goto fail;
	if (jailed_pid)
		qemu_write_pidfile(pidfile, vm->pid);
	argv_fini(&a);
	free(qmp);
	free(pidfile);
	free(snap_ram);
	free(ram_base);
	env_free(env);
	return MOAT_OK;
fail:
	if (console_fd >= 0)
		close(console_fd);
	argv_fini(&a);
	free(qmp);
	free(pidfile);
	free(snap_ram);
	free(ram_base);
	env_free(env);
	qemu_release(vm);
	return rv;
}

static int
qemu_start(const char *binary, const struct moat_vmm_spec *spec,
    struct moat_vmm *vm, char **errmsg)
{
	return qemu_launch(binary, spec, NULL, vm, errmsg);
}

static int
qemu_restore(const char *binary, const struct moat_vmm_spec *spec,
    const char *snap_dir, struct moat_vmm *vm, char **errmsg)
{
	return qemu_launch(binary, spec, snap_dir, vm, errmsg);
}

/* A jailed VMM may write its sandbox directory: before vmd connects to
 * a socket there, the path must be a socket its VMM made (not a symlink
 * to another sandbox's), and vmd connects to that very inode (through
 * /proc/self/fd, so it cannot be swapped in between). Returns 0 with
 * *pfd (close after connecting) and `via`, MOAT_UNAVAILABLE while it is
 * not there yet, or a status with *errmsg. */
static int
qemu_sock_check(const struct moat_vmm *vm, const char *path, int *pfd,
    char via[32], char **errmsg)
{
	uid_t want = vmd_jail_uid(vm->jail);
	struct stat st;
	int fd;

	*pfd = -1;
	if ((fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return errno == ENOENT ? MOAT_UNAVAILABLE :
		                         moat_status_from_errno(errno);
	if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
	    (want != 0 && st.st_uid != want)) {
		close(fd);
		*errmsg = moat_asprintf("%s is not a socket its VMM made: "
		                        "refusing to connect",
		    path);
		return MOAT_FAILED_PRECONDITION;
	}
	snprintf(via, 32, "/proc/self/fd/%d", fd);
	*pfd = fd;
	return MOAT_OK;
}

static int
qemu_qmp_open(const struct moat_vmm *vm, struct qmp *q, uint64_t deadline,
    char **errmsg)
{
	char via[32];
	int pfd, rv;

	if ((rv = qemu_sock_check(vm, vm->qmp_socket, &pfd, via, errmsg)) !=
	    MOAT_OK)
		return rv;
	rv = qmp_open(q, via, deadline, errmsg);
	close(pfd);
	return rv;
}

/* The agent's virtio-serial port is bridged to a plain Unix socket. */
static int
qemu_connect_agent(const struct moat_vmm *vm, int *fd, char **errmsg)
{
	char via[32];
	int pfd, rv;

	if ((rv = qemu_sock_check(vm, vm->agent_socket, &pfd, via, errmsg)) !=
	    MOAT_OK)
		return rv;
	rv = vmd_unix_connect(via, fd, errmsg);
	close(pfd);
	return rv;
}

static void
qemu_detach(struct moat_vmm *vm)
{
	struct qemu_ram_copy *rc = vm->driver_data;

	if (rc != NULL) {
		(void)ram_copy_join(rc);
		free(rc->what);
		free(rc);
		vm->driver_data = NULL;
	}
	vmd_console_close(vm->console);
	vm->console = NULL;
	vmd_jail_detach(vm->jail);
	vm->jail = NULL;
	free(vm->agent_socket);
	free(vm->console_log);
	free(vm->vmm_log);
	free(vm->ram_file);
	free(vm->qmp_socket);
	vm->agent_socket = vm->console_log = vm->vmm_log = NULL;
	vm->ram_file = vm->qmp_socket = NULL;
	vm->pid = 0;
}

static bool
qemu_reap_orphan(const char *dir, const char *id)
{
	char *pidfile = moat_asprintf("%s/qemu.pid", dir);
	char *ram = vmd_ram_sandbox_path(id);
	/* QEMU's options name files in the sandbox directory: a process
	 * whose command line mentions dir is that sandbox's VMM. */
	bool killed = vmd_kill_orphan(pidfile, dir, false);

	vmd_jail_forget(strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir);

	if (ram != NULL)
		(void)vmd_ram_unlink(ram);
	free(ram);
	free(pidfile);
	return killed;
}

/* Asks QMP whether the adopted VMM `vm` runs its guest, and lets a
 * guest that an interrupted snapshot left paused run again. */
static int
qemu_adopt_check(const struct moat_vmm *vm, char **errmsg)
{
	struct qmp q = { .fd = -1 };
	json_t *ret = NULL;
	const char *status;
	int rv;

	if ((rv = qemu_qmp_open(vm, &q, moat_rpc_now_ms() + QEMU_ADOPT_QMP_MS,
	         errmsg)) != MOAT_OK) {
		if (*errmsg == NULL)
			*errmsg = strdup("its QMP socket does not answer");
		return rv == MOAT_UNAVAILABLE ? MOAT_FAILED_PRECONDITION : rv;
	}
	if ((rv = qmp_run(&q, "query-status", NULL, &ret, errmsg)) != MOAT_OK)
		goto out;
	status = json_string_value(json_object_get(ret, "status"));
	if (status != NULL &&
	    (strcmp(status, "paused") == 0 ||
	        strcmp(status, "postmigrate") == 0)) {
		/* A snapshot's pause whose vmd died before it resumed. */
		rv = qmp_run(&q, "cont", NULL, NULL, errmsg);
	} else if (status == NULL || strcmp(status, "running") != 0) {
		*errmsg = moat_asprintf("QMP says the VM is \"%s\", not "
		                        "running",
		    status ? status : "?");
		rv = MOAT_FAILED_PRECONDITION;
	}
out:
	json_decref(ret);
	qmp_close(&q);
	return rv;
}

static int
qemu_adopt(const struct moat_vmm_spec *spec, pid_t pid, uid_t jail_uid,
    struct moat_vmm *vm, char **errmsg)
{
	char *mark = moat_asprintf("%s/", spec->dir);
	char *fifo = moat_asprintf("%s/" QEMU_CONSOLE_FIFO, spec->dir);
	int rv;

	*errmsg = NULL;
	memset(vm, 0, sizeof(*vm));
	vm->agent_socket = moat_asprintf("%s/agent.sock", spec->dir);
	vm->console_log = moat_asprintf("%s/console.log", spec->dir);
	vm->vmm_log = moat_asprintf("%s/qemu.log", spec->dir);
	vm->qmp_socket = moat_asprintf("%s/qmp.sock", spec->dir);
	if (!mark || !fifo || !vm->agent_socket || !vm->console_log ||
	    !vm->vmm_log || !vm->qmp_socket) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	/* The pid must still be this sandbox's QEMU, not a recycled one:
	 * its command line names files in the sandbox directory. */
	if ((rv = vmd_vmm_check_pid(pid, mark, false, errmsg)) != MOAT_OK)
		goto fail;
	vm->pid = pid;
	if ((rv = vmd_jail_adopt(spec->dir, jail_uid, &vm->jail, errmsg)) !=
	        MOAT_OK ||
	    (rv = qemu_adopt_check(vm, errmsg)) != MOAT_OK)
		goto fail;
	if ((vm->ram_file = vmd_ram_sandbox_path(dir_base(spec->dir))) ==
	    NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if ((rv = vmd_console_attach(vm->console_log, fifo,
	         spec->console_max_bytes, &vm->console, errmsg)) != MOAT_OK)
		goto fail;
	free(mark);
	free(fifo);
	return MOAT_OK;
fail:
	free(mark);
	free(fifo);
	/* Nothing of the VMM is undone: the caller decides (it keeps the
	 * RAM file until the VMM is gone). */
	vm->pid = 0;
	free(vm->ram_file);
	vm->ram_file = NULL;
	qemu_detach(vm);
	return rv;
}

/* ---- snapshot and restore ---- */

#define QEMU_MIGRATE_POLL_US 200
#define QEMU_STATE_FD "moat-device-state" /* getfd name */

static int
qmp_set_ignore_shared(struct qmp *q, char **errmsg)
{
	json_t *args = json_pack("{s:[{s:s,s:b}]}", "capabilities",
	    "capability", "x-ignore-shared", "state", 1);
	int rv;

	if (args == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	rv = qmp_run(q, "migrate-set-capabilities", args, NULL, errmsg);
	json_decref(args);
	return rv;
}

/* Polls query-migrate until the outgoing migration ends. */
static int
qmp_wait_migrated(struct qmp *q, char **errmsg)
{
	for (;;) {
		json_t *ret = NULL;
		const char *status;
		int rv;

		if ((rv = qmp_run(q, "query-migrate", NULL, &ret, errmsg)) !=
		    MOAT_OK)
			return rv;
		status = json_string_value(json_object_get(ret, "status"));
		if (status != NULL && strcmp(status, "completed") == 0) {
			json_decref(ret);
			return MOAT_OK;
		}
		if (status != NULL &&
		    (strcmp(status, "failed") == 0 ||
		        strcmp(status, "cancelled") == 0)) {
			const char *why = json_string_value(
			    json_object_get(ret, "error-desc"));

			*errmsg = moat_asprintf("QEMU's migration to the "
			                        "snapshot %s: %s",
			    status,
			    why ? why :
			          "no reason "
			          "given (see qemu.log in the sandbox "
			          "directory)");
			json_decref(ret);
			return MOAT_INTERNAL;
		}
		json_decref(ret);
		if (moat_rpc_now_ms() >= q->deadline_ms) {
			*errmsg = strdup("QEMU did not finish writing the "
			                 "device state in time");
			return MOAT_DEADLINE_EXCEEDED;
		}
		usleep(QEMU_MIGRATE_POLL_US);
	}
}

/* Where a snapshot's RAM copy lives: in the RAM dir next to the guests'
 * RAM files (on tmpfs, copying there while the guest is paused is several
 * times faster than to a disk's page cache; with reflinks it is a clone
 * of the same filesystem's file), named after the snapshot directory, which
 * holds a symlink to it (MOAT_VMM_SNAP_RAM). Heap. */
static char *
snap_ram_path(const char *snap_dir)
{
	const char *base = strrchr(snap_dir, '/');
	char *name = strdup(base ? base + 1 : snap_dir);
	char *path;
	size_t n;

	if (name == NULL)
		return NULL;
	/* A snapshot is written as <id>.tmp and renamed when complete. */
	n = strlen(name);
	if (n > 4 && strcmp(name + n - 4, ".tmp") == 0)
		name[n - 4] = '\0';
	path = moat_asprintf("%s/moat-%s.ram", vmd_ram_dir(), name);
	free(name);
	return path;
}

static uint64_t
file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* ---- snapshots of a VM that maps its snapshot's RAM privately ----
 *
 * Its RAM is the snapshot's file plus the pages it wrote (anonymous
 * copy-on-write pages in QEMU), and QEMU would migrate a private RAM block
 * with the device state. So, in the pause, QEMU saves the device state
 * alone (xen-save-devices-state: every section but RAM, the stream
 * migrate-incoming loads like any snapshot's) and vmd writes the RAM file
 * itself: the allocated extents of the mapped file, then every page the
 * guest wrote, found in /proc/PID/pagemap and read from /proc/PID/mem. */

#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
#define PM_FILE (1ull << 61)
#define QEMU_PAGE 4096u
#define QEMU_DEVSTATE_TMP "devstate.tmp"

/* A VM without its own RAM file maps its snapshot's (qemu_ram_backing). */
static bool
qemu_ram_is_private(const struct moat_vmm *vm)
{
	struct stat st;

	return vm->ram_file != NULL && stat(vm->ram_file, &st) != 0 &&
	    errno == ENOENT;
}

/* Finds the guest RAM in QEMU `pid`: its largest writable private
 * mapping of a file from offset 0. *fd: that file (through map_files,
 * so even an unlinked one), *addr where it is mapped. Returns 0 or an
 * errno value. */
static int
private_ram_find(pid_t pid, int *fd, uint64_t *addr)
{
	char path[64];
	char *line = NULL;
	size_t cap = 0;
	unsigned long long best_a = 0, best_b = 0;
	FILE *f;

	*fd = -1;
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	if ((f = fopen(path, "re")) == NULL)
		return errno;
	while (getline(&line, &cap, f) > 0) {
		unsigned long long a, b, off, ino;
		unsigned maj, mn;
		char perms[8];

		if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &a, &b,
		        perms, &off, &maj, &mn, &ino) != 7 ||
		    ino == 0 || off != 0 || strlen(perms) < 4 ||
		    perms[1] != 'w' || perms[3] != 'p')
			continue;
		if (b - a > best_b - best_a) {
			best_a = a;
			best_b = b;
		}
	}
	free(line);
	fclose(f);
	if (best_b - best_a < 16u << 20)
		return ENOENT;
	snprintf(path, sizeof(path), "/proc/%d/map_files/%llx-%llx", (int)pid,
	    best_a, best_b);
	if ((*fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return errno;
	*addr = best_a;
	return 0;
}

/* Writes the pages of [addr, addr + size) the guest wrote into `out` at
 * their offsets. Returns 0 or an errno value; *bytes grows by what it
 * wrote. */
static int
private_ram_overlay(pid_t pid, uint64_t addr, uint64_t size, int out,
    uint64_t *bytes)
{
	enum { BATCH = 512 };
	uint64_t pm[BATCH];
	char path[64];
	char *buf = malloc((size_t)BATCH * QEMU_PAGE);
	int pmfd, memfd = -1, err = 0;

	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
	pmfd = open(path, O_RDONLY | O_CLOEXEC);
	snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
	if (pmfd >= 0)
		memfd = open(path, O_RDONLY | O_CLOEXEC);
	if (buf == NULL || pmfd < 0 || memfd < 0) {
		err = buf == NULL ? ENOMEM : errno;
		goto out;
	}
	for (uint64_t pg = 0; pg < size / QEMU_PAGE; pg += BATCH) {
		uint64_t n = size / QEMU_PAGE - pg;
		ssize_t got;

		if (n > BATCH)
			n = BATCH;
		got = pread(pmfd, pm, n * 8,
		    (off_t)((addr / QEMU_PAGE + pg) * 8));
		if (got != (ssize_t)(n * 8)) {
			err = got < 0 ? errno : EIO;
			goto out;
		}
		for (uint64_t i = 0; i < n;) {
			uint64_t j = i;
			size_t len;

			/* A run of the guest's own (anonymous) pages. */
			while (j < n &&
			    (((pm[j] & PM_PRESENT) && !(pm[j] & PM_FILE)) ||
			        (pm[j] & PM_SWAPPED)))
				j++;
			if (j == i) {
				i++;
				continue;
			}
			len = (size_t)(j - i) * QEMU_PAGE;
			if (pread(memfd, buf, len,
			        (off_t)(addr + (pg + i) * QEMU_PAGE)) !=
			        (ssize_t)len ||
			    pwrite(out, buf, len,
			        (off_t)((pg + i) * QEMU_PAGE)) !=
			        (ssize_t)len) {
				err = errno ? errno : EIO;
				goto out;
			}
			*bytes += len;
			i = j;
		}
	}
out:
	if (pmfd >= 0)
		close(pmfd);
	if (memfd >= 0)
		close(memfd);
	free(buf);
	return err;
}

/* In the pause: writes the RAM of private VM `vm` to the new file
 * `ram_copy`. Returns 0 or an errno value (the file removed). */
static int
private_ram_save(const struct moat_vmm *vm, const char *ram_copy,
    uint64_t *bytes)
{
	struct stat st;
	uint64_t addr = 0;
	int in, out = -1, err;

	*bytes = 0;
	if ((err = private_ram_find(vm->pid, &in, &addr)) != 0)
		return err;
	if (fstat(in, &st) != 0 ||
	    (out = open(ram_copy, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
	         0600)) < 0 ||
	    ftruncate(out, st.st_size) != 0) {
		err = errno;
		goto out;
	}
	if ((err = vmd_copy_extents(in, out, bytes)) == 0)
		err = private_ram_overlay(vm->pid, addr, (uint64_t)st.st_size,
		    out, bytes);
out:
	close(in);
	if (out >= 0) {
		close(out);
		if (err != 0)
			(void)unlink(ram_copy);
	}
	return err;
}

/* xen-save-devices-state writes the stream header and the device
 * sections but not the configuration section migrate writes after the
 * header, which migrate-incoming requires: the machine type and the
 * x-ignore-shared capability every restore sets (QEMU 7.2's
 * vmstate_configuration with its capabilities subsection, as migrate
 * writes it). Nor the JSON description after the end: an empty one. */
#define QEMU_STREAM_HEADER 8 /* "QEVM", version 3 */
static const unsigned char qemu_config_section[] =
    "\x07\x00\x00\x00\x07microvm"
    "\x05\x1a"
    "configuration/capabilities"
    "\x00\x00\x00\x01\x00\x00\x00\x01\x0fx-ignore-shared";
static const unsigned char qemu_empty_vmdesc[] = "\x06\x00\x00\x00\x02{}";

/* Copies QEMU's device-state stream `in` into `out` with the
 * configuration section and the description added. 0 or an errno. */
static int
private_state_copy(int in, int out)
{
	char buf[65536];
	unsigned char head[QEMU_STREAM_HEADER];
	ssize_t n;

	if (read(in, head, sizeof(head)) != (ssize_t)sizeof(head) ||
	    memcmp(head, "QEVM\0\0\0\3", sizeof(head)) != 0)
		return EPROTO;
	if (write(out, head, sizeof(head)) != (ssize_t)sizeof(head) ||
	    write(out, qemu_config_section, sizeof(qemu_config_section) - 1) !=
	        (ssize_t)sizeof(qemu_config_section) - 1)
		return errno ? errno : EIO;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n)
			return errno ? errno : EIO;
	if (n < 0)
		return errno;
	if (write(out, qemu_empty_vmdesc, sizeof(qemu_empty_vmdesc) - 1) !=
	    (ssize_t)sizeof(qemu_empty_vmdesc) - 1)
		return errno ? errno : EIO;
	return 0;
}

/* In the pause: has QEMU save the device state without RAM into its
 * sandbox directory and copies it into `state_fd`. */
static int
private_state_save(const struct moat_vmm *vm, struct qmp *q, int state_fd,
    char **errmsg)
{
	const char *slash = strrchr(vm->qmp_socket, '/');
	char *tmp = moat_asprintf("%.*s/" QEMU_DEVSTATE_TMP,
	    (int)(slash ? slash - vm->qmp_socket : 1),
	    slash ? vm->qmp_socket : ".");
	json_t *args =
	    tmp ? json_pack("{s:s,s:b}", "filename", tmp, "live", 0) : NULL;
	uid_t want = vmd_jail_uid(vm->jail);
	struct stat st;
	int fd = -1, rv, err;

	if (args == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto out;
	}
	(void)unlink(tmp);
	if ((rv = qmp_run(q, "xen-save-devices-state", args, NULL, errmsg)) !=
	    MOAT_OK)
		goto out;
	/* QEMU made it in a directory it may write: only a regular file of
	 * its own is read. */
	if ((fd = open(tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
	    fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    (want != 0 && st.st_uid != want)) {
		*errmsg = moat_asprintf("QEMU's device state %s is not a file "
		                        "it made",
		    tmp);
		rv = MOAT_INTERNAL;
		goto out;
	}
	if ((err = private_state_copy(fd, state_fd)) != 0) {
		*errmsg = moat_asprintf("cannot copy the device state %s: %s",
		    tmp, strerror(err));
		rv = moat_status_from_errno(err);
	}
out:
	if (fd >= 0)
		close(fd);
	if (tmp != NULL)
		(void)unlink(tmp);
	free(tmp);
	json_decref(args);
	return rv;
}

/* Links snap_dir's RAM name to `ram_copy`, opens QMP on `q` and hands
 * QEMU a new device-state file `state` to migrate into (a private VM:
 * *state_fd, for private_state_save). */
static int
qemu_snapshot_prepare(const struct moat_vmm *vm, struct qmp *q,
    const char *state, const char *ram, const char *ram_copy,
    uint32_t timeout_ms, int *priv_state_fd, char **errmsg)
{
	int state_fd, rv, err;

	if (symlink(ram_copy, ram) != 0) {
		err = errno;
		*errmsg = moat_asprintf("cannot link %s to %s: %s", ram,
		    ram_copy, strerror(err));
		return moat_status_from_errno(err);
	}
	if (vm->ram_file == NULL || vm->qmp_socket == NULL) {
		*errmsg = strdup("this VM has no RAM file of its own to "
		                 "snapshot");
		return MOAT_FAILED_PRECONDITION;
	}
	if ((state_fd = open(state, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
	         0600)) < 0) {
		err = errno;
		*errmsg = moat_asprintf("cannot create %s: %s", state,
		    strerror(err));
		return moat_status_from_errno(err);
	}
	if ((rv = qemu_qmp_open(vm, q, moat_rpc_now_ms() + timeout_ms,
	         errmsg)) != MOAT_OK)
		goto out;
	if (priv_state_fd != NULL) {
		*priv_state_fd = state_fd;
		return MOAT_OK;
	}
	/* QEMU writes the device state straight into the file: no shell
	 * and no cat in the pause. */
	if ((rv = qmp_set_ignore_shared(q, errmsg)) == MOAT_OK)
		rv = qmp_pass_fd(q, QEMU_STATE_FD, state_fd, errmsg);
out:
	close(state_fd);
	return rv;
}

/* With reflinks the RAM is cloned in the pause, and a clone first
 * writes back the file's dirty pages: write them back now, while
 * the guest runs, so the pause only meets what it dirties after. */
static void
qemu_snapshot_writeback(const struct moat_vmm *vm)
{
	if (vmd_ram_dir_reflinks()) {
		int ram_fd = open(vm->ram_file, O_RDONLY | O_CLOEXEC);

		if (ram_fd >= 0) {
			(void)fdatasync(ram_fd);
			close(ram_fd);
		}
	}
}

/* In the pause: copies the guest's RAM to `ram_copy` and its scratch
 * disk to `disk`; *t_ram is when the RAM copy ended. */
static int
qemu_snapshot_copy(const struct moat_vmm *vm, bool priv,
    const char *scratch_disk, const char *ram_copy, const char *disk,
    struct moat_vmm_snapshot_stats *st, double *t_ram, char **errmsg)
{
	int err;

	if ((err = priv ? private_ram_save(vm, ram_copy, &st->ram_bytes) :
	                  vmd_copy_sparse(vm->ram_file, ram_copy,
	                      &st->ram_bytes)) != 0) {
		*errmsg = moat_asprintf("cannot copy guest RAM %s to %s: %s",
		    vm->ram_file, ram_copy, strerror(err));
		return moat_status_from_errno(err);
	}
	*t_ram = vmd_now_ms_exact();
	if ((err = vmd_copy_sparse(scratch_disk, disk, &st->disk_bytes)) !=
	    0) {
		*errmsg =
		    moat_asprintf("cannot copy scratch disk %s to %s: %s",
		        scratch_disk, disk, strerror(err));
		return moat_status_from_errno(err);
	}
	return MOAT_OK;
}

/* Ends the pause whatever happened: a failed snapshot must not stop the
 * sandbox. Returns `rv`, or MOAT_INTERNAL when a good snapshot could not
 * resume the VM. */
static int
qemu_snapshot_cont(struct qmp *q, int rv, char **errmsg)
{
	char *cerr = NULL;

	q->deadline_ms = moat_rpc_now_ms() + 5000;
	if (qmp_run(q, "cont", NULL, NULL, &cerr) != MOAT_OK) {
		moat_error(0,
		    "cannot resume the VM after a snapshot: "
		    "%s",
		    cerr ? cerr : "?");
		if (rv == MOAT_OK) {
			*errmsg = moat_asprintf("the VM did not resume "
			                        "after the snapshot: %s",
			    cerr ? cerr : "?");
			rv = MOAT_INTERNAL;
		}
	}
	free(cerr);
	return rv;
}

static int
qemu_snapshot(const struct moat_vmm *vm, const char *scratch_disk,
    const char *snap_dir, uint32_t timeout_ms, bool leave_paused,
    struct moat_vmm_snapshot_stats *st, char **errmsg)
{
	struct qmp q = { .fd = -1 };
	char *state =
	    moat_asprintf("%s/" MOAT_VMM_SNAP_DEVICE_STATE, snap_dir);
	char *ram = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, snap_dir);
	char *disk = moat_asprintf("%s/" MOAT_VMM_SNAP_SCRATCH, snap_dir);
	char *ram_copy = snap_ram_path(snap_dir);
	double t_state = 0, t_ram = 0;
	json_t *args = NULL;
	bool stopped = false;
	bool priv = qemu_ram_is_private(vm);
	int priv_state_fd = -1;
	double t0 = 0;
	int rv;

	*errmsg = NULL;
	memset(st, 0, sizeof(*st));
	if (!state || !ram || !disk || !ram_copy) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto out;
	}
	if ((rv = qemu_snapshot_prepare(vm, &q, state, ram, ram_copy,
	         timeout_ms, priv ? &priv_state_fd : NULL, errmsg)) != MOAT_OK)
		goto out;
	if ((args = json_pack("{s:s}", "uri", "fd:" QEMU_STATE_FD)) == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto out;
	}
	qemu_snapshot_writeback(vm);

	/* The pause: from here to `cont`. stop flushes the block layer, so
	 * the disk copied below agrees with the RAM copied with it. */
	t0 = vmd_now_ms_exact();
	if ((rv = qmp_run(&q, "stop", NULL, NULL, errmsg)) != MOAT_OK)
		goto out;
	stopped = true;
	if (priv) {
		if ((rv = private_state_save(vm, &q, priv_state_fd, errmsg)) !=
		    MOAT_OK)
			goto out;
	} else if ((rv = qmp_run(&q, "migrate", args, NULL, errmsg)) !=
	        MOAT_OK ||
	    (rv = qmp_wait_migrated(&q, errmsg)) != MOAT_OK) {
		goto out;
	}
	t_state = vmd_now_ms_exact();
	rv = qemu_snapshot_copy(vm, priv, scratch_disk, ram_copy, disk, st,
	    &t_ram, errmsg);
out:
	if (stopped && !(leave_paused && rv == MOAT_OK)) {
		rv = qemu_snapshot_cont(&q, rv, errmsg);
		st->pause_ms = vmd_now_ms_exact() - t0;
	} else if (stopped) {
		st->pause_ms = vmd_now_ms_exact() - t0; /* so far */
	}
	if (rv == MOAT_OK) {
		st->device_state_bytes = file_size(state);
		moat_debug(0,
		    "snapshot %s: device state %.1f ms, RAM copy "
		    "%.1f ms, disk copy and resume %.1f ms",
		    snap_dir, t_state - t0, t_ram - t_state,
		    t0 + st->pause_ms - t_ram);
	} else if (ram_copy != NULL) {
		(void)unlink(ram_copy);
	}
	if (priv_state_fd >= 0)
		close(priv_state_fd);
	json_decref(args);
	qmp_close(&q);
	free(state);
	free(ram);
	free(ram_copy);
	free(disk);
	return rv;
}

/* unpause (vmm.h): `cont` for a VM a snapshot left stopped. */
static int
qemu_unpause(const struct moat_vmm *vm, uint32_t timeout_ms, char **errmsg)
{
	struct qmp q = { .fd = -1 };
	int rv;

	*errmsg = NULL;
	if ((rv = qemu_qmp_open(vm, &q, moat_rpc_now_ms() + timeout_ms,
	         errmsg)) == MOAT_OK)
		rv = qmp_run(&q, "cont", NULL, NULL, errmsg);
	qmp_close(&q);
	return rv;
}

static int
qemu_resume(const struct moat_vmm *vm, const char *snap_dir,
    uint32_t timeout_ms, char **errmsg)
{
	struct qmp q = { .fd = -1 };
	uint64_t deadline = moat_rpc_now_ms() + timeout_ms;
	struct moat_vmm_timings tm = { 0 };
	double t = vmd_now_ms_exact(), t1;
	char *state =
	    moat_asprintf("%s/" MOAT_VMM_SNAP_DEVICE_STATE, snap_dir);
	json_t *args = json_pack("{s:s}", "uri", "fd:" QEMU_STATE_FD);
	int state_fd = -1;
	int rv;

	*errmsg = NULL;
	if (state == NULL || args == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto out;
	}
	if ((state_fd = open(state, O_RDONLY | O_CLOEXEC)) < 0) {
		rv = moat_status_from_errno(errno);
		*errmsg = moat_asprintf("cannot open %s: %s", state,
		    strerror(errno));
		goto out;
	}
	/* The QMP socket appears early in QEMU's start: retry until. */
	for (;;) {
		rv = qemu_qmp_open(vm, &q, deadline, errmsg);
		if (rv == MOAT_OK || rv != MOAT_UNAVAILABLE ||
		    moat_rpc_now_ms() >= deadline)
			break;
		free(*errmsg);
		*errmsg = NULL;
		vmd_sleep_ms(2);
	}
	if (rv != MOAT_OK)
		goto out;
	t1 = vmd_now_ms_exact();
	tm.qmp_wait_ms = t1 - t;
	{
		struct qemu_ram_copy *rc = vm->driver_data;
		int err = ram_copy_join(rc);

		t = vmd_now_ms_exact();
		tm.ram_wait_ms = t - t1;
		tm.ram_copy_ms = rc != NULL ? rc->ms : 0;

		if (err != 0) {
			*errmsg = moat_asprintf("cannot copy the snapshot's "
			                        "RAM (%s): %s",
			    rc->what ? rc->what : "?", strerror(err));
			rv = moat_status_from_errno(err);
			goto out;
		}
	}
	if ((rv = qmp_set_ignore_shared(&q, errmsg)) != MOAT_OK ||
	    (rv = qmp_pass_fd(&q, QEMU_STATE_FD, state_fd, errmsg)) !=
	        MOAT_OK ||
	    (rv = qmp_run(&q, "migrate-incoming", args, NULL, errmsg)) !=
	        MOAT_OK)
		goto out;
	for (;;) {
		json_t *ret = NULL;
		const char *status;
		bool loading;

		if ((rv = qmp_run(&q, "query-status", NULL, &ret, errmsg)) !=
		    MOAT_OK)
			goto out;
		status = json_string_value(json_object_get(ret, "status"));
		loading = status != NULL && strcmp(status, "inmigrate") == 0;
		json_decref(ret);
		if (!loading)
			break;
		if (moat_rpc_now_ms() >= deadline) {
			*errmsg = strdup("QEMU did not load the snapshot's "
			                 "device state in time");
			rv = MOAT_DEADLINE_EXCEEDED;
			goto out;
		}
		usleep(QEMU_MIGRATE_POLL_US);
	}
	t1 = vmd_now_ms_exact();
	tm.device_load_ms = t1 - t;
	rv = qmp_run(&q, "cont", NULL, NULL, errmsg);
	tm.resume_ms = vmd_now_ms_exact() - t1;
	if (vm->timings != NULL)
		*vm->timings = tm;
out:
	json_decref(args);
	qmp_close(&q);
	if (state_fd >= 0)
		close(state_fd);
	free(state);
	return rv;
}

const struct moat_vmm_ops moat_vmm_qemu = {
	.name = "qemu",
	.probe = qemu_probe,
	.start = qemu_start,
	.connect_agent = qemu_connect_agent,
	.stop = vmd_vmm_signal,
	.release = qemu_release,
	.reap_orphan = qemu_reap_orphan,
	.adopt = qemu_adopt,
	.detach = qemu_detach,
	.snapshot = qemu_snapshot,
	.unpause = qemu_unpause,
	.restore = qemu_restore,
	.resume = qemu_resume,
};
