/*
 * fuzz_snapd.c: fuzz target for moat-snapd's request decoding and checks
 * (services/snapshot: handlers.c, catalog.c, the writer): each input is
 * one request to a detached server of the Snapshot service over a real
 * store in a temporary directory (fuzz_service.h). Any bytes must get a
 * Reply with the request's id and a message with every error. Not for:
 * the nng transport, TLS, or the store's format check (main.c).
 */
#include "fuzz_service.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/store.h"
#include "snapd.h"
#include "snapshot.pb-c.h"

/* As services/snapshot/main.c opens them. */
static const char *const dbs[] = { "meta", "snapshots", "manifests", "chunks",
	"chunk_refs", "tenants", NULL };

static struct moat_rpc_server *srv;
static struct snapd sd;

static void
init(void)
{
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__snapshot__descriptor,
		.methods = snapd_methods,
		.n_methods = snapd_n_methods,
		.ctx = &sd,
	};
	char *errmsg = NULL;

	moat_log_init("fuzz-snapd", MOAT_LOG_ERROR);
	sd.store_dir = fuzz_service_dir("snapd");
	sd.pending_grace_ms = 3600000;
	sd.sweep_every_ms = 3600000;
	moat_fuzz_check(moat_store_open(&sd.store, sd.store_dir, 256u << 20,
	                    dbs, &errmsg) == MOAT_OK,
	    "store");
	moat_fuzz_check(snapd_writer_start(&sd.writer, &sd, 64, &errmsg) ==
	        MOAT_OK,
	    "writer");
	fuzz_service_start(&srv, &svc);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return fuzz_service_input(&srv, init, &moat__v1__snapshot__descriptor,
	    data, size);
}

/* method: the index of `name` in the service. */
static unsigned
method(const char *name)
{
	return fuzz_service_method(&moat__v1__snapshot__descriptor, name);
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static uint8_t ids[64];
	Moat__V1__MissingChunksRequest mc =
	    MOAT__V1__MISSING_CHUNKS_REQUEST__INIT;
	Moat__V1__PutChunksRequest pc = MOAT__V1__PUT_CHUNKS_REQUEST__INIT;
	Moat__V1__SnapChunk ch = MOAT__V1__SNAP_CHUNK__INIT;
	Moat__V1__SnapChunk *chs[] = { &ch };
	Moat__V1__GetChunksRequest gc = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	Moat__V1__CommitManifestRequest cm =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__SnapArtifact art = MOAT__V1__SNAP_ARTIFACT__INIT;
	Moat__V1__SnapArtifact *arts[] = { &art };
	Moat__V1__SnapLabel lab = MOAT__V1__SNAP_LABEL__INIT;
	Moat__V1__SnapLabel *labs[] = { &lab };
	Moat__V1__ListSnapshotsRequest ls =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__GetSnapshotRequest gs = MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;

	for (size_t i = 0; i < sizeof(ids); i++)
		ids[i] = (uint8_t)(i * 7 + 1);
	mc.tenant = "acme";
	mc.ids.data = ids;
	mc.ids.len = 64;
	fuzz_service_seed(add, method("MissingChunks"), &mc.base);
	pc.tenant = "acme";
	ch.id.data = ids;
	ch.id.len = 32;
	ch.data.data = (uint8_t *)"chunk data";
	ch.data.len = 10;
	pc.n_chunks = 1;
	pc.chunks = chs;
	fuzz_service_seed(add, method("PutChunks"), &pc.base);
	gc.tenant = "acme";
	gc.ids.data = ids;
	gc.ids.len = 32;
	fuzz_service_seed(add, method("GetChunks"), &gc.base);
	cm.tenant = "acme";
	cm.vmm = "qemu";
	cm.image_id = "python-3.12";
	cm.vcpus = 2;
	cm.memory_mib = 256;
	lab.key = "local_id";
	lab.value = "s-1";
	cm.n_labels = 1;
	cm.labels = labs;
	art.name = "ram";
	art.size = 8192;
	art.chunk_size = 4096;
	art.chunk_ids.data = ids;
	art.chunk_ids.len = 64;
	cm.n_artifacts = 1;
	cm.artifacts = arts;
	fuzz_service_seed(add, method("CommitManifest"), &cm.base);
	ls.tenant = "acme";
	ls.page_size = 3;
	ls.n_labels = 1;
	ls.labels = labs;
	fuzz_service_seed(add, method("ListSnapshots"), &ls.base);
	gs.tenant = "acme";
	gs.id = "snap-0123456789abcdef0123456789abcdef";
	fuzz_service_seed(add, method("GetSnapshot"), &gs.base);
	fuzz_service_seed_methods(add, &moat__v1__snapshot__descriptor);
}
