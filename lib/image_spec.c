/*
 * image_spec.c: parses and checks a custom image's INI spec (see
 * moat/image_spec.h and README "Custom images") with inih, strictly:
 * every unknown section or key, bad name or odd byte is an error naming
 * its line, because build.sh hands these values to apt, cp and a root
 * shell on the build node. Also the normalised form and the spec id.
 * Not for: running the build (images/build.sh).
 */
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/image_spec.h"
#include "moat/status.h"
#include "moat/util.h"

/* Reading state: inih's handler gets no line number in Debian's build,
 * so the reader counts lines and checks what inih would silently change
 * (long lines split, inline comments cut, continuation lines joined). */
struct spec_parse {
	const char *name;
	const char *text;
	size_t len, off;
	int line;
	struct moat_image_spec *spec;
	char *why; /* the first error */
	bool seen_suite, seen_packages, seen_languages, seen_description;
};

static int __attribute__((format(printf, 2, 3)))
spec_fail(struct spec_parse *p, const char *fmt, ...)
{
	char *msg = NULL;
	va_list ap;

	if (p->why != NULL)
		return 0;
	va_start(ap, fmt);
	if (vasprintf(&msg, fmt, ap) < 0)
		msg = NULL;
	va_end(ap);
	p->why = moat_asprintf("%s line %d: %s", p->name, p->line,
	    msg ? msg : "out of memory");
	free(msg);
	return 0;
}

/* spec_read_line: inih's reader over the spec's text. A NULL return ends
 * the parse; an error found here is kept in p->why. */
static char *
spec_read_line(char *str, int num, void *stream)
{
	struct spec_parse *p = stream;
	const char *s, *nl;
	size_t n, i;
	bool blank = true;

	if (p->why != NULL || p->off >= p->len)
		return NULL;
	s = p->text + p->off;
	nl = memchr(s, '\n', p->len - p->off);
	n = nl ? (size_t)(nl - s) + 1 : p->len - p->off;
	p->off += n;
	p->line++;
	if (memchr(s, '\0', n) != NULL) {
		spec_fail(p, "a NUL byte%s%s: specs are text", "", "");
		return NULL;
	}
	if (n > MOAT_IMAGE_SPEC_MAX_LINE || (int)n >= num) {
		spec_fail(p,
		    "longer than 199 bytes%s%s: shorten it (a long command "
		    "can be a script under [files], run by a [run] line)",
		    "", "");
		return NULL;
	}
	for (i = 0; i < n && s[i] != '\n'; i++) {
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
			blank = false;
		if (i > 0 && !blank && s[i] == ';' &&
		    (s[i - 1] == ' ' || s[i - 1] == '\t') && s[0] != ';' &&
		    s[0] != '#') {
			spec_fail(p,
			    "\" ;\" starts a comment in an INI file%s%s: "
			    "write \"a; b\" or \"a && b\" without the "
			    "space, or use a script under [files]",
			    "", "");
			return NULL;
		}
	}
	if (!blank && (s[0] == ' ' || s[0] == '\t')) {
		spec_fail(p,
		    "starts with a space%s%s: continuation lines are not "
		    "allowed; put each item on its own line, unindented",
		    "", "");
		return NULL;
	}
	memcpy(str, s, n);
	str[n] = '\0';
	return str;
}

static bool
spec_debian_name(const char *s)
{
	size_t i, n = strlen(s);

	/* Debian policy 5.6.1: lower case letters, digits, + - . ; at
	 * least two characters, starting with a letter or digit. */
	if (n < 2 || n > 128 ||
	    !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9')))
		return false;
	for (i = 1; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		        (s[i] >= '0' && s[i] <= '9') || s[i] == '+' ||
		        s[i] == '-' || s[i] == '.'))
			return false;
	return true;
}

