/*
 * egress_policy.c: the allowlist, egress-hosts, request-head parser and
 * address check of guest egress (egress_policy.h). Pure: no sockets.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "moat/status.h"
#include "moat/util.h"
#include "egress_policy.h"

/* A DNS name: labels of letters, digits and '-', dots between. */
static bool
valid_name(const char *h)
{
	size_t len = strlen(h), label = 0;

	if (len == 0 || len > VMD_EGRESS_HOST_MAX || h[0] == '.' ||
	    h[len - 1] == '.' || h[len - 1] == '-')
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)h[i];

		if (c == '.') {
			if (label == 0 || h[i - 1] == '-')
				return false;
			label = 0;
			continue;
		}
		/* A label starts with a letter or digit (or '_': _dmarc),
		 * and holds those and '-'. */
		if (!isalnum(c) && c != '_' && (c != '-' || label == 0))
			return false;
		if (++label > 63)
			return false;
	}
	return true;
}

static void
lower(char *s)
{
	for (; *s; s++)
		*s = (char)tolower((unsigned char)*s);
}

bool
vmd_egress_is_ip_literal(const char *host)
{
	unsigned char buf[sizeof(struct in6_addr)];
	char tmp[VMD_EGRESS_HOST_MAX + 1];
	size_t len = strlen(host);
	bool digits = len > 0;

	if (len > VMD_EGRESS_HOST_MAX)
		return false;
	if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
		memcpy(tmp, host + 1, len - 2);
		tmp[len - 2] = '\0';
		host = tmp;
	}
	if (inet_pton(AF_INET, host, buf) == 1 ||
	    inet_pton(AF_INET6, host, buf) == 1)
		return true;
	/* "2130706433", "0x7f.1", "127.1", "0177.1": inet_aton reads these
	 * (each part decimal, octal or 0x hex; at most four). */
	{
		int parts = 0;

		for (const char *p = host; digits && *p != '\0';) {
			const char *q = p;

			if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
				q = p + 2;
				while (isxdigit((unsigned char)*q))
					q++;
			} else {
				while (isdigit((unsigned char)*q))
					q++;
			}
			digits =
			    q > p && (*q == '.' || *q == '\0') && ++parts <= 4;
			p = *q == '.' ? q + 1 : q;
		}
	}
	return digits;
}

/* parse_port: "1".."65535" into *port. */
static bool
parse_port(const char *s, uint16_t *port)
{
	char *end;
	unsigned long v;

	if (!isdigit((unsigned char)s[0]))
		return false;
	v = strtoul(s, &end, 10);
	if (*end != '\0' || v == 0 || v > 65535)
		return false;
	*port = (uint16_t)v;
	return true;
}

static int
rule_parse(const char *entry, struct vmd_egress_rule *r, char **errmsg)
{
	const char *colon = strrchr(entry, ':');
	size_t hlen = colon ? (size_t)(colon - entry) : strlen(entry);
	const char *name;

	memset(r, 0, sizeof(*r));
	if (hlen == 0 || hlen > VMD_EGRESS_HOST_MAX)
		goto bad;
	memcpy(r->host, entry, hlen);
	lower(r->host);
	if (colon != NULL && !parse_port(colon + 1, &r->port))
		goto bad;
	name = strncmp(r->host, "*.", 2) == 0 ? r->host + 2 : r->host;
	if (vmd_egress_is_ip_literal(name) || strchr(entry, '[')) {
		*errmsg = moat_asprintf("allow entry \"%s\": IP addresses are "
		                        "never allowed; name a host",
		    entry);
		return MOAT_INVALID_ARGUMENT;
	}
	if (!valid_name(name))
		goto bad;
	return MOAT_OK;
bad:
	*errmsg = moat_asprintf("allow entry \"%s\" is not HOST or HOST:PORT "
	                        "(a DNS name, optionally \"*.\" before it, "
	                        "port 1-65535)",
	    entry);
	return MOAT_INVALID_ARGUMENT;
}

int
vmd_egress_policy_parse(const char *const *allow, size_t n,
    struct vmd_egress_policy *out, char **errmsg)
{
	int rv;

	*errmsg = NULL;
	memset(out, 0, sizeof(*out));
	if (n > VMD_EGRESS_MAX_ALLOW) {
		*errmsg = moat_asprintf("%zu allow entries: at most %d", n,
		    VMD_EGRESS_MAX_ALLOW);
		return MOAT_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < n; i++) {
		if (allow[i] == NULL) {
			*errmsg = moat_asprintf("allow entry %zu is empty", i);
			return MOAT_INVALID_ARGUMENT;
		}
		if ((rv = rule_parse(allow[i], &out->rule[i], errmsg)) !=
		    MOAT_OK)
			return rv;
		out->n++;
	}
	return MOAT_OK;
}

