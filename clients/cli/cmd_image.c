/*
 * cmd_image.c: `moat image build SPEC [--name NAME] [--force] [--node ID]
 * | ls | rm NAME | push NAME [--node ID]` (issue 17): images through the
 * gateway. A build sends the spec's text and the files its [files]
 * section names (values SOURCE[:MODE], relative to the spec's
 * directory), then long-polls the build, printing each step with its
 * time, and the image it made. Only [files] is read here, and only to
 * find what to send: the builder checks the whole spec (lib/image_spec.c
 * on the node), so its errors come back as the build's.
 * Not for: building without a gateway (images/build.sh --spec).
 */
#include <errno.h>
#include <ini.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "moat/status.h"
#include "moat/util.h"

#define SPEC_MAX (64u * 1024u)          /* as the gateway takes */
#define FILES_MAX (32u * 1024u * 1024u) /* all [files] sent, together */
#define POLL_WAIT_MS 10000              /* one GetImageBuild's long poll */
#define MIB(b) ((double)(b) / (1024.0 * 1024.0))

static const char usage_image[] =
    "image build SPEC [--name NAME] [--force] [--node ID] | ls [--json] | "
    "rm NAME | push NAME [--node ID]";

/* What reading [files] gathered, or why it stopped. */
struct spec_files {
	const char *dir; /* the spec's directory */
	Moat__V1__ImageInput **files;
	size_t n;
	size_t bytes;
	char *error; /* heap: the first problem */
	char *text;  /* heap: the spec's text */
};

static void
spec_files_free(struct spec_files *sf)
{
	for (size_t i = 0; i < sf->n; i++) {
		free(sf->files[i]->name);
		free(sf->files[i]->data.data);
		free(sf->files[i]);
	}
	free(sf->files);
	free(sf->error);
	free(sf->text);
}

/* add_file: one [files] value, "SOURCE[:MODE]", read from the spec's
 * directory. False (sf->error set) on a bad value or an unreadable
 * file. */
static bool
add_file(struct spec_files *sf, const char *key, const char *value)
{
	char *src = strdup(value), *colon, *path = NULL, *data = NULL, *end;
	Moat__V1__ImageInput *in = NULL, **nl;
	unsigned long mode = 0;
	struct stat st;
	size_t len = 0;
	int err;

	if (src == NULL)
		return false;
	if ((colon = strrchr(src, ':')) != NULL) {
		*colon = '\0';
		errno = 0;
		mode = strtoul(colon + 1, &end, 8);
		if (errno != 0 || end == colon + 1 || *end != '\0' ||
		    mode > 07777) {
			sf->error = moat_asprintf("[files] %s = %s: the mode "
			                          "after ':' must be octal, "
			                          "e.g. 0755",
			    key, value);
			goto fail;
		}
	}
	if (src[0] == '\0' || src[0] == '/' || strstr(src, "..") != NULL) {
		sf->error = moat_asprintf("[files] %s = %s: SOURCE must be a "
		                          "path relative to the spec's "
		                          "directory, without ..",
		    key, value);
		goto fail;
	}
	path = moat_asprintf("%s/%s", sf->dir, src);
	if (path == NULL || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
		sf->error = moat_asprintf("[files] %s: %s is not a readable "
		                          "file (SOURCE is relative to the "
		                          "spec's directory %s)",
		    key, path ? path : src, sf->dir);
		goto fail;
	}
	if ((err = moat_read_file(path, FILES_MAX - sf->bytes, &data, &len)) !=
	    0) {
		sf->error = moat_asprintf("[files] %s: %s: %s", key, path,
		    err == EFBIG ? "the files sent with a build are over "
		                   "32 MiB together: copy large files in a "
		                   "[run] step or a package instead" :
		                   strerror(err));
		goto fail;
	}
	if ((in = calloc(1, sizeof(*in))) == NULL ||
	    (nl = realloc(sf->files, (sf->n + 1) * sizeof(*nl))) == NULL)
		goto fail;
	moat__v1__image_input__init(in);
	in->name = src;
	in->data.data = (uint8_t *)data;
	in->data.len = len;
	in->mode =
	    colon != NULL ? (uint32_t)mode : (uint32_t)st.st_mode & 07777;
	sf->files = nl;
	sf->files[sf->n++] = in;
	sf->bytes += len;
	free(path);
	return true;

fail:
	free(in);
	free(data);
	free(path);
	free(src);
	return false;
}

/* on_value: inih's handler: only [files] matters here. */
static int
on_value(void *user, const char *section, const char *name, const char *value)
{
	struct spec_files *sf = user;

	if (strcmp(section, "files") != 0)
		return 1;
	return add_file(sf, name, value) ? 1 : 0;
}

/* read_spec: the spec's text and the files it names, into req. */
static int
read_spec(const char *spec_path, Moat__V1__ImageBuildRequest *req,
    struct spec_files *sf, char **errmsg)
{
	char *text = NULL, *copy = strdup(spec_path);
	size_t len = 0;
	int err, line;

