/*
 * quota.c: the gateways' quota reservations (issue 15), so tenants'
 * quotas ([tenants] max-sandboxes, max-vcpus, max-memory-mib) hold across
 * every gateway. A gateway that is about to make sandboxes (create,
 * restore into a new sandbox, fork) sends what its inventory counts for
 * the tenant and the limits it resolved; sessiond adds every live
 * reservation that inventory does not list yet, checks each limit and
 * records the new reservation under one mutex, so two gateways' creates
 * at the same moment are counted against each other.
 *
 * The table is kept in memory, not in LMDB: a reservation lives only
 * from the check until the gateways' inventories list its sandboxes (a
 * survey, seconds), at most MAX_PENDING_MS pending and LANDED_MS after
 * it landed; writing each to disk with fsync would slow every create for
 * nothing durable. A sessiond restart forgets the reservations in flight,
 * which can only let creates pass for one survey period (their sandboxes
 * are counted by the inventories from then on).
 *
 * A landed reservation's sandboxes count for every caller whose
 * inventory does not list them (its survey has not seen them yet): a
 * caller that lists one counts it itself, once. So that a sandbox
 * destroyed within LANDED_MS does not hold its quota until then, the
 * gateway that destroys it says so (ReleaseQuota with its id): from then
 * on no reservation counts it.
 * Not for: the limits themselves (the gateways' config and tenants.c),
 * or the per-gateway reservations that spread placement over nodes
 * (gateway/admission.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

#define PENDING_DEFAULT_MS 120000u
#define MAX_PENDING_MS 600000u
/* A landed reservation's life: the gateway's MOAT_RESERVATION_MAX_MS,
 * enough for every gateway's survey to list the sandbox. */
#define LANDED_MS 30000u
#define COUNT_MAX 1024u
#define VCPUS_MAX 1024u
#define MEMORY_MIB_MAX (16u << 20)
#define LISTED_MAX 100000u

struct quota_res {
	uint64_t handle;
	char tenant[SESSIOND_MAX_TENANT + 1];
	uint32_t count, vcpus, memory_mib;
	uint64_t expires_ms; /* wall clock */
	bool landed;
	char **ids; /* landed: the sandboxes made (n_ids <= count) */
	bool *gone; /* per id: destroyed (ReleaseQuota by id) */
	size_t n_ids;
};

struct sessiond_quota {
	pthread_mutex_t lock; /* guards everything below */
	struct quota_res *res;
	size_t n, cap, max;
	uint64_t next_handle;
};

