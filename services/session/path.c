/*
 * path.c: branches read as paths (issue 18). A branch made by a restore
 * or a fork continues its parent's step numbering: it holds steps
 * first_step..step_count itself (stored under those numbers) and
 * inherits 1..first_step-1 from its parent, which may inherit from its
 * own. Every read of a step by number (GetStep, ListSteps, export, keep)
 * goes through sessiond_path_holder, so a step of the path is found in
 * the session that holds it. Sessions recorded before (first_step 0)
 * hold all their steps from 1, as they always did.
 * Not for: the tree of branches (handlers.c), writes (writer.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

uint64_t
sessiond_first_step(const Moat__V1__SessionInfo *s)
{
	return s->first_step != 0 ? s->first_step : 1;
}

int
sessiond_path_holder(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *s, uint64_t index,
    Moat__V1__SessionInfo **owned, const Moat__V1__SessionInfo **holder,
    char **errmsg)
{
	const Moat__V1__SessionInfo *cur = s;
	Moat__V1__SessionInfo *parent = NULL;
	struct sessiond_id pid;
	int rv;

	*owned = NULL;
	*holder = NULL;
	if (index == 0 || index > s->step_count) {
		if (s->step_count == 0)
			*errmsg = moat_asprintf(
			    "step %llu of session %s not found: it has no "
			    "steps yet",
			    (unsigned long long)index, s->id);
		else
			*errmsg = moat_asprintf(
			    "step %llu of session %s not found: it has steps "
			    "1..%llu (ListSteps, `moat session show %s`, "
			    "lists "
			    "them)",
			    (unsigned long long)index, s->id,
			    (unsigned long long)s->step_count, s->id);
		return MOAT_NOT_FOUND;
	}
	for (unsigned depth = 0;; depth++) {
		Moat__V1__SessionInfo *next = NULL;
		char *msg = NULL;

		if (index >= sessiond_first_step(cur)) {
			*owned = parent;
			*holder = cur;
			return MOAT_OK;
		}
		if (depth >= SESSIOND_PATH_MAX_DEPTH) {
			*errmsg = moat_asprintf(
			    "step %llu of session %s: its path goes back "
			    "through more than %d sessions (a loop of parents "
			    "in the store?): restore a later step, or export "
			    "the session with `moat session export`",
			    (unsigned long long)index, s->id,
			    SESSIOND_PATH_MAX_DEPTH);
			rv = MOAT_FAILED_PRECONDITION;
			break;
		}
		if (cur->parent_session_id == NULL ||
		    !sessiond_id_parse(cur->parent_session_id, &pid)) {
			*errmsg = moat_asprintf(
			    "session %s starts at step %llu but names no "
			    "parent (\"%.40s\"): the store is damaged",
			    cur->id,
			    (unsigned long long)sessiond_first_step(cur),
			    cur->parent_session_id ? cur->parent_session_id :
			                             "");
			rv = MOAT_DATA_LOSS;
			break;
		}
		rv = sessiond_session_load(txn, s->tenant, &pid, &next, &msg);
		if (rv == MOAT_NOT_FOUND) {
			free(msg);
			*errmsg = moat_asprintf(
			    "step %llu of session %s is held by session %s, "
			    "which was deleted: steps %llu.. of %s are its "
			    "own",
			    (unsigned long long)index, s->id, pid.s,
			    (unsigned long long)sessiond_first_step(cur),
			    cur->id);
			break;
		}
		if (rv != MOAT_OK) {
			*errmsg = msg;
			break;
		}
		if (next->step_count < index) {
			*errmsg = moat_asprintf(
			    "session %s branched from step %llu of %s, which "
			    "has only %llu steps: the store is damaged",
			    cur->id, (unsigned long long)cur->parent_step,
			    pid.s, (unsigned long long)next->step_count);
			moat__v1__session_info__free_unpacked(next, NULL);
			rv = MOAT_DATA_LOSS;
			break;
		}
		if (parent != NULL)
			moat__v1__session_info__free_unpacked(parent, NULL);
		parent = next;
		cur = next;
	}
	if (parent != NULL)
		moat__v1__session_info__free_unpacked(parent, NULL);
	return rv;
}

int
sessiond_path_step_load(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *s, uint64_t index, bool omit_outputs,
    Moat__V1__Step **out, char **errmsg)
{
	Moat__V1__SessionInfo *owned = NULL;
	const Moat__V1__SessionInfo *holder;
	Moat__V1__Step *step;
	char *sid, *held;
	int rv;

	*out = NULL;
	if ((rv = sessiond_path_holder(txn, s, index, &owned, &holder,
	         errmsg)) != MOAT_OK)
		return rv;
	rv = sessiond_step_load(txn, holder, index, omit_outputs, &step,
	    errmsg);
	if (rv == MOAT_OK && holder != s) {
		/* Step N of s's path, held by an ancestor. */
		if ((sid = strdup(s->id)) == NULL ||
		    (held = strdup(holder->id)) == NULL) {
			free(sid);
			moat__v1__step__free_unpacked(step, NULL);
			*errmsg = moat_asprintf("out of memory");
			rv = MOAT_RESOURCE_EXHAUSTED;
		} else {
			if (step->session_id !=
			    (char *)protobuf_c_empty_string)
				free(step->session_id);
			step->session_id = sid;
			if (step->held_by_session !=
			    (char *)protobuf_c_empty_string)
				free(step->held_by_session);
			step->held_by_session = held;
		}
	}
	if (owned != NULL)
		moat__v1__session_info__free_unpacked(owned, NULL);
	if (rv == MOAT_OK)
		*out = step;
	return rv;
}
