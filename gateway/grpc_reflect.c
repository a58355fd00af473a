/*
 * grpc_reflect.c: gRPC server reflection's pure pieces (grpc_reflect.h):
 * a small protobuf wire reader and writer, enough to split the build's
 * FileDescriptorSet into its files, name what each declares, and read a
 * ServerReflectionRequest and write its ServerReflectionResponse (field
 * numbers in proto/grpc/reflection_v1alpha.proto). Hand-written because
 * protoc-c has no descriptor.proto here to generate from, and only a
 * few fields are needed.
 * Not for: the stream (grpc.c), or decoding descriptors in general.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_reflect.h"
#include "moat/status.h"
#include "moat/util.h"

#define WT_VARINT 0
#define WT_I64 1
#define WT_LEN 2
#define WT_I32 5

#define GRPC_NOT_FOUND 5 /* gRPC's code, in error_response */
#define GRPC_INVALID_ARGUMENT 3

static const char *const services[] = {
	"moat.v1.Gateway",
	"grpc.health.v1.Health",
	"grpc.reflection.v1alpha.ServerReflection",
};

struct dfile {
	const uint8_t *data;
	size_t len;
	char *name, *package;
	char **syms; /* fully qualified top-level names */
	size_t nsym;
	char **deps;
	size_t ndeps;
};

struct moat_grpc_descset {
	struct dfile *f;
	size_t n;
};

/* ---- the wire ---- */

struct wire {
	const uint8_t *p, *end;
};

static bool
wire_varint(struct wire *w, uint64_t *v)
{
	unsigned shift;

	*v = 0;
	for (shift = 0; shift < 64 && w->p < w->end; shift += 7) {
		uint8_t b = *w->p++;
		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return true;
	}
	return false;
}

/* wire_field: the next field: 1 with its number, wire type and value
 * (a varint in *v, or *data of *dlen bytes for the others); 0 at the
 * end; -1 when malformed (groups included: nothing here uses them). */
static int
wire_field(struct wire *w, uint32_t *field, int *type, uint64_t *v,
    const uint8_t **data, size_t *dlen)
{
	uint64_t key, n;
	size_t need;

	if (w->p == w->end)
		return 0;
	if (!wire_varint(w, &key) || (key >> 3) == 0 || (key >> 3) > 536870911)
		return -1;
	*field = (uint32_t)(key >> 3);
	*type = (int)(key & 7);
	*v = 0;
	switch (*type) {
	case WT_VARINT:
		return wire_varint(w, v) ? 1 : -1;
	case WT_LEN:
		if (!wire_varint(w, &n) || n > (uint64_t)(w->end - w->p))
			return -1;
		need = (size_t)n;
		break;
	case WT_I64:
		need = 8;
		break;
	case WT_I32:
		need = 4;
		break;
	default:
		return -1;
	}
	if (need > (size_t)(w->end - w->p))
		return -1;
	*data = w->p;
	*dlen = need;
	w->p += need;
	return 1;
}

/* wire_name: field 1 (a string) of the message `m`; NULL when absent,
 * malformed or out of memory. */
static char *
wire_name(const uint8_t *m, size_t len)
{
	struct wire w = { m, m + len };
	const uint8_t *d = NULL;
	size_t dl = 0;
	uint32_t f;
	uint64_t v;
	int t, r;
	char *name = NULL;

	while ((r = wire_field(&w, &f, &t, &v, &d, &dl)) == 1)
		if (f == 1 && t == WT_LEN) {
			free(name);
			name = strndup((const char *)d, dl);
		}
	if (r < 0) {
		free(name);
		return NULL;
	}
	return name;
}

static bool
push_str(char ***v, size_t *n, char *s)
{
	char **nv;

	if (s == NULL || (nv = realloc(*v, (*n + 1) * sizeof(**v))) == NULL) {
		free(s);
		return false;
	}
	nv[(*n)++] = s;
	*v = nv;
	return true;
}

