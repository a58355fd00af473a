/*
 * chunk.h: fixed-size aligned chunking of files for the snapshot chunk
 * store: cut a RAM file or a disk into chunks at multiples of the chunk
 * size, name each by its SHA-256, spot all-zero chunks (holes are zero
 * without being read), and write a file back from its chunks, leaving
 * holes where the zero chunks were. Shared by snapd (verification) and
 * vmd (producer and restorer).
 * Not for: moving chunks between processes (the Snapshot RPCs) or content
 * defined chunking (RAM files and disks are page-aligned, so fixed aligned
 * chunks dedup as well and cost no boundary search).
 */
#ifndef MOAT_CHUNK_H
#define MOAT_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOAT_CHUNK_ID_LEN 32 /* SHA-256 */

/* The chunk size producers use, chosen by measurement (bench_snapd on
 * the shared 2-core CI machine kind: a 256 MiB RAM-like file, a quarter
 * holes, then the same file with 32 scattered pages changed; times vary
 * up to 2x from run to run here, byte counts do not):
 *
 *   chunk   2nd snapshot   manifest  first put+commit  2nd put+commit
 *           stores         (ids)     (256 MiB)
 *   4 KiB   128 KiB        2 MiB     4.9-8.6 s         0.54-0.84 s
 *   16 KiB  512 KiB        512 KiB   1.8-3.8 s         0.34-0.40 s
 *   64 KiB  2 MiB          128 KiB   3.4-4.8 s         0.27-0.38 s
 *   256 KiB 7.75 MiB       32 KiB    3.5-6.7 s         0.30-0.46 s
 *
 * Twenty steps of 16 changed pages each grew the LMDB file by 14.9 MB at
 * 16 KiB and 22.3 MB at 64 KiB (delta plus manifest plus the reference
 * records rewritten by each commit): 16 KiB costs the least disk per step
 * and is as fast as any size but 4 KiB, whose per-chunk costs (entries,
 * a 2 MiB manifest) dominate. */
#define MOAT_CHUNK_SIZE (16u << 10)
#define MOAT_CHUNK_MIN_SIZE 4096u /* a page */
#define MOAT_CHUNK_MAX_SIZE (1u << 20)

/* Most chunks one file may have (256 GiB at the default size). */
#define MOAT_CHUNK_MAX_COUNT (16u << 20)

struct moat_chunk_id {
	uint8_t b[MOAT_CHUNK_ID_LEN];
};

/* One chunk as moat_chunk_file reports it. `data` is NULL for a zero
 * chunk (never read if it lay in a hole); otherwise it points into the
 * chunker's buffer, valid only during the callback. */
struct moat_chunk {
	uint64_t index;
	uint64_t offset;
	size_t len; /* chunk_size, or less for the last one */
	bool zero;
	struct moat_chunk_id id; /* all zero bytes when `zero` */
	const void *data;
};

/* moat_chunk_hash: id = SHA-256(data). */
void moat_chunk_hash(const void *data, size_t len, struct moat_chunk_id *id);

/* moat_chunk_verify: true when SHA-256(data) == *id. */
bool moat_chunk_verify(const void *data, size_t len,
    const struct moat_chunk_id *id);

/* moat_chunk_is_zero: true when all `len` bytes are zero. */
bool moat_chunk_is_zero(const void *data, size_t len);

/* moat_chunk_id_is_zero: true for the zero-chunk marker (32 zero bytes). */
bool moat_chunk_id_is_zero(const struct moat_chunk_id *id);

/* moat_chunk_id_hex: 64 hex digits and a NUL into `out`. */
void moat_chunk_id_hex(const struct moat_chunk_id *id, char out[65]);

/* moat_chunk_size_valid: a multiple of MOAT_CHUNK_MIN_SIZE within
 * [MOAT_CHUNK_MIN_SIZE, MOAT_CHUNK_MAX_SIZE]. */
bool moat_chunk_size_valid(uint64_t chunk_size);

/* moat_chunk_count: chunks of a `size`-byte file (the last may be short). */
uint64_t moat_chunk_count(uint64_t size, uint32_t chunk_size);

