/*
 * fuzz_sessiond.c: fuzz target for moat-sessiond's request decoding and
 * checks (services/session: handlers.c, validate.c, the writer): each
 * input is one request to a detached server of the Session service over
 * a real store in a temporary directory (fuzz_service.h). Any bytes must
 * get a Reply with the request's id and a message with every error.
 * Not for: the nng transport, TLS, or the store's format check (main.c).
 */
#include "fuzz_service.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/store.h"
#include "sessiond.h"
#include "session.pb-c.h"

static struct moat_rpc_server *srv;
static struct sessiond sd;

static void
init(void)
{
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__session__descriptor,
		.methods = sessiond_methods,
		.n_methods = sessiond_n_methods,
		.ctx = &sd,
	};
	char *errmsg = NULL;

	moat_log_init("fuzz-sessiond", MOAT_LOG_ERROR);
	sd.store_dir = fuzz_service_dir("sessiond");
	sd.map_mib = 256;
	moat_fuzz_check(moat_store_open(&sd.store, sd.store_dir, 256u << 20,
	                    sessiond_dbs, &errmsg) == MOAT_OK,
	    "store");
	moat_fuzz_check(sessiond_writer_start(&sd.writer, sd.store, &errmsg) ==
	        MOAT_OK,
	    "writer");
	/* Issue 15's stores, as moat-sessiond opens them (small bounds). */
	sd.idem_ttl_ms = 600000;
	sd.idem_max = 1000;
	sd.audit_max_age_s = 86400;
	sd.audit_max_bytes = 16u << 20;
	moat_fuzz_check(sessiond_idem_open(&sd, sd.store_dir, &errmsg) ==
	        MOAT_OK,
	    "idempotency store");
	moat_fuzz_check(sessiond_keys_open(&sd, sd.store_dir, &errmsg) ==
	        MOAT_OK,
	    "keys store");
	moat_fuzz_check(sessiond_audit_open(&sd, sd.store_dir, &errmsg) ==
	        MOAT_OK,
	    "audit store");
	sd.mcp_ttl_ms = 3600000;
	sd.mcp_max = 1000;
	moat_fuzz_check(sessiond_mcp_open(&sd, sd.store_dir, &errmsg) ==
	        MOAT_OK,
	    "MCP session store");
	fuzz_service_start(&srv, &svc);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return fuzz_service_input(&srv, init, &moat__v1__session__descriptor,
	    data, size);
}

/* method: the index of `name` in the service. */
static unsigned
method(const char *name)
{
	return fuzz_service_method(&moat__v1__session__descriptor, name);
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	Moat__V1__CreateSessionRequest cs =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	Moat__V1__CreateSessionRequest__LabelsEntry le =
	    MOAT__V1__CREATE_SESSION_REQUEST__LABELS_ENTRY__INIT;
	Moat__V1__CreateSessionRequest__LabelsEntry *les[] = { &le };
	Moat__V1__AppendStepRequest as = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step st = MOAT__V1__STEP__INIT;
	Moat__V1__ListSessionsRequest ls =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	Moat__V1__GetStepRequest gs = MOAT__V1__GET_STEP_REQUEST__INIT;
	Moat__V1__GetSessionRequest gse = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
	char *argv[] = { "sh", "-c", "ls" };

	fuzz_service_seed(add, method("Health"), &h.base);
	cs.tenant = "acme";
	cs.sandbox_id = "sb-0123456789abcdef";
	le.key = "agent";
	le.value = "claude";
	cs.n_labels = 1;
	cs.labels = les;
	cs.snapshot_policy = MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY;
	fuzz_service_seed(add, method("CreateSession"), &cs.base);
	cs.parent_session_id = "ses-0123456789abcdef";
	cs.parent_step = 3;
	fuzz_service_seed(add, method("CreateSession"), &cs.base);
	as.tenant = "acme";
	as.session_id = "ses-0123456789abcdef";
	st.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	st.input = "ls -la";
	st.n_argv = 3;
	st.argv = argv;
	st.stdout.data = (uint8_t *)"out\n";
	st.stdout.len = 4;
	st.exit_code = 1;
	st.snapshot_id = "snap-1";
	as.step = &st;
	fuzz_service_seed(add, method("AppendStep"), &as.base);
	ls.tenant = "acme";
	ls.page_size = 5;
	ls.page_token = "AAAA";
	fuzz_service_seed(add, method("ListSessions"), &ls.base);
	gs.tenant = "acme";
	gs.session_id = "ses-0123456789abcdef";
	gs.index = 1;
	fuzz_service_seed(add, method("GetStep"), &gs.base);
	gse.tenant = "zeta";
	gse.session_id = "not-an-id";
	fuzz_service_seed(add, method("GetSession"), &gse.base);
	fuzz_service_seed_methods(add, &moat__v1__session__descriptor);
}
