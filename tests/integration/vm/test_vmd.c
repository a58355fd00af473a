/*
 * test_vmd.c: moat-vmd end to end with real VMs (QEMU under TCG). Starts
 * moat-vmd as a child with a fresh state directory and talks to it with
 * moat_rpc_call, as the gateway would: exec in python and bash, timeouts
 * that kill a process tree, output caps, a binary file round trip, four
 * sandboxes at once, destroy leaving nothing behind, hostile guests (the
 * agent's test modes) failing only their own sandbox with vmd's memory
 * bounded, a vmd killed with SIGKILL and restarted, and the error replies.
 * Snapshots go through a moat-snapd of the test's own to a second vmd
 * with its own state directory (and a corrupted chunk is refused).
 * One sandbox serves most cases: each TCG boot costs seconds of CPU.
 * Images come from $MOAT_IMAGE_DIR (default <repo>/images/out); without a
 * built "default" image the VM cases are skipped and say so, and the exit
 * code is 77 (ctest: Skipped) even when the other cases passed.
 * MOAT_TEST_DRIVER=firecracker runs the same cases against the Firecracker
 * driver (KVM, no --accel); where firecracker is not on PATH or /dev/kvm
 * cannot create a VM, every case is printed SKIPPED by name and the exit
 * code is 77. Cases of what only QEMU does are skipped by name there.
 * Not for: the guest agent alone (tests/unit/agent) or the gateway.
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
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <linux/kvm.h>
#include <nng/nng.h>
#include <nng/protocol/survey0/survey.h>
#include <openssl/evp.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapshot.pb-c.h"
#include "vm.pb-c.h"
#include "vmd_harness.h"

#define LONG_MS 180000u

static char image_dir[1024];
static char survey_url[320]; /* main vmd answers surveys here */
static nng_socket surveyor;
static bool have_image;
static struct vmd_proc main_vmd;
static char shared_id[32]; /* the sandbox most cases share */
/* The driver under test ($MOAT_TEST_DRIVER, set in main): qemu runs
 * under TCG; firecracker has only KVM and gets no --accel. */
static const char *test_driver = "qemu";
static const char *want_accel = "tcg";    /* what vmd reports */
static const char *default_accel = "tcg"; /* --accel unless named */
/* MOAT_VMD_TEMPLATES of the next vmd_start: off but for the templates
 * case, so the other cases keep measuring cold boots. */
static const char *vmd_templates_env = "off";

/* ---- helpers ---- */

static uint64_t
now_ms(void)
{
	return moat_rpc_now_ms();
}

#define TENANT VMD_TENANT

/* What vmd_start's child runs with. */
struct vmd_args {
	bool test_hooks;
	const char *survey; /* MOAT_VMD_SURVEY, or NULL */
	const char *accel;  /* --accel, or NULL for default_accel */
};

/* vmd_spawn's child: the environment of vmd_args and the templates
 * switch, the test's shared snapshot key, then moat-vmd. */
static void
exec_vmd(const struct vmd_proc *v, void *arg)
{
	const struct vmd_args *a = arg;
	char vmd_bin[] = MOAT_VMD_BIN;
	char cache[400];

	setenv("MOAT_VMD_TEST_HOOKS", a->test_hooks ? "true" : "false", 1);
	setenv("MOAT_VMD_TEMPLATES", vmd_templates_env, 1);
	/* One snapshot key for every vmd of the test (a cluster's): each
	 * restores what another pulled from snapd. */
	snprintf(cache, sizeof(cache), "%s", v->state);
	if (strrchr(cache, '/') != NULL)
		*strrchr(cache, '/') = '\0';
	strncat(cache, "/snapshot.key", sizeof(cache) - strlen(cache) - 1);
	setenv("MOAT_VMD_SNAPSHOT_KEY_FILE", cache, 1);
	snprintf(cache, sizeof(cache), "%s/cache", v->state);
	/* MOAT_TEST_RAM_SHARING: [vmd] ram-sharing. Unset (and no
	 * MOAT_VMD_RAM_SHARING): copy, which vm_integration covers (vmd's
	 * default, auto, is private here: vm_integration_private_ram). */
	if (getenv("MOAT_TEST_RAM_SHARING") != NULL)
		setenv("MOAT_VMD_RAM_SHARING", getenv("MOAT_TEST_RAM_SHARING"),
		    1);
	else if (getenv("MOAT_VMD_RAM_SHARING") == NULL)
		setenv("MOAT_VMD_RAM_SHARING", "copy", 1);
	/* The warm VMM pool (default 2) off unless asked: these cases
	 * check the RAM dir's budget, template spares and restores as
	 * such; vm_pool covers the pool, and every stack test runs with
	 * it. */
	if (getenv("MOAT_VMD_VMM_POOL") == NULL)
		setenv("MOAT_VMD_VMM_POOL", "0", 1);
	if (a->survey != NULL)
		setenv("MOAT_VMD_SURVEY", a->survey, 1);
	else
		unsetenv("MOAT_VMD_SURVEY");
	execl(vmd_bin, vmd_bin, "--state-dir", v->state, "--accel",
	    a->accel ? a->accel : default_accel, "--driver", test_driver,
	    "--image-dir", image_dir, "--listen", v->url, "--cache-dir", cache,
	    "--node-id", "test-node", (char *)NULL);
}

/* Starts moat-vmd on `state` (see exec_vmd) and waits for Health. */
static void
vmd_start(struct vmd_proc *v, const char *state, bool test_hooks,
    const char *survey, const char *accel)
{
	struct vmd_args a = { test_hooks, survey, accel };

	vmd_spawn(v, state, exec_vmd, &a, 15000);
}

/* purge_state: `moat-vmd purge DIR` (the state and the snapshots' RAM
 * copies on tmpfs); 0 or an errno-like failure. */
static int
purge_state(const char *dir)
{
	char *cmd = moat_asprintf("'%s' purge '%s'", MOAT_VMD_BIN, dir);
	int rc;

	if (cmd == NULL)
		return ENOMEM;
	rc = system(cmd);
	free(cmd);
	return rc == 0 ? 0 : EIO;
}

static bool
path_exists(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0;
}

static int
create_sandbox(struct vmd_proc *v, const char *label_key,
    const char *label_value, Moat__V1__Sandbox **out)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__CreateSandboxRequest__LabelsEntry e =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__LABELS_ENTRY__INIT;
	Moat__V1__CreateSandboxRequest__LabelsEntry *labels[1] = { &e };

	req.memory_mib = 256;
	req.scratch_mib = 256;
	if (label_key != NULL) {
		e.key = (char *)label_key;
		e.value = (char *)label_value;
		req.labels = labels;
		req.n_labels = 1;
	}
	return vmd_call(v, "CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, (ProtobufCMessage **)out, LONG_MS);
}

/* One-shot exec of `code` in `language`. */
static Moat__V1__ExecResult *
run_code(struct vmd_proc *v, const char *id, const char *language,
    const char *code, uint32_t timeout_ms, uint64_t cap, int want_rv)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *res = NULL;
	int rv;

	req.sandbox_id = (char *)id;
	req.language = (char *)language;
	req.code = (char *)code;
	req.timeout_ms = timeout_ms;
	req.output_cap = cap;
	rv = vmd_call(v, "Exec", &req.base, &moat__v1__exec_result__descriptor,
	    (ProtobufCMessage **)&res, LONG_MS);
	if (rv != want_rv)
		fail_msg("Exec %s returned %s (%s), wanted %s", language,
		    moat_strerror(rv), vmd_last_err, moat_strerror(want_rv));
	return res;
}

