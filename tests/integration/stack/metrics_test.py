#!/usr/bin/env python3
"""stack_metrics: the local stack (deploy/moat-stack) serves metrics from
all four services, and they move when the stack works. Starts a stack in
a temporary state directory, reads each service's metrics URL from
`moat-stack status`, scrapes all four (each must parse as the text
format, prom_text.py), creates a recorded sandbox, runs a step (a
snapshot, pushed to snapd, appended to sessiond), restores the step as a
new sandbox, scrapes again and checks that the counters and histograms
of that work moved; that the listeners answer 404 off /metrics; that
every metric deploy/grafana/moat.json names exists in a scrape; and that
README lists every metric the services serve. Real VMs.
Environment: MOAT_BIN_DIR, MOAT_REPO, MOAT_IMAGE_DIR (as stack_test.sh).
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grafana_check  # noqa: E402
import prom_text  # noqa: E402

REPO = os.environ.get("MOAT_REPO") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("MOAT_BIN_DIR") or os.path.join(REPO, "build", "bin")
STACK = os.path.join(REPO, "deploy", "moat-stack")
PASSED, FAILED = [], []


def check(desc, cond):
    (PASSED if cond else FAILED).append(desc)
    print(("ok - " if cond else "FAIL - ") + desc, flush=True)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(env, *args, timeout=300):
    r = subprocess.run(args, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


def scrape_all(urls):
    out = {}
    for svc, url in urls.items():
        try:
            fams, ctype = prom_text.scrape(url)
        except (prom_text.FormatError, OSError) as e:
            check(f"{svc}'s metrics parse ({e})", False)
            fams, ctype = {}, ""
        out[svc] = fams
        check(f"{svc} serves text format 0.0.4 ({ctype})",
              "version=0.0.4" in ctype)
    return out


def val(fams, svc, name, suffix="", **labels):
    f = fams.get(svc, {}).get(name)
    return f.total(suffix, **labels) if f else None


def moved(before, after, svc, name, suffix="", at_least=1, **labels):
    b = val(before, svc, name, suffix, **labels) or 0
    a = val(after, svc, name, suffix, **labels)
    desc = (f"{name}{suffix}{labels or ''} moved by >= {at_least} "
            f"({b} -> {a})")
    return check(desc, a is not None and a - b >= at_least)


def positive(fams, svc, name, **labels):
    v = val(fams, svc, name, **labels)
    return check(f"{name}{labels or ''} > 0 ({v})", v is not None and v > 0)


def status_urls(env):
    rc, out, err = run(env, "bash", STACK, "status")
    check(f"moat-stack status (rc {rc})", rc == 0)
    urls = {}
    for line in out.splitlines():
        m = re.match(r"moat-(\w+): running .*metrics (http://\S+)", line)
        if m:
            urls[m.group(1)] = m.group(2)
    check(f"moat-stack status prints the metrics of all four ({urls})",
          sorted(urls) == ["gateway", "sessiond", "snapd", "vmd"])
    return urls


def off_path(url):
    base = url.rsplit("/metrics", 1)[0]
    try:
        urllib.request.urlopen(base + "/nope", timeout=10)
        return None
    except urllib.error.HTTPError as e:
        return e.code


def wait_for(pred, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.5)
    return pred()


def readme_metrics():
    text = open(os.path.join(REPO, "README.md")).read()
    return set(re.findall(r"`(moat_[a-z0-9_]+)`", text))


def exercise(env, moat):
    """A recorded sandbox, one step (snapshot, push, append), a restore
    of that step as a new sandbox. Returns the sandbox ids."""
    rc, sb, err = run(env, moat, "sandbox", "create", "--record",
                      "--snapshot", "every")
    check(f"recorded sandbox created ({sb or err})", rc == 0 and sb)
    rc, out, err = run(env, moat, "exec", sb, "--", "sh", "-c",
                       "head -c 2000000 /dev/urandom >/root/f; echo made")
    check(f"a recorded step runs ({out or err})", rc == 0 and out == "made")
    rc, new, err = run(env, moat, "restore", sb, "--step", "1", "--new")
    check(f"the step restores as a new sandbox ({new or err})",
          rc == 0 and new)
    return [x for x in (sb, new) if x]


def check_after(before, after):
    moved(before, after, "vmd", "moat_vmd_boot_seconds", "_count")
    moved(before, after, "vmd", "moat_vmd_restore_seconds", "_count")
    moved(before, after, "vmd", "moat_vmd_restores_total")
    moved(before, after, "vmd", "moat_vmd_snapshot_pause_seconds",
          "_count", kind="snapshot")
    moved(before, after, "vmd", "moat_vmd_pushes_total", result="ok")
    moved(before, after, "vmd", "moat_vmd_push_stored_bytes_total")
    check("vmd: 2 sandboxes running ("
          f"{val(after, 'vmd', 'moat_vmd_sandboxes', state='running')})",
          (val(after, "vmd", "moat_vmd_sandboxes", state="running") or 0)
          >= 2)
    for name in ("moat_vmd_memory_reserved_bytes", "moat_vmd_vcpus_used",
                 "moat_vmd_scratch_allocated_bytes",
                 "moat_vmd_scratch_size_bytes",
                 "moat_vmd_ram_dir_capacity_bytes",
                 "moat_vmd_resident_memory_bytes"):
        positive(after, "vmd", name)
    moved(before, after, "sessiond", "moat_sessiond_writes_total",
          op="create", result="ok")
    moved(before, after, "sessiond", "moat_sessiond_writes_total",
          op="append", result="ok")
    moved(before, after, "sessiond", "moat_sessiond_append_seconds",
          "_count")
    moved(before, after, "sessiond", "moat_sessiond_fsync_seconds",
          "_count")
    moved(before, after, "sessiond", "moat_sessiond_recordings")
    positive(after, "sessiond", "moat_sessiond_lmdb_used_bytes")
    moved(before, after, "snapd", "moat_snapd_put_chunks_seconds",
          "_count")
    moved(before, after, "snapd", "moat_snapd_chunk_bytes_received_total",
          at_least=100000)
    moved(before, after, "snapd", "moat_snapd_snapshots")
    positive(after, "snapd", "moat_snapd_stored_bytes")
    positive(after, "snapd", "moat_snapd_logical_bytes")
    positive(after, "snapd", "moat_snapd_dedup_ratio")
    moved(before, after, "gateway", "moat_gateway_calls_total",
          method="CreateSandbox", code="OK")
    moved(before, after, "gateway", "moat_gateway_call_seconds", "_count",
          method="RestoreStep")


def main():
    state = tempfile.mkdtemp(prefix="moat-metrics-test.")
    env = dict(os.environ, MOAT_STATE_DIR=state, MOAT_BIN_DIR=BIN,
               MOAT_IMAGE_DIR=os.environ.get(
                   "MOAT_IMAGE_DIR", os.path.join(REPO, "images", "out")),
               MOAT_GATEWAY=f"ipc://{state}/gateway.sock",
               MOAT_GATEWAY_HTTP=f"127.0.0.1:{free_port()}")
    moat = os.path.join(BIN, "moat")
    try:
        rc, out, err = run(env, "bash", STACK, "start", timeout=600)
        if not check(f"stack starts (rc {rc})", rc == 0):
            print(out, err, sep="\n")
            return 1
        urls = status_urls(env)
        if len(urls) != 4:
            return 1
        for svc in ("vmd", "sessiond", "snapd"):
            code = off_path(urls[svc])
            check(f"{svc}'s listener answers 404 off /metrics ({code})",
                  code == 404)
        before = scrape_all(urls)
        exercise(env, moat)
        # The push to snapd runs in the background after the step.
        pushed = val(before, "vmd", "moat_vmd_pushes_total",
                     result="ok") or 0
        wait_for(lambda: prom_text.scrape(urls["vmd"])[0][
            "moat_vmd_pushes_total"].total(result="ok") > pushed, 120)
        after = scrape_all(urls)
        check_after(before, after)
        for svc in ("vmd", "sessiond", "snapd"):
            bad = [n for n in after[svc]
                   if not n.startswith(f"moat_{svc}_")]
            check(f"every {svc} metric is named moat_{svc}_* ({bad})",
                  not bad)
        served = set()
        for fams in after.values():
            served |= set(fams)
        missing = grafana_check.names_missing(served)
        check(f"every metric the dashboard names is served ({missing})",
              not missing)
        unlisted = sorted(served - readme_metrics())
        check(f"README lists every metric served ({unlisted})",
              not unlisted)
    finally:
        run(env, "bash", STACK, "stop", timeout=120)
        subprocess.run(["pkill", "-KILL", "-f", state])
        run(env, "bash", STACK, "purge", timeout=120)
        shutil.rmtree(state, ignore_errors=True)
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
