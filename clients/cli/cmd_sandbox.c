/*
 * cmd_sandbox.c: `moat sandbox create|ls|get|rm`: sandboxes that outlive
 * one command, for `moat exec` and `moat cp`. `create` prints only the id
 * so scripts can capture it. Not for: running code (cmd_run.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moat/status.h"

static const char *const usage_create =
    "sandbox create [--cpus N] "
    "[--memory MiB] [--scratch MiB] [--image NAME] [--label K=V]... "
    "[--record [--snapshot every|manual|none]] "
    "[--allow HOST[:PORT]]... [--network none|allowlist] "
    "[--timeout S] [--idle-timeout S] [--node-label K=V]...";
static const char *const usage_all = "sandbox create [...] | ls | get ID | "
                                     "rm ID... | keepalive ID [...]";

static const char *
state_name(Moat__V1__SandboxState s)
{
	switch (s) {
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING:
		return "creating";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING:
		return "running";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED:
		return "failed";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED:
		return "stopped";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNAVAILABLE:
		return "unavailable";
	default:
		return "unknown";
	}
}

/* parse_policy: "every" | "manual" | "none" -> the snapshot policy. */
static bool
parse_policy(const char *s, Moat__V1__SnapshotPolicy *out)
{
	if (strcmp(s, "every") == 0)
		*out = MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY;
	else if (strcmp(s, "manual") == 0)
		*out = MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_MANUAL;
	else if (strcmp(s, "none") == 0)
		*out = MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_NONE;
	else
		return false;
	return true;
}

/* node_label: one --node-label K=V more into req's node_selector
 * (entries and ptrs have room for argc). False when it is not K=V. */
static bool
node_label(Moat__V1__CreateSandboxRequest *req, char *arg,
    Moat__V1__CreateSandboxRequest__NodeSelectorEntry *entries,
    Moat__V1__CreateSandboxRequest__NodeSelectorEntry **ptrs)
{
	char *eq = strchr(arg, '=');
	Moat__V1__CreateSandboxRequest__NodeSelectorEntry *e =
	    &entries[req->n_node_selector];

	if (eq == NULL || eq == arg)
		return false;
	*eq = '\0';
	moat__v1__create_sandbox_request__node_selector_entry__init(e);
	e->key = arg;
	e->value = eq + 1;
	ptrs[req->n_node_selector++] = e;
	req->node_selector = ptrs;
	return true;
}

