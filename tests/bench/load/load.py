#!/usr/bin/python3
"""load.py: many agents at once against a running moat cluster, as a farm
would (issue 15): CLIENTS threads for SECONDS, each one spread over the
gateways (round robin by client), each looping over its own sandbox:
create one, then exec, run_code, snapshot, restore (in place, from one
of its snapshots) and destroy in a random mix. Every call's latency is kept
with its start time, so the report has throughput and p50/p95/p99 per
10 s window (and a PNG plot of them), errors by code with a sample each,
and after the run, once every client cleaned up what it made: leaked
VMMs, RAM files, scratch files and snapshots on every node. While it
runs, the tenant's sandboxes are listed every 0.5 s (ListSandboxes: one
per id, whatever its state): the peak, against the tenant's
max-sandboxes, shows whether the quota held across the gateways (a
restore that replaces a sandbox on another node has both for a moment,
which no quota counts). Sandbox directories on the nodes are counted too
(peak_sandbox_dirs): a restore in place has two for one sandbox while it
swaps, and a destroyed one keeps its directory until its VMM is gone.
Not a test: it decides nothing (tests/bench/load/run.sh starts the
cluster and runs it).

usage: load.py --gateways URL[,URL...] --api-key KEY --nodes DIR[,DIR...]
       --ram-dirs DIR[,DIR...] --out OUT.json [--plot OUT.png]
       [--seconds 120] [--clients 100] [--max-sandboxes N]
"""
import argparse
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

WINDOW_S = 10
# How often each operation is picked while a client has a sandbox.
MIX = (("exec", 45), ("run_code", 20), ("snapshot", 10), ("restore", 10),
       ("destroy", 15))

lock = threading.Lock()
samples = []  # (start offset s, op, latency ms, code)
errors = collections.Counter()
error_samples = {}
stop = threading.Event()
t0 = 0.0


def note(op, started, code, err=None):
    ms = (time.monotonic() - started) * 1000.0
    with lock:
        samples.append((started - t0, op, ms, code))
        if err is not None:
            errors[code] += 1
            error_samples.setdefault(code, f"{op}: {err}"[:400])


def call(client, op, method, body, timeout=120):
    started = time.monotonic()
    try:
        r = client.call(method, body, timeout=timeout)
        note(op, started, "OK")
        return r
    except moat.MoatError as e:
        note(op, started, getattr(e, "code", None) or type(e).__name__, e)
        return None


def pick():
    r = random.uniform(0, sum(w for _, w in MIX))
    for op, w in MIX:
        r -= w
        if r <= 0:
            return op
    return MIX[-1][0]


class Agent:
    """One client: at most one sandbox of its own, and the snapshots it
    took of it."""

    def __init__(self, client):
        self.c = client
        self.sb = None
        self.snaps = []

    def create(self):
        r = call(self.c, "create", "CreateSandbox", {"memoryMib": 256})
        if r is not None:
            self.sb = r["id"]
        else:
            time.sleep(1.0)  # refused (quota, full): back off a little

    def step(self):
        op = pick()
        if op == "exec":
            call(self.c, op, "Exec", {"sandboxId": self.sb,
                                      "argv": ["sh", "-c", "echo hi; ls / >/dev/null"]})
        elif op == "run_code":
            call(self.c, op, "RunCode", {"sandboxId": self.sb,
                                         "code": "x = sum(range(1000)); print(x)"})
        elif op == "snapshot":
            r = call(self.c, op, "SnapshotSandbox", {"sandboxId": self.sb})
            if r is not None:
                self.snaps.append(r["snapshotId"])
        elif op == "restore":
            if not self.snaps:
                return
            # Rewind in place: the sandbox keeps its id (and its quota
            # slot).
            r = call(self.c, op, "RestoreSandbox",
                     {"snapshotId": random.choice(self.snaps),
                      "replaceSandboxId": self.sb})
            if r is not None and r.get("id"):
                # A replace on another node comes back as a new sandbox
                # (the old one destroyed).
                self.sb = r["id"]
        else:
            self.destroy()

    def destroy(self):
        if self.sb is not None:
            call(self.c, "destroy", "DestroySandbox", {"sandboxId": self.sb})
            self.sb = None

    def cleanup(self):
        self.destroy()
        for s in self.snaps:
            call(self.c, "delete_snapshot", "DeleteLocalSnapshot",
                 {"snapshotId": s})
        self.snaps = []


def run_client(k, gateways, key):
    client = moat.Client(url=gateways[k % len(gateways)], api_key=key,
                         timeout=300)
    a = Agent(client)
    while not stop.is_set():
        if a.sb is None:
            a.create()
        else:
            a.step()
    a.cleanup()


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100.0 * len(v)))]


def windows(seconds):
    out = []
    for w in range(0, int(seconds + WINDOW_S), WINDOW_S):
        lat = [s[2] for s in samples if w <= s[0] < w + WINDOW_S]
        if not lat:
            continue
        ok = [s for s in samples if w <= s[0] < w + WINDOW_S and s[3] == "OK"]
        out.append({"t_s": w, "calls": len(lat),
                    "ok_per_s": len(ok) / WINDOW_S,
                    "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95),
                    "p99_ms": pct(lat, 99)})
    return out


def by_op():
    out = {}
    for op in sorted({s[1] for s in samples}):
        lat = [s[2] for s in samples if s[1] == op]
        out[op] = {"n": len(lat),
                   "ok": sum(1 for s in samples if s[1] == op and s[3] == "OK"),
                   "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95),
                   "p99_ms": pct(lat, 99)}
    return out


