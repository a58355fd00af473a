/*
 * image_build.c: StartImageBuild and GetImageBuild (issue 17). A build
 * writes the request's spec (NAME.ini) and input files into a fresh
 * directory under <state>/image-builds, runs the build script ([vmd]
 * image-build-script) as `SCRIPT --spec DIR/NAME.ini --name NAME --out
 * <image-dir> --agent AGENT [--force]` in its own process group under
 * [vmd] image-build-timeout-s, and keeps the script's "images: [S.mmms]
 * text" lines as steps (the log's tail for errors). Done, the image is
 * pushed to moat-snapd (PushImage) so every node can pull it. One build
 * at a time per node; builds live in memory only, so a restarted vmd
 * answers NOT_FOUND for an earlier one. Not for: the build itself
 * (images/build.sh) or storing images (image_store.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "image.h"
#include "image_build.h"
#include "image_store.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "sync.h"

#define BUILDS_KEPT 8u /* finished builds GetImageBuild still answers */

struct build_step {
	char *text;
	uint64_t at_ms;
};

struct build {
	char id[32];
	char *name;
	char *dir; /* the spec and inputs; removed when it ends */
	Moat__V1__ImageBuildState state;
	struct build_step steps[VMD_BUILD_STEPS_MAX];
	uint32_t n_steps;
	char tail[VMD_BUILD_TAIL + 1];
	uint64_t t0, end_ms;
	Moat__V1__ImageInfo *image; /* when DONE */
	char *error;
	uint32_t code;
	pid_t pid; /* the script, leader of its process group; 0: none */
	char **argv;
	pthread_t thread;
	bool joinable;
};

struct vmd_image_builds {
	pthread_mutex_t mu; /* guards all below and every build's fields */
	pthread_cond_t cv;  /* a step, or a build ended */
	struct build *b[BUILDS_KEPT];
	size_t n;
	struct build *running;
	bool stopping;
	uint64_t seq;
};

bool
vmd_image_build_parse_step(const char *line, char *text, size_t cap,
    uint64_t *at_ms)
{
	unsigned long s, ms;
	int end = 0;

	if (strncmp(line, "images: [", 9) != 0 ||
	    sscanf(line + 9, "%lu.%3lus]%n", &s, &ms, &end) != 2 || end == 0)
		return false;
	/* "%3lu" took up to 3 digits: exactly 3 are what build.sh prints. */
	if (line[9 + end - 2] != 's' || end < 6)
		return false;
	line += 9 + end;
	while (*line == ' ')
		line++;
	if (*line == '\0')
		return false;
	snprintf(text, cap, "%s", line);
	*at_ms = (uint64_t)s * 1000u + ms;
	return true;
}

bool
vmd_image_input_name_ok(const char *name)
{
	size_t n = strlen(name);

	return n > 0 && n < 256 && name[0] != '.' &&
	    strchr(name, '/') == NULL && strcmp(name, "..") != 0;
}

int
vmd_image_builds_init(struct vmd *vmd)
{
	struct vmd_image_builds *bs = calloc(1, sizeof(*bs));
	char *root;

	if (bs == NULL)
		return MOAT_INTERNAL;
	pthread_mutex_init(&bs->mu, NULL);
	vmd_cond_init(&bs->cv);
	vmd->builds = bs;
	/* What a vmd that died mid-build left is no build any more. */
	if ((root = moat_asprintf("%s/image-builds", vmd->cfg.state_dir)) !=
	    NULL)
		(void)moat_rm_rf(root);
	free(root);
	return MOAT_OK;
}

static void
build_free(struct build *b)
{
	if (b == NULL)
		return;
	for (uint32_t i = 0; i < b->n_steps; i++)
		free(b->steps[i].text);
	if (b->image != NULL)
		moat__v1__image_info__free_unpacked(b->image, NULL);
	for (size_t i = 0; b->argv != NULL && b->argv[i] != NULL; i++)
		free(b->argv[i]);
	free(b->argv);
	free(b->name);
	free(b->dir);
	free(b->error);
	free(b);
}

