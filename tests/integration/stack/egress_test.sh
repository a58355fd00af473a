#!/usr/bin/env bash
# Guest egress by allowlist (issue 14) through the whole stack: a sandbox
# created with --allow reaches a local HTTP server that the test starts on
# 127.0.0.1 (a port it picks) under the name allowed.test, which
# [vmd] egress-hosts maps to it; a name off the list, another loopback
# port (a second local server, which must see no request) and raw IP
# literals are refused by vmd's proxy; both kinds land in the tenant's
# audit log. No traffic leaves 127.0.0.0/8: every name the guest asks for
# is either mapped by egress-hosts to 127.0.0.1 or refused before any
# lookup, except "localhost", which the host resolves itself.
# Needs built binaries (MOAT_BIN_DIR) and an image whose agent has the
# egress proxy (MOAT_IMAGE_DIR, default <repo>/images/out); 77 without.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "skip: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
# The agent in the image must have the egress proxy (guest/agent/egress.c).
if ! gzip -dc "$MOAT_IMAGE_DIR/default/initrd.img" 2>/dev/null | grep -a 'egress: on (proxy pid' >/dev/null; then
	echo "skip: the image in $MOAT_IMAGE_DIR has an agent without egress set by vmd: rebuild it (images/build.sh)"
	exit 77
fi
state=$(mktemp -d /tmp/moat-egress-test.XXXXXX)
work=$(mktemp -d /tmp/moat-egress-work.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
moat=$bin/moat
passed=0
failed=0
pids=()

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check DESC COMMAND...
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	rm -rf "$state" "$work"
}
trap cleanup EXIT

# Two local servers on ports the kernel picks: the allowed one, and one
# that must never be reached.
serve() { # serve DIR LOG PORTFILE
	python3 - "$@" <<'EOF' &
import http.server, socketserver, sys, functools
d, log, portfile = sys.argv[1:4]
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *a):
        with open(log, "a") as f:
            f.write(self.requestline + "\n")
h = functools.partial(H, directory=d)
with socketserver.TCPServer(("127.0.0.1", 0), h) as s:
    open(portfile + ".tmp", "w").write(str(s.server_address[1]))
    import os; os.rename(portfile + ".tmp", portfile)
    s.serve_forever()
EOF
	pids+=($!)
}
mkdir -p "$work/www" "$work/other"
echo "hello from the allowed server" >"$work/www/hello.txt"
echo "secret" >"$work/other/hello.txt"
: >"$work/other.log"
serve "$work/www" "$work/www.log" "$work/port1"
serve "$work/other" "$work/other.log" "$work/port2"
for _ in $(seq 50); do [ -s "$work/port1" ] && [ -s "$work/port2" ] && break; sleep 0.1; done
port1=$(cat "$work/port1")
port2=$(cat "$work/port2")
echo "# allowed server 127.0.0.1:$port1, forbidden one 127.0.0.1:$port2"
printf '# egress-hosts for the test\nallowed.test 127.0.0.1:%s\n' "$port1" >"$work/egress-hosts"
export MOAT_VMD_EGRESS_HOSTS=$work/egress-hosts

