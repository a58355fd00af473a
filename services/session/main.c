/*
 * main.c: moat-sessiond, the keeper of recordings (sessions, steps, their
 * outputs and filesystem traces). It reads its options, opens its LMDB
 * environment under <state>/sessiond, checks the on-disk format (and
 * brings a store of the format before to this one), starts
 * the writer thread and the RPC server (handlers.c), and stops cleanly on
 * SIGTERM or SIGINT: the server first, so no call is left waiting, then
 * the writer, which finishes what is queued.
 * Not for: anything a client calls directly (the gateway orchestrates),
 * the layout of the data (layout.c) or the writes (writer.c).
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
#include "sessiond.h"

#define SECTION "sessiond"
#define SERVICE_NAME SESSIOND_SERVICE_NAME
#define FORMAT_KEY "format"
/* Bump when the layout of the dbs changes. 2: snapshot_refs (issue 11);
 * a sessiond of format 1 would not keep its counts, so it must refuse a
 * store of format 2, and it does. */
#define FORMAT_VERSION "2"
#define FORMAT_NO_REFS "1"  /* before snapshot_refs: counted at open */

/* upgrade_refs: a store of format 1 has no snapshot reference counts:
 * counts them (refs.c) and stamps FORMAT_VERSION, in `txn`, so a crash
 * leaves either the old store or the new one. */
static int
upgrade_refs(struct moat_store *st, struct moat_store_txn *txn,
    char **errmsg)
{
	uint64_t sessions, refs;
	int rv;

	if ((rv = sessiond_refs_build(txn, &sessions, &refs, errmsg)) !=
	    MOAT_OK) {
		char *why = *errmsg;

		*errmsg = moat_asprintf("store %s: counting the snapshot "
		    "references of format %s failed (%s); the store is "
		    "unchanged", moat_store_path(st), FORMAT_NO_REFS,
		    why ? why : moat_strerror(rv));
		free(why);
		return rv;
	}
	if ((rv = moat_store_put(txn, "meta", FORMAT_KEY, strlen(FORMAT_KEY),
	    FORMAT_VERSION, strlen(FORMAT_VERSION), false, errmsg)) !=
	    MOAT_OK)
		return rv;
	moat_info(0, SERVICE_NAME ": store %s brought from format %s to %s: "
	    "%llu snapshot references counted in %llu sessions",
	    moat_store_path(st), FORMAT_NO_REFS, FORMAT_VERSION,
	    (unsigned long long)refs, (unsigned long long)sessions);
	return MOAT_OK;
}

/* check_format: stamps a new store with FORMAT_VERSION, brings one of
 * format 1 to it, and refuses one written in another format rather than
 * misreading it. */
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
	if (len == strlen(FORMAT_NO_REFS) &&
	    memcmp(val, FORMAT_NO_REFS, len) == 0) {
		if ((rv = upgrade_refs(st, txn, errmsg)) != MOAT_OK)
			goto fail;
		return moat_store_txn_commit(txn, errmsg);
	}
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
	    "DIR/sessiond\n"
	    "  --listen URL         RPC url (default "
	    "ipc://<state>/sessiond.sock)\n"
	    "  --map-size-mib N     LMDB map size (default %u); raise it "
	    "when calls\n"
	    "                       fail with RESOURCE_EXHAUSTED\n"
	    "  --workers N          calls served at once (default %d)\n"
	    "  --version, --help\n"
	    "Every option is also MOAT_SESSIOND_<NAME> in the environment and "
	    "<name> in [" SECTION "].\n", MOAT_STORE_DEFAULT_MAP_MIB,
	    MOAT_RPC_DEFAULT_WORKERS);
}

int
main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "state-dir", required_argument, NULL, 's' },
		{ "listen", required_argument, NULL, 'l' },
		{ "map-size-mib", required_argument, NULL, 'm' },
		{ "workers", required_argument, NULL, 'w' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__session__descriptor,
		.methods = sessiond_methods,
		.n_methods = sessiond_n_methods,
	};
	struct sessiond sd = { .started_ms = moat_rpc_now_ms() };
	struct moat_rpc_server *srv = NULL;
	struct moat_config *cfg = NULL;
	const char *v;
	char *state_dir = NULL, *listen = NULL, *errmsg = NULL;
	uint64_t map_mib = 0, workers = 0;
	sigset_t sigs;
	int sig = 0, rv, exit_code = 1;

	if ((exit_code = moat_config_from_args(argc, argv, long_opts,
	    SERVICE_NAME, SECTION, usage, &cfg)) != -1)
		return exit_code;
	exit_code = 1;
	moat_log_init("sessiond", MOAT_LOG_INFO);
	moat_service_malloc_init();
	state_dir = moat_config_state_dir(cfg, SECTION);
	if (state_dir == NULL)
		goto fail_oom;
	if ((v = moat_config_get(cfg, SECTION, "listen", NULL)) != NULL)
		listen = strdup(v);
	else
		listen = moat_asprintf("ipc://%s/sessiond.sock", state_dir);
	if (listen == NULL ||
	    (sd.store_dir = moat_asprintf("%s/sessiond", state_dir)) == NULL)
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
	if ((rv = moat_config_get_u64(cfg, SECTION, "workers",
	    MOAT_RPC_DEFAULT_WORKERS, &workers, &errmsg)) != MOAT_OK)
		goto fail;
	/* Each worker may hold a read transaction: stay under LMDB's 256
	 * reader slots. */
	if (workers < 1 || workers > 200) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("workers must be 1 to 200, not %llu",
		    (unsigned long long)workers);
		goto fail;
	}
	sd.map_mib = map_mib;
	if ((rv = moat_store_open(&sd.store, sd.store_dir, map_mib << 20,
	    sessiond_dbs, &errmsg)) != MOAT_OK)
		goto fail;
	if ((rv = check_format(sd.store, &errmsg)) != MOAT_OK)
		goto fail;
	/* Block the stop signals before any thread exists: a thread that
	 * has them unblocked would take SIGTERM and die with it. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	if ((rv = sessiond_writer_start(&sd.writer, sd.store, &errmsg)) !=
	    MOAT_OK)
		goto fail;

	svc.ctx = &sd;
	if ((rv = moat_rpc_server_start(&srv, listen, &svc, (int)workers,
	    &errmsg)) !=
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
	sessiond_writer_stop(sd.writer);
	moat_store_close(sd.store);
	free(sd.store_dir);
	free(errmsg);
	free(state_dir);
	free(listen);
	moat_config_free(cfg);
	return exit_code;
}
