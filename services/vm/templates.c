/*
 * templates.c: the node's templates, ready snapshots of freshly booted
 * images, so that creating a sandbox is a restore, not a boot. One per
 * shape (image and its build stamp, vcpus, memory, scratch size,
 * accelerator, VMM driver), each a snapshot directory
 * <state>/templates/tpl-<16 hex> (the layout of snapshot.c, meta.pb with
 * template=true), found by reading the metas, kept across restarts while
 * the image's stamp matches and removed when it does not. The first
 * create of a shape with no template boots cold and, after that boot,
 * starts a builder thread here: it boots a VM that no client can see,
 * waits for its agent, snapshots it, moves the RAM copy from tmpfs into
 * the template's directory (so removing a state directory removes its
 * templates whole) and destroys the VM. One build per shape at a time.
 * Once a template's RAM is in memory (made, or first used since vmd
 * started), one thread keeps [vmd] template-spares complete copies of it
 * in /dev/shm, which a clone renames into its own RAM file instead of
 * copying on its critical path; they are removed with vmd, with their
 * template, at the next start and by `moat-vmd purge`.
 * Templates are never listed, pushed or counted as a tenant's
 * snapshots. Not for: restoring (sandbox.c) or taking the snapshot
 * (snapshot.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "extents.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "ramdir.h"
#include "exec.h"
#include "image.h"
#include "node.h"
#include "sync.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "snapshot.h"
#include "snapshot_meta.h"
#include "templates.h"
#include "verify.h"

#define TPL_BUILD_TIMEOUT_MS 600000u

/* One build: its shape (owned copies) and thread. */
struct tpl_build {
	struct tpl_build *next;
	struct vmd *vmd;
	char *image;
	uint32_t vcpus;
	uint32_t memory_mib;
	uint64_t scratch_mib;
	char accel[8];
	pthread_t thread;
	bool done;          /* the thread is about to return */
	struct sandbox *vm; /* the builder VM while it boots/runs */
};

/* A template's RAM held in memory by vmd: an unlinked tmpfs file or a
 * memfd, so restores copy from memory, not from the page cache of the
 * state directory's file system, and nothing outlives vmd. Kept until
 * vmd stops (also once the template is dropped: a restore may be about
 * to open it by fd number). */
struct tpl_ram {
	struct tpl_ram *next;
	char id[32];
	int fd;
	/* Its spares: complete copies in the RAM dir (<ram-dir>/moat-spare-
	 * <id>-<seq>.ram, made as .tmp and renamed when whole), that a
	 * clone renames into its own RAM file instead of copying. */
	char **spares; /* ready paths, heap; n_spares of them */
	uint32_t n_spares;
	uint32_t making; /* copies in progress (0 or 1) */
	uint64_t seq;
	bool dropped; /* removed: make no more spares */
};

struct vmd_templates {
	pthread_mutex_t mu; /* guards everything below */
	struct tpl_build *builds;
	struct tpl_ram *rams;
	bool stopping;
	uint32_t spares_want;    /* [vmd] template-spares */
	pthread_cond_t spare_cv; /* a pool to refill, or stopping */
	pthread_t spare_thread;
	bool spare_thread_on;
};

#define SPARE_PREFIX "moat-spare-"

static char *
tpl_root(const struct vmd *vmd)
{
	return moat_asprintf("%s/templates", vmd->cfg.state_dir);
}

static bool
tpl_name_ok(const char *name)
{
	size_t n = strlen(name);

	return n > 4 && strncmp(name, "tpl-", 4) == 0 &&
	    strchr(name, '.') == NULL;
}

