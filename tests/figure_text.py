"""Where a drawn figure's text lands, for the tests that no label is cut off at the figure's
edge or drawn over another one: the renderer-based checks live in ``fairfl.base.figure_checks`` (so
that ``save_figure`` can record them in the PNG it writes); the tests import them from here."""
from __future__ import annotations

from fairfl.base.figure_checks import (  # noqa: F401
                                       bars_not_from_zero,
                                       cut_off,
                                       legends_over_panels,
                                       over_other_panels,
                                       overlapping,
                                       percent_outside,
                                       problems,
                                       renderer,
                                       shown_size_px,
                                       shown_texts,
                                       small_texts,
                                       smallest_text_pt,
                                       tick_labels,
                                       width_class,
                                       )
