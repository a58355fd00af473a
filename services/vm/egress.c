/*
 * egress.c: vmd's egress proxy, one thread per allowlist sandbox, and the
 * node's egress event ring (egress.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/tunnel.h"
#include "moat/util.h"
#include "egress.h"
#include "node.h"
#include "sync.h"
#include "vmhost.h"

struct egress_event {
	uint64_t seq, at_unix_ms;
	char tenant[128];
	char sandbox_id[48];
	char kind[8];
	char host[VMD_EGRESS_HOST_MAX + 1];
	uint16_t port;
	bool allowed;
	char reason[160];
};

struct vmd_egress_node {
	struct vmd_egress_hosts hosts;
	uint32_t max_conns;
	uint64_t epoch;
	pthread_mutex_t mu;        /* guards the ring */
	struct egress_event *ring; /* VMD_EGRESS_EVENTS */
	uint64_t seq;              /* the newest event's */
};

struct vmd_egress {
	struct vmd_egress_node *node;
	struct vmd_egress_policy policy;
	char *sock, *tenant, *sandbox_id;
	int stop_pipe[2];
	pthread_t thread;
};

/* One stream's proxy state (moat_tun_stream.user). */
struct egress_conn {
	struct vmd_egress_target target;
	char addr[64];
};

/* ---- the node ---- */

