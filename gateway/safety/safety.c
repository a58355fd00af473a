/*
 * safety.c: the classifier of safety.h: its entry point, the paths that
 * matter, and the table of known command words (command_rules): each
 * row's verdict, or the judge that reads its arguments (after env
 * assignments and wrappers). Every judgement keeps the most
 * severe level and the reason of the first command that reached it.
 * Not for: splitting shell text into commands (safety_shell.c), Python
 * and Node code (safety_code.c), or enforcing anything.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "moat/safety.h"
#include "safety_internal.h"

void
moat_safety_raise(struct safety_judge *j, enum moat_safety_level level,
    const char *fmt, ...)
{
	va_list ap;

	if (level <= j->v.level && j->v.reason[0] != '\0')
		return;
	if (level < j->v.level)
		return;
	j->v.level = level;
	va_start(ap, fmt);
	vsnprintf(j->v.reason, sizeof(j->v.reason), fmt, ap);
	va_end(ap);
}

const char *
moat_safety_level_name(enum moat_safety_level level)
{
	switch (level) {
	case MOAT_SAFETY_READ:
		return "read";
	case MOAT_SAFETY_WRITE:
		return "write";
	case MOAT_SAFETY_SYSTEM:
		return "system";
	case MOAT_SAFETY_DESTRUCTIVE:
		return "destructive";
	case MOAT_SAFETY_BLOCKED:
		return "blocked";
	}
	return "unknown";
}

/* ---- paths ---- */

static bool
has_prefix(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

/* under: `path` is `dir` or below it. */
static bool
under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	return strncmp(path, dir, n) == 0 &&
	    (path[n] == '\0' || path[n] == '/');
}

static bool
is_disk_device(const char *p)
{
	static const char *const disks[] = { "/dev/sd", "/dev/vd", "/dev/hd",
		"/dev/xvd", "/dev/nvme", "/dev/mmcblk", "/dev/dm-",
		"/dev/mapper/" };

	for (size_t i = 0; i < sizeof(disks) / sizeof(disks[0]); i++)
		if (has_prefix(p, disks[i]))
			return true;
	return false;
}

static bool
is_harmless_sink(const char *p)
{
	return strcmp(p, "/dev/null") == 0 || strcmp(p, "/dev/stdout") == 0 ||
	    strcmp(p, "/dev/stderr") == 0 || strcmp(p, "/dev/tty") == 0 ||
	    has_prefix(p, "/dev/fd/") || has_prefix(p, "&");
}

static bool
is_system_path(const char *p)
{
	static const char *const dirs[] = { "/etc", "/boot", "/usr", "/bin",
		"/sbin", "/lib", "/lib32", "/lib64", "/proc", "/sys", "/dev",
		"/var/lib", "/var/spool", "/opt" };

	if (strcmp(p, "/") == 0)
		return true;
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		if (under(p, dirs[i]))
			return true;
	return false;
}

/* The root or a top-level directory whose loss ends the machine. */
static bool
is_vital_tree(const char *p)
{
	static const char *const vital[] = { "/", "/*", "/.", "//", "/etc",
		"/usr", "/boot", "/bin", "/sbin", "/lib", "/lib64", "/var",
		"/home", "/root", "/etc/", "/usr/", "/boot/", "/bin/",
		"/sbin/", "/lib/", "/var/", "/home/", "/root/", "/etc/*",
		"/usr/*", "/boot/*", "/var/*", "/home/*" };

	for (size_t i = 0; i < sizeof(vital) / sizeof(vital[0]); i++)
		if (strcmp(p, vital[i]) == 0)
			return true;
	return false;
}

/* judge_write_target: something writes to file `p` (redirection, tee,
 * cp's destination ...). `who` names the writer in the reason. */
void
moat_safety_write_target(struct safety_judge *j, const char *who,
    const char *p)
{
	if (p[0] == '\0' || is_harmless_sink(p))
		return;
	if (strcmp(p, "/dev/mem") == 0 || strcmp(p, "/dev/kmem") == 0 ||
	    strcmp(p, "/dev/port") == 0 ||
	    strcmp(p, "/proc/sysrq-trigger") == 0 || is_disk_device(p))
		moat_safety_raise(j, MOAT_SAFETY_BLOCKED, "%s writes to %s",
		    who, p);
	else if (is_system_path(p))
		moat_safety_raise(j, MOAT_SAFETY_SYSTEM,
		    "%s writes to system path %s", who, p);
	else
		moat_safety_raise(j, MOAT_SAFETY_WRITE, "%s writes %s", who,
		    p);
}

/* ---- one command ---- */

