/*
 * code.c: persistent code contexts. A context is a long-lived python3
 * running a small driver (CODE_PY_DRIVER below): variables, imports,
 * functions and classes survive from one CodeRun to the next. Each
 * context has four pipes: the driver reads cells on fd 3 and answers on
 * fd 4 (one framed reply per cell: last expression's repr, exception
 * name, value and traceback), and its fds 1 and 2 are pipes the agent
 * reads, so what the cell prints and what its child processes write
 * straight to fd 1/2 both land in the result. A CodeRun is answered when
 * the driver's reply is in (the output pipes are drained first: the
 * driver flushes before it answers), or when the interpreter dies.
 * A timeout sends SIGINT to the interpreter: the driver turns the
 * KeyboardInterrupt into the cell's error and the context lives on;
 * one that does not stop within CODE_INTERRUPT_GRACE_MS is killed.
 * Not for: one-shot processes (exec.c) or the loop (loop.c).
 *
 * A context's interpreter runs in its own session and process group.
 * When it exits (os._exit, a crash, a kill), the run in flight (if any)
 * is answered with error_name "ContextDied" and the context is
 * forgotten: the next run of that name starts a fresh one. Contexts
 * outlive a host link; a run whose host went away is finished without
 * an answer.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define CODE_NAME_MAX 64
#define CODE_DEFAULT_NAME "default"
#define CODE_CWD "/root"
#define CODE_INTERRUPT_GRACE_MS 2000
/* One driver reply (its fields are cut to these sizes below). */
#define CODE_REPLY_MAX (2u << 20)
#define CODE_RESULT_MAX (256u << 10)
#define CODE_NAME_FIELD_MAX 256u
#define CODE_VALUE_MAX (64u << 10)
#define CODE_TRACEBACK_MAX (256u << 10)
/* What one drain of an output pipe reads at most (a background writer
 * must not keep the agent in a loop). */
#define CODE_DRAIN_MAX (2u << 20)

/* The driver, run as python3 -I -u -c. Replies on fd 4: a line
 * "HAS LEN_RESULT LEN_NAME LEN_VALUE LEN_TRACEBACK\n" and then the four
 * UTF-8 fields back to back. SIGINT is ignored outside a cell, so an
 * interrupt that comes late never kills the driver. A header "!LEN"
 * instead of "LEN" is a hidden cell (agent_code_reseed): run in a
 * namespace of its own, not numbered, its `result` the reply's. */
static const char code_py_driver[] =
    "import ast, linecache, os, signal, sys, traceback\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "cmd, rep = os.fdopen(3, 'rb'), os.fdopen(4, 'wb')\n"
    "sys.path.insert(0, '')\n"
    "ns = {'__name__': '__main__', '__builtins__': __builtins__}\n"
    "def cut(s, n):\n"
    "    return s if len(s) <= n else s[:n] + '...[cut]'\n"
    "def run(src, name):\n"
    "    linecache.cache[name] = (len(src), None,\n"
    "                             src.splitlines(True), name)\n"
    "    tree = ast.parse(src, name, 'exec')\n"
    "    last = None\n"
    "    if tree.body and isinstance(tree.body[-1], ast.Expr):\n"
    "        last = ast.Expression(tree.body.pop().value)\n"
    "    exec(compile(tree, name, 'exec'), ns)\n"
    "    if last is not None:\n"
    "        v = eval(compile(last, name, 'eval'), ns)\n"
    "        if v is not None:\n"
    "            return cut(repr(v), 65536 * 4)\n"
    "def text(e):\n"
    "    try:\n"
    "        return cut(str(e), 65536)\n"
    "    except BaseException:\n"
    "        return '<unprintable>'\n"
    "n = 0\n"
    "while True:\n"
    "    line = cmd.readline()\n"
    "    if not line:\n"
    "        break\n"
    "    hidden = line[:1] == b'!'\n"
    "    src = cmd.read(int(line.lstrip(b'!'))).decode('utf-8', "
    "'replace')\n"
    "    res, en, ev, tb, has = '', '', '', '', 0\n"
    "    if hidden:\n"
    "        h = {'__name__': '__moat__', '__builtins__': __builtins__}\n"
    "        try:\n"
    "            exec(src, h)\n"
    "            has, res = 1, cut(str(h.get('result', '')), 4096)\n"
    "        except BaseException as e:\n"
    "            en, ev = type(e).__name__, text(e)\n"
    "            del e\n"
    "        del h\n"
    "    else:\n"
    "      n += 1\n"
    "      try:\n"
    "          try:\n"
    "              signal.signal(signal.SIGINT, "
    "signal.default_int_handler)\n"
    "              r = run(src, '<cell-%d>' % n)\n"
    "              if r is not None:\n"
    "                  has, res = 1, r\n"
    "          finally:\n"
    "              signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "      except BaseException as e:\n"
    "          t = e.__traceback__\n"
    "          while t is not None and "
    "t.tb_frame.f_code.co_filename == '<string>':\n"
    "              t = t.tb_next\n"
    "          en, ev = type(e).__name__, text(e)\n"
    "          try:\n"
    "              tb = cut(''.join(traceback.format_exception("
    "type(e), e, t)), 65536 * 4)\n"
    "          except BaseException:\n"
    "              tb = ''\n"
    "          del e, t\n"
    "      for f in (sys.stdout, sys.stderr):\n"
    "          try:\n"
    "              f.flush()\n"
    "          except BaseException:\n"
    "              pass\n"
    "    p = [x.encode('utf-8', 'replace') for x in (res, en, ev, tb)]\n"
    "    rep.write(('%d %d %d %d %d\\n' % (has, *map(len, p))).encode()"
    " + b''.join(p))\n"
    "    rep.flush()\n";

/* The node driver, run as node -e: the same protocol as the python one.
 * Cells run in the main context (vm.runInThisContext), so top-level
 * var/let/const, functions and require()d modules persist; the
 * completion value of the cell is its result (util.inspect). SIGINT
 * interrupts a running cell (breakOnSigint) and is ignored between
 * cells. The driver's own names live in a closure, out of the cells'
 * way. Synchronous code only: a cell's promises are not awaited. A
 * hidden cell ("!LEN") evaluates to a function, called with the
 * driver's require; what it returns is the reply's result. */