int
vmd_egress_node_init(struct vmd *vmd, const struct moat_config *c,
    char **errmsg)
{
	struct vmd_egress_node *n = calloc(1, sizeof(*n));
	const char *path = moat_config_get(c, "vmd", "egress-hosts", "");
	uint64_t max = 0;
	char *text = NULL;
	size_t text_len = 0;
	int rv;

	*errmsg = NULL;
	if (n == NULL ||
	    (n->ring = calloc(VMD_EGRESS_EVENTS, sizeof(*n->ring))) == NULL) {
		free(n);
		*errmsg = moat_asprintf("egress: out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	pthread_mutex_init(&n->mu, NULL);
	n->epoch = moat_now_unix_ms();
	vmd->egress = n;
	if ((rv = moat_config_get_u64(c, "vmd", "egress-max-conns",
	         VMD_EGRESS_DEFAULT_MAX_CONNS, &max, errmsg)) != MOAT_OK)
		return rv;
	if (max < 1 || max > 1024) {
		*errmsg = moat_asprintf("egress-max-conns=%llu is out of "
		                        "range 1..1024",
		    (unsigned long long)max);
		return MOAT_INVALID_ARGUMENT;
	}
	n->max_conns = (uint32_t)max;
	if (path[0] == '\0')
		return MOAT_OK;
	if ((rv = moat_read_file(path, 1 << 20, &text, &text_len)) != 0) {
		*errmsg = moat_asprintf("egress-hosts %s: %s (fix or unset "
		                        "[vmd] egress-hosts)",
		    path, strerror(rv));
		return MOAT_INVALID_ARGUMENT;
	}
	rv = vmd_egress_hosts_parse(text, &n->hosts, errmsg);
	free(text);
	if (rv == MOAT_OK)
		moat_info(0, "egress: %zu names from %s", n->hosts.n, path);
	return rv;
}

void
vmd_egress_node_fini(struct vmd *vmd)
{
	struct vmd_egress_node *n = vmd->egress;

	if (n == NULL)
		return;
	vmd_egress_hosts_free(&n->hosts);
	pthread_mutex_destroy(&n->mu);
	free(n->ring);
	free(n);
	vmd->egress = NULL;
}

static void
event_add(struct vmd_egress *e, const char *kind, const char *host,
    uint16_t port, bool allowed, const char *reason)
{
	struct vmd_egress_node *n = e->node;
	struct egress_event *ev;

	pthread_mutex_lock(&n->mu);
	/* The oldest is overwritten: a reader that fell behind learns how
	 * many it missed (EgressEventList.dropped). */
	n->seq++;
	ev = &n->ring[n->seq % VMD_EGRESS_EVENTS];
	memset(ev, 0, sizeof(*ev));
	ev->seq = n->seq;
	ev->at_unix_ms = moat_now_unix_ms();
	snprintf(ev->tenant, sizeof(ev->tenant), "%s", e->tenant);
	snprintf(ev->sandbox_id, sizeof(ev->sandbox_id), "%s", e->sandbox_id);
	snprintf(ev->kind, sizeof(ev->kind), "%s", kind);
	snprintf(ev->host, sizeof(ev->host), "%s", host);
	ev->port = port;
	ev->allowed = allowed;
	snprintf(ev->reason, sizeof(ev->reason), "%s", reason);
	pthread_mutex_unlock(&n->mu);
	/* Debug only: a guest decides how many there are (the audit log
	 * keeps them). */
	moat_debug(0, "egress %s %s %s %s:%u: %s", e->sandbox_id,
	    allowed ? "allowed" : "refused", kind, host, port, reason);
}

static int
event_to_proto(const struct egress_event *ev, Moat__V1__EgressEvent **out)
{
	Moat__V1__EgressEvent *m = malloc(sizeof(*m));

	if ((*out = m) == NULL)
		return MOAT_INTERNAL;
	moat__v1__egress_event__init(m);
	m->seq = ev->seq;
	m->at_unix_ms = ev->at_unix_ms;
	m->port = ev->port;
	m->allowed = ev->allowed;
	m->tenant = strdup(ev->tenant);
	m->sandbox_id = strdup(ev->sandbox_id);
	m->kind = strdup(ev->kind);
	m->host = strdup(ev->host);
	m->reason = strdup(ev->reason);
	if (!m->tenant || !m->sandbox_id || !m->kind || !m->host || !m->reason)
		return MOAT_INTERNAL;
	return MOAT_OK;
}

int
vmd_egress_events(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__EgressEventsRequest *req, Moat__V1__EgressEventList *reply)
{
	struct vmd_egress_node *n = vmd->egress;
	uint32_t limit = req->limit ? req->limit : 256;
	uint64_t from;
	int rv = MOAT_OK;

	if (limit > 1024)
		limit = 1024;
	if (n == NULL)
		return moat_rpc_error(call, MOAT_UNAVAILABLE, "egress is off");
	pthread_mutex_lock(&n->mu);
	reply->epoch = n->epoch;
	reply->last_seq = n->seq;
	from = req->after_seq + 1;
	if (n->seq >= VMD_EGRESS_EVENTS &&
	    from <= n->seq - VMD_EGRESS_EVENTS) {
		reply->dropped = n->seq - VMD_EGRESS_EVENTS + 1 - from;
		from = n->seq - VMD_EGRESS_EVENTS + 1;
	}
	if (from <= n->seq) {
		uint64_t count = n->seq - from + 1;

		if (count > limit)
			count = limit;
		reply->events = calloc(count, sizeof(*reply->events));
		if (reply->events == NULL)
			rv = MOAT_INTERNAL;
		for (uint64_t s = from; rv == MOAT_OK && s < from + count;
		     s++) {
			rv = event_to_proto(&n->ring[s % VMD_EGRESS_EVENTS],
			    &reply->events[reply->n_events]);
			if (reply->events[reply->n_events] != NULL)
				reply->n_events++;
		}
	}
	pthread_mutex_unlock(&n->mu);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;
}

/* ---- policy plumbing ---- */

int
vmd_egress_request_policy(const Moat__V1__NetworkPolicy *np,
    struct vmd_egress_policy **out, char **errmsg)
{
	const char *mode = np && np->mode ? np->mode : "";
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if (np == NULL || mode[0] == '\0' || strcmp(mode, "none") == 0) {
		if (np != NULL && np->n_allow > 0 && mode[0] != '\0') {
			*errmsg = moat_asprintf("network mode \"none\" with "
			                        "allow entries: use mode "
			                        "\"allowlist\"");
			return MOAT_INVALID_ARGUMENT;
		}
		if (np == NULL || np->n_allow == 0)
			return MOAT_OK;
		mode = "allowlist"; /* allow entries alone mean a list */
	}
	if (strcmp(mode, "allowlist") != 0) {
		*errmsg = moat_asprintf("network mode \"%s\": use \"none\" or "
		                        "\"allowlist\"",
		    mode);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((*out = malloc(sizeof(**out))) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_INTERNAL;
	}
	if ((rv = vmd_egress_policy_parse((const char *const *)np->allow,
	         np->n_allow, *out, errmsg)) != MOAT_OK) {
		free(*out);
		*out = NULL;
	}
	return rv;
}

Moat__V1__NetworkPolicy *
vmd_egress_to_proto(const struct vmd_egress_policy *p)
{
	Moat__V1__NetworkPolicy *m = malloc(sizeof(*m));
	bool oom;

	if (m == NULL)
		return NULL;
	moat__v1__network_policy__init(m);
	m->mode = strdup(p ? "allowlist" : "none");
	oom = m->mode == NULL;
	if (p != NULL && p->n > 0 && !oom) {
		m->allow = calloc(p->n, sizeof(*m->allow));
		oom = m->allow == NULL;
		for (size_t i = 0; !oom && i < p->n; i++) {
			m->allow[i] = p->rule[i].port ?
			    moat_asprintf("%s:%u", p->rule[i].host,
			        p->rule[i].port) :
			    strdup(p->rule[i].host);
			oom = m->allow[i] == NULL;
			m->n_allow = i + 1;
		}
	}
	if (oom) {
		moat__v1__network_policy__free_unpacked(m, NULL);
		return NULL;
	}
	return m;
}

Moat__V1__NetworkPolicy *
vmd_egress_proto_copy(const Moat__V1__NetworkPolicy *np)
{
	Moat__V1__NetworkPolicy *m;
	bool oom;

	if (np == NULL || (m = malloc(sizeof(*m))) == NULL)
		return NULL;
	moat__v1__network_policy__init(m);
	m->mode = strdup(np->mode ? np->mode : "");
	oom = m->mode == NULL;
	if (np->n_allow > 0 && !oom) {
		m->allow = calloc(np->n_allow, sizeof(*m->allow));
		oom = m->allow == NULL;
		for (size_t i = 0; !oom && i < np->n_allow; i++) {
			m->allow[i] = strdup(np->allow[i]);
			oom = m->allow[i] == NULL;
			m->n_allow = i + 1;
		}
	}
	if (oom) {
		moat__v1__network_policy__free_unpacked(m, NULL);
		return NULL;
	}
	return m;
}

char *
vmd_egress_label(const Moat__V1__NetworkPolicy *np)
{
	size_t len = sizeof("allowlist:");
	char *out;

	if (np == NULL || np->mode == NULL ||
	    strcmp(np->mode, "allowlist") != 0)
		return strdup("none");
	for (size_t i = 0; i < np->n_allow; i++)
		len += strlen(np->allow[i]) + 1;
	if ((out = malloc(len)) == NULL)
		return NULL;
	strcpy(out, "allowlist:");
	for (size_t i = 0; i < np->n_allow; i++) {
		if (i > 0)
			strcat(out, ",");
		strcat(out, np->allow[i]);
	}
	return out;
}

int
vmd_egress_from_label(const char *label, Moat__V1__NetworkPolicy **out)
{
	Moat__V1__NetworkPolicy *m;
	struct vmd_egress_policy *p = NULL;
	char *err = NULL, *list = NULL, *save = NULL, *tok;
	bool allow = strncmp(label, "allowlist:", 10) == 0;
	int rv = MOAT_OK;

	*out = NULL;
	if (label[0] == '\0')
		return MOAT_OK; /* pushed before it had one: "none" */
	if (!allow && strcmp(label, "none") != 0)
		return MOAT_INVALID_ARGUMENT;
	if ((m = malloc(sizeof(*m))) == NULL)
		return MOAT_INTERNAL;
	moat__v1__network_policy__init(m);
	m->mode = strdup(allow ? "allowlist" : "none");
	if (allow && m->mode != NULL && (list = strdup(label + 10)) != NULL &&
	    (m->allow = calloc(strlen(list) / 2 + 1, sizeof(char *))) !=
	        NULL) {
		for (tok = strtok_r(list, ",", &save); tok != NULL;
		     tok = strtok_r(NULL, ",", &save))
			if ((m->allow[m->n_allow++] = strdup(tok)) == NULL)
				rv = MOAT_INTERNAL;
	} else if (allow || m->mode == NULL) {
		rv = MOAT_INTERNAL;
	}
	free(list);
	/* What a create would accept, or it is no policy of ours. */
	if (rv == MOAT_OK && allow &&
	    vmd_egress_request_policy(m, &p, &err) != MOAT_OK)
		rv = MOAT_INVALID_ARGUMENT;
	free(p);
	free(err);
	if (rv != MOAT_OK)
		moat__v1__network_policy__free_unpacked(m, NULL);
	else
		*out = m;
	return rv;
}

/* ---- the proxy ---- */

static const char *
reply_text(int code)
{
	switch (code) {
	case 400:
		return "400 Bad Request";
	case 403:
		return "403 Forbidden";
	default:
		return "502 Bad Gateway";
	}
}

/* refuse: answers the guest with `code` and `why`, records the event and
 * ends the stream. */
static void
refuse(struct moat_tun *t, struct moat_tun_stream *s, int code,
    const char *host, uint16_t port, const char *why)
{
	struct vmd_egress *e = t->ctx;
	struct egress_conn *c = s->user;
	char *msg = moat_asprintf("HTTP/1.1 %s\r\nContent-Type: text/plain\r\n"
	                          "Connection: close\r\nX-Moat-Egress: refused"
	                          "\r\n\r\nmoat egress: %s:%u refused: %s\n",
	    reply_text(code), host, port, why);

	event_add(e, c && c->target.connect ? "connect" : "http", host, port,
	    false, why);
	if (msg != NULL)
		moat_tun_send(t, s, msg, strlen(msg));
	free(msg);
	moat_tun_finish(t, s);
}

/* The host's own addresses, refused even where public. */
static size_t
host_addrs(struct sockaddr_storage *out, size_t max)
{
	struct ifaddrs *ifa = NULL;
	size_t n = 0;

	if (getifaddrs(&ifa) != 0)
		return 0;
	for (struct ifaddrs *i = ifa; i != NULL && n < max; i = i->ifa_next) {
		if (i->ifa_addr == NULL ||
		    (i->ifa_addr->sa_family != AF_INET &&
		        i->ifa_addr->sa_family != AF_INET6))
			continue;
		memset(&out[n], 0, sizeof(out[n]));
		memcpy(&out[n], i->ifa_addr,
		    i->ifa_addr->sa_family == AF_INET ?
		        sizeof(struct sockaddr_in) :
		        sizeof(struct sockaddr_in6));
		n++;
	}
	freeifaddrs(ifa);
	return n;
}

static void
set_port(struct sockaddr_storage *ss, uint16_t port)
{
	if (ss->ss_family == AF_INET)
		((struct sockaddr_in *)ss)->sin_port = htons(port);
	else
		((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
}

static uint16_t
get_port(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET ?
	        ((const struct sockaddr_in *)ss)->sin_port :
	        ((const struct sockaddr_in6 *)ss)->sin6_port);
}

/* resolve: egress-hosts first (any address it maps), then getaddrinfo
 * (the first address the check allows). */
static bool
resolve(struct vmd_egress *e, const char *host, uint16_t port,
    struct sockaddr_storage *ss, socklen_t *len, const char **why)
{
	const struct vmd_egress_host_entry *he =
	    vmd_egress_hosts_find(&e->node->hosts, host);
	struct sockaddr_storage mine[64];
	size_t n_mine;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	bool ok = false;

	if (he != NULL) {
		*ss = he->addr;
		*len = he->addr_len;
		if (get_port(ss) == 0)
			set_port(ss, port);
		return true;
	}
	if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) {
		*why = "name does not resolve";
		return false;
	}
	n_mine = host_addrs(mine, 64);
	for (struct addrinfo *a = res; a != NULL && !ok; a = a->ai_next) {
		if (a->ai_addrlen > sizeof(*ss) ||
		    !vmd_egress_addr_allowed(a->ai_addr, mine, n_mine, why))
			continue;
		memset(ss, 0, sizeof(*ss));
		memcpy(ss, a->ai_addr, a->ai_addrlen);
		*len = a->ai_addrlen;
		set_port(ss, port);
		ok = true;
	}
	freeaddrinfo(res);
	return ok;
}

/* The head for the origin server: origin-form request line, no proxy or
 * connection headers, "Connection: close" (one request per stream: a
 * reused connection must not reach another host). */
static char *
origin_head(const char *head, const struct vmd_egress_target *t, size_t *len)
{
	const char *line_end = head + t->line_len, *end = head + t->head_len;
	const char *sp = memchr(head, ' ', t->line_len), *ver;
	char *out;
	size_t cap = t->head_len + 64;

	ver = memchr(sp + 1, ' ', (size_t)(line_end - sp - 1));
	if ((out = malloc(cap)) == NULL)
		return NULL;
	*len = 0;
#define PUT(p, n)                                                             \
	do {                                                                  \
		memcpy(out + *len, (p), (n));                                 \
		*len += (n);                                                  \
	} while (0)
	PUT(head, (size_t)(sp + 1 - head));
	if (t->path_len > 0)
		PUT(head + t->path_off, t->path_len);
	else
		PUT("/", 1);
	PUT(ver, (size_t)(line_end - ver));
	for (const char *p = line_end; p < end - 2;) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		size_t ll = (size_t)(eol - p) + 1;

		if (strncasecmp(p, "proxy-", 6) != 0 &&
		    strncasecmp(p, "connection:", 11) != 0 &&
		    strncasecmp(p, "keep-alive:", 11) != 0)
			PUT(p, ll);
		p = eol + 1;
	}
	PUT("Connection: close\r\n\r\n", 21);
#undef PUT
	return out;
}

static void
on_data(struct moat_tun *t, struct moat_tun_stream *s)
{
	struct vmd_egress *e = t->ctx;
	struct egress_conn *c = s->user;
	struct sockaddr_storage ss;
	socklen_t sl = 0;
	const char *why = NULL;
	int fd, rv;

	if (c == NULL && (s->user = c = calloc(1, sizeof(*c))) == NULL) {
		moat_tun_finish(t, s);
		return;
	}
	rv = vmd_egress_head_parse((const char *)s->to_fd.p, s->to_fd.len,
	    &c->target, &why);
	if (rv == 0)
		return;
	if (rv < 0) {
		refuse(t, s, 400, c->target.host, c->target.port, why);
		return;
	}
	if (!vmd_egress_name_allowed(&e->policy, c->target.host,
	        c->target.port, &why) ||
	    !resolve(e, c->target.host, c->target.port, &ss, &sl, &why)) {
		refuse(t, s, 403, c->target.host, c->target.port, why);
		return;
	}
	if (ss.ss_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr,
		    c->addr, sizeof(c->addr));
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr,
		    c->addr, sizeof(c->addr));
	snprintf(c->addr + strlen(c->addr), sizeof(c->addr) - strlen(c->addr),
	    ":%u", get_port(&ss));
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
	    0);
	if (fd < 0 ||
	    (connect(fd, (struct sockaddr *)&ss, sl) != 0 &&
	        errno != EINPROGRESS)) {
		char msg[96];

		snprintf(msg, sizeof(msg), "connect %s: %s", c->addr,
		    strerror(errno));
		if (fd >= 0)
			close(fd);
		refuse(t, s, 502, c->target.host, c->target.port, msg);
		return;
	}
	s->fd = fd;
	s->connecting = true;
	s->deadline = moat_rpc_now_ms() + VMD_EGRESS_CONNECT_MS;
}

