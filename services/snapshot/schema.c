/*
 * schema.c: moat-snapd's LMDB layout (described in snapd.h): keys that
 * start with the tenant, chunk data cut in pieces that fit LMDB's pages,
 * reference records, per-tenant counters, and manifests stored packed and
 * cut in pieces. Every read of a chunk is checked against its SHA-256.
 * Not for: deciding when to write (handlers.c) or transactions and their
 * thread (writer.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "moat/status.h"
#include "moat/util.h"
#include "snapd.h"

#define DB_CHUNKS "chunks"
#define DB_REFS "chunk_refs"
#define DB_SNAPS "snapshots"
#define DB_MANIFESTS "manifests"
#define DB_TENANTS "tenants"

#define REF_LEN 20   /* refs u64, len u32, put_ms u64 */
#define STATS_LEN 48 /* six u64 */
#define MANIFEST_MAX_PIECES (1u << 16)

static void
put_u64(uint8_t *p, uint64_t v)
{
	moat_store_key_u64(p, v);
}

static uint64_t
get_u64(const uint8_t *p)
{
	return moat_store_u64_from_key(p);
}

static void
put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t
get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	    (uint32_t)p[2] << 8 | p[3];
}

int
snapd_tenant_check(const char *tenant, char **errmsg)
{
	size_t n = strlen(tenant);

	if (n == 0) {
		*errmsg = moat_asprintf("tenant is required: every snapd "
		                        "call names the tenant it acts for "
		                        "(the gateway and vmd set it)");
		return MOAT_INVALID_ARGUMENT;
	}
	for (size_t i = 0; i < n; i++) {
		char c = tenant[i];

		if (i >= SNAPD_TENANT_MAX ||
		    !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		        c == '-')) {
			*errmsg = moat_asprintf("tenant \"%.64s\" is not 1 to "
			                        "%d of A-Z a-z 0-9 . _ -",
			    tenant, SNAPD_TENANT_MAX);
			return MOAT_INVALID_ARGUMENT;
		}
	}
	return MOAT_OK;
}

static int
hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

