/*
 * cli.h: what the files of the `moat` command share: the global options,
 * the command table's shape, error reporting in one format
 * ("moat: <what failed>: <message>", exit 64 + status code), JSON output
 * through the codec, and the interrupt flag the streaming commands poll.
 * Not for: RPC details (clients/lib/moat_client.h).
 */
#ifndef MOAT_CLI_H
#define MOAT_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "moat_client.h"

struct cli {
	const char *gateway_url; /* as given; NULL: default */
	bool json;               /* --json: data as JSON on stdout */
	uint32_t timeout_ms;     /* --timeout; 0: per-call defaults */
	const char *api_key;     /* --api-key; NULL: cli_client finds it */
	/* --tls-ca, --tls-cert, --tls-key, --tls-name, --insecure (unset:
	 * MOAT_TLS_* in the client library) */
	struct moat_client_tls tls;
	struct moat_client *client;
};

struct cli_command {
	const char *name;
	int (*run)(struct cli *cli, int argc, char **argv);
	const char *usage; /* one line, after "moat " */
	const char *summary;
};

/* cli_api_key: the API key the CLI sends: --api-key, $MOAT_API_KEY, the
 * first line of $MOAT_API_KEY_FILE or <state dir>/api-key; NULL when
 * none. Static or borrowed: valid until exit. */
const char *cli_api_key(const struct cli *cli);

/* cli_client: the gateway client, opened on first use. Exits the process
 * (with the error printed) when the url cannot be used. */
struct moat_client *cli_client(struct cli *cli);

/* cli_fail: prints "moat: <what>: <errmsg>" (plus what to do next when
 * the gateway did not answer or the call ran out of time) to stderr,
 * frees errmsg, and returns the exit code for `code`. */
int cli_fail(struct cli *cli, int code, char *errmsg, const char *what, ...)
    __attribute__((format(printf, 4, 5)));

/* cli_usage_error: prints "moat: <message>" and the command's usage line;
 * returns the exit code of INVALID_ARGUMENT. */
int cli_usage_error(const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* cli_print_session_tree: `moat session tree`'s text: one line per
 * session, branches indented under the session they branched from. */
void cli_print_session_tree(const Moat__V1__SessionTreeReply *t);

/* cli_print_json: writes msg as indented JSON (defaults included) and a
 * newline to stdout. Returns 0 or an exit code after printing the error. */
int cli_print_json(struct cli *cli, const void *msg);

/* cli_parse_seconds: "2", "0.5", "1.5s" -> ms. False if not a duration. */
bool cli_parse_seconds(const char *s, uint32_t *ms);

/* cli_take_json: drops every "--json" of argv[0..argc) (setting
 * cli->json) for commands that take it after their subcommand; returns
 * the new argc. */
int cli_take_json(struct cli *cli, int argc, char **argv);
/* cli_parse_u32: a decimal in [min, max]. */
bool cli_parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out);

/* cli_format_age: "3s", "4m", "2h", "5d" since unix ms `then`, into buf. */
const char *cli_format_age(uint64_t then_ms, char *buf, size_t len);

/* Interrupts: the streaming commands install cli_catch_signals and poll
 * cli_interrupted (0, or the signal number; the count of signals seen is
 * in cli_signal_count). */
extern volatile sig_atomic_t cli_interrupted;
extern volatile sig_atomic_t cli_signal_count;
void cli_catch_signals(void);

/* Commands (one file per concern). */
int cmd_run(struct cli *cli, int argc, char **argv);
int cmd_exec(struct cli *cli, int argc, char **argv);
int cmd_shell(struct cli *cli, int argc, char **argv);
int cmd_sandbox(struct cli *cli, int argc, char **argv);
int cmd_cp(struct cli *cli, int argc, char **argv);
int cmd_ls(struct cli *cli, int argc, char **argv);
int cmd_info(struct cli *cli, int argc, char **argv);
int cmd_session(struct cli *cli, int argc, char **argv);
int cmd_history(struct cli *cli, int argc, char **argv);
int cmd_diff(struct cli *cli, int argc, char **argv);
int cmd_compare(struct cli *cli, int argc, char **argv);
int cmd_code(struct cli *cli, int argc, char **argv);
/* `sandbox keepalive` and the lifetime lines of `sandbox get`
 * (cmd_lifetime.c). */
int cli_sandbox_keepalive(struct cli *cli, int argc, char **argv);
void cli_lifetime_print(const Moat__V1__Sandbox *s);

/* cli_read_code: program text for `run` and `code`: the file, or stdin
 * for "-", at most 16 MiB. MOAT_OK with *code (heap, NUL-terminated,
 * the caller frees), else a status with *errmsg (heap) saying why. */
int cli_read_code(const char *file, char **code, char **errmsg);
int cmd_restore(struct cli *cli, int argc, char **argv);
int cmd_fork(struct cli *cli, int argc, char **argv);
int cmd_replay(struct cli *cli, int argc, char **argv);
int cmd_mcp(struct cli *cli, int argc, char **argv);
int cmd_audit(struct cli *cli, int argc, char **argv);
int cmd_snapshot(struct cli *cli, int argc, char **argv);
int cmd_node(struct cli *cli, int argc, char **argv);
int cmd_image(struct cli *cli, int argc, char **argv);

/* The common option of every command: --json also after the command. */
#define CLI_OPT_JSON 0x1000

#endif
