/*
 * sandbox_state.c: the lifecycle table of sandbox_state.h and the
 * mapping onto the API's states. Pure data and lookups: applying an
 * event to a sandbox (locking, logging a refusal, waking waiters) is
 * sandbox.c's. Not for: what a transition does to the VMM.
 */
#include "sandbox_state.h"

#define S_(x)                                                                 \
	{                                                                     \
		.step = SANDBOX_STEP_MOVED, .to = SANDBOX_##x                 \
	}
#define IGN                                                                   \
	{                                                                     \
		.step = SANDBOX_STEP_IGNORED                                  \
	}
#define NO                                                                    \
	{                                                                     \
		.step = SANDBOX_STEP_REFUSED                                  \
	}

struct sandbox_cell {
	enum sandbox_step step;
	enum sandbox_state to;
};

/* Rows: states; columns: events, in enum order. Keep in step with the
 * table drawn in sandbox_state.h. */
static const struct sandbox_cell
    sandbox_table[SANDBOX_N_STATES][SANDBOX_N_EVENTS] = {
	    /*                BOOTED         GAVE_UP         FAIL          DESTROY
	 *                SNAP_BEGIN          SNAP_END       RELINK_BEGIN
	 *                RELINK_END */
	    [SANDBOX_BOOTING] = { S_(RUNNING), S_(STOPPED), IGN, S_(ABORTING),
	        NO, NO, NO, NO },
	    [SANDBOX_ABORTING] = { NO, S_(STOPPED), IGN, IGN, NO, NO, NO, NO },
	    [SANDBOX_RUNNING] = { NO, S_(STOPPED), S_(FAILED), S_(STOPPED),
	        S_(SNAPSHOTTING), NO, NO, NO },
	    [SANDBOX_SNAPSHOTTING] = { NO, NO, S_(FAILED), S_(STOPPED), NO,
	        S_(RUNNING), S_(RELINKING), NO },
	    [SANDBOX_RELINKING] = { NO, NO, S_(FAILED), S_(STOPPED), NO, NO,
	        NO, S_(SNAPSHOTTING) },
	    [SANDBOX_FAILED] = { NO, S_(STOPPED), IGN, S_(STOPPED), NO, IGN,
	        IGN, IGN },
	    [SANDBOX_STOPPED] = { NO, IGN, IGN, IGN, NO, IGN, IGN, IGN },
    };

enum sandbox_step
vmd_sandbox_state_next(enum sandbox_state from, enum sandbox_event ev,
    enum sandbox_state *to)
{
	const struct sandbox_cell *c;

	*to = from;
	if ((unsigned)from >= SANDBOX_N_STATES ||
	    (unsigned)ev >= SANDBOX_N_EVENTS)
		return SANDBOX_STEP_REFUSED;
	c = &sandbox_table[from][ev];
	if (c->step == SANDBOX_STEP_MOVED)
		*to = c->to;
	return c->step;
}

Moat__V1__SandboxState
vmd_sandbox_state_api(enum sandbox_state s)
{
	switch (s) {
	case SANDBOX_BOOTING:
	case SANDBOX_ABORTING:
		return MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING;
	case SANDBOX_RUNNING:
	case SANDBOX_SNAPSHOTTING:
	case SANDBOX_RELINKING:
		return MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	case SANDBOX_FAILED:
		return MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED;
	case SANDBOX_STOPPED:
		return MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED;
	default:
		return MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNSPECIFIED;
	}
}

bool
vmd_sandbox_state_live(enum sandbox_state s)
{
	return vmd_sandbox_state_api(s) ==
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
}

const char *
vmd_sandbox_state_name(enum sandbox_state s)
{
	static const char *const names[SANDBOX_N_STATES] = {
		[SANDBOX_BOOTING] = "BOOTING",
		[SANDBOX_ABORTING] = "ABORTING",
		[SANDBOX_RUNNING] = "RUNNING",
		[SANDBOX_SNAPSHOTTING] = "SNAPSHOTTING",
		[SANDBOX_RELINKING] = "RELINKING",
		[SANDBOX_FAILED] = "FAILED",
		[SANDBOX_STOPPED] = "STOPPED",
	};

	return (unsigned)s < SANDBOX_N_STATES ? names[s] : "?";
}

const char *
vmd_sandbox_event_name(enum sandbox_event ev)
{
	static const char *const names[SANDBOX_N_EVENTS] = {
		[SANDBOX_EV_BOOTED] = "BOOTED",
		[SANDBOX_EV_GAVE_UP] = "GAVE_UP",
		[SANDBOX_EV_FAIL] = "FAIL",
		[SANDBOX_EV_DESTROY] = "DESTROY",
		[SANDBOX_EV_SNAPSHOT_BEGIN] = "SNAPSHOT_BEGIN",
		[SANDBOX_EV_SNAPSHOT_END] = "SNAPSHOT_END",
		[SANDBOX_EV_RELINK_BEGIN] = "RELINK_BEGIN",
		[SANDBOX_EV_RELINK_END] = "RELINK_END",
	};

	return (unsigned)ev < SANDBOX_N_EVENTS ? names[ev] : "?";
}

const char *
vmd_sandbox_api_state_name(Moat__V1__SandboxState s)
{
	switch (s) {
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING:
		return "CREATING";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING:
		return "RUNNING";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED:
		return "FAILED";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED:
		return "STOPPED";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNAVAILABLE:
		return "UNAVAILABLE";
	default:
		return "UNSPECIFIED";
	}
}
