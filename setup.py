"""pagetier: kernel-assisted page-access profiler and tiered-memory migration daemon."""
import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
# The one version: kmod/include/uapi/linux/pagetier.h (read by the module and by user space).
_uapi = (HERE / "kmod/include/uapi/linux/pagetier.h").read_text()
VERSION = ".".join(
    re.search(rf"#define PAGETIER_VERSION_{p}\s+(\d+)", _uapi).group(1)
    for p in ("MAJOR", "MINOR", "PATCH")
)

setup(
    name="pagetier",
    version=VERSION,
    description="Kernel-assisted page-access profiler and tiered-memory migration daemon",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="GPL-2.0-only",
    python_requires=">=3.11",
    # One import package, pagetier; its parts live in the repository's top-level folders.
    packages=["pagetier", "pagetier.profiler", "pagetier.daemon", "pagetier.policies"],
    package_dir={
        "pagetier": "pagetier",
        "pagetier.profiler": "profiler",
        "pagetier.daemon": "daemon",
        "pagetier.policies": "policies",
    },
    # the built-in trace set (pagetier bench traces), recorded by scripts/record_traces.py
    package_data={"pagetier.policies": ["traces/*.parquet", "traces/index.json"]},
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
    ],
    extras_require={
        "test": ["pytest>=7.4,<10", "virtme-ng>=1.30,<2", "highspy>=1.7,<2", "gymnasium>=0.29,<2"],
        "trace": [],  # kept for old install lines: pyarrow and pandas are core now
        "rl": ["gymnasium>=0.29,<2"],
        "ilp": ["highspy>=1.7,<2"],
        "torch": ["torch>=2.2,<=2.13.0"],
    },
    entry_points={"console_scripts": ["pagetier=pagetier.cli:main"]},
)