/* ---- the set ---- */

/* file_parse: the names one FileDescriptorProto declares. */
static int
file_parse(struct dfile *df)
{
	struct wire w = { df->data, df->data + df->len };
	const uint8_t *d = NULL;
	size_t dl = 0;
	uint32_t f;
	uint64_t v;
	int t, r;
	char *s;

	while ((r = wire_field(&w, &f, &t, &v, &d, &dl)) == 1) {
		if (t != WT_LEN)
			continue;
		if (f == 1 || f == 2) {
			if ((s = strndup((const char *)d, dl)) == NULL)
				return MOAT_RESOURCE_EXHAUSTED;
			free(f == 1 ? df->name : df->package);
			*(f == 1 ? &df->name : &df->package) = s;
		} else if (f == 3) {
			if (!push_str(&df->deps, &df->ndeps,
			        strndup((const char *)d, dl)))
				return MOAT_RESOURCE_EXHAUSTED;
		} else if (f >= 4 && f <= 6) {
			/* message_type, enum_type, service: their name
			 * is field 1; qualified below. */
			if ((s = wire_name(d, dl)) == NULL)
				return MOAT_INVALID_ARGUMENT;
			if (!push_str(&df->syms, &df->nsym, s))
				return MOAT_RESOURCE_EXHAUSTED;
		}
	}
	if (r < 0 || df->name == NULL)
		return MOAT_INVALID_ARGUMENT;
	for (size_t i = 0; df->package != NULL && i < df->nsym; i++) {
		if ((s = moat_asprintf("%s.%s", df->package, df->syms[i])) ==
		    NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		free(df->syms[i]);
		df->syms[i] = s;
	}
	return MOAT_OK;
}

int
moat_grpc_descset_parse(const uint8_t *buf, size_t len,
    struct moat_grpc_descset **out)
{
	struct moat_grpc_descset *s = calloc(1, sizeof(*s));
	struct wire w = { buf, buf + len };
	const uint8_t *d = NULL;
	size_t dl = 0;
	uint32_t f;
	uint64_t v;
	int t, r, rv = MOAT_OK;
	struct dfile *nf;

	*out = NULL;
	if (s == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	while ((r = wire_field(&w, &f, &t, &v, &d, &dl)) == 1) {
		if (f != 1 || t != WT_LEN)
			continue;
		if ((nf = realloc(s->f, (s->n + 1) * sizeof(*nf))) == NULL) {
			rv = MOAT_RESOURCE_EXHAUSTED;
			break;
		}
		s->f = nf;
		memset(&nf[s->n], 0, sizeof(*nf));
		nf[s->n].data = d;
		nf[s->n].len = dl;
		s->n++;
		if ((rv = file_parse(&nf[s->n - 1])) != MOAT_OK)
			break;
	}
	if (rv == MOAT_OK && r < 0)
		rv = MOAT_INVALID_ARGUMENT;
	if (rv != MOAT_OK) {
		moat_grpc_descset_free(s);
		return rv;
	}
	*out = s;
	return MOAT_OK;
}

void
moat_grpc_descset_free(struct moat_grpc_descset *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < s->n; i++) {
		struct dfile *df = &s->f[i];
		for (size_t j = 0; j < df->nsym; j++)
			free(df->syms[j]);
		for (size_t j = 0; j < df->ndeps; j++)
			free(df->deps[j]);
		free(df->syms);
		free(df->deps);
		free(df->name);
		free(df->package);
	}
	free(s->f);
	free(s);
}

size_t
moat_grpc_descset_count(const struct moat_grpc_descset *s)
{
	return s->n;
}

long
moat_grpc_descset_by_name(const struct moat_grpc_descset *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->f[i].name, name) == 0)
			return (long)i;
	return -1;
}

