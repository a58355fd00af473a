/*
 * codec_decode.c: the descriptor-driven JSON -> protobuf-c decoder behind
 * moat_codec_from_json (proto3 JSON mapping, the inverse of codec.c). It
 * walks a JSON object, finds each key's field by its lowerCamelCase or
 * .proto name, checks the JSON type and range against the field's type,
 * and fills a heap message the way protobuf-c's unpack does (every member
 * from malloc), so protobuf_c_message_free_unpacked(msg, NULL) frees it,
 * also when decoding stopped half-way. Errors name the field by its path
 * ("exec.timeoutMs") and say what was expected and what came.
 * Not for: parsing JSON text (jansson does it) or JSON -> message special
 * cases of one message (the HTTP door puts URL parts into the JSON before
 * calling this).
 */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "moat/codec.h"
#include "moat/status.h"
#include "moat/util.h"

struct dec {
	unsigned flags;
	char *errmsg; /* first error, heap */
	int status;
	char path[512]; /* "exec.argv[2]", NUL-terminated */
	size_t path_len;
};

static bool dec_message(struct dec *dc, const ProtobufCMessageDescriptor *d,
    json_t *in, ProtobufCMessage **out, int depth);

/* ---- errors and the field path ---- */

static void
path_advance(struct dec *dc, int n, size_t room)
{
	if (n < 0)
		n = 0;
	dc->path_len += (size_t)n < room ? (size_t)n : room - 1;
}

/* Appends PREFIX KEY SUFFIX to the field path. */
static void
path_push(struct dec *dc, const char *prefix, const char *key,
    const char *suffix)
{
	size_t room = sizeof(dc->path) - dc->path_len;

	path_advance(dc,
	    snprintf(dc->path + dc->path_len, room, "%s%s%s", prefix, key,
	        suffix),
	    room);
}

static void
path_index(struct dec *dc, size_t index)
{
	size_t room = sizeof(dc->path) - dc->path_len;

	path_advance(dc,
	    snprintf(dc->path + dc->path_len, room, "[%zu]", index), room);
}

static void
path_field(struct dec *dc, const char *key)
{
	path_push(dc, dc->path_len == 0 ? "" : ".", key, "");
}

static void
path_pop(struct dec *dc, size_t len)
{
	dc->path_len = len;
	dc->path[len] = '\0';
}

/* got_what: a short description of a JSON value for messages: strings
 * quoted (cut at 40 bytes), numbers as written, else the type. Heap. */
static char *
got_what(json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_STRING: {
		const char *s = json_string_value(v);
		size_t n = json_string_length(v);
		if (n > 40) {
			int cut = 40;
			/* Not in the middle of a UTF-8 sequence. */
			while (
			    cut > 0 && ((unsigned char)s[cut] & 0xc0) == 0x80)
				cut--;
			return moat_asprintf("\"%.*s...\"", cut, s);
		}
		return moat_asprintf("\"%s\"", s);
	}
	case JSON_INTEGER:
		return moat_asprintf("%" JSON_INTEGER_FORMAT,
		    json_integer_value(v));
	case JSON_REAL:
		return moat_asprintf("%.17g", json_real_value(v));
	case JSON_TRUE:
		return strdup("true");
	case JSON_FALSE:
		return strdup("false");
	case JSON_NULL:
		return strdup("null");
	case JSON_OBJECT:
		return strdup("an object");
	case JSON_ARRAY:
		return strdup("an array");
	}
	return strdup("something else");
}

static bool
dec_fail(struct dec *dc, int status, const char *fmt, const char *what,
    json_t *got)
{
	char *g;

	if (dc->errmsg != NULL)
		return false;
	g = got != NULL ? got_what(got) : NULL;
	dc->errmsg = moat_asprintf("%s%s%s%s%s%s", dc->path,
	    dc->path_len > 0 ? ": " : "", fmt, what ? what : "",
	    g ? ", got " : "", g ? g : "");
	free(g);
	dc->status = status;
	return false;
}

