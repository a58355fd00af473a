/*
 * test_verify.c: services/vm/verify.c without a VM: the snapshot key
 * file, the manifest MAC (every sealed field and each digest changes it;
 * another key does not verify), artifact digests (a sparse file digests
 * like the same bytes written out; the verified-once cache hits until a
 * byte changes), the seal as snapd labels and back, a sealed snapshot
 * directory checked (a flipped byte in an artifact or the catalog entry
 * is DATA_LOSS naming it; an unsealed one FAILED_PRECONDITION) and an
 * image checked against its manifest.json. cmocka; label "unit".
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/sha.h>

#include "moat/status.h"
#include "moat/util.h"
#include "egress.h"
#include "node.h"
#include "verify.h"

static char tmpdir[] = "/tmp/moat-verify-XXXXXX";
static uint8_t key_a[VMD_SNAPSHOT_KEY_LEN], key_b[VMD_SNAPSHOT_KEY_LEN];

static void
write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	close(fd);
}

/* Flips one bit of byte `off` of path (in place: same inode). */
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

static void
test_key_file(void **state)
{
	uint8_t k1[VMD_SNAPSHOT_KEY_LEN], k2[VMD_SNAPSHOT_KEY_LEN];
	char *path = moat_asprintf("%s/snapshot.key", tmpdir);
	char *err = NULL;
	bool created;
	struct stat st;

	(void)state;
	assert_int_equal(vmd_verify_key_load(path, k1, &created, &err),
	    MOAT_OK);
	assert_true(created);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(st.st_size, VMD_SNAPSHOT_KEY_LEN);
	/* The second start reads the same key. */
	assert_int_equal(vmd_verify_key_load(path, k2, &created, &err),
	    MOAT_OK);
	assert_false(created);
	assert_memory_equal(k1, k2, sizeof(k1));
	/* Readable by others: refused, saying what to do. */
	assert_int_equal(chmod(path, 0644), 0);
	assert_int_equal(vmd_verify_key_load(path, k2, &created, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(err, "chmod 600"));
	free(err);
	err = NULL;
	/* Another size: refused. */
	write_file(path, "short", 5);
	assert_int_equal(chmod(path, 0600), 0);
	assert_int_equal(vmd_verify_key_load(path, k2, &created, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(err, "32 bytes"));
	free(err);
	unlink(path);
	free(path);
}

/* A sealed-looking entry with three fake digests (sealed under key). */
struct fake {
	Moat__V1__LocalSnapshot m;
	struct vmd_seal s;
};

static void
fake_init(struct fake *f)
{
	static const char *names[VMD_SEAL_N] = { "ram", "disk",
		"device_state" };

	memset(f, 0, sizeof(*f));
	moat__v1__local_snapshot__init(&f->m);
	f->m.snapshot_id = "snap-n-0011223344556677";
	f->m.sandbox_id = "sb-1";
	f->m.tenant = "acme";
	f->m.image = "default";
	f->m.image_stamp = "1.2/3.4/5.6";
	f->m.accel = "tcg";
	f->m.vmm = "qemu";
	f->m.vcpus = 1;
	f->m.memory_mib = 256;
	f->m.scratch_mib = 256;
	for (size_t i = 0; i < VMD_SEAL_N; i++) {
		moat__v1__snapshot_digest__init(&f->s.d[i]);
		snprintf(f->s.names[i], sizeof(f->s.names[i]), "%s", names[i]);
		f->s.d[i].name = f->s.names[i];
		f->s.d[i].size = 1000 + i;
		memset(f->s.sha[i], (int)(0x10 + i), VMD_DIGEST_LEN);
		f->s.d[i].sha256.data = f->s.sha[i];
		f->s.d[i].sha256.len = VMD_DIGEST_LEN;
		f->s.p[i] = &f->s.d[i];
	}
	f->m.digests = f->s.p;
	f->m.n_digests = VMD_SEAL_N;
}

static bool
mac_changed(const struct fake *f, const uint8_t base[VMD_DIGEST_LEN])
{
	uint8_t mac[VMD_DIGEST_LEN];

	vmd_seal_mac(key_a, &f->m, mac);
	return memcmp(mac, base, VMD_DIGEST_LEN) != 0;
}

/* The network policy (issue 14): "none" leaves seals made before it was
 * recorded as they were; an allowlist, and each entry of it, is sealed. */
static void
mac_network(struct fake *f, const uint8_t base[VMD_DIGEST_LEN])
{
	Moat__V1__NetworkPolicy np = MOAT__V1__NETWORK_POLICY__INIT;
	char *allow[2] = { "allowed.test", "pypi.org:443" };
	uint8_t listed[VMD_DIGEST_LEN];

	fake_init(f);
	np.mode = "none";
	f->m.network = &np;
	assert_false(mac_changed(f, base));
	np.mode = "allowlist";
	np.allow = allow;
	np.n_allow = 2;
	assert_true(mac_changed(f, base));
	vmd_seal_mac(key_a, &f->m, listed);
	allow[1] = "pypi.org:80";
	assert_true(mac_changed(f, listed));
	allow[1] = "pypi.org:443";
	np.n_allow = 1;
	assert_true(mac_changed(f, listed));
}

static void
test_manifest_mac(void **state)
{
	uint8_t base[VMD_DIGEST_LEN], again[VMD_DIGEST_LEN];
	struct fake f;

	(void)state;
	fake_init(&f);
	vmd_seal_mac(key_a, &f.m, base);
	vmd_seal_mac(key_a, &f.m, again);
	assert_memory_equal(base, again, VMD_DIGEST_LEN);
	/* Another key: another MAC. */
	vmd_seal_mac(key_b, &f.m, again);
	assert_memory_not_equal(base, again, VMD_DIGEST_LEN);
	/* Fields a restore uses, each one changed. */
#define CHANGES(stmt)                                                         \
	do {                                                                  \
		fake_init(&f);                                                \
		stmt;                                                         \
		assert_true(mac_changed(&f, base));                           \
	} while (0)
	CHANGES(f.m.tenant = "acmf");
	CHANGES(f.m.sandbox_id = "sb-2");
	CHANGES(f.m.image = "other");
	CHANGES(f.m.image_stamp = "1.2/3.4/5.7");
	CHANGES(f.m.accel = "kvm");
	CHANGES(f.m.vmm = "firecracker");
	CHANGES(f.m.vcpus = 2);
	CHANGES(f.m.memory_mib = 512);
	CHANGES(f.m.scratch_mib = 257);
	CHANGES(f.m.template_ = true);
	CHANGES(f.s.sha[1][7] ^= 1);
	CHANGES(f.s.d[2].size++);
	CHANGES(f.s.names[0][0] = 'R');
	CHANGES(f.m.n_digests = 2);
	/* Field boundaries count: moving a byte from one to the next is
	 * another message. */
	CHANGES((f.m.tenant = "acmes", f.m.sandbox_id = "b-1"));
#undef CHANGES
	/* Bookkeeping vmd rewrites (not sealed) leaves it as it was. */
	fake_init(&f);
	f.m.last_used_unix_ms = 42;
	f.m.location = "disk";
	assert_false(mac_changed(&f, base));
	mac_network(&f, base);
}

/* The snapd label "network" and back: exact (the seal covers the
 * strings), and anything a create would refuse is refused. */
static void
test_network_label(void **state)
{
	Moat__V1__NetworkPolicy np = MOAT__V1__NETWORK_POLICY__INIT;
	Moat__V1__NetworkPolicy *back = NULL;
	char *allow[2] = { "allowed.test", "*.example.org:8443" };
	char *label;

	(void)state;
	label = vmd_egress_label(NULL);
	assert_string_equal(label, "none");
	free(label);
	np.mode = "allowlist";
	np.allow = allow;
	np.n_allow = 2;
	label = vmd_egress_label(&np);
	assert_string_equal(label,
	    "allowlist:allowed.test,*.example.org:8443");
	assert_int_equal(vmd_egress_from_label(label, &back), MOAT_OK);
	assert_non_null(back);
	assert_string_equal(back->mode, "allowlist");
	assert_int_equal(back->n_allow, 2);
	assert_string_equal(back->allow[0], "allowed.test");
	assert_string_equal(back->allow[1], "*.example.org:8443");
	moat__v1__network_policy__free_unpacked(back, NULL);
	free(label);
	assert_int_equal(vmd_egress_from_label("none", &back), MOAT_OK);
	assert_string_equal(back->mode, "none");
	assert_int_equal(back->n_allow, 0);
	moat__v1__network_policy__free_unpacked(back, NULL);
	/* Pushed before the label: unset, so "none". */
	assert_int_equal(vmd_egress_from_label("", &back), MOAT_OK);
	assert_null(back);
	assert_int_equal(vmd_egress_from_label("all", &back),
	    MOAT_INVALID_ARGUMENT);
	assert_null(back);
	assert_int_equal(vmd_egress_from_label("allowlist:127.0.0.1", &back),
	    MOAT_INVALID_ARGUMENT);
	assert_null(back);
	assert_int_equal(vmd_egress_from_label("allowlist:a.test,,b:99999",
	                     &back),
	    MOAT_INVALID_ARGUMENT);
	assert_null(back);
}

static void
test_file_digest_and_cache(void **state)
{
	struct vmd_verify *v = vmd_verify_new(key_a);
	char *sparse = moat_asprintf("%s/sparse", tmpdir);
	char *dense = moat_asprintf("%s/dense", tmpdir);
	uint8_t d1[VMD_DIGEST_LEN], d2[VMD_DIGEST_LEN], d3[VMD_DIGEST_LEN];
	uint8_t *buf = calloc(1, 5u << 20);
	uint64_t size = 0;
	bool cached = true;
	int fd;

	(void)state;
	assert_non_null(v);
	/* 5 MiB + 3 B: holes but for a few bytes at 2 MiB + 5. */
	fd = open(sparse, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (5 << 20) + 3), 0);
	assert_int_equal(pwrite(fd, "abc", 3, (2 << 20) + 5), 3);
	close(fd);
	memcpy(buf + (2 << 20) + 5, "abc", 3);
	fd = open(dense, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, (5 << 20)), 5 << 20);
	assert_int_equal(write(fd, "\0\0\0", 3), 3);
	close(fd);

	assert_int_equal(vmd_verify_file(v, sparse, false, d1, &size, &cached),
	    0);
	assert_false(cached);
	assert_int_equal(size, (5u << 20) + 3);
	assert_int_equal(vmd_verify_file(v, dense, false, d2, &size, &cached),
	    0);
	assert_memory_equal(d1, d2, VMD_DIGEST_LEN);
	/* Verified once: the second look is the cache's. */
	assert_int_equal(vmd_verify_file(v, sparse, false, d3, &size, &cached),
	    0);
	assert_true(cached);
	assert_memory_equal(d1, d3, VMD_DIGEST_LEN);
	/* A changed byte changes ctime: hashed again, another digest. */
	flip(sparse, (2 << 20) + 6);
	assert_int_equal(vmd_verify_file(v, sparse, false, d3, &size, &cached),
	    0);
	assert_false(cached);
	assert_memory_not_equal(d1, d3, VMD_DIGEST_LEN);
	/* Flipped back: the bytes decide, not the stat key. */
	flip(sparse, (2 << 20) + 6);
	assert_int_equal(vmd_verify_file(v, sparse, false, d3, &size, &cached),
	    0);
	assert_false(cached);
	assert_memory_equal(d1, d3, VMD_DIGEST_LEN);
	/* plain: the SHA-256 of the bytes, as images/build.sh writes. */
	assert_int_equal(vmd_verify_file(v, dense, true, d3, &size, &cached),
	    0);
	{
		uint8_t *all = calloc(1, (5u << 20) + 3);

		memcpy(all + (2 << 20) + 5, "abc", 3);
		SHA256(all, (5u << 20) + 3, d2);
		free(all);
	}
	assert_memory_equal(d2, d3, VMD_DIGEST_LEN);
	assert_int_equal(vmd_verify_file(v, "/nonexistent/x", false, d3, &size,
	                     NULL),
	    ENOENT);
	unlink(sparse);
	unlink(dense);
	free(sparse);
	free(dense);
	free(buf);
	vmd_verify_free(v);
}

