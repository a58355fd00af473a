/*
 * api.h: the Firecracker REST API client: one HTTP/1.1 request with a
 * JSON body over the VMM's Unix socket (libcurl with
 * CURLOPT_UNIX_SOCKET_PATH), its answer checked against what the API
 * promises (204 for PUT/PATCH, 200 with JSON for GET, a `fault_message`
 * otherwise). Not for: deciding what to configure (firecracker.c) or
 * waiting for the socket to appear (the caller retries on UNAVAILABLE).
 */
#ifndef MOAT_FC_API_H
#define MOAT_FC_API_H

#include <stdint.h>

#include <jansson.h>

/* The most of an answer body kept; Firecracker's are a few hundred bytes,
 * a larger one is refused rather than grown without limit. */
#define MOAT_FC_API_MAX_REPLY (64u * 1024u)

/* moat_fc_api_call: sends `method` (GET, PUT, PATCH) to `path` ("/vm")
 * on the API socket `socket_path`, with `body` as JSON (borrowed; NULL
 * sends no body), waiting at most `timeout_ms`. Thread-safe: each call
 * uses its own curl handle.
 * Returns MOAT_OK on a 2xx answer and sets *reply (when reply is not
 * NULL) to the parsed JSON body of a 200 (caller json_decref()s) or NULL.
 * Otherwise returns a status and sets *errmsg (heap, caller frees):
 * MOAT_UNAVAILABLE when nothing answers on the socket (not started yet, or
 * gone), MOAT_FAILED_PRECONDITION for a 400 (Firecracker's
 * `fault_message` quoted in the message), MOAT_DEADLINE_EXCEEDED on
 * timeout, MOAT_INTERNAL for other answers. *reply is NULL on failure. */
int moat_fc_api_call(const char *socket_path, const char *method,
    const char *path, json_t *body, uint32_t timeout_ms, json_t **reply,
    char **errmsg) __attribute__((warn_unused_result));

#endif
