/*
 * main.c: the moat-gateway process: flags and the [gateway] config
 * section, the state directory, then the gateway (handlers.c) and its
 * HTTP door (http.c) until SIGTERM or SIGINT, which stop them cleanly.
 * Not for: any RPC behaviour (handlers.c, forward.c, discovery.c).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "gateway.h"
#include "http.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define SECTION "gateway"

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: moat-gateway [options]\n"
	    "  --config FILE        moat.conf to read ([gateway] section)\n"
	    "  --state-dir DIR      state directory (default: "
	    "$MOAT_STATE_DIR or /var/lib/moat)\n"
	    "  --listen URL         Gateway RPC (default "
	    "ipc://<state>/gateway.sock)\n"
	    "  --survey URL         node discovery surveyor (default "
	    "ipc://<state>/survey.sock)\n"
	    "  --sessiond URL       moat-sessiond (default "
	    "ipc://<state>/sessiond.sock)\n"
	    "  --snapd URL          moat-snapd (default "
	    "ipc://<state>/snapd.sock)\n"
	    "  --survey-interval-ms N  ms between surveys (default 1000)\n"
	    "  --workers N          calls served at once (default 64)\n"
	    "  --http ADDR          HTTP/JSON API host:port (default "
	    MOAT_HTTP_DEFAULT_ADDR "; \"off\": none)\n"
	    "  --mcp-max-sessions N MCP sessions at once on HTTP /mcp "
	    "(default %d)\n"
	    "  --mcp-idle-s N       with all open, a new one evicts the "
	    "least recently used\n"
	    "                       idle N s or more and destroys its "
	    "sandbox (default %d)\n"
	    "  --auth on|off        API keys required (default on; off: "
	    "every caller is tenant \"default\")\n"
	    "  --version, --help\n"
	    "Every option is also MOAT_GATEWAY_<NAME> in the environment and "
	    "<name> in [gateway].\n"
	    "[policy] refuse = blocked,destructive (default blocked) and "
	    "refuse.<tenant> = ... refuse commands by safety level.\n"
	    "  --retention-keep-last N   step snapshots a session keeps "
	    "(default %d; 0: all)\n"
	    "  --retention-keep-age-s S  younger ones are always kept "
	    "(default %d)\n"
	    "  (also [retention] keep-last / keep-age-s, per tenant "
	    "keep-last.<tenant> ..., MOAT_RETENTION_KEEP_LAST ...)\n"
	    "usage: moat-gateway keys create --tenant NAME | keys ls "
	    "[--tenant NAME] | keys revoke KEYID\n"
	    "  (with --config / --state-dir as above; works while the "
	    "gateway runs)\n", MOAT_HTTP_MCP_MAX_SESSIONS,
	    MOAT_HTTP_MCP_IDLE_S, MOAT_RETENTION_KEEP_LAST,
	    MOAT_RETENTION_KEEP_AGE_S);
}

/* keys_main: `moat-gateway keys create|ls|revoke`: the operator's door
 * to the key store in the gateway's state directory. Opens the store
 * next to a running gateway (LMDB allows a second process). */
static int
keys_main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "state-dir", required_argument, NULL, 's' },
		{ "tenant", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *config_path = NULL, *tenant = NULL, *verb;
	char *state_dir = NULL, *errmsg = NULL, *secret = NULL;
	char key_id[MOAT_AUTH_KEY_ID_LEN + 1];
	struct moat_config *cfg = NULL;
	struct moat_auth *a = NULL;
	int opt, rv;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			config_path = optarg;
			break;
		case 's':
			state_dir = strdup(optarg);
			break;
		case 't':
			tenant = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return moat_status_exit_code(MOAT_INVALID_ARGUMENT);
		}
	}
	verb = optind < argc ? argv[optind] : "";
	moat_log_init("gateway", MOAT_LOG_WARN);
	if ((rv = moat_config_load(&cfg, config_path, &errmsg)) != MOAT_OK)
		goto out;
	if (state_dir == NULL)
		state_dir = moat_config_state_dir(cfg, SECTION);
	if (state_dir == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		errmsg = moat_asprintf("out of memory");
		goto out;
	}
	if (strcmp(verb, "create") != 0 && strcmp(verb, "ls") != 0 &&
	    strcmp(verb, "revoke") != 0) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("keys: say create --tenant NAME, ls "
		    "[--tenant NAME] or revoke KEYID");
		goto out;
	}
	if (strcmp(verb, "create") == 0 && tenant == NULL) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("keys create: --tenant NAME is "
		    "required");
		goto out;
	}
	if (strcmp(verb, "revoke") == 0 && optind + 1 >= argc) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("keys revoke: name the KEYID (`moat-"
		    "gateway keys ls` lists them)");
		goto out;
	}
	if ((rv = moat_mkdir_p(state_dir, 0700)) != 0) {
		errmsg = moat_asprintf("cannot create the state directory "
		    "%s: %s", state_dir, strerror(rv));
		rv = moat_status_from_errno(rv);
		goto out;
	}
	if ((rv = moat_auth_open(&a, state_dir, &errmsg)) != MOAT_OK)
		goto out;
	if (strcmp(verb, "create") == 0) {
		if ((rv = moat_auth_key_create(a, tenant, &secret, key_id,
		    &errmsg)) == MOAT_OK) {
			printf("%s\n", secret);
			fprintf(stderr, "key %s of tenant %s: the line above is "
			    "its secret, shown this once: keep it (e.g. in "
			    "MOAT_API_KEY)\n", key_id, tenant);
		}
	} else if (strcmp(verb, "ls") == 0) {
		rv = moat_auth_key_list(a, tenant, stdout, &errmsg);
	} else {
		if ((rv = moat_auth_key_revoke(a, argv[optind + 1],
		    &errmsg)) == MOAT_OK)
			printf("revoked %s\n", argv[optind + 1]);
	}
