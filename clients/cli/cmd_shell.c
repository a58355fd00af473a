/*
 * cmd_shell.c: `moat shell SB [-- CMD...]`, an interactive terminal in a
 * sandbox. The command (default: a login shell, bash where the image has
 * it) runs under a pseudo-terminal in the guest (ExecStart with pty) of
 * our terminal's size; our terminal is put in raw mode, so every key
 * (Ctrl-C, Ctrl-D too) goes to the guest's line discipline as a byte.
 * One thread polls our stdin and a SIGWINCH self-pipe and sends
 * ExecWrite / ExecResize; the main thread long-polls ExecRead and writes
 * what comes to our stdout. It ends when the command exits, with its
 * exit code. The terminal is restored on every way out: the end, an
 * error, SIGTERM/SIGHUP (seen by the read loop), and atexit.
 * Not for: one-shot commands with pipes (`moat exec`, cmd_run.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "cli.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"

#define SHELL_USAGE "shell SANDBOX [-- CMD [ARG...]]"
/* The default command: a login shell, bash where the image has one
 * (busybox sh otherwise). */
#define SHELL_DEFAULT                                                         \
	"if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; " \
	"fi"
/* How long one ExecRead waits for output: also how soon a SIGTERM is
 * noticed by the read loop. */
#define SHELL_READ_WAIT_MS 1000
/* vmd's largest output_cap (services/vm/node.h VMD_EXEC_MAX_CAP). */
#define SHELL_OUTPUT_CAP (64u << 20)
#define SHELL_ROWS 24
#define SHELL_COLS 80

static struct termios shell_saved;
static volatile sig_atomic_t shell_raw; /* shell_saved must go back */
static int shell_winch_pipe[2] = { -1, -1 };

static void
shell_restore(void)
{
	if (shell_raw) {
		(void)tcsetattr(STDIN_FILENO, TCSAFLUSH, &shell_saved);
		shell_raw = 0;
	}
}

/* shell_raw_mode: our terminal in raw mode (when stdin is one). */
static void
shell_raw_mode(void)
{
	struct termios raw;

	if (!isatty(STDIN_FILENO) ||
	    tcgetattr(STDIN_FILENO, &shell_saved) != 0)
		return;
	raw = shell_saved;
	cfmakeraw(&raw);
	shell_raw = 1;
	atexit(shell_restore);
	if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) != 0)
		shell_raw = 0;
}

/* shell_size: our terminal's size, or 24x80 when stdin is none. */
static void
shell_size(uint32_t *rows, uint32_t *cols)
{
	struct winsize ws;

	*rows = SHELL_ROWS;
	*cols = SHELL_COLS;
	if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 &&
	    ws.ws_col > 0) {
		*rows = ws.ws_row;
		*cols = ws.ws_col;
	}
}

static void
on_winch(int sig)
{
	int saved = errno;

	(void)sig;
	(void)write(shell_winch_pipe[1], "w", 1);
	errno = saved;
}

struct shell_pump {
	struct cli *cli;
	const char *sandbox_id;
	uint64_t exec_id;
};

/* shell_resize: ExecResize to our terminal's size. Its failure (the
 * command just exited) is not the session's. */
static void
shell_resize(struct shell_pump *p)
{
	Moat__V1__ExecResizeRequest req = MOAT__V1__EXEC_RESIZE_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 10000,
		.auth = cli_api_key(p->cli) };
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int rv;

	req.sandbox_id = (char *)p->sandbox_id;
	req.exec_id = p->exec_id;
	shell_size(&req.rows, &req.cols);
	rv = moat_rpc_call(moat_client_rpc(p->cli->client), "moat.v1.Gateway",
	    "ExecResize", &req.base, &moat__v1__empty__descriptor, &reply,
	    &opts, &errmsg);
	(void)rv;
	moat_client_free_msg(reply);
	free(errmsg);
}

/* pump_main: our keys to the command's terminal, our resizes to its
 * window; ends at the end of our stdin or when a write fails (the
 * command is gone). */
static void *
pump_main(void *arg)
{
	struct shell_pump *p = arg;
	struct pollfd pfd[2] = { { .fd = STDIN_FILENO, .events = POLLIN },
		{ .fd = shell_winch_pipe[0], .events = POLLIN } };
	uint8_t buf[4096];
	char *errmsg = NULL;
	sigset_t winch;

	/* SIGWINCH is this thread's alone (the others block it). */
	sigemptyset(&winch);
	sigaddset(&winch, SIGWINCH);
	pthread_sigmask(SIG_UNBLOCK, &winch, NULL);
	for (;;) {
		ssize_t n;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return NULL;
		}
		if (pfd[1].revents & POLLIN) {
			char drain[64];

			(void)read(shell_winch_pipe[0], drain, sizeof(drain));
			shell_resize(p);
		}
		if (pfd[0].revents == 0)
			continue;
		n = read(STDIN_FILENO, buf, sizeof(buf));
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0) {
			pfd[0].fd = -1; /* our stdin ended: keep resizing */
			continue;
		}
		if (moat_client_exec_write(p->cli->client, p->sandbox_id,
		        p->exec_id, buf, (size_t)n, false,
		        &errmsg) != MOAT_OK) {
			free(errmsg);
			return NULL;
		}
	}
}

