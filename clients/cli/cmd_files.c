/*
 * cmd_files.c: `moat cp` (one file, host -> sandbox or sandbox -> host,
 * binary safe, any size: the library moves it in 1 MiB pieces), `moat cp
 * -r` (a directory tree as a tar archive through PutArchive/GetArchive,
 * packed and unpacked here with lib/tar*.c, checked before anything is
 * written on either side) and `moat ls`. A downloaded file is written to
 * a temporary name and renamed into place, so an interrupted copy never
 * leaves half a file under the real name. Without -r a directory is
 * refused and -r suggested.
 * Not for: copying between two sandboxes.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

static const char *const usage_cp = "cp [-r] SRC DST   (one side is ID:/path)";

/* A side of a copy: a sandbox path when `sandbox` is set. */
struct side {
	char *sandbox; /* heap, or NULL for the host */
	const char *path;
};

/* parse_side: "ID:/path" is a sandbox path when ID has no '/' (so
 * "./a:b" and "/x:y" stay host paths). */
static int
parse_side(const char *arg, struct side *s)
{
	const char *colon = strchr(arg, ':');

	s->sandbox = NULL;
	s->path = arg;
	if (colon == NULL || colon == arg ||
	    memchr(arg, '/', (size_t)(colon - arg)) != NULL)
		return 0;
	if ((s->sandbox = strndup(arg, (size_t)(colon - arg))) == NULL)
		return ENOMEM;
	s->path = colon + 1;
	return 0;
}

