/*
 * cmd_node.c: `moat node ls | cordon NODE [--reason R] | uncordon NODE |
 * drain NODE [--to NODE] [--reason R]` (issue 15): the nodes as the
 * gateway sees them (cordons, protocol versions, why one takes no
 * sandbox), and the operator calls that take a node out of service.
 * Not for: the cluster's services (`moat info`).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "moat/status.h"

static const char usage_node[] =
    "node ls | cordon NODE [--reason R] | uncordon NODE | "
    "drain NODE [--to NODE] [--reason R]";

/* node_labels: "k=v,k=v" of n's labels into buf ("-" when none). */
static const char *
node_labels(const Moat__V1__Node *n, char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n->n_labels && used + 1 < size; i++)
		used += (size_t)snprintf(buf + used, size - used, "%s%s=%s",
		    i ? "," : "", n->labels[i]->key, n->labels[i]->value);
	return buf[0] ? buf : "-";
}

static int
node_ls(struct cli *cli)
{
	Moat__V1__NodeList *list = NULL;
	char *errmsg = NULL, labels[256], proto[16], mem[32];
	int rv;

	if ((rv = moat_client_nodes(cli_client(cli), &list, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "listing nodes");
	if (cli->json) {
		rv = cli_print_json(cli, list);
		moat_client_free_msg(list);
		return rv;
	}
	printf("%-16s %-28s %-11s %-8s %-9s %-7s %-13s %-20s %-8s %s\n", "ID",
	    "ADDRESS", "STATE", "CORDON", "SANDBOXES", "VCPUS", "MEMORY MIB",
	    "LABELS", "PROTOCOL", "UNUSABLE");
	for (size_t i = 0; i < list->n_nodes; i++) {
		const Moat__V1__Node *n = list->nodes[i];

		snprintf(proto, sizeof(proto), "%u",
		    n->protocol_version ? n->protocol_version : 1);
		snprintf(mem, sizeof(mem), "%llu/%llu",
		    (unsigned long long)n->memory_mib_used,
		    (unsigned long long)n->memory_mib_total);
		printf("%-16s %-28s %-11s %-8s %-9u %3u/%-3u %-13s %-20s %-8s "
		       "%s\n",
		    n->node_id, n->rpc_url,
		    n->available ? "available" : "unavailable",
		    n->cordoned ? "cordoned" : "-", n->sandboxes,
		    n->vcpus_used, n->vcpus_total, mem,
		    node_labels(n, labels, sizeof(labels)), proto,
		    n->unusable_reason[0] ? n->unusable_reason : "-");
		if (n->cordoned && n->cordon_reason[0] != '\0')
			printf("  %s cordoned: %s\n", n->node_id,
			    n->cordon_reason);
	}
	moat_client_free_msg(list);
	return 0;
}

static int
node_cordon(struct cli *cli, bool on, int argc, char **argv)
{
	Moat__V1__Node *n = NULL;
	const char *reason = NULL;
	char *errmsg = NULL;
	int rv;

	if (argc < 1 || argv[0][0] == '-')
		return cli_usage_error(usage_node, "%s wants a node id",
		    on ? "cordon" : "uncordon");
	for (int i = 1; i < argc; i++) {
		if (on && strcmp(argv[i], "--reason") == 0 && i + 1 < argc)
			reason = argv[++i];
		else
			return cli_usage_error(usage_node,
			    "\"%s\": %s takes %s", argv[i],
			    on ? "cordon" : "uncordon",
			    on ? "NODE [--reason R]" : "NODE only");
	}
	if ((rv = moat_client_cordon_node(cli_client(cli), argv[0], on, reason,
	         &n, &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "%s node %s",
		    on ? "cordoning" : "uncordoning", argv[0]);
	if (cli->json)
		rv = cli_print_json(cli, n);
	else
		printf("node %s %s%s%s\n", n->node_id,
		    n->cordoned ? "cordoned" : "uncordoned",
		    n->cordon_reason[0] ? ": " : "", n->cordon_reason);
	moat_client_free_msg(n);
	return rv;
}

static int
node_drain(struct cli *cli, int argc, char **argv)
{
	Moat__V1__DrainNodeReply *r = NULL;
	const char *to = NULL, *reason = NULL;
	char *errmsg = NULL;
	int rv;

	if (argc < 1 || argv[0][0] == '-')
		return cli_usage_error(usage_node, "drain wants a node id");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--to") == 0 && i + 1 < argc)
			to = argv[++i];
		else if (strcmp(argv[i], "--reason") == 0 && i + 1 < argc)
			reason = argv[++i];
		else
			return cli_usage_error(usage_node,
			    "\"%s\": drain takes NODE [--to NODE] "
			    "[--reason R]",
			    argv[i]);
	}
	if ((rv = moat_client_drain_node(cli_client(cli), argv[0], to, reason,
	         &r, &errmsg)) != MOAT_OK)
		return cli_fail(cli, rv, errmsg, "draining node %s", argv[0]);
	if (cli->json) {
		rv = cli_print_json(cli, r);
	} else {
		for (size_t i = 0; i < r->n_sandboxes; i++) {
			const Moat__V1__DrainedSandbox *d = r->sandboxes[i];

			if (d->moved)
				printf("moved  %s (%s) %s -> %s, paused %llu "
				       "ms\n",
				    d->sandbox_id, d->tenant, d->from_node_id,
				    d->to_node_id,
				    (unsigned long long)d->pause_ms);
			else
				printf("failed %s (%s) stays on %s: %s\n",
				    d->sandbox_id, d->tenant, d->from_node_id,
				    d->error);
		}
		printf("node %s cordoned: %u moved, %u failed\n", argv[0],
		    r->moved, r->failed);
	}
	/* Some stayed: the operator has something to do. */
	if (rv == 0 && r->failed > 0)
		rv = 1;
	moat_client_free_msg(r);
	return rv;
}

int
cmd_node(struct cli *cli, int argc, char **argv)
{
	/* argv[0] is "node"; --json anywhere after it. */
	argc--;
	argv++;
	argc = cli_take_json(cli, argc, argv);
	if (argc < 1)
		return cli_usage_error(usage_node, "node wants a subcommand");
	if (strcmp(argv[0], "ls") == 0)
		return argc == 1 ?
		    node_ls(cli) :
		    cli_usage_error(usage_node,
		        "\"%s\": ls takes no arguments", argv[1]);
	if (strcmp(argv[0], "cordon") == 0)
		return node_cordon(cli, true, argc - 1, argv + 1);
	if (strcmp(argv[0], "uncordon") == 0)
		return node_cordon(cli, false, argc - 1, argv + 1);
	if (strcmp(argv[0], "drain") == 0)
		return node_drain(cli, argc - 1, argv + 1);
	return cli_usage_error(usage_node, "unknown node subcommand \"%s\"",
	    argv[0]);
}
