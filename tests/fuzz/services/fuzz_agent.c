/*
 * fuzz_agent.c: fuzz target for the guest agent's request handlers
 * (guest/agent: loop.c's agent_dispatch and the file, mkdir, stat, list,
 * remove, info, fs_trace, exec_input/exec_signal, code_context_close,
 * shutdown and reset handlers; reset in host mode checks its request but
 * never sets the clock or hostname), fed any bytes as one frame body from the host. The
 * agent is confined to a temporary directory (--root) and answers into a
 * queue on /dev/null that is dropped after each input, so replies are
 * encoded too. Left out: requests that start processes (exec_start,
 * code_run); their decoding is still fuzzed (fuzz_guest.c) but they are
 * not run here. Not for: the frame layer
 * (fuzz_frame.c).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "fuzz.h"
#include "fuzz_proto.h"
#include "guest.pb-c.h"
#include "moat/log.h"
#include "moat/util.h"

static struct agent A;
static bool ready;
static char dir[] = "/tmp/moat-fuzz-agent-XXXXXX";

static void
cleanup(void)
{
	moat_rm_rf(dir);
}

static void
init(void)
{

	moat_log_init("fuzz-agent", MOAT_LOG_ERROR);
	moat_fuzz_check(mkdtemp(dir) != NULL, "mkdtemp");
	atexit(cleanup);
	A.sig_fd = A.lower_fd = A.upper_fd = -1;
	A.link.fd = A.link.listen_fd = -1;
	A.link.kind = AGENT_LINK_UNIX;
	A.root_fd = open(dir, O_DIRECTORY | O_PATH | O_CLOEXEC);
	moat_fuzz_check(A.root_fd >= 0, "open the root");
	A.confined = true;
	A.boot_ms = agent_now_ms();
	snprintf(A.kernel, sizeof(A.kernel), "fuzz");
	ready = true;
}

/* runs: whether the request may run here (no processes). */
static bool
runs(const uint8_t *data, size_t size)
{
	Moat__V1__GuestRequest *req =
	    moat__v1__guest_request__unpack(NULL, size, data);
	bool ok;

	if (req == NULL)
		return true; /* refused by the dispatcher: fine */
	ok = req->op_case != MOAT__V1__GUEST_REQUEST__OP_EXEC_START &&
	    req->op_case != MOAT__V1__GUEST_REQUEST__OP_CODE_RUN;
	moat__v1__guest_request__free_unpacked(req, NULL);
	return ok;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!ready)
		init();
	if (!runs(data, size))
		return 0;
	A.link.fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	moat_fuzz_check(A.link.fd >= 0, "open /dev/null");
	moat_frame_reader_init(&A.link.reader, MOAT_FRAME_MAX);
	agent_dispatch(&A, data, size);
	agent_link_close(&A, "fuzz input done");
	A.stopping = false;
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	Moat__V1__GuestRequest rq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestFileWrite fw = MOAT__V1__GUEST_FILE_WRITE__INIT;
	Moat__V1__GuestFileRead fr = MOAT__V1__GUEST_FILE_READ__INIT;
	Moat__V1__GuestPath gp = MOAT__V1__GUEST_PATH__INIT;
	Moat__V1__FsTraceRequest ft = MOAT__V1__FS_TRACE_REQUEST__INIT;
	Moat__V1__GuestInfoRequest info = MOAT__V1__GUEST_INFO_REQUEST__INIT;
	Moat__V1__ResetAfterRestore rs = MOAT__V1__RESET_AFTER_RESTORE__INIT;
	static uint8_t entropy[32];

	rq.id = 1;
	fw.path = "/work/a/b.txt";
	fw.data.data = (uint8_t *)"hello\n";
	fw.data.len = 6;
	fw.mode = 0600;
	fw.make_parents = 1;
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_WRITE;
	rq.file_write = &fw;
	moat_fuzz_add_packed(add, &rq.base);
	fw.path = "../../etc/passwd";
	fw.offset = 4096;
	fw.truncate = 1;
	moat_fuzz_add_packed(add, &rq.base);
	fr.path = "/work/a/b.txt";
	fr.length = 100;
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_READ;
	rq.file_read = &fr;
	moat_fuzz_add_packed(add, &rq.base);
	gp.path = "/work/a";
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_LIST;
	rq.file_list = &gp;
	moat_fuzz_add_packed(add, &rq.base);
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_STAT;
	rq.file_stat = &gp;
	moat_fuzz_add_packed(add, &rq.base);
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_MKDIR;
	rq.mkdir = &gp;
	moat_fuzz_add_packed(add, &rq.base);
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_REMOVE;
	rq.file_remove = &gp;
	moat_fuzz_add_packed(add, &rq.base);
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_FS_TRACE;
	ft.max_entries = 10;
	ft.hash = 1;
	rq.fs_trace = &ft;
	moat_fuzz_add_packed(add, &rq.base);
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	rq.info = &info;
	moat_fuzz_add_packed(add, &rq.base);
	rs.entropy.data = entropy;
	rs.entropy.len = sizeof(entropy);
	rs.unix_ns = 1700000000123456789ll;
	rs.hostname = "sb-1";
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_RESET;
	rq.reset = &rs;
	moat_fuzz_add_packed(add, &rq.base);
}
