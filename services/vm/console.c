/*
 * console.c: the capped serial console (see console.h). One thread per
 * console polls the pipe's read end and a stop eventfd; it writes what it
 * reads into the current file, rotating to <file>.1 at half the cap. A
 * write that fails (disk full) drops those bytes and is counted: the VMM
 * is never made to wait on the host's disk. Not for: the tail
 * (vmhost.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat/util.h"
#include "console.h"
#include "sync.h"

#define CONSOLE_BUF (64u * 1024u)

struct vmd_console {
	pthread_t thread;
	int rfd;     /* the pipe's read end, non-blocking */
	int stop_fd; /* eventfd: close asked */
	int out_fd;  /* the current file, -1 when it could not be opened */
	char *path;
	char *path1; /* the older half */
	uint64_t half;
	uint64_t cur; /* bytes in the current file */
	char *buf;

	pthread_mutex_t mu; /* guards the fields below */
	bool busy;          /* between a read and its write */
	uint64_t written;
	uint64_t dropped;
};

static void
console_rotate(struct vmd_console *c)
{
	if (c->out_fd >= 0)
		close(c->out_fd);
	(void)rename(c->path, c->path1);
	c->out_fd =
	    open(c->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	c->cur = 0;
}

/* Writes n bytes, rotating at half the cap; counts what was lost. */
static void
console_put(struct vmd_console *c, const char *p, size_t n)
{
	uint64_t lost = 0;

	while (n > 0) {
		size_t k;
		bool ok = true;

		if (c->cur >= c->half)
			console_rotate(c);
		k = c->half - c->cur < n ? (size_t)(c->half - c->cur) : n;
		for (size_t done = 0; done < k;) {
			ssize_t w = c->out_fd >= 0 ?
			    write(c->out_fd, p + done, k - done) :
			    -1;

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				ok = false;
				lost += k - done;
				break;
			}
			done += (size_t)w;
			c->cur += (uint64_t)w;
		}
		/* A file that cannot take more (disk full) still rotates,
		 * so the next half gets a fresh try. */
		if (!ok)
			c->cur = c->half;
		p += k;
		n -= k;
	}
	pthread_mutex_lock(&c->mu);
	c->dropped += lost;
	pthread_mutex_unlock(&c->mu);
}

/* Reads once; returns the byte count, 0 at EOF, -1 when nothing is
 * there now (or on an error that ends the console: *end). */
static ssize_t
console_read_once(struct vmd_console *c, bool *end)
{
	ssize_t n;

	pthread_mutex_lock(&c->mu);
	c->busy = true;
	pthread_mutex_unlock(&c->mu);
	do {
		n = read(c->rfd, c->buf, CONSOLE_BUF);
	} while (n < 0 && errno == EINTR);
	if (n > 0)
		console_put(c, c->buf, (size_t)n);
	pthread_mutex_lock(&c->mu);
	if (n > 0)
		c->written += (uint64_t)n;
	c->busy = false;
	pthread_mutex_unlock(&c->mu);
	*end = n == 0 || (n < 0 && errno != EAGAIN);
	return n;
}

static void *
console_main(void *arg)
{
	struct vmd_console *c = arg;
	bool end = false;

	while (!end) {
		struct pollfd p[2] = {
			{ .fd = c->rfd, .events = POLLIN },
			{ .fd = c->stop_fd, .events = POLLIN },
		};

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[0].revents != 0)
			(void)console_read_once(c, &end);
		if (p[1].revents != 0) {
			/* Close: what is in the pipe now, then stop. */
			while (!end && console_read_once(c, &end) > 0)
				;
			break;
		}
	}
	return NULL;
}

static void
console_free(struct vmd_console *c)
{
	if (c == NULL)
		return;
	if (c->rfd >= 0)
		close(c->rfd);
	if (c->stop_fd >= 0)
		close(c->stop_fd);
	if (c->out_fd >= 0)
		close(c->out_fd);
	pthread_mutex_destroy(&c->mu);
	free(c->path);
	free(c->path1);
	free(c->buf);
	free(c);
}

/* A pipe whose write end is >= 3 (a child's 0-2 are its stdio). */
static int
console_pipe(int fds[2])
{
	if (pipe2(fds, O_CLOEXEC) != 0)
		return errno;
	if (fds[1] < 3) {
		int hi = fcntl(fds[1], F_DUPFD_CLOEXEC, 3);
		int err = errno;

		close(fds[1]);
		if (hi < 0) {
			close(fds[0]);
			return err;
		}
		fds[1] = hi;
	}
	if (fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0) {
		int err = errno;

		close(fds[0]);
		close(fds[1]);
		return err;
	}
	return 0;
}

/* A new console draining into `path` (truncated unless `append`); the
 * caller sets c->rfd and starts the thread (console_start). */
static int
console_new(const char *path, uint64_t max_bytes, bool append,
    struct vmd_console **out, char **errmsg)
{
	struct vmd_console *c = calloc(1, sizeof(*c));
	int err;

