/*
 * main.c: the moat-gateway process: its hooks of moat_service_main
 * (moat/service.h) read the flags and the [gateway] config section, then
 * run the gateway (handlers.c), its HTTP door (http.c) and its gRPC door
 * (grpc.c) until SIGTERM or SIGINT, which stop them cleanly; and
 * `moat-gateway keys`.
 * Not for: any RPC behaviour (handlers.c, forward.c, discovery.c).
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "gateway.h"
#include "grpc.h"
#include "grpc_stream.h"
#include "http.h"
#include "keys_cli.h"
#include "tenants.h"
#include "ratelimit.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/service.h"
#include "moat/status.h"
#include "moat/tls.h"
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
	    "  --http ADDR          HTTP/JSON API host:port "
	    "(default " MOAT_HTTP_DEFAULT_ADDR "; \"off\": none)\n"
	    "  --grpc ADDR          gRPC host:port "
	    "(default " MOAT_GRPC_DEFAULT_ADDR "; \"off\": none)\n"
	    "  --grpc-tls-cert FILE, --grpc-tls-key FILE  serve gRPC over "
	    "TLS (default:\n"
	    "                       the http-tls ones when set)\n"
	    "  --mcp-max-sessions N MCP sessions at once on HTTP /mcp "
	    "(default %d)\n"
	    "  --mcp-idle-s N       with all open, a new one evicts the "
	    "least recently used\n"
	    "                       idle N s or more and destroys its "
	    "sandbox (default %d)\n"
	    "  --auth on|off        API keys required (default on; off: "
	    "every caller is tenant \"default\")\n" MOAT_TLS_USAGE
	    "                       (tls-ca: the CAs of vmd, sessiond and "
	    "snapd;\n"
	    "                       tls-peer-ca: optional client "
	    "certificates)\n"
	    "  --survey-tls-peer-ca FILE  CAs of the nodes that may answer "
	    "the\n"
	    "                       survey (default: tls-peer-ca)\n"
	    "  --sessiond-tls-name N  name in sessiond's certificate "
	    "(default sessiond)\n"
	    "  --snapd-tls-name N   name in snapd's certificate (default "
	    "snapd)\n"
	    "  --http-tls-cert FILE, --http-tls-key FILE  serve the HTTP API "
	    "as HTTPS\n"
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
	    "gateway runs)\n"
	    "  keys go to the moat-sessiond of --sessiond URL, else of "
	    "[gateway] sessiond,\n"
	    "  else of the gateway last started on --state-dir with a "
	    "sessiond (<state>/keys-sessiond;\n"
	    "  if that sessiond is down: the local store, imported at the "
	    "gateway's next start);\n"
	    "  --local: the local store only. With TLS: --tls-cert, "
	    "--tls-key, --tls-ca,\n"
	    "  --sessiond-tls-name as for the gateway.\n"
	    "usage: moat-gateway tenants set NAME KEY=N... | unset NAME "
	    "KEY... | show NAME | rm NAME | ls\n"
	    "  a tenant's own [tenants] values in moat-sessiond (found as "
	    "for keys; no local store),\n"
	    "  applied by every gateway within 5 s over its config file's: "
	    "max-sandboxes, max-vcpus,\n"
	    "  max-memory-mib, max-snapshot-bytes, key-rps, key-burst, "
	    "timeout-s, timeout-max-s,\n"
	    "  idle-timeout-s.\n",
	    MOAT_HTTP_MCP_MAX_SESSIONS, MOAT_HTTP_MCP_IDLE_S,
	    MOAT_RETENTION_KEEP_LAST, MOAT_RETENTION_KEEP_AGE_S);
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

/* What the hooks share: the options the gateway and its HTTP door start
 * with, what they are, and the strings main() owns. */
struct gateway_main {
	struct moat_gateway_opts opts;
	struct moat_http_opts http_opts;
	struct moat_config *cfg; /* borrowed from moat_service_main */
	struct moat_gateway *gw;
	struct moat_http *http;
	struct moat_grpc *grpc;
	char *listen, *survey, *sessiond, *snapd;
	struct moat_tls *tls, *survey_tls;
};

