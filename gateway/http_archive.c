/*
 * http_archive.c: directories in and out through the HTTP door (issue
 * 17; http_archive.h). PUT /v1/sandboxes/{id}/files?path=DIR&archive=tar
 * cuts its tar body into PutArchive chunks of at most 4 MiB as the body
 * arrives, so the door never holds more than one chunk of it, and sends
 * the last with `last` set: the guest checks the whole archive then and
 * unpacks it, or writes nothing. GET ...?path=P&archive=tar answers
 * application/x-tar read chunk by chunk from GetArchive as the client
 * reads. Both are capped by [gateway] archive-max-mib (413).
 * Not for: checking or unpacking archives (the guest agent does), nor
 * the plain files routes (http.c's WriteFile/ReadFile).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <microhttpd.h>

#include "gateway.h"
#include "http_archive.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "vm.pb-c.h"

/* One upload in progress: the chunk being filled and what the guest
 * acknowledged so far. */
struct moat_http_archive_put {
	struct moat_http *h;
	char *sandbox_id, *path, *auth;
	uint32_t timeout_ms; /* X-Moat-Timeout-Ms; 0: none was given */
	uint64_t max_bytes;
	uint64_t received; /* body bytes so far */
	uint64_t sent;     /* of them, acknowledged by PutArchive */
	char *upload_id;   /* the guest's, from the first reply */
	uint8_t *buf; /* the chunk being filled, MOAT_HTTP_ARCHIVE_CHUNK */
	size_t len;
	int code;        /* the first failure; MOAT_OK: none */
	unsigned status; /* its HTTP status; 0: the code's */
	char *errmsg;
	Moat__V1__ArchivePutReply *done; /* the last chunk's reply */
};

/* One download being sent: the chunk in hand and where it ends. */
struct archive_get {
	struct moat_http *h;
	char *sandbox_id, *path, *auth, *download_id;
	uint32_t timeout_ms;
	Moat__V1__ArchiveGetReply *cur; /* the chunk being sent */
	size_t cur_sent;
	uint64_t offset; /* archive bytes fetched, cur's included */
	uint64_t size;   /* the whole archive's, from the first reply */
	bool eof;
};

struct query_check {
	const char *path, *archive;
	char *bad; /* heap: the first key that is neither */
};

static enum MHD_Result
query_key(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct query_check *q = cls;

	(void)kind;
	if (strcmp(key, "path") == 0)
		q->path = value;
	else if (strcmp(key, "archive") == 0)
		q->archive = value;
	else if (q->bad == NULL)
		q->bad = strdup(key);
	return MHD_YES;
}

/* archive_query: the request's path, when its query is archive=tar and
 * a path and nothing else; NULL with *errmsg (heap) saying what to send
 * otherwise. */
static const char *
archive_query(struct MHD_Connection *conn, bool put, char **errmsg)
{
	struct query_check q = { 0 };

	MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, query_key, &q);
	if (q.bad != NULL) {
		*errmsg =
		    moat_asprintf("?%s is not an argument of the "
		                  "archive form: send ?path=%s&archive=tar "
		                  "and nothing else",
		        q.bad, put ? "DIR" : "PATH");
		free(q.bad);
		return NULL;
	}
	if (q.archive == NULL || strcmp(q.archive, "tar") != 0) {
		*errmsg = moat_asprintf("archive=%s is not a format the door "
		                        "knows: send archive=tar (a POSIX or "
		                        "GNU tar, not compressed)",
		    q.archive ? q.archive : "");
		return NULL;
	}
	if (q.path == NULL || q.path[0] == '\0') {
		*errmsg = moat_asprintf(put ?
		        "give ?path=DIR: the sandbox directory the archive "
		        "is unpacked into (made if missing)" :
		        "give ?path=PATH: the sandbox directory (or file) to "
		        "pack");
		return NULL;
	}
	return q.path;
}

