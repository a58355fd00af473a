/*
 * record_trace.c: the diff of two filesystem traces of one sandbox
 * (moat_trace_diff): what a recorded step changed, as the files added,
 * modified and removed since the trace after the previous step. Pure:
 * no I/O, no state.
 * Not for: taking traces (record.c) or the Diff and Compare calls
 * (diff.c).
 */
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/status.h"

/* ---- the trace diff ---- */

static int
cmp_entry_path(const void *a, const void *b)
{
	const Moat__V1__FsTraceEntry *x = *(Moat__V1__FsTraceEntry *const *)a;
	const Moat__V1__FsTraceEntry *y = *(Moat__V1__FsTraceEntry *const *)b;

	return strcmp(x->path ? x->path : "", y->path ? y->path : "");
}

/* sorted_view: a heap array of the trace's entry pointers (borrowed),
 * sorted by path; NULL with *n 0 for an empty or NULL trace. */
static int
sorted_view(const Moat__V1__FsTrace *t, Moat__V1__FsTraceEntry ***out,
    size_t *n)
{
	*out = NULL;
	*n = 0;
	if (t == NULL || t->n_entries == 0)
		return MOAT_OK;
	if ((*out = malloc(t->n_entries * sizeof(**out))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	memcpy(*out, t->entries, t->n_entries * sizeof(**out));
	*n = t->n_entries;
	qsort(*out, *n, sizeof(**out), cmp_entry_path);
	return MOAT_OK;
}

static bool
same_state(const Moat__V1__FsTraceEntry *a, const Moat__V1__FsTraceEntry *b)
{
	return a->change == b->change && a->type == b->type &&
	    a->size == b->size && a->mode == b->mode &&
	    a->sha256.len == b->sha256.len &&
	    (a->sha256.len == 0 ||
	        memcmp(a->sha256.data, b->sha256.data, a->sha256.len) == 0);
}

/* new_entry: a deep copy of `from` (size, hash, mode and type only when
 * `with_data`) with `change`. NULL on allocation failure. */
static Moat__V1__FsTraceEntry *
new_entry(const Moat__V1__FsTraceEntry *from, Moat__V1__FsChange change,
    bool with_data)
{
	Moat__V1__FsTraceEntry *e = malloc(sizeof(*e));

	if (e == NULL)
		return NULL;
	moat__v1__fs_trace_entry__init(e);
	e->change = change;
	e->type = from->type;
	if ((e->path = strdup(from->path ? from->path : "")) == NULL) {
		free(e);
		return NULL;
	}
	if (!with_data)
		return e;
	e->size = from->size;
	e->mode = from->mode;
	if (from->sha256.len > 0) {
		if ((e->sha256.data = malloc(from->sha256.len)) == NULL) {
			free(e->path);
			free(e);
			return NULL;
		}
		memcpy(e->sha256.data, from->sha256.data, from->sha256.len);
		e->sha256.len = from->sha256.len;
	}
	return e;
}

void
moat_trace_diff_free(Moat__V1__FsTraceEntry **ents, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ents[i] != NULL)
			moat__v1__fs_trace_entry__free_unpacked(ents[i], NULL);
	free(ents);
}

/*
 * Both traces say how the filesystem differs from the image. For a path:
 * - in cur only: it differed from the image only since prev: as cur says;
 * - in both, the same: untouched since prev, not listed;
 * - in both, different: now DELETED -> DELETED; was DELETED and exists
 *   now -> CREATED; else MODIFIED (cur's size and hash);
 * - in prev only: it is back to the image's version: was CREATED ->
 *   DELETED; was DELETED -> CREATED; was MODIFIED -> MODIFIED (the
 *   image's size and hash are not known: left 0 and empty).
 */
int
moat_trace_diff(const Moat__V1__FsTrace *prev, const Moat__V1__FsTrace *cur,
    Moat__V1__FsTraceEntry ***out, size_t *n_out)
{
	Moat__V1__FsTraceEntry **p = NULL, **c = NULL, **res = NULL;
	size_t np = 0, nc = 0, i = 0, j = 0, n = 0;
	int rv;

	*out = NULL;
	*n_out = 0;
	if ((rv = sorted_view(prev, &p, &np)) != MOAT_OK ||
	    (rv = sorted_view(cur, &c, &nc)) != MOAT_OK)
		goto cleanup;
	if (np + nc > 0 && (res = calloc(np + nc, sizeof(*res))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto cleanup;
	}
	while (i < np || j < nc) {
		const Moat__V1__FsTraceEntry *a = i < np ? p[i] : NULL;
		const Moat__V1__FsTraceEntry *b = j < nc ? c[j] : NULL;
		Moat__V1__FsTraceEntry *e = NULL;
		int order = a == NULL ? 1 :
		    b == NULL         ? -1 :
		                        cmp_entry_path(&p[i], &c[j]);

		if (order > 0) {
			e = new_entry(b, b->change, true);
			j++;
		} else if (order < 0) {
			if (a->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED)
				e = new_entry(a,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED,
				    false);
			else if (a->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
				e = new_entry(a,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED,
				    false);
			else
				e = new_entry(a,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED,
				    false);
			i++;
		} else {
			i++;
			j++;
			if (same_state(a, b))
				continue;
			if (b->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
				e = new_entry(b,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED,
				    false);
			else if (a->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
				e = new_entry(b,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED,
				    true);
			else
				e = new_entry(b,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED,
				    true);
		}
		if (e == NULL) {
			rv = MOAT_RESOURCE_EXHAUSTED;
			goto cleanup;
		}
		res[n++] = e;
	}
	if (n > 0) {
		*out = res;
		*n_out = n;
		res = NULL;
	}
	rv = MOAT_OK;
cleanup:
	if (res != NULL)
		moat_trace_diff_free(res, n); /* n entries made so far */
	free(p);
	free(c);
	return rv;
}
