#!/usr/bin/env bash
# Install what pycrid needs on a Debian machine (as root), then either start the
# daemon with its embedded defaults or run the whole test suite.
#   scripts/setup.sh serve [pycrid serve flags...]
#   scripts/setup.sh test  [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in
  serve|test) shift ;;
  *) echo "usage: $0 serve|test [args...]" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  echo "$0: run as root (pycrid mounts filesystems and runs containers)" >&2
  exit 1
fi

# System packages from Debian. The daemon needs runc, conmon, the CNI plugins and
# iptables (portmap's host ports), runsc (gVisor) for the "runsc" runtime handler
# (sandboxed pods), and CRIU for CheckpointContainer and restores (on kernels where
# Debian's CRIU fails `criu check`, such as Debian 12's 3.17 on kernel 6.x, a newer CRIU
# is needed: point criu_path at it; Debian's package still brings the libraries one
# built from source links against), and gpgv for GPG image signatures (signedBy in
# containers-policy.json); the tests also need a local registry and busybox to build
# images from, and GnuPG and Debian's skopeo to make GPG-signed images.
pkgs=(python3 python3-venv python3-dev gcc libc6-dev ca-certificates util-linux mount
      runc conmon criu containernetworking-plugins iproute2 iptables runsc gpgv)
if [ "$mode" = test ]; then
  pkgs+=(docker-registry busybox-static gnupg skopeo)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d keeps Debian from starting docker-registry's system service (it would
  # listen on every interface); the tests run their own registries on 127.0.0.1.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
  trap - EXIT
fi
if command -v systemctl >/dev/null && [ -d /run/systemd/system ] \
   && systemctl is-enabled docker-registry >/dev/null 2>&1; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# The Python environment: one virtualenv in the checkout, one protobuf major (6.x,
# pinned by the CRI stubs package) for everything in it.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# OpenTelemetry is installed too, so [tracing] endpoint can be turned on by config alone;
# it is imported only when it is.
extra="[tracing]"
[ "$mode" = test ] && extra="[test,tracing]"
stamp=".venv/.installed$extra"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e ".$extra"
  touch "$stamp"
fi

if [ "$mode" = serve ]; then
  # A pod network when the node has none: bridge + host-local + portmap on 10.88.0.0/16,
  # with no IP masquerade and no default route in pods, so pod traffic stays on this
  # host until the operator changes the file. (The tests bring their own networks.)
  scripts/default-cni.sh /etc/cni/net.d
  exec .venv/bin/pycrid serve "$@"
fi
exec scripts/test.sh "$@"
