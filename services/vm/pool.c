/*
 * pool.c: the warm VMM pool (pool.h): per template a list of VMMs made
 * by the driver's restore exactly as a clone's would be (the spec comes
 * from sandbox_boot.c's vmd_boot_spec_make for a sandbox of the
 * template's shape), one refill thread, and the register of pooled VMMs
 * in <state>/pool that lets the next vmd kill what a dead one left.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "extents.h"
#include "metrics.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "pool.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "snapshot.h"
#include "snapshot_meta.h"
#include "sync.h"
#include "templates.h"
#include "verify.h"
#include "vmm.h"

/* A template whose pooled starts failed this many times in a row gets
 * no more (logged): a broken template must not spin the host. */
#define POOL_MAX_FAILURES 3
/* How often the refill thread looks for templates that are gone. */
#define POOL_SWEEP_MS 5000
/* A refill waits this long after the last create that used the pool
 * ended, so it does not compete for the host's CPUs with the new
 * sandbox's first steps (its first exec comes right after). */
#define POOL_SETTLE_MS 500
/* Snapshots with a pool at a time (the most recently restored): each
 * costs vmm-pool copies of its RAM, and an agent takes many. */
#define POOL_MAX_SNAPSHOTS 4

struct pool_slot {
	struct pool_slot *next;
	char id[24];
	char *dir;
	struct moat_vmm vm;
};

/* One template's pool. Kept until vmd_pool_fini (the refill thread may
 * be making a slot for it when it is forgotten). */
struct pool_tpl {
	struct pool_tpl *next;
	bool snapshot;      /* a snapshot's (restores), else a template's */
	uint64_t wanted_ms; /* last vmd_pool_want: the oldest snapshot's
	                       pool goes first */
	char *tid, *tdir, *image;
	uint32_t vcpus, memory_mib;
	uint64_t scratch_mib;
	char accel[8];
	struct pool_slot *slots;
	uint32_t n, making, failures;
	bool dropped;
};

struct vmd_pool {
	struct vmd *vmd;
	pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cv;  /* a pool to refill, or stopping */
	struct pool_tpl *tpls;
	uint32_t want;
	uint64_t quiet_at; /* no refill before (monotonic ms) */
	bool stopping;
	bool thread_on;
	pthread_t thread;
};

bool
vmd_pool_reg_name(const char *name, char id[20])
{
	size_t n = strlen(name);

	if (n != 23 || strncmp(name, "sb-", 3) != 0 ||
	    strcmp(name + 19, ".pid") != 0)
		return false;
	for (size_t i = 3; i < 19; i++)
		if (!((name[i] >= '0' && name[i] <= '9') ||
		        (name[i] >= 'a' && name[i] <= 'f')))
			return false;
	memcpy(id, name, 19);
	id[19] = '\0';
	return true;
}

static char *
reg_path(const struct vmd *vmd, const char *id)
{
	return moat_asprintf("%s/" VMD_POOL_DIR "/%s.pid", vmd->cfg.state_dir,
	    id);
}

/* Writes the register entry of pooled VMM `id`: its pid (0 while it
 * starts). */
static int
reg_write(const struct vmd *vmd, const char *id, pid_t pid)
{
	char *dir = moat_asprintf("%s/" VMD_POOL_DIR, vmd->cfg.state_dir);
	char *path = reg_path(vmd, id);
	char text[24];
	int n = snprintf(text, sizeof(text), "%d\n", (int)pid);
	int err = ENOMEM;

	if (dir != NULL && path != NULL &&
	    (err = moat_mkdir_p(dir, 0700)) == 0)
		err = moat_write_file_atomic(path, text, (size_t)n, 0600);
	free(dir);
	free(path);
	return err;
}

static void
reg_remove(const struct vmd *vmd, const char *id)
{
	char *path = reg_path(vmd, id);

	if (path != NULL)
		(void)unlink(path);
	free(path);
}

