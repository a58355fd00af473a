#!/usr/bin/env bash
# grpc_python: starts a moat-gateway alone (no node, no sessiond) with
# its gRPC door on a free 127.0.0.1 port and keys on, makes an API key
# with `moat-gateway keys create`, then runs grpc_test.py under
# /usr/bin/python3 (Debian's grpc modules live in its dist-packages, not
# in whatever python3 is first on PATH): stubs generated from proto/ by
# grpc_tools.protoc, then health, auth, status codes, deadlines, size
# limits, concurrency and a garbage client; then server reflection,
# ExecStream with no node, 50 streams that never read (RSS bounded,
# other calls answer) and an idle connection's GOAWAY; then the same
# state behind a gateway whose gRPC door speaks TLS (a self-signed
# certificate by the openssl command; tls_test.py). Exit 77, saying why, when
# python3-grpcio or python3-grpc-tools is missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
py=/usr/bin/python3

[ -x "$bin/moat-gateway" ] ||
	{ echo "FAIL - no $bin/moat-gateway: build first (make -C build moat-gateway)"; exit 1; }
[ -x "$py" ] && "$py" -c 'import grpc, grpc_tools.protoc' 2>/dev/null ||
	{ echo "SKIP - $py has no grpc / grpc_tools: apt-get install python3-grpcio python3-grpc-tools (deploy/install-deps.sh)"; exit 77; }

work=$(mktemp -d /tmp/moat-grpc-test.XXXXXX)
gw_pid=
cleanup() {
	[ -n "$gw_pid" ] && kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# Tenant "default": an operator (CordonNode answers NOT_FOUND).
key=$("$bin/moat-gateway" keys create --tenant default --state-dir "$work" 2>"$work/keys.err") ||
	{ echo "FAIL - keys create: $(cat "$work/keys.err")"; exit 1; }
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# gateway_up LOG PORT WANT ARGS...: starts moat-gateway on the work
# directory's sockets with gRPC on 127.0.0.1:PORT and ARGS, logging to
# LOG, and waits until the log says "gRPC on" matching WANT; sets gw_pid.
gateway_up() {
	local log=$1 gport=$2 want=$3
	shift 3
	"$bin/moat-gateway" --state-dir "$work" \
		--http off --grpc "127.0.0.1:$gport" \
		--listen "ipc://$work/gateway.sock" --survey "ipc://$work/survey.sock" \
		--snapd "ipc://$work/snapd.sock" "$@" \
		>"$log" 2>&1 &
	gw_pid=$!
	for _ in $(seq 1 100); do
		grep -q "gRPC on" "$log" && break
		kill -0 "$gw_pid" 2>/dev/null || break
		sleep 0.1
	done
	if ! grep -q "gRPC on.*$want" "$log"; then
		echo "FAIL - the gateway did not serve gRPC ($want) on 127.0.0.1:$gport"
		tail -n 20 "$log"
		exit 1
	fi
}
port=$(free_port)
# Every address in the work directory: nothing of a running stack is
# touched. Keys on (the default); the concurrency check makes 640 calls
# with one key, more than the default rate allows, so no rate limit.
# grpc-idle-s 3: the idle check waits for its GOAWAY.
MOAT_GATEWAY_RATE_LIMIT_RPS=0 MOAT_GATEWAY_GRPC_IDLE_S=3 \
	gateway_up "$work/gateway.log" "$port" ""

mkdir "$work/stubs"
"$py" -m grpc_tools.protoc -I "$repo/proto" \
	--python_out="$work/stubs" --grpc_python_out="$work/stubs" \
	"$repo"/proto/*.proto ||
	{ echo "FAIL - grpc_tools.protoc could not compile proto/"; exit 1; }
# The reflection proto from its own directory: a stubs/grpc/ package
# would hide the grpc module itself.
"$py" -m grpc_tools.protoc -I "$repo/proto/grpc" \
	--python_out="$work/stubs" --grpc_python_out="$work/stubs" \
	"$repo/proto/grpc/reflection_v1alpha.proto" \
	"$repo/proto/grpc/health_v1.proto" ||
	{ echo "FAIL - grpc_tools.protoc could not compile the reflection proto"; exit 1; }

rc=0
MOAT_API_KEY=$key MOAT_GATEWAY_PID=$gw_pid "$py" "$here/grpc_test.py" "127.0.0.1:$port" "$work/stubs" || rc=1
if ! kill -0 "$gw_pid" 2>/dev/null; then
	echo "FAIL - the gateway died"
	rc=1
fi
[ $rc -ne 0 ] && tail -n 30 "$work/gateway.log"

# TLS: the same gateway's state behind a second gateway whose gRPC door
# has a self-signed certificate for localhost (the HTTP door off).
kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null
gw_pid=
if ! command -v openssl >/dev/null; then
	echo "FAIL - no openssl command to make a test certificate: apt-get install openssl"
	exit 1
fi
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
	-addext "subjectAltName=DNS:localhost" \
	-keyout "$work/tls.key" -out "$work/tls.crt" 2>"$work/openssl.err" ||
	{ echo "FAIL - openssl req: $(cat "$work/openssl.err")"; exit 1; }
tport=$(free_port)
gateway_up "$work/gateway-tls.log" "$tport" TLS \
	--grpc-tls-cert "$work/tls.crt" --grpc-tls-key "$work/tls.key"
trc=0
MOAT_API_KEY=$key "$py" "$here/tls_test.py" "127.0.0.1:$tport" "$work/stubs" "$work/tls.crt" || trc=1
if grep -q 'ALPN "h2"' "$work/gateway-tls.log"; then
	echo "ok - the refused client's ALPN is logged"
else
	echo "FAIL - no log line about the client without ALPN h2"
	trc=1
fi
if ! kill -0 "$gw_pid" 2>/dev/null; then
	echo "FAIL - the TLS gateway died"
	trc=1
fi
[ $trc -ne 0 ] && tail -n 30 "$work/gateway-tls.log" && rc=1
# Half a pair is refused at start, naming the keys.
if out=$("$bin/moat-gateway" --state-dir "$work/half" --http off \
	--grpc 127.0.0.1:0 --grpc-tls-cert "$work/tls.crt" \
	--listen "ipc://$work/half.sock" --survey "ipc://$work/half-survey.sock" 2>&1); then
	echo "FAIL - a gateway with grpc-tls-cert and no grpc-tls-key started"
	rc=1
elif echo "$out" | grep -q "grpc-tls-key"; then
	echo "ok - grpc-tls-cert without grpc-tls-key: refused, naming the keys"
else
	echo "FAIL - grpc-tls-cert alone: no error naming grpc-tls-key: $out"
	rc=1
fi
[ $rc -eq 0 ] && echo "all gRPC checks passed"
exit $rc
