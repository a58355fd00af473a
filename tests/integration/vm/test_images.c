/*
 * test_images.c: images through moat-snapd (issue 17) with two real
 * vmds and a moat-snapd of the test's own. Node a's image dir holds
 * "default" and "custom" (default's files, hard links, with a changed
 * manifest: a new id); node b's holds only "default". Node a pushes
 * custom; a create of custom on node b pulls it (verified), runs `echo
 * ok`, the pulled files equal node a's by SHA-256 and node b lists it;
 * RemoveImage is refused while the sandbox uses it and works after;
 * once default is in moat-snapd too, a second pull of custom on node b
 * reads its chunks locally (fetched < size, from vmd's log); a chunk
 * corrupted in snapd's LMDB fails a pull on a third, empty node with
 * DATA_LOSS naming the chunk and leaves nothing in its image dir.
 * Builds run a fake build script ([vmd] image-build-script): steps
 * long-polled in order, DONE with the pushed image, a refused spec
 * FAILED with its tail, a second build at once refused.
 * Images come from $MOAT_IMAGE_DIR (default <repo>/images/out); without a
 * built "default" image the test exits 77 (Skipped).
 * Not for: the gateway's image API (another test) or build.sh itself.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
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
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "moat/images.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapshot.pb-c.h"
#include "vm.pb-c.h"
#include "vmd_harness.h"

#define LONG_MS 600000u
#define CHUNK (64u << 10) /* vmd's image chunk size */

static char src_image[1024]; /* the built default image */
static char root[] = "/tmp/moat-images-test-XXXXXX";
static char snapd_dir[400], snapd_url[450];
static pid_t snapd_pid;
static struct vmd_proc node_a, node_b, node_c;

/* ---- setup ---- */

static void
run_or_fail(const char *cmd)
{
	int rc = system(cmd);

	if (rc != 0)
		fail_msg("`%s` exited %d", cmd, rc);
}

/* <dir>/<name>: default's files as hard links (never written: vmd
 * writes new files and renames), and with `tag` a manifest of its own. */
static void
image_copy(const char *dir, const char *name, const char *tag)
{
	char *cmd = moat_asprintf("mkdir -p '%s/%s' && for f in vmlinuz "
	                          "vmlinux initrd.img rootfs.ext4; do "
	                          "[ -e '%s/'$f ] && ln '%s/'$f '%s/%s/'$f; "
	                          "done; cp '%s/manifest.json' '%s/%s/'",
	    dir, name, src_image, src_image, dir, name, src_image, dir, name);

	run_or_fail(cmd);
	free(cmd);
	if (tag != NULL) {
		/* A key build.sh does not write: same files, a new id. */
		cmd = moat_asprintf("sed -i 's/^{/{\"test_tag\": \"%s\",/' "
		                    "'%s/%s/manifest.json'",
		    tag, dir, name);
		run_or_fail(cmd);
		free(cmd);
	}
}

/* The fake build script: steps, then a copy of default with a new id;
 * a spec with "fail" is refused (exit 2); with "slow" it waits for
 * <root>/release first. */
static void
write_fake_script(void)
{
	char *p = moat_asprintf("%s/fake-build.sh", root);
	char *text = moat_asprintf(
	    "#!/bin/sh\n"
	    "while [ $# -gt 0 ]; do case $1 in\n"
	    "--spec) spec=$2; shift 2;; --name) name=$2; shift 2;;\n"
	    "--out) out=$2; shift 2;; --agent) shift 2;; *) shift;; esac; "
	    "done\n"
	    "echo 'images: [0.001s] step one' >&2\n"
	    "if grep -q fail \"$spec\"; then\n"
	    "  echo 'images: error: spec line 1: unknown key \"fail\"' >&2; "
	    "exit 2; fi\n"
	    "echo 'images: [0.002s] step two' >&2\n"
	    "if grep -q slow \"$spec\"; then i=0; while [ ! -e %s/release ] "
	    "&& [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; fi\n"
	    "if grep -q hang \"$spec\"; then sleep 600; fi\n"
	    "echo 'some other output'\n"
	    "t=\"$out/.$name.fake\"; rm -rf \"$t\"; mkdir \"$t\"\n"
	    "for f in vmlinuz vmlinux initrd.img rootfs.ext4; do "
	    "[ -e \"$out/default/$f\" ] && ln \"$out/default/$f\" \"$t/$f\"; "
	    "done\n"
	    "sed \"s/^{/{\\\"test_build\\\": \\\"$name\\\",/\" "
	    "\"$out/default/manifest.json\" > \"$t/manifest.json\"\n"
	    "rm -rf \"$out/$name\"; mv \"$t\" \"$out/$name\"\n"
	    "echo 'images: [0.003s] step three' >&2\n",
	    root);

	assert_int_equal(moat_write_file_atomic(p, text, strlen(text), 0755),
	    0);
	free(text);
	free(p);
}

