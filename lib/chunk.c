/*
 * chunk.c: fixed-size aligned chunking behind moat/chunk.h: SHA-256 ids
 * (OpenSSL), zero detection, a file walk that skips holes with
 * SEEK_DATA/SEEK_HOLE, and a writer that puts a file back together from
 * verified chunks, sparse where the chunks were zero.
 * Not for: storing or sending chunks (snapd and its clients do that).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/chunk.h"
#include "moat/status.h"
#include "moat/util.h"

void
moat_chunk_hash(const void *data, size_t len, struct moat_chunk_id *id)
{
	SHA256(data, len, id->b);
}

bool
moat_chunk_verify(const void *data, size_t len, const struct moat_chunk_id *id)
{
	struct moat_chunk_id got;

	moat_chunk_hash(data, len, &got);
	return memcmp(got.b, id->b, MOAT_CHUNK_ID_LEN) == 0;
}

bool
moat_chunk_is_zero(const void *data, size_t len)
{
	const uint8_t *p = data;
	size_t head = len < 16 ? len : 16;

	/* The first bytes are checked by hand; then the buffer is compared
	 * with itself shifted by 16, which is zero only if all of it is. */
	for (size_t i = 0; i < head; i++)
		if (p[i] != 0)
			return false;
	return len <= 16 || memcmp(p, p + 16, len - 16) == 0;
}

bool
moat_chunk_id_is_zero(const struct moat_chunk_id *id)
{
	return moat_chunk_is_zero(id->b, MOAT_CHUNK_ID_LEN);
}

void
moat_chunk_id_hex(const struct moat_chunk_id *id, char out[65])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < MOAT_CHUNK_ID_LEN; i++) {
		out[2 * i] = digits[id->b[i] >> 4];
		out[2 * i + 1] = digits[id->b[i] & 15];
	}
	out[64] = '\0';
}

bool
moat_chunk_size_valid(uint64_t chunk_size)
{
	return chunk_size >= MOAT_CHUNK_MIN_SIZE &&
	    chunk_size <= MOAT_CHUNK_MAX_SIZE &&
	    chunk_size % MOAT_CHUNK_MIN_SIZE == 0;
}

uint64_t
moat_chunk_count(uint64_t size, uint32_t chunk_size)
{
	if (chunk_size == 0)
		return 0;
	return size / chunk_size + (size % chunk_size != 0);
}

/* read_full: pread until `len` bytes or end of file (the rest zeroed: a
 * file that shrank under us is an error, reported by the caller). */
static int
read_full(int fd, void *buf, size_t len, uint64_t off, size_t *got)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done,
		    (off_t)(off + done));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	*got = done;
	return 0;
}

/* next_data: the offset of the first data at or after `off`, or `size`
 * when only a hole is left. Filesystems without SEEK_DATA report the
 * whole file as data, which is correct, only slower. */
static uint64_t
next_data(int fd, uint64_t off, uint64_t size)
{
	off_t d = lseek(fd, (off_t)off, SEEK_DATA);

	if (d < 0)
		return errno == ENXIO ? size : off;
	return (uint64_t)d;
}

