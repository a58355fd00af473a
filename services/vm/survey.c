/*
 * survey.c: how the gateway finds this node. The gateway binds an nng
 * SURVEYOR socket; vmd dials it as a RESPONDENT and answers every survey
 * with an encoded moat.v1.Node (id, RPC address, capacity, use, images),
 * the same message NodeInfo returns. A vmd that stops answering is marked
 * unavailable by the gateway; there is no node list to edit. Not for:
 * the RPC server (moat/rpc.h).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/survey0/respond.h>

#include "moat/config.h"
#include "moat/log.h"
#include "moat/nng_close.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/tls.h"
#include "moat/util.h"
#include "ramdir.h"
#include "snapram.h"
#include "accel.h"
#include "cordon.h"
#include "image.h"
#include "node.h"
#include "sync.h"
#include "sandbox.h"
#include "survey.h"
#include "scratch.h"

/* One respondent per gateway survey address; a list (next). */
struct vmd_survey {
	struct vmd *vmd;
	nng_socket sock;
	pthread_t thread;
	atomic_bool stop; /* set by stop; the thread polls it */
	char *url;
	struct vmd_survey *next;
};

/* The thread never waits in nng longer than this, and stop joins it
 * before closing the socket: nng 1.5 can deadlock in nng_close while
 * another thread sits in a receive on the socket. */
#define SURVEY_POLL_MS 100

int
vmd_node_fill(struct vmd *vmd, Moat__V1__Node *node)
{
	const struct vmd_config *cfg = &vmd->cfg;
	char accel[8];
	char **images = NULL;
	size_t n_images = 0;
	uint32_t count = 0;

	node->node_id = strdup(cfg->node_id);
	node->rpc_url = strdup(
	    cfg->advertise_url[0] ? cfg->advertise_url : cfg->listen_url);
	node->vcpus_total = cfg->vcpus_total;
	node->memory_mib_total = cfg->memory_mib_total;
	pthread_mutex_lock(&vmd->mu);
	node->memory_mib_used = vmd->memory_mib_reserved;
	for (struct sandbox *sb = vmd->sandboxes; sb != NULL; sb = sb->next) {
		count++;
		pthread_mutex_lock(&sb->mu);
		switch (vmd_sandbox_api_state(sb)) {
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING:
			node->sandboxes_creating++;
			node->vcpus_used += sb->vcpus;
			break;
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING:
			node->sandboxes_running++;
			node->vcpus_used += sb->vcpus;
			break;
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED:
			node->sandboxes_failed++;
			break;
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED:
			node->sandboxes_stopped++;
			break;
		default:
			break;
		}
		pthread_mutex_unlock(&sb->mu);
	}
	pthread_mutex_unlock(&vmd->mu);
	node->sandboxes = count;
	vmd_accel_current(vmd, accel);
	node->accel = strdup(accel);
	node->driver = strdup(vmd->vmm->name);
	node->version = strdup(MOAT_VERSION);
	node->available = true;
	node->last_seen_unix_ms = moat_now_unix_ms();
	node->max_vcpus = cfg->max_vcpus;
	node->max_memory_mib = cfg->max_memory_mib;
	node->allow_tcg = cfg->allow_tcg || strcmp(cfg->accel, "tcg") == 0;
	(void)vmd_images_list(vmd, &images, &n_images);
	node->images = images;
	node->n_images = n_images;
	vmd_snapram_fill(vmd, node);
	node->ram_dir = strdup(vmd_ram_dir());
	/* Placement's figures (issue 15): scratch left, labels, protocol. */
	node->scratch_free_bytes = vmd_scratch_free(vmd);
	node->protocol_version = MOAT_PROTOCOL_VERSION;
	if (vmd_labels_fill(&cfg->labels, node) != MOAT_OK)
		return MOAT_INTERNAL;
	node->isolation = strdup(vmd_jail_isolation());
	if (vmd_cordon_fill(vmd, node) != MOAT_OK)
		return MOAT_INTERNAL;
	if (!node->node_id || !node->rpc_url || !node->accel ||
	    !node->driver || !node->version || !node->ram_dir ||
	    !node->isolation)
		return MOAT_INTERNAL;
	return MOAT_OK;
}

