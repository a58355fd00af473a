/*
 * exec.c: running processes for the host. ExecStart forks a child in its
 * own session and process group, with a clean environment, a working
 * directory and three pipes; the loop then streams its output as
 * ExecOutput events (at most AGENT_CHUNK bytes each, up to a per-stream
 * cap, counting what is dropped past it), feeds its stdin, kills its whole
 * group on timeout or on request, and sends one ExecExit when it is over.
 * Not for: the loop (loop.c) or the link (link.c).
 *
 * When an exec is over: its main process has exited and both output pipes
 * are closed. A background process (`sleep 1000 &`) keeps the pipes open
 * after the main process exits; the agent does not wait for it: it reads
 * on until the pipes are quiet for AGENT_DRAIN_IDLE_MS (or for at most
 * AGENT_DRAIN_MAX_MS), then takes what is left in them and closes them.
 * The background process keeps running, in the exec's process group.
 *
 * With `pty` the child gets a pseudo-terminal instead of pipes: a new
 * session whose controlling terminal is the pty's slave (on 0, 1, 2),
 * TERM and a window size; the master is its stdout stream (stderr stays
 * empty) and takes its stdin, so a Ctrl-D byte reaches the line
 * discipline. The slave is opened before fork and held by the agent
 * until the child has it, so the master never reads EIO (no slave open)
 * before the child starts; after the child and whatever it started have
 * closed the slave, EIO on the master is the end of the output.
 *
 * Exec ids are the host's request ids, so they mean something only on the
 * link that started them: when that host goes away its running execs are
 * killed (their whole groups) and forgotten without events, so a new host
 * never sees events for ids it did not send. Background processes of
 * execs that were already over are left alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define EXEC_DEFAULT_CWD "/root"
/* Per stream, when the pipes are closed: what the main process left in a
 * pipe is at most its size (1 MiB at most by default); anything more is
 * a background process still writing. */
#define EXEC_FINAL_DRAIN_MAX (1u << 20)
#define EXEC_PAUSED_RETRY_MS 10
/* A pty's window when the host names none, and the most it may be. */
#define EXEC_PTY_ROWS 24
#define EXEC_PTY_COLS 80
#define EXEC_PTY_MAX 1000
#define EXEC_PTY_TERM "xterm-256color"

extern char **environ;

static const char *const exec_default_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
	"TERM=dumb",
};
#define EXEC_DEFAULT_ENV_N                                                    \
	(sizeof(exec_default_env) / sizeof(exec_default_env[0]))

/* With guest egress on (egress.c), every exec finds the proxy. */
static const char *const exec_egress_env[] = {
	"http_proxy=http://" AGENT_EGRESS_ADDR,
	"https_proxy=http://" AGENT_EGRESS_ADDR,
	"HTTP_PROXY=http://" AGENT_EGRESS_ADDR,
	"HTTPS_PROXY=http://" AGENT_EGRESS_ADDR,
	"no_proxy=localhost,127.0.0.1,::1",
	"NO_PROXY=localhost,127.0.0.1,::1",
};
#define EXEC_EGRESS_ENV_N                                                     \
	(sizeof(exec_egress_env) / sizeof(exec_egress_env[0]))

/* What the child needs, prepared before fork so the child only calls
 * async-signal-safe functions (and, on the way out, dprintf). */
struct exec_plan {
	char **argv; /* NULL-terminated; strings borrowed from the req */
	char **envp; /* likewise */
	int cwd_fd;  /* O_PATH directory */
	int pipe_in[2], pipe_out[2], pipe_err[2];
	int pty_master, pty_slave;  /* -1 without pty */
	char term_env[80];          /* "TERM=..." with pty */
	struct agent_env image_env; /* envp borrows from it */
};

static struct agent_exec *
exec_find(struct agent *a, uint64_t id)
{
	int i;

	for (i = 0; i < AGENT_EXEC_MAX; i++)
		if (a->execs[i] != NULL && a->execs[i]->id == id)
			return a->execs[i];
	return NULL;
}

/* exec_kill: signals the exec's process group. Right after fork the
 * child may not have called setsid() yet, so there is no such group: the
 * main process (not reaped, so its pid cannot have been reused) gets the
 * signal then, and a blocked one waits for the child to unblock it. */
