/*
 * admission.c: the gateway's reservations, tenant quotas and per-key
 * rate limits (admission.h). A reservation is made when placement picks
 * a node and lives until the node's next survey answer counts the
 * sandbox (last_seen after it landed), until the node refuses it, or
 * 30 s, so a burst of creates sees the sandboxes placed a moment ago and
 * spreads. Quotas count the tenant's sandboxes in the inventory (every
 * node) plus reservations whose sandbox the inventory does not list yet;
 * the check and the reservation are made under one lock, so a burst
 * through this gateway cannot pass a limit. With a sessiond the quotas
 * are counted across gateways there first (quota_remote.c); this count
 * is the fallback when it does not answer. Keys take tokens of one
 * table of buckets (ratelimit.c) at their tenant's rate.
 * Not for: ranking nodes (placement.c) or talking to them.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/util.h"
#include "ratelimit.h"

#define TENANTS "tenants"
#define TENANT_MAX 128

struct reservation {
	uint64_t id;
	char node[MOAT_ID_MAX];
	char tenant[TENANT_MAX];
	char sandbox[MOAT_ID_MAX]; /* "" until it landed */
	uint32_t vcpus, memory_mib;
	uint64_t scratch_bytes;
	uint64_t made_ms, landed_ms; /* wall clock; landed 0: pending */
	/* The inventory listed its sandbox: from then on the inventory
	 * counts it, and once it is gone from there (destroyed) it is
	 * counted nowhere. */
	bool listed;
};

struct moat_admission {
	pthread_mutex_t lock; /* guards res, n, cap, next_id */
	struct reservation *res;
	size_t n, cap;
	uint64_t next_id;
	const struct moat_config *config;
	struct moat_inventory *inv;
	struct moat_metrics *reg;
	struct moat_ratelimit *keys;
	double overcommit;
	uint64_t default_rps, default_burst;
	struct moat_quota_remote *remote; /* sessiond's table; NULL: none */
};

static int
read_overcommit(const struct moat_config *cfg, double *out, char **errmsg)
{
	const char *v =
	    moat_config_get(cfg, "gateway", "vcpu-overcommit", NULL);
	char *end = NULL;
	double d;

	*out = MOAT_VCPU_OVERCOMMIT;
	if (v == NULL || v[0] == '\0')
		return MOAT_OK;
	d = strtod(v, &end);
	if (end == v || *end != '\0' || !(d >= 0.1 && d <= 1000)) {
		*errmsg =
		    moat_asprintf("[gateway] vcpu-overcommit \"%s\" is not "
		                  "a ratio from 0.1 to 1000 (e.g. 4 or "
		                  "1.5)",
		        v);
		return MOAT_INVALID_ARGUMENT;
	}
	*out = d;
	return MOAT_OK;
}

