/*
 * guest_link.h: moat-vmd's end of one guest link: length-prefixed
 * guest.proto frames on a byte stream (the VMM's agent socket). One reader
 * thread per link decodes what the guest sends, hands replies to the
 * callers waiting for them and events (exec output, exits, AgentReady) to
 * the owner's hooks. The guest is not trusted: a frame over the cap, one
 * that does not decode, a reply to a request never sent, or an event the
 * owner refuses closes the link as a protocol violation, and memory stays
 * bounded by MOAT_FRAME_MAX plus a fixed read buffer. Not for: what the
 * requests mean (exec.c, files.c) or the VMM (vmm.h).
 */
#ifndef MOAT_VMD_GUEST_LINK_H
#define MOAT_VMD_GUEST_LINK_H

#include <stdbool.h>
#include <stdint.h>

#include "guest.pb-c.h"

struct guest_link;

/* Hooks called from the link's reader thread, never with a link lock
 * held. */
struct guest_link_hooks {
	/* ready: the agent said AgentReady (once). */
	void (*ready)(void *arg, const Moat__V1__AgentReady *ready);
	/* event: exec_output or exec_exit. Returns 0, or non-zero with *why
	 * (heap) to call it a protocol violation. */
	int (*event)(void *arg, const Moat__V1__GuestMessage *msg, char **why);
	/* closed: the link is gone, once. `violation`: the guest broke the
	 * protocol (reason says how); else the stream ended or failed. */
	void (*closed)(void *arg, bool violation, const char *reason);
};

/* guest_link_open: takes ownership of `fd` (also on failure) and starts
 * the reader thread. `max_frame` 0 means MOAT_FRAME_MAX. `hooks` and
 * `arg` must outlive the link. On success *out is the caller's: call
 * guest_link_shutdown, then guest_link_free. On failure returns a status
 * and *errmsg (heap). */
int guest_link_open(struct guest_link **out, int fd, size_t max_frame,
    const struct guest_link_hooks *hooks, void *arg, char **errmsg)
    __attribute__((warn_unused_result));

/* guest_link_new_id: the next request id (never 0). Thread-safe. */
uint64_t guest_link_new_id(struct guest_link *gl);

/* guest_link_call: sends `req` (its id set by the caller, from
 * guest_link_new_id, or 0 to have one assigned) and waits for the answer
 * until `deadline_ms` (monotonic). On MOAT_OK *reply is the decoded
 * GuestMessage (caller frees with moat__v1__guest_message__free_unpacked),
 * whatever its code. Otherwise returns DEADLINE_EXCEEDED or UNAVAILABLE
 * (link closed) with *errmsg (heap). Thread-safe. */
int guest_link_call(struct guest_link *gl, Moat__V1__GuestRequest *req,
    uint64_t deadline_ms, Moat__V1__GuestMessage **reply, char **errmsg)
    __attribute__((warn_unused_result));

/* guest_link_shutdown: closes the stream, joins the reader thread (which
 * calls `closed` if it had not), and fails every waiting call with
 * UNAVAILABLE and `why` (copied; NULL: "the guest link closed"). Callers
 * may still be inside guest_link_call; they return. Idempotent. Must not
 * be called from a hook. */
void guest_link_shutdown(struct guest_link *gl, const char *why);

/* guest_link_continue_ids: makes `gl`'s next request id follow the last
 * one `from` handed out, so ids stay unique across a link and its
 * replacement (vmd uses them as exec ids). Call before anyone else uses
 * `gl`. */
void guest_link_continue_ids(struct guest_link *gl, struct guest_link *from);

/* guest_link_set_hooks: from now on the reader calls `hooks` with
 * `arg` (a pooled VM's link handed to its sandbox). Waits out a call
 * into the old hooks, so their arg may go once this returns. False when
 * the link had closed (the old hooks were told): then nothing changes.
 * Must not be called from a hook. */
bool guest_link_set_hooks(struct guest_link *gl,
    const struct guest_link_hooks *hooks, void *arg);

/* guest_link_last_id: the highest request id handed out so far.
 * Thread-safe. */
uint64_t guest_link_last_id(struct guest_link *gl);

/* guest_link_skip_ids: makes `gl`'s next request id greater than `last`
 * (a re-adopted sandbox's link: ids from before vmd restarted are never
 * handed out again). */
void guest_link_skip_ids(struct guest_link *gl, uint64_t last);

/* guest_link_close_fd: after guest_link_shutdown: closes the stream's
 * file descriptor now (waiting for a writer still inside), so a link
 * that is replaced but must stay allocated for callers that may still
 * hold it keeps no descriptor open; they get UNAVAILABLE. Idempotent. */
void guest_link_close_fd(struct guest_link *gl);

/* guest_link_free: after guest_link_shutdown and once no caller can be
 * inside guest_link_call. Safe on NULL. */
void guest_link_free(struct guest_link *gl);

#endif
