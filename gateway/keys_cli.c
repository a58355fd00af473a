/*
 * keys_cli.c: `moat-gateway keys create|ls|revoke`, the operator's door to
 * the API keys. Where the keys are (issue 15):
 *   --sessiond URL, else [gateway] sessiond (config or environment):
 *     that moat-sessiond, shared by every gateway; it must answer.
 *   else <state>/keys-sessiond (written by a gateway started on this state
 *     directory with a sessiond): that sessiond; when it does not answer
 *     (the stack is stopped), the local store, which the gateway imports
 *     at its next start (and any gateway on first use of the key).
 *   else, or with --local: the local store <state>/gateway-db.
 * With a sessiond the local store is imported first (idempotent), so keys
 * made locally before show in `ls`. The local store opens next to a running
 * gateway (LMDB allows a second process).
 * `moat-gateway tenants set|unset|show|rm|ls` (issue 15) takes the same
 * options and needs a sessiond: tenants' own settings live only there.
 * Not for: the key store itself (auth.c, keys_remote.c, tenants_remote.c).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "keys_cli.h"
#include "session.pb-c.h"
#include "tenants.h"
#include "moat/config.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/tls.h"
#include "moat/util.h"

#define SECTION "gateway"

struct keys_cli {
	const char *config_path, *tenant, *verb, *key_id;
	char **rest; /* the words after the verb's first (tenants) */
	int n_rest;
	char *state_dir, *url;
	bool local, strict; /* strict: the sessiond must answer */
	struct moat_config *cfg;
	struct moat_tls *tls;
	struct moat_rpc_client *client;
	struct moat_auth *a;
};

/* read_marker: the URL in <state>/keys-sessiond, or NULL. */
static char *
read_marker(const char *state_dir)
{
	char *path =
	    moat_asprintf("%s/%s", state_dir, MOAT_AUTH_SESSIOND_FILE);
	char line[1024];
	FILE *f;
	size_t n;

	if (path == NULL || (f = fopen(path, "r")) == NULL) {
		free(path);
		return NULL;
	}
	free(path);
	if (fgets(line, sizeof(line), f) == NULL) {
		fclose(f);
		return NULL;
	}
	fclose(f);
	n = strcspn(line, "\r\n");
	line[n] = '\0';
	return n > 0 ? strdup(line) : NULL;
}

static int
parse(struct keys_cli *k, int argc, char **argv, void (*usage)(FILE *),
    bool *done)
{
	static const struct option long_opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "state-dir", required_argument, NULL, 's' },
		{ "tenant", required_argument, NULL, 't' },
		{ "sessiond", required_argument, NULL, 'S' },
		{ "local", no_argument, NULL, 'L' },
		{ "tls-cert", required_argument, NULL, 1 },
		{ "tls-key", required_argument, NULL, 2 },
		{ "tls-ca", required_argument, NULL, 3 },
		{ "tls-peer-ca", required_argument, NULL, 4 },
		{ "sessiond-tls-name", required_argument, NULL, 5 },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const char *const flag_names[] = { NULL, "tls-cert", "tls-key",
		"tls-ca", "tls-peer-ca", "sessiond-tls-name" };
	const char *flags[6] = { 0 };
	char *errmsg = NULL;
	int opt, rv;

	*done = false;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			k->config_path = optarg;
			break;
		case 's':
			free(k->state_dir);
			k->state_dir = strdup(optarg);
			break;
		case 't':
			k->tenant = optarg;
			break;
		case 'S':
			free(k->url);
			k->url = strdup(optarg);
			k->strict = true;
			break;
		case 'L':
			k->local = true;
			break;
		case 1:
		case 2:
		case 3:
		case 4:
		case 5:
			flags[opt] = optarg;
			break;
		case 'h':
			usage(stdout);
			*done = true;
			return MOAT_OK;
		default:
			usage(stderr);
			return MOAT_INVALID_ARGUMENT;
		}
	}
	k->verb = optind < argc ? argv[optind] : "";
	k->key_id = optind + 1 < argc ? argv[optind + 1] : NULL;
	k->rest = argv + (optind + 2 < argc ? optind + 2 : argc);
	k->n_rest = optind + 2 < argc ? argc - optind - 2 : 0;
	if ((rv = moat_config_load(&k->cfg, k->config_path, &errmsg)) !=
	    MOAT_OK) {
		fprintf(stderr, "moat-gateway: %s\n", errmsg);
		free(errmsg);
		return rv;
	}
	for (int i = 1; i < 6; i++)
		if (flags[i] != NULL &&
		    moat_config_set_flag(k->cfg, SECTION, flag_names[i],
		        flags[i]) != MOAT_OK)
			return MOAT_RESOURCE_EXHAUSTED;
	return MOAT_OK;
}

