#!/usr/bin/env python3
"""openapi_checks.py DOC GATEWAY_PROTO: the proto3 JSON shapes of the
gateway's OpenAPI document DOC, read from the .proto files next to
GATEWAY_PROTO: every map<K, V> field is an object with
additionalProperties, every 64-bit integer field a string with format
int64 or uint64, every bytes field a string with format byte, and the
operation ids are unique. Not for: validating OpenAPI itself (the npm
validator does). Exit 1 naming each failure."""
import json
import os
import re
import sys

doc = json.load(open(sys.argv[1]))
proto_dir = os.path.dirname(os.path.abspath(sys.argv[2]))
schemas = doc["components"]["schemas"]
failed = []


def camel(name):
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


# field -> (message, kind) for the top-level messages of every .proto
# (nested messages are rare here and the regex would need a parser).
checked = {"map": 0, "int64": 0, "bytes": 0}
for fname in sorted(os.listdir(proto_dir)):
    if not fname.endswith(".proto"):
        continue
    text = open(os.path.join(proto_dir, fname)).read()
    pkg = re.search(r"^package\s+([\w.]+);", text, re.M).group(1)
    for m in re.finditer(r"^message\s+(\w+)\s*\{([^\n]*?\}|.*?^\})", text, re.M | re.S):
        name, body = pkg + "." + m.group(1), m.group(2)
        schema = schemas.get(name)
        if schema is None:  # used by no Gateway method
            continue
        props = schema.get("properties", {})
        for f in re.finditer(
                r"^\s*(repeated\s+|optional\s+)?(map<[^>]*>|[\w.]+)\s+(\w+)\s*=\s*\d+",
                body, re.M):
            typ, field = f.group(2), camel(f.group(3))
            p = props.get(field)
            if p is None:
                failed.append("%s.%s is missing" % (name, field))
                continue
            if f.group(1) and f.group(1).strip() == "repeated":
                p = p.get("items", {})
            if typ.startswith("map<"):
                checked["map"] += 1
                if p.get("type") != "object" or "additionalProperties" not in p:
                    failed.append("%s.%s (%s) is not an object with "
                                  "additionalProperties: %s" % (name, field, typ, p))
            elif typ in ("int64", "sint64", "sfixed64", "uint64", "fixed64"):
                checked["int64"] += 1
                want = "uint64" if typ in ("uint64", "fixed64") else "int64"
                if p.get("type") != "string" or p.get("format") != want:
                    failed.append("%s.%s (%s) is not a string of format %s: %s"
                                  % (name, field, typ, want, p))
            elif typ == "bytes":
                checked["bytes"] += 1
                if p.get("type") != "string" or p.get("format") != "byte":
                    failed.append("%s.%s (bytes) is not a base64 string: %s"
                                  % (name, field, p))

for kind, n in checked.items():
    if n == 0:
        failed.append("no %s field checked: is the document's schema "
                      "naming still package.Message?" % kind)

ids = [op["operationId"] for item in doc["paths"].values()
       for op in item.values() if isinstance(op, dict) and "operationId" in op]
nops = sum(1 for item in doc["paths"].values() for op in item.values())
dup = sorted({i for i in ids if ids.count(i) > 1})
if dup:
    failed.append("operation ids used twice: %s" % dup)
if len(ids) != nops:
    failed.append("%d of %d operations have no operationId" % (nops - len(ids), nops))

for f in failed:
    print("FAIL - " + f)
if not failed:
    print("ok - %d maps are objects, %d 64-bit integers strings, %d bytes "
          "base64; %d operation ids, unique" % (checked["map"], checked["int64"],
                                                checked["bytes"], len(ids)))
sys.exit(1 if failed else 0)
