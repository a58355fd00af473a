/*
 * cmd_travel.c: `moat restore`, `moat fork`, `moat replay` and `moat
 * snapshot create|ls|rm|gc`: going back to a recorded step from its
 * snapshot (in place or as a new sandbox), branching several sandboxes
 * from one step, re-running a session's inputs to see whether they come
 * out the same, and the snapshots themselves. Data goes to stdout (ids,
 * one a line, so scripts can take them), what happened to stderr.
 * Not for: recording (cmd_sandbox.c --record) or showing sessions
 * (cmd_session.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moat/status.h"
#include "moat/util.h"

static const char *const usage_restore =
    "restore SANDBOX --step N|latest [--session S] [--new] [--node NODE] "
    "[--reseed]";
static const char *const usage_fork =
    "fork SESSION --step N|latest [--count K] [--node NODE]";
static const char *const usage_replay = "replay SESSION [--until N] [--keep]";
static const char *const usage_snapshot =
    "snapshot create SANDBOX | ls | rm ID... | gc [--dry-run] [--min-age S]";
static const char *const usage_gc = "snapshot gc [--dry-run] [--min-age S] "
                                    "[--json]";

/* parse_step: a step index (0: the state before step 1), or "latest"
 * (*latest set: the last step that has a snapshot). */
static bool
parse_step(const char *s, uint64_t *out, protobuf_c_boolean *latest)
{
	char *end;
	unsigned long long v;

	*latest = false;
	if (s != NULL && strcmp(s, "latest") == 0) {
		*latest = true;
		*out = 0;
		return true;
	}
	if (s == NULL || *s < '0' || *s > '9')
		return false;
	v = strtoull(s, &end, 10);
	if (*end != '\0')
		return false;
	*out = v;
	return true;
}

/* latest_session: the id (heap) of the latest session recording
 * `sandbox_id`, or NULL after printing why (exit code in *rv). */
static char *
latest_session(struct cli *cli, const char *sandbox_id, int *rv)
{
	Moat__V1__ListSessionsReply *page = NULL;
	char *errmsg = NULL, *token = NULL, *id = NULL;

	do {
		*rv = moat_client_list_sessions(cli_client(cli), sandbox_id,
		    token, &page, &errmsg);
		free(token);
		token = NULL;
		if (*rv != MOAT_OK) {
			free(id);
			*rv = cli_fail(cli, *rv, errmsg,
			    "finding the session "
			    "of sandbox %s",
			    sandbox_id);
			return NULL;
		}
		if (page->n_sessions > 0) {
			free(id);
			id = strdup(page->sessions[page->n_sessions - 1]->id);
		}
		if (page->next_page_token[0] != '\0')
			token = strdup(page->next_page_token);
		moat_client_free_msg(page);
		page = NULL;
	} while (token != NULL);
	if (id == NULL)
		*rv = cli_fail(cli, MOAT_NOT_FOUND,
		    moat_asprintf("sandbox %s "
		                  "has no recorded session: give one with "
		                  "--session (`moat "
		                  "session ls` lists them)",
		        sandbox_id),
		    "restore %s", sandbox_id);
	return id;
}

int
cmd_restore(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "step", required_argument, NULL, 's' },
		{ "session", required_argument, NULL, 'S' },
		{ "new", no_argument, NULL, 'n' },
		{ "node", required_argument, NULL, 'N' },
		{ "reseed", no_argument, NULL, 'r' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	Moat__V1__RestoreStepRequest req =
	    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
	Moat__V1__RestoreStepReply *r = NULL;
	const char *session = NULL, *sandbox;
	char *found = NULL, *errmsg = NULL;
	bool step_set = false;
	int opt, rv;

	optind = 0;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (!parse_step(optarg, &req.step, &req.step_latest))
				return cli_usage_error(usage_restore,
				    "--step "
				    "wants a step number or \"latest\", not "
				    "\"%s\"",
				    optarg);
			step_set = true;
			break;
		case 'S':
			session = optarg;
			break;
		case 'n':
			req.new_sandbox = true;
			break;
		case 'N':
			req.node = optarg;
			break;
		case 'r':
			/* in place: reseed the code contexts' random
			 * generators (a new sandbox always does) */
			req.reseed = true;
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			return cli_usage_error(usage_restore,
			    "unknown "
			    "option");
		}
	}
	if (optind + 1 != argc)
		return cli_usage_error(usage_restore, "give one sandbox id");
	if (!step_set)
		return cli_usage_error(usage_restore,
		    "which step? --step N "
		    "(`moat history %s` lists them)",
		    argv[optind]);
	sandbox = argv[optind];
	if (session == NULL) {
		if ((found = latest_session(cli, sandbox, &rv)) == NULL)
			return rv;
		session = found;
	}
	req.session_id = (char *)session;
	if (!req.new_sandbox)
		req.sandbox_id = (char *)sandbox;
	rv = moat_client_restore_step(cli_client(cli), &req, &r, &errmsg);
	if (rv != MOAT_OK) {
		rv = req.step_latest ?
		    cli_fail(cli, rv, errmsg,
		        "restoring the latest step "
		        "of session %s",
		        session) :
		    cli_fail(cli, rv, errmsg,
		        "restoring step %llu of "
		        "session %s",
		        (unsigned long long)req.step, session);
		free(found);
		return rv;
	}
	if (cli->json) {
		rv = cli_print_json(cli, r);
	} else {
		printf("%s\n", r->sandbox != NULL ? r->sandbox->id : "");
		fprintf(stderr,
		    "restored %s (session %s) into sandbox %s on node %s "
		    "(%llu bytes pulled from moat-snapd); its steps now "
		    "record into session %s\n",
		    r->snapshot_id, session,
		    r->sandbox != NULL ? r->sandbox->id : "?",
		    r->sandbox != NULL && r->sandbox->node_id[0] ?
		        r->sandbox->node_id :
		        "?",
		    (unsigned long long)(r->sandbox != NULL ?
		            r->sandbox->pulled_bytes :
		            0),
		    r->session_id);
	}
	moat_client_free_msg(r);
	free(found);
	return rv;
}

