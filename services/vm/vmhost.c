/*
 * vmhost.c: the host-side helpers both VMM drivers use (see vmhost.h):
 * log tails for error messages, /proc checks and orphan kills by pidfile,
 * the agent socket's connect, the version probe's command, stop's signal
 * and a fine clock. Not for: spawning (spawn.c), copying files
 * (extents.c), or anything one driver alone needs.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sync.h"
#include "vmhost.h"

#define TAIL_BYTES 16384
#define ORPHAN_WAIT_TRIES 500 /* of 10 ms: 5 s */

/* The last `room` bytes of <path>.1 into buf; returns how many. */
static ssize_t
tail_older(const char *path, char *buf, size_t room)
{
	char *older = moat_asprintf("%s.1", path);
	int fd = older ? open(older, O_RDONLY | O_CLOEXEC) : -1;
	off_t size;
	ssize_t got = 0;

	free(older);
	if (fd < 0)
		return 0;
	size = lseek(fd, 0, SEEK_END);
	if (size > 0) {
		size_t n = (size_t)size < room ? (size_t)size : room;

		got = pread(fd, buf, n, size - (off_t)n);
	}
	close(fd);
	return got > 0 ? got : 0;
}

char *
vmd_log_tail(const char *path, int lines)
{
	char *buf = NULL;
	char *start;
	int fd;
	off_t size;
	ssize_t got;
	int seen = 0;

	if (path == NULL || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return strdup("");
	size = lseek(fd, 0, SEEK_END);
	if (size < 0 || (buf = malloc(TAIL_BYTES + 1)) == NULL) {
		close(fd);
		return strdup("");
	}
	/* A capped console (console.h) that just rotated is short: the
	 * lines before are at the end of <path>.1. */
	got = size < TAIL_BYTES ? tail_older(path, buf, TAIL_BYTES - size) : 0;
	if (size > 0) {
		ssize_t n = pread(fd, buf + got, TAIL_BYTES - (size_t)got,
		    size > TAIL_BYTES ? size - TAIL_BYTES : 0);

		got += n > 0 ? n : 0;
	}
	close(fd);
	if (got <= 0) {
		free(buf);
		return strdup("");
	}
	buf[got] = '\0';
	/* A serial console ends lines with CR LF: the CR is noise, not a
	 * character to flag. */
	for (ssize_t i = 0; i < got; i++) {
		unsigned char c = (unsigned char)buf[i];

		if (c == '\r' || c == '\0')
			buf[i] = ' ';
		else if (c != '\n' && (c < 0x20 || c > 0x7e))
			buf[i] = '?';
	}
	while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == ' '))
		buf[--got] = '\0';
	start = buf + got;
	while (start > buf) {
		if (start[-1] == '\n' && ++seen >= lines)
			break;
		start--;
	}
	start = strdup(start);
	free(buf);
	return start ? start : strdup("");
}

bool
vmd_proc_runs(pid_t pid, const char *mark, bool whole_arg)
{
	char path[64];
	char *buf = NULL;
	char *rp;
	size_t len = 0;
	bool match = false;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (moat_read_file(path, 4096, &buf, &len) != 0)
		return false;
	/* The state follows the command name's closing parenthesis; the
	 * name itself may hold anything, ')' included. */
	rp = strrchr(buf, ')');
	if (rp == NULL || rp[1] == '\0' || rp[2] == 'Z') {
		free(buf);
		return false;
	}
	free(buf);
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	if (moat_read_file(path, 1 << 16, &buf, &len) != 0)
		return false;
	if (whole_arg) {
		for (size_t i = 0; i < len; i += strlen(buf + i) + 1)
			if (strcmp(buf + i, mark) == 0)
				match = true;
	} else {
		for (size_t i = 0; i < len; i++)
			if (buf[i] == '\0')
				buf[i] = ' ';
		match = strstr(buf, mark) != NULL;
	}
	free(buf);
	return match;
}

int
vmd_vmm_check_pid(pid_t pid, const char *mark, bool whole_arg, char **errmsg)
{
	if (pid > 1 && vmd_proc_runs(pid, mark, whole_arg))
		return MOAT_OK;
	*errmsg = pid > 1 && kill(pid, 0) == 0 ?
	    moat_asprintf("its VMM (pid %d) is not running any more: that "
	                  "pid is another process now",
	        (int)pid) :
	    moat_asprintf("its VMM (pid %d) is not running any more",
	        (int)pid);
	return MOAT_FAILED_PRECONDITION;
}

bool
vmd_kill_orphan(const char *pidfile, const char *mark, bool whole_arg)
{
	char *text = NULL;
	size_t len;
	bool killed = false;
	long pid;

	if (pidfile == NULL || moat_read_file(pidfile, 64, &text, &len) != 0)
		return false;
	pid = strtol(text, NULL, 10);
	free(text);
	if (pid > 1 && vmd_proc_runs((pid_t)pid, mark, whole_arg)) {
		(void)kill((pid_t)pid, SIGKILL);
		killed = true;
		/* Not our child: wait for whoever reaps it. */
		for (int i = 0; i < ORPHAN_WAIT_TRIES &&
		     vmd_proc_runs((pid_t)pid, mark, whole_arg);
		     i++)
			vmd_sleep_ms(10);
	}
	return killed;
}

int
vmd_unix_connect(const char *path, int *fd, char **errmsg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int s;
	int err;

	*fd = -1;
	*errmsg = NULL;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if ((s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
		err = errno;
		*errmsg = moat_asprintf("socket: %s", strerror(err));
		return moat_status_from_errno(err);
	}
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		err = errno;
		close(s);
		if (err == ENOENT || err == ECONNREFUSED || err == EAGAIN)
			return MOAT_UNAVAILABLE;
		*errmsg = moat_asprintf("cannot connect to %s: %s", path,
		    strerror(err));
		return moat_status_from_errno(err);
	}
	*fd = s;
	return MOAT_OK;
}

int
vmd_version_line(const char *binary, const char *what, const char *prefix,
    char *line, size_t n, char **errmsg)
{
	char *cmd;
	FILE *f;
	int status;

	*errmsg = NULL;
	line[0] = '\0';
	/* The path goes into a shell command inside single quotes. */
	if (strchr(binary, '\'') != NULL) {
		*errmsg = moat_asprintf("%s path %s has a quote in it: move "
		                        "it",
		    what, binary);
		return MOAT_INVALID_ARGUMENT;
	}
	cmd = moat_asprintf("'%s' --version 2>/dev/null", binary);
	if (cmd == NULL || (f = popen(cmd, "r")) == NULL) {
		free(cmd);
		*errmsg =
		    moat_asprintf("cannot run the %s version check", what);
		return MOAT_INTERNAL;
	}
	free(cmd);
	if (fgets(line, (int)n, f) == NULL)
		line[0] = '\0';
	while (fgetc(f) != EOF)
		;
	status = pclose(f);
	if (status != 0 || strncmp(line, prefix, strlen(prefix)) != 0)
		return MOAT_FAILED_PRECONDITION;
	line[strcspn(line, "\r\n")] = '\0';
	return MOAT_OK;
}

void
vmd_vmm_signal(const struct moat_vmm *vm, bool force)
{
	if (vm->pid > 0)
		(void)kill(vm->pid, force ? SIGKILL : SIGTERM);
}

double
vmd_now_ms_exact(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