int
moat_admission_new(struct moat_admission **out,
    const struct moat_config *config, struct moat_metrics *reg, char **errmsg)
{
	struct moat_admission *a = calloc(1, sizeof(*a));
	uint64_t rps = MOAT_RATELIMIT_RPS, burst = MOAT_RATELIMIT_BURST;
	int rv;

	*out = NULL;
	if (a == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = read_overcommit(config, &a->overcommit, errmsg)) !=
	        MOAT_OK ||
	    (rv = moat_config_get_u64(config, "gateway", "rate-limit-rps",
	         MOAT_RATELIMIT_RPS, &rps, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(config, "gateway", "rate-limit-burst",
	         MOAT_RATELIMIT_BURST, &burst, errmsg)) != MOAT_OK) {
		free(a);
		return rv;
	}
	if ((a->keys = moat_ratelimit_new(0, 0, MOAT_RATELIMIT_SLOTS)) ==
	    NULL) {
		free(a);
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	pthread_mutex_init(&a->lock, NULL);
	a->config = config;
	a->reg = reg;
	a->next_id = 1;
	a->default_rps = rps;
	a->default_burst = burst;
	*out = a;
	return MOAT_OK;
}

void
moat_admission_set_inventory(struct moat_admission *a,
    struct moat_inventory *inv)
{
	if (a != NULL)
		a->inv = inv;
}

void
moat_admission_free(struct moat_admission *a)
{
	if (a == NULL)
		return;
	pthread_mutex_destroy(&a->lock);
	moat_quota_remote_free(a->remote);
	moat_ratelimit_free(a->keys);
	free(a->res);
	free(a);
}

double
moat_admission_overcommit(const struct moat_admission *a)
{
	return a != NULL ? a->overcommit : MOAT_VCPU_OVERCOMMIT;
}

/* gauge_node: moat_gateway_reservations{node} from the table. Lock
 * held. */
static void
gauge_node(struct moat_admission *a, const char *node)
{
	const char *labels[] = { "node", node, NULL };
	size_t count = 0;

	if (a->reg == NULL)
		return;
	for (size_t i = 0; i < a->n; i++)
		count += strcmp(a->res[i].node, node) == 0;
	moat_gauge_set(moat_metrics_gauge(a->reg, "moat_gateway_reservations",
	                   "Sandboxes this gateway placed on a node that the "
	                   "node's survey does not count yet.",
	                   labels),
	    (double)count);
}

/* drop: removes reservation i. Lock held. */
static void
drop(struct moat_admission *a, size_t i)
{
	char node[MOAT_ID_MAX];

	memcpy(node, a->res[i].node, sizeof(node));
	a->res[i] = a->res[--a->n];
	gauge_node(a, node);
}

/* expire: drops the reservations nodes[] (one survey answer each) have
 * counted, and any older than MOAT_RESERVATION_MAX_MS. Lock held. */
static void
expire(struct moat_admission *a, Moat__V1__Node *const *nodes, size_t n,
    uint64_t now)
{
	size_t i = 0;

	while (i < a->n) {
		struct reservation *r = &a->res[i];
		bool gone = r->made_ms + MOAT_RESERVATION_MAX_MS < now;

		for (size_t j = 0; !gone && r->landed_ms && j < n; j++)
			gone = nodes[j] != NULL &&
			    strcmp(nodes[j]->node_id, r->node) == 0 &&
			    nodes[j]->last_seen_unix_ms > r->landed_ms;
		if (gone)
			drop(a, i);
		else
			i++;
	}
}

/* seen_creating: whether the node's answer counts r already among its
 * sandboxes being created (and their vcpus and memory): the oldest
 * sandboxes_creating reservations on it are taken to be those (a boot
 * under TCG takes many seconds, counted twice otherwise). Lock held. */
static bool
seen_creating(const struct moat_admission *a, const struct reservation *r,
    const Moat__V1__Node *node)
{
	uint32_t older = 0;

	for (size_t i = 0; i < a->n; i++)
		if (a->res[i].id < r->id &&
		    strcmp(a->res[i].node, r->node) == 0)
			older++;
	return older < node->sandboxes_creating;
}

/* apply_locked: moat_admission_apply with the lock held. */
static void
apply_locked(struct moat_admission *a, Moat__V1__Node **nodes, size_t n,
    const char *tenant, uint32_t *tenant_sandboxes)
{
	struct moat_usage total;

	expire(a, nodes, n, moat_now_unix_ms());
	if (tenant_sandboxes != NULL)
		moat_inventory_usage(a->inv, tenant, nodes, n,
		    tenant_sandboxes, &total);
	for (size_t j = 0; j < n; j++) {
		Moat__V1__Node *node = nodes[j];

		for (size_t i = 0; node != NULL && i < a->n; i++) {
			const struct reservation *r = &a->res[i];

			if (strcmp(r->node, node->node_id) != 0)
				continue;
			if (seen_creating(a, r, node))
				goto tenant;
			node->sandboxes++;
			node->vcpus_used += r->vcpus;
			node->memory_mib_used += r->memory_mib;
			if (node->scratch_free_bytes != 0)
				node->scratch_free_bytes =
				    node->scratch_free_bytes >
				        r->scratch_bytes ?
				    node->scratch_free_bytes -
				        r->scratch_bytes :
				    1;
tenant:
			if (tenant_sandboxes != NULL && tenant != NULL &&
			    strcmp(r->tenant, tenant) == 0 && !r->listed &&
			    (r->sandbox[0] == '\0' ||
			        !moat_inventory_find(a->inv, r->sandbox, NULL,
			            NULL)))
				tenant_sandboxes[j]++;
		}
	}
}

void
moat_admission_apply(struct moat_admission *a, Moat__V1__Node **nodes,
    size_t n, const char *tenant, uint32_t *tenant_sandboxes)
{
	if (a == NULL) {
		if (tenant_sandboxes != NULL)
			memset(tenant_sandboxes, 0, n * sizeof(uint32_t));
		return;
	}
	pthread_mutex_lock(&a->lock);
	apply_locked(a, nodes, n, tenant, tenant_sandboxes);
	pthread_mutex_unlock(&a->lock);
}

/* reserve_locked: see moat_admission_reserve. Lock held. */
static uint64_t
reserve_locked(struct moat_admission *a, const char *node, const char *tenant,
    const struct moat_place_req *req)
{
	struct reservation *r;

	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		struct reservation *grown = realloc(a->res, cap * sizeof(*r));

		if (grown == NULL)
			return 0;
		a->res = grown;
		a->cap = cap;
	}
	r = &a->res[a->n++];
	memset(r, 0, sizeof(*r));
	r->id = a->next_id++;
	snprintf(r->node, sizeof(r->node), "%s", node);
	snprintf(r->tenant, sizeof(r->tenant), "%s", tenant ? tenant : "");
	r->vcpus = req->vcpus ? req->vcpus : 1;
	r->memory_mib = req->memory_mib ? req->memory_mib : 256;
	r->scratch_bytes = (req->scratch_mib ? req->scratch_mib :
	                                       MOAT_NODE_DEFAULT_SCRATCH_MIB)
	    << 20;
	r->made_ms = moat_now_unix_ms();
	gauge_node(a, node);
	return r->id;
}

