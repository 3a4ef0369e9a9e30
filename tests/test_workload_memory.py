"""The built-in workload's kinds of memory (hotcold --memory), on the host kernel: each kind runs
and checks its memory; a file it fills reads back intact, and a corrupt page is found; two
processes share one file; a private mapping writes copies, not the file; bad arguments are
one-line errors."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from pagetier import workload
from pagetier.errors import ConfigError

SIZE_MB = 8


def run(*args: str, timeout: float = 60) -> tuple[int, list[dict], str]:
    p = subprocess.run([str(workload.binary()), "--size", str(SIZE_MB), "--hot", "2",
                        "--duration", "1", "--quiet", *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, [json.loads(ln) for ln in p.stdout.splitlines()], p.stderr


@pytest.mark.parametrize("kind", ["anon", "shmem", "file", "private"])
def test_each_kind_runs_and_checks_its_memory(tmp_path, kind):
    arg = f"{kind}:{tmp_path / 'buf'}" if kind in ("file", "private") else kind
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


def test_a_private_mapping_writes_copies_and_leaves_the_file_as_filled(tmp_path):
    """private:PATH: every page the process writes is its own copy (anonymous in smaps); the
    file keeps the pattern it was filled with."""
    path = tmp_path / "data"
    p = subprocess.Popen([str(workload.binary()), "--size", str(SIZE_MB), "--hot", "2",
                          "--duration", "30", "--quiet", "--memory", f"private:{path}"],
                         stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(p.stdout.readline())
        assert ready["memory"] == "private"
        smaps = Path(f"/proc/{p.pid}/smaps").read_text().split("\n")
        start = next(i for i, ln in enumerate(smaps) if ln.startswith(f"{ready['addr']:x}-"))
        anon_kb = next(int(ln.split()[1]) for ln in smaps[start:] if ln.startswith("Anonymous:"))
        assert anon_kb * 1024 == ready["size"]
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    assert workload.check_file(path, ready["size"]) == (SIZE_MB * 256, [])


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
    (["--memory", "bogus"], "--memory must be anon, shmem, file:PATH or private:PATH"),
    (["--memory", "file:"], "--memory must be anon, shmem, file:PATH or private:PATH"),
    (["--reuse"], "--reuse needs --memory file:PATH or private:PATH"),
    (["--memory", "file:/nonexistent-dir/x"], "/nonexistent-dir/x: No such file"),
])
def test_bad_memory_arguments(args, message):
    rc, out, err = run(*args)
    assert rc in (1, 2) and not out and message in err and len(err.splitlines()) == 1


def test_memory_arg_checks_the_kind():
    assert workload.memory_arg("file:/x") == "file:/x" and workload.memory_arg("shmem") == "shmem"
    assert workload.memory_arg("private:/x") == "private:/x"
    for bad in ("file", "private", "heap", "anon:/x"):
        with pytest.raises(ConfigError, match="anon, shmem, file:PATH or private:PATH"):
            workload.memory_arg(bad)


def test_wait_takes_a_start_signal_sent_as_soon_as_ready_is_read():
    """--wait: a SIGUSR1 sent the moment the ready line is read starts the run; it does not
    end the process (the signals are blocked before the line is printed)."""
    for _ in range(10):
        p = subprocess.Popen([str(workload.binary()), "--size", str(SIZE_MB), "--hot", "2",
                              "--duration", "0", "--wait", "--no-thp"],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert json.loads(p.stdout.readline())["event"] == "ready"
            p.send_signal(signal.SIGUSR1)
            assert json.loads(p.stdout.readline())["event"] == "tick"
            p.terminate()
            assert p.wait(timeout=30) == 0
        finally:
            p.kill()
            p.wait()
