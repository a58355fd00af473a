/*
 * cmd_diff.c: `moat diff A B` and `moat compare A B ...`: where two
 * recorded sessions part (the first divergent step, then each differing
 * step's inputs, exit codes, outputs and files, then the sessions' net
 * effects on the filesystem), and a ranking of several sessions, best
 * first, as a table, JSON, or one self-contained HTML report (inline
 * CSS, no scripts, no links out; every string escaped).
 * Not for: listing or showing one session (cmd_session.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "moat/status.h"
#include "moat/util.h"

#define COMPARE_MAX 32

static const char *const usage_diff = "diff A B [--json]";
static const char *const usage_compare =
    "compare A B ... [--html FILE] [--json]";

static const char *
change_mark(const char *change)
{
	if (strcmp(change, "created") == 0)
		return "+";
	if (strcmp(change, "modified") == 0)
		return "~";
	if (strcmp(change, "deleted") == 0)
		return "-";
	return " ";
}

/* print_first_line: the first line of `s`, at most 100 bytes, with
 * " ..." when there is more. */
static void
print_first_line(const char *s)
{
	int n = (int)strcspn(s, "\n");
	bool more = s[n] != '\0' || n > 100;

	printf("%.*s%s\n", n > 100 ? 100 : n, s, more ? " ..." : "");
}

static void
print_files(Moat__V1__FileDiff *const *files, size_t n, const char *indent)
{
	for (size_t i = 0; i < n; i++) {
		const Moat__V1__FileDiff *f = files[i];

		if (strcmp(f->change_a, f->change_b) == 0) {
			printf("%s  %s %s %s  (A and B: different contents)\n",
			    indent, change_mark(f->change_a), f->change_a,
			    f->path);
			continue;
		}
		/* A side that left the file alone gets no line. */
		if (f->change_a[0] != '\0')
			printf("%sA %s %s %s\n", indent,
			    change_mark(f->change_a), f->change_a, f->path);
		if (f->change_b[0] != '\0')
			printf("%sB %s %s %s\n", indent,
			    change_mark(f->change_b), f->change_b, f->path);
	}
}

static void
print_diff(const Moat__V1__DiffReply *r)
{
	printf("A: %s (%llu steps)\nB: %s (%llu steps)\n", r->session_a,
	    (unsigned long long)r->steps_a, r->session_b,
	    (unsigned long long)r->steps_b);
	if (r->first_divergent_step == 0) {
		printf("the sessions agree: same inputs, exit codes, outputs "
		       "and files at every step\n");
		return;
	}
	printf("first divergent step: %llu\n",
	    (unsigned long long)r->first_divergent_step);
	for (size_t i = 0; i < r->n_steps; i++) {
		const Moat__V1__StepDiff *d = r->steps[i];

		if (d->same)
			continue;
		printf("\nstep %llu:\n", (unsigned long long)d->index);
		printf("  input A: ");
		if (d->in_a)
			print_first_line(d->input_a);
		else
			printf("(no such step)\n");
		printf("  input B: ");
		if (d->in_b)
			print_first_line(d->input_b);
		else
			printf("(no such step)\n");
		if (d->in_a && d->in_b) {
			printf("  exit code: A %d, B %d%s\n", d->exit_code_a,
			    d->exit_code_b,
			    d->exit_code_a != d->exit_code_b ? "  (differ)" :
			                                       "");
			if (d->stdout_differs || d->stderr_differs)
				printf("  outputs differ:%s%s\n",
				    d->stdout_differs ? " stdout" : "",
				    d->stderr_differs ? " stderr" : "");
		}
		if (d->n_files > 0) {
			printf("  files:\n");
			print_files(d->files, d->n_files, "    ");
		}
	}
	if (r->n_files > 0) {
		printf("\nnet effect on files (whole sessions):\n");
		print_files(r->files, r->n_files, "  ");
	} else {
		printf("\nnet effect on files: the same\n");
	}
}

/* take_json: removes every "--json" of argv (setting cli->json); returns
 * the new argc. */
static int
take_json(struct cli *cli, int argc, char **argv)
{
	int n = 1;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			cli->json = true;
		else
			argv[n++] = argv[i];
	}
	argv[n] = NULL;
	return n;
}

