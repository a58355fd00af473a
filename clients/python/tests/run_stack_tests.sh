#!/usr/bin/env bash
# Runs the Python SDK's integration tests (test_integration.py) against a
# real local stack: deploy/moat-stack started in a temporary state
# directory with the gateway's HTTP door on a free 127.0.0.1 port, so it
# never touches another stack; stopped again on exit, whatever happened.
# MOAT_SKIP_STACK=1 starts nothing and the tests skip, saying why (exit
# 77: ctest's Skipped).
# Needs built binaries (MOAT_BIN_DIR, default <repo>/build/bin) and guest
# images (MOAT_IMAGE_DIR, default <repo>/images/out). MOAT_PY_TESTS picks
# cases (e.g. tests.test_integration.StackTest.test_branch_reads_as_path).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
py=${PYTHON:-python3}
cd "$here/.."

if [ "${MOAT_SKIP_STACK:-}" = 1 ]; then
	# The cases print their skips by name; the exit is 77 so ctest says
	# Skipped, never Passed.
	"$py" -m unittest -v tests.test_integration || exit
	echo "SKIPPED: python_sdk_stack (MOAT_SKIP_STACK=1)"
	exit 77
fi

export MOAT_BIN_DIR=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-py-stack.XXXXXX)
export MOAT_STATE_DIR=$state
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
export MOAT_URL=http://127.0.0.1:$port
# The tests call back to back from one address: a rate limit well above
# theirs (the door's default is 50 a second, 100 at once).
export MOAT_GATEWAY_RATE_LIMIT_RPS=1000 MOAT_GATEWAY_RATE_LIMIT_BURST=1000
unset MOAT_API_KEY MOAT_GATEWAY_AUTH

cleanup() {
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state"
}
trap cleanup EXIT

if ! bash "$repo/deploy/moat-stack" start; then
	echo "run_stack_tests: the stack did not start; last log lines:" >&2
	tail -n 30 "$state"/logs/*.log >&2
	exit 1
fi
# The stack made one API key on its first start; the SDK sends it as
# Authorization: Bearer.
MOAT_API_KEY=$(cat "$state/api-key") || { echo "run_stack_tests: the stack made no API key" >&2; exit 1; }
export MOAT_API_KEY
# MOAT_PY_TESTS: the cases to run (unittest names; default all of them).
# shellcheck disable=SC2086
"$py" -m unittest -v ${MOAT_PY_TESTS:-tests.test_integration}
rc=$?
if grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$state"/logs/*.log; then
	echo "run_stack_tests: sanitizer report in a service log" >&2
	rc=1
fi
exit $rc
