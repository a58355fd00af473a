/*
 * main.c: moat-sessiond, the keeper of recordings (sessions, steps, their
 * outputs and filesystem traces). Its hooks of moat_service_main
 * (moat/service.h): open reads its options, opens its LMDB environment
 * under <state>/sessiond and checks the on-disk format (bringing a store
 * of the format before to this one); serve starts the writer thread and
 * the RPC server (handlers.c); on SIGTERM or SIGINT the server stops
 * first, so no call is left waiting, then the writer, which finishes what
 * is queued.
 * Not for: anything a client calls directly (the gateway orchestrates),
 * the layout of the data (layout.c) or the writes (writer.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/config.h"
#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/rpc.h"
#include "moat/service.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/tls.h"
#include "moat/util.h"
#include "metrics.h"
#include "sessiond.h"

#define SECTION "sessiond"
#define SERVICE_NAME SESSIOND_SERVICE_NAME
#define FORMAT_KEY "format"
/* Bump when the layout of the dbs changes. 2: snapshot_refs (issue 11);
 * a sessiond of format 1 would not keep its counts, so it must refuse a
 * store of format 2, and it does. */
#define FORMAT_VERSION "2"
#define FORMAT_NO_REFS "1" /* before snapshot_refs: counted at open */

/* upgrade_refs: a store of format 1 has no snapshot reference counts:
 * counts them (refs.c) and stamps FORMAT_VERSION, in `txn`, so a crash
 * leaves either the old store or the new one. */
static int
upgrade_refs(struct moat_store *st, struct moat_store_txn *txn, char **errmsg)
{
	uint64_t sessions, refs;
	int rv;

	if ((rv = sessiond_refs_build(txn, &sessions, &refs, errmsg)) !=
	    MOAT_OK) {
		char *why = *errmsg;

		*errmsg = moat_asprintf(
		    "store %s: counting the snapshot "
		    "references of format %s failed (%s); the store is "
		    "unchanged",
		    moat_store_path(st), FORMAT_NO_REFS,
		    why ? why : moat_strerror(rv));
		free(why);
		return rv;
	}
	if ((rv = moat_store_put(txn, "meta", FORMAT_KEY, strlen(FORMAT_KEY),
	         FORMAT_VERSION, strlen(FORMAT_VERSION), false, errmsg)) !=
	    MOAT_OK)
		return rv;
	moat_info(0,
	    SERVICE_NAME ": store %s brought from format %s to %s: "
	                 "%llu snapshot references counted in %llu sessions",
	    moat_store_path(st), FORMAT_NO_REFS, FORMAT_VERSION,
	    (unsigned long long)refs, (unsigned long long)sessions);
	return MOAT_OK;
}

static const struct moat_store_format store_format = {
	.key = FORMAT_KEY,
	.version = FORMAT_VERSION,
	.program = SERVICE_NAME,
	.older = FORMAT_NO_REFS,
	.upgrade = upgrade_refs,
};

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: " SERVICE_NAME " [options]\n"
	    "  --config FILE        moat.conf to read ([" SECTION "] "
	    "section)\n"
	    "  --state-dir DIR      state directory; the store is "
	    "DIR/sessiond\n"
	    "  --listen URL         RPC url (default "
	    "ipc://<state>/sessiond.sock)\n"
	    "  --map-size-mib N     LMDB map size (default %u); raise it "
	    "when calls\n"
	    "                       fail with RESOURCE_EXHAUSTED\n"
	    "  --workers N          calls served at once (default "
	    "%d)\n" MOAT_TLS_USAGE MOAT_METRICS_USAGE "  --version, --help\n"
	    "Every option is also MOAT_SESSIOND_<NAME> in the environment and "
	    "<name> in [" SECTION "].\n",
	    MOAT_STORE_DEFAULT_MAP_MIB, MOAT_RPC_DEFAULT_WORKERS);
}

/* What the hooks share: the service's state and what main() owns. */
struct sessiond_main {
	struct sessiond sd;
	struct moat_rpc_server *srv;
	struct moat_tls *tls;
	char *listen;
	const char *metrics; /* [sessiond] metrics: "" when off */
	int workers;
};

