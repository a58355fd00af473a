/*
 * util.h: small helpers every moat program needs and none owns: heap
 * printf, checked string copies, directory creation, reading a whole
 * small file. Not for: anything with a domain meaning (that lives with its
 * service).
 */
#ifndef MOAT_UTIL_H
#define MOAT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* moat_asprintf: heap string (caller frees), or NULL on allocation failure. */
char *moat_asprintf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* moat_mkdir_p: creates `path` and its parents with `mode`; an existing
 * directory is fine. Returns 0 or an errno value. */
int moat_mkdir_p(const char *path, mode_t mode);

/* moat_rm_rf: removes a file or a directory tree; a missing path is fine.
 * Returns 0 or an errno value (the first error met; it keeps going). */
int moat_rm_rf(const char *path);

/* moat_read_file: reads at most `max` bytes of `path` into a heap buffer
 * with a NUL after the data (caller frees), *len set. Returns 0 or errno
 * (EFBIG when the file is larger than max). */
int moat_read_file(const char *path, size_t max, char **out, size_t *len);

/* moat_write_file_atomic: writes to path.tmp, fsyncs, renames over path.
 * Returns 0 or errno. */
int moat_write_file_atomic(const char *path, const void *data, size_t len,
    mode_t mode);

/* moat_now_unix_ms: wall clock in ms. */
uint64_t moat_now_unix_ms(void);

/* moat_service_malloc_init: for a long-running service, at the start of
 * main: buffers of 128 KiB and more are always their own mappings and go
 * back to the kernel when freed. glibc otherwise raises that threshold
 * to the largest buffer freed so far, and then keeps the megabyte-sized
 * RPC replies of many threads in their arenas: moat-vmd grew from 10 to
 * 240 MiB and moat-snapd to 600 MiB in a 10-minute soak without a leak. */
void moat_service_malloc_init(void);

#endif
