/*
 * image_spec.h: the INI spec of a custom guest image (issue 17), parsed
 * and checked in one place: its Debian suite and extra packages, files to
 * copy in, commands run at build time, environment defaults, languages.
 * moat-image-spec prints it for images/build.sh, and its id (the hash of
 * the normalised spec and every source file) keys the build. Not for:
 * building the image (images/build.sh) or storing it (snapd).
 */
#ifndef MOAT_IMAGE_SPEC_H
#define MOAT_IMAGE_SPEC_H

#include <stddef.h>

#define MOAT_IMAGE_SPEC_DEFAULT_SUITE "bookworm"
/* A spec is a small hand-written file; these bound a mistaken one. */
#define MOAT_IMAGE_SPEC_MAX_BYTES (256u << 10)
#define MOAT_IMAGE_SPEC_MAX_ITEMS 1024
/* inih reads lines of at most this many bytes (Debian's build). */
#define MOAT_IMAGE_SPEC_MAX_LINE 199

struct moat_image_spec_file {
	char *guest_path; /* absolute, normalised */
	char *source;     /* a file name in the spec's directory */
	int mode;         /* 0-0777, or -1: the source file's */
};

struct moat_image_spec_env {
	char *key; /* a shell identifier */
	char *value;
};

struct moat_image_spec {
	char *suite;
	char *description; /* "" if none */
	char **packages;
	size_t n_packages;
	char **languages;
	size_t n_languages;
	struct moat_image_spec_file *files;
	size_t n_files;
	char **run; /* in file order */
	size_t n_run;
	struct moat_image_spec_env *env;
	size_t n_env;
};

/* moat_image_spec_parse: parses and checks a spec's text; `name` (the
 * file's path) starts every error. Returns 0 and *out (free with
 * moat_image_spec_free), or a status and *why (heap): which line, what
 * is wrong, what to do. */
int moat_image_spec_parse(const char *text, size_t len, const char *name,
    struct moat_image_spec **out, char **why);

/* moat_image_spec_load: reads and parses the file at path. */
int moat_image_spec_load(const char *path, struct moat_image_spec **out,
    char **why);

/* moat_image_spec_print: the normalised spec, one item a line,
 * "kind<TAB>value[<TAB>value]...": suite, description, package,
 * language, file (guest path, source, mode or "-"), run, env (key,
 * value). Heap string; NULL when out of memory. */
char *moat_image_spec_print(const struct moat_image_spec *spec);

/* moat_image_spec_id: SHA-256 hex of the normalised spec and, for each
 * [files] source in order, its name, size and bytes, read from dir.
 * Fails with *why (heap) when a source is missing or not a regular
 * file. */
int moat_image_spec_id(const struct moat_image_spec *spec, const char *dir,
    char hex[65], char **why);

void moat_image_spec_free(struct moat_image_spec *spec);

#endif
