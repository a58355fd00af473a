/*
 * admission.h: what the gateway checks and holds before it sends a
 * sandbox to a node (issue 15, parts 4 and 6). Placement (placement.c)
 * is a pure ranking over a node table with the node's own figures plus
 * this gateway's reservations; admission (admission.c) keeps those
 * reservations (a sandbox slot, vcpus, memory and scratch per placed
 * sandbox, until the node's next survey counts it or 30 s pass), the
 * per-tenant quotas ([tenants] max-sandboxes, max-vcpus, max-memory-mib,
 * max-snapshot-bytes) and the per-API-key token buckets ([tenants]
 * key-rps, key-burst) every door takes from, with their metrics.
 * Not for: talking to nodes (forward.c) or the node table (discovery.c).
 */
#ifndef MOAT_GATEWAY_ADMISSION_H
#define MOAT_GATEWAY_ADMISSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway.h"
#include "moat/rpc.h" /* MOAT_PROTOCOL_VERSION_MIN */

struct moat_metrics;

/* moat_gw_snapshot_quota: before a snapshot of t->tenant: MOAT_OK when
 * its [tenants] max-snapshot-bytes is 0 or above what its snapshots hold
 * on the available nodes (asked of each, within deadline_ms); else
 * RESOURCE_EXHAUSTED with *errmsg naming the limit. */
int moat_gw_snapshot_quota(struct moat_travel *t, uint64_t deadline_ms,
    char **errmsg) __attribute__((warn_unused_result));

#define MOAT_VCPU_OVERCOMMIT 4.0            /* [gateway] vcpu-overcommit */
#define MOAT_RESERVATION_MAX_MS 30000       /* a reservation's longest life */
#define MOAT_NODE_DEFAULT_SCRATCH_MIB 1024u /* vmd's scratch default */
#define MOAT_PLACE_TRIES_MAX 8 /* nodes one create tries at most */

/* One placement question. Per-node arrays are indexed like the table
 * given with it; NULL: zeros. */
struct moat_place_req {
	uint32_t vcpus, memory_mib; /* 0: the node defaults (1, 256) */
	uint64_t scratch_mib;       /* 0: MOAT_NODE_DEFAULT_SCRATCH_MIB */
	const char *image;          /* "" or "default": any node */
	/* CreateSandboxRequest.node_selector: every entry must be one of
	 * the node's labels. */
	Moat__V1__CreateSandboxRequest__NodeSelectorEntry *const *selector;
	size_t n_selector;
	double overcommit; /* vcpus a node takes per vcpu it has; 0: 4 */
	const uint32_t *tenant_sandboxes; /* the tenant's, per node */
	const bool *skip;       /* nodes that refused this request already */
	const char *survey_url; /* named when no node is known */
};

/* moat_placement_unusable: why placement never uses `node` although it
 * answers (cordoned; a protocol version below MOAT_PROTOCOL_VERSION_MIN,
 * 0 counting as 1), written into buf; NULL when it is usable. */
const char *moat_placement_unusable(const Moat__V1__Node *node, char *buf,
    size_t size);

/* moat_placement_pick: the node for `req` among `nodes`: available,
 * usable, not skipped, with every selector label, within its
 * per-sandbox limits, and room: memory, vcpus (used
 * plus asked at most vcpus_total * overcommit) and scratch disk (when
 * the node reports scratch_free_bytes). Ranked by whether the node
 * holds req->image (holders first: others must pull it), the tenant's
 * sandboxes there (fewest first: a tenant spreads), then all sandboxes,
 * then free memory, then id. Errors as moat_placement_choose, plus
 * FAILED_PRECONDITION when every node is unusable, skipped or lacks a
 * label, each message saying what to do. Pure. */
int moat_placement_pick(Moat__V1__Node *const *nodes, size_t n,
    const struct moat_place_req *req, size_t *chosen, char **errmsg)
    __attribute__((warn_unused_result));

