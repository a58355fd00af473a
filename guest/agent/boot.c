/*
 * boot.c: what moat-agent does as PID 1 of a moat guest before it serves
 * the guest link (the contract is in boot.h): it mounts /dev, /proc and
 * /sys in the initramfs, loads the kernel modules listed in
 * /etc/moat/modules, finds the image and scratch disks (by ext4 label,
 * read from the superblock, or by /dev path), mounts the image read-only
 * and the scratch disk read-write, joins them in an overlay, switches
 * root into it, and finds the virtio-serial port vmd talks on. It also
 * powers the VM off. Not for: anything after boot (the guest protocol,
 * exec, the fs trace walk itself; those are the rest of guest/agent).
 * It is small on purpose: every millisecond here is on the cold-boot path.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "boot.h"

#define BOOT_DEVICE_WAIT_MS 10000 /* disks and the port, all together */
#define BOOT_POLL_MS 2
#define BOOT_DEFAULT_ROOT "LABEL=moat-root"
#define BOOT_DEFAULT_SCRATCH "LABEL=moat-scratch"
#define BOOT_DEFAULT_PORT "org.moat.agent"
#define BOOT_MODULE_LIST "/etc/moat/modules"
#define BOOT_MODULE_DIR "/lib/modules"
#define BOOT_PATH                                                             \
	"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#define EXT4_SUPER_OFFSET 1024
#define EXT4_MAGIC_AT 56
#define EXT4_LABEL_AT 120
#define EXT4_LABEL_LEN 16

struct boot_cmdline {
	char root[128];    /* moat.root=: /dev/vdX or LABEL=name */
	char scratch[128]; /* moat.scratch=: likewise, or "tmpfs" */
	char port[128];    /* moat.port=: virtio-serial port name */
	char vsock[16];    /* moat.vsock=: AF_VSOCK port, "" if unset */
	char test[32];     /* moat.test= */
};

/* boot_log: one line to the kernel log, so it reaches the serial console
 * (vmd keeps its tail) and dmesg. Errors use a level that "quiet" still
 * prints; before /dev is mounted it falls back to stderr, which the
 * kernel opened on /dev/console for us. */
static void __attribute__((format(printf, 2, 3)))
boot_log(int error, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n, fd;

	n = snprintf(line, sizeof(line), "<%d>moat-agent: ", error ? 2 : 6);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	strcat(line, "\n");
	if ((fd = open("/dev/kmsg", O_WRONLY | O_CLOEXEC)) >= 0) {
		ssize_t w = write(fd, line, strlen(line));

		close(fd);
		if (w > 0)
			return;
	}
	if (write(STDERR_FILENO, line + 3, strlen(line + 3)) < 0) {
		/* no console at all: nobody to tell */
	}
}

static uint64_t
boot_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
boot_sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
		.tv_nsec = (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
	}
}

/* boot_read_small: reads a small text file (sysfs, procfs) into buf,
 * NUL-terminated, trailing newline removed. Returns 0 or an errno. */
static int
boot_read_small(const char *path, char *buf, size_t size)
{
	ssize_t n;
	int fd;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return errno;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		return errno;
	buf[n] = '\0';
	while (n > 0 && isspace((unsigned char)buf[n - 1]))
		buf[--n] = '\0';
	return 0;
}

static uint64_t
boot_uptime_ms(void)
{
	char text[64];

	if (boot_read_small("/proc/uptime", text, sizeof(text)) != 0)
		return 0;
	return (uint64_t)(strtod(text, NULL) * 1000.0);
}

static int
boot_mount(const char *src, const char *dst, const char *type,
    unsigned long flags, const char *data)
{
	if (mkdir(dst, 0755) != 0 && errno != EEXIST) {
		boot_log(1, "mkdir %s: %s", dst, strerror(errno));
		return errno;
	}
	if (mount(src, dst, type, flags, data) != 0) {
		int rv = errno;

		boot_log(1, "mount %s on %s (%s, %s): %s", src, dst,
		    type ? type : "move", data ? data : "", strerror(rv));
		return rv;
	}
	return 0;
}

/* boot_copy_value: copies the value of "key=value" into dst if the word
 * starts with key=. Values longer than dst are an error the caller sees
 * as a missing device later; they are cut, never overflowed. */
static void
boot_copy_value(const char *word, const char *key, char *dst, size_t size)
{
	size_t klen = strlen(key);

	if (strncmp(word, key, klen) == 0 && word[klen] == '=')
		snprintf(dst, size, "%s", word + klen + 1);
}

