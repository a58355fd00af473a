/*
 * test_verify.c: sealed snapshots end to end (issue 14) with a real VM
 * (QEMU under TCG). One moat-vmd on a fresh state directory, one
 * sandbox, one snapshot of it; then:
 *  - restores timed with the verified-once cache warm, and cold (each
 *    artifact's ctime bumped first, so every byte is hashed again);
 *  - a flipped byte in the device state, in the RAM copy, and in the
 *    manifest (meta.pb): RestoreSandbox is DATA_LOSS naming what, no
 *    QEMU is started (no process of the state dir, no "restoring" line,
 *    no new VM directory); the byte flipped back restores again;
 *  - the manifest without its seal (a snapshot from before issue 14):
 *    FAILED_PRECONDITION saying to take a new one;
 *  - a changed byte in an image's file refuses creates of that image.
 * The timings go to stdout as one JSON line (for the README's figures).
 * Without a built "default" image it exits 77 (ctest: Skipped).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "vm.pb-c.h"

#define VM_SERVICE "moat.v1.Vm"
#define LONG_MS 180000u
/* Restores timed per kind (MOAT_VERIFY_TIMED overrides, up to 50). */
#define TIMED_MAX 50
static int timed = 3;

static char image_dir[1024];
static char state_root[] = "/tmp/moat-verify-test-XXXXXX";
static char state[300], url[350], log_path[350];
static pid_t vmd_pid;
static const char *vmd_bin = MOAT_VMD_BIN;
static const char *templates = "off"; /* the next vmd_start's */
static struct moat_rpc_client *client;
static char last_err[4096];

static int
call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply)
{
	struct moat_rpc_opts opts = { .timeout_ms = LONG_MS,
		.tenant = "default" };
	ProtobufCMessage *r = NULL;
	char *err = NULL;
	int rv;

	rv = moat_rpc_call(client, VM_SERVICE, method, req, desc, &r, &opts,
	    &err);
	snprintf(last_err, sizeof(last_err), "%s", err ? err : "");
	free(err);
	if (reply != NULL)
		*reply = r;
	else if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	return rv;
}

static void
log_tail(void)
{
	char *cmd = moat_asprintf("tail -n 30 '%s' >&2", log_path);

	(void)!system(cmd);
	free(cmd);
}

static void
vmd_start(void **unused)
{
	char *err = NULL;
	uint64_t until;

	(void)unused;
	vmd_pid = fork();
	assert_true(vmd_pid >= 0);
	if (vmd_pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		char cache[400];

		snprintf(cache, sizeof(cache), "%s/cache", state);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		execl(vmd_bin, vmd_bin, "--state-dir", state, "--accel", "tcg",
		    "--driver", "qemu", "--image-dir", image_dir, "--listen",
		    url, "--cache-dir", cache, "--node-id", "verify-node",
		    "--templates", templates, "--template-spares", "0",
		    (char *)NULL);
		_exit(127);
	}
	assert_int_equal(moat_rpc_client_open(&client, url, &err), 0);
	until = moat_rpc_now_ms() + 30000;
	for (;;) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		int status;

		if (call("Health", &h.base,
		        &moat__v1__health_reply__descriptor, NULL) == MOAT_OK)
			break;
		if (waitpid(vmd_pid, &status, WNOHANG) == vmd_pid ||
		    moat_rpc_now_ms() > until) {
			log_tail();
			fail_msg("moat-vmd did not start: %s", last_err);
		}
		usleep(50 * 1000);
	}
}

/* Live processes (not zombies) whose command line mentions needle. */
static int
procs_mentioning(const char *needle)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)) != NULL) {
		char path[300], *text = NULL;
		size_t len;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
		if (moat_read_file(path, 4096, &text, &len) == 0) {
			char *rp = strrchr(text, ')');
			bool zombie = rp && rp[1] && rp[2] == 'Z';

			free(text);
			if (zombie)
				continue;
		}
		snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
		if (moat_read_file(path, 1 << 16, &text, &len) != 0)
			continue;
		for (size_t i = 0; i < len; i++)
			if (text[i] == '\0')
				text[i] = ' ';
		if (strstr(text, needle) != NULL)
			n++;
		free(text);
	}
	closedir(d);
	return n;
}

/* Occurrences of needle in vmd's log. */
static int
log_count(const char *needle)
{
	char *text = NULL;
	size_t len;
	int n = 0;

	if (moat_read_file(log_path, 64u << 20, &text, &len) != 0)
		return -1;
	for (char *p = text; (p = strstr(p, needle)) != NULL; p++)
		n++;
	free(text);
	return n;
}