static void
on_connected(struct moat_tun *t, struct moat_tun_stream *s, int err)
{
	struct vmd_egress *e = t->ctx;
	struct egress_conn *c = s->user;
	const struct vmd_egress_target *tg = &c->target;
	const char *kind = tg->connect ? "connect" : "http";
	size_t hl = 0;
	char *head;

	if (err != 0) {
		char msg[96];

		snprintf(msg, sizeof(msg), "connect %s: %s", c->addr,
		    strerror(err));
		close(s->fd);
		s->fd = -1;
		refuse(t, s, 502, tg->host, tg->port, msg);
		return;
	}
	event_add(e, kind, tg->host, tg->port, true, c->addr);
	if (tg->connect) {
		static const char ok[] =
		    "HTTP/1.1 200 Connection established\r\n\r\n";

		memmove(s->to_fd.p, s->to_fd.p + tg->head_len,
		    s->to_fd.len - tg->head_len);
		s->to_fd.len -= tg->head_len;
		/* The head is taken: give its window back. */
		s->unacked += (uint32_t)tg->head_len;
		moat_tun_send(t, s, ok, sizeof(ok) - 1);
		return;
	}
	head = origin_head((const char *)s->to_fd.p, tg, &hl);
	if (head == NULL) {
		refuse(t, s, 502, tg->host, tg->port, "out of memory");
		return;
	}
	/* to_fd = the new head + what followed the old one (a body). The
	 * guest gets its window back as bytes reach the server; the
	 * head's difference is settled here. */
	{
		size_t rest = s->to_fd.len - tg->head_len;
		uint8_t *p = malloc(hl + rest);

		if (p == NULL) {
			free(head);
			refuse(t, s, 502, tg->host, tg->port, "out of memory");
			return;
		}
		memcpy(p, head, hl);
		memcpy(p + hl, s->to_fd.p + tg->head_len, rest);
		free(s->to_fd.p);
		s->to_fd.p = p;
		s->to_fd.len = s->to_fd.cap = hl + rest;
		s->unacked += (uint32_t)tg->head_len;
		s->ack_skip = (uint32_t)hl;
	}
	free(head);
}

