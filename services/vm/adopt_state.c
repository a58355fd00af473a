/*
 * adopt_state.c: the codec of a sandbox's state file (adopt.h). Text,
 * one field per line, "key value" with the value percent-encoded (any
 * byte below '!', above '~', and '%' itself), so a person can read it
 * and a truncated file is told apart from a whole one: it starts with
 * VMD_STATE_MAGIC and ends with the line "end". Unknown keys are skipped
 * (a newer vmd may add some); a missing required key, a bad number or a
 * line without its key is an error naming the line. Pure: no sandbox,
 * no files. Not for: writing or reading the file (adopt.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "adopt.h"

/* A growing text buffer; oom set once an append failed. */
struct state_buf {
	char *text;
	size_t len, cap;
	bool oom;
};

static void
buf_add(struct state_buf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 1024;
		char *t;

		while (cap < b->len + n + 1)
			cap *= 2;
		if ((t = realloc(b->text, cap)) == NULL) {
			b->oom = true;
			return;
		}
		b->text = t;
		b->cap = cap;
	}
	memcpy(b->text + b->len, s, n);
	b->len += n;
	b->text[b->len] = '\0';
}

/* Appends `v` percent-encoded. */
static void
buf_value(struct state_buf *b, const char *v)
{
	static const char hex[] = "0123456789abcdef";

	for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
		if (*p > ' ' && *p < 0x7f && *p != '%') {
			buf_add(b, (const char *)p, 1);
		} else {
			char e[3] = { '%', hex[*p >> 4], hex[*p & 15] };

			buf_add(b, e, 3);
		}
	}
}

/* "key value\n"; a NULL value writes nothing (not set). */
static void
buf_str(struct state_buf *b, const char *key, const char *v)
{
	if (v == NULL)
		return;
	buf_add(b, key, strlen(key));
	buf_add(b, " ", 1);
	buf_value(b, v);
	buf_add(b, "\n", 1);
}

static void
buf_u64(struct state_buf *b, const char *key, uint64_t v)
{
	char num[32];

	snprintf(num, sizeof(num), "%" PRIu64, v);
	buf_str(b, key, num);
}

int
vmd_state_encode(const struct vmd_state_record *r, char **text, size_t *len)
{
	struct state_buf b = { 0 };

	*text = NULL;
	*len = 0;
	buf_add(&b, VMD_STATE_MAGIC "\n", strlen(VMD_STATE_MAGIC) + 1);
	buf_str(&b, "id", r->id);
	buf_str(&b, "tenant", r->tenant);
	buf_str(&b, "image", r->image);
	buf_str(&b, "test-mode", r->test_mode);
	buf_str(&b, "template", r->template_id);
	buf_str(&b, "restored-from", r->restored_from);
	buf_str(&b, "network", r->network);
	buf_str(&b, "accel", r->accel);
	buf_str(&b, "driver", r->driver);
	buf_str(&b, "failure", r->failure);
	buf_str(&b, "vmm-info", r->vmm_info);
	buf_u64(&b, "vcpus", r->vcpus);
	buf_u64(&b, "memory-mib", r->memory_mib);
	buf_u64(&b, "scratch-mib", r->scratch_mib);
	buf_u64(&b, "boot-timeout-ms", r->boot_timeout_ms);
	buf_u64(&b, "created-unix-ms", r->created_unix_ms);
	buf_u64(&b, "pulled-bytes", r->pulled_bytes);
	buf_u64(&b, "boot-ms", r->boot_ms);
	buf_u64(&b, "no-egress-port", r->no_egress_port ? 1 : 0);
	buf_u64(&b, "pid", r->pid > 0 ? (uint64_t)r->pid : 0);
	buf_u64(&b, "jail-uid", r->jail_uid);
	buf_u64(&b, "adoptions", r->adoptions);
	buf_u64(&b, "expires-unix-ms", r->expires_unix_ms);
	buf_u64(&b, "idle-timeout-s", r->idle_timeout_s);
	buf_u64(&b, "last-active-unix-ms", r->last_active_unix_ms);
	for (size_t i = 0; i < r->n_labels; i++) {
		buf_add(&b, "label ", 6);
		buf_value(&b, r->label_keys[i]);
		buf_add(&b, " ", 1);
		buf_value(&b, r->label_values[i]);
		buf_add(&b, "\n", 1);
	}
	buf_add(&b, "end\n", 4);
	if (b.oom) {
		free(b.text);
		return MOAT_INTERNAL;
	}
	*text = b.text;
	*len = b.len;
	return MOAT_OK;
}

/* ---- decode ---- */

static int
hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The percent-decoded copy of s[0..n) (heap), or NULL with *bad set
 * when an escape is broken (or out of memory: *bad stays false). */
