/*
 * lifetime.c: sandbox lifetimes (lifetime.h): the pure expiry rules, the
 * expiry thread and the SetTimeout RPC. Not for: how a destroy works
 * (sandbox.c) or the state file's format (adopt_state.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "adopt.h"
#include "lifetime.h"
#include "metrics.h"
#include "node.h"
#include "sandbox.h"
#include "sync.h"

#define LIFETIME_TICK_MS 250u
#define LIFETIME_BATCH 64u /* sandboxes destroyed per pass at most */

/* ---- the expiry thread ---- */

struct vmd_lifetime_node {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
};

/* One due sandbox: what the pass found under the locks. */
struct due {
	struct sandbox_id id;
	enum vmd_expiry why;
	uint64_t idle_s;
};

/* The sandboxes due now (at most LIFETIME_BATCH); a running exec is
 * activity. Booting sandboxes wait until they run or fail. */
static size_t
collect_due(struct vmd *vmd, struct due *out)
{
	uint64_t now = moat_now_unix_ms();
	size_t n = 0;

	pthread_mutex_lock(&vmd->mu);
	for (struct sandbox *sb = vmd->sandboxes;
	     sb != NULL && n < LIFETIME_BATCH; sb = sb->next) {
		enum vmd_expiry e;
		bool busy;

		pthread_mutex_lock(&sb->mu);
		busy = sb->execs_running > 0;
		if (busy)
			vmd_lifetime_touch(&sb->life, now);
		e = vmd_sandbox_api_state(sb) ==
		        MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING ?
		    VMD_EXPIRY_NONE :
		    vmd_lifetime_due(&sb->life, busy, now);
		if (e != VMD_EXPIRY_NONE) {
			out[n].id = sb->id;
			out[n].why = e;
			out[n].idle_s = sb->life.idle_timeout_s;
			n++;
		}
		pthread_mutex_unlock(&sb->mu);
	}
	pthread_mutex_unlock(&vmd->mu);
	return n;
}

static void *
expiry_main(void *arg)
{
	struct vmd *vmd = arg;
	struct vmd_lifetime_node *ln = vmd->lifetime;
	struct due due[LIFETIME_BATCH];

	pthread_mutex_lock(&ln->mu);
	while (!ln->stop) {
		size_t n;

		pthread_mutex_unlock(&ln->mu);
		n = collect_due(vmd, due);
		for (size_t i = 0; i < n; i++) {
			if (due[i].why == VMD_EXPIRY_IDLE)
				moat_info(0,
				    "sandbox %s expired: idle for %" PRIu64
				    " s (its idle timeout); destroying it "
				    "(its sessions and snapshots stay)",
				    due[i].id.str, due[i].idle_s);
			else
				moat_info(0,
				    "sandbox %s expired: its timeout "
				    "passed; destroying it (its sessions and "
				    "snapshots stay)",
				    due[i].id.str);
			if (vmd_sandbox_destroy_id(vmd, due[i].id.str, 0) ==
			    MOAT_OK)
				vmd_metrics_expired(
				    due[i].why == VMD_EXPIRY_IDLE);
		}
		pthread_mutex_lock(&ln->mu);
		if (!ln->stop)
			(void)vmd_cond_wait_until(&ln->cv, &ln->mu,
			    moat_rpc_now_ms() + LIFETIME_TICK_MS);
	}
	pthread_mutex_unlock(&ln->mu);
	return NULL;
}

int
vmd_lifetime_start(struct vmd *vmd)
{
	struct vmd_lifetime_node *ln = calloc(1, sizeof(*ln));
	int err;

	if (ln == NULL)
		return ENOMEM;
	pthread_mutex_init(&ln->mu, NULL);
	vmd_cond_init(&ln->cv);
	vmd->lifetime = ln;
	if ((err = vmd_thread_create(&ln->thread, expiry_main, vmd)) != 0) {
		moat_warn(0,
		    "cannot start the expiry thread: %s (no sandbox "
		    "times out until vmd restarts)",
		    strerror(err));
		vmd->lifetime = NULL;
		pthread_cond_destroy(&ln->cv);
		pthread_mutex_destroy(&ln->mu);
		free(ln);
	}
	return err;
}

void
vmd_lifetime_stop(struct vmd *vmd)
{
	struct vmd_lifetime_node *ln = vmd->lifetime;

	if (ln == NULL)
		return;
	pthread_mutex_lock(&ln->mu);
	ln->stop = true;
	pthread_cond_broadcast(&ln->cv);
	pthread_mutex_unlock(&ln->mu);
	pthread_join(ln->thread, NULL);
	vmd->lifetime = NULL;
	pthread_cond_destroy(&ln->cv);
	pthread_mutex_destroy(&ln->mu);
	free(ln);
}

/* ---- SetTimeout ---- */

int
vmd_lifetime_set_timeout(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SetTimeoutRequest *req, Moat__V1__Sandbox *reply)
{
	struct sandbox *sb;
	const char *why;
	int rv;

	if (vmd_lifetime_check_request(req->timeout_s, req->idle_timeout_s,
	        req->clear_idle_timeout, &why) != MOAT_OK)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "%s", why);
	if ((rv = vmd_sandbox_get(vmd, call, req->sandbox_id, &sb)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	vmd_lifetime_set(&sb->life, req->timeout_s, req->idle_timeout_s,
	    req->clear_idle_timeout, moat_now_unix_ms());
	pthread_mutex_unlock(&sb->mu);
	(void)vmd_adopt_save(sb);
	moat_info(call->request_id,
	    "sandbox %s: SetTimeout timeout_s %" PRIu32
	    " idle_timeout_s %" PRIu32 "%s",
	    sb->id.str, req->timeout_s, req->idle_timeout_s,
	    req->clear_idle_timeout ? " (idle timeout cleared)" : "");
	rv = vmd_sandbox_to_proto(sb, reply);
	vmd_sandbox_put(sb);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	return MOAT_OK;
}