int
sessiond_quota_new(struct sessiond_quota **out, uint64_t max)
{
	struct sessiond_quota *q = calloc(1, sizeof(*q));

	*out = NULL;
	if (q == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	pthread_mutex_init(&q->lock, NULL);
	q->max = max;
	/* Random start: a handle from before a restart is not taken for a
	 * new reservation. */
	q->next_handle = (moat_rpc_new_request_id() >> 1) | 1;
	*out = q;
	return MOAT_OK;
}

static void
res_clear(struct quota_res *r)
{
	sessiond_strings_free(r->ids, r->n_ids);
	free(r->gone);
	r->ids = NULL;
	r->gone = NULL;
	r->n_ids = 0;
}

void
sessiond_quota_free(struct sessiond_quota *q)
{
	if (q == NULL)
		return;
	for (size_t i = 0; i < q->n; i++)
		res_clear(&q->res[i]);
	free(q->res);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

size_t
sessiond_quota_count(struct sessiond_quota *q)
{
	size_t n;

	if (q == NULL)
		return 0;
	pthread_mutex_lock(&q->lock);
	n = q->n;
	pthread_mutex_unlock(&q->lock);
	return n;
}

/* drop: removes reservation i. Lock held. */
static void
drop(struct sessiond_quota *q, size_t i)
{
	res_clear(&q->res[i]);
	q->res[i] = q->res[--q->n];
}

/* expire: drops every reservation past its time. Lock held. */
static void
expire(struct sessiond_quota *q, uint64_t now)
{
	size_t i = 0;

	while (i < q->n)
		if (q->res[i].expires_ms <= now)
			drop(q, i);
		else
			i++;
}

/* listed_in: whether `id` is among the caller's listed ids. */
static bool
listed_in(const Moat__V1__ReserveQuotaRequest *req, const char *id)
{
	for (size_t i = 0; i < req->n_listed_ids; i++)
		if (strcmp(req->listed_ids[i], id) == 0)
			return true;
	return false;
}

/* held_locked: the caller's listed figures plus the tenant's live
 * reservations: pending ones, and the landed sandboxes neither destroyed
 * nor listed by the caller's inventory. Lock held. */
static void
held_locked(struct sessiond_quota *q, const Moat__V1__ReserveQuotaRequest *req,
    uint64_t held[3])
{
	held[0] = req->listed_sandboxes;
	held[1] = req->listed_vcpus;
	held[2] = req->listed_memory_mib;
	for (size_t i = 0; i < q->n; i++) {
		struct quota_res *r = &q->res[i];
		uint64_t k = 0;

		if (strcmp(r->tenant, req->tenant) != 0)
			continue;
		if (!r->landed)
			k = r->count;
		for (size_t j = 0; r->landed && j < r->n_ids; j++)
			k += !r->gone[j] && !listed_in(req, r->ids[j]);
		held[0] += k;
		held[1] += k * r->vcpus;
		held[2] += k * r->memory_mib;
	}
}

/* check_reserve: INVALID_ARGUMENT naming the first bad field. */
static int
check_reserve(struct moat_rpc_call *call,
    const Moat__V1__ReserveQuotaRequest *req)
{
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK)
		return rv;
	if (req->count < 1 || req->count > COUNT_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "count %u: reserve 1 to %u sandboxes at once", req->count,
		    COUNT_MAX);
	if (req->vcpus < 1 || req->vcpus > VCPUS_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "vcpus %u: each sandbox's vcpus, 1 to %u (the gateway "
		    "sends 1 for the default)",
		    req->vcpus, VCPUS_MAX);
	if (req->memory_mib < 1 || req->memory_mib > MEMORY_MIB_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "memory_mib %u: each sandbox's memory, 1 to %u MiB (the "
		    "gateway sends 256 for the default)",
		    req->memory_mib, MEMORY_MIB_MAX);
	if (req->pending_ms > MAX_PENDING_MS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "pending_ms %u: at most %u (0: %u)", req->pending_ms,
		    MAX_PENDING_MS, PENDING_DEFAULT_MS);
	if (req->n_listed_ids > LISTED_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "listed_ids: %zu given, at most %u: a tenant with more "
		    "sandboxes cannot use cluster-wide quotas",
		    req->n_listed_ids, LISTED_MAX);
	if (req->n_listed_ids > req->listed_sandboxes)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "listed_ids: %zu ids but listed_sandboxes %llu: send the "
		    "ids of the sandboxes the inventory counts",
		    req->n_listed_ids,
		    (unsigned long long)req->listed_sandboxes);
	for (size_t i = 0; i < req->n_listed_ids; i++)
		if ((rv = sessiond_check_short(call, "listed_ids",
		         req->listed_ids[i], SESSIOND_MAX_SANDBOX)) != MOAT_OK)
			return rv;
	return MOAT_OK;
}

/* over: the first limit the request passes, RESOURCE_EXHAUSTED with the
 * gateway's words (admission.c); MOAT_OK when none. */
