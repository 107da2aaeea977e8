#!/usr/bin/env bash
# Installs Debian's libibverbs1 when missing: Mooncake's extension (Transfer Engine and
# Store, bench-pool's peer rows) links it even over TCP.
set -euo pipefail
if ldconfig -p | grep -q 'libibverbs\.so\.1 '; then exit 0; fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq libibverbs1 >/dev/null
ldconfig -p | grep 'libibverbs\.so\.1 '
