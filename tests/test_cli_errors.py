"""Bad input to the pagetier command: every case ends in one line on stderr naming what is
wrong (and, where there is one, what would be right), exit status 1, and no traceback.

The cases go through ``pagetier.cli.main``, the console script's entry point, in this process
(one subprocess run checks the script's wiring). All of them run on the host without root,
the kernel module or a second NUMA node: where a case needs the machine to lack something
(a build tree, a loaded module), the test says so by stubbing that one lookup.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pagetier import cli
from pagetier.profiler.base import Sample
from pagetier.profiler.trace import write_trace

REPO = Path(__file__).resolve().parent.parent
SYN = "synth:hotcold:pages=64,intervals=4,accesses=500"


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A small trace (pid 4242), files that are not what they claim, and a config with a typo;
    the working directory is tmp_path, so relative outputs land there."""
    monkeypatch.chdir(tmp_path)
    addr = 0x7F0000000000 + np.arange(8, dtype=np.uint64) * np.uint64(4096)
    frames = [(i, i + 1.0, Sample(4242, addr, np.full(8, 3, np.uint32), np.zeros(8, np.int16),
                                   np.ones(8, np.uint16))) for i in range(3)]
    write_trace(tmp_path / "t.parquet", frames, {"backend": "stub", "interval_s": 1.0,
                                                 "pids": [4242]})
    (tmp_path / "header.csv").write_text("time_ns,data_addr\n")
    (tmp_path / "text.parquet").write_text("not parquet\n")
    (tmp_path / "typo.toml").write_text('polcy = "lru"\n')
    return tmp_path


def _no_module_anywhere(monkeypatch, tmp_path):
    """A machine with no pagetier.ko built, none installed, no module loaded, and no build
    tree for its kernel (the host may have any of them)."""
    from pagetier.cli import kmod as kmod_cli
    from pagetier.profiler import kmod

    monkeypatch.setattr(kmod, "is_loaded", lambda: False)
    monkeypatch.setattr(kmod, "module_path", lambda release=None: tmp_path / "none" / "pagetier.ko")
    monkeypatch.setattr(kmod, "installed_path", lambda release=None: None)
    monkeypatch.setattr(kmod_cli, "build_tree", lambda release: tmp_path / "no-build-tree")


