#!/usr/bin/env bash
# The long hardening runs (issue: stress, faults, bad input), on both kernels: 240 s of
# attach/detach cycles against a churning target, 100,000 fuzzed ioctls, rmmod under load.
# Prints each kernel's results and a summary table. Takes about 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python - <<'PY'
import re
from pagetier import vm
from pagetier.workload import binary

binary(); binary("churn")
rows = []
for kernel in ("6.1", "6.12"):
    res = vm.run("PAGETIER_LONG=1 python -m pytest -p no:cacheprovider -q -s tests/guest/test_hardening.py",
                 kernel=kernel, timeout=3000)
    print(res.output[-3000:])
    cyc = re.search(r"churn: (\d+) attach/detach cycles, (\d+) reads", res.output)
    calls = re.search(r"ioctl fuzz: (\d+) calls", res.output)
    rows.append((res.kernel, cyc.group(1) if cyc else "-", cyc.group(2) if cyc else "-",
                 calls.group(1) if calls else "-", len(res.reports), "pass" if res.ok else "FAIL"))
print(f"\n{'kernel':<24} {'cycles':>7} {'reads':>7} {'ioctls':>8} {'kernel reports':>15} {'result':>7}")
for r in rows:
    print(f"{r[0]:<24} {r[1]:>7} {r[2]:>7} {r[3]:>8} {r[4]:>15} {r[5]:>7}")
raise SystemExit(0 if all(r[5] == "pass" for r in rows) else 1)
PY
