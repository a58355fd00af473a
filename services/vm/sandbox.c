/*
 * sandbox.c: the sandbox object and the node's table of them: reference
 * counts (the table holds one reference, every RPC in flight on a
 * sandbox another, so destroy never frees what a handler still uses),
 * lookup, validation of a create request, memory accounting, the one
 * function that moves a sandbox's lifecycle (vmd_sandbox_step), failure,
 * stopping a VMM, destroy, reporting, and the cleanup of what an earlier
 * (killed) vmd left behind. Not for: booting (sandbox_boot.c), the
 * supervisor and guest link hooks (sandbox_supervise.c), creates and
 * restores (sandbox_create.c, sandbox_restore.c), exec and file calls.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "guest_link.h"
#include "image.h"
#include "moat/log.h"
#include "moat/rpc_tenant.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "ramdir.h"
#include "sandbox.h"
#include "sync.h"
#include "verify.h"

#define SANDBOX_MAX_LABELS 64
#define SANDBOX_MAX_LABEL_KEY 128
#define SANDBOX_MAX_LABEL_VALUE 1024
#define SANDBOX_STOP_GRACE_MS 3000

void
vmd_sandbox_set_guest_handler(struct vmd *vmd,
    const struct vmd_guest_handler *h)
{
	vmd->guest_handler = h;
}

/* ---- the lifecycle ---- */

enum sandbox_step
vmd_sandbox_step(struct sandbox *sb, enum sandbox_event ev)
{
	enum sandbox_state to;
	enum sandbox_step step =
	    vmd_sandbox_state_next(sb->lifecycle, ev, &to);

	switch (step) {
	case SANDBOX_STEP_MOVED:
		moat_debug(0, "sandbox %s: %s -> %s (%s)", sb->id.str,
		    vmd_sandbox_state_name(sb->lifecycle),
		    vmd_sandbox_state_name(to), vmd_sandbox_event_name(ev));
		sb->lifecycle = to;
		pthread_cond_broadcast(&sb->cv);
		break;
	case SANDBOX_STEP_IGNORED:
		break;
	case SANDBOX_STEP_REFUSED:
		moat_warn(0, "sandbox %s: event %s refused in state %s",
		    sb->id.str, vmd_sandbox_event_name(ev),
		    vmd_sandbox_state_name(sb->lifecycle));
		break;
	}
	return step;
}

Moat__V1__SandboxState
vmd_sandbox_api_state(const struct sandbox *sb)
{
	return vmd_sandbox_state_api(sb->lifecycle);
}

bool
vmd_sandbox_stop_asked(const struct sandbox *sb)
{
	return sb->lifecycle == SANDBOX_ABORTING ||
	    sb->lifecycle == SANDBOX_STOPPED;
}

/* ---- references and lookup ---- */

void
vmd_sandbox_free(struct sandbox *sb)
{
	if (sb == NULL)
		return;
	guest_link_free(sb->link);
	for (size_t i = 0; i < sb->n_retired_links; i++)
		guest_link_free(sb->retired_links[i]);
	free(sb->retired_links);
	if (sb->vmd->guest_handler != NULL)
		sb->vmd->guest_handler->release(sb);
	sb->vmd->vmm->release(&sb->vmm);
	if (sb->pooled_link != NULL) {
		guest_link_shutdown(sb->pooled_link, NULL);
		guest_link_free(sb->pooled_link);
	}
	if (sb->pooled != NULL) {
		/* Taken from the pool (pool.h) and never run: it goes,
		 * unused, with its directory (out of the pool's register
		 * since the take). */
		int st;

		sb->vmd->vmm->stop(sb->pooled, true);
		while (waitpid(sb->pooled->pid, &st, 0) < 0 && errno == EINTR)
			;
		sb->vmd->vmm->release(sb->pooled);
		(void)moat_rm_rf(sb->dir);
		free(sb->pooled);
	}
	for (size_t i = 0; i < sb->n_labels; i++) {
		free(sb->label_keys[i]);
		free(sb->label_values[i]);
	}
	free(sb->label_keys);
	free(sb->label_values);
	free(sb->dir);
	free(sb->image);
	free(sb->tenant);
	free(sb->test_mode);
	free(sb->template_id);
	free(sb->restored_from);
	free(sb->ram_source);
	free(sb->ram_spare);
	free(sb->egress_policy);
	free(sb->failure_reason);
	free(sb->link_error);
	if (sb->supervise_stop_fd >= 0)
		close(sb->supervise_stop_fd);
	pthread_mutex_destroy(&sb->mu);
	pthread_cond_destroy(&sb->cv);
	free(sb);
}