static bool
name_matches(const char *rule, const char *host)
{
	size_t rl, hl;

	if (strncmp(rule, "*.", 2) != 0)
		return strcasecmp(rule, host) == 0;
	rule += 1; /* ".name": host must end with it, with a label before */
	rl = strlen(rule);
	hl = strlen(host);
	return hl > rl && strcasecmp(host + hl - rl, rule) == 0;
}

bool
vmd_egress_name_allowed(const struct vmd_egress_policy *p, const char *host,
    uint16_t port, const char **why)
{
	bool name_seen = false;

	if (vmd_egress_is_ip_literal(host)) {
		*why = "IP literal (name a host on the allowlist)";
		return false;
	}
	if (!valid_name(host)) {
		*why = "not a host name";
		return false;
	}
	for (size_t i = 0; i < p->n; i++) {
		const struct vmd_egress_rule *r = &p->rule[i];

		if (!name_matches(r->host, host))
			continue;
		name_seen = true;
		if (r->port == port ||
		    (r->port == 0 && (port == 80 || port == 443)))
			return true;
	}
	*why = name_seen ? "port not on the allowlist" :
	                   "host not on the allowlist";
	return false;
}

static bool
v4_refused(uint32_t a, const char **why)
{
	static const struct {
		uint32_t net, mask;
		const char *why;
	} nets[] = {
		{ 0xA9FEA9FE, 0xFFFFFFFF, "metadata address" },
		{ 0x00000000, 0xFF000000, "unspecified address" },
		{ 0x7F000000, 0xFF000000, "loopback address" },
		{ 0xA9FE0000, 0xFFFF0000, "link-local address" },
		{ 0x0A000000, 0xFF000000, "private address" },
		{ 0xAC100000, 0xFFF00000, "private address" },
		{ 0xC0A80000, 0xFFFF0000, "private address" },
		{ 0x64400000, 0xFFC00000, "shared (CGNAT) address" },
		{ 0xC0000000, 0xFFFFFF00, "reserved address" },
		{ 0xC6120000, 0xFFFE0000, "benchmark address" },
		{ 0xE0000000, 0xF0000000, "multicast address" },
		{ 0xF0000000, 0xF0000000, "reserved address" },
	};

	for (size_t i = 0; i < sizeof(nets) / sizeof(nets[0]); i++)
		if ((a & nets[i].mask) == nets[i].net) {
			*why = nets[i].why;
			return true;
		}
	return false;
}

static bool
v6_refused(const struct in6_addr *a, const char **why)
{
	static const uint8_t metadata[16] = { 0xfd, 0x00, 0x0e, 0xc2, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 0x02, 0x54 };
	const uint8_t *b = a->s6_addr;

	if (memcmp(b, metadata, 16) == 0)
		*why = "metadata address";
	else if (IN6_IS_ADDR_UNSPECIFIED(a))
		*why = "unspecified address";
	else if (IN6_IS_ADDR_LOOPBACK(a))
		*why = "loopback address";
	else if (IN6_IS_ADDR_LINKLOCAL(a) || IN6_IS_ADDR_SITELOCAL(a))
		*why = "link-local address";
	else if ((b[0] & 0xfe) == 0xfc)
		*why = "private address";
	else if (IN6_IS_ADDR_MULTICAST(a))
		*why = "multicast address";
	else if (IN6_IS_ADDR_V4MAPPED(a) || IN6_IS_ADDR_V4COMPAT(a)) {
		uint32_t v4;

		memcpy(&v4, b + 12, 4);
		return v4_refused(ntohl(v4), why) ||
		    ((*why = "IPv4-compatible address"),
		        IN6_IS_ADDR_V4COMPAT(a));
	} else if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d &&
	    b[3] == 0xb8)
		*why = "documentation address";
	else if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b)
		*why = "NAT64 address";
	else
		return false;
	return true;
}

static bool
same_addr(const struct sockaddr *sa, const struct sockaddr_storage *h)
{
	if (sa->sa_family != h->ss_family)
		return false;
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr ==
		    ((const struct sockaddr_in *)h)->sin_addr.s_addr;
	return memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr,
	           &((const struct sockaddr_in6 *)h)->sin6_addr,
	           sizeof(struct in6_addr)) == 0;
}

bool
vmd_egress_addr_allowed(const struct sockaddr *sa,
    const struct sockaddr_storage *host_addrs, size_t n_host, const char **why)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		if (v4_refused(ntohl(in->sin_addr.s_addr), why))
			return false;
	} else if (sa->sa_family == AF_INET6) {
		if (v6_refused(&((const struct sockaddr_in6 *)sa)->sin6_addr,
		        why))
			return false;
	} else {
		*why = "not an IP address";
		return false;
	}
	for (size_t i = 0; i < n_host; i++)
		if (same_addr(sa, &host_addrs[i])) {
			*why = "the host's own address";
			return false;
		}
	return true;
}