void
vmd_image_builds_fini(struct vmd *vmd)
{
	struct vmd_image_builds *bs = vmd->builds;

	if (bs == NULL)
		return;
	pthread_mutex_lock(&bs->mu);
	bs->stopping = true;
	if (bs->running != NULL && bs->running->pid > 0)
		(void)kill(-bs->running->pid, SIGKILL);
	pthread_cond_broadcast(&bs->cv);
	pthread_mutex_unlock(&bs->mu);
	for (size_t i = 0; i < bs->n; i++) {
		if (bs->b[i]->joinable)
			pthread_join(bs->b[i]->thread, NULL);
		build_free(bs->b[i]);
	}
	pthread_mutex_destroy(&bs->mu);
	pthread_cond_destroy(&bs->cv);
	free(bs);
	vmd->builds = NULL;
}

/* The build script or agent: the configured one, else the first of
 * `rel` (relative to the directory of the running binary) that exists.
 * Heap; NULL when none does. */
static char *
find_tool(const char *configured, const char *const rel[], size_t n)
{
	char exe[PATH_MAX];
	ssize_t len;
	char *slash;

	if (configured[0] != '\0')
		return strdup(configured);
	if ((len = readlink("/proc/self/exe", exe, sizeof(exe) - 1)) <= 0)
		return NULL;
	exe[len] = '\0';
	if ((slash = strrchr(exe, '/')) == NULL)
		return NULL;
	*slash = '\0';
	for (size_t i = 0; i < n; i++) {
		char *p = moat_asprintf("%s/%s", exe, rel[i]);

		if (p != NULL && access(p, X_OK) == 0)
			return p;
		free(p);
	}
	return NULL;
}

/* Appends a line to the build's log tail (mu held). */
static void
tail_add(struct build *b, const char *line)
{
	size_t have = strlen(b->tail), add = strlen(line) + 1;

	if (add > VMD_BUILD_TAIL) {
		line += add - VMD_BUILD_TAIL;
		add = VMD_BUILD_TAIL;
	}
	if (have + add > VMD_BUILD_TAIL) {
		size_t drop = have + add - VMD_BUILD_TAIL;

		memmove(b->tail, b->tail + drop, have - drop + 1);
		have -= drop;
	}
	snprintf(b->tail + have, VMD_BUILD_TAIL + 1 - have, "%s\n", line);
}

/* One line of the script's output: a step (at most the cap kept) and
 * the tail. */
static void
build_line(struct vmd_image_builds *bs, struct build *b, const char *line)
{
	char text[512];
	uint64_t at;

	pthread_mutex_lock(&bs->mu);
	tail_add(b, line);
	if (vmd_image_build_parse_step(line, text, sizeof(text), &at) &&
	    b->n_steps < VMD_BUILD_STEPS_MAX &&
	    (b->steps[b->n_steps].text = strdup(text)) != NULL) {
		b->steps[b->n_steps++].at_ms = moat_rpc_now_ms() - b->t0;
		pthread_cond_broadcast(&bs->cv);
	}
	pthread_mutex_unlock(&bs->mu);
}

/* Forks the script in its own process group, stdout and stderr into a
 * pipe whose read end is returned (-1 on failure). */
static int
build_spawn(struct build *b)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) != 0)
		return -1;
	if ((pid = fork()) < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		/* Only async-signal-safe calls until exec. */
		int null = open("/dev/null", O_RDONLY);

		(void)setpgid(0, 0);
		if (null >= 0)
			(void)dup2(null, 0);
		(void)dup2(p[1], 1);
		(void)dup2(p[1], 2);
		(void)chdir(b->dir);
		execv(b->argv[0], b->argv);
		_exit(127);
	}
	(void)setpgid(pid, pid);
	close(p[1]);
	b->pid = pid;
	return p[0];
}

/* Reads the script's lines until it closes its output, the timeout or
 * vmd stops (then its process group is killed); returns the wait
 * status and whether it timed out. */
