/*
 * tar.c: reading, checking and writing tar archives (moat/tar.h has the
 * rules). ustar headers, pax 'x' records (path, linkpath, size; others
 * ignored) and GNU 'L'/'K' long names; numbers in octal or GNU base-256.
 * Not for: unpacking (tar_unpack.c) or packing (tar_pack.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

#define LINKSET_MAX_LOAD 2 /* entries per slot before it grows */

void
moat_tar_reader_init(struct moat_tar_reader *r, int fd)
{
	memset(r, 0, sizeof(*r));
	r->fd = fd;
}

static void
cur_clear(struct moat_tar_reader *r)
{
	free(r->cur.name);
	free(r->cur.link);
	r->cur.name = r->cur.link = NULL;
}

void
moat_tar_reader_free(struct moat_tar_reader *r)
{
	cur_clear(r);
	free(r->buf);
	r->buf = NULL;
	r->blen = r->boff = 0;
}

/* rd_full: exactly len bytes (1), 0 at the end before any byte, -2 at
 * the end part way, -1 on a read error (errno). Through the reader's
 * buffer: a header is 512 bytes, and one read() each is slow in a guest
 * under emulation. */
static int
rd_full(struct moat_tar_reader *r, void *buf, size_t len)
{
	size_t got = 0;

	if (r->buf == NULL && (r->buf = malloc(MOAT_TAR_READ_BUF)) == NULL) {
		errno = ENOMEM;
		return -1;
	}
	while (got < len) {
		ssize_t n;

		if (r->boff < r->blen) {
			size_t k = r->blen - r->boff;

			if (k > len - got)
				k = len - got;
			memcpy((char *)buf + got, r->buf + r->boff, k);
			r->boff += k;
			got += k;
			continue;
		}
		n = read(r->fd, r->buf, MOAT_TAR_READ_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0) {
			r->pos += got;
			return got ? -2 : 0;
		}
		r->blen = (size_t)n;
		r->boff = 0;
	}
	r->pos += len;
	return 1;
}

static int
rd_fail(struct moat_tar_reader *r, int rv, char **why, const char *what)
{
	if (rv == -1) {
		*why =
		    moat_asprintf("reading the archive: %s", strerror(errno));
		return -MOAT_INTERNAL;
	}
	*why = moat_asprintf("the archive is truncated at byte %llu (%s): "
	                     "send all of it",
	    (unsigned long long)r->pos, what);
	return -MOAT_INVALID_ARGUMENT;
}

/* rd_skip: drops n bytes (seeking when the fd allows). */
static int
rd_skip(struct moat_tar_reader *r, uint64_t n, char **why)
{
	char buf[8192];

	while (n > 0) {
		size_t k = n > sizeof(buf) ? sizeof(buf) : (size_t)n;
		int rv = rd_full(r, buf, k);

		if (rv <= 0)
			return rd_fail(r, rv, why, "inside a member");
		n -= k;
	}
	return 0;
}

/* tar_num: an octal (NUL or space ended) or base-256 number. */
static int
tar_num(const char *f, size_t len, uint64_t *out)
{
	uint64_t v = 0;
	size_t i = 0;

	if ((unsigned char)f[0] & 0x80) {
		v = (unsigned char)f[0] & 0x3f;
		if ((unsigned char)f[0] & 0x40)
			return -1; /* negative */
		for (i = 1; i < len; i++) {
			if (v >> 56)
				return -1;
			v = (v << 8) | (unsigned char)f[i];
		}
		*out = v;
		return 0;
	}
	while (i < len && f[i] == ' ')
		i++;
	for (; i < len && f[i] >= '0' && f[i] <= '7'; i++) {
		if (v >> 61)
			return -1;
		v = v * 8 + (uint64_t)(f[i] - '0');
	}
	if (i < len && f[i] != '\0' && f[i] != ' ')
		return -1;
	*out = v;
	return 0;
}

static bool
block_zero(const unsigned char *b)
{
	for (size_t i = 0; i < MOAT_TAR_BLOCK; i++)
		if (b[i])
			return false;
	return true;
}

static bool
checksum_ok(const unsigned char *b)
{
	uint64_t want;
	long us = 0, s = 0;

	if (tar_num((const char *)b + 148, 8, &want) != 0)
		return false;
	for (size_t i = 0; i < MOAT_TAR_BLOCK; i++) {
		unsigned char c = (i >= 148 && i < 156) ? ' ' : b[i];

		us += c;
		s += (signed char)c;
	}
	return (uint64_t)us == want || (uint64_t)s == want;
}