static const char code_node_driver[] =
    "globalThis.require = require;\n"
    "(() => {\n"
    "const fs = require('fs'), vm = require('vm'), util = "
    "require('util');\n"
    "process.on('SIGINT', () => {});\n"
    "const cut = (s, n) => s.length <= n ? s : s.slice(0, n) + "
    "'...[cut]';\n"
    "let pend = Buffer.alloc(0), n = 0;\n"
    "function more() {\n"
    "  const b = Buffer.alloc(65536);\n"
    "  let k;\n"
    "  for (;;) {\n"
    "    try { k = fs.readSync(3, b, 0, b.length, null); break; }\n"
    "    catch (e) { if (e.code !== 'EAGAIN' && e.code !== 'EINTR') "
    "throw e; }\n"
    "  }\n"
    "  if (k === 0) process.exit(0);\n"
    "  pend = Buffer.concat([pend, b.subarray(0, k)]);\n"
    "}\n"
    "function text(v) { try { return cut(String(v), 65536); } "
    "catch (e) { return '<unprintable>'; } }\n"
    "for (;;) {\n"
    "  let nl;\n"
    "  while ((nl = pend.indexOf(10)) < 0) more();\n"
    "  const hidden = pend[0] === 33;\n"
    "  const len = parseInt(pend.subarray(hidden ? 1 : 0, nl).toString(), "
    "10);\n"
    "  pend = pend.subarray(nl + 1);\n"
    "  while (pend.length < len) more();\n"
    "  const src = pend.subarray(0, len).toString('utf8');\n"
    "  pend = pend.subarray(len);\n"
    "  let res = '', en = '', ev = '', tb = '', has = 0;\n"
    "  try {\n"
    "    if (hidden) {\n"
    "      has = 1;\n"
    "      res = text(vm.runInThisContext(src, { filename: '<moat>' "
    "})(require));\n"
    "    } else {\n"
    "      n++;\n"
    "      const v = vm.runInThisContext(src, { filename: '<cell-' + n "
    "+ '>', breakOnSigint: true });\n"
    "      if (v !== undefined) { has = 1; res = cut(util.inspect(v), "
    "262144); }\n"
    "    }\n"
    "  } catch (e) {\n"
    "    const interrupted = e && e.code === "
    "'ERR_SCRIPT_EXECUTION_INTERRUPTED';\n"
    "    en = interrupted ? 'KeyboardInterrupt' : (e && e.name) ? "
    "String(e.name) : typeof e;\n"
    "    ev = text(e && e.message !== undefined ? e.message : e);\n"
    "    tb = cut(String((e && e.stack) || ev), 262144);\n"
    "  }\n"
    "  const p = [res, en, ev, tb].map((x) => Buffer.from(x, "
    "'utf8'));\n"
    "  const head = Buffer.from([has, ...p.map((x) => "
    "x.length)].join(' ') + '\\n');\n"
    "  const out = Buffer.concat([head, ...p]);\n"
    "  for (let off = 0; off < out.length;) {\n"
    "    try { off += fs.writeSync(4, out, off); }\n"
    "    catch (e) { if (e.code !== 'EAGAIN') throw e; }\n"
    "  }\n"
    "}\n"
    "})();\n";

static const char *const code_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
	"TERM=dumb",
	NULL,
};

/* With guest egress on (egress.c): the same and the proxy. */
static const char *const code_env_egress[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
	"TERM=dumb",
	"http_proxy=http://" AGENT_EGRESS_ADDR,
	"https_proxy=http://" AGENT_EGRESS_ADDR,
	"HTTP_PROXY=http://" AGENT_EGRESS_ADDR,
	"HTTPS_PROXY=http://" AGENT_EGRESS_ADDR,
	"no_proxy=localhost,127.0.0.1,::1",
	"NO_PROXY=localhost,127.0.0.1,::1",
	NULL,
};

extern char **environ;

struct code_stream {
	uint8_t *buf; /* up to cap bytes kept, owned */
	size_t len;
	uint64_t dropped; /* past the cap */
};

/* One context, from its first run until its interpreter dies or it is
 * closed. */
struct agent_code {
	char name[CODE_NAME_MAX + 1];
	char lang[8];  /* "python" or "node" */
	pid_t pid;     /* the interpreter, and its process group */
	int cmd_fd;    /* cells to the driver (write end), -1 once closed */
	int rep_fd;    /* the driver's replies (read end) */
	int out_fd[2]; /* its fds 1 and 2 (read ends) */
	uint64_t runs; /* execution_count */
	/* the run in flight */
	bool busy;
	uint64_t req_id; /* 0: its host went away, answer nobody */
	bool created;    /* this run started the interpreter */
	uint64_t start_us;
	uint64_t deadline_ms; /* SIGINT then; 0 if none */
	uint64_t timeout_ms;
	uint64_t kill_ms; /* SIGKILL then, after the SIGINT; 0 if not yet */
	bool timed_out;
	char *kill_why;   /* static text: why the agent killed it, or NULL */
	uint8_t *cmd_buf; /* "LEN\n" + code, owned */
	size_t cmd_len, cmd_off;
	uint8_t *rep_buf; /* reply bytes so far, owned */
	size_t rep_len;
	struct code_stream out[2]; /* since the last answered run */
	/* hidden cells (agent_code_reseed): one is awaited now; replies of
	 * ones given up on, still to be dropped when they come */
	bool hidden_wait;
	unsigned hidden_stale;
};

/* The driver's reply, parsed; the strings point into a copy (owned). */
struct code_reply {
	bool has_result;
	char *field[4]; /* result, name, value, traceback */
	char *mem;
	size_t used; /* bytes of rep_buf the reply took */
};

