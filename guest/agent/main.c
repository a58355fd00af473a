/*
 * main.c: moat-agent's entry point. As PID 1 of a moat guest it boots the
 * guest (boot.c), serves the guest link on the virtio-serial port or an
 * AF_VSOCK port that boot found, reaps every process, and never exits: a
 * shutdown request, or a failure it cannot serve past, powers the VM off.
 * Anywhere else it is host mode, for tests:
 *   moat-agent --listen unix:PATH [--root DIR] [--trace-lower DIR
 *       --trace-upper DIR] [--test-mode MODE] [--no-openat2]
 * which serves one connection at a time on a Unix socket, confines every
 * request path to DIR, and is a child subreaper, so orphans of its execs
 * are reaped as PID 1 would. Not for: the protocol (loop.c and the
 * handlers) or the boot steps (boot.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/close_range.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "boot.h"
#include "moat/log.h"

#define MAIN_RETRY_MS 1000

struct main_opts {
	const char *listen;
	const char *root;
	const char *trace_lower;
	const char *trace_upper;
	const char *test_mode;
	bool no_openat2;
};

static void
main_usage(FILE *out)
{
	fprintf(out,
	    "usage: moat-agent --listen unix:PATH [--root DIR]\n"
	    "           [--trace-lower DIR --trace-upper DIR]\n"
	    "           [--test-mode garbage|oversize|flood] [--no-openat2]\n"
	    "As PID 1 of a moat guest it takes no options: the kernel\n"
	    "command line (moat.port=, moat.vsock=, moat.test=) says what\n"
	    "to serve.\n");
}

static int
main_parse(int argc, char **argv, struct main_opts *o)
{
	static const struct option longopts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "root", required_argument, NULL, 'r' },
		{ "trace-lower", required_argument, NULL, 'L' },
		{ "trace-upper", required_argument, NULL, 'U' },
		{ "test-mode", required_argument, NULL, 't' },
		{ "no-openat2", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'l':
			o->listen = optarg;
			break;
		case 'r':
			o->root = optarg;
			break;
		case 'L':
			o->trace_lower = optarg;
			break;
		case 'U':
			o->trace_upper = optarg;
			break;
		case 't':
			o->test_mode = optarg;
			break;
		case 'n':
			o->no_openat2 = true;
			break;
		case 'h':
			main_usage(stdout);
			exit(0);
		default:
			main_usage(stderr);
			return -1;
		}
	}
	if (optind != argc || o->listen == NULL ||
	    strncmp(o->listen, "unix:", 5) != 0 || o->listen[5] == '\0') {
		fprintf(stderr,
		    "moat-agent: give --listen unix:PATH (host "
		    "mode serves a Unix socket)\n");
		return -1;
	}
	if ((o->trace_lower != NULL) != (o->trace_upper != NULL)) {
		fprintf(stderr,
		    "moat-agent: --trace-lower and --trace-upper "
		    "go together\n");
		return -1;
	}
	if (o->test_mode != NULL && !agent_test_mode_valid(o->test_mode)) {
		fprintf(stderr,
		    "moat-agent: unknown --test-mode %s (known: "
		    "garbage, oversize, flood)\n",
		    o->test_mode);
		return -1;
	}
	return 0;
}

/* main_std_fds: makes sure fds 0-2 are open, so no pipe or socket the
 * agent opens later lands on one (exec children dup2 onto them). */
static void
main_std_fds(void)
{
	int fd;

	for (fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0 &&
		    open("/dev/null", O_RDWR | O_NOCTTY) < 0)
			return;
}