if ! bash "$repo/deploy/moat-stack" start >"$work/start.log" 2>&1; then
	cat "$work/start.log"
	tail -n 30 "$state"/logs/*.log
	bad "stack starts"
	exit 1
fi
ok "stack starts with egress-hosts"

# Refused at create: bad entries, IP literals on the list.
"$moat" sandbox create --allow 127.0.0.1 >/dev/null 2>"$work/err"; rc=$?
check "an IP literal on the allowlist is refused at create (rc $rc)" [ $rc -ne 0 ]
check "  saying to name a host" grep -q "IP addresses are never allowed" "$work/err"

id=$("$moat" sandbox create --allow allowed.test --allow "localhost:$port2" 2>"$work/err")
rc=$?
check "sandbox with --allow starts (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 -a -n "$id" ]
"$moat" sandbox get "$id" >"$work/get" 2>&1
check "moat sandbox get shows the allowlist" grep -q "network: *allowlist (allowed.test, localhost:$port2)" "$work/get"

# fetch URL: prints "CODE BODY" (the proxy's refusals are HTTP errors).
cat >"$work/fetch.py" <<'EOF'
import os, sys, urllib.request, urllib.error
# The proxy itself, even for localhost and 127.0.0.1 (no_proxy lists
# them: in the guest they are the guest's own).
os.environ.pop("no_proxy", None)
os.environ.pop("NO_PROXY", None)
p = "http://127.0.0.1:3128"
o = urllib.request.build_opener(urllib.request.ProxyHandler({"http": p, "https": p}))
try:
    r = o.open(sys.argv[1], timeout=20)
    print(r.status, r.read().decode().strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
except Exception as e:
    print("ERR", e)
EOF
# connect HOST:PORT: CONNECT through the proxy by hand, then a plain
# HTTP request inside the tunnel.
cat >"$work/connect.py" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (sys.argv[1], sys.argv[1])).encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(4096)
    if not c: break
    head += c
line = head.split(b"\r\n")[0].decode()
if " 200 " not in line:
    print(line); sys.exit(0)
s.sendall(b"GET /hello.txt HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
body = head.split(b"\r\n\r\n", 1)[1]
while True:
    c = s.recv(4096)
    if not c: break
    body += c
print(line, body.split(b"\r\n\r\n", 1)[-1].decode().strip())
EOF
"$moat" cp "$work/fetch.py" "$id:/tmp/fetch.py" >/dev/null &&
	"$moat" cp "$work/connect.py" "$id:/tmp/connect.py" >/dev/null
check "scripts copied in" [ $? -eq 0 ]
gx() { "$moat" exec "$id" -- "$@" 2>&1; }

out=$(gx sh -c 'echo "$http_proxy $https_proxy"')
check "execs get http_proxy/https_proxy ($out)" [ "$out" = "http://127.0.0.1:3128 http://127.0.0.1:3128" ]
out=$(gx python3 /tmp/fetch.py http://allowed.test/hello.txt)
check "allowed name fetches from the local server ($out)" [ "$out" = "200 hello from the allowed server" ]
out=$(gx python3 /tmp/connect.py allowed.test:443)
check "CONNECT to an allowed name:port passes ($out)" [ "$out" = "HTTP/1.1 200 Connection established hello from the allowed server" ]
out=$(gx python3 /tmp/fetch.py http://refused.test/hello.txt)
check "a name off the list is refused ($out)" sh -c "echo '$out' | grep -q '^403 .*host not on the allowlist'"
out=$(gx python3 /tmp/fetch.py "http://localhost:$port2/hello.txt")
check "another loopback port is refused, even listed by name ($out)" sh -c "echo '$out' | grep -q '^403 .*loopback address'"
out=$(gx python3 /tmp/fetch.py "http://allowed.test:$port2/hello.txt")
check "the allowed name on another port is refused ($out)" sh -c "echo '$out' | grep -q '^403 .*port not on the allowlist'"
out=$(gx python3 /tmp/fetch.py "http://127.0.0.1:$port1/hello.txt")
check "a raw IPv4 literal is refused ($out)" sh -c "echo '$out' | grep -q '^403 .*IP literal'"
out=$(gx python3 /tmp/fetch.py "http://[::1]:$port1/hello.txt")
check "a raw IPv6 literal is refused ($out)" sh -c "echo '$out' | grep -q '^403 .*IP literal'"
out=$(gx python3 /tmp/connect.py "127.0.0.1:$port2")
check "CONNECT to an IP literal is refused ($out)" sh -c "echo '$out' | grep -q '403'"
out=$(gx python3 /tmp/fetch.py https://refused.test/)
check "https to a name off the list fails ($out)" sh -c "echo '$out' | grep -q '403\\|ERR'"
check "the forbidden server saw no request" [ ! -s "$work/other.log" ]
# moat run takes --allow too (one-shot sandbox).
out=$("$moat" run --allow allowed.test -c 'import urllib.request
print(urllib.request.urlopen("http://allowed.test/hello.txt", timeout=20).read().decode().strip())' 2>&1)
check "moat run --allow fetches through the proxy ($out)" [ "$out" = "hello from the allowed server" ]

# The audit: the gateway reads each node's egress events every survey.
ok_n=0
deny_n=0
for _ in $(seq 40); do
	"$moat" audit --json --limit 1000 >"$work/audit.json" 2>&1
	ok_n=$(python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
print(sum(1 for e in d.get("entries",[]) if e.get("method")=="Egress" and e.get("code")=="OK"))' "$work/audit.json" 2>/dev/null || echo 0)
	deny_n=$(python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
print(sum(1 for e in d.get("entries",[]) if e.get("method")=="Egress" and e.get("code")=="PERMISSION_DENIED"))' "$work/audit.json" 2>/dev/null || echo 0)
	[ "$ok_n" -ge 3 ] && [ "$deny_n" -ge 7 ] && break
	sleep 0.5
done
check "allowed connections are in the tenant's audit ($ok_n)" [ "$ok_n" -ge 3 ]
check "refused ones too ($deny_n)" [ "$deny_n" -ge 7 ]
check "  naming the sandbox, host and reason" grep -q "egress http refused.test:80 refused: host not on the allowlist" "$work/audit.json"

# A sandbox without --allow has no proxy at all.
id2=$("$moat" sandbox create 2>"$work/err")
out=$("$moat" exec "$id2" -- python3 -c 'import socket
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=5); print("open")
except Exception as e: print("closed")' 2>&1)
check "network none: nothing listens on 3128 ($out)" [ "$out" = closed ]
"$moat" sandbox rm "$id" "$id2" >/dev/null 2>&1

# Egress and snapshots (issue 14): every QEMU guest has the egress port,
# vmd tells the agent its mode after each boot and restore, and a
# snapshot carries (and seals) its sandbox's policy.
fetch_src=$(cat "$work/fetch.py")
rfetch() { "$moat" exec "$1" -- python3 -c "$fetch_src" "$2" 2>>"$work/rfetch.err"; }
no_proxy_src='import os, socket
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=5); s = "open"
except Exception: s = "closed"
print(s, os.environ.get("http_proxy", "-"))'
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null; }

# The first cold boot above made the node's template: an allowlist
# sandbox is cloned from it like any other.
for _ in $(seq 120); do
	find "$state" -path '*/templates/*' -name meta.pb 2>/dev/null | grep -qv '\.tmp/' && break
	sleep 0.5
done
tid=$("$moat" sandbox create --allow allowed.test 2>"$work/err")
"$moat" --json sandbox get "$tid" >"$work/tsb.json" 2>&1
tmpl=$(json_get "$work/tsb.json" 'd.get("templateId", "")')
check "an allowlist sandbox is cloned from the template ($tmpl)" [ -n "$tmpl" ]
out=$(rfetch "$tid" http://allowed.test/hello.txt)
check "  and fetches from the allowed server ($out)" [ "$out" = "200 hello from the allowed server" ]
out=$(rfetch "$tid" http://refused.test/hello.txt)
check "  and a name off the list is refused ($out)" sh -c "echo '$out' | grep -q '^403 '"
"$moat" sandbox rm "$tid" >/dev/null 2>&1

# A recorded allowlist sandbox: a snapshot at every step.
rid=$("$moat" sandbox create --record --snapshot every --allow allowed.test 2>"$work/err")
check "a recorded allowlist sandbox starts ($rid: $(head -c 300 "$work/err"))" [ -n "$rid" ]
"$moat" --json sandbox get "$rid" >"$work/rsb.json" 2>&1
rsid=$(json_get "$work/rsb.json" 'd.get("sessionId", "")')
out=$(rfetch "$rid" http://allowed.test/hello.txt)
check "recorded step 1 fetches ($out)" [ "$out" = "200 hello from the allowed server" ]
"$moat" exec "$rid" -- sh -c 'echo two >/root/two.txt' >"$work/step2" 2>&1; rc=$?
check "recorded step 2 runs and is recorded (rc $rc)" sh -c "[ $rc -eq 0 ] && ! grep -q 'not recorded' '$work/step2'"
check "  both steps have their snapshot" [ "$("$moat" history "$rid" 2>/dev/null | grep -c '\[snapshot\]')" -ge 2 ]

# restore --new of step 2 takes the snapshot's allowlist.
nid=$("$moat" restore "$rid" --step 2 --new 2>"$work/err"); rc=$?
check "restore --new of step 2 (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 -a -n "$nid" ]
"$moat" sandbox get "$nid" >"$work/nget" 2>&1
check "  it has the snapshot's allowlist" grep -q "network: *allowlist (allowed.test)" "$work/nget"
out=$("$moat" exec "$nid" -- cat /root/two.txt 2>&1)
check "  in step 2's state ($out)" [ "$out" = two ]
out=$(rfetch "$nid" http://allowed.test/hello.txt)
check "  the allowed name fetches ($out)" [ "$out" = "200 hello from the allowed server" ]
out=$(rfetch "$nid" http://refused.test/hello.txt)
check "  a name off the list is refused ($out)" sh -c "echo '$out' | grep -q '^403 .*host not on the allowlist'"

# A fork of step 1 too.
"$moat" fork "$rsid" --step 1 --count 1 >"$work/fork" 2>"$work/err"; rc=$?
fid=$(cut -d' ' -f1 "$work/fork" | head -n 1)
check "fork of step 1 (rc $rc: $(head -c 300 "$work/err" | tr "\n" " "))" [ $rc -eq 0 -a -n "$fid" ]
out=$(rfetch "$fid" http://allowed.test/hello.txt)
check "  the fork fetches the allowed name ($out)" [ "$out" = "200 hello from the allowed server" ]
out=$(rfetch "$fid" http://refused.test/hello.txt)
check "  and is refused a name off the list ($out)" sh -c "echo '$out' | grep -q '^403 .*host not on the allowlist'"

# Restore in place keeps the sandbox's own policy (the same here) and the
# proxy works again after it.
"$moat" restore "$rid" --step 1 >/dev/null 2>"$work/err"; rc=$?
check "restore in place of step 1 (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 ]
out=$(rfetch "$rid" http://allowed.test/hello.txt)
check "  the proxy works after it ($out)" [ "$out" = "200 hello from the allowed server" ]
"$moat" sandbox rm "$rid" "$nid" "$fid" >/dev/null 2>&1

# A snapshot of a network-none sandbox restores without a proxy.
zid=$("$moat" sandbox create --record --snapshot every 2>"$work/err")
"$moat" exec "$zid" -- sh -c 'echo z >/root/z.txt' >/dev/null 2>&1
znew=$("$moat" restore "$zid" --step 1 --new 2>"$work/err"); rc=$?
check "restore --new of a network-none step (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 -a -n "$znew" ]
out=$("$moat" exec "$znew" -- python3 -c "$no_proxy_src" 2>&1)
check "  it has no proxy and no proxy env ($out)" [ "$out" = "closed -" ]
"$moat" sandbox get "$znew" >"$work/zget" 2>&1
check "  nor an allowlist" sh -c "! grep -q 'network:' '$work/zget'"
"$moat" sandbox rm "$zid" "$znew" >/dev/null 2>&1

bash "$repo/deploy/moat-stack" stop >/dev/null
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$state'/logs/*.log"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
