/*
 * idem_probe.c: one Gateway call with a request id of the caller's
 * choosing, as a client retrying on another gateway would send it
 * (issue 15). Prints the sandbox id (create) or the status.
 *   moat-idem-probe --tls-ca F --tls-name N --api-key K URL RID create
 *   moat-idem-probe ... URL RID destroy SANDBOX
 * Exit 0 when the call succeeded, else 1 with the status and message on
 * stdout.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.pb-c.h"
#include "gateway.pb-c.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/tls.h"
#include "vm.pb-c.h"

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tls-ca", required_argument, NULL, 'a' },
		{ "tls-name", required_argument, NULL, 'n' },
		{ "api-key", required_argument, NULL, 'k' },
		{ NULL, 0, NULL, 0 },
	};
	struct moat_tls_files files = { 0 };
	struct moat_rpc_client_opts copts = { 0 };
	struct moat_rpc_opts ropts = { .timeout_ms = 120000 };
	struct moat_rpc_client *client = NULL;
	struct moat_tls *tls = NULL;
	ProtobufCMessage *reply = NULL;
	char *err = NULL;
	int o, rv;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 'a')
			files.ca = optarg;
		else if (o == 'n')
			copts.server_name = optarg;
		else if (o == 'k')
			ropts.auth = optarg;
		else
			return 2;
	}
	if (argc - optind < 3)
		return 2;
	ropts.request_id = strtoull(argv[optind + 1], NULL, 10);
	if ((rv = moat_tls_load(&tls, &files, &err)) != MOAT_OK)
		goto out;
	copts.tls = tls;
	copts.what = "the idempotency probe";
	if ((rv = moat_rpc_client_open_opts(&client, argv[optind], &copts,
	         &err)) != MOAT_OK)
		goto out;
	if (strcmp(argv[optind + 2], "create") == 0) {
		Moat__V1__CreateSandboxRequest req =
		    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;

		rv = moat_rpc_call(client, "moat.v1.Gateway", "CreateSandbox",
		    &req.base, &moat__v1__sandbox__descriptor, &reply, &ropts,
		    &err);
		if (rv == MOAT_OK)
			printf("%s\n", ((Moat__V1__Sandbox *)reply)->id);
	} else if (strcmp(argv[optind + 2], "destroy") == 0 &&
	    argc - optind == 4) {
		Moat__V1__SandboxRef req = MOAT__V1__SANDBOX_REF__INIT;

		req.sandbox_id = argv[optind + 3];
		rv = moat_rpc_call(client, "moat.v1.Gateway", "DestroySandbox",
		    &req.base, &moat__v1__empty__descriptor, &reply, &ropts,
		    &err);
		if (rv == MOAT_OK)
			printf("OK\n");
	} else {
		rv = MOAT_INVALID_ARGUMENT;
	}
out:
	if (rv != MOAT_OK)
		printf("%s %s\n", moat_strerror(rv), err ? err : "");
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	free(err);
	moat_rpc_client_close(client);
	moat_tls_free(tls);
	return rv == MOAT_OK ? 0 : 1;
}
