/*
 * metrics.c: moat-snapd's metrics (metrics.h). Chunk traffic and call
 * latency are recorded by the handlers (handlers.c); stored and logical
 * bytes are read from the tenants' counters at each scrape, so they
 * count what is in the store, not what moved since snapd started.
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

/* Every metric of snapd; NULL while metrics are off. */
static struct snapd_metrics {
	struct moat_metrics *reg;
	struct moat_metrics_server *srv;
	struct moat_histogram *put, *get;
	struct moat_counter *calls[2][2];  /* put/get, error/ok */
	struct moat_counter *chunks_in[2]; /* present, stored */
	struct moat_counter *bytes_in, *bytes_stored;
	struct moat_counter *chunks_out, *bytes_out;
	struct moat_gauge *stored, *logical, *ratio, *snapshots, *chunks;
	struct moat_gauge *pending, *lmdb_used, *lmdb_map;
} m;

static void
snapd_scrape(void *ctx)
{
	struct snapd *sd = ctx;
	struct snapd_tenant_stats t;
	struct moat_store_txn *txn = NULL;
	uint64_t used, map;
	char *errmsg = NULL;

	moat_store_usage(sd->store, &used, &map);
	moat_gauge_set(m.lmdb_used, (double)used);
	moat_gauge_set(m.lmdb_map, (double)map);
	if (moat_store_txn_begin(sd->store, false, &txn, &errmsg) == MOAT_OK &&
	    snapd_stats_total(txn, &t, &errmsg) == MOAT_OK) {
		moat_gauge_set(m.stored, (double)t.stored_bytes);
		moat_gauge_set(m.logical, (double)t.logical_bytes);
		moat_gauge_set(m.ratio,
		    t.stored_bytes ?
		        (double)t.logical_bytes / (double)t.stored_bytes :
		        0);
		moat_gauge_set(m.snapshots, (double)t.snapshots);
		moat_gauge_set(m.chunks, (double)t.chunks);
		moat_gauge_set(m.pending, (double)t.pending_bytes);
	}
	moat_store_txn_abort(txn);
	free(errmsg);
}

static struct moat_gauge *
gauge(struct moat_metrics *reg, const char *name, const char *help)
{
	return moat_metrics_gauge(reg, name, help, NULL);
}

static struct moat_counter *
counter(struct moat_metrics *reg, const char *name, const char *help)
{
	return moat_metrics_counter(reg, name, help, NULL);
}

static void
register_all(struct moat_metrics *reg)
{
	static const char *const method[2] = { "PutChunks", "GetChunks" };
	const double *lat = moat_metrics_latency_buckets;
	const size_t n_lat = MOAT_METRICS_LATENCY_N;

	for (int i = 0; i < 2; i++)
		for (int ok = 0; ok < 2; ok++) {
			const char *labels[] = { "method", method[i], "result",
				ok ? "ok" : "error", NULL };

			m.calls[i][ok] = moat_metrics_counter(reg,
			    "moat_snapd_chunk_calls_total",
			    "PutChunks and GetChunks calls, by result.",
			    labels);
		}
	m.put = moat_metrics_histogram(reg, "moat_snapd_put_chunks_seconds",
	    "A PutChunks answered OK, whole (hashing, the durable write).",
	    NULL, lat, n_lat);
	m.get = moat_metrics_histogram(reg, "moat_snapd_get_chunks_seconds",
	    "A GetChunks answered OK, whole.", NULL, lat, n_lat);
	for (int i = 0; i < 2; i++) {
		const char *labels[] = { "outcome", i ? "stored" : "present",
			NULL };

		m.chunks_in[i] = moat_metrics_counter(reg,
		    "moat_snapd_chunks_received_total",
		    "Chunks received by PutChunks: stored (new) or present "
		    "(deduplicated).",
		    labels);
	}
	m.bytes_in = counter(reg, "moat_snapd_chunk_bytes_received_total",
	    "Chunk bytes received by PutChunks.");
	m.bytes_stored = counter(reg, "moat_snapd_chunk_bytes_stored_total",
	    "Chunk bytes PutChunks stored (new to the tenant's store).");
	m.chunks_out = counter(reg, "moat_snapd_chunks_sent_total",
	    "Chunks sent by GetChunks.");
	m.bytes_out = counter(reg, "moat_snapd_chunk_bytes_sent_total",
	    "Chunk bytes sent by GetChunks.");
	m.stored = gauge(reg, "moat_snapd_stored_bytes",
	    "Chunk bytes in the store, every tenant (each chunk once).");
	m.logical = gauge(reg, "moat_snapd_logical_bytes",
	    "What the committed snapshots would take without "
	    "deduplication, every tenant.");
	m.ratio = gauge(reg, "moat_snapd_dedup_ratio",
	    "logical_bytes / stored_bytes (0 while nothing is stored).");
	m.snapshots = gauge(reg, "moat_snapd_snapshots",
	    "Committed snapshots, every tenant.");
	m.chunks = gauge(reg, "moat_snapd_chunks",
	    "Chunks in the store, every tenant.");
	m.pending = gauge(reg, "moat_snapd_pending_bytes",
	    "Chunk bytes stored that no manifest uses yet (swept after "
	    "[snapd] pending-grace-s).");
	m.lmdb_used = gauge(reg, "moat_snapd_lmdb_used_bytes",
	    "Pages the LMDB environment has written (it reuses freed "
	    "ones; it never shrinks).");
	m.lmdb_map = gauge(reg, "moat_snapd_lmdb_map_bytes",
	    "The LMDB map size ([snapd] map-size-mib).");
}

int
snapd_metrics_start(struct snapd *sd, const char *addr, char **errmsg)
{
	struct moat_metrics *reg;
	int rv;

	if ((rv = moat_metrics_new(&reg)) != MOAT_OK ||
	    (rv = moat_metrics_process(reg, "snapd")) != MOAT_OK) {
		moat_metrics_free(reg);
		*errmsg = moat_asprintf("cannot make snapd's metrics: %s",
		    moat_strerror(rv));
		return rv;
	}
	register_all(reg);
	if ((rv = moat_metrics_start(&m.srv, reg, snapd_scrape, sd, addr,
	         "moat-snapd", errmsg)) != MOAT_OK) {
		memset(&m, 0, sizeof(m));
		moat_metrics_free(reg);
		return rv;
	}
	m.reg = reg;
	return MOAT_OK;
}

void
snapd_metrics_stop(void)
{
	struct moat_metrics *reg = m.reg;

	moat_metrics_server_stop(m.srv);
	memset(&m, 0, sizeof(m));
	moat_metrics_free(reg);
}

void
snapd_metrics_put(int status, double seconds, size_t received,
    uint64_t received_bytes, size_t stored, uint64_t stored_bytes)
{
	moat_counter_inc(m.calls[0][status == MOAT_OK]);
	if (status != MOAT_OK)
		return;
	moat_histogram_observe(m.put, seconds);
	moat_counter_add(m.chunks_in[1], stored);
	moat_counter_add(m.chunks_in[0], received - stored);
	moat_counter_add(m.bytes_in, received_bytes);
	moat_counter_add(m.bytes_stored, stored_bytes);
}

void
snapd_metrics_get(int status, double seconds, size_t chunks, uint64_t bytes)
{
	moat_counter_inc(m.calls[1][status == MOAT_OK]);
	if (status != MOAT_OK)
		return;
	moat_histogram_observe(m.get, seconds);
	moat_counter_add(m.chunks_out, chunks);
	moat_counter_add(m.bytes_out, bytes);
}