static bool
dec_expected(struct dec *dc, const char *what, json_t *got)
{
	return dec_fail(dc, MOAT_INVALID_ARGUMENT, "expected ", what, got);
}

static bool
dec_oom(struct dec *dc)
{
	return dec_fail(dc, MOAT_RESOURCE_EXHAUSTED, "out of memory", NULL,
	    NULL);
}

/* ---- scalars ---- */

/* int_of: a JSON number or numeric string as an integer in [lo, hi]
 * (signed) or [0, uhi] (unsigned). Numbers with a fraction and values
 * out of range are errors. */
static bool
int_of(struct dec *dc, json_t *v, bool is_signed, int64_t lo, int64_t hi,
    uint64_t uhi, const char *type, int64_t *s_out, uint64_t *u_out)
{
	char what[64];

	snprintf(what, sizeof(what), "%s (a number or a numeric string)",
	    type);
	if (json_is_integer(v)) {
		json_int_t i = json_integer_value(v);
		if (is_signed) {
			if (i < lo || i > hi)
				goto range;
			*s_out = i;
		} else {
			if (i < 0 || (uint64_t)i > uhi)
				goto range;
			*u_out = (uint64_t)i;
		}
		return true;
	}
	if (json_is_real(v)) {
		double d = json_real_value(v);
		if (!isfinite(d) || d != floor(d))
			return dec_expected(dc, what, v);
		/* (double)hi + 1 is exactly 2^31 or 2^63 (rounded), so
		 * the casts below never overflow. */
		if (is_signed) {
			if (d < (double)lo || d >= (double)hi + 1.0)
				goto range;
			*s_out = (int64_t)d;
		} else {
			if (d < 0 || d >= (double)uhi + 1.0)
				goto range;
			*u_out = (uint64_t)d;
		}
		return true;
	}
	if (json_is_string(v)) {
		const char *s = json_string_value(v);
		const char *digits = s[0] == '-' ? s + 1 : s;
		char *end;

		/* Digits, after one '-' at most: strtoll and strtoull would
		 * skip any leading white space and take a sign after it (so
		 * "\n-5" read as 2^64 - 5 for an unsigned field). */
		if (!isdigit((unsigned char)digits[0]) ||
		    strlen(s) != json_string_length(v))
			return dec_expected(dc, what, v);
		errno = 0;
		if (is_signed) {
			long long ll = strtoll(s, &end, 10);
			if (*end != '\0')
				return dec_expected(dc, what, v);
			if (errno == ERANGE || ll < lo || ll > hi)
				goto range;
			*s_out = ll;
		} else {
			unsigned long long ull;
			if (s[0] == '-')
				goto range;
			ull = strtoull(s, &end, 10);
			if (*end != '\0')
				return dec_expected(dc, what, v);
			if (errno == ERANGE || ull > uhi)
				goto range;
			*u_out = ull;
		}
		return true;
	}
	return dec_expected(dc, what, v);

range:
	return dec_fail(dc, MOAT_INVALID_ARGUMENT, "out of range for ", type,
	    v);
}

static bool
double_of(struct dec *dc, json_t *v, bool is_float, double *out)
{
	const char *what = is_float ? "a float (a number, \"NaN\", "
	                              "\"Infinity\" or \"-Infinity\")" :
	                              "a double (a number, \"NaN\", "
	                              "\"Infinity\" or \"-Infinity\")";
	double d;

	if (json_is_number(v)) {
		d = json_number_value(v);
	} else if (json_is_string(v)) {
		const char *s = json_string_value(v);
		char *end;

		if (strcmp(s, "NaN") == 0)
			d = NAN;
		else if (strcmp(s, "Infinity") == 0)
			d = INFINITY;
		else if (strcmp(s, "-Infinity") == 0)
			d = -INFINITY;
		else {
			/* Numbers as strings, but not strtod's own
			 * spellings ("inf", "nan", hex). */
			if (s[0] == '\0' ||
			    strspn(s, "0123456789+-.eE") != strlen(s) ||
			    strlen(s) != json_string_length(v))
				return dec_expected(dc, what, v);
			errno = 0;
			d = strtod(s, &end);
			if (*end != '\0')
				return dec_expected(dc, what, v);
			if (errno == ERANGE && isinf(d))
				return dec_fail(dc, MOAT_INVALID_ARGUMENT,
				    "out of range for ",
				    is_float ? "float" : "double", v);
		}
	} else {
		return dec_expected(dc, what, v);
	}
	if (is_float && isfinite(d) && fabs(d) > FLT_MAX)
		return dec_fail(dc, MOAT_INVALID_ARGUMENT, "out of range for ",
		    "float", v);
	*out = d;
	return true;
}

