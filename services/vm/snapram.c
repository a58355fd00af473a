/*
 * snapram.c: the RAM dir as a budget (issue 11). Every snapshot keeps a
 * copy of its guest's RAM in the RAM dir (tmpfs, or XFS with reflinks on
 * tmpfs): fast to restore, but host memory. Recorded sessions take one
 * per step, so without a bound they fill the node in minutes, and then a
 * VMM touching a page of a RAM file that cannot be backed dies of
 * SIGBUS. Here:
 * - the index of this node's snapshots (not templates) with the bytes
 *   their RAM copies hold and when each was last used;
 * - the budget ([vmd] snapshot-ram-mib): past it, the least recently
 *   used copies are evicted: their RAM goes to the on-disk store (the
 *   snapshot's chunks in moat-snapd when it has them, pushed now when
 *   not; else a sparse file in the snapshot's directory on disk), the
 *   copy is removed and the snapshot, still listed, says location
 *   "disk". A restore of it rebuilds the copy first (vmd_snapram_acquire);
 * - admission: before a create, a restore, a rebuild or a snapshot puts
 *   bytes in the RAM dir, vmd_ram_admit checks that the filesystem can
 *   still hold everything already promised (each running guest may fill
 *   its whole memory) plus these bytes, evicting copies to make room,
 *   and refuses with RESOURCE_EXHAUSTED when it cannot.
 * Locks: sr->mu guards the index and counters; it is never held across
 * I/O, and is taken after vmd->mu when both are (vmd->mu is only held
 * briefly to read the memory reservation). An entry being evicted or
 * rebuilt is marked busy; pins (restores reading the copy) keep it in
 * RAM. Not for: taking snapshots (snapshot.c) or chunks (snapshot_push.c).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "extents.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "ramdir.h"
#include "snapram.h"
#include "node.h"
#include "pushq.h"
#include "sync.h"
#include "snapshot_meta.h"
#include "snapshot_push.h"

#define MIB ((uint64_t)1 << 20)
#define EVICTED_FILE "ram.evicted"
#define WAIT_BUSY_MS 120000u /* an eviction or rebuild in progress */

struct snapram_entry {
	struct snapram_entry *next;
	char *id;
	char *dir;
	uint64_t resident;     /* bytes of its RAM copy (0: evicted) */
	uint64_t last_used_ms; /* unix ms: taken or restored */
	uint32_t pins;         /* restores reading its copy */
	bool busy;             /* being evicted or rebuilt */
	bool in_ram;
};

struct vmd_snapram {
	/* One admission at a time: the room measured is the room granted
	 * (taken before vmd->mu and mu, never while holding either). */
	pthread_mutex_t admit_mu;
	pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cv;  /* an entry stopped being busy or pinned */
	struct snapram_entry *entries;
	uint64_t budget; /* bytes */
	uint64_t used;   /* Σ resident of entries in RAM */
	uint64_t evictions;
	uint64_t inflight; /* admitted, not yet in the RAM dir */
};

uint64_t
vmd_snapram_resident(const char *dir)
{
	char *link = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, dir);
	struct stat st;
	uint64_t n = 0;

	if (link != NULL && stat(link, &st) == 0)
		n = (uint64_t)st.st_blocks * 512u;
	free(link);
	return n;
}

/* The RAM copy a snapshot directory's "ram" link names (heap), or NULL. */
static char *
ram_target(const char *dir)
{
	char *link = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, dir);
	char buf[4096];
	ssize_t n = link ? readlink(link, buf, sizeof(buf) - 1) : -1;

	free(link);
	if (n <= 0)
		return NULL;
	buf[n] = '\0';
	return strdup(buf);
}

static bool
file_exists(const char *dir, const char *name)
{
	char *p = moat_asprintf("%s/%s", dir, name);
	bool ok = p != NULL && access(p, F_OK) == 0;

	free(p);
	return ok;
}

/* Replaces string field *f of an unpacked message with a copy of `v`:
 * the old value is freed unless it is protobuf-c's shared empty string
 * (what an unset field points to). Returns false when out of memory. */
static bool
set_str(char **f, const char *v)
{
	char *copy = strdup(v);

	if (copy == NULL)
		return false;
	if (*f != NULL && *f != protobuf_c_empty_string)
		free(*f);
	*f = copy;
	return true;
}