int
vmd_templates_init(struct vmd *vmd)
{
	struct vmd_templates *t = calloc(1, sizeof(*t));
	char *root = tpl_root(vmd);
	struct dirent *de;
	DIR *d;

	if (t == NULL || root == NULL) {
		free(t);
		free(root);
		return MOAT_INTERNAL;
	}
	pthread_mutex_init(&t->mu, NULL);
	vmd_cond_init(&t->spare_cv);
	/* With reflinks a clone's RAM is a clone of the template's file:
	 * nothing to prepare. */
	/* No spares where a clone needs no copy: reflinks, or a private
	 * mapping of the template's RAM (ram-sharing = private). */
	t->spares_want = vmd_ram_dir_reflinks() || vmd_ram_private() ?
	    0 :
	    vmd->cfg.template_spares;
	vmd->templates = t;
	/* A build cut short by a killed vmd left <id>.tmp: not a template.
	 * Spares a killed vmd left in /dev/shm are removed: the pools are
	 * made anew from the templates' RAM once used. */
	if ((d = opendir(root)) != NULL) {
		while ((de = readdir(d)) != NULL) {
			size_t n = strlen(de->d_name);
			char *dir;

			if (tpl_name_ok(de->d_name))
				vmd_template_spares_purge(de->d_name);

			if (n < 5 || strcmp(de->d_name + n - 4, ".tmp") != 0 ||
			    (dir = moat_asprintf("%s/%s", root, de->d_name)) ==
			        NULL)
				continue;
			vmd_snapshot_remove_dir(dir);
			free(dir);
		}
		closedir(d);
	}
	free(root);
	return MOAT_OK;
}

void
vmd_template_spares_purge(const char *id)
{
	char *prefix = moat_asprintf(SPARE_PREFIX "%s-", id);
	struct dirent *de;
	DIR *d;

	if (prefix == NULL || strchr(id, '/') != NULL ||
	    (d = opendir(vmd_ram_dir())) == NULL) {
		free(prefix);
		return;
	}
	while ((de = readdir(d)) != NULL) {
		if (strncmp(de->d_name, prefix, strlen(prefix)) == 0)
			(void)unlinkat(dirfd(d), de->d_name, 0);
	}
	closedir(d);
	free(prefix);
}

/* The refill thread: makes one spare at a time, for the first template
 * whose pool is short, until vmd stops. */
static void *
tpl_spare_main(void *arg)
{
	struct vmd_templates *t = arg;

	pthread_mutex_lock(&t->mu);
	while (!t->stopping) {
		struct tpl_ram *r;
		char *tmp = NULL, *path = NULL, *src = NULL;
		char **grown;
		int in = -1, out = -1, err = 0;
		struct stat st;

		for (r = t->rams; r != NULL; r = r->next)
			if (!r->dropped &&
			    r->n_spares + r->making < t->spares_want)
				break;
		if (r == NULL) {
			pthread_cond_wait(&t->spare_cv, &t->mu);
			continue;
		}
		r->making++;
		path = moat_asprintf("%s/" SPARE_PREFIX "%s-%llu.ram",
		    vmd_ram_dir(), r->id, (unsigned long long)r->seq);
		tmp = moat_asprintf("%s/" SPARE_PREFIX "%s-%llu.tmp",
		    vmd_ram_dir(), r->id, (unsigned long long)r->seq);
		src = moat_asprintf("/proc/self/fd/%d", r->fd);
		r->seq++;
		pthread_mutex_unlock(&t->mu);
		/* A description of its own: the copy seeks. r->fd stays open
		 * until fini, which joins this thread first. */
		if (path == NULL || tmp == NULL || src == NULL)
			err = ENOMEM;
		else if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0 ||
		    fstat(in, &st) != 0 ||
		    (out = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
		         0600)) < 0 ||
		    ftruncate(out, st.st_size) != 0)
			err = errno;
		else
			err = vmd_copy_extents(in, out, NULL);
		if (in >= 0)
			close(in);
		if (out >= 0 && close(out) != 0 && err == 0)
			err = errno;
		pthread_mutex_lock(&t->mu);
		r->making--;
		grown = err == 0 ?
		    realloc(r->spares,
		        (r->n_spares + 1) * sizeof(*r->spares)) :
		    NULL;
		if (grown != NULL)
			r->spares = grown;
		if (err == 0 && grown != NULL && !r->dropped && !t->stopping &&
		    rename(tmp, path) == 0) {
			r->spares[r->n_spares++] = path;
			path = NULL;
		} else {
			if (tmp != NULL)
				(void)unlink(tmp);
			if (err != 0) {
				moat_warn(0,
				    "template %s: cannot make a spare "
				    "RAM copy in %s (%s); clones copy the RAM "
				    "themselves",
				    r->id, vmd_ram_dir(), strerror(err));
				/* Do not retry in a loop (a full tmpfs):
				 * the next take wakes this thread again. */
				if (!t->stopping)
					pthread_cond_wait(&t->spare_cv,
					    &t->mu);
			}
		}
		free(tmp);
		free(path);
		free(src);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

