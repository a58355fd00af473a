/*
 * codec.c: the descriptor-driven protobuf-c -> JSON encoder behind
 * moat/codec.h (proto3 JSON mapping). It walks a message's field
 * descriptors, reads each member at its offset, and builds jansson values.
 * Not for: JSON -> message (codec_decode.c) or any per-message special
 * case.
 */
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

#define CODEC_MAX_DEPTH 64

struct enc {
	unsigned flags;
	char *errmsg; /* first error, heap */
	int status;
};

static json_t *enc_message(struct enc *e, const ProtobufCMessage *msg,
    int depth);

static void
enc_fail(struct enc *e, int status, const char *what)
{
	if (e->errmsg == NULL) {
		e->errmsg = moat_asprintf("JSON encoding: %s", what);
		e->status = status;
	}
}

size_t
moat_codec_json_name(const char *name, char *buf, size_t buflen)
{
	size_t n = 0;
	bool upper = false;

	for (const char *p = name; *p; p++) {
		char c = *p;
		if (c == '_') {
			upper = true;
			continue;
		}
		if (upper && c >= 'a' && c <= 'z')
			c = (char)(c - 'a' + 'A');
		upper = false;
		if (buflen > 0 && n + 1 < buflen)
			buf[n] = c;
		n++;
	}
	if (buflen > 0)
		buf[n < buflen ? n : buflen - 1] = '\0';
	return n;
}

char *
moat_codec_base64(const void *data, size_t len)
{
	static const char alphabet[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	const uint8_t *in = data;
	size_t out_len = 4 * ((len + 2) / 3);
	char *out = malloc(out_len + 1), *o = out;

	if (out == NULL)
		return NULL;
	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16;
		size_t left = len - i;
		if (left > 1)
			v |= (uint32_t)in[i + 1] << 8;
		if (left > 2)
			v |= in[i + 2];
		*o++ = alphabet[(v >> 18) & 63];
		*o++ = alphabet[(v >> 12) & 63];
		*o++ = left > 1 ? alphabet[(v >> 6) & 63] : '=';
		*o++ = left > 2 ? alphabet[v & 63] : '=';
	}
	*o = '\0';
	return out;
}

/* utf8_seq_len: length of the valid UTF-8 sequence at s (at most `left`
 * bytes), or 0 when the bytes there are not one. Rejects overlongs,
 * surrogates and code points past U+10FFFF, as JSON requires. */
