"""A version-3 checkpoint's queries kept by shape, registered again: what the rows of one shape share (the text
around their constants, a check that a row splits as kept, the shape's compiled plan) is worked out once per
shape, and each row is registered from it (``Engine.register_planned``) without splitting or parsing its text."""

from __future__ import annotations

import re
from typing import Any

from yfpp.language.query_text import KIND_TOKENS, split_constants, token_kinds
from yfpp.state.schema import corrupt


class KeptShape:
    """One of the checkpoint's ``shapes``: ``[text around the constants, policy, feedback]``; its rows are checked
    against the first one registered (whose text is split to check that it splits as kept)."""

    __slots__ = ("index", "around", "policy", "feedback", "template", "kinds", "plan")

    def __init__(self, eng: Any, index: int, kept: list, first: list[str], row: int) -> None:
        self.index = index
        self.around, self.policy, self.feedback = kept
        # the text with "{}" for each constant (str.format puts a row's constants in, in one call)
        self.template = "{}".join(a.replace("{", "{{").replace("}", "}}") for a in self.around)
        self.kinds: re.Pattern[str] | None = None  # a row's constants (joined) of the first's kinds: its split holds
        self.plan = None  # the shape's compiled plan (None: its rows are registered as text)
        first_text = self.text(first, row)
        kinds = token_kinds(first) if split_constants(first_text) == (self.around, first) else None
        if kinds is not None:
            self.kinds = re.compile("\n".join(f"(?:{KIND_TOKENS[k]})" for k in kinds))
            self.plan = eng.shape_plan(first_text, (self.around, first), self.policy, self.feedback)

    def text(self, constants: list[str], row: int) -> str:
        """The query text of row ``row`` (its index in ``queries``), whose constants are ``constants``."""
        if len(constants) != len(self.around) - 1:
            raise corrupt(f"queries[{row}]", f"shape {self.index} takes {len(self.around) - 1} constants")
        return self.template.format(*constants)

    def register(self, eng: Any, row: int, qid: int, name: str | None, constants: list[str]) -> None:
        """Register row ``row`` of ``queries``, ``[qid, name, this shape, constants, …]``, under its id."""
        text = self.text(constants, row)
        split_kept = self.kinds is not None and self.kinds.fullmatch("\n".join(constants)) is not None
        if split_kept and self.plan is not None:
            eng.register_planned(self.plan, text, constants, name, qid)
        else:
            eng.register(text, name=name, policy=self.policy, feedback=self.feedback, query_id=qid,
                         split=(self.around, constants) if split_kept else None)
