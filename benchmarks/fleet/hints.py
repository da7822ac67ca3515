"""What a cell-length hint could buy (issue 16's next lever), measured before anyone builds it.

    python -m benchmarks.fleet --seeds 1-20 --hints

A scheduler cannot know how long a cell will use the GPU, but the kernel often has a good
guess: a cell run before in the same kernel, unchanged, tends to take what it took then. The
clairvoyant reference (``oracle``) shows what exact lengths buy; this one tells it
estimates instead, from a hint of stated quality, and keeps everything else (its order,
shortest estimated remaining work first; its quantum cut when the winner's estimate plus the
memory moves is less than the holder's; every rule of the product):

* **The hint** (``HintModel``): a GPU cell re-runs an earlier one with probability
  ``coverage``, and then its hint is its true length times a lognormal factor of sigma
  ``noise`` (the same cell's GPU time moves from run to run with its data, caches and the
  rest of the machine). Other cells have none. Each cell's draw is its own (seed, notebook,
  start), so the runs of one seed hint the same cells, and a lower coverage hints a subset of
  a higher one's.
* **The estimate** of a request's remaining work, from its work done so far: the hint less
  that while the hint is larger; without a hint, or past it, the larger of ``prior`` (the
  median cell, 6 s) less the work done and the work done itself. A fresh cell is expected to
  be typical, and one that has run past that to run as long again (the mean residual life of
  a heavy-tailed length grows with age).

With ``coverage`` 1 and ``noise`` 0 the estimate is the truth, and the run is the clairvoyant
reference's to the last figure (tests/policy/test_fleet_hints.py). With ``coverage`` 0 it is
what the estimator alone gives, the floor any hinted policy of this form starts from. Like the
oracle it runs on the pure Python core, in worker processes of its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchmarks.fleet.oracle import Remaining, install

if TYPE_CHECKING:
    from benchmarks.fleet.workload import Cell
    from nodeside.testing import Replay

#: The prefix of the fleet's ``policy`` names for hinted runs: ``hints:COVERAGE:NOISE``.
PREFIX = "hints:"
#: Seconds: the estimate of a fresh cell without a hint, the workload's median GPU burst.
PRIOR = 6.0


@dataclass(frozen=True)
class HintModel:
    coverage: float  # the fraction of GPU cells that come with a hint
    noise: float  # sigma of the lognormal factor between a hint and the cell's true length
    prior: float = PRIOR

    def __post_init__(self) -> None:
        if not 0.0 <= self.coverage <= 1.0 or self.noise < 0.0 or self.prior <= 0.0:
            raise ValueError(f"a hint model needs coverage in [0, 1], noise >= 0 and a "
                             f"positive prior, not {self}")

    @property
    def policy(self) -> str:
        """Its name as the fleet's ``policy`` (``parse`` reads it back)."""
        return f"{PREFIX}{self.coverage:g}:{self.noise:g}"

    @classmethod
    def parse(cls, policy: str) -> HintModel | None:
        """The model a ``policy`` name stands for, or None for any other policy."""
        if not policy.startswith(PREFIX):
            return None
        coverage, _, noise = policy.removeprefix(PREFIX).partition(":")
        try:
            return cls(float(coverage), float(noise or 0))
        except ValueError:
            raise ValueError(f"a hinted policy looks like {PREFIX}0.7:0.3 (coverage, noise), "
                             f"not {policy!r}") from None

    def hint(self, seed: int, cell: Cell) -> float | None:
        """The hint ``cell`` comes with, if any: the same answer every time it is asked."""
        draw = random.Random(f"{seed}/{cell.notebook}/{cell.start!r}")
        if draw.random() >= self.coverage:
            return None
        return cell.burst * draw.lognormvariate(0.0, self.noise)

    def estimate(self, hint: float | None, done: float) -> float:
        """Seconds of GPU work expected to remain of a cell that has done ``done``."""
        if hint is not None and hint > done:
            return hint - done
        return max(self.prior - done, done)


def estimated_work(replay: Replay, open_cells: dict[str, Cell], seed: int,
                   model: HintModel) -> Remaining:
    """Each client's estimated remaining work at ``now``: its cell in progress, its hint and
    the work the replay has done of it."""
    def remaining(client_id: str, now: float) -> float:
        worker, cell = replay.workers.get(client_id), open_cells.get(client_id)
        if worker is None or cell is None:
            return model.prior
        return model.estimate(model.hint(seed, cell), max(0.0, cell.burst - worker.left(now)))
    return remaining


def install_hinted(replay: Replay, open_cells: dict[str, Cell], seed: int,
                   model: HintModel) -> None:
    """Put the hinted reference in place of a fleet replay's interactive policy."""
    install(replay, remaining=estimated_work(replay, open_cells, seed, model))


#: The hinted runs ``--hints`` adds (label, mode, TQ, policy, link): no hints (the estimator
#: alone), then hints of falling quality.
HINT_RUNS = tuple(
    (label, "on", 10.0, HintModel(coverage, noise).policy, "gen4")
    for label, coverage, noise in (
        ("hinted, TQ 10 s: no hints (the estimate alone)", 0.0, 0.0),
        ("hinted, TQ 10 s: 70% of cells, noise 0.3", 0.7, 0.3),
        ("hinted, TQ 10 s: 70% of cells, noise 0.7", 0.7, 0.7),
        ("hinted, TQ 10 s: 50% of cells, noise 0.5", 0.5, 0.5),
    ))
