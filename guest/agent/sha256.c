/*
 * sha256.c: a plain SHA-256 (FIPS 180-4) used by the fs trace to hash the
 * files a step changed. Written from the standard: the message is cut in
 * 64-byte blocks, each mixed into eight 32-bit state words over 64 rounds.
 * Not for: passwords, keys, or anything needing constant time; the host
 * side hashes with OpenSSL.
 */
#include <string.h>

#include "sha256.h"

static const uint32_t sha256_k[64] = {
	0x428a2f98,
	0x71374491,
	0xb5c0fbcf,
	0xe9b5dba5,
	0x3956c25b,
	0x59f111f1,
	0x923f82a4,
	0xab1c5ed5,
	0xd807aa98,
	0x12835b01,
	0x243185be,
	0x550c7dc3,
	0x72be5d74,
	0x80deb1fe,
	0x9bdc06a7,
	0xc19bf174,
	0xe49b69c1,
	0xefbe4786,
	0x0fc19dc6,
	0x240ca1cc,
	0x2de92c6f,
	0x4a7484aa,
	0x5cb0a9dc,
	0x76f988da,
	0x983e5152,
	0xa831c66d,
	0xb00327c8,
	0xbf597fc7,
	0xc6e00bf3,
	0xd5a79147,
	0x06ca6351,
	0x14292967,
	0x27b70a85,
	0x2e1b2138,
	0x4d2c6dfc,
	0x53380d13,
	0x650a7354,
	0x766a0abb,
	0x81c2c92e,
	0x92722c85,
	0xa2bfe8a1,
	0xa81a664b,
	0xc24b8b70,
	0xc76c51a3,
	0xd192e819,
	0xd6990624,
	0xf40e3585,
	0x106aa070,
	0x19a4c116,
	0x1e376c08,
	0x2748774c,
	0x34b0bcb5,
	0x391c0cb3,
	0x4ed8aa4a,
	0x5b9cca4f,
	0x682e6ff3,
	0x748f82ee,
	0x78a5636f,
	0x84c87814,
	0x8cc70208,
	0x90befffa,
	0xa4506ceb,
	0xbef9a3f7,
	0xc67178f2,
};

static uint32_t
sha256_rotr(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

static void
sha256_block(uint32_t state[8], const uint8_t *p)
{
	uint32_t w[64], a, b, c, d, e, f, g, h, t1, t2;
	int i;

	for (i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 |
		    (uint32_t)p[4 * i + 1] << 16 |
		    (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
	for (i = 16; i < 64; i++) {
		uint32_t s0 = sha256_rotr(w[i - 15], 7) ^
		    sha256_rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = sha256_rotr(w[i - 2], 17) ^
		    sha256_rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);

		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = state[0];
	b = state[1];
	c = state[2];
	d = state[3];
	e = state[4];
	f = state[5];
	g = state[6];
	h = state[7];
	for (i = 0; i < 64; i++) {
		t1 = h +
		    (sha256_rotr(e, 6) ^ sha256_rotr(e, 11) ^
		        sha256_rotr(e, 25)) +
		    ((e & f) ^ (~e & g)) + sha256_k[i] + w[i];
		t2 = (sha256_rotr(a, 2) ^ sha256_rotr(a, 13) ^
		         sha256_rotr(a, 22)) +
		    ((a & b) ^ (a & c) ^ (b & c));
		h = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	state[0] += a;
	state[1] += b;
	state[2] += c;
	state[3] += d;
	state[4] += e;
	state[5] += f;
	state[6] += g;
	state[7] += h;
}

void
agent_sha256_init(struct agent_sha256 *h)
{
	static const uint32_t iv[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372,
		0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };

	memcpy(h->state, iv, sizeof(iv));
	h->total = 0;
	h->block_len = 0;
}

void
agent_sha256_update(struct agent_sha256 *h, const void *data, size_t len)
{
	const uint8_t *p = data;

	h->total += len;
	if (h->block_len > 0) {
		size_t take = 64 - h->block_len;

		if (take > len)
			take = len;
		memcpy(h->block + h->block_len, p, take);
		h->block_len += take;
		p += take;
		len -= take;
		if (h->block_len < 64)
			return;
		sha256_block(h->state, h->block);
		h->block_len = 0;
	}
	while (len >= 64) {
		sha256_block(h->state, p);
		p += 64;
		len -= 64;
	}
	memcpy(h->block, p, len);
	h->block_len = len;
}

void
agent_sha256_final(struct agent_sha256 *h, uint8_t out[AGENT_SHA256_LEN])
{
	uint64_t bits = h->total * 8;
	int i;

	h->block[h->block_len++] = 0x80;
	if (h->block_len > 56) {
		memset(h->block + h->block_len, 0, 64 - h->block_len);
		sha256_block(h->state, h->block);
		h->block_len = 0;
	}
	memset(h->block + h->block_len, 0, 56 - h->block_len);
	for (i = 0; i < 8; i++)
		h->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
	sha256_block(h->state, h->block);
	for (i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(h->state[i] >> 24);
		out[4 * i + 1] = (uint8_t)(h->state[i] >> 16);
		out[4 * i + 2] = (uint8_t)(h->state[i] >> 8);
		out[4 * i + 3] = (uint8_t)h->state[i];
	}
}

void
agent_sha256(const void *data, size_t len, uint8_t out[AGENT_SHA256_LEN])
{
	struct agent_sha256 h;

	agent_sha256_init(&h);
	agent_sha256_update(&h, data, len);
	agent_sha256_final(&h, out);
}
