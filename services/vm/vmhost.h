/*
 * vmhost.h: what the VMM drivers share about the process they run on this
 * host (vmhost.c): the tail of its log files, whether a pid is still that
 * VMM (/proc), killing one that a vmd which died left behind, the Unix
 * socket under the agent link, the binary's version line, its stop
 * signal, and a sub-millisecond clock for pause timings. Built into
 * moat_vmhost with spawn.c, extents.c, sync.c and ramdir.c, the host
 * library that the drivers and vmd's core both link. Not for: anything
 * that knows of sandboxes or of vmd's model (vmd.h), or one driver's own
 * protocol (QMP, Firecracker's API).
 */
#ifndef MOAT_VMD_VMHOST_H
#define MOAT_VMD_VMHOST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "vmm.h"

/* vmd_log_tail: the last `lines` lines of the log file `path` (a guest
 * console, a VMM's own log) as a heap string the caller frees: only the
 * file's last 16 KiB are read (with the end of <path>.1 before them
 * when the file is shorter: a capped console that rotated, console.h),
 * CR and NUL become spaces, other bytes
 * outside printable ASCII become '?', trailing blank lines are dropped.
 * "" when the file is missing or empty; NULL only when out of memory. */
char *vmd_log_tail(const char *path, int lines);

/* vmd_proc_runs: true when `pid` is a live (not zombie) process whose
 * command line holds `mark`: as one whole argument when `whole_arg`
 * (Firecracker's --id), else anywhere in the arguments joined by spaces
 * (a sandbox directory inside QEMU's options). So a pid from a pidfile is
 * known to be that sandbox's VMM, not a recycled pid. */
bool vmd_proc_runs(pid_t pid, const char *mark, bool whole_arg);

/* vmd_vmm_check_pid: for a driver's adopt: 0 when `pid` still runs that
 * sandbox's VMM (vmd_proc_runs with `mark`), else MOAT_FAILED_PRECONDITION
 * with *errmsg (heap) saying the VMM is gone, or that its pid is another
 * process now. */
int vmd_vmm_check_pid(pid_t pid, const char *mark, bool whole_arg,
    char **errmsg) __attribute__((warn_unused_result));

/* vmd_kill_orphan: the VMM whose pid `pidfile` holds, left running by a
 * vmd that died: when vmd_proc_runs(pid, mark, whole_arg), kills it
 * (SIGKILL) and waits up to 5 s for it to go (it is not our child: its
 * new parent reaps it). Returns true when a live process was killed;
 * false when the pidfile is missing or names another process. */
bool vmd_kill_orphan(const char *pidfile, const char *mark, bool whole_arg);

/* vmd_unix_connect: one attempt to connect a stream socket to `path`.
 * Returns 0 with *fd (caller closes; blocking, CLOEXEC); MOAT_UNAVAILABLE
 * while nothing listens there yet (missing, refused, backlog full: the
 * caller retries), with no message; or another status with *errmsg
 * (heap, caller frees). */
int vmd_unix_connect(const char *path, int *fd, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_version_line: runs `'<binary>' --version` (stderr dropped) and puts
 * its first line, without the newline, in line[0..n). Returns 0 when the
 * program exited 0 and the line starts with `prefix`; MOAT_FAILED_
 * PRECONDITION when it did not run or printed something else (no
 * message: the driver says what to install); INVALID_ARGUMENT (a quote
 * in the path) or INTERNAL with *errmsg (heap, caller frees) naming the
 * program as `what`. */
int vmd_version_line(const char *binary, const char *what, const char *prefix,
    char *line, size_t n, char **errmsg) __attribute__((warn_unused_result));

/* vmd_vmm_signal: vmm.h's stop for a VMM that is vmd's own child and ends
 * on SIGTERM: sends it SIGTERM, or SIGKILL with `force`. Only signals. */
void vmd_vmm_signal(const struct moat_vmm *vm, bool force);

/* vmd_now_ms_exact: CLOCK_MONOTONIC in milliseconds with the fraction,
 * for the timings of a snapshot's pause. */
double vmd_now_ms_exact(void);

#endif