static const char *
base_name(const char *w)
{
	const char *slash = strrchr(w, '/');

	return slash != NULL && slash[1] != '\0' ? slash + 1 : w;
}

static bool
is_assignment(const char *w)
{
	const char *eq = strchr(w, '=');

	if (eq == NULL || eq == w ||
	    !(isalpha((unsigned char)w[0]) || w[0] == '_'))
		return false;
	for (const char *p = w; p < eq; p++)
		if (!isalnum((unsigned char)*p) && *p != '_')
			return false;
	return true;
}

static bool
in_list(const char *w, const char *const *list)
{
	for (; *list != NULL; list++)
		if (strcmp(w, *list) == 0)
			return true;
	return false;
}

/* has_flag: a short option cluster among argv[from..] has `c`
 * ("-rf" has 'r'), or a long option equals `lng`. */
static bool
has_flag(char **argv, int argc, int from, char c, const char *lng)
{
	for (int i = from; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0)
			break;
		if (lng != NULL && strcmp(argv[i], lng) == 0)
			return true;
		if (c != 0 && argv[i][0] == '-' && argv[i][1] != '-' &&
		    strchr(argv[i] + 1, c) != NULL)
			return true;
	}
	return false;
}

static bool
has_word(char **argv, int argc, int from, const char *w)
{
	for (int i = from; i < argc; i++)
		if (strcmp(argv[i], w) == 0)
			return true;
	return false;
}

/* judge_join: argv[from..] joined with spaces, classified as `lang`. */
static void
judge_join(struct safety_judge *j, char **argv, int argc, int from,
    const char *lang, int depth)
{
	size_t len = 1;
	char *s;

	for (int i = from; i < argc; i++)
		len += strlen(argv[i]) + 1;
	if ((s = malloc(len)) == NULL) {
		j->oom = true;
		return;
	}
	s[0] = '\0';
	for (int i = from; i < argc; i++) {
		if (i > from)
			strcat(s, " ");
		strcat(s, argv[i]);
	}
	if (strcmp(lang, "python") == 0)
		moat_safety_python(j, s, depth);
	else if (strcmp(lang, "node") == 0)
		moat_safety_node(j, s, depth);
	else
		moat_safety_shell(j, s, strlen(s), depth);
	free(s);
}

static bool
contains_ci(const char *hay, const char *needle)
{
	size_t n = strlen(needle);

	for (; *hay != '\0'; hay++)
		if (strncasecmp(hay, needle, n) == 0)
			return true;
	return false;
}

/* judge_sql: statements that throw data away. */
bool
moat_safety_sql(struct safety_judge *j, const char *text, const char *who)
{
	static const char *const kill[] = { "drop table", "drop database",
		"drop schema", "truncate table", NULL };

	for (int i = 0; kill[i] != NULL; i++)
		if (contains_ci(text, kill[i])) {
			moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE, "%s: %s",
			    who, kill[i]);
			return true;
		}
	return false;
}

struct command_rule;

/* A judge of one command word: argv[0] is the command (after wrappers),
 * `rule` the row that named it. */
typedef void command_judge(struct safety_judge *j,
    const struct command_rule *rule, char **argv, int argc, int depth);

/* A row of the command table: the words it names, and either a judge that
 * reads the arguments or the verdict whatever they are (the reason is the
 * command word followed by `reason`). */
struct command_rule {
	const char *const *names; /* NULL-terminated */
	bool prefix;              /* names are prefixes: mkfs.ext4, python3 */
	command_judge *judge;     /* NULL: the verdict below */
	enum moat_safety_level level;
	const char *reason;
};

static void judge_argv(struct safety_judge *j, char **argv, int argc,
    int depth);

static void
judge_unknown(struct safety_judge *j, const char *cmd)
{
	moat_safety_raise(j, MOAT_SAFETY_WRITE,
	    "%s: not a known command "
	    "(assumed to write)",
	    cmd);
}

/* judge_rule_verdict: the row's own verdict, naming the command. */
static void
judge_rule_verdict(struct safety_judge *j, const struct command_rule *rule,
    const char *cmd)
{
	moat_safety_raise(j, rule->level, "%s%s", cmd, rule->reason);
}

/* init 0 / init 6 halt or reboot; other runlevels are not known. */
static void
judge_init(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	if (argc > 1 &&
	    (strcmp(argv[1], "0") == 0 || strcmp(argv[1], "6") == 0))
		judge_rule_verdict(j, rule, base_name(argv[0]));
	else
		judge_unknown(j, base_name(argv[0]));
}

