/*
 * cordon.c: the node's cordon (cordon.h): the Cordon call, its file in
 * the state directory, the check creates and restores pass, and the
 * fields NodeInfo and the survey report. Not for: placement (gateway).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "cordon.h"
#include "node.h"

int
vmd_cordon_read(const char *path, bool *cordoned, char **reason)
{
	char *data = NULL;
	size_t len = 0;
	int err;

	*cordoned = false;
	*reason = NULL;
	if ((err = moat_read_file(path, VMD_CORDON_REASON_MAX * 4, &data,
	         &len)) != 0)
		return err == ENOENT ? 0 : err;
	while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r'))
		data[--len] = '\0';
	if (len > VMD_CORDON_REASON_MAX)
		data[VMD_CORDON_REASON_MAX] = '\0';
	for (char *p = data; *p != '\0'; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = ' ';
	*cordoned = true;
	*reason = data;
	return 0;
}

int
vmd_cordon_write(const char *path, bool cordoned, const char *reason)
{
	char buf[VMD_CORDON_REASON_MAX + 2];
	size_t n = 0;

	if (!cordoned)
		return unlink(path) == 0 || errno == ENOENT ? 0 : errno;
	for (const char *p = reason ? reason : "";
	     *p != '\0' && n < VMD_CORDON_REASON_MAX; p++)
		buf[n++] = ((unsigned char)*p < 0x20 || *p == 0x7f) ? ' ' : *p;
	buf[n++] = '\n';
	return moat_write_file_atomic(path, buf, n, 0600);
}

static char *
cordon_path(const struct vmd *vmd)
{
	return moat_asprintf("%s/" VMD_CORDON_FILE, vmd->cfg.state_dir);
}

void
vmd_cordon_load(struct vmd *vmd)
{
	char *path = cordon_path(vmd), *reason = NULL;
	bool cordoned = false;
	int err;

	if (path == NULL)
		return;
	if ((err = vmd_cordon_read(path, &cordoned, &reason)) != 0) {
		moat_warn(0,
		    "%s: %s: node counts as cordoned (fix or remove the "
		    "file, or `moat node uncordon %s`)",
		    path, strerror(err), vmd->cfg.node_id);
		cordoned = true;
		reason =
		    moat_asprintf("%s unreadable: %s", path, strerror(err));
	}
	if (cordoned)
		moat_info(0,
		    "node %s is cordoned (%s): it takes no new "
		    "sandboxes until `moat node uncordon %s`",
		    vmd->cfg.node_id, reason ? reason : "", vmd->cfg.node_id);
	pthread_mutex_lock(&vmd->mu);
	vmd->cordoned = cordoned;
	free(vmd->cordon_reason);
	vmd->cordon_reason = reason;
	pthread_mutex_unlock(&vmd->mu);
	free(path);
}

int
vmd_cordon_set(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CordonRequest *req)
{
	char *path = cordon_path(vmd), *reason = NULL;
	bool was;
	int err;

	if (path == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	/* Written first: what the node reports is what a restart keeps. */
	if ((err = vmd_cordon_write(path, req->cordoned, req->reason)) != 0 ||
	    (req->cordoned &&
	        (err = vmd_cordon_read(path, &was, &reason)) != 0)) {
		free(path);
		return moat_rpc_error(call, moat_status_from_errno(err),
		    "node %s: cannot %s %s/" VMD_CORDON_FILE ": %s",
		    vmd->cfg.node_id, req->cordoned ? "write" : "remove",
		    vmd->cfg.state_dir, strerror(err));
	}
	free(path);
	pthread_mutex_lock(&vmd->mu);
	was = vmd->cordoned;
	vmd->cordoned = req->cordoned;
	free(vmd->cordon_reason);
	vmd->cordon_reason = reason;
	pthread_mutex_unlock(&vmd->mu);
	if (was != req->cordoned)
		moat_info(call->request_id, "node %s %s%s%s", vmd->cfg.node_id,
		    req->cordoned ? "cordoned" : "uncordoned",
		    reason && reason[0] ? ": " : "", reason ? reason : "");
	return MOAT_OK;
}

int
vmd_cordon_check(struct vmd *vmd, struct moat_rpc_call *call, const char *what)
{
	char reason[VMD_CORDON_REASON_MAX + 1] = "";
	bool cordoned;

	pthread_mutex_lock(&vmd->mu);
	cordoned = vmd->cordoned;
	if (cordoned && vmd->cordon_reason != NULL)
		snprintf(reason, sizeof(reason), "%s", vmd->cordon_reason);
	pthread_mutex_unlock(&vmd->mu);
	if (!cordoned)
		return MOAT_OK;
	return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
	    "node %s is cordoned%s%s%s: it takes no new sandbox (%s refused); "
	    "place it on another node, or `moat node uncordon %s`",
	    vmd->cfg.node_id, reason[0] ? " (" : "", reason,
	    reason[0] ? ")" : "", what, vmd->cfg.node_id);
}

int
vmd_cordon_fill(struct vmd *vmd, Moat__V1__Node *node)
{
	pthread_mutex_lock(&vmd->mu);
	node->cordoned = vmd->cordoned;
	node->cordon_reason = strdup(
	    vmd->cordoned && vmd->cordon_reason ? vmd->cordon_reason : "");
	pthread_mutex_unlock(&vmd->mu);
	node->protocol_version = MOAT_PROTOCOL_VERSION;
	return node->cordon_reason != NULL ? MOAT_OK : MOAT_INTERNAL;
}