static struct snapram_entry *
find(struct vmd_snapram *sr, const char *id)
{
	for (struct snapram_entry *e = sr->entries; e; e = e->next)
		if (strcmp(e->id, id) == 0)
			return e;
	return NULL;
}

static void
entry_free(struct snapram_entry *e)
{
	if (e != NULL) {
		free(e->id);
		free(e->dir);
		free(e);
	}
}

/* Adds an entry (sr->mu held); NULL on allocation failure. */
static struct snapram_entry *
entry_add(struct vmd_snapram *sr, const char *id, const char *dir, bool in_ram,
    uint64_t resident, uint64_t last_used_ms)
{
	struct snapram_entry *e = calloc(1, sizeof(*e));

	if (e == NULL || (e->id = strdup(id)) == NULL ||
	    (e->dir = strdup(dir)) == NULL) {
		entry_free(e);
		return NULL;
	}
	e->in_ram = in_ram;
	e->resident = in_ram ? resident : 0;
	e->last_used_ms = last_used_ms;
	e->next = sr->entries;
	sr->entries = e;
	if (in_ram)
		sr->used += e->resident;
	return e;
}

/* ---- the RAM dir's room ---- */

/* What the RAM dir holds or has promised, in bytes. */
struct ram_room {
	uint64_t capacity;
	uint64_t free_now;
	uint64_t guests;       /* running guests' memory, whole */
	uint64_t guests_alloc; /* what their RAM files hold already */
	uint64_t snapshots;    /* snapshot RAM copies */
	uint64_t inflight;
};

/* Sum of the allocated bytes of the guests' RAM files in the RAM dir
 * ("moat-sb-*.ram"): free space already lacks them, and their whole
 * memory is counted as promised. With reflinks nothing is credited: a
 * guest rewriting blocks it shares with a snapshot needs new ones. */
static uint64_t
guests_allocated(void)
{
	DIR *d;
	struct dirent *de;
	uint64_t sum = 0;

	if (vmd_ram_dir_reflinks() || (d = opendir(vmd_ram_dir())) == NULL)
		return 0;
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		size_t n = strlen(de->d_name);

		if (strncmp(de->d_name, "moat-sb-", 8) != 0 || n < 4 ||
		    strcmp(de->d_name + n - 4, ".ram") != 0 ||
		    fstatat(dirfd(d), de->d_name, &st, 0) != 0)
			continue;
		sum += (uint64_t)st.st_blocks * 512u;
	}
	closedir(d);
	return sum;
}

static void
room_measure(struct vmd *vmd, struct ram_room *r)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct statvfs fs;

	memset(r, 0, sizeof(*r));
	if (statvfs(vmd_ram_dir(), &fs) == 0) {
		r->capacity = (uint64_t)fs.f_blocks * fs.f_frsize;
		r->free_now = (uint64_t)fs.f_bavail * fs.f_frsize;
	}
	/* Firecracker's guests keep their memory outside the RAM dir. */
	if (strcmp(vmd->vmm->name, "qemu") == 0) {
		r->guests_alloc = guests_allocated();
		pthread_mutex_lock(&vmd->mu);
		uint64_t in_dir =
		    vmd->memory_mib_reserved + vmd->memory_mib_pooled;

		in_dir -= vmd->memory_mib_mapped < in_dir ?
		    vmd->memory_mib_mapped :
		    in_dir;
		r->guests = in_dir * MIB;
		pthread_mutex_unlock(&vmd->mu);
	}
	pthread_mutex_lock(&sr->mu);
	r->snapshots = sr->used;
	r->inflight = sr->inflight;
	pthread_mutex_unlock(&sr->mu);
}

/* Bytes the RAM dir can still promise (may be negative). */
static int64_t
room_left(const struct ram_room *r)
{
	int64_t claim = (int64_t)r->guests - (int64_t)r->guests_alloc;

	if (claim < 0)
		claim = 0;
	return (int64_t)r->free_now - claim - (int64_t)r->inflight -
	    (int64_t)VMD_RAM_DIR_SLACK;
}

/* ---- eviction ---- */

/* Moves the RAM of snapshot `dir` (copy `target`) to the on-disk store
 * and rewrites its meta. Returns 0 or a status with *why (heap). */