uint64_t
moat_admission_reserve(struct moat_admission *a, const char *node,
    const char *tenant, const struct moat_place_req *req)
{
	uint64_t id;

	if (a == NULL)
		return 0;
	pthread_mutex_lock(&a->lock);
	id = reserve_locked(a, node, tenant, req);
	pthread_mutex_unlock(&a->lock);
	return id;
}

void
moat_admission_landed(struct moat_admission *a, uint64_t handle,
    const char *sandbox_id)
{
	if (a == NULL || handle == 0)
		return;
	pthread_mutex_lock(&a->lock);
	for (size_t i = 0; i < a->n; i++)
		if (a->res[i].id == handle) {
			a->res[i].landed_ms = moat_now_unix_ms();
			snprintf(a->res[i].sandbox, sizeof(a->res[i].sandbox),
			    "%s", sandbox_id ? sandbox_id : "");
			break;
		}
	pthread_mutex_unlock(&a->lock);
}

void
moat_admission_release(struct moat_admission *a, uint64_t handle)
{
	if (a == NULL || handle == 0)
		return;
	pthread_mutex_lock(&a->lock);
	for (size_t i = 0; i < a->n; i++)
		if (a->res[i].id == handle) {
			drop(a, i);
			break;
		}
	pthread_mutex_unlock(&a->lock);
}

void
moat_admission_refused(struct moat_admission *a, const char *node)
{
	const char *labels[] = { "node", node, NULL };

	if (a == NULL || a->reg == NULL)
		return;
	moat_counter_inc(moat_metrics_counter(a->reg,
	    "moat_gateway_placement_refusals_total",
	    "Placed sandboxes a node refused (the next node was tried).",
	    labels));
}

static void
count_quota_refusal(struct moat_admission *a, const char *limit)
{
	const char *labels[] = { "limit", limit, NULL };

	if (a->reg == NULL)
		return;
	moat_counter_inc(
	    moat_metrics_counter(a->reg, "moat_gateway_quota_refusals_total",
	        "Calls refused for a tenant's quota or an API key's rate, by "
	        "limit ([tenants] key).",
	        labels));
}

/* limit: [tenants] key.<tenant>, else key, else 0 (unlimited). */
static int
limit(struct moat_admission *a, const char *key, const char *tenant,
    uint64_t def, uint64_t *out, char **errmsg)
{
	return moat_config_get_u64_for(a->config, TENANTS, key, tenant, def,
	    out, errmsg);
}

/* usage_locked: what `tenant` holds: the inventory plus reservations
 * the inventory has not listed yet (one it listed and no longer lists
 * was destroyed). Lock held. */