	*out = NULL;
	if (c == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if (max_bytes == 0)
		max_bytes = VMD_CONSOLE_DEFAULT_MAX;
	if (max_bytes < VMD_CONSOLE_MIN_MAX)
		max_bytes = VMD_CONSOLE_MIN_MAX;
	c->rfd = c->stop_fd = c->out_fd = -1;
	c->half = max_bytes / 2;
	pthread_mutex_init(&c->mu, NULL);
	c->path = strdup(path);
	c->path1 = moat_asprintf("%s.1", path);
	c->buf = malloc(CONSOLE_BUF);
	if (!c->path || !c->path1 || !c->buf) {
		console_free(c);
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if (!append)
		(void)unlink(c->path1);
	c->out_fd = open(path,
	    O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC),
	    0600);
	if (c->out_fd < 0) {
		err = errno;
		*errmsg = moat_asprintf("cannot set up the console %s: %s",
		    path, strerror(err));
		console_free(c);
		return moat_status_from_errno(err);
	}
	if (append) {
		struct stat st;

		if (fstat(c->out_fd, &st) == 0)
			c->cur = (uint64_t)st.st_size;
	}
	*out = c;
	return MOAT_OK;
}

/* Starts c's thread once c->rfd is set; frees c on failure. */
static int
console_start(struct vmd_console *c, char **errmsg)
{
	int err = 0;

	if ((c->stop_fd = eventfd(0, EFD_CLOEXEC)) < 0 ||
	    (err = vmd_thread_create(&c->thread, console_main, c)) != 0) {
		err = c->stop_fd < 0 ? errno : err;
		*errmsg = moat_asprintf("cannot start the console thread of "
		                        "%s: %s",
		    c->path, strerror(err));
		console_free(c);
		return moat_status_from_errno(err);
	}
	return MOAT_OK;
}

int
vmd_console_open(const char *path, uint64_t max_bytes,
    struct vmd_console **out, int *write_fd, char **errmsg)
{
	struct vmd_console *c = NULL;
	int fds[2] = { -1, -1 };
	int err, rv;

	*out = NULL;
	*write_fd = -1;
	*errmsg = NULL;
	if ((rv = console_new(path, max_bytes, false, &c, errmsg)) != MOAT_OK)
		return rv;
	if ((err = console_pipe(fds)) != 0) {
		*errmsg = moat_asprintf("cannot set up the console %s: %s",
		    path, strerror(err));
		console_free(c);
		return moat_status_from_errno(err);
	}
	c->rfd = fds[0];
	if ((rv = console_start(c, errmsg)) != MOAT_OK) {
		close(fds[1]);
		return rv;
	}
	*write_fd = fds[1];
	*out = c;
	return MOAT_OK;
}

/* Opens the read end of the named pipe `fifo` (non-blocking: no writer
 * needed). Returns the fd or -errno. */
static int
console_fifo_reader(const char *fifo)
{
	struct stat st;
	int fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	return fd;
}

int
vmd_console_open_fifo(const char *path, const char *fifo, uint64_t max_bytes,
    struct vmd_console **out, int *write_fd, char **errmsg)
{
	struct vmd_console *c = NULL;
	int wfd = -1;
	int err, rv;

	*out = NULL;
	*write_fd = -1;
	*errmsg = NULL;
	if ((rv = console_new(path, max_bytes, false, &c, errmsg)) != MOAT_OK)
		return rv;
	(void)unlink(fifo);
	err = mkfifo(fifo, 0600) != 0 ? errno : 0;
	if (err == 0 && (c->rfd = console_fifo_reader(fifo)) < 0)
		err = -c->rfd;
	/* A reader is there: the writer's open does not block. */
	if (err == 0 &&
	    (wfd = open(fifo, O_WRONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
		err = errno;
	if (err == 0 && wfd < 3) {
		int hi = fcntl(wfd, F_DUPFD_CLOEXEC, 3);

		err = hi < 0 ? errno : 0;
		close(wfd);
		wfd = hi;
	}
	if (err != 0) {
		*errmsg = moat_asprintf("cannot set up the console pipe %s: "
		                        "%s",
		    fifo, strerror(err));
		if (wfd >= 0)
			close(wfd);
		console_free(c);
		return moat_status_from_errno(err);
	}
	if ((rv = console_start(c, errmsg)) != MOAT_OK) {
		close(wfd);
		return rv;
	}
	*write_fd = wfd;
	*out = c;
	return MOAT_OK;
}

int
vmd_console_attach(const char *path, const char *fifo, uint64_t max_bytes,
    struct vmd_console **out, char **errmsg)
{
	struct vmd_console *c = NULL;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if ((rv = console_new(path, max_bytes, true, &c, errmsg)) != MOAT_OK)
		return rv;
	if ((c->rfd = console_fifo_reader(fifo)) < 0) {
		int err = -c->rfd;

		*errmsg = moat_asprintf("cannot open the console pipe %s "
		                        "again: %s",
		    fifo, strerror(err));
		c->rfd = -1;
		console_free(c);
		return moat_status_from_errno(err);
	}
	if ((rv = console_start(c, errmsg)) != MOAT_OK)
		return rv;
	*out = c;
	return MOAT_OK;
}

void
vmd_console_settle(struct vmd_console *c, uint32_t timeout_ms)
{
	for (uint32_t waited = 0; c != NULL; waited += 2) {
		int pending = 0;
		bool busy;

		pthread_mutex_lock(&c->mu);
		busy = c->busy;
		pthread_mutex_unlock(&c->mu);
		if (ioctl(c->rfd, FIONREAD, &pending) != 0)
			pending = 0;
		if ((pending == 0 && !busy) || waited >= timeout_ms)
			return;
		vmd_sleep_ms(2);
	}
}

void
vmd_console_bytes(struct vmd_console *c, uint64_t *written, uint64_t *dropped)
{
	*written = *dropped = 0;
	if (c == NULL)
		return;
	pthread_mutex_lock(&c->mu);
	*written = c->written;
	*dropped = c->dropped;
	pthread_mutex_unlock(&c->mu);
}

void
vmd_console_close(struct vmd_console *c)
{
	uint64_t one = 1;

	if (c == NULL)
		return;
	(void)!write(c->stop_fd, &one, sizeof(one));
	pthread_join(c->thread, NULL);
	console_free(c);
}
