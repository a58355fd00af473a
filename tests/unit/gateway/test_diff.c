/*
 * test_diff.c: unit tests of gateway/diff.c's pure builders: Diff's
 * per-step comparison (created / modified / deleted files, outputs, exit
 * codes), the first divergent step, a session longer than the other, the
 * net folding of whole sessions, and Compare's scores and ranking.
 * Not for: the handlers' sessiond calls (the stack test drives those).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "gateway.h"

#define MAX_FILES 8

/* A step built on the test's stack: borrowed by the views. */
struct tstep {
	Moat__V1__Step step;
	Moat__V1__FsTraceEntry ents[MAX_FILES];
	Moat__V1__FsTraceEntry *ptrs[MAX_FILES];
	uint8_t hashes[MAX_FILES][32];
};

static void
tstep_init(struct tstep *t, uint64_t index, const char *input, int exit_code,
    const char *out)
{
	memset(t, 0, sizeof(*t));
	moat__v1__step__init(&t->step);
	t->step.index = index;
	t->step.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	t->step.input = (char *)input;
	t->step.exit_code = exit_code;
	t->step.stdout.data = (uint8_t *)out;
	t->step.stdout.len = strlen(out);
	t->step.started_ms = 1000 * index;
	t->step.ended_ms = 1000 * index + 500;
	t->step.fs_trace = t->ptrs;
}

/* tstep_file: adds a trace entry; `hash_byte` fills its sha256 (0: none,
 * as for a deleted file). */
static void
tstep_file(struct tstep *t, const char *path, Moat__V1__FsChange change,
    uint8_t hash_byte)
{
	size_t i = t->step.n_fs_trace++;

	assert_true(i < MAX_FILES);
	moat__v1__fs_trace_entry__init(&t->ents[i]);
	t->ents[i].path = (char *)path;
	t->ents[i].change = change;
	if (hash_byte != 0) {
		memset(t->hashes[i], hash_byte, 32);
		t->ents[i].sha256.data = t->hashes[i];
		t->ents[i].sha256.len = 32;
	}
	t->ptrs[i] = &t->ents[i];
}

#define CREATED MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED
#define MODIFIED MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED
#define DELETED MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED

static Moat__V1__DiffReply *
diff(const char *ida, Moat__V1__Step **a, size_t na, const char *idb,
    Moat__V1__Step **b, size_t nb)
{
	struct moat_session_view va = { .session_id = ida,
		.steps = a,
		.n_steps = na };
	struct moat_session_view vb = { .session_id = idb,
		.steps = b,
		.n_steps = nb };
	Moat__V1__DiffReply *r = malloc(sizeof(*r));

	assert_non_null(r);
	moat__v1__diff_reply__init(r);
	assert_int_equal(moat_diff_build(&va, &vb, r), MOAT_OK);
	return r;
}

static const Moat__V1__FileDiff *
find_file(Moat__V1__FileDiff **files, size_t n, const char *path)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(files[i]->path, path) == 0)
			return files[i];
	return NULL;
}