void
vmd_sandbox_put(struct sandbox *sb)
{
	struct vmd *vmd;
	bool last;

	if (sb == NULL)
		return;
	vmd = sb->vmd;
	pthread_mutex_lock(&vmd->mu);
	last = --sb->refs == 0;
	pthread_mutex_unlock(&vmd->mu);
	if (last)
		vmd_sandbox_free(sb);
}

static struct sandbox *
sandbox_find_ref(struct vmd *vmd, const char *id)
{
	struct sandbox *sb;

	pthread_mutex_lock(&vmd->mu);
	for (sb = vmd->sandboxes; sb != NULL; sb = sb->next)
		if (strcmp(sb->id.str, id) == 0)
			break;
	if (sb != NULL)
		sb->refs++;
	pthread_mutex_unlock(&vmd->mu);
	return sb;
}

int
vmd_sandbox_get(struct vmd *vmd, struct moat_rpc_call *call, const char *id,
    struct sandbox **out)
{
	const char *tenant = NULL;
	int rv;

	*out = NULL;
	/* A call acts for one tenant (rpc_tenant.h); internal lookups
	 * (call NULL) see every sandbox. */
	if (call != NULL &&
	    (rv = moat_rpc_tenant(call, NULL, &tenant)) != MOAT_OK)
		return rv;
	*out = sandbox_find_ref(vmd, id ? id : "");
	if (*out != NULL && tenant != NULL &&
	    strcmp((*out)->tenant, tenant) != 0) {
		/* Another tenant's sandbox is answered as a missing one. */
		vmd_sandbox_put(*out);
		*out = NULL;
	}
	if (*out != NULL) {
		/* Any call on the sandbox is activity (lifetime.h), but
		 * GetSandbox: watching a sandbox does not keep it alive. */
		if (call != NULL &&
		    (call->method == NULL ||
		        strcmp(call->method, "GetSandbox") != 0))
			vmd_lifetime_touch(&(*out)->life, moat_now_unix_ms());
		return MOAT_OK;
	}
	if (call == NULL)
		return MOAT_NOT_FOUND;
	if (id == NULL || id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "sandbox_id is empty: name a sandbox (moat sandbox ls "
		    "lists sandboxes)");
	return moat_rpc_error(call, MOAT_NOT_FOUND,
	    "sandbox %s not found "
	    "(moat sandbox ls lists sandboxes)",
	    id);
}

int
vmd_sandbox_get_running(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, struct sandbox **out)
{
	struct sandbox *sb;
	int rv;

	if ((rv = vmd_sandbox_get(vmd, call, id, &sb)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	switch (vmd_sandbox_api_state(sb)) {
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING:
		rv = sb->paused_for_move ?
		    moat_rpc_error(call, MOAT_UNAVAILABLE,
		        "sandbox %s is paused: it is being moved to another "
		        "node: retry in a few seconds",
		        id) :
		    MOAT_OK;
		break;
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING:
		rv = moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "sandbox %s is "
		    "still booting: try again when it is RUNNING",
		    id);
		break;
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED:
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox "
		    "%s has failed: %s. Destroy it and create a new one",
		    id, sb->failure_reason ? sb->failure_reason : "unknown");
		break;
	default:
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox "
		    "%s is %s",
		    id, vmd_sandbox_api_state_name(vmd_sandbox_api_state(sb)));
		break;
	}
	pthread_mutex_unlock(&sb->mu);
	if (rv != MOAT_OK) {
		vmd_sandbox_put(sb);
		return rv;
	}
	*out = sb;
	return MOAT_OK;
}

/* ---- memory accounting ---- */

