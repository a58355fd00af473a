/*
 * cmd_session.c: `moat session ls|show|tree|export|rm|keep` and `moat
 * history`: the recordings of sandboxes created with `moat sandbox create
 * --record`.
 * A session is one recorded run; each one-shot exec on the sandbox is a
 * step with its input, exit code, outputs and the files it created,
 * modified or deleted. `history SANDBOX` shows the steps of the
 * sandbox's latest session, marking pinned steps and those whose snapshot
 * retention removed; `session keep` pins a step. A branch's history
 * starts with the steps it inherits (issue 18), marked with the session
 * that holds them; `session tree` prints a session and its branches.
 * Not for: creating recorded sandboxes (cmd_sandbox.c) or running the
 * steps (cmd_run.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moat/status.h"
#include "moat/util.h"

static const char *const usage_all =
    "session ls [--sandbox ID] | show ID | tree ID | "
    "export ID | rm ID... | keep SESSION STEP [--off]";
static const char *const usage_keep = "session keep SESSION STEP [--off]";

static const char *
policy_name(Moat__V1__SnapshotPolicy p)
{
	switch (p) {
	case MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY:
		return "every";
	case MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_NONE:
		return "none";
	default:
		return "manual";
	}
}

static const char *
kind_name(Moat__V1__StepKind k)
{
	switch (k) {
	case MOAT__V1__STEP_KIND__STEP_KIND_EXEC:
		return "exec";
	case MOAT__V1__STEP_KIND__STEP_KIND_CODE:
		return "code";
	case MOAT__V1__STEP_KIND__STEP_KIND_FILE_WRITE:
		return "file-write";
	case MOAT__V1__STEP_KIND__STEP_KIND_SHELL:
		return "shell";
	default:
		return "?";
	}
}

static const char *
change_name(Moat__V1__FsChange c)
{
	switch (c) {
	case MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED:
		return "created";
	case MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED:
		return "modified";
	case MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED:
		return "deleted";
	default:
		return "changed";
	}
}

/* print_step: one step as lines of text: the step line, then one line
 * per file it changed. */
