"""Why a tracer failed, in one line: the module that was running, the source line in the model's
code, the construct the tracer cannot follow, and what to change.

The tracers (planner.trace.tracers) run the model's forward under torch.export or torch.fx; when
either raises, the exception carries the innermost module (tracked by forward hooks, since the
hooks do not pop on errors) and its traceback holds the model's own frames."""

from __future__ import annotations

import os
import sysconfig
import traceback

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_PLANNER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"])
_NOT_MODEL_CODE = (_TORCH_DIR + os.sep, _PLANNER_DIR + os.sep, _STDLIB_DIR + os.sep, "<")

# (text in the exception, the construct, what to change); first match wins
CONSTRUCTS = (
    ("dynamiccache'> in output", "a Hugging Face model that returns its key/value cache",
     "build it with use_cache=False (in its config), as training does"),
    ("encoderdecodercache'> in output",
     "a Hugging Face encoder-decoder that returns its key/value caches",
     "build it with use_cache=False (in its config), as training does"),
    ("cannot be used as inputs to control flow", "Python control flow on a traced value",
     "replace the branch with torch.where, or decide it from shapes and try --trace export "
     "(torch.fx traces shapes symbolically too; export reads them)"),
    ("could not guard on data-dependent", "a branch or size that depends on tensor values",
     "replace the branch with torch.where or decide it from shapes"),
    ("could not extract specialized integer from data-dependent",
     "a Python number or size read from tensor values",
     "keep tensor values out of Python numbers (no .item(), .tolist() or int(t): compute with "
     "the tensor itself) and sizes independent of values (masks instead of nonzero/boolean "
     "indexing)"),
    ("data-dependent output shape", "an op whose output size depends on tensor values",
     "keep sizes independent of values (masks instead of nonzero/boolean indexing)"),
    ("returns a fake value", "an op whose output size depends on tensor values",
     "keep sizes independent of values (masks instead of nonzero/boolean indexing)"),
    ("proxy object cannot be iterated", "iterating over or unpacking a traced tensor",
     "try --trace export, which unpacks tensors"),
    ("cannot be used as inputs to", "a traced value passed where Python needs a concrete one",
     "try --trace export"),
    ("found at least two devices", "a tensor made on a device other than the model's (torch."
     "eye/zeros/arange... in the forward without device=, device='cpu' or .cuda(), or such an "
     "input from the factory)",
     "make it on the input's device (device=x.device) and drop any fixed device= (the planner "
     "builds everything on the meta device)"),
    ("meta tensor", "an op that reads tensor data (.item(), .tolist(), printing)",
     "keep the forward free of reads of tensor values"),
    ("config' object has no attribute", "the model reads a config field the file does not set",
     "add that field to the config (for an encoder-decoder such as T5, decoder_start_token_id "
     "and pad_token_id)"),
    ("co_varnames is too small", "a forward whose signature torch.fx cannot rewrite "
     "(keyword-only or decorated arguments, as Hugging Face models have)",
     "use --trace export (the default tries it first)"),
)


class DataDependentSize(Exception):
    """An exported graph in which an op's output size depends on tensor values (torch.nonzero,
    boolean indexing): its cost cannot be known before the data is."""

    def __init__(self, op: str, module: str, source: str):
        super().__init__(f"{op} gives a data-dependent output shape")
        self.planner_module = module
        self.planner_source = source


class ModuleStack:
    """Tracks which module is running, to name the culprit when tracing fails."""

    def __init__(self, model: torch.nn.Module):
        self.names = {id(m): (n or f"{type(m).__name__} (the root)") for n, m in model.named_modules()}
        self.stack: list[str] = []

    @property
    def current(self) -> str:
        """The innermost module running when the tracer failed (hooks do not pop on errors)."""
        return self.stack[-1] if self.stack else ""

    def __enter__(self):
        def pre(mod, _args):
            self.stack.append(self.names.get(id(mod), type(mod).__name__))

        def post(mod, _args, _out):
            if self.stack:
                self.stack.pop()

        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
                         torch.nn.modules.module.register_module_forward_hook(post)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return False

    def mark(self, exc: Exception) -> Exception:
        """``exc`` with the module that was running when it was raised."""
        if not getattr(exc, "planner_module", ""):
            exc.planner_module = self.current  # type: ignore[attr-defined]
        return exc