/* Same two first steps, then one side creates, modifies and deletes. */
static void
test_diff_created_modified_deleted(void **state)
{
	struct tstep a1, a2, a3, b1, b2, b3;
	Moat__V1__Step *a[3] = { &a1.step, &a2.step, &a3.step };
	Moat__V1__Step *b[3] = { &b1.step, &b2.step, &b3.step };
	Moat__V1__DiffReply *r;
	const Moat__V1__StepDiff *s3;
	const Moat__V1__FileDiff *f;

	tstep_init(&a1, 1, "echo one > /w/keep", 0, "");
	tstep_file(&a1, "/w/keep", CREATED, 0x11);
	tstep_init(&b1, 1, "echo one > /w/keep", 0, "");
	tstep_file(&b1, "/w/keep", CREATED, 0x11);
	tstep_init(&a2, 2, "ls /w", 0, "keep\n");
	tstep_init(&b2, 2, "ls /w", 0, "keep\n");
	tstep_init(&a3, 3, "true", 0, "");
	tstep_init(&b3, 3, "touch /w/new; echo x >> /w/keep; rm /w/old", 0,
	    "");
	tstep_file(&b3, "/w/keep", MODIFIED, 0x22);
	tstep_file(&b3, "/w/new", CREATED, 0x33);
	tstep_file(&b3, "/w/old", DELETED, 0);

	r = diff("ses-a", a, 3, "ses-b", b, 3);
	assert_string_equal(r->session_a, "ses-a");
	assert_string_equal(r->session_b, "ses-b");
	assert_int_equal(r->first_divergent_step, 3);
	assert_int_equal(r->steps_a, 3);
	assert_int_equal(r->steps_b, 3);
	assert_int_equal(r->n_steps, 3);
	assert_true(r->steps[0]->same);
	assert_true(r->steps[1]->same);
	assert_int_equal(r->steps[0]->n_files, 0);
	s3 = r->steps[2];
	assert_false(s3->same);
	assert_int_equal(s3->index, 3);
	assert_true(s3->in_a && s3->in_b);
	assert_true(s3->input_differs);
	assert_false(s3->stdout_differs);
	assert_string_equal(s3->input_b,
	    "touch /w/new; echo x >> /w/keep; rm /w/old");
	assert_int_equal(s3->n_files, 3);
	/* sorted by path */
	assert_string_equal(s3->files[0]->path, "/w/keep");
	assert_string_equal(s3->files[0]->change_a, "");
	assert_string_equal(s3->files[0]->change_b, "modified");
	assert_string_equal(s3->files[0]->sha256_b,
	    "222222222222222222222222222222222222222222222222222222222222222"
	    "2");
	assert_string_equal(s3->files[1]->change_b, "created");
	assert_string_equal(s3->files[2]->path, "/w/old");
	assert_string_equal(s3->files[2]->change_b, "deleted");
	assert_string_equal(s3->files[2]->sha256_b, "");

	/* Net: a created keep (0x11); b created keep with 0x22, created
	 * new, deleted old. */
	assert_int_equal(r->n_files, 3);
	f = find_file(r->files, r->n_files, "/w/keep");
	assert_non_null(f);
	assert_string_equal(f->change_a, "created");
	assert_string_equal(f->change_b, "created");
	assert_string_equal(f->sha256_a,
	    "111111111111111111111111111111111111111111111111111111111111111"
	    "1");
	f = find_file(r->files, r->n_files, "/w/new");
	assert_non_null(f);
	assert_string_equal(f->change_a, "");
	assert_string_equal(f->change_b, "created");
	f = find_file(r->files, r->n_files, "/w/old");
	assert_non_null(f);
	assert_string_equal(f->change_b, "deleted");
	moat__v1__diff_reply__free_unpacked(r, NULL);
}

/* Identical sessions agree; the same session twice too. */
static void
test_diff_same(void **state)
{
	struct tstep a1, a2;
	Moat__V1__Step *a[2] = { &a1.step, &a2.step };
	Moat__V1__DiffReply *r;

	tstep_init(&a1, 1, "touch /f", 0, "");
	tstep_file(&a1, "/f", CREATED, 0x44);
	tstep_init(&a2, 2, "cat /f", 0, "");
	r = diff("ses-a", a, 2, "ses-a", a, 2);
	assert_int_equal(r->first_divergent_step, 0);
	assert_int_equal(r->n_files, 0);
	assert_int_equal(r->n_steps, 2);
	assert_true(r->steps[0]->same && r->steps[1]->same);
	moat__v1__diff_reply__free_unpacked(r, NULL);

	r = diff("ses-e", NULL, 0, "ses-f", NULL, 0);
	assert_int_equal(r->first_divergent_step, 0);
	assert_int_equal(r->n_steps, 0);
	moat__v1__diff_reply__free_unpacked(r, NULL);
}