static void
snapd_start(void)
{
	snapd_pid = vmd_snapd_spawn(snapd_dir, snapd_url);
}

static void
snapd_stop(void)
{
	vmd_snapd_stop(&snapd_pid);
}

/* vmd_spawn's child: TCG, its own image dir (arg), the test's snapd,
 * the fake build script. */
static void
exec_vmd(const struct vmd_proc *v, void *arg)
{
	char node[320], script[400];
	const char *slash = strrchr(v->state, '/');

	snprintf(node, sizeof(node), "%s", slash ? slash + 1 : v->state);
	snprintf(script, sizeof(script), "%s/fake-build.sh", root);
	setenv("MOAT_VMD_IMAGE_BUILD_SCRIPT", script, 1);
	setenv("MOAT_VMD_IMAGE_BUILD_AGENT", "/bin/true", 1);
	unsetenv("MOAT_CONFIG");
	execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", v->state, "--accel",
	    "tcg", "--driver", "qemu", "--image-dir", (const char *)arg,
	    "--listen", v->url, "--node-id", node, "--templates", "off",
	    "--snapd", snapd_url, (char *)NULL);
}

static char img_a[400], img_b[400], img_c[400];

static void
node_start(struct vmd_proc *v, const char *name, const char *imgdir)
{
	char *st = moat_asprintf("%s/%s", root, name);

	vmd_spawn(v, st, exec_vmd, (void *)imgdir, 60000);
	free(st);
}

static int
setup(void **state)
{
	const char *env = getenv("MOAT_IMAGE_DIR");
	char *p;

	(void)state;
	snprintf(src_image, sizeof(src_image), "%s/default",
	    env && env[0] ? env : MOAT_REPO_DIR "/images/out");
	p = moat_asprintf("%s/rootfs.ext4", src_image);
	if (access(p, R_OK) != 0) {
		fprintf(stderr, "NOTE: no built image at %s: skipped\n",
		    src_image);
		free(p);
		exit(77);
	}
	free(p);
	assert_non_null(mkdtemp(root));
	snprintf(snapd_dir, sizeof(snapd_dir), "%s/snapd", root);
	snprintf(snapd_url, sizeof(snapd_url), "ipc://%s/snapd.sock",
	    snapd_dir);
	snprintf(img_a, sizeof(img_a), "%s/img-a", root);
	snprintf(img_b, sizeof(img_b), "%s/img-b", root);
	snprintf(img_c, sizeof(img_c), "%s/img-c", root);
	image_copy(img_a, "default", NULL);
	image_copy(img_a, "custom", "custom");
	image_copy(img_b, "default", NULL);
	assert_int_equal(moat_mkdir_p(img_c, 0755), 0);
	write_fake_script();
	snapd_start();
	node_start(&node_a, "node-a", img_a);
	node_start(&node_b, "node-b", img_b);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	vmd_stop(&node_a);
	vmd_stop(&node_b);
	vmd_stop(&node_c);
	snapd_stop();
	if (getenv("MOAT_KEEP_TEST_DIR") == NULL)
		(void)moat_rm_rf(root);
	return 0;
}

/* ---- helpers ---- */

static int
image_call(struct vmd_proc *v, const char *method, const char *name,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply)
{
	Moat__V1__ImageRef ref = MOAT__V1__IMAGE_REF__INIT;

	ref.name = (char *)name;
	return vmd_call(v, method, &ref.base, desc, reply, LONG_MS);
}

static void
sha256_file(const char *path, char hex[65])
{
	unsigned char md[SHA256_DIGEST_LENGTH], buf[1 << 16];
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	ssize_t n;
	int fd = open(path, O_RDONLY);

	assert_true(fd >= 0 && ctx != NULL);
	EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		EVP_DigestUpdate(ctx, buf, (size_t)n);
	close(fd);
	EVP_DigestFinal_ex(ctx, md, NULL);
	EVP_MD_CTX_free(ctx);
	for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
		sprintf(hex + 2 * i, "%02x", md[i]);
}