static int
sessiond_open(void *ctx, struct moat_config *cfg, const char *state_dir,
    char **errmsg)
{
	struct sessiond_main *m = ctx;
	uint64_t map_mib = 0, workers = 0;
	int rv;

	m->listen = moat_service_url(cfg, SECTION, "listen", state_dir,
	    "sessiond.sock");
	if (m->listen == NULL ||
	    (m->sd.store_dir = moat_asprintf("%s/sessiond", state_dir)) ==
	        NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = moat_service_map_mib(cfg, SECTION, &map_mib, errmsg)) !=
	    MOAT_OK)
		return rv;
	if ((rv = moat_config_get_u64(cfg, SECTION, "workers",
	         MOAT_RPC_DEFAULT_WORKERS, &workers, errmsg)) != MOAT_OK)
		return rv;
	/* Each worker may hold a read transaction: stay under LMDB's 256
	 * reader slots. */
	if (workers < 1 || workers > 200) {
		*errmsg = moat_asprintf("workers must be 1 to 200, not %llu",
		    (unsigned long long)workers);
		return MOAT_INVALID_ARGUMENT;
	}
	m->workers = (int)workers;
	m->sd.map_mib = map_mib;
	m->metrics = moat_config_get(cfg, SECTION, "metrics", "");
	if ((rv = moat_tls_from_config(cfg, SECTION, &m->tls, errmsg)) !=
	    MOAT_OK)
		return rv;
	if ((rv = moat_config_get_u64(cfg, SECTION, "idempotency-ttl-s", 600,
	         &m->sd.idem_ttl_ms, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "idempotency-max-keys",
	         100000, &m->sd.idem_max, errmsg)) != MOAT_OK)
		return rv;
	if (m->sd.idem_ttl_ms < 1 || m->sd.idem_ttl_ms > 7 * 86400 ||
	    m->sd.idem_max < 1) {
		*errmsg = moat_asprintf(
		    "idempotency-ttl-s must be 1 to 604800 and "
		    "idempotency-max-keys at least 1 (not %llu, %llu)",
		    (unsigned long long)m->sd.idem_ttl_ms,
		    (unsigned long long)m->sd.idem_max);
		return MOAT_INVALID_ARGUMENT;
	}
	m->sd.idem_ttl_ms *= 1000;
	if ((rv = moat_config_get_u64(cfg, SECTION, "mcp-session-ttl-s", 86400,
	         &m->sd.mcp_ttl_ms, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "mcp-sessions-max", 100000,
	         &m->sd.mcp_max, errmsg)) != MOAT_OK)
		return rv;
	if (m->sd.mcp_ttl_ms < 1 || m->sd.mcp_ttl_ms > 30 * 86400 ||
	    m->sd.mcp_max < 1) {
		*errmsg = moat_asprintf(
		    "mcp-session-ttl-s must be 1 to 2592000 and "
		    "mcp-sessions-max at least 1 (not %llu, %llu)",
		    (unsigned long long)m->sd.mcp_ttl_ms,
		    (unsigned long long)m->sd.mcp_max);
		return MOAT_INVALID_ARGUMENT;
	}
	m->sd.mcp_ttl_ms *= 1000;
	if ((rv = moat_config_get_u64(cfg, SECTION, "quota-reservations-max",
	         10000, &m->sd.quota_max, errmsg)) != MOAT_OK)
		return rv;
	if (m->sd.quota_max < 1 || m->sd.quota_max > 10000000) {
		*errmsg = moat_asprintf("quota-reservations-max must be 1 to "
		                        "10000000, not %llu",
		    (unsigned long long)m->sd.quota_max);
		return MOAT_INVALID_ARGUMENT;
	}
	if (sessiond_quota_new(&m->sd.quota, m->sd.quota_max) != MOAT_OK) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = moat_config_get_u64(cfg, SECTION, "audit-max-age-s",
	         90ull * 86400, &m->sd.audit_max_age_s, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "audit-max-bytes",
	         1ull << 30, &m->sd.audit_max_bytes, errmsg)) != MOAT_OK)
		return rv;
	if (m->sd.audit_max_bytes < 4096 ||
	    m->sd.audit_max_bytes > (1ull << 40)) {
		*errmsg = moat_asprintf("audit-max-bytes must be 4096 to "
		                        "1099511627776, not %llu",
		    (unsigned long long)m->sd.audit_max_bytes);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((rv = moat_store_open(&m->sd.store, m->sd.store_dir, map_mib << 20,
	         sessiond_dbs, errmsg)) != MOAT_OK ||
	    (rv = sessiond_idem_open(&m->sd, state_dir, errmsg)) != MOAT_OK ||
	    (rv = sessiond_keys_open(&m->sd, state_dir, errmsg)) != MOAT_OK ||
	    (rv = sessiond_audit_open(&m->sd, state_dir, errmsg)) != MOAT_OK ||
	    (rv = sessiond_mcp_open(&m->sd, state_dir, errmsg)) != MOAT_OK)
		return rv;
	return moat_store_check_format(m->sd.store, &store_format, errmsg);
}