/* Same input, different exit code, outputs or file hash: not same. */
static void
test_diff_outputs_and_hashes(void **state)
{
	struct tstep a1, b1, a2, b2, a3, b3;
	Moat__V1__Step *a[3] = { &a1.step, &a2.step, &a3.step };
	Moat__V1__Step *b[3] = { &b1.step, &b2.step, &b3.step };
	Moat__V1__DiffReply *r;

	tstep_init(&a1, 1, "make", 0, "ok");
	tstep_init(&b1, 1, "make", 2, "ok");
	tstep_init(&a2, 2, "date", 0, "Mon");
	tstep_init(&b2, 2, "date", 0, "Tue");
	tstep_init(&a3, 3, "gen", 0, "");
	tstep_file(&a3, "/out", CREATED, 0x01);
	tstep_init(&b3, 3, "gen", 0, "");
	tstep_file(&b3, "/out", CREATED, 0x02);
	r = diff("a", a, 3, "b", b, 3);
	assert_int_equal(r->first_divergent_step, 1);
	assert_false(r->steps[0]->same);
	assert_false(r->steps[0]->input_differs);
	assert_int_equal(r->steps[0]->exit_code_a, 0);
	assert_int_equal(r->steps[0]->exit_code_b, 2);
	assert_false(r->steps[1]->same);
	assert_true(r->steps[1]->stdout_differs);
	assert_false(r->steps[1]->stderr_differs);
	assert_false(r->steps[2]->same);
	assert_int_equal(r->steps[2]->n_files, 1);
	assert_string_equal(r->steps[2]->files[0]->change_a, "created");
	assert_string_equal(r->steps[2]->files[0]->change_b, "created");
	assert_string_not_equal(r->steps[2]->files[0]->sha256_a,
	    r->steps[2]->files[0]->sha256_b);
	moat__v1__diff_reply__free_unpacked(r, NULL);
}

/* One session longer: the extra steps are on one side only, and the
 * first of them is the first divergence. */
static void
test_diff_one_longer(void **state)
{
	struct tstep a1, a2, a3, b1, b2;
	Moat__V1__Step *a[3] = { &a1.step, &a2.step, &a3.step };
	Moat__V1__Step *b[2] = { &b1.step, &b2.step };
	Moat__V1__DiffReply *r;

	tstep_init(&a1, 1, "ls", 0, "x");
	tstep_init(&b1, 1, "ls", 0, "x");
	tstep_init(&a2, 2, "pwd", 0, "/");
	tstep_init(&b2, 2, "pwd", 0, "/");
	tstep_init(&a3, 3, "touch /z", 0, "");
	tstep_file(&a3, "/z", CREATED, 0x05);
	r = diff("a", a, 3, "b", b, 2);
	assert_int_equal(r->first_divergent_step, 3);
	assert_int_equal(r->steps_a, 3);
	assert_int_equal(r->steps_b, 2);
	assert_int_equal(r->n_steps, 3);
	assert_true(r->steps[2]->in_a);
	assert_false(r->steps[2]->in_b);
	assert_false(r->steps[2]->same);
	assert_string_equal(r->steps[2]->input_b, "");
	assert_int_equal(r->steps[2]->n_files, 1);
	assert_int_equal(r->n_files, 1);
	assert_string_equal(r->files[0]->change_a, "created");
	assert_string_equal(r->files[0]->change_b, "");
	moat__v1__diff_reply__free_unpacked(r, NULL);

	/* and the other way round */
	r = diff("b", b, 2, "a", a, 3);
	assert_int_equal(r->first_divergent_step, 3);
	assert_false(r->steps[2]->in_a);
	assert_true(r->steps[2]->in_b);
	moat__v1__diff_reply__free_unpacked(r, NULL);
}

/* Net folding: created then deleted is nothing; created then modified
 * is created with the last hash; modified then deleted is deleted;
 * deleted then created is modified. */
