/*
 * spawn.c: the spawner thread (see spawn.h for why it exists). Requests
 * are handed over one at a time through a mutex and a condition; the
 * thread forks, the child sets its death signal (unless it must outlive
 * vmd) and execs, and a
 * close-on-exec pipe tells the requester whether exec worked. Not for:
 * supervising children after they started.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include "moat/status.h"
#include "moat/util.h"
#include "spawn.h"

#if defined(__x86_64__)
#define SPAWN_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SPAWN_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "spawn.c: name this architecture's AUDIT_ARCH_* for the seccomp filter"
#endif

/* What the child reports through the pipe when a step fails. */
struct spawn_report {
	int err;
	int step; /* enum spawn_step */
};

enum spawn_step {
	STEP_SETUP,
	STEP_CGROUP,
	STEP_MOUNT,
	STEP_PIVOT,
	STEP_RLIMIT,
	STEP_IDS,
	STEP_EXEC,
};

static const char *const step_what[] = {
	[STEP_SETUP] = "set up the child",
	[STEP_CGROUP] = "join its cgroup",
	[STEP_MOUNT] = "build its jail's root",
	[STEP_PIVOT] = "enter its jail's root",
	[STEP_RLIMIT] = "set its rlimits",
	[STEP_IDS] = "drop to its jail uid",
	[STEP_EXEC] = "exec",
};

/* One request in flight. Lives on the requester's stack. */
struct spawn_job {
	const struct moat_spawn_req *req;
	pid_t pid;
	int err;              /* errno from open/fork/exec, 0: ok */
	const char *err_what; /* which step failed */
	bool done;
};

/* spawner_mu guards every field of the spawner below. */
static pthread_mutex_t spawner_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t spawner_cv = PTHREAD_COND_INITIALIZER;
static struct spawn_job *spawner_job; /* waiting for the thread */
static bool spawner_running;
static bool spawner_stopping;
static pthread_t spawner_thread;

/* deny_hugepage_advice: a seccomp filter under which madvise(addr, len,
 * MADV_HUGEPAGE) fails with EINVAL; every other call is allowed. QEMU
 * advises huge pages on all guest RAM, and on a file mapping the kernel
 * then reads around each fault a whole 2 MiB (even with readahead off)
 * and dirties memory 2 MiB at a time: a clone whose RAM file is a reflink
 * on a block-backed filesystem (ram-dir on XFS) would read nearly all its
 * RAM through the block layer as soon as the guest runs. QEMU takes the
 * advice as optional. Returns 0 or an errno value. */
static int
deny_hugepage_advice(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
		    offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SPAWN_AUDIT_ARCH, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
		    offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
		    offsetof(struct seccomp_data, args[2])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_HUGEPAGE, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {
		.len = (unsigned short)(sizeof(f) / sizeof(f[0])),
		.filter = f,
	};

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
		return errno;
	return 0;
}

/* Closes every fd from 3 up but `a` and `b` (-1: none). Child only. */
static void
close_all_but(int a, int b)
{
	int lo = a < b || b < 0 ? a : b;
	int hi = a < b || b < 0 ? b : a;
	unsigned from = 3;

	if (lo >= 0) {
		if ((unsigned)lo > from)
			syscall(SYS_close_range, from, (unsigned)lo - 1, 0U);
		from = (unsigned)lo + 1;
	}
	if (hi >= 0 && hi != lo) {
		if ((unsigned)hi > from)
			syscall(SYS_close_range, from, (unsigned)hi - 1, 0U);
		from = (unsigned)hi + 1;
	}
	syscall(SYS_close_range, from, ~0U, 0U);
}

/* The jail's steps, in the child: only raw system calls (after a raw
 * clone glibc still believes the parent's threads exist, so its setuid
 * would signal them: the ids are set with syscall()). Returns 0 or an
 * errno with *step. */
