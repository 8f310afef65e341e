"""Plots and CSV artifacts that tell the truth (issue 15, item 5): real matplotlib (Agg), plain data."""

from __future__ import annotations

import csv
import io
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import FillBetweenPolyCollection, PathCollection
from matplotlib.colors import BoundaryNorm, ListedColormap, to_rgba

from lcfed.run.result import RunResult
from lcfed.tracking import (
    ROUND_AXIS,
    MLflowObserver,
    accuracy_figure,
    assignment_history_csv,
    history_csv,
    read_assignment_history,
)
from tests.conftest import tiny_config
from tune_jobs.sweep.figures import assignment_figure, comparable_values, mu_lambda_figure


def _history(rounds: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    out = []
    for r in range(rounds):
        mean = 0.3 + 0.6 * r / rounds
        out.append({"round": float(r), "acc_mean": mean, "acc_weighted": mean + 0.01, "acc_p10": mean - 0.15,
                    "acc_p90": mean + 0.1, "train_loss": float(rng.random())})
    return out


class _Client:
    """Collects what the observer logs (the MLflow client's log_text / log_figure)."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.figures: dict[str, object] = {}

    def log_text(self, run_id: str, text: str, path: str) -> None:
        self.texts[path] = text

    def log_figure(self, run_id: str, fig: object, path: str) -> None:
        self.figures[path] = fig


def _draw(fig):
    """Lay the (closed, canvas-less) figure out as savefig / MLflow's log_figure would; its renderer."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _header_ok(text: str) -> list[str]:
    first = text.splitlines()[0]
    assert "#" not in first and not text.startswith("#")
    header = next(csv.reader(io.StringIO(text)))
    frame = pd.read_csv(io.StringIO(text))
    assert list(frame.columns) == header
    return header


def test_csv_artifacts_start_with_a_plain_header():
    obs = MLflowObserver.__new__(MLflowObserver)  # only what _artifacts touches: no store needed
    obs.run_id, obs.client, obs.cfg = "r", _Client(), tiny_config("train.rounds=4")
    obs.assignments, obs.assignment_rounds = [], []
    hist = _history(4)
    for r in range(4):
        obs.assignments.append(np.array([0, 1, 1, r % 2, -1]))
        obs.assignment_rounds.append(r)
    obs._artifacts(RunResult(final=hist[-1], history=hist, assignment=obs.assignments[-1]))
    texts = obs.client.texts
    assert set(texts) == {"metrics/history.csv", "clusters/assignment.csv", "clusters/assignment_history.csv"}
    for text in texts.values():
        _header_ok(text)
    assert _header_ok(texts["clusters/assignment_history.csv"]) == ["round"] + [f"device_{d}" for d in range(5)]
    frame = pd.read_csv(io.StringIO(texts["clusters/assignment_history.csv"]))
    assert frame["round"].tolist() == [0, 1, 2, 3] and frame["device_3"].tolist() == [0, 1, 0, 1]
    metrics = pd.read_csv(io.StringIO(texts["metrics/history.csv"]))
    assert metrics.columns[0] == "round" and metrics["round"].tolist() == [0, 1, 2, 3]
    assert "plots/accuracy.png" in obs.client.figures


def test_assignment_history_round_trips_and_reads_the_old_commented_form():
    hist = np.array([[0, 1, 2], [2, 1, 0]])
    rounds, back = read_assignment_history(assignment_history_csv(hist, [5, 6]))
    assert rounds.tolist() == [5, 6] and back.tolist() == hist.tolist()
    old = "# row = round, column = device\n0,1,2\n2,1,0\n"
    rounds, back = read_assignment_history(old)
    assert rounds.tolist() == [0, 1] and back.tolist() == hist.tolist()
    assert history_csv([]) == "\n"


def test_accuracy_plot_x_is_the_mlflow_step_and_the_legend_leaves_the_band_free():
    hist = _history(30)
    fig = accuracy_figure(hist, tiny_config())
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 2
    for line in lines:
        assert list(line.get_xdata()) == [int(r["round"]) for r in hist] == list(range(30))
    assert "MLflow step" in ax.get_xlabel() and ax.get_xlabel() == ROUND_AXIS
    band = next(c for c in ax.collections if isinstance(c, FillBetweenPolyCollection))
    xs = band.get_paths()[0].vertices[:, 0]
    assert xs.min() == 0 and xs.max() == 29
    renderer = _draw(fig)
    legends = fig.legends + ([ax.get_legend()] if ax.get_legend() else [])
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    assert not box.overlaps(ax.get_window_extent(renderer))  # outside the axes: it hides nothing
    assert not box.overlaps(band.get_window_extent(renderer))
    assert {t.get_text() for t in legends[0].get_texts()} == {"acc_p10–acc_p90", "acc_mean", "acc_weighted"}


def test_assignment_heatmap_has_one_categorical_colour_per_cluster():
    hist = np.array([[0, 1, 2, 3], [3, 2, 1, 0], [0, 0, 2, 2]])
    fig = assignment_figure(hist, [10, 11, 12])
    im = fig.axes[0].get_images()[0]
    cmap, norm = im.get_cmap(), im.norm
    assert isinstance(cmap, ListedColormap) and isinstance(norm, BoundaryNorm)
    assert cmap.N == 4 and norm.Ncmap == 4 and len(norm.boundaries) == 5
    colours = {tuple(c) for c in cmap(np.arange(4))}
    assert len(colours) == 4  # N distinct colours
    bar = fig.axes[1]
    assert [t.get_text() for t in bar.get_yticklabels()] == ["0", "1", "2", "3"]
    assert list(bar.get_yticks()) == [0, 1, 2, 3]
    # each cell's colour is its cluster's colour
    rgba = cmap(norm(im.get_array()))
    for (r, d), c in np.ndenumerate(hist):
        assert tuple(rgba[r, d]) == tuple(cmap(c))
    _draw(fig)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()] == ["10", "11", "12"]


