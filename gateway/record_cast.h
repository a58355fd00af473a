/*
 * record_cast.h: a recorded sandbox's terminal session (`moat shell`, an
 * ExecStart with pty) as an asciicast v2 file (asciinema's format): a
 * header line of JSON, then one JSON array per event, [seconds, "o",
 * text] for output and [seconds, "r", "COLSxROWS"] for a resize. The
 * encoding (moat_cast_*) is pure and unit tested; the watcher that
 * follows a session and makes it a step lives in record_follow.c.
 * Not for: the step pipeline itself (record_step.c).
 */
#ifndef MOAT_GATEWAY_RECORD_CAST_H
#define MOAT_GATEWAY_RECORD_CAST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most a cast keeps (the step's stdout); past it one last event says
 * it was cut and nothing more is added. */
#define MOAT_CAST_MAX (4u << 20)

struct moat_cast {
	char *buf; /* heap, NUL-terminated */
	size_t len, alloc, cap;
	bool truncated;
	/* The start of a UTF-8 sequence that the next output completes
	 * (chunks split characters anywhere). */
	uint8_t tail[4];
	size_t tail_len;
};

/* moat_cast_begin: the header line for a rows x cols terminal of type
 * `term` started at unix second `timestamp`; at most `cap` bytes in all
 * (0: MOAT_CAST_MAX). Returns 0, or -1 out of memory. */
int moat_cast_begin(struct moat_cast *c, uint32_t rows, uint32_t cols,
    int64_t timestamp, const char *term, size_t cap);

/* moat_cast_output: an "o" event `t` seconds after the start with the
 * bytes `data`: valid UTF-8 kept, control characters escaped, any other
 * byte as U+FFFD. Returns 0, or -1 out of memory. */
int moat_cast_output(struct moat_cast *c, double t, const uint8_t *data,
    size_t len);

/* moat_cast_resize: an "r" event "COLSxROWS". */
int moat_cast_resize(struct moat_cast *c, double t, uint32_t rows,
    uint32_t cols);

/* moat_cast_json_string: `len` bytes as a JSON string literal (with its
 * quotes) appended to c, as moat_cast_output escapes them; bytes of an
 * unfinished UTF-8 sequence at the end are put in c->tail when
 * keep_tail, else each is U+FFFD. Ignores the cap. */
int moat_cast_json_string(struct moat_cast *c, const uint8_t *data, size_t len,
    bool keep_tail);

void moat_cast_fini(struct moat_cast *c);

#endif
