#!/usr/bin/env bash
# The SDK installs as a Debian 12 machine with no PyPI access would
# install it: a venv that sees the system's setuptools and wheel
# (python3-setuptools, python3-wheel: deploy/install-deps.sh), then
# `pip install --no-build-isolation --no-index -e clients/python`, then
# `import moat` from outside the source tree must find the editable
# install. Not for: testing the SDK itself (tests/test_unit.py).
set -euo pipefail

PYTHON=${PYTHON:-python3}
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/moat-pip-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

"$PYTHON" -m venv --system-site-packages "$tmp/venv" || {
	echo "pip_install_test: $PYTHON -m venv failed: install python3-venv" \
	    "(deploy/install-deps.sh)" >&2
	exit 1
}
"$tmp/venv/bin/python" -c 'import setuptools, wheel' 2>/dev/null || {
	echo "pip_install_test: $PYTHON has no setuptools or wheel to build" \
	    "with offline: install python3-setuptools python3-wheel" \
	    "(deploy/install-deps.sh)" >&2
	exit 1
}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
unset PYTHONPATH
"$tmp/venv/bin/python" -m pip install -q --no-build-isolation --no-index \
	-e "$src"
cd "$tmp"
"$tmp/venv/bin/python" - "$src" <<'PY'
import os, sys
src = os.path.realpath(sys.argv[1])
import moat
where = os.path.realpath(moat.__file__)
if not where.startswith(src + os.sep):
    sys.exit("pip_install_test: moat came from %s, not the editable "
             "install of %s" % (where, src))
import moat.integrations
print("pip_install_test: moat %s from %s" % (
    getattr(moat, "__version__", "?"), where))
PY
"$tmp/venv/bin/python" -m pip uninstall -q -y moat