static int
boot_parse_cmdline(struct boot_cmdline *c)
{
	char line[4096], *word, *save;
	int rv;

	snprintf(c->root, sizeof(c->root), "%s", BOOT_DEFAULT_ROOT);
	snprintf(c->scratch, sizeof(c->scratch), "%s", BOOT_DEFAULT_SCRATCH);
	snprintf(c->port, sizeof(c->port), "%s", BOOT_DEFAULT_PORT);
	c->vsock[0] = c->test[0] = '\0';
	if ((rv = boot_read_small("/proc/cmdline", line, sizeof(line))) != 0) {
		boot_log(1, "read /proc/cmdline: %s", strerror(rv));
		return rv;
	}
	for (word = strtok_r(line, " \t\n", &save); word != NULL;
	     word = strtok_r(NULL, " \t\n", &save)) {
		boot_copy_value(word, "moat.root", c->root, sizeof(c->root));
		boot_copy_value(word, "moat.scratch", c->scratch,
		    sizeof(c->scratch));
		boot_copy_value(word, "moat.port", c->port, sizeof(c->port));
		boot_copy_value(word, "moat.vsock", c->vsock,
		    sizeof(c->vsock));
		boot_copy_value(word, "moat.test", c->test, sizeof(c->test));
	}
	return 0;
}

/* boot_module_unused: whether a module only serves the other guest link.
 * Each load costs tens of milliseconds under TCG: QEMU guests talk over
 * virtio-serial and never need vsock; Firecracker guests the reverse. */
static int
boot_module_unused(const char *name, int vsock)
{
	if (vsock)
		return strncmp(name, "virtio_console", 14) == 0;
	return strstr(name, "vsock") != NULL;
}

/* boot_load_modules: finit_module()s each file named in the list, in its
 * order (images/build.sh wrote it in dependency order), then deletes it:
 * the initramfs stays in RAM for the VM's life. */
static int
boot_load_modules(int vsock)
{
	char name[256], path[512];
	FILE *list;
	int fd, rv = 0;

	if ((list = fopen(BOOT_MODULE_LIST, "re")) == NULL) {
		if (errno == ENOENT)
			return 0; /* a kernel with everything built in */
		boot_log(1, "open %s: %s", BOOT_MODULE_LIST, strerror(errno));
		return errno;
	}
	while (fgets(name, sizeof(name), list) != NULL) {
		name[strcspn(name, "\r\n")] = '\0';
		if (name[0] == '\0' || name[0] == '#' ||
		    boot_module_unused(name, vsock))
			continue;
		snprintf(path, sizeof(path), "%s/%s", BOOT_MODULE_DIR, name);
		if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
			rv = errno;
			boot_log(1, "open module %s: %s", path, strerror(rv));
			break;
		}
		if (syscall(SYS_finit_module, fd, "", 0) != 0 &&
		    errno != EEXIST) {
			rv = errno;
			boot_log(1, "load module %s: %s", path, strerror(rv));
			close(fd);
			break;
		}
		close(fd);
		unlink(path);
		boot_log(0, "loaded %s at %llu ms", name,
		    (unsigned long long)boot_uptime_ms());
	}
	fclose(list);
	return rv;
}

/* boot_ext4_label_is: whether block device dev holds an ext4 (or ext2/3)
 * superblock with this volume label. */
static int
boot_ext4_label_is(const char *dev, const char *label)
{
	unsigned char sb[EXT4_LABEL_AT + EXT4_LABEL_LEN];
	char found[EXT4_LABEL_LEN + 1];
	ssize_t n;
	int fd;

	if ((fd = open(dev, O_RDONLY | O_CLOEXEC)) < 0)
		return 0;
	n = pread(fd, sb, sizeof(sb), EXT4_SUPER_OFFSET);
	close(fd);
	if (n != (ssize_t)sizeof(sb))
		return 0;
	if ((sb[EXT4_MAGIC_AT] | sb[EXT4_MAGIC_AT + 1] << 8) != 0xEF53)
		return 0;
	memcpy(found, sb + EXT4_LABEL_AT, EXT4_LABEL_LEN);
	found[EXT4_LABEL_LEN] = '\0';
	return strcmp(found, label) == 0;
}

/* boot_find_disk: resolves a moat.root=/moat.scratch= value to a /dev
 * path once, without waiting. Returns 1 when found. */