static int
sandbox_create(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "cpus", required_argument, NULL, 'C' },
		{ "memory", required_argument, NULL, 'M' },
		{ "scratch", required_argument, NULL, 'S' },
		{ "image", required_argument, NULL, 'I' },
		{ "label", required_argument, NULL, 'L' },
		{ "record", no_argument, NULL, 'R' },
		{ "snapshot", required_argument, NULL, 'P' },
		{ "allow", required_argument, NULL, 'A' },
		{ "network", required_argument, NULL, 'N' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "idle-timeout", required_argument, NULL, 'D' },
		{ "node-label", required_argument, NULL, 'K' },
		{ "json", no_argument, NULL, CLI_OPT_JSON },
		{ NULL, 0, NULL, 0 },
	};
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__CreateSandboxRequest__LabelsEntry *entries = NULL;
	Moat__V1__CreateSandboxRequest__LabelsEntry **labels = NULL;
	Moat__V1__CreateSandboxRequest__NodeSelectorEntry *sel_entries = NULL;
	Moat__V1__CreateSandboxRequest__NodeSelectorEntry **sel = NULL;
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__NetworkPolicy net = MOAT__V1__NETWORK_POLICY__INIT;
	char **allow = NULL;
	char *errmsg = NULL;
	uint32_t scratch;
	bool policy_set = false;
	int opt, rv;

	entries = calloc((size_t)argc + 1, sizeof(*entries));
	labels = calloc((size_t)argc + 1, sizeof(*labels));
	allow = calloc((size_t)argc + 1, sizeof(*allow));
	sel_entries = calloc((size_t)argc + 1, sizeof(*sel_entries));
	sel = calloc((size_t)argc + 1, sizeof(*sel));
	if (entries == NULL || labels == NULL || allow == NULL ||
	    sel_entries == NULL || sel == NULL) {
		rv = cli_fail(cli, MOAT_RESOURCE_EXHAUSTED, NULL, "create");
		goto out;
	}
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *eq;

		switch (opt) {
		case 'C':
			if (!cli_parse_u32(optarg, 1, 1024, &req.vcpus)) {
				rv = cli_usage_error(usage_create,
				    "--cpus "
				    "wants 1-1024, not \"%s\"",
				    optarg);
				goto out;
			}
			break;
		case 'M':
			if (!cli_parse_u32(optarg, 16, 1u << 24,
			        &req.memory_mib)) {
				rv = cli_usage_error(usage_create,
				    "--memory "
				    "wants MiB (16 or more), not \"%s\"",
				    optarg);
				goto out;
			}
			break;
		case 'S':
			if (!cli_parse_u32(optarg, 1, UINT32_MAX, &scratch)) {
				rv = cli_usage_error(usage_create,
				    "--scratch "
				    "wants MiB, not \"%s\"",
				    optarg);
				goto out;
			}
			req.scratch_mib = scratch;
			break;
		case 'I':
			req.image = optarg;
			break;
		case 'L':
			if ((eq = strchr(optarg, '=')) == NULL ||
			    eq == optarg) {
				rv = cli_usage_error(usage_create,
				    "--label "
				    "wants KEY=VALUE, not \"%s\"",
				    optarg);
				goto out;
			}
			*eq = '\0';
			moat__v1__create_sandbox_request__labels_entry__init(
			    &entries[req.n_labels]);
			entries[req.n_labels].key = optarg;
			entries[req.n_labels].value = eq + 1;
			labels[req.n_labels] = &entries[req.n_labels];
			req.n_labels++;
			break;
		case 'R':
			req.record = true;
			break;
		case 'P':
			policy_set = true;
			if (!parse_policy(optarg, &req.snapshot_policy)) {
				rv = cli_usage_error(usage_create,
				    "--snapshot "
				    "wants every, manual or none, not \"%s\"",
				    optarg);
				goto out;
			}
			break;
		case 'A': /* guest egress (issue 14): implies allowlist */
			allow[net.n_allow++] = optarg;
			if (net.mode == NULL)
				net.mode = "allowlist";
			break;
		case 'N':
			if (strcmp(optarg, "none") != 0 &&
			    strcmp(optarg, "allowlist") != 0) {
				rv = cli_usage_error(usage_create,
				    "--network wants none or allowlist, not "
				    "\"%s\"",
				    optarg);
				goto out;
			}
			net.mode = optarg;
			break;
		case 'T':
		case 'D':
			if (!cli_parse_u32(optarg, 1, UINT32_MAX,
			        opt == 'T' ? &req.timeout_s :
			                     &req.idle_timeout_s)) {
				rv = cli_usage_error(usage_create,
				    "--%s wants seconds (1 or more; without "
				    "it: the tenant's default), not \"%s\"",
				    opt == 'T' ? "timeout" : "idle-timeout",
				    optarg);
				goto out;
			}
			break;
		case 'K': /* placement: the node must carry the label */
			if (!node_label(&req, optarg, sel_entries, sel)) {
				rv = cli_usage_error(usage_create,
				    "--node-label wants KEY=VALUE, not \"%s\"",
				    optarg);
				goto out;
			}
			break;
		case CLI_OPT_JSON:
			cli->json = true;
			break;
		default:
			rv = cli_usage_error(usage_create, "bad option");
			goto out;
		}
	}
	if (optind < argc) {
		rv = cli_usage_error(usage_create, "unexpected \"%s\"",
		    argv[optind]);
		goto out;
	}
	if (policy_set && !req.record) {
		rv = cli_usage_error(usage_create,
		    "--snapshot is a policy of "
		    "recording: add --record");
		goto out;
	}
	if (net.n_allow > 0 && strcmp(net.mode, "none") == 0) {
		rv = cli_usage_error(usage_create,
		    "--allow with --network none: drop one of them");
		goto out;
	}
	net.allow = allow;
	if (net.mode != NULL)
		req.network = &net;
	req.labels = labels;
	if ((rv = moat_client_create(cli_client(cli), &req, &sb, &errmsg)) !=
	    MOAT_OK) {
		rv = cli_fail(cli, rv, errmsg, "creating a sandbox");
		goto out;
	}
	rv = cli->json ? cli_print_json(cli, sb) : (printf("%s\n", sb->id), 0);
out:
	moat_client_free_msg(sb);
	free(entries);
	free(labels);
	free(allow);
	free(sel_entries);
	free(sel);
	return rv;
}