/* check_verb: the verb and its arguments. */
static int
check_verb(const struct keys_cli *k, char **errmsg)
{
	if (strcmp(k->verb, "create") != 0 && strcmp(k->verb, "ls") != 0 &&
	    strcmp(k->verb, "revoke") != 0) {
		*errmsg = moat_asprintf("keys: say create --tenant NAME, ls "
		                        "[--tenant NAME] or revoke KEYID");
		return MOAT_INVALID_ARGUMENT;
	}
	if (strcmp(k->verb, "create") == 0 && k->tenant == NULL) {
		*errmsg = moat_asprintf("keys create: --tenant NAME is "
		                        "required");
		return MOAT_INVALID_ARGUMENT;
	}
	/* Said before any store opens: a reserved name is no typo the
	 * store would catch later with less context. */
	if (strcmp(k->verb, "create") == 0 &&
	    moat_auth_tenant_reserved(k->tenant)) {
		*errmsg = moat_asprintf("keys create: tenant %s is reserved "
		                        "(names beginning \"moat.\" hold "
		                        "moat's own data, e.g. images): pick "
		                        "another --tenant",
		    k->tenant);
		return MOAT_INVALID_ARGUMENT;
	}
	if (strcmp(k->verb, "revoke") == 0 && k->key_id == NULL) {
		*errmsg = moat_asprintf("keys revoke: name the KEYID (`moat-"
		                        "gateway keys ls` lists them)");
		return MOAT_INVALID_ARGUMENT;
	}
	return MOAT_OK;
}

/* open_stores: the local store, and the sessiond client when the keys
 * are there (see the file comment). */
static int
open_stores(struct keys_cli *k, char **errmsg)
{
	const char *cfg_url;
	int rv;

	if (k->state_dir == NULL)
		k->state_dir = moat_config_state_dir(k->cfg, SECTION);
	if (k->state_dir == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rv = moat_mkdir_p(k->state_dir, 0700)) != 0) {
		*errmsg = moat_asprintf("cannot create the state directory "
		                        "%s: %s",
		    k->state_dir, strerror(rv));
		return moat_status_from_errno(rv);
	}
	if ((rv = moat_auth_open(&k->a, k->state_dir, errmsg)) != MOAT_OK)
		return rv;
	if (k->local)
		return MOAT_OK;
	if (k->url == NULL &&
	    (cfg_url = moat_config_get(k->cfg, SECTION, "sessiond", NULL)) !=
	        NULL) {
		k->url = strdup(cfg_url);
		k->strict = true;
	}
	if (k->url == NULL && (k->url = read_marker(k->state_dir)) == NULL)
		return MOAT_OK;
	struct moat_rpc_client_opts co = {
		.server_name = moat_config_get(k->cfg, SECTION,
		    "sessiond-tls-name", "sessiond"),
		.what = "the dial to sessiond (keys --sessiond)",
	};
	if ((rv = moat_tls_from_config(k->cfg, SECTION, &k->tls, errmsg)) !=
	    MOAT_OK)
		return rv;
	co.tls = k->tls;
	if ((rv = moat_rpc_client_open_opts(&k->client, k->url, &co,
	         errmsg)) != MOAT_OK)
		return rv;
	moat_auth_use_sessiond(k->a, k->client, k->url, 0);
	return MOAT_OK;
}

static int
run_verb(struct keys_cli *k, char **errmsg)
{
	char key_id[MOAT_AUTH_KEY_ID_LEN + 1];
	char *secret = NULL;
	int rv;

	if (strcmp(k->verb, "ls") == 0)
		return moat_auth_key_list(k->a, k->tenant, stdout, errmsg);
	if (strcmp(k->verb, "revoke") == 0) {
		if ((rv = moat_auth_key_revoke(k->a, k->key_id, errmsg)) ==
		    MOAT_OK)
			printf("revoked %s\n", k->key_id);
		return rv;
	}
	if ((rv = moat_auth_key_create(k->a, k->tenant, &secret, key_id,
	         errmsg)) == MOAT_OK) {
		printf("%s\n", secret);
		fprintf(stderr,
		    "key %s of tenant %s: the line above is its secret, "
		    "shown this once: keep it (e.g. in MOAT_API_KEY)\n",
		    key_id, k->tenant);
	}
	free(secret);
	return rv;
}

/* cli_end: says a failure (unless help was asked), frees k and errmsg,
 * and returns the exit code of `rv`. */