static int
boot_find_disk(const char *spec, char *dev, size_t size)
{
	struct dirent *de;
	struct stat st;
	DIR *dir;
	int found = 0;

	if (strncmp(spec, "LABEL=", 6) != 0) {
		snprintf(dev, size, "%s", spec);
		return stat(dev, &st) == 0 && S_ISBLK(st.st_mode);
	}
	if ((dir = opendir("/sys/block")) == NULL)
		return 0;
	while (!found && (de = readdir(dir)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		if ((size_t)snprintf(dev, size, "/dev/%s", de->d_name) >= size)
			continue;
		found = boot_ext4_label_is(dev, spec + 6);
	}
	closedir(dir);
	return found;
}

/* agent_boot_find_port: looks once for the virtio-serial port with this name;
 * fills path with its /dev node. Returns 1 when found. */
int
agent_boot_find_port(const char *want, char *path, size_t size)
{
	char file[300], name[160];
	struct dirent *de;
	DIR *dir;
	int found = 0;

	if ((dir = opendir("/sys/class/virtio-ports")) == NULL)
		return 0;
	while (!found && (de = readdir(dir)) != NULL) {
		if (strncmp(de->d_name, "vport", 5) != 0)
			continue;
		snprintf(file, sizeof(file), "/sys/class/virtio-ports/%s/name",
		    de->d_name);
		if (boot_read_small(file, name, sizeof(name)) != 0 ||
		    strcmp(name, want) != 0)
			continue;
		if ((size_t)snprintf(path, size, "/dev/%s", de->d_name) >=
		    size)
			continue;
		found = access(path, R_OK | W_OK) == 0;
	}
	closedir(dir);
	return found;
}

static int
boot_wait_disks(const struct boot_cmdline *c, uint64_t deadline, char *root,
    char *scratch, size_t size)
{
	int have_root = 0, have_scratch = strcmp(c->scratch, "tmpfs") == 0;

	for (;;) {
		if (!have_root)
			have_root = boot_find_disk(c->root, root, size);
		if (!have_scratch)
			have_scratch =
			    boot_find_disk(c->scratch, scratch, size);
		if (have_root && have_scratch)
			return 0;
		if (boot_now_ms() >= deadline)
			break;
		boot_sleep_ms(BOOT_POLL_MS);
	}
	if (!have_root)
		boot_log(1, "no disk for moat.root=%s after %d ms", c->root,
		    BOOT_DEVICE_WAIT_MS);
	if (!have_scratch)
		boot_log(1, "no disk for moat.scratch=%s after %d ms",
		    c->scratch, BOOT_DEVICE_WAIT_MS);
	return ENODEV;
}

/* boot_make_root: image + scratch -> overlay at /newroot. */
static int
boot_make_root(const char *root, const char *scratch)
{
	int rv;

	if ((rv = boot_mount(root, "/mnt/lower", "ext4",
	         MS_RDONLY | MS_NOATIME, "noload")) != 0)
		return rv;
	if (scratch[0] == '\0')
		rv = boot_mount("tmpfs", "/mnt/scratch", "tmpfs", MS_NOATIME,
		    "mode=0755");
	else
		/* noinit_itable: vmd makes the scratch disk with lazy inode
		 * tables in a sparse file, whose holes read as zeros already;
		 * zeroing them in the background cost every sandbox and every
		 * clone of it block I/O and ~2,000 guest blocks to translate
		 * under TCG right after a restore (restore 165 -> 141 ms). */
		rv = boot_mount(scratch, "/mnt/scratch", "ext4", MS_NOATIME,
		    "noinit_itable");
	if (rv != 0)
		return rv;
	if ((mkdir("/mnt/scratch/upper", 0755) != 0 && errno != EEXIST) ||
	    (mkdir("/mnt/scratch/work", 0755) != 0 && errno != EEXIST)) {
		rv = errno;
		boot_log(1, "mkdir upper/work on %s: %s", scratch,
		    strerror(rv));
		return rv;
	}
	return boot_mount("overlay", "/newroot", "overlay", MS_NOATIME,
	    "lowerdir=/mnt/lower,upperdir=/mnt/scratch/upper,"
	    "workdir=/mnt/scratch/work");
}

/* boot_switch_root: moves the API filesystems into /newroot and makes it
 * "/", the way switch_root(8) does; the initramfs stays underneath. */
static int
boot_switch_root(void)
{
	static const char *const moved[] = { "/dev", "/proc", "/sys" };
	char dst[64];
	size_t i;
	int rv;

	for (i = 0; i < sizeof(moved) / sizeof(moved[0]); i++) {
		snprintf(dst, sizeof(dst), "/newroot%s", moved[i]);
		if ((rv = boot_mount(moved[i], dst, NULL, MS_MOVE, NULL)) != 0)
			return rv;
	}
	if (chdir("/newroot") != 0 ||
	    mount(".", "/", NULL, MS_MOVE, NULL) != 0 || chroot(".") != 0 ||
	    chdir("/") != 0) {
		rv = errno;
		boot_log(1, "switch root to /newroot: %s", strerror(rv));
		return rv;
	}
	return 0;
}

static void
boot_loopback_up(void)
{
	struct ifreq ifr;
	int fd;

	if ((fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
		return;
	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
		ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
		if (ioctl(fd, SIOCSIFFLAGS, &ifr) != 0)
			boot_log(1, "loopback up: %s", strerror(errno));
	}
	close(fd);
}

/* boot_mount_api: /dev, /proc and /sys in the initramfs; shm and ptys
 * are conveniences a guest can live without. */
static int
boot_mount_api(void)
{
	const unsigned long api = MS_NOSUID | MS_NODEV | MS_NOEXEC;
	int rv;

	if ((rv = boot_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID,
	         "mode=0755")) != 0)
		return rv;
	if ((rv = boot_mount("proc", "/proc", "proc", api, NULL)) != 0)
		return rv;
	if ((rv = boot_mount("sysfs", "/sys", "sysfs", api, NULL)) != 0)
		return rv;
	(void)boot_mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
	    "mode=1777");
	(void)boot_mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
	    "gid=5,mode=620,ptmxmode=666");
	return 0;
}

