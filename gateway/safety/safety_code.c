/*
 * safety_code.c: the Python and Node side of the classifier of safety.h.
 * String literals and comments are blanked out first, so calls are found
 * only in code; then the calls that delete, write, act on the system or
 * run commands are looked for, and a literal command string (or list of
 * literal strings) handed to os.system, subprocess or child_process is
 * classified as shell by safety.c.
 * Not for: parsing Python or JavaScript in full: a computed command is
 * judged "system", whatever it would be.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "moat/safety.h"
#include "safety_internal.h"

/* blank_strings: a copy of `code` of the same length with the contents
 * of string literals and comments replaced by spaces (quotes kept), so
 * calls are found by position and literals read from the original. */
static char *
blank_strings(const char *code, size_t len, bool js)
{
	char *out = malloc(len + 1);
	size_t i = 0;

	if (out == NULL)
		return NULL;
	memcpy(out, code, len + 1);
	while (i < len) {
		char c = code[i];

		if ((!js && c == '#') ||
		    (js && c == '/' && i + 1 < len && code[i + 1] == '/')) {
			while (i < len && code[i] != '\n')
				out[i++] = ' ';
		} else if (js && c == '/' && i + 1 < len &&
		    code[i + 1] == '*') {
			while (i < len &&
			    !(code[i] == '*' && i + 1 < len &&
			        code[i + 1] == '/'))
				out[i++] = ' ';
			if (i < len)
				out[i++] = ' ';
			if (i < len)
				out[i++] = ' ';
		} else if (c == '\'' || c == '"' || (js && c == '`')) {
			bool triple = !js && i + 2 < len && code[i + 1] == c &&
			    code[i + 2] == c;
			size_t q = triple ? 3 : 1;

			i += q;
			while (i < len) {
				if (code[i] == '\\' && i + 1 < len) {
					out[i++] = ' ';
					out[i++] = ' ';
					continue;
				}
				if (code[i] == c &&
				    (!triple ||
				        (i + 2 < len && code[i + 1] == c &&
				            code[i + 2] == c)))
					break;
				if (code[i] == '\n' && !triple && !js)
					break;
				out[i++] = ' ';
			}
			i += q;
		} else {
			i++;
		}
	}
	return out;
}

/* literal_at: when code[pos..] (after blanks) is a plain string literal
 * (no f-string, no template), a heap copy of its value; else NULL. *end
 * is the index after it. */
static char *
literal_at(const char *code, size_t len, size_t pos, size_t *end)
{
	size_t i = pos, start, q = 1;
	char quote;
	char *val;
	size_t n = 0;

	while (i < len && isspace((unsigned char)code[i]))
		i++;
	while (i < len &&
	    (code[i] == 'r' || code[i] == 'R' || code[i] == 'b' ||
	        code[i] == 'u'))
		i++;
	if (i >= len || (code[i] != '\'' && code[i] != '"' && code[i] != '`'))
		return NULL;
	quote = code[i];
	if (i + 2 < len && code[i + 1] == quote && code[i + 2] == quote)
		q = 3;
	start = i + q;
	if ((val = malloc(len - start + 1)) == NULL)
		return NULL;
	for (i = start; i < len; i++) {
		if (code[i] == '\\' && i + 1 < len) {
			val[n++] = code[i + 1] == 'n' ? '\n' : code[i + 1];
			i++;
			continue;
		}
		if (code[i] == quote &&
		    (q == 1 ||
		        (i + 2 < len && code[i + 1] == quote &&
		            code[i + 2] == quote)))
			break;
		if (quote == '`' && code[i] == '$' && i + 1 < len &&
		    code[i + 1] == '{') {
			free(val);
			return NULL; /* a template: computed */
		}
		val[n++] = code[i];
	}
	val[n] = '\0';
	*end = i + q;
	return val;
}

/* literal_command_at: the literal command of a call whose arguments start
 * at `pos`: a string literal, or a list of string literals (joined with
 * spaces). NULL when computed. */