static void
test_diff_net_folding(void **state)
{
	struct tstep a1, a2, b1;
	Moat__V1__Step *a[2] = { &a1.step, &a2.step };
	Moat__V1__Step *b[1] = { &b1.step };
	Moat__V1__DiffReply *r;
	const Moat__V1__FileDiff *f;

	tstep_init(&a1, 1, "s1", 0, "");
	tstep_file(&a1, "/tmp/t", CREATED, 0x01);
	tstep_file(&a1, "/w/c", CREATED, 0x01);
	tstep_file(&a1, "/w/d", DELETED, 0);
	tstep_file(&a1, "/w/m", MODIFIED, 0x01);
	tstep_init(&a2, 2, "s2", 0, "");
	tstep_file(&a2, "/tmp/t", DELETED, 0);
	tstep_file(&a2, "/w/c", MODIFIED, 0x07);
	tstep_file(&a2, "/w/d", CREATED, 0x08);
	tstep_file(&a2, "/w/m", DELETED, 0);
	/* b did the net effect in one step: only /w/c's hash differs */
	tstep_init(&b1, 1, "all", 0, "");
	tstep_file(&b1, "/w/c", CREATED, 0x09);
	tstep_file(&b1, "/w/d", MODIFIED, 0x08);
	tstep_file(&b1, "/w/m", DELETED, 0);
	r = diff("a", a, 2, "b", b, 1);
	assert_int_equal(r->n_files, 1);
	f = r->files[0];
	assert_string_equal(f->path, "/w/c");
	assert_string_equal(f->change_a, "created");
	assert_string_equal(f->change_b, "created");
	assert_string_equal(f->sha256_a,
	    "070707070707070707070707070707070707070707070707070707070707070"
	    "7");
	assert_null(find_file(r->files, r->n_files, "/tmp/t"));
	moat__v1__diff_reply__free_unpacked(r, NULL);
}

static Moat__V1__CompareReply *
compare(struct moat_session_view *v, size_t n)
{
	Moat__V1__CompareReply *r = malloc(sizeof(*r));

	assert_non_null(r);
	moat__v1__compare_reply__init(r);
	assert_int_equal(moat_compare_build(v, n, r), MOAT_OK);
	return r;
}

/* Ranking: final success first, then fewer failed steps, fewer
 * destructive actions, fewer deletions, less time; scores counted. */
static void
test_compare_ordering(void **state)
{
	struct tstep s[5][2];
	Moat__V1__Step *p[5][2];
	Moat__V1__SessionInfo info;
	struct moat_session_view v[5];
	Moat__V1__CompareReply *r;
	static const char *const ids[] = { "fail-last", "ok-destructive",
		"ok-clean-slow", "ok-clean-fast", "ok-failed-first" };

	moat__v1__session_info__init(&info);
	info.sandbox_id = "sb-1";
	info.created_ms = 42;
	/* 0: last step fails */
	tstep_init(&s[0][0], 1, "ls", 0, "");
	tstep_init(&s[0][1], 2, "make", 2, "");
	/* 1: succeeds, but ran rm -rf and deleted a file */
	tstep_init(&s[1][0], 1, "rm -rf /w/build", 0, "");
	tstep_file(&s[1][0], "/w/build/x", DELETED, 0);
	tstep_init(&s[1][1], 2, "make", 0, "");
	/* 2: clean, slow */
	tstep_init(&s[2][0], 1, "touch /w/a", 0, "");
	tstep_file(&s[2][0], "/w/a", CREATED, 0x01);
	tstep_init(&s[2][1], 2, "make", 0, "");
	s[2][1].step.ended_ms += 10000;
	/* 3: clean, fast */
	tstep_init(&s[3][0], 1, "echo x > /w/b", 0, "");
	tstep_file(&s[3][0], "/w/b", MODIFIED, 0x01);
	tstep_init(&s[3][1], 2, "make", 0, "");
	/* 4: a failed step on the way */
	tstep_init(&s[4][0], 1, "make", 1, "");
	tstep_init(&s[4][1], 2, "make", 0, "");
	for (int i = 0; i < 5; i++) {
		p[i][0] = &s[i][0].step;
		p[i][1] = &s[i][1].step;
		v[i] = (struct moat_session_view){ .session_id = ids[i],
			.info = &info,
			.steps = p[i],
			.n_steps = 2 };
	}
	r = compare(v, 5);
	assert_int_equal(r->n_sessions, 5);
	assert_string_equal(r->sessions[0]->session_id, "ok-clean-fast");
	assert_string_equal(r->sessions[1]->session_id, "ok-clean-slow");
	assert_string_equal(r->sessions[2]->session_id, "ok-destructive");
	assert_string_equal(r->sessions[3]->session_id, "ok-failed-first");
	assert_string_equal(r->sessions[4]->session_id, "fail-last");
	for (uint32_t i = 0; i < 5; i++)
		assert_int_equal(r->sessions[i]->rank, i + 1);
	assert_true(r->sessions[0]->final_success);
	assert_false(r->sessions[4]->final_success);
	assert_int_equal(r->sessions[4]->failed_steps, 1);
	assert_int_equal(r->sessions[3]->failed_steps, 1);
	assert_int_equal(r->sessions[2]->destructive_actions, 1);
	assert_int_equal(r->sessions[2]->files_deleted, 1);
	assert_int_equal(r->sessions[1]->files_created, 1);
	assert_int_equal(r->sessions[0]->files_modified, 1);
	assert_int_equal(r->sessions[0]->steps, 2);
	assert_int_equal(r->sessions[0]->duration_ms, 1500);
	assert_int_equal(r->sessions[1]->duration_ms, 11500);
	assert_string_equal(r->sessions[0]->sandbox_id, "sb-1");
	assert_int_equal(r->sessions[0]->created_ms, 42);
	moat__v1__compare_reply__free_unpacked(r, NULL);
}