bool
moat_http_archive_asked(struct MHD_Connection *conn)
{
	return MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND,
	           "archive") != NULL;
}

/* call_opts: the key (copied), and the timeout the client set (0: none),
 * of the request. */
static int
call_opts(struct MHD_Connection *conn, char **auth, uint32_t *timeout_ms,
    char **errmsg)
{
	const char *key;
	uint64_t rid = 0, timeout = 0;
	int rv;

	if ((rv = moat_http_request_opts(conn, &key, &rid, &timeout,
	         errmsg)) != MOAT_OK)
		return rv;
	*timeout_ms = (uint32_t)timeout;
	if ((*auth = strdup(key)) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}

/* over_cap: the message of an archive over the cap. */
static char *
over_cap(uint64_t max_bytes, bool put)
{
	return moat_asprintf(
	    "the archive is larger than [gateway] archive-max-mib (%llu "
	    "MiB)%s: copy the directory in parts, or raise archive-max-mib",
	    (unsigned long long)(max_bytes >> 20),
	    put ? "; nothing was unpacked" : "");
}

/* ---- PUT: the body into PutArchive chunks ---- */

/* put_fail: the upload's first failure; later ones are its echoes. */
static void
put_fail(struct moat_http_archive_put *p, unsigned status, int code,
    char *errmsg)
{
	if (p->code != MOAT_OK) {
		free(errmsg);
		return;
	}
	p->code = code;
	p->status = status;
	p->errmsg = errmsg;
}

/* put_chunk: the chunk filled so far to PutArchive at the offset the
 * guest acknowledged, `last` or not; the reply checked against it. */
static void
put_chunk(struct moat_http_archive_put *p, bool last)
{
	Moat__V1__ArchivePutRequest q = MOAT__V1__ARCHIVE_PUT_REQUEST__INIT;
	Moat__V1__ArchivePutReply *r;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	uint32_t timeout = p->timeout_ms;
	int rv;

	q.sandbox_id = p->sandbox_id;
	q.path = p->path;
	q.upload_id = p->upload_id ? p->upload_id : "";
	q.offset = p->sent;
	q.data.data = p->buf;
	q.data.len = p->len;
	q.last = last;
	if (last && timeout == 0)
		timeout = MOAT_HTTP_ARCHIVE_PACK_MS;
	/* Each chunk is its own call with its own request id: a mutating
	 * id is answered once, from the gateway's cache after that. */
	if ((rv = moat_http_call(p->h, p->auth, 0, timeout, "PutArchive",
	         &q.base, &reply, &errmsg)) != MOAT_OK) {
		put_fail(p, 0, rv, errmsg);
		return;
	}
	r = (Moat__V1__ArchivePutReply *)reply;
	if (p->upload_id == NULL && r->upload_id != NULL &&
	    r->upload_id[0] != '\0')
		p->upload_id = strdup(r->upload_id);
	if ((p->upload_id == NULL && !last) ||
	    r->received != p->sent + p->len || (last && !r->done)) {
		put_fail(p, 0, MOAT_INTERNAL,
		    moat_asprintf("the sandbox's PutArchive answered upload "
		                  "\"%s\", %llu bytes received%s after %llu "
		                  "were sent: the archive was not unpacked; "
		                  "retry the upload",
		        r->upload_id ? r->upload_id : "",
		        (unsigned long long)r->received,
		        last && !r->done ? " and not done" : "",
		        (unsigned long long)(p->sent + p->len)));
		protobuf_c_message_free_unpacked(reply, NULL);
		return;
	}
	p->sent += p->len;
	p->len = 0;
	if (last)
		p->done = r;
	else
		protobuf_c_message_free_unpacked(reply, NULL);
}

bool
moat_http_archive_put_begin(struct moat_http *h, struct MHD_Connection *conn,
    const char *sandbox_id, uint64_t max_bytes,
    struct moat_http_archive_put **out, enum MHD_Result *ret)
{
	const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_CONTENT_LENGTH);
	struct moat_http_archive_put *p;
	const char *path;
	char *errmsg = NULL;
	unsigned status = 0;
	int rv = MOAT_INVALID_ARGUMENT;

	*out = NULL;
	if ((path = archive_query(conn, true, &errmsg)) == NULL)
		goto refuse;
	/* Refused before a byte of it is read. */
	if (cl != NULL && strtoull(cl, NULL, 10) > max_bytes) {
		errmsg = over_cap(max_bytes, true);
		rv = MOAT_RESOURCE_EXHAUSTED;
		status = MHD_HTTP_CONTENT_TOO_LARGE;
		goto refuse;
	}
	if ((p = calloc(1, sizeof(*p))) == NULL ||
	    (p->buf = malloc(MOAT_HTTP_ARCHIVE_CHUNK)) == NULL ||
	    (p->sandbox_id = strdup(sandbox_id)) == NULL ||
	    (p->path = strdup(path)) == NULL) {
		moat_http_archive_put_free(p);
		errmsg = moat_asprintf("out of memory starting the upload");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto refuse;
	}
	p->h = h;
	p->max_bytes = max_bytes;
	if ((rv = call_opts(conn, &p->auth, &p->timeout_ms, &errmsg)) !=
	    MOAT_OK) {
		moat_http_archive_put_free(p);
		goto refuse;
	}
	*out = p;
	return false;

refuse:
	*ret = moat_http_error(conn, status, rv, errmsg);
	free(errmsg);
	return true;
}