static void
judge_systemctl(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	static const char *const stops[] = { "poweroff", "reboot", "halt",
		NULL };

	if (argc > 1 && in_list(argv[1], stops))
		moat_safety_raise(j, MOAT_SAFETY_BLOCKED,
		    "%s: stops the "
		    "machine",
		    base_name(argv[0]));
	else
		judge_rule_verdict(j, rule, base_name(argv[0]));
}

static void
judge_rm(struct safety_judge *j, const struct command_rule *rule, char **argv,
    int argc, int depth)
{
	bool recursive = has_flag(argv, argc, 1, 'r', "--recursive") ||
	    has_flag(argv, argc, 1, 'R', NULL);
	int targets = 0;
	bool glob = false, opts = true;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (opts && strcmp(a, "--") == 0) {
			opts = false;
			continue;
		}
		if (opts && a[0] == '-' && a[1] != '\0') {
			if (strcmp(a, "--no-preserve-root") == 0)
				moat_safety_raise(j, MOAT_SAFETY_BLOCKED,
				    "rm "
				    "--no-preserve-root: wipes the root");
			continue;
		}
		targets++;
		if (strchr(a, '*') != NULL)
			glob = true;
		if (recursive && is_vital_tree(a))
			moat_safety_raise(j, MOAT_SAFETY_BLOCKED,
			    "rm -r %s: wipes "
			    "the system",
			    a);
		else if (is_system_path(a))
			moat_safety_raise(j,
			    recursive ? MOAT_SAFETY_DESTRUCTIVE :
			                MOAT_SAFETY_SYSTEM,
			    "rm of system path %s", a);
	}
	if (recursive)
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "rm -r: deletes "
		    "directory trees");
	else if (targets >= 5 || glob)
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "rm of many files");
	else
		moat_safety_raise(j, MOAT_SAFETY_WRITE, "rm: deletes a file");
}

/* dd reads unless of= names something that is not a harmless sink. */
static void
judge_dd(struct safety_judge *j, const struct command_rule *rule, char **argv,
    int argc, int depth)
{
	for (int i = 1; i < argc; i++)
		if (has_prefix(argv[i], "of=")) {
			const char *p = argv[i] + 3;

			if (is_harmless_sink(p))
				continue;
			moat_safety_write_target(j, "dd", p);
			moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
			    "dd of=%s: "
			    "overwrites it",
			    p);
		}
	judge_rule_verdict(j, rule, "dd");
}

/* judge_disk_args: mkfs, shred ...: blocked on a disk device, else the
 * row's verdict. */
static void
judge_disk_args(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	const char *cmd = base_name(argv[0]);

	for (int i = 1; i < argc; i++)
		if (is_disk_device(argv[i]))
			moat_safety_raise(j, MOAT_SAFETY_BLOCKED,
			    "%s %s: "
			    "wipes a disk",
			    cmd, argv[i]);
	judge_rule_verdict(j, rule, cmd);
}

/* judge_find: -delete, and the command of -exec / -execdir / -ok. */
static void
judge_find(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-delete") == 0)
			moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
			    "find "
			    "-delete: deletes what it finds");
		if ((strcmp(argv[i], "-exec") == 0 ||
		        strcmp(argv[i], "-execdir") == 0 ||
		        strcmp(argv[i], "-ok") == 0) &&
		    i + 1 < argc) {
			int end = i + 1;

			while (end < argc && strcmp(argv[end], ";") &&
			    strcmp(argv[end], "+"))
				end++;
			if (strcmp(base_name(argv[i + 1]), "rm") == 0)
				moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
				    "find -exec rm: deletes what it finds");
			judge_argv(j, argv + i + 1, end - i - 1, depth);
			i = end;
		}
	}
	judge_rule_verdict(j, rule, "find");
}

/* judge_in_place: sed and perl with -i edit files; perl without it runs
 * a program; sed without it reads. */
static void
judge_in_place(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	const char *cmd = base_name(argv[0]);
	bool perl = strcmp(cmd, "perl") == 0, inplace = false;

	for (int i = 1; i < argc; i++)
		if (has_prefix(argv[i], "-i") ||
		    has_prefix(argv[i], "--in-place") ||
		    (argv[i][0] == '-' && argv[i][1] != '-' &&
		        strchr(argv[i], 'i') != NULL && perl))
			inplace = true;
	if (inplace) {
		int last = argc - 1;

		if (last > 0 && is_system_path(argv[last]))
			moat_safety_raise(j, MOAT_SAFETY_SYSTEM,
			    "%s -i on "
			    "system path %s",
			    cmd, argv[last]);
		moat_safety_raise(j, MOAT_SAFETY_WRITE,
		    "%s -i edits files "
		    "in place",
		    cmd);
	} else if (perl) {
		moat_safety_raise(j, MOAT_SAFETY_WRITE,
		    "perl runs a program "
		    "(not read: assumed to write)");
	} else {
		moat_safety_raise(j, MOAT_SAFETY_READ, "sed");
	}
}

