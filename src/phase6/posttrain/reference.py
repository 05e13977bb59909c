"""Precomputed reference log-probs for TRL's DPOTrainer without TRL's weight hash, in length-sorted batches.

TRL 1.16's ``precompute_ref_log_probs=True`` costs far more than the reference forward it replaces, for two reasons
in ``DPOTrainer.__init__`` / ``_precompute_ref_logps``:

1. Before any forward it fingerprints the model for its on-disk cache: ``hash_module`` copies every tensor of the
   state dict to the CPU, widens bf16 to fp32, copies it again with ``.numpy().tobytes()`` and SHA-256es it on one
   core: 7.6e9 parameters -> 30 GB hashed, ~47 s on this repo's dev CPU (1.8 GB/s SHA-NI). The cache it keys is
   written next to the dataset's cache files, which an in-memory ``Dataset`` (every 6C loader) does not have, so
   it goes to a temporary directory that is deleted at exit: the hash buys nothing across runs.
2. The pass walks the dataset in its stored order, so every batch is padded to its longest pair: 1.82x the real
   tokens at batch 16 on LLaMA-Factory's dpo_en_demo (GPT-2 BPE, max_length 1024) against 1.17x longest-first.

``precomputed_reference(DPOTrainer)`` gives a subclass that is constructed with ``precompute_ref_log_probs=False``
(so TRL neither hashes nor precomputes), then scores the train and eval splits itself with TRL's own
``compute_ref_log_probs`` (adapter disabled, no grad, autocast: the same numbers) over batches sorted longest
first, and switches the trainer to read ``ref_chosen_logps`` / ``ref_rejected_logps`` from the batch, as TRL's
own precompute does. Under data parallelism each rank scores every ``world``-th batch and the results are
gathered, so the pass is split across GPUs instead of repeated on each.
"""

from __future__ import annotations

from typing import Any, TypeVar

from phase6.posttrain.sampling import pair_lengths
from phase6.timing import wall

T = TypeVar("T")
REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
_PAIR_COLUMNS = ["prompt_ids", "chosen_ids", "rejected_ids"]


def reference_batches(lengths: list[int], batch_size: int, rank: int = 0, world: int = 1) -> list[list[int]]:
    """Row indices of this rank's reference batches: rows sorted longest first, cut into batches, dealt round-robin.

    Longest first, so a batch that does not fit in memory fails in the first second, not at the end of the pass.
    """
    if batch_size < 1:
        raise ValueError(f"precompute_ref_batch_size: must be >= 1, got {batch_size}")
    assert 0 <= rank < world, (rank, world)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return batches[rank::world]


def reference_logps(trainer: Any, dataset: Any, batch_size: int) -> tuple[list[float], list[float]]:
    """(chosen, rejected) summed reference log-probs per row of a tokenised DPO dataset, in row order."""
    from accelerate.utils import gather_object

    if trainer.is_deepspeed_enabled:
        raise ValueError(
            "dpo.precompute_ref_log_probs: the length-sorted reference pass runs the unwrapped model and does not "
            "support DeepSpeed; set dpo.precompute_ref_log_probs=false (reference forward per step)"
        )
    acc = trainer.accelerator
    model = trainer.ref_model or trainer.model  # PEFT: the policy; compute_ref_log_probs disables the adapter
    pairs = dataset.select_columns(_PAIR_COLUMNS)
    scored: list[tuple[int, float, float]] = []
    for idx in reference_batches(pair_lengths(dataset), batch_size, acc.process_index, acc.num_processes):
        cols = pairs[idx]
        rows = [dict(zip(_PAIR_COLUMNS, v, strict=True)) for v in zip(*(cols[c] for c in _PAIR_COLUMNS), strict=True)]
        batch = {k: v.to(acc.device) for k, v in trainer.data_collator(rows).items()}
        chosen, rejected = trainer.compute_ref_log_probs(model, batch)  # (n,), (n,)
        scored += zip(idx, chosen.float().cpu().tolist(), rejected.float().cpu().tolist(), strict=True)
    if acc.num_processes > 1:
        scored = gather_object(scored)
    assert sorted(i for i, _, _ in scored) == list(range(len(dataset))), "every row scored exactly once"
    scored.sort()
    return [c for _, c, _ in scored], [r for _, _, r in scored]


def with_reference_logps(trainer: Any, dataset: Any, batch_size: int) -> Any:
    """``dataset`` plus the two reference columns DPOTrainer's collator and loss read."""
    present = [c for c in REF_COLUMNS if c in dataset.column_names]
    if present:
        dataset = dataset.remove_columns(present)
    chosen, rejected = reference_logps(trainer, dataset, batch_size)
    return dataset.add_column(REF_COLUMNS[0], chosen).add_column(REF_COLUMNS[1], rejected)


def precomputed_reference(trainer_cls: type[T]) -> type[T]:
    """Subclass of TRL's DPOTrainer that precomputes the reference log-probs (length-sorted, no weight hash).

    Construct it with ``DPOConfig(precompute_ref_log_probs=False, precompute_ref_batch_size=...)``; the batch size
    falls back to ``per_device_train_batch_size`` like TRL's. ``reference_pass_s`` holds the pass's seconds.
    """

    class PrecomputedReference(trainer_cls):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            cfg = kwargs.get("args")
            if cfg is None or cfg.precompute_ref_log_probs:
                raise ValueError(
                    "precomputed_reference: pass args=DPOConfig(precompute_ref_log_probs=False); with True TRL runs "
                    "its own pass (and hashes every weight on the CPU first) before this one"
                )
            super().__init__(*args, **kwargs)
            t0 = wall()
            size = self.args.precompute_ref_batch_size or self.args.per_device_train_batch_size
            self.train_dataset = with_reference_logps(self, self.train_dataset, size)
            if isinstance(self.eval_dataset, dict):
                self.eval_dataset = {k: with_reference_logps(self, v, size) for k, v in self.eval_dataset.items()}
            elif self.eval_dataset is not None:
                self.eval_dataset = with_reference_logps(self, self.eval_dataset, size)
            # from here on TRL's loss reads the reference from the batch (the branch its own precompute enables)
            self.precompute_ref_logps = True
            self.reference_pass_s = wall() - t0

        def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
            # TRL calls this for a dataset passed to evaluate(); same sorted pass, no hash
            return with_reference_logps(self, dataset, batch_size)

    PrecomputedReference.__name__ = f"PrecomputedReference{trainer_cls.__name__}"
    return PrecomputedReference  # type: ignore[return-value]
