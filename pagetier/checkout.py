"""What the package uses of a source checkout beside it: the two-node test VM.

The VM harness is a developer tool, kept in the checkout as scripts/testvm.py (``scripts/vm``
runs it). ``pagetier demo`` and ``pagetier bench live`` boot that VM, so they need a checkout
set up by scripts/setup.sh (QEMU, virtme-ng, Debian's kernels, pagetier.ko built); an installed
wheel has none and says so. Inside the guest the harness sets ``PAGETIER_IN_GUEST=1``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from pagetier.errors import Unavailable

# the checkout this package runs from, if it does (an editable install or PYTHONPATH)
REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "scripts" / "testvm.py"


def in_guest() -> bool:
    """This process runs inside the test VM."""
    return os.environ.get("PAGETIER_IN_GUEST") == "1"


def test_vm():
    """The checkout's VM harness module (scripts/testvm.py): ``run``, ``kernels``, ``VMResult``."""
    mod = sys.modules.get("testvm")
    if mod is not None:
        return mod
    if not HARNESS.is_file():
        raise Unavailable("this command boots the test VM of a pagetier checkout "
                          f"(scripts/testvm.py; none beside {REPO}): run it from a git clone "
                          "set up by scripts/setup.sh")
    spec = importlib.util.spec_from_file_location("testvm", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["testvm"] = mod
    spec.loader.exec_module(mod)
    return mod