void
vmd_sandbox_unreserve(struct sandbox *sb)
{
	struct vmd *vmd = sb->vmd;

	pthread_mutex_lock(&vmd->mu);
	if (sb->memory_reserved) {
		vmd->memory_mib_reserved -= sb->memory_mib;
		if (sb->ram_mapped)
			vmd->memory_mib_mapped -= sb->memory_mib;
		sb->memory_reserved = false;
	}
	pthread_mutex_unlock(&vmd->mu);
}

/* ---- failure and supervision ---- */

/* ---- failure ---- */

bool
vmd_sandbox_fail_locked(struct sandbox *sb, const char *reason)
{
	if (vmd_sandbox_step(sb, SANDBOX_EV_FAIL) != SANDBOX_STEP_MOVED)
		return false;
	free(sb->failure_reason);
	sb->failure_reason = strdup(reason);
	if (sb->vmm.pid > 0 && !sb->vmm_exited)
		sb->vmd->vmm->stop(&sb->vmm, true);
	/* Guest RAM is the memory the node needs back. */
	if (sb->vmm.ram_file != NULL)
		(void)vmd_ram_unlink(sb->vmm.ram_file);
	moat_warn(0, "sandbox %s failed: %s", sb->id.str, reason);
	return true;
}

void
vmd_sandbox_fail(struct sandbox *sb, const char *reason)
{
	bool changed;

	pthread_mutex_lock(&sb->mu);
	changed = vmd_sandbox_fail_locked(sb, reason);
	pthread_mutex_unlock(&sb->mu);
	if (changed)
		vmd_sandbox_unreserve(sb);
}

/* ---- stopping a VMM ---- */

void
vmd_sandbox_vmm_teardown(struct sandbox *sb, bool free_link, const char *why)
{
	const struct moat_vmm_ops *ops = sb->vmd->vmm;
	struct guest_link *link;
	struct vmd_egress *egress;
	bool join;

	pthread_mutex_lock(&sb->mu);
	if (sb->vmm.pid > 0 && !sb->vmm_exited) {
		uint64_t until = moat_rpc_now_ms() + SANDBOX_STOP_GRACE_MS;

		ops->stop(&sb->vmm, false);
		while (!sb->vmm_exited && sb->supervisor_running &&
		    vmd_cond_wait_until(&sb->cv, &sb->mu, until) == 0)
			;
		if (!sb->vmm_exited)
			ops->stop(&sb->vmm, true);
	}
	join = sb->supervisor_running;
	sb->supervisor_running = false;
	link = sb->link;
	if (free_link)
		sb->link = NULL;
	pthread_mutex_unlock(&sb->mu);

	if (join)
		pthread_join(sb->supervisor, NULL);
	pthread_mutex_lock(&sb->mu);
	egress = sb->egress;
	sb->egress = NULL;
	pthread_mutex_unlock(&sb->mu);
	vmd_egress_stop(egress);
	guest_link_shutdown(link, why);
	if (free_link)
		guest_link_free(link);

	pthread_mutex_lock(&sb->mu);
	if (sb->vmm.pid > 0 && !sb->vmm_exited) {
		/* No supervisor ran (it could not start): reap here. */
		int status = 0;
		ops->stop(&sb->vmm, true);
		while (waitpid(sb->vmm.pid, &status, 0) < 0 && errno == EINTR)
			;
		sb->vmm_exited = true;
		sb->vmm_status = status;
	}
	ops->release(&sb->vmm);
	pthread_mutex_unlock(&sb->mu);
}