/* rd_meta: a pax or GNU long-name record's data, NUL-terminated. */
static int
rd_meta(struct moat_tar_reader *r, uint64_t size, char **out, char **why)
{
	uint64_t padded =
	    (size + MOAT_TAR_BLOCK - 1) / MOAT_TAR_BLOCK * MOAT_TAR_BLOCK;
	char *buf;
	int rv;

	if (size > MOAT_TAR_META_MAX) {
		*why = moat_asprintf("an extended header at byte %llu is %llu "
		                     "bytes, over the %u allowed",
		    (unsigned long long)r->pos, (unsigned long long)size,
		    MOAT_TAR_META_MAX);
		return -MOAT_INVALID_ARGUMENT;
	}
	if ((buf = malloc(padded + 1)) == NULL) {
		*why = moat_asprintf("out of memory");
		return -MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = rd_full(r, buf, padded)) <= 0) {
		free(buf);
		return rd_fail(r, rv, why, "in an extended header");
	}
	buf[size] = '\0';
	*out = buf;
	return 0;
}

static int
set_str(char **dst, const char *src, size_t len)
{
	char *s = strndup(src, len);

	if (s == NULL)
		return -1;
	free(*dst);
	*dst = s;
	return 0;
}

/* pax_apply: "LEN key=value\n" records; path, linkpath and size. */
static int
pax_apply(const char *rec, size_t len, char **path, char **link,
    uint64_t *size, bool *has_size)
{
	size_t off = 0;

	while (off < len) {
		char *end, *eq;
		unsigned long n = strtoul(rec + off, &end, 10);
		const char *val;

		if (end == rec + off || *end != ' ' || n == 0 ||
		    n > len - off || rec[off + n - 1] != '\n')
			return -1;
		eq = memchr(end + 1, '=', (size_t)(rec + off + n - end - 1));
		if (eq == NULL)
			return -1;
		val = eq + 1;
		size_t vlen = (size_t)(rec + off + n - 1 - val);
		size_t klen = (size_t)(eq - end - 1);

		if (klen == 4 && memcmp(end + 1, "path", 4) == 0) {
			if (set_str(path, val, vlen) != 0)
				return -1;
		} else if (klen == 8 && memcmp(end + 1, "linkpath", 8) == 0) {
			if (set_str(link, val, vlen) != 0)
				return -1;
		} else if (klen == 4 && memcmp(end + 1, "size", 4) == 0) {
			char *e2;

			*size = strtoull(val, &e2, 10);
			if (e2 != val + vlen)
				return -1;
			*has_size = true;
		}
		off += n;
	}
	return 0;
}

/* header_fill: the member from a ustar block plus what earlier pax or
 * GNU records said. */
static int
header_fill(struct moat_tar_reader *r, const unsigned char *b, char **path,
    char **link, uint64_t psize, bool has_psize, char **why)
{
	struct moat_tar_entry *e = &r->cur;
	uint64_t v;

	cur_clear(r);
	e->type = b[156] ? (char)b[156] : '0';
	if (tar_num((const char *)b + 124, 12, &e->size) != 0 ||
	    tar_num((const char *)b + 100, 8, &v) != 0) {
		*why = moat_asprintf("the member header at byte %llu has a "
		                     "malformed number",
		    (unsigned long long)r->pos - MOAT_TAR_BLOCK);
		return -MOAT_INVALID_ARGUMENT;
	}
	e->mode = (uint32_t)(v & 07777);
	e->mtime =
	    tar_num((const char *)b + 136, 12, &v) == 0 ? (int64_t)v : 0;
	if (has_psize)
		e->size = psize;
	if (*path != NULL) {
		e->name = *path;
		*path = NULL;
	} else if (memcmp(b + 257, "ustar", 5) == 0 && b[345] != '\0') {
		e->name = moat_asprintf("%.155s/%.100s", (const char *)b + 345,
		    (const char *)b);
	} else {
		e->name = strndup((const char *)b, 100);
	}
	if (*link != NULL) {
		e->link = *link;
		*link = NULL;
	} else {
		e->link = strndup((const char *)b + 157, 100);
	}
	if (e->name == NULL || e->link == NULL) {
		*why = moat_asprintf("out of memory");
		return -MOAT_RESOURCE_EXHAUSTED;
	}
	/* Directories, links and specials carry no data whatever the size
	 * field says (ustar). */
	if (e->type == '5' || e->type == '2' || e->type == '1' ||
	    e->type == '3' || e->type == '4' || e->type == '6')
		e->size = 0;
	r->data_left = e->size;
	r->pad = (MOAT_TAR_BLOCK - e->size % MOAT_TAR_BLOCK) % MOAT_TAR_BLOCK;
	return 1;
}

