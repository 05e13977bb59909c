"""Child process of ``phase6.posttrain.verl_check``: run verl's OWN code on a job ``phase6 grpo engine=verl`` wrote.

Run by the interpreter of the environment that holds verl (``<vLLM venv>/verl``, ``make setup-vllm``), with verl and
phase6's ``src`` on PYTHONPATH. Reads a JSON list of jobs on stdin (``args``, ``data``, ``completions``), prints one ``PHASE6_RESULT <json list>``
line. Every step
is what ``python -m verl.trainer.main_ppo`` itself does before and after ``ray.init``, minus Ray and the GPU:

1. config: Hydra's compose API on verl's ``verl/trainer/config`` (``ppo_trainer``, the config ``main_ppo``'s
   ``@hydra.main`` names) with the override list ``command.sh`` passes; then ``main()``'s own checks,
   ``auto_set_device`` and ``validate_config(config, need_reference_policy, need_critic)``.
2. data (if the actor's model path is a local directory): the tokenizer as the trainer builds it
   (``HFModelConfig`` from ``actor_rollout_ref.model``), ``create_rl_dataset`` on ``data.train_files`` and
   ``data.val_files`` (verl's ``RLHFDataset``, which filters over-long prompts with the chat template), and a
   batch through verl's ``collate_fn`` and ``DataProto.from_single_dict`` as its dataloader hands it on.
3. reward: verl's ``RewardLoopWorker`` (the reward worker ``main_ppo``'s trainer starts; here a plain object, not
   a Ray actor): it loads ``reward.custom_reward_function`` with verl's loader and builds the reward manager; the
   request's completions are tokenized onto dataset rows and scored by ``compute_score_batch`` (the manager decodes
   the response tokens and calls the reward function, as in training). verl's built-in GSM8K score
   (``default_compute_score``) is returned beside it.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any


def _one_line(exc: BaseException) -> str:
    """The exception's first line (Hydra's names the key; its second line is advice)."""
    lines = [ln for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
    return lines[0]


def compose(args: list[str]) -> Any:
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(Path(main_ppo.__file__).parent / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=args)


def validate(config: Any) -> None:
    """What ``verl.trainer.main_ppo.main`` runs before ``run_ppo`` (Ray)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def datasets(config: Any) -> tuple[Any, dict[str, Any], Any]:
    try:
        from verl.trainer.ppo.utils import create_rl_dataset
    except ImportError:  # verl < 0.9
        from verl.trainer.main_ppo import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass

    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tok = model_config.tokenizer
    out: dict[str, Any] = {}
    sets = {}
    for split, files, key in (("train", config.data.train_files, "train"), ("val", config.data.val_files, "val")):
        ds = create_rl_dataset(
            files,
            config.data,
            tok,
            model_config.processor,
            is_train=split == "train",
            max_samples=config.data.get(f"{key}_max_samples", -1),
        )
        sets[split] = ds
        row = ds[0]
        ids = tok.apply_chat_template(row["raw_prompt"], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out[split] = {
            "class": type(ds).__name__,
            "rows": len(ds),
            "keys": sorted(row),
            "raw_prompt": row["raw_prompt"],
            "data_source": row["data_source"],
            "reward_model": dict(row["reward_model"]),
            "prompt_tokens": len(ids),
            "max_prompt_length": int(config.data.max_prompt_length),
        }
    return tok, out, sets


def batch_of(dataset: Any, indices: list[int]) -> Any:
    """Rows -> the DataProto verl's trainer builds from one dataloader batch."""
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    return DataProto.from_single_dict(collate_fn([dataset[i] for i in indices]))


def score_completions(config: Any, tok: Any, dataset: Any, items: list[list[Any]]) -> dict[str, Any]:
    """items: [row index, completion text]; each scored by verl's reward worker on that row."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.utils.reward_score import default_compute_score

    worker = RewardLoopWorker(config)
    fn = worker.reward_manager.compute_score
    raw = fn.args[0] if hasattr(fn, "args") and fn.args else fn  # get_custom_reward_fn wraps it in a partial
    loaded = {
        "manager": type(worker.reward_manager).__name__,
        "function": getattr(raw, "__name__", repr(raw)),
        "file": getattr(getattr(raw, "__code__", None), "co_filename", None),
    }
    base = batch_of(dataset, [i for i, _ in items])
    responses = [tok(text, add_special_tokens=False)["input_ids"] for _, text in items]
    width = max(1, max(len(r) for r in responses))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    resp = torch.full((len(items), width), pad, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for k, r in enumerate(responses):
        resp[k, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[k, : len(r)] = 1
    prompt_mask = torch.ones((len(items), 1), dtype=torch.long)  # the manager reads only the response part
    non_tensors = {k: base.non_tensor_batch[k] for k in ("data_source", "reward_model", "extra_info")}
    data = DataProto.from_dict(
        tensors={"responses": resp, "attention_mask": torch.cat([prompt_mask, mask], dim=1)},
        non_tensors={k: np.asarray(v, dtype=object) for k, v in non_tensors.items()},
    )
    # the manager holds the event loop it was built on (verl.utils.ray_utils.get_event_loop); so does the worker
    loop = getattr(worker, "loop", None) or worker.reward_manager.loop  # verl 0.9 / 0.7-0.8
    results = loop.run_until_complete(worker.compute_score_batch(data))
    decoded = [tok.decode(r, skip_special_tokens=True) for r in responses]
    builtin = [
        float(default_compute_score(str(ds), text, str(rm["ground_truth"])))
        for ds, text, rm in zip(non_tensors["data_source"], decoded, non_tensors["reward_model"], strict=True)
    ]
    return {
        "loaded": loaded,
        "scores": [float(r["reward_score"]) for r in results],
        "ground_truths": [str(rm["ground_truth"]) for rm in non_tensors["reward_model"]],
        "roundtrip_equal": [d == text for d, (_, text) in zip(decoded, items, strict=True)],
        "builtin_scores": builtin,
    }


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        config = compose(job["args"])
    except Exception as e:  # Hydra's error names the key
        out["compose_error"] = _one_line(e)
        return out
    from omegaconf import OmegaConf

    out["reward_function"] = OmegaConf.to_container(config.reward.custom_reward_function)
    out["legacy_reward_function"] = OmegaConf.to_container(config.custom_reward_function)
    try:
        validate(config)
        out["validated"] = True
    except Exception as e:
        out["validate_error"] = _one_line(e)
    if job.get("data", True) and Path(str(config.actor_rollout_ref.model.path)).is_dir():
        try:
            tok, out["data"], sets = datasets(config)
        except Exception as e:  # reported, not raised: the other jobs of this process still run
            out["data_error"] = _one_line(e)
            return out
        if job.get("completions"):
            try:
                out["reward"] = score_completions(config, tok, sets["train"], job["completions"])
            except Exception as e:
                out["reward_error"] = _one_line(e)
    return out


def main() -> None:
    jobs = json.load(sys.stdin)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # verl prints ("[validate_config] ...") must not mix with the result line
        import verl

        head = {"verl_version": verl.__version__, "verl_file": verl.__file__}
        results = [{**head, **run_job(job)} for job in jobs]
    print("PHASE6_RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
