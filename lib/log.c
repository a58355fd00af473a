/*
 * log.c: one line per event on stderr, with level, component and request
 * id. Not for: metrics or client-facing text.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "moat/log.h"

static char log_component[32] = "moat";
static enum moat_log_level log_min = MOAT_LOG_INFO;

static const char *const level_names[] = { "DEBUG", "INFO", "WARN", "ERROR" };

void
moat_log_init(const char *component, enum moat_log_level level)
{
	const char *env = getenv("MOAT_LOG_LEVEL");

	snprintf(log_component, sizeof(log_component), "%s", component);
	log_min = level;
	if (env == NULL)
		return;
	for (int i = 0; i < 4; i++)
		if (strcasecmp(env, level_names[i]) == 0)
			log_min = (enum moat_log_level)i;
	if (strcasecmp(env, "warning") == 0)
		log_min = MOAT_LOG_WARN;
}

void
moat_log(enum moat_log_level level, uint64_t request_id, const char *fmt, ...)
{
	char line[2048];
	char rid[20];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n, m;

	if (level < log_min)
		return;
	if (level > MOAT_LOG_ERROR)
		level = MOAT_LOG_ERROR;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	if (request_id == 0)
		snprintf(rid, sizeof(rid), "-");
	else
		snprintf(rid, sizeof(rid), "%016llx",
		    (unsigned long long)request_id);
	n = snprintf(line, sizeof(line),
	    "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s req=%s ",
	    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
	    tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_names[level],
	    log_component, rid);
	if (n < 0 || (size_t)n >= sizeof(line))
		return;
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	/* One event, one line: a message with newlines (a guest's console)
	 * must not forge log lines. */
	for (int i = 0; i < n; i++)
		if (line[i] == '\n' || line[i] == '\r')
			line[i] = ' ';
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}
