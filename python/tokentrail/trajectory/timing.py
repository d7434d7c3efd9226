"""Per-turn timing: seconds spent in each `Stage` of a turn, the engine's share apart."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tokentrail.kinds import Stage


@dataclass
class TurnTiming:
    """Seconds one turn spent in each stage, and what the engine reported of its own time."""

    stages: dict[Stage, float] = field(default_factory=dict)
    engine_reported: float | None = None
    _mark: float = field(default_factory=time.perf_counter, repr=False)

    def lap(self, stage: Stage) -> None:
        """Charge the time since the previous lap (or since the timing began) to `stage`."""
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self._mark
        self._mark = now

    @property
    def overhead(self) -> float:
        """Seconds spent in the adapter: every stage but the engine's."""
        return sum(v for k, v in self.stages.items() if k is not Stage.ENGINE)