/* The files of image `name` in dir a and dir b are equal by SHA-256. */
static void
assert_same_image(const char *a, const char *b, const char *name)
{
	static const char *const files[] = MOAT_IMAGE_FILES;

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char *pa = moat_asprintf("%s/%s/%s", a, name, files[i]);
		char *pb = moat_asprintf("%s/%s/%s", b, name, files[i]);
		char ha[65], hb[65];

		struct stat sa, sb;

		if (access(pa, F_OK) == 0) {
			sha256_file(pa, ha);
			sha256_file(pb, hb);
			assert_string_equal(ha, hb);
			/* The same build stamp (size, mtime) on both nodes:
			 * snapshots of the image restore on either. */
			assert_int_equal(stat(pa, &sa), 0);
			assert_int_equal(stat(pb, &sb), 0);
			assert_int_equal(sa.st_mtim.tv_sec, sb.st_mtim.tv_sec);
			assert_int_equal(sa.st_mtim.tv_nsec,
			    sb.st_mtim.tv_nsec);
		}
		free(pa);
		free(pb);
	}
}

/* The last "image NAME pulled" line of v's log: bytes fetched, read
 * locally and the image's size. */
static bool
pull_bytes(const struct vmd_proc *v, const char *name, uint64_t *fetched,
    uint64_t *local, uint64_t *size)
{
	char *log = NULL, *needle = moat_asprintf("image %s pulled", name);
	char *p, *last = NULL;
	size_t len;
	bool ok = false;

	if (moat_read_file(v->log, 1 << 24, &log, &len) == 0) {
		for (p = log; (p = strstr(p, needle)) != NULL; p++)
			last = p;
		if (last != NULL && (p = strstr(last, "fetched ")) != NULL)
			ok = sscanf(p,
			         "fetched %" SCNu64 " B, read locally %" SCNu64
			         " B, image %" SCNu64 " B",
			         fetched, local, size) == 3;
	}
	if (ok)
		fprintf(stderr,
		    "node %s: image %s fetched %" PRIu64
		    " B, read locally %" PRIu64 " B of %" PRIu64 " B\n",
		    v->state, name, *fetched, *local, *size);
	free(log);
	free(needle);
	return ok;
}

static bool
lists_image(struct vmd_proc *v, const char *name)
{
	Moat__V1__ListImagesRequest req = MOAT__V1__LIST_IMAGES_REQUEST__INIT;
	Moat__V1__Empty nreq = MOAT__V1__EMPTY__INIT;
	ProtobufCMessage *r = NULL;
	bool listed = false, surveyed = false;

	assert_int_equal(vmd_call(v, "ListImages", &req.base,
	                     &moat__v1__image_list__descriptor, &r, LONG_MS),
	    MOAT_OK);
	for (size_t i = 0; i < ((Moat__V1__ImageList *)r)->n_images; i++)
		listed = listed ||
		    strcmp(((Moat__V1__ImageList *)r)->images[i]->name,
		        name) == 0;
	protobuf_c_message_free_unpacked(r, NULL);
	assert_int_equal(vmd_call(v, "NodeInfo", &nreq.base,
	                     &moat__v1__node__descriptor, &r, LONG_MS),
	    MOAT_OK);
	for (size_t i = 0; i < ((Moat__V1__Node *)r)->n_images; i++)
		surveyed = surveyed ||
		    strcmp(((Moat__V1__Node *)r)->images[i], name) == 0;
	protobuf_c_message_free_unpacked(r, NULL);
	assert_true(listed == surveyed);
	return listed;
}

/* Entries of the image dir other than the images named (a pull's or
 * removal's leftovers). */
