"""Reading ``key=value,key=value`` text, as the CLI's --fix and --engine take it."""

from __future__ import annotations

from costmodels.errors import SpecError


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
