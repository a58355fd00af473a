/*
 * envfile.c: an image's environment defaults (issue 17): /etc/moat/env
 * in the guest's root, KEY=value lines that images/build.sh writes from a
 * spec's [env], added to the default environment of every exec and code
 * context; and the layering of defaults, image, egress and request
 * variables into one environment. The file is read at each exec or
 * context start (a few hundred bytes), so what the sandbox's overlay
 * holds now is what applies. Not for: the per-request env (exec.c checks
 * it) or the egress proxy's variables (egress.c decides when).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "moat/log.h"
#include "moat/status.h"

#define ENVFILE_PATH "/etc/moat/env"
#define ENVFILE_MAX_BYTES (64u << 10)
#define ENVFILE_MAX_VARS 256

static bool
envfile_key_ok(const char *s, size_t n)
{
	size_t i;

	if (n == 0 || (s[0] >= '0' && s[0] <= '9'))
		return false;
	for (i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		        (s[i] >= 'A' && s[i] <= 'Z') ||
		        (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	return true;
}

/* envfile_split: the buffer's lines as KEY=value entries, in place.
 * Blank lines and # comments are skipped; a bad line is logged once
 * and left out (the image builder never writes one). */
static void
envfile_split(struct agent_env *e)
{
	char *line = e->buf, *nl;
	const char *eq;

	for (; line != NULL && *line != '\0'; line = nl) {
		if ((nl = strchr(line, '\n')) != NULL)
			*nl++ = '\0';
		if (line[0] == '\0' || line[0] == '#')
			continue;
		eq = strchr(line, '=');
		if (eq == NULL || !envfile_key_ok(line, (size_t)(eq - line)) ||
		    e->n >= ENVFILE_MAX_VARS) {
			moat_warn(0,
			    "%s: line \"%.40s\" is not KEY=value: left "
			    "out",
			    ENVFILE_PATH, line);
			continue;
		}
		e->vars[e->n++] = line;
	}
}

int
agent_env_image(struct agent *a, struct agent_env *e)
{
	ssize_t n;
	size_t len = 0;
	int fd;

	memset(e, 0, sizeof(*e));
	/* Host mode without --root serves the host's own "/": its /etc is
	 * not an image's. */
	if (!a->pid1 && !a->confined)
		return MOAT_OK;
	fd = agent_path_open(a, ENVFILE_PATH, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return MOAT_OK; /* no defaults in this image */
	e->buf = malloc(ENVFILE_MAX_BYTES + 1);
	e->vars = calloc(ENVFILE_MAX_VARS, sizeof(char *));
	if (e->buf == NULL || e->vars == NULL) {
		close(fd);
		agent_env_free(e);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	while (len < ENVFILE_MAX_BYTES &&
	    (n = read(fd, e->buf + len, ENVFILE_MAX_BYTES - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	e->buf[len] = '\0';
	envfile_split(e);
	return MOAT_OK;
}

void
agent_env_free(struct agent_env *e)
{
	free(e->buf);
	free(e->vars);
	memset(e, 0, sizeof(*e));
}

static bool
envfile_same_key(const char *a, const char *b)
{
	size_t k = strcspn(a, "=");

	return strncmp(a, b, k) == 0 && b[k] == '=';
}

char **
agent_env_layers(const char *const *const *layers, const size_t *n,
    size_t n_layers)
{
	size_t total = 0, out = 0, l, i, m, j;
	char **envp;
	bool later;

	for (l = 0; l < n_layers; l++)
		total += n[l];
	if ((envp = calloc(total + 1, sizeof(char *))) == NULL)
		return NULL;
	for (l = 0; l < n_layers; l++)
		for (i = 0; i < n[l]; i++) {
			later = false;
			for (m = l + 1; m < n_layers && !later; m++)
				for (j = 0; j < n[m] && !later; j++)
					later = envfile_same_key(layers[l][i],
					    layers[m][j]);
			if (!later)
				envp[out++] = (char *)layers[l][i];
		}
	return envp;
}