static uint64_t
main_uptime_ms(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int
main_signals(struct agent *a)
{
	sigset_t set;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	if (!a->pid1) {
		sigaddset(&set, SIGTERM);
		sigaddset(&set, SIGINT);
		sigaddset(&set, SIGHUP);
	}
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
		return errno;
	a->sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	return a->sig_fd < 0 ? errno : 0;
}

static int
main_open_dir(const char *what, const char *path, int *fd)
{
	*fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (*fd < 0) {
		int rv = errno;

		moat_error(0, "%s %s: %s", what, path, strerror(rv));
		return rv;
	}
	return 0;
}

/* main_setup: the agent's state from the boot result or the options.
 * Returns 0 or an errno value (logged). */
static int
main_setup(struct agent *a, const struct agent_boot *b,
    const struct main_opts *o)
{
	struct utsname u;
	int rv;

	a->sig_fd = a->root_fd = a->lower_fd = a->upper_fd = -1;
	a->link.fd = a->link.listen_fd = -1;
	if (uname(&u) == 0)
		snprintf(a->kernel, sizeof(a->kernel), "%s", u.release);
	if (a->pid1) {
		a->lower_fd = b->lower_fd;
		a->upper_fd = b->upper_fd;
		a->boot_ms = b->boot_ms;
		if (!agent_test_mode_valid(b->test_mode))
			moat_warn(0,
			    "moat.test=%s is not a test mode "
			    "(known: garbage, oversize, flood); ignored",
			    b->test_mode);
		else
			snprintf(a->test_mode, sizeof(a->test_mode), "%s",
			    b->test_mode);
		if (b->vsock_port != 0) {
			a->link.kind = AGENT_LINK_VSOCK;
			a->link.vsock_port = b->vsock_port;
		} else {
			a->link.kind = AGENT_LINK_PORT;
			snprintf(a->link.path, sizeof(a->link.path), "%s",
			    b->port_path);
		}
		if ((rv = main_open_dir("root", "/", &a->root_fd)) != 0)
			return rv;
	} else {
		a->boot_ms = main_uptime_ms();
		a->no_openat2 = o->no_openat2;
		a->link.kind = AGENT_LINK_UNIX;
		snprintf(a->link.path, sizeof(a->link.path), "%s",
		    o->listen + 5);
		snprintf(a->test_mode, sizeof(a->test_mode), "%s",
		    o->test_mode ? o->test_mode : "");
		a->confined = o->root != NULL;
		if ((rv = main_open_dir("--root", o->root ? o->root : "/",
		         &a->root_fd)) != 0)
			return rv;
		if (o->trace_upper != NULL &&
		    ((rv = main_open_dir("--trace-lower", o->trace_lower,
		          &a->lower_fd)) != 0 ||
		        (rv = main_open_dir("--trace-upper", o->trace_upper,
		             &a->upper_fd)) != 0))
			return rv;
		/* orphans of execs come to us, as they would to PID 1 */
		(void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	}
	if ((rv = main_signals(a)) != 0) {
		moat_error(0, "signals: %s", strerror(rv));
		return rv;
	}
	if (a->test_mode[0] != '\0')
		moat_warn(0,
		    "test mode %s is on: this agent misbehaves on "
		    "purpose",
		    a->test_mode);
	return agent_link_listen(a);
}

/* main_pid1: serves until a shutdown; never returns. */
static void __attribute__((noreturn)) main_pid1(void)
{
	static struct agent a; /* large; not on PID 1's stack */
	struct agent_boot b;
	int rv;

	if ((rv = agent_boot_init(&b)) != 0)
		agent_boot_poweroff();
	main_std_fds();
	moat_log_init("agent", MOAT_LOG_INFO);
	a.pid1 = true;
	if ((rv = main_setup(&a, &b, NULL)) != 0) {
		moat_error(0, "cannot serve the guest link (%s); powering off",
		    strerror(rv));
		agent_boot_poweroff();
	}
	while (!a.stopping) {
		if ((rv = agent_run(&a)) != 0) {
			struct timespec ts = { MAIN_RETRY_MS / 1000, 0 };

			moat_error(0, "loop failed: %s; going on",
			    strerror(rv));
			nanosleep(&ts, NULL);
		}
	}
	agent_link_flush(&a, a.stop_by_ms);
	agent_exec_kill_all(&a);
	agent_code_kill_all(&a);
	if (a.stop_reboot) {
		sync();
		reboot(RB_AUTOBOOT);
	}
	agent_boot_poweroff();
}

int
main(int argc, char **argv)
{
	static struct agent a;
	struct main_opts o;
	int rv;

	if (getpid() == 1)
		main_pid1();
	main_std_fds();
	/* fds the caller leaked to us must not reach exec children */
	(void)close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
	moat_log_init("agent", MOAT_LOG_INFO);
	if (main_parse(argc, argv, &o) != 0)
		return 2;
	if ((rv = main_setup(&a, NULL, &o)) != 0)
		return 1;
	moat_info(0, "moat-agent %s listening on unix:%s%s%s", MOAT_VERSION,
	    a.link.path, a.confined ? ", root " : "",
	    a.confined ? o.root : "");
	rv = agent_run(&a);
	agent_link_flush(&a, agent_now_ms() + 500);
	agent_exec_kill_all(&a);
	agent_code_kill_all(&a);
	agent_link_close(&a, "agent exiting");
	(void)unlink(a.link.path);
	return rv == 0 ? 0 : 1;
}