# (argv, what the line must say: each a substring, case-sensitive)
CASES = [
    # heatmap: output path and format, trace names, option values
    (["heatmap", "t.parquet", "-o", "/no/such/dir/x.png"], ["/no/such/dir", "does not exist"]),
    (["heatmap", "t.parquet", "-o", "heat.txt"], ["'txt' is not supported", ".png"]),
    (["heatmap", "t.parquet"], ["give -o FILE.png, --ascii or --json"]),
    (["heatmap", "builtin:nope", "--ascii"], ["no built-in trace 'nope'", "redis"]),
    (["heatmap", "missing.parquet", "--ascii"], ["no such trace file", "builtin:NAME"]),
    (["heatmap", "t.parquet", "--ascii", "--gap", "abc"], ["bad size 'abc'", "1M"]),
    (["heatmap", "t.parquet", "--ascii", "--pid", "999"], ["no samples of pid 999", "4242"]),
    (["heatmap", "t.parquet", "--ascii", "--rows", "1"], ["--rows", "2<=x<=4096"]),
    (["heatmap", "t.parquet", "--ascii", "--metric", "hot"], ["--metric", "freq", "count"]),
    # report
    (["report", "builtin:nope"], ["no built-in trace 'nope'", "sqlite"]),
    (["report", "synth:hotcold"], ["bench sim", "builtin:NAME"]),
    (["report", "text.parquet"], ["text.parquet: not a Parquet trace file"]),
    (["report", "t.parquet", "--window", "0"], ["--window", "x>=1"]),
    (["report", "t.parquet", "--hot-fraction", "2"], ["--hot-fraction", "0<x<=1"]),
    (["report", "t.parquet", "--bogus"], ["No such option", "--bogus"]),
    # bench sim: capacities before any simulating, policies, output, traces, cost options
    (["bench", "sim", SYN, "--capacity", "200%"], ["'200%'", "0-100%"]),
    (["bench", "sim", SYN, "--capacity", "-5%"], ["'-5%'", "0-100%"]),
    (["bench", "sim", SYN, "--capacity", "abc"], ["'abc'", "25%", "64M"]),
    (["bench", "sim", SYN, "--policies", "nope"], ["unknown policy 'nope'", "heuristic"]),
    (["bench", "sim", SYN, "--policies", "rl"], ["policy rl needs --rl-model"]),
    (["bench", "sim", SYN, "--policies", "rl", "--rl-model", "no.npz"],
     ["no such model file", "train-rl"]),
    (["bench", "sim", SYN, "-o", "plot.txt"], ["'txt' is not supported", ".png"]),
    (["bench", "sim", SYN, "-o", "/no/such/dir/p.png"], ["/no/such/dir", "does not exist"]),
    (["bench", "sim", "synth:nope"], ["unknown synthetic pattern 'nope'", "hotcold"]),
    (["bench", "sim", "builtin:nope"], ["no built-in trace 'nope'", "redis"]),
    (["bench", "sim", SYN, "--accesses-per-count", "lots"], ["'lots'", "a number or auto"]),
    (["bench", "sim", SYN, "--preset", "nope"], ["--preset", "dram-cxl"]),
    (["bench", "sim", SYN, "--rate", "-5"], ["--rate", "x>=0"]),
    (["bench", "sim", SYN, "--oracle-groups", "0"], ["--oracle-groups", "x>=1"]),
    # train-rl: the output path before training
    (["train-rl", SYN, "-o", "/no/such/dir/rl.npz"], ["/no/such/dir", "does not exist"]),
    (["train-rl", SYN, "-o", "rl.npz", "--budget", "200%"], ["'200%'", "0-100%"]),
    (["train-rl", SYN, "-o", "rl.npz", "--budget", "64M"], ["'64M'", "25%"]),
    (["train-rl", SYN, "-o", "rl.npz", "--epochs", "0"], ["--epochs", "x>=1"]),
    # bench costmodel and live, before any run or VM
    (["bench", "costmodel", "--trace", "missing.parquet", "-o", "c.json", "--", "true"],
     ["missing.parquet: no such trace file"]),
    (["bench", "live", "--repeat", "0"], ["--repeat", "x>=1"]),
    (["bench", "live", "--list", "-o", "/no/such/dir/live.json"], ["/no/such/dir"]),
    # run: what the user named is checked before the NUMA nodes (slow node 7 exists nowhere)
    (["run", "--policy", "nope", "--slow-node", "7", "--", "true"],
     ["unknown policy 'nope'", "heuristic"]),
    (["run", "--policy-option", "bogus=1", "--slow-node", "7", "--", "true"],
     ["unknown option 'bogus'", "min_heat"]),
    (["run", "--profiler", "stub", "--profiler-option", "bogus=1", "--dry-run", "--", "true"],
     ["profiler 'stub' has no option 'bogus'", "its options:", "hot_count"]),
    (["run", "--profiler-option", "mood=abit", "--slow-node", "7", "--", "true"],
     ["profiler 'kmod' has no option 'mood'", "mode", "scan_period_ms"]),
    (["run", "--fast-budget", "lots", "--", "true"], ["fast_budget", "96M"]),
    (["run", "--interval", "0", "--", "true"], ["interval must be > 0"]),
    (["run", "-c", "missing.toml", "--", "true"], ["missing.toml: no such file"]),
    (["run", "-c", "typo.toml", "--", "true"], ["unknown key 'polcy'", "policy"]),
    (["run", "--fast-node", "7", "--"], ["Missing argument", "CMD"]),
    (["run", "--fast-node", "0", "--slow-node", "7", "--", "true"], ["slow_node 7", "numactl -H"]),
    # attach
    (["attach"], ["give PID[,PID...], --cgroup PATH or --serve"]),
    (["attach", "12x"], ["bad PID '12x'"]),
    (["attach", "--cgroup", "no/such/group"], ["not a cgroup v2 directory"]),
    # record and record --import
    (["record", "--import", "header.csv", "-o", "t2.parquet"], ["no samples", "no rows"]),
    (["record", "--import", "missing.csv", "-o", "t2.parquet"], ["missing.csv: no such file"]),
    (["record", "--import", "header.csv", "--pid", "1", "-o", "t2.parquet"],
     ["give no --pid and no command"]),
    (["record", "-o", "t2.parquet"], ["give either --pid PID or -- CMD"]),
    (["record", "--pid", "abc", "-o", "t2.parquet"], ["--pid 'abc'", "1234"]),
    (["record", "-b", "stub", "-O", "bogus=1", "--pid", "1", "-o", "t2.parquet"],
     ["profiler 'stub' has no option 'bogus'"]),
    (["record", "-b", "nope", "--pid", "1", "-o", "t2.parquet"],
     ["unknown profiler backend 'nope'", "kmod"]),
    (["record", "--pid", "1", "-o", "/no/such/dir/t.parquet"], ["/no/such/dir", "does not exist"]),
    # the kernel module, on a machine without it
    (["kmod", "load"], ["no build tree", "linux-headers-", "make -C kmod"]),
    (["kmod", "load", "--ko", "/no/such/pagetier.ko"], ["--ko /no/such/pagetier.ko: no such file"]),
    (["kmod", "unload"], ["not loaded", "nothing to unload"]),
    # the command itself
    (["nope"], ["No such command 'nope'"]),
]