static int
evict_to_disk(struct vmd *vmd, uint64_t request_id, const char *dir,
    const char *target, char **why)
{
	Moat__V1__LocalSnapshot *meta = NULL;
	struct vmd_push_result push = { 0 };
	char *local = NULL;
	int rv = MOAT_OK, e;

	if ((e = vmd_snapshot_read_meta(dir, &meta)) != 0) {
		*why = moat_asprintf("cannot read %s/meta.pb: %s", dir,
		    strerror(e));
		return MOAT_INTERNAL;
	}
	if (!meta->remote_stored && vmd->snapd != NULL) {
		/* Not in snapd yet (it was down, or full, at the time):
		 * try again now, it is the store that dedups. */
		vmd_snapshot_push(vmd, request_id, meta, dir, "", &push);
		if (push.remote_id != NULL &&
		    set_str(&meta->remote_id, push.remote_id) &&
		    set_str(&meta->remote_error, "")) {
			meta->remote_stored = true;
			meta->remote_stored_bytes = push.stored_bytes;
			meta->remote_logical_bytes = push.logical_bytes;
		}
	}
	if (!set_str(&meta->evicted_to,
	        meta->remote_stored ? "snapd" : "local")) {
		rv = MOAT_INTERNAL;
	} else if (!meta->remote_stored) {
		local = moat_asprintf("%s/" EVICTED_FILE, dir);
		if (local == NULL) {
			rv = MOAT_INTERNAL;
		} else if (access(local, F_OK) != 0 &&
		    (e = vmd_copy_sparse(target, local, NULL)) != 0) {
			*why = moat_asprintf("cannot copy its RAM to %s: %s",
			    local, strerror(e));
			rv = moat_status_from_errno(e);
		}
	}
	if (rv == MOAT_OK && !set_str(&meta->location, "disk"))
		rv = MOAT_INTERNAL;
	meta->ram_resident_bytes = 0;
	if (rv == MOAT_OK && (e = vmd_snapshot_write_meta(dir, meta)) != 0) {
		*why = moat_asprintf("cannot rewrite %s/meta.pb: %s", dir,
		    strerror(e));
		rv = moat_status_from_errno(e);
	}
	/* Only once the meta says where the RAM is does the copy go. */
	if (rv == MOAT_OK && (e = vmd_ram_unlink(target)) != 0 && e != ENOENT)
		moat_warn(request_id, "cannot remove %s: %s", target,
		    strerror(e));
	if (rv == MOAT_INTERNAL && *why == NULL)
		*why = strdup("out of memory");
	moat__v1__local_snapshot__free_unpacked(meta, NULL);
	free(push.remote_id);
	free(push.error);
	free(local);
	return rv;
}

/* Evicts the least recently used copy that nothing uses. Returns the
 * bytes it freed (at least 1), 0 when that copy could not be evicted
 * (it is then tried last), -1 when no copy is left to try. */
static int64_t
evict_one(struct vmd *vmd, uint64_t request_id)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct snapram_entry *lru = NULL;
	char *target = NULL, *why = NULL;
	uint64_t freed = 0;
	int rv;

	pthread_mutex_lock(&sr->mu);
	for (struct snapram_entry *e = sr->entries; e; e = e->next)
		if (e->in_ram && !e->busy && e->pins == 0 &&
		    (lru == NULL || e->last_used_ms < lru->last_used_ms))
			lru = e;
	if (lru != NULL)
		lru->busy = true;
	pthread_mutex_unlock(&sr->mu);
	if (lru == NULL)
		return -1;
	/* Only this thread touches lru's fields but pins while busy. */
	if ((target = ram_target(lru->dir)) == NULL) {
		rv = MOAT_INTERNAL;
		why = strdup("its RAM link is unreadable");
	} else {
		/* Its background push, if still queued, is done here
		 * instead; a running one is finished first. */
		vmd_pushq_settle(vmd, lru->id);
		rv = evict_to_disk(vmd, request_id, lru->dir, target, &why);
	}
	/* Logged before lru may be forgotten (it is busy until then). */
	if (rv == MOAT_OK)
		moat_info(request_id,
		    "snapshot %s: RAM copy evicted to disk "
		    "(%" PRIu64 " MiB freed in %s)",
		    lru->id, lru->resident / MIB, vmd_ram_dir());
	else
		moat_warn(request_id,
		    "snapshot %s: cannot evict its RAM copy "
		    "(%s): %s; it stays in RAM",
		    lru->id, moat_strerror(rv), why ? why : "?");
	pthread_mutex_lock(&sr->mu);
	lru->busy = false;
	if (rv == MOAT_OK) {
		freed = lru->resident;
		sr->used -= lru->resident;
		lru->resident = 0;
		lru->in_ram = false;
		sr->evictions++;
	} else {
		/* Tried last next time, so others go first. */
		lru->last_used_ms = moat_now_unix_ms();
	}
	pthread_cond_broadcast(&sr->cv);
	pthread_mutex_unlock(&sr->mu);
	free(target);
	free(why);
	return rv == MOAT_OK ? (int64_t)(freed ? freed : 1) : 0;
}