static int
sessiond_serve(void *ctx, char **errmsg)
{
	struct sessiond_main *m = ctx;
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__session__descriptor,
		.methods = sessiond_methods,
		.n_methods = sessiond_n_methods,
		.ctx = &m->sd,
	};
	int rv;

	if ((rv = sessiond_writer_start(&m->sd.writer, m->sd.store, errmsg)) !=
	    MOAT_OK)
		return rv;
	if (m->metrics[0] != '\0' &&
	    (rv = sessiond_metrics_start(&m->sd, m->metrics, errmsg)) !=
	        MOAT_OK)
		return rv;
	/* Callers prove their role by the CA of their certificate
	 * (tls-peer-ca: the gateway's intermediate). */
	struct moat_rpc_server_opts so = {
		.workers = m->workers,
		.tls = m->tls,
		.peer = MOAT_TLS_PEER_REQUIRED,
		.what = "the sessiond listener ([sessiond] listen)",
	};
	if ((rv = moat_rpc_server_start_opts(&m->srv, m->listen, &svc, &so,
	         errmsg)) != MOAT_OK)
		return rv;
	moat_info(0, SERVICE_NAME " %s serving %s, store %s (map %llu MiB)",
	    MOAT_VERSION, m->listen, m->sd.store_dir,
	    (unsigned long long)m->sd.map_mib);
	return MOAT_OK;
}

static void
sessiond_stop(void *ctx)
{
	struct sessiond_main *m = ctx;

	moat_rpc_server_stop(m->srv);
}

/* sessiond_close: the writer after the server (stopped already, or never
 * started): no handler may queue a job on a stopped writer. */
static void
sessiond_close(void *ctx)
{
	struct sessiond_main *m = ctx;

	sessiond_writer_stop(m->sd.writer);
	sessiond_metrics_stop();
	moat_store_close(m->sd.store);
	moat_store_close(m->sd.idem);
	moat_store_close(m->sd.keys);
	moat_store_close(m->sd.audit);
	moat_store_close(m->sd.mcp);
	sessiond_quota_free(m->sd.quota);
	free(m->sd.store_dir);
	free(m->listen);
	moat_tls_free(m->tls);
}

int
main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		MOAT_SERVICE_OPTIONS_FIRST,
		{ "map-size-mib", required_argument, NULL, 'm' },
		{ "workers", required_argument, NULL, 'w' },
		MOAT_TLS_OPTIONS,
		MOAT_METRICS_OPTION,
		MOAT_SERVICE_OPTIONS_LAST,
	};
	static const struct moat_service service = {
		.program = SERVICE_NAME,
		.section = SECTION,
		.log_component = "sessiond",
		.options = long_opts,
		.usage = usage,
		.open = sessiond_open,
		.serve = sessiond_serve,
		.stop = sessiond_stop,
		.close = sessiond_close,
	};
	struct sessiond_main m = { .sd.started_ms = moat_rpc_now_ms() };

	return moat_service_main(&service, &m, argc, argv);
}
