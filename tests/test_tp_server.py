"""Tensor-parallel server (phase6.serving.tp_server): CPU, fp32, gloo, tiny Llama (2 layers, hidden 64, 4 heads,
2 KV heads) and a tokenizer trained here. Nothing is downloaded.

- In process: the continuous-batching scheduler (staggered prompts/lengths, row compaction) gives exactly the tokens
  of a cache-free greedy loop; the TP split (2 ranks emulated by threads with in-memory collectives) gives the full
  model's logits within 1e-5 for Llama and Qwen2 (biased q/k/v); indivisible head counts are refused by name.
- Real servers: TP=2 under torchrun (checkpoint dir) and TP=1 without torchrun (--dummy-weights from config.json,
  same seed as the checkpoint) answer greedy and seeded requests with identical tokens, stream through the 6B
  client, answer concurrent requests, return 400 for malformed ones and stop every rank on SIGTERM.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from phase6.models.packed_gqa import apply_packed_gqa, packed_gqa_attention
from phase6.parallel import apply_tp
from phase6.serving.tp_server import ServerArgs, parse_args
from phase6.serving.tp_server.engine import CMD_NOOP, HEADER_LEN, Engine, StepPlan
from phase6.serving.tp_server.model import build_model, load_config
from phase6.serving.tp_server.scheduler import GenParams, Request, Scheduler
from phase6.serving.tp_server.server import main

VOCAB = 300
MAX_LEN = 256
# the server passes past_key_values (transformers 5.17 on the GPU image); >= 5.18 warns about the rename
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny matmuls on a shared 2-core machine: intra-op threads only add contention (15 s -> 1 s here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_llama_config(vocab: int = VOCAB, **kw: object) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **kw,
    )


def greedy_reference(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Cache-free greedy decoding: the full sequence through the model for every token."""
    ids = torch.tensor([prompt])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            tok = int(model(ids).logits[0, -1].argmax())
            out.append(tok)
            ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    return out


# ---------------------------------------------------------------------------------------------------------------
# In process


@pytest.mark.parametrize("arch,static", [("llama", False), ("qwen2", False), ("llama", True)])
def test_continuous_batching_matches_greedy_reference(tmp_path: Path, arch: str, static: bool) -> None:
    """static: decode padded to (batch, KV length) buckets from fixed buffers, as the CUDA graphs run it."""
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(tiny_llama_config(vocab=512))
    else:
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
            )
        )
    model.eval()
    apply_packed_gqa(model)
    model.config.save_pretrained(tmp_path)
    # 5 KV rows for 8 requests: requests wait, join mid-flight and finish at different steps (rows are compacted);
    # the prefill budget splits admissions into several batches of different padded widths.
    args = ServerArgs(model=str(tmp_path), max_batch=5, max_model_len=256, max_prefill_tokens=160)
    engine = Engine(model, args, torch.device("cpu"), 0, 1, None, static_decode=static)
    assert engine.batch_buckets == [1, 2, 4, 5] and engine.kv_buckets == [128, 256]  # 3 rows pad to 4
    sched = Scheduler(engine, args, eos_ids=set(), sample_vocab=512)
    got: dict[str, list[int]] = {}

    def sink(events: list[tuple[Request, int | None, str | None]]) -> None:
        for r, tok, _ in events:
            got.setdefault(r.rid, []).append(tok)  # type: ignore[arg-type]

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 3, 12, 140, 8)]
    max_tokens = [7, 12, 4, 9, 15, 6, 5, 20]  # the 140-token prompt crosses the 128 KV bucket
    for i, (p, k) in enumerate(zip(prompts, max_tokens, strict=True)):
        sched.submit(Request(str(i), GenParams(p, k, temperature=0.0, ignore_eos=True), sink))
    with torch.inference_mode():
        for _ in range(200):
            if not (sched.active or sched.waiting or not sched.inbox.empty()):
                break
            sched.step()
    assert sched.counters["success"] == len(prompts) and not sched.active
    for i, (p, k) in enumerate(zip(prompts, max_tokens, strict=True)):
        assert got[str(i)] == greedy_reference(model, p, k), f"request {i}"