static int
b64_value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+' || c == '-')
		return 62;
	if (c == '/' || c == '_')
		return 63;
	return -1;
}

int
moat_codec_base64_decode(const char *s, size_t len, uint8_t **out,
    size_t *out_len)
{
	size_t pad = 0, n, o = 0;
	uint8_t *buf;
	uint32_t acc = 0;
	int bits = 0;

	*out = NULL;
	*out_len = 0;
	while (pad < 2 && len > 0 && s[len - 1] == '=') {
		len--;
		pad++;
	}
	if (len % 4 == 1 || (pad > 0 && (len + pad) % 4 != 0))
		return MOAT_INVALID_ARGUMENT;
	n = len / 4 * 3 + (len % 4 == 0 ? 0 : len % 4 - 1);
	if ((buf = malloc(n > 0 ? n : 1)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < len; i++) {
		int v = b64_value((unsigned char)s[i]);
		if (v < 0) {
			free(buf);
			return MOAT_INVALID_ARGUMENT;
		}
		acc = (acc << 6) | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			buf[o++] = (uint8_t)(acc >> bits);
		}
	}
	if (n == 0) {
		free(buf);
		return MOAT_OK;
	}
	*out = buf;
	*out_len = o;
	return MOAT_OK;
}

/* ---- one value ---- */

/* dec_value: the JSON value `v` (not null) of field `f` into the member
 * at `p` (the field itself, or one array element). Writes only on
 * success; heap members are malloc'd. */