def plot(path, win, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("load: no matplotlib for /usr/bin/python3: no plot",
              file=sys.stderr)
        return False
    t = [w["t_s"] for w in win]
    fig, ax = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for k in ("p50_ms", "p95_ms", "p99_ms"):
        ax[0].plot(t, [w[k] for w in win], marker="o", label=k[:-3])
    ax[0].set_yscale("log")
    ax[0].set_ylabel("call latency (ms)")
    ax[0].legend()
    ax[0].set_title(title)
    ax[1].bar(t, [w["ok_per_s"] for w in win], width=WINDOW_S * 0.8,
              align="edge")
    ax[1].set_ylabel("successful calls / s")
    ax[1].set_xlabel(f"seconds into the run ({WINDOW_S} s windows)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def sandbox_dirs(nodes):
    n = 0
    for d in nodes:
        try:
            n += len(os.listdir(f"{d}/vms"))
        except OSError:
            pass
    return n


def watch_peak(nodes, client, peak):
    """Keeps peak[0], the most sandboxes listed at once, and peak[1], the
    most sandbox directories on the nodes."""
    while not stop.is_set():
        peak[1] = max(peak[1], sandbox_dirs(nodes))
        try:
            sbs = client.call("ListSandboxes", {}).get("sandboxes", [])
            peak[0] = max(peak[0], len({s["id"] for s in sbs}))
        except moat.MoatError:
            pass
        time.sleep(0.5)


def warm_up(gateways, key):
    """One create and destroy through each gateway before the clock
    starts, so each node's template of the shape exists (the first
    create of a shape boots cold and builds one in the background)."""
    for g in gateways:
        c = moat.Client(url=g, api_key=key, timeout=300)
        sb = c.call("CreateSandbox", {"memoryMib": 256})
        c.call("DestroySandbox", {"sandboxId": sb["id"]})


def settled_leaks(nodes, ram_dirs, client, wait_s=60):
    """leaks(), polled until nothing is left or `wait_s` passed: a
    template build or a destroy may still be finishing."""
    deadline = time.monotonic() + wait_s
    while True:
        left = leaks(nodes, ram_dirs, client)
        clean = not any(left.values())
        if clean or time.monotonic() > deadline:
            return left
        time.sleep(2)


def leaks(nodes, ram_dirs, client):
    """What is left on every node once every client cleaned up."""
    vmms = 0
    for d in nodes:
        r = subprocess.run(["pgrep", "-f", f"qemu-system.*{d}"],
                           capture_output=True, text=True)
        vmms += len(r.stdout.split())
    vms = sum(len(os.listdir(f"{d}/vms")) for d in nodes
              if os.path.isdir(f"{d}/vms"))
    scratch = 0
    for d in nodes:
        for root, _, files in os.walk(f"{d}/vms"):
            scratch += sum(1 for f in files if "scratch" in f)
    ram = []
    for d in ram_dirs:
        for root, _, files in os.walk(d):
            # moat-tpl-*, moat-spare-tpl-*: a template's RAM and its
            # spare copies, kept by design.
            ram += [os.path.join(root, f) for f in files
                    if not f.startswith(("moat-tpl-", "moat-spare-tpl-"))]
    sandboxes = client.call("ListSandboxes", {}).get("sandboxes", [])
    snaps = client.call("ListLocalSnapshots", {}).get("snapshots", [])
    return {"leaked_vmms": vmms, "leaked_sandbox_dirs": vms,
            "leaked_scratch_files": scratch,
            "ram_files_left": ram,
            "sandboxes_left": [s["id"] for s in sandboxes],
            "snapshots_left": [s.get("snapshotId") for s in snaps]}


def main():
    global t0
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateways", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--ram-dirs", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--max-sandboxes", type=int, default=0)
    a = ap.parse_args()
    gateways = a.gateways.split(",")
    nodes = a.nodes.split(",")
    ram_dirs = [d for d in a.ram_dirs.split(",") if d]
    warm_up(gateways, a.api_key)
    time.sleep(30)  # the templates' builds
    t0 = time.monotonic()
    threads = [threading.Thread(target=run_client, args=(k, gateways,
                                                         a.api_key))
               for k in range(a.clients)]
    peak = [0, 0]
    watcher = moat.Client(url=gateways[0], api_key=a.api_key, timeout=60)
    threads.append(threading.Thread(target=watch_peak,
                                    args=(nodes, watcher, peak)))
    for t in threads:
        t.start()
    time.sleep(a.seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    client = moat.Client(url=gateways[0], api_key=a.api_key, timeout=120)
    left = settled_leaks(nodes, ram_dirs, client)
    win = windows(wall)
    ok = sum(1 for s in samples if s[3] == "OK")
    allowed = {"OK", "RESOURCE_EXHAUSTED"}
    report = {
        "benchmark": "load",
        "gateways": len(gateways), "nodes": len(nodes),
        "clients": a.clients, "seconds": a.seconds,
        "wall_s": round(wall, 1),
        "calls": len(samples), "calls_ok": ok,
        "throughput_ok_per_s": ok / a.seconds,
        "by_operation": by_op(),
        "over_time": win,
        "errors_by_code": dict(errors),
        "error_samples": error_samples,
        "goal_errors": "none but RESOURCE_EXHAUSTED",
        "errors_other_than_resource_exhausted":
            sum(n for c, n in errors.items() if c not in allowed),
        "peak_sandboxes": peak[0],
        "peak_sandbox_dirs": peak[1],
        "max_sandboxes": a.max_sandboxes,
        "goal_peak": "at most max_sandboxes (plus a replace in flight)",
        "leaks": left,
        "goal_leaks": "zero",
    }
    if a.plot and plot(a.plot, win,
                       f"moat load: {a.clients} clients, {len(gateways)} "
                       f"gateways, {len(nodes)} vmds"):
        report["plot"] = os.path.basename(a.plot)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    json.dump({k: v for k, v in report.items() if k != "over_time"},
              sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
