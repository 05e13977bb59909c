"""Engine steps of a measured torch-tp serve-bench run, recovered from the client's chunk times (requests.jsonl).

phase6's torch-tp server emits every token of a step at the end of the step (one token per running row, plus the
first token of each prompt it prefilled), so the chunk arrival times of all requests cluster: a cluster of chunks
within ``tol_s`` of each other is one step, the gap from the previous cluster is its duration, the first tokens in
it are the prompts it prefilled and the other chunks its decode rows. Timestamps are the client's (HTTP delivery
jitter < 1 ms on these runs).

Server history: the runs of one ``-m`` sweep share one server process (serve-bench starts it for the first member
and writes its log there: ``server.log``); a run dir without ``server.log`` ran on the server of the run before it.
:func:`server_chain` orders the runs of a server by their ``env.json`` start time.

:func:`new_shape_cost_ms`: the extra time of a prefill step whose (prompts, padded width) shape the server process
had not run before -- median duration of one-prompt steps (with decode rows) at a new width minus at a width seen
before, both in the same run. The engine profile charges it (``TorchTPStepTime.new_shape_s``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TOL_S = 0.002
"""Chunks whose arrival is within 2 ms of the previous one belong to the same step."""


@dataclass
class Step:
    end_s: float
    duration_s: float
    """Gap from the previous step's end (NaN for the first step)."""
    prompts: list[int]
    """Prompt tokens of the requests whose first token this step emitted."""
    decode_rows: int
    decode_ctx: int = 0
    """Context the decode rows read: the sum over them of prompt + tokens emitted before this one."""


def run_steps(run_dir: str | Path, tol_s: float = TOL_S) -> list[Step]:
    """The steps of one run, in time order (absolute times = each request's send_s + its chunk times)."""
    path = Path(run_dir) / "requests.jsonl"
    ev: list[tuple[float, int, int]] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if not r.get("ok") or not r.get("chunk_times_s"):
            continue
        t0 = float(r["send_s"])
        for j, t in enumerate(r["chunk_times_s"]):
            ev.append((t0 + float(t), j, int(r["prompt_tokens"])))
    ev.sort()
    steps: list[Step] = []
    last = -np.inf
    prev_end = float("nan")
    for t, j, p in ev:
        if t - last > tol_s:
            if steps:
                prev_end = steps[-1].end_s
            steps.append(Step(t, t - prev_end, [], 0))
        s = steps[-1]
        if j == 0:
            s.prompts.append(p)
        else:
            s.decode_rows += 1
            s.decode_ctx += p + j
        last = t
    return steps


def _start_time(d: Path) -> str:
    p = d / "env.json"
    if p.is_file():
        t = json.loads(p.read_text()).get("time")
        if isinstance(t, str):
            return t
    return ""


def server_chain(run_dirs: list[Path]) -> dict[Path, Path | None]:
    """Each run -> the run before it on the same server process (None: it started the server, i.e. its dir holds
    ``server.log``, or it is the first run known). Runs are ordered by env.json start time."""
    order = sorted(run_dirs, key=lambda d: (_start_time(d), str(d)))
    prev: dict[Path, Path | None] = {}
    for i, d in enumerate(order):
        prev[d] = None if (d / "server.log").is_file() or i == 0 else order[i - 1]
    return prev


def shapes_before(run_dir: Path, prev: dict[Path, Path | None]) -> frozenset[tuple[int, int]]:
    """The measured (prompts, padded width) prefill shapes the server ran in the runs before ``run_dir``."""
    out: set[tuple[int, int]] = set()
    d = prev.get(run_dir)
    while d is not None:
        out |= {(len(s.prompts), max(s.prompts)) for s in run_steps(d) if s.prompts}
        d = prev.get(d)
    return frozenset(out)


@dataclass
class ShapeCost:
    cost_ms: float
    new_ms: float
    seen_ms: float
    n_new: int
    n_seen: int

    def describe(self) -> str:
        return (
            f"new-shape cost {self.cost_ms:.1f} ms (one-prompt steps with decode rows: new width p50 "
            f"{self.new_ms:.0f} ms over {self.n_new}, seen width p50 {self.seen_ms:.0f} ms over {self.n_seen})"
        )


def new_shape_cost_ms(run_dir: Path, warm: frozenset[tuple[int, int]] = frozenset()) -> ShapeCost | None:
    """Median one-prompt mixed-step duration at a new width minus at a seen one, in ``run_dir`` (the server having
    run ``warm`` before); None when either group has fewer than 5 steps."""
    seen = set(warm)
    new, old = [], []
    for s in run_steps(run_dir):
        if not s.prompts:
            continue
        shape = (len(s.prompts), max(s.prompts))
        if len(s.prompts) == 1 and s.decode_rows > 0 and np.isfinite(s.duration_s):
            (old if shape in seen else new).append(s.duration_s * 1e3)
        seen.add(shape)
    if len(new) < 5 or len(old) < 5:
        return None
    a, b = float(np.median(new)), float(np.median(old))
    return ShapeCost(max(0.0, a - b), a, b, len(new), len(old))
