/*
 * moat/tls.h: TLS for moat's nng links, the same way in every service and
 * client. A struct moat_tls holds the PEM files of one program (its own
 * certificate chain and key, the CAs it trusts for the servers it dials,
 * the CAs it trusts for its callers), read once, plus the `insecure`
 * setting; from it come nng TLS configs for a listener (peer certificate
 * required or optional) or a dial (with the server name the peer's
 * certificate must carry). moat_tls_check_url holds the address rules:
 * tls+tcp:// needs TLS settings; plain tcp:// off loopback is refused
 * unless insecure; ipc:// is always fine.
 * Settings of a section (moat_tls_from_config): tls-cert, tls-key, tls-ca,
 * tls-peer-ca (default: tls-ca), insecure.
 * Not for: calls (moat/rpc.h takes a struct moat_tls in its _opts
 * functions), or the HTTP door's HTTPS (gateway/http.c, GnuTLS).
 */
#ifndef MOAT_TLS_H
#define MOAT_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <getopt.h>
#include <nng/nng.h>

struct moat_config;
struct moat_tls;
/* nng's; from <nng/supplemental/tls/tls.h>. */
struct nng_tls_config;

/* Whether a listener asks its callers for a certificate. */
enum moat_tls_peer {
	MOAT_TLS_PEER_REQUIRED = 0, /* a caller without a trusted one fails */
	MOAT_TLS_PEER_OPTIONAL,     /* checked when one is shown */
	MOAT_TLS_PEER_NONE,
};

/* The files of one program; NULL or "" for an unset one. */
struct moat_tls_files {
	const char *cert;    /* own certificate: leaf then intermediate */
	const char *key;     /* own private key */
	const char *ca;      /* CAs trusted for the servers dialed */
	const char *peer_ca; /* CAs trusted for callers (NULL: ca) */
	bool insecure;       /* plain tcp:// off loopback allowed */
	/* How the settings are named in messages: a service's section
	 * ("gateway": "[gateway] tls-cert (--tls-cert,
	 * MOAT_GATEWAY_TLS_CERT)"), or NULL for a client ("--tls-cert or
	 * MOAT_TLS_CERT"). */
	const char *section;
};

/* moat_tls_load: reads and checks the files (each a PEM nng's TLS
 * accepts; cert and key both or neither). With no file set the result is
 * "no TLS" (moat_tls_enabled false) but still carries `insecure`. On
 * failure returns a status and sets *errmsg (heap) naming the setting and
 * the file. */
