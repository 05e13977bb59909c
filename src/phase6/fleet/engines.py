"""Engine profiles: what a serving engine does to the shape of its steps, beyond the planner's roofline.

``engine.profile=vllm`` (default): the replica of phase6.fleet.sim as it always was -- vLLM V1 scheduling with
chunked prefill, and a step is *one* forward of its decode tokens plus prefill chunks
(``ServeCostModel.step_s``: causal attention pairs, decode KV read at each sequence's own context).

``engine.profile=torch-tp``: phase6's own tensor-parallel server (``phase6.serving.tp_server``, the engine of the 6B
H200 table), transcribed from its code, not fitted to any measurement:

- admission (``Scheduler._admit``): whole prompts (no chunked prefill), FCFS, while running + admitted rows <
  ``--max-batch`` and (prompts in the step) x (longest prompt in the step) <= ``--max-prefill-tokens``; the first
  waiting prompt always goes, however long.
- a step (``Scheduler.step`` -> ``Engine.execute``) is one decode forward of every running row, then one prefill
  forward of the admitted prompts: the weights are read twice in a step that does both.
- prefill (``Engine.execute``): the prompts are one (n, width) batch padded with zeros to the longest prompt, so
  n x width tokens go through every matmul, and attention runs under a 4-D boolean mask (no ``is_causal``), so SDPA
  computes all width x width (query, key) pairs of each row, masked or not.
- decode with ``--cuda-graphs`` (``Engine._decode_static``): the batch is padded to the next batch bucket (powers of
  two up to ``--max-batch``) and every row attends to the next KV-length bucket above the longest row's position
  (128, 256, 512, then every 512 from 1024, and ``--max-model-len``); matmuls run on the padded rows and the KV of
  rows x KV length positions is read. Without graphs (``_decode_eager``) the batch is exact and every row attends
  to the longest row's length.
- KV (``SlotKVCache``): ``--max-batch`` rows of ``--max-model-len`` positions, allocated at start; no prefix cache;
  a request must fit a row (prompt + max_tokens <= max_model_len, else HTTP 400).

- first use of a prefill shape: the prefill runs eagerly (no graph), and a step whose (prompts, padded width) shape
  the server process has not run before costs ``new_shape_s`` more than a repeat of a shape it has run (per-shape
  setup cached by the stack below the server: the SDPA call under a 4-D boolean mask and the matmuls see a new
  shape). Measured from the step sequence of loaded runs (``phase6.fleet.steps``): at TP=1 a one-prompt step with
  ~45 rows decoding takes ~85-95 ms when its width was seen before and ~130-165 ms when new. Every request of a C=1
  calibration run has a new width, so its fitted prefill overhead is the new-shape cost; the replica keeps the set
  of shapes it ran (``Replica.shapes``), seeded with those of earlier runs on the same server process.

Not modelled: the row compaction copy after a request finishes (one row's KV, < 0.2 ms on an H200), sampling and
detokenisation beyond the fitted per-step overhead; and the lm_head runs on the last position of each prompt only
(the planner charges it per prompt token, ~5 % of a 14B prefill, absorbed by the fitted MFU).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from phase6.plan.serve import ServeCostModel


def torch_tp_buckets(max_batch: int, max_model_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(batch buckets, KV-length buckets) of ``tp_server.Engine`` for ``--max-batch`` / ``--max-model-len`` (the
    same expressions as its ``__init__``; tests/test_fleet_engines.py checks them against a real Engine)."""
    mb, ml = max_batch, max_model_len
    batch = sorted({min(mb, 1 << i) for i in range(mb.bit_length() + 1)})
    kv = sorted({min(ml, 128 << i) for i in range(3)} | set(range(1024, ml, 512)) | {ml})
    return tuple(batch), tuple(kv)


@dataclass(frozen=True)
class TorchTPEngine:
    """The torch-tp server's flags that shape its steps (``tp_server.ServerArgs``)."""

    max_batch: int = 64
    max_prefill_tokens: int = 8192
    max_model_len: int = 4096
    cuda_graphs: bool = False
    batch_buckets: tuple[int, ...] = field(init=False)
    kv_buckets: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_prefill_tokens < 1 or self.max_model_len < 2:
            raise ValueError(
                f"torch-tp: need max_batch >= 1, max_prefill_tokens >= 1, max_model_len >= 2, got {self.max_batch}, "
                f"{self.max_prefill_tokens}, {self.max_model_len}"
            )
        b, k = torch_tp_buckets(self.max_batch, self.max_model_len)
        object.__setattr__(self, "batch_buckets", b)
        object.__setattr__(self, "kv_buckets", k)

    def decode_shape(self, rows: int, max_ctx: int) -> tuple[int, int]:
        """(rows, KV length) the decode forward of ``rows`` running requests runs at, the longest holding
        ``max_ctx`` tokens after this step's token is written (position max_ctx - 1)."""
        if not self.cuda_graphs:
            return rows, max_ctx
        if rows > self.max_batch or max_ctx > self.max_model_len:
            raise ValueError(
                f"torch-tp: a decode step of {rows} rows at context {max_ctx} exceeds --max-batch {self.max_batch} "
                f"/ --max-model-len {self.max_model_len}"
            )
        b = self.batch_buckets[bisect.bisect_left(self.batch_buckets, rows)]
        k = self.kv_buckets[bisect.bisect_left(self.kv_buckets, max_ctx)]  # smallest bucket > position = ctx - 1
        return b, k

    def admitted_width(self, running: int, prompts: list[int]) -> tuple[int, int]:
        """(prompts admitted, padded width) of one step from waiting ``prompts`` (lengths, FCFS) with ``running``
        rows busy: ``Scheduler._admit``'s rule."""
        n = width = 0
        for p in prompts:
            if running + n >= self.max_batch:
                break
            w = max(width, p)
            if n and w * (n + 1) > self.max_prefill_tokens:
                break
            n, width = n + 1, w
        return n, width