static int
jail_mount_ops(const struct moat_jail *j)
{
	for (size_t i = 0; i < j->n_ops; i++) {
		const struct moat_jail_op *op = &j->ops[i];
		unsigned long ro =
		    MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV;
		int fd;

		switch (op->kind) {
		case MOAT_JAIL_MKDIR:
			if (mkdir(op->dst, 0755) != 0 && errno != EEXIST)
				return errno;
			break;
		case MOAT_JAIL_MKFILE:
			fd = open(op->dst, O_WRONLY | O_CREAT | O_CLOEXEC,
			    0644);
			if (fd < 0)
				return errno;
			close(fd);
			break;
		case MOAT_JAIL_SYMLINK:
			if (symlink(op->src, op->dst) != 0)
				return errno;
			break;
		case MOAT_JAIL_BIND_RO:
			if (mount(op->src, op->dst, NULL, MS_BIND | MS_REC,
			        NULL) != 0 ||
			    mount(NULL, op->dst, NULL, ro, NULL) != 0)
				return errno;
			break;
		case MOAT_JAIL_BIND_RW:
			if (mount(op->src, op->dst, NULL, MS_BIND, NULL) !=
			        0 ||
			    mount(NULL, op->dst, NULL,
			        MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV,
			        NULL) != 0)
				return errno;
			break;
		case MOAT_JAIL_BIND_DEV:
			if (mount(op->src, op->dst, NULL, MS_BIND, NULL) !=
			        0 ||
			    mount(NULL, op->dst, NULL,
			        MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC,
			        NULL) != 0)
				return errno;
			break;
		case MOAT_JAIL_PROC:
			if (mount("proc", op->dst, "proc",
			        MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
				return errno;
			break;
		}
	}
	return 0;
}

/* Makes the new root in a tmpfs at j->staging and pivots into it. */
static int
jail_root(const struct moat_jail *j, int *step)
{
	int err;

	*step = STEP_MOUNT;
	/* Nothing done here may reach the host's mount table. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
	    mount("moat-jail", j->staging, "tmpfs", MS_NOSUID | MS_NODEV,
	        "mode=0755,size=1m") != 0)
		return errno;
	if ((err = jail_mount_ops(j)) != 0)
		return err;
	if (mount(NULL, j->staging, NULL,
	        MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
	        NULL) != 0)
		return errno;
	*step = STEP_PIVOT;
	/* pivot_root(".", "."): the old root lands on top of the new one
	 * and is detached at once. */
	if (chdir(j->staging) != 0 || syscall(SYS_pivot_root, ".", ".") != 0 ||
	    umount2(".", MNT_DETACH) != 0 || chdir("/") != 0)
		return errno;
	return 0;
}

static int
jail_enter(const struct moat_jail *j, bool outlive_vmd, int *step)
{
	struct rlimit rl;
	int err;

	*step = STEP_CGROUP;
	for (size_t i = 0; i < j->n_cgroups; i++) {
		/* "0": the writer itself (its pid here may be 1 of a new
		 * pid namespace). */
		int fd = open(j->cgroup_procs[i], O_WRONLY | O_CLOEXEC);

		if (fd < 0)
			return errno;
		if (write(fd, "0", 1) != 1) {
			err = errno;
			close(fd);
			return err;
		}
		close(fd);
	}
	*step = STEP_SETUP;
	if ((j->clone_flags & CLONE_NEWUTS) && j->hostname != NULL &&
	    sethostname(j->hostname, strlen(j->hostname)) != 0)
		return errno;
	if (j->staging != NULL && (err = jail_root(j, step)) != 0)
		return err;
	*step = STEP_RLIMIT;
	rl.rlim_cur = rl.rlim_max = 0;
	if (setrlimit(RLIMIT_CORE, &rl) != 0)
		return errno;
	rl.rlim_cur = rl.rlim_max = j->nofile;
	if (j->nofile != 0 && setrlimit(RLIMIT_NOFILE, &rl) != 0)
		return errno;
	rl.rlim_cur = rl.rlim_max = j->fsize;
	if (j->fsize != 0 && setrlimit(RLIMIT_FSIZE, &rl) != 0)
		return errno;
	*step = STEP_IDS;
	/* No capability can come back, even through a setuid file. */
	for (int cap = 0; j->uid != 0 && cap < 64; cap++)
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 &&
		    errno != EINVAL)
			return errno;
	if (j->uid != 0 &&
	    (syscall(SYS_setgroups, 0, NULL) != 0 ||
	        syscall(SYS_setresgid, j->gid, j->gid, j->gid) != 0 ||
	        syscall(SYS_setresuid, j->uid, j->uid, j->uid) != 0))
		return errno;
	/* A uid change clears the death signal: set it again. (Should vmd
	 * die in between, the next vmd's orphan cleanup kills this VMM by
	 * its pidfile.) */
	if (!outlive_vmd && j->uid != 0 &&
	    prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
		return errno;
	umask(077);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return errno;
	return 0;
}

/* Runs in the child between fork and exec: only async-signal-safe calls.
 * Reports a failure's errno through `report_fd` and exits. */
static void __attribute__((noreturn))
spawn_child(const struct moat_spawn_req *req, int out_fd, int report_fd,
    pid_t parent)
{
	const struct moat_jail *jail = req->jail;
	/* In a new pid namespace the parent is outside it: getppid() is 0. */
	pid_t want_parent =
	    jail && (jail->clone_flags & CLONE_NEWPID) ? 0 : parent;
	struct spawn_report rep = { 0, STEP_SETUP };
	sigset_t none;
	int devnull;

	/* The child of a dying vmd must not be left behind (unless it is a
	 * VMM that a restarted vmd re-adopts); and if vmd died before the
	 * prctl took effect, go now. */
	if (!req->outlive_vmd &&
	    (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 ||
	        getppid() != want_parent))
		_exit(127);
	setsid();
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGHUP, SIG_DFL);

	devnull = open("/dev/null", O_RDWR);
	if (devnull < 0)
		goto fail;
	if (dup2(devnull, 0) < 0)
		goto fail;
	if (out_fd < 0)
		out_fd = devnull;
	if (dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0)
		goto fail;
	if (report_fd <= 2) {
		/* Never happens with 0-2 open, but keep the pipe safe. */
		goto fail;
	}
	/* Close everything else except the report pipe (close-on-exec)
	 * and the fd the request keeps: a VMM must not hold vmd's sockets
	 * or other sandboxes' files. */
	close_all_but(report_fd, req->keep_fd > 2 ? req->keep_fd : -1);
	if (req->keep_fd > 2 && fcntl(req->keep_fd, F_SETFD, 0) != 0)
		goto fail;
	if (jail != NULL &&
	    (rep.err = jail_enter(jail, req->outlive_vmd, &rep.step)) != 0)
		goto report;
	rep.step = STEP_SETUP;
	if (req->cwd != NULL && chdir(req->cwd) != 0)
		goto fail;
	if (req->no_hugepage_advice && deny_hugepage_advice() != 0)
		goto fail;
	rep.step = STEP_EXEC;
	if (req->env != NULL)
		execvpe(req->argv[0], (char *const *)req->argv,
		    (char *const *)req->env);
	else
		execvp(req->argv[0], (char *const *)req->argv);
fail:
	rep.err = errno;
report:
	(void)!write(report_fd, &rep, sizeof(rep));
	_exit(127);
}

static void
spawn_run(struct spawn_job *job)
{
	const struct moat_spawn_req *req = job->req;
	int out_fd = -1;
	int pipefd[2] = { -1, -1 };
	pid_t parent;
	pid_t pid;
	ssize_t n;
	struct spawn_report rep = { 0, 0 };
	int flags = req->jail ? req->jail->clone_flags : 0;

	if (req->output_fd > 2) {
		out_fd = req->output_fd; /* the caller's: not closed here */
	} else if (req->output_file != NULL) {
		out_fd = open(req->output_file,
		    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (out_fd < 0) {
			job->err = errno;
			job->err_what = "open its log file";
			return;
		}
	}
	if (pipe2(pipefd, O_CLOEXEC) != 0) {
		job->err = errno;
		job->err_what = "make a pipe";
		goto out;
	}
	parent = getpid();
	/* New namespaces need clone; like fork otherwise (the child runs
	 * on a copy of this stack). */
	pid = flags ?
	    (pid_t)syscall(SYS_clone, (unsigned long)(SIGCHLD | flags), NULL,
	        NULL, NULL, NULL) :
	    fork();
	if (pid < 0) {
		job->err = errno;
		job->err_what = "fork";
		goto out;
	}
	if (pid == 0) {
		close(pipefd[0]);
		spawn_child(req, out_fd, pipefd[1], parent);
	}
	close(pipefd[1]);
	pipefd[1] = -1;
	do {
		n = read(pipefd[0], &rep, sizeof(rep));
	} while (n < 0 && errno == EINTR);
	if (n == (ssize_t)sizeof(rep)) {
		/* exec failed: the child is gone or going; reap it here. */
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		job->err = rep.err ? rep.err : EIO;
		job->err_what = rep.step >= 0 && rep.step <= STEP_EXEC ?
		    step_what[rep.step] :
		    "exec";
		goto out;
	}
	job->pid = pid;
out:
	if (pipefd[0] >= 0)
		close(pipefd[0]);
	if (pipefd[1] >= 0)
		close(pipefd[1]);
	if (out_fd >= 0 && out_fd != req->output_fd)
		close(out_fd);
}

static void *
spawner_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&spawner_mu);
	for (;;) {
		struct spawn_job *job;

		while (spawner_job == NULL && !spawner_stopping)
			pthread_cond_wait(&spawner_cv, &spawner_mu);
		if (spawner_job == NULL)
			break;
		job = spawner_job;
		/* Forking under the lock is fine: the child touches no
		 * locks, and requesters only wait. */
		spawn_run(job);
		job->done = true;
		spawner_job = NULL;
		pthread_cond_broadcast(&spawner_cv);
	}
	pthread_mutex_unlock(&spawner_mu);
	return NULL;
}

