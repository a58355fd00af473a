/*
 * travel.c: time travel through recorded sessions (issue 3) and the
 * persistent code contexts' calls (issue 4), answered by the gateway:
 * RestoreStep brings a sandbox back to the state after one step from
 * that step's snapshot (in place, or as a new sandbox) and starts a
 * branch session there; Fork makes up to 16 such sandboxes at once, each
 * with its own branch; Replay re-runs a session's inputs in a fresh
 * recorded sandbox and says which steps came out the same. RunCode is
 * recorded as a CODE step like Exec; a client's SnapshotSandbox on a
 * MANUAL session becomes its latest step's snapshot. Restores never
 * replay: a step without a snapshot cannot be restored, and the error
 * says which steps can.
 * Not for: recording itself (record.c), Diff and Compare (they only read
 * sessions), the node's side of snapshots (services/vm/).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define TRAVEL_FORK_MAX 16

static struct moat_travel
parts(struct moat_rpc_call *call)
{
	struct moat_travel t;

	moat_gateway_travel(call->service_ctx, &t);
	t.tenant = moat_gw_tenant(call);
	return t;
}

/* fail: replies `rv` with *msg (freed). */
static int
fail(struct moat_rpc_call *call, int rv, char *msg)
{
	rv = moat_rpc_error(call, rv, "%s", msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

/* get_session: the tenant's session; NOT_FOUND passes through. */
static int
get_session(struct moat_travel *t, const char *session_id, uint64_t deadline,
    Moat__V1__SessionInfo **out, char **errmsg)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;

	if (session_id == NULL || session_id[0] == '\0') {
		*errmsg = moat_asprintf("session_id is required: `moat "
		                        "session ls` lists the sessions");
		return MOAT_INVALID_ARGUMENT;
	}
	req.tenant = (char *)t->tenant;
	req.session_id = (char *)session_id;
	return moat_record_sessiond(t->rec, "GetSession", &req.base,
	    &moat__v1__session_info__descriptor, (ProtobufCMessage **)out,
	    deadline, errmsg);
}

static const char *
policy_word(Moat__V1__SnapshotPolicy p)
{
	return p == MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY ?
	    "every" :
	    p == MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_NONE ? "none" :
	                                                           "manual";
}

/* The steps nearest to one that has no snapshot which do have one, and
 * (the first of) all that have one. */
struct nearest {
	bool has_before, has_after;
	uint64_t before, after;
	char all[256];
	size_t used;
};

static void
nearest_add(struct nearest *n, uint64_t index)
{
	if (n->used >= sizeof(n->all) - 24) {
		if (n->used < sizeof(n->all) - 4)
			n->used += (size_t)snprintf(n->all + n->used,
			    sizeof(n->all) - n->used, ", ...");
		return;
	}
	n->used += (size_t)snprintf(n->all + n->used, sizeof(n->all) - n->used,
	    "%s%llu", n->used ? ", " : "", (unsigned long long)index);
}

/* nearest_find: scans the session's steps (without outputs) for the
 * nearest with a snapshot on either side of `step`, and lists those that
 * have one (step 0 counts when the session has its snapshot). */
static void
nearest_find(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    uint64_t step, uint64_t deadline, struct nearest *n)
{
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__ListStepsReply *page = NULL;
	char step0[MOAT_ID_MAX], *token = NULL, *msg = NULL;

	memset(n, 0, sizeof(*n));
	/* A branch's own step 0 is its branch point's state, not step 0
	 * of its path (issue 18): only a root's counts. */
	if (s->first_step <= 1 &&
	    (moat_record_session_step0(s) != NULL ||
	        moat_record_step0(t->rec, s->id, step0, sizeof(step0)))) {
		n->has_before = step > 0;
		nearest_add(n, 0);
	}
	req.tenant = (char *)t->tenant;
	req.session_id = s->id;
	req.page_size = 1000;
	do {
		req.page_token = token != NULL ? token : (char *)"";
		if (moat_record_sessiond(t->rec, "ListSteps", &req.base,
		        &moat__v1__list_steps_reply__descriptor,
		        (ProtobufCMessage **)&page, deadline,
		        &msg) != MOAT_OK) {
			free(msg);
			break;
		}
		for (size_t i = 0; i < page->n_steps; i++) {
			uint64_t idx = page->steps[i]->index;

			if (page->steps[i]->snapshot_id[0] == '\0')
				continue;
			nearest_add(n, idx);
			if (idx < step) {
				n->has_before = true;
				n->before = idx;
			} else if (idx > step && !n->has_after) {
				n->has_after = true;
				n->after = idx;
			}
		}
		free(token);
		token = page->next_page_token[0] ?
		    strdup(page->next_page_token) :
		    NULL;
		moat__v1__list_steps_reply__free_unpacked(page, NULL);
	} while (token != NULL);
	free(token);
}

/* no_snapshot_message: FAILED_PRECONDITION's message for `step` of s
 * (`removed`: why its snapshot is gone, "" : it never had one): the
 * nearest steps that have one, or how to get some. */
static char *
no_snapshot_message(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    uint64_t step, const char *removed, uint64_t deadline)
{
	struct nearest n;
	char before[48] = "", after[48] = "", why[160] = "";

	nearest_find(t, s, step, deadline, &n);
	if (removed != NULL && removed[0] != '\0')
		snprintf(why, sizeof(why), ": it was %s", removed);
	if (n.has_before)
		snprintf(before, sizeof(before), "%llu (before it)",
		    (unsigned long long)n.before);
	if (n.has_after)
		snprintf(after, sizeof(after), "%llu (after it)",
		    (unsigned long long)n.after);
	if (n.has_before || n.has_after)
		return moat_asprintf(
		    "step %llu of session %s has no "
		    "snapshot%s; the nearest steps that %shave one: "
		    "%s%s%s (steps with one: %s; `moat restore SANDBOX --step "
		    "N --session %s`)",
		    (unsigned long long)step, s->id, why,
		    why[0] ? "still " : "", before,
		    n.has_before && n.has_after ? " and " : "", after, n.all,
		    s->id);
	return moat_asprintf(
	    "step %llu of session %s has no snapshot%s, nor "
	    "does any of its steps: its snapshot policy is %s; take one after "
	    "a step with `moat snapshot create %s` (policy manual), or record "
	    "with `moat sandbox create --record --snapshot every`",
	    (unsigned long long)step, s->id, why,
	    policy_word(s->snapshot_policy), s->sandbox_id);
}

#define PATH_MAX_DEPTH 64 /* as sessiond's SESSIOND_PATH_MAX_DEPTH */

/* path_root: the session whose step 0 is step 0 of s's path (issue 18):
 * s, or the first ancestor that holds its steps from 1. On MOAT_OK *root
 * is the caller's (NULL: s itself). */
static int
path_root(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    uint64_t deadline, Moat__V1__SessionInfo **root, char **errmsg)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;
	const Moat__V1__SessionInfo *cur = s;
	Moat__V1__SessionInfo *next = NULL;
	int rv;

	*root = NULL;
	for (int depth = 0; cur->first_step > 1; depth++) {
		if (depth >= PATH_MAX_DEPTH) {
			*errmsg = moat_asprintf(
			    "step 0 of session %s: its path goes back "
			    "through more than %d sessions; restore a later "
			    "step",
			    s->id, PATH_MAX_DEPTH);
			rv = MOAT_FAILED_PRECONDITION;
			goto fail;
		}
		req.tenant = (char *)t->tenant;
		req.session_id = cur->parent_session_id;
		next = NULL;
		if ((rv = moat_record_sessiond(t->rec, "GetSession", &req.base,
		         &moat__v1__session_info__descriptor,
		         (ProtobufCMessage **)&next, deadline, errmsg)) !=
		    MOAT_OK)
			goto fail;
		if (*root != NULL)
			moat__v1__session_info__free_unpacked(*root, NULL);
		*root = next;
		cur = next;
	}
	return MOAT_OK;
fail:
	if (*root != NULL)
		moat__v1__session_info__free_unpacked(*root, NULL);
	*root = NULL;
	return rv;
}