static int
leftovers(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	while (d != NULL && (de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    strcmp(de->d_name, "default"))
			n++;
	if (d != NULL)
		closedir(d);
	return n;
}

/* ---- cases ---- */

/* Node a pushes custom; a create of custom on node b pulls it, runs
 * `echo ok`; the files equal node a's; RemoveImage waits for the
 * sandbox to go. */
static void
test_push_pull_create(void **state)
{
	Moat__V1__CreateSandboxRequest cr =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ImageInfo *info = NULL, *again = NULL;
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__ExecResult *res = NULL;
	char *argv[] = { "echo", "ok" };
	uint64_t fetched, local, size;

	(void)state;
	assert_false(lists_image(&node_b, "custom"));
	if (image_call(&node_a, "PushImage", "custom",
	        &moat__v1__image_info__descriptor,
	        (ProtobufCMessage **)&info) != MOAT_OK)
		fail_msg("PushImage: %s", vmd_last_err);
	assert_true(info->stored);
	assert_int_equal(strlen(info->id), 64);
	assert_true(info->snapshot_id[0] != '\0');
	assert_true(info->stored_bytes > 0);
	/* The same id again: answered, nothing put. */
	assert_int_equal(image_call(&node_a, "PushImage", "custom",
	                     &moat__v1__image_info__descriptor,
	                     (ProtobufCMessage **)&again),
	    MOAT_OK);
	assert_string_equal(again->snapshot_id, info->snapshot_id);
	assert_int_equal(again->stored_bytes, 0);

	cr.image = (char *)"custom";
	cr.memory_mib = 256;
	cr.scratch_mib = 256;
	if (vmd_call(&node_b, "CreateSandbox", &cr.base,
	        &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&sb,
	        LONG_MS) != MOAT_OK) {
		vmd_log_tail(&node_b, 30);
		fail_msg("CreateSandbox of custom on node b: %s",
		    vmd_last_err);
	}
	ex.sandbox_id = sb->id;
	ex.argv = argv;
	ex.n_argv = 2;
	ex.timeout_ms = 60000;
	assert_int_equal(vmd_call(&node_b, "Exec", &ex.base,
	                     &moat__v1__exec_result__descriptor,
	                     (ProtobufCMessage **)&res, LONG_MS),
	    MOAT_OK);
	assert_int_equal(res->stdout.len, 3);
	assert_memory_equal(res->stdout.data, "ok\n", 3);
	assert_same_image(img_a, img_b, "custom");
	assert_true(lists_image(&node_b, "custom"));
	/* Default was not in snapd: every chunk came from there. */
	assert_true(pull_bytes(&node_b, "custom", &fetched, &local, &size));
	assert_int_equal(local, 0);

	/* In use: refused, naming the sandbox; after the destroy: gone. */
	assert_int_equal(image_call(&node_b, "RemoveImage", "custom",
	                     &moat__v1__remove_image_reply__descriptor, NULL),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(vmd_last_err, sb->id));
	vmd_destroy_sandbox(&node_b, sb->id);
	if (image_call(&node_b, "RemoveImage", "custom",
	        &moat__v1__remove_image_reply__descriptor, NULL) != MOAT_OK)
		fail_msg("RemoveImage after the destroy: %s", vmd_last_err);
	assert_false(lists_image(&node_b, "custom"));
	assert_int_equal(leftovers(img_b), 0);
	moat__v1__exec_result__free_unpacked(res, NULL);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	moat__v1__image_info__free_unpacked(info, NULL);
	moat__v1__image_info__free_unpacked(again, NULL);
}

/* Occurrences of needle in v's log. */
static int
log_count(const struct vmd_proc *v, const char *needle)
{
	char *log = NULL, *p;
	size_t len;
	int n = 0;

	if (moat_read_file(v->log, 1 << 24, &log, &len) != 0)
		return 0;
	for (p = log; (p = strstr(p, needle)) != NULL; p++)
		n++;
	free(log);
	return n;
}

static void *
pull_thread(void *arg)
{
	Moat__V1__ImageRef ref = MOAT__V1__IMAGE_REF__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = LONG_MS,
		.tenant = VMD_TENANT };
	ProtobufCMessage *r = NULL;
	char *err = NULL;

	ref.name = (char *)"custom";
	*(int *)arg = moat_rpc_call(node_b.client, VMD_SERVICE, "PullImage",
	    &ref.base, &moat__v1__image_info__descriptor, &r, &opts, &err);
	if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	free(err);
	return NULL;
}

/* With default in snapd too, node b (which holds default) pulls custom
 * again reading the shared chunks from its own default. */
