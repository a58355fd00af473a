/*
 * config.c: settings with one precedence for every moat program:
 * command-line flag > MOAT_* environment > moat.conf (INI, parsed by inih)
 * > built-in default, and the parsing of numbers and booleans with errors
 * that say which key was wrong and where its value came from. Not for:
 * checking that a value makes sense (callers do), or writing config files.
 */
#include <ctype.h>
#include <stdatomic.h>
#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "moat/config.h"
#include "moat/status.h"
#include "moat/util.h"

#define CONFIG_MAX_ENTRIES 4096 /* a config file is small */
#define CONFIG_MAX_NAME 128

enum config_source {
	SRC_FILE,
	SRC_FLAG,
};

struct config_entry {
	enum config_source source;
	char *section;
	char *key;
	char *value;
	int line; /* in the file, for SRC_FILE */
	struct config_entry *next;
};

struct moat_config {
	char *path; /* the file read, or NULL */
	struct config_entry *entries;
	size_t n_entries;
	/* moat_config_set_overlay: set once, read by any thread. */
	char overlay_section[CONFIG_MAX_NAME];
	_Atomic(moat_config_overlay_fn) overlay;
	void *_Atomic overlay_arg;
};

/* State while inih reads a file: the line being parsed (inih's handler
 * does not get it in Debian's build, so the reader counts). */
struct parse_state {
	struct moat_config *cfg;
	FILE *file;
	int line;
	int at_line_start;
	int failed; /* 0 or a status */
};

static struct config_entry *
config_find(const struct moat_config *cfg, enum config_source source,
    const char *section, const char *key)
{
	struct config_entry *e;

	if (cfg == NULL)
		return NULL;
	for (e = cfg->entries; e != NULL; e = e->next)
		if (e->source == source &&
		    strcasecmp(e->section, section) == 0 &&
		    strcasecmp(e->key, key) == 0)
			return e;
	return NULL;
}

/* Sets (or replaces) one entry; a later line of a file wins over an
 * earlier one, like a later flag over an earlier one. */