/* ---- egress-hosts ---- */

/* parse_hostport_addr: "1.2.3.4", "1.2.3.4:80", "[::1]", "[::1]:80". */
static bool
parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
	char tmp[80];
	const char *port = NULL;
	uint16_t p = 0;

	memset(ss, 0, sizeof(*ss));
	if (strlen(s) >= sizeof(tmp))
		return false;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');

		if (close == NULL)
			return false;
		memcpy(tmp, s + 1, (size_t)(close - s - 1));
		tmp[close - s - 1] = '\0';
		if (close[1] == ':')
			port = close + 2;
		else if (close[1] != '\0')
			return false;
	} else {
		const char *colon = strchr(s, ':');

		snprintf(tmp, sizeof(tmp), "%s", s);
		if (colon != NULL) {
			tmp[colon - s] = '\0';
			port = colon + 1;
		}
	}
	if (port != NULL && !parse_port(port, &p))
		return false;
	if (inet_pton(AF_INET, tmp, &((struct sockaddr_in *)ss)->sin_addr) ==
	    1) {
		ss->ss_family = AF_INET;
		((struct sockaddr_in *)ss)->sin_port = htons(p);
		*len = sizeof(struct sockaddr_in);
		return true;
	}
	if (inet_pton(AF_INET6, tmp,
	        &((struct sockaddr_in6 *)ss)->sin6_addr) == 1) {
		ss->ss_family = AF_INET6;
		((struct sockaddr_in6 *)ss)->sin6_port = htons(p);
		*len = sizeof(struct sockaddr_in6);
		return true;
	}
	return false;
}

