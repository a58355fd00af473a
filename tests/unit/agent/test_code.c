/*
 * test_code.c: moat-agent's persistent code contexts, black-box: the
 * built agent runs in host mode and the tests send CodeRun and
 * CodeContextRef. State that survives runs (variables, imports,
 * functions), the last expression's repr, exceptions with their
 * traceback, output of the interpreter and of its child processes, a
 * timeout that interrupts a cell but keeps the context, independent
 * contexts, an interpreter that dies (and the fresh one after it), close,
 * and the refusals (bad name, unknown language, node, too many contexts).
 * Not for: one-shot execs (test_exec.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_client.h"
#include "moat/status.h"

static int
group_setup(void **state)
{
	static struct tagent t;

	if (tagent_start(&t, NULL, false) != 0)
		return -1;
	*state = &t;
	return 0;
}

static int
group_teardown(void **state)
{
	tagent_stop(*state);
	return 0;
}

/* run: one CodeRun; returns the answer (caller frees). */
static Moat__V1__GuestMessage *
run_lang(struct tagent *t, const char *ctx, const char *lang, const char *code,
    uint32_t timeout_ms)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__CodeRun cr = MOAT__V1__CODE_RUN__INIT;
	Moat__V1__GuestMessage *m;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_CODE_RUN;
	req.code_run = &cr;
	cr.context = (char *)ctx;
	cr.language = (char *)lang;
	cr.code = (char *)code;
	cr.timeout_ms = timeout_ms;
	m = tagent_call(t, &req);
	assert_non_null(m);
	return m;
}

/* run_ok: a run that must come back as a CodeResult. */
static Moat__V1__GuestMessage *
run_ok(struct tagent *t, const char *ctx, const char *code,
    uint32_t timeout_ms)
{
	Moat__V1__GuestMessage *m = run_lang(t, ctx, "", code, timeout_ms);

	if (m->code != MOAT__V1__CODE__OK)
		print_error("code_run failed: %s\n", m->message);
	assert_int_equal(m->code, MOAT__V1__CODE__OK);
	assert_int_equal(m->body_case,
	    MOAT__V1__GUEST_MESSAGE__BODY_CODE_RESULT);
	return m;
}

static int
close_ctx(struct tagent *t, const char *ctx)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__CodeContextRef ref = MOAT__V1__CODE_CONTEXT_REF__INIT;
	Moat__V1__GuestMessage *m;
	int code;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_CODE_CONTEXT_CLOSE;
	req.code_context_close = &ref;
	ref.context = (char *)ctx;
	m = tagent_call(t, &req);
	assert_non_null(m);
	code = (int)m->code;
	moat__v1__guest_message__free_unpacked(m, NULL);
	return code;
}

static void
test_state_survives(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	Moat__V1__CodeResult *r;

	m = run_ok(t, "keep",
	    "import math\ndef sq(x):\n    return x * x\n"
	    "class P:\n    k = 7\nx = 41\nprint('hi')",
	    0);
	r = m->code_result;
	assert_true(r->context_created);
	assert_int_equal(r->execution_count, 1);
	assert_string_equal(r->context, "keep");
	assert_string_equal(r->language, "python");
	assert_false(r->has_result);
	assert_string_equal(r->error_name, "");
	assert_int_equal(r->stdout.len, 3);
	assert_memory_equal(r->stdout.data, "hi\n", 3);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_ok(t, "keep", "x += 1\nsq(x) + math.floor(0.5) + P.k", 0);
	r = m->code_result;
	assert_false(r->context_created);
	assert_int_equal(r->execution_count, 2);
	assert_true(r->has_result);
	assert_string_equal(r->result, "1771");
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_ok(t, "keep", "[x, math.pi > 3, 'a' * 2]", 0);
	r = m->code_result;
	assert_int_equal(r->execution_count, 3);
	assert_string_equal(r->result, "[42, True, 'aa']");
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* a None value is no result; a statement is none either */
	m = run_ok(t, "keep", "None", 0);
	assert_false(m->code_result->has_result);
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "keep"), MOAT_OK);
}

static void
test_exception(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	Moat__V1__CodeResult *r;

	m = run_ok(t, "exc",
	    "def f():\n    raise ValueError('bad thing')\n"
	    "print('before')\nf()",
	    0);
	r = m->code_result;
	assert_string_equal(r->error_name, "ValueError");
	assert_string_equal(r->error_value, "bad thing");
	assert_non_null(strstr(r->traceback, "Traceback"));
	assert_non_null(strstr(r->traceback, "in f"));
	assert_non_null(strstr(r->traceback, "raise ValueError"));
	assert_non_null(strstr(r->traceback, "ValueError: bad thing"));
	/* the driver's own frames are not shown */
	assert_null(strstr(r->traceback, "<string>"));
	assert_false(r->has_result);
	assert_memory_equal(r->stdout.data, "before\n", 7);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_ok(t, "exc", "def (:", 0);
	assert_string_equal(m->code_result->error_name, "SyntaxError");
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* SystemExit is the cell's error, not the context's end */
	m = run_ok(t, "exc", "import sys\nsys.exit(3)", 0);
	assert_string_equal(m->code_result->error_name, "SystemExit");
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "exc", "f.__name__", 0);
	assert_false(m->code_result->context_created);
	assert_string_equal(m->code_result->result, "'f'");
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "exc"), MOAT_OK);
}