	if (copy == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if ((err = moat_read_file(spec_path, SPEC_MAX, &text, &len)) != 0) {
		*errmsg = moat_asprintf("cannot read the spec %s: %s",
		    spec_path, err == EFBIG ? "over 64 KiB" : strerror(err));
		free(copy);
		return err == EFBIG ? MOAT_INVALID_ARGUMENT : MOAT_NOT_FOUND;
	}
	sf->dir = dirname(copy);
	line = ini_parse_string(text, on_value, sf);
	if (sf->error != NULL || line != 0) {
		*errmsg = sf->error != NULL ?
		    moat_asprintf("spec %s: %s", spec_path, sf->error) :
		    moat_asprintf("spec %s: line %d is not INI (KEY = VALUE "
		                  "under a [section])",
		        spec_path, line);
		free(text);
		free(copy);
		return MOAT_INVALID_ARGUMENT;
	}
	free(copy);
	sf->dir = NULL;
	sf->text = text;
	req->spec = text;
	req->files = sf->files;
	req->n_files = sf->n;
	return MOAT_OK;
}

/* default_name: the spec file's name without ".ini". */
static char *
default_name(const char *spec_path)
{
	const char *base = strrchr(spec_path, '/');
	char *name = strdup(base ? base + 1 : spec_path);
	size_t n = name ? strlen(name) : 0;

	if (n > 4 && strcmp(name + n - 4, ".ini") == 0)
		name[n - 4] = '\0';
	return name;
}

static void
print_image_done(const Moat__V1__ImageInfo *im)
{
	printf("image %s: id %.12s, %.1f MiB, %zu packages, nodes ", im->name,
	    im->id, MIB(im->size_bytes), im->n_packages);
	for (size_t i = 0; i < im->n_nodes; i++)
		printf("%s%s", i ? "," : "", im->nodes[i]);
	printf("%s%s\n", im->n_nodes ? "" : "-",
	    im->stored ? ", stored in moat-snapd" : "");
}

/* follow_build: long-polls build b until it ends, printing each step. */
static int
follow_build(struct cli *cli, Moat__V1__ImageBuild *b)
{
	char *id = strdup(b->id), *node = strdup(b->node_id), *errmsg = NULL;
	uint32_t next = 0;
	int rv = MOAT_OK;

	if (!cli->json)
		fprintf(stderr, "building image %s as build %s on node %s\n",
		    b->name, b->id, b->node_id);
	moat_client_free_msg(b);
	for (b = NULL; rv == MOAT_OK && !cli_interrupted;) {
		moat_client_free_msg(b);
		b = NULL;
		if ((rv = moat_client_get_image_build(cli_client(cli), id,
		         node, next, POLL_WAIT_MS, &b, &errmsg)) != MOAT_OK) {
			rv = cli_fail(cli, rv, errmsg,
			    "following build %s on node %s (`moat image ls` "
			    "shows whether it finished)",
			    id, node);
			break;
		}
		for (size_t i = 0; !cli->json && i < b->n_steps; i++)
			printf("[%5.1fs] %s\n", b->steps[i]->at_ms / 1000.0,
			    b->steps[i]->text);
		fflush(stdout);
		next = b->next_step;
		if (b->state ==
		        MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_DONE ||
		    b->state ==
		        MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_FAILED)
			break;
	}
	if (rv == MOAT_OK && b != NULL && cli->json)
		rv = cli_print_json(cli, b);
	else if (rv == MOAT_OK && b != NULL &&
	    b->state == MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_DONE &&
	    b->image != NULL)
		print_image_done(b->image);
	if (rv == MOAT_OK && b != NULL &&
	    b->state == MOAT__V1__IMAGE_BUILD_STATE__IMAGE_BUILD_FAILED)
		rv = cli_fail(cli, b->code ? (int)b->code : MOAT_UNKNOWN,
		    strdup(b->error), "building image %s", b->name);
	else if (rv == MOAT_OK && cli_interrupted)
		fprintf(stderr,
		    "moat: stopped following build %s; it goes on "
		    "on node %s\n",
		    id, node);
	moat_client_free_msg(b);
	free(id);
	free(node);
	return rv;
}

static int
image_build(struct cli *cli, int argc, char **argv)
{
	Moat__V1__ImageBuildRequest req = MOAT__V1__IMAGE_BUILD_REQUEST__INIT;
	struct spec_files sf = { 0 };
	Moat__V1__ImageBuild *b = NULL;
	const char *name = NULL;
	char *errmsg = NULL, *def = NULL;
	int rv;

	if (argc < 1 || argv[0][0] == '-')
		return cli_usage_error(usage_image,
		    "build wants a spec file (images/specs/NAME.ini)");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--name") == 0 && i + 1 < argc)
			name = argv[++i];
		else if (strcmp(argv[i], "--node") == 0 && i + 1 < argc)
			req.node_id = argv[++i];
		else if (strcmp(argv[i], "--force") == 0)
			req.force = true;
		else
			return cli_usage_error(usage_image,
			    "\"%s\": build takes SPEC [--name NAME] [--force] "
			    "[--node ID]",
			    argv[i]);
	}
	if (name == NULL && (name = def = default_name(argv[0])) == NULL)
		return cli_fail(cli, MOAT_RESOURCE_EXHAUSTED,
		    strdup("out of memory"), "building");
	req.name = (char *)name;
	if ((rv = read_spec(argv[0], &req, &sf, &errmsg)) != MOAT_OK) {
		rv = cli_fail(cli, rv, errmsg, "building image %s", name);
	} else if ((rv = moat_client_start_image_build(cli_client(cli), &req,
	                &b, &errmsg)) != MOAT_OK) {
		rv = cli_fail(cli, rv, errmsg,
		    "starting the build of image %s", name);
	} else {
		cli_catch_signals();
		rv = follow_build(cli, b);
	}
	spec_files_free(&sf);
	free(def);
	return rv;
}

