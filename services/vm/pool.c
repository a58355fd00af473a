/*
 * pool.c: the warm VMM pool (pool.h): per template a list of VMMs made
 * by the driver's restore exactly as a clone's would be (the spec comes
 * from sandbox_boot.c's vmd_boot_spec_make for a sandbox of the
 * template's shape), one refill thread, and the register of pooled VMMs
 * in <state>/pool that lets the next vmd kill what a dead one left.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "extents.h"
#include "guest_link.h"
#include "metrics.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "ramdir.h"
#include "pool.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "sandbox_supervise.h"
#include "snapram.h"
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
/* A template's pooled VMM is pre-warmed (resumed, reset, one exec)
 * within this. */
#define POOL_WARM_TIMEOUT_MS 30000

/* A pre-warmed VMM's link hooks' arg while it waits in the pool: the
 * warm-up exec's end. */
struct pool_warm {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t exec_id;
	bool exited, closed;
};

struct pool_slot {
	struct pool_slot *next;
	char id[24];
	char *dir;
	struct moat_vmm vm;
	/* A template's pooled VMM is pre-warmed: its guest runs, was reset
	 * once and ran one exec, over this link (hooks: pool_warm). */
	struct guest_link *link;
	struct pool_warm *warm;
	uint32_t reserved_mib; /* in vmd->memory_mib_pooled */
	bool mapped;           /* ...and memory_mib_mapped (ram-sharing
	                          private) */
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
	bool full; /* no room on the node: no refill until the next want */
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

/* Writes the register entry of pooled VMM `id`: its pid (0 until it is
 * ready to take). */
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

static void
warm_free(struct pool_warm *w)
{
	if (w == NULL)
		return;
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
	free(w);
}

static void
warm_ready(void *arg, const Moat__V1__AgentReady *ready)
{
	(void)arg;
	(void)ready;
}

/* The warm-up exec's output is dropped; its exit is waited for. */
static int
warm_event(void *arg, const Moat__V1__GuestMessage *msg, char **why)
{
	struct pool_warm *w = arg;

	(void)why;
	pthread_mutex_lock(&w->mu);
	if (msg->body_case == MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT &&
	    msg->id == w->exec_id)
		w->exited = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return 0;
}

static void
warm_closed(void *arg, bool violation, const char *reason)
{
	struct pool_warm *w = arg;

	(void)violation;
	(void)reason;
	pthread_mutex_lock(&w->mu);
	w->closed = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static const struct guest_link_hooks warm_hooks = {
	.ready = warm_ready,
	.event = warm_event,
	.closed = warm_closed,
};

/* The link's end before its VMM's: shut (joining its reader, so the
 * hooks' arg can go), freed. */
static void
slot_unlink(struct pool_slot *s)
{
	if (s->link != NULL) {
		guest_link_shutdown(s->link, NULL);
		guest_link_free(s->link);
		s->link = NULL;
	}
	warm_free(s->warm);
	s->warm = NULL;
}

/* Counts `mib` of a pooled VMM in vmd->memory_mib_pooled when the node
 * has that room left beside its sandboxes and pooled VMMs, in memory and
 * in the RAM dir (nothing is evicted for it). False: no room. */
static bool
pool_reserve(struct vmd *vmd, struct pool_slot *s, uint32_t mib)
{
	/* A restore maps the source's RAM privately (qemu_ram_backing). */
	bool mapped = vmd_ram_private();
	bool ok;

	if (!vmd_ram_has_room(vmd, mapped ? 0 : (uint64_t)mib << 20))
		return false;
	pthread_mutex_lock(&vmd->mu);
	ok = !vmd->shutting_down &&
	    vmd->memory_mib_reserved + vmd->memory_mib_pooled + mib <=
	        vmd->cfg.memory_mib_total;
	if (ok) {
		vmd->memory_mib_pooled += mib;
		if (mapped)
			vmd->memory_mib_mapped += mib;
		s->reserved_mib = mib;
		s->mapped = mapped;
	}
	pthread_mutex_unlock(&vmd->mu);
	return ok;
}

/* Takes s's memory out of the pool's count (mu held). */
static void
pool_unreserve_locked(struct vmd *vmd, struct pool_slot *s)
{
	vmd->memory_mib_pooled -= s->reserved_mib < vmd->memory_mib_pooled ?
	    s->reserved_mib :
	    vmd->memory_mib_pooled;
	if (s->mapped)
		vmd->memory_mib_mapped -=
		    s->reserved_mib < vmd->memory_mib_mapped ?
		    s->reserved_mib :
		    vmd->memory_mib_mapped;
	s->reserved_mib = 0;
	s->mapped = false;
}

static void
pool_unreserve(struct vmd *vmd, struct pool_slot *s)
{
	pthread_mutex_lock(&vmd->mu);
	pool_unreserve_locked(vmd, s);
	pthread_mutex_unlock(&vmd->mu);
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

		slot_unlink(s);
		pool_discard(vmd, s->id, s->dir, &s->vm);
		pool_unreserve(vmd, s);
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

/* Pre-warms a template's pooled VMM (slot->vm, just restored, paused):
 * connects its agent, loads the device state and lets it run, resets
 * the guest as a clone would be (its own name, the host's entropy), and
 * runs one exec, so that TCG has translated the guest code a first exec
 * runs and the guest has touched its pages before a create takes it;
 * the create resets it once more as its sandbox. Not for a snapshot's
 * pool: a restore must give the recorded state, not one that ran on.
 * Returns 0 or a status with *why (heap). */
static int
pool_warm(struct vmd *vmd, const struct pool_job *job, struct pool_slot *slot,
    char **why)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecStart start = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	uint64_t deadline = moat_rpc_now_ms() + POOL_WARM_TIMEOUT_MS;
	struct pool_warm *w;
	char *err = NULL;
	int fd = -1, rv;

	if ((w = calloc(1, sizeof(*w))) == NULL) {
		*why = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	pthread_mutex_init(&w->mu, NULL);
	vmd_cond_init(&w->cv);
	slot->warm = w;
	while ((rv = vmd->vmm->connect_agent(&slot->vm, &fd, &err)) ==
	        MOAT_UNAVAILABLE &&
	    moat_rpc_now_ms() < deadline) {
		free(err);
		err = NULL;
		vmd_sleep_ms(2);
	}
	if (rv != MOAT_OK) {
		*why = moat_asprintf("cannot connect to its agent: %s",
		    err ? err : "it is not there");
		free(err);
		return rv == MOAT_UNAVAILABLE ? MOAT_DEADLINE_EXCEEDED : rv;
	}
	if ((rv = guest_link_open(&slot->link, fd, 0, &warm_hooks, w, why)) !=
	    MOAT_OK)
		return rv;
	if ((rv = vmd->vmm->resume(&slot->vm, job->tdir, POOL_WARM_TIMEOUT_MS,
	         &err)) != MOAT_OK) {
		*why = moat_asprintf("it did not resume: %s", err ? err : "?");
		free(err);
		return rv;
	}
	if ((rv = vmd_guest_reset(slot->link, slot->id, true, false, deadline,
	         why)) != MOAT_OK)
		return rv;
	start.shell = "true";
	start.stdin_close = true;
	start.timeout_ms = POOL_WARM_TIMEOUT_MS;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &start;
	req.id = guest_link_new_id(slot->link);
	pthread_mutex_lock(&w->mu);
	w->exec_id = req.id;
	pthread_mutex_unlock(&w->mu);
	if ((rv = guest_link_call(slot->link, &req, deadline, &reply, &err)) !=
	    MOAT_OK) {
		*why = moat_asprintf("its warm-up exec: %s", err ? err : "?");
		free(err);
		return rv;
	}
	if (reply->code != MOAT__V1__CODE__OK) {
		*why = moat_asprintf("its warm-up exec was refused: %s",
		    reply->message);
		rv = (int)reply->code;
	}
	moat__v1__guest_message__free_unpacked(reply, NULL);
	if (rv != MOAT_OK)
		return rv;
	pthread_mutex_lock(&w->mu);
	while (!w->exited && !w->closed &&
	    vmd_cond_wait_until(&w->cv, &w->mu, deadline) == 0)
		;
	rv = w->exited ? MOAT_OK : MOAT_UNAVAILABLE;
	pthread_mutex_unlock(&w->mu);
	if (rv != MOAT_OK)
		*why = strdup("its warm-up exec did not end (the guest link "
		              "closed or it ran past its time)");
	return rv;
}

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
	/* Counted before it holds memory; never in a sandbox's way (a
	 * create short of room has the pool give its VMMs up). */
	if (!pool_reserve(vmd, slot, job->memory_mib)) {
		*why = strdup("no room on the node");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
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
	if (!job->snapshot &&
	    (rv = pool_warm(vmd, job, slot, why)) != MOAT_OK) {
		slot_unlink(slot);
		pool_discard(vmd, slot->id, slot->dir, &slot->vm);
		made_dir = false;
		slot->id[0] = '\0';
		goto fail;
	}
	/* Its pid once it is ready to take (reaping goes by the pidfile in
	 * its directory, whatever the entry says). */
	(void)reg_write(vmd, slot->id, slot->vm.pid);
	vmd_boot_files_free(&files);
	vmd_sandbox_free(sb);
	free(src);
	*out = slot;
	return MOAT_OK;
fail:
	vmd_boot_files_free(&files);
	if (slot != NULL) {
		if (slot->reserved_mib > 0)
			pool_unreserve(vmd, slot);
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
		if (t->dropped || t->full ||
		    t->failures >= POOL_MAX_FAILURES ||
		    t->n + t->making >= p->want)
			continue;
		if (best == NULL || t->n + t->making < best->n + best->making)
			best = t;
	}
	return best;
}

/* Whether source t is still there to clone: its RAM (for a snapshot, a
 * link to its copy in the RAM dir, which eviction removes). */
static bool
source_there(const struct pool_tpl *t)
{
	char path[PATH_MAX];
	struct stat st;

	snprintf(path, sizeof(path), "%s/" MOAT_VMM_SNAP_RAM, t->tdir);
	return stat(path, &st) == 0;
}

/* The pools of sources that are gone (a template dropped, or its image
 * removed; a snapshot deleted, or its RAM evicted to disk, which its
 * pooled VMMs would keep in memory) are emptied: their slots, for the
 * caller to discard unlocked. p->mu held. */
static struct pool_slot *
pool_sweep(struct vmd_pool *p)
{
	struct pool_slot *gone = NULL;

	for (struct pool_tpl *t = p->tpls; t != NULL; t = t->next) {
		if (t->dropped || source_there(t))
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
		struct pool_slot *slot = NULL, *gone;
		struct pool_job job = { 0 };
		struct pool_tpl *t;
		uint64_t now = moat_rpc_now_ms();
		char *why = NULL;
		int rv;

		/* Sources gone first, on every wakeup (at least every
		 * POOL_SWEEP_MS): their VMMs hold memory. */
		if ((gone = pool_sweep(p)) != NULL) {
			pthread_mutex_unlock(&p->mu);
			slots_discard(vmd, gone);
			pthread_mutex_lock(&p->mu);
			continue;
		}
		t = pool_next(p);
		if (t == NULL || now < p->quiet_at) {
			uint64_t until = now + POOL_SWEEP_MS;

			if (t != NULL && p->quiet_at < until)
				until = p->quiet_at;
			(void)vmd_cond_wait_until(&p->cv, &p->mu, until);
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
		} else if (rv == MOAT_RESOURCE_EXHAUSTED) {
			/* Not a failure: the node is full of sandboxes. */
			t->full = true;
			moat_info(0,
			    "pool: %s %s: no room on the node for a pooled "
			    "VMM; its pool refills when it is used again",
			    t->snapshot ? "snapshot" : "template",
			    job.tid ? job.tid : "?");
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
	t->full = false;
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
		/* One that died while it waited is no VMM to take, nor one
		 * whose guest link closed (its link goes to sb now). */
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
		if (s->link != NULL &&
		    !guest_link_set_hooks(s->link, &vmd_sandbox_link_hooks,
		        sb)) {
			moat_warn(0,
			    "pool: VMM %s (pid %d): its guest link had "
			    "closed; not used",
			    s->id, (int)s->vm.pid);
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
	/* Its memory is the sandbox's now, counted as a sandbox's
	 * (bring_up_admit admits no more for it). */
	pthread_mutex_lock(&vmd->mu);
	if (slot->reserved_mib == sb->memory_mib) {
		/* Out of the pool's count, into the sandboxes' (a mapped
		 * one stays in memory_mib_mapped, now sb's). */
		vmd->memory_mib_pooled -=
		    slot->reserved_mib < vmd->memory_mib_pooled ?
		    slot->reserved_mib :
		    vmd->memory_mib_pooled;
		vmd->memory_mib_reserved += sb->memory_mib;
		sb->memory_reserved = true;
		sb->ram_mapped = slot->mapped;
	} else {
		pool_unreserve_locked(vmd, slot);
	}
	pthread_mutex_unlock(&vmd->mu);
	*sb->pooled = slot->vm;
	/* Pre-warmed: its link is sb's (hooks set above); the restore
	 * only resets the guest. */
	sb->pooled_link = slot->link;
	sb->prewarmed = slot->link != NULL;
	slot->link = NULL;
	warm_free(slot->warm);
	snprintf(sb->id.str, sizeof(sb->id.str), "%s", slot->id);
	free(sb->dir);
	sb->dir = slot->dir;
	sb->from_pool = true;
	free(slot);
	return true;
}

uint32_t
vmd_pool_shed(struct vmd *vmd)
{
	struct vmd_pool *p = vmd->pool;
	struct pool_slot *gone = NULL;
	uint32_t n = 0;

	if (p == NULL)
		return 0;
	pthread_mutex_lock(&p->mu);
	for (struct pool_tpl *t = p->tpls; t != NULL; t = t->next) {
		while (t->slots != NULL) {
			struct pool_slot *s = t->slots;

			t->slots = s->next;
			s->next = gone;
			gone = s;
			n++;
		}
		t->n = 0;
		t->full = true;
	}
	pthread_mutex_unlock(&p->mu);
	if (n > 0)
		moat_info(0,
		    "pool: %u pooled VMM%s given up: a sandbox needs the "
		    "room",
		    n, n == 1 ? "" : "s");
	slots_discard(vmd, gone);
	return n;
}

void
vmd_pool_make_room(struct vmd *vmd, const struct sandbox *sb, bool restore)
{
	/* As vmd_sandbox_bring_up will count it. */
	bool mapped = restore && vmd_ram_private();
	bool short_of_room;

	if (vmd->pool == NULL || sb->memory_reserved)
		return;
	pthread_mutex_lock(&vmd->mu);
	short_of_room = vmd->memory_mib_pooled > 0 &&
	    vmd->memory_mib_reserved + vmd->memory_mib_pooled +
	            sb->memory_mib >
	        vmd->cfg.memory_mib_total;
	pthread_mutex_unlock(&vmd->mu);
	if (short_of_room ||
	    !vmd_ram_has_room(vmd,
	        mapped ? 0 : (uint64_t)sb->memory_mib << 20))
		(void)vmd_pool_shed(vmd);
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
