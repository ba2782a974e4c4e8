"""Traced models on disk, so that planning a model the planner has traced before skips the trace
(and, from the command line, loading torch).

An entry is the plain data of one trace (the op graph, the blocks and the model's facts) as JSON,
under the user's cache folder (``$XDG_CACHE_HOME/planner/traces``, else ``~/.cache/...``). Its key
hashes what the trace depends on:

- the model: a zoo entry's configuration, the bytes of a ``config.json``, or the bytes of a
  ``file.py``, of the modules it imports from its own folder (``from defs import TinyGPT`` next
  to it, and what those import from there in turn: local_sources) and the factory's name; a
  ``package.module:factory`` (an installed package, not hashed: after editing it pass
  ``--no-cache``, or ``cache_dir=None``) and a module object have no key and are never cached;
- the sequence length, dtype and tracer asked for;
- (checked when an entry is read, not in its key) the data files the trace read besides: a
  factory reading its settings from a JSON or YAML file next to it is traced again once that
  file changes (recording_reads, read_signatures);
- the versions of torch, transformers and the planner, and the source of the planner's own
  tracing and pricing code, so that any change to them misses.

Entries are written atomically (a reader never sees half a file; two runs racing write the same
bytes), and one that does not read back as a trace of this schema is ignored and rewritten.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import logging
import os
import sys
import sysconfig
from importlib import metadata

from planner.files import atomic_write
from planner.inputs.zoo import ZOO

log = logging.getLogger(__name__)

SCHEMA = "planner.trace/v2"
"""v2: the model's info carries its Hugging Face model type (what engines run DeepEP for)."""
CODE = ("planner/trace", "planner/inputs/zoo.py", "costmodels/workload.py", "planner/traced.py")
"""The planner's sources a trace depends on (hashed into every key; planner/traced.py writes the
model's info stored with it)."""


def default_dir() -> str:
    """The user's cache folder for traces (the XDG base-directory convention)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "planner", "traces")


def key(model, *, seq_len: int | None, dtype: str, method: str) -> str | None:
    """The cache key of a MODEL spec, or None when it cannot have one (an nn.Module, or a file
    that cannot be read: the slow path then says what is wrong)."""
    if not isinstance(model, str) or not model:
        return None
    identity = _identity(model)
    if identity is None:
        return None
    payload = {"model": identity, "seq_len": seq_len, "dtype": dtype, "method": method,
               "versions": {pkg: _version(pkg) for pkg in ("torch", "transformers", "planner")},
               "code": _code_hash()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def load(folder: str, entry: str) -> dict | None:
    """The trace stored under ``entry``, or None (absent, unreadable or of another schema)."""
    path = os.path.join(folder, f"{entry}.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.debug("trace cache: ignoring %s (%s)", path, exc)
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        log.debug("trace cache: ignoring %s (not a %s entry)", path, SCHEMA)
        return None
    for read, signature in (data.get("reads") or {}).items():
        if _signature(read) != signature:
            log.info("trace cache: %s changed since the model was traced (the trace read it); "
                     "tracing again", read)
            return None
    return data


def store(folder: str, entry: str, data: dict) -> None:
    """Write ``data`` under ``entry``; a folder that cannot be written only costs the cache."""
    try:
        os.makedirs(folder, exist_ok=True)
        atomic_write(os.path.join(folder, f"{entry}.json"),
                     json.dumps({"schema": SCHEMA, **data}) + "\n")
    except OSError as exc:
        log.warning("trace cache: cannot write to %s (%s); planning goes on without it", folder,
                    exc.strerror or exc)


_RECORDERS: list[set[str]] = []
_HOOKED: list[bool] = []


def _on_open(event: str, args: tuple) -> None:
    """The audit hook: a file opened for reading while a recorder is on (builtins.open and
    os.open raise the "open" event with the path, mode and flags)."""
    if event != "open" or not _RECORDERS:
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return
    if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        return
    if isinstance(path, (str, bytes, os.PathLike)):
        try:
            _RECORDERS[-1].add(os.path.abspath(os.fsdecode(path)))
        except (TypeError, ValueError):
            pass


@contextlib.contextmanager
def recording_reads():
    """Yields the set of the paths opened for reading until the block ends (an audit hook,
    added once per process: Python has no way to remove one, and it returns at once while
    nothing records)."""
    if not _HOOKED:
        sys.addaudithook(_on_open)
        _HOOKED.append(True)
    seen: set[str] = set()
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.pop()


READS_MAX = 100
"""At most this many data files are checked for one entry."""
HASH_MAX_BYTES = 64 * 2**20
"""A larger file is told apart by its size and modification time, not its bytes."""


def read_signatures(paths, folder: str | None = None) -> dict[str, str]:
    """The data files among ``paths`` (what recording_reads saw) with a signature of each: the
    regular files outside Python's installation and packages and the cache ``folder``, other than
    Python sources and extension modules (the key hashes a factory's own; the versions, the
    packages')."""
    skip = {sys.prefix, sys.base_prefix, sys.exec_prefix,
            *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib",
                                                      "platlib"))}
    skip |= {folder} if folder else set()
    skip_dirs = tuple(os.path.join(os.path.abspath(s), "") for s in skip if s)
    out: dict[str, str] = {}
    for path in sorted(paths):
        if len(out) >= READS_MAX:
            break
        if path.startswith(skip_dirs + ("/proc/", "/sys/", "/dev/")) or path.endswith(
                (".py", ".pyc", ".so", ".pyd")) or not os.path.isfile(path):
            continue
        signature = _signature(path)
        if signature is not None:
            out[path] = signature
    return out


