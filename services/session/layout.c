/*
 * layout.c: how recordings lie in sessiond's LMDB environment, and the
 * reads of them. Sub-databases:
 *   sessions   id -> SessionInfo (packed)
 *   by_tenant  tenant NUL created(8) id -> ""        (listing, oldest first)
 *   by_sandbox tenant NUL sandbox NUL created(8) id -> ""
 *   steps      id index(8) -> Step without outputs and fs trace
 *   fs_traces  id index(8) -> FsTrace (guest.proto), when it has entries
 *   outputs    id index(8) stream(1) chunk(4) -> up to 64 KiB of output
 *   snapshot_refs tenant NUL snapshot_id -> references (8), see refs.c
 *   meta       "format" -> "2" (main.c)
 * Integers are big-endian so LMDB's byte order is numeric order; ids have
 * a fixed length so a session's keys share one prefix.
 * Not for: writes (writer.c) or checking requests (validate.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "guest.pb-c.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

const char *const sessiond_dbs[] = {
	"meta",
	"sessions",
	"by_tenant",
	"by_sandbox",
	"steps",
	"outputs",
	"fs_traces",
	"snapshot_refs",
	NULL,
};

static const char hexdigits[] = "0123456789abcdef";

void
sessiond_id_new(struct sessiond_id *id)
{
	uint8_t rnd[8];
	size_t got = 0;
	ssize_t n;

	while (got < sizeof(rnd)) {
		n = getrandom(rnd + got, sizeof(rnd) - got, 0);
		if (n > 0)
			got += (size_t)n;
		/* getrandom on Linux >= 3.17 only fails with EINTR here. */
	}
	memcpy(id->s, SESSIOND_ID_PREFIX, 4);
	for (size_t i = 0; i < sizeof(rnd); i++) {
		id->s[4 + 2 * i] = hexdigits[rnd[i] >> 4];
		id->s[5 + 2 * i] = hexdigits[rnd[i] & 15];
	}
	id->s[SESSIOND_ID_LEN] = '\0';
}

bool
sessiond_id_parse(const char *s, struct sessiond_id *id)
{
	if (s == NULL || strlen(s) != SESSIOND_ID_LEN ||
	    memcmp(s, SESSIOND_ID_PREFIX, 4) != 0)
		return false;
	for (size_t i = 4; i < SESSIOND_ID_LEN; i++)
		if (strchr(hexdigits, s[i]) == NULL || s[i] == '\0')
			return false;
	memcpy(id->s, s, SESSIOND_ID_LEN + 1);
	return true;
}

size_t
sessiond_key_step(uint8_t key[SESSIOND_ID_LEN + 8],
    const struct sessiond_id *id, uint64_t index)
{
	memcpy(key, id->s, SESSIOND_ID_LEN);
	moat_store_key_u64(key + SESSIOND_ID_LEN, index);
	return SESSIOND_ID_LEN + 8;
}

size_t
sessiond_key_output(uint8_t key[SESSIOND_ID_LEN + 13],
    const struct sessiond_id *id, uint64_t index, int stream, uint32_t chunk)
{
	uint8_t *p = key + sessiond_key_step(key, id, index);

	p[0] = (uint8_t)stream;
	p[1] = (uint8_t)(chunk >> 24);
	p[2] = (uint8_t)(chunk >> 16);
	p[3] = (uint8_t)(chunk >> 8);
	p[4] = (uint8_t)chunk;
	return SESSIOND_ID_LEN + 13;
}

/* key_index: <parts NUL>... created id; the caller checked lengths. */
static size_t
key_index(uint8_t *key, size_t cap, const char *a, const char *b,
    uint64_t created_ms, const struct sessiond_id *id, size_t *prefix_len)
{
	size_t la = strlen(a), lb = b ? strlen(b) : 0, n = 0;

	if (la + 1 + (b ? lb + 1 : 0) + SESSIOND_INDEX_SUFFIX > cap)
		abort(); /* programmer error: lengths are checked */
	memcpy(key, a, la + 1);
	n = la + 1;
	if (b != NULL) {
		memcpy(key + n, b, lb + 1);
		n += lb + 1;
	}
	if (prefix_len != NULL)
		*prefix_len = n;
	if (id == NULL)
		return n;
	moat_store_key_u64(key + n, created_ms);
	memcpy(key + n + 8, id->s, SESSIOND_ID_LEN);
	return n + SESSIOND_INDEX_SUFFIX;
}

