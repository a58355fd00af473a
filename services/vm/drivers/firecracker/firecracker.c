/*
 * firecracker.c: the Firecracker driver (`moat_vmm_firecracker`, see
 * firecracker.h): one `firecracker --api-sock` per sandbox, optionally
 * under the jailer, configured over its REST API (logger, metrics,
 * machine, boot source, root image read-only, scratch disk, vsock) and
 * started with InstanceStart; the agent reached through Firecracker's
 * hybrid vsock (`CONNECT <port>\n` -> `OK <n>\n` on vsock.sock); pause,
 * snapshot and snapshot load for time travel, and vmm.h's snapshot,
 * restore and resume ops built on them. Firecracker outlives vmd (no
 * parent-death signal; its console a named pipe) and a restarted vmd
 * re-adopts it (fc_adopt) from the state file's vmm-info line (its slot,
 * whether jailed, its working folder). Not for: supervising the
 * process after start (vmd's sandbox code), the HTTP client (api.c) or
 * the jail's layout (jail.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/kvm.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "../../console.h"
#include "../../extents.h"
#include "../../spawn.h"
#include "../../sync.h"
#include "../../vmhost.h"
#include "api.h"
#include "firecracker.h"
#include "jail.h"

#define FC_MAX_SLOTS 4096u
#define FC_CID_BASE 3u /* the lowest guest CID allowed */
#define FC_TAIL_LINES 8
#define FC_HANDSHAKE_MS 2000

#define FC_API_SOCK "api.sock"
#define FC_VSOCK "vsock.sock"
#define FC_LOG "firecracker.log"
#define FC_METRICS "metrics.json"
#define FC_CONSOLE "console.log"
#define FC_CONSOLE_FIFO "console.fifo" /* in the sandbox folder */
#define FC_PID "firecracker.pid"
#define FC_KERNEL "vmlinux"
#define FC_INITRD "initrd.img"
#define FC_ROOTFS "rootfs.ext4"
#define FC_SCRATCH "scratch.ext4"
#define FC_SNAP_STATE "snapshot.vmstate"
#define FC_SNAP_MEM "snapshot.mem"

/* Keys per guest/agent/boot.h; the disks are found by label. */
#define FC_CMDLINE                                                            \
	"console=ttyS0 reboot=k panic=1 pci=off i8042.noaux "                 \
	"quiet moat.root=LABEL=moat-root moat.scratch=LABEL=moat-scratch"

/* The driver's configuration: written by configure and probe on the main
 * thread before any sandbox starts, read-only afterwards. */
static struct {
	struct moat_fc_config cfg;
	char *kvm_device;
	char *jailer;
	char *chroot_base;
	char *cgroup_root;
	char *parent_cgroup;
	char *netns;
	char *binary; /* resolved by probe, for reap_orphan */
} fc = {
	.cfg = {
		.kvm_device = "/dev/kvm",
		.api_timeout_ms = 5000,
		.vsock_port = 1024,
		.jail = {
			.jailer = "jailer",
			.chroot_base = "/srv/jailer",
			.cgroup_root = "/sys/fs/cgroup",
			.parent_cgroup = "moat",
			.uid_base = 900000,
			.id_count = 1024,
			.memory_overhead_mib = 64,
		},
	},
};

/* What the driver knows of one live Firecracker, found again by the
 * moat_vmm's agent_socket (vmm.h's struct has no room for driver state).
 * The slot number gives the guest CID and the jail uid/gid. */
struct fc_instance {
	bool in_use;
	bool jailed;
	char *agent_socket; /* key */
	char *root;         /* Firecracker's working folder */
	char *api_socket;
	struct moat_fc_jail jail;
};

static pthread_mutex_t fc_mu = PTHREAD_MUTEX_INITIALIZER; /* fc_slots */
static struct fc_instance fc_slots[FC_MAX_SLOTS];

/* ---- configuration and probe ---- */

void
moat_fc_config_defaults(struct moat_fc_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->kvm_device = "/dev/kvm";
	cfg->api_timeout_ms = 5000;
	cfg->vsock_port = 1024;
	cfg->jail.jailer = "jailer";
	cfg->jail.chroot_base = "/srv/jailer";
	cfg->jail.cgroup_root = "/sys/fs/cgroup";
	cfg->jail.parent_cgroup = "moat";
	cfg->jail.uid_base = 900000;
	cfg->jail.id_count = 1024;
	cfg->jail.memory_overhead_mib = 64;
}

static char *
dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

int
moat_vmm_firecracker_configure(const struct moat_fc_config *cfg, char **errmsg)
{
	const struct moat_fc_jail_config *j = &cfg->jail;

	*errmsg = NULL;
	if (cfg->vsock_port == 0 || cfg->api_timeout_ms == 0) {
		*errmsg = strdup("[firecracker] vsock-port and api-timeout-ms "
		                 "must be above 0");
		return MOAT_INVALID_ARGUMENT;
	}
	if (cfg->use_jailer &&
	    (!j->jailer || !j->chroot_base || !j->cgroup_root ||
	        !j->parent_cgroup || j->chroot_base[0] != '/' ||
	        j->cgroup_root[0] != '/' || j->id_count == 0 ||
	        strchr(j->parent_cgroup, '.') != NULL)) {
		*errmsg = strdup(
		    "[firecracker] jailer settings are "
		    "incomplete: chroot-base and cgroup-root must be absolute "
		    "paths, parent-cgroup a plain name, jail-id-count above "
		    "0");
		return MOAT_INVALID_ARGUMENT;
	}
	if (cfg->use_jailer && j->uid_base == 0) {
		*errmsg = strdup("[firecracker] jail-uid-base must not be 0: "
		                 "a jailed Firecracker must not run as root");
		return MOAT_INVALID_ARGUMENT;
	}
	free(fc.kvm_device);
	free(fc.jailer);
	free(fc.chroot_base);
	free(fc.cgroup_root);
	free(fc.parent_cgroup);
	free(fc.netns);
	fc.cfg = *cfg;
	fc.kvm_device =
	    dup_or_null(cfg->kvm_device ? cfg->kvm_device : "/dev/kvm");
	fc.jailer = dup_or_null(j->jailer);
	fc.chroot_base = dup_or_null(j->chroot_base);
	fc.cgroup_root = dup_or_null(j->cgroup_root);
	fc.parent_cgroup = dup_or_null(j->parent_cgroup);
	fc.netns = dup_or_null(j->netns);
	fc.cfg.kvm_device = fc.kvm_device;
	fc.cfg.jail.jailer = fc.jailer;
	fc.cfg.jail.chroot_base = fc.chroot_base;
	fc.cfg.jail.cgroup_root = fc.cgroup_root;
	fc.cfg.jail.parent_cgroup = fc.parent_cgroup;
	fc.cfg.jail.netns = fc.netns;
	if (fc.cfg.jail.id_count > FC_MAX_SLOTS)
		fc.cfg.jail.id_count = FC_MAX_SLOTS;
	return MOAT_OK;
}

/* The absolute path of `name` (as given when it has a '/', else looked
 * up in PATH), or NULL when there is no such executable. Heap. */
static char *
fc_find_binary(const char *name)
{
	const char *path = getenv("PATH");
	const char *p;

	if (name == NULL || name[0] == '\0')
		return NULL;
	if (strchr(name, '/') != NULL)
		return access(name, X_OK) == 0 ? realpath(name, NULL) : NULL;
	if (path == NULL)
		path = "/usr/local/bin:/usr/bin:/bin";
	for (p = path; *p != '\0';) {
		size_t n = strcspn(p, ":");
		char *cand = moat_asprintf("%.*s/%s", (int)n, p, name);

		if (cand != NULL && n > 0 && access(cand, X_OK) == 0) {
			char *abs = realpath(cand, NULL);

			free(cand);
			return abs;
		}
		free(cand);
		p += n;
		if (*p == ':')
			p++;
	}
	return NULL;
}

static char *
fc_not_found_text(const char *what, const char *name)
{
	const char *path = getenv("PATH");

	return moat_asprintf(
	    "%s \"%s\" was not found (looked %s%s): "
	    "Firecracker is not packaged by Debian; download a release "
	    "(firecracker-vX.Y.Z-x86_64.tgz) from "
	    "https://github.com/firecracker-microvm/firecracker/releases and "
	    "install its firecracker and jailer binaries as "
	    "/usr/local/bin/firecracker and /usr/local/bin/jailer, or set "
	    "[vmd] firecracker= (and [firecracker] jailer=) to their paths; "
	    "or run with driver=qemu",
	    what, name, strchr(name, '/') ? "at that path" : "in PATH=",
	    strchr(name, '/') ? "" : (path ? path : "(unset)"));
}

