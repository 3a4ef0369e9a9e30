"""The core every other part of pagetier builds on: page units and samples, the per-unit state,
the move planner, and the one move_pages wrapper.

Layers (tests/test_layering.py checks them with import-linter; the contract is in
pyproject.toml), each importing only the ones below it:

    the CLI, bench and tools      pagetier.cli, pagetier.live_bench, pagetier.vm, ...
    daemon/                       the daemon: targets, interval step, executor, reporting
    policies/     profiler/       placement policies and the simulator | access-count backends
    core                          pagetier.core, pagetier.errors, pagetier.uapi

policies/ and profiler/ do not import each other: what both need (Sample, PAGE_SIZE) is here.
"""
