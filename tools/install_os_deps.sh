#!/usr/bin/env bash
# Install the Debian packages of a set, only those missing.
# Usage: install_os_deps.sh demo|test|ee   (install_os_deps.sh --list SET: print the set)
#
# demo: what `make demo` runs. gcc/libc6-dev build the fake libnvidia-ml; python3-venv makes the
# virtual environment; mmdebstrap, systemd-container, iproute2, openssh-client and zstd build and
# reach the demo's systemd host (tests/integration/fleet).
# test: the demo's set and what every other target needs. git lists the files the tarball packs
# (tools/dist.py); psmisc gives fuser (the benchmarks' baseline); mmdebstrap also builds the Debian
# 13 root file system of the newer controllers (tools/controller); shellcheck is ansible-test
# sanity's test of the shell scripts (skipped without it); prometheus gives promtool (the alert
# rules' tests) and the Prometheus server that evaluates them against the fleet;
# prometheus-alertmanager and Java 17 (ansible-rulebook's rules engine) run the self-healing loop;
# prometheus-blackbox-exporter runs the shipped active probe (files/prometheus/blackbox.yml);
# haproxy is the load balancer lb_rotation drains servers out of (tests/haproxy.py runs its own).
# ee: podman and runc build and run the execution environment (make ee, in make test).
set -euo pipefail
demo=(python3 python3-venv gcc libc6-dev make procps iproute2 openssh-client mmdebstrap systemd-container zstd)
test=("${demo[@]}" git psmisc shellcheck prometheus prometheus-alertmanager prometheus-blackbox-exporter haproxy openjdk-17-jre-headless)
ee=(podman runc)
# How long to wait for another apt or dpkg (unattended-upgrades, a second terminal) to finish.
LOCK_WAIT_S=${LOCK_WAIT_S:-600}
LOCKS=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock)

usage() {
  echo "install_os_deps: usage: install_os_deps.sh [--list] demo|test|ee" >&2
  exit 2
}
list=0
if [ "${1:-}" = --list ]; then list=1; shift; fi
case "${1:-}" in
  demo) packages=("${demo[@]}") ;;
  test) packages=("${test[@]}") ;;
  ee) packages=("${ee[@]}") ;;
  *) usage ;;
esac
if [ "$list" -eq 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install_os_deps: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi

# The holder of an apt or dpkg lock, as "pid command", or nothing (lslocks: util-linux, always there).
lock_holder() {
  lslocks -n -o PID,PATH,COMMAND 2>/dev/null | awk -v locks=" ${LOCKS[*]} " \
    'index(locks, " " $2 " ") { print $1, $3; exit }'
}
holder=$(lock_holder)
if [ -n "$holder" ]; then
  echo "install_os_deps: another package manager holds the apt/dpkg lock (pid ${holder% *}, ${holder#* });" \
       "waiting for it to finish, at most ${LOCK_WAIT_S} s"
  waited=0
  while [ -n "$(lock_holder)" ]; do
    if [ "$waited" -ge "$LOCK_WAIT_S" ]; then
      echo "install_os_deps: the apt/dpkg lock is still held after ${LOCK_WAIT_S} s; let that process finish, then run make again" >&2
      exit 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
fi
# prometheus-blackbox-exporter's postinst hands /var/lib/prometheus to the prometheus user, unless
# a stat override says otherwise; heal refuses a metrics directory below one another user may write
# (docs/self_healing.md), and the default one, /var/lib/prometheus/node-exporter, is there. Debian's
# override keeps root its owner.
if [[ " ${missing[*]} " == *" prometheus-blackbox-exporter "* ]] && ! dpkg-statoverride --list /var/lib/prometheus >/dev/null; then
  dpkg-statoverride --add root root 0755 /var/lib/prometheus
fi
echo "install_os_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A lock taken between the check above and apt's own: apt waits too instead of failing at once.
apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT_S" update -qq
apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT_S" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
