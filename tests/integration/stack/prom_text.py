#!/usr/bin/env python3
"""prom_text: a strict parser of the Prometheus text format 0.0.4, for
the metrics tests (metrics_test.py, grafana_check.py). It refuses what a
Prometheus server would refuse and a few things it would only frown on:
a sample before its family's TYPE, a family's HELP or TYPE twice,
samples of one family split by another, bad names, bad label escapes,
histogram buckets that are not cumulative or whose +Inf bucket differs
from _count. Not for: OpenMetrics (exemplars, # EOF).

    families = parse(text)   # {name: Family}
    families[name].samples   # [(sample_name, {label: value}, float)]
"""
import math
import re
import urllib.request

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*$")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


class FormatError(Exception):
    pass


class Family:
    def __init__(self, name):
        self.name = name
        self.help = None
        self.type = None
        self.samples = []

    def value(self, suffix="", **labels):
        """The sample name+suffix whose labels include `labels`; None
        when there is none."""
        for name, ls, v in self.samples:
            if name == self.name + suffix and all(
                    ls.get(k) == val for k, val in labels.items()):
                return v
        return None

    def total(self, suffix="", **labels):
        """Every sample name+suffix whose labels include `labels`,
        added up."""
        return sum(v for name, ls, v in self.samples
                   if name == self.name + suffix and all(
                       ls.get(k) == val for k, val in labels.items()))


def _unescape(text, what):
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text):
                raise FormatError(f"{what}: a lone backslash")
            n = text[i + 1]
            out.append({"\\": "\\", '"': '"', "n": "\n"}.get(n))
            if out[-1] is None:
                raise FormatError(f"{what}: bad escape \\{n}")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _labels(text, line):
    """`a="x",b="y"` (what is inside the braces) into a dict."""
    labels, i = {}, 0
    while i < len(text):
        m = re.match(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"", text[i:])
        if not m:
            raise FormatError(f"bad label at {text[i:]!r} in {line!r}")
        name = m.group(1)
        i += m.end()
        j = i
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        if j >= len(text):
            raise FormatError(f"unterminated label value in {line!r}")
        if name in labels:
            raise FormatError(f"label {name} twice in {line!r}")
        labels[name] = _unescape(text[i:j], line)
        i = j + 1
        m = re.match(r"\s*,?\s*", text[i:])
        i += m.end()
    return labels


def _number(text, line):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise FormatError(f"bad value {text!r} in {line!r}") from None


def _family_of(sample, families):
    for suffix in ("_bucket", "_sum", "_count"):
        if sample.endswith(suffix):
            base = sample[:-len(suffix)]
            f = families.get(base)
            if f is not None and f.type in ("histogram", "summary"):
                return f
    return families.get(sample)


def parse(text):
    if text and not text.endswith("\n"):
        raise FormatError("the text does not end with a newline")
    families, order, current = {}, [], None
    for line in text.split("\n"):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    raise FormatError(f"bad metric name in {line!r}")
                f = families.get(name)
                if f is None:
                    f = families[name] = Family(name)
                    order.append(name)
                elif f.samples:
                    raise FormatError(f"{parts[1]} of {name} after its "
                                      "samples")
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    if f.help is not None:
                        raise FormatError(f"HELP of {name} twice")
                    f.help = _unescape(rest, line)
                else:
                    if f.type is not None:
                        raise FormatError(f"TYPE of {name} twice")
                    if rest not in TYPES:
                        raise FormatError(f"bad type in {line!r}")
                    f.type = rest
                current = f
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)"
                     r"(\s+-?\d+)?$", line)
        if not m:
            raise FormatError(f"bad sample line {line!r}")
        name, labels = m.group(1), _labels(m.group(3) or "", line)
        f = _family_of(name, families)
        if f is None:
            f = families[name] = Family(name)
            f.type = "untyped"
            order.append(name)
        elif f is not current and f.samples:
            raise FormatError(f"samples of {f.name} are split by another "
                              f"family at {line!r}")
        if f.type is None:
            raise FormatError(f"sample {line!r} before the TYPE of "
                              f"{f.name}")
        current = f
        f.samples.append((name, labels, _number(m.group(4), line)))
    for f in families.values():
        if f.type == "histogram":
            _check_histogram(f)
    return families


def _check_histogram(f):
    series = {}
    for name, labels, v in f.samples:
        key = tuple(sorted((k, val) for k, val in labels.items()
                           if k != "le"))
        s = series.setdefault(key, {"buckets": [], "count": None,
                                    "sum": None})
        if name == f.name + "_bucket":
            if "le" not in labels:
                raise FormatError(f"{f.name}: a bucket without le")
            s["buckets"].append((_number(labels["le"], name), v))
        elif name == f.name + "_count":
            s["count"] = v
        elif name == f.name + "_sum":
            s["sum"] = v
        else:
            raise FormatError(f"{f.name}: stray sample {name}")
    for key, s in series.items():
        b = s["buckets"]
        if not b or b[-1][0] != math.inf:
            raise FormatError(f"{f.name}{dict(key)}: no +Inf bucket last")
        if [le for le, _ in b] != sorted(le for le, _ in b):
            raise FormatError(f"{f.name}{dict(key)}: buckets out of order")
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            raise FormatError(f"{f.name}{dict(key)}: buckets not "
                              "cumulative")
        if s["count"] is None or s["sum"] is None:
            raise FormatError(f"{f.name}{dict(key)}: no _count or _sum")
        if s["count"] != b[-1][1]:
            raise FormatError(f"{f.name}{dict(key)}: _count {s['count']} "
                              f"!= +Inf bucket {b[-1][1]}")


def scrape(url, timeout=10):
    """GET url; (families, content type)."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        ctype = r.headers.get("Content-Type", "")
        return parse(r.read().decode("utf-8")), ctype


if __name__ == "__main__":
    import sys
    fams = parse(sys.stdin.read())
    for n, f in fams.items():
        print(n, f.type, len(f.samples))
