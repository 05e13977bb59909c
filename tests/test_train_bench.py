"""`phase6 bench pretrain` code path on CPU (tiny preset, eager, gloo for the 2-process rows): the table's rows and
arithmetic. Timing goals are not asserted here; the GPU numbers live in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from phase6.bench.pretrain import main


def test_bench_rows_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    rows = main(
        [
            "--device",
            "cpu",
            "--preset",
            "gpt2_tiny",
            "--seq-len",
            "32",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch-sizes",
            "2",
            "--accum",
            "2",
            "--multi-batch-size",
            "2",
            "--hf-batch-size",
            "2",
        ]
    )
    configs = [(r["config"], r["B"], r["accum"], r["GPUs"]) for r in rows]
    assert configs == [
        ("phase6 GPT eager", 2, 1, 1),
        ("phase6 GPT eager", 2, 2, 1),
        ("HF GPT2LMHeadModel sdpa eager", 2, 1, 1),
        ("phase6 GPT ddp eager", 2, 2, 2),
        ("phase6 GPT fsdp2 eager", 2, 2, 2),
    ]
    for r in rows:
        assert r["tokens/step"] == r["B"] * 32 * r["accum"] * r["GPUs"]
        assert r["tokens/s"] == pytest.approx(r["tokens/step"] / (r["step ms"] / 1000))
    base = rows[1]["tokens/s"]
    for r in rows[3:]:
        assert r["scaling eff %"] == pytest.approx(100 * r["tokens/s"] / (2 * base))
    assert "| config | B | accum |" in capsys.readouterr().out


def test_bench_bad_flags_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="--only"):
        main(["--device", "cpu", "--only", "ours,nanogpt"])
    with pytest.raises(ValueError, match="seq-len"):
        main(["--device", "cpu", "--preset", "gpt2_tiny", "--seq-len", "4096", "--only", "ours"])