/* Evicts one copy, trying the next when one fails, at most `tries`
 * times. Returns false when nothing could be evicted. */
static bool
evict_some(struct vmd *vmd, uint64_t request_id, int tries)
{
	int64_t r;

	while (tries-- > 0)
		if ((r = evict_one(vmd, request_id)) != 0)
			return r > 0;
	return false;
}

/* Evicts while the copies exceed the budget. */
static void
enforce_budget(struct vmd *vmd, uint64_t request_id)
{
	struct vmd_snapram *sr = vmd->snapram;

	for (;;) {
		bool over;

		pthread_mutex_lock(&sr->mu);
		over = sr->used > sr->budget;
		pthread_mutex_unlock(&sr->mu);
		if (!over || !evict_some(vmd, request_id, 4))
			return;
	}
}

int
vmd_ram_admit(struct vmd *vmd, struct moat_rpc_call *call, uint64_t bytes,
    const char *what)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct ram_room r;
	uint64_t request_id = call ? call->request_id : 0;
	int64_t left;

	for (;;) {
		bool fits;

		pthread_mutex_lock(&sr->admit_mu);
		room_measure(vmd, &r);
		if ((fits = room_left(&r) >= (int64_t)bytes)) {
			pthread_mutex_lock(&sr->mu);
			sr->inflight += bytes;
			pthread_mutex_unlock(&sr->mu);
		}
		pthread_mutex_unlock(&sr->admit_mu);
		if (fits)
			return MOAT_OK;
		if (!evict_some(vmd, request_id, 4))
			break;
	}
	moat_warn(request_id, "RAM dir %s full: refused %s", vmd_ram_dir(),
	    what);
	if (call == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	left = room_left(&r);
	return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
	    "node %s cannot "
	    "fit %s (%" PRIu64 " MiB) in its RAM dir %s (%" PRIu64 " MiB): "
	    "running sandboxes may fill %" PRIu64 " MiB of it (their whole "
	    "memory), snapshot RAM copies hold %" PRIu64 " MiB ([vmd] "
	    "snapshot-ram-mib %" PRIu64 "; none is left to evict to disk), "
	    "%" PRIu64 " MiB remain: destroy sandboxes, delete snapshots "
	    "(moat snapshot gc) or give the RAM dir more room",
	    vmd->cfg.node_id, what, bytes / MIB, vmd_ram_dir(),
	    r.capacity / MIB, r.guests / MIB, r.snapshots / MIB,
	    sr->budget / MIB, left > 0 ? (uint64_t)left / MIB : 0);
}

bool
vmd_ram_has_room(struct vmd *vmd, uint64_t bytes)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct ram_room r;

	pthread_mutex_lock(&sr->admit_mu);
	room_measure(vmd, &r);
	pthread_mutex_unlock(&sr->admit_mu);
	return room_left(&r) >= (int64_t)bytes;
}

void
vmd_ram_admit_done(struct vmd *vmd, uint64_t bytes)
{
	struct vmd_snapram *sr = vmd->snapram;

	pthread_mutex_lock(&sr->mu);
	sr->inflight -= bytes < sr->inflight ? bytes : sr->inflight;
	pthread_mutex_unlock(&sr->mu);
}

/* ---- the index ---- */