@pytest.mark.parametrize("t", [1, 6])
def test_packed_gqa_matches_hf_sdpa_with_repeated_kv(t: int) -> None:
    """Packing 5 query heads per KV head (Qwen2.5-14B's ratio) = HF's repeat_kv path, with a ragged bool mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    b, hkv, group, length, d = 3, 2, 5, 11, 16
    q = torch.randn(b, hkv * group, t, d, generator=g)
    k, v = torch.randn(b, hkv, length, d, generator=g), torch.randn(b, hkv, length, d, generator=g)
    lens = torch.tensor([11, 7, 6])
    keys, qpos = torch.arange(length), lens[:, None] - t + torch.arange(t)  # query t sits at its row's end
    mask = (keys[None, None, :] <= qpos[:, :, None])[:, None]  # (B, 1, T, L)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = group, True  # what sdpa_attention_forward reads
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=d**-0.5)
    out, _ = packed_gqa_attention(module, q, k, v, mask, scaling=d**-0.5)
    assert out.shape == ref.shape == (b, t, hkv * group, d)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_static_decode_pads_to_a_bucket_and_matches_eager(tmp_path: Path) -> None:
    """3 rows padded to the 4-row bucket, KV bucket 256: the logits of the unpadded eager decode (fp32, 1e-5)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(vocab=512)).eval()
    apply_packed_gqa(model)
    model.config.save_pretrained(tmp_path)
    args = ServerArgs(model=str(tmp_path), max_batch=5, max_model_len=256)
    engine = Engine(model, args, torch.device("cpu"), 0, 1, None, static_decode=True)
    prompts = [list(range(1, 6)), list(range(20, 29)), [(7 * j) % 512 for j in range(130)]]
    with torch.inference_mode():
        engine.execute(StepPlan(prefill_prompts=prompts))  # rows 0..2
        calls: list[tuple[int, int]] = []
        bucketed = engine._decode_bucketed
        engine._decode_bucketed = lambda b, k: calls.append((b, k)) or bucketed(b, k)  # type: ignore[method-assign]
        static = engine._decode_static([11, 12, 13], [5, 9, 130])
        eager = engine._decode_eager([11, 12, 13], [5, 9, 130])
    assert calls == [(4, 256)] and static.shape == eager.shape == (3, 512)
    torch.testing.assert_close(static, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # inductor compile of the prefill: 68 s on the loaded 2-core box
def test_compiled_prefill_matches_eager_and_compiles_only_at_start(tmp_path: Path) -> None:
    """--compile-prefill: the same steps (1 or 3 prompts, first row 0 or after decode rows, a one-token prompt) give
    the eager engine's logits (fp32, 1e-5), and after ``warm_prefill`` no step compiles another graph."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    apply_packed_gqa(model)
    model.config.save_pretrained(tmp_path)
    args = ServerArgs(model=str(tmp_path), max_batch=8, max_model_len=256, max_prefill_tokens=1024)
    eager = Engine(model, args, torch.device("cpu"), 0, 1, None, static_decode=True)
    compiled = Engine(
        copy.deepcopy(model), args, torch.device("cpu"), 0, 1, None, static_decode=True, compile_prefill=True
    )
    g = torch.Generator().manual_seed(3)

    def prompt(n: int) -> list[int]:
        return torch.randint(0, 512, (n,), generator=g).tolist()

    steps = [
        StepPlan(prefill_prompts=[prompt(40)]),
        StepPlan(decode_tokens=[5], decode_positions=[40], prefill_prompts=[prompt(17), prompt(61), prompt(3)]),
        StepPlan(decode_tokens=[6, 7, 8, 9], decode_positions=[41, 17, 61, 3], prefill_prompts=[prompt(1)]),
        StepPlan(decode_tokens=[1, 2, 3, 4, 5], decode_positions=[42, 18, 62, 4, 1], prefill_prompts=[prompt(90)]),
        StepPlan(decode_tokens=[1, 2], decode_positions=[43, 19], prefill_prompts=[prompt(7), prompt(8)]),
    ]
    with torch.inference_mode():
        took, graphs = compiled.warm_prefill()
        assert 1 <= graphs <= 12, graphs
        for e in (eager, compiled):  # warm_prefill wrote rows 0..1: start both from the same cache
            for t in (*e.cache.k, *e.cache.v):
                t.zero_()
        for plan in steps:
            torch.testing.assert_close(compiled.execute(plan), eager.execute(plan), atol=1e-5, rtol=1e-5)
    assert int(counters["stats"]["unique_graphs"]) == graphs, "a serving step compiled a new graph"
    assert all(layer.forward == f for layer, f in zip(compiled.layers, compiled._eager_layer_fwd, strict=True))


class FakeGraph:
    """CPU stand-in for torch.cuda.CUDAGraph: replay() recomputes into the output captured at 'capture' time
    (live), or leaves it as captured (stale: what a graph bound to the wrong buffers would return)."""

    def __init__(self, fn: Callable[[], torch.Tensor], out: torch.Tensor, live: bool) -> None:
        self.fn, self.out, self.live = fn, out, live

    def replay(self) -> None:
        if self.live:
            self.out.copy_(self.fn())


@pytest.mark.parametrize("live", [True, False])
def test_graph_decode_path_and_startup_check(tmp_path: Path, live: bool) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(vocab=512)).eval()
    apply_packed_gqa(model)
    model.config.save_pretrained(tmp_path)
    engine = Engine(
        model,
        ServerArgs(model=str(tmp_path), max_batch=4, max_model_len=256),
        torch.device("cpu"),
        0,
        1,
        None,
        static_decode=True,
    )
    with torch.inference_mode():
        for b in engine.batch_buckets:
            for k in engine.kv_buckets:
                fn = functools.partial(engine._decode_bucketed, b, k)
                out = fn().clone()
                engine.graphs[(b, k)] = (FakeGraph(fn, out, live), out)  # type: ignore[assignment]
        engine.cuda_graphs = True
        if live:
            err = engine.verify_graphs()
            assert err["graph_vs_bucket"] == 0 and err["bucket_vs_eager"] < 1e-5
        else:
            with pytest.raises(RuntimeError, match="--cuda-graphs: decode check failed"):
                engine.verify_graphs()


class ThreadCollectives:
    """all_reduce / all_gather between threads (one per emulated rank), deterministic summation order."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list[torch.Tensor | None] = [None] * world
        self.local = threading.local()

    def all_reduce(self, t: torch.Tensor, group: object = None) -> None:
        self.slots[self.local.rank] = t.clone()
        self.barrier.wait()
        total = sum(self.slots[1:], self.slots[0])  # type: ignore[arg-type]
        self.barrier.wait()
        t.copy_(total)

    def all_gather(self, parts: list[torch.Tensor], t: torch.Tensor, group: object = None) -> None:
        self.slots[self.local.rank] = t.clone()
        self.barrier.wait()
        for i in range(self.world):
            parts[i].copy_(self.slots[i])  # type: ignore[arg-type]
        self.barrier.wait()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tp_split_matches_full_model(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    torch.manual_seed(0)
    if arch == "llama":
        full = LlamaForCausalLM(tiny_llama_config(vocab=512)).eval()
    else:  # Qwen2: q/k/v carry biases, which must be split with their rows
        full = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
            )
        ).eval()
        for name, p in full.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.normal_(p, std=0.5)  # HF inits biases to 0, which would hide a mis-split
    world = 2
    shards = [copy.deepcopy(full) for _ in range(world)]
    split = [apply_tp(m, rank, world) for rank, m in enumerate(shards)]
    assert set(split[0].values()) == {"colwise", "rowwise", "colwise_gather_output"}
    assert len(split[0]) == 2 * 7 + 1  # 7 Linears per layer + lm_head
    assert shards[0].model.layers[0].self_attn.q_proj.weight.shape[0] == 32  # 2 of 4 heads x head_dim 16
    fake = ThreadCollectives(world)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake.all_reduce)
    monkeypatch.setattr(torch.distributed, "all_gather", fake.all_gather)
    ids = torch.randint(0, 512, (2, 11), generator=torch.Generator().manual_seed(2))
    out: list[torch.Tensor | None] = [None] * world

    def run(rank: int) -> None:
        fake.local.rank = rank
        with torch.inference_mode():
            out[rank] = shards[rank](ids).logits

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    with torch.inference_mode():
        ref = full(ids).logits
    for rank in range(world):
        assert out[rank] is not None
        torch.testing.assert_close(out[rank], ref, atol=1e-5, rtol=1e-5)  # fp32, only the summation order differs


