"""The migration daemon: read counts, ask a policy, move pages within budget and rate."""
