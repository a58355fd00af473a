/*
 * bench_snapd.c: measures moat-snapd's chunk store and writes JSON. It
 * starts its own moat-snapd in a temporary state directory and:
 *  - for chunk sizes of 4, 16, 64 and 256 KiB, snapshots a 256 MiB
 *    RAM-like file (a quarter holes, an eighth of the rest zero pages),
 *    then the same file with 32 scattered pages changed: chunking and
 *    hashing rate, put+commit rate, bytes stored for the second snapshot,
 *    manifest size (the figures behind MOAT_CHUNK_SIZE);
 *  - with MOAT_CHUNK_SIZE (and again at 64 KiB, for comparison), records
 *    20 "steps" (16 pages changed each) and compares the bytes stored,
 *    and the LMDB file's real size, against 20 full copies.
 * Not a test: it asserts nothing about time.
 * Usage: moat-bench-snapd [OUT.json] [SNAPD_BIN] [WORK_DIR]
 */
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moat/chunk.h"
#include "moat/rpc.h"
#include "moat/util.h"
#include "snap_client.h"

#define FILE_MIB 256u
#define FILE_SIZE ((uint64_t)FILE_MIB << 20)
#define PAGE 4096u
#define SWEEP_CHANGED_PAGES 32
#define STEPS 20
#define STEP_CHANGED_PAGES 16

static const uint32_t sweep_sizes[] = { 4u << 10, 16u << 10, 64u << 10,
	256u << 10 };

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
die(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench_snapd: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	exit(1);
}

static uint64_t rng = 88172645463325252ull;

static uint64_t
next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* make_ram_file: FILE_SIZE bytes: every 4th MiB a hole, every 8th page of
 * the rest zeros, the others pseudo-random. */
static void
make_ram_file(const char *path)
{
	uint8_t *page = malloc(PAGE), *zero = calloc(1, PAGE);
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);

	if (fd < 0 || page == NULL || zero == NULL ||
	    ftruncate(fd, (off_t)FILE_SIZE) != 0) {
		perror(path);
		exit(1);
	}
	for (uint64_t off = 0; off < FILE_SIZE; off += PAGE) {
		if ((off >> 20) % 4 == 3)
			continue;
		if ((off / PAGE) % 8 == 7) {
			if (pwrite(fd, zero, PAGE, (off_t)off) != PAGE)
				goto fail;
			continue;
		}
		for (size_t i = 0; i < PAGE; i += 8) {
			uint64_t v = next_rand();

			memcpy(page + i, &v, 8);
		}
		if (pwrite(fd, page, PAGE, (off_t)off) != PAGE)
			goto fail;
	}
	close(fd);
	free(page);
	free(zero);
	return;
fail:
	perror(path);
	exit(1);
}

/* change_pages: overwrites `n` pages at random places. */
static void
change_pages(const char *path, int n)
{
	uint8_t page[PAGE];
	int fd = open(path, O_WRONLY);

	if (fd < 0) {
		perror(path);
		exit(1);
	}
	for (int k = 0; k < n; k++) {
		uint64_t at = (next_rand() % (FILE_SIZE / PAGE)) * PAGE;

		for (size_t i = 0; i < PAGE; i += 8) {
			uint64_t v = next_rand();

			memcpy(page + i, &v, 8);
		}
		if (pwrite(fd, page, PAGE, (off_t)at) != PAGE) {
			perror(path);
			exit(1);
		}
	}
	close(fd);
}

static int
count_chunk(const struct moat_chunk *c, void *arg, char **errmsg)
{
	(*(uint64_t *)arg)++;
	return MOAT_OK;
}

struct snap_result {
	char *id;
	double seconds;
	uint64_t stored_bytes, sent_bytes, chunks, zero_chunks;
};

