"""Argument types for numbers with a range: a value out of range is a one-line usage error that
names the option (argparse turns the ValueError-free ArgumentTypeError into `plan: error: ...`);
and ``Joined``, for k=v options that may be given more than once."""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind, low: float, inclusive: bool, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    if value < low or (value == low and not inclusive):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _number(text, int, 1, True, "an integer >= 1")


def count(text: str) -> int:
    """An integer >= 0."""
    return _number(text, int, 0, True, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _number(text, float, 0.0, False, "a number > 0")


def fraction(text: str) -> float:
    """A number >= 0 and < 1."""
    value = _number(text, float, 0.0, True, "a number from 0 up to (not including) 1")
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 up to (not including) 1, "
                                         f"got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _number(text, float, 0.0, True, "a number >= 0")


def add_reserve_flags(parser) -> None:
    """--memory-reserve-fraction and --memory-reserve-gb (plan solve, plan whatif)."""
    parser.add_argument("--memory-reserve-fraction", type=fraction, metavar="F",
                        help="share of each device's memory kept free for the allocator's "
                             "fragmentation (default 0.05)")
    parser.add_argument("--memory-reserve-gb", type=non_negative_float, metavar="GB",
                        help="GB of each device's memory kept free besides, for the CUDA "
                             "context, NCCL buffers and library workspaces (default 1)")


def add_layout_flag(parser, every_point: bool = False) -> None:
    """--layout (plan solve, plan whatif: ``every_point``)."""
    parser.add_argument("--layout", help="pin the pipeline stages in Megatron-LM's notation"
                        + (" at every point" if every_point else "") + ", e.g. "
                        "'Et*4|(t*4|)*14tmL' (E embedding, t layer, m MTP depth, right before L, "
                        "the head, | stage boundary, *n repeats); a layout of several stages "
                        "needs pp pinned" + (" or varied" if every_point else " (--fix pp=N)")
                        + ": the stages are pp x vpp (without --layout the search splits)")


class Joined(argparse.Action):
    """A ``k=v,...`` option given more than once: its values joined with commas (``--fix ep=8
    --fix tp=2`` is ``--fix ep=8,tp=2``), so a later one adds to an earlier one instead of
    replacing it, and a key given in both is refused as given twice."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{before},{values}" if before else values)
