"""Training curves from metrics.jsonl: a run that logged one step (a short quickstart) drew empty panels."""
import json

import pytest

from toolkit.train.plots import plot_training, training_figure

STEP = {"step": 2, "loss": 3.1, "acc_i": [0.2, 0.1], "simulated_tau": 1.2}


def test_one_logged_step_is_drawn_as_points_and_more_as_lines():
    one = training_figure([STEP])
    assert all(line.get_marker() == "." for ax in one.axes[:2] for line in ax.lines)
    two = training_figure([STEP, {**STEP, "step": 4}])
    assert all(line.get_marker() in (None, "None", "") for line in two.axes[0].lines)


def test_the_png_is_written_and_no_steps_are_refused(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0, "eval_engine_tau": 1.0}) + "\n")
    with pytest.raises(ValueError, match="no training steps logged yet"):
        plot_training(metrics, tmp_path / "t.png")
    metrics.write_text(json.dumps(STEP) + "\n")
    assert plot_training(metrics, tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
