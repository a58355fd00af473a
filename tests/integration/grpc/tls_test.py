"""tls_test.py ADDR STUBS CERT: the gRPC door over TLS (grpc_test.sh
starts a gateway with grpc-tls-cert / grpc-tls-key, CERT self-signed for
localhost), with MOAT_API_KEY a key of the gateway: ListSandboxes and
health over a secure channel, then a cleartext h2c client, a raw
plaintext client and a TLS client without ALPN h2 all fail cleanly while
the secure channel keeps answering. Each check prints ok/FAIL; exit 1
on any failure. Not for: the door's calls themselves (grpc_test.py)."""
import os
import socket
import ssl
import sys

import grpc

addr, stubs, cert = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, stubs)
import health_v1_pb2 as health_pb2  # noqa: E402
import health_v1_pb2_grpc as health_pb2_grpc  # noqa: E402
import gateway_pb2_grpc  # noqa: E402
import vm_pb2  # noqa: E402

auth = (("authorization", "Bearer " + os.environ["MOAT_API_KEY"]),)
failed = 0


def check(ok, what):
    global failed
    print(("ok - " if ok else "FAIL - ") + what)
    if not ok:
        failed += 1


with open(cert, "rb") as f:
    creds = grpc.ssl_channel_credentials(root_certificates=f.read())
# The certificate names localhost; the door listens on 127.0.0.1.
chan = grpc.secure_channel(addr, creds, options=(
    ("grpc.ssl_target_name_override", "localhost"),))
gw = gateway_pb2_grpc.GatewayStub(chan)
health = health_pb2_grpc.HealthStub(chan)


def secure_ok(what):
    lst = gw.ListSandboxes(vm_pb2.ListSandboxesRequest(), metadata=auth,
                           timeout=10)
    check(len(lst.sandboxes) == 0, "TLS ListSandboxes %s: OK" % what)
    r = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
    check(r.status == health_pb2.HealthCheckResponse.SERVING,
          "TLS Health/Check %s: SERVING" % what)


secure_ok("with the certificate as root")

# An insecure (h2c) channel to the TLS port: fails, never hangs.
plain = grpc.insecure_channel(addr)
try:
    gateway_pb2_grpc.GatewayStub(plain).ListSandboxes(
        vm_pb2.ListSandboxesRequest(), metadata=auth, timeout=5)
    code = grpc.StatusCode.OK
except grpc.RpcError as e:
    code = e.code()
check(code in (grpc.StatusCode.UNAVAILABLE,
               grpc.StatusCode.DEADLINE_EXCEEDED),
      "an h2c client to the TLS port fails (%s)" % code)
plain.close()

host, port = addr.rsplit(":", 1)
# Raw cleartext bytes: the door closes the connection.
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0" * 64)
try:
    got = s.recv(4096)
    while got and s.recv(4096):
        pass
    closed = True
except OSError:
    closed = True
except socket.timeout:
    closed = False
s.close()
check(closed, "a plaintext client's connection is closed")

# TLS offering only http/1.1: the handshake is refused (ALPN).
ctx = ssl.create_default_context(cafile=cert)
ctx.check_hostname = False
ctx.set_alpn_protocols(["http/1.1"])
refused = False
try:
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as t:
            t.recv(1)
except (ssl.SSLError, OSError):
    refused = True
check(refused, "a TLS client without ALPN h2 is refused")

secure_ok("after the bad clients")
sys.exit(1 if failed else 0)
