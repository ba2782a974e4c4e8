"""Error types shared by the cost models and the planner.

They live here (the bottom of the dependency graph) so that costmodels can raise them without
importing the planner; ``planner.errors`` re-exports them. Beside them, the wording every
unknown name and key shares (suggest, unknown_key).
"""

import difflib


class PlannerError(Exception):
    """Any error the planner reports to a person (one line, no traceback by default)."""


class SpecError(PlannerError):
    """Bad input: an unknown name, a missing or unknown key, a value out of range. The message
    names the field first, as every bad-input message does ("fix.tp: ...; the fix")."""

    @property
    def field(self) -> str:
        """The input field the message names ("fix.tp", "engine.moe_capacity_factor")."""
        return str(self).partition(":")[0]


class InternalError(PlannerError):
    """A broken invariant of the planner itself (a bug, not bad input): reported in one line with
    a request to report it, never turned into a plan."""


class InfeasibleError(PlannerError):
    """A configuration that cannot run (out of memory, indivisible degrees, ...).

    ``reason`` is a short category the search counts ("out of memory", "tp > gpus per node");
    the message says the details.
    """

    def __init__(self, message: str, *, reason: str = "infeasible"):
        super().__init__(message)
        self.reason = reason


def suggest(name: str, choices) -> str:
    """'; did you mean X?' for the closest names (the closest alone where it is one slip away:
    a letter left out, added, swapped or changed), or the list of choices."""
    name, choices = str(name), sorted(str(c) for c in choices)  # (YAML keys: on, 1, ~ too)
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close and difflib.SequenceMatcher(None, name, close[0]).ratio() >= 0.9:
        close = close[:1]
    # a name a choice starts with, or holds, first: gpt3 -> gpt3-175b, dgx-a100 -> dgx-a100-40g
    # (a new-user check was offered gpt2 and gpt-39b for gpt3)
    low = name.lower()
    held = sorted((c for c in choices if low and low in c.lower() and c.lower() != low),
                  key=lambda c: (not c.lower().startswith(low), len(c), c))
    if held and not (close and close[0] in held[:3] and len(close) == 1):
        close = (held + [c for c in close if c not in held])[:3]
    if close:
        return "; did you mean " + " or ".join(close) + "?"
    return "; choose one of " + ", ".join(choices)


def unknown_key(where: str, unknown, allowed) -> SpecError:
    """The error for the first of ``unknown`` keys of the mapping at ``where``: the closest
    allowed key where one is near, else every allowed key."""
    key = sorted(unknown, key=str)[0]
    return SpecError(f"{where}.{key}: unknown key{suggest(key, allowed)}")
