/*
 * snap_client.c: push a file to moat-snapd as chunks and pull it back
 * (snap_client.h). Push walks the file once: chunk ids are collected for
 * the manifest, and the data of non-zero chunks waits in a bounded batch
 * until MissingChunks says which of them the store lacks, which are then
 * sent in one PutChunks. Pull asks for the chunks not yet written, in
 * batches, and hands each to a chunk writer that checks it.
 * Not for: snapshot policy or the catalog calls.
 */
#include <stdlib.h>
#include <string.h>

#include "moat/chunk.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snap_client.h"

struct push {
	struct moat_rpc_client *c;
	const char *tenant;
	struct moat_snap_push_stats *stats;
	uint8_t *ids; /* the manifest's list, grows */
	size_t n_ids, cap_ids;
	/* The batch waiting for MissingChunks: chunks' bytes one after the
	 * other in `data` (MOAT_SNAP_PUSH_BYTES), their ids in `batch_ids`. */
	Moat__V1__SnapChunk chunks[MOAT_SNAP_PUSH_BATCH];
	uint8_t batch_ids[MOAT_SNAP_PUSH_BATCH * MOAT_CHUNK_ID_LEN];
	uint8_t *data;
	size_t n_batch, data_used;
};

/* flush: sends the batch's chunks the store lacks, then empties it. */
static int
flush(struct push *p, char **errmsg)
{
	Moat__V1__MissingChunksRequest mreq =
	    MOAT__V1__MISSING_CHUNKS_REQUEST__INIT;
	Moat__V1__PutChunksRequest preq = MOAT__V1__PUT_CHUNKS_REQUEST__INIT;
	Moat__V1__SnapChunk *send[MOAT_SNAP_PUSH_BATCH];
	Moat__V1__MissingChunksReply *mr = NULL;
	ProtobufCMessage *reply = NULL;
	int rv = MOAT_OK;

	if (p->n_batch == 0)
		return MOAT_OK;
	mreq.tenant = (char *)p->tenant;
	mreq.ids.data = p->batch_ids;
	mreq.ids.len = p->n_batch * MOAT_CHUNK_ID_LEN;
	if ((rv = moat_rpc_call(p->c, MOAT_SNAP_SERVICE, "MissingChunks",
	         &mreq.base, &moat__v1__missing_chunks_reply__descriptor,
	         &reply, NULL, errmsg)) != MOAT_OK)
		goto out;
	mr = (Moat__V1__MissingChunksReply *)reply;
	for (size_t i = 0; i < mr->n_missing; i++) {
		if (mr->missing[i] >= p->n_batch) {
			*errmsg = moat_asprintf("MissingChunks answered index "
			                        "%u of a batch of %zu",
			    mr->missing[i], p->n_batch);
			rv = MOAT_INTERNAL;
			goto out;
		}
		send[preq.n_chunks++] = &p->chunks[mr->missing[i]];
	}
	if (preq.n_chunks > 0) {
		protobuf_c_message_free_unpacked(reply, NULL);
		reply = NULL;
		preq.tenant = (char *)p->tenant;
		preq.chunks = send;
		if ((rv = moat_rpc_call(p->c, MOAT_SNAP_SERVICE, "PutChunks",
		         &preq.base, &moat__v1__put_chunks_reply__descriptor,
		         &reply, NULL, errmsg)) != MOAT_OK)
			goto out;
		p->stats->sent_chunks += preq.n_chunks;
		for (size_t i = 0; i < preq.n_chunks; i++)
			p->stats->sent_bytes += send[i]->data.len;
	}
out:
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	p->n_batch = 0;
	p->data_used = 0;
	return rv;
}