static char *
literal_command_at(const char *code, size_t len, size_t pos)
{
	size_t i = pos, end;
	char *s, *joined = NULL;
	size_t jl = 0;

	while (i < len && isspace((unsigned char)code[i]))
		i++;
	if (i < len && code[i] != '[')
		return literal_at(code, len, i, &end);
	if (i >= len)
		return NULL;
	i++;
	for (;;) {
		char *grown;

		while (i < len &&
		    (isspace((unsigned char)code[i]) || code[i] == ','))
			i++;
		if (i < len && code[i] == ']')
			break;
		if ((s = literal_at(code, len, i, &end)) == NULL) {
			free(joined);
			return NULL;
		}
		if ((grown = realloc(joined, jl + strlen(s) + 2)) == NULL) {
			free(s);
			free(joined);
			return NULL;
		}
		joined = grown;
		if (jl > 0)
			joined[jl++] = ' ';
		memcpy(joined + jl, s, strlen(s) + 1);
		jl += strlen(s);
		free(s);
		i = end;
	}
	return joined != NULL ? joined : strdup("");
}

/* find_call: the next occurrence of `name` at or after *pos in the
 * blanked code, at a word start and followed by "(" ; returns the index
 * after the "(" or 0. */
static size_t
find_call(const char *blank, size_t len, size_t *pos, const char *name)
{
	size_t nl = strlen(name);

	while (*pos < len) {
		const char *hit = strstr(blank + *pos, name);
		size_t at, k;

		if (hit == NULL) {
			*pos = len;
			return 0;
		}
		at = (size_t)(hit - blank);
		*pos = at + 1;
		/* "re.exec(" or "Image.open(" are other objects' methods;
		 * "fs.writeFileSync(" is the one looked for. */
		if (name[0] != '.' && at > 0 &&
		    (isalnum((unsigned char)blank[at - 1]) ||
		        blank[at - 1] == '_' ||
		        (blank[at - 1] == '.' &&
		            (strcmp(name, "exec") == 0 ||
		                strcmp(name, "spawn") == 0 ||
		                strcmp(name, "open") == 0))))
			continue;
		k = at + nl;
		while (k < len && blank[k] == ' ')
			k++;
		if (k < len && blank[k] == '(')
			return k + 1;
	}
	return 0;
}

static void
judge_runners(struct safety_judge *j, const char *code, const char *blank,
    size_t len, const char *const *names, int depth)
{
	for (int i = 0; names[i] != NULL; i++) {
		size_t pos = 0, args;

		while ((args = find_call(blank, len, &pos, names[i])) != 0) {
			char *cmd = literal_command_at(code, len, args);

			if (cmd == NULL) {
				moat_safety_raise(j, MOAT_SAFETY_SYSTEM,
				    "%s with a "
				    "computed command",
				    names[i]);
				continue;
			}
			moat_safety_shell(j, cmd, strlen(cmd), depth + 1);
			moat_safety_raise(j, MOAT_SAFETY_READ, "%s", names[i]);
			free(cmd);
		}
	}
}

static bool
calls_any(const char *blank, size_t len, const char *const *names,
    const char **which)
{
	for (int i = 0; names[i] != NULL; i++) {
		size_t pos = 0;

		if (find_call(blank, len, &pos, names[i]) != 0) {
			*which = names[i];
			return true;
		}
	}
	return false;
}

/* judge_open: Python's open(path, mode): a literal path and a mode that
 * writes. */
static void
judge_open(struct safety_judge *j, const char *code, const char *blank,
    size_t len)
{
	size_t pos = 0, args;

	while ((args = find_call(blank, len, &pos, "open")) != 0) {
		size_t end = args, k;
		char *path = literal_at(code, len, args, &end);
		int level = 1;
		bool writes = false;

		/* the call's other literals, up to its ")" */
		for (k = args; k < len && level > 0; k++) {
			if (blank[k] == '(')
				level++;
			else if (blank[k] == ')')
				level--;
			else if (k >= end && level == 1 &&
			    (blank[k] == '\'' || blank[k] == '"')) {
				size_t e2;
				char *lit = literal_at(code, len, k, &e2);

				if (lit != NULL && lit[0] != '\0' &&
				    strspn(lit, "rwabxt+U") == strlen(lit) &&
				    strpbrk(lit, "wax+") != NULL)
					writes = true;
				free(lit);
				k = e2 > k ? e2 - 1 : k;
			}
		}
		if (writes) {
			if (path != NULL)
				moat_safety_write_target(j, "open()", path);
			else
				moat_safety_raise(j, MOAT_SAFETY_WRITE,
				    "open() for "
				    "writing");
		}
		free(path);
	}
}

