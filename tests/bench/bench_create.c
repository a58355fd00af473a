/*
 * bench_create.c: where create time goes (issue 18, part 5). Against one
 * local stack it measures, round after round and interleaved so the
 * figures share the machine's load: a template clone through the HTTP
 * door (POST /v1/sandboxes, then POST .../exec `true`), the same through
 * the gateway's nng door (moat_client_create, moat_client_exec), the same
 * recorded (record: the first exec adds the session's first filesystem
 * trace), and a cold boot (cold_boot) through each door. For every kind:
 * p50/p95 of the client's create, its first exec and the two together;
 * of each phase the node reports in the reply's CreateTimings
 * (proto/vm.proto); and of the gateway's and door's share (the client's
 * create minus the node's total). Then the ratio template clone / cold
 * boot, create to first exec, p50, per door (goal: at most 0.08).
 * All that on three stacks side by side, round after round in turn:
 * guest RAM on a reflink XFS (the local stack's RAM dir) with [vmd]
 * template-reflink on (clones reflink the template's RAM), the same
 * with it off (the default: clones copy it), and on tmpfs with spare
 * copies
 * (MOAT_BENCH_CREATE_RAM=NAME runs one of them only).
 * It starts the stacks itself (deploy/moat-stack in fresh state
 * directories, HTTP on free ports) and purges them at exit. Not a test:
 * it asserts nothing about time. Run as
 *   MOAT_IMAGE_DIR=images/out moat-bench-create \
 *     tests/bench/results/create.json [ROUNDS]
 */
#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat_client.h"
#include "bench_stack.h"
#include "bench_stats.h"

#define ROUNDS_DEFAULT 10
#define ROUNDS_MAX 500
#define TEMPLATE_WAIT_S 300
#define REPLY_CAP (1u << 20)

/* The node's phases, as CreateTimings names them (JSON and proto), and
 * "other": the node's total less its phases (ram_copy overlaps the VMM's
 * start, so it is not subtracted). */
static const char *const phases[] = { "total", "prepare", "admit", "disk",
	"vmm_spawn", "agent_connect", "qmp_wait", "ram_copy", "ram_wait",
	"device_load", "resume", "reset", "boot_wait", "finish", "other" };
#define N_PHASES (sizeof(phases) / sizeof(phases[0]))

/* What is measured, one row each. */
enum kind {
	K_HTTP_TEMPLATE,
	K_NNG_TEMPLATE,
	K_NNG_RECORDED,
	K_HTTP_COLD,
	K_NNG_COLD,
	K_N
};
static const char *const kind_names[K_N] = { "http_template", "nng_template",
	"nng_template_recorded", "http_cold", "nng_cold" };

/* One kind's samples, ms, one per round. */
struct series {
	double *create, *exec, *total, *overhead;
	double *phase[N_PHASES];
	int n;
};

struct reply {
	char body[REPLY_CAP];
	size_t len;
};

/* One stack under test: where guest RAM lives there, its doors. */
struct target {
	const char *name;    /* its key in the results */
	const char *ramfs;   /* MOAT_STACK_RAMFS when it starts */
	const char *reflink; /* MOAT_VMD_TEMPLATE_REFLINK when it starts */
	const char *what;
	struct bench_stack s;
	char auth_header[300];
	struct moat_client *c;
	CURL *h;
	struct curl_slist *headers;
	struct reply *r;
	struct series ser[K_N];
};

static void
die(const char *what, const char *detail)
{
	bench_stack_die(what, detail);
}

static void
die_rv(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench-create: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	free(msg);
	exit(1);
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct reply *r = arg;
	size_t n = size * nmemb, room = REPLY_CAP - 1 - r->len;

	memcpy(r->body + r->len, data, n < room ? n : room);
	r->len += n < room ? n : room;
	r->body[r->len] = '\0';
	return n;
}

/* http_call: METHOD url with body (NULL: none) on handle h; returns the
 * HTTP status (0: the transport failed). */
static long
http_call(CURL *h, struct reply *r, const char *method, const char *url,
    const char *body)
{
	long status = 0;

	r->len = 0;
	r->body[0] = '\0';
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
	if (curl_easy_perform(h) != CURLE_OK)
		return 0;
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	return status;
}

