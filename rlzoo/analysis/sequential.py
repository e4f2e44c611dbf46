"""Adding seeds until a difference is resolved, with a false-positive rate that stays at 5 %.

``rlzoo sweep --until-resolved`` looks at the differences to the baseline after every round
of seeds and stops adding seeds to a group once its difference is resolved. Looking again
and again at a 95 % interval would declare a difference that is not there far more often
than 5 % of the time (in simulation: 11 % over 5 looks, 17 % over 9;
``benchmarks/interval_calibration.py``).
The procedure here is a group-sequential design with **repeated confidence intervals and a
Bonferroni bound** (Jennison and Turnbull 2000, *Group Sequential Methods with Applications
to Clinical Trials*, ch. 9): the K looks the budget allows are fixed before the first one
(the first round's seeds, then one seed per group per round up to ``--max-seeds``), and
each look's interval has level 1 − α/K. By the union bound, the chance that any of the K
intervals excludes a true difference of 0 is at most K · α/K = α, whatever the correlation
between the looks, so the false-positive rate of each comparison stays at or below α = 5 %
(simulated: ``tests/test_calibration.py``). It is conservative (an O'Brien–Fleming spending
function would spend less α early and more late); its price is a wider interval at each
look, which is what a budget of few seeds can afford to be honest about.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo.analysis.report import percent

ALPHA = 0.05
MAX_SEEDS = 6
"""``--max-seeds``'s default: the budget of seeds per group."""


@dataclass(frozen=True)
class SequentialDesign:
    """The looks of an ``--until-resolved`` sweep.

    :ivar first: seeds per group at the first look (at least 2).
    :ivar max_seeds: seeds per group at the last look (the budget).
    :ivar alpha: the false-positive rate each comparison is held to over all looks.
    """

    first: int
    max_seeds: int
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        if self.first < 2:
            raise ValueError(f"the first look needs at least 2 seeds per group, got {self.first}")
        if self.max_seeds < self.first:
            raise ValueError(f"--max-seeds {self.max_seeds} is below the first round's {self.first} seeds")

    @property
    def looks(self) -> int:
        """K: one look at ``first`` seeds per group, then one after each added seed."""
        return self.max_seeds - self.first + 1

    @property
    def level(self) -> float:
        """Each look's interval level, 1 − α/K."""
        return 1 - self.alpha / self.looks

    def describe(self) -> str:
        return (f"{self.looks} looks at most ({self.first} to {self.max_seeds} seeds per group), each interval at "
                f"{percent(self.level)}: {percent(self.alpha)} split over the looks (Bonferroni), so each "
                f"difference's false-positive rate stays at or below {percent(self.alpha)}")
