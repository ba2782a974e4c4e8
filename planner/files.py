"""Reading and writing the planner's files: one-line errors on read (JSON, YAML), atomic writes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile

from planner.errors import SpecError


def as_path(value, what: str) -> str:
    """A path argument as text: a str, or an os.PathLike (pathlib.Path); SpecError naming ``what``
    for anything else (Python's open takes an int as a file descriptor, and would close it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
        return os.fspath(value)
    raise SpecError(f"{what}: expected a file path (a str or pathlib.Path), got "
                    f"{type(value).__name__} {value!r}")


def refuse_plan_file(model) -> None:
    """SpecError when a MODEL given as a path names a plan file (a plan given where its model
    belongs: `plan whatif plan.json` asked for a cluster first, a new-user check found)."""
    if not isinstance(model, str):
        return
    file = os.path.join(model, "config.json") if os.path.isdir(model) else model
    if not file.endswith(".json") or not os.path.isfile(file):
        return
    try:
        with open(file, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):  # (reading it as a model says what is wrong)
        return
    if isinstance(raw, dict):
        refuse_plan(raw, file)


def refuse_plan(raw: dict, file: str) -> None:
    """SpecError when ``raw``, the JSON object read from ``file`` as a model, is a plan."""
    if str(raw.get("schema", "")).startswith("planner.plan/"):
        planned = raw["model"].get("spec") if isinstance(raw.get("model"), dict) else None
        raise SpecError(f"model: {file} is a plan file, not a model; give the model it was made "
                        f"for{f' ({planned})' if planned else ''} (`plan show {file}` names it)")


def fspath_or_same(value):
    """``value`` as text where it is an os.PathLike (pathlib.Path), else as given: for arguments
    that take a path or something else (a zoo name, a mapping, a module)."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def read_json_object(path: str, *, what: str, missing_hint: str = "") -> dict:
    """The JSON object in ``path``; SpecError naming ``what`` (the field) when the file is missing,
    unreadable, not JSON, or not an object."""
    path = as_path(path, what)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SpecError(f"{what}: file '{path}' not found" + (f"; {missing_hint}" if missing_hint
                                                               else "")) from None
    except IsADirectoryError:
        raise SpecError(f"{what}: '{path}' is a folder, not a JSON file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{what}: '{path}' is not text (binary content); give the JSON file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{what}: cannot read '{path}' as JSON ({exc}); fix the file") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(
            type(data), "a number")
        raise SpecError(f"{what}: '{path}' holds {kind}, not a JSON object ({{...}}); give the "
                        "file this command takes")
    return data


def read_yaml(path: str, *, what: str, missing_hint: str = ""):
    """The parsed YAML in ``path``; SpecError naming ``what`` (the field) when the file is missing
    (with ``missing_hint``, the fix) or unreadable, and the file and line when it is not YAML."""
    import yaml  # lazy: only reading a YAML file needs it

    path = as_path(path, what)
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=_unique_keys_loader())
    except FileNotFoundError:
        raise SpecError(f"{what}: file '{path}' not found" + (f"; {missing_hint}" if missing_hint
                                                               else "")) from None
    except IsADirectoryError:
        raise SpecError(f"{what}: '{path}' is a folder, not a YAML file") from None
    except _DuplicateKey as exc:
        key, first, again = exc.args
        where = f"on line {first}" if first == again else f"lines {first} and {again}"
        raise SpecError(f"{os.path.basename(path)}: {key} given twice ({where}); keep one"
                        ) from None
    except OSError as exc:
        raise SpecError(f"{what}: cannot read '{path}' ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(f"{what}: '{path}' is not text (binary content); give the YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise SpecError(f"{os.path.basename(path)}: invalid YAML{where}: {problem}") from None


class _DuplicateKey(Exception):
    """A mapping of a YAML file names a key twice: (key, first line, second line)."""


def _unique_keys_loader():
    """yaml.SafeLoader refusing a key given twice in one mapping (the safe loader keeps the last,
    silently: a new-user check's cluster with ``nodes: 1`` then ``nodes: 4`` planned 32 GPUs)."""
    import yaml  # lazy: only reading a YAML file needs it

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # (<<: *base; its keys may be
                    continue                                   # overridden)
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKey(key, seen[key], line)
                    seen[key] = line
                except TypeError:  # (an unhashable key: the safe loader's own error follows)
                    continue
            return super().construct_mapping(node, deep=deep)
    return Loader


STDOUT = "-"
"""The output path that means standard output (``-o -``)."""


def is_stream(path: str) -> bool:
    """Whether ``path`` (or what a link there points to) exists and is neither a regular file
    nor a folder: a device (/dev/null) or a pipe, which takes what is written straight into it
    (there is no file to replace)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_output_folder(path: str, what: str) -> None:
    """SpecError naming ``what`` (the option) unless ``path`` is a folder that can be written in,
    or one that can be made (its parent exists and is writable): before the slow part."""
    if not path:
        raise SpecError(f"{what}: empty path; give a folder")
    path = path.rstrip("/" + os.sep) or path  # ('out/' names the folder out; a file there is not one)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise SpecError(f"{what}: '{path}' is a file, not a folder; give a folder (made if "
                            "missing)")
        if not os.access(path, os.W_OK):
            raise SpecError(f"{what}: cannot write in folder '{path}' (permission denied)")
        refused = _refuses_new_files(path)
        if refused:
            raise SpecError(f"{what}: folder '{path}' refuses new files ({refused}); give "
                            "another folder")
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise SpecError(f"{what}: folder '{parent}' does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise SpecError(f"{what}: cannot make '{path}' in folder '{parent}' (permission denied)")
    refused = _refuses_new_files(parent)
    if refused:
        raise SpecError(f"{what}: cannot make '{path}': folder '{parent}' refuses new files "
                        f"({refused}); give another folder")


def _refuses_new_files(folder: str) -> str | None:
    """Why ``folder`` refuses a new file, or None: access() trusts the mode bits, and some folders
    (/proc, /sys, read-only mounts) still refuse files, so one is made and removed."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    except FileNotFoundError:  # a virtual file system (/proc) answers a new name so
        return "a file system that makes no new files; output goes to a new file, then a rename"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:  # made but not removable (a sticky or append-only folder): writable all the
        pass         # same, and the probe's name says what it was
    return None


def check_output(path: str, what: str, inputs: tuple = ()) -> None:
    """SpecError naming ``what`` (the option) unless ``path`` can be written: its folder exists and
    is writable, it is not a folder, an existing file there is writable, and it is none of the
    command's ``inputs`` (paths, a model's ``file.py:factory`` naming its file; those that are
    not files are ignored). A link is checked as the
    file it points to; a device or pipe only for being writable. Called before the slow part, so
    that no work is lost to a typo."""
    if path == STDOUT:
        return
    if not path:
        raise SpecError(f"{what}: empty path; give a file name")
    if is_stream(path):
        if not os.access(path, os.W_OK):
            raise SpecError(f"{what}: '{path}' cannot be written (permission denied)")
        return
    path = os.path.realpath(path) if os.path.islink(path) else path
    files = [f for given in inputs if given for f in (given, *(
        [given.rpartition(":")[0]] if ":" in given else []))]  # (file.py:factory: its file)
    for given in files:
        if os.path.isfile(given) and os.path.exists(path) and os.path.samefile(path, given):
            raise SpecError(f"{what}: '{path}' is this command's input; write to another file")
    if os.path.isdir(path):
        raise SpecError(f"{what}: '{path}' is a folder; give a file name inside it")
    if path.endswith(("/", os.sep)):  # names a folder, which is not there
        raise SpecError(f"{what}: folder '{os.path.abspath(path)}' does not exist; create it "
                        "first")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        above = folder
        while above and not os.path.exists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if os.path.exists(above) and not os.path.isdir(above):
            raise SpecError(f"{what}: '{above}' is a file, not a folder; write to a path in a "
                            "folder")
        raise SpecError(f"{what}: folder '{folder}' does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"{what}: cannot write in folder '{folder}' (permission denied); choose "
                        "another folder")
    try:
        os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # a name too long, a loop of links
        raise SpecError(f"{what}: cannot use '{path[:80]}{'...' if len(path) > 80 else ''}' "
                        f"({exc.strerror or type(exc).__name__}); choose another name") from None
    refused = _refuses_new_files(folder)
    if refused:
        raise SpecError(f"{what}: cannot write '{path}': folder '{folder}' refuses new files "
                        f"({refused})")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise SpecError(f"{what}: '{path}' is read-only")


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and an atomic rename;
    an existing file keeps its permissions and is never left half-written. ``-`` writes to
    standard output."""
    path = as_path(path, "output")
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    atomic_save(path, write)


def atomic_save(path: str, write) -> None:
    """Call ``write(tmp)`` to fill a temporary file in ``path``'s folder, then rename it onto
    ``path`` (keeping an existing file's permissions); on any failure the temporary file is
    removed and ``path`` is untouched. A link is kept: the file it points to is replaced. A
    device or pipe (/dev/null) is written straight into, from the finished temporary file."""
    check_output(path, "output")
    stream = is_stream(path)
    shown, path = path, os.path.realpath(path) if os.path.islink(path) else path
    folder = tempfile.gettempdir() if stream else os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    suffix = os.path.splitext(path)[1] or ".tmp"
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
        os.close(fd)
        write(tmp)
        if stream:
            with open(tmp, "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.unlink(tmp)
        else:
            os.chmod(tmp, mode)
            os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # the folder refused the file after all (e.g. /sys, a full disk)
            reason = exc.strerror or type(exc).__name__
            raise SpecError(f"output: cannot write '{shown}' ({reason}); choose another path"
                            ) from None
        raise