int
cmd_fork(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "step", required_argument, NULL, 's' },
		{ "count", required_argument, NULL, 'c' },
		{ "node", required_argument, NULL, 'N' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	Moat__V1__ForkRequest req = MOAT__V1__FORK_REQUEST__INIT;
	Moat__V1__ForkReply *r = NULL;
	char *errmsg = NULL;
	bool step_set = false;
	int opt, rv, first_failure = 0;

	optind = 0;
	req.count = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (!parse_step(optarg, &req.step, &req.step_latest))
				return cli_usage_error(usage_fork,
				    "--step "
				    "wants a step number or \"latest\", not "
				    "\"%s\"",
				    optarg);
			step_set = true;
			break;
		case 'N':
			req.node = optarg;
			break;
		case 'c':
			if (!cli_parse_u32(optarg, 1, 16, &req.count))
				return cli_usage_error(usage_fork,
				    "--count "
				    "wants 1-16, not \"%s\"",
				    optarg);
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			return cli_usage_error(usage_fork, "unknown option");
		}
	}
	if (optind + 1 != argc)
		return cli_usage_error(usage_fork, "give one session id");
	if (!step_set)
		return cli_usage_error(usage_fork,
		    "which step? --step N "
		    "(`moat session show %s` lists them)",
		    argv[optind]);
	req.session_id = argv[optind];
	if ((rv = moat_client_fork(cli_client(cli), &req, &r, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg,
		    "forking step %llu of "
		    "session %s",
		    (unsigned long long)req.step, req.session_id);
	for (size_t i = 0; i < r->n_copies; i++) {
		const Moat__V1__ForkCopy *c = r->copies[i];

		if ((int)c->code != MOAT_OK) {
			fprintf(stderr, "moat: fork copy %zu: %s: %s\n", i + 1,
			    moat_strerror((int)c->code), c->message);
			if (first_failure == 0)
				first_failure = 64 + (int)c->code;
		} else if (!cli->json) {
			/* stdout stays "SANDBOX SESSION" for scripts. */
			printf("%s %s\n", c->sandbox ? c->sandbox->id : "",
			    c->session_id);
			fprintf(stderr,
			    "copy %zu: %s on node %s, %llu bytes "
			    "pulled from moat-snapd\n",
			    i + 1, c->sandbox ? c->sandbox->id : "?",
			    c->sandbox && c->sandbox->node_id[0] ?
			        c->sandbox->node_id :
			        "?",
			    (unsigned long long)(c->sandbox ?
			            c->sandbox->pulled_bytes :
			            0));
		}
	}
	if (cli->json)
		rv = cli_print_json(cli, r);
	else
		fprintf(stderr,
		    "%u of %zu copies of step %llu of session %s "
		    "run (sandbox, branch session above)\n",
		    r->succeeded, r->n_copies, (unsigned long long)req.step,
		    req.session_id);
	moat_client_free_msg(r);
	return rv != 0 ? rv : first_failure;
}

int
cmd_replay(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "until", required_argument, NULL, 'u' },
		{ "keep", no_argument, NULL, 'k' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	Moat__V1__ReplayRequest req = MOAT__V1__REPLAY_REQUEST__INIT;
	Moat__V1__ReplayReply *r = NULL;
	protobuf_c_boolean latest;
	char *errmsg = NULL;
	int opt, rv;

	optind = 0;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'u':
			if (!parse_step(optarg, &req.until_step, &latest) ||
			    latest || req.until_step == 0)
				return cli_usage_error(usage_replay,
				    "--until "
				    "wants a step number from 1, not \"%s\"",
				    optarg);
			break;
		case 'k':
			req.keep_sandbox = true;
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			return cli_usage_error(usage_replay, "unknown option");
		}
	}
	if (optind + 1 != argc)
		return cli_usage_error(usage_replay, "give one session id");
	req.session_id = argv[optind];
	if ((rv = moat_client_replay(cli_client(cli), &req, &r, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "replaying session %s",
		    req.session_id);
	if (cli->json) {
		rv = cli_print_json(cli, r);
	} else {
		printf("replayed:  %llu steps of %s\n",
		    (unsigned long long)r->steps_replayed, req.session_id);
		printf("same:      %llu\n",
		    (unsigned long long)r->steps_matching);
		if (r->steps_refused != 0)
			printf("refused:   %llu (not run: the tenant's policy "
			       "refuses them now)\n",
			    (unsigned long long)r->steps_refused);
		if (r->first_divergent_step != 0)
			printf("diverged:  first at step %llu (`moat session "
			       "show %s` shows the new outputs)\n",
			    (unsigned long long)r->first_divergent_step,
			    r->session_id);
		printf("session:   %s\n", r->session_id);
		if (r->sandbox != NULL)
			printf("sandbox:   %s (kept: `moat sandbox rm %s` "
			       "when done)\n",
			    r->sandbox->id, r->sandbox->id);
	}
	/* Like diff(1): 1 when the replay came out different. */
	if (rv == 0 && r->steps_matching != r->steps_replayed)
		rv = 1;
	moat_client_free_msg(r);
	return rv;
}

#define MIB(b) ((double)(b) / (1024.0 * 1024.0))

/* snapshot_where: "ram" or "disk" (evicted), "+snapd" when moat-snapd
 * has a copy ("+snapd?" while its push is under way), into buf. */
static const char *
snapshot_where(const Moat__V1__LocalSnapshot *s, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s",
	    s->template_               ? "template" :
	        s->location[0] != '\0' ? s->location :
	                                 "ram",
	    s->remote_stored      ? "+snapd" :
	        s->remote_pending ? "+snapd?" :
	                            "");
	return buf;
}

