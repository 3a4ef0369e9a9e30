"""The core every other part of pagetier builds on: page units and samples, the per-unit state,
the move planner, the one move_pages wrapper, and the registries of pluggable classes.

Layers (tests/test_layering.py checks them with import-linter; the contract is in
pyproject.toml), each importing only the ones below it:

    the CLI                       pagetier.cli (one module per command)
    bench, clients                pagetier.bench, pagetier.annotate, pagetier.torch_hooks
    daemon/                       the daemon: targets, interval step, executor, reporting
    policies/     profiler/       placement policies and the simulator | access-count backends
    core                          pagetier.core, pagetier.uapi, pagetier.protocol, pagetier.workload,
                                  pagetier.checkout; below them pagetier.errors

policies/ and profiler/ do not import each other: what both need (Sample, PAGE_SIZE) is here.
"""
