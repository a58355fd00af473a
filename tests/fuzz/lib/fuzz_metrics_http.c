/*
 * fuzz_metrics_http.c: fuzz target for the metrics listener's request
 * reader (moat_metrics_respond, lib/metrics_server.c), which reads what
 * anyone who reaches a --metrics port sends. Invariants: every input gets
 * an answer that starts with an HTTP/1.1 status line of 200, 400, 404,
 * 405 or 431, whose Content-Length is the body that follows (none for a
 * HEAD), and 200 only for a request naming /metrics. Not for: the socket
 * handling around it (tests/unit/lib/test_metrics.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "moat/metrics.h"

static struct moat_metrics *reg;

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *request, *response = NULL, *end;
	size_t len = 0, body;
	int code;

	if (reg == NULL) {
		const char *labels[] = { "a", "b\"\\\n", NULL };

		if (moat_metrics_new(&reg) != 0)
			abort();
		moat_counter_inc(moat_metrics_counter(reg, "moat_fuzz_total",
		    "F.", labels));
	}
	if ((request = malloc(size + 1)) == NULL)
		return 0;
	memcpy(request, data, size);
	request[size] = '\0';
	code = moat_metrics_respond(reg, request, size, &response, &len);
	moat_fuzz_check(code == 200 || code == 400 || code == 404 ||
	        code == 405 || code == 431,
	    "status");
	moat_fuzz_check(len > 17 && memcmp(response, "HTTP/1.1 ", 9) == 0,
	    "status line");
	end = memmem(response, len, "\r\n\r\n", 4);
	moat_fuzz_check(end != NULL, "end of headers");
	end += 4;
	body = len - (size_t)(end - response);
	/* A HEAD's 200 has no body; every other answer has the body its
	 * Content-Length says. */
	if (code != 200 || body != 0)
		moat_fuzz_check(strstr(response, "Content-Length: ") != NULL &&
		        strtoul(strstr(response, "Content-Length: ") + 16,
		            NULL, 10) == body,
		    "Content-Length");
	if (code == 200)
		moat_fuzz_check(memmem(request, size, "/metrics", 8) != NULL,
		    "200 only for /metrics");
	free(response);
	free(request);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const char *const seeds[] = {
		"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
		"HEAD /metrics HTTP/1.0\n\n",
		"GET /metrics?x=1 HTTP/1.1\r\n\r\n",
		"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
		"GET / HTTP/1.1\r\n\r\n",
		"GET\r\n\r\n",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		add((const uint8_t *)seeds[i], strlen(seeds[i]));
}
