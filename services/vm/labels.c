/*
 * labels.c: the node's labels (labels.h): parsed once at start from
 * [vmd] labels and the --label flags, copied into each survey answer
 * and NodeInfo. Not for: matching them (the gateway's placement.c).
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "labels.h"

static bool
text_ok(const char *s, size_t len, bool key)
{
	if (len > VMD_LABEL_TEXT_MAX || (key && len == 0))
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		        c == '-' || (key && c == '/')))
			return false;
	}
	return true;
}

/* put: key=value into l (the value replaces an earlier one). */
static int
put(struct vmd_labels *l, const char *k, size_t klen, const char *v,
    size_t vlen)
{
	char *key = strndup(k, klen), *value = strndup(v, vlen);
	char **keys, **values;

	if (key == NULL || value == NULL)
		goto oom;
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->keys[i], key) == 0) {
			free(l->values[i]);
			l->values[i] = value;
			free(key);
			return MOAT_OK;
		}
	if ((keys = realloc(l->keys, (l->n + 1) * sizeof(*keys))) == NULL)
		goto oom;
	l->keys = keys;
	if ((values = realloc(l->values, (l->n + 1) * sizeof(*values))) ==
	    NULL)
		goto oom;
	l->values = values;
	l->keys[l->n] = key;
	l->values[l->n++] = value;
	return MOAT_OK;
oom:
	free(key);
	free(value);
	return MOAT_RESOURCE_EXHAUSTED;
}

int
vmd_labels_parse(struct vmd_labels *l, const char *text, const char *what,
    char **errmsg)
{
	const char *p = text;

	*errmsg = NULL;
	while (p != NULL && *p != '\0') {
		const char *end = strchr(p, ','), *eq;
		size_t len = end ? (size_t)(end - p) : strlen(p);
		int rv;

		while (len > 0 && *p == ' ') {
			p++;
			len--;
		}
		while (len > 0 && p[len - 1] == ' ')
			len--;
		eq = memchr(p, '=', len);
		if (len > 0 &&
		    (eq == NULL || !text_ok(p, (size_t)(eq - p), true) ||
		        !text_ok(eq + 1, len - (size_t)(eq - p) - 1, false))) {
			*errmsg = moat_asprintf(
			    "%s: \"%.*s\" is not a label: write key=value "
			    "(key 1-63 of A-Z a-z 0-9 . _ / -, value 0-63 of "
			    "A-Z a-z 0-9 . _ -), several separated by commas",
			    what, (int)(len > 80 ? 80 : len), p);
			return MOAT_INVALID_ARGUMENT;
		}
		if (len > 0 &&
		    (rv = put(l, p, (size_t)(eq - p), eq + 1,
		         len - (size_t)(eq - p) - 1)) != MOAT_OK)
			return rv;
		if (l->n > VMD_LABELS_MAX) {
			*errmsg = moat_asprintf("%s: more than %d labels",
			    what, VMD_LABELS_MAX);
			return MOAT_INVALID_ARGUMENT;
		}
		p = end ? end + 1 : NULL;
	}
	return MOAT_OK;
}

void
vmd_labels_free(struct vmd_labels *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->keys[i]);
		free(l->values[i]);
	}
	free(l->keys);
	free(l->values);
	memset(l, 0, sizeof(*l));
}

int
vmd_labels_fill(const struct vmd_labels *l, Moat__V1__Node *node)
{
	Moat__V1__Node__LabelsEntry **e;

	node->labels = NULL;
	node->n_labels = 0;
	if (l->n == 0)
		return MOAT_OK;
	if ((e = calloc(l->n, sizeof(*e))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	node->labels = e;
	for (size_t i = 0; i < l->n; i++) {
		if ((e[i] = malloc(sizeof(*e[i]))) == NULL)
			goto oom;
		moat__v1__node__labels_entry__init(e[i]);
		node->n_labels++;
		if ((e[i]->key = strdup(l->keys[i])) == NULL ||
		    (e[i]->value = strdup(l->values[i])) == NULL)
			goto oom;
	}
	return MOAT_OK;
oom:
	vmd_labels_fill_free(node);
	return MOAT_RESOURCE_EXHAUSTED;
}

void
vmd_labels_fill_free(Moat__V1__Node *node)
{
	for (size_t i = 0; i < node->n_labels; i++) {
		if (node->labels[i]->key != protobuf_c_empty_string)
			free(node->labels[i]->key);
		if (node->labels[i]->value != protobuf_c_empty_string)
			free(node->labels[i]->value);
		free(node->labels[i]);
	}
	free(node->labels);
	node->labels = NULL;
	node->n_labels = 0;
}
