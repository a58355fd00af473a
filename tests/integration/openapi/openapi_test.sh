#!/usr/bin/env bash
# openapi_validate: starts a moat-gateway alone (no node, no sessiond:
# the document needs neither) with its HTTP door on a free 127.0.0.1
# port, fetches GET /v1/openapi.json, and has it checked by
# openapi_validate.mjs (npm @apidevtools/swagger-parser validates it as
# OpenAPI 3, then every method of proto/gateway.proto's Gateway service
# must have POST /v1/rpc/<Method> with operationId <Method>) and by
# openapi_checks.py (the proto3 JSON shapes: maps as objects, 64-bit
# integers as strings, unique operation ids). Also calls one per-method
# path to see the door answers what the document says. Exit 77, saying
# why, when node or npm is missing or the validator cannot be installed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}

[ -x "$bin/moat-gateway" ] ||
	{ echo "FAIL - no $bin/moat-gateway: build first (make -C build moat-gateway)"; exit 1; }
command -v node >/dev/null ||
	{ echo "SKIP - node is not installed: run deploy/install-deps.sh (Debian nodejs)"; exit 77; }
command -v curl >/dev/null ||
	{ echo "SKIP - curl is not installed: run deploy/install-deps.sh"; exit 77; }
mods=$(bash "$repo/tests/integration/npm_setup.sh" "$here/package.json")
rc=$?
case $rc in
0) ;;
2 | 3) echo "SKIP - the validator (@apidevtools/swagger-parser) could not be installed (see above)"; exit 77 ;;
*) echo "FAIL - npm_setup.sh failed (exit $rc; see above)"; exit 1 ;;
esac

work=$(mktemp -d /tmp/moat-openapi-test.XXXXXX)
gw_pid=
cleanup() {
	[ -n "$gw_pid" ] && kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Every address in the work directory: nothing of a running stack is
# touched; keys on (the default), since the document needs none.
"$bin/moat-gateway" --state-dir "$work" --http "127.0.0.1:$port" --grpc off \
	--listen "ipc://$work/gateway.sock" --survey "ipc://$work/survey.sock" \
	--sessiond "ipc://$work/sessiond.sock" --snapd "ipc://$work/snapd.sock" \
	>"$work/gateway.log" 2>&1 &
gw_pid=$!
url=http://127.0.0.1:$port
for _ in $(seq 1 100); do
	curl -sf -o "$work/openapi.json" "$url/v1/openapi.json" && break
	kill -0 "$gw_pid" 2>/dev/null || break
	sleep 0.1
done
if [ ! -s "$work/openapi.json" ]; then
	echo "FAIL - the gateway served no /v1/openapi.json on $url"
	tail -n 20 "$work/gateway.log"
	exit 1
fi
echo "ok - GET /v1/openapi.json ($(wc -c <"$work/openapi.json") bytes)"

rc=0
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$work/openapi.json" ||
	{ echo "FAIL - the document is not JSON"; exit 1; }
# The validator resolves its packages next to the script it runs.
cp "$here/openapi_validate.mjs" "$work/"
ln -s "$mods/node_modules" "$work/node_modules"
(cd "$work" && node openapi_validate.mjs openapi.json "$repo/proto/gateway.proto") || rc=1
python3 "$here/openapi_checks.py" "$work/openapi.json" "$repo/proto/gateway.proto" || rc=1

# The door serves what the document says: Health at its own path, with
# no key, its reply in the shape of the document's HealthReply.
if curl -sf -X POST -H 'Content-Type: application/json' -d '{}' \
	-o "$work/health.json" "$url/v1/rpc/Health" &&
	python3 -c '
import json, sys
doc, reply = (json.load(open(p)) for p in sys.argv[1:3])
ref = doc["paths"]["/v1/rpc/Health"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
props = doc["components"]["schemas"][ref.split("/")[-1]]["properties"]
extra = set(reply) - set(props)
assert not extra, "fields not in the schema: %s" % extra
assert isinstance(reply.get("uptimeMs", "0"), str), "uptimeMs (uint64) is not a string"
' "$work/openapi.json" "$work/health.json"; then
	echo "ok - POST /v1/rpc/Health answers as its schema says"
else
	echo "FAIL - POST /v1/rpc/Health does not answer as its schema says"
	rc=1
fi
[ $rc -eq 0 ] && echo "all OpenAPI checks passed"
exit $rc