def test_assignment_heatmap_greys_unassigned_and_skips_no_colour_for_sparse_ids():
    hist = np.array([[-1, 0, 5], [5, 5, -1]])
    fig = assignment_figure(hist)
    im = fig.axes[0].get_images()[0]
    cmap = im.get_cmap()
    assert cmap.N == 3  # unassigned, 0, 5
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["unassigned", "0", "5"]
    r, g, b, _ = cmap(0)
    assert r == g == b  # neutral grey
    assert im.get_array()[0, 0] == 0 and im.get_array()[0, 2] == 2


def _trials() -> list[dict]:
    # two finished trials (rounds 0-7), two stopped by ASHA after round 1: at round 1 the early ones look best
    return [
        {"mu": 0.01, "lam": 0.1, "rounds": list(range(8)), "values": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]},
        {"mu": 0.1, "lam": 1.0, "rounds": list(range(8)), "values": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7]},
        {"mu": 1.0, "lam": 0.01, "rounds": [0, 1], "values": [0.3, 0.45]},
        {"mu": 10.0, "lam": 10.0, "rounds": [0, 1], "values": [0.2, math.nan]},
    ]


def test_mu_lambda_map_colours_only_values_of_the_same_round():
    at, values = comparable_values(_trials())
    assert at == 7 and values == [0.8, 0.7, None, None]
    fig = mu_lambda_figure(_trials())
    ax = fig.axes[0]
    assert "round 7" in ax.get_title()
    filled, hollow = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert filled.get_array().tolist() == [0.8, 0.7]  # the only coloured values: both at round 7
    assert filled.get_offsets().tolist() == [[0.01, 0.1], [0.1, 1.0]]
    assert hollow.get_array() is None and len(hollow.get_facecolors()) == 0  # hollow, no colour value
    assert hollow.get_offsets().tolist() == [[1.0, 0.01], [10.0, 10.0]]
    assert tuple(hollow.get_edgecolors()[0]) == to_rgba("0.4")
    assert "round 7" in fig.axes[1].get_ylabel()  # the colour bar names the round
    assert fig.legends and "stopped before round 7" in fig.legends[0].get_texts()[-1].get_text()


def test_mu_lambda_map_of_trials_that_all_finished_colours_them_all():
    trials = _trials()[:2]
    fig = mu_lambda_figure(trials)
    ax = fig.axes[0]
    (filled,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert filled.get_array().tolist() == [0.8, 0.7] and not fig.legends
    assert ax.get_xscale() == "log"
