/*
 * tls.c: moat/tls.h. The PEM files of a program are read once into
 * memory and checked by building a throwaway nng config from them; each
 * listener or dial then gets its own nng_tls_config built from that
 * memory (a dial's config carries its server name, so configs are not
 * shared between dials). Also the address rules every service and client
 * applies before it listens or dials, and a one-shot probe that tells
 * why a TLS dial does not come up.
 * Not for: the RPC layer's sockets (rpc_server.c, rpc_client.c use this)
 * or HTTPS (gateway/http.c).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "moat/config.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/tls.h"
#include "moat/util.h"

#define TLS_PEM_MAX (1u << 20) /* a PEM file larger than this is wrong */

struct moat_tls {
	char *cert_pem, *key_pem, *ca_pem, *peer_ca_pem;
	char *cert_path, *key_path, *ca_path, *peer_ca_path;
	char *peer_ca_setting; /* "tls-peer-ca" unless overridden */
	char *section;         /* NULL for a client */
	bool insecure;
};

/* setting_name: how a setting is named to the person who sets it. */
static char *
setting_name(const char *section, const char *key)
{
	char env[96];
	size_t i, n = 0;

	if (section == NULL) {
		n = (size_t)snprintf(env, sizeof(env), "MOAT_");
		for (i = 0; key[i] != '\0' && n + 1 < sizeof(env); i++)
			env[n++] = key[i] == '-' ?
			    '_' :
			    (char)toupper((unsigned char)key[i]);
		env[n] = '\0';
		return moat_asprintf("--%s or %s", key, env);
	}
	n = (size_t)snprintf(env, sizeof(env), "MOAT_");
	for (i = 0; section[i] != '\0' && n + 2 < sizeof(env); i++)
		env[n++] = (char)toupper((unsigned char)section[i]);
	env[n++] = '_';
	for (i = 0; key[i] != '\0' && n + 1 < sizeof(env); i++)
		env[n++] =
		    key[i] == '-' ? '_' : (char)toupper((unsigned char)key[i]);
	env[n] = '\0';
	return moat_asprintf("[%s] %s (--%s, %s)", section, key, key, env);
}

/* read_pem: the whole file, NUL-terminated, as nng's PEM calls want. */
static int
read_pem(const char *section, const char *key, const char *path, char **out,
    char **errmsg)
{
	char *name, *buf = NULL;
	size_t n = 0;
	FILE *f;
	int err;

	*out = NULL;
	if ((f = fopen(path, "r")) == NULL) {
		err = errno;
		goto fail;
	}
	if ((buf = malloc(TLS_PEM_MAX + 1)) == NULL) {
		fclose(f);
		err = ENOMEM;
		goto fail;
	}
	n = fread(buf, 1, TLS_PEM_MAX + 1, f);
	err = ferror(f) ? EIO : 0;
	fclose(f);
	if (err == 0 && n > TLS_PEM_MAX)
		err = EFBIG;
	if (err == 0 && (n == 0 || strstr(buf, "-----BEGIN") == NULL))
		err = EINVAL;
	if (err != 0)
		goto fail;
	buf[n] = '\0';
	*out = buf;
	return MOAT_OK;
fail:
	free(buf);
	name = setting_name(section, key);
	*errmsg = moat_asprintf("cannot use %s %s: %s: give a readable PEM "
	                        "file",
	    name ? name : key, path,
	    err == EINVAL    ? "not a PEM file" :
	        err == EFBIG ? "larger than 1 MiB" :
	                       strerror(err));
	free(name);
	return err == ENOENT ? MOAT_NOT_FOUND : MOAT_INVALID_ARGUMENT;
}

static bool
set(const char *s)
{
	return s != NULL && s[0] != '\0';
}

void
moat_tls_free(struct moat_tls *t)
{
	if (t == NULL)
		return;
	free(t->cert_pem);
	if (t->key_pem != NULL) {
		explicit_bzero(t->key_pem, strlen(t->key_pem));
		free(t->key_pem);
	}
	free(t->ca_pem);
	free(t->peer_ca_pem);
	free(t->cert_path);
	free(t->key_path);
	free(t->ca_path);
	free(t->peer_ca_path);
	free(t->peer_ca_setting);
	free(t->section);
	free(t);
}