static int
config_put(struct moat_config *cfg, enum config_source source,
    const char *section, const char *key, const char *value, int line)
{
	struct config_entry *e = config_find(cfg, source, section, key);
	char *v;

	if ((v = strdup(value)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if (e != NULL) {
		free(e->value);
		e->value = v;
		e->line = line;
		return MOAT_OK;
	}
	if (cfg->n_entries >= CONFIG_MAX_ENTRIES) {
		free(v);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((e = calloc(1, sizeof(*e))) == NULL ||
	    (e->section = strdup(section)) == NULL ||
	    (e->key = strdup(key)) == NULL) {
		if (e != NULL)
			free(e->section);
		free(e);
		free(v);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	e->source = source;
	e->value = v;
	e->line = line;
	e->next = cfg->entries;
	cfg->entries = e;
	cfg->n_entries++;
	return MOAT_OK;
}

static char *
config_read_line(char *str, int num, void *stream)
{
	struct parse_state *st = stream;
	char *s = fgets(str, num, st->file);
	size_t n;

	if (s == NULL)
		return NULL;
	if (st->at_line_start)
		st->line++;
	n = strlen(s);
	st->at_line_start = n > 0 && s[n - 1] == '\n';
	return s;
}

static int
config_on_value(void *user, const char *section, const char *name,
    const char *value)
{
	struct parse_state *st = user;
	int rv;

	if (name == NULL)
		return 1; /* a section header alone */
	if ((rv = config_put(st->cfg, SRC_FILE, section, name,
	         value != NULL ? value : "", st->line)) != MOAT_OK) {
		st->failed = rv;
		return 0;
	}
	return 1;
}

int
moat_config_load(struct moat_config **out, const char *path, char **errmsg)
{
	struct moat_config *cfg;
	struct parse_state st = { 0 };
	const char *why = "";
	int rv, line;

	*out = NULL;
	*errmsg = NULL;
	if ((cfg = calloc(1, sizeof(*cfg))) == NULL) {
		*errmsg = moat_asprintf("out of memory loading the config");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (path == NULL) {
		path = getenv("MOAT_CONFIG");
		why = " (named by MOAT_CONFIG)";
		if (path != NULL && path[0] == '\0')
			path = NULL;
	}
	if (path == NULL && access(MOAT_CONFIG_SYSTEM_PATH, F_OK) == 0) {
		path = MOAT_CONFIG_SYSTEM_PATH;
		why = " (the host's default config)";
	}
	if (path == NULL) {
		*out = cfg;
		return MOAT_OK;
	}
	if ((cfg->path = strdup(path)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory loading %s", path);
		goto fail;
	}
	if ((st.file = fopen(path, "r")) == NULL) {
		int err = errno;

		rv = moat_status_from_errno(err);
		*errmsg = moat_asprintf(
		    "cannot read config file %s%s: %s: "
		    "create it, fix the path, or leave it unset to use "
		    "defaults",
		    path, why, strerror(err));
		goto fail;
	}
	st.cfg = cfg;
	st.at_line_start = 1;
	line = ini_parse_stream(config_read_line, &st, config_on_value, &st);
	fclose(st.file);
	if (st.failed != 0) {
		rv = st.failed;
		*errmsg = moat_asprintf("config file %s: too many settings or "
		                        "out of memory at line %d",
		    path, st.line);
		goto fail;
	}
	if (line != 0) {
		rv = MOAT_INVALID_ARGUMENT;
		*errmsg = moat_asprintf(
		    "config file %s line %d: not a "
		    "[section] or key = value line: fix or remove it",
		    path, line);
		goto fail;
	}
	*out = cfg;
	return MOAT_OK;

fail:
	moat_config_free(cfg);
	return rv;
}

int
moat_config_set_flag(struct moat_config *cfg, const char *section,
    const char *key, const char *value)
{
	if (cfg == NULL || section == NULL || key == NULL || value == NULL)
		return MOAT_INVALID_ARGUMENT;
	return config_put(cfg, SRC_FLAG, section, key, value, 0);
}

/* Writes MOAT_<SECTION>_<KEY> (or MOAT_<KEY> when section is NULL) into
 * buf: upper case, '-' and '.' turned into '_'. False if it is too long. */
static bool
config_env_name(char *buf, size_t size, const char *section, const char *key)
{
	int n;

	if (section != NULL)
		n = snprintf(buf, size, "MOAT_%s_%s", section, key);
	else
		n = snprintf(buf, size, "MOAT_%s", key);
	if (n < 0 || (size_t)n >= size)
		return false;
	for (char *p = buf; *p != '\0'; p++) {
		if (*p == '-' || *p == '.')
			*p = '_';
		else
			*p = (char)toupper((unsigned char)*p);
	}
	return true;
}

/* Finds the value by precedence; *where (static or in `namebuf`) says
 * where it came from, for messages. */
static const char *
config_lookup(const struct moat_config *cfg, const char *section,
    const char *key, char *namebuf, size_t namesize, int *line,
    const char **kind)
{
	struct config_entry *e;
	const char *v;

	*line = 0;
	if ((e = config_find(cfg, SRC_FLAG, section, key)) != NULL) {
		*kind = "flag";
		snprintf(namebuf, namesize, "--%s", key);
		return e->value;
	}
	if (config_env_name(namebuf, namesize, section, key) &&
	    (v = getenv(namebuf)) != NULL) {
		*kind = "environment";
		return v;
	}
	if (strcasecmp(section, "moat") == 0 &&
	    config_env_name(namebuf, namesize, NULL, key) &&
	    (v = getenv(namebuf)) != NULL) {
		*kind = "environment";
		return v;
	}
	if ((e = config_find(cfg, SRC_FILE, section, key)) != NULL) {
		*kind = "file";
		snprintf(namebuf, namesize, "%s", cfg->path);
		*line = e->line;
		return e->value;
	}
	*kind = "default";
	namebuf[0] = '\0';
	return NULL;
}

const char *
moat_config_get(const struct moat_config *cfg, const char *section,
    const char *key, const char *def)
{
	char name[2 * CONFIG_MAX_NAME + 16];
	const char *kind, *v;
	int line;

	v = config_lookup(cfg, section, key, name, sizeof(name), &line, &kind);
	return v != NULL ? v : def;
}

/* A message naming the key and where its bad value came from. */
static char *
config_bad_value(const struct moat_config *cfg, const char *section,
    const char *key, const char *value, const char *want)
{
	char name[2 * CONFIG_MAX_NAME + 16];
	const char *kind;
	int line;

	config_lookup(cfg, section, key, name, sizeof(name), &line, &kind);
	if (strcmp(kind, "file") == 0)
		return moat_asprintf("[%s] %s = \"%s\" in %s line %d is not "
		                     "%s: fix the file",
		    section, key, value, name, line, want);
	if (strcmp(kind, "environment") == 0)
		return moat_asprintf("[%s] %s: %s=\"%s\" in the environment "
		                     "is not %s: fix or unset it",
		    section, key, name, value, want);
	return moat_asprintf("[%s] %s: %s \"%s\" is not %s", section, key,
	    name, value, want);
}

/* parse_u64: `v` as an unsigned decimal (blanks around allowed). */
static bool
parse_u64(const char *v, uint64_t *out)
{
	unsigned long long n;
	const char *p;
	char *end;

	for (p = v; *p == ' ' || *p == '\t'; p++)
		;
	if (!isdigit((unsigned char)*p))
		return false;
	errno = 0;
	n = strtoull(p, &end, 10);
	if (errno != 0)
		return false;
	while (*end == ' ' || *end == '\t')
		end++;
	if (*end != '\0')
		return false;
	*out = (uint64_t)n;
	return true;
}

int
moat_config_get_u64(const struct moat_config *cfg, const char *section,
    const char *key, uint64_t def, uint64_t *out, char **errmsg)
{
	const char *v = moat_config_get(cfg, section, key, NULL);

	*errmsg = NULL;
	*out = def;
	if (v == NULL || parse_u64(v, out))
		return MOAT_OK;
	*out = def;
	*errmsg = config_bad_value(cfg, section, key, v,
	    "an unsigned decimal number");
	return MOAT_INVALID_ARGUMENT;
}

void
moat_config_set_overlay(struct moat_config *cfg, const char *section,
    moat_config_overlay_fn fn, void *arg)
{
	snprintf(cfg->overlay_section, sizeof(cfg->overlay_section), "%s",
	    section);
	atomic_store(&cfg->overlay_arg, arg);
	atomic_store(&cfg->overlay, fn);
}

/* overlay_u64: the overlay's value of `key` for `who`, when it has one;
 * INVALID_ARGUMENT naming it when that is not a number. */
static int
overlay_u64(const struct moat_config *cfg, const char *section,
    const char *key, const char *who, uint64_t *out, bool *found,
    char **errmsg)
{
	moat_config_overlay_fn fn;
	char v[MOAT_CONFIG_KEY_MAX];

	*found = false;
	if (cfg == NULL || (fn = atomic_load(&cfg->overlay)) == NULL ||
	    strcmp(cfg->overlay_section, section) != 0 ||
	    !fn(atomic_load(&cfg->overlay_arg), key, who, v, sizeof(v)))
		return MOAT_OK;
	*found = true;
	if (parse_u64(v, out))
		return MOAT_OK;
	*errmsg = moat_asprintf("[%s] %s of %s: \"%s\" (set with "
	                        "`moat-gateway tenants set`) is not an "
	                        "unsigned decimal number: set it again",
	    section, key, who, v);
	return MOAT_INVALID_ARGUMENT;
}

int
moat_config_get_u64_for(const struct moat_config *cfg, const char *section,
    const char *key, const char *who, uint64_t def, uint64_t *out,
    char **errmsg)
{
	char name[MOAT_CONFIG_KEY_MAX];
	bool found;
	int rv;

	*errmsg = NULL;
	if (who != NULL && who[0] != '\0' &&
	    ((rv = overlay_u64(cfg, section, key, who, out, &found, errmsg)) !=
	            MOAT_OK ||
	        found))
		return rv;
	if (who != NULL && who[0] != '\0' &&
	    (size_t)snprintf(name, sizeof(name), "%s.%s", key, who) <
	        sizeof(name) &&
	    moat_config_get(cfg, section, name, NULL) != NULL)
		return moat_config_get_u64(cfg, section, name, def, out,
		    errmsg);
	return moat_config_get_u64(cfg, section, key, def, out, errmsg);
}

int
moat_config_get_bool(const struct moat_config *cfg, const char *section,
    const char *key, bool def, bool *out, char **errmsg)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };
	const char *v = moat_config_get(cfg, section, key, NULL);

	*errmsg = NULL;
	*out = def;
	if (v == NULL)
		return MOAT_OK;
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*out = true;
			return MOAT_OK;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*out = false;
			return MOAT_OK;
		}
	}
	*errmsg = config_bad_value(cfg, section, key, v,
	    "true/false/yes/no/on/off/1/0");
	return MOAT_INVALID_ARGUMENT;
}

void
moat_config_free(struct moat_config *cfg)
{
	struct config_entry *e, *next;

	if (cfg == NULL)
		return;
	for (e = cfg->entries; e != NULL; e = next) {
		next = e->next;
		free(e->section);
		free(e->key);
		free(e->value);
		free(e);
	}
	free(cfg->path);
	free(cfg);
}

char *
moat_default_state_dir(void)
{
	const char *v;

	if ((v = getenv("MOAT_STATE_DIR")) != NULL && v[0] != '\0')
		return strdup(v);
	if (geteuid() == 0)
		return strdup("/var/lib/moat");
	if ((v = getenv("XDG_STATE_HOME")) != NULL && v[0] == '/')
		return moat_asprintf("%s/moat", v);
	if ((v = getenv("HOME")) != NULL && v[0] == '/')
		return moat_asprintf("%s/.local/state/moat", v);
	return moat_asprintf("/tmp/moat-%u", (unsigned)geteuid());
}

int
moat_config_from_args(int argc, char **argv, const struct option *opts,
    const char *program, const char *section, void (*usage)(FILE *),
    struct moat_config **cfg)
{
	const char *config_path = NULL;
	const char **keys, **vals;
	size_t n_flags = 0;
	char *errmsg = NULL;
	int opt, rv;

	*cfg = NULL;
	/* At most one value per given argument. */
	keys = calloc((size_t)argc + 1, sizeof(*keys));
	vals = calloc((size_t)argc + 1, sizeof(*vals));
	if (keys == NULL || vals == NULL) {
		fprintf(stderr, "%s: out of memory\n", program);
		rv = moat_status_exit_code(MOAT_RESOURCE_EXHAUSTED);
		goto out;
	}
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (opt == 'c') {
			config_path = optarg;
		} else if (opt == 'V') {
			printf("%s %s\n", program, MOAT_VERSION);
			rv = 0;
			goto out;
		} else if (opt == 'h') {
			usage(stdout);
			rv = 0;
			goto out;
		} else if (opt == '?') {
			usage(stderr);
			rv = moat_status_exit_code(MOAT_INVALID_ARGUMENT);
			goto out;
		} else {
			for (const struct option *o = opts; o->name; o++)
				if (o->val == opt && o->flag == NULL) {
					keys[n_flags] = o->name;
					/* --insecure (optional value):
					 * true. */
					vals[n_flags++] =
					    optarg ? optarg : "true";
					break;
				}
		}
	}
	if (optind < argc) {
		fprintf(stderr, "%s: unexpected argument \"%s\"; see --help\n",
		    program, argv[optind]);
		rv = moat_status_exit_code(MOAT_INVALID_ARGUMENT);
		goto out;
	}
	if ((rv = moat_config_load(cfg, config_path, &errmsg)) != MOAT_OK) {
		fprintf(stderr, "%s: %s\n", program,
		    errmsg ? errmsg : moat_strerror(rv));
		rv = moat_status_exit_code(rv);
		goto out;
	}
	for (size_t i = 0; i < n_flags; i++)
		if ((rv = moat_config_set_flag(*cfg, section, keys[i],
		         vals[i])) != MOAT_OK) {
			fprintf(stderr, "%s: --%s: %s\n", program, keys[i],
			    moat_strerror(rv));
			rv = moat_status_exit_code(rv);
			goto out;
		}
	rv = -1;
out:
	if (rv != -1) {
		moat_config_free(*cfg);
		*cfg = NULL;
	}
	free(errmsg);
	free(keys);
	free(vals);
	return rv;
}

char *
moat_config_state_dir(const struct moat_config *cfg, const char *section)
{
	const char *v;

	if (((v = moat_config_get(cfg, section, "state-dir", NULL)) != NULL &&
	        v[0] != '\0') ||
	    ((v = moat_config_get(cfg, "moat", "state-dir", NULL)) != NULL &&
	        v[0] != '\0'))
		return strdup(v);
	return moat_default_state_dir();
}