static void
snapshot(struct moat_rpc_client *c, const char *tenant, const char *path,
    uint32_t cs, const char *parent, struct snap_result *res)
{
	Moat__V1__CommitManifestRequest req =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__SnapArtifact art, *arts[1] = { &art };
	struct moat_snap_push_stats ps;
	Moat__V1__SnapshotInfo *info;
	ProtobufCMessage *reply = NULL;
	char *msg = NULL;
	double t0 = now_s();
	int rv;

	if ((rv = moat_snap_push_file(c, tenant, "ram", path, cs, &art, &ps,
	         &msg)) != MOAT_OK)
		die("push", rv, msg);
	req.tenant = (char *)tenant;
	req.vmm = (char *)"qemu";
	req.image_id = (char *)"bench";
	req.vcpus = 1;
	req.memory_mib = FILE_MIB;
	req.parent_id = (char *)(parent ? parent : "");
	req.n_artifacts = 1;
	req.artifacts = arts;
	if ((rv = moat_rpc_call(c, MOAT_SNAP_SERVICE, "CommitManifest",
	         &req.base, &moat__v1__snapshot_info__descriptor, &reply, NULL,
	         &msg)) != MOAT_OK)
		die("commit", rv, msg);
	res->seconds = now_s() - t0;
	info = (Moat__V1__SnapshotInfo *)reply;
	res->id = strdup(info->id);
	res->stored_bytes = info->stored_bytes;
	res->sent_bytes = ps.sent_bytes;
	res->chunks = ps.chunks;
	res->zero_chunks = ps.zero_chunks;
	protobuf_c_message_free_unpacked(reply, NULL);
	moat_snap_artifact_clear(&art);
}

static Moat__V1__SnapshotStatsReply *
stats(struct moat_rpc_client *c, const char *tenant)
{
	Moat__V1__SnapshotStatsRequest req =
	    MOAT__V1__SNAPSHOT_STATS_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *msg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	if ((rv = moat_rpc_call(c, MOAT_SNAP_SERVICE, "Stats", &req.base,
	         &moat__v1__snapshot_stats_reply__descriptor, &reply, NULL,
	         &msg)) != MOAT_OK)
		die("stats", rv, msg);
	return (Moat__V1__SnapshotStatsReply *)reply;
}

static json_t *
sweep_one(struct moat_rpc_client *c, const char *work, uint32_t cs)
{
	char *path = moat_asprintf("%s/ram-%u", work, cs), *msg = NULL;
	char tenant[32];
	struct snap_result a, b;
	uint64_t n = 0;
	double t0, hash_s;
	int rv;
	json_t *j;

	snprintf(tenant, sizeof(tenant), "sweep-%u", cs >> 10);
	rng = 88172645463325252ull; /* the same files for every size */
	make_ram_file(path);
	t0 = now_s();
	if ((rv = moat_chunk_file(path, cs, count_chunk, &n, NULL, &msg)) !=
	    MOAT_OK)
		die("chunk", rv, msg);
	hash_s = now_s() - t0;
	snapshot(c, tenant, path, cs, NULL, &a);
	change_pages(path, SWEEP_CHANGED_PAGES);
	snapshot(c, tenant, path, cs, a.id, &b);
	j = json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:I, s:I, s:f, s:I, "
	              "s:f, s:I, s:I}",
	    "chunk_kib", (int)(cs >> 10), "file_mib", (int)FILE_MIB,
	    "changed_pages", SWEEP_CHANGED_PAGES, "chunk_hash_mib_s",
	    (double)FILE_MIB / hash_s, "first_put_commit_s", a.seconds,
	    "first_put_commit_mib_s", (double)FILE_MIB / a.seconds,
	    "first_stored_bytes", (json_int_t)a.stored_bytes,
	    "second_stored_bytes", (json_int_t)b.stored_bytes,
	    "second_stored_fraction",
	    (double)b.stored_bytes / (double)FILE_SIZE, "manifest_bytes",
	    (json_int_t)(a.chunks * MOAT_CHUNK_ID_LEN), "second_put_commit_s",
	    b.seconds, "chunks", (json_int_t)a.chunks, "zero_chunks",
	    (json_int_t)a.zero_chunks);
	fprintf(stderr,
	    "chunk %3u KiB: hash %.0f MiB/s, first %.2fs "
	    "(%.0f MiB/s, %llu stored), second %.2fs %llu bytes stored, "
	    "manifest %llu bytes, %llu of %llu chunks zero\n",
	    cs >> 10, (double)FILE_MIB / hash_s, a.seconds,
	    (double)FILE_MIB / a.seconds, (unsigned long long)a.stored_bytes,
	    b.seconds, (unsigned long long)b.stored_bytes,
	    (unsigned long long)(a.chunks * 32),
	    (unsigned long long)a.zero_chunks, (unsigned long long)a.chunks);
	unlink(path);
	free(a.id);
	free(b.id);
	free(path);
	return j;
}