static void
test_child_output(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	Moat__V1__CodeResult *r;

	m = run_ok(t, "out",
	    "import os, sys\nos.system('echo from-child; echo err-child >&2')"
	    "\nos.write(1, b'raw\\n')\nprint('warn', file=sys.stderr)\n0",
	    0);
	r = m->code_result;
	assert_non_null(
	    memmem(r->stdout.data, r->stdout.len, "from-child\n", 11));
	assert_non_null(memmem(r->stdout.data, r->stdout.len, "raw\n", 4));
	assert_non_null(
	    memmem(r->stderr.data, r->stderr.len, "err-child\n", 10));
	assert_non_null(memmem(r->stderr.data, r->stderr.len, "warn\n", 5));
	assert_string_equal(r->result, "0");
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* output is capped like exec's (1 MiB a stream) and says so */
	m = run_ok(t, "out", "print('x' * (3 << 20))", 0);
	r = m->code_result;
	assert_true(r->stdout.len > 1u << 20);
	assert_true(r->stdout.len < (1u << 20) + 200);
	assert_non_null(
	    memmem(r->stdout.data, r->stdout.len, "were dropped", 12));
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "out"), MOAT_OK);
}

static void
test_timeout_keeps_context(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	Moat__V1__CodeResult *r;

	m = run_ok(t, "slow", "y = 'kept'", 0);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "slow", "n = 0\nwhile True:\n    n += 1", 300);
	r = m->code_result;
	assert_true(r->timed_out);
	assert_string_equal(r->error_name, "KeyboardInterrupt");
	assert_non_null(strstr(r->error_value, "timeout"));
	assert_true(r->duration_us >= 300000);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_ok(t, "slow", "(y, n > 0)", 0);
	r = m->code_result;
	assert_false(r->timed_out);
	assert_false(r->context_created);
	assert_string_equal(r->error_name, "");
	assert_string_equal(r->result, "('kept', True)");
	assert_int_equal(r->execution_count, 3);
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* time.sleep is interrupted too */
	m = run_ok(t, "slow", "import time\ntime.sleep(60)", 200);
	assert_true(m->code_result->timed_out);
	assert_string_equal(m->code_result->error_name, "KeyboardInterrupt");
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* a cell that swallows the interrupt is killed after the grace */
	m = run_ok(t, "slow",
	    "import signal\n"
	    "signal.signal(signal.SIGINT, lambda *a: None)\n"
	    "while True: pass",
	    200);
	r = m->code_result;
	assert_true(r->timed_out);
	assert_string_equal(r->error_name, "ContextDied");
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "slow", "'y' in dir()", 0);
	assert_true(m->code_result->context_created);
	assert_string_equal(m->code_result->result, "False");
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "slow"), MOAT_OK);
}

static void
test_independent_contexts(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;

	m = run_ok(t, "a", "v = 'A'", 0);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "b.2", "v = 'B'", 0);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "a", "v", 0);
	assert_string_equal(m->code_result->result, "'A'");
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "b.2", "v", 0);
	assert_string_equal(m->code_result->result, "'B'");
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* "" is "default" */
	m = run_ok(t, "", "w = 5", 0);
	assert_string_equal(m->code_result->context, "default");
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "default", "w", 0);
	assert_string_equal(m->code_result->result, "5");
	moat__v1__guest_message__free_unpacked(m, NULL);

	assert_int_equal(close_ctx(t, "a"), MOAT_OK);
	assert_int_equal(close_ctx(t, "a"), MOAT_NOT_FOUND);
	m = run_ok(t, "a", "'v' in dir()", 0);
	assert_true(m->code_result->context_created);
	assert_string_equal(m->code_result->result, "False");
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "a"), MOAT_OK);
	assert_int_equal(close_ctx(t, "b.2"), MOAT_OK);
	assert_int_equal(close_ctx(t, ""), MOAT_OK);
}

static void
test_context_dies(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	Moat__V1__CodeResult *r;

	m = run_ok(t, "mortal", "z = 1", 0);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = run_ok(t, "mortal", "import os\nprint('bye')\nos._exit(7)", 0);
	r = m->code_result;
	assert_string_equal(r->error_name, "ContextDied");
	assert_non_null(strstr(r->error_value, "status 7"));
	assert_memory_equal(r->stdout.data, "bye\n", 4);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_ok(t, "mortal", "'z' in dir()", 0);
	r = m->code_result;
	assert_true(r->context_created);
	assert_int_equal(r->execution_count, 1);
	assert_string_equal(r->result, "False");
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* killed by a signal from inside */
	m = run_ok(t, "mortal",
	    "import os, signal\n"
	    "os.kill(os.getpid(), signal.SIGKILL)",
	    0);
	assert_string_equal(m->code_result->error_name, "ContextDied");
	assert_non_null(strstr(m->code_result->error_value, "signal 9"));
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "mortal"), MOAT_NOT_FOUND);
}