/* What a tenant holds (inventory.c). */
struct moat_usage {
	uint64_t sandboxes, vcpus, memory_mib;
};

/* moat_inventory_usage: `tenant`'s sandboxes in the inventory (every
 * node, available or not): *total, and per_node (n entries, may be
 * NULL) the count on each of `nodes` by id. Safe on inv NULL (zeros). */
void moat_inventory_usage(struct moat_inventory *inv, const char *tenant,
    Moat__V1__Node *const *nodes, size_t n, uint32_t *per_node,
    struct moat_usage *total);

/* ---- admission.c ---- */

struct moat_admission;

/* moat_admission_new: reservations, quotas and key buckets over
 * `config` ([gateway] vcpu-overcommit, [tenants]; borrowed, NULL: the
 * defaults), its metrics in `reg` (borrowed; NULL: none) and the
 * inventory `inv` (borrowed; may be set later). INVALID_ARGUMENT with
 * *errmsg (heap) when vcpu-overcommit is not a ratio of 0.1..1000. */
int moat_admission_new(struct moat_admission **out,
    const struct moat_config *config, struct moat_metrics *reg, char **errmsg)
    __attribute__((warn_unused_result));
void moat_admission_set_inventory(struct moat_admission *a,
    struct moat_inventory *inv);
void moat_admission_free(struct moat_admission *a);

/* moat_admission_overcommit: the configured [gateway] vcpu-overcommit. */
double moat_admission_overcommit(const struct moat_admission *a);

/* moat_admission_place: one sandbox of `req` for `tenant` (its
 * tenant_sandboxes and overcommit filled here), atomically: the
 * tenant's quotas when `quota` (moat_admission_quota), this gateway's
 * reservations added to the copies `nodes`, the pick
 * (moat_placement_pick), and a reservation on the node chosen. On
 * MOAT_OK *chosen indexes nodes and *handle is the reservation (call
 * moat_admission_landed or _release; 0 when it could not be held).
 * Errors as the quota and the pick, with *errmsg. */
