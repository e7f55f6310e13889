#!/bin/sh
# The execution environment's base image, made without a container registry: Debian 12 with
# python3, pip and venv (ansible-builder installs ansible-core, ansible-runner and the Python
# requirements with the base's pip), ca-certificates and openssh-client (the EE reaches the GPU
# hosts over SSH; ansible-runner loads AWX's machine credential into ssh-agent).
# The build machine's CA bundle is copied in, so that pip inside the build verifies the package
# index exactly as the build machine does.
# Usage: base.sh OUTPUT.tar   (then: podman import OUTPUT.tar localhost/cleanslate-ee-base:bookworm)
set -eu
out=$1
# The hooks' "$1" is mmdebstrap's (the root being built), expanded by its shell, not this one.
# shellcheck disable=SC2016
exec mmdebstrap \
    --variant=minbase \
    --include=python3,python3-pip,python3-venv,ca-certificates,openssh-client \
    --customize-hook='cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"' \
    --customize-hook='rm -rf "$1/var/lib/apt/lists"/* "$1/var/cache/apt"/*' \
    bookworm "$out"