/* judge_paths_written: a command that writes its non-option arguments
 * (touch, mkdir, tee ...). */
static void
judge_paths_written(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	bool any = false, opts = true;

	for (int i = 1; i < argc; i++) {
		if (opts && strcmp(argv[i], "--") == 0) {
			opts = false;
			continue;
		}
		if (opts && argv[i][0] == '-' && argv[i][1] != '\0')
			continue;
		moat_safety_write_target(j, base_name(argv[0]), argv[i]);
		any = true;
	}
	if (!any)
		moat_safety_raise(j, MOAT_SAFETY_WRITE, "%s writes files",
		    base_name(argv[0]));
}

/* judge_copy: cp / mv / ln / install: the last operand is written. */
static void
judge_copy(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	const char *cmd = base_name(argv[0]);
	int last = -1;

	for (int i = 1; i < argc; i++)
		if (argv[i][0] != '-')
			last = i;
	if (strcmp(cmd, "mv") == 0)
		for (int i = 1; i < last; i++)
			if (argv[i][0] != '-' && is_vital_tree(argv[i]))
				moat_safety_raise(j, MOAT_SAFETY_BLOCKED,
				    "mv %s: moves "
				    "the system away",
				    argv[i]);
	if (last > 0 && strcmp(argv[last], "/dev/null") == 0 &&
	    strcmp(cmd, "mv") == 0)
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "mv to /dev/null: "
		    "deletes");
	else if (last > 0)
		moat_safety_write_target(j, cmd, argv[last]);
	else
		moat_safety_raise(j, MOAT_SAFETY_WRITE, "%s writes files",
		    cmd);
}

static void
judge_chmod(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	const char *cmd = base_name(argv[0]);
	bool first = true, system = false;

	for (int i = 1; i < argc; i++) {
		if (argv[i][0] == '-')
			continue;
		if (first) { /* the mode or owner */
			first = false;
			continue;
		}
		if (is_system_path(argv[i]))
			system = true;
	}
	if (system)
		moat_safety_raise(j, MOAT_SAFETY_SYSTEM, "%s on a system path",
		    cmd);
	else
		moat_safety_raise(j, MOAT_SAFETY_WRITE,
		    "%s changes file modes", cmd);
}

static void
judge_git(struct safety_judge *j, const struct command_rule *rule, char **argv,
    int argc, int depth)
{
	static const char *const reads[] = { "status", "log", "diff", "show",
		"blame", "grep", "ls-files", "rev-parse", "describe",
		"shortlog", "--version", "version", "help", NULL };
	int sub = 1;

	/* git -C DIR / -c k=v come before the subcommand */
	while (
	    sub < argc && argv[sub][0] == '-' && !in_list(argv[sub], reads)) {
		if ((strcmp(argv[sub], "-C") == 0 ||
		        strcmp(argv[sub], "-c") == 0) &&
		    sub + 1 < argc)
			sub++;
		sub++;
	}
	if (sub >= argc) {
		moat_safety_raise(j, MOAT_SAFETY_READ, "git");
		return;
	}
	if (strcmp(argv[sub], "reset") == 0 &&
	    has_word(argv, argc, sub, "--hard"))
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "git reset --hard: "
		    "throws work away");
	else if (strcmp(argv[sub], "clean") == 0 &&
	    (has_flag(argv, argc, sub + 1, 'f', "--force")))
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "git clean -f: deletes "
		    "untracked files");
	else if (strcmp(argv[sub], "push") == 0 &&
	    (has_word(argv, argc, sub, "--force") ||
	        has_flag(argv, argc, sub + 1, 'f', NULL)))
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "git push --force: "
		    "overwrites remote history");
	else if (in_list(argv[sub], reads) ||
	    (strcmp(argv[sub], "branch") == 0 && argc == sub + 1) ||
	    (strcmp(argv[sub], "remote") == 0 && argc <= sub + 2 &&
	        (argc == sub + 1 || strcmp(argv[sub + 1], "-v") == 0)))
		moat_safety_raise(j, MOAT_SAFETY_READ, "git %s", argv[sub]);
	else
		moat_safety_raise(j, MOAT_SAFETY_WRITE,
		    "git %s changes the work tree "
		    "or repository",
		    argv[sub]);
}

