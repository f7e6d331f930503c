"""One tuning protocol for every method, and the statistics that turn its runs into verdicts —
the machinery of the one-protocol benchmark (notebook 06).

**Tuning.** Each method has a grid of :class:`Axis` (the knobs every method shares — server step,
local learning rate — and its own); :func:`method_design` gives every method the same number of
configurations, Latin columns chosen by a declared criterion (the smallest largest |Spearman ρ|,
one common design of the shared knobs: :mod:`~fairfl.studies.protocol.design`), :func:`edge_extensions`
names the configurations that continue a winning grid edge knob by knob, and :func:`select`
chooses on the clients' *validation* splits by a stated criterion. The choice cannot see the test
split: :func:`validation_score` reads only ``History.val_acc``, and :func:`select` sees the
histories through :class:`ValidationView`, which has no test scores.

Criteria (of the clients' validation accuracies at the last evaluation, averaged over the tuning
seeds): ``"mean"``, ``"worst10"`` (mean of the worst 10 % of clients), ``"mean-std"`` (mean minus
the clients' standard deviation: accuracy and fairness with equal weight).

**Federations that can speak.** :func:`constant_accuracy` is the best constant predictor's
validation accuracy; a federation enters the tables and the claims of a track only where the
track's trained reference beats it (:func:`speaks`), and a method that does not beat it stays out
of the claims.

**Statistics over seeds** (see the comment above :func:`subset_means`): seed-paired differences,
exact sign-flip intervals that stay inside the metric's range, three-valued verdicts against
declared margins (:class:`Comparison`, :class:`Claim`, :func:`judge`) under Holm's correction with
Shaffer's refinement over the declared claims, Benjamini–Hochberg q-values on the exploratory table
(:func:`summary`); the power of that exact test, the smallest difference it detects, how many seeds
must agree and the plan of seeds from a pilot (:mod:`~fairfl.studies.protocol.power`).

**Outputs.** :func:`write_table` / :func:`read_table`: CSV files with a first line naming their
kind, schema and protocol version; :func:`client_rows` gives a run's long-format rows (one per
client and split, a diverged run's included).

The modules: :mod:`~fairfl.studies.protocol.scores` (criteria, reported metrics and their ranges, a run's
numbers and rows, identical runs, the Pareto front), :mod:`~fairfl.studies.protocol.tuning` (grids, the
choice on validation, federations that can speak), :mod:`~fairfl.studies.protocol.design` (tuning
designs, coverage, edge extensions), :mod:`~fairfl.studies.protocol.statistics` (sign-flip p-values and
intervals, Holm–Shaffer, Benjamini–Hochberg), :mod:`~fairfl.studies.protocol.power` (power, detectable
differences, agreeing seeds, pilots and plans), :mod:`~fairfl.studies.protocol.verdicts` (the tables and
the claims' verdicts), :mod:`~fairfl.studies.protocol.files` (the CSV files). Every name is importable
from ``fairfl.studies.protocol``."""
from .files import SCHEMAS, read_table, write_table  # noqa: F401
from .scores import (CRITERIA, LOWER_IS_BETTER, METRIC_RANGE, REPORTED, SCORED, client_rows,  # noqa: F401
                     difference_range, identical_runs, local_steps, metric_label, never_sampled, pareto_front,
                     reported, run_scores)
from .statistics import (DRAWS, EXACT_SEEDS, benjamini_hochberg, bounds, holm, location, p_greater,  # noqa: F401
                         p_less, p_two_sided, paired, possibly_true, subset_means)
from .power import (PowerConstant, agreement_table, allocate_seeds, best_case_p, detectable_difference, fewest_agreeing,  # noqa: F401
                    pilot_scores, pilot_spreads, power_at, power_constant, rejections_allowed, seed_plan)
from .tuning import (Axis, ValidationView, constant_accuracy, point_label, select, speaks,  # noqa: F401
                     validation_score)
from .design import (SHARED, Design, best_columns, check_designs, coverage, edge_extensions, largest_correlation,  # noqa: F401
                     method_design, shared_design, spearman)
from .verdicts import (CONTRADICTED, INCONCLUSIVE, KEYS, KINDS, NOT_JUDGED, SUPPORTED, SUPPORTED_BELOW,  # noqa: F401
                       Claim, Comparison, judge, summary, wide)