void
moat_http_archive_put_data(struct moat_http_archive_put *p, const char *data,
    size_t n)
{
	if (p->code != MOAT_OK)
		return;
	p->received += n;
	if (p->received > p->max_bytes) {
		put_fail(p, MHD_HTTP_CONTENT_TOO_LARGE,
		    MOAT_RESOURCE_EXHAUSTED, over_cap(p->max_bytes, true));
		return;
	}
	/* A full chunk goes once more comes, so that the body's end always
	 * finds data for the `last` chunk. */
	while (n > 0 && p->code == MOAT_OK) {
		size_t k = MOAT_HTTP_ARCHIVE_CHUNK - p->len;

		if (k == 0) {
			put_chunk(p, false);
			continue;
		}
		if (k > n)
			k = n;
		memcpy(p->buf + p->len, data, k);
		p->len += k;
		data += k;
		n -= k;
	}
}

enum MHD_Result
moat_http_archive_put_end(struct moat_http_archive_put *p,
    struct MHD_Connection *conn)
{
	if (p->code == MOAT_OK && p->received == 0)
		put_fail(p, 0, MOAT_INVALID_ARGUMENT,
		    moat_asprintf("the body is empty: send a tar archive of "
		                  "the directory (tar -cf - -C DIR .)"));
	if (p->code == MOAT_OK)
		put_chunk(p, true);
	if (p->code != MOAT_OK)
		return moat_http_error(conn, p->status, p->code, p->errmsg);
	return moat_http_reply(conn, &p->done->base);
}

void
moat_http_archive_put_free(struct moat_http_archive_put *p)
{
	if (p == NULL)
		return;
	if (p->done != NULL)
		protobuf_c_message_free_unpacked(&p->done->base, NULL);
	free(p->sandbox_id);
	free(p->path);
	free(p->auth);
	free(p->upload_id);
	free(p->buf);
	free(p->errmsg);
	free(p);
}

/* ---- GET: GetArchive's chunks as the body ---- */

static void
get_free(void *cls)
{
	struct archive_get *g = cls;

	if (g == NULL)
		return;
	if (g->cur != NULL)
		protobuf_c_message_free_unpacked(&g->cur->base, NULL);
	free(g->sandbox_id);
	free(g->path);
	free(g->auth);
	free(g->download_id);
	free(g);
}

/* get_next: the next chunk into g->cur (the first when no download id
 * is known yet), checked: the same download, more bytes unless it ends,
 * never past the size the first one gave. A status with *errmsg. */
