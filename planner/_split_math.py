"""The vectorised split model behind ``planner.estimator`` (formulas in its doc).

``scenarios`` builds input rows (J × k): one per workload, or a base row plus
± one-sigma perturbations; ``evaluate`` computes every output for every row
and split (J × S) at a given arrival rate; ``served`` solves the offered
load's fixed point (open-loop arrivals plus a closed loop of agents) for the
throughput each split would see; ``sd`` turns perturbation rows into
delta-method standard deviations. Private: import ``planner.estimator``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from planner.estimator_config import EstimatorConfig
from planner.types import SLO
from planner.workload import WorkloadEstimate, attention_pairs, attention_pairs_alone

if TYPE_CHECKING:
    from planner.profile import Profile

UNSTABLE_S = 1e6  # reported TTFT/TPOT of a queue that never drains
_EPS = 1e-12
_BISECT = 16  # fixed-point steps: the closed loop's rate to 1.5e-5 of capacity
_OPEN_STEPS = 2  # of them, plain steps before the root is estimated (`_closed_loop`)
_ESTIMATES = 1  # probes at estimates of the root before the path to the next is checked (`_closed_loop`)
_ROUNDS = 4  # paths checked on the elements where the last one failed, before plain steps (`_close`)
_LOCAL_STEPS = 3  # fixed-point steps: local prompts per decode iteration and the iteration's length

_W_COLS = ("u", "c", "o", "f", "rate", "cs2", "ul", "cl", "u95", "pi", "op", "o2", "cf", "z", "r")
(_U, _C, _O, _F, _RATE, _CS2, _UL, _CL, _U95, _PI, _OP, _O2, _CF, _Z, _R) = range(len(_W_COLS))


def workload_row(w: WorkloadEstimate, chunk_tokens: int) -> np.ndarray:
    """One input row; second moments a window did not see fall back to the means'."""
    cs2 = (w.remote_uncached_std / max(w.remote_uncached_mean, 1.0)) ** 2
    u95 = w.remote_uncached_mean + 1.645 * w.remote_uncached_std
    u, c, o, f = w.remote_uncached_mean, w.remote_cached_mean, w.output_mean, w.local_fraction
    prompt = (1 - f) * (u + c) + f * (w.local_uncached_mean + w.local_cached_mean)
    pi = w.remote_pairs_mean if w.remote_pairs_mean is not None else float(attention_pairs(u, c, chunk_tokens))
    op = w.prompt_output_mean if w.prompt_output_mean is not None else o * prompt
    o2 = w.output_sq_mean if w.output_sq_mean is not None else o * o
    return np.array(
        [
            u,
            c,
            o,
            f,
            w.demand_rps,
            cs2,
            w.local_uncached_mean,
            w.local_cached_mean,
            u95,
            pi,
            op,
            o2,
            w.closed_fraction,
            w.think_mean_s,
            w.response_mean_s,
        ],
        dtype=float,
    )


def scenarios(
    profile: Profile, workloads: list[WorkloadEstimate], with_uncertainty: bool, chunk_tokens: int
) -> dict[str, np.ndarray]:
    """Rows (J × k) of inputs: one per workload, or for a single workload the
    base plus ± one-sigma perturbations of every uncertain input."""
    p0, d0 = profile.prefill.theta, profile.decode.theta
    rows_w = [workload_row(w, chunk_tokens) for w in workloads]
    rows_p, rows_d = [p0] * len(rows_w), [d0] * len(rows_w)
    if with_uncertainty:
        w = workloads[0]
        n, nr, f = max(w.n, 1), max(w.n_remote, 1), w.local_fraction
        w_se = [
            (_U, w.remote_uncached_std / math.sqrt(nr)),
            (_C, w.remote_cached_std / math.sqrt(nr)),
            (_O, w.output_std / math.sqrt(n)),
            (_F, math.sqrt(f * (1 - f) / n)),
        ]
        deltas: list[tuple[int, np.ndarray]] = []
        for key, model in enumerate((profile.prefill, profile.decode)):
            # The band-widened covariance (IterationModel.param_cov), not the fit's own.
            vals, vecs = np.linalg.eigh(model.param_cov)
            deltas += [(key, vecs[:, i] * math.sqrt(max(v, 0.0))) for i, v in enumerate(vals)]
        base = rows_w[0]
        for col, se in w_se:
            # A mean moved by its standard error moves the moments built on it alike.
            delta = np.zeros(len(_W_COLS))
            delta[col] = se
            if col == _U and base[_U] > 0:
                delta[_PI] = base[_PI] * (2 * se / base[_U])
            if col == _O and base[_O] > 0:
                delta[_OP], delta[_O2] = base[_OP] * se / base[_O], base[_O2] * 2 * se / base[_O]
            deltas.append((2, delta))
        for key, delta in deltas:
            for sign in (1.0, -1.0):
                rows_p.append(p0 + sign * delta if key == 0 else p0)
                rows_d.append(d0 + sign * delta if key == 1 else d0)
                rows_w.append(base + sign * delta if key == 2 else base)
    wcols = np.maximum(np.stack(rows_w), 0.0)
    wcols[:, _F] = np.minimum(wcols[:, _F], 1.0)
    wcols[:, _CF] = np.minimum(wcols[:, _CF], 1.0)
    return {"p": np.stack(rows_p), "d": np.stack(rows_d), "w": wcols}


