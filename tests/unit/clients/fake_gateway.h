/*
 * fake_gateway.h: an in-process moat.v1.Gateway for the client library
 * and CLI tests: one file store (bytes by path), scripted exec results
 * chosen by the code sent, one recorded sandbox ("sb-rec"), canned
 * snapshot and session replies, a canned image build and image list
 * (issue 17), and a record of the calls that matter.
 * Not for: anything but tests.
 */
#ifndef MOAT_TEST_FAKE_GATEWAY_H
#define MOAT_TEST_FAKE_GATEWAY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"

#define FAKE_GW_FILE_MAX (8u << 20)

struct fake_gateway {
	char url[256];
	struct moat_rpc_server *srv;

	pthread_mutex_t lock; /* guards everything below */
	char file_path[256];  /* the one stored file */
	uint8_t *file;        /* FAKE_GW_FILE_MAX bytes */
	size_t file_len;
	uint32_t file_mode;
	int write_calls, read_calls;
	size_t largest_write; /* bytes in one WriteFile */
	int first_write_truncated;
	int creates, destroys;
	char destroyed[128];
	char exec_language[32];
	char exec_code[256];
	int exec_reads;
	int execs;     /* Exec calls (recorded sandboxes) */
	int exec_keep; /* the last Exec's / RunCode's keep */
	int code_keep;
	char keep_session[64]; /* the last SetStepKeep */
	uint64_t keep_index;
	int keep_keep;
	int gc_calls, gc_dry_run; /* the last GcSnapshots */
	uint32_t gc_min_age;
	/* Lifetimes (issue 15): the last create's and SetTimeout's. */
	uint32_t create_timeout, create_idle;
	int set_timeouts;
	uint32_t life_timeout, life_idle;
	int life_clear;
	/* Images (issue 17): the last StartImageBuild's, and the
	 * GetImageBuild polls. Build "b-1" runs on "node-x": two steps,
	 * then done (or failed when the name is "broken"). */
	char build_name[64];
	char build_spec[512];
	char build_files[256]; /* "name:mode:bytes " of each file sent */
	int build_force;
	char build_node[64];
	int build_polls;
	char pushed[64], push_node[64], removed[64];
	/* The last RestoreStep's (issue 18: reseed). */
	int restores;
	char restore_session[64], restore_sandbox[64];
	uint64_t restore_step;
	int restore_new, restore_reseed;
};

/* fake_gateway_start: serves on ipc://<dir>/gateway.sock. */
int fake_gateway_start(struct fake_gateway *fg, const char *dir);
void fake_gateway_stop(struct fake_gateway *fg);

#endif
