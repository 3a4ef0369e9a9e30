#!/usr/bin/env python3
"""Train a small MLP on the CPU, annotated for pagetier's sentinel policy.

    pagetier run --policy sentinel --fast-budget 48M --json -- \\
        python scripts/sentinel_example.py --steps 8

The model (``--depth`` Linear layers of ``--width`` x ``--width`` floats, a ReLU between them)
is hooked with pagetier.torch_hooks: its parameters, gradients and large activations are
registered, and every layer's forward and backward start is a layer boundary. Iteration
``--profile-step`` is profiled. Each iteration prints a JSON line (loss, seconds, and the
fraction of the parameters on each NUMA node, asked with move_pages); the last line is
``{"event": "done", ...}``. Without a daemon the annotations are no-ops and it just trains.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def param_nodes(model) -> dict:
    """Fraction of the parameters' pages on each node (-errno for pages not present)."""
    from pagetier.daemon import mover

    addrs = []
    for p in model.parameters():
        st = p.untyped_storage()
        lo = st.data_ptr() & ~4095
        addrs.append(np.arange(lo, st.data_ptr() + st.nbytes(), 4096, dtype=np.uint64))
    nodes = mover.query_nodes(0, np.concatenate(addrs))
    vals, counts = np.unique(nodes, return_counts=True)
    return {str(int(v)): round(int(c) / len(nodes), 4) for v, c in zip(vals, counts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="training iterations (default 8)")
    ap.add_argument("--width", type=int, default=1024, help="layer width (default 1024: 4 MiB a layer)")
    ap.add_argument("--depth", type=int, default=4, help="Linear layers (default 4)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument("--profile-step", type=int, default=1, help="the iteration profiled (default 1)")
    ap.add_argument("--min-activation-kb", type=int, default=256,
                    help="register activations at least this big (default 256 KiB)")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    args = ap.parse_args(argv)
    for key in ("steps", "width", "depth", "batch"):
        if getattr(args, key) < 1:
            ap.error(f"--{key} must be >= 1")

    t0 = time.monotonic()
    import torch

    from pagetier import annotate, torch_hooks

    import_s = time.monotonic() - t0
    torch.manual_seed(0)
    layers = []
    for i in range(args.depth):
        layers.append(torch.nn.Linear(args.width, args.width))
        if i < args.depth - 1:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    x = torch.randn(args.batch, args.width)
    target = torch.tanh(x @ torch.randn(args.width, args.width) / args.width ** 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    hooks = torch_hooks.instrument(model, min_activation_bytes=args.min_activation_kb << 10)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"event": "start", "import_s": round(import_s, 2), "param_bytes": params,
                      "layers": len(hooks.layers), "annotations": annotate.enabled()}), flush=True)

    losses = []
    for step in range(args.steps):
        t = time.monotonic()
        profiling = step == args.profile_step
        if profiling:
            annotate.start_profile()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, target)
        opt.zero_grad(set_to_none=False)  # gradients keep their storage: registered once
        loss.backward()
        opt.step()
        if profiling:
            annotate.end_profile()
        losses.append(loss.item())
        print(json.dumps({"event": "step", "step": step, "loss": round(losses[-1], 6),
                          "s": round(time.monotonic() - t, 3), "profiled": profiling,
                          "param_nodes": param_nodes(model)}), flush=True)
    hooks.remove()
    print(json.dumps({"event": "done", "steps": args.steps, "first_loss": losses[0],
                      "last_loss": losses[-1], "s": round(time.monotonic() - t0, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
