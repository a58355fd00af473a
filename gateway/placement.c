/*
 * placement.c: which node gets a new sandbox. A pure function over a
 * snapshot of the node table (with this gateway's reservations already
 * added, admission.c): available, usable (not cordoned, a protocol
 * version the gateway speaks) nodes that the request has not been
 * refused by, carrying every label of its node_selector, whose
 * per-sandbox limits allow it, with room for it: memory, vcpus (with the
 * overcommit ratio) and scratch disk. Ranked first by whether the node
 * holds the image (issue 17: a node without it pulls it from moat-snapd
 * first, gigabytes, so it is taken only when no holder fits), then by
 * the tenant's own sandboxes there (a tenant spreads), then fewest
 * sandboxes, then most free memory, then id (so equal nodes fill evenly
 * and the choice is repeatable). When nothing fits, the error says why
 * in the operator's terms: no node at all, unusable or unlabelled nodes,
 * a request no node could ever hold, or full nodes. An image no node
 * holds is not refused here: the chosen node pulls it, and answers
 * NOT_FOUND itself when moat-snapd has none either.
 * Not for: holding capacity (admission.c) or talking to nodes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
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

/* has_image: whether the node holds `image` ("" is "default") now. A
 * node that lists no images (a vmd before issue 17) is taken at its
 * word that it has what it is asked for. */
static bool
has_image(const Moat__V1__Node *n, const char *image)
{
	if (image == NULL || image[0] == '\0')
		image = "default";
	if (n->n_images == 0)
		return true;
	for (size_t i = 0; i < n->n_images; i++)
		if (strcmp(n->images[i], image) == 0)
			return true;
	return false;
}

/* scratch_ok: whether the node has disk for the scratch asked. A node
 * that does not report its free scratch (0) is not refused for it. */
static bool
scratch_ok(const Moat__V1__Node *n, uint64_t scratch_mib)
{
	return n->scratch_free_bytes == 0 ||
	    n->scratch_free_bytes >= (scratch_mib << 20);
}

/* vcpus_ok: used + asked within vcpus_total * overcommit (a node that
 * does not report its vcpus is not refused for them). */
static bool
vcpus_ok(const Moat__V1__Node *n, uint32_t vcpus, double overcommit)
{
	if (n->vcpus_total == 0)
		return true;
	return (double)n->vcpus_used + vcpus <=
	    (double)n->vcpus_total * overcommit + 1e-9;
}

const char *
moat_placement_unusable(const Moat__V1__Node *node, char *buf, size_t size)
{
	uint32_t v = node->protocol_version ? node->protocol_version : 1;

	if (v < MOAT_PROTOCOL_VERSION_MIN) {
		snprintf(buf, size,
		    "protocol version %u < %u: upgrade moat-vmd", v,
		    (unsigned)MOAT_PROTOCOL_VERSION_MIN);
		return buf;
	}
	if (node->cordoned) {
		snprintf(buf, size,
		    "cordoned%s%s: `moat node uncordon %s` to place "
		    "sandboxes there again",
		    node->cordon_reason && node->cordon_reason[0] ? ": " : "",
		    node->cordon_reason ? node->cordon_reason : "",
		    node->node_id);
		return buf;
	}
	return NULL;
}

static bool
has_labels(const Moat__V1__Node *n, const struct moat_place_req *req)
{
	for (size_t i = 0; i < req->n_selector; i++) {
		const char *k = req->selector[i]->key,
		           *v = req->selector[i]->value;
		bool found = false;

		for (size_t j = 0; j < n->n_labels && !found; j++)
			found = strcmp(n->labels[j]->key, k ? k : "") == 0 &&
			    strcmp(n->labels[j]->value, v ? v : "") == 0;
		if (!found)
			return false;
	}
	return true;
}

/* What the nodes looked like to one pick, for its error message. */
struct pick_tally {
	size_t available, usable, unskipped, labelled, fit_limits;
	uint32_t max_vcpus;
	uint64_t max_mem, most_free;
	bool short_mem, short_vcpus, short_scratch;
	char unusable[256];
};

static uint32_t
tenant_count(const struct moat_place_req *req, size_t i)
{
	return req->tenant_sandboxes ? req->tenant_sandboxes[i] : 0;
}

/* better: whether node i ranks before node j. */
static bool
better(Moat__V1__Node *const *nodes, const struct moat_place_req *req,
    size_t i, size_t j)
{
	const Moat__V1__Node *a = nodes[i], *b = nodes[j];
	bool ha = has_image(a, req->image), hb = has_image(b, req->image);

	if (ha != hb)
		return ha;
	if (tenant_count(req, i) != tenant_count(req, j))
		return tenant_count(req, i) < tenant_count(req, j);
	if (a->sandboxes != b->sandboxes)
		return a->sandboxes < b->sandboxes;
	if (free_mib(a) != free_mib(b))
		return free_mib(a) > free_mib(b);
	return strcmp(a->node_id, b->node_id) < 0;
}

/* fits: whether node i may take req (sizes resolved), tallying why
 * not. */
static bool
fits(const Moat__V1__Node *node, const struct moat_place_req *req, size_t i,
    struct pick_tally *t)
{
	uint32_t node_vcpus;
	uint64_t node_mem;
	char why[160];
	const char *reason;
	bool room = true;

