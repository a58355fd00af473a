"""stack_record_start's checks (record_start_test.sh runs them against a
started stack): commands started on a recorded sandbox become steps when
they end. Arguments: HOST:PORT of the HTTP door, the moat binary, the
gateway's log. Plain http.client; polls (at most MOAT_RECORD_WAIT_S,
default 120 s, per wait); no timing decides a result.
Not for: Exec / RunCode steps (stack_test.sh), the shell's terminal
behaviour (shell_test.sh)."""
import base64
import http.client
import json
import os
import struct
import subprocess
import sys
import time

addr, moat, gw_log = sys.argv[1], sys.argv[2], sys.argv[3]
host, port = addr.rsplit(":", 1)
key = os.environ["MOAT_API_KEY"]
wait_s = int(os.environ.get("MOAT_RECORD_WAIT_S", "120"))
failed = 0


def check(ok, what):
    global failed
    print(("ok - " if ok else "FAIL - ") + what, flush=True)
    if not ok:
        failed += 1


def post(method, body, ctype):
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    c.request("POST", "/moat.v1.Gateway/" + method, body=body,
              headers={"Content-Type": ctype,
                       "Authorization": "Bearer " + key,
                       "Connect-Timeout-Ms": "300000"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def call(method, obj):
    st, data = post(method, json.dumps(obj).encode(), "application/json")
    return st, json.loads(data or b"{}")


def cli(*args):
    return subprocess.run([moat] + list(args), capture_output=True,
                          text=True).stdout


def steps(sid):
    out = cli("session", "export", sid)
    try:
        return json.loads(out).get("steps", [])
    except ValueError:
        return []


def wait_step(sid, cmd):
    """The step whose input is `cmd`, once it is recorded (None: never)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        for s in steps(sid):
            if s.get("input") == cmd:
                return s
        time.sleep(0.5)
    return None


def b64(s, field):
    return base64.b64decode(s.get(field, "")).decode(errors="replace")


def start(sid, shell, **kw):
    req = {"sandboxId": sid, "shell": shell}
    req.update(kw)
    st, r = call("ExecStart", req)
    check(st == 200 and r.get("execId"),
          "ExecStart %r (%s %s)" % (shell, st, r))
    return r.get("execId")


def new_sandbox():
    st, r = call("CreateSandbox", {"record": True,
                                   "snapshotPolicy": "SNAPSHOT_POLICY_NONE"})
    check(st == 200 and r.get("id") and r.get("sessionId"),
          "a recorded sandbox (%s %s)" % (st, r))
    return r.get("id"), r.get("sessionId")


sb, sid = new_sandbox()

# 1. ExecStart, then ExecWait: one step, its output and exit status.
CMD = "echo out; echo err >&2; exit 5"
eid = start(sb, CMD)
st, r = call("ExecWait", {"sandboxId": sb, "execId": eid})
check(st == 200 and r.get("exitCode") == 5, "ExecWait says 5 (%s)" % r)
s = wait_step(sid, CMD)
check(s is not None, "the started command is a step")
s = s or {}
check(s.get("kind") == "STEP_KIND_EXEC" and s.get("exitCode") == 5,
      "its kind is exec, its exit 5 (%s %s)" % (s.get("kind"),
                                                s.get("exitCode")))
check(b64(s, "stdout") == "out\n" and b64(s, "stderr") == "err\n",
      "its stdout and stderr (%r %r)" % (b64(s, "stdout"),
                                         b64(s, "stderr")))
hist = cli("history", sb)
check(any(l.split()[1:3] == ["exec", "5"] and CMD in l
          for l in hist.splitlines()),
      "moat history lists it with exit 5:\n" + hist)

# 2. ExecStream over Connect (connect+json): the same.
CMD2 = "echo streamed; echo two >&2; exit 7"
body = json.dumps({"sandboxId": sb, "shell": CMD2}).encode()
st, data = post("ExecStream", struct.pack(">BI", 0, len(body)) + body,
                "application/connect+json")
check(st == 200 and b"exit" in data, "ExecStream ran (%s)" % st)
s = wait_step(sid, CMD2) or {}
check(s.get("exitCode") == 7 and b64(s, "stdout") == "streamed\n" and
      b64(s, "stderr") == "two\n",
      "the streamed command is a step: exit 7, its output (%s)" % s)

# 3. A terminal session (pty) is a shell step.
CMD3 = "echo in-a-terminal; exit 2"
eid = start(sb, CMD3, pty=True)
call("ExecWait", {"sandboxId": sb, "execId": eid})
s = wait_step(sid, CMD3) or {}
check(s.get("kind") == "STEP_KIND_SHELL" and s.get("exitCode") == 2,
      "the pty session is a shell step, exit 2 (%s %s)" %
      (s.get("kind"), s.get("exitCode")))
check(b64(s, "stdout").startswith('{"version": 2'),
      "its stdout is an asciicast")
hist = cli("history", sb)
check(any(l.split()[1:3] == ["shell", "2"] for l in hist.splitlines()),
      "moat history names its kind shell:\n" + hist)

# 4. Steps are appended in the order commands end: A waits for a file
# that an Exec after B's end creates, so B, the Exec, then A.
A = "while [ ! -e /tmp/go ]; do sleep 0.2; done; echo a"
B = "echo b"
GO = "touch /tmp/go"
start(sb, A)
eid = start(sb, B)
call("ExecWait", {"sandboxId": sb, "execId": eid})
wait_step(sid, B)
st, r = call("Exec", {"sandboxId": sb, "shell": GO})
check(st == 200, "Exec %s (%s)" % (GO, st))
wait_step(sid, A)
order = [x.get("input") for x in steps(sid)
         if x.get("input") in (A, B, GO)]
check(order == [B, GO, A], "steps in the order they ended: %s" % order)

# 5. A sandbox destroyed while a started command runs: no step, the
# follower ends (the gateway says why), nothing hangs.
sb2, sid2 = new_sandbox()
LONG = "sleep 600"
start(sb2, LONG)
time.sleep(1)  # not a result: lets the follower's first read begin
st, r = call("DestroySandbox", {"sandboxId": sb2})
check(st == 200, "the sandbox is destroyed while followed (%s %s)" %
      (st, r))
end, said = time.monotonic() + wait_s, False
while not said and time.monotonic() < end:
    said = any(sb2 in l and "not recorded" in l
               for l in open(gw_log, errors="replace"))
    time.sleep(0.5)
check(said, "the gateway logs the command as not recorded")
check(all(x.get("input") != LONG for x in steps(sid2)),
      "no step for it")

# 6. Left running for the stop: record_start_test.sh checks the gateway
# stops and logs it as not recorded.
sb3, _ = new_sandbox()
start(sb3, "sleep 600")
print("STOP_SANDBOX " + sb3, flush=True)
print("%d failed" % failed)
sys.exit(1 if failed else 0)