static int
cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

/* mdb_bytes: the disk the LMDB file really takes. */
static uint64_t
mdb_bytes(const char *state)
{
	char *path = moat_asprintf("%s/snapd/data.mdb", state);
	struct stat st;
	uint64_t n = 0;

	if (stat(path, &st) == 0)
		n = (uint64_t)st.st_blocks * 512;
	free(path);
	return n;
}

static json_t *
steps(struct moat_rpc_client *c, const char *work, const char *state,
    uint32_t cs)
{
	char *path = moat_asprintf("%s/ram-steps", work), *parent = NULL;
	Moat__V1__SnapshotStatsReply *s;
	double secs[STEPS], p50, p95, total_s = 0;
	uint64_t stored_after_first = 0, mdb_first = 0, mdb_all;
	json_t *j;

	rng = 1234567ull;
	make_ram_file(path);
	for (int i = 0; i < STEPS; i++) {
		struct snap_result r;

		if (i > 0)
			change_pages(path, STEP_CHANGED_PAGES);
		snapshot(c, "steps", path, cs, parent, &r);
		secs[i] = r.seconds;
		total_s += r.seconds;
		if (i > 0)
			stored_after_first += r.stored_bytes;
		else
			mdb_first = mdb_bytes(state);
		free(parent);
		parent = r.id;
	}
	s = stats(c, "steps");
	mdb_all = mdb_bytes(state);
	qsort(secs + 1, STEPS - 1, sizeof(double), cmp_double);
	p50 = secs[1 + (STEPS - 2) / 2];
	p95 = secs[1 + (size_t)((STEPS - 2) * 0.95 + 0.5)];
	j = json_pack("{s:i, s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:f, "
	              "s:f, s:f, s:I, s:I, s:f}",
	    "chunk_kib", (int)(cs >> 10), "file_mib", (int)FILE_MIB, "steps",
	    STEPS, "changed_pages_per_step", STEP_CHANGED_PAGES,
	    "stored_bytes", (json_int_t)s->stored_bytes, "full_copies_bytes",
	    (json_int_t)(STEPS * FILE_SIZE), "stored_vs_full_copies",
	    (double)s->stored_bytes / (double)(STEPS * FILE_SIZE),
	    "mean_step_stored_fraction_of_ram",
	    (double)stored_after_first / (STEPS - 1) / (double)FILE_SIZE,
	    "dedup_ratio", s->dedup_ratio, "step_put_commit_p50_s", p50,
	    "step_put_commit_p95_s", p95, "logical_mib_per_s",
	    (double)FILE_MIB * STEPS / total_s, "lmdb_file_bytes_after_first",
	    (json_int_t)mdb_first, "lmdb_file_bytes_after_all",
	    (json_int_t)mdb_all, "lmdb_file_vs_full_copies",
	    (double)mdb_all / (double)(STEPS * FILE_SIZE));
	fprintf(stderr,
	    "steps at %u KiB: %llu bytes stored for %d steps "
	    "vs %llu full copies (%.4f), LMDB file %llu after the first, "
	    "%llu after all; step p50 %.3fs p95 %.3fs\n",
	    cs >> 10, (unsigned long long)s->stored_bytes, STEPS,
	    (unsigned long long)(STEPS * FILE_SIZE),
	    (double)s->stored_bytes / (double)(STEPS * FILE_SIZE),
	    (unsigned long long)mdb_first, (unsigned long long)mdb_all, p50,
	    p95);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	free(parent);
	unlink(path);
	free(path);
	return j;
}

