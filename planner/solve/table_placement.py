"""Embedding-table placement as a CP-SAT model: for each table one layout among its options, and a
rank for each of the layout's movable pieces, minimising the slowest rank's sparse time.

Plain numbers in, choices out. An option has *fixed* loads (on ranks the layout itself names:
data-parallel on every rank, row-wise on all, table-row-wise on one node) and *pieces* (a
table-wise table is one piece, a column-wise one k pieces) that the solver places on any rank. A
load is a vector of per-resource amounts:

    time   seconds of lookups on the rank (forward, backward and update)
    si, sx seconds the rank spends sending pooled outputs inside / outside its node
    ri, rx seconds of receiving it saves (it holds the shard, so its own samples stay local)
    hbm    bytes of device memory
    host   bytes of host memory (a node's ranks share it)

The model: T >= time_r + C_r, C_r >= si_r, C_r >= RI - ri_r, C_r >= sx_r, C_r >= RX - rx_r for
every rank r (RI, RX: what a rank receives if it holds nothing), memory within each rank's and each
node's capacity, and the objective T + (all-reduce seconds of the data-parallel options chosen).
A greedy assignment (largest tables first, each to the option that raises the objective least) is
the solver's hint and the answer when CP-SAT finds nothing in time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.solve.cpsat import solve

KEYS = ("time", "si", "sx", "ri", "rx", "hbm", "host")
SCALE_S = 1e7
"""Seconds -> integer units of 0.1 microsecond."""
SCALE_B = 1.0 / 2**20
"""Bytes -> integer MiB (rounded up)."""


@dataclass
class Load:
    time: float = 0.0
    si: float = 0.0
    sx: float = 0.0
    ri: float = 0.0
    rx: float = 0.0
    hbm: float = 0.0
    host: float = 0.0

    def add(self, other: "Load") -> None:
        for k in KEYS:
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass
class Option:
    """One layout of one table."""

    label: str
    fixed: dict = field(default_factory=dict)
    """rank -> Load."""
    pieces: list = field(default_factory=list)
    """Load of each piece (placed by the solver)."""
    global_s: float = 0.0
    """Seconds every rank spends on this option outside its own load (gradient all-reduce)."""
    group: str = ""
    """The option's group (a sharding type): the first option of a group chosen costs the
    group's seconds once (``Problem.group_s``: the host issuing that group's exchanges)."""


@dataclass
class Problem:
    world: int
    gpus_per_node: int
    hbm_cap: list
    """Bytes of device memory each rank can give the tables."""
    host_cap: float
    """Bytes of host memory each node can give them."""
    recv_intra_s: float
    """Seconds a rank spends receiving inside its node if it holds no shard of any table."""
    recv_inter_s: float
    options: list
    """Per table, its Options."""
    base_s: float = 0.0
    """Latency and other per-rank seconds that no choice changes."""
    group_s: dict = field(default_factory=dict)
    """Seconds a group costs once when any of its options is chosen."""


@dataclass
class Placement:
    choice: list
    """Per table, the index of its option."""
    ranks: list
    """Per table, the rank of each piece of the chosen option."""
    objective_s: float
    status: str
    gap: float | None
    bound_s: float | None
    wall_s: float
    greedy_s: float
    """The greedy assignment's objective (the solver's starting point)."""


def evaluate(problem: Problem, choice: list, ranks: list) -> tuple:
    """(objective seconds, per-rank loads) of an assignment; memory is not checked here."""
    loads = [Load() for _ in range(problem.world)]
    glob = 0.0
    for t, (o, rs) in enumerate(zip(choice, ranks)):
        opt = problem.options[t][o]
        for r, ld in opt.fixed.items():
            loads[r].add(ld)
        for piece, r in zip(opt.pieces, rs):
            loads[r].add(piece)
        glob += opt.global_s
    groups = {problem.options[t][o].group for t, o in enumerate(choice)}
    glob += sum(problem.group_s.get(g, 0.0) for g in groups)
    return max(rank_time(problem, ld) for ld in loads) + glob, loads


def rank_time(problem: Problem, ld: Load) -> float:
    comm = max(ld.si, problem.recv_intra_s - ld.ri, ld.sx, problem.recv_inter_s - ld.rx)
    return problem.base_s + ld.time + comm


def fits(problem: Problem, loads: list) -> bool:
    g = problem.gpus_per_node
    if any(ld.hbm > cap for ld, cap in zip(loads, problem.hbm_cap)):
        return False
    for n in range(0, problem.world, g):
        if sum(ld.host for ld in loads[n:n + g]) > problem.host_cap:
            return False
    return True


def greedy(problem: Problem) -> tuple | None:
    """Largest tables first; each takes the option and ranks that keep the objective lowest while
    memory fits (pieces go to the least-loaded ranks with room)."""
    order = sorted(range(len(problem.options)),
                   key=lambda t: -max(sum(p.time for p in o.pieces) + sum(f.time for f in o.fixed.values())
                                      for o in problem.options[t]))
    loads = [Load() for _ in range(problem.world)]
    choice, ranks = [0] * len(order), [[] for _ in order]
    glob = 0.0
    used: set = set()
    for t in order:
        best = None
        for o, opt in enumerate(problem.options[t]):
            trial = [Load(**vars(ld)) for ld in loads]
            for r, ld in opt.fixed.items():
                trial[r].add(ld)
            placed = []
            for piece in opt.pieces:
                room = [r for r in range(problem.world)
                        if trial[r].hbm + piece.hbm <= problem.hbm_cap[r]]
                if not room:
                    break
                r = min(room, key=lambda r: (rank_time(problem, _plus(trial[r], piece)), r))
                trial[r].add(piece)
                placed.append(r)
            if len(placed) < len(opt.pieces) or not fits(problem, trial):
                continue
            new_group = problem.group_s.get(opt.group, 0.0) if opt.group not in used else 0.0
            score = max(rank_time(problem, ld) for ld in trial) + glob + opt.global_s + new_group
            if best is None or score < best[0] - 1e-12:
                best = (score, o, placed, trial)
        if best is None:
            return None
        _, choice[t], ranks[t], loads = best
        chosen = problem.options[t][choice[t]]
        glob += chosen.global_s + (problem.group_s.get(chosen.group, 0.0)
                                   if chosen.group not in used else 0.0)
        used.add(chosen.group)
    return choice, ranks


def _plus(a: Load, b: Load) -> Load:
    c = Load(**vars(a))
    c.add(b)
    return c


def place(problem: Problem, *, time_limit_s: float = 10.0, seed: int = 0,
          workers: int = 1) -> Placement | None:
    """The best placement CP-SAT finds within ``time_limit_s`` (None: nothing fits in memory)."""
    hint = greedy(problem)
    greedy_s = evaluate(problem, *hint)[0] if hint else float("inf")
    m = cp_model.CpModel()
    W, g = problem.world, problem.gpus_per_node
    x = [[m.new_bool_var(f"x{t}_{o}") for o in range(len(opts))]
         for t, opts in enumerate(problem.options)]
    y = {}  # (t, o, piece) -> [bool per rank]
    terms = {k: [[] for _ in range(W)] for k in KEYS}
    glob = []
    group_used: dict = {}
    for t, opts in enumerate(problem.options):
        m.add_exactly_one(x[t])
        for o, opt in enumerate(opts):
            for r, ld in opt.fixed.items():
                for k in KEYS:
                    v = _units(k, getattr(ld, k))
                    if v:
                        terms[k][r].append((v, x[t][o]))
            for p, piece in enumerate(opt.pieces):
                ys = [m.new_bool_var(f"y{t}_{o}_{p}_{r}") for r in range(W)]
                y[t, o, p] = ys
                m.add(sum(ys) == x[t][o])
                for r in range(W):
                    for k in KEYS:
                        v = _units(k, getattr(piece, k))
                        if v:
                            terms[k][r].append((v, ys[r]))
            if opt.global_s:
                glob.append((_units("time", opt.global_s), x[t][o]))
            if problem.group_s.get(opt.group):
                if opt.group not in group_used:
                    group_used[opt.group] = m.new_bool_var(f"g_{opt.group}")
                    glob.append((_units("time", problem.group_s[opt.group]),
                                 group_used[opt.group]))
                m.add_implication(x[t][o], group_used[opt.group])
    horizon = int(sum(max(_units("time", f.time) for f in [Load()] + list(o.fixed.values()) + o.pieces)
                      * (1 + len(o.pieces)) for opts in problem.options for o in opts)
                  + _units("time", problem.recv_intra_s + problem.recv_inter_s) * 4
                  + sum(v for v, _ in glob) + _units("time", problem.base_s) + 10)
    T = m.new_int_var(0, horizon, "T")
    total = []  # the slowest rank is at least the mean: a bound the LP relaxation lacks
    for r in range(W):
        lin = {k: sum(v * b for v, b in terms[k][r]) for k in KEYS}
        C = m.new_int_var(0, horizon, f"C{r}")
        m.add(C >= lin["si"])
        m.add(C >= lin["sx"])
        m.add(C >= _units("time", problem.recv_intra_s) - lin["ri"])
        m.add(C >= _units("time", problem.recv_inter_s) - lin["rx"])
        m.add(T >= _units("time", problem.base_s) + lin["time"] + C)
        total.append(lin["time"] + C)
        m.add(lin["hbm"] <= int(problem.hbm_cap[r] * SCALE_B))
    m.add(W * T >= W * _units("time", problem.base_s) + sum(total))
    for n in range(0, W, g):
        m.add(sum(sum(v * b for v, b in terms["host"][r]) for r in range(n, min(W, n + g)))
              <= int(problem.host_cap * SCALE_B))
    m.minimize(T + sum(v * b for v, b in glob))
    if hint:
        choice, ranks = hint
        for t, opts in enumerate(problem.options):
            for o in range(len(opts)):
                m.add_hint(x[t][o], o == choice[t])
                for p in range(len(opts[o].pieces)):
                    for r in range(W):
                        m.add_hint(y[t, o, p][r], o == choice[t] and ranks[t][p] == r)
    res = solve(m, time_limit_s=time_limit_s, seed=seed, workers=workers)
    if not res.found:
        if hint is None:
            return None
        return Placement(hint[0], hint[1], greedy_s, "greedy", None, None, res.wall_s, greedy_s)
    s = res.solver
    choice, ranks = [], []
    for t, opts in enumerate(problem.options):
        o = next(o for o in range(len(opts)) if s.value(x[t][o]))
        choice.append(o)
        ranks.append([next(r for r in range(W) if s.value(y[t, o, p][r]))
                      for p in range(len(opts[o].pieces))])
    objective = evaluate(problem, choice, ranks)[0]
    return Placement(choice, ranks, objective, res.status, res.gap,
                     res.bound / SCALE_S if res.bound is not None else None, res.wall_s, greedy_s)


def _units(key: str, value: float) -> int:
    if key in ("hbm", "host"):
        return -int(-value * SCALE_B // 1) if value > 0 else 0
    return int(round(value * SCALE_S))
