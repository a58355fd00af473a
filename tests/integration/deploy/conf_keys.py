#!/usr/bin/env python3
"""deploy_conf: every setting the C sources read must be documented in
deploy/moat.conf.example, under its section, so the example cannot rot.

A setting is read (1) by moat_config_get / _get_u64 / _get_bool with a
string-literal key, (2) through a wrapper listed in WRAPPERS (a function
or macro that passes its argument on as the key), or (3) as an option of
a service's command line (a `struct option` table holding
MOAT_SERVICE_OPTIONS_FIRST or given to moat_config_from_args): each such
option is also the key of that service's section. A call whose key is
not a literal must sit in a wrapper or in DYNAMIC (keys made at run time,
such as refuse.<tenant>), or this test fails naming it: say there which
keys it reads. A call whose section is not a literal or a #define reads
a key that must appear in some section.

In the example a key is documented by a line `key = value` or
`#key = value` under `[section]`. Usage: conf_keys.py REPO
"""
import os
import re
import sys

GETTERS = ("moat_config_get", "moat_config_get_u64", "moat_config_get_bool")
# name -> (index of the section argument or None: the file's SECTION,
#          index of the key argument)
WRAPPERS = {
    "moat_service_url": (1, 2),  # lib/service.c
    "cfg_str": (None, 1),  # services/vm/main.c
    "U64": (None, 0),  # services/vm/main.c, a macro
    "moat_config_get_u64_for": (1, 2),  # lib/config.c: KEY.<tenant>
    "limit": (None, 1),  # gateway/admission.c: [tenants] KEY.<tenant>
}
# Functions whose getter calls take a key made at run time, and what
# they read (documented in the example by its pattern, or not at all).
DYNAMIC = {
    ("lib/config.c", "moat_config_get_u64"): "the implementation",
    ("lib/config.c", "moat_config_get_bool"): "the implementation",
    ("lib/service.c", "moat_service_url"): "WRAPPERS",
    ("services/vm/main.c", "cfg_str"): "WRAPPERS",
    ("services/vm/main.c", "vmd_configure_limits"): "the U64 macro",
    ("services/vm/main.c", "vmd_configure_bounds"): "the U64 macro",
    ("services/vm/main.c", "vmd_configure_jail"): "the keys table",
    ("lib/config.c", "moat_config_get_u64_for"):
        "the implementation (its callers' keys, also as KEY.<tenant>)",
    ("gateway/main.c", "retention_config"):
        "[gateway] retention-keep-last/-keep-age-s (its options)",
    ("gateway/auth.c", "moat_policy_refuses"): "[policy] refuse.<tenant>",
    ("gateway/admission.c", "limit"):
        "[tenants] max-* and key-* (WRAPPERS: limit)",
    ("gateway/admission.c", "quota_locked"):
        "[tenants] max-sandboxes, max-vcpus, max-memory-mib (a table)",
    ("gateway/admission.c", "moat_admission_limits"):
        "[tenants] max-sandboxes, max-vcpus, max-memory-mib (a table)",
}
NOT_KEYS = {"config", "help", "version"}
SKIP_DIRS = {".git", "tests", "build", "images", "node_modules"}


def split_args(text, start):
    """The top-level arguments of the call whose '(' is at text[start]."""
    depth, args, cur, i = 0, [], [], start
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return args


def literal(arg, defines):
    arg = re.sub(r"\s+", " ", arg.strip())
    m = re.fullmatch(r'"([^"\\]*)"', arg)
    if m:
        return m.group(1)
    return defines.get(arg)