size_t
sessiond_key_by_tenant(uint8_t *key, size_t cap, const char *tenant,
    uint64_t created_ms, const struct sessiond_id *id, size_t *prefix_len)
{
	return key_index(key, cap, tenant, NULL, created_ms, id, prefix_len);
}

size_t
sessiond_key_by_sandbox(uint8_t *key, size_t cap, const char *tenant,
    const char *sandbox, uint64_t created_ms, const struct sessiond_id *id,
    size_t *prefix_len)
{
	return key_index(key, cap, tenant, sandbox, created_ms, id,
	    prefix_len);
}

const char *
sessiond_label(const Moat__V1__SessionInfo *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (s->labels[i]->key != NULL &&
		    strcmp(s->labels[i]->key, key) == 0)
			return s->labels[i]->value;
	return NULL;
}

uint8_t *
sessiond_pack(const ProtobufCMessage *msg, size_t *len)
{
	size_t n = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf = malloc(n ? n : 1);

	if (buf == NULL)
		return NULL;
	*len = protobuf_c_message_pack(msg, buf);
	return buf;
}

void
sessiond_reply_move(ProtobufCMessage *reply, ProtobufCMessage *from)
{
	/* Same descriptor, so the same layout; the reply holds nothing on
	 * the heap yet. */
	memcpy(reply, from, from->descriptor->sizeof_message);
	free(from);
}

int
sessiond_session_load(struct moat_store_txn *txn, const char *tenant,
    const struct sessiond_id *id, Moat__V1__SessionInfo **out, char **errmsg)
{
	Moat__V1__SessionInfo *s;
	const void *val;
	size_t len;
	int rv;

	*out = NULL;
	rv = moat_store_get(txn, "sessions", id->s, SESSIOND_ID_LEN, &val,
	    &len, errmsg);
	if (rv != MOAT_OK && rv != MOAT_NOT_FOUND)
		return rv;
	s = rv == MOAT_OK ? moat__v1__session_info__unpack(NULL, len, val) :
	                    NULL;
	if (rv == MOAT_OK && s == NULL) {
		*errmsg =
		    moat_asprintf("session %s: its record does not "
		                  "decode (%zu bytes): the store is damaged",
		        id->s, len);
		return MOAT_DATA_LOSS;
	}
	/* Another tenant's session does not exist for this caller: the
	 * message is the same as for an absent one. */
	if (s == NULL || strcmp(s->tenant, tenant) != 0) {
		if (s != NULL)
			moat__v1__session_info__free_unpacked(s, NULL);
		*errmsg = moat_asprintf(
		    "session %s not found for tenant "
		    "\"%s\": ListSessions (moat session ls) shows the "
		    "tenant's sessions",
		    id->s, tenant);
		return MOAT_NOT_FOUND;
	}
	*out = s;
	return MOAT_OK;
}

struct output_read {
	uint8_t *buf;
	size_t cap;
	size_t used;
	bool overflow;
};

static int
output_visit(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct output_read *r = arg;

	if (vlen > r->cap - r->used) {
		r->overflow = true;
		return MOAT_STORE_SCAN_STOP;
	}
	memcpy(r->buf + r->used, val, vlen);
	r->used += vlen;
	return MOAT_OK;
}

/* output_load: the chunks of one stream into *out (heap, owned by the
 * step message afterwards). DATA_LOSS when they do not add up to the
 * recorded length. */