static char *
dup_or_null(const char *s)
{
	return set(s) ? strdup(s) : NULL;
}

/* pair_check: the key is the certificate's and the certificate is in
 * date (mbedtls takes a mismatched pair, and every handshake would fail
 * later with nothing said). NULL when fine, else the problem. */
static const char *
pair_check(const char *cert_pem, const char *key_pem)
{
	BIO *cb = BIO_new_mem_buf(cert_pem, -1);
	BIO *kb = BIO_new_mem_buf(key_pem, -1);
	X509 *x = cb != NULL ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
	EVP_PKEY *k =
	    kb != NULL ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
	const char *why = NULL;

	if (x == NULL)
		why = "tls-cert holds no PEM certificate";
	else if (k == NULL)
		why = "tls-key holds no PEM private key (or one with a "
		      "passphrase)";
	else if (X509_check_private_key(x, k) != 1)
		why = "tls-key is not the key of tls-cert's first "
		      "certificate";
	else if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0)
		why = "tls-cert has expired: renew it (deploy/moat-pki "
		      "renew)";
	else if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0)
		why = "tls-cert is not valid yet: check this host's clock";
	X509_free(x);
	EVP_PKEY_free(k);
	BIO_free(cb);
	BIO_free(kb);
	return why;
}

/* tls_verify: builds throwaway configs so a bad PEM is said at start,
 * naming the setting, not at the first handshake. */
static int
tls_verify(const struct moat_tls *t, char **errmsg)
{
	nng_tls_config *cfg = NULL;
	const char *why;
	char *name = NULL;
	int nrv = 0;

	if (t->cert_pem != NULL) {
		if ((nrv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER)) !=
		    0)
			goto fail;
		nrv = nng_tls_config_own_cert(cfg, t->cert_pem, t->key_pem,
		    NULL);
		nng_tls_config_free(cfg);
		if (nrv == 0 &&
		    (why = pair_check(t->cert_pem, t->key_pem)) != NULL) {
			name = setting_name(t->section, "tls-cert");
			*errmsg = moat_asprintf("%s %s with tls-key %s: %s",
			    name ? name : "tls-cert", t->cert_path,
			    t->key_path, why);
			free(name);
			return MOAT_INVALID_ARGUMENT;
		}
		if (nrv != 0) {
			name = setting_name(t->section, "tls-cert");
			*errmsg = moat_asprintf(
			    "%s %s with tls-key %s: %s: "
			    "give the PEM certificate (leaf, then its "
			    "intermediate) and its matching private key",
			    name ? name : "tls-cert", t->cert_path,
			    t->key_path, nng_strerror(nrv));
			free(name);
			return MOAT_INVALID_ARGUMENT;
		}
	}
	for (int i = 0; i < 2; i++) {
		const char *pem = i == 0 ? t->ca_pem : t->peer_ca_pem;

		if (pem == NULL)
			continue;
		if ((nrv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) !=
		    0)
			goto fail;
		nrv = nng_tls_config_ca_chain(cfg, pem, NULL);
		nng_tls_config_free(cfg);
		if (nrv != 0) {
			name = setting_name(t->section,
			    i == 0 ? "tls-ca" : t->peer_ca_setting);
			*errmsg = moat_asprintf("%s %s: %s: give PEM CA "
			                        "certificates",
			    name ? name : "tls-ca",
			    i == 0 ? t->ca_path : t->peer_ca_path,
			    nng_strerror(nrv));
			free(name);
			return MOAT_INVALID_ARGUMENT;
		}
	}
	return MOAT_OK;
fail:
	*errmsg = moat_asprintf("TLS is not available in this nng: %s: "
	                        "install an nng built with mbedtls",
	    nng_strerror(nrv));
	return MOAT_UNIMPLEMENTED;
}

