/*
 * fake_node.h: a stand-in for moat-vmd in the gateway's unit tests: a
 * respondent0 socket that answers the gateway's surveys with a
 * moat.v1.Node (or garbage, or nothing), and an in-process moat.v1.Vm RPC
 * server that keeps sandboxes and their snapshots in memory and records
 * what it was asked.
 * Not for: anything but tests; it boots nothing.
 */
#ifndef MOAT_TEST_FAKE_NODE_H
#define MOAT_TEST_FAKE_NODE_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "moat/rpc.h"

#define FAKE_MAX_SANDBOXES 64
#define FAKE_MAX_HELD 256 /* held Execs at once */
#define FAKE_MAX_SNAPSHOTS 128
#define FAKE_MAX_IMAGES 8
#define FAKE_SNAP_RAM (50u << 20) /* a snapshot's RAM copy, resident */
#define FAKE_SNAP_DISK (1u << 20) /* and its disk copy */
#define FAKE_PULLED_BYTES 12345u  /* a restore of a snapd id pulls this */

/* One local snapshot the fake node holds (as vmd's meta says it). */
struct fake_snapshot {
	char id[128];
	char sandbox[128];
	char tenant[64];
	char session[64]; /* SnapshotSandboxRequest.session_id */
	uint64_t step;
	uint64_t created_ms; /* unix ms */
	bool is_template;
};

struct fake_node {
	char id[64];
	char rpc_url[256];
	char survey_url[256];
	uint64_t memory_total_mib;   /* reported; default 4096 */
	struct moat_rpc_server *srv; /* NULL once killed */
	nng_socket resp;
	bool has_resp;
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	atomic_bool silent;  /* do not answer surveys */
	atomic_bool garbage; /* answer with bytes that are no Node */
	atomic_int surveys_answered;
	atomic_int get_delay_ms; /* GetSandbox answers this much later */
	/* SnapshotSandbox of a sandbox held: deferred until
	 * fake_node_release_held, then taken and "pushed" to snapd. */
	atomic_bool hold_snapshots;

	/* RestoreSandbox of a moat-snapd id ("snap-<32 hex>"): the node
	 * "pulls" it (FAKE_PULLED_BYTES) without holding it. */
	char last_restore_snap[128];
	/* A snapd id whose chunks are "corrupt": its restore is DATA_LOSS
	 * naming the chunk, and leaves nothing behind. */
	char corrupt_snap[128];

	pthread_mutex_t lock; /* guards everything below */
	uint64_t last_request_id;
	char last_method[64];
	char last_tenant[64];
	char last_call_tenant[64]; /* Envelope.tenant of the last call */
	int untenanted;            /* calls refused: no Envelope.tenant */
	char last_sandbox[128];
	int calls;
	char sandboxes[FAKE_MAX_SANDBOXES][128];
	char tenants[FAKE_MAX_SANDBOXES][64]; /* "": any (added ones) */
	int n_sandboxes;
	int set_timeouts;        /* SetTimeout calls (issue 15) */
	int cordons;             /* Cordon calls (issue 15) */
	uint32_t last_timeout_s; /* the last one's timeout_s */
	/* ExecStart, ExecWrite and ExecResize in the order they came:
	 * "start(pty) write(abc) resize(30x100) close " (Attach). */
	char exec_log[256];
	int next_sandbox;
	int restores; /* RestoreSandbox calls */
	/* The last RestoreSandbox's in-place target and reseed (issue 18). */
	char last_restore_replace[128];
	int last_restore_reseed;
	int fail_restore_every; /* > 0: every n-th restore fails */
	int snapshots;          /* SnapshotSandbox calls */
	int traces;             /* TraceFs calls */
	int execs;              /* Exec calls, held ones too */
	struct fake_snapshot snaps[FAKE_MAX_SNAPSHOTS]; /* held now */
	int n_snaps;
	char deleted[FAKE_MAX_SNAPSHOTS][128]; /* DeleteLocalSnapshot'd */
	int n_deleted;
	/* Exec of argv {"hold", N}: deferred (moat_rpc_defer) until
	 * fake_node_release_held, then answered with exit code N. */
	struct moat_rpc_deferred *held[FAKE_MAX_HELD];
	int held_code[FAKE_MAX_HELD];
	int n_held;
	/* PutArchive / GetArchive (issue 17): each chunk as it came,
	 * "put(UPLOAD@OFFSET+LEN) " ("put(...,last) " for the last) and
	 * "get(DOWNLOAD@OFFSET+LENGTH) "; the upload reassembled from its
	 * chunks; and the archive GetArchive packs: archive_get_size bytes,
	 * byte i being (i * 7) % 251. Path "/missing" is NOT_FOUND either
	 * way; an upload into "/refuse" is refused at its last chunk. */
	char archive_log[1024];
	uint8_t *put_data; /* heap */
	size_t put_len;
	bool put_done;
	int archive_ids;
	uint64_t archive_get_size;
	/* Images (issue 17): what it holds (listed in its survey answer
	 * and ListImages; "default" at start), each sandbox's image ("":
	 * "default"), the builds it was asked for, images removed. A
	 * remove of `refuse_remove` is refused (a local snapshot uses
	 * it). */
	char images[FAKE_MAX_IMAGES][64];
	int n_images;
	char sb_images[FAKE_MAX_SANDBOXES][64];
	char last_build[64];
	int builds, build_polls, image_removes, image_pushes;
	uint32_t last_wait_ms; /* the last GetImageBuild's wait_ms */
	char refuse_remove[64];
	struct moat_rpc_deferred *held_snap[FAKE_MAX_HELD];
	char held_snap_sandbox[FAKE_MAX_HELD][128];
	int n_held_snaps;
};