static int
output_load(struct moat_store_txn *txn, const struct sessiond_id *id,
    uint64_t index, int stream, uint64_t total, ProtobufCBinaryData *out,
    char **errmsg)
{
	uint8_t prefix[SESSIOND_ID_LEN + 13];
	struct output_read r = { 0 };
	int rv;

	out->len = 0;
	out->data = NULL;
	if (total == 0)
		return MOAT_OK;
	if (total > SIZE_MAX / 2 || (r.buf = malloc(total)) == NULL) {
		*errmsg = moat_asprintf("session %s step %llu: out of memory "
		                        "for %llu bytes of output",
		    id->s, (unsigned long long)index,
		    (unsigned long long)total);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	r.cap = total;
	sessiond_key_output(prefix, id, index, stream, 0);
	rv = moat_store_scan(txn, "outputs", prefix, SESSIOND_ID_LEN + 9, NULL,
	    0, output_visit, &r, errmsg);
	if (rv == MOAT_OK && (r.overflow || r.used != total)) {
		*errmsg = moat_asprintf(
		    "session %s step %llu: %s holds %s "
		    "than the %llu bytes recorded: the store is damaged",
		    id->s, (unsigned long long)index,
		    stream ? "stderr" : "stdout", r.overflow ? "more" : "less",
		    (unsigned long long)total);
		rv = MOAT_DATA_LOSS;
	}
	if (rv != MOAT_OK) {
		free(r.buf);
		return rv;
	}
	out->data = r.buf;
	out->len = total;
	return MOAT_OK;
}

int
sessiond_step_load(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *session, uint64_t index, bool omit_outputs,
    Moat__V1__Step **out, char **errmsg)
{
	uint8_t key[SESSIOND_ID_LEN + 8];
	struct sessiond_id id;
	Moat__V1__Step *step = NULL;
	Moat__V1__FsTrace *trace;
	const void *val;
	size_t len;
	int rv;

	*out = NULL;
	if (!sessiond_id_parse(session->id, &id)) {
		*errmsg = moat_asprintf("session record \"%s\" has a bad id: "
		                        "the store is damaged",
		    session->id);
		return MOAT_DATA_LOSS;
	}
	sessiond_key_step(key, &id, index);
	rv =
	    moat_store_get(txn, "steps", key, sizeof(key), &val, &len, errmsg);
	if (rv == MOAT_NOT_FOUND) {
		if (session->step_count == 0)
			*errmsg = moat_asprintf("session %s has no steps yet "
			                        "(step %llu asked)",
			    id.s, (unsigned long long)index);
		else
			*errmsg = moat_asprintf(
			    "session %s has no step %llu: "
			    "its steps are 1 to %llu (ListSteps lists them)",
			    id.s, (unsigned long long)index,
			    (unsigned long long)session->step_count);
		return MOAT_NOT_FOUND;
	}
	if (rv != MOAT_OK)
		return rv;
	if ((step = moat__v1__step__unpack(NULL, len, val)) == NULL) {
		*errmsg =
		    moat_asprintf("session %s step %llu: its record "
		                  "does not decode: the store is damaged",
		        id.s, (unsigned long long)index);
		return MOAT_DATA_LOSS;
	}
	rv = moat_store_get(txn, "fs_traces", key, sizeof(key), &val, &len,
	    errmsg);
	if (rv == MOAT_OK) {
		if ((trace = moat__v1__fs_trace__unpack(NULL, len, val)) ==
		    NULL) {
			*errmsg = moat_asprintf(
			    "session %s step %llu: its fs "
			    "trace does not decode: the store is damaged",
			    id.s, (unsigned long long)index);
			rv = MOAT_DATA_LOSS;
			goto fail;
		}
		/* Move the entries into the step. */
		step->fs_trace = trace->entries;
		step->n_fs_trace = trace->n_entries;
		trace->entries = NULL;
		trace->n_entries = 0;
		moat__v1__fs_trace__free_unpacked(trace, NULL);
	} else if (rv != MOAT_NOT_FOUND) {
		goto fail;
	}
	if (omit_outputs) {
		step->outputs_omitted = true;
	} else if ((rv = output_load(txn, &id, index, 0, step->stdout_bytes,
	                &step->stdout, errmsg)) != MOAT_OK ||
	    (rv = output_load(txn, &id, index, 1, step->stderr_bytes,
	         &step->stderr, errmsg)) != MOAT_OK) {
		goto fail;
	}
	*out = step;
	return MOAT_OK;

fail:
	moat__v1__step__free_unpacked(step, NULL);
	return rv;
}

char *
sessiond_token_encode(const uint8_t *bytes, size_t len)
{
	char *s = malloc(2 * len + 1);

	if (s == NULL)
		return NULL;
	for (size_t i = 0; i < len; i++) {
		s[2 * i] = hexdigits[bytes[i] >> 4];
		s[2 * i + 1] = hexdigits[bytes[i] & 15];
	}
	s[2 * len] = '\0';
	return s;
}

static int
hexval(char c)
{
	const char *p = c ? strchr(hexdigits, c) : NULL;

	return p ? (int)(p - hexdigits) : -1;
}

bool
sessiond_token_decode(const char *token, uint8_t *bytes, size_t len)
{
	if (strlen(token) != 2 * len)
		return false;
	for (size_t i = 0; i < len; i++) {
		int hi = hexval(token[2 * i]), lo = hexval(token[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		bytes[i] = (uint8_t)(hi << 4 | lo);
	}
	return true;
}
