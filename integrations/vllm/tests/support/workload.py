"""The real-engine benchmark's agent workload, seeded.

A shared 256-token system prompt, a 256-token task per session; each turn
generates 16-48 tokens (uniform, ignore_eos, greedy), then a tool call of
min(3 s, 0.1 s x lognormal(0, 0.8)) returns 200-600 random tokens. The next
turn's prompt = the previous prompt + its output + the tool result.

A skewed start (`long_sessions`, `arrival_sec`; both off by default): the
first `long_sessions` sessions carry a task of `long_task_tokens`, and session
s starts `s x arrival_sec` seconds after the first.
"""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class Workload:
    sessions: int = 24
    turns: int = 10
    system_tokens: int = 256
    task_tokens: int = 256
    output_range: tuple[int, int] = (16, 48)
    tool_result_range: tuple[int, int] = (200, 600)
    tool_median_sec: float = 0.1
    tool_sigma: float = 0.8
    tool_max_sec: float = 3.0
    seed: int = 0
    long_sessions: int = 0
    long_task_tokens: int = 2048
    arrival_sec: float = 0.0

    def system_prompt(self) -> list[int]:
        rng = random.Random(f"{self.seed}/system")
        return [rng.randrange(3, 4000) for _ in range(self.system_tokens)]

    def session(self, index: int) -> "SessionScript":
        return SessionScript(self, index)


class SessionScript:
    """The random choices of one session, independent of timing and of other sessions."""

    def __init__(self, w: Workload, index: int) -> None:
        self.w = w
        self.index = index
        self.rng = random.Random(f"{w.seed}/session/{index}")
        task = w.long_task_tokens if index < w.long_sessions else w.task_tokens
        self.first_prompt = w.system_prompt() + [self.rng.randrange(3, 4000) for _ in range(task)]
        self.start_sec = index * w.arrival_sec

    def output_tokens(self) -> int:
        return self.rng.randint(*self.w.output_range)

    def tool_call(self) -> tuple[float, list[int]]:
        sec = min(self.w.tool_max_sec, self.w.tool_median_sec * self.rng.lognormvariate(0.0, self.w.tool_sigma))
        n = self.rng.randint(*self.w.tool_result_range)
        return sec, [self.rng.randrange(3, 4000) for _ in range(n)]