int
vmd_sandbox_validate(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, const char *image,
    const char **test_mode)
{
	const struct vmd_config *cfg = &vmd->cfg;
	uint32_t vcpus = req->vcpus ? req->vcpus : VMD_DEFAULT_VCPUS;
	uint32_t mem =
	    req->memory_mib ? req->memory_mib : VMD_DEFAULT_MEMORY_MIB;
	uint64_t scratch =
	    req->scratch_mib ? req->scratch_mib : VMD_DEFAULT_SCRATCH_MIB;

	*test_mode = NULL;
	if (vcpus > cfg->max_vcpus)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "vcpus %u is "
		    "out of range: node %s allows 1 to %u per sandbox",
		    vcpus, cfg->node_id, cfg->max_vcpus);
	if (mem < VMD_MIN_MEMORY_MIB || mem > cfg->max_memory_mib)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "memory_mib "
		    "%u is out of range: node %s allows %u to %u MiB per "
		    "sandbox",
		    mem, cfg->node_id, VMD_MIN_MEMORY_MIB,
		    cfg->max_memory_mib);
	if (scratch < VMD_MIN_SCRATCH_MIB || scratch > VMD_MAX_SCRATCH_MIB)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "scratch_mib "
		    "%" PRIu64 " is out of range: %u to %u MiB",
		    scratch, VMD_MIN_SCRATCH_MIB, VMD_MAX_SCRATCH_MIB);
	if (!vmd_image_name_ok(image))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "image name "
		    "\"%s\" is not valid: use letters, digits, '-', '_' and "
		    "'.'",
		    image);
	if (req->n_labels > SANDBOX_MAX_LABELS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%zu labels "
		    "given: at most %d",
		    req->n_labels, SANDBOX_MAX_LABELS);
	for (size_t i = 0; i < req->n_labels; i++) {
		const char *k = req->labels[i]->key;
		const char *v = req->labels[i]->value;

		if (strlen(k) == 0 || strlen(k) > SANDBOX_MAX_LABEL_KEY ||
		    strlen(v) > SANDBOX_MAX_LABEL_VALUE)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "label \"%.40s\" is empty or too long: keys take "
			    "1 "
			    "to %d bytes, values at most %d",
			    k, SANDBOX_MAX_LABEL_KEY, SANDBOX_MAX_LABEL_VALUE);
		if (strcmp(k, VMD_TEST_LABEL) != 0)
			continue;
		if (!cfg->test_hooks)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "label " VMD_TEST_LABEL
			    " is for moat's own tests: "
			    "set [vmd] test-hooks=true on this node to use "
			    "it");
		if (strcmp(v, "garbage") != 0 && strcmp(v, "oversize") != 0 &&
		    strcmp(v, "flood") != 0)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "label " VMD_TEST_LABEL "=%s is unknown: use "
			    "garbage, oversize or flood",
			    v);
		*test_mode = v;
	}
	{
		struct vmd_egress_policy *np = NULL;
		char *err = NULL;
		int rv = vmd_egress_request_policy(req->network, &np, &err);
		bool on = np != NULL;

		free(np);
		if (rv != MOAT_OK) {
			rv = moat_rpc_error(call, rv, "network: %s",
			    err ? err : "out of memory");
			free(err);
			return rv;
		}
		if (on && strcmp(vmd->vmm->name, "qemu") != 0)
			return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
			    "network \"allowlist\" needs the qemu driver; "
			    "node %s runs %s (set [vmd] driver = qemu)",
			    cfg->node_id, vmd->vmm->name);
	}
	if (!vmd_image_present(vmd, image))
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "image "
		    "\"%s\" is not built: run images/build.sh --name %s "
		    "--out %s as root (looked in %s/%s)",
		    image, image, cfg->image_dir, cfg->image_dir, image);
	return vmd_image_check(vmd, call, image);
}

static void
sandbox_new_id(struct sandbox_id *id)
{
	uint8_t r[8];

	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
		uint64_t t = moat_rpc_now_ms() ^ ((uint64_t)getpid() << 32) ^
		    (uint64_t)(uintptr_t)id;
		memcpy(r, &t, sizeof(r));
	}
	snprintf(id->str, sizeof(id->str),
	    "sb-%02x%02x%02x%02x%02x%02x%02x"
	    "%02x",
	    r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
}

