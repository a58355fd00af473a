/*
 * service.c: moat_service_main (moat/service.h), the skeleton of the
 * gateway's, sessiond's and snapd's main(), and the settings they share.
 * The order is the one each main() had: options, log, state directory,
 * open (no thread yet), the stop signals blocked, serve, wait, stop,
 * close.
 * Not for: anything a service does (its hooks), or vmd.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "moat/config.h"
#include "moat/log.h"
#include "moat/service.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

int
moat_service_main(const struct moat_service *svc, void *ctx, int argc,
    char **argv)
{
	struct moat_config *cfg = NULL;
	char *state_dir = NULL, *errmsg = NULL;
	sigset_t sigs;
	int sig = 0, rv, exit_code;

	if ((exit_code = moat_config_from_args(argc, argv, svc->options,
	         svc->program, svc->section, svc->usage, &cfg)) != -1)
		return exit_code;
	moat_log_init(svc->log_component, MOAT_LOG_INFO);
	moat_service_malloc_init();
	if ((state_dir = moat_config_state_dir(cfg, svc->section)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		errmsg = moat_asprintf("out of memory");
		goto fail;
	}
	if (svc->make_state_dir && (rv = moat_mkdir_p(state_dir, 0700)) != 0) {
		errmsg = moat_asprintf(
		    "cannot create the state directory %s: "
		    "%s: create it, or pick another with --state-dir",
		    state_dir, strerror(rv));
		rv = moat_status_from_errno(rv);
		goto fail;
	}
	if ((rv = svc->open(ctx, cfg, state_dir, &errmsg)) != MOAT_OK)
		goto fail;
	/* Block the stop signals before any thread exists: every thread
	 * inherits the mask, so they reach only sigwait below (a thread
	 * with them unblocked would take SIGTERM and die with it). */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	if ((rv = svc->serve(ctx, &errmsg)) != MOAT_OK)
		goto fail;
	do {
		rv = sigwait(&sigs, &sig);
	} while (rv == EINTR);
	moat_info(0, "%s: signal %d: stopping", svc->program, sig);
	svc->stop(ctx);
	exit_code = 0;
	goto out;

fail:
	moat_error(0, "%s: %s", svc->program,
	    errmsg ? errmsg : moat_strerror(rv));
	exit_code = moat_status_exit_code(rv);
out:
	svc->close(ctx);
	free(errmsg);
	free(state_dir);
	moat_config_free(cfg);
	return exit_code;
}

char *
moat_service_url(const struct moat_config *cfg, const char *section,
    const char *key, const char *state_dir, const char *sock)
{
	const char *v;

	if ((v = moat_config_get(cfg, section, key, NULL)) != NULL)
		return strdup(v);
	return moat_asprintf("ipc://%s/%s", state_dir, sock);
}

int
moat_service_map_mib(const struct moat_config *cfg, const char *section,
    uint64_t *map_mib, char **errmsg)
{
	int rv;

	if ((rv = moat_config_get_u64(cfg, section, "map-size-mib",
	         MOAT_STORE_DEFAULT_MAP_MIB, map_mib, errmsg)) != MOAT_OK)
		return rv;
	if (*map_mib < 1 || *map_mib > (1ull << 24)) {
		*errmsg = moat_asprintf("map-size-mib must be 1 to %llu, not "
		                        "%llu",
		    1ull << 24, (unsigned long long)*map_mib);
		return MOAT_INVALID_ARGUMENT;
	}
	return MOAT_OK;
}
