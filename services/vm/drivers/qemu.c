/*
 * qemu.c: the QEMU driver (`moat_vmm_qemu`): one qemu-system-x86_64
 * process per sandbox with the microvm machine, guest RAM in a shared file
 * under /dev/shm (so snapshots can capture and clones can map it), the
 * image's root filesystem read-only and the scratch disk read-write as
 * virtio-blk, the agent on a virtio-serial port bridged to a Unix socket
 * in the sandbox directory, QMP on another, and the serial console in a
 * file. Not for: supervising the process (sandbox.c) or deciding the
 * accelerator (accel.c).
 */
#include <errno.h>
#include <fcntl.h>
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
#include "moat/status.h"
#include "moat/util.h"
#include "../spawn.h"
#include "../sync.h"
#include "../vmm.h"

#define QEMU_MAX_ARGS 64
#define QEMU_AGENT_PORT "org.moat.agent"
#define QEMU_RAM_DIR "/dev/shm"

/* The kernel command line every sandbox gets; keys per guest/agent/boot.h
 * and images/README.md. */
/* pci=off, cryptomgr.notests, 8250.nr_uarts=1 save ~0.4 s of guest boot
 * under TCG (microvm has no PCI); init_on_alloc=0 makes python's first
 * run ~0.4 s faster and only drops hardening inside the guest kernel, not
 * at the VM boundary. The kernel is the uncompressed vmlinux: a bzImage
 * spends 3-4 s of TCG time decompressing itself. */
#define QEMU_CMDLINE "console=ttyS0 reboot=t panic=-1 quiet pci=off " \
	"cryptomgr.notests 8250.nr_uarts=1 init_on_alloc=0 " \
	"moat.root=LABEL=moat-root moat.scratch=LABEL=moat-scratch " \
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

static char *
ram_file_path(const char *sandbox_id)
{
	return moat_asprintf(QEMU_RAM_DIR "/moat-%s.ram", sandbox_id);
}

/* QEMU splits option values at commas; a path with one would be
 * misread, so such paths are refused instead of escaped. */
static bool
path_ok(const char *p)
{
	return p != NULL && strchr(p, ',') == NULL;
}

static int
qemu_probe(const char *binary, char **version, char **errmsg)
{
	char *cmd = NULL;
	FILE *f;
	char line[256] = "";
	int status;

	*version = NULL;
	*errmsg = NULL;
	if (strchr(binary, '\'') != NULL) {
		*errmsg = moat_asprintf("qemu binary name %s has a quote in "
		    "it", binary);
		return MOAT_INVALID_ARGUMENT;
	}
	cmd = moat_asprintf("'%s' --version 2>/dev/null", binary);
	if (cmd == NULL || (f = popen(cmd, "r")) == NULL) {
		free(cmd);
		*errmsg = strdup("cannot run the qemu version check");
		return MOAT_INTERNAL;
	}
	free(cmd);
	if (fgets(line, sizeof(line), f) == NULL)
		line[0] = '\0';
	while (fgetc(f) != EOF)
		;
	status = pclose(f);
	if (status != 0 || strncmp(line, "QEMU emulator", 13) != 0) {
		*errmsg = moat_asprintf("%s is not installed or does not run: "
		    "install the Debian package qemu-system-x86 (apt-get "
		    "install qemu-system-x86) or set [vmd] qemu= to its path",
		    binary);
		return MOAT_FAILED_PRECONDITION;
	}
	line[strcspn(line, "\r\n")] = '\0';
	qemu_host_tsc_khz = measure_tsc_khz();
	moat_info(0, "qemu: host TSC %u kHz (given to TCG guests)",
	    qemu_host_tsc_khz);
	*version = strdup(line);
	return *version ? MOAT_OK : MOAT_INTERNAL;
}

static void
qemu_release(struct moat_vmm *vm)
{
	if (vm->ram_file != NULL)
		(void)unlink(vm->ram_file);
	free(vm->agent_socket);
	free(vm->console_log);
	free(vm->vmm_log);
	free(vm->ram_file);
	vm->agent_socket = vm->console_log = vm->vmm_log = NULL;
	vm->ram_file = NULL;
	vm->pid = 0;
}

static int
qemu_start(const char *binary, const struct moat_vmm_spec *spec,
    struct moat_vmm *vm, char **errmsg)
{
	struct qemu_argv a = { 0 };
	struct moat_spawn_req req = { 0 };
	bool kvm = strcmp(spec->accel, "kvm") == 0;
	char *qmp = NULL;
	char *pidfile = NULL;
	char *tcg_cmdline = NULL;
	int rv;