int
moat_chunk_fd(int fd, const char *name, uint32_t chunk_size, moat_chunk_fn fn,
    void *arg, uint64_t *size_out, char **errmsg)
{
	struct moat_chunk c;
	struct stat st;
	uint64_t size, n, data_at, hole_at;
	uint8_t *buf = NULL;
	int rv = MOAT_OK, err;

	if (!moat_chunk_size_valid(chunk_size)) {
		*errmsg = moat_asprintf("chunk size %u: must be a multiple of "
		                        "%u from %u to %u",
		    chunk_size, MOAT_CHUNK_MIN_SIZE, MOAT_CHUNK_MIN_SIZE,
		    MOAT_CHUNK_MAX_SIZE);
		return MOAT_INVALID_ARGUMENT;
	}
	if (fstat(fd, &st) != 0) {
		err = errno;
		*errmsg = moat_asprintf("%s: stat: %s", name, strerror(err));
		return moat_status_from_errno(err);
	}
	size = (uint64_t)st.st_size;
	if ((n = moat_chunk_count(size, chunk_size)) > MOAT_CHUNK_MAX_COUNT) {
		*errmsg = moat_asprintf("%s: %llu bytes is more than %u "
		                        "chunks of %u bytes",
		    name, (unsigned long long)size, MOAT_CHUNK_MAX_COUNT,
		    chunk_size);
		return MOAT_OUT_OF_RANGE;
	}
	if (size_out != NULL)
		*size_out = size;
	if ((buf = malloc(chunk_size)) == NULL) {
		*errmsg = moat_asprintf("%s: out of memory", name);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	/* [data_at, hole_at) is the data region known to cover the current
	 * offset; anything before data_at is a hole. */
	data_at = hole_at = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t off = i * chunk_size;
		size_t len = (size_t)(size - off < chunk_size ? size - off :
		                                                chunk_size),
		       got = 0;

		memset(&c, 0, sizeof(c));
		c.index = i;
		c.offset = off;
		c.len = len;
		if (off >= hole_at) {
			data_at = next_data(fd, off, size);
			if (data_at < size) {
				off_t h = lseek(fd, (off_t)data_at, SEEK_HOLE);

				hole_at = h < 0 ? size : (uint64_t)h;
			} else {
				hole_at = size;
			}
		}
		if (data_at >= off + len) {
			c.zero = true; /* all hole: never read */
		} else {
			if ((err = read_full(fd, buf, len, off, &got)) != 0) {
				*errmsg = moat_asprintf("%s: read at %llu: %s",
				    name, (unsigned long long)off,
				    strerror(err));
				rv = moat_status_from_errno(err);
				goto out;
			}
			if (got != len) {
				*errmsg = moat_asprintf(
				    "%s: shrank while "
				    "being chunked (short read at %llu): "
				    "chunk a copy that nothing writes",
				    name, (unsigned long long)off);
				rv = MOAT_ABORTED;
				goto out;
			}
			if (moat_chunk_is_zero(buf, len)) {
				c.zero = true;
			} else {
				moat_chunk_hash(buf, len, &c.id);
				c.data = buf;
			}
		}
		if ((rv = fn(&c, arg, errmsg)) != MOAT_OK)
			goto out;
	}
out:
	free(buf);
	return rv;
}

int
moat_chunk_file(const char *path, uint32_t chunk_size, moat_chunk_fn fn,
    void *arg, uint64_t *size, char **errmsg)
{
	int fd, rv, err;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		err = errno;
		*errmsg = moat_asprintf("%s: open: %s", path, strerror(err));
		return moat_status_from_errno(err);
	}
	rv = moat_chunk_fd(fd, path, chunk_size, fn, arg, size, errmsg);
	close(fd);
	return rv;
}

struct moat_chunk_writer {
	int fd;
	char *path;
	char *tmp_path;
	uint64_t size;
	uint32_t chunk_size;
	size_t n_ids;
	uint8_t *ids;  /* n_ids * 32, owned */
	uint8_t *done; /* bitmap of chunks put, owned */
};