/* A moat-snapd of its own for each measurement, so that one phase's
 * freed pages (LMDB reuses them) never colour the next one's figures. */
struct snapd_proc {
	pid_t pid;
	char state[64];
	struct moat_rpc_client *c;
};

static void
snapd_start(struct snapd_proc *sp, const char *bin)
{
	Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *url, *msg = NULL;
	int rv = MOAT_UNAVAILABLE;

	snprintf(sp->state, sizeof(sp->state), "/tmp/moat-bench-snapd-XXXXXX");
	if (mkdtemp(sp->state) == NULL) {
		perror("mkdtemp");
		exit(1);
	}
	if ((sp->pid = fork()) == 0) {
		execl(bin, bin, "--state-dir", sp->state, "--map-size-mib",
		    "4096", (char *)NULL);
		_exit(127);
	}
	url = moat_asprintf("ipc://%s/snapd.sock", sp->state);
	if ((rv = moat_rpc_client_open(&sp->c, url, &msg)) != MOAT_OK)
		die("client", rv, msg);
	for (int i = 0; i < 100; i++) {
		struct moat_rpc_opts o = { .timeout_ms = 500 };

		free(msg);
		msg = NULL;
		if ((rv = moat_rpc_call(sp->c, MOAT_SNAP_SERVICE, "Health",
		         &hreq.base, &moat__v1__health_reply__descriptor,
		         &reply, &o, &msg)) == MOAT_OK)
			break;
		usleep(50000);
	}
	if (rv != MOAT_OK)
		die("moat-snapd never answered", rv, msg);
	protobuf_c_message_free_unpacked(reply, NULL);
	free(url);
}

static void
snapd_stop(struct snapd_proc *sp)
{
	int status;

	moat_rpc_client_close(sp->c);
	kill(sp->pid, SIGTERM);
	waitpid(sp->pid, &status, 0);
	moat_rm_rf(sp->state);
}

int
main(int argc, char **argv)
{
	const char *out =
	    argc > 1 ? argv[1] : "tests/bench/results/snapd.json";
	char *self = strdup(argv[0]), *snapd_bin;
	const char *work = argc > 3 ?
	    argv[3] :
	    (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	struct snapd_proc sp;
	json_t *root, *sweep, *st, *st64;

	snapd_bin = argc > 2 ? strdup(argv[2]) :
	                       moat_asprintf("%s/moat-snapd", dirname(self));
	sweep = json_array();
	for (size_t i = 0; i < sizeof(sweep_sizes) / sizeof(sweep_sizes[0]);
	     i++) {
		snapd_start(&sp, snapd_bin);
		json_array_append_new(sweep,
		    sweep_one(sp.c, work, sweep_sizes[i]));
		snapd_stop(&sp);
	}
	snapd_start(&sp, snapd_bin);
	st = steps(sp.c, work, sp.state, MOAT_CHUNK_SIZE);
	snapd_stop(&sp);
	/* The same steps at 64 KiB, for comparison. */
	snapd_start(&sp, snapd_bin);
	st64 = steps(sp.c, work, sp.state, 64u << 10);
	snapd_stop(&sp);
	root = json_pack("{s:s, s:i, s:o, s:o, s:o}", "benchmark", "snapd",
	    "chosen_chunk_kib", (int)(MOAT_CHUNK_SIZE >> 10),
	    "chunk_size_sweep", sweep, "steps", st, "steps_64kib", st64);
	if (json_dump_file(root, out, JSON_INDENT(2)) != 0)
		fprintf(stderr, "bench_snapd: cannot write %s\n", out);
	else
		fprintf(stderr, "bench_snapd: wrote %s\n", out);
	json_decref(root);
	free(snapd_bin);
	free(self);
	return 0;
}
