/*
 * files.c: the file calls (read, write, list, stat, remove, mkdir) and the
 * other one-request guest calls (SandboxInfo, TraceFs), plus the helper
 * every guest call goes through: bounded by the RPC's deadline, the
 * agent's error code and message passed back unchanged. The agent moves at
 * most MOAT_GUEST_IO_MAX bytes of file data per frame, so reads and writes
 * loop. Not for: exec (exec.c).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "guest_link.h"
#include "moat/frame.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "files.h"
#include "node.h"
#include "sandbox.h"

uint64_t
vmd_call_deadline(const struct moat_rpc_call *call)
{
	uint64_t now = moat_rpc_now_ms();
	uint64_t d = call->deadline_ms;
	uint64_t margin;

	if (d == 0)
		d = now + MOAT_RPC_DEFAULT_TIMEOUT_MS;
	/* Leave time for the reply to travel before the caller gives up. */
	margin = d > now ? (d - now) / 10 : 0;
	if (margin > 250)
		margin = 250;
	return d - margin;
}

int
vmd_guest_call_until(struct sandbox *sb, struct moat_rpc_call *call,
    Moat__V1__GuestRequest *req, Moat__V1__GuestMessage__BodyCase want,
    uint64_t deadline_ms, Moat__V1__GuestMessage **reply, bool *answered)
{
	struct guest_link *link;
	Moat__V1__GuestMessage *msg = NULL;
	char *err = NULL;
	int rv;

	*reply = NULL;
	if (answered != NULL)
		*answered = false;
	pthread_mutex_lock(&sb->mu);
	link = sb->link;
	pthread_mutex_unlock(&sb->mu);
	if (link == NULL)
		return moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "sandbox %s has "
		    "no guest link",
		    sb->id.str);
	rv = guest_link_call(link, req, deadline_ms, &msg, &err);
	if (rv != MOAT_OK) {
		pthread_mutex_lock(&sb->mu);
		if (vmd_sandbox_api_state(sb) ==
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED)
			rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
			    "sandbox %s has failed: %s", sb->id.str,
			    sb->failure_reason ? sb->failure_reason : "?");
		else if (vmd_sandbox_stop_asked(sb))
			rv = moat_rpc_error(call, MOAT_UNAVAILABLE,
			    "sandbox "
			    "%s was destroyed during the call",
			    sb->id.str);
		else
			rv = moat_rpc_error(call, rv, "sandbox %s: %s",
			    sb->id.str, err ? err : "?");
		pthread_mutex_unlock(&sb->mu);
		free(err);
		return rv;
	}
	if (answered != NULL)
		*answered = true;
	if (msg->code != MOAT__V1__CODE__OK) {
		int code = (int)msg->code;

		if (code < 1 || code > MOAT_STATUS_MAX)
			code = MOAT_UNKNOWN;
		rv = moat_rpc_error(call, code, "%s",
		    msg->message[0] ? msg->message : moat_strerror(code));
		moat__v1__guest_message__free_unpacked(msg, NULL);
		return rv;
	}
	if (want != MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET &&
	    msg->body_case != want) {
		moat__v1__guest_message__free_unpacked(msg, NULL);
		return moat_rpc_error(call, MOAT_INTERNAL,
		    "sandbox %s: the "
		    "guest agent answered with an unexpected message",
		    sb->id.str);
	}
	*reply = msg;
	return MOAT_OK;
}

int
vmd_guest_call(struct sandbox *sb, struct moat_rpc_call *call,
    Moat__V1__GuestRequest *req, Moat__V1__GuestMessage__BodyCase want,
    Moat__V1__GuestMessage **reply)
{
	return vmd_guest_call_until(sb, call, req, want,
	    vmd_call_deadline(call), reply, NULL);
}

/* Moves a FileInfo's heap fields into `dst` (an initialised reply) and
 * frees the rest. */
static int
file_info_take(Moat__V1__FileInfo *dst, Moat__V1__FileInfo *src)
{
	dst->size = src->size;
	dst->mode = src->mode;
	dst->mtime_ns = src->mtime_ns;
	dst->type = src->type;
	dst->name = strdup(src->name);
	dst->path = strdup(src->path);
	return dst->name && dst->path ? MOAT_OK : MOAT_INTERNAL;
}