static int
over(struct moat_rpc_call *call, const Moat__V1__ReserveQuotaRequest *req,
    const uint64_t held[3])
{
	static const char *const keys[] = { "max-sandboxes", "max-vcpus",
		"max-memory-mib" };
	static const char *const what[] = { "sandboxes", "vcpus",
		"MiB of memory" };
	static const char *const advice[] = {
		"destroy one (moat sandbox rm ID)",
		"destroy sandboxes or ask for fewer vcpus (--cpus)",
		"destroy sandboxes or ask for less memory (--memory)",
	};
	const uint64_t max[3] = { req->max_sandboxes, req->max_vcpus,
		req->max_memory_mib };
	const uint64_t add[3] = { req->count,
		(uint64_t)req->count * req->vcpus,
		(uint64_t)req->count * req->memory_mib };

	for (size_t i = 0; i < 3; i++) {
		if (max[i] == 0 || held[i] + add[i] <= max[i])
			continue;
		sessiond_metrics_quota(keys[i]);
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "tenant %s has %llu %s and asked for %llu more, its limit "
		    "is %llu ([tenants] %s.%s; counted on every gateway): %s, "
		    "or raise the limit (moat-gateway tenants set %s %s=N)",
		    req->tenant, (unsigned long long)held[i], what[i],
		    (unsigned long long)add[i], (unsigned long long)max[i],
		    keys[i], req->tenant, advice[i], req->tenant, keys[i]);
	}
	return MOAT_OK;
}

/* record_locked: appends the reservation; 0 when out of memory. */
static uint64_t
record_locked(struct sessiond_quota *q,
    const Moat__V1__ReserveQuotaRequest *req, uint64_t now)
{
	struct quota_res *r;

	if (q->n == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 64;
		struct quota_res *grown = realloc(q->res, cap * sizeof(*r));

		if (grown == NULL)
			return 0;
		q->res = grown;
		q->cap = cap;
	}
	r = &q->res[q->n++];
	memset(r, 0, sizeof(*r));
	r->handle = q->next_handle++;
	if (r->handle == 0)
		r->handle = q->next_handle++;
	memcpy(r->tenant, req->tenant, strlen(req->tenant) + 1);
	r->count = req->count;
	r->vcpus = req->vcpus;
	r->memory_mib = req->memory_mib;
	r->expires_ms =
	    now + (req->pending_ms ? req->pending_ms : PENDING_DEFAULT_MS);
	return r->handle;
}

int
sessiond_h_reserve_quota(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	struct sessiond_quota *q = sd->quota;
	const Moat__V1__ReserveQuotaRequest *req =
	    (const Moat__V1__ReserveQuotaRequest *)request;
	Moat__V1__ReserveQuotaReply *out =
	    (Moat__V1__ReserveQuotaReply *)reply;
	uint64_t held[3], now = moat_now_unix_ms();
	int rv;

	if ((rv = check_reserve(call, req)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&q->lock);
	expire(q, now);
	held_locked(q, req, held);
	if ((rv = over(call, req, held)) != MOAT_OK) {
		pthread_mutex_unlock(&q->lock);
		return rv;
	}
	if (q->n >= q->max) {
		pthread_mutex_unlock(&q->lock);
		sessiond_metrics_quota("full");
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "sessiond holds %zu quota reservations, its limit "
		    "([sessiond] quota-reservations-max): retry in a few "
		    "seconds (they end as sandboxes are made), or raise it",
		    q->n);
	}
	out->handle = record_locked(q, req, now);
	pthread_mutex_unlock(&q->lock);
	if (out->handle == 0)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "sessiond is out of memory");
	out->sandboxes = held[0] + req->count;
	out->vcpus = held[1] + (uint64_t)req->count * req->vcpus;
	out->memory_mib = held[2] + (uint64_t)req->count * req->memory_mib;
	return MOAT_OK;
}

/* find_locked: the live reservation `handle` of `tenant`, or the
 * NOT_FOUND replied. Lock held. */
static int
find_locked(struct moat_rpc_call *call, struct sessiond_quota *q,
    const char *tenant, uint64_t handle, size_t *at)
{
	expire(q, moat_now_unix_ms());
	for (size_t i = 0; i < q->n; i++)
		if (q->res[i].handle == handle &&
		    strcmp(q->res[i].tenant, tenant) == 0) {
			*at = i;
			return MOAT_OK;
		}
	return moat_rpc_error(call, MOAT_NOT_FOUND,
	    "no quota reservation %llu of tenant %s (expired, released, or "
	    "landed already): nothing to do, the inventory counts the "
	    "sandboxes",
	    (unsigned long long)handle, tenant);
}