/* Wakes (starting it the first time) the refill thread. Under t->mu. */
static void
tpl_spares_kick(struct vmd_templates *t)
{
	if (t->spares_want == 0 || t->stopping)
		return;
	if (!t->spare_thread_on) {
		if (vmd_thread_create(&t->spare_thread, tpl_spare_main, t) !=
		    0) {
			moat_warn(0,
			    "cannot start the template spares thread; "
			    "clones copy their RAM");
			t->spares_want = 0;
			return;
		}
		t->spare_thread_on = true;
	}
	pthread_cond_broadcast(&t->spare_cv);
}

char *
vmd_template_take_spare(struct vmd *vmd, const char *id)
{
	struct vmd_templates *t = vmd->templates;
	struct tpl_ram *r;
	char *path = NULL;

	if (t == NULL)
		return NULL;
	pthread_mutex_lock(&t->mu);
	for (r = t->rams; r != NULL; r = r->next)
		if (strcmp(r->id, id) == 0 && !r->dropped) {
			if (r->n_spares > 0)
				path = r->spares[--r->n_spares];
			tpl_spares_kick(t);
			break;
		}
	pthread_mutex_unlock(&t->mu);
	return path;
}

/* Template `id` is removed: its pool is emptied and not refilled. */
static void
tpl_spares_forget(struct vmd *vmd, const char *id)
{
	struct vmd_templates *t = vmd->templates;
	struct tpl_ram *r;

	if (t != NULL) {
		pthread_mutex_lock(&t->mu);
		for (r = t->rams; r != NULL; r = r->next)
			if (strcmp(r->id, id) == 0) {
				r->dropped = true;
				while (r->n_spares > 0)
					free(r->spares[--r->n_spares]);
			}
		pthread_mutex_unlock(&t->mu);
	}
	vmd_template_spares_purge(id);
}

static void
tpl_build_free(struct tpl_build *b)
{
	free(b->image);
	free(b);
}

void
vmd_templates_fini(struct vmd *vmd)
{
	struct vmd_templates *t = vmd->templates;
	struct tpl_build *b, *next;

	if (t == NULL)
		return;
	pthread_mutex_lock(&t->mu);
	t->stopping = true;
	for (b = t->builds; b != NULL; b = b->next)
		if (b->vm != NULL)
			vmd_sandbox_abort(b->vm);
	b = t->builds;
	t->builds = NULL;
	pthread_cond_broadcast(&t->spare_cv);
	pthread_mutex_unlock(&t->mu);
	for (; b != NULL; b = next) {
		next = b->next;
		pthread_join(b->thread, NULL);
		tpl_build_free(b);
	}
	if (t->spare_thread_on)
		pthread_join(t->spare_thread, NULL);
	/* The spares go with vmd (also those taken by a clone that did not
	 * start: nothing else would remove them). */
	while (t->rams != NULL) {
		struct tpl_ram *r = t->rams;

		t->rams = r->next;
		close(r->fd);
		while (r->n_spares > 0)
			free(r->spares[--r->n_spares]);
		free(r->spares);
		vmd_template_spares_purge(r->id);
		free(r);
	}
	pthread_cond_destroy(&t->spare_cv);
	pthread_mutex_destroy(&t->mu);
	free(t);
	vmd->templates = NULL;
}