static void
usage_locked(struct moat_admission *a, const char *tenant,
    struct moat_usage *u)
{
	moat_inventory_usage(a->inv, tenant, NULL, 0, NULL, u);
	expire(a, NULL, 0, moat_now_unix_ms());
	for (size_t i = 0; i < a->n; i++) {
		struct reservation *r = &a->res[i];

		if (strcmp(r->tenant, tenant) != 0 || r->listed)
			continue;
		if (r->sandbox[0] != '\0' &&
		    moat_inventory_find(a->inv, r->sandbox, NULL, NULL)) {
			r->listed = true;
			continue;
		}
		u->sandboxes++;
		u->vcpus += r->vcpus;
		u->memory_mib += r->memory_mib;
	}
}

int
moat_admission_limits(struct moat_admission *a, const char *tenant,
    uint64_t max[3], char **errmsg)
{
	static const char *const keys[] = { "max-sandboxes", "max-vcpus",
		"max-memory-mib" };
	int rv;

	for (size_t i = 0; i < 3; i++) {
		max[i] = 0;
		if (a != NULL && tenant != NULL &&
		    (rv = limit(a, keys[i], tenant, 0, &max[i], errmsg)) !=
		        MOAT_OK)
			return rv;
	}
	return MOAT_OK;
}

void
moat_admission_count_refusal(struct moat_admission *a, const char *limit)
{
	if (a != NULL)
		count_quota_refusal(a, limit);
}

struct moat_inventory *
moat_admission_inventory(struct moat_admission *a)
{
	return a != NULL ? a->inv : NULL;
}

struct moat_metrics *
moat_admission_metrics(struct moat_admission *a)
{
	return a != NULL ? a->reg : NULL;
}

void
moat_admission_set_remote(struct moat_admission *a,
    struct moat_quota_remote *remote)
{
	if (a == NULL) {
		moat_quota_remote_free(remote);
		return;
	}
	moat_quota_remote_free(a->remote);
	a->remote = remote;
}

struct moat_quota_remote *
moat_admission_remote(struct moat_admission *a)
{
	return a != NULL ? a->remote : NULL;
}

/* One quota: what is held, what one more sandbox adds. */
struct quota_row {
	const char *key, *what, *advice;
	uint64_t held, add;
};

