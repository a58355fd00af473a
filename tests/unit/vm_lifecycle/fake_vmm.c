/*
 * fake_vmm.c: the scripted VMM driver of fake_vmm.h. Each VMM is a
 * forked child blocked in pause(); each agent connection is a detached
 * thread serving one end of a socketpair, which ends when vmd closes the
 * other. Not for: anything a real driver does with files (no RAM file,
 * no console log, no snapshots).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fake_vmm.h"
#include "guest.pb-c.h"
#include "moat/frame.h"
#include "moat/status.h"

struct fake_script fake_script;

static atomic_int fake_starts;

/* One VMM's driver data: the vmd end's peer of its newest link. */
struct fake_vm {
	atomic_int agent_fd;
};

void
fake_vmm_reset(void)
{
	memset(&fake_script, 0, sizeof(fake_script));
	atomic_store(&fake_starts, 0);
}

int
fake_vmm_starts(void)
{
	return atomic_load(&fake_starts);
}

static int
agent_send(int fd, const Moat__V1__GuestMessage *m)
{
	size_t len = moat__v1__guest_message__get_packed_size(m);
	uint8_t *body = malloc(len + 1);
	uint8_t *frame = NULL;
	size_t flen;
	int rv = -1;

	if (body != NULL) {
		moat__v1__guest_message__pack(m, body);
		frame = moat_frame_encode(body, len, &flen);
	}
	if (frame != NULL)
		rv = moat_frame_write_all(fd, frame, flen);
	free(frame);
	free(body);
	return rv;
}

/* Says ready (per the script), then answers every request OK with an
 * ack until the stream closes. */
static void *
agent_main(void *arg)
{
	int fd = (int)(intptr_t)arg;
	enum fake_agent mode = fake_script.agent;
	struct moat_frame_reader r;
	uint8_t buf[4096];

	if (mode == FAKE_AGENT_CLOSES) {
		close(fd);
		return NULL;
	}
	if (mode == FAKE_AGENT_READY) {
		Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
		Moat__V1__AgentReady ready = MOAT__V1__AGENT_READY__INIT;

		ready.agent_version = "fake";
		ready.kernel = "none";
		m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_READY;
		m.ready = &ready;
		(void)agent_send(fd, &m);
	}
	moat_frame_reader_init(&r, 0);
	for (;;) {
		Moat__V1__GuestRequest *req;
		uint8_t *frame;
		size_t len;
		ssize_t n;

		if (moat_frame_reader_next(&r, &frame, &len) == MOAT_OK) {
			Moat__V1__GuestMessage m =
			    MOAT__V1__GUEST_MESSAGE__INIT;
			Moat__V1__Empty ack = MOAT__V1__EMPTY__INIT;

			req =
			    moat__v1__guest_request__unpack(NULL, len, frame);
			free(frame);
			if (req == NULL)
				break;
			Moat__V1__ExecExit ex = MOAT__V1__EXEC_EXIT__INIT;
			bool exec = req->op_case ==
			    MOAT__V1__GUEST_REQUEST__OP_EXEC_START;

			m.id = req->id;
			m.code = MOAT__V1__CODE__OK;
			m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_ACK;
			m.ack = &ack;
			moat__v1__guest_request__free_unpacked(req, NULL);
			if (agent_send(fd, &m) != 0)
				break;
			/* An exec ends at once, with 0 (the pool's
			 * warm-up waits for it). */
			m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT;
			m.exec_exit = &ex;
			if (exec && agent_send(fd, &m) != 0)
				break;
			continue;
		}
		if ((n = read(fd, buf, sizeof(buf))) <= 0 ||
		    moat_frame_reader_feed(&r, buf, (size_t)n) != 0)
			break;
	}
	moat_frame_reader_fini(&r);
	close(fd);
	return NULL;
}

static int
fake_probe(const char *binary, char **version, char **errmsg)
{
	(void)binary;
	(void)errmsg;
	*version = strdup("fake 1");
	return *version ? MOAT_OK : MOAT_INTERNAL;
}

