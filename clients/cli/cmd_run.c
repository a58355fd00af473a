/*
 * cmd_run.c: `moat run` (code in a fresh sandbox that is always destroyed
 * afterwards, also on SIGINT/SIGTERM) and `moat exec` (a command in an
 * existing sandbox). Both start the program with ExecStart and stream its
 * stdout and stderr to ours, live, with ExecRead long-polls; both exit
 * with the program's exit code (128+N if signal N killed it, 124 if it
 * timed out). The exception: `moat exec` on a recorded sandbox uses one
 * Exec call (so the gateway records it as a step) and prints the outputs
 * at the end. Not for: sandbox management (cmd_sandbox.c).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "moat/status.h"
#include "moat/util.h"

#define READ_WAIT_MS 500 /* long-poll; also how soon ^C is seen */
/* A program that writes a little at a time would make each long poll
 * answer at once: a read that brought less than READ_BATCH waits
 * READ_PACE_MS before the next, so output comes in batches at most 25
 * reads a second (within the API key's request rate). A read refused by
 * the rate limit anyway (other calls of the key) is tried again after
 * the limit's second, up to READ_RETRIES times: a read is idempotent
 * (offsets), so no output is lost. */
#define READ_BATCH (64u << 10)
#define READ_PACE_MS 40
#define READ_RETRIES 30
#define CODE_MAX (16u << 20) /* largest program text sent */
#define EXIT_TIMED_OUT 124

struct stream_result {
	Moat__V1__ExecStatus *status; /* owned; NULL if not known */
	uint8_t *out, *err;           /* --json: collected output */
	size_t out_len, err_len;
	int interrupted; /* the signal that stopped us */
};

static void
stream_result_fini(struct stream_result *r)
{
	moat_client_free_msg(r->status);
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof(*r));
}

static int
write_all(int fd, const uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int
append(uint8_t **buf, size_t *len, const uint8_t *data, size_t n)
{
	uint8_t *grown;

	if (n == 0)
		return 0;
	if ((grown = realloc(*buf, *len + n)) == NULL)
		return ENOMEM;
	memcpy(grown + *len, data, n);
	*buf = grown;
	*len += n;
	return 0;
}

/* sleep_ms: waits ms milliseconds; a signal cuts it short (^C is then
 * seen at once). */
static void
sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
		.tv_nsec = (long)(ms % 1000) * 1000000L };

	(void)nanosleep(&ts, NULL);
}

/* stream: reads the program's output until it has exited and all output
 * is read, or a signal arrives. With forward_signals, the first signal
 * is passed to the program (it decides) and only a second stops us.
 * Returns MOAT_OK or a status with *errmsg. */
static int
stream(struct cli *cli, const char *sandbox_id, uint64_t exec_id,
    bool forward_signals, struct stream_result *res, char **errmsg)
{
	Moat__V1__ExecReadRequest req = MOAT__V1__EXEC_READ_REQUEST__INIT;
	int forwarded = 0, retries = 0;
	bool small;
	int rv;

	req.sandbox_id = (char *)sandbox_id;
	req.exec_id = exec_id;
	req.wait_ms = READ_WAIT_MS;
	for (;;) {
		Moat__V1__ExecReadReply *r = NULL;

		if (cli_interrupted) {
			if (!forward_signals || forwarded) {
				res->interrupted = cli_interrupted;
				return MOAT_OK;
			}
			/* First ^C goes to the program, like a local one. */
			forwarded = cli_interrupted;
			cli_interrupted = 0;
			rv = moat_client_exec_kill(cli_client(cli), sandbox_id,
			    exec_id, forwarded, errmsg);
			if (rv != MOAT_OK)
				return rv;
		}
		rv = moat_client_exec_read(cli_client(cli), &req, &r, errmsg);
		if (rv == MOAT_RESOURCE_EXHAUSTED && *errmsg != NULL &&
		    strstr(*errmsg, "too many requests") != NULL &&
		    retries++ < READ_RETRIES) {
			free(*errmsg);
			*errmsg = NULL;
			sleep_ms(1000);
			continue;
		}
		if (rv != MOAT_OK)
			return rv;
		if (cli->json) {
			if (append(&res->out, &res->out_len, r->stdout.data,
			        r->stdout.len) != 0 ||
			    append(&res->err, &res->err_len, r->stderr.data,
			        r->stderr.len) != 0) {
				moat_client_free_msg(r);
				*errmsg =
				    moat_asprintf("out of memory "
				                  "collecting the output");
				return MOAT_RESOURCE_EXHAUSTED;
			}
		} else {
			/* A closed stdout (| head) is not the program's
			 * failure: stop writing, keep waiting for its exit. */
			(void)write_all(STDOUT_FILENO, r->stdout.data,
			    r->stdout.len);
			(void)write_all(STDERR_FILENO, r->stderr.data,
			    r->stderr.len);
		}
		req.stdout_offset = r->stdout_next > req.stdout_offset ?
		    r->stdout_next :
		    req.stdout_offset + r->stdout.len;
		req.stderr_offset = r->stderr_next > req.stderr_offset ?
		    r->stderr_next :
		    req.stderr_offset + r->stderr.len;
		if (r->eof) {
			res->status = r->status;
			r->status = NULL;
			moat_client_free_msg(r);
			return MOAT_OK;
		}
		small = r->stdout.len + r->stderr.len < READ_BATCH;
		moat_client_free_msg(r);
		if (small)
			sleep_ms(READ_PACE_MS);
	}
}