static bool
dec_value(struct dec *dc, const ProtobufCFieldDescriptor *f, json_t *v,
    void *p, int depth)
{
	int64_t s = 0;
	uint64_t u = 0;
	double d = 0;

	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		if (!int_of(dc, v, true, INT32_MIN, INT32_MAX, 0, "int32", &s,
		        &u))
			return false;
		*(int32_t *)p = (int32_t)s;
		return true;
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		if (!int_of(dc, v, false, 0, 0, UINT32_MAX, "uint32", &s, &u))
			return false;
		*(uint32_t *)p = (uint32_t)u;
		return true;
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		if (!int_of(dc, v, true, INT64_MIN, INT64_MAX, 0, "int64", &s,
		        &u))
			return false;
		*(int64_t *)p = s;
		return true;
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		if (!int_of(dc, v, false, 0, 0, UINT64_MAX, "uint64", &s, &u))
			return false;
		*(uint64_t *)p = u;
		return true;
	case PROTOBUF_C_TYPE_FLOAT:
		if (!double_of(dc, v, true, &d))
			return false;
		*(float *)p = (float)d;
		return true;
	case PROTOBUF_C_TYPE_DOUBLE:
		if (!double_of(dc, v, false, &d))
			return false;
		*(double *)p = d;
		return true;
	case PROTOBUF_C_TYPE_BOOL:
		if (!json_is_boolean(v))
			return dec_expected(dc, "true or false", v);
		*(protobuf_c_boolean *)p = json_is_true(v);
		return true;
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumDescriptor *ed = f->descriptor;
		const ProtobufCEnumValue *ev;

		if (json_is_string(v)) {
			ev = protobuf_c_enum_descriptor_get_value_by_name(ed,
			    json_string_value(v));
			if (ev == NULL)
				return dec_fail(dc, MOAT_INVALID_ARGUMENT,
				    "not a value of ", ed->name, v);
			*(int *)p = ev->value;
			return true;
		}
		if (json_is_integer(v)) {
			/* proto3 enums are open: any int32 is kept. */
			if (!int_of(dc, v, true, INT32_MIN, INT32_MAX, 0,
			        "enum", &s, &u))
				return false;
			*(int *)p = (int)s;
			return true;
		}
		return dec_fail(dc, MOAT_INVALID_ARGUMENT,
		    "expected a value "
		    "name or number of ",
		    ed->name, v);
	}
	case PROTOBUF_C_TYPE_STRING: {
		char *str;

		if (!json_is_string(v))
			return dec_expected(dc, "a string", v);
		if (strlen(json_string_value(v)) != json_string_length(v))
			return dec_fail(dc, MOAT_INVALID_ARGUMENT,
			    "strings may not contain NUL (\\u0000)", NULL,
			    NULL);
		if ((str = strdup(json_string_value(v))) == NULL)
			return dec_oom(dc);
		*(char **)p = str;
		return true;
	}
	case PROTOBUF_C_TYPE_BYTES: {
		ProtobufCBinaryData *b = p;
		uint8_t *data;
		size_t len;
		int rv;

		if (!json_is_string(v))
			return dec_expected(dc, "base64 bytes (a string)", v);
		rv = moat_codec_base64_decode(json_string_value(v),
		    json_string_length(v), &data, &len);
		if (rv == MOAT_RESOURCE_EXHAUSTED)
			return dec_oom(dc);
		if (rv != MOAT_OK)
			return dec_expected(dc,
			    "base64 bytes (standard or "
			    "URL-safe, padding optional)",
			    v);
		b->data = data;
		b->len = len;
		return true;
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		ProtobufCMessage *sub = NULL;
		bool ok = dec_message(dc, f->descriptor, v, &sub, depth + 1);

		/* A half-filled sub-message is kept, so that freeing the
		 * parent frees it. */
		*(ProtobufCMessage **)p = sub;
		return ok;
	}
	}
	return dec_fail(dc, MOAT_INTERNAL,
	    "a field type this codec does not "
	    "know",
	    NULL, NULL);
}

/* ---- maps and repeated fields ---- */

static bool
dec_map_key(struct dec *dc, const ProtobufCFieldDescriptor *kf,
    const char *key, void *p)
{
	json_t *k;
	bool ok;

	if (kf->type == PROTOBUF_C_TYPE_BOOL) {
		if (strcmp(key, "true") != 0 && strcmp(key, "false") != 0)
			return dec_fail(dc, MOAT_INVALID_ARGUMENT,
			    "map key "
			    "must be \"true\" or \"false\"",
			    NULL, NULL);
		*(protobuf_c_boolean *)p = strcmp(key, "true") == 0;
		return true;
	}
	/* Integer keys are parsed as the numeric strings they are. */
	if ((k = json_string(key)) == NULL)
		return dec_oom(dc);
	ok = dec_value(dc, kf, k, p, 0);
	json_decref(k);
	return ok;
}

static bool
dec_map(struct dec *dc, const ProtobufCFieldDescriptor *f, json_t *v,
    char *base, int depth)
{
	const ProtobufCMessageDescriptor *ed = f->descriptor;
	ProtobufCMessage ***arr = (ProtobufCMessage ***)(base + f->offset);
	size_t *n = (size_t *)(base + f->quantifier_offset);
	size_t save = dc->path_len;
	const char *key;
	json_t *val;

	if (!json_is_object(v))
		return dec_expected(dc, "an object (a map)", v);
	if (json_object_size(v) == 0)
		return true;
	if ((*arr = calloc(json_object_size(v), sizeof(**arr))) == NULL)
		return dec_oom(dc);
	json_object_foreach (v, key, val) {
		ProtobufCMessage *entry;
		char *eb;

		path_push(dc, "[\"", key, "\"]");
		if (json_is_null(val))
			return dec_fail(dc, MOAT_INVALID_ARGUMENT,
			    "map values may not be null", NULL, NULL);
		if ((entry = malloc(ed->sizeof_message)) == NULL)
			return dec_oom(dc);
		ed->message_init(entry);
		(*arr)[(*n)++] = entry;
		eb = (char *)entry;
		if (!dec_map_key(dc, &ed->fields[0], key,
		        eb + ed->fields[0].offset) ||
		    !dec_value(dc, &ed->fields[1], val,
		        eb + ed->fields[1].offset, depth))
			return false;
		path_pop(dc, save);
	}
	return true;
}