/* snapshot_bytes: its size on the node: the RAM copy (what it holds in
 * the RAM dir, or its RAM bytes once evicted to disk) and the disk
 * copy. */
static uint64_t
snapshot_bytes(const Moat__V1__LocalSnapshot *s)
{
	uint64_t ram =
	    s->location[0] == '\0' || strcmp(s->location, "disk") == 0 ?
	    s->ram_bytes :
	    s->ram_resident_bytes;

	return ram + s->disk_bytes;
}

static int
snapshot_ls(struct cli *cli)
{
	Moat__V1__LocalSnapshotList *list = NULL;
	char *errmsg = NULL, age[32], where[32], step[24];
	int rv;

	if ((rv = moat_client_list_snapshots(cli_client(cli), &list,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "listing snapshots");
	if (cli->json) {
		rv = cli_print_json(cli, list);
		moat_client_free_msg(list);
		return rv;
	}
	printf("%-36s %-14s %9s %-24s %-22s %5s %s\n", "ID", "WHERE",
	    "SIZE_MIB", "SANDBOX", "SESSION", "STEP", "AGE");
	for (size_t i = 0; i < list->n_snapshots; i++) {
		const Moat__V1__LocalSnapshot *s = list->snapshots[i];

		snprintf(step, sizeof(step), "%llu",
		    (unsigned long long)s->step);
		printf("%-36s %-14s %9.1f %-24s %-22s %5s %s\n",
		    s->snapshot_id, snapshot_where(s, where, sizeof(where)),
		    MIB(snapshot_bytes(s)),
		    s->sandbox_id[0] ? s->sandbox_id : "-",
		    s->session_id[0] ? s->session_id : "-",
		    s->session_id[0] ? step : "-",
		    cli_format_age(s->created_unix_ms, age, sizeof(age)));
	}
	moat_client_free_msg(list);
	return 0;
}

/* snapshot_gc: `snapshot gc`: one line per snapshot removed (or, dry
 * run, that would be), then the total; the nodes or snapd that failed
 * on stderr (exit 64 + UNAVAILABLE). */
static int
snapshot_gc(struct cli *cli, int argc, char **argv)
{
	Moat__V1__GcSnapshotsReply *r = NULL;
	uint32_t min_age = 0;
	bool dry_run = false;
	char *errmsg = NULL;
	int rv;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--dry-run") == 0 ||
		    strcmp(argv[i], "-n") == 0)
			dry_run = true;
		else if (strcmp(argv[i], "--min-age") != 0)
			return cli_usage_error(usage_gc,
			    "\"%s\": gc takes "
			    "--dry-run and --min-age SECONDS",
			    argv[i]);
		else if (++i >= argc ||
		    !cli_parse_u32(argv[i], 0, UINT32_MAX, &min_age))
			return cli_usage_error(usage_gc,
			    "--min-age wants "
			    "seconds%s%s%s",
			    i < argc ? ", not \"" : "",
			    i < argc ? argv[i] : "", i < argc ? "\"" : "");
		else if (min_age == 0)
			min_age = 1; /* 0 on the wire is the default, 60 s */
	}
	if ((rv = moat_client_gc_snapshots(cli_client(cli), dry_run, min_age,
	         &r, &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg,
		    "collecting snapshot garbage");
	if (cli->json) {
		rv = cli_print_json(cli, r);
	} else {
		for (size_t i = 0; i < r->n_removed; i++)
			printf("%s %s  %s  %.1f MiB%s%s\n",
			    dry_run ? "would remove" : "removed",
			    r->removed[i]->snapshot_id, r->removed[i]->where,
			    MIB(r->removed[i]->bytes),
			    r->removed[i]->sandbox_id[0] ? "  of sandbox " :
			                                   "",
			    r->removed[i]->sandbox_id);
		printf("%s %.1f MiB in %zu snapshots; %u kept (a step still "
		       "names them)\n",
		    dry_run ? "would free" : "freed", MIB(r->bytes_freed),
		    r->n_removed, r->kept);
	}
	for (size_t i = 0; i < r->n_errors; i++)
		fprintf(stderr, "moat: snapshot gc: %s\n", r->errors[i]);
	if (rv == 0 && r->n_errors > 0)
		rv = moat_status_exit_code(MOAT_UNAVAILABLE);
	moat_client_free_msg(r);
	return rv;
}

int
cmd_snapshot(struct cli *cli, int argc, char **argv)
{
	Moat__V1__LocalSnapshot *snap = NULL;
	char *errmsg = NULL;
	const char *sub;
	int rv, worst = 0, n = 0;

	/* --json anywhere after the subcommand. */
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			cli->json = true;
			memmove(&argv[i], &argv[i + 1],
			    (size_t)(argc - i) * sizeof(*argv));
			argc--;
			i--;
		}
	}
	if (argc < 2)
		return cli_usage_error(usage_snapshot,
		    "which snapshot "
		    "command?");
	sub = argv[1];
	if (strcmp(sub, "ls") == 0 || strcmp(sub, "list") == 0) {
		if (argc != 2)
			return cli_usage_error(usage_snapshot,
			    "ls takes no "
			    "arguments");
		return snapshot_ls(cli);
	}
	if (strcmp(sub, "gc") == 0)
		return snapshot_gc(cli, argc - 2, argv + 2);
	if (strcmp(sub, "create") == 0) {
		if (argc != 3)
			return cli_usage_error(usage_snapshot,
			    "give one "
			    "sandbox id");
		if ((rv = moat_client_snapshot(cli_client(cli), argv[2], &snap,
		         &errmsg)) != MOAT_OK)
			return cli_fail(cli, rv, errmsg, "snapshot of %s",
			    argv[2]);
		if (cli->json)
			rv = cli_print_json(cli, snap);
		else
			printf("%s\n", snap->snapshot_id);
		moat_client_free_msg(snap);
		return rv;
	}
	if (strcmp(sub, "rm") == 0 || strcmp(sub, "delete") == 0) {
		if (argc < 3)
			return cli_usage_error(usage_snapshot,
			    "give the "
			    "snapshot ids to remove (`moat snapshot ls`)");
		for (int i = 2; i < argc; i++) {
			if ((rv = moat_client_delete_snapshot(cli_client(cli),
			         argv[i], &errmsg)) != MOAT_OK) {
				rv = cli_fail(cli, rv, errmsg,
				    "removing "
				    "snapshot %s",
				    argv[i]);
				if (worst == 0)
					worst = rv;
				continue;
			}
			n++;
		}
		if (!cli->json)
			fprintf(stderr, "%d snapshot%s removed\n", n,
			    n == 1 ? "" : "s");
		return worst;
	}
	return cli_usage_error(usage_snapshot,
	    "unknown snapshot command "
	    "\"%s\"",
	    sub);
}
