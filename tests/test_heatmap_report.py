"""Heatmap and report of a synthetic phased trace, against golden outputs in tests/golden/.

When a change to the output is intended, regenerate the goldens and review the diff:

    PAGETIER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_heatmap_report.py
    git diff tests/golden/
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pagetier.profiler.base import Sample
from pagetier.profiler.trace import read_trace, write_trace

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PAGETIER_UPDATE_GOLDEN") == "1"
HINT = "intended? regenerate with PAGETIER_UPDATE_GOLDEN=1 pytest tests/test_heatmap_report.py"

HEAP = 0x7F0000000000
DATA = 0x555555558000
PHASES, PHASE_LEN, PAGES, HOT = 3, 4, 1024, 128


def phased_trace(path) -> None:
    """A 4 MiB heap whose 512 KiB hot band moves up every 4 intervals, a warm data object of
    64 KiB, and a cold tail; nodes alternate 0 and 1 by page."""
    rng = np.random.default_rng(8)
    frames = []
    for i in range(PHASES * PHASE_LEN):
        first = (i // PHASE_LEN) * HOT * 2
        hot = HEAP + (first + np.arange(HOT, dtype=np.uint64)) * np.uint64(4096)
        warm = DATA + np.arange(16, dtype=np.uint64) * np.uint64(4096)
        cold = HEAP + (PAGES - 8 + np.arange(8, dtype=np.uint64)) * np.uint64(4096)
        addr = np.concatenate([warm, hot, cold if i % 6 == 0 else cold[:0]])
        count = np.concatenate([np.full(16, 3), rng.integers(20, 40, HOT),
                                np.ones(8 if i % 6 == 0 else 0)]).astype(np.uint32)
        node = ((addr // np.uint64(4096)) % np.uint64(2)).astype(np.int16)
        frames.append((i, (i + 1) * 0.5, Sample(4242, addr, count, node,
                                                np.ones(len(addr), np.uint16))))
    maps = [[0x555555554000, 0x555555556000, "r--p", "/opt/app/bin/phased"],
            [0x555555556000, 0x555555557000, "r-xp", "/opt/app/bin/phased"],
            [0x555555557000, 0x555555568000, "rw-p", "/opt/app/bin/phased"],
            [0x555555568000, 0x555555589000, "rw-p", "[heap]"],
            [HEAP, HEAP + PAGES * 4096, "rw-p", ""]]
    symbols = [[DATA, 0x8000, "lookup_table", ".data"], [DATA + 0x8000, 0x8000, "counters", ".bss"]]
    write_trace(path, frames, {
        "backend": "stub", "mode": "", "interval_s": 0.5, "pids": [4242],
        "command": "/opt/app/bin/phased --phase 2", "kernel": "6.12.0-test",
        "created": "2026-01-01T00:00:00+0000",
        "processes": {"4242": {"maps": maps, "symbols": symbols, "exe": "/opt/app/bin/phased",
                               "cmdline": ["/opt/app/bin/phased", "--phase", "2"]}}})


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("hm") / "phased.parquet"
    phased_trace(p)
    return p


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: {HINT}"
    assert text == path.read_text(), f"{name} differs from its golden; {HINT}"


def cli(*args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "pagetier.cli", *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def test_heat_matrix_golden_and_band_moves(trace_path):
    from pagetier.profiler.heatmap import heat

    tr = read_trace(trace_path)
    h = heat(tr, rows=24)
    check_golden("heatmap_phased.json", json.dumps(h.to_json(), indent=1) + "\n")
    # the mapped memory: the executable's mappings with its heap, and the whole 4 MiB heap
    # region, its idle parts too; only the unmapped gap between the two is collapsed
    assert h.segments == [(0x555555554000, 0x555555589000), (HEAP, HEAP + PAGES * 4096)]
    assert h.mapped.all() and (h.matrix == 0).any()
    # the accessed pages alone: data, the heap's bands and its cold tail, gaps collapsed
    only = heat(tr, rows=24, only_accessed=True)
    assert [hex(lo) for lo, _ in only.segments] == [hex(DATA), hex(HEAP), hex(HEAP + 0x3F8000)]
    # the hottest heap row moves up once per phase
    heap_rows = slice(h.seg_rows[1], None)
    tops = [int(np.argmax(h.matrix[heap_rows, c])) for c in range(h.matrix.shape[1])]
    per_phase = [tops[p * PHASE_LEN:(p + 1) * PHASE_LEN] for p in range(PHASES)]
    assert all(len(set(ph)) >= 1 for ph in per_phase)
    assert max(per_phase[0]) < min(per_phase[1]) and max(per_phase[1]) < min(per_phase[2])


def test_ascii_heatmap_golden(trace_path):
    out = cli("heatmap", trace_path, "--ascii").stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    check_golden("heatmap_phased.txt", out)


def test_png_heatmap(trace_path, tmp_path):
    png = tmp_path / "heat.png"
    out = cli("heatmap", trace_path, "-o", png).stdout
    assert "2 segment(s)" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.colors as mcolors
    import matplotlib.image as mpimg

    from pagetier.profiler.heatmap import IDLE_COLOUR

    img = mpimg.imread(str(png))
    assert img.shape[0] >= 500 and img.shape[1] >= 900
    # the idle mapped memory is drawn in the dark idle colour
    idle = np.array(mcolors.to_rgb(IDLE_COLOUR))
    assert (np.abs(img[:, :, :3] - idle).max(axis=2) < 0.02).mean() > 0.05


def test_cold_memory_is_drawn_where_it_is(tmp_path):
    """A 256 MiB program whose hot 32 MiB sit 96 MiB into it: the heatmap draws all 256 MiB,
    the cold 224 MiB idle (mapped, value 0) below and above the hot rows, so the picture shows
    where the hot part sits; --only-accessed draws the 32 MiB alone."""
    from pagetier.profiler.heatmap import heat

    base, mib = HEAP, 1 << 20
    hot = base + np.uint64(96 * mib) + np.arange(32 * 256, dtype=np.uint64) * np.uint64(4096)
    frames = [(i, i + 1.0, Sample(77, hot, np.full(len(hot), 5, np.uint32),
                                  np.zeros(len(hot), np.int16), np.ones(len(hot), np.uint16)))
              for i in range(4)]
    p = tmp_path / "big.parquet"
    write_trace(p, frames, {"backend": "stub", "interval_s": 1.0, "pids": [77],
                            "processes": {"77": {"maps": [[base, base + 256 * mib, "rw-p", ""]]}}})
    tr = read_trace(p)
    h = heat(tr, rows=64)
    assert h.segments == [(base, base + 256 * mib)] and h.pages == 256 * 256
    hot_rows = np.flatnonzero(h.matrix.max(axis=1) > 0)
    assert list(hot_rows) == list(range(24, 32))  # 96..128 MiB of 256, in 64 rows
    assert h.mapped.all() and (h.matrix[:24] == 0).all() and (h.matrix[32:] == 0).all()
    text = cli("heatmap", p, "--ascii", "--rows", "16").stdout
    rows = [line.split()[1].lstrip("|~") for line in text.splitlines()
            if line.strip().startswith("0x")]
    assert len(rows) == 16 and rows.count("." * len(rows[0])) == 14  # 14 idle rows, 2 hot
    only = heat(tr, rows=64, only_accessed=True)
    assert only.segments == [(int(hot[0]), int(hot[-1]) + 4096)]


def test_report_golden(trace_path):
    text = cli("report", trace_path).stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    check_golden("report_phased.txt", text)
    rep = json.loads(cli("report", trace_path, "--json").stdout)
    check_golden("report_phased.json", json.dumps(rep, indent=1, sort_keys=True) + "\n")
    # what the synthetic trace holds, stated independently of the goldens
    assert rep["peak_hot_set"] == (HOT + 16) * 4096
    top = rep["hottest"][0]
    assert top["mapping"] == "[anon]" and top["bytes"] >= HOT * 4096
    data = next(r for r in rep["hottest"] if r["start"] == hex(DATA))
    assert data["mapping"] == "/opt/app/bin/phased"
    assert data["symbols"] == ["lookup_table (.data)", "counters (.bss)"]
    assert set(rep["residency"]["seen"]) == {"0", "1"}


def test_heatmap_and_report_of_an_empty_trace(tmp_path):
    p = tmp_path / "empty.parquet"
    write_trace(p, [], {"backend": "stub", "pids": [1]})
    r = subprocess.run([sys.executable, "-m", "pagetier.cli", "heatmap", p, "--ascii"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no samples" in r.stderr
    assert "0 intervals" in cli("report", p).stdout


def test_freq_metric_is_the_default_when_the_trace_has_estimates(tmp_path):
    """A unit counted once but estimated at 10^5 accesses/s outranks one counted 3 times at
    10/s: by freq (the default with estimates) in the report and the heatmap; --metric count
    gives the count's order back."""
    from pagetier.profiler.heatmap import heat

    p = tmp_path / "f.parquet"
    hot, warm = HEAP, HEAP + 0x400000  # 4 MiB apart: two regions, two segments
    frames = []
    for i in range(4):
        s = Sample(4242, np.array([hot, warm], np.uint64), np.array([1, 3], np.uint32),
                   np.zeros(2, np.int16), np.ones(2, np.uint16),
                   freq=np.array([1e5, 10.0], np.float32))
        frames.append((i, i + 1.0, s))
    write_trace(p, frames, {"backend": "stub", "interval_s": 1.0, "pids": [4242]})
    tr = read_trace(p)
    rep = json.loads(cli("report", p, "--json").stdout)
    assert rep["metric"] == "freq" and rep["hottest"][0]["start"] == hex(hot)
    assert rep["hottest"][0]["rate"] == 1e5 and rep["hottest"][1]["rate"] == 10.0
    rep = json.loads(cli("report", p, "--json", "--metric", "count").stdout)
    assert rep["metric"] == "count" and rep["hottest"][0]["start"] == hex(warm)
    text = cli("report", p).stdout
    assert "by estimated accesses/s" in text and "100.0k" in text
    h = heat(tr, rows=4)
    assert h.metric == "freq" and h.matrix.max() == pytest.approx(1e5)
    assert heat(tr, rows=4, metric="count").matrix.max() == pytest.approx(3)
    out = cli("heatmap", p, "--ascii").stdout
    assert "acc/s/unit" in out
    assert "count/page" in cli("heatmap", p, "--ascii", "--metric", "count").stdout
