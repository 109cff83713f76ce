#!/usr/bin/env bash
# Install pycrid's default pod network (contrib/cni/10-pycrid-net.conflist) into a CNI
# config directory that has no network config at all: no *.conf, *.conflist or *.json
# file (what pycrid and libcni read, dotfiles aside). A directory with any config, the
# node's own or an earlier copy of ours the operator may have edited, is left alone.
#   scripts/default-cni.sh [CONF_DIR]    (default /etc/cni/net.d)
set -euo pipefail

conf_dir=${1:-/etc/cni/net.d}
src="$(cd "$(dirname "$0")/.." && pwd)/contrib/cni/10-pycrid-net.conflist"

shopt -s nullglob
existing=("$conf_dir"/*.conf "$conf_dir"/*.conflist "$conf_dir"/*.json)
if [ ${#existing[@]} -gt 0 ]; then
  exit 0
fi
install -d -m 0755 "$conf_dir"
install -m 0644 "$src" "$conf_dir/"
echo "installed the default pod network: $conf_dir/10-pycrid-net.conflist"