struct sandbox *
vmd_sandbox_alloc(struct vmd *vmd, const Moat__V1__CreateSandboxRequest *req,
    const char *image, const char *test_mode)
{
	struct sandbox *sb = calloc(1, sizeof(*sb));
	bool oom = false;

	if (sb == NULL)
		return NULL;
	sb->vmd = vmd;
	pthread_mutex_init(&sb->mu, NULL);
	vmd_cond_init(&sb->cv);
	/* Without it (no eventfd), vmd cannot leave the VMM running when it
	 * stops: the supervisor would not return. */
	sb->supervise_stop_fd = eventfd(0, EFD_CLOEXEC);
	sandbox_new_id(&sb->id);
	sb->lifecycle = SANDBOX_BOOTING;
	sb->vcpus = req->vcpus ? req->vcpus : VMD_DEFAULT_VCPUS;
	sb->memory_mib =
	    req->memory_mib ? req->memory_mib : VMD_DEFAULT_MEMORY_MIB;
	sb->scratch_mib =
	    req->scratch_mib ? req->scratch_mib : VMD_DEFAULT_SCRATCH_MIB;
	sb->boot_timeout_ms = req->boot_timeout_ms ? req->boot_timeout_ms :
	                                             vmd->cfg.boot_timeout_ms;
	sb->created_unix_ms = moat_now_unix_ms();
	vmd_lifetime_init(&sb->life, req->timeout_s, req->idle_timeout_s,
	    sb->created_unix_ms);
	sb->dir = moat_asprintf("%s/vms/%s", vmd->cfg.state_dir, sb->id.str);
	sb->image = strdup(image);
	sb->tenant = strdup(req->tenant ? req->tenant : "");
	sb->test_mode = test_mode ? strdup(test_mode) : NULL;
	oom = !sb->dir || !sb->image || !sb->tenant ||
	    (test_mode && !sb->test_mode);
	{
		char *err = NULL; /* validated before: only memory fails */

		if (vmd_egress_request_policy(req->network, &sb->egress_policy,
		        &err) != MOAT_OK)
			oom = true;
		free(err);
	}
	if (req->n_labels > 0) {
		sb->label_keys = calloc(req->n_labels, sizeof(char *));
		sb->label_values = calloc(req->n_labels, sizeof(char *));
		oom = oom || !sb->label_keys || !sb->label_values;
		for (size_t i = 0; !oom && i < req->n_labels; i++) {
			sb->label_keys[i] = strdup(req->labels[i]->key);
			sb->label_values[i] = strdup(req->labels[i]->value);
			sb->n_labels = i + 1;
			oom = !sb->label_keys[i] || !sb->label_values[i];
		}
	}
	sb->refs = 1;
	if (oom) {
		vmd_sandbox_free(sb);
		return NULL;
	}
	return sb;
}

void
vmd_sandbox_teardown(struct sandbox *sb, const char *why)
{
	int err;

	vmd_sandbox_vmm_teardown(sb, false, why);
	if ((err = moat_rm_rf(sb->dir)) != 0)
		moat_warn(0, "sandbox %s: cannot remove %s: %s", sb->id.str,
		    sb->dir, strerror(err));
	vmd_sandbox_unreserve(sb);
}

void
vmd_sandbox_unlist(struct sandbox *sb)
{
	struct vmd *vmd = sb->vmd;
	struct sandbox **pp;
	bool drop = false;

	pthread_mutex_lock(&vmd->mu);
	for (pp = &vmd->sandboxes; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == sb) {
			*pp = sb->next;
			sb->listed = false;
			drop = true;
			break;
		}
	}
	pthread_mutex_unlock(&vmd->mu);
	if (drop)
		vmd_sandbox_put(sb);
}

void
vmd_sandbox_list_locked(struct sandbox *sb)
{
	struct vmd *vmd = sb->vmd;

	sb->listed = true;
	sb->refs++;
	sb->next = vmd->sandboxes;
	vmd->sandboxes = sb;
}

bool
vmd_sandbox_swap_in(struct vmd *vmd, struct sandbox *old, struct sandbox *sb)
{
	struct sandbox **pp;

	pthread_mutex_lock(&vmd->mu);
	for (pp = &vmd->sandboxes; *pp != NULL && *pp != old;
	     pp = &(*pp)->next)
		;
	if (*pp == NULL || vmd->shutting_down) {
		pthread_mutex_unlock(&vmd->mu);
		return false;
	}
	/* The table's reference moves from old to sb. */
	sb->next = old->next;
	*pp = sb;
	sb->listed = true;
	sb->refs++;
	old->listed = false;
	pthread_mutex_unlock(&vmd->mu);
	return true;
}

void
vmd_sandbox_destroy_hidden(struct sandbox *sb)
{
	if (sb == NULL)
		return;
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_DESTROY);
	pthread_mutex_unlock(&sb->mu);
	vmd_sandbox_teardown(sb, "the template VM is done");
	vmd_sandbox_put(sb);
}

