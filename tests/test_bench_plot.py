"""bench sim's plot: every policy a labelled row in each trace's panel, every run's time
against static placement written beside its bar, and a far-off policy clipped."""
import pytest

from pagetier.bench import sim


def run(trace, cap, policy, vs):
    return {"trace": trace, "capacity": cap, "policy": policy, "vs_static": vs}


ROWS = [run(t, c, p, v) for t in ("a", "b") for c in ("10%", "50%") for p, v in (
    ("oracle", -0.004), ("first-touch", 0.9), ("lru", 0.031), ("heuristic", 0.0002))] + [
    run("a", "10%", "static", 0.0)]


def test_every_policy_is_a_row_with_its_values_written():
    import matplotlib.pyplot as plt

    fig = sim.figure(ROWS)
    try:
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in panels] == ["a", "b"]
        for ax in panels:
            assert [t.get_text() for t in ax.get_yticklabels()] == [
                "oracle", "first-touch", "lru", "heuristic"]  # static is the zero line
            texts = [t.get_text() for t in ax.texts]
            assert texts.count("-0.4%") == 2 and texts.count("+3.1%") == 2
            assert texts.count("+0.02%") == 2 and texts.count("+90.0%") == 2
            lo, hi = ax.get_xlim()
            assert hi < 20  # first-touch clipped: the axis shows the others' differences
            assert lo < -0.4 * 1.0
    finally:
        plt.close(fig)


@pytest.mark.parametrize("far,clipped", [(0.9, True), (0.05, False)])
def test_only_a_far_off_policy_is_clipped(far, clipped):
    rows = [run("a", "10%", "first-touch", far), run("a", "10%", "lru", 0.031)]
    limit = sim._plot_limit(rows)
    assert (limit < far) is clipped and limit > 0.031


def test_labels_tell_a_tie_from_a_tiny_difference():
    """(in percent)"""
    assert [sim._percent(v) for v in (0.0, 0.00001, -0.00003, 0.02, -0.004, 3.1)] == [
        "0.0%", "+<0.01%", "-<0.01%", "+0.02%", "-<0.01%", "+3.1%"]