static int
cli_end(struct keys_cli *k, const char *what, int rv, bool done, char *errmsg)
{
	if (rv != MOAT_OK && !done)
		fprintf(stderr, "moat-gateway %s: %s\n", what,
		    errmsg ? errmsg : moat_strerror(rv));
	moat_auth_close(k->a);
	moat_rpc_client_close(k->client);
	moat_tls_free(k->tls);
	free(errmsg);
	free(k->state_dir);
	free(k->url);
	moat_config_free(k->cfg);
	return rv == MOAT_OK ? 0 : moat_status_exit_code(rv);
}

int
moat_gateway_keys_main(int argc, char **argv, void (*usage)(FILE *))
{
	struct keys_cli k = { 0 };
	char *errmsg = NULL;
	size_t n = 0;
	bool done;
	int rv;

	moat_log_init("gateway", MOAT_LOG_WARN);
	if ((rv = parse(&k, argc, argv, usage, &done)) != MOAT_OK || done)
		goto out;
	if ((rv = check_verb(&k, &errmsg)) != MOAT_OK ||
	    (rv = open_stores(&k, &errmsg)) != MOAT_OK)
		goto out;
	if (k.client != NULL) {
		/* Local keys first (idempotent), then the verb there. */
		rv = moat_auth_import(k.a, &n, &errmsg);
		if (rv == MOAT_OK)
			rv = run_verb(&k, &errmsg);
		if (rv == MOAT_UNAVAILABLE && !k.strict) {
			fprintf(stderr,
			    "moat-gateway keys: %s\nmoat-gateway keys: using "
			    "the local key store of %s instead; the gateway "
			    "imports it into moat-sessiond when it starts\n",
			    errmsg ? errmsg : "", k.state_dir);
			free(errmsg);
			errmsg = NULL;
			moat_auth_use_sessiond(k.a, NULL, NULL, 0);
			rv = run_verb(&k, &errmsg);
		}
	} else {
		rv = run_verb(&k, &errmsg);
	}
out:
	return cli_end(&k, "keys", rv, done, errmsg);
}

/* ---- moat-gateway tenants (issue 15) ---- */

static void
print_tenant(const Moat__V1__TenantInfo *t)
{
	printf("%s", t->name);
	for (size_t i = 0; i < t->n_settings; i++)
		printf(" %s=%s", t->settings[i]->key, t->settings[i]->value);
	printf("\n");
}