void
vmd_sandbox_abort(struct sandbox *sb)
{
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_DESTROY);
	if (sb->vmm.pid > 0 && !sb->vmm_exited)
		sb->vmd->vmm->stop(&sb->vmm, true);
	pthread_mutex_unlock(&sb->mu);
}

/* ---- destroy ---- */

/* Unlists `id` and tears it down. Returns MOAT_OK or MOAT_NOT_FOUND. */
static int
sandbox_destroy(struct vmd *vmd, const char *id, uint64_t request_id)
{
	struct sandbox *sb;
	struct sandbox **pp;

	pthread_mutex_lock(&vmd->mu);
	for (pp = &vmd->sandboxes; *pp != NULL; pp = &(*pp)->next)
		if (strcmp((*pp)->id.str, id) == 0)
			break;
	if ((sb = *pp) == NULL) {
		pthread_mutex_unlock(&vmd->mu);
		return MOAT_NOT_FOUND;
	}
	/* The table's reference becomes ours. */
	*pp = sb->next;
	sb->listed = false;
	pthread_mutex_unlock(&vmd->mu);
	vmd_sandbox_destroy_unlisted(sb, request_id);
	vmd_sandbox_put(sb);
	return MOAT_OK;
}

void
vmd_sandbox_destroy_unlisted(struct sandbox *sb, uint64_t request_id)
{
	struct vmd *vmd = sb->vmd;
	bool creating;

	pthread_mutex_lock(&sb->mu);
	creating = sb->lifecycle == SANDBOX_BOOTING ||
	    sb->lifecycle == SANDBOX_ABORTING;
	(void)vmd_sandbox_step(sb, SANDBOX_EV_DESTROY);
	if (creating) {
		/* The creating thread owns the VMM until it gives up; make
		 * it give up now and wait until it has cleaned up. */
		if (sb->vmm.pid > 0 && !sb->vmm_exited)
			vmd->vmm->stop(&sb->vmm, true);
		while (sb->lifecycle != SANDBOX_STOPPED)
			pthread_cond_wait(&sb->cv, &sb->mu);
		pthread_mutex_unlock(&sb->mu);
	} else {
		pthread_mutex_unlock(&sb->mu);
		vmd_sandbox_teardown(sb, "the sandbox was destroyed");
	}
	moat_info(request_id, "sandbox %s: destroyed", sb->id.str);
}

int
vmd_sandbox_destroy_id(struct vmd *vmd, const char *id, uint64_t request_id)
{
	return sandbox_destroy(vmd, id, request_id);
}

int
vmd_sandbox_destroy(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id)
{
	struct sandbox *sb;
	int rv;

	/* The tenant check is the lookup's; ids are never reused, so the
	 * sandbox unlisted next is the one checked here. */
	if ((rv = vmd_sandbox_get(vmd, call, id, &sb)) != MOAT_OK)
		return rv;
	vmd_sandbox_put(sb);
	if (sandbox_destroy(vmd, id, call->request_id) == MOAT_NOT_FOUND)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "sandbox %s not "
		    "found (moat sandbox ls lists sandboxes)",
		    id);
	return MOAT_OK;
}

void
vmd_sandbox_destroy_all(struct vmd *vmd)
{
	for (;;) {
		struct sandbox_id id;

		pthread_mutex_lock(&vmd->mu);
		vmd->shutting_down = true;
		if (vmd->sandboxes == NULL) {
			pthread_mutex_unlock(&vmd->mu);
			return;
		}
		id = vmd->sandboxes->id;
		pthread_mutex_unlock(&vmd->mu);
		(void)sandbox_destroy(vmd, id.str, 0);
	}
}

/* ---- reporting ---- */

/* timings_to_proto: *out, a new CreateTimings of `tm` (heap; freed with
 * the message). */
