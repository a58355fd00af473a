/*
 * agent.h: what the files of moat-agent share: the agent's state (the
 * host link, the exec table, the root it confines paths to, the overlay
 * dirs it traces) and the functions one file calls in another. The agent
 * is one single-threaded poll() loop (loop.c); handlers run to completion
 * and answer through agent_send. Not for: the PID 1 boot (boot.h), or
 * anything another program includes.
 */
#ifndef MOAT_AGENT_AGENT_H
#define MOAT_AGENT_AGENT_H

#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "guest.pb-c.h"
#include "moat/frame.h"

#define AGENT_EXEC_MAX 64           /* running execs at once */
#define AGENT_CODE_MAX 16           /* code contexts at once */
#define AGENT_CHUNK (64u << 10)     /* one ExecOutput's data, at most */
#define AGENT_OUTPUT_CAP (1u << 20) /* default per-stream output_cap */
#define AGENT_STDIN_MAX (1u << 20)  /* stdin bytes queued per exec */
#define AGENT_OUT_HIGH (4u << 20)   /* host-bound queue: stop reading */
#define AGENT_DRAIN_IDLE_MS 100     /* pipes after the main pid exits */
#define AGENT_DRAIN_MAX_MS 2000     /* ... and no longer than this */
#define AGENT_LIST_MAX 10000        /* entries of one file_list */
#define AGENT_TRACE_MAX 10000       /* default fs_trace entries */
#define AGENT_TRACE_HARD_MAX 100000 /* most fs_trace entries asked */
#define AGENT_ARCHIVE_MAX 4         /* archive transfers open at once */
#define AGENT_ARCHIVE_IDLE_MS (5 * 60 * 1000)
#define AGENT_ARCHIVE_DEFAULT_MAX (2048ull << 20)
#define AGENT_ARCHIVE_DIR "/var/lib/moat-archive" /* staging, PID 1 */
/* Room left in a frame for the fields around a list's entries. */
#define AGENT_REPLY_BUDGET (MOAT_FRAME_MAX - (64u << 10))

enum agent_link_kind {
	AGENT_LINK_UNIX,  /* host mode: --listen unix:PATH */
	AGENT_LINK_PORT,  /* PID 1: a virtio-serial character device */
	AGENT_LINK_VSOCK, /* PID 1 under Firecracker: AF_VSOCK listener */
};

struct agent_out;  /* one encoded frame waiting to go (link.c) */
struct agent_code; /* one code context (code.c) */

/* The host link. At most one host is served at a time; `fd` is -1 while
 * none is. Everything queued for a host is dropped when it goes. */
struct agent_link {
	enum agent_link_kind kind;
	char path[PATH_MAX]; /* unix socket or port device */
	uint32_t vsock_port;
	int listen_fd;        /* listening socket, or the open port */
	int fd;               /* the connected host, -1 if none (a
	         * port: listen_fd while a host is on) */
	uint64_t retry_at_ms; /* port: when to look for a host again */
	struct moat_frame_reader reader;
	struct agent_out *out_head, *out_tail;
	size_t out_bytes; /* bytes queued, not yet written */
	bool muted;       /* test mode "oversize": say nothing more */
	bool flooding;    /* test mode "flood" */
};

/* One exec, from ExecStart until its ExecExit is sent. */
struct agent_exec {
	uint64_t id;        /* the ExecStart request id */
	pid_t pid;          /* main process, and its process group */
	int stdin_fd;       /* -1 once closed */
	int out_fd[2];      /* stdout, stderr; -1 once closed */
	int tty_fd;         /* pty master for ExecResize; -1: no pty */
	uint8_t *stdin_buf; /* pending stdin, owned */
	size_t stdin_len, stdin_off;
	bool stdin_close;  /* close once the pending bytes are out */
	uint64_t cap;      /* per stream */
	uint64_t bytes[2]; /* produced */
	uint64_t kept[2];  /* sent to the host */
	bool truncated[2];
	uint64_t start_us;    /* monotonic */
	uint64_t deadline_ms; /* timeout, 0 if none */
	bool exited;          /* main pid reaped */
	int wait_status;
	bool timed_out;
	uint64_t exit_us;       /* monotonic, when reaped */
	uint64_t drain_idle_ms; /* close the pipes at this time ... */
	uint64_t drain_max_ms;  /* ... or this, whichever is first */
};

