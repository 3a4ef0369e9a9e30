#!/usr/bin/env bash
# The long hardening runs (the `long`-marked guest tests) on both kernels, and a summary table:
#   - attach/detach cycles for 240 s against a churning target (two readers at once);
#   - rmmod under load, 20 times;
#   - 100,000 fuzzed ioctls;
#   - >= 100,000 page migrations under the daemon with hotcold checking its memory, for each
#     kmod mode with THP on and off;
#   - the soak: the daemon managing churn + a moving hot set for PAGETIER_SOAK_S seconds
#     (default 1800), its RSS and the kernel's unreclaimable slab sampled every 10 s.
#
# Usage: scripts/hardening.sh [KERNEL[:SOAK_S]...]   (default: 6.1 6.12, one after the other)
#        PAGETIER_SOAK_S=600 scripts/hardening.sh 6.1
#        scripts/hardening.sh 6.12 6.1:900          (a shorter soak on 6.1)
#        PAGETIER_PARALLEL=1 scripts/hardening.sh  (both kernels at once: twice the CPU)
# Each kernel takes about 30 minutes plus the soak. Logs and soak curves go to build/hardening/.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python - "$@" <<'PY'
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

from pagetier import vm
from pagetier.workload import binary

soak_default = os.environ.get("PAGETIER_SOAK_S", "1800")
soak = {a.split(":")[0]: (a.split(":") + [soak_default])[1] for a in sys.argv[1:] or ["6.1", "6.12"]}
kernels = list(soak)
out = Path("build/hardening")
out.mkdir(parents=True, exist_ok=True)
binary(); binary("churn")
TESTS = ("tests/guest/test_hardening.py tests/guest/test_daemon_integrity.py "
         "tests/guest/test_daemon_soak.py")
results = {}


def one(kernel):
    res = vm.run(f"PAGETIER_SOAK_S={soak[kernel]} python -m pytest -p no:cacheprovider -q -rfEs -s "
                 f"-m long {TESTS}", kernel=kernel, timeout=float(soak[kernel]) + 5400)
    (out / f"{kernel}.log").write_text(res.output + "\n--- dmesg\n" + res.dmesg)
    curves = Path(vm.REPO / "build" / "vm").glob(f"{kernel}-*/soak.json")
    newest = max(curves, key=lambda p: p.stat().st_mtime, default=None)
    if newest is not None and newest.stat().st_mtime >= res_start[kernel]:
        shutil.copy(newest, out / f"soak-{kernel}.json")
    results[kernel] = res


res_start = {k: time.time() for k in kernels}
if os.environ.get("PAGETIER_PARALLEL") == "1":
    ts = [threading.Thread(target=one, args=(k,)) for k in kernels]
    [t.start() for t in ts]
    [t.join() for t in ts]
else:
    for k in kernels:
        res_start[k] = time.time()
        one(k)


def num(pattern, text, group=1, many=False):
    found = [int(m.group(group)) for m in re.finditer(pattern, text)]
    return sum(found) if many else (found[-1] if found else 0)


rows = []
for k in kernels:
    res = results[k]
    o = res.output
    summary = re.findall(r"^\d+ (passed|failed|error)", o, re.M)
    rows.append({
        "kernel": res.kernel,
        "cycles": num(r"churn: (\d+) attach/detach cycles", o),
        "ioctl calls": num(r"ioctl fuzz: (\d+) calls", o),
        "migrations": num(r"integrity: .*?: (\d+) page migrations", o, many=True),
        "soak s": int(float(soak[k])),
        "soak migrations": num(r"soak: \d+ s, \d+ intervals, (\d+) page migrations", o),
        "kernel reports": len(res.reports),
        "bytes checked": num(r"(\d+) bytes checked", o, many=True),
        "result": "pass" if res.ok else "FAIL",
    })
    print(f"\n===== {res.kernel}: exit {res.returncode}, {res.seconds:.0f} s =====")
    print("\n".join(ln for ln in o.splitlines()
                    if re.match(r"(churn|ioctl fuzz|integrity|soak|rmmod|FAILED|ERROR|\d+ (passed|failed))", ln)))
    for r in res.reports:
        print(f"kernel report: {r}")
(out / "summary.json").write_text(json.dumps(rows, indent=1))
cols = list(rows[0])
width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
print()
print("  ".join(c.rjust(width[c]) if c != "kernel" else c.ljust(width[c]) for c in cols))
for r in rows:
    print("  ".join(str(r[c]).rjust(width[c]) if c != "kernel" else str(r[c]).ljust(width[c])
                    for c in cols))
print(f"\nlogs: {out}/<kernel>.log; soak curves: {out}/soak-<kernel>.json")
raise SystemExit(0 if all(r["result"] == "pass" for r in rows) else 1)
PY
