/*
 * test_driver.c: the contract test of the Firecracker driver
 * (firecracker.c): its ops run with fc_double.py as the `firecracker`
 * binary, a test double that checks every API request against
 * Firecracker's OpenAPI spec and records it. A boot sends exactly the
 * expected, valid configuration; the agent is reached through the hybrid
 * vsock handshake; pause, snapshot create, resume and snapshot load into a
 * fresh process work, and so do vmm.h's snapshot, restore and resume ops
 * built on them; and each bad input fails with a message a person
 * can act on and no process left behind: Firecracker missing, no KVM, a
 * kernel that is not an ELF vmlinux, an API fault, a Firecracker that
 * exits or never listens, a vsock that answers wrongly. Not for: real
 * VMs (tests/integration) or the jail layout (test_jail.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "firecracker.h"
#include "moat/status.h"
#include "moat/util.h"
#include "spawn.h"

struct box {
	char dir[64];
	char *kernel;
	char *initrd;
	char *rootfs;
	char *scratch;
	char *log; /* the double's request log */
	struct moat_vmm_spec spec;
	struct moat_vmm vm;
};

static const char *dbl; /* fc_double.py */

static void
write_bytes(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	close(fd);
}

/* A bzImage stand-in: "HdrS" at 0x202, as in the x86 boot header. */
static void
make_bzimage(const char *path)
{
	char img[0x400] = { 0 };

	memcpy(img + 0x202, "HdrS", 4);
	write_bytes(path, img, sizeof(img));
}

static void
make_elf(const char *path)
{
	char img[64] = "\177ELF\2\1\1";

	write_bytes(path, img, sizeof(img));
}

static void
box_init(struct box *b, bool with_vmlinux)
{
	char *p;

	memset(b, 0, sizeof(*b));
	snprintf(b->dir, sizeof(b->dir), "/tmp/fc-drv-XXXXXX");
	assert_non_null(mkdtemp(b->dir));
	p = moat_asprintf("%s/image", b->dir);
	assert_int_equal(mkdir(p, 0755), 0);
	b->kernel = moat_asprintf("%s/vmlinuz", p);
	b->initrd = moat_asprintf("%s/initrd.img", p);
	b->rootfs = moat_asprintf("%s/rootfs.ext4", p);
	make_bzimage(b->kernel);
	if (with_vmlinux) {
		char *vmlinux = moat_asprintf("%s/vmlinux", p);
		make_elf(vmlinux);
		free(vmlinux);
	}
	write_bytes(b->initrd, "initrd", 6);
	write_bytes(b->rootfs, "rootfs", 6);
	free(p);
	b->scratch = moat_asprintf("%s/scratch.ext4", b->dir);
	write_bytes(b->scratch, "scratch", 7);
	b->log = moat_asprintf("%s/double.jsonl", b->dir);
	setenv("FC_DOUBLE_LOG", b->log, 1);
	b->spec.sandbox_id = "sb-00000000000000aa";
	b->spec.dir = b->dir;
	b->spec.kernel = b->kernel;
	b->spec.initrd = b->initrd;
	b->spec.rootfs = b->rootfs;
	b->spec.scratch_disk = b->scratch;
	b->spec.vcpus = 2;
	b->spec.memory_mib = 256;
	b->spec.accel = "kvm";
}

/* Stops (if running), reaps and releases the VM, removes the folder. */
static void
box_fini(struct box *b)
{
	if (b->vm.pid > 0) {
		moat_vmm_firecracker.stop(&b->vm, true);
		waitpid(b->vm.pid, NULL, 0);
	}
	moat_vmm_firecracker.release(&b->vm);
	(void)moat_rm_rf(b->dir);
	free(b->kernel);
	free(b->initrd);
	free(b->rootfs);
	free(b->scratch);
	free(b->log);
}