static int
quota_locked(struct moat_admission *a, const char *tenant, uint32_t count,
    uint32_t vcpus, uint32_t memory_mib, char **errmsg)
{
	struct moat_usage u;
	struct quota_row rows[3];
	uint64_t max;
	int rv;

	usage_locked(a, tenant, &u);
	rows[0] = (struct quota_row){ "max-sandboxes", "sandboxes",
		"destroy one (moat sandbox rm ID)", u.sandboxes, 1 };
	rows[1] = (struct quota_row){ "max-vcpus", "vcpus",
		"destroy sandboxes or ask for fewer vcpus (--cpus)", u.vcpus,
		vcpus ? vcpus : 1 };
	rows[2] = (struct quota_row){ "max-memory-mib", "MiB of memory",
		"destroy sandboxes or ask for less memory (--memory)",
		u.memory_mib, memory_mib ? memory_mib : 256 };
	for (size_t i = 0; i < 3; i++) {
		if ((rv = limit(a, rows[i].key, tenant, 0, &max, errmsg)) !=
		    MOAT_OK)
			return rv;
		if (max == 0 || rows[i].held + rows[i].add * count <= max)
			continue;
		count_quota_refusal(a, rows[i].key);
		*errmsg = moat_asprintf(
		    "tenant %s has %llu %s and asked for %llu more, its limit "
		    "is %llu ([tenants] %s.%s): %s, or raise the limit "
		    "(moat-gateway tenants set %s %s=N)",
		    tenant, (unsigned long long)rows[i].held, rows[i].what,
		    (unsigned long long)(rows[i].add * count),
		    (unsigned long long)max, rows[i].key, tenant,
		    rows[i].advice, tenant, rows[i].key);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}

int
moat_admission_quota(struct moat_admission *a, const char *tenant,
    uint32_t count, uint32_t vcpus, uint32_t memory_mib, char **errmsg)
{
	int rv;

	if (a == NULL || tenant == NULL)
		return MOAT_OK;
	pthread_mutex_lock(&a->lock);
	rv = quota_locked(a, tenant, count, vcpus, memory_mib, errmsg);
	pthread_mutex_unlock(&a->lock);
	return rv;
}

uint64_t
moat_admission_snapshot_limit(struct moat_admission *a, const char *tenant)
{
	uint64_t max = 0;
	char *err = NULL;

	if (a == NULL || tenant == NULL ||
	    limit(a, "max-snapshot-bytes", tenant, 0, &max, &err) != MOAT_OK) {
		free(err);
		return 0;
	}
	return max;
}

int
moat_admission_snapshot_quota(struct moat_admission *a, const char *tenant,
    uint64_t bytes, char **errmsg)
{
	uint64_t max = 0;
	int rv;

	if (a == NULL || tenant == NULL)
		return MOAT_OK;
	if ((rv = limit(a, "max-snapshot-bytes", tenant, 0, &max, errmsg)) !=
	    MOAT_OK)
		return rv;
	if (max == 0 || bytes < max)
		return MOAT_OK;
	count_quota_refusal(a, "max-snapshot-bytes");
	*errmsg = moat_asprintf(
	    "tenant %s holds %llu bytes of snapshots, its limit is %llu "
	    "([tenants] max-snapshot-bytes.%s): delete snapshots or "
	    "sessions (moat snapshot rm, moat session rm) or raise the limit "
	    "(moat-gateway tenants set %s max-snapshot-bytes=N)",
	    tenant, (unsigned long long)bytes, (unsigned long long)max, tenant,
	    tenant);
	return MOAT_RESOURCE_EXHAUSTED;
}

int
moat_admission_place(struct moat_admission *a, Moat__V1__Node **nodes,
    size_t n, const char *tenant, struct moat_place_req *req, bool quota,
    size_t *chosen, uint64_t *handle, char **errmsg)
{
	uint32_t *counts = calloc(n ? n : 1, sizeof(*counts));
	int rv;

	*handle = 0;
	if (counts == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (a != NULL)
		pthread_mutex_lock(&a->lock);
	req->overcommit = moat_admission_overcommit(a);
	req->tenant_sandboxes = counts;
	/* What the nodes' last answers already count goes first: a quota
	 * refusal must not keep stale reservations alive. */
	if (a != NULL)
		expire(a, nodes, n, moat_now_unix_ms());
	if (a != NULL && quota &&
	    (rv = quota_locked(a, tenant, 1, req->vcpus, req->memory_mib,
	         errmsg)) != MOAT_OK)
		goto out;
	if (a != NULL)
		apply_locked(a, nodes, n, tenant, counts);
	if ((rv = moat_placement_pick(nodes, n, req, chosen, errmsg)) ==
	        MOAT_OK &&
	    a != NULL)
		*handle =
		    reserve_locked(a, nodes[*chosen]->node_id, tenant, req);
out:
	if (a != NULL)
		pthread_mutex_unlock(&a->lock);
	req->tenant_sandboxes = NULL;
	free(counts);
	return rv;
}

bool
moat_admission_key(struct moat_admission *a, const char *tenant,
    const char *key_id, const struct moat_key_rate *door, uint32_t *retry_s,
    char **errmsg)
{
	uint64_t def_rps = door ? door->rps : a->default_rps;
	uint64_t def_burst = door ? door->burst : a->default_burst;
	uint64_t rps = 0, burst = 0;
	char name[MOAT_RATELIMIT_NAME_MAX];
	char *err = NULL;

	*errmsg = NULL;
	*retry_s = 0;
	if (a == NULL || key_id == NULL || key_id[0] == '\0')
		return true;
	if (limit(a, "key-rps", tenant, def_rps, &rps, &err) != MOAT_OK ||
	    limit(a, "key-burst", tenant, def_burst, &burst, &err) !=
	        MOAT_OK) {
		/* A value that is not a number means the default. */
		free(err);
		rps = def_rps;
		burst = def_burst;
	}
	if (rps > UINT32_MAX)
		rps = UINT32_MAX;
	if (burst > UINT32_MAX)
		burst = UINT32_MAX;
	snprintf(name, sizeof(name), "k:%s", key_id);
	if (moat_ratelimit_take_rate(a->keys, name, (uint32_t)rps,
	        (uint32_t)burst, moat_rpc_now_ms(), retry_s))
		return true;
	count_quota_refusal(a, "key-rps");
	*errmsg = moat_asprintf(
	    "too many requests with this API key (%s, tenant %s): at most "
	    "%llu a "
	    "second, %llu at once ([tenants] key-rps.%s, key-burst.%s); "
	    "retry in %u s",
	    key_id, tenant, (unsigned long long)rps,
	    (unsigned long long)(burst ? burst : rps), tenant, tenant,
	    *retry_s);
	return false;
}