int
moat_spawner_start(void)
{
	pthread_attr_t attr;
	int rv;

	pthread_mutex_lock(&spawner_mu);
	if (spawner_running) {
		pthread_mutex_unlock(&spawner_mu);
		return 0;
	}
	spawner_stopping = false;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 128 * 1024);
	rv = pthread_create(&spawner_thread, &attr, spawner_main, NULL);
	pthread_attr_destroy(&attr);
	if (rv == 0)
		spawner_running = true;
	pthread_mutex_unlock(&spawner_mu);
	return rv;
}

void
moat_spawner_stop(void)
{
	pthread_mutex_lock(&spawner_mu);
	if (!spawner_running) {
		pthread_mutex_unlock(&spawner_mu);
		return;
	}
	spawner_stopping = true;
	pthread_cond_broadcast(&spawner_cv);
	pthread_mutex_unlock(&spawner_mu);
	pthread_join(spawner_thread, NULL);
	pthread_mutex_lock(&spawner_mu);
	spawner_running = false;
	pthread_mutex_unlock(&spawner_mu);
}

int
moat_spawn(const struct moat_spawn_req *req, pid_t *pid, char **errmsg)
{
	struct spawn_job job = { .req = req };

	*pid = 0;
	*errmsg = NULL;
	pthread_mutex_lock(&spawner_mu);
	if (!spawner_running || spawner_stopping) {
		pthread_mutex_unlock(&spawner_mu);
		*errmsg = moat_asprintf("cannot start %s: vmd is shutting "
		                        "down",
		    req->argv[0]);
		return MOAT_UNAVAILABLE;
	}
	while (spawner_job != NULL)
		pthread_cond_wait(&spawner_cv, &spawner_mu);
	spawner_job = &job;
	pthread_cond_broadcast(&spawner_cv);
	while (!job.done)
		pthread_cond_wait(&spawner_cv, &spawner_mu);
	pthread_mutex_unlock(&spawner_mu);

	if (job.err != 0) {
		*errmsg = moat_asprintf("cannot start %s (%s): %s",
		    req->argv[0], job.err_what, strerror(job.err));
		return job.err == ENOENT ? MOAT_FAILED_PRECONDITION :
		                           moat_status_from_errno(job.err);
	}
	*pid = job.pid;
	return MOAT_OK;
}

int
moat_spawn_wait(const struct moat_spawn_req *req, int *exit_status,
    char **errmsg)
{
	pid_t pid;
	int rv;

	if ((rv = moat_spawn(req, &pid, errmsg)) != MOAT_OK)
		return rv;
	while (waitpid(pid, exit_status, 0) < 0) {
		if (errno != EINTR) {
			*errmsg = moat_asprintf("waiting for %s: %s",
			    req->argv[0], strerror(errno));
			return MOAT_INTERNAL;
		}
	}
	return MOAT_OK;
}
