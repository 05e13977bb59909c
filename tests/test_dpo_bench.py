"""The 6C bench's epoch arithmetic (projects/6c_dpo/bench.py): expected padded tokens of an epoch per sampler, and the
epoch extrapolation from measured steps (pure functions; the GPU run itself is a benchmark, not a test)."""

from __future__ import annotations

import math
import random

import pytest

from phase6.config import load_object

epoch_padded_tokens = load_object("projects/6c_dpo/bench.py:epoch_padded_tokens")
epoch_estimate = load_object("projects/6c_dpo/bench.py:epoch_estimate")


def test_epoch_padded_tokens_counts_padding_and_truncation() -> None:
    # equal lengths: no padding under any sampler; both sequences of a pair are padded to the pair's longer one
    assert epoch_padded_tokens([50] * 20, 1024, 4, grouped=False) == 2 * 20 * 50
    assert epoch_padded_tokens([50] * 20, 1024, 4, grouped=True) == 2 * 20 * 50
    lengths = [random.Random(i).randint(20, 1500) for i in range(96)]
    capped = sum(2 * min(n, 1024) for n in lengths)
    # one pair per micro-batch: only the truncation to max_length applies, in any order
    assert epoch_padded_tokens(lengths, 1024, 1, grouped=False) == capped
    assert epoch_padded_tokens(lengths, 1024, 1, grouped=True) == capped
    random_8 = epoch_padded_tokens(lengths, 1024, 8, grouped=False)
    grouped_8 = epoch_padded_tokens(lengths, 1024, 8, grouped=True)
    grouped_2 = epoch_padded_tokens(lengths, 1024, 2, grouped=True)
    assert capped < grouped_2 < grouped_8 < random_8
    # lengths spread over 20-1500 and capped at 1024: random batches of 8 nearly always hold a capped pair
    assert random_8 > 1.4 * capped and grouped_8 < 1.25 * capped


def test_epoch_estimate_recovers_rate_and_one_off() -> None:
    rate, one_off = 2e-4, 7.0  # s per padded token; extra seconds of the first step (CUDA start, JIT)
    tokens = [16000, 9000, 12000, 4000, 16000, 8000]
    times = [rate * t for t in tokens]
    times[0] += one_off
    est = epoch_estimate(times, tokens, warmup=2, init_s=10.0, epoch_tokens=300_000.0, num_pairs=254)
    assert est["steps_per_epoch"] == math.ceil(254 / 8) == 32
    assert est["one_off_s"] == pytest.approx(one_off)
    assert est["s_per_step"] == pytest.approx(rate * 300_000 / 32)
    assert est["epoch_s"] == pytest.approx(10.0 + one_off + rate * 300_000)
    assert est["pairs_per_s"] == pytest.approx(254 / (rate * 300_000))
    assert est["pairs_per_s_epoch"] == pytest.approx(254 / est["epoch_s"])
    with pytest.raises(AssertionError):
        epoch_estimate(times[:2], tokens[:2], warmup=2, init_s=0.0, epoch_tokens=1.0, num_pairs=8)
