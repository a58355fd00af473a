#!/bin/bash
# images/boot-check.sh: boots a built image once with the QEMU command
# line moat-vmd uses (images/README.md), waits for the agent's ready
# frame, runs `python3 -c 'print(6*7)'` (or --run's shell command, whose
# output must be --expect's text when given) through the guest protocol,
# asks the agent to power off, and prints the times. A smoke test of an image
# and a measurement, not a test suite (tests/integration has those).
#
# usage: images/boot-check.sh IMAGE_DIR [--kernel vmlinux|vmlinuz] [--kvm]
#                             [--timeout SECONDS] [--append "ARGS"] [--keep-console FILE]
#                             [--run 'SHELL COMMAND' [--expect OUTPUT]]
set -euo pipefail

img=
kernel=
accel=tcg
timeout=60
extra_append=
keep_console=
run=
expect=42
while [ $# -gt 0 ]; do
	case $1 in
	--kernel) kernel=$2; shift 2 ;;
	--kvm) accel=kvm; shift ;;
	--timeout) timeout=$2; shift 2 ;;
	--append) extra_append=$2; shift 2 ;;
	--keep-console) keep_console=$2; shift 2 ;;
	--run) run=$2; [ "$expect" != 42 ] || expect=; shift 2 ;;
	--expect) expect=$2; shift 2 ;;
	-h|--help) sed -n 's/^# usage: /usage: /p; s/^#  \{26\}/       /p' "$0"; exit 0 ;;
	*) [ -z "$img" ] || { echo "boot-check: one image dir only" >&2; exit 2; }; img=$1; shift ;;
	esac
done
if [ -z "$img" ] || [ ! -f "$img/initrd.img" ] || [ ! -f "$img/rootfs.ext4" ]; then
	echo "boot-check: no image in '${img}': run images/build.sh first" >&2
	exit 2
fi
# PVH entry of the ELF kernel skips the bzImage's self-decompression,
# which costs seconds under TCG.
if [ -z "$kernel" ]; then
	kernel=vmlinuz
	[ -f "$img/vmlinux" ] && kernel=vmlinux
fi
command -v qemu-system-x86_64 >/dev/null || { echo "boot-check: qemu-system-x86_64 is missing (apt-get install qemu-system-x86)" >&2; exit 2; }

# The guest TSC runs at the host's rate under TCG; tell the guest, or its
# calibration against the emulated PIT can fail and hang the boot.
tsc_mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Refined TSC clocksource calibration: \([0-9.]*\) MHz.*/\1/p' | tail -n 1)
[ -n "$tsc_mhz" ] || tsc_mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Detected \([0-9.]*\) MHz.*/\1/p' | tail -n 1)
[ -n "$tsc_mhz" ] || tsc_mhz=$(awk -F': ' '/^cpu MHz/ { print $2; exit }' /proc/cpuinfo)
tsc_khz=$(awk -v m="$tsc_mhz" 'BEGIN { printf "%d", m * 1000 }')

dir=$(mktemp -d /tmp/moat-boot-check.XXXXXX)
ram=/dev/shm/moat-boot-check-$$.ram
qemu_pid=
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
		kill "$qemu_pid" 2>/dev/null || true
		wait "$qemu_pid" 2>/dev/null || true
	fi
	[ -z "$keep_console" ] || cp "$dir/console.log" "$keep_console" 2>/dev/null || true
	rm -rf "$dir" "$ram"
}
trap cleanup EXIT

t_scratch=${EPOCHREALTIME/./}
truncate -s 1G "$dir/scratch.ext4"
mkfs.ext4 -q -L moat-scratch -E lazy_itable_init=1,lazy_journal_init=1,nodiscard "$dir/scratch.ext4"
t_start=${EPOCHREALTIME/./}

qemu-system-x86_64 \
	-M microvm,x-option-roms=off,rtc=on,memory-backend=ram \
	-accel "$accel" -cpu max -smp 1 -m 256M \
	-object memory-backend-file,id=ram,size=256M,mem-path="$ram",share=on \
	-no-reboot -nodefaults -no-user-config -display none \
	-serial file:"$dir/console.log" \
	-kernel "$img/$kernel" -initrd "$img/initrd.img" \
	-append "console=ttyS0 reboot=t panic=-1 quiet tsc_early_khz=$tsc_khz pci=off cryptomgr.notests 8250.nr_uarts=1 no_timer_check init_on_alloc=0 moat.root=LABEL=moat-root moat.scratch=LABEL=moat-scratch moat.port=org.moat.agent${extra_append:+ $extra_append}" \
	-drive id=root,file="$img/rootfs.ext4",format=raw,if=none,readonly=on \
	-device virtio-blk-device,drive=root \
	-drive id=scratch,file="$dir/scratch.ext4",format=raw,if=none \
	-device virtio-blk-device,drive=scratch \
	-device virtio-serial-device \
	-chardev socket,id=agent,path="$dir/agent.sock",server=on,wait=off \
	-device virtserialport,chardev=agent,name=org.moat.agent \
	-qmp unix:"$dir/qmp.sock",server=on,wait=off \
	-pidfile "$dir/qemu.pid" &