class TorchTPStepTime:
    """Step times of a torch-tp replica: the planner's forward passes (``ServeCostModel.forward_s``, its
    efficiencies and fixed overheads) at the padded shapes the server actually runs.

    step(n prompts of padded width w, d running rows whose longest context is c) =
        step_overhead
        + [d > 0] (forward(R tokens, R·K pairs, R·K KV tokens read) + R·row_s)   (R, K) = decode_shape(d, c)
        + [n > 0] (forward(n·w tokens, n·w² pairs, 0) + prefill_overhead + [(n, w) new] new_shape_s)

    ``row_s`` (``engine.decode_seq_ms``): the cost of each row the decode forward computes (the padded batch under
    CUDA graphs), which the roofline lacks (``phase6.fleet.interference``).

    ``warm_shapes``: the (prompts, width) prefill shapes the server process ran before the simulated run (earlier
    runs on the same server); a replica starts with them and adds each shape it runs.
    """

    def __init__(
        self,
        base: ServeCostModel,
        engine: TorchTPEngine,
        new_shape_s: float = 0.0,
        warm_shapes: frozenset[tuple[int, int]] = frozenset(),
        row_s: float = 0.0,
    ) -> None:
        if new_shape_s < 0 or row_s < 0:
            raise ValueError(f"torch-tp: the new-shape and per-row costs must be >= 0, got {new_shape_s}, {row_s}")
        self.base, self.engine = base, engine
        self.row_s = row_s
        self.new_shape_s = new_shape_s
        self.warm_shapes = frozenset(warm_shapes)
        self._decode: dict[tuple[int, int], float] = {}

    def decode_forward_s(self, rows: int, max_ctx: int) -> float:
        """The decode forward (no overheads) of ``rows`` running requests, the longest at ``max_ctx`` tokens."""
        shape = self.engine.decode_shape(rows, max_ctx)
        t = self._decode.get(shape)
        if t is None:
            r, k = shape
            t = self._decode[shape] = self.base.forward_s(r, float(r * k), r * k) + r * self.row_s
        return t

    def prefill_forward_s(self, prompts: int, width: int) -> float:
        """The prefill forward (no overheads) of ``prompts`` prompts padded to ``width`` tokens."""
        n, w = prompts, width
        return self.base.forward_s(n * w, float(n * w * w), 0)

    def padded_step_s(self, prompts: int, width: int, decode_rows: int, max_ctx: int, new_shape: bool = True) -> float:
        """One step: ``decode_rows`` running rows (longest context ``max_ctx``) decode, then ``prompts`` admitted
        prompts padded to ``width`` prefill (``new_shape``: a (prompts, width) shape the server has not run yet)."""
        b = self.base
        t = b.overhead_s
        if decode_rows > 0:
            t += self.decode_forward_s(decode_rows, max_ctx)
        if prompts > 0:
            t += self.prefill_forward_s(prompts, width) + b.prefill_overhead_s
            if new_shape:
                t += self.new_shape_s
        return t

    def padded_decode_run_s(self, decode_rows: int, max_ctx: int, num_steps: int) -> float:
        """Sum over j < num_steps of padded_step_s(0, 0, decode_rows, max_ctx + j): with graphs the step time is
        constant between KV-length bucket edges, so the sum is one term per bucket the run crosses; eager decode
        reads rows x (longest context), growing by one row of KV per step (the planner's closed form)."""
        d, c, k = decode_rows, max_ctx, num_steps
        if d <= 0 or k <= 0:
            return 0.0
        if not self.engine.cuda_graphs:
            return self.base.decode_run_s(d, d * c, k) + k * d * self.row_s  # step j: d tokens, d·(c + j) pairs, KV
        kv = self.engine.kv_buckets
        if c + k - 1 > kv[-1]:
            raise ValueError(f"torch-tp: a decode run reaches context {c + k - 1} > --max-model-len {kv[-1]}")
        oh = self.base.overhead_s
        total, j = 0.0, 0
        while j < k:
            bucket = kv[bisect.bisect_left(kv, c + j)]
            end = min(k, bucket - c + 1)  # steps j' < end have context c + j' <= bucket
            total += (end - j) * (self.decode_forward_s(d, c + j) + oh)
            j = end
        return total

    def idle_prefill_s(self, prompt_tokens: int) -> float:
        """TTFT of one request on an idle replica: its whole prompt in one prefill step (no decode rows), at a width
        the server has not run before (as every request of a C=1 calibration run)."""
        return self.padded_step_s(1, prompt_tokens, 0, 0, new_shape=True)


def kv_rows_blocks(engine: TorchTPEngine, block_tokens: int) -> int:
    """The static cache in the simulator's KV blocks: --max-batch rows of ceil(max_model_len / block) blocks, so
    only the row count limits admission (every request that fits max_model_len fits a row)."""
    return engine.max_batch * math.ceil(engine.max_model_len / block_tokens)