/* step_snapshot: the snapshot of `step` of s into snap (MOAT_ID_MAX).
 * NOT_FOUND for a step past the end; FAILED_PRECONDITION when the step
 * has none (any more). */
static int
step_snapshot(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    uint64_t step, uint64_t deadline, char *snap, char **errmsg)
{
	Moat__V1__GetStepRequest req = MOAT__V1__GET_STEP_REQUEST__INIT;
	Moat__V1__Step *st = NULL;
	Moat__V1__SessionInfo *root = NULL;
	const char *label;
	char removed[160] = "";
	int rv;

	snap[0] = '\0';
	/* Step 0 of a branch's path is its root's (issue 18). */
	if (step == 0 && s->first_step > 1) {
		if ((rv = path_root(t, s, deadline, &root, errmsg)) != MOAT_OK)
			return rv;
		rv = step_snapshot(t, root, 0, deadline, snap, errmsg);
		moat__v1__session_info__free_unpacked(root, NULL);
		return rv;
	}
	/* The branch point's state is also the branch's own step 0 (its
	 * label): read there, so a branch whose parent was deleted still
	 * restores it. */
	if (step > 0 && s->first_step > 1 && step == s->first_step - 1 &&
	    (label = moat_record_session_step0(s)) != NULL) {
		snprintf(snap, MOAT_ID_MAX, "%s", label);
		return MOAT_OK;
	}
	if (step > s->step_count) {
		*errmsg = moat_asprintf(
		    "step %llu of session %s not found: "
		    "it has steps 1..%llu (0: the state before step 1)",
		    (unsigned long long)step, s->id,
		    (unsigned long long)s->step_count);
		return MOAT_NOT_FOUND;
	}
	if (step == 0) {
		if ((label = moat_record_session_step0(s)) != NULL)
			snprintf(snap, MOAT_ID_MAX, "%s", label);
		else
			(void)moat_record_step0(t->rec, s->id, snap,
			    MOAT_ID_MAX);
		if ((label = moat_record_session_label(s,
		         MOAT_RECORD_STEP0_REMOVED_LABEL)) != NULL)
			snprintf(removed, sizeof(removed), "%s", label);
	} else {
		req.tenant = (char *)t->tenant;
		req.session_id = s->id;
		req.index = step;
		req.omit_outputs = true;
		if ((rv = moat_record_sessiond(t->rec, "GetStep", &req.base,
		         &moat__v1__step__descriptor, (ProtobufCMessage **)&st,
		         deadline, errmsg)) != MOAT_OK)
			return rv;
		snprintf(snap, MOAT_ID_MAX, "%s", st->snapshot_id);
		snprintf(removed, sizeof(removed), "%s",
		    st->snapshot_removed ? st->snapshot_removed : "");
		moat__v1__step__free_unpacked(st, NULL);
	}
	if (snap[0] != '\0')
		return MOAT_OK;
	*errmsg = no_snapshot_message(t, s, step, removed, deadline);
	return MOAT_FAILED_PRECONDITION;
}

/* restore: a sandbox restored from `snap` on target `to` (its node, and
 * the id that node knows the snapshot by), replacing `replace` ("" :
 * none) in place where the node can. On MOAT_OK *out is the caller's and
 * its route is remembered. */
static int
restore(struct moat_travel *t, const char *snap,
    const struct moat_restore_target *to, const char *replace,
    uint64_t deadline, Moat__V1__Sandbox **out, char **errmsg)
{
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	struct moat_sandbox_id sandbox;
	bool pulled = strcmp(to->snapshot_id, snap) != 0;
	char what[2 * MOAT_ID_MAX + 32];
	int rv;

	*out = NULL;
	req.snapshot_id = (char *)to->snapshot_id;
	req.tenant = (char *)t->tenant;
	req.replace_sandbox_id = (char *)replace;
	req.reseed = t->reseed;
	if (pulled)
		snprintf(what, sizeof(what),
		    "snapshot %.100s (moat-snapd's "
		    "%.100s)",
		    snap, to->snapshot_id);
	else
		snprintf(what, sizeof(what), "snapshot %.100s", snap);
	rv = moat_forward_node_call(t->fw, &to->node, t->tenant,
	    "RestoreSandbox", &req.base, &moat__v1__sandbox__descriptor,
	    moat_rpc_new_request_id(), deadline, what,
	    (ProtobufCMessage **)out, errmsg);
	if (rv == MOAT_NOT_FOUND) {
		char *node_msg = *errmsg;

		*errmsg = pulled ?
		    moat_asprintf("snapshot %s (moat-snapd's %s) is no "
		                  "longer in moat-snapd (deleted, or lost): "
		                  "%s; `moat session show` lists the steps "
		                  "that still have one",
		        snap, to->snapshot_id, node_msg ? node_msg : "") :
		    moat_asprintf("snapshot %s is no longer on node %s "
		                  "(deleted, or the node lost it): %s; `moat "
		                  "session show` lists the steps that still "
		                  "have one",
		        snap, to->node.s, node_msg ? node_msg : "");
		free(node_msg);
	}
	if (rv != MOAT_OK)
		return rv;
	if (moat_sandbox_id_set(&sandbox, (*out)->id))
		moat_forward_remember(t->fw, &sandbox, &to->node);
	/* A new sandbox gets the tenant's default lifetime; one restored in
	 * place keeps its own (the node carries it over). */
	if (strcmp((*out)->id, replace) != 0 &&
	    (rv = moat_lifetime_apply(t, &to->node, deadline, out, errmsg)) !=
	        MOAT_OK) {
		moat_warn(0,
		    "sandbox %s restored from %s keeps no timeout: %s",
		    (*out)->id, snap, *errmsg ? *errmsg : "?");
		free(*errmsg);
		*errmsg = NULL;
	}
	moat_inventory_put(t->fw->inv, &to->node, *out);
	if (pulled)
		moat_info(0,
		    "snapshot %s restored on node %s from moat-snapd's "
		    "%s as %s: %llu bytes pulled",
		    snap, to->node.s, to->snapshot_id, (*out)->id,
		    (unsigned long long)(*out)->pulled_bytes);
	return MOAT_OK;
}