int
moat_chunk_writer_open(struct moat_chunk_writer **out, const char *path,
    uint64_t size, uint32_t chunk_size, const uint8_t *ids, size_t n_ids,
    char **errmsg)
{
	struct moat_chunk_writer *w;
	int err, rv;

	*out = NULL;
	if (!moat_chunk_size_valid(chunk_size) ||
	    moat_chunk_count(size, chunk_size) != n_ids ||
	    n_ids > MOAT_CHUNK_MAX_COUNT) {
		*errmsg = moat_asprintf("%s: %zu chunks of %u bytes do not "
		                        "make a %llu-byte file",
		    path, n_ids, chunk_size, (unsigned long long)size);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((w = calloc(1, sizeof(*w))) == NULL)
		goto fail_oom;
	w->fd = -1;
	w->size = size;
	w->chunk_size = chunk_size;
	w->n_ids = n_ids;
	if ((w->path = strdup(path)) == NULL ||
	    (w->tmp_path = moat_asprintf("%s.partial-XXXXXX", path)) == NULL ||
	    (w->ids = malloc(n_ids * MOAT_CHUNK_ID_LEN + 1)) == NULL ||
	    (w->done = calloc(n_ids / 8 + 1, 1)) == NULL)
		goto fail_oom;
	memcpy(w->ids, ids, n_ids * MOAT_CHUNK_ID_LEN);
	if ((w->fd = mkostemp(w->tmp_path, O_CLOEXEC)) < 0) {
		err = errno;
		*errmsg = moat_asprintf("%s: creating a temporary file: %s",
		    path, strerror(err));
		rv = moat_status_from_errno(err);
		goto fail;
	}
	/* The holes of a sparse file read as zeros: zero chunks cost no
	 * write and no disk. */
	if (ftruncate(w->fd, (off_t)size) != 0) {
		err = errno;
		*errmsg = moat_asprintf("%s: sizing to %llu bytes: %s", path,
		    (unsigned long long)size, strerror(err));
		rv = moat_status_from_errno(err);
		goto fail;
	}
	*out = w;
	return MOAT_OK;

fail_oom:
	*errmsg = moat_asprintf("%s: out of memory", path);
	rv = MOAT_RESOURCE_EXHAUSTED;
fail:
	moat_chunk_writer_abort(w);
	return rv;
}

int
moat_chunk_writer_put(struct moat_chunk_writer *w, uint64_t index,
    const void *data, size_t len, char **errmsg)
{
	const struct moat_chunk_id *id;
	uint64_t off = index * w->chunk_size;
	size_t want, done = 0;
	char hex[65];
	int err;

	if (index >= w->n_ids) {
		*errmsg = moat_asprintf("%s: chunk %llu of %zu", w->path,
		    (unsigned long long)index, w->n_ids);
		return MOAT_INVALID_ARGUMENT;
	}
	id =
	    (const struct moat_chunk_id *)(w->ids + index * MOAT_CHUNK_ID_LEN);
	want = (size_t)(w->size - off < w->chunk_size ? w->size - off :
	                                                w->chunk_size);
	if (moat_chunk_id_is_zero(id) || len != want) {
		*errmsg = moat_asprintf("%s: chunk %llu: %s", w->path,
		    (unsigned long long)index,
		    moat_chunk_id_is_zero(id) ?
		        "is a zero chunk (a hole), not written" :
		        "wrong length");
		return MOAT_INVALID_ARGUMENT;
	}
	if (!moat_chunk_verify(data, len, id)) {
		moat_chunk_id_hex(id, hex);
		*errmsg = moat_asprintf("%s: chunk %llu does not match its id "
		                        "%s: refusing to write corrupt data",
		    w->path, (unsigned long long)index, hex);
		return MOAT_DATA_LOSS;
	}
	while (done < len) {
		ssize_t n = pwrite(w->fd, (const char *)data + done,
		    len - done, (off_t)(off + done));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			err = errno;
			*errmsg = moat_asprintf("%s: write at %llu: %s",
			    w->path, (unsigned long long)(off + done),
			    strerror(err));
			return moat_status_from_errno(err);
		}
		done += (size_t)n;
	}
	w->done[index / 8] |= (uint8_t)(1u << (index % 8));
	return MOAT_OK;
}

/* Copies [off, off + len) of `src` to the same length at `dst_off` of
 * `dst`: copy_file_range first (a reflink where the filesystem shares
 * blocks), read and write for what it leaves. Returns 0 or errno. */
