"""pagetier: kernel-assisted page-access profiler and tiered-memory migration daemon."""
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
# The one version: kmod/include/uapi/linux/pagetier.h (read by the module and by user space).
UAPI_HEADER = "kmod/include/uapi/linux/pagetier.h"
# where the header lands inside the installed package (pagetier/uapi.py looks there first)
UAPI_PACKAGED = "pagetier/include/linux/pagetier.h"
# the C workloads (pagetier workload, the tests' and benchmarks' programs), built into the package
WORKLOADS = "pagetier/workloads"
WORKLOAD_PROGS = ("hotcold", "churn")
# the daemon's compiled helpers (pagetier/core/sorted_find.py and row_merge.py load them with
# ctypes)
NATIVE = "pagetier/core/native"
NATIVE_LIBS = ("libsorted_find.so", "librow_merge.so")
_uapi = (HERE / UAPI_HEADER).read_text()
VERSION = ".".join(
    re.search(rf"#define PAGETIER_VERSION_{p}\s+(\d+)", _uapi).group(1)
    for p in ("MAJOR", "MINOR", "PATCH")
)


class BuildPy(build_py):
    """build_py that also copies the module's UAPI header into the package (pagetier.uapi reads
    the struct layouts and ioctl numbers from it, and an installed package has no kmod/ beside
    it) and builds the C workloads into pagetier/workloads/bin (pagetier/workloads/Makefile)."""

    def run(self):
        super().run()
        if not self.dry_run:
            dest = Path(self.build_lib) / UAPI_PACKAGED
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(HERE / UAPI_HEADER), str(dest))
            self._build_workloads(Path(self.build_lib) / WORKLOADS / "bin")
            self._build_native(Path(self.build_lib) / NATIVE / "lib")

    @staticmethod
    def _build_workloads(out: Path) -> None:
        if shutil.which("make") is None or shutil.which("cc") is None:
            raise SystemExit("pagetier: building the workloads (pagetier/workloads/*.c) needs make "
                             "and a C compiler (cc), and libnuma-dev: install them "
                             "(Debian: build-essential libnuma-dev)")
        r = subprocess.run(["make", "-s", "-C", str(HERE / WORKLOADS), f"OUT={out.resolve()}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"pagetier: building the workloads failed (is libnuma-dev "
                             f"installed?):\n{r.stdout}{r.stderr}")

    @staticmethod
    def _build_native(out: Path) -> None:
        r = subprocess.run(["make", "-s", "-C", str(HERE / NATIVE), f"OUT={out.resolve()}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"pagetier: building the compiled helpers ({NATIVE}) failed:\n"
                             f"{r.stdout}{r.stderr}")

    def get_outputs(self, include_bytecode=True):
        lib = Path(self.build_lib)
        return [*super().get_outputs(include_bytecode), str(lib / UAPI_PACKAGED),
                *(str(lib / WORKLOADS / "bin" / p) for p in WORKLOAD_PROGS),
                *(str(lib / NATIVE / "lib" / n) for n in NATIVE_LIBS)]


class BinaryDistribution(Distribution):
    """The wheel carries compiled workloads: it is for one platform, not pure Python."""

    def has_ext_modules(self):
        return True


setup(
    name="pagetier",
    version=VERSION,
    description="Kernel-assisted page-access profiler and tiered-memory migration daemon",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="GPL-2.0-only",
    python_requires=">=3.11",
    # One import package, pagetier; its parts live in the repository's top-level folders.
    packages=["pagetier", "pagetier.bench", "pagetier.cli", "pagetier.core", "pagetier.profiler",
              "pagetier.daemon", "pagetier.policies", "pagetier.policies.rules"],
    package_dir={
        "pagetier": "pagetier",
        "pagetier.profiler": "profiler",
        "pagetier.daemon": "daemon",
        "pagetier.policies": "policies",
    },
    package_data={
        # the C workloads' sources (hotcold, churn); the build compiles them (BuildPy above)
        "pagetier": ["workloads/*.c", "workloads/Makefile"],
        # the sorted lookups' C source; the build compiles it (BuildPy above)
        "pagetier.core": ["native/*.c", "native/Makefile"],
        # the built-in trace set (pagetier bench traces), recorded by scripts/record_traces.py
        "pagetier.policies": ["traces/*.parquet", "traces/index.json"],
    },
    cmdclass={"build_py": BuildPy},
    distclass=BinaryDistribution,
    install_requires=[
        "click>=8.1,<9",
        "numpy>=1.24,<3",
        "psutil>=5.9,<8",
        "py-libnuma>=1.2,<2",
        "pyelftools>=0.29,<1",
        "matplotlib>=3.7,<4",
        # traces (pagetier record/heatmap/report) are Parquet files
        "pyarrow>=14,<25",
        "pandas>=2,<4",
        # the ILP oracle of `pagetier bench sim` (its default runs it)
        "highspy>=1.7,<2",
        # the daemon's --metrics endpoint (Prometheus text format)
        "prometheus-client>=0.17,<1",
    ],
    extras_require={
        # build: tests/test_packaging.py builds the sdist and wheel as a release would
        # import-linter: tests/test_layering.py checks the layers (contracts in pyproject.toml)
        "test": ["pytest>=7.4,<10", "virtme-ng>=1.30,<2", "gymnasium>=0.29,<2", "build>=1,<2",
                 "import-linter>=2.16,<3",
                 # tests/test_deploy.py validates deploy/'s manifests against the Kubernetes schema
                 "kubernetes-validate>=1.28,<2", "PyYAML>=6,<7"],
        "trace": [],  # kept for old install lines: pyarrow and pandas are core now
        "rl": ["gymnasium>=0.29,<2"],
        "ilp": ["highspy>=1.7,<2"],  # kept for old install lines: highspy is core now
        "torch": ["torch>=2.2,<=2.13.0"],
    },
    entry_points={"console_scripts": ["pagetier=pagetier.cli:main"]},
)