def _signature(path: str) -> str | None:
    """A file's bytes hashed, or its size and modification time where it is large; None where
    it cannot be read."""
    try:
        size = os.path.getsize(path)
        if size > HASH_MAX_BYTES:
            return f"size {size} mtime {os.path.getmtime(path)}"
    except OSError:
        return None
    found = _file(path, "read")
    return None if found is None else found[1]


def _identity(model: str):
    if model.lower() in ZOO:
        return ["zoo", repr(ZOO[model.lower()])]
    if model.endswith(".json") or os.path.isdir(model):
        file = os.path.join(model, "config.json") if os.path.isdir(model) else model
        return _file(file, "config")
    target, sep, name = model.rpartition(":")
    if sep and target.endswith(".py"):
        found = _file(target, "factory")
        if found is None:
            return None
        return [*found, name, *[x for h in imported_digests(target).values()
                                for x in ("import", h)]]
    return None  # package.module:factory: the installed package is not hashed


def imported_digests(path: str) -> dict[str, str]:
    """The modules a factory file imports from its own folder (local_sources), each by the hash
    of its bytes; one that cannot be read is left out."""
    out = {}
    for source in local_sources(path)[1:]:
        found = _file(source, "import")
        if found is not None:
            out[source] = found[1]
    return out


LOCAL_SOURCES_MAX = 200
"""At most this many files hashed for one factory (a folder of many modules keys on these)."""


def local_sources(path: str) -> list[str]:
    """``path`` and the Python files it imports from its own folder, transitively (a module
    ``defs`` as defs.py or a package defs/ with every .py file in it), found by reading the
    import statements (nothing is run), in a fixed order."""
    folder = os.path.dirname(os.path.abspath(path))
    seen, queue = [os.path.abspath(path)], [os.path.abspath(path)]
    while queue and len(seen) < LOCAL_SOURCES_MAX:
        try:
            with open(queue.pop(0), "rb") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            continue
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.module:
                    names.add(node.module.split(".")[0])
                elif node.level:  # from . import defs
                    names.update(a.name for a in node.names)
        for name in sorted(names):
            for found in _module_files(folder, name):
                if found not in seen and len(seen) < LOCAL_SOURCES_MAX:
                    seen.append(found)
                    queue.append(found)
    return seen


def _module_files(folder: str, name: str) -> list[str]:
    """The files of module ``name`` in ``folder``: name.py, or every .py file of package name/."""
    single = os.path.join(folder, name + ".py")
    if os.path.isfile(single):
        return [single]
    package = os.path.join(folder, name)
    if not os.path.isdir(package):
        return []
    return sorted(os.path.join(root, f) for root, _, files in os.walk(package)
                  for f in files if f.endswith(".py"))


def _file(path: str, kind: str):
    try:
        with open(path, "rb") as f:
            return [kind, hashlib.sha256(f.read()).hexdigest()]
    except OSError:
        return None


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "unknown"


def _code_hash() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    h = hashlib.sha256()
    for rel in CODE:
        path = os.path.join(root, rel)
        files = ([os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".py")]
                 if os.path.isdir(path) else [path])
        for file in files:
            with open(file, "rb") as f:
                h.update(f.read())
    return h.hexdigest()
