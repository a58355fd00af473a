/*
 * moat.c: the `moat` command: global options, the command table, help,
 * and the helpers every command uses (errors in one format with the exit
 * code 64 + status, JSON output, duration parsing, signal catching).
 * Not for: what a command does (cmd_*.c).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "moat/codec.h"
#include "moat/config.h"
#include "moat/status.h"
#include "moat/util.h"

volatile sig_atomic_t cli_interrupted;
volatile sig_atomic_t cli_signal_count;

static const struct cli_command commands[] = {
	{ "run", cmd_run,
	    "run [-c CODE | FILE | -] [-l python|bash|sh|node] [--timeout S] "
	    "[--cpus N] [--memory MiB] [--image NAME] [--allow "
	    "HOST[:PORT]]...",
	    "run code in a fresh sandbox, stream its output, destroy it" },
	{ "sandbox", cmd_sandbox,
	    "sandbox create [--cpus N] [--memory MiB] [--scratch MiB] "
	    "[--allow HOST[:PORT]]... "
	    "[--image NAME] [--label K=V]... [--record [--snapshot "
	    "every|manual|none]] [--timeout S] [--idle-timeout S] | ls | "
	    "get ID | rm ID... | keepalive ID [--timeout S] "
	    "[--idle-timeout S]",
	    "create, list, show and destroy sandboxes" },
	{ "exec", cmd_exec,
	    "exec ID [--timeout S] [--cwd DIR] [-e K=V]... [-i] [--keep] -- "
	    "CMD [ARG...]",
	    "run a command in a sandbox, streaming its output" },
	{ "shell", cmd_shell, "shell SANDBOX [-- CMD [ARG...]]",
	    "an interactive terminal in a sandbox (raw mode, resize)" },
	{ "cp", cmd_cp,
	    "cp [-r | --tar] SRC DST   (one side is ID:/path; - is stdin/out)",
	    "copy a file, or a directory with -r, into or out of a sandbox" },
	{ "ls", cmd_ls, "ls ID [PATH]", "list a directory in a sandbox" },
	{ "session", cmd_session,
	    "session ls [--sandbox ID] | show ID | tree ID | export ID | "
	    "rm ID... | keep SESSION STEP [--off]",
	    "recorded sessions: list, show steps, branches, export, delete, "
	    "pin steps" },
	{ "history", cmd_history, "history SANDBOX",
	    "the recorded steps of a sandbox (its latest session)" },
	{ "diff", cmd_diff, "diff A B [--json]",
	    "where two recorded sessions part: steps, outputs, files" },
	{ "compare", cmd_compare, "compare A B ... [--html FILE] [--json]",
	    "rank recorded sessions best first; --html writes a report" },
	{ "restore", cmd_restore,
	    "restore SANDBOX --step N|latest [--session S] [--new] [--node "
	    "NODE] [--reseed]",
	    "bring a sandbox back to a recorded step, from its snapshot "
	    "(--reseed: new random seeds)" },
	{ "fork", cmd_fork,
	    "fork SESSION --step N|latest [--count K] [--node NODE]",
	    "K new sandboxes from one step's snapshot, each recorded" },
	{ "replay", cmd_replay, "replay SESSION [--until N] [--keep]",
	    "re-run a session's steps in a fresh sandbox and compare" },
	{ "snapshot", cmd_snapshot,
	    "snapshot create SANDBOX | ls | rm ID... | "
	    "gc [--dry-run] [--min-age S]",
	    "snapshots of running sandboxes: take, list, remove, collect" },
	{ "code", cmd_code,
	    "code SANDBOX [-c CODE | FILE | -] [-l python|node] [--context "
	    "NAME] "
	    "[--timeout S] [--keep] [--json] | code SANDBOX --close NAME",
	    "run code in a sandbox's persistent context (state is kept)" },
	{ "mcp", cmd_mcp, "mcp [--allow-dir DIR]",
	    "serve MCP (Model Context Protocol) on stdio for AI agents" },
	{ "audit", cmd_audit, "audit [--limit N] [--json]",
	    "your tenant's audit log: mutating calls, refused commands" },
	{ "info", cmd_info, "info",
	    "the cluster: services, nodes, accelerators, images, versions" },
	{ "node", cmd_node,
	    "node ls | cordon NODE [--reason R] | uncordon NODE | drain NODE "
	    "[--to NODE] [--reason R]",
	    "nodes: list, stop placement on one, move its sandboxes off" },
	{ "image", cmd_image,
	    "image build SPEC [--name NAME] [--force] [--node ID] | ls | rm "
	    "NAME | push NAME [--node ID]",
	    "images: build one from a spec on a node, list them with the "
	    "nodes holding each, store one in moat-snapd, remove one" },
};
#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: moat [--gateway URL] [--api-key KEY] [--json] "
	    "[--timeout S] COMMAND ...\n"
	    "\n"
	    "Run untrusted code in disposable microVMs.\n"
	    "\n"
	    "commands:\n");
	for (size_t i = 0; i < N_COMMANDS; i++)
		fprintf(f, "  %-9s %s\n", commands[i].name,
		    commands[i].summary);
	fprintf(f, "  %-9s %s\n", "help",
	    "this text; `moat help COMMAND` "
	    "for one command");
	fprintf(f,
	    "\n"
	    "global options:\n"
	    "  --gateway URL  the gateway (default: $MOAT_GATEWAY, else\n"
	    "                 ipc://<state dir>/gateway.sock)\n"
	    "  --api-key KEY  the API key (default: $MOAT_API_KEY, else the\n"
	    "                 file $MOAT_API_KEY_FILE or <state dir>/api-key\n"
	    "                 that deploy/moat-stack writes)\n"
	    "  --json         print data as JSON (proto3 JSON mapping)\n"
	    "  --timeout S    seconds each call to the gateway may take\n"
	    "  --tls-ca FILE  CAs trusted for a tls+tcp:// gateway "
	    "($MOAT_TLS_CA)\n"
	    "  --tls-cert FILE, --tls-key FILE  a client certificate and "
	    "key, when\n"
	    "                 the gateway asks ($MOAT_TLS_CERT, "
	    "$MOAT_TLS_KEY)\n"
	    "  --tls-name N   the name in the gateway's certificate "
	    "(default: the\n"
	    "                 url's host; $MOAT_TLS_NAME)\n"
	    "  --insecure     allow plain tcp:// off loopback "
	    "($MOAT_INSECURE=1)\n"
	    "\n"
	    "exit codes: the program's own for run and exec (128+N when\n"
	    "killed by signal N, 124 when it timed out); 64+code when moat\n"
	    "itself failed (code: 3 invalid argument, 4 deadline exceeded,\n"
	    "5 not found, 8 resource exhausted, 14 unavailable, ...).\n"
	    "\n"
	    "examples:\n"
	    "  moat run -c 'print(1)'\n"
	    "  moat run script.py\n"
	    "  ID=$(moat sandbox create --memory 512)\n"
	    "  moat exec $ID -- ls -l /\n"
	    "  moat cp data.csv $ID:/root/data.csv\n"
	    "  moat sandbox rm $ID\n");
}

static const struct cli_command *
find_command(const char *name)
{
	for (size_t i = 0; i < N_COMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

/* cli_api_key: the key sent with every call: --api-key, else $MOAT_API_KEY,
 * else the first line of $MOAT_API_KEY_FILE or <state dir>/api-key (the
 * key deploy/moat-stack makes on first start); NULL when none. */
