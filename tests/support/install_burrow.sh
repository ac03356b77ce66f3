#!/bin/sh
# Installs what tests/integration/test_burrow.py runs beside a Krill node: LinkedIn's Burrow
# (Debian's `burrow`, 1.2.1, which asks ListOffsets v0; its binary is /usr/bin/Burrow) and the
# ZooKeeper it coordinates through (Debian's `zookeeper`, run from /usr/share/java/zookeeper.jar).
# Idempotent: installs only what is missing, quietly and without questions; prints apt's
# output only if it fails. Needs root (or sudo) and the Debian package registry.
set -eu

missing=""
command -v Burrow >/dev/null 2>&1 || missing="$missing burrow"
[ -f /usr/share/java/zookeeper.jar ] || missing="$missing zookeeper"
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
# A fresh image may have no package lists, an old one stale lists: refresh them first.
# shellcheck disable=SC2086  # $missing is a list of package names
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends $missing; } \
    >"$log" 2>&1; then
    cat "$log" >&2
    echo "install_burrow.sh: could not install:$missing" >&2
    exit 1
fi