static CURL *
http_handle(const char *auth_header, struct reply *r,
    struct curl_slist **headers)
{
	CURL *h = curl_easy_init();

	if (h == NULL)
		die("curl", "curl_easy_init failed");
	*headers = curl_slist_append(NULL, auth_header);
	*headers =
	    curl_slist_append(*headers, "Content-Type: application/json");
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, *headers);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 120000L);
	return h;
}

/* The JSON name of a proto field (lowerCamelCase, as the HTTP door
 * writes it). */
static void
json_name(const char *proto, char *buf, size_t cap)
{
	size_t n = 0;
	bool up = false;

	for (const char *p = proto; *p && n + 1 < cap; p++) {
		if (*p == '_') {
			up = true;
			continue;
		}
		buf[n++] = up && *p >= 'a' && *p <= 'z' ? (char)(*p - 32) : *p;
		up = false;
	}
	buf[n] = '\0';
}

/* Reads the phases of a reply's timings into ph (ms; 0 when absent). */
static void
phases_from_proto(const Moat__V1__CreateTimings *t, double ph[N_PHASES])
{
	const double v[N_PHASES] = { t->total_ms, t->prepare_ms, t->admit_ms,
		t->disk_ms, t->vmm_spawn_ms, t->agent_connect_ms,
		t->qmp_wait_ms, t->ram_copy_ms, t->ram_wait_ms,
		t->device_load_ms, t->resume_ms, t->reset_ms, t->boot_wait_ms,
		t->finish_ms, 0 };

	memcpy(ph, v, sizeof(v));
}

static void
phases_from_json(json_t *t, double ph[N_PHASES])
{
	char name[64], field[64];

	for (size_t i = 0; i + 1 < N_PHASES; i++) {
		snprintf(field, sizeof(field), "%s_ms", phases[i]);
		json_name(field, name, sizeof(name));
		ph[i] = json_number_value(json_object_get(t, name));
	}
}

/* ---- one round of each kind ---- */

static void
record_sample(struct series *s, double create, double exec,
    const double ph[N_PHASES])
{
	int i = s->n++;
	double other = ph[0];

	for (size_t p = 1; p + 1 < N_PHASES; p++)
		if (strcmp(phases[p], "ram_copy") != 0)
			other -= ph[p];

	s->create[i] = create;
	s->exec[i] = exec;
	s->total[i] = create + exec;
	s->overhead[i] = create - ph[0];
	for (size_t p = 0; p + 1 < N_PHASES; p++)
		s->phase[p][i] = ph[p];
	s->phase[N_PHASES - 1][i] = other;
}

/* Through the HTTP door: create (cold or a template clone), first exec,
 * destroy (not timed). Returns whether it was a template clone. */
static bool
round_http(struct target *tg, bool cold, struct series *s)
{
	CURL *h = tg->h;
	struct reply *r = tg->r;
	double t0, create, exec, ph[N_PHASES] = { 0 };
	char url[512], id[128];
	json_t *j, *tid;
	json_error_t err;
	bool templated;

	snprintf(url, sizeof(url), "%s/v1/sandboxes", tg->s.http_base);
	t0 = bench_now_ms();
	if (http_call(h, r, "POST", url,
	        cold ? "{\"coldBoot\": true}" : "{}") != 200)
		die("create over HTTP", r->len ? r->body : "no reply");
	create = bench_now_ms() - t0;
	if ((j = json_loads(r->body, 0, &err)) == NULL)
		die("create over HTTP: reply is not JSON", r->body);
	snprintf(id, sizeof(id), "%s",
	    json_string_value(json_object_get(j, "id")) ?: "");
	tid = json_object_get(j, "templateId");
	templated = json_string_value(tid) && json_string_value(tid)[0];
	phases_from_json(json_object_get(j, "timings"), ph);
	json_decref(j);
	if (id[0] == '\0')
		die("create over HTTP: no id", r->body);
	snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/exec", tg->s.http_base,
	    id);
	t0 = bench_now_ms();
	if (http_call(h, r, "POST", url, "{\"argv\": [\"true\"]}") != 200 ||
	    strstr(r->body, "\"exited\"") == NULL)
		die("first exec over HTTP", r->len ? r->body : "no reply");
	exec = bench_now_ms() - t0;
	snprintf(url, sizeof(url), "%s/v1/sandboxes/%s", tg->s.http_base, id);
	if (http_call(h, r, "DELETE", url, NULL) != 200)
		fprintf(stderr, "bench-create: destroy %s: %s\n", id, r->body);
	if (s != NULL)
		record_sample(s, create, exec, ph);
	return templated;
}

