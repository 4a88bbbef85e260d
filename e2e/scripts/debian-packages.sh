#!/usr/bin/env bash
# Installs the Debian packages the tests run for real (a Prometheus server, promtool, an image
# builder...) when their command is missing, so `make test` works on a fresh machine.
#
# Usage: e2e/scripts/debian-packages.sh PACKAGE:COMMAND...
#   installs PACKAGE unless COMMAND is already on the PATH.
# Services a package would start on install are not started: the tests start their own.
set -euo pipefail

missing=()
for entry in "$@"; do
  pkg=${entry%%:*} cmd=${entry#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
(( ${#missing[@]} == 0 )) && exit 0

log() { printf '[debian-packages] %s\n' "$*" >&2; }
if [[ $(id -u) != 0 ]]; then
  log "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
  exit 1
fi

# policy-rc.d exit 101 tells invoke-rc.d not to start the services the packages ship.
policy=/usr/sbin/policy-rc.d
own_policy=false
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=true
fi
trap '$own_policy && rm -f "$policy"' EXIT

log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
  || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