/* Frees what vmd_node_fill put in a Node that lives on the stack
 * (protobuf-c's free_unpacked would free the struct too). */
static void
node_fields_free(Moat__V1__Node *node)
{
	free(node->node_id);
	free(node->rpc_url);
	free(node->accel);
	free(node->driver);
	free(node->version);
	free(node->ram_dir);
	free(node->isolation);
	free(node->cordon_reason);
	for (size_t i = 0; i < node->n_images; i++)
		free(node->images[i]);
	free(node->images);
	vmd_labels_fill_free(node);
}

static void *
survey_main(void *arg)
{
	struct vmd_survey *s = arg;

	while (!atomic_load(&s->stop)) {
		Moat__V1__Node node = MOAT__V1__NODE__INIT;
		nng_msg *msg = NULL;
		size_t len;
		int rv;

		if ((rv = nng_recvmsg(s->sock, &msg, 0)) != 0) {
			if (rv == NNG_ECLOSED)
				break;
			if (rv == NNG_ETIMEDOUT)
				continue;
			moat_warn(0, "survey %s: receive failed: %s", s->url,
			    nng_strerror(rv));
			continue;
		}
		/* The survey's body is not used; the header routes the
		 * answer back, so keep the message and replace its body. */
		nng_msg_clear(msg);
		if (vmd_node_fill(s->vmd, &node) != MOAT_OK ||
		    nng_msg_realloc(msg,
		        len = moat__v1__node__get_packed_size(&node)) != 0) {
			nng_msg_free(msg);
			node_fields_free(&node);
			continue;
		}
		moat__v1__node__pack(&node, nng_msg_body(msg));
		node_fields_free(&node);
		if ((rv = nng_sendmsg(s->sock, msg, 0)) != 0) {
			nng_msg_free(msg);
			if (rv == NNG_ECLOSED)
				break;
		}
	}
	return NULL;
}