static size_t
utf8_seq_len(const uint8_t *s, size_t left)
{
	uint32_t cp;
	size_t n;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		n = 2;
		cp = s[0] & 0x1f;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		n = 3;
		cp = s[0] & 0x0f;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		n = 4;
		cp = s[0] & 0x07;
	} else {
		return 0;
	}
	if (left < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
	    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

static json_t *
enc_string(struct enc *e, const char *s)
{
	const uint8_t *in = (const uint8_t *)(s != NULL ? s : "");
	size_t len = strlen((const char *)in), i = 0, o = 0;
	json_t *j;
	char *clean;

	for (i = 0; i < len;) {
		size_t n = utf8_seq_len(in + i, len - i);
		if (n == 0)
			break;
		i += n;
	}
	if (i == len) {
		if ((j = json_stringn((const char *)in, len)) == NULL)
			enc_fail(e, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return j;
	}
	/* Each bad byte becomes U+FFFD (3 bytes). */
	if ((clean = malloc(len * 3 + 1)) == NULL) {
		enc_fail(e, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return NULL;
	}
	for (i = 0; i < len;) {
		size_t n = utf8_seq_len(in + i, len - i);
		if (n == 0) {
			memcpy(clean + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
			continue;
		}
		memcpy(clean + o, in + i, n);
		o += n;
		i += n;
	}
	j = json_stringn(clean, o);
	free(clean);
	if (j == NULL)
		enc_fail(e, MOAT_RESOURCE_EXHAUSTED, "out of memory");
	return j;
}

static json_t *
enc_u64(struct enc *e, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	return json_string(buf);
}

static json_t *
enc_i64(struct enc *e, int64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%lld", (long long)v);
	return json_string(buf);
}

static json_t *
enc_double(double d)
{
	if (isnan(d))
		return json_string("NaN");
	if (isinf(d))
		return json_string(d > 0 ? "Infinity" : "-Infinity");
	return json_real(d);
}

static json_t *
enc_enum(struct enc *e, const ProtobufCEnumDescriptor *ed, int v)
{
	const ProtobufCEnumValue *ev;

	if (!(e->flags & MOAT_CODEC_ENUMS_AS_INTS) && ed != NULL &&
	    (ev = protobuf_c_enum_descriptor_get_value(ed, v)) != NULL)
		return json_string(ev->name);
	/* A value this build does not know is written as its number, as
	 * the mapping says. */
	return json_integer(v);
}

static json_t *
enc_bytes(struct enc *e, const ProtobufCBinaryData *b)
{
	char *s = moat_codec_base64(b->data, b->len);
	json_t *j;

	if (s == NULL) {
		enc_fail(e, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return NULL;
	}
	j = json_string(s);
	free(s);
	return j;
}

/* enc_value: one value of field `f` stored at `p` (the member itself for
 * singular fields, one array element for repeated ones). */
static json_t *
enc_value(struct enc *e, const ProtobufCFieldDescriptor *f, const void *p,
    int depth)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		return json_integer(*(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		return json_integer(*(const uint32_t *)p);
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		return enc_i64(e, *(const int64_t *)p);
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return enc_u64(e, *(const uint64_t *)p);
	case PROTOBUF_C_TYPE_FLOAT:
		return enc_double(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE:
		return enc_double(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL:
		return json_boolean(*(const protobuf_c_boolean *)p);
	case PROTOBUF_C_TYPE_ENUM:
		return enc_enum(e, f->descriptor, *(const int *)p);
	case PROTOBUF_C_TYPE_STRING:
		return enc_string(e, *(char *const *)p);
	case PROTOBUF_C_TYPE_BYTES:
		return enc_bytes(e, (const ProtobufCBinaryData *)p);
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
		if (sub == NULL)
			return json_object();
		return enc_message(e, sub, depth + 1);
	}
	}
	enc_fail(e, MOAT_INTERNAL, "a field type this codec does not know");
	return NULL;
}

/* is_default: whether a singular proto3 field holds its default value
 * (and so is left out unless EMIT_DEFAULTS). */
static bool
is_default(const ProtobufCFieldDescriptor *f, const void *p)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		return *(const uint32_t *)p == 0;
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return *(const uint64_t *)p == 0;
	case PROTOBUF_C_TYPE_FLOAT:
		return *(const float *)p == 0 && !signbit(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE:
		return *(const double *)p == 0 && !signbit(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL:
		return !*(const protobuf_c_boolean *)p;
	case PROTOBUF_C_TYPE_ENUM:
		return *(const int *)p == 0;
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;
		return s == NULL || s[0] == '\0';
	}
	case PROTOBUF_C_TYPE_BYTES:
		return ((const ProtobufCBinaryData *)p)->len == 0;
	case PROTOBUF_C_TYPE_MESSAGE:
		return *(ProtobufCMessage *const *)p == NULL;
	}
	return false;
}

size_t
moat_codec_elem_size(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
	case PROTOBUF_C_TYPE_FLOAT:
		return 4;
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_BOOL:
		return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_ENUM:
		return sizeof(int);
	case PROTOBUF_C_TYPE_STRING:
		return sizeof(char *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(ProtobufCMessage *);
	}
	return 0;
}

/* moat_codec_is_map_entry: protoc turns `map<K, V> name` into a
 * repeated message NameEntry { K key = 1; V value = 2; }; protobuf-c
 * keeps no map flag, so the shape is the test. */
bool
moat_codec_is_map_entry(const ProtobufCMessageDescriptor *d)
{
	size_t n;

	if (d == NULL || d->n_fields != 2)
		return false;
	n = strlen(d->name);
	return n > 5 && strcmp(d->name + n - 5, "Entry") == 0 &&
	    d->fields[0].id == 1 && strcmp(d->fields[0].name, "key") == 0 &&
	    d->fields[1].id == 2 && strcmp(d->fields[1].name, "value") == 0;
}

/* map_key: the JSON object key of a map entry's key (JSON keys are
 * strings, so integer and bool keys are written as text). Heap string. */
static char *
map_key(const ProtobufCFieldDescriptor *kf, const void *p)
{
	switch (kf->type) {
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;
		return strdup(s != NULL ? s : "");
	}
	case PROTOBUF_C_TYPE_BOOL:
		return strdup(
		    *(const protobuf_c_boolean *)p ? "true" : "false");
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		return moat_asprintf("%d", *(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		return moat_asprintf("%u", *(const uint32_t *)p);
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		return moat_asprintf("%lld", (long long)*(const int64_t *)p);
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return moat_asprintf("%llu",
		    (unsigned long long)*(const uint64_t *)p);
	default:
		return NULL;
	}
}

static json_t *
enc_map(struct enc *e, const ProtobufCFieldDescriptor *f,
    ProtobufCMessage *const *entries, size_t n, int depth)
{
	const ProtobufCMessageDescriptor *ed = f->descriptor;
	const ProtobufCFieldDescriptor *kf = &ed->fields[0];
	const ProtobufCFieldDescriptor *vf = &ed->fields[1];
	json_t *obj = json_object();

	if (obj == NULL)
		goto fail_oom;
	for (size_t i = 0; i < n; i++) {
		const char *base = (const char *)entries[i];
		char *key;
		json_t *v;

		if (base == NULL)
			continue;
		if ((key = map_key(kf, base + kf->offset)) == NULL) {
			enc_fail(e, MOAT_INTERNAL,
			    "a map key type that JSON "
			    "cannot hold");
			goto fail;
		}
		if ((v = enc_value(e, vf, base + vf->offset, depth)) == NULL) {
			free(key);
			goto fail;
		}
		if (json_object_set_new(obj, key, v) != 0) {
			free(key);
			goto fail_oom;
		}
		free(key);
	}
	return obj;

fail_oom:
	enc_fail(e, MOAT_RESOURCE_EXHAUSTED, "out of memory");
fail:
	json_decref(obj);
	return NULL;
}

static json_t *
enc_repeated(struct enc *e, const ProtobufCFieldDescriptor *f,
    const void *array, size_t n, int depth)
{
	size_t sz = moat_codec_elem_size(f->type);
	json_t *arr;

	if (f->type == PROTOBUF_C_TYPE_MESSAGE &&
	    moat_codec_is_map_entry(f->descriptor))
		return enc_map(e, f, array, n, depth);
	if ((arr = json_array()) == NULL)
		goto fail_oom;
	for (size_t i = 0; i < n; i++) {
		json_t *v =
		    enc_value(e, f, (const char *)array + i * sz, depth);
		if (v == NULL)
			goto fail;
		if (json_array_append_new(arr, v) != 0)
			goto fail_oom;
	}
	return arr;

fail_oom:
	enc_fail(e, MOAT_RESOURCE_EXHAUSTED, "out of memory");
fail:
	json_decref(arr);
	return NULL;
}

/* field_present: whether field f of message base is written at all. */
static bool
field_present(const struct enc *e, const ProtobufCFieldDescriptor *f,
    const char *base)
{
	const void *member = base + f->offset;

	if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
		return *(const uint32_t *)(base + f->quantifier_offset) ==
		    f->id;
	switch (f->label) {
	case PROTOBUF_C_LABEL_REQUIRED:
		return true;
	case PROTOBUF_C_LABEL_OPTIONAL:
		/* proto2 optional or proto3 `optional`: explicit presence. */
		if (f->type == PROTOBUF_C_TYPE_STRING ||
		    f->type == PROTOBUF_C_TYPE_MESSAGE)
			return *(void *const *)member != NULL;
		return *(
		    const protobuf_c_boolean *)(base + f->quantifier_offset);
	case PROTOBUF_C_LABEL_REPEATED:
		return *(const size_t *)(base + f->quantifier_offset) > 0 ||
		    (e->flags & MOAT_CODEC_EMIT_DEFAULTS);
	case PROTOBUF_C_LABEL_NONE:
	default:
		if (f->type == PROTOBUF_C_TYPE_MESSAGE)
			return *(void *const *)member != NULL;
		return !is_default(f, member) ||
		    (e->flags & MOAT_CODEC_EMIT_DEFAULTS);
	}
}

static json_t *
enc_message(struct enc *e, const ProtobufCMessage *msg, int depth)
{
	const ProtobufCMessageDescriptor *d = msg->descriptor;
	const char *base = (const char *)msg;
	json_t *obj;

	if (d == NULL || d->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC) {
		enc_fail(e, MOAT_INTERNAL, "not a protobuf-c message");
		return NULL;
	}
	if (depth > CODEC_MAX_DEPTH) {
		enc_fail(e, MOAT_INVALID_ARGUMENT,
		    "messages nested deeper "
		    "than 64 levels");
		return NULL;
	}
	if ((obj = json_object()) == NULL)
		goto fail_oom;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		char name[256];
		json_t *v;

		if (!field_present(e, f, base))
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED)
			v = enc_repeated(e, f,
			    *(void *const *)(base + f->offset),
			    *(const size_t *)(base + f->quantifier_offset),
			    depth);
		else
			v = enc_value(e, f, base + f->offset, depth);
		if (v == NULL)
			goto fail;
		if (e->flags & MOAT_CODEC_PROTO_NAMES)
			snprintf(name, sizeof(name), "%s", f->name);
		else
			moat_codec_json_name(f->name, name, sizeof(name));
		if (json_object_set_new(obj, name, v) != 0)
			goto fail_oom;
	}
	return obj;

fail_oom:
	enc_fail(e, MOAT_RESOURCE_EXHAUSTED, "out of memory");
fail:
	json_decref(obj);
	return NULL;
}

int
moat_codec_to_json(const ProtobufCMessage *msg, unsigned flags, json_t **out,
    char **errmsg)
{
	struct enc e = { .flags = flags };

	*out = NULL;
	if (msg == NULL) {
		*errmsg = moat_asprintf("JSON encoding: no message");
		return MOAT_INVALID_ARGUMENT;
	}
	*out = enc_message(&e, msg, 0);
	if (*out == NULL) {
		if (e.errmsg == NULL) {
			e.errmsg = moat_asprintf("JSON encoding of %s: out "
			                         "of memory",
			    msg->descriptor->name);
			e.status = MOAT_RESOURCE_EXHAUSTED;
		}
		*errmsg = e.errmsg;
		return e.status;
	}
	free(e.errmsg);
	return MOAT_OK;
}

int
moat_codec_to_json_string(const ProtobufCMessage *msg, unsigned flags,
    int pretty, char **out, char **errmsg)
{
	json_t *j;
	int rv;

	*out = NULL;
	if ((rv = moat_codec_to_json(msg, flags, &j, errmsg)) != MOAT_OK)
		return rv;
	*out = json_dumps(j, pretty ? JSON_INDENT(2) : JSON_COMPACT);
	json_decref(j);
	if (*out == NULL) {
		*errmsg = moat_asprintf("JSON encoding: out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}
