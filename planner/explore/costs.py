"""What a sweep's plans cost in dollars: per step, per million tokens, and for a whole run.

Prices are dollars per GPU-hour by device name (or a prefix naming one device of the sweep,
``a100`` for ``a100-80g``); a row is priced from its GPUs of each device (a cluster of node
groups or sites mixes them), step time and tokens per second.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from planner.errors import SpecError

HOUR_S = 3600.0
log = logging.getLogger(__name__)


def gpus_by_device(summary: Mapping) -> str:
    """A cluster summary's GPUs per device as a row's text, ``a100-80g:16,v100:16`` (one device:
    ``h100:64``)."""
    counts: dict[str, int] = {}
    for part in summary.get("groups") or [summary]:
        counts[part["device"]] = counts.get(part["device"], 0) + int(part["num_gpus"])
    return ",".join(f"{d}:{n}" for d, n in counts.items())


def _counts(row: Mapping) -> dict[str, int]:
    """Device -> GPUs of a row (its ``gpus_by_device``; rows read from a CSV written before that
    column: its one ``device``)."""
    text = row.get("gpus_by_device")
    if not text:  # (a mixed cluster's 'a100-80g+v100' names no one device: left unpriced)
        device = row.get("device")
        return {device: row["gpus"]} if device and "+" not in str(device) else {}
    return {d: int(n) for d, _, n in (p.rpartition(":") for p in str(text).split(","))}


def sweep_devices(rows_or_counts) -> list[str]:
    """The devices (one name each) of rows or of ``gpus_by_device`` texts."""
    out = set()
    for item in rows_or_counts:
        row = item if isinstance(item, Mapping) else {"gpus_by_device": item}
        out |= set(_counts(row)) or set(str(row.get("device") or "").split("+")) - {""}
    return sorted(out)


def parse_prices(text: str | Mapping | None) -> dict:
    """``"h100=4,a100-80g=$2"`` -> ``{"h100": 4.0, "a100-80g": 2.0}`` (dollars per GPU-hour)."""
    if text is None or isinstance(text, Mapping):
        items = dict(text or {})
    else:
        items = {}
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            name, sep, value = part.partition("=")
            if not sep:
                raise SpecError(f"price_per_gpu_hour: '{part}' is not GPU=dollars; e.g. h100=4")
            items[name.strip()] = value.strip().lstrip("$")
    out = {}
    for name, value in items.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise SpecError(f"price_per_gpu_hour.{name}: expected dollars per GPU-hour, got "
                            f"{value!r}") from None
        if not out[name] > 0:
            raise SpecError(f"price_per_gpu_hour.{name}: expected a positive price, got {value!r}")
    return out


def add_costs(rows: list[dict], prices, tokens: float | None = None) -> None:
    """Add price_per_gpu_hour, cost_per_step_usd and cost_per_mtok_usd (per million tokens), and
    with ``tokens`` run_cost_usd, to every row whose device has a price; with ``tokens`` also
    run_hours (the time to train on them) to every feasible row, priced or not."""
    prices = parse_prices(prices)
    check_tokens(tokens)
    by_device = resolve_prices(prices, sweep_devices(rows))
    unpriced: set[str] = set()
    stale: set[str] = set()
    for r in rows:
        counts = _counts(r)
        if not counts and r.get("device"):
            stale.add(str(r["device"]))
        missing = {d for d in counts if d not in by_device}
        unpriced |= missing
        # (a mixed cluster's price per GPU-hour is the mean over its GPUs)
        price = None if missing or not counts else \
            sum(n * by_device[d] for d, n in counts.items()) / sum(counts.values())
        cost = {"price_per_gpu_hour": price, "cost_per_step_usd": None, "cost_per_mtok_usd": None}
        if tokens is not None:
            cost.update({"tokens": float(tokens), "run_hours": None, "run_cost_usd": None})
        if tokens is not None and r["feasible"]:
            cost["run_hours"] = float(tokens) / r["tokens_per_s"] / HOUR_S
        if price is not None and r["feasible"]:
            dollars_per_s = r["gpus"] * price / HOUR_S
            cost["cost_per_step_usd"] = dollars_per_s * r["step_time_s"]
            cost["cost_per_mtok_usd"] = dollars_per_s / r["tokens_per_s"] * 1e6
            if tokens is not None:
                cost["run_cost_usd"] = cost["run_hours"] * r["gpus"] * price
        r.update(cost)
    if stale:
        log.warning("price_per_gpu_hour: rows of %s (clusters of several devices) have no costs: "
                    "their CSV predates GPUs per device (gpus_by_device); sweep them again",
                    ", ".join(sorted(stale)))
    if unpriced and prices:
        log.warning("price_per_gpu_hour: no price for %s, so the rows with %s have no costs; "
                    "add %s", ", ".join(sorted(unpriced)), "it" if len(unpriced) == 1 else "them",
                    ",".join(f"{d}=DOLLARS" for d in sorted(unpriced)))


def check_tokens(tokens) -> None:
    """SpecError unless ``tokens`` is None or a positive number of training tokens."""
    if tokens is not None and (isinstance(tokens, bool) or not float(tokens) > 0):
        raise SpecError(f"tokens: expected a positive number of training tokens, got {tokens!r}")


def resolve_prices(prices: Mapping[str, float], devices: Sequence[str]) -> dict:
    """Device name -> price; a key may be a device name or a prefix naming exactly one of
    ``devices`` (``a100`` for ``a100-80g``)."""
    out = {}
    for key, price in prices.items():
        matches = [d for d in devices if d == key] or [d for d in devices if d.startswith(key)]
        if len(matches) > 1:
            raise SpecError(f"price_per_gpu_hour.{key}: matches several devices of the sweep "
                            f"({', '.join(matches)}); name each of them")
        if not matches:
            raise SpecError(f"price_per_gpu_hour.{key}: matches no device of the sweep "
                            f"({', '.join(devices)}); name one of them")
        out[matches[0]] = price
    return out