static void
on_free(struct moat_tun *t, struct moat_tun_stream *s)
{
	(void)t;
	free(s->user);
	s->user = NULL;
}

static const struct moat_tun_hooks egress_hooks = {
	.on_data = on_data,
	.on_connected = on_connected,
	.on_free = on_free,
};

/* serve: one connection to QEMU's egress socket until it breaks or stop. */
static bool
serve(struct vmd_egress *e, int fd)
{
	struct moat_tun t;
	size_t cap = 2 + e->node->max_conns;
	struct pollfd *fds = calloc(cap, sizeof(*fds));
	bool stop = false;

	if (fds == NULL ||
	    !moat_tun_init(&t, fd, e->node->max_conns, &egress_hooks, e)) {
		free(fds);
		return true;
	}
	while (!t.broken && !stop) {
		uint64_t now = moat_rpc_now_ms();
		size_t n = moat_tun_pollfds(&t, fds);
		int timeout = moat_tun_timeout_ms(&t, now);

		fds[n].fd = e->stop_pipe[0];
		fds[n].events = POLLIN;
		fds[n].revents = 0;
		if (poll(fds, n + 1, timeout) < 0 && errno != EINTR)
			break;
		stop = fds[n].revents != 0;
		moat_tun_service(&t, fds, n, moat_rpc_now_ms());
	}
	moat_tun_fini(&t);
	free(fds);
	return stop;
}