static int
get_next(struct archive_get *g, char **errmsg)
{
	Moat__V1__ArchiveGetRequest q = MOAT__V1__ARCHIVE_GET_REQUEST__INIT;
	Moat__V1__ArchiveGetReply *r;
	ProtobufCMessage *reply = NULL;
	bool first = g->download_id == NULL;
	uint32_t timeout = g->timeout_ms;
	int rv;

	q.sandbox_id = g->sandbox_id;
	q.path = g->path;
	q.download_id = first ? "" : g->download_id;
	q.offset = g->offset;
	q.length = MOAT_HTTP_ARCHIVE_CHUNK;
	if (first && timeout == 0)
		timeout = MOAT_HTTP_ARCHIVE_PACK_MS;
	if ((rv = moat_http_call(g->h, g->auth, 0, timeout, "GetArchive",
	         &q.base, &reply, errmsg)) != MOAT_OK)
		return rv;
	r = (Moat__V1__ArchiveGetReply *)reply;
	if (first) {
		g->size = r->size;
		g->download_id = strdup(r->download_id ? r->download_id : "");
	}
	if (g->download_id == NULL ||
	    (!first && strcmp(g->download_id, r->download_id) != 0) ||
	    (r->data.len == 0 && !r->eof) ||
	    (g->size != 0 && g->offset + r->data.len > g->size)) {
		*errmsg = moat_asprintf("the sandbox's GetArchive answered "
		                        "download \"%s\" with %zu bytes at "
		                        "%llu of %llu%s: retry the download",
		    r->download_id ? r->download_id : "", r->data.len,
		    (unsigned long long)g->offset, (unsigned long long)g->size,
		    r->eof ? " (the end)" : "");
		protobuf_c_message_free_unpacked(reply, NULL);
		return MOAT_INTERNAL;
	}
	if (g->cur != NULL)
		protobuf_c_message_free_unpacked(&g->cur->base, NULL);
	g->cur = r;
	g->cur_sent = 0;
	g->offset += r->data.len;
	g->eof = r->eof;
	return MOAT_OK;
}

/* get_read: libmicrohttpd's content reader: the chunk in hand, then the
 * next one (this connection's thread waits for it). A failure past the
 * headers can only cut the body short: the client sees fewer bytes
 * than Content-Length says. */
static ssize_t
get_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct archive_get *g = cls;
	char *errmsg = NULL;
	size_t n;

	(void)pos;
	while (g->cur_sent == g->cur->data.len) {
		if (g->eof)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (get_next(g, &errmsg) != MOAT_OK) {
			moat_warn(0,
			    "http-archive-get sandbox %s path %s: cut after "
			    "%llu of %llu bytes: %s",
			    g->sandbox_id, g->path,
			    (unsigned long long)g->offset,
			    (unsigned long long)g->size, errmsg ? errmsg : "");
			free(errmsg);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
	n = g->cur->data.len - g->cur_sent;
	if (n > max)
		n = max;
	memcpy(buf, g->cur->data.data + g->cur_sent, n);
	g->cur_sent += n;
	return (ssize_t)n;
}

enum MHD_Result
moat_http_archive_get(struct moat_http *h, struct MHD_Connection *conn,
    const char *sandbox_id, uint64_t max_bytes)
{
	struct archive_get *g = NULL;
	struct MHD_Response *resp;
	const char *path;
	char *errmsg = NULL;
	unsigned status = 0;
	enum MHD_Result ret;
	int rv = MOAT_INVALID_ARGUMENT;

	if ((path = archive_query(conn, false, &errmsg)) == NULL)
		goto fail;
	if ((g = calloc(1, sizeof(*g))) == NULL ||
	    (g->sandbox_id = strdup(sandbox_id)) == NULL ||
	    (g->path = strdup(path)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		errmsg = moat_asprintf("out of memory");
		goto fail;
	}
	g->h = h;
	if ((rv = call_opts(conn, &g->auth, &g->timeout_ms, &errmsg)) !=
	        MOAT_OK ||
	    (rv = get_next(g, &errmsg)) != MOAT_OK)
		goto fail;
	if (g->size > max_bytes || g->offset > max_bytes) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		status = MHD_HTTP_CONTENT_TOO_LARGE;
		errmsg = over_cap(max_bytes, false);
		goto fail;
	}
	/* Content-Length is the guest's size: a body cut short shows. */
	resp =
	    MHD_create_response_from_callback(g->size != 0 ? g->size :
	                                                     MHD_SIZE_UNKNOWN,
	        65536, get_read, g, get_free);
	if (resp == NULL) {
		get_free(g);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
	    "application/x-tar");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
	    "no-cache");
	moat_http_cors(conn, resp);
	ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;

fail:
	get_free(g);
	ret = moat_http_error(conn, status, rv, errmsg);
	free(errmsg);
	return ret;
}

