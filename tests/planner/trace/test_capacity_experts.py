"""Capacity-style Mixture-of-Experts layers (GShard's expert buffers): a router's top-k fills E
buffers of C token slots, and the experts run as batched GEMMs against stacked weights
([E, C, d] x [E, d, f]). The trace takes those GEMMs as routed experts (expert parallelism
shards them) only in a module that routes; the same batched GEMM elsewhere stays a GEMM."""

import dataclasses
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import planner


class CapacityMoE(nn.Module):
    def __init__(self, d=64, f=128, experts=4, k=2, capacity_factor=1.25, route=True):
        super().__init__()
        self.gate = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, f) * 0.02)
        self.w2 = nn.Parameter(torch.randn(experts, f, d) * 0.02)
        self.experts, self.k, self.cf, self.route = experts, k, capacity_factor, route

    def forward(self, x):
        b, t, d = x.shape
        h = x.reshape(-1, d)
        n, e = h.shape[0], self.experts
        slots = int(self.cf * n * self.k / e)
        probs = F.softmax(self.gate(h), -1)
        if self.route == "max":  # top-1, Switch-style
            _, chosen = probs.max(-1)
            hot = F.one_hot(chosen, e).to(h.dtype)
        elif self.route:
            _, chosen = torch.topk(probs, self.k, -1)
            hot = F.one_hot(chosen, e).to(h.dtype).sum(1)  # n x E
        else:  # every token to every group: the same GEMMs, nothing routed
            hot = torch.ones_like(probs)
        position = torch.cumsum(hot, 0) * hot - 1
        keep = (position < slots) & (hot > 0)
        dispatch = F.one_hot(position.clamp(min=0).long(), slots).to(h.dtype) * keep[..., None]
        buffers = torch.einsum("nec,nd->ecd", dispatch, h)  # E x C x d
        out = torch.bmm(F.gelu(torch.bmm(buffers, self.w1)), self.w2)
        combine = dispatch * (probs * hot)[..., None]
        return torch.einsum("nec,ecd->nd", combine, out).reshape(b, t, d)