/* judge_language_packages: pip, npm, cargo ...: their read-only
 * subcommands read; anything else installs or builds. */
static void
judge_language_packages(struct safety_judge *j,
    const struct command_rule *rule, char **argv, int argc, int depth)
{
	static const char *const reads[] = { "list", "show", "freeze",
		"search", "ls", "view", "--version", "version", "help",
		"check", "outdated", NULL };
	const char *cmd = base_name(argv[0]);

	if (argc > 1 && in_list(argv[1], reads))
		moat_safety_raise(j, MOAT_SAFETY_READ, "%s %s", cmd, argv[1]);
	else
		moat_safety_raise(j, MOAT_SAFETY_WRITE,
		    "%s %s installs or "
		    "builds into the work tree",
		    cmd, argc > 1 ? argv[1] : "");
}

/* judge_system_packages: apt, dnf, rpm ...: queries read; anything else
 * changes the system's packages. */
static void
judge_system_packages(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	static const char *const reads[] = { "list", "show", "search", "info",
		"policy", "-l", "-q", "-qa", "-L", "--version", NULL };
	const char *cmd = base_name(argv[0]);

	if (argc > 1 && in_list(argv[1], reads))
		moat_safety_raise(j, MOAT_SAFETY_READ, "%s %s", cmd, argv[1]);
	else
		judge_rule_verdict(j, rule, cmd);
}

/* judge_interpreter: python / node / sh with -c / -e CODE, -m MODULE, or
 * a script (unknown: write). */
static void
judge_interpreter(struct safety_judge *j, char **argv, int argc,
    const char *lang, int depth)
{
	const char *cmd = base_name(argv[0]);

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if ((strcmp(a, "-c") == 0 ||
		        (strcmp(lang, "node") == 0 &&
		            (strcmp(a, "-e") == 0 ||
		                strcmp(a, "--eval") == 0 ||
		                strcmp(a, "-p") == 0))) &&
		    i + 1 < argc) {
			judge_join(j, argv, i + 2, i + 1, lang, depth + 1);
			return;
		}
		if (strcmp(a, "-m") == 0 && i + 1 < argc &&
		    strcmp(lang, "python") == 0) {
			if (strcmp(argv[i + 1], "pip") == 0) {
				judge_argv(j, argv + i + 1, argc - i - 1,
				    depth + 1);
				return;
			}
			moat_safety_raise(j, MOAT_SAFETY_WRITE,
			    "%s -m %s runs a "
			    "module",
			    cmd, argv[i + 1]);
			return;
		}
		if (a[0] != '-') {
			moat_safety_raise(j, MOAT_SAFETY_WRITE,
			    "%s %s runs a script "
			    "(not read: assumed to write)",
			    cmd, a);
			return;
		}
	}
	moat_safety_raise(j, MOAT_SAFETY_WRITE,
	    "%s reads a program from "
	    "stdin (not read: assumed to write)",
	    cmd);
}

static void
judge_shell(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	judge_interpreter(j, argv, argc, "shell", depth);
}

/* busybox APPLET ...: the applet is the command. */
static void
judge_busybox(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	if (argc > 1)
		judge_argv(j, argv + 1, argc - 1, depth);
	else
		judge_interpreter(j, argv, argc, "shell", depth);
}

static void
judge_python(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	judge_interpreter(j, argv, argc, "python", depth);
}

static void
judge_node(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	judge_interpreter(j, argv, argc, "node", depth);
}

static void
judge_eval(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	judge_join(j, argv, argc, 1, "shell", depth + 1);
}

/* judge_sql_client: DROP TABLE and friends among the arguments; any
 * other use may change the database. */
static void
judge_sql_client(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	const char *cmd = base_name(argv[0]);
	bool dropped = false;

	for (int i = 1; i < argc && !dropped; i++)
		dropped = moat_safety_sql(j, argv[i], cmd);
	judge_rule_verdict(j, rule, cmd);
}

/* tar t (list) reads; every other tar writes. */
static void
judge_tar(struct safety_judge *j, const struct command_rule *rule, char **argv,
    int argc, int depth)
{
	if (argc > 1 && strchr(argv[1], 't') != NULL &&
	    strchr(argv[1], 'x') == NULL && strchr(argv[1], 'c') == NULL)
		moat_safety_raise(j, MOAT_SAFETY_READ, "tar t lists");
	else
		judge_rule_verdict(j, rule, "tar");
}