int
moat_tar_next(struct moat_tar_reader *r, struct moat_tar_entry **e, char **why)
{
	unsigned char b[MOAT_TAR_BLOCK];
	char *path = NULL, *link = NULL, *meta;
	uint64_t psize = 0;
	bool has_psize = false;
	int rv;

	if ((rv = rd_skip(r, r->data_left + r->pad, why)) != 0)
		return rv;
	r->data_left = r->pad = 0;
	for (;;) {
		uint64_t size;

		if ((rv = rd_full(r, b, sizeof(b))) <= 0) {
			if (rv == 0 && path == NULL && link == NULL &&
			    !has_psize && r->pos % MOAT_TAR_BLOCK == 0)
				return 0; /* no end blocks: tolerated */
			rv = rd_fail(r, rv, why, "in a header");
			break;
		}
		if (block_zero(b)) {
			rv = 0;
			break;
		}
		if (!checksum_ok(b)) {
			*why =
			    moat_asprintf("the header at byte %llu has a bad "
			                  "checksum: the archive is damaged "
			                  "or not a tar archive",
			        (unsigned long long)r->pos - MOAT_TAR_BLOCK);
			rv = -MOAT_INVALID_ARGUMENT;
			break;
		}
		if (tar_num((const char *)b + 124, 12, &size) != 0) {
			*why = moat_asprintf("the header at byte %llu has a "
			                     "malformed size",
			    (unsigned long long)r->pos - MOAT_TAR_BLOCK);
			rv = -MOAT_INVALID_ARGUMENT;
			break;
		}
		if (b[156] != 'x' && b[156] != 'g' && b[156] != 'L' &&
		    b[156] != 'K') {
			rv = header_fill(r, b, &path, &link, psize, has_psize,
			    why);
			if (rv > 0)
				*e = &r->cur;
			break;
		}
		if ((rv = rd_meta(r, size, &meta, why)) != 0)
			break;
		if (b[156] == 'L' || b[156] == 'K') {
			rv = set_str(b[156] == 'L' ? &path : &link, meta,
			    strlen(meta));
		} else if (b[156] == 'x') {
			rv = pax_apply(meta, (size_t)size, &path, &link,
			    &psize, &has_psize);
		}
		free(meta);
		if (rv != 0) {
			*why = moat_asprintf("the extended header before byte "
			                     "%llu is malformed",
			    (unsigned long long)r->pos);
			rv = -MOAT_INVALID_ARGUMENT;
			break;
		}
	}
	free(path);
	free(link);
	return rv;
}

ssize_t
moat_tar_read_data(struct moat_tar_reader *r, void *buf, size_t len,
    char **why)
{
	int rv;

	if (len > r->data_left)
		len = (size_t)r->data_left;
	if (len == 0)
		return 0;
	if ((rv = rd_full(r, buf, len)) <= 0)
		return rd_fail(r, rv, why, "inside a member");
	r->data_left -= len;
	return (ssize_t)len;
}

int
moat_tar_clean_name(const char *name, char *out, size_t outlen, char **why)
{
	const char *p = name;
	size_t o = 0;

	if (name[0] == '/') {
		*why =
		    moat_asprintf("member \"%s\" has an absolute name: pack "
		                  "with relative names (tar -C DIR .)",
		        name);
		return -MOAT_INVALID_ARGUMENT;
	}
	while (*p) {
		const char *s = strchr(p, '/');
		size_t n = s ? (size_t)(s - p) : strlen(p);

		if (n == 2 && p[0] == '.' && p[1] == '.') {
			*why = moat_asprintf("member \"%s\" has a \"..\" "
			                     "component: it would leave the "
			                     "target directory",
			    name);
			return -MOAT_INVALID_ARGUMENT;
		}
		if (n > 0 && !(n == 1 && p[0] == '.')) {
			if (o + n + 2 > outlen) {
				*why =
				    moat_asprintf("member \"%.200s...\" has "
				                  "a name longer than %zu "
				                  "bytes",
				        name, outlen - 1);
				return -MOAT_INVALID_ARGUMENT;
			}
			if (o > 0)
				out[o++] = '/';
			memcpy(out + o, p, n);
			o += n;
		}
		p += n;
		if (*p == '/')
			p++;
	}
	out[o] = '\0';
	return 0;
}

/* A set of cleaned names that are symlinks (open addressing). */
struct linkset {
	char **slot;
	size_t cap, n;
};

static uint64_t
name_hash(const char *s, size_t len)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
	return h;
}

