/*
 * agent_client.h: what the moat-agent tests share: start the built agent
 * in host mode on a Unix socket inside a fresh mkdtemp dir, talk to it in
 * guest.proto frames (frame.h + protobuf-c), run an exec to its end, and
 * clean up. Not for: vmd's real guest link (services/vm/guest_link.c).
 * Every wait is bounded (TAGENT_WAIT_MS) so a broken agent fails a test
 * instead of hanging it; no test asserts how long anything took.
 */
#ifndef MOAT_TESTS_AGENT_CLIENT_H
#define MOAT_TESTS_AGENT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "guest.pb-c.h"
#include "moat/frame.h"

#define TAGENT_WAIT_MS 60000

struct tagent {
	pid_t pid;
	char dir[128]; /* mkdtemp; removed by tagent_stop */
	char sock[256];
	char root[256]; /* --root, made inside dir */
	int fd;         /* connection, -1 if none */
	struct moat_frame_reader reader;
	uint64_t next_id;
	Moat__V1__AgentReady *ready; /* from the last connect */
};

/* tagent_start: makes dir (and dir/root), spawns moat-agent with
 * --listen unix:dir/sock --root dir/root plus `extra` (NULL-terminated,
 * may be NULL), connects and reads AgentReady. `no_root`: leave --root
 * out. Returns 0 or -1. */
int tagent_start(struct tagent *t, const char *const *extra, bool no_root);

/* tagent_connect: (re)connects and reads AgentReady into t->ready. */
int tagent_connect(struct tagent *t);

/* tagent_disconnect: closes the connection. */
void tagent_disconnect(struct tagent *t);

/* tagent_stop: SIGTERMs the agent (SIGKILL if it lingers), reaps it,
 * removes dir. Returns the agent's wait status. */
int tagent_stop(struct tagent *t);

/* tagent_send: sends req; sets req->id from next_id when it is 0.
 * Returns 0 or -1. */
int tagent_send(struct tagent *t, Moat__V1__GuestRequest *req);

/* tagent_send_raw: sends bytes as they are. */
int tagent_send_raw(struct tagent *t, const void *data, size_t len);

/* tagent_recv_frame: the next frame body (heap, caller frees), or NULL
 * on EOF, error or TAGENT_WAIT_MS without one. */
uint8_t *tagent_recv_frame(struct tagent *t, size_t *len);

/* tagent_recv: the next message (caller frees with
 * moat__v1__guest_message__free_unpacked), or NULL. */
Moat__V1__GuestMessage *tagent_recv(struct tagent *t);

/* tagent_call: sends req and returns the message answering its id,
 * failing the test on any other message first. NULL on failure. */
Moat__V1__GuestMessage *tagent_call(struct tagent *t,
    Moat__V1__GuestRequest *req);

/* Result of an exec run to its end. */
struct texec {
	int code;      /* of the ExecStart reply */
	char *message; /* its error text, heap, or NULL */
	int pid;
	uint8_t *out[2]; /* stdout, stderr kept by the agent; heap */
	size_t len[2];
	size_t max_chunk;         /* biggest ExecOutput data seen */
	Moat__V1__ExecExit *exit; /* heap (free_unpacked via texec_free) */
	Moat__V1__GuestMessage *exit_msg;
};

/* tagent_exec: runs es as request `id` (0: next id) until ExecExit. */
int tagent_exec(struct tagent *t, Moat__V1__ExecStart *es, uint64_t id,
    struct texec *res);

/* tagent_exec_wait: collects events of exec `id` until its ExecExit. */
int tagent_exec_wait(struct tagent *t, uint64_t id, struct texec *res);

void texec_free(struct texec *res);

/* tagent_path: dir/root + guest path, in a static buffer. */
const char *tagent_host_path(struct tagent *t, const char *guest_path);

/* tagent_wait_group_gone: polls kill(-pgid, 0) until ESRCH, at most
 * TAGENT_WAIT_MS. Returns true when the group is gone. */
bool tagent_wait_group_gone(pid_t pgid);

#endif