static void
code_close_fd(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

/* code_kill: signals the interpreter's group, or the interpreter itself
 * right after fork, before its setsid(). Never with pid 0: that would be
 * the agent's own group. */
static void
code_kill(const struct agent_code *c, int sig)
{
	if (c->pid <= 0)
		return;
	if (kill(-c->pid, sig) != 0 && errno == ESRCH)
		(void)kill(c->pid, sig);
}

static struct agent_code *
code_find(struct agent *a, const char *name, int *slot)
{
	int i;

	for (i = 0; i < AGENT_CODE_MAX; i++)
		if (a->code[i] != NULL &&
		    strcmp(a->code[i]->name, name) == 0) {
			if (slot != NULL)
				*slot = i;
			return a->code[i];
		}
	return NULL;
}

static void
code_run_reset(struct agent_code *c)
{
	c->busy = false;
	c->req_id = 0;
	c->created = false;
	c->deadline_ms = c->kill_ms = 0;
	c->timed_out = false;
	c->kill_why = NULL;
	free(c->cmd_buf);
	c->cmd_buf = NULL;
	c->cmd_len = c->cmd_off = 0;
	free(c->rep_buf);
	c->rep_buf = NULL;
	c->rep_len = 0;
	for (int s = 0; s < 2; s++) {
		free(c->out[s].buf);
		c->out[s].buf = NULL;
		c->out[s].len = 0;
		c->out[s].dropped = 0;
	}
}

/* code_free: kills the interpreter's group (a no-op once it is gone;
 * a zombie left is reaped by the loop) and frees the slot. */
static void
code_free(struct agent *a, int slot)
{
	struct agent_code *c = a->code[slot];

	if (c == NULL)
		return;
	code_kill(c, SIGKILL);
	code_close_fd(&c->cmd_fd);
	code_close_fd(&c->rep_fd);
	code_close_fd(&c->out_fd[0]);
	code_close_fd(&c->out_fd[1]);
	code_run_reset(c);
	free(c);
	a->code[slot] = NULL;
}

static bool
code_name_valid(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > CODE_NAME_MAX)
		return false;
	return strspn(name,
	           "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	           "0123456789_.-") == n;
}

/* code_has_node: whether the image (the agent's root) has a node. */
static bool
code_has_node(struct agent *a)
{
	static const char *const where[] = { "/usr/local/bin/node",
		"/usr/bin/node", "/bin/node" };

	for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++) {
		int fd = agent_path_open(a, where[i], O_PATH, 0);

		if (fd >= 0) {
			close(fd);
			return true;
		}
	}
	return false;
}

/* code_child: in the forked child; never returns. The pipe ends are
 * first moved above fd 10 (close-on-exec) so that putting them on 0-4
 * cannot clobber one with another. */
static void __attribute__((noreturn))
code_child(int cwd_fd, const int want[5], bool node, char **envp)
{
	static char *const py_argv[] = { "python3", "-I", "-u", "-c",
		(char *)code_py_driver, NULL };
	static char *const node_argv[] = { "node", "-e",
		(char *)code_node_driver, NULL };
	char *const *argv = node ? node_argv : py_argv;
	int high[5], i;
	sigset_t none;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	setsid();
	for (i = 0; i < 5; i++)
		if ((high[i] = fcntl(want[i], F_DUPFD_CLOEXEC, 10)) < 0)
			_exit(127);
	for (i = 0; i < 5; i++)
		if (dup2(high[i], i) < 0)
			_exit(127);
	if (fchdir(cwd_fd) != 0) {
		dprintf(2, "moat-agent: cannot enter %s: %s\n", CODE_CWD,
		    strerror(errno));
		_exit(127);
	}
	umask(022);
	environ = envp;
	execvp(argv[0], argv);
	dprintf(2, "moat-agent: cannot run %s: %s\n", argv[0],
	    strerror(errno));
	_exit(127);
}

/* code_env_prepare: the interpreter's environment, made before fork:
 * the defaults, the image's /etc/moat/env, then the egress proxy's when
 * it is on (it wins: the guest reaches out only through it). */
static int
code_env_prepare(struct agent *a, struct agent_env *image, char ***envp)
{
	const char *const *layers[3];
	size_t n[3], n_base = sizeof(code_env) / sizeof(code_env[0]) - 1;
	int rv;

	if ((rv = agent_env_image(a, image)) != MOAT_OK)
		return rv;
	layers[0] = code_env;
	n[0] = n_base;
	layers[1] = (const char *const *)image->vars;
	n[1] = image->n;
	/* code_env_egress is code_env and then the proxy's variables */
	layers[2] = code_env_egress + n_base;
	n[2] = agent_egress_on ?
	    sizeof(code_env_egress) / sizeof(code_env_egress[0]) - 1 - n_base :
	    0;
	*envp = agent_env_layers(layers, n, 3);
	return *envp != NULL ? MOAT_OK : MOAT_RESOURCE_EXHAUSTED;
}

/* code_spawn: starts a context's interpreter. Returns 0 and *out (in no
 * slot yet), or a status with *why (heap). */
static int
code_spawn(struct agent *a, const char *name, const char *lang,
    struct agent_code **out, char **why)
{
	int cmd[2] = { -1, -1 }, rep[2] = { -1, -1 };
	int o[2] = { -1, -1 }, e[2] = { -1, -1 }, devnull = -1, cwd = -1;
	struct agent_code *c = NULL;
	struct agent_env image_env = { 0 };
	char **envp = NULL;
	int rv = MOAT_OK;
	pid_t pid;

