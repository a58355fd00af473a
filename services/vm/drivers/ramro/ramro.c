/*
 * ramro.c: a tiny LD_PRELOAD library for a QEMU whose guest RAM is a
 * private mapping of a snapshot's RAM file ([vmd] ram-sharing = private,
 * drivers/qemu.c). QEMU 7.2's memory-backend-file opens its mem-path
 * O_RDWR even with share=off, but the jail binds that file read-only and
 * it is not the VMM's to write (every clone maps it). This library turns
 * the open of exactly the path in MOAT_RAM_RO into an O_RDONLY open;
 * mmap(MAP_PRIVATE, PROT_WRITE) of a read-only descriptor is allowed, so
 * the guest's writes go to its own copy-on-write pages and the file never
 * changes. Every other open passes through untouched. Not for: anything
 * but that one open.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

/* The flags for `path`: O_RDONLY instead of O_RDWR for the RAM file. */
static int
ramro_flags(const char *path, int flags)
{
	const char *ro = getenv("MOAT_RAM_RO");

	if (ro != NULL && path != NULL && strcmp(path, ro) == 0 &&
	    (flags & O_ACCMODE) == O_RDWR && !(flags & O_CREAT))
		return (flags & ~O_ACCMODE) | O_RDONLY;
	return flags;
}

static mode_t
ramro_mode(int flags, va_list ap)
{
	/* O_TMPFILE holds O_DIRECTORY's bit: only all of it takes a mode. */
	return ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) ?
	    (mode_t)va_arg(ap, int) :
	    0;
}

#define RAMRO_OPEN(name)                                                      \
	int name(const char *path, int flags, ...)                            \
	{                                                                     \
		static open_fn next;                                          \
		va_list ap;                                                   \
		mode_t mode;                                                  \
                                                                              \
		va_start(ap, flags);                                          \
		mode = ramro_mode(flags, ap);                                 \
		va_end(ap);                                                   \
		if (next == NULL)                                             \
			next = (open_fn)dlsym(RTLD_NEXT, #name);              \
		return next(path, ramro_flags(path, flags), mode);            \
	}

#define RAMRO_OPENAT(name)                                                    \
	int name(int dirfd, const char *path, int flags, ...)                 \
	{                                                                     \
		static openat_fn next;                                        \
		va_list ap;                                                   \
		mode_t mode;                                                  \
                                                                              \
		va_start(ap, flags);                                          \
		mode = ramro_mode(flags, ap);                                 \
		va_end(ap);                                                   \
		if (next == NULL)                                             \
			next = (openat_fn)dlsym(RTLD_NEXT, #name);            \
		return next(dirfd, path, ramro_flags(path, flags), mode);     \
	}

RAMRO_OPEN(open)
RAMRO_OPEN(open64)
RAMRO_OPENAT(openat)
RAMRO_OPENAT(openat64)

/* _FORTIFY_SOURCE turns open(path, flags) with non-constant flags into
 * these. */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);

int
__open_2(const char *path, int flags)
{
	return open(path, flags);
}

int
__open64_2(const char *path, int flags)
{
	return open64(path, flags);
}
