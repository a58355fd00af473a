/*
 * api.c: the Firecracker REST API client (see api.h): libcurl over the
 * API's Unix socket, JSON with jansson, Firecracker's error body
 * ({"fault_message": "..."}) turned into a message a person can act on.
 * Not for: the order of calls or their contents (firecracker.c).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "moat/status.h"
#include "moat/util.h"
#include "api.h"

/* The reply body collected by curl; capped at MOAT_FC_API_MAX_REPLY. */
struct api_reply {
	char *text;
	size_t len;
	bool too_big;
};

static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static CURLcode api_init_rv = CURLE_FAILED_INIT;

static void
api_global_init(void)
{
	api_init_rv = curl_global_init(CURL_GLOBAL_NOTHING);
}

static size_t
api_on_body(char *ptr, size_t size, size_t nmemb, void *arg)
{
	struct api_reply *r = arg;
	size_t n = size * nmemb;
	char *grown;

	if (r->len + n > MOAT_FC_API_MAX_REPLY) {
		r->too_big = true;
		return 0; /* aborts the transfer */
	}
	if ((grown = realloc(r->text, r->len + n + 1)) == NULL)
		return 0;
	r->text = grown;
	memcpy(r->text + r->len, ptr, n);
	r->len += n;
	r->text[r->len] = '\0';
	return n;
}

/* The fault_message of an error body, or the body itself (trimmed) when
 * it is not the JSON the API promises. Heap; caller frees. */
static char *
api_fault_text(const struct api_reply *r)
{
	json_t *doc;
	json_t *fm;
	char *out;

	if (r->text == NULL || r->len == 0)
		return strdup("(no fault_message in the answer)");
	doc = json_loadb(r->text, r->len, 0, NULL);
	fm = doc ? json_object_get(doc, "fault_message") : NULL;
	if (json_is_string(fm))
		out = strdup(json_string_value(fm));
	else
		out = moat_asprintf("(not a Firecracker error body: %.200s)",
		    r->text);
	json_decref(doc);
	return out;
}

int
moat_fc_api_call(const char *socket_path, const char *method, const char *path,
    json_t *body, uint32_t timeout_ms, json_t **reply, char **errmsg)
{
	struct api_reply r = { 0 };
	struct curl_slist *headers = NULL;
	char curl_err[CURL_ERROR_SIZE] = "";
	char *url = NULL;
	char *body_text = NULL;
	char *fault = NULL;
	CURL *c = NULL;
	CURLcode crv;
	long code = 0;
	int rv;

	*errmsg = NULL;
	if (reply != NULL)
		*reply = NULL;
	pthread_once(&api_once, api_global_init);
	if (api_init_rv != CURLE_OK) {
		*errmsg = strdup("libcurl could not be initialised");
		return MOAT_INTERNAL;
	}
	url = moat_asprintf("http://localhost%s", path);
	if (body != NULL)
		body_text = json_dumps(body, JSON_COMPACT);
	if (url == NULL || (body != NULL && body_text == NULL) ||
	    (c = curl_easy_init()) == NULL) {
		*errmsg = strdup("out of memory for a Firecracker API call");
		rv = MOAT_INTERNAL;
		goto cleanup;
	}
	headers = curl_slist_append(headers, "Accept: application/json");
	if (headers != NULL && body_text != NULL)
		headers = curl_slist_append(headers,
		    "Content-Type: application/json");
	/* Firecracker's HTTP server does not do 100-continue. */
	if (headers != NULL)
		headers = curl_slist_append(headers, "Expect:");
	if (headers == NULL) {
		*errmsg = strdup("out of memory for a Firecracker API call");
		rv = MOAT_INTERNAL;
		goto cleanup;
	}
	curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, socket_path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, api_on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
	if (body_text != NULL) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body_text);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE,
		    (long)strlen(body_text));
	}
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);

	crv = curl_easy_perform(c);
	if (crv != CURLE_OK) {
		const char *why =
		    curl_err[0] ? curl_err : curl_easy_strerror(crv);

		if (r.too_big) {
			*errmsg = moat_asprintf("Firecracker's answer to %s "
			                        "%s is over %u bytes: refused",
			    method, path, MOAT_FC_API_MAX_REPLY);
			rv = MOAT_INTERNAL;
		} else if (crv == CURLE_OPERATION_TIMEDOUT) {
			*errmsg = moat_asprintf("Firecracker did not answer "
			                        "%s %s within %u ms on %s",
			    method, path, timeout_ms, socket_path);
			rv = MOAT_DEADLINE_EXCEEDED;
		} else if (crv == CURLE_COULDNT_CONNECT ||
		    crv == CURLE_GOT_NOTHING || crv == CURLE_RECV_ERROR ||
		    crv == CURLE_SEND_ERROR) {
			*errmsg = moat_asprintf(
			    "nothing answers on the "
			    "Firecracker API socket %s (%s %s: %s)",
			    socket_path, method, path, why);
			rv = MOAT_UNAVAILABLE;
		} else {
			*errmsg = moat_asprintf("Firecracker API call %s %s "
			                        "on %s failed: %s",
			    method, path, socket_path, why);
			rv = MOAT_INTERNAL;
		}
		goto cleanup;
	}
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	if (code >= 200 && code < 300) {
		if (code == 200 && reply != NULL && r.len > 0) {
			json_error_t jerr;

			*reply = json_loadb(r.text, r.len, 0, &jerr);
			if (*reply == NULL) {
				*errmsg = moat_asprintf(
				    "Firecracker answered "
				    "%s %s with JSON that does not parse: %s",
				    method, path, jerr.text);
				rv = MOAT_INTERNAL;
				goto cleanup;
			}
		}
		rv = MOAT_OK;
		goto cleanup;
	}
	fault = api_fault_text(&r);
	*errmsg = moat_asprintf("Firecracker refused %s %s (HTTP %ld): %s",
	    method, path, code, fault ? fault : "?");
	rv = code == 400 ? MOAT_FAILED_PRECONDITION : MOAT_INTERNAL;
cleanup:
	free(fault);
	free(r.text);
	free(body_text);
	free(url);
	curl_slist_free_all(headers);
	if (c != NULL)
		curl_easy_cleanup(c);
	if (rv != MOAT_OK && *errmsg == NULL)
		*errmsg = strdup("out of memory");
	return rv;
}
