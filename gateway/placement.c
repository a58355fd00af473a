/*
 * placement.c: which node gets a new sandbox. A pure function over a
 * snapshot of the node table: available nodes whose per-sandbox limits
 * allow the request, with the memory free and the image built, ranked by
 * fewest sandboxes, then most free memory, then id (so equal nodes fill
 * evenly and the choice is repeatable). When nothing fits, the error says
 * why in the operator's terms: no node at all, a request no node could
 * ever hold, an image built nowhere, or full nodes.
 * Not for: reserving capacity (the node itself refuses when a race fills
 * it) or talking to nodes.
 */
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/status.h"
#include "moat/util.h"

/* What a node does with 0 in CreateSandboxRequest (vm.proto). */
#define NODE_DEFAULT_VCPUS 1u
#define NODE_DEFAULT_MEMORY_MIB 256u

/* free_mib: memory a new sandbox may take. A node that reports no total
 * (0) has not measured its memory; it is not refused for that, the node
 * itself will be if it is short. */
static uint64_t
free_mib(const Moat__V1__Node *n)
{
	if (n->memory_mib_total == 0)
		return UINT32_MAX;
	return n->memory_mib_total > n->memory_mib_used ?
	    n->memory_mib_total - n->memory_mib_used :
	    0;
}

/* within_limits: whether the node could ever hold such a sandbox, empty
 * or not. A limit of 0 means the node did not say. */
static bool
within_limits(const Moat__V1__Node *n, uint32_t vcpus, uint32_t mem)
{
	if (n->max_vcpus != 0 && vcpus > n->max_vcpus)
		return false;
	if (n->vcpus_total != 0 && vcpus > n->vcpus_total)
		return false;
	if (n->max_memory_mib != 0 && mem > n->max_memory_mib)
		return false;
	if (n->memory_mib_total != 0 && mem > n->memory_mib_total)
		return false;
	return true;
}

static bool
has_image(const Moat__V1__Node *n, const char *image)
{
	if (image == NULL || image[0] == '\0' ||
	    strcmp(image, "default") == 0 || n->n_images == 0)
		return true;
	for (size_t i = 0; i < n->n_images; i++)
		if (strcmp(n->images[i], image) == 0)
			return true;
	return false;
}

/* better: whether a ranks before b. */
static bool
better(const Moat__V1__Node *a, const Moat__V1__Node *b)
{
	if (a->sandboxes != b->sandboxes)
		return a->sandboxes < b->sandboxes;
	if (free_mib(a) != free_mib(b))
		return free_mib(a) > free_mib(b);
	return strcmp(a->node_id, b->node_id) < 0;
}

int
moat_placement_choose(Moat__V1__Node *const *nodes, size_t n, uint32_t vcpus,
    uint32_t memory_mib, const char *image, const char *survey_url,
    size_t *chosen, char **errmsg)
{
	size_t available = 0, fit_limits = 0, fit_image = 0, best = n;
	uint32_t max_vcpus = 0;
	uint64_t max_mem = 0, most_free = 0;

	*chosen = n;
	if (vcpus == 0)
		vcpus = NODE_DEFAULT_VCPUS;
	if (memory_mib == 0)
		memory_mib = NODE_DEFAULT_MEMORY_MIB;
	for (size_t i = 0; i < n; i++) {
		const Moat__V1__Node *node = nodes[i];
		uint32_t node_vcpus;
		uint64_t node_mem;

		if (node == NULL || !node->available)
			continue;
		available++;
		node_vcpus =
		    node->max_vcpus ? node->max_vcpus : node->vcpus_total;
		node_mem = node->max_memory_mib ? node->max_memory_mib :
		                                  node->memory_mib_total;
		if (node_vcpus > max_vcpus)
			max_vcpus = node_vcpus;
		if (node_mem > max_mem)
			max_mem = node_mem;
		if (!within_limits(node, vcpus, memory_mib))
			continue;
		fit_limits++;
		if (!has_image(node, image))
			continue;
		fit_image++;
		if (free_mib(node) > most_free)
			most_free = free_mib(node);
		if (free_mib(node) < memory_mib)
			continue;
		if (best == n || better(node, nodes[best]))
			best = i;
	}
	if (best != n) {
		*chosen = best;
		return MOAT_OK;
	}
	if (available == 0) {
		*errmsg = moat_asprintf(
		    "no vmd node is available: start "
		    "moat-vmd (deploy/moat-stack start) and check that it "
		    "dials the gateway's survey url %s; `moat info` lists "
		    "the nodes the gateway knows",
		    survey_url ? survey_url : "");
		return MOAT_UNAVAILABLE;
	}
	if (fit_limits == 0) {
		*errmsg = moat_asprintf(
		    "no node can hold a sandbox of %u "
		    "vcpus and %u MiB: the largest allowed on the available "
		    "nodes is %u vcpus and %llu MiB; ask for less (--cpus, "
		    "--memory)",
		    vcpus, memory_mib, max_vcpus, (unsigned long long)max_mem);
		return MOAT_INVALID_ARGUMENT;
	}
	if (fit_image == 0) {
		*errmsg = moat_asprintf(
		    "image \"%s\" is not built on any "
		    "available node: build it on a node as root "
		    "(images/build.sh --name %s --out DIR, DIR being that "
		    "node's vmd --image-dir) or pick another with --image",
		    image, image);
		return MOAT_FAILED_PRECONDITION;
	}
	*errmsg = moat_asprintf(
	    "all %zu available node(s) are full: %u MiB "
	    "asked, at most %llu MiB free on one node; destroy sandboxes "
	    "you no longer need (moat sandbox ls, moat sandbox rm ID), ask "
	    "for less memory, or start another node",
	    fit_image, memory_mib, (unsigned long long)most_free);
	return MOAT_RESOURCE_EXHAUSTED;
}

/* spread_one: the node for one sandbox more; see moat_placement_spread. */
static int
spread_one(Moat__V1__Node **nodes, size_t n, uint32_t vcpus,
    uint32_t memory_mib, const char *image, const char *prefer,
    const char *survey_url, size_t *chosen, char **errmsg)
{
	size_t one;
	char *msg = NULL;

	for (size_t i = 0; prefer != NULL && prefer[0] != '\0' && i < n; i++) {
		if (nodes[i] == NULL || strcmp(nodes[i]->node_id, prefer) != 0)
			continue;
		if (moat_placement_choose(&nodes[i], 1, vcpus, memory_mib,
		        image, survey_url, &one, &msg) == MOAT_OK) {
			*chosen = i;
			return MOAT_OK;
		}
		free(msg);
		break;
	}
	return moat_placement_choose(nodes, n, vcpus, memory_mib, image,
	    survey_url, chosen, errmsg);
}

int
moat_placement_spread(Moat__V1__Node **nodes, size_t n, uint32_t count,
    uint32_t vcpus, uint32_t memory_mib, const char *image, const char *prefer,
    const char *survey_url, size_t *chosen, char **errmsg)
{
	uint32_t mem = memory_mib ? memory_mib : NODE_DEFAULT_MEMORY_MIB;

	for (uint32_t k = 0; k < count; k++) {
		int rv = spread_one(nodes, n, vcpus, memory_mib, image,
		    k == 0 ? prefer : NULL, survey_url, &chosen[k], errmsg);

		if (rv != MOAT_OK && k == 0)
			return rv;
		if (rv != MOAT_OK) {
			free(*errmsg);
			*errmsg = NULL;
			chosen[k] = chosen[k - 1];
		}
		nodes[chosen[k]]->sandboxes++;
		nodes[chosen[k]]->memory_mib_used += mem;
	}
	return MOAT_OK;
}
