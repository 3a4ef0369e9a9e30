"""scripts/bench_daemon.py's scale run, as a user starts it: one row per size, accessed share and
noise level, the noise's records on top of the hot set's, where the accesses landed, and bad
options refused by name."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_daemon.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300)


def test_scale_rows_with_and_without_noise():
    res = _run("--scale", "--sizes", "64G", "--hot", "0.05", "--noise", "0,100",
               "--intervals", "2", "--baseline", "none")
    assert res.returncode == 0, res.stderr
    rows = [line.split(" | ") for line in res.stdout.splitlines() if line.startswith("64G |")]
    assert [r[:3] for r in rows] == [["64G", "5%", "0"], ["64G", "5%", "100"]], res.stdout
    records = [int(r[3].replace(",", "")) for r in rows]
    # 100 ppm of 16.8 M pages is 1,678 single accesses, nearly all in a region of their own
    assert 1000 < records[1] - records[0] <= 1678, records
    # where the accesses landed: shares of them on the fast node, mean and last read
    for r in rows:
        mean, last = (float(x) for x in r[10].split(" / "))
        assert 0 < mean <= 1 and 0 < last <= 1, r


def test_negative_noise_is_refused():
    res = _run("--scale", "--noise", "0,-5", "--baseline", "none")
    assert res.returncode == 1
    assert "--noise must not be negative" in res.stderr and not res.stdout