struct agent {
	bool pid1;
	bool stopping; /* shutdown asked: flush, then go */
	bool stop_reboot;
	uint64_t stop_by_ms; /* give up flushing at this time */
	struct agent_link link;
	int sig_fd;             /* signalfd: SIGCHLD (+ TERM/INT on host) */
	int root_fd;            /* every request path resolves in here */
	bool confined;          /* --root given: root_fd is not "/" */
	bool no_openat2;        /* resolve by hand (kernel or test) */
	int lower_fd, upper_fd; /* overlay dirs for fs_trace, or -1 */
	char test_mode[32];
	uint64_t boot_ms; /* for AgentReady */
	char kernel[128]; /* uname -r */
	struct agent_exec *execs[AGENT_EXEC_MAX];
	struct agent_code *code[AGENT_CODE_MAX];
};

/* --- guest egress (egress.c, issue 14) --- */
#define AGENT_EGRESS_ADDR "127.0.0.1:3128"

/* agent_egress_on: the proxy runs; execs get http(s)_proxy set. */
extern bool agent_egress_on;

/* agent_egress_set: on: (re)starts the proxy process: it listens on
 * AGENT_EGRESS_ADDR and carries each connection to vmd over the
 * virtio-serial port org.moat.egress (moat/tunnel.h); off: ends it.
 * Host mode changes nothing. Returns a status with *why (heap). */
int agent_egress_set(struct agent *a, uint64_t id, bool on, char **why);
/* agent_egress_reaped: PID 1 reaped `pid`: egress is off if it was the
 * proxy process. */
void agent_egress_reaped(pid_t pid, int status);
/* agent_egress_mode: the EgressMode request. */
int agent_egress_mode(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);

/* --- image environment defaults (envfile.c, issue 17) --- */
struct agent_env {
	char *buf;   /* the file's bytes, split in place */
	char **vars; /* KEY=value, into buf */
	size_t n;
};

/* agent_env_image: the image's /etc/moat/env (none in host mode without
 * --root, or when the file is missing). Free with agent_env_free. */
int agent_env_image(struct agent *a, struct agent_env *e);
void agent_env_free(struct agent_env *e);
/* agent_env_layers: one NULL-terminated environment (heap array of
 * borrowed strings) from n_layers lists of KEY=value, lowest priority
 * first: an entry is left out when a later layer sets its key. */
char **agent_env_layers(const char *const *const *layers, const size_t *n,
    size_t n_layers);

/* --- time (loop.c) --- */
uint64_t agent_now_ms(void);
uint64_t agent_now_us(void);

/* --- sending (link.c) --- */

/* agent_send: encodes msg into a frame and queues it for the host. Does
 * not take msg. With no host connected the message is dropped (0).
 * Returns 0, or a status when msg cannot be encoded (too big for a
 * frame, or out of memory). */
int agent_send(struct agent *a, const Moat__V1__GuestMessage *msg);

/* agent_send_error: an error reply with id, code and a printf message. */
void agent_send_error(struct agent *a, uint64_t id, int code, const char *fmt,
    ...) __attribute__((format(printf, 4, 5)));

/* agent_send_ack: an OK reply with an Empty body. */
void agent_send_ack(struct agent *a, uint64_t id);

/* --- the host link (link.c) --- */

/* agent_link_listen: prepares the link (binds the unix or vsock socket;
 * a port is opened by the loop). Returns 0 or an errno value, logged. */
int agent_link_listen(struct agent *a);

/* agent_link_pollfds: adds the link's fds to pfd (at most 2), returns
 * how many; `paused`: the queue is full, do not ask for input. */
int agent_link_pollfds(struct agent *a, struct pollfd *pfd, bool paused);

/* agent_link_events: handles what poll said about the link's fds (the
 * ones agent_link_pollfds added, in order). Requests it reads go to
 * agent_dispatch. */