const char *
cli_api_key(const struct cli *cli)
{
	static char key[256];
	const char *env = getenv("MOAT_API_KEY");
	char *path, *state = NULL;
	FILE *f;

	if (cli->api_key != NULL)
		return cli->api_key;
	if (env != NULL && env[0] != '\0')
		return env;
	if ((env = getenv("MOAT_API_KEY_FILE")) != NULL && env[0] != '\0')
		path = strdup(env);
	else if ((state = moat_default_state_dir()) != NULL)
		path = moat_asprintf("%s/api-key", state);
	else
		path = NULL;
	free(state);
	f = path != NULL ? fopen(path, "r") : NULL;
	free(path);
	if (f == NULL)
		return NULL;
	if (fgets(key, sizeof(key), f) == NULL)
		key[0] = '\0';
	fclose(f);
	key[strcspn(key, "\r\n")] = '\0';
	return key[0] != '\0' ? key : NULL;
}

struct moat_client *
cli_client(struct cli *cli)
{
	char *errmsg = NULL;
	int rv;

	if (cli->client != NULL)
		return cli->client;
	if ((rv = moat_client_open_tls(&cli->client, cli->gateway_url,
	         cli_api_key(cli), &cli->tls, &errmsg)) != MOAT_OK)
		exit(cli_fail(cli, rv, errmsg, "cannot use the gateway url"));
	moat_client_set_timeout(cli->client, cli->timeout_ms);
	return cli->client;
}