static void
print_step(const Moat__V1__Step *st)
{
	const char *in = st->input ? st->input : "";
	int first_line = (int)strcspn(in, "\n");
	bool more = in[first_line] != '\0';

	printf("%-5llu %-10s %5d  %.*s%s%s%s", (unsigned long long)st->index,
	    kind_name(st->kind), st->exit_code,
	    first_line > 100 ? 100 : first_line, in,
	    more || first_line > 100 ? " ..." : "",
	    st->snapshot_id[0] ? "  [snapshot]" : "",
	    st->keep ? "  [pinned]" : "");
	if (st->snapshot_removed != NULL && st->snapshot_removed[0] != '\0')
		printf("  [snapshot %s]", st->snapshot_removed);
	/* A branch's inherited step (issue 18): the session holding it. */
	if (st->held_by_session != NULL && st->held_by_session[0] != '\0')
		printf("  [inherited from %s]", st->held_by_session);
	putchar('\n');
	for (size_t i = 0; i < st->n_fs_trace; i++) {
		const Moat__V1__FsTraceEntry *e = st->fs_trace[i];

		if (e->change == MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
			printf("      %-8s %s\n", change_name(e->change),
			    e->path);
		else if (e->type == MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY)
			printf("      %-8s %s/\n", change_name(e->change),
			    e->path);
		else
			printf("      %-8s %s (%llu bytes)\n",
			    change_name(e->change), e->path,
			    (unsigned long long)e->size);
	}
	if (st->fs_trace_truncated)
		printf("      (file list incomplete)\n");
}

/* show_steps: every step of `session_id`, page by page, as text; or, with
 * --json, the whole export (session and steps with outputs). */
static int
show_steps(struct cli *cli, const char *session_id)
{
	Moat__V1__ListStepsReply *page = NULL;
	char *errmsg = NULL, *token = NULL;
	int rv;

	if (cli->json) {
		Moat__V1__ExportSessionReply *ex = NULL;

		if ((rv = moat_client_export_session(cli_client(cli),
		         session_id, false, &ex, &errmsg)) != MOAT_OK)
			return cli_fail(cli, rv, errmsg, "showing session %s",
			    session_id);
		rv = cli_print_json(cli, ex);
		moat_client_free_msg(ex);
		return rv;
	}
	printf("%-5s %-10s %5s  %s\n", "STEP", "KIND", "EXIT", "INPUT");
	do {
		if ((rv = moat_client_list_steps(cli_client(cli), session_id,
		         token, false, &page, &errmsg)) != MOAT_OK) {
			free(token);
			return cli_fail(cli, rv, errmsg,
			    "listing the steps of "
			    "session %s",
			    session_id);
		}
		for (size_t i = 0; i < page->n_steps; i++)
			print_step(page->steps[i]);
		free(token);
		token = page->next_page_token[0] ?
		    strdup(page->next_page_token) :
		    NULL;
		moat_client_free_msg(page);
		page = NULL;
	} while (token != NULL);
	return 0;
}

static int
session_ls(struct cli *cli, const char *sandbox_id)
{
	Moat__V1__ListSessionsReply *page = NULL;
	char *errmsg = NULL, *token = NULL, age[32];
	bool header = false;
	int rv;

	do {
		if ((rv = moat_client_list_sessions(cli_client(cli),
		         sandbox_id, token, &page, &errmsg)) != MOAT_OK) {
			free(token);
			return cli_fail(cli, rv, errmsg, "listing sessions");
		}
		free(token);
		token = NULL;
		if (cli->json) {
			/* One page is one JSON document; --json lists
			 * the first page (up to 100 sessions). */
			rv = cli_print_json(cli, page);
			moat_client_free_msg(page);
			return rv;
		}
		if (!header) {
			printf("%-22s %-24s %5s %-7s %s\n", "ID", "SANDBOX",
			    "STEPS", "SNAPSHOT", "AGE");
			header = true;
		}
		for (size_t i = 0; i < page->n_sessions; i++) {
			const Moat__V1__SessionInfo *s = page->sessions[i];

			printf("%-22s %-24s %5llu %-8s %s\n", s->id,
			    s->sandbox_id, (unsigned long long)s->step_count,
			    policy_name(s->snapshot_policy),
			    cli_format_age(s->created_ms, age, sizeof(age)));
		}
		token = page->next_page_token[0] ?
		    strdup(page->next_page_token) :
		    NULL;
		moat_client_free_msg(page);
		page = NULL;
	} while (token != NULL);
	return 0;
}

/* print_step0: the snapshot of the state before step 1 (the session's
 * labels hold it), or why it is gone. */
static void
print_step0(const Moat__V1__SessionInfo *s)
{
	/* "snapshot snap-..." or "snapshot removed by retention ..." */
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i]->key, "moat.step0_snapshot") == 0 ||
		    strcmp(s->labels[i]->key, "moat.step0_removed") == 0)
			printf("step 0:      snapshot %s\n",
			    s->labels[i]->value);
}

