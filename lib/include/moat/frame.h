/*
 * frame.h: length-prefixed frames on a byte stream (the guest link): a
 * 4-byte big-endian length, then that many bytes of one protobuf message.
 * The reader is incremental (feed what read(2) gave, take whole frames)
 * and refuses any length over its cap, so a hostile peer cannot make the
 * reader allocate without bound. Not for: nng messages (nng frames them).
 */
#ifndef MOAT_FRAME_H
#define MOAT_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define MOAT_FRAME_MAX (4u << 20)    /* hard cap of one frame */
#define MOAT_GUEST_IO_MAX (1u << 20) /* file data per guest frame */

struct moat_frame_reader {
	uint8_t *buf;     /* owned; bytes not yet taken */
	size_t len;       /* bytes in buf */
	size_t alloc;     /* allocated size of buf */
	size_t max_frame; /* cap on one frame's length */
};

/* moat_frame_reader_init: zeroes the reader and sets the cap (0 means
 * MOAT_FRAME_MAX). Never allocates. */
void moat_frame_reader_init(struct moat_frame_reader *r, size_t max_frame);

/* moat_frame_reader_feed: appends bytes. Returns 0, or MOAT_RESOURCE_
 * EXHAUSTED when one feed is over max_frame + 4 bytes or more than one
 * frame's worth is still buffered (the caller must call next until it
 * returns no frame after every feed), or MOAT_INTERNAL on allocation
 * failure. The buffer never holds more than twice the cap. */
int moat_frame_reader_feed(struct moat_frame_reader *r, const void *data,
    size_t len) __attribute__((warn_unused_result));

/* moat_frame_reader_next: if a whole frame is buffered, sets *frame and
 * *len to a heap copy of its body (the caller frees) and returns 0.
 * Returns MOAT_UNAVAILABLE when no whole frame is there yet, and
 * MOAT_OUT_OF_RANGE when the next frame's declared length is over the cap
 * (the stream is then unusable). */
int moat_frame_reader_next(struct moat_frame_reader *r, uint8_t **frame,
    size_t *len) __attribute__((warn_unused_result));

/* moat_frame_reader_fini: frees the buffer; safe on a zeroed reader. */
void moat_frame_reader_fini(struct moat_frame_reader *r);

/* moat_frame_encode: a heap buffer holding the 4-byte length and body;
 * *out_len set. The caller frees. NULL on allocation failure or when
 * len > MOAT_FRAME_MAX. */
uint8_t *moat_frame_encode(const void *body, size_t len, size_t *out_len);

/* moat_frame_write_all: writes the whole buffer to a blocking fd,
 * retrying on EINTR and short writes. Returns 0 or an errno value. */
int moat_frame_write_all(int fd, const void *buf, size_t len)
    __attribute__((warn_unused_result));

#endif
