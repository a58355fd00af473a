/*
 * main.c: moat-snapd, the keeper of snapshots: a catalog plus a
 * content-addressed, deduplicated chunk store (handlers.c, schema.c).
 * Its hooks of moat_service_main (moat/service.h) read flags and
 * moat.conf, open the LMDB environment under <state>/snapd, check its
 * on-disk format, start the writer thread (writer.c) and the RPC server,
 * and stop both on SIGTERM or SIGINT.
 * Not for: anything a client calls directly (the gateway orchestrates).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

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
#include "snapd.h"

#define SECTION "snapd"
#define SERVICE_NAME "moat-snapd"
#define FORMAT_KEY "format"
#define FORMAT_VERSION "1" /* bump when the layout of the dbs changes */
#define WRITE_QUEUE_LEN 64 /* write jobs waiting for the writer */

/* The layout is in snapd.h. "tenants" arrived after format 1's first
 * stores, which held nothing but the format stamp: it is created empty. */
static const char *const snapd_dbs[] = {
	"meta",
	"snapshots",
	"manifests",
	"chunks",
	"chunk_refs",
	"tenants",
	NULL,
};

static const struct moat_store_format store_format = {
	.key = FORMAT_KEY,
	.version = FORMAT_VERSION,
	.program = SERVICE_NAME,
};

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: " SERVICE_NAME " [options]\n"
	    "  --config FILE        moat.conf to read ([" SECTION "] "
	    "section)\n"
	    "  --state-dir DIR      state directory; the store is "
	    "DIR/snapd\n"
	    "  --listen URL         RPC url (default "
	    "ipc://<state>/snapd.sock)\n"
	    "  --map-size-mib N     LMDB map size (default %u)\n"
	    "  --pending-grace-s N  chunks put but used by no manifest for "
	    "N s are\n"
	    "                       freed (default 3600)\n"
	    "  --sweep-interval-s N how often to look for them (default "
	    "600)\n" MOAT_TLS_USAGE MOAT_METRICS_USAGE "  --version, --help\n"
	    "Every option is also MOAT_SNAPD_<NAME> in the environment and "
	    "<name> in [" SECTION "].\n",
	    MOAT_STORE_DEFAULT_MAP_MIB);
}

/* What the hooks share: the service's state and what main() owns. */
struct snapd_main {
	struct snapd sd;
	struct moat_rpc_server *srv;
	struct moat_tls *tls;
	char *listen;
	const char *metrics; /* [snapd] metrics: "" when off */
	uint64_t map_mib;
};

static int
snapd_open(void *ctx, struct moat_config *cfg, const char *state_dir,
    char **errmsg)
{
	struct snapd_main *m = ctx;
	uint64_t grace_s = 0, sweep_s = 0;
	int rv;

	m->listen =
	    moat_service_url(cfg, SECTION, "listen", state_dir, "snapd.sock");
	if (m->listen == NULL ||
	    (m->sd.store_dir = moat_asprintf("%s/snapd", state_dir)) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = moat_service_map_mib(cfg, SECTION, &m->map_mib, errmsg)) !=
	    MOAT_OK)
		return rv;
	if ((rv = moat_config_get_u64(cfg, SECTION, "pending-grace-s", 3600,
	         &grace_s, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "sweep-interval-s", 600,
	         &sweep_s, errmsg)) != MOAT_OK)
		return rv;
	if (grace_s > 365ull * 86400 || sweep_s < 1 || sweep_s > 86400) {
		*errmsg =
		    moat_asprintf("pending-grace-s must be at most a "
		                  "year and sweep-interval-s 1 to 86400");
		return MOAT_INVALID_ARGUMENT;
	}
	m->sd.pending_grace_ms = grace_s * 1000;
	m->sd.sweep_every_ms = sweep_s * 1000;
	m->metrics = moat_config_get(cfg, SECTION, "metrics", "");
	if ((rv = moat_tls_from_config(cfg, SECTION, &m->tls, errmsg)) !=
	    MOAT_OK)
		return rv;
	if ((rv = moat_store_open(&m->sd.store, m->sd.store_dir,
	         m->map_mib << 20, snapd_dbs, errmsg)) != MOAT_OK)
		return rv;
	return moat_store_check_format(m->sd.store, &store_format, errmsg);
}

static int
snapd_serve(void *ctx, char **errmsg)
{
	struct snapd_main *m = ctx;
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__snapshot__descriptor,
		.methods = snapd_methods,
		.n_methods = snapd_n_methods,
		.ctx = &m->sd,
	};
	int rv;

	if ((rv = snapd_writer_start(&m->sd.writer, &m->sd, WRITE_QUEUE_LEN,
	         errmsg)) != MOAT_OK)
		return rv;
	if (m->metrics[0] != '\0' &&
	    (rv = snapd_metrics_start(&m->sd, m->metrics, errmsg)) != MOAT_OK)
		return rv;
	/* Callers prove their role by the CA of their certificate
	 * (tls-peer-ca: the gateway's and vmd's intermediates). */
	struct moat_rpc_server_opts so = {
		.tls = m->tls,
		.peer = MOAT_TLS_PEER_REQUIRED,
		.what = "the snapd listener ([snapd] listen)",
	};
	if ((rv = moat_rpc_server_start_opts(&m->srv, m->listen, &svc, &so,
	         errmsg)) != MOAT_OK)
		return rv;
	moat_info(0, SERVICE_NAME " %s serving %s, store %s (map %llu MiB)",
	    MOAT_VERSION, m->listen, m->sd.store_dir,
	    (unsigned long long)m->map_mib);
	return MOAT_OK;
}

static void
snapd_stop(void *ctx)
{
	struct snapd_main *m = ctx;

	moat_rpc_server_stop(m->srv);
}

/* snapd_close: the writer after the server (stopped already, or never
 * started): no handler may queue a job on a stopped writer. */
static void
snapd_close(void *ctx)
{
	struct snapd_main *m = ctx;

	snapd_writer_stop(m->sd.writer);
	snapd_metrics_stop();
	moat_store_close(m->sd.store);
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
		{ "pending-grace-s", required_argument, NULL, 'g' },
		{ "sweep-interval-s", required_argument, NULL, 'w' },
		MOAT_TLS_OPTIONS,
		MOAT_METRICS_OPTION,
		MOAT_SERVICE_OPTIONS_LAST,
	};
	static const struct moat_service service = {
		.program = SERVICE_NAME,
		.section = SECTION,
		.log_component = "snapd",
		.options = long_opts,
		.usage = usage,
		.open = snapd_open,
		.serve = snapd_serve,
		.stop = snapd_stop,
		.close = snapd_close,
	};
	struct snapd_main m = { .sd.started_ms = moat_rpc_now_ms() };

	return moat_service_main(&service, &m, argc, argv);
}
