#!/usr/bin/python3
"""plot.py: draws every benchmark result (tests/bench/results/*.json) into
PNG charts, by default in tests/bench/results/plots/ (issue 18, part 6).

Usage: /usr/bin/python3 tests/bench/plot.py [RESULTS_DIR] [--out DIR]

It needs Debian's python3-matplotlib (deploy/install-deps.sh --bench) and
so /usr/bin/python3: another python3 first on PATH may lack it.

Every file gets generic charts from its shape:
  - every {p50_ms, p95_ms} (or _s) summary: a bar chart of p50 and p95
    (<name>_p50_p95.png);
  - every array of 3 or more numbers (samples): a box plot
    (<name>_distributions.png);
  - every array of records with a time key (t_s, t, time_s, ...): one
    line per numeric field over time (<name>_series_<path>.png).
and some files a chart of their own:
  - create vs cold boot (create.json, snapshot.json): create_vs_cold.png,
    and the node's phases of each kind and stack (create_phases.png);
  - fork scaling by copies (travel.json): fork_scaling.png;
  - density, memory and idle CPU per sandbox by count (density.json,
    {"runs": [{"n", "mode", "pss_mib_per_vm", "memavail_drop_mib_per_vm",
    "idle_cpu_pct_per_vm", "creates_per_s"}, ...]}, or moat-bench-density's
    {"modes": {MODE: {"by_count": [...]}}}): density.png;
  - load over time (load.json's over_time): load_over_time.png.
A file that is not valid JSON, or whose charts fail, is reported on
stderr and skipped; the others are drawn. Exit status: 0 when every file
was drawn, 1 when some were skipped, 2 on bad usage.
"""
import json
import math
import os
import re
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.stderr.write(
        "plot.py: matplotlib is missing: install Debian's python3-matplotlib "
        "(bash deploy/install-deps.sh --bench) and run this with "
        "/usr/bin/python3\n"
    )
    sys.exit(3)

DPI = 80
MAX_BARS = 40
# Summaries a chart of their own shows: left out of the generic bars.
GENERIC_SKIP = (".node_phases.",)
TIME_KEYS = ("t_s", "t", "time_s", "t_ms", "elapsed_s", "second", "seconds_in")


def say(msg):
    sys.stderr.write("plot.py: " + msg + "\n")


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "x"


def save(fig, out_dir, name, made):
    path = os.path.join(out_dir, safe(name) + ".png")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    made.append(path)


# ---- generic: walk the JSON ----


def walk(obj, path, summaries, samples, series):
    if isinstance(obj, dict):
        for unit in ("ms", "s"):
            p50, p95 = obj.get("p50_" + unit), obj.get("p95_" + unit)
            if is_num(p50):
                summaries.append((path or "(top)", unit, p50, p95 if is_num(p95) else None))
                break
        for k, v in obj.items():
            walk(v, (path + "." if path else "") + str(k), summaries, samples, series)
    elif isinstance(obj, list):
        if len(obj) >= 3 and all(is_num(v) for v in obj):
            samples.append((path, [float(v) for v in obj]))
        elif len(obj) >= 2 and all(isinstance(v, dict) for v in obj):
            tkey = next((k for k in TIME_KEYS if all(is_num(v.get(k)) for v in obj)), None)
            if tkey is not None:
                series.append((path, tkey, obj))
            for i, v in enumerate(obj):
                walk(v, "%s[%d]" % (path, i), summaries, samples, series)


def chart_summaries(stem, summaries, out_dir, made):
    for unit in ("ms", "s"):
        # A phase that did not happen (p50 and p95 0) is no bar.
        rows = [r for r in summaries if r[1] == unit and (r[2] or r[3]) and not any(k in r[0] for k in GENERIC_SKIP)]
        for part in range(0, len(rows), MAX_BARS):
            chunk = rows[part : part + MAX_BARS]
            if not chunk:
                continue
            fig, ax = plt.subplots(figsize=(9, 1.2 + 0.38 * len(chunk)))
            ys = range(len(chunk))
            p50 = [r[2] for r in chunk]
            p95 = [r[3] if r[3] is not None else 0 for r in chunk]
            ax.barh([y + 0.2 for y in ys], p50, height=0.4, label="p50")
            ax.barh([y - 0.2 for y in ys], p95, height=0.4, label="p95")
            ax.set_yticks(list(ys))
            ax.set_yticklabels([r[0][-60:] for r in chunk], fontsize=7)
            ax.invert_yaxis()
            vals = [v for v in p50 + p95 if v > 0]
            if vals and max(vals) / min(vals) > 200:
                ax.set_xscale("log")
            ax.set_xlabel(unit)
            ax.legend(fontsize=7)
            n = part // MAX_BARS
            ax.set_title("%s: p50 and p95%s" % (stem, " (%d)" % (n + 1) if len(rows) > MAX_BARS else ""))
            save(fig, out_dir, "%s_p50_p95%s%s" % (stem, "" if unit == "ms" else "_s", "_%d" % (n + 1) if n else ""), made)