static int
image_ls(struct cli *cli)
{
	Moat__V1__ImageList *l = NULL;
	char *errmsg = NULL, nodes[256];
	int rv;

	if ((rv = moat_client_list_images(cli_client(cli), NULL, &l,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "listing images");
	if (cli->json) {
		rv = cli_print_json(cli, l);
		moat_client_free_msg(l);
		return rv;
	}
	printf("%-20s %-12s %10s %8s %-24s %s\n", "NAME", "ID", "SIZE",
	    "PACKAGES", "NODES", "STORED");
	for (size_t i = 0; i < l->n_images; i++) {
		const Moat__V1__ImageInfo *im = l->images[i];
		size_t used = 0;

		nodes[0] = '\0';
		for (size_t k = 0; k < im->n_nodes && used < sizeof(nodes);
		     k++)
			used += (size_t)snprintf(nodes + used,
			    sizeof(nodes) - used, "%s%s", k ? "," : "",
			    im->nodes[k]);
		printf("%-20s %-12.12s %8.1fMi %8zu %-24s %s\n", im->name,
		    im->id[0] ? im->id : "-", MIB(im->size_bytes),
		    im->n_packages, nodes[0] ? nodes : "-",
		    im->stored ? "yes" : "no");
	}
	moat_client_free_msg(l);
	return 0;
}

static int
image_rm(struct cli *cli, int argc, char **argv)
{
	Moat__V1__RemoveImageReply *r = NULL;
	char *errmsg = NULL;
	int rv;

	if (argc != 1 || argv[0][0] == '-')
		return cli_usage_error(usage_image, "rm wants one image name");
	if ((rv = moat_client_remove_image(cli_client(cli), argv[0], &r,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "removing image %s", argv[0]);
	if (cli->json) {
		rv = cli_print_json(cli, r);
	} else {
		printf("removed image %s from %zu node(s)", argv[0],
		    r->n_nodes);
		for (size_t i = 0; i < r->n_nodes; i++)
			printf("%s%s", i ? "," : " (", r->nodes[i]);
		printf("%s%s, %.1f MiB freed\n", r->n_nodes ? ")" : "",
		    r->stored_removed ? " and moat-snapd" : "",
		    MIB(r->freed_bytes));
	}
	moat_client_free_msg(r);
	return rv;
}

static int
image_push(struct cli *cli, int argc, char **argv)
{
	Moat__V1__ImageInfo *im = NULL;
	const char *node = NULL;
	char *errmsg = NULL;
	int rv;

	if (argc < 1 || argv[0][0] == '-')
		return cli_usage_error(usage_image,
		    "push wants an image name");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--node") == 0 && i + 1 < argc)
			node = argv[++i];
		else
			return cli_usage_error(usage_image,
			    "\"%s\": push takes NAME [--node ID]", argv[i]);
	}
	if ((rv = moat_client_push_image(cli_client(cli), argv[0], node, &im,
	         &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "pushing image %s", argv[0]);
	if (cli->json)
		rv = cli_print_json(cli, im);
	else
		printf("image %s (%.12s) stored in moat-snapd: %.1f MiB new "
		       "there\n",
		    argv[0], im->id, MIB(im->stored_bytes));
	moat_client_free_msg(im);
	return rv;
}

int
cmd_image(struct cli *cli, int argc, char **argv)
{
	/* argv[0] is "image"; --json anywhere after it. */
	argc--;
	argv++;
	argc = cli_take_json(cli, argc, argv);
	if (argc < 1)
		return cli_usage_error(usage_image,
		    "image wants a subcommand");
	if (strcmp(argv[0], "build") == 0)
		return image_build(cli, argc - 1, argv + 1);
	if (strcmp(argv[0], "ls") == 0)
		return argc == 1 ?
		    image_ls(cli) :
		    cli_usage_error(usage_image,
		        "\"%s\": ls takes no arguments", argv[1]);
	if (strcmp(argv[0], "rm") == 0)
		return image_rm(cli, argc - 1, argv + 1);
	if (strcmp(argv[0], "push") == 0)
		return image_push(cli, argc - 1, argv + 1);
	return cli_usage_error(usage_image, "unknown image subcommand \"%s\"",
	    argv[0]);
}