static bool
tpl_matches(const Moat__V1__LocalSnapshot *m, const struct vmd *vmd,
    const struct vmd_shape *shape, const char *accel)
{
	return m->template_ && strcmp(m->image, shape->image) == 0 &&
	    m->vcpus == shape->vcpus && m->memory_mib == shape->memory_mib &&
	    m->scratch_mib == shape->scratch_mib &&
	    strcmp(m->accel, accel) == 0 &&
	    strcmp(m->vmm, vmd->vmm->name) == 0;
}

void
vmd_templates_drop_image(struct vmd *vmd, const char *image)
{
	char *root = tpl_root(vmd);
	struct dirent *de;
	DIR *d = root ? opendir(root) : NULL;

	while (d != NULL && (de = readdir(d)) != NULL) {
		Moat__V1__LocalSnapshot *m = NULL;
		char *dir;

		if (!tpl_name_ok(de->d_name) ||
		    (dir = moat_asprintf("%s/%s", root, de->d_name)) == NULL)
			continue;
		if (vmd_snapshot_read_meta(dir, &m) == 0 &&
		    strcmp(m->image, image) == 0) {
			moat_info(0, "template %s removed with its image %s",
			    m->snapshot_id, image);
			vmd_snapshot_remove_dir(dir);
			tpl_spares_forget(vmd, de->d_name);
		}
		moat__v1__local_snapshot__free_unpacked(m, NULL);
		free(dir);
	}
	if (d != NULL)
		closedir(d);
	free(root);
}

int
vmd_template_find(struct vmd *vmd, const struct vmd_shape *shape,
    const char *accel, char **dir_out, char **id_out)
{
	char *root = tpl_root(vmd);
	char *stamp = vmd_image_stamp(vmd, shape->image);
	char *why = NULL;
	struct dirent *de;
	DIR *d = root && stamp ? opendir(root) : NULL;
	int rv = MOAT_NOT_FOUND;

	*dir_out = NULL;
	*id_out = NULL;
	while (
	    d != NULL && rv == MOAT_NOT_FOUND && (de = readdir(d)) != NULL) {
		Moat__V1__LocalSnapshot *m = NULL;
		char *dir, *ram;
		struct stat st;

		if (!tpl_name_ok(de->d_name) ||
		    (dir = moat_asprintf("%s/%s", root, de->d_name)) == NULL)
			continue;
		if (vmd_snapshot_read_meta(dir, &m) != 0 ||
		    !tpl_matches(m, vmd, shape, accel)) {
			moat__v1__local_snapshot__free_unpacked(m, NULL);
			free(dir);
			continue;
		}
		ram = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, dir);
		if (strcmp(m->image_stamp, stamp) != 0) {
			moat_info(0,
			    "template %s: image \"%s\" was rebuilt "
			    "since; removed (the next create makes a new "
			    "one)",
			    m->snapshot_id, m->image);
			vmd_snapshot_remove_dir(dir);
			tpl_spares_forget(vmd, de->d_name);
		} else if (ram == NULL || stat(ram, &st) != 0) {
			/* Its RAM copy on tmpfs did not survive a reboot. */
			moat_info(0,
			    "template %s: its RAM file is gone; "
			    "removed",
			    m->snapshot_id);
			vmd_snapshot_remove_dir(dir);
			tpl_spares_forget(vmd, de->d_name);
		} else if (vmd_snapshot_verify(vmd, NULL, m, dir, &why) !=
		    MOAT_OK) {
			/* Never cloned: a template that does not verify is
			 * removed and the next create makes a new one. */
			moat_error(0, "template %s refused: %s; removed",
			    m->snapshot_id, why ? why : "?");
			vmd_snapshot_remove_dir(dir);
			tpl_spares_forget(vmd, de->d_name);
		} else if ((*id_out = strdup(m->snapshot_id)) != NULL) {
			*dir_out = dir;
			dir = NULL;
			rv = MOAT_OK;
		}
		free(ram);
		free(dir);
		free(why);
		why = NULL;
		moat__v1__local_snapshot__free_unpacked(m, NULL);
	}
	if (d != NULL)
		closedir(d);
	free(root);
	free(stamp);
	return rv;
}

