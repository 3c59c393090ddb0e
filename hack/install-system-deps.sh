#!/usr/bin/env bash
# Install the Debian packages the tests and the demo use, when they are missing:
#   redis-server                  started on 127.0.0.1 by the tests (its packaged service is not used)
#   prometheus                    for promtool only: the server is built from Go modules (build-platform.sh)
#   containerd, runc, CNI plugins, iptables, conntrack, socat     the real nodes (hack/chatfleet_platform/cluster/realnode.py)
#   buildah, skopeo, debootstrap, gcc     the images, built without a registry (make images)
#   unshare (util-linux)          Envoy Gateway's private mount namespace (chatfleet_platform.addons.envoygateway)
set -euo pipefail
need=()
command -v prometheus   >/dev/null 2>&1 || need+=(prometheus)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v openssl      >/dev/null 2>&1 || need+=(openssl)
command -v containerd   >/dev/null 2>&1 || need+=(containerd)
command -v runc         >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/bridge ]               || need+=(containernetworking-plugins)
command -v iptables     >/dev/null 2>&1 || need+=(iptables)
command -v conntrack    >/dev/null 2>&1 || need+=(conntrack)
command -v socat        >/dev/null 2>&1 || need+=(socat)
command -v buildah      >/dev/null 2>&1 || need+=(buildah)
command -v skopeo       >/dev/null 2>&1 || need+=(skopeo)
command -v debootstrap  >/dev/null 2>&1 || need+=(debootstrap)
command -v gcc          >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v unshare      >/dev/null 2>&1 || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0
echo "[deps] installing Debian packages: ${need[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: ${need[*]} missing and apt-get is not available: install them with your package manager" >&2; exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the packages from starting their own system services on 0.0.0.0
if [ -z "$SUDO" ] && [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; trap 'rm -f /usr/sbin/policy-rc.d' EXIT; fi
$SUDO apt-get update -qq || { echo "error: apt-get update failed: the Debian package registry is unreachable" >&2; exit 1; }
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
  || { echo "error: apt-get could not install ${need[*]}" >&2; exit 1; }
# stop packaged services if an init system started them anyway (only those packages' own units)
for svc in prometheus redis-server containerd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then $SUDO systemctl stop "$svc" || true; fi
done