int
vmd_pool_reap_leftovers(struct vmd *vmd)
{
	char *root = moat_asprintf("%s/" VMD_POOL_DIR, vmd->cfg.state_dir);
	struct dirent *de;
	int killed = 0;
	DIR *d;

	if (root == NULL || (d = opendir(root)) == NULL) {
		free(root);
		return 0;
	}
	while ((de = readdir(d)) != NULL) {
		char id[20];
		char *dir, *entry;
		bool was_running;

		if (de->d_name[0] == '.')
			continue;
		entry = moat_asprintf("%s/%s", root, de->d_name);
		if (!vmd_pool_reg_name(de->d_name, id)) {
			/* A half-written entry (.tmp): its VMM, if any, has
			 * no directory vmd would adopt either. */
			if (entry != NULL)
				(void)unlink(entry);
			free(entry);
			continue;
		}
		dir = moat_asprintf("%s/vms/%s", vmd->cfg.state_dir, id);
		/* QEMU's options name files in its directory: reap_orphan
		 * kills the pid of its pidfile only when that is so. */
		was_running = dir != NULL && vmd->vmm->reap_orphan(dir, id);
		if (dir != NULL)
			(void)moat_rm_rf(dir);
		if (entry != NULL)
			(void)unlink(entry);
		moat_info(0,
		    "pool: removed pooled VMM %s left by an earlier vmd%s", id,
		    was_running ? " (it was still running and was killed)" :
		                  "");
		killed += was_running;
		free(dir);
		free(entry);
	}
	closedir(d);
	free(root);
	return killed;
}

int
vmd_pool_init(struct vmd *vmd)
{
	struct vmd_pool *p;

	vmd->pool = NULL;
	if (vmd->cfg.vmm_pool == 0 || vmd->vmm->restore == NULL ||
	    vmd->vmm->resume == NULL)
		return MOAT_OK;
	if ((p = calloc(1, sizeof(*p))) == NULL)
		return MOAT_INTERNAL;
	p->vmd = vmd;
	p->want = vmd->cfg.vmm_pool;
	pthread_mutex_init(&p->mu, NULL);
	vmd_cond_init(&p->cv);
	vmd->pool = p;
	moat_info(0,
	    "pool: %u pre-started VMM%s per template or snapshot in use",
	    p->want, p->want == 1 ? "" : "s");
	return MOAT_OK;
}

/* Kills a pooled VMM `vm` that no sandbox ran (its directory `dir`,
 * sandbox id `id`), reaps it and removes its files and register entry.
 * vm is released. */
static void
pool_discard(struct vmd *vmd, const char *id, const char *dir,
    struct moat_vmm *vm)
{
	if (vm->pid > 0) {
		int st;

		vmd->vmm->stop(vm, true);
		while (waitpid(vm->pid, &st, 0) < 0 && errno == EINTR)
			;
	}
	vmd->vmm->release(vm);
	if (dir != NULL)
		(void)moat_rm_rf(dir);
	reg_remove(vmd, id);
}

static void
slots_discard(struct vmd *vmd, struct pool_slot *s)
{
	while (s != NULL) {
		struct pool_slot *next = s->next;

		pool_discard(vmd, s->id, s->dir, &s->vm);
		free(s->dir);
		free(s);
		s = next;
	}
}

/* What one refill makes: a copy of its source's fields. */
struct pool_job {
	bool snapshot;
	char *tid, *tdir, *image;
	uint32_t vcpus, memory_mib;
	uint64_t scratch_mib;
	char accel[8];
};

/* Makes one pooled VMM for job: a sandbox of the source's shape gives
 * the id, the directory and the spec, as for a clone; the driver's
 * restore starts it. Returns 0 with *out or a status with *why. */
