/*
 * fake_vmm.h: a VMM driver for tests (fake_vmm.c): no QEMU, no guest.
 * Its "VMM" is a child process that only waits to be killed; its guest
 * agent is a thread on the other end of a socketpair that says
 * AgentReady and answers every request OK. What it does is scripted per
 * test (fake_script) so a test can make a boot time out, a restore fail,
 * the agent go, or the VMM die. Not for: testing a real driver
 * (tests/unit/vm_driver, tests/integration/vm).
 */
#ifndef MOAT_TEST_FAKE_VMM_H
#define MOAT_TEST_FAKE_VMM_H

#include <stdbool.h>

#include "vmm.h"

enum fake_agent {
	FAKE_AGENT_READY,  /* AgentReady, then answers requests */
	FAKE_AGENT_SILENT, /* connects, never says ready */
	FAKE_AGENT_CLOSES, /* closes the stream at once */
};

/* What the next calls do; set by a test before it starts a VMM. */
struct fake_script {
	bool start_fails;   /* start (and restore) return an error */
	bool restore_fails; /* restore returns an error */
	bool resume_fails;  /* resume returns an error */
	bool vmm_exits;     /* the child exits at once (status 3) */
	enum fake_agent agent;
};

extern struct fake_script fake_script;
extern const struct moat_vmm_ops fake_vmm_ops;

/* fake_vmm_reset: the default script (everything works), counters 0. */
void fake_vmm_reset(void);

/* fake_vmm_starts: VMMs started or restored since the reset. */
int fake_vmm_starts(void);

/* fake_vmm_agent_lost: the agent of vm's newest link hangs up while the
 * VMM runs on. */
void fake_vmm_agent_lost(const struct moat_vmm *vm);

#endif