/* Through the gateway's nng door (moat_client), the same. */
static bool
round_nng(struct target *tg, bool cold, bool record, struct series *s)
{
	struct moat_client *c = tg->c;
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ereq = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *res = NULL;
	Moat__V1__Sandbox *sb = NULL;
	char *argv[] = { (char *)"true" };
	double t0, create, exec, ph[N_PHASES] = { 0 };
	char id[128], *msg = NULL;
	bool templated;
	int rv;

	creq.cold_boot = cold;
	creq.record = record;
	t0 = bench_now_ms();
	if ((rv = moat_client_create(c, &creq, &sb, &msg)) != MOAT_OK)
		die_rv("create over nng", rv, msg);
	create = bench_now_ms() - t0;
	snprintf(id, sizeof(id), "%s", sb->id);
	templated = sb->template_id && sb->template_id[0];
	if (sb->timings != NULL)
		phases_from_proto(sb->timings, ph);
	moat_client_free_msg(sb);
	ereq.sandbox_id = id;
	ereq.n_argv = 1;
	ereq.argv = argv;
	t0 = bench_now_ms();
	if ((rv = moat_client_exec(c, &ereq, &res, &msg)) != MOAT_OK)
		die_rv("first exec over nng", rv, msg);
	exec = bench_now_ms() - t0;
	if (res->status == NULL || res->status->exit_code != 0)
		die("first exec over nng", "`true` did not exit 0");
	moat_client_free_msg(res);
	if ((rv = moat_client_destroy(c, id, &msg)) != MOAT_OK) {
		fprintf(stderr, "bench-create: destroy %s: %s\n", id,
		    msg ? msg : "");
		free(msg);
	}
	if (s != NULL)
		record_sample(s, create, exec, ph);
	return templated;
}

/* ---- results ---- */

static double
p50_of(double *v, int n)
{
	return bench_percentile(v, (size_t)n, 0.50);
}

static json_t *
series_json(struct series *s)
{
	json_t *o = json_object(), *ph = json_object(),
	       *samples = json_array();

	/* Samples first: bench_summary sorts in place. */
	for (int i = 0; i < s->n; i++)
		json_array_append_new(samples, json_real(s->total[i]));
	json_object_set_new(o, "create_to_first_exec_samples_ms", samples);
	json_object_set_new(o, "create",
	    bench_summary(s->create, (size_t)s->n));
	json_object_set_new(o, "first_exec",
	    bench_summary(s->exec, (size_t)s->n));
	json_object_set_new(o, "create_to_first_exec",
	    bench_summary(s->total, (size_t)s->n));
	json_object_set_new(o, "gateway_and_door",
	    bench_summary(s->overhead, (size_t)s->n));
	for (size_t p = 0; p < N_PHASES; p++)
		json_object_set_new(ph, phases[p],
		    bench_summary(s->phase[p], (size_t)s->n));
	json_object_set_new(o, "node_phases", ph);
	return o;
}

static void
series_alloc(struct series *s, int rounds)
{
	memset(s, 0, sizeof(*s));
	s->create = calloc((size_t)rounds, sizeof(double));
	s->exec = calloc((size_t)rounds, sizeof(double));
	s->total = calloc((size_t)rounds, sizeof(double));
	s->overhead = calloc((size_t)rounds, sizeof(double));
	if (!s->create || !s->exec || !s->total || !s->overhead)
		die("main", "out of memory");
	for (size_t p = 0; p < N_PHASES; p++)
		if ((s->phase[p] = calloc((size_t)rounds, sizeof(double))) ==
		    NULL)
			die("main", "out of memory");
}

static void
series_free(struct series *s)
{
	free(s->create);
	free(s->exec);
	free(s->total);
	free(s->overhead);
	for (size_t p = 0; p < N_PHASES; p++)
		free(s->phase[p]);
}