static int
fake_spawn(struct moat_vmm *vm, bool fails, char **errmsg)
{
	struct fake_vm *fv;
	pid_t pid;

	memset(vm, 0, sizeof(*vm));
	if (fails) {
		*errmsg = strdup("the fake VMM was told to fail");
		return MOAT_INTERNAL;
	}
	if ((fv = calloc(1, sizeof(*fv))) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	atomic_store(&fv->agent_fd, -1);
	if ((pid = fork()) < 0) {
		free(fv);
		*errmsg = strdup(strerror(errno));
		return MOAT_INTERNAL;
	}
	if (pid == 0) {
		/* Hold no copy of another link's socket: its peer must see
		 * EOF when vmd closes it. */
		for (int fd = 3; fd < 1024; fd++)
			(void)close(fd);
		if (fake_script.vmm_exits)
			_exit(3);
		for (;;)
			pause();
	}
	atomic_fetch_add(&fake_starts, 1);
	vm->pid = pid;
	vm->driver_data = fv;
	return MOAT_OK;
}

static int
fake_start(const char *binary, const struct moat_vmm_spec *spec,
    struct moat_vmm *vm, char **errmsg)
{
	(void)binary;
	(void)spec;
	return fake_spawn(vm, fake_script.start_fails, errmsg);
}

static int
fake_restore(const char *binary, const struct moat_vmm_spec *spec,
    const char *snap_dir, struct moat_vmm *vm, char **errmsg)
{
	(void)binary;
	(void)spec;
	(void)snap_dir;
	return fake_spawn(vm,
	    fake_script.start_fails || fake_script.restore_fails, errmsg);
}

static int
fake_resume(const struct moat_vmm *vm, const char *snap_dir,
    uint32_t timeout_ms, char **errmsg)
{
	(void)vm;
	(void)snap_dir;
	(void)timeout_ms;
	if (fake_script.resume_fails) {
		*errmsg = strdup("the fake device state does not load");
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

static int
fake_connect_agent(const struct moat_vmm *vm, int *fd, char **errmsg)
{
	struct fake_vm *fv = vm->driver_data;
	pthread_attr_t attr;
	pthread_t t;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
		*errmsg = strdup(strerror(errno));
		return MOAT_INTERNAL;
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (fv != NULL)
		atomic_store(&fv->agent_fd, sv[1]);
	if (pthread_create(&t, &attr, agent_main, (void *)(intptr_t)sv[1]) !=
	    0) {
		pthread_attr_destroy(&attr);
		close(sv[0]);
		close(sv[1]);
		*errmsg = strdup("cannot start the fake agent");
		return MOAT_INTERNAL;
	}
	pthread_attr_destroy(&attr);
	*fd = sv[0];
	return MOAT_OK;
}

static void
fake_stop(const struct moat_vmm *vm, bool force)
{
	if (vm->pid > 0)
		(void)kill(vm->pid, force ? SIGKILL : SIGTERM);
}

static void
fake_release(struct moat_vmm *vm)
{
	free(vm->driver_data);
	vm->driver_data = NULL;
}

static bool
fake_reap_orphan(const char *dir, const char *id)
{
	(void)dir;
	(void)id;
	return false;
}

void
fake_vmm_agent_lost(const struct moat_vmm *vm)
{
	struct fake_vm *fv = vm->driver_data;
	int fd = fv ? atomic_load(&fv->agent_fd) : -1;

	/* The agent thread sees EOF and closes its end. */
	if (fd >= 0)
		(void)shutdown(fd, SHUT_RDWR);
}

const struct moat_vmm_ops fake_vmm_ops = {
	.name = "fake",
	.probe = fake_probe,
	.start = fake_start,
	.connect_agent = fake_connect_agent,
	.stop = fake_stop,
	.release = fake_release,
	.reap_orphan = fake_reap_orphan,
	.restore = fake_restore,
	.resume = fake_resume,
};
