"""Benchmarks of the placement policies: ``sim`` (traces replayed in the simulator, the oracle
and static placement), ``live`` with ``live_table`` (the policies in the test VM against the
kernel's own tiering), ``kernel_tiering`` (that baseline: NUMA balancing's tiering mode and
DAMOS migrate_hot/cold, set up and put back). Their commands are in pagetier/cli/bench.py;
scripts/bench_*.py are the developer benchmarks that build on them."""