static int
path_check(struct moat_rpc_call *call, const char *path)
{
	if (path == NULL || path[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "path is "
		    "empty: give a path in the sandbox (relative paths are "
		    "from /root)");
	if (strlen(path) > 4096)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "path is "
		    "longer than 4096 bytes");
	return MOAT_OK;
}

/* One GuestPath request returning `want`. */
static int
path_call(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req, Moat__V1__GuestRequest__OpCase op,
    Moat__V1__GuestMessage__BodyCase want, struct sandbox **sbp,
    Moat__V1__GuestMessage **msg)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestPath gp = MOAT__V1__GUEST_PATH__INIT;
	int rv;

	*sbp = NULL;
	if ((rv = path_check(call, req->path)) != MOAT_OK)
		return rv;
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, sbp)) !=
	    MOAT_OK)
		return rv;
	gp.path = req->path;
	gp.recursive = req->recursive;
	gp.mode = req->mode;
	gp.parents = req->parents;
	greq.op_case = op;
	switch (op) {
	case MOAT__V1__GUEST_REQUEST__OP_FILE_LIST:
		greq.file_list = &gp;
		break;
	case MOAT__V1__GUEST_REQUEST__OP_FILE_STAT:
		greq.file_stat = &gp;
		break;
	case MOAT__V1__GUEST_REQUEST__OP_FILE_REMOVE:
		greq.file_remove = &gp;
		break;
	default:
		greq.mkdir = &gp;
		break;
	}
	rv = vmd_guest_call(*sbp, call, &greq, want, msg);
	if (rv != MOAT_OK) {
		vmd_sandbox_put(*sbp);
		*sbp = NULL;
	}
	return rv;
}

int
vmd_file_read(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__FileReadRequest *req, Moat__V1__FileData *reply)
{
	struct sandbox *sb;
	uint64_t want = req->length ? req->length : VMD_FILE_READ_MAX;
	uint64_t off = req->offset;
	size_t got = 0;
	int rv;

	if ((rv = path_check(call, req->path)) != MOAT_OK)
		return rv;
	if (want > VMD_FILE_READ_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "length %u is "
		    "over the %u-byte limit of one ReadFile: read in parts "
		    "with offset",
		    req->length, VMD_FILE_READ_MAX);
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	reply->eof = false;
	while (got < want) {
		Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__GuestFileRead fr = MOAT__V1__GUEST_FILE_READ__INIT;
		Moat__V1__GuestMessage *msg = NULL;
		Moat__V1__FileData *fd;
		uint8_t *grown;
		size_t n;

		greq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_READ;
		greq.file_read = &fr;
		fr.path = req->path;
		fr.offset = off;
		fr.length = want - got > MOAT_GUEST_IO_MAX ?
		    MOAT_GUEST_IO_MAX :
		    (uint32_t)(want - got);
		if ((rv = vmd_guest_call(sb, call, &greq,
		         MOAT__V1__GUEST_MESSAGE__BODY_FILE_DATA, &msg)) !=
		    MOAT_OK)
			goto out;
		fd = msg->file_data;
		n = fd->data.len;
		if (n > fr.length) {
			moat__v1__guest_message__free_unpacked(msg, NULL);
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "sandbox %s: "
			    "the guest sent %zu bytes for a %u-byte read",
			    sb->id.str, n, fr.length);
			goto out;
		}
		reply->size = fd->size;
		reply->mode = fd->mode;
		if (n > 0) {
			if ((grown = realloc(reply->data.data, got + n)) ==
			    NULL) {
				moat__v1__guest_message__free_unpacked(msg,
				    NULL);
				rv = moat_rpc_error(call, MOAT_INTERNAL,
				    "out of memory");
				goto out;
			}
			reply->data.data = grown;
			memcpy(grown + got, fd->data.data, n);
			got += n;
			reply->data.len = got;
			off += n;
		}
		reply->eof = fd->eof;
		moat__v1__guest_message__free_unpacked(msg, NULL);
		if (reply->eof || n == 0)
			break;
	}
	if (!reply->eof && off >= reply->size)
		reply->eof = true;
