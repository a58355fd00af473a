/*
 * diff.c: the gateway's Diff and Compare calls (issue 3). Diff lines two
 * recorded sessions up step by step (by position: step 1 with step 1)
 * and says where they first part, what differs in each step (input, exit
 * code, outputs, files) and how the sessions' net effects on the
 * filesystem differ; Compare scores N sessions and ranks them. The
 * building is pure (moat_diff_build, moat_compare_build: unit-tested
 * without services); the handlers fetch sessions and steps from
 * moat-sessiond through record.c's client, with the caller's tenant.
 * Not for: recording (record.c) or the trace diff between two fs traces
 * of one sandbox (record_trace.c's moat_trace_diff).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/safety.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define COMPARE_MIN 2
#define COMPARE_MAX 32
#define FETCH_MAX_STEPS 100000 /* per session: a bound on memory */
#define FETCH_PAGE_SIZE 1000

/* ---- file changes ---- */

/* One file's change, as a step or a whole session left it. */
struct file_change {
	const char *path; /* borrowed from a step */
	int change;       /* MOAT__V1__FS_CHANGE__*, or -1: none */
	const ProtobufCBinaryData *sha256; /* borrowed; NULL: unknown */
};

static const char *
change_name(int change)
{
	switch (change) {
	case MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED:
		return "created";
	case MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED:
		return "modified";
	case MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED:
		return "deleted";
	}
	return "";
}

static char *
hex_of(const ProtobufCBinaryData *d)
{
	static const char digits[] = "0123456789abcdef";
	size_t n = d != NULL ? d->len : 0;
	char *s = malloc(2 * n + 1);

	if (s == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		s[2 * i] = digits[d->data[i] >> 4];
		s[2 * i + 1] = digits[d->data[i] & 15];
	}
	s[2 * n] = '\0';
	return s;
}

static bool
same_hash(const ProtobufCBinaryData *x, const ProtobufCBinaryData *y)
{
	size_t nx = x != NULL ? x->len : 0, ny = y != NULL ? y->len : 0;

	return nx == ny && (nx == 0 || memcmp(x->data, y->data, nx) == 0);
}

static int
cmp_change_path(const void *a, const void *b)
{
	const struct file_change *x = a, *y = b;

	return strcmp(x->path, y->path);
}

/* changes_of_step: the step's trace as file changes sorted by path (a
 * path listed twice keeps its last entry). *out heap (caller frees),
 * NULL when none. */
