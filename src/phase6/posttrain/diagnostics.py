"""Training diagnostics for preference optimisation (6C): per-example margins on a fixed probe set, and generation
length statistics before vs after.

TRL logs only the batch mean of ``rewards/margins``. ``MarginProbeCallback`` scores a fixed probe set at the start of
training and at every evaluation, and keeps, per pair:

- ``margin``          log π(y+|x) − log π(y−|x), summed over completion tokens (the raw chosen−rejected log-prob margin);
- ``logratio_margin`` [log π(y+) − log π0(y+)] − [log π(y−) − log π0(y−)], where π0 is the policy at step 0. For
                      LoRA the adapter starts with B = 0, so π0 *is* the reference (base) model and β·logratio_margin
                      is DPO's implicit reward margin. Reward accuracy = share of pairs with logratio_margin > 0.

Length statistics count generated tokens (up to and including EOS) under greedy decoding with a fixed
``max_new_tokens`` on a fixed prompt set; generations that hit the cap are counted as truncated, because a capped
length understates the after/before ratio.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from trl.data_utils import apply_chat_template, is_conversational
from trl.trainer.dpo_trainer import DataCollatorForPreference

from phase6.figures import save_figure

# ---------------------------------------------------------------------------------------------------------------------
# tokenisation (the same split as TRL's DPOTrainer: completion starts where prompt and prompt+completion diverge)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def tokenize_pairs(
    pairs: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, max_length: int | None
) -> list[dict[str, list[int]]]:
    """prompt_ids / chosen_ids / rejected_ids per pair, ready for TRL's ``DataCollatorForPreference``."""
    out = []
    for pair in pairs:
        example = {k: pair[k] for k in ("prompt", "chosen", "rejected")}
        if is_conversational(example):
            example = apply_chat_template(example, tokenizer)
        else:
            eos = tokenizer.eos_token or ""
            example = {
                "prompt": example["prompt"],
                "chosen": example["chosen"] if example["chosen"].endswith(eos) else example["chosen"] + eos,
                "rejected": example["rejected"] if example["rejected"].endswith(eos) else example["rejected"] + eos,
            }
        prompt_ids = tokenizer(example["prompt"], add_special_tokens=False)["input_ids"]
        pc = tokenizer(example["prompt"] + example["chosen"], add_special_tokens=False)["input_ids"]
        pr = tokenizer(example["prompt"] + example["rejected"], add_special_tokens=False)["input_ids"]
        n = min(_common_prefix(prompt_ids, pc), _common_prefix(prompt_ids, pr))
        if max_length is not None and n >= max_length:
            continue  # TRL drops such pairs too: keep_start truncation would leave no completion token
        out.append({"prompt_ids": prompt_ids[:n], "chosen_ids": pc[n:], "rejected_ids": pr[n:]})
    return out


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def sequence_logps(
    model: torch.nn.Module,
    tokenized: Sequence[dict[str, list[int]]],
    pad_token_id: int,
    max_length: int | None,
    batch_size: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probs (chosen, rejected), each (N,), float32 on CPU, in ``tokenized`` order."""
    collate = DataCollatorForPreference(pad_token_id=pad_token_id, max_length=max_length)
    device = model_device(model)
    was_training = model.training
    model.eval()
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if device.type == "cuda" and any(p.dtype == torch.bfloat16 for p in model.parameters())
        else nullcontext()
    )
    chosen, rejected = [], []
    try:
        for i in range(0, len(tokenized), batch_size):
            batch = collate(list(tokenized[i : i + batch_size]))  # rows: [chosen..., rejected...]
            input_ids = batch["input_ids"].to(device)  # (2B, T)
            with autocast:
                logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"].to(device), use_cache=False)
            logits = logits.logits[:, :-1]  # (2B, T-1, V): position t predicts token t+1
            targets = input_ids[:, 1:]
            mask = batch["completion_mask"][:, 1:].to(device).bool()
            # One row at a time in float32: a (2B, T, V) float32 log-softmax is ~5 GB at T=1024, V=152k
            logps = torch.stack(
                [
                    (torch.log_softmax(logits[j].float(), dim=-1).gather(-1, targets[j, :, None])[:, 0] * mask[j]).sum()
                    for j in range(logits.size(0))
                ]
            )
            c, r = logps.chunk(2)
            chosen.append(c.cpu())
            rejected.append(r.cpu())
    finally:
        model.train(was_training)
    return torch.cat(chosen), torch.cat(rejected)


# ---------------------------------------------------------------------------------------------------------------------
# margin probe


@dataclass
class MarginRecord:
    """Per-pair values on the probe set at one step."""

    step: int
    chosen_logps: list[float]
    rejected_logps: list[float]
    margin: list[float]
    logratio_margin: list[float]

    @property
    def reward_accuracy(self) -> float:
        return sum(m > 0 for m in self.logratio_margin) / len(self.logratio_margin)

    def summary(self, beta: float | None = None) -> dict[str, float]:
        """Mean / quantiles of the margin; β·logratio is the DPO implicit reward margin when β is given."""
        q = _quantiles(self.margin)
        out = {
            "step": self.step,
            "margin_mean": statistics.fmean(self.margin),
            "margin_p10": q[0],
            "margin_median": q[1],
            "margin_p90": q[2],
            "logratio_margin_mean": statistics.fmean(self.logratio_margin),
            "reward_accuracy": self.reward_accuracy,
        }
        if beta is not None:
            out["reward_margin_mean"] = beta * out["logratio_margin_mean"]
        return out


def _quantiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """p10, median, p90 (inclusive method; a 1-element list returns the element)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    qs = statistics.quantiles(xs, n=10, method="inclusive")
    return qs[0], statistics.median(xs), qs[8]


class MarginProbeCallback(TrainerCallback):
    """Scores a fixed probe set at train begin (step 0, also the reference π0) and after every evaluation.

    Every rank computes the same probe (so FSDP's collective forwards line up); only world process zero writes.
    """

    def __init__(
        self,
        tokenized_probe: Sequence[dict[str, list[int]]],
        pad_token_id: int,
        max_length: int | None,
        batch_size: int = 4,
        out_path: str | Path | None = None,
    ) -> None:
        if not tokenized_probe:
            raise ValueError("diagnostics.probe_size: the probe set is empty after tokenisation")
        self.tokenized = list(tokenized_probe)
        self.pad_token_id = pad_token_id
        self.max_length = max_length
        self.batch_size = batch_size
        self.out_path = Path(out_path) if out_path is not None else None
        self.records: list[MarginRecord] = []
        self._ref: tuple[torch.Tensor, torch.Tensor] | None = None

    def score(self, model: torch.nn.Module, step: int) -> MarginRecord:
        c, r = sequence_logps(model, self.tokenized, self.pad_token_id, self.max_length, self.batch_size)
        if self._ref is None:
            self._ref = (c, r)
        c0, r0 = self._ref
        rec = MarginRecord(
            step=step,
            chosen_logps=c.tolist(),
            rejected_logps=r.tolist(),
            margin=(c - r).tolist(),
            logratio_margin=((c - c0) - (r - r0)).tolist(),
        )
        if self.records and self.records[-1].step == step:
            self.records[-1] = rec  # evaluate() at the final step can run twice (eval strategy + end of training)
        else:
            self.records.append(rec)
        return rec

    def _write(self, state: TrainerState) -> None:
        if self.out_path is None or not state.is_world_process_zero:
            return
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        with self.out_path.open("w") as f:
            for rec in self.records:
                f.write(json.dumps(asdict(rec)) + "\n")

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.score(kwargs["model"], state.global_step)
        self._write(state)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.score(kwargs["model"], state.global_step)
        self._write(state)


def plot_margins(records: Sequence[MarginRecord], path: str | Path, beta: float | None = None) -> Path:
    """Margin distribution vs step: box plots of the raw margin and of the log-ratio margin, one box per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [r.step for r in records]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in (
        (axes[0], "margin", "log π(y+) − log π(y−)  [nats, summed over tokens]"),
        (axes[1], "logratio_margin", "log-ratio margin vs step 0 (reference)"),
    ):
        data = [getattr(r, key) for r in records]
        ax.boxplot(data, positions=range(len(steps)), widths=0.6, showfliers=True)
        ax.set_xticks(range(len(steps)), [str(s) for s in steps], rotation=45 if len(steps) > 8 else 0)
        ax.axhline(0.0, color="grey", lw=0.8, ls="--")
        ax.plot(range(len(steps)), [statistics.fmean(d) for d in data], "o-", color="C1", ms=3, label="mean")
        ax.set_xlabel("optimizer step")
        ax.set_title(title, fontsize=10)
        ax.legend(loc="best", fontsize=8)
    acc = [r.reward_accuracy for r in records]
    fig.suptitle(
        f"probe set: {len(records[0].margin)} held-out pairs; reward accuracy {acc[0]:.2f} → {acc[-1]:.2f}"
        + (f"; β = {beta:g}" if beta is not None else ""),
        fontsize=10,
    )
    return save_figure(fig, path, dpi=120)


# ---------------------------------------------------------------------------------------------------------------------
# generation length statistics


@dataclass
class LengthStats:
    """Generated-token lengths on a fixed prompt set (greedy, fixed max_new_tokens)."""

    n: int
    mean: float
    median: float
    p90: float
    max: int
    truncated_frac: float
    """Share of generations that hit max_new_tokens without EOS (their true length is longer)."""

    @classmethod
    def of(cls, lengths: Sequence[int], max_new_tokens: int, finished: Sequence[bool]) -> LengthStats:
        if not lengths:
            raise ValueError("diagnostics.length_prompts: no prompts to generate from")
        p90 = statistics.quantiles(lengths, n=10, method="inclusive")[8] if len(lengths) > 1 else float(lengths[0])
        return cls(
            n=len(lengths),
            mean=statistics.fmean(lengths),
            median=float(statistics.median(lengths)),
            p90=float(p90),
            max=max(lengths),
            truncated_frac=sum(not f for f in finished) / len(lengths),
        )


def render_prompts(prompts: Sequence[Any], tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Plain prompts as is; conversational prompts through the chat template with the generation prompt."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(p)
        else:
            out.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True))
    return out


@torch.no_grad()
def generation_lengths(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Any],
    max_new_tokens: int,
    batch_size: int = 8,
    max_prompt_tokens: int = 1024,
) -> tuple[list[int], list[bool], list[str]]:
    """Greedy generations; returns (token lengths incl. EOS, finished-with-EOS flags, decoded texts)."""
    texts = render_prompts(prompts, tokenizer)
    device = model_device(model)
    was_training = model.training
    model.eval()
    eos_ids = set(_as_list(model.generation_config.eos_token_id)) | {tokenizer.eos_token_id}
    eos_ids.discard(None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    side, trunc_side = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side = "left"  # decoder-only batched generation needs left padding
    tokenizer.truncation_side = "left"  # an over-long prompt keeps its end (the question and the generation prompt)
    lengths: list[int] = []
    finished: list[bool] = []
    decoded: list[str] = []
    try:
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[i : i + batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
                truncation=True,
                max_length=max_prompt_tokens,
            ).to(device)
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=sorted(eos_ids),
            )
            new = out[:, enc["input_ids"].shape[1] :]  # (B, <= max_new_tokens)
            for row in new.tolist():
                n = len(row)
                done = False
                for j, t in enumerate(row):
                    if t in eos_ids:
                        n, done = j + 1, True
                        break
                lengths.append(n)
                finished.append(done)
                decoded.append(tokenizer.decode(row[:n], skip_special_tokens=True))
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = side, trunc_side
        model.train(was_training)
    return lengths, finished, decoded


def _as_list(x: int | list[int] | None) -> list[int]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


@contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model of a PEFT model (adapter off); a no-op for a plain model."""
    if hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield
    else:
        yield


@dataclass
class LengthComparison:
    before: LengthStats
    after: LengthStats
    threshold: float

    @property
    def ratio(self) -> float:
        return self.after.mean / self.before.mean if self.before.mean > 0 else math.inf

    @property
    def flagged(self) -> bool:
        return self.ratio > self.threshold

    @property
    def status(self) -> str:
        if self.flagged:
            return f"FLAG > {self.threshold:g}x"
        if self.after.truncated_frac > 0:
            return "lower bound (after hit max_new_tokens)"
        return f"ok ≤ {self.threshold:g}x"

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for name, s in (("before (base)", self.before), ("after (base+adapter)", self.after)):
            rows.append(
                {
                    "model": name,
                    "n": s.n,
                    "mean": round(s.mean, 1),
                    "median": round(s.median, 1),
                    "p90": round(s.p90, 1),
                    "max": s.max,
                    "hit max_new_tokens": f"{100 * s.truncated_frac:.0f}%",
                }
            )
        rows.append(
            {
                "model": "ratio after/before (mean)",
                "n": "",
                "mean": round(self.ratio, 3),
                "median": round(self.after.median / self.before.median, 3) if self.before.median else "",
                "p90": round(self.after.p90 / self.before.p90, 3) if self.before.p90 else "",
                "max": "",
                "hit max_new_tokens": self.status,
            }
        )
        return rows


def token_length_stats(tokenized: Sequence[dict[str, list[int]]]) -> dict[str, float]:
    """Chosen vs rejected completion token lengths of a preference set (DPO's length bias starts in the data)."""
    c = [len(t["chosen_ids"]) for t in tokenized]
    r = [len(t["rejected_ids"]) for t in tokenized]
    return {
        "pairs": len(c),
        "chosen_mean": statistics.fmean(c),
        "rejected_mean": statistics.fmean(r),
        "chosen_median": float(statistics.median(c)),
        "rejected_median": float(statistics.median(r)),
        "chosen_longer_frac": sum(a > b for a, b in zip(c, r, strict=True)) / len(c),
    }