/* Entries of <state>/vms. */
static int
vm_dirs(void)
{
	char *p = moat_asprintf("%s/vms", state);
	DIR *d = opendir(p);
	struct dirent *de;
	int n = 0;

	free(p);
	while (d != NULL && (de = readdir(d)) != NULL)
		if (de->d_name[0] != '.')
			n++;
	if (d != NULL)
		closedir(d);
	return n;
}

static char *
create(void)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	char *id;

	req.memory_mib = 256;
	req.scratch_mib = 256;
	if (call("CreateSandbox", &req.base, &moat__v1__sandbox__descriptor,
	        (ProtobufCMessage **)&sb) != MOAT_OK) {
		log_tail();
		fail_msg("CreateSandbox: %s", last_err);
	}
	id = strdup(sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return id;
}

static void
destroy(const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;

	ref.sandbox_id = (char *)id;
	assert_int_equal(call("DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, NULL),
	    MOAT_OK);
}

/* RestoreSandbox of snap: the status; a clone is destroyed at once.
 * *ms (may be NULL): how long the call took. */
static int
restore(const char *snap, double *ms)
{
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	struct timespec a, b;
	int rv;

	req.snapshot_id = (char *)snap;
	clock_gettime(CLOCK_MONOTONIC, &a);
	rv = call("RestoreSandbox", &req.base, &moat__v1__sandbox__descriptor,
	    (ProtobufCMessage **)&sb);
	clock_gettime(CLOCK_MONOTONIC, &b);
	if (ms != NULL)
		*ms = (double)(b.tv_sec - a.tv_sec) * 1e3 +
		    (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	if (rv == MOAT_OK) {
		destroy(sb->id);
		protobuf_c_message_free_unpacked(&sb->base, NULL);
	}
	return rv;
}

/* Flips one bit of byte off of path in place. */
static void
flip(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= 0x01;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

/* Sets path's mtime to what it is: nothing changes but ctime, which
 * is enough to make the verified-once cache hash it again. */
static void
bump_ctime(const char *path)
{
	struct stat st;
	struct timespec ts[2];

	assert_int_equal(stat(path, &st), 0);
	ts[0] = st.st_atim;
	ts[1] = st.st_mtim;
	assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double
median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

/* The offset of the first occurrence of needle in path's bytes. */
static off_t
offset_of(const char *path, const char *needle)
{
	char *text = NULL, *p;
	size_t len;
	off_t off = -1;

	assert_int_equal(moat_read_file(path, 1 << 20, &text, &len), 0);
	p = memmem(text, len, needle, strlen(needle));
	if (p != NULL)
		off = p - text;
	free(text);
	return off;
}

static void
vmd_stop(void)
{
	int status = 0;

	moat_rpc_client_close(client);
	client = NULL;
	kill(vmd_pid, SIGTERM);
	assert_int_equal(waitpid(vmd_pid, &status, 0), vmd_pid);
	assert_int_equal(status, 0);
}

/* With $MOAT_VERIFY_BASELINE_VMD (a moat-vmd from before issue 14, which
 * checks nothing): the p50 of timed restores of snap under it, on the
 * same state directory; then this build's vmd again. -1 without. */
static double
baseline_restores(const char *snap)
{
	const char *bin = getenv("MOAT_VERIFY_BASELINE_VMD");
	double t[TIMED_MAX];

	if (bin == NULL || bin[0] == '\0')
		return -1;
	vmd_stop();
	vmd_bin = bin;
	vmd_start(NULL);
	for (int i = 0; i < timed; i++)
		assert_int_equal(restore(snap, &t[i]), MOAT_OK);
	vmd_stop();
	vmd_bin = MOAT_VMD_BIN;
	vmd_start(NULL);
	return median(t, timed);
}

/* A tampered snapshot: refused with DATA_LOSS naming `what`, and no
 * QEMU started (no process, no "restoring" line, no VM directory). */
static void
expect_refused(const char *snap, const char *what, int code)
{
	int procs = procs_mentioning(state);
	int restoring = log_count(": restoring (image");
	int dirs = vm_dirs();

	assert_int_equal(restore(snap, NULL), code);
	if (strstr(last_err, what) == NULL)
		fail_msg("the refusal does not name %s: %s", what, last_err);
	assert_int_equal(procs_mentioning(state), procs);
	assert_int_equal(log_count(": restoring (image"), restoring);
	assert_int_equal(vm_dirs(), dirs);
}

static void
test_sealed_snapshots(void **unused)
{
	Moat__V1__SnapshotSandboxRequest sreq =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *snap = NULL;
	double warm[TIMED_MAX], cold[TIMED_MAX], baseline;
	char *cmd;
	char *id, *dir, *ds, *ram, *scratch, *meta, ram_target[4096];
	ssize_t n;
	off_t off;

	(void)unused;
	id = create();
	sreq.sandbox_id = id;
	if (call("SnapshotSandbox", &sreq.base,
	        &moat__v1__local_snapshot__descriptor,
	        (ProtobufCMessage **)&snap) != MOAT_OK) {
		log_tail();
		fail_msg("SnapshotSandbox: %s", last_err);
	}
	dir = moat_asprintf("%s/snapshots/%s", state, snap->snapshot_id);
	ds = moat_asprintf("%s/device_state", dir);
	ram = moat_asprintf("%s/ram", dir);
	scratch = moat_asprintf("%s/scratch.ext4", dir);
	meta = moat_asprintf("%s/meta.pb", dir);
	n = readlink(ram, ram_target, sizeof(ram_target) - 1);
	if (n > 0) {
		ram_target[n] = '\0';
		free(ram);
		ram = strdup(ram_target);
	}
	destroy(id);

	/* Restores: the cache warm (sealed when taken), then cold. */
	for (int i = 0; i < timed; i++)
		assert_int_equal(restore(snap->snapshot_id, &warm[i]),
		    MOAT_OK);
	for (int i = 0; i < timed; i++) {
		bump_ctime(ds);
		bump_ctime(ram);
		bump_ctime(scratch);
		assert_int_equal(restore(snap->snapshot_id, &cold[i]),
		    MOAT_OK);
	}
	baseline = baseline_restores(snap->snapshot_id);
	printf("{\"restore_ms_p50_baseline\": %.1f, "
	       "\"restore_ms_p50_cached\": %.1f, "
	       "\"restore_ms_p50_uncached\": %.1f, \"ram_bytes\": %" PRIu64
	       ", \"disk_bytes\": %" PRIu64 "}\n",
	    baseline, median(warm, timed), median(cold, timed),
	    snap->ram_bytes, snap->disk_bytes);
	fflush(stdout);
	cmd = moat_asprintf("grep -o 'snapshot [^ ]*: verified in .*' '%s' "
	                    "| sed 's/^/# /'",
	    log_path);
	(void)!system(cmd);
	free(cmd);

	/* A flipped byte in each; flipped back, the bytes verify again. */
	flip(ds, 100);
	expect_refused(snap->snapshot_id, "device_state", MOAT_DATA_LOSS);
	flip(ds, 100);
	flip(ram, (off_t)(1u << 20) + 17);
	expect_refused(snap->snapshot_id, "its ram", MOAT_DATA_LOSS);
	flip(ram, (off_t)(1u << 20) + 17);
	assert_int_equal(restore(snap->snapshot_id, NULL), MOAT_OK);
	flip(scratch, 1024);
	expect_refused(snap->snapshot_id, "its disk", MOAT_DATA_LOSS);
	flip(scratch, 1024);
	/* The manifest: a byte of the sandbox id it names. */
	off = offset_of(meta, id);
	assert_true(off >= 0);
	flip(meta, off + (off_t)strlen(id) - 1);
	expect_refused(snap->snapshot_id, "meta.pb", MOAT_DATA_LOSS);
	flip(meta, off + (off_t)strlen(id) - 1);
	assert_int_equal(restore(snap->snapshot_id, NULL), MOAT_OK);

	/* Taken before issue 14 (no seal): refused, take a new one. */
	{
		char *buf = NULL;
		size_t len;
		Moat__V1__LocalSnapshot *m;
		uint8_t *packed;

		assert_int_equal(moat_read_file(meta, 1 << 20, &buf, &len), 0);
		m = moat__v1__local_snapshot__unpack(NULL, len,
		    (uint8_t *)buf);
		assert_non_null(m);
		m->seal.len = 0;
		m->n_digests = 0;
		len = moat__v1__local_snapshot__get_packed_size(m);
		packed = malloc(len);
		moat__v1__local_snapshot__pack(m, packed);
		assert_int_equal(moat_write_file_atomic(meta, packed, len,
		                     0600),
		    0);
		m->n_digests = 3; /* so free_unpacked frees them */
		moat__v1__local_snapshot__free_unpacked(m, NULL);
		free(packed);
		free(buf);
		expect_refused(snap->snapshot_id, "no seal",
		    MOAT_FAILED_PRECONDITION);
	}
	protobuf_c_message_free_unpacked(&snap->base, NULL);
	free(dir);
	free(ds);
	free(ram);
	free(scratch);
	free(meta);
	free(id);
}

/* A changed byte in an image's file: creates of it are refused (a copy
 * of the image, so the shared one is never touched). */
static void
test_changed_image(void **unused)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	char *copy = moat_asprintf("%s/img/copy", state_root);
	char *cmd, *initrd;
	int procs;

	(void)unused;
	cmd = moat_asprintf("mkdir -p '%s' && cp '%s/default/manifest.json' "
	                    "'%s/default/initrd.img' '%s/' && ln -s "
	                    "'%s/default/vmlinux' '%s/default/rootfs.ext4' "
	                    "'%s/default/vmlinuz' '%s/'",
	    copy, image_dir, image_dir, copy, image_dir, image_dir, image_dir,
	    copy);
	assert_int_equal(system(cmd), 0);
	free(cmd);
	/* A vmd of its own whose image dir holds only the copy. */
	initrd = moat_asprintf("%s/initrd.img", copy);
	flip(initrd, 4096);
	procs = procs_mentioning(state_root);
	{
		char *st = moat_asprintf("%s/img-vmd", state_root);
		char *u = moat_asprintf("ipc://%s/vmd.sock", st);
		char *lg = moat_asprintf("%s/img-vmd.log", state_root);
		char *dirimg = moat_asprintf("%s/img", state_root);
		struct moat_rpc_client *saved = client;
		char *err = NULL;
		pid_t pid;
		int status;
		uint64_t until = moat_rpc_now_ms() + 30000;

		assert_int_equal(moat_mkdir_p(st, 0700), 0);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			int fd = open(lg, O_WRONLY | O_CREAT | O_APPEND, 0644);

			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
			}
			prctl(PR_SET_PDEATHSIG, SIGTERM);
			execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", st,
			    "--accel", "tcg", "--driver", "qemu",
			    "--image-dir", dirimg, "--listen", u, "--node-id",
			    "img-node", "--templates", "off", (char *)NULL);
			_exit(127);
		}
		assert_int_equal(moat_rpc_client_open(&client, u, &err), 0);
		for (;;) {
			Moat__V1__HealthRequest h =
			    MOAT__V1__HEALTH_REQUEST__INIT;

			if (call("Health", &h.base,
			        &moat__v1__health_reply__descriptor,
			        NULL) == MOAT_OK)
				break;
			assert_true(moat_rpc_now_ms() < until);
			usleep(50 * 1000);
		}
		req.image = "copy";
		req.memory_mib = 256;
		assert_int_equal(call("CreateSandbox", &req.base,
		                     &moat__v1__sandbox__descriptor, NULL),
		    MOAT_DATA_LOSS);
		if (strstr(last_err, "initrd.img") == NULL ||
		    strstr(last_err, "manifest") == NULL)
			fail_msg("the refusal does not name the file: %s",
			    last_err);
		/* Said at start too, and no VMM was started. */
		{
			char *text = NULL;
			size_t len;

			assert_int_equal(moat_read_file(lg, 1 << 20, &text,
			                     &len),
			    0);
			assert_non_null(strstr(text, "image \"copy\""));
			assert_null(strstr(text, "creating (image"));
			free(text);
		}
		moat_rpc_client_close(client);
		client = saved;
		kill(pid, SIGTERM);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_int_equal(procs_mentioning(state_root), procs);
		free(st);
		free(u);
		free(lg);
		free(dirimg);
	}
	free(initrd);
	free(copy);
}

