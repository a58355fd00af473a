/*
 * safety.h: a static classifier of what a command line or a piece of code
 * would do to a sandbox: only read, write files, touch the system (mounts,
 * network, processes, /etc), destroy data, or something no sandbox should
 * ever run (fork bombs, wiping the root or a disk, halting the machine).
 * It reads the text; it runs nothing. Shell text is split into commands
 * (; && || | & and newlines, $(...) and `...` looked into) and each
 * command is judged by its command word after env assignments and
 * wrappers (sudo, env, nohup, timeout, xargs ...); quoted strings are
 * arguments, never commands, unless a command runs them (sh -c, eval,
 * python -c). The most severe level found wins.
 * Not for: enforcement. It is a label for people and scores (Compare),
 * not a sandbox: a program it has never heard of is assumed to write.
 */
#ifndef MOAT_SAFETY_H
#define MOAT_SAFETY_H

/* Ordered: a higher level is more severe. */
enum moat_safety_level {
	MOAT_SAFETY_READ = 0,
	MOAT_SAFETY_WRITE,
	MOAT_SAFETY_SYSTEM,
	MOAT_SAFETY_DESTRUCTIVE,
	MOAT_SAFETY_BLOCKED,
};

#define MOAT_SAFETY_REASON_MAX 160

struct moat_safety_verdict {
	enum moat_safety_level level;
	/* Why, for a person: "rm -r: deletes a directory tree". */
	char reason[MOAT_SAFETY_REASON_MAX];
};

/* moat_safety_classify: the level of `command_or_code` (NULL: ""), read
 * as `language`: NULL, "", "sh", "bash", "shell": a shell command line;
 * "python", "python3": Python code; "node", "javascript", "js": Node
 * code; "sql": SQL; anything else as a shell line. Pure and thread-safe;
 * allocates nothing the caller frees. When out of memory it answers
 * BLOCKED with a reason saying so (never a milder guess). */
struct moat_safety_verdict moat_safety_classify(const char *command_or_code,
    const char *language);

/* moat_safety_level_name: "read", "write", "system", "destructive",
 * "blocked" (static strings); "unknown" out of range. */
const char *moat_safety_level_name(enum moat_safety_level level);

#endif
