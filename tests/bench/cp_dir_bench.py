#!/usr/bin/env python3
"""cp_dir_bench.py: `moat cp -r` throughput (issue 17) in and out of one
sandbox of a fresh local stack, for (a) 1,000 small files and (b) those
plus a 20 MB file, each against plain `moat cp` of one file of the same
total size (ReadFile/WriteFile); p50/p95 of RUNS runs and the ratios,
written as "cp_dir" into tests/bench/results/images.json (the issue's
results file; moat-bench-images writes the rest, so run this after it, as
tests/bench/run.sh does). Not a pass/fail test: timings
are noisy (and slow under TCG); compare ratios measured side by side.

Usage: cp_dir_bench.py [RUNS]   (MOAT_BIN_DIR, MOAT_IMAGE_DIR as for the
stack; default 5 runs)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("MOAT_BIN_DIR", os.path.join(REPO, "build", "bin"))
MOAT = os.path.join(BIN, "moat")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def make_tree(top, big):
    for i in range(1000):
        d = os.path.join(top, "d%d" % (i % 10), "e%d" % (i // 10 % 10))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "f%d.txt" % i), "w") as f:
            f.write(("file %d\n" % i) * (i % 7 + 1))
    if big:
        with open(os.path.join(top, "big.bin"), "wb") as f:
            f.write(os.urandom(20 << 20))


def tree_bytes(top):
    n = 0
    for d, _, files in os.walk(top):
        n += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return n


def timed(argv):
    t = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def stats(xs, nbytes):
    return {
        "p50_s": round(pct(xs, 50), 4),
        "p95_s": round(pct(xs, 95), 4),
        "p50_mib_s": round(nbytes / (1 << 20) / pct(xs, 50), 2),
        "runs": [round(x, 4) for x in xs],
    }


def bench(sb, work, name, big, runs):
    tree = os.path.join(work, name)
    make_tree(tree, big)
    total = tree_bytes(tree)
    single = os.path.join(work, name + ".one")
    with open(single, "wb") as f:
        f.write(os.urandom(total))
    r = {"bytes": total, "files": 1000 + (1 if big else 0)}
    for kind in ("dir_in", "dir_out", "file_in", "file_out"):
        xs = []
        for i in range(runs):
            remote = "%s:/root/b-%s-%d" % (sb, name, i)
            local = os.path.join(work, "out-%s-%d" % (name, i))
            if kind == "dir_in":
                xs.append(timed([MOAT, "cp", "-r", tree, remote]))
            elif kind == "file_in":
                xs.append(timed([MOAT, "cp", single, remote + ".one"]))
            elif kind == "dir_out":
                xs.append(timed([MOAT, "cp", "-r", remote, local]))
                shutil.rmtree(local)
            else:
                xs.append(timed([MOAT, "cp", remote + ".one", local]))
                os.unlink(local)
        r[kind] = stats(xs, total)
    r["ratio_in_p50"] = round(r["dir_in"]["p50_s"] / r["file_in"]["p50_s"], 2)
    r["ratio_out_p50"] = round(r["dir_out"]["p50_s"] / r["file_out"]["p50_s"], 2)
    return r


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    state = tempfile.mkdtemp(prefix="moat-bench-cp.")
    work = tempfile.mkdtemp(prefix="moat-bench-cp-work.")
    env = dict(os.environ, MOAT_STATE_DIR=state, MOAT_BIN_DIR=BIN,
               MOAT_GATEWAY="ipc://%s/gateway.sock" % state)
    os.environ.update(env)
    stack = os.path.join(REPO, "deploy", "moat-stack")
    try:
        subprocess.run(["bash", stack, "start"], check=True)
        sb = subprocess.run([MOAT, "sandbox", "create", "--scratch", "4096"],
                            check=True, capture_output=True,
                            text=True).stdout.strip()
        out = {
            "bench": "cp_dir",
            "what": "moat cp -r vs moat cp of one file of the same size",
            "runs": runs,
            "accel": "kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK)
            else "tcg (no /dev/kvm: every guest syscall is emulated)",
            "small_1000_files": bench(sb, work, "small", False, runs),
            "tree_20mb": bench(sb, work, "big", True, runs),
        }
    finally:
        subprocess.run(["bash", stack, "stop"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        subprocess.run(["bash", stack, "purge"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    dst = os.path.join(REPO, "tests", "bench", "results", "images.json")
    try:
        with open(dst) as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = {}
    results["cp_dir"] = out
    with open(dst, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
