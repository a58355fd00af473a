/*
 * cmd_info.c: `moat info`: what an operator checks first: which services
 * answer (and their versions), which nodes the gateway knows, with the
 * accelerator each uses, its capacity, its snapshot RAM budget and the
 * images built there.
 * Not for: per-sandbox detail (`moat sandbox get`).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "moat/status.h"

static void
print_duration(uint64_t ms)
{
	uint64_t s = ms / 1000;

	if (s < 120)
		printf("%llus", (unsigned long long)s);
	else if (s < 7200)
		printf("%llum", (unsigned long long)(s / 60));
	else
		printf("%lluh%02llum", (unsigned long long)(s / 3600),
		    (unsigned long long)(s / 60 % 60));
}

#define MIB(b) ((double)(b) / (1024.0 * 1024.0))

/* print_snapshot_ram: the node's snapshot RAM budget and its RAM dir
 * (issue 11); nothing from a vmd that does not report them. */
static void
print_snapshot_ram(const Moat__V1__Node *n)
{
	if (n->snapshot_ram_budget_bytes != 0 ||
	    n->snapshot_ram_used_bytes != 0)
		printf("    snapshot RAM %.1f/%.1f MiB used, %u in RAM, %u on "
		       "disk, %llu evictions\n",
		    MIB(n->snapshot_ram_used_bytes),
		    MIB(n->snapshot_ram_budget_bytes), n->snapshots_in_ram,
		    n->snapshots_on_disk,
		    (unsigned long long)n->snapshot_evictions);
	if (n->ram_dir_capacity_bytes != 0)
		printf("    RAM dir %s: %.1f MiB, %.1f MiB reserved\n",
		    n->ram_dir[0] ? n->ram_dir : "-",
		    MIB(n->ram_dir_capacity_bytes),
		    MIB(n->ram_dir_reserved_bytes));
}

int
cmd_info(struct cli *cli, int argc, char **argv)
{
	Moat__V1__ClusterInfo *info = NULL;
	char *errmsg = NULL, age[32];
	int rv;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			cli->json = true;
		else
			return cli_usage_error("info",
			    "info takes no "
			    "arguments");
	}
	if ((rv = moat_client_info(cli_client(cli), &info, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "getting the cluster info");
	if (cli->json) {
		rv = cli_print_json(cli, info);
		moat_client_free_msg(info);
		return rv;
	}
	printf("gateway %s at %s, up ", info->version,
	    moat_client_url(cli_client(cli)));
	print_duration(info->uptime_ms);
	printf("\n\nservices:\n");
	for (size_t i = 0; i < info->n_services; i++) {
		const Moat__V1__ServiceHealth *s = info->services[i];

		printf("  %-22s %-4s %-8s %s%s%s\n", s->service,
		    s->up ? "up" : "DOWN", s->version[0] ? s->version : "-",
		    s->url, s->message[0] ? "  " : "", s->message);
	}
	printf("\nnodes:\n");
	if (info->n_nodes == 0)
		printf("  none: start moat-vmd (deploy/moat-stack start); it "
		       "finds the gateway by itself\n");
	for (size_t i = 0; i < info->n_nodes; i++) {
		const Moat__V1__Node *n = info->nodes[i];

		printf("  %s  %s  accel %s  driver %s  vmd %s\n", n->node_id,
		    n->available ? "available" : "UNAVAILABLE",
		    n->accel[0] ? n->accel : "undecided",
		    n->driver[0] ? n->driver : "-",
		    n->version[0] ? n->version : "-");
		printf("    isolation %s\n",
		    n->isolation[0] ? n->isolation :
		                      "- (vmd before issue 14)");
		printf("    sandboxes %u, memory %llu/%llu MiB used, %u vcpus"
		       " (per sandbox at most %u vcpus, %u MiB)\n",
		    n->sandboxes, (unsigned long long)n->memory_mib_used,
		    (unsigned long long)n->memory_mib_total, n->vcpus_total,
		    n->max_vcpus, n->max_memory_mib);
		if (strcmp(n->accel, "tcg") == 0 && n->allow_tcg)
			printf("    accelerator TCG: emulation, no security "
			       "boundary between guests and the host\n");
		else if (strcmp(n->accel, "tcg") == 0)
			printf(
			    "    no usable KVM and [vmd] allow-tcg = false: "
			    "sandboxes are refused\n");
		print_snapshot_ram(n);
		printf("    images:");
		if (n->n_images == 0)
			printf(" none reported");
		for (size_t j = 0; j < n->n_images; j++)
			printf(" %s", n->images[j]);
		printf("\n    rpc %s, last seen %s ago\n", n->rpc_url,
		    cli_format_age(n->last_seen_unix_ms, age, sizeof(age)));
	}
	moat_client_free_msg(info);
	return 0;
}
