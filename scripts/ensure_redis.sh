#!/usr/bin/env bash
# Installs redis-server from the distribution when it is missing.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq redis-server >/dev/null
# The package starts a system instance; tests and benchmarks start their own.
$SUDO service redis-server stop >/dev/null 2>&1 || true
command -v redis-server
