"""A tiny DLRM for the TorchRec runtime and export tests, and its two-process plans on the `cpu`
preset: ``tests/planner/runtime/recsys_tiny.py:model`` (4 tables of 8-100 rows, dim 64)."""

import os

from planner.inputs.zoo import RecEntry

SPEC = os.path.abspath(__file__) + ":model"
ENTRY = RecEntry(name="tiny-dlrm", rows=(100, 60, 40, 8), dim=64, pooling=(1, 2, 1, 3),
                 dense_in=4, bottom=(32, 64), top=(16, 1), interaction="dot")
"""Dim 64: the planner cuts a table column-wise into pieces of 32 columns or more."""
GLOBAL_BATCH = 64


def model(device: str = "meta"):
    """(RecNet, None), on the meta device as the planner prices it (the runtime shards it)."""
    from planner.trace.recsys import RecNet  # lazy: torch and TorchRec load only when used

    return RecNet(ENTRY, device=device), None


def make_plan(path: str, *, sharding: str | None = None, fixed: tuple = (),
              table_optimizer: str = "sgd", cluster: str = "cpu", zero: int | None = None):
    """Plan the tiny model on ``cluster`` (2 processes on `cpu`), every table pinned to
    ``sharding`` or some pinned by ``fixed`` ((table, sharding type, tier), ...), the dense part
    with DDP or FSDP2 if ``zero`` pins it, and save it at
    ``path`` with ``model.spec`` naming this file's factory (plan run rebuilds the model)."""
    import planner  # lazy: the planner loads torch
    from planner.recsys_api import plan_recsys  # lazy: as above

    if fixed:  # pins per table: the public API takes one sharding for every table
        from planner.emit import emit_tables  # lazy: as above
        from planner.options import TrainingSpec  # lazy: as above
        from planner.search.tables import RecOptions, plan_tables  # lazy: as above
        from planner.trace.recsys import rec_model  # lazy: as above

        cl = planner.load_cluster(cluster)
        rec = rec_model(model()[0], name="RecNet")
        opts = RecOptions(fixed=tuple(fixed), optimizer=table_optimizer)
        tp = plan_tables(rec, cl, global_batch=GLOBAL_BATCH, opts=opts)
        info = {"name": "RecNet", "source": "factory", "spec": SPEC,
                "num_params": int(rec.dense_params + sum(t.rows * t.dim for t in rec.tables)),
                "fingerprint": "tiny-dlrm-fixed"}
        training = TrainingSpec(global_batch=GLOBAL_BATCH, seq_len=1, dtype="fp32",
                                optimizer="sgd")
        p = emit_tables(model_info=info, rec=rec, tp=tp, cluster=cl, training=training,
                        rec_options=opts)
    else:
        p = plan_recsys(model()[0], cluster=cluster, global_batch=GLOBAL_BATCH, optimizer="sgd",
                        fix=",".join(f"{k}={v}" for k, v in (("sharding", sharding),
                                                              ("zero", zero)) if v is not None),
                        table_optimizer=table_optimizer)
        p.model["spec"] = SPEC
    p.save(path)
    return path
