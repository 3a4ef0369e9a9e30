"""The built-in workload's kinds of memory (hotcold --memory), on the host kernel: each kind runs
and checks its memory; a file it fills reads back intact, and a corrupt page is found; two
processes share one file; bad arguments are one-line errors."""
from __future__ import annotations

import json
import subprocess

import pytest

from pagetier import workload
from pagetier.errors import ConfigError

SIZE_MB = 8


def run(*args: str, timeout: float = 60) -> tuple[int, list[dict], str]:
    p = subprocess.run([str(workload.binary()), "--size", str(SIZE_MB), "--hot", "2",
                        "--duration", "1", "--quiet", *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, [json.loads(ln) for ln in p.stdout.splitlines()], p.stderr


@pytest.mark.parametrize("kind", ["anon", "shmem", "file"])
def test_each_kind_runs_and_checks_its_memory(tmp_path, kind):
    arg = f"file:{tmp_path / 'buf'}" if kind == "file" else kind
    rc, (ready, done), err = run("--memory", arg, "--start-node", "0")
    assert rc == 0, err
    assert ready["memory"] == kind and done["pages_checked"] == SIZE_MB * 256
    assert done["pages_corrupt"] == 0


def test_a_file_it_filled_reads_back_intact_and_a_corrupt_page_is_found(tmp_path):
    path = tmp_path / "data"
    rc, (ready, done), err = run("--memory", f"file:{path}")
    assert rc == 0, err
    assert path.stat().st_size == ready["size"]
    assert workload.check_file(path, ready["size"]) == (SIZE_MB * 256, [])
    with open(path, "r+b") as f:
        f.seek(300 * 4096 + 8 * 9)
        f.write(b"\1")
    assert workload.check_file(path, ready["size"]) == (SIZE_MB * 256, [300])
    # and hotcold itself, mapping the file again, finds the same page
    rc, (_, done), _ = run("--memory", f"file:{path}", "--reuse")
    assert rc == 3 and done["pages_corrupt"] == 1
    # a file shorter than it says is corrupt from where it ends
    assert workload.check_file(path, ready["size"] + 2 * 4096)[1] == [300, SIZE_MB * 256,
                                                                      SIZE_MB * 256 + 1]


def test_two_processes_share_one_file(tmp_path):
    """The second maps the first's file without filling it: it sees the pattern the first
    wrote, and the counters both increment land in the same pages."""
    path = tmp_path / "seg"
    first = subprocess.Popen([str(workload.binary()), "--size", str(SIZE_MB), "--hot", "2",
                              "--duration", "3", "--quiet", "--memory", f"file:{path}"],
                             stdout=subprocess.PIPE, text=True)
    ready = json.loads(first.stdout.readline())
    rc, (_, done), err = run("--memory", f"file:{path}", "--reuse")
    assert rc == 0 and done["pages_corrupt"] == 0, err
    assert first.wait(timeout=60) == 0
    assert workload.check_file(path, ready["size"])[1] == []


@pytest.mark.parametrize("args,message", [
    (["--memory", "bogus"], "--memory must be anon, shmem or file:PATH"),
    (["--memory", "file:"], "--memory must be anon, shmem or file:PATH"),
    (["--reuse"], "--reuse needs --memory file:PATH"),
    (["--memory", "file:/nonexistent-dir/x"], "/nonexistent-dir/x: No such file"),
])
def test_bad_memory_arguments(args, message):
    rc, out, err = run(*args)
    assert rc in (1, 2) and not out and message in err and len(err.splitlines()) == 1


def test_memory_arg_checks_the_kind():
    assert workload.memory_arg("file:/x") == "file:/x" and workload.memory_arg("shmem") == "shmem"
    for bad in ("file", "heap", "anon:/x"):
        with pytest.raises(ConfigError, match="anon, shmem or file:PATH"):
            workload.memory_arg(bad)
