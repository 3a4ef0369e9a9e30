#!/usr/bin/env bash
# pagetier set-up: idempotent. Installs every Debian and PyPI dependency, creates the virtual
# environment in .venv (on Debian's own Python, so that Debian's bcc imports in it), and builds
# kmod/ for every installed Debian kernel, the C workloads (pagetier/workloads) into build/bin and
# the daemon's compiled helpers (pagetier/core/native) into build/native.
#
# Usage: scripts/setup.sh [--no-apt]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
log() { printf 'setup: %s\n' "$*" >&2; }

need_root() {
	if [ "$(id -u)" -ne 0 ]; then
		if command -v sudo >/dev/null; then echo sudo; else
			log "run as root (apt-get is needed)"; exit 1
		fi
	fi
}

APT_PKGS=(build-essential bc flex bison libelf-dev kmod cpio busybox-static
	qemu-system-x86 qemu-utils
	python3 python3-venv python3-dev python3-pip python3-bpfcc bpfcc-tools
	libnuma1 libnuma-dev numactl udev iproute2 procps util-linux dkms
	linux-image-amd64 linux-headers-amd64 linux-source-6.12
	redis-server redis-tools sqlite3 zstd  # third-party programs the trace set is recorded from
	stress-ng sysbench  # third-party memory workloads bench live runs beside its own
	prometheus)  # the metrics test scrapes the daemon with Debian's Prometheus server

install_apt() {
	local SUDO; SUDO=$(need_root)
	local stamp=/var/lib/apt/periodic/pagetier-update
	if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +720 2>/dev/null)" ]; then
		$SUDO apt-get update -q
		$SUDO mkdir -p "$(dirname "$stamp")"; $SUDO touch "$stamp"
	fi
	# The newest 6.12 kernel Debian 12 carries, with its headers.
	local k612
	k612=$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' |
		awk '{print $1}' | sort -V | tail -1)
	local pkgs=("${APT_PKGS[@]}")
	if [ -n "$k612" ]; then
		pkgs+=("$k612" "${k612/linux-image/linux-headers}")
	else
		log "warning: no linux-image-6.12.*+deb12-amd64 in the apt lists; 6.12 tests will be skipped"
	fi
	local missing=()
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing: ${missing[*]}"
		$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
	fi
	# QEMU reads the kernel image directly: make it readable for non-root users too.
	$SUDO chmod a+r /boot/vmlinuz-* 2>/dev/null || true
}

install_venv() {
	# Debian's python3-bpfcc lives in /usr/lib/python3/dist-packages and imports only in
	# /usr/bin/python3: the venv is built on that interpreter with system site-packages visible.
	if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.base_prefix != "/usr")'; then
		rm -rf .venv
		/usr/bin/python3 -m venv --system-site-packages .venv
	fi
	.venv/bin/python -m pip install -q --upgrade 'pip>=23'
	.venv/bin/python -m pip install -q -e '.[test]'
	# PyTorch for CPU (the sentinel policy's hooks and example): pin the CPU build; a plain
	# "torch" would pull the multi-GB CUDA one.
	.venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q 'torch==2.13.0'
}

build_kmod() {
	local kd
	for kd in /lib/modules/*/build; do
		[ -d "$kd" ] || continue
		local kver; kver=$(basename "$(dirname "$kd")")
		log "building kmod/ for $kver"
		make -s -C kmod KERNEL_DIR="$kd" >/dev/null
	done
}

if [ "${1:-}" != "--no-apt" ]; then install_apt; fi
install_venv
build_kmod
log "building the built-in workloads into build/bin"
make -s -C pagetier/workloads OUT="$top/build/bin"
log "building the daemon's compiled helpers into build/native"
make -s -C pagetier/core/native OUT="$top/build/native"
log "done: activate with 'source .venv/bin/activate', or run .venv/bin/pagetier"