static int
survey_start_one(struct vmd *vmd, const char *url, struct vmd_survey **out,
    char **errmsg)
{
	struct vmd_survey *s;
	nng_dialer d;
	int rv, st = MOAT_OK;

	*out = NULL;
	*errmsg = NULL;
	if ((s = calloc(1, sizeof(*s))) == NULL ||
	    (s->url = strdup(url)) == NULL) {
		free(s);
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	s->vmd = vmd;
	if ((rv = nng_respondent0_open(&s->sock)) != 0) {
		*errmsg = moat_asprintf("survey: cannot open a respondent "
		                        "socket: %s",
		    nng_strerror(rv));
		goto fail;
	}
	nng_socket_set_ms(s->sock, NNG_OPT_RECVTIMEO, SURVEY_POLL_MS);
	nng_socket_set_ms(s->sock, NNG_OPT_SENDTIMEO, SURVEY_POLL_MS);
	/* Non-blocking dial: a gateway that is not up yet is found when it
	 * comes up (nng redials). On tls+tcp the gateway's certificate must
	 * name [vmd] survey-tls-name, and it checks ours. */
	if ((rv = nng_dialer_create(&d, s->sock, url)) != 0) {
		*errmsg = moat_asprintf(
		    "survey: cannot dial %s: %s (is it a "
		    "tls+tcp://, tcp:// or ipc:// url of the gateway's survey "
		    "socket?)",
		    url, nng_strerror(rv));
		nng_close(s->sock);
		goto fail;
	}
	if ((st = moat_tls_dialer_apply(d, url, vmd->cfg.tls,
	         vmd->cfg.survey_tls_name, "the survey dial ([vmd] survey)",
	         errmsg)) != MOAT_OK ||
	    (rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK)) != 0) {
		if (st == MOAT_OK)
			*errmsg = moat_asprintf("survey: cannot dial %s: %s",
			    url, nng_strerror(rv));
		nng_close(s->sock);
		free(s->url);
		free(s);
		return st != MOAT_OK ? st : moat_status_from_nng(rv);
	}
	if ((rv = vmd_thread_create(&s->thread, survey_main, s)) != 0) {
		*errmsg = moat_asprintf("survey: cannot start a thread: %s",
		    strerror(rv));
		nng_close(s->sock);
		free(s->url);
		free(s);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	moat_info(0, "answering surveys from %s", url);
	*out = s;
	return MOAT_OK;
fail:
	free(s->url);
	free(s);
	return moat_status_from_nng(rv);
}

static void
survey_stop_one(struct vmd_survey *s)
{
	atomic_store(&s->stop, true);
	pthread_join(s->thread, NULL);
	if (!moat_nng_close_bounded(s->sock, 2000))
		moat_warn(0,
		    "survey %s: closing the socket hung (an nng 1.5 "
		    "bug); left it open",
		    s->url);
	free(s->url);
	free(s);
}

void
vmd_survey_stop(struct vmd_survey *s)
{
	/* Every thread is told first, so the joins take one poll, not one
	 * per gateway. */
	for (struct vmd_survey *p = s; p != NULL; p = p->next)
		atomic_store(&p->stop, true);
	while (s != NULL) {
		struct vmd_survey *next = s->next;

		survey_stop_one(s);
		s = next;
	}
}

int
vmd_survey_split(const char *list, char ***urls, size_t *n, char **errmsg)
{
	char *copy = strdup(list), *tok;
	size_t len = strlen(list);

	*urls = NULL;
	*n = 0;
	*errmsg = NULL;
	if (copy == NULL ||
	    (*urls = calloc(len / 2 + 2, sizeof(**urls))) == NULL) {
		free(copy);
		*errmsg = strdup("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	/* strtok_r would skip an empty element; a typo like "a,,b" or a
	 * trailing comma is said instead. */
	for (char *rest = copy; (tok = strsep(&rest, ",")) != NULL;) {
		char *start, *end;

		for (start = tok; *start == ' ' || *start == '\t'; start++)
			;
		end = start + strlen(start);
		while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
			*--end = '\0';
		if (*start == '\0') {
			*errmsg = moat_asprintf(
			    "[vmd] survey \"%s\" has an empty address: give "
			    "the gateways' survey addresses separated by "
			    "commas (or --survey once per gateway)",
			    list);
			goto fail;
		}
		for (size_t i = 0; i < *n; i++)
			if (strcmp((*urls)[i], start) == 0) {
				*errmsg = moat_asprintf(
				    "[vmd] survey names %s twice: give each "
				    "gateway's survey address once",
				    start);
				goto fail;
			}
		if (((*urls)[(*n)++] = strdup(start)) == NULL) {
			*errmsg = strdup("out of memory");
			goto fail;
		}
	}
	free(copy);
	return MOAT_OK;
fail:
	free(copy);
	vmd_survey_split_free(*urls, *n);
	*urls = NULL;
	*n = 0;
	return MOAT_INVALID_ARGUMENT;
}

void
vmd_survey_split_free(char **urls, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(urls[i]);
	free(urls);
}

int
vmd_survey_start(struct vmd *vmd, const char *list, struct vmd_survey **out,
    char **errmsg)
{
	struct vmd_survey *head = NULL, **tail = &head;
	char **urls;
	size_t n;
	int rv;

	*out = NULL;
	if ((rv = vmd_survey_split(list, &urls, &n, errmsg)) != MOAT_OK)
		return rv;
	for (size_t i = 0; i < n; i++) {
		if ((rv = survey_start_one(vmd, urls[i], tail, errmsg)) !=
		    MOAT_OK) {
			vmd_survey_stop(head);
			vmd_survey_split_free(urls, n);
			return rv;
		}
		tail = &(*tail)->next;
	}
	vmd_survey_split_free(urls, n);
	*out = head;
	return MOAT_OK;
}

int
vmd_survey_flags(int argc, char **argv, struct moat_config *cfg)
{
	char *joined = NULL, *grown;
	size_t count = 0;
	int rv = MOAT_OK;

	for (int i = 1; i < argc; i++) {
		const char *v = NULL;

		if (strcmp(argv[i], "--") == 0)
			break;
		if (strcmp(argv[i], "--survey") == 0 && i + 1 < argc)
			v = argv[++i];
		else if (strncmp(argv[i], "--survey=", 9) == 0)
			v = argv[i] + 9;
		if (v == NULL)
			continue;
		grown = joined == NULL ? strdup(v) :
		                         moat_asprintf("%s,%s", joined, v);
		free(joined);
		if ((joined = grown) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		count++;
	}
	if (count > 1)
		rv = moat_config_set_flag(cfg, "vmd", "survey", joined);
	free(joined);
	return rv;
}