	*errmsg = NULL;
	memset(vm, 0, sizeof(*vm));
	vm->agent_socket = moat_asprintf("%s/agent.sock", spec->dir);
	vm->console_log = moat_asprintf("%s/console.log", spec->dir);
	vm->vmm_log = moat_asprintf("%s/qemu.log", spec->dir);
	vm->ram_file = ram_file_path(spec->sandbox_id);
	qmp = moat_asprintf("%s/qmp.sock", spec->dir);
	pidfile = moat_asprintf("%s/qemu.pid", spec->dir);
	if (!vm->agent_socket || !vm->console_log || !vm->vmm_log ||
	    !vm->ram_file || !qmp || !pidfile) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if (!path_ok(spec->dir) || !path_ok(spec->kernel) ||
	    !path_ok(spec->initrd) || !path_ok(spec->rootfs) ||
	    !path_ok(spec->scratch_disk)) {
		*errmsg = moat_asprintf("a path for sandbox %s has a comma in "
		    "it, which QEMU cannot take: move the state or image "
		    "directory", spec->sandbox_id);
		rv = MOAT_FAILED_PRECONDITION;
		goto fail;
	}
	if (strlen(vm->agent_socket) >= sizeof(((struct sockaddr_un *)0)
	    ->sun_path)) {
		*errmsg = moat_asprintf("socket path %s is too long for a Unix "
		    "socket: use a shorter state directory", vm->agent_socket);
		rv = MOAT_FAILED_PRECONDITION;
		goto fail;
	}
	/* A RAM file left by an earlier boot attempt must not be reused. */
	(void)unlink(vm->ram_file);
	(void)unlink(vm->agent_socket);
	(void)unlink(qmp);

	argv_add(&a, strdup(binary));
	argv_add(&a, strdup("-M"));
	argv_add(&a, strdup("microvm,x-option-roms=off,rtc=on,"
	    "memory-backend=ram"));
	argv_add(&a, strdup("-accel"));
	argv_add(&a, strdup(kvm ? "kvm" : "tcg"));
	argv_add(&a, strdup("-cpu"));
	argv_add(&a, strdup(kvm ? "host" : "max"));
	argv_add(&a, strdup("-smp"));
	argv_add(&a, moat_asprintf("%u", spec->vcpus));
	argv_add(&a, strdup("-m"));
	argv_add(&a, moat_asprintf("%u", spec->memory_mib));
	argv_add(&a, strdup("-object"));
	argv_add(&a, moat_asprintf("memory-backend-file,id=ram,size=%uM,"
	    "mem-path=%s,share=on", spec->memory_mib, vm->ram_file));
	argv_add(&a, strdup("-no-reboot"));
	argv_add(&a, strdup("-nodefaults"));
	argv_add(&a, strdup("-no-user-config"));
	argv_add(&a, strdup("-display"));
	argv_add(&a, strdup("none"));
	argv_add(&a, strdup("-serial"));
	argv_add(&a, moat_asprintf("file:%s", vm->console_log));
	argv_add(&a, strdup("-kernel"));
	argv_add(&a, strdup(spec->kernel));
	argv_add(&a, strdup("-initrd"));
	argv_add(&a, strdup(spec->initrd));
	argv_add(&a, strdup("-append"));
	if (!kvm && qemu_host_tsc_khz > 0)
		tcg_cmdline = moat_asprintf(" tsc_early_khz=%u " QEMU_TCG_CMDLINE,
		    qemu_host_tsc_khz);
	else
		tcg_cmdline = strdup(kvm ? "" : " " QEMU_TCG_CMDLINE);
	argv_add(&a, moat_asprintf("%s%s%s%s", QEMU_CMDLINE,
	    tcg_cmdline ? tcg_cmdline : "", spec->extra_cmdline ? " " : "",
	    spec->extra_cmdline ? spec->extra_cmdline : ""));
	free(tcg_cmdline);
	argv_add(&a, strdup("-drive"));
	argv_add(&a, moat_asprintf("id=root,file=%s,format=raw,if=none,"
	    "readonly=on", spec->rootfs));
	argv_add(&a, strdup("-device"));
	argv_add(&a, strdup("virtio-blk-device,drive=root"));
	argv_add(&a, strdup("-drive"));
	argv_add(&a, moat_asprintf("id=scratch,file=%s,format=raw,if=none",
	    spec->scratch_disk));
	argv_add(&a, strdup("-device"));
	argv_add(&a, strdup("virtio-blk-device,drive=scratch"));
	argv_add(&a, strdup("-device"));
	argv_add(&a, strdup("virtio-serial-device"));
	argv_add(&a, strdup("-chardev"));
	argv_add(&a, moat_asprintf("socket,id=agent,path=%s,server=on,"
	    "wait=off", vm->agent_socket));
	argv_add(&a, strdup("-device"));
	argv_add(&a, strdup("virtserialport,chardev=agent,name="
	    QEMU_AGENT_PORT));
	argv_add(&a, strdup("-qmp"));
	argv_add(&a, moat_asprintf("unix:%s,server=on,wait=off", qmp));
	argv_add(&a, strdup("-pidfile"));
	argv_add(&a, strdup(pidfile));
	if (a.oom) {
		*errmsg = strdup("out of memory building the qemu command");
		rv = MOAT_INTERNAL;
		goto fail;
	}

