/*
 * fake_node.h: a stand-in for moat-vmd in the gateway's unit tests: a
 * respondent0 socket that answers the gateway's surveys with a
 * moat.v1.Node (or garbage, or nothing), and an in-process moat.v1.Vm RPC
 * server that keeps sandboxes in memory and records what it was asked.
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
	atomic_bool silent;          /* do not answer surveys */
	atomic_bool garbage;         /* answer with bytes that are no Node */
	atomic_int surveys_answered;

	pthread_mutex_t lock;        /* guards everything below */
	uint64_t last_request_id;
	char last_method[64];
	char last_tenant[64];
	char last_sandbox[128];
	int calls;
	char sandboxes[FAKE_MAX_SANDBOXES][128];
	char tenants[FAKE_MAX_SANDBOXES][64]; /* "": any (added ones) */
	int n_sandboxes;
	int next_sandbox;
	int restores;                /* RestoreSandbox calls */
	int fail_restore_every;      /* > 0: every n-th restore fails */
	int snapshots;               /* SnapshotSandbox calls */
	int traces;                  /* TraceFs calls */
};

/* fake_node_start: serves Vm on ipc://<dir>/<id>.sock and answers
 * surveys from survey_url (empty: no respondent). 0 or a status. */
int fake_node_start(struct fake_node *fn, const char *id, const char *dir,
    const char *survey_url);

/* fake_node_add_sandbox: a sandbox the gateway never saw created. */
void fake_node_add_sandbox(struct fake_node *fn, const char *sandbox_id);

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

/* fake_node_stop: everything (halts first); safe after kill_rpc. */
void fake_node_stop(struct fake_node *fn);

#endif
