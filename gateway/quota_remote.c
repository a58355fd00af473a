/*
 * quota_remote.c: tenants' quotas counted across every gateway (issue
 * 15) through moat-sessiond's reservations (services/session/quota.c).
 * Each gateway surveys every node, so its inventory counts what exists;
 * what it cannot see is the other gateways' creates in flight. Before a
 * create, restore into a new sandbox or fork, the gateway sends its
 * inventory's count and ids for the tenant and the limits it resolved;
 * sessiond adds every gateway's reservations not listed yet and either
 * holds the new one or refuses. The hold is landed with the sandboxes'
 * ids, or released when nothing was made; a destroyed sandbox is named
 * to sessiond, so a landed reservation stops counting it at once.
 *
 * sessiond down must never block creates: a reserve that gets no answer
 * falls back to this gateway's own count (admission.c), counted in
 * moat_gateway_quota_local_fallbacks_total and warned once per
 * MOAT_QUOTA_BACKOFF_MS, during which sessiond is not asked (each try
 * could wait its 3 s). Only a burst through several gateways in that
 * time can then pass a limit, as before.
 * Not for: placement's own reservations (admission.c), the limits'
 * values (config, tenants_remote.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "auth.h"
#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

struct moat_quota_remote {
	struct moat_rpc_client *sessiond; /* borrowed */
	const char *url;                  /* borrowed */
	pthread_mutex_t lock;             /* guards down_until_ms */
	uint64_t down_until_ms;           /* monotonic; 0: ask sessiond */
};

struct moat_quota_remote *
moat_quota_remote_new(struct moat_rpc_client *sessiond, const char *url)
{
	struct moat_quota_remote *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	pthread_mutex_init(&r->lock, NULL);
	r->sessiond = sessiond;
	r->url = url;
	return r;
}

void
moat_quota_remote_free(struct moat_quota_remote *r)
{
	if (r == NULL)
		return;
	pthread_mutex_destroy(&r->lock);
	free(r);
}

/* in_backoff: whether sessiond failed within MOAT_QUOTA_BACKOFF_MS. */
static bool
in_backoff(struct moat_quota_remote *r)
{
	bool down;

	pthread_mutex_lock(&r->lock);
	down = moat_rpc_now_ms() < r->down_until_ms;
	pthread_mutex_unlock(&r->lock);
	return down;
}

/* fallback: this check is counted locally; the first of a backoff
 * period says why. */
static void
fallback(struct moat_admission *a, struct moat_quota_remote *r, int rv,
    const char *why)
{
	struct moat_metrics *reg = moat_admission_metrics(a);
	bool warn = false;

	if (reg != NULL)
		moat_counter_inc(moat_metrics_counter(reg,
		    "moat_gateway_quota_local_fallbacks_total",
		    "Quota checks counted by this gateway alone because "
		    "moat-sessiond did not answer (creates through several "
		    "gateways at once may then pass a limit).",
		    NULL));
	if (rv == MOAT_OK)
		return; /* within a backoff period: warned already */
	pthread_mutex_lock(&r->lock);
	if (moat_rpc_now_ms() >= r->down_until_ms) {
		r->down_until_ms = moat_rpc_now_ms() + MOAT_QUOTA_BACKOFF_MS;
		warn = true;
	}
	pthread_mutex_unlock(&r->lock);
	if (warn)
		moat_warn(0,
		    "quotas: moat-sessiond did not reserve (%s): quotas are "
		    "counted by this gateway alone for %d s",
		    why ? why : moat_strerror(rv),
		    MOAT_QUOTA_BACKOFF_MS / 1000);
}

/* refusal_key: the [tenants] key sessiond's refusal names. */
static const char *
refusal_key(const char *msg)
{
	static const char *const keys[] = { "max-sandboxes", "max-vcpus",
		"max-memory-mib" };

	for (size_t i = 0; msg != NULL && i < 3; i++)
		if (strstr(msg, keys[i]) != NULL)
			return keys[i];
	return "reservations";
}

