/*
 * fuzz_driver.c: a stand-in for libFuzzer where there is none (gcc): feeds
 * a target a deterministic stream of inputs, each a few mutations (bit
 * flips, interesting bytes, inserts, deletes, truncation, splices, big
 * varints) of the target's seeds, plus the seeds themselves. Same seed,
 * same inputs, so a failure in CI reproduces with the same command.
 * Usage: fuzz_X [ITERATIONS] | fuzz_X FILE... (run saved inputs) |
 * fuzz_X --write-seeds DIR (the seeds as files, a corpus for libFuzzer).
 * MOAT_FUZZ_SEED changes the stream. Not for: coverage-guided fuzzing
 * (build with clang -fsanitize=fuzzer for that).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

#define MAX_SEEDS 256
#define MAX_INPUT 65536

struct seed {
	uint8_t *data;
	size_t len;
};

static struct seed seeds[MAX_SEEDS];
static size_t n_seeds;
static uint64_t rng_state;

/* The input being run, saved to crash_path if it kills the process. */
static const uint8_t *current;
static size_t current_len;
static char crash_path[256];

static void
on_crash(int sig)
{
	int fd = open(crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	if (fd >= 0) {
		if (write(fd, current, current_len) < 0)
			(void)0;
		close(fd);
	}
	(void)!write(2, "fuzz: input saved to ", 21);
	(void)!write(2, crash_path, strlen(crash_path));
	(void)!write(2, "\n", 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void
run_one(const uint8_t *data, size_t len)
{
	current = data;
	current_len = len;
	LLVMFuzzerTestOneInput(data, len);
}

static void
add_seed(const uint8_t *data, size_t len)
{
	if (n_seeds >= MAX_SEEDS || len > MAX_INPUT)
		return;
	if ((seeds[n_seeds].data = malloc(len ? len : 1)) == NULL)
		return;
	if (len)
		memcpy(seeds[n_seeds].data, data, len);
	seeds[n_seeds].len = len;
	n_seeds++;
}

static uint64_t
rng(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static size_t
below(size_t n)
{
	return n == 0 ? 0 : (size_t)(rng() % n);
}

static size_t
mutate(uint8_t *buf, size_t len)
{
	static const uint8_t interesting[] = { 0x00, 0x01, 0x02, 0x0a, 0x12,
		0x1a, 0x22, 0x7f, 0x80, 0xfe, 0xff };
	static const uint8_t big_varint[] = { 0xff, 0xff, 0xff, 0xff, 0x0f };
	int n = 1 + (int)(below(4) == 0 ? below(8) : below(2));

	for (int i = 0; i < n; i++) {
		size_t pos = below(len + 1), k;

		switch (below(10)) {
		case 0:
			if (len)
				buf[below(len)] ^= (uint8_t)(1u << below(8));
			break;
		case 1:
			if (len)
				buf[below(len)] = (uint8_t)rng();
			break;
		case 2:
			if (len)
				buf[below(len)] =
				    interesting[below(sizeof(interesting))];
			break;
		case 3:
			k = 1 + below(16);
			if (len + k > MAX_INPUT)
				break;
			memmove(buf + pos + k, buf + pos, len - pos);
			for (size_t j = 0; j < k; j++)
				buf[pos + j] = (uint8_t)rng();
			len += k;
			break;
		case 4:
			if (pos >= len)
				break;
			k = 1 + below(len - pos);
			memmove(buf + pos, buf + pos + k, len - pos - k);
			len -= k;
			break;
		case 5:
			len = below(len + 1);
			break;
		case 6:
			if (len == 0 || len * 2 > MAX_INPUT)
				break;
			k = below(len) + 1;
			memmove(buf + pos + k, buf + pos, len - pos);
			memmove(buf + pos, buf, k);
			len += k;
			break;
		case 7: {
			const struct seed *s = &seeds[below(n_seeds)];

			k = below(s->len + 1);
			if (pos + k > MAX_INPUT)
				break;
			memcpy(buf + pos, s->data, k);
			if (pos + k > len)
				len = pos + k;
			break;
		}
		case 8:
			if (pos + sizeof(big_varint) > MAX_INPUT)
				break;
			memcpy(buf + pos, big_varint, sizeof(big_varint));
			if (pos + sizeof(big_varint) > len)
				len = pos + sizeof(big_varint);
			break;
		default:
			k = below(32);
			if (len + k > MAX_INPUT)
				break;
			for (size_t j = 0; j < k; j++)
				buf[len + j] = (uint8_t)rng();
			len += k;
			break;
		}
	}
	return len;
}

static int
run_file(const char *path)
{
	static uint8_t buf[MAX_INPUT];
	FILE *fp = fopen(path, "rb");
	size_t n;

	if (fp == NULL) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return 1;
	}
	n = fread(buf, 1, sizeof(buf), fp);
	fclose(fp);
	LLVMFuzzerTestOneInput(buf, n);
	return 0;
}

/* write_seeds: each seed as DIR/seed-N. */
static int
write_seeds(const char *dir)
{
	char path[4096];

	moat_fuzz_seeds(add_seed);
	for (size_t i = 0; i < n_seeds; i++) {
		FILE *fp;

		snprintf(path, sizeof(path), "%s/seed-%02zu", dir, i);
		if ((fp = fopen(path, "wb")) == NULL ||
		    fwrite(seeds[i].data, 1, seeds[i].len, fp) !=
		        seeds[i].len ||
		    fclose(fp) != 0) {
			fprintf(stderr, "%s: %s\n", path, strerror(errno));
			return 1;
		}
	}
	printf("%zu seeds written to %s\n", n_seeds, dir);
	return 0;
}

int
main(int argc, char **argv)
{
	static uint8_t buf[MAX_INPUT];
	unsigned long iterations = 20000;
	const char *seed_env = getenv("MOAT_FUZZ_SEED");
	char *end;

	if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0)
		return write_seeds(argv[2]);
	if (argc > 1) {
		iterations = strtoul(argv[1], &end, 10);
		if (*end != '\0') {
			int rv = 0;

			for (int i = 1; i < argc; i++)
				rv |= run_file(argv[i]);
			return rv;
		}
	}
	snprintf(crash_path, sizeof(crash_path), "%s.crash", argv[0]);
	signal(SIGABRT, on_crash);
	signal(SIGSEGV, on_crash);
	signal(SIGBUS, on_crash);
	signal(SIGFPE, on_crash);
	rng_state = seed_env != NULL ? strtoull(seed_env, NULL, 0) : 0;
	if (rng_state == 0)
		rng_state = 0x6d6f6174u; /* "moat" */
	moat_fuzz_seeds(add_seed);
	if (n_seeds == 0)
		add_seed((const uint8_t *)"", 0);
	for (size_t i = 0; i < n_seeds; i++)
		run_one(seeds[i].data, seeds[i].len);
	for (unsigned long i = 0; i < iterations; i++) {
		const struct seed *s = &seeds[below(n_seeds)];
		size_t len;

		if (below(50) == 0) {
			len = below(256);
			for (size_t j = 0; j < len; j++)
				buf[j] = (uint8_t)rng();
		} else {
			memcpy(buf, s->data, s->len);
			len = mutate(buf, s->len);
		}
		run_one(buf, len);
	}
	for (size_t i = 0; i < n_seeds; i++)
		free(seeds[i].data);
	printf("%lu inputs, %zu seeds: no invariant broken\n",
	    iterations + n_seeds, n_seeds);
	return 0;
}