def test_tp_split_refuses_indivisible_heads() -> None:
    model = LlamaForCausalLM(tiny_llama_config())  # 2 KV heads cannot go to 4 ranks
    with pytest.raises(ValueError, match="config.num_key_value_heads = 2 is not divisible by .* 4"):
        apply_tp(model, 0, 4)


def test_step_plan_roundtrip() -> None:
    plan = StepPlan([(4, 1, 17), (3, 0, 9)], [11, 12, 13], [20, 5, 7], [[1, 2, 3], [9], [5, 6]])
    header, payload = plan.encode()
    assert header.shape == (HEADER_LEN,) and StepPlan.payload_len(header) == payload.numel()
    assert StepPlan.decode(header, payload) == plan
    h, p = StepPlan().encode(CMD_NOOP)
    assert int(h[0]) == CMD_NOOP and p.numel() == 0


def test_server_args_name_the_bad_flag(tmp_path: Path) -> None:
    tiny_llama_config().save_pretrained(tmp_path)
    cfg = str(tmp_path / "config.json")
    with pytest.raises(ValueError, match="^--model: .*never downloads"):
        ServerArgs(model="meta-llama/Llama-3.1-8B")
    with pytest.raises(ValueError, match="^--model: .*--dummy-weights"):
        ServerArgs(model=cfg)
    with pytest.raises(ValueError, match="^--host: "):
        ServerArgs(model=cfg, dummy_weights=True, host="0.0.0.0")
    with pytest.raises(ValueError, match="^--dtype: "):
        ServerArgs(model=cfg, dummy_weights=True, dtype="fp8")
    with pytest.raises(ValueError, match="^--max-batch: "):
        ServerArgs(model=cfg, dummy_weights=True, max_batch=0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="bad.json: key 'model_type' missing"):
        load_config(str(bad))
    assert main(["--model", cfg, "--host", "0.0.0.0", "--dummy-weights"]) == 2
    assert main(["--model", cfg, "--dummy-weights", "--device", "cpu", "--cuda-graphs"]) == 2