/* The template vmd made (heap), or NULL. */
static char *
template_dir(void)
{
	char *root = moat_asprintf("%s/templates", state);
	DIR *d = opendir(root);
	struct dirent *de;
	char *found = NULL;

	while (d != NULL && found == NULL && (de = readdir(d)) != NULL) {
		char *meta;

		if (strncmp(de->d_name, "tpl-", 4) != 0 ||
		    strchr(de->d_name, '.') != NULL)
			continue;
		meta = moat_asprintf("%s/%s/meta.pb", root, de->d_name);
		if (access(meta, F_OK) == 0)
			found = moat_asprintf("%s/%s", root, de->d_name);
		free(meta);
	}
	if (d != NULL)
		closedir(d);
	free(root);
	return found;
}

/* A create: its template_id ("" when it booted cold), heap. */
static char *
create_template_id(void)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	char *tid;

	req.memory_mib = 256;
	req.scratch_mib = 256;
	if (call("CreateSandbox", &req.base, &moat__v1__sandbox__descriptor,
	        (ProtobufCMessage **)&sb) != MOAT_OK) {
		log_tail();
		fail_msg("CreateSandbox: %s", last_err);
	}
	tid = strdup(sb->template_id);
	destroy(sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return tid;
}

/* A template with a flipped byte is never cloned: it is removed, the
 * create boots cold and says nothing wrong, vmd's log says why. */