static void
test_pull_reads_local(void **state)
{
	Moat__V1__ImageInfo *info = NULL;
	uint64_t fetched, local, size;

	(void)state;
	if (image_call(&node_a, "PushImage", "default",
	        &moat__v1__image_info__descriptor, NULL) != MOAT_OK)
		fail_msg("PushImage default: %s", vmd_last_err);
	if (image_call(&node_b, "PullImage", "custom",
	        &moat__v1__image_info__descriptor,
	        (ProtobufCMessage **)&info) != MOAT_OK)
		fail_msg("PullImage custom: %s", vmd_last_err);
	assert_string_equal(info->name, "custom");
	assert_true(info->stored);
	assert_true(pull_bytes(&node_b, "custom", &fetched, &local, &size));
	assert_true(local > 0);
	assert_true(fetched < size / 100);
	assert_same_image(img_a, img_b, "custom");
	assert_int_equal(leftovers(img_b), 1); /* custom */
	moat__v1__image_info__free_unpacked(info, NULL);

	/* Two pulls at once of an image the node lacks: one pull. */
	assert_int_equal(image_call(&node_b, "RemoveImage", "custom",
	                     &moat__v1__remove_image_reply__descriptor, NULL),
	    MOAT_OK);
	{
		int before = log_count(&node_b, "image custom pulled");
		pthread_t t;
		int rv_other = -1;

		assert_int_equal(pthread_create(&t, NULL, pull_thread,
		                     &rv_other),
		    0);
		assert_int_equal(image_call(&node_b, "PullImage", "custom",
		                     &moat__v1__image_info__descriptor, NULL),
		    MOAT_OK);
		pthread_join(t, NULL);
		assert_int_equal(rv_other, MOAT_OK);
		assert_int_equal(log_count(&node_b, "image custom pulled"),
		    before + 1);
	}
}

/* A chunk of rootfs.ext4 with a window of varied bytes (so the window
 * names it and nothing else): its offset, id (hex) and the window. */
static void
pick_chunk(uint64_t *off, char hex[65], char win[64])
{
	char *p = moat_asprintf("%s/rootfs.ext4", src_image);
	unsigned char *buf = malloc(CHUNK), md[SHA256_DIGEST_LENGTH];
	int fd = open(p, O_RDONLY);

	assert_true(fd >= 0 && buf != NULL);
	for (*off = (uint64_t)CHUNK * 16;; *off += CHUNK) {
		ssize_t n = pread(fd, buf, CHUNK, (off_t)*off);

		assert_int_equal(n, CHUNK);
		for (size_t w = 0; w + 64 <= CHUNK; w += 64) {
			bool seen[256] = { false };
			int distinct = 0;

			for (size_t i = 0; i < 64; i++)
				if (!seen[buf[w + i]]) {
					seen[buf[w + i]] = true;
					distinct++;
				}
			if (distinct < 40)
				continue;
			memcpy(win, buf + w, 64);
			SHA256(buf, CHUNK, md);
			for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
				sprintf(hex + 2 * i, "%02x", md[i]);
			close(fd);
			free(buf);
			free(p);
			return;
		}
	}
}

/* Flips a byte of every copy of `win` in snapd's LMDB file (snapd
 * stopped). Returns the copies flipped. */
static int
flip_in_db(const char win[64])
{
	enum { BLOCK = 1 << 20 };
	char *db = moat_asprintf("%s/snapd/data.mdb", snapd_dir);
	char *buf = malloc(BLOCK + 64);
	int fd = open(db, O_RDWR), flipped = 0;
	off_t pos = 0;
	ssize_t n;

	assert_true(fd >= 0 && buf != NULL);
	while ((n = pread(fd, buf, BLOCK + 63, pos)) >= 64) {
		for (ssize_t i = 0; i + 64 <= n; i++) {
			char b;

			if (memcmp(buf + i, win, 64) != 0)
				continue;
			b = (char)(buf[i + 32] ^ 0x40);
			assert_int_equal(pwrite(fd, &b, 1, pos + i + 32), 1);
			flipped++;
		}
		pos += BLOCK;
	}
	fsync(fd);
	close(fd);
	free(buf);
	free(db);
	return flipped;
}