/* tenants_set: `set NAME KEY=VALUE...` or `unset NAME KEY...`. */
static int
tenants_set(struct keys_cli *k, bool set, char **errmsg)
{
	Moat__V1__SetTenantRequest req = MOAT__V1__SET_TENANT_REQUEST__INIT;
	Moat__V1__SetTenantRequest__SetEntry *entries = NULL, **ptrs = NULL;
	Moat__V1__TenantInfo *t = NULL;
	int rv = MOAT_OK;

	if (k->n_rest == 0) {
		*errmsg = moat_asprintf("tenants %s %s: name at least one "
		                        "setting (%s)",
		    k->verb, k->key_id, set ? "KEY=VALUE" : "KEY");
		return MOAT_INVALID_ARGUMENT;
	}
	if ((entries = calloc((size_t)k->n_rest, sizeof(*entries))) == NULL ||
	    (ptrs = calloc((size_t)k->n_rest, sizeof(*ptrs))) == NULL) {
		free(entries);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (int i = 0; i < k->n_rest && rv == MOAT_OK; i++) {
		char *w = k->rest[i], *eq = strchr(w, '=');
		size_t digits = eq != NULL ? strspn(eq + 1, "0123456789") : 0;

		if (set &&
		    (eq == NULL || digits == 0 || eq[1 + digits] != '\0'))
			rv = MOAT_INVALID_ARGUMENT;
		if (eq != NULL && rv == MOAT_OK)
			*eq = '\0';
		if (rv == MOAT_OK && !moat_tenant_setting_known(w))
			rv = MOAT_INVALID_ARGUMENT;
		if (rv != MOAT_OK) {
			*errmsg = moat_asprintf(
			    "tenants %s: \"%s\" is not %s: the keys are "
			    "max-sandboxes, max-vcpus, max-memory-mib, "
			    "max-snapshot-bytes, key-rps, key-burst, "
			    "timeout-s, timeout-max-s and idle-timeout-s, "
			    "each a whole number (0: unlimited or none)",
			    k->verb, w, set ? "KEY=NUMBER" : "a key");
			break;
		}
		moat__v1__set_tenant_request__set_entry__init(&entries[i]);
		entries[i].key = w;
		entries[i].value = set ? eq + 1 : NULL;
		ptrs[i] = &entries[i];
	}
	req.tenant = (char *)k->key_id;
	if (set) {
		req.set = ptrs;
		req.n_set = (size_t)k->n_rest;
	} else {
		req.unset = k->rest;
		req.n_unset = (size_t)k->n_rest;
	}
	if (rv == MOAT_OK &&
	    (rv = moat_sessiond_remote_call(k->client, k->url, "SetTenant",
	         &req.base, &moat__v1__tenant_info__descriptor,
	         (ProtobufCMessage **)&t, errmsg)) == MOAT_OK) {
		print_tenant(t);
		moat__v1__tenant_info__free_unpacked(t, NULL);
	}
	free(entries);
	free(ptrs);
	return rv;
}

static int
tenants_verb(struct keys_cli *k, char **errmsg)
{
	Moat__V1__GetTenantRequest get = MOAT__V1__GET_TENANT_REQUEST__INIT;
	Moat__V1__ListTenantsRequest ls = MOAT__V1__LIST_TENANTS_REQUEST__INIT;
	Moat__V1__ListTenantsReply *all = NULL;
	Moat__V1__TenantInfo *t = NULL;
	bool rm = strcmp(k->verb, "rm") == 0;
	int rv;

	if (strcmp(k->verb, "set") == 0 || strcmp(k->verb, "unset") == 0)
		return tenants_set(k, strcmp(k->verb, "set") == 0, errmsg);
	if (strcmp(k->verb, "ls") == 0) {
		if ((rv = moat_sessiond_remote_call(k->client, k->url,
		         "ListTenants", &ls.base,
		         &moat__v1__list_tenants_reply__descriptor,
		         (ProtobufCMessage **)&all, errmsg)) != MOAT_OK)
			return rv;
		for (size_t i = 0; i < all->n_tenants; i++)
			print_tenant(all->tenants[i]);
		moat__v1__list_tenants_reply__free_unpacked(all, NULL);
		return MOAT_OK;
	}
	get.tenant = (char *)k->key_id;
	if ((rv = moat_sessiond_remote_call(k->client, k->url,
	         rm ? "DeleteTenant" : "GetTenant", &get.base,
	         &moat__v1__tenant_info__descriptor, (ProtobufCMessage **)&t,
	         errmsg)) != MOAT_OK)
		return rv;
	if (rm)
		printf("removed the settings of %s (the config file's "
		       "apply)\n",
		    t->name);
	else
		print_tenant(t);
	moat__v1__tenant_info__free_unpacked(t, NULL);
	return MOAT_OK;
}

static int
tenants_check_verb(const struct keys_cli *k, char **errmsg)
{
	static const char *const verbs[] = { "set", "unset", "show", "rm",
		"ls" };
	bool known = false;

	for (size_t i = 0; i < 5; i++)
		known |= strcmp(k->verb, verbs[i]) == 0;
	if (!known) {
		*errmsg = moat_asprintf(
		    "tenants: say set NAME KEY=VALUE..., unset NAME KEY..., "
		    "show NAME, rm NAME or ls");
		return MOAT_INVALID_ARGUMENT;
	}
	if (strcmp(k->verb, "ls") != 0 && k->key_id == NULL) {
		*errmsg =
		    moat_asprintf("tenants %s: name the tenant", k->verb);
		return MOAT_INVALID_ARGUMENT;
	}
	return MOAT_OK;
}

int
moat_gateway_tenants_main(int argc, char **argv, void (*usage)(FILE *))
{
	struct keys_cli k = { 0 };
	char *errmsg = NULL;
	bool done;
	int rv;

	moat_log_init("gateway", MOAT_LOG_WARN);
	if ((rv = parse(&k, argc, argv, usage, &done)) != MOAT_OK || done)
		goto out;
	if ((rv = tenants_check_verb(&k, &errmsg)) != MOAT_OK ||
	    (rv = open_stores(&k, &errmsg)) != MOAT_OK)
		goto out;
	if (k.client == NULL) {
		rv = MOAT_FAILED_PRECONDITION;
		errmsg = moat_asprintf(
		    "tenants' settings live in moat-sessiond: give --sessiond "
		    "URL (or [gateway] sessiond), or run this where a gateway "
		    "with a sessiond keeps its state (--state-dir)");
		goto out;
	}
	rv = tenants_verb(&k, &errmsg);
out:
	return cli_end(&k, "tenants", rv, done, errmsg);
}
