"""`make -C kmod check` on the host: the module builds for an installed kernel, checkpatch
reports no error in its sources (warnings are printed, not fatal) and modinfo shows the UAPI's
version. Skipped only where checkpatch.pl is not installed (Debian: linux-source-6.12)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pagetier import uapi

KMOD = Path(__file__).resolve().parent.parent / "kmod"


def _kernel_dir() -> Path | None:
    """A kernel build tree with headers installed, newest first."""
    trees = sorted(Path("/usr/src").glob("linux-headers-*-amd64"), reverse=True)
    return next((t for t in trees if (t / "Makefile").exists()), None)


def test_make_check_passes_checkpatch():
    kdir = _kernel_dir()
    if kdir is None:
        pytest.skip("no kernel headers in /usr/src")
    where = subprocess.run(["make", "-s", "-C", str(KMOD), "checkpatch-path", f"KERNEL_DIR={kdir}"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if not where:
        pytest.skip("checkpatch.pl is not installed (Debian: apt install linux-source-6.12)")
    res = subprocess.run(["make", "-C", str(KMOD), "check", f"KERNEL_DIR={kdir}"],
                         capture_output=True, text=True)
    print(res.stdout[-3000:], res.stderr[-3000:])
    assert res.returncode == 0, "make check failed (checkpatch errors or the build): see above"
    assert f"version:        {uapi.VERSION}" in res.stdout
    assert ": ERROR:" not in res.stdout


def test_make_check_fails_on_a_checkpatch_error(tmp_path):
    """The check is not decoration: a file with a checkpatch error fails it."""
    kdir = _kernel_dir()
    where = subprocess.run(["make", "-s", "-C", str(KMOD), "checkpatch-path",
                            f"KERNEL_DIR={kdir or '/nonexistent'}"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if not where:
        pytest.skip("checkpatch.pl is not installed (Debian: apt install linux-source-6.12)")
    bad = tmp_path / "bad.c"
    bad.write_text("// SPDX-License-Identifier: GPL-2.0\nint f(int a) {\n\treturn a;\n}\n")
    res = subprocess.run(["make", "-C", str(KMOD), "checkpatch-errors", f"CHECK_FILES={bad}",
                          f"O={tmp_path}", f"KERNEL_DIR={kdir or '/nonexistent'}"],
                         capture_output=True, text=True)
    assert res.returncode != 0, res.stdout
    assert ": ERROR:" in res.stdout


def test_vermagic_is_read_from_the_module_and_a_non_module_is_named(tmp_path):
    """The daemon checks a module's vermagic before insmod: the value modinfo shows, and a clear
    error naming the file for what is not a kernel module."""
    from pagetier.profiler import kmod

    built = sorted((KMOD.parent / "build" / "kmod").glob("*/pagetier.ko"))
    if not built:
        pytest.skip("no module built (scripts/setup.sh builds it)")
    for ko in built:
        r = subprocess.run(["modinfo", "-F", "vermagic", str(ko)], capture_output=True, text=True)
        if r.returncode == 0:
            assert kmod.vermagic(ko).strip() == r.stdout.strip()
        assert kmod.vermagic(ko).split()[0] == ko.parent.name
    cut = tmp_path / "cut.ko"
    cut.write_bytes(built[0].read_bytes()[:100])
    text = tmp_path / "text.ko"
    text.write_text("not a module\n")
    for bad in (cut, text, Path("/bin/true")):
        with pytest.raises(kmod.Unavailable, match="not a kernel module") as e:
            kmod.vermagic(bad)
        assert str(bad) in str(e.value)
