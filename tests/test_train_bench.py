"""`phase6 bench pretrain` on CPU (tiny preset, eager, gloo for the 2-process rows): the table's rows, arithmetic,
skip reasons, JSON output, and the lever bookkeeping (winners, combination, budget, child timeout). Timing goals
are not asserted here; the GPU numbers live in docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phase6.bench.pretrain import (
    LEVERS,
    Budget,
    build_setup,
    combine,
    main,
    parse_args,
    pick_winners,
    run_child,
)
from phase6.config.pretrain import ModelConfig, ParallelConfig
from phase6.launch import load_config

CPU = ["--device", "cpu", "--preset", "gpt2_tiny", "--seq-len", "32", "--steps", "2", "--warmup", "1"]


def test_bench_rows_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    argv = [*CPU, "--batch-size", "2", "--accum", "2", "--hf-batch-size", "2", "--levers", "flash,tf32,cudnn,autotune"]
    rows = main([*argv, "--combine", "flash,tf32", "--out", str(out)])
    configs = [(r["row"], r["levers"], r["B"], r["accum"], r["GPUs"]) for r in rows]
    assert configs == [
        ("ours baseline", "-", 2, 1, 1),
        ("HF GPT2LMHeadModel sdpa eager", "-", 2, 1, 1),
        ("ours + flash", "flash", 2, 1, 1),
        ("ours + tf32", "tf32", 2, 1, 1),
        ("ours + cudnn", "cudnn", 2, 1, 1),
        ("ours + autotune", "autotune", 2, 1, 1),
        ("ours combined", "flash+tf32", 2, 1, 1),
        ("ours combined, x2 accum", "flash+tf32", 2, 2, 1),
        ("ours combined DDP, x2 accum", "flash+tf32", 2, 2, 2),
        ("ours combined FSDP2, x2 accum", "flash+tf32", 2, 2, 2),
    ]
    by_name = {r["row"]: r for r in rows}
    assert by_name["ours + cudnn"]["note"] == "skipped: needs CUDA"
    assert by_name["ours + autotune"]["note"].startswith("skipped: needs torch.compile")
    assert by_name["ours + flash"]["predicted"] == LEVERS["flash"].predicted
    measured = [r for r in rows if "tokens/s" in r]
    assert len(measured) == 8 and all("note" not in r for r in measured)
    base = by_name["ours baseline"]["tokens/s"]
    for r in measured:
        assert r["tokens/step"] == r["B"] * 32 * r["accum"] * r["GPUs"]
        assert r["tokens/s"] == pytest.approx(r["tokens/step"] / (r["step ms"] / 1000))
        assert r["vs baseline %"] == pytest.approx(100 * (r["tokens/s"] / base - 1))
        assert r["compile s"] >= 0
    one_gpu = by_name["ours combined, x2 accum"]["tokens/s"]
    for r in measured[-2:]:
        assert r["scaling eff %"] == pytest.approx(100 * r["tokens/s"] / (2 * one_gpu))
    text = capsys.readouterr().out
    assert "| row | levers | B | accum |" in text
    assert "combined config as training overrides: parallel.sdpa_backend=flash train.tf32=true" in text
    report = json.loads(out.read_text())
    assert report["rows"] == json.loads(json.dumps(rows)) and report["combined_levers"] == ["flash", "tf32"]


def test_combined_overrides_are_valid_trainer_overrides() -> None:
    """The printed line is what a user pastes into `phase6 pretrain`: it must reach the same config fields."""
    setup = build_setup(ModelConfig(), ParallelConfig(), ["cudnn", "coord", "chunker", "autotune", "liger", "tf32"])
    cfg = load_config("pretrain", setup.overrides().split())
    assert cfg.parallel.sdpa_backend == "cudnn" and cfg.model.fused_ce == "liger" and cfg.train.tf32 is True
    assert cfg.parallel.compile_mode == "max-autotune-no-cudagraphs"
    assert cfg.parallel.compile_options()["coordinate_descent_tuning"] is True
    assert cfg.parallel.compile_options()["auto_chunker.enable"] is True
    assert cfg.parallel.compile_options()["max_autotune"] is True


def test_winners_are_ranked_and_incompatible_levers_dropped() -> None:
    rows = {
        "flash": {"tokens/s": 101.5},
        "cudnn": {"tokens/s": 104.0},
        "liger": {"tokens/s": 102.0},
        "fullgraph": {"tokens/s": 101.2},
        "coord": {"tokens/s": 100.5},  # +0.5%: below --min-gain-pct 1
        "autotune": {"tokens/s": 97.0},
    }
    ranked = pick_winners(rows, 100.0, 1.0)
    assert ranked == ["cudnn", "liger", "flash", "fullgraph"]
    setup, notes = combine(ranked, ModelConfig(), ParallelConfig(compile=True))
    assert setup.levers == ("cudnn", "liger")
    assert setup.parallel.sdpa_backend == "cudnn" and setup.model.fused_ce == "liger"
    assert any(n.startswith("flash dropped: parallel.sdpa_backend") for n in notes)
    assert any(n.startswith("fullgraph dropped: parallel.fullgraph") for n in notes)
    setup, notes = combine(["coord", "chunker"], ModelConfig(), ParallelConfig())
    assert setup.parallel.inductor == {"coordinate_descent_tuning": True, "auto_chunker.enable": True} and not notes


def test_budget_counts_down() -> None:
    now = [100.0]
    budget = Budget(60.0, clock=lambda: now[0])
    now[0] += 45.0
    assert budget.left() == pytest.approx(15.0)


def test_child_rows_and_timeout() -> None:
    """The child process path of isolated levers: its rows come back as JSON; at its timeout it is killed."""
    args = parse_args([*CPU, "--batch-size", "2"])
    rows = run_child(args, "single", ("flash",), [1, 2], "ours + flash", 300)
    assert [(r["row"], r["levers"], r["accum"]) for r in rows] == [
        ("ours + flash", "flash", 1),
        ("ours + flash, x2 accum", "flash", 2),
    ]
    with pytest.raises(TimeoutError, match="killed after"):
        run_child(args, "single", (), [1], "x", 0.5)  # importing torch alone takes longer


def test_bench_bad_flags_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="--rows"):
        main(["--device", "cpu", "--rows", "ours,nanogpt"])
    with pytest.raises(ValueError, match="--levers"):
        main(["--device", "cpu", "--levers", "cudnn,fp4"])
    with pytest.raises(ValueError, match="seq-len"):
        main(["--device", "cpu", "--preset", "gpt2_tiny", "--seq-len", "4096", "--rows", "baseline"])


@pytest.mark.parametrize(
    "kernel, category",
    [
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas",
            "gemm",
        ),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "gemm"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_64x4_tn_align8>(Params)", "gemm"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64", "attention"),
        ("triton_per_fused__to_copy_add_native_layer_norm_0", "inductor fused (triton)"),
        ("void at::native::(anonymous)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "copy / fill"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "other"),
    ],
)
def test_profile_kernel_categories(kernel: str, category: str) -> None:
    """--profile sorts real CUDA kernel names (from H100/H200 traces) into the categories of its table."""
    from phase6.bench.pretrain_steps import kernel_category

    assert kernel_category(kernel) == category