static void
test_seal_labels(void **state)
{
	Moat__V1__SnapshotInfo info = MOAT__V1__SNAPSHOT_INFO__INIT;
	Moat__V1__SnapLabel labels[VMD_SEAL_N + 1];
	Moat__V1__SnapLabel *ptrs[VMD_SEAL_N + 1];
	char kv[VMD_SEAL_N + 1][2][VMD_SEAL_LABEL_MAX];
	Moat__V1__LocalSnapshot back = MOAT__V1__LOCAL_SNAPSHOT__INIT;
	struct vmd_seal buf;
	struct fake f;
	size_t n = 0;

	(void)state;
	fake_init(&f);
	vmd_seal_mac(key_a, &f.m, f.s.mac);
	f.m.seal.data = f.s.mac;
	f.m.seal.len = VMD_DIGEST_LEN;
	while (
	    n <= VMD_SEAL_N && vmd_seal_label(&f.m, n, kv[n][0], kv[n][1])) {
		moat__v1__snap_label__init(&labels[n]);
		labels[n].key = kv[n][0];
		labels[n].value = kv[n][1];
		assert_true(strlen(kv[n][1]) < 256); /* SNAPD_MAX_TEXT */
		ptrs[n] = &labels[n];
		n++;
	}
	assert_int_equal(n, VMD_SEAL_N + 1);
	info.labels = ptrs;
	info.n_labels = n;
	back = f.m;
	back.digests = NULL;
	back.n_digests = 0;
	back.seal.len = 0;
	assert_true(vmd_seal_from_info(&info, &back, &buf));
	assert_int_equal(back.n_digests, VMD_SEAL_N);
	{
		uint8_t mac[VMD_DIGEST_LEN];

		vmd_seal_mac(key_a, &back, mac);
		assert_memory_equal(mac, f.s.mac, VMD_DIGEST_LEN);
		assert_memory_equal(back.seal.data, f.s.mac, VMD_DIGEST_LEN);
	}
	/* A malformed digest label is refused, not half read. */
	kv[1][1][0] = 'x';
	assert_false(vmd_seal_from_info(&info, &back, &buf));
	/* No seal label: left unsealed (refused at restore). */
	info.n_labels = 0;
	back.seal.len = 0;
	assert_true(vmd_seal_from_info(&info, &back, &buf));
	assert_int_equal(back.seal.len, 0);
}

