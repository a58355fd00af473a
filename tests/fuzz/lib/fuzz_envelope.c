/*
 * fuzz_envelope.c: fuzz target for the RPC server's dispatcher
 * (moat_rpc_server_dispatch in lib/rpc_server.c), which sees every byte a
 * peer sends over nng: Envelope decode, name checks, method lookup,
 * payload decode with the method's input descriptor, auth, request-id
 * memory, handler call and reply encoding, all on the moat.v1.Vm
 * descriptor with handlers that fill replies from the request. Invariant:
 * every input gets one well-formed moat.v1.Reply whose code is a status,
 * with a message when it is not OK. Not for: the socket layer (nng's).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.pb-c.h"
#include "fuzz.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/rpc_dispatch.h"
#include "moat/util.h"
#include "vm.pb-c.h"

static struct moat_rpc_server *srv;

static int
h_ok(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	return MOAT_OK;
}

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	r->service = strdup(call->service);
	r->node_id = strdup(call->auth);
	r->uptime_ms = call->deadline_ms;
	return MOAT_OK;
}

static int
h_create(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	const Moat__V1__CreateSandboxRequest *in =
	    (const Moat__V1__CreateSandboxRequest *)req;
	Moat__V1__Sandbox *sb = (Moat__V1__Sandbox *)reply;

	if (in->vcpus > 64)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "vcpus %u is over 64", in->vcpus);
	sb->id =
	    moat_asprintf("sb-%llx", (unsigned long long)call->request_id);
	sb->image = strdup(in->image);
	sb->tenant = strdup(in->tenant);
	return MOAT_OK;
}

static int
h_ref_error(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	const Moat__V1__SandboxRef *in = (const Moat__V1__SandboxRef *)req;

	return moat_rpc_error(call, MOAT_NOT_FOUND, "sandbox %s not found",
	    in->sandbox_id);
}

static int
h_raw(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	/* Echo the request's bytes as the reply (what a forwarder does). */
	if ((call->raw_reply = malloc(call->payload_len + 1)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if (call->payload_len)
		memcpy(call->raw_reply, call->payload, call->payload_len);
	call->raw_reply_len = call->payload_len;
	return MOAT_OK;
}

static int
h_silent_error(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	return MOAT_FAILED_PRECONDITION; /* no message: server adds one */
}

static const struct moat_rpc_method methods[] = {
	{ "Health", h_health, false, false },
	{ "NodeInfo", h_ok, false, false },
	{ "CreateSandbox", h_create, true, false },
	{ "GetSandbox", h_ref_error, false, true },
	{ "ListSandboxes", h_ok, false, true },
	{ "ListAllSandboxes", h_ok, false, true },
	{ "DestroySandbox", h_ref_error, true, true },
	{ "ExecStart", h_ok, true, false },
	{ "ExecRead", h_raw, false, false },
	{ "ExecWrite", h_silent_error, true, false },
	{ "ExecWait", h_ok, false, false },
	{ "ExecKill", h_ok, true, false },
	{ "Exec", h_raw, true, false },
	{ "ReadFile", h_ok, false, false },
	{ "WriteFile", h_ok, true, false },
	{ "ListFiles", h_ok, false, false },
	{ "StatFile", h_ok, false, false },
	{ "RemoveFile", h_silent_error, true, false },
	{ "MakeDir", h_ok, true, false },
	{ "PutArchive", h_ok, true, false },
	{ "GetArchive", h_ok, false, false },
	{ "SandboxInfo", h_ok, false, false },
	{ "TraceFs", h_ok, false, false },
	{ "SnapshotSandbox", h_ok, true, false },
	{ "RestoreSandbox", h_ok, true, false },
	{ "ListLocalSnapshots", h_ok, false, false },
	{ "DeleteLocalSnapshot", h_ok, true, false },
	{ "ResumeSandbox", h_ok, true, false },
	{ "RunCode", h_ok, true, false },
	{ "CloseCodeContext", h_ok, true, false },
	{ "EgressEvents", h_ok, false, false },
	{ "Cordon", h_ok, true, false },
	{ "StartImageBuild", h_ok, true, false },
	{ "GetImageBuild", h_ok, false, false },
	{ "ListImages", h_ok, false, false },
	{ "PushImage", h_ok, true, false },
	{ "PullImage", h_ok, true, false },
	{ "RemoveImage", h_ok, true, false },
	{ "SetTimeout", h_ok, true, false },
	{ "ExecResize", h_ok, true, false },
};

static void
stop_server(void)
{
	moat_rpc_server_stop(srv);
	srv = NULL;
}

static void
start_server(void)
{
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__vm__descriptor,
		.methods = methods,
		.n_methods = sizeof(methods) / sizeof(methods[0]),
	};
	char *err = NULL;

	moat_log_init("fuzz", MOAT_LOG_ERROR);
	if (moat_rpc_server_new_detached(&srv, &svc, &err) != MOAT_OK) {
		fprintf(stderr, "fuzz_envelope: %s\n", err);
		abort();
	}
	atexit(stop_server);
}

