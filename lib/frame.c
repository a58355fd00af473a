/*
 * frame.c: length-prefixed frames for the guest link, with a hard cap so a
 * hostile peer cannot make the reader grow without bound. Not for: nng.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moat/frame.h"
#include "moat/status.h"

void
moat_frame_reader_init(struct moat_frame_reader *r, size_t max_frame)
{
	memset(r, 0, sizeof(*r));
	r->max_frame = max_frame ? max_frame : MOAT_FRAME_MAX;
}

static size_t
frame_declared_len(const uint8_t *p)
{
	return ((size_t)p[0] << 24) | ((size_t)p[1] << 16) |
	    ((size_t)p[2] << 8) | (size_t)p[3];
}

int
moat_frame_reader_feed(struct moat_frame_reader *r, const void *data,
    size_t len)
{
	size_t need = r->len + len;

	if (len == 0)
		return MOAT_OK;
	/* What is buffered is at most one partial frame when the caller
	 * took every whole frame after its last feed; more means it did
	 * not, or the peer declared a frame over the cap. One feed is
	 * bounded too, so the buffer never passes twice the cap. */
	if (r->len > r->max_frame + 4 || len > r->max_frame + 4)
		return MOAT_RESOURCE_EXHAUSTED;
	if (need > r->alloc) {
		size_t n = r->alloc ? r->alloc : 4096;
		uint8_t *nb;

		while (n < need)
			n *= 2;
		if (n > 2 * (r->max_frame + 4))
			n = 2 * (r->max_frame + 4);
		if ((nb = realloc(r->buf, n)) == NULL)
			return MOAT_INTERNAL;
		r->buf = nb;
		r->alloc = n;
	}
	memcpy(r->buf + r->len, data, len);
	r->len += len;
	return MOAT_OK;
}

int
moat_frame_reader_next(struct moat_frame_reader *r, uint8_t **frame,
    size_t *len)
{
	size_t body;
	uint8_t *copy;

	*frame = NULL;
	*len = 0;
	if (r->len < 4)
		return MOAT_UNAVAILABLE;
	body = frame_declared_len(r->buf);
	if (body > r->max_frame)
		return MOAT_OUT_OF_RANGE;
	if (r->len < 4 + body)
		return MOAT_UNAVAILABLE;
	if ((copy = malloc(body ? body : 1)) == NULL)
		return MOAT_INTERNAL;
	memcpy(copy, r->buf + 4, body);
	memmove(r->buf, r->buf + 4 + body, r->len - 4 - body);
	r->len -= 4 + body;
	/* Give memory back after a large frame: an idle link stays small. */
	if (r->alloc > 65536 && r->len < 4096) {
		uint8_t *nb = realloc(r->buf, 4096);
		if (nb != NULL) {
			r->buf = nb;
			r->alloc = 4096;
		}
	}
	*frame = copy;
	*len = body;
	return MOAT_OK;
}

void
moat_frame_reader_fini(struct moat_frame_reader *r)
{
	free(r->buf);
	r->buf = NULL;
	r->len = r->alloc = 0;
}

uint8_t *
moat_frame_encode(const void *body, size_t len, size_t *out_len)
{
	uint8_t *out;

	if (len > MOAT_FRAME_MAX)
		return NULL;
	if ((out = malloc(len + 4)) == NULL)
		return NULL;
	out[0] = (uint8_t)(len >> 24);
	out[1] = (uint8_t)(len >> 16);
	out[2] = (uint8_t)(len >> 8);
	out[3] = (uint8_t)len;
	if (len)
		memcpy(out + 4, body, len);
	*out_len = len + 4;
	return out;
}

int
moat_frame_write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}
