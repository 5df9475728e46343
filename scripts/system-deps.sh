#!/usr/bin/env bash
# Installs the system programs the test suite drives for real (redis-server, chromium,
# promtool from Debian's `prometheus` package, which also brings a Prometheus server unit
# that the tests never use) when they are missing and we may install them; tests that
# need them start their own.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
((${#missing[@]} == 0)) && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "system-deps: please install: ${missing[*]} (apt-get install -y ${missing[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