/* Registers `fd` as template `id`'s RAM (taking it), unless one is
 * registered already (then fd is closed). Returns the registered fd. */
static int
tpl_ram_add(struct vmd_templates *t, const char *id, int fd)
{
	struct tpl_ram *r;
	int have = -1;

	pthread_mutex_lock(&t->mu);
	for (r = t->rams; r != NULL; r = r->next)
		if (strcmp(r->id, id) == 0)
			have = r->fd;
	if (have < 0 && !t->stopping && (r = calloc(1, sizeof(*r))) != NULL) {
		snprintf(r->id, sizeof(r->id), "%s", id);
		r->fd = fd;
		r->next = t->rams;
		t->rams = r;
		have = fd;
		fd = -1;
		tpl_spares_kick(t);
	}
	pthread_mutex_unlock(&t->mu);
	if (fd >= 0)
		close(fd);
	return have;
}

/* A file for a template's RAM where clones are made: with reflinks an
 * unlinked file in the RAM dir (a clone's RAM file reflinks it; the
 * template's own <dir>/ram is on the state dir's filesystem, which
 * cannot reflink into the RAM dir, so each clone would copy it), else
 * memory (memfd). -1 on failure. */
static int
tpl_ram_open(const char *id, bool reflinks)
{
	int fd;

	if (reflinks &&
	    (fd = open(vmd_ram_dir(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) >=
	        0)
		return fd;
	return memfd_create(id, MFD_CLOEXEC);
}

char *
vmd_template_ram(struct vmd *vmd, const char *id, const char *dir)
{
	struct vmd_templates *t = vmd->templates;
	bool reflinks = vmd_ram_dir_reflinks();
	struct tpl_ram *r;
	char *path;
	int fd = -1, in;
	struct stat st;

	/* template-reflink off (the default): with reflinks, clones copy
	 * <dir>/ram from the state dir while their VMM starts, which costs
	 * create -> first exec less than the copy-on-write faults of a
	 * reflinked RAM (issue 18's create bench). With ram-sharing =
	 * private clones map <dir>/ram itself. */
	if (t == NULL || (reflinks && !vmd->cfg.template_reflink) ||
	    vmd_ram_private())
		return NULL;
	pthread_mutex_lock(&t->mu);
	for (r = t->rams; r != NULL; r = r->next)
		if (strcmp(r->id, id) == 0)
			fd = r->fd;
	pthread_mutex_unlock(&t->mu);
	if (fd < 0) {
		/* First use since vmd started: load it into memory (or the
		 * RAM dir's filesystem) once. */
		char *file = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, dir);
		int mem = -1;

		in = file ? open(file, O_RDONLY | O_CLOEXEC) : -1;
		free(file);
		if (in < 0)
			return NULL;
		if (fstat(in, &st) != 0 ||
		    (mem = tpl_ram_open(id, reflinks)) < 0 ||
		    ftruncate(mem, st.st_size) != 0 ||
		    vmd_copy_extents(in, mem, NULL) != 0) {
			if (mem >= 0)
				close(mem);
			close(in);
			return NULL;
		}
		close(in);
		fd = tpl_ram_add(t, id, mem);
		if (fd < 0)
			return NULL;
	}
	path = moat_asprintf("/proc/self/fd/%d", fd);
	return path;
}

void
vmd_template_drop(struct vmd *vmd, const char *dir)
{
	const char *id = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;

	moat_warn(0, "template %s removed: it did not restore", dir);
	vmd_snapshot_remove_dir(dir);
	tpl_spares_forget(vmd, id);
}

static char *
tpl_new_id(void)
{
	uint8_t r[8];

	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		return NULL;
	return moat_asprintf("tpl-%02x%02x%02x%02x%02x%02x%02x%02x", r[0],
	    r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
}

/* Moves the template's RAM copy from tmpfs into its directory (still
 * unpublished: vmd_snapshot_make calls this before the seal and the
 * rename that make the template visible, so a clone made as soon as it
 * appears maps or copies the final file, and verifies what it maps), so
 * that removing a state directory removes its templates whole and they
 * survive a reboot. The tmpfs copy stays, unlinked, as the RAM that
 * restores copy from while this vmd runs. On failure the copy stays on
 * tmpfs, which works as well. */
static void
tpl_keep_ram(struct vmd *vmd, const char *id, const char *dir)
{
	struct vmd_templates *t = vmd->templates;
	char *link = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, dir);
	char *copy = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM ".file", dir);
	char target[4096];
	ssize_t n = -1;
	int err;

	if (link != NULL && copy != NULL)
		n = readlink(link, target, sizeof(target) - 1);
	if (n > 0) {
		target[n] = '\0';
		if ((err = vmd_copy_sparse(target, copy, NULL)) != 0)
			moat_warn(0, "template %s: RAM stays in %s (%s)", dir,
			    target, strerror(err));
		else if (rename(copy, link) != 0)
			(void)unlink(copy);
		else {
			/* The tmpfs copy stays, unlinked, as the RAM that
			 * restores copy from while this vmd runs. */
			int fd = open(target, O_RDONLY | O_CLOEXEC);

			(void)unlink(target);
			/* Unless clones map <dir>/ram (ram-sharing
			 * private): then the copy would only hold memory. */
			if (fd >= 0 && t != NULL && !vmd_ram_private())
				(void)tpl_ram_add(t, id, fd);
			else if (fd >= 0)
				close(fd);
		}
	}
	free(link);
	free(copy);
}

