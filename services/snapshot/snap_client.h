/*
 * snap_client.h: the two halves of moving a file through moat-snapd, for
 * vmd (snapshot and restore), the tests and the benchmark: push cuts a
 * file into chunks, sends only those the tenant's store lacks and returns
 * the artifact to commit; pull writes a snapshot's artifact back to a
 * file, sparse where the chunks were zero, verifying every chunk.
 * Not for: committing or deleting snapshots (plain RPCs) or deciding what
 * a snapshot holds (vmd).
 */
#ifndef MOAT_SNAP_CLIENT_H
#define MOAT_SNAP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"
#include "snapshot.pb-c.h"

#define MOAT_SNAP_SERVICE "moat.v1.Snapshot"
#define MOAT_SNAP_PUSH_BATCH 256 /* chunks per MissingChunks/PutChunks */
#define MOAT_SNAP_PUSH_BYTES (8u << 20) /* and bytes per PutChunks */
#define MOAT_SNAP_PULL_BATCH 256        /* ids per GetChunks (its cap) */

struct moat_snap_push_stats {
	uint64_t chunks; /* all, zero ones included */
	uint64_t zero_chunks;
	uint64_t sent_chunks; /* the store lacked them */
	uint64_t sent_bytes;
};

/* moat_snap_push_file: chunks `path` (chunk_size bytes, see
 * moat_chunk_file), puts the chunks `tenant` lacks, and fills *artifact
 * (initialised here; name and chunk_ids are heap, freed with
 * moat_snap_artifact_clear, also on failure) for a CommitManifest.
 * *stats may be NULL. Errors return a status and set *errmsg (heap,
 * caller frees). Blocking. */
int moat_snap_push_file(struct moat_rpc_client *c, const char *tenant,
    const char *name, const char *path, uint32_t chunk_size,
    Moat__V1__SnapArtifact *artifact, struct moat_snap_push_stats *stats,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_snap_artifact_clear: frees what push allocated and zeroes the
 * artifact. Safe on a zeroed or initialised one. */
void moat_snap_artifact_clear(Moat__V1__SnapArtifact *artifact);

struct moat_chunk_writer;

/* moat_snap_pull_chunks: the one GetChunks loop: fetches every chunk of
 * artifact `a` that writer `w` (the caller's, opened on `a`) still
 * misses with an index in [first, end), at most `batch_max` ids per
 * GetChunks (0 or more than MOAT_SNAP_PULL_BATCH: that), asking again
 * for what a short reply left out. Each chunk is verified by the
 * writer. Adds the chunks received to *pulled (may be NULL). Threads
 * may pull disjoint ranges of one writer when each owns whole bytes of
 * its bitmap (ranges of multiples of 8). Errors return a status and set
 * *errmsg (heap); the writer is left to the caller. Blocking. */
int moat_snap_pull_chunks(struct moat_rpc_client *c, const char *tenant,
    const char *snapshot_id, const Moat__V1__SnapArtifact *a,
    struct moat_chunk_writer *w, uint64_t first, uint64_t end,
    size_t batch_max, uint64_t *pulled, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_snap_pull_file: writes artifact `a` (with its chunk list, from
 * GetSnapshot with_chunks) of snapshot `snapshot_id` to `path`, which
 * appears only when complete. DATA_LOSS from snapd (a corrupt chunk) or
 * from the check here is returned as is. Errors set *errmsg (heap). */
int moat_snap_pull_file(struct moat_rpc_client *c, const char *tenant,
    const char *snapshot_id, const Moat__V1__SnapArtifact *a, const char *path,
    char **errmsg) __attribute__((warn_unused_result));

#endif
