/*
 * record_cast.c: the asciicast v2 encoding of a recorded sandbox's
 * terminal session (record_cast.h says the format): the header, output
 * events kept as valid UTF-8 across chunk boundaries, resize events, and
 * the size cap with its closing marker. record_follow.c follows the
 * session and makes the cast a step's stdout; the timestamps it gives
 * are the gateway's arrival times (a replay's pace, not the guest's
 * exact one).
 * Not for: following execs or the step pipeline (record_follow.c,
 * record_step.c), the encoding's users outside recording.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record_cast.h"

/* ---- the encoding ---- */

static int
cast_put(struct moat_cast *c, const char *s, size_t n)
{
	if (c->len + n + 1 > c->alloc) {
		size_t want = c->alloc ? c->alloc : 4096;
		char *nb;

		while (want < c->len + n + 1)
			want *= 2;
		if ((nb = realloc(c->buf, want)) == NULL)
			return -1;
		c->buf = nb;
		c->alloc = want;
	}
	memcpy(c->buf + c->len, s, n);
	c->len += n;
	c->buf[c->len] = '\0';
	return 0;
}

/* utf8_seq: the length of the valid UTF-8 sequence at p (n bytes
 * there), 0 when p holds only a valid start of one, -1 when invalid
 * (overlong forms, surrogates and code points past U+10FFFF too). */
static int
utf8_seq(const uint8_t *p, size_t n)
{
	uint32_t cp;
	int need, i;

	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		need = 2, cp = p[0] & 0x1f;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		need = 3, cp = p[0] & 0x0f;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		need = 4, cp = p[0] & 0x07;
	else
		return -1;
	for (i = 1; i < need; i++) {
		if ((size_t)i >= n)
			return 0;
		if ((p[i] & 0xc0) != 0x80)
			return -1;
		cp = (cp << 6) | (p[i] & 0x3f);
		/* reject as soon as the prefix says overlong or out of
		 * range, so a bad start is not kept as a tail */
		if (i == 1 &&
		    ((need == 3 && cp < 0x20) ||
		        (need == 3 && cp >= 0x360 && cp < 0x380) ||
		        (need == 4 && (cp < 0x10 || cp > 0x10f))))
			return -1;
	}
	return need;
}

int
moat_cast_json_string(struct moat_cast *c, const uint8_t *data, size_t len,
    bool keep_tail)
{
	size_t i = 0;

	if (cast_put(c, "\"", 1) != 0)
		return -1;
	while (i < len) {
		uint8_t b = data[i];
		char esc[8];
		int n;

		if (b == '"' || b == '\\') {
			esc[0] = '\\';
			esc[1] = (char)b;
			if (cast_put(c, esc, 2) != 0)
				return -1;
			i++;
			continue;
		}
		if (b < 0x20 || b == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", b);
			if (cast_put(c, esc, 6) != 0)
				return -1;
			i++;
			continue;
		}
		n = utf8_seq(data + i, len - i);
		if (n == 0 && keep_tail) {
			memcpy(c->tail, data + i, len - i);
			c->tail_len = len - i;
			break;
		}
		if (n <= 0) {
			if (cast_put(c, "\\ufffd", 6) != 0)
				return -1;
			i++;
			continue;
		}
		if (cast_put(c, (const char *)data + i, (size_t)n) != 0)
			return -1;
		i += (size_t)n;
	}
	return cast_put(c, "\"", 1);
}

int
moat_cast_begin(struct moat_cast *c, uint32_t rows, uint32_t cols,
    int64_t timestamp, const char *term, size_t cap)
{
	char head[160];
	int n;

	memset(c, 0, sizeof(*c));
	c->cap = cap ? cap : MOAT_CAST_MAX;
	n = snprintf(head, sizeof(head),
	    "{\"version\": 2, \"width\": %u, \"height\": %u, \"timestamp\": "
	    "%" PRId64 ", \"env\": {\"TERM\": ",
	    cols, rows, timestamp);
	if (cast_put(c, head, (size_t)n) != 0 ||
	    moat_cast_json_string(c, (const uint8_t *)term, strlen(term),
	        false) != 0 ||
	    cast_put(c, "}}\n", 3) != 0)
		return -1;
	return 0;
}

/* cast_event: one event line; past the cap, one marker instead and
 * nothing after it. */
static int
cast_event(struct moat_cast *c, double t, const char *code,
    const uint8_t *data, size_t len)
{
	static const char cut[] =
	    "\r\n[moat: recording truncated here: the cast reached its "
	    "size limit]\r\n";
	char head[64];
	size_t before = c->len;
	int n;

	if (c->truncated)
		return 0;
	n = snprintf(head, sizeof(head), "[%.6f, \"%s\", ", t < 0 ? 0 : t,
	    code);
	if (cast_put(c, head, (size_t)n) != 0 ||
	    moat_cast_json_string(c, data, len, code[0] == 'o') != 0 ||
	    cast_put(c, "]\n", 2) != 0)
		return -1;
	if (c->len <= c->cap)
		return 0;
	/* Over the cap: this event goes, the marker comes instead. */
	c->len = before;
	c->buf[c->len] = '\0';
	c->truncated = true;
	c->tail_len = 0;
	n = snprintf(head, sizeof(head), "[%.6f, \"o\", ", t < 0 ? 0 : t);
	if (cast_put(c, head, (size_t)n) != 0 ||
	    moat_cast_json_string(c, (const uint8_t *)cut, sizeof(cut) - 1,
	        false) != 0 ||
	    cast_put(c, "]\n", 2) != 0)
		return -1;
	return 0;
}

int
moat_cast_output(struct moat_cast *c, double t, const uint8_t *data,
    size_t len)
{
	uint8_t *joined;
	int rv;

	if (c->tail_len == 0)
		return len == 0 ? 0 : cast_event(c, t, "o", data, len);
	/* The last chunk ended inside a character: it starts this one. */
	if ((joined = malloc(c->tail_len + len)) == NULL)
		return -1;
	memcpy(joined, c->tail, c->tail_len);
	memcpy(joined + c->tail_len, data, len);
	len += c->tail_len;
	c->tail_len = 0;
	rv = cast_event(c, t, "o", joined, len);
	free(joined);
	return rv;
}

int
moat_cast_resize(struct moat_cast *c, double t, uint32_t rows, uint32_t cols)
{
	char size[32];
	int n = snprintf(size, sizeof(size), "%ux%u", cols, rows);

	return cast_event(c, t, "r", (const uint8_t *)size, (size_t)n);
}

void
moat_cast_fini(struct moat_cast *c)
{
	free(c->buf);
	memset(c, 0, sizeof(*c));
}
