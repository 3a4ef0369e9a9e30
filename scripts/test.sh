#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite: unit tests on the host,
# then every VM test, one boot per kernel (6.1 and 6.12). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -rfEs "$@"
