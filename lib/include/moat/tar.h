/*
 * tar.h: directories as tar archives (issue 17, `moat cp -r`): a
 * streaming ustar reader and writer (pax extended headers for long names
 * and links and for sizes of 8 GiB and more; GNU 'L'/'K' long names are
 * read too, since GNU tar and Python's tarfile write them), the checker
 * every archive passes before anything is unpacked, the unpacker (all
 * writes relative to one directory fd, never through a symlink), and the
 * packer. Shared by the guest agent and the CLI, so both sides apply the
 * same rules to what the other sends. Not for: compression, ownership
 * (files belong to whoever unpacks), or moving the archive (the RPCs).
 *
 * The rules, checked on the whole archive before a byte is written:
 * names are relative ("./" and "//" are cleaned away) with no ".."
 * component; no device nodes, fifos, hard links (refused outright: a
 * link to an earlier member is easy to pack as a second copy), sparse or
 * other GNU special members; no member at or under a path an earlier
 * member made a symlink (so nothing is written through a link); header
 * checksums right, the archive not cut short, file contents totalling
 * at most the cap. Symlinks are kept as links, their targets untouched.
 */
#ifndef MOAT_TAR_H
#define MOAT_TAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MOAT_TAR_BLOCK 512
#define MOAT_TAR_META_MAX (1u << 20) /* one pax or GNU long-name record */
#define MOAT_TAR_DEPTH_MAX 256       /* directory nesting packed */
#define MOAT_TAR_READ_BUF (256u << 10)

/* What an archive holds, or what was packed or unpacked. */
struct moat_tar_stats {
	uint64_t files, dirs, symlinks;
	uint64_t bytes;   /* regular file contents */
	uint64_t skipped; /* packing: special files left out */
};

/* One member as read: name and link are cleaned of nothing (the raw
 * names; moat_tar_clean_name does that). */
struct moat_tar_entry {
	char type; /* '0' file, '5' dir, '2' symlink, others as read */
	char *name;
	char *link;
	uint64_t size;
	uint32_t mode;
	int64_t mtime;
};

/* A reader over an fd (need not be seekable). It reads ahead in its own
 * buffer: the fd's offset says nothing about where the reader is. */
struct moat_tar_reader {
	int fd;
	uint8_t *buf; /* MOAT_TAR_READ_BUF, made on first use */
	size_t blen, boff;
	uint64_t pos;       /* archive bytes consumed */
	uint64_t data_left; /* of the current member */
	uint64_t pad;       /* zero bytes after it */
	struct moat_tar_entry cur;
};

void moat_tar_reader_init(struct moat_tar_reader *r, int fd);
void moat_tar_reader_free(struct moat_tar_reader *r);

/* moat_tar_next: skips what is left of the current member and reads the
 * next one's headers into *e (owned by the reader until the next call).
 * Returns 1 with a member, 0 at the end, or -status with *why (heap). */
int moat_tar_next(struct moat_tar_reader *r, struct moat_tar_entry **e,
    char **why);

/* moat_tar_read_data: up to len bytes of the current member. Returns
 * bytes read (0 at its end) or -status with *why. */
ssize_t moat_tar_read_data(struct moat_tar_reader *r, void *buf, size_t len,
    char **why);

/* moat_tar_clean_name: the member name relative to the target, cleaned
 * ("./a//b/" -> "a/b", "." -> ""), into out (outlen). Refuses absolute
 * names and ".." components. Returns 0 or -status with *why. */
int moat_tar_clean_name(const char *name, char *out, size_t outlen,
    char **why);

/* moat_tar_check: reads the whole archive from fd (its current offset)
 * and applies the rules above; file contents over cap bytes (0: none)
 * are refused. *st (optional) says what it holds. Returns 0 or a status
 * with *why (heap) naming the member. */
int moat_tar_check(int fd, uint64_t cap, struct moat_tar_stats *st,
    char **why);

/* moat_tar_unpack: checks the archive in fd (seekable, from offset 0)
 * with moat_tar_check, then unpacks it under dirfd: directories made as
 * needed, every path opened component by component with O_NOFOLLOW, an
 * existing file or link at a member's name replaced, modes kept without
 * setuid/setgid, mtimes kept. Returns 0 or a status with *why. */
int moat_tar_unpack(int fd, int dirfd, uint64_t cap, struct moat_tar_stats *st,
    char **why);

/* moat_tar_pack: writes an archive of what `src` is (an fd opened for
 * reading, not O_PATH) to out_fd: a directory's contents with names
 * relative to it, or a regular file as one member named `name`. Symlinks are stored as links; special files are skipped and
 * counted. Returns 0 or a status with *why. */
int moat_tar_pack(int src, const char *name, int out_fd,
    struct moat_tar_stats *st, char **why);

/* moat_tar_staging: an unnamed read-write file to stage an archive in
 * (O_TMPFILE; where that is not supported, a file unlinked at once), in
 * dir, or with dir NULL in $TMPDIR or /tmp. It is gone with its last
 * fd, whatever happens to the process. Returns an fd or -errno. */
int moat_tar_staging(const char *dir);

/* moat_tar_write_header: the headers of one member (a pax 'x' record
 * first when the name or link does not fit ustar or the size is 8 GiB
 * or more). Returns 0 or -errno. */
int moat_tar_write_header(int fd, const struct moat_tar_entry *e);

/* moat_tar_write_end: the two zero blocks that end an archive. */
int moat_tar_write_end(int fd);

/* moat_tar_write_all: write() until done. 0 or -errno. */
int moat_tar_write_all(int fd, const void *buf, size_t len);

#endif