/* A callback returns MOAT_OK to go on; any other status stops the walk and
 * is returned by moat_chunk_file (the callback may set *errmsg, heap). */
typedef int (
    *moat_chunk_fn)(const struct moat_chunk *c, void *arg, char **errmsg);

/* moat_chunk_file: walks the file at `path` chunk by chunk in order,
 * calling fn for each. Regions that SEEK_DATA/SEEK_HOLE report as holes
 * are zero chunks without being read. *size (may be NULL) gets the file's
 * size. The file must not change during the walk (snapshot it first).
 * Errors return a status and set *errmsg (heap, caller frees) naming the
 * path. Blocking; any thread. */
int moat_chunk_file(const char *path, uint32_t chunk_size, moat_chunk_fn fn,
    void *arg, uint64_t *size, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_chunk_fd: moat_chunk_file on an open file (read with pread, the
 * offset untouched); `name` is for messages. */
int moat_chunk_fd(int fd, const char *name, uint32_t chunk_size,
    moat_chunk_fn fn, void *arg, uint64_t *size, char **errmsg)
    __attribute__((warn_unused_result));

/* A file being written back from its chunks, in any order. */
struct moat_chunk_writer;

/* moat_chunk_writer_open: starts writing a `size`-byte file that will
 * replace `path` on commit (a temporary file next to it until then; mode
 * 0600). `ids` (n * 32 bytes, copied) is the chunk list; zero markers are
 * left as holes. On success *out is the caller's: commit or abort it. */
int moat_chunk_writer_open(struct moat_chunk_writer **out, const char *path,
    uint64_t size, uint32_t chunk_size, const uint8_t *ids, size_t n_ids,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_chunk_writer_put: writes chunk `index` after checking it against
 * its id (DATA_LOSS on a mismatch, INVALID_ARGUMENT on a wrong length or
 * index, or for a zero chunk). Data is copied. */
int moat_chunk_writer_put(struct moat_chunk_writer *w, uint64_t index,
    const void *data, size_t len, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_chunk_writer_copy_trusted: marks chunks [first, first + n) put,
 * copying their bytes from open file `src_fd`, where they start at chunk
 * `src_first` (same chunk size), with copy_file_range (a reflink where
 * the filesystem shares blocks) or read and write. NOT verified: only
 * for a source whose chunks this process knows to hold those ids, a
 * local file it wrote from verified chunks or chunked itself and that
 * nothing changes since; anything else goes through _put. No chunk of
 * the range may be a zero chunk. A short source is an error (the chunks
 * stay missing). */
int moat_chunk_writer_copy_trusted(struct moat_chunk_writer *w, uint64_t first,
    uint64_t n, int src_fd, uint64_t src_first, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_chunk_writer_next_missing: the first non-zero chunk index at or
 * after `from` not yet put, or UINT64_MAX when none is left. */
uint64_t moat_chunk_writer_next_missing(const struct moat_chunk_writer *w,
    uint64_t from);

/* moat_chunk_writer_commit: FAILED_PRECONDITION if a non-zero chunk was
 * never put; otherwise fsyncs and renames the file into place. Frees w in
 * every case (on failure the temporary file is removed). */
int moat_chunk_writer_commit(struct moat_chunk_writer *w, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_chunk_writer_abort: removes the temporary file and frees w. Safe on
 * NULL. */
void moat_chunk_writer_abort(struct moat_chunk_writer *w);

/* Fills `buf` with chunk `index` (`len` bytes, id *id); returns a status,
 * setting *errmsg (heap) on failure. */
typedef int (*moat_chunk_source_fn)(uint64_t index,
    const struct moat_chunk_id *id, void *buf, size_t len, void *arg,
    char **errmsg);

/* moat_chunk_assemble: writes `path` from its chunk list, asking `source`
 * for each non-zero chunk in order and leaving zero chunks as holes;
 * every chunk is verified before it is written. The file appears only
 * when complete. Errors return a status and set *errmsg (heap). */
int moat_chunk_assemble(const char *path, uint64_t size, uint32_t chunk_size,
    const uint8_t *ids, size_t n_ids, moat_chunk_source_fn source, void *arg,
    char **errmsg) __attribute__((warn_unused_result));

#endif