static int
pool_make(struct vmd *vmd, const struct pool_job *job, struct pool_slot **out,
    char **why)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	struct vmd_boot_files files = { 0 };
	struct moat_vmm_spec spec = { 0 };
	struct pool_slot *slot = NULL;
	struct sandbox *sb;
	char *src = NULL, *err = NULL;
	bool made_dir = false;
	int rv = MOAT_INTERNAL, e;

	*out = NULL;
	*why = NULL;
	req.vcpus = job->vcpus;
	req.memory_mib = job->memory_mib;
	req.scratch_mib = job->scratch_mib;
	req.image = job->image;
	req.tenant = "pool";
	if ((sb = vmd_sandbox_alloc(vmd, &req, job->image, NULL)) == NULL ||
	    (slot = calloc(1, sizeof(*slot))) == NULL ||
	    (slot->dir = strdup(sb->dir)) == NULL ||
	    (src = moat_asprintf("%s/" MOAT_VMM_SNAP_SCRATCH, job->tdir)) ==
	        NULL) {
		*why = strdup("out of memory");
		goto fail;
	}
	snprintf(slot->id, sizeof(slot->id), "%s", sb->id.str);
	if (job->snapshot) {
		/* As a restore does, before any VMM reads its files. */
		Moat__V1__LocalSnapshot *meta = NULL;

		if ((e = vmd_snapshot_read_meta(job->tdir, &meta)) != 0) {
			*why = moat_asprintf("cannot read snapshot %s: %s",
			    job->tid, strerror(e));
			goto fail;
		}
		rv = vmd_snapshot_verify(vmd, NULL, meta, job->tdir, why);
		moat__v1__local_snapshot__free_unpacked(meta, NULL);
		if (rv != MOAT_OK)
			goto fail;
		rv = MOAT_INTERNAL;
	} else {
		sb->ram_source = vmd_template_ram(vmd, job->tid, job->tdir);
	}
	/* Registered before anything runs: a vmd killed from here on
	 * leaves nothing the next one does not find. */
	if ((e = reg_write(vmd, slot->id, 0)) != 0 ||
	    (e = moat_mkdir_p(slot->dir, 0700)) != 0) {
		*why = moat_asprintf("cannot register or create %s: %s",
		    slot->dir, strerror(e));
		rv = moat_status_from_errno(e);
		goto fail;
	}
	made_dir = true;
	if (!vmd_boot_spec_make(sb, job->accel, job->tdir, &files, &spec)) {
		*why = strdup("out of memory");
		goto fail;
	}
	/* The clone's disk, as bring_up_disk makes it for a restore. */
	if ((e = vmd_copy_sparse(src, files.scratch, NULL)) != 0) {
		*why = moat_asprintf("cannot copy the scratch disk "
		                     "%s: %s",
		    src, strerror(e));
		rv = moat_status_from_errno(e);
		goto fail;
	}
	if ((rv = vmd->vmm->restore(vmd->vmm_binary, &spec, job->tdir,
	         &slot->vm, &err)) != MOAT_OK) {
		*why = err ? err : strdup("the VMM did not start");
		goto fail;
	}
	(void)reg_write(vmd, slot->id, slot->vm.pid);
	vmd_boot_files_free(&files);
	vmd_sandbox_free(sb);
	free(src);
	*out = slot;
	return MOAT_OK;
fail:
	vmd_boot_files_free(&files);
	if (slot != NULL) {
		if (made_dir)
			(void)moat_rm_rf(slot->dir);
		if (slot->id[0] != '\0')
			reg_remove(vmd, slot->id);
		free(slot->dir);
		free(slot);
	}
	vmd_sandbox_free(sb);
	free(src);
	return rv;
}

static void
job_free(struct pool_job *j)
{
	free(j->tid);
	free(j->tdir);
	free(j->image);
	memset(j, 0, sizeof(*j));
}

/* The template that needs a VMM most (the emptiest), or NULL. p->mu
 * held. */
static struct pool_tpl *
pool_next(struct vmd_pool *p)
{
	struct pool_tpl *best = NULL;

	for (struct pool_tpl *t = p->tpls; t != NULL; t = t->next) {
		if (t->dropped || t->failures >= POOL_MAX_FAILURES ||
		    t->n + t->making >= p->want)
			continue;
		if (best == NULL || t->n + t->making < best->n + best->making)
			best = t;
	}
	return best;
}

/* The pools of templates whose directory is gone (dropped, or their
 * image removed) are emptied: their slots, for the caller to discard
 * unlocked. p->mu held. */
static struct pool_slot *
pool_sweep(struct vmd_pool *p)
{
	struct pool_slot *gone = NULL;

	for (struct pool_tpl *t = p->tpls; t != NULL; t = t->next) {
		if (t->dropped || access(t->tdir, F_OK) == 0)
			continue;
		t->dropped = true;
		while (t->slots != NULL) {
			struct pool_slot *s = t->slots;

			t->slots = s->next;
			s->next = gone;
			gone = s;
		}
		t->n = 0;
	}
	return gone;
}