/* refusal_text: sessiond's refusal `why` (taken) as the caller should
 * read it: without the "moat-sessiond at URL: " that
 * moat_sessiond_remote_call puts first (where the count is kept is no
 * concern of the caller's; the message says "counted on every
 * gateway"). */
static char *
refusal_text(const struct moat_quota_remote *r, char *why)
{
	char *prefix = moat_asprintf("moat-sessiond at %s: ", r->url);
	size_t len = prefix != NULL ? strlen(prefix) : 0;

	if (why != NULL && len != 0 && strncmp(why, prefix, len) == 0)
		memmove(why, why + len, strlen(why + len) + 1);
	free(prefix);
	return why;
}

/* ask: ReserveQuota with this gateway's inventory of the tenant. */
static int
ask(struct moat_admission *a, struct moat_quota_remote *r,
    Moat__V1__ReserveQuotaRequest *req, uint64_t *handle, char **errmsg)
{
	Moat__V1__ReserveQuotaReply *reply = NULL;
	struct moat_usage u;
	char **ids = NULL;
	size_t n = 0;
	int rv;

	if (!moat_inventory_tenant_ids(moat_admission_inventory(a),
	        req->tenant, &u, &ids, &n)) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory");
		goto out;
	}
	req->listed_sandboxes = u.sandboxes;
	req->listed_vcpus = u.vcpus;
	req->listed_memory_mib = u.memory_mib;
	req->listed_ids = ids;
	req->n_listed_ids = n;
	rv = moat_sessiond_remote_call(r->sessiond, r->url, "ReserveQuota",
	    &req->base, &moat__v1__reserve_quota_reply__descriptor,
	    (ProtobufCMessage **)&reply, errmsg);
	if (rv == MOAT_OK) {
		*handle = reply->handle;
		moat__v1__reserve_quota_reply__free_unpacked(reply, NULL);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
	return rv;
}

int
moat_quota_reserve(struct moat_admission *a, const char *tenant,
    uint32_t count, uint32_t vcpus, uint32_t memory_mib, uint64_t deadline_ms,
    struct moat_quota_hold *hold, char **errmsg)
{
	struct moat_quota_remote *r = moat_admission_remote(a);
	Moat__V1__ReserveQuotaRequest req =
	    MOAT__V1__RESERVE_QUOTA_REQUEST__INIT;
	uint64_t max[3], now = moat_rpc_now_ms();
	char *why = NULL;
	int rv;

	*hold = (struct moat_quota_hold){ .handle = 0, .local = true };
	if (a == NULL || tenant == NULL || r == NULL)
		return MOAT_OK;
	if ((rv = moat_admission_limits(a, tenant, max, errmsg)) != MOAT_OK)
		return rv;
	if (max[0] == 0 && max[1] == 0 && max[2] == 0) {
		hold->local = false; /* no limit: nothing to count */
		return MOAT_OK;
	}
	if (in_backoff(r)) {
		fallback(a, r, MOAT_OK, NULL);
		return MOAT_OK;
	}
	req.tenant = (char *)tenant;
	req.count = count;
	req.vcpus = vcpus ? vcpus : 1;
	req.memory_mib = memory_mib ? memory_mib : 256;
	req.max_sandboxes = max[0];
	req.max_vcpus = max[1];
	req.max_memory_mib = max[2];
	req.pending_ms = deadline_ms > now && deadline_ms - now < 600000 ?
	    (uint32_t)(deadline_ms - now) :
	    0;
	rv = ask(a, r, &req, &hold->handle, &why);
	if (rv == MOAT_OK) {
		hold->local = false;
		return MOAT_OK;
	}
	if (rv == MOAT_RESOURCE_EXHAUSTED) {
		moat_admission_count_refusal(a, refusal_key(why));
		*errmsg = refusal_text(r, why);
		return rv;
	}
	/* No answer, an old sessiond or a request it refused: this
	 * gateway's count, never a create blocked on sessiond. */
	fallback(a, r, rv, why);
	free(why);
	return MOAT_OK;
}

