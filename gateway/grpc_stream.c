/*
 * grpc_stream.c: the pure pieces of the gRPC door's streams
 * (grpc_stream.h): the bounded message queue a stream's producer fills
 * and nghttp2's data provider drains, the request stream's message
 * splitter, and where an ExecStream stands after an ExecRead.
 * Not for: nghttp2, sockets or threads (grpc.c).
 */
#include <stdlib.h>
#include <string.h>

#include "grpc.h"
#include "grpc_stream.h"
#include "moat/status.h"

struct moat_grpc_chunk {
	struct moat_grpc_chunk *next;
	size_t len, off;
	uint8_t data[];
};

void
moat_grpc_queue_init(struct moat_grpc_queue *q, size_t cap, size_t *total,
    size_t total_cap)
{
	memset(q, 0, sizeof(*q));
	q->cap = cap;
	q->total = total;
	q->total_cap = total_cap;
}

bool
moat_grpc_queue_room(const struct moat_grpc_queue *q)
{
	return q->bytes < q->cap &&
	    (q->total == NULL || *q->total < q->total_cap);
}

int
moat_grpc_queue_push(struct moat_grpc_queue *q, const uint8_t *msg, size_t len)
{
	struct moat_grpc_chunk *ch;

	if (len > MOAT_GRPC_MAX_MESSAGE ||
	    (ch = malloc(sizeof(*ch) + MOAT_GRPC_PREFIX + len)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	ch->next = NULL;
	ch->off = 0;
	ch->len = MOAT_GRPC_PREFIX + len;
	moat_grpc_frame_header(ch->data, (uint32_t)len);
	if (len > 0)
		memcpy(ch->data + MOAT_GRPC_PREFIX, msg, len);
	if (q->tail != NULL)
		q->tail->next = ch;
	else
		q->head = ch;
	q->tail = ch;
	q->bytes += ch->len;
	if (q->total != NULL)
		*q->total += ch->len;
	return MOAT_OK;
}

size_t
moat_grpc_queue_read(struct moat_grpc_queue *q, uint8_t *buf, size_t max)
{
	struct moat_grpc_chunk *ch;
	size_t done = 0, n;

	while (done < max && (ch = q->head) != NULL) {
		n = ch->len - ch->off;
		if (n > max - done)
			n = max - done;
		memcpy(buf + done, ch->data + ch->off, n);
		ch->off += n;
		done += n;
		if (ch->off == ch->len) {
			if ((q->head = ch->next) == NULL)
				q->tail = NULL;
			free(ch);
		}
	}
	q->bytes -= done;
	if (q->total != NULL)
		*q->total -= done;
	return done;
}

void
moat_grpc_queue_clear(struct moat_grpc_queue *q)
{
	struct moat_grpc_chunk *ch, *next;
	size_t left = 0;

	for (ch = q->head; ch != NULL; ch = next) {
		next = ch->next;
		left += ch->len - ch->off;
		free(ch);
	}
	q->head = q->tail = NULL;
	if (q->total != NULL)
		*q->total -= left;
	q->bytes = 0;
}

int
moat_grpc_next_message(const uint8_t *buf, size_t len, size_t max,
    const uint8_t **msg, size_t *msg_len, size_t *used, const char **why)
{
	uint32_t n;

	if (len < MOAT_GRPC_PREFIX)
		return 0;
	if (buf[0] != 0) {
		*why = buf[0] == 1 ? "compression not supported" :
		                     "the message's compressed flag is not 0 "
		                     "or 1";
		return -1;
	}
	n = (uint32_t)buf[1] << 24 | (uint32_t)buf[2] << 16 |
	    (uint32_t)buf[3] << 8 | buf[4];
	if (n > max) {
		*why = "the message is larger than this method takes";
		return -1;
	}
	if (len - MOAT_GRPC_PREFIX < n)
		return 0;
	*msg = buf + MOAT_GRPC_PREFIX;
	*msg_len = n;
	*used = MOAT_GRPC_PREFIX + (size_t)n;
	return 1;
}

bool
moat_grpc_exec_advance(struct moat_grpc_exec_pos *p,
    const Moat__V1__ExecReadReply *rr)
{
	bool had_output = rr->stdout.len > 0 || rr->stderr.len > 0;

	/* An older node may leave *_next 0: count what came instead. */
	p->stdout_offset = rr->stdout_next > p->stdout_offset ?
	    rr->stdout_next :
	    p->stdout_offset + rr->stdout.len;
	p->stderr_offset = rr->stderr_next > p->stderr_offset ?
	    rr->stderr_next :
	    p->stderr_offset + rr->stderr.len;
	/* An exited process whose read came back empty has nothing left,
	 * eof or not (as the HTTP door's event stream decides). */
	return rr->eof ||
	    (rr->status != NULL && rr->status->exited && !had_output);
}

int
moat_grpc_exec_event(struct moat_grpc_queue *q, const Moat__V1__ExecEvent *ev)
{
	size_t n = moat__v1__exec_event__get_packed_size(ev);
	uint8_t *b = malloc(n ? n : 1);
	int rv;

	if (b == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	moat__v1__exec_event__pack(ev, b);
	rv = moat_grpc_queue_push(q, b, n);
	free(b);
	return rv;
}
