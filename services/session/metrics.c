/*
 * metrics.c: moat-sessiond's metrics (metrics.h). Writes and commits are
 * counted and timed by the writer (writer.c) as they happen; recordings,
 * the write queue and the LMDB map are read at each scrape.
 * Not for: the registry, the text or the listener (lib/metrics*.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"
#include "metrics.h"

#define N_KINDS 5

/* Every metric of sessiond; NULL while metrics are off. Set before the
 * RPC server starts, cleared after it and the writer stopped. */
static struct sessiond_metrics {
	struct moat_metrics *reg;
	struct moat_metrics_server *srv;
	struct sessiond *sd;
	struct moat_counter *writes[N_KINDS][2]; /* failed, ok */
	struct moat_histogram *append, *write_other;
	struct moat_histogram *fsync, *batch;
	struct moat_counter *commits[2];
	struct moat_gauge *sessions, *queued;
	struct moat_gauge *lmdb_used, *lmdb_map;
	struct moat_gauge *quota_res;
} m;

static const char *const kind_names[N_KINDS] = { "create", "append", "delete",
	"set_snapshot", "set_keep" };

static void
sessiond_scrape(void *ctx)
{
	struct sessiond *sd = ctx;
	struct moat_store_txn *txn = NULL;
	uint64_t used, map, sessions = 0;
	char *errmsg = NULL;

	moat_store_usage(sd->store, &used, &map);
	moat_gauge_set(m.lmdb_used, (double)used);
	moat_gauge_set(m.lmdb_map, (double)map);
	moat_gauge_set(m.queued, (double)sessiond_writer_queued(sd->writer));
	if (moat_store_txn_begin(sd->store, false, &txn, &errmsg) == MOAT_OK &&
	    moat_store_count(txn, "sessions", &sessions, &errmsg) == MOAT_OK)
		moat_gauge_set(m.sessions, (double)sessions);
	moat_store_txn_abort(txn);
	free(errmsg);
	moat_gauge_set(m.quota_res, (double)sessiond_quota_count(sd->quota));
}

static void
register_all(struct moat_metrics *reg)
{
	static const double batch_bounds[] = { 1, 2, 4, 8, 16, 32, 64, 128,
		256, 512 };
	const double *lat = moat_metrics_latency_buckets;
	const size_t n_lat = MOAT_METRICS_LATENCY_N;

	for (int k = 0; k < N_KINDS; k++)
		for (int ok = 0; ok < 2; ok++) {
			const char *labels[] = { "op", kind_names[k], "result",
				ok ? "ok" : "error", NULL };

			m.writes[k][ok] = moat_metrics_counter(reg,
			    "moat_sessiond_writes_total",
			    "Writes answered, by op (append: a recorded step) "
			    "and result.",
			    labels);
		}
	m.append = moat_metrics_histogram(reg, "moat_sessiond_append_seconds",
	    "An AppendStep answered OK, whole: queued, applied, committed "
	    "with fsync.",
	    NULL, lat, n_lat);
	m.write_other =
	    moat_metrics_histogram(reg, "moat_sessiond_write_seconds",
	        "The other writes (create, delete, set_snapshot, set_keep) "
	        "answered OK, whole.",
	        NULL, lat, n_lat);
	m.fsync = moat_metrics_histogram(reg, "moat_sessiond_fsync_seconds",
	    "One durable commit of the writer thread (LMDB commit with "
	    "fsync), shared by every write of its batch.",
	    NULL, lat, n_lat);
	m.batch = moat_metrics_histogram(reg, "moat_sessiond_commit_writes",
	    "Writes per durable commit (group commit).", NULL, batch_bounds,
	    sizeof(batch_bounds) / sizeof(batch_bounds[0]));
	for (int ok = 0; ok < 2; ok++) {
		const char *labels[] = { "result", ok ? "ok" : "error", NULL };

		m.commits[ok] =
		    moat_metrics_counter(reg, "moat_sessiond_commits_total",
		        "Durable commits of the writer thread, by result.",
		        labels);
	}
	m.sessions = moat_metrics_gauge(reg, "moat_sessiond_recordings",
	    "Recordings (sessions) kept.", NULL);
	m.queued = moat_metrics_gauge(reg, "moat_sessiond_write_queue",
	    "Writes waiting for the writer thread.", NULL);
	m.lmdb_used = moat_metrics_gauge(reg, "moat_sessiond_lmdb_used_bytes",
	    "Pages the LMDB environment has written (it reuses freed "
	    "ones; it never shrinks).",
	    NULL);
	m.lmdb_map = moat_metrics_gauge(reg, "moat_sessiond_lmdb_map_bytes",
	    "The LMDB map size ([sessiond] map-size-mib): writes fail with "
	    "RESOURCE_EXHAUSTED once used reaches it.",
	    NULL);
	m.quota_res =
	    moat_metrics_gauge(reg, "moat_sessiond_quota_reservations",
	        "Quota reservations the gateways hold (creates, restores and "
	        "forks not yet listed by their inventories).",
	        NULL);
}

int
sessiond_metrics_start(struct sessiond *sd, const char *addr, char **errmsg)
{
	struct moat_metrics *reg;
	int rv;

	if ((rv = moat_metrics_new(&reg)) != MOAT_OK ||
	    (rv = moat_metrics_process(reg, "sessiond")) != MOAT_OK) {
		moat_metrics_free(reg);
		*errmsg = moat_asprintf("cannot make sessiond's metrics: %s",
		    moat_strerror(rv));
		return rv;
	}
	m.sd = sd;
	register_all(reg);
	if ((rv = moat_metrics_start(&m.srv, reg, sessiond_scrape, sd, addr,
	         "moat-sessiond", errmsg)) != MOAT_OK) {
		memset(&m, 0, sizeof(m));
		moat_metrics_free(reg);
		return rv;
	}
	m.reg = reg;
	return MOAT_OK;
}

void
sessiond_metrics_stop(void)
{
	struct moat_metrics *reg = m.reg;

	moat_metrics_server_stop(m.srv);
	memset(&m, 0, sizeof(m));
	moat_metrics_free(reg);
}

void
sessiond_metrics_write(enum sessiond_op_kind kind, int status, double seconds)
{
	if ((int)kind < 0 || kind >= N_KINDS)
		return;
	moat_counter_inc(m.writes[kind][status == MOAT_OK]);
	if (status == MOAT_OK)
		moat_histogram_observe(kind == SESSIOND_OP_APPEND ?
		        m.append :
		        m.write_other,
		    seconds);
}

void
sessiond_metrics_commit(size_t ops, bool ok, double seconds)
{
	moat_counter_inc(m.commits[ok]);
	if (ok) {
		moat_histogram_observe(m.fsync, seconds);
		moat_histogram_observe(m.batch, (double)ops);
	}
}

void
sessiond_metrics_quota(const char *key)
{
	const char *labels[] = { "limit", key, NULL };

	if (m.reg == NULL)
		return;
	moat_counter_inc(moat_metrics_counter(m.reg,
	    "moat_sessiond_quota_refusals_total",
	    "ReserveQuota calls refused, by limit: a [tenants] key, or full "
	    "for [sessiond] quota-reservations-max.",
	    labels));
}
