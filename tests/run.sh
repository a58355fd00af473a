#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, makes the
# guest images (cached), and runs every test under ctest — unit (cmocka),
# fuzz (deterministic corpora), and integration (real VMs under QEMU) —
# first in the normal build, then in the AddressSanitizer + UBSan build,
# then the concurrency-heavy unit tests in a ThreadSanitizer build.
# Usage: tests/run.sh [--no-sanitize] [-- extra ctest args]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

sanitize=1
extra=()
while [ $# -gt 0 ]; do
	case "$1" in
	--no-sanitize) sanitize=0 ;;
	--) shift; extra=("$@"); break ;;
	*) echo "tests/run.sh: unknown option $1 (known: --no-sanitize, -- CTEST_ARGS)" >&2; exit 2 ;;
	esac
	shift
done

bash deploy/setup.sh --no-start
# Tests start their own services in temporary state directories; the
# images are shared.
export MOAT_IMAGE_DIR=$repo/images/out
# The tests check what moat does, not the host's isolation: where KVM is
# not usable (no /dev/kvm, or one that opens but on which guests hang, as
# on nested paravirtual hosts, which vmd's probe finds) their vmds accept
# TCG. The tests of the refusal itself unset it.
export MOAT_VMD_ALLOW_TCG=${MOAT_VMD_ALLOW_TCG:-true}

# run_suite DIR: the tests without VMs (unit, fuzz, install, style) side
# by side, as many as there are CPUs: they wait on sockets and processes
# more than they compute. Then the integration tests one at a time: their
# guests run under TCG where there is no KVM, and two of them on two
# CPUs would only race their boot deadlines. Extra environment is passed
# by the caller. run_suite DIR skip-long: leaves out the integration tests
# labelled "long" (VM tests that gain little from a second build, most
# because the sanitizer build's unit tests drive the same C paths: the
# gRPC and Connect doors' streams, the pty, the TypeScript SDK's calls;
# CI runs them in the normal build only, to stay within its time).
run_suite() {
	local dir=$1 skip='^(unit|fuzz|install|style)$'
	[ "${2:-}" = skip-long ] && skip='^(unit|fuzz|install|style|long)$'
	ctest --test-dir "$dir" --output-on-failure --timeout 900 \
		-j"$(nproc)" -L '^(unit|fuzz|install|style)$' "${extra[@]}"
	ctest --test-dir "$dir" --output-on-failure --timeout 900 \
		-LE "$skip" "${extra[@]}"
}

echo "== tests (build)"
run_suite build

if [ "$sanitize" -eq 1 ]; then
	echo "== sanitizer build (build-asan)"
	cmake -S . -B build-asan -DMOAT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	make -C build-asan -j"$(nproc)" --no-print-directory
	echo "== tests (build-asan: AddressSanitizer + UBSan)"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		run_suite build-asan skip-long
fi

# ThreadSanitizer: the unit tests that run many threads against one
# another (RPC server and client, the gateway's forwarding, the HTTP and
# MCP doors, sessiond's concurrent writers, snapd, vmd's guest link, the
# TLS links, the gateway's node prover and the metrics registry, and the
# gateway's deferred steps, drains, quota reservations and gRPC door).
# The rest gain nothing from it and the whole tree costs minutes more.
tsan_targets=(test_lib_rpc test_lib_rpc_defer test_concurrency test_forward test_services
	test_http test_mcp_http test_snapd test_vm_guest_link test_lib_tls
	test_node_proof test_crosshost test_vm_pushq test_lib_metrics
	test_record_async test_drain test_quota_cluster test_grpc_wire
	test_grpc_exec test_vm_pool_unit)
tsan_tests='^(lib_metrics|lib_rpc|lib_rpc_defer|session\.test_concurrency|gateway\.test_forward|gateway\.test_services|gateway\.test_http|gateway\.test_mcp_http|snapshot\.test_snapd|vm_guest_link|lib_tls|gateway\.test_node_proof|gateway\.test_crosshost|vm_pushq|gateway\.test_record_async|gateway\.test_drain|gateway\.test_quota_cluster|gateway\.test_grpc_wire|gateway\.test_grpc_exec|vm_pool_unit)$'

tsan_probe() {
	local d
	d=$(mktemp -d)
	printf '#include <pthread.h>\nstatic void *f(void *a) { return a; }\nint main(void) { pthread_t t; return pthread_create(&t, 0, f, 0) || pthread_join(t, 0); }\n' >"$d/p.c"
	cc -fsanitize=thread "$d/p.c" -o "$d/p" 2>"$d/err" && "$d/p" 2>>"$d/err"
	local rc=$?
	tsan_why=$(head -c 300 "$d/err" | tr '\n' ' ')
	rm -rf "$d"
	return $rc
}

if [ "$sanitize" -eq 1 ]; then
	if tsan_probe; then
		echo "== ThreadSanitizer build (build-tsan)"
		cmake -S . -B build-tsan -DMOAT_TSAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
		make -C build-tsan -j"$(nproc)" --no-print-directory "${tsan_targets[@]}"
		echo "== tests (build-tsan: ThreadSanitizer)"
		# The tests wait on sockets far more than they compute: two at a
		# time halves the wall time on two cores.
		TSAN_OPTIONS="suppressions=$repo/tests/tsan/suppressions.txt halt_on_error=1 second_deadlock_stack=1" \
			ctest --test-dir build-tsan --output-on-failure --timeout 600 \
			-j2 -R "$tsan_tests" "${extra[@]}"
	else
		echo "SKIPPED: tsan (a ThreadSanitizer program cannot build or run here: $tsan_why)"
	fi
fi
