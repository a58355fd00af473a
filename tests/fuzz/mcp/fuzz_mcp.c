/*
 * fuzz_mcp.c: fuzz target for the MCP server's message handling
 * (lib/mcp/mcp.c, tools.c) with a fake gateway. Invariants: any
 * input gets no reply or a reply that is JSON-RPC 2.0 JSON; input that
 * is not JSON gets -32700; nothing leaks (ASan).
 * Not for: transports.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "moat/mcp.h"
#include "moat/status.h"

static int
fake_call(void *arg, const char *method, json_t *request, json_t **reply,
    char **errmsg)
{
	*errmsg = NULL;
	if (strcmp(method, "ReadFile") == 0) {
		*reply = NULL;
		*errmsg = strdup("not found");
		return MOAT_NOT_FOUND;
	}
	*reply = json_pack("{s:s, s:s, s:{s:s}}", "id", "sb-f", "data",
	    "aGk=", "result", "stdout", "NDI=");
	return MOAT_OK;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct moat_mcp_session *s = NULL;
	char *errmsg = NULL, *out;
	json_t *in, *reply;

	moat_fuzz_check(moat_mcp_session_new(&s, NULL, "fuzz", &errmsg) ==
	        MOAT_OK,
	    "session_new");
	out =
	    moat_mcp_handle_text(s, (const char *)data, size, fake_call, NULL);
	in = json_loadb((const char *)data, size,
	    JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
	if (out != NULL) {
		reply = json_loads(out, JSON_DECODE_ANY, NULL);
		moat_fuzz_check(reply != NULL, "the reply is JSON");
		moat_fuzz_check(json_is_array(reply) ||
		        strcmp(
		            json_string_value(json_object_get(reply, "jsonrpc")) ?:
		                "",
		            "2.0") == 0,
		    "the reply is JSON-RPC 2.0");
		if (in == NULL)
			moat_fuzz_check(json_integer_value(json_object_get(
			                    json_object_get(reply, "error"),
			                    "code")) == -32700,
			    "malformed JSON gets -32700");
		json_decref(reply);
	} else {
		moat_fuzz_check(in != NULL, "malformed JSON gets a reply");
	}
	json_decref(in);
	free(out);
	moat_mcp_session_close(s, fake_call, NULL);
	moat_mcp_session_free(s);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const char *const seeds[] = {
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\","
		"\"params\":{\"protocolVersion\":\"2025-03-26\"}}",
		"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}",
		"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\","
		"\"params\":{\"name\":\"run_code\",\"arguments\":{\"code\":"
		"\"print(1)\"}}}",
		"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\","
		"\"params\":{\"name\":\"exec\",\"arguments\":{\"command\":"
		"\"ls\",\"env\":{\"A\":\"b\"},\"timeout\":3}}}",
		"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\","
		"\"params\":{\"name\":\"read_file\",\"arguments\":{\"path\":"
		"\"/x\"}}}",
		"[{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"ping\"},"
		"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}]",
		"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\","
		"\"params\":{\"name\":\"restore\",\"arguments\":"
		"{\"step\":2}}}",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		add((const uint8_t *)seeds[i], strlen(seeds[i]));
}
