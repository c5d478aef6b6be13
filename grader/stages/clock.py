"""The seconds one submission spends in each stage (StageClock: the result's stage_s), and the
time it waits for its GPU's turn (held)."""

from __future__ import annotations

import contextlib
import time
from grader.stages.turns import Gate


@contextlib.contextmanager
def held(hold, gate: Gate | None, clock: "StageClock"):
    """hold(gate), gate.shared or gate.alone, with the time its turn took as "wait" on the clock.
    Without a gate nothing is waited for and nothing is counted (a loaded machine's scheduling
    is no wait)."""
    asked = time.monotonic()
    with hold(gate) as held:
        if gate is not None:
            clock.waited(time.monotonic() - asked)
        yield held


class StageClock:
    """The seconds one submission spent in each stage (the result's stage_s): the build's, then
    each of run, check and time from its start to its stop, then the parts of a stage that its
    process measured ("run.subject": results.RUN_PHASES; "time.loop": TIME_PHASES). The stage's
    own figure holds its parts, except for a run begun early (Lookahead), whose parts up to
    "waiting" overlapped the submission before it. "wait": time spent waiting for a preparation
    to end, or for the GPU's gate when run stages share it (waited)."""

    def __init__(self, build_s: float):
        self._seconds = {"build": build_s}
        self._parts: dict[str, float] = {}
        self._stage, self._since = "", 0.0

    def waited(self, seconds: float) -> None:
        """Time in no stage: waiting for this submission's preparation to end at its turn
        (Lookahead), or for its GPU's gate (gate.py); "wait" in stage_s when there was any."""
        if seconds > 0.001:
            self._seconds["wait"] = self._seconds.get("wait", 0.0) + seconds

    def parts(self, stage: str, seconds: dict[str, float]) -> None:
        self._parts.update({f"{stage}.{part}": s for part, s in seconds.items()})

    def start(self, stage: str) -> None:
        self.stop()
        self._stage, self._since = stage, time.monotonic()

    def stop(self) -> None:
        if self._stage:
            self._seconds[self._stage] = time.monotonic() - self._since
            self._stage = ""

    def seconds(self) -> tuple[tuple[str, float], ...]:
        self.stop()
        return tuple((stage, round(s, 3)) for stage, s in {**self._seconds, **self._parts}.items())