static void
test_refusals(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	char name[80];

	m = run_lang(t, "bad/name", "", "1", 0);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(m->message, "bad/name"));
	moat__v1__guest_message__free_unpacked(m, NULL);
	memset(name, 'n', 65);
	name[65] = '\0';
	m = run_lang(t, name, "", "1", 0);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	moat__v1__guest_message__free_unpacked(m, NULL);
	name[64] = '\0'; /* 64 is fine */
	m = run_lang(t, name, "", "1", 0);
	assert_int_equal(m->code, MOAT_OK);
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, name), MOAT_OK);

	m = run_lang(t, "", "ruby", "1", 0);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(m->message, "python"));
	assert_non_null(strstr(m->message, "ruby"));
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* the agent's root has no node */
	m = run_lang(t, "", "node", "1", 0);
	assert_int_equal(m->code, MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(m->message, "no node"));
	assert_non_null(strstr(m->message, "python"));
	moat__v1__guest_message__free_unpacked(m, NULL);
}

/* A node context where the root has node (a stub for the host's): state,
 * require()d modules and functions persist, the completion value is the
 * result, errors carry name/value/stack, a timeout interrupts the cell
 * and keeps the context. Skipped when the host has no node. */
static void
test_node_context(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	Moat__V1__CodeResult *r;
	char dir[300], link[320], cmd[1024];

	if (access("/usr/bin/node", X_OK) != 0)
		skip();
	snprintf(dir, sizeof(dir), "%s/usr/bin", t->root);
	snprintf(link, sizeof(link), "%s/node", dir);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
	assert_int_equal(system(cmd), 0);
	/* The agent looks for node inside its root; in host mode the
	 * interpreter itself comes from the host's PATH. */
	snprintf(cmd, sizeof(cmd),
	    "printf '#!/bin/sh\\nexec /usr/bin/node "
	    "\"$@\"\\n' >'%s' && chmod 755 '%s'",
	    link, link);
	assert_int_equal(system(cmd), 0);

	m = run_lang(t, "js", "node",
	    "const os = require('os');\nfunction dbl(x) { return x * 2; }\n"
	    "let n = 20;\nconsole.log('hi');\nn + 1",
	    0);
	assert_int_equal(m->code, MOAT_OK);
	r = m->code_result;
	assert_string_equal(r->language, "node");
	assert_true(r->context_created);
	if (!r->has_result)
		print_error("node: %s: %s\n%.*s\n", r->error_name,
		    r->error_value, (int)r->stderr.len,
		    (const char *)r->stderr.data);
	assert_true(r->has_result);
	assert_string_equal(r->result, "21");
	assert_int_equal(r->stdout.len, 3);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_lang(t, "js", "node", "typeof os.platform() + dbl(n + 1)", 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_string_equal(m->code_result->result, "'string42'");
	assert_false(m->code_result->context_created);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_lang(t, "js", "node", "null.x", 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_string_equal(m->code_result->error_name, "TypeError");
	assert_non_null(strstr(m->code_result->traceback, "<cell-"));
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_lang(t, "js", "node", "while (true) {}", 500);
	assert_int_equal(m->code, MOAT_OK);
	assert_true(m->code_result->timed_out);
	assert_string_equal(m->code_result->error_name, "KeyboardInterrupt");
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = run_lang(t, "js", "node", "dbl(n)", 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_string_equal(m->code_result->result, "40");
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* one context, one language */
	m = run_lang(t, "js", "python", "1", 0);
	assert_int_equal(m->code, MOAT_FAILED_PRECONDITION);
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "js"), MOAT_OK);
	unlink(link);
}

static void
test_too_many(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	char name[16];
	int i;

	for (i = 0; i < 16; i++) {
		snprintf(name, sizeof(name), "c%d", i);
		m = run_ok(t, name, "1", 0);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	m = run_lang(t, "c16", "", "1", 0);
	assert_int_equal(m->code, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(m->message, "close one"));
	moat__v1__guest_message__free_unpacked(m, NULL);
	for (i = 0; i < 16; i++) {
		snprintf(name, sizeof(name), "c%d", i);
		assert_int_equal(close_ctx(t, name), MOAT_OK);
	}
	m = run_ok(t, "c16", "2", 0);
	assert_string_equal(m->code_result->result, "2");
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(close_ctx(t, "c16"), MOAT_OK);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_state_survives),
		cmocka_unit_test(test_exception),
		cmocka_unit_test(test_child_output),
		cmocka_unit_test(test_timeout_keeps_context),
		cmocka_unit_test(test_independent_contexts),
		cmocka_unit_test(test_context_dies),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_too_many),
		cmocka_unit_test(test_node_context),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