/* gateway_tls: [gateway]'s TLS settings, for its listeners and dials
 * (moat/tls.h), and the survey's callers (survey-tls-peer-ca). */
static int
gateway_tls(struct gateway_main *m, struct moat_config *cfg, char **errmsg)
{
	int rv;

	if ((rv = moat_tls_from_config(cfg, SECTION, &m->tls, errmsg)) !=
	        MOAT_OK ||
	    (rv = moat_tls_with_peer_ca(m->tls,
	         moat_config_get(cfg, SECTION, "survey-tls-peer-ca", NULL),
	         "survey-tls-peer-ca", &m->survey_tls, errmsg)) != MOAT_OK)
		return rv;
	m->opts.tls = m->tls;
	m->opts.survey_tls = m->survey_tls;
	m->opts.sessiond_tls_name =
	    moat_config_get(cfg, SECTION, "sessiond-tls-name", "sessiond");
	m->opts.snapd_tls_name =
	    moat_config_get(cfg, SECTION, "snapd-tls-name", "snapd");
	m->http_opts.tls_cert =
	    moat_config_get(cfg, SECTION, "http-tls-cert", NULL);
	m->http_opts.tls_key =
	    moat_config_get(cfg, SECTION, "http-tls-key", NULL);
	m->http_opts.cors_origins =
	    moat_config_get(cfg, SECTION, "http-cors-origins", NULL);
	return MOAT_OK;
}

/* http_limits: [gateway] rate-limit-rps (0: none), rate-limit-burst,
 * max-conns-per-addr and archive-max-mib of the HTTP door. */
static int
http_limits(struct moat_http_opts *o, struct moat_config *cfg, char **errmsg)
{
	uint64_t rps = 0, burst = 0, conns = 0, archive = 0;
	int rv;

	if ((rv = moat_config_get_u64(cfg, SECTION, "rate-limit-rps",
	         MOAT_RATELIMIT_RPS, &rps, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "rate-limit-burst",
	         MOAT_RATELIMIT_BURST, &burst, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "max-conns-per-addr",
	         MOAT_HTTP_MAX_CONNS_PER_ADDR, &conns, errmsg)) != MOAT_OK)
		return rv;
	if (rps > 1000000 || burst < 1 || burst > 1000000 || conns < 1 ||
	    conns > MOAT_HTTP_MAX_CONNECTIONS) {
		*errmsg = moat_asprintf(
		    "[gateway] rate-limit-rps must be "
		    "0-1000000 (0: no limit), rate-limit-burst 1-1000000 and "
		    "max-conns-per-addr 1-%u",
		    MOAT_HTTP_MAX_CONNECTIONS);
		return MOAT_INVALID_ARGUMENT;
	}
	if (rps == 0)
		moat_warn(0,
		    "moat-gateway: rate-limit-rps is 0: the HTTP "
		    "door has no rate limit");
	if ((rv = moat_config_get_u64(cfg, SECTION, "archive-max-mib",
	         MOAT_HTTP_ARCHIVE_MAX_MIB, &archive, errmsg)) != MOAT_OK)
		return rv;
	if (archive < 1 || archive > MOAT_HTTP_ARCHIVE_MAX_MIB_LIMIT) {
		*errmsg = moat_asprintf("[gateway] archive-max-mib must be "
		                        "1-%u (MiB), not %llu",
		    MOAT_HTTP_ARCHIVE_MAX_MIB_LIMIT,
		    (unsigned long long)archive);
		return MOAT_INVALID_ARGUMENT;
	}
	o->archive_max_mib = (uint32_t)archive;
	o->rate_limit_rps = rps ? (uint32_t)rps : MOAT_HTTP_UNLIMITED;
	o->rate_limit_burst = (uint32_t)burst;
	o->max_conns_per_addr = (uint32_t)conns;
	return MOAT_OK;
}

