"""webdoor_test.py ADDR STUBS: the HTTP door's Connect streaming and
gRPC-Web checks against a running stack (webdoor_test.sh starts it),
with protobuf stubs generated from proto/ into STUBS and MOAT_API_KEY a
key of the stack. Plain http.client: the wire is written here by hand,
as the Connect and gRPC-Web specifications say it. Each check prints
ok/FAIL; exit 1 on any failure. Not for: timings (none decides a
check) or the framing's corner cases (tests/unit/gateway)."""
import base64
import http.client
import json
import os
import struct
import sys
import time

addr, stubs = sys.argv[1], sys.argv[2]
sys.path.insert(0, stubs)
import vm_pb2  # noqa: E402

host, port = addr.rsplit(":", 1)
key = os.environ["MOAT_API_KEY"]
failed = 0
CMD = "for i in 1 2 3; do echo line$i; sleep 1; done; echo err >&2; exit 4"


def check(ok, what):
    global failed
    print(("ok - " if ok else "FAIL - ") + what, flush=True)
    if not ok:
        failed += 1


def post(method, body, ctype, headers=None, auth=True, verb="POST"):
    h = {"Content-Type": ctype}
    if auth:
        h["Authorization"] = "Bearer " + (auth if isinstance(auth, str)
                                          else key)
    h.update(headers or {})
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    c.request(verb, "/moat.v1.Gateway/" + method, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hdrs, data


def connect_unary(method, obj, **kw):
    st, _, data = post(method, json.dumps(obj).encode(), "application/json",
                       headers={"Connect-Timeout-Ms": "300000"}, **kw)
    return st, json.loads(data or b"{}")


def envelope(msg, flag=0):
    return struct.pack(">BI", flag, len(msg)) + msg


def frames(data):
    out, off = [], 0
    while off < len(data):
        flag, n = struct.unpack(">BI", data[off:off + 5])
        out.append((flag, data[off + 5:off + 5 + n]))
        off += 5 + n
    if off != len(data):
        raise ValueError("the body is not whole envelopes")
    return out


def exec_request(sid, shell):
    return vm_pb2.ExecRequest(sandbox_id=sid, shell=shell).SerializeToString()


def events_json(fr):
    """connect+json frames -> [(kind, value)], end JSON."""
    evs = []
    for flag, msg in fr[:-1]:
        j = json.loads(msg)
        k = next(iter(j))
        v = base64.b64decode(j[k]).decode() if k in ("stdout", "stderr") \
            else j[k]
        evs.append((k, v))
    return evs, json.loads(fr[-1][1])


def events_proto(fr):
    evs = []
    for flag, msg in fr:
        if flag != 0:
            continue
        ev = vm_pb2.ExecEvent.FromString(msg)
        k = ev.WhichOneof("event")
        v = {"started": lambda: {"execId": str(ev.started.exec_id)},
             "stdout": lambda: ev.stdout.decode(),
             "stderr": lambda: ev.stderr.decode(),
             "exit": lambda: {"exitCode": ev.exit.exit_code}}[k]()
        evs.append((k, v))
    return evs


def check_events(evs, what):
    kinds = [k for k, _ in evs]
    out = [v for k, v in evs if k == "stdout"]
    err = "".join(v for k, v in evs if k == "stderr")
    exit_code = evs[-1][1].get("exitCode", 0) if kinds[-1:] == ["exit"] \
        else None
    check(kinds[:1] == ["started"] and kinds[-1:] == ["exit"],
          "%s: started first, exit last (%s)" % (what, kinds))
    # One line a second: each comes in an ExecRead of its own.
    check(out == ["line1\n", "line2\n", "line3\n"],
          "%s: line1..3 as separate stdout events (%r)" % (what, out))
    check(err == "err\n", "%s: stderr 'err' (%r)" % (what, err))
    check(exit_code == 4, "%s: exit code 4 (%r)" % (what, exit_code))


def trailers(fr):
    flag, msg = fr[-1]
    if flag != 0x80:
        return None, ""
    t = dict(line.split(": ", 1) for line in msg.decode().split("\r\n")
             if line)
    return int(t.get("grpc-status", -1)), t.get("grpc-message", "")


# A sandbox through Connect unary.
st, sb = connect_unary("CreateSandbox", {})
check(st == 200 and sb.get("id"), "CreateSandbox over Connect (%s %s)"
      % (st, sb))
sid = sb.get("id", "")

# ExecStream over connect+json.
body = envelope(json.dumps({"sandboxId": sid, "shell": CMD}).encode())
st, h, data = post("ExecStream", body, "application/connect+json",
                   {"Connect-Timeout-Ms": "120000"})
check(st == 200 and h.get("content-type") == "application/connect+json",
      "connect+json ExecStream: 200 connect+json (%s %s)"
      % (st, h.get("content-type")))
fr = frames(data)
check(fr[-1][0] == 2, "connect+json: ends with the end-stream message")
evs, end = events_json(fr)
check_events(evs, "connect+json")
check(end == {}, "connect+json: end-stream {} (%r)" % end)
json_result = evs

# ExecStream over connect+proto.
st, h, data = post("ExecStream", envelope(exec_request(sid, CMD)),
                   "application/connect+proto")
fr = frames(data)
check(st == 200 and fr[-1] == (2, b"{}"),
      "connect+proto: 200 and end-stream {} (%s %r)" % (st, fr[-1:]))
check_events(events_proto(fr), "connect+proto")

# A deadline on `sleep 30`: deadline_exceeded in the end message, and
# the process is gone.
body = envelope(json.dumps({"sandboxId": sid,
                            "shell": "sleep 30"}).encode())
st, h, data = post("ExecStream", body, "application/connect+json",
                   {"Connect-Timeout-Ms": "1000"})
fr = frames(data)
end = json.loads(fr[-1][1]) if fr and fr[-1][0] == 2 else {}
check(st == 200 and end.get("error", {}).get("code") == "deadline_exceeded",
      "Connect-Timeout-Ms 1000 on sleep 30: deadline_exceeded (%r)" % end)
PS = ("for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline 2>/dev/null; "
      "echo; done | grep -c '^sleep 30' || true")
left = None
for _ in range(20):
    st, res = connect_unary("Exec", {"sandboxId": sid, "shell": PS})
    left = base64.b64decode(res.get("stdout", "")).decode().strip()
    if left == "0":
        break
    time.sleep(0.5)
check(left == "0", "the timed-out sleep was killed (%r left)" % left)

# gRPC-Web: unary GetSandbox and ListSandboxes, as Connect answers them.
st, h, data = post("GetSandbox",
                   envelope(vm_pb2.SandboxRef(sandbox_id=sid)
                            .SerializeToString()),
                   "application/grpc-web+proto",
                   {"X-Grpc-Web": "1", "grpc-timeout": "30S"})
fr = frames(data)
got = vm_pb2.Sandbox.FromString(fr[0][1]) if fr and fr[0][0] == 0 else None
_, csb = connect_unary("GetSandbox", {"sandboxId": sid})
check(st == 200 and got is not None and got.id == sid and
      got.node_id == csb.get("nodeId") and trailers(fr)[0] == 0,
      "gRPC-Web GetSandbox: the sandbox and grpc-status 0 (%s)"
      % trailers(fr)[0])
st, h, data = post("ListSandboxes",
                   envelope(vm_pb2.ListSandboxesRequest()
                            .SerializeToString()),
                   "application/grpc-web+proto")
fr = frames(data)
lst = vm_pb2.SandboxList.FromString(fr[0][1]) if fr[0][0] == 0 else None
_, clst = connect_unary("ListSandboxes", {})
check(lst is not None and sorted(s.id for s in lst.sandboxes) ==
      sorted(s["id"] for s in clst.get("sandboxes", [])),
      "gRPC-Web ListSandboxes: the same sandboxes as Connect")

# gRPC-Web ExecStream: the same events as Connect, then grpc-status 0.
st, h, data = post("ExecStream", envelope(exec_request(sid, CMD)),
                   "application/grpc-web+proto")
fr = frames(data)
evs = events_proto(fr)
check_events(evs, "gRPC-Web")
check([k for k, _ in evs] == [k for k, _ in json_result] and
      trailers(fr)[0] == 0,
      "gRPC-Web ExecStream: the events Connect gave, grpc-status 0")

# A wrong key: unauthenticated in both.
st, h, data = post("ExecStream", envelope(exec_request(sid, "true")),
                   "application/grpc-web+proto", auth="moat_wrong_key")
check(trailers(frames(data))[0] == 16,
      "gRPC-Web with a wrong key: grpc-status 16 (%r)"
      % (trailers(frames(data)),))
st, h, data = post("ExecStream", envelope(b"{}"), "application/connect+json",
                   auth="moat_wrong_key")
fr = frames(data)
end = json.loads(fr[-1][1]) if fr and fr[-1][0] == 2 else {}
check(end.get("error", {}).get("code") == "unauthenticated",
      "Connect streaming with a wrong key: unauthenticated (%r)" % end)
st, res = connect_unary("GetSandbox", {"sandboxId": sid},
                        auth="moat_wrong_key")
check(st == 401 and res.get("code") == "unauthenticated",
      "Connect unary with a wrong key: 401 unauthenticated")

# CORS preflight, answered for the configured origin only.
st, h, _ = post("ExecStream", None, "application/grpc-web+proto",
                {"Origin": "https://app.example",
                 "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers":
                     "content-type,x-grpc-web,authorization"},
                auth=False, verb="OPTIONS")
check(st == 204 and
      h.get("access-control-allow-origin") == "https://app.example" and
      "grpc-status" in h.get("access-control-expose-headers", ""),
      "CORS preflight of a configured origin: 204 (%s %s)"
      % (st, h.get("access-control-allow-origin")))
st, h, _ = post("ExecStream", None, "application/grpc-web+proto",
                {"Origin": "https://evil.example",
                 "Access-Control-Request-Method": "POST"},
                auth=False, verb="OPTIONS")
check(st == 403 and "access-control-allow-origin" not in h,
      "CORS preflight of another origin: 403 (%s)" % st)

connect_unary("DestroySandbox", {"sandboxId": sid})
sys.exit(1 if failed else 0)
