/*
 * sandbox_state.h: a sandbox's lifecycle as one state machine: its
 * states, the events that move it, and the one table that says which
 * event is legal in which state. Pure: no locks, no sandbox object, so
 * the table can be read and tested on its own. sandbox.c applies it to a
 * sandbox under sb->mu (vmd_sandbox_step). Not for: facts about the
 * current VMM process or guest link (sandbox.h keeps those as fields).
 *
 * States (what the API shows, Moat__V1__SandboxState, in brackets):
 *   BOOTING       [CREATING] the creating thread starts or restores the
 *                 VMM and waits for the agent; it owns the VMM.
 *   ABORTING      [CREATING] destroyed while booting: the creating thread
 *                 gives up at its next check and tears down.
 *   RUNNING       [RUNNING]  the agent answered; RPCs may use it.
 *   SNAPSHOTTING  [RUNNING]  a snapshot is being taken (one at a time).
 *   RELINKING     [RUNNING]  inside a snapshot whose driver reset the
 *                 agent's stream: a closing link is expected, not a
 *                 failure.
 *   FAILED        [FAILED]   the VM died or the guest broke the protocol;
 *                 kept with its reason until destroyed.
 *   STOPPED       [STOPPED]  destroyed, or given up by the creator;
 *                 terminal.
 *
 * Events and the transition table (RUN: RUNNING, STOP: STOPPED, ABORT:
 * ABORTING, SNAP: SNAPSHOTTING, RELINK: RELINKING; "-": ignored, legal
 * but nothing changes; "x": refused, logged as a programmer error):
 *
 *                BOOTED GAVE_UP FAIL    DESTROY SNAP_B SNAP_E RELN_B RELN_E
 *   BOOTING      RUN    STOP    -       ABORT   x      x      x      x
 *   ABORTING     x      STOP    -       -       x      x      x      x
 *   RUNNING      x      STOP    FAILED  STOP    SNAP   x      x      x
 *   SNAPSHOTTING x      x       FAILED  STOP    x      RUN    RELINK x
 *   RELINKING    x      x       FAILED  STOP    x      x      x      SNAP
 *   FAILED       x      STOP    -       STOP    x      -      -      -
 *   STOPPED      x      -       -       -       x      -      -      -
 *
 * BOOTED: bring-up saw the agent ready. GAVE_UP: the creating thread
 * tore a sandbox down that it had not handed out (boot failed, destroyed
 * meanwhile, or a restore in place whose target went away). FAIL: the
 * VMM died, the link was lost, or the guest broke the protocol; while
 * booting the boot waiter judges that itself, so FAIL is ignored there.
 * DESTROY: Destroy, shutdown, a restore in place replacing it, or a
 * template build aborted; twice is harmless. SNAP_B/SNAP_E,
 * RELN_B/RELN_E: around a snapshot and its relink; a relink and the
 * end events are ignored once the sandbox failed or stopped meanwhile
 * (a destroy may come at any time).
 */
#ifndef MOAT_VMD_SANDBOX_STATE_H
#define MOAT_VMD_SANDBOX_STATE_H

#include <stdbool.h>

#include "vm.pb-c.h"

enum sandbox_state {
	SANDBOX_BOOTING,
	SANDBOX_ABORTING,
	SANDBOX_RUNNING,
	SANDBOX_SNAPSHOTTING,
	SANDBOX_RELINKING,
	SANDBOX_FAILED,
	SANDBOX_STOPPED,
	SANDBOX_N_STATES
};

enum sandbox_event {
	SANDBOX_EV_BOOTED,
	SANDBOX_EV_GAVE_UP,
	SANDBOX_EV_FAIL,
	SANDBOX_EV_DESTROY,
	SANDBOX_EV_SNAPSHOT_BEGIN,
	SANDBOX_EV_SNAPSHOT_END,
	SANDBOX_EV_RELINK_BEGIN,
	SANDBOX_EV_RELINK_END,
	SANDBOX_N_EVENTS
};

/* What looking up an event in the table says. */
enum sandbox_step {
	SANDBOX_STEP_MOVED,   /* *to is the new state */
	SANDBOX_STEP_IGNORED, /* legal; the state stays */
	SANDBOX_STEP_REFUSED, /* illegal here; the state stays */
};

/* vmd_sandbox_state_next: the table. Sets *to (the state after `ev` in
 * `from`, `from` unless MOVED). Out-of-range values are REFUSED. */
enum sandbox_step vmd_sandbox_state_next(enum sandbox_state from,
    enum sandbox_event ev, enum sandbox_state *to);

/* vmd_sandbox_state_api: the one place internal states map onto the
 * API's SandboxState. */
Moat__V1__SandboxState vmd_sandbox_state_api(enum sandbox_state s);

/* vmd_sandbox_state_live: RUNNING, SNAPSHOTTING or RELINKING: the VM is
 * up and handed out (the API says RUNNING). */
bool vmd_sandbox_state_live(enum sandbox_state s);

/* Names for logs and messages (static strings). */
const char *vmd_sandbox_state_name(enum sandbox_state s);
const char *vmd_sandbox_event_name(enum sandbox_event ev);
const char *vmd_sandbox_api_state_name(Moat__V1__SandboxState s);

#endif