/* curl reads, unless -o / -O saves what it fetched. */
static void
judge_curl(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	if (has_flag(argv, argc, 1, 'o', "--output") ||
	    has_flag(argv, argc, 1, 'O', "--remote-name"))
		moat_safety_raise(j, MOAT_SAFETY_WRITE,
		    "curl -o writes a "
		    "file");
	else
		judge_rule_verdict(j, rule, "curl");
}

/* hostname reads, unless given a name to set. */
static void
judge_hostname(struct safety_judge *j, const struct command_rule *rule,
    char **argv, int argc, int depth)
{
	if (argc > 1 && argv[1][0] != '-')
		moat_safety_raise(j, MOAT_SAFETY_SYSTEM,
		    "hostname sets the "
		    "host name");
	else
		judge_rule_verdict(j, rule, "hostname");
}

#define NAMES(...) ((const char *const[]){ __VA_ARGS__, NULL })

/* The command words the classifier knows, after env assignments and
 * wrappers. A word is looked up among the exact names first, then the
 * prefixes; a word in no row is assumed to write. Each name stands in one
 * row only. */
static const struct command_rule command_rules[] = {
	{ NAMES("shutdown", "reboot", "halt", "poweroff"),
	    .level = MOAT_SAFETY_BLOCKED, .reason = ": stops the machine" },
	{ NAMES("init", "telinit"), .judge = judge_init,
	    .level = MOAT_SAFETY_BLOCKED, .reason = ": stops the machine" },
	{ NAMES("systemctl"), .judge = judge_systemctl,
	    .level = MOAT_SAFETY_SYSTEM, .reason = " changes the system" },
	{ NAMES("rm"), .judge = judge_rm },
	{ NAMES("dd"), .judge = judge_dd, .level = MOAT_SAFETY_READ,
	    .reason = "" },
	{ NAMES("mkfs"), .prefix = true, .judge = judge_disk_args,
	    .level = MOAT_SAFETY_DESTRUCTIVE,
	    .reason = ": wipes a filesystem" },
	{ NAMES("mke2fs", "mkswap", "wipefs", "fdisk", "sfdisk", "parted",
	      "blkdiscard"),
	    .judge = judge_disk_args, .level = MOAT_SAFETY_DESTRUCTIVE,
	    .reason = ": wipes a filesystem" },
	{ NAMES("shred", "truncate"), .judge = judge_disk_args,
	    .level = MOAT_SAFETY_DESTRUCTIVE,
	    .reason = ": destroys file contents" },
	{ NAMES("find"), .judge = judge_find, .level = MOAT_SAFETY_READ,
	    .reason = "" },
	{ NAMES("sed", "perl"), .judge = judge_in_place },
	{ NAMES("cp", "mv", "ln", "install", "rsync"), .judge = judge_copy },
	{ NAMES("chmod", "chown", "chgrp"), .judge = judge_chmod },
	{ NAMES("touch", "mkdir", "tee", "rmdir", "unlink", "mkfifo", "mknod",
	      "split", "csplit"),
	    .judge = judge_paths_written },
	{ NAMES("git"), .judge = judge_git },
	{ NAMES("pip", "pip3", "npm", "yarn", "pnpm", "gem", "cargo", "go",
	      "uv"),
	    .judge = judge_language_packages },
	{ NAMES("apt", "apt-get", "yum", "dnf", "apk", "dpkg", "rpm", "zypper",
	      "pacman"),
	    .judge = judge_system_packages, .level = MOAT_SAFETY_SYSTEM,
	    .reason = " changes system packages" },
	{ NAMES("sh", "bash", "dash", "zsh", "ksh", "ash"),
	    .judge = judge_shell },
	{ NAMES("busybox"), .judge = judge_busybox },
	{ NAMES("python"), .prefix = true, .judge = judge_python },
	{ NAMES("node", "nodejs", "deno", "bun"), .judge = judge_node },
	{ NAMES("eval"), .judge = judge_eval },
	{ NAMES("source", "."), .level = MOAT_SAFETY_WRITE,
	    .reason = " runs a script (not read: assumed to write)" },
	{ NAMES("sqlite3", "psql", "mysql", "mariadb"),
	    .judge = judge_sql_client, .level = MOAT_SAFETY_WRITE,
	    .reason = " may change a database" },
	{ NAMES("tar"), .judge = judge_tar, .level = MOAT_SAFETY_WRITE,
	    .reason = " writes files" },
	{ NAMES("unzip", "gzip", "gunzip", "zip", "bzip2", "xz", "patch",
	      "wget", "make", "cmake", "gcc", "cc", "clang"),
	    .level = MOAT_SAFETY_WRITE, .reason = " writes files" },
	{ NAMES("mount", "umount", "sysctl", "ip", "ifconfig", "route",
	      "iptables", "ip6tables", "nft", "ebtables", "modprobe", "insmod",
	      "rmmod", "kill", "killall", "pkill", "service", "swapon",
	      "swapoff", "chroot", "useradd", "userdel", "usermod", "groupadd",
	      "groupdel", "passwd", "chpasswd", "crontab", "setenforce", "tc",
	      "ethtool", "losetup", "chattr", "hwclock", "timedatectl",
	      "hostnamectl", "ulimit", "renice", "nsenter", "unshare", "capsh",
	      "setcap", "visudo", "update-alternatives", "ldconfig", "depmod",
	      "sysrq", "brctl", "dhclient", "journalctl", "loginctl", "su"),
	    .level = MOAT_SAFETY_SYSTEM, .reason = " changes the system" },
	{ NAMES("curl"), .judge = judge_curl, .level = MOAT_SAFETY_READ,
	    .reason = "" },
	{ NAMES("hostname"), .judge = judge_hostname,
	    .level = MOAT_SAFETY_READ, .reason = "" },
	/* Reads, and shell words that do nothing by themselves. */
	{ NAMES("ls", "cat", "grep", "egrep", "fgrep", "rg", "head", "tail",
	      "less", "more", "wc", "echo", "printf", "pwd", "whoami", "id",
	      "date", "uname", "printenv", "which", "type", "stat", "file",
	      "sort", "uniq", "cut", "tr", "awk", "gawk", "diff", "cmp",
	      "comm", "du", "df", "ps", "top", "free", "uptime", "test", "[",
	      "[[", "true", "false", ":", "sleep", "seq", "basename",
	      "dirname", "realpath", "readlink", "md5sum", "sha1sum",
	      "sha256sum", "sha512sum", "cksum", "xxd", "od", "hexdump",
	      "strings", "jq", "base64", "tree", "cd", "export", "set",
	      "unset", "read", "exit", "return", "alias", "history", "column",
	      "nl", "tac", "rev", "fold", "expand", "paste", "join", "yes",
	      "env", "locale", "lsblk", "lscpu", "lsmod", "lspci", "lsusb",
	      "dmesg", "getent", "groups", "ldd", "nproc", "tty", "w", "who",
	      "last", "netstat", "ss", "lsof", "pgrep", "pidof", "command",
	      "hash", "local", "declare", "let", "shift", "wait", "jobs", "bc",
	      "expr", "man", "info", "zcat", "fi", "done", "esac", "for",
	      "case", "select", "function", "in", "ping", "dig", "nslookup",
	      "host", "getconf"),
	    .level = MOAT_SAFETY_READ, .reason = "" },
};

