/*
 * vmd_harness.c: a moat-vmd child of a test, its RPCs and its processes
 * (see vmd_harness.h).
 */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/status.h"
#include "moat/util.h"
#include "vmd_harness.h"

char vmd_last_err[4096];

void
vmd_log_tail(const struct vmd_proc *v, int lines)
{
	char *cmd = moat_asprintf("tail -n %d '%s' >&2", lines, v->log);

	fprintf(stderr, "---- %s ----\n", v->log);
	if (cmd != NULL)
		(void)!system(cmd);
	free(cmd);
}

int
vmd_call_as(struct vmd_proc *v, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **reply, uint32_t timeout_ms)
{
	struct moat_rpc_opts opts = { .timeout_ms = timeout_ms,
		.tenant = tenant };
	ProtobufCMessage *r = NULL;
	char *err = NULL;
	int rv;

	rv = moat_rpc_call(v->client, VMD_SERVICE, method, req, desc, &r,
	    &opts, &err);
	snprintf(vmd_last_err, sizeof(vmd_last_err), "%s", err ? err : "");
	free(err);
	if (reply != NULL)
		*reply = r;
	else if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	return rv;
}

int
vmd_call(struct vmd_proc *v, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
    uint32_t timeout_ms)
{
	return vmd_call_as(v, VMD_TENANT, method, req, desc, reply,
	    timeout_ms);
}

void
vmd_spawn(struct vmd_proc *v, const char *state, vmd_exec_fn exec_vmd,
    void *arg, uint32_t health_ms)
{
	char *err = NULL;
	uint64_t until;

	memset(v, 0, sizeof(*v));
	snprintf(v->state, sizeof(v->state), "%s", state);
	snprintf(v->url, sizeof(v->url), "ipc://%s/vmd.sock", v->state);
	snprintf(v->log, sizeof(v->log), "%s.log", v->state);
	v->pid = fork();
	assert_true(v->pid >= 0);
	if (v->pid == 0) {
		int fd = open(v->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		/* If the test dies, vmd stops (and takes its VMs along:
		 * a test that wants them kept says so in exec_vmd). */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		setenv("MOAT_VMD_STOP_SANDBOXES_ON_EXIT", "true", 1);
		exec_vmd(v, arg);
		_exit(127);
	}
	assert_int_equal(moat_rpc_client_open(&v->client, v->url, &err), 0);
	until = moat_rpc_now_ms() + health_ms;
	for (;;) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		int status;

		if (vmd_call(v, "Health", &h.base,
		        &moat__v1__health_reply__descriptor, NULL,
		        1000) == MOAT_OK)
			break;
		if (waitpid(v->pid, &status, WNOHANG) == v->pid) {
			v->pid = 0;
			vmd_log_tail(v, 30);
			fail_msg("moat-vmd exited at start (status %d)",
			    status);
		}
		if (moat_rpc_now_ms() > until) {
			vmd_log_tail(v, 30);
			fail_msg("moat-vmd did not answer Health: %s",
			    vmd_last_err);
		}
		usleep(50 * 1000);
	}
}

int
vmd_stop_status(struct vmd_proc *v)
{
	int status = 0;

	if (v->pid <= 0)
		return 0;
	moat_rpc_client_close(v->client);
	v->client = NULL;
	kill(v->pid, SIGTERM);
	if (waitpid(v->pid, &status, 0) != v->pid)
		status = -1;
	v->pid = 0;
	if (status != 0)
		vmd_log_tail(v, 30);
	return status;
}

void
vmd_stop(struct vmd_proc *v)
{
	int status = vmd_stop_status(v);

	if (status != 0)
		fail_msg("moat-vmd did not exit 0 on SIGTERM (status %d)",
		    status);
}

int
vmd_create_sandbox(struct vmd_proc *v, uint32_t memory_mib,
    uint64_t scratch_mib, Moat__V1__Sandbox **out, uint32_t timeout_ms)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;

	req.memory_mib = memory_mib;
	req.scratch_mib = scratch_mib;
	return vmd_call(v, "CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, (ProtobufCMessage **)out,
	    timeout_ms);
}

Moat__V1__Sandbox *
vmd_create_or_fail(struct vmd_proc *v, uint32_t memory_mib,
    uint64_t scratch_mib, uint32_t timeout_ms)
{
	Moat__V1__Sandbox *sb = NULL;

	if (vmd_create_sandbox(v, memory_mib, scratch_mib, &sb, timeout_ms) !=
	    MOAT_OK) {
		vmd_log_tail(v, 30);
		fail_msg("CreateSandbox: %s", vmd_last_err);
	}
	return sb;
}

void
vmd_destroy_sandbox(struct vmd_proc *v, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;

	ref.sandbox_id = (char *)id;
	if (vmd_call(v, "DestroySandbox", &ref.base,
	        &moat__v1__empty__descriptor, NULL, 60000) != MOAT_OK)
		fail_msg("DestroySandbox %s: %s", id, vmd_last_err);
}

char *
vmd_template_dir(const struct vmd_proc *v)
{
	char *root = moat_asprintf("%s/templates", v->state);
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

long
vmd_rss_kib(pid_t pid)
{
	char path[64];
	char *text = NULL;
	size_t len;
	long kib = -1;
	char *p;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (moat_read_file(path, 1 << 16, &text, &len) != 0)
		return -1;
	if ((p = strstr(text, "VmRSS:")) != NULL)
		kib = strtol(p + 6, NULL, 10);
	free(text);
	return kib;
}

/* Whether /proc/<pid> is a zombie. */
static bool
is_zombie(const char *pid)
{
	char path[300];
	char *text = NULL;
	size_t len;
	bool zombie = false;

	snprintf(path, sizeof(path), "/proc/%s/stat", pid);
	if (moat_read_file(path, 4096, &text, &len) == 0) {
		char *rp = strrchr(text, ')');

		zombie = rp && rp[1] && rp[2] == 'Z';
		free(text);
	}
	return zombie;
}

int
vmd_procs_mentioning(const char *needle)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)) != NULL) {
		char path[300];
		char *text = NULL;
		size_t len;

		if (de->d_name[0] < '0' || de->d_name[0] > '9' ||
		    atoi(de->d_name) == (int)getpid() || is_zombie(de->d_name))
			continue;
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

pid_t
vmd_snapd_spawn(const char *dir, const char *url)
{
	Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 500 };
	struct moat_rpc_client *c = NULL;
	char bin[] = MOAT_VMD_BIN, *exe, *log, *err = NULL;
	char *slash = strrchr(bin, '/');
	int rv = MOAT_UNAVAILABLE;
	pid_t pid;

	if (slash != NULL)
		*slash = '\0';
	exe = moat_asprintf("%s/moat-snapd", slash ? bin : ".");
	log = moat_asprintf("%s.log", dir);
	assert_int_equal(moat_mkdir_p(dir, 0700), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (freopen(log, "a", stderr) == NULL)
			_exit(126);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		unsetenv("MOAT_CONFIG");
		execl(exe, exe, "--state-dir", dir, "--listen", url,
		    (char *)NULL);
		_exit(127);
	}
	free(log);
	free(exe);
	assert_int_equal(moat_rpc_client_open(&c, url, &err), 0);
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
	return pid;
}

void
vmd_snapd_stop(pid_t *pid)
{
	int status;

	if (*pid <= 0)
		return;
	kill(*pid, SIGTERM);
	waitpid(*pid, &status, 0);
	*pid = 0;
}