void agent_link_events(struct agent *a, const struct pollfd *pfd, int n);

/* agent_link_timer: does the link's due timed work (reopening a port)
 * and returns ms until it needs the loop again, or -1. */
int agent_link_timer(struct agent *a, uint64_t now);

/* agent_link_flush: writes what is queued, waiting at most until
 * deadline_ms; for shutdown. */
void agent_link_flush(struct agent *a, uint64_t deadline_ms);

/* agent_link_close: drops the current host, if any, and all it had
 * queued. */
void agent_link_close(struct agent *a, const char *why);

/* agent_link_queue_raw: queues bytes as they are (no frame header);
 * test modes only. Copies data. Returns 0 or a status. */
int agent_link_queue_raw(struct agent *a, const void *data, size_t len);

/* --- test modes (testmode.c) --- */

/* agent_test_mode_valid: whether name is a known test mode ("" is). */
bool agent_test_mode_valid(const char *name);

/* agent_test_mode_start: misbehaves as the mode says, right after
 * AgentReady on a new host connection. */
void agent_test_mode_start(struct agent *a);

/* agent_test_flood_refill: queues more flood frames while the queue is
 * below its high mark. */
void agent_test_flood_refill(struct agent *a);

/* --- requests (loop.c) --- */

/* agent_run: the poll loop; returns once a shutdown was asked for and
 * its reply is out (or could not be sent), or with an errno value when
 * the loop itself cannot go on (poll failing). */
int agent_run(struct agent *a);

/* agent_dispatch: decodes one frame body from the host, validates it and
 * runs its handler; every failure becomes an error reply. Takes nothing. */
void agent_dispatch(struct agent *a, const uint8_t *body, size_t len);

/* A handler answers through agent_send itself and returns 0, or returns
 * a status with *why (heap, or NULL for a generic text), which the
 * dispatcher sends as the error reply. */
typedef int (*agent_handler_fn)(struct agent *a,
    const Moat__V1__GuestRequest *req, char **why);

