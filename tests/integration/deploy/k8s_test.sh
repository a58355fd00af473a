#!/usr/bin/env bash
# deploy_k8s: every Kubernetes manifest of deploy/k8s validates against
# the Kubernetes schemas (npm kubernetes-models, k8s_validate.mjs: types,
# required fields, and no field the API does not know), the Nomad job
# files of deploy/nomad parse as HCL (npm @cdktf/hcl2json, HashiCorp's
# own parser), and both say what moat's cluster needs
# (k8s_moat_checks.py). The npm packages of package.json are installed
# once into the shared npm cache (tests/integration/npm_setup.sh, as the
# MCP test does). Exit 77, saying why, when node or npm is missing or the
# registry cannot be reached.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}

command -v node >/dev/null ||
	{ echo "SKIP - node is not installed: run deploy/install-deps.sh (Debian nodejs)"; exit 77; }
python3 -c 'import yaml' 2>/dev/null ||
	{ echo "SKIP - python3-yaml is not installed: run deploy/install-deps.sh"; exit 77; }
mods=$(bash "$repo/tests/integration/npm_setup.sh" "$here/package.json")
rc=$?
case $rc in
0) ;;
2 | 3) echo "SKIP - the validators (kubernetes-models, @cdktf/hcl2json) could not be installed (see above)"; exit 77 ;;
*) echo "FAIL - npm_setup.sh failed (exit $rc; see above)"; exit 1 ;;
esac

work=$(mktemp -d /tmp/moat-k8s-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The validator resolves its packages next to the script it runs.
cp "$here/k8s_validate.mjs" "$work/"
ln -s "$mods/node_modules" "$work/node_modules"
shopt -s nullglob
k8s=("$repo"/deploy/k8s/*.yaml)
hcl=("$repo"/deploy/nomad/*.hcl)
[ ${#k8s[@]} -gt 0 ] && [ ${#hcl[@]} -gt 0 ] ||
	{ echo "FAIL - no manifests in deploy/k8s or no job files in deploy/nomad"; exit 1; }
rc=0
(cd "$work" && node k8s_validate.mjs --k8s "${k8s[@]}" --hcl "${hcl[@]}") || rc=1
python3 "$here/k8s_moat_checks.py" "$repo" "$work" || rc=1
[ $rc -eq 0 ] && echo "all deploy/k8s and deploy/nomad checks passed"
exit $rc