static bool
linkset_has(const struct linkset *ls, const char *s, size_t len)
{
	if (ls->n == 0)
		return false;
	for (size_t i = name_hash(s, len) % ls->cap;; i = (i + 1) % ls->cap) {
		if (ls->slot[i] == NULL)
			return false;
		if (strlen(ls->slot[i]) == len &&
		    memcmp(ls->slot[i], s, len) == 0)
			return true;
	}
}

static int
linkset_add(struct linkset *ls, const char *s)
{
	if ((ls->n + 1) * LINKSET_MAX_LOAD > ls->cap) {
		struct linkset big = { NULL, ls->cap ? ls->cap * 4 : 64, 0 };

		if ((big.slot = calloc(big.cap, sizeof(char *))) == NULL)
			return -1;
		for (size_t i = 0; i < ls->cap; i++) {
			if (ls->slot[i] == NULL)
				continue;
			size_t j =
			    name_hash(ls->slot[i], strlen(ls->slot[i])) %
			    big.cap;

			while (big.slot[j] != NULL)
				j = (j + 1) % big.cap;
			big.slot[j] = ls->slot[i];
			big.n++;
		}
		free(ls->slot);
		*ls = big;
	}
	size_t j = name_hash(s, strlen(s)) % ls->cap;

	while (ls->slot[j] != NULL)
		j = (j + 1) % ls->cap;
	if ((ls->slot[j] = strdup(s)) == NULL)
		return -1;
	ls->n++;
	return 0;
}

static void
linkset_free(struct linkset *ls)
{
	for (size_t i = 0; i < ls->cap; i++)
		free(ls->slot[i]);
	free(ls->slot);
}

/* under_link: whether clean, or a directory above it, is in ls. */
static bool
under_link(const struct linkset *ls, const char *clean)
{
	size_t len = strlen(clean);

	for (size_t i = 1; i <= len; i++)
		if ((clean[i] == '/' || clean[i] == '\0') &&
		    linkset_has(ls, clean, i))
			return true;
	return false;
}

/* type_refusal: why a member type is refused, or NULL. */
static const char *
type_refusal(char type)
{
	switch (type) {
	case '0':
	case '7':
	case '5':
	case '2':
		return NULL;
	case '1':
		return "is a hard link (not accepted: pack it as a file)";
	case '3':
	case '4':
		return "is a device node";
	case '6':
		return "is a fifo";
	default:
		return "has a member type moat does not unpack (sparse, "
		       "volume or other GNU special)";
	}
}

/* check_member: one member against the rules. */
static int
check_member(const struct moat_tar_entry *e, struct linkset *ls, uint64_t cap,
    struct moat_tar_stats *st, char **why)
{
	char clean[4096];
	const char *bad;
	int rv;

	if ((rv = moat_tar_clean_name(e->name, clean, sizeof(clean), why)) !=
	    0)
		return -rv;
	if ((bad = type_refusal(e->type)) != NULL) {
		*why = moat_asprintf("member \"%s\" %s: refused, nothing was "
		                     "written",
		    e->name, bad);
		return MOAT_INVALID_ARGUMENT;
	}
	if (clean[0] == '\0' && e->type != '5') {
		*why = moat_asprintf("member \"%s\" names the target itself "
		                     "but is not a directory",
		    e->name);
		return MOAT_INVALID_ARGUMENT;
	}
	if (under_link(ls, clean)) {
		*why = moat_asprintf("member \"%s\" is at or under a path an "
		                     "earlier member made a symlink: refused "
		                     "(nothing is written through a link)",
		    e->name);
		return MOAT_INVALID_ARGUMENT;
	}
	if (e->type == '2') {
		if (e->link[0] == '\0') {
			*why = moat_asprintf("symlink \"%s\" has an empty "
			                     "target",
			    e->name);
			return MOAT_INVALID_ARGUMENT;
		}
		if (linkset_add(ls, clean) != 0) {
			*why = moat_asprintf("out of memory");
			return MOAT_RESOURCE_EXHAUSTED;
		}
		st->symlinks++;
	} else if (e->type == '5') {
		st->dirs += clean[0] != '\0';
	} else {
		st->files++;
		st->bytes += e->size;
		if (cap != 0 && st->bytes > cap) {
			*why =
			    moat_asprintf("the archive's files total more "
			                  "than the %llu-byte cap (at member "
			                  "\"%s\"): send less, or raise "
			                  "[vmd] archive-max-mib",
			        (unsigned long long)cap, e->name);
			return MOAT_RESOURCE_EXHAUSTED;
		}
	}
	return 0;
}

