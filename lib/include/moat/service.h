/*
 * moat/service.h: the main() every long-running moat service shares
 * (moat-gateway, moat-sessiond, moat-snapd): the command line, moat.conf
 * and MOAT_<SECTION>_* by moat_config_from_args, the log, the state
 * directory, the stop signals and the wait for them, the error message
 * and exit code of a failure. A service fills a struct moat_service with
 * its name, options and four hooks, and its main() calls
 * moat_service_main.
 * Not for: what a service does (its hooks), subcommands that are not the
 * service (`moat-gateway keys`), or vmd (its own main).
 */
#ifndef MOAT_SERVICE_H
#define MOAT_SERVICE_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct moat_config;

/* A service. Every hook gets the `ctx` given to moat_service_main; those
 * that can fail return a status and set *errmsg (heap; NULL: the status's
 * own text), which moat_service_main logs as "<program>: <errmsg>". */
struct moat_service {
	const char *program;       /* "moat-sessiond": messages, --version */
	const char *section;       /* [section], MOAT_<SECTION>_<NAME> */
	const char *log_component; /* "sessiond" */
	/* getopt_long's table, by moat_config_from_args's rules */
	const struct option *options;
	void (*usage)(FILE *f);
	bool make_state_dir; /* create the state directory (0700) */
	/* open: reads the service's settings from `cfg` and opens what it
	 * keeps (stores). Both `cfg` and `state_dir` stay valid until close
	 * returns. No thread may be started here: the stop signals are not
	 * blocked yet. */
	int (*open)(void *ctx, struct moat_config *cfg, const char *state_dir,
	    char **errmsg);
	/* serve: starts the service's threads and servers (with the stop
	 * signals blocked, which they inherit) and says it serves. On
	 * failure it stops what it started. */
	int (*serve)(void *ctx, char **errmsg);
	/* stop: on SIGTERM or SIGINT, after serve succeeded: stops serving,
	 * so that no call is left waiting. */
	void (*stop)(void *ctx);
	/* close: always last, also after open or serve failed: releases
	 * whatever open and serve made (safe on what is half made). */
	void (*close)(void *ctx);
};

/* The options every service has, first and last in its table:
 *	{ MOAT_SERVICE_OPTIONS_FIRST, ...its own...,
 *	    MOAT_SERVICE_OPTIONS_LAST }
 * ("config", "version" and "help" are moat_config_from_args's). */
#define MOAT_SERVICE_OPTIONS_FIRST                                            \
	{ "config", required_argument, NULL, 'c' },                           \
	    { "state-dir", required_argument, NULL, 's' },                    \
	{                                                                     \
		"listen", required_argument, NULL, 'l'                        \
	}
#define MOAT_SERVICE_OPTIONS_LAST                                             \
	{ "version", no_argument, NULL, 'V' },                                \
	    { "help", no_argument, NULL, 'h' },                               \
	{                                                                     \
		NULL, 0, NULL, 0                                              \
	}

/* moat_service_main: runs `svc` until SIGTERM or SIGINT, and returns
 * main()'s exit code: 0 after a clean stop, after --help or --version; a
 * status exit code (moat_status_exit_code) after bad options or a failed
 * hook, said on stderr or in the log. */
int moat_service_main(const struct moat_service *svc, void *ctx, int argc,
    char **argv);

/* moat_service_url: the URL setting `key` of [section], else
 * ipc://<state_dir>/<sock>. Heap string (NULL: out of memory), the
 * caller frees. */
char *moat_service_url(const struct moat_config *cfg, const char *section,
    const char *key, const char *state_dir, const char *sock);

/* moat_service_map_mib: the map-size-mib setting of [section] (default
 * MOAT_STORE_DEFAULT_MAP_MIB), checked to be 1 MiB to 16 TiB. On failure
 * returns a status and sets *errmsg (heap, caller frees). */
int moat_service_map_mib(const struct moat_config *cfg, const char *section,
    uint64_t *map_mib, char **errmsg) __attribute__((warn_unused_result));

#endif
