#!/usr/bin/env bash
# The long hardening runs (the `long`-marked guest tests) on both kernels, and a summary table:
#   - attach/detach cycles against a churning target (two readers at once): 240 s with reads
#     between attach and detach, 240 s back to back;
#   - rmmod under load, 5 times;
#   - 100,000 fuzzed ioctls;
#   - the kmod hazards together for PAGETIER_HAZARDS_S seconds (default 1800): a target calling execve in
#     a loop attached, read, unmarked and detached by three threads, a churning target attached
#     and detached in both modes, and random ioctls, all at once;
#   - >= 100,000 page migrations under the daemon with hotcold checking its memory, for each
#     kmod mode with THP on and off;
#   - the soak: the daemon managing churn + a moving hot set for SOAK_S seconds (default 1800),
#     its RSS and the kernel's unreclaimable slab sampled every 10 s;
#   - the memory kinds under hazards for PAGETIER_KINDS_S seconds (default 1800): targets on
#     shmem, a MAP_SHARED and a MAP_PRIVATE file on ext4 munmapping, mremapping, truncating,
#     punching holes, forking... while attached in each mode, read, unmarked and moved between
#     the nodes, each life ended by its exit, a detach, attach/detach cycles or rmmod
#     (tests/guest/test_kinds_hazards.py).
#
# Usage: scripts/hardening.sh [KERNEL[:SOAK_S]...]   (default: 6.1 6.12)
#        scripts/hardening.sh 6.12 6.1:600            (a shorter soak on 6.1)
#        PAGETIER_PARALLEL=1 scripts/hardening.sh      (every VM at once: the soak of each kernel
#                                                      in its own VM beside the other tests)
#        PAGETIER_PARTS=soak scripts/hardening.sh 6.1  (only the soak, or "stress", "kinds")
#        PAGETIER_PARTS= scripts/hardening.sh 6.1 6.12 (run nothing: the table of the last runs)
#        PAGETIER_HAZARDS_S=600 scripts/hardening.sh   (a shorter hazards run)
#        PAGETIER_PARTS=kinds PAGETIER_KINDS_S=600 scripts/hardening.sh 6.12   (the kinds only)
# One after the other, each kernel takes about 70 minutes plus its soak and its kinds run. Logs,
# soak curves and the table as JSON go to build/hardening/.
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

from pagetier.checkout import test_vm
from pagetier.workload import binary

vm = test_vm()  # scripts/testvm.py

soak_default = os.environ.get("PAGETIER_SOAK_S", "1800")
hazards_s = os.environ.get("PAGETIER_HAZARDS_S", "1800")
kinds_s = os.environ.get("PAGETIER_KINDS_S", "1800")
parts = os.environ.get("PAGETIER_PARTS", "stress soak kinds").split()
soak = {a.split(":")[0]: (a.split(":") + [soak_default])[1] for a in sys.argv[1:] or ["6.1", "6.12"]}
kernels = list(soak)
out = Path("build/hardening")
out.mkdir(parents=True, exist_ok=True)
binary(); binary("churn")
PARTS = {"stress": "tests/guest/test_hardening.py tests/guest/test_daemon_integrity.py "
                   "tests/guest/test_kmod_hazards.py",
         "soak": "tests/guest/test_daemon_soak.py",
         "kinds": "tests/guest/test_kinds_hazards.py"}
results = {}


def saved(kernel, part):
    """The last run of ``part`` on ``kernel`` (build/hardening/<kernel>-<part>.json), or None."""
    path, log = out / f"{kernel}-{part}.json", out / f"{kernel}-{part}.log"
    if path.exists():
        d = json.loads(path.read_text())
        d.pop("soak_s", None)
        return vm.VMResult(**d)
    if not log.exists():
        return None
    output, _, dmesg = log.read_text().partition("\n--- dmesg\n")  # a log without its .json
    ok = re.search(r"^\d+ passed", output, re.M) and not re.search(r"\d+ (failed|error)", output)
    release = re.search(r"Linux version (\S+)", dmesg)
    return vm.VMResult(release.group(1) if release else kernel, "", 0 if ok else 1, output,
                       dmesg, 0.0, vm.kernel_reports(dmesg) if dmesg else ["no dmesg"])