/* The double's request log as a JSON array. */
static json_t *
requests(const struct box *b)
{
	json_t *all = json_array();
	char *text = NULL;
	size_t len;
	char *line;
	char *save = NULL;

	if (moat_read_file(b->log, 1 << 20, &text, &len) != 0)
		return all;
	for (line = strtok_r(text, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		json_t *e = json_loads(line, 0, NULL);
		assert_non_null(e);
		json_array_append_new(all, e);
	}
	free(text);
	return all;
}

/* Every request the double saw that was not a GET, as "PUT /x" lines;
 * with `strict`, fails the test if the double refused any. */
static char *
config_calls_of(const struct box *b, bool strict)
{
	json_t *all = requests(b);
	char *out = strdup("");
	size_t i;
	json_t *e;

	json_array_foreach (all, i, e) {
		const char *m =
		    json_string_value(json_object_get(e, "method"));
		char *next;

		if (strict &&
		    json_integer_value(json_object_get(e, "status")) >= 300)
			fail_msg("the double refused %s %s: %s", m,
			    json_string_value(json_object_get(e, "path")),
			    json_string_value(json_object_get(e, "fault")));
		if (strcmp(m, "GET") == 0)
			continue;
		next = moat_asprintf("%s%s %s\n", out, m,
		    json_string_value(json_object_get(e, "path")));
		free(out);
		out = next;
	}
	json_decref(all);
	return out;
}

static char *
config_calls(const struct box *b)
{
	return config_calls_of(b, true);
}

/* The body of the first request to `path`; borrowed from *all. */
static json_t *
body_of(json_t *all, const char *path)
{
	size_t i;
	json_t *e;

	json_array_foreach (all, i, e)
		if (strcmp(json_string_value(json_object_get(e, "path")),
		        path) == 0)
			return json_object_get(e, "body");
	fail_msg("no request to %s", path);
	return NULL;
}

static void
assert_no_children(void)
{
	errno = 0;
	assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
	assert_int_equal(errno, ECHILD);
}

static void
assert_has(const char *text, const char *needle)
{
	if (text == NULL || strstr(text, needle) == NULL)
		fail_msg("\"%s\" lacks \"%s\"", text ? text : "(null)",
		    needle);
}

static int
connect_retry(const struct moat_vmm *vm, int *fd)
{
	char *err = NULL;
	int rv = MOAT_UNAVAILABLE;

	for (int i = 0; i < 300 && rv == MOAT_UNAVAILABLE; i++) {
		rv = moat_vmm_firecracker.connect_agent(vm, fd, &err);
		if (rv == MOAT_UNAVAILABLE)
			usleep(10000);
	}
	if (rv != MOAT_OK)
		fail_msg("connect_agent: %s", err ? err : "?");
	return rv;
}

static void
assert_echo(int fd)
{
	char buf[8] = "";

	assert_int_equal(write(fd, "ping\n", 5), 5);
	assert_int_equal(read(fd, buf, 5), 5);
	assert_memory_equal(buf, "ping\n", 5);
}

static int
group_setup(void **state)
{
	struct moat_fc_config cfg;
	char *err = NULL;

	(void)state;
	dbl = getenv("FC_DOUBLE");
	if (dbl == NULL || getenv("FC_DOUBLE_SPEC") == NULL)
		return -1;
	if (moat_spawner_start() != 0)
		return -1;
	moat_fc_config_defaults(&cfg);
	if (moat_vmm_firecracker_configure(&cfg, &err) != MOAT_OK)
		return -1;
	return 0;
}

static int
test_setup(void **state)
{
	struct moat_fc_config cfg;
	char *err = NULL;

	(void)state;
	unsetenv("FC_DOUBLE_MODE");
	unsetenv("FC_DOUBLE_VSOCK_ANSWER");
	setenv("FC_DOUBLE_VSOCK_CLOSE", "2", 1);
	moat_fc_config_defaults(&cfg);
	/* The double is python loading a 1900-line spec: give it time on a
	 * busy machine. */
	cfg.api_timeout_ms = 30000;
	assert_int_equal(moat_vmm_firecracker_configure(&cfg, &err), 0);
	return 0;
}

static void
test_boot_sequence(void **state)
{
	struct box b;
	char *err = NULL;
	char *calls;
	json_t *all;
	json_t *body;
	int fd = -1;

	(void)state;
	box_init(&b, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_OK);
	assert_null(err);
	assert_true(b.vm.pid > 0);
	calls = config_calls(&b);
	assert_string_equal(calls,
	    "PUT /logger\n"
	    "PUT /metrics\n"
	    "PUT /machine-config\n"
	    "PUT /boot-source\n"
	    "PUT /drives/rootfs\n"
	    "PUT /drives/scratch\n"
	    "PUT /vsock\n"
	    "PUT /actions\n");
	free(calls);
	all = requests(&b);
	body = body_of(all, "/machine-config");
	assert_int_equal(json_integer_value(
	                     json_object_get(body, "vcpu_count")),
	    2);
	assert_int_equal(json_integer_value(
	                     json_object_get(body, "mem_size_mib")),
	    256);
	body = body_of(all, "/boot-source");
	/* vmd names vmlinuz; the driver boots the vmlinux beside it. */
	assert_string_equal(json_string_value(
	                        json_object_get(body, "kernel_image_path")),
	    "vmlinux");
	assert_has(json_string_value(json_object_get(body, "boot_args")),
	    "moat.vsock=1024");
	assert_has(json_string_value(json_object_get(body, "boot_args")),
	    "moat.root=LABEL=moat-root");
	body = body_of(all, "/drives/rootfs");
	assert_true(json_is_true(json_object_get(body, "is_read_only")));
	assert_true(json_is_false(json_object_get(body, "is_root_device")));
	body = body_of(all, "/drives/scratch");
	assert_true(json_is_false(json_object_get(body, "is_read_only")));
	assert_string_equal(json_string_value(
	                        json_object_get(body, "path_on_host")),
	    "scratch.ext4");
	body = body_of(all, "/vsock");
	assert_true(
	    json_integer_value(json_object_get(body, "guest_cid")) >= 3);
	assert_string_equal(
	    json_string_value(json_object_get(body, "action_type") ?
	            json_object_get(body, "action_type") :
	            json_object_get(body_of(all, "/actions"), "action_type")),
	    "InstanceStart");
	json_decref(all);

	/* The logger file is the one vmd reads. */
	{
		char *text = NULL;
		size_t len;

		assert_int_equal(moat_read_file(b.vm.vmm_log, 1 << 16, &text,
		                     &len),
		    0);
		assert_has(text, "PUT /actions done");
		free(text);
	}

	/* The double closes the first two connections like a booting
	 * guest; then CONNECT 1024 -> OK and the stream is the agent's. */
	assert_int_equal(connect_retry(&b.vm, &fd), MOAT_OK);
	assert_echo(fd);
	close(fd);

	moat_vmm_firecracker.stop(&b.vm, false);
	assert_int_equal(waitpid(b.vm.pid, NULL, 0), b.vm.pid);
	b.vm.pid = 0;
	box_fini(&b);
	assert_no_children();
}

static void
test_cids_are_unique(void **state)
{
	struct box a, b;
	char *err = NULL;
	json_t *ra, *rb;

	(void)state;
	box_init(&a, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &a.spec, &a.vm, &err),
	    MOAT_OK);
	box_init(&b, true);
	b.spec.sandbox_id = "sb-00000000000000bb";
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_OK);
	ra = requests(&a);
	rb = requests(&b);
	assert_int_not_equal(json_integer_value(
	                         json_object_get(body_of(ra, "/vsock"),
	                             "guest_cid")),
	    json_integer_value(
	        json_object_get(body_of(rb, "/vsock"), "guest_cid")));
	json_decref(ra);
	json_decref(rb);
	box_fini(&a);
	box_fini(&b);
	assert_no_children();
}