/* A snapshot directory with three artifacts, sealed. */
static void
make_snapshot_dir(const char *dir)
{
	char *p;

	assert_int_equal(moat_mkdir_p(dir, 0700), 0);
	p = moat_asprintf("%s/device_state", dir);
	write_file(p, "device state bytes", 18);
	free(p);
	p = moat_asprintf("%s/ram", dir);
	{
		int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, 8 << 20), 0);
		assert_int_equal(pwrite(fd, "guest", 5, 3 << 20), 5);
		close(fd);
	}
	free(p);
	p = moat_asprintf("%s/scratch.ext4", dir);
	write_file(p, "scratch", 7);
	free(p);
}

static void
test_snapshot_verify(void **state)
{
	struct vmd *vmd = calloc(1, sizeof(*vmd));
	char *dir = moat_asprintf("%s/snap", tmpdir);
	char *p = NULL, *err = NULL;
	struct fake f;

	(void)state;
	vmd->verify = vmd_verify_new(key_a);
	make_snapshot_dir(dir);
	fake_init(&f);
	f.m.digests = NULL;
	f.m.n_digests = 0;
	/* Unsealed (taken before issue 14): refused, take a new one. */
	assert_int_equal(vmd_snapshot_verify(vmd, NULL, &f.m, dir, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(err, "no seal"));
	free(err);
	assert_int_equal(vmd_snapshot_seal(vmd, &f.m, dir, &f.s, &err),
	    MOAT_OK);
	assert_int_equal(vmd_snapshot_verify(vmd, NULL, &f.m, dir, &err),
	    MOAT_OK);
	/* A flipped byte in each artifact: DATA_LOSS naming it; flipped
	 * back, it verifies again. */
	{
		static const struct {
			const char *file, *name;
			off_t off;
		} cases[] = {
			{ "device_state", "its device_state", 3 },
			{ "ram", "its ram", (3 << 20) + 1 },
			{ "ram", "its ram", 100 }, /* in a hole */
			{ "scratch.ext4", "its disk", 0 },
		};

		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			p = moat_asprintf("%s/%s", dir, cases[i].file);
			flip(p, cases[i].off);
			assert_int_equal(vmd_snapshot_verify(vmd, NULL, &f.m,
			                     dir, &err),
			    MOAT_DATA_LOSS);
			assert_non_null(strstr(err, cases[i].name));
			assert_non_null(strstr(err, "nothing was started"));
			free(err);
			flip(p, cases[i].off);
			assert_int_equal(vmd_snapshot_verify(vmd, NULL, &f.m,
			                     dir, &err),
			    MOAT_OK);
			free(p);
		}
	}
	/* The catalog entry changed: the seal does not match. */
	f.m.memory_mib = 4096;
	assert_int_equal(vmd_snapshot_verify(vmd, NULL, &f.m, dir, &err),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(err, "does not match its seal"));
	free(err);
	f.m.memory_mib = 256;
	/* Sealed under another node's key (not the cluster's): refused. */
	vmd_verify_free(vmd->verify);
	vmd->verify = vmd_verify_new(key_b);
	assert_int_equal(vmd_snapshot_verify(vmd, NULL, &f.m, dir, &err),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(err, "snapshot-key-file"));
	free(err);
	/* An artifact gone: DATA_LOSS naming it. */
	vmd_verify_free(vmd->verify);
	vmd->verify = vmd_verify_new(key_a);
	p = moat_asprintf("%s/device_state", dir);
	unlink(p);
	free(p);
	assert_int_equal(vmd_snapshot_verify(vmd, NULL, &f.m, dir, &err),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(err, "device_state"));
	free(err);
	assert_int_equal(moat_rm_rf(dir), 0);
	vmd_verify_free(vmd->verify);
	free(vmd);
	free(dir);
}