static long
symbol_exact(const struct moat_grpc_descset *s, const char *sym, size_t n)
{
	for (size_t i = 0; i < s->n; i++)
		for (size_t j = 0; j < s->f[i].nsym; j++)
			if (strlen(s->f[i].syms[j]) == n &&
			    memcmp(s->f[i].syms[j], sym, n) == 0)
				return (long)i;
	return -1;
}

long
moat_grpc_descset_by_symbol(const struct moat_grpc_descset *s,
    const char *symbol)
{
	size_t n = strlen(symbol);
	long i;

	/* A method, field or nested type: the top-level name it is in,
	 * one component off at a time. Packages are no symbols, so this
	 * never stops at one. */
	while (n > 0) {
		if ((i = symbol_exact(s, symbol, n)) >= 0)
			return i;
		while (n > 0 && symbol[n - 1] != '.')
			n--;
		if (n > 0)
			n--;
	}
	return -1;
}

const uint8_t *
moat_grpc_descset_file(const struct moat_grpc_descset *s, size_t i,
    size_t *len, const char **name)
{
	*len = s->f[i].len;
	*name = s->f[i].name;
	return s->f[i].data;
}

/* ---- writing ---- */

struct wbuf {
	uint8_t *b;
	size_t len, cap;
	bool oom;
};

static void
w_raw(struct wbuf *w, const void *p, size_t n)
{
	uint8_t *nb;
	size_t cap;

	if (w->oom)
		return;
	if (w->len + n > w->cap) {
		cap = w->cap ? w->cap : 256;
		while (cap < w->len + n)
			cap *= 2;
		if ((nb = realloc(w->b, cap)) == NULL) {
			w->oom = true;
			return;
		}
		w->b = nb;
		w->cap = cap;
	}
	if (n > 0)
		memcpy(w->b + w->len, p, n);
	w->len += n;
}

static void
w_varint(struct wbuf *w, uint64_t v)
{
	uint8_t b[10];
	size_t n = 0;

	do {
		b[n] = (uint8_t)(v & 0x7f);
		v >>= 7;
		if (v)
			b[n] |= 0x80;
		n++;
	} while (v);
	w_raw(w, b, n);
}

/* w_len: field `f`, length-delimited. */
static void
w_len(struct wbuf *w, uint32_t f, const void *p, size_t n)
{
	w_varint(w, (uint64_t)f << 3 | WT_LEN);
	w_varint(w, n);
	w_raw(w, p, n);
}

static void
w_str(struct wbuf *w, uint32_t f, const char *s)
{
	w_len(w, f, s, strlen(s));
}

/* w_sub: the message built in `in` as field `f` of w; frees in. */
static void
w_sub(struct wbuf *w, uint32_t f, struct wbuf *in)
{
	if (in->oom)
		w->oom = true;
	else
		w_len(w, f, in->b, in->len);
	free(in->b);
}

/* w_error: error_response (7): ErrorResponse{error_code 1,
 * error_message 2}. */
static void
w_error(struct wbuf *w, int code, const char *what, const char *arg)
{
	struct wbuf e = { 0 };
	char *m = moat_asprintf("%s %s: ask list_services, or for a file "
	                        "or symbol of proto/",
	    what, arg);

	w_varint(&e, 1 << 3 | WT_VARINT);
	w_varint(&e, (uint64_t)code);
	w_str(&e, 2, m ? m : what);
	free(m);
	w_sub(w, 7, &e);
}

/* add_file: file i and, before anything, what it imports, each once. */
static void
add_file(const struct moat_grpc_descset *s, size_t i, bool *seen,
    struct wbuf *fd)
{
	long d;

	if (seen[i])
		return;
	seen[i] = true;
	w_len(fd, 1, s->f[i].data, s->f[i].len);
	for (size_t j = 0; j < s->f[i].ndeps; j++)
		if ((d = moat_grpc_descset_by_name(s, s->f[i].deps[j])) >= 0)
			add_file(s, (size_t)d, seen, fd);
}