void
vmd_snapram_added(struct vmd *vmd, uint64_t request_id, const char *id,
    const char *dir, uint64_t resident)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct snapram_entry *e;

	pthread_mutex_lock(&sr->mu);
	if ((e = find(sr, id)) == NULL &&
	    entry_add(sr, id, dir, true, resident, moat_now_unix_ms()) == NULL)
		moat_warn(request_id,
		    "snapshot %s: out of memory: its RAM "
		    "copy is not counted in the budget",
		    id);
	pthread_mutex_unlock(&sr->mu);
	enforce_budget(vmd, request_id);
}

int
vmd_snapram_forget(struct vmd *vmd, struct moat_rpc_call *call, const char *id,
    uint64_t deadline_ms)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct snapram_entry **pp, *e;

	pthread_mutex_lock(&sr->mu);
	while ((e = find(sr, id)) != NULL && (e->busy || e->pins > 0)) {
		if (vmd_cond_wait_until(&sr->cv, &sr->mu, deadline_ms) ==
		    ETIMEDOUT) {
			pthread_mutex_unlock(&sr->mu);
			return moat_rpc_error(call, MOAT_UNAVAILABLE,
			    "snapshot %s is being restored or moved to disk: "
			    "delete it once that is done",
			    id);
		}
	}
	for (pp = &sr->entries; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			if (e->in_ram)
				sr->used -= e->resident;
			entry_free(e);
			break;
		}
	pthread_mutex_unlock(&sr->mu);
	return MOAT_OK;
}

/* Rebuilds the evicted RAM copy `target` of snapshot `dir` from the
 * on-disk store. Returns 0 or a status after moat_rpc_error. */
static int
rebuild(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__LocalSnapshot *meta, const char *dir, const char *target)
{
	char *local = moat_asprintf("%s/" EVICTED_FILE, dir);
	char *err = NULL;
	int rv, e;

	if (local == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	(void)unlink(target);
	if (access(local, F_OK) == 0) {
		if ((e = vmd_copy_sparse(local, target, NULL)) != 0)
			rv = moat_rpc_error(call, moat_status_from_errno(e),
			    "snapshot %s: cannot bring its RAM back from %s "
			    "to %s: %s",
			    meta->snapshot_id, local, target, strerror(e));
		else
			rv = MOAT_OK;
	} else if (meta->remote_stored && vmd->snapd != NULL) {
		if ((rv = vmd_snapshot_pull_ram(vmd, meta, target, &err)) !=
		    MOAT_OK)
			rv = moat_rpc_error(call,
			    rv == MOAT_NOT_FOUND ? MOAT_FAILED_PRECONDITION :
			                           rv,
			    "snapshot %s: its "
			    "RAM was evicted to moat-snapd (%s) and cannot be "
			    "pulled back: %s",
			    meta->snapshot_id, meta->remote_id,
			    err ? err : "?");
	} else {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "snapshot "
		    "%s: its RAM was evicted to %s, which %s: it cannot be "
		    "restored; delete it",
		    meta->snapshot_id,
		    meta->remote_stored ? "moat-snapd" : "disk",
		    meta->remote_stored ? "this node has no [vmd] snapd to "
		                          "reach" :
		                          "no longer holds it");
	}
	free(local);
	free(err);
	return rv;
}

static bool
under_snapshots(const struct vmd *vmd, const char *dir)
{
	char *root = moat_asprintf("%s/snapshots/", vmd->cfg.state_dir);
	bool ok = root != NULL && strncmp(dir, root, strlen(root)) == 0;

	free(root);
	return ok;
}

/* Marks `e` (pinned, busy) rebuilt or not, waking waiters. */
static void
rebuild_done(struct vmd_snapram *sr, struct snapram_entry *e, bool ok,
    uint64_t resident)
{
	pthread_mutex_lock(&sr->mu);
	e->busy = false;
	if (ok) {
		e->in_ram = true;
		e->resident = resident;
		sr->used += resident;
	} else {
		e->pins--;
	}
	pthread_cond_broadcast(&sr->cv);
	pthread_mutex_unlock(&sr->mu);
}

