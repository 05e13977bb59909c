"""One rank's engine: the slot KV cache, the step plan rank 0 broadcasts, and the sharded model that executes it."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from phase6.serving.tp_server.args import ServerArgs
from phase6.serving.tp_server.model import decoder_layers
from phase6.timing import sync, wall

# Step commands broadcast by rank 0 (header[0]).
CMD_STEP, CMD_NOOP, CMD_STOP = 1, 2, 3
HEADER_LEN = 8

log = logging.getLogger("phase6.tp_server")
# transformers >= 5.18 renamed the model kwarg past_key_values -> cache (alias kept until 5.40); the GPU image has
# 5.17, which only knows past_key_values, so the server passes that and silences the rename notice.
warnings.filterwarnings("ignore", message="`past_key_values` is deprecated", category=FutureWarning)


class SlotKVCache:
    """Per layer K and V of shape (max_batch, kv_heads_local, max_len, head_dim), preallocated.

    Passed to the HF model as ``past_key_values``: each attention layer calls ``update(k, v, layer_idx)`` with the
    step's new keys (rows, kv_heads, T, head_dim); they are written at the bound positions of the bound rows, and
    the rows' cache up to ``kv_len`` comes back (a view, no copy). Positions and the mask are given to the model
    explicitly, so no sequence-length query is needed.
    """

    def __init__(
        self,
        num_layers: int,
        max_batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (max_batch, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_batch, self.max_len = max_batch, max_len
        self._rows = slice(0, 0)
        self._positions = torch.zeros(0, 0, dtype=torch.long, device=device)
        self._kv_len = 0
        self._fresh = False

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def bind(self, row0: int, positions: torch.Tensor, kv_len: int, fresh: bool = False) -> None:
        """The next forward writes rows [row0, row0 + B) at ``positions`` (B, T) and attends to [0, kv_len).
        ``fresh``: a prefill from position 0, whose attention needs only its own keys and values (kv_len = T)."""
        assert positions.dim() == 2 and row0 + positions.shape[0] <= self.max_batch and kv_len <= self.max_len
        assert not fresh or kv_len == positions.shape[1]
        self._rows = slice(row0, row0 + positions.shape[0])
        self._positions = positions
        self._kv_len = kv_len
        self._fresh = fresh

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fresh:  # the step's own K/V are the whole context: attend to them, store them on the side
            self._store(key, value, layer_idx)
            return key, value
        k, v = self._store(key, value, layer_idx)
        return k[:, :, : self._kv_len], v[:, :, : self._kv_len]

    @torch.compiler.disable
    def _store(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's K/V into the bound rows; returns those rows' cache views. Run eagerly under a compiled
        prefill (a graph break): the layer index and the first row stay runtime values, not graph constants."""
        idx = self._positions[:, None, :, None].expand_as(key)  # (B, H, T, D)
        k, v = self.k[layer_idx][self._rows], self.v[layer_idx][self._rows]
        k.scatter_(2, idx, key)
        v.scatter_(2, idx, value)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def move(self, src: int, dst: int, length: int) -> None:
        """Row ``dst`` takes row ``src``'s first ``length`` positions (compaction after a request finished)."""
        for t in (*self.k, *self.v):
            t[dst, :, :length] = t[src, :, :length]


@dataclass
class StepPlan:
    """Rows [0, len(decode_tokens)) decode one token each; rows after them prefill ``prefill_prompts``."""

    moves: list[tuple[int, int, int]] = field(default_factory=list)
    """(src row, dst row, KV length) compaction copies, applied in order before the forward."""
    decode_tokens: list[int] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    prefill_prompts: list[list[int]] = field(default_factory=list)

    def encode(self, cmd: int = CMD_STEP) -> tuple[torch.Tensor, torch.Tensor]:
        n_pre = len(self.prefill_prompts)
        max_len = max((len(p) for p in self.prefill_prompts), default=0)
        payload = [x for m in self.moves for x in m] + self.decode_tokens + self.decode_positions
        payload += [len(p) for p in self.prefill_prompts]
        for p in self.prefill_prompts:
            payload += p + [0] * (max_len - len(p))
        header = [cmd, len(self.moves), len(self.decode_tokens), n_pre, max_len, len(payload), 0, 0]
        return torch.tensor(header, dtype=torch.long), torch.tensor(payload, dtype=torch.long)

    @staticmethod
    def payload_len(header: torch.Tensor) -> int:
        return int(header[5])

    @classmethod
    def decode(cls, header: torch.Tensor, payload: torch.Tensor) -> StepPlan:
        _, n_moves, n_dec, n_pre, max_len = (int(x) for x in header[:5])
        vals = payload.tolist()
        i = 0
        moves = [(vals[i + 3 * j], vals[i + 3 * j + 1], vals[i + 3 * j + 2]) for j in range(n_moves)]
        i += 3 * n_moves
        dec_tok, dec_pos = vals[i : i + n_dec], vals[i + n_dec : i + 2 * n_dec]
        i += 2 * n_dec
        lens = vals[i : i + n_pre]
        i += n_pre
        prompts = [vals[i + j * max_len : i + j * max_len + lens[j]] for j in range(n_pre)]
        return cls(moves, dec_tok, dec_pos, prompts)


