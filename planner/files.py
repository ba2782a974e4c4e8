"""Reading and writing the planner's files: one-line errors on read (JSON, YAML), atomic writes."""

from __future__ import annotations

import json
import os
import tempfile

from planner.errors import SpecError


def read_json_object(path: str, *, what: str, missing_hint: str = "") -> dict:
    """The JSON object in ``path``; SpecError naming ``what`` (the field) when the file is missing,
    unreadable, not JSON, or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SpecError(f"{what}: file '{path}' not found" + (f"; {missing_hint}" if missing_hint
                                                               else "")) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{what}: cannot read '{path}' as JSON ({exc}); fix the file") from None
    if not isinstance(data, dict):
        raise SpecError(f"{what}: '{path}' must hold a JSON object")
    return data


def read_yaml(path: str, *, what: str):
    """The parsed YAML in ``path``; SpecError naming ``what`` (the field) when the file is missing
    or unreadable, and the file and line when it is not YAML."""
    import yaml  # lazy: only reading a YAML file needs it

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise SpecError(f"{what}: file '{path}' not found") from None
    except OSError as exc:
        raise SpecError(f"{what}: cannot read '{path}' ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{os.path.basename(path)}: invalid YAML{where}: "
                        f"{getattr(exc, 'problem', None) or exc}") from None


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and an atomic rename;
    an existing file keeps its permissions and is never left half-written."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
