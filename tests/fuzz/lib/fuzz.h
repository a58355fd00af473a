/*
 * fuzz.h: the contract between moat's fuzz targets and whoever runs them.
 * Each target defines LLVMFuzzerTestOneInput (so clang's libFuzzer can
 * drive it) and moat_fuzz_seeds (valid encodings to mutate from, used by
 * fuzz_driver.c when there is no libFuzzer, as with gcc). A target calls
 * abort() when an invariant breaks; bad input itself must never do that.
 * Not for: unit tests (tests/unit).
 */
#ifndef MOAT_FUZZ_H
#define MOAT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* LLVMFuzzerTestOneInput: runs one input; returns 0. `data` is owned by
 * the caller and is only read. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* moat_fuzz_seeds: calls add() with each seed; add copies the bytes. */
void moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len));

/* moat_fuzz_check: abort()s with a message when `ok` is false. */
#define moat_fuzz_check(ok, what)                                             \
	do {                                                                  \
		if (!(ok)) {                                                  \
			fprintf(stderr,                                       \
			    "fuzz invariant broken: %s "                      \
			    "(%s:%d)\n",                                      \
			    (what), __FILE__, __LINE__);                      \
			abort();                                              \
		}                                                             \
	} while (0)

#endif