static bool
spec_identifier(const char *s, bool upper_ok)
{
	size_t i;

	if (s[0] == '\0' || (s[0] >= '0' && s[0] <= '9') || strlen(s) > 128)
		return false;
	for (i = 0; s[i] != '\0'; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		        (upper_ok && s[i] >= 'A' && s[i] <= 'Z') ||
		        (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	return true;
}

static int
spec_push(char ***list, size_t *n, char *item)
{
	char **grown;

	if (item == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if (*n >= MOAT_IMAGE_SPEC_MAX_ITEMS) {
		free(item);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((grown = realloc(*list, (*n + 1) * sizeof(**list))) == NULL) {
		free(item);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	grown[(*n)++] = item;
	*list = grown;
	return MOAT_OK;
}

/* spec_words: splits a space/comma list into *list, each word checked by
 * its rule (Debian package names or language identifiers). */
static int
spec_words(struct spec_parse *p, const char *key, const char *value,
    char ***list, size_t *n)
{
	char *copy = strdup(value), *save = NULL, *w;
	bool pkg = strcmp(key, "packages") == 0;
	size_t i;

	if (copy == NULL)
		return spec_fail(p, "out of memory%s%s", "", "");
	for (w = strtok_r(copy, " ,", &save); w != NULL;
	     w = strtok_r(NULL, " ,", &save)) {
		if (pkg ? !spec_debian_name(w) : !spec_identifier(w, false)) {
			spec_fail(p,
			    pkg ? "\"%s\" is not a Debian package name "
			          "(lower case letters, digits, + - .): "
			          "list names only, no options or versions%s" :
			          "\"%s\" is not a language name (lower case "
			          "letters, digits, _), e.g. python node "
			          "bash%s",
			    w, "");
			break;
		}
		for (i = 0; i < *n && strcmp((*list)[i], w) != 0; i++)
			;
		if (i < *n)
			continue; /* listed twice: once is enough */
		if (spec_push(list, n, strdup(w)) != MOAT_OK) {
			spec_fail(p, "too many %s (at most 1024)%s", key, "");
			break;
		}
	}
	free(copy);
	return p->why == NULL;
}

static int
spec_on_image(struct spec_parse *p, const char *key, const char *value)
{
	struct moat_image_spec *s = p->spec;
	bool *seen = strcmp(key, "suite") == 0 ? &p->seen_suite :
	    strcmp(key, "packages") == 0       ? &p->seen_packages :
	    strcmp(key, "languages") == 0      ? &p->seen_languages :
	    strcmp(key, "description") == 0    ? &p->seen_description :
	                                         NULL;

	if (seen == NULL)
		return spec_fail(p,
		    "unknown key \"%s\" in [image]%s: the keys are suite, "
		    "packages, languages, description",
		    key, "");
	if (*seen)
		return spec_fail(p,
		    "\"%s\" is set twice in [image]%s: keep one line", key,
		    "");
	*seen = true;
	if (strcmp(key, "suite") == 0) {
		if (!spec_debian_name(value) || strchr(value, '+') != NULL)
			return spec_fail(p,
			    "suite \"%s\" is not a Debian suite name (e.g. "
			    "bookworm, trixie, bookworm-backports)%s",
			    value, "");
		free(s->suite);
		return (s->suite = strdup(value)) != NULL ||
		    spec_fail(p, "out of memory%s%s", "", "");
	}
	if (strcmp(key, "description") == 0) {
		free(s->description);
		return (s->description = strdup(value)) != NULL ||
		    spec_fail(p, "out of memory%s%s", "", "");
	}
	if (strcmp(key, "packages") == 0)
		return spec_words(p, key, value, &s->packages, &s->n_packages);
	return spec_words(p, key, value, &s->languages, &s->n_languages);
}

/* spec_guest_path: the normalised form of an absolute guest path ("//"
 * and "/./" folded, no trailing "/"), or NULL with p->why set. */
static char *
spec_guest_path(struct spec_parse *p, const char *key)
{
	static const char *const banned[] = { "/proc", "/sys", "/dev" };
	char *out = malloc(strlen(key) + 1), *o = out;
	const char *c = key, *end;
	size_t i, n;

	if (out == NULL || key[0] != '/') {
		free(out);
		spec_fail(p,
		    "[files] key \"%s\" is not an absolute guest path%s: "
		    "write /path/in/the/image = SOURCE[:MODE]",
		    key, "");
		return NULL;
	}
	for (i = 0; key[i] != '\0'; i++)
		if (!((key[i] >= 'a' && key[i] <= 'z') ||
		        (key[i] >= 'A' && key[i] <= 'Z') ||
		        (key[i] >= '0' && key[i] <= '9') ||
		        strchr("/._+-@%", key[i]) != NULL))
			break;
	while (key[i] == '\0' && *c != '\0') {
		while (*c == '/')
			c++;
		end = c + strcspn(c, "/");
		n = (size_t)(end - c);
		if (n == 2 && c[0] == '.' && c[1] == '.')
			break;
		if (n > 0 && !(n == 1 && c[0] == '.')) {
			*o++ = '/';
			memcpy(o, c, n);
			o += n;
		}
		c = end;
	}
	*o = '\0';
	if (key[i] != '\0' || *c != '\0' || out[0] == '\0') {
		free(out);
		spec_fail(p,
		    "guest path \"%s\" must be a file path of letters, "
		    "digits and / . _ + - @ %% without \"..\"%s",
		    key, "");
		return NULL;
	}
	for (i = 0; i < sizeof(banned) / sizeof(banned[0]); i++) {
		n = strlen(banned[i]);
		if (strncmp(out, banned[i], n) == 0 &&
		    (out[n] == '\0' || out[n] == '/')) {
			spec_fail(p,
			    "guest path \"%s\" is under %s, which the guest's "
			    "kernel mounts over: choose another path",
			    out, banned[i]);
			free(out);
			return NULL;
		}
	}
	return out;
}

/* spec_source: SOURCE[:MODE] of a [files] line into f. */
static int
spec_source(struct spec_parse *p, const char *value,
    struct moat_image_spec_file *f)
{
	const char *colon = strrchr(value, ':');
	size_t n = colon ? (size_t)(colon - value) : strlen(value), i;
	char *end;
	long mode;

	f->mode = -1;
	if (colon != NULL) {
		errno = 0;
		mode = strtol(colon + 1, &end, 8);
		if (colon[1] == '\0' || *end != '\0' || errno != 0 ||
		    mode < 0 || mode > 0777)
			return spec_fail(p,
			    "mode \"%s\" is not an octal mode from 0 to "
			    "0777%s (setuid and sticky bits are not "
			    "allowed): write e.g. run.sh:0755",
			    colon + 1, "");
		f->mode = (int)mode;
	}
	for (i = 0; i < n; i++)
		if (!((value[i] >= 'a' && value[i] <= 'z') ||
		        (value[i] >= 'A' && value[i] <= 'Z') ||
		        (value[i] >= '0' && value[i] <= '9') ||
		        strchr("._+-", value[i]) != NULL))
			break;
	if (n == 0 || i < n || value[0] == '.' || value[0] == '-')
		return spec_fail(p,
		    "source \"%s\" must be a file name in the spec's "
		    "directory (letters, digits, . _ + -; no / or leading "
		    ". or -)%s",
		    value, "");
	if ((f->source = strndup(value, n)) == NULL)
		return spec_fail(p, "out of memory%s%s", "", "");
	return 1;
}

static int
spec_on_files(struct spec_parse *p, const char *key, const char *value)
{
	struct moat_image_spec *s = p->spec;
	struct moat_image_spec_file f = { 0 }, *grown;
	size_t i;

	if ((f.guest_path = spec_guest_path(p, key)) == NULL)
		return 0;
	for (i = 0; i < s->n_files; i++)
		if (strcmp(s->files[i].guest_path, f.guest_path) == 0) {
			spec_fail(p,
			    "guest path %s is listed twice in [files]%s: "
			    "keep one line",
			    f.guest_path, "");
			free(f.guest_path);
			return 0;
		}
	if (!spec_source(p, value, &f) ||
	    s->n_files >= MOAT_IMAGE_SPEC_MAX_ITEMS ||
	    (grown = realloc(s->files, (s->n_files + 1) * sizeof(f))) ==
	        NULL) {
		free(f.guest_path);
		free(f.source);
		return spec_fail(p, "too many [files] (at most 1024)%s%s", "",
		    "");
	}
	grown[s->n_files++] = f;
	s->files = grown;
	return 1;
}

static int
spec_on_env(struct spec_parse *p, const char *key, const char *value)
{
	struct moat_image_spec *s = p->spec;
	struct moat_image_spec_env e, *grown;
	size_t i;

	if (!spec_identifier(key, true))
		return spec_fail(p,
		    "[env] key \"%s\" is not a shell variable name (letters, "
		    "digits, _; not starting with a digit)%s",
		    key, "");
	for (i = 0; i < s->n_env; i++)
		if (strcmp(s->env[i].key, key) == 0)
			return spec_fail(p,
			    "%s is set twice in [env]%s: keep one line", key,
			    "");
	e.key = strdup(key);
	e.value = strdup(value);
	if (e.key == NULL || e.value == NULL ||
	    s->n_env >= MOAT_IMAGE_SPEC_MAX_ITEMS ||
	    (grown = realloc(s->env, (s->n_env + 1) * sizeof(e))) == NULL) {
		free(e.key);
		free(e.value);
		return spec_fail(p, "too many [env] keys (at most 1024)%s%s",
		    "", "");
	}
	grown[s->n_env++] = e;
	s->env = grown;
	return 1;
}

/* Values reach build.sh as tab-separated lines and the manifest's JSON:
 * no byte below 0x20 nor DEL. */
static bool
spec_has_control(const char *s)
{
	for (; *s != '\0'; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

static int
spec_on_value(void *user, const char *section, const char *key,
    const char *value)
{
	struct spec_parse *p = user;

	if (p->why != NULL)
		return 0;
	if (spec_has_control(key) || spec_has_control(value))
		return spec_fail(p,
		    "a control character (tab, carriage return...) in "
		    "\"%s\"%s: use spaces and Unix line ends",
		    key, "");
	if (section[0] == '\0')
		return spec_fail(p,
		    "\"%s\" comes before any section%s: start with [image]",
		    key, "");
	if (strcmp(section, "image") == 0)
		return spec_on_image(p, key, value);
	if (strcmp(section, "files") == 0)
		return spec_on_files(p, key, value);
	if (strcmp(section, "env") == 0)
		return spec_on_env(p, key, value);
	if (strcmp(section, "run") != 0)
		return spec_fail(p,
		    "unknown section [%s]%s: the sections are [image], "
		    "[files], [run], [env]",
		    section, "");
	if (strcmp(key, "cmd") != 0)
		return spec_fail(p,
		    "unknown key \"%s\" in [run]%s: write cmd = COMMAND, one "
		    "line per command",
		    key, "");
	if (value[0] == '\0')
		return spec_fail(p, "empty cmd in [run]%s%s: remove the line",
		    "", "");
	if (spec_push(&p->spec->run, &p->spec->n_run, strdup(value)) !=
	    MOAT_OK)
		return spec_fail(p, "too many [run] lines (at most 1024)%s%s",
		    "", "");
	return 1;
}

int
moat_image_spec_parse(const char *text, size_t len, const char *name,
    struct moat_image_spec **out, char **why)
{
	struct spec_parse p = { .name = name, .text = text, .len = len };
	int line;

	*out = NULL;
	*why = NULL;
	if ((p.spec = calloc(1, sizeof(*p.spec))) == NULL ||
	    (p.spec->description = strdup("")) == NULL ||
	    (p.spec->suite = strdup(MOAT_IMAGE_SPEC_DEFAULT_SUITE)) == NULL) {
		moat_image_spec_free(p.spec);
		*why = moat_asprintf("%s: out of memory", name);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	line = ini_parse_stream(spec_read_line, &p, spec_on_value, &p);
	if (p.why == NULL && line != 0) {
		p.line = line;
		spec_fail(&p,
		    "not a [section], key = value line or comment%s%s: fix "
		    "or remove it",
		    "", "");
	}
	if (p.why != NULL) {
		moat_image_spec_free(p.spec);
		*why = p.why;
		return MOAT_INVALID_ARGUMENT;
	}
	*out = p.spec;
	return MOAT_OK;
}

int
moat_image_spec_load(const char *path, struct moat_image_spec **out,
    char **why)
{
	char *text;
	size_t len;
	int err, rv;

	*out = NULL;
	*why = NULL;
	err = moat_read_file(path, MOAT_IMAGE_SPEC_MAX_BYTES, &text, &len);
	if (err != 0) {
		*why = moat_asprintf("cannot read spec %s: %s%s", path,
		    strerror(err),
		    err == EFBIG ? " (a spec is at most 256 KiB)" : "");
		return moat_status_from_errno(err);
	}
	rv = moat_image_spec_parse(text, len, path, out, why);
	free(text);
	return rv;
}

/* spec_cat: appends printf output to *buf (heap, *len bytes so far);
 * on allocation failure frees *buf and leaves NULL. */
static void __attribute__((format(printf, 3, 4)))
spec_cat(char **buf, size_t *len, const char *fmt, ...)
{
	va_list ap;
	char *more = NULL, *grown;
	int n;

	if (*buf == NULL)
		return;
	va_start(ap, fmt);
	n = vasprintf(&more, fmt, ap);
	va_end(ap);
	if (n < 0 || (grown = realloc(*buf, *len + (size_t)n + 1)) == NULL) {
		free(*buf);
		free(n < 0 ? NULL : more);
		*buf = NULL;
		return;
	}
	memcpy(grown + *len, more, (size_t)n + 1);
	*len += (size_t)n;
	*buf = grown;
	free(more);
}

char *
moat_image_spec_print(const struct moat_image_spec *s)
{
	char *buf = strdup("");
	size_t len = 0, i;

	spec_cat(&buf, &len, "suite\t%s\n", s->suite);
	if (s->description[0] != '\0')
		spec_cat(&buf, &len, "description\t%s\n", s->description);
	for (i = 0; i < s->n_packages; i++)
		spec_cat(&buf, &len, "package\t%s\n", s->packages[i]);
	for (i = 0; i < s->n_languages; i++)
		spec_cat(&buf, &len, "language\t%s\n", s->languages[i]);
	for (i = 0; i < s->n_files; i++) {
		if (s->files[i].mode < 0)
			spec_cat(&buf, &len, "file\t%s\t%s\t-\n",
			    s->files[i].guest_path, s->files[i].source);
		else
			spec_cat(&buf, &len, "file\t%s\t%s\t%04o\n",
			    s->files[i].guest_path, s->files[i].source,
			    (unsigned)s->files[i].mode);
	}
	for (i = 0; i < s->n_run; i++)
		spec_cat(&buf, &len, "run\t%s\n", s->run[i]);
	for (i = 0; i < s->n_env; i++)
		spec_cat(&buf, &len, "env\t%s\t%s\n", s->env[i].key,
		    s->env[i].value);
	return buf;
}

/* spec_hash_source: adds "name size\n" and the bytes of one source file
 * (a regular file, not followed through a symlink) to the digest. */
static int
spec_hash_source(EVP_MD_CTX *md, const char *dir, const char *source,
    char **why)
{
	char *path = moat_asprintf("%s/%s", dir, source), head[300];
	unsigned char buf[65536];
	struct stat st;
	ssize_t n;
	int fd, err;

	if (path == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		err = fd < 0 ? errno : EINVAL;
		*why =
		    moat_asprintf("[files] source %s: %s: put the file next "
		                  "to the spec (a regular file, not a "
		                  "symlink)",
		        path, fd < 0 ? strerror(err) : "not a regular file");
		if (fd >= 0)
			close(fd);
		free(path);
		return MOAT_FAILED_PRECONDITION;
	}
	snprintf(head, sizeof(head), "source\t%s\t%lld\n", source,
	    (long long)st.st_size);
	EVP_DigestUpdate(md, head, strlen(head));
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		EVP_DigestUpdate(md, buf, (size_t)n);
	err = n < 0 ? errno : 0;
	close(fd);
	if (err != 0) {
		*why = moat_asprintf("[files] source %s: %s", path,
		    strerror(err));
		free(path);
		return moat_status_from_errno(err);
	}
	free(path);
	return MOAT_OK;
}

int
moat_image_spec_id(const struct moat_image_spec *spec, const char *dir,
    char hex[65], char **why)
{
	unsigned char sum[EVP_MAX_MD_SIZE];
	unsigned int n = 0, i;
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	char *text = moat_image_spec_print(spec);
	int rv = MOAT_OK;
	size_t f;

	*why = NULL;
	if (md == NULL || text == NULL ||
	    EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*why = strdup("out of memory hashing the spec");
		goto out;
	}
	EVP_DigestUpdate(md, text, strlen(text));
	for (f = 0; f < spec->n_files && rv == MOAT_OK; f++)
		rv = spec_hash_source(md, dir, spec->files[f].source, why);
	if (rv == MOAT_OK) {
		EVP_DigestFinal_ex(md, sum, &n);
		for (i = 0; i < n && i < 32; i++)
			snprintf(hex + 2 * i, 3, "%02x", sum[i]);
	}
out:
	EVP_MD_CTX_free(md);
	free(text);
	return rv;
}

void
moat_image_spec_free(struct moat_image_spec *s)
{
	size_t i;

	if (s == NULL)
		return;
	free(s->suite);
	free(s->description);
	for (i = 0; i < s->n_packages; i++)
		free(s->packages[i]);
	free(s->packages);
	for (i = 0; i < s->n_languages; i++)
		free(s->languages[i]);
	free(s->languages);
	for (i = 0; i < s->n_files; i++) {
		free(s->files[i].guest_path);
		free(s->files[i].source);
	}
	free(s->files);
	for (i = 0; i < s->n_run; i++)
		free(s->run[i]);
	free(s->run);
	for (i = 0; i < s->n_env; i++) {
		free(s->env[i].key);
		free(s->env[i].value);
	}
	free(s->env);
	free(s);
}