int
cli_fail(struct cli *cli, int code, char *errmsg, const char *what, ...)
{
	const char *url =
	    cli->client ? moat_client_url(cli->client) : cli->gateway_url;
	char whatbuf[512];
	va_list ap;

	va_start(ap, what);
	vsnprintf(whatbuf, sizeof(whatbuf), what, ap);
	va_end(ap);
	if (code == MOAT_UNAVAILABLE && errmsg != NULL && url != NULL &&
	    strncmp(errmsg, "no answer from ", 15) == 0 &&
	    strstr(errmsg, url) != NULL && strstr(errmsg, "TLS") == NULL) {
		/* The gateway itself is not there: the usual cause is a
		 * stack that is not started. */
		fprintf(stderr,
		    "moat: %s: no answer from the gateway at %s: "
		    "is the local stack running? start it with "
		    "deploy/moat-stack start, or point --gateway (or "
		    "MOAT_GATEWAY) at a running gateway\n",
		    whatbuf, url);
	} else if (code == MOAT_DEADLINE_EXCEEDED) {
		fprintf(stderr,
		    "moat: %s: %s (the per-call limit is set with "
		    "moat --timeout SECONDS)\n",
		    whatbuf, errmsg ? errmsg : moat_strerror(code));
	} else {
		fprintf(stderr, "moat: %s: %s\n", whatbuf,
		    errmsg ? errmsg : moat_strerror(code));
	}
	free(errmsg);
	return moat_status_exit_code(code);
}

int
cli_usage_error(const char *usage_line, const char *fmt, ...)
{
	va_list ap;

	fputs("moat: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nusage: moat %s\n", usage_line);
	return moat_status_exit_code(MOAT_INVALID_ARGUMENT);
}

int
cli_print_json(struct cli *cli, const void *msg)
{
	char *text = NULL, *errmsg = NULL;
	int rv;

	if ((rv = moat_codec_to_json_string(msg, MOAT_CODEC_EMIT_DEFAULTS, 1,
	         &text, &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "printing JSON");
	printf("%s\n", text);
	free(text);
	return 0;
}

bool
cli_parse_seconds(const char *s, uint32_t *ms)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno != 0 || !isfinite(v) || v < 0)
		return false;
	if (*end == 's')
		end++;
	if (*end != '\0' || v * 1000.0 > (double)UINT32_MAX)
		return false;
	*ms = (uint32_t)llround(v * 1000.0);
	return true;
}

int
cli_take_json(struct cli *cli, int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--json") != 0)
			continue;
		cli->json = true;
		memmove(&argv[i], &argv[i + 1],
		    (size_t)(argc - i) * sizeof(*argv));
		argc--;
		i--;
	}
	return argc;
}

bool
cli_parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
	char *end;
	unsigned long long v;

	if (*s == '\0' || *s == '-')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end != '\0' || errno != 0 || v < min || v > max)
		return false;
	*out = (uint32_t)v;
	return true;
}