/* Ties keep the order given; an empty session never succeeded. */
static void
test_compare_ties_and_empty(void **state)
{
	struct tstep a1;
	Moat__V1__Step *a[1] = { &a1.step };
	struct moat_session_view v[3] = {
		{ .session_id = "empty", .steps = NULL, .n_steps = 0 },
		{ .session_id = "first", .steps = a, .n_steps = 1 },
		{ .session_id = "second", .steps = a, .n_steps = 1 },
	};
	Moat__V1__CompareReply *r;

	tstep_init(&a1, 1, "true", 0, "");
	r = compare(v, 3);
	assert_string_equal(r->sessions[0]->session_id, "first");
	assert_string_equal(r->sessions[1]->session_id, "second");
	assert_string_equal(r->sessions[2]->session_id, "empty");
	assert_false(r->sessions[2]->final_success);
	assert_int_equal(r->sessions[2]->steps, 0);
	moat__v1__compare_reply__free_unpacked(r, NULL);
}

/* An exec run without a shell is judged by its argv, quoted, not by the
 * input line that joined it with spaces: `sh -c 'rm -rf /w/x'` is a
 * destructive action even though its input reads "sh -c rm -rf /w/x". */
static void
test_compare_judges_argv(void **state)
{
	struct tstep a1, b1;
	Moat__V1__Step *a[1] = { &a1.step }, *b[1] = { &b1.step };
	char *argv_rm[] = { "sh", "-c", "rm -rf /w/x" };
	char *argv_echo[] = { "echo", "it's rm -rf /" };
	struct moat_session_view v[2] = {
		{ .session_id = "rm", .steps = a, .n_steps = 1 },
		{ .session_id = "echo", .steps = b, .n_steps = 1 },
	};
	Moat__V1__CompareReply *r;

	tstep_init(&a1, 1, "sh -c rm -rf /w/x", 0, "");
	a1.step.argv = argv_rm;
	a1.step.n_argv = 3;
	tstep_init(&b1, 1, "echo it's rm -rf /", 0, "");
	b1.step.argv = argv_echo;
	b1.step.n_argv = 2;
	r = compare(v, 2);
	assert_string_equal(r->sessions[0]->session_id, "echo");
	assert_int_equal(r->sessions[0]->destructive_actions, 0);
	assert_string_equal(r->sessions[1]->session_id, "rm");
	assert_int_equal(r->sessions[1]->destructive_actions, 1);
	moat__v1__compare_reply__free_unpacked(r, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_diff_created_modified_deleted),
		cmocka_unit_test(test_diff_same),
		cmocka_unit_test(test_diff_outputs_and_hashes),
		cmocka_unit_test(test_diff_one_longer),
		cmocka_unit_test(test_diff_net_folding),
		cmocka_unit_test(test_compare_ordering),
		cmocka_unit_test(test_compare_ties_and_empty),
		cmocka_unit_test(test_compare_judges_argv),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