def describe(exc: BaseException) -> str:
    """One line: ``in module 'm' at file.py:12 (`code`): construct (Error: first line)``."""
    lines = str(exc).strip().splitlines()
    first = lines[0].split(". ")[0].rstrip(".")[:160] if lines else ""
    where = []
    module = getattr(exc, "planner_module", "")
    if module:
        where.append(f"in module '{module}'")
    source = getattr(exc, "planner_source", "") or model_frame(exc)
    if source:
        where.append(f"at {source}")
    construct = _construct(exc)[0]
    detail = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    text = f"{construct} ({detail})" if construct else detail
    return (" ".join(where) + ": " if where else "") + text


def fix_for(exc: BaseException) -> str:
    """What to change in the model for the construct ``exc`` reports, or ""."""
    return _construct(exc)[1]


def expert_loop_fix(model: torch.nn.Module, exc: BaseException) -> str:
    """What to change when a data-dependent size stopped the trace inside an MoE layer that
    runs its experts one by one (a ``ModuleList`` named ``*experts*``, each picking its tokens
    with ``torch.where``/``nonzero``, as eager Mixtral-style code does), or ""."""
    module = getattr(exc, "planner_module", "")
    if not module or "sizes independent of values" not in fix_for(exc):
        return ""
    for name, child in model.named_modules():
        # the list is the failing module's own child, or the failing module lies inside it
        inside = name.rpartition(".")[0] == module or module == name or module.startswith(
            name + ".")
        if (inside and isinstance(child, torch.nn.ModuleList) and len(child) > 1
                and "expert" in name.rsplit(".", 1)[-1].lower()):
            return (f"'{name}' looks like experts run one by one on the tokens each picks: stack "
                    "their weights and run them as one torch._grouped_mm over the routed tokens "
                    "(as transformers' grouped_mm experts do), which the planner prices, with "
                    "expert parallelism")
    return ""


def _construct(exc: BaseException) -> tuple[str, str]:
    text = " ".join(str(e) for e in _chain(exc)).lower()
    for needle, construct, fix in CONSTRUCTS:
        if needle in text:
            return construct, fix
    return "", ""


def model_frame(exc: BaseException) -> str:
    """``file.py:line (`code`)`` of the innermost frame of the model's own code (not torch's, the
    planner's or Python's) in the exception's traceback, or ""."""
    for e in _chain(exc):
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not os.path.abspath(f.filename).startswith(_NOT_MODEL_CODE)]
        if frames:
            return _format(frames[-1].filename, frames[-1].lineno, frames[-1].line or "")
    return ""


def stack_trace_frame(stack_trace: str | None) -> str:
    """The innermost model frame of an exported node's ``stack_trace`` text, or ""."""
    found = ""
    lines = (stack_trace or "").splitlines()
    for i, line in enumerate(lines):
        text = line.strip()
        if not text.startswith('File "'):
            continue
        filename, _, rest = text[len('File "'):].partition('"')
        if os.path.abspath(filename).startswith(_NOT_MODEL_CODE):
            continue
        lineno = rest.split("line", 1)[-1].split(",")[0].strip()
        code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        found = _format(filename, int(lineno) if lineno.isdigit() else None, code)
    return found


def _format(filename: str, lineno: int | None, code: str) -> str:
    where = f"{os.path.basename(filename)}:{lineno}" if lineno else os.path.basename(filename)
    return f"{where} (`{code.strip()[:80]}`)" if code.strip() else where


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 8:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out