static bool
dec_repeated(struct dec *dc, const ProtobufCFieldDescriptor *f, json_t *v,
    char *base, int depth)
{
	size_t sz = moat_codec_elem_size(f->type);
	void **arr = (void **)(base + f->offset);
	size_t *n = (size_t *)(base + f->quantifier_offset);
	size_t save = dc->path_len, count;

	if (f->type == PROTOBUF_C_TYPE_MESSAGE &&
	    moat_codec_is_map_entry(f->descriptor))
		return dec_map(dc, f, v, base, depth);
	if (!json_is_array(v))
		return dec_expected(dc, "an array", v);
	if ((count = json_array_size(v)) == 0)
		return true;
	/* calloc: pointer elements stay NULL until set, so a failure
	 * half-way leaves an array protobuf-c can free. */
	if ((*arr = calloc(count, sz)) == NULL)
		return dec_oom(dc);
	for (size_t i = 0; i < count; i++) {
		json_t *el = json_array_get(v, i);

		path_index(dc, i);
		if (json_is_null(el))
			return dec_fail(dc, MOAT_INVALID_ARGUMENT,
			    "array "
			    "elements may not be null",
			    NULL, NULL);
		/* Counted before filling: a message element that failed
		 * half-way must still be freed with the parent. */
		(*n)++;
		if (!dec_value(dc, f, el, (char *)*arr + i * sz, depth))
			return false;
		path_pop(dc, save);
	}
	return true;
}

/* ---- messages ---- */

const ProtobufCFieldDescriptor *
moat_codec_find_field(const ProtobufCMessageDescriptor *d, const char *name)
{
	char json_name[256];

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];

		if (strcmp(f->name, name) == 0)
			return f;
		if (moat_codec_json_name(f->name, json_name,
		        sizeof(json_name)) < sizeof(json_name) &&
		    strcmp(json_name, name) == 0)
			return f;
	}
	return NULL;
}

static bool
dec_field(struct dec *dc, const ProtobufCFieldDescriptor *f, json_t *v,
    char *base, int depth)
{
	void *member = base + f->offset;

	if (f->label == PROTOBUF_C_LABEL_REPEATED)
		return dec_repeated(dc, f, v, base, depth);
	/* The oneof case first: protobuf-c frees only the member it names,
	 * so a sub-message that failed half-way must be named to be freed
	 * (the member is still zero until dec_value sets it). */
	if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
		*(uint32_t *)(base + f->quantifier_offset) = f->id;
		return dec_value(dc, f, v, member, depth);
	}
	if (!dec_value(dc, f, v, member, depth))
		return false;
	/* proto3 `optional` scalars: present, even when 0. */
	if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
	    f->type != PROTOBUF_C_TYPE_STRING &&
	    f->type != PROTOBUF_C_TYPE_MESSAGE)
		*(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
	return true;
}

