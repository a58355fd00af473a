/*
 * cluster_probe.c: a direct call to one of the cluster's internal
 * services, as a host holding some certificate would make it, for the
 * cluster test's tenant checks. It asks for one object twice: as tenant
 * "default" (its owner) and as another tenant, and prints both answers'
 * status names ("OK NOT_FOUND").
 *   moat-cluster-probe --tls-cert F --tls-key F --tls-ca F
 *       vmd|sessiond|snapd URL SERVER_NAME TENANT ID
 * vmd: GetSandbox of sandbox ID; sessiond: GetSession of session ID;
 * snapd: the snapd copy of node snapshot ID (found by its local_id label
 * as the owner), then GetSnapshot of it.
 * Not for: anything but tests.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.pb-c.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/tls.h"
#include "session.pb-c.h"
#include "snapshot.pb-c.h"
#include "vm.pb-c.h"

#define OWNER "default"

struct probe {
	struct moat_rpc_client *client;
	const char *kind;
};

/* call: one call acting for `tenant`; the status, the reply in *reply. */
static int
call(struct probe *p, const char *service, const char *method,
    const char *tenant, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply)
{
	struct moat_rpc_opts opts = { .timeout_ms = 10000, .tenant = tenant };
	char *err = NULL;
	int rv;

	*reply = NULL;
	rv = moat_rpc_call(p->client, service, method, req, desc, reply, &opts,
	    &err);
	if (rv != MOAT_OK)
		fprintf(stderr, "%s %s as %s: %s\n", p->kind, method, tenant,
		    err ? err : "");
	free(err);
	return rv;
}

static int
ask_vmd(struct probe *p, const char *tenant, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	ProtobufCMessage *reply;
	int rv;

	ref.sandbox_id = (char *)id;
	rv = call(p, "moat.v1.Vm", "GetSandbox", tenant, &ref.base,
	    &moat__v1__sandbox__descriptor, &reply);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

static int
ask_sessiond(struct probe *p, const char *tenant, const char *id)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	rv = call(p, "moat.v1.Session", "GetSession", tenant, &req.base,
	    &moat__v1__session_info__descriptor, &reply);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

/* snapd_id: the snapd id of node snapshot `local` (its owner's). */
static int
snapd_id(struct probe *p, const char *local, char *out, size_t len)
{
	Moat__V1__ListSnapshotsRequest req =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__SnapLabel label = MOAT__V1__SNAP_LABEL__INIT;
	Moat__V1__SnapLabel *labels[1] = { &label };
	Moat__V1__ListSnapshotsReply *list;
	int rv;

	req.tenant = OWNER;
	label.key = "local_id";
	label.value = (char *)local;
	req.labels = labels;
	req.n_labels = 1;
	if ((rv = call(p, "moat.v1.Snapshot", "ListSnapshots", OWNER,
	         &req.base, &moat__v1__list_snapshots_reply__descriptor,
	         (ProtobufCMessage **)&list)) != MOAT_OK)
		return rv;
	rv = list->n_snapshots == 1 ? MOAT_OK : MOAT_NOT_FOUND;
	if (rv == MOAT_OK)
		snprintf(out, len, "%s", list->snapshots[0]->id);
	else
		fprintf(stderr, "snapd has %zu copies of %s\n",
		    list->n_snapshots, local);
	moat__v1__list_snapshots_reply__free_unpacked(list, NULL);
	return rv;
}

static int
ask_snapd(struct probe *p, const char *tenant, const char *id)
{
	Moat__V1__GetSnapshotRequest req =
	    MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	ProtobufCMessage *reply;
	int rv;

	req.tenant = (char *)tenant;
	req.id = (char *)id;
	rv = call(p, "moat.v1.Snapshot", "GetSnapshot", tenant, &req.base,
	    &moat__v1__snapshot_info__descriptor, &reply);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

static int
usage(void)
{
	fprintf(stderr,
	    "usage: moat-cluster-probe --tls-cert F --tls-key F --tls-ca F "
	    "vmd|sessiond|snapd URL SERVER_NAME TENANT ID\n");
	return 2;
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tls-cert", required_argument, NULL, 'c' },
		{ "tls-key", required_argument, NULL, 'k' },
		{ "tls-ca", required_argument, NULL, 'a' },
		{ NULL, 0, NULL, 0 },
	};
	struct moat_tls_files files = { 0 };
	struct moat_rpc_client_opts copts = { 0 };
	struct moat_tls *tls = NULL;
	struct probe p = { 0 };
	char *err = NULL, snap[128];
	const char *id;
	int o, rv, owner, other;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 'c')
			files.cert = optarg;
		else if (o == 'k')
			files.key = optarg;
		else if (o == 'a')
			files.ca = optarg;
		else
			return usage();
	}
	if (argc - optind != 5)
		return usage();
	p.kind = argv[optind];
	id = argv[optind + 4];
	if ((rv = moat_tls_load(&tls, &files, &err)) != MOAT_OK)
		goto fail;
	copts.tls = tls;
	copts.server_name = argv[optind + 2];
	copts.what = "the probe";
	if ((rv = moat_rpc_client_open_opts(&p.client, argv[optind + 1],
	         &copts, &err)) != MOAT_OK)
		goto fail;
	if (strcmp(p.kind, "vmd") == 0) {
		owner = ask_vmd(&p, OWNER, id);
		other = ask_vmd(&p, argv[optind + 3], id);
	} else if (strcmp(p.kind, "sessiond") == 0) {
		owner = ask_sessiond(&p, OWNER, id);
		other = ask_sessiond(&p, argv[optind + 3], id);
	} else if (strcmp(p.kind, "snapd") == 0) {
		if ((owner = snapd_id(&p, id, snap, sizeof(snap))) == MOAT_OK)
			owner = ask_snapd(&p, OWNER, snap);
		other = owner == MOAT_OK ?
		    ask_snapd(&p, argv[optind + 3], snap) :
		    owner;
	} else {
		moat_rpc_client_close(p.client);
		moat_tls_free(tls);
		return usage();
	}
	printf("%s %s\n", moat_strerror(owner), moat_strerror(other));
	moat_rpc_client_close(p.client);
	moat_tls_free(tls);
	return 0;

fail:
	fprintf(stderr, "moat-cluster-probe: %s\n", err ? err : "failed");
	free(err);
	moat_tls_free(tls);
	return 1;
}