const char *
cli_format_age(uint64_t then_ms, char *buf, size_t len)
{
	uint64_t now = moat_now_unix_ms();
	uint64_t s = now > then_ms ? (now - then_ms) / 1000 : 0;

	if (then_ms == 0)
		snprintf(buf, len, "-");
	else if (s < 120)
		snprintf(buf, len, "%llus", (unsigned long long)s);
	else if (s < 2 * 3600)
		snprintf(buf, len, "%llum", (unsigned long long)(s / 60));
	else if (s < 2 * 86400)
		snprintf(buf, len, "%lluh", (unsigned long long)(s / 3600));
	else
		snprintf(buf, len, "%llud", (unsigned long long)(s / 86400));
	return buf;
}

static void
on_signal(int sig)
{
	static const char msg[] =
	    "moat: interrupted twice: exiting now; a "
	    "sandbox may be left behind (moat sandbox ls, moat sandbox rm "
	    "ID)\n";

	cli_interrupted = sig;
	cli_signal_count++;
	/* The first signal is handled between calls, but a call (a boot)
	 * can take minutes: a second one ends the process at once. */
	if (cli_signal_count >= 2) {
		ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
		(void)ignored;
		_exit(128 + sig);
	}
}

void
cli_catch_signals(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: a blocking read returns so the loop sees it. */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

int
main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		{ "gateway", required_argument, NULL, 'g' },
		{ "api-key", required_argument, NULL, 'k' },
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ "tls-ca", required_argument, NULL, 'C' },
		{ "tls-cert", required_argument, NULL, 'E' },
		{ "tls-key", required_argument, NULL, 'K' },
		{ "tls-name", required_argument, NULL, 'N' },
		{ "insecure", no_argument, NULL, 'I' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli cli = { 0 };
	const struct cli_command *cmd;
	int opt, rv;

	signal(SIGPIPE, SIG_IGN);
	/* '+': stop at the command; its options are its own. */
	while ((opt = getopt_long(argc, argv, "+h", long_opts, NULL)) != -1) {
		switch (opt) {
		case 'g':
			cli.gateway_url = optarg;
			break;
		case 'k':
			cli.api_key = optarg;
			break;
		case 'C':
			cli.tls.ca = optarg;
			break;
		case 'E':
			cli.tls.cert = optarg;
			break;
		case 'K':
			cli.tls.key = optarg;
			break;
		case 'N':
			cli.tls.server_name = optarg;
			break;
		case 'I':
			cli.tls.insecure = true;
			break;
		case 'j':
			cli.json = true;
			break;
		case 't':
			if (!cli_parse_seconds(optarg, &cli.timeout_ms) ||
			    cli.timeout_ms == 0)
				return cli_usage_error("[--timeout S] COMMAND",
				    "--timeout wants seconds above 0, not "
				    "\"%s\"",
				    optarg);
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("moat %s\n", MOAT_VERSION);
			return 0;
		default:
			usage(stderr);
			return moat_status_exit_code(MOAT_INVALID_ARGUMENT);
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return moat_status_exit_code(MOAT_INVALID_ARGUMENT);
	}
	if (strcmp(argv[optind], "help") == 0) {
		if (optind + 1 < argc &&
		    (cmd = find_command(argv[optind + 1])) != NULL) {
			printf("usage: moat %s\n\n%s\n", cmd->usage,
			    cmd->summary);
			return 0;
		}
		usage(stdout);
		return 0;
	}
	if ((cmd = find_command(argv[optind])) == NULL) {
		fprintf(stderr,
		    "moat: unknown command \"%s\": `moat help` "
		    "lists the commands\n",
		    argv[optind]);
		return moat_status_exit_code(MOAT_INVALID_ARGUMENT);
	}
	argc -= optind;
	argv += optind;
	optind = 0; /* glibc: 0 re-initialises getopt for the command */
	rv = cmd->run(&cli, argc, argv);
	fflush(stdout);
	moat_client_close(cli.client);
	return rv;
}
