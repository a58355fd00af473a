/*
 * cmd_files.c: `moat cp` (one file, host -> sandbox or sandbox -> host,
 * binary safe, any size: the library moves it in 1 MiB pieces) and
 * `moat ls`. A downloaded file is written to a temporary name and renamed
 * into place, so an interrupted copy never leaves half a file under the
 * real name. Directories are refused with what to do instead.
 * Not for: copying between two sandboxes, or directory trees.
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
#include "moat/util.h"

static const char *const usage_cp = "cp SRC DST   (one side is ID:/path)";

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
			    moat_asprintf("only files can be copied: pack "
			                  "it first (tar cf dir.tar %s), copy "
			                  "the archive, "
			                  "then unpack it with moat exec ID "
			                  "-- tar xf ...",
			        local),
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
		    moat_asprintf("only files can be copied: pack it first "
		                  "(moat exec %s -- tar cf /tmp/dir.tar -C %s "
		                  ".) and copy "
		                  "the archive",
		        sandbox, remote),
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

int
cmd_cp(struct cli *cli, int argc, char **argv)
{
	struct side src, dst;
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
	} else if (dst.sandbox != NULL) {
		rv = cp_up(cli, src.path, dst.sandbox, dst.path);
	} else {
		rv = cp_down(cli, src.sandbox, src.path, dst.path);
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