static void
test_template_tampered(void **unused)
{
	char saved_state[sizeof(state)], saved_url[sizeof(url)];
	char saved_log[sizeof(log_path)];
	struct moat_rpc_client *saved_client = client;
	pid_t saved_pid = vmd_pid;
	char *tid, *dir = NULL, *ds;
	uint64_t until;

	(void)unused;
	memcpy(saved_state, state, sizeof(state));
	memcpy(saved_url, url, sizeof(url));
	memcpy(saved_log, log_path, sizeof(log_path));
	snprintf(state, sizeof(state), "%s/tpl", state_root);
	snprintf(url, sizeof(url), "ipc://%s/vmd.sock", state);
	snprintf(log_path, sizeof(log_path), "%s.log", state);
	assert_int_equal(moat_mkdir_p(state, 0700), 0);
	templates = "on";
	vmd_start(NULL);
	templates = "off";
	/* The first create boots cold and makes the template after. */
	tid = create_template_id();
	assert_string_equal(tid, "");
	free(tid);
	for (until = moat_rpc_now_ms() + 120000;
	     (dir = template_dir()) == NULL && moat_rpc_now_ms() < until;)
		usleep(200 * 1000);
	if (dir == NULL) {
		log_tail();
		fail_msg("no template was made");
	}
	tid = create_template_id();
	assert_string_not_equal(tid, "");
	free(tid);
	ds = moat_asprintf("%s/device_state", dir);
	flip(ds, 64);
	tid = create_template_id();
	assert_string_equal(tid, "");
	free(tid);
	assert_true(log_count("refused: snapshot tpl-") > 0);
	assert_true(log_count("its device_state") > 0);
	assert_int_equal(access(ds, F_OK), -1);
	free(ds);
	free(dir);
	vmd_stop();
	client = saved_client;
	vmd_pid = saved_pid;
	memcpy(state, saved_state, sizeof(state));
	memcpy(url, saved_url, sizeof(url));
	memcpy(log_path, saved_log, sizeof(log_path));
}

