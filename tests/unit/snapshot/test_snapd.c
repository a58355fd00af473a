/*
 * test_snapd.c: moat-snapd as a real process in a fresh state directory,
 * driven over the RPC layer: the whole life of a snapshot (missing, put,
 * get, commit, get, list, pull, delete), dedup between snapshots and
 * reference counts proved by Stats, zero chunks never stored, tenants
 * kept apart, a chunk corrupted on disk (a byte flipped with a direct
 * LMDB write) reported as DATA_LOSS naming the snapshot, commits that are
 * refused (missing chunks, a full map) leaving nothing behind, arriving
 * chunks checked against their ids, the sweep of abandoned uploads,
 * list paging, and its metrics (--metrics: chunk bytes in and out, the
 * chunk calls' latency, stored vs logical bytes).
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "moat/chunk.h"
#include "moat/rpc.h"
#include "moat/store.h"
#include "moat/util.h"
#include "snap_client.h"

#define CS (64u << 10)
#define SVC MOAT_SNAP_SERVICE

static char dir[64];
static pid_t snapd_pid;
static struct moat_rpc_client *cli;

/* ---- harness ---- */

static void
start_snapd(char *const extra[])
{
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 500 };
	char *argv[16], *url, *log, *errmsg = NULL;
	ProtobufCMessage *reply = NULL;
	int n = 0, rv = MOAT_UNAVAILABLE;

	argv[n++] = (char *)SNAPD_BIN;
	argv[n++] = (char *)"--state-dir";
	argv[n++] = dir;
	for (int i = 0; extra != NULL && extra[i] != NULL && n < 15; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	log = moat_asprintf("%s/snapd.log", dir);
	if ((snapd_pid = fork()) == 0) {
		if (freopen(log, "a", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(SNAPD_BIN, argv);
		_exit(127);
	}
	free(log);
	assert_true(snapd_pid > 0);
	url = moat_asprintf("ipc://%s/snapd.sock", dir);
	assert_int_equal(moat_rpc_client_open(&cli, url, &errmsg), MOAT_OK);
	free(url);
	for (int i = 0; i < 100 && rv != MOAT_OK; i++) {
		free(errmsg);
		errmsg = NULL;
		rv = moat_rpc_call(cli, SVC, "Health", &req.base,
		    &moat__v1__health_reply__descriptor, &reply, &opts,
		    &errmsg);
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	if (rv != MOAT_OK)
		fail_msg("moat-snapd never answered: %s", errmsg);
	protobuf_c_message_free_unpacked(reply, NULL);
}

static void
stop_snapd(void)
{
	int status;

	if (snapd_pid <= 0)
		return;
	kill(snapd_pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(snapd_pid, &status, WNOHANG) == snapd_pid) {
			snapd_pid = 0;
			moat_rpc_client_close(cli);
			cli = NULL;
			assert_true(WIFEXITED(status));
			assert_int_equal(WEXITSTATUS(status), 0);
			return;
		}
		nng_msleep(10);
	}
	kill(snapd_pid, SIGKILL);
	waitpid(snapd_pid, &status, 0);
	snapd_pid = 0;
	fail_msg("moat-snapd did not stop on SIGTERM");
}

static int
setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/moat-snapd-XXXXXX");
	assert_non_null(mkdtemp(dir));
	start_snapd(NULL);
	return 0;
}

static int
teardown(void **state)
{
	stop_snapd();
	moat_rm_rf(dir);
	return 0;
}

/* call: one RPC; returns the status, the reply in *out (or NULL), and the
 * message in *msg (heap) when it failed. */
static int
call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *rd, ProtobufCMessage **out, char **msg)
{
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int rv;

	rv = moat_rpc_call(cli, SVC, method, req, rd, &reply, NULL, &errmsg);
	if (out != NULL)
		*out = reply;
	else if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	if (msg != NULL)
		*msg = errmsg;
	else
		free(errmsg);
	return rv;
}

/* make_file: `n` chunks of CS bytes from `seed`; chunks in `holes` (a
 * bitmask) are left as holes. */
static char *
make_file(const char *name, int n, uint32_t seed, uint32_t holes)
{
	char *path = moat_asprintf("%s/%s", dir, name);
	uint8_t *buf = malloc(CS);
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)n * CS), 0);
	for (int c = 0; c < n; c++) {
		if (c < 32 && (holes & (1u << c)))
			continue;
		for (size_t i = 0; i < CS; i += 4) {
			uint32_t v = seed * 2654435761u +
			    (uint32_t)c * 40503u + (uint32_t)i;

			memcpy(buf + i, &v, 4);
		}
		assert_int_equal(pwrite(fd, buf, CS, (off_t)c * CS),
		    (ssize_t)CS);
	}
	close(fd);
	free(buf);
	return path;
}

/* poke: overwrites 4 bytes at `off` of file `path`. */
static void
poke(const char *path, uint64_t off, uint32_t v)
{
	int fd = open(path, O_WRONLY);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, &v, 4, (off_t)off), 4);
	close(fd);
}

/* snapshot: pushes `path` as artifact "ram" and commits; returns the
 * reply (caller frees), or NULL with *rvp set when the commit failed. */
