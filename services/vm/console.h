/*
 * console.h: a VMM's serial console with a size cap (console.c). The VMM
 * writes into a pipe; a vmd thread drains it into a file, and when that
 * file reaches half the cap it becomes <file>.1 (replacing the older
 * half) and a new <file> starts: the two together never pass the cap and
 * the newest output is always there to read (vmd_log_tail reads <file>.1
 * too when <file> is short). A guest that writes without end costs the
 * host one bounded file, never more. Not for: the VMM's own log (its
 * stderr, a plain file).
 */
#ifndef MOAT_VMD_CONSOLE_H
#define MOAT_VMD_CONSOLE_H

#include <stdint.h>

/* The cap when a spec names none ([vmd] console-max-kib's default). */
#define VMD_CONSOLE_DEFAULT_MAX (1024u * 1024u)
/* The smallest cap taken (a smaller one is raised to it). */
#define VMD_CONSOLE_MIN_MAX (16u * 1024u)

struct vmd_console;

/* vmd_console_open: makes the pipe and starts draining it into `path`
 * (created, truncated, 0600) with `max_bytes` for path and path.1
 * together (0: VMD_CONSOLE_DEFAULT_MAX). Sets *write_fd (close-on-exec,
 * >= 3) for the VMM: the caller passes it to the child (spawn.h keep_fd
 * or output_fd) and closes its own copy once the child runs. Returns 0
 * or a status with *errmsg (heap). */
int vmd_console_open(const char *path, uint64_t max_bytes,
    struct vmd_console **out, int *write_fd, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_console_open_fifo: vmd_console_open through the named pipe
 * `fifo` (made, 0600) instead of an anonymous one, so that a vmd started
 * later can read what the same VMM writes (vmd_console_attach): while no
 * vmd reads, the VMM's console writes fail and the guest's output is
 * lost, never blocked. Same contract as vmd_console_open. */
int vmd_console_open_fifo(const char *path, const char *fifo,
    uint64_t max_bytes, struct vmd_console **out, int *write_fd, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_console_attach: drains the named pipe `fifo` of a VMM that an
 * earlier vmd started (vmd_console_open_fifo) into `path`, appended to.
 * Returns 0 with *out, or a status with *errmsg (heap). */
int vmd_console_attach(const char *path, const char *fifo, uint64_t max_bytes,
    struct vmd_console **out, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_console_settle: waits (at most `timeout_ms`) until what the VMM
 * wrote so far is in the file, e.g. before reading its tail after the
 * VMM died. Safe on NULL. */
void vmd_console_settle(struct vmd_console *c, uint32_t timeout_ms);

/* vmd_console_bytes: what the VMM wrote in all, and what was dropped
 * (the file could not be written). Safe on NULL (zeros). */
void vmd_console_bytes(struct vmd_console *c, uint64_t *written,
    uint64_t *dropped);

/* vmd_console_close: drains what can be read now, stops the thread and
 * frees c; the files stay. Safe on NULL. */
void vmd_console_close(struct vmd_console *c);

#endif