static bool
dec_message(struct dec *dc, const ProtobufCMessageDescriptor *d, json_t *in,
    ProtobufCMessage **out, int depth)
{
	ProtobufCMessage *msg;
	const ProtobufCFieldDescriptor **seen;
	size_t save = dc->path_len;
	const char *key;
	json_t *v;
	bool ok = false;

	*out = NULL;
	if (depth > MOAT_CODEC_MAX_DECODE_DEPTH) {
		char what[96];
		snprintf(what, sizeof(what),
		    "messages nested deeper than %d "
		    "levels",
		    MOAT_CODEC_MAX_DECODE_DEPTH);
		return dec_fail(dc, MOAT_INVALID_ARGUMENT, what, NULL, NULL);
	}
	if (!json_is_object(in)) {
		char what[160];
		snprintf(what, sizeof(what), "an object (%s)", d->name);
		return dec_expected(dc, what, in);
	}
	if ((msg = malloc(d->sizeof_message)) == NULL)
		return dec_oom(dc);
	d->message_init(msg);
	*out = msg;
	if ((seen = calloc(d->n_fields + 1, sizeof(*seen))) == NULL)
		return dec_oom(dc);
	json_object_foreach (in, key, v) {
		const ProtobufCFieldDescriptor *f =
		    moat_codec_find_field(d, key);
		unsigned idx;

		path_field(dc, key);
		if (f == NULL) {
			if (dc->flags & MOAT_CODEC_IGNORE_UNKNOWN) {
				path_pop(dc, save);
				continue;
			}
			dec_fail(dc, MOAT_INVALID_ARGUMENT,
			    "unknown field of ", d->name, NULL);
			goto out;
		}
		idx = (unsigned)(f - d->fields);
		if (seen[idx] != NULL) {
			dec_fail(dc, MOAT_INVALID_ARGUMENT,
			    "set twice (as "
			    "its JSON name and its .proto name)",
			    NULL, NULL);
			goto out;
		}
		seen[idx] = f;
		/* null is the default: nothing to set. */
		if (json_is_null(v)) {
			path_pop(dc, save);
			continue;
		}
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t set = *(const uint32_t *)((char *)msg +
			    f->quantifier_offset);
			if (set != 0 && set != f->id) {
				const ProtobufCFieldDescriptor *o =
				    protobuf_c_message_descriptor_get_field(d,
				        set);
				char other[256];

				moat_codec_json_name(o ? o->name : "?", other,
				    sizeof(other));
				dec_fail(dc, MOAT_INVALID_ARGUMENT,
				    "only one "
				    "member of a oneof may be set, and this "
				    "one's oneof already has ",
				    other, NULL);
				goto out;
			}
		}
		if (!dec_field(dc, f, v, (char *)msg, depth))
			goto out;
		path_pop(dc, save);
	}
	ok = true;
out:
	free(seen);
	return ok;
}

int
moat_codec_from_json(const ProtobufCMessageDescriptor *d, json_t *in,
    unsigned flags, ProtobufCMessage **out, char **errmsg)
{
	struct dec dc = { .flags = flags };
	ProtobufCMessage *msg = NULL;

	*out = NULL;
	*errmsg = NULL;
	if (d == NULL || d->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC) {
		*errmsg = moat_asprintf("JSON decoding: not a protobuf-c "
		                        "message descriptor");
		return MOAT_INTERNAL;
	}
	if (in == NULL) {
		*errmsg = moat_asprintf("JSON decoding of %s: no JSON value",
		    d->name);
		return MOAT_INVALID_ARGUMENT;
	}
	if (dec_message(&dc, d, in, &msg, 0)) {
		free(dc.errmsg);
		*out = msg;
		return MOAT_OK;
	}
	if (msg != NULL)
		protobuf_c_message_free_unpacked(msg, NULL);
	if (dc.errmsg == NULL) {
		dc.errmsg = moat_asprintf("JSON decoding of %s: out of memory",
		    d->name);
		dc.status = MOAT_RESOURCE_EXHAUSTED;
	}
	*errmsg = dc.errmsg;
	return dc.status != 0 ? dc.status : MOAT_INVALID_ARGUMENT;
}

int
moat_codec_from_json_text(const ProtobufCMessageDescriptor *d,
    const char *text, size_t len, unsigned flags, ProtobufCMessage **out,
    char **errmsg)
{
	json_error_t jerr;
	json_t *j;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (j == NULL) {
		*errmsg = moat_asprintf("malformed JSON at line %d column %d: "
		                        "%s",
		    jerr.line, jerr.column, jerr.text);
		return MOAT_INVALID_ARGUMENT;
	}
	rv = moat_codec_from_json(d, j, flags, out, errmsg);
	json_decref(j);
	return rv;
}
