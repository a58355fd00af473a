/*
 * record_internal.h: what record.c (the table of recorded sandboxes,
 * whose turn it is, sessiond and node calls, session lookup and the
 * snapshot policy) shares with record_step.c (the step pipeline) and
 * record_follow.c (started commands): an entry of the table and the
 * helpers the steps use.
 * Not for: anything outside those files (gateway.h is the interface).
 */
#ifndef MOAT_GATEWAY_RECORD_INTERNAL_H
#define MOAT_GATEWAY_RECORD_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "gateway.h"
#include "session.pb-c.h"

#define RECORD_CALL_MIN_MS 5000 /* trace / append get at least this */
#define RECORD_LOOKUP_MS 3000   /* finding a sandbox's session again */
/* The most started commands of one sandbox followed at once
 * (record_follow.c); one started past it runs unrecorded (logged). The
 * guest agent runs at most 64 at once: a bound against a node that
 * allows more, not one a client meets today. */
#define MOAT_RECORD_FOLLOW_MAX 64u

/* One recorded sandbox. Entries are allocated one by one and freed only
 * by moat_record_fini, so a pointer taken under the table lock stays
 * valid. Its steps are recorded one at a time, in arrival order: the
 * one running owns the entry (`busy`), the others wait in a FIFO, each
 * a thread waiting on `cv` or a deferred step (record_async.c) started
 * when its turn comes. Only the owner reads or writes what follows
 * `tail` (session_id and step0 also change under the table lock). */
struct moat_record_entry {
	pthread_mutex_t lock; /* guards busy, head, tail */
	pthread_cond_t cv;    /* a waiting thread's turn came */
	bool busy;            /* owned; false: head is NULL */
	struct moat_record_waiter *head, *tail;
	char sandbox_id[MOAT_ID_MAX];
	char session_id[MOAT_ID_MAX]; /* "" : known not to be recorded */
	bool gone;                    /* destroyed, or now records elsewhere */
	Moat__V1__SnapshotPolicy policy;
	uint64_t last_index; /* the latest step (0: none yet) */
	/* The step the session branched at (issue 18): its own steps are
	 * base_index + 1 on, so last_index == base_index: none yet. */
	uint64_t base_index;
	char step0[MOAT_ID_MAX]; /* snapshot before step 1 ("" : none) */
	uint32_t snapshots;      /* steps with a snapshot, as far as this
	                             * gateway knows (UINT32_MAX: unknown) */
	Moat__V1__FsTrace *prev; /* owned: the trace after the last step */
	uint64_t checked_ms;     /* monotonic: when sessiond last said */
};

/* record_entry_own: this thread's turn on e, after the steps that came before
 * (blocks until then). moat_record_entry_release ends it. */
void record_entry_own(struct moat_record_entry *e);

/* record_node_call: `method` of moat.v1.Vm with `req` for `tenant` on
 * the node holding `sandbox_id`; the reply decoded as `reply_desc`
 * (caller frees), else *errmsg (heap). */
int record_node_call(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *reply_desc, uint64_t deadline,
    const char *what, ProtobufCMessage **out, char **errmsg);

/* record_call_timeout: what a recording call gets: the caller's time left, but
 * at least RECORD_CALL_MIN_MS (the exec has run; its step must land). */
uint32_t record_call_timeout(uint64_t deadline_ms);

/* record_trace_fs: the hashed filesystem trace of `sandbox_id` from its node.
 * On MOAT_OK *out is the caller's; else *errmsg (heap, caller frees). */
int record_trace_fs(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t deadline_ms, Moat__V1__FsTrace **out,
    char **errmsg);

/* record_set_step_snapshot: attaches `snapshot_id` to step `index` (0: the
 * session's step-0 label), with at least RECORD_CALL_MIN_MS. */
int record_set_step_snapshot(struct moat_record *rec, const char *tenant,
    const char *session_id, uint64_t index, const char *snapshot_id,
    uint64_t deadline_ms, char **errmsg);

/* record_label_of: the value of `key` in a session's labels, or NULL. */
const char *record_label_of(const Moat__V1__SessionInfo *s, const char *key);

/* record_latest_session: the newest session of `list` (NULL: none). */
const Moat__V1__SessionInfo *record_latest_session(
    const Moat__V1__ListSessionsReply *list);

/* record_lookup: the entry of `sandbox_id`: from the table, else (a gateway
 * restarted since the sandbox was created) from sessiond: the latest
 * session recording it. A sandbox sessiond has no session for is
 * remembered as not recorded; when sessiond does not answer, NULL and
 * nothing is remembered. */
struct moat_record_entry *record_lookup(struct moat_record *rec,
    const char *tenant, const char *sandbox_id, uint64_t request_id);

/* record_retain: one more of e's steps has a snapshot: once the session may
 * hold more than the tenant's keep-last, retention runs (e is the
 * caller's). */
void record_retain(struct moat_record *rec, struct moat_record_entry *e,
    const char *tenant, uint64_t request_id);

#endif