	req.argv = (const char *const *)a.arg;
	req.output_file = vm->vmm_log;
	req.cwd = spec->dir;
	if ((rv = moat_spawn(&req, &vm->pid, errmsg)) != MOAT_OK)
		goto fail;
	argv_fini(&a);
	free(qmp);
	free(pidfile);
	return MOAT_OK;
fail:
	argv_fini(&a);
	free(qmp);
	free(pidfile);
	qemu_release(vm);
	return rv;
}

static int
qemu_connect_agent(const struct moat_vmm *vm, int *fd, char **errmsg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int s;

	*fd = -1;
	*errmsg = NULL;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", vm->agent_socket);
	if ((s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
		*errmsg = moat_asprintf("socket: %s", strerror(errno));
		return moat_status_from_errno(errno);
	}
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int err = errno;

		close(s);
		if (err == ENOENT || err == ECONNREFUSED || err == EAGAIN)
			return MOAT_UNAVAILABLE;
		*errmsg = moat_asprintf("cannot connect to %s: %s",
		    vm->agent_socket, strerror(err));
		return moat_status_from_errno(err);
	}
	*fd = s;
	return MOAT_OK;
}

static void
qemu_stop(const struct moat_vmm *vm, bool force)
{
	if (vm->pid > 0)
		(void)kill(vm->pid, force ? SIGKILL : SIGTERM);
}

/* True when /proc/<pid> is a live (not zombie) process whose command line
 * mentions `dir`: the VMM of that sandbox, not a recycled pid. */
static bool
proc_runs_from(pid_t pid, const char *dir)
{
	char path[64];
	char *buf = NULL;
	size_t len = 0;
	bool match = false;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (moat_read_file(path, 4096, &buf, &len) != 0)
		return false;
	{
		char *rp = strrchr(buf, ')');
		if (rp == NULL || rp[1] == '\0' || rp[2] == 'Z') {
			free(buf);
			return false;
		}
	}
	free(buf);
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	if (moat_read_file(path, 1 << 16, &buf, &len) != 0)
		return false;
	for (size_t i = 0; i < len; i++)
		if (buf[i] == '\0')
			buf[i] = ' ';
	match = strstr(buf, dir) != NULL;
	free(buf);
	return match;
}

static bool
qemu_reap_orphan(const char *dir, const char *id)
{
	char *pidfile = moat_asprintf("%s/qemu.pid", dir);
	char *ram = ram_file_path(id);
	char *text = NULL;
	size_t len;
	bool killed = false;
	long pid;

	if (pidfile != NULL && moat_read_file(pidfile, 64, &text, &len) == 0)
	{
		pid = strtol(text, NULL, 10);
		if (pid > 1 && proc_runs_from((pid_t)pid, dir)) {
			(void)kill((pid_t)pid, SIGKILL);
			killed = true;
			/* Not our child: wait for whoever reaps it. */
			for (int i = 0; i < 500 &&
			    proc_runs_from((pid_t)pid, dir); i++)
				vmd_sleep_ms(10);
		}
		free(text);
	}
	if (ram != NULL)
		(void)unlink(ram);
	free(ram);
	free(pidfile);
	return killed;
}

const struct moat_vmm_ops moat_vmm_qemu = {
	.name = "qemu",
	.probe = qemu_probe,
	.start = qemu_start,
	.connect_agent = qemu_connect_agent,
	.stop = qemu_stop,
	.release = qemu_release,
	.reap_orphan = qemu_reap_orphan,
};
