#!/usr/bin/env bash
# Installs the npm packages of package.json (the MCP TypeScript SDK) once
# into a cache directory keyed by the hash of package.json, and prints
# that directory (its node_modules is ready). The cache is
# $MOAT_NPM_CACHE, else /var/cache/moat/npm when writable, else
# ~/.cache/moat/npm. Fails, saying why, when npm cannot install (no
# network): the MCP test must not pass without its client.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v npm >/dev/null ||
	{ echo "npm_setup: npm is not installed: run deploy/install-deps.sh (Debian nodejs and npm)" >&2; exit 1; }
base=${MOAT_NPM_CACHE:-}
if [ -z "$base" ]; then
	if mkdir -p /var/cache/moat/npm 2>/dev/null && [ -w /var/cache/moat/npm ]; then
		base=/var/cache/moat/npm
	else
		base=${XDG_CACHE_HOME:-$HOME/.cache}/moat/npm
	fi
fi
key=$(sha256sum "$here/package.json" | cut -c1-16)
dir=$base/$key
if [ -f "$dir/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
	echo "$dir"
	exit 0
fi
mkdir -p "$base"
tmp=$(mktemp -d "$base/.install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$here/package.json" "$tmp/"
if ! (cd "$tmp" && timeout 600 npm install --no-audit --no-fund --loglevel=error >&2); then
	echo "npm_setup: npm install of $here/package.json failed (no network, or the registry refused): the MCP test needs @modelcontextprotocol/sdk; install it once with network access, or point MOAT_NPM_CACHE at a directory that has it" >&2
	exit 1
fi
# Another run may have finished first: keep whichever is in place.
mv -T "$tmp" "$dir" 2>/dev/null || true
[ -f "$dir/node_modules/@modelcontextprotocol/sdk/package.json" ] ||
	{ echo "npm_setup: $dir has no @modelcontextprotocol/sdk after install" >&2; exit 1; }
echo "$dir"