out:
	if (rv != MOAT_OK)
		fprintf(stderr, "moat-gateway keys: %s\n", errmsg ? errmsg :
		    moat_strerror(rv));
	moat_auth_close(a);
	free(secret);
	free(errmsg);
	free(state_dir);
	moat_config_free(cfg);
	return rv == MOAT_OK ? 0 : moat_status_exit_code(rv);
}

/* retention_config: the retention flags (settings of [gateway], as
 * moat_config_from_args makes every flag) become [retention]'s, and the
 * default policy is checked now rather than at the first step. */
static int
retention_config(struct moat_config *cfg, char **errmsg)
{
	static const char *const keys[] = { "keep-last", "keep-age-s" };
	struct moat_retention policy;
	char name[32];
	const char *v;
	uint64_t n;
	int rv;

	for (size_t i = 0; i < 2; i++) {
		snprintf(name, sizeof(name), "retention-%s", keys[i]);
		if ((v = moat_config_get(cfg, SECTION, name, NULL)) == NULL)
			continue;
		if ((rv = moat_config_get_u64(cfg, SECTION, name, 0, &n,
		    errmsg)) != MOAT_OK)
			return rv;
		if ((rv = moat_config_set_flag(cfg, "retention", keys[i],
		    v)) != MOAT_OK) {
			*errmsg = moat_asprintf("out of memory");
			return rv;
		}
	}
	return moat_retention_policy(cfg, NULL, &policy, errmsg);
}

