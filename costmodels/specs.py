"""Reading ``key=value,key=value`` text, as the CLI's --fix and --engine take it, the
true-or-false settings among it, and whole numbers given from Python."""

from __future__ import annotations

import numbers

from costmodels.errors import SpecError


def positive_int(value, where: str) -> int:
    """A count given as any integer type (numpy's too: a sweep over np.arange), as an int;
    SpecError naming ``where`` for a bool, a non-integer or one below 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise SpecError(f"{where}: expected a positive integer, got {value!r}")
    return int(value)


def parse_pairs(text: str, *, where: str, example: str) -> dict[str, str]:
    """``"a=1,b=x"`` -> {"a": "1", "b": "x"}; SpecError naming ``where`` on a part without '='
    or a key given twice."""
    items = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise SpecError(f"{where}: '{part}' is not key=value; write e.g. {example}")
        key, value = (x.strip() for x in part.split("=", 1))
        if key in items:
            raise SpecError(f"{where}.{key}: given twice ({items[key]} and {value}); give it once")
        items[key] = value
    return items


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def read_bool(value, where: str) -> bool:
    """A setting that is true or false: a bool, or true/false, yes/no, on/off, 1/0 in any case
    (SpecError naming ``where`` otherwise)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS or text in FALSE_WORDS:
        return text in TRUE_WORDS
    raise SpecError(f"{where}: expected true or false (or on/off, yes/no, 1/0), got {value!r}")