static void
test_kernel_not_vmlinux(void **state)
{
	struct box b;
	char *err = NULL;
	struct stat st;

	(void)state;
	box_init(&b, false);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "vmlinux");
	assert_has(err, "bzImage");
	assert_has(err, "images/build.sh");
	free(err);
	assert_int_equal(b.vm.pid, 0);
	assert_int_not_equal(stat(b.log, &st), 0); /* nothing spawned */
	box_fini(&b);
	assert_no_children();
}

static void
test_firecracker_missing(void **state)
{
	struct box b;
	char *err = NULL;
	char *version = NULL;

	(void)state;
	assert_int_equal(moat_vmm_firecracker.probe("/nonexistent/firecracker",
	                     &version, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_null(version);
	assert_has(err, "/nonexistent/firecracker");
	assert_has(err, "/usr/local/bin/firecracker");
	assert_has(err, "releases");
	free(err);
	assert_int_equal(moat_vmm_firecracker.probe("no-such-firecracker-xyz",
	                     &version, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "PATH=");
	free(err);
	box_init(&b, true);
	assert_int_equal(moat_vmm_firecracker.start("no-such-firecracker-xyz",
	                     &b.spec, &b.vm, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "install");
	free(err);
	box_fini(&b);
}

static void
test_probe_needs_kvm(void **state)
{
	struct moat_fc_config cfg;
	char *err = NULL;
	char *version = NULL;

	(void)state;
	moat_fc_config_defaults(&cfg);
	cfg.kvm_device = "/nonexistent/kvm";
	assert_int_equal(moat_vmm_firecracker_configure(&cfg, &err), 0);
	/* The version check passes (the double prints one), KVM does not. */
	assert_int_equal(moat_vmm_firecracker.probe(dbl, &version, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_null(version);
	assert_has(err, "/nonexistent/kvm");
	assert_has(err, "driver=qemu");
	free(err);
}

static void
test_exits_during_start(void **state)
{
	struct box b;
	char *err = NULL;

	(void)state;
	setenv("FC_DOUBLE_MODE", "exit-early", 1);
	box_init(&b, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "exit code 152 (bad configuration)");
	assert_has(err, "RunWithApiError"); /* its last lines */
	assert_has(err, b.spec.sandbox_id);
	free(err);
	assert_int_equal(b.vm.pid, 0);
	assert_null(b.vm.agent_socket);
	box_fini(&b);
	assert_no_children();
}

static void
test_exits_mid_configuration(void **state)
{
	struct box b;
	char *err = NULL;

	(void)state;
	setenv("FC_DOUBLE_MODE", "exit-on=/drives/scratch", 1);
	box_init(&b, true);
	assert_int_not_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm,
	                         &err),
	    MOAT_OK);
	assert_has(err, "/drives/scratch");
	free(err);
	assert_int_equal(b.vm.pid, 0);
	box_fini(&b);
	assert_no_children();
}

static void
test_api_fault_reaches_message(void **state)
{
	struct box b;
	char *err = NULL;

	(void)state;
	setenv("FC_DOUBLE_MODE", "fault=/boot-source", 1);
	box_init(&b, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "Injected fault for /boot-source");
	assert_has(err, "PUT /boot-source");
	assert_has(err, "firecracker.log"); /* where to look */
	free(err);
	assert_int_equal(b.vm.pid, 0);
	box_fini(&b);
	assert_no_children();
}

static void
test_never_listens(void **state)
{
	struct moat_fc_config cfg;
	struct box b;
	char *err = NULL;

	(void)state;
	moat_fc_config_defaults(&cfg);
	cfg.api_timeout_ms = 300;
	assert_int_equal(moat_vmm_firecracker_configure(&cfg, &err), 0);
	setenv("FC_DOUBLE_MODE", "no-socket", 1);
	box_init(&b, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_DEADLINE_EXCEEDED);
	assert_has(err, "did not answer");
	assert_has(err, "300 ms");
	free(err);
	box_fini(&b);
	assert_no_children();
}

static void
test_refuses_tcg(void **state)
{
	struct box b;
	char *err = NULL;

	(void)state;
	box_init(&b, true);
	b.spec.accel = "tcg";
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "driver=qemu");
	free(err);
	box_fini(&b);
}

static void
test_vsock_wrong_answer(void **state)
{
	struct box b;
	char *err = NULL;
	int fd = -1;

	(void)state;
	setenv("FC_DOUBLE_VSOCK_CLOSE", "0", 1);
	setenv("FC_DOUBLE_VSOCK_ANSWER", "HELLO\n", 1);
	box_init(&b, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err),
	    MOAT_OK);
	assert_int_equal(moat_vmm_firecracker.connect_agent(&b.vm, &fd, &err),
	    MOAT_INTERNAL);
	assert_int_equal(fd, -1);
	assert_has(err, "HELLO");
	assert_has(err, "CONNECT 1024");
	free(err);
	box_fini(&b);
	assert_no_children();
}

static void
test_snapshot_cycle(void **state)
{
	struct box a, b;
	char *err = NULL;
	char *state_file = NULL;
	char *mem_file = NULL;
	char *calls;
	json_t *all;
	json_t *body;
	struct stat st;
	int fd = -1;

	(void)state;
	box_init(&a, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &a.spec, &a.vm, &err),
	    MOAT_OK);
	/* Not paused: Firecracker's refusal comes back. */
	assert_int_equal(moat_fc_snapshot_create(&a.vm, "s1", false,
	                     &state_file, &mem_file, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "must be paused");
	assert_has(err, "pause it first");
	free(err);
	assert_int_equal(moat_fc_vm_pause(&a.vm, &err), MOAT_OK);
	assert_int_equal(moat_fc_vm_pause(&a.vm, &err), MOAT_OK);
	assert_int_equal(moat_fc_snapshot_create(&a.vm, "../s1", false,
	                     &state_file, &mem_file, &err),
	    MOAT_INVALID_ARGUMENT);
	free(err);
	assert_int_equal(moat_fc_snapshot_create(&a.vm, "s1", true,
	                     &state_file, &mem_file, &err),
	    MOAT_FAILED_PRECONDITION);
	assert_has(err, "track-dirty-pages");
	free(err);
	assert_int_equal(moat_fc_snapshot_create(&a.vm, "s1", false,
	                     &state_file, &mem_file, &err),
	    MOAT_OK);
	assert_int_equal(stat(state_file, &st), 0);
	assert_int_equal(stat(mem_file, &st), 0);
	assert_int_equal(moat_fc_vm_resume(&a.vm, &err), MOAT_OK);
	all = requests(&a);
	body = body_of(all, "/snapshot/create");
	assert_string_equal(json_string_value(
	                        json_object_get(body, "snapshot_type")),
	    "Full");
	json_decref(all);
	calls = config_calls_of(&a, false);
	/* The bad name and the Diff were refused before sending. */
	assert_has(calls,
	    "PUT /actions\nPUT /snapshot/create\nPATCH /vm\n"
	    "PATCH /vm\nPUT /snapshot/create\nPATCH /vm\n");
	free(calls);

	/* Load into a fresh process in another sandbox folder. */
	box_init(&b, false);
	b.spec.sandbox_id = "sb-00000000000000bb";
	assert_int_equal(moat_fc_snapshot_load(dbl, &b.spec, state_file,
	                     mem_file, true, &b.vm, &err),
	    MOAT_OK);
	calls = config_calls(&b);
	assert_string_equal(calls,
	    "PUT /logger\nPUT /metrics\n"
	    "PUT /snapshot/load\n");
	free(calls);
	all = requests(&b);
	body = body_of(all, "/snapshot/load");
	assert_string_equal(json_string_value(
	                        json_object_get(json_object_get(body,
	                                            "mem_backend"),
	                            "backend_type")),
	    "File");
	assert_true(json_is_true(json_object_get(body, "resume_vm")));
	json_decref(all);
	/* The vsock comes back at the same relative path, in b's folder. */
	assert_int_equal(connect_retry(&b.vm, &fd), MOAT_OK);
	assert_echo(fd);
	close(fd);
	box_fini(&b);

	/* A memory file that is not there: refused before any spawn. */
	box_init(&b, false);
	assert_int_equal(moat_fc_snapshot_load(dbl, &b.spec, state_file,
	                     "/nonexistent/snap.mem", true, &b.vm, &err),
	    MOAT_NOT_FOUND);
	assert_has(err, "/nonexistent/snap.mem");
	free(err);
	box_fini(&b);

	free(state_file);
	free(mem_file);
	box_fini(&a);
	/* Released: its API calls are refused, not sent anywhere. */
	assert_int_not_equal(moat_fc_vm_pause(&a.vm, &err), MOAT_OK);
	free(err);
	assert_no_children();
}

/* The last request the double saw; borrowed from all. */
static json_t *
last_request(json_t *all)
{
	assert_true(json_array_size(all) > 0);
	return json_array_get(all, json_array_size(all) - 1);
}

/* vmm.h's snapshot, restore and resume ops: the snapshot directory gets
 * device_state, ram and a copy of the scratch disk, the VM runs again
 * after, success or not, and a restored VM runs at once (vmd connects
 * its agent before resume, and Firecracker answers a vsock CONNECT only
 * once the guest runs); resume is then harmless. */
static void
test_snapshot_ops(void **state)
{
	struct box a, b;
	struct moat_vmm_snapshot_stats st;
	char *err = NULL;
	char *snap, *bad, *p, *text = NULL;
	char *calls;
	json_t *all;
	json_t *last;
	size_t len;
	int fd = -1;

	(void)state;
	box_init(&a, true);
	assert_int_equal(moat_vmm_firecracker.start(dbl, &a.spec, &a.vm, &err),
	    MOAT_OK);
	snap = moat_asprintf("%s/snap", a.dir);
	assert_int_equal(mkdir(snap, 0700), 0);
	assert_int_equal(moat_vmm_firecracker.snapshot(&a.vm, a.scratch, snap,
	                     30000, false, &st, &err),
	    MOAT_OK);
	assert_null(err);
	assert_true(st.ram_bytes > 0);
	assert_true(st.device_state_bytes > 0);
	assert_true(st.pause_ms >= 0);
	p = moat_asprintf("%s/" MOAT_VMM_SNAP_SCRATCH, snap);
	assert_int_equal(moat_read_file(p, 64, &text, &len), 0);
	assert_int_equal(len, 7);
	assert_memory_equal(text, "scratch", 7);
	free(text);
	free(p);
	/* Firecracker's own files were moved, not left in the VM's folder. */
	p = moat_asprintf("%s/moat-snapshot.vmstate", a.dir);
	assert_int_equal(access(p, F_OK), -1);
	free(p);
	p = moat_asprintf("%s/moat-snapshot.mem", a.dir);
	assert_int_equal(access(p, F_OK), -1);
	free(p);
	calls = config_calls(&a);
	assert_has(calls,
	    "PUT /actions\nPATCH /vm\nPUT /snapshot/create\n"
	    "PATCH /vm\n");
	free(calls);
	all = requests(&a);
	last = last_request(all);
	assert_string_equal(json_string_value(
	                        json_object_get(json_object_get(last, "body"),
	                            "state")),
	    "Resumed");
	json_decref(all);

	/* A scratch disk that cannot be copied: an error naming it, the VM
	 * running again, nothing left in its folder. */
	bad = moat_asprintf("%s/snap2", a.dir);
	assert_int_equal(mkdir(bad, 0700), 0);
	assert_int_not_equal(moat_vmm_firecracker.snapshot(&a.vm,
	                         "/nonexistent/scratch.ext4", bad, 30000,
	                         false, &st, &err),
	    MOAT_OK);
	assert_has(err, "/nonexistent/scratch.ext4");
	free(err);
	err = NULL;
	all = requests(&a);
	last = last_request(all);
	assert_string_equal(json_string_value(json_object_get(last, "path")),
	    "/vm");
	assert_string_equal(json_string_value(
	                        json_object_get(json_object_get(last, "body"),
	                            "state")),
	    "Resumed");
	json_decref(all);
	p = moat_asprintf("%s/moat-snapshot.mem", a.dir);
	assert_int_equal(access(p, F_OK), -1);
	free(p);
	free(bad);

	/* Restore into another folder: loaded and running, then resumed
	 * again without harm. */
	box_init(&b, false);
	b.spec.sandbox_id = "sb-00000000000000bb";
	assert_int_equal(moat_vmm_firecracker.restore(dbl, &b.spec, snap,
	                     &b.vm, &err),
	    MOAT_OK);
	assert_null(err);
	assert_true(b.vm.pid > 0);
	all = requests(&b);
	assert_true(json_is_true(
	    json_object_get(body_of(all, "/snapshot/load"), "resume_vm")));
	json_decref(all);
	assert_int_equal(moat_vmm_firecracker.resume(&b.vm, snap, 30000, &err),
	    MOAT_OK);
	calls = config_calls(&b);
	assert_string_equal(calls,
	    "PUT /logger\nPUT /metrics\n"
	    "PUT /snapshot/load\nPATCH /vm\n");
	free(calls);
	assert_int_equal(connect_retry(&b.vm, &fd), MOAT_OK);
	assert_echo(fd);
	close(fd);
	box_fini(&b);

	/* A snapshot directory without the files: refused, nothing runs. */
	box_init(&b, false);
	assert_int_equal(moat_vmm_firecracker.restore(dbl, &b.spec,
	                     "/nonexistent/snap", &b.vm, &err),
	    MOAT_NOT_FOUND);
	assert_has(err, "/nonexistent/snap");
	free(err);
	assert_int_equal(b.vm.pid, 0);
	box_fini(&b);

	free(snap);
	box_fini(&a);
	assert_no_children();
}

static void
test_reap_orphan(void **state)
{
	struct box b;
	char *err = NULL;
	pid_t pid;

	(void)state;
	box_init(&b, true);
	if (moat_vmm_firecracker.start(dbl, &b.spec, &b.vm, &err) != MOAT_OK)
		fail_msg("start: %s", err);
	pid = b.vm.pid;
	/* Another id: not this sandbox's VMM, left alone. */
	assert_false(
	    moat_vmm_firecracker.reap_orphan(b.dir, "sb-00000000000000ff"));
	assert_int_equal(kill(pid, 0), 0);
	assert_true(
	    moat_vmm_firecracker.reap_orphan(b.dir, b.spec.sandbox_id));
	assert_int_equal(waitpid(pid, NULL, 0), pid);
	b.vm.pid = 0;
	box_fini(&b);
	assert_no_children();
}

static void
test_exit_text(void **state)
{
	char *t;

	(void)state;
	t = moat_fc_exit_text(148 << 8);
	assert_string_equal(t, "exit code 148 (seccomp violation)");
	free(t);
	t = moat_fc_exit_text(3 << 8);
	assert_string_equal(t, "exit code 3");
	free(t);
	t = moat_fc_exit_text(SIGKILL);
	assert_has(t, "killed by signal 9");
	free(t);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_boot_sequence, test_setup),
		cmocka_unit_test_setup(test_cids_are_unique, test_setup),
		cmocka_unit_test_setup(test_kernel_not_vmlinux, test_setup),
		cmocka_unit_test_setup(test_firecracker_missing, test_setup),
		cmocka_unit_test_setup(test_probe_needs_kvm, test_setup),
		cmocka_unit_test_setup(test_exits_during_start, test_setup),
		cmocka_unit_test_setup(test_exits_mid_configuration,
		    test_setup),
		cmocka_unit_test_setup(test_api_fault_reaches_message,
		    test_setup),
		cmocka_unit_test_setup(test_never_listens, test_setup),
		cmocka_unit_test_setup(test_refuses_tcg, test_setup),
		cmocka_unit_test_setup(test_vsock_wrong_answer, test_setup),
		cmocka_unit_test_setup(test_snapshot_cycle, test_setup),
		cmocka_unit_test_setup(test_snapshot_ops, test_setup),
		cmocka_unit_test_setup(test_reap_orphan, test_setup),
		cmocka_unit_test(test_exit_text),
	};

	return cmocka_run_group_tests(tests, group_setup, NULL);
}