int
vmd_snapram_acquire(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, const char *dir, Moat__V1__LocalSnapshot **meta)
{
	struct vmd_snapram *sr = vmd->snapram;
	Moat__V1__LocalSnapshot *m = *meta;
	struct snapram_entry *e;
	uint64_t deadline = moat_rpc_now_ms() + WAIT_BUSY_MS;
	char *target = NULL;
	uint64_t need, resident;
	bool evicted;
	int rv, err;

	if (m->template_ || !under_snapshots(vmd, dir))
		return MOAT_OK;
	evicted = strcmp(m->location, "disk") == 0;
	pthread_mutex_lock(&sr->mu);
	if ((e = find(sr, id)) == NULL &&
	    (e = entry_add(sr, id, dir, !evicted, vmd_snapram_resident(dir),
	         moat_now_unix_ms())) == NULL) {
		pthread_mutex_unlock(&sr->mu);
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	}
	while (e->busy) {
		if (vmd_cond_wait_until(&sr->cv, &sr->mu, deadline) ==
		    ETIMEDOUT) {
			pthread_mutex_unlock(&sr->mu);
			return moat_rpc_error(call, MOAT_UNAVAILABLE,
			    "snapshot %s is being moved to disk: try again",
			    id);
		}
	}
	e->pins++;
	e->last_used_ms = moat_now_unix_ms();
	if (e->in_ram) {
		pthread_mutex_unlock(&sr->mu);
		return MOAT_OK;
	}
	e->busy = true;
	pthread_mutex_unlock(&sr->mu);

	/* Evicted: the meta read before may be older than the eviction. */
	moat__v1__local_snapshot__free_unpacked(m, NULL);
	*meta = NULL;
	if ((err = vmd_snapshot_read_meta(dir, meta)) != 0) {
		rv = moat_rpc_error(call, MOAT_INTERNAL,
		    "snapshot %s cannot "
		    "be read (%s): delete it and take another",
		    id, strerror(err));
		goto fail;
	}
	m = *meta;
	need = m->ram_bytes;
	if ((target = ram_target(dir)) == NULL) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "snapshot "
		    "%s has no RAM link: it cannot be restored; delete it",
		    id);
		goto fail;
	}
	{
		char what[160];

		snprintf(what, sizeof(what), "the RAM of snapshot %.80s", id);
		if ((rv = vmd_ram_admit(vmd, call, need, what)) != MOAT_OK)
			goto fail;
	}
	{
		uint64_t t0 = moat_rpc_now_ms();

		rv = rebuild(vmd, call, m, dir, target);
		vmd_ram_admit_done(vmd, need);
		if (rv != MOAT_OK)
			goto fail;
		moat_info(call->request_id,
		    "snapshot %s: RAM rebuilt from %s "
		    "in %" PRIu64 " ms",
		    id, m->evicted_to, moat_rpc_now_ms() - t0);
	}
	resident = vmd_snapram_resident(dir);
	m->ram_resident_bytes = resident;
	m->last_used_unix_ms = moat_now_unix_ms();
	err = set_str(&m->location, "ram") ? vmd_snapshot_write_meta(dir, m) :
	                                     ENOMEM;
	if (err != 0) {
		(void)unlink(target);
		rv = moat_rpc_error(call, MOAT_INTERNAL,
		    "snapshot %s: cannot "
		    "record its rebuilt RAM: %s",
		    id, strerror(err));
		goto fail;
	}
	free(target);
	rebuild_done(sr, e, true, resident);
	enforce_budget(vmd, call->request_id);
	return MOAT_OK;
fail:
	free(target);
	rebuild_done(sr, e, false, 0);
	return rv;
}

void
vmd_snapram_release(struct vmd *vmd, const char *id)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct snapram_entry *e;

	if (sr == NULL)
		return;
	pthread_mutex_lock(&sr->mu);
	if ((e = find(sr, id)) != NULL && e->pins > 0) {
		e->pins--;
		pthread_cond_broadcast(&sr->cv);
	}
	pthread_mutex_unlock(&sr->mu);
	/* A copy rebuilt for this restore may have put the budget over
	 * while it was pinned. */
	if (e != NULL)
		enforce_budget(vmd, 0);
}