int
moat_tls_load(struct moat_tls **out, const struct moat_tls_files *files,
    char **errmsg)
{
	struct moat_tls *t;
	const char *sec = files->section;
	char *a, *b;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if (set(files->cert) != set(files->key)) {
		a = setting_name(sec, "tls-cert");
		b = setting_name(sec, "tls-key");
		*errmsg = moat_asprintf("%s and %s go together: give both "
		                        "(certificate and its key) or neither",
		    a ? a : "tls-cert", b ? b : "tls-key");
		free(a);
		free(b);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((t = calloc(1, sizeof(*t))) == NULL)
		goto nomem;
	t->insecure = files->insecure;
	t->cert_path = dup_or_null(files->cert);
	t->key_path = dup_or_null(files->key);
	t->ca_path = dup_or_null(files->ca);
	t->peer_ca_path =
	    dup_or_null(set(files->peer_ca) ? files->peer_ca : files->ca);
	t->peer_ca_setting =
	    strdup(set(files->peer_ca) ? "tls-peer-ca" : "tls-ca");
	if (t->peer_ca_setting == NULL ||
	    (sec != NULL && (t->section = strdup(sec)) == NULL))
		goto nomem;
	if ((t->cert_path != NULL &&
	        ((rv = read_pem(sec, "tls-cert", t->cert_path, &t->cert_pem,
	              errmsg)) != MOAT_OK ||
	            (rv = read_pem(sec, "tls-key", t->key_path, &t->key_pem,
	                 errmsg)) != MOAT_OK)) ||
	    (t->ca_path != NULL &&
	        (rv = read_pem(sec, "tls-ca", t->ca_path, &t->ca_pem,
	             errmsg)) != MOAT_OK) ||
	    (t->peer_ca_path != NULL &&
	        (rv = read_pem(sec, t->peer_ca_setting, t->peer_ca_path,
	             &t->peer_ca_pem, errmsg)) != MOAT_OK) ||
	    (rv = tls_verify(t, errmsg)) != MOAT_OK) {
		moat_tls_free(t);
		return rv;
	}
	*out = t;
	return MOAT_OK;
nomem:
	moat_tls_free(t);
	*errmsg = moat_asprintf("out of memory loading the TLS settings");
	return MOAT_RESOURCE_EXHAUSTED;
}

int
moat_tls_from_config(const struct moat_config *cfg, const char *section,
    struct moat_tls **out, char **errmsg)
{
	struct moat_tls_files f = { 0 };
	int rv;

	*out = NULL;
	*errmsg = NULL;
	f.section = section;
	f.cert = moat_config_get(cfg, section, "tls-cert", NULL);
	f.key = moat_config_get(cfg, section, "tls-key", NULL);
	f.ca = moat_config_get(cfg, section, "tls-ca", NULL);
	f.peer_ca = moat_config_get(cfg, section, "tls-peer-ca", NULL);
	if ((rv = moat_config_get_bool(cfg, section, "insecure", false,
	         &f.insecure, errmsg)) != MOAT_OK)
		return rv;
	return moat_tls_load(out, &f, errmsg);
}

int
moat_tls_with_peer_ca(const struct moat_tls *t, const char *peer_ca_path,
    const char *setting, struct moat_tls **out, char **errmsg)
{
	struct moat_tls_files f = { 0 };

	*out = NULL;
	*errmsg = NULL;
	if (t == NULL) {
		f.peer_ca = peer_ca_path;
		return moat_tls_load(out, &f, errmsg);
	}
	f.cert = t->cert_path;
	f.key = t->key_path;
	f.ca = t->ca_path;
	f.peer_ca = set(peer_ca_path) ? peer_ca_path : t->peer_ca_path;
	f.insecure = t->insecure;
	f.section = t->section;
	if (moat_tls_load(out, &f, errmsg) != MOAT_OK)
		return MOAT_INVALID_ARGUMENT;
	if (set(peer_ca_path) && setting != NULL) {
		free((*out)->peer_ca_setting);
		if (((*out)->peer_ca_setting = strdup(setting)) == NULL) {
			moat_tls_free(*out);
			*out = NULL;
			*errmsg = moat_asprintf("out of memory");
			return MOAT_RESOURCE_EXHAUSTED;
		}
	}
	return MOAT_OK;
}

bool
moat_tls_enabled(const struct moat_tls *t)
{
	return t != NULL &&
	    (t->cert_pem != NULL || t->ca_pem != NULL ||
	        t->peer_ca_pem != NULL);
}

bool
moat_tls_has_ca(const struct moat_tls *t)
{
	return t != NULL && t->ca_pem != NULL;
}

bool
moat_tls_has_peer_ca(const struct moat_tls *t)
{
	return t != NULL && t->peer_ca_pem != NULL;
}

bool
moat_tls_insecure(const struct moat_tls *t)
{
	return t != NULL && t->insecure;
}

bool
moat_tls_url_is_tls(const char *url)
{
	return url != NULL &&
	    (strncmp(url, "tls+tcp://", 10) == 0 ||
	        strncmp(url, "tls+tcp4://", 11) == 0 ||
	        strncmp(url, "tls+tcp6://", 11) == 0);
}

static bool
url_is_plain_tcp(const char *url)
{
	return strncmp(url, "tcp://", 6) == 0 ||
	    strncmp(url, "tcp4://", 7) == 0 || strncmp(url, "tcp6://", 7) == 0;
}

bool
moat_tls_url_host(const char *url, char *buf, size_t len)
{
	const char *p = strstr(url, "://"), *end;
	size_t n;

	if (p == NULL || len == 0)
		return false;
	p += 3;
	if (*p == '[') {
		if ((end = strchr(++p, ']')) == NULL)
			return false;
	} else if ((end = strrchr(p, ':')) == NULL) {
		end = p + strlen(p);
	}
	if ((n = (size_t)(end - p)) == 0 || n >= len)
		return false;
	memcpy(buf, p, n);
	buf[n] = '\0';
	return true;
}

bool
moat_tls_url_is_loopback(const char *url)
{
	struct in6_addr a6;
	struct in_addr a4;
	char host[256];

	if (!moat_tls_url_host(url, host, sizeof(host)))
		return false;
	if (strcasecmp(host, "localhost") == 0)
		return true;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6);
	return false;
}

