"""The plan file's JSON schema (plan.v1.json beside this module) and the invariants it cannot express."""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from importlib import resources

from costmodels.engine import engine_from_mapping
from planner.errors import SpecError
from planner.options import PLACEMENTS

SCHEMA_ID = "planner.plan/v1"
"""The ``schema`` value every plan file carries."""


@lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON schema of plan files (Draft 2020-12)."""
    text = resources.files("planner.planfile").joinpath("plan.v1.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(d: dict, where: str = "plan") -> None:
    """Raise SpecError naming the first failing key path."""
    import jsonschema  # lazy: a heavy dependency that only checking a plan file needs

    if d.get("schema") is None and ("model_type" in d or "architectures" in d):
        raise SpecError(f"{where}: this is a model's config.json, not a plan; make a plan of it "
                        "first with `plan solve CONFIG.json --cluster ... -o PLAN.json`")
    if d.get("schema") is None and isinstance(d.get("measured"), dict):
        raise SpecError(f"{where}: this is what plan run measured (its -o file), not a plan; give "
                        "the plan file it ran")
    if d.get("schema") is None:
        raise SpecError(f"{where}: not a plan file (no 'schema': '{SCHEMA_ID}' in it); give a "
                        "file `plan solve ... -o PLAN.json` wrote")
    if d.get("schema") != SCHEMA_ID:
        kind = str(d.get("schema")).partition("/")[0]
        if kind.startswith("planner.") and kind != "planner.plan":  # another file of the planner's
            raise SpecError(f"{where}: a {kind.removeprefix('planner.')} file (schema "
                            f"{d.get('schema')!r}), not a plan; give a file `plan solve ... -o "
                            "PLAN.json` wrote")
        raise SpecError(f"{where}: schema is {d.get('schema')!r}, expected '{SCHEMA_ID}'; "
                        "re-create the plan with this planner version")
    validator = jsonschema.Draft202012Validator(schema())
    d, actions = _without_actions(d)
    errors = sorted(validator.iter_errors(d), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        path = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise SpecError(f"{where}: invalid plan at {path}: {err.message[:200]}; put back the "
                        "value plan solve wrote, or re-plan with plan solve")
    _check_actions(actions, where)
    if d.get("embeddings"):
        _check_tables(d["embeddings"], where)
    _check_consistency(d, where)


ACTION = re.compile(r"[0-9]+[FBW][0-9]+")
"""One schedule action, ``<stage><F|B|W><micro-batch>`` (the schema's pattern, checked here: a
step of many micro-batches lists hundreds of thousands, which jsonschema checks slowly)."""


def _without_actions(d: dict) -> tuple[dict, object]:
    """``d`` with ``schedule.actions`` emptied (a shallow copy), and the actions."""
    sched = d.get("schedule")
    if not isinstance(sched, dict) or not isinstance(sched.get("actions"), list):
        return d, []
    return {**d, "schedule": {**sched, "actions": []}}, sched["actions"]


def _check_actions(actions, where: str) -> None:
    for r, acts in enumerate(actions):
        if not isinstance(acts, list):
            raise SpecError(f"{where}: invalid plan at schedule.actions.{r}: expected a list")
        for i, a in enumerate(acts):
            if not isinstance(a, str) or not ACTION.fullmatch(a):
                raise SpecError(f"{where}: invalid plan at schedule.actions.{r}.{i}: {a!r} is not "
                                "an action like '0F3'")


def _check_consistency(d: dict, where: str) -> None:
    """Invariants the schema cannot express."""
    par = d["parallel"]
    gpus = par["dp"] * par.get("cp", 1) * par["tp"] * par["pp"]
    if gpus != d["cluster"]["num_gpus"]:
        raise SpecError(f"{where}: parallel dp*cp*tp*pp = {gpus} but the cluster has "
                        f"{d['cluster']['num_gpus']} GPUs; re-plan with plan solve (a plan file's "
                        "degrees are not edited by hand), or restore the file plan solve wrote")
    if (par["dp"] * par.get("cp", 1) * par["tp"]) % (par.get("ep", 1) * par.get("etp", 1)):
        ep_etp = par.get('ep', 1) * par.get('etp', 1)
        raise SpecError(f"{where}: parallel ep*etp = {ep_etp} does not divide dp*cp*tp = "
                        f"{par['dp'] * par.get('cp', 1) * par['tp']}, the ranks the experts are "
                        "spread over; re-plan with plan solve --fix ep=N (a plan file's degrees "
                        "are not edited by hand), or restore the file plan solve wrote")
    replicate = par.get("dp_replicate", 1)
    sites = d["cluster"].get("groups") or []
    if replicate > 1 and (par["dp"] % replicate or len(sites) != replicate or
                          len({g["num_gpus"] for g in sites}) != 1):
        raise SpecError(f"{where}: parallel dp_replicate = {replicate} needs as many sites of "
                        f"equal size, each holding dp/{replicate} of the {par['dp']} replicas; "
                        "re-plan with plan solve, or restore the file plan solve wrote")
    pred = d.get("predicted", {})
    step = pred.get("step_time_s")
    for key, value in [("step_time_s", step)] + [(f"breakdown.{k}", v) for k, v in
                                                 (pred.get("breakdown") or {}).items()]:
        if isinstance(value, float) and not math.isfinite(value):  # (JSON's Infinity, NaN)
            raise SpecError(f"{where}: predicted.{key} = {value} is not a number of seconds; "
                            "re-plan, or restore the file plan solve wrote")
    for part, seconds in (pred.get("breakdown") or {}).items():
        if isinstance(step, (int, float)) and isinstance(seconds, (int, float)) and \
                not 0 <= seconds <= step * (1 + 1e-6):
            raise SpecError(f"{where}: predicted.breakdown.{part} = {seconds:g} s is not a part "
                            f"of the {step:g} s step; re-plan, or restore the file plan solve "
                            "wrote")
    try:  # the engine settings it was priced with, as every command reads them back
        engine_from_mapping(d["training"].get("engine"))
    except SpecError as exc:
        raise SpecError(f"{where}: training.{exc}") from None
    if len(d["stages"]) != par["pp"] * par["vpp"]:
        raise SpecError(f"{where}: {len(d['stages'])} stages listed for pp={par['pp']} x "
                        f"vpp={par['vpp']}; edit them to agree, or re-plan with plan solve")
    listed = [b for st in d["stages"] for b in st["blocks"]]
    names = [b["name"] for b in d["model"]["blocks"]]
    if listed != names:
        raise SpecError(f"{where}: stages must list every block exactly once, in order; restore "
                        "the file plan solve wrote, or re-plan")
    _check_ranks(d["stages"], d["cluster"]["num_gpus"], par["pp"], where)
    modules = {b["name"]: b.get("modules") for b in d["model"]["blocks"]}
    for i, st in enumerate(d["stages"]):  # a stage runs its blocks' modules (engines cut by them)
        own = [modules[b] for b in st["blocks"]]
        if None not in own and set(st["modules"]) != {m for ms in own for m in ms}:
            more = ", ..." if len(st["blocks"]) > 3 else ""
            raise SpecError(f"{where}: stages[{i}].modules are not the modules of its blocks "
                            f"({', '.join(st['blocks'][:3])}{more}); restore the file plan solve "
                            "wrote, or re-plan")
    if par.get("placement", PLACEMENTS[0]) not in PLACEMENTS:
        raise SpecError(f"{where}: parallel.placement {par['placement']!r} is not one of "
                        f"{', '.join(PLACEMENTS)}; restore the file plan solve wrote, or re-plan")
    samples = par["micro_batch"] * par["num_microbatches"] * par["dp"]
    if samples != d["training"]["global_batch"]:
        raise SpecError(f"{where}: micro_batch x num_microbatches x dp = {par['micro_batch']} x "
                        f"{par['num_microbatches']} x {par['dp']} = {samples} samples, but "
                        f"training.global_batch is {d['training']['global_batch']}; re-plan with "
                        "plan solve (a plan file's batch is not edited by hand), or restore the "
                        "file plan solve wrote")
    if par.get("ep", 1) * par.get("etp", 1) > 1 and not d["model"].get("routed_experts"):
        key = "ep" if par.get("ep", 1) > 1 else "etp"
        raise SpecError(f"{where}: parallel.{key} = {par[key]}, but the model has no routed "
                        "experts (model.routed_experts, which plan solve records); re-plan with "
                        "plan solve, or restore the file plan solve wrote")
    cl = d["cluster"]
    if not cl.get("groups") and cl["nodes"] * cl["gpus_per_node"] != cl["num_gpus"]:
        raise SpecError(f"{where}: cluster.nodes x gpus_per_node = {cl['nodes']} x "
                        f"{cl['gpus_per_node']}, but cluster.num_gpus is {cl['num_gpus']}; "
                        "restore the file plan solve wrote, or re-plan")


def _check_ranks(stages: list, num_gpus: int, pp: int, where: str) -> None:
    """Each stage's GPUs: ranks of the cluster, none twice, the same for the chunks of one
    pipeline rank and none shared between pipeline ranks (a new-user check's stage of ranks
    [0, 0, 0, 0] was shown, simulated and diffed; only plan run refused it)."""
    owner: dict = {}  # global rank -> the pipeline rank holding it
    held: dict = {}  # pipeline rank -> its ranks
    for i, st in enumerate(stages):
        ranks = st.get("ranks")
        if ranks is None:
            continue
        bad = next((r for r in ranks if not 0 <= r < num_gpus), None)
        if bad is not None or len(set(ranks)) != len(ranks):
            what = (f"rank {bad} is not one of the cluster's {num_gpus} GPUs" if bad is not None
                    else "a rank is listed twice")
            raise SpecError(f"{where}: stages[{i}].ranks: {what}; restore the file plan solve "
                            "wrote, or re-plan")
        pipe = st.get("pipeline_rank", st.get("index", i) % pp)
        if not 0 <= pipe < pp:
            raise SpecError(f"{where}: stages[{i}].pipeline_rank: {pipe} is not one of the "
                            f"{pp} pipeline ranks; restore the file plan solve wrote, or re-plan")
        if held.setdefault(pipe, sorted(ranks)) != sorted(ranks):
            raise SpecError(f"{where}: stages[{i}].ranks differ from those of the other chunks "
                            f"of pipeline rank {pipe}; restore the file plan solve wrote, or "
                            "re-plan")
        for r in ranks:
            if owner.setdefault(r, pipe) != pipe:
                raise SpecError(f"{where}: stages[{i}].ranks: rank {r} also runs pipeline rank "
                                f"{owner[r]}; restore the file plan solve wrote, or re-plan")


def _check_tables(emb: dict, where: str) -> None:
    """Each table's shards: on ranks of the plan's world, inside the table, none overlapping,
    together the whole table, or a whole copy each for a data-parallel table (a new-user check's
    shard on rank 99 of 8, and one of 5 x 5 of a 1M x 32 table, were shown and exported to
    TorchRec)."""
    world = emb.get("world_size")
    for i, t in enumerate(emb.get("tables") or ()):
        at = f"embeddings.tables[{i}] ({t.get('name')})"
        for r in t.get("ranks") or ():
            if isinstance(world, int) and not 0 <= r < world:
                raise SpecError(f"{where}: {at}.ranks: rank {r} is not one of the plan's {world}; "
                                "restore the file plan solve wrote, or re-plan")
        shards = t.get("shards") or []
        if not shards or not all(isinstance(t.get(k), int) for k in ("rows", "dim")):
            continue
        boxes = []
        for j, sh in enumerate(shards):
            (r0, c0), (nr, nc) = sh["offsets"], sh["sizes"]
            if isinstance(world, int) and not 0 <= sh["rank"] < world:
                raise SpecError(f"{where}: {at}.shards[{j}].rank: {sh['rank']} is not one of the "
                                f"plan's {world} ranks; restore the file plan solve wrote")
            if min(r0, c0, nr, nc) < 0 or r0 + nr > t["rows"] or c0 + nc > t["dim"]:
                raise SpecError(f"{where}: {at}.shards[{j}]: rows {r0}+{nr}, columns {c0}+{nc} "
                                f"lie outside the {t['rows']} x {t['dim']} table; restore the "
                                "file plan solve wrote")
            if nr and nc:  # (the last ranks of a row split may get none: TorchRec's even rows)
                boxes.append((r0, r0 + nr, c0, c0 + nc))
        if t.get("sharding_type") == "data_parallel":  # a whole copy on each of its ranks
            if any(b != (0, t["rows"], 0, t["dim"]) for b in boxes):
                raise SpecError(f"{where}: {at}.shards: a data-parallel table's copies are whole "
                                "tables; restore the file plan solve wrote, or re-plan")
            continue
        overlap = any(a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]
                      for k, a in enumerate(boxes) for b in boxes[k + 1:])
        if overlap or sum((b[1] - b[0]) * (b[3] - b[2]) for b in boxes) != t["rows"] * t["dim"]:
            raise SpecError(f"{where}: {at}.shards do not cover the {t['rows']} x {t['dim']} "
                            "table once each; restore the file plan solve wrote, or re-plan")
