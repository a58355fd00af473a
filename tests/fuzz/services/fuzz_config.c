/*
 * fuzz_config.c: fuzz target for the config parser (lib/config.c, INI
 * through inih): any bytes as moat.conf must load or be refused with a
 * message, and what loads must answer lookups (strings, numbers, bools;
 * sections and keys from the file itself and fixed ones) without a
 * crash. The file is a memfd, named by its /proc/self/fd path. Not for:
 * what a service does with a value (each checks its own ranges).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "moat/config.h"

static const char *const keys[][2] = {
	{ "moat", "state-dir" },
	{ "gateway", "rate-limit-rps" },
	{ "gateway", "auth" },
	{ "vmd", "isolation" },
	{ "vmd", "memory-mib" },
	{ "sessiond", "listen" },
	{ "", "" },
	{ "a", "b" },
};

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int fd = -1;
	static char path[64];
	struct moat_config *cfg = NULL;
	char *errmsg = NULL;
	uint64_t n;
	bool b;

	if (fd < 0) {
		moat_fuzz_check((fd = memfd_create("moat.conf", 0)) >= 0,
		    "memfd_create");
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	}
	moat_fuzz_check(ftruncate(fd, 0) == 0, "ftruncate");
	moat_fuzz_check(pwrite(fd, data, size, 0) == (ssize_t)size, "pwrite");
	if (moat_config_load(&cfg, path, &errmsg) != 0) {
		moat_fuzz_check(errmsg != NULL, "a refusal without a message");
		free(errmsg);
		return 0;
	}
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		(void)moat_config_get(cfg, keys[i][0], keys[i][1], NULL);
		if (moat_config_get_u64(cfg, keys[i][0], keys[i][1], 7, &n,
		        &errmsg) != 0) {
			moat_fuzz_check(errmsg != NULL, "u64 without message");
			free(errmsg);
			errmsg = NULL;
		}
		if (moat_config_get_bool(cfg, keys[i][0], keys[i][1], false,
		        &b, &errmsg) != 0) {
			moat_fuzz_check(errmsg != NULL,
			    "bool without message");
			free(errmsg);
			errmsg = NULL;
		}
	}
	/* A section and key named by the input's first line, if short. */
	if (size > 2 && size < 200) {
		char line[200], sec[100] = "", key[100] = "";

		/* sscanf wants a string: the input is not NUL-terminated. */
		memcpy(line, data, size);
		line[size] = '\0';
		if (sscanf(line, "[%99[^]]] %99[^= \n]", sec, key) == 2)
			(void)moat_config_get(cfg, sec, key, NULL);
	}
	moat_config_free(cfg);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const char *const seeds[] = {
		"[moat]\nstate-dir = /var/lib/moat\n",
		"; comment\n[gateway]\nrate-limit-rps = 50\n"
		"rate-limit-burst = 100\nmax-conns-per-addr = 64\nauth = on\n",
		"[vmd]\nisolation = relaxed\nmemory-mib = "
		"18446744073709551615\n"
		"[sessiond]\nlisten = ipc:///tmp/s.sock\n",
		"[a]\nb=\n[a]\nb = 2 ; inline\n  c = \"quoted\"\n",
		"# hash comment\n[policy]\nrefuse.acme = blocked,dangerous\n",
		"[gateway]\nauth = maybe\nrate-limit-rps = -1\n",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		add((const uint8_t *)seeds[i], strlen(seeds[i]));
}