static void
test_corrupt_chunk(void **state)
{
	char hex[65], win[64], where[64];
	uint64_t off;
	int rv;

	(void)state;
	pick_chunk(&off, hex, win);
	snapd_stop();
	assert_true(flip_in_db(win) > 0);
	snapd_start();
	/* What a crashed pull or removal left goes at the start. */
	{
		char *cmd = moat_asprintf(
		    "mkdir -p %s/.custom.pull.AbC123 %s/.custom.rm && "
		    "echo x > %s/.custom.pull.AbC123/rootfs.ext4 && "
		    "echo x > %s/.custom.rm/vmlinux",
		    img_c, img_c, img_c, img_c);

		run_or_fail(cmd);
		free(cmd);
		assert_int_equal(leftovers(img_c), 2);
	}
	node_start(&node_c, "node-c", img_c);
	assert_int_equal(leftovers(img_c), 0);
	rv = image_call(&node_c, "PullImage", "custom",
	    &moat__v1__image_info__descriptor, NULL);
	fprintf(stderr, "PullImage on node c: %s\n", vmd_last_err);
	assert_int_equal(rv, MOAT_DATA_LOSS);
	assert_non_null(strstr(vmd_last_err, hex));
	assert_non_null(strstr(vmd_last_err, "rootfs.ext4"));
	snprintf(where, sizeof(where), "offset %" PRIu64, off);
	assert_non_null(strstr(vmd_last_err, where));
	assert_non_null(strstr(vmd_last_err, "push the image again"));
	assert_int_equal(leftovers(img_c), 0);
	/* A create says the same and leaves nothing either. */
	{
		Moat__V1__CreateSandboxRequest cr =
		    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;

		cr.image = (char *)"custom";
		assert_int_equal(vmd_call(&node_c, "CreateSandbox", &cr.base,
		                     &moat__v1__sandbox__descriptor, NULL,
		                     LONG_MS),
		    MOAT_DATA_LOSS);
		assert_int_equal(leftovers(img_c), 0);
	}
	/* An image snapd never had: NOT_FOUND saying what to do. */
	assert_int_equal(image_call(&node_c, "PullImage", "nosuch",
	                     &moat__v1__image_info__descriptor, NULL),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(vmd_last_err, "moat image push nosuch"));
	/* snapd down: UNAVAILABLE, and still nothing left. */
	snapd_stop();
	assert_int_equal(image_call(&node_c, "PullImage", "custom",
	                     &moat__v1__image_info__descriptor, NULL),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(vmd_last_err, "moat-snapd"));
	assert_int_equal(leftovers(img_c), 0);
}

static int
build_start(const char *name, const char *spec, Moat__V1__ImageBuild **out)
{
	Moat__V1__ImageBuildRequest req = MOAT__V1__IMAGE_BUILD_REQUEST__INIT;
	Moat__V1__ImageInput in = MOAT__V1__IMAGE_INPUT__INIT;
	Moat__V1__ImageInput *inp[] = { &in };

	req.name = (char *)name;
	req.spec = (char *)spec;
	in.name = (char *)"hello.txt";
	in.data.data = (uint8_t *)"hi\n";
	in.data.len = 3;
	req.files = inp;
	req.n_files = 1;
	return vmd_call(&node_a, "StartImageBuild", &req.base,
	    &moat__v1__image_build__descriptor, (ProtobufCMessage **)out,
	    LONG_MS);
}

/* Long-polls build `id` to its end; the step texts joined by '|'. */
static Moat__V1__ImageBuild *
build_follow(const char *id, char *steps, size_t cap)
{
	Moat__V1__ImageBuildRef ref = MOAT__V1__IMAGE_BUILD_REF__INIT;
	Moat__V1__ImageBuild *b = NULL;

	steps[0] = '\0';
	ref.build_id = (char *)id;
	ref.wait_ms = 10000;
	for (int i = 0; i < 200; i++) {
		if (b != NULL)
			moat__v1__image_build__free_unpacked(b, NULL);
		b = NULL;
		assert_int_equal(vmd_call(&node_a, "GetImageBuild", &ref.base,
		                     &moat__v1__image_build__descriptor,
		                     (ProtobufCMessage **)&b, LONG_MS),
		    MOAT_OK);
		for (size_t k = 0; k < b->n_steps; k++)
			snprintf(steps + strlen(steps), cap - strlen(steps),
			    "%s|", b->steps[k]->text);
		ref.from_step = b->next_step;
		if (b->state !=
		    MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_RUNNING)
			return b;
	}
	fail_msg("build %s never ended", id);
	return NULL;
}