bool
snapd_snap_id_parse(const char *text, uint8_t raw[SNAPD_SNAP_RAW])
{
	if (strncmp(text, "snap-", 5) != 0 ||
	    strlen(text) != 5 + 2 * SNAPD_SNAP_RAW)
		return false;
	text += 5;
	for (int i = 0; i < SNAPD_SNAP_RAW; i++) {
		int hi = hex_digit(text[2 * i]);
		int lo = hex_digit(text[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		raw[i] = (uint8_t)(hi << 4 | lo);
	}
	return true;
}

void
snapd_snap_id_format(const uint8_t raw[SNAPD_SNAP_RAW],
    char out[SNAPD_SNAP_TEXT])
{
	static const char digits[] = "0123456789abcdef";

	memcpy(out, "snap-", 5);
	for (int i = 0; i < SNAPD_SNAP_RAW; i++) {
		out[5 + 2 * i] = digits[raw[i] >> 4];
		out[6 + 2 * i] = digits[raw[i] & 15];
	}
	out[5 + 2 * SNAPD_SNAP_RAW] = '\0';
}

int
snapd_snap_id_new(uint8_t raw[SNAPD_SNAP_RAW], uint64_t ms, char **errmsg)
{
	size_t got = 0;

	for (int i = 5; i >= 0; i--) {
		raw[i] = (uint8_t)(ms & 0xff);
		ms >>= 8;
	}
	while (got < SNAPD_SNAP_RAW - 6) {
		ssize_t n =
		    getrandom(raw + 6 + got, SNAPD_SNAP_RAW - 6 - got, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			*errmsg = moat_asprintf("getrandom for a snapshot id: "
			                        "%s",
			    strerror(errno));
			return MOAT_INTERNAL;
		}
		got += (size_t)n;
	}
	return MOAT_OK;
}

void
snapd_key_tenant(struct snapd_key *k, const char *tenant)
{
	size_t n = strlen(tenant);

	k->b[0] = (uint8_t)n;
	memcpy(k->b + 1, tenant, n);
	k->len = 1 + n;
}

void
snapd_key_chunk(struct snapd_key *k, const char *tenant,
    const struct moat_chunk_id *id)
{
	snapd_key_tenant(k, tenant);
	memcpy(k->b + k->len, id->b, MOAT_CHUNK_ID_LEN);
	k->len += MOAT_CHUNK_ID_LEN;
}

void
snapd_key_snap(struct snapd_key *k, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW])
{
	snapd_key_tenant(k, tenant);
	memcpy(k->b + k->len, raw, SNAPD_SNAP_RAW);
	k->len += SNAPD_SNAP_RAW;
}

int
snapd_stats_get(struct moat_store_txn *txn, const char *tenant,
    struct snapd_tenant_stats *s, char **errmsg)
{
	struct snapd_key k;
	const uint8_t *v;
	size_t len;
	int rv;

	memset(s, 0, sizeof(*s));
	snapd_key_tenant(&k, tenant);
	rv = moat_store_get(txn, DB_TENANTS, k.b, k.len, (const void **)&v,
	    &len, errmsg);
	if (rv == MOAT_NOT_FOUND)
		return MOAT_OK; /* a tenant with nothing stored yet */
	if (rv != MOAT_OK)
		return rv;
	if (len != STATS_LEN) {
		*errmsg =
		    moat_asprintf("tenant \"%s\": counters record is "
		                  "%zu bytes, not %d: the store is damaged",
		        tenant, len, STATS_LEN);
		return MOAT_DATA_LOSS;
	}
	s->snapshots = get_u64(v);
	s->chunks = get_u64(v + 8);
	s->stored_bytes = get_u64(v + 16);
	s->logical_bytes = get_u64(v + 24);
	s->pending_chunks = get_u64(v + 32);
	s->pending_bytes = get_u64(v + 40);
	return MOAT_OK;
}

/* add_stats: a moat_store_scan callback adding one tenant's record to
 * the total in `arg`; records of the wrong size are skipped (stats_get
 * reports them when that tenant is asked for). */
static int
add_stats(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct snapd_tenant_stats *t = arg;
	const uint8_t *v = val;

	(void)key;
	(void)klen;
	if (vlen != STATS_LEN)
		return MOAT_OK;
	t->snapshots += get_u64(v);
	t->chunks += get_u64(v + 8);
	t->stored_bytes += get_u64(v + 16);
	t->logical_bytes += get_u64(v + 24);
	t->pending_chunks += get_u64(v + 32);
	t->pending_bytes += get_u64(v + 40);
	return MOAT_OK;
}

int
snapd_stats_total(struct moat_store_txn *txn, struct snapd_tenant_stats *total,
    char **errmsg)
{
	memset(total, 0, sizeof(*total));
	return moat_store_scan(txn, DB_TENANTS, NULL, 0, NULL, 0, add_stats,
	    total, errmsg);
}

int
snapd_stats_put(struct moat_store_txn *txn, const char *tenant,
    const struct snapd_tenant_stats *s, char **errmsg)
{
	struct snapd_key k;
	uint8_t v[STATS_LEN];

	snapd_key_tenant(&k, tenant);
	put_u64(v, s->snapshots);
	put_u64(v + 8, s->chunks);
	put_u64(v + 16, s->stored_bytes);
	put_u64(v + 24, s->logical_bytes);
	put_u64(v + 32, s->pending_chunks);
	put_u64(v + 40, s->pending_bytes);
	return moat_store_put(txn, DB_TENANTS, k.b, k.len, v, sizeof(v), false,
	    errmsg);
}

int
snapd_ref_get(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, struct snapd_chunk_ref *ref, char **errmsg)
{
	struct snapd_key k;
	const uint8_t *v;
	char hex[65];
	size_t len;
	int rv;

	snapd_key_chunk(&k, tenant, id);
	if ((rv = moat_store_get(txn, DB_REFS, k.b, k.len, (const void **)&v,
	         &len, errmsg)) != MOAT_OK)
		return rv;
	if (len != REF_LEN) {
		moat_chunk_id_hex(id, hex);
		*errmsg = moat_asprintf(
		    "chunk %s of tenant \"%s\": reference "
		    "record is %zu bytes, not %d: the store is damaged",
		    hex, tenant, len, REF_LEN);
		return MOAT_DATA_LOSS;
	}
	ref->refs = get_u64(v);
	ref->len = get_u32(v + 8);
	ref->put_ms = get_u64(v + 12);
	return MOAT_OK;
}

int
snapd_ref_put(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, const struct snapd_chunk_ref *ref,
    char **errmsg)
{
	struct snapd_key k;
	uint8_t v[REF_LEN];

	snapd_key_chunk(&k, tenant, id);
	put_u64(v, ref->refs);
	put_u32(v + 8, ref->len);
	put_u64(v + 12, ref->put_ms);
	return moat_store_put(txn, DB_REFS, k.b, k.len, v, sizeof(v), false,
	    errmsg);
}

/* piece_size: the length of each piece but the last for a chunk of `len`:
 * a whole number of overflow pages less their header, so the pages are
 * full and the remainder (a few bytes) sits inline in a leaf page. */
static size_t
piece_size(size_t len)
{
	size_t pages = (len + 16) / SNAPD_PAGE;

	if (pages == 0)
		return len; /* under a page: one piece */
	if (pages > SNAPD_PIECE_MAX / SNAPD_PAGE + 1)
		return SNAPD_PIECE_MAX;
	return pages * SNAPD_PAGE - 16 < SNAPD_PIECE_MAX ?
	    pages * SNAPD_PAGE - 16 :
	    SNAPD_PIECE_MAX;
}

int
snapd_chunk_store(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, const void *data, size_t len,
    uint64_t now_ms, char **errmsg)
{
	struct snapd_chunk_ref ref = { .refs = 0,
		.len = (uint32_t)len,
		.put_ms = now_ms };
	struct snapd_key k;
	size_t step = piece_size(len), off = 0;
	int rv, piece = 0;

	snapd_key_chunk(&k, tenant, id);
	k.len++;
	while (off < len) {
		size_t n = len - off < step ? len - off : step;

		k.b[k.len - 1] = (uint8_t)piece++;
		if ((rv = moat_store_put(txn, DB_CHUNKS, k.b, k.len,
		         (const uint8_t *)data + off, n, false, errmsg)) !=
		    MOAT_OK)
			return rv;
		off += n;
	}
	return snapd_ref_put(txn, tenant, id, &ref, errmsg);
}

int
snapd_chunk_free(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, uint32_t len, char **errmsg)
{
	struct snapd_key k;
	size_t step = piece_size(len), n_pieces;
	int rv;

	n_pieces = len == 0 ? 0 : (len + step - 1) / step;
	snapd_key_chunk(&k, tenant, id);
	if ((rv = moat_store_del(txn, DB_REFS, k.b, k.len, errmsg)) !=
	        MOAT_OK &&
	    rv != MOAT_NOT_FOUND)
		return rv;
	k.len++;
	for (size_t i = 0; i < n_pieces; i++) {
		k.b[k.len - 1] = (uint8_t)i;
		rv = moat_store_del(txn, DB_CHUNKS, k.b, k.len, errmsg);
		if (rv != MOAT_OK && rv != MOAT_NOT_FOUND)
			return rv;
	}
	return MOAT_OK;
}

int
snapd_chunk_read(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, uint8_t **data, size_t *len_out,
    char **errmsg)
{
	struct snapd_chunk_ref ref;
	struct snapd_key k;
	const void *piece;
	uint8_t *buf = NULL;
	size_t step, off = 0, n;
	char hex[65];
	int rv, i = 0;

	*data = NULL;
	*len_out = 0;
	if ((rv = snapd_ref_get(txn, tenant, id, &ref, errmsg)) != MOAT_OK)
		return rv;
	moat_chunk_id_hex(id, hex);
	if (ref.len == 0 || ref.len > MOAT_CHUNK_MAX_SIZE) {
		*errmsg = moat_asprintf("chunk %s: recorded length %u is "
		                        "impossible",
		    hex, ref.len);
		return MOAT_DATA_LOSS;
	}
	if ((buf = malloc(ref.len)) == NULL) {
		*errmsg = moat_asprintf("chunk %s: out of memory", hex);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	step = piece_size(ref.len);
	snapd_key_chunk(&k, tenant, id);
	k.len++;
	while (off < ref.len) {
		k.b[k.len - 1] = (uint8_t)i++;
		rv = moat_store_get(txn, DB_CHUNKS, k.b, k.len, &piece, &n,
		    errmsg);
		if (rv == MOAT_NOT_FOUND ||
		    (rv == MOAT_OK &&
		        n != (ref.len - off < step ? ref.len - off : step))) {
			*errmsg = moat_asprintf("chunk %s: piece %d is %s",
			    hex, i - 1,
			    rv == MOAT_OK ? "the wrong length" : "missing");
			rv = MOAT_DATA_LOSS;
			goto fail;
		}
		if (rv != MOAT_OK)
			goto fail;
		memcpy(buf + off, piece, n);
		off += n;
	}
	if (!moat_chunk_verify(buf, ref.len, id)) {
		*errmsg = moat_asprintf("chunk %s: stored bytes do not hash "
		                        "to its id",
		    hex);
		rv = MOAT_DATA_LOSS;
		goto fail;
	}
	*data = buf;
	*len_out = ref.len;
	return MOAT_OK;

fail:
	free(buf);
	return rv;
}

int
snapd_manifest_put(struct moat_store_txn *txn, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW], const uint8_t *full, size_t full_len,
    const uint8_t *light, size_t light_len, char **errmsg)
{
	struct snapd_key k;
	size_t off = 0;
	uint32_t piece = 0;
	int rv;

	snapd_key_snap(&k, tenant, raw);
	if ((rv = moat_store_put(txn, DB_SNAPS, k.b, k.len, light, light_len,
	         true, errmsg)) != MOAT_OK)
		return rv;
	k.len += 4;
	do {
		size_t n = full_len - off < SNAPD_PIECE_MAX ? full_len - off :
		                                              SNAPD_PIECE_MAX;

		put_u32(k.b + k.len - 4, piece++);
		if ((rv = moat_store_put(txn, DB_MANIFESTS, k.b, k.len,
		         full + off, n, true, errmsg)) != MOAT_OK)
			return rv;
		off += n;
	} while (off < full_len);
	return MOAT_OK;
}

/* manifest_pieces_cb: appends one piece to the growing buffer. */
struct gather {
	uint8_t *buf;
	size_t len, cap;
};

static int
gather_piece(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct gather *g = arg;

	if (g->len + vlen > g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 4 * SNAPD_PIECE_MAX;
		uint8_t *p;

		while (cap < g->len + vlen)
			cap *= 2;
		if ((p = realloc(g->buf, cap)) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		g->buf = p;
		g->cap = cap;
	}
	memcpy(g->buf + g->len, val, vlen);
	g->len += vlen;
	return MOAT_OK;
}

int
snapd_manifest_get(struct moat_store_txn *txn, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW], bool full, uint8_t **out, size_t *len,
    char **errmsg)
{
	struct gather g = { 0 };
	struct snapd_key k;
	const void *v;
	size_t vlen;
	int rv;

	*out = NULL;
	*len = 0;
	snapd_key_snap(&k, tenant, raw);
	if ((rv = moat_store_get(txn, DB_SNAPS, k.b, k.len, &v, &vlen,
	         errmsg)) != MOAT_OK)
		return rv;
	if (!full) {
		if ((*out = malloc(vlen ? vlen : 1)) == NULL)
			goto fail_oom;
		memcpy(*out, v, vlen);
		*len = vlen;
		return MOAT_OK;
	}
	/* Pieces are keyed by big-endian number: a prefix scan yields them
	 * in order. */
	rv = moat_store_scan(txn, DB_MANIFESTS, k.b, k.len, NULL, 0,
	    gather_piece, &g, errmsg);
	if (rv == MOAT_RESOURCE_EXHAUSTED && *errmsg == NULL)
		goto fail_oom;
	if (rv != MOAT_OK) {
		free(g.buf);
		return rv;
	}
	if (g.len == 0) {
		char text[SNAPD_SNAP_TEXT];

		snapd_snap_id_format(raw, text);
		*errmsg = moat_asprintf("snapshot %s: its manifest is missing "
		                        "from the store",
		    text);
		return MOAT_DATA_LOSS;
	}
	*out = g.buf;
	*len = g.len;
	return MOAT_OK;

fail_oom:
	free(g.buf);
	*errmsg = moat_asprintf("out of memory reading a manifest");
	return MOAT_RESOURCE_EXHAUSTED;
}

int
snapd_manifest_del(struct moat_store_txn *txn, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW], char **errmsg)
{
	struct snapd_key k;
	int rv;

	snapd_key_snap(&k, tenant, raw);
	if ((rv = moat_store_del(txn, DB_SNAPS, k.b, k.len, errmsg)) !=
	    MOAT_OK)
		return rv;
	k.len += 4;
	for (uint32_t piece = 0; piece < MANIFEST_MAX_PIECES; piece++) {
		put_u32(k.b + k.len - 4, piece);
		rv = moat_store_del(txn, DB_MANIFESTS, k.b, k.len, errmsg);
		if (rv == MOAT_NOT_FOUND)
			return MOAT_OK;
		if (rv != MOAT_OK)
			return rv;
	}
	return MOAT_OK;
}
