/*
 * tenants.h: tenants' own settings of [tenants], kept in moat-sessiond
 * and applied by every gateway (tenants_remote.c; issue 15), and the
 * `moat-gateway tenants` command (keys_cli.c).
 * Not for: how the settings are used (admission.c, lifetime.c).
 */
#ifndef MOAT_GATEWAY_TENANTS_H
#define MOAT_GATEWAY_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "moat/rpc.h"

#define MOAT_TENANTS_REFRESH_MS 5000 /* a change shows within this */

/* The [tenants] keys a tenant may have its own value of (all numbers),
 * NULL-terminated. */
extern const char *const moat_tenant_setting_keys[];

/* moat_tenant_setting_known: whether `key` is one of them. */
bool moat_tenant_setting_known(const char *key);

struct moat_tenants;

/* moat_tenants_new: a copy of the tenants' settings read from the
 * sessiond of `sessiond` (borrowed, as is `url`, for messages) when first
 * needed. */
int moat_tenants_new(struct moat_tenants **out,
    struct moat_rpc_client *sessiond, const char *url)
    __attribute__((warn_unused_result));
void moat_tenants_free(struct moat_tenants *t);

/* moat_tenants_overlay: the moat_config_overlay_fn of [tenants] (arg: a
 * struct moat_tenants *): tenant `who`'s own value of `key`. */
bool moat_tenants_overlay(void *arg, const char *key, const char *who,
    char *buf, size_t size);

/* moat_gateway_tenants: the gateway's copy of them (a gateway whose keys
 * are in sessiond), or NULL. */
struct moat_gateway;
struct moat_tenants *moat_gateway_tenants(struct moat_gateway *gw);

/* moat_gateway_tenants_main: `moat-gateway tenants ...` (argv from
 * "tenants" on); returns the process exit code. */
int moat_gateway_tenants_main(int argc, char **argv, void (*usage)(FILE *));

#endif