static int
sandbox_ls(struct cli *cli)
{
	Moat__V1__SandboxList *list = NULL;
	char *errmsg = NULL, age[32];
	int rv;

	if ((rv = moat_client_list(cli_client(cli), &list, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "listing sandboxes");
	if (cli->json) {
		rv = cli_print_json(cli, list);
		moat_client_free_msg(list);
		return rv;
	}
	printf("%-24s %-11s %-14s %4s %7s %-10s %-5s %-8s %s\n", "ID", "STATE",
	    "NODE", "CPUS", "MEMORY", "IMAGE", "ACCEL", "AGE", "ISOLATION");
	for (size_t i = 0; i < list->n_sandboxes; i++) {
		const Moat__V1__Sandbox *s = list->sandboxes[i];

		/* The isolation's first word: strict or relaxed (`moat
		 * sandbox get` has what is missing). */
		int iso = (int)strcspn(s->isolation, ":");

		printf("%-24s %-11s %-14s %4u %6uM %-10s %-5s %-8s %.*s\n",
		    s->id, state_name(s->state), s->node_id, s->vcpus,
		    s->memory_mib, s->image[0] ? s->image : "default",
		    s->accel[0] ? s->accel : "-",
		    cli_format_age(s->created_unix_ms, age, sizeof(age)),
		    iso ? iso : 1, iso ? s->isolation : "-");
	}
	moat_client_free_msg(list);
	return 0;
}

static int
sandbox_get(struct cli *cli, const char *id)
{
	Moat__V1__Sandbox *s = NULL;
	char *errmsg = NULL, age[32];
	int rv;

	if ((rv = moat_client_get(cli_client(cli), id, &s, &errmsg)) !=
	    MOAT_OK)
		return cli_fail(cli, rv, errmsg, "getting sandbox %s", id);
	if (cli->json) {
		rv = cli_print_json(cli, s);
		moat_client_free_msg(s);
		return rv;
	}
	printf("id:          %s\n", s->id);
	printf("state:       %s\n", state_name(s->state));
	if (s->failure_reason[0])
		printf("failure:     %s\n", s->failure_reason);
	printf("node:        %s\n", s->node_id);
	printf("vcpus:       %u\n", s->vcpus);
	printf("memory:      %u MiB\n", s->memory_mib);
	printf("scratch:     %llu MiB\n", (unsigned long long)s->scratch_mib);
	printf("image:       %s\n", s->image[0] ? s->image : "default");
	printf("vmm:         %s (%s), pid %d\n",
	    s->driver[0] ? s->driver : "-", s->accel[0] ? s->accel : "-",
	    s->vmm_pid);
	printf("isolation:   %s\n", s->isolation[0] ? s->isolation : "-");
	printf("boot:        %llu ms\n", (unsigned long long)s->boot_ms);
	if (s->timings != NULL && s->timings->kind[0] != '\0') {
		const Moat__V1__CreateTimings *t = s->timings;

		/* Where the node spent the create (CreateTimings). */
		printf(
		    "created:     %s in %.0f ms on the node: VMM start %.0f, "
		    "device state %.0f, agent reset %.0f, boot %.0f\n",
		    t->kind, t->total_ms,
		    t->vmm_spawn_ms + t->agent_connect_ms + t->qmp_wait_ms,
		    t->ram_wait_ms + t->device_load_ms + t->resume_ms,
		    t->reset_ms, t->boot_wait_ms);
	}
	printf("age:         %s\n",
	    cli_format_age(s->created_unix_ms, age, sizeof(age)));
	printf("execs:       %u running\n", s->running_execs);
	cli_lifetime_print(s);
	if (s->network != NULL && s->network->mode[0] != '\0' &&
	    strcmp(s->network->mode, "none") != 0) {
		printf("network:     %s", s->network->mode);
		for (size_t i = 0; i < s->network->n_allow; i++)
			printf("%s%s", i ? ", " : " (", s->network->allow[i]);
		printf("%s\n", s->network->n_allow ? ")" : " (nothing)");
	}
	if (s->session_id[0])
		printf("session:     %s (recorded; `moat history %s`)\n",
		    s->session_id, s->id);
	for (size_t i = 0; i < s->n_labels; i++)
		printf("label:       %s=%s\n", s->labels[i]->key,
		    s->labels[i]->value);
	moat_client_free_msg(s);
	return 0;
}

static int
sandbox_rm(struct cli *cli, int argc, char **argv)
{
	int first_failure = 0;

	if (argc < 1)
		return cli_usage_error("sandbox rm ID...",
		    "give one or more "
		    "sandbox ids (`moat sandbox ls` lists them)");
	for (int i = 0; i < argc; i++) {
		char *errmsg = NULL;
		int rv =
		    moat_client_destroy(cli_client(cli), argv[i], &errmsg);

		if (rv != MOAT_OK) {
			rv = cli_fail(cli, rv, errmsg, "destroying sandbox %s",
			    argv[i]);
			if (first_failure == 0)
				first_failure = rv;
			continue;
		}
		printf("%s\n", argv[i]);
	}
	return first_failure;
}

int
cmd_sandbox(struct cli *cli, int argc, char **argv)
{
	const char *sub;
	int i;

	if (argc < 2)
		return cli_usage_error(usage_all, "which sandbox command?");
	sub = argv[1];
	if (strcmp(sub, "create") == 0) {
		optind = 0;
		return sandbox_create(cli, argc - 1, argv + 1);
	}
	if (strcmp(sub, "keepalive") == 0) {
		optind = 0;
		return cli_sandbox_keepalive(cli, argc - 1, argv + 1);
	}
	/* ls, get and rm take --json anywhere, and nothing else. */
	for (i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			cli->json = true;
			memmove(&argv[i], &argv[i + 1],
			    (size_t)(argc - i) * sizeof(*argv));
			argc--;
			i--;
		}
	}
	if (strcmp(sub, "ls") == 0 || strcmp(sub, "list") == 0) {
		if (argc != 2)
			return cli_usage_error("sandbox ls",
			    "ls takes no "
			    "arguments");
		return sandbox_ls(cli);
	}
	if (strcmp(sub, "get") == 0) {
		if (argc != 3)
			return cli_usage_error("sandbox get ID",
			    "give one "
			    "sandbox id");
		return sandbox_get(cli, argv[2]);
	}
	if (strcmp(sub, "rm") == 0 || strcmp(sub, "destroy") == 0)
		return sandbox_rm(cli, argc - 2, argv + 2);
	return cli_usage_error(usage_all, "unknown sandbox command \"%s\"",
	    sub);
}
