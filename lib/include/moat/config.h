/*
 * config.h: settings for every moat program, with one precedence:
 * command-line flag > MOAT_<SECTION>_<KEY> environment > moat.conf (INI,
 * read with inih) > built-in default. The env name is upper-cased with
 * '-' and '.' turned to '_': [vmd] state-dir -> MOAT_VMD_STATE_DIR.
 * Keys in the [moat] section also answer to MOAT_<KEY> (MOAT_STATE_DIR).
 * Not for: validating values; callers check ranges and say what is wrong.
 */
#ifndef MOAT_CONFIG_H
#define MOAT_CONFIG_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct moat_config;

/* The file every service reads when neither --config nor $MOAT_CONFIG
 * names one (absent: defaults only). */
#define MOAT_CONFIG_SYSTEM_PATH "/etc/moat/moat.conf"

/* moat_config_load: reads `path` (NULL: $MOAT_CONFIG, else
 * MOAT_CONFIG_SYSTEM_PATH where it exists, else no file). A
 * missing file named by $MOAT_CONFIG or `path` is an error; a parse error
 * is an error naming the line. On success *out is owned by the caller
 * (moat_config_free). On failure returns a status and sets *errmsg to a
 * heap string the caller frees. */
int moat_config_load(struct moat_config **out, const char *path, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_config_set_flag: records a command-line value (copied); flags win
 * over everything else. */
int moat_config_set_flag(struct moat_config *cfg, const char *section,
    const char *key, const char *value) __attribute__((warn_unused_result));

/* moat_config_get: the value by precedence, or `def` when unset anywhere.
 * The pointer is owned by cfg (or is `def`) and lives until
 * moat_config_free. cfg may be NULL (env and default only). */
const char *moat_config_get(const struct moat_config *cfg, const char *section,
    const char *key, const char *def);

/* moat_config_get_u64: like get, parsed as an unsigned decimal. A value
 * that is not a number is an error (INVALID_ARGUMENT) with *errmsg naming
 * the key and where it came from. */
int moat_config_get_u64(const struct moat_config *cfg, const char *section,
    const char *key, uint64_t def, uint64_t *out, char **errmsg)
    __attribute__((warn_unused_result));

/* A source of per-tenant settings over the file's (the gateway's tenants
 * kept in moat-sessiond): copies the value of `key` for `who` into buf
 * (size bytes) and returns true, or returns false when it has none.
 * Called from any thread. */
typedef bool (*moat_config_overlay_fn)(void *arg, const char *key,
    const char *who, char *buf, size_t size);

/* moat_config_set_overlay: from now on moat_config_get_u64_for of
 * [section] asks `fn` first for a `who`'s value (before key.<who> and key
 * of the file). Set it once; thread-safe against readers. */
void moat_config_set_overlay(struct moat_config *cfg, const char *section,
    moat_config_overlay_fn fn, void *arg);

/* The longest "key.<name>" moat_config_get_u64_for looks up, with NUL. */
#define MOAT_CONFIG_KEY_MAX 192

/* moat_config_get_u64_for: the overlay's value for `who` (when one is
 * set, moat_config_set_overlay), else [section] key.<who> (a tenant's own
 * value, e.g. keep-last.acme) when set, else [section] key, else def,
 * parsed as get_u64 does. `who` NULL or "": key alone. */
int moat_config_get_u64_for(const struct moat_config *cfg, const char *section,
    const char *key, const char *who, uint64_t def, uint64_t *out,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_config_get_bool: true/false/yes/no/on/off/1/0. */
int moat_config_get_bool(const struct moat_config *cfg, const char *section,
    const char *key, bool def, bool *out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_config_free: safe on NULL. */
void moat_config_free(struct moat_config *cfg);

/* moat_config_from_args: a service's command line, by the rules every
 * moat service shares. `opts` (getopt_long's, ending in a zero entry)
 * may hold "config" (val 'c': the file to read instead of the default),
 * "help" ('h': usage(stdout)) and "version" ('V': prints "<program>
 * <MOAT_VERSION>"); every other option is the setting of [section] with
 * the option's name, and wins over the environment and the file. Returns
 * -1 with *cfg loaded (the caller frees it) when the program should run;
 * else the exit code it should end with now: 0 after --help or --version,
 * or a status exit code after an unknown option, a stray argument or a
 * config file that cannot be read, each said on stderr. */
int moat_config_from_args(int argc, char **argv, const struct option *opts,
    const char *program, const char *section, void (*usage)(FILE *),
    struct moat_config **cfg) __attribute__((warn_unused_result));

/* moat_config_state_dir: the state directory of a program of [section]:
 * its state-dir, else [moat] state-dir, else moat_default_state_dir().
 * Heap string (NULL: out of memory), the caller frees. */
char *moat_config_state_dir(const struct moat_config *cfg,
    const char *section);

/* moat_default_state_dir: $MOAT_STATE_DIR, else /var/lib/moat for root,
 * else $XDG_STATE_HOME/moat or $HOME/.local/state/moat. Heap string, the
 * caller frees. */
char *moat_default_state_dir(void);

#endif