static int
build_read(struct vmd *vmd, struct build *b, int fd, bool *timed_out)
{
	struct vmd_image_builds *bs = vmd->builds;
	uint64_t deadline =
	    b->t0 + (uint64_t)vmd->cfg.image_build_timeout_s * 1000u;
	char buf[4096];
	size_t have = 0;
	int status = 0;

	*timed_out = false;
	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		bool stop;
		ssize_t n;

		pthread_mutex_lock(&bs->mu);
		stop = bs->stopping;
		pthread_mutex_unlock(&bs->mu);
		if (stop || moat_rpc_now_ms() >= deadline) {
			*timed_out = !stop;
			(void)kill(-b->pid, SIGKILL);
			break;
		}
		if (poll(&pfd, 1, 200) <= 0)
			continue;
		if ((n = read(fd, buf + have, sizeof(buf) - 1 - have)) <= 0)
			break;
		have += (size_t)n;
		buf[have] = '\0';
		for (char *nl; (nl = strchr(buf, '\n')) != NULL;) {
			*nl = '\0';
			build_line(bs, b, buf);
			have -= (size_t)(nl + 1 - buf);
			memmove(buf, nl + 1, have + 1);
		}
		if (have == sizeof(buf) - 1) { /* a line this long: cut */
			build_line(bs, b, buf);
			have = 0;
		}
	}
	if (have > 0) {
		buf[have] = '\0';
		build_line(bs, b, buf);
	}
	close(fd);
	while (waitpid(b->pid, &status, 0) < 0 && errno == EINTR)
		;
	/* What the script left running in its group goes with it. */
	(void)kill(-b->pid, SIGKILL);
	return status;
}

/* The last "images: error: ..." line of the tail, or "" (mu held). */
static const char *
tail_error(const struct build *b, char *out, size_t cap)
{
	const char *p = b->tail, *last = NULL;

	while ((p = strstr(p, "images: error: ")) != NULL)
		last = p++;
	out[0] = '\0';
	if (last != NULL) {
		size_t n = strcspn(last + 15, "\n");

		snprintf(out, cap, "%.*s", (int)n, last + 15);
	}
	return out;
}

/* The build ended: FAILED with why, or pushed and DONE. */
static void
build_finish(struct vmd *vmd, struct build *b, int status, bool timed_out)
{
	struct vmd_image_builds *bs = vmd->builds;
	struct moat_rpc_call call = { .service = "moat.v1.Vm",
		.method = "StartImageBuild" };
	Moat__V1__ImageInfo *info = malloc(sizeof(*info));
	char why[512];
	int rv = MOAT_INTERNAL;

	if (info != NULL)
		moat__v1__image_info__init(info);
	pthread_mutex_lock(&bs->mu);
	tail_error(b, why, sizeof(why));
	pthread_mutex_unlock(&bs->mu);
	if (status == 0 && !timed_out && info != NULL)
		rv = vmd->snapd != NULL ?
		    vmd_image_push(vmd, &call, b->name, info) :
		    vmd_image_info(vmd, &call, b->name, info);
	pthread_mutex_lock(&bs->mu);
	b->end_ms = moat_rpc_now_ms();
	if (rv == MOAT_OK) {
		b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_DONE;
		b->image = info;
		info = NULL;
	} else {
		b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_FAILED;
		if (timed_out) {
			b->code = MOAT_DEADLINE_EXCEEDED;
			b->error = moat_asprintf(
			    "image build %s of %s took longer than [vmd] "
			    "image-build-timeout-s = %u and was killed; log "
			    "tail:\n%s",
			    b->id, b->name, vmd->cfg.image_build_timeout_s,
			    b->tail);
		} else if (status != 0) {
			bool spec = WIFEXITED(status) &&
			    (WEXITSTATUS(status) == 2 || strstr(why, "spec"));

			b->code = spec ? MOAT_INVALID_ARGUMENT : MOAT_INTERNAL;
			b->error = moat_asprintf("image build %s of %s failed "
			                         "(%s %d)%s%s; log tail:\n%s",
			    b->id, b->name,
			    WIFEXITED(status) ? "exit status" : "signal",
			    WIFEXITED(status) ? WEXITSTATUS(status) :
			                        WTERMSIG(status),
			    why[0] ? ": " : "", why, b->tail);
		} else {
			b->code = (uint32_t)rv;
			b->error = moat_asprintf("image build %s of %s: built "
			                         "but not stored: %s",
			    b->id, b->name,
			    call.error_message ? call.error_message : "?");
		}
	}
	moat_info(0, "image build %s of %s: %s (%" PRIu64 " ms)", b->id,
	    b->name, b->error ? b->error : "done", b->end_ms - b->t0);
	bs->running = NULL;
	b->pid = 0;
	pthread_cond_broadcast(&bs->cv);
	pthread_mutex_unlock(&bs->mu);
	if (info != NULL)
		moat__v1__image_info__free_unpacked(info, NULL);
	free(call.error_message);
	(void)moat_rm_rf(b->dir);
}