int
main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "state-dir", required_argument, NULL, 's' },
		{ "listen", required_argument, NULL, 'l' },
		{ "survey", required_argument, NULL, 'u' },
		{ "sessiond", required_argument, NULL, 'S' },
		{ "snapd", required_argument, NULL, 'P' },
		{ "survey-interval-ms", required_argument, NULL, 'i' },
		{ "workers", required_argument, NULL, 'w' },
		{ "http", required_argument, NULL, 'H' },
		{ "auth", required_argument, NULL, 'A' },
		{ "mcp-max-sessions", required_argument, NULL, 'M' },
		{ "mcp-idle-s", required_argument, NULL, 'I' },
		{ "retention-keep-last", required_argument, NULL, 'K' },
		{ "retention-keep-age-s", required_argument, NULL, 'G' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct moat_gateway_opts opts = { 0 };
	struct moat_http_opts http_opts = { 0 };
	struct moat_config *cfg = NULL;
	struct moat_gateway *gw = NULL;
	struct moat_http *http = NULL;
	const char *http_addr;
	const char *v;
	char *state_dir = NULL, *listen = NULL, *survey = NULL;
	char *sessiond = NULL, *snapd = NULL, *errmsg = NULL;
	uint64_t interval = 0, workers = 0, mcp_max = 0, mcp_idle = 0;
	sigset_t sigs;
	int sig = 0, rv, exit_code = 1;

	bool auth = true;

	if (argc > 1 && strcmp(argv[1], "keys") == 0)
		return keys_main(argc - 1, argv + 1);
	if ((exit_code = moat_config_from_args(argc, argv, long_opts,
	    "moat-gateway", SECTION, usage, &cfg)) != -1)
		return exit_code;
	exit_code = 1;
	moat_log_init("gateway", MOAT_LOG_INFO);
	moat_service_malloc_init();
	state_dir = moat_config_state_dir(cfg, SECTION);
	if (state_dir == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		errmsg = moat_asprintf("out of memory");
		goto fail_msg;
	}
	if ((rv = moat_mkdir_p(state_dir, 0700)) != 0) {
		errmsg = moat_asprintf("cannot create the state directory %s: "
		    "%s: create it, or pick another with --state-dir",
		    state_dir, strerror(rv));
		rv = moat_status_from_errno(rv);
		goto fail_msg;
	}
#define URL_OR_DEFAULT(var, key, file)                                   \
	do {                                                             \
		if ((v = moat_config_get(cfg, SECTION, key, NULL)) != NULL) \
			var = strdup(v);                                 \
		else                                                     \
			var = moat_asprintf("ipc://%s/%s", state_dir, file); \
	} while (0)
	URL_OR_DEFAULT(listen, "listen", "gateway.sock");
	URL_OR_DEFAULT(survey, "survey", "survey.sock");
	URL_OR_DEFAULT(sessiond, "sessiond", "sessiond.sock");
	URL_OR_DEFAULT(snapd, "snapd", "snapd.sock");
#undef URL_OR_DEFAULT
	if (listen == NULL || survey == NULL || sessiond == NULL ||
	    snapd == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		errmsg = moat_asprintf("out of memory");
		goto fail_msg;
	}
	if ((rv = moat_config_get_u64(cfg, SECTION, "survey-interval-ms",
	    MOAT_GW_SURVEY_INTERVAL_MS, &interval, &errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "workers", 0, &workers,
	    &errmsg)) != MOAT_OK)
		goto fail_msg;
	if (interval < 50 || interval > 60000 || workers > 4096) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("survey-interval-ms must be 50-60000 "
		    "and workers at most 4096");
		goto fail_msg;
	}
	if ((rv = moat_config_get_u64(cfg, SECTION, "mcp-max-sessions",
	    MOAT_HTTP_MCP_MAX_SESSIONS, &mcp_max, &errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "mcp-idle-s",
	    MOAT_HTTP_MCP_IDLE_S, &mcp_idle, &errmsg)) != MOAT_OK)
		goto fail_msg;
	if (mcp_max < 1 || mcp_max > MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT ||
	    mcp_idle > UINT32_MAX) {
		rv = MOAT_INVALID_ARGUMENT;
		errmsg = moat_asprintf("mcp-max-sessions must be 1-%u and "
		    "mcp-idle-s at most %u", MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT,
		    UINT32_MAX);
		goto fail_msg;
	}
	http_opts.mcp_max_sessions = (uint32_t)mcp_max;
	http_opts.mcp_idle_s = (uint32_t)mcp_idle;
	if ((rv = moat_config_get_bool(cfg, SECTION, "auth", true, &auth,
	    &errmsg)) != MOAT_OK ||
	    (rv = retention_config(cfg, &errmsg)) != MOAT_OK)
		goto fail_msg;
	if (!auth)
		moat_warn(0, "moat-gateway: auth is off: every caller is "
		    "tenant \"default\", without a key");
	opts.auth = auth;
	opts.config = cfg;
	opts.listen_url = listen;
	opts.survey_url = survey;
	opts.sessiond_url = sessiond;
	opts.snapd_url = snapd;
	opts.state_dir = state_dir;
	opts.survey_interval_ms = (uint32_t)interval;
	opts.workers = (int)workers;

	/* Every thread started from here on inherits the mask, so the
	 * signals reach only sigwait below. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	if ((rv = moat_gateway_start(&gw, &opts, &errmsg)) != MOAT_OK)
		goto fail_msg;
	http_addr = moat_config_get(cfg, SECTION, "http", NULL);
	if (http_addr == NULL || strcmp(http_addr, "off") != 0) {
		rv = moat_http_start(&http, gw, http_addr ? http_addr :
		    MOAT_HTTP_DEFAULT_ADDR, &http_opts, &errmsg);
		if (rv != MOAT_OK && http_addr != NULL) {
			moat_gateway_stop(gw);
			goto fail_msg;
		}
		/* The default port taken (another gateway on this host,
		 * a test) costs the HTTP door only, not the gateway. */
		if (rv != MOAT_OK) {
			moat_warn(0, "moat-gateway: no HTTP API: %s", errmsg);
			free(errmsg);
			errmsg = NULL;
		} else {
			moat_info(0, "moat-gateway: HTTP API on http://%s",
			    http_addr ? http_addr : MOAT_HTTP_DEFAULT_ADDR);
		}
	}
	moat_info(0, "moat-gateway %s serving %s, surveying %s, state %s",
	    MOAT_VERSION, listen, survey, state_dir);
	do {
		rv = sigwait(&sigs, &sig);
	} while (rv == EINTR);
	moat_info(0, "moat-gateway: signal %d: stopping", sig);
	/* The HTTP door first: its requests run on the gateway. */
	moat_http_stop(http);
	moat_gateway_stop(gw);
	moat_info(0, "moat-gateway stopped");
	exit_code = 0;
	goto out;

fail_msg:
	moat_error(0, "moat-gateway: %s", errmsg ? errmsg : moat_strerror(rv));
	exit_code = moat_status_exit_code(rv);
out:
	free(errmsg);
	free(state_dir);
	free(listen);
	free(survey);
	free(sessiond);
	free(snapd);
	moat_config_free(cfg);
	return exit_code;
}
