"""The papers' reported numbers, as data, for side-by-side tables (never used to produce ours).

Sources are the texts in ``shared/papers`` (REPRODUCTION.md lists them)."""
from __future__ import annotations

# FedMGDA+ Table 7 (Adult, 500 rounds, 5 seeds): test accuracy %, (uniform, PhD, non-PhD).
# Uniform = accuracy over all test samples (non-PhD dominates it).
FEDMGDA_TABLE7: dict[tuple[str, float], tuple[float, float, float]] = {
    ("AFL", 0.0): (83.26, 77.90, 83.32),
    ("AFL", 0.01): (83.28, 76.58, 83.36),
    ("AFL", 0.1): (82.30, 74.59, 82.39),
    ("AFL", 1.0): (81.86, 74.25, 81.94),
    ("q-FedAvg (q=5)", 0.0): (83.26, 76.80, 83.33),
    ("q-FedAvg (q=5)", 1000.0): (83.34, 76.57, 83.41),
    ("q-FedAvg (q=5)", 5000.0): (81.19, 74.14, 81.27),
    ("q-FedAvg (q=5)", 10000.0): (81.07, 73.48, 81.16),
    ("q-FedAvg (q=2)", 0.0): (83.30, 76.46, 83.38),
    ("q-FedAvg (q=2)", 1000.0): (83.33, 76.24, 83.41),
    ("q-FedAvg (q=2)", 5000.0): (83.11, 75.69, 83.20),
    ("q-FedAvg (q=2)", 10000.0): (82.50, 75.69, 82.58),
    ("q-FedAvg (q=0.1)", 0.0): (83.44, 76.46, 83.52),
    ("q-FedAvg (q=0.1)", 1000.0): (83.34, 76.35, 83.42),
    ("q-FedAvg (q=0.1)", 5000.0): (83.35, 76.57, 83.42),
    ("q-FedAvg (q=0.1)", 10000.0): (83.36, 76.80, 83.43),
    ("FedMGDA+", float("nan")): (83.24, 76.58, 83.32),   # "arbitrary" bias
    ("PhD only", float("nan")): (81.05, 72.82, 81.14),
}
