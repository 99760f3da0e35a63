"""hexagent_gym.agents.callbacks.plot_scalars / scalars_figure: the x data are the TensorBoard
events' own steps, each axis names what its step counts and what its scalar is, and the tick
labels stay readable (no two overlap on the rendered figure)."""

from __future__ import annotations

import itertools

import matplotlib
import numpy as np
import pytest

from hexagent_gym.agents.callbacks import plot_scalars, scalars_figure

matplotlib.use("Agg")

# env-step curves over a range whose plain tick labels ("10000 12000 ...") used to collide, a
# long run reaching millions, and the imitation stage logged per epoch and per DAgger round
STEPS = {
    "eval/req99": [0, 10_240, 20_480],
    "hexagent/req99": [0, 10_240, 20_480],
    "rollout/ep_rew_mean": list(range(6_144, 20_481, 2_048)),
    "train/approx_kl": [2_048 * k for k in range(1, 700, 7)],
    "bc/accuracy": [1, 2, 3, 4],
    "dagger/on_policy_accuracy": [1, 2, 3],
}
PANELS = (
    ("imitation", ("bc/accuracy", "dagger/on_policy_accuracy")),
    ("eval Req99", ("eval/req99", "hexagent/req99")),
    ("relative return", ("rollout/ep_rew_mean",)),
    ("PPO", ("train/approx_kl",)),
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from torch.utils.tensorboard import SummaryWriter

    path = tmp_path_factory.mktemp("run")
    writer = SummaryWriter(str(path))
    for tag, steps in STEPS.items():
        for i, step in enumerate(steps):
            writer.add_scalar(tag, 1.0 + 0.01 * i, step)
    writer.close()
    return path


def _overlaps(boxes) -> list[tuple[int, int]]:
    return [(i, j) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2)
            if a.overlaps(b)]


def test_axes_plot_the_true_steps_with_labels_and_readable_ticks(run_dir):
    import matplotlib.pyplot as plt

    fig = scalars_figure(run_dir, PANELS)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        axes = fig.axes
        assert len(axes) == len(PANELS)
        for ax, (title, tags) in zip(axes, PANELS, strict=True):
            assert ax.get_title() == title
            lines = {line.get_label(): line for line in ax.lines}
            assert set(lines) == set(tags)
            for tag in tags:  # x is each event's step, not its index or an epoch count
                np.testing.assert_array_equal(lines[tag].get_xdata(), STEPS[tag])
            assert ax.get_ylabel().strip()
            labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
            assert len(labels) >= 2
            boxes = [t.get_window_extent(renderer) for t in labels]
            assert not _overlaps(boxes), [t.get_text() for t in labels]
        imitation, req99, ret, ppo = axes
        assert imitation.get_xlabel() == "BC epoch / DAgger round"
        assert imitation.get_ylabel() == "accuracy / on_policy_accuracy"
        assert req99.get_xlabel() == ret.get_xlabel() == ppo.get_xlabel() == "env steps"
        assert req99.get_ylabel() == "req99" and ret.get_ylabel() == "ep_rew_mean"
        # engineering ticks on env steps (20k, 1M), whole numbers on epochs
        assert any(t.get_text().endswith("k") for t in ret.get_xticklabels())
        assert any(t.get_text().endswith("M") for t in ppo.get_xticklabels())
        ticks = [t for t in imitation.get_xticks() if 1 <= t <= 4]
        assert ticks and all(float(t).is_integer() for t in ticks)
    finally:
        plt.close(fig)


def test_an_explicit_x_label_wins_and_missing_tags_are_skipped(run_dir):
    import matplotlib.pyplot as plt

    fig = scalars_figure(run_dir, (("custom", ("eval/req99", "no/such_tag"), "updates"),))
    try:
        (ax,) = fig.axes
        assert ax.get_xlabel() == "updates" and ax.get_ylabel() == "req99 / such_tag"
        assert [line.get_label() for line in ax.lines] == ["eval/req99"]
    finally:
        plt.close(fig)


def test_plot_scalars_writes_the_png(run_dir, tmp_path):
    out = plot_scalars(run_dir, tmp_path / "img" / "curves.png", PANELS)
    assert out == tmp_path / "img" / "curves.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