static void
test_builds(void **state)
{
	Moat__V1__ImageBuild *b = NULL, *end;
	Moat__V1__ImageBuildRef ref = MOAT__V1__IMAGE_BUILD_REF__INIT;
	char steps[1024], *release;

	(void)state;
	if (build_start("built", "[image]\nslow = 1\n", &b) != MOAT_OK)
		fail_msg("StartImageBuild: %s", vmd_last_err);
	/* One at a time: a second is refused, naming the first. */
	assert_int_equal(build_start("other", "[image]\n", NULL),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(vmd_last_err, b->id));
	release = moat_asprintf("%s/release", root);
	assert_int_equal(moat_write_file_atomic(release, "", 0, 0644), 0);
	end = build_follow(b->id, steps, sizeof(steps));
	assert_string_equal(steps, "step one|step two|step three|");
	assert_int_equal(end->state,
	    MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_DONE);
	assert_non_null(end->image);
	assert_string_equal(end->image->name, "built");
	assert_true(end->image->stored);
	assert_true(end->image->snapshot_id[0] != '\0');
	moat__v1__image_build__free_unpacked(end, NULL);
	moat__v1__image_build__free_unpacked(b, NULL);
	b = NULL;

	/* A spec the script refuses: FAILED, INVALID_ARGUMENT, its tail. */
	assert_int_equal(build_start("bad", "[image]\nfail = 1\n", &b),
	    MOAT_OK);
	end = build_follow(b->id, steps, sizeof(steps));
	assert_int_equal(end->state,
	    MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_FAILED);
	assert_int_equal(end->code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(end->error, "unknown key"));
	assert_non_null(strstr(end->error, "exit status 2"));
	moat__v1__image_build__free_unpacked(end, NULL);
	moat__v1__image_build__free_unpacked(b, NULL);

	/* Bad input names are refused before anything runs. */
	{
		Moat__V1__ImageBuildRequest req =
		    MOAT__V1__IMAGE_BUILD_REQUEST__INIT;
		Moat__V1__ImageInput in = MOAT__V1__IMAGE_INPUT__INIT;
		Moat__V1__ImageInput *inp[] = { &in };

		req.name = (char *)"x";
		req.spec = (char *)"[image]\n";
		in.name = (char *)"../etc";
		req.files = inp;
		req.n_files = 1;
		assert_int_equal(vmd_call(&node_a, "StartImageBuild",
		                     &req.base,
		                     &moat__v1__image_build__descriptor, NULL,
		                     LONG_MS),
		    MOAT_INVALID_ARGUMENT);
	}
	/* A vmd stop kills a running build's process group and removes
	 * its directory; the next vmd no longer knows the build. */
	assert_int_equal(build_start("hung", "[image]\nhang = 1\n", &b),
	    MOAT_OK);
	ref.build_id = b->id;
	ref.from_step = 0;
	ref.wait_ms = 10000;
	end = NULL;
	assert_int_equal(vmd_call(&node_a, "GetImageBuild", &ref.base,
	                     &moat__v1__image_build__descriptor,
	                     (ProtobufCMessage **)&end, LONG_MS),
	    MOAT_OK);
	assert_true(end->n_steps >= 1);
	moat__v1__image_build__free_unpacked(end, NULL);
	assert_true(vmd_procs_mentioning("fake-build.sh") > 0);
	vmd_stop(&node_a);
	/* SIGKILL is delivered, not waited for: give the group time. */
	for (int i = 0; i < 100 && vmd_procs_mentioning("fake-build.sh") > 0;
	     i++)
		usleep(50 * 1000);
	assert_int_equal(vmd_procs_mentioning("fake-build.sh"), 0);
	{
		char *dir =
		    moat_asprintf("%s/node-a/image-builds/%s", root, b->id);

		assert_int_not_equal(access(dir, F_OK), 0);
		free(dir);
	}
	node_start(&node_a, "node-a", img_a);
	ref.wait_ms = 0;
	assert_int_equal(vmd_call(&node_a, "GetImageBuild", &ref.base,
	                     &moat__v1__image_build__descriptor, NULL,
	                     LONG_MS),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(vmd_last_err, "restarted"));
	moat__v1__image_build__free_unpacked(b, NULL);
	ref.build_id = (char *)"build-0-0";
	assert_int_equal(vmd_call(&node_a, "GetImageBuild", &ref.base,
	                     &moat__v1__image_build__descriptor, NULL,
	                     LONG_MS),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(vmd_last_err, "restarted"));
	free(release);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_push_pull_create),
		cmocka_unit_test(test_pull_reads_local),
		cmocka_unit_test(test_builds),
		cmocka_unit_test(test_corrupt_chunk),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