def chart_samples(stem, samples, out_dir, made):
    if not samples:
        return
    samples = samples[:MAX_BARS]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(samples)))
    ax.boxplot([s[1] for s in samples], vert=False, labels=[s[0][-60:] for s in samples])
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("%s: distributions" % stem)
    save(fig, out_dir, "%s_distributions" % stem, made)


def chart_series(stem, series, out_dir, made):
    for path, tkey, rows in series:
        fields = [k for k in rows[0] if k != tkey and all(is_num(r.get(k)) for r in rows)]
        if not fields:
            continue
        fields = fields[:6]
        fig, axes = plt.subplots(len(fields), 1, figsize=(8, 1.8 * len(fields)), sharex=True, squeeze=False)
        t = [r[tkey] for r in rows]
        for ax, f in zip(axes[:, 0], fields):
            ax.plot(t, [r[f] for r in rows], marker=".")
            ax.set_ylabel(f, fontsize=7)
        axes[-1, 0].set_xlabel(tkey)
        axes[0, 0].set_title("%s: %s over time" % (stem, path))
        save(fig, out_dir, "%s_series_%s" % (stem, path), made)


# ---- specific charts ----


def p50(d, *keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    v = d.get("p50_ms") if isinstance(d, dict) else None
    return v if is_num(v) else None


def chart_create_vs_cold(results, out_dir, made):
    bars = []  # (label, clone p50, cold p50)
    stacks = create_stacks(results.get("create.json"))
    for sname, k in stacks:
        for door in ("http", "nng"):
            clone = p50(k, door + "_template", "create_to_first_exec")
            cold = p50(k, door + "_cold", "create_to_first_exec")
            if clone is not None and cold is not None:
                bars.append(("%s, %s door" % (sname, door), clone, cold))
    s = results.get("snapshot.json")
    if isinstance(s, dict):
        clone = p50(s, "template_create_to_first_exec")
        cold = p50(s, "cold_boot_create_to_first_exec")
        if clone is not None and cold is not None:
            bars.append(("snapshot.json, vmd direct", clone, cold))
    if bars:
        fig, ax = plt.subplots(figsize=(8, 1.5 + 0.8 * len(bars)))
        ys = range(len(bars))
        ax.barh([y - 0.2 for y in ys], [b[2] for b in bars], height=0.4, label="cold boot")
        ax.barh([y + 0.2 for y in ys], [b[1] for b in bars], height=0.4, label="template clone")
        for y, b in zip(ys, bars):
            ax.text(b[1], y + 0.2, "  %.0f ms = %.3f x cold" % (b[1], b[1] / b[2]), va="center", fontsize=7)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([b[0] for b in bars], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("create -> first exec, p50 ms (goal: clone <= 0.08 x cold)")
        ax.legend(fontsize=7)
        ax.set_title("create vs cold boot")
        save(fig, out_dir, "create_vs_cold", made)
    if stacks:
        chart_create_phases(stacks, out_dir, made)


def create_stacks(c):
    """create.json's [(name, kinds)]: one per stack ({"stacks": {name:
    {"kinds": ...}}}), or the file's own "kinds"."""
    if not isinstance(c, dict):
        return []
    if isinstance(c.get("stacks"), dict):
        return [(n, v["kinds"]) for n, v in c["stacks"].items() if isinstance(v, dict) and isinstance(v.get("kinds"), dict)]
    if isinstance(c.get("kinds"), dict):
        return [("create.json", c["kinds"])]
    return []


def chart_create_phases(stacks, out_dir, made):
    """Stacked p50s of the node's phases per kind, then the gateway's and
    door's share and the first exec: clones and cold boots in panels of
    their own (linear scales)."""
    order = ["prepare", "admit", "disk", "vmm_spawn", "agent_connect", "qmp_wait", "ram_wait", "device_load", "resume", "reset", "boot_wait", "finish", "other", "gateway_and_door", "first_exec"]
    rows = [("%s %s" % (sname, n) if len(stacks) > 1 else n, kinds[n]) for sname, kinds in stacks for n in kinds if isinstance(kinds[n], dict)]
    if not rows:
        return
    groups = [[r for r in rows if "cold" not in r[0]], [r for r in rows if "cold" in r[0]]]
    groups = [g for g in groups if g]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 1.6 + 0.45 * len(rows) + 0.6 * len(groups)), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, group in zip(axes[:, 0], groups):
        for y, (_, kind) in enumerate(group):
            ph = kind.get("node_phases", {})
            left = 0.0
            for i, p in enumerate(order):
                v = p50(kind, p) if p in ("gateway_and_door", "first_exec") else p50(ph, p)
                if not v or v <= 0:
                    continue
                ax.barh(y, v, left=left, color=cmap(i % 20), label=p)
                left += v
            ax.text(left, y, " %.0f ms" % left, va="center", fontsize=7)
        ax.set_yticks(range(len(group)))
        ax.set_yticklabels([r[0] for r in group], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms (p50 of each phase, stacked)")
        ax.margins(x=0.12)
    handles, labels = [], []
    for ax in axes[:, 0]:
        h, l = ax.get_legend_handles_labels()
        handles += h
        labels += l
    seen = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    axes[0, 0].legend(seen.values(), seen.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[0, 0].set_title("where create -> first exec time goes (node phases, gateway + door, first exec)")
    save(fig, out_dir, "create_phases", made)


def chart_fork_scaling(results, out_dir, made):
    t = results.get("travel.json")
    if not isinstance(t, dict):
        return
    pts = []  # (copies, wall p50, host cpu p50)
    one = p50(t, "restore_one")
    cpu = t.get("host_cpu_p50_ms", {}) if isinstance(t.get("host_cpu_p50_ms"), dict) else {}
    if one is not None:
        pts.append((1, one, cpu.get("restore_one")))
    h = t.get("fork_host_cpus_copies")
    if isinstance(h, dict) and is_num(h.get("copies")) and p50(h, "wall") is not None:
        pts.append((h["copies"], p50(h, "wall"), h.get("host_cpu_p50_ms")))
    if is_num(t.get("fork_copies")) and p50(t, "fork") is not None:
        pts.append((t["fork_copies"], p50(t, "fork"), cpu.get("fork")))
    for r in t.get("fork_by_copies", []) if isinstance(t.get("fork_by_copies"), list) else []:
        if isinstance(r, dict) and is_num(r.get("copies")) and p50(r, "wall") is not None:
            pts.append((r["copies"], p50(r, "wall"), r.get("host_cpu_p50_ms")))
    pts = sorted({p[0]: p for p in pts}.values())
    if len(pts) < 2:
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    xs = [p[0] for p in pts]
    ax[0].plot(xs, [p[1] for p in pts], marker="o", label="fork wall p50")
    if one is not None:
        ax[0].axhline(one * 1.2, ls="--", color="grey", label="1.2 x one restore (goal)")
    ax[0].set_xlabel("copies")
    ax[0].set_ylabel("ms")
    ax[0].legend(fontsize=7)
    ax[0].set_title("fork scaling by copies")
    cp = [(p[0], p[2] / p[0]) for p in pts if is_num(p[2])]
    if cp:
        ax[1].bar([str(c[0]) for c in cp], [c[1] for c in cp])
        ax[1].set_xlabel("copies")
        ax[1].set_ylabel("host CPU ms per copy (p50)")
        ax[1].set_title("host CPU per fork copy")
    save(fig, out_dir, "fork_scaling", made)


def density_runs(modes):
    """moat-bench-density's shape ({"modes": {MODE: {"by_count": [{
    "sandboxes", "pss_mib_per_vmm", "memavailable_drop_mib_per_sandbox",
    "idle_cpu_pct_of_core_per_vmm", "creates_per_s"}, ...]}}}) as runs."""
    runs = []
    for mode, m in modes.items():
        rows = m.get("by_count") if isinstance(m, dict) else None
        for r in rows if isinstance(rows, list) else []:
            if not isinstance(r, dict):
                continue
            runs.append({
                "n": r.get("sandboxes"),
                "mode": mode,
                "pss_mib_per_vm": r.get("pss_mib_per_vmm"),
                "memavail_drop_mib_per_vm": r.get("memavailable_drop_mib_per_sandbox"),
                "idle_cpu_pct_per_vm": r.get("idle_cpu_pct_of_core_per_vmm"),
                "creates_per_s": r.get("creates_per_s"),
            })
    return runs


def chart_density(results, out_dir, made):
    d = results.get("density.json")
    if d is None:
        say("no density.json: the density chart is skipped")
        return
    runs = d.get("runs") if isinstance(d, dict) else None
    if runs is None and isinstance(d, dict) and isinstance(d.get("modes"), dict):
        runs = density_runs(d["modes"])
    if not isinstance(runs, list) or not runs:
        say("density.json has no \"runs\": the density chart is skipped")
        return
    modes = {}
    for r in runs:
        if isinstance(r, dict) and is_num(r.get("n")):
            modes.setdefault(str(r.get("mode", "")), []).append(r)
    if not modes:
        say("density.json: no run has a count \"n\": the density chart is skipped")
        return
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [
        (0, "pss_mib_per_vm", "PSS", "MiB per sandbox"),
        (0, "memavail_drop_mib_per_vm", "MemAvailable drop", "MiB per sandbox"),
        (1, "idle_cpu_pct_per_vm", "idle CPU", "% of a core per sandbox"),
        (2, "creates_per_s", "creates/s", "creates per second"),
    ]
    for mode, rs in sorted(modes.items()):
        rs = sorted(rs, key=lambda r: r["n"])
        for i, key, what, ylabel in panels:
            xy = [(r["n"], r[key]) for r in rs if is_num(r.get(key))]
            if xy:
                ax[i].plot([p[0] for p in xy], [p[1] for p in xy], marker="o", label=("%s %s" % (what, mode)).strip())
                ax[i].set_ylabel(ylabel)
    ax[0].axhline(64, ls="--", color="grey", label="goal: 25 % of 256 MiB")
    ax[1].axhline(0.5, ls="--", color="grey", label="goal: 0.5 %")
    ax[2].axhline(10, ls="--", color="grey", label="goal: 10/s")
    for a, title in zip(ax, ("memory per sandbox", "idle CPU per sandbox", "creates per second")):
        a.set_xlabel("sandboxes")
        a.set_title(title)
        a.legend(fontsize=6)
    save(fig, out_dir, "density", made)


def chart_load(results, out_dir, made):
    d = results.get("load.json")
    rows = d.get("over_time") if isinstance(d, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and is_num(r.get("t_s")) for r in rows):
        return
    t = [r["t_s"] for r in rows]
    fig, ax = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    if all(is_num(r.get("ok_per_s")) for r in rows):
        ax[0].plot(t, [r["ok_per_s"] for r in rows], marker=".")
    ax[0].set_ylabel("calls ok per s")
    for k in ("p50_ms", "p95_ms", "p99_ms"):
        if all(is_num(r.get(k)) for r in rows):
            ax[1].plot(t, [r[k] for r in rows], marker=".", label=k[:3])
    ax[1].set_yscale("log")
    ax[1].set_ylabel("latency, ms")
    ax[1].set_xlabel("s")
    ax[1].legend(fontsize=7)
    ax[0].set_title("load over time")
    save(fig, out_dir, "load_over_time", made)


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    args = list(argv[1:])
    out_dir = None
    if "--out" in args:
        i = args.index("--out")
        if i + 1 >= len(args):
            say("--out needs a directory")
            return 2
        out_dir = args[i + 1]
        del args[i : i + 2]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        say("usage: plot.py [RESULTS_DIR] [--out DIR]")
        return 2
    res_dir = args[0] if args else os.path.join(here, "results")
    out_dir = out_dir or os.path.join(res_dir, "plots")
    if not os.path.isdir(res_dir):
        say("%s is not a directory: give the folder of the results JSON" % res_dir)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    results, skipped, made = {}, 0, []
    for name in sorted(os.listdir(res_dir)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(res_dir, name)
        try:
            with open(path) as f:
                results[name] = json.load(f)
        except (OSError, ValueError) as e:
            say("%s: not readable JSON (%s): skipped" % (path, e))
            skipped += 1
    for name, data in results.items():
        stem = name[: -len(".json")]
        summaries, samples, series = [], [], []
        try:
            walk(data, "", summaries, samples, series)
            chart_summaries(stem, summaries, out_dir, made)
            chart_samples(stem, samples, out_dir, made)
            chart_series(stem, series, out_dir, made)
        except Exception as e:  # one odd file never stops the others
            plt.close("all")
            say("%s: cannot chart (%s: %s): skipped" % (name, type(e).__name__, e))
            skipped += 1
    for chart in (chart_create_vs_cold, chart_fork_scaling, chart_density, chart_load):
        try:
            chart(results, out_dir, made)
        except Exception as e:
            plt.close("all")
            say("%s: failed (%s: %s): skipped" % (chart.__name__, type(e).__name__, e))
            skipped += 1
    print("plot.py: %d charts in %s%s" % (len(made), out_dir, ", %d skipped" % skipped if skipped else ""))
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