qemu_pid=$!

echo "boot-check: $img ($kernel, $accel, tsc_early_khz=$tsc_khz), scratch disk in $(( (t_start - t_scratch) / 1000 )) ms"
rc=0
python3 - "$dir/agent.sock" "$timeout" "$t_start" "$run" "$expect" <<'EOF' || rc=$?
# A tiny guest-protocol client: 4-byte big-endian length + protobuf
# (guest.proto), just enough fields encoded and decoded by hand.
import socket, struct, sys, time

path, timeout, t_start = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]) / 1e6
run, expect = sys.argv[4], sys.argv[5]
deadline = t_start + timeout

def since():
    return time.time() - t_start

def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])

def field(num, wire, value):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(value)
    return key + varint(len(value)) + value

def parse(buf):
    """field number -> list of values (ints for varints, bytes for LEN)"""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("bad wire type %d" % wire)
        out.setdefault(num, []).append(v)
    return out

def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i

def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError("agent closed the link")
        data += chunk
    return data

def recv_msg(s):
    (n,) = struct.unpack(">I", recv_exact(s, 4))
    if n > 16 << 20:
        raise ValueError("frame of %d bytes" % n)
    return parse(recv_exact(s, n))

def send_req(s, req_id, op_field, body):
    msg = field(1, 0, req_id) + field(op_field, 2, body)
    s.sendall(struct.pack(">I", len(msg)) + msg)

s = socket.socket(socket.AF_UNIX)
while True:
    try:
        s.connect(path)
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("boot-check: QEMU never opened %s" % path)
        time.sleep(0.005)
t_conn = since()
s.settimeout(max(1.0, deadline - time.time()))
try:
    m = recv_msg(s)
    if 19 not in m:
        sys.exit("boot-check: first frame is not AgentReady: %r" % m)
    ready = parse(m[19][0])
    t_ready = since()
    print("boot-check: QEMU socket up at %.3f s, agent ready at %.3f s "
          "(guest boot_ms=%d, kernel %s)" % (t_conn, t_ready,
          ready.get(2, [0])[0], ready.get(3, [b"?"])[0].decode()))
    argv = [b"/bin/sh", b"-c", run.encode()] if run else \
        [b"python3", b"-c", b"print(6*7)"]
    body = b"".join(field(1, 2, a) for a in argv)
    body += field(6, 0, 1) + field(7, 0, 30000)
    send_req(s, 1, 10, body)
    out = b""
    while True:
        m = recv_msg(s)
        if m.get(1, [0])[0] != 1:
            continue
        if m.get(2, [0])[0] != 0:
            sys.exit("boot-check: exec failed: code %d %s" % (m[2][0],
                     m.get(3, [b""])[0].decode(errors="replace")))
        if 11 in m:
            out += parse(m[11][0]).get(2, [b""])[0]
        if 12 in m:
            code = parse(m[12][0]).get(1, [0])[0]
            break
    t_exec = since()
    print("boot-check: %s -> %r exit %d at %.3f s "
          "(%.3f s after ready)" % (run or "python3 -c 'print(6*7)'",
          out.decode(errors="replace").strip(), code, t_exec,
          t_exec - t_ready))
    if (expect and out.strip() != expect.encode()) or code != 0:
        sys.exit("boot-check: wrong answer")
    send_req(s, 2, 21, b"")
except (socket.timeout, EOFError, ValueError, OSError) as e:
    sys.exit("boot-check: %s at %.3f s" % (e, since()))
EOF

if [ "$rc" = 0 ]; then
	# the agent powers off after the shutdown request: QEMU exits itself
	for _ in $(seq 100); do
		kill -0 "$qemu_pid" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$qemu_pid" 2>/dev/null; then
		echo "boot-check: QEMU still running 5 s after the shutdown request" >&2
		rc=1
	else
		echo "boot-check: powered off at $(( (${EPOCHREALTIME/./} - t_start) / 1000 )) ms"
	fi
fi
if [ "$rc" != 0 ]; then
	echo "boot-check: FAILED; last console lines:" >&2
	tail -n 25 "$dir/console.log" >&2 || true
fi
exit "$rc"