def enclosing_function(text, pos):
    """The function (BSD style: name at the start of a line) around pos."""
    name = None
    for m in re.finditer(r"^([A-Za-z_]\w*)\(", text[:pos], re.M):
        name = m.group(1)
    return name


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*",
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def scan_file(rel, text, found, problems):
    text = strip_comments(text)
    defines = {m.group(1): m.group(2) for m in
               re.finditer(r'^#define\s+(\w+)\s+"([^"]*)"', text, re.M)}
    file_section = defines.get("SECTION")
    names = GETTERS + tuple(WRAPPERS)
    for m in re.finditer(r"\b(%s)\s*\(" % "|".join(names), text):
        name = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        # A definition or prototype (return type before it on the line,
        # or parameter declarations) is not a call.
        before = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        args = split_args(text, m.end() - 1)
        if re.match(r"^\s*$", before) is None and re.search(
                r"\b(int|char|void|bool|const)\b[\s*]*$", before):
            continue
        if re.match(r"^$", before) and re.search(r"\bconst\s+struct\b|\bconst char \*", " ".join(args)):
            continue  # a BSD-style definition: name at column 0
        if before.strip().startswith("#define"):
            continue
        if name in GETTERS:
            sec_i, key_i = 1, 2
        else:
            sec_i, key_i = WRAPPERS[name]
        if len(args) <= key_i:
            continue
        key = literal(args[key_i], defines)
        if sec_i is None:
            section = file_section
        else:
            section = literal(args[sec_i], defines)
        if key is None:
            fn = enclosing_function(text, m.start())
            if (rel, fn) not in DYNAMIC:
                problems.append(
                    "%s:%d: %s(...) in %s() reads a key that is not a string "
                    "literal: add the function to WRAPPERS or DYNAMIC in %s "
                    "with the keys it reads, and document them in "
                    "deploy/moat.conf.example" % (rel, line, name, fn,
                                                 os.path.basename(__file__)))
            continue
        found.setdefault((section, key), "%s:%d" % (rel, line))
    # Option tables of service command lines: their options are keys.
    for m in re.finditer(r"struct option\s+(\w+)\s*\[\s*\]\s*=\s*\{", text):
        body_end = text.find("};", m.end())
        body = text[m.end():body_end]
        table = m.group(1)
        is_service = "MOAT_SERVICE_OPTIONS_FIRST" in body or re.search(
            r"moat_config_from_args\s*\([^;]*\b%s\b" % table, text)
        if not is_service:
            continue
        line = text.count("\n", 0, m.start()) + 1
        opts = re.findall(r'\{\s*"([^"]+)"\s*,', body)
        if "MOAT_SERVICE_OPTIONS_FIRST" in body:
            opts += ["state-dir", "listen"]
        for o in opts:
            if o not in NOT_KEYS:
                found.setdefault((file_section, o),
                                 "%s:%d (option)" % (rel, line))


def read_example(path):
    keys, section = {}, None
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            s = raw.strip()
            m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", s)
            if m:
                section = m.group(1)
                continue
            m = re.fullmatch(r"#?\s*([a-z0-9][a-z0-9._<>-]*)\s*=.*", s)
            if m and section:
                keys.setdefault(section, set()).add(m.group(1))
    return keys


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    found, problems = {}, []
    for top, dirs, files in os.walk(repo):
        rel_top = os.path.relpath(top, repo)
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS
                   and not d.startswith("build")]
        for fn in files:
            if fn.endswith((".c", ".h")):
                path = os.path.join(top, fn)
                rel = os.path.normpath(os.path.join(rel_top, fn))
                with open(path, errors="replace") as f:
                    scan_file(rel, f.read(), found, problems)
    example = read_example(os.path.join(repo, "deploy/moat.conf.example"))
    anywhere = set().union(*example.values()) if example else set()
    missing = []
    for (section, key), where in sorted(found.items(),
                                        key=lambda x: (x[0][0] or "", x[0][1])):
        if section is None:
            ok = key in anywhere
            label = "%s (any section)" % key
        else:
            ok = key in example.get(section, set())
            label = "[%s] %s" % (section, key)
        if ok:
            print("ok - %s documented (read at %s)" % (label, where))
        else:
            missing.append("%s, read at %s" % (label, where))
    for p in problems:
        print("FAIL - " + p)
    for m in missing:
        print("FAIL - not in deploy/moat.conf.example: " + m +
              ": add it (commented out with its default) under its section")
    if not found:
        print("FAIL - no setting found in the sources: is REPO right?")
        return 1
    print("%d settings read in the sources, %d missing from the example"
          % (len(found), len(missing)))
    return 1 if missing or problems else 0


if __name__ == "__main__":
    sys.exit(main())