int
moat_quota_check(struct moat_admission *a, const char *tenant, uint32_t count,
    uint32_t vcpus, uint32_t memory_mib, uint64_t deadline_ms,
    struct moat_quota_hold *hold, char **errmsg)
{
	int rv = moat_quota_reserve(a, tenant, count, vcpus, memory_mib,
	    deadline_ms, hold, errmsg);

	if (rv == MOAT_OK && hold->local)
		rv = moat_admission_quota(a, tenant, count, vcpus, memory_mib,
		    errmsg);
	return rv;
}

/* finish: LandQuota (land) or ReleaseQuota of the hold. */
static void
finish(struct moat_admission *a, const char *tenant,
    struct moat_quota_hold *hold, bool land, const char *const *ids, size_t n)
{
	struct moat_quota_remote *r = moat_admission_remote(a);
	Moat__V1__LandQuotaRequest lreq = MOAT__V1__LAND_QUOTA_REQUEST__INIT;
	Moat__V1__ReleaseQuotaRequest rreq =
	    MOAT__V1__RELEASE_QUOTA_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *msg = NULL;
	int rv;

	if (r == NULL || hold == NULL || hold->handle == 0)
		return;
	lreq.tenant = rreq.tenant = (char *)tenant;
	lreq.handle = rreq.handle = hold->handle;
	lreq.sandbox_ids = (char **)ids;
	lreq.n_sandbox_ids = n;
	rv = moat_sessiond_remote_call(r->sessiond, r->url,
	    land ? "LandQuota" : "ReleaseQuota",
	    land ? &lreq.base : &rreq.base, &moat__v1__quota_reply__descriptor,
	    &reply, &msg);
	if (rv != MOAT_OK)
		moat_info(0,
		    "quotas: %s of reservation %llu failed (%s): it expires "
		    "on its own",
		    land ? "landing" : "release",
		    (unsigned long long)hold->handle,
		    msg ? msg : moat_strerror(rv));
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	free(msg);
	hold->handle = 0;
}

void
moat_quota_landed(struct moat_admission *a, const char *tenant,
    struct moat_quota_hold *hold, const char *const *ids, size_t n)
{
	if (n == 0)
		finish(a, tenant, hold, false, NULL, 0);
	else
		finish(a, tenant, hold, true, ids, n);
}

void
moat_quota_release(struct moat_admission *a, const char *tenant,
    struct moat_quota_hold *hold)
{
	finish(a, tenant, hold, false, NULL, 0);
}

void
moat_quota_destroyed(struct moat_admission *a, const char *tenant,
    const char *sandbox_id)
{
	struct moat_quota_remote *r = moat_admission_remote(a);
	Moat__V1__ReleaseQuotaRequest req =
	    MOAT__V1__RELEASE_QUOTA_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	uint64_t max[3];
	char *ids[1] = { (char *)sandbox_id }, *msg = NULL;
	int rv;

	if (r == NULL || tenant == NULL || sandbox_id == NULL ||
	    sandbox_id[0] == '\0' || in_backoff(r) ||
	    moat_admission_limits(a, tenant, max, &msg) != MOAT_OK ||
	    (max[0] == 0 && max[1] == 0 && max[2] == 0)) {
		free(msg);
		return;
	}
	req.tenant = (char *)tenant;
	req.sandbox_ids = ids;
	req.n_sandbox_ids = 1;
	rv = moat_sessiond_remote_call(r->sessiond, r->url, "ReleaseQuota",
	    &req.base, &moat__v1__quota_reply__descriptor, &reply, &msg);
	if (rv != MOAT_OK)
		moat_info(0,
		    "quotas: sessiond was not told sandbox %s is gone (%s): "
		    "a reservation made in the last %d s may count it until "
		    "it expires",
		    sandbox_id, msg ? msg : moat_strerror(rv),
		    MOAT_RESERVATION_MAX_MS / 1000);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	free(msg);
}
