#!/usr/bin/env python3
"""deploy_grafana: deploy/grafana/moat.json is a dashboard Grafana can
import, and it shows only metrics that exist. Offline (ctest
deploy_grafana, no stack): the file parses as JSON; it has a row per
service (vmd, sessiond, snapd, gateway) and panels with gridPos, a
datasource and at least one PromQL target each; every metric its
queries name is listed in README (whose list metrics_test.py checks
against real scrapes). metrics_test.py calls names_missing() with what
the running stack served, so every metric the dashboard names exists in
a scrape. Usage: grafana_check.py REPO
"""
import json
import os
import re
import sys

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
ROWS = ("vmd", "sessiond", "snapd", "gateway")


def dashboard_path(repo=None):
    repo = repo or os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    return os.path.join(repo, "deploy", "grafana", "moat.json")


def metric_names(dash):
    """Every moat_* metric the dashboard's queries name, histogram
    suffixes included as written."""
    names = set()
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            names |= set(re.findall(r"\bmoat_[a-z0-9_]+", t.get("expr", "")))
    return names


def names_missing(served, path=None):
    """Names the dashboard uses that are not among the `served` metric
    families (a histogram's _bucket, _sum, _count count as served when
    the histogram is)."""
    with open(path or dashboard_path()) as f:
        dash = json.load(f)
    missing = []
    for n in sorted(metric_names(dash)):
        base = n
        for s in HISTOGRAM_SUFFIXES:
            if n.endswith(s) and n[:-len(s)] in served:
                base = n[:-len(s)]
        if base not in served:
            missing.append(n)
    return missing


def check_offline(repo):
    errors = []
    with open(dashboard_path(repo)) as f:
        dash = json.load(f)  # a syntax error fails here, with its line
    panels = dash.get("panels")
    if not isinstance(panels, list) or not panels:
        return ["no panels"]
    if not dash.get("title") or not dash.get("uid"):
        errors.append("the dashboard needs a title and a uid")
    rows = [p.get("title", "") for p in panels if p.get("type") == "row"]
    for svc in ROWS:
        if not any(svc in r for r in rows):
            errors.append(f"no row of panels for {svc} (rows: {rows})")
    ids = [p.get("id") for p in panels]
    if len(ids) != len(set(ids)):
        errors.append("panel ids repeat")
    for p in panels:
        if "gridPos" not in p:
            errors.append(f"panel {p.get('title')!r} has no gridPos")
        if p.get("type") == "row":
            continue
        if not p.get("targets") or not all(
                t.get("expr") for t in p["targets"]):
            errors.append(f"panel {p.get('title')!r} has no query")
        if not p.get("datasource"):
            errors.append(f"panel {p.get('title')!r} has no datasource")
    with open(os.path.join(repo, "README.md")) as f:
        listed = set(re.findall(r"`(moat_[a-z0-9_]+)`", f.read()))
    for n in sorted(metric_names(dash)):
        base = n
        for s in HISTOGRAM_SUFFIXES:
            if n.endswith(s) and n[:-len(s)] in listed:
                base = n[:-len(s)]
        if base not in listed:
            errors.append(f"{n} is not in README's list of metrics")
    return errors


if __name__ == "__main__":
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    errs = check_offline(repo)
    for e in errs:
        print("FAIL -", e)
    print("deploy/grafana/moat.json:",
          "ok" if not errs else f"{len(errs)} problems")
    sys.exit(1 if errs else 0)
