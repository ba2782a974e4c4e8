"""A bash file that defines an array of command-line arguments (and environment variables), for
the engines configured on the command line (Megatron-LM, torchtitan 0.3.0): ``source`` it, then
pass ``"${NAME[@]}"``. Comments above each group say which plan field it comes from."""

from __future__ import annotations

import shlex

Group = list[tuple[list[str], str]]
"""Lines of one array: (arguments, comment written above them or "")."""


def bash_file(intro: list[str], env: list[tuple[str, str | None, str]], array: str,
              groups: Group) -> str:
    """``intro`` (comment lines), ``export NAME=value`` (``unset NAME`` for value None) for each
    (name, value, comment) of ``env``, then ``array=( ... )``."""
    lines = list(intro) + [""]
    for name, value, comment in env:
        line = f"unset {name}" if value is None else f"export {name}={shlex.quote(value)}"
        lines += [f"# {comment}", line, ""]
    lines.append(f"{array}=(")
    for args, comment in groups:
        if comment:
            lines.append(f"  # {comment}")
        if args:
            lines.append("  " + " ".join(shlex.quote(a) for a in args))
    return "\n".join(lines + [")"]) + "\n"