/* destroy: best effort; logged when it fails. */
static void
destroy(struct moat_travel *t, const char *sandbox_id, uint64_t request_id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	uint8_t payload[MOAT_ID_MAX + 8], *out = NULL;
	size_t len, out_len = 0;
	uint64_t deadline = moat_rpc_now_ms() + MOAT_RPC_DEFAULT_TIMEOUT_MS;
	char *msg = NULL;
	bool located;

	moat_record_forget(t->rec, sandbox_id);
	ref.sandbox_id = (char *)sandbox_id;
	len = moat__v1__sandbox_ref__get_packed_size(&ref);
	if (!moat_sandbox_id_set(&sandbox, sandbox_id) ||
	    len > sizeof(payload))
		return;
	moat__v1__sandbox_ref__pack(&ref, payload);
	located = moat_forward_locate(t->fw, &sandbox, t->tenant, deadline,
	              &node, &msg) == MOAT_OK;
	if (located && !moat_nodes_is_available(t->nodes, &node)) {
		/* It stays in the node's list: shown UNAVAILABLE. */
		moat_warn(request_id,
		    "sandbox %s not destroyed: its node %s "
		    "does not answer; destroy it when the node is back "
		    "(`moat sandbox rm %s`)",
		    sandbox_id, node.s, sandbox_id);
		free(msg);
		return;
	}
	if (!located ||
	    moat_forward_to_node(t->fw, &node, t->tenant, "DestroySandbox",
	        payload, len, moat_rpc_new_request_id(), deadline,
	        "the replaced sandbox", &out, &out_len, &msg) != MOAT_OK)
		moat_warn(request_id, "sandbox %s not destroyed: %s",
		    sandbox_id, msg ? msg : "");
	else
		moat_inventory_forget(t->fw->inv, sandbox_id);
	moat_forward_forget(t->fw, &sandbox);
	free(out);
	free(msg);
}

/* branch_restore: restores `snap` on target `to`, in place of `replace`
 * ("" : none; a new sandbox when `replace` is on another node than the
 * target, the old one then destroyed). On MOAT_OK *out is the caller's. */
static int
branch_restore(struct moat_travel *t, const char *snap,
    const struct moat_restore_target *to, const char *replace,
    uint64_t request_id, uint64_t deadline, Moat__V1__Sandbox **out,
    char **errmsg)
{
	struct moat_sandbox_id old;
	struct moat_node_id old_node;
	const char *in_place = replace;
	char *msg = NULL;
	int rv;

	/* A node replaces only its own sandboxes. */
	if (replace[0] != '\0' && moat_sandbox_id_set(&old, replace) &&
	    moat_forward_locate(t->fw, &old, t->tenant, deadline, &old_node,
	        &msg) == MOAT_OK &&
	    strcmp(old_node.s, to->node.s) != 0)
		in_place = "";
	free(msg);
	msg = NULL;
	if ((rv = restore(t, snap, to, in_place, deadline, out, errmsg)) !=
	    MOAT_OK)
		return rv;
	if (replace[0] != '\0' && strcmp((*out)->id, replace) != 0) {
		/* The node made a new sandbox instead of replacing: the old
		 * one goes, and the recording moves to the new one. */
		moat_info(request_id,
		    "restore of %s came back as %s on node %s: "
		    "destroying %s",
		    replace, (*out)->id, to->node.s, replace);
		destroy(t, replace, request_id);
	}
	return MOAT_OK;
}

/* travel_quota: the tenant's quotas for `count` new sandboxes restored
 * from `snap` (moat_quota_check), each of the snapshot's vcpus and
 * memory: from its node's list for a local snapshot, from moat-snapd's
 * catalog for one of snapd ("snap-<32 hex>"). One whose node or snapd
 * does not answer counts the defaults (1 vcpu, 256 MiB); the size is
 * only looked up when the tenant has a vcpu or memory limit. */
static int
travel_quota(struct moat_travel *t, const char *snap, uint32_t count,
    uint64_t deadline, struct moat_quota_hold *hold, char **errmsg)
{
	Moat__V1__LocalSnapshotList *list = NULL;
	struct moat_node_id node;
	uint32_t vcpus = 0, memory_mib = 0;
	uint64_t max[3];
	char *msg = NULL;

	bool sized =
	    moat_admission_limits(t->adm, t->tenant, max, &msg) == MOAT_OK &&
	    (max[1] != 0 || max[2] != 0);

	if (!sized) {
		/* sandboxes only (or no limit): the size does not matter */
	} else if (!moat_snapshot_node(snap, &node)) {
		(void)moat_travel_snapd_size(t, snap, deadline, &vcpus,
		    &memory_mib);
	} else if (moat_nodes_is_available(t->nodes, &node) &&
	    moat_snapshots_node_list(t->fw, &node, t->tenant, deadline, &list,
	        &msg) == MOAT_OK) {
		for (size_t i = 0; i < list->n_snapshots; i++)
			if (strcmp(list->snapshots[i]->snapshot_id, snap) ==
			    0) {
				vcpus = list->snapshots[i]->vcpus;
				memory_mib = list->snapshots[i]->memory_mib;
			}
		moat__v1__local_snapshot_list__free_unpacked(list, NULL);
	}
	free(msg);
	return moat_quota_check(t->adm, t->tenant, count, vcpus, memory_mib,
	    deadline, hold, errmsg);
}

/* replaced_node: the node of the sandbox a restore in place replaces
 * (`id`; "" or not found: "", placement picks), so the restore lands
 * there and the sandbox keeps its id rather than coming back as a new
 * one on another node. `where` holds the answer. */
static const char *
replaced_node(struct moat_travel *t, const char *id, uint64_t deadline,
    struct moat_node_id *where)
{
	struct moat_sandbox_id sandbox;
	char *msg = NULL;
	bool found;

	if (id[0] == '\0' || !moat_sandbox_id_set(&sandbox, id))
		return "";
	found = moat_forward_locate(t->fw, &sandbox, t->tenant, deadline,
	            where, &msg) == MOAT_OK &&
	    moat_nodes_is_available(t->nodes, where);
	free(msg);
	return found ? where->s : "";
}

