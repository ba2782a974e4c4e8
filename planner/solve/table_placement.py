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


from planner.solve.cpsat import solve

KEYS = ("time", "si", "sx", "ri", "rx", "hbm", "host")
SCALE_S = 1e7
"""Seconds -> integer units of 0.1 microsecond."""
SCALE_B = 1.0 / 2**20
"""Bytes -> integer MiB (rounded up)."""
MAX_MODEL_TERMS = 2_000_000
"""Placements with more (option, rank) terms than this are not handed to CP-SAT (building the
model alone would take minutes): the best greedy start is the answer, status ``greedy``."""


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
    group's host seconds once (``Problem.group_s``: the host issuing that group's exchanges)."""
    host_s: float = 0.0
    """Host seconds this option adds to the step (issuing its lookups' ops)."""


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
    """Host seconds a group costs once when any of its options is chosen."""
    host_base_s: float = 0.0
    """Host seconds of the step that no choice changes (the dense part's ops, the loss, ...)."""
    dense_s: float = 0.0
    """Device seconds of the step besides the sparse part (the dense forward and backward, its
    exposed gradient reduction and optimizer step)."""
    overlap_dense: bool = False
    """The embedding exchange runs behind the dense compute (nested pipelines): each rank's
    lookups, then the longer of its exchange and the dense compute (rank_time), not their sum;
    the lookups share the GPU with the dense part and stay apart."""
    dense_compute_s: float | None = None
    """Of ``dense_s``, the dense forward and backward, which a nested pipeline's exchange runs
    beside (the rest, the reduction's exposed tail and the optimizer, after both); None: all of
    ``dense_s``."""
    comm_latency_s: float = 0.0
    """Latency every rank's exchange pays (both tiers' where the ranks span nodes)."""

    @property
    def beside_s(self) -> float:
        """The dense seconds a nested pipeline's exchange runs beside."""
        return self.dense_s if self.dense_compute_s is None else self.dense_compute_s

    def step_s(self, sparse_s: float, global_s: float, host_s: float) -> float:
        """The step the objective minimizes: the host issuing the ops, or the device running
        them, whichever is longer (``sparse_s``: the slowest rank_time, the dense part within
        it where nested)."""
        device = sparse_s + self.dense_s - self.beside_s if self.overlap_dense \
            else sparse_s + self.dense_s
        return max(self.host_base_s + host_s, device + global_s)


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
    """The best greedy start's objective (the solver's starting point)."""


def evaluate(problem: Problem, choice: list, ranks: list) -> tuple:
    """(objective seconds, per-rank loads) of an assignment; memory is not checked here."""
    loads = [Load() for _ in range(problem.world)]
    glob = host = 0.0
    for t, (o, rs) in enumerate(zip(choice, ranks)):
        opt = problem.options[t][o]
        for r, ld in opt.fixed.items():
            loads[r].add(ld)
        for piece, r in zip(opt.pieces, rs):
            loads[r].add(piece)
        glob += opt.global_s
        host += opt.host_s
    groups = {problem.options[t][o].group for t, o in enumerate(choice)}
    host += sum(problem.group_s.get(g, 0.0) for g in groups)
    return problem.step_s(max(rank_time(problem, ld) for ld in loads), glob, host), loads


def rank_time(problem: Problem, ld: Load) -> float:
    """A rank's sparse seconds: its lookups and its exchange (with a nested pipeline the
    exchange and the dense part at once, the longer counting)."""
    comm = max(ld.si, problem.recv_intra_s - ld.ri, ld.sx, problem.recv_inter_s - ld.rx) \
        + problem.comm_latency_s
    if problem.overlap_dense:
        comm = max(comm, problem.beside_s)
    return problem.base_s + ld.time + comm


def fits(problem: Problem, loads: list) -> bool:
    g = problem.gpus_per_node
    if any(ld.hbm > cap for ld, cap in zip(loads, problem.hbm_cap)):
        return False
    for n in range(0, problem.world, g):
        if sum(ld.host for ld in loads[n:n + g]) > problem.host_cap:
            return False
    return True


def greedy(problem: Problem, only: str | None = None) -> tuple | None:
    """Largest tables first; each takes the option and ranks that keep the objective lowest while
    memory fits (pieces go to the ranks where they finish soonest, with room). ``only``: keep to
    options of that group (sharding type) where a table has one. Only the ranks an option
    touches are re-timed: the objective is tracked as the largest rank time so far (a rank's time
    never falls, but for the receiving it saves, which this keeps as an upper bound)."""
    W, g = problem.world, problem.gpus_per_node
    order = sorted(range(len(problem.options)),
                   key=lambda t: -max(sum(p.time for p in o.pieces) + sum(f.time for f in o.fixed.values())
                                      for o in problem.options[t]))
    loads = [Load() for _ in range(W)]
    times = [rank_time(problem, ld) for ld in loads]
    host = [0.0] * ((W + g - 1) // g)
    top = max(times)
    choice, ranks = [0] * len(order), [[] for _ in order]
    glob = host_s = 0.0
    used: set = set()
    for t in order:
        opts = list(enumerate(problem.options[t]))
        if only is not None and any(o.group == only for _, o in opts):
            opts = [(i, o) for i, o in opts if o.group == only]
        best = None
        for o, opt in opts:
            touched: dict = {}
            ok = True
            for r, ld in opt.fixed.items():
                cur = touched.setdefault(r, Load(**vars(loads[r])))
                cur.add(ld)
                if cur.hbm > problem.hbm_cap[r]:
                    ok = False
                    break
            placed = []
            for piece in opt.pieces if ok else ():
                def after(r):
                    return _plus(touched.get(r, loads[r]), piece)
                room = [r for r in range(W) if touched.get(r, loads[r]).hbm + piece.hbm
                        <= problem.hbm_cap[r]]
                if not room:
                    ok = False
                    break
                r = min(room, key=lambda r: (rank_time(problem, after(r)), r))
                touched[r] = after(r)
                placed.append(r)
            if not ok:
                continue
            node_host: dict = {}
            for r, ld in touched.items():
                node_host[r // g] = node_host.get(r // g, 0.0) + ld.host - loads[r].host
            if any(host[n] + extra > problem.host_cap for n, extra in node_host.items()):
                continue
            new_group = problem.group_s.get(opt.group, 0.0) if opt.group not in used else 0.0
            worst = max([top] + [rank_time(problem, ld) for ld in touched.values()])
            score = (problem.step_s(worst, glob + opt.global_s, host_s + opt.host_s + new_group),
                     worst)
            if best is None or score[0] < best[0][0] - 1e-12 or (
                    score[0] <= best[0][0] + 1e-12 and score[1] < best[0][1] - 1e-12):
                best = (score, o, placed, touched, node_host, worst)
        if best is None:
            return None
        _, choice[t], ranks[t], touched, node_host, top = best
        for r, ld in touched.items():
            loads[r] = ld
        for n, extra in node_host.items():
            host[n] += extra
        chosen = problem.options[t][choice[t]]
        glob += chosen.global_s
        host_s += chosen.host_s + (problem.group_s.get(chosen.group, 0.0)
                                   if chosen.group not in used else 0.0)
        used.add(chosen.group)
    return choice, ranks


def _plus(a: Load, b: Load) -> Load:
    c = Load(**vars(a))
    c.add(b)
    return c


def starts(problem: Problem) -> list:
    """Assignments to begin from: the greedy over every option, and the greedy kept to each
    sharding type (all table-wise, all row-wise, ...: uniform plans are often near the best);
    the feasible ones, best first."""
    groups = sorted({o.group for opts in problem.options for o in opts})
    found = []
    for only in [None] + groups:
        a = greedy(problem, only)
        if a is None:
            continue
        objective, loads = evaluate(problem, *a)
        if fits(problem, loads):  # the step first; among equal steps, the lighter sparse part
            found.append((round(objective, 12), max(rank_time(problem, ld) for ld in loads), a))
    found.sort(key=lambda x: x[:2])
    return [a for _, _, a in found]


def place(problem: Problem, *, time_limit_s: float = 10.0, seed: int = 0,
          workers: int = 1) -> Placement | None:
    """The best placement CP-SAT finds within ``time_limit_s`` (None: nothing fits in memory)."""
    found = starts(problem)
    hint = found[0] if found else None
    greedy_s = evaluate(problem, *hint)[0] if hint else float("inf")
    size = sum(len(o.pieces) * problem.world + len(o.fixed) for opts in problem.options
               for o in opts)
    if size > MAX_MODEL_TERMS and hint is not None:
        return Placement(hint[0], hint[1], greedy_s, "greedy", None, None, 0.0, greedy_s)
    from ortools.sat.python import cp_model  # lazy: 0.2 s that plan show and diff need not wait

    m = cp_model.CpModel()
    W, g = problem.world, problem.gpus_per_node
    x = [[m.new_bool_var(f"x{t}_{o}") for o in range(len(opts))]
         for t, opts in enumerate(problem.options)]
    y = {}  # (t, o, piece) -> [bool per rank]
    terms = {k: [[] for _ in range(W)] for k in KEYS}
    glob, host = [], []
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
            if opt.host_s:
                host.append((_units("time", opt.host_s), x[t][o]))
            if problem.group_s.get(opt.group):
                if opt.group not in group_used:
                    group_used[opt.group] = m.new_bool_var(f"g_{opt.group}")
                    host.append((_units("time", problem.group_s[opt.group]),
                                 group_used[opt.group]))
                m.add_implication(x[t][o], group_used[opt.group])
    horizon = int(sum(max(_units("time", f.time) for f in [Load()] + list(o.fixed.values()) + o.pieces)
                      * (1 + len(o.pieces)) for opts in problem.options for o in opts)
                  + _units("time", problem.recv_intra_s + problem.recv_inter_s
                           + problem.comm_latency_s) * 4
                  + sum(v for v, _ in glob) + sum(v for v, _ in host)
                  + _units("time", problem.base_s + problem.host_base_s + problem.dense_s) + 10)
    T = m.new_int_var(0, horizon, "T")
    total = []  # the slowest rank is at least the mean: a bound the LP relaxation lacks
    for r in range(W):
        lin = {k: sum(v * b for v, b in terms[k][r]) for k in KEYS}
        C = m.new_int_var(0, horizon, f"C{r}")
        lat = _units("time", problem.comm_latency_s)
        m.add(C >= lin["si"] + lat)
        m.add(C >= lin["sx"] + lat)
        m.add(C >= _units("time", problem.recv_intra_s + problem.comm_latency_s) - lin["ri"])
        m.add(C >= _units("time", problem.recv_inter_s + problem.comm_latency_s) - lin["rx"])
        m.add(T >= _units("time", problem.base_s) + lin["time"] + C)
        if problem.overlap_dense:  # (the exchange behind the dense compute: the longer counts)
            m.add(T >= _units("time", problem.base_s + problem.beside_s) + lin["time"])
        total.append(lin["time"] + C)
        m.add(lin["hbm"] <= int(problem.hbm_cap[r] * SCALE_B))
    m.add(W * T >= W * _units("time", problem.base_s) + sum(total))
    for n in range(0, W, g):
        m.add(sum(sum(v * b for v, b in terms["host"][r]) for r in range(n, min(W, n + g)))
              <= int(problem.host_cap * SCALE_B))
    Z = m.new_int_var(0, horizon, "step")  # the larger of the host's and the device's time
    glob_e = sum(v * b for v, b in glob)
    m.add(Z >= _units("time", problem.host_base_s) + sum(v * b for v, b in host))
    dense = _units("time", problem.dense_s)
    if problem.overlap_dense:  # (the dense compute inside T: rank_time; the rest after)
        m.add(Z >= T + _units("time", problem.dense_s - problem.beside_s) + glob_e)
    else:
        m.add(Z >= T + dense + glob_e)
    m.minimize(1024 * Z + T)  # the step first; among equal steps, the least loaded sparse part
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
    # the objective is 1024 x step + sparse, and the sparse part never exceeds the step
    bound = res.bound / 1025 / SCALE_S if res.bound is not None else None
    if hint is not None and objective > greedy_s:  # CP-SAT's rounding found a worse one
        choice, ranks, objective = hint[0], hint[1], greedy_s
    gap = (0.0 if res.status == "optimal" else
           max(0.0, 1 - bound / objective) if bound is not None and objective > 0 else None)
    return Placement(choice, ranks, objective, res.status, gap, bound, res.wall_s, greedy_s)


def _units(key: str, value: float) -> int:
    if key in ("hbm", "host"):
        return -int(-value * SCALE_B // 1) if value > 0 else 0
    return int(round(value * SCALE_S))
