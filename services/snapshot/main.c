/*
 * main.c: moat-snapd, the keeper of snapshots: a catalog plus a
 * content-addressed, deduplicated chunk store (handlers.c, schema.c). This
 * file reads flags and moat.conf, opens the LMDB environment under
 * <state>/snapd, checks its on-disk format, starts the writer thread
 * (writer.c) and the RPC server, and stops both on SIGTERM or SIGINT.
 * Not for: anything a client calls directly (the gateway orchestrates).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/config.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"
#include "snapd.h"

#define SECTION "snapd"
#define SERVICE_NAME "moat-snapd"
#define FORMAT_KEY "format"
#define FORMAT_VERSION "1"  /* bump when the layout of the dbs changes */
#define WRITE_QUEUE_LEN 64   /* write jobs waiting for the writer */

/* The layout is in snapd.h. "tenants" arrived after format 1's first
 * stores, which held nothing but the format stamp: it is created empty. */
static const char *const snapd_dbs[] = {
	"meta", "snapshots", "manifests", "chunks", "chunk_refs", "tenants",
	NULL,
};

/* check_format: stamps a new store with FORMAT_VERSION, and refuses one
 * written in another format rather than misreading it. */
static int
check_format(struct moat_store *st, char **errmsg)
{
	struct moat_store_txn *txn;
	const void *val;
	size_t len;
	int rv;

	if ((rv = moat_store_txn_begin(st, true, &txn, errmsg)) != MOAT_OK)
		return rv;
	rv = moat_store_get(txn, "meta", FORMAT_KEY, strlen(FORMAT_KEY), &val,
	    &len, errmsg);
	if (rv == MOAT_NOT_FOUND) {
		if ((rv = moat_store_put(txn, "meta", FORMAT_KEY,
		    strlen(FORMAT_KEY), FORMAT_VERSION, strlen(FORMAT_VERSION),
		    true, errmsg)) != MOAT_OK)
			goto fail;
		return moat_store_txn_commit(txn, errmsg);
	}
	if (rv != MOAT_OK)
		goto fail;
	if (len != strlen(FORMAT_VERSION) ||
	    memcmp(val, FORMAT_VERSION, len) != 0) {
		*errmsg = moat_asprintf("store %s has format \"%.*s\"; this "
		    "%s reads format %s: run the moat version that wrote it, "
		    "or move the directory away", moat_store_path(st),
		    (int)(len < 32 ? len : 32), (const char *)val,
		    SERVICE_NAME, FORMAT_VERSION);
		rv = MOAT_FAILED_PRECONDITION;
		goto fail;
	}
	moat_store_txn_abort(txn);
	return MOAT_OK;

fail:
	moat_store_txn_abort(txn);
	return rv;
}

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
	    "600)\n"
	    "  --version, --help\n"
	    "Every option is also MOAT_SNAPD_<NAME> in the environment and "
	    "<name> in [" SECTION "].\n", MOAT_STORE_DEFAULT_MAP_MIB);
}

int
main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "state-dir", required_argument, NULL, 's' },
		{ "listen", required_argument, NULL, 'l' },
		{ "map-size-mib", required_argument, NULL, 'm' },
		{ "pending-grace-s", required_argument, NULL, 'g' },
		{ "sweep-interval-s", required_argument, NULL, 'w' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__snapshot__descriptor,
		.methods = snapd_methods,
		.n_methods = snapd_n_methods,
	};
	struct snapd sd = { .started_ms = moat_rpc_now_ms() };
	struct moat_rpc_server *srv = NULL;
	struct moat_config *cfg = NULL;
	const char *v;
	char *state_dir = NULL, *listen = NULL, *errmsg = NULL;
	uint64_t map_mib = 0, grace_s = 0, sweep_s = 0;
	sigset_t sigs;
	int sig = 0, rv, exit_code = 1;

	if ((exit_code = moat_config_from_args(argc, argv, long_opts,
	    SERVICE_NAME, SECTION, usage, &cfg)) != -1)
		return exit_code;
	exit_code = 1;
	moat_log_init("snapd", MOAT_LOG_INFO);
	moat_service_malloc_init();
	state_dir = moat_config_state_dir(cfg, SECTION);
	if (state_dir == NULL)
		goto fail_oom;
	if ((v = moat_config_get(cfg, SECTION, "listen", NULL)) != NULL)
		listen = strdup(v);
	else
		listen = moat_asprintf("ipc://%s/snapd.sock", state_dir);
	if (listen == NULL ||
	    (sd.store_dir = moat_asprintf("%s/snapd", state_dir)) == NULL)
		goto fail_oom;
	if ((rv = moat_config_get_u64(cfg, SECTION, "map-size-mib",
	    MOAT_STORE_DEFAULT_MAP_MIB, &map_mib, &errmsg)) != MOAT_OK)
		goto fail;
	if (map_mib < 1 || map_mib > (1ull << 24)) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("map-size-mib must be 1 to %llu, not "
		    "%llu", 1ull << 24, (unsigned long long)map_mib);
		goto fail;
	}
	if ((rv = moat_config_get_u64(cfg, SECTION, "pending-grace-s", 3600,
	    &grace_s, &errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "sweep-interval-s", 600,
	    &sweep_s, &errmsg)) != MOAT_OK)
		goto fail;
	if (grace_s > 365ull * 86400 || sweep_s < 1 || sweep_s > 86400) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("pending-grace-s must be at most a "
		    "year and sweep-interval-s 1 to 86400");
		goto fail;
	}
	sd.pending_grace_ms = grace_s * 1000;
	sd.sweep_every_ms = sweep_s * 1000;
	if ((rv = moat_store_open(&sd.store, sd.store_dir, map_mib << 20,
	    snapd_dbs, &errmsg)) != MOAT_OK)
		goto fail;
	if ((rv = check_format(sd.store, &errmsg)) != MOAT_OK)
		goto fail;

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	if ((rv = snapd_writer_start(&sd.writer, &sd, WRITE_QUEUE_LEN,
	    &errmsg)) != MOAT_OK)
		goto fail;
	svc.ctx = &sd;
	if ((rv = moat_rpc_server_start(&srv, listen, &svc, 0, &errmsg)) !=
	    MOAT_OK)
		goto fail;
	moat_info(0, SERVICE_NAME " %s serving %s, store %s (map %llu MiB)",
	    MOAT_VERSION, listen, sd.store_dir, (unsigned long long)map_mib);
	do {
		rv = sigwait(&sigs, &sig);
	} while (rv == EINTR);
	moat_info(0, SERVICE_NAME ": signal %d: stopping", sig);
	moat_rpc_server_stop(srv);
	exit_code = 0;
	goto out;

fail_oom:
	rv = MOAT_RESOURCE_EXHAUSTED;
	free(errmsg);
	errmsg = moat_asprintf("out of memory");
fail:
	moat_error(0, SERVICE_NAME ": %s",
	    errmsg ? errmsg : moat_strerror(rv));
	exit_code = moat_status_exit_code(rv);
out:
	/* The server first: no handler may queue a job on a stopped writer. */
	snapd_writer_stop(sd.writer);
	moat_store_close(sd.store);
	free(sd.store_dir);
	free(errmsg);
	free(state_dir);
	free(listen);
	moat_config_free(cfg);
	return exit_code;
}