static int
push_chunk(const struct moat_chunk *ch, void *arg, char **errmsg)
{
	struct push *p = arg;
	Moat__V1__SnapChunk *c;
	int rv;

	if (p->n_ids == p->cap_ids) {
		size_t cap = p->cap_ids ? p->cap_ids * 2 : 1024;
		uint8_t *ids = realloc(p->ids, cap * MOAT_CHUNK_ID_LEN);

		if (ids == NULL) {
			*errmsg = moat_asprintf("out of memory for %zu chunk "
			                        "ids",
			    cap);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		p->ids = ids;
		p->cap_ids = cap;
	}
	memcpy(p->ids + p->n_ids++ * MOAT_CHUNK_ID_LEN, ch->id.b,
	    MOAT_CHUNK_ID_LEN);
	p->stats->chunks++;
	if (ch->zero) {
		p->stats->zero_chunks++;
		return MOAT_OK;
	}
	if (p->data_used + ch->len > MOAT_SNAP_PUSH_BYTES &&
	    (rv = flush(p, errmsg)) != MOAT_OK)
		return rv;
	c = &p->chunks[p->n_batch];
	moat__v1__snap_chunk__init(c);
	memcpy(p->data + p->data_used, ch->data, ch->len);
	memcpy(p->batch_ids + p->n_batch * MOAT_CHUNK_ID_LEN, ch->id.b,
	    MOAT_CHUNK_ID_LEN);
	c->data.data = p->data + p->data_used;
	c->data.len = ch->len;
	c->id.data = p->batch_ids + p->n_batch * MOAT_CHUNK_ID_LEN;
	c->id.len = MOAT_CHUNK_ID_LEN;
	p->data_used += ch->len;
	if (++p->n_batch == MOAT_SNAP_PUSH_BATCH)
		return flush(p, errmsg);
	return MOAT_OK;
}

int
moat_snap_push_file(struct moat_rpc_client *c, const char *tenant,
    const char *name, const char *path, uint32_t chunk_size,
    Moat__V1__SnapArtifact *artifact, struct moat_snap_push_stats *stats,
    char **errmsg)
{
	struct moat_snap_push_stats local;
	struct push *p = NULL;
	uint64_t size = 0;
	int rv;

	moat__v1__snap_artifact__init(artifact);
	memset(&local, 0, sizeof(local));
	if (stats != NULL)
		memset(stats, 0, sizeof(*stats));
	if (!moat_chunk_size_valid(chunk_size)) {
		*errmsg =
		    moat_asprintf("chunk size %u is not valid", chunk_size);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((p = calloc(1, sizeof(*p))) == NULL ||
	    (p->data = malloc(MOAT_SNAP_PUSH_BYTES)) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	p->c = c;
	p->tenant = tenant;
	p->stats = stats != NULL ? stats : &local;
	if ((rv = moat_chunk_file(path, chunk_size, push_chunk, p, &size,
	         errmsg)) != MOAT_OK ||
	    (rv = flush(p, errmsg)) != MOAT_OK)
		goto out;
	if ((artifact->name = strdup(name)) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	artifact->size = size;
	artifact->chunk_size = chunk_size;
	artifact->chunk_ids.data = p->ids;
	artifact->chunk_ids.len = p->n_ids * MOAT_CHUNK_ID_LEN;
	p->ids = NULL; /* the artifact's now */
out:
	if (p != NULL) {
		free(p->data);
		free(p->ids);
	}
	free(p);
	return rv;
}

void
moat_snap_artifact_clear(Moat__V1__SnapArtifact *a)
{
	if (a->name != NULL && a->name != protobuf_c_empty_string)
		free(a->name);
	free(a->chunk_ids.data);
	moat__v1__snap_artifact__init(a);
}

int
moat_snap_pull_chunks(struct moat_rpc_client *c, const char *tenant,
    const char *snapshot_id, const Moat__V1__SnapArtifact *a,
    struct moat_chunk_writer *w, uint64_t first, uint64_t end,
    size_t batch_max, uint64_t *pulled, char **errmsg)
{
	Moat__V1__GetChunksRequest req = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	uint8_t ids[MOAT_SNAP_PULL_BATCH * MOAT_CHUNK_ID_LEN];
	uint64_t batch[MOAT_SNAP_PULL_BATCH], idx, next;
	int rv = MOAT_OK;

	if (batch_max == 0 || batch_max > MOAT_SNAP_PULL_BATCH)
		batch_max = MOAT_SNAP_PULL_BATCH;
	req.tenant = (char *)tenant;
	req.snapshot_id = (char *)snapshot_id;
	idx = moat_chunk_writer_next_missing(w, first);
	while (idx != UINT64_MAX && idx < end) {
		Moat__V1__GetChunksReply *r;
		ProtobufCMessage *reply = NULL;
		size_t n = 0;

		for (next = idx;
		     next != UINT64_MAX && next < end && n < batch_max;
		     next = moat_chunk_writer_next_missing(w, next + 1)) {
			batch[n] = next;
			memcpy(ids + n++ * MOAT_CHUNK_ID_LEN,
			    a->chunk_ids.data + next * MOAT_CHUNK_ID_LEN,
			    MOAT_CHUNK_ID_LEN);
		}
		req.ids.data = ids;
		req.ids.len = n * MOAT_CHUNK_ID_LEN;
		if ((rv = moat_rpc_call(c, MOAT_SNAP_SERVICE, "GetChunks",
		         &req.base, &moat__v1__get_chunks_reply__descriptor,
		         &reply, NULL, errmsg)) != MOAT_OK)
			return rv;
		r = (Moat__V1__GetChunksReply *)reply;
		if (r->n_chunks == 0 || r->n_chunks > n) {
			*errmsg = moat_asprintf("GetChunks answered %zu "
			                        "chunks for %zu ids",
			    r->n_chunks, n);
			protobuf_c_message_free_unpacked(reply, NULL);
			return MOAT_INTERNAL;
		}
		for (size_t i = 0; i < r->n_chunks && rv == MOAT_OK; i++)
			rv = moat_chunk_writer_put(w, batch[i],
			    r->chunks[i]->data.data, r->chunks[i]->data.len,
			    errmsg);
		if (pulled != NULL)
			*pulled += r->n_chunks;
		/* A short reply resumes at the first chunk it left out. */
		idx = r->n_chunks == n ? next : batch[r->n_chunks];
		protobuf_c_message_free_unpacked(reply, NULL);
		if (rv != MOAT_OK)
			return rv;
	}
	return MOAT_OK;
}

int
moat_snap_pull_file(struct moat_rpc_client *c, const char *tenant,
    const char *snapshot_id, const Moat__V1__SnapArtifact *a, const char *path,
    char **errmsg)
{
	struct moat_chunk_writer *w = NULL;
	int rv;

	if ((rv = moat_chunk_writer_open(&w, path, a->size, a->chunk_size,
	         a->chunk_ids.data, a->chunk_ids.len / MOAT_CHUNK_ID_LEN,
	         errmsg)) != MOAT_OK)
		return rv;
	if ((rv = moat_snap_pull_chunks(c, tenant, snapshot_id, a, w, 0,
	         UINT64_MAX, MOAT_SNAP_PULL_BATCH, NULL, errmsg)) != MOAT_OK) {
		moat_chunk_writer_abort(w);
		return rv;
	}
	return moat_chunk_writer_commit(w, errmsg);
}