static int
write_out(const uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t n = write(STDOUT_FILENO, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* shell_read_loop: the command's output to our stdout until it exits;
 * *status (heap) its exit. */
static int
shell_read_loop(struct cli *cli, const char *sandbox_id, uint64_t exec_id,
    Moat__V1__ExecStatus **status, char **errmsg)
{
	Moat__V1__ExecReadRequest req = MOAT__V1__EXEC_READ_REQUEST__INIT;
	int rv;

	req.sandbox_id = (char *)sandbox_id;
	req.exec_id = exec_id;
	req.wait_ms = SHELL_READ_WAIT_MS;
	while (!cli_interrupted) {
		Moat__V1__ExecReadReply *r = NULL;

		if ((rv = moat_client_exec_read(cli_client(cli), &req, &r,
		         errmsg)) != MOAT_OK)
			return rv;
		(void)write_out(r->stdout.data, r->stdout.len);
		(void)write_out(r->stderr.data, r->stderr.len);
		req.stdout_offset = r->stdout_next;
		req.stderr_offset = r->stderr_next;
		if (r->eof) {
			*status = r->status;
			r->status = NULL;
			moat_client_free_msg(r);
			return MOAT_OK;
		}
		moat_client_free_msg(r);
	}
	return MOAT_OK;
}

/* shell_exit_code: the command's exit code as ours. */
static int
shell_exit_code(const Moat__V1__ExecStatus *st)
{
	if (st == NULL)
		return moat_status_exit_code(MOAT_UNKNOWN);
	if (st->signal > 0)
		return 128 + (st->signal & 0x7f);
	if (st->exit_code < 0 || st->exit_code > 255)
		return 255;
	return st->exit_code;
}

int
cmd_shell(struct cli *cli, int argc, char **argv)
{
	Moat__V1__ExecRequest exec = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecHandle *handle = NULL;
	Moat__V1__ExecStatus *status = NULL;
	struct shell_pump pump;
	struct sigaction sa;
	pthread_t t;
	char *errmsg = NULL;
	int rv, code, first = 2;

	if (argc < 2 || argv[1][0] == '-')
		return cli_usage_error(SHELL_USAGE,
		    "shell needs the sandbox id first");
	if (argc > 2 && strcmp(argv[2], "--") != 0)
		return cli_usage_error(SHELL_USAGE,
		    "put the command after --: moat shell %s -- %s", argv[1],
		    argv[2]);
	exec.sandbox_id = argv[1];
	exec.pty = true;
	/* A session's output is kept on the node from its start (ExecRead
	 * reads by offset): ask for the most a stream may keep, so a long
	 * session goes blind as late as the node allows. */
	exec.output_cap = SHELL_OUTPUT_CAP;
	shell_size(&exec.rows, &exec.cols);
	if (argc > first + 1) {
		exec.argv = argv + first + 1;
		exec.n_argv = (size_t)(argc - first - 1);
	} else {
		exec.shell = (char *)SHELL_DEFAULT;
	}
	if (getenv("TERM") != NULL && getenv("TERM")[0] != '\0' &&
	    strlen(getenv("TERM")) < 64)
		exec.term = getenv("TERM");
	if (pipe2(shell_winch_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
		return cli_fail(cli, MOAT_RESOURCE_EXHAUSTED, NULL, "pipe");
	cli_catch_signals();
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_winch;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGWINCH, &sa, NULL);
	if ((rv = moat_client_exec_start(cli_client(cli), &exec, &handle,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg,
		    "starting a shell in sandbox %s", exec.sandbox_id);
	shell_raw_mode();
	pump.cli = cli;
	pump.sandbox_id = exec.sandbox_id;
	pump.exec_id = handle->exec_id;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGWINCH);
	pthread_sigmask(SIG_BLOCK, &sa.sa_mask, NULL);
	if (pthread_create(&t, NULL, pump_main, &pump) != 0) {
		shell_restore();
		return cli_fail(cli, MOAT_RESOURCE_EXHAUSTED, NULL,
		    "starting the input thread");
	}
	rv = shell_read_loop(cli, exec.sandbox_id, handle->exec_id, &status,
	    &errmsg);
	shell_restore();
	if (rv != MOAT_OK)
		code = cli_fail(cli, rv, errmsg,
		    "reading the terminal of sandbox %s", exec.sandbox_id);
	else if (status == NULL) {
		/* SIGTERM, SIGHUP: the terminal is gone, as a hangup. */
		code = 128 + cli_interrupted;
		if (moat_client_exec_kill(cli_client(cli), exec.sandbox_id,
		        handle->exec_id, SIGHUP, &errmsg) != MOAT_OK)
			free(errmsg);
	} else
		code = shell_exit_code(status);
	fflush(stdout);
	fflush(stderr);
	/* The input thread may sit in a call or in poll(2) on a terminal
	 * that never ends: the process ends here, not in exit()'s
	 * teardown under it. */
	_exit(code);
}
