/*
 * cmd_mcp.c: `moat mcp`, moat's MCP server on stdio for MCP clients
 * (Claude Desktop, Claude Code, ...) that spawn it: newline-delimited
 * JSON-RPC on stdin and stdout, logs on stderr only. Protocol and tools
 * are lib/mcp/ (shared with the gateway's /mcp); this file is the
 * framing and the call function, which sends each Gateway method over
 * nng. The sandbox made for the session is destroyed when stdin ends.
 * Not for: the protocol (mcp.c) or the tools (tools.c).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moat/mcp.h"
#include "moat/codec.h"
#include "moat/rpc.h"
#include "moat/status.h"

#define USAGE "mcp [--allow-dir DIR]"

/* The signal that asked us to stop (0: none): the read of stdin is
 * interrupted, the session's sandbox destroyed, and we exit. */
static volatile sig_atomic_t mcp_stop;

static void
on_stop_signal(int sig)
{
	mcp_stop = sig;
}

struct stdio_call {
	struct moat_rpc_client *rpc;
	uint32_t timeout_ms; /* --timeout; 0: per method */
	const char *auth;    /* the CLI's API key (cli_api_key) */
};

/* stdio_gateway_call: the moat_mcp_call_fn of `moat mcp`: JSON to the
 * method's message, one nng call, the reply back to JSON. */
static int
stdio_gateway_call(void *arg, const char *method, json_t *request,
    json_t **reply, char **errmsg)
{
	struct stdio_call *sc = arg;
	const ProtobufCMethodDescriptor *md;
	ProtobufCMessage *req = NULL, *out = NULL;
	struct moat_rpc_opts opts = { 0 };
	int rv;

	*reply = NULL;
	*errmsg = NULL;
	if ((rv = moat_mcp_decode_request(&moat__v1__gateway__descriptor,
	         method, request, &md, &req, errmsg)) != MOAT_OK)
		return rv;
	opts.timeout_ms = sc->timeout_ms ?
	    sc->timeout_ms :
	    moat_mcp_timeout_ms(method, request);
	opts.auth = sc->auth;
	rv = moat_rpc_call(sc->rpc, moat__v1__gateway__descriptor.name, method,
	    req, md->output, &out, &opts, errmsg);
	protobuf_c_message_free_unpacked(req, NULL);
	if (rv != MOAT_OK)
		return rv;
	rv = moat_codec_to_json(out, 0, reply, errmsg);
	protobuf_c_message_free_unpacked(out, NULL);
	return rv;
}

int
cmd_mcp(struct cli *cli, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "allow-dir", required_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct stdio_call sc = { .timeout_ms = cli->timeout_ms,
		.auth = cli_api_key(cli) };
	struct moat_mcp_session *s = NULL;
	const char *allow_dir = NULL;
	char *line = NULL, *errmsg = NULL, *reply;
	size_t cap = 0;
	ssize_t len;
	int c, rv;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+d:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'd':
			allow_dir = optarg;
			break;
		case 'h':
			printf(
			    "usage: moat " USAGE "\n\nServes MCP on stdin/"
			    "stdout (newline-delimited JSON-RPC). Host file "
			    "tools (upload_file, download_file) are offered "
			    "only with --allow-dir, and reach only files "
			    "below DIR.\n");
			return 0;
		default:
			return cli_usage_error(USAGE, "unknown option");
		}
	}
	if (optind != argc)
		return cli_usage_error(USAGE, "unexpected argument %s",
		    argv[optind]);
	if ((rv = moat_mcp_session_new(&s, allow_dir, "stdio", &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "moat mcp");
	/* The CLI's own connection, with its TLS settings (--tls-*,
	 * MOAT_TLS_*); closed by main. */
	sc.rpc = moat_client_rpc(cli_client(cli));
	/* A client that goes away mid-reply, or stops us with SIGTERM (as
	 * MCP clients do after closing stdin), must not kill us before the
	 * session's sandbox is destroyed. No SA_RESTART: the signal ends a
	 * blocked read of stdin. */
	signal(SIGPIPE, SIG_IGN);
	{
		struct sigaction sa = { .sa_handler = on_stop_signal };

		sigemptyset(&sa.sa_mask);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGHUP, &sa, NULL);
	}
	fprintf(stderr, "moat mcp: serving MCP on stdio (gateway %s%s%s)\n",
	    moat_client_url(cli_client(cli)),
	    allow_dir ? ", host files in " : "", allow_dir ? allow_dir : "");
	while (!mcp_stop && (len = getline(&line, &cap, stdin)) >= 0) {
		while (len > 0 &&
		    (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (len == 0)
			continue;
		if ((size_t)len > MOAT_MCP_MAX_MESSAGE) {
			json_t *e =
			    moat_mcp_error_reply(MOAT_MCP_INVALID_REQUEST,
			        "message larger than 8 MiB");
			reply = e ? json_dumps(e, JSON_COMPACT) : NULL;
			json_decref(e);
		} else {
			reply = moat_mcp_handle_text(s, line, (size_t)len,
			    stdio_gateway_call, &sc);
		}
		if (reply != NULL) {
			fputs(reply, stdout);
			fputc('\n', stdout);
			free(reply);
			if (fflush(stdout) != 0)
				break;
		}
	}
	free(line);
	moat_mcp_session_close(s, stdio_gateway_call, &sc);
	moat_mcp_session_free(s);

	return 0;
}