static char *
unescape(const char *s, size_t n, bool *bad)
{
	char *out = malloc(n + 1);
	size_t o = 0;

	*bad = false;
	if (out == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] != '%') {
			out[o++] = s[i];
			continue;
		}
		int hi = i + 2 < n ? hexval(s[i + 1]) : -1;
		int lo = i + 2 < n ? hexval(s[i + 2]) : -1;

		if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
			*bad = true;
			break;
		}
		out[o++] = (char)(hi << 4 | lo);
		i += 2;
	}
	if (*bad) {
		free(out);
		return NULL;
	}
	out[o] = '\0';
	return out;
}

static bool
parse_u64(const char *v, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long x;

	if (v[0] < '0' || v[0] > '9')
		return false;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno != 0 || *end != '\0' || x > max)
		return false;
	*out = x;
	return true;
}

/* Where each string key goes. */
static char **
str_field(struct vmd_state_record *r, const char *key)
{
	static const struct {
		const char *key;
		size_t off;
	} keys[] = {
		{ "id", offsetof(struct vmd_state_record, id) },
		{ "tenant", offsetof(struct vmd_state_record, tenant) },
		{ "image", offsetof(struct vmd_state_record, image) },
		{ "test-mode", offsetof(struct vmd_state_record, test_mode) },
		{ "template", offsetof(struct vmd_state_record, template_id) },
		{ "restored-from",
		    offsetof(struct vmd_state_record, restored_from) },
		{ "network", offsetof(struct vmd_state_record, network) },
		{ "accel", offsetof(struct vmd_state_record, accel) },
		{ "driver", offsetof(struct vmd_state_record, driver) },
		{ "failure", offsetof(struct vmd_state_record, failure) },
		{ "vmm-info", offsetof(struct vmd_state_record, vmm_info) },
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strcmp(keys[i].key, key) == 0)
			return (char **)(void *)((char *)r + keys[i].off);
	return NULL;
}

/* Sets the number field `key` from `v`: 1 set, 0 not a number key, -1
 * a bad number. */
static int
num_field(struct vmd_state_record *r, const char *key, const char *v)
{
	uint64_t x;

#define NUM(k, field, max)                                                    \
	if (strcmp(key, k) == 0) {                                            \
		if (!parse_u64(v, (max), &x))                                 \
			return -1;                                            \
		r->field = x;                                                 \
		return 1;                                                     \
	}
	NUM("vcpus", vcpus, UINT32_MAX)
	NUM("memory-mib", memory_mib, UINT32_MAX)
	NUM("scratch-mib", scratch_mib, UINT64_MAX)
	NUM("boot-timeout-ms", boot_timeout_ms, UINT32_MAX)
	NUM("created-unix-ms", created_unix_ms, UINT64_MAX)
	NUM("pulled-bytes", pulled_bytes, UINT64_MAX)
	NUM("boot-ms", boot_ms, UINT64_MAX)
	NUM("no-egress-port", no_egress_port, 1)
	NUM("pid", pid, INT32_MAX)
	NUM("jail-uid", jail_uid, UINT32_MAX)
	NUM("adoptions", adoptions, UINT32_MAX)
	NUM("expires-unix-ms", expires_unix_ms, UINT64_MAX)
	NUM("idle-timeout-s", idle_timeout_s, UINT32_MAX)
	NUM("last-active-unix-ms", last_active_unix_ms, UINT64_MAX)
#undef NUM
	return 0;
}

/* One "label KEY VALUE" line's rest. Returns false when malformed (or
 * out of memory: *oom). */
static bool
add_label(struct vmd_state_record *r, const char *rest, size_t n, bool *oom)
{
	const char *sp = memchr(rest, ' ', n);
	char **k, **v;
	char *key, *value;
	bool bad = false;

	*oom = false;
	if (sp == NULL || sp == rest)
		return false;
	key = unescape(rest, (size_t)(sp - rest), &bad);
	value =
	    key ? unescape(sp + 1, n - (size_t)(sp - rest) - 1, &bad) : NULL;
	k = realloc(r->label_keys, (r->n_labels + 1) * sizeof(*k));
	if (k != NULL)
		r->label_keys = k;
	v = realloc(r->label_values, (r->n_labels + 1) * sizeof(*v));
	if (v != NULL)
		r->label_values = v;
	if (key == NULL || value == NULL || k == NULL || v == NULL) {
		*oom = !bad;
		free(key);
		free(value);
		return false;
	}
	r->label_keys[r->n_labels] = key;
	r->label_values[r->n_labels++] = value;
	return true;
}

/* One line (without its newline), number `no`. Returns 0, or a status
 * with *why. */