/* Valid UTF-8 (RFC 3629), no control characters but newline and tab. */
static bool
text_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p != 0) {
		size_t n = *p < 0x80    ? 1 :
		    (*p & 0xe0) == 0xc0 ? 2 :
		    (*p & 0xf0) == 0xe0 ? 3 :
		    (*p & 0xf8) == 0xf0 ? 4 :
		                          0;
		uint32_t cp;

		if (n == 0)
			return false;
		cp = n == 1 ? *p : (uint32_t)(*p & (0x7f >> n));
		for (size_t i = 1; i < n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ||
		    (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		if ((cp < 0x20 && cp != '\n' && cp != '\t') || cp == 0x7f)
			return false;
		p += n;
	}
	return true;
}

static void
dispatch_and_check(const uint8_t *data, size_t size)
{
	Moat__V1__Reply *r;
	uint8_t *out = NULL;
	size_t out_len = 0;

	moat_fuzz_check(moat_rpc_server_dispatch(srv, data, size, &out,
	                    &out_len) == MOAT_OK,
	    "no reply built");
	r = moat__v1__reply__unpack(NULL, out_len, out);
	moat_fuzz_check(r != NULL, "reply does not decode");
	moat_fuzz_check((int)r->code >= 0 && (int)r->code <= MOAT_STATUS_MAX,
	    "reply code is not a status");
	moat_fuzz_check(r->code == MOAT__V1__CODE__OK ||
	        (r->message[0] != '\0' && r->payload.len == 0),
	    "error reply without message or with payload");
	moat_fuzz_check(text_ok(r->message), "reply message is not text");
	moat__v1__reply__free_unpacked(r, NULL);
	free(out);
}

/* The input as an Envelope, then (so that payload decoding of every
 * method's input message is reached, not only envelope parsing) the
 * input as the payload of a well-formed Envelope whose method, request id
 * and auth are picked by its first byte. */
int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const ProtobufCServiceDescriptor *sd = &moat__v1__vm__descriptor;
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	uint8_t *buf;
	size_t n;

	if (srv == NULL)
		start_server();
	dispatch_and_check(data, size);
	if (size == 0)
		return 0;
	env.service = "moat.v1.Vm";
	env.method = (char *)sd->methods[data[0] % sd->n_methods].name;
	env.request_id = data[0] >> 5;
	env.auth = (char *)((data[0] & 0x10) ? "key" : "");
	env.payload.data = (uint8_t *)data + 1;
	env.payload.len = size - 1;
	n = moat__v1__envelope__get_packed_size(&env);
	buf = malloc(n);
	moat_fuzz_check(buf != NULL, "malloc");
	moat__v1__envelope__pack(&env, buf);
	dispatch_and_check(buf, n);
	free(buf);
	return 0;
}

static void
add_env(void (*add)(const uint8_t *, size_t), const char *method, uint64_t rid,
    const char *auth, const ProtobufCMessage *payload)
{
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	uint8_t pbuf[1024], buf[2048];
	size_t n;

	env.service = "moat.v1.Vm";
	env.method = (char *)method;
	env.request_id = rid;
	env.timeout_ms = 5000;
	env.auth = (char *)auth;
	if (payload != NULL) {
		env.payload.len = protobuf_c_message_pack(payload, pbuf);
		env.payload.data = pbuf;
	}
	n = moat__v1__envelope__get_packed_size(&env);
	if (n > sizeof(buf))
		return;
	moat__v1__envelope__pack(&env, buf);
	add(buf, n);
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	Moat__V1__CreateSandboxRequest cr =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[] = { "sh", "-c", "echo hi" };
	const ProtobufCServiceDescriptor *sd = &moat__v1__vm__descriptor;

	cr.vcpus = 2;
	cr.image = "python";
	cr.tenant = "t1";
	ref.sandbox_id = "sb-1";
	ex.sandbox_id = "sb-1";
	ex.n_argv = 3;
	ex.argv = argv;
	add_env(add, "CreateSandbox", 1, "", &cr.base);
	add_env(add, "CreateSandbox", 2, "key", &cr.base);
	add_env(add, "GetSandbox", 3, "key", &ref.base);
	add_env(add, "DestroySandbox", 4, "", &ref.base);
	add_env(add, "Exec", 5, "", &ex.base);
	add_env(add, "ExecRead", 6, "", &ref.base);
	for (unsigned i = 0; i < sd->n_methods; i++)
		add_env(add, sd->methods[i].name, 100 + i, "k", NULL);
	add_env(add, "NoSuchMethod", 9, "", NULL);

	/* Seeds for the second reading: method index, then its payload. */
	for (unsigned i = 0; i < sd->n_methods; i++) {
		const ProtobufCMessageDescriptor *in = sd->methods[i].input;
		const ProtobufCMessage *m = NULL;
		uint8_t buf[512];

		if (in == &moat__v1__create_sandbox_request__descriptor)
			m = &cr.base;
		else if (in == &moat__v1__sandbox_ref__descriptor)
			m = &ref.base;
		else if (in == &moat__v1__exec_request__descriptor)
			m = &ex.base;
		buf[0] = (uint8_t)(i | 0x30);
		add(buf,
		    1 + (m != NULL ? protobuf_c_message_pack(m, buf + 1) : 0));
	}
}
