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
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
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

# The client's own timer may fire first: DEADLINE_EXCEEDED either way.
# That the server reads grpc-timeout and refuses an expired call is
# tests/unit/gateway/test_grpc.c's, with a raw header.
code, msg = code_of(lambda: gw.ListSandboxes(
    vm_pb2.ListSandboxesRequest(), metadata=auth, timeout=0.001))
check(code == grpc.StatusCode.DEADLINE_EXCEEDED,
      "a 1 ms deadline: DEADLINE_EXCEEDED (%s)" % code)



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

sys.exit(1 if failed else 0)
