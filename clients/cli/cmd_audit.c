/*
 * cmd_audit.c: `moat audit [--limit N] [--json]`: the audit log of the
 * caller's tenant (the tenant of its API key), newest last: who (key id),
 * what (method, sandbox or session, the command of Exec and RunCode and
 * its safety level), when and with which result.
 * Not for: keys themselves (`moat-gateway keys`, an operator command).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "moat/status.h"

int
cmd_audit(struct cli *cli, int argc, char **argv)
{
	Moat__V1__ListAuditReply *r = NULL;
	uint32_t limit = 0;
	char *errmsg = NULL;
	int rv;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			cli->json = true;
		else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc) {
			if (!cli_parse_u32(argv[++i], 1, 1000, &limit))
				return cli_usage_error("audit [--limit N] "
				                       "[--json]",
				    "--limit wants 1-1000, not "
				    "\"%s\"",
				    argv[i]);
		} else {
			return cli_usage_error("audit [--limit N] [--json]",
			    "unexpected argument \"%s\"", argv[i]);
		}
	}
	if ((rv = moat_client_list_audit(cli_client(cli), limit, &r,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "reading the audit log");
	if (cli->json) {
		rv = cli_print_json(cli, r);
		moat_client_free_msg(r);
		return rv;
	}
	for (size_t i = 0; i < r->n_entries; i++) {
		const Moat__V1__AuditEntry *e = r->entries[i];
		time_t secs = (time_t)(e->at_unix_ms / 1000);
		struct tm tm;
		char when[32] = "?";

		if (gmtime_r(&secs, &tm) != NULL)
			strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ",
			    &tm);
		printf("%s  %-12s  %-18s %-20s %-16s %s%s%s%s\n", when,
		    e->key_id[0] ? e->key_id : "-", e->code, e->method,
		    e->sandbox_id[0]     ? e->sandbox_id :
		        e->session_id[0] ? e->session_id :
		                           "-",
		    e->safety[0] ? "[" : "", e->safety,
		    e->safety[0] ? "] " : "", e->command);
	}
	moat_client_free_msg(r);
	return 0;
}