#undef NAMES

/* find_rule: the row of command word `cmd`, or NULL. */
static const struct command_rule *
find_rule(const char *cmd)
{
	const size_t n = sizeof(command_rules) / sizeof(command_rules[0]);

	for (size_t i = 0; i < n; i++)
		if (!command_rules[i].prefix &&
		    in_list(cmd, command_rules[i].names))
			return &command_rules[i];
	for (size_t i = 0; i < n; i++) {
		if (!command_rules[i].prefix)
			continue;
		for (const char *const *p = command_rules[i].names; *p != NULL;
		     p++)
			if (has_prefix(cmd, *p))
				return &command_rules[i];
	}
	return NULL;
}

/* Words that run the command after them (and their own options). */
static const char *const wrappers[] = { "sudo", "doas", "nohup", "nice",
	"ionice", "timeout", "stdbuf", "exec", "builtin", "then", "do", "else",
	"elif", "if", "while", "until", "!", "{", "}", "time", "strace",
	"ltrace", "taskset", "setsid", "chronic", "unbuffer", "watch", "flock",
	NULL };

/* skip_wrapper: how many words after argv[0] (a wrapper) are its own
 * options, so argv[1 + n] is the command it runs. */
static int
skip_wrapper(char **argv, int argc)
{
	const char *w = base_name(argv[0]);
	int i = 1;

	if (strcmp(w, "timeout") == 0 || strcmp(w, "flock") == 0) {
		while (i < argc && argv[i][0] == '-') {
			if ((strcmp(argv[i], "-s") == 0 ||
			        strcmp(argv[i], "-k") == 0) &&
			    i + 1 < argc)
				i++;
			i++;
		}
		return i < argc ? i : argc - 1; /* the duration / lock */
	}
	if (strcmp(w, "taskset") == 0) {
		while (i < argc && argv[i][0] == '-')
			i++;
		return i < argc ? i : argc - 1;
	}
	while (i < argc && argv[i][0] == '-') {
		/* options with a value */
		if ((strcmp(argv[i], "-u") == 0 ||
		        strcmp(argv[i], "-g") == 0 ||
		        strcmp(argv[i], "-n") == 0 ||
		        strcmp(argv[i], "-c") == 0 ||
		        strcmp(argv[i], "-p") == 0 ||
		        strcmp(argv[i], "-o") == 0 ||
		        strcmp(argv[i], "-e") == 0 ||
		        strcmp(argv[i], "-i") == 0 ||
		        strcmp(argv[i], "-C") == 0 ||
		        strcmp(argv[i], "-s") == 0 ||
		        strcmp(argv[i], "-k") == 0) &&
		    i + 1 < argc)
			i++;
		i++;
	}
	return i - 1;
}