static int
exec_kill(const struct agent_exec *e, int sig)
{
	if (kill(-e->pid, sig) == 0)
		return 0;
	if (errno == ESRCH && !e->exited)
		return kill(e->pid, sig) == 0 || errno == ESRCH ? 0 : errno;
	return errno == ESRCH ? 0 : errno;
}

static void
exec_close(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

static void
exec_plan_fini(struct exec_plan *p)
{
	free(p->argv);
	free(p->envp);
	agent_env_free(&p->image_env);
	exec_close(&p->cwd_fd);
	exec_close(&p->pipe_in[0]);
	exec_close(&p->pipe_in[1]);
	exec_close(&p->pipe_out[0]);
	exec_close(&p->pipe_out[1]);
	exec_close(&p->pipe_err[0]);
	exec_close(&p->pipe_err[1]);
	exec_close(&p->pty_master);
	exec_close(&p->pty_slave);
}

static bool
exec_env_key_is(const char *entry, const char *other)
{
	size_t k = strcspn(entry, "=");

	return strncmp(entry, other, k) == 0 && other[k] == '=';
}

/* exec_plan_env: the environment, each layer's entries replacing the
 * same keys of the layers before: the defaults, the image's
 * (/etc/moat/env), the egress proxy's when it is on, the request's. */
static int
exec_plan_env(struct agent *a, const Moat__V1__ExecStart *es,
    struct exec_plan *p, char **why)
{
	const char *defaults[EXEC_DEFAULT_ENV_N];
	const char *const *layers[4];
	size_t n[4], i;
	int rv;

	for (i = 0; i < es->n_env; i++) {
		const char *eq = strchr(es->env[i], '=');

		if (eq == NULL || eq == es->env[i]) {
			*why = moat_asprintf("env entry %zu (\"%.40s\") is "
			                     "not KEY=VALUE",
			    i, es->env[i]);
			return MOAT_INVALID_ARGUMENT;
		}
	}
	if ((rv = agent_env_image(a, &p->image_env)) != MOAT_OK)
		return rv;
	for (i = 0; i < EXEC_DEFAULT_ENV_N; i++)
		defaults[i] =
		    es->pty && exec_env_key_is(exec_default_env[i], "TERM=") ?
		    p->term_env :
		    exec_default_env[i];
	layers[0] = defaults;
	n[0] = EXEC_DEFAULT_ENV_N;
	layers[1] = (const char *const *)p->image_env.vars;
	n[1] = p->image_env.n;
	layers[2] = exec_egress_env;
	n[2] = agent_egress_on ? EXEC_EGRESS_ENV_N : 0;
	layers[3] = (const char *const *)es->env;
	n[3] = es->n_env;
	if ((p->envp = agent_env_layers(layers, n, 4)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	return MOAT_OK;
}

static int
exec_plan_argv(const Moat__V1__ExecStart *es, struct exec_plan *p, char **why)
{
	size_t i;

	if ((es->n_argv > 0) == (es->shell[0] != '\0')) {
		*why = strdup(es->n_argv > 0 ?
		        "set argv or shell, not both" :
		        "nothing to run: set argv or shell");
		return MOAT_INVALID_ARGUMENT;
	}
	if (es->n_argv > 0 && es->argv[0][0] == '\0') {
		*why = strdup("argv[0] is empty");
		return MOAT_INVALID_ARGUMENT;
	}
	p->argv = calloc(es->n_argv > 0 ? es->n_argv + 1 : 4, sizeof(char *));
	if (p->argv == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if (es->n_argv == 0) {
		p->argv[0] = (char *)"/bin/sh";
		p->argv[1] = (char *)"-c";
		p->argv[2] = es->shell;
		return MOAT_OK;
	}
	for (i = 0; i < es->n_argv; i++)
		p->argv[i] = es->argv[i];
	return MOAT_OK;
}

/* exec_plan_cwd: opens the working directory inside the agent's root,
 * making it (0755) when it is missing. */
static int
exec_plan_cwd(struct agent *a, const Moat__V1__ExecStart *es,
    struct exec_plan *p, char **why)
{
	const char *want = es->cwd[0] ? es->cwd : EXEC_DEFAULT_CWD;
	char clean[PATH_MAX];
	int rv, fd;

	if ((rv = agent_path_clean(want, true, clean, why)) != 0)
		return rv;
	fd = agent_path_open(a, clean, O_PATH | O_DIRECTORY, 0);
	if (fd == -ENOENT) {
		if ((rv = agent_path_mkdirs(a, clean, 0755)) != 0)
			return agent_path_error(rv, clean, "make cwd", why);
		fd = agent_path_open(a, clean, O_PATH | O_DIRECTORY, 0);
	}
	if (fd < 0)
		return agent_path_error(fd, clean, "use as cwd", why);
	p->cwd_fd = fd;
	return MOAT_OK;
}

static int
exec_plan_pipes(struct exec_plan *p, char **why)
{
	if (pipe2(p->pipe_in, O_CLOEXEC) != 0 ||
	    pipe2(p->pipe_out, O_CLOEXEC) != 0 ||
	    pipe2(p->pipe_err, O_CLOEXEC) != 0) {
		*why = moat_asprintf("pipe: %s", strerror(errno));
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (fcntl(p->pipe_in[1], F_SETFL, O_NONBLOCK) != 0 ||
	    fcntl(p->pipe_out[0], F_SETFL, O_NONBLOCK) != 0 ||
	    fcntl(p->pipe_err[0], F_SETFL, O_NONBLOCK) != 0) {
		*why = moat_asprintf("pipe flags: %s", strerror(errno));
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* exec_winsize_check: a window size the host asked for; 0 means the
 * default when `dflt`, else it is refused. */
static int
exec_winsize_check(uint32_t rows, uint32_t cols, bool dflt, struct winsize *ws,
    char **why)
{
	if ((!dflt && (rows == 0 || cols == 0)) || rows > EXEC_PTY_MAX ||
	    cols > EXEC_PTY_MAX) {
		*why =
		    moat_asprintf("terminal size %ux%u (rows x cols) is out "
		                  "of range: give 1 to %d each",
		        rows, cols, EXEC_PTY_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	memset(ws, 0, sizeof(*ws));
	ws->ws_row = (unsigned short)(rows ? rows : EXEC_PTY_ROWS);
	ws->ws_col = (unsigned short)(cols ? cols : EXEC_PTY_COLS);
	return MOAT_OK;
}

/* exec_plan_pty: a pseudo-terminal of the asked size and TERM. */
static int
exec_plan_pty(const Moat__V1__ExecStart *es, struct exec_plan *p, char **why)
{
	const char *term = es->term[0] ? es->term : EXEC_PTY_TERM;
	struct winsize ws;
	const char *name;
	int rv;

	if ((rv = exec_winsize_check(es->rows, es->cols, true, &ws, why)) != 0)
		return rv;
	if (strlen(term) > sizeof(p->term_env) - 6 ||
	    term[strcspn(term, "= \t\n\r")] != '\0') {
		*why = moat_asprintf("term \"%.40s\" is not a terminal type "
		                     "(like xterm-256color)",
		    term);
		return MOAT_INVALID_ARGUMENT;
	}
	snprintf(p->term_env, sizeof(p->term_env), "TERM=%s", term);
	if ((p->pty_master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC)) <
	        0 ||
	    grantpt(p->pty_master) != 0 || unlockpt(p->pty_master) != 0 ||
	    (name = ptsname(p->pty_master)) == NULL ||
	    (p->pty_slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) {
		*why = moat_asprintf("no pseudo-terminal: %s (is devpts "
		                     "mounted on /dev/pts?)",
		    strerror(errno));
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (ioctl(p->pty_master, TIOCSWINSZ, &ws) != 0 ||
	    fcntl(p->pty_master, F_SETFL, O_NONBLOCK) != 0) {
		*why = moat_asprintf("pty setup: %s", strerror(errno));
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* exec_child: in the forked child; never returns. Fds 0-2 of the agent
 * are always open, so the pipe ends are >= 3 and dup2 cannot clobber
 * one with another. */
static void __attribute__((noreturn)) exec_child(const struct exec_plan *p)
{
	sigset_t none;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	setsid();
	if (p->pty_slave >= 0) {
		if (ioctl(p->pty_slave, TIOCSCTTY, 0) != 0 ||
		    dup2(p->pty_slave, 0) < 0 || dup2(p->pty_slave, 1) < 0 ||
		    dup2(p->pty_slave, 2) < 0)
			_exit(127);
	} else if (dup2(p->pipe_in[0], 0) < 0 || dup2(p->pipe_out[1], 1) < 0 ||
	    dup2(p->pipe_err[1], 2) < 0) {
		_exit(127);
	}
	if (fchdir(p->cwd_fd) != 0) {
		dprintf(2,
		    "moat-agent: cannot enter the working directory: "
		    "%s\n",
		    strerror(errno));
		_exit(127);
	}
	umask(022);
	environ = p->envp;
	execvp(p->argv[0], p->argv);
	dprintf(2, "moat-agent: cannot run %s: %s\n", p->argv[0],
	    strerror(errno));
	_exit(127);
}

static int
exec_count(const struct agent *a, int *free_slot)
{
	int i, n = 0;

	*free_slot = -1;
	for (i = 0; i < AGENT_EXEC_MAX; i++) {
		if (a->execs[i] != NULL)
			n++;
		else if (*free_slot < 0)
			*free_slot = i;
	}
	return n;
}

int
agent_exec_start(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__ExecStart *es = req->exec_start;
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecStarted started = MOAT__V1__EXEC_STARTED__INIT;
	struct exec_plan p = { .cwd_fd = -1,
		.pipe_in = { -1, -1 },
		.pipe_out = { -1, -1 },
		.pipe_err = { -1, -1 },
		.pty_master = -1,
		.pty_slave = -1 };
	struct agent_exec *e = NULL;
	int rv, slot;
	pid_t pid;

	if (exec_find(a, req->id) != NULL) {
		*why = moat_asprintf("exec %llu is still running; use a new "
		                     "request id",
		    (unsigned long long)req->id);
		return MOAT_ALREADY_EXISTS;
	}
	if (exec_count(a, &slot) >= AGENT_EXEC_MAX) {
		*why = moat_asprintf(
		    "%d execs are running, the most the "
		    "agent runs at once; wait for one or kill one",
		    AGENT_EXEC_MAX);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = exec_plan_argv(es, &p, why)) != 0 ||
	    (rv = exec_plan_env(a, es, &p, why)) != 0 ||
	    (rv = exec_plan_cwd(a, es, &p, why)) != 0 ||
	    (rv = es->pty ? exec_plan_pty(es, &p, why) :
	                    exec_plan_pipes(&p, why)) != 0)
		goto fail_plan;
	if ((e = calloc(1, sizeof(*e))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail_plan;
	}
	if (es->stdin.len > 0 &&
	    (e->stdin_buf = malloc(es->stdin.len)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail_exec;
	}
	e->start_us = agent_now_us();
	if ((pid = fork()) < 0) {
		*why = moat_asprintf("fork: %s", strerror(errno));
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail_exec;
	}
	if (pid == 0)
		exec_child(&p);

	e->id = req->id;
	e->pid = pid;
	e->cap = es->output_cap ? es->output_cap : AGENT_OUTPUT_CAP;
	e->deadline_ms =
	    es->timeout_ms ? e->start_us / 1000 + es->timeout_ms : 0;
	e->tty_fd = -1;
	if (p.pty_master >= 0) {
		/* One master, three uses that close at different times:
		 * stdin when the main process is reaped, output at EIO, the
		 * terminal (resize) when the exec is over. */
		e->stdin_fd = fcntl(p.pty_master, F_DUPFD_CLOEXEC, 3);
		e->out_fd[0] = fcntl(p.pty_master, F_DUPFD_CLOEXEC, 3);
		e->out_fd[1] = -1;
		e->tty_fd = p.pty_master;
		p.pty_master = -1;
	} else {
		e->stdin_fd = p.pipe_in[1];
		e->out_fd[0] = p.pipe_out[0];
		e->out_fd[1] = p.pipe_err[0];
		p.pipe_in[1] = p.pipe_out[0] = p.pipe_err[0] = -1;
	}
	if (es->stdin.len > 0)
		memcpy(e->stdin_buf, es->stdin.data, es->stdin.len);
	e->stdin_len = es->stdin.len;
	/* A terminal's stdin stays open: its end is a Ctrl-D. */
	e->stdin_close = es->stdin_close && !es->pty;
	if (e->stdin_len == 0 && e->stdin_close)
		exec_close(&e->stdin_fd);
	a->execs[slot] = e;
	exec_plan_fini(&p);

	m.id = req->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_STARTED;
	m.exec_started = &started;
	started.pid = pid;
	(void)agent_send(a, &m);
	moat_debug(req->id, "exec started: pid %d", (int)pid);
	return MOAT_OK;

fail_exec:
	free(e->stdin_buf);
	free(e);
fail_plan:
	exec_plan_fini(&p);
	return rv;
}

int
agent_exec_input(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__ExecInput *in = req->exec_input;
	struct agent_exec *e = exec_find(a, in->exec_id);
	size_t pending;
	uint8_t *nb;

	if (e == NULL) {
		*why = moat_asprintf("no exec with id %llu (it exited, or "
		                     "was never started)",
		    (unsigned long long)in->exec_id);
		return MOAT_NOT_FOUND;
	}
	if (e->stdin_fd < 0 || (e->stdin_close && in->data.len > 0)) {
		if (in->data.len == 0 && in->close)
			goto ack; /* closing twice is fine */
		*why = moat_asprintf("stdin of exec %llu is closed",
		    (unsigned long long)in->exec_id);
		return MOAT_FAILED_PRECONDITION;
	}
	pending = e->stdin_len - e->stdin_off;
	if (in->data.len > AGENT_STDIN_MAX ||
	    pending > AGENT_STDIN_MAX - in->data.len) {
		*why = moat_asprintf(
		    "exec %llu already has %zu bytes of "
		    "stdin waiting (at most %u); retry once it reads them",
		    (unsigned long long)in->exec_id, pending, AGENT_STDIN_MAX);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (in->data.len > 0) {
		if (e->stdin_off > 0) {
			memmove(e->stdin_buf, e->stdin_buf + e->stdin_off,
			    pending);
			e->stdin_off = 0;
			e->stdin_len = pending;
		}
		nb = realloc(e->stdin_buf, pending + in->data.len);
		if (nb == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		memcpy(nb + pending, in->data.data, in->data.len);
		e->stdin_buf = nb;
		e->stdin_len = pending + in->data.len;
	}
	if (in->close) {
		e->stdin_close = true;
		if (e->stdin_len == e->stdin_off)
			exec_close(&e->stdin_fd);
	}
ack:
	agent_send_ack(a, req->id);
	return MOAT_OK;
}

int
agent_exec_signal(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__ExecSignal *sig = req->exec_signal;
	struct agent_exec *e = exec_find(a, sig->exec_id);
	int rv;

	if (e == NULL) {
		*why = moat_asprintf("no exec with id %llu (it exited, or "
		                     "was never started)",
		    (unsigned long long)sig->exec_id);
		return MOAT_NOT_FOUND;
	}
	if (sig->signal <= 0 || sig->signal > SIGRTMAX) {
		*why = moat_asprintf("%d is not a signal number (1-%d; 9 is "
		                     "SIGKILL, 15 SIGTERM)",
		    sig->signal, SIGRTMAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((rv = exec_kill(e, sig->signal)) != 0) {
		*why = moat_asprintf("kill process group %d: %s", (int)e->pid,
		    strerror(rv));
		return moat_status_from_errno(rv);
	}
	agent_send_ack(a, req->id);
	return MOAT_OK;
}

int
agent_exec_resize(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__ExecWinsize *rs = req->exec_resize;
	struct agent_exec *e = exec_find(a, rs->exec_id);
	struct winsize ws;
	int rv;

	if (e == NULL) {
		*why = moat_asprintf("no exec with id %llu (it exited, or "
		                     "was never started)",
		    (unsigned long long)rs->exec_id);
		return MOAT_NOT_FOUND;
	}
	if (e->tty_fd < 0) {
		*why = moat_asprintf("exec %llu is not a terminal: start it "
		                     "with pty to resize it",
		    (unsigned long long)rs->exec_id);
		return MOAT_FAILED_PRECONDITION;
	}
	if ((rv = exec_winsize_check(rs->rows, rs->cols, false, &ws, why)) !=
	    0)
		return rv;
	/* The kernel sends SIGWINCH to the terminal's foreground group. */
	if (ioctl(e->tty_fd, TIOCSWINSZ, &ws) != 0) {
		*why = moat_asprintf("resize: %s", strerror(errno));
		return moat_status_from_errno(errno);
	}
	agent_send_ack(a, req->id);
	return MOAT_OK;
}

/* exec_output: counts n bytes of a stream and sends what fits under the
 * cap as one event. */
static void
exec_output(struct agent *a, struct agent_exec *e, int s, const uint8_t *buf,
    size_t n)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecOutput out = MOAT__V1__EXEC_OUTPUT__INIT;
	uint64_t room = e->cap - e->kept[s];
	size_t keep = n < room ? n : (size_t)room;

	e->bytes[s] += n;
	if (keep < n)
		e->truncated[s] = true;
	if (keep == 0)
		return;
	e->kept[s] += keep;
	m.id = e->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT;
	m.exec_output = &out;
	out.stream = s == 0 ? MOAT__V1__STREAM__STREAM_STDOUT :
	                      MOAT__V1__STREAM__STREAM_STDERR;
	out.data.data = (uint8_t *)buf;
	out.data.len = keep;
	(void)agent_send(a, &m);
}

/* exec_read: one read of a stream. Returns bytes read, 0 at EOF (the fd
 * is then closed), -1 when nothing is there now. */
static ssize_t
exec_read(struct agent *a, struct agent_exec *e, int s)
{
	static uint8_t chunk[AGENT_CHUNK];
	ssize_t n;

	do
		n = read(e->out_fd[s], chunk, sizeof(chunk));
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return -1;
	if (n <= 0) {
		exec_close(&e->out_fd[s]);
		return 0;
	}
	exec_output(a, e, s, chunk, (size_t)n);
	return n;
}

static void
exec_finish(struct agent *a, int slot)
{
	struct agent_exec *e = a->execs[slot];
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecExit ex = MOAT__V1__EXEC_EXIT__INIT;
	int st = e->wait_status;

	m.id = e->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT;
	m.exec_exit = &ex;
	ex.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	ex.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
	ex.timed_out = e->timed_out;
	ex.stdout_truncated = e->truncated[0];
	ex.stderr_truncated = e->truncated[1];
	ex.duration_us = e->exit_us - e->start_us;
	ex.stdout_bytes = e->bytes[0];
	ex.stderr_bytes = e->bytes[1];
	(void)agent_send(a, &m);
	moat_debug(e->id, "exec over: exit %d signal %d%s", ex.exit_code,
	    ex.signal, ex.timed_out ? " (timed out)" : "");
	exec_close(&e->stdin_fd);
	exec_close(&e->out_fd[0]);
	exec_close(&e->out_fd[1]);
	exec_close(&e->tty_fd);
	free(e->stdin_buf);
	free(e);
	a->execs[slot] = NULL;
}

static void
exec_maybe_finish(struct agent *a, int slot)
{
	struct agent_exec *e = a->execs[slot];

	if (e != NULL && e->exited && e->out_fd[0] < 0 && e->out_fd[1] < 0)
		exec_finish(a, slot);
}

/* exec_drain_close: the pipes had their time after the main process
 * exited: take what is in them now and close them. */
static void
exec_drain_close(struct agent *a, int slot)
{
	struct agent_exec *e = a->execs[slot];
	int s;

	for (s = 0; s < 2; s++) {
		size_t total = 0;
		ssize_t n;

		while (e->out_fd[s] >= 0 && total < EXEC_FINAL_DRAIN_MAX &&
		    (n = exec_read(a, e, s)) > 0)
			total += (size_t)n;
		exec_close(&e->out_fd[s]);
	}
	exec_finish(a, slot);
}

static void
exec_write_stdin(struct agent_exec *e)
{
	while (e->stdin_off < e->stdin_len) {
		ssize_t n = write(e->stdin_fd, e->stdin_buf + e->stdin_off,
		    e->stdin_len - e->stdin_off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			/* EPIPE: nobody reads stdin any more */
			e->stdin_off = e->stdin_len = 0;
			exec_close(&e->stdin_fd);
			return;
		}
		e->stdin_off += (size_t)n;
	}
	e->stdin_off = e->stdin_len = 0;
	free(e->stdin_buf);
	e->stdin_buf = NULL;
	if (e->stdin_close)
		exec_close(&e->stdin_fd);
}

int
agent_exec_pollfds(struct agent *a, struct pollfd *pfd, int *map, bool paused)
{
	int i, s, n = 0;

	for (i = 0; i < AGENT_EXEC_MAX; i++) {
		struct agent_exec *e = a->execs[i];

		if (e == NULL)
			continue;
		if (e->stdin_fd >= 0 && e->stdin_off < e->stdin_len) {
			pfd[n].fd = e->stdin_fd;
			pfd[n].events = POLLOUT;
			pfd[n].revents = 0;
			map[n++] = i * 3;
		}
		for (s = 0; s < 2; s++) {
			if (e->out_fd[s] < 0)
				continue;
			pfd[n].fd = e->out_fd[s];
			pfd[n].events = paused ? 0 : POLLIN;
			pfd[n].revents = 0;
			map[n++] = i * 3 + 1 + s;
		}
	}
	return n;
}

void
agent_exec_events(struct agent *a, const struct pollfd *pfd, const int *map,
    int n)
{
	int i;

	for (i = 0; i < n; i++) {
		int slot = map[i] / 3, what = map[i] % 3;
		struct agent_exec *e = a->execs[slot];

		if (pfd[i].revents == 0 || e == NULL)
			continue;
		if (what == 0) {
			if (pfd[i].fd != e->stdin_fd)
				continue;
			if (pfd[i].revents & POLLOUT)
				exec_write_stdin(e);
			else
				exec_close(&e->stdin_fd); /* POLLERR */
			continue;
		}
		if (pfd[i].fd != e->out_fd[what - 1])
			continue;
		if (exec_read(a, e, what - 1) > 0 && e->exited)
			e->drain_idle_ms =
			    agent_now_ms() + AGENT_DRAIN_IDLE_MS;
		exec_maybe_finish(a, slot);
	}
}

void
agent_exec_reap(struct agent *a)
{
	int st, i;
	pid_t pid;

	while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
		for (i = 0; i < AGENT_EXEC_MAX; i++) {
			struct agent_exec *e = a->execs[i];

			if (e == NULL || e->pid != pid || e->exited)
				continue;
			e->exited = true;
			e->wait_status = st;
			e->exit_us = agent_now_us();
			e->drain_idle_ms =
			    e->exit_us / 1000 + AGENT_DRAIN_IDLE_MS;
			e->drain_max_ms =
			    e->exit_us / 1000 + AGENT_DRAIN_MAX_MS;
			/* what it did not read, nobody will */
			exec_close(&e->stdin_fd);
			exec_maybe_finish(a, i);
			break;
		}
		/* not an exec's main process: a code context's interpreter,
		 * or an orphan PID 1 adopted */
		if (i == AGENT_EXEC_MAX && !agent_code_reaped(a, pid, st))
			agent_egress_reaped(pid, st);
	}
}

int
agent_exec_timer(struct agent *a, uint64_t now)
{
	int i, next = -1;

	for (i = 0; i < AGENT_EXEC_MAX; i++) {
		struct agent_exec *e = a->execs[i];
		uint64_t due;

		if (e == NULL)
			continue;
		if (!e->exited && e->deadline_ms != 0) {
			if (now >= e->deadline_ms) {
				moat_info(e->id,
				    "exec timed out: killing "
				    "process group %d",
				    (int)e->pid);
				(void)exec_kill(e, SIGKILL);
				e->timed_out = true;
				e->deadline_ms = 0;
				continue;
			}
			due = e->deadline_ms;
		} else if (e->exited) {
			due = e->drain_idle_ms < e->drain_max_ms ?
			    e->drain_idle_ms :
			    e->drain_max_ms;
			if (now >= due && a->link.fd >= 0 &&
			    a->link.out_bytes >= AGENT_OUT_HIGH) {
				/* the host is slow: what is left stays in
				 * the pipe until there is room for it */
				due = now + EXEC_PAUSED_RETRY_MS;
			} else if (now >= due) {
				exec_drain_close(a, i);
				continue;
			}
		} else {
			continue;
		}
		if (next < 0 || due - now < (uint64_t)next)
			next = (int)(due - now);
	}
	return next;
}

void
agent_exec_kill_all(struct agent *a)
{
	int i;

	for (i = 0; i < AGENT_EXEC_MAX; i++)
		if (a->execs[i] != NULL)
			(void)exec_kill(a->execs[i], SIGKILL);
}

void
agent_exec_drop_all(struct agent *a)
{
	int i;

	for (i = 0; i < AGENT_EXEC_MAX; i++) {
		struct agent_exec *e = a->execs[i];

		if (e == NULL)
			continue;
		(void)exec_kill(e, SIGKILL);
		exec_close(&e->stdin_fd);
		exec_close(&e->out_fd[0]);
		exec_close(&e->out_fd[1]);
		exec_close(&e->tty_fd);
		free(e->stdin_buf);
		free(e);
		a->execs[i] = NULL;
	}
}
