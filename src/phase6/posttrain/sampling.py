"""Length-grouped batches for TRL's DPOTrainer.

TRL 1.16's ``padding_free`` is disabled ("temporarily unavailable after a refactor"): every batch is padded to its
longest sequence. Grouping pairs of similar token length into the same batch (transformers' ``LengthGroupedSampler``:
random mega-batches of min(N // (4 * batch), 50) batches, sorted by length inside) removes most of that padding without changing which
pairs are seen in an epoch. The cost is less-random batch composition, the same trade-off as ``group_by_length`` in
supervised fine-tuning.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from transformers.trainer_pt_utils import LengthGroupedSampler

T = TypeVar("T")


def pair_lengths(dataset: Any) -> list[int]:
    """Padded length of a pair: the longer of its two sequences (both share one batch).

    DPOTrainer columns: prompt_ids + chosen_ids / rejected_ids; ORPOTrainer columns: chosen_input_ids /
    rejected_input_ids (prompt included).
    """
    cols = set(dataset.column_names)
    if {"prompt_ids", "chosen_ids", "rejected_ids"} <= cols:
        return [
            len(p) + max(len(c), len(r))
            for p, c, r in zip(dataset["prompt_ids"], dataset["chosen_ids"], dataset["rejected_ids"], strict=True)
        ]
    if {"chosen_input_ids", "rejected_input_ids"} <= cols:
        return [
            max(len(c), len(r)) for c, r in zip(dataset["chosen_input_ids"], dataset["rejected_input_ids"], strict=True)
        ]
    raise ValueError(f"dpo.group_by_length: no tokenised pair columns in the train dataset ({sorted(cols)})")


def length_grouped(trainer_cls: type[T]) -> type[T]:
    """Subclass of TRL's DPOTrainer or ORPOTrainer with a length-grouped train sampler."""

    class LengthGrouped(trainer_cls):  # type: ignore[valid-type,misc]
        def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler:
            ds = train_dataset if train_dataset is not None else self.train_dataset
            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
            return LengthGroupedSampler(batch, lengths=pair_lengths(ds))

    LengthGrouped.__name__ = f"LengthGrouped{trainer_cls.__name__}"
    return LengthGrouped  # type: ignore[return-value]