/* check_ids: INVALID_ARGUMENT naming the first bad id of `field`. */
static int
check_ids(struct moat_rpc_call *call, const char *field, char **ids, size_t n)
{
	int rv;

	if (n > COUNT_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%s: %zu given, at most %u", field, n, COUNT_MAX);
	for (size_t i = 0; i < n; i++) {
		if (ids[i][0] == '\0')
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "%s[%zu] is empty: send sandbox ids", field, i);
		if ((rv = sessiond_check_short(call, field, ids[i],
		         SESSIOND_MAX_SANDBOX)) != MOAT_OK)
			return rv;
	}
	return MOAT_OK;
}

/* forget_locked: marks `tenant`'s landed sandboxes among ids destroyed.
 * Lock held. */
static void
forget_locked(struct sessiond_quota *q, const char *tenant, char **ids,
    size_t n)
{
	for (size_t i = 0; i < q->n; i++) {
		struct quota_res *r = &q->res[i];

		if (!r->landed || strcmp(r->tenant, tenant) != 0)
			continue;
		for (size_t j = 0; j < r->n_ids; j++)
			for (size_t k = 0; k < n && !r->gone[j]; k++)
				r->gone[j] = strcmp(r->ids[j], ids[k]) == 0;
	}
}

/* land_ids: the landed ids into r (heap); false when out of memory. */
static bool
land_ids(struct quota_res *r, const Moat__V1__LandQuotaRequest *req)
{
	size_t n = req->n_sandbox_ids;

	r->ids = calloc(n ? n : 1, sizeof(*r->ids));
	r->gone = calloc(n ? n : 1, sizeof(*r->gone));
	if (r->ids == NULL || r->gone == NULL)
		return false;
	for (size_t i = 0; i < n; i++) {
		if ((r->ids[i] = strdup(req->sandbox_ids[i])) == NULL)
			return false;
		r->n_ids++;
	}
	return true;
}

int
sessiond_h_land_quota(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	struct sessiond_quota *q = sd->quota;
	const Moat__V1__LandQuotaRequest *req =
	    (const Moat__V1__LandQuotaRequest *)request;
	size_t at;
	int rv;

	(void)reply;
	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = check_ids(call, "sandbox_ids", req->sandbox_ids,
	         req->n_sandbox_ids)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&q->lock);
	if ((rv = find_locked(call, q, req->tenant, req->handle, &at)) !=
	    MOAT_OK) {
		pthread_mutex_unlock(&q->lock);
		return rv;
	}
	if (q->res[at].landed || req->n_sandbox_ids > q->res[at].count) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "quota reservation %llu %s: land it once, with at most "
		    "%u sandbox ids",
		    (unsigned long long)req->handle,
		    q->res[at].landed ? "landed already" : "is smaller",
		    q->res[at].count);
	} else if (!land_ids(&q->res[at], req)) {
		drop(q, at);
		rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "sessiond is out of memory");
	} else {
		q->res[at].landed = true;
		q->res[at].expires_ms = moat_now_unix_ms() + LANDED_MS;
	}
	pthread_mutex_unlock(&q->lock);
	return rv;
}

int
sessiond_h_release_quota(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	struct sessiond_quota *q = sd->quota;
	const Moat__V1__ReleaseQuotaRequest *req =
	    (const Moat__V1__ReleaseQuotaRequest *)request;
	size_t at;
	int rv;

	(void)reply;
	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = check_ids(call, "sandbox_ids", req->sandbox_ids,
	         req->n_sandbox_ids)) != MOAT_OK)
		return rv;
	if (req->handle == 0 && req->n_sandbox_ids == 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "ReleaseQuota: give the reservation's handle, or with "
		    "handle 0 the ids of destroyed sandboxes");
	pthread_mutex_lock(&q->lock);
	if (req->handle == 0) {
		forget_locked(q, req->tenant, req->sandbox_ids,
		    req->n_sandbox_ids);
	} else if ((rv = find_locked(call, q, req->tenant, req->handle,
	                &at)) == MOAT_OK) {
		drop(q, at);
	}
	pthread_mutex_unlock(&q->lock);
	return rv;
}
