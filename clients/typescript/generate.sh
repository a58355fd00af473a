#!/usr/bin/env bash
# Generates the TypeScript protobuf code of proto/*.proto into gen/ (or
# OUT_DIR) with @bufbuild/protoc-gen-es, run as a plugin of protoc. The
# generated code is never committed (gen/ is gitignored): `npm run build`
# and the test (tests/integration/typescript) run this first. Not for:
# compiling the SDK (tsc does, see package.json's "build").
#   generate.sh [OUT_DIR]
# The plugin is found in $MOAT_TS_NODE_MODULES, else ./node_modules
# (npm install here). The compiler is protoc (Debian protobuf-compiler);
# Debian's protoc-c is the same front end but built without plugin
# support, so it cannot run protoc-gen-es. Where protoc is missing,
# Debian's python3-grpc-tools (its grpc_tools.protoc) is used instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto=$(cd "$here/../../proto" && pwd)
out=${1:-$here/gen}
modules=${MOAT_TS_NODE_MODULES:-$here/node_modules}

plugin=$modules/.bin/protoc-gen-es
if [ ! -x "$plugin" ]; then
	echo "generate.sh: no protoc-gen-es at $plugin: run 'npm install' in $here (or set MOAT_TS_NODE_MODULES to a node_modules that has @bufbuild/protoc-gen-es)" >&2
	exit 1
fi
command -v node >/dev/null ||
	{ echo "generate.sh: node is not installed (protoc-gen-es runs on it): run deploy/install-deps.sh" >&2; exit 1; }

# protoc_cmd: the protoc to run, as words in the array `protoc`.
if command -v protoc >/dev/null; then
	protoc=(protoc)
elif /usr/bin/python3 -c 'import grpc_tools.protoc' 2>/dev/null; then
	protoc=(/usr/bin/python3 -m grpc_tools.protoc)
else
	echo "generate.sh: no protoc with plugin support: install Debian's protobuf-compiler (deploy/install-deps.sh does); protoc-c cannot run plugins" >&2
	exit 1
fi

# A fresh directory each time: a proto file removed must not leave its
# old generated module behind.
rm -rf "$out"
mkdir -p "$out"
# target=ts: TypeScript that tsc compiles with the SDK; .js import
# suffixes, as Node's ES module resolution (NodeNext) needs them.
"${protoc[@]}" --plugin=protoc-gen-es="$plugin" \
	--es_out="$out" --es_opt=target=ts,import_extension=js \
	-I "$proto" "$proto"/*.proto
echo "generate.sh: $(ls "$out" | wc -l) files in $out"