void
moat_safety_python(struct safety_judge *j, const char *code, int depth)
{
	static const char *const runners[] = { "os.system", "os.popen",
		"subprocess.run", "subprocess.call", "subprocess.Popen",
		"subprocess.check_output", "subprocess.check_call",
		"subprocess.getoutput", "subprocess.getstatusoutput",
		"check_output", "check_call", "Popen", NULL };
	static const char *const deleters[] = { "shutil.rmtree", "rmtree",
		"os.remove", "os.unlink", "os.rmdir", "os.removedirs",
		".unlink", ".rmdir", NULL };
	static const char *const systems[] = { "os.kill", "os.killpg",
		"os.setuid", "os.setgid", "os.chroot", "os.execv", "os.execvp",
		"os.execl", "os.execlp", "os.spawnv", "os.spawnl",
		"ctypes.CDLL", "signal.pthread_kill", NULL };
	static const char *const writers[] = { ".write_text", ".write_bytes",
		"os.makedirs", "os.mkdir", "shutil.copy", "shutil.copy2",
		"shutil.copyfile", "shutil.copytree", "shutil.move",
		"os.rename", "os.replace", "os.symlink", "os.link", "os.chmod",
		"os.chown", ".mkdir", ".touch", ".to_csv", ".savefig", ".save",
		NULL };
	size_t len = strlen(code);
	const char *which;
	char *blank;

	if (depth > MOAT_SAFETY_MAX_DEPTH)
		return;
	if ((blank = blank_strings(code, len, false)) == NULL) {
		j->oom = true;
		return;
	}
	if (strstr(blank, "os.fork") != NULL && strstr(blank, "while") != NULL)
		moat_safety_raise(j, MOAT_SAFETY_BLOCKED,
		    "fork bomb: os.fork() in a "
		    "loop");
	judge_runners(j, code, blank, len, runners, depth);
	if (calls_any(blank, len, deleters, &which))
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "%s() deletes files", which);
	if (strstr(blank, ".execute") != NULL)
		moat_safety_sql(j, code, "SQL");
	if (calls_any(blank, len, systems, &which))
		moat_safety_raise(j, MOAT_SAFETY_SYSTEM,
		    "%s() acts on the system", which);
	judge_open(j, code, blank, len);
	if (calls_any(blank, len, writers, &which))
		moat_safety_raise(j, MOAT_SAFETY_WRITE, "%s() writes files",
		    which);
	moat_safety_raise(j, MOAT_SAFETY_READ, "python code");
	free(blank);
}

void
moat_safety_node(struct safety_judge *j, const char *code, int depth)
{
	static const char *const runners[] = { "execSync", "exec", "spawnSync",
		"spawn", "execFileSync", "execFile", NULL };
	static const char *const deleters[] = { "rmSync", "rmdirSync",
		"unlinkSync", "fs.rm", "fs.unlink", "fs.rmdir", ".rm",
		".unlink", NULL };
	static const char *const writers[] = { "writeFileSync",
		"appendFileSync", "mkdirSync", "copyFileSync", "renameSync",
		"writeFile", "appendFile", "mkdir", "createWriteStream",
		"copyFile", "rename", NULL };
	size_t len = strlen(code);
	const char *which;
	char *blank;

	if (depth > MOAT_SAFETY_MAX_DEPTH)
		return;
	if ((blank = blank_strings(code, len, true)) == NULL) {
		j->oom = true;
		return;
	}
	judge_runners(j, code, blank, len, runners, depth);
	if (calls_any(blank, len, deleters, &which))
		moat_safety_raise(j, MOAT_SAFETY_DESTRUCTIVE,
		    "%s() deletes files", which);
	if (strstr(blank, "process.kill") != NULL)
		moat_safety_raise(j, MOAT_SAFETY_SYSTEM,
		    "process.kill() signals a "
		    "process");
	if (calls_any(blank, len, writers, &which))
		moat_safety_raise(j, MOAT_SAFETY_WRITE, "%s() writes files",
		    which);
	moat_safety_raise(j, MOAT_SAFETY_READ, "node code");
	free(blank);
}