class PerHead(nn.Module):
    """A dense block that keeps the top-k tokens by a score (as token-selecting attention or
    mixture-of-depths routers do) and projects per head with a stacked [heads, d, f] weight."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.score = nn.Linear(d, 1)
        self.w = nn.Parameter(torch.randn(heads, d // heads, d // heads) * 0.02)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        _, keep = torch.topk(self.score(x).squeeze(-1), t // 2, -1)  # over tokens, not experts
        h = x.reshape(b * t, self.heads, d // self.heads).transpose(0, 1)  # heads x bt x d/h
        out = torch.bmm(h, self.w).transpose(0, 1).reshape(b, t, d)
        return out * keep.sum().to(x.dtype) * 0


class Net(nn.Module):
    def __init__(self, route=True, layers=2, d=64, vocab=256, kinds=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        make = {"routed": lambda: CapacityMoE(d, route=True),
                "top-1": lambda: CapacityMoE(d, k=1, route="max"),
                "unrouted": lambda: CapacityMoE(d, route=False), "per-head": lambda: PerHead(d)}
        kinds = kinds or ["routed" if route else "unrouted"] * layers
        self.layers = nn.ModuleList(make[k]() for k in kinds)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def _prepare(route=True, kinds=None):
    with torch.device("meta"):
        net, ids = Net(route=route, kinds=kinds), torch.zeros(2, 64, dtype=torch.long)
    return planner.prepare(net, example_inputs=(ids,), dtype="fp32")


def test_capacity_experts_are_routed_experts():
    prepared = _prepare(route=True)
    works = [b.work for b in prepared.blocks.blocks if b.work.num_experts]
    assert len(works) == 2 and all(w.num_experts == 4 for w in works)
    # each layer's token slots: E x C = 4 x int(1.25 x 128 x 2 / 4) over the 2 traced samples
    assert all(w.routed_tokens == pytest.approx(4 * 80 / 2) for w in works)
    assert all(w.expert_params == 2 * 4 * 64 * 128 for w in works)
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = planner.TrainingSpec(global_batch=16, seq_len=64, dtype="fp32")
    plans = {ep: planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
        fix={"ep": ep, "dp": 8, "tp": 1, "pp": 1, "zero": 0}, top_k=0)) for ep in (1, 4)}
    weights = {ep: p.stages[0]["predicted"]["memory_bytes"]["weights"] for ep, p in plans.items()}
    experts = 2 * 2 * 4 * 64 * 128 * 4  # bytes of the experts' fp32 weights (2 layers x w1, w2)
    assert weights[1] - weights[4] == pytest.approx(experts * 3 / 4, rel=0.01)
    assert plans[4].predicted["breakdown"]["ep_comm_s"] > 0
    assert plans[1].predicted["breakdown"].get("ep_comm_s", 0.0) == 0.0
    # the plan records the experts the trace found; at ep=1 plan show still names them
    from planner.report.summary import summary
    assert plans[1].model["routed_experts"] == 4
    assert "experts     ep=1: 4 routed experts per MoE layer on every rank (--fix ep=N " \
        "spreads them)" in summary(plans[1])
    # on device groups, which price no expert parallelism, the hint would be refused
    grouped = dataclasses.replace(plans[1], cluster={**plans[1].cluster, "groups": []})
    assert "every rank (expert parallelism is not priced on clusters of device groups)" in \
        summary(grouped)
    assert plans[1].parallel["recompute"] == "none"  # so the hardware FLOPs add only the
    assert "for TFLOP/s (+ experts' empty token slots)" in summary(plans[1])  # empty slots


def test_routing_imbalance_leaves_capacity_slots_as_they_are():
    """The slots are computed, sent and kept whole however the router spreads the tokens (an
    uneven router fills some and drops tokens at others): moe_imbalance does not scale them."""
    from costmodels.engine import engine_from_mapping

    prepared = _prepare(route=True)
    assert all(b.work.expert_capacity == 1.0 for b in prepared.blocks.blocks
               if b.work.num_experts)
    cluster = planner.load_cluster("dgx-h100", nodes=1)

    def predicted(imbalance):
        training = planner.TrainingSpec(global_batch=16, seq_len=64, dtype="fp32",
                                        engine=engine_from_mapping(f"moe_imbalance={imbalance}"))
        p = planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
            fix={"ep": 4, "dp": 8, "tp": 1, "pp": 1, "zero": 0, "recompute": "none"}, top_k=0))
        return p.predicted["breakdown"], p.stages[0]["predicted"]["memory_bytes"]

    even, uneven = predicted(1.0), predicted(2.0)
    assert uneven[0]["ep_comm_s"] == pytest.approx(even[0]["ep_comm_s"])
    assert uneven[0]["compute_s"] == pytest.approx(even[0]["compute_s"])
    assert uneven[1]["activations"] == pytest.approx(even[1]["activations"])


def test_stacked_weights_without_a_router_stay_batched_gemms():
    prepared = _prepare(route=False)
    assert not any(b.work.num_experts for b in prepared.blocks.blocks)
    with pytest.raises(planner.SpecError, match="ep"):
        planner.plan_prepared(prepared, planner.load_cluster("dgx-h100", nodes=1),
                              planner.TrainingSpec(global_batch=16, seq_len=64, dtype="fp32"),
                              planner.SearchOptions(fix={"ep": 4}, top_k=0))


def test_a_router_counts_in_its_own_layer_only_and_over_as_many_experts():
    """An earlier layer's router does not make a later layer's stacked GEMMs experts, nor does a
    top-k over something else than the stacked weight's groups (tokens, here)."""
    prepared = _prepare(kinds=["routed", "unrouted", "per-head"])
    assert [b.work.num_experts for b in prepared.blocks.blocks
            if b.name.startswith("layers.")] == [4, 0, 0]


def test_empty_capacity_slots_are_hardware_not_model_flops():
    """The devices compute every slot; MFU counts the routed copies (top-k x tokens) only."""
    def traced(cf):
        with torch.device("meta"):
            net, ids = Net(), torch.zeros(2, 64, dtype=torch.long)
            for layer in net.layers:
                layer.cf = cf
        return planner.prepare(net, example_inputs=(ids,), dtype="fp32").blocks.blocks

    works = {cf: [b.work for b in traced(cf)] for cf in (1.0, 2.0)}
    assert sum(w.expert_slot_flops for w in works[1.0]) == 0.0
    slots = sum(w.expert_flops for w in works[2.0])
    assert sum(w.expert_slot_flops for w in works[2.0]) == pytest.approx(slots / 2)
    # model FLOPs alike (the dispatch einsums grow with the slots too: counted, as they run)
    experts_only = [sum(w.train_flops + w.padding_train_flops - 3 * w.expert_flops for w in
                        works[cf]) for cf in (1.0, 2.0)]
    routed = [sum(3 * (w.expert_flops - w.expert_slot_flops) for w in works[cf])
              for cf in (1.0, 2.0)]
    assert routed[0] == pytest.approx(routed[1])
    assert experts_only[1] > experts_only[0]  # the slot-sized einsums


def test_a_top_1_router_by_max_routes_too():
    prepared = _prepare(kinds=["top-1", "top-1"])
    works = [b.work for b in prepared.blocks.blocks if b.name.startswith("layers.")]
    assert [w.num_experts for w in works] == [4, 4]
    # 128 tokens x 1 copy in 4 x 40 slots: a fifth of them empty
    assert works[0].expert_slot_flops == pytest.approx(works[0].expert_flops * (1 - 128 / 160))
