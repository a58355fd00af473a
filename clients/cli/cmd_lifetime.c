/*
 * cmd_lifetime.c: `moat sandbox keepalive SB [--timeout S]
 * [--idle-timeout S]` (issue 15): a new timeout from now (without
 * --timeout: the tenant's default timeout from now) and/or idle timeout
 * (0 removes it); prints when the sandbox now expires. Not for: the
 * create options (cmd_sandbox.c).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "moat/status.h"

static const char *const usage_keepalive =
    "sandbox keepalive ID [--timeout S] [--idle-timeout S] [--json]";

/* cli_lifetime_print: a sandbox's expiry and idle timeout, for humans. */
void
cli_lifetime_print(const Moat__V1__Sandbox *s)
{
	if (s->expires_unix_ms != 0) {
		time_t t = (time_t)(s->expires_unix_ms / 1000);
		struct tm tm;
		char when[32] = "?";

		if (gmtime_r(&t, &tm) != NULL)
			strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%SZ",
			    &tm);
		printf("expires:     %s\n", when);
	} else {
		printf("expires:     never\n");
	}
	if (s->idle_timeout_s != 0)
		printf("idle:        destroyed after %" PRIu32
		       " s without a call\n",
		    s->idle_timeout_s);
}

int
cli_sandbox_keepalive(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 'T' },
		{ "idle-timeout", required_argument, NULL, 'I' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	Moat__V1__SetTimeoutRequest req = MOAT__V1__SET_TIMEOUT_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	char *errmsg = NULL;
	uint32_t idle = 0;
	int opt, rv;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'T':
			if (!cli_parse_u32(optarg, 1, UINT32_MAX,
			        &req.timeout_s))
				return cli_usage_error(usage_keepalive,
				    "--timeout wants seconds from now (1 or "
				    "more), not \"%s\"",
				    optarg);
			break;
		case 'I':
			if (!cli_parse_u32(optarg, 0, UINT32_MAX, &idle))
				return cli_usage_error(usage_keepalive,
				    "--idle-timeout wants seconds (0 removes "
				    "it), not \"%s\"",
				    optarg);
			req.idle_timeout_s = idle;
			req.clear_idle_timeout = idle == 0;
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			return cli_usage_error(usage_keepalive, "bad option");
		}
	}
	if (optind + 1 != argc)
		return cli_usage_error(usage_keepalive,
		    "give one sandbox id (`moat sandbox ls` lists them)");
	req.sandbox_id = argv[optind];
	if ((rv = moat_client_set_sandbox_timeout(cli_client(cli), &req, &sb,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "keeping sandbox %s alive",
		    req.sandbox_id);
	if (cli->json) {
		rv = cli_print_json(cli, sb);
	} else {
		printf("%s\n", sb->id);
		cli_lifetime_print(sb);
		rv = 0;
	}
	moat_client_free_msg(sb);
	return rv;
}