static int
hosts_line(struct vmd_egress_hosts *h, char *line, size_t lineno,
    char **errmsg)
{
	char *save = NULL, *name, *addr, *extra;
	struct vmd_egress_host_entry *e, *grown;

	if ((name = strchr(line, '#')) != NULL)
		*name = '\0';
	name = strtok_r(line, " \t\r", &save);
	if (name == NULL)
		return MOAT_OK;
	addr = strtok_r(NULL, " \t\r", &save);
	extra = addr ? strtok_r(NULL, " \t\r", &save) : NULL;
	grown = realloc(h->entry, (h->n + 1) * sizeof(*h->entry));
	if (grown == NULL) {
		*errmsg = moat_asprintf("egress-hosts: out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	h->entry = grown;
	e = &h->entry[h->n];
	memset(e, 0, sizeof(*e));
	if (addr == NULL || extra != NULL || !valid_name(name) ||
	    !parse_addr(addr, &e->addr, &e->addr_len)) {
		*errmsg = moat_asprintf("egress-hosts line %zu: want \"NAME "
		                        "ADDRESS[:PORT]\" (e.g. \"pypi.test "
		                        "127.0.0.1:8080\")",
		    lineno);
		return MOAT_INVALID_ARGUMENT;
	}
	snprintf(e->name, sizeof(e->name), "%s", name);
	lower(e->name);
	h->n++;
	return MOAT_OK;
}

int
vmd_egress_hosts_parse(const char *text, struct vmd_egress_hosts *out,
    char **errmsg)
{
	char *copy = strdup(text), *line, *save = NULL;
	size_t lineno = 0;
	int rv = MOAT_OK;

	*errmsg = NULL;
	memset(out, 0, sizeof(*out));
	if (copy == NULL) {
		*errmsg = moat_asprintf("egress-hosts: out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	/* strtok_r skips empty lines: count them by hand. */
	for (line = copy; line != NULL && rv == MOAT_OK;) {
		char *nl = strchr(line, '\n');

		if (nl != NULL)
			*nl = '\0';
		lineno++;
		rv = hosts_line(out, line, lineno, errmsg);
		line = nl ? nl + 1 : NULL;
	}
	(void)save;
	free(copy);
	if (rv != MOAT_OK)
		vmd_egress_hosts_free(out);
	return rv;
}

void
vmd_egress_hosts_free(struct vmd_egress_hosts *h)
{
	free(h->entry);
	h->entry = NULL;
	h->n = 0;
}

const struct vmd_egress_host_entry *
vmd_egress_hosts_find(const struct vmd_egress_hosts *h, const char *name)
{
	for (size_t i = 0; h != NULL && i < h->n; i++)
		if (strcasecmp(h->entry[i].name, name) == 0)
			return &h->entry[i];
	return NULL;
}

/* ---- the request head ---- */

/* authority: "host", "host:port", "[v6]", "[v6]:port" into t. */
static bool
parse_authority(const char *s, size_t len, uint16_t def_port,
    struct vmd_egress_target *t)
{
	char tmp[VMD_EGRESS_HOST_MAX + 8];
	const char *hs = s, *ps = NULL;
	size_t hl = len;

	if (len == 0 || len >= sizeof(tmp))
		return false;
	if (s[0] == '[') {
		const char *close = memchr(s, ']', len);

		if (close == NULL)
			return false;
		hs = s + 1;
		hl = (size_t)(close - hs);
		if ((size_t)(close + 1 - s) < len) {
			if (close[1] != ':')
				return false;
			ps = close + 2;
		}
	} else {
		const char *colon = memchr(s, ':', len);

		if (colon != NULL) {
			hl = (size_t)(colon - s);
			ps = colon + 1;
		}
	}
	if (hl == 0 || hl > VMD_EGRESS_HOST_MAX)
		return false;
	memcpy(t->host, hs, hl);
	t->host[hl] = '\0';
	lower(t->host);
	t->port = def_port;
	if (ps != NULL) {
		size_t pl = len - (size_t)(ps - s);

		if (pl == 0 || pl > 5)
			return false;
		memcpy(tmp, ps, pl);
		tmp[pl] = '\0';
		if (!parse_port(tmp, &t->port))
			return false;
	}
	return true;
}

/* The Host header, if any, must name the URI's host and port. */
static bool
host_header_ok(const char *head, size_t len, const struct vmd_egress_target *t)
{
	const char *p = memchr(head, '\n', len), *end = head + len;

	while (p != NULL && p + 1 < end) {
		const char *line = p + 1,
		           *eol = memchr(line, '\n', end - line);
		size_t ll;

		if (eol == NULL)
			break;
		ll = (size_t)(eol - line);
		if (ll > 0 && line[ll - 1] == '\r')
			ll--;
		if (ll > 5 && strncasecmp(line, "host:", 5) == 0) {
			struct vmd_egress_target h = { 0 };
			const char *v = line + 5;

			while (v < line + ll && (*v == ' ' || *v == '\t'))
				v++;
			if (!parse_authority(v, (size_t)(line + ll - v),
			        t->port, &h) ||
			    strcmp(h.host, t->host) != 0 || h.port != t->port)
				return false;
		}
		p = eol;
	}
	return true;
}

int
vmd_egress_head_parse(const char *buf, size_t len, struct vmd_egress_target *t,
    const char **why)
{
	const char *end, *sp1, *sp2, *uri, *eol;
	size_t ulen;

	memset(t, 0, sizeof(*t));
	end = memmem(buf, len, "\r\n\r\n", 4);
	if (end == NULL) {
		if (len >= VMD_EGRESS_HEAD_MAX) {
			*why = "request head too long";
			return -1;
		}
		return 0;
	}
	t->head_len = (size_t)(end - buf) + 4;
	eol = memchr(buf, '\n', t->head_len);
	t->line_len = (size_t)(eol - buf) + 1;
	sp1 = memchr(buf, ' ', t->line_len);
	sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
	if (sp1 == NULL || sp2 == NULL ||
	    strncmp(sp2 + 1, "HTTP/1.", 7) != 0) {
		*why = "not an HTTP/1 proxy request";
		return -1;
	}
	uri = sp1 + 1;
	ulen = (size_t)(sp2 - uri);
	if ((size_t)(sp1 - buf) == 7 && memcmp(buf, "CONNECT", 7) == 0) {
		t->connect = true;
		if (!parse_authority(uri, ulen, 0, t) || t->port == 0) {
			*why = "CONNECT wants HOST:PORT";
			return -1;
		}
		return 1;
	}
	if (ulen < 8 || strncasecmp(uri, "http://", 7) != 0) {
		*why = ulen >= 8 && strncasecmp(uri, "https://", 8) == 0 ?
		    "https:// through the proxy: use CONNECT (https_proxy)" :
		    "not an absolute http:// URI (set http_proxy)";
		return -1;
	}
	{
		const char *auth = uri + 7;
		const char *slash = memchr(auth, '/', (size_t)(sp2 - auth));
		const char *aend = slash ? slash : sp2;

		if (memchr(auth, '@', (size_t)(aend - auth)) != NULL ||
		    !parse_authority(auth, (size_t)(aend - auth), 80, t)) {
			*why = "bad host in the URI";
			return -1;
		}
		t->path_off = slash ? (size_t)(slash - buf) : 0;
		t->path_len = slash ? (size_t)(sp2 - slash) : 0;
	}
	if (!host_header_ok(buf, t->head_len, t)) {
		*why = "Host header names another host";
		return -1;
	}
	return 1;
}