static void
judge_argv(struct safety_judge *j, char **argv, int argc, int depth)
{
	const struct command_rule *rule;
	const char *cmd;

	/* env assignments, wrappers, env, xargs */
	while (argc > 0) {
		if (is_assignment(argv[0])) {
			argv++;
			argc--;
			continue;
		}
		cmd = base_name(argv[0]);
		if (in_list(cmd, wrappers)) {
			int skip = skip_wrapper(argv, argc);

			argv += 1 + skip;
			argc -= 1 + skip;
			continue;
		}
		if (strcmp(cmd, "env") == 0 && argc > 1) {
			argv++;
			argc--;
			while (argc > 0 &&
			    (argv[0][0] == '-' || is_assignment(argv[0]))) {
				argv++;
				argc--;
			}
			continue;
		}
		if (strcmp(cmd, "xargs") == 0) {
			int i = 1;

			while (i < argc && argv[i][0] == '-')
				i++;
			if (i < argc && strcmp(base_name(argv[i]), "rm") == 0)
				moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
				    "xargs rm: "
				    "deletes many files");
			argv += i;
			argc -= i;
			continue;
		}
		break;
	}
	if (argc <= 0)
		return;
	cmd = base_name(argv[0]);
	if ((rule = find_rule(cmd)) == NULL)
		judge_unknown(j, cmd);
	else if (rule->judge != NULL)
		rule->judge(j, rule, argv, argc, depth);
	else
		judge_rule_verdict(j, rule, cmd);
}

void
moat_safety_command(struct safety_judge *j, char **argv, int argc,
    char **redir_out, int n_redir_out, int depth)
{
	for (int i = 0; i < n_redir_out; i++)
		moat_safety_write_target(j, "redirection", redir_out[i]);
	if (argc > 0)
		judge_argv(j, argv, argc, depth);
}

/* ---- entry ---- */

struct moat_safety_verdict
moat_safety_classify(const char *command_or_code, const char *language)
{
	struct safety_judge j = { .v = { .level = MOAT_SAFETY_READ } };
	const char *text = command_or_code != NULL ? command_or_code : "";
	const char *lang = language != NULL ? language : "";

	if (strcmp(lang, "python") == 0 || strcmp(lang, "python3") == 0 ||
	    strcmp(lang, "py") == 0) {
		moat_safety_python(&j, text, 0);
	} else if (strcmp(lang, "node") == 0 ||
	    strcmp(lang, "javascript") == 0 || strcmp(lang, "js") == 0) {
		moat_safety_node(&j, text, 0);
	} else if (strcmp(lang, "sql") == 0) {
		if (!moat_safety_sql(&j, text, "SQL")) {
			if (contains_ci(text, "delete from") ||
			    contains_ci(text, "update ") ||
			    contains_ci(text, "insert ") ||
			    contains_ci(text, "create "))
				moat_safety_raise(&j, MOAT_SAFETY_WRITE,
				    "SQL that "
				    "changes rows");
			else
				moat_safety_raise(&j, MOAT_SAFETY_READ,
				    "SQL query");
		}
	} else {
		moat_safety_shell(&j, text, strlen(text), 0);
	}
	if (j.oom) {
		j.v.level = MOAT_SAFETY_BLOCKED;
		snprintf(j.v.reason, sizeof(j.v.reason),
		    "out of memory "
		    "classifying: refused rather than guessed");
	}
	if (j.v.reason[0] == '\0') {
		snprintf(j.v.reason, sizeof(j.v.reason), "nothing to run");
	} else if (j.v.level == MOAT_SAFETY_READ) {
		char first[MOAT_SAFETY_REASON_MAX];

		memcpy(first, j.v.reason, sizeof(first));
		snprintf(j.v.reason, sizeof(j.v.reason), "only reads (%.*s)",
		    (int)sizeof(first) - 20, first);
	}
	return j.v;
}