int
moat_tar_check(int fd, uint64_t cap, struct moat_tar_stats *st, char **why)
{
	struct moat_tar_stats local = { 0 };
	struct moat_tar_reader r;
	struct linkset ls = { 0 };
	struct moat_tar_entry *e;
	int rv;

	moat_tar_reader_init(&r, fd);
	while ((rv = moat_tar_next(&r, &e, why)) > 0)
		if ((rv = check_member(e, &ls, cap, &local, why)) != 0)
			break;
	if (rv < 0)
		rv = -rv;
	moat_tar_reader_free(&r);
	linkset_free(&ls);
	if (st != NULL)
		*st = local;
	return rv;
}

int
moat_tar_write_all(int fd, const void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = write(fd, (const char *)buf + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (size_t)n;
	}
	return 0;
}

/* put_octal: `v` as len - 1 octal digits, zero-padded, then NUL (the
 * caller checked that it fits; digit by digit because snprintf's width
 * cannot promise the compiler so). */
static void
put_octal(char *f, size_t len, uint64_t v)
{
	f[len - 1] = '\0';
	for (size_t i = len - 1; i-- > 0; v >>= 3)
		f[i] = (char)('0' + (v & 7));
}

static void
finish_block(unsigned char *b)
{
	unsigned sum = 0;

	memset(b + 148, ' ', 8);
	for (size_t i = 0; i < MOAT_TAR_BLOCK; i++)
		sum += b[i];
	snprintf((char *)b + 148, 8, "%06o", sum);
	b[155] = ' ';
}

static void
ustar_block(unsigned char *b, const char *name, const char *link, char type,
    uint32_t mode, uint64_t size, int64_t mtime)
{
	memset(b, 0, MOAT_TAR_BLOCK);
	strncpy((char *)b, name, 100);
	put_octal((char *)b + 100, 8, mode & 07777);
	put_octal((char *)b + 108, 8, 0);
	put_octal((char *)b + 116, 8, 0);
	put_octal((char *)b + 124, 12, size);
	put_octal((char *)b + 136, 12, mtime > 0 ? (uint64_t)mtime : 0);
	b[156] = (unsigned char)type;
	if (link != NULL)
		strncpy((char *)b + 157, link, 100);
	memcpy(b + 257,
	    "ustar\0"
	    "00",
	    8);
	finish_block(b);
}

/* pax_record: "LEN key=value\n" appended to buf (LEN counts itself). */
static char *
pax_record(char *buf, const char *key, const char *val)
{
	size_t body = strlen(key) + strlen(val) + 3, len = body + 1;
	char *out;

	while (len != body + (size_t)snprintf(NULL, 0, "%zu", len))
		len = body + (size_t)snprintf(NULL, 0, "%zu", len);
	out = moat_asprintf("%s%zu %s=%s\n", buf ? buf : "", len, key, val);
	free(buf);
	return out;
}

int
moat_tar_write_header(int fd, const struct moat_tar_entry *e)
{
	unsigned char b[MOAT_TAR_BLOCK];
	bool big = e->size >= (1ull << 33);
	const char *link = e->link ? e->link : "";
	char *pax = NULL;
	int rv;

	if (strlen(e->name) > 99)
		pax = pax_record(pax, "path", e->name);
	if (strlen(link) > 99)
		pax = pax_record(pax, "linkpath", link);
	if (big) {
		char num[32];

		snprintf(num, sizeof(num), "%llu",
		    (unsigned long long)e->size);
		pax = pax_record(pax, "size", num);
	}
	if (pax != NULL) {
		size_t plen = strlen(pax);
		size_t pad =
		    (MOAT_TAR_BLOCK - plen % MOAT_TAR_BLOCK) % MOAT_TAR_BLOCK;
		static const char zeros[MOAT_TAR_BLOCK];

		ustar_block(b, "././@PaxHeader", NULL, 'x', 0644, plen, 0);
		if ((rv = moat_tar_write_all(fd, b, sizeof(b))) != 0 ||
		    (rv = moat_tar_write_all(fd, pax, plen)) != 0 ||
		    (rv = moat_tar_write_all(fd, zeros, pad)) != 0) {
			free(pax);
			return rv;
		}
		free(pax);
	}
	ustar_block(b, e->name, link, e->type, e->mode, big ? 0 : e->size,
	    e->mtime);
	return moat_tar_write_all(fd, b, sizeof(b));
}

int
moat_tar_write_end(int fd)
{
	static const char zeros[2 * MOAT_TAR_BLOCK];

	return moat_tar_write_all(fd, zeros, sizeof(zeros));
}
