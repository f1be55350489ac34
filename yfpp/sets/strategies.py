"""The matcher of a set query for its evaluation strategy."""

from __future__ import annotations


from yfpp.errors import YfppError
from yfpp.language.pattern import (
    STRATEGIES,
    Pattern,
)
from yfpp.sets.direct import DirectMatcher
from yfpp.sets.match_window import MatchWindowMatcher
from yfpp.sets.matcher import Limits
from yfpp.sets.plan import compile_sets



SetMatcher = DirectMatcher | MatchWindowMatcher


def set_matcher(pattern: Pattern, name: str | int, strategy: str = "direct", limits: Limits | None = None,
                **switches: bool) -> SetMatcher:
    """The matcher of a set query for an evaluation strategy (``direct`` or ``match-window``).

    A feedback or ``non_overlapping`` query is evaluated directly under either
    strategy: its output depends on the event at which each match completes.
    """
    if strategy not in STRATEGIES:
        raise YfppError(f"unknown evaluation strategy {strategy!r} (expected one of {', '.join(STRATEGIES)})")
    plan = compile_sets(pattern, name)
    if strategy == "direct" or pattern.feedback or pattern.policy == "non_overlapping":
        return DirectMatcher(plan, limits)
    return MatchWindowMatcher(plan, limits=limits, **switches)