static void
test_image_verify(void **state)
{
	struct vmd *vmd = calloc(1, sizeof(*vmd));
	char *img = moat_asprintf("%s/images/default", tmpdir);
	static const char *files[] = { "vmlinux", "initrd.img",
		"rootfs.ext4" };
	char *manifest = NULL, *p, *err = NULL;
	char id[65], id2[65];
	uint8_t sha[32];

	(void)state;
	vmd->verify = vmd_verify_new(key_a);
	vmd->cfg.image_dir = moat_asprintf("%s/images", tmpdir);
	assert_int_equal(moat_mkdir_p(img, 0755), 0);
	/* No manifest: refused, saying how to rebuild. */
	assert_int_equal(vmd_image_verify(vmd, "default", id, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(err, "images/build.sh"));
	free(err);
	manifest = strdup("{\"name\": \"default\", \"files\": {");
	for (size_t i = 0; i < 3; i++) {
		char hexs[65], *next;

		p = moat_asprintf("%s/%s", img, files[i]);
		write_file(p, files[i], strlen(files[i]));
		free(p);
		SHA256((const uint8_t *)files[i], strlen(files[i]), sha);
		for (size_t k = 0; k < 32; k++)
			snprintf(hexs + 2 * k, 3, "%02x", sha[k]);
		next = moat_asprintf("%s%s\"%s\": {\"sha256\": \"%s\", "
		                     "\"size\": %zu}",
		    manifest, i ? ", " : "", files[i], hexs, strlen(files[i]));
		free(manifest);
		manifest = next;
	}
	p = moat_asprintf("%s}}\n", manifest);
	free(manifest);
	manifest = p;
	p = moat_asprintf("%s/manifest.json", img);
	write_file(p, manifest, strlen(manifest));
	free(p);
	assert_int_equal(vmd_image_verify(vmd, "default", id, &err), MOAT_OK);
	/* The id is the SHA-256 of manifest.json. */
	SHA256((const uint8_t *)manifest, strlen(manifest), sha);
	for (size_t k = 0; k < 32; k++)
		snprintf(id2 + 2 * k, 3, "%02x", sha[k]);
	assert_string_equal(id, id2);
	assert_int_equal(vmd_images_verify_all(vmd), 0);
	/* A changed byte in the root filesystem: refused, naming it. */
	p = moat_asprintf("%s/rootfs.ext4", img);
	flip(p, 2);
	free(p);
	assert_int_equal(vmd_image_verify(vmd, "default", id, &err),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(err, "rootfs.ext4"));
	assert_non_null(strstr(err, "rebuild"));
	free(err);
	assert_int_equal(vmd_images_verify_all(vmd), 1);
	free(manifest);
	free(img);
	free(vmd->cfg.image_dir);
	vmd_verify_free(vmd->verify);
	free(vmd);
}

static int
setup(void **state)
{
	(void)state;
	if (mkdtemp(tmpdir) == NULL)
		return -1;
	memset(key_a, 0xa5, sizeof(key_a));
	memset(key_b, 0x5a, sizeof(key_b));
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	return moat_rm_rf(tmpdir) == 0 ? 0 : -1;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_file),
		cmocka_unit_test(test_manifest_mac),
		cmocka_unit_test(test_network_label),
		cmocka_unit_test(test_file_digest_and_cache),
		cmocka_unit_test(test_seal_labels),
		cmocka_unit_test(test_snapshot_verify),
		cmocka_unit_test(test_image_verify),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