static const char *
base_name(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

static bool
ends_with_slash(const char *p)
{
	size_t n = strlen(p);

	return n > 0 && p[n - 1] == '/';
}

static int
cp_up(struct cli *cli, const char *local, const char *sandbox,
    const char *remote)
{
	Moat__V1__FileInfo *st = NULL, *done = NULL;
	char *target = NULL, *errmsg = NULL;
	struct stat lst;
	uint32_t mode = 0644;
	int fd = STDIN_FILENO, rv;

	if (strcmp(local, "-") != 0) {
		if ((fd = open(local, O_RDONLY | O_CLOEXEC)) < 0) {
			int err = errno;
			return cli_fail(cli, moat_status_from_errno(err),
			    moat_asprintf("%s", strerror(err)),
			    "cp: cannot "
			    "open %s",
			    local);
		}
		if (fstat(fd, &lst) != 0 || S_ISDIR(lst.st_mode)) {
			close(fd);
			return cli_fail(cli, MOAT_INVALID_ARGUMENT,
			    moat_asprintf("copy a directory with -r: moat cp "
			                  "-r %s %s:%s",
			        local, sandbox, remote),
			    "cp: %s is a directory", local);
		}
		mode = lst.st_mode & 07777;
	}
	/* "ID:/dir/" or an existing directory: keep the source's name. */
	if (ends_with_slash(remote) ||
	    (moat_client_stat(cli_client(cli), sandbox, remote, &st,
	         &errmsg) == MOAT_OK &&
	        st->type == MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY)) {
		if (strcmp(local, "-") == 0) {
			rv = cli_fail(cli, MOAT_INVALID_ARGUMENT,
			    moat_asprintf("name the file, e.g. %s:%s%sdata",
			        sandbox, remote,
			        ends_with_slash(remote) ? "" : "/"),
			    "cp: stdin needs a file name in the "
			    "sandbox, not the directory %s",
			    remote);
			goto out;
		}
		target = moat_asprintf("%s%s%s", remote,
		    ends_with_slash(remote) ? "" : "/", base_name(local));
	} else {
		target = strdup(remote);
	}
	free(errmsg);
	errmsg = NULL;
	if (target == NULL) {
		rv = cli_fail(cli, MOAT_RESOURCE_EXHAUSTED, NULL, "cp");
		goto out;
	}
	if ((rv = moat_client_write_file_from_fd(cli_client(cli), sandbox,
	         target, fd, mode, true, &done, &errmsg)) != MOAT_OK) {
		rv = cli_fail(cli, rv, errmsg, "cp: writing %s in sandbox %s",
		    target, sandbox);
		goto out;
	}
	if (cli->json)
		rv = cli_print_json(cli, done);
out:
	if (fd != STDIN_FILENO)
		close(fd);
	moat_client_free_msg(st);
	moat_client_free_msg(done);
	free(target);
	return rv;
}

static int
cp_down(struct cli *cli, const char *sandbox, const char *remote,
    const char *local)
{
	Moat__V1__FileInfo *st = NULL;
	char *target = NULL, *tmp = NULL, *errmsg = NULL;
	struct stat lst;
	uint32_t mode = 0;
	uint64_t size = 0;
	int fd = -1, rv;

	if ((rv = moat_client_stat(cli_client(cli), sandbox, remote, &st,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "cp: %s in sandbox %s",
		    remote, sandbox);
	if (st->type == MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY) {
		moat_client_free_msg(st);
		return cli_fail(cli, MOAT_INVALID_ARGUMENT,
		    moat_asprintf("copy a directory with -r: moat cp -r "
		                  "%s:%s %s",
		        sandbox, remote, local),
		    "cp: %s in sandbox %s "
		    "is a directory",
		    remote, sandbox);
	}
	moat_client_free_msg(st);
	if (strcmp(local, "-") == 0) {
		if ((rv = moat_client_read_file_to_fd(cli_client(cli), sandbox,
		         remote, STDOUT_FILENO, NULL, NULL, &errmsg)) !=
		    MOAT_OK)
			return cli_fail(cli, rv, errmsg,
			    "cp: reading %s in "
			    "sandbox %s",
			    remote, sandbox);
		return 0;
	}
	if (ends_with_slash(local) ||
	    (stat(local, &lst) == 0 && S_ISDIR(lst.st_mode)))
		target = moat_asprintf("%s%s%s", local,
		    ends_with_slash(local) ? "" : "/", base_name(remote));
	else
		target = strdup(local);
	if (target == NULL ||
	    (tmp = moat_asprintf("%s.moat-partial-%d", target,
	         (int)getpid())) == NULL) {
		rv = cli_fail(cli, MOAT_RESOURCE_EXHAUSTED, NULL, "cp");
		goto out;
	}
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) <
	    0) {
		int err = errno;
		rv = cli_fail(cli, moat_status_from_errno(err),
		    moat_asprintf("%s", strerror(err)), "cp: cannot create %s",
		    tmp);
		goto out;
	}
	if ((rv = moat_client_read_file_to_fd(cli_client(cli), sandbox, remote,
	         fd, &size, &mode, &errmsg)) != MOAT_OK) {
		rv = cli_fail(cli, rv, errmsg, "cp: reading %s in sandbox %s",
		    remote, sandbox);
		goto fail_tmp;
	}
	if (fchmod(fd, mode ? (mode & 07777) : 0644) != 0 || fsync(fd) != 0 ||
	    close(fd) != 0 || rename(tmp, target) != 0) {
		int err = errno;
		fd = -1;
		rv = cli_fail(cli, moat_status_from_errno(err),
		    moat_asprintf("%s", strerror(err)), "cp: finishing %s",
		    target);
		goto fail_tmp;
	}
	fd = -1;
	rv = 0;
	goto out;

fail_tmp:
	unlink(tmp);
out:
	if (fd >= 0)
		close(fd);
	free(target);
	free(tmp);
	return rv;
}

static void
print_summary(struct cli *cli, const char *verb, const char *where,
    const struct moat_tar_stats *st)
{
	if (cli->json) {
		printf("{\"files\": %llu, \"dirs\": %llu, \"symlinks\": %llu, "
		       "\"bytes\": %llu, \"skipped\": %llu}\n",
		    (unsigned long long)st->files,
		    (unsigned long long)st->dirs,
		    (unsigned long long)st->symlinks,
		    (unsigned long long)st->bytes,
		    (unsigned long long)st->skipped);
		return;
	}
	printf("%s %s: %llu files, %llu dirs, %llu symlinks, %llu bytes", verb,
	    where, (unsigned long long)st->files, (unsigned long long)st->dirs,
	    (unsigned long long)st->symlinks, (unsigned long long)st->bytes);
	if (st->skipped)
		printf(" (%llu special files left out)",
		    (unsigned long long)st->skipped);
	printf("\n");
}

/* trimmed_base: the last name of a path, trailing slashes ignored. */
static char *
trimmed_base(const char *path)
{
	char *copy = strdup(path), *b;
	size_t n;

	if (copy == NULL)
		return NULL;
	while ((n = strlen(copy)) > 1 && copy[n - 1] == '/')
		copy[n - 1] = '\0';
	b = strdup(base_name(copy));
	free(copy);
	return b;
}

/* cp_dir_up: `moat cp -r DIR ID:/path`. */
static int
cp_dir_up(struct cli *cli, const char *local, const char *sandbox,
    const char *remote)
{
	Moat__V1__FileInfo *st = NULL;
	Moat__V1__ArchivePutReply *done = NULL;
	struct moat_tar_stats ts = { 0 };
	char *target = NULL, *errmsg = NULL, *base = NULL;
	int dfd, afd, rv;

	if ((dfd = open(local, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		int err = errno;

		return cli_fail(cli, moat_status_from_errno(err),
		    moat_asprintf("%s", strerror(err)), "cp: cannot open %s",
		    local);
	}
	/* cp's rule: into an existing directory, keep the source's name. */
	if (moat_client_stat(cli_client(cli), sandbox, remote, &st, &errmsg) ==
	    MOAT_OK) {
		if (st->type != MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY) {
			rv = cli_fail(cli, MOAT_ALREADY_EXISTS,
			    moat_asprintf("name a directory, or a path that "
			                  "does not exist yet"),
			    "cp: %s in sandbox %s exists and is not a "
			    "directory",
			    remote, sandbox);
			goto out;
		}
		base = trimmed_base(local);
		target = base ? moat_asprintf("%s/%s", remote, base) : NULL;
	} else {
		target = strdup(remote);
	}
	free(errmsg);
	errmsg = NULL;
	if (target == NULL || (afd = moat_tar_staging(NULL)) < 0) {
		rv = cli_fail(cli, MOAT_RESOURCE_EXHAUSTED,
		    moat_asprintf("set TMPDIR to a writable directory"),
		    "cp: no room for the archive");
		goto out;
	}
	if ((rv = moat_tar_pack(dfd, local, afd, &ts, &errmsg)) != 0) {
		close(afd);
		rv = cli_fail(cli, rv, errmsg, "cp: packing %s", local);
		goto out;
	}
	rv = moat_client_put_archive_fd(cli_client(cli), sandbox, target, afd,
	    &done, &errmsg);
	close(afd);
	if (rv != MOAT_OK) {
		rv = cli_fail(cli, rv, errmsg,
		    "cp: copying %s to %s in sandbox %s", local, target,
		    sandbox);
		goto out;
	}
	ts.files = done->files;
	ts.dirs = done->dirs;
	ts.symlinks = done->symlinks;
	ts.bytes = done->bytes;
	print_summary(cli, "copied to", target, &ts);
out:
	close(dfd);
	moat_client_free_msg(st);
	moat_client_free_msg(done);
	free(target);
	free(base);
	return rv;
}

/* dir_target: `moat cp -r ID:/path DIR`'s local directory: DIR/<name>
 * when DIR is a directory, else DIR itself (made here, once the archive
 * passed its checks). */
static char *
dir_target(const char *remote, const char *local)
{
	struct stat lst;
	char *base, *t;

	if (stat(local, &lst) != 0 || !S_ISDIR(lst.st_mode))
		return strdup(local);
	if ((base = trimmed_base(remote)) == NULL)
		return NULL;
	t = strcmp(base, "/") == 0 ? strdup(local) :
	                             moat_asprintf("%s/%s", local, base);
	free(base);
	return t;
}

/* cp_dir_down: `moat cp -r ID:/path DIR`. */
static int
cp_dir_down(struct cli *cli, const char *sandbox, const char *remote,
    const char *local)
{
	struct moat_tar_stats ts = { 0 };
	char *target, *errmsg = NULL;
	int afd, dfd, rv;

	if ((target = dir_target(remote, local)) == NULL ||
	    (afd = moat_tar_staging(NULL)) < 0) {
		free(target);
		return cli_fail(cli, MOAT_RESOURCE_EXHAUSTED,
		    moat_asprintf("set TMPDIR to a writable directory"),
		    "cp: no room for the archive");
	}
	if ((rv = moat_client_get_archive_fd(cli_client(cli), sandbox, remote,
	         afd, NULL, &errmsg)) != MOAT_OK) {
		rv = cli_fail(cli, rv, errmsg, "cp: reading %s in sandbox %s",
		    remote, sandbox);
		goto out;
	}
	/* The sandbox is not trusted: the same checks as the agent's,
	 * before even the target is made. */
	if (lseek(afd, 0, SEEK_SET) != 0 ||
	    (rv = moat_tar_check(afd, 0, NULL, &errmsg)) != 0) {
		rv = cli_fail(cli, rv ? rv : MOAT_INTERNAL, errmsg,
		    "cp: the archive of %s from sandbox %s was refused",
		    remote, sandbox);
		goto out;
	}
	if (mkdir(target, 0755) != 0 && errno != EEXIST) {
		int err = errno;

		rv = cli_fail(cli, moat_status_from_errno(err),
		    moat_asprintf("%s%s", strerror(err),
		        err == ENOENT ? ": make its parent first" : ""),
		    "cp: cannot make %s", target);
		goto out;
	}
	if ((dfd = open(target, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		int err = errno;

		rv = cli_fail(cli, moat_status_from_errno(err),
		    moat_asprintf("%s: name a directory or a new path",
		        strerror(err)),
		    "cp: cannot open %s", target);
		goto out;
	}
	rv = moat_tar_unpack(afd, dfd, 0, &ts, &errmsg);
	close(dfd);
	if (rv != 0) {
		rv =
		    cli_fail(cli, rv, errmsg, "cp: unpacking into %s", target);
		goto out;
	}
	print_summary(cli, "copied to", target, &ts);
out:
	close(afd);
	free(target);
	return rv;
}

/* cp_tar_up: `moat cp --tar FILE.tar ID:/dir`: the archive as it is,
 * checked and unpacked by the guest into /dir. */
static int
cp_tar_up(struct cli *cli, const char *local, const char *sandbox,
    const char *remote)
{
	Moat__V1__ArchivePutReply *done = NULL;
	struct moat_tar_stats ts = { 0 };
	char *errmsg = NULL;
	int fd, rv;

	if ((fd = open(local, O_RDONLY | O_CLOEXEC)) < 0) {
		int err = errno;

		return cli_fail(cli, moat_status_from_errno(err),
		    moat_asprintf("%s", strerror(err)), "cp: cannot open %s",
		    local);
	}
	rv = moat_client_put_archive_fd(cli_client(cli), sandbox, remote, fd,
	    &done, &errmsg);
	close(fd);
	if (rv != MOAT_OK)
		return cli_fail(cli, rv, errmsg,
		    "cp: unpacking %s into %s in sandbox %s", local, remote,
		    sandbox);
	ts.files = done->files;
	ts.dirs = done->dirs;
	ts.symlinks = done->symlinks;
	ts.bytes = done->bytes;
	print_summary(cli, "unpacked into", remote, &ts);
	moat_client_free_msg(done);
	return 0;
}

/* cp_tar_down: `moat cp --tar ID:/path FILE.tar`: the guest's archive
 * of path, written as it came (nothing is unpacked here). */
static int
cp_tar_down(struct cli *cli, const char *sandbox, const char *remote,
    const char *local)
{
	char *errmsg = NULL;
	uint64_t size = 0;
	int fd, rv;

	if ((fd = open(local, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
	         0644)) < 0) {
		int err = errno;

		return cli_fail(cli, moat_status_from_errno(err),
		    moat_asprintf("%s", strerror(err)), "cp: cannot create %s",
		    local);
	}
	rv = moat_client_get_archive_fd(cli_client(cli), sandbox, remote, fd,
	    &size, &errmsg);
	if (close(fd) != 0 && rv == MOAT_OK) {
		rv = moat_status_from_errno(errno);
		errmsg = moat_asprintf("%s", strerror(errno));
	}
	if (rv != MOAT_OK) {
		unlink(local);
		return cli_fail(cli, rv, errmsg,
		    "cp: packing %s in sandbox %s", remote, sandbox);
	}
	if (!cli->json)
		printf("wrote %s: %llu bytes\n", local,
		    (unsigned long long)size);
	return 0;
}

/* local_is_dir: whether a host path is a directory (following links,
 * as cp does for the paths it is given). */
static bool
local_is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool
remote_is_dir(struct cli *cli, const char *sandbox, const char *path)
{
	Moat__V1__FileInfo *st = NULL;
	char *errmsg = NULL;
	bool dir = false;

	if (moat_client_stat(cli_client(cli), sandbox, path, &st, &errmsg) ==
	    MOAT_OK)
		dir = st->type == MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
	moat_client_free_msg(st);
	free(errmsg);
	return dir;
}

int
cmd_cp(struct cli *cli, int argc, char **argv)
{
	struct side src, dst;
	bool recursive = false, tar = false;
	int rv;

	for (int i = 1; i < argc; i++) {
		bool r = strcmp(argv[i], "-r") == 0 ||
		    strcmp(argv[i], "-R") == 0 ||
		    strcmp(argv[i], "--recursive") == 0;

		if (r || strcmp(argv[i], "--json") == 0 ||
		    strcmp(argv[i], "--tar") == 0) {
			if (r)
				recursive = true;
			else if (argv[i][2] == 't')
				tar = true;
			else
				cli->json = true;
			memmove(&argv[i], &argv[i + 1],
			    (size_t)(argc - i) * sizeof(*argv));
			argc--;
			i--;
		}
	}
	if (argc != 3)
		return cli_usage_error(usage_cp,
		    "give a source and a "
		    "destination");
	if (parse_side(argv[1], &src) != 0 || parse_side(argv[2], &dst) != 0)
		return cli_fail(cli, MOAT_RESOURCE_EXHAUSTED, NULL, "cp");
	if ((src.sandbox != NULL) == (dst.sandbox != NULL)) {
		rv = cli_usage_error(usage_cp,
		    src.sandbox ? "both sides are "
		                  "in sandboxes: copy through the host" :
		                  "neither side "
		                  "is in a sandbox: write one as ID:/path");
	} else if ((src.sandbox && src.path[0] == '\0') ||
	    (dst.sandbox && dst.path[0] == '\0')) {
		rv = cli_usage_error(usage_cp,
		    "the sandbox side needs a path "
		    "after the colon (ID:/root/file)");
	} else if (tar && dst.sandbox != NULL) {
		rv = cp_tar_up(cli, src.path, dst.sandbox, dst.path);
	} else if (tar) {
		rv = cp_tar_down(cli, src.sandbox, src.path, dst.path);
	} else if (dst.sandbox != NULL) {
		rv = recursive && local_is_dir(src.path) ?
		    cp_dir_up(cli, src.path, dst.sandbox, dst.path) :
		    cp_up(cli, src.path, dst.sandbox, dst.path);
	} else {
		rv = recursive && remote_is_dir(cli, src.sandbox, src.path) ?
		    cp_dir_down(cli, src.sandbox, src.path, dst.path) :
		    cp_down(cli, src.sandbox, src.path, dst.path);
	}
	free(src.sandbox);
	free(dst.sandbox);
	return rv;
}

static char
type_char(Moat__V1__FileType t)
{
	switch (t) {
	case MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY:
		return 'd';
	case MOAT__V1__FILE_TYPE__FILE_TYPE_SYMLINK:
		return 'l';
	case MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR:
		return '-';
	default:
		return '?';
	}
}

static int
by_name(const void *a, const void *b)
{
	const Moat__V1__FileInfo *x = *(Moat__V1__FileInfo *const *)a;
	const Moat__V1__FileInfo *y = *(Moat__V1__FileInfo *const *)b;

	return strcmp(x->name, y->name);
}

int
cmd_ls(struct cli *cli, int argc, char **argv)
{
	Moat__V1__FileList *list = NULL;
	const char *path = "/";
	char *errmsg = NULL;
	int rv;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			cli->json = true;
			memmove(&argv[i], &argv[i + 1],
			    (size_t)(argc - i) * sizeof(*argv));
			argc--;
			i--;
		}
	}
	if (argc < 2 || argc > 3)
		return cli_usage_error("ls ID [PATH]",
		    "give a sandbox id and "
		    "optionally a path");
	if (argc == 3)
		path = argv[2];
	if ((rv = moat_client_list_files(cli_client(cli), argv[1], path, &list,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "listing %s in sandbox %s",
		    path, argv[1]);
	if (cli->json) {
		rv = cli_print_json(cli, list);
		moat_client_free_msg(list);
		return rv;
	}
	qsort(list->entries, list->n_entries, sizeof(*list->entries), by_name);
	for (size_t i = 0; i < list->n_entries; i++) {
		const Moat__V1__FileInfo *f = list->entries[i];
		char perms[10], when[32] = "-";
		time_t t = (time_t)(f->mtime_ns / 1000000000);
		struct tm tm;

		for (int b = 0; b < 9; b++)
			perms[b] =
			    (f->mode & (0400u >> b)) ? "rwxrwxrwx"[b] : '-';
		perms[9] = '\0';
		if (f->mtime_ns != 0 && gmtime_r(&t, &tm) != NULL)
			strftime(when, sizeof(when), "%Y-%m-%d %H:%M", &tm);
		printf("%c%s %12llu %s %s\n", type_char(f->type), perms,
		    (unsigned long long)f->size, when, f->name);
	}
	moat_client_free_msg(list);
	return 0;
}