int
main(void)
{
	const char *env = getenv("MOAT_IMAGE_DIR");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sealed_snapshots),
		cmocka_unit_test(test_changed_image),
		cmocka_unit_test(test_template_tampered),
	};
	char *path, *cmd;
	int rc, status;

	snprintf(image_dir, sizeof(image_dir), "%s",
	    env && env[0] ? env : MOAT_REPO_DIR "/images/out");
	if (getenv("MOAT_VERIFY_TIMED") != NULL) {
		timed = atoi(getenv("MOAT_VERIFY_TIMED"));
		timed = timed < 1 ? 1 : timed > TIMED_MAX ? TIMED_MAX : timed;
	}
	path = moat_asprintf("%s/default/rootfs.ext4", image_dir);
	if (access(path, R_OK) != 0) {
		fprintf(stderr, "no image at %s: skipped\n", path);
		free(path);
		return 77;
	}
	free(path);
	if (mkdtemp(state_root) == NULL)
		return 1;
	snprintf(state, sizeof(state), "%s/main", state_root);
	snprintf(url, sizeof(url), "ipc://%s/vmd.sock", state);
	snprintf(log_path, sizeof(log_path), "%s.log", state);
	if (moat_mkdir_p(state, 0700) != 0)
		return 1;
	{
		/* vmd_start asserts: run it as a one-case group setup. */
		const struct CMUnitTest start[] = {
			cmocka_unit_test(vmd_start),
		};
		if (cmocka_run_group_tests_name("start", start, NULL, NULL) !=
		    0) {
			log_tail();
			return 1;
		}
	}
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	moat_rpc_client_close(client);
	kill(vmd_pid, SIGTERM);
	if (waitpid(vmd_pid, &status, 0) != vmd_pid || status != 0) {
		fprintf(stderr, "moat-vmd did not exit 0 (status %d)\n",
		    status);
		log_tail();
		rc = 1;
	}
	if (rc == 0 && getenv("MOAT_VERIFY_KEEP") == NULL) {
		cmd = moat_asprintf("for d in main img-vmd tpl; do '%s' purge "
		                    "'%s'/$d; done; rm -rf '%s'",
		    MOAT_VMD_BIN, state_root, state_root);
		(void)!system(cmd);
		free(cmd);
	} else {
		fprintf(stderr, "state kept in %s\n", state_root);
	}
	return rc;
}