/* KVM must open, speak API version 12, and make a VM. */
static int
fc_check_kvm(char **errmsg)
{
	int fd = open(fc.cfg.kvm_device, O_RDWR | O_CLOEXEC);
	int vm;
	int err;

	if (fd < 0) {
		err = errno;
		*errmsg = moat_asprintf(
		    "Firecracker needs KVM, and %s cannot "
		    "be opened: %s (load kvm_intel or kvm_amd, give vmd "
		    "access to %s, or run with driver=qemu, which falls back "
		    "to TCG)",
		    fc.cfg.kvm_device, strerror(err), fc.cfg.kvm_device);
		return MOAT_FAILED_PRECONDITION;
	}
	if (ioctl(fd, KVM_GET_API_VERSION, 0) != KVM_API_VERSION ||
	    (vm = ioctl(fd, KVM_CREATE_VM, 0)) < 0) {
		err = errno;
		close(fd);
		*errmsg = moat_asprintf(
		    "%s is there but cannot create a VM "
		    "(%s): Firecracker cannot run here; use driver=qemu",
		    fc.cfg.kvm_device, strerror(err));
		return MOAT_FAILED_PRECONDITION;
	}
	close(vm);
	close(fd);
	return MOAT_OK;
}

static int
fc_probe(const char *binary, char **version, char **errmsg)
{
	char *abs = NULL;
	char line[256];
	int rv;

	*version = NULL;
	*errmsg = NULL;
	if ((abs = fc_find_binary(binary)) == NULL) {
		*errmsg = fc_not_found_text("firecracker", binary);
		return MOAT_FAILED_PRECONDITION;
	}
	rv = vmd_version_line(abs, "firecracker", "Firecracker v", line,
	    sizeof(line), errmsg);
	if (rv == MOAT_FAILED_PRECONDITION)
		*errmsg = moat_asprintf(
		    "%s does not run as Firecracker "
		    "(\"%s --version\" did not print \"Firecracker v...\"): "
		    "reinstall it from the release tarball",
		    abs, abs);
	if (rv != MOAT_OK)
		goto cleanup;
	if (fc.cfg.use_jailer) {
		char *jailer = fc_find_binary(fc.cfg.jail.jailer);

		if (jailer == NULL) {
			*errmsg =
			    fc_not_found_text("jailer", fc.cfg.jail.jailer);
			rv = MOAT_FAILED_PRECONDITION;
			goto cleanup;
		}
		free(fc.jailer);
		fc.jailer = jailer;
		fc.cfg.jail.jailer = jailer;
		if (geteuid() != 0) {
			*errmsg = strdup(
			    "the jailer needs vmd to run as root "
			    "(it makes chroots, cgroups and device nodes): "
			    "run vmd as root or turn [firecracker] jailer "
			    "off");
			rv = MOAT_PERMISSION_DENIED;
			goto cleanup;
		}
		if (fc.cfg.jail.new_pid_ns) {
			int on = 0;

			/* With --new-pid-ns the jailer's parent exits and
			 * Firecracker must be re-parented to vmd. */
			if (prctl(PR_GET_CHILD_SUBREAPER, &on) != 0 || !on) {
				*errmsg = strdup(
				    "[firecracker] new-pid-ns "
				    "needs vmd to be a child subreaper: call "
				    "prctl(PR_SET_CHILD_SUBREAPER, 1) at vmd "
				    "start");
				rv = MOAT_FAILED_PRECONDITION;
				goto cleanup;
			}
		}
	}
	if (!fc.cfg.test_no_kvm_check &&
	    (rv = fc_check_kvm(errmsg)) != MOAT_OK)
		goto cleanup;
	free(fc.binary);
	fc.binary = abs;
	abs = NULL;
	if ((*version = strdup(line)) == NULL)
		rv = MOAT_INTERNAL;
cleanup:
	free(abs);
	return rv;
}

/* ---- small helpers ---- */

char *
moat_fc_exit_text(int status)
{
	static const struct {
		int code;
		const char *meaning;
	} codes[] = {
		{ 0, "ok" },
		{ 1, "generic error" },
		{ 148, "seccomp violation" },
		{ 149, "SIGBUS" },
		{ 150, "SIGSEGV" },
		{ 151, "SIGXFSZ" },
		{ 152, "bad configuration" },
		{ 153, "argument parsing" },
		{ 154, "SIGXCPU" },
		{ 155, "SIGPIPE" },
		{ 156, "SIGHUP" },
		{ 157, "SIGILL" },
	};

	if (WIFEXITED(status)) {
		int code = WEXITSTATUS(status);

		for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
			if (codes[i].code == code)
				return moat_asprintf("exit code %d (%s)", code,
				    codes[i].meaning);
		return moat_asprintf("exit code %d", code);
	}
	if (WIFSIGNALED(status))
		return moat_asprintf("killed by signal %d (%s)",
		    WTERMSIG(status), strsignal(WTERMSIG(status)));
	return moat_asprintf("wait status %d", status);
}

/* "exit code 152 (bad configuration); its last lines: ..." for a
 * Firecracker that is gone, with both its output and its log. Heap. */
static char *
fc_exit_report(int status, const char *console, const char *log)
{
	char *how = moat_fc_exit_text(status);
	char *out_tail = vmd_log_tail(console, FC_TAIL_LINES);
	char *log_tail = vmd_log_tail(log, FC_TAIL_LINES);
	char *text;

	text = moat_asprintf("%s; its output ended with:\n%s\nand its log "
	                     "(%s) with:\n%s",
	    how ? how : "?", out_tail && out_tail[0] ? out_tail : "(nothing)",
	    log, log_tail && log_tail[0] ? log_tail : "(nothing)");
	free(how);
	free(out_tail);
	free(log_tail);
	return text;
}

