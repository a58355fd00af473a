/*
 * bench_images.c: pulling images from moat-snapd (issue 17). Starts a
 * moat-snapd and two moat-vmds of its own: node a holds "default" and
 * "variant" (default with a few 4 KiB blocks of rootfs.ext4 changed and
 * a manifest saying so) and pushes both; node b starts empty. Then,
 * RUNS times each: node b pulls default (every chunk from snapd: time
 * and bytes fetched vs the image's size) and removes it; with default
 * held, node b pulls variant (bytes fetched / size: only what differs
 * should cross the wire). Bytes come from vmd's pull log line. Writes
 * the summary JSON. Run as
 *   build/bin/moat-bench-images IMAGE_DIR tests/bench/results/images.json [RUNS]
 * Not for: pass/fail (numbers only) or builds.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "bench_stats.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "vm.pb-c.h"

#define CALL_MS 600000u
#define RUNS_MAX 50

static char root[] = "/tmp/moat-bench-images-XXXXXX";

struct proc {
	pid_t pid;
	char log[512];
	struct moat_rpc_client *c;
};

static void
die(const char *what)
{
	fprintf(stderr, "moat-bench-images: %s\n", what);
	exit(1);
}

/* Starts argv with stdout and stderr into p->log; waits until `url`
 * answers Health of `service`. */