	cwd = agent_path_open(a, CODE_CWD, O_PATH | O_DIRECTORY, 0);
	if (cwd == -ENOENT) {
		if ((rv = agent_path_mkdirs(a, CODE_CWD, 0755)) != 0) {
			rv = agent_path_error(rv, CODE_CWD, "make cwd", why);
			goto out;
		}
		cwd = agent_path_open(a, CODE_CWD, O_PATH | O_DIRECTORY, 0);
	}
	if (cwd < 0) {
		rv = agent_path_error(cwd, CODE_CWD, "use as cwd", why);
		goto out;
	}
	if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0 ||
	    pipe2(o, O_CLOEXEC) != 0 || pipe2(e, O_CLOEXEC) != 0 ||
	    (devnull = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
		*why = moat_asprintf("pipe: %s", strerror(errno));
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	if (fcntl(cmd[1], F_SETFL, O_NONBLOCK) != 0 ||
	    fcntl(rep[0], F_SETFL, O_NONBLOCK) != 0 ||
	    fcntl(o[0], F_SETFL, O_NONBLOCK) != 0 ||
	    fcntl(e[0], F_SETFL, O_NONBLOCK) != 0) {
		*why = moat_asprintf("pipe flags: %s", strerror(errno));
		rv = MOAT_INTERNAL;
		goto out;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL ||
	    (rv = code_env_prepare(a, &image_env, &envp)) != MOAT_OK) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	if ((pid = fork()) < 0) {
		*why = moat_asprintf("fork: %s", strerror(errno));
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto out;
	}
	if (pid == 0) {
		int want[5] = { devnull, o[1], e[1], cmd[0], rep[1] };

		code_child(cwd, want, strcmp(lang, "node") == 0, envp);
	}
	snprintf(c->name, sizeof(c->name), "%s", name);
	snprintf(c->lang, sizeof(c->lang), "%s", lang);
	c->pid = pid;
	c->cmd_fd = cmd[1];
	c->rep_fd = rep[0];
	c->out_fd[0] = o[0];
	c->out_fd[1] = e[0];
	cmd[1] = rep[0] = o[0] = e[0] = -1;
	*out = c;
	c = NULL;
	moat_info(0, "code context \"%s\" started: %s pid %d", name, lang,
	    (int)pid);
out:
	free(c);
	free(envp);
	agent_env_free(&image_env);
	code_close_fd(&cwd);
	code_close_fd(&devnull);
	for (int i = 0; i < 2; i++) {
		code_close_fd(&cmd[i]);
		code_close_fd(&rep[i]);
		code_close_fd(&o[i]);
		code_close_fd(&e[i]);
	}
	return rv;
}

/* code_write_cmd: writes what is pending of the cell. A driver that
 * stopped reading is found dead by the reaper. */
static void
code_write_cmd(struct agent_code *c)
{
	while (c->cmd_fd >= 0 && c->cmd_off < c->cmd_len) {
		ssize_t n = write(c->cmd_fd, c->cmd_buf + c->cmd_off,
		    c->cmd_len - c->cmd_off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			code_close_fd(&c->cmd_fd);
			return;
		}
		c->cmd_off += (size_t)n;
	}
	if (c->cmd_off == c->cmd_len && c->cmd_buf != NULL) {
		free(c->cmd_buf);
		c->cmd_buf = NULL;
		c->cmd_len = c->cmd_off = 0;
	}
}

static void
code_stream_add(struct code_stream *st, const uint8_t *data, size_t n)
{
	size_t room =
	    st->len < AGENT_OUTPUT_CAP ? AGENT_OUTPUT_CAP - st->len : 0;
	size_t keep = n < room ? n : room;

	if (keep > 0 && st->buf == NULL &&
	    (st->buf = malloc(AGENT_OUTPUT_CAP)) == NULL)
		keep = 0;
	if (keep > 0) {
		memcpy(st->buf + st->len, data, keep);
		st->len += keep;
	}
	st->dropped += n - keep;
}

/* code_read_stream: reads output pipe s until it is empty (or at most
 * `max` bytes). EOF closes it. */
static void
code_read_stream(struct agent_code *c, int s, size_t max)
{
	static uint8_t chunk[AGENT_CHUNK];
	size_t total = 0;

	while (c->out_fd[s] >= 0 && total < max) {
		ssize_t n = read(c->out_fd[s], chunk, sizeof(chunk));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			code_close_fd(&c->out_fd[s]);
			return;
		}
		code_stream_add(&c->out[s], chunk, (size_t)n);
		total += (size_t)n;
	}
}

/* code_read_reply: reads the reply pipe until it is empty. Returns false
 * when the driver sent more than a reply may hold (it is then killed). */
static bool
code_read_reply(struct agent_code *c)
{
	uint8_t chunk[16384];

	while (c->rep_fd >= 0) {
		ssize_t n = read(c->rep_fd, chunk, sizeof(chunk));
		uint8_t *nb;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return true;
		if (n <= 0) {
			/* the interpreter closed it, or is gone */
			code_close_fd(&c->rep_fd);
			code_kill(c, SIGKILL);
			return true;
		}
		if (c->rep_len + (size_t)n > CODE_REPLY_MAX ||
		    (nb = realloc(c->rep_buf, c->rep_len + (size_t)n)) ==
		        NULL) {
			c->kill_why = "it sent more than a reply may hold";
			code_kill(c, SIGKILL);
			code_close_fd(&c->rep_fd);
			return false;
		}
		memcpy(nb + c->rep_len, chunk, (size_t)n);
		c->rep_buf = nb;
		c->rep_len += (size_t)n;
	}
	return true;
}

/* code_cut: n, less enough that the text ends on a whole UTF-8
 * character, and at most max. */
static size_t
code_cut(const char *s, size_t n, size_t max)
{
	if (n <= max)
		return n;
	n = max;
	while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
		n--;
	return n;
}

/* code_parse_reply: 1 with *r filled (free r->mem) when rep_buf holds a
 * whole reply, 0 when more is to come, -1 when it is not a reply. */
