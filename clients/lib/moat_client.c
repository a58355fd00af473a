/*
 * moat_client.c: libmoat, the typed C client over moat's RPC layer: one
 * thin wrapper per Gateway method, the timeouts each needs (a create
 * waits for a boot, a long-poll for its wait), and file transfers split
 * into MOAT_CLIENT_FILE_CHUNK pieces so no single message grows with the
 * file. Not for: retries (the caller decides what is safe to repeat) or
 * printing (the CLI does that).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/config.h"
#include "moat/rpc.h"
#include "moat/tls.h"
#include "moat/util.h"
#include "moat_client.h"

#define GATEWAY_SERVICE "moat.v1.Gateway"
#define EXEC_DEFAULT_TIMEOUT_MS 300000 /* one-shot Exec with no timeout */

struct moat_client {
	struct moat_rpc_client *rpc;
	char *url;
	char *auth;          /* NULL: none */
	uint32_t timeout_ms; /* 0: rpc default */
	bool timeout_set;
};

static const char *
pick(const char *given, const char *env)
{
	const char *v;

	if (given != NULL && given[0] != '\0')
		return given;
	v = getenv(env);
	return v != NULL && v[0] != '\0' ? v : NULL;
}

static bool
env_true(const char *env)
{
	const char *v = getenv(env);

	return v != NULL &&
	    (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 ||
	        strcasecmp(v, "yes") == 0 || strcasecmp(v, "on") == 0);
}

/* open_rpc: the RPC connection, with TLS from `tls` and MOAT_TLS_*. */
static int
open_rpc(struct moat_client *c, const struct moat_client_tls *tls,
    char **errmsg)
{
	static const struct moat_client_tls none = { 0 };
	struct moat_tls_files f = { 0 };
	struct moat_rpc_client_opts o = { .what = "the gateway url" };
	struct moat_tls *t = NULL;
	int rv;

	if (tls == NULL)
		tls = &none;
	f.ca = pick(tls->ca, "MOAT_TLS_CA");
	f.cert = pick(tls->cert, "MOAT_TLS_CERT");
	f.key = pick(tls->key, "MOAT_TLS_KEY");
	f.insecure = tls->insecure || env_true("MOAT_INSECURE");
	if ((rv = moat_tls_load(&t, &f, errmsg)) != MOAT_OK)
		return rv;
	o.tls = t;
	o.server_name = pick(tls->server_name, "MOAT_TLS_NAME");
	rv = moat_rpc_client_open_opts(&c->rpc, c->url, &o, errmsg);
	moat_tls_free(t);
	return rv;
}

int
moat_client_open(struct moat_client **out, const char *url, const char *auth,
    char **errmsg)
{
	return moat_client_open_tls(out, url, auth, NULL, errmsg);
}

struct moat_rpc_client *
moat_client_rpc(struct moat_client *c)
{
	return c->rpc;
}

int
moat_client_open_tls(struct moat_client **out, const char *url,
    const char *auth, const struct moat_client_tls *tls, char **errmsg)
{
	struct moat_client *c;
	char *state = NULL;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if ((c = calloc(1, sizeof(*c))) == NULL)
		goto fail_oom;
	if (url == NULL || url[0] == '\0')
		url = getenv("MOAT_GATEWAY");
	if (url != NULL && url[0] != '\0') {
		c->url = strdup(url);
	} else {
		if ((state = moat_default_state_dir()) == NULL)
			goto fail_oom;
		c->url = moat_asprintf("ipc://%s/gateway.sock", state);
		free(state);
	}
	if (c->url == NULL)
		goto fail_oom;
	if (auth != NULL && auth[0] != '\0' &&
	    (c->auth = strdup(auth)) == NULL)
		goto fail_oom;
	if ((rv = open_rpc(c, tls, errmsg)) != MOAT_OK) {
		moat_client_close(c);
		return rv;
	}
	*out = c;
	return MOAT_OK;

fail_oom:
	moat_client_close(c);
	*errmsg = moat_asprintf("out of memory opening a moat client");
	return MOAT_RESOURCE_EXHAUSTED;
}

void
moat_client_close(struct moat_client *c)
{
	if (c == NULL)
		return;
	moat_rpc_client_close(c->rpc);
	free(c->url);
	free(c->auth);
	free(c);
}

const char *
moat_client_url(const struct moat_client *c)
{
	return c->url;
}

void
moat_client_set_timeout(struct moat_client *c, uint32_t timeout_ms)
{
	c->timeout_ms = timeout_ms;
	c->timeout_set = timeout_ms != 0;
}

void
moat_client_free_msg(void *msg)
{
	if (msg != NULL)
		protobuf_c_message_free_unpacked(msg, NULL);
}

static uint32_t
base_timeout(const struct moat_client *c)
{
	return c->timeout_ms ? c->timeout_ms : MOAT_RPC_DEFAULT_TIMEOUT_MS;
}