/* fake_node_start: serves Vm on ipc://<dir>/<id>.sock and answers
 * surveys from survey_url (empty: no respondent). 0 or a status. */
int fake_node_start(struct fake_node *fn, const char *id, const char *dir,
    const char *survey_url);

/* fake_node_has_sandbox: whether the node holds `sandbox_id`. */
bool fake_node_has_sandbox(struct fake_node *fn, const char *sandbox_id);

/* fake_node_add_sandbox: a sandbox the gateway never saw created. */
void fake_node_add_sandbox(struct fake_node *fn, const char *sandbox_id);

/* fake_node_add_snapshot: a snapshot the gateway never saw taken, of
 * `sandbox_id` for `tenant`, `age_ms` old (a template when is_template).
 */
void fake_node_add_snapshot(struct fake_node *fn, const char *id,
    const char *sandbox_id, const char *tenant, uint64_t age_ms,
    bool is_template);

/* fake_node_age_snapshots: every snapshot held becomes `ms` older. */
void fake_node_age_snapshots(struct fake_node *fn, uint64_t ms);

/* fake_node_snapshot: a copy of snapshot `id` into *out (optional);
 * false when the node does not hold it. */
bool fake_node_snapshot(struct fake_node *fn, const char *id,
    struct fake_snapshot *out);

/* fake_node_was_deleted: whether DeleteLocalSnapshot deleted `id`. */
bool fake_node_was_deleted(struct fake_node *fn, const char *id);

/* fake_node_kill_rpc: stops the Vm server (the node "dies") while the
 * respondent keeps answering or not, as set. */
void fake_node_kill_rpc(struct fake_node *fn);

/* fake_node_halt: stops answering surveys for good (the respondent
 * thread ends; the socket stays open until fake_node_stop). Tests halt
 * every node before stopping the gateway, and stop nodes after it: nng
 * 1.5 can hang for good in nng_close when a message arrives on the socket
 * while it closes (nng issues 1543, 1813), so no socket is closed while
 * its peer still sends. */
void fake_node_halt(struct fake_node *fn);

/* fake_node_held: how many held Execs and snapshots wait.
 * Thread-safe. */
int fake_node_held(struct fake_node *fn);

/* fake_node_release_held: answers every held Exec (exit code N) and
 * every held snapshot (taken, with a moat-snapd id, remote_stored). */
void fake_node_release_held(struct fake_node *fn);

/* fake_node_add_image: the node holds image `name` from now on. */
void fake_node_add_image(struct fake_node *fn, const char *name);

/* fake_node_has_image: whether it holds `name`. */
bool fake_node_has_image(struct fake_node *fn, const char *name);

/* fake_node_stop: everything (halts first); safe after kill_rpc. */
void fake_node_stop(struct fake_node *fn);

#endif