/* Starts tg's stack (MOAT_STACK_RAMFS as tg says), opens its doors and
 * waits until its creates are template clones (the first boots cold
 * and makes the template in the background). */
static void
target_start(struct target *tg, int rounds)
{
	char *msg = NULL;
	double t0;
	int rv, tries;

	for (int k = 0; k < K_N; k++)
		series_alloc(&tg->ser[k], rounds);
	if ((tg->r = calloc(1, sizeof(*tg->r))) == NULL)
		die("main", "out of memory");
	setenv("MOAT_STACK_RAMFS", tg->ramfs, 1);
	setenv("MOAT_VMD_TEMPLATE_REFLINK", tg->reflink, 1);
	bench_stack_start(&tg->s, "create", MOAT_REPO_DIR, MOAT_BIN_DIR,
	    false);
	unsetenv("MOAT_STACK_RAMFS");
	unsetenv("MOAT_VMD_TEMPLATE_REFLINK");
	snprintf(tg->auth_header, sizeof(tg->auth_header),
	    "Authorization: Bearer %s", tg->s.api_key);
	if ((rv = moat_client_open(&tg->c, tg->s.gateway_url, tg->s.api_key,
	         &msg)) != MOAT_OK)
		die_rv("open", rv, msg);
	tg->h = http_handle(tg->auth_header, tg->r, &tg->headers);
	t0 = bench_now_ms();
	for (tries = 0; !round_nng(tg, false, false, NULL); tries++) {
		if (bench_now_ms() - t0 > TEMPLATE_WAIT_S * 1000.0)
			die("template", "no template clone after 300 s");
		sleep(2);
	}
	fprintf(stderr, "%s: template ready after %.0f ms (%d cold creates)\n",
	    tg->name, bench_now_ms() - t0, tries);
	(void)round_http(tg, false, NULL); /* the HTTP path warmed once */
}

/* One round of every kind on tg, in an order rotated by `i`. */
static void
target_round(struct target *tg, int i)
{
	for (int j = 0; j < K_N; j++) {
		int k = (i + j) % K_N;
		struct series *s = &tg->ser[k];
		bool ok;

		switch (k) {
		case K_HTTP_TEMPLATE:
			ok = round_http(tg, false, s);
			break;
		case K_NNG_TEMPLATE:
			ok = round_nng(tg, false, false, s);
			break;
		case K_NNG_RECORDED:
			ok = round_nng(tg, false, true, s);
			break;
		case K_HTTP_COLD:
			ok = !round_http(tg, true, s);
			break;
		default:
			ok = !round_nng(tg, true, false, s);
			break;
		}
		if (!ok)
			die(kind_names[k],
			    "a create was not of the kind asked "
			    "(template clone or cold boot)");
	}
	fprintf(stderr, "%s round %d: http clone %.0f ms, cold %.0f ms\n",
	    tg->name, i + 1, tg->ser[K_HTTP_TEMPLATE].total[i],
	    tg->ser[K_HTTP_COLD].total[i]);
}

/* tg's results: its kinds, and the ratios clone / cold at p50. */
static json_t *
target_json(struct target *tg, int rounds)
{
	struct series *ser = tg->ser;
	json_t *kinds = json_object();
	double ht, hc, nt, nc, nr, ne;

	/* The samples in round order, before the summaries sort them. */
	for (int k = 0; k < K_N; k++)
		json_object_set_new(kinds, kind_names[k],
		    series_json(&ser[k]));
	ht = p50_of(ser[K_HTTP_TEMPLATE].total, rounds);
	hc = p50_of(ser[K_HTTP_COLD].total, rounds);
	nt = p50_of(ser[K_NNG_TEMPLATE].total, rounds);
	nc = p50_of(ser[K_NNG_COLD].total, rounds);
	nr = p50_of(ser[K_NNG_RECORDED].exec, rounds);
	ne = p50_of(ser[K_NNG_TEMPLATE].exec, rounds);
	fprintf(stderr,
	    "%s: create -> first exec p50: clone %.0f / cold %.0f ms over "
	    "HTTP (%.3f), %.0f / %.0f over nng (%.3f)\n",
	    tg->name, ht, hc, hc > 0 ? ht / hc : 0.0, nt, nc,
	    nc > 0 ? nt / nc : 0.0);
	return json_pack("{s:s, s:o, s:f, s:f, s:f}", "guest_ram", tg->what,
	    "kinds", kinds, "clone_over_cold_http_p50", hc > 0 ? ht / hc : 0.0,
	    "clone_over_cold_nng_p50", nc > 0 ? nt / nc : 0.0,
	    "recorded_first_exec_added_p50_ms", nr - ne);
}

