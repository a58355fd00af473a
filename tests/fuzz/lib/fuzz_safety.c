/*
 * fuzz_safety.c: fuzz target for the command and code classifier
 * (lib/safety.c, safety_shell.c, safety_code.c), which reads step inputs
 * any client can record. The input's first byte picks the language; the
 * rest is the text (cut at its first NUL, as a C string would be).
 * Invariants: a level in range, a non-empty NUL-terminated reason, and
 * the same answer twice. Not for: whether a verdict is right (unit tests).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "moat/safety.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const langs[] = { "", "bash", "python", "node",
		"sql", NULL };
	struct moat_safety_verdict a, b;
	const char *lang;
	char *text;

	if (size < 1)
		return 0;
	lang = langs[data[0] % (sizeof(langs) / sizeof(langs[0]))];
	if ((text = malloc(size)) == NULL)
		return 0;
	memcpy(text, data + 1, size - 1);
	text[size - 1] = '\0';
	a = moat_safety_classify(text, lang);
	b = moat_safety_classify(text, lang);
	moat_fuzz_check(a.level >= MOAT_SAFETY_READ &&
	        a.level <= MOAT_SAFETY_BLOCKED,
	    "level in range");
	moat_fuzz_check(memchr(a.reason, '\0', sizeof(a.reason)) != NULL &&
	        a.reason[0] != '\0',
	    "reason set and terminated");
	moat_fuzz_check(a.level == b.level && strcmp(a.reason, b.reason) == 0,
	    "same answer twice");
	free(text);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const char *const seeds[] = {
		"\0ls -la / | grep x && echo \"$(rm -rf y)\" > /etc/z",
		"\1:(){ :|:& };:",
		"\1cat <<'EOF' > f\nrm -rf /\nEOF\nsudo -u root dd "
		"of=/dev/sda",
		/* One seed on two lines (parenthesized: not a lost comma). */
		("\2import os, subprocess\nsubprocess.run(['rm', '-rf', "
		 "'x'])\n"
		 "open('/etc/x', 'w').write(\"\"\"a'b\"\"\")  # c"),
		"\3require('child_process').execSync(`ls ${x}`); /* c */",
		"\4DROP TABLE t;",
		"\0sh -c 'eval \"bash -c \\\"rm -rf /\\\"\"'",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		add((const uint8_t *)seeds[i], strlen(seeds[i] + 1) + 1);
}
