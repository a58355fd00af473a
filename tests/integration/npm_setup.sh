#!/usr/bin/env bash
# Installs the npm packages a test's package.json names, once, into a
# cache directory keyed by the hash of that package.json, and prints that
# directory (its node_modules is ready). Used by the MCP test (the MCP
# TypeScript SDK) and the deploy tests (kubernetes-models, an HCL parser).
#   npm_setup.sh PACKAGE_JSON
# The cache is $MOAT_NPM_CACHE, else /var/cache/moat/npm when writable,
# else ~/.cache/moat/npm. Exit status, with the reason on stderr: 0 ready;
# 3 npm is not installed; 2 npm install failed (no network, or the
# registry refused); 1 anything else. Each caller decides whether that
# fails its test or skips it.
set -euo pipefail
pkg=${1:-}
[ -n "$pkg" ] && [ -f "$pkg" ] ||
	{ echo "npm_setup: name the package.json to install (got '${pkg}')" >&2; exit 1; }
pkg=$(cd "$(dirname "$pkg")" && pwd)/$(basename "$pkg")
command -v npm >/dev/null ||
	{ echo "npm_setup: npm is not installed: run deploy/install-deps.sh (Debian nodejs and npm)" >&2; exit 3; }
command -v node >/dev/null ||
	{ echo "npm_setup: node is not installed: run deploy/install-deps.sh (Debian nodejs)" >&2; exit 3; }
base=${MOAT_NPM_CACHE:-}
if [ -z "$base" ]; then
	if mkdir -p /var/cache/moat/npm 2>/dev/null && [ -w /var/cache/moat/npm ]; then
		base=/var/cache/moat/npm
	else
		base=${XDG_CACHE_HOME:-$HOME/.cache}/moat/npm
	fi
fi
key=$(sha256sum "$pkg" | cut -c1-16)
dir=$base/$key
# missing DIR: the dependencies of package.json not installed under DIR.
missing() {
	node -e '
		const fs = require("fs"), path = require("path");
		const p = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
		const gone = Object.keys(p.dependencies || {}).filter((d) =>
			!fs.existsSync(path.join(process.argv[2], "node_modules", d, "package.json")));
		console.log(gone.join(" "));' "$pkg" "$1"
}
if [ -d "$dir/node_modules" ] && [ -z "$(missing "$dir")" ]; then
	echo "$dir"
	exit 0
fi
mkdir -p "$base"
tmp=$(mktemp -d "$base/.install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$pkg" "$tmp/package.json"
if ! (cd "$tmp" && timeout 600 npm install --no-audit --no-fund --loglevel=error >&2); then
	echo "npm_setup: npm install of $pkg failed (no network, or the registry refused): it needs $(missing "$tmp"); install it once with network access, or point MOAT_NPM_CACHE at a directory that has it" >&2
	exit 2
fi
# Another run may have finished first: keep whichever is in place.
mv -T "$tmp" "$dir" 2>/dev/null || true
gone=$(missing "$dir")
[ -z "$gone" ] || { echo "npm_setup: $dir lacks $gone after install" >&2; exit 1; }
echo "$dir"