int
moat_travel_restore_sandbox(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct moat_travel t = parts(call);
	struct moat_node_id where;
	const Moat__V1__RestoreSandboxRequest *req =
	    (const Moat__V1__RestoreSandboxRequest *)request;
	struct moat_restore_target to;
	struct moat_quota_hold hold = { .handle = 0 };
	Moat__V1__Sandbox *sb = NULL;
	char *msg = NULL;
	size_t len;
	int rv;

	(void)reply;
	t.reseed = req->reseed;
	if (req->snapshot_id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "RestoreSandbox: snapshot_id is required: "
		    "ListLocalSnapshots lists them");
	if (strlen(req->snapshot_id) >= MOAT_ID_MAX ||
	    strncmp(req->snapshot_id, "snap-", 5) != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "snapshot %.80s "
		    "not found: it is not a snapshot id (\"snap-<node>-...\" "
		    "or moat-snapd's \"snap-<32 hex>\")",
		    req->snapshot_id);
	/* Only the tenant's own snapshots: the node checks it. A restore
	 * that replaces no sandbox makes one more (the tenant's quota). */
	if ((req->replace_sandbox_id[0] == '\0' &&
	        (rv = travel_quota(&t, req->snapshot_id, 1, call->deadline_ms,
	             &hold, &msg)) != MOAT_OK) ||
	    (rv = moat_travel_place(&t, req->snapshot_id,
	         replaced_node(&t, req->replace_sandbox_id, call->deadline_ms,
	             &where),
	         1, call->deadline_ms, &to, &msg)) != MOAT_OK ||
	    (rv = branch_restore(&t, req->snapshot_id, &to,
	         req->replace_sandbox_id, call->request_id, call->deadline_ms,
	         &sb, &msg)) != MOAT_OK) {
		moat_quota_release(t.adm, t.tenant, &hold);
		return fail(call, rv, msg);
	}
	moat_quota_landed(t.adm, t.tenant, &hold, (const char *const *)&sb->id,
	    1);
	len = moat__v1__sandbox__get_packed_size(sb);
	if ((call->raw_reply = malloc(len ? len : 1)) == NULL) {
		moat__v1__sandbox__free_unpacked(sb, NULL);
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	}
	moat__v1__sandbox__pack(sb, call->raw_reply);
	call->raw_reply_len = len;
	moat__v1__sandbox__free_unpacked(sb, NULL);
	return MOAT_OK;
}

/* branch_record: the restored sandbox *out records from now on into a
 * new branch session of (s, step), whose id goes to session_id (and
 * (*out)->session_id). `base_trace`: the restored state's fs trace when
 * known (NULL: traced here). On failure *out is freed and NULL (the
 * sandbox itself is left running). */