static bool
fc_name_ok(const char *name)
{
	if (name == NULL || name[0] == '\0' || strlen(name) > 64)
		return false;
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		        (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
			return false;
	return true;
}

/* ---- the kernel ---- */

enum fc_kernel_kind {
	KERNEL_MISSING,
	KERNEL_ELF,
	KERNEL_BZIMAGE,
	KERNEL_OTHER
};

static enum fc_kernel_kind
fc_kernel_kind(const char *path)
{
	unsigned char head[0x206];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return KERNEL_MISSING;
	n = pread(fd, head, sizeof(head), 0);
	close(fd);
	if (n >= 4 && memcmp(head, "\177ELF", 4) == 0)
		return KERNEL_ELF;
	if (n >= 0x206 && memcmp(head + 0x202, "HdrS", 4) == 0)
		return KERNEL_BZIMAGE;
	return KERNEL_OTHER;
}

/* Picks the ELF kernel: spec->kernel itself, or the vmlinux beside it
 * (vmd names vmlinuz for QEMU; images/build.sh makes both). Heap. */
static int
fc_pick_kernel(const char *kernel, char **out, char **errmsg)
{
	enum fc_kernel_kind kind = fc_kernel_kind(kernel);
	const char *slash = strrchr(kernel, '/');
	char *beside;

	*out = NULL;
	if (kind == KERNEL_ELF) {
		*out = strdup(kernel);
		return *out ? MOAT_OK : MOAT_INTERNAL;
	}
	beside = slash ?
	    moat_asprintf("%.*s/" FC_KERNEL, (int)(slash - kernel), kernel) :
	    strdup(FC_KERNEL);
	if (beside != NULL && fc_kernel_kind(beside) == KERNEL_ELF) {
		*out = beside;
		return MOAT_OK;
	}
	free(beside);
	if (kind == KERNEL_MISSING) {
		*errmsg = moat_asprintf(
		    "kernel %s does not exist: build the "
		    "image with images/build.sh (Firecracker wants its "
		    "uncompressed vmlinux)",
		    kernel);
		return MOAT_FAILED_PRECONDITION;
	}
	*errmsg = moat_asprintf(
	    "kernel %s is %s, and Firecracker on x86_64 "
	    "boots only an uncompressed ELF vmlinux: run images/build.sh to "
	    "make vmlinux beside vmlinuz (or extract it with the kernel's "
	    "scripts/extract-vmlinux)",
	    kernel,
	    kind == KERNEL_BZIMAGE ? "a compressed bzImage (vmlinuz)" :
	                             "not an ELF file");
	return MOAT_FAILED_PRECONDITION;
}

/* ---- the working folder ---- */

/* Copies `src` to `dst` (a new file, mode 0400, owned by uid/gid). */
static int
fc_copy_file(const char *src, const char *dst, uid_t uid, gid_t gid)
{
	int in = open(src, O_RDONLY | O_CLOEXEC);
	int out = -1;
	int err = 0;
	ssize_t n;

	if (in < 0)
		return errno;
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
	if (out < 0) {
		err = errno;
		goto cleanup;
	}
	do {
		n = copy_file_range(in, NULL, out, NULL, 1u << 30, 0);
	} while (n > 0);
	if (n < 0)
		err = errno;
	else if (fchown(out, uid, gid) != 0)
		err = errno;
cleanup:
	if (out >= 0)
		close(out);
	if (in >= 0)
		close(in);
	if (err != 0)
		(void)unlink(dst);
	return err;
}

/* Makes `root`/`name` stand for the host file `src`: a symlink when not
 * jailed (Firecracker runs as vmd's user and resolves it), a hard link
 * when jailed (a chroot hides symlink targets), or a copy when the jail
 * is on another file system and the file is read-only. A writable file
 * (the scratch disk) must be the same inode, so a copy is refused. */
static int
fc_place(const struct fc_instance *in, const char *name, const char *src,
    bool writable, char **errmsg)
{
	char *dst = moat_asprintf("%s/%s", in->root, name);
	char *abs = realpath(src, NULL);
	char *dst_abs = NULL;
	struct stat st;
	int err = 0;
	int rv = MOAT_OK;

	if (dst == NULL) {
		rv = MOAT_INTERNAL;
		*errmsg = strdup("out of memory");
		goto cleanup;
	}
	if (abs == NULL || stat(abs, &st) != 0) {
		err = errno;
		*errmsg = moat_asprintf("%s: %s", src, strerror(err));
		rv = moat_status_from_errno(err);
		goto cleanup;
	}
	if ((dst_abs = realpath(dst, NULL)) != NULL &&
	    strcmp(dst_abs, abs) == 0 && !in->jailed)
		goto cleanup; /* already in place (the scratch disk) */
	(void)unlink(dst);
	if (!in->jailed) {
		if (symlink(abs, dst) != 0)
			err = errno;
	} else if (link(abs, dst) == 0) {
		if (writable && chown(dst, in->jail.uid, in->jail.gid) != 0)
			err = errno;
		else if (!writable && !(st.st_mode & S_IROTH)) {
			/* Not readable by the jail's uid, and a shared
			 * inode must keep its owner: use a private copy. */
			(void)unlink(dst);
			err =
			    fc_copy_file(abs, dst, in->jail.uid, in->jail.gid);
		}
	} else if (errno == EXDEV && !writable) {
		err = fc_copy_file(abs, dst, in->jail.uid, in->jail.gid);
	} else if (errno == EXDEV) {
		*errmsg = moat_asprintf(
		    "%s and the jail %s are on different "
		    "file systems, and the writable disk must be hard-linked "
		    "into the jail: put [firecracker] chroot-base on the file "
		    "system of vmd's state directory",
		    src, in->root);
		rv = MOAT_FAILED_PRECONDITION;
		goto cleanup;
	} else {
		err = errno;
	}
	if (err != 0) {
		*errmsg = moat_asprintf("cannot put %s into %s as %s: %s", src,
		    in->root, name, strerror(err));
		rv = moat_status_from_errno(err);
	}
cleanup:
	free(dst_abs);
	free(abs);
	free(dst);
	return rv;
}

/* Creates `root`/`name` empty (Firecracker's logger and metrics want an
 * existing file) and gives it to the jail's uid. */
static int
fc_make_output(const struct fc_instance *in, const char *name, char **errmsg)
{
	char *path = moat_asprintf("%s/%s", in->root, name);
	int fd;
	int err = 0;

	if (path == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 ||
	    (in->jailed && fchown(fd, in->jail.uid, in->jail.gid) != 0))
		err = errno;
	if (fd >= 0)
		close(fd);
	if (err != 0) {
		*errmsg =
		    moat_asprintf("cannot create %s: %s", path, strerror(err));
		free(path);
		return moat_status_from_errno(err);
	}
	free(path);
	return MOAT_OK;
}

/* ---- instances ---- */

static void
fc_instance_fini(struct fc_instance *in)
{
	free(in->agent_socket);
	free(in->root);
	free(in->api_socket);
	moat_fc_jail_fini(&in->jail);
	memset(in, 0, sizeof(*in));
}

/* The slot of `vm`, or -1; fc_mu held. */
static int
fc_slot_of(const struct moat_vmm *vm)
{
	if (vm == NULL || vm->agent_socket == NULL)
		return -1;
	for (uint32_t i = 0; i < FC_MAX_SLOTS; i++)
		if (fc_slots[i].in_use && fc_slots[i].agent_socket != NULL &&
		    strcmp(fc_slots[i].agent_socket, vm->agent_socket) == 0)
			return (int)i;
	return -1;
}

/* A heap copy of vm's API socket path, or NULL with *errmsg. */
static char *
fc_api_socket_of(const struct moat_vmm *vm, char **errmsg)
{
	char *sock = NULL;
	int slot;

	pthread_mutex_lock(&fc_mu);
	if ((slot = fc_slot_of(vm)) >= 0)
		sock = strdup(fc_slots[slot].api_socket);
	pthread_mutex_unlock(&fc_mu);
	if (slot < 0)
		*errmsg = strdup("this VM was not started by the Firecracker "
		                 "driver, or was already released");
	else if (sock == NULL)
		*errmsg = strdup("out of memory");
	return sock;
}

/* Frees what vmd holds of vm: its slot, console thread and strings;
 * with `clean_jail`, also the jail folder and cgroup (the process is
 * gone), else they stay for the process that runs on. */
static void
fc_forget(struct moat_vmm *vm, bool clean_jail)
{
	struct fc_instance gone = { 0 };
	int slot;

	pthread_mutex_lock(&fc_mu);
	if ((slot = fc_slot_of(vm)) >= 0) {
		gone = fc_slots[slot];
		memset(&fc_slots[slot], 0, sizeof(fc_slots[slot]));
	}
	pthread_mutex_unlock(&fc_mu);
	if (gone.jailed && clean_jail)
		(void)moat_fc_jail_clean(&gone.jail);
	fc_instance_fini(&gone);
	vmd_console_close(vm->console);
	vm->console = NULL;
	free(vm->agent_socket);
	free(vm->console_log);
	free(vm->vmm_log);
	free(vm->ram_file);
	free(vm->adopt_info);
	vm->agent_socket = vm->console_log = vm->vmm_log = NULL;
	vm->ram_file = vm->adopt_info = NULL;
	vm->pid = 0;
}

static void
fc_release(struct moat_vmm *vm)
{
	fc_forget(vm, true);
}

/* Kills and reaps a Firecracker that start could not finish, then
 * releases vm. */
static void
fc_abort(struct moat_vmm *vm)
{
	if (vm->pid > 0) {
		(void)kill(vm->pid, SIGKILL);
		while (waitpid(vm->pid, NULL, 0) < 0 && errno == EINTR)
			;
	}
	fc_release(vm);
}

/* Which files to put in the working folder. */
struct fc_files {
	const char *kernel; /* NULL: not needed (snapshot load) */
	const char *initrd;
	const char *state_file; /* snapshot load only */
	const char *mem_file;
};

/* Allocates a slot, makes the working folder (the sandbox folder, or a
 * jail), and fills vm's paths. On failure vm is released. */
static int
fc_prepare(const char *binary, const struct moat_vmm_spec *spec,
    const struct fc_files *files, struct moat_vmm *vm,
    struct fc_instance **inp, char **errmsg)
{
	struct fc_instance *in = NULL;
	size_t sun_max = sizeof(((struct sockaddr_un *)0)->sun_path);
	uint32_t limit =
	    fc.cfg.use_jailer ? fc.cfg.jail.id_count : FC_MAX_SLOTS;
	uint32_t slot;
	int rv;

	memset(vm, 0, sizeof(*vm));
	pthread_mutex_lock(&fc_mu);
	for (slot = 0; slot < limit && fc_slots[slot].in_use; slot++)
		;
	if (slot < limit) {
		in = &fc_slots[slot];
		in->in_use = true;
	}
	pthread_mutex_unlock(&fc_mu);
	if (in == NULL) {
		*errmsg = moat_asprintf(
		    "all %u Firecracker slots (guest CIDs"
		    "%s) on this host are in use: destroy a sandbox first",
		    limit, fc.cfg.use_jailer ? ", jail uids" : "");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	in->jailed = fc.cfg.use_jailer;
	if (in->jailed) {
		if ((rv = moat_fc_jail_init(&fc.cfg.jail, binary,
		         spec->sandbox_id, slot, &in->jail, errmsg)) !=
		    MOAT_OK)
			goto fail;
		in->root = strdup(in->jail.root);
	} else {
		in->root = strdup(spec->dir);
	}
	vm->agent_socket = moat_asprintf("%s/%s", in->root, FC_VSOCK);
	in->api_socket = moat_asprintf("%s/%s", in->root, FC_API_SOCK);
	vm->console_log = moat_asprintf("%s/%s", spec->dir, FC_CONSOLE);
	vm->vmm_log = moat_asprintf("%s/%s", in->root, FC_LOG);
	pthread_mutex_lock(&fc_mu);
	in->agent_socket = vm->agent_socket ? strdup(vm->agent_socket) : NULL;
	pthread_mutex_unlock(&fc_mu);
	if (!in->root || !vm->agent_socket || !in->api_socket ||
	    !vm->console_log || !vm->vmm_log || !in->agent_socket) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if (strlen(vm->agent_socket) >= sun_max ||
	    strlen(in->api_socket) >= sun_max) {
		*errmsg =
		    moat_asprintf("socket path %s is too long for a Unix "
		                  "socket: use a shorter %s",
		        vm->agent_socket,
		        in->jailed ? "[firecracker] chroot-base" :
		                     "state directory");
		rv = MOAT_FAILED_PRECONDITION;
		goto fail;
	}
	if (in->jailed &&
	    (rv = moat_fc_jail_prepare(&fc.cfg.jail, &in->jail, errmsg)) !=
	        MOAT_OK)
		goto fail;
	(void)unlink(in->api_socket);
	(void)unlink(vm->agent_socket);
	if ((rv = fc_make_output(in, FC_LOG, errmsg)) != MOAT_OK ||
	    (rv = fc_make_output(in, FC_METRICS, errmsg)) != MOAT_OK)
		goto fail;
	if ((files->kernel != NULL &&
	        (rv = fc_place(in, FC_KERNEL, files->kernel, false, errmsg)) !=
	            MOAT_OK) ||
	    (files->initrd != NULL &&
	        (rv = fc_place(in, FC_INITRD, files->initrd, false, errmsg)) !=
	            MOAT_OK) ||
	    (rv = fc_place(in, FC_ROOTFS, spec->rootfs, false, errmsg)) !=
	        MOAT_OK ||
	    (rv = fc_place(in, FC_SCRATCH, spec->scratch_disk, true,
	         errmsg)) != MOAT_OK ||
	    (files->state_file != NULL &&
	        (rv = fc_place(in, FC_SNAP_STATE, files->state_file, false,
	             errmsg)) != MOAT_OK) ||
	    (files->mem_file != NULL &&
	        (rv = fc_place(in, FC_SNAP_MEM, files->mem_file, false,
	             errmsg)) != MOAT_OK))
		goto fail;
	*inp = in;
	return MOAT_OK;
fail:
	if (*errmsg == NULL)
		*errmsg = strdup("out of memory");
	pthread_mutex_lock(&fc_mu);
	if (in->jailed && in->jail.dir != NULL)
		(void)moat_fc_jail_clean(&in->jail);
	fc_instance_fini(in);
	pthread_mutex_unlock(&fc_mu);
	free(vm->agent_socket);
	free(vm->console_log);
	free(vm->vmm_log);
	memset(vm, 0, sizeof(*vm));
	return rv;
}

/* With --new-pid-ns the jailer forks Firecracker into a new pid
 * namespace, writes its pid and exits: wait for that, then adopt the
 * pid (vmd is a child subreaper, so it can reap it). */
static int
fc_adopt_jailed(struct moat_vmm *vm, const struct fc_instance *in,
    uint64_t deadline, char **errmsg)
{
	char *text = NULL;
	size_t len;
	long pid;
	int status;
	pid_t got;

	while ((got = waitpid(vm->pid, &status, WNOHANG)) == 0 &&
	    moat_rpc_now_ms() < deadline)
		vmd_sleep_ms(5);
	if (got == 0) {
		*errmsg =
		    moat_asprintf("the jailer (pid %d) did not hand over "
		                  "to Firecracker within %u ms",
		        (int)vm->pid, fc.cfg.api_timeout_ms);
		return MOAT_DEADLINE_EXCEEDED;
	}
	if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		char *how;

		vmd_console_settle(vm->console, 200);
		how = fc_exit_report(status, vm->console_log, vm->vmm_log);

		vm->pid = 0;
		*errmsg =
		    moat_asprintf("the jailer failed: %s", how ? how : "?");
		free(how);
		return MOAT_FAILED_PRECONDITION;
	}
	vm->pid = 0;
	if (moat_read_file(in->jail.pid_file, 64, &text, &len) != 0 ||
	    (pid = strtol(text, NULL, 10)) <= 1) {
		free(text);
		*errmsg = moat_asprintf("the jailer exited without writing "
		                        "Firecracker's pid to %s",
		    in->jail.pid_file);
		return MOAT_INTERNAL;
	}
	free(text);
	vm->pid = (pid_t)pid;
	return MOAT_OK;
}

/* Waits until the API of the Firecracker just spawned as vm->pid
 * answers, or it exits early (bad arguments, no KVM: vm->pid is then 0),
 * or `deadline` passes. Returns 0 or a status with *errmsg. */
static int
fc_await_api(const struct moat_vmm_spec *spec, const struct fc_instance *in,
    struct moat_vmm *vm, uint64_t deadline, char **errmsg)
{
	int status;
	int rv;

	/* The API socket appears a few ms after exec. */
	for (;;) {
		json_t *info = NULL;
		char *why = NULL;
		pid_t got = waitpid(vm->pid, &status, WNOHANG);

		if (got == vm->pid) {
			char *how;

			vmd_console_settle(vm->console, 200);
			how = fc_exit_report(status, vm->console_log,
			    vm->vmm_log);

			vm->pid = 0;
			*errmsg = moat_asprintf(
			    "Firecracker for sandbox %s "
			    "exited before its API was ready: %s",
			    spec->sandbox_id, how ? how : "?");
			free(how);
			return MOAT_FAILED_PRECONDITION;
		}
		rv = moat_fc_api_call(in->api_socket, "GET", "/", NULL,
		    fc.cfg.api_timeout_ms, &info, &why);
		json_decref(info);
		if (rv == MOAT_OK) {
			free(why);
			return MOAT_OK;
		}
		if (rv != MOAT_UNAVAILABLE || moat_rpc_now_ms() >= deadline) {
			*errmsg = moat_asprintf(
			    "Firecracker for sandbox %s "
			    "did not answer on %s within %u ms (%s): see %s",
			    spec->sandbox_id, in->api_socket,
			    fc.cfg.api_timeout_ms, why ? why : "?",
			    vm->console_log);
			free(why);
			return MOAT_DEADLINE_EXCEEDED;
		}
		free(why);
		vmd_sleep_ms(5);
	}
}

/* Spawns Firecracker (or the jailer) for `in`, waits for its API to
 * answer, and sets up its logger and metrics. On failure the process is
 * killed and reaped and vm released. */
static int
fc_launch(const char *binary, const struct moat_vmm_spec *spec,
    struct fc_instance *in, struct moat_vmm *vm, char **errmsg)
{
	/* Jailed, the jailer passes --id itself (it execs Firecracker with
	 * "--id <id>" before the arguments after "--"), and Firecracker's
	 * parser refuses an argument given twice: exit 153. */
	const char *fc_args[] = { binary, "--api-sock",
		in->jailed ? "/" FC_API_SOCK : FC_API_SOCK,
		in->jailed ? NULL : "--id", spec->sandbox_id, NULL };
	struct moat_spawn_req req = { 0 };
	char **jail_argv = NULL;
	uint64_t deadline;
	char *pidfile = NULL;
	char *pidtext = NULL;
	char *fifo = NULL;
	json_t *body = NULL;
	int console_fd = -1;
	int rv;

	if (in->jailed) {
		jail_argv = moat_fc_jail_argv(&fc.cfg.jail, &in->jail, binary,
		    spec->vcpus, spec->memory_mib, fc_args + 1);
		if (jail_argv == NULL) {
			*errmsg = strdup("out of memory");
			rv = MOAT_INTERNAL;
			goto fail;
		}
		req.argv = (const char *const *)jail_argv;
	} else {
		req.argv = fc_args;
		req.cwd = in->root;
	}
	/* Its stdout is the guest's serial console: a named pipe vmd
	 * drains into a capped console.log (console.h), so that a vmd
	 * started later drains the same one (fc_adopt). While no vmd reads,
	 * Firecracker's writes fail with EPIPE: its SIGPIPE handler only
	 * counts the signal, and the serial output is dropped. */
	if ((fifo = moat_asprintf("%s/" FC_CONSOLE_FIFO, spec->dir)) == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if ((rv = vmd_console_open_fifo(vm->console_log, fifo,
	         spec->console_max_bytes, &vm->console, &console_fd,
	         errmsg)) != MOAT_OK)
		goto fail;
	req.output_fd = console_fd;
	/* No parent-death signal: a restarted vmd re-adopts it. Jailed,
	 * the jailer drops to the jail's uid (which clears that signal
	 * anyway) and, with --new-pid-ns, forks Firecracker, which then
	 * never had one. */
	req.outlive_vmd = true;
	rv = moat_spawn(&req, &vm->pid, errmsg);
	close(console_fd); /* Firecracker holds its own */
	if (rv != MOAT_OK)
		goto fail;
	deadline = moat_rpc_now_ms() + fc.cfg.api_timeout_ms;
	if (in->jailed && fc.cfg.jail.new_pid_ns &&
	    (rv = fc_adopt_jailed(vm, in, deadline, errmsg)) != MOAT_OK)
		goto fail;
	/* For reap_orphan after a vmd crash. */
	pidfile = moat_asprintf("%s/%s", spec->dir, FC_PID);
	pidtext = moat_asprintf("%d\n", (int)vm->pid);
	if (pidfile == NULL || pidtext == NULL ||
	    moat_write_file_atomic(pidfile, pidtext, strlen(pidtext), 0600) !=
	        0) {
		*errmsg = moat_asprintf("cannot write %s",
		    pidfile ? pidfile : FC_PID);
		rv = MOAT_INTERNAL;
		goto fail;
	}

	if ((rv = fc_await_api(spec, in, vm, deadline, errmsg)) != MOAT_OK)
		goto fail;
	body = json_pack("{s:s, s:s, s:b, s:b}", "log_path", FC_LOG, "level",
	    "Info", "show_level", 1, "show_log_origin", 0);
	if ((rv = moat_fc_api_call(in->api_socket, "PUT", "/logger", body,
	         fc.cfg.api_timeout_ms, NULL, errmsg)) != MOAT_OK)
		goto fail;
	json_decref(body);
	body = json_pack("{s:s}", "metrics_path", FC_METRICS);
	if ((rv = moat_fc_api_call(in->api_socket, "PUT", "/metrics", body,
	         fc.cfg.api_timeout_ms, NULL, errmsg)) != MOAT_OK)
		goto fail;
	json_decref(body);
	body = NULL;
	/* What a restarted vmd needs to find this instance again. */
	if ((vm->adopt_info = moat_asprintf("slot=%u jailed=%d root=%s",
	         (unsigned)(in - fc_slots), in->jailed ? 1 : 0, in->root)) ==
	    NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	moat_fc_jail_argv_free(jail_argv);
	free(pidfile);
	free(pidtext);
	free(fifo);
	return MOAT_OK;
fail:
	json_decref(body);
	moat_fc_jail_argv_free(jail_argv);
	if (pidfile != NULL)
		(void)unlink(pidfile);
	if (fifo != NULL)
		(void)unlink(fifo);
	free(pidfile);
	free(pidtext);
	free(fifo);
	fc_abort(vm);
	return rv;
}

/* One configuration call during start; on failure names the sandbox and
 * where to look. */
static int
fc_put(const char *sandbox_id, const char *api_socket, const char *path,
    json_t *body, const char *log, char **errmsg)
{
	char *why = NULL;
	int rv;

	if (body == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	rv = moat_fc_api_call(api_socket, "PUT", path, body,
	    fc.cfg.api_timeout_ms, NULL, &why);
	json_decref(body);
	if (rv != MOAT_OK) {
		*errmsg = moat_asprintf("configuring Firecracker for sandbox "
		                        "%s failed: %s (its log: %s)",
		    sandbox_id, why ? why : "?", log);
		free(why);
	}
	return rv;
}

static int
fc_start(const char *binary, const struct moat_vmm_spec *spec,
    struct moat_vmm *vm, char **errmsg)
{
	struct fc_files files = { 0 };
	struct fc_instance *in = NULL;
	char *kernel = NULL;
	char *abs = NULL;
	char *cmdline = NULL;
	uint32_t cid;
	int rv;

	*errmsg = NULL;
	memset(vm, 0, sizeof(*vm));
	if (spec->accel != NULL && strcmp(spec->accel, "tcg") == 0) {
		*errmsg = moat_asprintf(
		    "sandbox %s asks for TCG, and "
		    "Firecracker runs only on KVM: use driver=qemu on hosts "
		    "without a usable /dev/kvm",
		    spec->sandbox_id);
		return MOAT_FAILED_PRECONDITION;
	}
	if ((abs = fc_find_binary(binary)) == NULL) {
		*errmsg = fc_not_found_text("firecracker", binary);
		return MOAT_FAILED_PRECONDITION;
	}
	if ((rv = fc_pick_kernel(spec->kernel, &kernel, errmsg)) != MOAT_OK)
		goto cleanup;
	files.kernel = kernel;
	files.initrd = spec->initrd;
	if ((rv = fc_prepare(abs, spec, &files, vm, &in, errmsg)) != MOAT_OK)
		goto cleanup;
	cid = FC_CID_BASE + (uint32_t)(in - fc_slots);
	if ((rv = fc_launch(abs, spec, in, vm, errmsg)) != MOAT_OK)
		goto cleanup;

	cmdline = spec->extra_cmdline ?
	    moat_asprintf("%s moat.vsock=%u %s", FC_CMDLINE, fc.cfg.vsock_port,
	        spec->extra_cmdline) :
	    moat_asprintf("%s moat.vsock=%u", FC_CMDLINE, fc.cfg.vsock_port);
	if (cmdline == NULL) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if ((rv = fc_put(spec->sandbox_id, in->api_socket, "/machine-config",
	         fc.cfg.track_dirty_pages ?
	             json_pack("{s:i, s:i, s:b, s:b}", "vcpu_count",
	                 (int)spec->vcpus, "mem_size_mib",
	                 (int)spec->memory_mib, "smt", 0, "track_dirty_pages",
	                 1) :
	             json_pack("{s:i, s:i, s:b}", "vcpu_count",
	                 (int)spec->vcpus, "mem_size_mib",
	                 (int)spec->memory_mib, "smt", 0),
	         vm->vmm_log, errmsg)) != MOAT_OK ||
	    (rv = fc_put(spec->sandbox_id, in->api_socket, "/boot-source",
	         spec->initrd ?
	             json_pack("{s:s, s:s, s:s}", "kernel_image_path",
	                 FC_KERNEL, "initrd_path", FC_INITRD, "boot_args",
	                 cmdline) :
	             json_pack("{s:s, s:s}", "kernel_image_path", FC_KERNEL,
	                 "boot_args", cmdline),
	         vm->vmm_log, errmsg)) != MOAT_OK ||
	    (rv = fc_put(spec->sandbox_id, in->api_socket, "/drives/rootfs",
	         json_pack("{s:s, s:s, s:b, s:b}", "drive_id", "rootfs",
	             "path_on_host", FC_ROOTFS, "is_root_device", 0,
	             "is_read_only", 1),
	         vm->vmm_log, errmsg)) != MOAT_OK ||
	    (rv = fc_put(spec->sandbox_id, in->api_socket, "/drives/scratch",
	         json_pack("{s:s, s:s, s:b, s:b}", "drive_id", "scratch",
	             "path_on_host", FC_SCRATCH, "is_root_device", 0,
	             "is_read_only", 0),
	         vm->vmm_log, errmsg)) != MOAT_OK ||
	    (rv = fc_put(spec->sandbox_id, in->api_socket, "/vsock",
	         json_pack("{s:i, s:s}", "guest_cid", (int)cid, "uds_path",
	             FC_VSOCK),
	         vm->vmm_log, errmsg)) != MOAT_OK ||
	    (rv = fc_put(spec->sandbox_id, in->api_socket, "/actions",
	         json_pack("{s:s}", "action_type", "InstanceStart"),
	         vm->vmm_log, errmsg)) != MOAT_OK)
		goto fail;
	rv = MOAT_OK;
	goto cleanup;
fail:
	fc_abort(vm);
cleanup:
	free(cmdline);
	free(kernel);
	free(abs);
	return rv;
}

int
moat_fc_snapshot_load(const char *binary, const struct moat_vmm_spec *spec,
    const char *state_file, const char *mem_file, bool resume,
    struct moat_vmm *vm, char **errmsg)
{
	struct fc_files files = { 0 };
	struct fc_instance *in = NULL;
	json_t *body;
	char *abs = NULL;
	int rv;

	*errmsg = NULL;
	memset(vm, 0, sizeof(*vm));
	if ((abs = fc_find_binary(binary)) == NULL) {
		*errmsg = fc_not_found_text("firecracker", binary);
		return MOAT_FAILED_PRECONDITION;
	}
	files.state_file = state_file;
	files.mem_file = mem_file;
	if ((rv = fc_prepare(abs, spec, &files, vm, &in, errmsg)) != MOAT_OK ||
	    (rv = fc_launch(abs, spec, in, vm, errmsg)) != MOAT_OK)
		goto cleanup;
	body = json_pack("{s:s, s:{s:s, s:s}, s:b}", "snapshot_path",
	    FC_SNAP_STATE, "mem_backend", "backend_type", "File",
	    "backend_path", FC_SNAP_MEM, "resume_vm", resume ? 1 : 0);
	if (body != NULL && fc.cfg.track_dirty_pages)
		json_object_set_new(body, "track_dirty_pages", json_true());
	if ((rv = fc_put(spec->sandbox_id, in->api_socket, "/snapshot/load",
	         body, vm->vmm_log, errmsg)) != MOAT_OK)
		fc_abort(vm);
cleanup:
	free(abs);
	return rv;
}

static int
fc_vm_state(const struct moat_vmm *vm, const char *state, char **errmsg)
{
	char *sock;
	char *why = NULL;
	json_t *body;
	int rv;

	*errmsg = NULL;
	if ((sock = fc_api_socket_of(vm, errmsg)) == NULL)
		return MOAT_FAILED_PRECONDITION;
	body = json_pack("{s:s}", "state", state);
	rv = body ? moat_fc_api_call(sock, "PATCH", "/vm", body,
	                fc.cfg.api_timeout_ms, NULL, &why) :
	            MOAT_INTERNAL;
	json_decref(body);
	if (rv != MOAT_OK)
		*errmsg =
		    moat_asprintf("setting the VM (pid %d) to %s failed: "
		                  "%s (its log: %s)",
		        (int)vm->pid, state, why ? why : "out of memory",
		        vm->vmm_log);
	free(why);
	free(sock);
	return rv;
}

int
moat_fc_vm_pause(const struct moat_vmm *vm, char **errmsg)
{
	return fc_vm_state(vm, "Paused", errmsg);
}

int
moat_fc_vm_resume(const struct moat_vmm *vm, char **errmsg)
{
	return fc_vm_state(vm, "Resumed", errmsg);
}

int
moat_fc_snapshot_create(const struct moat_vmm *vm, const char *name, bool diff,
    char **state_file, char **mem_file, char **errmsg)
{
	char *sock = NULL;
	char *why = NULL;
	char *state_rel = NULL;
	char *mem_rel = NULL;
	char *root = NULL;
	json_t *body = NULL;
	int rv;

	*errmsg = NULL;
	*state_file = *mem_file = NULL;
	if (!fc_name_ok(name)) {
		*errmsg = moat_asprintf("snapshot name \"%s\" must be 1 to 64 "
		                        "of a-z, A-Z, 0-9, '-', '_'",
		    name ? name : "(null)");
		return MOAT_INVALID_ARGUMENT;
	}
	if (diff && !fc.cfg.track_dirty_pages) {
		*errmsg = strdup(
		    "a Diff snapshot needs dirty page tracking: "
		    "set [firecracker] track-dirty-pages=true (new sandboxes "
		    "only) or take a Full snapshot");
		return MOAT_FAILED_PRECONDITION;
	}
	if ((sock = fc_api_socket_of(vm, errmsg)) == NULL)
		return MOAT_FAILED_PRECONDITION;
	state_rel = moat_asprintf("%s.vmstate", name);
	mem_rel = moat_asprintf("%s.mem", name);
	root = strdup(sock);
	if (root != NULL && strrchr(root, '/') != NULL)
		*strrchr(root, '/') = '\0';
	body = json_pack("{s:s, s:s, s:s}", "snapshot_path",
	    state_rel ? state_rel : "", "mem_file_path",
	    mem_rel ? mem_rel : "", "snapshot_type", diff ? "Diff" : "Full");
	if (!state_rel || !mem_rel || !root || !body) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto cleanup;
	}
	rv = moat_fc_api_call(sock, "PUT", "/snapshot/create", body,
	    fc.cfg.api_timeout_ms, NULL, &why);
	if (rv != MOAT_OK) {
		*errmsg =
		    moat_asprintf("snapshot %s of the VM (pid %d) "
		                  "failed: %s (pause it first; its log: %s)",
		        name, (int)vm->pid, why ? why : "?", vm->vmm_log);
		goto cleanup;
	}
	*state_file = moat_asprintf("%s/%s", root, state_rel);
	*mem_file = moat_asprintf("%s/%s", root, mem_rel);
	if (*state_file == NULL || *mem_file == NULL) {
		free(*state_file);
		free(*mem_file);
		*state_file = *mem_file = NULL;
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
	}
cleanup:
	json_decref(body);
	free(why);
	free(root);
	free(state_rel);
	free(mem_rel);
	free(sock);
	return rv;
}

/* ---- the agent link: Firecracker's hybrid vsock ---- */

static int
fc_connect_agent(const struct moat_vmm *vm, int *fd, char **errmsg)
{
	struct timeval tv = { FC_HANDSHAKE_MS / 1000,
		(FC_HANDSHAKE_MS % 1000) * 1000 };
	struct timeval none = { 0, 0 };
	char hello[32];
	char answer[32];
	size_t got = 0;
	int s;
	int rv;

	*fd = -1;
	if ((rv = vmd_unix_connect(vm->agent_socket, &s, errmsg)) != MOAT_OK)
		return rv;
	(void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	snprintf(hello, sizeof(hello), "CONNECT %u\n", fc.cfg.vsock_port);
	if (send(s, hello, strlen(hello), MSG_NOSIGNAL) !=
	    (ssize_t)strlen(hello)) {
		close(s);
		return MOAT_UNAVAILABLE;
	}
	/* Byte by byte: what follows the newline is the agent's stream. */
	while (got < sizeof(answer) - 1) {
		ssize_t n = recv(s, answer + got, 1, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			/* Firecracker closes when nothing in the guest
			 * listens on the port yet: the agent is booting. */
			close(s);
			return MOAT_UNAVAILABLE;
		}
		if (answer[got++] == '\n')
			break;
	}
	answer[got] = '\0';
	if (strncmp(answer, "OK ", 3) != 0 || answer[got - 1] != '\n') {
		close(s);
		answer[strcspn(answer, "\n")] = '\0';
		*errmsg = moat_asprintf(
		    "the vsock socket %s answered \"%s\" "
		    "to CONNECT %u, not \"OK <port>\": is it a Firecracker "
		    "vsock?",
		    vm->agent_socket, answer, fc.cfg.vsock_port);
		return MOAT_INTERNAL;
	}
	(void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
	(void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
	*fd = s;
	return MOAT_OK;
}

static bool
fc_reap_orphan(const char *dir, const char *id)
{
	char *pidfile = moat_asprintf("%s/%s", dir, FC_PID);
	/* Firecracker runs with `--id <id>`: that argument marks it. */
	bool killed = vmd_kill_orphan(pidfile, id, true);

	free(pidfile);
	if (fc.cfg.use_jailer) {
		struct moat_fc_jail j = { 0 };
		char *err = NULL;

		if (moat_fc_jail_init(&fc.cfg.jail,
		        fc.binary ? fc.binary : "firecracker", id, 0, &j,
		        &err) == MOAT_OK)
			(void)moat_fc_jail_clean(&j);
		free(err);
		moat_fc_jail_fini(&j);
	}
	return killed;
}

/* ---- adoption by a restarted vmd ---- */

/* How long an adoption waits for the API to answer. */
#define FC_ADOPT_API_MS 5000u

/* detach (vmm.h): frees what vmd holds of vm (its slot, console thread,
 * strings) and leaves the Firecracker running, with its jail, cgroup,
 * sockets and files, for the next vmd. */
static void
fc_detach(struct moat_vmm *vm)
{
	fc_forget(vm, false);
}

/* Parses adopt_info ("slot=N jailed=0|1 root=PATH") into *slot,
 * *jailed and *root (heap). Returns 0 or a status with *errmsg. */
static int
fc_adopt_parse(const char *info, uint32_t *slot, bool *jailed, char **root,
    char **errmsg)
{
	unsigned s = 0;
	int j = -1, at = -1;

	*root = NULL;
	if (info == NULL) {
		*errmsg =
		    strdup("its state file has no vmm-info line (it was "
		           "written by a vmd that could not re-adopt "
		           "Firecracker VMMs), so its Firecracker cannot "
		           "be found again");
		return MOAT_FAILED_PRECONDITION;
	}
	if (sscanf(info, "slot=%u jailed=%d root=%n", &s, &j, &at) != 2 ||
	    at < 0 || (j != 0 && j != 1) || info[at] != '/' ||
	    s >= FC_MAX_SLOTS) {
		*errmsg = moat_asprintf("its state file's vmm-info \"%.120s\" "
		                        "is not \"slot=N jailed=0|1 "
		                        "root=/PATH\"",
		    info);
		return MOAT_INVALID_ARGUMENT;
	}
	*slot = s;
	*jailed = j == 1;
	if ((*root = strdup(info + at)) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* Claims slot `slot` for `in` (filled: moved into the table, *in
 * zeroed). Returns 0, or a status with *errmsg when another sandbox of
 * this vmd holds it. */
static int
fc_adopt_claim(uint32_t slot, struct fc_instance *in, char **errmsg)
{
	uint32_t limit =
	    fc.cfg.use_jailer ? fc.cfg.jail.id_count : FC_MAX_SLOTS;
	int rv = MOAT_OK;

	pthread_mutex_lock(&fc_mu);
	if (slot >= limit) {
		*errmsg =
		    moat_asprintf("its Firecracker holds slot %u, beyond "
		                  "the %u this vmd has ([firecracker] "
		                  "id-count changed?)",
		        slot, limit);
		rv = MOAT_FAILED_PRECONDITION;
	} else if (fc_slots[slot].in_use) {
		*errmsg = moat_asprintf("its Firecracker's slot %u (guest CID "
		                        "%u) is held by another sandbox here",
		    slot, FC_CID_BASE + slot);
		rv = MOAT_FAILED_PRECONDITION;
	} else {
		fc_slots[slot] = *in;
		fc_slots[slot].in_use = true;
		memset(in, 0, sizeof(*in));
	}
	pthread_mutex_unlock(&fc_mu);
	return rv;
}

/* Asks the API of the adopted Firecracker whether it runs sandbox `id`'s
 * guest, and lets a guest that an interrupted snapshot left paused run
 * again. */
static int
fc_adopt_check(const char *api_socket, const char *id, char **errmsg)
{
	json_t *info = NULL, *body;
	const char *state, *got_id;
	char *why = NULL;
	int rv;

	rv = moat_fc_api_call(api_socket, "GET", "/", NULL, FC_ADOPT_API_MS,
	    &info, &why);
	if (rv != MOAT_OK) {
		*errmsg =
		    moat_asprintf("its API socket %s does not answer: %s",
		        api_socket, why ? why : "?");
		free(why);
		return rv == MOAT_UNAVAILABLE ? MOAT_FAILED_PRECONDITION : rv;
	}
	state = json_string_value(json_object_get(info, "state"));
	got_id = json_string_value(json_object_get(info, "id"));
	if (got_id != NULL && strcmp(got_id, id) != 0) {
		*errmsg = moat_asprintf("the Firecracker on %s runs instance "
		                        "\"%.80s\", not %s",
		    api_socket, got_id, id);
		rv = MOAT_FAILED_PRECONDITION;
	} else if (state != NULL && strcmp(state, "Paused") == 0) {
		/* A snapshot's pause whose vmd died before it resumed. */
		body = json_pack("{s:s}", "state", "Resumed");
		rv = body ? moat_fc_api_call(api_socket, "PATCH", "/vm", body,
		                FC_ADOPT_API_MS, NULL, &why) :
		            MOAT_INTERNAL;
		json_decref(body);
		if (rv != MOAT_OK)
			*errmsg = moat_asprintf("its paused VM did not "
			                        "resume: %s",
			    why ? why : "out of memory");
	} else if (state == NULL || strcmp(state, "Running") != 0) {
		*errmsg = moat_asprintf("Firecracker says the VM is \"%s\", "
		                        "not Running",
		    state ? state : "?");
		rv = MOAT_FAILED_PRECONDITION;
	}
	free(why);
	json_decref(info);
	return rv;
}

/* The instance of the adopted Firecracker as fc_prepare would have made
 * it, in *in (the caller finis it). */
static int
fc_adopt_instance(const struct moat_vmm_spec *spec, uint32_t slot, bool jailed,
    char *root, struct fc_instance *in, char **errmsg)
{
	int rv;

	in->jailed = jailed;
	in->root = root;
	if (jailed != fc.cfg.use_jailer) {
		*errmsg = moat_asprintf("its Firecracker was started %s the "
		                        "jailer, and this vmd runs with "
		                        "[firecracker] jailer = %s",
		    jailed ? "under" : "without",
		    fc.cfg.use_jailer ? "true" : "false");
		return MOAT_FAILED_PRECONDITION;
	}
	if (jailed) {
		if ((rv = moat_fc_jail_init(&fc.cfg.jail,
		         fc.binary ? fc.binary : "firecracker",
		         spec->sandbox_id, slot, &in->jail, errmsg)) !=
		    MOAT_OK)
			return rv;
		if (strcmp(in->jail.root, root) != 0) {
			*errmsg =
			    moat_asprintf("its jail is %s, and this "
			                  "vmd's jail settings make it %s "
			                  "([firecracker] chroot-base "
			                  "changed?)",
			        root, in->jail.root);
			return MOAT_FAILED_PRECONDITION;
		}
	}
	in->api_socket = moat_asprintf("%s/" FC_API_SOCK, root);
	in->agent_socket = moat_asprintf("%s/" FC_VSOCK, root);
	if (in->api_socket == NULL || in->agent_socket == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* adopt (vmm.h): the Firecracker that an earlier vmd started for
 * spec->dir, found again from spec->adopt_info: its pid must still run
 * with `--id <sandbox id>` (not a recycled pid), its API must answer
 * with that id and a Running (or snapshot-Paused) VM; then its slot,
 * jail and console are taken over as start had them. */
static int
fc_adopt(const struct moat_vmm_spec *spec, pid_t pid, uid_t jail_uid,
    struct moat_vmm *vm, char **errmsg)
{
	struct fc_instance in = { 0 };
	char *root = NULL, *fifo = NULL;
	uint32_t slot = 0;
	bool jailed = false;
	int rv;

	(void)jail_uid; /* a Firecracker jail is the driver's own */
	*errmsg = NULL;
	memset(vm, 0, sizeof(*vm));
	if ((rv = fc_adopt_parse(spec->adopt_info, &slot, &jailed, &root,
	         errmsg)) != MOAT_OK)
		return rv;
	rv = fc_adopt_instance(spec, slot, jailed, root, &in, errmsg);
	if (rv != MOAT_OK)
		goto fail;
	/* Not a recycled pid: Firecracker runs with `--id <sandbox id>`. */
	if ((rv = vmd_vmm_check_pid(pid, spec->sandbox_id, true, errmsg)) !=
	        MOAT_OK ||
	    (rv = fc_adopt_check(in.api_socket, spec->sandbox_id, errmsg)) !=
	        MOAT_OK)
		goto fail;
	vm->pid = pid;
	vm->agent_socket = strdup(in.agent_socket);
	vm->console_log = moat_asprintf("%s/" FC_CONSOLE, spec->dir);
	vm->vmm_log = moat_asprintf("%s/" FC_LOG, root);
	vm->adopt_info = strdup(spec->adopt_info);
	fifo = moat_asprintf("%s/" FC_CONSOLE_FIFO, spec->dir);
	if (!vm->agent_socket || !vm->console_log || !vm->vmm_log ||
	    !vm->adopt_info || !fifo) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if ((rv = vmd_console_attach(vm->console_log, fifo,
	         spec->console_max_bytes, &vm->console, errmsg)) != MOAT_OK ||
	    (rv = fc_adopt_claim(slot, &in, errmsg)) != MOAT_OK)
		goto fail;
	free(fifo);
	return MOAT_OK;
fail:
	free(fifo);
	fc_instance_fini(&in); /* root included; nothing of it cleaned */
	/* Nothing of the VMM is undone: the caller decides. */
	fc_detach(vm);
	memset(vm, 0, sizeof(*vm));
	return rv;
}

/* ---- vmm.h's snapshot, restore and resume ---- */

/* The name the snapshot op gives Firecracker's files in the VM's folder;
 * they are moved into the snapshot directory at once. */
#define FC_OP_SNAP "moat-snapshot"

/* Moves `from` to the new name `to`: a rename, or a sparse copy when they
 * are on different filesystems (a jail root elsewhere). Returns 0 (from
 * is gone) or an errno value (to is not there). */
static int
fc_move(const char *from, const char *to)
{
	int err;

	if (rename(from, to) == 0)
		return 0;
	if (errno != EXDEV)
		return errno;
	if ((err = vmd_copy_sparse(from, to, NULL)) != 0)
		return err;
	(void)unlink(from);
	return 0;
}

/* Allocated bytes of `path`, 0 when it cannot be read. */
static uint64_t
fc_allocated(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

/* snapshot (vmm.h): pause, a Full snapshot, its two files moved into
 * snap_dir as device_state and ram, the scratch disk copied while still
 * paused (Firecracker's snapshot has no disks), resume whatever happened.
 * Each API call is bounded by [firecracker] api-timeout-ms rather than
 * by timeout_ms. */
static int
fc_snapshot(const struct moat_vmm *vm, const char *scratch_disk,
    const char *snap_dir, uint32_t timeout_ms, bool leave_paused,
    struct moat_vmm_snapshot_stats *st, char **errmsg)
{
	char *state =
	    moat_asprintf("%s/" MOAT_VMM_SNAP_DEVICE_STATE, snap_dir);
	char *ram = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, snap_dir);
	char *disk = moat_asprintf("%s/" MOAT_VMM_SNAP_SCRATCH, snap_dir);
	char *state_file = NULL; /* Firecracker's files; owned here */
	char *mem_file = NULL;
	bool paused = false;
	double t0 = 0;
	int rv, err;

	(void)timeout_ms;
	*errmsg = NULL;
	memset(st, 0, sizeof(*st));
	if (!state || !ram || !disk) {
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto cleanup;
	}
	t0 = vmd_now_ms_exact();
	if ((rv = moat_fc_vm_pause(vm, errmsg)) != MOAT_OK)
		goto cleanup;
	paused = true;
	if ((rv = moat_fc_snapshot_create(vm, FC_OP_SNAP, false, &state_file,
	         &mem_file, errmsg)) != MOAT_OK)
		goto cleanup;
	if ((err = fc_move(state_file, state)) != 0 ||
	    (err = fc_move(mem_file, ram)) != 0) {
		*errmsg = moat_asprintf("cannot move Firecracker's snapshot "
		                        "files %s and %s into %s: %s",
		    state_file, mem_file, snap_dir, strerror(err));
		rv = moat_status_from_errno(err);
		goto cleanup;
	}
	if ((err = vmd_copy_sparse(scratch_disk, disk, &st->disk_bytes)) !=
	    0) {
		*errmsg =
		    moat_asprintf("cannot copy scratch disk %s to %s: %s",
		        scratch_disk, disk, strerror(err));
		rv = moat_status_from_errno(err);
		goto cleanup;
	}
	st->device_state_bytes = fc_allocated(state);
	st->ram_bytes = fc_allocated(ram);
	rv = MOAT_OK;
cleanup:
	if (paused && leave_paused && rv == MOAT_OK) {
		st->pause_ms = vmd_now_ms_exact() - t0; /* so far */
	} else if (paused) {
		char *rerr = NULL;

		/* A failed snapshot must not leave the sandbox paused. */
		if (moat_fc_vm_resume(vm, &rerr) != MOAT_OK && rv == MOAT_OK) {
			*errmsg = moat_asprintf("the VM did not resume after "
			                        "the snapshot: %s",
			    rerr ? rerr : "?");
			rv = MOAT_INTERNAL;
		}
		free(rerr);
		st->pause_ms = vmd_now_ms_exact() - t0;
	}
	/* Moved already on success; otherwise nothing may stay behind. */
	if (state_file != NULL)
		(void)unlink(state_file);
	if (mem_file != NULL)
		(void)unlink(mem_file);
	free(state_file);
	free(mem_file);
	free(state);
	free(ram);
	free(disk);
	return rv;
}

/* unpause (vmm.h): a VM a snapshot left paused runs again (each API
 * call is bounded by [firecracker] api-timeout-ms). */
static int
fc_unpause(const struct moat_vmm *vm, uint32_t timeout_ms, char **errmsg)
{
	(void)timeout_ms;
	*errmsg = NULL;
	return moat_fc_vm_resume(vm, errmsg);
}

/* restore (vmm.h): a fresh Firecracker loads snap_dir's device_state and
 * ram and resumes at once, unlike QEMU's restore: vmd connects the agent
 * before it calls resume, and Firecracker answers a vsock CONNECT only
 * when the guest does, so a paused guest would never be reached. A guest
 * that runs before vmd connects loses nothing: its agent listens on
 * vsock and greets the new connection (the snapshot's was reset). */
static int
fc_restore(const char *binary, const struct moat_vmm_spec *spec,
    const char *snap_dir, struct moat_vmm *vm, char **errmsg)
{
	char *state =
	    moat_asprintf("%s/" MOAT_VMM_SNAP_DEVICE_STATE, snap_dir);
	char *ram = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, snap_dir);
	int rv;

	if (state == NULL || ram == NULL) {
		memset(vm, 0, sizeof(*vm));
		*errmsg = strdup("out of memory");
		rv = MOAT_INTERNAL;
	} else {
		rv = moat_fc_snapshot_load(binary, spec, state, ram, true, vm,
		    errmsg);
	}
	free(state);
	free(ram);
	return rv;
}

/* resume (vmm.h): the device state was loaded, and the guest let run,
 * by fc_restore already; resuming again is harmless and says whether the
 * VM still answers (bounded by api-timeout-ms). */
static int
fc_resume(const struct moat_vmm *vm, const char *snap_dir, uint32_t timeout_ms,
    char **errmsg)
{
	(void)snap_dir;
	(void)timeout_ms;
	return moat_fc_vm_resume(vm, errmsg);
}

const struct moat_vmm_ops moat_vmm_firecracker = {
	.name = "firecracker",
	.probe = fc_probe,
	.start = fc_start,
	.connect_agent = fc_connect_agent,
	.stop = vmd_vmm_signal,
	.release = fc_release,
	.reap_orphan = fc_reap_orphan,
	.adopt = fc_adopt,
	.detach = fc_detach,
	.snapshot = fc_snapshot,
	.unpause = fc_unpause,
	.restore = fc_restore,
	.resume = fc_resume,
	.snapshot_resets_agent_link = true,
};