static int
copy_bytes(int src, off_t src_off, int dst, off_t dst_off, size_t len)
{
	char buf[64 << 10];

	while (len > 0) {
		ssize_t n =
		    copy_file_range(src, &src_off, dst, &dst_off, len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len -= (size_t)n;
	}
	while (len > 0) {
		size_t want = len < sizeof(buf) ? len : sizeof(buf);
		ssize_t n = pread(src, buf, want, src_off), w = 0;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? errno : EIO; /* the source is short */
		while (w < n) {
			ssize_t k =
			    pwrite(dst, buf + w, (size_t)(n - w), dst_off + w);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				return k < 0 ? errno : EIO;
			w += k;
		}
		src_off += n;
		dst_off += n;
		len -= (size_t)n;
	}
	return 0;
}

int
moat_chunk_writer_copy_trusted(struct moat_chunk_writer *w, uint64_t first,
    uint64_t n, int src_fd, uint64_t src_first, char **errmsg)
{
	uint64_t off = first * w->chunk_size, end, len;
	int err;

	if (n == 0 || first >= w->n_ids || n > w->n_ids - first) {
		*errmsg = moat_asprintf("%s: chunks %llu+%llu of %zu", w->path,
		    (unsigned long long)first, (unsigned long long)n,
		    w->n_ids);
		return MOAT_INVALID_ARGUMENT;
	}
	for (uint64_t i = first; i < first + n; i++)
		if (moat_chunk_id_is_zero(
		        (const struct moat_chunk_id *)(w->ids +
		            i * MOAT_CHUNK_ID_LEN))) {
			*errmsg = moat_asprintf("%s: chunk %llu is a zero "
			                        "chunk (a hole), not copied",
			    w->path, (unsigned long long)i);
			return MOAT_INVALID_ARGUMENT;
		}
	end = (first + n) * w->chunk_size;
	len = (end < w->size ? end : w->size) - off;
	if ((err = copy_bytes(src_fd, (off_t)(src_first * w->chunk_size),
	         w->fd, (off_t)off, (size_t)len)) != 0) {
		*errmsg = moat_asprintf("%s: copying chunks %llu+%llu from a "
		                        "local file: %s",
		    w->path, (unsigned long long)first, (unsigned long long)n,
		    strerror(err));
		return moat_status_from_errno(err);
	}
	for (uint64_t i = first; i < first + n; i++)
		w->done[i / 8] |= (uint8_t)(1u << (i % 8));
	return MOAT_OK;
}

uint64_t
moat_chunk_writer_next_missing(const struct moat_chunk_writer *w,
    uint64_t from)
{
	for (uint64_t i = from; i < w->n_ids; i++) {
		const struct moat_chunk_id *id =
		    (const struct moat_chunk_id *)(w->ids +
		        i * MOAT_CHUNK_ID_LEN);

		if (!(w->done[i / 8] & (1u << (i % 8))) &&
		    !moat_chunk_id_is_zero(id))
			return i;
	}
	return UINT64_MAX;
}

int
moat_chunk_writer_commit(struct moat_chunk_writer *w, char **errmsg)
{
	uint64_t missing = moat_chunk_writer_next_missing(w, 0);
	int err, rv;

	if (missing != UINT64_MAX) {
		*errmsg = moat_asprintf("%s: chunk %llu was never written",
		    w->path, (unsigned long long)missing);
		rv = MOAT_FAILED_PRECONDITION;
		goto fail;
	}
	if (fsync(w->fd) != 0 || rename(w->tmp_path, w->path) != 0) {
		err = errno;
		*errmsg = moat_asprintf("%s: finishing the file: %s", w->path,
		    strerror(err));
		rv = moat_status_from_errno(err);
		goto fail;
	}
	free(w->tmp_path);
	w->tmp_path = NULL; /* renamed: nothing for abort to remove */
	moat_chunk_writer_abort(w);
	return MOAT_OK;

fail:
	moat_chunk_writer_abort(w);
	return rv;
}

void
moat_chunk_writer_abort(struct moat_chunk_writer *w)
{
	if (w == NULL)
		return;
	if (w->fd >= 0) {
		close(w->fd);
		if (w->tmp_path != NULL)
			unlink(w->tmp_path);
	}
	free(w->path);
	free(w->tmp_path);
	free(w->ids);
	free(w->done);
	free(w);
}

int
moat_chunk_assemble(const char *path, uint64_t size, uint32_t chunk_size,
    const uint8_t *ids, size_t n_ids, moat_chunk_source_fn source, void *arg,
    char **errmsg)
{
	struct moat_chunk_writer *w = NULL;
	uint8_t *buf = NULL;
	uint64_t i;
	int rv;

	if ((rv = moat_chunk_writer_open(&w, path, size, chunk_size, ids,
	         n_ids, errmsg)) != MOAT_OK)
		return rv;
	if ((buf = malloc(chunk_size)) == NULL) {
		*errmsg = moat_asprintf("%s: out of memory", path);
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
	}
	for (i = moat_chunk_writer_next_missing(w, 0); i != UINT64_MAX;
	     i = moat_chunk_writer_next_missing(w, i + 1)) {
		uint64_t off = i * chunk_size;
		size_t len = (size_t)(size - off < chunk_size ? size - off :
		                                                chunk_size);
		const struct moat_chunk_id *id =
		    (const struct moat_chunk_id *)(ids +
		        i * MOAT_CHUNK_ID_LEN);

		if ((rv = source(i, id, buf, len, arg, errmsg)) != MOAT_OK ||
		    (rv = moat_chunk_writer_put(w, i, buf, len, errmsg)) !=
		        MOAT_OK)
			goto fail;
	}
	free(buf);
	return moat_chunk_writer_commit(w, errmsg);

fail:
	free(buf);
	moat_chunk_writer_abort(w);
	return rv;
}