out:
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_file_write(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__FileWriteRequest *req, Moat__V1__FileInfo *reply)
{
	Moat__V1__GuestMessage *last = NULL;
	struct sandbox *sb;
	size_t off = 0;
	int rv;

	if ((rv = path_check(call, req->path)) != MOAT_OK)
		return rv;
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	do {
		Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__GuestFileWrite fw = MOAT__V1__GUEST_FILE_WRITE__INIT;
		Moat__V1__GuestMessage *msg = NULL;
		size_t n = req->data.len - off;
		bool first = off == 0;

		if (n > MOAT_GUEST_IO_MAX)
			n = MOAT_GUEST_IO_MAX;
		greq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_WRITE;
		greq.file_write = &fw;
		fw.path = req->path;
		fw.offset = req->offset + off;
		fw.data.data = n ? req->data.data + off : NULL;
		fw.data.len = n;
		fw.mode = req->mode;
		/* Truncation and parents only with the first part: later
		 * parts extend what the first wrote. */
		fw.truncate = first && req->truncate;
		fw.make_parents = first && req->make_parents;
		if ((rv = vmd_guest_call(sb, call, &greq,
		         MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, &msg)) !=
		    MOAT_OK)
			goto out;
		off += n;
		if (last != NULL)
			moat__v1__guest_message__free_unpacked(last, NULL);
		last = msg;
	} while (off < req->data.len);

	if (last->body_case == MOAT__V1__GUEST_MESSAGE__BODY_FILE_STAT) {
		if (file_info_take(reply, last->file_stat) != MOAT_OK)
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
	} else {
		/* The agent only acknowledged: ask for the result. */
		Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__GuestPath gp = MOAT__V1__GUEST_PATH__INIT;
		Moat__V1__GuestMessage *msg = NULL;

		greq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_STAT;
		greq.file_stat = &gp;
		gp.path = req->path;
		if ((rv = vmd_guest_call(sb, call, &greq,
		         MOAT__V1__GUEST_MESSAGE__BODY_FILE_STAT, &msg)) ==
		    MOAT_OK) {
			if (file_info_take(reply, msg->file_stat) != MOAT_OK)
				rv = moat_rpc_error(call, MOAT_INTERNAL,
				    "out of memory");
			moat__v1__guest_message__free_unpacked(msg, NULL);
		}
	}
out:
	if (last != NULL)
		moat__v1__guest_message__free_unpacked(last, NULL);
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_file_list(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req, Moat__V1__FileList *reply)
{
	Moat__V1__GuestMessage *msg = NULL;
	struct sandbox *sb;
	int rv;

	if ((rv = path_call(vmd, call, req,
	         MOAT__V1__GUEST_REQUEST__OP_FILE_LIST,
	         MOAT__V1__GUEST_MESSAGE__BODY_FILE_LIST, &sb, &msg)) !=
	    MOAT_OK)
		return rv;
	/* Steal the entries: both messages are heap-allocated the same
	 * way (protobuf-c's default allocator is malloc). */
	reply->entries = msg->file_list->entries;
	reply->n_entries = msg->file_list->n_entries;
	msg->file_list->entries = NULL;
	msg->file_list->n_entries = 0;
	moat__v1__guest_message__free_unpacked(msg, NULL);
	vmd_sandbox_put(sb);
	return MOAT_OK;
}

int
vmd_file_stat(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req, Moat__V1__FileInfo *reply)
{
	Moat__V1__GuestMessage *msg = NULL;
	struct sandbox *sb;
	int rv;

	if ((rv = path_call(vmd, call, req,
	         MOAT__V1__GUEST_REQUEST__OP_FILE_STAT,
	         MOAT__V1__GUEST_MESSAGE__BODY_FILE_STAT, &sb, &msg)) !=
	    MOAT_OK)
		return rv;
	if (file_info_take(reply, msg->file_stat) != MOAT_OK)
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	moat__v1__guest_message__free_unpacked(msg, NULL);
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_file_remove(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req)
{
	Moat__V1__GuestMessage *msg = NULL;
	struct sandbox *sb;
	int rv;

	if ((rv = path_call(vmd, call, req,
	         MOAT__V1__GUEST_REQUEST__OP_FILE_REMOVE,
	         MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, &sb, &msg)) !=
	    MOAT_OK)
		return rv;
	moat__v1__guest_message__free_unpacked(msg, NULL);
	vmd_sandbox_put(sb);
	return MOAT_OK;
}

int
vmd_file_mkdir(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req, Moat__V1__FileInfo *reply)
{
	Moat__V1__GuestMessage *msg = NULL;
	struct sandbox *sb;
	int rv;

	if ((rv = path_call(vmd, call, req, MOAT__V1__GUEST_REQUEST__OP_MKDIR,
	         MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, &sb, &msg)) !=
	    MOAT_OK)
		return rv;
	if (msg->body_case == MOAT__V1__GUEST_MESSAGE__BODY_FILE_STAT) {
		if (file_info_take(reply, msg->file_stat) != MOAT_OK)
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
	} else {
		reply->path = strdup(req->path);
		reply->type = MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
		if (reply->path == NULL)
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
	}
	moat__v1__guest_message__free_unpacked(msg, NULL);
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_guest_info(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SandboxRef *req, Moat__V1__GuestInfo *reply)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestInfoRequest gi = MOAT__V1__GUEST_INFO_REQUEST__INIT;
	Moat__V1__GuestMessage *msg = NULL;
	Moat__V1__GuestInfo *info;
	struct sandbox *sb;
	int rv;

	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	greq.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	greq.info = &gi;
	if ((rv = vmd_guest_call(sb, call, &greq,
	         MOAT__V1__GUEST_MESSAGE__BODY_INFO, &msg)) == MOAT_OK) {
		info = msg->info;
		/* Move the whole message: swap the string pointers out so
		 * freeing msg leaves them to the reply. */
		*reply = *info;
		info->kernel = NULL;
		info->agent_version = NULL;
		moat__v1__guest_message__free_unpacked(msg, NULL);
	}
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_fs_trace(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__FsTraceCall *req, Moat__V1__FsTrace *reply)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__FsTraceRequest ft = MOAT__V1__FS_TRACE_REQUEST__INIT;
	Moat__V1__GuestMessage *msg = NULL;
	struct sandbox *sb;
	int rv;

	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	greq.op_case = MOAT__V1__GUEST_REQUEST__OP_FS_TRACE;
	greq.fs_trace = &ft;
	ft.hash = req->hash;
	if ((rv = vmd_guest_call(sb, call, &greq,
	         MOAT__V1__GUEST_MESSAGE__BODY_FS_TRACE, &msg)) == MOAT_OK) {
		reply->entries = msg->fs_trace->entries;
		reply->n_entries = msg->fs_trace->n_entries;
		reply->truncated = msg->fs_trace->truncated;
		msg->fs_trace->entries = NULL;
		msg->fs_trace->n_entries = 0;
		moat__v1__guest_message__free_unpacked(msg, NULL);
	}
	vmd_sandbox_put(sb);
	return rv;
}

/* archive_take: fills an ArchivePutReply from the agent's answer. */
static int
archive_put_take(Moat__V1__ArchivePutReply *reply,
    const Moat__V1__GuestArchive *ga)
{
	/* An initialised reply's strings are protobuf-c's shared "". */
	if (reply->upload_id != protobuf_c_empty_string)
		free(reply->upload_id);
	if ((reply->upload_id = strdup(ga->id)) == NULL)
		return MOAT_INTERNAL;
	reply->received = ga->received;
	reply->done = ga->done;
	reply->files = (uint32_t)ga->files;
	reply->dirs = (uint32_t)ga->dirs;
	reply->symlinks = (uint32_t)ga->symlinks;
	reply->bytes = ga->bytes;
	return MOAT_OK;
}

int
vmd_archive_put(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ArchivePutRequest *req, Moat__V1__ArchivePutReply *reply)
{
	struct sandbox *sb;
	size_t off = 0;
	int rv;

	if ((rv = path_check(call, req->path)) != MOAT_OK)
		return rv;
	if (req->data.len > VMD_ARCHIVE_CHUNK_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "a chunk of %zu bytes is over the %u-byte limit of one "
		    "PutArchive: send the archive in smaller chunks",
		    req->data.len, VMD_ARCHIVE_CHUNK_MAX);
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	/* The agent takes MOAT_GUEST_IO_MAX a frame: one RPC chunk is
	 * several guest chunks of the same upload, `last` on the final. */
	do {
		Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__GuestArchivePut gp =
		    MOAT__V1__GUEST_ARCHIVE_PUT__INIT;
		Moat__V1__GuestMessage *msg = NULL;
		size_t n = req->data.len - off;

		if (n > MOAT_GUEST_IO_MAX)
			n = MOAT_GUEST_IO_MAX;
		greq.op_case = MOAT__V1__GUEST_REQUEST__OP_ARCHIVE_PUT;
		greq.archive_put = &gp;
		gp.path = req->path;
		gp.upload_id = reply->upload_id && reply->upload_id[0] ?
		    reply->upload_id :
		    req->upload_id;
		gp.offset = req->offset + off;
		gp.data.data = n ? req->data.data + off : NULL;
		gp.data.len = n;
		gp.last = req->last && off + n == req->data.len;
		gp.max_bytes = vmd->cfg.archive_max_bytes;
		if ((rv = vmd_guest_call(sb, call, &greq,
		         MOAT__V1__GUEST_MESSAGE__BODY_ARCHIVE, &msg)) !=
		    MOAT_OK)
			break;
		rv = archive_put_take(reply, msg->archive);
		moat__v1__guest_message__free_unpacked(msg, NULL);
		if (rv != MOAT_OK) {
			rv = moat_rpc_error(call, rv, "out of memory");
			break;
		}
		off += n;
	} while (off < req->data.len);
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_archive_get(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ArchiveGetRequest *req, Moat__V1__ArchiveGetReply *reply)
{
	uint64_t want = req->length ? req->length : VMD_ARCHIVE_CHUNK_MAX;
	struct sandbox *sb;
	size_t got = 0;
	int rv;

	if ((rv = path_check(call, req->path)) != MOAT_OK)
		return rv;
	if (want > VMD_ARCHIVE_CHUNK_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "length %u is over the %u-byte limit of one GetArchive: "
		    "read in chunks with offset",
		    req->length, VMD_ARCHIVE_CHUNK_MAX);
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	while (got < want) {
		Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__GuestArchiveGet gg =
		    MOAT__V1__GUEST_ARCHIVE_GET__INIT;
		Moat__V1__GuestMessage *msg = NULL;
		Moat__V1__GuestArchive *ga;
		uint8_t *grown;
		bool last;

		greq.op_case = MOAT__V1__GUEST_REQUEST__OP_ARCHIVE_GET;
		greq.archive_get = &gg;
		gg.path = req->path;
		gg.download_id = reply->download_id && reply->download_id[0] ?
		    reply->download_id :
		    req->download_id;
		gg.offset = req->offset + got;
		gg.length = want - got > MOAT_GUEST_IO_MAX ?
		    MOAT_GUEST_IO_MAX :
		    (uint32_t)(want - got);
		if ((rv = vmd_guest_call(sb, call, &greq,
		         MOAT__V1__GUEST_MESSAGE__BODY_ARCHIVE, &msg)) !=
		    MOAT_OK)
			break;
		ga = msg->archive;
		if (ga->data.len > gg.length) {
			moat__v1__guest_message__free_unpacked(msg, NULL);
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "sandbox %s: the guest sent %zu bytes for a "
			    "%u-byte read",
			    sb->id.str, ga->data.len, gg.length);
			break;
		}
		if (reply->download_id != protobuf_c_empty_string)
			free(reply->download_id);
		reply->download_id = strdup(ga->id);
		grown = ga->data.len ?
		    realloc(reply->data.data, got + ga->data.len) :
		    reply->data.data;
		if (reply->download_id == NULL ||
		    (ga->data.len && grown == NULL)) {
			moat__v1__guest_message__free_unpacked(msg, NULL);
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
			break;
		}
		if (ga->data.len) {
			reply->data.data = grown;
			memcpy(grown + got, ga->data.data, ga->data.len);
			got += ga->data.len;
			reply->data.len = got;
		}
		reply->size = ga->size;
		reply->eof = ga->eof;
		last = reply->eof || ga->data.len == 0;
		moat__v1__guest_message__free_unpacked(msg, NULL);
		if (last)
			break;
	}
	vmd_sandbox_put(sb);
	return rv;
}