/* Runs the programs a first exec needs (the shell, python) once in the
 * builder VM, so their files are in the template's page cache and no
 * clone reads them from its disk under TCG again. Best effort. */
static void
tpl_warm(struct sandbox *sb, struct moat_rpc_call *call)
{
	static char *argv[] = { "/bin/sh", "-c",
		"true; command -v python3 "
		">/dev/null 2>&1 && python3 -c pass; true" };
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *res = malloc(sizeof(*res));

	if (res == NULL)
		return;
	moat__v1__exec_result__init(res);
	req.sandbox_id = sb->id.str;
	req.argv = argv;
	req.n_argv = 3;
	req.timeout_ms = 60000;
	if (vmd_exec_run_on(sb, call, &req, res) != MOAT_OK)
		moat_info(0,
		    "template: warming the VM failed (%s); the "
		    "template is made anyway",
		    call->error_message ? call->error_message : "?");
	free(call->error_message);
	call->error_message = NULL;
	moat__v1__exec_result__free_unpacked(res, NULL);
}

static void *
tpl_build_main(void *arg)
{
	struct tpl_build *b = arg;
	struct vmd *vmd = b->vmd;
	struct vmd_templates *t = vmd->templates;
	struct moat_rpc_call call = { .service = "moat.v1.Vm",
		.method = "(template build)" };
	struct vmd_shape shape = { .image = b->image,
		.vcpus = b->vcpus,
		.memory_mib = b->memory_mib,
		.scratch_mib = b->scratch_mib };
	struct sandbox *sb = NULL, *slot;
	char *id = NULL, *root = NULL, *dir = NULL;
	uint64_t t0 = moat_rpc_now_ms();
	int rv;

	call.deadline_ms = t0 + TPL_BUILD_TIMEOUT_MS;
	/* A template holds the image's kernel and files in its RAM: made
	 * only of an image that still matches its manifest. */
	if ((rv = vmd_image_check(vmd, &call, b->image)) != MOAT_OK)
		goto out;
	rv =
	    vmd_sandbox_create_hidden(vmd, &call, &shape, &t->mu, &b->vm, &sb);
	pthread_mutex_lock(&t->mu);
	slot = b->vm;
	b->vm = NULL;
	if (rv == MOAT_OK && t->stopping)
		rv = moat_rpc_error(&call, MOAT_ABORTED, "vmd is stopping");
	pthread_mutex_unlock(&t->mu);
	vmd_sandbox_put(slot);
	if (rv != MOAT_OK)
		goto out;
	tpl_warm(sb, &call);
	id = tpl_new_id();
	root = tpl_root(vmd);
	dir = id && root ? moat_asprintf("%s/%s", root, id) : NULL;
	if (dir == NULL) {
		rv = moat_rpc_error(&call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	rv = vmd_snapshot_make(vmd, &call, sb, id, dir, tpl_keep_ram, NULL,
	    NULL);
out:
	vmd_sandbox_destroy_hidden(sb);
	if (rv == MOAT_OK)
		moat_info(0,
		    "template %s of image %s (%u vcpus, %u MiB, "
		    "scratch %llu MiB, %s) made in %llu ms",
		    id, b->image, b->vcpus, b->memory_mib,
		    (unsigned long long)b->scratch_mib, b->accel,
		    (unsigned long long)(moat_rpc_now_ms() - t0));
	else
		moat_warn(0,
		    "template of image %s (%u vcpus, %u MiB, scratch "
		    "%llu MiB) not made: %s; creates of this shape boot cold "
		    "and the next one tries again",
		    b->image, b->vcpus, b->memory_mib,
		    (unsigned long long)b->scratch_mib,
		    call.error_message ? call.error_message : "?");
	free(call.error_message);
	free(id);
	free(root);
	free(dir);
	pthread_mutex_lock(&t->mu);
	b->done = true;
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

void
vmd_template_build_async(struct vmd *vmd, const struct vmd_shape *shape,
    const char *accel)
{
	struct vmd_templates *t = vmd->templates;
	struct tpl_build *b, **pp, *finished = NULL;
	char *dir = NULL, *id = NULL;

	if (t == NULL)
		return;
	if (vmd_template_find(vmd, shape, accel, &dir, &id) == MOAT_OK) {
		free(dir);
		free(id);
		return;
	}
	pthread_mutex_lock(&t->mu);
	/* Finished builds are joined here, outside the lock below. */
	for (pp = &t->builds; *pp != NULL;) {
		b = *pp;
		if (b->done) {
			*pp = b->next;
			b->next = finished;
			finished = b;
		} else {
			pp = &b->next;
		}
	}
	for (b = t->builds; b != NULL; b = b->next)
		if (strcmp(b->image, shape->image) == 0 &&
		    b->vcpus == shape->vcpus &&
		    b->memory_mib == shape->memory_mib &&
		    b->scratch_mib == shape->scratch_mib &&
		    strcmp(b->accel, accel) == 0)
			break;
	if (b == NULL && !t->stopping && (b = calloc(1, sizeof(*b))) != NULL) {
		b->vmd = vmd;
		b->image = strdup(shape->image);
		b->vcpus = shape->vcpus;
		b->memory_mib = shape->memory_mib;
		b->scratch_mib = shape->scratch_mib;
		snprintf(b->accel, sizeof(b->accel), "%s", accel);
		if (b->image == NULL ||
		    vmd_thread_create(&b->thread, tpl_build_main, b) != 0) {
			moat_warn(0,
			    "cannot start the template build of image "
			    "%s",
			    shape->image);
			tpl_build_free(b);
		} else {
			b->next = t->builds;
			t->builds = b;
			moat_info(0,
			    "template of image %s (%u vcpus, %u MiB, "
			    "scratch %llu MiB, %s): building",
			    shape->image, shape->vcpus, shape->memory_mib,
			    (unsigned long long)shape->scratch_mib, accel);
		}
	}
	pthread_mutex_unlock(&t->mu);
	while (finished != NULL) {
		b = finished;
		finished = b->next;
		pthread_join(b->thread, NULL);
		tpl_build_free(b);
	}
}
