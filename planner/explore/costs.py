"""What a sweep's plans cost in dollars: per step, per million tokens, and for a whole run.

Prices are dollars per GPU-hour by device name (or a prefix naming one device of the sweep,
``a100`` for ``a100-80g``); a row is priced from its GPUs, step time and tokens per second.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from planner.errors import SpecError

HOUR_S = 3600.0


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
    with ``tokens`` run_hours and run_cost_usd, to every row whose device has a price."""
    prices = parse_prices(prices)
    check_tokens(tokens)
    by_device = resolve_prices(prices, sorted({r["device"] for r in rows if r["device"]}))
    for r in rows:
        price = by_device.get(r["device"])
        cost = {"price_per_gpu_hour": price, "cost_per_step_usd": None, "cost_per_mtok_usd": None}
        if tokens is not None:
            cost.update({"tokens": float(tokens), "run_hours": None, "run_cost_usd": None})
        if price is not None and r["feasible"]:
            dollars_per_s = r["gpus"] * price / HOUR_S
            cost["cost_per_step_usd"] = dollars_per_s * r["step_time_s"]
            cost["cost_per_mtok_usd"] = dollars_per_s / r["tokens_per_s"] * 1e6
            if tokens is not None:
                hours = float(tokens) / r["tokens_per_s"] / HOUR_S
                cost.update({"run_hours": hours, "run_cost_usd": hours * r["gpus"] * price})
        r.update(cost)


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
        if len(matches) != 1:
            which = "matches several" if matches else "matches no"
            raise SpecError(f"price_per_gpu_hour.{key}: {which} device of the sweep "
                            f"({', '.join(devices)}); name one of them")
        out[matches[0]] = price
    return out