static int
timings_to_proto(const struct vmd_create_timings *tm,
    Moat__V1__CreateTimings **out)
{
	Moat__V1__CreateTimings *t = malloc(sizeof(*t));

	if (t == NULL)
		return MOAT_INTERNAL;
	moat__v1__create_timings__init(t);
	if ((t->kind = strdup(tm->kind)) == NULL) {
		free(t);
		return MOAT_INTERNAL;
	}
	t->total_ms = tm->total_ms;
	t->prepare_ms = tm->prepare_ms;
	t->admit_ms = tm->admit_ms;
	t->disk_ms = tm->disk_ms;
	t->vmm_spawn_ms = tm->vmm_spawn_ms;
	t->agent_connect_ms = tm->agent_connect_ms;
	t->qmp_wait_ms = tm->vmm.qmp_wait_ms;
	t->ram_copy_ms = tm->vmm.ram_copy_ms;
	t->ram_wait_ms = tm->vmm.ram_wait_ms;
	t->device_load_ms = tm->vmm.device_load_ms;
	t->resume_ms = tm->vmm.resume_ms;
	t->reset_ms = tm->reset_ms;
	t->boot_wait_ms = tm->boot_wait_ms;
	t->finish_ms = tm->finish_ms;
	*out = t;
	return MOAT_OK;
}

int
vmd_sandbox_to_proto(struct sandbox *sb, Moat__V1__Sandbox *msg)
{
	struct vmd *vmd = sb->vmd;

	pthread_mutex_lock(&sb->mu);
	msg->state = vmd_sandbox_api_state(sb);
	msg->boot_ms = sb->boot_ms;
	msg->vmm_pid = sb->vmm_exited ? 0 : sb->vmm.pid;
	msg->running_execs = sb->execs_running;
	msg->paused = sb->paused_for_move;
	msg->accel = strdup(sb->accel);
	msg->failure_reason =
	    strdup(sb->failure_reason ? sb->failure_reason : "");
	msg->expires_unix_ms = sb->life.expires_unix_ms;
	msg->idle_timeout_s = sb->life.idle_timeout_s;
	msg->last_active_unix_ms =
	    __atomic_load_n(&sb->life.last_active_unix_ms, __ATOMIC_RELAXED);
	if (sb->timings.kind != NULL && sb->timings.total_ms > 0 &&
	    timings_to_proto(&sb->timings, &msg->timings) != MOAT_OK) {
		pthread_mutex_unlock(&sb->mu);
		return MOAT_INTERNAL;
	}
	pthread_mutex_unlock(&sb->mu);
	msg->id = strdup(sb->id.str);
	msg->node_id = strdup(vmd->cfg.node_id);
	msg->vcpus = sb->vcpus;
	msg->memory_mib = sb->memory_mib;
	msg->image = strdup(sb->image);
	msg->scratch_mib = sb->scratch_mib;
	msg->driver = strdup(vmd->vmm->name);
	msg->created_unix_ms = sb->created_unix_ms;
	msg->tenant = strdup(sb->tenant);
	msg->template_id = strdup(sb->template_id ? sb->template_id : "");
	msg->restored_from =
	    strdup(sb->restored_from ? sb->restored_from : "");
	msg->pulled_bytes = sb->pulled_bytes;
	msg->adoptions = sb->adoptions;
	if ((msg->network = vmd_egress_to_proto(sb->egress_policy)) == NULL ||
	    (msg->isolation = strdup(vmd_jail_isolation())) == NULL)
		return MOAT_INTERNAL;
	if (!msg->accel || !msg->failure_reason || !msg->id || !msg->node_id ||
	    !msg->image || !msg->driver || !msg->tenant || !msg->template_id ||
	    !msg->restored_from)
		return MOAT_INTERNAL;
	if (sb->n_labels > 0) {
		msg->labels = calloc(sb->n_labels, sizeof(*msg->labels));
		if (msg->labels == NULL)
			return MOAT_INTERNAL;
		for (size_t i = 0; i < sb->n_labels; i++) {
			Moat__V1__Sandbox__LabelsEntry *e = malloc(sizeof(*e));
			if (e == NULL)
				return MOAT_INTERNAL;
			moat__v1__sandbox__labels_entry__init(e);
			msg->labels[i] = e;
			msg->n_labels = i + 1;
			e->key = strdup(sb->label_keys[i]);
			e->value = strdup(sb->label_values[i]);
			if (e->key == NULL || e->value == NULL)
				return MOAT_INTERNAL;
		}
	}
	return MOAT_OK;
}
