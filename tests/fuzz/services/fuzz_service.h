/*
 * fuzz_service.h: what the service fuzz targets (fuzz_sessiond.c,
 * fuzz_snapd.c) share: an input is one request to a detached RPC server
 * of the service (moat/rpc_dispatch.h) over a real LMDB store in a
 * temporary directory: byte 0 picks the method, byte 1 the tenant the
 * Envelope carries (a good one, another, none, a malformed one), the
 * rest is the method's payload. The Reply must decode, echo the request
 * id, and carry a message with every error. Seeds are a method index
 * and a packed request (fuzz_service_seed). Not for: the nng transport
 * or TLS (fuzz_envelope.c covers the Envelope itself).
 */
#ifndef MOAT_FUZZ_SERVICE_H
#define MOAT_FUZZ_SERVICE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.pb-c.h"
#include "fuzz.h"
#include "moat/rpc_dispatch.h"
#include "moat/status.h"
#include "moat/util.h"

static const char *const fuzz_tenants[] = { "acme", "zeta", "",
	"bad tenant/../x" };

/* fuzz_service_call: runs one input through `srv` serving `d`. */
static inline void
fuzz_service_call(struct moat_rpc_server *srv,
    const ProtobufCServiceDescriptor *d, const uint8_t *data, size_t size)
{
	static uint64_t request_id = 1;
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	Moat__V1__Reply *r;
	uint8_t *packed, *out = NULL;
	size_t n, out_len = 0;

	if (size < 2)
		return;
	env.service = (char *)d->name;
	env.method = (char *)d->methods[data[0] % d->n_methods].name;
	env.tenant = (char *)fuzz_tenants[data[1] % 4];
	env.request_id = request_id++;
	env.timeout_ms = 5000;
	env.payload.data = (uint8_t *)data + 2;
	env.payload.len = size - 2;
	n = moat__v1__envelope__get_packed_size(&env);
	packed = malloc(n);
	moat_fuzz_check(packed != NULL, "malloc");
	moat__v1__envelope__pack(&env, packed);
	moat_fuzz_check(moat_rpc_server_dispatch(srv, packed, n, &out,
	                    &out_len) == 0,
	    "no reply built");
	r = moat__v1__reply__unpack(NULL, out_len, out);
	moat_fuzz_check(r != NULL, "the reply does not decode");
	moat_fuzz_check(r->request_id == env.request_id,
	    "the reply names another request");
	moat_fuzz_check(r->code == MOAT__V1__CODE__OK ||
	        (r->message != NULL && r->message[0] != '\0'),
	    "an error without a message");
	moat__v1__reply__free_unpacked(r, NULL);
	free(out);
	free(packed);
}

/* fuzz_service_seed: adds method `m`, tenant 0 and `msg` packed. */
static inline void
fuzz_service_seed(void (*add)(const uint8_t *, size_t), unsigned m,
    const ProtobufCMessage *msg)
{
	uint8_t buf[4096];
	size_t n = protobuf_c_message_get_packed_size(msg);

	if (n + 2 > sizeof(buf))
		return;
	buf[0] = (uint8_t)m;
	buf[1] = 0;
	protobuf_c_message_pack(msg, buf + 2);
	add(buf, n + 2);
}

/* fuzz_service_start: the detached server of svc in *srv; aborts the
 * fuzzer when it cannot be made. Not for: opening the service's store
 * or starting its writer (each target does, before this). */
static inline void
fuzz_service_start(struct moat_rpc_server **srv,
    const struct moat_rpc_service *svc)
{
	char *errmsg = NULL;

	moat_fuzz_check(moat_rpc_server_new_detached(srv, svc, &errmsg) ==
	        MOAT_OK,
	    "server");
}

/* fuzz_service_input: the body of a target's LLVMFuzzerTestOneInput:
 * init() on the first input (it sets *srv), then fuzz_service_call. */
static inline int
fuzz_service_input(struct moat_rpc_server **srv, void (*init)(void),
    const ProtobufCServiceDescriptor *d, const uint8_t *data, size_t size)
{
	if (*srv == NULL)
		init();
	fuzz_service_call(*srv, d, data, size);
	return 0;
}

/* fuzz_service_method: the index of method `name` in d (0 when d has no
 * such method), for fuzz_service_seed. */
static inline unsigned
fuzz_service_method(const ProtobufCServiceDescriptor *d, const char *name)
{
	for (unsigned i = 0; i < d->n_methods; i++)
		if (strcmp(d->methods[i].name, name) == 0)
			return i;
	return 0;
}

/* fuzz_service_seed_methods: adds every method of d with tenant 0 and
 * an empty payload. Not for: seeds with a request (fuzz_service_seed). */
static inline void
fuzz_service_seed_methods(void (*add)(const uint8_t *, size_t),
    const ProtobufCServiceDescriptor *d)
{
	for (unsigned i = 0; i < d->n_methods; i++) {
		uint8_t two[2] = { (uint8_t)i, 0 };

		add(two, 2);
	}
}

static char fuzz_service_tmp[64];

static inline void
fuzz_service_cleanup(void)
{
	moat_rm_rf(fuzz_service_tmp);
}

/* fuzz_service_dir: a new temporary directory for the store, removed at
 * exit. */
static inline char *
fuzz_service_dir(const char *what)
{
	snprintf(fuzz_service_tmp, sizeof(fuzz_service_tmp),
	    "/tmp/moat-fuzz-%s-XXXXXX", what);
	moat_fuzz_check(mkdtemp(fuzz_service_tmp) != NULL, "mkdtemp");
	atexit(fuzz_service_cleanup);
	return fuzz_service_tmp;
}

#endif