def one(kernel, part):
    res = vm.run(f"PAGETIER_SOAK_S={soak[kernel]} PAGETIER_HAZARDS_S={hazards_s} "
                 f"PAGETIER_KINDS_S={kinds_s} "
                 f"python -m pytest -p no:cacheprovider -q -rfEs -s -m long {PARTS[part]}",
                 kernel=kernel,
                 timeout=float(soak[kernel]) + float(hazards_s) + float(kinds_s) + 5400)
    (out / f"{kernel}-{part}.log").write_text(res.output + "\n--- dmesg\n" + res.dmesg)
    (out / f"{kernel}-{part}.json").write_text(json.dumps({**res.__dict__, "soak_s": soak[kernel]},
                                                          default=str))
    if part == "soak" and res.outdir is not None and (Path(res.outdir) / "soak.json").exists():
        shutil.copy(Path(res.outdir) / "soak.json", out / f"soak-{kernel}.json")
    results[kernel, part] = res


jobs = [(k, p) for k in kernels for p in parts]
if os.environ.get("PAGETIER_PARALLEL") == "1":
    ts = [threading.Thread(target=one, args=j) for j in jobs]
    [t.start() for t in ts]
    [t.join() for t in ts]
else:
    for j in jobs:
        one(*j)


def num(pattern, text, many=False):
    found = [int(m.group(1)) for m in re.finditer(pattern, text)]
    return sum(found) if many else (found[-1] if found else 0)


for k in kernels:  # parts not run now: the last saved run
    for p in PARTS:
        if (k, p) not in results and saved(k, p) is not None:
            results[k, p] = saved(k, p)
rows = []
for k in kernels:
    runs = [results[k, p] for p in PARTS if (k, p) in results]
    soak_s = json.loads((out / f"{k}-soak.json").read_text()).get("soak_s", soak[k]) \
        if (out / f"{k}-soak.json").exists() else soak[k]
    o = "\n".join(r.output for r in runs)
    rows.append({
        "kernel": runs[0].kernel if runs else k,
        "cycles": num(r"churn: (\d+) attach/detach cycles", o, many=True),
        "ioctl calls": num(r"ioctl fuzz: (\d+) calls", o),
        "hazards s": num(r"together: (\d+) s", o),
        "migrations": num(r"integrity: .*?: (\d+) page migrations", o, many=True),
        "bytes checked": num(r"(\d+) bytes checked", o, many=True),
        "soak s": int(float(soak_s)),
        "soak migrations": num(r"soak: \d+ s, \d+ intervals, (\d+) page migrations", o),
        "kinds s": num(r"kinds hazards: (\d+) s", o),
        "kinds hazards": num(r"kinds hazards: \d+ s, \d+ lives, (\d+) hazards", o),
        "kinds moved": num(r"kinds hazards: .*?, (\d+) pages moved", o),
        # a life stops at its first corrupt page, which it names: the lives that found one
        "kinds corrupt": len(set(re.findall(r"corrupt \([\w-]+\): \w+ page \d+", o))),
        "kernel reports": sum(len(r.reports) for r in runs),
        # "incomplete": every part that ran passed, but a part has never run on this kernel
        "result": "FAIL" if not all(r.ok for r in runs) else
                  "pass" if len(runs) == len(PARTS) else "incomplete",
    })
    for r in runs:
        print(f"\n===== {r.kernel}: exit {r.returncode}, {r.seconds:.0f} s =====")
        # result lines, some printed after pytest's progress dots
        found = (re.match(r"[.sF]*?((churn|ioctl fuzz|integrity|soak|together|exec race|kinds hazards|FAILED|ERROR|E  |"
                          r"\d+ (passed|failed)).*)", ln) for ln in r.output.splitlines())
        print("\n".join(m.group(1) for m in found if m))
        for rep in r.reports:
            print(f"kernel report: {rep}")
(out / "summary.json").write_text(json.dumps(rows, indent=1))
cols = list(rows[0])
width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
fmt = lambda r: "  ".join(str(r[c]).ljust(width[c]) if c == "kernel" else str(r[c]).rjust(width[c])
                          for c in cols)
print()
print(fmt({c: c for c in cols}))
for r in rows:
    print(fmt(r))
print(f"\nlogs: {out}/<kernel>-<part>.log; soak curves: {out}/soak-<kernel>.json")
raise SystemExit(0 if all(r["result"] == "pass" for r in rows) else 1)
PY
