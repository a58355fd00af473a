"""stream_test.py ADDR STUBS: Gateway.ExecStream, Attach (a pty python3
REPL, and cat on pipes) and unary calls through
the gRPC door of a whole stack (stream_test.sh starts it), with stubs
generated from proto/ into STUBS and MOAT_API_KEY the stack's key. Each
check prints ok/FAIL; exit 1 on any failure. No check decides by time:
order of events, and processes looked for until found gone (bounded).
Not for: the door without a node (grpc_test.py)."""
import os
import queue
import sys
import time

import grpc

addr, stubs = sys.argv[1], sys.argv[2]
sys.path.insert(0, stubs)
import gateway_pb2  # noqa: E402
import gateway_pb2_grpc  # noqa: E402
import session_pb2  # noqa: E402
import vm_pb2  # noqa: E402

auth = (("authorization", "Bearer " + os.environ["MOAT_API_KEY"]),)
failed = 0


def check(ok, what):
    global failed
    print(("ok - " if ok else "FAIL - ") + what, flush=True)
    if not ok:
        failed += 1


gw = gateway_pb2_grpc.GatewayStub(grpc.insecure_channel(addr))
sb = gw.CreateSandbox(vm_pb2.CreateSandboxRequest(), metadata=auth,
                      timeout=600)
sid = sb.id
check(bool(sid), "CreateSandbox over gRPC: %s" % sid)
# With a node up, a sandbox nobody has is NOT_FOUND (no node: UNAVAILABLE,
# as the gateway cannot tell it from one on a node that is away).
try:
    gw.GetSandbox(vm_pb2.SandboxRef(sandbox_id="sb-0000000000000000"),
                  metadata=auth, timeout=30)
    code, msg = grpc.StatusCode.OK, ""
except grpc.RpcError as e:
    code, msg = e.code(), e.details()
check(code == grpc.StatusCode.NOT_FOUND and "sb-0000000000000000" in msg,
      "GetSandbox of a missing sandbox: NOT_FOUND naming it (%s: %r)"
      % (code, msg))
# A 1 ms deadline on a command that sleeps: over before any answer can
# come, by the client's timer or the gateway's (DEADLINE_EXCEEDED both).
try:
    gw.Exec(vm_pb2.ExecRequest(sandbox_id=sid, shell="sleep 3"),
            metadata=auth, timeout=0.001)
    code = grpc.StatusCode.OK
except grpc.RpcError as e:
    code = e.code()
check(code == grpc.StatusCode.DEADLINE_EXCEEDED,
      "a 1 ms deadline on Exec sleep 3: DEADLINE_EXCEEDED (%s)" % code)


def running(pattern):
    """Whether a process whose command line has `pattern` runs in the
    sandbox (the pattern's last character bracketed, so that the grep
    does not find itself)."""
    pat = pattern[:-1] + "[" + pattern[-1] + "]"
    r = gw.Exec(vm_pb2.ExecRequest(
        sandbox_id=sid,
        shell="cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | "
              "grep -q '%s'" % pat), metadata=auth, timeout=120)
    return r.status.exit_code == 0


def gone(pattern):
    for _ in range(60):
        if not running(pattern):
            return True
        time.sleep(1)
    return False


# Output as it comes: started, each line its own event, stderr, exit 4.
events = list(gw.ExecStream(vm_pb2.ExecRequest(
    sandbox_id=sid,
    shell="for i in 1 2 3; do echo line$i; sleep 1; done; "
          "echo err >&2; exit 4"), metadata=auth, timeout=300))
kinds = [e.WhichOneof("event") for e in events]
check(kinds and kinds[0] == "started" and events[0].started.exec_id > 0,
      "ExecStream: the first event is started with the handle (%s)" % kinds)
outs = [e.stdout for e in events if e.WhichOneof("event") == "stdout"]
check(b"".join(outs) == b"line1\nline2\nline3\n",
      "ExecStream: stdout is the three lines (%r)" % outs)
i1 = [i for i, e in enumerate(events) if b"line1" in e.stdout]
i3 = [i for i, e in enumerate(events) if b"line3" in e.stdout]
check(i1 and i3 and i1[0] < i3[0],
      "ExecStream: line1 came in an event before line3's, while the "
      "process still ran (events %s)" % kinds)
errs = b"".join(e.stderr for e in events if e.WhichOneof("event") ==
                "stderr")
check(errs == b"err\n", "ExecStream: stderr 'err' (%r)" % errs)
check(kinds[-1] == "exit" and events[-1].exit.exited and
      events[-1].exit.exit_code == 4,
      "ExecStream: the last event is exit with code 4")

# A stream the client cancels: its process is killed.
call = gw.ExecStream(vm_pb2.ExecRequest(
    sandbox_id=sid, shell="echo ready; exec sleep 307"), metadata=auth,
    timeout=300)
seen = []
for e in call:
    seen.append(e.WhichOneof("event"))
    if e.WhichOneof("event") == "stdout":
        break
check(seen[:1] == ["started"] and running("sleep 307"),
      "a streamed sleep runs (%s)" % seen)
call.cancel()
check(gone("sleep 307"), "a cancelled ExecStream: its process is killed")