/* w_files: file_descriptor_response (4) with file i and its imports. */
static void
w_files(const struct moat_grpc_descset *s, struct wbuf *w, long i)
{
	struct wbuf fd = { 0 };
	bool *seen = calloc(s->n ? s->n : 1, sizeof(bool));

	if (seen == NULL) {
		w->oom = true;
		return;
	}
	add_file(s, (size_t)i, seen, &fd);
	free(seen);
	w_sub(w, 4, &fd);
}

static void
w_services(struct wbuf *w)
{
	struct wbuf ls = { 0 };

	for (size_t i = 0; i < sizeof(services) / sizeof(services[0]); i++) {
		struct wbuf one = { 0 };
		w_str(&one, 1, services[i]);
		w_sub(&ls, 1, &one);
	}
	w_sub(w, 6, &ls);
}

/* w_ask: the answer to what field `f` of the request asks with `arg`. */
static void
w_ask(const struct moat_grpc_descset *s, struct wbuf *w, uint32_t f,
    const char *arg)
{
	long i;

	switch (f) {
	case 3:
		if ((i = moat_grpc_descset_by_name(s, arg)) >= 0)
			w_files(s, w, i);
		else
			w_error(w, GRPC_NOT_FOUND, "no file named", arg);
		break;
	case 4:
		if ((i = moat_grpc_descset_by_symbol(s, arg)) >= 0)
			w_files(s, w, i);
		else
			w_error(w, GRPC_NOT_FOUND, "no symbol", arg);
		break;
	case 5:
		w_error(w, GRPC_NOT_FOUND,
		    "no extensions are declared: none extends", arg);
		break;
	case 6:
		if (moat_grpc_descset_by_symbol(s, arg) >= 0) {
			/* all_extension_numbers_response: the type, and
			 * no numbers (moat declares no extensions). */
			struct wbuf e = { 0 };
			w_str(&e, 1, arg);
			w_sub(w, 5, &e);
		} else {
			w_error(w, GRPC_NOT_FOUND, "no type", arg);
		}
		break;
	case 7:
		w_services(w);
		break;
	default:
		w_error(w, GRPC_INVALID_ARGUMENT,
		    "the request asks for nothing this server knows:", "");
		break;
	}
}

int
moat_grpc_reflect_answer(const struct moat_grpc_descset *s, const uint8_t *req,
    size_t len, uint8_t **out, size_t *out_len, const char **why)
{
	struct wire w = { req, req + len };
	struct wbuf a = { 0 };
	const uint8_t *d = NULL, *host = NULL, *arg = NULL;
	size_t dl = 0, host_len = 0, arg_len = 0;
	uint32_t f, ask = 0;
	uint64_t v;
	int t, r;
	char *argz;

	*out = NULL;
	*out_len = 0;
	while ((r = wire_field(&w, &f, &t, &v, &d, &dl)) == 1) {
		if (f == 1 && t == WT_LEN) {
			host = d;
			host_len = dl;
		} else if (f >= 3 && f <= 7 && t == WT_LEN) {
			/* A oneof: the last one wins. */
			ask = f;
			arg = d;
			arg_len = dl;
		}
	}
	if (r < 0) {
		*why = "the reflection request is not a "
		       "ServerReflectionRequest";
		return MOAT_INVALID_ARGUMENT;
	}
	/* file_containing_extension is a message; its containing_type
	 * (field 1) is what the error names. */
	argz = ask == 5 ? wire_name(arg, arg_len) :
	                  strndup((const char *)(arg ? arg : req), arg_len);
	if (argz == NULL && ask == 5)
		argz = strdup("?");
	if (argz == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if (host != NULL)
		w_len(&a, 1, host, host_len);
	w_len(&a, 2, req, len);
	w_ask(s, &a, ask, argz);
	free(argz);
	if (a.oom) {
		free(a.b);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	*out = a.b ? a.b : calloc(1, 1);
	*out_len = a.len;
	return *out != NULL ? MOAT_OK : MOAT_RESOURCE_EXHAUSTED;
}
