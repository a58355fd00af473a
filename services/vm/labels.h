/*
 * labels.h: the node's labels ([vmd] labels = zone=a,kvm=true and
 * --label k=v, repeatable), reported in Node.labels for the gateway's
 * node_selector (issue 15, part 4). Not for: sandbox labels
 * (CreateSandboxRequest.labels).
 */
#ifndef MOAT_VMD_LABELS_H
#define MOAT_VMD_LABELS_H

#include <stddef.h>

#include "vm.pb-c.h"

#define VMD_LABELS_MAX 32     /* labels on one node */
#define VMD_LABEL_TEXT_MAX 63 /* bytes of a key or a value */

struct vmd_labels {
	char **keys, **values; /* owned */
	size_t n;
};

/* vmd_labels_parse: adds the comma-separated k=v of `text` (NULL or "":
 * none) to *l; a key given twice takes the later value. A key is 1-63
 * of [A-Za-z0-9._/-], a value 0-63 of [A-Za-z0-9._-]. INVALID_ARGUMENT
 * with *errmsg (heap) naming `what` (e.g. "[vmd] labels") and the bad
 * entry; RESOURCE_EXHAUSTED when out of memory. */
int vmd_labels_parse(struct vmd_labels *l, const char *text, const char *what,
    char **errmsg) __attribute__((warn_unused_result));

/* vmd_labels_free: frees what *l holds; safe on a zeroed one. */
void vmd_labels_free(struct vmd_labels *l);

/* vmd_labels_fill: heap copies of l's labels into node->labels (freed
 * with the node, or with vmd_labels_fill_free). 0 or
 * MOAT_RESOURCE_EXHAUSTED (nothing set). */
int vmd_labels_fill(const struct vmd_labels *l, Moat__V1__Node *node)
    __attribute__((warn_unused_result));
void vmd_labels_fill_free(Moat__V1__Node *node);

#endif
