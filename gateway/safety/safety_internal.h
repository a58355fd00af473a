/*
 * safety_internal.h: what the files of the classifier share (safety.c:
 * the entry point and the command words; safety_shell.c: cutting shell
 * text into commands; safety_code.c: Python and Node).
 * Not for: callers (moat/safety.h).
 */
#ifndef MOAT_SAFETY_INTERNAL_H
#define MOAT_SAFETY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "moat/safety.h"

#define MOAT_SAFETY_MAX_DEPTH 6 /* sh -c "eval '...'" nesting */

/* One classification in progress: the worst verdict so far. */
struct safety_judge {
	struct moat_safety_verdict v;
	bool oom; /* an allocation failed: answer BLOCKED */
};

/* moat_safety_raise: raises the verdict to `level` with the formatted
 * reason, unless it is already at least as severe (the first reason at
 * a level stays). */
void moat_safety_raise(struct safety_judge *j, enum moat_safety_level level,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* moat_safety_shell (safety_shell.c): judges `len` bytes of shell text,
 * nested `depth` deep (sh -c, eval, $(...), python's os.system ...). */
void moat_safety_shell(struct safety_judge *j, const char *text, size_t len,
    int depth);

/* moat_safety_command (safety.c): judges one command: its words (the
 * command word and arguments, quotes removed) and the files its output
 * is redirected to. */
void moat_safety_command(struct safety_judge *j, char **argv, int argc,
    char **redir_out, int n_redir_out, int depth);

/* moat_safety_sql: DROP TABLE and friends in `text` (any case): raises
 * to destructive naming `who`; true when found. */
bool moat_safety_sql(struct safety_judge *j, const char *text,
    const char *who);

/* moat_safety_write_target: something (`who`) writes to file `path`:
 * /dev/mem, sysrq, a disk: blocked; a system path: system; else write. */
void moat_safety_write_target(struct safety_judge *j, const char *who,
    const char *path);

/* moat_safety_python / moat_safety_node (safety_code.c): judge code. */
void moat_safety_python(struct safety_judge *j, const char *code, int depth);
void moat_safety_node(struct safety_judge *j, const char *code, int depth);

#endif