/* exit_code_of: the process exit code that mirrors the program's. */
static int
exit_code_of(const Moat__V1__ExecStatus *st, uint32_t timeout_ms)
{
	if (st == NULL)
		return moat_status_exit_code(MOAT_UNKNOWN);
	if (st->stdout_truncated)
		fprintf(stderr,
		    "moat: stdout was cut after the node's output "
		    "cap (%llu bytes produced)\n",
		    (unsigned long long)st->stdout_bytes);
	if (st->stderr_truncated)
		fprintf(stderr,
		    "moat: stderr was cut after the node's output "
		    "cap (%llu bytes produced)\n",
		    (unsigned long long)st->stderr_bytes);
	if (st->timed_out) {
		fprintf(stderr,
		    "moat: the program ran past its timeout "
		    "(%.1f s) and was killed; allow more with --timeout S\n",
		    timeout_ms / 1000.0);
		return EXIT_TIMED_OUT;
	}
	if (st->signal > 0)
		return 128 + (st->signal & 0x7f);
	if (st->exit_code < 0 || st->exit_code > 255)
		return 255;
	return st->exit_code;
}

/* print_json_result: --json: one ExecResult with the whole output. */
static int
print_json_result(struct cli *cli, struct stream_result *res)
{
	Moat__V1__ExecResult out = MOAT__V1__EXEC_RESULT__INIT;

	out.status = res->status;
	out.stdout.data = res->out;
	out.stdout.len = res->out_len;
	out.stderr.data = res->err;
	out.stderr.len = res->err_len;
	return cli_print_json(cli, &out);
}

/* language_of: from a file name's extension; NULL when it says nothing. */
static const char *
language_of(const char *file)
{
	const char *dot = file ? strrchr(file, '.') : NULL;

	if (dot == NULL)
		return NULL;
	if (strcmp(dot, ".py") == 0)
		return "python";
	if (strcmp(dot, ".sh") == 0)
		return "sh";
	if (strcmp(dot, ".bash") == 0)
		return "bash";
	if (strcmp(dot, ".js") == 0 || strcmp(dot, ".mjs") == 0)
		return "node";
	return NULL;
}