static int
code_parse_reply(const struct agent_code *c, struct code_reply *r)
{
	static const size_t caps[4] = { CODE_RESULT_MAX, CODE_NAME_FIELD_MAX,
		CODE_VALUE_MAX, CODE_TRACEBACK_MAX };
	const char *nl;
	unsigned long long has, len[4];
	char head[128];
	size_t hlen, need, off, i;
	char *p;

	memset(r, 0, sizeof(*r));
	if (c->rep_len == 0)
		return 0;
	nl = memchr(c->rep_buf, '\n', c->rep_len);
	if (nl == NULL)
		return c->rep_len < sizeof(head) ? 0 : -1;
	hlen = (size_t)(nl - (const char *)c->rep_buf);
	if (hlen >= sizeof(head))
		return -1;
	memcpy(head, c->rep_buf, hlen);
	head[hlen] = '\0';
	if (sscanf(head, "%llu %llu %llu %llu %llu", &has, &len[0], &len[1],
	        &len[2], &len[3]) != 5)
		return -1;
	need = hlen + 1;
	for (i = 0; i < 4; i++) {
		if (len[i] > CODE_REPLY_MAX)
			return -1;
		need += (size_t)len[i];
	}
	if (need > CODE_REPLY_MAX)
		return -1;
	if (c->rep_len < need)
		return 0;
	if ((r->mem = malloc(need)) == NULL)
		return -1;
	r->has_result = has != 0;
	off = hlen + 1;
	p = r->mem;
	for (i = 0; i < 4; i++) {
		const char *src = (const char *)c->rep_buf + off;
		size_t keep = code_cut(src, (size_t)len[i], caps[i]);

		memcpy(p, src, keep);
		p[keep] = '\0';
		r->field[i] = p;
		p += keep + 1;
		off += (size_t)len[i];
	}
	r->used = need;
	return 1;
}

/* code_rep_consume: drops the first n bytes of rep_buf (one reply). */
static void
code_rep_consume(struct agent_code *c, size_t n)
{
	if (n >= c->rep_len) {
		free(c->rep_buf);
		c->rep_buf = NULL;
		c->rep_len = 0;
		return;
	}
	memmove(c->rep_buf, c->rep_buf + n, c->rep_len - n);
	c->rep_len -= n;
}

/* code_drop_stale: drops whole replies of hidden cells given up on.
 * Returns false when the reply pipe holds garbage (the context is then
 * killed). */
static bool
code_drop_stale(struct agent_code *c)
{
	struct code_reply r;
	int rv;

	while (c->hidden_stale > 0) {
		if ((rv = code_parse_reply(c, &r)) == 0)
			return true;
		if (rv < 0) {
			c->kill_why =
			    "it wrote garbage on the driver's reply pipe";
			code_kill(c, SIGKILL);
			code_close_fd(&c->rep_fd);
			return false;
		}
		code_rep_consume(c, r.used);
		free(r.mem);
		c->hidden_stale--;
	}
	return true;
}

/* code_note_dropped: says in the stream itself that its end was cut. */
static void
code_note_dropped(struct code_stream *st, const char *which)
{
	char note[160];
	int n;
	uint8_t *nb;

	if (st->dropped == 0)
		return;
	n = snprintf(note, sizeof(note),
	    "\n[moat: %" PRIu64 " more bytes of %s were dropped: at most %u "
	    "are kept]\n",
	    st->dropped, which, AGENT_OUTPUT_CAP);
	if (n <= 0 || (nb = realloc(st->buf, st->len + (size_t)n)) == NULL)
		return;
	memcpy(nb + st->len, note, (size_t)n);
	st->buf = nb;
	st->len += (size_t)n;
}

/* code_answer: sends the run's CodeResult (with `reply` from the driver,
 * or NULL when the interpreter died with wait status `st`) and ends the
 * run. */
static void
code_answer(struct agent *a, struct agent_code *c,
    const struct code_reply *reply, int st)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__CodeResult res = MOAT__V1__CODE_RESULT__INIT;
	char *died = NULL;

	code_read_stream(c, 0, CODE_DRAIN_MAX);
	code_read_stream(c, 1, CODE_DRAIN_MAX);
	code_note_dropped(&c->out[0], "stdout");
	code_note_dropped(&c->out[1], "stderr");
	res.context = c->name;
	res.language = c->lang;
	res.stdout.data = c->out[0].buf;
	res.stdout.len = c->out[0].len;
	res.stderr.data = c->out[1].buf;
	res.stderr.len = c->out[1].len;
	res.timed_out = c->timed_out;
	res.duration_us = agent_now_us() - c->start_us;
	res.context_created = c->created;
	res.execution_count = c->runs;
	if (reply != NULL) {
		res.has_result = reply->has_result;
		res.result = reply->field[0];
		res.error_name = reply->field[1];
		res.error_value = reply->field[2];
		res.traceback = reply->field[3];
		if (c->timed_out &&
		    strcmp(reply->field[1], "KeyboardInterrupt") == 0 &&
		    reply->field[2][0] == '\0')
			res.error_value = died = moat_asprintf(
			    "the cell ran past its timeout of %" PRIu64
			    " ms and was interrupted; the context and its "
			    "variables are kept",
			    c->timeout_ms);
	} else {
		char how[64];

		if (WIFEXITED(st))
			snprintf(how, sizeof(how), "exited with status %d",
			    WEXITSTATUS(st));
		else
			snprintf(how, sizeof(how), "was killed by signal %d",
			    WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		res.error_name = "ContextDied";
		res.error_value = died = moat_asprintf(
		    "the python interpreter of context \"%s\" %s%s%s; its "
		    "state is lost and the next run starts a fresh context",
		    c->name, how, c->kill_why ? ": " : "",
		    c->kill_why ? c->kill_why : "");
		if (res.error_value == NULL)
			res.error_value = "the interpreter died";
	}
	m.id = c->req_id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_CODE_RESULT;
	m.code_result = &res;
	if (c->req_id != 0 && agent_send(a, &m) != 0)
		agent_send_error(a, c->req_id, MOAT_INTERNAL,
		    "code_run: the result of context \"%s\" does not fit a "
		    "frame",
		    c->name);
	moat_debug(c->req_id, "code run over in \"%s\": %s%s", c->name,
	    res.error_name[0] ? res.error_name : "ok",
	    c->timed_out ? " (timed out)" : "");
	free(died);
	code_run_reset(c);
}

/* code_check_reply: answers the run when its whole reply is in. */
static void
code_check_reply(struct agent *a, struct agent_code *c)
{
	struct code_reply r;
	int rv;

	if (!code_drop_stale(c) || !c->busy || c->hidden_wait)
		return;
	rv = code_parse_reply(c, &r);
	if (rv < 0) {
		c->kill_why = "it wrote garbage on the driver's reply pipe";
		code_kill(c, SIGKILL);
		code_close_fd(&c->rep_fd);
		return;
	}
	if (rv == 1) {
		code_answer(a, c, &r, 0);
		free(r.mem);
	}
}

