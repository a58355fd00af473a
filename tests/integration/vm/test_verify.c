/*
 * test_verify.c: sealed snapshots end to end (issue 14) with a real VM
 * (QEMU under TCG). One moat-vmd on a fresh state directory, one
 * sandbox, one snapshot of it; then:
 *  - restores timed with the verified-once cache warm, and cold (each
 *    artifact's ctime bumped first, so every byte is hashed again);
 *  - a flipped byte in the device vmd.state, in the RAM copy, and in the
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
#include "vmd_harness.h"

#define LONG_MS 180000u
/* Restores timed per kind (MOAT_VERIFY_TIMED overrides, up to 50). */
#define TIMED_MAX 50
static int timed = 3;

static char image_dir[1024];
static char state_root[] = "/tmp/moat-verify-test-XXXXXX";
static struct vmd_proc vmd; /* the vmd the cases talk to */
static const char *vmd_bin = MOAT_VMD_BIN;
static const char *templates = "off"; /* the next vmd_start's */

/* One call to vmd, LONG_MS. */
static int
call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply)
{
	return vmd_call(&vmd, method, req, desc, reply, LONG_MS);
}

/* vmd_spawn's child: vmd_bin with the qemu driver under TCG. */
static void
exec_vmd(const struct vmd_proc *v, void *arg)
{
	char cache[400];

	(void)arg;
	snprintf(cache, sizeof(cache), "%s/cache", v->state);
	execl(vmd_bin, vmd_bin, "--state-dir", v->state, "--accel", "tcg",
	    "--driver", "qemu", "--image-dir", image_dir, "--listen", v->url,
	    "--cache-dir", cache, "--node-id", "verify-node", "--templates",
	    templates, "--template-spares", "0", (char *)NULL);
}

/* Starts vmd_bin on vmd.state (a cmocka case: it asserts). */
static void
vmd_start(void **unused)
{
	char dir[sizeof(vmd.state)];

	(void)unused;
	snprintf(dir, sizeof(dir), "%s", vmd.state);
	vmd_spawn(&vmd, dir, exec_vmd, NULL, 30000);
}

/* vmd_spawn's child for test_changed_image: image dir `arg`, no cache
 * dir, templates off. */
static void
exec_img_vmd(const struct vmd_proc *v, void *arg)
{
	execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", v->state, "--accel",
	    "tcg", "--driver", "qemu", "--image-dir", (const char *)arg,
	    "--listen", v->url, "--node-id", "img-node", "--templates", "off",
	    (char *)NULL);
}

/* Occurrences of needle in vmd's log. */
static int
log_count(const char *needle)
{
	char *text = NULL;
	size_t len;
	int n = 0;

	if (moat_read_file(vmd.log, 64u << 20, &text, &len) != 0)
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
	char *p = moat_asprintf("%s/vms", vmd.state);
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
	Moat__V1__Sandbox *sb = vmd_create_or_fail(&vmd, 256, 256, LONG_MS);
	char *id = strdup(sb->id);

	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return id;
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
		vmd_destroy_sandbox(&vmd, sb->id);
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
	vmd_stop(&vmd);
	vmd_bin = bin;
	vmd_start(NULL);
	for (int i = 0; i < timed; i++)
		assert_int_equal(restore(snap, &t[i]), MOAT_OK);
	vmd_stop(&vmd);
	vmd_bin = MOAT_VMD_BIN;
	vmd_start(NULL);
	return median(t, timed);
}

/* A tampered snapshot: refused with DATA_LOSS naming `what`, and no
 * QEMU started (no process, no "restoring" line, no VM directory). */