int
cmd_diff(struct cli *cli, int argc, char **argv)
{
	Moat__V1__DiffReply *r = NULL;
	char *errmsg = NULL;
	int rv;

	argc = take_json(cli, argc, argv);
	for (int i = 1; i < argc; i++)
		if (argv[i][0] == '-')
			return cli_usage_error(usage_diff,
			    "unknown option "
			    "\"%s\"",
			    argv[i]);
	if (argc != 3)
		return cli_usage_error(usage_diff,
		    "give two session ids "
		    "(`moat session ls` lists them)");
	if ((rv = moat_client_diff(cli_client(cli), argv[1], argv[2], &r,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "diffing sessions %s and %s",
		    argv[1], argv[2]);
	if (cli->json)
		rv = cli_print_json(cli, r);
	else
		print_diff(r);
	moat_client_free_msg(r);
	return rv;
}

/* ---- compare ---- */

static void
format_ms(uint64_t ms, char *buf, size_t len)
{
	if (ms < 1000)
		snprintf(buf, len, "%llums", (unsigned long long)ms);
	else if (ms < 600000)
		snprintf(buf, len, "%.1fs", (double)ms / 1000.0);
	else
		snprintf(buf, len, "%.1fm", (double)ms / 60000.0);
}

static void
print_ranking(const Moat__V1__CompareReply *r)
{
	printf("%-4s %-24s %-3s %5s %6s %11s %7s %7s %8s %8s\n", "RANK",
	    "SESSION", "OK", "STEPS", "FAILED", "DESTRUCTIVE", "DELETED",
	    "CREATED", "MODIFIED", "TIME");
	for (size_t i = 0; i < r->n_sessions; i++) {
		const Moat__V1__SessionScore *s = r->sessions[i];
		char t[32];

		format_ms(s->duration_ms, t, sizeof(t));
		printf("%-4u %-24s %-3s %5llu %6llu %11llu %7llu %7llu %8llu "
		       "%8s\n",
		    s->rank, s->session_id, s->final_success ? "yes" : "no",
		    (unsigned long long)s->steps,
		    (unsigned long long)s->failed_steps,
		    (unsigned long long)s->destructive_actions,
		    (unsigned long long)s->files_deleted,
		    (unsigned long long)s->files_created,
		    (unsigned long long)s->files_modified, t);
	}
}

/* html_text: `s` (n bytes) HTML-escaped onto f. Control bytes but tab
 * and newline become U+FFFD so the report stays valid. */
static void
html_text(FILE *f, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		switch (c) {
		case '&':
			fputs("&amp;", f);
			break;
		case '<':
			fputs("&lt;", f);
			break;
		case '>':
			fputs("&gt;", f);
			break;
		case '"':
			fputs("&quot;", f);
			break;
		case '\'':
			fputs("&#39;", f);
			break;
		default:
			if (c < 0x20 && c != '\n' && c != '\t')
				fputs("&#xFFFD;", f);
			else
				fputc(c, f);
		}
	}
}

static void
html_str(FILE *f, const char *s)
{
	html_text(f, s != NULL ? s : "", s != NULL ? strlen(s) : 0);
}

static const char html_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<title>moat compare</title>\n<style>\n"
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\n"
    "table{border-collapse:collapse;margin:1em 0}\n"
    "th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;"
    "vertical-align:top}\n"
    "th{background:#f3f3f3}\n"
    "td.num{text-align:right}\n"
    ".ok{color:#060}.bad{color:#a00}\n"
    "pre{margin:0;white-space:pre-wrap;font-size:.9em}\n"
    "</style>\n</head>\n<body>\n<h1>moat compare</h1>\n";

/* write_session_steps: one session's steps (fetched page by page, no
 * outputs) as an HTML table. Returns MOAT_OK or the call's status, with
 * *errmsg set. */
static int
write_session_steps(struct cli *cli, FILE *f, const Moat__V1__SessionScore *s,
    char **errmsg)
{
	Moat__V1__ListStepsReply *page = NULL;
	char *token = NULL;
	int rv;

	fputs("<h2>", f);
	fprintf(f, "%u. ", s->rank);
	html_str(f, s->session_id);
	fputs("</h2>\n<p>sandbox ", f);
	html_str(f, s->sandbox_id);
	fputs("</p>\n<table>\n<tr><th>step</th><th>exit code</th>"
	      "<th>input</th><th>files</th></tr>\n",
	    f);
	for (;;) {
		rv = moat_client_list_steps(cli_client(cli), s->session_id,
		    token, false, &page, errmsg);
		free(token);
		token = NULL;
		if (rv != MOAT_OK)
			return rv;
		for (size_t i = 0; i < page->n_steps; i++) {
			const Moat__V1__Step *st = page->steps[i];

			fprintf(f,
			    "<tr><td class=\"num\">%llu</td>"
			    "<td class=\"num %s\">%d</td><td><pre>",
			    (unsigned long long)st->index,
			    st->exit_code == 0 ? "ok" : "bad", st->exit_code);
			html_str(f, st->input);
			fputs("</pre></td><td>", f);
			for (size_t j = 0; j < st->n_fs_trace; j++) {
				const Moat__V1__FsTraceEntry *e =
				    st->fs_trace[j];

				fputs(e->change ==
				            MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED ?
				        "+ " :
				        e->change ==
				            MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED ?
				        "- " :
				        "~ ",
				    f);
				html_str(f, e->path);
				fputs("<br>", f);
			}
			fputs("</td></tr>\n", f);
		}
		if (page->next_page_token[0] != '\0' &&
		    (token = strdup(page->next_page_token)) == NULL) {
			moat_client_free_msg(page);
			*errmsg = moat_asprintf("out of memory");
			return MOAT_RESOURCE_EXHAUSTED;
		}
		moat_client_free_msg(page);
		page = NULL;
		if (token == NULL)
			break;
	}
	fputs("</table>\n", f);
	return MOAT_OK;
}

/* write_html: the report, written to path.tmp then renamed, so a failed
 * report leaves no half file. */
static int
write_html(struct cli *cli, const Moat__V1__CompareReply *r, const char *path)
{
	char *tmp = moat_asprintf("%s.tmp", path), *errmsg = NULL;
	FILE *f;
	int rv = MOAT_OK;

	if (tmp == NULL || (f = fopen(tmp, "w")) == NULL) {
		rv = cli_fail(cli, MOAT_INVALID_ARGUMENT,
		    moat_asprintf("cannot write %s: %m", tmp ? tmp : path),
		    "writing the HTML report");
		free(tmp);
		return rv;
	}
	fputs(html_head, f);
	fputs("<h2>Ranking (best first)</h2>\n<table>\n<tr><th>rank</th>"
	      "<th>session</th><th>final success</th><th>steps</th>"
	      "<th>failed</th><th>destructive</th><th>deleted</th>"
	      "<th>created</th><th>modified</th><th>time</th></tr>\n",
	    f);
	for (size_t i = 0; i < r->n_sessions; i++) {
		const Moat__V1__SessionScore *s = r->sessions[i];
		char t[32];

		format_ms(s->duration_ms, t, sizeof(t));
		fprintf(f, "<tr><td class=\"num\">%u</td><td>", s->rank);
		html_str(f, s->session_id);
		fprintf(f,
		    "</td><td class=\"%s\">%s</td>"
		    "<td class=\"num\">%llu</td><td class=\"num\">%llu</td>"
		    "<td class=\"num\">%llu</td><td class=\"num\">%llu</td>"
		    "<td class=\"num\">%llu</td><td class=\"num\">%llu</td>"
		    "<td class=\"num\">",
		    s->final_success ? "ok" : "bad",
		    s->final_success ? "yes" : "no",
		    (unsigned long long)s->steps,
		    (unsigned long long)s->failed_steps,
		    (unsigned long long)s->destructive_actions,
		    (unsigned long long)s->files_deleted,
		    (unsigned long long)s->files_created,
		    (unsigned long long)s->files_modified);
		html_str(f, t);
		fputs("</td></tr>\n", f);
	}
	fputs("</table>\n", f);
	for (size_t i = 0; i < r->n_sessions && rv == MOAT_OK; i++)
		if ((rv = write_session_steps(cli, f, r->sessions[i],
		         &errmsg)) != MOAT_OK)
			rv = cli_fail(cli, rv, errmsg, "steps of session %s",
			    r->sessions[i]->session_id);
	fputs("</body>\n</html>\n", f);
	if (fclose(f) != 0 && rv == MOAT_OK)
		rv = cli_fail(cli, MOAT_INTERNAL, moat_asprintf("%s: %m", tmp),
		    "writing the HTML report");
	if (rv == MOAT_OK && rename(tmp, path) != 0)
		rv = cli_fail(cli, MOAT_INTERNAL,
		    moat_asprintf("renaming "
		                  "%s to %s: %m",
		        tmp, path),
		    "writing the HTML report");
	if (rv != MOAT_OK)
		unlink(tmp);
	free(tmp);
	return rv;
}

int
cmd_compare(struct cli *cli, int argc, char **argv)
{
	Moat__V1__CompareReply *r = NULL;
	char *ids[COMPARE_MAX + 1];
	const char *html = NULL;
	char *errmsg = NULL;
	size_t n = 0;
	int rv;

	argc = take_json(cli, argc, argv);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--html") == 0) {
			if (i + 1 >= argc)
				return cli_usage_error(usage_compare,
				    "--html "
				    "wants a file name");
			html = argv[++i];
		} else if (strncmp(argv[i], "--html=", 7) == 0) {
			html = argv[i] + 7;
		} else if (argv[i][0] == '-') {
			return cli_usage_error(usage_compare,
			    "unknown option "
			    "\"%s\"",
			    argv[i]);
		} else if (n >= COMPARE_MAX) {
			return cli_usage_error(usage_compare,
			    "at most %d "
			    "sessions",
			    COMPARE_MAX);
		} else {
			ids[n++] = argv[i];
		}
	}
	if (n < 2)
		return cli_usage_error(usage_compare,
		    "give at least two "
		    "session ids (`moat session ls` lists them)");
	if (html != NULL && html[0] == '\0')
		return cli_usage_error(usage_compare,
		    "--html wants a file "
		    "name");
	if ((rv = moat_client_compare(cli_client(cli), ids, n, &r, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "comparing %zu sessions", n);
	if (html != NULL)
		rv = write_html(cli, r, html);
	if (rv == MOAT_OK) {
		if (cli->json)
			rv = cli_print_json(cli, r);
		else
			print_ranking(r);
		if (rv == MOAT_OK && html != NULL && !cli->json)
			printf("report: %s\n", html);
	}
	moat_client_free_msg(r);
	return rv;
}
