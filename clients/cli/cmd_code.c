/*
 * cmd_code.c: `moat code`: code in a sandbox's persistent context (a
 * long-lived interpreter, like a notebook's kernel: variables, imports
 * and functions stay for the next run), printed like a REPL: the code's
 * stdout and stderr, then the value of its last expression, or the
 * traceback when it raised. On a recorded sandbox each run is a step;
 * `--keep` pins it (retention keeps its snapshot). `--close NAME` ends a
 * context. Exits 0, 1 when the code raised (or timed out), 64 + status
 * when the call failed.
 * Not for: one-shot programs (cmd_run.c).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "moat/status.h"
#include "moat/util.h"

#define EXIT_RAISED 1

static const char *code_usage =
    "code SANDBOX [-c CODE | FILE | -] "
    "[-l python|node] [--context NAME] [--timeout S] [--keep] | "
    "code SANDBOX --close NAME";

static void
code_write(FILE *f, const ProtobufCBinaryData *b)
{
	if (b->len > 0)
		(void)fwrite(b->data, 1, b->len, f);
}

/* code_print: the REPL view of a result; returns the exit code. */
static int
code_print(const Moat__V1__CodeResult *r)
{
	if (r == NULL)
		return moat_status_exit_code(MOAT_INTERNAL);
	code_write(stdout, &r->stdout);
	fflush(stdout);
	code_write(stderr, &r->stderr);
	if (r->has_result)
		printf("%s\n", r->result);
	fflush(stdout);
	if (r->error_name[0] == '\0')
		return 0;
	if (r->traceback[0] != '\0')
		fputs(r->traceback, stderr);
	else if (strcmp(r->error_name, "ContextDied") != 0)
		fprintf(stderr, "%s: %s\n", r->error_name, r->error_value);
	if (r->timed_out)
		fprintf(stderr, "moat: the code ran past its timeout; %s\n",
		    strcmp(r->error_name, "ContextDied") == 0 ?
		        "the context was lost" :
		        "the context and its variables "
		        "are kept (allow more with --timeout S)");
	else if (strcmp(r->error_name, "ContextDied") == 0)
		fprintf(stderr, "moat: %s\n", r->error_value);
	return EXIT_RAISED;
}

int
cmd_code(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "code", required_argument, NULL, 'c' },
		{ "language", required_argument, NULL, 'l' },
		{ "context", required_argument, NULL, 'x' },
		{ "timeout", required_argument, NULL, 't' },
		{ "close", required_argument, NULL, 'X' },
		{ "keep", no_argument, NULL, 'k' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	Moat__V1__RunCodeRequest req = MOAT__V1__RUN_CODE_REQUEST__INIT;
	Moat__V1__RunCodeResult *res = NULL;
	const char *inline_code = NULL, *file = NULL, *close_name = NULL;
	const char *sandbox_id, *context = "", *lang = "python";
	char *code = NULL, *errmsg = NULL;
	uint32_t timeout_ms = 0;
	int opt, rv, exit_code;

	while ((opt = getopt_long(argc, argv, "c:l:", opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			inline_code = optarg;
			break;
		case 'l':
			lang = optarg;
			break;
		case 'x':
			context = optarg;
			break;
		case 'X':
			close_name = optarg;
			break;
		case 'k':
			req.keep = true;
			break;
		case 't':
			if (!cli_parse_seconds(optarg, &timeout_ms))
				return cli_usage_error(code_usage,
				    "--timeout "
				    "wants seconds, not \"%s\"",
				    optarg);
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			return cli_usage_error(code_usage, "bad option");
		}
	}
	if (optind >= argc)
		return cli_usage_error(code_usage,
		    "which sandbox? give its "
		    "id first");
	sandbox_id = argv[optind++];
	if (optind < argc)
		file = argv[optind++];
	if (optind < argc)
		return cli_usage_error(code_usage,
		    "one FILE at most, not "
		    "\"%s\" too",
		    argv[optind]);

	if (close_name != NULL) {
		if (inline_code != NULL || file != NULL || req.keep)
			return cli_usage_error(code_usage,
			    "--close takes no "
			    "code (nor --keep)");
		if ((rv = moat_client_close_context(cli_client(cli),
		         sandbox_id, close_name, &errmsg)) != MOAT_OK)
			return cli_fail(cli, rv, errmsg,
			    "closing context "
			    "\"%s\" of sandbox %s",
			    close_name, sandbox_id);
		return 0;
	}
	if (inline_code != NULL && file != NULL)
		return cli_usage_error(code_usage,
		    "give -c CODE or FILE, not "
		    "both");
	if (inline_code == NULL && file == NULL) {
		if (isatty(STDIN_FILENO))
			return cli_usage_error(code_usage,
			    "no code: give -c "
			    "CODE, a FILE, or - with the code on stdin");
		file = "-";
	}
	if (inline_code == NULL &&
	    (rv = cli_read_code(file, &code, &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "code");

	req.sandbox_id = (char *)sandbox_id;
	req.language = (char *)lang;
	req.code = inline_code ? (char *)inline_code : code;
	req.context = (char *)context;
	req.timeout_ms = timeout_ms;
	rv = moat_client_run_code(cli_client(cli), &req, &res, &errmsg);
	free(code);
	if (rv != MOAT_OK)
		return cli_fail(cli, rv, errmsg,
		    "running code in context "
		    "\"%s\" of sandbox %s",
		    context[0] ? context : "default", sandbox_id);
	if (cli->json) {
		exit_code = cli_print_json(cli, res);
		if (exit_code == 0 &&
		    (res->result == NULL ||
		        res->result->error_name[0] != '\0'))
			exit_code = EXIT_RAISED;
	} else {
		exit_code = code_print(res->result);
	}
	moat_client_free_msg(res);
	return exit_code;
}