static int
gateway_open(void *ctx, struct moat_config *cfg, const char *state_dir,
    char **errmsg)
{
	struct gateway_main *m = ctx;
	uint64_t interval = 0, workers = 0, mcp_max = 0, mcp_idle = 0;
	uint64_t stale = 0;
	bool auth = true;
	int rv;

	m->cfg = cfg;
	m->listen = moat_service_url(cfg, SECTION, "listen", state_dir,
	    "gateway.sock");
	m->survey =
	    moat_service_url(cfg, SECTION, "survey", state_dir, "survey.sock");
	m->sessiond = moat_service_url(cfg, SECTION, "sessiond", state_dir,
	    "sessiond.sock");
	m->snapd =
	    moat_service_url(cfg, SECTION, "snapd", state_dir, "snapd.sock");
	if (m->listen == NULL || m->survey == NULL || m->sessiond == NULL ||
	    m->snapd == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = moat_config_get_u64(cfg, SECTION, "survey-interval-ms",
	         MOAT_GW_SURVEY_INTERVAL_MS, &interval, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "workers", 0, &workers,
	         errmsg)) != MOAT_OK)
		return rv;
	if (interval < 50 || interval > 60000 || workers > 4096) {
		*errmsg = moat_asprintf("survey-interval-ms must be 50-60000 "
		                        "and workers at most 4096");
		return MOAT_INVALID_ARGUMENT;
	}
	if ((rv = moat_config_get_u64(cfg, SECTION, "mcp-max-sessions",
	         MOAT_HTTP_MCP_MAX_SESSIONS, &mcp_max, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(cfg, SECTION, "mcp-idle-s",
	         MOAT_HTTP_MCP_IDLE_S, &mcp_idle, errmsg)) != MOAT_OK)
		return rv;
	if (mcp_max < 1 || mcp_max > MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT ||
	    mcp_idle > UINT32_MAX) {
		*errmsg = moat_asprintf("mcp-max-sessions must be 1-%u and "
		                        "mcp-idle-s at most %u",
		    MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT, UINT32_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	m->http_opts.mcp_max_sessions = (uint32_t)mcp_max;
	m->http_opts.mcp_idle_s = (uint32_t)mcp_idle;
	if ((rv = http_limits(&m->http_opts, cfg, errmsg)) != MOAT_OK)
		return rv;
	if ((rv = moat_config_get_bool(cfg, SECTION, "auth", true, &auth,
	         errmsg)) != MOAT_OK ||
	    (rv = retention_config(cfg, errmsg)) != MOAT_OK)
		return rv;
	if ((rv = gateway_tls(m, cfg, errmsg)) != MOAT_OK)
		return rv;
	if (!auth)
		moat_warn(0,
		    "moat-gateway: auth is off: every caller is "
		    "tenant \"default\", without a key");
	m->opts.auth = auth;
	m->opts.config = cfg;
	m->opts.listen_url = m->listen;
	m->opts.survey_url = m->survey;
	m->opts.sessiond_url = m->sessiond;
	/* Configured with a sessiond (flag, [gateway] or environment):
	 * the keys live there, shared by every gateway. */
	m->opts.keys_in_sessiond =
	    moat_config_get(cfg, SECTION, "sessiond", NULL) != NULL;
	if ((rv = moat_config_get_u64(cfg, SECTION, "keys-stale-s", 300,
	         &stale, errmsg)) != MOAT_OK)
		return rv;
	if (stale > 86400) {
		*errmsg = moat_asprintf("keys-stale-s must be 0-86400, not "
		                        "%llu",
		    (unsigned long long)stale);
		return MOAT_INVALID_ARGUMENT;
	}
	m->opts.keys_stale_s = (uint32_t)stale;
	m->opts.snapd_url = m->snapd;
	m->opts.state_dir = state_dir;
	m->opts.survey_interval_ms = (uint32_t)interval;
	m->opts.workers = (int)workers;
	return MOAT_OK;
}

/* grpc_tls_files: the gRPC door's certificate and key: [gateway]
 * grpc-tls-cert / grpc-tls-key, else the HTTPS door's http-tls-cert /
 * http-tls-key; both or neither. */
static int
grpc_tls_files(struct gateway_main *m, struct moat_grpc_limits *lim,
    char **errmsg)
{
	const char *cert =
	    moat_config_get(m->cfg, SECTION, "grpc-tls-cert", NULL);
	const char *key =
	    moat_config_get(m->cfg, SECTION, "grpc-tls-key", NULL);
	bool own = (cert != NULL && cert[0] != '\0') ||
	    (key != NULL && key[0] != '\0');

	if (!own) {
		cert = m->http_opts.tls_cert;
		key = m->http_opts.tls_key;
	}
	if (cert != NULL && cert[0] == '\0')
		cert = NULL;
	if (key != NULL && key[0] == '\0')
		key = NULL;
	if ((cert == NULL) != (key == NULL)) {
		*errmsg = moat_asprintf(own ?
		        "[gateway] grpc-tls-cert and grpc-tls-key go "
		        "together: set both (--grpc-tls-cert, "
		        "--grpc-tls-key) or neither" :
		        "[gateway] http-tls-cert and http-tls-key go "
		        "together: set both or neither");
		return MOAT_INVALID_ARGUMENT;
	}
	lim->tls_cert = cert;
	lim->tls_key = key;
	return MOAT_OK;
}

/* grpc_serve: the gRPC door on [gateway] grpc (--grpc,
 * MOAT_GATEWAY_GRPC), MOAT_GRPC_DEFAULT_ADDR when unset; "off": none.
 * An address given that cannot be served stops the gateway; the default
 * taken (another gateway on this host) costs the door only, as on the
 * HTTP door. */
static int
grpc_serve(struct gateway_main *m, char **errmsg)
{
	const char *addr = moat_config_get(m->cfg, SECTION, "grpc", NULL);
	struct moat_grpc_limits lim = { 0 };
	uint64_t mib = 0, idle = 0;
	int rv;

	if (addr != NULL && strcmp(addr, "off") == 0)
		return MOAT_OK;
	if ((rv = moat_config_get_u64(m->cfg, SECTION, "grpc-buffer-mib",
	         MOAT_GRPC_BUFFER_MIB, &mib, errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64(m->cfg, SECTION, "grpc-idle-s",
	         MOAT_GRPC_IDLE_S, &idle, errmsg)) != MOAT_OK ||
	    (rv = grpc_tls_files(m, &lim, errmsg)) != MOAT_OK)
		return rv;
	if (mib < 1 || mib > 65536 || idle < 1 || idle > 86400) {
		*errmsg = moat_asprintf("[gateway] grpc-buffer-mib must be "
		                        "1-65536 and grpc-idle-s 1-86400: fix "
		                        "the config file");
		return MOAT_INVALID_ARGUMENT;
	}
	lim.buffer_mib = (uint32_t)mib;
	lim.idle_s = (uint32_t)idle;
	rv = moat_grpc_start_limits(&m->grpc, m->gw,
	    addr ? addr : MOAT_GRPC_DEFAULT_ADDR, m->http_opts.rate_limit_rps,
	    m->http_opts.rate_limit_burst, &lim, errmsg);
	if (rv == MOAT_UNAVAILABLE && addr == NULL) {
		moat_warn(0, "moat-gateway: no gRPC door: %s", *errmsg);
		free(*errmsg);
		*errmsg = NULL;
		return MOAT_OK;
	}
	if (rv != MOAT_OK)
		return rv;
	moat_info(0, "moat-gateway: gRPC on %s (port %u%s)",
	    addr ? addr : MOAT_GRPC_DEFAULT_ADDR,
	    (unsigned)moat_grpc_port(m->grpc), lim.tls_cert ? ", TLS" : "");
	return MOAT_OK;
}

static int
gateway_serve(void *ctx, char **errmsg)
{
	struct gateway_main *m = ctx;
	const char *http_addr;
	int rv;

	if ((rv = moat_gateway_start(&m->gw, &m->opts, errmsg)) != MOAT_OK)
		return rv;
	/* Tenants' own settings in sessiond come before the file's. */
	if (moat_gateway_tenants(m->gw) != NULL)
		moat_config_set_overlay(m->cfg, "tenants",
		    moat_tenants_overlay, moat_gateway_tenants(m->gw));
	http_addr = moat_config_get(m->cfg, SECTION, "http", NULL);
	if (http_addr == NULL || strcmp(http_addr, "off") != 0) {
		rv = moat_http_start(&m->http, m->gw,
		    http_addr ? http_addr : MOAT_HTTP_DEFAULT_ADDR,
		    &m->http_opts, errmsg);
		if (rv != MOAT_OK && http_addr != NULL) {
			moat_gateway_stop(m->gw);
			m->gw = NULL;
			return rv;
		}
		/* The default port taken (another gateway on this host,
		 * a test) costs the HTTP door only, not the gateway. */
		if (rv != MOAT_OK) {
			moat_warn(0, "moat-gateway: no HTTP API: %s", *errmsg);
			free(*errmsg);
			*errmsg = NULL;
		} else {
			moat_info(0, "moat-gateway: HTTP API on %s://%s",
			    m->http_opts.tls_cert ? "https" : "http",
			    http_addr ? http_addr : MOAT_HTTP_DEFAULT_ADDR);
		}
	}
	if ((rv = grpc_serve(m, errmsg)) != MOAT_OK) {
		moat_http_stop(m->http);
		m->http = NULL;
		moat_gateway_stop(m->gw);
		m->gw = NULL;
		return rv;
	}
	moat_info(0, "moat-gateway %s serving %s, surveying %s, state %s",
	    MOAT_VERSION, m->listen, m->survey, m->opts.state_dir);
	return MOAT_OK;
}

static void
gateway_stop(void *ctx)
{
	struct gateway_main *m = ctx;

	/* The doors first: their calls run on the gateway. */
	moat_grpc_stop(m->grpc);
	moat_http_stop(m->http);
	if (m->cfg != NULL)
		moat_config_set_overlay(m->cfg, "tenants", NULL, NULL);
	moat_gateway_stop(m->gw);
	moat_info(0, "moat-gateway stopped");
}

static void
gateway_close(void *ctx)
{
	struct gateway_main *m = ctx;

	free(m->listen);
	free(m->survey);
	free(m->sessiond);
	free(m->snapd);
	moat_tls_free(m->tls);
	moat_tls_free(m->survey_tls);
}

int
main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		MOAT_SERVICE_OPTIONS_FIRST,
		{ "survey", required_argument, NULL, 'u' },
		{ "sessiond", required_argument, NULL, 'S' },
		{ "snapd", required_argument, NULL, 'P' },
		{ "survey-interval-ms", required_argument, NULL, 'i' },
		{ "workers", required_argument, NULL, 'w' },
		{ "http", required_argument, NULL, 'H' },
		{ "grpc", required_argument, NULL, 0x7426 },
		{ "auth", required_argument, NULL, 'A' },
		{ "mcp-max-sessions", required_argument, NULL, 'M' },
		{ "mcp-idle-s", required_argument, NULL, 'I' },
		{ "retention-keep-last", required_argument, NULL, 'K' },
		{ "retention-keep-age-s", required_argument, NULL, 'G' },
		MOAT_TLS_OPTIONS,
		{ "survey-tls-peer-ca", required_argument, NULL, 0x7420 },
		{ "sessiond-tls-name", required_argument, NULL, 0x7421 },
		{ "snapd-tls-name", required_argument, NULL, 0x7422 },
		{ "http-tls-cert", required_argument, NULL, 0x7423 },
		{ "http-tls-key", required_argument, NULL, 0x7424 },
		{ "grpc-tls-cert", required_argument, NULL, 0x7427 },
		{ "grpc-tls-key", required_argument, NULL, 0x7428 },
		MOAT_SERVICE_OPTIONS_LAST,
	};
	static const struct moat_service service = {
		.program = "moat-gateway",
		.section = SECTION,
		.log_component = "gateway",
		.options = long_opts,
		.usage = usage,
		.make_state_dir = true,
		.open = gateway_open,
		.serve = gateway_serve,
		.stop = gateway_stop,
		.close = gateway_close,
	};
	struct gateway_main m = { 0 };

	if (argc > 1 && strcmp(argv[1], "keys") == 0)
		return moat_gateway_keys_main(argc - 1, argv + 1, usage);
	if (argc > 1 && strcmp(argv[1], "tenants") == 0)
		return moat_gateway_tenants_main(argc - 1, argv + 1, usage);
	return moat_service_main(&service, &m, argc, argv);
}