int moat_admission_place(struct moat_admission *a, Moat__V1__Node **nodes,
    size_t n, const char *tenant, struct moat_place_req *req, bool quota,
    size_t *chosen, uint64_t *handle, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_admission_apply: adds this gateway's live reservations to the
 * copies `nodes` (sandboxes, vcpus_used, memory_mib_used,
 * scratch_free_bytes) and fills tenant_sandboxes (n entries; may be
 * NULL) with `tenant`'s sandboxes per node from the inventory plus its
 * reservations. Drops reservations that the node's survey answer
 * (last_seen_unix_ms) has counted, or older than 30 s. */
void moat_admission_apply(struct moat_admission *a, Moat__V1__Node **nodes,
    size_t n, const char *tenant, uint32_t *tenant_sandboxes);

/* moat_admission_reserve: holds a sandbox of `req`'s size on `node` for
 * `tenant`; returns its handle (0 when out of memory: nothing held). */
uint64_t moat_admission_reserve(struct moat_admission *a, const char *node,
    const char *tenant, const struct moat_place_req *req);

/* moat_admission_landed: the reserved sandbox `sandbox_id` exists on its
 * node now: the reservation lasts until the node's next survey (or
 * 30 s); the quotas count it until the inventory does.
 * moat_admission_release: it never will (the node refused): dropped. */
void moat_admission_landed(struct moat_admission *a, uint64_t handle,
    const char *sandbox_id);
void moat_admission_release(struct moat_admission *a, uint64_t handle);

/* moat_admission_refused: counts a node's refusal of a placed sandbox
 * (moat_gateway_placement_refusals_total{node}). */
void moat_admission_refused(struct moat_admission *a, const char *node);

/* moat_admission_quota: whether `tenant` may have `count` sandboxes more
 * of `vcpus` and `memory_mib` each (0: the defaults 1 and 256), counted
 * from the inventory of every node plus pending reservations:
 * MOAT_OK, or RESOURCE_EXHAUSTED with *errmsg (heap) naming the limit
 * and its config key (counted in moat_gateway_quota_refusals_total),
 * or INVALID_ARGUMENT when the limit's value is not a number. */
int moat_admission_quota(struct moat_admission *a, const char *tenant,
    uint32_t count, uint32_t vcpus, uint32_t memory_mib, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_admission_snapshot_quota: whether `tenant`, holding `bytes` of
 * snapshots now, may take another; as moat_admission_quota, for
 * [tenants] max-snapshot-bytes. */
int moat_admission_snapshot_quota(struct moat_admission *a, const char *tenant,
    uint64_t bytes, char **errmsg) __attribute__((warn_unused_result));

/* moat_admission_snapshot_limit: `tenant`'s [tenants]
 * max-snapshot-bytes (0: unlimited, or not a number). */
uint64_t moat_admission_snapshot_limit(struct moat_admission *a,
    const char *tenant);

/* moat_admission_key: takes one token of API key `key_id`'s bucket
 * ([tenants] key-rps.<tenant> / key-burst.<tenant>, else key-rps /
 * key-burst, else `door`'s rates, else (door NULL) [gateway]
 * rate-limit-rps / rate-limit-burst). True
 * when there was one (or key_id is "": no key, auth off); false with
 * *retry_s and *errmsg (heap) naming the limit and its keys. */
struct moat_key_rate {
	uint32_t rps, burst; /* a door's own defaults (0: no limit) */
};
bool moat_admission_key(struct moat_admission *a, const char *tenant,
    const char *key_id, const struct moat_key_rate *door, uint32_t *retry_s,
    char **errmsg);

/* moat_admission_limits: `tenant`'s [tenants] max-sandboxes, max-vcpus
 * and max-memory-mib into max (0: unlimited); INVALID_ARGUMENT with
 * *errmsg when one is not a number. a or tenant NULL: zeros. */
int moat_admission_limits(struct moat_admission *a, const char *tenant,
    uint64_t max[3], char **errmsg) __attribute__((warn_unused_result));

/* moat_admission_count_refusal: counts a quota refusal of `limit` (a
 * [tenants] key) in moat_gateway_quota_refusals_total. */
void moat_admission_count_refusal(struct moat_admission *a, const char *limit);

/* The inventory and metrics admission was given (NULL: none). */
struct moat_inventory *moat_admission_inventory(struct moat_admission *a);
struct moat_metrics *moat_admission_metrics(struct moat_admission *a);

/* ---- quota_remote.c: quotas counted cluster-wide in sessiond ---- */

struct moat_quota_remote;

/* moat_quota_remote_new: quota reservations through sessiond at `url`
 * (client and url borrowed; they outlive it). NULL when out of memory. */
struct moat_quota_remote *
moat_quota_remote_new(struct moat_rpc_client *sessiond, const char *url);
void moat_quota_remote_free(struct moat_quota_remote *r);

/* moat_admission_set_remote: quotas go through `remote` (taken; freed
 * with a) from now on; NULL: this gateway's own count only.
 * moat_admission_remote: what was set. */
void moat_admission_set_remote(struct moat_admission *a,
    struct moat_quota_remote *remote);
struct moat_quota_remote *moat_admission_remote(struct moat_admission *a);

/* What a quota check holds until its sandboxes exist or failed. */
struct moat_quota_hold {
	uint64_t handle; /* sessiond's reservation; 0: none */
	bool local;      /* sessiond did not count it: check locally */
};

/* moat_quota_reserve: `count` sandboxes of `vcpus` and `memory_mib`
 * each (0: the defaults 1 and 256) for `tenant`, reserved in sessiond
 * against the tenant's limits with this gateway's inventory: MOAT_OK
 * with hold->handle (land or release it), or RESOURCE_EXHAUSTED naming
 * the limit (*errmsg, heap). No limit set: nothing held. No sessiond
 * set, or one that does not answer: MOAT_OK with hold->local (the
 * caller checks this gateway's count, moat_admission_quota or _place),
 * the fallback counted in moat_gateway_quota_local_fallbacks_total and
 * warned once per MOAT_QUOTA_BACKOFF_MS, during which sessiond is not
 * asked again. */
#define MOAT_QUOTA_BACKOFF_MS 5000
int moat_quota_reserve(struct moat_admission *a, const char *tenant,
    uint32_t count, uint32_t vcpus, uint32_t memory_mib, uint64_t deadline_ms,
    struct moat_quota_hold *hold, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_quota_check: moat_quota_reserve, then moat_admission_quota when
 * the hold is local. */
int moat_quota_check(struct moat_admission *a, const char *tenant,
    uint32_t count, uint32_t vcpus, uint32_t memory_mib, uint64_t deadline_ms,
    struct moat_quota_hold *hold, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_quota_landed: the held sandboxes exist (`n` ids; fewer than
 * reserved gives the rest back). moat_quota_release: none was made.
 * Both clear the hold; errors are logged (the reservation expires). */
void moat_quota_landed(struct moat_admission *a, const char *tenant,
    struct moat_quota_hold *hold, const char *const *ids, size_t n);
void moat_quota_release(struct moat_admission *a, const char *tenant,
    struct moat_quota_hold *hold);

/* moat_quota_destroyed: `tenant`'s sandbox `sandbox_id` was destroyed:
 * sessiond's landed reservations stop counting it at once (rather than
 * until they expire). Only when the tenant has a limit and sessiond
 * answers (not in a backoff); errors are logged, never returned. */
void moat_quota_destroyed(struct moat_admission *a, const char *tenant,
    const char *sandbox_id);

/* moat_inventory_tenant_ids: `tenant`'s sandboxes in the inventory:
 * *total as moat_inventory_usage and their ids (*ids, *n; heap, caller
 * frees each and the array), read under one lock. False when out of
 * memory. */
bool moat_inventory_tenant_ids(struct moat_inventory *inv, const char *tenant,
    struct moat_usage *total, char ***ids, size_t *n);

/* ---- place_create.c ---- */

/* One CreateSandbox to place and send (all borrowed). */
struct moat_gw_create {
	struct moat_nodes *nodes;
	struct moat_forward *fw;
	struct moat_admission *adm; /* NULL: no reservations, no quotas */
	const char *tenant;
	const Moat__V1__CreateSandboxRequest *req; /* tenant set */
	const char *survey_url, *what; /* what: "the new sandbox" */
	uint64_t request_id, deadline_ms;
	bool quota; /* check the tenant's quotas first */
};

/* moat_gw_create: places c->req (moat_admission_place, the quotas
 * checked once when c->quota) and sends it; a node that refuses
 * (RESOURCE_EXHAUSTED, UNAVAILABLE, FAILED_PRECONDITION) is skipped and
 * the next tried, up to MOAT_PLACE_TRIES_MAX nodes. On MOAT_OK *node is
 * where it runs, *out (*out_len) the node's encoded reply and *sb its
 * decoding, both the caller's. Otherwise *errmsg (heap) says why, with
 * every node's refusal when all refused. */
int moat_gw_create(struct moat_gw_create *c, struct moat_node_id *node,
    uint8_t **out, size_t *out_len, Moat__V1__Sandbox **sb, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_gw_snapshot_quota: before a snapshot of t->tenant: MOAT_OK when
 * its [tenants] max-snapshot-bytes is 0 or above what its snapshots hold
 * on the available nodes (asked of each, within deadline_ms); else
 * RESOURCE_EXHAUSTED with *errmsg naming the limit. */
int moat_gw_snapshot_quota(struct moat_travel *t, uint64_t deadline_ms,
    char **errmsg) __attribute__((warn_unused_result));

#endif