int
main(int argc, char **argv)
{
	struct target tg[3] = {
		{ .name = "xfs_reflink",
		    .ramfs = "1",
		    .reflink = "on",
		    .what = "the local stack's RAM dir, an XFS with reflinks "
		            "(deploy/ramfs.sh), and template-reflink on: a "
		            "clone's RAM is a reflink of the template's, kept "
		            "in the RAM dir" },
		{ .name = "xfs_copy",
		    .ramfs = "1",
		    .reflink = "off",
		    .what =
		        "the same XFS, template-reflink off (the default): "
		        "a clone copies the template's RAM from the state "
		        "dir while its VMM starts" },
		{ .name = "tmpfs_spares",
		    .ramfs = "0",
		    .reflink = "on",
		    .what = "/dev/shm (MOAT_STACK_RAMFS=0): a clone takes a "
		            "spare copy of the template's RAM, or copies it" },
	};
	int n_tg = 3;
	int rounds = argc > 2 ? atoi(argv[2]) : ROUNDS_DEFAULT;
	const char *only = getenv("MOAT_BENCH_CREATE_RAM");
	json_t *out, *stacks;

	if (argc < 2) {
		fprintf(stderr,
		    "usage: moat-bench-create OUT.json [ROUNDS]\n");
		return 2;
	}
	if (rounds < 1 || rounds > ROUNDS_MAX)
		rounds = ROUNDS_DEFAULT;
	/* MOAT_BENCH_CREATE_RAM=xfs_reflink (xfs_copy, tmpfs_spares): that
	 * stack only. */
	if (only != NULL && only[0] != '\0') {
		int t = 0;

		while (t < n_tg && strcmp(only, tg[t].name) != 0)
			t++;
		if (t == n_tg)
			die("MOAT_BENCH_CREATE_RAM",
			    "give xfs_reflink, xfs_copy or tmpfs_spares (or "
			    "leave it unset for all three, side by side)");
		tg[0] = tg[t];
		n_tg = 1;
	}
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0)
		die("curl", "curl_global_init failed");
	for (int t = 0; t < n_tg; t++)
		target_start(&tg[t], rounds);
	/* Round after round, each stack in turn (which first alternates),
	 * so both see the machine's load alike. */
	for (int i = 0; i < rounds; i++)
		for (int t = 0; t < n_tg; t++)
			target_round(&tg[(i + t) % n_tg], i);

	stacks = json_object();
	for (int t = 0; t < n_tg; t++) {
		curl_easy_cleanup(tg[t].h);
		curl_slist_free_all(tg[t].headers);
		moat_client_close(tg[t].c);
		json_object_set_new(stacks, tg[t].name,
		    target_json(&tg[t], rounds));
	}
	out = json_pack("{s:s, s:i, s:i, s:s, s:o, s:f}", "bench", "create",
	    "rounds", rounds, "host_cpus", (int)sysconf(_SC_NPROCESSORS_ONLN),
	    "note",
	    "create -> first exec (`true`); kinds interleaved in each round, "
	    "the stacks in turn; node_phases from the reply's CreateTimings "
	    "(other = the node's total less its phases); gateway_and_door = "
	    "client create - node total; recorded_first_exec_added = first "
	    "exec of a recorded clone (its first filesystem trace, the "
	    "session's step) - of an unrecorded one",
	    "stacks", stacks, "goal_ratio_max", 0.08);
	if (out == NULL || json_dump_file(out, argv[1], JSON_INDENT(2)) != 0)
		die("cannot write", argv[1]);
	json_decref(out);
	for (int t = 0; t < n_tg; t++) {
		for (int k = 0; k < K_N; k++)
			series_free(&tg[t].ser[k]);
		free(tg[t].r);
	}
	curl_global_cleanup();
	return 0;
}