struct build_arg {
	struct vmd *vmd;
	struct build *b;
	int fd;
};

static void *
build_main(void *arg)
{
	struct build_arg *a = arg;
	bool timed_out = false;
	int status = build_read(a->vmd, a->b, a->fd, &timed_out);

	build_finish(a->vmd, a->b, status, timed_out);
	free(a);
	return NULL;
}

/* Checks the request: name, spec and inputs within their caps. */
static int
build_check(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ImageBuildRequest *req)
{
	uint64_t total = 0;

	if (!vmd_image_name_ok(req->name))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "image name \"%s\" is not valid: use 1 to 64 letters, "
		    "digits, '-', '_' and '.', not starting with '.'",
		    req->name);
	if (req->spec[0] == '\0' || strlen(req->spec) > VMD_BUILD_SPEC_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "the spec is %s: give an INI spec of at most %u KiB",
		    req->spec[0] ? "too long" : "empty",
		    VMD_BUILD_SPEC_MAX >> 10);
	for (size_t i = 0; i < req->n_files; i++) {
		const char *n = req->files[i]->name;

		if (!vmd_image_input_name_ok(n))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "input file name \"%.80s\" is not valid: a plain "
			    "file name, no '/', not starting with '.'",
			    n);
		total += req->files[i]->data.len;
	}
	if (total > VMD_BUILD_INPUTS_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "the input files add up to %" PRIu64 " bytes: at most "
		    "%u MiB; put large files in the image another way",
		    total, VMD_BUILD_INPUTS_MAX >> 20);
	(void)vmd;
	return MOAT_OK;
}

/* The build's directory with the spec and inputs, and its argv. */
static int
build_prepare(struct vmd *vmd, struct moat_rpc_call *call, struct build *b,
    const Moat__V1__ImageBuildRequest *req)
{
	static const char *const scripts[] = {
		"../libexec/moat/images/build.sh", "../../images/build.sh"
	};
	static const char *const agents[] = { "../libexec/moat/moat-agent",
		"moat-agent" };
	char *script = find_tool(vmd->cfg.image_build_script, scripts, 2);
	char *agent = find_tool(vmd->cfg.image_build_agent, agents, 2);
	char *spec = NULL;
	int rv = MOAT_OK;

	if (script == NULL || agent == NULL) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "node %s cannot build images: no %s found next to "
		    "moat-vmd; set [vmd] %s",
		    vmd->cfg.node_id, script ? "moat-agent" : "build script",
		    script ? "image-build-agent" : "image-build-script");
		goto out;
	}
	b->dir =
	    moat_asprintf("%s/image-builds/%s", vmd->cfg.state_dir, b->id);
	spec = b->dir ? moat_asprintf("%s/%s.ini", b->dir, req->name) : NULL;
	if (spec == NULL || moat_mkdir_p(b->dir, 0700) != 0 ||
	    moat_write_file_atomic(spec, req->spec, strlen(req->spec), 0600) !=
	        0) {
		rv = moat_rpc_error(call, MOAT_INTERNAL,
		    "cannot write the spec into %s: %s", b->dir ? b->dir : "?",
		    strerror(errno));
		goto out;
	}
	for (size_t i = 0; i < req->n_files && rv == MOAT_OK; i++) {
		const Moat__V1__ImageInput *f = req->files[i];
		char *p = moat_asprintf("%s/%s", b->dir, f->name);

		if (p == NULL ||
		    moat_write_file_atomic(p, f->data.data, f->data.len,
		        f->mode ? (mode_t)(f->mode & 0777) : 0644) != 0)
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "cannot write input %s into %s", f->name, b->dir);
		free(p);
	}
	if (rv == MOAT_OK &&
	    (b->argv = calloc(12, sizeof(*b->argv))) != NULL) {
		const char *a[] = { script, "--spec", spec, "--name",
			req->name, "--out", vmd->cfg.image_dir, "--agent",
			agent, req->force ? "--force" : NULL };

		for (size_t i = 0; i < sizeof(a) / sizeof(a[0]) && a[i]; i++)
			if ((b->argv[i] = strdup(a[i])) == NULL)
				rv = MOAT_INTERNAL;
	}
	if (rv == MOAT_OK && b->argv == NULL)
		rv = MOAT_INTERNAL;
	if (rv == MOAT_INTERNAL && call->error_message == NULL)
		rv = moat_rpc_error(call, rv, "out of memory");
