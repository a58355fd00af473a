/*
 * tree.c: GetSessionTree (issue 18): a session and the branches made
 * from it (restores, forks), depth first, each with where it branched,
 * its path's length, the steps it holds and its last exit status. The
 * tenant's sessions are read once (by_tenant, at most
 * SESSIOND_TREE_MAX) and linked by parent_session_id.
 * Not for: reading steps along a path (path.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

struct tree_scan {
	size_t prefix_len;
	size_t n, cap;
	struct sessiond_id *ids;
	bool truncated;
};

static int
tree_visit(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct tree_scan *t = arg;
	struct sessiond_id *grown;

	(void)val;
	(void)vlen;
	if (klen != t->prefix_len + SESSIOND_INDEX_SUFFIX)
		return MOAT_OK;
	if (t->n == SESSIOND_TREE_MAX) {
		t->truncated = true;
		return MOAT_STORE_SCAN_STOP;
	}
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;

		if ((grown = realloc(t->ids, cap * sizeof(*grown))) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		t->ids = grown;
		t->cap = cap;
	}
	memcpy(t->ids[t->n].s, (const uint8_t *)key + t->prefix_len + 8,
	    SESSIOND_ID_LEN);
	t->ids[t->n].s[SESSIOND_ID_LEN] = '\0';
	t->n++;
	return MOAT_OK;
}

/* node_fill: the tree node of s at `depth`, its last own step's exit
 * status read from the store. */
static int
node_fill(struct moat_store_txn *txn, const Moat__V1__SessionInfo *s,
    uint32_t depth, Moat__V1__SessionTreeNode **out, char **errmsg)
{
	Moat__V1__SessionTreeNode *n = malloc(sizeof(*n));
	uint64_t first = sessiond_first_step(s);
	Moat__V1__Step *last = NULL;
	int rv;

	*out = NULL;
	if (n == NULL)
		goto oom;
	moat__v1__session_tree_node__init(n);
	n->depth = depth;
	n->branched_at = s->parent_step;
	n->first_step = first;
	n->step_count = s->step_count;
	n->own_steps = s->step_count >= first ? s->step_count - first + 1 : 0;
	n->created_ms = s->created_ms;
	if ((n->session_id = strdup(s->id)) == NULL ||
	    (n->sandbox_id = strdup(s->sandbox_id)) == NULL ||
	    (n->parent_session_id =
	            strdup(depth == 0 || s->parent_session_id == NULL ?
	                    "" :
	                    s->parent_session_id)) == NULL) {
		moat__v1__session_tree_node__free_unpacked(n, NULL);
		goto oom;
	}
	if (n->own_steps > 0) {
		if ((rv = sessiond_step_load(txn, s, s->step_count, true,
		         &last, errmsg)) != MOAT_OK) {
			moat__v1__session_tree_node__free_unpacked(n, NULL);
			return rv == MOAT_NOT_FOUND ? MOAT_DATA_LOSS : rv;
		}
		n->has_exit = true;
		n->last_exit_code = last->exit_code;
		moat__v1__step__free_unpacked(last, NULL);
	}
	*out = n;
	return MOAT_OK;
oom:
	*errmsg = moat_asprintf("out of memory");
	return MOAT_RESOURCE_EXHAUSTED;
}

/* add_subtree: s and, depth first, the sessions branched from it. `all` is in creation
 * order, so branches come by creation. */
static int
add_subtree(struct moat_store_txn *txn, Moat__V1__SessionInfo **all,
    size_t n_all, const Moat__V1__SessionInfo *s, uint32_t depth,
    Moat__V1__SessionTreeReply *r, char **errmsg)
{
	int rv;

	if ((rv = node_fill(txn, s, depth, &r->nodes[r->n_nodes], errmsg)) !=
	    MOAT_OK)
		return rv;
	r->n_nodes++;
	/* A loop of parents cannot be made through CreateSession (a parent
	 * exists before its branch); the depth bound keeps a damaged store
	 * from recursing for ever. */
	if (depth >= SESSIOND_PATH_MAX_DEPTH * 16) {
		r->truncated = true;
		return MOAT_OK;
	}
	for (size_t i = 0; i < n_all; i++) {
		Moat__V1__SessionInfo *child = all[i];

		if (child == NULL || child->parent_session_id == NULL ||
		    strcmp(child->parent_session_id, s->id) != 0)
			continue;
		all[i] = NULL; /* each session once, even in a damaged store */
		rv = add_subtree(txn, all, n_all, child, depth + 1, r, errmsg);
		moat__v1__session_info__free_unpacked(child, NULL);
		if (rv != MOAT_OK)
			return rv;
	}
	return MOAT_OK;
}

int
sessiond_tree_build(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *root, Moat__V1__SessionTreeReply *r,
    char **errmsg)
{
	uint8_t key[SESSIOND_KEY_INDEX_MAX + SESSIOND_INDEX_SUFFIX];
	struct tree_scan t = { 0 };
	Moat__V1__SessionInfo **all = NULL;
	size_t n_all = 0;
	int rv;

	sessiond_key_by_tenant(key, sizeof(key), root->tenant, 0, NULL,
	    &t.prefix_len);
	if ((rv = moat_store_scan(txn, "by_tenant", key, t.prefix_len, NULL, 0,
	         tree_visit, &t, errmsg)) != MOAT_OK)
		goto out;
	r->truncated = t.truncated;
	if ((all = calloc(t.n + 1, sizeof(*all))) == NULL ||
	    (r->nodes = calloc(t.n + 1, sizeof(*r->nodes))) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	for (size_t i = 0; i < t.n; i++) {
		if (strcmp(t.ids[i].s, root->id) == 0)
			continue;
		if ((rv = sessiond_session_load(txn, root->tenant, &t.ids[i],
		         &all[n_all], errmsg)) != MOAT_OK) {
			rv = rv == MOAT_NOT_FOUND ? MOAT_DATA_LOSS : rv;
			goto out;
		}
		n_all++;
	}
	rv = add_subtree(txn, all, n_all, root, 0, r, errmsg);
out:
	for (size_t i = 0; i < n_all; i++)
		if (all[i] != NULL)
			moat__v1__session_info__free_unpacked(all[i], NULL);
	free(all);
	free(t.ids);
	return rv;
}