static void *
egress_main(void *arg)
{
	struct vmd_egress *e = arg;

	for (;;) {
		struct pollfd p = { .fd = e->stop_pipe[0], .events = POLLIN };
		char *err = NULL;
		int fd = -1;

		if (vmd_unix_connect(e->sock, &fd, &err) == MOAT_OK) {
			(void)fcntl(fd, F_SETFL,
			    fcntl(fd, F_GETFL) | O_NONBLOCK);
			bool stop = serve(e, fd);

			close(fd);
			if (stop)
				break;
		}
		free(err);
		/* QEMU makes the socket at its start; after a break the VM
		 * is gone or going: retry slowly until stopped. */
		if (poll(&p, 1, fd < 0 ? 20 : 200) > 0)
			break;
	}
	return NULL;
}

struct vmd_egress *
vmd_egress_start(struct vmd *vmd, const char *sock,
    const struct vmd_egress_policy *p, const char *tenant,
    const char *sandbox_id)
{
	struct vmd_egress *e = calloc(1, sizeof(*e));

	if (e == NULL || vmd->egress == NULL)
		goto fail;
	e->stop_pipe[0] = e->stop_pipe[1] = -1;
	e->node = vmd->egress;
	e->policy = *p;
	e->sock = strdup(sock);
	e->tenant = strdup(tenant);
	e->sandbox_id = strdup(sandbox_id);
	if (!e->sock || !e->tenant || !e->sandbox_id ||
	    pipe2(e->stop_pipe, O_CLOEXEC) != 0 ||
	    vmd_thread_create(&e->thread, egress_main, e) != 0)
		goto fail;
	return e;
fail:
	moat_warn(0, "sandbox %s: cannot start its egress proxy", sandbox_id);
	if (e != NULL) {
		if (e->stop_pipe[0] >= 0) {
			close(e->stop_pipe[0]);
			close(e->stop_pipe[1]);
		}
		free(e->sock);
		free(e->tenant);
		free(e->sandbox_id);
		free(e);
	}
	return NULL;
}

void
vmd_egress_stop(struct vmd_egress *e)
{
	if (e == NULL)
		return;
	(void)!write(e->stop_pipe[1], "x", 1);
	pthread_join(e->thread, NULL);
	close(e->stop_pipe[0]);
	close(e->stop_pipe[1]);
	free(e->sock);
	free(e->tenant);
	free(e->sandbox_id);
	free(e);
}