static void
start(struct proc *p, char *const argv[], const char *url, const char *service)
{
	Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;
	struct moat_rpc_opts o = { .timeout_ms = 500 };
	char *err = NULL;

	if ((p->pid = fork()) == 0) {
		int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		dup2(fd, 1);
		dup2(fd, 2);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	if (moat_rpc_client_open(&p->c, url, &err) != 0)
		die(err);
	for (int i = 0; i < 600; i++) {
		ProtobufCMessage *r = NULL;

		free(err);
		err = NULL;
		if (moat_rpc_call(p->c, service, "Health", &req.base,
		        &moat__v1__health_reply__descriptor, &r, &o,
		        &err) == MOAT_OK) {
			protobuf_c_message_free_unpacked(r, NULL);
			return;
		}
		usleep(100 * 1000);
	}
	die(argv[0]); /* never answered */
}

static void
stop(struct proc *p)
{
	if (p->pid <= 0)
		return;
	moat_rpc_client_close(p->c);
	kill(p->pid, SIGTERM);
	waitpid(p->pid, NULL, 0);
	p->pid = 0;
}

static int
image_call(struct proc *p, const char *method, const char *name)
{
	Moat__V1__ImageRef ref = MOAT__V1__IMAGE_REF__INIT;
	struct moat_rpc_opts o = { .timeout_ms = CALL_MS };
	ProtobufCMessage *r = NULL;
	char *err = NULL;
	int rv;

	ref.name = (char *)name;
	rv = moat_rpc_call(p->c, "moat.v1.Vm", method, &ref.base,
	    strcmp(method, "RemoveImage") == 0 ?
	        &moat__v1__remove_image_reply__descriptor :
	        &moat__v1__image_info__descriptor,
	    &r, &o, &err);
	if (rv != MOAT_OK)
		die(err ? err : method);
	protobuf_c_message_free_unpacked(r, NULL);
	return rv;
}

/* The last pull line of p's log: bytes fetched and the image's size. */
static void
pull_bytes(const struct proc *p, const char *name, double *fetched,
    double *size)
{
	char *log = NULL, *needle = moat_asprintf("image %s pulled", name);
	char *q, *last = NULL;
	uint64_t f = 0, l = 0, s = 0;
	size_t len;

	if (moat_read_file(p->log, 1 << 26, &log, &len) != 0)
		die(p->log);
	for (q = log; (q = strstr(q, needle)) != NULL; q++)
		last = q;
	if (last == NULL || (q = strstr(last, "fetched ")) == NULL ||
	    sscanf(q,
	        "fetched %" SCNu64 " B, read locally %" SCNu64
	        " B, image %" SCNu64 " B",
	        &f, &l, &s) != 3)
		die(name); /* no pull line */
	*fetched = (double)f;
	*size = (double)s;
	free(log);
	free(needle);
}

static void
sh(const char *cmd)
{
	if (system(cmd) != 0)
		die(cmd);
}

/* <dir>/variant: default's files as hard links but rootfs.ext4, a copy
 * with 8 blocks of 4 KiB changed, and a manifest saying so. */
static void
make_variant(const char *src, const char *dir)
{
	char *cmd, *rootfs = moat_asprintf("%s/variant/rootfs.ext4", dir);
	char *man = moat_asprintf("%s/variant/manifest.json", dir), hex[65];
	unsigned char md[32], buf[1 << 16];
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	json_t *m, *files;
	struct stat st;
	ssize_t n;
	int fd;

	cmd = moat_asprintf("mkdir -p %s/variant && for f in vmlinuz vmlinux "
	                    "initrd.img; do [ -e %s/$f ] && ln %s/$f "
	                    "%s/variant/$f; done; cp --sparse=always "
	                    "%s/rootfs.ext4 %s",
	    dir, src, src, dir, src, rootfs);
	sh(cmd);
	free(cmd);
	if ((fd = open(rootfs, O_RDWR)) < 0 || fstat(fd, &st) != 0)
		die(rootfs);
	for (int i = 1; i <= 8; i++) {
		memset(buf, 0xa0 + i, 4096);
		if (pwrite(fd, buf, 4096,
		        (off_t)((st.st_size / 9 * i) & ~(off_t)4095)) != 4096)
			die(rootfs);
	}
	EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
	lseek(fd, 0, SEEK_SET);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		EVP_DigestUpdate(ctx, buf, (size_t)n);
	EVP_DigestFinal_ex(ctx, md, NULL);
	EVP_MD_CTX_free(ctx);
	close(fd);
	for (int i = 0; i < 32; i++)
		sprintf(hex + 2 * i, "%02x", md[i]);
	cmd = moat_asprintf("%s/manifest.json", src);
	if ((m = json_load_file(cmd, 0, NULL)) == NULL)
		die(cmd);
	free(cmd);
	files = json_object_get(m, "files");
	json_object_set_new(json_object_get(files, "rootfs.ext4"), "sha256",
	    json_string(hex));
	json_object_set_new(m, "name", json_string("variant"));
	if (json_dump_file(m, man, JSON_COMPACT) != 0)
		die(man);
	json_decref(m);
	free(rootfs);
	free(man);
}

static char snapd_url[600];

static void
start_vmd(struct proc *p, const char *name, const char *imgdir)
{
	char *state = moat_asprintf("%s/%s", root, name);
	char *url = moat_asprintf("ipc://%s/vmd.sock", state);
	char *argv[] = { MOAT_VMD_BIN, "--state-dir", state, "--accel", "tcg",
		"--driver", "qemu", "--image-dir", (char *)imgdir, "--listen",
		url, "--node-id", (char *)name, "--templates", "off",
		"--snapd", snapd_url, NULL };

	snprintf(p->log, sizeof(p->log), "%s.log", state);
	start(p, argv, url, "moat.v1.Vm");
	free(url);
	free(state);
}

/* Pulls `name` on b runs times (removing it after each): the times and
 * the fetched/size ratios. */
static json_t *
measure(struct proc *b, const char *name, int runs, double *ratio_p50)
{
	double ms[RUNS_MAX], ratio[RUNS_MAX], fetched = 0, size = 0;
	json_t *o = json_object();

	for (int i = 0; i < runs; i++) {
		double t0 = bench_now_ms();

		image_call(b, "PullImage", name);
		ms[i] = bench_now_ms() - t0;
		pull_bytes(b, name, &fetched, &size);
		ratio[i] = fetched / size;
		fprintf(stderr, "pull %s: %.0f ms, fetched %.0f of %.0f B\n",
		    name, ms[i], fetched, size);
		image_call(b, "RemoveImage", name);
	}
	json_object_set_new(o, "pull", bench_summary(ms, (size_t)runs));
	json_object_set_new(o, "image_bytes", json_real(size));
	json_object_set_new(o, "fetched_bytes_last", json_real(fetched));
	/* Ratios, not times: plain fields (bench_summary says _ms). */
	*ratio_p50 = bench_percentile(ratio, (size_t)runs, 0.5);
	json_object_set_new(o, "fetched_over_size_p50", json_real(*ratio_p50));
	json_object_set_new(o, "fetched_over_size_p95",
	    json_real(bench_percentile(ratio, (size_t)runs, 0.95)));
	return o;
}

int
main(int argc, char **argv)
{
	struct proc snapd = { 0 }, a = { 0 }, b = { 0 };
	char *src, *img_a, *img_b, *sdir, *cmd;
	int runs = argc > 3 ? atoi(argv[3]) : 5;
	double r_default, r_variant;
	json_t *out = json_object();

	if (argc < 3 || runs < 1 || runs > RUNS_MAX) {
		fprintf(stderr,
		    "usage: moat-bench-images IMAGE_DIR OUT.json "
		    "[RUNS 1-%d]\n",
		    RUNS_MAX);
		return 2;
	}
	src = moat_asprintf("%s/default", argv[1]);
	if (mkdtemp(root) == NULL)
		die("mkdtemp");
	img_a = moat_asprintf("%s/img-a", root);
	img_b = moat_asprintf("%s/img-b", root);
	sdir = moat_asprintf("%s/snapd", root);
	snprintf(snapd_url, sizeof(snapd_url), "ipc://%s/snapd.sock", sdir);
	cmd = moat_asprintf("mkdir -p %s/default %s %s && for f in vmlinuz "
	                    "vmlinux initrd.img rootfs.ext4 manifest.json; do "
	                    "[ -e %s/$f ] && ln %s/$f %s/default/$f; done; "
	                    "true",
	    img_a, img_b, sdir, src, src, img_a);
	sh(cmd);
	free(cmd);
	make_variant(src, img_a);
	{
		char *sargv[] = { "", "--state-dir", sdir, "--listen",
			snapd_url, NULL };
		char *bin = strdup(MOAT_VMD_BIN);

		*strrchr(bin, '/') = '\0';
		sargv[0] = moat_asprintf("%s/moat-snapd", bin);
		snprintf(snapd.log, sizeof(snapd.log), "%s.log", sdir);
		start(&snapd, sargv, snapd_url, "moat.v1.Snapshot");
		free(bin);
	}
	start_vmd(&a, "node-a", img_a);
	start_vmd(&b, "node-b", img_b);
	image_call(&a, "PushImage", "default");
	image_call(&a, "PushImage", "variant");
	/* Node b holds nothing: every chunk from snapd. */
	json_object_set_new(out, "default_on_empty_node",
	    measure(&b, "default", runs, &r_default));
	/* Node b holds default: only what variant changed. */
	image_call(&b, "PullImage", "default");
	json_object_set_new(out, "variant_on_node_with_default",
	    measure(&b, "variant", runs, &r_variant));
	json_object_set_new(out, "benchmark", json_string("images"));
	json_object_set_new(out, "chunk_kib", json_integer(64));
	json_object_set_new(out, "runs", json_integer(runs));
	json_object_set_new(out, "variant_change",
	    json_string("8 blocks of 4 KiB of rootfs.ext4"));
	stop(&b);
	stop(&a);
	stop(&snapd);
	if (json_dump_file(out, argv[2], JSON_INDENT(2)) != 0)
		die(argv[2]);
	printf("fetched/size p50: default on an empty node %.3f (zero "
	       "chunks are holes, never sent); variant with default held "
	       "%.5f\n",
	    r_default, r_variant);
	json_decref(out);
	if (getenv("MOAT_KEEP_BENCH_DIR") == NULL)
		(void)moat_rm_rf(root);
	return 0;
}
