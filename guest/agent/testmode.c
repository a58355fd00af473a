/*
 * testmode.c: deliberate misbehaviour for moat-vmd's hostile-guest tests.
 * A mode is chosen only by whoever starts the agent: moat.test=MODE on the
 * guest kernel command line, or --test-mode MODE in host mode; nothing the
 * host sends over the link can turn one on. Not for: production guests
 * (with no mode set nothing here runs).
 *
 * The modes, each starting right after AgentReady on every new host link:
 * - "garbage": sends GARBAGE_FRAMES frames of GARBAGE_LEN random bytes
 *   each. Every length header is honest (the frames are under the cap),
 *   but no body decodes as a GuestMessage: each starts with the byte 0x07,
 *   a tag with field number 0 and wire type 7, which no protobuf decoder
 *   accepts. Then the agent keeps serving requests as usual.
 * - "oversize": sends one length header declaring OVERSIZE_LEN (64 MiB),
 *   a little of the promised body, and then goes silent on that link:
 *   requests are read and thrown away, nothing more is ever sent. The host
 *   must refuse the frame by its header, without waiting or allocating.
 * - "flood": sends ExecOutput events for exec id FLOOD_EXEC_ID, which the
 *   host never started, as fast as the link takes them and forever, while
 *   still serving requests. The host must stay bounded and drop the link.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "agent.h"
#include "moat/log.h"

#define GARBAGE_FRAMES 8
#define GARBAGE_LEN 512
#define OVERSIZE_LEN (64u << 20)
#define FLOOD_EXEC_ID 999999u

static const char *const test_modes[] = { "garbage", "oversize", "flood" };

bool
agent_test_mode_valid(const char *name)
{
	size_t i;

	if (name[0] == '\0')
		return true;
	for (i = 0; i < sizeof(test_modes) / sizeof(test_modes[0]); i++)
		if (strcmp(name, test_modes[i]) == 0)
			return true;
	return false;
}

/* test_random: fills buf; the kernel's generator if it answers at once,
 * else a time-seeded xorshift (randomness quality does not matter). */
static void
test_random(uint8_t *buf, size_t len)
{
	struct timespec ts;
	uint64_t x;
	size_t i;

	if (getrandom(buf, len, GRND_NONBLOCK) == (ssize_t)len)
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull + 1;
	for (i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
}

static void
test_garbage(struct agent *a)
{
	uint8_t frame[4 + GARBAGE_LEN];
	int i;

	frame[0] = 0;
	frame[1] = 0;
	frame[2] = (uint8_t)(GARBAGE_LEN >> 8);
	frame[3] = (uint8_t)GARBAGE_LEN;
	for (i = 0; i < GARBAGE_FRAMES; i++) {
		test_random(frame + 4, GARBAGE_LEN);
		frame[4] = 0x07;
		(void)agent_link_queue_raw(a, frame, sizeof(frame));
	}
}

static void
test_oversize(struct agent *a)
{
	uint8_t frame[4 + 256];

	frame[0] = (uint8_t)(OVERSIZE_LEN >> 24);
	frame[1] = (uint8_t)(OVERSIZE_LEN >> 16);
	frame[2] = (uint8_t)(OVERSIZE_LEN >> 8);
	frame[3] = (uint8_t)OVERSIZE_LEN;
	test_random(frame + 4, sizeof(frame) - 4);
	(void)agent_link_queue_raw(a, frame, sizeof(frame));
	a->link.muted = true;
}

void
agent_test_flood_refill(struct agent *a)
{
	static uint8_t junk[AGENT_CHUNK];
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecOutput out = MOAT__V1__EXEC_OUTPUT__INIT;

	if (junk[0] == 0)
		memset(junk, 'F', sizeof(junk));
	m.id = FLOOD_EXEC_ID;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT;
	m.exec_output = &out;
	out.stream = MOAT__V1__STREAM__STREAM_STDOUT;
	out.data.data = junk;
	out.data.len = sizeof(junk);
	while (a->link.fd >= 0 && a->link.out_bytes < AGENT_OUT_HIGH)
		if (agent_send(a, &m) != 0)
			break;
}

void
agent_test_mode_start(struct agent *a)
{
	moat_warn(0, "test mode %s: misbehaving on purpose", a->test_mode);
	if (strcmp(a->test_mode, "garbage") == 0)
		test_garbage(a);
	else if (strcmp(a->test_mode, "oversize") == 0)
		test_oversize(a);
	else if (strcmp(a->test_mode, "flood") == 0)
		a->link.flooding = true;
}