/* check_tls_url: tls+tcp's settings for a listener or a dial. */
static int
check_tls_url(const struct moat_tls *t, const char *url, bool listen,
    enum moat_tls_peer peer, const char *what, char **errmsg)
{
	const char *sec = t != NULL ? t->section : NULL;
	const char *missing = NULL;
	char *name;

	if (listen && (t == NULL || t->cert_pem == NULL))
		missing = "tls-cert";
	else if (listen && peer != MOAT_TLS_PEER_NONE &&
	    t->peer_ca_pem == NULL)
		missing = "tls-peer-ca";
	else if (!listen && (t == NULL || t->ca_pem == NULL))
		missing = "tls-ca";
	if (missing == NULL)
		return MOAT_OK;
	name = setting_name(sec, missing);
	*errmsg = moat_asprintf("%s on %s is tls+tcp:// but %s is not set: "
	                        "%s",
	    what, url, name ? name : missing,
	    listen ? "give tls-cert and tls-key (this service's "
	             "certificate) and tls-peer-ca or tls-ca (the CAs of its "
	             "callers)" :
	             "give tls-ca (the CAs of the servers it dials), and "
	             "tls-cert and tls-key when the server asks for a "
	             "certificate");
	free(name);
	return MOAT_FAILED_PRECONDITION;
}

int
moat_tls_check_url(const struct moat_tls *t, const char *url, bool listen,
    enum moat_tls_peer peer, const char *what, char **errmsg)
{
	char *name;

	*errmsg = NULL;
	if (url == NULL) {
		*errmsg = moat_asprintf("%s: no address given", what);
		return MOAT_INVALID_ARGUMENT;
	}
	if (moat_tls_url_is_tls(url))
		return check_tls_url(t, url, listen, peer, what, errmsg);
	if (!url_is_plain_tcp(url) || moat_tls_url_is_loopback(url))
		return MOAT_OK;
	if (moat_tls_insecure(t)) {
		moat_warn(0,
		    "%s on %s is plain tcp off loopback (insecure = "
		    "true): anyone on the network can read and forge its "
		    "traffic; use tls+tcp:// with tls-cert, tls-key and "
		    "tls-ca",
		    what, url);
		return MOAT_OK;
	}
	if (t != NULL && t->section != NULL)
		name = setting_name(t->section, "insecure");
	else
		name = strdup("pass --insecure (MOAT_INSECURE=1)");
	*errmsg = moat_asprintf(
	    "%s on %s refused: plain tcp:// off loopback "
	    "is not encrypted nor authenticated: use tls+tcp://%s with "
	    "tls-cert, tls-key and tls-ca, or %s%s%s to allow it",
	    what, url, strstr(url, "://") + 3,
	    t != NULL && t->section != NULL ? "set " : "",
	    name ? name : "insecure",
	    t != NULL && t->section != NULL ? " = true" : "");
	free(name);
	return MOAT_INVALID_ARGUMENT;
}

