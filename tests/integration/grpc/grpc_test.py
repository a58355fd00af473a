"""grpc_test.py ADDR STUBS: the gRPC door's checks against a gateway alone
(grpc_test.sh starts it), with stubs generated from proto/ into STUBS and
MOAT_API_KEY a key of the gateway. Each check prints ok/FAIL; exit 1 on
any failure. Not for: sandboxes (no node runs here) or timings."""
import os
import socket
import sys
import threading

import grpc

addr, stubs = sys.argv[1], sys.argv[2]
sys.path.insert(0, stubs)
import gateway_pb2  # noqa: E402
import gateway_pb2_grpc  # noqa: E402
import health_v1_pb2 as health_pb2  # noqa: E402
import health_v1_pb2_grpc as health_pb2_grpc  # noqa: E402
import vm_pb2  # noqa: E402

key = os.environ["MOAT_API_KEY"]
auth = (("authorization", "Bearer " + key),)
failed = 0


def check(ok, what):
    global failed
    print(("ok - " if ok else "FAIL - ") + what)
    if not ok:
        failed += 1


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


chan = grpc.insecure_channel(addr)
gw = gateway_pb2_grpc.GatewayStub(chan)

health = health_pb2_grpc.HealthStub(chan)
r = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
check(r.status == health_pb2.HealthCheckResponse.SERVING,
      "grpc.health.v1.Health/Check answers SERVING without a key")

lst = gw.ListSandboxes(vm_pb2.ListSandboxesRequest(), metadata=auth,
                       timeout=10)
check(len(lst.sandboxes) == 0, "ListSandboxes with the key: OK, empty")

# Without a node the gateway cannot tell a missing sandbox from one on a
# node that is away: GetSandbox says UNAVAILABLE, as on the other doors.
code, msg = code_of(lambda: gw.GetSandbox(
    vm_pb2.SandboxRef(sandbox_id="sb-missing"), metadata=auth, timeout=10))
check(code == grpc.StatusCode.UNAVAILABLE and "no vmd node" in msg,
      "GetSandbox with no node: UNAVAILABLE with the gateway's message "
      "(%s: %r)" % (code, msg))
# A lookup the gateway answers alone: a node it never saw.
code, msg = code_of(lambda: gw.CordonNode(
    gateway_pb2.CordonNodeRequest(node_id="no-such-node", cordoned=True),
    metadata=auth, timeout=10))
check(code == grpc.StatusCode.NOT_FOUND and msg,
      "CordonNode of a missing node: NOT_FOUND with a message (%s: %r)"
      % (code, msg))

code, msg = code_of(lambda: gw.ListSandboxes(
    vm_pb2.ListSandboxesRequest(),
    metadata=(("authorization", "Bearer moat_wrong_key"),), timeout=10))
check(code == grpc.StatusCode.UNAUTHENTICATED,
      "a wrong key: UNAUTHENTICATED (%s: %r)" % (code, msg))

code, msg = code_of(lambda: gw.ListSandboxes(
    vm_pb2.ListSandboxesRequest(), timeout=10))
check(code == grpc.StatusCode.UNAUTHENTICATED,
      "no key: UNAUTHENTICATED (%s: %r)" % (code, msg))

# A 1 ms deadline is stream_test.py's, on an Exec that cannot end in
# time: here, with no node, a call may well be answered within 1 ms. That
# the server reads grpc-timeout and refuses an expired call is
# tests/unit/gateway/test_grpc.c's, with a raw header.



def raw(path):
    """A call of `path` with bytes as they are, no stub."""
    return chan.unary_unary(path, request_serializer=lambda b: b,
                            response_deserializer=lambda b: b)


for path, what in (("/moat.v1.Gateway/NoSuchMethod", "method"),
                   ("/other.Service/Call", "service")):
    code, msg = code_of(lambda: raw(path)(b"", metadata=auth, timeout=10))
    check(code == grpc.StatusCode.UNIMPLEMENTED,
          "an unknown %s: UNIMPLEMENTED (%r)" % (what, msg))

big = vm_pb2.SandboxRef(sandbox_id="x" * (5 << 20)).SerializeToString()
code, msg = code_of(lambda: raw("/moat.v1.Gateway/ListSandboxes")(
    big, metadata=auth, timeout=30))
check(code == grpc.StatusCode.RESOURCE_EXHAUSTED,
      "a 5 MiB message: RESOURCE_EXHAUSTED (%r)" % msg)

errors = []


def many():
    for _ in range(20):
        try:
            gw.ListSandboxes(vm_pb2.ListSandboxesRequest(), metadata=auth,
                             timeout=60)
        except grpc.RpcError as e:
            errors.append(e.code())


threads = [threading.Thread(target=many) for _ in range(32)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(not errors, "32 threads x 20 ListSandboxes on one channel: all OK "
      "(%d failed: %s)" % (len(errors), sorted(set(map(str, errors)))))

host, port = addr.rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 8)
try:
    s.recv(4096)
except OSError:
    pass
s.close()
r = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
lst = gw.ListSandboxes(vm_pb2.ListSandboxesRequest(), metadata=auth,
                       timeout=10)
check(r.status == health_pb2.HealthCheckResponse.SERVING,
      "after a client sent garbage (not HTTP/2): still answers")

# ---- streams: reflection (bidi), ExecStream, bounded buffering ----
import reflection_v1alpha_pb2 as rpb  # noqa: E402
import reflection_v1alpha_pb2_grpc as rpg  # noqa: E402
from google.protobuf import descriptor_pb2  # noqa: E402

