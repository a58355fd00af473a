/*
 * keys_cli.h: `moat-gateway keys create|ls|revoke` (keys_cli.c).
 */
#ifndef MOAT_GATEWAY_KEYS_CLI_H
#define MOAT_GATEWAY_KEYS_CLI_H

#include <stdio.h>

/* moat_gateway_keys_main: argv[0] is "keys"; returns the exit code.
 * `usage` prints moat-gateway's usage. */
int moat_gateway_keys_main(int argc, char **argv, void (*usage)(FILE *));

#endif