static int
session_show(struct cli *cli, const char *id)
{
	Moat__V1__SessionInfo *s = NULL;
	char *errmsg = NULL, age[32];
	int rv;

	if ((rv = moat_client_get_session(cli_client(cli), id, &s, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "getting session %s", id);
	if (!cli->json) {
		printf("session:     %s\n", s->id);
		printf("sandbox:     %s\n", s->sandbox_id);
		printf("snapshots:   %s\n", policy_name(s->snapshot_policy));
		printf("age:         %s\n",
		    cli_format_age(s->created_ms, age, sizeof(age)));
		if (s->parent_session_id[0] && s->first_step > 1)
			printf("branched:    from %s at step %llu (steps "
			       "1..%llu inherited)\n",
			    s->parent_session_id,
			    (unsigned long long)s->parent_step,
			    (unsigned long long)s->parent_step);
		else if (s->parent_session_id[0])
			printf("forked from: %s step %llu\n",
			    s->parent_session_id,
			    (unsigned long long)s->parent_step);
		print_step0(s);
		printf("steps:       %llu\n\n",
		    (unsigned long long)s->step_count);
	}
	moat_client_free_msg(s);
	return show_steps(cli, id);
}

void
cli_print_session_tree(const Moat__V1__SessionTreeReply *t)
{
	printf("%-*s  %-8s %5s %5s  %s\n", 40, "SESSION", "BRANCHED", "STEPS",
	    "OWN", "LAST EXIT");
	for (size_t i = 0; i < t->n_nodes; i++) {
		const Moat__V1__SessionTreeNode *n = t->nodes[i];
		char at[24] = "-", ex[24] = "-";
		unsigned indent = n->depth > 16 ? 16 : n->depth;
		int width = 40 - 2 * (int)indent;

		if (n->depth > 0 || n->parent_session_id[0] != '\0')
			snprintf(at, sizeof(at), "step %llu",
			    (unsigned long long)n->branched_at);
		if (n->has_exit)
			snprintf(ex, sizeof(ex), "%d", n->last_exit_code);
		printf("%*s%-*s  %-8s %5llu %5llu  %s\n", 2 * (int)indent, "",
		    width, n->session_id, at,
		    (unsigned long long)n->step_count,
		    (unsigned long long)n->own_steps, ex);
	}
	if (t->truncated)
		printf("(tree cut: the tenant has more sessions than one "
		       "tree reads)\n");
}

static int
session_tree(struct cli *cli, const char *id)
{
	Moat__V1__SessionTreeReply *t = NULL;
	char *errmsg = NULL;
	int rv;

	if ((rv = moat_client_get_session_tree(cli_client(cli), id, &t,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "tree of session %s", id);
	if (cli->json)
		rv = cli_print_json(cli, t);
	else
		cli_print_session_tree(t);
	moat_client_free_msg(t);
	return rv;
}

static int
session_export(struct cli *cli, const char *id)
{
	Moat__V1__ExportSessionReply *ex = NULL;
	char *errmsg = NULL;
	int rv;

	if ((rv = moat_client_export_session(cli_client(cli), id, true, &ex,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "exporting session %s", id);
	fputs(ex->json, stdout);
	if (ex->json[0] != '\0' && ex->json[strlen(ex->json) - 1] != '\n')
		putchar('\n');
	moat_client_free_msg(ex);
	return 0;
}

/* print_deleted: the session's id on stdout (for scripts), what deleting
 * it freed on stderr. */
static void
print_deleted(const char *id, const Moat__V1__DeleteSessionReply *r)
{
	size_t left = r->n_unreferenced_snapshots > r->snapshots_deleted ?
	    r->n_unreferenced_snapshots - r->snapshots_deleted :
	    0;

	printf("%s\n", id);
	fprintf(stderr,
	    "deleted session %s: %llu steps, %u snapshots, "
	    "%.1f MiB freed",
	    id, (unsigned long long)r->steps_deleted, r->snapshots_deleted,
	    (double)r->snapshot_bytes_freed / (1024.0 * 1024.0));
	if (left > 0)
		fprintf(stderr,
		    "; %zu of its snapshots could not be deleted "
		    "now (see the gateway log): `moat snapshot gc` removes "
		    "them later",
		    left);
	fputc('\n', stderr);
}

/* session_keep: `session keep SESSION STEP [--off]`: pins the step, so
 * snapshot retention keeps its snapshot, or unpins it. */
static int
session_keep(struct cli *cli, int argc, char **argv)
{
	Moat__V1__Step *st = NULL;
	unsigned long long index;
	bool keep = true;
	char *end, *errmsg = NULL;
	int rv;

	if (argc == 3 && strcmp(argv[2], "--off") == 0) {
		keep = false;
		argc--;
	}
	if (argc != 2)
		return cli_usage_error(usage_keep,
		    "give a session id and a "
		    "step number");
	index = strtoull(argv[1], &end, 10);
	if (argv[1][0] < '0' || argv[1][0] > '9' || *end != '\0' || index == 0)
		return cli_usage_error(usage_keep,
		    "STEP is a step number from "
		    "1, not \"%s\"",
		    argv[1]);
	if ((rv = moat_client_set_step_keep(cli_client(cli), argv[0], index,
	         keep, &st, &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "%s step %llu of session %s",
		    keep ? "pinning" : "unpinning", index, argv[0]);
	if (cli->json)
		rv = cli_print_json(cli, st);
	else
		fprintf(stderr, "step %llu of session %s is %s\n", index,
		    argv[0],
		    keep ? "pinned: retention keeps its snapshot" :
		           "no longer pinned");
	moat_client_free_msg(st);
	return rv;
}

static int
session_rm(struct cli *cli, int argc, char **argv)
{
	int first_failure = 0;

	if (argc < 1)
		return cli_usage_error("session rm ID...",
		    "give one or more "
		    "session ids (`moat session ls` lists them)");
	for (int i = 0; i < argc; i++) {
		Moat__V1__DeleteSessionReply *r = NULL;
		char *errmsg = NULL;
		int rv = moat_client_delete_session(cli_client(cli), argv[i],
		    &r, &errmsg);

		if (rv != MOAT_OK) {
			rv = cli_fail(cli, rv, errmsg, "deleting session %s",
			    argv[i]);
			if (first_failure == 0)
				first_failure = rv;
			continue;
		}
		if (cli->json)
			(void)cli_print_json(cli, r);
		else
			print_deleted(argv[i], r);
		moat_client_free_msg(r);
	}
	return first_failure;
}

/* strip_json: removes every "--json" of argv (setting cli->json); returns
 * the new argc. */
static int
strip_json(struct cli *cli, int argc, char **argv, int from)
{
	for (int i = from; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			cli->json = true;
			memmove(&argv[i], &argv[i + 1],
			    (size_t)(argc - i) * sizeof(*argv));
			argc--;
			i--;
		}
	}
	return argc;
}

int
cmd_session(struct cli *cli, int argc, char **argv)
{
	const char *sub;

	if (argc < 2)
		return cli_usage_error(usage_all, "which session command?");
	sub = argv[1];
	argc = strip_json(cli, argc, argv, 2);
	if (strcmp(sub, "ls") == 0 || strcmp(sub, "list") == 0) {
		if (argc == 2)
			return session_ls(cli, NULL);
		if (argc == 4 && strcmp(argv[2], "--sandbox") == 0)
			return session_ls(cli, argv[3]);
		if (argc == 3 && strncmp(argv[2], "--sandbox=", 10) == 0)
			return session_ls(cli, argv[2] + 10);
		return cli_usage_error("session ls [--sandbox ID]",
		    "ls takes "
		    "only --sandbox ID");
	}
	if (strcmp(sub, "show") == 0 || strcmp(sub, "get") == 0) {
		if (argc != 3)
			return cli_usage_error("session show ID",
			    "give one "
			    "session id");
		return session_show(cli, argv[2]);
	}
	if (strcmp(sub, "tree") == 0) {
		if (argc != 3)
			return cli_usage_error("session tree ID [--json]",
			    "give one session id");
		return session_tree(cli, argv[2]);
	}
	if (strcmp(sub, "export") == 0) {
		if (argc != 3)
			return cli_usage_error("session export ID",
			    "give one "
			    "session id");
		return session_export(cli, argv[2]);
	}
	if (strcmp(sub, "rm") == 0 || strcmp(sub, "delete") == 0)
		return session_rm(cli, argc - 2, argv + 2);
	if (strcmp(sub, "keep") == 0 || strcmp(sub, "pin") == 0)
		return session_keep(cli, argc - 2, argv + 2);
	return cli_usage_error(usage_all, "unknown session command \"%s\"",
	    sub);
}

int
cmd_history(struct cli *cli, int argc, char **argv)
{
	static const char *usage_line = "history SANDBOX";
	Moat__V1__ListSessionsReply *page = NULL;
	char *errmsg = NULL, *session_id = NULL, *token = NULL;
	int rv;

	argc = strip_json(cli, argc, argv, 1);
	if (argc != 2)
		return cli_usage_error(usage_line, "give one sandbox id");
	/* Oldest first: the sandbox's latest session is the last one. Pages
	 * are followed so a sandbox with many sessions still works. */
	for (;;) {
		rv = moat_client_list_sessions(cli_client(cli), argv[1], token,
		    &page, &errmsg);
		free(token);
		token = NULL;
		if (rv != MOAT_OK) {
			free(session_id);
			return cli_fail(cli, rv, errmsg,
			    "listing the sessions "
			    "of sandbox %s",
			    argv[1]);
		}
		if (page->n_sessions > 0) {
			free(session_id);
			session_id =
			    strdup(page->sessions[page->n_sessions - 1]->id);
		}
		if (page->next_page_token[0] != '\0')
			token = strdup(page->next_page_token);
		moat_client_free_msg(page);
		page = NULL;
		if (token == NULL)
			break;
	}
	if (session_id == NULL)
		return cli_fail(cli, MOAT_NOT_FOUND,
		    moat_asprintf(
		        "sandbox "
		        "%s has no recorded session: create the sandbox with "
		        "`moat sandbox create --record`",
		        argv[1]),
		    "history of %s", argv[1]);
	if (!cli->json)
		printf("session %s\n", session_id);
	rv = show_steps(cli, session_id);
	free(session_id);
	return rv;
}