@pytest.mark.parametrize("tp", [1, 4])
def test_serve_bench_launch_command_parses(tmp_path: Path, tp: int) -> None:
    """The 6B launcher's torch-tp command line (configs/serve_bench/serve/torch_tp_*.yaml) is one the server takes."""
    from phase6.config.serve import ServeConfig
    from phase6.serving.server import build_command

    tiny_llama_config().save_pretrained(tmp_path)
    cfg = ServeConfig(
        engine="torch-tp",
        model=str(tmp_path),
        tp=tp,
        dtype="bfloat16",
        max_model_len=2048,
        engine_args={"dummy-weights": True, "max-batch": 64, "max-prefill-tokens": 16384},
    )
    cmd = build_command(cfg, str(tmp_path), 8123)
    start = cmd.index("phase6.serving.tp_server") + 1
    if tp > 1:
        assert Path(cmd[0]).name == "torchrun" and cmd[1:5] == ["--standalone", "--nproc_per_node", str(tp), "-m"]
    else:
        assert cmd[:2] == [sys.executable, "-m"]
    args = parse_args(cmd[start:])
    assert (args.model, args.port, args.dtype, args.max_model_len) == (str(tmp_path), 8123, "bfloat16", 2048)
    assert args.dummy_weights and args.max_batch == 64 and args.max_prefill_tokens == 16384


def test_make_dummy_model_script(tmp_path: Path) -> None:
    """scripts/make_dummy_model.py: the published Qwen2.5-14B shapes (14.77B parameters) + a local tokenizer."""
    import runpy

    from transformers import AutoConfig, AutoModelForCausalLM

    script = Path(__file__).resolve().parents[1] / "scripts" / "make_dummy_model.py"
    fields = runpy.run_path(str(script))["architecture"]("qwen2.5-14b")
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 14.77
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        assert getattr(config, key) % 4 == 0, key  # TP=4 divides every split dimension


