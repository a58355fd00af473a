#!/usr/bin/python3
"""soak.py: agent loops against a running moat stack for a while, as a
farm would (issue 11): each loop creates a recorded sandbox with
snapshots after every step, runs three steps, then restores a step (in
place), forks a step (2 copies) or replays the session, destroys what it
made and deletes its sessions. Meanwhile it samples the host's Shmem.
Writes a JSON report: operations done, errors by code, peak Shmem, and
(after the loops) leaked VMMs, sandbox directories and snapshots, Shmem
against its start, and the services' RSS and open files at start and
end. Not a test: it decides nothing; tests/bench/soak/run.sh starts the
stack and runs it.

usage: soak.py STATE_DIR OUT.json [SECONDS] [LOOPS]
(MOAT_URL and MOAT_API_KEY as for the SDK.)
"""
import collections
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                "clients", "python"))
import moat  # noqa: E402

STATE, OUT = sys.argv[1], sys.argv[2]
SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 600
LOOPS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
SERVICES = ("gateway", "vmd", "sessiond", "snapd")

lock = threading.Lock()
ops = collections.Counter()
errors = collections.Counter()
error_samples = {}
peak = {"shmem_kib": 0}
stop = threading.Event()


def shmem_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    return 0


def service_stats():
    out = {}
    for s in SERVICES:
        try:
            pid = int(open(f"{STATE}/run/{s}.pid").read().strip())
            mem = {}
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    k = line.split(":")[0]
                    if k in ("VmRSS", "RssAnon", "RssFile"):
                        mem[k] = int(line.split()[1])
            # RssFile is mostly LMDB's mapped file (page cache); RssAnon
            # is the process's own memory.
            out[s] = {"pid": pid, "rss_kib": mem.get("VmRSS", 0),
                      "rss_anon_kib": mem.get("RssAnon", 0),
                      "rss_file_kib": mem.get("RssFile", 0),
                      "open_files": len(os.listdir(f"/proc/{pid}/fd"))}
        except (OSError, ValueError):
            out[s] = None
    return out


def note(op, err=None):
    with lock:
        if err is None:
            ops[op] += 1
        else:
            code = getattr(err, "code", None) or type(err).__name__
            errors[code] += 1
            error_samples.setdefault(code, f"{op}: {err}"[:400])


def call(client, op, method, body, timeout=120):
    try:
        r = client.call(method, body, timeout=timeout)
        note(op)
        return r
    except moat.MoatError as e:
        note(op, e)
        return None


def one_round(client, rnd):
    made, sessions = [], []
    sb = call(client, "create", "CreateSandbox",
              {"memoryMib": 256, "record": True,
               "snapshotPolicy": "SNAPSHOT_POLICY_EVERY"})
    if sb is None:
        return
    sid = sb["id"]
    made.append(sid)
    session = sb.get("sessionId", "")
    for i in range(3):
        code = (f"import hashlib, os; x = {i}; "
                f"open('/root/f{i}', 'wb').write(os.urandom({200000 * (i + 1)}))")
        call(client, "step", "RunCode", {"sandboxId": sid, "code": code})
    if not session:
        lst = call(client, "list_sessions", "ListSessions", {"sandboxId": sid})
        ss = (lst or {}).get("sessions", [])
        session = ss[-1]["id"] if ss else ""
    if session:
        sessions.append(session)
    what = rnd % 3
    if session and what == 0:
        r = call(client, "restore", "RestoreStep",
                 {"sessionId": session, "step": random.randint(1, 3)})
        if r and r.get("sessionId"):
            sessions.append(r["sessionId"])
        if r and r.get("sandbox", {}).get("id") not in made + [None]:
            made.append(r["sandbox"]["id"])
    elif session and what == 1:
        r = call(client, "fork", "Fork",
                 {"sessionId": session, "step": random.randint(1, 3),
                  "count": 2})
        for c in (r or {}).get("copies", []):
            if c.get("sandbox", {}).get("id"):
                made.append(c["sandbox"]["id"])
            if c.get("sessionId"):
                sessions.append(c["sessionId"])
            if c.get("code", "OK") not in ("OK", 0):
                note("fork_copy", moat.MoatError(c.get("code"),
                                                 c.get("message", "")))
    elif session:
        r = call(client, "replay", "Replay", {"sessionId": session},
                 timeout=300)
        if r and r.get("sessionId"):
            sessions.append(r["sessionId"])
    for s in made:
        call(client, "destroy", "DestroySandbox", {"sandboxId": s})
    for s in reversed(sessions):
        call(client, "delete_session", "DeleteSession", {"sessionId": s})


def loop(k):
    client = moat.Client(timeout=300)
    rnd = k
    while not stop.is_set():
        one_round(client, rnd)
        rnd += 1


def sampler():
    while not stop.is_set():
        v = shmem_kib()
        with lock:
            peak["shmem_kib"] = max(peak["shmem_kib"], v)
        time.sleep(0.5)


def allocated_kib(path):
    try:
        return os.stat(path).st_blocks // 2
    except OSError:
        return 0


