/*
 * image_spec_tool.c: moat-image-spec, the spec parser for images/build.sh
 * (a shell script should not parse INI): prints a custom image's spec,
 * checked, as "kind<TAB>value..." lines, or with --id its id (the hash of
 * the normalised spec and every [files] source). Not for: building
 * anything; the format is in moat/image_spec.h and README.
 *   moat-image-spec [--id] SPEC.ini
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/image_spec.h"

static int
usage(void)
{
	fprintf(stderr,
	    "usage: moat-image-spec [--id] SPEC.ini\n"
	    "  prints the checked spec as kind<TAB>value lines, "
	    "or with --id its id\n");
	return 2;
}

int
main(int argc, char **argv)
{
	struct moat_image_spec *spec;
	char *why = NULL, *text, *copy, hex[65];
	const char *path;
	int want_id = 0, rv;

	if (argc == 3 && strcmp(argv[1], "--id") == 0)
		want_id = 1;
	else if (argc != 2 || argv[1][0] == '-')
		return usage();
	path = argv[argc - 1];
	if (moat_image_spec_load(path, &spec, &why) != 0) {
		fprintf(stderr, "moat-image-spec: %s\n", why);
		free(why);
		return 1;
	}
	/* The id reads every source, so a missing one fails both ways. */
	if ((copy = strdup(path)) == NULL)
		return 1;
	rv = moat_image_spec_id(spec, dirname(copy), hex, &why);
	free(copy);
	if (rv != 0) {
		fprintf(stderr, "moat-image-spec: %s: %s\n", path, why);
		free(why);
		moat_image_spec_free(spec);
		return 1;
	}
	if (want_id) {
		printf("%s\n", hex);
	} else {
		if ((text = moat_image_spec_print(spec)) == NULL)
			return 1;
		fputs(text, stdout);
		free(text);
	}
	moat_image_spec_free(spec);
	return fflush(stdout) == 0 ? 0 : 1;
}