/* ---- OpenAPI ---- */

#define ARCHIVE_PARAM_NOTE                                                    \
	"tar: the directory as a tar archive (issue 17). PUT: the body is "   \
	"a tar archive (Content-Length or chunked, at most [gateway] "        \
	"archive-max-mib, else 413) unpacked into `path` (made if missing) "  \
	"once it all arrived and passed the guest's checks (no names "        \
	"outside `path`, no device nodes or fifos, symlinks kept as links): " \
	"a refused archive writes nothing; the reply is an "                  \
	"ArchivePutReply (files, dirs, symlinks, bytes). GET: `path` (a "     \
	"directory or a file) packed as application/x-tar, streamed with "    \
	"its Content-Length; a body shorter than that is a failed "           \
	"download. With archive, only path and archive may be given."

void
moat_http_archive_openapi(json_t *paths)
{
	json_t *item = json_object_get(paths, "/v1/sandboxes/{id}/files");
	json_t *get = json_object_get(item, "get");
	json_t *put = json_object_get(item, "put");
	json_t *tar = json_pack("{s:{s:s, s:s}}", "schema", "type", "string",
	    "format", "binary");
	json_t *ok, *json, *schema;

	if (get == NULL || put == NULL || tar == NULL) {
		json_decref(tar);
		return;
	}
	for (int i = 0; i < 2; i++)
		json_array_append_new(json_object_get(i ? put : get,
		                          "parameters"),
		    json_pack("{s:s, s:s, s:b, s:{s:s, s:[s]}, s:s}", "name",
		        "archive", "in", "query", "required", 0, "schema",
		        "type", "string", "enum", "tar", "description",
		        ARCHIVE_PARAM_NOTE));
	/* GET: the archive's bytes beside the file's. */
	ok = json_object_get(json_object_get(get, "responses"), "200");
	json_object_set(json_object_get(ok, "content"), "application/x-tar",
	    tar);
	json_object_set_new(ok, "description",
	    json_string("the file's bytes; with archive=tar, the tar "
	                "archive of path"));
	/* PUT: a raw body, and either reply. */
	json_object_set_new(put, "requestBody",
	    json_pack("{s:s, s:{s:O, s:O}}", "description",
	        "the file's bytes (its data); with archive=tar, a tar archive",
	        "content", "application/octet-stream", tar,
	        "application/x-tar", tar));
	ok = json_object_get(json_object_get(put, "responses"), "200");
	json = json_object_get(json_object_get(ok, "content"),
	    "application/json");
	schema = json_object_get(json, "schema");
	if (schema != NULL)
		json_object_set_new(json, "schema",
		    json_pack("{s:[O, {s:s}]}", "oneOf", schema, "$ref",
		        "#/components/schemas/moat.v1.ArchivePutReply"));
	json_object_set_new(ok, "description",
	    json_string("the FileInfo written; with archive=tar, the "
	                "ArchivePutReply"));
	json_decref(tar);
}
