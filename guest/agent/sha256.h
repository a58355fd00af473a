/*
 * sha256.h: SHA-256 (FIPS 180-4) for the guest agent's fs trace, written
 * here because the agent is a static binary and linking OpenSSL's libcrypto
 * statically is not worth it for one hash. Not for: host services, which
 * use OpenSSL (it is much faster); nothing here is constant-time or meant
 * for keys.
 */
#ifndef MOAT_AGENT_SHA256_H
#define MOAT_AGENT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define AGENT_SHA256_LEN 32

struct agent_sha256 {
	uint32_t state[8];
	uint64_t total;    /* bytes fed so far */
	uint8_t block[64]; /* partial block */
	size_t block_len;
};

/* agent_sha256_init: starts a new digest. No allocation. */
void agent_sha256_init(struct agent_sha256 *h);

/* agent_sha256_update: feeds len bytes (len 0 is fine). */
void agent_sha256_update(struct agent_sha256 *h, const void *data, size_t len);

/* agent_sha256_final: writes the 32-byte digest to out; h must be
 * initialised again before reuse. */
void agent_sha256_final(struct agent_sha256 *h, uint8_t out[AGENT_SHA256_LEN]);

/* agent_sha256: one-shot digest of a buffer. */
void agent_sha256(const void *data, size_t len, uint8_t out[AGENT_SHA256_LEN]);

#endif