static Moat__V1__SnapshotInfo *
snapshot(const char *tenant, const char *path, const char *parent, int *rvp,
    char **msg)
{
	Moat__V1__CommitManifestRequest req =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__SnapArtifact art, *arts[1] = { &art };
	Moat__V1__SnapLabel label = MOAT__V1__SNAP_LABEL__INIT,
	                    *labels[1] = { &label };
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int rv;

	rv = moat_snap_push_file(cli, tenant, "ram", path, CS, &art, NULL,
	    &errmsg);
	if (rv != MOAT_OK)
		fail_msg("push %s: %s", path, errmsg);
	req.tenant = (char *)tenant;
	req.vmm = (char *)"qemu";
	req.image_id = (char *)"python";
	req.vcpus = 1;
	req.memory_mib = 256;
	req.parent_id = (char *)(parent ? parent : "");
	label.key = (char *)"step";
	label.value = (char *)"1";
	req.n_labels = 1;
	req.labels = labels;
	req.n_artifacts = 1;
	req.artifacts = arts;
	rv = call("CommitManifest", &req.base,
	    &moat__v1__snapshot_info__descriptor, &reply, msg);
	moat_snap_artifact_clear(&art);
	if (rvp != NULL)
		*rvp = rv;
	else if (rv != MOAT_OK)
		fail_msg("commit: %s", msg ? *msg : "");
	return (Moat__V1__SnapshotInfo *)reply;
}

