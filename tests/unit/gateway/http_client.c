/*
 * http_client.c: the test client of http_client.h: one libcurl easy
 * handle per request, its body and headers collected into a
 * struct http_client_resp, a chunked upload written from a counter (or
 * from the request's body); and
 * the poll of the gateway's node table for the fake node.
 * Not for: anything but tests; no connection is reused between requests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "gateway.h"
#include "http_client.h"

/* One transfer in flight: what the callbacks write to and read from. */
struct transfer {
	const struct http_client_req *req;
	struct http_client_resp *r;
	size_t chunked_left; /* bytes of the upload still to send */
	bool cut;            /* the body reached req->stop_at */
};

static size_t
on_body(char *data, size_t size, size_t n, void *cls)
{
	struct transfer *t = cls;
	struct http_client_resp *r = t->r;
	char *nb = realloc(r->body, r->len + size * n + 1);

	if (nb == NULL)
		return 0;
	memcpy(nb + r->len, data, size * n);
	r->body = nb;
	r->len += size * n;
	r->body[r->len] = '\0';
	if (t->req->stop_at != NULL &&
	    strstr(r->body, t->req->stop_at) != NULL) {
		t->cut = true;
		return 0;
	}
	return size * n;
}

/* header_value: copies the value of header `name` in data to out, when
 * data is that header. */
static void
header_value(const char *data, size_t len, const char *name, char *out,
    size_t size)
{
	size_t n = strlen(name), start, end = len;

	if (len <= n + 1 || strncasecmp(data, name, n) != 0 || data[n] != ':')
		return;
	start = n + 1;
	while (start < end && data[start] == ' ')
		start++;
	while (end > start && (data[end - 1] == '\r' || data[end - 1] == '\n'))
		end--;
	snprintf(out, size, "%.*s", (int)(end - start), data + start);
}

static size_t
on_header(char *data, size_t size, size_t n, void *cls)
{
	struct transfer *t = cls;

	header_value(data, size * n, "Mcp-Session-Id", t->r->session,
	    sizeof(t->r->session));
	header_value(data, size * n, "Allow", t->r->allow,
	    sizeof(t->r->allow));
	header_value(data, size * n, "Retry-After", t->r->retry_after,
	    sizeof(t->r->retry_after));
	header_value(data, size * n, "WWW-Authenticate",
	    t->r->www_authenticate, sizeof(t->r->www_authenticate));
	header_value(data, size * n, "Access-Control-Allow-Origin",
	    t->r->cors_origin, sizeof(t->r->cors_origin));
	header_value(data, size * n, "Access-Control-Expose-Headers",
	    t->r->cors_expose, sizeof(t->r->cors_expose));
	return size * n;
}

/* on_read: the next piece of the chunked upload: all 'x', or the
 * request's body. */
static size_t
on_read(char *buf, size_t size, size_t n, void *cls)
{
	struct transfer *t = cls;
	size_t want = size * n;

	if (want > t->chunked_left)
		want = t->chunked_left;
	if (t->req->body_chunked)
		memcpy(buf,
		    t->req->body + (t->req->body_len - t->chunked_left), want);
	else
		memset(buf, 'x', want);
	t->chunked_left -= want;
	return want;
}

void
http_client_request(uint16_t port, const struct http_client_req *req,
    struct http_client_resp *r)
{
	struct transfer t = { .req = req, .r = r };
	CURL *c = curl_easy_init();
	struct curl_slist *hdrs = NULL;
	char url[512], line[512], *ct = NULL;
	const struct http_client_header *h;
	CURLcode cc;

	memset(r, 0, sizeof(*r));
	assert_non_null(c);
	snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", port, req->path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	if (req->json_type)
		hdrs = curl_slist_append(hdrs,
		    "Content-Type: "
		    "application/json");
	if (req->body != NULL && req->body_chunked) {
		t.chunked_left = req->body_len;
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &t);
		hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
	} else if (req->body != NULL) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
		    (curl_off_t)req->body_len);
	} else if (req->chunked > 0) {
		t.chunked_left = req->chunked;
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &t);
		hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
	}
	for (h = req->headers; h != NULL && h->name != NULL; h++) {
		if (h->value == NULL)
			continue;
		snprintf(line, sizeof(line), "%s: %s", h->name, h->value);
		hdrs = curl_slist_append(hdrs, line);
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
	cc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
	if (ct != NULL)
		snprintf(r->content_type, sizeof(r->content_type), "%s", ct);
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(c);
	/* The door may answer 413 and close before the upload ends; the
	 * answer is what counts. A cut at stop_at is the test's own. */
	if (cc != CURLE_OK && !(cc == CURLE_SEND_ERROR && r->status != 0) &&
	    !(cc == CURLE_WRITE_ERROR && t.cut))
		fail_msg("%s %s: %s", req->method, req->path,
		    curl_easy_strerror(cc));
	if (r->body != NULL &&
	    strcmp(r->content_type, "application/json") == 0)
		r->json = json_loadb(r->body, r->len, JSON_DECODE_ANY, NULL);
}

void
http_client_resp_free(struct http_client_resp *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof(*r));
}

void
http_client_wait_node(struct moat_gateway *gw)
{
	for (int i = 0; i < 200; i++) {
		Moat__V1__Node **nodes = NULL;
		size_t n = 0;
		bool seen;

		assert_int_equal(moat_nodes_snapshot(moat_gateway_nodes(gw),
		                     &nodes, &n),
		    MOAT_OK);
		seen = n > 0 && nodes[0]->available;
		moat_nodes_snapshot_free(nodes, n);
		if (seen)
			return;
		nng_msleep(20);
	}
	fail_msg("the gateway never saw the fake node");
}