int moat_tls_load(struct moat_tls **out, const struct moat_tls_files *files,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_tls_from_config: moat_tls_load with [section]'s tls-cert,
 * tls-key, tls-ca, tls-peer-ca and insecure (by moat_config's
 * precedence; cfg may be NULL: environment only). */
int moat_tls_from_config(const struct moat_config *cfg, const char *section,
    struct moat_tls **out, char **errmsg) __attribute__((warn_unused_result));

/* moat_tls_with_peer_ca: a copy of `t` trusting the CAs of `peer_ca_path`
 * for callers instead (NULL or "": a plain copy). `setting` names it in
 * messages ("survey-tls-peer-ca"). */
int moat_tls_with_peer_ca(const struct moat_tls *t, const char *peer_ca_path,
    const char *setting, struct moat_tls **out, char **errmsg)
    __attribute__((warn_unused_result));

void moat_tls_free(struct moat_tls *t);

/* moat_tls_enabled: any TLS file is set (t may be NULL). */
bool moat_tls_enabled(const struct moat_tls *t);

/* moat_tls_has_ca / moat_tls_has_peer_ca: tls-ca is set (it can dial
 * tls+tcp); a CA for callers is set (tls-peer-ca or tls-ca). */
bool moat_tls_has_ca(const struct moat_tls *t);
bool moat_tls_has_peer_ca(const struct moat_tls *t);

/* moat_tls_insecure: `insecure` is set (t may be NULL: false). */
bool moat_tls_insecure(const struct moat_tls *t);

/* moat_tls_url_is_tls: url is tls+tcp:// (tls+tcp4, tls+tcp6). */
bool moat_tls_url_is_tls(const char *url);

/* moat_tls_url_is_loopback: a tcp or tls+tcp url whose host is
 * 127.0.0.0/8, ::1 or localhost. */
bool moat_tls_url_is_loopback(const char *url);

/* moat_tls_check_url: whether `t` (may be NULL) may listen on (`listen`
 * true, with `peer` asked of callers) or dial `url`. tls+tcp:// needs
 * tls-cert and tls-key to listen (and a CA for callers unless peer is
 * NONE), tls-ca to dial; plain tcp:// off loopback needs insecure (then
 * a warning is logged, every time: call it once per listen or dial);
 * ipc://, inproc:// pass. `what` names the link in messages ("the RPC
 * listener", "the dial to snapd"). On refusal returns
 * MOAT_INVALID_ARGUMENT (FAILED_PRECONDITION for missing settings) and
 * sets *errmsg saying which setting to give. */
int moat_tls_check_url(const struct moat_tls *t, const char *url, bool listen,
    enum moat_tls_peer peer, const char *what, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_tls_server_config: an nng server config for a tls+tcp listener
 * (own certificate and key; callers checked against the peer CAs as
 * `peer` says). The caller frees it with nng_tls_config_free once set on
 * the listener. */
int moat_tls_server_config(const struct moat_tls *t, enum moat_tls_peer peer,
    struct nng_tls_config **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_tls_client_config: an nng client config for a tls+tcp dial: the
 * server must show a certificate from tls-ca naming `server_name` (NULL
 * or "": the url's host); our own certificate is shown when set. */
int moat_tls_client_config(const struct moat_tls *t, const char *url,
    const char *server_name, struct nng_tls_config **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_tls_url_host: the host of a tcp/tls+tcp url ("[::1]" without the
 * brackets) into buf; false when it has none. */
bool moat_tls_url_host(const char *url, char *buf, size_t len);

/* moat_tls_probe: one TLS connection attempt to `url` with `cfg`, at
 * most timeout_ms, to explain a dial that does not come up: 0 when the
 * handshake works, else nng's error (NNG_ECRYPTO, NNG_EPEERAUTH: the
 * certificate was refused; NNG_ECONNREFUSED: nothing listens). */
int moat_tls_probe(const char *url, struct nng_tls_config *cfg,
    uint32_t timeout_ms);

/* moat_tls_probe_explain: a sentence for a moat_tls_probe result, naming
 * the server name asked for; NULL when the probe says nothing about TLS
 * (0, refused, timeout). Heap, caller frees. */
char *moat_tls_probe_explain(int nrv, const char *url,
    const char *server_name);

/* moat_tls_listener_apply: for a listener made with nng_listener_create
 * on `url` and not started: the address rules (moat_tls_check_url), TLS
 * on tls+tcp://, mode 0600 on ipc://. */
int moat_tls_listener_apply(nng_listener l, const char *url,
    const struct moat_tls *t, enum moat_tls_peer peer, const char *what,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_tls_dialer_apply: for a dialer made with nng_dialer_create on
 * `url` and not started: the address rules and TLS on tls+tcp:// with
 * `server_name` (NULL: the url's host). */
int moat_tls_dialer_apply(nng_dialer d, const char *url,
    const struct moat_tls *t, const char *server_name, const char *what,
    char **errmsg) __attribute__((warn_unused_result));

/* The TLS flags of a service's option table (getopt_long; their values
 * are above any character), and their lines of --help. */
#define MOAT_TLS_OPTIONS                                                      \
	{ "tls-cert", required_argument, NULL, 0x7401 },                      \
	    { "tls-key", required_argument, NULL, 0x7402 },                   \
	    { "tls-ca", required_argument, NULL, 0x7403 },                    \
	    { "tls-peer-ca", required_argument, NULL, 0x7404 },               \
	{                                                                     \
		"insecure", optional_argument, NULL, 0x7405                   \
	}
#define MOAT_TLS_USAGE                                                        \
	"  --tls-cert FILE      own certificate (PEM: leaf, then its "        \
	"intermediate)\n"                                                     \
	"  --tls-key FILE       own private key (PEM)\n"                      \
	"  --tls-ca FILE        CAs trusted for the servers it dials\n"       \
	"  --tls-peer-ca FILE   CAs trusted for its callers (default: "       \
	"tls-ca)\n"                                                           \
	"  --insecure[=BOOL]    allow plain tcp:// off loopback (warns)\n"

#endif