static int
boot_parse_vsock(const char *text, uint32_t *port)
{
	unsigned long value;
	char *end;

	*port = 0;
	if (text[0] == '\0')
		return 0;
	errno = 0;
	value = strtoul(text, &end, 10);
	if (errno != 0 || *end != '\0' || value == 0 || value > UINT32_MAX) {
		boot_log(1, "moat.vsock=%s is not a port number", text);
		return EINVAL;
	}
	*port = (uint32_t)value;
	return 0;
}

/* boot_wait_port: waits until the deadline for the named virtio-serial
 * port (the host names it; the kernel learns the name a little after the
 * port itself). */
static int
boot_wait_port(const char *name, uint64_t deadline, char *path, size_t size)
{
	while (!agent_boot_find_port(name, path, size)) {
		if (boot_now_ms() >= deadline) {
			boot_log(1,
			    "no virtio-serial port named %s after %d ms", name,
			    BOOT_DEVICE_WAIT_MS);
			path[0] = '\0';
			return ENODEV;
		}
		boot_sleep_ms(BOOT_POLL_MS);
	}
	return 0;
}

/* boot_finish_root: what the new root needs before anything runs in it.
 * /tmp stays on the overlay: what a step writes there shows up in the fs
 * trace and does not eat guest RAM. */
static void
boot_finish_root(void)
{
	(void)boot_mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV,
	    "mode=0755,size=16m");
	if (sethostname("moat", 4) != 0)
		boot_log(1, "sethostname: %s", strerror(errno));
	boot_loopback_up();
	setenv("PATH", BOOT_PATH, 0);
}

int
agent_boot_init(struct agent_boot *b)
{
	char root[300] = "", scratch[300] = "";
	struct boot_cmdline c;
	uint64_t deadline;
	int rv;

	memset(b, 0, sizeof(*b));
	b->lower_fd = b->upper_fd = -1;
	if ((rv = boot_mount_api()) != 0 ||
	    (rv = boot_parse_cmdline(&c)) != 0 ||
	    (rv = boot_parse_vsock(c.vsock, &b->vsock_port)) != 0)
		return rv;
	snprintf(b->test_mode, sizeof(b->test_mode), "%s", c.test);
	if ((rv = boot_load_modules(b->vsock_port != 0)) != 0)
		return rv;
	boot_log(0, "modules loaded at %llu ms",
	    (unsigned long long)boot_uptime_ms());

	deadline = boot_now_ms() + BOOT_DEVICE_WAIT_MS;
	if ((rv = boot_wait_disks(&c, deadline, root, scratch,
	         sizeof(root))) != 0)
		return rv;
	if ((rv = boot_make_root(root, scratch)) != 0)
		return rv;
	/* The fs trace walks these from the new root, where they are out of
	 * sight: open them now. */
	b->lower_fd = open("/mnt/lower", O_PATH | O_DIRECTORY | O_CLOEXEC);
	b->upper_fd =
	    open("/mnt/scratch/upper", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (b->lower_fd < 0 || b->upper_fd < 0) {
		rv = errno;
		boot_log(1, "open lower/upper dirs: %s", strerror(rv));
		return rv;
	}
	if ((rv = boot_switch_root()) != 0)
		return rv;
	boot_finish_root();
	boot_log(0, "new root at %llu ms",
	    (unsigned long long)boot_uptime_ms());

	if (b->vsock_port == 0 &&
	    (rv = boot_wait_port(c.port, deadline, b->port_path,
	         sizeof(b->port_path))) != 0)
		return rv;
	b->boot_ms = boot_uptime_ms();
	boot_log(0, "booted at %llu ms, serving %s",
	    (unsigned long long)b->boot_ms,
	    b->vsock_port ? "vsock" : b->port_path);
	return 0;
}

void
agent_boot_poweroff(void)
{
	sync();
	reboot(RB_POWER_OFF);
	/* still here: no ACPI power-off; a reboot is an exit under
	 * QEMU's -no-reboot */
	reboot(RB_AUTOBOOT);
	_exit(1);
}
