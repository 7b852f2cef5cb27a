#!/usr/bin/env bash
# Install what building and testing aioprof needs on a fresh Debian machine (CI runs this
# from .ci/run). Idempotent; apt is asked only for packages that are missing.
#
#   tools/install-deps.sh              apt packages for `make test`, then `make deps-all`
#   tools/install-deps.sh --apt PKG..  only these apt packages (e.g. cppcheck for `make lint`)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

apt_install() { # install the packages among "$@" that are not installed yet
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "install-deps: apt-get install ${missing[*]}"
    local sudo=
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if [ "${1:-}" = "--apt" ]; then
    shift
    apt_install "$@"
    exit 0
fi

# gcc provides libasan/libubsan for `make asan`. libc6-dbg only improves valgrind's stacks.
apt_install make gcc libc6-dev valgrind
# debootstrap: the root file system of 3.14/3.15 (tools/python), set up by `make deps-all`.
apt_install debootstrap
# cppcheck: `make lint`, a step of `make test`.
apt_install cppcheck
apt_install libc6-dbg || echo "install-deps: libc6-dbg not installed (optional)" >&2
# tests/real/ starts its own PostgreSQL server (initdb + postgres from /usr/lib/postgresql/*/bin,
# in a temporary directory; the packaged cluster is not used).
apt_install postgresql
# tests/*/test_*pprof*.py read the pprof profiles back with `go tool pprof` (a real reader).
apt_install golang-go
# tests/real/test_prometheus.py starts its own Prometheus server (on 127.0.0.1, a temporary
# config and data directory; the packaged service is not used).
apt_install prometheus
# tests/integration/test_html.py opens the HTML report in headless Chromium, offline.
apt_install chromium
"${MAKE:-make}" --no-print-directory deps-all
