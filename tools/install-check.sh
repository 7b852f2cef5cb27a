#!/usr/bin/env bash
# Usage: tools/install-check.sh [PYTHON]
# Check that `pip install .` works with and without build isolation: install into a
# throwaway --target directory and import the installed package from there.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
tmp=$(mktemp -d /tmp/aioprof-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

check() { # NAME PIP-ARGS...
    local name=$1
    shift
    rm -rf "$tmp/site"
    "$py" -m pip install --quiet --no-deps --target "$tmp/site" "$@" .
    # From /tmp, with PYTHONPATH only the target: the repo's src/ must not be what is imported.
    (cd "$tmp" && PYTHONPATH="$tmp/site" "$py" -c '
import sys, aioprof, aioprof._core as c
assert c.__file__.startswith(sys.argv[1]), c.__file__
from aioprof.report import html   # its template is package data: it must be installed
assert html.__file__.startswith(sys.argv[1]) and "aioprof-data" in html.render({"aioprof": 1})
print("  imported", c.__file__)' "$tmp/site" && PYTHONPATH="$tmp/site" "$py" -m aioprof --help >/dev/null)
    echo "install-check: $name: ok"
}

"$py" -m pip install --quiet "setuptools>=61" wheel
check "pip install ." 
check "pip install --no-build-isolation ." --no-build-isolation
