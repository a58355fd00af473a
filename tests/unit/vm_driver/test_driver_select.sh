#!/usr/bin/env bash
# Starts moat-vmd with each driver setting in a temporary state directory
# and checks what it says and whether it starts. No VM is booted.
set -u
vmd=$1
state=$(mktemp -d /tmp/moat-driver-test.XXXXXX)
trap 'rm -rf "$state"' EXIT
passed=0
failed=0
check() {
	local d=$1; shift
	if "$@"; then passed=$((passed + 1)); echo "ok - $d"
	else failed=$((failed + 1)); echo "FAIL - $d"; fi
}

# No firecracker on PATH (and a name that cannot exist).
MOAT_VMD_FIRECRACKER=/nonexistent/firecracker timeout 20 "$vmd" \
	--state-dir "$state" --listen "ipc://$state/a.sock" \
	--driver firecracker >"$state/out" 2>&1
rc=$?
check "driver=firecracker without the binary fails (rc $rc)" [ $rc -ne 0 -a $rc -ne 124 ]
check "the message names the binary it looked for" grep -q "/nonexistent/firecracker" "$state/out"
check "the message says what to do (driver=qemu)" grep -q "driver=qemu" "$state/out"

# No QEMU at the configured path: the message names the Debian package.
MOAT_VMD_QEMU=/nonexistent/qemu-system-x86_64 timeout 20 "$vmd" \
	--state-dir "$state" --listen "ipc://$state/q.sock" \
	--driver qemu >"$state/out" 2>&1
rc=$?
check "driver=qemu without the binary fails (rc $rc)" [ $rc -ne 0 -a $rc -ne 124 ]
check "the message names the binary it looked for" grep -q "/nonexistent/qemu-system-x86_64" "$state/out"
check "the message names the Debian package qemu-system-x86" grep -q "package qemu-system-x86" "$state/out"

timeout 20 "$vmd" --state-dir "$state" --listen "ipc://$state/b.sock" \
	--driver bogus >"$state/out" 2>&1
rc=$?
check "driver=bogus is refused (rc $rc)" [ $rc -ne 0 -a $rc -ne 124 ]
check "naming the choices" grep -q "not one of auto, firecracker, qemu" "$state/out"

# auto with no firecracker: starts on qemu; stop it once it says so.
MOAT_VMD_FIRECRACKER=/nonexistent/firecracker "$vmd" --state-dir "$state" \
	--listen "ipc://$state/c.sock" --driver auto >"$state/out" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
	grep -q "driver: qemu" "$state/out" && break
	kill -0 $pid 2>/dev/null || break
	sleep 0.1
done
check "driver=auto falls back to qemu" grep -q "driver: qemu" "$state/out"
check "and says why not firecracker" grep -q "not firecracker" "$state/out"
kill -TERM $pid 2>/dev/null
wait $pid
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