int
cli_read_code(const char *file, char **code, char **errmsg)
{
	size_t len = 0, cap = 0;
	char *buf = NULL;
	int err;

	if (strcmp(file, "-") != 0) {
		if ((err = moat_read_file(file, CODE_MAX, code, &len)) != 0) {
			*errmsg = moat_asprintf("cannot read %s: %s%s", file,
			    strerror(err),
			    err == EFBIG ? " (at most 16 MiB "
			                   "of code; copy data with moat cp)" :
			                   "");
			return moat_status_from_errno(err);
		}
		return MOAT_OK;
	}
	for (;;) {
		ssize_t n;

		if (len + 65536 + 1 > cap) {
			char *grown;
			cap = cap ? cap * 2 : 131072;
			if (cap > CODE_MAX + 65536 + 1 ||
			    (grown = realloc(buf, cap)) == NULL) {
				free(buf);
				*errmsg = moat_asprintf("the code on stdin is "
				                        "larger than 16 MiB");
				return MOAT_RESOURCE_EXHAUSTED;
			}
			buf = grown;
		}
		n = read(STDIN_FILENO, buf + len, 65536);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = errno;
			free(buf);
			*errmsg = moat_asprintf("reading code from stdin: %s",
			    strerror(err));
			return moat_status_from_errno(err);
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	*code = buf;
	return MOAT_OK;
}

static const char *run_usage =
    "run [-c CODE | FILE | -] "
    "[-l python|bash|sh|node] [--timeout S] [--cpus N] [--memory MiB] "
    "[--image NAME] [--allow HOST[:PORT]]...";

#define RUN_MAX_ALLOW 64

/* What `moat run` was asked for; strings point into argv or `code`. */
struct run_opts {
	Moat__V1__CreateSandboxRequest create;
	Moat__V1__NetworkPolicy net; /* --allow (guest egress, issue 14) */
	char *allow[RUN_MAX_ALLOW];
	const char *inline_code, *file, *lang;
	char *code; /* read from FILE or stdin (heap; cmd_run frees) */
	uint32_t timeout_ms;
};

/* run_parse_options: false with *exit_code set on a usage error. */
static bool
run_parse_options(struct cli *cli, int argc, char **argv, struct run_opts *o,
    int *exit_code)
{
	static const struct option opts[] = {
		{ "code", required_argument, NULL, 'c' },
		{ "language", required_argument, NULL, 'l' },
		{ "timeout", required_argument, NULL, 't' },
		{ "cpus", required_argument, NULL, 'C' },
		{ "memory", required_argument, NULL, 'M' },
		{ "image", required_argument, NULL, 'I' },
		{ "allow", required_argument, NULL, 'A' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	int opt;

	while ((opt = getopt_long(argc, argv, "c:l:", opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			o->inline_code = optarg;
			break;
		case 'l':
			o->lang = optarg;
			break;
		case 't':
			if (!cli_parse_seconds(optarg, &o->timeout_ms)) {
				*exit_code = cli_usage_error(run_usage,
				    "--timeout "
				    "wants seconds, not \"%s\"",
				    optarg);
				return false;
			}
			break;
		case 'C':
			if (!cli_parse_u32(optarg, 1, 1024,
			        &o->create.vcpus)) {
				*exit_code = cli_usage_error(run_usage,
				    "--cpus "
				    "wants 1-1024, not \"%s\"",
				    optarg);
				return false;
			}
			break;
		case 'M':
			if (!cli_parse_u32(optarg, 16, 1u << 24,
			        &o->create.memory_mib)) {
				*exit_code = cli_usage_error(run_usage,
				    "--memory "
				    "wants MiB (16 or more), not \"%s\"",
				    optarg);
				return false;
			}
			break;
		case 'I':
			o->create.image = optarg;
			break;
		case 'A':
			if (o->net.n_allow == RUN_MAX_ALLOW) {
				*exit_code = cli_usage_error(run_usage,
				    "at most %d --allow", RUN_MAX_ALLOW);
				return false;
			}
			o->allow[o->net.n_allow++] = optarg;
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			*exit_code = cli_usage_error(run_usage, "bad option");
			return false;
		}
	}
	if (o->net.n_allow > 0) {
		size_t n = o->net.n_allow;

		moat__v1__network_policy__init(&o->net);
		o->net.n_allow = n;
		o->net.mode = "allowlist";
		o->net.allow = o->allow;
		o->create.network = &o->net;
	}
	return true;
}

/* run_resolve_code: the FILE argument, the language and the code itself,
 * read from FILE or stdin into o->code. False with *exit_code set. */
static bool
run_resolve_code(struct cli *cli, int argc, char **argv, struct run_opts *o,
    int *exit_code)
{
	char *errmsg = NULL;
	int rv;

	if (optind < argc)
		o->file = argv[optind++];
	if (optind < argc) {
		*exit_code = cli_usage_error(run_usage,
		    "one FILE at most, not "
		    "\"%s\" too",
		    argv[optind]);
		return false;
	}
	if (o->inline_code != NULL && o->file != NULL) {
		*exit_code = cli_usage_error(run_usage,
		    "give -c CODE or FILE, not "
		    "both");
		return false;
	}
	if (o->inline_code == NULL && o->file == NULL) {
		if (isatty(STDIN_FILENO)) {
			*exit_code = cli_usage_error(run_usage,
			    "no code: give -c "
			    "CODE, a FILE, or - with the code on stdin");
			return false;
		}
		o->file = "-";
	}
	if (o->lang == NULL)
		o->lang = language_of(o->file);
	if (o->lang == NULL)
		o->lang = "python";
	if (strcmp(o->lang, "python") != 0 && strcmp(o->lang, "bash") != 0 &&
	    strcmp(o->lang, "sh") != 0 && strcmp(o->lang, "node") != 0) {
		*exit_code = cli_usage_error(run_usage,
		    "-l wants python, bash, sh "
		    "or node, not \"%s\"",
		    o->lang);
		return false;
	}
	if (o->inline_code == NULL &&
	    (rv = cli_read_code(o->file, &o->code, &errmsg)) != MOAT_OK) {
		*exit_code = cli_fail(cli, rv, errmsg, "run");
		return false;
	}
	if ((o->inline_code ? o->inline_code : o->code)[0] == '\0') {
		*exit_code = cli_usage_error(run_usage,
		    "no code to run: %s is "
		    "empty",
		    o->inline_code                ? "-c" :
		        strcmp(o->file, "-") == 0 ? "stdin" :
		                                    o->file);
		return false;
	}
	return true;
}

/* run_code: runs the code in the new sandbox and streams its output;
 * the exit code for cmd_run. *handle is the caller's to free. */
static int
run_code(struct cli *cli, const struct run_opts *o, const char *sandbox_id,
    Moat__V1__ExecHandle **handle, struct stream_result *res)
{
	Moat__V1__ExecRequest exec = MOAT__V1__EXEC_REQUEST__INIT;
	char *errmsg = NULL;
	int rv, exit_code;

	exec.sandbox_id = (char *)sandbox_id;
	exec.language = (char *)o->lang;
	exec.code = o->inline_code ? (char *)o->inline_code : o->code;
	exec.timeout_ms = o->timeout_ms;
	if ((rv = moat_client_exec_start(cli_client(cli), &exec, handle,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg,
		    "starting %s code in "
		    "sandbox %s",
		    o->lang, sandbox_id);
	if ((rv = stream(cli, sandbox_id, (*handle)->exec_id, false, res,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg,
		    "reading the output of "
		    "sandbox %s",
		    sandbox_id);
	if (res->interrupted)
		return 128 + res->interrupted;
	exit_code = exit_code_of(res->status, o->timeout_ms);
	if (cli->json && print_json_result(cli, res) != 0 && exit_code == 0)
		exit_code = moat_status_exit_code(MOAT_INTERNAL);
	return exit_code;
}

/* run_destroy: the run's sandbox goes, always, even interrupted: a run
 * leaves nothing behind. Returns exit_code, or the failure's when 0. */
static int
run_destroy(struct cli *cli, const char *sandbox_id,
    const struct stream_result *res, int exit_code)
{
	char *errmsg = NULL;
	int rv;

	if (res->interrupted)
		fprintf(stderr,
		    "moat: interrupted (signal %d): destroying "
		    "sandbox %s\n",
		    res->interrupted, sandbox_id);
	if ((rv = moat_client_destroy(cli_client(cli), sandbox_id, &errmsg)) !=
	    MOAT_OK) {
		int code_destroy = cli_fail(cli, rv, errmsg,
		    "destroying "
		    "sandbox %s (remove it with `moat sandbox rm %s`)",
		    sandbox_id, sandbox_id);
		if (exit_code == 0)
			exit_code = code_destroy;
	}
	return exit_code;
}

int
cmd_run(struct cli *cli, int argc, char **argv)
{
	struct run_opts o = { .create =
		                  MOAT__V1__CREATE_SANDBOX_REQUEST__INIT };
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__ExecHandle *handle = NULL;
	struct stream_result res = { 0 };
	char *errmsg = NULL;
	int rv, exit_code;

	if (!run_parse_options(cli, argc, argv, &o, &exit_code) ||
	    !run_resolve_code(cli, argc, argv, &o, &exit_code)) {
		free(o.code);
		return exit_code;
	}
	cli_catch_signals();
	if ((rv = moat_client_create(cli_client(cli), &o.create, &sb,
	         &errmsg)) != MOAT_OK) {
		free(o.code);
		return cli_fail(cli, rv, errmsg, "creating a sandbox");
	}
	if (cli_interrupted) {
		res.interrupted = cli_interrupted;
		exit_code = 128 + res.interrupted;
	} else {
		exit_code = run_code(cli, &o, sb->id, &handle, &res);
	}
	exit_code = run_destroy(cli, sb->id, &res, exit_code);
	stream_result_fini(&res);
	moat_client_free_msg(handle);
	moat_client_free_msg(sb);
	free(o.code);
	return exit_code;
}

/* ---- exec ---- */

struct stdin_pump {
	struct cli *cli;
	const char *sandbox_id;
	uint64_t exec_id;
};

/* stdin_main: with -i, copies our stdin to the program's until EOF. */
static void *
stdin_main(void *arg)
{
	struct stdin_pump *p = arg;
	uint8_t buf[65536];
	char *errmsg = NULL;

	for (;;) {
		ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (moat_client_exec_write(p->cli->client, p->sandbox_id,
		        p->exec_id, buf, n > 0 ? (size_t)n : 0, n <= 0,
		        &errmsg) != MOAT_OK) {
			/* The program may have exited: not our error. */
			free(errmsg);
			return NULL;
		}
		if (n <= 0)
			return NULL;
	}
}

/* recorded: whether `sandbox_id` is recorded (its one-shot Execs become
 * steps). A failure here is left to the exec itself to report. */
static bool
recorded(struct cli *cli, const char *sandbox_id)
{
	Moat__V1__Sandbox *sb = NULL;
	char *errmsg = NULL;
	bool yes;

	if (moat_client_get(cli_client(cli), sandbox_id, &sb, &errmsg) !=
	    MOAT_OK) {
		free(errmsg);
		return false;
	}
	yes = sb->session_id[0] != '\0';
	moat_client_free_msg(sb);
	return yes;
}

/* recorded_exec: `moat exec` on a recorded sandbox: one Exec call (the
 * gateway records it as a step before answering), then its outputs. The
 * output comes at the end rather than streamed. */
static int
recorded_exec(struct cli *cli, const Moat__V1__ExecRequest *exec,
    uint32_t timeout_ms)
{
	Moat__V1__ExecResult *res = NULL;
	char *errmsg = NULL;
	int rv, exit_code;

	if ((rv = moat_client_exec(cli_client(cli), exec, &res, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "running %s in sandbox %s",
		    exec->argv[0], exec->sandbox_id);
	exit_code = exit_code_of(res->status, timeout_ms);
	if (cli->json) {
		if (cli_print_json(cli, res) != 0 && exit_code == 0)
			exit_code = moat_status_exit_code(MOAT_INTERNAL);
	} else {
		/* Empty output has a NULL data pointer, which fwrite may
		 * not be given. */
		if (res->stdout.len)
			fwrite(res->stdout.data, 1, res->stdout.len, stdout);
		fflush(stdout);
		if (res->stderr.len)
			fwrite(res->stderr.data, 1, res->stderr.len, stderr);
	}
	if (res->recording_error[0] != '\0')
		fprintf(stderr,
		    "moat: warning: the exec ran but was not "
		    "recorded: %s\n",
		    res->recording_error);
	moat_client_free_msg(res);
	return exit_code;
}

static const char *exec_usage = "exec ID [--timeout S] [--cwd DIR] "
                                "[-e K=V]... [-i] [--keep] -- CMD [ARG...]";

/* exec_parse_options: fills exec from argv (strings point into argv;
 * env, argc + 1 long, is the caller's). False with *exit_code set. */
static bool
exec_parse_options(struct cli *cli, int argc, char **argv,
    Moat__V1__ExecRequest *exec, char **env, bool *with_stdin, int *exit_code)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 't' },
		{ "cwd", required_argument, NULL, 'w' },
		{ "env", required_argument, NULL, 'e' },
		{ "stdin", no_argument, NULL, 'i' },
		{ "keep", no_argument, NULL, 'k' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	size_t n_env = 0;
	uint32_t timeout_ms = 0;
	int opt;

	while ((opt = getopt_long(argc, argv, "e:i", opts, NULL)) != -1) {
		switch (opt) {
		case 't':
			if (!cli_parse_seconds(optarg, &timeout_ms)) {
				*exit_code = cli_usage_error(exec_usage,
				    "--timeout "
				    "wants seconds, not \"%s\"",
				    optarg);
				return false;
			}
			break;
		case 'w':
			exec->cwd = optarg;
			break;
		case 'e':
			if (strchr(optarg, '=') == NULL) {
				*exit_code = cli_usage_error(exec_usage,
				    "-e wants "
				    "KEY=VALUE, not \"%s\"",
				    optarg);
				return false;
			}
			env[n_env++] = optarg;
			break;
		case 'i':
			*with_stdin = true;
			break;
		case 'k':
			exec->keep = true;
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			*exit_code = cli_usage_error(exec_usage, "bad option");
			return false;
		}
	}
	if (exec->keep && *with_stdin) {
		*exit_code = cli_usage_error(exec_usage,
		    "--keep pins the recorded "
		    "step an exec becomes, and -i runs unrecorded: give one");
		return false;
	}
	if (argc - optind < 2) {
		*exit_code = cli_usage_error(exec_usage,
		    "give a sandbox id and a "
		    "command");
		return false;
	}
	exec->sandbox_id = argv[optind++];
	exec->argv = &argv[optind];
	exec->n_argv = (size_t)(argc - optind);
	exec->env = env;
	exec->n_env = n_env;
	exec->timeout_ms = timeout_ms;
	exec->stdin_open = *with_stdin;
	return true;
}

/* exec_streamed: starts exec and streams its output, with stdin pumped
 * to it when with_stdin; the exit code for cmd_exec. With a pump, the
 * process ends here. */
static int
exec_streamed(struct cli *cli, Moat__V1__ExecRequest *exec, bool with_stdin)
{
	const char *sandbox_id = exec->sandbox_id;
	Moat__V1__ExecHandle *handle = NULL;
	struct stream_result res = { 0 };
	struct stdin_pump pump;
	pthread_t pump_thread;
	bool pumping = false;
	char *errmsg = NULL;
	int rv, exit_code;

	cli_catch_signals();
	if ((rv = moat_client_exec_start(cli_client(cli), exec, &handle,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "starting %s in sandbox %s",
		    exec->argv[0], sandbox_id);
	if (with_stdin) {
		pump.cli = cli;
		pump.sandbox_id = sandbox_id;
		pump.exec_id = handle->exec_id;
		pumping =
		    pthread_create(&pump_thread, NULL, stdin_main, &pump) == 0;
	}
	rv = stream(cli, sandbox_id, handle->exec_id, true, &res, &errmsg);
	if (rv != MOAT_OK) {
		exit_code = cli_fail(cli, rv, errmsg,
		    "reading the output of "
		    "%s in sandbox %s",
		    exec->argv[0], sandbox_id);
	} else if (res.interrupted) {
		fprintf(stderr,
		    "moat: interrupted; %s may still be running "
		    "in sandbox %s\n",
		    exec->argv[0], sandbox_id);
		exit_code = 128 + res.interrupted;
	} else {
		exit_code = exit_code_of(res.status, exec->timeout_ms);
		if (cli->json && print_json_result(cli, &res) != 0 &&
		    exit_code == 0)
			exit_code = moat_status_exit_code(MOAT_INTERNAL);
	}
	stream_result_fini(&res);
	if (pumping) {
		/* The pump may sit in read(2) on a terminal or pipe that
		 * never ends, or in a call: the client cannot be closed
		 * under it, so the process ends here. */
		fflush(stdout);
		fflush(stderr);
		_exit(exit_code);
	}
	moat_client_free_msg(handle);
	return exit_code;
}

int
cmd_exec(struct cli *cli, int argc, char **argv)
{
	Moat__V1__ExecRequest exec = MOAT__V1__EXEC_REQUEST__INIT;
	bool with_stdin = false;
	char **env;
	int exit_code;

	if ((env = calloc((size_t)argc + 1, sizeof(*env))) == NULL)
		return cli_fail(cli, MOAT_RESOURCE_EXHAUSTED, NULL, "exec");
	if (!exec_parse_options(cli, argc, argv, &exec, env, &with_stdin,
	        &exit_code)) {
		free(env);
		return exit_code;
	}
	/* A recorded sandbox records one-shot Execs only; -i needs the
	 * streaming calls, so it runs unrecorded. */
	if (!with_stdin && recorded(cli, exec.sandbox_id)) {
		exit_code = recorded_exec(cli, &exec, exec.timeout_ms);
	} else {
		if (exec.keep)
			fprintf(stderr,
			    "moat: warning: sandbox %s is not recorded: "
			    "--keep has no step to pin\n",
			    exec.sandbox_id);
		exit_code = exec_streamed(cli, &exec, with_stdin);
	}
	free(env);
	return exit_code;
}
