/*
 * egress_policy.h: the pure parts of guest egress (issue 14): a sandbox's
 * allowlist, the egress-hosts table, the proxy request head and the
 * address check. No sockets, no packets: unit-testable as is. Not for:
 * moving bytes (egress.c).
 */
#ifndef MOAT_VMD_EGRESS_POLICY_H
#define MOAT_VMD_EGRESS_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define VMD_EGRESS_MAX_ALLOW 64
#define VMD_EGRESS_HOST_MAX 253
#define VMD_EGRESS_HEAD_MAX 8192 /* a request head longer is refused */

struct vmd_egress_rule {
	char host[VMD_EGRESS_HOST_MAX + 1]; /* lower case; "*.x" any below x */
	uint16_t port;                      /* 0: 80 and 443 */
};

struct vmd_egress_policy {
	size_t n;
	struct vmd_egress_rule rule[VMD_EGRESS_MAX_ALLOW];
};

/* vmd_egress_policy_parse: `n` entries "host[:port]" (a name, or
 * "*.name" for every name below it; never an IP literal) into *out.
 * Errors (MOAT_INVALID_ARGUMENT) set *errmsg (heap) naming the entry. */
int vmd_egress_policy_parse(const char *const *allow, size_t n,
    struct vmd_egress_policy *out, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_egress_is_ip_literal: `host` is an IPv4 or IPv6 address (with or
 * without brackets), or a number-only name some resolvers read as one. */
bool vmd_egress_is_ip_literal(const char *host);

/* vmd_egress_name_allowed: whether `host` (any case) on `port` is on the
 * list; if not, *why says why (static text). */
bool vmd_egress_name_allowed(const struct vmd_egress_policy *p,
    const char *host, uint16_t port, const char **why);

/* vmd_egress_addr_allowed: whether the proxy may connect to `sa`:
 * never loopback, unspecified, link-local, metadata, private, CGNAT,
 * multicast, broadcast or reserved, nor one of the host's own addresses
 * (`host_addrs`, n_host of them). *why (static) says which. */
bool vmd_egress_addr_allowed(const struct sockaddr *sa,
    const struct sockaddr_storage *host_addrs, size_t n_host,
    const char **why);

/* The egress-hosts file: "name address[:port]" lines ('#' comments), the
 * proxy's first resolver. An address it maps is used even if the address
 * check would refuse it (tests map a name to 127.0.0.1). */
struct vmd_egress_host_entry {
	char name[VMD_EGRESS_HOST_MAX + 1];
	struct sockaddr_storage addr; /* port 0 unless the line gave one */
	socklen_t addr_len;
};

struct vmd_egress_hosts {
	size_t n;
	struct vmd_egress_host_entry *entry;
};

/* vmd_egress_hosts_parse: the file's text into *out (free with
 * vmd_egress_hosts_free). Errors (MOAT_INVALID_ARGUMENT) name the line. */
int vmd_egress_hosts_parse(const char *text, struct vmd_egress_hosts *out,
    char **errmsg) __attribute__((warn_unused_result));
void vmd_egress_hosts_free(struct vmd_egress_hosts *h);
const struct vmd_egress_host_entry *
vmd_egress_hosts_find(const struct vmd_egress_hosts *h, const char *name);

/* A proxy request head: "CONNECT host:port HTTP/1.x" or "METHOD
 * http://host[:port]/path HTTP/1.x" with headers. */
struct vmd_egress_target {
	bool connect;
	char host[VMD_EGRESS_HOST_MAX + 1]; /* lower case, no brackets */
	uint16_t port;
	size_t head_len;           /* bytes up to and with the blank line */
	size_t path_off, path_len; /* http: the origin-form path in the head */
	size_t line_len;           /* the request line with its CRLF */
};

/* vmd_egress_head_parse: 1 and *t when buf[0..len) holds a whole head, 0
 * when more bytes are needed, -1 with *why (static) when it is not a
 * request the proxy takes (https:// URIs, origin-form, a Host header that
 * names another host, a head over VMD_EGRESS_HEAD_MAX). */
int vmd_egress_head_parse(const char *buf, size_t len,
    struct vmd_egress_target *t, const char **why);

#endif