static int
changes_of_step(const Moat__V1__Step *st, struct file_change **out, size_t *n)
{
	struct file_change *c;
	size_t k = 0;

	*out = NULL;
	*n = 0;
	if (st == NULL || st->n_fs_trace == 0)
		return MOAT_OK;
	if ((c = calloc(st->n_fs_trace, sizeof(*c))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < st->n_fs_trace; i++) {
		const Moat__V1__FsTraceEntry *e = st->fs_trace[i];

		if (e == NULL || e->path == NULL)
			continue;
		c[k].path = e->path;
		c[k].change = (int)e->change;
		c[k].sha256 = &e->sha256;
		k++;
	}
	/* A trace lists a path once (moat_trace_diff). */
	qsort(c, k, sizeof(*c), cmp_change_path);
	*out = c;
	*n = k;
	return MOAT_OK;
}

/* fold: the net change of `prev` followed by `next` on one path; -1 when
 * nothing is left (created then deleted). */
static int
fold(int prev, int next)
{
	enum {
		C = MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED,
		M = MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED,
		D = MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED,
	};

	if (prev < 0)
		return next;
	if (prev == C)
		return next == D ? -1 : C;
	if (prev == M)
		return next == D ? D : M;
	/* deleted before: it existed at the start */
	return next == D ? D : M;
}

/* net_changes: the whole session's net effect, sorted by path. */
static int
net_changes(const struct moat_session_view *s, struct file_change **out,
    size_t *n_out)
{
	struct file_change *all = NULL, *net = NULL;
	size_t total = 0, k = 0, n = 0;

	*out = NULL;
	*n_out = 0;
	for (size_t i = 0; i < s->n_steps; i++)
		if (s->steps[i] != NULL)
			total += s->steps[i]->n_fs_trace;
	if (total == 0)
		return MOAT_OK;
	if ((all = calloc(total, sizeof(*all))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	/* in step order; a stable sort by path keeps that order per path */
	for (size_t i = 0; i < s->n_steps; i++) {
		const Moat__V1__Step *st = s->steps[i];

		for (size_t j = 0; st != NULL && j < st->n_fs_trace; j++) {
			const Moat__V1__FsTraceEntry *e = st->fs_trace[j];

			if (e == NULL || e->path == NULL)
				continue;
			all[k].path = e->path;
			all[k].change = (int)e->change;
			all[k].sha256 = &e->sha256;
			k++;
		}
	}
	/* A bottom-up merge sort by path: stable, so each path's entries
	 * stay in step order for the fold. */
	{
		struct file_change *tmp = calloc(k ? k : 1, sizeof(*tmp));

		if (tmp == NULL) {
			free(all);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		for (size_t width = 1; width < k; width *= 2) {
			for (size_t lo = 0; lo < k; lo += 2 * width) {
				size_t mid = lo + width < k ? lo + width : k;
				size_t hi =
				    lo + 2 * width < k ? lo + 2 * width : k;
				size_t x = lo, y = mid, t = lo;

				while (x < mid && y < hi)
					tmp[t++] = strcmp(all[y].path,
					               all[x].path) < 0 ?
					    all[y++] :
					    all[x++];
				while (x < mid)
					tmp[t++] = all[x++];
				while (y < hi)
					tmp[t++] = all[y++];
			}
			memcpy(all, tmp, k * sizeof(*all));
		}
		free(tmp);
	}
	if ((net = calloc(k ? k : 1, sizeof(*net))) == NULL) {
		free(all);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < k;) {
		size_t j = i;
		int change = -1;
		const ProtobufCBinaryData *sha = NULL;

		for (; j < k && strcmp(all[j].path, all[i].path) == 0; j++) {
			change = fold(change, all[j].change);
			sha = all[j].sha256;
		}
		if (change >= 0) {
			net[n].path = all[i].path;
			net[n].change = change;
			net[n].sha256 =
			    change == MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED ?
			    NULL :
			    sha;
			n++;
		}
		i = j;
	}
	free(all);
	if (n == 0) {
		free(net);
		return MOAT_OK;
	}
	*out = net;
	*n_out = n;
	return MOAT_OK;
}

static bool
changes_equal(const struct file_change *x, const struct file_change *y)
{
	int cx = x != NULL ? x->change : -1, cy = y != NULL ? y->change : -1;

	if (cx != cy)
		return false;
	if (cx == MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED || cx < 0)
		return true;
	return same_hash(x->sha256, y->sha256);
}

static Moat__V1__FileDiff *
file_diff_new(const struct file_change *x, const struct file_change *y)
{
	Moat__V1__FileDiff *f = malloc(sizeof(*f));

	if (f == NULL)
		return NULL;
	moat__v1__file_diff__init(f);
	f->path = strdup(x != NULL ? x->path : y->path);
	f->change_a = strdup(change_name(x != NULL ? x->change : -1));
	f->change_b = strdup(change_name(y != NULL ? y->change : -1));
	f->sha256_a = hex_of(x != NULL ? x->sha256 : NULL);
	f->sha256_b = hex_of(y != NULL ? y->sha256 : NULL);
	if (f->path == NULL || f->change_a == NULL || f->change_b == NULL ||
	    f->sha256_a == NULL || f->sha256_b == NULL) {
		moat__v1__file_diff__free_unpacked(f, NULL);
		return NULL;
	}
	return f;
}

/* diff_changes: the FileDiffs of two sorted change lists, appended to
 * *files / *n (a heap array grown here). */
static int
diff_changes(const struct file_change *a, size_t na,
    const struct file_change *b, size_t nb, Moat__V1__FileDiff ***files,
    size_t *n)
{
	size_t i = 0, j = 0;

	while (i < na || j < nb) {
		const struct file_change *x = NULL, *y = NULL;
		Moat__V1__FileDiff **grown;
		int c;

		if (i >= na)
			c = 1;
		else if (j >= nb)
			c = -1;
		else
			c = strcmp(a[i].path, b[j].path);
		if (c <= 0)
			x = &a[i++];
		if (c >= 0)
			y = &b[j++];
		if (changes_equal(x, y))
			continue;
		if ((grown = realloc(*files, (*n + 1) * sizeof(*grown))) ==
		    NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		*files = grown;
		if ((grown[*n] = file_diff_new(x, y)) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		(*n)++;
	}
	return MOAT_OK;
}

/* ---- Diff ---- */

static bool
bytes_equal(const ProtobufCBinaryData *x, const ProtobufCBinaryData *y)
{
	return x->len == y->len &&
	    (x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
}

static const Moat__V1__Step *
step_at(const struct moat_session_view *s, size_t i)
{
	return i < s->n_steps ? s->steps[i] : NULL;
}

static int
step_diff(const Moat__V1__Step *sa, const Moat__V1__Step *sb, uint64_t index,
    Moat__V1__StepDiff **out)
{
	Moat__V1__StepDiff *d = malloc(sizeof(*d));
	struct file_change *ca = NULL, *cb = NULL;
	size_t na = 0, nb = 0;
	int rv;

	*out = NULL;
	if (d == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	moat__v1__step_diff__init(d);
	*out = d;
	d->index = index;
	d->in_a = sa != NULL;
	d->in_b = sb != NULL;
	d->input_a = strdup(sa != NULL && sa->input ? sa->input : "");
	d->input_b = strdup(sb != NULL && sb->input ? sb->input : "");
	if (d->input_a == NULL || d->input_b == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	d->exit_code_a = sa != NULL ? sa->exit_code : 0;
	d->exit_code_b = sb != NULL ? sb->exit_code : 0;
	if (sa != NULL && sb != NULL) {
		d->input_differs = strcmp(d->input_a, d->input_b) != 0;
		d->stdout_differs = !bytes_equal(&sa->stdout, &sb->stdout);
		d->stderr_differs = !bytes_equal(&sa->stderr, &sb->stderr);
	} else {
		d->input_differs = true;
		d->stdout_differs = true;
		d->stderr_differs = true;
	}
	if ((rv = changes_of_step(sa, &ca, &na)) != MOAT_OK ||
	    (rv = changes_of_step(sb, &cb, &nb)) != MOAT_OK ||
	    (rv = diff_changes(ca, na, cb, nb, &d->files, &d->n_files)) !=
	        MOAT_OK)
		goto done;
	d->same = sa != NULL && sb != NULL && !d->input_differs &&
	    d->exit_code_a == d->exit_code_b && !d->stdout_differs &&
	    !d->stderr_differs && d->n_files == 0;
done:
	free(ca);
	free(cb);
	return rv;
}

int
moat_diff_build(const struct moat_session_view *a,
    const struct moat_session_view *b, Moat__V1__DiffReply *out)
{
	size_t n = a->n_steps > b->n_steps ? a->n_steps : b->n_steps;
	struct file_change *na = NULL, *nb = NULL;
	size_t n_na = 0, n_nb = 0;
	int rv = MOAT_RESOURCE_EXHAUSTED;

	out->session_a = strdup(a->session_id ? a->session_id : "");
	out->session_b = strdup(b->session_id ? b->session_id : "");
	if (out->session_a == NULL || out->session_b == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	out->steps_a = a->n_steps;
	out->steps_b = b->n_steps;
	if (n > 0 && (out->steps = calloc(n, sizeof(*out->steps))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < n; i++) {
		Moat__V1__StepDiff *d = NULL;

		rv = step_diff(step_at(a, i), step_at(b, i), i + 1, &d);
		if (d != NULL)
			out->steps[out->n_steps++] = d;
		if (rv != MOAT_OK)
			return rv;
		if (!d->same && out->first_divergent_step == 0)
			out->first_divergent_step = i + 1;
	}
	if ((rv = net_changes(a, &na, &n_na)) != MOAT_OK ||
	    (rv = net_changes(b, &nb, &n_nb)) != MOAT_OK)
		goto done;
	rv = diff_changes(na, n_na, nb, n_nb, &out->files, &out->n_files);
done:
	free(na);
	free(nb);
	return rv;
}

/* ---- Compare ---- */

/* step_command: what a step ran, as shell text for the classifier: its
 * input, or, for an exec run without a shell, its argv with each word
 * single-quoted (the recorded input joins argv with spaces, which loses
 * `sh -c 'rm -rf x'`'s quoting). Heap (caller frees); NULL when out of
 * memory. */
static char *
step_command(const Moat__V1__Step *st)
{
	size_t len = 1;
	char *s, *p;

	if (st->n_argv == 0)
		return strdup(st->input != NULL ? st->input : "");
	for (size_t i = 0; i < st->n_argv; i++)
		len += 4 * strlen(st->argv[i]) + 3;
	if ((s = malloc(len)) == NULL)
		return NULL;
	p = s;
	for (size_t i = 0; i < st->n_argv; i++) {
		if (i > 0)
			*p++ = ' ';
		*p++ = '\'';
		for (const char *c = st->argv[i]; *c != '\0'; c++) {
			if (*c == '\'') { /* ' -> '\'' */
				memcpy(p, "'\\''", 4);
				p += 4;
			} else {
				*p++ = *c;
			}
		}
		*p++ = '\'';
	}
	*p = '\0';
	return s;
}

struct ranked {
	Moat__V1__SessionScore *score;
	size_t order;
};

static int
cmp_score(const void *pa, const void *pb)
{
	const struct ranked *ra = pa, *rb = pb;
	const Moat__V1__SessionScore *x = ra->score, *y = rb->score;

	if (x->final_success != y->final_success)
		return x->final_success ? -1 : 1;
#define CMP_FEWER(f)                                                          \
	if (x->f != y->f)                                                     \
	return x->f < y->f ? -1 : 1
	CMP_FEWER(failed_steps);
	CMP_FEWER(destructive_actions);
	CMP_FEWER(files_deleted);
	CMP_FEWER(duration_ms);
#undef CMP_FEWER
	return ra->order < rb->order ? -1 : ra->order > rb->order;
}

static int
score_of(const struct moat_session_view *s, Moat__V1__SessionScore **out)
{
	Moat__V1__SessionScore *sc = malloc(sizeof(*sc));
	struct file_change *net = NULL;
	size_t n_net = 0;
	uint64_t first = 0, last = 0;
	int rv;

	*out = NULL;
	if (sc == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	moat__v1__session_score__init(sc);
	*out = sc;
	sc->session_id = strdup(s->session_id ? s->session_id : "");
	sc->sandbox_id = strdup(
	    s->info != NULL && s->info->sandbox_id ? s->info->sandbox_id : "");
	if (sc->session_id == NULL || sc->sandbox_id == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	sc->created_ms = s->info != NULL ? s->info->created_ms : 0;
	sc->steps = s->n_steps;
	for (size_t i = 0; i < s->n_steps; i++) {
		const Moat__V1__Step *st = s->steps[i];
		struct moat_safety_verdict v;
		char *command;

		if (st == NULL)
			continue;
		if (st->exit_code != 0)
			sc->failed_steps++;
		if ((command = step_command(st)) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		v = moat_safety_classify(command, st->language);
		free(command);
		if (v.level >= MOAT_SAFETY_DESTRUCTIVE)
			sc->destructive_actions++;
		if (st->started_ms != 0 &&
		    (first == 0 || st->started_ms < first))
			first = st->started_ms;
		if (st->ended_ms > last)
			last = st->ended_ms;
	}
	sc->final_success = s->n_steps > 0 &&
	    s->steps[s->n_steps - 1] != NULL &&
	    s->steps[s->n_steps - 1]->exit_code == 0;
	sc->duration_ms = first != 0 && last > first ? last - first : 0;
	if ((rv = net_changes(s, &net, &n_net)) != MOAT_OK)
		return rv;
	for (size_t i = 0; i < n_net; i++) {
		if (net[i].change == MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED)
			sc->files_created++;
		else if (net[i].change ==
		    MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED)
			sc->files_modified++;
		else
			sc->files_deleted++;
	}
	free(net);
	return MOAT_OK;
}

int
moat_compare_build(const struct moat_session_view *sessions, size_t n,
    Moat__V1__CompareReply *out)
{
	struct ranked *r;
	int rv = MOAT_OK;

	if (n == 0)
		return MOAT_OK;
	if ((out->sessions = calloc(n, sizeof(*out->sessions))) == NULL ||
	    (r = calloc(n, sizeof(*r))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < n; i++) {
		Moat__V1__SessionScore *sc = NULL;

		rv = score_of(&sessions[i], &sc);
		if (sc != NULL)
			out->sessions[out->n_sessions++] = sc;
		if (rv != MOAT_OK) {
			free(r);
			return rv;
		}
		r[i].score = sc;
		r[i].order = i;
	}
	qsort(r, n, sizeof(*r), cmp_score);
	for (size_t i = 0; i < n; i++) {
		out->sessions[i] = r[i].score;
		out->sessions[i]->rank = (uint32_t)(i + 1);
	}
	free(r);
	return MOAT_OK;
}

/* ---- fetching from sessiond ---- */

/* A session and its steps as fetched: owned. */
struct fetched {
	Moat__V1__SessionInfo *info;
	Moat__V1__Step **steps;
	size_t n_steps;
};

static void
fetched_fini(struct fetched *f)
{
	if (f->info != NULL)
		moat__v1__session_info__free_unpacked(f->info, NULL);
	for (size_t i = 0; i < f->n_steps; i++)
		moat__v1__step__free_unpacked(f->steps[i], NULL);
	free(f->steps);
	memset(f, 0, sizeof(*f));
}

/* fetch: GetSession then every page of ListSteps of `id` as `tenant`.
 * Errors through moat_rpc_error (NOT_FOUND names the session). */
static int
fetch(struct moat_record *rec, struct moat_rpc_call *call, const char *id,
    const char *tenant, bool outputs, struct fetched *f)
{
	Moat__V1__GetSessionRequest greq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *token = NULL, *err = NULL;
	int rv;

	memset(f, 0, sizeof(*f));
	greq.tenant = (char *)tenant;
	greq.session_id = (char *)id;
	if ((rv = moat_record_sessiond_call(rec, "GetSession", &greq.base,
	         &moat__v1__session_info__descriptor, &reply, call->request_id,
	         call->deadline_ms, &err)) != MOAT_OK) {
		if (rv == MOAT_NOT_FOUND)
			rv = moat_rpc_error(call, rv,
			    "session %s does not "
			    "exist: `moat session ls` lists the sessions",
			    id);
		else
			rv = moat_rpc_error(call, rv, "session %s: %s", id,
			    err);
		free(err);
		return rv;
	}
	f->info = (Moat__V1__SessionInfo *)reply;
	lreq.tenant = (char *)tenant;
	lreq.session_id = (char *)id;
	lreq.page_size = FETCH_PAGE_SIZE;
	lreq.include_outputs = outputs;
	for (;;) {
		Moat__V1__ListStepsReply *page;
		Moat__V1__Step **grown;

		lreq.page_token = token != NULL ? token : (char *)"";
		if ((rv = moat_record_sessiond_call(rec, "ListSteps",
		         &lreq.base, &moat__v1__list_steps_reply__descriptor,
		         &reply, moat_rpc_new_request_id(), call->deadline_ms,
		         &err)) != MOAT_OK) {
			rv = moat_rpc_error(call, rv,
			    "steps of session %s: "
			    "%s",
			    id, err);
			goto fail;
		}
		page = (Moat__V1__ListStepsReply *)reply;
		if (f->n_steps + page->n_steps > FETCH_MAX_STEPS) {
			protobuf_c_message_free_unpacked(reply, NULL);
			rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "session %s has more than %d steps: too many to "
			    "diff",
			    id, FETCH_MAX_STEPS);
			goto fail;
		}
		grown = realloc(f->steps,
		    (f->n_steps + page->n_steps + 1) * sizeof(*grown));
		if (grown == NULL) {
			protobuf_c_message_free_unpacked(reply, NULL);
			rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory reading session %s", id);
			goto fail;
		}
		f->steps = grown;
		/* The steps change hands: the page keeps an empty list. */
		for (size_t i = 0; i < page->n_steps; i++)
			f->steps[f->n_steps++] = page->steps[i];
		page->n_steps = 0;
		free(token);
		token = NULL;
		if (page->next_page_token != NULL &&
		    page->next_page_token[0] != '\0' &&
		    (token = strdup(page->next_page_token)) == NULL) {
			protobuf_c_message_free_unpacked(reply, NULL);
			rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory reading session %s", id);
			goto fail;
		}
		protobuf_c_message_free_unpacked(reply, NULL);
		if (token == NULL)
			break;
	}
	return MOAT_OK;
fail:
	free(err);
	free(token);
	fetched_fini(f);
	return rv;
}

static void
view_of(const struct fetched *f, const char *id, struct moat_session_view *v)
{
	v->session_id = id;
	v->info = f->info;
	v->steps = f->steps;
	v->n_steps = f->n_steps;
}

int
moat_diff_handle(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply,
    const char *tenant)
{
	const Moat__V1__DiffRequest *req = (const void *)request;
	struct fetched fa, fb;
	struct moat_session_view va, vb;
	int rv;

	if (req->session_a == NULL || req->session_a[0] == '\0' ||
	    req->session_b == NULL || req->session_b[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "Diff "
		    "wants two session ids (session_a, session_b): `moat "
		    "session ls` lists them");
	if ((rv = fetch(rec, call, req->session_a, tenant, true, &fa)) !=
	    MOAT_OK)
		return rv;
	if ((rv = fetch(rec, call, req->session_b, tenant, true, &fb)) !=
	    MOAT_OK) {
		fetched_fini(&fa);
		return rv;
	}
	view_of(&fa, req->session_a, &va);
	view_of(&fb, req->session_b, &vb);
	rv = moat_diff_build(&va, &vb, (Moat__V1__DiffReply *)reply);
	fetched_fini(&fa);
	fetched_fini(&fb);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv,
		    "out of memory diffing %s "
		    "and %s",
		    req->session_a, req->session_b);
	return MOAT_OK;
}

int
moat_compare_handle(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply,
    const char *tenant)
{
	const Moat__V1__CompareRequest *req = (const void *)request;
	struct fetched *f;
	struct moat_session_view *v;
	size_t n = req->n_session_ids, got = 0;
	int rv = MOAT_OK;

	if (n < COMPARE_MIN || n > COMPARE_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "Compare "
		    "wants %d to %d session ids, not %zu",
		    COMPARE_MIN, COMPARE_MAX, n);
	for (size_t i = 0; i < n; i++)
		if (req->session_ids[i] == NULL ||
		    req->session_ids[i][0] == '\0')
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "session id %zu of Compare is empty", i + 1);
	f = calloc(n, sizeof(*f));
	v = calloc(n, sizeof(*v));
	if (f == NULL || v == NULL) {
		free(f);
		free(v);
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	}
	for (; got < n; got++) {
		if ((rv = fetch(rec, call, req->session_ids[got], tenant,
		         false, &f[got])) != MOAT_OK)
			goto done;
		view_of(&f[got], req->session_ids[got], &v[got]);
	}
	if ((rv = moat_compare_build(v, n, (Moat__V1__CompareReply *)reply)) !=
	    MOAT_OK)
		rv = moat_rpc_error(call, rv,
		    "out of memory comparing "
		    "sessions");
done:
	for (size_t i = 0; i < got; i++)
		fetched_fini(&f[i]);
	free(f);
	free(v);
	return rv;
}