/* plus: a + b ms, saturating. */
static uint32_t
plus(uint32_t a, uint32_t b)
{
	return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

/* gw_call: one Gateway call; timeout_ms 0 is the client's. */
static int
gw_call(struct moat_client *c, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *reply_desc, void *out,
    uint32_t timeout_ms, char **errmsg)
{
	struct moat_rpc_opts opts = {
		.timeout_ms = timeout_ms ? timeout_ms : base_timeout(c),
		.auth = c->auth,
	};
	ProtobufCMessage *reply = NULL;
	int rv;

	*errmsg = NULL;
	rv = moat_rpc_call(c->rpc, GATEWAY_SERVICE, method, req, reply_desc,
	    &reply, &opts, errmsg);
	if (out != NULL)
		*(ProtobufCMessage **)out = reply;
	else
		moat_client_free_msg(reply);
	return rv;
}

/* ---- cluster ---- */

int
moat_client_health(struct moat_client *c, Moat__V1__HealthReply **out,
    char **errmsg)
{
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;

	return gw_call(c, "Health", &req.base,
	    &moat__v1__health_reply__descriptor, out, 0, errmsg);
}

int
moat_client_info(struct moat_client *c, Moat__V1__ClusterInfo **out,
    char **errmsg)
{
	Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;

	return gw_call(c, "Info", &req.base,
	    &moat__v1__cluster_info__descriptor, out, 0, errmsg);
}

int
moat_client_nodes(struct moat_client *c, Moat__V1__NodeList **out,
    char **errmsg)
{
	Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;

	return gw_call(c, "ListNodes", &req.base,
	    &moat__v1__node_list__descriptor, out, 0, errmsg);
}

/* ---- sandboxes ---- */

int
moat_client_create(struct moat_client *c,
    const Moat__V1__CreateSandboxRequest *req, Moat__V1__Sandbox **out,
    char **errmsg)
{
	Moat__V1__CreateSandboxRequest defaults =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;

	return gw_call(c, "CreateSandbox",
	    req != NULL ? &req->base : &defaults.base,
	    &moat__v1__sandbox__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_CREATE_TIMEOUT_MS,
	    errmsg);
}

int
moat_client_get(struct moat_client *c, const char *sandbox_id,
    Moat__V1__Sandbox **out, char **errmsg)
{
	Moat__V1__SandboxRef req = MOAT__V1__SANDBOX_REF__INIT;

	req.sandbox_id = (char *)sandbox_id;
	return gw_call(c, "GetSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, out, 0, errmsg);
}

int
moat_client_list(struct moat_client *c, Moat__V1__SandboxList **out,
    char **errmsg)
{
	Moat__V1__ListSandboxesRequest req =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;

	return gw_call(c, "ListSandboxes", &req.base,
	    &moat__v1__sandbox_list__descriptor, out, 0, errmsg);
}

int
moat_client_destroy(struct moat_client *c, const char *sandbox_id,
    char **errmsg)
{
	Moat__V1__SandboxRef req = MOAT__V1__SANDBOX_REF__INIT;

	req.sandbox_id = (char *)sandbox_id;
	return gw_call(c, "DestroySandbox", &req.base,
	    &moat__v1__empty__descriptor, NULL, 0, errmsg);
}

int
moat_client_sandbox_info(struct moat_client *c, const char *sandbox_id,
    Moat__V1__GuestInfo **out, char **errmsg)
{
	Moat__V1__SandboxRef req = MOAT__V1__SANDBOX_REF__INIT;

	req.sandbox_id = (char *)sandbox_id;
	return gw_call(c, "SandboxInfo", &req.base,
	    &moat__v1__guest_info__descriptor, out, 0, errmsg);
}

/* ---- exec ---- */

int
moat_client_exec(struct moat_client *c, const Moat__V1__ExecRequest *req,
    Moat__V1__ExecResult **out, char **errmsg)
{
	uint32_t t = req->timeout_ms != 0 ?
	    plus(base_timeout(c), req->timeout_ms) :
	    (c->timeout_set ? c->timeout_ms : EXEC_DEFAULT_TIMEOUT_MS);

	return gw_call(c, "Exec", &req->base,
	    &moat__v1__exec_result__descriptor, out, t, errmsg);
}

int
moat_client_exec_start(struct moat_client *c, const Moat__V1__ExecRequest *req,
    Moat__V1__ExecHandle **out, char **errmsg)
{
	return gw_call(c, "ExecStart", &req->base,
	    &moat__v1__exec_handle__descriptor, out, 0, errmsg);
}

int
moat_client_exec_read(struct moat_client *c,
    const Moat__V1__ExecReadRequest *req, Moat__V1__ExecReadReply **out,
    char **errmsg)
{
	return gw_call(c, "ExecRead", &req->base,
	    &moat__v1__exec_read_reply__descriptor, out,
	    plus(base_timeout(c), req->wait_ms), errmsg);
}

int
moat_client_exec_write(struct moat_client *c, const char *sandbox_id,
    uint64_t exec_id, const void *data, size_t len, bool close, char **errmsg)
{
	Moat__V1__ExecWriteRequest req = MOAT__V1__EXEC_WRITE_REQUEST__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.exec_id = exec_id;
	req.data.data = (uint8_t *)data;
	req.data.len = data != NULL ? len : 0;
	req.close = close;
	return gw_call(c, "ExecWrite", &req.base, &moat__v1__empty__descriptor,
	    NULL, 0, errmsg);
}

int
moat_client_exec_wait(struct moat_client *c, const char *sandbox_id,
    uint64_t exec_id, uint32_t wait_ms, Moat__V1__ExecStatus **out,
    char **errmsg)
{
	Moat__V1__ExecWaitRequest req = MOAT__V1__EXEC_WAIT_REQUEST__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.exec_id = exec_id;
	req.wait_ms = wait_ms;
	return gw_call(c, "ExecWait", &req.base,
	    &moat__v1__exec_status__descriptor, out,
	    plus(base_timeout(c), wait_ms), errmsg);
}

int
moat_client_exec_kill(struct moat_client *c, const char *sandbox_id,
    uint64_t exec_id, int signal, char **errmsg)
{
	Moat__V1__ExecKillRequest req = MOAT__V1__EXEC_KILL_REQUEST__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.exec_id = exec_id;
	req.signal = signal;
	return gw_call(c, "ExecKill", &req.base, &moat__v1__empty__descriptor,
	    NULL, 0, errmsg);
}

/* ---- files ---- */

/* read_piece: one ReadFile of up to a chunk at `offset`. */
static int
read_piece(struct moat_client *c, const char *sandbox_id, const char *path,
    uint64_t offset, Moat__V1__FileData **out, char **errmsg)
{
	Moat__V1__FileReadRequest req = MOAT__V1__FILE_READ_REQUEST__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.path = (char *)path;
	req.offset = offset;
	req.length = MOAT_CLIENT_FILE_CHUNK;
	return gw_call(c, "ReadFile", &req.base,
	    &moat__v1__file_data__descriptor, out, 0, errmsg);
}

/* read_loop: reads the file piece by piece, handing each to `sink`. */
static int
read_loop(struct moat_client *c, const char *sandbox_id, const char *path,
    size_t max,
    int (*sink)(void *arg, const Moat__V1__FileData *piece, char **errmsg),
    void *arg, uint64_t *size, uint32_t *mode, char **errmsg)
{
	uint64_t offset = 0;
	int rv;

	*errmsg = NULL;
	for (;;) {
		Moat__V1__FileData *piece = NULL;
		bool done;

		if ((rv = read_piece(c, sandbox_id, path, offset, &piece,
		         errmsg)) != MOAT_OK)
			return rv;
		if (max != 0 && piece->size > max) {
			*errmsg = moat_asprintf(
			    "%s in sandbox %s is %llu "
			    "bytes, more than the %zu this call takes: read "
			    "it to a file instead",
			    path, sandbox_id, (unsigned long long)piece->size,
			    max);
			moat_client_free_msg(piece);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		if (mode != NULL && offset == 0)
			*mode = piece->mode;
		if (piece->data.len > 0 &&
		    (rv = sink(arg, piece, errmsg)) != MOAT_OK) {
			moat_client_free_msg(piece);
			return rv;
		}
		offset += piece->data.len;
		/* An empty piece that is not eof would loop forever: the
		 * file shrank under us, so what was read is all there is. */
		done = piece->eof || piece->data.len == 0;
		moat_client_free_msg(piece);
		if (done)
			break;
	}
	if (size != NULL)
		*size = offset;
	return MOAT_OK;
}

struct mem_sink {
	uint8_t *buf;
	size_t len, cap, max;
	const char *path;
};

static int
mem_sink_add(void *arg, const Moat__V1__FileData *piece, char **errmsg)
{
	struct mem_sink *m = arg;
	size_t need = m->len + piece->data.len + 1;

	if (m->max != 0 && m->len + piece->data.len > m->max) {
		*errmsg = moat_asprintf("%s grew past %zu bytes while being "
		                        "read",
		    m->path, m->max);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (need > m->cap) {
		size_t cap = m->cap ? m->cap : MOAT_CLIENT_FILE_CHUNK + 1;
		uint8_t *grown;

		while (cap < need)
			cap *= 2;
		if ((grown = realloc(m->buf, cap)) == NULL) {
			*errmsg =
			    moat_asprintf("out of memory reading %s", m->path);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		m->buf = grown;
		m->cap = cap;
	}
	memcpy(m->buf + m->len, piece->data.data, piece->data.len);
	m->len += piece->data.len;
	return MOAT_OK;
}

int
moat_client_read_file(struct moat_client *c, const char *sandbox_id,
    const char *path, size_t max, uint8_t **data, size_t *len, uint32_t *mode,
    char **errmsg)
{
	struct mem_sink m = { .max = max, .path = path };
	int rv;

	*data = NULL;
	*len = 0;
	rv = read_loop(c, sandbox_id, path, max, mem_sink_add, &m, NULL, mode,
	    errmsg);
	if (rv != MOAT_OK) {
		free(m.buf);
		return rv;
	}
	if (m.buf == NULL && (m.buf = malloc(1)) == NULL) {
		*errmsg = moat_asprintf("out of memory reading %s", path);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	m.buf[m.len] = '\0';
	*data = m.buf;
	*len = m.len;
	return MOAT_OK;
}

static int
fd_sink_add(void *arg, const Moat__V1__FileData *piece, char **errmsg)
{
	int fd = *(int *)arg;
	size_t done = 0;

	while (done < piece->data.len) {
		ssize_t n =
		    write(fd, piece->data.data + done, piece->data.len - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int err = errno;
			*errmsg = moat_asprintf("writing the local copy: %s",
			    strerror(err));
			return moat_status_from_errno(err);
		}
		done += (size_t)n;
	}
	return MOAT_OK;
}

int
moat_client_read_file_to_fd(struct moat_client *c, const char *sandbox_id,
    const char *path, int fd, uint64_t *size, uint32_t *mode, char **errmsg)
{
	return read_loop(c, sandbox_id, path, 0, fd_sink_add, &fd, size, mode,
	    errmsg);
}

/* write_piece: one WriteFile; the first piece truncates and creates. */
static int
write_piece(struct moat_client *c, const char *sandbox_id, const char *path,
    uint64_t offset, const void *data, size_t len, uint32_t mode,
    bool make_parents, Moat__V1__FileInfo **out, char **errmsg)
{
	Moat__V1__FileWriteRequest req = MOAT__V1__FILE_WRITE_REQUEST__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.path = (char *)path;
	req.offset = offset;
	req.data.data = (uint8_t *)data;
	req.data.len = len;
	req.mode = mode;
	req.truncate = offset == 0;
	req.make_parents = make_parents && offset == 0;
	return gw_call(c, "WriteFile", &req.base,
	    &moat__v1__file_info__descriptor, out, 0, errmsg);
}

int
moat_client_write_file(struct moat_client *c, const char *sandbox_id,
    const char *path, const void *data, size_t len, uint32_t mode,
    bool make_parents, Moat__V1__FileInfo **out, char **errmsg)
{
	Moat__V1__FileInfo *info = NULL;
	uint64_t offset = 0;
	int rv;

	if (out != NULL)
		*out = NULL;
	do {
		size_t n = len - offset < MOAT_CLIENT_FILE_CHUNK ?
		    len - offset :
		    MOAT_CLIENT_FILE_CHUNK;

		moat_client_free_msg(info);
		info = NULL;
		if ((rv = write_piece(c, sandbox_id, path, offset,
		         data != NULL ? (const uint8_t *)data + offset : NULL,
		         n, mode, make_parents, &info, errmsg)) != MOAT_OK)
			return rv;
		offset += n;
	} while (offset < len);
	if (out != NULL)
		*out = info;
	else
		moat_client_free_msg(info);
	return MOAT_OK;
}

/* fill: reads fd until buf is full or the end; *got set. */
static int
fill(int fd, uint8_t *buf, size_t cap, size_t *got)
{
	*got = 0;
	while (*got < cap) {
		ssize_t n = read(fd, buf + *got, cap - *got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		if (n == 0)
			break;
		*got += (size_t)n;
	}
	return 0;
}

int
moat_client_write_file_from_fd(struct moat_client *c, const char *sandbox_id,
    const char *path, int fd, uint32_t mode, bool make_parents,
    Moat__V1__FileInfo **out, char **errmsg)
{
	Moat__V1__FileInfo *info = NULL;
	uint8_t *buf;
	uint64_t offset = 0;
	size_t got;
	int rv, err;

	*errmsg = NULL;
	if (out != NULL)
		*out = NULL;
	if ((buf = malloc(MOAT_CLIENT_FILE_CHUNK)) == NULL) {
		*errmsg = moat_asprintf("out of memory copying to %s", path);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	do {
		if ((err = fill(fd, buf, MOAT_CLIENT_FILE_CHUNK, &got)) != 0) {
			*errmsg = moat_asprintf("reading the local file: %s",
			    strerror(err));
			rv = moat_status_from_errno(err);
			goto out;
		}
		/* Past the first piece, an empty read is the end. */
		if (got == 0 && offset != 0)
			break;
		moat_client_free_msg(info);
		info = NULL;
		if ((rv = write_piece(c, sandbox_id, path, offset, buf, got,
		         mode, make_parents, &info, errmsg)) != MOAT_OK)
			goto out;
		offset += got;
	} while (got == MOAT_CLIENT_FILE_CHUNK);
	rv = MOAT_OK;
	if (out != NULL) {
		*out = info;
		info = NULL;
	}
out:
	moat_client_free_msg(info);
	free(buf);
	return rv;
}

/* The last PutArchive chunk unpacks, the first GetArchive packs: in the
 * guest, at disk speed, so they get longer than the usual timeout. */
#define ARCHIVE_WORK_TIMEOUT_MS 600000

int
moat_client_put_archive_fd(struct moat_client *c, const char *sandbox_id,
    const char *path, int fd, Moat__V1__ArchivePutReply **out, char **errmsg)
{
	Moat__V1__ArchivePutReply *reply = NULL;
	char *upload_id = NULL;
	uint64_t offset = 0, size;
	struct stat st;
	uint8_t *buf;
	int rv = MOAT_OK;

	*errmsg = NULL;
	if (out != NULL)
		*out = NULL;
	if (fstat(fd, &st) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
		int err = errno;

		*errmsg = moat_asprintf("the archive: %s", strerror(err));
		return moat_status_from_errno(err);
	}
	size = (uint64_t)st.st_size;
	if ((buf = malloc(MOAT_CLIENT_ARCHIVE_CHUNK)) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	do {
		Moat__V1__ArchivePutRequest req =
		    MOAT__V1__ARCHIVE_PUT_REQUEST__INIT;
		size_t want = size - offset > MOAT_CLIENT_ARCHIVE_CHUNK ?
		    MOAT_CLIENT_ARCHIVE_CHUNK :
		    (size_t)(size - offset);
		size_t got;
		int err;

		if ((err = fill(fd, buf, want, &got)) != 0 || got != want) {
			*errmsg = moat_asprintf("reading the archive: %s",
			    err ? strerror(err) : "it shrank");
			rv = err ? moat_status_from_errno(err) : MOAT_ABORTED;
			break;
		}
		req.sandbox_id = (char *)sandbox_id;
		req.path = (char *)path;
		req.upload_id = upload_id ? upload_id : "";
		req.offset = offset;
		req.data.data = buf;
		req.data.len = got;
		req.last = offset + got == size;
		moat_client_free_msg(reply);
		reply = NULL;
		if ((rv = gw_call(c, "PutArchive", &req.base,
		         &moat__v1__archive_put_reply__descriptor, &reply,
		         req.last ? ARCHIVE_WORK_TIMEOUT_MS : 0, errmsg)) !=
		    MOAT_OK)
			break;
		free(upload_id);
		if ((upload_id = strdup(reply->upload_id)) == NULL) {
			*errmsg = moat_asprintf("out of memory");
			rv = MOAT_RESOURCE_EXHAUSTED;
			break;
		}
		offset += got;
	} while (offset < size);
	free(upload_id);
	free(buf);
	if (rv == MOAT_OK && out != NULL) {
		*out = reply;
		reply = NULL;
	}
	moat_client_free_msg(reply);
	return rv;
}

int
moat_client_get_archive_fd(struct moat_client *c, const char *sandbox_id,
    const char *path, int fd, uint64_t *size, char **errmsg)
{
	char *download_id = NULL;
	uint64_t offset = 0;
	int rv;

	*errmsg = NULL;
	for (;;) {
		Moat__V1__ArchiveGetRequest req =
		    MOAT__V1__ARCHIVE_GET_REQUEST__INIT;
		Moat__V1__ArchiveGetReply *reply = NULL;
		Moat__V1__FileData piece = MOAT__V1__FILE_DATA__INIT;
		bool done;

		req.sandbox_id = (char *)sandbox_id;
		req.path = (char *)path;
		req.download_id = download_id ? download_id : "";
		req.offset = offset;
		req.length = MOAT_CLIENT_ARCHIVE_CHUNK;
		if ((rv = gw_call(c, "GetArchive", &req.base,
		         &moat__v1__archive_get_reply__descriptor, &reply,
		         download_id ? 0 : ARCHIVE_WORK_TIMEOUT_MS, errmsg)) !=
		    MOAT_OK)
			break;
		piece.data = reply->data;
		if (piece.data.len > 0 &&
		    (rv = fd_sink_add(&fd, &piece, errmsg)) != MOAT_OK) {
			moat_client_free_msg(reply);
			break;
		}
		offset += reply->data.len;
		free(download_id);
		download_id = strdup(reply->download_id);
		/* An empty chunk short of eof would loop: the end. */
		done = reply->eof || reply->data.len == 0;
		moat_client_free_msg(reply);
		if (download_id == NULL) {
			*errmsg = moat_asprintf("out of memory");
			rv = MOAT_RESOURCE_EXHAUSTED;
			break;
		}
		if (done)
			break;
	}
	free(download_id);
	if (rv == MOAT_OK && size != NULL)
		*size = offset;
	return rv;
}

static int
path_call(struct moat_client *c, const char *method, const char *sandbox_id,
    const char *path, bool recursive, uint32_t mode, bool parents,
    const ProtobufCMessageDescriptor *reply_desc, void *out, char **errmsg)
{
	Moat__V1__PathRequest req = MOAT__V1__PATH_REQUEST__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.path = (char *)path;
	req.recursive = recursive;
	req.mode = mode;
	req.parents = parents;
	return gw_call(c, method, &req.base, reply_desc, out, 0, errmsg);
}

int
moat_client_list_files(struct moat_client *c, const char *sandbox_id,
    const char *path, Moat__V1__FileList **out, char **errmsg)
{
	return path_call(c, "ListFiles", sandbox_id, path, false, 0, false,
	    &moat__v1__file_list__descriptor, out, errmsg);
}

int
moat_client_stat(struct moat_client *c, const char *sandbox_id,
    const char *path, Moat__V1__FileInfo **out, char **errmsg)
{
	return path_call(c, "StatFile", sandbox_id, path, false, 0, false,
	    &moat__v1__file_info__descriptor, out, errmsg);
}

int
moat_client_remove(struct moat_client *c, const char *sandbox_id,
    const char *path, bool recursive, char **errmsg)
{
	return path_call(c, "RemoveFile", sandbox_id, path, recursive, 0,
	    false, &moat__v1__empty__descriptor, NULL, errmsg);
}

int
moat_client_mkdir(struct moat_client *c, const char *sandbox_id,
    const char *path, uint32_t mode, bool parents, Moat__V1__FileInfo **out,
    char **errmsg)
{
	return path_call(c, "MakeDir", sandbox_id, path, false, mode, parents,
	    &moat__v1__file_info__descriptor, out, errmsg);
}

/* ---- recorded sessions ---- */

int
moat_client_list_sessions(struct moat_client *c, const char *sandbox_id,
    const char *page_token, Moat__V1__ListSessionsReply **out, char **errmsg)
{
	Moat__V1__ListSessionsRequest req =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;

	if (sandbox_id != NULL)
		req.sandbox_id = (char *)sandbox_id;
	if (page_token != NULL)
		req.page_token = (char *)page_token;
	return gw_call(c, "ListSessions", &req.base,
	    &moat__v1__list_sessions_reply__descriptor, out, 0, errmsg);
}

int
moat_client_get_session(struct moat_client *c, const char *session_id,
    Moat__V1__SessionInfo **out, char **errmsg)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;

	req.session_id = (char *)session_id;
	return gw_call(c, "GetSession", &req.base,
	    &moat__v1__session_info__descriptor, out, 0, errmsg);
}

int
moat_client_get_session_tree(struct moat_client *c, const char *session_id,
    Moat__V1__SessionTreeReply **out, char **errmsg)
{
	Moat__V1__GetSessionTreeRequest req =
	    MOAT__V1__GET_SESSION_TREE_REQUEST__INIT;

	req.session_id = (char *)session_id;
	return gw_call(c, "GetSessionTree", &req.base,
	    &moat__v1__session_tree_reply__descriptor, out, 0, errmsg);
}

int
moat_client_list_steps(struct moat_client *c, const char *session_id,
    const char *page_token, bool include_outputs,
    Moat__V1__ListStepsReply **out, char **errmsg)
{
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;

	req.session_id = (char *)session_id;
	if (page_token != NULL)
		req.page_token = (char *)page_token;
	req.include_outputs = include_outputs;
	return gw_call(c, "ListSteps", &req.base,
	    &moat__v1__list_steps_reply__descriptor, out, 0, errmsg);
}

int
moat_client_diff(struct moat_client *c, const char *a, const char *b,
    Moat__V1__DiffReply **out, char **errmsg)
{
	Moat__V1__DiffRequest req = MOAT__V1__DIFF_REQUEST__INIT;

	req.session_a = (char *)a;
	req.session_b = (char *)b;
	return gw_call(c, "Diff", &req.base, &moat__v1__diff_reply__descriptor,
	    out, 0, errmsg);
}

int
moat_client_list_audit(struct moat_client *c, uint32_t limit,
    Moat__V1__ListAuditReply **out, char **errmsg)
{
	Moat__V1__ListAuditRequest req = MOAT__V1__LIST_AUDIT_REQUEST__INIT;

	req.limit = limit;
	return gw_call(c, "ListAudit", &req.base,
	    &moat__v1__list_audit_reply__descriptor, out, 0, errmsg);
}

int
moat_client_compare(struct moat_client *c, char *const *session_ids, size_t n,
    Moat__V1__CompareReply **out, char **errmsg)
{
	Moat__V1__CompareRequest req = MOAT__V1__COMPARE_REQUEST__INIT;

	req.session_ids = (char **)session_ids;
	req.n_session_ids = n;
	return gw_call(c, "Compare", &req.base,
	    &moat__v1__compare_reply__descriptor, out, 0, errmsg);
}

int
moat_client_export_session(struct moat_client *c, const char *session_id,
    bool as_json, Moat__V1__ExportSessionReply **out, char **errmsg)
{
	Moat__V1__ExportSessionRequest req =
	    MOAT__V1__EXPORT_SESSION_REQUEST__INIT;

	req.session_id = (char *)session_id;
	req.format = as_json ? MOAT__V1__EXPORT_FORMAT__EXPORT_FORMAT_JSON :
	                       MOAT__V1__EXPORT_FORMAT__EXPORT_FORMAT_MESSAGE;
	return gw_call(c, "ExportSession", &req.base,
	    &moat__v1__export_session_reply__descriptor, out, 0, errmsg);
}

int
moat_client_delete_session(struct moat_client *c, const char *session_id,
    Moat__V1__DeleteSessionReply **out, char **errmsg)
{
	Moat__V1__DeleteSessionRequest req =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;

	req.session_id = (char *)session_id;
	return gw_call(c, "DeleteSession", &req.base,
	    &moat__v1__delete_session_reply__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_CREATE_TIMEOUT_MS,
	    errmsg);
}

int
moat_client_set_step_keep(struct moat_client *c, const char *session_id,
    uint64_t index, bool keep, Moat__V1__Step **out, char **errmsg)
{
	Moat__V1__SetStepKeepRequest req =
	    MOAT__V1__SET_STEP_KEEP_REQUEST__INIT;

	req.session_id = (char *)session_id;
	req.index = index;
	req.keep = keep;
	return gw_call(c, "SetStepKeep", &req.base,
	    &moat__v1__step__descriptor, out, 0, errmsg);
}

int
moat_client_set_sandbox_timeout(struct moat_client *c,
    const Moat__V1__SetTimeoutRequest *req, Moat__V1__Sandbox **out,
    char **errmsg)
{
	return gw_call(c, "SetTimeout", &req->base,
	    &moat__v1__sandbox__descriptor, out, 0, errmsg);
}

/* ---- snapshots and time travel (issue 3) ---- */

int
moat_client_snapshot(struct moat_client *c, const char *sandbox_id,
    Moat__V1__LocalSnapshot **out, char **errmsg)
{
	Moat__V1__SnapshotSandboxRequest req =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;

	req.sandbox_id = (char *)sandbox_id;
	return gw_call(c, "SnapshotSandbox", &req.base,
	    &moat__v1__local_snapshot__descriptor, out, 0, errmsg);
}

int
moat_client_list_snapshots(struct moat_client *c,
    Moat__V1__LocalSnapshotList **out, char **errmsg)
{
	Moat__V1__ListLocalSnapshotsRequest req =
	    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;

	return gw_call(c, "ListLocalSnapshots", &req.base,
	    &moat__v1__local_snapshot_list__descriptor, out, 0, errmsg);
}

int
moat_client_delete_snapshot(struct moat_client *c, const char *snapshot_id,
    char **errmsg)
{
	Moat__V1__LocalSnapshotRef req = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	Moat__V1__Empty *out = NULL;
	int rv;

	req.snapshot_id = (char *)snapshot_id;
	rv = gw_call(c, "DeleteLocalSnapshot", &req.base,
	    &moat__v1__empty__descriptor, &out, 0, errmsg);
	moat_client_free_msg(out);
	return rv;
}

int
moat_client_gc_snapshots(struct moat_client *c, bool dry_run,
    uint32_t min_age_s, Moat__V1__GcSnapshotsReply **out, char **errmsg)
{
	Moat__V1__GcSnapshotsRequest req =
	    MOAT__V1__GC_SNAPSHOTS_REQUEST__INIT;

	req.dry_run = dry_run;
	req.min_age_s = min_age_s;
	return gw_call(c, "GcSnapshots", &req.base,
	    &moat__v1__gc_snapshots_reply__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_CREATE_TIMEOUT_MS,
	    errmsg);
}

int
moat_client_restore_step(struct moat_client *c,
    const Moat__V1__RestoreStepRequest *req, Moat__V1__RestoreStepReply **out,
    char **errmsg)
{
	return gw_call(c, "RestoreStep", &req->base,
	    &moat__v1__restore_step_reply__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_CREATE_TIMEOUT_MS,
	    errmsg);
}

int
moat_client_fork(struct moat_client *c, const Moat__V1__ForkRequest *req,
    Moat__V1__ForkReply **out, char **errmsg)
{
	return gw_call(c, "Fork", &req->base,
	    &moat__v1__fork_reply__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_CREATE_TIMEOUT_MS,
	    errmsg);
}

int
moat_client_replay(struct moat_client *c, const Moat__V1__ReplayRequest *req,
    Moat__V1__ReplayReply **out, char **errmsg)
{
	return gw_call(c, "Replay", &req->base,
	    &moat__v1__replay_reply__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_CREATE_TIMEOUT_MS,
	    errmsg);
}

/* ---- code contexts ---- */

int
moat_client_run_code(struct moat_client *c,
    const Moat__V1__RunCodeRequest *req, Moat__V1__RunCodeResult **out,
    char **errmsg)
{
	uint32_t t = req->timeout_ms != 0 ?
	    plus(base_timeout(c), req->timeout_ms) :
	    (c->timeout_set ? c->timeout_ms : EXEC_DEFAULT_TIMEOUT_MS);

	return gw_call(c, "RunCode", &req->base,
	    &moat__v1__run_code_result__descriptor, out, t, errmsg);
}

int
moat_client_close_context(struct moat_client *c, const char *sandbox_id,
    const char *context, char **errmsg)
{
	Moat__V1__CodeContextCall req = MOAT__V1__CODE_CONTEXT_CALL__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.context = (char *)(context ? context : "");
	return gw_call(c, "CloseCodeContext", &req.base,
	    &moat__v1__empty__descriptor, NULL, 0, errmsg);
}

/* ---- operating nodes (issue 15) ---- */

int
moat_client_cordon_node(struct moat_client *c, const char *node_id,
    bool cordoned, const char *reason, Moat__V1__Node **out, char **errmsg)
{
	Moat__V1__CordonNodeRequest req = MOAT__V1__CORDON_NODE_REQUEST__INIT;

	req.node_id = (char *)node_id;
	req.cordoned = cordoned;
	req.reason = (char *)(reason ? reason : "");
	return gw_call(c, "CordonNode", &req.base, &moat__v1__node__descriptor,
	    out, 0, errmsg);
}

int
moat_client_drain_node(struct moat_client *c, const char *node_id,
    const char *target, const char *reason, Moat__V1__DrainNodeReply **out,
    char **errmsg)
{
	Moat__V1__DrainNodeRequest req = MOAT__V1__DRAIN_NODE_REQUEST__INIT;

	req.node_id = (char *)node_id;
	req.target_node_id = (char *)(target ? target : "");
	req.reason = (char *)(reason ? reason : "");
	return gw_call(c, "DrainNode", &req.base,
	    &moat__v1__drain_node_reply__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_DRAIN_TIMEOUT_MS,
	    errmsg);
}

/* ---- images (issue 17) ---- */

int
moat_client_start_image_build(struct moat_client *c,
    const Moat__V1__ImageBuildRequest *req, Moat__V1__ImageBuild **out,
    char **errmsg)
{
	return gw_call(c, "StartImageBuild", &req->base,
	    &moat__v1__image_build__descriptor, out, 0, errmsg);
}

int
moat_client_get_image_build(struct moat_client *c, const char *build_id,
    const char *node_id, uint32_t from_step, uint32_t wait_ms,
    Moat__V1__ImageBuild **out, char **errmsg)
{
	Moat__V1__ImageBuildRef req = MOAT__V1__IMAGE_BUILD_REF__INIT;

	req.build_id = (char *)build_id;
	req.node_id = (char *)node_id;
	req.from_step = from_step;
	req.wait_ms = wait_ms;
	/* The wait is the gateway's and the node's: the call's deadline
	 * must outlast it. */
	return gw_call(c, "GetImageBuild", &req.base,
	    &moat__v1__image_build__descriptor, out,
	    plus(base_timeout(c), wait_ms), errmsg);
}

int
moat_client_list_images(struct moat_client *c, const char *name,
    Moat__V1__ImageList **out, char **errmsg)
{
	Moat__V1__ListImagesRequest req = MOAT__V1__LIST_IMAGES_REQUEST__INIT;

	req.name = (char *)(name ? name : "");
	return gw_call(c, "ListImages", &req.base,
	    &moat__v1__image_list__descriptor, out, 0, errmsg);
}

int
moat_client_push_image(struct moat_client *c, const char *name,
    const char *node_id, Moat__V1__ImageInfo **out, char **errmsg)
{
	Moat__V1__ImageRef req = MOAT__V1__IMAGE_REF__INIT;

	req.name = (char *)name;
	req.node_id = (char *)(node_id ? node_id : "");
	return gw_call(c, "PushImage", &req.base,
	    &moat__v1__image_info__descriptor, out,
	    c->timeout_set ? c->timeout_ms : MOAT_CLIENT_PUSH_TIMEOUT_MS,
	    errmsg);
}

int
moat_client_remove_image(struct moat_client *c, const char *name,
    Moat__V1__RemoveImageReply **out, char **errmsg)
{
	Moat__V1__ImageRef req = MOAT__V1__IMAGE_REF__INIT;

	req.name = (char *)name;
	return gw_call(c, "RemoveImage", &req.base,
	    &moat__v1__remove_image_reply__descriptor, out, 0, errmsg);
}