static void
expect_refused(const char *snap, const char *what, int code)
{
	int procs = vmd_procs_mentioning(vmd.state);
	int restoring = log_count(": restoring (image");
	int dirs = vm_dirs();

	assert_int_equal(restore(snap, NULL), code);
	if (strstr(vmd_last_err, what) == NULL)
		fail_msg("the refusal does not name %s: %s", what,
		    vmd_last_err);
	assert_int_equal(vmd_procs_mentioning(vmd.state), procs);
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
		vmd_log_tail(&vmd, 30);
		fail_msg("SnapshotSandbox: %s", vmd_last_err);
	}
	dir = moat_asprintf("%s/snapshots/%s", vmd.state, snap->snapshot_id);
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
	vmd_destroy_sandbox(&vmd, id);

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
	    vmd.log);
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
	procs = vmd_procs_mentioning(state_root);
	{
		char *st = moat_asprintf("%s/img-vmd", state_root);
		char *dirimg = moat_asprintf("%s/img", state_root);
		struct vmd_proc img;

		assert_int_equal(moat_mkdir_p(st, 0700), 0);
		vmd_spawn(&img, st, exec_img_vmd, dirimg, 30000);
		req.image = "copy";
		req.memory_mib = 256;
		assert_int_equal(vmd_call(&img, "CreateSandbox", &req.base,
		                     &moat__v1__sandbox__descriptor, NULL,
		                     LONG_MS),
		    MOAT_DATA_LOSS);
		if (strstr(vmd_last_err, "initrd.img") == NULL ||
		    strstr(vmd_last_err, "manifest") == NULL)
			fail_msg("the refusal does not name the file: %s",
			    vmd_last_err);
		/* Said at start too, and no VMM was started. */
		{
			char *text = NULL;
			size_t len;

			assert_int_equal(moat_read_file(img.log, 1 << 20,
			                     &text, &len),
			    0);
			assert_non_null(strstr(text, "image \"copy\""));
			assert_null(strstr(text, "creating (image"));
			free(text);
		}
		assert_int_not_equal(vmd_stop_status(&img), -1);
		assert_int_equal(vmd_procs_mentioning(state_root), procs);
		free(st);
		free(dirimg);
	}
	free(initrd);
	free(copy);
}

/* A create: its template_id ("" when it booted cold), heap. */
static char *
create_template_id(void)
{
	Moat__V1__Sandbox *sb = vmd_create_or_fail(&vmd, 256, 256, LONG_MS);
	char *tid = strdup(sb->template_id);

	vmd_destroy_sandbox(&vmd, sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return tid;
}

/* A template with a flipped byte is never cloned: it is removed, the
 * create boots cold and says nothing wrong, vmd's log says why. */
static void
test_template_tampered(void **unused)
{
	struct vmd_proc saved = vmd;
	char *tid, *dir = NULL, *ds;
	uint64_t until;

	(void)unused;
	snprintf(vmd.state, sizeof(vmd.state), "%s/tpl", state_root);
	assert_int_equal(moat_mkdir_p(vmd.state, 0700), 0);
	templates = "on";
	vmd_start(NULL);
	templates = "off";
	/* The first create boots cold and makes the template after. */
	tid = create_template_id();
	assert_string_equal(tid, "");
	free(tid);
	for (until = moat_rpc_now_ms() + 120000;
	     (dir = vmd_template_dir(&vmd)) == NULL &&
	     moat_rpc_now_ms() < until;)
		usleep(200 * 1000);
	if (dir == NULL) {
		vmd_log_tail(&vmd, 30);
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
	vmd_stop(&vmd);
	vmd = saved;
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
	snprintf(vmd.state, sizeof(vmd.state), "%s/main", state_root);
	snprintf(vmd.log, sizeof(vmd.log), "%s.log", vmd.state);
	if (moat_mkdir_p(vmd.state, 0700) != 0)
		return 1;
	{
		/* vmd_start asserts: run it as a one-case group setup. */
		const struct CMUnitTest start[] = {
			cmocka_unit_test(vmd_start),
		};
		if (cmocka_run_group_tests_name("start", start, NULL, NULL) !=
		    0) {
			vmd_log_tail(&vmd, 30);
			return 1;
		}
	}
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	status = vmd_stop_status(&vmd);
	if (status != 0) {
		fprintf(stderr, "moat-vmd did not exit 0 (status %d)\n",
		    status);
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