# A 1 s deadline on a long command: DEADLINE_EXCEEDED, process gone.
code = None
try:
    for e in gw.ExecStream(vm_pb2.ExecRequest(
            sandbox_id=sid, shell="exec sleep 308"), metadata=auth,
            timeout=1):
        pass
except grpc.RpcError as err:
    code = err.code()
check(code == grpc.StatusCode.DEADLINE_EXCEEDED,
      "ExecStream past a 1 s deadline: DEADLINE_EXCEEDED (%s)" % code)
check(gone("sleep 308"), "past its deadline: its process is killed")

def attach(start):
    """An Attach of `start`: the queue its later inputs go into (None
    ends the client's side) and the call's events."""
    q = queue.Queue()

    def inputs():
        yield vm_pb2.AttachInput(start=start)
        while True:
            item = q.get()
            if item is None:
                return
            yield item
    return q, gw.Attach(inputs(), metadata=auth, timeout=120)


def read_until(events, want, log, after=b""):
    """Appends the events to log until stdout holds `want` after the
    first `after` (True) or the process exited (False)."""
    for e in events:
        log.append(e)
        out = b"".join(x.stdout for x in log
                       if x.WhichOneof("event") == "stdout")
        i = out.find(after)
        if i >= 0 and want in out[i:]:
            return True
        if e.WhichOneof("event") == "exit":
            return False
    return False


def drain(events):
    """The rest of the events, and the call's status code."""
    rest = []
    try:
        for e in events:
            rest.append(e)
    except grpc.RpcError as err:
        return rest, err.code()
    return rest, grpc.StatusCode.OK


# Pipes: cat echoes stdin and ends when it closes.
q, events = attach(vm_pb2.ExecRequest(sandbox_id=sid, shell="cat"))
q.put(vm_pb2.AttachInput(stdin=b"hello\n"))
q.put(vm_pb2.AttachInput(close_stdin=True))
log, code = drain(events)
q.put(None)
out = b"".join(e.stdout for e in log if e.WhichOneof("event") == "stdout")
check(out == b"hello\n" and log and log[-1].WhichOneof("event") == "exit" and
      log[-1].exit.exit_code == 0,
      "Attach without a pty: cat gives back hello and exits 0 after "
      "close_stdin (%r, %s)" % (out, code))

# A terminal: python3's REPL answers, sees its new window, and Ctrl-D
# ends it with code 0.
q, events = attach(vm_pb2.ExecRequest(sandbox_id=sid, shell="python3 -i",
                                      pty=True, rows=24, cols=80))
log = []
q.put(vm_pb2.AttachInput(stdin=b"print(6*7)\n"))
check(read_until(events, b"42", log),
      "Attach with a pty: python3 prints 42 (%r)" % log[-3:])
check(log[0].WhichOneof("event") == "started",
      "Attach: the first event is started")
q.put(vm_pb2.AttachInput(resize=vm_pb2.TerminalSize(rows=30, cols=100)))
q.put(vm_pb2.AttachInput(
    stdin=b"import os; print(os.get_terminal_size())\n"))
check(read_until(events, b"columns=100, lines=30", log),
      "Attach: after resize 30x100 python3 sees columns=100, lines=30")
# Ctrl-D once the prompt is back, as a person would: typed ahead, the
# line discipline turns it into a NUL byte when readline takes over.
check(read_until(events, b">>> ", log, after=b"lines=30"),
      "Attach: python3 prompts again")
q.put(vm_pb2.AttachInput(stdin=b"\x04"))
rest, code = drain(events)
q.put(None)
check(rest and rest[-1].WhichOneof("event") == "exit" and
      rest[-1].exit.exited and rest[-1].exit.exit_code == 0,
      "Attach: Ctrl-D ends python3 with code 0 (%s, %r)" % (code, rest))

r = gw.RunCode(vm_pb2.RunCodeRequest(sandbox_id=sid, code="6*7"),
               metadata=auth, timeout=300)
check(r.result.result == "42", "RunCode over gRPC: 6*7 is %r"
      % r.result.result)

# A recorded sandbox: a step, then RestoreStep to it, all unary gRPC.
rec = gw.CreateSandbox(vm_pb2.CreateSandboxRequest(
    record=True, snapshot_policy=session_pb2.SNAPSHOT_POLICY_EVERY),
    metadata=auth, timeout=600)
x = gw.Exec(vm_pb2.ExecRequest(sandbox_id=rec.id,
                               shell="echo kept > /root/f"),
            metadata=auth, timeout=300)
check(x.step_index == 1 and x.session_id,
      "a recorded Exec over gRPC is step 1 (%d, %r)"
      % (x.step_index, x.recording_error))
rs = gw.RestoreStep(gateway_pb2.RestoreStepRequest(
    session_id=x.session_id, step=1, new_sandbox=True), metadata=auth,
    timeout=600)
y = gw.Exec(vm_pb2.ExecRequest(sandbox_id=rs.sandbox.id,
                               shell="cat /root/f"),
            metadata=auth, timeout=300)
check(y.stdout == b"kept\n",
      "RestoreStep over gRPC: the new sandbox has step 1's file (%r)"
      % y.stdout)

for s in (sid, rec.id, rs.sandbox.id):
    try:
        gw.DestroySandbox(vm_pb2.SandboxRef(sandbox_id=s), metadata=auth,
                          timeout=120)
    except grpc.RpcError:
        pass
sys.exit(1 if failed else 0)