static int
branch_record(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    uint64_t step, const char *snap, const Moat__V1__FsTrace *base_trace,
    uint64_t request_id, uint64_t deadline, Moat__V1__Sandbox **out,
    char *session_id, char **errmsg)
{
	struct moat_record_origin origin = {
		.policy = s->snapshot_policy,
		.parent_session_id = s->id,
		.parent_step = step,
		.base_snapshot = snap,
		.base_trace = base_trace,
	};
	char *msg = NULL;
	int rv;

	if ((rv = moat_record_begin(t->rec, t->tenant, (*out)->id, &origin,
	         request_id, deadline, session_id, MOAT_ID_MAX, &msg)) !=
	    MOAT_OK) {
		*errmsg = moat_asprintf(
		    "sandbox %s was restored from %s but "
		    "does not record: %s (destroy it, or restore again once "
		    "moat-sessiond answers)",
		    (*out)->id, snap, msg);
		free(msg);
		moat__v1__sandbox__free_unpacked(*out, NULL);
		*out = NULL;
		return rv;
	}
	if (!moat_sandbox_set_session(*out, session_id)) {
		moat__v1__sandbox__free_unpacked(*out, NULL);
		*out = NULL;
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	moat_info(request_id,
	    "sandbox %s restored to step %llu of %s; "
	    "records into branch %s",
	    (*out)->id, (unsigned long long)step, s->id, session_id);
	return MOAT_OK;
}

/* branch: branch_restore, then branch_record. */
static int
branch(struct moat_travel *t, const Moat__V1__SessionInfo *s, uint64_t step,
    const char *snap, const struct moat_restore_target *to,
    const char *replace, uint64_t request_id, uint64_t deadline,
    Moat__V1__Sandbox **out, char *session_id, char **errmsg)
{
	int rv;

	if ((rv = branch_restore(t, snap, to, replace, request_id, deadline,
	         out, errmsg)) != MOAT_OK)
		return rv;
	return branch_record(t, s, step, snap, NULL, request_id, deadline, out,
	    session_id, errmsg);
}

/* session_of_request: the session a RestoreStep names into session_id
 * (MOAT_ID_MAX): session_id when given, else the latest session of
 * `sandbox_id` (a sandbox id in its place: found in sessiond by
 * sandbox). Errors go through moat_rpc_error. */
static int
session_of_request(struct moat_travel *t, const char *session_id,
    const char *sandbox_id, struct moat_rpc_call *call, char *out)
{
	if (session_id[0] != '\0') {
		snprintf(out, MOAT_ID_MAX, "%s", session_id);
		return MOAT_OK;
	}
	if (sandbox_id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "session_id "
		    "(or sandbox_id) is required: `moat session ls` lists the "
		    "sessions");
	if (moat_record_session_lookup(t->rec, t->tenant, sandbox_id,
	        call->request_id, out, MOAT_ID_MAX))
		return MOAT_OK;
	return moat_rpc_error(call, MOAT_NOT_FOUND,
	    "sandbox %s has no "
	    "recorded session: give one with session_id (`moat session ls` "
	    "lists them)",
	    sandbox_id);
}

/* The steps of a session that have a snapshot, oldest first. */
struct snapped {
	uint64_t *index;
	char (*snap)[MOAT_ID_MAX];
	size_t n, cap;
};

static bool
snapped_add(struct snapped *sn, uint64_t index, const char *snap)
{
	if (sn->n == sn->cap) {
		size_t cap = sn->cap ? sn->cap * 2 : 32;
		uint64_t *ix = realloc(sn->index, cap * sizeof(*ix));
		char(*sp)[MOAT_ID_MAX];

		if (ix == NULL)
			return false;
		sn->index = ix;
		if ((sp = realloc(sn->snap, cap * sizeof(*sp))) == NULL)
			return false;
		sn->snap = sp;
		sn->cap = cap;
	}
	sn->index[sn->n] = index;
	snprintf(sn->snap[sn->n], MOAT_ID_MAX, "%s", snap);
	sn->n++;
	return true;
}

/* snapped_list: every step of s with a snapshot (step 0 included). */
static int
snapped_list(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    uint64_t deadline, struct snapped *sn, char **errmsg)
{
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__ListStepsReply *page = NULL;
	const char *label = moat_record_session_step0(s);
	char step0[MOAT_ID_MAX], *token = NULL;
	int rv = MOAT_OK;

	/* A branch's own step 0 is the state at its branch point, listed
	 * with its parent's step there (issue 18): only a root's counts. */
	if (s->first_step <= 1) {
		if (label != NULL)
			(void)snapped_add(sn, 0, label);
		else if (moat_record_step0(t->rec, s->id, step0,
		             sizeof(step0)))
			(void)snapped_add(sn, 0, step0);
	}
	req.tenant = (char *)t->tenant;
	req.session_id = s->id;
	req.page_size = 1000;
	do {
		req.page_token = token != NULL ? token : (char *)"";
		if ((rv = moat_record_sessiond(t->rec, "ListSteps", &req.base,
		         &moat__v1__list_steps_reply__descriptor,
		         (ProtobufCMessage **)&page, deadline, errmsg)) !=
		    MOAT_OK)
			break;
		for (size_t i = 0; i < page->n_steps; i++)
			if (page->steps[i]->snapshot_id[0] != '\0' &&
			    !snapped_add(sn, page->steps[i]->index,
			        page->steps[i]->snapshot_id))
				rv = MOAT_RESOURCE_EXHAUSTED;
		free(token);
		token = page->next_page_token[0] ?
		    strdup(page->next_page_token) :
		    NULL;
		moat__v1__list_steps_reply__free_unpacked(page, NULL);
	} while (token != NULL && rv == MOAT_OK);
	free(token);
	if (rv == MOAT_RESOURCE_EXHAUSTED)
		*errmsg = moat_asprintf("out of memory");
	return rv;
}

/* restorable: whether `snap` can be restored now (on `node`, "" : any):
 * its own node answers (and is the one asked for), or moat-snapd has a
 * copy. */
static bool
restorable(struct moat_travel *t, const char *snap, const char *node,
    uint64_t deadline)
{
	struct moat_node_id own;
	char remote[MOAT_ID_MAX], *msg = NULL;
	bool ok;

	if (moat_snapshot_node(snap, &own) &&
	    moat_nodes_is_available(t->nodes, &own) &&
	    (node == NULL || node[0] == '\0' || strcmp(node, own.s) == 0))
		return true;
	ok = moat_travel_remote_id(t, snap, deadline, remote, &msg) == MOAT_OK;
	free(msg);
	return ok;
}

#define LATEST_TRIES 16 /* steps tried back from the last, at most */

/* latest_step: the last step of s whose snapshot can be restored now
 * (on `node`, "" : any): a snapshot on a node that is down counts only
 * when it reached moat-snapd. Its index to *step, its snapshot to snap
 * (MOAT_ID_MAX). FAILED_PRECONDITION when none can. */
static int
latest_step(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    const char *node, uint64_t deadline, uint64_t *step, char *snap,
    char **errmsg)
{
	struct snapped sn = { 0 };
	size_t tried = 0;
	int rv;

	if ((rv = snapped_list(t, s, deadline, &sn, errmsg)) != MOAT_OK)
		goto out;
	rv = MOAT_FAILED_PRECONDITION;
	for (size_t k = sn.n; k > 0 && tried < LATEST_TRIES; k--, tried++) {
		if (!restorable(t, sn.snap[k - 1], node, deadline))
			continue;
		*step = sn.index[k - 1];
		snprintf(snap, MOAT_ID_MAX, "%s", sn.snap[k - 1]);
		rv = MOAT_OK;
		goto out;
	}
	if (sn.n == 0)
		*errmsg =
		    no_snapshot_message(t, s, s->step_count, "", deadline);
	else
		*errmsg = moat_asprintf(
		    "none of the last %zu step snapshots of session %s can "
		    "be restored now: their node does not answer and "
		    "moat-snapd has no copy (a node pushes them there only "
		    "with [vmd] snapd); bring the node back, or give a step "
		    "with --step N",
		    tried, s->id);
out:
	free(sn.index);
	free(sn.snap);
	return rv;
}

/* step_or_latest: the snapshot of `step` of s, or with `latest` the last
 * restorable one (latest_step), its index to *step. */
static int
step_or_latest(struct moat_travel *t, const Moat__V1__SessionInfo *s,
    bool latest, const char *node, uint64_t deadline, uint64_t *step,
    char *snap, char **errmsg)
{
	if (latest)
		return latest_step(t, s, node, deadline, step, snap, errmsg);
	return step_snapshot(t, s, *step, deadline, snap, errmsg);
}

int
moat_travel_restore_step(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct moat_travel t = parts(call);
	const Moat__V1__RestoreStepRequest *req =
	    (const Moat__V1__RestoreStepRequest *)request;
	Moat__V1__RestoreStepReply *r = (Moat__V1__RestoreStepReply *)reply;
	Moat__V1__SessionInfo *s = NULL;
	char snap[MOAT_ID_MAX], session_id[MOAT_ID_MAX], *msg = NULL;
	const char *replace = "";
	struct moat_sandbox_id target;
	struct moat_node_id node;
	struct moat_restore_target to;
	struct moat_quota_hold hold = { .handle = 0 };
	uint64_t step = req->step;
	int rv;

	t.reseed = req->reseed; /* in place only: a new sandbox reseeds */
	if ((rv = session_of_request(&t, req->session_id, req->sandbox_id,
	         call, session_id)) != MOAT_OK)
		return rv;
	if ((rv = get_session(&t, session_id, call->deadline_ms, &s, &msg)) !=
	        MOAT_OK ||
	    (rv = step_or_latest(&t, s, req->step_latest, req->node,
	         call->deadline_ms, &step, snap, &msg)) != MOAT_OK ||
	    (req->new_sandbox &&
	        (rv = travel_quota(&t, snap, 1, call->deadline_ms, &hold,
	             &msg)) != MOAT_OK) ||
	    (rv = moat_travel_place(&t, snap, req->node, 1, call->deadline_ms,
	         &to, &msg)) != MOAT_OK)
		goto fail;
	if (req->new_sandbox) {
		replace = "";
	} else if (req->sandbox_id[0] != '\0') {
		/* Asked for by name: it must exist. */
		if (!moat_sandbox_id_set(&target, req->sandbox_id)) {
			rv = MOAT_INVALID_ARGUMENT;
			msg = moat_asprintf("sandbox_id is too long");
			goto fail;
		}
		if ((rv = moat_forward_locate(t.fw, &target, t.tenant,
		         call->deadline_ms, &node, &msg)) != MOAT_OK)
			goto fail;
		replace = req->sandbox_id;
	} else if (moat_sandbox_id_set(&target, s->sandbox_id) &&
	    moat_forward_locate(t.fw, &target, t.tenant, call->deadline_ms,
	        &node, &msg) == MOAT_OK) {
		replace = s->sandbox_id;
	} else {
		free(msg); /* the session's sandbox is gone: a new one */
		msg = NULL;
	}
	rv = branch(&t, s, step, snap, &to, replace, call->request_id,
	    call->deadline_ms, &r->sandbox, session_id, &msg);
	if (rv == MOAT_UNAVAILABLE && req->node[0] == '\0' &&
	    !moat_nodes_is_available(t.nodes, &to.node)) {
		/* The chosen node turned out gone (marked down by the failed
		 * call, before the surveys said so): placed once more. */
		moat_info(call->request_id,
		    "restore of %s: node %s does not answer; placing it again",
		    snap, to.node.s);
		free(msg);
		msg = NULL;
		if ((rv = moat_travel_place(&t, snap, "", 1, call->deadline_ms,
		         &to, &msg)) == MOAT_OK)
			rv = branch(&t, s, step, snap, &to, replace,
			    call->request_id, call->deadline_ms, &r->sandbox,
			    session_id, &msg);
	}
	if (rv != MOAT_OK)
		goto fail;
	moat_quota_landed(t.adm, t.tenant, &hold,
	    (const char *const *)&r->sandbox->id, 1);
	moat__v1__session_info__free_unpacked(s, NULL);
	if ((r->session_id = strdup(session_id)) == NULL ||
	    (r->snapshot_id = strdup(snap)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	return MOAT_OK;

fail:
	moat_quota_release(t.adm, t.tenant, &hold);
	if (s != NULL)
		moat__v1__session_info__free_unpacked(s, NULL);
	return fail(call, rv, msg);
}

/* The baseline fs trace a fork's copies share: the copies start alike,
 * so the first copy up is traced while the others still restore, and
 * every branch records from that one trace. */
struct fork_trace {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool taking;              /* a copy is being traced */
	Moat__V1__FsTrace *trace; /* NULL: none yet */
};

/* One copy of a fork, made on its own thread. */
struct fork_job {
	pthread_t thread;
	bool started;
	struct moat_travel *t;
	const Moat__V1__SessionInfo *s;
	uint64_t step;
	const char *snap;
	const struct moat_restore_target *to;
	uint64_t request_id, deadline;
	struct fork_trace *ft;
	Moat__V1__ForkCopy *copy; /* filled by the thread */
};

/* copy_failed: records a copy's status and (when it failed) message,
 * taking msg. */
static void
copy_failed(Moat__V1__ForkCopy *copy, int rv, char *msg)
{
	copy->code = (Moat__V1__Code)rv;
	if (rv == MOAT_OK) {
		free(msg);
		return;
	}
	if (msg == NULL)
		msg = strdup(moat_strerror(rv));
	if (msg != NULL) /* else protobuf-c's empty default stays */
		copy->message = msg;
}

/* fork_trace_get: the shared baseline: traced from `sandbox_id` unless
 * another copy has been traced; while one is being traced the others
 * wait for it (and try themselves if it failed). NULL when this copy's
 * own trace failed too: its branch then traces its sandbox itself. The
 * only wait is on a copy that is tracing, which waits on nothing else,
 * so copies run inline (no thread) cannot deadlock. */
static const Moat__V1__FsTrace *
fork_trace_get(struct fork_job *j, const char *sandbox_id)
{
	struct fork_trace *ft = j->ft;
	Moat__V1__FsTrace *trace = NULL;
	const Moat__V1__FsTrace *shared;
	char *msg = NULL;

	pthread_mutex_lock(&ft->mu);
	while (ft->taking)
		pthread_cond_wait(&ft->cv, &ft->mu);
	if (ft->trace == NULL) {
		ft->taking = true;
		pthread_mutex_unlock(&ft->mu);
		if (moat_record_trace(j->t->rec, j->t->tenant, sandbox_id,
		        j->deadline, &trace, &msg) != MOAT_OK) {
			moat_warn(j->request_id, "fork: no fs trace of %s: %s",
			    sandbox_id, msg ? msg : "");
			free(msg);
			trace = NULL;
		}
		pthread_mutex_lock(&ft->mu);
		ft->taking = false;
		ft->trace = trace;
		pthread_cond_broadcast(&ft->cv);
	}
	shared = ft->trace;
	pthread_mutex_unlock(&ft->mu);
	return shared;
}

static void *
fork_main(void *arg)
{
	struct fork_job *j = arg;
	Moat__V1__ForkCopy *c = j->copy;
	const Moat__V1__FsTrace *trace;
	char session_id[MOAT_ID_MAX], sandbox_id[MOAT_ID_MAX];
	char *msg = NULL;
	int rv;

	rv = branch_restore(j->t, j->snap, j->to, "", j->request_id,
	    j->deadline, &c->sandbox, &msg);
	if (rv != MOAT_OK) {
		copy_failed(c, rv, msg);
		return NULL;
	}
	trace = fork_trace_get(j, c->sandbox->id);
	snprintf(sandbox_id, sizeof(sandbox_id), "%s", c->sandbox->id);
	if ((rv = branch_record(j->t, j->s, j->step, j->snap, trace,
	         j->request_id, j->deadline, &c->sandbox, session_id, &msg)) !=
	    MOAT_OK) {
		/* An unrecorded copy is not what was asked for. */
		destroy(j->t, sandbox_id, j->request_id);
		copy_failed(c, rv, msg);
		return NULL;
	}
	if ((c->session_id = strdup(session_id)) == NULL)
		c->session_id = (char *)protobuf_c_empty_string;
	copy_failed(c, MOAT_OK, NULL);
	return NULL;
}

int
moat_travel_fork(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_travel t = parts(call);
	const Moat__V1__ForkRequest *req =
	    (const Moat__V1__ForkRequest *)request;
	Moat__V1__ForkReply *r = (Moat__V1__ForkReply *)reply;
	Moat__V1__SessionInfo *s = NULL;
	struct fork_job jobs[TRAVEL_FORK_MAX];
	struct fork_trace ft = {
		.mu = PTHREAD_MUTEX_INITIALIZER,
		.cv = PTHREAD_COND_INITIALIZER,
	};
	uint32_t count = req->count == 0 ? 1 : req->count;
	struct moat_restore_target targets[TRAVEL_FORK_MAX];
	uint64_t step = req->step;
	struct moat_quota_hold hold = { .handle = 0 };
	const char *made[TRAVEL_FORK_MAX];
	char snap[MOAT_ID_MAX], *msg = NULL;
	int rv;

	if (count > TRAVEL_FORK_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "count %u: "
		    "a fork makes at most %d copies",
		    count, TRAVEL_FORK_MAX);
	if ((rv = get_session(&t, req->session_id, call->deadline_ms, &s,
	         &msg)) != MOAT_OK ||
	    (rv = step_or_latest(&t, s, req->step_latest, req->node,
	         call->deadline_ms, &step, snap, &msg)) != MOAT_OK ||
	    (rv = travel_quota(&t, snap, count, call->deadline_ms, &hold,
	         &msg)) != MOAT_OK ||
	    (rv = moat_travel_place(&t, snap, req->node, count,
	         call->deadline_ms, targets, &msg)) != MOAT_OK)
		goto fail;
	if ((r->copies = calloc(count, sizeof(*r->copies))) == NULL)
		goto fail_oom;
	for (uint32_t i = 0; i < count; i++) {
		if ((r->copies[i] = malloc(sizeof(**r->copies))) == NULL)
			goto fail_oom;
		moat__v1__fork_copy__init(r->copies[i]);
		r->n_copies++;
	}
	memset(jobs, 0, sizeof(jobs));
	/* Each copy restores, waits for the shared trace (or takes it) and
	 * records its branch on its own thread. */
	for (uint32_t i = 0; i < count; i++) {
		jobs[i] = (struct fork_job){
			.t = &t,
			.s = s,
			.step = step,
			.snap = snap,
			.to = &targets[i],
			.request_id = call->request_id,
			.deadline = call->deadline_ms,
			.ft = &ft,
			.copy = r->copies[i],
		};
		jobs[i].started = pthread_create(&jobs[i].thread, NULL,
		                      fork_main, &jobs[i]) == 0;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (jobs[i].started)
			pthread_join(jobs[i].thread, NULL);
		else
			fork_main(&jobs[i]);
	}
	for (uint32_t i = 0; i < count; i++)
		if (r->copies[i]->code == MOAT__V1__CODE__OK &&
		    r->copies[i]->sandbox != NULL)
			made[r->succeeded++] = r->copies[i]->sandbox->id;
	/* The copies that failed give their share back. */
	moat_quota_landed(t.adm, t.tenant, &hold, made, r->succeeded);
	if (ft.trace != NULL)
		moat__v1__fs_trace__free_unpacked(ft.trace, NULL);
	pthread_mutex_destroy(&ft.mu);
	pthread_cond_destroy(&ft.cv);
	moat_info(call->request_id, "fork of %s step %llu: %u of %u copies",
	    s->id, (unsigned long long)step, r->succeeded, count);
	moat__v1__session_info__free_unpacked(s, NULL);
	if ((r->snapshot_id = strdup(snap)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	return MOAT_OK;

fail_oom:
	rv = MOAT_RESOURCE_EXHAUSTED;
	msg = moat_asprintf("out of memory");
fail:
	moat_quota_release(t.adm, t.tenant, &hold);
	if (s != NULL)
		moat__v1__session_info__free_unpacked(s, NULL);
	return fail(call, rv, msg);
}

/* ---- replay ---- */

/* create_like: a fresh sandbox shaped like `like` (NULL: defaults), on a
 * node chosen by placement (the next tried when one refuses). On MOAT_OK
 * *out is the caller's. */
static int
create_like(struct moat_travel *t, const Moat__V1__Sandbox *like,
    uint64_t deadline, Moat__V1__Sandbox **out, char **errmsg)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	struct moat_gw_create c = {
		.nodes = t->nodes,
		.fw = t->fw,
		.adm = t->adm,
		.tenant = t->tenant,
		.req = &req,
		.survey_url = t->survey_url,
		.what = "the replay sandbox",
		.request_id = moat_rpc_new_request_id(),
		.deadline_ms = deadline,
		.quota = true,
	};
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	uint8_t *reply = NULL;
	size_t reply_len = 0;
	int rv;

	*out = NULL;
	if (like != NULL) {
		req.vcpus = like->vcpus;
		req.memory_mib = like->memory_mib;
		req.image = like->image;
		req.scratch_mib = like->scratch_mib;
	}
	req.tenant = (char *)t->tenant;
	rv = moat_gw_create(&c, &node, &reply, &reply_len, out, errmsg);
	if (rv == MOAT_OK && moat_sandbox_id_set(&sandbox, (*out)->id))
		moat_forward_remember(t->fw, &sandbox, &node);
	free(reply);
	return rv;
}

/* get_sandbox: the sandbox, or NULL when it is gone or unreachable. */
static Moat__V1__Sandbox *
get_sandbox(struct moat_travel *t, const char *sandbox_id, uint64_t deadline)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	uint8_t payload[MOAT_ID_MAX + 8], *out = NULL;
	size_t len, out_len = 0;
	Moat__V1__Sandbox *sb = NULL;
	char *msg = NULL;

	ref.sandbox_id = (char *)sandbox_id;
	len = moat__v1__sandbox_ref__get_packed_size(&ref);
	if (!moat_sandbox_id_set(&sandbox, sandbox_id) ||
	    len > sizeof(payload))
		return NULL;
	moat__v1__sandbox_ref__pack(&ref, payload);
	if (moat_forward_locate(t->fw, &sandbox, t->tenant, deadline, &node,
	        &msg) == MOAT_OK &&
	    moat_forward_to_node(t->fw, &node, t->tenant, "GetSandbox",
	        payload, len, moat_rpc_new_request_id(), deadline,
	        "the recorded sandbox", &out, &out_len, &msg) == MOAT_OK)
		sb = moat__v1__sandbox__unpack(NULL, out_len, out);
	free(out);
	free(msg);
	return sb;
}

/* The outcome of one replayed step, to compare with the recorded one. */
struct outcome {
	bool ran;
	int32_t exit_code;
	ProtobufCBinaryData out, err; /* borrowed from the reply */
};

static bool
same_bytes(ProtobufCBinaryData a, ProtobufCBinaryData b)
{
	return a.len == b.len &&
	    (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

/* replay_step: runs the recorded step `st` in `sandbox_id` through the
 * recording path (so it becomes a step of the replay's session) and says
 * whether it came out as recorded. */
static bool
replay_step(struct moat_travel *t, struct moat_rpc_call *parent,
    const char *sandbox_id, const Moat__V1__Step *st, bool *refused)
{
	Moat__V1__ExecRequest ereq = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__RunCodeRequest creq = MOAT__V1__RUN_CODE_REQUEST__INIT;
	Moat__V1__FileWriteRequest freq = MOAT__V1__FILE_WRITE_REQUEST__INIT;
	struct moat_rpc_call call = {
		.service = parent->service,
		.request_id = moat_rpc_new_request_id(),
		.deadline_ms = parent->deadline_ms,
		.auth = parent->auth,
		.principal = parent->principal,
		.service_ctx = parent->service_ctx,
	};
	ProtobufCMessage *req;
	Moat__V1__ExecResult *er = NULL;
	Moat__V1__RunCodeResult *cr = NULL;
	uint8_t *payload;
	char *why = NULL;
	size_t len;
	bool handled = false, same = false;
	int rv;

	*refused = false;

	switch (st->kind) {
	case MOAT__V1__STEP_KIND__STEP_KIND_EXEC:
		ereq.sandbox_id = (char *)sandbox_id;
		if (st->n_argv > 0) {
			ereq.argv = st->argv;
			ereq.n_argv = st->n_argv;
		} else {
			ereq.shell = st->input;
		}
		req = &ereq.base;
		call.method = "Exec";
		break;
	case MOAT__V1__STEP_KIND__STEP_KIND_CODE:
		creq.sandbox_id = (char *)sandbox_id;
		creq.code = st->input;
		creq.language = st->language;
		req = &creq.base;
		call.method = "RunCode";
		break;
	case MOAT__V1__STEP_KIND__STEP_KIND_FILE_WRITE:
		freq.sandbox_id = (char *)sandbox_id;
		freq.path = st->path;
		freq.data.data = (uint8_t *)st->input;
		freq.data.len = strlen(st->input);
		freq.truncate = true;
		freq.make_parents = true;
		req = &freq.base;
		call.method = "WriteFile";
		break;
	default:
		return false;
	}
	/* A recorded step passed the policy when it ran; the policy may
	 * have changed since, and a replay runs it again. */
	if (moat_gateway_policy_refuses(parent->service_ctx, t->tenant, req,
	        &why)) {
		moat_info(parent->request_id,
		    "replay step %llu in %s not run: "
		    "the policy of tenant %s refuses it (%s)",
		    (unsigned long long)st->index, sandbox_id, t->tenant,
		    why ? why : "?");
		free(why);
		*refused = true;
		return false;
	}
	len = protobuf_c_message_get_packed_size(req);
	if ((payload = malloc(len ? len : 1)) == NULL)
		return false;
	protobuf_c_message_pack(req, payload);
	call.payload = payload;
	call.payload_len = len;
	rv = moat_record_step(t->rec, &call, req, sandbox_id, t->tenant,
	    &handled);
	if (!handled) /* sessiond lost the recording: run it anyway */
		rv = moat_forward_call(t->fw, &call, sandbox_id, payload, len);
	if (rv != MOAT_OK) {
		moat_warn(parent->request_id, "replay step %llu in %s: %s",
		    (unsigned long long)st->index, sandbox_id,
		    call.error_message ? call.error_message : "");
	} else if (st->kind == MOAT__V1__STEP_KIND__STEP_KIND_EXEC &&
	    (er = moat__v1__exec_result__unpack(NULL, call.raw_reply_len,
	         call.raw_reply)) != NULL &&
	    er->status != NULL) {
		int32_t code = er->status->exited ? er->status->exit_code :
		                                    128 + er->status->signal;
		same = code == st->exit_code &&
		    same_bytes(er->stdout, st->stdout) &&
		    same_bytes(er->stderr, st->stderr);
	} else if (st->kind == MOAT__V1__STEP_KIND__STEP_KIND_CODE &&
	    (cr = moat__v1__run_code_result__unpack(NULL, call.raw_reply_len,
	         call.raw_reply)) != NULL &&
	    cr->result != NULL) {
		int32_t code = cr->result->timed_out  ? 124 :
		    cr->result->error_name[0] != '\0' ? 1 :
		                                        0;
		same = code == st->exit_code &&
		    same_bytes(cr->result->stdout, st->stdout) &&
		    same_bytes(cr->result->stderr, st->stderr);
	} else if (st->kind == MOAT__V1__STEP_KIND__STEP_KIND_FILE_WRITE) {
		same = true;
	}
	if (er != NULL)
		moat__v1__exec_result__free_unpacked(er, NULL);
	if (cr != NULL)
		moat__v1__run_code_result__free_unpacked(cr, NULL);
	free(call.raw_reply);
	free(call.error_message);
	free(payload);
	return same;
}

int
moat_travel_replay(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct moat_travel t = parts(call);
	const Moat__V1__ReplayRequest *req =
	    (const Moat__V1__ReplayRequest *)request;
	Moat__V1__ReplayReply *r = (Moat__V1__ReplayReply *)reply;
	Moat__V1__ExportSessionRequest ereq =
	    MOAT__V1__EXPORT_SESSION_REQUEST__INIT;
	Moat__V1__ExportSessionReply *ex = NULL;
	Moat__V1__Sandbox *like = NULL, *sb = NULL;
	struct moat_record_origin origin = { 0 };
	char session_id[MOAT_ID_MAX], *msg = NULL;
	uint64_t until;
	int rv;

	if (req->session_id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "session_id is required: `moat session ls` lists the "
		    "sessions");
	ereq.tenant = (char *)t.tenant;
	ereq.session_id = req->session_id;
	if ((rv = moat_record_sessiond(t.rec, "ExportSession", &ereq.base,
	         &moat__v1__export_session_reply__descriptor,
	         (ProtobufCMessage **)&ex, call->deadline_ms, &msg)) !=
	    MOAT_OK)
		return fail(call, rv, msg);
	if (ex->session == NULL) {
		moat__v1__export_session_reply__free_unpacked(ex, NULL);
		return moat_rpc_error(call, MOAT_INTERNAL,
		    "moat-sessiond "
		    "exported session %s without its info",
		    req->session_id);
	}
	until = req->until_step == 0 || req->until_step > ex->n_steps ?
	    ex->n_steps :
	    req->until_step;
	like = get_sandbox(&t, ex->session->sandbox_id, call->deadline_ms);
	rv = create_like(&t, like, call->deadline_ms, &sb, &msg);
	if (like != NULL)
		moat__v1__sandbox__free_unpacked(like, NULL);
	if (rv != MOAT_OK)
		goto fail;
	origin.policy = ex->session->snapshot_policy;
	if ((rv = moat_record_begin(t.rec, t.tenant, sb->id, &origin,
	         call->request_id, call->deadline_ms, session_id,
	         sizeof(session_id), &msg)) != MOAT_OK)
		goto fail_destroy;
	for (uint64_t i = 0; i < until; i++) {
		bool refused;
		bool same =
		    replay_step(&t, call, sb->id, ex->steps[i], &refused);

		r->steps_replayed++;
		if (refused)
			r->steps_refused++;
		if (same)
			r->steps_matching++;
		else if (r->first_divergent_step == 0)
			r->first_divergent_step = ex->steps[i]->index;
	}
	moat_info(call->request_id,
	    "replay of %s in %s: %llu of %llu steps "
	    "the same",
	    req->session_id, sb->id, (unsigned long long)r->steps_matching,
	    (unsigned long long)r->steps_replayed);
	moat__v1__export_session_reply__free_unpacked(ex, NULL);
	if ((r->session_id = strdup(session_id)) == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	if (req->keep_sandbox && rv == MOAT_OK &&
	    moat_sandbox_set_session(sb, session_id)) {
		r->sandbox = sb;
		return MOAT_OK;
	}
	destroy(&t, sb->id, call->request_id);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;

fail_destroy:
	destroy(&t, sb->id, call->request_id);
fail:
	if (sb != NULL)
		moat__v1__sandbox__free_unpacked(sb, NULL);
	moat__v1__export_session_reply__free_unpacked(ex, NULL);
	return fail(call, rv, msg);
}

/* ---- recorded sandbox calls answered with the recording's help ---- */

int
moat_travel_close_code_context(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct moat_travel t = parts(call);
	const Moat__V1__CodeContextCall *req =
	    (const Moat__V1__CodeContextCall *)request;

	(void)reply;
	return moat_forward_call(t.fw, call, req->sandbox_id, call->payload,
	    call->payload_len);
}

int
moat_travel_snapshot_sandbox(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct moat_travel t = parts(call);
	char *msg = NULL;
	int rv;

	(void)reply;
	/* [tenants] max-snapshot-bytes: asked of the nodes only when set. */
	if ((rv = moat_gw_snapshot_quota(&t, call->deadline_ms, &msg)) !=
	    MOAT_OK) {
		rv = moat_rpc_error(call, rv, "%s", msg ? msg : "");
		free(msg);
		return rv;
	}
	return moat_record_snapshot_call(t.rec, call,
	    (const Moat__V1__SnapshotSandboxRequest *)request, t.tenant);
}