# ---------------------------------------------------------------------------------------------------------------
# Real servers: TP=1 (python -m) and TP=2 (torchrun), started once for the module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Launched:
    def __init__(self, cmd: list[str], log: Path, port: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.log, self.url = log, f"http://127.0.0.1:{port}"
        with log.open("wb") as f:
            self.proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        pytest.fail(f"server not ready after {timeout_s} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint made by the server's own --dummy-weights init (seed 0) + a locally trained ChatML tokenizer."""
    from phase6.posttrain.tiny import build_tiny_tokenizer

    d = tmp_path_factory.mktemp("tiny_llama")
    tok = build_tiny_tokenizer(
        [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(300)], vocab_size=VOCAB
    )
    assert len(tok) == VOCAB
    tiny_llama_config(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(d)
    args = ServerArgs(model=str(d / "config.json"), dummy_weights=True, seed=0)
    build_model(args, torch.device("cpu"), torch.float32).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def servers(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Launched]]:
    logs = tmp_path_factory.mktemp("logs")
    common = ["--max-batch", "8", "--max-model-len", str(MAX_LEN), "--max-prefill-tokens", "512"]
    p1, p2 = _free_port(), _free_port()
    torchrun = str(Path(sys.executable).parent / "torchrun")
    srv = {
        1: Launched(
            [
                sys.executable,
                "-m",
                "phase6.serving.tp_server",
                "--model",
                str(tiny_dir / "config.json"),
                "--dummy-weights",
                "--seed",
                "0",
                "--port",
                str(p1),
                *common,
            ],
            logs / "tp1.log",
            p1,
        ),
        2: Launched(
            [
                torchrun,
                "--standalone",
                "--nproc_per_node",
                "2",
                "-m",
                "phase6.serving.tp_server",
                "--model",
                str(tiny_dir),
                "--port",
                str(p2),
                "--compile-prefill",  # TP collectives traced into the compiled prefill: tokens must still match TP=1
                *common,
            ],
            logs / "tp2.log",
            p2,
        ),
    }
    try:
        for s in srv.values():
            s.wait_ready()
        yield srv
    finally:
        for s in srv.values():
            s.stop()


def _complete(url: str, body: dict[str, object]) -> dict[str, object]:
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow  # the module's TP=1 + TP=2 servers: 64 s to start on the loaded 2-core box
def test_tp2_gives_tp1_tokens(servers: dict[int, Launched], tiny_dir: Path) -> None:
    reference = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(3)
    prompts: list[object] = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (4, 19, 40)]
    prompts.append("the quick brown fox")
    tokens: dict[int, list[list[int]]] = {}
    for tp, srv in servers.items():
        tokens[tp] = [
            _complete(
                srv.url, {"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
            )["choices"][0]["token_ids"]  # type: ignore[index]
            for p in prompts
        ]
    assert tokens[2] == tokens[1]  # exact token equality, TP=2 (compiled prefill) vs TP=1 (eager)
    log = servers[2].log.read_text(errors="replace")
    assert "compiled the prefill" in log and "compiled a new graph while serving" not in log
    for p, got in zip(prompts[:3], tokens[1][:3], strict=True):
        assert got == greedy_reference(reference, p, 12)  # type: ignore[arg-type]
    sampled = {
        tp: _complete(
            srv.url,
            {
                "prompt": prompts[1],
                "max_tokens": 12,
                "temperature": 0.8,
                "seed": 7,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )["choices"][0]["token_ids"]
        for tp, srv in servers.items()
    }  # type: ignore[index]
    assert sampled[1] == sampled[2] and sampled[1] != tokens[1][1]


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.slow  # the module's TP=1 + TP=2 servers: 64 s to start on the loaded 2-core box
def test_streaming_with_the_6b_client(servers: dict[int, Launched], api: str) -> None:
    from phase6.serving.client import run_requests

    n, out_len = 12, 10
    bodies = []
    for i in range(n):
        body: dict[str, object] = {
            "stream": True,
            "max_tokens": out_len,
            "temperature": 0,
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        text = f"the lazy dog {i} jumps"
        body |= {"messages": [{"role": "user", "content": text}]} if api == "chat" else {"prompt": text}
        bodies.append(json.dumps(body).encode())
    outcome = asyncio.run(
        run_requests(servers[2].url, api, bodies, [0.0] * n, concurrency=6, read_timeout_s=60, request_timeout_s=120)
    )
    assert outcome.sent == n and outcome.completed == n, [r.error for r in outcome.results if not r.ok]
    for r in outcome.results:
        assert r.output_tokens == out_len and r.tokens_source == "usage"
        assert r.finish_reason == "length" and r.prompt_tokens and r.prompt_tokens > 0
        assert r.chunk_tokens_source == "usage" and 0 < sum(r.chunk_tokens) <= out_len
        assert r.ttft_s > 0 and r.e2e_s >= r.ttft_s


@pytest.mark.slow  # the module's TP=1 + TP=2 servers: 64 s to start on the loaded 2-core box
def test_concurrent_requests_all_answered(servers: dict[int, Launched]) -> None:
    url = servers[2].url
    before = httpx.get(url + "/metrics").text

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(
                *(
                    c.post(
                        url + "/v1/completions",
                        json={
                            "prompt": f"the quick brown fox {i}",
                            "max_tokens": 4 + i % 5,
                            "temperature": 0,
                            "ignore_eos": True,
                        },
                    )
                    for i in range(20)
                )
            )  # 20 requests > 8 KV rows: some wait for a row

    responses = asyncio.run(go())
    assert all(r.status_code == 200 for r in responses)
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [4 + i % 5 for i in range(20)]

    def counter(text: str, name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + "{")))

    after = httpx.get(url + "/metrics").text
    assert counter(after, "vllm:request_success_total") - counter(before, "vllm:request_success_total") == 20
    assert counter(after, "vllm:generation_tokens_total") - counter(before, "vllm:generation_tokens_total") == sum(
        4 + i % 5 for i in range(20)
    )
    assert counter(after, "vllm:num_requests_running") == 0


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'["a list"]',
        b'{"prompt": 5}',
        b'{"prompt": "hi", "max_tokens": 0}',
        b'{"prompt": "hi", "max_tokens": "many"}',
        b'{"prompt": "hi", "max_tokens": 100000}',
        b'{"prompt": [1, 2, 100000], "max_tokens": 2}',
        b'{"prompt": "hi", "n": 2}',
        b'{"prompt": "hi", "temperature": -1}',
        b'{"prompt": "hi", "stop": ["x"]}',
        b'{"prompt": "hi", "model": "not-this-one"}',
        b'{"prompt": ""}',
    ],
)
@pytest.mark.slow  # the module's TP=1 + TP=2 servers: 64 s to start on the loaded 2-core box
def test_malformed_request_gets_400(servers: dict[int, Launched], body: bytes) -> None:
    url = servers[2].url
    r = httpx.post(url + "/v1/completions", content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]
    assert httpx.get(url + "/health").status_code == 200
    assert _complete(url, {"prompt": "hi", "max_tokens": 2})["usage"]["completion_tokens"] == 2  # type: ignore[index]


@pytest.mark.slow  # the module's TP=1 + TP=2 servers: 64 s to start on the loaded 2-core box
def test_models_and_chat_400(servers: dict[int, Launched], tiny_dir: Path) -> None:
    m = httpx.get(servers[1].url + "/v1/models").json()
    assert m["data"][0]["id"] == str(tiny_dir / "config.json") and m["data"][0]["owned_by"] == "torch-tp"
    r = httpx.post(servers[2].url + "/v1/chat/completions", json={"messages": "hello"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


@pytest.mark.slow  # the module's TP=1 + TP=2 servers: 64 s to start on the loaded 2-core box
def test_sigterm_stops_every_rank(servers: dict[int, Launched]) -> None:
    """Last test of the module: it stops the servers it shares with the tests above."""
    for srv in servers.values():
        os.kill(srv.proc.pid, signal.SIGTERM)  # python -m: the server itself; torchrun: the agent forwards it
    for tp, srv in servers.items():
        srv.proc.wait(timeout=60)
        log = srv.log.read_text(errors="replace")
        for rank in range(tp):
            assert f"[tp_server rank {rank}] stopped" in log, srv.tail()
    assert servers[1].proc.returncode == 0