refl = rpg.ServerReflectionStub(chan)
asks = [rpb.ServerReflectionRequest(list_services=""),
        rpb.ServerReflectionRequest(file_containing_symbol="moat.v1.Gateway"),
        rpb.ServerReflectionRequest(file_containing_symbol="moat.v1.Nope"),
        rpb.ServerReflectionRequest(file_by_filename="vm.proto")]
got = list(refl.ServerReflectionInfo(iter(asks), timeout=30))
check(len(got) == len(asks),
      "reflection: one answer per request on one stream (%d)" % len(got))
names = [sv.name for sv in got[0].list_services_response.service]
check("moat.v1.Gateway" in names and
      "grpc.reflection.v1alpha.ServerReflection" in names and
      "grpc.health.v1.Health" in names,
      "reflection list_services: %s" % names)
fds = [descriptor_pb2.FileDescriptorProto.FromString(b)
       for b in got[1].file_descriptor_response.file_descriptor_proto]
svc = [sv for f in fds[:1] for sv in f.service if sv.name == "Gateway"]
meth = [m for m in svc[0].method if m.name == "ExecStream"] if svc else []
check(fds and fds[0].name == "gateway.proto" and meth and
      meth[0].server_streaming and not meth[0].client_streaming and
      "vm.proto" in [f.name for f in fds],
      "reflection file_containing_symbol moat.v1.Gateway: gateway.proto "
      "(and its imports) with ExecStream server streaming")
check(got[2].WhichOneof("message_response") == "error_response" and
      got[2].error_response.error_code == 5,
      "reflection of an unknown symbol: error_response NOT_FOUND (%r)"
      % got[2].error_response.error_message)
check(got[3].WhichOneof("message_response") == "file_descriptor_response",
      "reflection file_by_filename vm.proto answers")
got = list(refl.ServerReflectionInfo(iter([rpb.ServerReflectionRequest(
    file_containing_symbol="grpc.health.v1.Health")]), timeout=30))
fds = [descriptor_pb2.FileDescriptorProto.FromString(b)
       for b in got[0].file_descriptor_response.file_descriptor_proto]
hsvc = [sv for f in fds[:1] for sv in f.service if sv.name == "Health"]
check(fds and fds[0].name == "grpc/health_v1.proto" and hsvc and
      sorted(m.name for m in hsvc[0].method) == ["Check", "Watch"],
      "reflection file_containing_symbol grpc.health.v1.Health: "
      "grpc/health_v1.proto with Check and Watch (%s)"
      % [f.name for f in fds])
code, msg = code_of(lambda: list(health.Watch(
    health_pb2.HealthCheckRequest(), timeout=10)))
check(code == grpc.StatusCode.UNIMPLEMENTED and "Check" in msg,
      "Health/Watch: UNIMPLEMENTED, saying to poll Check (%s: %r)"
      % (code, msg))

# No node: ExecStream ends at once with an error in its trailers.
code, msg = code_of(lambda: list(gw.ExecStream(
    vm_pb2.ExecRequest(sandbox_id="sb-missing", argv=["true"]),
    metadata=auth, timeout=30)))
check(code == grpc.StatusCode.UNAVAILABLE and msg,
      "ExecStream with no node: UNAVAILABLE with a message (%s: %r)"
      % (code, msg))
code, msg = code_of(lambda: list(gw.ExecStream(
    vm_pb2.ExecRequest(sandbox_id="sb-missing", argv=["true"]),
    timeout=30)))
check(code == grpc.StatusCode.UNAUTHENTICATED,
      "ExecStream without a key: UNAUTHENTICATED (%s)" % code)


def rss_mib():
    with open("/proc/%s/status" % os.environ["MOAT_GATEWAY_PID"]) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


# 50 clients that ask and ask and never read: each reflection stream
# stops at its queue and window, the gateway's memory stays bounded.
def endless():
    for _ in range(100000):
        yield rpb.ServerReflectionRequest(
            file_containing_symbol="moat.v1.Gateway")


before = rss_mib()
slow = []
for _ in range(50):
    ch = grpc.insecure_channel(addr)
    slow.append((ch, rpg.ServerReflectionStub(ch).ServerReflectionInfo(
        endless(), timeout=120)))
# Give them time to fill what they may: the check is a bound, not a time.
threading.Event().wait(5)
after = rss_mib()
r = health.Check(health_pb2.HealthCheckRequest(), timeout=30)
lst = gw.ListSandboxes(vm_pb2.ListSandboxesRequest(), metadata=auth,
                       timeout=30)
check(r.status == health_pb2.HealthCheckResponse.SERVING,
      "with 50 streams that never read: other calls still answer")
# Under AddressSanitizer (tests/run.sh sets ASAN_OPTIONS for that
# build) freed memory waits in its quarantine (256 MiB by default) and
# every byte has shadow: the bound grows by those, still far below what
# unbounded queues reach there.
limit = 200 + (320 if "ASAN_OPTIONS" in os.environ else 0)
check(0 < after < limit,
      "with 50 streams that never read: gateway RSS %d MiB (was %d), "
      "under %d (the door buffers 64 MiB at most)" % (after, before, limit))
for ch, call in slow:
    call.cancel()
    ch.close()

# An idle connection (no stream) is closed with GOAWAY (grpc-idle-s is
# set low by grpc_test.sh).
s = socket.create_connection((host, int(port)), timeout=60)
s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
          b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
seen = b""
try:
    while True:
        b = s.recv(65536)
        if not b:
            break
        seen += b
except OSError:
    pass
s.close()
types, i = [], 0
while i + 9 <= len(seen):
    n = int.from_bytes(seen[i:i + 3], "big")
    types.append(seen[i + 3])
    i += 9 + n
check(7 in types, "an idle connection gets GOAWAY and is closed "
      "(frame types %s)" % types)

sys.exit(1 if failed else 0)