class Engine:
    """The sharded model + KV cache of one rank; ``execute`` runs a step, identically on every rank."""

    def __init__(
        self,
        model: nn.Module,
        args: ServerArgs,
        device: torch.device,
        rank: int,
        world: int,
        ctrl_group: dist.ProcessGroup | None,
        static_decode: bool = False,
        cuda_graphs: bool = False,
        compile_prefill: bool = False,
    ) -> None:
        cfg = model.config
        self.model, self.device, self.rank, self.world, self.ctrl = model, device, rank, world, ctrl_group
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        dtype = next(model.parameters()).dtype
        self.cache = SlotKVCache(
            cfg.num_hidden_layers, args.max_batch, kv_heads // world, args.max_model_len, head_dim, dtype, device
        )
        self.vocab_size = cfg.vocab_size
        # Static decode: every decode step is padded to a (batch, KV length) bucket and reads its inputs from fixed
        # buffers, so the step can be one CUDA graph per bucket (cuda_graphs) -- or run eagerly (CPU tests).
        self.static_decode = static_decode or cuda_graphs
        self.cuda_graphs = cuda_graphs
        mb, ml = args.max_batch, args.max_model_len
        self.batch_buckets = sorted({min(mb, 1 << i) for i in range(mb.bit_length() + 1)})
        # KV lengths: 128, 256, 512, then every 512 (a step attends to at most 1.5x its longest row beyond 1024)
        self.kv_buckets = sorted({min(ml, 128 << i) for i in range(3)} | set(range(1024, ml, 512)) | {ml})
        self.g_ids = torch.zeros(mb, 1, dtype=torch.long, device=device)
        self.g_pos = torch.zeros(mb, 1, dtype=torch.long, device=device)
        self.g_mask = torch.zeros(mb, 1, 1, ml, dtype=torch.bool, device=device)
        self.g_keys = torch.arange(ml, device=device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.layers = decoder_layers(model)
        self._eager_layer_fwd = [layer.forward for layer in self.layers]
        self._compiled_layer_fwd: list[Callable[..., Any]] = []
        self.compile_prefill = compile_prefill
        self.graphs_at_start: int | None = None
        """Compiled graphs after warm_prefill; a later compile is logged (a stall of seconds while serving)."""
        if compile_prefill:
            from torch import _dynamo

            # Each layer hands its own ``layer_idx`` (an int on the module) to the cache write, which runs eagerly
            # (SlotKVCache._store, a graph break); kept a runtime value instead of a graph constant, it lets every
            # layer share the same graphs: the layer's fragments x (one prompt / several) = 8 graphs (4 per class).
            _dynamo.config.allow_unspec_int_on_nn_module = True
            _dynamo.config.recompile_limit = max(_dynamo.config.recompile_limit, 16)
            self._compiled_layer_fwd = [torch.compile(f, dynamic=True) for f in self._eager_layer_fwd]

    # -- control plane: rank 0 -> all ------------------------------------------------------------------------

    def send(self, cmd: int, plan: StepPlan | None = None) -> None:
        header, payload = (plan or StepPlan()).encode(cmd)
        if self.world > 1:
            dist.broadcast(header, src=0, group=self.ctrl)
            if payload.numel():
                dist.broadcast(payload, src=0, group=self.ctrl)

    def receive(self) -> tuple[int, StepPlan]:
        header = torch.zeros(HEADER_LEN, dtype=torch.long)
        dist.broadcast(header, src=0, group=self.ctrl)
        payload = torch.zeros(StepPlan.payload_len(header), dtype=torch.long)
        if payload.numel():
            dist.broadcast(payload, src=0, group=self.ctrl)
        return int(header[0]), StepPlan.decode(header, payload)

    def follow(self) -> None:
        """Ranks > 0: execute whatever rank 0 broadcasts until STOP."""
        with torch.inference_mode():
            while True:
                cmd, plan = self.receive()
                if cmd == CMD_STOP:
                    return
                if cmd == CMD_STEP:
                    self.execute(plan)

    # -- data plane ------------------------------------------------------------------------------------------

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        row0: int,
        kv_len: int,
        fresh: bool = False,
    ) -> torch.Tensor:
        self.cache.bind(row0, positions, kv_len, fresh)
        out = self.base(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache, use_cache=True
        )
        return out.last_hidden_state  # (B, T, hidden)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        """Run one step; returns float32 logits (decode rows, then prefill rows; (rows, vocab)) or None."""
        for src, dst, length in plan.moves:
            self.cache.move(src, dst, length)
        logits: list[torch.Tensor] = []
        n_dec = len(plan.decode_tokens)
        if n_dec:
            decode = self._decode_static if self.static_decode else self._decode_eager
            logits.append(decode(plan.decode_tokens, plan.decode_positions))
        if plan.prefill_prompts:
            logits.append(self._prefill(plan.prefill_prompts, n_dec))
        if not logits:
            return None
        return torch.cat(logits).float()  # (rows, vocab)

    def _prefill(self, prompts: list[list[int]], row0: int, fresh: bool = True) -> torch.Tensor:
        """Prompts padded to the longest as one (n, width) batch into KV rows [row0, row0 + n); last-token logits.
        ``fresh=False`` attends through the slot cache's row views instead of the step's own K/V (the same values;
        the path before --compile-prefill existed, kept for bench_prefill's comparison)."""
        dev, n = self.device, len(prompts)
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
        width = max(len(p) for p in prompts)
        ids = torch.zeros(n, width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(dev)
        pos = torch.arange(width, device=dev).expand(n, width).contiguous()  # contiguous: one stride for any n
        q = torch.arange(width, device=dev)
        causal = q[None, :] <= q[:, None]  # (T_q, T_k)
        mask = (causal[None] & (q[None, None, :] < lens[:, None, None])).view(n, 1, width, width)
        # width 1 would be one more 0/1-specialised shape class: a one-token prefill is cheap eagerly
        compiled = self.compile_prefill and width > 1
        with self._compiled_layers(compiled):
            h = self._forward(ids, pos, mask, row0, width, fresh=fresh)
        if compiled and self.graphs_at_start is not None:
            from torch._dynamo.utils import counters

            graphs = int(counters["stats"]["unique_graphs"])
            if graphs > self.graphs_at_start:  # a shape class warm_prefill missed: this step paid for a compile
                log.warning("prefill compiled a new graph while serving (%d prompts, width %d)", n, width)
                self.graphs_at_start = graphs
        return self.lm_head(h[torch.arange(n, device=dev), lens - 1])  # gathered by the TP hook

    @contextlib.contextmanager
    def _compiled_layers(self, on: bool) -> Any:
        """Decoder layers run their compiled forward inside (decode stays eager: its CUDA graphs hold it)."""
        if not on:
            yield
            return
        for layer, f in zip(self.layers, self._compiled_layer_fwd, strict=True):
            layer.forward = f
        try:
            yield
        finally:
            for layer, f in zip(self.layers, self._eager_layer_fwd, strict=True):
                layer.forward = f

    def warm_prefill(self) -> tuple[float, int]:
        """Compile the prefill for every shape class before serving, identically on every rank (the graphs hold the
        TP collectives); returns (seconds, compiled graphs). The classes are one prompt and several (0/1
        specialisation of the batch size); the first KV row is no class, it only reaches the eager cache write.
        Writes KV rows 0..1, which hold no request yet."""
        from torch._dynamo.utils import counters

        assert self._compiled_layer_fwd, "Engine(compile_prefill=True) builds the compiled layers"
        t0 = wall()
        w = min(9, self.cache.max_len)
        for n in (1, 2) if self.cache.max_batch >= 2 else (1,):
            self._prefill([[0] * w] * n, 0)
        sync(self.device)
        self.graphs_at_start = int(counters["stats"]["unique_graphs"])
        return wall() - t0, self.graphs_at_start

    def _decode_eager(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        n, dev = len(tokens), self.device
        ids = torch.tensor(tokens, dtype=torch.long, device=dev).view(n, 1)
        pos = torch.tensor(positions, dtype=torch.long, device=dev).view(n, 1)
        kv_len = max(positions) + 1
        mask = (torch.arange(kv_len, device=dev)[None, :] <= pos).view(n, 1, 1, kv_len)  # row i sees 0..pos_i
        return self.lm_head(self._forward(ids, pos, mask, 0, kv_len)[:, -1])

    def _decode_bucketed(self, batch: int, kv_len: int) -> torch.Tensor:
        """Rows [0, batch) decode from the static buffers, attending to [0, kv_len): what one graph captures."""
        pos = self.g_pos[:batch]
        h = self._forward(self.g_ids[:batch], pos, self.g_mask[:batch, :, :, :kv_len], 0, kv_len)
        return self.lm_head(h[:, -1])

    def _decode_static(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Decode padded to the smallest bucket: padding rows decode token 0 at position 0 of KV rows that hold no
        request (active requests are rows [0, n); a new request's prefill, later in the step, rewrites from 0)."""
        n = len(tokens)
        batch = next(b for b in self.batch_buckets if b >= n)
        kv_len = next(k for k in self.kv_buckets if k > max(positions))
        pad = [0] * (batch - n)
        self.g_ids[:batch, 0].copy_(torch.tensor(tokens + pad, dtype=torch.long))
        self.g_pos[:batch, 0].copy_(torch.tensor(positions + pad, dtype=torch.long))
        self.g_mask[:batch, 0, 0, :kv_len] = self.g_keys[:kv_len][None, :] <= self.g_pos[:batch]
        if self.cuda_graphs:
            graph, out = self.graphs[(batch, kv_len)]
            graph.replay()
            return out[:n]
        return self._decode_bucketed(batch, kv_len)[:n]

    def capture_graphs(self) -> float:
        """One CUDA graph per (batch, KV length) bucket, captured in the same order on every rank (the graphs hold
        the TP collectives, so every rank must replay the same graph each step); returns the seconds it took."""
        assert self.cuda_graphs and self.device.type == "cuda"
        t0 = wall()
        self.g_mask.zero_()
        self.g_mask[:, :, :, 0] = True  # capture inputs: row i decodes at position 0 (no all-masked rows)
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        for batch in reversed(self.batch_buckets):  # largest first: smaller graphs reuse its pool memory
            for kv_len in reversed(self.kv_buckets):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up outside capture (workspaces, lazy inits)
                    self._decode_bucketed(batch, kv_len)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._decode_bucketed(batch, kv_len)
                self.graphs[(batch, kv_len)] = (graph, out)
        sync(self.device)
        return wall() - t0

    def verify_graphs(self) -> dict[str, float]:
        """Start-up check on every rank, errors as max |difference| / max |logit|: graph replay vs the same bucket run
        eagerly (<= 2 %: cuBLAS may pick other kernels under capture) and vs the unpadded eager decode (<= 10 %,
        bf16 through all layers). A stale input or address in a graph is off by ~100 %: RuntimeError, no start."""
        prompts = [[(7 * i + 3 * j) % self.vocab_size for j in range(5 + 4 * i)] for i in range(3)]
        self.execute(StepPlan(prefill_prompts=prompts))  # rows 0..2 (empty before serving; reused later)
        tokens, positions = [1, 2, 3], [len(p) for p in prompts]
        eager = self._decode_eager(tokens, positions).float()
        self.cuda_graphs = False
        bucket = self._decode_static(tokens, positions).float()
        self.cuda_graphs = True
        graph = self._decode_static(tokens, positions).float()
        scale = float(eager.abs().max())
        err = {
            "graph_vs_bucket": float((graph - bucket).abs().max()) / scale,
            "bucket_vs_eager": float((bucket - eager).abs().max()) / scale,
        }
        if not (err["graph_vs_bucket"] <= 2e-2 and err["bucket_vs_eager"] <= 1e-1):
            raise RuntimeError(
                f"--cuda-graphs: decode check failed (max error / max |logit|: {err}); run without --cuda-graphs"
            )
        return err
