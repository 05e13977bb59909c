"""Issue 19's carry recipe and helpers, on CPU: scripts/vllm_carry.py (pack -> pieces -> unpack, trim rules,
--target layout), make_dummy_model.py --full-vocab (every id decodes, prompts encode as before)."""

from __future__ import annotations

import json
import random
import runpy
import zipfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _carry() -> dict:
    return runpy.run_path(str(SCRIPTS / "vllm_carry.py"))


def _wheel(path: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def test_pack_unpack_roundtrip(tmp_path: Path) -> None:
    """Trimmed files are left out, .data/purelib moves up, .data/scripts is dropped, pieces reassemble to the
    recorded sha256 only once all are present (exit 3 before), and the tree equals what the wheels hold."""
    carry = _carry()
    wh = tmp_path / "whl"
    wh.mkdir()
    rnd = random.Random(0).randbytes(1_300_000)  # incompressible: several pieces of 0.5 MiB
    _wheel(
        wh / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        {
            "vllm/__init__.py": b"__version__ = '0.26.0'\n",
            "vllm/_C_stable_libtorch.abi3.so": rnd,
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2" * 1000,
            "vllm/_moe_C_stable_libtorch.abi3.so": b"moe",
            "vllm/vllm-rs": b"rs",
            "vllm/third_party/deep_gemm/include/cute/a.hpp": b"h",
            "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": b"311",
            "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"312",
            "vllm-0.26.0.dist-info/METADATA": b"Name: vllm\nVersion: 0.26.0\n",
        },
    )
    _wheel(
        wh / "supervisor-4.3.0-py2.py3-none-any.whl",
        {
            "supervisor-4.3.0.data/purelib/supervisor/__init__.py": b"x = 1\n",
            "supervisor-4.3.0.data/scripts/supervisord": b"#!/bin/sh\n",
            "supervisor-4.3.0.dist-info/METADATA": b"Name: supervisor\n",
        },
    )
    out = tmp_path / "pieces"
    manifest = carry["pack"](wh, out, 0.5)
    assert len(manifest["pieces"]) >= 2 and all(p["bytes"] <= 0.5 * 2**20 for p in manifest["pieces"])
    assert (
        manifest["wheels"]["vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"]["trimmed_bytes"] == 3000 + 3 + 2 + 1 + 3
    )

    # device side: the first call sees piece 00 only (the others travel in later calls)
    first = tmp_path / "call1"
    first.mkdir()
    (first / "manifest.json").write_bytes((out / "manifest.json").read_bytes())
    (first / "site.tar.xz.00").write_bytes((out / "site.tar.xz.00").read_bytes())
    stage, site = tmp_path / "stage", tmp_path / "site"
    assert carry["unpack"](first, stage, site) == 3
    assert not site.exists()
    assert carry["unpack"](out, stage, site) == 0
    assert carry["unpack"](out, stage, site) == 0  # idempotent: a later call on the same warm machine
    assert (site / "vllm/_C_stable_libtorch.abi3.so").read_bytes() == rnd
    assert (site / "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so").is_file()
    assert (site / "supervisor/__init__.py").read_bytes() == b"x = 1\n"
    assert (site / "vllm-0.26.0.dist-info/METADATA").is_file()
    for gone in (
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "vllm/_moe_C_stable_libtorch.abi3.so",
        "vllm/vllm-rs",
        "vllm/third_party/deep_gemm/include/cute/a.hpp",
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
        "supervisord",
        "bin/supervisord",
    ):
        assert not (site / gone).exists(), gone


def test_sglang_set_trims_sgl_kernel_to_sm90(tmp_path: Path) -> None:
    """``--set sglang``: sglang-kernel keeps its sm90 ops and drops FA3, sm100, infllm, flashmla; xgrammar's static
    library goes; the set needs an sglang wheel (a vLLM wheelhouse is refused) and records its name and rules."""
    carry = _carry()
    wh = tmp_path / "whl"
    wh.mkdir()
    _wheel(
        wh / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl",
        {
            "sgl_kernel/__init__.py": b"__version__ = '0.4.5'\n",
            "sgl_kernel/sm90/common_ops.abi3.so": b"sm90" * 100,
            "sgl_kernel/sm100/common_ops.abi3.so": b"sm100",
            "sgl_kernel/flash_ops.abi3.so": b"fa3" * 1000,
            "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": b"inf",
            "sgl_kernel/flashmla_ops.abi3.so": b"mla",
            "sgl_kernel/flash_attn.py": b"# python side of fa3\n",
        },
    )
    _wheel(wh / "xgrammar-0.2.1-cp312-cp312-manylinux_2_28_x86_64.whl", {"xgrammar/lib/libxgrammar.a": b"a" * 10})
    with pytest.raises(SystemExit, match="no sglang wheel"):
        carry["pack"](wh, tmp_path / "out0", 1.0, "sglang")
    _wheel(wh / "sglang-0.5.16-py3-none-any.whl", {"sglang/__init__.py": b"", "sglang/version.py": b"v = 1\n"})
    out = tmp_path / "out"
    manifest = carry["pack"](wh, out, 1.0, "sglang")
    assert manifest["set"] == "sglang" and manifest["trim"] == carry["SGLANG_TRIM"]
    assert manifest["wheels"]["sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"]["trimmed_bytes"] == 3011
    site = tmp_path / "site"
    assert carry["unpack"](out, tmp_path / "stage", site) == 0
    assert (site / "sgl_kernel/sm90/common_ops.abi3.so").read_bytes() == b"sm90" * 100
    assert (site / "sgl_kernel/flash_attn.py").is_file() and (site / "sglang/version.py").is_file()
    for gone in (
        "sgl_kernel/flash_ops.abi3.so",
        "sgl_kernel/sm100",
        "sgl_kernel/flashmla_ops.abi3.so",
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so",
        "xgrammar/lib/libxgrammar.a",
    ):
        assert not (site / gone).exists(), gone
    with pytest.raises(SystemExit, match="no vllm wheel"):  # the default set still wants vLLM
        carry["pack"](wh, tmp_path / "out1", 1.0)


def test_unpack_rejects_corrupt_piece(tmp_path: Path) -> None:
    carry = _carry()
    wh = tmp_path / "whl"
    wh.mkdir()
    _wheel(wh / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", {"vllm/__init__.py": b"v = 1\n" * 100})
    out = tmp_path / "pieces"
    carry["pack"](wh, out, 1.0)
    piece = out / "site.tar.xz.00"
    data = bytearray(piece.read_bytes())
    data[len(data) // 2] ^= 0xFF
    piece.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="sha256"):
        carry["unpack"](out, tmp_path / "stage", tmp_path / "site")


def test_pack_refuses_two_versions(tmp_path: Path) -> None:
    carry = _carry()
    wh = tmp_path / "whl"
    wh.mkdir()
    for v in ("1.0", "1.1"):
        _wheel(wh / f"lark-{v}-py3-none-any.whl", {"lark/__init__.py": b""})
    _wheel(wh / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", {"vllm/__init__.py": b""})
    with pytest.raises(SystemExit, match="lark"):
        carry["pack"](wh, tmp_path / "out", 1.0)


def test_full_vocab_tokenizer() -> None:
    """fill_vocab: len == the model's vocab, every id decodes to non-empty text, text encodes to the same ids as the
    unfilled tokenizer (same merges), special tokens unchanged."""
    from phase6.posttrain.tiny import build_tiny_tokenizer

    fill = runpy.run_path(str(SCRIPTS / "make_dummy_model.py"))["fill_vocab"]
    texts = ["the quick brown fox jumps over the lazy dog " * 20, "def f(x): return x + 1\n" * 20]
    small = build_tiny_tokenizer(texts, vocab_size=300)
    full = fill(small, 2000)
    assert len(full) == 2000 and len(small) < 2000
    sample = "the lazy fox returns x + 1 over the dog"
    assert full.encode(sample) == small.encode(sample)
    assert (full.eos_token_id, full.pad_token_id) == (small.eos_token_id, small.pad_token_id)
    assert full.chat_template == small.chat_template
    for i in (len(small), 1000, 1999):
        assert full.decode([i]).strip(), i
    assert len(set(full.convert_ids_to_tokens(list(range(len(small), 2000))))) == 2000 - len(small)
    assert json.loads(full.backend_tokenizer.to_str())["model"]["type"] == "BPE"


def test_uncalibrated_prediction_equals_the_later_comparison(tmp_path: Path) -> None:
    """scripts/repro/fleet_predict.py ``none`` (an engine with no C=1 run yet, issue 19's blind vLLM prediction) prints the
    ``_sim`` columns that the uncalibrated vllm-profile compare prints once the runs are measured."""
    from test_fleet_compare import planted_sweep

    from phase6.fleet.compare import compare_serve_bench, load_serve_bench, planned_run

    predict = runpy.run_path(str(SCRIPTS / "repro" / "fleet_predict.py"))["predict_uncalibrated"]
    sweep, cfg, setup, _ = planted_sweep(tmp_path, profile={})
    runs, _ = load_serve_bench(sweep)
    serve = runs[0].config["serve"]
    planned = [
        planned_run(f"C={r.concurrency}", serve, 1, r.concurrency, r.input_tokens, r.output_tokens) for r in runs
    ]
    pred, desc = predict(planned, cfg, setup)
    out, _ = compare_serve_bench(sweep, cfg, setup, calibrate_rows=False, profile="vllm")
    assert desc.startswith("vllm (chunked prefill")
    for p, o in zip(pred, out, strict=True):
        assert (p["concurrency"], p["ttft_p50_ms_sim"], p["tpot_p50_ms_sim"], p["throughput_tok_s_sim"]) == (
            o["concurrency"],
            o["ttft_p50_ms_sim"],
            o["tpot_p50_ms_sim"],
            o["throughput_tok_s_sim"],
        )


def test_sglang_trim_keeps_the_jit_headers_and_the_loaded_backends() -> None:
    """The retry's trims (docs/benchmarks.md, issue 29, call E): flashinfer's header trees that flashinfer.jit.env
    and sglang.jit_kernel.utils.deps put on the include path stay, their examples/tests/Python go; zstandard keeps
    the C backend it loads and drops CFFI; SGLang's native gRPC server and the diffusion server go, its LLM server
    stays; the set carries SGLang's transformers pin (the image's 5.17 breaks sglang.srt.configs at import)."""
    carry = _carry()
    trim = carry["SGLANG_TRIM"]
    kept = (
        "flashinfer/data/include/flashinfer/norm.cuh",
        "flashinfer/data/csrc/norm.cu",
        "flashinfer/data/cutlass/include/cute/tensor.hpp",
        "flashinfer/data/cutlass/tools/util/include/cutlass/util/device_memory.h",
        "flashinfer/data/cccl/libcudacxx/include/cuda/std/atomic",
        "flashinfer/data/cccl/cub/cub/cub.cuh",
        "flashinfer/data/cccl/thrust/thrust/copy.h",
        "flashinfer/data/spdlog/include/spdlog/spdlog.h",
        "zstandard/backend_c.cpython-312-x86_64-linux-gnu.so",
        "sglang/srt/grpc/__init__.py",
        "sglang/srt/entrypoints/http_server.py",
        "sgl_kernel/sm90/common_ops.abi3.so",
    )
    dropped = (
        "flashinfer/data/cutlass/examples/00_basic_gemm/basic_gemm.cu",
        "flashinfer/data/cutlass/python/cutlass/__init__.py",
        "flashinfer/data/cccl/python/cuda_cccl/tests/compute/test_scan.py",
        "zstandard/_cffi.cpython-312-x86_64-linux-gnu.so",
        "sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so",
        "sglang/multimodal_gen/runtime/launch_server.py",
    )
    assert [p for p in kept if carry["trimmed"](p, trim)] == []
    assert [p for p in dropped if not carry["trimmed"](p, trim)] == []
    assert "transformers==5.12.1" in carry["SGLANG_WHEELS"] and "tokenizers==0.22.2" in carry["SGLANG_WHEELS"]
    assert not any(w.startswith("llguidance") for w in carry["SGLANG_WHEELS"])