static const char *
shared_sandbox(void)
{
	Moat__V1__Sandbox *sb = NULL;

	if (!have_image)
		skip();
	if (shared_id[0] != '\0')
		return shared_id;
	if (create_sandbox(&main_vmd, NULL, NULL, &sb) != MOAT_OK) {
		vmd_log_tail(&main_vmd, 30);
		fail_msg("CreateSandbox: %s", vmd_last_err);
	}
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	assert_string_equal(sb->accel, want_accel);
	assert_string_equal(sb->driver, test_driver);
	assert_true(sb->vmm_pid > 0);
	snprintf(shared_id, sizeof(shared_id), "%s", sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return shared_id;
}

static void
sha256(const uint8_t *data, size_t len, uint8_t out[32])
{
	unsigned int n = 0;

	assert_int_equal(EVP_Digest(data, len, out, &n, EVP_sha256(), NULL),
	    1);
}

/* ---- group ---- */

static char state_root[256];

static int
group_setup(void **state)
{
	const char *env = getenv("MOAT_IMAGE_DIR");
	char path[1100];
	char state_dir[300];

	snprintf(image_dir, sizeof(image_dir), "%s",
	    env && env[0] ? env : MOAT_REPO_DIR "/images/out");
	snprintf(path, sizeof(path), "%s/default/rootfs.ext4", image_dir);
	have_image = access(path, R_OK) == 0;
	if (!have_image && env && env[0]) {
		/* Named on purpose (tests/run.sh does): a missing image is a
		 * failure there, never a quiet skip. */
		fprintf(stderr,
		    "no image at %s/default, which MOAT_IMAGE_DIR "
		    "names: build it with images/build.sh\n",
		    image_dir);
		return -1;
	}
	if (!have_image)
		fprintf(stderr,
		    "NOTE: no image at %s/default: the VM cases "
		    "are skipped (build it with images/build.sh)\n",
		    image_dir);
	snprintf(state_root, sizeof(state_root), "/tmp/moat-vmd-test-XXXXXX");
	if (mkdtemp(state_root) == NULL)
		return -1;
	snprintf(state_dir, sizeof(state_dir), "%s/main", state_root);
	snprintf(survey_url, sizeof(survey_url), "ipc://%s/survey.sock",
	    state_root);
	if (nng_surveyor0_open(&surveyor) != 0 ||
	    nng_listen(surveyor, survey_url, NULL, 0) != 0)
		return -1;
	vmd_start(&main_vmd, state_dir, true, survey_url, NULL);
	return 0;
}

static int
group_teardown(void **state)
{
	int rv = 0;
	int err;

	if (vmd_stop_status(&main_vmd) != 0) {
		fprintf(stderr, "FAIL: moat-vmd did not exit 0 on SIGTERM\n");
		rv = -1;
	}
	nng_close(surveyor);
	/* Nothing of any sandbox may outlive vmd. */
	if (vmd_procs_mentioning(state_root) != 0) {
		fprintf(stderr, "FAIL: processes still mention %s\n",
		    state_root);
		rv = -1;
	}
	/* purge also frees the snapshots' RAM copies on tmpfs. */
	if ((err = purge_state(state_root)) != 0)
		fprintf(stderr, "cannot remove %s: %s\n", state_root,
		    strerror(err));
	return rv;
}

/* Firecracker needs its binary on PATH and a /dev/kvm that can create
 * a VM. Returns NULL when both hold, else why not (static text). */
static const char *
firecracker_unusable(void)
{
	static char why[160];
	const char *path = getenv("PATH");
	bool found = false;
	int fd, vm;

	while (path != NULL && *path != '\0' && !found) {
		const char *end = strchr(path, ':');
		size_t n = end ? (size_t)(end - path) : strlen(path);
		char exe[1100];

		snprintf(exe, sizeof(exe), "%.*s/firecracker", n ? (int)n : 1,
		    n ? path : ".");
		found = access(exe, X_OK) == 0;
		path = end ? end + 1 : path + n;
	}
	if (!found)
		return "firecracker is not on PATH";
	if ((fd = open("/dev/kvm", O_RDWR | O_CLOEXEC)) < 0) {
		snprintf(why, sizeof(why), "cannot open /dev/kvm: %s",
		    strerror(errno));
		return why;
	}
	if ((vm = ioctl(fd, KVM_CREATE_VM, 0)) < 0) {
		snprintf(why, sizeof(why),
		    "/dev/kvm cannot create a VM "
		    "(KVM_CREATE_VM: %s)",
		    strerror(errno));
		close(fd);
		return why;
	}
	close(vm);
	close(fd);
	return NULL;
}

/* Cases that test what only the QEMU driver does, and why. */
static const char *
qemu_only(const char *name)
{
	static const struct {
		const char *name;
		const char *why;
	} cases[] = {
		{ "test_accel_auto",
		    "the kvm/tcg decision is QEMU's; "
		    "Firecracker has only KVM" },
		{ "test_boot_deadline",
		    "a 300 ms deadline that only a TCG "
		    "boot misses" },
		{ "test_kill_and_restart",
		    "checks QEMU's RAM file in /dev/shm "
		    "and qemu.pid" },
		{ "test_snapshot_ram_budget",
		    "QEMU's guest RAM files in the "
		    "RAM dir are what the budget bounds" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (strcmp(cases[i].name, name) == 0)
			return cases[i].why;
	return NULL;
}

/* ---- cases ---- */

static void
test_errors(void **state)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;

	ref.sandbox_id = "sb-0000000000000000";
	assert_int_equal(vmd_call(&main_vmd, "GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, NULL, 5000),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(vmd_last_err, "sb-0000000000000000 not found"));
	assert_int_equal(vmd_call(&main_vmd, "DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, NULL, 5000),
	    MOAT_NOT_FOUND);
	ex.sandbox_id = "sb-0000000000000000";
	ex.shell = "true";
	assert_int_equal(vmd_call(&main_vmd, "Exec", &ex.base,
	                     &moat__v1__exec_result__descriptor, NULL, 5000),
	    MOAT_NOT_FOUND);

	req.vcpus = 100;
	assert_int_equal(vmd_call(&main_vmd, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, 5000),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(vmd_last_err, "vcpus"));
	req.vcpus = 1;
	req.memory_mib = 64;
	assert_int_equal(vmd_call(&main_vmd, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, 5000),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(vmd_last_err, "memory_mib"));
	req.memory_mib = 1u << 30;
	assert_int_equal(vmd_call(&main_vmd, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, 5000),
	    MOAT_INVALID_ARGUMENT);
	req.memory_mib = 0;
	req.scratch_mib = 1;
	assert_int_equal(vmd_call(&main_vmd, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, 5000),
	    MOAT_INVALID_ARGUMENT);
	req.scratch_mib = 0;
	req.image = "no-such-image";
	assert_int_equal(vmd_call(&main_vmd, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, 5000),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(vmd_last_err,
	    "image \"no-such-image\" is not "
	    "built: run images/build.sh"));
	req.image = "../etc";
	assert_int_equal(vmd_call(&main_vmd, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, 5000),
	    MOAT_INVALID_ARGUMENT);
}

static void
test_node_info(void **state)
{
	Moat__V1__Empty e = MOAT__V1__EMPTY__INIT;
	Moat__V1__Node *node = NULL;

	assert_int_equal(vmd_call(&main_vmd, "NodeInfo", &e.base,
	                     &moat__v1__node__descriptor,
	                     (ProtobufCMessage **)&node, 5000),
	    MOAT_OK);
	assert_string_equal(node->node_id, "test-node");
	assert_string_equal(node->rpc_url, main_vmd.url);
	assert_string_equal(node->accel, want_accel);
	assert_string_equal(node->driver, test_driver);
	assert_true(node->vcpus_total >= 1);
	assert_true(node->memory_mib_total >= 128);
	assert_true(node->max_vcpus >= 1);
	assert_int_equal(node->max_memory_mib, 8192);
	if (have_image) {
		bool found = false;
		for (size_t i = 0; i < node->n_images; i++)
			found |= strcmp(node->images[i], "default") == 0;
		assert_true(found);
	}
	protobuf_c_message_free_unpacked(&node->base, NULL);
}

static void
test_boot_deadline(void **state)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	char vms[400];
	DIR *d;
	struct dirent *de;
	int left = 0;

	if (!have_image)
		skip();
	req.boot_timeout_ms = 300;
	req.scratch_mib = 64;
	assert_int_equal(vmd_call(&main_vmd, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, 60000),
	    MOAT_UNAVAILABLE);
	fprintf(stderr, "boot deadline: %s\n", vmd_last_err);
	assert_non_null(strstr(vmd_last_err, "did not boot"));
	assert_non_null(strstr(vmd_last_err, "within 300 ms"));
	/* Nothing of it is left. */
	snprintf(vms, sizeof(vms), "%s/vms", main_vmd.state);
	assert_non_null(d = opendir(vms));
	while ((de = readdir(d)) != NULL)
		if (strncmp(de->d_name, "sb-", 3) == 0 &&
		    strcmp(de->d_name, shared_id) != 0)
			left++;
	closedir(d);
	assert_int_equal(left, 0);
}

static void
test_python_and_bash(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__ExecResult *r;
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[] = { "sh", "-c", "printf '%s' \"$0-$FOO\"", NULL };
	char *env[] = { "FOO=bar" };

	r = run_code(&main_vmd, id, "python",
	    "import sys\nprint('hello from python')\n"
	    "print('oops', file=sys.stderr)\nsys.exit(3)\n",
	    0, 0, MOAT_OK);
	assert_true(r->status->exited);
	assert_int_equal(r->status->exit_code, 3);
	assert_false(r->status->timed_out);
	assert_int_equal(r->stdout.len, strlen("hello from python\n"));
	assert_memory_equal(r->stdout.data, "hello from python\n",
	    r->stdout.len);
	assert_int_equal(r->stderr.len, 5);
	assert_memory_equal(r->stderr.data, "oops\n", 5);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	r = run_code(&main_vmd, id, "bash",
	    "echo $((6*7)); echo bad >&2; exit 5", 0, 0, MOAT_OK);
	assert_int_equal(r->status->exit_code, 5);
	assert_int_equal(r->stdout.len, 3);
	assert_memory_equal(r->stdout.data, "42\n", 3);
	assert_int_equal(r->stderr.len, 4);
	assert_memory_equal(r->stderr.data, "bad\n", 4);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	/* node, which images/build.sh puts in the image. */
	r = run_code(&main_vmd, id, "node",
	    "console.log(6 * 7); console.error('e'); process.exit(2)", 0, 0,
	    MOAT_OK);
	assert_int_equal(r->status->exit_code, 2);
	assert_int_equal(r->stdout.len, 3);
	assert_memory_equal(r->stdout.data, "42\n", 3);
	assert_int_equal(r->stderr.len, 2);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	/* argv with env. */
	req.sandbox_id = (char *)id;
	req.argv = argv;
	req.n_argv = 3;
	req.env = env;
	req.n_env = 1;
	assert_int_equal(vmd_call(&main_vmd, "Exec", &req.base,
	                     &moat__v1__exec_result__descriptor,
	                     (ProtobufCMessage **)&r, LONG_MS),
	    MOAT_OK);
	assert_int_equal(r->status->exit_code, 0);
	assert_int_equal(r->stdout.len, 6);
	assert_memory_equal(r->stdout.data, "sh-bar", 6);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	/* The scratch disk is mounted noinit_itable: the kernel does not
	 * zero its inode tables in the background of every sandbox and
	 * clone (they are holes of a sparse file: zeros already). */
	r = run_code(&main_vmd, id, "sh",
	    "grep -l noinit_itable /proc/fs/ext4/*/options | wc -l", 0, 0,
	    MOAT_OK);
	assert_int_equal(r->status->exit_code, 0);
	assert_int_equal(r->stdout.len, 2);
	assert_memory_equal(r->stdout.data, "1\n", 2);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	(void)run_code(&main_vmd, id, "cobol", "x", 0, 0,
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(vmd_last_err, "python, bash, sh or node"));
	(void)run_code(&main_vmd, id, "sh", "true", 86400001u, 0,
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(vmd_last_err, "86400000"));
}

static void
test_timeout_kills_tree(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__ExecResult *r;
	uint64_t t0 = now_ms();
	int left = -1;

	r = run_code(&main_vmd, id, "sh",
	    "sleep 1000 & sleep 1001 & (sleep 1002; true) & sleep 1003", 2000,
	    0, MOAT_OK);
	assert_true(r->status->exited);
	assert_true(r->status->timed_out);
	assert_true(now_ms() - t0 < 20000);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	/* Every sleep of that tree is gone. */
	for (int i = 0; i < 20 && left != 0; i++) {
		r = run_code(&main_vmd, id, "python",
		    "import os\nn = 0\n"
		    "for p in os.listdir('/proc'):\n"
		    "    if not p.isdigit(): continue\n"
		    "    try: c = open('/proc/%s/cmdline' % p, 'rb').read()\n"
		    "    except OSError: continue\n"
		    "    if c.startswith(b'sleep\\x00100'): n += 1\n"
		    "print(n)\n",
		    0, 0, MOAT_OK);
		assert_int_equal(r->status->exit_code, 0);
		left = atoi((const char *)r->stdout.data);
		protobuf_c_message_free_unpacked(&r->base, NULL);
		if (left != 0)
			usleep(250 * 1000);
	}
	assert_int_equal(left, 0);
}

/* code_run: one RunCode through vmd; the result (caller frees). */
static Moat__V1__RunCodeResult *
code_run_on(struct vmd_proc *v, const char *id, const char *context,
    const char *code, uint32_t timeout_ms)
{
	Moat__V1__RunCodeRequest req = MOAT__V1__RUN_CODE_REQUEST__INIT;
	Moat__V1__RunCodeResult *r = NULL;

	req.sandbox_id = (char *)id;
	req.context = (char *)context;
	req.code = (char *)code;
	req.timeout_ms = timeout_ms;
	assert_int_equal(vmd_call(v, "RunCode", &req.base,
	                     &moat__v1__run_code_result__descriptor,
	                     (ProtobufCMessage **)&r, LONG_MS),
	    MOAT_OK);
	assert_non_null(r->result);
	return r;
}

static Moat__V1__RunCodeResult *
code_run(const char *id, const char *context, const char *code,
    uint32_t timeout_ms)
{
	return code_run_on(&main_vmd, id, context, code, timeout_ms);
}

/* Persistent code contexts in a real guest: state survives runs, a
 * timeout interrupts the cell and keeps the context. */
static void
test_code_contexts(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__CodeContextCall close_req =
	    MOAT__V1__CODE_CONTEXT_CALL__INIT;
	Moat__V1__RunCodeRequest node = MOAT__V1__RUN_CODE_REQUEST__INIT;
	Moat__V1__RunCodeResult *r;

	r = code_run(id, "itest", "import math\nx = 20\nprint('set')", 0);
	assert_true(r->result->context_created);
	assert_string_equal(r->result->error_name, "");
	assert_int_equal(r->result->stdout.len, 4);
	assert_memory_equal(r->result->stdout.data, "set\n", 4);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	r = code_run(id, "itest", "x * 2 + math.floor(2.5)", 0);
	assert_false(r->result->context_created);
	assert_true(r->result->has_result);
	assert_string_equal(r->result->result, "42");
	assert_int_equal(r->result->execution_count, 2);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	r = code_run(id, "itest", "while True:\n    x += 0", 500);
	assert_true(r->result->timed_out);
	assert_string_equal(r->result->error_name, "KeyboardInterrupt");
	protobuf_c_message_free_unpacked(&r->base, NULL);

	r = code_run(id, "itest", "x", 0);
	assert_false(r->result->timed_out);
	assert_false(r->result->context_created);
	assert_string_equal(r->result->result, "20");
	protobuf_c_message_free_unpacked(&r->base, NULL);

	/* A node context next to the python one (the image has node; an
	 * image without it is refused naming python: tests/unit/agent). */
	node.sandbox_id = (char *)id;
	node.context = "js";
	node.language = "node";
	node.code = "const n = 6 * 7; console.log('set')";
	assert_int_equal(vmd_call(&main_vmd, "RunCode", &node.base,
	                     &moat__v1__run_code_result__descriptor,
	                     (ProtobufCMessage **)&r, LONG_MS),
	    MOAT_OK);
	assert_string_equal(r->result->error_name, "");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	node.code = "n + 1";
	assert_int_equal(vmd_call(&main_vmd, "RunCode", &node.base,
	                     &moat__v1__run_code_result__descriptor,
	                     (ProtobufCMessage **)&r, LONG_MS),
	    MOAT_OK);
	assert_false(r->result->context_created);
	assert_string_equal(r->result->result, "43");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	close_req.sandbox_id = (char *)id;
	close_req.context = "js";
	assert_int_equal(vmd_call(&main_vmd, "CloseCodeContext",
	                     &close_req.base, &moat__v1__empty__descriptor,
	                     NULL, LONG_MS),
	    MOAT_OK);

	close_req.sandbox_id = (char *)id;
	close_req.context = "itest";
	assert_int_equal(vmd_call(&main_vmd, "CloseCodeContext",
	                     &close_req.base, &moat__v1__empty__descriptor,
	                     NULL, LONG_MS),
	    MOAT_OK);
	assert_int_equal(vmd_call(&main_vmd, "CloseCodeContext",
	                     &close_req.base, &moat__v1__empty__descriptor,
	                     NULL, LONG_MS),
	    MOAT_NOT_FOUND);
}

static void
test_output_cap(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__ExecResult *r;

	r = run_code(&main_vmd, id, "python",
	    "import sys\nsys.stdout.write('x' * (5 << 20))\n"
	    "sys.stdout.flush()\nsys.stderr.write('done')\n",
	    0, 0, MOAT_OK);
	assert_int_equal(r->status->exit_code, 0);
	assert_int_equal(r->stdout.len, 1u << 20);
	assert_true(r->status->stdout_truncated);
	assert_int_equal(r->status->stdout_bytes, 5u << 20);
	assert_false(r->status->stderr_truncated);
	assert_int_equal(r->stderr.len, 4);
	for (size_t i = 0; i < r->stdout.len; i++)
		if (r->stdout.data[i] != 'x')
			fail_msg("byte %zu of stdout is %d", i,
			    r->stdout.data[i]);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	(void)run_code(&main_vmd, id, "sh", "true", 0, (64u << 20) + 1,
	    MOAT_INVALID_ARGUMENT);
}

static void
test_binary_file(void **state)
{
	const char *id = shared_sandbox();
	size_t len = 3u << 20;
	uint8_t *data = malloc(len);
	uint8_t want[32], got[32];
	char want_hex[65];
	Moat__V1__FileWriteRequest wr = MOAT__V1__FILE_WRITE_REQUEST__INIT;
	Moat__V1__FileReadRequest rd = MOAT__V1__FILE_READ_REQUEST__INIT;
	Moat__V1__FileInfo *info = NULL;
	Moat__V1__FileData *fd = NULL;
	Moat__V1__ExecResult *r;
	uint32_t x = 12345;

	assert_non_null(data);
	for (size_t i = 0; i < len; i++) {
		/* Every byte value, in an order that is not just a cycle. */
		x = x * 1103515245u + 12345u;
		data[i] = i < 256 ? (uint8_t)i : (uint8_t)(x >> 16);
	}
	sha256(data, len, want);
	for (int i = 0; i < 32; i++)
		snprintf(want_hex + 2 * i, 3, "%02x", want[i]);

	wr.sandbox_id = (char *)id;
	wr.path = "/root/data/blob.bin";
	wr.data.data = data;
	wr.data.len = len;
	wr.truncate = true;
	wr.make_parents = true;
	wr.mode = 0600;
	if (vmd_call(&main_vmd, "WriteFile", &wr.base,
	        &moat__v1__file_info__descriptor, (ProtobufCMessage **)&info,
	        LONG_MS) != MOAT_OK)
		fail_msg("WriteFile: %s", vmd_last_err);
	assert_int_equal(info->size, len);
	protobuf_c_message_free_unpacked(&info->base, NULL);

	rd.sandbox_id = (char *)id;
	rd.path = "/root/data/blob.bin";
	if (vmd_call(&main_vmd, "ReadFile", &rd.base,
	        &moat__v1__file_data__descriptor, (ProtobufCMessage **)&fd,
	        LONG_MS) != MOAT_OK)
		fail_msg("ReadFile: %s", vmd_last_err);
	assert_int_equal(fd->data.len, len);
	assert_int_equal(fd->size, len);
	assert_true(fd->eof);
	sha256(fd->data.data, fd->data.len, got);
	assert_memory_equal(want, got, 32);
	protobuf_c_message_free_unpacked(&fd->base, NULL);

	/* The guest sees the same bytes. */
	r = run_code(&main_vmd, id, "python",
	    "import hashlib\nprint(hashlib.sha256(open('/root/data/blob.bin',"
	    "'rb').read()).hexdigest(), end='')\n",
	    0, 0, MOAT_OK);
	assert_int_equal(r->stdout.len, 64);
	assert_memory_equal(r->stdout.data, want_hex, 64);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	/* A guest error comes back with the agent's code. */
	rd.path = "/root/no/such/file";
	assert_int_equal(vmd_call(&main_vmd, "ReadFile", &rd.base,
	                     &moat__v1__file_data__descriptor, NULL, 30000),
	    MOAT_NOT_FOUND);
	free(data);
}

static void
test_survey(void **state)
{
	uint64_t until = now_ms() + 15000;
	bool answered = false;

	nng_socket_set_ms(surveyor, NNG_OPT_SURVEYOR_SURVEYTIME, 500);
	/* The respondent dials in the background: survey until it answers. */
	while (!answered && now_ms() < until) {
		nng_msg *msg = NULL;

		assert_int_equal(nng_msg_alloc(&msg, 0), 0);
		assert_int_equal(nng_sendmsg(surveyor, msg, 0), 0);
		while (nng_recvmsg(surveyor, &msg, 0) == 0) {
			Moat__V1__Node *node = moat__v1__node__unpack(NULL,
			    nng_msg_len(msg), nng_msg_body(msg));

			assert_non_null(node);
			assert_string_equal(node->node_id, "test-node");
			assert_string_equal(node->rpc_url, main_vmd.url);
			assert_string_equal(node->driver, test_driver);
			assert_true(node->memory_mib_total > 0);
			moat__v1__node__free_unpacked(node, NULL);
			nng_msg_free(msg);
			answered = true;
		}
	}
	assert_true(answered);
}

/* ExecStart, ExecWrite, ExecRead (long-poll), ExecWait, ExecKill. */
static void
test_exec_streaming(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecHandle *h = NULL;
	Moat__V1__ExecWriteRequest wr = MOAT__V1__EXEC_WRITE_REQUEST__INIT;
	Moat__V1__ExecWaitRequest wt = MOAT__V1__EXEC_WAIT_REQUEST__INIT;
	Moat__V1__ExecReadRequest rd = MOAT__V1__EXEC_READ_REQUEST__INIT;
	Moat__V1__ExecKillRequest kl = MOAT__V1__EXEC_KILL_REQUEST__INIT;
	Moat__V1__ExecStatus *st = NULL;
	Moat__V1__ExecReadReply *rr = NULL;
	uint64_t t0;

	/* stdin kept open, written later, then closed: cat echoes it. */
	req.sandbox_id = (char *)id;
	req.shell = "cat; echo -n done >&2";
	req.stdin_open = true;
	assert_int_equal(vmd_call(&main_vmd, "ExecStart", &req.base,
	                     &moat__v1__exec_handle__descriptor,
	                     (ProtobufCMessage **)&h, 30000),
	    MOAT_OK);
	assert_true(h->exec_id > 0);
	assert_true(h->pid > 0);
	wr.sandbox_id = (char *)id;
	wr.exec_id = h->exec_id;
	wr.data.data = (uint8_t *)"hello ";
	wr.data.len = 6;
	assert_int_equal(vmd_call(&main_vmd, "ExecWrite", &wr.base,
	                     &moat__v1__empty__descriptor, NULL, 30000),
	    MOAT_OK);
	wr.data.data = (uint8_t *)"world";
	wr.data.len = 5;
	wr.close = true;
	assert_int_equal(vmd_call(&main_vmd, "ExecWrite", &wr.base,
	                     &moat__v1__empty__descriptor, NULL, 30000),
	    MOAT_OK);
	wt.sandbox_id = (char *)id;
	wt.exec_id = h->exec_id;
	assert_int_equal(vmd_call(&main_vmd, "ExecWait", &wt.base,
	                     &moat__v1__exec_status__descriptor,
	                     (ProtobufCMessage **)&st, 30000),
	    MOAT_OK);
	assert_true(st->exited);
	assert_int_equal(st->exit_code, 0);
	protobuf_c_message_free_unpacked(&st->base, NULL);
	rd.sandbox_id = (char *)id;
	rd.exec_id = h->exec_id;
	rd.max_bytes = 4;
	assert_int_equal(vmd_call(&main_vmd, "ExecRead", &rd.base,
	                     &moat__v1__exec_read_reply__descriptor,
	                     (ProtobufCMessage **)&rr, 30000),
	    MOAT_OK);
	assert_int_equal(rr->stdout.len, 4);
	assert_memory_equal(rr->stdout.data, "hell", 4);
	assert_int_equal(rr->stdout_next, 4);
	assert_false(rr->eof);
	rd.stdout_offset = rr->stdout_next;
	rd.stderr_offset = rr->stderr_next;
	rd.max_bytes = 0;
	protobuf_c_message_free_unpacked(&rr->base, NULL);
	assert_int_equal(vmd_call(&main_vmd, "ExecRead", &rd.base,
	                     &moat__v1__exec_read_reply__descriptor,
	                     (ProtobufCMessage **)&rr, 30000),
	    MOAT_OK);
	assert_int_equal(rr->stdout.len, 7);
	assert_memory_equal(rr->stdout.data, "o world", 7);
	assert_true(rr->eof);
	assert_true(rr->status->exited);
	protobuf_c_message_free_unpacked(&rr->base, NULL);
	rd.stdout_offset = 1000;
	assert_int_equal(vmd_call(&main_vmd, "ExecRead", &rd.base,
	                     &moat__v1__exec_read_reply__descriptor, NULL,
	                     30000),
	    MOAT_OUT_OF_RANGE);
	protobuf_c_message_free_unpacked(&h->base, NULL);

	/* Long-poll: the read waits for output that comes later. */
	memset(&req, 0, sizeof(req));
	moat__v1__exec_request__init(&req);
	req.sandbox_id = (char *)id;
	req.shell = "sleep 1; echo -n late";
	assert_int_equal(vmd_call(&main_vmd, "ExecStart", &req.base,
	                     &moat__v1__exec_handle__descriptor,
	                     (ProtobufCMessage **)&h, 30000),
	    MOAT_OK);
	moat__v1__exec_read_request__init(&rd);
	rd.sandbox_id = (char *)id;
	rd.exec_id = h->exec_id;
	rd.wait_ms = 20000;
	t0 = now_ms();
	assert_int_equal(vmd_call(&main_vmd, "ExecRead", &rd.base,
	                     &moat__v1__exec_read_reply__descriptor,
	                     (ProtobufCMessage **)&rr, 30000),
	    MOAT_OK);
	assert_true(now_ms() - t0 < 15000);
	if (rr->stdout.len == 0) {
		/* The exit may come first on a slow guest: read again. */
		assert_true(rr->status->exited);
		protobuf_c_message_free_unpacked(&rr->base, NULL);
		assert_int_equal(vmd_call(&main_vmd, "ExecRead", &rd.base,
		                     &moat__v1__exec_read_reply__descriptor,
		                     (ProtobufCMessage **)&rr, 30000),
		    MOAT_OK);
	}
	assert_int_equal(rr->stdout.len, 4);
	assert_memory_equal(rr->stdout.data, "late", 4);
	protobuf_c_message_free_unpacked(&rr->base, NULL);
	protobuf_c_message_free_unpacked(&h->base, NULL);

	/* Kill: SIGKILL by default; ExecWait with wait_ms reports a running
	 * exec as not exited yet. */
	req.shell = "sleep 1000";
	assert_int_equal(vmd_call(&main_vmd, "ExecStart", &req.base,
	                     &moat__v1__exec_handle__descriptor,
	                     (ProtobufCMessage **)&h, 30000),
	    MOAT_OK);
	moat__v1__exec_wait_request__init(&wt);
	wt.sandbox_id = (char *)id;
	wt.exec_id = h->exec_id;
	wt.wait_ms = 200;
	assert_int_equal(vmd_call(&main_vmd, "ExecWait", &wt.base,
	                     &moat__v1__exec_status__descriptor,
	                     (ProtobufCMessage **)&st, 30000),
	    MOAT_OK);
	assert_false(st->exited);
	protobuf_c_message_free_unpacked(&st->base, NULL);
	kl.sandbox_id = (char *)id;
	kl.exec_id = h->exec_id;
	assert_int_equal(vmd_call(&main_vmd, "ExecKill", &kl.base,
	                     &moat__v1__empty__descriptor, NULL, 30000),
	    MOAT_OK);
	wt.wait_ms = 0;
	assert_int_equal(vmd_call(&main_vmd, "ExecWait", &wt.base,
	                     &moat__v1__exec_status__descriptor,
	                     (ProtobufCMessage **)&st, 30000),
	    MOAT_OK);
	assert_true(st->exited);
	assert_int_equal(st->signal, 9);
	protobuf_c_message_free_unpacked(&st->base, NULL);
	protobuf_c_message_free_unpacked(&h->base, NULL);

	wt.exec_id = 987654321;
	assert_int_equal(vmd_call(&main_vmd, "ExecWait", &wt.base,
	                     &moat__v1__exec_status__descriptor, NULL, 30000),
	    MOAT_NOT_FOUND);
}

/* MakeDir, StatFile, ListFiles, RemoveFile, SandboxInfo, TraceFs. */
static void
test_file_calls(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__PathRequest pr = MOAT__V1__PATH_REQUEST__INIT;
	Moat__V1__FileWriteRequest wr = MOAT__V1__FILE_WRITE_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__FsTraceCall tc = MOAT__V1__FS_TRACE_CALL__INIT;
	Moat__V1__FileInfo *fi = NULL;
	Moat__V1__FileList *fl = NULL;
	Moat__V1__GuestInfo *gi = NULL;
	Moat__V1__FsTrace *tr = NULL;
	bool found = false;

	pr.sandbox_id = (char *)id;
	pr.path = "/root/fc/a/b";
	pr.parents = true;
	if (vmd_call(&main_vmd, "MakeDir", &pr.base,
	        &moat__v1__file_info__descriptor, (ProtobufCMessage **)&fi,
	        30000) != MOAT_OK)
		fail_msg("MakeDir: %s", vmd_last_err);
	protobuf_c_message_free_unpacked(&fi->base, NULL);
	wr.sandbox_id = (char *)id;
	wr.path = "/root/fc/a/b/note.txt";
	wr.data.data = (uint8_t *)"note";
	wr.data.len = 4;
	assert_int_equal(vmd_call(&main_vmd, "WriteFile", &wr.base,
	                     &moat__v1__file_info__descriptor, NULL, 30000),
	    MOAT_OK);
	pr.path = "/root/fc/a/b/note.txt";
	assert_int_equal(vmd_call(&main_vmd, "StatFile", &pr.base,
	                     &moat__v1__file_info__descriptor,
	                     (ProtobufCMessage **)&fi, 30000),
	    MOAT_OK);
	assert_int_equal(fi->size, 4);
	assert_int_equal(fi->type, MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR);
	protobuf_c_message_free_unpacked(&fi->base, NULL);
	pr.path = "/root/fc/a/b";
	assert_int_equal(vmd_call(&main_vmd, "ListFiles", &pr.base,
	                     &moat__v1__file_list__descriptor,
	                     (ProtobufCMessage **)&fl, 30000),
	    MOAT_OK);
	for (size_t i = 0; i < fl->n_entries; i++)
		found |= strcmp(fl->entries[i]->name, "note.txt") == 0;
	assert_true(found);
	protobuf_c_message_free_unpacked(&fl->base, NULL);

	tc.sandbox_id = (char *)id;
	tc.hash = true;
	assert_int_equal(vmd_call(&main_vmd, "TraceFs", &tc.base,
	                     &moat__v1__fs_trace__descriptor,
	                     (ProtobufCMessage **)&tr, 30000),
	    MOAT_OK);
	found = false;
	for (size_t i = 0; i < tr->n_entries; i++)
		if (strstr(tr->entries[i]->path, "note.txt") != NULL) {
			found = true;
			assert_int_equal(tr->entries[i]->sha256.len, 32);
		}
	assert_true(found);
	protobuf_c_message_free_unpacked(&tr->base, NULL);

	pr.path = "/root/fc";
	pr.recursive = true;
	assert_int_equal(vmd_call(&main_vmd, "RemoveFile", &pr.base,
	                     &moat__v1__empty__descriptor, NULL, 30000),
	    MOAT_OK);
	pr.path = "/root/fc/a/b/note.txt";
	assert_int_equal(vmd_call(&main_vmd, "StatFile", &pr.base,
	                     &moat__v1__file_info__descriptor, NULL, 30000),
	    MOAT_NOT_FOUND);
	pr.path = "";
	assert_int_equal(vmd_call(&main_vmd, "StatFile", &pr.base,
	                     &moat__v1__file_info__descriptor, NULL, 30000),
	    MOAT_INVALID_ARGUMENT);

	ref.sandbox_id = (char *)id;
	assert_int_equal(vmd_call(&main_vmd, "SandboxInfo", &ref.base,
	                     &moat__v1__guest_info__descriptor,
	                     (ProtobufCMessage **)&gi, 30000),
	    MOAT_OK);
	assert_true(gi->mem_total_kib > 100 * 1024);
	assert_true(gi->ncpu >= 1);
	assert_true(gi->uptime_ms > 0);
	protobuf_c_message_free_unpacked(&gi->base, NULL);
}

static Moat__V1__Sandbox *wait_failed(const char *id);
static bool log_has(const struct vmd_proc *v, const char *needle);

/* ---- several sandboxes ---- */

struct par {
	char id[32];
	int rv;
	char err[512];
	char out[64];
};

static void *
par_create_and_exec(void *arg)
{
	struct par *p = arg;
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *r = NULL;
	struct moat_rpc_opts opts = { .timeout_ms = LONG_MS,
		.tenant = TENANT };
	Moat__V1__CreateSandboxRequest cr =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	char *err = NULL;

	cr.memory_mib = 256;
	cr.scratch_mib = 256;
	p->rv = moat_rpc_call(main_vmd.client, VMD_SERVICE, "CreateSandbox",
	    &cr.base, &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&sb,
	    &opts, &err);
	if (p->rv != MOAT_OK) {
		snprintf(p->err, sizeof(p->err), "create: %s", err);
		free(err);
		return NULL;
	}
	snprintf(p->id, sizeof(p->id), "%s", sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	req.sandbox_id = p->id;
	req.shell = "echo -n \"$((1+1))\"";
	p->rv = moat_rpc_call(main_vmd.client, VMD_SERVICE, "Exec", &req.base,
	    &moat__v1__exec_result__descriptor, (ProtobufCMessage **)&r, &opts,
	    &err);
	if (p->rv != MOAT_OK) {
		snprintf(p->err, sizeof(p->err), "exec: %s", err);
		free(err);
		return NULL;
	}
	snprintf(p->out, sizeof(p->out), "%.*s", (int)r->stdout.len,
	    r->stdout.data);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return NULL;
}

static void
check_gone(const char *state, const char *id, int vmm_pid)
{
	char dir[400], ram[128], proc[64];
	uint64_t until = now_ms() + 5000;

	snprintf(dir, sizeof(dir), "%s/vms/%s", state, id);
	snprintf(ram, sizeof(ram), "/dev/shm/moat-%s.ram", id);
	snprintf(proc, sizeof(proc), "/proc/%d", vmm_pid);
	assert_false(path_exists(dir));
	assert_false(path_exists(ram));
	/* vmd reaped its child: no process, not even a zombie. */
	while (vmm_pid > 0 && path_exists(proc) && now_ms() < until)
		usleep(50 * 1000);
	if (vmm_pid > 0)
		assert_false(path_exists(proc));
	assert_int_equal(vmd_procs_mentioning(dir), 0);
}

static void
test_four_at_once_and_destroy(void **state)
{
	struct par p[4];
	pthread_t t[4];
	long rss_before, rss_after;
	Moat__V1__ListSandboxesRequest lr =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	Moat__V1__SandboxList *list = NULL;

	(void)shared_sandbox();
	rss_before = vmd_rss_kib(main_vmd.pid);
	memset(p, 0, sizeof(p));
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL,
		                     par_create_and_exec, &p[i]),
		    0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 4; i++) {
		if (p[i].rv != MOAT_OK) {
			vmd_log_tail(&main_vmd, 30);
			fail_msg("sandbox %d: %s", i, p[i].err);
		}
		assert_string_equal(p[i].out, "2");
	}
	rss_after = vmd_rss_kib(main_vmd.pid);
	fprintf(stderr, "vmd RSS %ld KiB -> %ld KiB with 4 more sandboxes\n",
	    rss_before, rss_after);
	/* Each idle sandbox may cost vmd under 2 MiB. */
	assert_true(rss_after - rss_before < 4 * 2048);

	assert_int_equal(vmd_call(&main_vmd, "ListSandboxes", &lr.base,
	                     &moat__v1__sandbox_list__descriptor,
	                     (ProtobufCMessage **)&list, 5000),
	    MOAT_OK);
	assert_true(list->n_sandboxes >= 5);
	for (int i = 0; i < 4; i++) {
		int pid = 0;

		for (size_t j = 0; j < list->n_sandboxes; j++)
			if (strcmp(list->sandboxes[j]->id, p[i].id) == 0)
				pid = list->sandboxes[j]->vmm_pid;
		assert_true(pid > 0);
		if (i == 0) {
			/* A VMM that dies turns its sandbox FAILED, with
			 * the reason, and nothing else changes. */
			Moat__V1__Sandbox *sb;

			kill(pid, SIGKILL);
			sb = wait_failed(p[i].id);
			fprintf(stderr, "killed VMM: %s\n",
			    sb->failure_reason);
			assert_non_null(strstr(sb->failure_reason,
			    "the VM exited unexpectedly (killed by signal 9"));
			assert_int_equal(sb->vmm_pid, 0);
			protobuf_c_message_free_unpacked(&sb->base, NULL);
		}
		vmd_destroy_sandbox(&main_vmd, p[i].id);
		check_gone(main_vmd.state, p[i].id, pid);
	}
	protobuf_c_message_free_unpacked(&list->base, NULL);
}

/* Destroy while the sandbox still boots: the create call gives up with
 * ABORTED, the destroy waits for it, and nothing is left. */
static void *
create_in_thread(void *arg)
{
	struct par *p = arg;
	Moat__V1__CreateSandboxRequest cr =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = LONG_MS,
		.tenant = TENANT };
	char *err = NULL;

	ProtobufCMessage *sb = NULL;

	cr.scratch_mib = 64;
	p->rv = moat_rpc_call(main_vmd.client, VMD_SERVICE, "CreateSandbox",
	    &cr.base, &moat__v1__sandbox__descriptor, &sb, &opts, &err);
	snprintf(p->err, sizeof(p->err), "%s", err ? err : "");
	free(err);
	if (sb != NULL)
		protobuf_c_message_free_unpacked(sb, NULL);
	return NULL;
}

static void
test_destroy_while_booting(void **state)
{
	struct par p = { .rv = -1 };
	Moat__V1__ListSandboxesRequest lr =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	uint64_t until = now_ms() + 30000;
	char id[32] = "";
	pthread_t t;

	(void)shared_sandbox();
	assert_int_equal(pthread_create(&t, NULL, create_in_thread, &p), 0);
	while (id[0] == '\0' && now_ms() < until) {
		Moat__V1__SandboxList *list = NULL;

		assert_int_equal(vmd_call(&main_vmd, "ListSandboxes", &lr.base,
		                     &moat__v1__sandbox_list__descriptor,
		                     (ProtobufCMessage **)&list, 5000),
		    MOAT_OK);
		for (size_t i = 0; i < list->n_sandboxes; i++)
			if (list->sandboxes[i]->state ==
			    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING)
				snprintf(id, sizeof(id), "%s",
				    list->sandboxes[i]->id);
		protobuf_c_message_free_unpacked(&list->base, NULL);
		if (id[0] == '\0')
			usleep(20 * 1000);
	}
	assert_true(id[0] != '\0');
	usleep(300 * 1000); /* let QEMU start */
	vmd_destroy_sandbox(&main_vmd, id);
	pthread_join(t, NULL);
	assert_int_equal(p.rv, MOAT_ABORTED);
	assert_non_null(strstr(p.err, "destroyed while it booted"));
	check_gone(main_vmd.state, id, 0);
}

/* ---- hostile guests ---- */

static Moat__V1__Sandbox *
wait_failed(const char *id)
{
	/* main_vmd's sandboxes only. */
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	uint64_t until = now_ms() + 30000;

	ref.sandbox_id = (char *)id;
	for (;;) {
		Moat__V1__Sandbox *sb = NULL;

		assert_int_equal(vmd_call(&main_vmd, "GetSandbox", &ref.base,
		                     &moat__v1__sandbox__descriptor,
		                     (ProtobufCMessage **)&sb, 5000),
		    MOAT_OK);
		if (sb->state == MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED)
			return sb;
		protobuf_c_message_free_unpacked(&sb->base, NULL);
		if (now_ms() > until)
			fail_msg("sandbox %s never turned FAILED", id);
		usleep(100 * 1000);
	}
}

static void
hostile_case(const char *mode, const char *reason_part)
{
	const char *good = shared_sandbox();
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__ExecResult *r;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	long rss_before = vmd_rss_kib(main_vmd.pid);
	long rss_after;
	char id[32];
	int rv;

	rv = create_sandbox(&main_vmd, "moat.test", mode, &sb);
	if (rv != MOAT_OK) {
		vmd_log_tail(&main_vmd, 30);
		fail_msg("create %s: %s", mode, vmd_last_err);
	}
	snprintf(id, sizeof(id), "%s", sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	sb = wait_failed(id);
	fprintf(stderr, "%s: %s\n", mode, sb->failure_reason);
	assert_non_null(strstr(sb->failure_reason, reason_part));
	assert_non_null(strstr(sb->failure_reason, "the sandbox was stopped"));
	protobuf_c_message_free_unpacked(&sb->base, NULL);

	/* Calls on it say why; the other sandbox keeps answering. */
	ex.sandbox_id = id;
	ex.shell = "true";
	assert_int_equal(vmd_call(&main_vmd, "Exec", &ex.base,
	                     &moat__v1__exec_result__descriptor, NULL, 10000),
	    MOAT_FAILED_PRECONDITION);
	r = run_code(&main_vmd, good, "sh", "echo -n alive", 0, 0, MOAT_OK);
	assert_int_equal(r->stdout.len, 5);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	rss_after = vmd_rss_kib(main_vmd.pid);
	fprintf(stderr, "%s: vmd RSS %ld KiB -> %ld KiB\n", mode, rss_before,
	    rss_after);
	assert_true(rss_after - rss_before < 16 * 1024);
	vmd_destroy_sandbox(&main_vmd, id);
	check_gone(main_vmd.state, id, 0);
}

static void
test_hostile_garbage(void **state)
{
	hostile_case("garbage", "malformed frame");
}

static void
test_hostile_flood(void **state)
{
	hostile_case("flood", "malformed frame");
}

static void
test_hostile_oversize(void **state)
{
	hostile_case("oversize", "over the");
}

/* ---- restart after SIGKILL ---- */

static void
test_kill_and_restart(void **state)
{
	struct vmd_proc v;
	char dir[400];
	char ram[128];
	char state_dir[300];
	char fake_dir[400];
	pid_t fake;
	Moat__V1__Sandbox *sb = NULL;
	int qemu_pid;
	int status;
	uint64_t until;
	char *log = NULL;
	size_t len;
	bool adopts;

	if (!have_image)
		skip();
	snprintf(state_dir, sizeof(state_dir), "%s/restart", state_root);
	vmd_start(&v, state_dir, false, NULL, NULL);
	/* Without test hooks, the hostile modes are refused. */
	assert_int_equal(create_sandbox(&v, "moat.test", "garbage", NULL),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(vmd_last_err, "test-hooks"));
	if (create_sandbox(&v, NULL, NULL, &sb) != MOAT_OK) {
		vmd_log_tail(&v, 30);
		fail_msg("create: %s", vmd_last_err);
	}
	qemu_pid = sb->vmm_pid;
	snprintf(dir, sizeof(dir), "%s/vms/%s", state_dir, sb->id);
	snprintf(ram, sizeof(ram), "/dev/shm/moat-%s.ram", sb->id);
	assert_true(path_exists(dir));
	assert_true(path_exists(ram));

	moat_rpc_client_close(v.client);
	v.client = NULL;
	kill(v.pid, SIGKILL);
	assert_int_equal(waitpid(v.pid, &status, 0), v.pid);
	/* A QEMU VMM outlives vmd (issue 15: the next vmd re-adopts it); a
	 * Firecracker one dies with vmd (its death signal). */
	adopts = strcmp(test_driver, "qemu") == 0;
	until = now_ms() + 10000;
	while (!adopts && vmd_procs_mentioning(dir) > 0 && now_ms() < until)
		usleep(50 * 1000);
	assert_int_equal(vmd_procs_mentioning(dir) > 0, adopts);

	/* A live VMM of an earlier vmd (its death signal did not fire):
	 * a process whose command line names its sandbox directory. */
	snprintf(fake_dir, sizeof(fake_dir), "%s/vms/sb-00000000000000aa",
	    state_dir);
	assert_int_equal(moat_mkdir_p(fake_dir, 0700), 0);
	fake = fork();
	assert_true(fake >= 0);
	if (fake == 0) {
		setpgid(0, 0);
		execl("/bin/sh", "sh", "-c", "sleep 60; true", fake_dir,
		    (char *)NULL);
		_exit(127);
	}
	setpgid(fake, fake);
	{
		char pidfile[450], pidtext[32];
		int n = snprintf(pidtext, sizeof(pidtext), "%d\n", (int)fake);

		snprintf(pidfile, sizeof(pidfile), "%s/qemu.pid", fake_dir);
		assert_int_equal(moat_write_file_atomic(pidfile, pidtext,
		                     (size_t)n, 0644),
		    0);
	}
	until = now_ms() + 5000;
	while (vmd_procs_mentioning(fake_dir) == 0 && now_ms() < until)
		usleep(10 * 1000);

	/* A new vmd on the same state dir re-adopts the sandbox and cleans
	 * up what has no state file. */
	vmd_start(&v, state_dir, false, NULL, NULL);
	assert_int_equal(path_exists(dir), adopts);
	assert_int_equal(path_exists(ram), adopts);
	assert_false(path_exists(fake_dir));
	assert_int_equal(waitpid(fake, &status, 0), fake);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	kill(-fake, SIGKILL); /* its sleep */
	assert_true(log_has(&v,
	    "cleaned up sandbox sb-00000000000000aa left "
	    "by an earlier vmd (its VMM was still running and was killed)"));
	assert_int_equal(moat_read_file(v.log, 1 << 20, &log, &len), 0);
	{
		char *line = adopts ? moat_asprintf("sandbox %s: re-adopted "
		                                    "its running VMM (pid %d",
		                          sb->id, qemu_pid) :
		                      moat_asprintf("cleaned up sandbox %s "
		                                    "left by an earlier vmd",
		                          sb->id);
		assert_non_null(strstr(log, line));
		free(line);
	}
	free(log);
	if (adopts)
		vmd_destroy_sandbox(&v, sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	vmd_stop(&v);
}

/* ---- accel=auto ---- */

static bool
log_has(const struct vmd_proc *v, const char *needle)
{
	char *log = NULL;
	size_t len;
	bool found;

	if (moat_read_file(v->log, 1 << 22, &log, &len) != 0)
		return false;
	found = strstr(log, needle) != NULL;
	free(log);
	return found;
}

/* With accel=auto the first boot finds out whether KVM runs the guest (on
 * some hosts /dev/kvm exists but the guest hangs: one warning, then TCG);
 * the answer is cached, so a second vmd with the same cache dir does not
 * probe again. Where there is no /dev/kvm, [vmd] kvm-device=/dev/null
 * makes vmd believe there is one, and QEMU's own failure to use KVM is
 * what the probe sees. */
static void
test_accel_auto(void **state)
{
	struct vmd_proc v;
	char state_dir[300];
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__Empty e = MOAT__V1__EMPTY__INIT;
	Moat__V1__Node *node = NULL;
	char decided[8];
	int fd;

	if (!have_image)
		skip();
	/* No silent TCG (issue 14): without KVM and without allow-tcg,
	 * accel=auto refuses sandboxes, naming the key. */
	snprintf(state_dir, sizeof(state_dir), "%s/auto-refused", state_root);
	setenv("MOAT_VMD_KVM_DEVICE", "/nonexistent/kvm", 1);
	unsetenv("MOAT_VMD_ALLOW_TCG");
	vmd_start(&v, state_dir, false, NULL, "auto");
	assert_int_equal(vmd_call(&v, "NodeInfo", &e.base,
	                     &moat__v1__node__descriptor,
	                     (ProtobufCMessage **)&node, 5000),
	    MOAT_OK);
	assert_false(node->allow_tcg);
	protobuf_c_message_free_unpacked(&node->base, NULL);
	assert_int_equal(create_sandbox(&v, NULL, NULL, &sb),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(vmd_last_err, "allow-tcg"));
	assert_int_equal(vmd_procs_mentioning("/auto-refused/vms"), 0);
	vmd_stop(&v);
	unsetenv("MOAT_VMD_KVM_DEVICE");

	/* The probe below falls back to TCG: allowed here. */
	setenv("MOAT_VMD_ALLOW_TCG", "true", 1);
	if ((fd = open("/dev/kvm", O_RDWR | O_CLOEXEC)) < 0)
		setenv("MOAT_VMD_KVM_DEVICE", "/dev/null", 1);
	else
		close(fd);
	snprintf(state_dir, sizeof(state_dir), "%s/auto", state_root);
	vmd_start(&v, state_dir, false, NULL, "auto");
	assert_int_equal(vmd_call(&v, "NodeInfo", &e.base,
	                     &moat__v1__node__descriptor,
	                     (ProtobufCMessage **)&node, 5000),
	    MOAT_OK);
	assert_string_equal(node->accel, ""); /* not decided yet */
	protobuf_c_message_free_unpacked(&node->base, NULL);
	if (create_sandbox(&v, NULL, NULL, &sb) != MOAT_OK) {
		vmd_log_tail(&v, 30);
		fail_msg("create: %s", vmd_last_err);
	}
	snprintf(decided, sizeof(decided), "%s", sb->accel);
	fprintf(stderr, "accel=auto decided %s\n", decided);
	assert_true(
	    strcmp(decided, "kvm") == 0 || strcmp(decided, "tcg") == 0);
	if (strcmp(decided, "tcg") == 0)
		assert_true(log_has(&v, "falling back to TCG"));
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	assert_int_equal(vmd_call(&v, "NodeInfo", &e.base,
	                     &moat__v1__node__descriptor,
	                     (ProtobufCMessage **)&node, 5000),
	    MOAT_OK);
	assert_string_equal(node->accel, decided);
	protobuf_c_message_free_unpacked(&node->base, NULL);
	vmd_stop(&v);

	/* Same cache dir: decided at start from the cache, no probe. */
	moat_rm_rf(v.log);
	vmd_start(&v, state_dir, false, NULL, "auto");
	assert_int_equal(vmd_call(&v, "NodeInfo", &e.base,
	                     &moat__v1__node__descriptor,
	                     (ProtobufCMessage **)&node, 5000),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(&node->base, NULL);
	if (create_sandbox(&v, NULL, NULL, &sb) != MOAT_OK) {
		vmd_log_tail(&v, 30);
		fail_msg("create: %s", vmd_last_err);
	}
	assert_string_equal(sb->accel, decided);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	assert_true(log_has(&v, "as probed before"));
	assert_false(log_has(&v, "falling back to TCG"));
	vmd_stop(&v);
	unsetenv("MOAT_VMD_KVM_DEVICE");
	unsetenv("MOAT_VMD_ALLOW_TCG");
}

/* ---- snapshots (issue 3) ---- */

static Moat__V1__LocalSnapshot *
take_snapshot(const char *id)
{
	Moat__V1__SnapshotSandboxRequest req =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *snap = NULL;

	req.sandbox_id = (char *)id;
	if (vmd_call(&main_vmd, "SnapshotSandbox", &req.base,
	        &moat__v1__local_snapshot__descriptor,
	        (ProtobufCMessage **)&snap, LONG_MS) != MOAT_OK) {
		vmd_log_tail(&main_vmd, 30);
		fail_msg("SnapshotSandbox: %s", vmd_last_err);
	}
	return snap;
}

static int
restore_snapshot(const char *snap_id, Moat__V1__Sandbox **out)
{
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;

	req.snapshot_id = (char *)snap_id;
	return vmd_call(&main_vmd, "RestoreSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, (ProtobufCMessage **)out, LONG_MS);
}

/* Runs `script` under bash in `id`, wants exit 0, returns its stdout as
 * a heap string. */
static char *
bash_out(const char *id, const char *script)
{
	Moat__V1__ExecResult *r =
	    run_code(&main_vmd, id, "bash", script, 0, 0, MOAT_OK);
	char *out;

	if (r->status->exit_code != 0)
		fail_msg("%s exited %d: %.*s", script, r->status->exit_code,
		    (int)r->stderr.len, (char *)r->stderr.data);
	/* No output is a NULL data pointer, which strndup may not get. */
	out = r->stdout.len ? strndup((char *)r->stdout.data, r->stdout.len) :
	                      strdup("");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	assert_non_null(out);
	return out;
}

/* The state a snapshot must carry: a file, its hash, and a process
 * started in the background that is still running. The clone must see
 * them as they were when the snapshot was taken, its own clock and
 * name, and randomness no other clone shares. */
static void
test_snapshot_restore(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__LocalSnapshot *snap;
	Moat__V1__Sandbox *c1 = NULL, *c2 = NULL;
	char *before, *after, *o1, *o2, *r1, *r2;
	char *path;
	long host_now, guest_now;

	before = bash_out(id,
	    "echo state-at-snapshot > /root/snap.txt && "
	    "{ sleep 100000 >/dev/null 2>&1 </dev/null & echo $! > "
	    "/root/bg.pid; } && sha256sum /root/snap.txt");
	snap = take_snapshot(id);
	assert_true(strncmp(snap->snapshot_id, "snap-", 5) == 0);
	assert_string_equal(snap->sandbox_id, id);
	assert_true(snap->device_state_bytes > 0);
	assert_true(snap->ram_bytes > 0);
	assert_true(snap->disk_bytes > 0);
	/* Its link had handed out ids (the execs above): a restore numbers
	 * above them (LocalSnapshot.link_last_id). */
	assert_true(snap->link_last_id > 0);
	path = moat_asprintf("%s/device_state", snap->dir);
	assert_true(path_exists(path));
	free(path);
	path = moat_asprintf("%s/ram", snap->dir);
	assert_true(path_exists(path));
	free(path);
	fprintf(stderr,
	    "snapshot %s: paused %.1f ms, device state %" PRIu64
	    " B, RAM %" PRIu64 " B\n",
	    snap->snapshot_id, snap->pause_ms_exact, snap->device_state_bytes,
	    snap->ram_bytes);

	/* The original goes on and changes after the snapshot. */
	free(bash_out(id,
	    "echo changed-later > /root/snap.txt && "
	    "rm -f /root/bg.pid"));

	if (restore_snapshot(snap->snapshot_id, &c1) != MOAT_OK) {
		vmd_log_tail(&main_vmd, 30);
		fail_msg("RestoreSandbox: %s", vmd_last_err);
	}
	assert_int_equal(c1->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	assert_string_not_equal(c1->id, id);
	fprintf(stderr, "restore -> agent reset: %" PRIu64 " ms\n",
	    c1->boot_ms);
	after = bash_out(c1->id, "sha256sum /root/snap.txt");
	assert_string_equal(before, after);
	free(after);
	o1 = bash_out(c1->id,
	    "cat /root/snap.txt; tr '\\0' ' ' < "
	    "/proc/$(cat /root/bg.pid)/cmdline; echo; hostname");
	after =
	    moat_asprintf("state-at-snapshot\nsleep 100000 \n%s\n", c1->id);
	assert_string_equal(o1, after);
	free(after);
	free(o1);
	/* The original still runs, with its own later state. */
	o1 = bash_out(id, "cat /root/snap.txt");
	assert_string_equal(o1, "changed-later\n");
	free(o1);

	/* The clock is the host's, not the snapshot's. */
	sleep(2);
	o1 = bash_out(c1->id, "date +%s");
	guest_now = strtol(o1, NULL, 10);
	host_now = (long)time(NULL);
	free(o1);
	assert_true(guest_now > host_now - 5 && guest_now < host_now + 5);

	/* A second clone diverges on its own and has its own randomness. */
	if (restore_snapshot(snap->snapshot_id, &c2) != MOAT_OK)
		fail_msg("RestoreSandbox 2: %s", vmd_last_err);
	free(bash_out(c1->id, "echo one > /root/only-c1.txt"));
	o2 = bash_out(c2->id,
	    "cat /root/snap.txt; test -e /root/only-c1.txt"
	    " && echo leak || echo clean");
	assert_string_equal(o2, "state-at-snapshot\nclean\n");
	free(o2);
	r1 = bash_out(c1->id, "head -c 32 /dev/urandom | od -An -tx1");
	r2 = bash_out(c2->id, "head -c 32 /dev/urandom | od -An -tx1");
	assert_string_not_equal(r1, r2);
	free(r1);
	free(r2);
	r1 = bash_out(c1->id,
	    "python3 -c 'import random; "
	    "print(random.random())' 2>/dev/null || echo none");
	r2 = bash_out(c2->id,
	    "python3 -c 'import random; "
	    "print(random.random())' 2>/dev/null || echo none");
	if (strcmp(r1, "none\n") != 0)
		assert_string_not_equal(r1, r2);
	free(r1);
	free(r2);

	/* Another build of the image under the same name (here: a new
	 * mtime on its root filesystem) cannot restore the snapshot. */
	{
		char *rootfs =
		    moat_asprintf("%s/default/rootfs.ext4", image_dir);
		struct stat st;
		struct timespec ts[2];
		Moat__V1__Sandbox *c3 = NULL;

		assert_int_equal(stat(rootfs, &st), 0);
		ts[0] = st.st_atim;
		ts[1] = st.st_mtim;
		ts[1].tv_sec += 1;
		assert_int_equal(utimensat(AT_FDCWD, rootfs, ts, 0), 0);
		assert_int_equal(restore_snapshot(snap->snapshot_id, &c3),
		    MOAT_FAILED_PRECONDITION);
		assert_non_null(strstr(vmd_last_err, "another build"));
		ts[1] = st.st_mtim;
		assert_int_equal(utimensat(AT_FDCWD, rootfs, ts, 0), 0);
		free(rootfs);
	}

	vmd_destroy_sandbox(&main_vmd, c1->id);
	vmd_destroy_sandbox(&main_vmd, c2->id);
	protobuf_c_message_free_unpacked(&c1->base, NULL);
	protobuf_c_message_free_unpacked(&c2->base, NULL);
	free(bash_out(id, "pkill -f 'sleep 100000' || true"));
	free(before);

	/* Delete removes the files; the snapshot is gone for good. */
	{
		Moat__V1__LocalSnapshotRef ref =
		    MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
		Moat__V1__ListLocalSnapshotsRequest lr =
		    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;
		Moat__V1__LocalSnapshotList *list = NULL;
		bool listed = false;

		assert_int_equal(
		    vmd_call(&main_vmd, "ListLocalSnapshots", &lr.base,
		        &moat__v1__local_snapshot_list__descriptor,
		        (ProtobufCMessage **)&list, 30000),
		    MOAT_OK);
		for (size_t i = 0; i < list->n_snapshots; i++)
			listed |= strcmp(list->snapshots[i]->snapshot_id,
			              snap->snapshot_id) == 0;
		assert_true(listed);
		protobuf_c_message_free_unpacked(&list->base, NULL);
		ref.snapshot_id = snap->snapshot_id;
		assert_int_equal(vmd_call(&main_vmd, "DeleteLocalSnapshot",
		                     &ref.base, &moat__v1__empty__descriptor,
		                     NULL, 30000),
		    MOAT_OK);
		assert_false(path_exists(snap->dir));
		path =
		    moat_asprintf("/dev/shm/moat-%s.ram", snap->snapshot_id);
		assert_false(path_exists(path));
		free(path);
		assert_int_equal(vmd_call(&main_vmd, "DeleteLocalSnapshot",
		                     &ref.base, &moat__v1__empty__descriptor,
		                     NULL, 30000),
		    MOAT_NOT_FOUND);
		assert_int_equal(restore_snapshot(snap->snapshot_id, &c1),
		    MOAT_NOT_FOUND);
	}
	protobuf_c_message_free_unpacked(&snap->base, NULL);
}

/* Bad input to the snapshot calls: errors, never a crash. */
static void
test_snapshot_errors(void **state)
{
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;

	assert_int_equal(restore_snapshot("snap-nowhere-0123456789abcdef",
	                     &sb),
	    MOAT_NOT_FOUND);
	assert_int_equal(restore_snapshot("../../etc", &sb), MOAT_NOT_FOUND);
	assert_int_equal(restore_snapshot("", &sb), MOAT_INVALID_ARGUMENT);
	sr.sandbox_id = "sb-0000000000000000";
	assert_int_equal(vmd_call(&main_vmd, "SnapshotSandbox", &sr.base,
	                     &moat__v1__local_snapshot__descriptor, NULL,
	                     30000),
	    MOAT_NOT_FOUND);
}

/* ---- snapshots through moat-snapd (issue 3) ---- */

static pid_t snapd_pid;
static char snapd_dir[300];
static char snapd_url[340];

/* Starts moat-snapd (next to moat-vmd in the build) in <state_root>/snapd;
 * skips the case when it was not built. */
static void
snapd_start(void)
{
	char vmd_bin[] = MOAT_VMD_BIN;
	Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 500 };
	struct moat_rpc_client *c = NULL;
	char *slash = strrchr(vmd_bin, '/'), *bin, *err = NULL, *log;
	int rv = MOAT_UNAVAILABLE;

	if (slash != NULL)
		*slash = '\0';
	bin = moat_asprintf("%s/moat-snapd", slash ? vmd_bin : ".");
	if (access(bin, X_OK) != 0) {
		fprintf(stderr, "NOTE: no %s (make moat-snapd): skipped\n",
		    bin);
		free(bin);
		skip();
	}
	snprintf(snapd_dir, sizeof(snapd_dir), "%s/snapd", state_root);
	snprintf(snapd_url, sizeof(snapd_url), "ipc://%s/snapd.sock",
	    snapd_dir);
	assert_int_equal(moat_mkdir_p(snapd_dir, 0700), 0);
	log = moat_asprintf("%s.log", snapd_dir);
	snapd_pid = fork();
	assert_true(snapd_pid >= 0);
	if (snapd_pid == 0) {
		if (freopen(log, "a", stderr) == NULL)
			_exit(126);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		unsetenv("MOAT_CONFIG");
		execl(bin, bin, "--state-dir", snapd_dir, "--listen",
		    snapd_url, (char *)NULL);
		_exit(127);
	}
	free(log);
	free(bin);
	assert_int_equal(moat_rpc_client_open(&c, snapd_url, &err), 0);
	for (int i = 0; i < 200 && rv != MOAT_OK; i++) {
		ProtobufCMessage *reply = NULL;

		free(err);
		err = NULL;
		rv = moat_rpc_call(c, "moat.v1.Snapshot", "Health", &h.base,
		    &moat__v1__health_reply__descriptor, &reply, &opts, &err);
		if (reply != NULL)
			protobuf_c_message_free_unpacked(reply, NULL);
		if (rv != MOAT_OK)
			usleep(50 * 1000);
	}
	moat_rpc_client_close(c);
	if (rv != MOAT_OK)
		fail_msg("moat-snapd never answered: %s", err ? err : "?");
	free(err);
}

static void
snapd_stop(void)
{
	int status;

	if (snapd_pid <= 0)
		return;
	kill(snapd_pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(snapd_pid, &status, WNOHANG) == snapd_pid) {
			snapd_pid = 0;
			return;
		}
		usleep(10 * 1000);
	}
	kill(snapd_pid, SIGKILL);
	waitpid(snapd_pid, &status, 0);
	snapd_pid = 0;
}

/* The vmds of the snapd case, stopped by its teardown even when it
 * fails half way (pid 0: not running). */
static struct vmd_proc push_a, push_b;

static int
snapd_case_teardown(void **state)
{
	static const char *const names[] = { "push-a", "push-b" };

	(void)state;
	if (push_a.pid > 0)
		(void)vmd_stop_status(&push_a);
	if (push_b.pid > 0)
		(void)vmd_stop_status(&push_b);
	snapd_stop();
	/* Snapshots a failed run left: their RAM copies live on /dev/shm,
	 * outside the state directory the group teardown removes. */
	for (size_t i = 0; i < 2; i++) {
		char *root =
		    moat_asprintf("%s/%s/snapshots", state_root, names[i]);
		DIR *d = root ? opendir(root) : NULL;
		struct dirent *de;

		while (d != NULL && (de = readdir(d)) != NULL) {
			char *link =
			    moat_asprintf("%s/%s/ram", root, de->d_name);
			char target[4096];
			ssize_t n;

			if (link != NULL &&
			    strncmp(de->d_name, "snap-", 5) == 0 &&
			    (n = readlink(link, target, sizeof(target) - 1)) >
			        0) {
				target[n] = '\0';
				if (strncmp(target, "/dev/shm/moat-", 14) == 0)
					(void)unlink(target);
			}
			free(link);
		}
		if (d != NULL)
			closedir(d);
		free(root);
	}
	return 0;
}

/* A vmd of its own (state <state_root>/<name>) that uses this snapd. */
static void
vmd_start_snapd(struct vmd_proc *v, const char *name)
{
	char *state = moat_asprintf("%s/%s", state_root, name);

	setenv("MOAT_VMD_SNAPD", snapd_url, 1);
	vmd_start(v, state, false, NULL, NULL);
	unsetenv("MOAT_VMD_SNAPD");
	free(state);
}

/* snapshot_push_on: SnapshotSandbox of `id` on `v`; with `wait_push` the
 * reply comes once the push to snapd ended (remote_* set), else at once
 * (the push runs in the background: remote_pending). */
static Moat__V1__LocalSnapshot *
snapshot_push_on(struct vmd_proc *v, const char *id, bool wait_push)
{
	Moat__V1__SnapshotSandboxRequest req =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *snap = NULL;

	req.sandbox_id = (char *)id;
	req.wait_push = wait_push;
	if (vmd_call(v, "SnapshotSandbox", &req.base,
	        &moat__v1__local_snapshot__descriptor,
	        (ProtobufCMessage **)&snap, LONG_MS) != MOAT_OK) {
		vmd_log_tail(v, 30);
		fail_msg("SnapshotSandbox: %s", vmd_last_err);
	}
	return snap;
}

/* snapshot_on: a snapshot whose push to snapd (if any) is done. */
static Moat__V1__LocalSnapshot *
snapshot_on(struct vmd_proc *v, const char *id)
{
	return snapshot_push_on(v, id, true);
}

/* wait_pushes: waits (up to 2 min) until no snapshot of `v` has a push
 * pending, then refreshes the remote_* fields of snaps[0..n) from its
 * list. */
static void
wait_pushes(struct vmd_proc *v, Moat__V1__LocalSnapshot **snaps, size_t n)
{
	Moat__V1__ListLocalSnapshotsRequest lr =
	    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__LocalSnapshotList *list = NULL;
	uint64_t until = now_ms() + 120000;
	bool pending = true;

	while (pending) {
		if (list != NULL)
			protobuf_c_message_free_unpacked(&list->base, NULL);
		assert_int_equal(
		    vmd_call(v, "ListLocalSnapshots", &lr.base,
		        &moat__v1__local_snapshot_list__descriptor,
		        (ProtobufCMessage **)&list, 30000),
		    MOAT_OK);
		pending = false;
		for (size_t i = 0; i < list->n_snapshots; i++)
			pending |= list->snapshots[i]->remote_pending;
		if (pending && now_ms() > until)
			fail_msg("snapshot pushes still pending after 2 min");
		if (pending)
			usleep(100000);
	}
	for (size_t k = 0; k < n; k++)
		for (size_t i = 0; i < list->n_snapshots; i++) {
			Moat__V1__LocalSnapshot *s = list->snapshots[i];

			if (strcmp(s->snapshot_id, snaps[k]->snapshot_id) != 0)
				continue;
			/* Unset, it is protobuf-c's shared "": not freed. */
			if (snaps[k]->remote_id != protobuf_c_empty_string)
				free(snaps[k]->remote_id);
			snaps[k]->remote_id = strdup(s->remote_id);
			snaps[k]->remote_stored = s->remote_stored;
		}
	protobuf_c_message_free_unpacked(&list->base, NULL);
}

static int
restore_on(struct vmd_proc *v, const char *snap_id, Moat__V1__Sandbox **out)
{
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;

	req.snapshot_id = (char *)snap_id;
	return vmd_call(v, "RestoreSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, (ProtobufCMessage **)out, LONG_MS);
}

/* bash_out on vmd `v`. */
static char *
bash_on(struct vmd_proc *v, const char *id, const char *script)
{
	Moat__V1__ExecResult *r =
	    run_code(v, id, "bash", script, 0, 0, MOAT_OK);
	char *out;

	if (r->status->exit_code != 0)
		fail_msg("%s exited %d: %.*s", script, r->status->exit_code,
		    (int)r->stderr.len, (char *)r->stderr.data);
	out = r->stdout.len ? strndup((char *)r->stdout.data, r->stdout.len) :
	                      strdup("");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	assert_non_null(out);
	return out;
}

static void
delete_local(struct vmd_proc *v, const char *snap_id)
{
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;

	ref.snapshot_id = (char *)snap_id;
	(void)vmd_call(v, "DeleteLocalSnapshot", &ref.base,
	    &moat__v1__empty__descriptor, NULL, 30000);
}

/* Flips one byte in every copy, in snapd's LMDB file, of a 64-byte window
 * of the first chunk of `file` (a window of varied bytes, so it names that
 * chunk and nothing else), behind snapd's back. Returns the copies
 * flipped. */
static int
corrupt_chunk_of(const char *file, const char *other)
{
	enum { BLOCK = 1 << 20 };
	char *db = moat_asprintf("%s/snapd/data.mdb", snapd_dir);
	char *data = NULL, *buf = malloc(BLOCK + 64);
	size_t len = 0, win = 0;
	int flipped = 0, fd;
	bool found = false;
	off_t pos = 0;
	ssize_t n;

	assert_non_null(buf);
	/* The first chunk of `file` unlike the same chunk of `other` (so
	 * a node holding `other` cannot take it from there). */
	data = malloc(16384);
	assert_non_null(data);
	{
		char *odata = malloc(16384);
		int ofd = open(other, O_RDONLY);
		off_t at = 0;
		ssize_t on = 0;

		assert_non_null(odata);
		fd = open(file, O_RDONLY);
		assert_true(fd >= 0 && ofd >= 0);
		for (;; at += 16384) {
			n = pread(fd, data, 16384, at);
			assert_true(n > 64);
			on = pread(ofd, odata, 16384, at);
			if (on != n || memcmp(data, odata, (size_t)n) != 0)
				break;
		}
		close(fd);
		close(ofd);
		free(odata);
		len = (size_t)n;
	}
	for (size_t off = 0; off + 64 <= len && !found; off += 64) {
		bool seen[256] = { false };
		int distinct = 0;

		for (size_t i = 0; i < 64; i++)
			if (!seen[(uint8_t)data[off + i]]) {
				seen[(uint8_t)data[off + i]] = true;
				distinct++;
			}
		if (distinct >= 24) {
			win = off;
			found = true;
		}
	}
	assert_true(found);
	fd = open(db, O_RDWR);
	assert_true(fd >= 0);
	/* Blocks overlap by 63 bytes so no copy straddles two unseen. */
	while ((n = pread(fd, buf, BLOCK + 63, pos)) >= 64) {
		for (ssize_t i = 0; i + 64 <= n; i++) {
			char b;

			if (memcmp(buf + i, data + win, 64) != 0)
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
	free(data);
	free(db);
	return flipped;
}

/* Prints the line of `v`'s log that holds `needle`; false if none. */
static bool
print_log_line(const struct vmd_proc *v, const char *needle)
{
	char *log = NULL, *p, *end;
	size_t len;

	if (moat_read_file(v->log, 1 << 22, &log, &len) != 0)
		return false;
	if ((p = strstr(log, needle)) == NULL) {
		free(log);
		return false;
	}
	while (p > log && p[-1] != '\n')
		p--;
	end = strchr(p, '\n');
	fprintf(stderr, "vmd: %.*s\n", end ? (int)(end - p) : (int)strlen(p),
	    p);
	free(log);
	return true;
}

/* Snapshots on one vmd go to snapd after the sandbox resumes; a second
 * vmd with its own state directory restores one it never held, from the
 * chunks alone, and sees the files as they were; the snapshot after one
 * small python step stores a small fraction of guest RAM; a corrupted
 * chunk is DATA_LOSS naming the snapshot, never a restore; a snapd that
 * is down leaves a local snapshot that says it is not stored. */
static void
test_snapd_remote_restore(void **state)
{
	struct vmd_proc *const a_ = &push_a, *const b_ = &push_b;
	Moat__V1__Sandbox *sb = NULL, *clone = NULL;
	Moat__V1__LocalSnapshot *s1, *s2, *s3, *s4;
	Moat__V1__ExecResult *r;
	char *before, *after, *path, *o;
	uint64_t t0, t_s1;
	double frac;

	if (!have_image)
		skip();
	if (strcmp(test_driver, "qemu") != 0)
		skip();
	snapd_start();
	vmd_start_snapd(a_, "push-a");
	if (create_sandbox(a_, NULL, NULL, &sb) != MOAT_OK) {
		vmd_log_tail(a_, 30);
		fail_msg("create: %s", vmd_last_err);
	}
	before = bash_on(a_, sb->id,
	    "echo remote-state > /root/remote.txt && "
	    "sync && sha256sum /root/remote.txt");
	t0 = now_ms();
	s1 = snapshot_on(a_, sb->id);
	t_s1 = now_ms() - t0;
	if (!s1->remote_stored) {
		vmd_log_tail(a_, 30);
		fail_msg("not pushed: %s", s1->remote_error);
	}
	assert_true(strncmp(s1->remote_id, "snap-", 5) == 0);
	assert_string_equal(s1->remote_parent_id, "");
	fprintf(stderr,
	    "snapd snapshot %s (local %s): paused %.1f ms, call "
	    "%" PRIu64 " ms with the push, %" PRIu64 " B stored of %" PRIu64
	    " B logical\n",
	    s1->remote_id, s1->snapshot_id, s1->pause_ms_exact, t_s1,
	    s1->remote_stored_bytes, s1->remote_logical_bytes);

	/* One small python step, then the next snapshot: its new bytes. */
	r = run_code(a_, sb->id, "python", "x = 6 * 7\nprint(x)", 0, 0,
	    MOAT_OK);
	assert_int_equal(r->status->exit_code, 0);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	t0 = now_ms();
	s2 = snapshot_on(a_, sb->id);
	t_s1 = now_ms() - t0;
	assert_true(s2->remote_stored);
	assert_string_equal(s2->remote_parent_id, s1->remote_id);
	frac = (double)s2->remote_stored_bytes /
	    ((double)sb->memory_mib * 1048576.0);
	fprintf(stderr,
	    "second snapshot after one python step: %" PRIu64
	    " B stored = %.2f%% of guest RAM (%u MiB; goal <= 5%%), "
	    "paused %.1f ms, call %" PRIu64 " ms with the push\n",
	    s2->remote_stored_bytes, frac * 100.0, sb->memory_mib,
	    s2->pause_ms_exact, t_s1);
	free(bash_on(a_, sb->id, "echo changed-later > /root/remote.txt"));

	/* A second node: restores s1 from snapd alone. */
	vmd_start_snapd(b_, "push-b");
	t0 = now_ms();
	if (restore_on(b_, s1->remote_id, &clone) != MOAT_OK) {
		vmd_log_tail(b_, 30);
		fail_msg("remote RestoreSandbox: %s", vmd_last_err);
	}
	fprintf(stderr,
	    "restore on a second vmd from snapd: %" PRIu64
	    " ms for the call (pull included), %" PRIu64 " ms of it to the "
	    "agent's reply, %" PRIu64 " B pulled\n",
	    now_ms() - t0, clone->boot_ms, clone->pulled_bytes);
	assert_true(clone->pulled_bytes > 0);
	after = bash_on(b_, clone->id, "sha256sum /root/remote.txt");
	assert_string_equal(before, after);
	free(after);
	o = bash_on(b_, clone->id, "cat /root/remote.txt");
	assert_string_equal(o, "remote-state\n");
	free(o);
	vmd_destroy_sandbox(b_, clone->id);
	protobuf_c_message_free_unpacked(&clone->base, NULL);
	clone = NULL;
	/* The node that took it restores the snapd id from its own copy. */
	if (restore_on(a_, s1->remote_id, &clone) != MOAT_OK) {
		vmd_log_tail(a_, 30);
		fail_msg("RestoreSandbox by snapd id on its node: %s",
		    vmd_last_err);
	}
	assert_int_equal(clone->pulled_bytes, 0);
	path = moat_asprintf("%s/snapshots/%s", a_->state, s1->remote_id);
	assert_false(path_exists(path));
	free(path);
	vmd_destroy_sandbox(a_, clone->id);
	protobuf_c_message_free_unpacked(&clone->base, NULL);
	clone = NULL;
	/* Another tenant does not see it. */
	{
		Moat__V1__RestoreSandboxRequest req =
		    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;

		req.snapshot_id = s2->remote_id;
		assert_int_equal(vmd_call_as(b_, "someone-else",
		                     "RestoreSandbox", &req.base,
		                     &moat__v1__sandbox__descriptor, NULL,
		                     LONG_MS),
		    MOAT_NOT_FOUND);
	}

	/* s2 on node b: its parent s1 is there, so only the chunks that
	 * changed since come from snapd. */
	if (restore_on(b_, s2->remote_id, &clone) != MOAT_OK) {
		vmd_log_tail(b_, 30);
		fail_msg("remote RestoreSandbox of s2: %s", vmd_last_err);
	}
	o = bash_on(b_, clone->id, "cat /root/remote.txt");
	assert_string_equal(o, "remote-state\n");
	free(o);
	vmd_destroy_sandbox(b_, clone->id);
	protobuf_c_message_free_unpacked(&clone->base, NULL);
	clone = NULL;
	path = moat_asprintf("copied from parent %s", s1->remote_id);
	assert_true(print_log_line(b_, path));
	free(path);

	/* A chunk of s3 that s2 lacks, corrupted in snapd's store:
	 * DATA_LOSS naming s3, and nothing of it left on node b. */
	s3 = snapshot_on(a_, sb->id);
	assert_true(s3->remote_stored);
	path = moat_asprintf("%s/device_state", s3->dir);
	after = moat_asprintf("%s/device_state", s2->dir);
	assert_true(corrupt_chunk_of(path, after) > 0);
	free(path);
	free(after);
	assert_int_equal(restore_on(b_, s3->remote_id, &clone),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(vmd_last_err, s3->remote_id));
	fprintf(stderr, "corrupt chunk: %s\n", vmd_last_err);
	path = moat_asprintf("%s/snapshots/%s", b_->state, s3->remote_id);
	assert_false(path_exists(path));
	free(path);
	path = moat_asprintf("/dev/shm/moat-%s.ram", s3->remote_id);
	assert_false(path_exists(path));
	free(path);

	/* snapd down: the snapshot still succeeds, marked not stored. */
	snapd_stop();
	s4 = snapshot_on(a_, sb->id);
	assert_false(s4->remote_stored);
	assert_string_equal(s4->remote_id, "");
	assert_true(s4->remote_error[0] != '\0');
	fprintf(stderr, "snapd down: %s\n", s4->remote_error);

	delete_local(a_, s1->snapshot_id);
	delete_local(a_, s2->snapshot_id);
	delete_local(a_, s3->snapshot_id);
	delete_local(a_, s4->snapshot_id);
	delete_local(b_, s1->remote_id);
	delete_local(b_, s2->remote_id);
	vmd_destroy_sandbox(a_, sb->id);
	vmd_stop(a_);
	vmd_stop(b_);
	a_->pid = 0;
	b_->pid = 0;
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	protobuf_c_message_free_unpacked(&s1->base, NULL);
	protobuf_c_message_free_unpacked(&s2->base, NULL);
	protobuf_c_message_free_unpacked(&s3->base, NULL);
	protobuf_c_message_free_unpacked(&s4->base, NULL);
	free(before);
}

/* ---- snapshots of clones, restore in place, templates ---- */

static void
delete_snapshot_main(const char *snap_id)
{
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;

	ref.snapshot_id = (char *)snap_id;
	assert_int_equal(vmd_call(&main_vmd, "DeleteLocalSnapshot", &ref.base,
	                     &moat__v1__empty__descriptor, NULL, 30000),
	    MOAT_OK);
}

/* A clone is snapshotted like any sandbox, and so is a clone of a
 * clone: each restore brings back exactly the state of its snapshot (a
 * file, its hash, a background process), and a clone does not depend on
 * the snapshot it came from (it has its own RAM). */
static void
test_snapshot_of_clone(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__LocalSnapshot *s1, *s2, *s3;
	Moat__V1__Sandbox *c1 = NULL, *c2 = NULL, *c3 = NULL;
	char *h2, *o, *want;

	free(bash_out(id, "echo gen1 > /root/gen1.txt"));
	s1 = take_snapshot(id);
	assert_string_equal(s1->vmm, test_driver);
	assert_false(s1->template_);
	if (restore_snapshot(s1->snapshot_id, &c1) != MOAT_OK)
		fail_msg("RestoreSandbox s1: %s", vmd_last_err);
	assert_string_equal(c1->restored_from, s1->snapshot_id);
	assert_string_equal(c1->template_id, "");
	/* The clone's RAM is its own: the snapshot can go. */
	delete_snapshot_main(s1->snapshot_id);
	h2 = bash_out(c1->id,
	    "head -c 100000 /dev/urandom > /root/gen2.bin "
	    "&& echo gen2 > /root/gen2.txt && { sleep 200000 >/dev/null "
	    "2>&1 </dev/null & echo $! > /root/gen2.pid; } && "
	    "sha256sum /root/gen2.bin");
	s2 = take_snapshot(c1->id);
	assert_string_equal(s2->sandbox_id, c1->id);
	assert_true(s2->ram_bytes > 0);
	/* c1 moves on after its snapshot. */
	free(bash_out(c1->id,
	    "echo later > /root/gen2.txt; rm -f "
	    "/root/gen2.bin"));
	if (restore_snapshot(s2->snapshot_id, &c2) != MOAT_OK)
		fail_msg("RestoreSandbox of a clone's snapshot: %s",
		    vmd_last_err);
	assert_string_equal(c2->restored_from, s2->snapshot_id);
	o = bash_out(c2->id,
	    "cat /root/gen1.txt /root/gen2.txt; tr '\\0' "
	    "' ' < /proc/$(cat /root/gen2.pid)/cmdline; echo; hostname; "
	    "sha256sum /root/gen2.bin");
	want = moat_asprintf("gen1\ngen2\nsleep 200000 \n%s\n%s", c2->id, h2);
	assert_string_equal(o, want);
	free(o);
	free(want);

	/* A clone of a clone of a clone. */
	free(bash_out(c2->id, "echo gen3 > /root/gen3.txt"));
	s3 = take_snapshot(c2->id);
	if (restore_snapshot(s3->snapshot_id, &c3) != MOAT_OK)
		fail_msg("RestoreSandbox of a clone's clone: %s",
		    vmd_last_err);
	o = bash_out(c3->id,
	    "cat /root/gen1.txt /root/gen2.txt "
	    "/root/gen3.txt; sha256sum /root/gen2.bin");
	want = moat_asprintf("gen1\ngen2\ngen3\n%s", h2);
	assert_string_equal(o, want);
	free(o);
	free(want);
	o = bash_out(c1->id, "cat /root/gen2.txt");
	assert_string_equal(o, "later\n");
	free(o);

	vmd_destroy_sandbox(&main_vmd, c1->id);
	vmd_destroy_sandbox(&main_vmd, c2->id);
	vmd_destroy_sandbox(&main_vmd, c3->id);
	delete_snapshot_main(s2->snapshot_id);
	delete_snapshot_main(s3->snapshot_id);
	free(bash_out(id, "rm -f /root/gen1.txt"));
	free(h2);
	protobuf_c_message_free_unpacked(&c1->base, NULL);
	protobuf_c_message_free_unpacked(&c2->base, NULL);
	protobuf_c_message_free_unpacked(&c3->base, NULL);
	protobuf_c_message_free_unpacked(&s1->base, NULL);
	protobuf_c_message_free_unpacked(&s2->base, NULL);
	protobuf_c_message_free_unpacked(&s3->base, NULL);
}

/* The sha256 of file `path` (symlinks followed) as 64 hex digits. */
static void
file_sha256(const char *path, char hex[65])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	static char buf[1 << 20];
	FILE *f = fopen(path, "rb");
	size_t got;

	if (f == NULL)
		fail_msg("cannot open %s: %s", path, strerror(errno));
	assert_non_null(ctx);
	assert_int_equal(EVP_DigestInit_ex(ctx, EVP_sha256(), NULL), 1);
	while ((got = fread(buf, 1, sizeof(buf), f)) > 0)
		assert_int_equal(EVP_DigestUpdate(ctx, buf, got), 1);
	fclose(f);
	assert_int_equal(EVP_DigestFinal_ex(ctx, md, &n), 1);
	EVP_MD_CTX_free(ctx);
	for (unsigned i = 0; i < n && i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Whether this test's vmds run with ram-sharing = private
 * (MOAT_TEST_RAM_SHARING, or MOAT_VMD_RAM_SHARING they inherit). */
static bool
ram_private(void)
{
	const char *t = getenv("MOAT_TEST_RAM_SHARING");
	const char *v = getenv("MOAT_VMD_RAM_SHARING");

	if (t != NULL && t[0] != '\0')
		return strcmp(t, "private") == 0;
	return v != NULL && strcmp(v, "private") == 0;
}

/* Whether VMM `pid` maps file `path` privately (ram-sharing =
 * private): a "p" mapping of its inode in /proc/PID/maps. */
static bool
maps_privately(pid_t pid, const char *path)
{
	char maps[64], line[1024];
	struct stat st;
	bool found = false;
	FILE *f;

	snprintf(maps, sizeof(maps), "/proc/%d/maps", (int)pid);
	if (stat(path, &st) != 0 || (f = fopen(maps, "r")) == NULL)
		return false;
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long long ino = 0;
		char perms[8] = "";

		if (sscanf(line, "%*x-%*x %7s %*x %*x:%*x %llu", perms,
		        &ino) == 2 &&
		    ino == (unsigned long long)st.st_ino && perms[3] == 'p')
			found = true;
	}
	if (!found) {
		/* What it maps instead: its large file mappings. */
		fprintf(stderr,
		    "VMM %d does not map %s (inode %llu) privately; it "
		    "maps:\n",
		    (int)pid, path, (unsigned long long)st.st_ino);
		rewind(f);
		while (fgets(line, sizeof(line), f) != NULL) {
			unsigned long long lo = 0, hi = 0;

			if (sscanf(line, "%llx-%llx", &lo, &hi) == 2 &&
			    hi - lo >= (16ull << 20) && strchr(line, '/'))
				fprintf(stderr, "  %s", line);
		}
	}
	fclose(f);
	return found;
}

/* What a clone holds: a file's sha256 and a python variable. */
static void
clone_state(const char *id, char **file_hash, char **py)
{
	Moat__V1__RunCodeResult *r;

	*file_hash = bash_out(id, "sha256sum /root/shared.bin");
	r = code_run(id, "shared", "repr((x, sha))", 0);
	assert_string_equal(r->result->error_name, "");
	*py = strdup(r->result->result);
	protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* Issue 18: a clone whose RAM shares the pages it has not written
 * (ram-sharing = private under MOAT_TEST_RAM_SHARING=private; the same
 * checks hold for copy) is snapshotted and restored, new and in place,
 * exactly: a file by sha256 and python variables; the RAM file of the
 * snapshot it was cloned from is unchanged by the clone's writes. */
static void
test_snapshot_private_clone(void **state)
{
	const char *id = shared_sandbox();
	bool priv = ram_private();
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *base, *s1;
	Moat__V1__Sandbox *c1 = NULL, *c2 = NULL, *again = NULL;
	Moat__V1__RunCodeResult *r;
	char before[65] = "", after[65] = "";
	char *base_ram, *h1, *p1, *h, *p;

	base = take_snapshot(id);
	base_ram = moat_asprintf("%s/ram", base->dir);
	file_sha256(base_ram, before);
	if (restore_snapshot(base->snapshot_id, &c1) != MOAT_OK)
		fail_msg("RestoreSandbox: %s", vmd_last_err);
	if (priv)
		assert_true(maps_privately((pid_t)c1->vmm_pid, base_ram));

	/* The clone writes: a file, python variables, and lots of RAM. */
	free(bash_out(c1->id,
	    "head -c 3000000 /dev/urandom > /root/shared.bin && sync"));
	r = code_run(c1->id, "shared",
	    "import hashlib, os\nblob = os.urandom(8 << 20)\n"
	    "sha = hashlib.sha256(blob).hexdigest()\nx = [1, 'two', 3.0]",
	    0);
	assert_string_equal(r->result->error_name, "");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	clone_state(c1->id, &h1, &p1);
	s1 = take_snapshot(c1->id);

	/* The clone moves on. */
	free(bash_out(c1->id, "echo changed > /root/shared.bin"));
	r = code_run(c1->id, "shared", "x = None; sha = ''", 0);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	/* A new sandbox from the clone's snapshot. */
	if (restore_snapshot(s1->snapshot_id, &c2) != MOAT_OK) {
		vmd_log_tail(&main_vmd, 30);
		fail_msg("RestoreSandbox of the clone's snapshot: %s",
		    vmd_last_err);
	}
	clone_state(c2->id, &h, &p);
	assert_string_equal(h, h1);
	assert_string_equal(p, p1);
	free(h);
	free(p);
	r = code_run(c2->id, "shared",
	    "hashlib.sha256(blob).hexdigest() == sha", 0);
	assert_string_equal(r->result->result, "True");
	protobuf_c_message_free_unpacked(&r->base, NULL);

	/* The clone itself, restored in place. */
	req.snapshot_id = s1->snapshot_id;
	req.replace_sandbox_id = c1->id;
	if (vmd_call(&main_vmd, "RestoreSandbox", &req.base,
	        &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&again,
	        LONG_MS) != MOAT_OK)
		fail_msg("RestoreSandbox in place: %s", vmd_last_err);
	clone_state(c1->id, &h, &p);
	assert_string_equal(h, h1);
	assert_string_equal(p, p1);
	free(h);
	free(p);
	if (priv) {
		char *s1_ram = moat_asprintf("%s/ram", s1->dir ? s1->dir : "");

		assert_true(maps_privately((pid_t)again->vmm_pid, s1_ram));
		free(s1_ram);
	}

	/* The template's RAM is what it was. */
	file_sha256(base_ram, after);
	assert_string_equal(after, before);

	vmd_destroy_sandbox(&main_vmd, c1->id);
	vmd_destroy_sandbox(&main_vmd, c2->id);
	delete_snapshot_main(s1->snapshot_id);
	delete_snapshot_main(base->snapshot_id);
	free(base_ram);
	free(h1);
	free(p1);
	protobuf_c_message_free_unpacked(&again->base, NULL);
	protobuf_c_message_free_unpacked(&c1->base, NULL);
	protobuf_c_message_free_unpacked(&c2->base, NULL);
	protobuf_c_message_free_unpacked(&s1->base, NULL);
	protobuf_c_message_free_unpacked(&base->base, NULL);
}

/* RestoreSandbox with replace_sandbox_id: the sandbox keeps its id, its
 * VM is a new one, and what happened after the snapshot is gone. */
static void
test_restore_in_place(void **state)
{
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__LocalSnapshot *snap;
	Moat__V1__Sandbox *before = NULL, *after = NULL, *got = NULL;
	Moat__V1__ListSandboxesRequest lr =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	Moat__V1__SandboxList *list = NULL;
	const char *id = shared_sandbox();
	size_t seen = 0;
	char *o;

	free(bash_out(id, "echo at-snapshot > /root/inplace.txt"));
	snap = take_snapshot(id);
	free(bash_out(id,
	    "echo after > /root/inplace.txt && touch "
	    "/root/after-only.txt"));
	ref.sandbox_id = (char *)id;
	assert_int_equal(vmd_call(&main_vmd, "GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor,
	                     (ProtobufCMessage **)&before, 30000),
	    MOAT_OK);

	/* Refusals leave the sandbox as it was. */
	req.snapshot_id = snap->snapshot_id;
	req.replace_sandbox_id = "sb-0000000000000000";
	assert_int_equal(vmd_call(&main_vmd, "RestoreSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, LONG_MS),
	    MOAT_NOT_FOUND);
	req.replace_sandbox_id = (char *)id;
	assert_int_equal(vmd_call_as(&main_vmd, "someone-else",
	                     "RestoreSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, NULL, LONG_MS),
	    MOAT_NOT_FOUND);
	o = bash_out(id, "cat /root/inplace.txt");
	assert_string_equal(o, "after\n");
	free(o);

	/* A restore that fails once its VM started (a snapshot whose device
	 * state is garbage) leaves the old VM running as it was. */
	{
		Moat__V1__LocalSnapshot *bad = take_snapshot(id);
		Moat__V1__Sandbox *same = NULL;
		char *path = moat_asprintf("%s/device_state", bad->dir);
		int rv;

		assert_int_equal(moat_write_file_atomic(path, "garbage", 7,
		                     0600),
		    0);
		req.snapshot_id = bad->snapshot_id;
		rv = vmd_call(&main_vmd, "RestoreSandbox", &req.base,
		    &moat__v1__sandbox__descriptor, NULL, LONG_MS);
		assert_int_not_equal(rv, MOAT_OK);
		fprintf(stderr, "bad in-place restore: %s: %s\n",
		    moat_strerror(rv), vmd_last_err);
		assert_int_equal(vmd_call(&main_vmd, "GetSandbox", &ref.base,
		                     &moat__v1__sandbox__descriptor,
		                     (ProtobufCMessage **)&same, 30000),
		    MOAT_OK);
		assert_int_equal(same->vmm_pid, before->vmm_pid);
		assert_string_equal(same->restored_from,
		    before->restored_from);
		o = bash_out(id, "cat /root/inplace.txt");
		assert_string_equal(o, "after\n");
		free(o);
		delete_snapshot_main(bad->snapshot_id);
		protobuf_c_message_free_unpacked(&same->base, NULL);
		protobuf_c_message_free_unpacked(&bad->base, NULL);
		free(path);
		req.snapshot_id = snap->snapshot_id;
	}

	if (vmd_call(&main_vmd, "RestoreSandbox", &req.base,
	        &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&after,
	        LONG_MS) != MOAT_OK) {
		vmd_log_tail(&main_vmd, 30);
		fail_msg("RestoreSandbox in place: %s", vmd_last_err);
	}
	assert_string_equal(after->id, id);
	assert_string_equal(after->restored_from, snap->snapshot_id);
	assert_int_equal(after->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	assert_true(after->vmm_pid > 0);
	assert_int_not_equal(after->vmm_pid, before->vmm_pid);
	/* The old VM is gone. */
	for (int i = 0; i < 300 && kill(before->vmm_pid, 0) == 0; i++)
		usleep(10 * 1000);
	assert_int_not_equal(kill(before->vmm_pid, 0), 0);
	o = bash_out(id,
	    "cat /root/inplace.txt; test -e "
	    "/root/after-only.txt && echo kept || echo gone; hostname");
	{
		char *want = moat_asprintf("at-snapshot\ngone\n%s\n", id);

		assert_string_equal(o, want);
		free(want);
	}
	free(o);
	assert_int_equal(vmd_call(&main_vmd, "GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor,
	                     (ProtobufCMessage **)&got, 30000),
	    MOAT_OK);
	assert_int_equal(got->vmm_pid, after->vmm_pid);
	assert_int_equal(vmd_call(&main_vmd, "ListSandboxes", &lr.base,
	                     &moat__v1__sandbox_list__descriptor,
	                     (ProtobufCMessage **)&list, 30000),
	    MOAT_OK);
	for (size_t i = 0; i < list->n_sandboxes; i++)
		seen += strcmp(list->sandboxes[i]->id, id) == 0;
	assert_int_equal(seen, 1);

	free(bash_out(id, "rm -f /root/inplace.txt"));
	delete_snapshot_main(snap->snapshot_id);
	protobuf_c_message_free_unpacked(&list->base, NULL);
	protobuf_c_message_free_unpacked(&got->base, NULL);
	protobuf_c_message_free_unpacked(&before->base, NULL);
	protobuf_c_message_free_unpacked(&after->base, NULL);
	protobuf_c_message_free_unpacked(&snap->base, NULL);
}

/* A snapshot records its VMM; another VMM's snapshot (here: its meta
 * edited to say firecracker) is refused naming the VMM it needs. */
static void
test_snapshot_wrong_vmm(void **state)
{
	const char *id = shared_sandbox();
	Moat__V1__LocalSnapshot *snap = take_snapshot(id), *m;
	Moat__V1__Sandbox *sb = NULL;
	char *path = moat_asprintf("%s/meta.pb", snap->dir);
	const char *other =
	    strcmp(test_driver, "qemu") == 0 ? "firecracker" : "qemu";
	char *buf = NULL;
	size_t len = 0;
	uint8_t *packed;

	assert_string_equal(snap->vmm, test_driver);
	assert_int_equal(moat_read_file(path, 1 << 16, &buf, &len), 0);
	m = moat__v1__local_snapshot__unpack(NULL, len, (uint8_t *)buf);
	assert_non_null(m);
	assert_string_equal(m->vmm, test_driver);
	free(m->vmm);
	m->vmm = strdup(other);
	len = moat__v1__local_snapshot__get_packed_size(m);
	packed = malloc(len);
	assert_non_null(packed);
	moat__v1__local_snapshot__pack(m, packed);
	assert_int_equal(moat_write_file_atomic(path, packed, len, 0600), 0);
	assert_int_equal(restore_snapshot(snap->snapshot_id, &sb),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(vmd_last_err, other));
	fprintf(stderr, "wrong vmm: %s\n", vmd_last_err);
	delete_snapshot_main(snap->snapshot_id);
	free(packed);
	free(buf);
	free(path);
	moat__v1__local_snapshot__free_unpacked(m, NULL);
	protobuf_c_message_free_unpacked(&snap->base, NULL);
}

/* Snapshot storage full (a 256 KiB tmpfs over <state>/snapshots): the
 * snapshot fails RESOURCE_EXHAUSTED naming the directory, nothing of it
 * stays or lists, and the sandbox runs on. */
static void
test_snapshot_disk_full(void **state)
{
	Moat__V1__SnapshotSandboxRequest req =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__ListLocalSnapshotsRequest lr =
	    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__LocalSnapshotList *list = NULL;
	const char *id = shared_sandbox();
	char *dir = moat_asprintf("%s/snapshots", main_vmd.state);
	char *cmd;
	DIR *d;
	struct dirent *de;
	int entries = 0, rv;
	char *o, *why;

	assert_int_equal(moat_mkdir_p(dir, 0700), 0);
	cmd = moat_asprintf("mount -t tmpfs -o size=256k moat-test-full '%s' "
	                    "2>/dev/null",
	    dir);
	if (system(cmd) != 0) {
		fprintf(stderr,
		    "SKIPPED test_snapshot_disk_full: cannot mount "
		    "a tmpfs on %s (needs root and mount rights)\n",
		    dir);
		free(cmd);
		free(dir);
		skip();
	}
	free(cmd);
	req.sandbox_id = (char *)id;
	rv = vmd_call(&main_vmd, "SnapshotSandbox", &req.base,
	    &moat__v1__local_snapshot__descriptor, NULL, LONG_MS);
	fprintf(stderr, "disk full: %s: %s\n", moat_strerror(rv),
	    vmd_last_err);
	why = strdup(vmd_last_err);
	d = opendir(dir);
	while (d != NULL && (de = readdir(d)) != NULL)
		entries += de->d_name[0] != '.';
	if (d != NULL)
		closedir(d);
	assert_int_equal(vmd_call(&main_vmd, "ListLocalSnapshots", &lr.base,
	                     &moat__v1__local_snapshot_list__descriptor,
	                     (ProtobufCMessage **)&list, 30000),
	    MOAT_OK);
	cmd = moat_asprintf("umount '%s'", dir);
	assert_int_equal(system(cmd), 0);
	free(cmd);
	assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(why, dir));
	{
		/* Nor is its RAM copy left on tmpfs. */
		char *snap = strstr(why, "snap-");
		char *ram;

		assert_non_null(snap);
		snap[strcspn(snap, " ")] = '\0';
		ram = moat_asprintf("/dev/shm/moat-%s.ram", snap);
		assert_false(path_exists(ram));
		free(ram);
	}
	free(why);
	assert_int_equal(entries, 0);
	assert_int_equal(list->n_snapshots, 0);
	o = bash_out(id, "echo still-running");
	assert_string_equal(o, "still-running\n");
	free(o);
	protobuf_c_message_free_unpacked(&list->base, NULL);
	free(dir);
}

/* Issue 11: snapshot RAM under a budget. A vmd with a 256 MiB budget and
 * its RAM dir on a 1200 MiB tmpfs of the test's own takes nine snapshots
 * (about three times the budget); the copies past the budget go to
 * snapd's chunks, the RAM dir and Shmem stay within the guest plus the
 * budget plus slack, and every snapshot, evicted or not, restores
 * exactly (a python variable, a file by sha256). Then sandboxes are
 * created until the RAM dir is full: the last is RESOURCE_EXHAUSTED
 * naming it (every copy evicted first), and so is a snapshot that does
 * not fit; no QEMU dies of a signal. Deleting the snapshots removes them
 * from snapd and gives the memory back. */
static struct vmd_proc budget_vmd;
static char budget_ram[320];

static int
budget_case_teardown(void **state)
{
	char *cmd;

	(void)state;
	if (budget_vmd.pid > 0)
		(void)vmd_stop_status(&budget_vmd);
	snapd_stop();
	if (budget_ram[0] != '\0' &&
	    (cmd = moat_asprintf("umount '%s' 2>/dev/null", budget_ram)) !=
	        NULL) {
		(void)!system(cmd);
		free(cmd);
	}
	return 0;
}

/* Bytes used in the filesystem at `dir`. */
static uint64_t
fs_used(const char *dir)
{
	struct statvfs fs;

	assert_int_equal(statvfs(dir, &fs), 0);
	return ((uint64_t)fs.f_blocks - fs.f_bfree) * fs.f_frsize;
}

static uint64_t
shmem_bytes(void)
{
	char *text = NULL, *p;
	size_t len = 0;
	uint64_t kib = 0;

	assert_int_equal(moat_read_file("/proc/meminfo", 1 << 16, &text, &len),
	    0);
	if ((p = strstr(text, "\nShmem:")) != NULL)
		kib = strtoull(p + 7, NULL, 10);
	free(text);
	return kib * 1024;
}

/* other_vmms: how many QEMU processes run on this host that are not
 * this test's (under state_root): their guests grow Shmem too, so a
 * host-wide Shmem figure says nothing about this vmd while they run. */
static int
other_vmms(void)
{
	char *cmd =
	    moat_asprintf("pgrep -f qemu-system | while read -r p; do "
	                  "tr '\\0' ' ' </proc/$p/cmdline 2>/dev/null | "
	                  "grep -qF '%s' || echo $p; done | wc -l",
	        state_root);
	FILE *f = popen(cmd, "r");
	int n = 0;

	if (f != NULL) {
		if (fscanf(f, "%d", &n) != 1)
			n = 0;
		pclose(f);
	}
	free(cmd);
	return n;
}

static Moat__V1__Node *
node_of(struct vmd_proc *v)
{
	Moat__V1__Empty e = MOAT__V1__EMPTY__INIT;
	Moat__V1__Node *n = NULL;

	assert_int_equal(vmd_call(v, "NodeInfo", &e.base,
	                     &moat__v1__node__descriptor,
	                     (ProtobufCMessage **)&n, 30000),
	    MOAT_OK);
	return n;
}

#define BUDGET_MIB 256u
#define BUDGET_SNAPS 9
#define BUDGET_SLACK (96ull << 20)

static void
test_snapshot_ram_budget(void **state)
{
	Moat__V1__Sandbox *a = NULL, *extra[6] = { NULL };
	Moat__V1__ListLocalSnapshotsRequest lr =
	    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__LocalSnapshotList *list = NULL;
	Moat__V1__LocalSnapshot *snaps[BUDGET_SNAPS] = { NULL };
	char sums[BUDGET_SNAPS][80];
	uint64_t shm0, ram0, peak_used = 0, peak_shm = 0;
	Moat__V1__Node *n;
	char *cmd, *o, *state_dir;
	size_t n_extra = 0, on_disk = 0;
	int rv = MOAT_OK, others;

	(void)state;
	if (!have_image)
		skip();
	snprintf(budget_ram, sizeof(budget_ram), "%s/budget-ram", state_root);
	assert_int_equal(moat_mkdir_p(budget_ram, 0700), 0);
	cmd = moat_asprintf("mount -t tmpfs -o size=1200m moat-test-ram '%s' "
	                    "2>/dev/null",
	    budget_ram);
	if (system(cmd) != 0) {
		fprintf(stderr,
		    "SKIPPED test_snapshot_ram_budget: cannot mount "
		    "a tmpfs on %s (needs root and mount rights)\n",
		    budget_ram);
		free(cmd);
		budget_ram[0] = '\0';
		skip();
	}
	free(cmd);
	shm0 = shmem_bytes();
	ram0 = fs_used(budget_ram);
	snapd_start();
	state_dir = moat_asprintf("%s/budget", state_root);
	setenv("MOAT_VMD_SNAPD", snapd_url, 1);
	setenv("MOAT_VMD_RAM_DIR", budget_ram, 1);
	setenv("MOAT_VMD_SNAPSHOT_RAM_MIB", "256", 1);
	vmd_start(&budget_vmd, state_dir, false, NULL, NULL);
	unsetenv("MOAT_VMD_SNAPD");
	unsetenv("MOAT_VMD_RAM_DIR");
	unsetenv("MOAT_VMD_SNAPSHOT_RAM_MIB");
	free(state_dir);
	n = node_of(&budget_vmd);
	assert_int_equal(n->snapshot_ram_budget_bytes,
	    (uint64_t)BUDGET_MIB << 20);
	assert_string_equal(n->ram_dir, budget_ram);
	protobuf_c_message_free_unpacked(&n->base, NULL);

	if (create_sandbox(&budget_vmd, NULL, NULL, &a) != MOAT_OK) {
		vmd_log_tail(&budget_vmd, 30);
		fail_msg("CreateSandbox: %s", vmd_last_err);
	}
	/* Nine states, each with its own variable and file. */
	for (int i = 0; i < BUDGET_SNAPS; i++) {
		char code[200];
		Moat__V1__RunCodeResult *r;

		snprintf(code, sizeof(code),
		    "head -c 3000000 /dev/urandom "
		    ">/root/s%d.bin && sha256sum /root/s%d.bin | cut -c1-64",
		    i, i);
		o = bash_on(&budget_vmd, a->id, code);
		snprintf(sums[i], sizeof(sums[i]), "%s", o);
		free(o);
		snprintf(code, sizeof(code), "x = %d", 1000 + i);
		r = code_run_on(&budget_vmd, a->id, "", code, 0);
		protobuf_c_message_free_unpacked(&r->base, NULL);
		/* The reply does not wait for the push to snapd. */
		snaps[i] = snapshot_push_on(&budget_vmd, a->id, false);
		assert_false(snaps[i]->remote_stored);
		assert_true(snaps[i]->remote_pending);
		if (fs_used(budget_ram) - ram0 > peak_used)
			peak_used = fs_used(budget_ram) - ram0;
		if (shmem_bytes() - shm0 > peak_shm)
			peak_shm = shmem_bytes() - shm0;
	}
	n = node_of(&budget_vmd);
	fprintf(stderr,
	    "budget: %" PRIu64 " MiB of copies in RAM, %u in "
	    "RAM, %u on disk, %" PRIu64 " evictions; peak RAM dir +%" PRIu64
	    " MiB, Shmem +%" PRIu64 " MiB\n",
	    n->snapshot_ram_used_bytes >> 20, n->snapshots_in_ram,
	    n->snapshots_on_disk, n->snapshot_evictions, peak_used >> 20,
	    peak_shm >> 20);
	assert_true(n->snapshot_ram_used_bytes <= (uint64_t)BUDGET_MIB << 20);
	assert_true(n->snapshot_evictions >= 3);
	assert_int_equal(n->snapshots_in_ram + n->snapshots_on_disk,
	    BUDGET_SNAPS);
	protobuf_c_message_free_unpacked(&n->base, NULL);
	/* The guest's own RAM (256 MiB at most), the budget, and slack. */
	assert_true(
	    peak_used <= ((uint64_t)(256 + BUDGET_MIB) << 20) + BUDGET_SLACK);
	assert_true(
	    peak_shm <= ((uint64_t)(256 + BUDGET_MIB) << 20) + BUDGET_SLACK);
	assert_int_equal(vmd_call(&budget_vmd, "ListLocalSnapshots", &lr.base,
	                     &moat__v1__local_snapshot_list__descriptor,
	                     (ProtobufCMessage **)&list, 30000),
	    MOAT_OK);
	for (size_t i = 0; i < list->n_snapshots; i++) {
		const Moat__V1__LocalSnapshot *s = list->snapshots[i];

		if (strcmp(s->location, "disk") == 0) {
			on_disk++;
			assert_string_equal(s->evicted_to, "snapd");
			assert_int_equal(s->ram_resident_bytes, 0);
		} else {
			assert_string_equal(s->location, "ram");
		}
	}
	assert_true(on_disk >= 3);
	protobuf_c_message_free_unpacked(&list->base, NULL);

	/* Every snapshot restores exactly, oldest (evicted) first. */
	for (int i = 0; i < BUDGET_SNAPS; i++) {
		Moat__V1__Sandbox *c = NULL;
		Moat__V1__RunCodeResult *r;
		char want[40], code[120];

		if (restore_on(&budget_vmd, snaps[i]->snapshot_id, &c) !=
		    MOAT_OK) {
			vmd_log_tail(&budget_vmd, 30);
			fail_msg("restore of %s: %s", snaps[i]->snapshot_id,
			    vmd_last_err);
		}
		snprintf(code, sizeof(code),
		    "sha256sum /root/s%d.bin | "
		    "cut -c1-64",
		    i);
		o = bash_on(&budget_vmd, c->id, code);
		assert_string_equal(o, sums[i]);
		free(o);
		r = code_run_on(&budget_vmd, c->id, "", "x", 0);
		snprintf(want, sizeof(want), "%d", 1000 + i);
		assert_string_equal(r->result->result, want);
		protobuf_c_message_free_unpacked(&r->base, NULL);
		vmd_destroy_sandbox(&budget_vmd, c->id);
		protobuf_c_message_free_unpacked(&c->base, NULL);
	}
	assert_true(log_has(&budget_vmd, "RAM rebuilt from snapd"));

	/* Fill the RAM dir with sandboxes: the one that does not fit is
	 * refused, after every copy went to disk to make room. */
	while (n_extra < 6 &&
	    (rv = create_sandbox(&budget_vmd, NULL, NULL, &extra[n_extra])) ==
	        MOAT_OK)
		n_extra++;
	fprintf(stderr, "budget: %zu more sandboxes, then %s: %s\n", n_extra,
	    moat_strerror(rv), vmd_last_err);
	assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(vmd_last_err, budget_ram));
	assert_non_null(strstr(vmd_last_err, "snapshot-ram-mib"));
	{
		/* Sandbox a's RAM file gets over 160 MiB, more than the
		 * room left (under 256 MiB: a create of that was refused),
		 * or than what a filler sandbox leaves; a snapshot of it
		 * cannot fit. */
		Moat__V1__RunCodeResult *r = code_run_on(&budget_vmd, a->id,
		    "", "blob = b'x' * (150 << 20); len(blob)", 0);

		if (strcmp(r->result->result, "157286400") != 0)
			fail_msg("filling 150 MiB in the guest: %s %s",
			    r->result->error_name, r->result->error_value);
		protobuf_c_message_free_unpacked(&r->base, NULL);
	}
	n = node_of(&budget_vmd);
	assert_int_equal(n->snapshots_in_ram, 0);
	{
		uint64_t left =
		    n->ram_dir_capacity_bytes - n->ram_dir_reserved_bytes;
		Moat__V1__SnapshotSandboxRequest sr =
		    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
		Moat__V1__CreateSandboxRequest cr =
		    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;

		if (left > (uint64_t)(128 + 32) << 20) {
			cr.memory_mib = (uint32_t)(left >> 20) - 32;
			cr.scratch_mib = 256;
			assert_int_equal(
			    vmd_call(&budget_vmd, "CreateSandbox", &cr.base,
			        &moat__v1__sandbox__descriptor,
			        (ProtobufCMessage **)&extra[n_extra], LONG_MS),
			    MOAT_OK);
			n_extra++;
		}
		sr.sandbox_id = a->id;
		rv = vmd_call(&budget_vmd, "SnapshotSandbox", &sr.base,
		    &moat__v1__local_snapshot__descriptor, NULL, LONG_MS);
		fprintf(stderr,
		    "budget: snapshot with %" PRIu64 " MiB left: "
		    "%s: %s\n",
		    left >> 20, moat_strerror(rv), vmd_last_err);
		assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	}
	protobuf_c_message_free_unpacked(&n->base, NULL);
	o = bash_on(&budget_vmd, a->id, "echo alive");
	assert_string_equal(o, "alive\n");
	free(o);
	for (size_t i = 0; i < n_extra; i++) {
		vmd_destroy_sandbox(&budget_vmd, extra[i]->id);
		protobuf_c_message_free_unpacked(&extra[i]->base, NULL);
	}
	assert_false(log_has(&budget_vmd, "killed by signal"));

	/* Deleting the snapshots takes them out of snapd (an earlier case
	 * may have left others there) and empties the RAM dir. Each was
	 * pushed: in the background, or when evicted. */
	wait_pushes(&budget_vmd, snaps, BUDGET_SNAPS);
	for (int i = 0; i < BUDGET_SNAPS; i++) {
		assert_true(snaps[i]->remote_stored);
		delete_local(&budget_vmd, snaps[i]->snapshot_id);
	}
	{
		Moat__V1__ListSnapshotsRequest q =
		    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
		Moat__V1__ListSnapshotsReply *l = NULL;
		struct moat_rpc_client *c = NULL;
		char *err = NULL;

		q.tenant = "default";
		assert_int_equal(moat_rpc_client_open(&c, snapd_url, &err), 0);
		assert_int_equal(
		    moat_rpc_call(c, "moat.v1.Snapshot", "ListSnapshots",
		        &q.base, &moat__v1__list_snapshots_reply__descriptor,
		        (ProtobufCMessage **)&l, NULL, &err),
		    MOAT_OK);
		for (size_t j = 0; j < l->n_snapshots; j++)
			for (int i = 0; i < BUDGET_SNAPS; i++)
				if (strcmp(l->snapshots[j]->id,
				        snaps[i]->remote_id) == 0)
					fail_msg(
					    "snapshot %s is still in snapd "
					    "as %s",
					    snaps[i]->snapshot_id,
					    snaps[i]->remote_id);
		protobuf_c_message_free_unpacked(&l->base, NULL);
		moat_rpc_client_close(c);
	}
	for (int i = 0; i < BUDGET_SNAPS; i++)
		protobuf_c_message_free_unpacked(&snaps[i]->base, NULL);
	vmd_destroy_sandbox(&budget_vmd, a->id);
	protobuf_c_message_free_unpacked(&a->base, NULL);
	fprintf(stderr,
	    "budget: after deleting, RAM dir +%" PRIu64 " MiB, "
	    "Shmem +%" PRIu64 " MiB\n",
	    (fs_used(budget_ram) - ram0) >> 20,
	    shmem_bytes() > shm0 ? (shmem_bytes() - shm0) >> 20 : 0);
	assert_true(fs_used(budget_ram) - ram0 < (16ull << 20));
	if ((others = other_vmms()) == 0)
		assert_true(shmem_bytes() < shm0 + (32ull << 20));
	else
		fprintf(stderr,
		    "budget: host Shmem not checked: %d other VMs run on "
		    "this host (the RAM dir's figure above is this vmd's)\n",
		    others);
	vmd_stop(&budget_vmd);
}

/* Templates: the first create of a shape boots cold and makes the
 * template in the background; later creates are clones of it with their
 * own name and randomness; cold_boot=true boots; a template that does
 * not restore falls back to a cold boot and is dropped. */
static struct vmd_proc tpl_vmd;

static int
create_shaped(struct vmd_proc *v, bool cold, Moat__V1__Sandbox **out)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;

	req.memory_mib = 256;
	req.scratch_mib = 256;
	req.cold_boot = cold;
	return vmd_call(v, "CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, (ProtobufCMessage **)out, LONG_MS);
}

/* Removes template `id`'s spare RAM copies from /dev/shm. */
static void
spares_unlink(const char *id)
{
	char *prefix = moat_asprintf("moat-spare-%s-", id);
	DIR *d = opendir("/dev/shm");
	struct dirent *de;

	while (d != NULL && prefix != NULL && (de = readdir(d)) != NULL)
		if (strncmp(de->d_name, prefix, strlen(prefix)) == 0)
			(void)unlinkat(dirfd(d), de->d_name, 0);
	if (d != NULL)
		closedir(d);
	free(prefix);
}

static int
templates_case_teardown(void **state)
{
	char *root;
	DIR *d;
	struct dirent *de;

	(void)state;
	if (tpl_vmd.pid > 0)
		(void)vmd_stop_status(&tpl_vmd);
	/* Template RAM copies live on /dev/shm, outside the state dir. */
	root = moat_asprintf("%s/tpl/templates", state_root);
	d = root ? opendir(root) : NULL;
	while (d != NULL && (de = readdir(d)) != NULL) {
		char *link = moat_asprintf("%s/%s/ram", root, de->d_name);
		char target[4096];
		ssize_t n;

		if (link != NULL &&
		    (n = readlink(link, target, sizeof(target) - 1)) > 0) {
			target[n] = '\0';
			if (strncmp(target, "/dev/shm/moat-", 14) == 0)
				(void)unlink(target);
		}
		free(link);
		/* Spares a failed run may have left (vmd removes them). */
		if (strncmp(de->d_name, "tpl-", 4) == 0 &&
		    strchr(de->d_name, '.') == NULL)
			spares_unlink(de->d_name);
	}
	if (d != NULL)
		closedir(d);
	free(root);
	return 0;
}

/* How many spare RAM copies of template `id` are in /dev/shm (ready
 * ones only when `ready`). */
static int
spare_count(const char *id, bool ready)
{
	char *prefix = moat_asprintf("moat-spare-%s-", id);
	DIR *d = opendir("/dev/shm");
	struct dirent *de;
	int n = 0;

	while (d != NULL && prefix != NULL && (de = readdir(d)) != NULL) {
		size_t len = strlen(de->d_name);

		if (strncmp(de->d_name, prefix, strlen(prefix)) == 0 &&
		    (!ready ||
		        (len > 4 &&
		            strcmp(de->d_name + len - 4, ".ram") == 0)))
			n++;
	}
	if (d != NULL)
		closedir(d);
	free(prefix);
	return n;
}

/* The inode numbers of template `id`'s ready spares, up to `max`. */
static int
spare_inodes(const char *id, ino_t *ino, int max)
{
	char *prefix = moat_asprintf("moat-spare-%s-", id);
	DIR *d = opendir("/dev/shm");
	struct dirent *de;
	struct stat st;
	int n = 0;

	while (d != NULL && prefix != NULL && n < max &&
	    (de = readdir(d)) != NULL) {
		size_t len = strlen(de->d_name);

		if (strncmp(de->d_name, prefix, strlen(prefix)) == 0 &&
		    len > 4 && strcmp(de->d_name + len - 4, ".ram") == 0 &&
		    fstatat(dirfd(d), de->d_name, &st, 0) == 0)
			ino[n++] = st.st_ino;
	}
	if (d != NULL)
		closedir(d);
	free(prefix);
	return n;
}

/* Spares of every template under state dir `sdir`, plus of `id`. */
static int
spare_count_all(const char *sdir, const char *id)
{
	char *root = moat_asprintf("%s/templates", sdir);
	DIR *d = root ? opendir(root) : NULL;
	struct dirent *de;
	int n = spare_count(id, false);

	while (d != NULL && (de = readdir(d)) != NULL)
		if (strncmp(de->d_name, "tpl-", 4) == 0 &&
		    strchr(de->d_name, '.') == NULL &&
		    strcmp(de->d_name, id) != 0)
			n += spare_count(de->d_name, false);
	if (d != NULL)
		closedir(d);
	free(root);
	return n;
}

static void
test_templates(void **state)
{
	Moat__V1__Sandbox *a = NULL, *b = NULL, *c = NULL, *cold = NULL;
	Moat__V1__Sandbox *e = NULL, *f = NULL;
	Moat__V1__ListLocalSnapshotsRequest lr =
	    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__LocalSnapshotList *list = NULL;
	char *sdir = moat_asprintf("%s/tpl", state_root);
	char *tdir = NULL, *hb, *hc, *rb, *rc, *path, *tid;
	uint64_t until;
	ino_t ino[64];
	int n_ino, i;
	struct stat st;

	if (!have_image)
		skip();
	vmd_templates_env = "on";
	vmd_start(&tpl_vmd, sdir, false, NULL, NULL);
	vmd_templates_env = "off";

	if (create_shaped(&tpl_vmd, false, &a) != MOAT_OK) {
		vmd_log_tail(&tpl_vmd, 30);
		fail_msg("first create: %s", vmd_last_err);
	}
	assert_string_equal(a->template_id, "");
	until = now_ms() + LONG_MS;
	while ((tdir = vmd_template_dir(&tpl_vmd)) == NULL && now_ms() < until)
		usleep(200 * 1000);
	if (tdir == NULL) {
		vmd_log_tail(&tpl_vmd, 30);
		fail_msg("no template was made within %u ms", LONG_MS);
	}
	if (create_shaped(&tpl_vmd, false, &b) != MOAT_OK ||
	    create_shaped(&tpl_vmd, false, &c) != MOAT_OK) {
		vmd_log_tail(&tpl_vmd, 30);
		fail_msg("create from template: %s", vmd_last_err);
	}
	assert_true(strncmp(b->template_id, "tpl-", 4) == 0);
	assert_string_equal(b->template_id, c->template_id);
	assert_non_null(strstr(tdir, b->template_id));
	assert_string_not_equal(b->id, c->id);
	hb = bash_on(&tpl_vmd, b->id, "hostname");
	hc = bash_on(&tpl_vmd, c->id, "hostname");
	path = moat_asprintf("%s\n", b->id);
	assert_string_equal(hb, path);
	free(path);
	path = moat_asprintf("%s\n", c->id);
	assert_string_equal(hc, path);
	free(path);
	rb = bash_on(&tpl_vmd, b->id,
	    "head -c 32 /dev/urandom | od -An "
	    "-tx1");
	rc = bash_on(&tpl_vmd, c->id,
	    "head -c 32 /dev/urandom | od -An "
	    "-tx1");
	assert_string_not_equal(rb, rc);
	free(hb);
	free(hc);
	free(rb);
	free(rc);
	hb = bash_on(&tpl_vmd, b->id, "echo b-runs");
	assert_string_equal(hb, "b-runs\n");
	free(hb);

	tid = strdup(b->template_id);
	assert_non_null(tid);
	if (ram_private()) {
		/* ram-sharing = private: the clones map the template's RAM
		 * file privately; no RAM file of their own, no spares. */
		/* b's own template (tdir is one of the templates there). */
		path = moat_asprintf("%.*s/%s/ram",
		    (int)(strrchr(tdir, '/') - tdir), tdir, b->template_id);
		assert_true(maps_privately((pid_t)b->vmm_pid, path));
		assert_true(maps_privately((pid_t)c->vmm_pid, path));
		free(path);
		path = moat_asprintf("/dev/shm/moat-%s.ram", b->id);
		assert_int_not_equal(stat(path, &st), 0);
		free(path);
		assert_int_equal(spare_count(tid, true), 0);
		goto cold;
	}
	/* The pool of spare RAM copies (default 2) refills after b and c
	 * took or copied theirs; a clone then takes one by rename. */
	until = now_ms() + LONG_MS;
	while (spare_count(tid, true) < 1 && now_ms() < until)
		usleep(100 * 1000);
	n_ino = spare_inodes(tid, ino, 64);
	assert_true(n_ino >= 1);
	if (create_shaped(&tpl_vmd, false, &f) != MOAT_OK) {
		vmd_log_tail(&tpl_vmd, 30);
		fail_msg("create from a spare: %s", vmd_last_err);
	}
	assert_string_equal(f->template_id, tid);
	/* Its RAM file is one of those spares, renamed, not a copy. */
	path = moat_asprintf("/dev/shm/moat-%s.ram", f->id);
	assert_int_equal(stat(path, &st), 0);
	free(path);
	for (i = 0; i < n_ino && ino[i] != st.st_ino; i++)
		;
	assert_true(i < n_ino);
	hb = bash_on(&tpl_vmd, f->id, "hostname");
	path = moat_asprintf("%s\n", f->id);
	assert_string_equal(hb, path);
	assert_string_not_equal(f->id, b->id);
	free(path);
	free(hb);
	hb = bash_on(&tpl_vmd, f->id, "echo f-runs");
	assert_string_equal(hb, "f-runs\n");
	free(hb);
	vmd_destroy_sandbox(&tpl_vmd, f->id);

cold:
	/* cold_boot boots, and templates never list as snapshots. */
	if (create_shaped(&tpl_vmd, true, &cold) != MOAT_OK)
		fail_msg("cold create: %s", vmd_last_err);
	assert_string_equal(cold->template_id, "");
	assert_int_equal(vmd_call(&tpl_vmd, "ListLocalSnapshots", &lr.base,
	                     &moat__v1__local_snapshot_list__descriptor,
	                     (ProtobufCMessage **)&list, 30000),
	    MOAT_OK);
	assert_int_equal(list->n_snapshots, 0);

	/* A template that does not restore: cold boot, template dropped. */
	path = moat_asprintf("%s/device_state", tdir);
	assert_int_equal(moat_write_file_atomic(path, "garbage", 7, 0600), 0);
	free(path);
	vmd_destroy_sandbox(&tpl_vmd, a->id);
	vmd_destroy_sandbox(&tpl_vmd, cold->id);
	if (create_shaped(&tpl_vmd, false, &e) != MOAT_OK) {
		vmd_log_tail(&tpl_vmd, 30);
		fail_msg("create with a bad template: %s", vmd_last_err);
	}
	assert_string_equal(e->template_id, "");
	assert_false(path_exists(tdir));
	hb = bash_on(&tpl_vmd, e->id, "echo e-runs");
	assert_string_equal(hb, "e-runs\n");
	free(hb);

	vmd_destroy_sandbox(&tpl_vmd, b->id);
	vmd_destroy_sandbox(&tpl_vmd, c->id);
	vmd_destroy_sandbox(&tpl_vmd, e->id);
	/* Stopping while the replacement template may be building. */
	vmd_stop(&tpl_vmd);
	/* No spare outlives vmd. */
	assert_int_equal(spare_count_all(sdir, tid), 0);
	free(tid);
	if (f != NULL)
		protobuf_c_message_free_unpacked(&f->base, NULL);
	protobuf_c_message_free_unpacked(&list->base, NULL);
	protobuf_c_message_free_unpacked(&a->base, NULL);
	protobuf_c_message_free_unpacked(&b->base, NULL);
	protobuf_c_message_free_unpacked(&c->base, NULL);
	protobuf_c_message_free_unpacked(&cold->base, NULL);
	protobuf_c_message_free_unpacked(&e->base, NULL);
	free(tdir);
	free(sdir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_node_info),
		cmocka_unit_test(test_survey),
		cmocka_unit_test(test_python_and_bash),
		cmocka_unit_test(test_timeout_kills_tree),
		cmocka_unit_test(test_code_contexts),
		cmocka_unit_test(test_output_cap),
		cmocka_unit_test(test_binary_file),
		cmocka_unit_test(test_exec_streaming),
		cmocka_unit_test(test_file_calls),
		cmocka_unit_test(test_snapshot_errors),
		cmocka_unit_test(test_snapshot_restore),
		cmocka_unit_test_teardown(test_snapd_remote_restore,
		    snapd_case_teardown),
		cmocka_unit_test(test_boot_deadline),
		cmocka_unit_test(test_four_at_once_and_destroy),
		cmocka_unit_test(test_destroy_while_booting),
		cmocka_unit_test(test_hostile_garbage),
		cmocka_unit_test(test_hostile_flood),
		cmocka_unit_test(test_hostile_oversize),
		cmocka_unit_test(test_kill_and_restart),
		cmocka_unit_test(test_accel_auto),
		cmocka_unit_test(test_snapshot_of_clone),
		cmocka_unit_test(test_restore_in_place),
		cmocka_unit_test(test_snapshot_private_clone),
		cmocka_unit_test(test_snapshot_wrong_vmm),
		cmocka_unit_test(test_snapshot_disk_full),
		cmocka_unit_test_teardown(test_snapshot_ram_budget,
		    budget_case_teardown),
		cmocka_unit_test_teardown(test_templates,
		    templates_case_teardown),
	};

	const size_t n_tests = sizeof(tests) / sizeof(tests[0]);
	struct CMUnitTest run[sizeof(tests) / sizeof(tests[0])];
	const char *drv = getenv("MOAT_TEST_DRIVER");
	const char *why;
	size_t n_run = 0;
	int rv;

	signal(SIGPIPE, SIG_IGN);
	/* MOAT_TEST_DRIVER=qemu (default) or firecracker; without a usable
	 * Firecracker every case is skipped by name and the exit code is 77
	 * (ctest's SKIP_RETURN_CODE). */
	if (drv != NULL && drv[0] != '\0' && strcmp(drv, "qemu") != 0) {
		if (strcmp(drv, "firecracker") != 0) {
			fprintf(stderr,
			    "MOAT_TEST_DRIVER=%s is not qemu or "
			    "firecracker\n",
			    drv);
			return 2;
		}
		test_driver = "firecracker";
		want_accel = "kvm";
		default_accel = "auto";
		if ((why = firecracker_unusable()) != NULL) {
			for (size_t i = 0; i < n_tests; i++)
				printf(
				    "SKIPPED: %s (firecracker driver: %s)\n",
				    tests[i].name, why);
			return 77;
		}
	}
	for (size_t i = 0; i < n_tests; i++) {
		if (strcmp(test_driver, "qemu") != 0 &&
		    (why = qemu_only(tests[i].name)) != NULL) {
			printf("SKIPPED: %s (qemu only: %s)\n", tests[i].name,
			    why);
			continue;
		}
		run[n_run++] = tests[i];
	}
	/* MOAT_TEST_FILTER=test_binary* runs only the matching cases. */
	if (getenv("MOAT_TEST_FILTER") != NULL)
		cmocka_set_test_filter(getenv("MOAT_TEST_FILTER"));
	rv = _cmocka_run_group_tests("tests", run, n_run, group_setup,
	    group_teardown);
	/* Without an image only the cases that need no VM ran: the test as
	 * a whole could not do its work, so ctest must say Skipped (77),
	 * never Passed. A failure of the cases that ran still fails. */
	if (rv == 0 && !have_image) {
		printf("SKIPPED: vm_integration (no image at %s/default: "
		       "build it with images/build.sh)\n",
		    image_dir);
		return 77;
	}
	return rv;
}