def _queue(name: str, servers: np.ndarray, service_s: np.ndarray, cs2: np.ndarray | float) -> dict[str, np.ndarray]:
    """The rate-independent terms of an M/G/c queue (`_wait_mean`), keyed under `name`."""
    c = np.maximum(servers, 1.0)
    return {
        f"{name}_exponent": np.sqrt(2.0 * (c + 1.0)) - 1.0,
        f"{name}_work": service_s * (1.0 + cs2),
        f"{name}_two_c": 2.0 * c,
    }


def _wait_mean(rho: np.ndarray, x: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    """M/G/c queue (Allen-Cunneen with Sakasegawa's P(wait)): (P(wait), mean
    wait of one that waits) at utilisation `rho` < 1 (the queue: `_queue`'s
    terms `name` in `x`)."""
    p_wait = np.clip(rho, 0.0, 1.0) ** x[f"{name}_exponent"]
    theta = x[f"{name}_work"] / (x[f"{name}_two_c"] * np.maximum(1.0 - rho, _EPS))
    return p_wait, theta


def _wait(rho: np.ndarray, x: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P(wait), mean wait, P95 wait) of `_wait_mean`'s queue."""
    p_wait, theta = _wait_mean(rho, x, name)
    p95 = np.where(p_wait > 0.05, theta * np.log(np.maximum(p_wait, 0.05) / 0.05), 0.0)
    return p_wait, p_wait * theta, p95


def _col(a: np.ndarray, i: int) -> np.ndarray:  # one column, kept 2-D (J × 1)
    return a[:, i : i + 1]


def fixed_terms(
    sc: dict[str, np.ndarray], p_nodes: np.ndarray, n_nodes: int, kv_tokens: float, cfg: EstimatorConfig
) -> dict[str, np.ndarray]:
    """The terms that do not depend on the arrival rate (J × 1 or J × S),
    shared by `evaluate` and `served`."""
    w = sc["w"]
    ap, bp, cp, dp = (_col(sc["p"], i) for i in range(4))
    ad, bd, cd = (_col(sc["d"], i) for i in range(3))
    u, c, f, ul, cl, u95 = (_col(w, i) for i in (_U, _C, _F, _UL, _CL, _U95))
    o = np.maximum(_col(w, _O), 1.0)
    pi, op, o2 = _col(w, _PI), _col(w, _OP), _col(w, _O2)
    budget, kmax = float(cfg.prefill_token_budget), float(cfg.max_prefill_batch)
    P = p_nodes[None, :].astype(float)
    D = n_nodes - P
    # Prefill, per remote prompt at saturation (full-budget iterations): its share of the
    # intercept, its tokens, and attention over its chunks (pairs: per prompt, as chunked).
    work_ms = bp * u + cp * c + dp * pi / 1e4
    s_req = np.maximum(ap * np.maximum(u / budget, 1.0 / kmax) + work_ms, _EPS) / 1000.0
    s_loc = np.where(f > 0, np.maximum(ap + bp * ul + cp * cl + dp * ul * (ul + cl) / 1e4, 0.0) / 1000.0, 0.0)
    own_ms = ap * np.maximum(1.0, np.ceil(u / budget)) + work_ms
    # With no prefill node the router runs every request on a decode node
    # (routing.picker: "no separate prefill node"): all traffic is local
    # there, long prompts chunk by chunk (`local_split_p95`).
    none = P == 0
    loc_work = np.where(none, f * s_loc + (1.0 - f) * np.maximum(own_ms, 0.0) / 1000.0, f * s_loc)
    # Its intercepts: local prompts that join the same decode iteration share one (`shared_intercept`).
    loc_int = np.where(none, f + (1.0 - f) * np.maximum(1.0, np.ceil(u / budget)), np.where(f > 0, f, 0.0))
    loc_int = np.minimum(np.maximum(ap, 0.0) * loc_int / 1000.0, loc_work)
    f = np.where(none, 1.0, f)
    rf = 1.0 - f
    # Decode: a request holds its KV for o iterations, so the running batch is length-biased.
    ctx = (op + o2 / 2.0) / o  # mean context of a running request
    kv_per = (op + cfg.kv_output_reserved * o2) / o  # mean KV it holds (prompt + reserved output)
    b_max = np.full_like(ctx, float(cfg.max_decode_batch))
    if kv_tokens > 0:
        b_max = np.maximum(np.minimum(b_max, kv_tokens * cfg.kv_usable_fraction / np.maximum(kv_per, 1.0)), 1.0)
    # A decode step costs at least its fixed part: a fit whose slopes came out
    # negative (collinear batch and context) must not predict free steps.
    step_floor = np.maximum(ad, _EPS)
    td_max = np.maximum(ad + bd * b_max + cd * b_max * ctx, step_floor) / 1000.0
    # At saturation a decode node iterates back to back and B_max/o requests join each iteration.
    loc_sat = loc_work - loc_int * (1.0 - shared_intercept(f * b_max / o))
    with np.errstate(divide="ignore", invalid="ignore"):
        pre_cap = np.where(rf > 1e-9, P / np.maximum(rf * s_req, _EPS), np.inf)
        dec_cap = D * b_max / (o * td_max + b_max * loc_sat)
    own95 = ap * np.maximum(1.0, np.ceil(u95 / budget)) + bp * u95 + cp * c
    own95 += dp * attention_pairs_alone(u95, c, cfg.prefill_token_budget) / 1e4
    kv_ok = (kv_tokens <= 0) | (kv_tokens * cfg.kv_usable_fraction >= (op + o2) / o)
    return {
        "P": P,
        "D": D,
        "rf": rf,
        "o": o,
        "ad": ad,
        "bd": bd,
        "cd": cd,
        "work_ms": work_ms,
        "s_req": s_req,
        "s_loc": s_loc,
        "loc_work": loc_work,
        "loc_int": loc_int,
        "f_loc": f,
        "none": none,
        "step_floor": step_floor,
        "ctx": ctx,
        "b_max": b_max,
        "td_max": td_max,
        "pre_cap": pre_cap,
        "dec_cap": dec_cap,
        "cap": np.minimum(pre_cap, dec_cap),
        "k": np.clip(budget / np.maximum(u, 1.0), 1.0, kmax),
        "own95_ms": own95,
        "own_ms": own_ms,
        "cs2": _col(w, _CS2),
        "kv_ok": kv_ok,
        # Rate-independent parts of `_at_rate`'s terms (the closed loop's fixed point evaluates it several times).
        "D1": np.maximum(D, 1.0),
        "has_d": D > 0,
        "m_max": f * b_max / o,
        "bc": bd + cd * ctx,
        "dec_cap_pos": dec_cap > 0,
        "dec_cap_eps": np.maximum(dec_cap, _EPS),
        **_queue("slot", D * b_max, o * td_max, 1.0),
        **_queue("prefill", P, s_req, _col(w, _CS2)),
        "has_p": P > 0,
        "P1": np.maximum(P, 1.0),
    }


def _decode_side(x: dict[str, np.ndarray], lam: np.ndarray) -> dict[str, np.ndarray]:
    """Decode nodes at arrival rate `lam`: TPOT, batch, local work, slot wait."""
    o, b_max, has_d = x["o"], x["b_max"], x["has_d"]
    ad, bd, cd, ctx = x["ad"], x["bd"], x["cd"], x["ctx"]
    served = np.minimum(lam, x["cap"])
    lam_d = served / x["D1"]
    # Local prompts per iteration (m) need the iteration's length (TPOT), which needs their
    # work: a few fixed-point steps from a full-batch iteration.
    f_lam, lam_o = x["f_loc"] * lam_d, lam_d * o
    drain, fill = lam_o * x["bc"] / 1000.0, lam_o * ad / 1000.0
    tpot = x["td_max"]
    for _ in range(_LOCAL_STEPS):
        m = np.minimum(f_lam * np.minimum(tpot, 1e3), x["m_max"])
        loc_work = x["loc_work"] - x["loc_int"] * (1.0 - shared_intercept(m))
        rho_loc = np.where(has_d, lam_d * loc_work, 1.0)
        denom = (1.0 - rho_loc) - drain
        batch = np.where(denom > 0, fill / np.maximum(denom, _EPS), b_max)
        batch = np.minimum(batch, b_max)
        step_ms = np.maximum(ad + bd * batch + cd * batch * ctx, x["step_floor"])
        tpot = step_ms / 1000.0 / np.maximum(1.0 - rho_loc, _EPS)
    tpot = np.where(has_d & (rho_loc < 1.0), tpot, UNSTABLE_S)
    # A decode slot frees after o iterations at full batch: D·B_max slots near saturation.
    rho_d = np.where(x["dec_cap_pos"], served / x["dec_cap_eps"], np.inf)
    p_wait, theta = _wait_mean(rho_d, x, "slot")
    wait_d = np.where(rho_d < 1.0, p_wait * theta, UNSTABLE_S)
    return {"tpot": tpot, "batch": batch, "rho_loc": rho_loc, "loc_work": loc_work, "wait_d": wait_d}


def _prefill_load(x: dict[str, np.ndarray], lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prefill nodes as one M/G/P queue (the router sends a prompt to a
    least-loaded node): (utilisation, the prompt-mates' work in its own
    iterations, ms). Shorter prompts share an iteration with what arrived
    during one full-budget iteration (ρ·k, at most k)."""
    rho = np.where(x["has_p"], lam * x["rf"] * x["s_req"] / x["P1"], np.inf)
    k = x["k"]
    mates = (np.clip(np.nan_to_num(rho * k, posinf=1e9), 1.0, k) - 1.0) * x["work_ms"]
    return rho, mates


def _e2e(
    x: dict[str, np.ndarray], dec: dict[str, np.ndarray], rho: np.ndarray, mates: np.ndarray, wq: np.ndarray
) -> np.ndarray:
    """Mean response time: mean wait `wq` (not P95) + own iterations, a decode
    slot, o tokens at TPOT (`rho`, `mates`: `_prefill_load`'s; `dec`: `_decode_side`'s)."""
    own = (x["own_ms"] + mates) / 1000.0
    tpot = dec["tpot"]
    # No prefill node: prompts queue for the decode nodes' prefill work (M/G/1 at ρ_loc).
    solo = local_split_mean(dec["rho_loc"], dec["loc_work"], x["cs2"], tpot)
    local_mean = np.where(x["none"], solo, x["s_loc"] + tpot)
    ttft_mean = np.where(x["rf"] >= 0.05, np.where(rho < 1.0, wq + own, UNSTABLE_S), local_mean)
    return np.minimum(ttft_mean + dec["wait_d"] + x["o"] * tpot, UNSTABLE_S)


def _e2e_at_rate(x: dict[str, np.ndarray], lam: np.ndarray) -> np.ndarray:
    """`_at_rate(x, lam)["e2e"]` alone (the closed loop's fixed point needs no more)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rho, mates = _prefill_load(x, lam)
        p_wait, theta = _wait_mean(rho, x, "prefill")
        return _e2e(x, _decode_side(x, lam), rho, mates, p_wait * theta)


def _at_rate(x: dict[str, np.ndarray], lam: np.ndarray) -> dict[str, np.ndarray]:
    """Queues, batch and latencies at arrival rate `lam`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        dec = _decode_side(x, lam)
        tpot = dec["tpot"]
        rho, mates = _prefill_load(x, lam)
        _, wq, wq95 = _wait(rho, x, "prefill")
        own95 = (x["own95_ms"] + mates) / 1000.0
        ttft_remote = np.where(rho < 1.0, wq95 + own95, UNSTABLE_S)
        solo = local_split_p95(dec["rho_loc"], dec["loc_work"], x["cs2"], tpot)
        ttft_local = np.minimum(np.where(x["none"], solo, x["s_loc"] + tpot) + dec["wait_d"], UNSTABLE_S)
        ttft = np.where(x["rf"] >= 0.05, ttft_remote, ttft_local)
        e2e = _e2e(x, dec, rho, mates, wq)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "batch": dec["batch"]}


def evaluate(
    sc: dict[str, np.ndarray], x: dict[str, np.ndarray], slo: SLO, rate: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Every output (J × S) at arrival rate `rate` (J × S; default: the rows'
    demand); `x`: `fixed_terms` of the same rows."""
    lam = _col(sc["w"], _RATE) if rate is None else rate
    r = _at_rate(x, lam)
    feasible = (lam <= x["cap"]) & (r["ttft"] <= slo.ttft_s) & (r["tpot"] <= slo.tpot_s) & x["kv_ok"] & (x["D"] > 0)
    return {
        "cap": x["cap"],
        "pre_cap": x["pre_cap"],
        "dec_cap": x["dec_cap"],
        "ttft": r["ttft"],
        "tpot": r["tpot"],
        "e2e": r["e2e"],
        "batch": r["batch"],
        "feasible": feasible,
        "tokens": x["cap"] * _col(sc["w"], _O),
    }


def served(sc: dict[str, np.ndarray], fx: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(throughput X, mean response time at X), J × S, of the offered load on each split.

    Open-loop arrivals (no known gap) come at their rate whatever the split;
    a closed loop of N = X_obs·(Z + R_obs) agents (Little's law on what was
    observed) sends N / (Z + R(X)). X solves X = open + N / (Z + R(X)),
    capped by capacity: by bisection on the closed part, whose left side
    grows with X while R(X) does (R diverges at capacity), `_BISECT` steps
    from [0, room] (`_closed_loop`). `fx`: `fixed_terms` of the same rows.
    """
    cap = fx["cap"]
    w = sc["w"]
    demand, cf, think, resp = (w[:, i : i + 1] for i in (_RATE, _CF, _Z, _R))
    open_rate = np.minimum(demand * (1.0 - cf), cap)
    agents = demand * cf * (think + resp)
    room = np.maximum(cap - open_rate, 0.0)
    hi = np.where(think > 0, np.minimum(room, agents / np.maximum(think, _EPS)), room)
    hi = np.where(agents > 0, hi, 0.0)
    if not (agents > 0).any():
        x = open_rate + np.zeros_like(hi)
        return x, _e2e_at_rate(fx, x)
    return _closed_loop(fx, open_rate, agents, think, hi)


class _Bracket:
    """The closed loop's root search over a set of elements (`_closed_loop`):
    for each, the largest point found short (`a`: the loop would send more),
    the smallest found not short (`b`), and the last three points (m, R)."""

    def __init__(self, fx: dict[str, np.ndarray], open_rate: np.ndarray, agents: np.ndarray, think: np.ndarray):
        self.fx, self.open_rate, self.agents, self.think = fx, open_rate, agents, think
        shape = open_rate.shape
        self.a = np.zeros(shape)  # 0 stands for short: no mid lies below it
        self.b = np.where(agents > 0, np.inf, 0.0) + self.a  # a loop of no agents never sends more
        nan = np.full(shape, np.nan)
        # The last three points, oldest first.
        self.m: tuple[np.ndarray, np.ndarray, np.ndarray] = (nan, nan, nan)
        self.r: tuple[np.ndarray, np.ndarray, np.ndarray] = (nan, nan, nan)

    def probe(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(short, R) at `m`, short by the bisection's own comparison."""
        r = _e2e_at_rate(self.fx, self.open_rate + m)
        short = m * (self.think + r) < self.agents
        self.a = np.where(short & (m > self.a), m, self.a)
        self.b = np.where(~short & (m < self.b), m, self.b)
        # A point past a queue's saturation (R = UNSTABLE_S) says nothing of R's shape: not kept.
        kept = r < UNSTABLE_S
        (m0, m1, m2), (r0, r1, r2) = self.m, self.r
        self.m = (np.where(kept, m1, m0), np.where(kept, m2, m1), np.where(kept, m, m2))
        self.r = (np.where(kept, r1, r0), np.where(kept, r2, r1), np.where(kept, r, r2))
        return short, r

    def estimate(self, hi: np.ndarray) -> np.ndarray:
        """The next estimate of the root of m·(Z + R) = N inside the bracket
        (else its middle), with R through the last three points taken as
        A + B / (K − m), the shape of a queue's wait towards saturation (a
        flat R is B = 0); through the last two, K is the room below capacity."""
        top = np.minimum(self.b, hi)
        (m0, m1, m2), (r0, r1, r2) = self.m, self.r
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # (R_i − A)(K − m_i) = B at each point: two linear equations in K and A.
            det = (r2 - r1) * (m2 - m0) - (r2 - r0) * (m2 - m1)
            rhs1, rhs2 = r2 * m2 - r1 * m1, r2 * m2 - r0 * m0
            k3 = (rhs1 * (m2 - m0) - rhs2 * (m2 - m1)) / det
            a3 = ((r2 - r1) * rhs2 - (r2 - r0) * rhs1) / det
            k2 = self.fx["cap"] - self.open_rate
            a2 = r2 - (r2 - r1) / (1.0 / (k2 - m2) - 1.0 / (k2 - m1)) / (k2 - m2)
            three = np.isfinite(k3) & np.isfinite(a3) & (k3 > m2)
            k, a = np.where(three, k3, k2), np.where(three, a3, a2)
            b = (r2 - a) * (k - m2)
            za, n = self.think + a, self.agents
            s = za * k + b + n
            root = 2.0 * n * k / (s + np.sqrt(s * s - 4.0 * za * n * k))  # the smaller root, stable form
        usable = (root > self.a) & (root < top)
        return np.where(usable, root, (self.a + top) / 2.0)

    def subset(self, keep: np.ndarray) -> _Bracket:
        """The search over the elements where `keep` (flat: R is elementwise)."""
        if keep.ndim == 1:

            def take(v: np.ndarray) -> np.ndarray:
                return v[keep]

        else:  # J × S, its terms J × S, J × 1 or 1 × S
            rows, cols = np.nonzero(keep)

            def take(v: np.ndarray) -> np.ndarray:
                return v[rows if v.shape[0] > 1 else 0, cols if v.shape[1] > 1 else 0]

        sub = _Bracket.__new__(_Bracket)
        sub.fx = {key: take(v) for key, v in self.fx.items()}
        sub.open_rate, sub.agents, sub.think = take(self.open_rate), take(self.agents), take(self.think)
        sub.a, sub.b = self.a[keep], self.b[keep]
        (m0, m1, m2), (r0, r1, r2) = self.m, self.r
        sub.m, sub.r = (take(m0), take(m1), take(m2)), (take(r0), take(r1), take(r2))
        return sub


def _closed_loop(
    fx: dict[str, np.ndarray], open_rate: np.ndarray, agents: np.ndarray, think: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`served`'s (X, R(X)) with X = open + the `lo` of `_BISECT` bisection
    steps on [0, hi] of "the loop would send more than mid" (`mid·(Z +
    R(open + mid)) < N`), to the bit, in 5 evaluations of R over the whole
    array and a few over subsets, where the bisection took 17 (one is
    ~0.6-0.9 ms at 256 nodes: the decision's cost on agent traffic).

    A step's answer is known without evaluating R where its mid lies at or
    below a point found short or at or above one found not short: R grows
    with the rate, so the comparison is monotone in mid (in floating point
    too: tests/unit/planner/test_closed_loop.py compares every output with
    the bisection's). After `_OPEN_STEPS` plain steps and `_ESTIMATES`
    probes at estimates of the root (`_Bracket.estimate`), `_close` replays
    the bisection's path to the next estimate without R and evaluates the
    two ends of its last interval: where one is short and the other is not,
    every mid on the path is on its known side, and the path is the
    bisection's. Every answer comes from the bisection's own comparison, so
    X is its value."""
    br = _Bracket(fx, open_rate, agents, think)
    lo, hi = _steps(br, np.zeros_like(hi), hi, _OPEN_STEPS)
    for _ in range(_ESTIMATES):
        br.probe(br.estimate(hi))
    lo, r = _close(br, lo, hi, _BISECT - _OPEN_STEPS, _ROUNDS)
    return open_rate + lo, r


def _close(br: _Bracket, lo: np.ndarray, hi: np.ndarray, steps: int, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo after `steps` more bisection steps from [lo, hi], R at open + lo).
    The path to the next estimate, checked at its two ends; the elements
    where the check fails go on alone (a flat subset: R is elementwise),
    `rounds` more times, then by plain steps."""
    end, top = lo, hi
    est = br.estimate(hi)
    for _ in range(steps):  # the path to `est`, without R
        mid = (end + top) / 2.0
        end, top = _halve(end, top, mid, mid < est)
    r = br.probe(end)[1]
    br.probe(top)
    # Checked: an end the path moved to is on its known side (an end it never moved from needs no check).
    left = ((br.a < end) & (end > lo)) | ((br.b > top) & (top < hi))
    if not left.any():
        return end, r
    sub, sub_lo, sub_hi = br.subset(left), lo[left], hi[left]
    if rounds:
        sub_lo, sub_r = _close(sub, sub_lo, sub_hi, steps, rounds - 1)
    else:
        sub_lo = _steps(sub, sub_lo, sub_hi, steps)[0]
        sub_r = _e2e_at_rate(sub.fx, sub.open_rate + sub_lo)
    end, r = end.copy(), r.copy()
    end[left], r[left] = sub_lo, sub_r
    return end, r


def _steps(br: _Bracket, lo: np.ndarray, hi: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] after `steps` plain bisection steps, R evaluated where a mid's answer is not known yet."""
    for _ in range(steps):
        mid = (lo + hi) / 2.0
        unknown = (mid > br.a) & (mid < br.b)
        short = np.where(unknown, br.probe(mid)[0], mid <= br.a) if unknown.any() else mid <= br.a
        lo, hi = _halve(lo, hi, mid, short)
    return lo, hi


def _halve(lo: np.ndarray, hi: np.ndarray, mid: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One bisection step: [mid, hi] where `up`, else [lo, mid]."""
    return np.where(up, mid, lo), np.where(up, hi, mid)


def local_split_p95(rho_loc: np.ndarray, work_s: np.ndarray, cs2: np.ndarray, tpot: np.ndarray) -> np.ndarray:
    """P95 TTFT on a split without prefill nodes: each decode node also
    computes every prompt routed to it, `work_s` seconds per request at
    utilisation `rho_loc` of that work, queued as an M/G/1 (Pollaczek–
    Khinchine wait, exponential tail as for prefill nodes), then the own
    prompt and one decode step."""
    rho, wq = _local_wait(rho_loc, work_s, cs2)
    wq95 = np.where(20.0 * rho > 1.0, wq * np.log(np.maximum(20.0 * rho, 1.0)) / np.maximum(rho, _EPS), 0.0)
    return np.where(rho_loc < 1.0, np.minimum(wq95 + work_s + tpot, UNSTABLE_S), UNSTABLE_S)


def local_split_mean(rho_loc: np.ndarray, work_s: np.ndarray, cs2: np.ndarray, tpot: np.ndarray) -> np.ndarray:
    """Mean TTFT of `local_split_p95`'s queue."""
    _, wq = _local_wait(rho_loc, work_s, cs2)
    return np.where(rho_loc < 1.0, np.minimum(wq + work_s + tpot, UNSTABLE_S), UNSTABLE_S)


def _local_wait(rho_loc: np.ndarray, work_s: np.ndarray, cs2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rho = np.clip(rho_loc, 0.0, 1.0 - 1e-9)
    return rho, rho * work_s * (1.0 + cs2) / (2.0 * (1.0 - rho))


def shared_intercept(m: np.ndarray) -> np.ndarray:
    """The share of its own intercept a local prompt costs when ``m`` local
    prompts join a decode iteration on average (Poisson): their prefills run
    in that iteration, which pays one intercept if any joined, so per prompt
    E[iterations with one] / E[prompts] = (1 − e^(−m)) / m (1 as m → 0)."""
    m = np.maximum(m, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m > 1e-6, -np.expm1(-m) / np.maximum(m, 1e-6), 1.0 - m / 2.0)


def sd(x: np.ndarray) -> np.ndarray:
    """Delta-method sd from rows [base, +δ1, −δ1, +δ2, −δ2, …]."""
    if x.shape[0] == 1:
        return np.zeros(x.shape[1])
    diff = (x[1::2] - x[2::2]) / 2.0
    return np.sqrt(np.sum(np.nan_to_num(diff, posinf=0.0, neginf=0.0) ** 2, axis=0))