static int
decode_line(struct vmd_state_record *r, const char *line, size_t n, int no,
    char **why)
{
	const char *sp = memchr(line, ' ', n);
	size_t klen = sp ? (size_t)(sp - line) : n;
	const char *val = sp ? sp + 1 : line + n;
	size_t vlen = n - (size_t)(val - line);
	char key[32];
	char **field;
	char *v;
	bool bad = false, oom = false;
	int got;

	if (klen == 0 || klen >= sizeof(key)) {
		*why = moat_asprintf("line %d has no key", no);
		return MOAT_INVALID_ARGUMENT;
	}
	memcpy(key, line, klen);
	key[klen] = '\0';
	if (strcmp(key, "label") == 0) {
		if (add_label(r, val, vlen, &oom))
			return MOAT_OK;
		*why = oom ? strdup("out of memory") :
		             moat_asprintf("line %d: a label is not "
		                           "\"label KEY VALUE\"",
		                 no);
		return oom ? MOAT_INTERNAL : MOAT_INVALID_ARGUMENT;
	}
	if ((v = unescape(val, vlen, &bad)) == NULL) {
		*why = bad ? moat_asprintf("line %d (%s): a broken %%-escape",
		                 no, key) :
		             strdup("out of memory");
		return bad ? MOAT_INVALID_ARGUMENT : MOAT_INTERNAL;
	}
	if ((field = str_field(r, key)) != NULL) {
		free(*field);
		*field = v;
		return MOAT_OK;
	}
	got = num_field(r, key, v);
	if (got < 0)
		*why = moat_asprintf("line %d: %s \"%.40s\" is not a number "
		                     "in range",
		    no, key, v);
	free(v);
	return got < 0 ? MOAT_INVALID_ARGUMENT : MOAT_OK;
}

/* The fields every state file must have. */
static int
decode_check(const struct vmd_state_record *r, char **why)
{
	const char *missing = r->id == NULL ? "id" :
	    r->tenant == NULL               ? "tenant" :
	    r->image == NULL                ? "image" :
	    r->driver == NULL               ? "driver" :
	    r->memory_mib == 0              ? "memory-mib" :
	    r->vcpus == 0                   ? "vcpus" :
	                                      NULL;

	if (missing != NULL) {
		*why = moat_asprintf("it has no %s", missing);
		return MOAT_INVALID_ARGUMENT;
	}
	if (strncmp(r->id, "sb-", 3) != 0 || strlen(r->id) != 19 ||
	    strspn(r->id + 3, "0123456789abcdef") != 16) {
		*why = moat_asprintf("its id \"%.40s\" is not a sandbox id",
		    r->id);
		return MOAT_INVALID_ARGUMENT;
	}
	if (r->failure == NULL && r->pid <= 1) {
		*why = strdup("it names no VMM pid");
		return MOAT_INVALID_ARGUMENT;
	}
	return MOAT_OK;
}

int
vmd_state_decode(const char *text, size_t len, struct vmd_state_record *r,
    char **why)
{
	size_t magic = strlen(VMD_STATE_MAGIC);
	const char *p = text, *end = text + len;
	bool ended = false;
	int no = 1;
	int rv;

	memset(r, 0, sizeof(*r));
	*why = NULL;
	if (len > VMD_STATE_MAX) {
		*why = moat_asprintf("it is %zu bytes, over the %u-byte cap",
		    len, VMD_STATE_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if (len < magic + 1 || memcmp(text, VMD_STATE_MAGIC, magic) != 0 ||
	    text[magic] != '\n') {
		*why = len == 0 ?
		    strdup("it is empty") :
		    strdup("it does not start with \"" VMD_STATE_MAGIC
		           "\" (another version, or not a "
		           "state file)");
		return MOAT_INVALID_ARGUMENT;
	}
	p += magic + 1;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n;

		no++;
		if (nl == NULL)
			break; /* a last line without its newline: truncated */
		n = (size_t)(nl - p);
		if (memchr(p, '\0', n) != NULL) {
			*why = moat_asprintf("line %d holds a NUL byte", no);
			return MOAT_INVALID_ARGUMENT;
		}
		if (n == 3 && memcmp(p, "end", 3) == 0) {
			ended = nl + 1 == end;
			if (!ended) {
				*why = moat_asprintf("line %d: text after "
				                     "the end line",
				    no + 1);
				return MOAT_INVALID_ARGUMENT;
			}
			break;
		}
		if ((rv = decode_line(r, p, n, no, why)) != MOAT_OK)
			return rv;
		p = nl + 1;
	}
	if (!ended) {
		*why = moat_asprintf("it is truncated after line %d (no "
		                     "\"end\" line): vmd died while writing "
		                     "it, or the disk lost it",
		    no - 1);
		return MOAT_INVALID_ARGUMENT;
	}
	return decode_check(r, why);
}

void
vmd_state_record_fini(struct vmd_state_record *r)
{
	free(r->id);
	free(r->tenant);
	free(r->image);
	free(r->test_mode);
	free(r->template_id);
	free(r->restored_from);
	free(r->network);
	free(r->accel);
	free(r->driver);
	free(r->failure);
	free(r->vmm_info);
	for (size_t i = 0; i < r->n_labels; i++) {
		free(r->label_keys[i]);
		free(r->label_values[i]);
	}
	free(r->label_keys);
	free(r->label_values);
	memset(r, 0, sizeof(*r));
}