	if (node == NULL || !node->available)
		return false;
	t->available++;
	if ((reason = moat_placement_unusable(node, why, sizeof(why)))) {
		size_t len = strlen(t->unusable);

		snprintf(t->unusable + len, sizeof(t->unusable) - len,
		    "%s%s: %s", len ? "; " : "", node->node_id, reason);
		return false;
	}
	t->usable++;
	if (req->skip != NULL && req->skip[i])
		return false;
	t->unskipped++;
	if (!has_labels(node, req))
		return false;
	t->labelled++;
	node_vcpus = node->max_vcpus ? node->max_vcpus : node->vcpus_total;
	node_mem = node->max_memory_mib ? node->max_memory_mib :
	                                  node->memory_mib_total;
	if (node_vcpus > t->max_vcpus)
		t->max_vcpus = node_vcpus;
	if (node_mem > t->max_mem)
		t->max_mem = node_mem;
	if (!within_limits(node, req->vcpus, req->memory_mib))
		return false;
	t->fit_limits++;
	if (free_mib(node) > t->most_free)
		t->most_free = free_mib(node);
	if (free_mib(node) < req->memory_mib) {
		t->short_mem = true;
		room = false;
	}
	if (!vcpus_ok(node, req->vcpus, req->overcommit)) {
		t->short_vcpus = true;
		room = false;
	}
	if (!scratch_ok(node, req->scratch_mib)) {
		t->short_scratch = true;
		room = false;
	}
	return room;
}

/* selector_text: "k=v,k2=v2" of the request, into buf. */
static const char *
selector_text(const struct moat_place_req *req, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < req->n_selector && len < size; i++)
		len += (size_t)snprintf(buf + len, size - len, "%s%s=%s",
		    i ? "," : "", req->selector[i]->key,
		    req->selector[i]->value);
	return buf;
}

/* pick_error: why nothing fitted, as a status and *errmsg. */
static int
pick_error(const struct moat_place_req *req, const struct pick_tally *t,
    char **errmsg)
{
	char sel[256];

	if (t->available == 0) {
		*errmsg = moat_asprintf(
		    "no vmd node is available: start "
		    "moat-vmd (deploy/moat-stack start) and check that it "
		    "dials the gateway's survey url %s; `moat info` lists "
		    "the nodes the gateway knows",
		    req->survey_url ? req->survey_url : "");
		return MOAT_UNAVAILABLE;
	}
	if (t->usable == 0) {
		*errmsg =
		    moat_asprintf("all %zu available node(s) are unusable "
		                  "for new sandboxes (%s); `moat node ls` "
		                  "shows why",
		        t->available, t->unusable);
		return MOAT_FAILED_PRECONDITION;
	}
	if (t->unskipped == 0) {
		*errmsg = moat_asprintf("every usable node refused the "
		                        "sandbox");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (t->labelled == 0) {
		*errmsg = moat_asprintf(
		    "no usable node has the labels %s asked (node_selector / "
		    "--node-label): `moat node ls` lists each node's labels; "
		    "give a node labels with [vmd] labels or --label k=v, or "
		    "ask for others",
		    selector_text(req, sel, sizeof(sel)));
		return MOAT_FAILED_PRECONDITION;
	}
	if (t->fit_limits == 0) {
		*errmsg = moat_asprintf(
		    "no node can hold a sandbox of %u "
		    "vcpus and %u MiB: the largest allowed on the available "
		    "nodes is %u vcpus and %llu MiB; ask for less (--cpus, "
		    "--memory)",
		    req->vcpus, req->memory_mib, t->max_vcpus,
		    (unsigned long long)t->max_mem);
		return MOAT_INVALID_ARGUMENT;
	}
	*errmsg = moat_asprintf(
	    "all %zu available node(s) are full (short of%s%s%s): %u MiB "
	    "and %u vcpus asked, at most %llu MiB free on one node, vcpus "
	    "counted %gx ([gateway] vcpu-overcommit); destroy sandboxes you "
	    "no longer need (moat sandbox ls, moat sandbox rm ID), ask for "
	    "less, or start another node",
	    t->fit_limits, t->short_mem ? " memory" : "",
	    t->short_vcpus ? " vcpus" : "",
	    t->short_scratch ? " scratch disk" : "", req->memory_mib,
	    req->vcpus, (unsigned long long)t->most_free, req->overcommit);
	return MOAT_RESOURCE_EXHAUSTED;
}

int
moat_placement_pick(Moat__V1__Node *const *nodes, size_t n,
    const struct moat_place_req *req_in, size_t *chosen, char **errmsg)
{
	struct moat_place_req req = *req_in;
	struct pick_tally t = { 0 };
	size_t best = n;

	*chosen = n;
	if (req.vcpus == 0)
		req.vcpus = NODE_DEFAULT_VCPUS;
	if (req.memory_mib == 0)
		req.memory_mib = NODE_DEFAULT_MEMORY_MIB;
	if (req.scratch_mib == 0)
		req.scratch_mib = MOAT_NODE_DEFAULT_SCRATCH_MIB;
	if (req.overcommit <= 0)
		req.overcommit = MOAT_VCPU_OVERCOMMIT;
	for (size_t i = 0; i < n; i++) {
		if (!fits(nodes[i], &req, i, &t))
			continue;
		if (best == n || better(nodes, &req, i, best))
			best = i;
	}
	if (best != n) {
		*chosen = best;
		return MOAT_OK;
	}
	return pick_error(&req, &t, errmsg);
}

int
moat_placement_choose(Moat__V1__Node *const *nodes, size_t n, uint32_t vcpus,
    uint32_t memory_mib, const char *image, const char *survey_url,
    size_t *chosen, char **errmsg)
{
	struct moat_place_req req = {
		.vcpus = vcpus,
		.memory_mib = memory_mib,
		.image = image,
		.survey_url = survey_url,
	};

	return moat_placement_pick(nodes, n, &req, chosen, errmsg);
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
		nodes[chosen[k]]->vcpus_used += vcpus ? vcpus : 1;
	}
	return MOAT_OK;
}