static void *
pool_main(void *arg)
{
	struct vmd_pool *p = arg;
	struct vmd *vmd = p->vmd;

	pthread_mutex_lock(&p->mu);
	while (!p->stopping) {
		struct pool_tpl *t = pool_next(p);
		struct pool_slot *slot = NULL;
		struct pool_job job = { 0 };
		char *why = NULL;
		int rv;

		if (t != NULL && moat_rpc_now_ms() < p->quiet_at) {
			(void)vmd_cond_wait_until(&p->cv, &p->mu, p->quiet_at);
			continue;
		}
		if (t == NULL) {
			struct pool_slot *gone;

			(void)vmd_cond_wait_until(&p->cv, &p->mu,
			    moat_rpc_now_ms() + POOL_SWEEP_MS);
			if ((gone = pool_sweep(p)) != NULL) {
				pthread_mutex_unlock(&p->mu);
				slots_discard(vmd, gone);
				pthread_mutex_lock(&p->mu);
			}
			continue;
		}
		job.snapshot = t->snapshot;
		job.tid = strdup(t->tid);
		job.tdir = strdup(t->tdir);
		job.image = strdup(t->image);
		job.vcpus = t->vcpus;
		job.memory_mib = t->memory_mib;
		job.scratch_mib = t->scratch_mib;
		memcpy(job.accel, t->accel, sizeof(job.accel));
		t->making++;
		pthread_mutex_unlock(&p->mu);
		if (job.tid && job.tdir && job.image)
			rv = pool_make(vmd, &job, &slot, &why);
		else
			rv = MOAT_INTERNAL;
		pthread_mutex_lock(&p->mu);
		t->making--;
		if (rv == MOAT_OK && (t->dropped || p->stopping)) {
			pthread_mutex_unlock(&p->mu);
			slots_discard(vmd, slot);
			pthread_mutex_lock(&p->mu);
		} else if (rv == MOAT_OK) {
			slot->next = t->slots;
			t->slots = slot;
			t->n++;
			t->failures = 0;
			moat_debug(0,
			    "pool: template %s: VMM %s ready (pid %d)", t->tid,
			    slot->id, (int)slot->vm.pid);
		} else {
			t->failures++;
			moat_warn(0,
			    "pool: %s %s: cannot pre-start a VMM "
			    "(%u of %u tries): %s; %s start their own%s",
			    t->snapshot ? "snapshot" : "template",
			    job.tid ? job.tid : "?", t->failures,
			    POOL_MAX_FAILURES, why ? why : "out of memory",
			    t->snapshot ? "restores" : "creates",
			    t->failures >= POOL_MAX_FAILURES ?
			        " (no more tries for it)" :
			        "");
		}
		free(why);
		job_free(&job);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* Starts the refill thread once and wakes it. p->mu held. */
static void
pool_kick(struct vmd_pool *p)
{
	if (p->stopping)
		return;
	if (!p->thread_on) {
		if (vmd_thread_create(&p->thread, pool_main, p) != 0) {
			moat_warn(0,
			    "pool: cannot start its thread; creates "
			    "start their own VMMs");
			p->want = 0;
			return;
		}
		p->thread_on = true;
	}
	pthread_cond_broadcast(&p->cv);
}

static struct pool_tpl *
tpl_find(struct vmd_pool *p, const char *tid)
{
	for (struct pool_tpl *t = p->tpls; t != NULL; t = t->next)
		if (!t->dropped && strcmp(t->tid, tid) == 0)
			return t;
	return NULL;
}

/* The pool of the least recently wanted snapshot, when more than
 * POOL_MAX_SNAPSHOTS snapshots have one: it is emptied (its slots
 * returned, for the caller to discard unlocked). p->mu held. */
static struct pool_slot *
pool_trim(struct vmd_pool *p)
{
	struct pool_tpl *oldest = NULL;
	struct pool_slot *gone = NULL;
	uint32_t n = 0;

	for (struct pool_tpl *t = p->tpls; t != NULL; t = t->next) {
		if (t->dropped || !t->snapshot)
			continue;
		n++;
		if (oldest == NULL || t->wanted_ms < oldest->wanted_ms)
			oldest = t;
	}
	if (n <= POOL_MAX_SNAPSHOTS || oldest == NULL)
		return NULL;
	oldest->dropped = true;
	while (oldest->slots != NULL) {
		struct pool_slot *s = oldest->slots;

		oldest->slots = s->next;
		s->next = gone;
		gone = s;
	}
	oldest->n = 0;
	return gone;
}

void
vmd_pool_want(struct vmd *vmd, const char *src, const char *dir,
    const struct vmd_shape *shape, const char *accel, bool snapshot)
{
	struct vmd_pool *p = vmd->pool;
	struct pool_slot *gone;
	struct pool_tpl *t;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	if ((t = tpl_find(p, src)) == NULL) {
		if ((t = calloc(1, sizeof(*t))) == NULL ||
		    (t->tid = strdup(src)) == NULL ||
		    (t->tdir = strdup(dir)) == NULL ||
		    (t->image = strdup(shape->image)) == NULL) {
			if (t != NULL) {
				free(t->tid);
				free(t->tdir);
				free(t);
			}
			pthread_mutex_unlock(&p->mu);
			return;
		}
		t->snapshot = snapshot;
		t->vcpus = shape->vcpus;
		t->memory_mib = shape->memory_mib;
		t->scratch_mib = shape->scratch_mib;
		snprintf(t->accel, sizeof(t->accel), "%s", accel);
		t->next = p->tpls;
		p->tpls = t;
	}
	t->wanted_ms = moat_rpc_now_ms();
	gone = pool_trim(p);
	p->quiet_at = moat_rpc_now_ms() + POOL_SETTLE_MS;
	pool_kick(p);
	pthread_mutex_unlock(&p->mu);
	slots_discard(vmd, gone);
}

bool
vmd_pool_take(struct vmd *vmd, const char *src, struct sandbox *sb)
{
	struct vmd_pool *p = vmd->pool;
	struct pool_slot *dead = NULL, *slot = NULL;
	struct pool_tpl *t;

	if (p == NULL)
		return false;
	pthread_mutex_lock(&p->mu);
	t = tpl_find(p, src);
	while (t != NULL && t->slots != NULL && slot == NULL) {
		struct pool_slot *s = t->slots;
		int st;

		t->slots = s->next;
		t->n--;
		/* One that died while it waited is no VMM to take. */
		if (waitpid(s->vm.pid, &st, WNOHANG) == s->vm.pid) {
			moat_warn(0,
			    "pool: VMM %s (pid %d) had exited; "
			    "not used",
			    s->id, (int)s->vm.pid);
			s->vm.pid = 0;
			s->next = dead;
			dead = s;
			continue;
		}
		slot = s;
	}
	/* No refill while this create runs (vmd_pool_want after it). */
	p->quiet_at = UINT64_MAX;
	pthread_mutex_unlock(&p->mu);
	slots_discard(vmd, dead);
	vmd_metrics_vmm_pool(slot != NULL);
	if (slot == NULL)
		return false;
	if ((sb->pooled = malloc(sizeof(*sb->pooled))) == NULL) {
		slots_discard(vmd, slot);
		return false;
	}
	/* Out of the register: from here on it is the sandbox's (a vmd
	 * killed before its state file is written leaves a directory
	 * without one, which the next vmd's adoption removes). */
	reg_remove(vmd, slot->id);
	*sb->pooled = slot->vm;
	snprintf(sb->id.str, sizeof(sb->id.str), "%s", slot->id);
	free(sb->dir);
	sb->dir = slot->dir;
	sb->from_pool = true;
	free(slot);
	return true;
}

void
vmd_pool_forget(struct vmd *vmd, const char *src)
{
	struct vmd_pool *p = vmd->pool;
	struct pool_slot *gone = NULL;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	for (struct pool_tpl *t = p->tpls; t != NULL; t = t->next) {
		if (t->dropped || strcmp(t->tid, src) != 0)
			continue;
		t->dropped = true;
		while (t->slots != NULL) {
			struct pool_slot *s = t->slots;

			t->slots = s->next;
			s->next = gone;
			gone = s;
		}
		t->n = 0;
	}
	pthread_mutex_unlock(&p->mu);
	slots_discard(vmd, gone);
}

void
vmd_pool_fini(struct vmd *vmd)
{
	struct vmd_pool *p = vmd->pool;
	struct pool_tpl *t;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	if (p->thread_on)
		pthread_join(p->thread, NULL);
	while ((t = p->tpls) != NULL) {
		p->tpls = t->next;
		slots_discard(vmd, t->slots);
		free(t->tid);
		free(t->tdir);
		free(t->image);
		free(t);
	}
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
	vmd->pool = NULL;
}