static int
config_fail(int nrv, const char *what, char **errmsg)
{
	*errmsg = moat_asprintf("cannot set up TLS for %s: %s", what,
	    nng_strerror(nrv));
	return moat_status_from_nng(nrv);
}

int
moat_tls_server_config(const struct moat_tls *t, enum moat_tls_peer peer,
    struct nng_tls_config **out, char **errmsg)
{
	nng_tls_config *cfg = NULL;
	int nrv;

	*out = NULL;
	if ((nrv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER)) != 0)
		return config_fail(nrv, "a listener", errmsg);
	if (t->cert_pem != NULL &&
	    (nrv = nng_tls_config_own_cert(cfg, t->cert_pem, t->key_pem,
	         NULL)) != 0)
		goto fail;
	if (peer != MOAT_TLS_PEER_NONE && t->peer_ca_pem != NULL &&
	    (nrv = nng_tls_config_ca_chain(cfg, t->peer_ca_pem, NULL)) != 0)
		goto fail;
	if ((nrv = nng_tls_config_auth_mode(cfg,
	         peer == MOAT_TLS_PEER_REQUIRED ? NNG_TLS_AUTH_MODE_REQUIRED :
	             peer == MOAT_TLS_PEER_OPTIONAL ?
	                                          NNG_TLS_AUTH_MODE_OPTIONAL :
	                                          NNG_TLS_AUTH_MODE_NONE)) !=
	    0)
		goto fail;
	*out = cfg;
	return MOAT_OK;
fail:
	nng_tls_config_free(cfg);
	return config_fail(nrv, "a listener", errmsg);
}

int
moat_tls_client_config(const struct moat_tls *t, const char *url,
    const char *server_name, struct nng_tls_config **out, char **errmsg)
{
	nng_tls_config *cfg = NULL;
	char host[256];
	int nrv;

	*out = NULL;
	if (!set(server_name)) {
		if (!moat_tls_url_host(url, host, sizeof(host))) {
			*errmsg =
			    moat_asprintf("%s has no host to check the "
			                  "server's certificate against: "
			                  "give a TLS server name",
			        url);
			return MOAT_INVALID_ARGUMENT;
		}
		server_name = host;
	}
	if ((nrv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0)
		return config_fail(nrv, url, errmsg);
	if ((nrv = nng_tls_config_server_name(cfg, server_name)) != 0 ||
	    (t->ca_pem != NULL &&
	        (nrv = nng_tls_config_ca_chain(cfg, t->ca_pem, NULL)) != 0) ||
	    (t->cert_pem != NULL &&
	        (nrv = nng_tls_config_own_cert(cfg, t->cert_pem, t->key_pem,
	             NULL)) != 0) ||
	    (nrv = nng_tls_config_auth_mode(cfg,
	         NNG_TLS_AUTH_MODE_REQUIRED)) != 0) {
		nng_tls_config_free(cfg);
		return config_fail(nrv, url, errmsg);
	}
	*out = cfg;
	return MOAT_OK;
}

/* The SP header a REQ socket sends first: it makes the TLS handshake
 * run (nng's TLS streams shake hands on their first I/O). */
static const uint8_t probe_hello[8] = { 0, 'S', 'P', 0, 0, 0x30, 0, 0 };

static int
probe_io(nng_stream *s, nng_aio *aio, bool send, uint32_t timeout_ms)
{
	uint8_t buf[8];
	nng_iov iov;

	memcpy(buf, probe_hello, sizeof(buf));
	iov.iov_buf = buf;
	iov.iov_len = sizeof(buf);
	nng_aio_set_iov(aio, 1, &iov);
	nng_aio_set_timeout(aio, (nng_duration)timeout_ms);
	if (send)
		nng_stream_send(s, aio);
	else
		nng_stream_recv(s, aio);
	nng_aio_wait(aio);
	return nng_aio_result(aio);
}

int
moat_tls_probe(const char *url, struct nng_tls_config *cfg,
    uint32_t timeout_ms)
{
	nng_stream_dialer *d = NULL;
	nng_stream *s = NULL;
	nng_aio *aio = NULL;
	int nrv;

	if ((nrv = nng_stream_dialer_alloc(&d, url)) != 0 ||
	    (nrv = nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg)) !=
	        0 ||
	    (nrv = nng_aio_alloc(&aio, NULL, NULL)) != 0)
		goto out;
	nng_aio_set_timeout(aio, (nng_duration)timeout_ms);
	nng_stream_dialer_dial(d, aio);
	nng_aio_wait(aio);
	if ((nrv = nng_aio_result(aio)) != 0)
		goto out;
	s = nng_aio_get_output(aio, 0);
	if ((nrv = probe_io(s, aio, true, timeout_ms)) == 0)
		nrv = probe_io(s, aio, false, timeout_ms);
out:
	if (s != NULL) {
		nng_stream_close(s);
		nng_stream_free(s);
	}
	if (aio != NULL)
		nng_aio_free(aio);
	if (d != NULL) {
		nng_stream_dialer_close(d);
		nng_stream_dialer_free(d);
	}
	return nrv;
}

