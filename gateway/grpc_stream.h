/*
 * grpc_stream.h: the pure pieces of the gRPC door's streams
 * (grpc_stream.c): a bounded queue of length-prefixed messages waiting
 * for HTTP/2 flow control to let them out, counted against one budget
 * the whole door shares; the splitting of a request stream into its
 * messages; and the ExecStream bookkeeping of one ExecRead's answer.
 * Not for: sockets, threads or nghttp2 (grpc.c owns those; a queue is
 * used by one thread only), or calls to the gateway.
 */
#ifndef MOAT_GATEWAY_GRPC_STREAM_H
#define MOAT_GATEWAY_GRPC_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vm.pb-c.h"

#define MOAT_GRPC_STREAM_QUEUE (1u << 20) /* a stream's queue: 1 MiB */
#define MOAT_GRPC_BUFFER_MIB 64           /* the door's, by default */

struct moat_grpc_chunk;

/* A stream's messages not yet sent. The producer asks for room before
 * it makes more (moat_grpc_queue_room), so a queue holds at most its
 * cap plus one producer's step: a client that stops reading stops the
 * producer instead of growing memory. */
struct moat_grpc_queue {
	struct moat_grpc_chunk *head, *tail;
	size_t bytes;     /* queued here, prefixes included */
	size_t cap;       /* this stream's room */
	size_t *total;    /* the door's count, shared by its queues */
	size_t total_cap; /* the door's room */
};

/* moat_grpc_queue_init: an empty queue of `cap` bytes that also counts
 * into *total (shared, same thread) up to total_cap. */
void moat_grpc_queue_init(struct moat_grpc_queue *q, size_t cap, size_t *total,
    size_t total_cap);

/* moat_grpc_queue_room: whether the producer may add a message: both
 * this queue and the door are under their caps. */
bool moat_grpc_queue_room(const struct moat_grpc_queue *q);

/* moat_grpc_queue_push: appends `msg` (`len` bytes) with its 5-byte
 * prefix. MOAT_OK; RESOURCE_EXHAUSTED when out of memory or larger
 * than MOAT_GRPC_MAX_MESSAGE (nothing appended). Does not check room:
 * the caller did. */
int moat_grpc_queue_push(struct moat_grpc_queue *q, const uint8_t *msg,
    size_t len) __attribute__((warn_unused_result));

/* moat_grpc_queue_read: moves up to `max` queued bytes into buf; the
 * number moved (0: empty). */
size_t moat_grpc_queue_read(struct moat_grpc_queue *q, uint8_t *buf,
    size_t max);

/* moat_grpc_queue_clear: drops everything queued. */
void moat_grpc_queue_clear(struct moat_grpc_queue *q);

/* moat_grpc_next_message: the first whole message of a request stream's
 * `len` buffered bytes, at most `max` bytes long: 1 with *msg and
 * *msg_len set and *used the bytes it took (prefix included); 0 when
 * more bytes must come; -1 when it cannot be a message (compressed, or
 * over max), with *why a static string saying which. */
int moat_grpc_next_message(const uint8_t *buf, size_t len, size_t max,
    const uint8_t **msg, size_t *msg_len, size_t *used, const char **why);

/* One ExecStream's place in its process's output. */
struct moat_grpc_exec_pos {
	uint64_t stdout_offset, stderr_offset;
};

/* moat_grpc_exec_advance: the offsets past one ExecRead reply `rr`;
 * true when the stream is over (the process exited and everything was
 * read: eof, or an exited status with nothing new). */
bool moat_grpc_exec_advance(struct moat_grpc_exec_pos *p,
    const Moat__V1__ExecReadReply *rr);

/* moat_grpc_exec_event: packs ExecEvent `ev` and pushes it onto q. */
int moat_grpc_exec_event(struct moat_grpc_queue *q,
    const Moat__V1__ExecEvent *ev) __attribute__((warn_unused_result));

#endif
