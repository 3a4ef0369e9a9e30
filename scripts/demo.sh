#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the demo: the daemon moving the built-in
# workload's hot pages to the fast node in the two-node test VM. Extra arguments go to
# `pagetier demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/pagetier demo "$@"