int
agent_code_run(struct agent *a, const Moat__V1__GuestRequest *req, char **why)
{
	const Moat__V1__CodeRun *cr = req->code_run;
	const char *name = cr->context[0] ? cr->context : CODE_DEFAULT_NAME;
	const char *lang = cr->language[0] ? cr->language : "python";
	struct agent_code *c;
	size_t code_len = strlen(cr->code);
	char head[32];
	int rv, slot = -1, hl;

	if (!code_name_valid(name)) {
		*why =
		    moat_asprintf("context name \"%.80s\" is not valid: use "
		                  "1 to %d of A-Z a-z 0-9 _ . -",
		        name, CODE_NAME_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if (strcmp(lang, "node") == 0) {
		if (!code_has_node(a)) {
			*why = strdup("the image has no node; python is "
			              "available (language \"python\")");
			return MOAT_FAILED_PRECONDITION;
		}
	} else if (strcmp(lang, "python") != 0) {
		*why = moat_asprintf("language \"%.40s\" is unknown: code "
		                     "contexts run \"python\" (or \"node\" "
		                     "where the image has it)",
		    lang);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((c = code_find(a, name, NULL)) != NULL &&
	    strcmp(c->lang, lang) != 0) {
		*why = moat_asprintf("context \"%s\" runs %s, not %s: pick "
		                     "another context name or close it first",
		    name, c->lang, lang);
		return MOAT_FAILED_PRECONDITION;
	}
	if (c != NULL && c->busy) {
		*why = moat_asprintf("context \"%s\" is still running a cell "
		                     "(request %" PRIu64 "); wait for its "
		                     "result or close the context",
		    name, c->req_id);
		return MOAT_FAILED_PRECONDITION;
	}
	if (c == NULL) {
		for (int i = 0; i < AGENT_CODE_MAX; i++)
			if (a->code[i] == NULL) {
				slot = i;
				break;
			}
		if (slot < 0) {
			*why = moat_asprintf(
			    "%d code contexts are open, the most a sandbox "
			    "has; close one (moat code SANDBOX --close NAME)",
			    AGENT_CODE_MAX);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		if ((rv = code_spawn(a, name, lang, &c, why)) != 0)
			return rv;
		a->code[slot] = c;
		c->created = true;
	}
	hl = snprintf(head, sizeof(head), "%zu\n", code_len);
	if ((c->cmd_buf = malloc((size_t)hl + code_len)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	memcpy(c->cmd_buf, head, (size_t)hl);
	memcpy(c->cmd_buf + hl, cr->code, code_len);
	c->cmd_len = (size_t)hl + code_len;
	c->cmd_off = 0;
	c->busy = true;
	c->req_id = req->id;
	c->runs++;
	c->start_us = agent_now_us();
	c->timeout_ms = cr->timeout_ms;
	/* The start rounded up to a whole ms: a deadline from the rounded
	 * down start interrupted up to 1 ms early, so a cell could report
	 * less than its timeout (agent_code's check failed under ASan). */
	c->deadline_ms =
	    cr->timeout_ms ? (c->start_us + 999) / 1000 + cr->timeout_ms : 0;
	code_write_cmd(c);
	return MOAT_OK;
}

int
agent_code_close(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const char *name = req->code_context_close->context[0] ?
	    req->code_context_close->context :
	    CODE_DEFAULT_NAME;
	struct agent_code *c;
	int slot;

	if (!code_name_valid(name)) {
		*why =
		    moat_asprintf("context name \"%.80s\" is not valid: use "
		                  "1 to %d of A-Z a-z 0-9 _ . -",
		        name, CODE_NAME_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((c = code_find(a, name, &slot)) == NULL) {
		*why = moat_asprintf("no code context \"%s\" is open", name);
		return MOAT_NOT_FOUND;
	}
	if (c->busy) {
		c->kill_why = "the context was closed during the run";
		code_answer(a, c, NULL, SIGKILL);
	}
	code_free(a, slot);
	moat_info(req->id, "code context \"%s\" closed", name);
	agent_send_ack(a, req->id);
	return MOAT_OK;
}

int
agent_code_pollfds(struct agent *a, struct pollfd *pfd, int *map)
{
	int i, n = 0;

	for (i = 0; i < AGENT_CODE_MAX; i++) {
		struct agent_code *c = a->code[i];
		int fds[4];

		if (c == NULL)
			continue;
		fds[0] = c->cmd_off < c->cmd_len ? c->cmd_fd : -1;
		fds[1] = c->rep_fd;
		fds[2] = c->out_fd[0];
		fds[3] = c->out_fd[1];
		for (int w = 0; w < 4; w++) {
			if (fds[w] < 0)
				continue;
			pfd[n].fd = fds[w];
			pfd[n].events = w == 0 ? POLLOUT : POLLIN;
			pfd[n].revents = 0;
			map[n++] = i * 4 + w;
		}
	}
	return n;
}

void
agent_code_events(struct agent *a, const struct pollfd *pfd, const int *map,
    int n)
{
	for (int i = 0; i < n; i++) {
		struct agent_code *c = a->code[map[i] / 4];
		int what = map[i] % 4;

		if (pfd[i].revents == 0 || c == NULL)
			continue;
		switch (what) {
		case 0:
			if (pfd[i].fd == c->cmd_fd)
				code_write_cmd(c);
			break;
		case 1:
			if (pfd[i].fd == c->rep_fd && code_read_reply(c))
				code_check_reply(a, c);
			break;
		default:
			if (pfd[i].fd == c->out_fd[what - 2])
				code_read_stream(c, what - 2, CODE_DRAIN_MAX);
			break;
		}
	}
}

bool
agent_code_reaped(struct agent *a, pid_t pid, int st)
{
	for (int i = 0; i < AGENT_CODE_MAX; i++) {
		struct agent_code *c = a->code[i];

		if (c == NULL || c->pid != pid)
			continue;
		/* a reply written just before it died still counts */
		if (c->busy && code_read_reply(c))
			code_check_reply(a, c);
		moat_info(c->req_id, "code context \"%s\" (pid %d) is gone",
		    c->name, (int)pid);
		if (c->busy)
			code_read_stream(c, 1, CODE_DRAIN_MAX);
		if (c->busy && c->created && c->runs == 1 && WIFEXITED(st) &&
		    WEXITSTATUS(st) == 127 && c->out[1].len >= 12 &&
		    memcmp(c->out[1].buf, "moat-agent: ", 12) == 0) {
			/* code_child failed: no python3 in the image */
			if (c->req_id != 0)
				agent_send_error(a, c->req_id,
				    MOAT_FAILED_PRECONDITION,
				    "code_run: python3 could not be started "
				    "in the guest: %.*s",
				    (int)(c->out[1].len < 512 ? c->out[1].len :
				                                512),
				    c->out[1].buf ? (char *)c->out[1].buf :
				                    "");
			code_run_reset(c);
		} else if (c->busy) {
			code_answer(a, c, NULL, st);
		}
		/* its group may live on (background children); the pid
		 * itself is reaped and may be reused: only the group */
		(void)kill(-pid, SIGKILL);
		c->pid = 0;
		code_free(a, i);
		return true;
	}
	return false;
}

int
agent_code_timer(struct agent *a, uint64_t now)
{
	int next = -1;

	for (int i = 0; i < AGENT_CODE_MAX; i++) {
		struct agent_code *c = a->code[i];
		uint64_t due;

		if (c == NULL || !c->busy)
			continue;
		if (c->kill_ms != 0) {
			if (now >= c->kill_ms) {
				c->kill_why =
				    "it did not stop within 2 s of "
				    "the interrupt after its timeout";
				code_kill(c, SIGKILL);
				c->kill_ms = 0;
				continue;
			}
			due = c->kill_ms;
		} else if (c->deadline_ms != 0) {
			if (now >= c->deadline_ms) {
				moat_info(c->req_id,
				    "code context \"%s\" timed out: "
				    "interrupting pid %d",
				    c->name, (int)c->pid);
				if (c->pid > 0)
					(void)kill(c->pid, SIGINT);
				c->timed_out = true;
				c->deadline_ms = 0;
				c->kill_ms = now + CODE_INTERRUPT_GRACE_MS;
				due = c->kill_ms;
			} else {
				due = c->deadline_ms;
			}
		} else {
			continue;
		}
		if (next < 0 || due - now < (uint64_t)next)
			next = (int)(due - now);
	}
	return next;
}

void
agent_code_drop_host(struct agent *a)
{
	for (int i = 0; i < AGENT_CODE_MAX; i++)
		if (a->code[i] != NULL)
			a->code[i]->req_id = 0;
}

void
agent_code_kill_all(struct agent *a)
{
	for (int i = 0; i < AGENT_CODE_MAX; i++)
		if (a->code[i] != NULL)
			code_kill(a->code[i], SIGKILL);
}

/* ---- reseed after a restore into a new sandbox (issue 18) ---- */

/* What a context's hidden cell has at most to answer a reseed; one that
 * does not is given up on (its late reply is dropped, see hidden_stale). */
#define CODE_RESEED_MS 5000

/* Python's hidden reseed cell, run by the driver in a namespace of its
 * own (no user variable is touched or added): only modules the user's
 * cells imported (sys.modules) are reseeded, none is imported. The bytes
 * come from the kernel's pool, which the reset has just fed. */
static const char code_py_reseed[] =
    "import os, sys\n"
    "done = []\n"
    "m = sys.modules.get('random')\n"
    "if m is not None and hasattr(m, 'seed'):\n"
    "    m.seed(os.urandom(32))\n"
    "    done.append('random')\n"
    "m = sys.modules.get('numpy.random')\n"
    "if m is not None and hasattr(m, 'seed'):\n"
    "    b = os.urandom(32)\n"
    "    m.seed([int.from_bytes(b[i:i + 4], 'little') "
    "for i in range(0, 32, 4)])\n"
    "    done.append('numpy.random')\n"
    "result = ' '.join(done) or 'nothing to reseed'\n";

/* Node's: V8's Math.random cannot be reseeded, so it is replaced by a
 * xoshiro128** generator (53-bit doubles from two outputs) seeded from
 * /dev/urandom. Not from crypto.randomBytes: that is OpenSSL's generator
 * in the process, whose state the snapshot holds too, so every copy of a
 * fork would draw the same seed. The driver calls the function with its
 * require. */
static const char code_node_reseed[] =
    "(function (require) {\n"
    "  const fs = require('fs'), b = Buffer.alloc(16);\n"
    "  const fd = fs.openSync('/dev/urandom', 'r');\n"
    "  try {\n"
    "    for (let k = 0; k < 16;) k += fs.readSync(fd, b, k, 16 - k, "
    "null);\n"
    "  } finally { fs.closeSync(fd); }\n"
    "  const s = new Uint32Array(4);\n"
    "  for (let i = 0; i < 4; i++) s[i] = b.readUInt32LE(4 * i);\n"
    "  if ((s[0] | s[1] | s[2] | s[3]) === 0) s[0] = 1;\n"
    "  const rotl = (x, k) => ((x << k) | (x >>> (32 - k))) >>> 0;\n"
    "  const next = () => {\n"
    "    const r = Math.imul(rotl(Math.imul(s[1], 5) >>> 0, 7), 9) >>> "
    "0;\n"
    "    const t = (s[1] << 9) >>> 0;\n"
    "    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];\n"
    "    s[2] ^= t; s[3] = rotl(s[3], 11);\n"
    "    return r;\n"
    "  };\n"
    "  Math.random = function random() {\n"
    "    return ((next() >>> 5) * 67108864 + (next() >>> 6)) / "
    "9007199254740992;\n"
    "  };\n"
    "  return 'Math.random (xoshiro128**)';\n"
    "})\n";

/* code_cmd_drop: forgets what is left to write of a cell (its
 * interpreter is gone or being killed). */
static void
code_cmd_drop(struct agent_code *c)
{
	free(c->cmd_buf);
	c->cmd_buf = NULL;
	c->cmd_len = c->cmd_off = 0;
}

/* code_hidden_start: queues the hidden reseed cell of idle context c
 * ("!LEN\n" + code: the driver runs it apart from the cells, counts it
 * nowhere and prints nothing). Returns false when out of memory. */
static bool
code_hidden_start(struct agent_code *c)
{
	const char *src =
	    strcmp(c->lang, "node") == 0 ? code_node_reseed : code_py_reseed;
	size_t len = strlen(src);
	char head[32];
	int hl = snprintf(head, sizeof(head), "!%zu\n", len);

	if ((c->cmd_buf = malloc((size_t)hl + len)) == NULL)
		return false;
	memcpy(c->cmd_buf, head, (size_t)hl);
	memcpy(c->cmd_buf + hl, src, len);
	c->cmd_len = (size_t)hl + len;
	c->cmd_off = 0;
	c->hidden_wait = true;
	code_write_cmd(c);
	return true;
}

/* code_hidden_check: when c's hidden reply is in, logs it and ends the
 * wait. */
static void
code_hidden_check(struct agent_code *c, uint64_t id, unsigned *ok)
{
	struct code_reply r;
	int rv;

	if (!code_drop_stale(c)) {
		c->hidden_wait = false;
		code_cmd_drop(c);
		moat_warn(id, "code context \"%s\": not reseeded: %s", c->name,
		    c->kill_why);
		return;
	}
	if ((rv = code_parse_reply(c, &r)) == 0) {
		if (c->rep_fd < 0) {
			c->hidden_wait = false;
			code_cmd_drop(c);
			moat_warn(id,
			    "code context \"%s\": not reseeded: its "
			    "interpreter is gone",
			    c->name);
		}
		return;
	}
	c->hidden_wait = false;
	if (rv < 0) {
		c->kill_why = "it wrote garbage on the driver's reply pipe";
		code_kill(c, SIGKILL);
		code_close_fd(&c->rep_fd);
		code_cmd_drop(c);
		moat_warn(id, "code context \"%s\": not reseeded: %s", c->name,
		    c->kill_why);
		return;
	}
	if (r.field[1][0] != '\0') {
		moat_warn(id, "code context \"%s\": reseed failed: %s: %s",
		    c->name, r.field[1], r.field[2]);
	} else {
		moat_info(id, "code context \"%s\" (%s) reseeded: %s", c->name,
		    c->lang, r.field[0]);
		(*ok)++;
	}
	code_rep_consume(c, r.used);
	free(r.mem);
}

unsigned
agent_code_reseed(struct agent *a, uint64_t id)
{
	struct pollfd pfd[AGENT_CODE_MAX * 4];
	int map[AGENT_CODE_MAX * 4];
	uint64_t deadline = agent_now_ms() + CODE_RESEED_MS;
	unsigned ok = 0, waiting = 0;

	for (int i = 0; i < AGENT_CODE_MAX; i++) {
		struct agent_code *c = a->code[i];

		if (c == NULL)
			continue;
		if (c->busy || c->cmd_buf != NULL) {
			/* a cell was running when the snapshot was taken */
			moat_warn(id,
			    "code context \"%s\" is running a cell: not "
			    "reseeded",
			    c->name);
			continue;
		}
		if (!code_hidden_start(c)) {
			moat_warn(id,
			    "code context \"%s\": not reseeded: out of "
			    "memory",
			    c->name);
			continue;
		}
		waiting++;
	}
	while (waiting > 0) {
		uint64_t now = agent_now_ms();
		int n = 0, rv;

		if (now >= deadline)
			break;
		for (int i = 0; i < AGENT_CODE_MAX; i++) {
			struct agent_code *c = a->code[i];
			int fds[4];

			if (c == NULL || !c->hidden_wait)
				continue;
			fds[0] = c->cmd_off < c->cmd_len ? c->cmd_fd : -1;
			fds[1] = c->rep_fd;
			fds[2] = c->out_fd[0];
			fds[3] = c->out_fd[1];
			for (int w = 0; w < 4; w++) {
				if (fds[w] < 0)
					continue;
				pfd[n].fd = fds[w];
				pfd[n].events = w == 0 ? POLLOUT : POLLIN;
				pfd[n].revents = 0;
				map[n++] = i * 4 + w;
			}
		}
		if (n == 0)
			break;
		rv = poll(pfd, (nfds_t)n, (int)(deadline - now));
		if (rv < 0 && errno != EINTR)
			break;
		for (int k = 0; rv > 0 && k < n; k++) {
			struct agent_code *c = a->code[map[k] / 4];
			int what = map[k] % 4;

			if (pfd[k].revents == 0)
				continue;
			if (what == 0)
				code_write_cmd(c);
			else if (what == 1)
				(void)code_read_reply(c);
			else
				code_read_stream(c, what - 2, CODE_DRAIN_MAX);
		}
		/* a context whose pipes all closed has nothing to poll */
		waiting = 0;
		for (int i = 0; i < AGENT_CODE_MAX; i++) {
			struct agent_code *c = a->code[i];

			if (c == NULL || !c->hidden_wait)
				continue;
			code_hidden_check(c, id, &ok);
			if (c->hidden_wait)
				waiting++;
		}
	}
	for (int i = 0; i < AGENT_CODE_MAX; i++) {
		struct agent_code *c = a->code[i];

		if (c == NULL || !c->hidden_wait)
			continue;
		c->hidden_wait = false;
		if (c->cmd_buf != NULL) {
			/* it does not even read: nothing can be sent to it
			 * after a cell cut in half */
			c->kill_why = "it did not read the reseed after a "
			              "restore";
			code_kill(c, SIGKILL);
			code_close_fd(&c->cmd_fd);
			code_cmd_drop(c);
			moat_warn(id,
			    "code context \"%s\": not reseeded within %d ms "
			    "and it does not read its cells: killed",
			    c->name, CODE_RESEED_MS);
		} else {
			c->hidden_stale++;
			moat_warn(id,
			    "code context \"%s\": not reseeded within %d ms "
			    "(its answer will be dropped when it comes)",
			    c->name, CODE_RESEED_MS);
		}
	}
	return ok;
}
