#!/bin/sh
# Build the Debian 13 (trixie) root file system that hosts the newer controllers: ansible-core
# 2.20 and 2.21 need Python >= 3.12, Debian 12 and this project's machines have 3.11.
# Usage: image.sh OUTPUT-DIRECTORY
# tools/controller/controller.py caches the result under build/controller/, keyed on this file's
# hash, and installs each ansible-core release into a venv of its own inside it. Made as the
# fleet's image is (tests/integration/fleet/image.sh): mmdebstrap, Debian's default mirror.
# openssh-client reaches the test fleet; git and shellcheck are what ansible-test sanity uses.
set -eu
out=$1
exec mmdebstrap \
    --variant=minbase \
    --include=python3,python3-venv,openssh-client,ca-certificates,git,shellcheck \
    trixie "$out"
