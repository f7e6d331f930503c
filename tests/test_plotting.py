"""save_figure: both formats, atomically, and byte-identical when re-plotted."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fairfl.plotting import save_figure  # noqa: E402


def _plot(folder):
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [2, 0, 1])
    paths = save_figure(fig, "curve", folder)
    plt.close(fig)
    return paths


def test_writes_png_and_pdf_and_no_temporary_files(tmp_path):
    paths = _plot(tmp_path)
    assert sorted(p.name for p in paths) == ["curve.pdf", "curve.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.pdf", "curve.png"]
    assert {p.suffix: p.read_bytes()[:4] for p in paths} == {".png": b"\x89PNG", ".pdf": b"%PDF"}


def test_replotting_the_same_figure_gives_the_same_pdf(tmp_path, monkeypatch):
    # two plots at different times (matplotlib dates PDFs by SOURCE_DATE_EPOCH when set)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first = next(p for p in _plot(tmp_path) if p.suffix == ".pdf").read_bytes()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    again = next(p for p in _plot(tmp_path) if p.suffix == ".pdf").read_bytes()
    assert again == first


def test_accuracy_distribution_is_the_same_figure_for_the_same_results(tmp_path):
    """The strip's jitter comes from numpy's global generator: whatever its state, the same
    accuracies give the same PNG, and the caller's generator is left where it was."""
    import numpy as np
    from fairfl.plotting import accuracy_distribution
    acc = {"FedAvg": np.linspace(40, 90, 100), "FedAvg-n": np.linspace(35, 95, 100)}
    pngs = []
    for i, seed in enumerate((1, 2)):
        np.random.seed(seed)
        fig, ax = plt.subplots()
        accuracy_distribution(acc, ax=ax)
        after = np.random.random()
        np.random.seed(seed)
        assert after == np.random.random()                 # the caller's generator did not move
        pngs.append(next(p for p in save_figure(fig, f"dist{i}", tmp_path) if p.suffix == ".png").read_bytes())
        plt.close(fig)
    assert pngs[0] == pngs[1]