out:
	free(script);
	free(agent);
	free(spec);
	return rv;
}

/* Fills the reply from b (mu held), steps from `from`. */
static int
build_reply(struct vmd *vmd, const struct build *b, uint32_t from,
    Moat__V1__ImageBuild *r)
{
	uint32_t n = from < b->n_steps ? b->n_steps - from : 0;

	r->id = strdup(b->id);
	r->node_id = strdup(vmd->cfg.node_id);
	r->name = strdup(b->name);
	r->state = b->state;
	r->next_step = b->n_steps;
	r->code = b->code;
	r->error = strdup(b->error ? b->error : "");
	r->elapsed_ms = (b->end_ms ? b->end_ms : moat_rpc_now_ms()) - b->t0;
	if (!r->id || !r->node_id || !r->name || !r->error)
		return MOAT_INTERNAL;
	if (n > 0 && (r->steps = calloc(n, sizeof(*r->steps))) == NULL)
		return MOAT_INTERNAL;
	for (uint32_t i = 0; i < n; i++) {
		Moat__V1__ImageBuildStep *s = malloc(sizeof(*s));

		if (s == NULL)
			return MOAT_INTERNAL;
		moat__v1__image_build_step__init(s);
		r->steps[r->n_steps++] = s;
		s->at_ms = b->steps[from + i].at_ms;
		if ((s->text = strdup(b->steps[from + i].text)) == NULL)
			return MOAT_INTERNAL;
	}
	if (b->image != NULL) {
		/* A copy the reply owns: packed and unpacked. */
		size_t len = moat__v1__image_info__get_packed_size(b->image);
		uint8_t *buf = malloc(len ? len : 1);

		if (buf == NULL)
			return MOAT_INTERNAL;
		moat__v1__image_info__pack(b->image, buf);
		r->image = moat__v1__image_info__unpack(NULL, len, buf);
		free(buf);
		if (r->image == NULL)
			return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

/* Room in the kept builds (mu held): the oldest finished one goes. */
static bool
builds_make_room(struct vmd_image_builds *bs)
{
	if (bs->n < BUILDS_KEPT)
		return true;
	for (size_t i = 0; i < bs->n; i++) {
		if (bs->b[i] == bs->running)
			continue;
		if (bs->b[i]->joinable)
			pthread_join(bs->b[i]->thread, NULL);
		build_free(bs->b[i]);
		memmove(&bs->b[i], &bs->b[i + 1],
		    (bs->n - i - 1) * sizeof(bs->b[0]));
		bs->n--;
		return true;
	}
	return false;
}

int
vmd_image_build_start(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ImageBuildRequest *req, Moat__V1__ImageBuild *reply)
{
	struct vmd_image_builds *bs = vmd->builds;
	struct build_arg *arg = NULL;
	struct build *b;
	int rv, fd;

	if ((rv = build_check(vmd, call, req)) != MOAT_OK)
		return rv;
	if ((b = calloc(1, sizeof(*b))) == NULL ||
	    (b->name = strdup(req->name)) == NULL) {
		build_free(b);
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	}
	pthread_mutex_lock(&bs->mu);
	if (bs->running != NULL) {
		rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "node %s runs image build %s (of %s) already: one build "
		    "at a time per node; wait for it (GetImageBuild) or use "
		    "another node",
		    vmd->cfg.node_id, bs->running->id, bs->running->name);
		pthread_mutex_unlock(&bs->mu);
		build_free(b);
		return rv;
	}
	if (!builds_make_room(bs)) {
		pthread_mutex_unlock(&bs->mu);
		build_free(b);
		return moat_rpc_error(call, MOAT_INTERNAL, "no build slot");
	}
	snprintf(b->id, sizeof(b->id), "build-%" PRIu64 "-%" PRIu64,
	    moat_now_unix_ms(), ++bs->seq);
	b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_RUNNING;
	b->t0 = moat_rpc_now_ms();
	bs->running = b; /* claimed: a second start is refused */
	bs->b[bs->n++] = b;
	pthread_mutex_unlock(&bs->mu);
	rv = build_prepare(vmd, call, b, req);
	if (rv == MOAT_OK && (fd = build_spawn(b)) < 0)
		rv = moat_rpc_error(call, MOAT_INTERNAL,
		    "cannot run the build script %s: %s", b->argv[0],
		    strerror(errno));
	if (rv == MOAT_OK && (arg = malloc(sizeof(*arg))) != NULL) {
		*arg = (struct build_arg){ .vmd = vmd, .b = b, .fd = fd };
		b->joinable =
		    vmd_thread_create(&b->thread, build_main, arg) == 0;
	}
	if (rv == MOAT_OK && !b->joinable) {
		/* No thread to read it: the script must not run on. */
		(void)kill(-b->pid, SIGKILL);
		(void)waitpid(b->pid, NULL, 0);
		close(fd);
		free(arg);
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	}
	pthread_mutex_lock(&bs->mu);
	if (rv != MOAT_OK) {
		bs->running = NULL;
		b->state = MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_FAILED;
		b->code = (uint32_t)rv;
		b->error =
		    strdup(call->error_message ? call->error_message : "?");
		b->end_ms = moat_rpc_now_ms();
		if (b->dir != NULL)
			(void)moat_rm_rf(b->dir);
	} else {
		moat_info(call->request_id,
		    "image build %s of %s started on node %s (%s)", b->id,
		    b->name, vmd->cfg.node_id, b->argv[0]);
		if (build_reply(vmd, b, 0, reply) != MOAT_OK)
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
	}
	pthread_mutex_unlock(&bs->mu);
	return rv;
}

int
vmd_image_build_get(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ImageBuildRef *ref, Moat__V1__ImageBuild *reply)
{
	struct vmd_image_builds *bs = vmd->builds;
	uint32_t wait = ref->wait_ms < VMD_BUILD_WAIT_MAX_MS ?
	    ref->wait_ms :
	    VMD_BUILD_WAIT_MAX_MS;
	uint64_t deadline = moat_rpc_now_ms() + wait;
	struct build *b = NULL;
	int rv = MOAT_OK;

	pthread_mutex_lock(&bs->mu);
	for (size_t i = 0; i < bs->n && b == NULL; i++)
		if (strcmp(bs->b[i]->id, ref->build_id) == 0)
			b = bs->b[i];
	if (b == NULL) {
		pthread_mutex_unlock(&bs->mu);
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "image build \"%s\" is not known on node %s: the node "
		    "restarted since it began (builds do not survive a vmd "
		    "restart) or it is older than the last %u builds; start "
		    "the build again",
		    ref->build_id, vmd->cfg.node_id, BUILDS_KEPT);
	}
	/* Long poll: a new step or the end, or the wait is over. */
	while (wait > 0 && !bs->stopping && b->n_steps <= ref->from_step &&
	    b->state == MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_RUNNING &&
	    vmd_cond_wait_until(&bs->cv, &bs->mu, deadline) == 0)
		;
	if (build_reply(vmd, b, ref->from_step, reply) != MOAT_OK)
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	pthread_mutex_unlock(&bs->mu);
	return rv;
}