void
vmd_snapram_fill(struct vmd *vmd, Moat__V1__Node *node)
{
	struct vmd_snapram *sr = vmd->snapram;
	struct ram_room r;
	int64_t left;

	if (sr == NULL)
		return;
	room_measure(vmd, &r);
	left = room_left(&r);
	pthread_mutex_lock(&sr->mu);
	node->snapshot_ram_budget_bytes = sr->budget;
	node->snapshot_ram_used_bytes = sr->used;
	node->snapshot_evictions = sr->evictions;
	for (struct snapram_entry *e = sr->entries; e; e = e->next) {
		if (e->in_ram)
			node->snapshots_in_ram++;
		else
			node->snapshots_on_disk++;
	}
	pthread_mutex_unlock(&sr->mu);
	node->ram_dir_capacity_bytes = r.capacity;
	node->ram_dir_reserved_bytes = left < 0 ? r.capacity :
	                                          r.capacity -
	        ((uint64_t)left < r.capacity ? (uint64_t)left : r.capacity);
}

/* ---- start and stop ---- */

/* One snapshot directory found at start: indexed, its location made
 * true (a RAM copy gone since, as after a reboot, is on disk when the
 * store has it). */
static void
init_one(struct vmd *vmd, const char *dir)
{
	struct vmd_snapram *sr = vmd->snapram;
	Moat__V1__LocalSnapshot *m = NULL;
	uint64_t resident = vmd_snapram_resident(dir);
	bool in_ram;

	if (vmd_snapshot_read_meta(dir, &m) != 0 || m->template_) {
		moat__v1__local_snapshot__free_unpacked(m, NULL);
		return;
	}
	in_ram = strcmp(m->location, "disk") != 0 && resident > 0;
	if (!in_ram && strcmp(m->location, "disk") != 0 &&
	    (m->remote_stored || file_exists(dir, EVICTED_FILE))) {
		m->ram_resident_bytes = 0;
		if (set_str(&m->location, "disk") &&
		    set_str(&m->evicted_to,
		        m->remote_stored ? "snapd" : "local") &&
		    vmd_snapshot_write_meta(dir, m) == 0)
			moat_info(0,
			    "snapshot %s: its RAM copy is gone; "
			    "restores rebuild it from %s",
			    m->snapshot_id, m->evicted_to);
	}
	pthread_mutex_lock(&sr->mu);
	(void)entry_add(sr, m->snapshot_id, dir, in_ram, resident,
	    m->last_used_unix_ms ? m->last_used_unix_ms : m->created_unix_ms);
	pthread_mutex_unlock(&sr->mu);
	moat__v1__local_snapshot__free_unpacked(m, NULL);
}

int
vmd_snapram_init(struct vmd *vmd)
{
	struct vmd_snapram *sr = calloc(1, sizeof(*sr));
	char *root = moat_asprintf("%s/snapshots", vmd->cfg.state_dir);
	struct dirent *de;
	DIR *d;

	if (sr == NULL || root == NULL) {
		free(sr);
		free(root);
		return MOAT_INTERNAL;
	}
	pthread_mutex_init(&sr->admit_mu, NULL);
	pthread_mutex_init(&sr->mu, NULL);
	vmd_cond_init(&sr->cv);
	sr->budget = vmd->cfg.snapshot_ram_mib * MIB;
	vmd->snapram = sr;
	if ((d = opendir(root)) != NULL) {
		while ((de = readdir(d)) != NULL) {
			size_t n = strlen(de->d_name);
			char *dir;

			if (strncmp(de->d_name, "snap-", 5) != 0 ||
			    (n > 4 &&
			        strcmp(de->d_name + n - 4, ".tmp") == 0) ||
			    (dir = moat_asprintf("%s/%s", root, de->d_name)) ==
			        NULL)
				continue;
			init_one(vmd, dir);
			free(dir);
		}
		closedir(d);
	}
	free(root);
	moat_info(0,
	    "snapshot RAM: %" PRIu64 " of %" PRIu64 " MiB budget "
	    "([vmd] snapshot-ram-mib) in %s",
	    sr->used / MIB, sr->budget / MIB, vmd_ram_dir());
	enforce_budget(vmd, 0);
	return MOAT_OK;
}

void
vmd_snapram_fini(struct vmd *vmd)
{
	struct vmd_snapram *sr = vmd->snapram;

	if (sr == NULL)
		return;
	while (sr->entries != NULL) {
		struct snapram_entry *e = sr->entries;

		sr->entries = e->next;
		entry_free(e);
	}
	pthread_mutex_destroy(&sr->admit_mu);
	pthread_mutex_destroy(&sr->mu);
	pthread_cond_destroy(&sr->cv);
	free(sr);
	vmd->snapram = NULL;
}