@pytest.mark.parametrize("argv,says", CASES,
                         ids=[" ".join(a).replace(SYN, "synth")[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_1(argv, says, files, monkeypatch, capsys):
    if argv[0] == "kmod":
        _no_module_anywhere(monkeypatch, files)
    try:
        cli.main(argv)
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 1, (code, out, err)
    assert len(lines) == 1, f"not one line: {err!r}"
    assert "Traceback" not in err and "Error:" not in err
    for s in says:
        assert s in lines[0], f"{s!r} is not in {lines[0]!r}"


def test_there_are_enough_cases():
    assert len(CASES) >= 30


def test_builtin_traces_are_named_as_report_and_heatmap_take_them(files, capsys):
    """`bench traces` says how to name a built-in trace, and report and heatmap take that name
    as bench sim does."""
    from pagetier.policies import builtin_traces

    def run(*argv):
        try:
            cli.main(list(argv))
        except SystemExit as e:
            assert e.code == 0, capsys.readouterr().err
        return capsys.readouterr().out

    listing = run("bench", "traces")
    assert "builtin:NAME" in listing and str(builtin_traces.TRACE_DIR) in listing  # and where
    name = builtin_traces.names()[0]
    assert "hottest regions" in run("report", f"builtin:{name}")
    assert "segment(s)" in run("heatmap", f"builtin:{name}", "--ascii")


def test_the_console_script_prints_the_same_line(files):
    """The installed entry point (python -m pagetier.cli runs the same main) exits 1 with the
    one line, in a process of its own."""
    r = subprocess.run([sys.executable, "-m", "pagetier.cli", "heatmap", "t.parquet", "-o",
                        "heat.txt"], capture_output=True, text=True, cwd=files)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "'txt' is not supported" in r.stderr and "Traceback" not in r.stderr


def _documented_defaults(text: str, section: str) -> dict[str, str]:
    """``key: ... (value)`` entries of scripts/pagetier.toml's comment block for ``section``
    (heuristic or sentinel), with entries of two keys giving two values."""
    block = text.split(f"{section}", 1)[1].split("See `pydoc", 1)[0]
    entries = re.split(r"\n#   (?=\w)", block)[1:]
    out = {}
    for e in entries:
        e = " ".join(line.lstrip("# ").strip() for line in e.splitlines())
        keys, _, rest = e.partition(":")
        m = re.search(r"\(([^()]*)\)\s*$", rest)
        if m is None:
            continue
        values = [v.strip() for v in m.group(1).split(",")]
        names = [k.strip() for k in keys.split(",")]
        if len(values) == len(names):
            out.update(zip(names, values))
    return out


def _as_value(text: str):
    if text.endswith(" MiB"):
        return int(float(text[:-4]) * (1 << 20))
    return float(text)


@pytest.mark.parametrize("policy", ["heuristic", "sentinel"])
def test_sample_config_states_the_code_defaults(policy):
    """scripts/pagetier.toml documents each policy option with its default in parentheses;
    every one it documents is the code's (and it documents the watermarks)."""
    import dataclasses

    from pagetier import policies

    text = (REPO / "scripts" / "pagetier.toml").read_text()
    tomllib.loads(text)  # still a valid config
    documented = _documented_defaults(text, {"heuristic": "heuristic:",
                                             "sentinel": "sentinel (policy"}[policy])
    assert {"high_watermark", "low_watermark"} <= set(documented), documented
    policies.create(policy)  # registers it
    fields = {f.name: f.default for f in dataclasses.fields(policies.base.POLICIES[policy].Config)}
    for key, value in documented.items():
        assert key in fields, f"pagetier.toml documents {policy} option {key!r}, which it lacks"
        assert _as_value(value) == fields[key], (policy, key, value, fields[key])