char *
moat_tls_probe_explain(int nrv, const char *url, const char *server_name)
{
	char host[256];

	if (!set(server_name) && moat_tls_url_host(url, host, sizeof(host)))
		server_name = host;
	switch (nrv) {
	case NNG_ECRYPTO:
	case NNG_EPEERAUTH:
		return moat_asprintf(
		    "the TLS handshake with %s failed (%s): "
		    "its certificate is not trusted by tls-ca, has expired "
		    "or does not name \"%s\", or it does not trust our "
		    "tls-cert",
		    url, nng_strerror(nrv), server_name ? server_name : "?");
	case NNG_ECONNSHUT:
	case NNG_ECONNRESET:
	case NNG_ECLOSED:
		return moat_asprintf(
		    "%s closed the connection during the TLS "
		    "handshake: it may not trust our certificate (tls-cert) "
		    "or want one, or it does not speak TLS",
		    url);
	default:
		return NULL;
	}
}

int
moat_tls_listener_apply(nng_listener l, const char *url,
    const struct moat_tls *t, enum moat_tls_peer peer, const char *what,
    char **errmsg)
{
	nng_tls_config *cfg = NULL;
	int rv, nrv = 0;

	*errmsg = NULL;
	if ((rv = moat_tls_check_url(t, url, true, peer, what, errmsg)) !=
	    MOAT_OK)
		return rv;
	if (strncmp(url, "ipc://", 6) == 0)
		nrv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0600);
	if (nrv == 0 && moat_tls_url_is_tls(url)) {
		if ((rv = moat_tls_server_config(t, peer, &cfg, errmsg)) !=
		    MOAT_OK)
			return rv;
		nrv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg);
		nng_tls_config_free(cfg);
	}
	if (nrv != 0)
		return config_fail(nrv, url, errmsg);
	return MOAT_OK;
}

int
moat_tls_dialer_apply(nng_dialer d, const char *url, const struct moat_tls *t,
    const char *server_name, const char *what, char **errmsg)
{
	nng_tls_config *cfg = NULL;
	int rv, nrv;

	*errmsg = NULL;
	if ((rv = moat_tls_check_url(t, url, false, MOAT_TLS_PEER_NONE, what,
	         errmsg)) != MOAT_OK)
		return rv;
	if (!moat_tls_url_is_tls(url))
		return MOAT_OK;
	if ((rv = moat_tls_client_config(t, url, server_name, &cfg, errmsg)) !=
	    MOAT_OK)
		return rv;
	nrv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
	nng_tls_config_free(cfg);
	return nrv != 0 ? config_fail(nrv, url, errmsg) : MOAT_OK;
}