def ram_fs_usage_kib():
    """(used as df counts it, what its backing file holds) of the RAM
    filesystem, or (0, 0) when the RAM dir is not a loop-mounted one."""
    ram = f"{STATE}/ram"
    r = subprocess.run(["findmnt", "-n", "-o", "SOURCE", "--target", ram],
                       capture_output=True, text=True)
    dev = r.stdout.strip()
    if not dev.startswith("/dev/loop"):
        return (0, 0)
    img = subprocess.run(["losetup", "-n", "-O", "BACK-FILE", dev],
                         capture_output=True, text=True).stdout.strip()
    st = os.statvfs(ram)
    return ((st.f_blocks - st.f_bfree) * st.f_frsize // 1024,
            allocated_kib(img))


def ram_fs_metadata_kib():
    """What the RAM filesystem (deploy/ramfs.sh: an XFS on a sparse file
    in /dev/shm) counts as used but its backing file does not hold yet:
    its own metadata (the 64 MiB log first), written as it is used."""
    ram = f"{STATE}/ram"
    r = subprocess.run(["findmnt", "-n", "-o", "SOURCE", "--target", ram],
                       capture_output=True, text=True)
    dev = r.stdout.strip()
    if not dev.startswith("/dev/loop"):
        return 0
    img = subprocess.run(["losetup", "-n", "-O", "BACK-FILE", dev],
                         capture_output=True, text=True).stdout.strip()
    st = os.statvfs(ram)
    used_kib = (st.f_blocks - st.f_bfree) * st.f_frsize // 1024
    return max(0, used_kib - allocated_kib(img))


def template_ram_kib():
    """The node's templates' RAM copies (kept by design, one per shape)."""
    total = 0
    root = f"{STATE}/templates"
    for d in os.listdir(root) if os.path.isdir(root) else []:
        total += allocated_kib(os.path.join(root, d, "ram"))
    return total


def vmm_count():
    r = subprocess.run(["pgrep", "-f", f"qemu-system.*{STATE}"],
                       capture_output=True, text=True)
    return len(r.stdout.split())


def main():
    client = moat.Client(timeout=120)
    start = {"shmem_kib": shmem_kib(), "services": service_stats(),
             "unix": time.time(), "fs_meta_kib": ram_fs_metadata_kib()}
    threads = [threading.Thread(target=loop, args=(k,)) for k in range(LOOPS)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join()
    time.sleep(3)
    # Whatever sessions are left (a delete that failed) are deleted now,
    # so the leak counts below are of the services, not of the loops.
    left = client.call("ListSessions", {"pageSize": 1000}).get("sessions", [])
    for s in left:
        call(client, "cleanup_session", "DeleteSession", {"sessionId": s["id"]})
    sandboxes = client.call("ListSandboxes", {}).get("sandboxes", [])
    snaps = client.call("ListLocalSnapshots", {}).get("snapshots", [])
    time.sleep(2)
    vms = os.listdir(f"{STATE}/vms") if os.path.isdir(f"{STATE}/vms") else []
    # Freed blocks go back as XFS discards them: at once for files vmd
    # removes (it forces the log), at its next log push (up to 30 s) for
    # what XFS frees in the background (copy-on-write leftovers).
    t_end = time.time()
    allowed_now = (start["shmem_kib"] + 64 * 1024 + start["fs_meta_kib"] +
                   template_ram_kib())
    while shmem_kib() > allowed_now and time.time() - t_end < 45:
        time.sleep(1)
    settle_s = round(time.time() - t_end, 1)
    end = {"shmem_kib": shmem_kib(), "services": service_stats(),
           "templates_kib": template_ram_kib(),
           "ram_fs": ram_fs_usage_kib(),
           "ram_files": sorted(os.listdir(f"{STATE}/ram"))
           if os.path.isdir(f"{STATE}/ram") else []}
    allowed = (start["shmem_kib"] + 64 * 1024 + start["fs_meta_kib"] +
               end["templates_kib"])
    report = {
        "benchmark": "soak",
        "seconds": SECONDS,
        "loops": LOOPS,
        "snapshot_ram_mib": int(os.environ.get("MOAT_VMD_SNAPSHOT_RAM_MIB",
                                               "0")),
        "operations": dict(ops),
        "operations_total": sum(ops.values()),
        "errors_by_code": dict(errors),
        "error_samples": error_samples,
        "goal_errors": "none but RESOURCE_EXHAUSTED",
        "sessions_left_after_loops": len(left),
        "leaked_sandboxes": len(sandboxes),
        "leaked_vmms": vmm_count(),
        "leaked_sandbox_dirs": len(vms),
        "snapshots_left": [s.get("snapshotId") for s in snaps],
        "shmem_kib_start": start["shmem_kib"],
        "shmem_kib_peak": peak["shmem_kib"],
        "shmem_kib_end": end["shmem_kib"],
        "shmem_slack_kib": 64 * 1024,
        "ram_fs_metadata_kib": start["fs_meta_kib"],
        "template_ram_kib": end["templates_kib"],
        "ram_fs_used_kib_end": end["ram_fs"][0],
        "ram_fs_backing_kib_end": end["ram_fs"][1],
        "ram_dir_files_end": end["ram_files"],
        "shmem_end_allowed_kib": allowed,
        "shmem_back_to_start": end["shmem_kib"] <= allowed,
        "shmem_settle_s": settle_s,
        "services_start": start["services"],
        "services_end": end["services"],
        "node": client.call("Info", {}).get("nodes", [{}])[0],
    }
    with open(OUT, "w") as f:
        json.dump(report, f, indent=2)
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