/* --- exec (exec.c) --- */
int agent_exec_start(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_exec_input(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
/* agent_exec_resize: a pty exec's new window size (TIOCSWINSZ). */
int agent_exec_resize(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_exec_signal(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);

/* agent_exec_pollfds: the pipes of every exec; `paused`: do not read
 * output (the host queue is full). Returns how many were added; map[i]
 * says which exec and stream (0 stdin, 1 stdout, 2 stderr) pfd[i] is. */
int agent_exec_pollfds(struct agent *a, struct pollfd *pfd, int *map,
    bool paused);

/* agent_exec_events: handles poll's answer for what agent_exec_pollfds
 * added. */
void agent_exec_events(struct agent *a, const struct pollfd *pfd,
    const int *map, int n);

/* agent_exec_reap: waits for every child that exited (as PID 1 also
 * orphans) and finishes the execs whose main process it was. */
void agent_exec_reap(struct agent *a);

/* agent_exec_timer: kills execs past their timeout, closes pipes past
 * their drain time. Returns ms until the next such time, or -1. */
int agent_exec_timer(struct agent *a, uint64_t now);

/* agent_exec_kill_all: SIGKILLs every exec's process group (host-mode
 * exit). */
void agent_exec_kill_all(struct agent *a);

/* agent_exec_drop_all: the host that started the execs is gone: kills
 * their process groups and forgets them without sending anything (exec
 * ids belong to one host link; a new host starts numbering again). */
void agent_exec_drop_all(struct agent *a);

/* --- code contexts (code.c) --- */

/* agent_code_run: CodeRun; starts the context when it is not there and
 * hands it the cell. Answered later with a CodeResult (or an error when
 * python3 cannot start). Returns 0, or a status with *why (heap). */
int agent_code_run(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);

/* agent_code_close: code_context_close; kills the context (a run in
 * flight is answered with ContextDied first) and acks. */
int agent_code_close(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);

/* agent_code_pollfds: every context's pipes (at most 4 each); map[i] is
 * slot * 4 + which. Returns how many were added. */
int agent_code_pollfds(struct agent *a, struct pollfd *pfd, int *map);

/* agent_code_events: handles poll's answer for agent_code_pollfds. */
void agent_code_events(struct agent *a, const struct pollfd *pfd,
    const int *map, int n);

/* agent_code_reaped: a child the exec table did not know exited; if it
 * was a context's interpreter, answers its run and forgets it. Returns
 * whether it was one. */
bool agent_code_reaped(struct agent *a, pid_t pid, int status);

/* agent_code_timer: interrupts cells past their timeout, kills the ones
 * that ignore it. Returns ms until the next such time, or -1. */
int agent_code_timer(struct agent *a, uint64_t now);

/* agent_code_drop_host: the host went: runs in flight finish unanswered
 * (the contexts stay). */
void agent_code_drop_host(struct agent *a);

/* agent_code_reseed: after a restore into a new sandbox (the reset's
 * `reseed`), every idle context runs a hidden cell (no output, counted
 * nowhere) that reseeds its language's global random generators from
 * the kernel's pool; waits for them (at most 5 s in all). Failures are
 * logged, never fatal. Returns how many contexts were reseeded. */
unsigned agent_code_reseed(struct agent *a, uint64_t id);

/* agent_code_kill_all: SIGKILLs every context's group (agent exit). */
void agent_code_kill_all(struct agent *a);

/* --- paths (path.c) --- */

/* agent_path_clean: checks a request path (absolute, no NUL, not too
 * long, not under /proc, /sys or /dev unless `any_place`) and writes its
 * lexically cleaned form ("//a/./b/../c" -> "/a/c") to out (PATH_MAX).
 * Returns 0, or a status with *why (heap). */
int agent_path_clean(const char *path, bool any_place, char *out, char **why);

/* agent_path_open: opens a cleaned path inside the agent's root; symlinks
 * (the last one too, unless flags has O_NOFOLLOW) resolve inside it and
 * can never leave it. O_CLOEXEC is added. Returns an fd or -errno; an
 * object on /proc, /sys, /dev (or their kin) gives -EPERM. */
int agent_path_open(struct agent *a, const char *clean, int flags,
    mode_t mode);

/* agent_path_parent: opens the directory holding a cleaned path
 * (O_PATH) and points *name into clean at the last component. "/" has
 * no parent: -EINVAL. Returns an fd or -errno. */
int agent_path_parent(struct agent *a, const char *clean, const char **name);

/* agent_path_mkdirs: creates a cleaned directory path and its missing
 * parents inside the root (mode for the ones it makes). 0 or -errno. */
int agent_path_mkdirs(struct agent *a, const char *clean, mode_t mode);

/* agent_path_fd_allowed: 0 if the open object is one the agent may
 * touch, -EPERM if it is on /proc, /sys, /dev or their kin. */
int agent_path_fd_allowed(struct agent *a, int fd);

/* agent_path_error: turns -errno from an operation on `path` into a
 * status and *why (heap) a person can act on. */
int agent_path_error(int neg_errno, const char *path, const char *doing,
    char **why);

/* --- files (files.c) --- */
int agent_file_read(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_file_write(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_file_list(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_file_stat(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_file_remove(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_file_mkdir(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);

/* agent_file_type: FileType of a st_mode. */
Moat__V1__FileType agent_file_type(mode_t mode);

/* --- directories as tar archives (archive.c, issue 17) --- */
int agent_archive_put(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
int agent_archive_get(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);
/* agent_archive_timer: drops transfers idle AGENT_ARCHIVE_IDLE_MS;
 * returns ms until the next could be, or -1. */
int agent_archive_timer(struct agent *a, uint64_t now);

/* --- info, fs trace --- */
int agent_info(struct agent *a, const Moat__V1__GuestRequest *req, char **why);
int agent_fs_trace(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);

/* clock.c: `reset` after a restore or clone (clock, RNG, hostname). */
int agent_reset_after_restore(struct agent *a,
    const Moat__V1__GuestRequest *req, char **why);

#endif
