#!/usr/bin/env bash
# Install the Debian packages the demo and the tests need, only those missing.
# gcc/libc6-dev build the fake libnvidia-ml; python3-venv makes the virtual environment;
# psmisc gives fuser (the benchmarks' baseline); mmdebstrap, systemd-container, iproute2,
# openssh-client and zstd build and reach the fleet of test hosts (mmdebstrap also the Debian 13
# root file system of the newer controllers, tools/controller); shellcheck is ansible-test
# sanity's test of the shell scripts (skipped without it); prometheus gives promtool (the alert
# rules' tests) and the Prometheus server that evaluates them against the fleet;
# prometheus-alertmanager and Java 17 (ansible-rulebook's rules engine) run the self-healing loop.
set -euo pipefail
packages=(python3 python3-venv gcc libc6-dev make git psmisc procps iproute2 openssh-client
          mmdebstrap systemd-container zstd shellcheck prometheus
          prometheus-alertmanager openjdk-17-jre-headless)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install_os_deps: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi
echo "install_os_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