static Moat__V1__SnapshotStatsReply *
stats(const char *tenant)
{
	Moat__V1__SnapshotStatsRequest req =
	    MOAT__V1__SNAPSHOT_STATS_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;

	req.tenant = (char *)tenant;
	assert_int_equal(call("Stats", &req.base,
	                     &moat__v1__snapshot_stats_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	return (Moat__V1__SnapshotStatsReply *)reply;
}

static void
check_stats(const char *tenant, uint64_t snaps, uint64_t chunks,
    uint64_t pending)
{
	Moat__V1__SnapshotStatsReply *s = stats(tenant);

	assert_int_equal(s->snapshots, snaps);
	assert_int_equal(s->chunks, chunks);
	assert_int_equal(s->stored_bytes, chunks * CS);
	assert_int_equal(s->pending_chunks, pending);
	protobuf_c_message_free_unpacked(&s->base, NULL);
}

static Moat__V1__SnapshotInfo *
get_snapshot(const char *tenant, const char *id, bool with_chunks, int *rv,
    char **msg)
{
	Moat__V1__GetSnapshotRequest req =
	    MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;

	req.tenant = (char *)tenant;
	req.id = (char *)id;
	req.with_chunks = with_chunks;
	*rv = call("GetSnapshot", &req.base,
	    &moat__v1__snapshot_info__descriptor, &reply, msg);
	return (Moat__V1__SnapshotInfo *)reply;
}

static int
delete_snapshot(const char *tenant, const char *id, uint64_t *freed)
{
	Moat__V1__DeleteSnapshotRequest req =
	    MOAT__V1__DELETE_SNAPSHOT_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.id = (char *)id;
	rv = call("DeleteSnapshot", &req.base,
	    &moat__v1__delete_snapshot_reply__descriptor, &reply, NULL);
	if (rv == MOAT_OK && freed != NULL)
		*freed =
		    ((Moat__V1__DeleteSnapshotReply *)reply)->freed_chunks;
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

static void
assert_files_equal(const char *a, const char *b)
{
	char *x = NULL, *y = NULL;
	size_t lx = 0, ly = 0;

	assert_int_equal(moat_read_file(a, 64u << 20, &x, &lx), 0);
	assert_int_equal(moat_read_file(b, 64u << 20, &y, &ly), 0);
	assert_int_equal(lx, ly);
	assert_memory_equal(x, y, lx);
	free(x);
	free(y);
}

/* ---- tests ---- */

static void
test_lifecycle(void **state)
{
	Moat__V1__MissingChunksRequest mreq =
	    MOAT__V1__MISSING_CHUNKS_REQUEST__INIT;
	Moat__V1__GetChunksRequest greq = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	Moat__V1__ListSnapshotsRequest lreq =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__MissingChunksReply *mr;
	Moat__V1__GetChunksReply *gr;
	Moat__V1__ListSnapshotsReply *lr;
	Moat__V1__SnapshotInfo *info, *got;
	ProtobufCMessage *reply = NULL;
	char *path = make_file("ram", 6, 1, 1u << 2), *back, *msg = NULL;
	uint8_t ids[3 * 32] = { 0 };
	uint8_t *data = malloc(CS);
	int rv;

	/* A fresh store lacks a chunk; a zero id is never missing. */
	memset(data, 0x5a, CS);
	moat_chunk_hash(data, CS, (struct moat_chunk_id *)ids);
	ids[64] = 1; /* ids[1] stays the zero marker */
	mreq.tenant = (char *)"acme";
	mreq.ids.data = ids;
	mreq.ids.len = sizeof(ids);
	assert_int_equal(call("MissingChunks", &mreq.base,
	                     &moat__v1__missing_chunks_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	mr = (Moat__V1__MissingChunksReply *)reply;
	assert_int_equal(mr->n_missing, 2);
	assert_int_equal(mr->missing[0], 0);
	assert_int_equal(mr->missing[1], 2);
	protobuf_c_message_free_unpacked(reply, NULL);

	info = snapshot("acme", path, NULL, NULL, &msg);
	assert_non_null(info);
	assert_int_equal(strncmp(info->id, "snap-", 5), 0);
	assert_int_equal(strlen(info->id), 37);
	assert_string_equal(info->tenant, "acme");
	assert_string_equal(info->vmm, "qemu");
	assert_int_equal(info->logical_bytes, 6 * CS);
	assert_int_equal(info->stored_bytes, 5 * CS);
	assert_int_equal(info->chunks, 5);
	assert_int_equal(info->zero_chunks, 1);
	assert_int_equal(info->n_labels, 1);
	assert_int_equal(info->artifacts[0]->chunk_ids.len, 0);
	check_stats("acme", 1, 5, 0);

	/* Get with chunks: the list the producer sent, chunk 2 a zero. */
	got = get_snapshot("acme", info->id, true, &rv, NULL);
	assert_int_equal(rv, MOAT_OK);
	assert_int_equal(got->artifacts[0]->chunk_ids.len, 6 * 32);
	assert_true(moat_chunk_id_is_zero(
	    (const struct moat_chunk_id *)(got->artifacts[0]->chunk_ids.data +
	        2 * 32)));

	/* GetChunks returns verified bytes in request order. */
	greq.tenant = (char *)"acme";
	greq.snapshot_id = info->id;
	greq.ids.data = got->artifacts[0]->chunk_ids.data + 3 * 32;
	greq.ids.len = 2 * 32;
	assert_int_equal(call("GetChunks", &greq.base,
	                     &moat__v1__get_chunks_reply__descriptor, &reply,
	                     NULL),
	    MOAT_OK);
	gr = (Moat__V1__GetChunksReply *)reply;
	assert_int_equal(gr->n_chunks, 2);
	assert_int_equal(gr->chunks[0]->data.len, CS);
	assert_true(moat_chunk_verify(gr->chunks[1]->data.data, CS,
	    (const struct moat_chunk_id *)greq.ids.data + 1));
	protobuf_c_message_free_unpacked(reply, NULL);

	/* Pulled back, the file is the same, byte for byte. */
	back = moat_asprintf("%s/ram.back", dir);
	assert_int_equal(moat_snap_pull_file(cli, "acme", info->id,
	                     got->artifacts[0], back, &msg),
	    MOAT_OK);
	assert_files_equal(path, back);

	lreq.tenant = (char *)"acme";
	assert_int_equal(call("ListSnapshots", &lreq.base,
	                     &moat__v1__list_snapshots_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	lr = (Moat__V1__ListSnapshotsReply *)reply;
	assert_int_equal(lr->n_snapshots, 1);
	assert_string_equal(lr->snapshots[0]->id, info->id);
	assert_string_equal(lr->next_page_token, "");
	protobuf_c_message_free_unpacked(reply, NULL);

	assert_int_equal(delete_snapshot("acme", info->id, NULL), MOAT_OK);
	protobuf_c_message_free_unpacked(&got->base, NULL);
	got = get_snapshot("acme", info->id, false, &rv, NULL);
	assert_int_equal(rv, MOAT_NOT_FOUND);
	assert_int_equal(delete_snapshot("acme", info->id, NULL),
	    MOAT_NOT_FOUND);
	check_stats("acme", 0, 0, 0);
	protobuf_c_message_free_unpacked(&info->base, NULL);
	free(data);
	free(back);
	free(path);
}

static void
test_dedup_refcounts(void **state)
{
	char *a = make_file("a", 8, 7, 0), *b = make_file("b", 8, 7, 0);
	Moat__V1__SnapshotInfo *sa, *sb;
	Moat__V1__SnapshotStatsReply *s;
	uint64_t freed = 0;

	/* b differs from a in one page of chunk 5. */
	poke(b, 5 * CS + 4096, 0xdeadbeef);
	sa = snapshot("acme", a, NULL, NULL, NULL);
	sb = snapshot("acme", b, sa->id, NULL, NULL);
	assert_string_equal(sb->parent_id, sa->id);
	/* The second snapshot stored one new chunk, not eight. */
	assert_int_equal(sa->stored_bytes, 8 * CS);
	assert_int_equal(sb->stored_bytes, CS);
	check_stats("acme", 2, 9, 0);
	s = stats("acme");
	assert_int_equal(s->logical_bytes, 16 * CS);
	assert_true(s->dedup_ratio > 1.7 && s->dedup_ratio < 1.8);
	protobuf_c_message_free_unpacked(&s->base, NULL);

	/* Deleting a frees only the chunk b does not share. */
	assert_int_equal(delete_snapshot("acme", sa->id, &freed), MOAT_OK);
	assert_int_equal(freed, 1);
	check_stats("acme", 1, 8, 0);
	assert_int_equal(delete_snapshot("acme", sb->id, &freed), MOAT_OK);
	assert_int_equal(freed, 8);
	check_stats("acme", 0, 0, 0);
	protobuf_c_message_free_unpacked(&sa->base, NULL);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	free(a);
	free(b);
}

static void
test_zero_chunks(void **state)
{
	/* 12 chunks: 9 holes, one of written zeros, two of data. */
	char *path = make_file("sparse", 12, 3,
	         0xfffu & ~(1u << 4 | 1u << 7 | 1u << 10)),
	     *msg = NULL;
	Moat__V1__PutChunksRequest req = MOAT__V1__PUT_CHUNKS_REQUEST__INIT;
	Moat__V1__SnapChunk c = MOAT__V1__SNAP_CHUNK__INIT, *cs[1] = { &c };
	Moat__V1__SnapshotInfo *info;
	uint8_t *zeros = calloc(1, CS), id[32];

	{
		int fd = open(path, O_WRONLY);

		assert_int_equal(pwrite(fd, zeros, CS, 10 * CS), (ssize_t)CS);
		close(fd);
	}
	info = snapshot("acme", path, NULL, NULL, NULL);
	assert_int_equal(info->zero_chunks, 10);
	assert_int_equal(info->chunks, 2);
	assert_int_equal(info->logical_bytes, 12 * CS);
	check_stats("acme", 1, 2, 0);
	/* A zero chunk sent anyway is refused, not stored. */
	moat_chunk_hash(zeros, CS, (struct moat_chunk_id *)id);
	c.id.data = id;
	c.id.len = 32;
	c.data.data = zeros;
	c.data.len = CS;
	req.tenant = (char *)"acme";
	req.n_chunks = 1;
	req.chunks = cs;
	assert_int_equal(call("PutChunks", &req.base,
	                     &moat__v1__put_chunks_reply__descriptor, NULL,
	                     &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "all zeros"));
	free(msg);
	check_stats("acme", 1, 2, 0);
	protobuf_c_message_free_unpacked(&info->base, NULL);
	free(zeros);
	free(path);
}

static void
test_tenant_isolation(void **state)
{
	Moat__V1__GetChunksRequest greq = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	Moat__V1__ListSnapshotsRequest lreq =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	char *shared = make_file("shared", 4, 11, 0);
	char *secret = make_file("secret", 4, 12, 0), *msg = NULL;
	Moat__V1__SnapshotInfo *a1, *b1, *a2, *full;
	ProtobufCMessage *reply = NULL;
	int rv;

	/* Same content in two tenants is stored twice: no cross-tenant
	 * dedup. */
	a1 = snapshot("acme", shared, NULL, NULL, NULL);
	b1 = snapshot("bravo", shared, NULL, NULL, NULL);
	assert_int_equal(a1->stored_bytes, 4 * CS);
	assert_int_equal(b1->stored_bytes, 4 * CS);
	check_stats("acme", 1, 4, 0);
	check_stats("bravo", 1, 4, 0);
	a2 = snapshot("acme", secret, NULL, NULL, NULL);

	/* bravo cannot see, read the chunks of, or delete acme's. */
	full = get_snapshot("bravo", a2->id, false, &rv, &msg);
	assert_int_equal(rv, MOAT_NOT_FOUND);
	assert_null(full);
	free(msg);
	assert_int_equal(delete_snapshot("bravo", a2->id, NULL),
	    MOAT_NOT_FOUND);
	full = get_snapshot("acme", a2->id, true, &rv, NULL);
	assert_int_equal(rv, MOAT_OK);
	greq.tenant = (char *)"bravo";
	greq.ids = full->artifacts[0]->chunk_ids;
	assert_int_equal(call("GetChunks", &greq.base,
	                     &moat__v1__get_chunks_reply__descriptor, NULL,
	                     NULL),
	    MOAT_NOT_FOUND);
	greq.snapshot_id = a2->id;
	assert_int_equal(call("GetChunks", &greq.base,
	                     &moat__v1__get_chunks_reply__descriptor, NULL,
	                     NULL),
	    MOAT_NOT_FOUND);
	lreq.tenant = (char *)"bravo";
	assert_int_equal(call("ListSnapshots", &lreq.base,
	                     &moat__v1__list_snapshots_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	assert_int_equal(((Moat__V1__ListSnapshotsReply *)reply)->n_snapshots,
	    1);
	protobuf_c_message_free_unpacked(reply, NULL);
	/* Issue 17: one page across tenants by image, for tenant
	 * moat.images only (the gateway's image removal). */
	lreq.all_tenants = true;
	lreq.image_id = (char *)"python";
	assert_int_equal(call("ListSnapshots", &lreq.base,
	                     &moat__v1__list_snapshots_reply__descriptor,
	                     &reply, NULL),
	    MOAT_PERMISSION_DENIED);
	lreq.tenant = (char *)"moat.images";
	assert_int_equal(call("ListSnapshots", &lreq.base,
	                     &moat__v1__list_snapshots_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	assert_int_equal(((Moat__V1__ListSnapshotsReply *)reply)->n_snapshots,
	    3);
	protobuf_c_message_free_unpacked(reply, NULL);
	lreq.image_id = (char *)"rust";
	assert_int_equal(call("ListSnapshots", &lreq.base,
	                     &moat__v1__list_snapshots_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	assert_int_equal(((Moat__V1__ListSnapshotsReply *)reply)->n_snapshots,
	    0);
	protobuf_c_message_free_unpacked(reply, NULL);
	/* Deleting bravo's copy leaves acme's chunks alone. */
	assert_int_equal(delete_snapshot("bravo", b1->id, NULL), MOAT_OK);
	check_stats("bravo", 0, 0, 0);
	check_stats("acme", 2, 8, 0);
	protobuf_c_message_free_unpacked(&a1->base, NULL);
	protobuf_c_message_free_unpacked(&b1->base, NULL);
	protobuf_c_message_free_unpacked(&a2->base, NULL);
	protobuf_c_message_free_unpacked(&full->base, NULL);
	free(shared);
	free(secret);
}

/* call_as: `method` with Envelope.tenant `tenant` (as the gateway sends
 * it); only the status counts, *msg (heap) on failure. */
static int
call_as(const char *tenant, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *rd, char **msg)
{
	struct moat_rpc_opts opts = { .timeout_ms = 10000, .tenant = tenant };
	ProtobufCMessage *reply = NULL;
	int rv;

	*msg = NULL;
	rv = moat_rpc_call(cli, SVC, method, req, rd, &reply, &opts, msg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

/* call_as expecting `code` and, when not NULL, `needle` in the message. */
static void
expect_as(const char *tenant, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *rd, int code, const char *needle)
{
	char *msg = NULL;

	assert_int_equal(call_as(tenant, method, req, rd, &msg), code);
	if (needle != NULL) {
		assert_non_null(msg);
		assert_non_null(strstr(msg, needle));
	}
	free(msg);
}

/* Envelope.tenant (the gateway's) must be the request's; the request's
 * field is required (never "" for any tenant or "default"); another
 * tenant's snapshot and chunks stay NOT_FOUND. */
static void
test_envelope_tenant(void **state)
{
	Moat__V1__GetSnapshotRequest g = MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	Moat__V1__GetChunksRequest c = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	Moat__V1__ListSnapshotsRequest l =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__SnapshotStatsRequest s =
	    MOAT__V1__SNAPSHOT_STATS_REQUEST__INIT;
	Moat__V1__DeleteSnapshotRequest d =
	    MOAT__V1__DELETE_SNAPSHOT_REQUEST__INIT;
	Moat__V1__MissingChunksRequest m =
	    MOAT__V1__MISSING_CHUNKS_REQUEST__INIT;
	const ProtobufCMessageDescriptor *info =
	    &moat__v1__snapshot_info__descriptor;
	const ProtobufCMessageDescriptor *chunks =
	    &moat__v1__get_chunks_reply__descriptor;
	char *path = make_file("env", 2, 21, 0);
	Moat__V1__SnapshotInfo *a = snapshot("acme", path, NULL, NULL, NULL);
	Moat__V1__SnapshotInfo *full;
	int rv;

	full = get_snapshot("acme", a->id, true, &rv, NULL);
	assert_int_equal(rv, MOAT_OK);
	g.id = a->id;
	c.snapshot_id = a->id;
	c.ids = full->artifacts[0]->chunk_ids;
	d.id = a->id;
	m.ids = full->artifacts[0]->chunk_ids;

	/* The owner, named in both: OK. */
	g.tenant = c.tenant = "acme";
	expect_as("acme", "GetSnapshot", &g.base, info, MOAT_OK, NULL);
	expect_as("acme", "GetChunks", &c.base, chunks, MOAT_OK, NULL);
	/* The envelope names another tenant than the request. */
	expect_as("bravo", "GetSnapshot", &g.base, info, MOAT_INVALID_ARGUMENT,
	    "bravo");
	expect_as("bravo", "GetChunks", &c.base, chunks, MOAT_INVALID_ARGUMENT,
	    "bravo");
	/* Another tenant, in both: the snapshot and its chunks do not
	 * exist, and it cannot be deleted. */
	g.tenant = c.tenant = d.tenant = "bravo";
	expect_as("bravo", "GetSnapshot", &g.base, info, MOAT_NOT_FOUND, NULL);
	expect_as("bravo", "GetChunks", &c.base, chunks, MOAT_NOT_FOUND, NULL);
	expect_as("bravo", "DeleteSnapshot", &d.base,
	    &moat__v1__delete_snapshot_reply__descriptor, MOAT_NOT_FOUND,
	    NULL);
	/* No tenant in the request: refused, envelope or not. */
	g.tenant = c.tenant = d.tenant = "";
	expect_as(NULL, "GetSnapshot", &g.base, info, MOAT_INVALID_ARGUMENT,
	    "tenant is required");
	expect_as("acme", "GetSnapshot", &g.base, info, MOAT_INVALID_ARGUMENT,
	    "tenant is required");
	expect_as(NULL, "GetChunks", &c.base, chunks, MOAT_INVALID_ARGUMENT,
	    "tenant is required");
	expect_as(NULL, "MissingChunks", &m.base,
	    &moat__v1__missing_chunks_reply__descriptor, MOAT_INVALID_ARGUMENT,
	    "tenant is required");
	expect_as(NULL, "ListSnapshots", &l.base,
	    &moat__v1__list_snapshots_reply__descriptor, MOAT_INVALID_ARGUMENT,
	    "tenant is required");
	expect_as(NULL, "Stats", &s.base,
	    &moat__v1__snapshot_stats_reply__descriptor, MOAT_INVALID_ARGUMENT,
	    "tenant is required");
	expect_as(NULL, "DeleteSnapshot", &d.base,
	    &moat__v1__delete_snapshot_reply__descriptor,
	    MOAT_INVALID_ARGUMENT, "tenant is required");
	/* It is all still there for its owner. */
	check_stats("acme", 1, 2, 0);
	protobuf_c_message_free_unpacked(&full->base, NULL);
	protobuf_c_message_free_unpacked(&a->base, NULL);
	free(path);
}

/* flip: flips one byte of piece 0 of `tenant`'s chunk `id` in the LMDB
 * environment, behind snapd's back (LMDB allows a second process). */
static void
flip(const char *tenant, const uint8_t *id)
{
	static const char *const dbs[] = { "chunks", NULL };
	struct moat_store *st = NULL;
	struct moat_store_txn *txn = NULL;
	char *path = moat_asprintf("%s/snapd", dir), *errmsg = NULL;
	uint8_t key[128], *copy;
	size_t klen = 0, vlen;
	const void *val;

	key[klen++] = (uint8_t)strlen(tenant);
	memcpy(key + klen, tenant, strlen(tenant));
	klen += strlen(tenant);
	memcpy(key + klen, id, 32);
	klen += 32;
	key[klen++] = 0;
	assert_int_equal(moat_store_open(&st, path, 0, dbs, &errmsg), MOAT_OK);
	assert_int_equal(moat_store_txn_begin(st, true, &txn, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_get(txn, "chunks", key, klen, &val, &vlen,
	                     &errmsg),
	    MOAT_OK);
	copy = malloc(vlen);
	memcpy(copy, val, vlen);
	copy[vlen / 2] ^= 0x40;
	assert_int_equal(moat_store_put(txn, "chunks", key, klen, copy, vlen,
	                     false, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_txn_commit(txn, &errmsg), MOAT_OK);
	moat_store_close(st);
	free(copy);
	free(path);
}

static void
test_corrupt_chunk(void **state)
{
	Moat__V1__GetChunksRequest greq = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	char *path = make_file("ram", 4, 21, 0), *back, *msg = NULL;
	Moat__V1__SnapshotInfo *info, *full;
	int rv;

	info = snapshot("acme", path, NULL, NULL, NULL);
	full = get_snapshot("acme", info->id, true, &rv, NULL);
	assert_int_equal(rv, MOAT_OK);
	flip("acme", full->artifacts[0]->chunk_ids.data + 2 * 32);

	greq.tenant = (char *)"acme";
	greq.snapshot_id = info->id;
	greq.ids.data = full->artifacts[0]->chunk_ids.data + 2 * 32;
	greq.ids.len = 32;
	assert_int_equal(call("GetChunks", &greq.base,
	                     &moat__v1__get_chunks_reply__descriptor, NULL,
	                     &msg),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(msg, info->id));
	assert_non_null(strstr(msg, "hash"));
	free(msg);
	/* Without a snapshot named, snapd finds the ones that use it. */
	greq.snapshot_id = (char *)"";
	assert_int_equal(call("GetChunks", &greq.base,
	                     &moat__v1__get_chunks_reply__descriptor, NULL,
	                     &msg),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(msg, info->id));
	free(msg);
	/* A restore stops: no file appears. */
	back = moat_asprintf("%s/ram.back", dir);
	assert_int_equal(moat_snap_pull_file(cli, "acme", info->id,
	                     full->artifacts[0], back, &msg),
	    MOAT_DATA_LOSS);
	free(msg);
	assert_int_not_equal(access(back, F_OK), 0);
	protobuf_c_message_free_unpacked(&info->base, NULL);
	protobuf_c_message_free_unpacked(&full->base, NULL);
	free(back);
	free(path);
}

static void
test_commit_missing(void **state)
{
	Moat__V1__CommitManifestRequest req =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__ListSnapshotsRequest lreq =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__SnapArtifact art, *arts[1] = { &art };
	char *path = make_file("ram", 4, 31, 0), *msg = NULL;
	ProtobufCMessage *reply = NULL;

	assert_int_equal(moat_snap_push_file(cli, "acme", "ram", path, CS,
	                     &art, NULL, &msg),
	    MOAT_OK);
	/* Two ids nobody put. */
	art.chunk_ids.data[0] ^= 1;
	art.chunk_ids.data[3 * 32] ^= 1;
	req.tenant = (char *)"acme";
	req.vmm = (char *)"firecracker";
	req.vcpus = 2;
	req.memory_mib = 512;
	req.n_artifacts = 1;
	req.artifacts = arts;
	assert_int_equal(call("CommitManifest", &req.base,
	                     &moat__v1__snapshot_info__descriptor, NULL, &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "2 of 4 chunks are missing"));
	free(msg);
	/* Nothing half-written: no snapshot, no reference taken (the four
	 * chunks put are still pending). */
	lreq.tenant = (char *)"acme";
	assert_int_equal(call("ListSnapshots", &lreq.base,
	                     &moat__v1__list_snapshots_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	assert_int_equal(((Moat__V1__ListSnapshotsReply *)reply)->n_snapshots,
	    0);
	protobuf_c_message_free_unpacked(reply, NULL);
	check_stats("acme", 0, 4, 4);
	/* A parent of another tenant, or none, is NOT_FOUND. */
	art.chunk_ids.data[0] ^= 1;
	art.chunk_ids.data[3 * 32] ^= 1;
	req.parent_id = (char *)"snap-0123456789abcdef0123456789abcdef";
	assert_int_equal(call("CommitManifest", &req.base,
	                     &moat__v1__snapshot_info__descriptor, NULL, NULL),
	    MOAT_NOT_FOUND);
	req.parent_id = (char *)"";
	assert_int_equal(call("CommitManifest", &req.base,
	                     &moat__v1__snapshot_info__descriptor, NULL, NULL),
	    MOAT_OK);
	check_stats("acme", 1, 4, 0);
	moat_snap_artifact_clear(&art);
	free(path);
}

static void
test_bad_input(void **state)
{
	Moat__V1__PutChunksRequest req = MOAT__V1__PUT_CHUNKS_REQUEST__INIT;
	Moat__V1__SnapChunk c = MOAT__V1__SNAP_CHUNK__INIT, *cs[1] = { &c };
	Moat__V1__CommitManifestRequest creq =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__SnapArtifact art = MOAT__V1__SNAP_ARTIFACT__INIT,
	                       *arts[1] = { &art };
	uint8_t data[4096], id[32];
	char *msg = NULL;
	int rv;

	/* A chunk whose bytes do not hash to its id is refused. */
	memset(data, 7, sizeof(data));
	moat_chunk_hash(data, sizeof(data), (struct moat_chunk_id *)id);
	data[100] = 8;
	c.id.data = id;
	c.id.len = 32;
	c.data.data = data;
	c.data.len = sizeof(data);
	req.tenant = (char *)"acme";
	req.n_chunks = 1;
	req.chunks = cs;
	assert_int_equal(call("PutChunks", &req.base,
	                     &moat__v1__put_chunks_reply__descriptor, NULL,
	                     &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "do not hash"));
	free(msg);
	check_stats("acme", 0, 0, 0);
	/* No tenant, a short id, a batch over the cap. */
	req.tenant = (char *)"";
	assert_int_equal(call("PutChunks", &req.base,
	                     &moat__v1__put_chunks_reply__descriptor, NULL,
	                     NULL),
	    MOAT_INVALID_ARGUMENT);
	req.tenant = (char *)"acme";
	c.id.len = 31;
	assert_int_equal(call("PutChunks", &req.base,
	                     &moat__v1__put_chunks_reply__descriptor, NULL,
	                     NULL),
	    MOAT_INVALID_ARGUMENT);
	{
		Moat__V1__SnapChunk *many[300];

		for (int i = 0; i < 300; i++)
			many[i] = &c;
		req.n_chunks = 300;
		req.chunks = many;
		assert_int_equal(call("PutChunks", &req.base,
		                     &moat__v1__put_chunks_reply__descriptor,
		                     NULL, NULL),
		    MOAT_INVALID_ARGUMENT);
	}
	/* Commit: bad vmm, ids that do not fit the size. */
	creq.tenant = (char *)"acme";
	creq.vmm = (char *)"bochs";
	creq.vcpus = 1;
	creq.memory_mib = 1;
	creq.n_artifacts = 1;
	creq.artifacts = arts;
	art.name = (char *)"ram";
	art.size = 3 * CS;
	art.chunk_size = CS;
	art.chunk_ids.data = data;
	art.chunk_ids.len = 2 * 32;
	assert_int_equal(call("CommitManifest", &creq.base,
	                     &moat__v1__snapshot_info__descriptor, NULL, NULL),
	    MOAT_INVALID_ARGUMENT);
	creq.vmm = (char *)"qemu";
	assert_int_equal(call("CommitManifest", &creq.base,
	                     &moat__v1__snapshot_info__descriptor, NULL, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "need 3 ids"));
	free(msg);
	get_snapshot("acme", "snap-nope", false, &rv, NULL);
	assert_int_equal(rv, MOAT_INVALID_ARGUMENT);
	get_snapshot("acme", "snap-0123456789abcdef0123456789abcdef", false,
	    &rv, NULL);
	assert_int_equal(rv, MOAT_NOT_FOUND);
}

static void
test_list_paging(void **state)
{
	Moat__V1__ListSnapshotsRequest lreq =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	char *path = make_file("ram", 2, 41, 0), *ids[5], *token = NULL;
	size_t seen = 0;

	for (int i = 0; i < 5; i++) {
		Moat__V1__SnapshotInfo *s =
		    snapshot("acme", path, NULL, NULL, NULL);

		ids[i] = strdup(s->id);
		protobuf_c_message_free_unpacked(&s->base, NULL);
		nng_msleep(2); /* distinct creation times */
	}
	check_stats("acme", 5, 2, 0);
	lreq.tenant = (char *)"acme";
	lreq.page_size = 2;
	for (int page = 0; page < 3; page++) {
		Moat__V1__ListSnapshotsReply *lr;
		ProtobufCMessage *reply = NULL;

		lreq.page_token = token ? token : (char *)"";
		assert_int_equal(
		    call("ListSnapshots", &lreq.base,
		        &moat__v1__list_snapshots_reply__descriptor, &reply,
		        NULL),
		    MOAT_OK);
		lr = (Moat__V1__ListSnapshotsReply *)reply;
		assert_int_equal(lr->n_snapshots, page < 2 ? 2 : 1);
		for (size_t i = 0; i < lr->n_snapshots; i++)
			assert_string_equal(lr->snapshots[i]->id, ids[seen++]);
		free(token);
		token = strdup(lr->next_page_token);
		assert_int_equal(token[0] == '\0', page == 2);
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	assert_int_equal(seen, 5);
	for (int i = 0; i < 5; i++)
		free(ids[i]);
	free(token);
	free(path);
}

static void
test_sweep_abandoned(void **state)
{
	char *args[] = { (char *)"--pending-grace-s", (char *)"0",
		(char *)"--sweep-interval-s", (char *)"1", NULL };
	Moat__V1__SnapArtifact art;
	char *path = make_file("ram", 3, 51, 0), *keep, *msg = NULL;
	Moat__V1__SnapshotInfo *info;
	Moat__V1__SnapshotStatsReply *s = NULL;

	stop_snapd();
	start_snapd(args);
	keep = make_file("keep", 2, 52, 0);
	info = snapshot("acme", keep, NULL, NULL, NULL);
	assert_int_equal(moat_snap_push_file(cli, "acme", "ram", path, CS,
	                     &art, NULL, &msg),
	    MOAT_OK);
	moat_snap_artifact_clear(&art);
	/* Three pending chunks, never committed: swept within seconds; the
	 * committed snapshot's chunks stay. */
	for (int i = 0; i < 50; i++) {
		if (s != NULL)
			protobuf_c_message_free_unpacked(&s->base, NULL);
		s = stats("acme");
		if (s->pending_chunks == 0)
			break;
		nng_msleep(100);
	}
	assert_int_equal(s->pending_chunks, 0);
	assert_int_equal(s->chunks, 2);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	protobuf_c_message_free_unpacked(&info->base, NULL);
	free(path);
	free(keep);
}

static void
test_map_full(void **state)
{
	char *args[] = { (char *)"--map-size-mib", (char *)"4", NULL };
	Moat__V1__CommitManifestRequest req =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__ListSnapshotsRequest lreq =
	    MOAT__V1__LIST_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__SnapArtifact art = MOAT__V1__SNAP_ARTIFACT__INIT,
	                       *arts[1] = { &art };
	char *path = make_file("big", 100, 61, 0), *msg = NULL;
	Moat__V1__SnapArtifact pushed;
	ProtobufCMessage *reply = NULL;
	int rv;

	stop_snapd();
	start_snapd(args);
	/* 6.4 MB of chunks into a 4 MiB map: the put fails cleanly. */
	rv = moat_snap_push_file(cli, "acme", "ram", path, CS, &pushed, NULL,
	    &msg);
	assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(msg, "map size"));
	free(msg);
	moat_snap_artifact_clear(&pushed);
	/* A manifest too large for the map (4 GiB of zero chunks: a 2 MiB
	 * list) is refused whole: no catalog entry, no manifest. */
	req.tenant = (char *)"acme";
	req.vmm = (char *)"qemu";
	req.vcpus = 1;
	req.memory_mib = 256;
	req.n_artifacts = 1;
	req.artifacts = arts;
	art.name = (char *)"disk";
	art.chunk_size = 4096;
	art.size = (uint64_t)4096 * 65536 * 2;
	art.chunk_ids.len = 65536 * 2 * 32;
	art.chunk_ids.data = calloc(1, art.chunk_ids.len);
	assert_int_equal(call("CommitManifest", &req.base,
	                     &moat__v1__snapshot_info__descriptor, NULL, &msg),
	    MOAT_RESOURCE_EXHAUSTED);
	free(msg);
	free(art.chunk_ids.data);
	lreq.tenant = (char *)"acme";
	assert_int_equal(call("ListSnapshots", &lreq.base,
	                     &moat__v1__list_snapshots_reply__descriptor,
	                     &reply, NULL),
	    MOAT_OK);
	assert_int_equal(((Moat__V1__ListSnapshotsReply *)reply)->n_snapshots,
	    0);
	protobuf_c_message_free_unpacked(reply, NULL);
	/* The service goes on answering. */
	{
		Moat__V1__SnapshotStatsReply *s = stats("acme");

		assert_int_equal(s->snapshots, 0);
		protobuf_c_message_free_unpacked(&s->base, NULL);
	}
	free(path);
}

/* ---- metrics ---- */

static int
setup_metrics(void **state)
{
	char *const extra[] = { "--metrics", "127.0.0.1:0", NULL };

	snprintf(dir, sizeof(dir), "/tmp/moat-snapd-XXXXXX");
	assert_non_null(mkdtemp(dir));
	start_snapd(extra);
	return 0;
}

/* scrape: the answer to GET /metrics on the port snapd logged. */
static char *
scrape(void)
{
	static const char at[] = "metrics at http://127.0.0.1:";
	struct sockaddr_in sa = { .sin_family = AF_INET };
	char *path = moat_asprintf("%s/snapd.log", dir), *log = NULL;
	char *buf = calloc(1, 1 << 20);
	const char *req = "GET /metrics HTTP/1.1\r\n\r\n";
	size_t len = 0;
	ssize_t n;
	int fd;

	assert_int_equal(moat_read_file(path, 1 << 20, &log, &len), 0);
	assert_non_null(strstr(log, at));
	sa.sin_port = htons((uint16_t)atoi(strstr(log, at) + strlen(at)));
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	len = 0;
	while ((n = read(fd, buf + len, (1 << 20) - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	free(log);
	free(path);
	assert_non_null(strstr(buf, "HTTP/1.1 200 OK"));
	return buf;
}

/* sample: the value of the line `series VALUE` in `text`; -1 absent. */
static double
sample(const char *text, const char *series)
{
	char *want = moat_asprintf("\n%s ", series);
	const char *at = strstr(text, want);
	double v = at ? strtod(at + strlen(want), NULL) : -1;

	if (at == NULL)
		fprintf(stderr, "no sample %s in the scrape\n", series);
	free(want);
	return v;
}

/* Two snapshots of one file (the second stores nothing new) and a pull:
 * the chunk traffic, the calls' latency and the dedup ratio move. */
static void
test_metrics(void **state)
{
	char *path = make_file("ram", 6, 7, 1u << 2), *back, *text,
	     *msg = NULL;
	Moat__V1__SnapshotInfo *a, *b, *got;
	int rv;

	text = scrape();
	assert_true(
	    sample(text, "moat_snapd_chunk_bytes_received_total") == 0);
	assert_true(sample(text, "moat_snapd_dedup_ratio") == 0);
	free(text);
	a = snapshot("acme", path, NULL, NULL, NULL);
	b = snapshot("acme", path, a->id, NULL, NULL);
	got = get_snapshot("acme", a->id, true, &rv, NULL);
	assert_int_equal(rv, MOAT_OK);
	back = moat_asprintf("%s/ram.back", dir);
	assert_int_equal(moat_snap_pull_file(cli, "acme", a->id,
	                     got->artifacts[0], back, &msg),
	    MOAT_OK);

	text = scrape();
	/* 6 chunks, one a hole: 5 of CS bytes each, stored once. */
	assert_true(
	    sample(text, "moat_snapd_chunk_bytes_received_total") == 5.0 * CS);
	assert_true(
	    sample(text, "moat_snapd_chunk_bytes_stored_total") == 5.0 * CS);
	assert_true(sample(text,
	                "moat_snapd_chunks_received_total{outcome="
	                "\"stored\"}") == 5);
	assert_true(sample(text,
	                "moat_snapd_chunk_calls_total{method=\"PutChunks\","
	                "result=\"ok\"}") >= 1);
	assert_true(sample(text, "moat_snapd_put_chunks_seconds_count") >= 1);
	assert_true(sample(text, "moat_snapd_get_chunks_seconds_count") >= 1);
	assert_true(sample(text, "moat_snapd_chunks_sent_total") == 5);
	assert_true(
	    sample(text, "moat_snapd_chunk_bytes_sent_total") == 5.0 * CS);
	assert_true(sample(text, "moat_snapd_snapshots") == 2);
	assert_true(sample(text, "moat_snapd_stored_bytes") == 5.0 * CS);
	assert_true(sample(text, "moat_snapd_logical_bytes") ==
	    2 * (double)a->logical_bytes);
	assert_true(sample(text, "moat_snapd_dedup_ratio") ==
	    2 * (double)a->logical_bytes / (5.0 * CS));
	assert_true(sample(text, "moat_snapd_lmdb_used_bytes") > 0);
	free(text);
	protobuf_c_message_free_unpacked(&a->base, NULL);
	protobuf_c_message_free_unpacked(&b->base, NULL);
	protobuf_c_message_free_unpacked(&got->base, NULL);
	free(back);
	free(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_lifecycle, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_dedup_refcounts, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_zero_chunks, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_tenant_isolation, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_envelope_tenant, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_chunk, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_commit_missing, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_bad_input, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_list_paging, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_sweep_abandoned, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_map_full, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_metrics, setup_metrics,
		    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
